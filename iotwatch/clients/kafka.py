"""Kafka helpers on confluent-kafka: health checks, topic creation, reading a topic whole
(docs/internals.md, "Kafka helpers")."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from iotwatch.clients.tls_probe import certificate_problem, speaks_tls
from iotwatch.errors import AccessRefused, ServiceUnavailable, TlsRefused
from iotwatch.settings import BACKOFF_MAX_MS, KafkaSettings, TopicSettings


def client_config(settings: KafkaSettings) -> dict[str, Any]:
    """Connection properties for a confluent-kafka client, with librdkafka's log lines going
    through Python logging (repeated connection failures summarised, and a broker that
    answers again said so: :mod:`iotwatch.logs`) instead of straight to stderr."""
    from iotwatch.logs import STATS_INTERVAL_MS, broker_states, librdkafka_logger

    return {
        **settings.client_config(),
        "logger": librdkafka_logger(),
        "stats_cb": broker_states,
        "statistics.interval.ms": STATS_INTERVAL_MS,
    }


def java_client_properties(settings: KafkaSettings) -> dict[str, str]:
    """The connection in the Java client's spelling, for Spark's Kafka connector and
    MirrorMaker 2: a JAAS line instead of ``sasl.username``, a PEM truststore instead of a CA
    file. The Java client verifies the broker's name against its certificate by default
    (``ssl.endpoint.identification.algorithm=https``), as librdkafka does."""
    properties = {
        "bootstrap.servers": settings.bootstrap_servers,
        "security.protocol": settings.security_protocol,
        **BACKOFF_MAX_MS,
    }
    if settings.sasl_mechanism:
        properties["sasl.mechanism"] = settings.sasl_mechanism
        module = "plain.PlainLoginModule" if settings.sasl_mechanism.upper() == "PLAIN" else "scram.ScramLoginModule"
        password = settings.sasl_password.get_secret_value() if settings.sasl_password else ""
        properties["sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{module} required "
            f'username="{settings.sasl_username or ""}" password="{password}";'
        )
    if settings.ssl_ca_location:
        properties["ssl.truststore.type"] = "PEM"
        properties["ssl.truststore.location"] = str(settings.ssl_ca_location)
    return properties


def admin_client(settings: KafkaSettings) -> AdminClient:
    return AdminClient(client_config(settings))


def end_offset(consumer: Consumer, partition: TopicPartition, timeout_s: float = 1.0) -> int:
    """The partition's log end offset, asked of its leader.

    A client that does not fetch a topic refreshes the topic's metadata only every
    ``topic.metadata.refresh.interval.ms`` (5 minutes). If a broker restart or a fenced broker
    left the partition unknown or leaderless in its cache, every query fails locally ("Unknown
    partition") until then, while the broker is long back; a topic created a moment ago can
    answer "not leader" until its leader's election reaches the broker asked. So a failed
    query fetches the topic's metadata anew and asks again, until ``timeout_s`` has passed
    since the first failure; the last failure is raised."""
    try:
        return int(consumer.get_watermark_offsets(partition, timeout=timeout_s)[1])
    except KafkaException:
        deadline = time.monotonic() + timeout_s
    while True:
        consumer.list_topics(partition.topic, timeout=timeout_s)
        try:
            return int(consumer.get_watermark_offsets(partition, timeout=timeout_s)[1])
        except KafkaException:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.2)


def list_topics(settings: KafkaSettings, timeout_s: float = 5.0) -> dict[str, int]:
    """Topic name -> partition count of the topics this user may DESCRIBE, or
    :class:`ServiceUnavailable` (:class:`AccessRefused` when the broker refused the login)."""
    failures: list[KafkaError] = []
    debugging = logging.getLogger().isEnabledFor(logging.DEBUG)
    # librdkafka's own account of a failure (queued until polled) only when debugging: the
    # poll below is for the error callback, and the caller reports the failure in one line
    quiet = {} if debugging else {"log_level": 0}
    # dict[str, Any]: librdkafka's configuration takes callbacks too, which the stub's value type leaves out
    config: dict[str, Any] = {**client_config(settings), **quiet, "error_cb": failures.append}
    admin = AdminClient(config)
    # asked a second at a time: a refused login or TLS handshake is final, and said at once
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            metadata = admin.list_topics(timeout=max(0.01, min(1.0, deadline - time.monotonic())))
            return {name: len(topic.partitions) for name, topic in metadata.topics.items()}
        except KafkaException as exc:
            admin.poll(0)  # was the login refused?
            if any(failure.code() == KafkaError._AUTHENTICATION for failure in failures):
                raise login_refused(settings) from exc
            refused = tls_refused(settings, failures)
            if refused is not None:
                raise refused from exc
            if time.monotonic() >= deadline:
                raise ServiceUnavailable(f"Kafka at {settings.bootstrap_servers} did not answer: {exc}") from exc


def topic_partitions(
    settings: KafkaSettings, topics: list[str], operation: str, timeout_s: float = 5.0
) -> dict[str, int]:
    """Partition count per topic, 0 for one that does not exist; :class:`AccessRefused`
    naming ``operation`` (what the caller means to do: READ, WRITE) for a topic the user may
    not see. A topic missing from the full listing is asked for by name, the one question
    whose answer tells "absent" from "not yours" (without creating it on a broker that would)."""
    existing = list_topics(settings, timeout_s)
    counts = {name: existing.get(name, 0) for name in dict.fromkeys(topics)}
    missing = [name for name, count in counts.items() if count == 0]
    if missing:
        admin = AdminClient({**client_config(settings), "allow.auto.create.topics": False})
        for name in missing:
            try:
                found = admin.list_topics(topic=name, timeout=timeout_s).topics[name]
            except KafkaException as exc:
                raise ServiceUnavailable(f"Kafka at {settings.bootstrap_servers} did not answer: {exc}") from exc
            if found.error is not None:
                raise_if_refused(settings, found.error, operation, name)
            counts[name] = len(found.partitions)
    return counts


def raise_if_refused(settings: KafkaSettings, error: KafkaError, operation: str, topic: str | None) -> None:
    """:class:`AccessRefused` when ``error`` is the broker refusing this user ``topic`` (None:
    the error of a consumed message that names no topic)."""
    if error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        raise access_refused(settings, operation, f"topic {topic}" if topic is not None else "a topic")


def access_refused(settings: KafkaSettings, operation: str, resource: str) -> AccessRefused:
    """The one line for an operation the broker's ACLs do not allow this user."""
    return AccessRefused(
        f"Kafka refused user {_user(settings)!r} {operation} on {resource} "
        "(not authorized; grant it with iotwatch provision topics --acls)"
    )


def login_refused(settings: KafkaSettings) -> AccessRefused:
    """The one line for a login the broker refused (SASL authentication failed)."""
    return AccessRefused(
        f"Kafka at {settings.bootstrap_servers} refused user {_user(settings)!r}: SASL authentication failed "
        f"(unknown user or wrong password; check {KafkaSettings.env_name('sasl_username')} "
        f"and {KafkaSettings.env_name('sasl_password')})"
    )


def tls_refused(settings: KafkaSettings, failures: list[KafkaError]) -> TlsRefused | None:
    """The one line for a connection refused at the TLS handshake (None: it was not): which
    of the certificate's trust, its names, or the two ends' protocols is wrong. ``failures``:
    what librdkafka reported (none: a handshake of its own finds out)."""
    texts = " | ".join(failure.str() for failure in failures)
    servers = settings.bootstrap_servers
    host, _, port = servers.split(",")[0].rpartition(":")
    tls = settings.security_protocol.endswith("SSL")
    unverified = "certificate verify failed" in texts or "certificate could not be verified" in texts
    # no failure named: the caller only knows the cluster is unreachable, so look at its certificate
    problem = (
        certificate_problem(host, int(port), settings.ssl_ca_location) if tls and (unverified or not failures) else None
    )
    if problem is None and unverified:
        problem = "a broker's certificate was not verified (one the cluster advertises, not the bootstrap server's)"
    if problem is not None:
        return TlsRefused(
            f"Kafka at {servers} refused over TLS: {problem} "
            f"(check {KafkaSettings.env_name('ssl_ca_location')} and the host names in "
            f"{KafkaSettings.env_name('bootstrap_servers')})"
        )
    if tls and "PLAINTEXT broker listener" in texts:
        return TlsRefused(
            f"Kafka at {servers} does not speak TLS on this port, and this client {settings.security_protocol}: "
            f"check {KafkaSettings.env_name('security_protocol')} and the port"
        )
    if not tls and speaks_tls(host, int(port)):
        return TlsRefused(
            f"Kafka at {servers} speaks TLS and this client {settings.security_protocol}: set "
            f"{KafkaSettings.env_name('security_protocol')}=SSL (SASL_SSL with a user) and "
            f"{KafkaSettings.env_name('ssl_ca_location')}"
        )
    return None


def _user(settings: KafkaSettings) -> str:
    """The principal the broker sees: the SASL user, or Kafka's ANONYMOUS without SASL."""
    return settings.sasl_username or "ANONYMOUS"


def ensure_topics(
    settings: KafkaSettings, topics: list[str], timeout_s: float = 15.0, *, compacted: bool = False
) -> list[str]:
    """Create the topics that do not exist yet (with the configured partition count;
    ``compacted``: ``cleanup.policy=compact``, the latest record per key is kept).

    Returns the names created. An existing topic is left as it is, whatever its
    partition count: changing it would break per-key order for data already there.
    """
    existing = topic_partitions(settings, topics, "DESCRIBE", timeout_s)
    missing = [name for name, count in existing.items() if count == 0]
    if not missing:
        return []
    admin = admin_client(settings)  # keep a reference: the futures die with their client
    futures = admin.create_topics(
        [
            NewTopic(
                name,
                num_partitions=settings.partitions,
                replication_factor=settings.replication_factor,
                config={"cleanup.policy": "compact"} if compacted else {},
            )
            for name in missing
        ],
        operation_timeout=timeout_s,
        request_timeout=timeout_s,
    )
    created = []
    for name, future in futures.items():
        try:
            future.result(timeout=timeout_s)
            created.append(name)
        except KafkaException as exc:
            raise_if_refused(settings, exc.args[0], "CREATE", name)
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise ServiceUnavailable(f"cannot create Kafka topic {name}: {exc}") from exc
    _wait_listed(settings, created, timeout_s)
    return created


def ensure_pipeline_topics(settings: KafkaSettings, topics: TopicSettings) -> list[str]:
    """Create the pipeline's topics that do not exist yet, the on-call and device-state ones
    compacted (for a broker with auto-creation off); returns the names created."""
    created = ensure_topics(settings, topics.kafka_topics())
    return created + ensure_topics(settings, topics.compacted_topics(), compacted=True)


def _wait_listed(settings: KafkaSettings, topics: list[str], timeout_s: float) -> None:
    """Wait until the broker lists topics just created: it answers a creation once the
    controller committed it and updates its own metadata a moment later, and a reader that
    asked in between would take a topic for missing (and a follower never read it)."""
    deadline = time.monotonic() + timeout_s
    while topics and not all(list_topics(settings, timeout_s).get(name) for name in topics):
        if time.monotonic() > deadline:
            raise ServiceUnavailable(f"Kafka created {', '.join(topics)} but did not list them within {timeout_s:g} s")
        time.sleep(0.05)


def read_to_end(settings: KafkaSettings, topic: str, timeout_s: float = 120.0) -> list[Message]:
    """Every record of a topic, from the beginning to the end each partition had when it was
    reached (partition EOF: the high watermark of the fetch, which is exact on every
    broker). No group is joined and no offset committed; an unknown topic reads as empty."""
    follower = TopicFollower(settings, [topic])
    try:
        return follower.catch_up(timeout_s, strict=False)
    finally:
        follower.close()


def batches_to_end(settings: KafkaSettings, topic: str, timeout_s: float = 120.0) -> Iterator[list[Message]]:
    """:func:`read_to_end` a batch at a time, for topics too long to hold as records (an
    hour's raw topic is millions): the reader keeps what it derives, not the records. A
    partition not read to its end within ``timeout_s`` is :class:`ServiceUnavailable`."""
    follower = TopicFollower(settings, [topic])
    try:
        yield from follower.batches(timeout_s)
    finally:
        follower.close()


#: ``fetch.wait.max.ms`` of consumers that follow a topic for people or devices waiting on it
#: (the responder, alert dispatch, ``iotwatch alerts tail``). Kafka answers a waiting fetch as
#: soon as a record arrives, so this costs no latency; it bounds how long an idle follower's
#: fetch stays open (a stop or a new assignment waits for it). An idle follower asks 10 times a second.
FOLLOW_FETCH_WAIT_MS = 100

#: How long a follower that starts by time waits for the broker to name each partition's
#: first offset at or after that time.
OFFSETS_FOR_TIMES_TIMEOUT_S = 10.0


class TopicFollower:
    """Reads whole topics from the beginning and then follows them: the way a component
    rebuilds its state from compacted logs on start (event sourcing). Every partition is
    assigned, no group is joined, no offset committed. Topics missing at start read as empty;
    a topic the user may not read is :class:`AccessRefused`, not an empty topic. ``since_ms``
    starts each partition at its first record timestamped at or after it instead (a viewer
    that starts now reads none of the retained records)."""

    def __init__(self, settings: KafkaSettings, topics: list[str], since_ms: int | None = None) -> None:
        self.settings = settings
        existing = topic_partitions(settings, topics, "READ")
        # from each partition's log start, not offset 0: once retention deleted offset 0, a
        # fetch there is out of range and the consumer would jump to the end, reading nothing
        self.partitions = [
            TopicPartition(topic, p, OFFSET_BEGINNING) for topic in topics for p in range(existing[topic])
        ]
        self._consumer = Consumer(
            {
                **client_config(settings),
                "group.id": f"iotwatch-follow-{time.time_ns()}",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                # a follower that falls behind retention goes on from the new log start,
                # never skips to the end (the default) past what it has not read
                "auto.offset.reset": "earliest",
                "fetch.wait.max.ms": FOLLOW_FETCH_WAIT_MS,
            }
        )
        if self.partitions and since_ms is not None:
            # a partition with no record from since_ms on comes back at its end (offset -1)
            self.partitions = self._consumer.offsets_for_times(
                [TopicPartition(tp.topic, tp.partition, since_ms) for tp in self.partitions],
                OFFSETS_FOR_TIMES_TIMEOUT_S,
            )
        if self.partitions:
            self._consumer.assign(self.partitions)

    def catch_up(self, timeout_s: float = 120.0, *, strict: bool = True) -> list[Message]:
        """The records up to the end each partition had when reached (partition EOF);
        ``strict``: :class:`ServiceUnavailable` when a partition's end was not reached in time."""
        return [record for batch in self.batches(timeout_s, strict=strict) for record in batch]

    def batches(self, timeout_s: float = 120.0, *, strict: bool = True) -> Iterator[list[Message]]:
        """:meth:`catch_up` as the batches the consumer returns (up to 5,000 records each)."""
        at_end: set[tuple[str | None, int | None]] = set()  # a partition EOF names both
        deadline = time.monotonic() + timeout_s
        while len(at_end) < len(self.partitions) and time.monotonic() < deadline:
            if batch := self._consume(1.0, at_end):
                yield batch
        if strict and len(at_end) < len(self.partitions):
            raise ServiceUnavailable(
                f"Kafka: could not read {len(self.partitions) - len(at_end)} partition(s) "
                f"to their end within {timeout_s:.0f} s"
            )

    def poll(self, timeout_s: float) -> list[Message]:
        """New records (errors such as partition EOF left out)."""
        if not self.partitions:
            time.sleep(timeout_s)
            return []
        return self._consume(timeout_s, set())

    def _consume(self, timeout_s: float, at_end: set[tuple[str | None, int | None]]) -> list[Message]:
        """Up to 5,000 records; the partitions whose end was reached are added to ``at_end``."""
        records = []
        for message in self._consumer.consume(5000, timeout_s):
            error = message.error()
            if error is None:
                records.append(message)
            elif error.code() == KafkaError._PARTITION_EOF:
                at_end.add((message.topic(), message.partition()))
            else:
                raise_if_refused(self.settings, error, "READ", message.topic())
        return records

    def close(self) -> None:
        self._consumer.close()


def produce_waiting(producer: Producer, topic: str, key: bytes | None, value: bytes | None, **options: Any) -> None:
    """Produce one record (``options``: headers, on_delivery), waiting while the producer's queue is full."""
    while True:
        try:
            return producer.produce(topic, key=key, value=value, **options)
        except BufferError:
            producer.poll(0.05)


def produce_confirmed(
    settings: KafkaSettings,
    producer: Producer,
    topic: str,
    key: bytes,
    value: bytes,
    headers: Sequence[tuple[str, bytes]] | None = None,
    timeout_s: float = 30.0,
) -> None:
    """Produce one record with ``producer`` (made from ``settings``) and wait until the broker
    confirmed it, or :class:`ServiceUnavailable`: for records whose loss would go unnoticed (an
    acknowledgement, a notification sent); :class:`AccessRefused` when the broker's ACLs do not
    let this user write ``topic``."""
    errors: list[KafkaError] = []
    producer.produce(
        topic,
        value,
        key=key,
        headers=list(headers or ()),
        on_delivery=lambda err, _msg: errors.append(err) if err is not None else None,
    )
    unsent = producer.flush(timeout_s)
    for error in errors:
        raise_if_refused(settings, error, "WRITE", topic)
    if unsent > 0 or errors:
        raise ServiceUnavailable(f"Kafka did not confirm a record on {topic}: {errors[0] if errors else 'timeout'}")
