"""kafka-python against the strata broker (no consumer groups: group_id=None + assign)."""

import time

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka import codec as kcodec
from kafka.admin import KafkaAdminClient, NewPartitions, NewTopic
from kafka.errors import (InvalidPartitionsError, TopicAlreadyExistsError,
                          UnknownTopicOrPartitionError)

from helpers import TIMEOUT, wait_until

TIMEOUT_MS = int(TIMEOUT * 1000)

CODEC_AVAILABLE = {
    None: True,
    "gzip": kcodec.has_gzip(),
    "snappy": kcodec.has_snappy(),
    "lz4": kcodec.has_lz4(),
    "zstd": kcodec.has_zstd(),
}


def admin_client(bootstrap):
    return KafkaAdminClient(bootstrap_servers=bootstrap, client_id="strata-it-admin",
                            request_timeout_ms=TIMEOUT_MS)


def create_topic(admin, topic, partitions=1, configs=None):
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1,
                                  topic_configs=configs or {})], timeout_ms=TIMEOUT_MS)
    wait_until(lambda: topic in admin.list_topics(), what=f"{topic} in list_topics")


def make_consumer(bootstrap, **kw):
    return KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False,
                         auto_offset_reset="earliest", check_crcs=True,
                         request_timeout_ms=TIMEOUT_MS + 5000, **kw)


def poll_n(consumer, n, timeout=TIMEOUT):
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        batch = consumer.poll(timeout_ms=500)
        for recs in batch.values():
            out.extend(recs)
    assert len(out) == n, f"consumed {len(out)} of {n} records within {timeout}s"
    return out


def test_admin_create_list_describe_delete(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    try:
        create_topic(admin, topic_name, partitions=2, configs={"retention.ms": "123456789"})

        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic(topic_name, num_partitions=1, replication_factor=1)],
                                timeout_ms=TIMEOUT_MS)

        (desc,) = admin.describe_topics([topic_name])
        assert desc["name"] == topic_name
        assert desc["error_code"] == 0
        assert sorted(p["partition_index"] for p in desc["partitions"]) == [0, 1]
        for p in desc["partitions"]:
            assert p["error_code"] == 0
            assert p["leader_id"] >= 0
            assert p["replica_nodes"] == [p["leader_id"]]
            assert p["isr_nodes"] == [p["leader_id"]]

        admin.create_partitions({topic_name: NewPartitions(total_count=3)}, timeout_ms=TIMEOUT_MS)

        def three():
            (d,) = admin.describe_topics([topic_name])
            return len(d["partitions"]) == 3

        wait_until(three, what=f"{topic_name} with 3 partitions")

        with pytest.raises(InvalidPartitionsError):
            admin.create_partitions({topic_name: NewPartitions(total_count=2)},
                                    timeout_ms=TIMEOUT_MS)

        admin.delete_topics([topic_name], timeout_ms=TIMEOUT_MS)
        wait_until(lambda: topic_name not in admin.list_topics(),
                   what=f"{topic_name} gone from list_topics")

        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics([topic_name], timeout_ms=TIMEOUT_MS)
    finally:
        admin.close()


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"],
                         ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_consume(bootstrap, topic_name, codec):
    if not CODEC_AVAILABLE[codec]:
        pytest.skip(f"kafka-python has no {codec} codec library installed")
    admin = admin_client(bootstrap)
    try:
        create_topic(admin, topic_name)
    finally:
        admin.close()

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", compression_type=codec,
                             linger_ms=20, request_timeout_ms=TIMEOUT_MS)
    expected = []
    futures = []
    try:
        for i in range(150):
            key = None if i % 10 == 3 else b"k%d" % i
            value = None if i % 10 == 7 else (b"value-%d " % i) * (1 + i % 8)
            headers = [("idx", str(i).encode()), ("kind", b"py")] if i % 2 == 0 else []
            expected.append((key, value, headers))
            futures.append(producer.send(topic_name, key=key, value=value, headers=headers,
                                         partition=0))
        producer.flush(timeout=TIMEOUT)
        metas = [f.get(timeout=TIMEOUT) for f in futures]
    finally:
        producer.close(timeout=5)
    assert [m.offset for m in metas] == list(range(150))
    assert all(m.partition == 0 and m.topic == topic_name for m in metas)

    tp = TopicPartition(topic_name, 0)
    consumer = make_consumer(bootstrap)
    try:
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        recs = poll_n(consumer, 150)
    finally:
        consumer.close()
    assert [r.offset for r in recs] == list(range(150))
    for r, (key, value, headers) in zip(recs, expected):
        assert r.key == key, f"offset {r.offset}"
        assert r.value == value, f"offset {r.offset}"
        assert list(r.headers) == headers, f"offset {r.offset}"
        assert r.timestamp_type == 0  # CreateTime


