"""What a device reports of its twin (``.../twin/reported`` on MQTT), as the twin's
``reported`` record: the responder writes it in one cluster, a site's relay at its site."""

from __future__ import annotations

from iotwatch.contract.device_commands import decode_twin_report
from iotwatch.contract.device_topics import parse_twin_reported_topic
from iotwatch.contract.oncall import ONCALL_SCHEMA_VERSION, TwinRecord, TwinSide, twin_key
from iotwatch.contract.telemetry import ContractViolation


def reported_twin(topic: str, payload: bytes) -> tuple[bytes, TwinRecord]:
    """The twin topic's key and record for a device's report, or :class:`ContractViolation`
    (a bad topic or payload, or a report of another device than the topic's)."""
    site, device_type, device_id = parse_twin_reported_topic(topic)
    report = decode_twin_report(payload)
    if report.device_id != device_id:
        raise ContractViolation("key_mismatch", f"twin report of {report.device_id} on {device_id}'s topic")
    record = TwinRecord(
        ONCALL_SCHEMA_VERSION,
        device_id,
        device_type,
        site,
        TwinSide.REPORTED,
        report.properties,
        report.at_ms,
        device_id,
    )
    return twin_key(device_id, TwinSide.REPORTED).encode(), record
