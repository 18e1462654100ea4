"""One way to get a Spark session, for the streaming job and the batch jobs alike (docs/internals.md,
"Spark sessions")."""

from __future__ import annotations

import atexit
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import psutil

from iotwatch.jvm import class_data
from iotwatch.logs import librdkafka_logger, repeat_summary, spark_log_level

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)

QUIET_AFTER_STOP_S = 3.0
LOG4J_CONFIG = Path(__file__).with_name("log4j2.properties")
_LOG4J_LINE = re.compile(r"^(TRACE|DEBUG|INFO|WARN|ERROR|FATAL) ([\w.$-]+): (.*)$")
#: (logger, message start) of log4j warnings about this machine or the query plan that a user
#: cannot act on: logged at DEBUG.
_NOT_NEWS = (
    ("Utils", "Your hostname"),
    ("Utils", "Set SPARK_LOCAL_IP"),
    ("NativeCodeLoader", "Unable to load"),
    ("ResolveWriteToStream", "spark.sql.adaptive.enabled is not supported"),
    ("MicroBatchExecution", "Disabling AQE"),
    ("SparkStringUtils", "Truncated the string"),
    ("TransformWithStateInPySparkStateServer", "Map state"),
    ("TransformWithStateInPySparkStateServer", "Value state"),  # a get() of a state not written yet
    ("TransformWithStateInPySparkStateServer", "No more data to read"),
    ("MemoryManager", "Total allocation exceeds"),
)
_LEVELS = {**logging.getLevelNamesMapping(), "TRACE": logging.DEBUG}  # log4j's names: Python's, and TRACE
#: librdkafka's own stderr format, from Kafka clients in the Python workers:
#: ``%3|1795479906.881|FAIL|rdkafka#consumer-1| [thrd:...]: ...`` (syslog level, time, facility, client).
_LIBRDKAFKA_LINE = re.compile(r"^%(\d)\|[\d.]+\|(\w+)\|([^|]+)\| (.*)$")
_SYSLOG_LEVELS = (logging.CRITICAL,) * 3 + (logging.ERROR, logging.WARNING, logging.INFO, logging.INFO, logging.DEBUG)
#: Lines that are detail, not news: stack frames, Python tracebacks, pyspark workers' progress prints.
_DETAIL = re.compile(
    r"^(\s|Caused by|Traceback|\.\.\. \d+ more|(Starting )?Streaming TransformWithState|"
    r"WARNING: Using incubator modules|[\w.]+(Exception|Error)\b|$)"
)


#: Kafka's Java clients (Spark's Kafka source) on a broker they cannot reach: a line per
#: client and reconnect attempt, every second or so, for as long as the broker is down.
_KAFKA_UNREACHABLE = re.compile(
    r"(?:Connection to node \S+ \((?P<node>[^)]*)\) could not be established"
    r"|Bootstrap broker (?P<bootstrap>\S+) \(id: \S+ rack: \S+\) disconnected"
    r"|(?P<offsets>Error in attempt \d+ getting Kafka offsets))"
)
#: The outage key of the Kafka source's offset failures, which name no broker.
OFFSETS = "Spark's Kafka source"


class KafkaRepeats:
    """Fold the Kafka clients' repeated "could not be established" lines of Spark's JVM into
    one WARNING per broker and outage (the rest at DEBUG), in the outage bookkeeping of
    librdkafka's lines (:class:`iotwatch.logs.RepeatSummary`): a broker the driver's own
    clients also lost is one line, and their statistics say when it answers again. The Kafka
    source's failure to get offsets is the same outage: said only while no broker is."""

    def fold(self, text: str) -> str | None:
        """The one line to log at WARNING for ``text`` (None: not such a line; "": a repeat)."""
        match = _KAFKA_UNREACHABLE.search(text)
        if match is None:
            return None
        summary = repeat_summary()
        if match["offsets"]:
            if summary.down() or not summary.failed(OFFSETS):
                return ""
            return "Spark's Kafka source cannot get the topics' offsets (retrying; repeats are logged at DEBUG)"
        broker = (match["node"] or match["bootstrap"]).rsplit("/", 1)[-1]
        if not summary.failed(broker):
            return ""
        return f"Kafka broker {broker} unreachable from Spark's Kafka clients (retrying; repeats are logged at DEBUG)"


