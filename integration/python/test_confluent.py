"""confluent-kafka (librdkafka) against the strata broker.

Consumer groups are not implemented by the broker: every consumer here uses
assign() with explicit offsets and enable.auto.commit=False. confluent-kafka
insists on a group.id, which is set but never used for commits.
"""

import os
import time

import pytest
from confluent_kafka import (OFFSET_BEGINNING, OFFSET_END, TIMESTAMP_CREATE_TIME, Consumer,
                             KafkaError, KafkaException, Producer, TopicPartition)
from confluent_kafka.admin import (AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource,
                                   ConfigSource, NewPartitions, NewTopic, OffsetSpec,
                                   ResourceType)

from helpers import TIMEOUT, wait_until

CODECS = ["none", "gzip", "snappy", "lz4", "zstd"]


# --------------------------------------------------------------------------- helpers

def admin_client(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def all_topics(admin):
    # Metadata for *all* topics: never triggers auto-creation (asking for one
    # named topic from a producer-type handle such as AdminClient may).
    return admin.list_topics(timeout=TIMEOUT).topics


def wait_topic_partitions(admin, topic, n):
    def ready():
        t = all_topics(admin).get(topic)
        return (t is not None and t.error is None and len(t.partitions) == n
                and all(p.leader >= 0 for p in t.partitions.values()))

    wait_until(ready, what=f"topic {topic} with {n} partitions and leaders in metadata")


def create_topic(admin, topic, partitions=1, config=None):
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                       config=config or {})], request_timeout=TIMEOUT)
    fs[topic].result(timeout=TIMEOUT)
    wait_topic_partitions(admin, topic, partitions)


def kafka_error_code(exc_info):
    err = exc_info.value.args[0]
    assert isinstance(err, KafkaError), f"unexpected exception payload {err!r}"
    return err.code()


def produce_all(bootstrap, topic, msgs, **conf):
    """Produce dicts of Producer.produce kwargs; return delivered (partition, offset, msg)."""
    errors = []
    p = Producer({"bootstrap.servers": bootstrap, "error_cb": errors.append,
                  "message.timeout.ms": int(TIMEOUT * 1000), **conf})
    reports = []

    def on_delivery(err, msg):
        reports.append((err, msg))

    for m in msgs:
        p.produce(topic, on_delivery=on_delivery, **m)
        p.poll(0)
    remaining = p.flush(TIMEOUT)
    assert remaining == 0, f"{remaining} messages still undelivered after {TIMEOUT}s"
    failed = [(err, msg.partition()) for err, msg in reports if err is not None]
    assert not failed, f"delivery failures: {failed}"
    assert len(reports) == len(msgs)
    fatal = [e for e in errors if e.fatal()]
    assert not fatal, f"fatal producer errors: {fatal}"
    return [(msg.partition(), msg.offset(), msg) for _, msg in reports]


def make_consumer(bootstrap, **conf):
    return Consumer({
        "bootstrap.servers": bootstrap,
        # Required by confluent-kafka; never used: assign() only, no commits.
        "group.id": "strata-it-unused",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "auto.offset.reset": "earliest",
        "check.crcs": True,
        **conf,
    })


