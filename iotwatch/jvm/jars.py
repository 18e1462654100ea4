"""The Java artifacts iotwatch runs on: Apache Kafka's broker, MirrorMaker 2 and Spark's Kafka
connector (docs/internals.md, "Java artifacts")."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from iotwatch.errors import MissingArtifacts, StackError

#: Apache Kafka's version: the embedded broker's and the compose file's (a test checks both).
KAFKA_VERSION = "4.1.0"
SCALA_BINARY_VERSION = "2.13"
#: Marks a complete folder: written last, so an interrupted resolution is done again.
COMPLETE_MARK = ".complete"
#: "<artifact>-<version>.jar"; the version starts with "<digits>.<digit>", which tells
#: "spark-sql-kafka-0-10_2.13" (artifact) from "4.2.0" (version).
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.\d.*)\.jar$")


@dataclass(frozen=True)
class JarSet:
    """One artifact with its runtime dependencies, kept in its own folder."""

    name: str  # folder prefix, e.g. "kafka"
    version: str
    coordinates: tuple[str, ...]  # group:artifact:version, resolved with their dependencies
    main_artifact: str  # the artifact whose jar proves the folder is this set
    #: artifacts another classpath already provides (pyspark's jars/): not kept, since a
    #: second version of a jar Spark ships would only cause class conflicts
    provided: frozenset[str] = frozenset()

    @property
    def directory(self) -> Path:
        return jars_root() / f"{self.name}-{self.version}"

    def jars(self) -> list[Path]:
        """The installed jars, or a :class:`StackError` naming the command that installs them."""
        folder = self.directory
        if not (folder / COMPLETE_MARK).exists():
            raise MissingArtifacts(
                f"{self.description()} is not installed in {folder}: run `iotwatch setup` "
                "(it resolves the jars with Maven once; `iotwatch setup --jars-from DIR` installs them offline)"
            )
        return sorted(folder.glob("*.jar"))

    def installed(self) -> bool:
        return (self.directory / COMPLETE_MARK).exists()

    def description(self) -> str:
        return f"{self.coordinates[0]} (with its dependencies)"


def java_executable() -> str:
    """The ``java`` that Kafka's broker and Spark run on: ``$JAVA_HOME/bin/java`` when JAVA_HOME
    is set (as Spark's and Kafka's own launch scripts take it), else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    java = str(Path(java_home) / "bin" / "java") if java_home else shutil.which("java")
    if java is None:
        raise StackError(
            "Java 17+ is needed for Kafka and Spark: apt-get install -y openjdk-17-jre-headless (or set JAVA_HOME)"
        )
    return java


def jars_root() -> Path:
    """Where jar folders live: IOTWATCH_JARS_DIR, else ``~/.iotwatch/jars``."""
    return Path(os.environ.get("IOTWATCH_JARS_DIR") or Path.home() / ".iotwatch" / "jars").expanduser()


def artifact_of(jar_name: str) -> str:
    """The artifact id in a Maven jar file name ``<artifact>-<version>.jar``."""
    match = _JAR_NAME.match(jar_name)
    return match.group("artifact") if match else jar_name.removesuffix(".jar")


def _kafka_artifact(name: str, artifact: str) -> JarSet:
    """An Apache Kafka artifact at :data:`KAFKA_VERSION` with log4j's SLF4J binding, so it logs to its file."""
    return JarSet(
        name=name,
        version=KAFKA_VERSION,
        coordinates=(
            f"org.apache.kafka:{artifact}:{KAFKA_VERSION}",
            "org.apache.logging.log4j:log4j-slf4j-impl:2.24.3",
        ),
        main_artifact=artifact,
    )


def kafka_broker() -> JarSet:
    """Apache Kafka's broker (KRaft)."""
    return _kafka_artifact("kafka", f"kafka_{SCALA_BINARY_VERSION}")


def mirror_maker() -> JarSet:
    """Apache Kafka's MirrorMaker 2 (``connect-mirror`` with Connect's runtime), which copies
    each site's topics to the central cluster."""
    return _kafka_artifact("connect-mirror", "connect-mirror")


