"""Transactional producers of confluent-kafka, kafka-python and aiokafka, each read back by
read_committed consumers of the other clients: committed transactions whole, aborted ones not
at all (but visible to read_uncommitted readers), and an open transaction holding read_committed
readers at its first offset until it commits.
"""

import asyncio
import time
import uuid

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer as KPConsumer
from kafka import KafkaProducer as KPProducer
from kafka import TopicPartition as KPTopicPartition

from helpers import TIMEOUT

PARTITIONS = 2


def create_topic(bootstrap, topic, partitions=PARTITIONS):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)],
                        request_timeout=TIMEOUT)[topic].result(timeout=TIMEOUT)


def values(prefix, n):
    return [f"{prefix}-{i}" for i in range(n)]


def read_confluent(bootstrap, topic, isolation, partitions=PARTITIONS):
    """Every value up to the end offset of each partition for this isolation level (the LSO for
    read_committed), read with librdkafka."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "unused-" + uuid.uuid4().hex,
                  "enable.auto.commit": False, "enable.partition.eof": True,
                  "isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        got, at_end = [], set()
        deadline = time.monotonic() + TIMEOUT
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"{isolation} read stuck; got {got}, ends {at_end}"
            m = c.poll(0.2)
            if m is None:
                continue
            if m.error():
                assert m.error().code() == KafkaError._PARTITION_EOF, m.error()
                at_end.add(m.partition())
                continue
            at_end.discard(m.partition())
            got.append(m.value().decode())
        return sorted(got)
    finally:
        c.close()


def read_kafka_python(bootstrap, topic, isolation, partitions=PARTITIONS):
    c = KPConsumer(bootstrap_servers=bootstrap, isolation_level=isolation,
                   enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        tps = [KPTopicPartition(topic, p) for p in range(partitions)]
        c.assign(tps)
        c.seek_to_beginning(*tps)
        end = c.end_offsets(tps)  # honours isolation_level: the LSO for read_committed
        got = []
        deadline = time.monotonic() + TIMEOUT
        while any(c.position(tp) < end[tp] for tp in tps):
            assert time.monotonic() < deadline, f"{isolation} read stuck; got {got}, end {end}"
            for recs in c.poll(timeout_ms=200).values():
                got.extend(r.value.decode() for r in recs)
        return sorted(got)
    finally:
        c.close()


def assert_reads(want, read, *args):
    """Asserts what read(*args) returns, retrying for a while: the COMMIT/ABORT markers that move
    the LSO are written after EndTxn's answer."""
    deadline = time.monotonic() + TIMEOUT
    while (got := read(*args)) != want and time.monotonic() < deadline:
        time.sleep(0.2)
    assert got == want, f"{read.__name__}{args[1:]}"


def confluent_txn_producer(bootstrap, tid):
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 5})
    p.init_transactions(TIMEOUT)
    return p


def confluent_send(p, topic, vals):
    for i, v in enumerate(vals):
        p.produce(topic, value=v.encode(), partition=i % PARTITIONS)


@pytest.mark.timeout(90)
def test_confluent_commit_and_abort_read_back_by_read_committed_consumers(bootstrap, topic_name):
    create_topic(bootstrap, topic_name)
    p = confluent_txn_producer(bootstrap, "ck-" + topic_name)
    p.begin_transaction()
    confluent_send(p, topic_name, values("c1", 40))
    p.commit_transaction(TIMEOUT)
    p.begin_transaction()
    confluent_send(p, topic_name, values("aborted", 40))
    p.flush(TIMEOUT)
    p.abort_transaction(TIMEOUT)
    p.begin_transaction()
    confluent_send(p, topic_name, values("c2", 40))
    p.commit_transaction(TIMEOUT)

    committed = sorted(values("c1", 40) + values("c2", 40))
    assert_reads(committed, read_confluent, bootstrap, topic_name, "read_committed")
    assert_reads(committed, read_kafka_python, bootstrap, topic_name, "read_committed")
    everything = sorted(committed + values("aborted", 40))
    assert_reads(everything, read_confluent, bootstrap, topic_name, "read_uncommitted")
    assert_reads(everything, read_kafka_python, bootstrap, topic_name, "read_uncommitted")


