"""Transport faults: what the network and device firmware do to messages on the way (docs/internals.md,
"Transport faults")."""

from __future__ import annotations

import re

__all__ = ["corrupt"]

_SEQ = re.compile(r'"seq":(\d+),')


def corrupt(payload: str, variant: str) -> str | bytes:
    """A payload that fails contract validation in the way ``variant`` names."""
    if variant == "truncated":
        return payload[: max(1, len(payload) // 2)]
    if variant == "not_json":
        return "ERROR sensor reset " + payload[:20]
    if variant == "invalid_utf8":
        return payload.encode()[:-2] + b"\xff\xfe}"
    if variant == "missing_field":
        return _SEQ.sub("", payload, count=1)
    if variant == "wrong_type":
        return _SEQ.sub(lambda m: f'"seq":"{m.group(1)}",', payload, count=1)
    if variant == "nan":
        return re.sub(r'("metrics":\{"[^"]+":)[^,}]+', r"\1NaN", payload, count=1)
    if variant == "unknown_field":
        return payload[:-1] + ',"firmware":"1.2.3"}'
    if variant == "bad_version":
        return payload.replace('"v":1,', '"v":99,', 1)
    raise ValueError(f"unknown malformed variant {variant!r}")
