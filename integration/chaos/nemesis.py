"""Faults, drawn up front from `random.Random(seed)`: the same seed, run length
and store give the same schedule (start times, faults, targets, durations),
printed at the start of a run. Each fault starts at its planned time (or as
soon as the previous one has healed, if that took longer), lasts its drawn
duration, then heals; `heal_all` undoes everything at the end.
"""
import os
import random
import signal
import time
from dataclasses import dataclass, field

from processes import FAKETIME_LIB

NODES = [1, 2, 3]

# name: (weight, (shortest, longest) duration in seconds, needs the S3 proxies)
FAULTS = {
    "kill":            (3, (0.3, 6), False),  # kill -9 one broker, restart after the duration
    "kill-two":        (1, (0.3, 6), False),  # kill -9 two brokers
    "kill-wipe":       (2, (0.3, 6), False),  # kill -9 and delete its data directory
    "kill-hung-store": (2, (0.3, 6), True),   # one broker's store hangs, then kill -9 it mid-write
    "pause-broker":    (2, (3, 8), False),   # SIGSTOP past the lease TTL, then SIGCONT
    "pause-etcd":      (1, (2, 8), False),
    "kill-etcd":       (1, (2, 6), False),   # restarted on the same data directory
    "pause-store":     (1, (2, 8), True),    # SIGSTOP the S3 server
    "partition-etcd":  (2, (3, 10), False),  # one broker's etcd proxy hangs or refuses
    "partition-store": (2, (3, 10), True),   # one broker's S3 proxy hangs or refuses
    "slow-store":      (1, (5, 15), True),   # latency on the S3 proxies
    "store-errors":    (1, (5, 15), True),   # a fraction of S3 requests answered 503
    "clock-jump":      (1, (5, 15), False),  # one broker's wall clock jumps (libfaketime)
}


@dataclass
class Fault:
    at: float        # seconds after the start of the workload
    name: str
    duration: float
    params: dict = field(default_factory=dict)

    def __str__(self):
        args = " ".join(f"{k}={v}" for k, v in self.params.items())
        return f"{self.at:7.1f}s  {self.name:<16} {self.duration:4.1f}s  {args}"


def available_faults(store):
    names = [n for n, (_, _, s3) in FAULTS.items() if store == "s3" or not s3]
    if not os.path.exists(FAKETIME_LIB):
        names.remove("clock-jump")
    return names


def schedule(seed, seconds, store):
    """Faults over [0, seconds): a few seconds of calm first, 2-6 s between faults."""
    names = available_faults(store)
    rng = random.Random(seed)
    faults, t = [], rng.uniform(3, 6)
    while True:
        name = rng.choices(names, [FAULTS[n][0] for n in names])[0]
        duration = round(rng.uniform(*FAULTS[name][1]), 1)
        if t + duration > seconds:
            return faults
        faults.append(Fault(round(t, 1), name, duration, draw_params(rng, name)))
        t += duration + rng.uniform(2, 6)


def draw_params(rng, name):
    if name in ("kill", "kill-wipe", "pause-broker", "partition-etcd", "partition-store", "kill-hung-store"):
        params = {"node": rng.choice(NODES)}
        if name.startswith("partition"):
            params["how"] = rng.choice(["hang", "refuse"])
        if name == "kill-hung-store":
            params["hang_s"] = rng.choice([0.5, 1.5, 3])
        return params
    if name == "kill-two":
        return {"nodes": sorted(rng.sample(NODES, 2))}
    if name == "slow-store":
        return {"nodes": rng.choice([NODES, [rng.choice(NODES)]]), "latency_ms": rng.choice([100, 300, 1000, 2500])}
    if name == "store-errors":
        return {"nodes": rng.choice([NODES, [rng.choice(NODES)]]), "rate": rng.choice([0.1, 0.3, 0.6])}
    if name == "clock-jump":
        return {"node": rng.choice(NODES), "seconds": rng.choice([-600, -60, -5, 5, 60, 600, 86400])}
    return {}


class Nemesis:
    def __init__(self, cluster, history):
        self.c, self.h = cluster, history

    def run(self, faults, t0, stopping):
        for fault in faults:
            if stopping.wait(max(0.0, t0 + fault.at - time.time())):
                return
            print(f"[{time.time() - t0:6.1f}s] planned at {fault}", flush=True)
            self.h.add("nemesis", "info", fault.name, {"phase": "start", "planned_at": fault.at, **fault.params})
            heal = self.apply(fault)
            stopping.wait(fault.duration)
            heal()
            self.h.add("nemesis", "info", fault.name, {"phase": "end", **fault.params})

    def apply(self, fault):
        """Starts the fault; returns what heals it."""
        c, p, name = self.c, fault.params, fault.name
        if name in ("kill", "kill-wipe", "kill-two"):
            brokers = [c.brokers[n] for n in p.get("nodes", [p.get("node")])]
            for b in brokers:
                b.kill()
                if name == "kill-wipe":
                    b.wipe()
            return lambda: [c.ensure_up(b) for b in brokers]
        if name == "kill-hung-store":
            # It keeps taking and serving writes that cannot become durable,
            # then dies with them (its held requests never reach the store):
            # a reader may have seen records that no new leader recovers.
            # A broker the supervisor is restarting is left to it: waiting
            # for that start would hold the store hung for up to 90 s.
            b, names = c.brokers[p["node"]], c.proxy_names("s3", [p["node"]])
            c.proxy_set(names, mode="hang")
            time.sleep(p["hang_s"])
            b.kill(unless_starting=True)
            c.proxy_set(names, mode="refuse")
            c.proxy_set(names, mode="pass")
            return lambda: c.ensure_up(b)
        if name == "pause-broker":
            b = c.brokers[p["node"]]
            b.signal(signal.SIGSTOP)
            return lambda: b.signal(signal.SIGCONT)
        if name in ("pause-etcd", "pause-store"):
            svc = c.etcd if name == "pause-etcd" else c.moto
            svc.signal(signal.SIGSTOP)
            return lambda: svc.signal(signal.SIGCONT)
        if name == "kill-etcd":
            c.etcd.kill()
            return lambda: c.etcd.start()
        if name in ("partition-etcd", "partition-store"):
            names = c.proxy_names("etcd" if name == "partition-etcd" else "s3", [p["node"]])
            c.proxy_set(names, mode=p["how"])
            return lambda: c.proxy_set(names, mode="pass")
        if name == "slow-store":
            names = c.proxy_names("s3", p["nodes"])
            c.proxy_set(names, latency_ms=p["latency_ms"])
            return lambda: c.proxy_set(names, latency_ms=0)
        if name == "store-errors":
            names = c.proxy_names("s3", p["nodes"])
            c.proxy_set(names, error_rate=p["rate"])
            return lambda: c.proxy_set(names, error_rate=0.0)
        if name == "clock-jump":
            b = c.brokers[p["node"]]
            b.set_clock_offset(p["seconds"])
            return lambda: b.set_clock_offset(0)
        raise ValueError(name)

    def heal_all(self):
        c = self.c
        for svc in [c.etcd, c.moto] + list(c.brokers.values()):
            if svc is not None:
                svc.signal(signal.SIGCONT)
        names = c.proxy_names("etcd") + (c.proxy_names("s3") if c.moto else [])
        c.proxy_set(names, reset=True)
        for b in c.brokers.values():
            b.set_clock_offset(0)
        if not c.etcd.alive():
            c.etcd.start()
        ok = all(c.ensure_up(b) for b in c.brokers.values())
        self.h.add("nemesis", "info", "heal-all", {"brokers_up": ok})
        return ok

