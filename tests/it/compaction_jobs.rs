//! Compaction as it runs for users: jobs queued by the broker, run by the
//! broker's own worker or by `strata compact`, merging segments in the
//! object store while librdkafka consumers read across the gaps.

use crate::common;
use common::clients;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use crate::common::now_ms;
use common::{free_port, InProcess, Process};
use object_store::ObjectStore;
use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::consumer::Consumer;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::Offset;
use strata::catalog::config::TopicConfig;
use strata::compaction::job::{JobSpec, Outcome, Runner};
use strata::compaction::policy::{for_topic, SegmentDesc};
use strata::manifest::store::{default_url, open, S3Options};
use strata::manifest::Manifest;
use strata::manifest::{objects, partition_prefix};

const TIMEOUT: Duration = Duration::from_secs(60);
const KEYS: usize = 20;
const VERSIONS: usize = 40;
/// Keys 0..DELETED get a tombstone after their last version.
const DELETED: usize = 4;

async fn create_topic(bootstrap: &str, name: &str) {
    clients::create_topic(bootstrap, name, 1, common::QUICK_COMPACTION).await
}

/// The value of version `v` of key `k`.
fn value(k: usize, v: usize) -> String {
    format!("key{k:02}-version{v:03}")
}

/// Keyed updates, then tombstones for the first keys, in small batches so
/// that they spread over many segments. Returns the newest value per key
/// (`None` for deleted keys).
async fn produce_updates(bootstrap: &str, topic: &str) -> BTreeMap<String, Option<String>> {
    let p = clients::producer(bootstrap, &[("linger.ms", "0"), ("batch.size", "1000")]);
    let mut latest = BTreeMap::new();
    for v in 0..VERSIONS {
        for k in 0..KEYS {
            let key = format!("key{k:02}");
            let val = value(k, v);
            p.send(
                FutureRecord::to(topic).key(&key).payload(&val).partition(0),
                TIMEOUT,
            )
            .await
            .unwrap();
            latest.insert(key, Some(val));
        }
    }
    for k in 0..DELETED {
        let key = format!("key{k:02}");
        p.send(
            FutureRecord::<_, ()>::to(topic).key(&key).partition(0),
            TIMEOUT,
        )
        .await
        .unwrap();
        latest.insert(key, None);
    }
    latest
}

type Record = (i64, String, Option<String>);

/// Every record of partition 0 from offset 0 to the high watermark (the end
/// of the partition, which the last record need not reach once compaction
/// removed it), read by librdkafka, which must step over compaction's gaps
/// by itself.
fn consume_all(bootstrap: &str, topic: &str) -> Vec<Record> {
    let settings = [
        ("max.partition.fetch.bytes", "2000"),
        ("enable.partition.eof", "true"),
    ];
    let c = clients::reader(bootstrap, &settings);
    let (_, high) = c
        .fetch_watermarks(topic, 0, Duration::from_secs(10))
        .unwrap();
    clients::assign(&c, topic, 1, Offset::Beginning);
    let deadline = std::time::Instant::now() + TIMEOUT;
    let mut out: Vec<Record> = Vec::new();
    while out.last().is_none_or(|r| r.0 < high - 1) {
        assert!(
            std::time::Instant::now() < deadline,
            "stuck after {:?} (high watermark {high})",
            out.last()
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            if let Err(rdkafka::error::KafkaError::PartitionEOF(_)) = m {
                break;
            }
            let m = m.unwrap();
            let key = String::from_utf8(m.key().unwrap().to_vec()).unwrap();
            let val = m.payload().map(|v| String::from_utf8(v.to_vec()).unwrap());
            out.push((m.offset(), key, val));
        }
    }
    out
}

