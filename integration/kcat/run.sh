#!/usr/bin/env bash
# kcat (Debian's 1.7.1 on librdkafka 2.0.2) against the strata broker.
#
#   integration/kcat/run.sh          # starts target/release/strata via ../lib.sh
#   BOOTSTRAP=host:port run.sh       # use an already running broker instead; it must
#                                    # auto-create topics with $KCAT_PARTITIONS partitions
#   KEEP_BROKER_DATA=1 run.sh        # keep the data dir + broker.log afterwards
#
# Every check compares kcat's output with the exact expected text. No consumer
# groups are used (no -G): consumers read explicit partitions/offsets.
# check_compaction starts a private broker (tiering every 50 ms) even when BOOTSTRAP is set,
# and creates its compacted topic with confluent-kafka's AdminClient (integration/install-deps.sh).
# Prints "N passed, M failed" at the end; exits non-zero if anything failed.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

command -v kcat >/dev/null 2>&1 || { echo "kcat is not installed (run integration/install-deps.sh)" >&2; exit 1; }

PARTS="${KCAT_PARTITIONS:-3}"
STARTED_BROKER=0
if [ -z "${BOOTSTRAP:-}" ]; then
  start_broker --auto-create-topics true --num-partitions "$PARTS" --log-level info
  STARTED_BROKER=1
fi
B="$BOOTSTRAP"
echo "kcat: $(kcat -V 2>&1 | grep -o 'Version [^ ]* .*librdkafka [0-9.]*' | head -1)"
echo "broker: $B"

RUN_ID="$(date +%s)-$$"
WORK="$(mktemp -d -t strata-kcat-XXXXXX)"
cleanup_all() { rm -rf "$WORK"; if [ "$STARTED_BROKER" = 1 ]; then stop_broker; fi; }
trap cleanup_all EXIT

# kcat with a bounded run time; a hung client is a failure, not a hung suite.
kc() { timeout 30 kcat -b "$B" -X socket.timeout.ms=10000 "$@"; }

topic() { echo "kcat-$1-$RUN_ID"; }

# produce LINES (stdin) to partition 0 of TOPIC with extra kcat args
produce() { local t="$1"; shift; kc -P -t "$t" -p 0 "$@"; }

# consume partition 0 of TOPIC from the beginning to the end with FORMAT
consume() { local t="$1" fmt="$2"; shift 2; kc -C -t "$t" -p 0 -e -q -o beginning -f "$fmt" "$@"; }

# expect_eq WHAT EXPECTED ACTUAL
expect_eq() {
  if [ "$2" != "$3" ]; then
    echo "  MISMATCH in $1:" >&2
    diff <(printf '%s\n' "$2") <(printf '%s\n' "$3") | head -n 24 | sed 's/^/    /' >&2 || true
    return 1
  fi
}

now_ms() { date +%s%3N; }

# ------------------------------------------------------------------ checks

check_metadata() {
  local t; t="$(topic meta)"
  printf 'x\n' | produce "$t"            # auto-creates the topic
  local md; md="$(kc -L -t "$t")"
  echo "$md" | grep -q "^ 1 brokers:$" || { echo "  expected exactly 1 broker:"; echo "$md"; return 1; } >&2
  local bid
  bid="$(echo "$md" | sed -n "s|^  broker \([0-9-]*\) at $B.*|\1|p")"
  [ -n "$bid" ] || { echo "  broker $B not listed:"; echo "$md"; return 1; } >&2
  local expected actual
  expected="$(printf '  topic "%s" with %s partitions:\n' "$t" "$PARTS"
              for ((p = 0; p < PARTS; p++)); do
                printf '    partition %d, leader %s, replicas: %s, isrs: %s\n' "$p" "$bid" "$bid" "$bid"
              done)"
  actual="$(echo "$md" | sed -n '/^  topic "/,$p')"
  expect_eq "kcat -L -t $t" "$expected" "$actual"

  # JSON metadata for the whole cluster also lists the topic
  kc -L -J >"$WORK/md.json"
  python3 - "$WORK/md.json" "$t" "$B" "$PARTS" <<'EOF'
