"""Settings shared by every component: endpoints, topics, credentials, stack options
(docs/internals.md, "Settings")."""

from __future__ import annotations

import getpass
import os
import re
import tomllib
from contextvars import ContextVar
from pathlib import Path
from typing import Any, ClassVar, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic_core import to_json
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from iotwatch.errors import UserError

CONFIG_FILE_ENV = "IOTWATCH_CONFIG"
#: The settings file of the :func:`load_settings` call under way (``--config``); it takes
#: the place of ``IOTWATCH_CONFIG`` without writing the process's environment.
_CONFIG_FILE: ContextVar[str | None] = ContextVar("iotwatch_config_file", default=None)


class _TomlSection(PydanticBaseSettingsSource):
    """Reads one ``[section]`` of the settings file: ``--config``'s, else ``IOTWATCH_CONFIG``'s."""

    def __init__(self, settings_cls: type[BaseSettings], section: str) -> None:
        super().__init__(settings_cls)
        self._section = section

    def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False  # everything is returned by __call__

    def __call__(self) -> dict[str, Any]:
        path, source = _CONFIG_FILE.get(), "--config"
        if not path:
            path, source = os.environ.get(CONFIG_FILE_ENV), CONFIG_FILE_ENV
        if not path:
            return {}
        try:
            with open(path, "rb") as handle:
                data = tomllib.load(handle)
        except FileNotFoundError as exc:
            raise UserError(f"settings file {path} ({source}) does not exist") from exc
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"settings file {path} is not valid TOML: {exc}") from exc
        section = data.get(self._section, {})
        if not isinstance(section, dict):
            raise UserError(f"settings file {path}: [{self._section}] must be a table")
        return section


class _ConcernSettings(BaseSettings):
    """Base for one concern: ``class MqttSettings(_ConcernSettings, section="mqtt")`` reads the
    TOML table ``[mqtt]`` and the variables ``IOTWATCH_MQTT_*`` (``env`` names another prefix)."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore")
    section: ClassVar[str] = ""

    def __init_subclass__(cls, section: str = "", env: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.section = section
        cls.model_config = {**cls.model_config, "env_prefix": f"IOTWATCH_{(env or section).upper()}_"}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _TomlSection(settings_cls, cls.section))

    @classmethod
    def env_name(cls, field: str) -> str:
        """The environment variable that sets ``field`` of this concern."""
        return f"{cls.model_config.get('env_prefix', '')}{field}".upper()

    def as_environment(self) -> dict[str, str]:
        """The environment variables that set this concern to its current values, secrets
        included (unset ones left out): a child process started with them gets exactly
        these settings. Lists and tables are written as JSON, as the environment takes them."""
        env = {}
        for name, value in self:
            if value is None:
                continue
            if isinstance(value, SecretStr):
                text = value.get_secret_value()
            elif isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, int | float | str | Path):
                text = str(value)
            else:
                text = to_json(value).decode()
            env[self.env_name(name)] = text
        return env


class MqttSettings(_ConcernSettings, section="mqtt"):
    """The MQTT broker devices publish to and the gateway subscribes to."""

    url: str = Field("mqtt://127.0.0.1:1883", description="mqtt://HOST:PORT, or mqtts:// for TLS")
    username: str | None = None
    password: SecretStr | None = None
    tls_ca_file: Path | None = Field(None, description="CA bundle for mqtts://; system CAs if unset")
    tls_insecure: bool = Field(False, description="skip server certificate verification (testing only)")
    keepalive_s: int = 30
    qos: int = Field(1, ge=0, le=1, description="QoS of the simulators' publishes (0 or 1)")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        return check_url(value, ("mqtt", "mqtts", "ssl", "tcp", "ws", "wss"))

    @property
    def host(self) -> str:
        return _url_host(self.url)

    @property
    def port(self) -> int:
        return _url_port(self.url, 8883 if self.use_tls else 1883)

    @property
    def use_tls(self) -> bool:
        return urlsplit(self.url).scheme in ("mqtts", "ssl")


#: How far apart every Kafka client (librdkafka's and the Java ones in Spark and MirrorMaker)
#: at most tries a lost broker again and retries a failed request. A broker back from a restart
#: is found by the gateway's producer, the job's offset reader, its consumers and its sinks in
#: turn, each up to one back-off late: librdkafka's default lets the wait grow to 10 s, the Java
#: clients' to 1 s; a quarter second costs a few connection attempts a second while a broker
#: is away (docs/operate/chaos.md).
BACKOFF_MAX_MS = {"reconnect.backoff.max.ms": "250", "retry.backoff.max.ms": "250"}

#: Kafka's client security protocols (``security.protocol``).
SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]


class KafkaSettings(_ConcernSettings, section="kafka"):
    """The Kafka cluster that carries the event log."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: SecurityProtocol = "PLAINTEXT"
    sasl_mechanism: str | None = Field(None, description="e.g. PLAIN, SCRAM-SHA-256, SCRAM-SHA-512")
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: Path | None = Field(
        None,
        description="CA certificate (PEM) that signed the brokers' certificates, for SSL and SASL_SSL; "
        "the system's CAs if unset. Clients also check that the broker's name is in its certificate",
    )
    partitions: int = Field(4, ge=1, description="partition count for topics iotwatch creates")
    replication_factor: int = Field(1, ge=1)

    @field_validator("bootstrap_servers")
    @classmethod
    def _check_servers(cls, value: str) -> str:
        return check_bootstrap_servers(value)

    def client_config(self) -> dict[str, str]:
        """librdkafka connection properties shared by every producer, consumer and admin,
        with :data:`BACKOFF_MAX_MS`."""
        config = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            **BACKOFF_MAX_MS,
        }
        if self.sasl_mechanism:
            config["sasl.mechanism"] = self.sasl_mechanism
        if self.sasl_username:
            config["sasl.username"] = self.sasl_username
        if self.sasl_password:
            config["sasl.password"] = self.sasl_password.get_secret_value()
        if self.ssl_ca_location:
            config["ssl.ca.location"] = str(self.ssl_ca_location)
        return config


