"""Steps of integration/s3/run.sh: bucket setup, produce, wait until the
bucket's manifest covers everything, consume and compare."""
import json
import os
import sys
import time

import boto3
from botocore.exceptions import ClientError

BUCKET = os.environ["BUCKET"]
TOPIC = os.environ["TOPIC"]
RECORDS = int(os.environ["RECORDS"])
PREFIX = "cluster1/"


def s3():
    return boto3.client("s3", endpoint_url=os.environ["AWS_ENDPOINT_URL"])


def value(i):
    return f"value-{i:06}-" + "y" * 50


def setup():
    c = s3()
    c.create_bucket(Bucket=BUCKET)
    # The broker's manifests rely on create-only writes: check the server has them.
    c.put_object(Bucket=BUCKET, Key="probe", Body=b"1", IfNoneMatch="*")
    try:
        c.put_object(Bucket=BUCKET, Key="probe", Body=b"2", IfNoneMatch="*")
        sys.exit("the S3 server ignored If-None-Match; manifests would not be create-only")
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412, e.response
    c.delete_object(Bucket=BUCKET, Key="probe")


def produce():
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    bootstrap = os.environ["BOOTSTRAP"]
    admin = AdminClient({"bootstrap.servers": bootstrap})
    topic = NewTopic(TOPIC, 1, 1, config={"segment.bytes": "8192", "segment.ms": "500"})
    for f in admin.create_topics([topic]).values():
        f.result(30)
    p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    errors = []
    for i in range(RECORDS):
        p.produce(TOPIC, key=f"k{i}", value=value(i), partition=0,
                  on_delivery=lambda err, _m: err and errors.append(err))
        if i % 500 == 0:
            p.poll(0)
    assert p.flush(30) == 0 and not errors, errors


def latest_manifest(c):
    keys = []
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX + f"topics/{TOPIC}/"):
        keys += [o["Key"] for o in page.get("Contents", [])]
    manifests = sorted(k for k in keys if "/0/manifest/" in k)
    if not manifests:
        return None, keys
    body = c.get_object(Bucket=BUCKET, Key=manifests[-1])["Body"].read()
    return json.loads(body), keys


def wait_tiered():
    c = s3()
    deadline = time.time() + 60
    while True:
        m, keys = latest_manifest(c)
        end = m["segments"][-1]["next_offset"] if m and m["segments"] else 0
        if end >= RECORDS:
            break
        if time.time() > deadline:
            sys.exit(f"only {end} of {RECORDS} offsets reached the bucket")
        time.sleep(0.2)
    assert any(k.endswith("/topic.json") for k in keys), keys
    for seg in m["segments"]:
        for ext in ("log", "index", "timeindex", "meta"):
            assert PREFIX + seg["key"] + "." + ext in keys or seg["key"] + "." + ext in keys, (seg, ext)
    # Manifest versions are never overwritten: a second create of the latest fails.
    latest = sorted(k for k in keys if "/0/manifest/" in k)[-1]
    try:
        c.put_object(Bucket=BUCKET, Key=latest, Body=b"{}", IfNoneMatch="*")
        sys.exit("a manifest version could be overwritten")
    except ClientError as e:
        assert e.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    print(f"manifest v{m['version']}: {len(m['segments'])} segments up to offset {end}", file=sys.stderr)


def consume():
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": os.environ["BOOTSTRAP"], "group.id": "unused",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(TOPIC, 0, 0)])
    got = []
    deadline = time.time() + 60
    while len(got) < RECORDS and time.time() < deadline:
        m = c.poll(0.5)
        if m is None:
            continue
        assert m.error() is None, m.error()
        got.append((m.offset(), m.key().decode(), m.value().decode()))
    c.close()
    assert len(got) == RECORDS, f"consumed {len(got)} of {RECORDS}"
    for i, (off, k, v) in enumerate(got):
        assert (off, k, v) == (i, f"k{i}", value(i)), (i, off, k, v)
    print(f"consumed all {RECORDS} records from the bucket", file=sys.stderr)


{"setup": setup, "produce": produce, "wait-tiered": wait_tiered, "consume": consume}[sys.argv[1]]()