class JvmOutput:
    """Reads the JVM's merged stdout/stderr and logs each line: log4j lines under
    ``spark.<logger>`` at their level, detail (stack traces, worker prints) at DEBUG, and
    everything at DEBUG while :func:`quiet_stop` runs (stopping a query interrupts its
    threads, which Spark reports with traces that mean nothing to a user)."""

    stopping = threading.Event()
    #: the JVM's reports reach the reader a little after the stop returned: quiet until then too
    quiet_until = 0.0

    def __init__(self, stream: IO[bytes]) -> None:
        self.stream = stream
        self._continues: tuple[str, int] | None = None  # (logger, level) of the log4j line being continued
        self.kafka_repeats = KafkaRepeats()
        self.thread = threading.Thread(target=self._run, name="spark-jvm-output", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        for raw in iter(self.stream.readline, b""):
            self.emit(raw.decode(errors="replace").rstrip())

    def emit(self, line: str) -> None:
        kafka = _LIBRDKAFKA_LINE.match(line)
        if kafka is not None:  # through the librdkafka logger: repeats summarised like the driver's
            level = _SYSLOG_LEVELS[int(kafka[1])]
            librdkafka_logger().log(
                logging.DEBUG if self.stopping.is_set() else level, "%s [%s] %s", kafka[2], kafka[3], kafka[4]
            )
            return
        match = _LOG4J_LINE.match(line)
        if match is not None:
            short, text = match[2].rsplit(".", 1)[-1], match[3]
            level, name = _LEVELS[match[1]], "spark." + short
            if any(short == logger and text.startswith(start) for logger, start in _NOT_NEWS):
                level = logging.DEBUG
            elif level == logging.WARNING and (folded := self.kafka_repeats.fold(text)) is not None:
                if folded:
                    text = folded
                else:
                    level = logging.DEBUG
            self._continues = (name, min(level, logging.INFO))
        elif _DETAIL.match(line):
            level, name, text = logging.DEBUG, "spark.jvm", line
        elif line.startswith("Exception in thread"):
            level, name, text = logging.ERROR, "spark.jvm", line
            self._continues = None
        elif self._continues is not None:  # the next line of a multi-line log4j message
            (name, level), text = self._continues, line
        else:
            level, name, text = logging.INFO, "spark.jvm", line
        if self.stopping.is_set() or time.monotonic() < self.quiet_until:
            level = min(level, logging.DEBUG)
        logging.getLogger(name).log(level, "%s", text)


@contextmanager
def quiet_stop() -> Iterator[None]:
    """While stopping a query or Spark: the JVM's and py4j's reports of interrupted work
    are logged at DEBUG (unless debugging, py4j's callback errors are dropped)."""
    py4j = logging.getLogger("py4j")
    previous = py4j.level
    JvmOutput.stopping.set()
    if not logging.getLogger().isEnabledFor(logging.DEBUG):
        py4j.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        py4j.setLevel(previous)
        JvmOutput.quiet_until = time.monotonic() + QUIET_AFTER_STOP_S
        JvmOutput.stopping.clear()


def _launch_jvm(conf: Mapping[str, str], writes_class_data: bool = False) -> None:
    """Start Spark's JVM through ``spark-submit``, as pyspark's ``launch_gateway`` does, but
    with an environment of its own (:func:`local_jvm_env`) instead of this process's, which
    stays untouched; its output is piped to :class:`JvmOutput`."""
    from py4j.clientserver import ClientServer, JavaParameters, PythonParameters
    from py4j.java_gateway import java_import
    from pyspark import SparkContext
    from pyspark.serializers import UTF8Deserializer, read_int

    if SparkContext._gateway is not None:
        return
    env = local_jvm_env()
    spark_home = jvm_spark_home(env["PYSPARK_PYTHON"])
    command = [os.path.join(spark_home, "bin", "spark-submit")]
    for key, value in with_class_data(conf, spark_home, writes_class_data).items():
        command += ["--conf", f"{key}={value}"]
    command += shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))  # as pyspark reads it
    with tempfile.TemporaryDirectory(prefix="iotwatch-jvm-") as conn_dir:
        conn_info = os.path.join(conn_dir, "gateway")
        env.update({"SPARK_HOME": spark_home, "SPARK_CONNECT_MODE": "0", "_PYSPARK_DRIVER_CONN_INFO_PATH": conn_info})
        # A session of its own: Ctrl-C and a SIGTERM to the command's process group reach the
        # command, which stops the query cleanly, not the JVM and its Python workers mid-batch.
        # The JVM still ends with the command: it exits when its stdin, a pipe from here, closes.
        proc = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )

        def abandoned() -> None:  # this process ends before its JVM is up (a refused start): the JVM too
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)

        atexit.register(abandoned)
        while proc.poll() is None and not os.path.isfile(conn_info):
            time.sleep(0.1)
        atexit.unregister(abandoned)
        if not os.path.isfile(conn_info):
            output = proc.stdout.read().decode(errors="replace") if proc.stdout else ""
            raise RuntimeError(f"Spark's JVM exited with code {proc.returncode} before it was up:\n{output}")
        with open(conn_info, "rb") as info:
            port, secret = read_int(info), UTF8Deserializer().loads(info)
    gateway = ClientServer(
        java_parameters=JavaParameters(port=port, auth_token=secret, auto_convert=True),
        python_parameters=PythonParameters(port=0, eager_load=False),
    )
    gateway.proc = proc
    for name in _PYSPARK_JVM_IMPORTS:
        java_import(gateway.jvm, name)
    assert proc.stdout is not None  # a pipe: stdout=PIPE
    JvmOutput(proc.stdout)
    SparkContext._gateway, SparkContext._jvm = gateway, gateway.jvm


