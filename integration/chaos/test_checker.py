"""The checker on small synthetic histories: a clean one passes, and each
anomaly is found (and only it)."""
import checker

T = [0.0]


def op(process, type, f, value):
    T[0] += 1
    return {"time": T[0], "process": process, "type": type, "f": f, "value": value}


def send(v, p, o, process="idem-0"):
    return [op(process, "invoke", "send", {"value": v, "partition": p}),
            op(process, "ok", "send", {"value": v, "partition": p, "offset": o})]


def txn(name, writes, outcome="committed", reads=(), process="txn-A"):
    """writes: [(partition, offset, value)]"""
    type = {"committed": "ok", "aborted": "fail", "unknown": "info"}[outcome]
    return [op(process, "invoke", "txn", {"txn": name, "writes": [[p, v] for p, _, v in writes]}),
            op(process, type, "txn", {"txn": name, "outcome": outcome, "writes": [list(w) for w in writes],
                                      "reads": [list(r) for r in reads]})]


def poll(process, records, iso="ru"):
    return [op(process, "ok", "poll", {"isolation": iso, "mode": "assign", "group": None,
                                       "records": [list(r) for r in records]})]


def assign(process, partitions, iso="ru"):
    return [op(process, "ok", "assign", {"partitions": partitions, "isolation": iso})]


def commit(process, group, offsets):
    return [op(process, "invoke", "commit", {"group": group}),
            op(process, "ok", "commit", {"group": group, "offsets": [list(o) for o in offsets]})]


def final(ru, rc=None, committed=None):
    out = [op("final", "ok", "final-read", {"isolation": "ru", "records": [list(r) for r in ru],
                                            "ends": [], "errors": []}),
           op("final", "ok", "final-read", {"isolation": "rc", "records": [list(r) for r in (rc if rc is not None else ru)],
                                            "ends": [], "errors": []})]
    for group, offsets in (committed or {}).items():
        out.append(op("final", "ok", "final-committed", {"group": group, "offsets": [list(o) for o in offsets]}))
    return out


def clean():
    """Two sends, a committed txn over two partitions, an aborted one, and
    consumers that read it all in order."""
    h = send("a", 0, 0) + send("b", 0, 1)
    h += txn("t1", [(0, 2, "t1-0"), (1, 0, "t1-1")])
    h += txn("t2", [(1, 1, "t2-0")], outcome="aborted")
    h += send("c", 1, 3)  # offset 2 is t2's abort marker
    h += assign("assign-ru", [0, 1]) + assign("assign-rc", [0, 1], "rc")
    h += poll("assign-ru", [(0, 0, "a"), (0, 1, "b"), (0, 2, "t1-0"), (1, 0, "t1-1"), (1, 1, "t2-0"), (1, 3, "c")])
    h += poll("assign-rc", [(0, 0, "a"), (0, 1, "b")], "rc") + poll("assign-rc", [(0, 2, "t1-0"), (1, 0, "t1-1")], "rc")
    h += poll("assign-rc", [(1, 3, "c")], "rc")
    h += commit("classic-0", "g", [(0, 2)]) + commit("classic-1", "g", [(0, 3)])
    ru = [(0, 0, "a"), (0, 1, "b"), (0, 2, "t1-0"), (1, 0, "t1-1"), (1, 1, "t2-0"), (1, 3, "c")]
    rc = [r for r in ru if r[2] != "t2-0"]
    return h, ru, rc


def anomalies(h):
    return dict(checker.check(h).counts)


def test_clean_history_passes():
    h, ru, rc = clean()
    report = checker.check(h + final(ru, rc, {"g": [(0, 3)]}))
    assert report.valid, report.render()


def test_lost_write():
    h, ru, rc = clean()
    assert anomalies(h + final([r for r in ru if r[2] != "b"], [r for r in rc if r[2] != "b"])) == {
        "lost-write": 1, "read-then-rewritten": 2}


