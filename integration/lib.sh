#!/usr/bin/env bash
# Shared helpers for integration scripts: start the built strata binary on a free
# port with a throwaway data directory, and stop it when the script exits.
#
#   source "$(dirname "$0")/../lib.sh"   (or the right relative path)
#   start_broker            # sets BOOTSTRAP=127.0.0.1:PORT, BROKER_PID, BROKER_DATA
#   ... run clients against $BOOTSTRAP ...
#
# STRATA_BIN overrides the binary (default: target/release/strata of this repo).

INTEGRATION_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(cd "$INTEGRATION_ROOT/.." && pwd)"
STRATA_BIN="${STRATA_BIN:-$REPO_ROOT/target/release/strata}"

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

start_broker() {
  [ -x "$STRATA_BIN" ] || { echo "strata binary not found at $STRATA_BIN (cargo build --release)" >&2; return 1; }
  local port
  port="$(free_port)"
  BROKER_DATA="$(mktemp -d -t strata-it-XXXXXX)"
  BOOTSTRAP="127.0.0.1:$port"
  "$STRATA_BIN" serve --listen "$BOOTSTRAP" --advertised-listener "$BOOTSTRAP" \
    --data-dir "$BROKER_DATA" "$@" >"$BROKER_DATA/broker.log" 2>&1 &
  BROKER_PID=$!
  trap stop_broker EXIT
  wait_started "$port" 100
}

# wait_started PORT TENTHS: until the broker accepts on PORT (then exports
# BOOTSTRAP, BROKER_PID and BROKER_DATA), for at most TENTHS tenths of a second.
wait_started() {
  for _ in $(seq 1 "$2"); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then
      export BOOTSTRAP BROKER_PID BROKER_DATA
      return 0
    fi
    kill -0 "$BROKER_PID" 2>/dev/null || break
    sleep 0.1
  done
  echo "broker did not start; log:" >&2
  cat "$BROKER_DATA/broker.log" >&2
  return 1
}

stop_broker() {
  if [ -n "${BROKER_PID:-}" ] && kill -0 "$BROKER_PID" 2>/dev/null; then
    kill -TERM "$BROKER_PID" 2>/dev/null || true
    for _ in $(seq 1 100); do   # up to 10s for a clean shutdown, then SIGKILL
      kill -0 "$BROKER_PID" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$BROKER_PID" 2>/dev/null || true
    # (|| true: callers run under set -e, and wait returns the broker's exit status)
    wait "$BROKER_PID" 2>/dev/null || true
  fi
  if [ -n "${BROKER_DATA:-}" ] && [ -d "$BROKER_DATA" ]; then
    if [ "${KEEP_BROKER_DATA:-0}" = 1 ]; then
      echo "broker data kept in $BROKER_DATA" >&2
    else
      rm -rf "$BROKER_DATA"
    fi
  fi
}

# Apache Kafka 4.4's jars, from integration/java's Maven project.
kafka_classpath() {
  (cd "$INTEGRATION_ROOT/java" && mvn -B -ntp -q package -DskipTests &&
    mvn -B -ntp -q dependency:build-classpath -Dmdep.includeScope=test -Dmdep.outputFile=target/kafka.classpath)
  echo "$(cat "$INTEGRATION_ROOT/java/target/kafka.classpath"):$INTEGRATION_ROOT/java/target/lib/*"
}

# start_kafka_broker [PROPERTY=VALUE...]: Apache Kafka 4.4 (one combined broker
# and controller, node KAFKA_NODE_ID, default 1) instead of Strata, to run a
# third-party suite against both; sets the same variables as start_broker,
# and stop_broker stops it.
start_kafka_broker() {
  local port cport cp node="${KAFKA_NODE_ID:-1}"
  KAFKA_CLASSPATH="${KAFKA_CLASSPATH:-$(kafka_classpath)}"  # built once per script
  cp="$KAFKA_CLASSPATH"
  port="$(free_port)"
  cport="$(free_port)"
  BROKER_DATA="$(mktemp -d -t kafka-it-XXXXXX)"
  BOOTSTRAP="127.0.0.1:$port"
  {
    cat <<PROPS
process.roles=broker,controller
node.id=$node
controller.quorum.voters=$node@127.0.0.1:$cport
listeners=PLAINTEXT://$BOOTSTRAP,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://$BOOTSTRAP
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs=$BROKER_DATA/log
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
PROPS
    printf '%s\n' "$@"
  } >"$BROKER_DATA/server.properties"
  java -cp "$cp" kafka.tools.StorageTool format -t "$(java -cp "$cp" kafka.tools.StorageTool random-uuid)" \
    -c "$BROKER_DATA/server.properties" >"$BROKER_DATA/format.log" 2>&1
  java -Xmx1g -cp "$cp" kafka.Kafka "$BROKER_DATA/server.properties" >"$BROKER_DATA/broker.log" 2>&1 &
  BROKER_PID=$!
  trap stop_broker EXIT
  wait_started "$port" 600
}
