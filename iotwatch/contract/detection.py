"""What an alert's ``rule`` may be, what the simulators inject (a ground-truth record's
``kind``), and which rules may report each kind: one spelling per rule and per kind.

Rule names travel in every alert record (:class:`iotwatch.contract.alerts.AlertRecord`),
on-call routes and silences match them, and the responder's policies act on them. Anomaly
kinds travel in the simulators' ground truth, which ``iotwatch evaluate --simulated``, the
demo's accounting and the tests judge alerts against, by :data:`RULES_FOR_ANOMALY_KIND`.

>>> Rule.STUCK_HVAC in RULES_FOR_ANOMALY_KIND[AnomalyKind.STUCK_HVAC]
True
>>> canonical_kind("hvac_stuck"), canonical_kind("leak")
('stuck_hvac', 'water_leak')
"""

from __future__ import annotations

from enum import StrEnum

from iotwatch.contract.metric_catalog import danger_limits


class Rule(StrEnum):
    """The rules of the streaming job, and the responder's escalation."""

    ANOMALY_SCORE = "anomaly_score"  # the per-device detectors
    FLEET_ANOMALY = "fleet_anomaly"  # the fleet model of the device type
    OUT_OF_RANGE = "out_of_range"
    CRASH = "crash"
    HARSH_BRAKING = "harsh_braking"
    WATER_LEAK = "water_leak"
    STUCK_HVAC = "stuck_hvac"
    DEVICE_SILENT = "device_silent"
    COOLANT_OVERHEATING = "coolant_overheating"
    BATTERY_LOW = "battery_low"
    HUMIDITY_HIGH = "humidity_high"
    COMMAND_ESCALATION = "command_escalation"  # the responder: commands did not fix a condition
    INGESTION_GAP = "ingestion_gap"  # the job: a raw topic's whole input stopped (site or cluster)


class AnomalyKind(StrEnum):
    """The anomalies the simulators inject (transport faults are not anomalies)."""

    SPIKE = "spike"
    LEVEL_SHIFT = "level_shift"
    DRIFT = "drift"
    FLATLINE = "flatline"
    NOISE_BURST = "noise_burst"
    OUT_OF_RANGE = "out_of_range"
    DROPOUT = "dropout"
    STUCK_HVAC = "stuck_hvac"
    WATER_LEAK = "water_leak"
    HARSH_BRAKING = "harsh_braking"
    CRASH = "crash"
    OVERHEATING = "overheating"


class TransportFault(StrEnum):
    """The transport faults the simulators inject: what the pipeline must absorb, not report."""

    DUPLICATE = "duplicate"
    OUT_OF_ORDER = "out_of_order"
    LATE = "late"
    CLOCK_SKEW = "clock_skew"
    MALFORMED = "malformed"


#: Aliases of kinds and faults, accepted in scenario files, ``--anomalies`` and ``--faults``.
KIND_ALIASES: dict[str, str] = {
    "hvac_stuck": AnomalyKind.STUCK_HVAC,
    "leak": AnomalyKind.WATER_LEAK,
    "stuck": AnomalyKind.FLATLINE,
    "stuck_at": AnomalyKind.FLATLINE,
    "noise": AnomalyKind.NOISE_BURST,
    "shift": AnomalyKind.LEVEL_SHIFT,
    "duplicates": TransportFault.DUPLICATE,
    "reorder": TransportFault.OUT_OF_ORDER,
    "skew": TransportFault.CLOCK_SKEW,
}


def canonical_kind(name: str) -> str:
    """The kind's one spelling (an alias maps to it; other names are returned as given)."""
    return str(KIND_ALIASES.get(name, name))


def _names(*rules: str) -> frozenset[str]:
    return frozenset(str(rule) for rule in rules)


#: Rules that may report an anomaly of a measurement (a spike, a drift...): the detectors,
#: the thermostat's HVAC rule (a drifting temperature sensor fools the HVAC) and, once the
#: metric is carried past a danger limit of the catalogue, that limit's rule.
MEASUREMENT_RULES = _names(
    Rule.ANOMALY_SCORE, Rule.FLEET_ANOMALY, Rule.STUCK_HVAC, *(limit.rule for _, _, limit in danger_limits())
)
#: Which rules may report each kind: an alert of another rule does not detect it. The one
#: table ``iotwatch evaluate --simulated``, the demo's accounting and the tests judge by.
RULES_FOR_ANOMALY_KIND: dict[str, frozenset[str]] = {
    AnomalyKind.SPIKE.value: MEASUREMENT_RULES,
    AnomalyKind.LEVEL_SHIFT.value: MEASUREMENT_RULES,
    AnomalyKind.DRIFT.value: MEASUREMENT_RULES,
    AnomalyKind.FLATLINE.value: MEASUREMENT_RULES,
    AnomalyKind.NOISE_BURST.value: MEASUREMENT_RULES,
    AnomalyKind.OUT_OF_RANGE.value: _names(Rule.OUT_OF_RANGE),
    AnomalyKind.DROPOUT.value: _names(Rule.DEVICE_SILENT),
    AnomalyKind.STUCK_HVAC.value: _names(Rule.STUCK_HVAC, Rule.ANOMALY_SCORE),
    AnomalyKind.WATER_LEAK.value: _names(Rule.WATER_LEAK),
    AnomalyKind.HARSH_BRAKING.value: _names(Rule.HARSH_BRAKING, Rule.CRASH, Rule.ANOMALY_SCORE),
    AnomalyKind.CRASH.value: _names(Rule.CRASH),
    AnomalyKind.OVERHEATING.value: _names(Rule.COOLANT_OVERHEATING, Rule.ANOMALY_SCORE, Rule.OUT_OF_RANGE),
}
