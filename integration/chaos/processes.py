"""The processes under test: etcd, the S3 server (moto), the proxies, and three
brokers, each on 127.0.0.1 with ports and data directories of its own under
one work directory. Each broker reaches etcd and the store through its own
proxies (proxy.py), which the nemesis drives through `Cluster.proxy_set`.

A broker the harness wants up but that exited (fenced after a pause, or for
any other reason) is restarted by the supervisor; a start that fails because
etcd still holds the node's old registration ("registered by another live
broker") is retried every second, and every such refusal is recorded in the
history as `restart-refused`.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"
LEASE_TTL_MS = 2000
BUCKET, PREFIX = "strata-chaos", "chaos"


def free_port(taken=()):
    while True:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        s.close()
        if port not in taken:
            return port


def listening(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


class Service:
    """One child process with a log file; start() waits until `port` listens."""

    def __init__(self, name, work, port):
        self.name, self.work, self.port = name, work, port
        self.log_path = os.path.join(work, f"{name}.log")
        self.proc = None
        self.lock = threading.RLock()
        self.wanted = False  # whether the harness wants it up

    def command(self):
        raise NotImplementedError

    def env(self):
        return os.environ.copy()

    def start(self, timeout=30):
        """'up', or ('exited', log text of this attempt) if it died first."""
        with self.lock:
            offset = os.path.getsize(self.log_path) if os.path.exists(self.log_path) else 0
            log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(self.command(), stdout=log, stderr=subprocess.STDOUT,
                                         env=self.env(), start_new_session=True)
            log.close()
            deadline = time.time() + timeout
            while time.time() < deadline:
                if self.proc.poll() is not None:
                    return "exited", self.log_since(offset)
                if listening(self.port):
                    self.wanted = True
                    return "up", ""
                time.sleep(0.1)
            return "timeout", self.log_since(offset)

    def log_since(self, offset):
        with open(self.log_path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            try:
                os.kill(self.proc.pid, sig)
            except ProcessLookupError:
                pass

    def kill(self, unless_starting=False):
        """kill -9, and waits for the exit. With `unless_starting`, nothing
        happens while a start holds the lock (which can take its whole
        timeout)."""
        if not self.lock.acquire(blocking=not unless_starting):
            return
        try:
            self.wanted = False
            if self.proc is not None:
                self.signal(signal.SIGKILL)
                self.proc.wait()
        finally:
            self.lock.release()

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
            self.proc.wait()


class Etcd(Service):
    def __init__(self, work):
        super().__init__("etcd", work, free_port())
        self.peer = free_port({self.port})
        self.data = os.path.join(work, "etcd")

    def command(self):
        c, p = f"http://127.0.0.1:{self.port}", f"http://127.0.0.1:{self.peer}"
        return ["etcd", "--data-dir", self.data, "--listen-client-urls", c, "--advertise-client-urls", c,
                "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                "--initial-cluster", f"default={p}", "--heartbeat-interval", "50", "--election-timeout", "500"]


class Moto(Service):
    def __init__(self, work):
        super().__init__("moto", work, free_port())

    def command(self):
        return ["moto_server", "-H", "127.0.0.1", "-p", str(self.port)]


class Broker(Service):
    def __init__(self, node, work, binary, etcd_port, store, s3_port):
        super().__init__(f"broker-{node}", work, free_port())
        self.node, self.binary = node, binary
        self.etcd_port, self.store, self.s3_port = etcd_port, store, s3_port
        self.data = os.path.join(work, f"data-{node}")
        self.faketime_file = os.path.join(work, f"faketime-{node}")
        with open(self.faketime_file, "w") as f:
            f.write("+0\n")

    def command(self):
        cmd = [self.binary, "serve", "--node-id", str(self.node),
               "--listen", f"127.0.0.1:{self.port}", "--advertised-listener", f"127.0.0.1:{self.port}",
               "--data-dir", self.data, "--cluster", f"etcd://127.0.0.1:{self.etcd_port}/strata",
               "--cluster-lease-ttl-ms", str(LEASE_TTL_MS), "--wal-flush-ms", "50",
               "--compaction-worker", "false", "--tier-interval-ms", "500",
               # segments seal (and the WAL behind them goes) within the run
               "--wal-max-age-ms", "15000"]
        if self.store == "s3":
            cmd += ["--store", f"s3://{BUCKET}/{PREFIX}", "--s3-endpoint", f"http://127.0.0.1:{self.s3_port}",
                    "--s3-allow-http", "true"]
        else:
            cmd += ["--store", f"file://{os.path.join(self.work, 'store')}"]
        return cmd

    def env(self):
        env = os.environ.copy()
        env.update(AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_REGION="us-east-1")
        if os.path.exists(FAKETIME_LIB):
            # Only the wall clock moves (as an NTP step would); the file is
            # re-read about every second.
            env.update(LD_PRELOAD=FAKETIME_LIB, FAKETIME_TIMESTAMP_FILE=self.faketime_file,
                       FAKETIME_CACHE_DURATION="1", FAKETIME_DONT_FAKE_MONOTONIC="1")
        return env

    def start(self, timeout=30):
        os.makedirs(self.data, exist_ok=True)
        return super().start(timeout)

    def wipe(self):
        shutil.rmtree(self.data, ignore_errors=True)

    def set_clock_offset(self, seconds):
        with open(self.faketime_file + ".tmp", "w") as f:
            f.write(f"{seconds:+d}s\n" if seconds else "+0\n")
        os.replace(self.faketime_file + ".tmp", self.faketime_file)


class Cluster:
    def __init__(self, work, binary, store, history):
        self.work, self.store, self.history = work, store, history
        os.makedirs(work, exist_ok=True)
        self.etcd = Etcd(work)
        self.moto = Moto(work) if store == "s3" else None
        self.nodes = [1, 2, 3]
        taken = {self.etcd.port, self.etcd.peer} | ({self.moto.port} if self.moto else set())
        self.etcd_proxy, self.s3_proxy = {}, {}
        for n in self.nodes:
            self.etcd_proxy[n] = free_port(taken)
            taken.add(self.etcd_proxy[n])
            if self.moto:
                self.s3_proxy[n] = free_port(taken)
                taken.add(self.s3_proxy[n])
        self.brokers = {n: Broker(n, work, binary, self.etcd_proxy[n], store, self.s3_proxy.get(n))
                        for n in self.nodes}
        self.proxy = None
        self.proxy_lock = threading.Lock()
        self.stopping = threading.Event()
        self.supervisor = None

    @property
    def bootstrap(self):
        return ",".join(f"127.0.0.1:{b.port}" for b in self.brokers.values())

    def proxy_names(self, kind, nodes=None):
        return [f"{kind}-{n}" for n in (nodes or self.nodes)]

    def start(self):
        for svc in [self.etcd] + ([self.moto] if self.moto else []):
            status, log = svc.start()
            if status != "up":
                raise RuntimeError(f"{svc.name} did not start: {log[-2000:]}")
        spec = [{"name": f"etcd-{n}", "port": self.etcd_proxy[n], "upstream": self.etcd.port} for n in self.nodes]
        if self.moto:
            spec += [{"name": f"s3-{n}", "port": self.s3_proxy[n], "upstream": self.moto.port, "http": True}
                     for n in self.nodes]
            self.setup_bucket()
        self.proxy = subprocess.Popen(["python3", os.path.join(HERE, "proxy.py"), json.dumps(spec)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      stderr=open(os.path.join(self.work, "proxy.log"), "ab"))
        if self.proxy.stdout.readline().strip() != "ready":
            raise RuntimeError("the proxies did not start")
        for b in self.brokers.values():
            self.ensure_up(b, timeout=60)
        self.supervisor = threading.Thread(target=self.supervise, name="supervisor", daemon=True)
        self.supervisor.start()

    def setup_bucket(self):
        import boto3
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.moto.port}", region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
        s3.create_bucket(Bucket=BUCKET)

    def proxy_set(self, names, **cmd):
        with self.proxy_lock:
            self.proxy.stdin.write(json.dumps({"names": names, **cmd}) + "\n")
            self.proxy.stdin.flush()
            assert self.proxy.stdout.readline().strip() == "ok"

    def ensure_up(self, broker, timeout=90):
        """Starts the broker, retrying while it is refused, until it listens."""
        deadline = time.time() + timeout
        with broker.lock:
            while not broker.alive():
                status, log = broker.start()
                if status == "up":
                    self.history.add("harness", "info", "broker-up", {"node": broker.node})
                    return True
                broker.stop()
                refused = "live broker" in log  # "node id N is registered by another live broker"
                self.history.add("harness", "info", "restart-refused" if refused else "start-failed",
                                 {"node": broker.node, "status": status, "log": last_line(log)})
                if time.time() > deadline or self.stopping.is_set():
                    return False
                time.sleep(1)
            return True

    def supervise(self):
        """Restarts brokers and etcd that exited while wanted up."""
        while not self.stopping.wait(0.5):
            for svc in [self.etcd] + list(self.brokers.values()):
                if svc.wanted and not svc.alive() and svc.proc is not None:
                    with svc.lock:
                        if not (svc.wanted and not svc.alive()) or self.stopping.is_set():
                            continue
                        code = svc.proc.returncode
                        self.history.add("harness", "info", "process-exit",
                                         {"process": svc.name, "code": code,
                                          "log": last_line(svc.log_since(max(0, os.path.getsize(svc.log_path) - 50000)))})
                        if isinstance(svc, Broker):
                            self.ensure_up(svc)
                        else:
                            svc.start()

    def shutdown(self):
        self.stopping.set()
        if self.supervisor:
            self.supervisor.join(timeout=5)
        for svc in list(self.brokers.values()) + [self.etcd, self.moto]:
            if svc is not None:
                svc.stop()
        if self.proxy and self.proxy.poll() is None:
            self.proxy.stdin.close()
            try:
                self.proxy.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proxy.kill()


def last_line(text):
    """The line saying why a process stopped: its last error, else its last line."""
    lines = [line for line in text.strip().splitlines() if line.strip() and not line.startswith(" ")]
    errors = [line for line in lines if line.startswith("Error:") or " ERROR " in line or "panicked" in line]
    return (errors or lines or [""])[-1][-300:]
