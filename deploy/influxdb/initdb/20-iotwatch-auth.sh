#!/bin/bash
# InfluxDB 2 init script for iotwatch (mounted into /docker-entrypoint-initdb.d; runs once,
# after `influx setup` and 10-iotwatch-dbrp.sh, with the influx CLI logged in as admin).
#
# Least privilege: the admin token stays inside this container. Each client gets a v1
# authorization (user name and password: the credentials of InfluxDB's 1.x-compatible API,
# which is all iotwatch and Grafana use) scoped to the one bucket:
#   INFLUX_WRITER_USER / _PASSWORD   iotwatch services: write only (IOTWATCH_INFLUX_USERNAME)
#   INFLUX_READER_USER / _PASSWORD   Grafana: read only (the datasource's user)
# v1 authorizations take a password we choose, unlike API tokens, which InfluxDB generates;
# so the values can come from .env like every other secret.
# Must stay executable (git keeps the mode): the image's run-parts skips other files.
set -euo pipefail

org="${DOCKER_INFLUXDB_INIT_ORG:?}"
bucket_id="${DOCKER_INFLUXDB_INIT_BUCKET_ID:?}"
for secret in "${INFLUX_WRITER_PASSWORD:?}" "${INFLUX_READER_PASSWORD:?}"; do
    case "${secret,,}" in
        *change_me* | *change-me* | *changeme*)
            echo "iotwatch: an INFLUXDB_*_PASSWORD is still the .env.example placeholder; set real values in .env" >&2
            exit 1 ;;
    esac
done

influx v1 auth create --org "${org}" --username "${INFLUX_WRITER_USER:?}" --password "${INFLUX_WRITER_PASSWORD}" \
    --write-bucket "${bucket_id}" --description "iotwatch services: write only" > /dev/null
influx v1 auth create --org "${org}" --username "${INFLUX_READER_USER:?}" --password "${INFLUX_READER_PASSWORD}" \
    --read-bucket "${bucket_id}" --description "Grafana: read only" > /dev/null
echo "iotwatch: v1 authorizations for '${INFLUX_WRITER_USER}' (write) and '${INFLUX_READER_USER}' (read) created"
