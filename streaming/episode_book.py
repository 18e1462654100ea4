"""The alert episodes of a micro-batch's devices: read from the devices' state rows as the
lifecycle needs them, written back once at the end of the batch.

In the state an episode is a row of integers (:data:`iotwatch.streaming.device_state.EPISODE_FIELDS`)
and a peak score; while a batch runs it is an :class:`~iotwatch.streaming.alerting.Episode`, the
lifecycle's own record. Idle episodes keep no row.
"""

from __future__ import annotations

import numpy as np

from iotwatch.contract.detection import Rule
from iotwatch.streaming.alerting import AlertContext, DeviceIdentity, Episode, EpisodeStatus, alert_id
from iotwatch.streaming.device_state import (
    EP_ABOVE,
    EP_BELOW,
    EP_LAST_MS,
    EP_METRIC,
    EP_OCCURRENCES,
    EP_RULE,
    EP_START_MS,
    EP_START_SEQ,
    EP_STATUS,
    EPISODE_FIELDS,
    IDLE,
    OPEN,
    PENDING,
)
from iotwatch.streaming.device_table import DeviceTable

#: Rules in the order their alerts are listed for one reading; a rule's position is its code
#: in the saved episodes (``EP_RULE``), so new rules go at the end.
RULE_ORDER = (
    Rule.OUT_OF_RANGE,
    Rule.CRASH,
    Rule.HARSH_BRAKING,
    Rule.WATER_LEAK,
    Rule.STUCK_HVAC,
    Rule.ANOMALY_SCORE,
    Rule.DEVICE_SILENT,
    Rule.FLEET_ANOMALY,
    Rule.COOLANT_OVERHEATING,
    Rule.BATTERY_LOW,
    Rule.HUMIDITY_HIGH,
)
RULE_CODE: dict[str, int] = {name: i for i, name in enumerate(RULE_ORDER)}
_STATUS = {IDLE: EpisodeStatus.IDLE, PENDING: EpisodeStatus.PENDING, OPEN: EpisodeStatus.OPEN}
_STATUS_CODE = {status: code for code, status in _STATUS.items()}


class EpisodeBook:
    """The episodes of the devices of ``table`` (rows in the order of ``devices``) that this
    batch reads or changes."""

    def __init__(self, table: DeviceTable, devices: np.ndarray | list[str], model_version: str) -> None:
        self.table = table
        self.devices = devices
        self.model_version = model_version
        self._episodes: dict[tuple[int, str], Episode] = {}
        self._rows: dict[tuple[int, int], int] | None = None
        self._open: dict[int, set[int]] | None = None

    def open_devices(self, rule: str) -> set[int]:
        """Devices with a pending or open alert of ``rule`` (their lifecycle must see every
        reading). Read from the stored episodes once per batch, not once per rule: each rule's
        lifecycle runs once per batch, before any of its episodes is touched."""
        if self._open is None:
            table = self.table
            self._open = {
                code: set(table.episode_device[table.episodes[:, EP_RULE] == code].tolist())
                for code in np.unique(table.episodes[:, EP_RULE]).tolist()
            }
        return set(self._open.get(RULE_CODE[rule], ()))

    def episode(self, d: int, rule: str) -> Episode:
        """Device ``d``'s episode of ``rule``; the lifecycle changes it in place."""
        found = self._episodes.get((d, rule))
        if found is not None:
            return found
        table = self.table
        if self._rows is None:
            self._rows = {
                key: i
                for i, key in enumerate(
                    zip(table.episode_device.tolist(), table.episodes[:, EP_RULE].tolist(), strict=True)
                )
            }
        at = self._rows.get((d, RULE_CODE[rule]))
        episode = Episode()
        if at is not None:
            row = table.episodes[at]
            episode = Episode(
                _STATUS[int(row[EP_STATUS])],
                int(row[EP_ABOVE]),
                int(row[EP_BELOW]),
                int(row[EP_START_MS]),
                int(row[EP_START_SEQ]),
                int(row[EP_LAST_MS]),
                int(row[EP_OCCURRENCES]),
                float(table.peaks[at]),
            )
            metric, names = int(row[EP_METRIC]), table.metric_names(d)
            episode.metric = names[metric] if 0 <= metric < len(names) else None
            if episode.status is EpisodeStatus.OPEN:
                episode.alert_id = alert_id(self.devices[d], rule, episode.start_ms)
        self._episodes[(d, rule)] = episode
        return episode

    def context(self, d: int) -> AlertContext:
        """The fields every alert of device ``d`` carries."""
        table = self.table
        return AlertContext(DeviceIdentity(self.devices[d], table.device_type[d], table.site[d]), self.model_version)

    def write_back(self) -> None:
        """Write the episodes this batch touched back into the table (idle ones are
        dropped: an idle rule keeps no state)."""
        if not self._episodes:
            return
        table = self.table
        touched = {(d, RULE_CODE[rule]) for d, rule in self._episodes}
        keep = np.array(
            [
                key not in touched
                for key in zip(table.episode_device.tolist(), table.episodes[:, EP_RULE].tolist(), strict=True)
            ],
            dtype=bool,
        )
        devices, rows, peaks = [], [], []
        for (d, rule), e in sorted(self._episodes.items(), key=lambda item: (item[0][0], RULE_CODE[item[0][1]])):
            if e.status is EpisodeStatus.IDLE:
                continue
            names = table.metric_names(d)
            metric = names.index(e.metric) if e.metric in names else -1
            devices.append(d)
            rows.append(
                [
                    RULE_CODE[rule],
                    _STATUS_CODE[e.status],
                    e.above,
                    e.below,
                    e.start_ms,
                    e.start_seq,
                    e.last_ms,
                    e.occurrences,
                    metric,
                ]
            )
            peaks.append(e.peak_score)
        device = np.concatenate([table.episode_device[keep], np.array(devices, dtype=np.int64)])
        order = np.argsort(device, kind="stable")
        table.episode_device = device[order]
        table.episodes = np.concatenate(
            [table.episodes[keep], np.array(rows, dtype=np.int64).reshape(-1, len(EPISODE_FIELDS))]
        )[order]
        table.peaks = np.concatenate([table.peaks[keep], np.array(peaks, dtype=np.float64)])[order]
        self._rows = None
        self._open = None
