"""Share groups (KIP-932) with confluent-kafka's ShareConsumer (librdkafka 2.16's
share consumer): consumers of one group share a partition record by record, a
released record comes back with a higher delivery count and a rejected one does not.
"""

import time

from confluent_kafka import AcknowledgeType, Producer, ShareConsumer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

TIMEOUT = 60


def setup(bootstrap, topic, group, partitions, n):
    """Creates the topic, makes the group read it from the start, produces v0..v{n-1}."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    res = ConfigResource(
        ResourceType.GROUP,
        group,
        incremental_configs=[
            ConfigEntry("share.auto.offset.reset", "earliest", incremental_operation=AlterConfigOpType.SET)
        ],
    )
    for f in admin.incremental_alter_configs([res]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap})
    for i in range(n):
        p.produce(topic, value=f"v{i}".encode())
    assert p.flush(30) == 0


def share_consumer(bootstrap, group, topic, **conf):
    c = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group, **conf})
    c.subscribe([topic])
    return c


def test_two_share_consumers_on_one_partition_receive_every_record(bootstrap, topic_name):
    group = topic_name + "-g"
    setup(bootstrap, topic_name, group, 1, 200)
    consumers = [share_consumer(bootstrap, group, topic_name) for _ in range(2)]
    seen = {}
    deadline = time.monotonic() + TIMEOUT
    try:
        while len(seen) < 200 and time.monotonic() < deadline:
            for i, c in enumerate(consumers):
                for m in c.poll(0.2):
                    assert m.error() is None, m.error()
                    seen.setdefault(m.value().decode(), []).append(i)
    finally:
        for c in consumers:
            c.close()
    assert sorted(seen) == sorted(f"v{i}" for i in range(200))
    assert all(len(who) == 1 for who in seen.values()), "a record was delivered twice"


def test_a_released_record_comes_back_and_a_rejected_one_does_not(bootstrap, topic_name):
    group = topic_name + "-g"
    setup(bootstrap, topic_name, group, 1, 6)
    c = share_consumer(bootstrap, group, topic_name, **{"share.acknowledgement.mode": "explicit"})
    deliveries = {}
    deadline = time.monotonic() + TIMEOUT
    try:
        while time.monotonic() < deadline:
            for m in c.poll(0.2):
                assert m.error() is None, m.error()
                v = m.value().decode()
                deliveries.setdefault(v, []).append(m)
                first = len(deliveries[v]) == 1
                kind = {"v1": AcknowledgeType.RELEASE, "v2": AcknowledgeType.REJECT}.get(v) if first else None
                c.acknowledge(m, kind or AcknowledgeType.ACCEPT)
            c.commit_sync()
            if len(deliveries) == 6 and len(deliveries["v1"]) == 2:
                break
        # Nothing more comes: v2 was rejected, the rest accepted.
        settle = time.monotonic() + 2
        while time.monotonic() < settle:
            for m in c.poll(0.2):
                deliveries.setdefault(m.value().decode(), []).append(m)
                c.acknowledge(m, AcknowledgeType.ACCEPT)
            c.commit_sync()
    finally:
        c.close()
    counts = {v: len(ms) for v, ms in deliveries.items()}
    assert counts == {"v0": 1, "v1": 2, "v2": 1, "v3": 1, "v4": 1, "v5": 1}, counts
