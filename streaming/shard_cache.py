"""Local copies of device-state shards, shared by the Python workers of one executor.

Reading a shard back from Spark's state store is the part of a micro-batch that grows
most with the fleet: the JVM pickles each binary value as a Latin-1 string and the
worker unpickles it, about 57 MB/s (at 100,000 devices, some 40 MB of shards a batch).
Every shard a batch reads it also writes, so the worker that writes a shard keeps a copy
in a local file, stamped with a random *token*; the token goes to the state store too, in
one small value per partition (:class:`iotwatch.streaming.state_store.ShardedStore`). The next
read of the shard -- by any Python worker of the executor -- takes the file when its
token is the one in the state store, and the state store otherwise.

The state store stays the only truth: a token in it names exactly one written value, so
a copy from a task that failed, from a state-store version that was rolled back, from
another query or from before a restart never matches, and the files can be deleted at
any time. They live in the executor's ``SparkFiles`` directory, which Spark removes when
the application ends; outside a Spark worker there is no cache.
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
