"""Steps of integration/cluster/run.sh, with librdkafka (confluent-kafka) and
boto3: bucket and topic setup, the partition leader, an idempotent producer,
the check that every acknowledged record is there exactly once, and the
write-ahead log's collection in the bucket.

    cluster.py setup                      bucket (checks create-only PUTs), topic, leaders
    cluster.py leader PARTITION           prints the partition's leader node id
    cluster.py produce STOP_FILE OUT      rdkafka-N records until STOP_FILE exists
    cluster.py verify KILLED_AT_MS JAVA_ACKS RDKAFKA_ACKS JAVA_DUMP
    cluster.py wal-collected              waits until only fences and newest objects are left

Environment: BOOTSTRAP, TOPIC, PARTITIONS, BUCKET, PREFIX, AWS_* (for moto).
"""
import os
import struct
import sys
import time

import boto3
from botocore.exceptions import ClientError
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

BOOTSTRAP = os.environ.get("BOOTSTRAP", "")
TOPIC = os.environ["TOPIC"]
PARTITIONS = int(os.environ["PARTITIONS"])
BUCKET = os.environ["BUCKET"]
PREFIX = os.environ["PREFIX"]


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def s3():
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def leaders():
    """Partition -> leader node of TOPIC, from any live broker."""
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    md = admin.list_topics(TOPIC, timeout=10)
    t = md.topics.get(TOPIC)
    if t is None or t.error is not None:
        return {}
    return {p.id: p.leader for p in t.partitions.values() if p.error is None and p.leader >= 0}


def setup():
    c = s3()
    c.create_bucket(Bucket=BUCKET)
    # WAL objects, fences and manifests rely on create-only writes.
    c.put_object(Bucket=BUCKET, Key="probe", Body=b"1", IfNoneMatch="*")
    try:
        c.put_object(Bucket=BUCKET, Key="probe", Body=b"2", IfNoneMatch="*")
        sys.exit("the S3 server ignored If-None-Match")
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412, e.response
    c.delete_object(Bucket=BUCKET, Key="probe")


def create_topic():
    admin = AdminClient({"bootstrap.servers": BOOTSTRAP})
    # Idle segments roll within a second, so the WAL soon becomes collectable.
    topic = NewTopic(TOPIC, PARTITIONS, 1, config={"segment.ms": "1000", "strata.compaction.policy": "none"})
    for f in admin.create_topics([topic]).values():
        f.result(30)
    deadline = time.time() + 60
    while len(leaders()) < PARTITIONS:
        if time.time() > deadline:
            sys.exit(f"partitions never got leaders: {leaders()}")
        time.sleep(0.2)
    log(f"topic {TOPIC}: leaders {leaders()}")


def leader(partition):
    print(leaders()[int(partition)])


def produce(stop_file, out):
    p = Producer({
        "bootstrap.servers": BOOTSTRAP,
        "acks": "all",
        "enable.idempotence": True,
        "linger.ms": 5,
        "retry.backoff.ms": 100,
        "message.timeout.ms": 60000,
    })
    lines = []

    def delivered(n, partition):
        def report(err, msg):
            now = int(time.time() * 1000)
            if err is None:
                lines.append(f"ack {n} {msg.partition()} {msg.offset()} {now}\n")
            else:
                lines.append(f"fail {n} {partition} {now} {err}\n")
        return report

    sent = 0
    with open(out, "w") as f:
        last_write = 0
        while not os.path.exists(stop_file):
            n = sent
            partition = n % PARTITIONS
            try:
                p.produce(TOPIC, key=f"k{n}", value=f"rdkafka-{n}", partition=partition,
                          on_delivery=delivered(n, partition))
                sent += 1
            except BufferError:
                pass
            p.poll(0.002)
            if time.time() - last_write > 0.2:
                f.writelines(lines)
                lines.clear()
                f.flush()
                last_write = time.time()
        left = p.flush(60)
        f.writelines(lines)
        f.write(f"sent {sent}\n")
    if left:
        sys.exit(f"{left} records never got an outcome")


