#!/usr/bin/env bash
# The chaos suite's CI entry: the checker's own tests, then one short run
# (90 s of faults, under 4 minutes in all) of 3 brokers on etcd and moto with
# the seeded nemesis; exits non-zero on any anomaly, printing the seed and how
# to replay it. CHAOS_SEED picks the seed (default 31, so that CI replays one
# known schedule; CHAOS_SEED=random draws one; scripts/chaos runs many),
# CHAOS_SECONDS the time under faults, CHAOS_STORE s3 (default) or file.
#
# Needs: etcd, moto[server], confluent-kafka, pytest (integration/install-deps.sh),
# and faketime for clock jumps (skipped with a note without it).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$HERE/../lib.sh"
PY="${PYTHON:-python3}"

for tool in etcd moto_server; do
  command -v "$tool" >/dev/null || { echo "$tool not found (integration/install-deps.sh)" >&2; exit 1; }
done
[ -x "$STRATA_BIN" ] || { echo "strata binary not found at $STRATA_BIN (cargo build --release)" >&2; exit 1; }

echo "== the checker on synthetic histories"
(cd "$HERE" && "$PY" -m pytest -q -p no:cacheprovider test_checker.py)

SECONDS_UNDER_FAULTS="${CHAOS_SECONDS:-90}"
echo "== a short chaos run ($SECONDS_UNDER_FAULTS s of faults)"
cd "$HERE"
seed_args=(--seed "${CHAOS_SEED:-31}")
[ "${CHAOS_SEED:-}" = random ] && seed_args=()
exec "$PY" chaos.py "${seed_args[@]}" --seconds "$SECONDS_UNDER_FAULTS" --store "${CHAOS_STORE:-s3}" \
  --binary "$STRATA_BIN" --deadline 225
