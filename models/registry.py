"""Model registry: versioned fleet-model artefacts with their metadata, on disk, written
atomically under a lock per family so concurrent registrations never share or corrupt a
version (docs/operate/streaming.md, "Fleet models", has the layout and the lifecycle). With a
``publisher`` (:class:`iotwatch.models.updates.UpdatePublisher`) each approval and retirement
is announced for :class:`iotwatch.models.watcher.ModelWatcher` to hot-swap models.

Examples
--------
>>> import tempfile
>>> from iotwatch.models.robust_zscore import RobustZScore
>>> registry = ModelRegistry(tempfile.mkdtemp())
>>> v1 = registry.register(RobustZScore(), "thermostat", trained_on=TrainedOn(rows=10, devices=2))
>>> v1.version, v1.status
(1, 'candidate')
>>> registry.latest_approved("thermostat", "robust_zscore") is None
True
>>> registry.approve("thermostat", "robust_zscore", 1).status
'approved'
>>> registry.latest_approved("thermostat", "robust_zscore").version
1
>>> type(registry.load(v1)).__name__
'RobustZScore'
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from iotwatch.contract.model_updates import ModelUpdate
from iotwatch.contract.telemetry import DEVICE_TYPE_PATTERN
from iotwatch.errors import IotwatchError
from iotwatch.models.base import Detector
from iotwatch.models.catalog import load

if TYPE_CHECKING:
    from iotwatch.models.updates import UpdatePublisher

__all__ = [
    "MODEL_FILE",
    "METADATA_FILE",
    "ModelRegistry",
    "ModelVersion",
    "RegistryError",
    "Status",
    "TrainedOn",
]

MODEL_FILE = "model.bin"
METADATA_FILE = "metadata.json"

Status = Literal["candidate", "approved", "retired"]

_NAME = re.compile(DEVICE_TYPE_PATTERN)  # device types are registry names: one pattern with the contract
_VERSION_DIR = re.compile(r"^v(\d{6,})$")


class RegistryError(IotwatchError):
    """A registry operation that cannot be done (unknown version, bad name, bad state)."""


class TrainedOn(BaseModel):
    """The data a model was fitted on: event-time range (epoch ms), rows and devices."""

    model_config = ConfigDict(frozen=True, extra="allow")

    from_ms: int | None = None
    to_ms: int | None = None
    rows: int = 0
    devices: int = 0
    eligible_rows: int = 0
    holdout_rows: int = 0
    since_ms: int | None = None
    until_ms: int | None = None


class ModelVersion(BaseModel):
    """The metadata of one registered version (``metadata.json``)."""

    model_config = ConfigDict(frozen=True)

    device_type: str
    detector: str
    version: int
    params: dict[str, Any] = Field(default_factory=dict)
    trained_on: TrainedOn = Field(default_factory=TrainedOn)
    evaluation: dict[str, Any] = Field(default_factory=dict)
    created_at: datetime
    status: Status = "candidate"
    status_changed_at: datetime | None = None
    path: Path = Field(description="directory holding the artefact and this metadata", exclude=True)

    @property
    def model_path(self) -> Path:
        return self.path / MODEL_FILE

    def update(self) -> ModelUpdate:
        """The model-update event announcing this version's current status."""
        announced = self.model_dump(include={"device_type", "detector", "version", "status"})
        return ModelUpdate(**announced, path=str(self.model_path), created_at=self.created_at.isoformat())


def _check_name(kind: str, value: str) -> str:
    if not _NAME.match(value):
        raise RegistryError(f"{kind} {value!r} is not a valid registry name (letters, digits, '_', '.', '-')")
    return value


def _atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path``, fsync, rename over ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _metadata_bytes(meta: ModelVersion) -> bytes:
    return (meta.model_dump_json(indent=2) + "\n").encode()