#: The JVM names pyspark refers to unqualified (``sc._jvm.PythonUtils``): what its own
#: ``launch_gateway`` imports into every gateway it starts.
_PYSPARK_JVM_IMPORTS = (
    "org.apache.spark.SparkConf",
    "org.apache.spark.api.java.*",
    "org.apache.spark.api.python.*",
    "org.apache.spark.ml.python.*",
    "org.apache.spark.mllib.api.python.*",
    "org.apache.spark.resource.*",
    "org.apache.spark.sql.Encoders",
    "org.apache.spark.sql.OnSuccessCall",
    "org.apache.spark.sql.functions",
    "org.apache.spark.sql.classic.*",
    "org.apache.spark.sql.api.python.*",
    "org.apache.spark.sql.hive.*",
    "scala.Tuple2",
)


def local_jvm_env() -> dict[str, str]:
    """The local JVM's environment: this process's, with malloc arenas capped
    (:data:`LOCAL_MALLOC_ARENAS`), Arrow's access checks off (:data:`ARROW_UNCHECKED_ENV`) and
    Python workers on this interpreter, each unless the environment sets it. The Python
    workers inherit it from the JVM."""
    own = {"MALLOC_ARENA_MAX": LOCAL_MALLOC_ARENAS, "PYSPARK_PYTHON": sys.executable, **ARROW_UNCHECKED_ENV}
    return {**own, **os.environ}


def jvm_spark_home(python: str) -> str:
    """The Spark home the local JVM runs from: when its Python workers run this interpreter
    and Spark is pip's pyspark, a home without the zipped Python sources
    (:mod:`iotwatch.jvm.spark_home`), else the one pyspark finds."""
    import pyspark
    from pyspark.find_spark_home import _find_spark_home

    from iotwatch.jvm.jars import jars_root
    from iotwatch.jvm.spark_home import local_spark_home

    found = Path(_find_spark_home())
    if python != sys.executable or found.resolve() != Path(pyspark.__file__).parent.resolve():
        return str(found)
    try:
        return str(local_spark_home(found, jars_root(), pyspark.__version__))
    except OSError as exc:
        log.debug("running Spark from %s: no linked home (%s)", found, exc)
        return str(found)


def with_class_data(conf: Mapping[str, str], spark_home: str, writes: bool = False) -> dict[str, str]:
    """``conf`` with the driver JVM's class-data sharing options (:mod:`iotwatch.jvm.class_data`),
    keyed by what the archive must match: the Spark release and home, the classpath, the JVM
    options; ``writes``: dump an archive at exit when there is none yet."""
    import pyspark

    from iotwatch.jvm.jars import java_executable

    options = conf.get("spark.driver.extraJavaOptions", "")
    classpath = (conf.get("spark.driver.extraClassPath", ""), conf.get("spark.jars", ""))
    parts = [pyspark.__version__, spark_home, *classpath, options]
    extra = class_data.jvm_options(java_executable(), parts, writes=writes)
    return {**conf, "spark.driver.extraJavaOptions": f"{options} {extra}".strip()} if extra else dict(conf)


