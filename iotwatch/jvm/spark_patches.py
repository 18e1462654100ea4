"""Fixes to the pinned Spark release: upstream ones until a release that has them can be
installed, and one of the job's own (docs/internals.md, "Spark patches")."""

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

CLOSE_STATE_SERVER_SOCKET = SourcePatch(
    issue="SPARK-58932",
    path="org/apache/spark/sql/execution/python/streaming/TransformWithStateInPySparkStateServer.scala",
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

#: pyspark version -> the fixes its release needs.
PATCHES: dict[str, tuple[SourcePatch, ...]] = {"4.2.0": (CLOSE_STATE_SERVER_SOCKET, LAZY_DRIVER_HANDLE)}


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
            files = [_patched_source(archive, patch, work / "src") for patch in patches]
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


def _patched_source(archive: zipfile.ZipFile, patch: SourcePatch, root: Path) -> Path:
    text = archive.read(patch.path).decode()
    for released, fixed in patch.edits:
        if text.count(released) != 1:
            raise StackError(f"{patch.issue}: Spark's {Path(patch.path).name} is not the release this fix is for")
        text = text.replace(released, fixed)
    target = root / patch.path
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
