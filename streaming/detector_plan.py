"""Which detector scores each device type's metrics, and the banks of state rows they keep: a
metric's state is its own detector's width (docs/streaming-internals.md, "Detector banks").
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from iotwatch.errors import UserError
from iotwatch.models.catalog import kernel_for, make
from iotwatch.models.kernels import Kernel
from iotwatch.settings import StreamSettings
from iotwatch.streaming.alerting import RuleSpec
from iotwatch.streaming.device_table import DeviceTable


@dataclass(frozen=True)
class DetectorBank:
    """One detector of the job: its compiled kernel, parameters, the state row a new
    (device, metric) starts from, and the anomaly rule on its scores (levels, name)."""

    name: str
    kernel: Kernel[Any]
    params: np.ndarray
    initial: np.ndarray
    anomaly: RuleSpec


@dataclass(frozen=True)
class DetectorPlan:
    """The job's detector banks and the bank of each named device type (others: bank 0)."""

    banks: tuple[DetectorBank, ...]
    bank_of_type: dict[str, int]
    #: ``"device_type.metric"`` -> the normal range declared for it (``stream.metric_ranges``).
    declared: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: A bank -> the bank of its detector's metrics without a declared range (its kernel's ``UNDECLARED``).
    undeclared: dict[int, int] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: StreamSettings, anomaly: RuleSpec) -> DetectorPlan:
        """The banks ``settings`` ask for; ``anomaly``: the anomaly rule, whose levels each
        bank sets to its detector's (:meth:`StreamSettings.alert_scores_of`)."""
        names = settings.detector_names()
        banks = []
        for name in names:
            kernel = kernel_for(name)
            try:
                detector = make(name, **settings.detector_params_of(name))
            except TypeError as exc:
                raise UserError(f"the parameters of detector {name} in the stream settings: {exc}") from None
            params = kernel.params_vector(detector)
            fire, clear = settings.alert_scores_of(name)
            spec = replace(anomaly, fire=fire, clear=clear, detector=name)
            banks.append(DetectorBank(name, kernel, params, kernel.initial_state(params), spec))
        undeclared = {}
        for b, bank in enumerate(list(banks)):
            narrow: Kernel[Any] | None = getattr(bank.kernel, "UNDECLARED", None)
            if narrow is not None:
                params = narrow.params_vector(make(bank.name, **settings.detector_params_of(bank.name)))
                undeclared[b] = len(banks)
                banks.append(replace(bank, kernel=narrow, params=params, initial=narrow.initial_state(params)))
        index = {name: b for b, name in enumerate(names)}
        return cls(
            tuple(banks),
            {t: index[d] for t, d in settings.device_detectors.items()},
            dict(settings.metric_ranges),
            undeclared,
        )

    def declare(
        self, table: DeviceTable, rows: np.ndarray, bank: np.ndarray, device: np.ndarray, name: np.ndarray
    ) -> None:
        """Put each new watched metric's declared range into its fresh detector row, when its
        bank's kernel can use one (a ``declare`` function; the others ignore it)."""
        for row, b, d, metric in zip(rows.tolist(), bank.tolist(), device.tolist(), name.tolist(), strict=True):
            declared = self.declared.get(f"{table.device_type[d]}.{metric}")
            declare = getattr(self.banks[b].kernel, "declare", None)
            if row >= 0 and declared is not None and declare is not None:
                declare(table.detectors[b][row], declared[0], declared[1], None)

    @property
    def state_sizes(self) -> list[int]:
        """Each bank's row width (the shape of a device table's detector arrays)."""
        return [bank.kernel.STATE_SIZE for bank in self.banks]

    @property
    def initials(self) -> list[np.ndarray]:
        return [bank.initial for bank in self.banks]

    def banks_of(self, device_type: np.ndarray) -> np.ndarray:
        """The bank of each device type (int64, 0 for the types not named)."""
        if not self.bank_of_type or not len(device_type):
            return np.zeros(len(device_type), dtype=np.int64)
        return pd.Series(device_type, dtype=object).map(self.bank_of_type).fillna(0).to_numpy(dtype=np.int64)

    def metric_banks(self, device_type: np.ndarray, metric: np.ndarray) -> np.ndarray:
        """The bank of each (device type, metric): its type's (:meth:`banks_of`), or that
        bank's ``undeclared`` bank when ``stream.metric_ranges`` declares no range for it."""
        bank = self.banks_of(device_type)
        if not self.undeclared or not len(bank):
            return bank
        declared = np.zeros(len(bank), dtype=bool)
        for key in self.declared:
            kind, _, name = key.partition(".")
            declared |= (device_type == kind) & (metric == name)
        narrow = np.arange(len(self.banks))
        narrow[list(self.undeclared)] = list(self.undeclared.values())
        return np.where(declared, bank, narrow[bank])

    def levels(self, bank: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The anomaly rule's fire and clear score for each entry of ``bank``."""
        fire = np.array([b.anomaly.fire for b in self.banks])
        clear = np.array([b.anomaly.clear for b in self.banks])
        return fire[bank], clear[bank]