#: JIT of the local-mode JVM: the quick C1 compiler only. Spark generates and compiles new
#: classes for every query it plans, and the optimising C2 compiler then spends minutes of
#: CPU on them; with few cores that CPU is taken from the micro-batches. With C1 alone the
#: JVM reserves only 48 MB for compiled code, which the job fills within a few minutes (its
#: micro-batches keep generating code); the JVM then flushes compiled methods, hot ones
#: included, and recompiles them, and the micro-batches stall for a second or two. So the
#: reserve is the tiered JVM's default, 240 MB (committed only as used). Cluster deployments
#: set their executors' options in spark-submit.
LOCAL_JIT_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"

#: Heap of the local-mode driver JVM, committed and touched at start (``-Xms`` = ``-Xmx``,
#: ``AlwaysPreTouch``): its resident memory is then fixed from the first second, instead of
#: climbing for many minutes as the collector grows the heap toward its maximum, so growth
#: that a long run does show is a leak outside the heap.
LOCAL_DRIVER_MEMORY = "1g"
LOCAL_HEAP_OPTIONS = f"-Xms{LOCAL_DRIVER_MEMORY} -XX:+AlwaysPreTouch"

#: glibc malloc arenas of the local JVM and its Python workers (``MALLOC_ARENA_MAX``, unless
#: the environment sets it). glibc gives a thread that meets a locked arena an arena of its
#: own, up to eight per core, and keeps the memory freed in each; the job's native memory
#: (RocksDB, compression codecs, Netty) is allocated from Spark's many short-lived pool
#: threads. With the default the job's anonymous memory still creeps up about a megabyte a
#: minute a quarter of an hour after start; with two it is flat after four minutes and
#: 60 MB lower. Hadoop's launch scripts cap arenas the same way (at four).
LOCAL_MALLOC_ARENAS = "2"

#: Arrow's checks on every buffer access in the JVM, off (Arrow reads these variables when its
#: classes load). Every record of the job crosses Arrow in the JVM twice (Kafka rows to the
#: packing step, packed rows to the stateful operator): with the checks, bounds tests, reference
#: counts and null tests on each value were a fifth of the executors' CPU in those stages. The
#: JVM writes these vectors itself, sized by its own ``setSafe`` calls, and reads only vectors
#: written by the job's own Python workers; device data is only ever bytes inside a value, never
#: an offset or a length Arrow follows.
ARROW_UNCHECKED_ENV = {"ARROW_ENABLE_UNSAFE_MEMORY_ACCESS": "true", "ARROW_ENABLE_NULL_CHECK_FOR_GET": "false"}


def jvm_tmpdir() -> Path:
    """The ``java.io.tmpdir`` of this process's local JVM. A JVM killed with -9 leaves behind
    what it unpacked there (RocksDB's and LZ4's native libraries, 15 MB) and Spark's scratch
    folders, so each process's JVM has a folder of its own, and the folders of processes that
    no longer run are removed."""
    root = Path(tempfile.gettempdir())
    for folder in root.glob("iotwatch-java-*"):
        pid = folder.name.removeprefix("iotwatch-java-")
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    (own := root / f"iotwatch-java-{os.getpid()}").mkdir(exist_ok=True)
    return own


def local_jvm_conf() -> dict[str, str]:
    """Spark settings for the driver JVM (local mode): iotwatch's log4j layout and level, no
    console progress bar, :data:`LOCAL_JIT_OPTIONS`, :data:`LOCAL_HEAP_OPTIONS` and :func:`jvm_tmpdir`."""
    options = (
        f"-Dlog4j2.configurationFile={LOG4J_CONFIG.as_uri()} -Diotwatch.spark.level={spark_log_level()} "
        f"{LOCAL_JIT_OPTIONS} {LOCAL_HEAP_OPTIONS} -Djava.io.tmpdir={jvm_tmpdir()}"
    )
    return {
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": LOCAL_DRIVER_MEMORY,
        "spark.driver.extraJavaOptions": options,
    }


def kafka_connector_conf() -> dict[str, str]:
    """``spark.jars`` with Spark's Kafka connector when ``iotwatch setup`` installed it (a
    cluster gets it from spark-submit's ``--packages`` or ``--jars`` instead), and the
    pinned release's fixes first on the classpath (:mod:`iotwatch.jvm.spark_patches`)."""
    from iotwatch.jvm.jars import spark_kafka_connector
    from iotwatch.jvm.spark_patches import patches_conf

    connector = spark_kafka_connector()
    conf = patches_conf()
    if connector.installed():
        conf["spark.jars"] = ",".join(str(jar) for jar in connector.jars())
    return conf


