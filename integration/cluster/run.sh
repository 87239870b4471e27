#!/usr/bin/env bash
# Cluster mode with third-party clients on a real S3 server (moto) and a real
# etcd: three brokers share one bucket. While the Java client (kafka-clients)
# and librdkafka (confluent-kafka) produce numbered records with acks=all and
# idempotence, the broker leading partition 0 loses its machine (kill -9, data
# directory deleted). Afterwards every acknowledged record must be read back
# exactly once, at the offset it was acknowledged with, by both the Java and
# the librdkafka consumer; unacknowledged ones at most once. A share group
# (Kafka 4.4's KafkaShareConsumer) reads along from before the kill and must
# deliver every record at least once, each as the log has it. Prints each
# producer's stall and failover time, then waits for the write-ahead log
# objects in the bucket to be collected once the segments seal.
#
# Needs: etcd (etcd-server), moto[server], confluent-kafka, Java 17 + Maven
# (integration/install-deps.sh installs the first three; Maven fetches the
# Java client). KEEP_CLUSTER_DATA=1 keeps the logs and data directories.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
PY="${PYTHON:-python3}"
started=$(date +%s)

for tool in etcd moto_server java mvn; do
  command -v "$tool" >/dev/null || { echo "$tool not found (integration/install-deps.sh)" >&2; exit 1; }
done
[ -x "$STRATA_BIN" ] || { echo "strata binary not found at $STRATA_BIN (cargo build --release)" >&2; exit 1; }

echo "== building the Java client program (integration/java)"
(cd "$REPO_ROOT/integration/java" && mvn -B -ntp -q -Dstyle.color=never -DskipTests package | sed 's/\x1b\[0m//g')
JAVA_CP="$REPO_ROOT/integration/java/target/test-classes:$REPO_ROOT/integration/java/target/lib/*"
JAVA=(java -Dorg.slf4j.simpleLogger.defaultLogLevel=error -cp "$JAVA_CP" strata.it.ClusterClient)