def test_offset_queries_and_seek(bootstrap, topic_name):
    admin = admin_client(bootstrap)
    try:
        create_topic(admin, topic_name, partitions=2)
    finally:
        admin.close()
    base = int(time.time() * 1000) - 60_000
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all",
                             request_timeout_ms=TIMEOUT_MS)
    try:
        fs = [producer.send(topic_name, value=b"t%d" % i, partition=0,
                            timestamp_ms=base + i * 1000) for i in range(5)]
        fs.append(producer.send(topic_name, value=b"p1", partition=1, timestamp_ms=base))
        producer.flush(timeout=TIMEOUT)
        [f.get(timeout=TIMEOUT) for f in fs]
    finally:
        producer.close(timeout=5)

    tp0, tp1 = TopicPartition(topic_name, 0), TopicPartition(topic_name, 1)
    consumer = make_consumer(bootstrap)
    try:
        assert consumer.beginning_offsets([tp0, tp1]) == {tp0: 0, tp1: 0}
        assert consumer.end_offsets([tp0, tp1]) == {tp0: 5, tp1: 1}

        r = consumer.offsets_for_times({tp0: base + 1500, tp1: base})
        assert (r[tp0].offset, r[tp0].timestamp) == (2, base + 2000)
        assert (r[tp1].offset, r[tp1].timestamp) == (0, base)
        r = consumer.offsets_for_times({tp0: base + 10_000})
        assert r[tp0] is None

        consumer.assign([tp0])
        consumer.seek(tp0, 3)
        recs = poll_n(consumer, 2)
        assert [(x.offset, x.value, x.timestamp) for x in recs] == \
            [(3, b"t3", base + 3000), (4, b"t4", base + 4000)]

        consumer.seek_to_beginning(tp0)
        recs = poll_n(consumer, 5)
        assert [x.value for x in recs] == [b"t%d" % i for i in range(5)]
        assert consumer.position(tp0) == 5
    finally:
        consumer.close()


@pytest.mark.parametrize("in_flight", [1, 2, 5])
def test_idempotent_pipelined_producer_then_subscribed_consumer(bootstrap, topic_name, in_flight):
    """Issue 12's report: records written by an idempotent producer with five
    requests in flight were not read by a subscribing group-less consumer."""
    admin = admin_client(bootstrap)
    try:
        create_topic(admin, topic_name, partitions=4)
    finally:
        admin.close()
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True,
                             max_in_flight_requests_per_connection=in_flight,
                             request_timeout_ms=TIMEOUT_MS)
    try:
        futures = [producer.send(topic_name, key=b"k%d" % i, value=b"v%d" % i)
                   for i in range(100)]
        producer.flush(timeout=TIMEOUT)
        metas = [f.get(timeout=TIMEOUT) for f in futures]
    finally:
        producer.close(timeout=5)
    assert len({m.partition for m in metas}) > 1

    consumer = make_consumer(bootstrap)
    try:
        consumer.subscribe([topic_name])
        recs = poll_n(consumer, 100)
    finally:
        consumer.close()
    assert sorted(r.value for r in recs) == sorted(b"v%d" % i for i in range(100))
    for r in recs:
        assert r.key == b"k" + r.value[1:]


def test_admin_apis_operators_use(bootstrap, topic_name):
    """kafka-python 3.0 infers its newest known release, 4.3, from the advertised
    API versions (DescribeLogDirs v5 is its marker) and gets answers from the
    admin APIs it exposes."""
    from kafka.admin import ConfigResource, ConfigResourceType
    admin = admin_client(bootstrap)
    try:
        create_topic(admin, topic_name, partitions=3)
        (node,) = [b["broker_id"] for b in admin.describe_cluster()["brokers"]]
        assert admin.get_broker_version_data(node).broker_version == (4, 3)

        configs = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, str(node))],
                                         config_filter="all")["broker"][str(node)]
        assert configs["advertised.listeners"]["value"] == "PLAINTEXT://" + bootstrap
        assert configs["advertised.listeners"]["config_source"] == "STATIC_BROKER_CONFIG"
        assert configs["log.cleaner.min.cleanable.ratio"]["value"] == "0.5"
        assert configs["num.partitions"]["read_only"]

        dirs = admin.describe_log_dirs()
        (entry,) = [b for b in dirs if b["broker"] == node]
        listed = {(t["name"], p["partition_index"])
                  for d in entry["log_dirs"] for t in d["topics"] for p in t["partitions"]}
        assert {(topic_name, i) for i in range(3)} <= listed

        page = admin.describe_topic_partitions([topic_name], 2)
        assert [p["partition_index"] for p in page["topics"][0]["partitions"]] == [0, 1]
        assert page["next_cursor"] == {"topic_name": topic_name, "partition_index": 2}

        r = admin.elect_leaders(0, {topic_name: [0, 9]}, raise_errors=False)
        codes = {p.partition_id: p.error_code
                 for t in r.replica_election_results for p in t.partition_result}
        assert codes == {0: 84, 9: 3}  # ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION

        quorum = admin.describe_metadata_quorum()
        (p,) = quorum["topics"][0]["partitions"]
        assert p["leader_id"] == node
        assert [v["replica_id"] for v in p["current_voters"]] == [node]

        assert admin.list_partition_reassignments() == {}
        tp = TopicPartition(topic_name, 0)
        assert admin.alter_partition_reassignments({tp: [node]}) == {tp: None}
        assert admin.alter_partition_reassignments({tp: [node + 100]})[tp] is not None
    finally:
        admin.close()
