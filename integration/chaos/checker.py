"""Checks a history (history.py) as Jepsen's Kafka workload does, against the
final read of every partition (read uncommitted: the log as it is; read
committed: what transactions made visible).

Anomalies, each counted with a few examples:

  lost-write            an acknowledged send, or a write of a committed transaction
                        that left no trace, is not in the final read of its partition
  duplicate             a value at two offsets of the final read
  inconsistent-offset   one (partition, offset) seen holding two values across all
                        observations (acks, polls, final reads)
  ack-mismatch          an acknowledged offset holds another value in the final read
  aborted-read          (G1a) a read-committed poll or the final committed read saw a
                        value of an aborted transaction
  read-then-rewritten   a poll saw value v at (p, o), the final read has another value
                        there, or none
  phantom-read          a value nobody sent was read
  poll-skip             an assign-mode consumer went from offset o1 to o2 of a partition
                        without a seek, skipping a record the final read has in between
  nonmonotonic-poll     ... or went back (o2 <= o1)
  commit-backwards      a group's committed offset for a partition went lower than a
                        commit acknowledged before (or the final committed offset is)
  torn-txn              a committed (or unknown) transaction partly visible to the
                        final read-committed read
  G0, G1c               cycles of write-write (G0) or also write-read (G1c) dependencies
                        between transactions, in log order
  final-read-incomplete the final read could not reach the end of a partition
  lso-stuck             open transactions never resolved after healing
  unavailable-after-heal  after healing, the cluster did not acknowledge a write to
                        every partition within 30 s
  restart-refused       a restarted broker refused to start ("already registered")
  client-crash          a client thread died of an exception in the harness

    python3 checker.py HISTORY.jsonl   prints the report; exit status 1 on anomalies
"""
import bisect
import json
import sys
from collections import defaultdict

import history as hist

EXAMPLES = 5


class Report:
    def __init__(self):
        self.counts = defaultdict(int)
        self.examples = defaultdict(list)
        self.stats = {}

    def add(self, kind, example):
        self.counts[kind] += 1
        if len(self.examples[kind]) < EXAMPLES:
            self.examples[kind].append(example)

    @property
    def valid(self):
        return not self.counts

    def render(self):
        lines = [f"  {k}: {v}" for k, v in sorted(self.stats.items())]
        if self.valid:
            lines.append("no anomalies")
        for kind in sorted(self.counts):
            lines.append(f"ANOMALY {kind}: {self.counts[kind]}")
            for e in self.examples[kind]:
                lines.append(f"    {json.dumps(e, default=str)[:600]}")
        return "\n".join(lines)


