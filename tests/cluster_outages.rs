//! A cluster whose etcd goes away under load. Every broker loses its lease
//! at once, so none may go on acknowledging (none can know it still leads),
//! nothing acknowledged before may be lost, and once etcd is back the
//! cluster must sort itself out without anyone restarting a broker.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::{
    assert_exactly_once, consume_all, create_topic, producer, wait_for_leaders, Cluster, Load,
    LEASE_TTL,
};

const TOPIC: &str = "payments";
const PARTITIONS: i32 = 6;
const OUTAGE: Duration = Duration::from_secs(10);

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_etcd_outage_stops_acknowledgements_loses_nothing_and_heals_by_itself() {
    let Some(mut cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap, TOPIC, PARTITIONS, &[]).await;
    wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;
    let load = Load::start(producer(&bootstrap), TOPIC, PARTITIONS);
    load.progress(300).await;

    cluster.stop_etcd();
    let stopped_at = Instant::now();
    // Within a lease TTL (and a moment for requests already waiting on the
    // store) every broker stops acknowledging; until etcd is back nothing
    // more is acknowledged.
    tokio::time::sleep(LEASE_TTL + Duration::from_millis(1500)).await;
    let acked_without_leases = load.acked();
    tokio::time::sleep(OUTAGE.saturating_sub(stopped_at.elapsed())).await;
    assert_eq!(
        load.acked(),
        acked_without_leases,
        "acknowledged while no broker held a lease"
    );
    assert!(cluster.exited().is_empty(), "{:?}", cluster.exited());

    cluster.start_etcd().await;
    let restarted_at = Instant::now();
    load.progress(300).await;
    let resumed = restarted_at.elapsed();
    wait_for_leaders(&cluster.bootstrap(), TOPIC, PARTITIONS, |_| true).await;
    load.progress(300).await;
    let report = load.finish().await;
    eprintln!(
        "etcd down for {:?}: producing resumed {resumed:?} after it came back; {} acknowledged, longest wait {:?}",
        restarted_at - stopped_at,
        report.acked.len(),
        report.max_latency
    );
    assert!(report.failed.is_empty(), "{:?}", report.failed);
    // Nobody had to restart a broker.
    assert!(cluster.exited().is_empty(), "{:?}", cluster.exited());

    let got = consume_all(&cluster.bootstrap(), TOPIC, PARTITIONS, report.acked.len());
    assert_exactly_once(&report.acked, &got);
    assert_eq!(got.len(), report.acked.len());
    eprintln!("{}", cluster.describe());
}
