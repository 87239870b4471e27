//! librdkafka (through the `rdkafka` crate) against an in-process broker:
//! admin operations, keyed records with headers, tombstones, every codec,
//! timestamp lookups and the idempotent producer.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::InProcess;
use rdkafka::admin::{
    AdminClient, AdminOptions, AlterConfig, NewPartitions, NewTopic, ResourceSpecifier,
    TopicReplication,
};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(20);

fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap()
}

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("linger.ms", "5");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    c.create().unwrap()
}

/// A consumer that reads by assignment only (consumer groups come later).
fn consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .unwrap()
}

async fn create_topic(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let res = admin(bootstrap)
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_ok(), "{res:?}");
}

type Rec = (
    Option<Vec<u8>>,
    Option<Vec<u8>>,
    Vec<(String, Option<Vec<u8>>)>,
    i64,
);

/// Reads `count` records of one partition from `offset`.
fn read(c: &BaseConsumer, topic: &str, partition: i32, offset: Offset, count: usize) -> Vec<Rec> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, offset).unwrap();
    c.assign(&tpl).unwrap();
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut out = Vec::new();
    while out.len() < count {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {count} records arrived",
            out.len()
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.unwrap();
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| (h.key.to_string(), h.value.map(|v| v.to_vec())))
                        .collect()
                })
                .unwrap_or_default();
            out.push((
                m.key().map(|k| k.to_vec()),
                m.payload().map(|p| p.to_vec()),
                headers,
                m.offset(),
            ));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyed_records_headers_and_tombstones_round_trip_with_every_codec() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    for codec in ["none", "gzip", "snappy", "lz4", "zstd"] {
        let topic = format!("codec-{codec}");
        create_topic(&bs, &topic, 1, &[]).await;
        let p = producer(&bs, &[("compression.type", codec)]);
        let mut expected = Vec::new();
        for i in 0..300i64 {
            let key = (i % 7 != 0).then(|| format!("key-{}", i % 13).into_bytes());
            let value = (i % 11 != 0)
                .then(|| format!("value-{i}-{}", "x".repeat((i % 50) as usize)).into_bytes());
            let headers = OwnedHeaders::new()
                .insert(Header {
                    key: "n",
                    value: Some(i.to_string().as_bytes()),
                })
                .insert(Header {
                    key: "empty",
                    value: None::<&[u8]>,
                });
            let mut rec = FutureRecord::<[u8], [u8]>::to(&topic)
                .partition(0)
                .headers(headers);
            if let Some(k) = &key {
                rec = rec.key(k);
            }
            if let Some(v) = &value {
                rec = rec.payload(v);
            }
            let offset = p.send(rec, TIMEOUT).await.unwrap().offset;
            assert_eq!(offset, i);
            expected.push((
                key,
                value,
                vec![
                    ("n".to_string(), Some(i.to_string().into_bytes())),
                    ("empty".to_string(), None),
                ],
                i,
            ));
        }
        let got = read(&consumer(&bs), &topic, 0, Offset::Beginning, 300);
        assert_eq!(got, expected, "codec {codec}");
    }
}

