#!/bin/bash
# InfluxDB 2 init script for iotwatch (mounted into /docker-entrypoint-initdb.d).
#
# The influxdb:2 image runs executable *.sh files in that directory once, right after
# `influx setup` created the org, bucket and admin token from DOCKER_INFLUXDB_INIT_*, i.e.
# only on the first start with an empty data volume. The influx CLI is already configured
# with the admin token, and DOCKER_INFLUXDB_INIT_BUCKET_ID is exported for us.
#
# iotwatch uses only the InfluxDB 1.x-compatible API (/write?db=..., /query with
# InfluxQL; Grafana's datasource too). InfluxDB 2 serves it through a DBRP mapping from
# (database, retention policy) to a bucket, which this script creates:
#   DBRP_DATABASE          database name iotwatch writes to (= IOTWATCH_INFLUX_DATABASE)
#   DBRP_RETENTION_POLICY  retention policy name (default "autogen"), made the default
# Must stay executable (git keeps the mode): the image's run-parts skips other files.
set -euo pipefail

org="${DOCKER_INFLUXDB_INIT_ORG:?}"
bucket="${DOCKER_INFLUXDB_INIT_BUCKET:?}"
bucket_id="${DOCKER_INFLUXDB_INIT_BUCKET_ID:?}"
db="${DBRP_DATABASE:-$bucket}"
rp="${DBRP_RETENTION_POLICY:-autogen}"

echo "iotwatch: mapping InfluxQL database '${db}' (retention policy '${rp}') to bucket '${bucket}' (${bucket_id})"
if ! influx v1 dbrp create --org "${org}" --bucket-id "${bucket_id}" --db "${db}" --rp "${rp}" --default; then
    # Tolerate a mapping that already exists for this bucket (InfluxDB 2.4+ also shows
    # "virtual" mappings for buckets named like the database); fail on anything else.
    if influx v1 dbrp list --org "${org}" --db "${db}" | grep -q "${bucket_id}"; then
        echo "iotwatch: a DBRP mapping for '${db}' already points at bucket '${bucket}'"
    else
        echo "iotwatch: could not create the DBRP mapping for '${db}'" >&2
        exit 1
    fi
fi
influx v1 dbrp list --org "${org}" --db "${db}"
