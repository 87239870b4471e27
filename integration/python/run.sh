#!/usr/bin/env bash
# Run the Python client integration tests (confluent-kafka, kafka-python, aiokafka).
#
#   integration/python/run.sh [pytest args...]
#
# Without BOOTSTRAP set, conftest.py starts target/release/strata itself (free
# port, temp data dir; KEEP_BROKER_DATA=1 keeps it). With BOOTSTRAP=host:port the
# tests use that broker (it should auto-create topics with 1 partition).
# Set INSTALL_DEPS=1 to run ../install-deps.sh first.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
if [ "${INSTALL_DEPS:-0}" = 1 ]; then
  "$HERE/../install-deps.sh"
fi
cd "$HERE"
exec "${PYTHON:-python3}" -m pytest "$@"