def read_acks(path):
    acked, failed, sent = {}, {}, None
    with open(path) as f:
        for line in f:
            parts = line.split()
            if parts[0] == "ack":
                acked[int(parts[1])] = (int(parts[2]), int(parts[3]), int(parts[4]))
            elif parts[0] == "fail":
                failed[int(parts[1])] = " ".join(parts[4:])
            elif parts[0] == "sent":
                sent = int(parts[1])
    assert sent is not None, f"{path}: the producer did not finish"
    return acked, failed, sent


# Errors a Kafka client retries: the partition's leadership is moving (the
# survivors rebalance once the dead broker's partitions settled).
MOVING = {KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE,
          KafkaError.REQUEST_TIMED_OUT, KafkaError._TRANSPORT, KafkaError._TIMED_OUT}


def high_watermark(c, p):
    deadline = time.time() + 30
    while True:
        try:
            return c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=30)[1]
        except KafkaException as e:
            if e.args[0].code() not in MOVING or time.time() > deadline:
                raise
            time.sleep(0.5)


def consume_all():
    """(partition, offset) -> value for the whole topic, read with librdkafka."""
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "verify", "enable.auto.commit": False})
    ends = {p: high_watermark(c, p) for p in range(PARTITIONS)}
    c.assign([TopicPartition(TOPIC, p, 0) for p in range(PARTITIONS)])
    got = {}
    positions = {p: 0 for p in range(PARTITIONS)}
    deadline = time.time() + 60
    while any(positions[p] < ends[p] for p in range(PARTITIONS)):
        if time.time() > deadline:
            sys.exit(f"librdkafka consumer stuck at {positions} of {ends}")
        m = c.poll(0.5)
        if m is None:
            continue
        if m.error():
            raise KafkaException(m.error())
        key = (m.partition(), m.offset())
        assert key not in got, f"offset {key} read twice"
        got[key] = m.value().decode()
        positions[m.partition()] = m.offset() + 1
    c.close()
    return got


def stall_around(acks, killed_at):
    """Longest gap between consecutive acknowledgement times spanning the
    kill, and the time from the kill to the acknowledgement ending it."""
    times = sorted(acks)
    gaps = [(b - a, b) for a, b in zip(times, times[1:]) if b >= killed_at and a <= killed_at + 1000]
    if not gaps:
        return None, None
    gap, end = max(gaps)
    return gap, end - killed_at


def verify(killed_at, java_acks, rdkafka_acks, java_dump):
    killed_at = int(killed_at)
    got = consume_all()
    with open(java_dump) as f:
        java_got = {}
        for line in f:
            p, o, v = line.split(" ", 2)
            java_got[(int(p), int(o))] = v.rstrip("\n")
    assert java_got == got, (
        f"the Java and librdkafka consumers disagree: {len(java_got)} vs {len(got)} records, "
        f"e.g. {sorted(set(java_got.items()) ^ set(got.items()))[:5]}")
    values = {}
    for key, v in got.items():
        assert v not in values, f"{v} at {values[v]} and {key}: duplicated"
        values[v] = key
    problems = []
    for name, path in (("java", java_acks), ("rdkafka", rdkafka_acks)):
        acked, failed, sent = read_acks(path)
        for n, (p, o, _) in acked.items():
            if got.get((p, o)) != f"{name}-{n}":
                problems.append(f"{name}-{n} acknowledged at {p}/{o}, found {got.get((p, o))!r} there")
        present = {int(v.split("-")[1]) for v in values if v.startswith(name + "-")}
        strays = [n for n in present if n >= sent]
        unacked = [n for n in present if n < sent and n not in acked]
        assert not strays, f"{name}: records never sent: {strays[:5]}"
        after = [t for (p, _, t) in acked.values() if t > killed_at]
        p0 = [t for (p, _, t) in acked.values() if p == 0]
        stall, failover = stall_around(p0, killed_at)
        overall, _ = stall_around([t for (_, _, t) in acked.values()], killed_at)
        log(f"{name}: {sent} sent, {len(acked)} acknowledged ({len(after)} after the kill), "
            f"{len(failed)} failed, {len(unacked)} unacknowledged present once; "
            f"partition 0: stall {stall} ms, failover (kill to first ack on the new leader) {failover} ms; "
            f"longest gap between any acks around the kill {overall} ms")
        if failed:
            log(f"{name}: first failures: {list(failed.items())[:3]}")
        assert failover is not None and any(t > killed_at for t in p0), \
            f"{name}: nothing acknowledged on partition 0 after its leader died"
        print(f"{name} stall_ms={stall} failover_ms={failover} overall_gap_ms={overall}")
    assert not problems, f"{len(problems)} acknowledged records lost or misplaced: {problems[:10]}"
    log(f"all acknowledged records read back exactly once ({len(got)} records, "
        "same with the Java and librdkafka consumers)")


