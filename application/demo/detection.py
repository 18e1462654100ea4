"""The demo's alerts judged against its injected anomalies, by the one evaluator
(:mod:`iotwatch.evaluation.judgement`)."""

from __future__ import annotations

import msgspec

from iotwatch.application.harness.accounting import RawIndex
from iotwatch.contract.alerts import AlertRecord
from iotwatch.contract.detection import AnomalyKind
from iotwatch.contract.ground_truth import Injection
from iotwatch.contract.metric_catalog import DEFAULT_INTERVAL_S
from iotwatch.evaluation.judgement import JudgedRun, RaisedAlert, judge
from iotwatch.stats import rounded


class KindDetection(msgspec.Struct, kw_only=True):
    injected: int
    detected: int
    recall: float | None
    #: event-time seconds from the anomaly's start to its first alert (None for dropouts when
    #: event time runs faster than the wall clock: silence is judged in wall time)
    median_delay_s: float | None


class Detection(msgspec.Struct, kw_only=True):
    """The alerts against the ground truth: recall of the injected anomalies, precision of
    the raised alerts (end-of-run silences left out), delay, and the same per anomaly kind."""

    anomalies_injected: int
    anomalies_detected: int
    recall: float | None
    alerts_raised: int
    alerts_detecting_an_anomaly: int
    alerts_related_to_an_anomaly: int
    end_of_run_silences: int
    precision: float | None
    false_alarms: int
    false_alarms_by_rule: dict[str, int]
    median_delay_readings: float | None
    by_kind: dict[str, KindDetection]


def judge_alerts(
    alerts: list[AlertRecord], truth: list[Injection], raw: RawIndex, speedup: float = 1.0
) -> tuple[Detection, dict[str, str]]:
    """The run's raised alerts judged against its ground truth by the one evaluator
    (:func:`iotwatch.evaluation.judgement.judge`, as ``iotwatch evaluate --simulated``;
    docs/detection.md says how, the end of the run included): the demo's summary of its report,
    and each raised alert's verdict. The responder's escalation, raised on no reading of its
    own, is judged at its original alert's reading; the demo judges silence in wall time, so a
    dropout's delay in event time is given only when ``speedup`` is 1."""
    run = JudgedRun(
        device_types={device: device_type for device, (device_type, _) in raw.identities.items()},
        intervals_ms={
            device: int(DEFAULT_INTERVAL_S.get(device_type, 1.0) * 1000)
            for device, (device_type, _) in raw.identities.items()
        },
        last_seq=raw.last_seq(),
    )
    by_id = {a.alert_id: a for a in alerts if a.raised}
    raised = [RaisedAlert.of_record(a, by_id.get(a.caused_by or "")) for a in by_id.values()]
    judgement = judge(truth, raised, run)
    overall, kinds = judgement.report["overall"], judgement.report["kinds"]
    by_kind = {
        str(kind): KindDetection(
            injected=stats["windows"],
            detected=stats["detected"],
            recall=rounded(stats["recall"], 3),
            median_delay_s=None if kind == AnomalyKind.DROPOUT and speedup != 1.0 else stats["median_delay_s"],
        )
        for kind, stats in kinds.items()
    }
    summary = Detection(
        anomalies_injected=overall["windows"],
        anomalies_detected=overall["detected"],
        recall=rounded(overall["recall"], 3),
        alerts_raised=overall["alerts"],
        alerts_detecting_an_anomaly=overall["true"],
        alerts_related_to_an_anomaly=overall["related"],
        end_of_run_silences=overall["end_of_run"],
        precision=rounded(overall["precision"], 3),
        false_alarms=overall["false_alarms"],
        false_alarms_by_rule=overall["false_alarms_by_rule"],
        median_delay_readings=overall["median_delay_readings"],
        by_kind=by_kind,
    )
    return summary, judgement.verdicts