WORK="$(mktemp -d -t strata-cluster-XXXXXX)"
declare -A BROKER_PIDS BROKER_PORTS
PIDS=()
rc=1
cleanup() {
  for pid in "${PIDS[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [ "$rc" != 0 ]; then
    for f in "$WORK"/*.log; do
      [ -f "$f" ] || continue
      echo "== last 30 lines of $(basename "$f")" >&2
      tail -n 30 "$f" >&2
    done
  fi
  if [ "${KEEP_CLUSTER_DATA:-0}" = 1 ]; then
    echo "cluster data and logs kept in $WORK" >&2
  else
    rm -rf "$WORK"
  fi
}
trap cleanup EXIT
trap 'exit 1' INT TERM

wait_port() {
  for _ in $(seq 1 150); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.1
  done
  echo "$3 did not start listening on $1" >&2
  return 1
}

MOTO_PORT="$(free_port)"
moto_server -H 127.0.0.1 -p "$MOTO_PORT" >"$WORK/moto.log" 2>&1 &
PIDS+=($!)
wait_port "$MOTO_PORT" $! moto

ETCD_PORT="$(free_port)"
ETCD_PEER="$(free_port)"
while [ "$ETCD_PEER" = "$ETCD_PORT" ]; do ETCD_PEER="$(free_port)"; done
etcd --data-dir "$WORK/etcd" \
  --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
  --listen-peer-urls "http://127.0.0.1:$ETCD_PEER" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER" \
  --initial-cluster "default=http://127.0.0.1:$ETCD_PEER" \
  --heartbeat-interval 50 --election-timeout 500 >"$WORK/etcd.log" 2>&1 &
PIDS+=($!)
wait_port "$ETCD_PORT" $! etcd

export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="http://127.0.0.1:$MOTO_PORT" AWS_ALLOW_HTTP=true
export BUCKET=strata-cluster PREFIX=c1 TOPIC=busy PARTITIONS=6
"$PY" "$HERE/cluster.py" setup

# --wal-max-age-ms: internal topics (the share group's state) roll their segments as
# soon as the test topic's segment.ms rolls its own, so the WAL becomes collectable.
start_node() {
  local node="$1" port
  port="$(free_port)"
  mkdir -p "$WORK/data-$node"
  "$STRATA_BIN" serve --node-id "$node" --listen "127.0.0.1:$port" --advertised-listener "127.0.0.1:$port" \
    --data-dir "$WORK/data-$node" --cluster "etcd://127.0.0.1:$ETCD_PORT/strata" \
    --cluster-lease-ttl-ms 2000 --wal-flush-ms 10 --compaction-worker false \
    --store "s3://$BUCKET/$PREFIX" --s3-endpoint "$AWS_ENDPOINT_URL" --s3-allow-http true \
    --tier-interval-ms 200 --wal-max-age-ms 3000 >>"$WORK/broker-$node.log" 2>&1 &
  BROKER_PIDS[$node]=$!
  BROKER_PORTS[$node]=$port
  PIDS+=($!)
  wait_port "$port" $! "broker $node"
}

bootstrap() {
  local out=() node
  for node in "${!BROKER_PORTS[@]}"; do out+=("127.0.0.1:${BROKER_PORTS[$node]}"); done
  (IFS=,; echo "${out[*]}")
}

for node in 1 2 3; do start_node "$node"; done
export BOOTSTRAP="$(bootstrap)"
echo "== 3 brokers at $BOOTSTRAP, etcd at :$ETCD_PORT, moto at :$MOTO_PORT"
"$PY" "$HERE/cluster.py" create-topic

# kcat (librdkafka 2.0.2) lists all three brokers, and the topic's leaders on more than one of them.
deadline=$(( $(date +%s) + 30 ))
until leaders="$(kcat -b "$BOOTSTRAP" -L -t "$TOPIC" 2>/dev/null | grep -o 'leader [0-9]*' | sort -u | wc -l)" &&
  [ "$leaders" -ge 2 ] && [ "$(kcat -b "$BOOTSTRAP" -L 2>/dev/null | grep -c '^  broker ')" -eq 3 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "kcat -L does not show 3 brokers and spread leaders" >&2; kcat -b "$BOOTSTRAP" -L >&2; exit 1; }
  sleep 0.5
done
echo "== kcat -L: 3 brokers, the leaders of $TOPIC on $leaders of them"

echo "== producing with the Java client and librdkafka"
STOP="$WORK/stop"
"${JAVA[@]}" produce "$BOOTSTRAP" "$TOPIC" "$PARTITIONS" "$STOP" "$WORK/java.acks" >"$WORK/java-producer.log" 2>&1 &
JAVA_PID=$!
PIDS+=($JAVA_PID)
"$PY" "$HERE/cluster.py" produce "$STOP" "$WORK/rdkafka.acks" >"$WORK/rdkafka-producer.log" 2>&1 &
RDKAFKA_PID=$!
PIDS+=($RDKAFKA_PID)

acks() { local n; n="$(grep -c '^ack' "$1" 2>/dev/null)"; echo "${n:-0}"; }
deadline=$(( $(date +%s) + 60 ))
until [ "$(acks "$WORK/java.acks")" -ge 500 ] && [ "$(acks "$WORK/rdkafka.acks")" -ge 500 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "producers did not get going" >&2; exit 1; }
  kill -0 "$JAVA_PID" && kill -0 "$RDKAFKA_PID" || { echo "a producer died" >&2; exit 1; }
  sleep 0.2
done

# A share group (KIP-932) reads along through the failover with Kafka 4.4's KafkaShareConsumer.
SHARE_STOP="$WORK/share-stop"
"${JAVA[@]}" share-consume "$BOOTSTRAP" "$TOPIC" cluster-share "$SHARE_STOP" "$WORK/share.dump" \
  >"$WORK/java-share-consumer.log" 2>&1 &
SHARE_PID=$!
PIDS+=($SHARE_PID)
deadline=$(( $(date +%s) + 60 ))
until [ "$(wc -l <"$WORK/share.dump" 2>/dev/null || echo 0)" -ge 500 ]; do
  [ "$(date +%s)" -lt "$deadline" ] || { echo "the share consumer did not get going" >&2; exit 1; }
  kill -0 "$SHARE_PID" || { echo "the share consumer died" >&2; exit 1; }
  sleep 0.2
done

VICTIM="$("$PY" "$HERE/cluster.py" leader 0)"
echo "== broker $VICTIM leads partition 0: kill -9, and its data directory goes"
KILLED_AT="$(date +%s%3N)"
kill -KILL "${BROKER_PIDS[$VICTIM]}"
wait "${BROKER_PIDS[$VICTIM]}" 2>/dev/null || true
rm -rf "$WORK/data-$VICTIM"
unset "BROKER_PORTS[$VICTIM]"
export BOOTSTRAP="$(bootstrap)"

sleep 10
touch "$STOP"
wait "$JAVA_PID" || { echo "the Java producer failed" >&2; exit 1; }
wait "$RDKAFKA_PID" || { echo "the librdkafka producer failed" >&2; exit 1; }

echo "== reading everything back (Java consumer, librdkafka consumer) from the survivors"
"${JAVA[@]}" consume "$BOOTSTRAP" "$TOPIC" "$WORK/java.dump" 2>"$WORK/java-consumer.log"
"$PY" "$HERE/cluster.py" verify "$KILLED_AT" "$WORK/java.acks" "$WORK/rdkafka.acks" "$WORK/java.dump"

echo "== the share group's deliveries (Java KafkaShareConsumer, read across the kill)"
touch "$SHARE_STOP"
wait "$SHARE_PID" || { echo "the Java share consumer failed" >&2; exit 1; }
"$PY" "$HERE/cluster.py" share-verify "$WORK/java.dump" "$WORK/share.dump"

echo "== waiting for the write-ahead log to be collected once segments seal"
"$PY" "$HERE/cluster.py" wal-collected

rc=0
echo "cluster integration: ok in $(( $(date +%s) - started ))s"
