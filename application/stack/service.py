"""What every embedded server has in common once started."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from iotwatch.application.stack.process import ProcessRecord


@dataclass(frozen=True)
class RunningService:
    """One started server: what it is, where clients reach it, and its process."""

    role: str  # "mqtt", "kafka" or "influx"
    implementation: str  # e.g. "mosquitto 2.0.11", "apache-kafka 4.1.0", "influxd 1.6.7"
    endpoint: str  # as clients use it: mqtt://host:port, host:port, http://host:port
    process: ProcessRecord

    def to_dict(self) -> dict[str, Any]:
        return {
            "role": self.role,
            "implementation": self.implementation,
            "endpoint": self.endpoint,
            "process": self.process.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunningService:
        return cls(data["role"], data["implementation"], data["endpoint"], ProcessRecord.from_dict(data["process"]))