def pyspark_jars_dir() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent / "jars"


def spark_kafka_connector() -> JarSet:
    """Spark's Kafka source and sink at exactly the installed pyspark's version, without the
    jars pyspark already ships."""
    import pyspark

    shipped = frozenset(artifact_of(jar.name) for jar in pyspark_jars_dir().glob("*.jar"))
    artifact = f"spark-sql-kafka-0-10_{SCALA_BINARY_VERSION}"
    return JarSet(
        name="spark-sql-kafka",
        version=pyspark.__version__,
        coordinates=(f"org.apache.spark:{artifact}:{pyspark.__version__}",),
        main_artifact=artifact,
        provided=shipped,
    )


def all_sets() -> list[JarSet]:
    return [kafka_broker(), mirror_maker(), spark_kafka_connector()]


def install(jar_set: JarSet, *, jars_from: Path | None = None) -> Path:
    """Resolve ``jar_set`` with Maven (or copy it from ``jars_from``) into its folder, unless
    it is there already; returns the folder."""
    folder = jar_set.directory
    if jar_set.installed():
        return folder
    with tempfile.TemporaryDirectory(prefix=f"iotwatch-{jar_set.name}-") as tmp:
        work = Path(tmp)
        resolved = _copy_from(jar_set, jars_from) if jars_from else _resolve_with_maven(jar_set, work)
        kept = [jar for jar in resolved if artifact_of(jar.name) not in jar_set.provided]
        if not any(artifact_of(jar.name) == jar_set.main_artifact for jar in kept):
            raise StackError(f"{jar_set.main_artifact}-{jar_set.version}.jar is not among the resolved jars")
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        for jar in kept:
            shutil.copy2(jar, folder / jar.name)
        (folder / COMPLETE_MARK).write_text("\n".join(jar_set.coordinates) + "\n")
    return folder


def _copy_from(jar_set: JarSet, source: Path) -> list[Path]:
    """The jars of ``source/<name>-<version>/`` (a copy of another machine's jar folders), or
    of ``source`` itself."""
    source = Path(source).expanduser()
    own_folder = source / jar_set.directory.name
    jars = sorted((own_folder if own_folder.is_dir() else source).glob("*.jar"))
    if not jars:
        raise StackError(f"no jars in {source}: put the jars of {jar_set.description()} there")
    return jars


def _pom(jar_set: JarSet) -> str:
    dependencies = "".join(
        f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
        f"<version>{version}</version></dependency>"
        for group, artifact, version in (c.split(":") for c in jar_set.coordinates)
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0"><modelVersion>4.0.0</modelVersion>'
        f"<groupId>iotwatch.setup</groupId><artifactId>{jar_set.name}</artifactId><version>1</version>"
        f"<dependencies>{dependencies}</dependencies></project>\n"
    )


def _resolve_with_maven(jar_set: JarSet, work: Path) -> list[Path]:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise StackError(
            f"cannot resolve {jar_set.description()}: Maven (mvn) is not installed "
            "(apt-get install -y maven, or download the jars elsewhere and run `iotwatch setup --jars-from DIR`)"
        )
    (work / "pom.xml").write_text(_pom(jar_set))
    output = work / "jars"
    command = [
        mvn,
        "-q",
        "-B",
        "dependency:copy-dependencies",
        f"-DoutputDirectory={output}",
        "-DincludeScope=runtime",
    ]
    result = subprocess.run(command, cwd=work, capture_output=True, text=True)
    if result.returncode != 0:
        errors = [line for line in result.stdout.splitlines() if "ERROR" in line][:2]
        raise StackError(
            f"Maven could not resolve {jar_set.description()}: {' '.join(errors) or 'exit ' + str(result.returncode)} "
            "(check Maven's access to its registry, or download the jars elsewhere and run "
            "`iotwatch setup --jars-from DIR`)"
        )
    return sorted(output.glob("*.jar"))