class TopicSettings(_ConcernSettings, section="topics", env="topic"):
    """Kafka topic names and MQTT topic filters (defaults follow the message contract)."""

    raw: str = "iot.telemetry.raw"
    raw_pattern: str | None = Field(
        None,
        description="the streaming job reads every topic matching this regular expression instead of "
        "the raw topic (sites: each site's replica, e.g. [^.]+\\.iot\\.telemetry\\.raw)",
    )
    dlq: str = "iot.telemetry.dlq"
    alerts: str = "iot.alerts"
    model_updates: str = "iot.model.updates"
    mqtt_telemetry_filter: str = "iot/+/+/+/telemetry"
    mqtt_status_filter: str = Field(
        "iot/+/+/+/status",
        description="devices' retained online/offline/lost status: a site's relay learns which devices are at its site",
    )
    alert_state: str = Field("iot.alerts.state", description="operators' acknowledgements, compacted by alert id")
    silences: str = Field("iot.alerts.silences", description="silences, compacted by silence id")
    notifications: str = Field(
        "iot.alerts.notifications",
        description="what the forwarder sent per receiver and group, compacted (its state on restart)",
    )
    commands: str = Field(
        "iot.commands", description="audit trail of device commands and their replies, compacted by command id"
    )
    device_twin: str = Field(
        "iot.devices.twin", description="device twins: desired and reported properties, compacted by device id and side"
    )
    emergencies: str = Field(
        "iot.emergencies", description="emergency notification records (e.g. a vehicle crash), compacted by alert id"
    )
    replies: str = Field(
        "iot.commands.replies",
        description="sites: devices' replies to commands as the site's relay received them over MQTT "
        "(key: the MQTT topic), replicated to the centre as <site>.iot.commands.replies",
    )
    commands_replica: str = Field(
        "central.iot.commands",
        description="sites: the site's replica of the centre's commands topic (MirrorMaker 2's name for it), "
        "which the site's relay delivers to the site's devices",
    )

    @staticmethod
    def site_replicas(topic: str) -> str:
        """The regular expression of every site's replica of ``topic`` at the centre
        (``<site>.<topic>``, MirrorMaker 2's default replication policy)."""
        return rf"[^.]+\.{re.escape(topic)}"

    def kafka_topics(self) -> list[str]:
        """Every Kafka topic the pipeline reads or writes."""
        return [self.raw, self.dlq, self.alerts, self.model_updates]

    def compacted_topics(self) -> list[str]:
        """The on-call topics whose latest record per key is the current state (log compaction)."""
        return [self.alert_state, self.silences, self.notifications, self.commands, self.device_twin, self.emergencies]