import json, sys
md = json.load(open(sys.argv[1])); t, b, n = sys.argv[2], sys.argv[3], int(sys.argv[4])
assert [x["name"] for x in md["brokers"]] == [b], md["brokers"]
bid = md["brokers"][0]["id"]
assert md["controllerid"] == bid, md
(top,) = [x for x in md["topics"] if x["topic"] == t]
assert "error" not in top, top
parts = sorted(top["partitions"], key=lambda p: p["partition"])
assert [p["partition"] for p in parts] == list(range(n)), parts
for p in parts:
    assert p["leader"] == bid and p["replicas"] == [{"id": bid}] and p["isrs"] == [{"id": bid}], p
EOF
}

check_keyed() {
  local t; t="$(topic keyed)"
  printf 'k1:v1\nk2:v2\nk3:v3 with spaces\nk4:v:with:colons\n' | produce "$t" -K:
  expect_eq "keyed consume" \
"k1=v1  0
k2=v2  1
k3=v3 with spaces  2
k4=v:with:colons  3" \
    "$(consume "$t" '%k=%s %h %o\n')"
}

check_headers() {
  local t; t="$(topic headers)"
  printf 'a:1\n' | produce "$t" -K:
  printf 'b:2\nc:3\n' | produce "$t" -K: -H h1=x -H h2=y
  printf 'd:4\n' | produce "$t" -K: -H dup=1 -H dup=2 -H empty=
  expect_eq "headers consume" \
"a=1  0
b=2 h1=x,h2=y 1
c=3 h1=x,h2=y 2
d=4 dup=1,dup=2,empty= 3" \
    "$(consume "$t" '%k=%s %h %o\n')"
  # the same through kcat's JSON output (headers as a flat [k, v, ...] list)
  kc -C -t "$t" -p 0 -e -q -o beginning -J >"$WORK/h.json"
  python3 - "$WORK/h.json" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
got = [(r["offset"], r["key"], r["payload"], r.get("headers")) for r in rows]
exp = [(0, "a", "1", None), (1, "b", "2", ["h1", "x", "h2", "y"]),
       (2, "c", "3", ["h1", "x", "h2", "y"]), (3, "d", "4", ["dup", "1", "dup", "2", "empty", ""])]
assert got == exp, got
assert all(r["tstype"] == "create" and r["ts"] > 0 for r in rows), rows
EOF
}

gen_lines() { # gen_lines CODEC COUNT -> "CODEC-key-i:value i <padding>"
  local z="$1" n="$2" i
  for ((i = 0; i < n; i++)); do
    printf '%s-key-%d:value %d %s\n' "$z" "$i" "$i" "$(printf 'compress-me-%.0s' $(seq 1 $((i % 7 + 1))))"
  done
}

check_codecs() {
  local mixed; mixed="$(topic codec-mixed)"
  local expected_mixed="" off=0 z rc=0
  for z in gzip snappy lz4 zstd; do
    local t; t="$(topic "codec-$z")"
    gen_lines "$z" 60 | produce "$t" -K: -z "$z"
    gen_lines "$z" 60 | produce "$mixed" -K: -z "$z"
    local expected
    expected="$(gen_lines "$z" 60 | awk -F: '{k=$1; sub(/^[^:]*:/, ""); printf "%s=%s %d\n", k, $0, NR-1}')"
    expect_eq "codec $z" "$expected" "$(consume "$t" '%k=%s %o\n')" || rc=1
    expected_mixed+="$(gen_lines "$z" 60 | awk -F: -v o="$off" '{k=$1; sub(/^[^:]*:/, ""); printf "%s=%s %d\n", k, $0, o+NR-1}')"$'\n'
    off=$((off + 60))
  done
  expect_eq "mixed codecs in one partition" "${expected_mixed%$'\n'}" "$(consume "$mixed" '%k=%s %o\n')" || rc=1
  # start in the middle of a compressed batch
  expect_eq "mid-batch start (lz4 part of mixed)" \
    "$(printf '%s\n' "${expected_mixed%$'\n'}" | sed -n '131,240p')" \
    "$(kc -C -t "$mixed" -p 0 -e -q -o 130 -f '%k=%s %o\n')" || rc=1
  return $rc
}

