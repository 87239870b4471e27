//! Cluster membership changes under load, as an operator makes them: every
//! broker restarted in turn, a broker added, a broker taken out. Producers
//! (idempotent, `acks=all`) and a consumer group keep running through them;
//! nothing acknowledged may be lost or duplicated and the group keeps its
//! committed offsets.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::cluster::{
    all_leaders, assert_exactly_once, consume_all, create_topic, leader_counts, metadata_consumer,
    producer, wait_for_leaders, Cluster, Load, LEASE_TTL,
};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Message, Offset, TopicPartitionList};

const TOPIC: &str = "events";
const PARTITIONS: i32 = 6;
const GROUP: &str = "auditors";

/// Waits until `node` leads at least `n` partitions (of any topic).
async fn wait_until_leads(cluster: &Cluster, node: i32, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let counts = all_leaders(&cluster.bootstrap()).map(|l| leader_counts(&l));
        if counts
            .as_ref()
            .is_some_and(|c| c.get(&node).copied().unwrap_or(0) >= n)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "broker {node} never led {n} partitions: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// One member of the consumer group, polling on its own thread, committing
/// what it consumed every few hundred milliseconds.
struct Member {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// What the group consumed: (partition, offset) → value, and commits that failed.
#[derive(Default)]
struct Consumed {
    records: BTreeMap<(i32, i64), String>,
    failed_commits: usize,
}

impl Member {
    fn start(bootstrap: &str, consumed: Arc<Mutex<Consumed>>) -> Member {
        let consumer: BaseConsumer = group_consumer(bootstrap, "earliest");
        consumer.subscribe(&[TOPIC]).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut last_commit = Instant::now();
            let mut dirty = false;
            while !flag.load(Ordering::Relaxed) {
                if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                    let value = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
                    let mut c = consumed.lock().unwrap();
                    c.records.insert((m.partition(), m.offset()), value);
                    dirty = true;
                }
                if dirty && last_commit.elapsed() > Duration::from_millis(300) {
                    match consumer.commit_consumer_state(CommitMode::Sync) {
                        Ok(()) => dirty = false,
                        Err(_) => consumed.lock().unwrap().failed_commits += 1,
                    }
                    last_commit = Instant::now();
                }
            }
            // The last positions must be committed before leaving.
            let deadline = Instant::now() + Duration::from_secs(20);
            while dirty {
                match consumer.commit_consumer_state(CommitMode::Sync) {
                    Ok(()) => dirty = false,
                    Err(e) => {
                        assert!(Instant::now() < deadline, "final commit failed: {e}");
                        std::thread::sleep(Duration::from_millis(200));
                    }
                }
            }
            consumer.unsubscribe();
        });
        Member { stop, thread }
    }

    fn finish(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

fn group_consumer(bootstrap: &str, reset: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", GROUP)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", reset)
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "500")
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .unwrap()
}