class InfluxSettings(_ConcernSettings, section="influx"):
    """InfluxDB for metrics. Only the v1-compatible HTTP API (``/write``, ``/query``) is
    used, which InfluxDB 1.x serves natively and 2.x/3.x serve through DBRP mappings."""

    url: str | None = Field("http://127.0.0.1:8086", description="empty disables metrics to InfluxDB")
    database: str = "iotwatch"
    retention_policy: str | None = None
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = Field(None, description="InfluxDB 2.x/3.x API token (sent as 'Token ...')")

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str | None) -> str | None:
        return check_url(value, ("http", "https")) if value else value

    @property
    def enabled(self) -> bool:
        return bool(self.url)


class StackSettings(_ConcernSettings, section="stack"):
    """The embedded single-machine stack started by ``iotwatch stack up``."""

    run_dir: Path = Field(default_factory=lambda: Path.home() / ".iotwatch" / "stack")
    mqtt_broker: Literal["auto", "mosquitto", "amqtt"] = "auto"
    influxdb: Literal["auto", "influxd", "none"] = "auto"
    startup_timeout_s: float = 60.0
    sites: int = Field(
        0,
        ge=0,
        le=20,
        description="edge sites, each with its own MQTT broker and Kafka node, replicated to the "
        "central Kafka cluster by MirrorMaker 2 (0: one cluster, no sites)",
    )
    kafka_nodes: int = Field(
        1,
        ge=1,
        le=9,
        description="nodes of the central Kafka cluster, each a combined broker and controller; "
        "with 3 or more, topics keep 3 replicas with min.insync.replicas 2, so a node can fail "
        "without loss or a pause in writes",
    )
    tls: bool = Field(
        False,
        description="every Kafka node's listener speaks TLS (security protocol SSL) with a server "
        "certificate from a private CA in <run_dir>/tls; clients verify it with its ca.crt",
    )


