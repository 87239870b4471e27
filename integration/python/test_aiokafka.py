"""aiokafka against the strata broker (group_id=None, assign + seek, no coordinator)."""

import asyncio
import time

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import codec as acodec
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from helpers import TIMEOUT

TIMEOUT_MS = int(TIMEOUT * 1000)

CODEC_AVAILABLE = {
    None: True,
    "gzip": acodec.has_gzip(),
    "snappy": acodec.has_snappy(),
    "lz4": acodec.has_lz4(),
    "zstd": acodec.has_zstd(),
}


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, timeout=TIMEOUT * 3))


async def create_topic(bootstrap, topic, partitions=1):
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_MS)
    await admin.start()
    try:
        resp = await admin.create_topics(
            [NewTopic(topic, num_partitions=partitions, replication_factor=1)],
            timeout_ms=TIMEOUT_MS)
        errors = [(t[0], t[1]) for t in resp.topic_errors if t[1] != 0]
        assert not errors, f"create_topics errors: {errors}"
        deadline = time.monotonic() + TIMEOUT
        while topic not in await admin.list_topics():
            assert time.monotonic() < deadline, f"{topic} never appeared in list_topics"
            await asyncio.sleep(0.1)
    finally:
        await admin.close()


async def consume_n(bootstrap, topic, n, partitions=(0,), **kw):
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                check_crcs=True, request_timeout_ms=TIMEOUT_MS + 5000, **kw)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in partitions]
        consumer.assign(tps)

        # seek_to_beginning + position() wait for the offset reset (a ListOffsets
        # round trip): fail fast and clearly if that does not work
        async def reset():
            await consumer.seek_to_beginning(*tps)
            return [await consumer.position(tp) for tp in tps]

        try:
            positions = await asyncio.wait_for(reset(), timeout=TIMEOUT / 2)
        except asyncio.TimeoutError:
            raise AssertionError(f"no position after seek_to_beginning within {TIMEOUT / 2}s "
                                 f"(ListOffsets failing?)") from None
        assert positions == [0] * len(tps), f"beginning offsets {positions}, expected 0"
        out = []
        deadline = time.monotonic() + TIMEOUT
        while len(out) < n and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                out.extend(recs)
        assert len(out) == n, f"consumed {len(out)} of {n} records within {TIMEOUT}s"
        return out
    finally:
        await consumer.stop()


@pytest.mark.parametrize("codec", [None, "gzip", "snappy", "lz4", "zstd"],
                         ids=["none", "gzip", "snappy", "lz4", "zstd"])
def test_send_and_wait_roundtrip(bootstrap, topic_name, codec):
    if not CODEC_AVAILABLE[codec]:
        pytest.skip(f"aiokafka has no {codec} codec library installed")

    async def main():
        await create_topic(bootstrap, topic_name)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all",
                                    compression_type=codec, request_timeout_ms=TIMEOUT_MS)
        await producer.start()
        expected = []
        try:
            # one record at a time with send_and_wait ...
            specs = [
                (b"k0", b"v0", [("h", b"1")]),
                (None, b"null-key", []),
                (b"tombstone", None, [("why", b"delete")]),
                (b"multi", b"headers", [("a", b"1"), ("b", b""), ("a", b"2")]),
                (b"", b"", []),
            ]
            for i, (key, value, headers) in enumerate(specs):
                md = await producer.send_and_wait(topic_name, value=value, key=key,
                                                  headers=headers, partition=0)
                assert (md.topic, md.partition, md.offset) == (topic_name, 0, i)
                expected.append((key, value, headers))
            # ... then a pipelined burst (several records per batch)
            futs = []
            for i in range(100):
                key, value, headers = b"burst-%d" % i, b"payload %d " % i * 5, [("n", b"%d" % i)]
                futs.append(await producer.send(topic_name, value=value, key=key,
                                                headers=headers, partition=0))
                expected.append((key, value, headers))
            mds = await asyncio.gather(*futs)
            assert [m.offset for m in mds] == list(range(len(specs), len(specs) + 100))
        finally:
            await producer.stop()

        recs = await consume_n(bootstrap, topic_name, len(expected))
        assert [r.offset for r in recs] == list(range(len(expected)))
        for r, (key, value, headers) in zip(recs, expected):
            assert r.key == key, f"offset {r.offset}"
            assert r.value == value, f"offset {r.offset}"
            assert list(r.headers) == headers, f"offset {r.offset}"
            assert r.timestamp_type == 0

    run(main())


def test_idempotent_producer(bootstrap, topic_name):
    async def main():
        await create_topic(bootstrap, topic_name, partitions=2)
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True,
                                    request_timeout_ms=TIMEOUT_MS)
        await producer.start()
        try:
            futs = [await producer.send(topic_name, value=b"idem-%d" % i, partition=i % 2)
                    for i in range(60)]
            mds = await asyncio.gather(*futs)
        finally:
            await producer.stop()
        for p in (0, 1):
            assert sorted(m.offset for m in mds if m.partition == p) == list(range(30))
        recs = await consume_n(bootstrap, topic_name, 60, partitions=(0, 1))
        for p in (0, 1):
            assert [r.value for r in recs if r.partition == p] == \
                [b"idem-%d" % i for i in range(p, 60, 2)]

    run(main())


def test_offset_queries(bootstrap, topic_name):
    async def main():
        await create_topic(bootstrap, topic_name)
        base = int(time.time() * 1000) - 60_000
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=TIMEOUT_MS)
        await producer.start()
        try:
            for i in range(4):
                await producer.send_and_wait(topic_name, value=b"t%d" % i, partition=0,
                                             timestamp_ms=base + i * 1000)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None,
                                    enable_auto_commit=False,
                                    request_timeout_ms=TIMEOUT_MS // 2)
        await consumer.start()
        try:
            tp = TopicPartition(topic_name, 0)
            assert await consumer.beginning_offsets([tp]) == {tp: 0}
            assert await consumer.end_offsets([tp]) == {tp: 4}
            r = await consumer.offsets_for_times({tp: base + 2500})
            assert (r[tp].offset, r[tp].timestamp) == (3, base + 3000)
            r = await consumer.offsets_for_times({tp: base + 9000})
            assert r[tp] is None
            consumer.assign([tp])
            consumer.seek(tp, 2)
            got = []
            deadline = time.monotonic() + TIMEOUT
            while len(got) < 2 and time.monotonic() < deadline:
                for recs in (await consumer.getmany(timeout_ms=500)).values():
                    got.extend(recs)
            assert [(x.offset, x.value, x.timestamp) for x in got] == \
                [(2, b"t2", base + 2000), (3, b"t3", base + 3000)]
        finally:
            await consumer.stop()

    run(main())
