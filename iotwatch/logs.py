"""Where every library's log output goes: one stderr handler, sane levels, repeats summarised.

A user reads stderr for the one line that matters (an error, a progress line), so the
libraries' chatter is held back unless ``--log-level debug`` asks for it:

- librdkafka logs through the Python logger :data:`LIBRDKAFKA` (confluent-kafka's
  ``logger`` property, see :func:`iotwatch.clients.kafka.client_config`); a broker
  connection failure, which librdkafka repeats on every reconnect attempt, becomes one
  summarised line per broker and reason (:class:`RepeatSummary`);
- py4j (Spark's Python-JVM bridge) logs every command at INFO: shown from WARNING only;
- Spark's own log4j output at WARN and no console progress bar (:mod:`iotwatch.jvm.spark`).
"""

from __future__ import annotations

import logging
import re
import sys
import threading

#: The logger librdkafka's messages go to (confluent-kafka calls ``logger.log(level, ...)``).
LIBRDKAFKA = "iotwatch.librdkafka"
#: Library loggers that are chatty at INFO and useful only when debugging.
QUIET_LIBRARIES = ("py4j", "urllib3", "matplotlib", "numba", "asyncio", "amqtt", "transitions")
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

# "FAIL [rdkafka#producer-1] [thrd:127.0.0.1:1/bootstrap]: 127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1
# failed: Connection refused (after 0ms in state CONNECT, 3 identical error(s) suppressed)"
_BROKER_FAILURE = re.compile(r"^(?P<fac>\w+) \[[^\]]*\] \[thrd:[^\]]*\]: (?P<broker>[^ ]+?)(?:/[\w-]+)?: (?P<what>.*)$")
_NOISE = re.compile(r"\(after \d+ms(?:[^()]|\(s\))*\)|\d+ identical error\(s\) suppressed|ipv[46]#")


class RepeatSummary(logging.Filter):
    """Pass the first librdkafka message of each (broker, problem) once, as one WARNING line
    that says it will retry; drop its repeats unless debug logging is on.

    librdkafka logs a refused connection on every reconnect attempt of every client (tens
    of lines a second); what a user needs is that broker X is unreachable and why.
    """

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        match = _BROKER_FAILURE.match(text)
        if match is None:
            return True
        broker, what = match["broker"], _NOISE.sub("", match["what"]).strip(" ,:")
        key = (broker, re.sub(r"\d+", "N", what))
        with self._lock:
            first = key not in self._seen
            self._seen.add(key)
        if first and record.levelno >= logging.WARNING:
            record.msg, record.args = "Kafka broker %s: %s (retrying; repeats are logged at DEBUG)", (broker, what)
            record.levelno, record.levelname = logging.WARNING, "WARNING"
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(LIBRDKAFKA).isEnabledFor(logging.DEBUG)

    def recovered(self, broker: str) -> bool:
        """``broker`` answers again: forget its failures (the next outage is news again);
        whether any had been reported."""
        with self._lock:
            gone = {key for key in self._seen if key[0] == broker}
            self._seen -= gone
        return bool(gone)


#: How often librdkafka clients report their brokers' states (:func:`broker_states`).
STATS_INTERVAL_MS = 5000


def broker_states(stats: str) -> None:
    """librdkafka's statistics callback: a broker whose failure :class:`RepeatSummary` reported
    and that is ``UP`` again gets one line saying so, so a command that said Kafka was gone
    also says when it is back."""
    import json

    summary = next((f for f in librdkafka_logger().filters if isinstance(f, RepeatSummary)), None)
    if summary is None:
        return
    try:
        brokers = json.loads(stats).get("brokers", {})
    except ValueError:
        return
    for broker in brokers.values():
        name = str(broker.get("nodename", ""))
        if broker.get("state") == "UP" and summary.recovered(name):
            logging.getLogger(LIBRDKAFKA).info("Kafka broker %s answers again", name)


def librdkafka_logger() -> logging.Logger:
    """The logger handed to confluent-kafka clients (summarising repeats, see :class:`RepeatSummary`)."""
    logger = logging.getLogger(LIBRDKAFKA)
    if not any(isinstance(f, RepeatSummary) for f in logger.filters):
        logger.addFilter(RepeatSummary())
    return logger


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
