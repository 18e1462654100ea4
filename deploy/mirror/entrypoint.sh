#!/bin/sh
# Entry point of a site's MirrorMaker 2 (docker-compose.yml, profile "sites"; run with
# /bin/sh, so it needs no execute bit): writes mm2.properties from deploy/mirror/mm2.properties
# with the site's alias and both clusters' addresses, and the SASL/SCRAM login MirrorMaker
# uses on each (the link from the site to the centre is authenticated and encrypted): the mirror user, with
# only the ACLs `iotwatch provision topics --acls --site/--linked-site` grant it
# (application/provision/kafka_acls.py), then starts MirrorMaker as the Kafka image ships it.
#
#   SITE                the site's alias: its topics are <SITE>.<topic> at the centre
#   SITE_BOOTSTRAP      the site's Kafka (host:port)
#   CENTRAL_BOOTSTRAP   the central Kafka's REPLICATION listener (host:port, SASL_SSL)
#   CENTRAL_CA_FILE     the CA that signed the centre's certificate (default /iotwatch/tls/ca.crt)
#   SCRAM_MIRROR_PASSWORD  the mirror user's password on both clusters (KAFKA_MIRROR_PASSWORD)
set -eu

fail() { echo "mirror entrypoint: $*" >&2; exit 1; }

: "${SITE:?}"
: "${SITE_BOOTSTRAP:?}"
: "${CENTRAL_BOOTSTRAP:?}"
CENTRAL_CA_FILE="${CENTRAL_CA_FILE:-/iotwatch/tls/ca.crt}"
: "${SCRAM_MIRROR_PASSWORD:?set KAFKA_MIRROR_PASSWORD in .env}"
case "$(printf '%s' "$SCRAM_MIRROR_PASSWORD" | tr '[:upper:]' '[:lower:]')" in
    *change_me* | *change-me* | *changeme*) fail "KAFKA_MIRROR_PASSWORD is still the .env.example placeholder; set a real value in .env" ;;
esac

CONF_DIR=/tmp/iotwatch-mirror
umask 077
mkdir -p "$CONF_DIR"
LOGIN="org.apache.kafka.common.security.scram.ScramLoginModule required username=\"mirror\" password=\"$SCRAM_MIRROR_PASSWORD\";"
sed -e "s/^SITE\([.-]\)/$SITE\1/" -e "s/->SITE\./->$SITE./" -e "s/^clusters=SITE,/clusters=$SITE,/" \
    -e "s/=SITE_BOOTSTRAP$/=$SITE_BOOTSTRAP/" -e "s/=CENTRAL_BOOTSTRAP$/=$CENTRAL_BOOTSTRAP/" \
    /iotwatch/mirror/mm2.properties > "$CONF_DIR/mm2.properties"
for cluster in "$SITE" central; do
    printf '%s.sasl.mechanism=SCRAM-SHA-512\n%s.sasl.jaas.config=%s\n' "$cluster" "$cluster" "$LOGIN" \
        >> "$CONF_DIR/mm2.properties"
done
# The site's own cluster is on the site's network; the link to the centre leaves it: TLS,
# verifying the centre's certificate (and its name, the Java client's default) with the CA.
[ -r "$CENTRAL_CA_FILE" ] || fail "cannot read $CENTRAL_CA_FILE: run iotwatch provision tls (deploy/kafka/tls/ca.crt)"
printf '%s.security.protocol=SASL_PLAINTEXT\n' "$SITE" >> "$CONF_DIR/mm2.properties"
printf 'central.security.protocol=SASL_SSL\ncentral.ssl.truststore.type=PEM\ncentral.ssl.truststore.location=%s\n' \
    "$CENTRAL_CA_FILE" >> "$CONF_DIR/mm2.properties"

exec /opt/kafka/bin/connect-mirror-maker.sh "$CONF_DIR/mm2.properties"
