"""Where every library's log output goes: one stderr handler, sane levels, repeats summarised
(docs/internals.md, "Log output")."""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable

#: The logger librdkafka's messages go to (confluent-kafka calls ``logger.log(level, ...)``).
LIBRDKAFKA = "iotwatch.librdkafka"
#: Library loggers that are chatty at INFO and useful only when debugging.
QUIET_LIBRARIES = ("py4j", "urllib3", "matplotlib", "numba", "asyncio", "amqtt", "transitions")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1
# failed: Connection refused (after 0ms in state CONNECT, 3 identical error(s) suppressed)"; a consumer's
# coordinator connection names the broker after "GroupCoordinator: ".
_BROKER_FAILURE = re.compile(
    r"^(?P<fac>\w+) \[[^\]]*\] \[thrd:[^\]]*\]: (?:GroupCoordinator: )?(?P<broker>[^ ]+?)(?:/[\w-]+)?: (?P<what>.*)$"
)
#: librdkafka's news of a partition whose new leader its metadata cache does not know yet, which
#: every client logs around a broker's restart and resolves by itself on the next refresh.
_TRANSIENT = re.compile(r"^METADATAUPDATE \[[^\]]*\] \[thrd:[^\]]*\]: .* not found in cache$")
_NOISE = re.compile(r"\(after \d+ms(?:[^()]|\(s\))*\)|\d+ identical error\(s\) suppressed|ipv[46]#")
#: A broker's failures are one outage until it answers again, or until none came for this long.
FOLD_S = 300.0
#: After a broker answers again, a failure from a client that has not reconnected yet is no new
#: outage: for this long it stays at DEBUG.
GRACE_S = 10.0


class RepeatSummary(logging.Filter):
    """One WARNING line per broker and outage, whatever the client or the reason: the first
    failure of a broker says it will retry; the rest (every reconnect attempt of every client,
    tens of lines a second, a disconnection and the refused connections that follow it) go to
    DEBUG until the broker answers again (:meth:`recovered`, from librdkafka's statistics:
    :func:`broker_states`). Spark's Kafka clients report through :meth:`failed` too
    (:class:`iotwatch.jvm.spark.KafkaRepeats`), so a command says a broker is gone once.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.clock = clock
        self._down: dict[str, float] = {}  # broker -> time of its last failure
        self._back: dict[str, float] = {}  # broker -> when it answered again
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        match = _BROKER_FAILURE.match(text)
        if match is None and _TRANSIENT.match(text) is None:
            return True
        if match is not None and record.levelno >= logging.WARNING and self.failed(match["broker"]):
            broker, what = match["broker"], _NOISE.sub("", match["what"]).strip(" ,:")
            record.msg, record.args = "Kafka broker %s: %s (retrying; repeats are logged at DEBUG)", (broker, what)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(LIBRDKAFKA).isEnabledFor(logging.DEBUG)

    def failed(self, broker: str) -> bool:
        """A client failed to reach ``broker``: whether that is news (the first failure of an
        outage) rather than a repeat."""
        now = self.clock()
        with self._lock:
            last = self._down.get(broker)
            if last is not None and now - last < FOLD_S:
                self._down[broker] = now
                return False
            if now - self._back.get(broker, -GRACE_S) < GRACE_S:
                return False
            self._down[broker] = now
            return True

    def down(self) -> bool:
        """Whether an outage of any broker is being reported."""
        now = self.clock()
        with self._lock:
            return any(now - last < FOLD_S for last in self._down.values())

    def recovered(self, broker: str) -> bool:
        """``broker`` answers again: its outage ends (the next one is news again); whether
        one had been reported."""
        with self._lock:
            if self._down.pop(broker, None) is None:
                return False
            self._back[broker] = self.clock()
            return True


#: How often librdkafka clients report their brokers' states (:func:`broker_states`).
STATS_INTERVAL_MS = 5000


def broker_states(stats: str) -> None:
    """librdkafka's statistics callback: a broker whose failure :class:`RepeatSummary` reported
    and that is ``UP`` again gets one line saying so, so a command that said Kafka was gone
    also says when it is back."""
    import json

    try:
        brokers = json.loads(stats).get("brokers", {})
    except ValueError:
        return
    summary = repeat_summary()
    for broker in brokers.values():
        name = str(broker.get("nodename", ""))
        if broker.get("state") == "UP" and summary.recovered(name):
            logging.getLogger(LIBRDKAFKA).info("Kafka broker %s answers again", name)


def repeat_summary() -> RepeatSummary:
    """This process's :class:`RepeatSummary` (on the librdkafka logger)."""
    logger = logging.getLogger(LIBRDKAFKA)
    summary = next((f for f in logger.filters if isinstance(f, RepeatSummary)), None)
    if summary is None:
        summary = RepeatSummary()
        logger.addFilter(summary)
    return summary


def librdkafka_logger() -> logging.Logger:
    """The logger handed to confluent-kafka clients (summarising repeats, see :class:`RepeatSummary`)."""
    repeat_summary()
    return logging.getLogger(LIBRDKAFKA)


def configure(level: str = "INFO") -> None:
    """Set up logging for a command: one stderr handler with ``level``; the chatty libraries
    from WARNING unless ``level`` is DEBUG."""
    numeric = logging.getLevelName(level.upper())
    logging.basicConfig(level=numeric, stream=sys.stderr, format=FORMAT)
    logging.getLogger().setLevel(numeric)
    quiet = logging.DEBUG if numeric <= logging.DEBUG else logging.WARNING
    for name in QUIET_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)
    librdkafka_logger()


def spark_log_level() -> str:
    """Spark's log4j level matching this process's logging: WARN, or INFO when debugging."""
    return "INFO" if logging.getLogger().isEnabledFor(logging.DEBUG) else "WARN"
