"""The model registry lives where the caller's settings say, a ``--config`` file included."""

from __future__ import annotations

from pathlib import Path

import pytest

from iotwatch.models.registry import ModelRegistry
from iotwatch.models.robust_zscore import RobustZScore
from iotwatch.settings import load_settings


def test_a_config_files_registry_table_places_the_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("IOTWATCH_REGISTRY_PATH", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    config = tmp_path / "iotwatch.toml"
    config.write_text(f'[registry]\npath = "{tmp_path / "configured"}"\n')
    settings = load_settings(config)
    registry = ModelRegistry(settings.registry.path)
    version = registry.register(RobustZScore(), "thermostat")
    assert version.path.parent.parent.parent == tmp_path / "configured"
    # no root of its own: a registry built without the caller's settings would read only
    # the environment and land in ~/.iotwatch/registry, whatever --config says
    with pytest.raises(TypeError):
        ModelRegistry()  # type: ignore[call-arg]  # the root is required: this checks it
    assert not (tmp_path / "home").exists()