def consume_n(consumer, n, timeout=TIMEOUT):
    """Poll until n messages arrived; fail on any partition-level error."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        err = msg.error()
        if err is not None:
            if err.code() == KafkaError._PARTITION_EOF:
                continue
            if err.fatal() or msg.topic() is not None:
                raise AssertionError(f"consumer error on {msg.topic()}[{msg.partition()}]: {err}")
            # Non-partition, non-fatal errors (e.g. transient transport notices)
            # are not what these tests check.
            continue
        out.append(msg)
    assert len(out) == n, f"consumed {len(out)} of {n} messages within {timeout}s"
    return out


def consume_from(bootstrap, topic, n, partitions=(0,), offset=OFFSET_BEGINNING, **conf):
    c = make_consumer(bootstrap, **conf)
    try:
        c.assign([TopicPartition(topic, p, offset) for p in partitions])
        return consume_n(c, n)
    finally:
        c.close()


def assert_no_more(consumer, wait=1.0):
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error() is None:
            raise AssertionError(f"unexpected extra message at offset {msg.offset()}: {msg.value()!r}")


# --------------------------------------------------------------------------- admin

def test_metadata_cluster_and_broker(bootstrap, broker):
    admin = admin_client(bootstrap)
    md = admin.list_topics(timeout=TIMEOUT)
    assert len(md.brokers) == 1, md.brokers
    (b,) = md.brokers.values()
    assert (b.host, b.port) == (broker.host, broker.port)
    # (orig_broker_id is not checked: librdkafka reports -1 when the answer came
    # over the bootstrap connection, which is a client-side timing detail)
    assert md.controller_id == b.id
    assert md.cluster_id, "Metadata response carries no cluster id"


def test_admin_create_describe_alter_partitions_delete(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name, partitions=3,
                 config={"retention.ms": "3600000", "cleanup.policy": "delete",
                         "max.message.bytes": "2000000"})

    md = admin.list_topics(timeout=TIMEOUT)
    (broker_id,) = md.brokers.keys()
    t = md.topics[topic_name]
    assert sorted(t.partitions) == [0, 1, 2]
    for pid, p in t.partitions.items():
        assert p.id == pid
        assert p.leader == broker_id
        assert list(p.replicas) == [broker_id]
        assert list(p.isrs) == [broker_id]
        assert p.error is None

    # describe_configs reflects the creation-time overrides as dynamic topic configs
    res = ConfigResource(ResourceType.TOPIC, topic_name)
    entries = admin.describe_configs([res], request_timeout=TIMEOUT)[res].result(timeout=TIMEOUT)
    assert entries["retention.ms"].value == "3600000"
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["cleanup.policy"].value == "delete"
    assert entries["max.message.bytes"].value == "2000000"

    # incremental_alter_configs: SET one key, DELETE (revert) another
    alter = ConfigResource(ResourceType.TOPIC, topic_name, incremental_configs=[
        ConfigEntry("retention.ms", "7200000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    admin.incremental_alter_configs([alter], request_timeout=TIMEOUT)[alter].result(timeout=TIMEOUT)

    def altered():
        e = admin.describe_configs([res], request_timeout=TIMEOUT)[res].result(timeout=TIMEOUT)
        return e if e["retention.ms"].value == "7200000" else None

    entries = wait_until(altered, what="retention.ms=7200000 in describe_configs")
    assert entries["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["max.message.bytes"].value != "2000000"
    assert entries["max.message.bytes"].source != ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert entries["cleanup.policy"].value == "delete"

    # create_partitions grows the topic to 5
    admin.create_partitions([NewPartitions(topic_name, 5)],
                            request_timeout=TIMEOUT)[topic_name].result(timeout=TIMEOUT)
    wait_topic_partitions(admin, topic_name, 5)

    # new partitions are usable
    delivered = produce_all(bootstrap, topic_name,
                            [{"partition": p, "value": f"p{p}".encode()} for p in range(5)])
    assert sorted((p, o) for p, o, _ in delivered) == [(p, 0) for p in range(5)]
    got = consume_from(bootstrap, topic_name, 5, partitions=range(5))
    assert sorted((m.partition(), m.value()) for m in got) == [(p, f"p{p}".encode()) for p in range(5)]

    # delete_topics removes it from metadata
    admin.delete_topics([topic_name], request_timeout=TIMEOUT)[topic_name].result(timeout=TIMEOUT)
    wait_until(lambda: topic_name not in all_topics(admin), what=f"{topic_name} gone from metadata")


def test_admin_error_cases(bootstrap, topic_name, unique_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name, partitions=2)

    # creating it again: TOPIC_ALREADY_EXISTS
    fs = admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                             request_timeout=TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[topic_name].result(timeout=TIMEOUT)
    assert kafka_error_code(ei) == KafkaError.TOPIC_ALREADY_EXISTS

    # shrinking partitions: INVALID_PARTITIONS
    fs = admin.create_partitions([NewPartitions(topic_name, 1)], request_timeout=TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[topic_name].result(timeout=TIMEOUT)
    assert kafka_error_code(ei) == KafkaError.INVALID_PARTITIONS

    # deleting an unknown topic: UNKNOWN_TOPIC_OR_PART
    missing = unique_name("-missing")
    fs = admin.delete_topics([missing], request_timeout=TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[missing].result(timeout=TIMEOUT)
    assert kafka_error_code(ei) == KafkaError.UNKNOWN_TOPIC_OR_PART

    # an illegal topic name: INVALID_TOPIC_EXCEPTION
    bad = "bad/topic*name"
    fs = admin.create_topics([NewTopic(bad, num_partitions=1, replication_factor=1)],
                             request_timeout=TIMEOUT)
    with pytest.raises(KafkaException) as ei:
        fs[bad].result(timeout=TIMEOUT)
    assert kafka_error_code(ei) == KafkaError.TOPIC_EXCEPTION

    # validate_only does not create the topic
    vo = unique_name("-validate-only")
    fs = admin.create_topics([NewTopic(vo, num_partitions=1, replication_factor=1)],
                             validate_only=True, request_timeout=TIMEOUT)
    fs[vo].result(timeout=TIMEOUT)
    assert vo not in all_topics(admin)

    # the original topic still has its 2 partitions
    assert len(all_topics(admin)[topic_name].partitions) == 2


def test_delete_records(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name, partitions=1)
    produce_all(bootstrap, topic_name, [{"partition": 0, "value": b"r%d" % i} for i in range(10)])

    tp = TopicPartition(topic_name, 0, 4)
    res = admin.delete_records([tp], request_timeout=TIMEOUT)
    (fut,) = res.values()
    deleted = fut.result(timeout=TIMEOUT)
    assert deleted.low_watermark == 4

    c = make_consumer(bootstrap)
    try:
        lo, hi = c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT)
        assert (lo, hi) == (4, 10)
        c.assign([TopicPartition(topic_name, 0, OFFSET_BEGINNING)])
        msgs = consume_n(c, 6)
        assert [(m.offset(), m.value()) for m in msgs] == [(i, b"r%d" % i) for i in range(4, 10)]
        assert_no_more(c, wait=0.5)
    finally:
        c.close()


# --------------------------------------------------------------------------- produce / consume

def test_keys_headers_null_keys_tombstones(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    explicit_ts = 1_600_000_000_123
    msgs = [
        {"key": b"k0", "value": b"v0"},
        {"key": None, "value": b"no-key"},
        {"key": b"tomb", "value": None},
        {"key": b"h", "value": b"with-headers",
         "headers": [("h1", b"a"), ("h2", b""), ("h1", b"dup"), ("unicodé", "ü".encode())]},
        {"key": b"", "value": b""},
        {"key": b"bin\x00\xff", "value": bytes(range(256))},
        {"key": b"nullhdr", "value": b"x", "headers": [("nullh", None)]},
        {"key": b"ts", "value": b"explicit-ts", "timestamp": explicit_ts},
        {"key": None, "value": None},
    ]
    before = int(time.time() * 1000)
    delivered = produce_all(bootstrap, topic_name, [dict(m, partition=0) for m in msgs])
    after = int(time.time() * 1000)
    assert [o for _, o, _ in delivered] == list(range(len(msgs)))

    got = consume_from(bootstrap, topic_name, len(msgs))
    for i, (m, exp) in enumerate(zip(got, msgs)):
        assert m.offset() == i
        assert m.key() == exp["key"], f"offset {i}"
        assert m.value() == exp["value"], f"offset {i}"
        exp_headers = exp.get("headers")
        assert m.headers() == (exp_headers if exp_headers else None), f"offset {i}"
        ts_type, ts = m.timestamp()
        assert ts_type == TIMESTAMP_CREATE_TIME, f"offset {i}"
        if "timestamp" in exp:
            assert ts == exp["timestamp"]
        else:
            assert before - 5000 <= ts <= after + 5000, f"offset {i} timestamp {ts}"


@pytest.mark.parametrize("codec", CODECS)
def test_compression_roundtrip(bootstrap, topic_name, codec):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    n = 500
    msgs = [{"partition": 0, "key": f"key-{i}".encode(),
             "value": (f"value {i} " + "compressible payload " * (i % 20)).encode(),
             "headers": [("i", str(i).encode())]}
            for i in range(n)]
    delivered = produce_all(bootstrap, topic_name, msgs, **{
        "compression.type": codec, "linger.ms": 50, "batch.num.messages": 1000})
    assert [o for _, o, _ in delivered] == list(range(n))

    # a second, small batch continues right after the (compressed) first one
    tail = [{"partition": 0, "key": None, "value": f"tail {j}".encode()} for j in range(10)]
    delivered = produce_all(bootstrap, topic_name, tail, **{"compression.type": codec})
    assert [o for _, o, _ in delivered] == list(range(n, n + 10))

    got = consume_from(bootstrap, topic_name, n + 10)
    assert [m.offset() for m in got] == list(range(n + 10))
    for m, exp in zip(got, msgs + tail):
        assert m.key() == exp["key"]
        assert m.value() == exp["value"]
        assert m.headers() == exp.get("headers")

    # starting in the middle of a compressed batch yields exactly from that offset
    got = consume_from(bootstrap, topic_name, n + 10 - 250, offset=250)
    assert [m.offset() for m in got] == list(range(250, n + 10))
    assert got[0].value() == msgs[250]["value"]

    c = make_consumer(bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT) == (0, n + 10)
    finally:
        c.close()


def test_multi_partition_roundtrip(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name, partitions=4)
    msgs = [{"partition": i % 4, "key": b"k%d" % i, "value": b"v%d" % i} for i in range(80)]
    delivered = produce_all(bootstrap, topic_name, msgs)
    for p in range(4):
        assert sorted(o for dp, o, _ in delivered if dp == p) == list(range(20))
    got = consume_from(bootstrap, topic_name, 80, partitions=range(4))
    for p in range(4):
        in_p = [m for m in got if m.partition() == p]
        assert [m.offset() for m in in_p] == list(range(20))
        assert [m.value() for m in in_p] == [b"v%d" % i for i in range(p, 80, 4)]


def test_keyed_default_partitioner_is_consistent(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name, partitions=3)
    keys = [b"alpha", b"beta", b"gamma", b"delta"]
    msgs = [{"key": keys[i % 4], "value": b"%d" % i} for i in range(40)]
    delivered = produce_all(bootstrap, topic_name, msgs)
    part_of = {}
    for p, _, m in delivered:
        part_of.setdefault(m.key(), set()).add(p)
    assert all(len(s) == 1 for s in part_of.values()), part_of
    got = consume_from(bootstrap, topic_name, 40, partitions=range(3))
    for m in got:
        assert {m.partition()} == part_of[m.key()]
    # per-key order is preserved
    for k in keys:
        assert [m.value() for m in got if m.key() == k] == \
            [x["value"] for x in msgs if x["key"] == k]


def test_large_message(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    big = os.urandom(700 * 1024)
    msgs = [{"partition": 0, "value": b"small-before"},
            {"partition": 0, "key": b"big", "value": big},
            {"partition": 0, "value": b"small-after"}]
    produce_all(bootstrap, topic_name, msgs)
    got = consume_from(bootstrap, topic_name, 3)
    assert [m.value() for m in got] == [b"small-before", big, b"small-after"]


def test_seek_offset_and_consume_from_end(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    produce_all(bootstrap, topic_name, [{"partition": 0, "value": b"m%d" % i} for i in range(10)])

    got = consume_from(bootstrap, topic_name, 3, offset=7)
    assert [(m.offset(), m.value()) for m in got] == [(7, b"m7"), (8, b"m8"), (9, b"m9")]

    c = make_consumer(bootstrap)
    try:
        c.assign([TopicPartition(topic_name, 0, OFFSET_END)])
        # wait for the consumer to reach the end (EOF event) before producing more
        eof = wait_until(lambda: _poll_for_eof(c), what="partition EOF at OFFSET_END")
        assert eof == 10
        produce_all(bootstrap, topic_name, [{"partition": 0, "value": b"late"}])
        (m,) = consume_n(c, 1)
        assert (m.offset(), m.value()) == (10, b"late")
    finally:
        c.close()


def _poll_for_eof(consumer):
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is not None and msg.error().code() == KafkaError._PARTITION_EOF:
        return msg.offset() if msg.offset() >= 0 else True
    if msg is not None and msg.error() is None:
        raise AssertionError(f"unexpected message at offset {msg.offset()} when assigned at end")
    return None


def test_offsets_for_times_and_watermarks(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    base = int(time.time() * 1000) - 60_000
    msgs = [{"partition": 0, "value": b"t%d" % i, "timestamp": base + i * 1000} for i in range(5)]
    produce_all(bootstrap, topic_name, msgs)

    c = make_consumer(bootstrap)
    try:
        assert c.get_watermark_offsets(TopicPartition(topic_name, 0), timeout=TIMEOUT) == (0, 5)
        cases = {base - 10_000: 0, base: 0, base + 1: 1, base + 1500: 2, base + 4000: 4,
                 base + 5000: OFFSET_END}
        for ts, expected in cases.items():
            (r,) = c.offsets_for_times([TopicPartition(topic_name, 0, ts)], timeout=TIMEOUT)
            assert r.error is None
            assert r.offset == expected, f"timestamp base+{ts - base}: got {r.offset}"

        # seek to the offset found for a timestamp and read from there
        (r,) = c.offsets_for_times([TopicPartition(topic_name, 0, base + 2500)], timeout=TIMEOUT)
        c.assign([TopicPartition(topic_name, 0, r.offset)])
        got = consume_n(c, 2)
        assert [(m.offset(), m.timestamp()[1]) for m in got] == [(3, base + 3000), (4, base + 4000)]
    finally:
        c.close()


def test_offsets_for_times_out_of_order_timestamps(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    base = int(time.time() * 1000) - 60_000
    offsets_ts = [0, 3000, 1000, 4000, 2000]
    produce_all(bootstrap, topic_name, [{"partition": 0, "value": b"x", "timestamp": base + d}
                                        for d in offsets_ts])
    c = make_consumer(bootstrap)
    try:
        # Kafka returns the earliest offset whose timestamp is >= the target
        for target, expected in [(1500, 1), (2000, 1), (3500, 3), (4000, 3), (4500, OFFSET_END)]:
            (r,) = c.offsets_for_times([TopicPartition(topic_name, 0, base + target)],
                                       timeout=TIMEOUT)
            assert r.offset == expected, f"target base+{target}: got {r.offset}"
    finally:
        c.close()


def test_admin_list_offsets(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    base = int(time.time() * 1000) - 60_000
    stamps = [0, 1000, 4000, 2000]
    # one batch per record: (Kafka 3.7 itself answers max_timestamp with the batch's
    # last offset, KAFKA-16310; with single-record batches every reading agrees)
    for d in stamps:
        produce_all(bootstrap, topic_name, [{"partition": 0, "value": b"x", "timestamp": base + d}])
    tp = TopicPartition(topic_name, 0)
    specs = {"earliest": OffsetSpec.earliest(), "latest": OffsetSpec.latest(),
             "ts": OffsetSpec.for_timestamp(base + 1500)}
    results = {}
    for name, spec in specs.items():
        fs = admin.list_offsets({tp: spec}, request_timeout=TIMEOUT)
        results[name] = fs[tp].result(timeout=TIMEOUT)
    assert results["earliest"].offset == 0
    assert results["latest"].offset == 4
    assert results["ts"].offset == 2
    assert results["ts"].timestamp == base + 4000

    # max_timestamp (ListOffsets v7): the record with the largest timestamp
    fs = admin.list_offsets({tp: OffsetSpec.max_timestamp()}, request_timeout=TIMEOUT)
    r = fs[tp].result(timeout=TIMEOUT)
    assert (r.offset, r.timestamp) == (2, base + 4000)


def test_idempotent_producer(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name, partitions=3)
    n = 300
    msgs = [{"key": b"key-%d" % (i % 17), "value": b"idem-%d" % i} for i in range(n)]
    delivered = produce_all(bootstrap, topic_name, msgs, **{
        "enable.idempotence": True, "linger.ms": 5, "max.in.flight.requests.per.connection": 5})
    by_part = {}
    for p, o, m in delivered:
        by_part.setdefault(p, []).append((o, m.value()))
    for p, lst in by_part.items():
        assert sorted(o for o, _ in lst) == list(range(len(lst))), f"partition {p} offsets"

    got = consume_from(bootstrap, topic_name, n, partitions=range(3))
    assert len({m.value() for m in got}) == n  # nothing duplicated or lost
    for p, lst in by_part.items():
        assert [(m.offset(), m.value()) for m in got if m.partition() == p] == sorted(lst)

    # a second idempotent producer session (new producer id) appends after the first
    delivered = produce_all(bootstrap, topic_name, [{"partition": 0, "value": b"second"}],
                            **{"enable.idempotence": True})
    assert delivered[0][1] == len(by_part.get(0, []))


def test_idempotent_producer_compressed(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    create_topic(admin, topic_name)
    msgs = [{"partition": 0, "value": b"zstd-idem-%d " % i * 10} for i in range(200)]
    delivered = produce_all(bootstrap, topic_name, msgs, **{
        "enable.idempotence": True, "compression.type": "zstd", "linger.ms": 20})
    assert [o for _, o, _ in delivered] == list(range(200))
    got = consume_from(bootstrap, topic_name, 200)
    assert [m.value() for m in got] == [m["value"] for m in msgs]


def test_auto_create_topic_on_produce(bootstrap, topic_name):
    if os.environ.get("STRATA_AUTO_CREATE", "true") != "true":
        pytest.skip("broker started without --auto-create-topics true")
    admin = admin_client(bootstrap)
    assert topic_name not in all_topics(admin)
    delivered = produce_all(bootstrap, topic_name, [{"value": b"auto"}])
    assert delivered[0][:2] == (0, 0)
    wait_topic_partitions(admin, topic_name, 1)
    got = consume_from(bootstrap, topic_name, 1)
    assert got[0].value() == b"auto"
