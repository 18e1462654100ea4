"""Fixes to the pinned Spark release: upstream ones until a release that has them can be
installed, and the job's own (docs/internals.md, "Spark patches")."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from iotwatch.errors import StackError
from iotwatch.jvm.jars import COMPLETE_MARK, SCALA_BINARY_VERSION, jars_root, java_executable, pyspark_jars_dir

JAR_NAME = "iotwatch-spark-patches.jar"


@dataclass(frozen=True)
class SourcePatch:
    """One upstream fix: the Spark class's source file and the exact edits that make it."""

    issue: str
    path: str  # in spark-sql's sources jar
    edits: tuple[tuple[str, str], ...]  # (text as released, text with the fix), each found once


#: Spark's shaded protobuf: the released classes refer to it, not to com.google.protobuf.
_SHADED_PROTOBUF = ("import com.google.protobuf.ByteString", "import org.sparkproject.spark_core.protobuf.ByteString")

_STATE_SERVER = "org/apache/spark/sql/execution/python/streaming/TransformWithStateInPySparkStateServer.scala"

CLOSE_STATE_SERVER_SOCKET = SourcePatch(
    issue="SPARK-58932",
    path=_STATE_SERVER,
    edits=(
        _SHADED_PROTOBUF,
        (
            "  def run(): Unit = {\n    val listeningSocket = stateServerSocket.accept()\n",
            "  def run(): Unit = {\n"
            "    val listeningSocket = stateServerSocket.accept()\n"
            "    // SPARK-58932: close the accepted socket however the request loop ends.\n"
            "    try serve(listeningSocket) finally listeningSocket.close()\n"
            "  }\n\n"
            "  private def serve(listeningSocket: java.nio.channels.SocketChannel): Unit = {\n",
        ),
    ),
)

#: The driver builds the Python stateful operator's node several times while it plans every
#: micro-batch, and each node built its state-variable handle at once: the grouping key's
#: encoder and the timer column family's (analysis and generated code), about a quarter of
#: the CPU of the driver's planning thread. Only the first micro-batch uses the handle
#: (learning the state schemas); later nodes now never build it, nor ship it in their tasks.
LAZY_DRIVER_HANDLE = SourcePatch(
    issue="lazy-driver-handle",
    path="org/apache/spark/sql/execution/python/streaming/TransformWithStateInPySparkExec.scala",
    edits=(
        (
            "  private val driverProcessorHandle: DriverStatefulProcessorHandleImpl =",
            "  private lazy val driverProcessorHandle: DriverStatefulProcessorHandleImpl =",
        ),
    ),
)

#: Every stateful task starts a state server, which builds the Python operator's state
#: variables afresh: each one's encoders, serializers and projections, and the timers' --
#: generated code (the code's text is built, then found compiled in Spark's cache) for the
#: handful of rows a task reads and writes. That was most of the CPU samples of the state
#: server's thread at 2,000-record micro-batches (docs/internals.md, "Spark patches"). The
#: server now handles its requests with Spark's interpreted projections (the same results;
#: Spark falls back to them whenever code generation fails), which cost little to build.
INTERPRETED_STATE_SERVER = SourcePatch(
    issue="interpreted-state-server",
    path=_STATE_SERVER,
    edits=(
        (
            "import org.apache.spark.sql.types.StructType\n",
            "import org.apache.spark.sql.internal.SQLConf\nimport org.apache.spark.sql.types.StructType\n",
        ),
        (
            "  private val isUnixDomainSock = Option(SparkEnv.get)\n",
            "  // iotwatch: this thread's requests build interpreted projections, not generated code.\n"
            "  private lazy val interpretedConf: SQLConf = {\n"
            "    val conf = SQLConf.get.clone()\n"
            '    conf.setConfString(SQLConf.CODEGEN_FACTORY_MODE.key, "NO_CODEGEN")\n'
            "    conf\n"
            "  }\n\n"
            "  private val isUnixDomainSock = Option(SparkEnv.get)\n",
        ),
        (
            "          handleRequest(message)\n",
            "          SQLConf.withExistingConf(interpretedConf)(handleRequest(message))\n",
        ),
    ),
)

