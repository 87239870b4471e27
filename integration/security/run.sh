#!/usr/bin/env bash
# Security listeners against third-party clients: kcat (librdkafka 2.0.2), confluent-kafka (Python),
# the Java client (kafka-console-producer/-consumer) and Kafka's CLI (kafka-topics.sh --command-config,
# kafka-configs.sh for SCRAM credentials), all run from the jars of integration/java.
#
#   integration/security/run.sh
#
# One broker with four listeners: PLAINTEXT, SASL_PLAINTEXT (PLAIN), SASL_SSL (SCRAM-SHA-256/512)
# and SSL with required client certificates (mTLS). Certificates are made here with openssl: a CA,
# the broker's certificate, a client certificate signed by the CA and one signed by another CA.
# Checks: credentials created with kafka-configs.sh, round trips over every protocol with every
# client, a wrong password refused with SASL_AUTHENTICATION_FAILED, an untrusted certificate and a
# missing one refused, requests before authentication closing the connection, Metadata answering
# with the listener the client came through, credentials surviving kill -9, and the SSL listener's
# keystore rotated with kafka-configs.sh while a connection opened before keeps working. Delegation
# tokens: the Java 4.4 AdminClient creates, describes, renews and expires one and a producer and
# consumer authenticate with it (SCRAM, tokenauth=true; DelegationTokens.java);
# kafka-delegation-tokens.sh does the same from the command line, and a token survives kill -9.
# Prints "N passed, M failed" at the end; exits non-zero if anything failed.
set -uo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

