"""One chaos run: start etcd, the S3 server, the proxies and 3 brokers; run the
workload while the nemesis injects its seeded schedule of faults; heal, let the
cluster settle, read everything back, and check the history.

    chaos.py [--seed N] [--seconds 100] [--store s3|file] [--binary PATH] [--keep]

Exit status: 0 if the checker found nothing, 1 on anomalies, 2 if the harness
itself failed. The work directory (history.jsonl, report.txt, summary.json,
every process's log) is kept on anything but a clean pass, or with --keep.
"""
import argparse
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback

import checker
import nemesis
import workload
from history import History, load
from processes import FAKETIME_LIB, Cluster

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))


def main():
    # SIGTERM stops a run as ^C does: the finally below stops every process.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--seconds", type=float, default=90, help="workload under faults, before healing")
    ap.add_argument("--store", choices=["s3", "file"], default="s3")
    ap.add_argument("--binary", default=os.environ.get("STRATA_BIN", os.path.join(REPO, "target/release/strata")))
    ap.add_argument("--deadline", type=float, default=0, help="give up after this many seconds in all (0: none)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory even on a pass")
    ap.add_argument("--summary", help="append the run's summary (JSON, one line) to this file")
    args = ap.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 2**31)
    replay = f"scripts/chaos --seed {seed} --seconds {args.seconds:g} --store {args.store}"
    print(f"seed {seed}  (replay: {replay})", flush=True)
    if not os.path.exists(FAKETIME_LIB):
        print(f"note: {FAKETIME_LIB} missing (apt-get install faketime): no clock jumps", flush=True)
    faults = nemesis.schedule(seed, args.seconds, args.store)
    print(f"schedule ({len(faults)} faults):\n" + "\n".join(f"  {f}" for f in faults), flush=True)

    work = tempfile.mkdtemp(prefix="strata-chaos-")
    binary = os.path.join(work, "strata")
    shutil.copy2(args.binary, binary)  # a rebuild must not swap it under the run
    built = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(os.stat(binary).st_mtime))
    about_binary = f"{os.path.abspath(args.binary)} ({os.stat(binary).st_size} bytes, modified {built})"
    print(f"binary {about_binary}\nwork directory {work}", flush=True)
    h = History(os.path.join(work, "history.jsonl"))
    cluster = Cluster(work, binary, args.store, h)
    if args.deadline:
        watchdog(args.deadline, cluster, work)
    workload.client_log(os.path.join(work, "clients.log"))
    started = time.time()
    try:
        report = run(cluster, h, seed, faults, args.seconds)
    except Exception:
        traceback.print_exc()
        print(f"seed {seed}: HARNESS FAILURE\n  replay: {replay}\n  work directory kept: {work}", flush=True)
        return 2
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second ^C must not cut the cleanup short
            signal.signal(sig, signal.SIG_IGN)
        cluster.shutdown()
        h.close()
        os.unlink(binary)  # 180 MB; the report names the original

    text = report.render()
    print(text, flush=True)
    with open(os.path.join(work, "report.txt"), "w") as f:
        f.write(f"seed {seed}\nbinary {about_binary}\n{text}\n")
    summary = json.dumps({"seed": seed, "binary": about_binary, "store": args.store, "seconds": args.seconds,
                          "faults": len(faults),
                          "wall_seconds": round(time.time() - started), "anomalies": dict(report.counts),
                          "stats": report.stats, "work": None if report.valid and not args.keep else work})
    with open(os.path.join(work, "summary.json"), "w") as f:
        f.write(summary + "\n")
    if args.summary:
        with open(args.summary, "a") as f:
            f.write(summary + "\n")
    if report.valid and not args.keep:
        shutil.rmtree(work, ignore_errors=True)
        print(f"seed {seed}: no anomalies", flush=True)
        return 0
    status = "no anomalies" if report.valid else "ANOMALIES " + ", ".join(
        f"{k}={v}" for k, v in sorted(report.counts.items()))
    print(f"seed {seed}: {status}\n  replay: {replay}\n  work directory kept: {work}", flush=True)
    return 0 if report.valid else 1


def run(cluster, h, seed, faults, seconds):
    cluster.start()
    workload.create_topic(cluster.bootstrap)
    w = workload.Workload(cluster.bootstrap, h, seed)
    w.start()
    nem = nemesis.Nemesis(cluster, h)
    stop_faults = threading.Event()
    t0 = time.time()
    thread = threading.Thread(target=nem.run, args=(faults, t0, stop_faults), name="nemesis", daemon=True)
    thread.start()
    time.sleep(max(0.0, t0 + seconds - time.time()))
    stop_faults.set()
    thread.join(120)

    print(f"[{time.time() - t0:6.1f}s] healing", flush=True)
    nem.heal_all()
    healed = time.time()
    if not (workload.wait_leaders(cluster.bootstrap, 30)
            and workload.probe(cluster.bootstrap, h, max(5.0, healed + 30 - time.time()))):
        h.add("final", "info", "unavailable-after-heal", {"seconds": round(time.time() - healed, 1)})
        print("the cluster did not serve every partition within 30 s of healing", flush=True)
    time.sleep(3)  # the workload goes on a little on the healed cluster
    stuck = w.stop()
    if stuck:
        print(f"clients still running after stop: {stuck}", flush=True)
    print(f"[{time.time() - t0:6.1f}s] final reads", flush=True)
    if not workload.wait_stable_ends(cluster.bootstrap, 30):
        h.add("final", "info", "lso-stuck", {
            "read_committed": workload.watermarks(cluster.bootstrap, "read_committed"),
            "read_uncommitted": workload.watermarks(cluster.bootstrap, "read_uncommitted")})
    for iso in ("ru", "rc"):
        workload.final_read(cluster.bootstrap, h, iso)
    workload.final_committed(cluster.bootstrap, h)
    h.file.flush()
    return checker.check(load(h.path))


def watchdog(seconds, cluster, work):
    def fire():
        print(f"harness deadline of {seconds:g}s exceeded; work directory kept: {work}", flush=True)
        cluster.shutdown()
        os._exit(2)
    t = threading.Timer(seconds, fire)
    t.daemon = True
    t.start()


if __name__ == "__main__":
    sys.exit(main())