class ModelRegistry:
    """Versioned detector artefacts and metadata under ``root``.

    Parameters
    ----------
    root
        Registry directory (created on first write): the caller's ``settings.registry.path``,
        so a ``--config`` file's ``[registry]`` table counts.
    publisher
        Announces approvals and retirements on the model-updates topic; ``None`` keeps
        the registry local (no Kafka).
    """

    def __init__(self, root: str | Path, publisher: UpdatePublisher | None = None) -> None:
        self.root = Path(root)
        self.publisher = publisher

    # --- layout ---------------------------------------------------------------------

    def _family(self, device_type: str, detector: str) -> Path:
        return self.root / _check_name("device type", device_type) / _check_name("detector", detector)

    @contextlib.contextmanager
    def _locked(self, device_type: str, detector: str) -> Iterator[Path]:
        family = self._family(device_type, detector)
        family.mkdir(parents=True, exist_ok=True)
        with open(family / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield family
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    @staticmethod
    def _version_numbers(family: Path) -> list[int]:
        if not family.is_dir():
            return []
        numbers = []
        for entry in family.iterdir():
            match = _VERSION_DIR.match(entry.name)
            if match and (entry / METADATA_FILE).is_file():
                numbers.append(int(match.group(1)))
        return sorted(numbers)

    def _read(self, path: Path) -> ModelVersion:
        doc = json.loads((path / METADATA_FILE).read_text())
        return ModelVersion.model_validate({**doc, "path": path})

    # --- writing --------------------------------------------------------------------

    def register(
        self,
        detector: Detector,
        device_type: str,
        *,
        trained_on: TrainedOn | Mapping[str, Any] | None = None,
        evaluation: Mapping[str, Any] | None = None,
    ) -> ModelVersion:
        """Store ``detector`` as the next version for ``(device_type, detector.name)``, a candidate."""
        if not detector.name:
            raise RegistryError(f"{type(detector).__name__} has no catalog name")
        payload = detector.dumps()
        trained = trained_on if isinstance(trained_on, TrainedOn) else TrainedOn.model_validate(trained_on or {})
        with self._locked(device_type, detector.name) as family:
            numbers = self._version_numbers(family)
            version = (numbers[-1] if numbers else 0) + 1
            target = family / f"v{version:06d}"
            meta = ModelVersion(
                device_type=device_type,
                detector=detector.name,
                version=version,
                params=json.loads(json.dumps(detector.get_params(), default=str)),
                trained_on=trained,
                evaluation=dict(evaluation or {}),
                created_at=datetime.now(UTC),
                path=target,
            )
            staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=family))
            try:
                for name, data in ((MODEL_FILE, payload), (METADATA_FILE, _metadata_bytes(meta))):
                    with open(staging / name, "wb") as handle:
                        handle.write(data)
                        handle.flush()
                        os.fsync(handle.fileno())
                if target.exists():  # a crashed writer's leftover without metadata
                    shutil.rmtree(target)
                os.rename(staging, target)
                _fsync_dir(family)
            except BaseException:
                shutil.rmtree(staging, ignore_errors=True)
                raise
        return meta

    def _set_status(self, device_type: str, detector: str, version: int, status: Status) -> ModelVersion:
        with self._locked(device_type, detector) as family:
            path = family / f"v{version:06d}"
            if not (path / METADATA_FILE).is_file():
                raise RegistryError(f"no version {version} of {detector} for {device_type} in {self.root}")
            meta = self._read(path)
            if meta.status == "retired" and status == "approved":
                raise RegistryError(
                    f"version {version} of {detector} for {device_type} is retired; register it again to bring it back"
                )
            if meta.status != status:
                meta = meta.model_copy(update={"status": status, "status_changed_at": datetime.now(UTC)})
                _atomic_write(path / METADATA_FILE, _metadata_bytes(meta))
        if self.publisher is not None:
            self.publisher.publish(meta)
        return meta

    def approve(self, device_type: str, detector: str, version: int) -> ModelVersion:
        """Mark a version approved (and announce it when there is a publisher)."""
        return self._set_status(device_type, detector, version, "approved")

    def retire(self, device_type: str, detector: str, version: int) -> ModelVersion:
        """Take a version out of service (and announce it); scorers fall back to the previous approved one."""
        return self._set_status(device_type, detector, version, "retired")

    # --- reading --------------------------------------------------------------------

    def get(self, device_type: str, detector: str, version: int) -> ModelVersion:
        """The metadata of one version."""
        path = self._family(device_type, detector) / f"v{version:06d}"
        if not (path / METADATA_FILE).is_file():
            raise RegistryError(f"no version {version} of {detector} for {device_type} in {self.root}")
        return self._read(path)

    def versions(
        self, device_type: str | None = None, detector: str | None = None, status: Status | None = None
    ) -> list[ModelVersion]:
        """Registered versions, optionally filtered, by device type, detector and version."""
        out = []
        for family in self._families(device_type, detector):
            for number in self._version_numbers(family):
                meta = self._read(family / f"v{number:06d}")
                if status is None or meta.status == status:
                    out.append(meta)
        return out

    def _families(self, device_type: str | None, detector: str | None) -> list[Path]:
        if not self.root.is_dir():
            return []
        types = (
            [device_type]
            if device_type is not None
            else sorted(p.name for p in self.root.iterdir() if p.is_dir() and _NAME.match(p.name))
        )
        families: list[Path] = []
        for dt in types:
            base = self.root / _check_name("device type", dt)
            if not base.is_dir():
                continue
            names = (
                [detector]
                if detector is not None
                else sorted(p.name for p in base.iterdir() if p.is_dir() and _NAME.match(p.name))
            )
            families.extend(base / _check_name("detector", n) for n in names)
        return families

    def latest_approved(self, device_type: str, detector: str) -> ModelVersion | None:
        """The newest approved version of ``detector`` for ``device_type``, if any."""
        family = self._family(device_type, detector)
        for number in reversed(self._version_numbers(family)):
            meta = self._read(family / f"v{number:06d}")
            if meta.status == "approved":
                return meta
        return None

    def approved_families(self) -> list[tuple[str, str]]:
        """Every ``(device_type, detector)`` that has an approved version."""
        return sorted({(m.device_type, m.detector) for m in self.versions(status="approved")})

    def load(self, version: ModelVersion) -> Detector:
        """The detector stored for ``version`` (a pickle for fleet models: trust your registry)."""
        return load(version.model_path.read_bytes())