def check(ops):
    r = Report()
    finals = {}  # iso -> {p: {o: v}}
    for op in ops:
        if op["f"] == "final-read":
            v = op["value"]
            log = defaultdict(dict)
            for p, o, val in v["records"]:
                log[p][o] = val
            finals[v["isolation"]] = log
            if op["type"] != "ok":
                r.add("final-read-incomplete", {"isolation": v["isolation"], "ends": v["ends"], "errors": v["errors"]})
        elif op["f"] in ("lso-stuck", "unavailable-after-heal", "restart-refused"):
            r.add(op["f"], op["value"])
        elif op["f"] == "client-crash":
            r.add("client-crash", {"process": op["process"], "error": op["value"]})
    if "ru" not in finals or "rc" not in finals:
        r.add("final-read-incomplete", {"missing": sorted({"ru", "rc"} - set(finals))})
        return r
    ru, rc = finals["ru"], finals["rc"]
    where_ru, where_rc = locate(ru, r), locate(rc, None)

    sends = [op for op in ops if op["f"] == "send" and op["type"] == "ok"]
    invoked = {op["value"]["value"] for op in ops if op["f"] == "send" and op["type"] == "invoke"}
    txns = {op["value"]["txn"]: op for op in ops if op["f"] == "txn" and op["type"] != "invoke"}
    for op in ops:
        if op["f"] == "txn" and op["type"] == "invoke":
            invoked.update(v for _, v in op["value"]["writes"])
    polls = poll_ops(ops)

    # Writes: lost, misplaced.
    for op in sends:
        v = op["value"]
        if not any(p == v["partition"] for p, _ in where_ru.get(v["value"], ())):
            r.add("lost-write", {"value": v["value"], "partition": v["partition"], "acked_offset": v["offset"]})
        elif ru[v["partition"]].get(v["offset"]) != v["value"]:
            r.add("ack-mismatch", {"value": v["value"], "partition": v["partition"], "offset": v["offset"],
                                   "final": ru[v["partition"]].get(v["offset"])})

    # Transactions: outcome as recorded, or as the final read shows an unknown one.
    aborted = set()
    for txn, op in sorted(txns.items()):
        writes = op["value"]["writes"]
        visible = [v for p, _, v in writes if p in {q for q, _ in where_rc.get(v, ())}]
        if op["type"] == "fail" or (op["type"] == "info" and not visible):
            aborted.update(v for _, _, v in writes)
            continue
        if 0 < len(visible) < len(writes):
            r.add("torn-txn", {"txn": txn, "outcome": op["value"]["outcome"], "writes": writes, "visible": visible})
        elif op["type"] == "ok" and not visible:
            for p, o, v in writes:
                r.add("lost-write", {"value": v, "partition": p, "txn": txn, "acked_offset": o})
        if op["type"] == "ok":
            for p, o, v in writes:
                if o is not None and v in visible and ru[p].get(o) != v:
                    r.add("ack-mismatch", {"value": v, "partition": p, "offset": o, "txn": txn,
                                           "final": ru[p].get(o)})

    # Every observation of every offset.
    seen = defaultdict(set)
    for op in sends:
        seen[(op["value"]["partition"], op["value"]["offset"])].add(op["value"]["value"])
    for op in txns.values():
        for p, o, v in op["value"]["writes"]:
            if o is not None:
                seen[(p, o)].add(v)
    for log in (ru, rc):
        for p, offsets in log.items():
            for o, v in offsets.items():
                seen[(p, o)].add(v)
    for process, iso, records in polls:
        for p, o, v in records:
            seen[(p, o)].add(v)
            if ru.get(p, {}).get(o) != v:
                r.add("read-then-rewritten", {"process": process, "partition": p, "offset": o, "read": v,
                                              "final": ru.get(p, {}).get(o)})
            if iso == "rc" and v in aborted:
                r.add("aborted-read", {"process": process, "partition": p, "offset": o, "value": v})
            if v not in invoked:
                r.add("phantom-read", {"process": process, "partition": p, "offset": o, "value": v})
    for (p, o), values in sorted(seen.items()):
        if len(values) > 1:
            r.add("inconsistent-offset", {"partition": p, "offset": o, "values": sorted(values)})
    for p, offsets in rc.items():
        for o, v in offsets.items():
            if v in aborted:
                r.add("aborted-read", {"process": "final-rc", "partition": p, "offset": o, "value": v})
    for log in (ru, rc):
        for p, offsets in log.items():
            for o, v in offsets.items():
                if v not in invoked:
                    r.add("phantom-read", {"process": "final", "partition": p, "offset": o, "value": v})

    check_poll_order(ops, finals, r)
    check_commits(ops, r)
    check_cycles(txns, rc, r)
    r.stats = {
        "acknowledged sends": len(sends),
        "transactions committed/aborted/unknown": "/".join(
            str(sum(op["type"] == t for op in txns.values())) for t in ("ok", "fail", "info")),
        "polled records": sum(len(rec) for _, _, rec in polls),
        "final records (read uncommitted/committed)": f"{sum(map(len, ru.values()))}/{sum(map(len, rc.values()))}",
        "faults": sum(op["process"] == "nemesis" and (op["value"] or {}).get("phase") == "start" for op in ops),
        "longest wait between acks of a partition": longest_gap(sends),
    }
    return r


def longest_gap(sends):
    """The longest time a partition went without acknowledging a send, and when
    (seconds since the first ack)."""
    times = defaultdict(list)
    for op in sends:
        times[op["value"]["partition"]].append(op["time"])
    if not times:
        return None
    start = min(t for ts in times.values() for t in ts)
    gap, p, at = max((b - a, p, a) for p, ts in times.items() for a, b in zip(sorted(ts), sorted(ts)[1:]))
    return f"{gap:.1f} s (partition {p}, from {at - start:.1f} s)"


def locate(log, r):
    """value -> [(partition, offset)] of a final read, noting duplicates."""
    where = defaultdict(list)
    for p, offsets in log.items():
        for o, v in sorted(offsets.items()):
            where[v].append((p, o))
    for v, places in where.items():
        if len(places) > 1 and r is not None:
            r.add("duplicate", {"value": v, "at": places})
    return where


def poll_ops(ops):
    """(process, isolation, records) of every poll, and of the reads of transactions."""
    out = []
    for op in ops:
        if op["f"] == "poll" and op["type"] == "ok":
            out.append((op["process"], op["value"]["isolation"], op["value"]["records"]))
        elif op["f"] == "txn" and op["type"] != "invoke" and op["value"].get("reads"):
            out.append((op["process"], "rc", op["value"]["reads"]))
    return out


def check_poll_order(ops, finals, r):
    """Assign-mode consumers read each partition in order, skipping nothing
    the final read (of their isolation level) has."""
    offsets = {iso: {p: sorted(log[p]) for p in log} for iso, log in finals.items()}
    assigned = {}  # process -> isolation, for assign-mode processes
    last = defaultdict(dict)  # process -> partition -> last offset
    for op in ops:
        proc, value = op["process"], op["value"]
        if op["f"] == "assign" and op["type"] == "ok":
            assigned[proc] = value["isolation"]
            for p in value["partitions"]:
                last[proc].pop(p, None)
            continue
        if proc not in assigned:
            continue
        if op["f"] == "poll" and op["type"] == "ok":
            records = value["records"]
        elif op["f"] == "txn" and op["type"] != "invoke":
            records = value.get("reads") or []
        else:
            continue
        for p, o, v in records:
            prev = last[proc].get(p)
            last[proc][p] = o
            if prev is None:
                continue
            if o <= prev:
                r.add("nonmonotonic-poll", {"process": proc, "partition": p, "from": prev, "to": o})
                continue
            ref = offsets[assigned[proc]].get(p, [])
            i = bisect.bisect_right(ref, prev)
            if i < len(ref) and ref[i] < o:
                skipped = ref[i:bisect.bisect_left(ref, o)]
                r.add("poll-skip", {"process": proc, "partition": p, "from": prev, "to": o,
                                    "skipped": len(skipped), "first_skipped": skipped[0]})