@pytest.mark.timeout(90)
def test_confluent_open_transaction_holds_read_committed_readers_until_commit(bootstrap, topic_name):
    create_topic(bootstrap, topic_name, partitions=1)
    plain = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    plain.produce(topic_name, value=b"before", partition=0)
    plain.flush(TIMEOUT)
    p = confluent_txn_producer(bootstrap, "ck-open-" + topic_name)
    p.begin_transaction()
    p.produce(topic_name, value=b"in-txn", partition=0)
    p.flush(TIMEOUT)
    plain.produce(topic_name, value=b"after", partition=0)
    plain.flush(TIMEOUT)

    assert_reads(["before"], read_confluent, bootstrap, topic_name, "read_committed", 1)
    assert_reads(["before"], read_kafka_python, bootstrap, topic_name, "read_committed", 1)
    assert_reads(["after", "before", "in-txn"], read_confluent, bootstrap, topic_name,
                 "read_uncommitted", 1)
    p.commit_transaction(TIMEOUT)
    assert_reads(["after", "before", "in-txn"], read_confluent, bootstrap, topic_name,
                 "read_committed", 1)
    assert_reads(["after", "before", "in-txn"], read_kafka_python, bootstrap, topic_name,
                 "read_committed", 1)


@pytest.mark.timeout(90)
def test_kafka_python_commit_and_abort_read_back_by_read_committed_consumers(bootstrap, topic_name):
    create_topic(bootstrap, topic_name)
    p = KPProducer(bootstrap_servers=bootstrap, transactional_id="kp-" + topic_name,
                   enable_idempotence=True, linger_ms=5)
    try:
        p.init_transactions()
        for prefix, commit in (("c1", True), ("aborted", False), ("c2", True)):
            p.begin_transaction()
            for i, v in enumerate(values(prefix, 30)):
                p.send(topic_name, value=v.encode(), partition=i % PARTITIONS)
            if commit:
                p.commit_transaction()
            else:
                p.flush()
                p.abort_transaction()
    finally:
        p.close(timeout=10)

    committed = sorted(values("c1", 30) + values("c2", 30))
    assert_reads(committed, read_kafka_python, bootstrap, topic_name, "read_committed")
    assert_reads(committed, read_confluent, bootstrap, topic_name, "read_committed")
    assert_reads(sorted(committed + values("aborted", 30)), read_confluent, bootstrap, topic_name,
                 "read_uncommitted")


@pytest.mark.timeout(90)
def test_aiokafka_commit_and_abort_read_back_by_read_committed_consumers(bootstrap, topic_name):
    from aiokafka import AIOKafkaProducer

    create_topic(bootstrap, topic_name)

    async def produce():
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, transactional_id="aio-" + topic_name)
        await p.start()
        try:
            async with p.transaction():
                for i, v in enumerate(values("c1", 20)):
                    await p.send(topic_name, value=v.encode(), partition=i % PARTITIONS)
            await p.begin_transaction()
            for i, v in enumerate(values("aborted", 20)):
                await p.send_and_wait(topic_name, value=v.encode(), partition=i % PARTITIONS)
            await p.abort_transaction()
        finally:
            await p.stop()

    asyncio.run(produce())
    assert_reads(sorted(values("c1", 20)), read_confluent, bootstrap, topic_name, "read_committed")
    assert_reads(sorted(values("c1", 20)), read_kafka_python, bootstrap, topic_name,
                 "read_committed")
    assert_reads(sorted(values("c1", 20) + values("aborted", 20)), read_confluent, bootstrap,
                 topic_name, "read_uncommitted")