check_tombstones() {
  local t; t="$(topic tomb)"
  printf 'live:v\n' | produce "$t" -K:
  printf 'tomb:\n' | produce "$t" -K: -Z          # empty value -> NULL value (tombstone)
  printf ':nokey\n' | produce "$t" -K: -Z         # empty key -> NULL key
  printf 'empty:\n' | produce "$t" -K:            # without -Z: empty, not null
  # %S/%K print the value/key length, -1 for NULL
  expect_eq "null key / tombstone" \
"live=v|1|4 0
tomb=|-1|4 1
=nokey|5|-1 2
empty=|0|5 3" \
    "$(consume "$t" '%k=%s|%S|%K %o\n')"
}

check_relative_offset() {
  local t; t="$(topic relative)"
  printf 'm0\nm1\nm2\nm3\nm4\n' | produce "$t"
  expect_eq "-o -2" "3 m3
4 m4" "$(kc -C -t "$t" -p 0 -e -q -o -2 -f '%o %s\n')"
  expect_eq "-o 1 -c 2" "1 m1
2 m2" "$(kc -C -t "$t" -p 0 -e -q -o 1 -c 2 -f '%o %s\n')"
  expect_eq "-o end" "" "$(kc -C -t "$t" -p 0 -e -q -o end -f '%o %s\n')"
}

check_timestamps() {
  local t; t="$(topic ts)"
  printf 'old0\nold1\n' | produce "$t"
  local last_old ts
  last_old="$(consume "$t" '%T\n' | tail -1)"
  ts=$((last_old + 1))
  # wait (bounded) until the wall clock is past ts so the next batch is newer
  local deadline=$(( $(now_ms) + 5000 ))
  while [ "$(now_ms)" -le "$ts" ]; do [ "$(now_ms)" -lt "$deadline" ] || return 1; done
  printf 'new2\nnew3\n' | produce "$t"

  expect_eq "-o s@ts" "2 new2
3 new3" "$(kc -C -t "$t" -p 0 -e -q -o "s@$ts" -f '%o %s\n')"
  expect_eq "-o s@first" "0 old0
1 old1
2 new2
3 new3" "$(kc -C -t "$t" -p 0 -e -q -o "s@$((last_old - 60000))" -f '%o %s\n')"
  expect_eq "-Q ts" "$t [0] offset 2" "$(kc -Q -t "$t:0:$ts")"
  expect_eq "-Q old ts" "$t [0] offset 0" "$(kc -Q -t "$t:0:$((last_old - 60000))")"
  expect_eq "-Q future ts" "$t [0] offset -1" "$(kc -Q -t "$t:0:$((ts + 3600000))")"
  expect_eq "-Q -1 (latest)" "$t [0] offset 4" "$(kc -Q -t "$t:0:-1")"
  expect_eq "-Q -2 (earliest)" "$t [0] offset 0" "$(kc -Q -t "$t:0:-2")"
}

check_all_partitions() {
  local t; t="$(topic parts)"
  local i lines=""
  for ((i = 0; i < 30; i++)); do lines+="key$((i % 6)):val$i"$'\n'; done
  printf '%s' "$lines" | kc -P -t "$t" -K:       # default partitioner spreads keys
  local out; out="$(kc -C -t "$t" -e -q -o beginning -f '%p %k %s\n')"
  expect_eq "all records across partitions" \
    "$(printf '%s' "$lines" | sed 's/:/ /' | sort)" "$(echo "$out" | cut -d' ' -f2- | sort)"
  # each key lives in exactly one partition, in produce order
  python3 - "$PARTS" <<EOF
import collections
rows = [l.split(" ") for l in """$out""".strip().splitlines()]
parts = collections.defaultdict(set); order = collections.defaultdict(list)
for p, k, v in rows:
    parts[k].add(int(p)); order[k].append(int(v[3:]))
assert all(len(s) == 1 for s in parts.values()), dict(parts)
assert all(v == sorted(v) for v in order.values()), dict(order)
assert all(0 <= min(s) < $PARTS for s in parts.values())
EOF
}