WORK="$(mktemp -d -t strata-sec-XXXXXX)"
BROKER_PID=""
cleanup() {
  [ -n "$BROKER_PID" ] && kill -KILL "$BROKER_PID" 2>/dev/null
  wait 2>/dev/null
  if [ "${KEEP_BROKER_DATA:-0}" = 1 ]; then echo "kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

passed=0
failed=0
check() {
  local name="$1"
  shift
  if "$@" >"$WORK/check.log" 2>&1; then
    passed=$((passed + 1))
    echo "ok   $name"
  else
    failed=$((failed + 1))
    echo "FAIL $name"
    sed 's/^/     /' "$WORK/check.log" | tail -n 30
  fi
}

# ------------------------------------------------------------------ certificates
cd "$WORK"
mkcert() { # NAME SUBJECT CA EXT
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$2" 2>/dev/null
  openssl x509 -req -in "$1.csr" -CA "$3.pem" -CAkey "$3.key" -CAcreateserial -out "$1.pem" \
    -days 2 -extfile <(printf '%s\n' "$4") 2>/dev/null
}
for ca in ca rogue-ca; do
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$ca.key" -out "$ca.pem" -days 2 \
    -subj "/CN=strata test $ca" 2>/dev/null
done
mkcert server "/CN=localhost" ca \
  "subjectAltName=DNS:localhost,IP:127.0.0.1
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
CLIENT_EXT="basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
mkcert client "/C=US/O=Strata/OU=it/CN=client-1" ca "$CLIENT_EXT"
mkcert rogue "/CN=rogue" rogue-ca "$CLIENT_EXT"
# Java's PEM keystore: the key and its chain in one file.
cat client.key client.pem >client-keystore.pem
cat rogue.key rogue.pem >rogue-keystore.pem
cd - >/dev/null

# ------------------------------------------------------------------ broker
P_PLAIN=$(free_port); P_SASL=$(free_port); P_SASL_SSL=$(free_port); P_SSL=$(free_port)
DATA="$WORK/data"
broker_args=(serve --data-dir "$DATA" --log-level info
  --listener "PLAINTEXT://127.0.0.1:$P_PLAIN" --listener "SASL_PLAINTEXT://127.0.0.1:$P_SASL"
  --listener "SASL_SSL://127.0.0.1:$P_SASL_SSL" --listener "SSL://127.0.0.1:$P_SSL"
  --ssl-cert-file "$WORK/server.pem" --ssl-key-file "$WORK/server.key" --ssl-ca-file "$WORK/ca.pem"
  --ssl-client-auth required --connection-failed-authentication-delay-ms 300
  --add-scram 'SCRAM-SHA-512=[name=admin,password=admin-secret]'
  --add-scram 'SCRAM-SHA-512=[name=bob,password=bob-secret]'
  --delegation-token-secret-key 'security-suite-token-secret')
start() {
  "$STRATA_BIN" "${broker_args[@]}" >>"$WORK/broker.log" 2>&1 &
  BROKER_PID=$!
  for _ in $(seq 1 100); do
    (exec 3<>"/dev/tcp/127.0.0.1/$P_SSL") 2>/dev/null && return 0
    sleep 0.1
  done
  echo "broker did not start" >&2; tail -20 "$WORK/broker.log" >&2; exit 1
}
start
echo "broker: PLAINTEXT $P_PLAIN, SASL_PLAINTEXT $P_SASL, SASL_SSL $P_SASL_SSL, SSL $P_SSL"

# ------------------------------------------------------------------ client configs
SASL_SSL_512=(-X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-512 -X ssl.ca.location="$WORK/ca.pem")
SSL_OK=(-X security.protocol=SSL -X ssl.ca.location="$WORK/ca.pem"
  -X ssl.certificate.location="$WORK/client.pem" -X ssl.key.location="$WORK/client.key")
kc() { timeout 30 kcat -X socket.timeout.ms=10000 "$@"; }

cat >"$WORK/admin.properties" <<P
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="admin" password="admin-secret";
ssl.truststore.type=PEM
ssl.truststore.location=$WORK/ca.pem
P
cat >"$WORK/alice-scram.properties" <<P
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-512
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="alice" password="alice-secret";
ssl.truststore.type=PEM
ssl.truststore.location=$WORK/ca.pem
P
sed 's/alice-secret/not-her-password/' "$WORK/alice-scram.properties" >"$WORK/alice-wrong.properties"
cat >"$WORK/alice-plain.properties" <<P
security.protocol=SASL_PLAINTEXT
sasl.mechanism=PLAIN
sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required username="alice" password="alice-secret";
P
cat >"$WORK/mtls.properties" <<P
security.protocol=SSL
ssl.truststore.type=PEM
ssl.truststore.location=$WORK/ca.pem
ssl.keystore.type=PEM
ssl.keystore.location=$WORK/client-keystore.pem
P
sed 's/client-keystore/rogue-keystore/' "$WORK/mtls.properties" >"$WORK/rogue.properties"
printf 'default.api.timeout.ms=15000\nrequest.timeout.ms=5000\n' >>"$WORK/rogue.properties"

# ------------------------------------------------------------------ Java tools
JAVA_LIB="$HERE/target/lib"
if [ ! -d "$JAVA_LIB" ] || [ "$HERE/pom.xml" -nt "$JAVA_LIB" ]; then
  rm -rf "$JAVA_LIB"
  (cd "$HERE" && mvn -B -ntp -q package | sed 's/\x1b\[0m//g') || { echo "resolving Kafka's tools failed" >&2; exit 1; }
fi
java_tool() { # CLASS ARGS...
  timeout 60 java -Dlog4j2.level=warn -cp "$JAVA_LIB/*" "$@"
}
kafka_configs() { java_tool org.apache.kafka.tools.ConfigCommand "$@"; }
kafka_topics() { java_tool org.apache.kafka.tools.TopicCommand "$@"; }

# ------------------------------------------------------------------ checks
configs_add_alice() {
  kafka_configs --bootstrap-server "127.0.0.1:$P_PLAIN" --alter \
    --add-config 'SCRAM-SHA-256=[iterations=8192,password=alice-secret],SCRAM-SHA-512=[password=alice-secret]' \
    --entity-type users --entity-name alice
  # (kafka-configs.sh --describe of users also asks for client quotas, which this broker does not
  # serve yet; the credentials are described with confluent-kafka's AdminClient instead.)
  python3 - "$WORK" "$P_SASL_SSL" <<'PY'
import sys
from confluent_kafka.admin import AdminClient, ScramMechanism
work, port = sys.argv[1:]
a = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "admin", "sasl.password": "admin-secret",
    "ssl.ca.location": f"{work}/ca.pem"})
