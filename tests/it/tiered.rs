//! Tiered storage end to end, with librdkafka against in-process brokers:
//! a wiped data directory comes back from the store, committed offsets
//! included; a failing or stalled store does not stop produce or reads of
//! the head and cache, and nothing is lost when it recovers; retention
//! removes tiered segments; a store that errs now and then still lets
//! uploads advance.

use crate::common;

use std::sync::Arc;
use std::time::Duration;

use common::{clients, Raw};
use kafka_protocol::error::ResponseError;

use object_store::memory::InMemory;
use object_store::ObjectStore;
use rdkafka::admin::{AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use strata::manifest::fault::{Fault, FaultyStore};
use strata::server::Server;

const TIMEOUT: Duration = Duration::from_secs(30);
/// Small segments that roll on size and, when idle, within a few hundred ms.
const SEGMENT_CONFIG: &[(&str, &str)] = &[("segment.bytes", "4096"), ("segment.ms", "300")];

fn producer(bootstrap: &str) -> FutureProducer {
    clients::producer(
        bootstrap,
        &[
            ("acks", "all"),
            ("linger.ms", "2"),
            // Small batches, so that small segments hold several each.
            ("batch.size", "2048"),
            ("message.timeout.ms", "60000"),
        ],
    )
}

async fn create_topic(bootstrap: &str, name: &str, configs: &[(&str, &str)]) {
    clients::create_topic(bootstrap, name, 1, configs).await
}

fn value(i: usize) -> String {
    format!("record-{i:06}-{}", "x".repeat(40))
}

async fn produce(bootstrap: &str, topic: &str, range: std::ops::Range<usize>) {
    let p = producer(bootstrap);
    let futures: Vec<_> = range
        .map(|i| {
            let v = value(i);
            let k = format!("k{i}");
            let p = p.clone();
            let topic = topic.to_string();
            async move {
                p.send(
                    FutureRecord::to(&topic).key(&k).payload(&v).partition(0),
                    TIMEOUT,
                )
                .await
                .map(|d| d.offset)
                .map_err(|(e, _)| e)
            }
        })
        .collect();
    for r in futures::future::join_all(futures).await {
        r.unwrap();
    }
}

/// Consumes partition 0 from `from` until `count` records are read.
fn consume(bootstrap: &str, topic: &str, from: i64, count: usize) -> Vec<(i64, String)> {
    let c = clients::reader(
        bootstrap,
        &[
            // Small fetches: many round trips through the tiered read path.
            ("message.max.bytes", "10000"),
            ("fetch.max.bytes", "20000"),
            ("max.partition.fetch.bytes", "5000"),
        ],
    );
    let read = |m: &BorrowedMessage<'_>| (m.offset(), clients::text(m));
    clients::read_partition(&c, topic, 0, Offset::Offset(from), count, TIMEOUT, read)
}

fn check_all(records: &[(i64, String)], from: usize) {
    for (i, (offset, v)) in records.iter().enumerate() {
        assert_eq!(*offset as usize, from + i);
        assert_eq!(*v, value(from + i));
    }
}

/// Waits until the store's manifest covers every offset below `end`.
async fn wait_tiered(server: &Server, topic: &str, end: i64) {
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let tiered = server
            .tier()
            .manifest_of(topic, 0)
            .and_then(|m| m.end_offset())
            .unwrap_or(0);
        if tiered >= end {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {tiered} of {end} offsets reached the store"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn start(data_dir: &std::path::Path, store: Arc<dyn ObjectStore>, extra: &[&str]) -> Server {
    let mut args = vec!["--tier-interval-ms", "50"];
    args.extend_from_slice(extra);
    Server::start_with_store(common::config(data_dir, &args), Some(store))
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn wiped_data_dir_comes_back_from_a_file_store() {
    let store_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store_dir.path().display());
    let args = ["--store", url.as_str(), "--tier-interval-ms", "50"];
    let server = Server::start(common::config(data.path(), &args))
        .await
        .unwrap();
    let bootstrap = server.local_addr().to_string();
    let mut configs = SEGMENT_CONFIG.to_vec();
    configs.push(("retention.ms", "987654321"));
    create_topic(&bootstrap, "wiped", &configs).await;
    produce(&bootstrap, "wiped", 0..2000).await;
    wait_tiered(&server, "wiped", 2000).await;
    // Uploaded segments left the local disk: the active segment remains.
    let deadline = std::time::Instant::now() + TIMEOUT;
    while common::local_log_files(data.path(), "wiped") > 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "local segments not released"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Offsets that now live only in the store read back through the cache.
    check_all(&consume(&bootstrap, "wiped", 0, 2000), 0);
    check_all(&consume(&bootstrap, "wiped", 1234, 766), 1234);
    server.shutdown().await.unwrap();

    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir_all(data.path()).unwrap();
    let server = Server::start(common::config(data.path(), &args))
        .await
        .unwrap();
    let bootstrap = server.local_addr().to_string();
    check_all(&consume(&bootstrap, "wiped", 0, 2000), 0);
    // The topic config came back, and the log continues where it ended.
    let described = clients::admin(&bootstrap)
        .describe_configs(&[ResourceSpecifier::Topic("wiped")], &AdminOptions::new())
        .await
        .unwrap();
    let resource = described[0].as_ref().unwrap();
    let retention = resource.get("retention.ms").unwrap();
    assert_eq!(retention.value.as_deref(), Some("987654321"));
    produce(&bootstrap, "wiped", 2000..2100).await;
    check_all(&consume(&bootstrap, "wiped", 1950, 150), 1950);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failing_store_keeps_head_and_cache_serving_and_catches_up() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), faulty.clone(), &[]).await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "outage", SEGMENT_CONFIG).await;
    produce(&bootstrap, "outage", 0..1000).await;
    wait_tiered(&server, "outage", 1000).await;
    // Warm the cache with the tiered part.
    check_all(&consume(&bootstrap, "outage", 0, 1000), 0);

    for fault in [Fault::Fail, Fault::Stall] {
        faulty.set(fault);
        let refused = faulty.refused.load(std::sync::atomic::Ordering::Relaxed);
        let (from, to) = if fault == Fault::Fail {
            (1000, 2000)
        } else {
            (2000, 3000)
        };
        // Produce is not blocked by the store...
        produce(&bootstrap, "outage", from..to).await;
        // ...and everything reads back: tiered from the cache, the rest locally.
        check_all(&consume(&bootstrap, "outage", 0, to), 0);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let tiered = server
            .tier()
            .manifest_of("outage", 0)
            .unwrap()
            .end_offset()
            .unwrap();
        assert!(
            tiered <= 1000,
            "nothing can be tiered while the store is down: {tiered}"
        );
        if fault == Fault::Fail {
            assert!(faulty.refused.load(std::sync::atomic::Ordering::Relaxed) > refused);
        }
    }
    faulty.set(Fault::None);
    wait_tiered(&server, "outage", 3000).await;
    server.shutdown().await.unwrap();

    // Nothing lost: a wiped broker on the same store reads all of it.
    let fresh = tempfile::tempdir().unwrap();
    let server = start(fresh.path(), inner, &[]).await;
    let bootstrap = server.local_addr().to_string();
    check_all(&consume(&bootstrap, "outage", 0, 3000), 0);
    server.shutdown().await.unwrap();
}

