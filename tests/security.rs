//! Listeners and SASL through librdkafka (PLAIN here; SCRAM and TLS through
//! it in inter_broker.rs, and with kcat, confluent-kafka and the Java client
//! in integration/security) and the raw protocol: what is
//! answered before authentication, failure delay, KIP-368 session lifetime,
//! and the errors of Alter/DescribeUserScramCredentials.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{InProcess, Raw};
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Message;

const SASL_FAILED: i16 = 58;

async fn broker(extra: &[&str]) -> InProcess {
    let mut args = vec![
        "--listener",
        "PLAINTEXT://127.0.0.1:0",
        "--listener",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--add-scram",
        "SCRAM-SHA-256=[name=alice,password=alice-secret]",
        "--connection-failed-authentication-delay-ms",
        "300",
    ];
    args.extend_from_slice(extra);
    InProcess::start(&args).await
}

fn sasl_addr(b: &InProcess) -> std::net::SocketAddr {
    b.server.listener_addr("SASL_PLAINTEXT").unwrap()
}

fn plain_client(b: &InProcess, password: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", sasl_addr(b).to_string())
        .set("security.protocol", "SASL_PLAINTEXT")
        .set("sasl.mechanisms", "PLAIN")
        .set("sasl.username", "alice")
        .set("sasl.password", password)
        .set("message.timeout.ms", "10000");
    c
}

async fn authenticate_plain(raw: &mut Raw, user: &str, password: &str) -> SaslAuthenticateResponse {
    let hs: SaslHandshakeResponse = raw
        .call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        )
        .await;
    assert_eq!(hs.error_code, 0);
    assert!(hs.mechanisms.iter().any(|m| m.as_str() == "SCRAM-SHA-512"));
    let token = format!("\0{user}\0{password}");
    raw.call(
        ApiKey::SaslAuthenticate,
        2,
        &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
    )
    .await
}

