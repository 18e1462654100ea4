"""Fleet models in the scorers: the newest approved model per device type, hot-swapped.

Training (``iotwatch train``) registers and approves models; each Python worker of the
streaming job keeps one :class:`iotwatch.models.watcher.ModelWatcher`, which follows the
model-updates topic and reloads a device type's model when a new version is approved --
no restart. Scoring stays separate from training: the job never fits a fleet model.
"""

from __future__ import annotations

import logging

from iotwatch.models.registry import ModelRegistry
from iotwatch.models.watcher import ModelWatcher
from iotwatch.settings import Settings
from iotwatch.streaming.fleet_scoring import FleetLookup, FleetModel

log = logging.getLogger(__name__)

_watchers: dict[tuple[str, str, str], ModelWatcher] = {}


def fleet_lookup(settings: Settings) -> FleetLookup | None:
    """The lookup the per-device logic calls, or None when fleet scoring is off."""
    detector = settings.stream.fleet_detector
    if not detector:
        return None
    key = (str(settings.registry.path), settings.kafka.bootstrap_servers, settings.topics.model_updates)
    watcher = _watchers.get(key)
    if watcher is None:
        try:
            watcher = ModelWatcher(
                ModelRegistry(settings.registry.path), settings.kafka, settings.topics.model_updates
            ).start()
        except Exception as exc:
            log.error("fleet models disabled in this worker: cannot follow %s: %s", settings.topics.model_updates, exc)
            return None
        _watchers[key] = watcher

    def lookup(device_type: str) -> tuple[str, FleetModel] | None:
        entry = watcher.current_version(device_type, detector)
        if entry is None:
            return None
        version, model = entry
        if not isinstance(model, FleetModel):
            raise TypeError(f"fleet detector {detector!r} cannot score a frame of readings (no score_many)")
        return f"{detector}@v{version.version}", model

    return lookup
