//! Connection limits over real sockets: `--max-connections-per-ip` closes the
//! extra connection at accept, `--max-connections` holds newcomers until a
//! slot frees, `--connections-max-idle-ms` closes a silent connection.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use common::{InProcess, Raw};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, ApiVersionsResponse};

async fn api_versions(raw: &mut Raw) -> i16 {
    let resp: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    resp.error_code
}

/// Sends ApiVersions and waits at most `wait` for the answer.
async fn answered_within(raw: &mut Raw, wait: Duration) -> bool {
    raw.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    matches!(
        tokio::time::timeout(wait, raw.read_frame()).await,
        Ok(Some(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_over_the_per_ip_limit_is_closed_at_accept() {
    let broker = InProcess::start(&["--max-connections-per-ip", "2"]).await;
    let mut a = Raw::connect(broker.addr()).await;
    let mut b = Raw::connect(broker.addr()).await;
    assert_eq!(api_versions(&mut a).await, 0);
    assert_eq!(api_versions(&mut b).await, 0);
    let mut c = Raw::connect(broker.addr()).await;
    assert!(
        c.is_closed().await,
        "a third connection from 127.0.0.1 is closed"
    );
    // The first two are unharmed, and a freed slot is usable again.
    assert_eq!(api_versions(&mut a).await, 0);
    drop(b);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut d = Raw::connect(broker.addr()).await;
    assert_eq!(api_versions(&mut d).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_override_of_zero_refuses_the_address_entirely() {
    let broker = InProcess::start(&["--max-connections-per-ip-overrides", "127.0.0.1:0"]).await;
    let mut c = Raw::connect(broker.addr()).await;
    assert!(c.is_closed().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_newcomers_wait_until_a_slot_frees() {
    let broker = InProcess::start(&["--max-connections", "2"]).await;
    let mut a = Raw::connect(broker.addr()).await;
    let mut b = Raw::connect(broker.addr()).await;
    assert_eq!(api_versions(&mut a).await, 0);
    assert_eq!(api_versions(&mut b).await, 0);
    // The kernel completes the handshake (backlog), but the broker does not
    // accept the third until one of the first two leaves.
    let mut c = Raw::connect(broker.addr()).await;
    assert!(!answered_within(&mut c, Duration::from_millis(700)).await);
    drop(a);
    let answered = tokio::time::timeout(Duration::from_secs(5), c.read_frame()).await;
    assert!(
        matches!(answered, Ok(Some(_))),
        "the waiting connection is served once a slot frees"
    );
    assert_eq!(api_versions(&mut b).await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_connection_is_closed_and_a_busy_one_is_not() {
    let broker = InProcess::start(&["--connections-max-idle-ms", "400"]).await;
    let mut idle = Raw::connect(broker.addr()).await;
    let mut busy = Raw::connect(broker.addr()).await;
    assert_eq!(api_versions(&mut idle).await, 0);
    for _ in 0..8 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(api_versions(&mut busy).await, 0);
    }
    assert!(
        idle.is_closed().await,
        "silent for 1.2 s with a 400 ms limit"
    );
    // Half a frame is not activity: a slow-loris client is closed too.
    let mut slow = Raw::connect(broker.addr()).await;
    slow.send_bytes(&[0, 0, 0, 50, 0, 18]).await;
    let closed = tokio::time::timeout(Duration::from_secs(3), slow.is_closed()).await;
    assert_eq!(closed.ok(), Some(true));
}
