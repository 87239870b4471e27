#!/usr/bin/env bash
# Idempotently install what the non-Java integration suites need:
#   - kcat (Debian package; bookworm ships kcat 1.7.1 on librdkafka 2.0.2, which is
#     deliberately the old client we want to stay compatible with)
#   - protoc (building etcd-client) and the etcd server (tests/cluster*.rs start a
#     real etcd per test, integration/cluster one for its 3 brokers), both Debian packages
#   - libssl-dev and pkg-config (librdkafka built with OpenSSL), libzstd-dev and
#     patch (the librdkafka 2.15 that integration/librdkafka builds its tests from)
#   - faketime (libfaketime, for the clock jumps of integration/chaos)
#   - the Python client libraries pinned in integration/python/requirements.txt
# The Java suite (integration/java) resolves its own dependencies through Maven.
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

SUDO=""
if [ "$(id -u)" != 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi

if ! command -v kcat >/dev/null 2>&1; then
  echo "installing kcat via apt" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq kcat >/dev/null
fi
kcat -V 2>&1 | grep -m1 -i 'librdkafka' >&2 || true

missing=()
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
# librdkafka's SSL and SCRAM (the rdkafka crate's `ssl` feature) link OpenSSL.
dpkg -s libssl-dev >/dev/null 2>&1 || missing+=(libssl-dev)
dpkg -s libzstd-dev >/dev/null 2>&1 || missing+=(libzstd-dev)
command -v patch >/dev/null 2>&1 || missing+=(patch)
# libfaketime: integration/chaos jumps one broker's wall clock (LD_PRELOAD).
dpkg -s libfaketime >/dev/null 2>&1 || missing+=(faketime)
command -v pkg-config >/dev/null 2>&1 || missing+=(pkg-config)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} via apt" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
etcd --version 2>&1 | head -1 >&2 || true

PY="${PYTHON:-python3}"
if ! "$PY" -m pip --version >/dev/null 2>&1; then
  echo "pip is not available for $PY" >&2
  exit 1
fi
# pip is a no-op when the pinned versions are already installed.
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore -r "$HERE/python/requirements.txt"
# moto's S3 server (with boto3) for integration/s3 and integration/cluster.
"$PY" -m pip install -q --disable-pip-version-check --root-user-action=ignore 'moto[server]==5.2.5'
echo "integration dependencies installed" >&2