async fn topic_configs(
    a: &AdminClient<DefaultClientContext>,
    topic: &str,
) -> HashMap<String, Option<String>> {
    let res = a
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    let r = res.into_iter().next().unwrap().unwrap();
    r.entries.into_iter().map(|e| (e.name, e.value)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_create_describe_alter_grow_and_delete_topics() {
    let broker = InProcess::start(&["--auto-create-topics", "false"]).await;
    let bs = broker.bootstrap();
    let a = admin(&bs);
    create_topic(
        &bs,
        "adm",
        3,
        &[("cleanup.policy", "compact"), ("retention.ms", "12345")],
    )
    .await;

    let md = consumer(&bs).fetch_metadata(Some("adm"), TIMEOUT).unwrap();
    assert_eq!(md.topics()[0].partitions().len(), 3);
    assert_eq!(md.topics()[0].partitions()[1].leader(), 1);

    let c = topic_configs(&a, "adm").await;
    assert_eq!(c["cleanup.policy"].as_deref(), Some("compact"));
    assert_eq!(c["retention.ms"].as_deref(), Some("12345"));
    assert_eq!(c["segment.bytes"].as_deref(), Some("1073741824"));
    assert_eq!(c["message.timestamp.type"].as_deref(), Some("CreateTime"));

    let res = a
        .alter_configs(
            &[AlterConfig::new(ResourceSpecifier::Topic("adm")).set("retention.ms", "999")],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(res[0].is_ok());
    let c = topic_configs(&a, "adm").await;
    assert_eq!(c["retention.ms"].as_deref(), Some("999"));
    // Legacy AlterConfigs replaces the whole set: cleanup.policy went back to its default.
    assert_eq!(c["cleanup.policy"].as_deref(), Some("delete"));

    let res = a
        .create_partitions(&[NewPartitions::new("adm", 5)], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_ok());
    assert_eq!(
        consumer(&bs)
            .fetch_metadata(Some("adm"), TIMEOUT)
            .unwrap()
            .topics()[0]
            .partitions()
            .len(),
        5
    );
    let res = a
        .create_partitions(&[NewPartitions::new("adm", 2)], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_err());

    let res = a
        .delete_topics(&["adm"], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_ok());
    let md = consumer(&bs).fetch_metadata(None, TIMEOUT).unwrap();
    assert!(md.topics().iter().all(|t| t.name() != "adm"));
    let res = a
        .delete_topics(&["adm"], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_by_timestamp_watermarks_and_seeks() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    // Kept forever: the timestamps are years old, and retention must not
    // race the assertions.
    create_topic(
        &bs,
        "times",
        1,
        &[("segment.bytes", "2000"), ("retention.ms", "-1")],
    )
    .await;
    let p = producer(&bs, &[("linger.ms", "0")]);
    let base = 1_700_000_000_000i64;
    for i in 0..100i64 {
        let v = format!("v{i}");
        p.send(
            FutureRecord::<(), _>::to("times")
                .partition(0)
                .payload(&v)
                .timestamp(base + i * 1000),
            TIMEOUT,
        )
        .await
        .unwrap();
    }
    let c = consumer(&bs);
    assert_eq!(c.fetch_watermarks("times", 0, TIMEOUT).unwrap(), (0, 100));
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("times", 0, Offset::Offset(base + 42_500))
        .unwrap();
    let found = c.offsets_for_times(tpl, TIMEOUT).unwrap();
    assert_eq!(found.elements()[0].offset(), Offset::Offset(43));
    // Past the newest timestamp: the end offset.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("times", 0, Offset::Offset(base + 1_000_000))
        .unwrap();
    let found = c.offsets_for_times(tpl, TIMEOUT).unwrap();
    assert_eq!(found.elements()[0].offset(), Offset::End);

    let got = read(&c, "times", 0, Offset::Offset(97), 3);
    assert_eq!(
        got.iter().map(|r| r.3).collect::<Vec<_>>(),
        vec![97, 98, 99]
    );
    let got = read(&c, "times", 0, Offset::OffsetTail(2), 2);
    assert_eq!(got[0].1.as_deref(), Some(&b"v98"[..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_producer_writes_each_record_exactly_once() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    create_topic(&bs, "idem", 4, &[]).await;
    let p = producer(
        &bs,
        &[
            ("enable.idempotence", "true"),
            ("max.in.flight.requests.per.connection", "5"),
        ],
    );
    let sends: Vec<_> = (0..4000)
        .map(|i| {
            let payload = format!("{i}");
            let p = p.clone();
            async move {
                p.send(
                    FutureRecord::<(), _>::to("idem")
                        .partition(i % 4)
                        .payload(&payload),
                    TIMEOUT,
                )
                .await
            }
        })
        .collect();
    for r in futures::future::join_all(sends).await {
        r.unwrap();
    }
    let c = consumer(&bs);
    for part in 0..4 {
        let got = read(&c, "idem", part, Offset::Beginning, 1000);
        let values: Vec<i32> = got
            .iter()
            .map(|r| {
                String::from_utf8(r.1.clone().unwrap())
                    .unwrap()
                    .parse()
                    .unwrap()
            })
            .collect();
        let expected: Vec<i32> = (0..4000).filter(|i| i % 4 == part).collect();
        assert_eq!(values, expected);
        assert_eq!(
            c.fetch_watermarks("idem", part, TIMEOUT).unwrap(),
            (0, 1000)
        );
    }
}