def check_commits(ops, r):
    """A commit acknowledged before another starts is never undone: no later
    acknowledged commit of the group, nor the final committed offset, is lower."""
    invoked = {}  # process -> time of its pending commit
    done = defaultdict(list)  # (group, partition) -> [(invoke time, ack time, offset, process)]
    final = []
    for op in ops:
        if op["f"] == "commit":
            if op["type"] == "invoke":
                invoked[op["process"]] = op["time"]
            elif op["type"] == "ok":
                for p, o in op["value"]["offsets"]:
                    done[(op["value"]["group"], p)].append((invoked.get(op["process"], op["time"]), op["time"], o,
                                                           op["process"]))
        elif op["f"] == "final-committed" and op["type"] == "ok":
            final += [(op["value"]["group"], p, o) for p, o in op["value"]["offsets"]]
    for (group, p), commits in done.items():
        by_ack = sorted(commits, key=lambda c: c[1])
        acked_max, best, j = -1, None, 0
        for start, _, offset, proc in sorted(commits):
            while j < len(by_ack) and by_ack[j][1] < start:
                if by_ack[j][2] > acked_max:
                    acked_max, best = by_ack[j][2], by_ack[j]
                j += 1
            if offset < acked_max:
                r.add("commit-backwards", {"group": group, "partition": p, "offset": offset, "by": proc,
                                           "after_acked": acked_max, "acked_by": best[3]})
    highest = {k: max(c[2] for c in v) for k, v in done.items()}
    for group, p, o in final:
        if o < highest.get((group, p), -1):
            r.add("commit-backwards", {"group": group, "partition": p, "final_committed": o,
                                       "after_acked": highest[(group, p)]})


def check_cycles(txns, rc, r):
    """Dependency graph of the visible transactions: ww edges between successive
    transactions in each partition's committed log, wr edges from the writer of
    the last value a transaction read of a partition to that transaction."""
    writer = {}
    for txn, op in txns.items():
        if op["type"] != "fail":
            for _, _, v in op["value"]["writes"]:
                writer[v] = txn
    order = {}  # partition -> ([offsets of transactional values], [their writers])
    for p, offsets in rc.items():
        os_, ws = [], []
        for o in sorted(offsets):
            if offsets[o] in writer:
                os_.append(o)
                ws.append(writer[offsets[o]])
        order[p] = (os_, ws)
    ww, wr = defaultdict(set), defaultdict(set)
    for os_, ws in order.values():
        for a, b in zip(ws, ws[1:]):
            if a != b:
                ww[a].add(b)
    for txn, op in txns.items():
        if op["type"] == "fail":
            continue
        last_read = {}
        for p, o, v in op["value"].get("reads") or []:
            last_read[p] = max(last_read.get(p, -1), o)
        for p, o in last_read.items():
            os_, ws = order.get(p, ([], []))
            i = bisect.bisect_right(os_, o) - 1
            if i >= 0 and ws[i] != txn:
                wr[ws[i]].add(txn)
    both = defaultdict(set)
    for g in (ww, wr):
        for a, bs in g.items():
            both[a] |= bs
    for component in strongly_connected(both):
        if len(component) < 2:
            continue
        cycle = find_cycle(ww, component)
        kind = "G0" if cycle else "G1c"
        cycle = cycle or find_cycle(both, component)
        r.add(kind, {"cycle": cycle, "edges": [("ww" if b in ww.get(a, ()) else "wr") for a, b in
                                               zip(cycle, cycle[1:])]})


def strongly_connected(graph):
    """Tarjan's algorithm, iterative."""
    index, low, on_stack, stack, out = {}, {}, set(), [], []
    nodes = set(graph) | {b for bs in graph.values() for b in bs}
    counter = 0
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    component.append(n)
                    if n == node:
                        break
                out.append(component)
    return out


def find_cycle(graph, component):
    """A shortest cycle within `component` using `graph`'s edges, as a node
    list ending where it starts, or None."""
    members = set(component)
    best = None
    for start in sorted(members):
        prev, frontier = {start: None}, [start]
        found = None
        while frontier and not found:
            nxt = []
            for n in frontier:
                for m in sorted(graph.get(n, ())):
                    if m == start:
                        found = n
                        break
                    if m in members and m not in prev:
                        prev[m] = n
                        nxt.append(m)
                if found:
                    break
            frontier = nxt
        if found:
            path = [start]
            n = found
            while n is not None:
                path.append(n)
                n = prev[n]
            path.reverse()  # start ... found, start
            if best is None or len(path) < len(best):
                best = path
    return best


if __name__ == "__main__":
    report = check(hist.load(sys.argv[1]))
    print(report.render())
    sys.exit(0 if report.valid else 1)
