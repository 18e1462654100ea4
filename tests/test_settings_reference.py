"""The README's settings reference is the one the settings classes generate."""

from __future__ import annotations

from pathlib import Path

from iotwatch.settings import Settings
from iotwatch.settings_reference import current, markdown

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_lists_every_setting_as_the_classes_define_it() -> None:
    reference = markdown()
    for concern, field in Settings.model_fields.items():
        assert f"**`[{concern}]`**" in reference
        for name in field.annotation.model_fields:  # type: ignore[union-attr]
            assert f"| `{name}` |" in reference
    assert current(README.read_text()) == reference, (
        "README.md's settings reference is out of date: run `python -m iotwatch.settings_reference README.md`"
    )