/// The end offset of every partition of the topic.
fn high_watermarks(bootstrap: &str) -> BTreeMap<i32, i64> {
    let c = metadata_consumer(bootstrap);
    (0..PARTITIONS)
        .map(|p| {
            let (_, high) = c
                .fetch_watermarks(TOPIC, p, Duration::from_secs(10))
                .unwrap();
            (p, high)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rolling_restart_under_load_loses_nothing_and_the_group_keeps_its_offsets() {
    let Some(mut cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap, TOPIC, PARTITIONS, &[]).await;
    wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;

    let load = Load::start(producer(&bootstrap), TOPIC, PARTITIONS);
    // The group's two members know one broker each.
    let consumed = Arc::new(Mutex::new(Consumed::default()));
    let members = [
        Member::start(&cluster.bootstrap_of(1), consumed.clone()),
        Member::start(&cluster.bootstrap_of(2), consumed.clone()),
    ];
    load.progress(300).await;

    for node in [1, 2, 3] {
        let took = cluster.stop(node);
        let stopped_at = Instant::now();
        // Its partitions moved to the others at once, not after a lease TTL.
        wait_for_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS, |l| {
            !l.values().any(|n| *n == node)
        })
        .await;
        eprintln!(
            "broker {node} shut down in {took:?}; partitions moved {:?} later",
            stopped_at.elapsed()
        );
        load.progress(100).await;
        cluster.start_broker(node);
        // Serving again: it took a share back.
        wait_until_leads(&cluster, node, 1).await;
        load.progress(100).await;
    }
    let report = load.finish().await;
    eprintln!(
        "rolling restart: {} acknowledged, {} failed, longest wait for an acknowledgement {:?}",
        report.acked.len(),
        report.failed.len(),
        report.max_latency
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);

    let bootstrap = cluster.bootstrap();
    let got = consume_all(&bootstrap, TOPIC, PARTITIONS, report.acked.len());
    assert_exactly_once(&report.acked, &got);
    assert_eq!(got.len(), report.acked.len(), "only what was acknowledged");

    // The group read everything, then commits where it stands and leaves.
    let ends = high_watermarks(&bootstrap);
    let deadline = Instant::now() + Duration::from_secs(30);
    let caught_up = || {
        let c = consumed.lock().unwrap();
        ends.iter()
            .all(|(p, end)| *end == 0 || c.records.contains_key(&(*p, end - 1)))
    };
    while !caught_up() {
        assert!(Instant::now() < deadline, "the group did not catch up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for m in members {
        tokio::task::spawn_blocking(move || m.finish())
            .await
            .unwrap();
    }
    let consumed = Arc::try_unwrap(consumed)
        .ok()
        .unwrap()
        .into_inner()
        .unwrap();
    let values: BTreeSet<&String> = consumed.records.values().collect();
    assert!(
        report.acked.iter().all(|(_, _, v)| values.contains(v)),
        "the group consumed every acknowledged record"
    );
    eprintln!(
        "group commits that failed during the restarts: {}",
        consumed.failed_commits
    );

    // A new member resumes exactly at the committed offsets: more records
    // come after them, and it reads those and nothing earlier.
    let more = Load::start(producer(&bootstrap), TOPIC, PARTITIONS);
    more.progress(60).await;
    let more = more.finish().await;
    assert!(more.failed.is_empty(), "{:?}", more.failed);
    let resumed = tokio::task::spawn_blocking(move || {
        // "error": without a committed offset there is nowhere to start.
        let c = group_consumer(&bootstrap, "error");
        c.subscribe(&[TOPIC]).unwrap();
        let mut first: BTreeMap<i32, i64> = BTreeMap::new();
        let mut values = BTreeSet::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        while values.len() < more.acked.len() {
            assert!(Instant::now() < deadline, "resumed member read {values:?}");
            match c.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    first.entry(m.partition()).or_insert(m.offset());
                    values.insert(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
                }
                Some(Err(e)) => panic!("resumed member: {e}"),
                None => {}
            }
        }
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(TOPIC, p);
        }
        let committed = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        (first, values, committed, more)
    })
    .await
    .unwrap();
    let (first, values, committed, more) = resumed;
    for (p, end) in &ends {
        let tp = committed.find_partition(TOPIC, *p).unwrap();
        // The committed offsets were intact before the new member read on.
        assert!(
            matches!(tp.offset(), Offset::Offset(o) if o >= *end),
            "partition {p}: committed {:?}, group had read up to {end}",
            tp.offset()
        );
        if let Some(f) = first.get(p) {
            assert_eq!(f, end, "partition {p}: resumed at the committed offset");
        }
    }
    let expected: BTreeSet<String> = more.acked.iter().map(|(_, _, v)| v.clone()).collect();
    assert_eq!(values, expected, "only the records after the commits");
    assert!(cluster.exited().is_empty(), "{:?}", cluster.exited());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_joining_broker_gets_its_share_and_a_leaving_one_hands_over_at_once() {
    // A long lease, so that a hand-over "at once" cannot be mistaken for
    // the lease running out.
    let ttl = 4 * LEASE_TTL;
    let settings = common::cluster::Settings {
        lease_ttl: ttl,
        ..Default::default()
    };
    let Some(mut cluster) = Cluster::start_with(&[1, 2, 3], settings).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap, TOPIC, PARTITIONS, &[]).await;
    wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;
    let load = Load::start(producer(&bootstrap), TOPIC, PARTITIONS);
    load.progress(200).await;

    // A fourth broker joins: leadership of every topic (internal ones too)
    // spreads so that no broker leads two more than another.
    cluster.start_broker(4);
    let joined_at = Instant::now();
    let deadline = joined_at + Duration::from_secs(30);
    let counts = loop {
        let counts = all_leaders(&cluster.bootstrap()).map(|l| leader_counts(&l));
        if let Some(c) = &counts {
            let (min, max) = (c.values().min(), c.values().max());
            if c.len() == 4 && max.zip(min).is_some_and(|(max, min)| max - min <= 1) {
                break c.clone();
            }
        }
        assert!(Instant::now() < deadline, "no fair share: {counts:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    eprintln!(
        "broker 4 joined; leaders {counts:?} after {:?}",
        joined_at.elapsed()
    );
    load.progress(200).await;

    // One leaves gracefully: its partitions move well before its lease
    // could have run out.
    let leaving = wait_for_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS, |_| true).await[&0];
    let took = cluster.stop(leaving);
    let stopped_at = Instant::now();
    let after = wait_for_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS, |l| {
        !l.values().any(|n| *n == leaving)
    })
    .await;
    let moved = stopped_at.elapsed() + took;
    eprintln!(
        "broker {leaving} left in {took:?}; its partitions moved within {moved:?}: {after:?}"
    );
    assert!(
        moved < ttl / 2,
        "partitions of a leaving broker moved only after {moved:?}"
    );
    let all = all_leaders(&cluster.bootstrap()).unwrap();
    assert!(!all.values().any(|n| *n == leaving), "{all:?}");
    load.progress(200).await;

    let mut report = load.finish().await;
    eprintln!(
        "join and graceful leave: {} acknowledged, longest wait for an acknowledgement {:?}",
        report.acked.len(),
        report.max_latency,
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);

    // For comparison, a broker killed (-9): its partitions wait for its
    // lease to run out, and producers with them.
    let load = Load::start_at(
        producer(&cluster.bootstrap()),
        TOPIC,
        PARTITIONS,
        report.sent,
    );
    load.progress(100).await;
    let victim = wait_for_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS, |_| true).await[&0];
    cluster.kill9(victim);
    let killed_at = Instant::now();
    let after = wait_for_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS, |l| {
        !l.values().any(|n| *n == victim)
    })
    .await;
    let moved = killed_at.elapsed();
    load.progress(100).await;
    let killed = load.finish().await;
    eprintln!(
        "broker {victim} killed: partitions moved after {moved:?} (lease TTL {ttl:?}): {after:?}; longest wait for an acknowledgement {:?}",
        killed.max_latency
    );
    assert!(killed.failed.is_empty(), "{:?}", killed.failed);
    report.acked.extend(killed.acked);

    let got = consume_all(&cluster.bootstrap(), TOPIC, PARTITIONS, report.acked.len());
    assert_exactly_once(&report.acked, &got);
    assert_eq!(got.len(), report.acked.len());
    assert!(cluster.exited().is_empty(), "{:?}", cluster.exited());
}
