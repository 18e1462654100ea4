"""One webhook post and the retry policy around it.

Only a clear "no" from the receiver is final: 4xx other than 408/429 (the request itself
is wrong and will stay wrong). Everything else -- 5xx, 408, 429, timeouts, refused
connections -- is retried for as long as it takes, with exponential back-off and jitter
(bounded, so recovery is noticed quickly) or the receiver's Retry-After.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import requests

log = logging.getLogger(__name__)

RETRYABLE_4XX = (408, 429)
USER_AGENT = "iotwatch-alerts-forward/1"


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - (now if now is not None else time.time()))


@dataclass(frozen=True)
class PostResult:
    """``delivered``, ``retry`` or ``permanent``; ``reason`` is a short code like ``http_503`` or ``timeout``."""

    outcome: str
    reason: str
    detail: str = ""
    retry_after_s: float | None = None


def receiver_name(url: str) -> str:
    """The receiver as logs may show it: scheme, host, port and the path's first segment only
    (webhook URLs often carry a token in the rest of the path, the query or the user info)."""
    parts = urlsplit(url)
    host = parts.hostname or "?"
    if ":" in host:
        host = f"[{host}]"
    where = f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")
    segments = [s for s in parts.path.split("/") if s]
    if not segments:
        return where
    return f"{where}/{segments[0]}" + ("/…" if len(segments) > 1 or parts.query else "")


@dataclass
class Webhook:
    url: str
    headers: dict[str, str] = field(default_factory=dict)
    timeout_s: float = 10.0
    session: requests.Session = field(default_factory=requests.Session)

    @property
    def name(self) -> str:
        """Where posts go, without secrets (:func:`receiver_name`)."""
        return receiver_name(self.url)

    def send(self, document: Any, key: str, attempt: int = 1, timeout_s: float | None = None) -> PostResult:
        """Post ``document`` (an object or a list) as JSON with ``key`` as its Idempotency-Key
        (the same on every retry)."""
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "Idempotency-Key": key,
            "X-Iotwatch-Attempt": str(attempt),
            **self.headers,
        }
        body = json.dumps(document, separators=(",", ":"), default=str).encode()
        try:
            response = self.session.post(
                self.url,
                data=body,
                headers=headers,
                timeout=self.timeout_s if timeout_s is None else timeout_s,
                allow_redirects=False,
            )
        except requests.Timeout as exc:
            return PostResult("retry", "timeout", str(exc))
        except requests.ConnectionError as exc:
            return PostResult("retry", "connection_error", str(exc))
        status, text = response.status_code, response.text[:500]
        if 200 <= status < 300:
            return PostResult("delivered", f"http_{status}")
        retry_after = parse_retry_after(response.headers.get("Retry-After"))
        if status >= 500 or status in RETRYABLE_4XX:
            return PostResult("retry", f"http_{status}", text, retry_after)
        return PostResult("permanent", f"http_{status}", text)  # other 4xx, and redirects: fix the URL


@dataclass
class Backoff:
    """Exponential delays with "equal jitter": half fixed, half random, never above ``max_s``."""

    initial_s: float = 0.5
    max_s: float = 60.0
    multiplier: float = 2.0
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, failures: int) -> float:
        ceiling = min(self.max_s, self.initial_s * self.multiplier ** max(0, failures - 1))
        return ceiling / 2 + self.rng.uniform(0, ceiling / 2)