class MappingRule(BaseModel):
    """Routes MQTT messages matching ``mqtt_filter`` (``{topics.*}`` filled: the default is the
    ``[topics] mqtt_telemetry_filter`` setting) to a Kafka topic.

    ``kafka_topic`` and ``key`` are templates: ``{1}`` is the MQTT topic's second level
    (levels count from 0), ``{payload.device_id}`` a top-level payload field, and ``{topics.raw}``
    etc. the configured topic names. The default routes telemetry to the raw topic keyed by
    device_id, so per-device order holds within a partition.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mqtt_filter: str = "{topics.mqtt_telemetry_filter}"
    kafka_topic: str = "{topics.raw}"
    key: str = "{payload.device_id}"
    validate_contract: bool = Field(True, description="check the telemetry contract; invalid -> dead letters")


class GatewaySettings(_ConcernSettings, section="gateway"):
    """The MQTT -> Kafka bridge (``iotwatch gateway``)."""

    client_id: str = Field(
        "iotwatch-gateway-1", description="MQTT client id; fixed so the persistent session survives restarts"
    )
    shared_group: str | None = Field(
        None, description="subscribe through $share/<group>/... so instances split the load"
    )
    mqtt_protocol: Literal["5", "3.1.1"] = Field(
        "5", description="MQTT 5 bounds in-flight messages with Receive Maximum"
    )
    session_expiry_s: int = Field(
        7 * 24 * 3600, description="how long the broker queues for a stopped gateway (MQTT 5)"
    )
    max_inflight: int = Field(2000, ge=1, description="messages received but not yet confirmed by Kafka")
    linger_ms: int = Field(
        5,
        ge=0,
        description="how long the Kafka producer waits to fill a batch: added latency "
        "against fewer, larger produce requests (under load batches fill while a request is out); "
        "5, the Kafka clients' own default",
    )
    max_payload_bytes: int = Field(256 * 1024, ge=1)
    max_future_skew_ms: int = Field(24 * 3600 * 1000, ge=0)
    rules: list[MappingRule] = Field(default_factory=lambda: [MappingRule()])
    metrics_host: str = "127.0.0.1"
    metrics_port: int | None = Field(9108, description="Prometheus /metrics and /health; empty disables")
    status_interval_s: float = Field(10.0, gt=0, description="period of the status log line and InfluxDB metrics")
    kafka_check_interval_s: float = Field(
        5.0,
        gt=0,
        description="how often /health asks the Kafka cluster for its metadata (also when nothing is "
        "being produced); a check waits at most this long for an answer",
    )
    drain_timeout_s: float = Field(30.0, ge=0, description="on SIGTERM, wait this long for Kafka to confirm in-flight")
    stall_timeout_s: float = Field(
        30.0,
        gt=0,
        description="Kafka answers metadata but confirms nothing for this "
        "long: recreate the producer and send the backlog again",
    )
    max_devices: int = Field(
        100_000,
        ge=1,
        description="devices whose last seq the gateway remembers (for its "
        "duplicate and gap counts); past this the least recently seen is forgotten, so memory "
        "stays bounded however many device ids appear",
    )
    dead_letter_excerpt_bytes: int = Field(
        4096,
        ge=0,
        description="a payload over max_payload_bytes is dead-lettered "
        "as its first this many bytes, with its size and SHA-256 in headers",
    )
    processes: int = Field(
        1,
        ge=1,
        description="gateway processes on one shared subscription, each with its own "
        "persistent session (client id <client_id>-<n>) and Kafka producer",
    )


class StreamSettings(_ConcernSettings, section="stream"):
    """The PySpark Structured Streaming job (``iotwatch stream``)."""

    spark_master: str | None = Field("local[2]", description="empty when spark-submit sets the master")
    checkpoint_dir: Path | None = Field(
        None,
        description="offsets and per-device state; empty: ~/.iotwatch/checkpoints/<Kafka cluster id>/stream, "
        "so that each Kafka cluster (each embedded stack) has its own",
    )
    archive_dir: Path = Field(
        default_factory=lambda: Path.home() / ".iotwatch" / "archive",
        description="Parquet master dataset: clean readings by date and device type",
    )
    starting_offsets: str = Field("earliest", description="earliest, latest or Spark-style JSON per partition")
    max_offsets_per_trigger: int | None = Field(
        200_000,
        ge=1,
        description="records per micro-batch at most: "
        "larger batches spread its fixed cost when catching up on a backlog "
        "(with a large fleet, each device's state is read and written once "
        "a batch, however many of its readings the batch holds)",
    )
    query_restarts: int = Field(
        3,
        ge=0,
        description="times a failed query is started again from its checkpoint before the "
        "job gives up (a Python worker that did not start in time on a loaded machine, a "
        "broker that went away); every restart is logged with its cause",
    )
    trigger_interval_s: float = Field(
        0.0,
        ge=0,
        description="seconds between micro-batch starts; 0: the next "
        "starts as soon as the previous one ends (lowest latency)",
    )
    shuffle_partitions: int = Field(
        2,
        ge=1,
        description="tasks of the stateful operator per micro-batch: the "
        "cores the job has (each Kafka partition is one key; more tasks than cores only "
        "add per-task overhead); fixed when a checkpoint is created",
    )
    allowed_lateness_s: float = Field(
        120.0,
        ge=0,
        description="older than a device's newest event time minus this is late: counted, archived, not scored",
    )
    dedup_window: int = Field(4096, ge=64, description="seqs per device remembered for duplicate detection")
    state_shards: int = Field(
        16,
        ge=1,
        le=65536,
        description="the most device-state shards per Kafka partition: a partition "
        "has one per 1,024 devices up to this many, and each micro-batch reads and rewrites "
        "the shards it touches (more shards: fewer bytes rewritten per batch with many "
        "devices, one more state-store call each)",
    )
    shard_cache: bool = Field(
        True,
        description="serve device-state shards from a local copy kept by the "
        "executor when the state store says it is current (streaming/shard_cache.py): "
        "saves the state-store read, the cost that grows most with the fleet",
    )
    silence_timeout_s: float = Field(
        60.0,
        gt=0,
        description="no data for this long, while other devices' records kept arriving, raises device_silent",
    )
    ingestion_gap_s: float = Field(
        60.0,
        gt=0,
        description="no records of a raw topic for this long, while devices were reporting, raises ingestion_gap",
    )
    state_ttl_s: float = Field(7 * 24 * 3600.0, gt=0, description="state of devices silent this long is dropped")
    aggregate_interval_s: int = Field(60, ge=1, description="event-time bucket of the per-device aggregates")
    device_detector: str = Field(
        "declared_levels",
        description="per-(device, metric) detector from models "
        "with a compiled kernel (iotwatch.models.catalog.KERNELS; also score-csv's default); "
        "declared_levels scores as episode_likelihood on a metric without a declared range (metric_ranges)",
    )
    metric_ranges: dict[str, tuple[float, float]] = Field(
        default_factory=dict,
        description="normal range an operator declares per metric (JSON, 'device_type.metric' -> [low, high]): "
        "a detector that can use a declared range (declared_levels) also judges a reading by how rarely its "
        "level of that range has been visited; metrics not named have none (models/declared_levels.py)",
    )
    device_detector_params: dict[str, Any] = Field(
        default_factory=dict,
        description="detector parameters (JSON) overriding the detector's own defaults; empty by default, so "
        "the job runs exactly what score-csv and `iotwatch evaluate` measure (a test holds them "
        "equal) -- see models/episode_likelihood.py",
    )
    device_detectors: dict[str, str] = Field(
        default_factory=dict,
        description="detector per device type (JSON, type -> detector with a compiled kernel), for the "
        "types that need another than device_detector: e.g. a detector whose state is too large for "
        "the whole fleet on the few types that need it (streaming/detector_plan.py); other types run "
        "device_detector",
    )
    detector_params: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="parameters (JSON, detector -> parameters) of the detectors device_detectors names; "
        "device_detector's are device_detector_params",
    )
    detector_alert_scores: dict[str, tuple[float, float]] = Field(
        default_factory=lambda: {
            "declared_levels": (0.40, 0.35),
            "episode_likelihood": (0.40, 0.35),
            "cad_ose": (0.80, 0.73),
        },
        description="the anomaly rule's fire and clear scores (JSON, detector -> [fire, clear]) for the "
        "detectors device_detectors names: each detector's scores have their own scale (cad_ose: 0.80 is "
        "its optimum on nab-dev's tuning half); device_detector's are alert_fire_score and alert_clear_score",
    )
    alert_fire_score: float = Field(
        0.40,
        gt=0,
        le=1,
        description="score that fires an anomaly alert "
        "(episode_likelihood: 0.40 is a tail probability of about 1e-7; NAB's "
        "optimised threshold on nab-dev is 0.39)",
    )
    alert_clear_score: float = Field(0.35, ge=0, lt=1, description="score below which an open alert may clear")
    alert_hold_readings: int = Field(
        1,
        ge=1,
        description="consecutive readings above the fire score before raising "
        "(1: the default detector's likelihood layer already smooths)",
    )
    alert_clear_readings: int = Field(
        10, ge=1, description="consecutive readings below the clear score before clearing"
    )
    fleet_detector: str | None = Field(
        "isolation_forest", description="fleet model per device type from the registry (hot-swapped); empty disables"
    )
    fleet_fire_score: float = Field(0.7, gt=0, le=1, description="fleet model score that fires fleet_anomaly")
    crash_decel_g: float = Field(4.0, gt=0, description="longitudinal deceleration that counts as a crash")
    harsh_braking_g: float = Field(
        0.5,
        gt=0,
        description="longitudinal deceleration that raises a harsh_braking warning (telematics use 0.4-0.5 g)",
    )
    stuck_hvac_c: float = Field(4.0, gt=0, description="temperature this far from setpoint while heating/cooling")
    stuck_hvac_overshoot_c: float = Field(
        0.5,
        gt=0,
        description="or this far past the setpoint in the direction the HVAC pushes (heating above, cooling below; "
        "a thermostat switches its HVAC off a few tenths of a degree past the setpoint)",
    )
    stuck_hvac_s: float = Field(120.0, ge=0, description="... for this long (event time) raises stuck_hvac")
    stuck_hvac_settle_c_per_h: float = Field(
        1.0,
        gt=0,
        description="the slowest a working HVAC moves a room toward its setpoint: running far from "
        "the setpoint (after an operator's or the schedule's change) raises stuck_hvac only once the gap "
        "has lasted gap / this many hours (pushing past the setpoint needs only stuck_hvac_s)",
    )
    stuck_hvac_readings: int = Field(3, ge=1, description="... and for at least this many readings")
    runbook_url_template: str = Field(
        "https://github.com/iotwatch/iotwatch/blob/main/docs/runbooks.md#{rule}",
        description="runbook link every alert carries; {rule} is the rule name",
    )
    runbook_urls: dict[str, str] = Field(
        default_factory=dict, description="per-rule runbook links (JSON) that replace the template's"
    )

    def runbook_url(self, rule: str) -> str:
        """The runbook link of ``rule``'s alerts."""
        return self.runbook_urls.get(rule) or self.runbook_url_template.format(rule=rule)

    @field_validator("detector_alert_scores")
    @classmethod
    def _check_alert_scores(cls, value: dict[str, tuple[float, float]]) -> dict[str, tuple[float, float]]:
        for detector, (fire, clear) in value.items():
            if not 0 <= clear < fire <= 1:
                raise ValueError(f"{detector}: the clear score must be below the fire score, both in [0, 1]")
        return value

    def detector_names(self) -> list[str]:
        """The job's detectors: ``device_detector`` first, then the others it runs, by name
        (the order of their state banks in a checkpoint)."""
        others = set(self.device_detectors.values()) - {self.device_detector}
        return [self.device_detector, *sorted(others)]

    def detector_params_of(self, detector: str) -> dict[str, Any]:
        """The parameters the job runs ``detector`` with (over the detector's own defaults)."""
        if detector == self.device_detector:
            return dict(self.device_detector_params)
        return dict(self.detector_params.get(detector, {}))

    def alert_scores_of(self, detector: str) -> tuple[float, float]:
        """The anomaly rule's fire and clear scores on ``detector``'s scores."""
        if detector == self.device_detector:
            return self.alert_fire_score, self.alert_clear_score
        return self.detector_alert_scores.get(detector, (self.alert_fire_score, self.alert_clear_score))


