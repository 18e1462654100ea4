#!/bin/sh
# Entry point of the "kafka" service (docker-compose.yml runs it with /bin/sh): SASL/SCRAM
# for every client, the TLS listeners' keystore, then the image's own start script given as
# arguments.
#
# KRaft keeps SCRAM credentials in the cluster metadata, so the first ones must be written
# when the storage is formatted (kafka-storage format --add-scram): the image's start script
# cannot do that, so this script formats an empty volume itself, with one SCRAM-SHA-512 user
# per client, and the image then finds the storage "already formatted":
#   admin    the broker itself (inter-broker listener) and the kafka-topics init service
#   gateway  iotwatch gateway         stream  iotwatch stream
#   responder  iotwatch respond (and at a site iotwatch relay)
#   mirror   a site's MirrorMaker 2 (profile "sites")
# Passwords come from SCRAM_*_PASSWORD (KAFKA_*_PASSWORD in .env; not KAFKA_* here, which
# the image would copy into server.properties). They are applied on the first start only:
# to change one later, see README (Full deployment).
set -eu

fail() { echo "kafka entrypoint: $*" >&2; exit 1; }

: "${SCRAM_ADMIN_PASSWORD:?set KAFKA_ADMIN_PASSWORD in .env}"
: "${SCRAM_GATEWAY_PASSWORD:?set KAFKA_GATEWAY_PASSWORD in .env}"
: "${SCRAM_STREAM_PASSWORD:?set KAFKA_STREAM_PASSWORD in .env}"
: "${SCRAM_RESPONDER_PASSWORD:?set KAFKA_RESPONDER_PASSWORD in .env}"
: "${SCRAM_MIRROR_PASSWORD:?set KAFKA_MIRROR_PASSWORD in .env}"
for secret in "$SCRAM_ADMIN_PASSWORD" "$SCRAM_GATEWAY_PASSWORD" "$SCRAM_STREAM_PASSWORD" "$SCRAM_RESPONDER_PASSWORD" \
    "$SCRAM_MIRROR_PASSWORD"; do
    case "$(printf '%s' "$secret" | tr '[:upper:]' '[:lower:]')" in
        *change_me* | *change-me* | *changeme*) fail "a KAFKA_*_PASSWORD is still the .env.example placeholder; set real values in .env" ;;
        *'"'* | *'\'* | *' '* | *,* | *=* | *']'*) fail "KAFKA_*_PASSWORD values must not contain quotes, backslashes, spaces, ',', '=' or ']'" ;;
    esac
done

# Private files of this container: the broker's JAAS login (its inter-broker identity) and
# the admin client properties the healthcheck uses.
CONF_DIR=/tmp/iotwatch-kafka
umask 077
mkdir -p "$CONF_DIR"
LOGIN="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"admin\" password=\"$SCRAM_ADMIN_PASSWORD\";"
printf 'KafkaServer {\n  %s\n};\n' "$LOGIN" > "$CONF_DIR/jaas.conf"
printf 'security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\nsasl.jaas.config=%s\n' "$LOGIN" \
    > "$CONF_DIR/admin.properties"
export KAFKA_OPTS="${KAFKA_OPTS:-} -Djava.security.auth.login.config=$CONF_DIR/jaas.conf"

# A listener over TLS (SASL_SSL in the listener map) presents the keystore of `iotwatch provision
# tls` (deploy/kafka/tls, mounted read-only): PKCS12, its password in the file beside it. The
# image copies KAFKA_SSL_* into server.properties.
TLS_DIR=/iotwatch/kafka/tls
case "${KAFKA_LISTENER_SECURITY_PROTOCOL_MAP:?}" in
    *SSL*)
        for file in "$TLS_DIR/kafka.p12" "$TLS_DIR/kafka.p12.password"; do
            [ -r "$file" ] || fail "cannot read $file: run iotwatch provision tls, then let uid $(id -u) read it (chown $(id -u) deploy/kafka/tls/kafka.p12*)"
        done
        export KAFKA_SSL_KEYSTORE_TYPE=PKCS12
        export KAFKA_SSL_KEYSTORE_LOCATION="$TLS_DIR/kafka.p12"
        KAFKA_SSL_KEYSTORE_PASSWORD="$(cat "$TLS_DIR/kafka.p12.password")"
        export KAFKA_SSL_KEYSTORE_PASSWORD
        ;;
esac

if [ ! -e "${KAFKA_LOG_DIRS:?}/meta.properties" ]; then
    # The same KRaft settings the image renders from KAFKA_* (docker-compose.yml).
    cat > "$CONF_DIR/format.properties" <<PROPERTIES
process.roles=${KAFKA_PROCESS_ROLES:?}
node.id=${KAFKA_NODE_ID:?}
controller.quorum.voters=${KAFKA_CONTROLLER_QUORUM_VOTERS:?}
controller.listener.names=${KAFKA_CONTROLLER_LISTENER_NAMES:?}
listeners=${KAFKA_LISTENERS:?}
advertised.listeners=${KAFKA_ADVERTISED_LISTENERS:?}
listener.security.protocol.map=${KAFKA_LISTENER_SECURITY_PROTOCOL_MAP:?}
inter.broker.listener.name=${KAFKA_INTER_BROKER_LISTENER_NAME:?}
sasl.enabled.mechanisms=${KAFKA_SASL_ENABLED_MECHANISMS:?}
sasl.mechanism.inter.broker.protocol=${KAFKA_SASL_MECHANISM_INTER_BROKER_PROTOCOL:?}
log.dirs=${KAFKA_LOG_DIRS}
PROPERTIES
    echo "kafka entrypoint: formatting ${KAFKA_LOG_DIRS} with SCRAM users admin, gateway, stream, responder, mirror"
    /opt/kafka/bin/kafka-storage.sh format --config "$CONF_DIR/format.properties" --cluster-id "${CLUSTER_ID:?}" \
        --add-scram "SCRAM-SHA-512=[name=admin,password=$SCRAM_ADMIN_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=gateway,password=$SCRAM_GATEWAY_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=stream,password=$SCRAM_STREAM_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=responder,password=$SCRAM_RESPONDER_PASSWORD]" \
        --add-scram "SCRAM-SHA-512=[name=mirror,password=$SCRAM_MIRROR_PASSWORD]" > /dev/null \
        || fail "kafka-storage format failed"
    rm -f "$CONF_DIR/format.properties"
fi

exec "$@"