/// What a consumer must see: offsets only grow, the newest record of every
/// key is its newest value (or its tombstone, or nothing once the tombstone
/// is removed), and within each merged segment of `merged` (base, next)
/// every key appears at most once.
fn check(
    records: &[Record],
    latest: &BTreeMap<String, Option<String>>,
    merged: &[(i64, i64)],
) -> Result<(), String> {
    for w in records.windows(2) {
        if w[0].0 >= w[1].0 {
            return Err(format!("offsets go back: {:?} then {:?}", w[0], w[1]));
        }
    }
    let mut newest: BTreeMap<&str, &Option<String>> = BTreeMap::new();
    for (_, k, v) in records {
        newest.insert(k, v);
    }
    for (k, v) in latest {
        let ok = match v {
            Some(v) => newest.get(k.as_str()) == Some(&&Some(v.clone())),
            // A removed tombstone is fine; an older value coming back is not.
            None => matches!(newest.get(k.as_str()), None | Some(None)),
        };
        if !ok {
            return Err(format!(
                "key {k}: read {:?}, wrote {v:?}",
                newest.get(k.as_str())
            ));
        }
    }
    for (base, next) in merged {
        let mut seen = HashSet::new();
        for (o, k, _) in records.iter().filter(|r| (*base..*next).contains(&r.0)) {
            if !seen.insert(k.clone()) {
                return Err(format!(
                    "key {k} twice in merged segment {base}..{next} (offset {o})"
                ));
            }
        }
    }
    Ok(())
}