def require_java() -> None:
    """Spark needs a JVM: say what to install instead of a py4j stack trace."""
    from iotwatch.jvm.jars import java_executable

    java_executable()


def under_spark_submit() -> bool:
    """True inside ``spark-submit`` (the JVM is already up and sets the master)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(
    app_name: str,
    master: str | None = "local[2]",
    *,
    shuffle_partitions: int = 4,
    conf: Mapping[str, str] | None = None,
    writes_class_data: bool = False,
) -> SparkSession:
    """A session with UTC time, Arrow transfers and the given extra ``conf``; Python workers
    use this interpreter (its venv has the project's packages) unless told otherwise. A local
    session maps its classpath's class-data archive; with ``writes_class_data`` (the streaming
    job's) it writes one at exit when there is none, so the archive holds what the job loads."""
    from pyspark.sql import SparkSession

    require_java()
    settings = {
        "spark.app.name": app_name,
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
    }
    local = bool(master) and not under_spark_submit()
    if local:
        settings.update({"spark.master": str(master), "spark.ui.enabled": "false", **local_jvm_conf()})
        settings.update(kafka_connector_conf())
    settings.update(conf or {})
    if local:
        _launch_jvm(settings, writes_class_data)
    builder = SparkSession.builder
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if local:  # pyspark names the workers' interpreter from os.environ, not from the JVM's
        spark.sparkContext.pythonExec = local_jvm_env()["PYSPARK_PYTHON"]
    _quiet_accumulator_server(spark)
    return spark


def _quiet_accumulator_server(spark: SparkSession) -> None:
    """PySpark's accumulator server is a ``socketserver`` that prints a traceback to stderr
    when the JVM closes a connection mid-update -- as it does when a stop interrupts a job
    (a SIGTERM during the first micro-batch, with the workers' warm-up job still running).
    It means nothing to a user: log it at DEBUG like the JVM's reports of interrupted work."""
    server = getattr(spark.sparkContext, "_accumulatorServer", None)
    if server is None:
        return

    def handle_error(request: object, client_address: object) -> None:
        log.debug("accumulator update from %s ended early (Spark stopping)", client_address, exc_info=True)

    server.handle_error = handle_error


@contextmanager
def session_scope(app_name: str, master: str | None = "local[2]", **kwargs: Any) -> Iterator[SparkSession]:
    """A session for one command: stopped at the end only if this call started it (a test
    suite or a notebook that already has one keeps it)."""
    from pyspark import SparkContext

    # the context, not the active session: that one is per thread, and the job starts Spark in its own
    existed = SparkContext._active_spark_context is not None
    spark = spark_session(app_name, master, **kwargs)
    try:
        yield spark
    finally:
        if not existed:
            try:
                with quiet_stop():
                    spark.stop()
            except Exception as exc:
                log.warning("stopping Spark: %s", str(exc).splitlines()[0])
            end_jvm()


#: Longest wait for the local JVM to exit after its session stopped; then it is killed.
JVM_EXIT_WAIT_S = class_data.EXIT_WAIT_S


def end_jvm(wait_s: float = JVM_EXIT_WAIT_S) -> None:
    """End the local Spark JVM this process started (:func:`_launch_jvm`) and wait for it, so
    that it does not outlive the command: a command started again at once would otherwise
    run beside it, both JVMs with their heaps. Closing its stdin ends it; it may first write
    its class-data archive (:mod:`iotwatch.jvm.class_data`)."""
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    proc: subprocess.Popen[bytes] | None = getattr(gateway, "proc", None)
    if gateway is None or proc is None:
        return
    try:
        gateway.shutdown()
    except Exception as exc:  # the JVM may be gone already
        log.debug("closing the py4j gateway: %s", exc)
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    try:
        proc.wait(2.0)
    except subprocess.TimeoutExpired:
        log.info("waiting for Spark's JVM to exit (it writes its class-data archive once per classpath)")
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            log.warning("Spark's JVM did not exit within %.0f s: killing it", wait_s)
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    SparkContext._gateway = SparkContext._jvm = None
