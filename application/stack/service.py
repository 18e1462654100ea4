"""What every embedded server has in common once started."""

from __future__ import annotations

from dataclasses import dataclass

from iotwatch.application.stack.process import ProcessRecord


@dataclass(frozen=True)
class RunningService:
    """One started server: what it is, where clients reach it, and its process."""

    role: str  # "mqtt", "kafka" or "influx"
    implementation: str  # e.g. "mosquitto 2.0.11", "apache-kafka 4.1.0", "influxd 1.6.7"
    endpoint: str  # as clients use it: mqtt://host:port, host:port, http://host:port
    process: ProcessRecord