# Leveled streaming compaction of tiered segments, seen through kcat. A private broker (the
# shared one may be external and tiers at the default pace) tiers every 50 ms and deletes
# swapped-out merge sources after 100 ms; the topic (created with confluent-kafka's
# AdminClient, from install-deps.sh: kcat cannot set topic configs) is compacted with tiny
# segments and fan-out 2. Many versions of few keys are produced in several kcat runs, then
# `strata levels` is polled until the merges have settled, and a read from the beginning must
# show gaps, every record at the offset it was produced at, and the newest value of every key.
check_compaction() {
  python3 -c 'import confluent_kafka' 2>/dev/null \
    || { echo "  confluent-kafka is not installed (run integration/install-deps.sh)" >&2; return 1; }
  start_broker --auto-create-topics false --tier-interval-ms 50 --compaction-delete-delay-ms 100 \
    --log-level info
  # (runs in the check's subshell: replaces the EXIT trap there, not the suite's)
  trap 'rc=$?; if [ $rc != 0 ]; then echo "  --- compaction broker log (tail) ---" >&2;
        tail -n 30 "$BROKER_DATA/broker.log" | sed "s/^/    /" >&2; fi; stop_broker' EXIT
  B="$BOOTSTRAP"
  local t; t="$(topic compact)"
  python3 - "$B" "$t" <<'EOF'
import sys
from confluent_kafka.admin import AdminClient, NewTopic
b, t = sys.argv[1], sys.argv[2]
cfg = {"cleanup.policy": "compact", "segment.bytes": "3000", "segment.ms": "300",
       "min.compaction.lag.ms": "0", "delete.retention.ms": "0", "strata.compaction.fanout": "2"}
admin = AdminClient({"bootstrap.servers": b})  # (kept alive until the future resolves)
admin.create_topics([NewTopic(t, 1, 1, config=cfg)], request_timeout=15)[t].result(timeout=20)
EOF
  # 20 keys x 40 versions = 800 records in 4 kcat runs; record n lands at offset n.
  local keys=20 versions=40 runs=4 r v k
  : >"$WORK/produced"
  for ((r = 0; r < runs; r++)); do
    for ((v = r * versions / runs; v < (r + 1) * versions / runs; v++)); do
      for ((k = 0; k < keys; k++)); do printf 'key%d:v%d-key%d\n' "$k" "$v" "$k"; done
    done >"$WORK/run$r"
    produce "$t" -K: <"$WORK/run$r"
    cat "$WORK/run$r" >>"$WORK/produced"
    sleep 0.4   # past segment.ms, so the next run starts a new segment
  done
  local total=$((keys * versions))

  # wait until every produced offset is tiered, some segment reached level >= 1 and the
  # policy has no merge left to run
  local report="" deadline=$(( $(now_ms) + 60000 ))
  while :; do
    report="$("$STRATA_BIN" levels "$t" --data-dir "$BROKER_DATA" 2>&1)" || true
    if grep -q "offsets 0\.\.$total, .*next merge: none" <<<"$report" \
       && grep -Eq '^  L([1-9]|[1-9][0-9]+): [1-9][0-9]* segments' <<<"$report"; then
      break
    fi
    if [ "$(now_ms)" -ge "$deadline" ]; then
      echo "  compaction did not settle within 60 s; strata levels:" >&2
      echo "$report" | sed 's/^/    /' >&2
      return 1
    fi
    sleep 0.2
  done
  echo "$report" | sed 's/^/    /'

  consume "$t" '%o %k %s\n' >"$WORK/consumed"
  python3 - "$WORK/produced" "$WORK/consumed" <<'EOF'
import sys
produced = [l.rstrip("\n").split(":", 1) for l in open(sys.argv[1])]
rows = [l.rstrip("\n").split(" ", 2) for l in open(sys.argv[2]) if l.strip()]
got = [(int(o), k, v) for o, k, v in rows]
offs = [o for o, _, _ in got]
assert got, "nothing consumed"
bad = [(a, b) for a, b in zip(offs, offs[1:]) if b <= a]
assert not bad, f"offsets not strictly increasing: {bad[:5]}"
assert len(got) < len(produced), f"no gaps: read {len(got)} of {len(produced)} records"
wrong = [(o, k, v, produced[o]) for o, k, v in got if o >= len(produced) or produced[o] != [k, v]]
assert not wrong, f"records not at the offset they were produced at: {wrong[:5]}"
last_produced = dict(produced)
last_seen = {k: v for _, k, v in got}
assert last_seen == last_produced, \
    f"newest values differ: {sorted(set(last_produced.items()) ^ set(last_seen.items()))[:10]}"
print(f"    read {len(got)} of {len(produced)} records, offsets {offs[0]}..{offs[-1]}")
EOF
}

