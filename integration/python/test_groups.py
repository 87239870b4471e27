"""Consumer groups (classic protocol) with Python clients, checked on content.

* confluent-kafka: two consumers in one group split a 4-partition topic 2/2, consume every
  record exactly once (commit after processing), commits are visible through the
  AdminClient (list_consumer_group_offsets / describe / list); when one member leaves the
  other takes over all partitions and resumes from the committed offsets.
* kafka-python: a group consumer reads and commits; a second consumer of the same group
  resumes exactly at the commits.
* aiokafka: a group consumer reads, commits an offset with a metadata string; the
  commit (offset + metadata) is visible to confluent's AdminClient and to a new member.

The broker is the one conftest.py starts, with Kafka's default group settings
(group.initial.rebalance.delay.ms=3000, group.min.session.timeout.ms=6000).
"""

import asyncio
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient, NewTopic

from helpers import TIMEOUT, wait_until

GROUP_TIMEOUT = max(TIMEOUT, 60)


def admin_client(bootstrap):
    return AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": 10000})


def create_topic(bootstrap, topic, partitions):
    admin = admin_client(bootstrap)
    fs = admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1)])
    fs[topic].result(timeout=TIMEOUT)

    def ready():
        t = admin.list_topics(timeout=TIMEOUT).topics.get(topic)
        return t is not None and t.error is None and len(t.partitions) == partitions
    wait_until(ready, what=f"topic {topic} with {partitions} partitions")
    return admin


def produce(bootstrap, topic, values, partitions):
    """values: list of (index); record i goes to partition i % partitions, key k<i%50>, value v<i>."""
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors = []
    for i in values:
        p.produce(topic, key=f"k{i % 50}".encode(), value=f"v{i}".encode(), partition=i % partitions,
                  on_delivery=lambda err, msg: errors.append(err) if err else None)
        p.poll(0)
    assert p.flush(TIMEOUT) == 0, "producer did not flush"
    assert errors == [], errors


def high_watermarks(bootstrap, topic, partitions, group):
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group + "-wm", "enable.auto.commit": False})
    try:
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=TIMEOUT)[1] for p in range(partitions)}
    finally:
        c.close()


def committed_via_admin(admin, group):
    """{(topic, partition): offset} from confluent's AdminClient.list_consumer_group_offsets.

    (The metadata string is not read here: confluent-kafka 2.16 decodes it as a NUL-terminated
    C string and reads past the end of the buffer, see committed_metadata.)"""
    fs = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])
    res = fs[group].result(timeout=TIMEOUT)
    out = {}
    for tp in res.topic_partitions:
        assert tp.error is None, f"{tp}: {tp.error}"
        if tp.offset >= 0:
            out[(tp.topic, tp.partition)] = tp.offset
    return out


def committed_metadata(bootstrap, *groups):
    """{group: {(topic, partition): (offset, metadata)}} from kafka-python's KafkaAdminClient
    (one OffsetFetch v8+ request for all groups)."""
    from kafka.admin import KafkaAdminClient
    a = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        res = a.list_group_offsets(list(groups))
        return {g: {(tp.topic, tp.partition): (om.offset, om.metadata) for tp, om in res[g].items()}
                for g in groups}
    finally:
        a.close()


class Member:
    """A confluent-kafka group consumer that records what it got and its assignment."""

    def __init__(self, name, bootstrap, group, topic):
        self.name = name
        self.owned = set()
        self.assigns = 0
        self.got = []  # (partition, offset, key, value, committed)
        self.commit_errors = []
        self.c = Consumer({
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "client.id": name,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000,
        })
        self.c.subscribe([topic], on_assign=self._on_assign, on_revoke=self._on_revoke)

    def _on_assign(self, consumer, parts):
        self.assigns += 1
        self.owned |= {tp.partition for tp in parts}

    def _on_revoke(self, consumer, parts):
        self.owned -= {tp.partition for tp in parts}

    def step(self):
        msgs = self.c.consume(num_messages=200, timeout=0.1)
        batch = []
        for m in msgs:
            assert m.error() is None, f"{self.name}: {m.error()}"
            batch.append((m.partition(), m.offset(), m.key().decode(), m.value().decode()))
        if batch:
            ok = True
            try:
                self.c.commit(asynchronous=False)  # commit after processing
            except KafkaException as e:
                ok = False
                self.commit_errors.append(e)
            self.got.extend(b + (ok,) for b in batch)

    def __repr__(self):
        return (f"{self.name}(owned={sorted(self.owned)} assigns={self.assigns} got={len(self.got)} "
                f"commit_errors={self.commit_errors})")