/// Segments piled up while the store was down; it then fails every tenth
/// request, so no turn uploads them all. Each turn commits what it did
/// upload instead of starting over.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn uploads_advance_on_a_store_that_fails_every_few_requests() {
    let inner: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let faulty = Arc::new(FaultyStore::new(inner.clone()));
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), faulty.clone(), &[]).await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "flaky", SEGMENT_CONFIG).await;
    faulty.set(Fault::Fail);
    produce(&bootstrap, "flaky", 0..1000).await;
    faulty.set(Fault::FailEvery(10));
    wait_tiered(&server, "flaky", 1000).await;
    server.shutdown().await.unwrap();

    let fresh = tempfile::tempdir().unwrap();
    let server = start(fresh.path(), inner, &[]).await;
    let bootstrap = server.local_addr().to_string();
    check_all(&consume(&bootstrap, "flaky", 0, 1000), 0);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn lagging_uploads_apply_backpressure_instead_of_filling_the_disk() {
    let faulty = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let data = tempfile::tempdir().unwrap();
    let server = start(
        data.path(),
        faulty.clone(),
        &["--max-pending-upload-bytes", "8000"],
    )
    .await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "pressure", SEGMENT_CONFIG).await;
    faulty.set(Fault::Fail);
    // Produce in the background: once the limit is hit, the rest waits.
    let background = tokio::spawn({
        let bootstrap = bootstrap.clone();
        async move { produce(&bootstrap, "pressure", 0..500).await }
    });
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while !server.tier().backpressure_active() {
        assert!(tokio::time::Instant::now() < deadline, "no backpressure");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A produce now waits (the client retries the retriable refusal)...
    let p = producer(&bootstrap);
    let v = value(500);
    let pending = p.send(
        FutureRecord::to("pressure")
            .key("k")
            .payload(&v)
            .partition(0),
        TIMEOUT,
    );
    tokio::pin!(pending);
    assert!(
        tokio::time::timeout(Duration::from_secs(1), &mut pending)
            .await
            .is_err(),
        "produce went through despite backpressure"
    );
    // ...and everything lands once the store is back and uploads caught up.
    faulty.set(Fault::None);
    pending.await.map_err(|(e, _)| e).unwrap();
    background.await.unwrap();
    let mut got: Vec<String> = consume(&bootstrap, "pressure", 0, 501)
        .into_iter()
        .map(|(_, v)| v)
        .collect();
    got.sort();
    let mut want: Vec<String> = (0..=500).map(value).collect();
    want.sort();
    assert_eq!(got, want);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn retention_deletes_tiered_segments_manifest_first() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), store.clone(), &[]).await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "expiring", SEGMENT_CONFIG).await;
    produce(&bootstrap, "expiring", 0..1000).await;
    wait_tiered(&server, "expiring", 1000).await;
    let before = server.tier().manifest_of("expiring", 0).unwrap();
    assert!(before.segments.len() > 3);

    // retention.bytes keeps about two segments' worth.
    let alter =
        AlterConfig::new(ResourceSpecifier::Topic("expiring")).set("retention.bytes", "8192");
    clients::admin(&bootstrap)
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let m = loop {
        let m = server.tier().manifest_of("expiring", 0).unwrap();
        if m.log_start_offset > 0 {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention did not run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(m.size_bytes() <= 8192 + 4096, "{}", m.size_bytes());
    assert_eq!(m.segments[0].base_offset, m.log_start_offset);
    // Dropped segments' objects are gone; kept ones are there.
    for s in &before.segments {
        let exists = store.head(&s.object("log")).await.is_ok();
        assert_eq!(exists, s.next_offset > m.log_start_offset, "{}", s.key);
    }
    // ListOffsets earliest reflects it, and reading from there works.
    let c: BaseConsumer = clients::client(&bootstrap, &[("group.id", "unused")])
        .create()
        .unwrap();
    let (low, high) = c.fetch_watermarks("expiring", 0, TIMEOUT).unwrap();
    assert_eq!((low, high), (m.log_start_offset, 1000));
    check_all(
        &consume(&bootstrap, "expiring", low, (1000 - low) as usize),
        low as usize,
    );

    // retention.ms drops everything sealed (all records are older than 1 ms).
    let alter = AlterConfig::new(ResourceSpecifier::Topic("expiring")).set("retention.ms", "1");
    clients::admin(&bootstrap)
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    while c.fetch_watermarks("expiring", 0, TIMEOUT).unwrap().0 < 1000 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "retention.ms did not run"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let m = server.tier().manifest_of("expiring", 0).unwrap();
    assert!(m.segments.is_empty());
    assert_eq!(m.log_start_offset, 1000);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn delete_records_moves_the_manifest_log_start_and_survives_a_wipe() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), store.clone(), &[]).await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "trimmed", SEGMENT_CONFIG).await;
    produce(&bootstrap, "trimmed", 0..1000).await;
    wait_tiered(&server, "trimmed", 1000).await;
    let before = server.tier().manifest_of("trimmed", 0).unwrap();

    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset("trimmed", 0, Offset::Offset(555))
        .unwrap();
    let res = clients::admin(&bootstrap)
        .delete_records(&tpl, &AdminOptions::new())
        .await
        .unwrap();
    assert_eq!(
        res.find_partition("trimmed", 0).unwrap().offset(),
        Offset::Offset(555)
    );
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let m = loop {
        let m = server.tier().manifest_of("trimmed", 0).unwrap();
        if m.log_start_offset == 555 {
            break m;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "manifest kept its log start"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // The segment holding 555 stays; those wholly below it are gone.
    assert!(m.segments[0].base_offset <= 555 && m.segments[0].next_offset > 555);
    for s in &before.segments {
        let exists = store.head(&s.object("log")).await.is_ok();
        assert_eq!(exists, s.next_offset > 555, "{}", s.key);
    }
    check_all(&consume(&bootstrap, "trimmed", 555, 445), 555);
    server.shutdown().await.unwrap();

    // A wiped broker starts from the manifest's log start offset.
    let fresh = tempfile::tempdir().unwrap();
    let server = start(fresh.path(), store, &[]).await;
    let bootstrap = server.local_addr().to_string();
    let c: BaseConsumer = clients::client(&bootstrap, &[("group.id", "unused")])
        .create()
        .unwrap();
    assert_eq!(
        c.fetch_watermarks("trimmed", 0, TIMEOUT).unwrap(),
        (555, 1000)
    );
    check_all(&consume(&bootstrap, "trimmed", 555, 445), 555);
    server.shutdown().await.unwrap();
}

/// Not a test but a measurement (the cold-read case of the benchmark):
/// `cargo test --release --test it tiered::cold_read -- --ignored --nocapture`.
/// Consumes N records (default 1M of 100 bytes) once from local segments and
/// once from segments that are only in a `file://` store, and prints the
/// ratio and the store requests per GB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn cold_read_vs_hot_read() {
    use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
    use std::sync::atomic::Ordering::Relaxed;
    let n: usize = std::env::var("STRATA_COLD_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1_000_000);
    let store_dir = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store_dir.path().display());
    // No background passes: the measurement decides when segments tier.
    let args = ["--store", url.as_str(), "--tier-interval-ms", "3600000"];
    let server = Server::start(common::config(data.path(), &args))
        .await
        .unwrap();
    let bootstrap = server.local_addr().to_string();
    create_topic(
        &bootstrap,
        "cold",
        &[("segment.bytes", "67108864"), ("segment.ms", "2000")],
    )
    .await;
    let p: BaseProducer = clients::client(
        &bootstrap,
        &[
            ("acks", "1"),
            ("linger.ms", "5"),
            ("batch.size", "1000000"),
            ("queue.buffering.max.messages", "1000000"),
        ],
    )
    .create()
    .unwrap();
    let payload = vec![b'v'; 100];
    for _ in 0..n {
        while let Err((_, _)) = p.send(
            BaseRecord::<(), _>::to("cold")
                .payload(&payload)
                .partition(0),
        ) {
            p.poll(Duration::from_millis(5));
        }
    }
    p.flush(Duration::from_secs(120)).unwrap();

    let read_all = |bootstrap: String| {
        tokio::task::spawn_blocking(move || {
            let c: BaseConsumer = clients::reader(&bootstrap, &[]);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset("cold", 0, Offset::Beginning)
                .unwrap();
            c.assign(&tpl).unwrap();
            let t0 = std::time::Instant::now();
            let (mut count, mut bytes) = (0usize, 0usize);
            while count < n {
                if let Some(m) = c.poll(Duration::from_millis(500)) {
                    bytes += m.unwrap().payload().map_or(0, |p| p.len());
                    count += 1;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(300),
                    "read {count} of {n}"
                );
            }
            (t0.elapsed(), bytes)
        })
    };
    let (hot, bytes) = read_all(bootstrap.clone()).await.unwrap();
    // Seal the head (segment.ms) and tier everything.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    server.tier().pass().await;
    server.tier().pass().await;
    assert_eq!(
        common::local_log_files(data.path(), "cold"),
        1,
        "all sealed segments tiered"
    );
    let gets_before = server.tier().cache().counters.gets.load(Relaxed);
    let (cold, _) = read_all(bootstrap).await.unwrap();
    let stats = server.tier().stats();
    let gb = stats.bytes_uploaded.load(Relaxed) as f64 / 1e9;
    let gets = server.tier().cache().counters.gets.load(Relaxed) - gets_before;
    println!(
        "cold read: {n} records ({:.1} MB of values): hot {:.2?} ({:.0} rec/s), cold {:.2?} ({:.0} rec/s), cold/hot throughput {:.2}; GETs/GB {:.0}, PUTs/GB {:.0}",
        bytes as f64 / 1e6,
        hot,
        n as f64 / hot.as_secs_f64(),
        cold,
        n as f64 / cold.as_secs_f64(),
        hot.as_secs_f64() / cold.as_secs_f64(),
        gets as f64 / gb,
        stats.puts.load(Relaxed) as f64 / gb,
    );
    server.shutdown().await.unwrap();
}