class RegistrySettings(_ConcernSettings, section="registry"):
    """The model registry shared by training (writer) and scoring (readers)."""

    path: Path = Field(
        default_factory=lambda: Path.home() / ".iotwatch" / "registry", description="directory of the model registry"
    )


def user_name() -> str:
    """The login name: who acted, in on-call records, and whose tail group it is."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return "anonymous"


class AlertsSettings(_ConcernSettings, section="alerts"):
    """``iotwatch alerts tail`` and ``iotwatch alerts forward``."""

    tail_group_id: str | None = Field(
        None,
        description="consumer group of `alerts tail` when set (committed offsets: resumes where it stopped, "
        "members split the partitions); unset, each tail reads every partition in no group",
    )
    forward_group_id: str = Field(
        "iotwatch-alerts-forward",
        description="consumer group in which `alerts forward` commits how far its record receiver (`--webhook`) "
        "got; its lag is that receiver's backlog",
    )
    session_timeout_ms: int = Field(
        10_000,
        ge=1000,
        description="how soon the group notices a killed consumer (its partitions wait this long after kill -9)",
    )
    max_poll_interval_ms: int = Field(
        300_000,
        ge=1000,
        description="a group member of `alerts tail --group` silent this long leaves its group",
    )
    webhook_url: str | None = Field(None, description="where `alerts forward` posts every alert record")
    webhook_headers: dict[str, str] = Field(
        default_factory=dict, description="extra HTTP headers, e.g. Authorization (JSON)"
    )
    webhook_timeout_s: float = Field(10.0, gt=0, description="connect and read timeout of one post")
    retry_initial_s: float = Field(0.5, gt=0, description="first back-off delay after a failed post")
    retry_max_s: float = Field(60.0, gt=0, description="upper bound of the back-off delay")
    retry_after_max_s: float = Field(300.0, ge=0, description="Retry-After is honoured up to this long")
    state_dir: Path = Field(
        default_factory=lambda: Path.home() / ".iotwatch" / "alerts",
        description="where `alerts forward` dead-letters refused notifications (dead-notifications.jsonl)",
    )
    dead_letter_topic: str | None = Field(
        None,
        description="also produce refused notifications here (the file <state_dir>/dead-notifications.jsonl always)",
    )
    forget_after_s: float = Field(
        600.0,
        ge=0,
        description="`alerts forward` drops cleared alerts (once "
        "their resolution was sent), expired silences and quiet groups from memory this "
        "long after they ended; the records stay in Kafka",
    )
    routes_file: Path | None = Field(
        None,
        description="routing file (TOML) of `alerts forward`: receivers, "
        "policy tree, grouping; without it every alert goes to webhook_url",
    )


class RespondSettings(_ConcernSettings, section="respond"):
    """``iotwatch respond``: alerts in, corrective device commands out."""

    policy_file: Path | None = Field(None, description="TOML policy: which rule's alerts send which command")
    client_id: str = Field(
        "iotwatch-responder-1",
        description="MQTT client id; fixed so replies queued while the responder is down reach it (persistent session)",
    )
    issuer: str = Field("responder", description="who the audit trail names as the issuer")
    delivery: Literal["mqtt", "sites"] = Field(
        "mqtt",
        description="mqtt: commands are published to the one MQTT broker and replies read from it; "
        "sites: the audit record on the commands topic is the command, each site's relay delivers it "
        "to the site's broker and the replies come back on <site>.iot.commands.replies",
    )
    relay_client_id: str = Field(
        "iotwatch-relay-1",
        description="sites: the relay's MQTT client id at its site; fixed so replies queued while it is down reach it",
    )
    command_ttl_s: float = Field(120.0, gt=0, description="a command not executed by then is void")
    reply_timeout_s: float = Field(
        60.0,
        gt=0,
        description="no final reply by then (and a command never answered "
        "not before it expired): the attempt timed out",
    )
    max_attempts: int = Field(2, ge=1, description="attempts per alert before escalating to on-call")
    forget_after_s: float = Field(
        600.0,
        ge=0,
        description="cleared alerts and their finished commands are dropped "
        "from the responder's memory this long after they ended (they stay in Kafka)",
    )


class DeploymentSettings(_ConcernSettings, section="deployment"):
    """How strict start-up is about configuration: docker-compose sets
    ``IOTWATCH_DEPLOYMENT_REQUIRE_SECRETS=true`` so a service refuses to run with a secret
    still at its .env.example placeholder, or with a user name but no password."""

    require_secrets: bool = Field(False, description="refuse placeholder (CHANGE_ME) or missing secrets at start")
    placeholder_markers: list[str] = Field(
        default_factory=lambda: ["change_me", "change-me", "changeme"],
        description="a secret containing one of these (any case) is a placeholder",
    )


class Settings(BaseModel):
    """Everything a component may need, one frozen object per concern."""

    model_config = ConfigDict(frozen=True)

    mqtt: MqttSettings
    kafka: KafkaSettings
    topics: TopicSettings
    influx: InfluxSettings
    stack: StackSettings
    gateway: GatewaySettings
    stream: StreamSettings
    registry: RegistrySettings
    alerts: AlertsSettings
    respond: RespondSettings
    deployment: DeploymentSettings = Field(default_factory=DeploymentSettings)

    def unusable_secrets(self) -> list[str]:
        """Environment names of secrets that are placeholders, or missing beside a user name."""
        markers = [marker.lower() for marker in self.deployment.placeholder_markers]
        problems = []
        for concern in (getattr(self, name) for name in type(self).model_fields):
            for name in type(concern).model_fields:
                value = getattr(concern, name)
                if isinstance(value, SecretStr) and any(m in value.get_secret_value().lower() for m in markers):
                    problems.append(f"{concern.env_name(name)} is a placeholder")
            for user, secret in _CREDENTIAL_PAIRS:
                if getattr(concern, user, None) and not getattr(concern, secret, None):
                    problems.append(f"{concern.env_name(secret)} is not set (but {concern.env_name(user)} is)")
        return problems

    def with_endpoints(
        self, *, mqtt: str | None = None, kafka: str | None = None, influx: str | None = None
    ) -> Settings:
        """A copy with the command-line endpoint overrides applied."""
        update: dict[str, Any] = {}
        if mqtt:
            url = check_url(normalise_mqtt_url(mqtt), ("mqtt", "mqtts", "ssl", "tcp", "ws", "wss"))
            update["mqtt"] = self.mqtt.model_copy(update={"url": url})
        if kafka:
            update["kafka"] = self.kafka.model_copy(update={"bootstrap_servers": check_bootstrap_servers(kafka)})
        if influx is not None:
            update["influx"] = self.influx.model_copy(update={"url": check_url(influx, ("http", "https")) or None})
        return self.model_copy(update=update)


#: (user name field, secret field) pairs: with IOTWATCH_DEPLOYMENT_REQUIRE_SECRETS, a user
#: name without its secret is refused too (the service would fail later, less clearly).
_CREDENTIAL_PAIRS = (("username", "password"), ("sasl_username", "sasl_password"))


def load_settings(config_file: str | Path | None = None) -> Settings:
    """Read the environment (and the TOML file, if any) now.

    ``config_file`` (``--config``) takes the place of ``IOTWATCH_CONFIG``. A setting that
    does not validate raises :class:`UserError` naming it. With
    ``deployment.require_secrets`` a placeholder or missing secret raises :class:`UserError`
    naming the variables, so a service exits before it connects.
    """
    token = _CONFIG_FILE.set(None if config_file is None else str(config_file))
    try:  # every concern reads its variables and its table now
        settings = Settings.model_validate({c.section: c() for c in _ConcernSettings.__subclasses__()})
    except ValidationError as exc:
        raise UserError(_validation_message(exc)) from exc
    finally:
        _CONFIG_FILE.reset(token)
    if settings.deployment.require_secrets and (problems := settings.unusable_secrets()):
        raise UserError(f"refusing to start with unusable secrets: {'; '.join(problems)} (set real values in .env)")
    return settings


def _validation_message(exc: ValidationError) -> str:
    """Pydantic's report in one line per problem: the environment variable and what is wrong."""
    title = exc.title
    concern = next((c for c in _ConcernSettings.__subclasses__() if c.__name__ == title), None)
    problems = []
    for error in exc.errors():
        field = ".".join(str(part) for part in error["loc"])
        where = concern.env_name(str(error["loc"][0])) if concern is not None and error["loc"] else field
        problems.append(f"{where}: {error['msg']} (got {error.get('input')!r})")
    return "invalid settings: " + "; ".join(problems)