got = a.describe_user_scram_credentials(["alice"])["alice"].result(timeout=20)
infos = sorted((i.mechanism.value, i.iterations) for i in got.scram_credential_infos)
print(infos)
assert infos == [(ScramMechanism.SCRAM_SHA_256.value, 8192), (ScramMechanism.SCRAM_SHA_512.value, 4096)], infos
PY
}
check "kafka-configs.sh adds SCRAM credentials; described over SASL_SSL as admin" configs_add_alice

no_password_at_rest() {
  ! grep -rq 'alice-secret\|admin-secret' "$DATA"
}
check "no password is written to the data directory" no_password_at_rest

kcat_round_trip() { # NAME ARGS... : produce 3 lines, read them back
  local t="sec-$1-$$"
  shift
  printf 'a\nb\nc\n' | kc -b "$BOOT" "$@" -P -t "$t" -p 0 || return 1
  local got
  got=$(kc -b "$BOOT" "$@" -C -t "$t" -p 0 -o beginning -e -q -f '%s\n')
  [ "$got" = $'a\nb\nc' ] || { echo "read back: $got"; return 1; }
}
BOOT="127.0.0.1:$P_SASL_SSL" check "kcat SASL_SSL SCRAM-SHA-512" kcat_round_trip k512 \
  "${SASL_SSL_512[@]}" -X sasl.username=alice -X sasl.password=alice-secret
BOOT="127.0.0.1:$P_SASL_SSL" check "kcat SASL_SSL SCRAM-SHA-256" kcat_round_trip k256 \
  -X security.protocol=SASL_SSL -X sasl.mechanisms=SCRAM-SHA-256 -X ssl.ca.location="$WORK/ca.pem" \
  -X sasl.username=alice -X sasl.password=alice-secret
BOOT="127.0.0.1:$P_SASL" check "kcat SASL_PLAINTEXT PLAIN" kcat_round_trip kplain \
  -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN -X sasl.username=alice -X sasl.password=alice-secret
BOOT="127.0.0.1:$P_SSL" check "kcat SSL with a trusted client certificate (mTLS)" kcat_round_trip kmtls "${SSL_OK[@]}"

kcat_refused() { # EXPECTED-STDERR-REGEX ARGS...
  local want="$1"
  shift
  if kc -b "$BOOT" "$@" -L -m 5 >"$WORK/kcat.out" 2>&1; then
    echo "kcat succeeded:"; cat "$WORK/kcat.out"; return 1
  fi
  cat "$WORK/kcat.out"
  grep -Eqi "$want" "$WORK/kcat.out"
}
BOOT="127.0.0.1:$P_SASL_SSL" check "kcat wrong SCRAM password: Authentication failed" kcat_refused \
  'Authentication failed' "${SASL_SSL_512[@]}" -X sasl.username=alice -X sasl.password=wrong
BOOT="127.0.0.1:$P_SASL" check "kcat wrong PLAIN password: Authentication failed" kcat_refused \
  'Authentication failed' -X security.protocol=SASL_PLAINTEXT -X sasl.mechanisms=PLAIN \
  -X sasl.username=alice -X sasl.password=wrong
BOOT="127.0.0.1:$P_SSL" check "kcat untrusted client certificate refused" kcat_refused \
  'SSL|handshake|certificate|Disconnected|transport' -X security.protocol=SSL -X ssl.ca.location="$WORK/ca.pem" \
  -X ssl.certificate.location="$WORK/rogue.pem" -X ssl.key.location="$WORK/rogue.key"
BOOT="127.0.0.1:$P_SSL" check "kcat without a client certificate refused (ssl.client.auth=required)" kcat_refused \
  'SSL|handshake|certificate|Disconnected|transport' -X security.protocol=SSL -X ssl.ca.location="$WORK/ca.pem"