# Transactions produced with confluent-kafka (commit, abort, and one left open) read by kcat:
# read_committed ends at the open transaction (-e stops at the LSO) and skips the aborted one;
# read_uncommitted reads everything; after the commit read_committed reads the rest.
check_transactions() {
  python3 -c 'import confluent_kafka' 2>/dev/null \
    || { echo "  confluent-kafka is not installed (run integration/install-deps.sh)" >&2; return 1; }
  local t; t="$(topic txn)"
  python3 - "$B" "$t" <<'EOF'
import subprocess, sys, time
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
b, t = sys.argv[1], sys.argv[2]
admin = AdminClient({"bootstrap.servers": b})  # (kept alive until the future resolves)
admin.create_topics([NewTopic(t, 1, 1)])[t].result(timeout=20)

def kcat(isolation):
    out = subprocess.run(["timeout", "30", "kcat", "-b", b, "-C", "-t", t, "-p", "0", "-e", "-q",
                          "-o", "beginning", "-f", "%s\n", "-X", f"isolation.level={isolation}"],
                         check=True, capture_output=True, text=True).stdout
    return out.split()

def expect(isolation, want, when):
    # (retried for a while: the markers that move the LSO follow EndTxn's answer)
    deadline = time.monotonic() + 15
    while (got := kcat(isolation)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == want, f"{isolation} {when}: {got}"

p = Producer({"bootstrap.servers": b, "transactional.id": "kcat-" + t})
p.init_transactions(20)
for prefix, commit in (("c1", True), ("aborted", False), ("open", None)):
    p.begin_transaction()
    for i in range(5):
        p.produce(t, value=f"{prefix}-{i}".encode(), partition=0)
    p.flush(20)
    if commit is True:
        p.commit_transaction(20)
    elif commit is False:
        p.abort_transaction(20)
c1 = [f"c1-{i}" for i in range(5)]
aborted = [f"aborted-{i}" for i in range(5)]
opened = [f"open-{i}" for i in range(5)]
expect("read_committed", c1, "with a transaction open")
expect("read_uncommitted", c1 + aborted + opened, "with a transaction open")
p.commit_transaction(20)
expect("read_committed", c1 + opened, "after the commit")
print(f"    read_committed {len(c1 + opened)} records, read_uncommitted {len(c1 + aborted + opened)}")
EOF
}

# ------------------------------------------------------------------ runner

PASSED=0
FAILED=0
FAILED_NAMES=()
for check in check_metadata check_keyed check_headers check_codecs check_tombstones \
             check_relative_offset check_timestamps check_all_partitions check_compaction \
             check_transactions; do
  t0="$(now_ms)"
  set +e
  ( set -e; "$check" )
  rc=$?
  set -e
  took="$(( $(now_ms) - t0 ))ms"
  if [ "$rc" = 0 ]; then
    echo "PASS $check ($took)"; PASSED=$((PASSED + 1))
  else
    echo "FAIL $check (rc=$rc, $took)"; FAILED=$((FAILED + 1)); FAILED_NAMES+=("$check")
  fi
done

if [ "$FAILED" != 0 ] && [ -n "${BROKER_DATA:-}" ] && [ -f "$BROKER_DATA/broker.log" ]; then
  echo "--- last broker log lines ($BROKER_DATA/broker.log) ---" >&2
  tail -n 40 "$BROKER_DATA/broker.log" >&2
fi
echo "kcat: $PASSED passed, $FAILED failed"
[ "$FAILED" = 0 ]
