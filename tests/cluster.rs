//! Cluster mode end to end: `strata` processes on 127.0.0.1 sharing one
//! `file://` object store and a real etcd, driven by librdkafka. A broker is
//! lost by `kill -9` and by deleting its data directory; nothing it
//! acknowledged may be lost or duplicated.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::cluster::{self, signal, Cluster};
use rdkafka::producer::{FutureProducer, FutureRecord};

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 3;
const TIMEOUT: Duration = Duration::from_secs(60);

/// Creates the test topic; idle segments roll within a second, so that the
/// write-ahead log soon becomes collectable.
async fn create_topic(bootstrap: &str) {
    let configs = [("segment.ms", "1000"), ("strata.compaction.policy", "none")];
    cluster::create_topic(bootstrap, TOPIC, PARTITIONS, &configs).await;
}

/// Whether `node` leads any partition of any topic.
fn leads_something(bootstrap: &str, node: i32) -> bool {
    cluster::all_leaders(bootstrap).is_some_and(|l| l.values().any(|n| *n == node))
}

async fn wait_for_leaders(
    bootstrap: &str,
    ok: impl Fn(&BTreeMap<i32, i32>) -> bool,
) -> BTreeMap<i32, i32> {
    cluster::wait_for_leaders(bootstrap, TOPIC, PARTITIONS, ok).await
}

fn producer(bootstrap: &str) -> FutureProducer {
    cluster::producer(bootstrap)
}

/// Produces `values` (round-robin over the partitions); returns each
/// acknowledged value with its partition and offset.
async fn produce(p: &FutureProducer, values: std::ops::Range<u32>) -> Vec<(i32, i64, String)> {
    produce_outcomes(p, values)
        .await
        .into_iter()
        .map(|r| r.expect("every record is acknowledged, across the failover"))
        .collect()
}

/// Like `produce`, but a record may fail (the client gave up on it); only
/// the acknowledged ones are returned.
async fn produce_acknowledged(
    p: &FutureProducer,
    values: std::ops::Range<u32>,
) -> Vec<(i32, i64, String)> {
    let outcomes = produce_outcomes(p, values).await;
    let failed: Vec<_> = outcomes.iter().filter_map(|r| r.as_ref().err()).collect();
    if let Some(first) = failed.first() {
        eprintln!("{} records were not acknowledged: {first}", failed.len());
    }
    outcomes.into_iter().flatten().collect()
}

async fn produce_outcomes(
    p: &FutureProducer,
    values: std::ops::Range<u32>,
) -> Vec<Result<(i32, i64, String), rdkafka::error::KafkaError>> {
    let sends: Vec<_> = values
        .map(|i| {
            let value = format!("v{i}");
            let key = format!("k{i}");
            let partition = (i % PARTITIONS as u32) as i32;
            let p = p.clone();
            async move {
                let record = FutureRecord::to(TOPIC)
                    .partition(partition)
                    .key(&key)
                    .payload(&value);
                p.send(record, TIMEOUT)
                    .await
                    .map(|delivery| (delivery.partition, delivery.offset, value.clone()))
                    .map_err(|(e, _)| e)
            }
        })
        .collect();
    futures::future::join_all(sends).await
}

