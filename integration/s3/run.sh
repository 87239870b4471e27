#!/usr/bin/env bash
# Tiered storage against a real S3-compatible server (moto's server, from PyPI):
# produce with small segments so they seal and upload, check the bucket
# (create-only manifests, segment objects), wipe the broker's data directory,
# restart it on the same bucket and consume every record (confluent-kafka and
# kcat), checking content. Needs: moto[server], boto3, confluent-kafka, kcat
# (installs moto itself if missing).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
PY="${PYTHON:-python3}"

# integration/install-deps.sh should install these (moto[server] brings boto3);
# installing here keeps the suite runnable on its own.
if ! command -v moto_server >/dev/null 2>&1; then
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore 'moto[server]'
fi
"$PY" -c 'import confluent_kafka' 2>/dev/null ||
  "$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore confluent-kafka

MOTO_PORT="$(free_port)"
MOTO_LOG="$(mktemp -t moto-XXXXXX.log)"
moto_server -H 127.0.0.1 -p "$MOTO_PORT" >"$MOTO_LOG" 2>&1 &
MOTO_PID=$!
cleanup() {
  stop_broker
  kill "$MOTO_PID" 2>/dev/null || true
  wait "$MOTO_PID" 2>/dev/null || true
  rm -f "$MOTO_LOG"
}
trap cleanup EXIT
for _ in $(seq 1 100); do
  (exec 3<>"/dev/tcp/127.0.0.1/$MOTO_PORT") 2>/dev/null && break
  sleep 0.1
done

export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO_PORT" AWS_ALLOW_HTTP=true
export BUCKET=strata-it TOPIC=tiered RECORDS=3000

"$PY" "$HERE/check.py" setup
STORE_ARGS=(--store "s3://$BUCKET/cluster1" --s3-endpoint "$AWS_ENDPOINT_URL" --s3-allow-http true --tier-interval-ms 100)

start_broker "${STORE_ARGS[@]}"
trap cleanup EXIT   # start_broker replaced the trap
"$PY" "$HERE/check.py" produce
"$PY" "$HERE/check.py" wait-tiered
echo "sealed segments are in the bucket; wiping the data directory" >&2
stop_broker          # removes the data directory
start_broker "${STORE_ARGS[@]}"
trap cleanup EXIT
"$PY" "$HERE/check.py" consume
kcat -b "$BOOTSTRAP" -L >&2 || { cat "$BROKER_DATA/broker.log" >&2; exit 1; }
count="$(kcat -b "$BOOTSTRAP" -C -t "$TOPIC" -p 0 -o beginning -e -q -f '%s\n' | grep -c '^value-')"
[ "$count" -eq "$RECORDS" ] || { echo "kcat read $count of $RECORDS records" >&2; exit 1; }
echo "s3 integration: ok ($RECORDS records back from the bucket after a wiped data dir)"