def normalise_mqtt_url(value: str) -> str:
    """Accept ``HOST:PORT`` as well as ``mqtt://HOST:PORT``."""
    return value if "://" in value else f"mqtt://{value}"


def _check_port(port: str, where: str) -> None:
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UserError(f"{where}: port {port or '(none)'} is not a TCP port (1-65535)")


def check_bootstrap_servers(value: str) -> str:
    """``HOST:PORT[,HOST:PORT...]`` with every port in 1-65535 (librdkafka would otherwise
    take an out-of-range port modulo 65536 and quietly connect somewhere else)."""
    servers = [part.strip() for part in value.split(",")]
    for server in servers:
        host, sep, port = server.rpartition(":")
        if not sep or not host.strip("[]"):
            raise UserError(f"Kafka bootstrap server {server!r} is not HOST:PORT")
        _check_port(port, f"Kafka bootstrap server {server!r}")
    return ",".join(servers)


def check_url(value: str, schemes: tuple[str, ...]) -> str:
    """A URL with one of ``schemes``, a host and, if given, a port in 1-65535."""
    if not value:
        return value
    parts = urlsplit(value)
    if parts.scheme not in schemes:
        raise UserError(f"{value!r}: the scheme must be one of {', '.join(s + '://' for s in schemes)}")
    if not parts.hostname:
        raise UserError(f"{value!r} names no host")
    _, sep, port = parts.netloc.rpartition("@")[2].rpartition(":")
    if sep and not port.endswith("]"):
        _check_port(port, repr(value))
    return value


def _url_host(url: str) -> str:
    return urlsplit(url).hostname or "127.0.0.1"


def _url_port(url: str, default: int) -> int:
    return urlsplit(url).port or default
