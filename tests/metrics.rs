//! `--metrics-listen`: the broker binary's `/metrics`, parsed as Prometheus
//! text, shows the traffic librdkafka just generated; `/healthz` answers
//! while the broker starts and `/readyz` only once it serves and its object
//! store answers (and, in a cluster, while its etcd lease is live).

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{free_port, Process};
use object_store::memory::InMemory;
use prometheus_parse::{Scrape, Value};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};
use strata::manifest::fault::{Fault, FaultyStore};
use strata::server::Server;

const TIMEOUT: Duration = Duration::from_secs(30);

async fn get(url: &str) -> Option<(u16, String)> {
    let response = reqwest::get(url).await.ok()?;
    let status = response.status().as_u16();
    Some((status, response.text().await.ok()?))
}

async fn wait_for_status(url: &str, wanted: u16) -> String {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        match get(url).await {
            Some((status, body)) if status == wanted => return body,
            last => assert!(
                Instant::now() < deadline,
                "{url} did not answer {wanted}: {last:?}"
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn scrape(metrics_port: u16) -> Scrape {
    let (status, body) = get(&format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .expect("GET /metrics");
    assert_eq!(status, 200, "{body}");
    Scrape::parse(body.lines().map(|l| Ok(l.to_string()))).expect("Prometheus text")
}

/// The sum of the samples of `metric` with all of `labels` (a histogram
/// counts its observations).
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> f64 {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .map(|s| match &s.value {
            Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => *v,
            Value::Histogram(buckets) => buckets.last().map_or(0.0, |b| b.count),
            Value::Summary(_) => 0.0,
        })
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_the_traffic_just_generated() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let broker = Process::start(dir.path(), free_port(), &["--metrics-listen", &listen]);
    let base = format!("http://{listen}");
    wait_for_status(&format!("{base}/readyz"), 200).await;
    assert_eq!(
        get(&format!("{base}/healthz")).await.map(|(s, _)| s),
        Some(200)
    );

    let bootstrap = broker.bootstrap();
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .create()
        .unwrap();
    let topic = NewTopic::new("metered", 1, TopicReplication::Fixed(1));
    let created = admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    // Again: TOPIC_ALREADY_EXISTS, an error code the metrics count.
    let again = admin
        .create_topics([&topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(again[0].is_err(), "{again:?}");

    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("acks", "all")
        .set("linger.ms", "0")
        .create()
        .unwrap();
    let payload = [7u8; 100];
    for i in 0..100 {
        let key = i.to_string();
        producer
            .send(
                FutureRecord::to("metered").key(&key).payload(&payload[..]),
                TIMEOUT,
            )
            .await
            .unwrap();
    }

    // A group reads everything and commits offset 60 of the 100: lag 40.
    let consumed = tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", &bootstrap)
            .set("group.id", "metered-readers")
            .set("enable.auto.commit", "false")
            .set("auto.offset.reset", "earliest")
            .create()
            .unwrap();
        consumer.subscribe(&["metered"]).unwrap();
        let deadline = Instant::now() + TIMEOUT;
        let mut count = 0;
        while count < 100 {
            assert!(Instant::now() < deadline, "consumed only {count}");
            if let Some(m) = consumer.poll(Duration::from_millis(100)) {
                m.unwrap();
                count += 1;
            }
        }
        let mut at = TopicPartitionList::new();
        at.add_partition_offset("metered", 0, Offset::Offset(60))
            .unwrap();
        consumer.commit(&at, CommitMode::Sync).unwrap();
        count
    })
    .await
    .unwrap();
    assert_eq!(consumed, 100);

    let m = scrape(metrics_port).await;
    assert!(value(&m, "strata_requests_total", &[("api", "Produce")]) >= 1.0);
    assert!(value(&m, "strata_requests_total", &[("api", "Fetch")]) >= 1.0);
    assert!(value(&m, "strata_requests_total", &[("api", "OffsetCommit")]) >= 1.0);
    assert!(value(&m, "strata_request_latency_seconds", &[("api", "Produce")]) >= 1.0);
    assert_eq!(
        value(
            &m,
            "strata_request_errors_total",
            &[("api", "CreateTopics"), ("error", "TOPIC_ALREADY_EXISTS")]
        ),
        1.0
    );
    let topic = [("topic", "metered")];
    assert_eq!(value(&m, "strata_topic_records_in_total", &topic), 100.0);
    // Each record carries its 100-byte value, inside batch framing.
    assert!(value(&m, "strata_topic_bytes_in_total", &topic) > 100.0 * 100.0);
    assert!(value(&m, "strata_topic_records_out_total", &topic) >= 100.0);
    assert!(value(&m, "strata_topic_bytes_out_total", &topic) > 100.0 * 100.0);
    assert_eq!(
        value(
            &m,
            "strata_consumer_group_lag",
            &[
                ("group", "metered-readers"),
                ("topic", "metered"),
                ("partition", "0")
            ]
        ),
        40.0
    );
    // acks=all under the default --fsync always: fsynced before each answer.
    assert!(value(&m, "strata_log_fsync_latency_seconds", &[]) >= 1.0);
    // The cluster id, at least, was written to the store at start-up.
    assert!(value(&m, "strata_store_requests_total", &[("operation", "put")]) >= 1.0);
    assert!(value(&m, "strata_connections_accepted_total", &[]) >= 3.0);
    // Every metric the README lists is there (write amplification only once
    // something was uploaded).
    for name in [
        "strata_request_latency_seconds",
        "strata_connections_open",
        "strata_tier_upload_backlog_bytes",
        "strata_tier_upload_backlog_segments",
        "strata_tier_upload_latency_seconds",
        "strata_tier_segments_uploaded_total",
        "strata_tier_bytes_uploaded_total",
        "strata_tier_upload_failures_total",
        "strata_store_request_errors_total",
        "strata_store_request_latency_seconds",
        "strata_store_put_bytes_total",
        "strata_cache_hits_total",
        "strata_cache_misses_total",
        "strata_cache_hit_ratio",
        "strata_compaction_jobs_outstanding",
        "strata_compaction_merges_total",
        "strata_compaction_input_bytes_total",
        "strata_compaction_output_bytes_total",
    ] {
        assert!(m.docs.contains_key(name), "{name} missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_start_up_and_follows_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let metrics_port = free_port();
    let listen = format!("127.0.0.1:{metrics_port}");
    let base = format!("http://{listen}");
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    // Start-up reads the store (to restore a wiped data directory): stalled
    // there, the broker is alive but not ready.
    store.set(Fault::Stall);
    let config = common::config(dir.path(), &["--metrics-listen", &listen]);
    let starting = Server::start_with_store(config, Some(store.clone()));
    let meanwhile = async {
        wait_for_status(&format!("{base}/healthz"), 200).await;
        let body = wait_for_status(&format!("{base}/readyz"), 503).await;
        assert!(body.contains("starting"), "{body}");
        store.set(Fault::None);
    };
    let (server, ()) = tokio::join!(starting, meanwhile);
    let server = server.unwrap();
    wait_for_status(&format!("{base}/readyz"), 200).await;

    store.set(Fault::Fail);
    let body = wait_for_status(&format!("{base}/readyz"), 503).await;
    assert!(body.contains("object store"), "{body}");
    assert_eq!(
        get(&format!("{base}/healthz")).await.map(|(s, _)| s),
        Some(200)
    );
    store.set(Fault::None);
    wait_for_status(&format!("{base}/readyz"), 200).await;
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_in_a_cluster_follows_the_etcd_lease() {
    let metrics_port = free_port();
    let settings = common::cluster::Settings {
        extra: vec![
            "--metrics-listen".into(),
            format!("127.0.0.1:{metrics_port}"),
        ],
        ..Default::default()
    };
    let Some(mut cluster) = common::cluster::Cluster::start_with(&[1], settings).await else {
        return;
    };
    let readyz = format!("http://127.0.0.1:{metrics_port}/readyz");
    wait_for_status(&readyz, 200).await;
    // Without etcd the lease lapses and the broker serves nothing.
    cluster.stop_etcd();
    let body = wait_for_status(&readyz, 503).await;
    assert!(body.contains("lease"), "{body}");
    cluster.start_etcd().await;
    wait_for_status(&readyz, 200).await;
}