/// Reads everything and checks it against the store's manifest. A broker
/// may serve from the manifest version before a worker's swap for a moment
/// (that data is simply less compacted), so the merged-segment check is
/// retried until the broker caught up; the other checks must hold on
/// every read.
async fn read_and_check(
    bootstrap: &str,
    store: &Arc<dyn ObjectStore>,
    latest: &BTreeMap<String, Option<String>>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let b = bootstrap.to_string();
        let records = tokio::task::spawn_blocking(move || consume_all(&b, "kv"))
            .await
            .unwrap();
        check(&records, latest, &[]).unwrap();
        let m = manifest(store, "kv").await.unwrap().0;
        match check(&records, latest, &merged(&m)) {
            Ok(()) => return,
            Err(e) if tokio::time::Instant::now() > deadline => panic!("{e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn descs(m: &Manifest) -> Vec<SegmentDesc> {
    m.segments.iter().map(SegmentDesc::from).collect()
}

/// The offset ranges of the merged (level > 0) segments.
fn merged(m: &Manifest) -> Vec<(i64, i64)> {
    m.segments
        .iter()
        .filter(|s| s.level > 0)
        .map(|s| (s.base_offset, s.next_offset))
        .collect()
}

/// The manifest of partition 0 of `topic`, read from the store.
async fn manifest(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
) -> Option<(Manifest, TopicConfig, uuid::Uuid)> {
    let (m, file) = common::stored_manifest(store, topic, 0).await?;
    Some((m, file.config, file.id))
}

/// Waits until everything produced is tiered, something was merged and the
/// policy wants nothing more; with `clean`, also until the swapped-out
/// sources are deleted (a killed worker's leftovers wait for the orphan scan).
async fn wait_compacted(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    end: i64,
    clean: bool,
) -> Manifest {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        if let Some((m, config, _)) = manifest(store, topic).await {
            let settled = common::compaction_settled(&m, &config, end);
            if settled && (!clean || unnamed_segments(store, &m).await.is_empty()) {
                return m;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "compaction did not settle: {:?}",
                common::levels(&m)
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Segment object keys (without extension) in the store that `m` does not name.
async fn unnamed_segments(store: &Arc<dyn ObjectStore>, m: &Manifest) -> Vec<String> {
    use futures::TryStreamExt;
    let named: HashSet<&str> = m.segments.iter().map(|s| s.key.as_str()).collect();
    let Some(first) = m.segments.first() else {
        return Vec::new();
    };
    let dir = object_store::path::Path::from(first.key.rsplit_once('/').unwrap().0);
    let listed: Vec<_> = store.list(Some(&dir)).try_collect().await.unwrap();
    let mut out: Vec<String> = listed
        .iter()
        .filter_map(|o| Some(o.location.as_ref().rsplit_once('.')?.0.to_string()))
        .filter(|k| !named.contains(k.as_str()))
        .collect();
    out.sort();
    out.dedup();
    out
}

fn file_store(data_dir: &Path) -> Arc<dyn ObjectStore> {
    open(&default_url(data_dir), &S3Options::default()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_brokers_worker_compacts_keyed_updates_that_consumers_read_across_gaps() {
    let broker = InProcess::start(&[
        "--tier-interval-ms",
        "50",
        "--compaction-delete-delay-ms",
        "100",
    ])
    .await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "kv").await;
    let latest = produce_updates(&bootstrap, "kv").await;
    let end = (KEYS * VERSIONS + DELETED) as i64;
    let store = file_store(broker.dir.path());
    let m = wait_compacted(&store, "kv", end, true).await;
    assert!(m.segments.iter().any(|s| s.level >= 1), "{m:?}");
    read_and_check(&bootstrap, &store, &latest).await;
    let records = tokio::task::spawn_blocking(move || consume_all(&bootstrap, "kv"))
        .await
        .unwrap();
    assert!(
        records.len() < end as usize / 2,
        "{} of {end} records left",
        records.len()
    );
}

/// Keys, and writes of each, for the size-bound test (the workload).
const BOUND_KEYS: usize = 200;
const BOUND_WRITES: usize = 100;
/// Keys 0..BOUND_DELETED are deleted after their last write.
const BOUND_DELETED: usize = 20;
const BOUND_LAG_MS: i64 = 4000;

/// 200 keys written 100 times into 64 KiB segments, then idle: once
/// `min.cleanable.dirty.ratio` folds the dirty segments into the ones below
/// them, a consumer from offset 0 reads at most twice the live keys (the
/// idle head rolls by `segment.ms`, so nothing stays in the active segment).
/// Before `min.compaction.lag.ms` nothing written may disappear, and deleted
/// keys never come back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quiet_compacted_topic_shrinks_within_the_dirty_ratio() {
    let broker = InProcess::start(&[
        "--tier-interval-ms",
        "50",
        "--compaction-delete-delay-ms",
        "100",
    ])
    .await;
    let bootstrap = broker.bootstrap();
    let lag = BOUND_LAG_MS.to_string();
    let config = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "65536"),
        ("segment.ms", "2000"),
        ("min.compaction.lag.ms", lag.as_str()),
        ("delete.retention.ms", "0"),
    ];
    clients::create_topic(&bootstrap, "bounded", 1, &config).await;

    // Every write, by offset: key, value and timestamp.
    let p = clients::producer(
        &bootstrap,
        &[("linger.ms", "5"), ("enable.idempotence", "true")],
    );
    let mut sends = Vec::new();
    for v in 0..BOUND_WRITES {
        for k in 0..BOUND_KEYS {
            let key = format!("key{k:03}");
            let val = format!("{key}-write{v:03}-{}", "x".repeat(40));
            let ts = now_ms();
            let p = &p;
            sends.push(async move {
                let offset = p
                    .send(
                        FutureRecord::to("bounded")
                            .key(&key)
                            .payload(&val)
                            .timestamp(ts)
                            .partition(0),
                        TIMEOUT,
                    )
                    .await
                    .unwrap()
                    .offset;
                (offset, (key, Some(val), ts))
            });
        }
    }
    let mut written: BTreeMap<i64, (String, Option<String>, i64)> =
        futures::future::join_all(sends).await.into_iter().collect();
    for k in 0..BOUND_DELETED {
        let key = format!("key{k:03}");
        let ts = now_ms();
        let offset = p
            .send(
                FutureRecord::<_, ()>::to("bounded")
                    .key(&key)
                    .timestamp(ts)
                    .partition(0),
                TIMEOUT,
            )
            .await
            .unwrap()
            .offset;
        written.insert(offset, (key, None, ts));
    }
    let end = *written.keys().last().unwrap() + 1;
    assert_eq!(end as usize, BOUND_KEYS * BOUND_WRITES + BOUND_DELETED);
    let mut latest: BTreeMap<String, Option<String>> = BTreeMap::new();
    for (key, val, _) in written.values() {
        latest.insert(key.clone(), val.clone());
    }

    // A record may be gone only once it is older than min.compaction.lag.ms.
    let lag_obeyed = |read: &[Record], read_end: i64| {
        let present: HashSet<i64> = read.iter().map(|r| r.0).collect();
        for (offset, (key, _, ts)) in &written {
            assert!(
                present.contains(offset) || ts + BOUND_LAG_MS <= read_end,
                "{key} at offset {offset}, written {} ms before the read ended, is gone",
                read_end - ts
            );
        }
    };
    let read = |b: String| async move {
        let records = tokio::task::spawn_blocking(move || consume_all(&b, "bounded"))
            .await
            .unwrap();
        (records, now_ms())
    };
    let (early, read_end) = read(bootstrap.clone()).await;
    check(&early, &latest, &[]).unwrap();
    lag_obeyed(&early, read_end);

    // Idle until the policy wants nothing more with every write past the
    // lag; then read until the broker serves the last swap.
    let store = file_store(broker.dir.path());
    let newest = written.values().map(|w| w.2).max().unwrap();
    let settle_and_read = |at_most: usize| {
        let (store, bootstrap) = (store.clone(), bootstrap.clone());
        async move {
            let deadline = tokio::time::Instant::now() + TIMEOUT;
            loop {
                let (m, config, _) = manifest(&store, "bounded").await.unwrap();
                let now = now_ms();
                let settled = now > newest + BOUND_LAG_MS
                    && m.end_offset() == Some(end)
                    && for_topic(&config.settings())
                        .next_job(&descs(&m), now)
                        .is_none()
                    && m.segments.iter().any(|s| s.level > 0);
                let (records, read_end) = read(bootstrap.clone()).await;
                if settled && records.len() <= at_most {
                    return (m, records, read_end);
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "{} records read; segments {:?}",
                    records.len(),
                    descs(&m)
                );
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    };
    let live = BOUND_KEYS - BOUND_DELETED;
    // The idle head rolls (segment.ms), so nothing stays in the active segment.
    let (m, records, read_end) = settle_and_read(2 * live).await;
    check(&records, &latest, &[]).unwrap();
    lag_obeyed(&records, read_end);
    println!(
        "{end} records written, {} read for {live} live keys; segments (base, level) {:?}",
        records.len(),
        common::levels(&m)
    );

    // A lower ratio, set through AlterConfigs (which replaces every
    // override), folds the rest: the tombstones, past delete.retention.ms,
    // go with every older value of their keys.
    let mut alter = AlterConfig::new(ResourceSpecifier::Topic("bounded"))
        .set("min.cleanable.dirty.ratio", "0.01");
    for (k, v) in config {
        alter = alter.set(k, v);
    }
    let res = clients::admin(&bootstrap)
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_ok(), "{res:?}");
    let (_, records, read_end) = settle_and_read(live).await;
    check(&records, &latest, &[]).unwrap();
    lag_obeyed(&records, read_end);
    assert_eq!(records.len(), live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_topic_refuses_records_without_a_key() {
    let broker = InProcess::start(&[]).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "kv").await;
    let p = clients::producer(&bootstrap, &[("message.send.max.retries", "0")]);
    let keyless = p
        .send(
            FutureRecord::<(), _>::to("kv").payload("v").partition(0),
            TIMEOUT,
        )
        .await;
    match keyless {
        Err((e, _)) => assert_eq!(
            e.rdkafka_error_code(),
            Some(rdkafka::types::RDKafkaErrorCode::InvalidRecord),
            "{e}"
        ),
        Ok(d) => panic!("keyless record accepted at {}", d.offset),
    }
    let keyed = p
        .send(
            FutureRecord::to("kv").key("k").payload("v").partition(0),
            TIMEOUT,
        )
        .await
        .unwrap();
    assert_eq!(keyed.offset, 0);
}

/// A job as the broker would queue it: the first `count` segments.
async fn job_for_first(store: &Arc<dyn ObjectStore>, topic: &str, count: usize) -> JobSpec {
    let (m, config, id) = manifest(store, topic).await.unwrap();
    assert!(m.segments.len() >= count, "{m:?}");
    JobSpec {
        topic: topic.into(),
        topic_id: id,
        partition: 0,
        sources: m.segments[..count].iter().map(|s| s.key.clone()).collect(),
        target_level: 1,
        config,
        delete_delay_ms: 0,
        max_run_ms: 600_000,
        queued_ms: now_ms(),
    }
}

async fn wait_tiered(store: &Arc<dyn ObjectStore>, topic: &str, end: i64) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while manifest(store, topic)
        .await
        .and_then(|(m, ..)| m.end_offset())
        != Some(end)
    {
        assert!(tokio::time::Instant::now() < deadline, "not tiered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The broker serves reads but runs no worker, so the test drives jobs.
async fn broker_without_worker() -> (
    InProcess,
    Arc<dyn ObjectStore>,
    BTreeMap<String, Option<String>>,
) {
    let broker =
        InProcess::start(&["--tier-interval-ms", "50", "--compaction-worker", "false"]).await;
    let bootstrap = broker.bootstrap();
    create_topic(&bootstrap, "kv").await;
    let latest = produce_updates(&bootstrap, "kv").await;
    let store = file_store(broker.dir.path());
    wait_tiered(&store, "kv", (KEYS * VERSIONS + DELETED) as i64).await;
    (broker, store, latest)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_worker_stopped_after_any_step_loses_and_duplicates_nothing() {
    let (broker, store, latest) = broker_without_worker().await;
    let scratch = tempfile::tempdir().unwrap();
    let runner = || Runner::new(store.clone(), 7, scratch.path().to_path_buf());

    // Stopped after uploading its output: nothing visible changed; the
    // rerun merges again under a new key.
    let job = job_for_first(&store, "kv", 2).await;
    let before = manifest(&store, "kv").await.unwrap().0;
    let abandoned = runner().merge_and_upload(&job).await.unwrap().unwrap();
    assert_eq!(manifest(&store, "kv").await.unwrap().0, before);
    read_and_check(&broker.bootstrap(), &store, &latest).await;
    let Outcome::Merged(merged) = runner().run(&job).await.unwrap() else {
        panic!("the rerun must merge")
    };
    assert_ne!(merged.output.key, abandoned.output.key);
    read_and_check(&broker.bootstrap(), &store, &latest).await;

    // Stopped after the manifest write, before deleting sources: the rerun
    // is stale and changes nothing.
    assert!(matches!(
        runner().run(&job).await.unwrap(),
        Outcome::Stale(_)
    ));
    let after = manifest(&store, "kv").await.unwrap().0;
    assert_eq!(after.version, merged.manifest.version);
    // The orphans (abandoned output, swapped-out sources) go in the scan.
    let orphans = unnamed_segments(&store, &after).await;
    assert_eq!(orphans.len(), 3, "{orphans:?}");
    let prefix = partition_prefix("kv", job.topic_id, 0);
    let deleted = objects::collect_orphans(&store, &prefix, &after, now_ms(), Duration::ZERO)
        .await
        .unwrap();
    assert!(deleted >= 3 * 4, "{deleted}");
    assert!(unnamed_segments(&store, &after).await.is_empty());
    read_and_check(&broker.bootstrap(), &store, &latest).await;

    // A full run including the source delete, then a rerun: stale.
    let job = job_for_first(&store, "kv", 2).await;
    let job = JobSpec {
        target_level: 2,
        ..job
    };
    let Outcome::Merged(merged) = runner().run(&job).await.unwrap() else {
        panic!("merge expected")
    };
    runner().delete_sources(&job).await.unwrap();
    assert!(unnamed_segments(&store, &merged.manifest).await.is_empty());
    assert!(matches!(
        runner().run(&job).await.unwrap(),
        Outcome::Stale(_)
    ));
    read_and_check(&broker.bootstrap(), &store, &latest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_workers_racing_on_one_job_produce_one_result() {
    let (broker, store, latest) = broker_without_worker().await;
    let scratch = tempfile::tempdir().unwrap();
    let job = job_for_first(&store, "kv", 4).await;
    // One merges in its task, the other streams on a blocking thread.
    let a = Runner::new(store.clone(), 1, scratch.path().join("a"));
    let b = Runner::new(store.clone(), 2, scratch.path().join("b")).inline_merge_bytes(0);
    let (ra, rb) = tokio::join!(a.run(&job), b.run(&job));
    let outcomes = [ra.unwrap(), rb.unwrap()];
    let merged: Vec<_> = outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::Merged(m) => Some(m),
            Outcome::Stale(_) => None,
        })
        .collect();
    assert_eq!(merged.len(), 1, "{outcomes:?}");
    let m = manifest(&store, "kv").await.unwrap().0;
    assert_eq!(m.segments[0].key, merged[0].output.key);
    assert_eq!(m.segments.iter().filter(|s| s.level == 1).count(), 1);
    // The loser deleted its output; only the sources are left unnamed.
    let unnamed = unnamed_segments(&store, &m).await;
    assert_eq!(unnamed.len(), 4, "{unnamed:?}");
    assert!(unnamed.iter().all(|k| job.sources.contains(k)));
    read_and_check(&broker.bootstrap(), &store, &latest).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_job_merged_in_its_task_writes_the_bytes_a_streamed_merge_writes() {
    let (_broker, store, _) = broker_without_worker().await;
    let scratch = tempfile::tempdir().unwrap();
    let job = job_for_first(&store, "kv", 4).await;
    let inline = Runner::new(store.clone(), 1, scratch.path().join("a"));
    let streamed = Runner::new(store.clone(), 2, scratch.path().join("b")).inline_merge_bytes(0);
    let mut outputs = Vec::new();
    for runner in [inline, streamed] {
        let up = runner.merge_and_upload(&job).await.unwrap().unwrap();
        let log = object_store::path::Path::from(format!("{}.log", up.output.key));
        let bytes = store.get(&log).await.unwrap().bytes().await.unwrap();
        outputs.push((up.output.size, up.output.next_offset, bytes));
    }
    assert!(!outputs[0].2.is_empty());
    assert_eq!(outputs[0], outputs[1]);
}

/// A `strata compact` process, killed (-9) when dropped.
struct Worker(std::process::Child);

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn compact_process(bootstrap: &str, data_dir: &Path) -> Worker {
    Worker(
        std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args([
                "compact",
                "--bootstrap",
                bootstrap,
                "--data-dir",
                data_dir.to_str().unwrap(),
                "--log-level",
                "warn",
            ])
            .spawn()
            .unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standalone_worker_compacts_and_a_killed_one_is_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let broker = Process::start(
        dir.path(),
        free_port(),
        &[
            "--tier-interval-ms",
            "50",
            "--compaction-worker",
            "false",
            "--compaction-delete-delay-ms",
            "100",
            "--group-initial-rebalance-delay-ms",
            "0",
        ],
    );
    let bootstrap = broker.bootstrap();
    // Killed while jobs may be queued or running.
    let first = compact_process(&bootstrap, dir.path());
    create_topic(&bootstrap, "kv").await;
    let latest = produce_updates(&bootstrap, "kv").await;
    drop(first);
    let second = compact_process(&bootstrap, dir.path());
    let store = file_store(dir.path());
    let m = wait_compacted(&store, "kv", (KEYS * VERSIONS + DELETED) as i64, false).await;
    assert!(!merged(&m).is_empty());
    read_and_check(&bootstrap, &store, &latest).await;
    let levels = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["levels", "kv", "--data-dir", dir.path().to_str().unwrap()])
        .output()
        .unwrap();
    let report = String::from_utf8(levels.stdout).unwrap();
    assert!(levels.status.success(), "{report}");
    assert!(report.contains("next merge: none"), "{report}");
    assert!(
        report
            .lines()
            .any(|l| l.starts_with("  L") && !l.starts_with("  L0:")),
        "{report}"
    );
    drop(second);
}

mod offsets {
    use super::*;
    use common::Raw;
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
    use kafka_protocol::messages::{
        ApiKey, GroupId, OffsetCommitRequest, OffsetCommitResponse, OffsetFetchRequest,
        OffsetFetchResponse,
    };
    use strata::server::Server;

    const PARTITIONS: i32 = 100;
    const ROUNDS: i64 = 10_000;
    /// Requests sent before their responses are read.
    const WINDOW: i64 = 50;

    fn commit(round: i64) -> OffsetCommitRequest {
        OffsetCommitRequest::default()
            .with_group_id(GroupId(common::str_bytes("many-commits")))
            .with_generation_id_or_member_epoch(-1)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(common::topic_name("t"))
                .with_partitions(
                    (0..PARTITIONS)
                        .map(|p| {
                            OffsetCommitRequestPartition::default()
                                .with_partition_index(p)
                                .with_committed_offset(round)
                        })
                        .collect(),
                )])
    }

    async fn committed(server: &Server) -> Vec<i64> {
        let mut raw = Raw::connect(server.local_addr()).await;
        let req = OffsetFetchRequest::default()
            .with_group_id(GroupId(common::str_bytes("many-commits")))
            .with_topics(Some(vec![OffsetFetchRequestTopic::default()
                .with_name(common::topic_name("t"))
                .with_partition_indexes((0..PARTITIONS).collect())]));
        let resp: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 7, &req).await;
        resp.topics[0]
            .partitions
            .iter()
            .map(|p| p.committed_offset)
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_million_offset_commits_leave_consumer_offsets_small() {
        let dir = tempfile::tempdir().unwrap();
        let args = [
            "--tier-interval-ms",
            "50",
            "--compaction-delete-delay-ms",
            "100",
            "--offsets-topic-segment-bytes",
            "1048576",
            "--fsync",
            "none",
        ];
        let server = Server::start(common::config(dir.path(), &args))
            .await
            .unwrap();
        let bootstrap = server.local_addr().to_string();
        clients::create_topic(&bootstrap, "t", PARTITIONS, &[]).await;
        let mut raw = Raw::connect(server.local_addr()).await;
        for first in (0..ROUNDS).step_by(WINDOW as usize) {
            for round in first..first + WINDOW {
                raw.send(ApiKey::OffsetCommit, 8, &commit(round)).await;
            }
            for _ in 0..WINDOW {
                let resp: OffsetCommitResponse =
                    raw.receive(ApiKey::OffsetCommit, 8).await.unwrap();
                assert!(resp.topics[0].partitions.iter().all(|p| p.error_code == 0));
            }
        }
        let written = (ROUNDS * PARTITIONS as i64) as u64;
        let last = vec![ROUNDS - 1; PARTITIONS as usize];
        assert_eq!(committed(&server).await, last);

        // Everything sealed is tiered and merged as far as the policy goes.
        let deadline = tokio::time::Instant::now() + TIMEOUT;
        let store = file_store(dir.path());
        let m = loop {
            let (m, config, _) = manifest(&store, "__consumer_offsets").await.unwrap();
            let tiered = m.end_offset().unwrap_or(0);
            let settled = tiered as u64 + 20_000 >= written
                && for_topic(&config.settings())
                    .next_job(&descs(&m), now_ms())
                    .is_none();
            if settled {
                break m;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "offsets did not settle: tiered to {tiered}, {:?}",
                m.segments
                    .iter()
                    .map(|s| (s.level, s.size))
                    .collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let uploaded = server
            .tier()
            .stats()
            .bytes_uploaded
            .load(std::sync::atomic::Ordering::Relaxed);
        eprintln!(
            "{written} commits: {uploaded} bytes uploaded, {} bytes in {} segments left",
            m.size_bytes(),
            m.segments.len()
        );
        // Only the unmerged level-0 segments (fewer than the fan-out per
        // run) hold more than one record per key.
        assert!(
            m.size_bytes() * 10 < uploaded,
            "{} bytes tiered of {uploaded} written: {:?}",
            m.size_bytes(),
            m.segments
                .iter()
                .map(|s| (s.level, s.size))
                .collect::<Vec<_>>()
        );
        assert!(m.segments.len() < 16, "{} segments", m.segments.len());

        // The compacted log still rebuilds every committed offset.
        server.shutdown().await.unwrap();
        let server = Server::start(common::config(dir.path(), &args))
            .await
            .unwrap();
        assert_eq!(committed(&server).await, last);
    }
}