def pump(members, pred, what, timeout=GROUP_TIMEOUT):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}: {members}")
        for m in members:
            m.step()


def test_confluent_two_consumers_share_a_group(bootstrap, topic_name):
    parts = 4
    group = "grp-" + topic_name
    admin = create_topic(bootstrap, topic_name, parts)
    a = Member("py-a", bootstrap, group, topic_name)
    b = Member("py-b", bootstrap, group, topic_name)
    members = [a, b]
    try:
        pump(members, lambda: len(a.owned) == 2 and len(b.owned) == 2, "2 + 2 partitions")
        assert a.owned | b.owned == set(range(parts)), members
        assert a.owned.isdisjoint(b.owned), members

        n = 2000
        produce(bootstrap, topic_name, range(n), parts)
        hw = high_watermarks(bootstrap, topic_name, parts, group)
        assert hw == {p: n // parts for p in range(parts)}, hw

        def all_committed():
            return committed_via_admin(admin, group) == {(topic_name, p): hw[p] for p in range(parts)}
        pump(members, lambda: len(a.got) + len(b.got) >= n and all_committed(), "all records consumed and committed")

        # content: each record exactly once, by the owner of its partition, intact
        seen = {}
        for m in members:
            assert m.commit_errors == [], m
            for (p, off, key, value, ok) in m.got:
                i = int(value[1:])
                assert value not in seen, f"{value} consumed twice ({seen[value]} and {m.name})"
                seen[value] = m.name
                assert p == i % parts and off == i // parts, (p, off, value)
                assert key == f"k{i % 50}", (key, value)
                assert p in m.owned, f"{m.name} consumed partition {p} it does not own: {m}"
        assert set(seen) == {f"v{i}" for i in range(n)}

        # the broker's view: group listed, stable, two members with two partitions each
        listed = admin.list_consumer_groups().result(timeout=TIMEOUT)
        assert group in {g.group_id for g in listed.valid}, listed.valid
        desc = admin.describe_consumer_groups([group])[group].result(timeout=TIMEOUT)
        assert str(desc.state).endswith("STABLE"), desc.state
        assert sorted(m.client_id for m in desc.members) == ["py-a", "py-b"], desc.members
        for m in desc.members:
            assert len(m.assignment.topic_partitions) == 2, m
        assert desc.partition_assignor in ("range", "roundrobin"), desc.partition_assignor

        # a leaves; b takes over a's partitions and resumes from a's commits
        a_parts = set(a.owned)
        a.c.close()
        members = [b]
        pump(members, lambda: len(b.owned) == parts, "b owns all partitions after a left")
        before = len(b.got)
        produce(bootstrap, topic_name, range(n, n + 400), parts)
        hw2 = high_watermarks(bootstrap, topic_name, parts, group)

        def all_committed2():
            return committed_via_admin(admin, group) == {(topic_name, p): hw2[p] for p in range(parts)}
        pump(members, lambda: len(b.got) - before >= 400 and all_committed2(), "second batch committed by b")
        new = sorted(int(v[1:]) for (_, _, _, v, _) in b.got[before:])
        assert new == list(range(n, n + 400)), "b re-read or skipped records after taking over " + str(a_parts)
    finally:
        for m in (a, b):
            try:
                m.c.close()
            except RuntimeError:
                pass  # already closed


def test_kafka_python_group_consumer_commits_and_resumes(bootstrap, topic_name):
    from kafka import KafkaConsumer
    from kafka import TopicPartition as KTP

    parts = 2
    group = "grp-" + topic_name
    admin = create_topic(bootstrap, topic_name, parts)
    produce(bootstrap, topic_name, range(300), parts)

    def consumer():
        return KafkaConsumer(topic_name, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10000, heartbeat_interval_ms=1000,
                             consumer_timeout_ms=1000)

    c = consumer()
    got = []
    try:
        deadline = time.monotonic() + GROUP_TIMEOUT
        while len(got) < 300 and time.monotonic() < deadline:
            for recs in c.poll(timeout_ms=200).values():
                got.extend((r.partition, r.offset, r.key.decode(), r.value.decode()) for r in recs)
                c.commit()  # commit after processing
        assert sorted(int(v[1:]) for (_, _, _, v) in got) == list(range(300))
        for (p, off, key, value) in got:
            i = int(value[1:])
            assert (p, off, key) == (i % parts, i // parts, f"k{i % 50}"), (p, off, key, value)
        assert c.assignment() == {KTP(topic_name, 0), KTP(topic_name, 1)}
        assert {p: c.committed(KTP(topic_name, p)) for p in range(parts)} == {0: 150, 1: 150}
    finally:
        c.close()  # leaves the group
    assert committed_via_admin(admin, group) == {(topic_name, 0): 150, (topic_name, 1): 150}

    # a new member of the group resumes exactly at the commits
    produce(bootstrap, topic_name, range(300, 340), parts)
    c2 = consumer()
    got2 = []
    try:
        deadline = time.monotonic() + GROUP_TIMEOUT
        while len(got2) < 40 and time.monotonic() < deadline:
            for recs in c2.poll(timeout_ms=200).values():
                got2.extend(r.value.decode() for r in recs)
                c2.commit()
        time.sleep(0.5)
        for recs in c2.poll(timeout_ms=500).values():
            got2.extend(r.value.decode() for r in recs)
        assert sorted(got2, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(300, 340)]
    finally:
        c2.close()
    assert committed_via_admin(admin, group) == {(topic_name, 0): 170, (topic_name, 1): 170}


def test_aiokafka_group_consumer_commit_with_metadata(bootstrap, topic_name):
    from aiokafka import AIOKafkaConsumer
    from aiokafka import TopicPartition as ATP
    from aiokafka.structs import OffsetAndMetadata

    parts = 2
    group = "grp-" + topic_name
    admin = create_topic(bootstrap, topic_name, parts)
    produce(bootstrap, topic_name, range(100), parts)

    async def first():
        c = AIOKafkaConsumer(topic_name, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10000, heartbeat_interval_ms=1000)
        await c.start()
        got = []
        try:
            deadline = time.monotonic() + GROUP_TIMEOUT
            while len(got) < 100 and time.monotonic() < deadline:
                batches = await c.getmany(timeout_ms=200)
                for recs in batches.values():
                    got.extend((r.partition, r.offset, r.value.decode()) for r in recs)
                if batches:
                    await c.commit()
            assert c.assignment() == {ATP(topic_name, 0), ATP(topic_name, 1)}
            assert await c.committed(ATP(topic_name, 0)) == 50
            # rewind partition 0 to 20 with a metadata string
            await c.commit({ATP(topic_name, 0): OffsetAndMetadata(20, "aio-meta")})
            assert await c.committed(ATP(topic_name, 0)) == 20
        finally:
            await c.stop()
        return got

    got = asyncio.run(asyncio.wait_for(first(), timeout=GROUP_TIMEOUT * 2))
    assert sorted(int(v[1:]) for (_, _, v) in got) == list(range(100))
    for (p, off, v) in got:
        assert (p, off) == (int(v[1:]) % parts, int(v[1:]) // parts)
    assert committed_via_admin(admin, group) == {(topic_name, 0): 20, (topic_name, 1): 50}
    # offsets + metadata of this group and of another one, fetched in one request
    other = group + "-other"
    admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        other, [TopicPartition(topic_name, 1, 7)])])[other].result(timeout=TIMEOUT)
    assert committed_metadata(bootstrap, group, other) == {
        group: {(topic_name, 0): (20, "aio-meta"), (topic_name, 1): (50, "")},
        other: {(topic_name, 1): (7, "")},
    }

    async def second():
        c = AIOKafkaConsumer(topic_name, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest")
        await c.start()
        got = []
        try:
            deadline = time.monotonic() + GROUP_TIMEOUT
            while len(got) < 30 and time.monotonic() < deadline:
                for recs in (await c.getmany(timeout_ms=200)).values():
                    got.extend(r.value.decode() for r in recs)
            await asyncio.sleep(0.5)
            for recs in (await c.getmany(timeout_ms=300)).values():
                got.extend(r.value.decode() for r in recs)
        finally:
            await c.stop()
        return got

    got2 = asyncio.run(asyncio.wait_for(second(), timeout=GROUP_TIMEOUT * 2))
    # partition 0 from offset 20 (values 40, 42, ... 98), nothing from partition 1
    assert sorted(got2, key=lambda v: int(v[1:])) == [f"v{i}" for i in range(40, 100, 2)]
