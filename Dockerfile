# iotwatch application image: one image for the gateway, the Spark streaming job and the
# device simulator (docker-compose.yml runs it with different commands).
#
#   docker build -t iotwatch:local .
#   docker build --build-arg SPARK_KAFKA_VERSION=4.2.0 -t iotwatch:local .
#
# Building needs internet access: Python packages, Debian packages and Spark's Kafka
# connector (from Maven Central, resolved by spark-submit). Running it does not.

# Debian 12 (bookworm) on purpose: openjdk-17-jre-headless is not packaged in Debian 13,
# which the plain "python:3.11-slim" tag now points to. Spark 4 runs on Java 17 or 21.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}

# Version of org.apache.spark:spark-sql-kafka-0-10_<scala>. Empty = the version of the
# pyspark that pip installed, which is what you want: the connector must match Spark.
ARG SPARK_KAFKA_VERSION=""
# Scala binary version of that connector. Empty = the one pyspark was built for.
ARG SCALA_BINARY_VERSION=""

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    JAVA_HOME=/opt/java

# Java for Spark; tini as PID 1 so SIGTERM from `docker stop` reaches Python and the JVM
# (a process running as PID 1 ignores signals it has no handler for); procps for Spark's
# shell scripts. The man1 directory works around the JRE's post-install step on slim images.
RUN set -eux; \
    mkdir -p /usr/share/man/man1; \
    apt-get update; \
    apt-get install -y --no-install-recommends openjdk-17-jre-headless tini procps; \
    rm -rf /var/lib/apt/lists/*; \
    ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" "${JAVA_HOME}"; \
    java -version

WORKDIR /src

# Dependencies first (their own layer, rebuilt only when pyproject.toml changes).
COPY pyproject.toml ./
RUN python -c "import tomllib; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('/tmp/requirements.txt', 'w').write('\n'.join(deps) + '\n')" \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

# Spark's Kafka source is not part of pip's pyspark: resolve it (and kafka-clients etc.)
# now and put the jars into pyspark/jars, so `iotwatch stream` finds
# it on the classpath with no download at run time. --verify loads the class in Spark.
COPY deploy/spark/fetch_kafka_connector.py /tmp/fetch_kafka_connector.py
RUN python /tmp/fetch_kafka_connector.py \
        --spark-version "${SPARK_KAFKA_VERSION}" \
        --scala-version "${SCALA_BINARY_VERSION}" \
        --verify \
    && rm -rf /tmp/fetch_kafka_connector.py /root/.ivy2* /tmp/spark-* /tmp/blockmgr-*

# The project itself (see .dockerignore for what is left out of the build context).
COPY . .
# The job's kernels are compiled here into a numba cache that the runtime user owns (numba
# only uses a cache folder it can write to), so no container compiles them (about 30 s of
# CPU) in its first micro-batch.
ENV NUMBA_CACHE_DIR=/opt/iotwatch/numba-cache
RUN pip install --no-deps . \
    && iotwatch --help > /dev/null \
    && python -c "from iotwatch.streaming.worker_daemon import compile_job; compile_job()" \
    && chown -R 10001 "$NUMBA_CACHE_DIR"

# Run as an unprivileged user whose home is the working directory, /var/lib/iotwatch: what
# the commands keep under ~/.iotwatch (the job's checkpoints and archive, the simulator's
# device seqs) and relative paths land in the volume docker-compose mounts there, and
# survive the container's re-creation.
RUN useradd --create-home --home-dir /var/lib/iotwatch --uid 10001 --shell /usr/sbin/nologin iotwatch
USER iotwatch
ENV HOME=/var/lib/iotwatch
WORKDIR /var/lib/iotwatch

# -g: forward signals to the whole process group (Python and the JVM Spark started).
ENTRYPOINT ["tini", "-g", "--"]
CMD ["iotwatch", "--help"]
