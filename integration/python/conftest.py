"""Shared fixtures for the Python client integration tests.

A session-scoped fixture starts the strata broker binary on a free loopback port
with a throwaway data directory, unless BOOTSTRAP is already set in the
environment (then that broker is used as is, e.g. one started by lib.sh).

Environment knobs:
  BOOTSTRAP         use an already running broker (host:port); BROKER_DATA may point
                    at its data dir so failures can show its broker.log
  STRATA_BIN        broker binary (default: <repo>/target/release/strata)
  KEEP_BROKER_DATA  1 = keep the data dir (and broker.log) after the session
  STRATA_ARGS       extra arguments for `strata serve`, split on whitespace
"""

import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
import uuid

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO_ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DEFAULT_BIN = os.path.join(REPO_ROOT, "target", "release", "strata")



def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def _wait_port(host, port, proc, deadline):
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return True
        except OSError:
            time.sleep(0.05)
    return False


class Broker:
    def __init__(self, bootstrap, data_dir=None, proc=None):
        self.bootstrap = bootstrap
        self.data_dir = data_dir
        self.proc = proc

    @property
    def host(self):
        return self.bootstrap.rsplit(":", 1)[0]

    @property
    def port(self):
        return int(self.bootstrap.rsplit(":", 1)[1])

    @property
    def log_path(self):
        if not self.data_dir:
            return None
        return os.path.join(self.data_dir, "broker.log")

    def log_tail(self, max_lines=60):
        p = self.log_path
        if not p or not os.path.exists(p):
            return "(no broker log available)"
        with open(p, "r", errors="replace") as f:
            lines = f.readlines()
        return "".join(lines[-max_lines:])

    def log_size(self):
        p = self.log_path
        try:
            return os.path.getsize(p) if p else 0
        except OSError:
            return 0

    def log_since(self, offset, max_chars=8000):
        p = self.log_path
        if not p or not os.path.exists(p):
            return "(no broker log available)"
        with open(p, "r", errors="replace") as f:
            f.seek(offset)
            text = f.read()
        if len(text) > max_chars:
            text = "...(truncated)...\n" + text[-max_chars:]
        return text

    def alive(self):
        return self.proc is None or self.proc.poll() is None


_BROKER = None


@pytest.fixture(scope="session")
def broker():
    global _BROKER
    env_bootstrap = os.environ.get("BOOTSTRAP")
    if env_bootstrap:
        _BROKER = Broker(env_bootstrap, os.environ.get("BROKER_DATA"))
        yield _BROKER
        return

    binary = os.environ.get("STRATA_BIN", DEFAULT_BIN)
    if not os.access(binary, os.X_OK):
        pytest.fail(f"strata binary not found at {binary} (build it with cargo build --release)",
                    pytrace=False)
    port = _free_port()
    bootstrap = f"127.0.0.1:{port}"
    data_dir = tempfile.mkdtemp(prefix="strata-pyit-")
    args = [binary, "serve", "--listen", bootstrap, "--advertised-listener", bootstrap,
            "--data-dir", data_dir, "--auto-create-topics", "true",
            "--num-partitions", "1"]
    args += os.environ.get("STRATA_ARGS", "").split()
    log = open(os.path.join(data_dir, "broker.log"), "wb")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    _BROKER = Broker(bootstrap, data_dir, proc)
    if not _wait_port("127.0.0.1", port, proc, time.monotonic() + 15):
        proc.kill()
        proc.wait()
        log.close()
        tail = _BROKER.log_tail()
        pytest.fail(f"broker did not start listening on {bootstrap}; log:\n{tail}", pytrace=False)
    try:
        yield _BROKER
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()
        if os.environ.get("KEEP_BROKER_DATA") == "1":
            print(f"\nbroker data kept in {data_dir}")
        else:
            shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture
def bootstrap(broker):
    return broker.bootstrap


@pytest.fixture
def topic_name(request):
    """A unique, valid topic name derived from the test name."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:120]
    return f"{base}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def unique_name(request):
    """Factory for further unique topic names within one test."""
    base = re.sub(r"[^A-Za-z0-9._-]", "_", request.node.name)[:100]

    def make(suffix=""):
        return f"{base}{suffix}-{uuid.uuid4().hex[:8]}"

    return make


@pytest.fixture(autouse=True)
def _broker_log_marker(request):
    """Remember where the broker log was when the test started, so a failure can
    show the lines the broker wrote during that test."""
    b = _BROKER
    request.node._strata_log_offset = b.log_size() if b else 0
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call" and rep.failed and _BROKER is not None:
        off = getattr(item, "_strata_log_offset", 0)
        status = "alive" if _BROKER.alive() else f"EXITED rc={_BROKER.proc.returncode}"
        rep.sections.append((
            "strata broker log during this test",
            f"broker {_BROKER.bootstrap} ({status}), log {_BROKER.log_path}\n"
            + _BROKER.log_since(off),
        ))
