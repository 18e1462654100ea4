"""The message contract page is the one the contract records generate, and it has every record."""

from __future__ import annotations

import inspect

import msgspec

from iotwatch.application.reference_pages.contract_reference import CONTRACT, PAGE, RECORDS, markdown
from iotwatch.contract import alerts, device_commands, ground_truth, model_updates, oncall, telemetry


def test_the_page_is_generated_from_the_records() -> None:
    assert CONTRACT.current(PAGE.read_text()) == CONTRACT.expected(), (
        f"{PAGE.name} is out of date: run `python -m iotwatch.application.reference_pages.contract_reference`"
    )


def test_every_record_of_the_contract_has_its_table() -> None:
    listed = {cls for _, records in RECORDS for cls in records}
    for module in (alerts, device_commands, ground_truth, model_updates, oncall, telemetry):
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, msgspec.Struct) and cls.__module__ == module.__name__ and not name.startswith("_"):
                assert cls in listed, f"{module.__name__}.{name} is not on the contract page (RECORDS)"


def test_types_constraints_and_comments_reach_the_tables() -> None:
    page = markdown()
    assert "| `seq` | int (>= 0, <= 2^63-1) | required | per-device counter from 0, +1 a message |" in page
    assert "| `rule` | string | required | a rule of iotwatch.streaming.rules" in page
    assert "| `severity` | [Severity](#severity) | required |" in page
    assert "| thermostat | `temperature_c` | degC | -10 to 45 |" in page
