//! Transactions as librdkafka (the rdkafka crate) sees them, against the
//! built broker binary: what read_committed and read_uncommitted consumers
//! see of committed, aborted and still-open transactions, and a broker killed
//! with -9 after it answered EndTxn but before its COMMIT/ABORT markers
//! reached every partition: on restart the coordinator finishes the
//! transaction from `__transaction_state`, so a read_committed consumer sees
//! all of it, or none of an aborted one. (Fencing: tests/txn_coordinator.rs
//! and the Java TransactionsTest.)

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{free_port, Process};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);

type TxnProducer = ThreadedProducer<DefaultProducerContext>;

fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let res = rt
        .block_on(admin.create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        ))
        .unwrap();
    assert!(res[0].is_ok(), "create {name}: {:?}", res[0]);
}

fn transactional_producer(bootstrap: &str, transactional_id: &str) -> TxnProducer {
    let p: TxnProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("transactional.id", transactional_id)
        .set("transaction.timeout.ms", "60000")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    p.init_transactions(TIMEOUT).expect("init_transactions");
    p
}

fn send(p: &TxnProducer, topic: &str, partition: i32, value: &str) {
    p.send(
        BaseRecord::<(), str>::to(topic)
            .partition(partition)
            .payload(value),
    )
    .map_err(|(e, _)| e)
    .expect("enqueue");
}

/// Sends `per_partition` records `"{prefix}-{partition}-{i}"` to every partition.
fn send_all(p: &TxnProducer, topic: &str, partitions: i32, per_partition: usize, prefix: &str) {
    for i in 0..per_partition {
        for partition in 0..partitions {
            send(p, topic, partition, &format!("{prefix}-{partition}-{i}"));
        }
    }
}

fn expected(partitions: i32, per_partition: usize, prefix: &str) -> BTreeSet<String> {
    (0..partitions)
        .flat_map(|p| (0..per_partition).map(move |i| format!("{prefix}-{p}-{i}")))
        .collect()
}

fn consumer(bootstrap: &str, isolation: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .unwrap()
}

/// Reads every partition from the beginning until at least `at_least` values
/// arrived and every partition reported its end (the LSO for read_committed,
/// the high watermark for read_uncommitted) after its last record.
fn read(
    bootstrap: &str,
    isolation: &str,
    topic: &str,
    partitions: i32,
    at_least: usize,
) -> Vec<String> {
    let c = consumer(bootstrap, isolation);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut at_end = vec![false; partitions as usize];
    let mut got = Vec::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < at_least || at_end.iter().any(|e| !e) {
        assert!(
            Instant::now() < deadline,
            "{isolation} read of {topic}: {} of at least {at_least} values, at end: {at_end:?}",
            got.len()
        );
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                at_end[m.partition() as usize] = false;
                got.push(String::from_utf8(m.payload().unwrap().to_vec()).unwrap());
            }
            Some(Err(KafkaError::PartitionEOF(p))) => at_end[p as usize] = true,
            Some(Err(e)) => panic!("{isolation} read of {topic}: {e}"),
            None => {}
        }
    }
    got
}

/// Asserts that `got` holds each value of `want` once and nothing else,
/// naming a few of the missing and unexpected values.
fn assert_read(got: &[String], want: &BTreeSet<String>, what: &str) {
    let set: BTreeSet<String> = got.iter().cloned().collect();
    assert_eq!(set.len(), got.len(), "{what}: a value was read twice");
    let missing: Vec<_> = want.difference(&set).collect();
    let extra: Vec<_> = set.difference(want).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "{what}: {} missing (e.g. {:?}), {} unexpected (e.g. {:?})",
        missing.len(),
        &missing[..missing.len().min(5)],
        extra.len(),
        &extra[..extra.len().min(5)]
    );
}

/// High watermark per partition as a read_uncommitted reader sees it.
fn high_watermarks(bootstrap: &str, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c = consumer(bootstrap, "read_uncommitted");
    (0..partitions)
        .map(|p| (p, c.fetch_watermarks(topic, p, TIMEOUT).unwrap().1))
        .collect()
}

