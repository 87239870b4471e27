//! Durability: records acknowledged with acks=all survive `kill -9` of the
//! broker process, at the same offsets, and a torn tail is cut off on restart.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::io::Write;
use std::time::Duration;

use common::{free_port, Process};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_records_survive_kill_minus_nine() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Process::start(dir.path(), port, &["--fsync", "always"]);
    let bs = broker.bootstrap();

    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .create()
        .unwrap();
    let topic =
        NewTopic::new("durable", 2, TopicReplication::Fixed(1)).set("segment.bytes", "16384");
    assert!(admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap()[0]
        .is_ok());

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("acks", "all")
        .set("linger.ms", "1")
        .set("message.timeout.ms", "5000")
        .set("retries", "0")
        .create()
        .unwrap();

    // Produce continuously from a task; kill the broker while sends are in flight.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let sender = tokio::spawn({
        let producer = producer.clone();
        async move {
            let mut i = 0u64;
            loop {
                let payload = format!("record-{i}");
                let partition = (i % 2) as i32;
                let record = FutureRecord::<(), _>::to("durable")
                    .partition(partition)
                    .payload(&payload);
                let Ok(delivery) = producer.send_result(record) else {
                    // Local queue full: let deliveries drain.
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                };
                let tx = tx.clone();
                tokio::spawn(async move {
                    if let Ok(Ok(d)) = delivery.await {
                        let _ = tx.send((d.partition, d.offset, payload));
                    }
                });
                i += 1;
                if i.is_multiple_of(50) {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
        }
    });
    let mut acked = Vec::new();
    while acked.len() < 3000 {
        acked.push(
            tokio::time::timeout(TIMEOUT, rx.recv())
                .await
                .unwrap()
                .unwrap(),
        );
    }
    broker.kill9();
    sender.abort();
    // Acks that were already on their way before the kill count too.
    tokio::time::sleep(Duration::from_millis(200)).await;
    while let Ok(a) = rx.try_recv() {
        acked.push(a);
    }
    drop(producer);

    // A torn write at the tail of the active segment of partition 0.
    let part0 = dir.path().join("topics/durable/0");
    let mut logs: Vec<_> = std::fs::read_dir(&part0)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    logs.sort();
    let mut f = std::fs::OpenOptions::new()
        .append(true)
        .open(logs.last().unwrap())
        .unwrap();
    f.write_all(&[0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 1, 0, 0xde, 0xad])
        .unwrap();
    drop(f);

    let broker = Process::start(dir.path(), port, &["--fsync", "always"]);
    let bs = broker.bootstrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut stored = std::collections::HashMap::new();
    for partition in 0..2 {
        let (low, high) = consumer
            .fetch_watermarks("durable", partition, TIMEOUT)
            .unwrap();
        assert_eq!(low, 0);
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("durable", partition, Offset::Beginning)
            .unwrap();
        consumer.assign(&tpl).unwrap();
        let mut next = 0;
        while next < high {
            let m = consumer.poll(TIMEOUT).expect("record").unwrap();
            assert_eq!(m.offset(), next, "offsets are dense after recovery");
            stored.insert(
                (partition, m.offset()),
                String::from_utf8(m.payload().unwrap().to_vec()).unwrap(),
            );
            next += 1;
        }
    }
    let mut missing = 0;
    for (p, offset, payload) in &acked {
        if stored.get(&(*p, *offset)) != Some(payload) {
            missing += 1;
        }
    }
    assert_eq!(
        missing,
        0,
        "{missing} of {} acknowledged records lost or moved",
        acked.len()
    );

    // The recovered log takes new writes after the last recovered offset.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("acks", "all")
        .create()
        .unwrap();
    let offset = producer
        .send(
            FutureRecord::<(), _>::to("durable")
                .partition(0)
                .payload("after"),
            TIMEOUT,
        )
        .await
        .unwrap()
        .offset;
    let (_, high) = consumer.fetch_watermarks("durable", 0, TIMEOUT).unwrap();
    assert_eq!(offset, high - 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_down_cleanly_and_keeps_unsynced_data() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    // No fsync while running; the shutdown path syncs every partition.
    let mut broker = Process::start(dir.path(), port, &["--fsync", "none"]);
    let bs = broker.bootstrap();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("acks", "1")
        .create()
        .unwrap();
    for i in 0..100 {
        let payload = format!("m{i}");
        producer
            .send(
                FutureRecord::<(), _>::to("shutdown")
                    .partition(0)
                    .payload(&payload),
                TIMEOUT,
            )
            .await
            .unwrap();
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &broker.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let exit = broker.child.wait().unwrap();
    assert!(exit.success(), "clean exit on SIGTERM, got {exit:?}");

    let broker = Process::start(dir.path(), port, &[]);
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("group.id", "unused")
        .create()
        .unwrap();
    assert_eq!(
        consumer.fetch_watermarks("shutdown", 0, TIMEOUT).unwrap(),
        (0, 100)
    );
}
