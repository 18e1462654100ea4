"""The settings reference page is the one the settings classes generate."""

from __future__ import annotations

import os

import pytest

from iotwatch.application.reference_pages.settings_reference import PAGE, REFERENCE, markdown
from iotwatch.settings import Settings, load_settings


def test_the_page_lists_every_setting_as_the_classes_define_it() -> None:
    reference = markdown()
    for concern, field in Settings.model_fields.items():
        assert f"**`[{concern}]`**" in reference
        for name in field.annotation.model_fields:  # type: ignore[union-attr]
            assert f"| `{name}` |" in reference
    assert REFERENCE.current(PAGE.read_text()) == REFERENCE.expected(), (
        f"{PAGE.name}'s settings reference is out of date: "
        "run `python -m iotwatch.application.reference_pages.settings_reference`"
    )


def test_every_setting_loads_from_its_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference names an IOTWATCH_* variable for each setting: each takes the setting's
    own value written as text (IOTWATCH_MQTT_QOS=1 as an int, not refused as a str), lists
    and tables as JSON. Child processes get their settings this way (as_environment)."""
    for name in list(os.environ):
        if name.startswith("IOTWATCH_"):
            monkeypatch.delenv(name)
    defaults = load_settings()
    variables = {}
    for concern in (getattr(defaults, name) for name in Settings.model_fields):
        variables.update(concern.as_environment())
    assert len(variables) > 50
    assert variables["IOTWATCH_MQTT_QOS"] == "1" and variables["IOTWATCH_MQTT_TLS_INSECURE"] == "false"
    for name, text in variables.items():
        monkeypatch.setenv(name, text)
    loaded = load_settings()
    for name in Settings.model_fields:
        assert getattr(loaded, name) == getattr(defaults, name), name