#: Each state variable's encoders are resolved (an analysis) afresh by every stateful task,
#: twice over (the state server's and the variable's own), the timers' too, and the grouping
#: key's by every build of the operator's node on the driver, whose tasks then carry it
#: serialized. A resolved encoder is immutable (each user makes its own serializers from it):
#: they are resolved once per encoder in the JVM instead.
RESOLVED_ENCODERS = SourcePatch(
    issue="resolved-encoders",
    path="org/apache/spark/sql/execution/streaming/operators/stateful/transformwithstate/StateTypesEncoderUtils.scala",
    edits=(
        (
            "/**\n * Helper class providing APIs to encode the grouping key,",
            "/** iotwatch: encoders resolved once in this JVM (an application's state types are few). */\n"
            "object ResolvedEncoders {\n"
            "  private val byEncoder =\n"
            "    new java.util.concurrent.ConcurrentHashMap[ExpressionEncoder[_], ExpressionEncoder[_]]()\n"
            "  private val bySchema =\n"
            "    new java.util.concurrent.ConcurrentHashMap[StructType, ExpressionEncoder[Row]]()\n\n"
            "  def apply[T](encoder: ExpressionEncoder[T]): ExpressionEncoder[T] =\n"
            "    byEncoder.computeIfAbsent(encoder, _.resolveAndBind()).asInstanceOf[ExpressionEncoder[T]]\n\n"
            "  def row(schema: StructType): ExpressionEncoder[Row] =\n"
            "    bySchema.computeIfAbsent(schema, s => apply(ExpressionEncoder(s)))\n"
            "}\n\n"
            "/**\n * Helper class providing APIs to encode the grouping key,",
        ),
        ("import org.apache.spark.sql.Encoder\n", "import org.apache.spark.sql.{Encoder, Row}\n"),
        (
            "  private val rowToObjDeserializer = valExpressionEnc.resolveAndBind().createDeserializer()",
            "  private val rowToObjDeserializer = ResolvedEncoders(valExpressionEnc).createDeserializer()",
        ),
        (
            "    userKeyExpressionEnc.resolveAndBind().createDeserializer()",
            "    ResolvedEncoders(userKeyExpressionEnc).createDeserializer()",
        ),
        (
            "  private val keyDeserializer = keyExprEnc.resolveAndBind().createDeserializer()",
            "  private val keyDeserializer = ResolvedEncoders(keyExprEnc).createDeserializer()",
        ),
    ),
)

_TWS = "org.apache.spark.sql.execution.streaming.operators.stateful.transformwithstate"

RESOLVED_STATE_SERVER_ENCODERS = SourcePatch(
    issue="resolved-encoders",
    path=_STATE_SERVER,
    edits=(
        (f"import {_TWS}.StateVariableType\n", f"import {_TWS}.{{ResolvedEncoders, StateVariableType}}\n"),
        (
            "    ExpressionEncoder(groupingKeySchema).resolveAndBind().createDeserializer()",
            "    ResolvedEncoders.row(groupingKeySchema).createDeserializer()",
        ),
        (
            "    val expressionEncoder = ExpressionEncoder(schema).resolveAndBind()",
            "    val expressionEncoder = ResolvedEncoders.row(schema)",
        ),
        (
            "        val valueExpressionEncoder = ExpressionEncoder(valueSchema).resolveAndBind()",
            "        val valueExpressionEncoder = ResolvedEncoders.row(valueSchema)",
        ),
    ),
)

RESOLVED_GROUPING_KEY_ENCODER = SourcePatch(
    issue="resolved-encoders",
    path=LAZY_DRIVER_HANDLE.path,
    edits=(
        (
            f"import {_TWS}.{{TransformWithStateExecBase, TransformWithStateVariableInfo}}\n",
            f"import {_TWS}.{{ResolvedEncoders, TransformWithStateExecBase, TransformWithStateVariableInfo}}\n",
        ),
        (
            "  private val groupingKeyExprEncoder = ExpressionEncoder(groupingKeySchema)\n"
            "    .resolveAndBind().asInstanceOf[ExpressionEncoder[Any]]",
            "  @transient private lazy val groupingKeyExprEncoder =\n"
            "    ResolvedEncoders.row(groupingKeySchema).asInstanceOf[ExpressionEncoder[Any]]",
        ),
    ),
)

#: Each row a task writes into an Arrow batch for a Python worker summed the batch's size in
#: bytes anew, over every column's buffers (for the packing step, a struct of the Kafka record's
#: seven): 15 % of the JVM samples of the reading and packing stage. It is summed every 64th
#: row instead, so a batch may pass ``spark.sql.execution.arrow.maxBytesPerBatch`` by 63 rows.
SIZE_EVERY_64_ROWS = SourcePatch(
    issue="arrow-batch-size-every-64-rows",
    path="org/apache/spark/sql/execution/python/PythonArrowInput.scala",
    edits=(
        (
            "      (maxBytesPerBatch == Int.MaxValue) || (arrowWriter.sizeInBytes() < maxBytesPerBatch)\n",
            "      (maxBytesPerBatch == Int.MaxValue) || (numRowsInBatch % 64 != 0) ||\n"
            "        (arrowWriter.sizeInBytes() < maxBytesPerBatch)\n",
        ),
    ),
)

#: pyspark version -> the fixes its release needs (those of one class applied in this order).
PATCHES: dict[str, tuple[SourcePatch, ...]] = {
    "4.2.0": (
        CLOSE_STATE_SERVER_SOCKET,
        LAZY_DRIVER_HANDLE,
        INTERPRETED_STATE_SERVER,
        RESOLVED_ENCODERS,
        RESOLVED_STATE_SERVER_ENCODERS,
        RESOLVED_GROUPING_KEY_ENCODER,
        SIZE_EVERY_64_ROWS,
    )
}


def _spark_version() -> str:
    import pyspark

    return pyspark.__version__


def patches_needed() -> tuple[SourcePatch, ...]:
    return PATCHES.get(_spark_version(), ())