#[test]
fn read_committed_sees_committed_transactions_only_and_read_uncommitted_sees_all() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Process::start(dir.path(), free_port(), &[]);
    let bs = broker.bootstrap();
    create_topic(&bs, "visibility", 3);

    let p = transactional_producer(&bs, "visibility-txn");
    p.begin_transaction().unwrap();
    send_all(&p, "visibility", 3, 50, "committed1");
    p.commit_transaction(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send_all(&p, "visibility", 3, 50, "aborted");
    p.flush(TIMEOUT).unwrap();
    p.abort_transaction(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send_all(&p, "visibility", 3, 50, "committed2");
    p.commit_transaction(TIMEOUT).unwrap();

    let mut want = expected(3, 50, "committed1");
    want.extend(expected(3, 50, "committed2"));
    let committed = read(&bs, "read_committed", "visibility", 3, want.len());
    assert_read(&committed, &want, "read_committed");

    want.extend(expected(3, 50, "aborted"));
    let uncommitted = read(&bs, "read_uncommitted", "visibility", 3, want.len());
    assert_read(&uncommitted, &want, "read_uncommitted");

    // Each transaction left one control record (its marker) per partition.
    let hw = high_watermarks(&bs, "visibility", 3);
    assert_eq!(hw, (0..3).map(|p| (p, 150 + 3)).collect(), "offsets");
}

#[test]
fn an_open_transaction_holds_read_committed_readers_at_its_first_offset() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Process::start(dir.path(), free_port(), &[]);
    let bs = broker.bootstrap();
    create_topic(&bs, "open", 1);

    let plain: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", &bs)
        .set("enable.idempotence", "true")
        .create()
        .unwrap();
    let send_plain = |v: &str| {
        plain
            .send(BaseRecord::<(), str>::to("open").partition(0).payload(v))
            .map_err(|(e, _)| e)
            .unwrap();
        plain.flush(TIMEOUT).unwrap();
    };
    send_plain("before");

    let txn = transactional_producer(&bs, "open-txn");
    txn.begin_transaction().unwrap();
    send(&txn, "open", 0, "in-txn");
    txn.flush(TIMEOUT).unwrap();
    send_plain("after");

    // The LSO is the open transaction's first offset: "after" waits behind it.
    assert_eq!(
        read(&bs, "read_committed", "open", 1, 1),
        vec!["before".to_string()]
    );
    assert_eq!(
        read(&bs, "read_uncommitted", "open", 1, 3),
        vec!["before", "in-txn", "after"]
    );

    txn.commit_transaction(TIMEOUT).unwrap();
    assert_eq!(
        read(&bs, "read_committed", "open", 1, 3),
        vec!["before", "in-txn", "after"]
    );
}

/// The broker answers EndTxn once the decision is in `__transaction_state`
/// and writes the markers afterwards (`--txn-marker-delay-ms` stretches that
/// window); killed inside it, the restarted coordinator writes them all.
#[test]
fn markers_are_completed_after_kill_minus_nine_between_end_txn_and_markers() {
    const PARTITIONS: i32 = 16;
    const PER_PARTITION: usize = 20;
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let delayed = ["--fsync", "always", "--txn-marker-delay-ms", "5000"];
    let broker = Process::start(dir.path(), port, &delayed);
    let bs = broker.bootstrap();
    create_topic(&bs, "markers", PARTITIONS);

    let p = transactional_producer(&bs, "markers-commit");
    p.begin_transaction().unwrap();
    send_all(&p, "markers", PARTITIONS, PER_PARTITION, "committed");
    p.commit_transaction(TIMEOUT).unwrap();
    // Within the delay: the answer is out, markers are not all written.
    let hw = high_watermarks(&bs, "markers", PARTITIONS);
    assert!(
        hw.values().any(|&h| h == PER_PARTITION as i64),
        "every marker was already written, the kill would test nothing: {hw:?}"
    );
    drop(p);
    broker.kill9();

    let broker = Process::start(dir.path(), port, &["--fsync", "always"]);
    let want = expected(PARTITIONS, PER_PARTITION, "committed");
    let got = read(&bs, "read_committed", "markers", PARTITIONS, want.len());
    assert_read(&got, &want, "the whole committed transaction");
    let hw = high_watermarks(&bs, "markers", PARTITIONS);
    assert!(
        hw.values().all(|&h| h == PER_PARTITION as i64 + 1),
        "one COMMIT marker per partition: {hw:?}"
    );

    // The same for an abort: none of it, and later transactions are readable.
    broker.kill9();
    let broker = Process::start(dir.path(), port, &delayed);
    let p = transactional_producer(&bs, "markers-abort");
    p.begin_transaction().unwrap();
    send_all(&p, "markers", PARTITIONS, PER_PARTITION, "aborted");
    p.flush(TIMEOUT).unwrap();
    p.abort_transaction(TIMEOUT).unwrap();
    drop(p);
    broker.kill9();

    let _broker = Process::start(dir.path(), port, &["--fsync", "always"]);
    let p = transactional_producer(&bs, "markers-after");
    p.begin_transaction().unwrap();
    send_all(&p, "markers", PARTITIONS, 1, "later");
    p.commit_transaction(TIMEOUT).unwrap();
    let mut want = want;
    want.extend(expected(PARTITIONS, 1, "later"));
    let got = read(&bs, "read_committed", "markers", PARTITIONS, want.len());
    assert_read(&got, &want, "committed, then nothing aborted, then later");
    let hw = high_watermarks(&bs, "markers", PARTITIONS);
    assert!(
        hw.values()
            .all(|&h| h == 2 * (PER_PARTITION as i64 + 1) + 2),
        "COMMIT, ABORT and COMMIT markers on every partition: {hw:?}"
    );
}
