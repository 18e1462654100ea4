"""Local copies of device-state shards, shared by the Python workers of one executor: the
state store's token says which copy is current, so the state store stays the only truth
(docs/streaming-internals.md, "Shard cache").
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

_TOKEN = struct.Struct("<q")


class ShardCache:
    """Files ``<directory>/<name>``: a token, then a shard's state-store value."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    @classmethod
    def on_worker(cls) -> ShardCache:
        """The cache of the executor this Python worker serves (call in a Spark worker)."""
        from pyspark import SparkFiles

        return cls(Path(SparkFiles.getRootDirectory()) / "iotwatch-state-shards")

    def get(self, name: str, token: int) -> bytes | None:
        """The value written under ``token``, or None (no copy, or an older or newer one)."""
        try:
            with open(self.directory / name, "rb") as file:
                head = file.read(_TOKEN.size)
                if len(head) == _TOKEN.size and _TOKEN.unpack(head)[0] == token:
                    return file.read()
        except FileNotFoundError:
            pass
        return None

    def put(self, name: str, token: int, value: bytes) -> None:
        """Keep ``value`` under ``token``; readers see the old file or the new one, never part."""
        path = self.directory / name
        partial = path.with_name(f"{name}.{os.getpid()}.partial")
        with open(partial, "wb") as file:
            file.write(_TOKEN.pack(token))
            file.write(value)
        os.replace(partial, path)