fn group_member(bootstrap: &str, group: &str) -> BaseConsumer {
    clients::client(
        bootstrap,
        &[("group.id", group), ("enable.auto.commit", "false")],
    )
    .create()
    .unwrap()
}

fn commit(c: &BaseConsumer, topic: &str, offset: i64) {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Offset(offset))
        .unwrap();
    c.commit(&tpl, CommitMode::Sync).unwrap();
}

fn committed(c: &BaseConsumer, topic: &str) -> Offset {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, 0);
    let got = c.committed_offsets(tpl, TIMEOUT).unwrap();
    got.find_partition(topic, 0).unwrap().offset()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn committed_offsets_are_tiered_and_survive_a_wiped_data_dir() {
    const OFFSETS: &str = "__consumer_offsets";
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = tempfile::tempdir().unwrap();
    let flags = ["--offsets-topic-segment-bytes", "1024"];
    let server = start(data.path(), store.clone(), &flags).await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "orders", SEGMENT_CONFIG).await;
    produce(&bootstrap, "orders", 0..100).await;
    let keeper = group_member(&bootstrap, "keeper");
    commit(&keeper, "orders", 10);
    commit(&keeper, "orders", 42);
    let (_, written) = keeper.fetch_watermarks(OFFSETS, 0, TIMEOUT).unwrap();
    // Another group's commits fill segments until the keeper's are sealed and uploaded.
    let filler = group_member(&bootstrap, "filler");
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    let mut n = 0;
    loop {
        let tiered = server
            .tier()
            .manifest_of(OFFSETS, 0)
            .and_then(|m| m.end_offset())
            .unwrap_or(0);
        if tiered >= written {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "only {tiered} of {written} offsets-topic records reached the store"
        );
        n += 1;
        commit(&filler, "orders", n);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((keeper, filler));
    server.shutdown().await.unwrap();

    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir_all(data.path()).unwrap();
    let server = start(data.path(), store, &flags).await;
    let bootstrap = server.local_addr().to_string();
    // Nothing of the keeper's commits is on local disk: only the store had them.
    assert_eq!(common::local_log_files(data.path(), OFFSETS), 1);
    let keeper = group_member(&bootstrap, "keeper");
    assert_eq!(committed(&keeper, "orders"), Offset::Offset(42));
    // The coordinator keeps appending where the tiered log ended.
    commit(&keeper, "orders", 77);
    assert_eq!(committed(&keeper, "orders"), Offset::Offset(77));
    let (_, end) = keeper.fetch_watermarks(OFFSETS, 0, TIMEOUT).unwrap();
    assert!(end > written, "{end} <= {written}");
    drop(keeper);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn idempotent_producer_goes_on_after_a_wiped_data_dir() {
    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), store.clone(), &[]).await;
    // Kept forever: the raw batches carry timestamps from 2023.
    let mut configs = SEGMENT_CONFIG.to_vec();
    configs.push(("retention.ms", "-1"));
    create_topic(&server.local_addr().to_string(), "idem", &configs).await;
    let mut raw = Raw::connect(server.local_addr()).await;
    let id = common::init_producer_id(&mut raw).await;
    let pair = |i: i32| [value(i as usize * 2), value(i as usize * 2 + 1)];
    let idempotent = |i: i32| {
        let [a, b] = pair(i);
        common::batch(&[a.as_bytes(), b.as_bytes()], id, 0, i * 2)
    };
    // 40 batches of two records over several 4 KiB segments, all sealed.
    for i in 0..40 {
        let got = raw.produce_result("idem", 0, idempotent(i)).await;
        assert_eq!(got, (0, i as i64 * 2));
    }
    wait_tiered(&server, "idem", 80).await;
    server.shutdown().await.unwrap();

    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir_all(data.path()).unwrap();
    let server = start(data.path(), store, &[]).await;
    let mut raw = Raw::connect(server.local_addr()).await;
    // A retry of the last batch is recognised: its original offset, not stored twice.
    assert_eq!(raw.produce_result("idem", 0, idempotent(39)).await, (0, 78));
    // The next sequence is accepted where the log ended; a gap is not.
    assert_eq!(raw.produce_result("idem", 0, idempotent(40)).await, (0, 80));
    assert_eq!(
        raw.produce_result("idem", 0, idempotent(42)).await.0,
        ResponseError::OutOfOrderSequenceNumber.code()
    );
    assert_eq!(raw.produce_result("idem", 0, idempotent(40)).await, (0, 80));
    // New producers get ids the restored state has not seen.
    assert!(common::init_producer_id(&mut raw).await > id);
    let bootstrap = server.local_addr().to_string();
    check_all(&consume(&bootstrap, "idem", 0, 82), 0);
    server.shutdown().await.unwrap();
}

