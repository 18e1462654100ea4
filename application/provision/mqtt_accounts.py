"""Per-device MQTT accounts for mosquitto (docs/operate/security.md): a password file, an ACL and one
credentials file per device, from a fleet file (docs/internals.md, "MQTT accounts")."""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import secrets
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from iotwatch.application.provision.files import write_private
from iotwatch.contract import device_topics, telemetry
from iotwatch.errors import UserError

PASSWD_FILE = "passwd"
ACL_FILE = "acl"
CREDENTIALS_DIR = "devices"
#: mosquitto_passwd's defaults (mosquitto 2.0): PBKDF2-SHA512, 101 iterations, 12-byte salt.
PBKDF2_ITERATIONS = 101
SALT_BYTES = 12
FLEET_COLUMNS = ("site", "device_type", "device_id")


class DeviceIdentity(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One row of a fleet file; the names follow the message contract."""

    site: telemetry.Name
    device_type: telemetry.DeviceTypeName
    device_id: telemetry.Name

    def topics(self) -> dict[str, str]:
        """The device's own topics, by what it does on them."""
        ids = (self.site, self.device_type, self.device_id)
        return {
            "telemetry": device_topics.telemetry_topic(*ids),
            "status": device_topics.status_topic(*ids),
            "commands": device_topics.command_topic(*ids),
            "command_ack": device_topics.command_ack_topic(*ids),
            "twin_reported": device_topics.twin_reported_topic(*ids),
        }


@dataclass
class FleetCredentials:
    """What :func:`provision_fleet` wrote (counts and paths; never a password)."""

    out_dir: Path
    devices: int = 0
    created: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    rotated: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, object]:
        return {
            "out_dir": str(self.out_dir),
            "devices": self.devices,
            "created": len(self.created),
            "kept": len(self.kept),
            "rotated": len(self.rotated),
            "removed": len(self.removed),
            "password_file": str(self.out_dir / PASSWD_FILE),
            "acl_file": str(self.out_dir / ACL_FILE),
            "credentials_dir": str(self.out_dir / CREDENTIALS_DIR),
        }


def read_fleet(path: Path) -> list[DeviceIdentity]:
    """Devices of a CSV fleet file with the header ``site,device_type,device_id``."""
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            header = tuple(reader.fieldnames or ())
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise UserError(f"cannot read fleet file {path}: {getattr(exc, 'strerror', None) or exc}") from exc
    if not header:
        raise UserError(f"fleet file {path} is empty (header: {','.join(FLEET_COLUMNS)})")
    if header != FLEET_COLUMNS:
        raise UserError(f"fleet file {path}: header must be {','.join(FLEET_COLUMNS)}, not {','.join(header)}")
    if not rows:
        raise UserError(f"fleet file {path} lists no devices")
    devices: list[DeviceIdentity] = []
    seen: set[str] = set()
    for line, row in enumerate(rows, start=2):
        try:
            device = msgspec.convert(row, DeviceIdentity)
        except msgspec.ValidationError as exc:
            raise UserError(f"fleet file {path}:{line}: {exc}") from exc
        if ":" in device.device_id:
            raise UserError(
                f"fleet file {path}:{line}: device_id {device.device_id!r} is a user name here and must not contain ':'"
            )
        if device.device_id in seen:
            raise UserError(f"fleet file {path}:{line}: device_id {device.device_id!r} is listed twice")
        seen.add(device.device_id)
        devices.append(device)
    return devices


def hash_password(password: str, salt: bytes | None = None) -> str:
    """The ``$7$`` hash mosquitto 2 reads from a password file."""
    salt = salt if salt is not None else secrets.token_bytes(SALT_BYTES)
    digest = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, PBKDF2_ITERATIONS)
    return f"$7${PBKDF2_ITERATIONS}${base64.b64encode(salt).decode()}${base64.b64encode(digest).decode()}"


def device_acl(devices: list[DeviceIdentity]) -> str:
    """ACL ``user`` blocks: each device on its own topics only."""
    lines = ["# iotwatch provision mqtt: one block per device; regenerate, do not edit"]
    for device in devices:  # read its command topic, write the others
        lines += ["", f"user {device.device_id}"]
        lines += [f"topic {'read' if kind == 'commands' else 'write'} {name}" for kind, name in device.topics().items()]
    return "\n".join(lines) + "\n"


def provision_fleet(devices: list[DeviceIdentity], out_dir: Path, *, rotate: bool = False) -> FleetCredentials:
    """Write ``passwd``, ``acl`` and ``devices/<device_id>.json`` under ``out_dir``.

    A device that already has a credentials file keeps its password unless ``rotate``;
    credentials files of devices no longer in the fleet are deleted (their account is gone).
    """
    result = FleetCredentials(out_dir=out_dir, devices=len(devices))
    credentials_dir = out_dir / CREDENTIALS_DIR
    passwd_lines = []
    for device in devices:
        path = credentials_dir / f"{device.device_id}.json"
        password = None if rotate else _existing_password(path)
        if password is None:
            (result.rotated if path.exists() else result.created).append(device.device_id)
            password = secrets.token_urlsafe(24)
        else:
            result.kept.append(device.device_id)
        write_private(
            path,
            json.dumps(
                {
                    "username": device.device_id,
                    "password": password,
                    "client_id": device.device_id,
                    **msgspec.to_builtins(device),
                    "topics": device.topics(),
                },
                indent=2,
            )
            + "\n",
        )
        passwd_lines.append(f"{device.device_id}:{hash_password(password)}\n")
    write_private(out_dir / PASSWD_FILE, "".join(passwd_lines))
    write_private(out_dir / ACL_FILE, device_acl(devices))
    current = {f"{device.device_id}.json" for device in devices}
    for stale in sorted(credentials_dir.glob("*.json")):
        if stale.name not in current:
            stale.unlink()
            result.removed.append(stale.stem)
    return result


def _existing_password(path: Path) -> str | None:
    if not path.exists():
        return None
    try:
        password = json.loads(path.read_text())["password"]
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{path} is not a credentials file written by iotwatch provision mqtt "
            f"({type(exc).__name__}); delete it or pass --rotate"
        ) from exc
    if not isinstance(password, str) or not password:
        raise UserError(f"{path} holds no password; delete it or pass --rotate")
    return password