def test_lost_committed_transaction():
    h, ru, rc = clean()
    gone = {"t1-0", "t1-1"}
    found = anomalies(h + final([r for r in ru if r[2] not in gone], [r for r in rc if r[2] not in gone]))
    assert found["lost-write"] == 2 and "torn-txn" not in found


def test_duplicate():
    h, ru, rc = clean()
    ru2 = ru + [(1, 4, "a")]
    assert anomalies(h + final(ru2, rc + [(1, 4, "a")])) == {"duplicate": 1}


def test_inconsistent_offset_between_two_polls():
    h, ru, rc = clean()
    h += assign("other", [0]) + poll("other", [(0, 0, "x")])
    h += [op("idem-0", "invoke", "send", {"value": "x", "partition": 0})]
    found = anomalies(h + final(ru, rc))
    assert found["inconsistent-offset"] == 1 and found["read-then-rewritten"] == 1


def test_ack_mismatch():
    h, ru, rc = clean()
    h += send("d", 1, 4)
    moved = [(1, 5, "d"), (1, 4, "zz")]
    h += [op("idem-1", "invoke", "send", {"value": "zz", "partition": 1})]
    found = anomalies(h + final(ru + moved, rc + moved))
    assert found == {"ack-mismatch": 1, "inconsistent-offset": 1}


def test_aborted_read_by_read_committed_consumer():
    h, ru, rc = clean()
    h += assign("late-rc", [1], "rc") + poll("late-rc", [(1, 1, "t2-0")], "rc")
    assert anomalies(h + final(ru, rc)) == {"aborted-read": 1}


def test_aborted_read_in_final_committed_read():
    h, ru, _ = clean()
    # assign-rc went past the aborted record that this final read shows
    assert anomalies(h + final(ru, ru)) == {"aborted-read": 1, "poll-skip": 1}


def test_unknown_transaction_aborted_by_the_broker():
    h, ru, rc = clean()
    h += txn("t3", [(0, 3, "t3-0")], outcome="unknown")
    h += assign("late-rc", [0], "rc") + poll("late-rc", [(0, 3, "t3-0")], "rc")
    ru2 = ru + [(0, 3, "t3-0")]
    assert anomalies(h + final(ru2, rc)) == {"aborted-read": 1}


def test_read_then_rewritten():
    h, ru, rc = clean()
    h += assign("late", [1]) + poll("late", [(1, 4, "e")])
    h += [op("idem-0", "invoke", "send", {"value": "e", "partition": 1})]
    h += send("f", 1, 4)
    found = anomalies(h + final(ru + [(1, 4, "f")], rc + [(1, 4, "f")]))
    assert found == {"read-then-rewritten": 1, "inconsistent-offset": 1}


def test_phantom_read():
    h, ru, rc = clean()
    h += assign("late", [1]) + poll("late", [(1, 4, "never-sent")])
    found = anomalies(h + final(ru + [(1, 4, "never-sent")], rc + [(1, 4, "never-sent")]))
    assert found == {"phantom-read": 3}  # the poll, and both final reads


def test_poll_skip():
    h, ru, rc = clean()
    h += assign("skipper", [0]) + poll("skipper", [(0, 0, "a")]) + poll("skipper", [(0, 2, "t1-0")])
    found = checker.check(h + final(ru, rc))
    assert dict(found.counts) == {"poll-skip": 1}
    assert found.examples["poll-skip"][0]["first_skipped"] == 1


def test_read_committed_consumer_skipping_aborted_records_is_no_skip():
    h, ru, rc = clean()
    h += assign("rc2", [1], "rc") + poll("rc2", [(1, 0, "t1-1")], "rc") + poll("rc2", [(1, 3, "c")], "rc")
    assert anomalies(h + final(ru, rc)) == {}