async fn metadata(raw: &mut Raw) -> Option<MetadataResponse> {
    raw.send(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await;
    raw.receive(ApiKey::Metadata, 12).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_round_trip_over_sasl_plain_with_metadata_of_that_listener() {
    let b = broker(&[]).await;
    let producer: FutureProducer = plain_client(&b, "alice-secret").create().unwrap();
    for i in 0..10 {
        let value = format!("v{i}");
        producer
            .send(
                FutureRecord::<(), _>::to("secure").payload(&value),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let consumer: BaseConsumer = plain_client(&b, "alice-secret")
        .set("group.id", "g")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    let md = consumer
        .fetch_metadata(None, Duration::from_secs(10))
        .unwrap();
    // The broker is named at the SASL listener's port, not the PLAINTEXT one.
    assert_eq!(md.brokers()[0].port() as u16, sasl_addr(&b).port());
    consumer.subscribe(&["secure"]).unwrap();
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < 10 && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(200)) {
            got.push(String::from_utf8(m.unwrap().payload().unwrap().to_vec()).unwrap());
        }
    }
    assert_eq!(got, (0..10).map(|i| format!("v{i}")).collect::<Vec<_>>());

    let mut raw = Raw::connect(b.server.listener_addr("PLAINTEXT").unwrap()).await;
    let md = metadata(&mut raw).await.unwrap();
    assert_eq!(
        md.brokers[0].port as u16,
        b.server.listener_addr("PLAINTEXT").unwrap().port()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_with_a_wrong_password_is_refused() {
    let b = broker(&[]).await;
    let consumer: BaseConsumer = plain_client(&b, "wrong").create().unwrap();
    let err = consumer
        .fetch_metadata(None, Duration::from_secs(5))
        .expect_err("metadata with a wrong password");
    assert!(
        err.to_string().contains("Authentication") || err.to_string().contains("Transport"),
        "{err}"
    );
}

#[tokio::test]
async fn only_api_versions_and_sasl_are_answered_before_authentication() {
    let b = broker(&[]).await;
    let mut raw = Raw::connect(sasl_addr(&b)).await;
    let versions: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    for key in [
        ApiKey::SaslHandshake,
        ApiKey::SaslAuthenticate,
        ApiKey::AlterUserScramCredentials,
    ] {
        assert!(
            versions.api_keys.iter().any(|k| k.api_key == key as i16),
            "{key:?}"
        );
    }
    assert!(
        metadata(&mut raw).await.is_none(),
        "Metadata answered before authentication"
    );
    assert!(raw.is_closed().await);

    // A SASL API on a PLAINTEXT listener: ILLEGAL_SASL_STATE, as Kafka.
    let mut raw = Raw::connect(b.server.listener_addr("PLAINTEXT").unwrap()).await;
    let hs: SaslHandshakeResponse = raw
        .call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("PLAIN")),
        )
        .await;
    assert_eq!(hs.error_code, 34);
}

#[tokio::test]
async fn failed_authentication_is_delayed_then_the_connection_closed() {
    let b = broker(&[]).await;
    let mut raw = Raw::connect(sasl_addr(&b)).await;
    let t0 = Instant::now();
    let resp = authenticate_plain(&mut raw, "alice", "wrong").await;
    assert_eq!(resp.error_code, SASL_FAILED);
    assert!(
        t0.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t0.elapsed()
    );
    assert!(raw.is_closed().await);
    // An unknown user fails the same way.
    let mut raw = Raw::connect(sasl_addr(&b)).await;
    assert_eq!(
        authenticate_plain(&mut raw, "nobody", "x").await.error_code,
        SASL_FAILED
    );
    // An unsupported mechanism: UNSUPPORTED_SASL_MECHANISM and closed.
    let mut raw = Raw::connect(sasl_addr(&b)).await;
    let hs: SaslHandshakeResponse = raw
        .call(
            ApiKey::SaslHandshake,
            1,
            &SaslHandshakeRequest::default().with_mechanism(StrBytes::from_static_str("GSSAPI")),
        )
        .await;
    assert_eq!(hs.error_code, 33);
    assert!(raw.is_closed().await);
}

#[tokio::test]
async fn sessions_expire_unless_reauthenticated_as_the_same_user() {
    let b = broker(&[
        "--connections-max-reauth-ms",
        "1000",
        "--add-scram",
        "SCRAM-SHA-512=[name=bob,password=bob-secret]",
    ])
    .await;
    let mut raw = Raw::connect(sasl_addr(&b)).await;
    let auth = authenticate_plain(&mut raw, "alice", "alice-secret").await;
    assert_eq!((auth.error_code, auth.session_lifetime_ms), (0, 1000));
    assert!(metadata(&mut raw).await.is_some());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // KIP-368: a new handshake on the same connection renews the session.
    assert_eq!(
        authenticate_plain(&mut raw, "alice", "alice-secret")
            .await
            .error_code,
        0
    );
    assert!(metadata(&mut raw).await.is_some());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(
        metadata(&mut raw).await.is_none(),
        "answered after the session expired"
    );

    // Re-authenticating as someone else is refused.
    let mut raw = Raw::connect(sasl_addr(&b)).await;
    assert_eq!(
        authenticate_plain(&mut raw, "alice", "alice-secret")
            .await
            .error_code,
        0
    );
    assert_eq!(
        authenticate_plain(&mut raw, "bob", "bob-secret")
            .await
            .error_code,
        SASL_FAILED
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafka_reauthenticates_within_the_session_lifetime() {
    let b = broker(&["--connections-max-reauth-ms", "700"]).await;
    let producer: FutureProducer = plain_client(&b, "alice-secret").create().unwrap();
    let t0 = Instant::now();
    let mut sent = 0;
    while t0.elapsed() < Duration::from_millis(3000) {
        producer
            .send(
                FutureRecord::<(), _>::to("reauth").payload("x"),
                Duration::from_secs(10),
            )
            .await
            .unwrap_or_else(|(e, _)| panic!("record {sent} failed: {e}"));
        sent += 1;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sent > 20);
}

#[tokio::test]
async fn scram_credential_alterations_follow_kafkas_rules() {
    let b = broker(&[]).await;
    let mut raw = Raw::connect(b.server.listener_addr("PLAINTEXT").unwrap()).await;
    let upsert = |name: &'static str, mechanism: i8, iterations: i32| {
        ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_static_str(name))
            .with_mechanism(mechanism)
            .with_iterations(iterations)
            .with_salt(Bytes::from_static(b"salt"))
            .with_salted_password(Bytes::from_static(&[7; 64]))
    };
    let req = AlterUserScramCredentialsRequest::default()
        .with_upsertions(vec![
            upsert("carol", 2, 4096),
            upsert("dave", 2, 100),
            upsert("erin", 9, 4096),
            upsert("frank", 1, 4096),
            upsert("frank", 1, 8192),
        ])
        .with_deletions(vec![ScramCredentialDeletion::default()
            .with_name(StrBytes::from_static_str("gina"))
            .with_mechanism(1)]);
    let resp: AlterUserScramCredentialsResponse =
        raw.call(ApiKey::AlterUserScramCredentials, 0, &req).await;
    let codes: Vec<(String, i16)> = resp
        .results
        .iter()
        .map(|r| (r.user.to_string(), r.error_code))
        .collect();
    assert_eq!(
        codes,
        [
            ("carol".to_string(), 0),
            ("dave".to_string(), 93),  // UNACCEPTABLE_CREDENTIAL
            ("erin".to_string(), 33),  // UNSUPPORTED_SASL_MECHANISM
            ("frank".to_string(), 92), // DUPLICATE_RESOURCE
            ("gina".to_string(), 91),  // RESOURCE_NOT_FOUND
        ]
    );
    let describe = |names: Option<Vec<&'static str>>| {
        DescribeUserScramCredentialsRequest::default().with_users(names.map(|n| {
            n.into_iter()
                .map(|u| UserName::default().with_name(StrBytes::from_static_str(u)))
                .collect()
        }))
    };
    let resp: DescribeUserScramCredentialsResponse = raw
        .call(ApiKey::DescribeUserScramCredentials, 0, &describe(None))
        .await;
    let users: Vec<(String, Vec<(i8, i32)>)> = resp
        .results
        .iter()
        .map(|r| {
            (
                r.user.to_string(),
                r.credential_infos
                    .iter()
                    .map(|c| (c.mechanism, c.iterations))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        users,
        [
            ("alice".to_string(), vec![(1, 4096)]),
            ("carol".to_string(), vec![(2, 4096)])
        ]
    );
    let resp: DescribeUserScramCredentialsResponse = raw
        .call(
            ApiKey::DescribeUserScramCredentials,
            0,
            &describe(Some(vec!["nobody"])),
        )
        .await;
    assert_eq!(resp.results[0].error_code, 91);
}
