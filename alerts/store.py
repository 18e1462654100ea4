"""What ``alerts forward`` already handled, so a restart does not post it again.

A small SQLite file keyed by (webhook, alert_id, state): the outcome is written after the
webhook accepted the post and *before* the Kafka offset is committed, so after a crash
between the two the re-consumed alert is recognised and only its offset is committed.
Entries older than the TTL are pruned; the alert topic's retention makes older ones moot.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
from pathlib import Path

SCHEMA = """
CREATE TABLE IF NOT EXISTS handled (
    target TEXT NOT NULL, alert_id TEXT NOT NULL, state TEXT NOT NULL,
    outcome TEXT NOT NULL, at_ms INTEGER NOT NULL,
    PRIMARY KEY (target, alert_id, state)
);
CREATE INDEX IF NOT EXISTS handled_at ON handled (at_ms);
"""


def target_key(url: str) -> str:
    """A stable key for the webhook that does not store its URL (Slack URLs embed a secret)."""
    return hashlib.sha256(url.encode()).hexdigest()[:16]


class DeliveryStore:
    """(alert_id, state) -> outcome (``delivered`` or ``dead``) for one webhook."""

    def __init__(self, path: Path, url: str, ttl_s: float) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.target, self.ttl_s = path, target_key(url), ttl_s
        # autocommit (one write = one transaction); used by one thread at a time, not necessarily its creator
        self._db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")  # an acknowledged write survives a power cut too
        self._db.executescript(SCHEMA)

    def outcome(self, alert_id: str, state: str) -> str | None:
        row = self._db.execute(
            "SELECT outcome FROM handled WHERE target=? AND alert_id=? AND state=?", (self.target, alert_id, state)
        ).fetchone()
        return row[0] if row else None

    def record(self, alert_id: str, state: str, outcome: str) -> None:
        self._db.execute(
            "INSERT OR REPLACE INTO handled VALUES (?, ?, ?, ?, ?)",
            (self.target, alert_id, state, outcome, int(time.time() * 1000)),
        )

    def prune(self, now_ms: int | None = None) -> int:
        """Forget entries older than the TTL (every webhook's); returns how many."""
        now_ms = now_ms if now_ms is not None else int(time.time() * 1000)
        cursor = self._db.execute("DELETE FROM handled WHERE at_ms < ?", (now_ms - int(self.ttl_s * 1000),))
        return cursor.rowcount

    def count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM handled WHERE target=?", (self.target,)).fetchone()[0]

    def close(self) -> None:
        self._db.close()
