"""The model-update event (schema version 1): what the model registry announces on the
model-updates topic (``settings.topics.model_updates``), keyed by ``device_type`` so a
device type's events stay in order within one partition. Producer: ``iotwatch train`` and the
registry's approve/reject; consumer: the streaming job's model watcher.

The registry on disk stays the source of truth: an event only says "look again", so a
lost or reordered event cannot make a watcher use a model that is not the newest approved.
Events written before ``v`` existed decode as version 1.

>>> event = ModelUpdate(device_type="thermostat", detector="isolation_forest", version=3,
...                     path="/r/v000003/model.bin", created_at="2025-01-01T00:00:00+00:00")
>>> ModelUpdate.from_bytes(event.to_bytes()) == event
True
"""

from __future__ import annotations

import msgspec

MODEL_UPDATE_SCHEMA_VERSION = 1


class ModelUpdate(msgspec.Struct, frozen=True, kw_only=True):
    """One model version's current status."""

    v: int = MODEL_UPDATE_SCHEMA_VERSION
    device_type: str
    detector: str
    version: int
    status: str = "approved"  # approved | rejected | candidate
    path: str = ""
    created_at: str = ""

    def to_bytes(self) -> bytes:
        return msgspec.json.encode(self)

    @classmethod
    def from_bytes(cls, payload: bytes) -> ModelUpdate:
        """Parse an event; :class:`ValueError` saying why when it is not one."""
        try:
            event = _DECODER.decode(payload)
        except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
            raise ValueError(f"not a model-update event: {exc}") from None
        if event.v != MODEL_UPDATE_SCHEMA_VERSION:
            raise ValueError(f"model-update event v={event.v}, supported [{MODEL_UPDATE_SCHEMA_VERSION}]")
        return event


_DECODER = msgspec.json.Decoder(ModelUpdate)