def patch_folder() -> Path:
    """The jar's folder, named after the release and its fixes: another set of fixes is another jar."""
    digest = hashlib.sha256(repr(patches_needed()).encode()).hexdigest()[:12]
    return jars_root() / f"spark-patches-{_spark_version()}-{digest}"


def patch_jar() -> Path | None:
    """The built jar of the installed pyspark's fixes, or None when it needs none or
    ``iotwatch setup`` has not built them."""
    folder = patch_folder()
    return folder / JAR_NAME if patches_needed() and (folder / COMPLETE_MARK).exists() else None


def patches_conf() -> dict[str, str]:
    """A local session's classpath with the fixes first (the driver is the executor)."""
    jar = patch_jar()
    return {"spark.driver.extraClassPath": str(jar)} if jar is not None else {}


def build_patches(*, sources_jar: Path | None = None) -> Path | None:
    """Build the fixes of the installed pyspark into their jar, unless built already; returns
    the jar (None: this release needs none)."""
    patches = patches_needed()
    if not patches:
        return None
    folder = patch_folder()
    if (folder / COMPLETE_MARK).exists():
        return folder / JAR_NAME
    version = _spark_version()
    with tempfile.TemporaryDirectory(prefix="iotwatch-spark-patches-") as tmp:
        work = Path(tmp)
        sources = sources_jar or _fetch_sources(version, work)
        classes = work / "classes"
        classes.mkdir()
        with zipfile.ZipFile(sources) as archive:
            paths = dict.fromkeys(p.path for p in patches)
            files = [_patched_source(archive, [p for p in patches if p.path == path], work / "src") for path in paths]
        _compile(files, classes)
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        with zipfile.ZipFile(folder / JAR_NAME, "w", zipfile.ZIP_DEFLATED) as jar:
            for path in sorted(classes.rglob("*.class")):
                jar.write(path, path.relative_to(classes).as_posix())
        (folder / COMPLETE_MARK).write_text("\n".join(p.issue for p in patches) + "\n")
    return folder / JAR_NAME


def install_built(source: Path) -> Path | None:
    """The fixes from a folder of jars downloaded elsewhere (``iotwatch setup --jars-from``):
    a copy of another machine's ``spark-patches-<version>-<digest>`` folder, else built from the
    spark-sql sources jar found there."""
    if not patches_needed():
        return None
    folder = patch_folder()
    if (folder / COMPLETE_MARK).exists():
        return folder / JAR_NAME
    built = Path(source).expanduser() / folder.name
    if (built / COMPLETE_MARK).exists() and (built / JAR_NAME).exists():
        folder.mkdir(parents=True, exist_ok=True)
        shutil.copy2(built / JAR_NAME, folder / JAR_NAME)
        shutil.copy2(built / COMPLETE_MARK, folder / COMPLETE_MARK)
        return folder / JAR_NAME
    sources = sorted(
        Path(source).expanduser().rglob(f"spark-sql_{SCALA_BINARY_VERSION}-{_spark_version()}-sources.jar")
    )
    if not sources:
        raise StackError(f"{source} has neither {folder.name}/ nor spark-sql's sources jar")
    return build_patches(sources_jar=sources[0])


def _fetch_sources(version: str, work: Path) -> Path:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError("cannot fetch Spark's sources for its fixes: Maven (mvn) is not installed")
    artifact = f"org.apache.spark:spark-sql_{SCALA_BINARY_VERSION}:{version}:jar:sources"
    command = [mvn, "-q", "-B", "dependency:copy", f"-Dartifact={artifact}", f"-DoutputDirectory={work}"]
    result = subprocess.run(command, cwd=work, capture_output=True, text=True)
    found = sorted(work.glob("*-sources.jar"))
    if result.returncode != 0 or not found:
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line][:2]
        raise StackError(f"Maven could not fetch {artifact}: {' '.join(errors) or 'exit ' + str(result.returncode)}")
    return found[0]


def _patched_source(archive: zipfile.ZipFile, patches: list[SourcePatch], root: Path) -> Path:
    """One class's source with the edits of all its fixes, in order."""
    path = patches[0].path
    text = archive.read(path).decode()
    for patch in patches:
        for released, fixed in patch.edits:
            if text.count(released) != 1:
                raise StackError(f"{patch.issue}: Spark's {Path(path).name} is not the release this fix is for")
            text = text.replace(released, fixed)
    target = root / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)
    return target


def _compile(files: list[Path], classes: Path) -> None:
    """Compile with the Scala compiler and libraries pyspark ships, against its jars."""
    jars = sorted(pyspark_jars_dir().glob("*.jar"))
    compiler = [j for j in jars if j.name.startswith(("scala-compiler-", "scala-library-", "scala-reflect-"))]
    if len(compiler) != 3:
        raise StackError("pyspark's jars folder has no Scala compiler to build Spark's fixes with")
    command = [
        java_executable(),
        "-cp",
        ":".join(map(str, compiler)),
        "scala.tools.nsc.Main",
        "-nowarn",
        "-classpath",
        ":".join(map(str, jars)),
        "-d",
        str(classes),
        *map(str, files),
    ]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise StackError(f"compiling Spark's fixes failed: {(result.stdout + result.stderr).strip()[-500:]}")