def test_nonmonotonic_poll_and_reassign_resets():
    h, ru, rc = clean()
    h += assign("back", [0]) + poll("back", [(0, 0, "a"), (0, 1, "b")]) + poll("back", [(0, 1, "b")])
    h += assign("back", [0]) + poll("back", [(0, 0, "a")])  # a seek back: fine
    assert anomalies(h + final(ru, rc)) == {"nonmonotonic-poll": 1}


def test_commit_backwards():
    h, ru, rc = clean()
    h += commit("classic-1", "g", [(0, 1)])
    found = checker.check(h + final(ru, rc))
    assert dict(found.counts) == {"commit-backwards": 1}
    assert found.examples["commit-backwards"][0]["after_acked"] == 3


def test_concurrent_commits_may_land_in_any_order():
    h, ru, rc = clean()
    a_invoke, a_ok = commit("classic-0", "g", [(0, 4)])
    b_invoke, b_ok = commit("classic-1", "g", [(0, 3)])
    a_ok["time"], b_invoke["time"] = b_invoke["time"], a_ok["time"]  # b starts before a is acknowledged
    h += [a_invoke, b_invoke, a_ok, b_ok]
    assert anomalies(h + final(ru, rc, {"g": [(0, 4)]})) == {}


def test_final_committed_offset_lower_than_acknowledged():
    h, ru, rc = clean()
    assert anomalies(h + final(ru, rc, {"g": [(0, 2)]})) == {"commit-backwards": 1}


def test_torn_transaction():
    h, ru, rc = clean()
    assert anomalies(h + final(ru, [r for r in rc if r[2] != "t1-1"])) == {"torn-txn": 1}


def test_g0_write_cycle():
    """Two transactions of one producer ordered one way in partition 2 and the
    other way in partition 3."""
    h, ru, rc = clean()
    h += txn("x1", [(2, 0, "x1-0"), (3, 1, "x1-1")], process="txn-B")
    h += txn("x2", [(2, 1, "x2-0"), (3, 0, "x2-1")], process="txn-B")
    log = [(2, 0, "x1-0"), (2, 1, "x2-0"), (3, 0, "x2-1"), (3, 1, "x1-1")]
    found = checker.check(h + final(ru + log, rc + log))
    assert dict(found.counts) == {"G0": 1}
    assert sorted(found.examples["G0"][0]["cycle"][:2]) == ["x1", "x2"]


def test_g1c_write_read_cycle():
    """y1 read y2's write, yet y1's write precedes y2's in partition 2."""
    h, ru, rc = clean()
    h += txn("y1", [(2, 0, "y1-0")], reads=[(3, 0, "y2-1")], process="txn-A")
    h += txn("y2", [(2, 1, "y2-0"), (3, 0, "y2-1")], process="txn-B")
    log = [(2, 0, "y1-0"), (2, 1, "y2-0"), (3, 0, "y2-1")]
    found = checker.check(h + final(ru + log, rc + log))
    assert dict(found.counts) == {"G1c": 1}
    assert found.examples["G1c"][0]["edges"].count("wr") == 1


def test_reads_in_log_order_make_no_cycle():
    h, ru, rc = clean()
    h += txn("y2", [(2, 0, "y2-0"), (3, 0, "y2-1")], process="txn-B")
    h += txn("y1", [(2, 1, "y1-0")], reads=[(3, 0, "y2-1")], process="txn-A")
    log = [(2, 0, "y2-0"), (2, 1, "y1-0"), (3, 0, "y2-1")]
    assert anomalies(h + final(ru + log, rc + log)) == {}


def test_harness_events_count():
    h, ru, rc = clean()
    h += [op("harness", "info", "restart-refused", {"node": 2}), op("harness", "info", "restart-refused", {"node": 2})]
    assert anomalies(h + final(ru, rc)) == {"restart-refused": 2}


def test_incomplete_final_read():
    h, ru, rc = clean()
    h += final(ru, rc)
    h[-1]["type"] = "info"
    assert anomalies(h) == {"final-read-incomplete": 1}
    assert anomalies(clean()[0]) == {"final-read-incomplete": 1}
