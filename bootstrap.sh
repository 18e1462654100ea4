#!/usr/bin/env bash
# Set up everything iotwatch needs on a fresh Debian/Ubuntu machine, then run a command
# inside the project's virtual environment:
#
#   ./bootstrap.sh                    # the main job on the embedded stack (the default command)
#   ./bootstrap.sh pytest             # the test suite
#
# System packages (apt, when missing and when root or sudo is available): mosquitto and
# mosquitto-clients (MQTT broker and CLI clients), influxdb (metrics store), docker-compose
# (compose-file validation only), openjdk-17-jre-headless (Java for Kafka and Spark), maven
# (resolves the Java artifacts), curl, openssl (`iotwatch provision tls`).
# Python packages: the project with its test and docs extras, into ./.venv (IOTWATCH_VENV to change),
# reinstalled only when pyproject.toml changes.
# Java artifacts: Apache Kafka's broker and Spark's Kafka connector, resolved once from Maven
# Central by `iotwatch setup` into ~/.iotwatch/jars (IOTWATCH_JARS_DIR to change); offline,
# IOTWATCH_JARS_FROM=DIR installs them from a folder of jars downloaded elsewhere. The same
# command compiles the streaming job's numba kernels into numba's cache (once, about 30 s).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"

say() { printf 'bootstrap: %s\n' "$*" >&2; }

have() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }

missing=()
have mosquitto || missing+=(mosquitto)
have mosquitto_pub || missing+=(mosquitto-clients)
have influxd || missing+=(influxdb)
have docker-compose || missing+=(docker-compose)
have java || missing+=(openjdk-17-jre-headless)
have mvn || missing+=(maven)
have curl || missing+=(curl)
have openssl || missing+=(openssl)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then sudo=""; elif command -v sudo >/dev/null 2>&1; then sudo="sudo"; else sudo="none"; fi
    if [ "$sudo" = none ]; then
        say "cannot install ${missing[*]} (not root, no sudo): continuing with what is here"
        say "(the MQTT broker falls back to the pip-installed amqtt; without influxd metrics go to reports only)"
    else
        say "installing system packages: ${missing[*]}"
        $sudo apt-get update -q >&2
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
    fi
fi

python=${PYTHON:-python3}
if ! "$python" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
    say "Python 3.11 or newer is needed (found $("$python" --version 2>&1)); set PYTHON=/path/to/python3.11"
    exit 1
fi

venv=${IOTWATCH_VENV:-.venv}
if [ ! -x "$venv/bin/python" ]; then
    say "creating virtual environment $venv"
    "$python" -m venv "$venv"
fi
stamp="$venv/.iotwatch-installed"
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$wanted" ]; then
    say "installing iotwatch and its dependencies into $venv (first time: a few minutes)"
    "$venv/bin/python" -m pip install -q --upgrade pip >&2
    "$venv/bin/python" -m pip install -q -e ".[test,docs]" >&2
    echo "$wanted" > "$stamp"
fi

export PATH="$PWD/$venv/bin:$PATH"
if ! iotwatch setup ${IOTWATCH_JARS_FROM:+--jars-from "$IOTWATCH_JARS_FROM"} >&2; then
    say "the Java artifacts are missing (see the line above); the stack and the streaming job need them"
    exit 1
fi

if [ $# -eq 0 ]; then
    set -- iotwatch demo
fi
exec "$@"