fn consume_all(bootstrap: &str, expected: usize) -> BTreeMap<(i32, i64), String> {
    cluster::consume_all(bootstrap, TOPIC, PARTITIONS, expected)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_records_survive_the_loss_of_their_leaders_machine() {
    let Some(mut cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap).await;
    let before = wait_for_leaders(&bootstrap, |_| true).await;
    // `strata cluster` shows what etcd holds: the brokers and the leaders.
    let shown = cluster.describe();
    for node in [1, 2, 3] {
        assert!(
            shown.contains(&format!("broker {node} at 127.0.0.1:")),
            "{shown}"
        );
    }
    for (partition, leader) in &before {
        let line = format!("{TOPIC}-{partition}: leader {leader} epoch ");
        assert!(shown.contains(&line), "{line} in {shown}");
    }
    // Leaders spread over every partition of every topic, internal ones too.
    let spread: BTreeSet<i32> = before.values().copied().collect();
    assert!(spread.len() >= 2, "leaders spread over brokers: {before:?}");

    let p = producer(&bootstrap);
    let mut acked = produce(&p, 0..600).await;
    // The machine leading partition 0 goes away, with its disk.
    let victim = before[&0];
    cluster.lose(victim);
    let lost_at = Instant::now();
    acked.extend(produce(&p, 600..1200).await);
    let stall = lost_at.elapsed();
    let survivors = cluster.bootstrap();
    let after = wait_for_leaders(&survivors, |l| !l.values().any(|n| *n == victim)).await;
    eprintln!("leaders {before:?} -> {after:?}; producing across the loss took {stall:?}");

    // The broker comes back (a new machine, same node id) and takes a share
    // of the partitions (of some topic) by handover.
    cluster.start_broker(victim);
    let bootstrap = cluster.bootstrap();
    let deadline = Instant::now() + TIMEOUT;
    while !leads_something(&bootstrap, victim) {
        assert!(
            Instant::now() < deadline,
            "the returning broker got no share"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for_leaders(&bootstrap, |_| true).await;
    acked.extend(produce(&p, 1200..1500).await);

    let got = consume_all(&bootstrap, acked.len());
    for (partition, offset, value) in &acked {
        assert_eq!(
            got.get(&(*partition, *offset)),
            Some(value),
            "acknowledged {value} at {partition}/{offset} must be there"
        );
    }
    let values: BTreeSet<&String> = got.values().collect();
    assert_eq!(
        values.len(),
        got.len(),
        "no record twice (idempotence across failover)"
    );
    assert_eq!(got.len(), acked.len());

    // Once sealed segments hold the data, the write-ahead log objects go
    // (a dead broker's too); what stays is each node's newest and fences.
    let written = wal_data_objects(cluster.store.path());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = wal_data_objects(cluster.store.path());
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} of {written} WAL objects never collected"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("{written} WAL objects with data collected");
}

/// WAL objects holding data that are not their node's newest.
fn wal_data_objects(store: &Path) -> usize {
    let Ok(nodes) = std::fs::read_dir(store.join("wal")) else {
        return 0;
    };
    let mut count = 0;
    for node in nodes {
        let mut files: Vec<_> = std::fs::read_dir(node.unwrap().path())
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        files.sort();
        files.pop();
        for f in files {
            let Ok(bytes) = std::fs::read(&f) else {
                continue;
            };
            let object = strata::format::wal::decode(bytes.into()).unwrap();
            count += usize::from(!object.is_fence());
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_acknowledges_nothing_after_losing_its_partitions() {
    let Some(cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap).await;
    let before = wait_for_leaders(&bootstrap, |_| true).await;
    let p = producer(&bootstrap);
    let mut acked = produce(&p, 0..300).await;

    // The leader of partition 0 freezes for longer than its lease while
    // producers go on; its partitions move to the others.
    let zombie = before[&0];
    signal(cluster.process(zombie), "-STOP");
    let others: Vec<String> = cluster
        .running()
        .into_iter()
        .filter(|n| *n != zombie)
        .map(|n| cluster.bootstrap_of(n))
        .collect();
    wait_for_leaders(&others.join(","), |l| !l.values().any(|n| *n == zombie)).await;
    // Records caught in the paused broker may fail (the client times them
    // out); what matters is that none is acknowledged and then lost.
    acked.extend(produce_acknowledged(&p, 300..900).await);
    // It wakes up believing it still leads: whatever it was sent meanwhile
    // must not be acknowledged by it, and nothing acknowledged may be lost.
    signal(cluster.process(zombie), "-CONT");
    acked.extend(produce_acknowledged(&p, 900..1200).await);
    assert!(
        acked.len() >= 1000,
        "most records went through: {}",
        acked.len()
    );

    let got = consume_all(&others.join(","), acked.len());
    for (partition, offset, value) in &acked {
        assert_eq!(got.get(&(*partition, *offset)), Some(value), "{value} lost");
    }
    let values: BTreeSet<&String> = got.values().collect();
    assert_eq!(values.len(), got.len(), "no record twice");
    let sent = |v: &String| v[1..].parse::<u32>().is_ok_and(|i| i < 1200);
    assert!(got.values().all(sent), "only records the producer sent");
}