def read_dump(path):
    """(partition, offset) -> [values] of a "PARTITION OFFSET VALUE" dump, in the order read."""
    out = {}
    with open(path) as f:
        for line in f:
            p, o, v = line.split(" ", 2)
            out.setdefault((int(p), int(o)), []).append(v.rstrip("\n"))
    return out


def share_verify(java_dump, share_dump):
    """At least once: the share group delivered every record of the topic, each time with the value
    the full read found at that offset (a redelivery is the same record, never another one)."""
    full = {k: vs[0] for k, vs in read_dump(java_dump).items()}
    shared = read_dump(share_dump)
    missing = sorted(set(full) - set(shared))
    assert not missing, f"the share group never delivered {len(missing)} records, e.g. {missing[:5]}"
    wrong = [(k, vs) for k, vs in shared.items() if k in full and any(v != full[k] for v in vs)]
    assert not wrong, f"share deliveries disagree with the log: {wrong[:5]}"
    extra = sorted(set(shared) - set(full))
    assert not extra, f"the share group delivered offsets the log does not have: {extra[:5]}"
    again = sum(len(vs) - 1 for vs in shared.values())
    log(f"share group: all {len(full)} records delivered, {again} delivered again (at least once)")


FENCES = {}


def wal_data_objects(c):
    """WAL objects holding data that are not their node's newest, and all WAL objects."""
    keys = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"{PREFIX}/wal/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    by_node = {}
    for k in keys:
        by_node.setdefault(k.split("/")[-2], []).append(k)
    data = 0
    for objects in by_node.values():
        for k in sorted(objects)[:-1]:
            if k not in FENCES:
                try:
                    head = c.get_object(Bucket=BUCKET, Key=k, Range="bytes=0-39")["Body"].read()
                except ClientError:
                    continue  # collected meanwhile
                assert head[:4] == b"SWAL", k
                # the entry count, u32::MAX for a fence: after the run's first
                # sequence number from format version 2 on (src/format/wal.rs)
                at = 28 if struct.unpack(">H", head[4:6])[0] == 1 else 36
                FENCES[k] = struct.unpack(">I", head[at:at + 4])[0] == 0xFFFFFFFF
            data += not FENCES[k]
    return data, len(keys)


def wal_collected():
    c = s3()
    written, total = wal_data_objects(c)
    log(f"{total} WAL objects in the bucket, {written} of them older data objects")
    deadline = time.time() + 60
    while True:
        left, total = wal_data_objects(c)
        if left == 0:
            break
        if time.time() > deadline:
            sys.exit(f"{left} of {written} WAL data objects never collected")
        time.sleep(0.5)
    log(f"WAL collected: {total} objects left (fences and each node's newest)")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    {"setup": setup, "create-topic": create_topic, "leader": leader, "produce": produce,
     "verify": verify, "share-verify": share_verify, "wal-collected": wal_collected}[cmd](*args)