/// ListOffsets with a special timestamp; (error code, offset).
async fn list_offset(raw: &mut Raw, topic: &str, spec: i64, version: i16) -> (i16, i64) {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    use kafka_protocol::messages::{ApiKey, BrokerId, ListOffsetsRequest, ListOffsetsResponse};
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(common::topic_name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(spec)])]);
    let resp: ListOffsetsResponse = raw.call(ApiKey::ListOffsets, version, &req).await;
    let p = &resp.topics[0].partitions[0];
    (p.error_code, p.offset)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn list_offsets_v11_earliest_pending_upload_is_the_first_offset_not_yet_in_the_store() {
    const EARLIEST_PENDING_UPLOAD: i64 = -6;
    let data = tempfile::tempdir().unwrap();
    let server = start(data.path(), Arc::new(InMemory::new()), &[]).await;
    let bootstrap = server.local_addr().to_string();
    create_topic(&bootstrap, "pending", SEGMENT_CONFIG).await;
    let mut raw = Raw::connect(server.local_addr()).await;

    // Nothing tiered and nothing released: the log start.
    assert_eq!(
        list_offset(&mut raw, "pending", EARLIEST_PENDING_UPLOAD, 11).await,
        (0, 0)
    );
    // v10 does not define -6.
    assert_eq!(
        list_offset(&mut raw, "pending", EARLIEST_PENDING_UPLOAD, 10)
            .await
            .0,
        ResponseError::InvalidRequest.code()
    );

    // Once the store holds everything, one past its last offset; on the
    // way there, never past what the store holds.
    produce(&bootstrap, "pending", 0..1000).await;
    let deadline = tokio::time::Instant::now() + TIMEOUT;
    loop {
        let (code, pending) = list_offset(&mut raw, "pending", EARLIEST_PENDING_UPLOAD, 11).await;
        // Read after the answer: the store holds at least what it said.
        let tiered = server
            .tier()
            .manifest_of("pending", 0)
            .and_then(|m| m.end_offset())
            .unwrap_or(0);
        assert_eq!(code, 0);
        assert!((0..=1000).contains(&pending), "{pending}");
        if pending == 1000 {
            assert_eq!(tiered, 1000);
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pending upload stayed at {pending} (store has {tiered})"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
