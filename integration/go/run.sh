#!/usr/bin/env bash
# franz-go (github.com/twmb/franz-go, its share consumer) against the strata broker:
# `go test` in this directory with BOOTSTRAP set.
#
#   integration/go/run.sh                  # starts target/release/strata via ../lib.sh
#   BOOTSTRAP=host:port run.sh             # use an already running broker instead
#   run.sh -run TestAReleased              # extra args go to `go test`
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=../lib.sh
source "$HERE/../lib.sh"

command -v go >/dev/null 2>&1 || { echo "go is not installed" >&2; exit 1; }
if [ -z "${BOOTSTRAP:-}" ]; then
  start_broker --log-level info
fi
cd "$HERE"
go test -count=1 -v -timeout 5m "$@" ./...
