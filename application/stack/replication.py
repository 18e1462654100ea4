"""Replication lag per site, from MirrorMaker 2's heartbeats as the central cluster has them:
the age of a site's newest heartbeat at the centre is how far the centre is behind it
(docs/sites.md, *Replication lag*).
"""

from __future__ import annotations

import logging
import time

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from iotwatch.clients.influx import InfluxV1Client
from iotwatch.clients.kafka import client_config, end_offset
from iotwatch.contract.measurements import REPLICATION
from iotwatch.settings import KafkaSettings

log = logging.getLogger(__name__)

HEARTBEATS_TOPIC = "heartbeats"


class ReplicationLag:
    """Reads the newest heartbeat of each site at the centre (one partition each, no group)."""

    def __init__(self, central: KafkaSettings, sites: list[str]) -> None:
        self.sites = sites
        self._consumer = Consumer(
            {**client_config(central), "group.id": "iotwatch-replication-lag", "enable.auto.commit": False}
        )

    def newest_heartbeat_ms(self, site: str, timeout_s: float = 2.0) -> int | None:
        """When the newest heartbeat of ``site`` at the centre was emitted at the site (ms), or
        None before the first arrived."""
        partition = TopicPartition(f"{site}.{HEARTBEATS_TOPIC}", 0)
        try:
            end = end_offset(self._consumer, partition, timeout_s)
        except KafkaException as exc:  # the replica topic is not there yet, or the centre did not answer
            log.debug("no heartbeat offsets of %s: %s", partition.topic, exc)
            return None
        if end <= 0:
            return None
        partition.offset = end - 1
        self._consumer.assign([partition])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            message = self._consumer.poll(0.2)
            if message is None:
                continue
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    return None
                continue
            return int(message.timestamp()[1])
        return None

    def sample(self) -> dict[str, int | None]:
        """Site -> replication lag in ms: the age of its newest heartbeat at the centre when
        read (None: no heartbeat from that site at the centre yet)."""
        lags: dict[str, int | None] = {}
        for site in self.sites:
            emitted = self.newest_heartbeat_ms(site)
            lags[site] = None if emitted is None else max(0, int(time.time() * 1000) - emitted)
        return lags

    def close(self) -> None:
        self._consumer.close()


def write_lag(client: InfluxV1Client, lags: dict[str, int | None], now_ms: int) -> int:
    """One ``replication`` point per site that has a lag figure; returns the points written."""
    points = [
        REPLICATION.point({"source": site, "target": "central"}, {"lag_ms": lag}, now_ms)
        for site, lag in lags.items()
        if lag is not None
    ]
    return client.write_points(points) if points else 0


class LagHistory:
    """Every lag sample of a run per site, for its summary (p50, p99, max, last)."""

    def __init__(self, sites: list[str]) -> None:
        self.samples: dict[str, list[int]] = {site: [] for site in sites}

    def add(self, lags: dict[str, int | None]) -> None:
        for site, lag in lags.items():
            if lag is not None:
                self.samples.setdefault(site, []).append(lag)

    def summary(self, site: str) -> dict[str, float | int | None]:
        from iotwatch.stats import quantiles

        values = sorted(self.samples.get(site, []))
        return {
            "samples": len(values),
            **{f"{name}_ms": value for name, value in quantiles(values, (0.5, 0.99), digits=0).items()},
            "max_ms": values[-1] if values else None,
        }