metadata_per_listener() {
  local out
  for pair in "SASL_SSL:$P_SASL_SSL" "PLAINTEXT:$P_PLAIN"; do
    local port="${pair#*:}"
    if [ "${pair%%:*}" = SASL_SSL ]; then
      out=$(kc -b "127.0.0.1:$port" "${SASL_SSL_512[@]}" -X sasl.username=alice -X sasl.password=alice-secret -L)
    else
      out=$(kc -b "127.0.0.1:$port" -L)
    fi
    echo "$out" | grep 'broker 1 at' || return 1
    echo "$out" | grep -q "broker 1 at 127.0.0.1:$port" || return 1
  done
}
check "Metadata names the broker at the listener the client came through" metadata_per_listener

python_clients() {
  python3 - "$WORK" "$P_SASL_SSL" "$P_SASL" "$P_SSL" <<'PY'
import sys, uuid
from confluent_kafka import Producer, Consumer, KafkaException, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient
work, p_sasl_ssl, p_sasl, p_ssl = sys.argv[1:]
cases = {
    "SASL_SSL SCRAM-SHA-512": {"bootstrap.servers": f"127.0.0.1:{p_sasl_ssl}", "security.protocol": "SASL_SSL",
        "sasl.mechanisms": "SCRAM-SHA-512", "sasl.username": "alice", "sasl.password": "alice-secret",
        "ssl.ca.location": f"{work}/ca.pem"},
    "SASL_PLAINTEXT PLAIN": {"bootstrap.servers": f"127.0.0.1:{p_sasl}", "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN", "sasl.username": "alice", "sasl.password": "alice-secret"},
    "SSL mTLS": {"bootstrap.servers": f"127.0.0.1:{p_ssl}", "security.protocol": "SSL",
        "ssl.ca.location": f"{work}/ca.pem", "ssl.certificate.location": f"{work}/client.pem",
        "ssl.key.location": f"{work}/client.key"},
}
for name, conf in cases.items():
    topic = f"py-{uuid.uuid4().hex[:8]}"
    p = Producer(conf)
    errors = []
    for i in range(10):
        p.produce(topic, value=f"v{i}".encode(), partition=0, on_delivery=lambda e, m: e and errors.append(e))
    assert p.flush(30) == 0 and not errors, (name, errors)
    c = Consumer({**conf, "group.id": f"g-{topic}", "auto.offset.reset": "earliest", "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    got = []
    while len(got) < 10:
        m = c.poll(10)
        assert m is not None, (name, "timed out", got)
        assert m.error() is None, (name, m.error())
        got.append(m.value().decode())
    c.close()
    assert got == [f"v{i}" for i in range(10)], (name, got)
    print("ok", name)

def refused(conf, want):
    errs = []
    p = Producer({**conf, "error_cb": lambda e: errs.append(e)})
    for _ in range(40):
        p.poll(0.25)
        if errs:
            break
    codes = {e.code() for e in errs}
    assert want in codes, (want, errs)
    assert any("Authentication failed" in e.str() for e in errs), errs
    print("refused", [str(e) for e in errs][:1])

wrong = {**cases["SASL_SSL SCRAM-SHA-512"], "sasl.password": "wrong"}
refused(wrong, KafkaError._AUTHENTICATION)
wrong_plain = {**cases["SASL_PLAINTEXT PLAIN"], "sasl.password": "wrong"}
refused(wrong_plain, KafkaError._AUTHENTICATION)
rogue = {**cases["SSL mTLS"], "ssl.certificate.location": f"{work}/rogue.pem", "ssl.key.location": f"{work}/rogue.key"}
errs = []
a = AdminClient({**rogue, "error_cb": lambda e: errs.append(e)})
try:
    a.list_topics(timeout=5)
    raise SystemExit("rogue certificate accepted")
except KafkaException:
    pass
print("rogue certificate refused", [str(e) for e in errs][:1])
PY
}
check "confluent-kafka over SASL_SSL/SCRAM-SHA-512, SASL_PLAINTEXT/PLAIN and mTLS; wrong password and untrusted certificate refused" python_clients

topics_cli() { # PROPS PORT
  local t="cli-$(basename "$1" .properties)-$$"
  kafka_topics --bootstrap-server "127.0.0.1:$2" --command-config "$1" --create --topic "$t" --partitions 2 || return 1
  kafka_topics --bootstrap-server "127.0.0.1:$2" --command-config "$1" --list | grep -qx "$t"
}
check "kafka-topics.sh --command-config over SASL_SSL SCRAM-SHA-512" topics_cli "$WORK/alice-scram.properties" "$P_SASL_SSL"
check "kafka-topics.sh --command-config over SASL_PLAINTEXT PLAIN" topics_cli "$WORK/alice-plain.properties" "$P_SASL"
check "kafka-topics.sh --command-config over mTLS" topics_cli "$WORK/mtls.properties" "$P_SSL"

topics_cli_refused() { # PROPS PORT REGEX
  if kafka_topics --bootstrap-server "127.0.0.1:$2" --command-config "$1" --list >"$WORK/cli.out" 2>&1; then
    cat "$WORK/cli.out"; return 1
  fi
  grep -E "$3" "$WORK/cli.out" | head -3
}
check "kafka-topics.sh with a wrong password: SaslAuthenticationException" topics_cli_refused \
  "$WORK/alice-wrong.properties" "$P_SASL_SSL" 'SaslAuthenticationException|Authentication failed'
check "kafka-topics.sh with an untrusted certificate refused" topics_cli_refused \
  "$WORK/rogue.properties" "$P_SSL" 'SslAuthenticationException|SSL handshake failed|Failed to process post-handshake messages'

java_console() {
  local t="java-console-$$"
  seq 1 20 | java_tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "127.0.0.1:$P_SASL_SSL" \
    --command-config "$WORK/alice-scram.properties" --topic "$t" || return 1
  local got
  got=$(java_tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "127.0.0.1:$P_SASL_SSL" \
    --command-config "$WORK/alice-scram.properties" --topic "$t" --from-beginning --max-messages 20 --timeout-ms 20000)
  [ "$got" = "$(seq 1 20)" ] || { echo "got: $got"; return 1; }
}
check "Java client (console producer/consumer) over SASL_SSL SCRAM-SHA-512" java_console

before_auth_closes() {
  python3 - "$P_SASL" <<'PY'
import socket, struct, sys, time
port = int(sys.argv[1])
def frame(api_key, version, corr, body=b""):
    header = struct.pack(">hhih", api_key, version, corr, 4) + b"test"
    payload = header + body
    return struct.pack(">i", len(payload)) + payload
def read_frame(s):
    size = s.recv(4, socket.MSG_WAITALL)
    if len(size) < 4:
        return None
    return s.recv(struct.unpack(">i", size)[0], socket.MSG_WAITALL)
s = socket.create_connection(("127.0.0.1", port))
s.sendall(frame(18, 0, 1))                       # ApiVersions v0: answered
assert read_frame(s) is not None, "ApiVersions not answered"
s.sendall(frame(3, 0, 2, struct.pack(">i", -1)))  # Metadata v0 before authenticating
s.settimeout(5)
assert read_frame(s) is None, "Metadata answered before authentication"
print("Metadata before authentication: connection closed")
# A wrong PLAIN password: SASL_AUTHENTICATION_FAILED (58) after the configured delay, then closed.
s = socket.create_connection(("127.0.0.1", port))
mech = b"PLAIN"
s.sendall(frame(17, 1, 3, struct.pack(">h", len(mech)) + mech))
resp = read_frame(s)
assert struct.unpack(">h", resp[4:6])[0] == 0, resp
token = b"\0alice\0wrong"
t0 = time.monotonic()
s.sendall(frame(36, 1, 4, struct.pack(">i", len(token)) + token))
resp = read_frame(s)
elapsed = time.monotonic() - t0
code = struct.unpack(">h", resp[4:6])[0]
assert code == 58, code
assert elapsed >= 0.25, elapsed
assert read_frame(s) is None
print(f"wrong password: error 58 after {elapsed:.2f}s, connection closed")
PY
}
check "requests before authentication close the connection; failure answered after the delay" before_auth_closes

# Kafka 4.4's client jar for DelegationTokens.java (its dependencies are those of the tools above).
CLIENTS_44="$HERE/target/kafka-clients-4.4"
if [ ! -d "$CLIENTS_44" ]; then
  mvn -B -ntp -q dependency:copy -Dartifact=org.apache.kafka:kafka-clients:4.4.0 \
    -DoutputDirectory="$CLIENTS_44" | sed 's/\x1b\[0m//g'
fi
java_delegation_tokens() {
  timeout 120 java -Dlog4j2.level=warn -cp "$CLIENTS_44/*:$JAVA_LIB/*" "$HERE/DelegationTokens.java" \
    "127.0.0.1:$P_SASL_SSL" "127.0.0.1:$P_PLAIN" "$WORK/ca.pem"
}
check "Java 4.4 AdminClient: create/describe/renew/expire a delegation token; producer and consumer on it" \
  java_delegation_tokens

kafka_tokens() { java_tool org.apache.kafka.tools.DelegationTokenCommand \
  --bootstrap-server "127.0.0.1:$P_SASL_SSL" --command-config "$WORK/admin.properties" "$@"; }
token_properties() { # TOKENID HMAC FILE
  cat >"$3" <<P
security.protocol=SASL_SSL
sasl.mechanism=SCRAM-SHA-256
sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required username="$1" password="$2" tokenauth="true";
ssl.truststore.type=PEM
ssl.truststore.location=$WORK/ca.pem
P
}
produce_with() { # PROPS TOPIC
  seq 1 5 | java_tool org.apache.kafka.tools.ConsoleProducer --bootstrap-server "127.0.0.1:$P_SASL_SSL" \
    --command-config "$1" --topic "$2" --command-property max.block.ms=10000
}
round_trip_with() { # PROPS TOPIC: 5 lines produced and read back with these credentials
  produce_with "$1" "$2" || return 1
  local got
  got=$(java_tool org.apache.kafka.tools.consumer.ConsoleConsumer --bootstrap-server "127.0.0.1:$P_SASL_SSL" \
    --command-config "$1" --topic "$2" --from-beginning --max-messages 5 --timeout-ms 20000)
  [ "$got" = "$(seq 1 5)" ] || { echo "read back: $got"; return 1; }
}
cli_delegation_tokens() {
  kafka_tokens --create --max-life-time-period -1 --renewer-principal User:alice >"$WORK/token.out" || return 1
  cat "$WORK/token.out"
  read -r id hmac < <(grep -A2 '^TOKENID' "$WORK/token.out" | tail -1 | awk '{print $1, $2}')
  [ -n "$hmac" ] || return 1
  kafka_tokens --describe --owner-principal User:admin >"$WORK/describe.out" || return 1
  grep "^$id " "$WORK/describe.out" || return 1
  kafka_tokens --renew --hmac "$hmac" --renew-time-period 600000 || return 1
  token_properties "$id" "$hmac" "$WORK/token.properties"
  round_trip_with "$WORK/token.properties" "cli-token-$$" || return 1
  kafka_tokens --expire --hmac "$hmac" --expiry-time-period -1 || return 1
  # (The console producer only logs a failed send, to no logger here: kafka-topics.sh says why.)
  topics_cli_refused "$WORK/token.properties" "$P_SASL_SSL" 'SaslAuthenticationException|Authentication failed' ||
    return 1
  # One more, kept for the kill -9 check below.
  kafka_tokens --create --max-life-time-period -1 >"$WORK/token2.out" || return 1
  read -r id hmac < <(grep -A2 '^TOKENID' "$WORK/token2.out" | tail -1 | awk '{print $1, $2}')
  token_properties "$id" "$hmac" "$WORK/token2.properties"
}
check "kafka-delegation-tokens.sh --create/--describe/--renew/--expire; console producer on the token (SCRAM-SHA-256)" \
  cli_delegation_tokens

survives_kill9() {
  kill -KILL "$BROKER_PID"; wait "$BROKER_PID" 2>/dev/null
  start
  BOOT="127.0.0.1:$P_SASL_SSL" kcat_round_trip after-restart "${SASL_SSL_512[@]}" \
    -X sasl.username=alice -X sasl.password=alice-secret
}
check "SCRAM credentials survive kill -9" survives_kill9
token_survives_kill9() { round_trip_with "$WORK/token2.properties" "after-restart-token-$$"; }
check "a delegation token survives kill -9" token_survives_kill9

delete_credential() {
  kafka_configs --bootstrap-server "127.0.0.1:$P_SASL_SSL" --command-config "$WORK/admin.properties" \
    --alter --delete-config 'SCRAM-SHA-512' --entity-type users --entity-name alice || return 1
  BOOT="127.0.0.1:$P_SASL_SSL" kcat_refused 'Authentication failed' "${SASL_SSL_512[@]}" \
    -X sasl.username=alice -X sasl.password=alice-secret
}
check "a deleted SCRAM-SHA-512 credential no longer authenticates" delete_credential

# The SSL listener's certificate replaced without a restart (KIP-226's dynamic
# listener.name.ssl.ssl.keystore.location): same subject and names, signed by another CA.
rotate_keystore() {
  (cd "$WORK" && mkcert server2 "/CN=localhost" rogue-ca \
    "subjectAltName=DNS:localhost,IP:127.0.0.1
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth" && cat server2.key server2.pem >server2-keystore.pem) || return 1
  python3 - "$WORK" "$P_SSL" "$P_PLAIN" "$JAVA_LIB" <<'PY'
import subprocess, sys
from confluent_kafka import Producer, KafkaException
from confluent_kafka.admin import AdminClient
work, p_ssl, p_plain, lib = sys.argv[1:]
mtls = {"bootstrap.servers": f"127.0.0.1:{p_ssl}", "security.protocol": "SSL",
    "ssl.certificate.location": f"{work}/client.pem", "ssl.key.location": f"{work}/client.key"}
def configs(*args):
    return subprocess.run(["timeout", "60", "java", "-Dlog4j2.level=warn", "-cp", f"{lib}/*",
        "org.apache.kafka.tools.ConfigCommand", "--bootstrap-server", f"127.0.0.1:{p_plain}",
        "--entity-type", "brokers", "--entity-name", "1", *args], capture_output=True, text=True)
def connects(ca):
    try:
        AdminClient({**mtls, "ssl.ca.location": ca}).list_topics(timeout=8)
        return True
    except KafkaException:
        return False
# A producer whose connection is open before the rotation.
old = Producer({**mtls, "ssl.ca.location": f"{work}/ca.pem"})
old.produce("rotation", b"before", partition=0)
assert old.flush(30) == 0
bad = configs("--alter", "--add-config", "listener.name.ssl.ssl.keystore.location=/nonexistent.pem")
assert bad.returncode != 0, bad
print("unloadable keystore refused:", (bad.stderr + bad.stdout).strip().splitlines()[-1][:160])
assert connects(f"{work}/ca.pem"), "the old keystore stays after a refused change"
ok = configs("--alter", "--add-config",
    f"listener.name.ssl.ssl.keystore.type=PEM,listener.name.ssl.ssl.keystore.location={work}/server2-keystore.pem")
assert ok.returncode == 0, ok
assert connects(f"{work}/rogue-ca.pem"), "a new connection gets the new certificate"
assert not connects(f"{work}/ca.pem"), "the old certificate is no longer served"
old.produce("rotation", b"after", partition=0)
assert old.flush(30) == 0, "the connection opened before the rotation still works"
shown = configs("--describe")
assert f"listener.name.ssl.ssl.keystore.location={work}/server2-keystore.pem" in shown.stdout, shown
print("rotated: new handshakes served by the new certificate, the open connection kept")
PY
}
check "kafka-configs.sh rotates the SSL listener's keystore without a restart; open connections keep working" rotate_keystore

echo
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
