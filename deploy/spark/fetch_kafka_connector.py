"""Put Spark's Kafka connector on pip-installed pyspark's classpath (image build time).

``iotwatch stream --kafka-source spark`` reads Kafka with Spark's own source
(``spark.readStream.format("kafka")``), which lives in the separate artifact
``org.apache.spark:spark-sql-kafka-0-10_<scala>:<spark version>``. pip's pyspark does
not ship it. This script resolves that artifact and its dependencies once, with
``spark-submit --packages`` (Ivy, from Maven Central or ``--repository``), and copies
every resolved jar that pyspark does not already ship into ``pyspark/jars/``, which is on
the classpath of every Spark session. The container then needs no network access (and no
``spark.jars.packages``) at run time.

Usage (the Dockerfile runs it with the build arguments)::

    python fetch_kafka_connector.py [--spark-version 4.2.0] [--scala-version 2.13] [--verify]
    python fetch_kafka_connector.py --jars-from DIR   # offline: jars downloaded elsewhere

Empty versions mean "the installed pyspark's": the connector must match Spark exactly.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10"
CONNECTOR_CLASS = "org.apache.spark.sql.kafka010.KafkaSourceProvider"

# "<artifact>-<version>.jar"; the version starts with "<digits>.<digit>", which is what
# tells "spark-sql-kafka-0-10_2.13" (artifact) apart from "4.2.0" (version).
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-(?P<version>\d+\.\d.*)\.jar$")


def artifact_of(jar_name: str, *, ivy_layout: bool) -> str:
    """The artifact id in a jar file name. Ivy (Spark's ``--packages``) names retrieved
    jars ``<organisation>_<artifact>-<version>.jar``; pyspark's jars/ has
    ``<artifact>-<version>.jar``."""
    name = jar_name.split("_", 1)[1] if ivy_layout and "_" in jar_name else jar_name
    match = _JAR_NAME.match(name)
    return match.group("artifact") if match else name.removesuffix(".jar")


def scala_binary_version(jars_dir: Path) -> str:
    """Scala binary version pyspark was built for, from its ``spark-core_<scala>-*.jar``."""
    for jar in jars_dir.glob("spark-core_*.jar"):
        match = re.match(r"spark-core_(\d+\.\d+)-", jar.name)
        if match:
            return match.group(1)
    raise SystemExit(f"cannot tell pyspark's Scala version: no spark-core_*.jar in {jars_dir}")


def resolve(spark_home: Path, coordinate: str, work: Path, repository: str | None) -> list[Path]:
    """Let spark-submit's Ivy resolve ``coordinate``; return the retrieved jars."""
    ivy_dir = work / "ivy"
    noop_app = work / "noop.py"
    noop_app.write_text("")
    command = [
        str(spark_home / "bin" / "spark-submit"),
        "--master",
        "local[1]",
        "--conf",
        f"spark.jars.ivy={ivy_dir}",
        "--packages",
        coordinate,
    ]
    if repository:
        command += ["--repositories", repository]
    command.append(str(noop_app))
    print("+", " ".join(command), flush=True)
    subprocess.run(command, check=True)
    return sorted((ivy_dir / "jars").glob("*.jar"))


def install(resolved: list[Path], jars_dir: Path, *, ivy_layout: bool) -> tuple[list[str], list[str]]:
    """Copy jars whose artifact pyspark does not ship (a second, different version of a
    jar Spark already has, e.g. snappy-java, would only cause classpath conflicts)."""
    shipped = {artifact_of(jar.name, ivy_layout=False) for jar in jars_dir.glob("*.jar")}
    added, skipped = [], []
    for jar in resolved:
        artifact = artifact_of(jar.name, ivy_layout=ivy_layout)
        if artifact in shipped:
            skipped.append(jar.name)
            continue
        target = jars_dir / (jar.name.split("_", 1)[1] if ivy_layout and "_" in jar.name else jar.name)
        shutil.copy2(jar, target)
        added.append(target.name)
    return added, skipped


def verify() -> None:
    """Start a local Spark session and load the Kafka source class."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[1]").appName("kafka-connector-check").getOrCreate()
    try:
        spark.sparkContext._jvm.java.lang.Class.forName(CONNECTOR_CLASS)  # type: ignore[union-attr]
    finally:
        spark.stop()
    print(f"verified: {CONNECTOR_CLASS} loads", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spark-version", default="", help="default: the installed pyspark's version")
    parser.add_argument("--scala-version", default="", help="default: the installed pyspark's Scala version")
    parser.add_argument("--repository", default="", help="extra Maven repository (e.g. a mirror) for Ivy")
    parser.add_argument(
        "--jars-from", type=Path, help="install Ivy-named jars from this directory instead of resolving"
    )
    parser.add_argument("--verify", action="store_true", help="load the connector in a Spark session afterwards")
    args = parser.parse_args(argv)

    import pyspark

    spark_home = Path(pyspark.__file__).resolve().parent
    jars_dir = spark_home / "jars"
    spark_version = args.spark_version or pyspark.__version__
    scala = args.scala_version or scala_binary_version(jars_dir)
    if spark_version != pyspark.__version__:
        print(
            f"warning: connector {spark_version} != pyspark {pyspark.__version__}; they should match", file=sys.stderr
        )
    coordinate = f"org.apache.spark:{CONNECTOR_ARTIFACT}_{scala}:{spark_version}"

    with tempfile.TemporaryDirectory(prefix="spark-kafka-") as tmp:
        if args.jars_from:
            resolved = sorted(args.jars_from.glob("*.jar"))
        else:
            resolved = resolve(spark_home, coordinate, Path(tmp), args.repository or None)
        connector = f"{CONNECTOR_ARTIFACT}_{scala}"
        if not any(artifact_of(jar.name, ivy_layout=True) == connector for jar in resolved):
            raise SystemExit(f"{coordinate} was not among the resolved jars: {[j.name for j in resolved]}")
        added, skipped = install(resolved, jars_dir, ivy_layout=True)

    print(f"{coordinate}: added to {jars_dir}: {', '.join(added) or 'nothing'}")
    print(f"already shipped by pyspark (not copied): {', '.join(skipped) or 'nothing'}")
    if args.verify:
        verify()
    return 0


if __name__ == "__main__":
    sys.exit(main())
