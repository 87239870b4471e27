//! What consumers may see: in cluster mode only records that are in the
//! object store, so that no failover can rewrite a record once read.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::etcd::EtcdServer;
use object_store::memory::InMemory;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Message, Offset, TopicPartitionList};
use strata::manifest::fault::{Fault, FaultyStore};
use strata::server::Server;

const TOPIC: &str = "visible";

fn producer(bootstrap: &str, acks: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", acks)
        .set("linger.ms", "0")
        .create()
        .unwrap()
}

async fn send(p: &FutureProducer, value: &str) -> i64 {
    let record = FutureRecord::<(), _>::to(TOPIC).partition(0).payload(value);
    p.send(record, Duration::from_secs(30))
        .await
        .unwrap()
        .offset
}

/// Polls for `wait`; returns the (offset, value) pairs read.
fn poll_for(c: &BaseConsumer, wait: Duration) -> Vec<(i64, String)> {
    let mut got = Vec::new();
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
            let value = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            got.push((m.offset(), value));
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_record_not_yet_in_the_store_is_never_served() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    etcd.ready().await;
    let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
    let dir = tempfile::tempdir().unwrap();
    let url = format!("etcd://127.0.0.1:{}/visibility", etcd.client_port);
    let config = common::config(
        dir.path(),
        &["--node-id", "1", "--cluster", &url, "--wal-flush-ms", "10"],
    );
    let server = Server::start_with_store(config, Some(store.clone()))
        .await
        .unwrap();
    let bootstrap = server.local_addr().to_string();
    common::cluster::create_topic(&bootstrap, TOPIC, 1, &[]).await;
    common::cluster::wait_for_leaders(&bootstrap, TOPIC, 1, |_| true).await;
    assert_eq!(send(&producer(&bootstrap, "all"), "durable").await, 0);

    // The store stops answering: an acks=1 write is appended and answered,
    // but its write-ahead log object cannot land.
    store.set(Fault::Stall);
    assert_eq!(send(&producer(&bootstrap, "1"), "pending").await, 1);

    let (got, high) = tokio::task::spawn_blocking({
        let bootstrap = bootstrap.clone();
        move || {
            let c = common::cluster::metadata_consumer(&bootstrap);
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(TOPIC, 0, Offset::Beginning)
                .unwrap();
            c.assign(&tpl).unwrap();
            let got = poll_for(&c, Duration::from_secs(2));
            let (_, high) = c
                .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
                .unwrap();
            store.set(Fault::None);
            let mut later = Vec::new();
            let deadline = Instant::now() + Duration::from_secs(30);
            while later.is_empty() && Instant::now() < deadline {
                later = poll_for(&c, Duration::from_millis(200));
            }
            ((got, later), high)
        }
    })
    .await
    .unwrap();
    let (before, after) = got;
    assert_eq!(before, vec![(0, "durable".to_string())]);
    assert_eq!(high, 1, "the high watermark stops at the durable end");
    assert_eq!(
        after,
        vec![(1, "pending".to_string())],
        "served once its object is in the store"
    );
}
