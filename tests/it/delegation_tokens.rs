//! Delegation tokens (KIP-48) through the raw protocol: who may ask for
//! them, Kafka's error codes for each refusal, the lifetimes, SCRAM with
//! `tokenauth=true` acting as the owner, removal of expired tokens, tokens
//! surviving a restart and, in a cluster, counting on every broker. The
//! Java AdminClient and a producer/consumer on a token are in
//! integration/security.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::scram::{authenticate, token_password};
use common::{InProcess, Raw};
use kafka_protocol::messages::create_delegation_token_request::CreatableRenewers;
use kafka_protocol::messages::describe_delegation_token_request::DescribeDelegationTokenOwner;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const AUTH_DISABLED: i16 = 61;
const NOT_FOUND: i16 = 62;
const OWNER_MISMATCH: i16 = 63;
const REQUEST_NOT_ALLOWED: i16 = 64;
const AUTHORIZATION_FAILED: i16 = 65;
const EXPIRED: i16 = 66;
const INVALID_PRINCIPAL_TYPE: i16 = 67;
const SASL_FAILED: i16 = 58;

const HOUR: i64 = 3_600_000;

fn users() -> Vec<&'static str> {
    vec![
        "--listener",
        "PLAINTEXT://127.0.0.1:0",
        "--listener",
        "SASL_PLAINTEXT://127.0.0.1:0",
        "--add-scram",
        "SCRAM-SHA-256=[name=alice,password=alice-secret]",
        "--add-scram",
        "SCRAM-SHA-512=[name=bob,password=bob-secret]",
        "--add-scram",
        "SCRAM-SHA-512=[name=eve,password=eve-secret]",
        "--connection-failed-authentication-delay-ms",
        "10",
    ]
}

async fn broker(extra: &[&str]) -> InProcess {
    let mut args = users();
    args.extend_from_slice(extra);
    InProcess::start(&args).await
}

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// A SASL connection authenticated as `user` (password `<user>-secret`).
async fn as_user(b: &InProcess, user: &str) -> Raw {
    let addr = b.server.listener_addr("SASL_PLAINTEXT").unwrap();
    let mut raw = Raw::connect(addr).await;
    let mechanism = if user == "alice" {
        "SCRAM-SHA-256"
    } else {
        "SCRAM-SHA-512"
    };
    let done = authenticate(&mut raw, mechanism, user, &format!("{user}-secret"), "").await;
    assert_eq!(done.error_code, 0, "{user} authenticates");
    raw
}

fn user(name: &str) -> CreatableRenewers {
    CreatableRenewers::default()
        .with_principal_type(text("User"))
        .with_principal_name(text(name))
}

async fn create(raw: &mut Raw, req: CreateDelegationTokenRequest) -> CreateDelegationTokenResponse {
    raw.call(ApiKey::CreateDelegationToken, 3, &req).await
}

async fn renew(raw: &mut Raw, hmac: &Bytes, period: i64) -> RenewDelegationTokenResponse {
    let req = RenewDelegationTokenRequest::default()
        .with_hmac(hmac.clone())
        .with_renew_period_ms(period);
    raw.call(ApiKey::RenewDelegationToken, 2, &req).await
}

async fn expire(raw: &mut Raw, hmac: &Bytes, period: i64) -> ExpireDelegationTokenResponse {
    let req = ExpireDelegationTokenRequest::default()
        .with_hmac(hmac.clone())
        .with_expiry_time_period_ms(period);
    raw.call(ApiKey::ExpireDelegationToken, 2, &req).await
}

async fn describe(raw: &mut Raw, owners: Option<&[&str]>) -> DescribeDelegationTokenResponse {
    let owners = owners.map(|o| {
        o.iter()
            .map(|n| {
                DescribeDelegationTokenOwner::default()
                    .with_principal_type(text("User"))
                    .with_principal_name(text(n))
            })
            .collect()
    });
    let req = DescribeDelegationTokenRequest::default().with_owners(owners);
    raw.call(ApiKey::DescribeDelegationToken, 3, &req).await
}

/// A connection authenticated with the token `id` / `hmac`; the last
/// SaslAuthenticate answer.
async fn with_token(addr: std::net::SocketAddr, id: &str, hmac: &[u8]) -> (Raw, i16) {
    let mut raw = Raw::connect(addr).await;
    let done = authenticate(
        &mut raw,
        "SCRAM-SHA-512",
        id,
        &token_password(hmac),
        "tokenauth=true",
    )
    .await;
    (raw, done.error_code)
}

#[tokio::test]
async fn token_requests_are_refused_on_plaintext_and_disabled_without_a_secret_key() {
    let disabled = broker(&[]).await;
    let mut alice = as_user(&disabled, "alice").await;
    let made = create(&mut alice, CreateDelegationTokenRequest::default()).await;
    assert_eq!(made.error_code, AUTH_DISABLED);
    assert_eq!(made.principal_name.as_str(), "alice");
    assert_eq!(
        renew(&mut alice, &Bytes::from_static(b"x"), 1)
            .await
            .error_code,
        AUTH_DISABLED
    );
    assert_eq!(
        expire(&mut alice, &Bytes::from_static(b"x"), 1)
            .await
            .error_code,
        AUTH_DISABLED
    );
    assert_eq!(describe(&mut alice, None).await.error_code, AUTH_DISABLED);
    // Advertised in ApiVersions, with Kafka 4.4's versions.
    let versions: ApiVersionsResponse = alice
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    let range = |k: ApiKey| {
        versions
            .api_keys
            .iter()
            .find(|a| a.api_key == k as i16)
            .map(|a| (a.min_version, a.max_version))
    };
    assert_eq!(range(ApiKey::CreateDelegationToken), Some((1, 3)));
    assert_eq!(range(ApiKey::RenewDelegationToken), Some((1, 2)));
    assert_eq!(range(ApiKey::ExpireDelegationToken), Some((1, 2)));
    assert_eq!(range(ApiKey::DescribeDelegationToken), Some((1, 3)));

    let enabled = broker(&["--delegation-token-secret-key", "k"]).await;
    let mut plain = Raw::connect(enabled.addr()).await;
    let made = create(&mut plain, CreateDelegationTokenRequest::default()).await;
    assert_eq!(made.error_code, REQUEST_NOT_ALLOWED);
    assert_eq!(made.principal_name.as_str(), "ANONYMOUS");
    assert_eq!(
        describe(&mut plain, None).await.error_code,
        REQUEST_NOT_ALLOWED
    );
    assert_eq!(
        renew(&mut plain, &Bytes::from_static(b"x"), 1)
            .await
            .error_code,
        REQUEST_NOT_ALLOWED
    );
}

#[tokio::test]
async fn a_token_authenticates_as_its_owner_and_follows_kafkas_renewal_rules() {
    let b = broker(&[
        "--delegation-token-secret-key",
        "the-secret",
        "--delegation-token-max-lifetime-ms",
        "7200000",
    ])
    .await;
    let sasl = b.server.listener_addr("SASL_PLAINTEXT").unwrap();
    let mut alice = as_user(&b, "alice").await;
    let made = create(
        &mut alice,
        CreateDelegationTokenRequest::default()
            .with_renewers(vec![user("bob")])
            .with_max_lifetime_ms(10 * HOUR),
    )
    .await;
    assert_eq!(made.error_code, 0);
    assert_eq!(
        (made.principal_type.as_str(), made.principal_name.as_str()),
        ("User", "alice")
    );
    assert_eq!(made.token_requester_principal_name.as_str(), "alice");
    // The broker's max lifetime (2 h) caps the request's (10 h), and the
    // expiry (24 h by default) is capped by it.
    assert_eq!(made.max_timestamp_ms - made.issue_timestamp_ms, 2 * HOUR);
    assert_eq!(made.expiry_timestamp_ms, made.max_timestamp_ms);
    assert_eq!(made.hmac.len(), 64);
    let (id, hmac) = (made.token_id.to_string(), made.hmac.clone());

    // SCRAM with tokenauth=true: the session is alice's, and it may not
    // ask for tokens itself.
    let (mut by_token, code) = with_token(sasl, &id, &hmac).await;
    assert_eq!(code, 0);
    let again = create(&mut by_token, CreateDelegationTokenRequest::default()).await;
    assert_eq!(again.error_code, REQUEST_NOT_ALLOWED);
    assert_eq!(again.token_requester_principal_name.as_str(), "alice");
    assert_eq!(
        describe(&mut by_token, None).await.error_code,
        REQUEST_NOT_ALLOWED
    );
    // Without the extension the token id is no user; a wrong HMAC fails.
    let mut raw = Raw::connect(sasl).await;
    let plain = authenticate(&mut raw, "SCRAM-SHA-512", &id, &token_password(&hmac), "").await;
    assert_eq!(plain.error_code, SASL_FAILED);
    let (_, code) = with_token(sasl, &id, b"not the hmac").await;
    assert_eq!(code, SASL_FAILED);

    // Renewal: the renewer may, capped by the max timestamp; others not.
    let mut bob = as_user(&b, "bob").await;
    let mut eve = as_user(&b, "eve").await;
    let renewed = renew(&mut bob, &hmac, HOUR).await;
    assert_eq!(renewed.error_code, 0);
    assert!(renewed.expiry_timestamp_ms <= made.max_timestamp_ms);
    assert!(renewed.expiry_timestamp_ms >= made.issue_timestamp_ms + HOUR);
    assert_eq!(
        renew(&mut eve, &hmac, HOUR).await.error_code,
        OWNER_MISMATCH
    );
    assert_eq!(expire(&mut eve, &hmac, -1).await.error_code, OWNER_MISMATCH);
    let garbage = Bytes::from(vec![0xAB; 64]);
    assert_eq!(
        renew(&mut alice, &garbage, HOUR).await.error_code,
        NOT_FOUND
    );
    assert_eq!(
        renew(&mut alice, &Bytes::new(), HOUR).await.error_code,
        NOT_FOUND
    );

    // Describe: alice (owner) and bob (renewer) see it with its HMAC; so
    // does eve, since without an authorizer every DESCRIBE is allowed (as in
    // Kafka; the ACL test below shows her shut out).
    let seen = describe(&mut alice, None).await;
    assert_eq!(seen.error_code, 0);
    assert_eq!(seen.tokens.len(), 1);
    let t = &seen.tokens[0];
    assert_eq!((t.token_id.as_str(), &t.hmac), (id.as_str(), &hmac));
    assert_eq!(t.renewers.len(), 1);
    assert_eq!(t.renewers[0].principal_name.as_str(), "bob");
    assert_eq!(t.expiry_timestamp, renewed.expiry_timestamp_ms);
    assert_eq!(describe(&mut bob, None).await.tokens.len(), 1);
    assert_eq!(describe(&mut eve, None).await.tokens.len(), 1);
    assert_eq!(describe(&mut alice, Some(&["bob"])).await.tokens.len(), 1);
    assert!(describe(&mut alice, Some(&["eve"])).await.tokens.is_empty());
    assert!(describe(&mut alice, Some(&[])).await.tokens.is_empty());

    // Expire with a positive period shortens it; a negative one ends it.
    let shortened = expire(&mut alice, &hmac, 60_000).await;
    assert_eq!(shortened.error_code, 0);
    assert!(shortened.expiry_timestamp_ms < renewed.expiry_timestamp_ms);
    let ended = expire(&mut bob, &hmac, -1).await;
    assert_eq!((ended.error_code, ended.expiry_timestamp_ms), (0, -1));
    assert_eq!(renew(&mut alice, &hmac, HOUR).await.error_code, NOT_FOUND);
    assert!(describe(&mut alice, None).await.tokens.is_empty());
    let (_, code) = with_token(sasl, &id, &hmac).await;
    assert_eq!(code, SASL_FAILED, "an expired token authenticates no more");
}

#[tokio::test]
async fn tokens_for_other_owners_need_create_tokens_on_the_user_and_renewers_must_be_users() {
    let b = broker(&[
        "--delegation-token-secret-key",
        "k",
        "--authorizer",
        "acl",
        "--super-users",
        "User:bob",
    ])
    .await;
    let mut alice = as_user(&b, "alice").await;
    let mut bob = as_user(&b, "bob").await;
    let for_carol = CreateDelegationTokenRequest::default()
        .with_owner_principal_type(Some(text("User")))
        .with_owner_principal_name(Some(text("carol")));
    let refused = create(&mut alice, for_carol.clone()).await;
    assert_eq!(refused.error_code, AUTHORIZATION_FAILED);
    assert_eq!(refused.principal_name.as_str(), "carol");
    let granted = create(&mut bob, for_carol).await;
    assert_eq!(granted.error_code, 0);
    assert_eq!(granted.principal_name.as_str(), "carol");
    assert_eq!(granted.token_requester_principal_name.as_str(), "bob");
    // The token authenticates as carol.
    let sasl = b.server.listener_addr("SASL_PLAINTEXT").unwrap();
    let (_, code) = with_token(sasl, &granted.token_id, &granted.hmac).await;
    assert_eq!(code, 0);
    // Renewers that are not users.
    let group =
        CreateDelegationTokenRequest::default().with_renewers(vec![CreatableRenewers::default()
            .with_principal_type(text("Group"))
            .with_principal_name(text("ops"))]);
    assert_eq!(
        create(&mut alice, group).await.error_code,
        INVALID_PRINCIPAL_TYPE
    );
    // bob requested carol's token: he sees it in Describe; alice does not
    // until she may DESCRIBE_TOKENS of User:carol.
    assert_eq!(describe(&mut bob, None).await.tokens.len(), 1);
    assert!(describe(&mut alice, None).await.tokens.is_empty());
    let acl = CreateAclsRequest::default().with_creations(vec![
        create_acls_request::AclCreation::default()
            .with_resource_type(7) // USER
            .with_resource_name(text("User:carol"))
            .with_resource_pattern_type(3) // LITERAL
            .with_principal(text("User:alice"))
            .with_host(text("*"))
            .with_operation(14) // DESCRIBE_TOKENS
            .with_permission_type(3), // ALLOW
    ]);
    let made: CreateAclsResponse = bob.call(ApiKey::CreateAcls, 3, &acl).await;
    assert_eq!(made.results[0].error_code, 0);
    let seen = describe(&mut alice, None).await;
    assert_eq!(seen.tokens.len(), 1);
    assert_eq!(seen.tokens[0].principal_name.as_str(), "carol");
    // Renewing is for the owner and renewers, ACLs or not.
    assert_eq!(
        renew(&mut alice, &granted.hmac, HOUR).await.error_code,
        OWNER_MISMATCH
    );
}

#[tokio::test]
async fn expired_tokens_are_refused_and_removed_by_the_periodic_check() {
    // The periodic check runs hourly here: the expired token stays.
    let kept = broker(&[
        "--delegation-token-secret-key",
        "k",
        "--delegation-token-expiry-time-ms",
        "300",
    ])
    .await;
    let mut alice = as_user(&kept, "alice").await;
    let made = create(&mut alice, CreateDelegationTokenRequest::default()).await;
    assert_eq!(made.error_code, 0);
    assert_eq!(made.expiry_timestamp_ms - made.issue_timestamp_ms, 300);
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        renew(&mut alice, &made.hmac, HOUR).await.error_code,
        EXPIRED
    );
    assert_eq!(expire(&mut alice, &made.hmac, -1).await.error_code, EXPIRED);
    let sasl = kept.server.listener_addr("SASL_PLAINTEXT").unwrap();
    let (_, code) = with_token(sasl, &made.token_id, &made.hmac).await;
    assert_eq!(code, SASL_FAILED, "an expired token does not authenticate");
    assert_eq!(describe(&mut alice, None).await.tokens.len(), 1);

    // Checked every 100 ms: gone soon after it expires.
    let swept = broker(&[
        "--delegation-token-secret-key",
        "k",
        "--delegation-token-expiry-time-ms",
        "300",
        "--delegation-token-expiry-check-interval-ms",
        "100",
    ])
    .await;
    let mut alice = as_user(&swept, "alice").await;
    let made = create(&mut alice, CreateDelegationTokenRequest::default()).await;
    assert_eq!(made.error_code, 0);
    // A renewal asking for more than the expiry time gets the expiry time.
    let renewed = renew(&mut alice, &made.hmac, HOUR).await;
    assert_eq!(renewed.error_code, 0);
    assert!(renewed.expiry_timestamp_ms - made.issue_timestamp_ms < 10_000);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !describe(&mut alice, None).await.tokens.is_empty() {
        assert!(std::time::Instant::now() < deadline, "token not removed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        renew(&mut alice, &made.hmac, HOUR).await.error_code,
        NOT_FOUND
    );
}

#[tokio::test]
async fn tokens_survive_a_restart_and_hostile_requests_change_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut args = users();
    args.extend(["--delegation-token-secret-key", "k"]);
    let server = strata::server::Server::start(common::config(dir.path(), &args))
        .await
        .unwrap();
    let sasl = server.listener_addr("SASL_PLAINTEXT").unwrap();
    let mut raw = Raw::connect(sasl).await;
    assert_eq!(
        authenticate(&mut raw, "SCRAM-SHA-256", "alice", "alice-secret", "")
            .await
            .error_code,
        0
    );
    let made = create(
        &mut raw,
        CreateDelegationTokenRequest::default().with_max_lifetime_ms(i64::MIN),
    )
    .await;
    assert_eq!(made.error_code, 0);
    assert_eq!(
        made.max_timestamp_ms - made.issue_timestamp_ms,
        7 * 24 * HOUR
    );
    // Hostile values: huge periods, an owner name with no type, many renewers.
    assert_eq!(renew(&mut raw, &made.hmac, i64::MAX).await.error_code, 0);
    let many = create(
        &mut raw,
        CreateDelegationTokenRequest::default()
            .with_renewers((0..1000).map(|i| user(&format!("u{i}"))).collect())
            .with_max_lifetime_ms(i64::MAX),
    )
    .await;
    assert_eq!(many.error_code, 0);
    assert_eq!(
        many.max_timestamp_ms - many.issue_timestamp_ms,
        7 * 24 * HOUR
    );
    let untyped = create(
        &mut raw,
        CreateDelegationTokenRequest::default()
            .with_owner_principal_name(Some(text("carol")))
            .with_owner_principal_type(None),
    )
    .await;
    assert_eq!(untyped.error_code, INVALID_PRINCIPAL_TYPE);
    assert_eq!(describe(&mut raw, None).await.tokens.len(), 2);
    assert_eq!(expire(&mut raw, &made.hmac, i64::MAX).await.error_code, 0);
    drop(raw);
    server.shutdown().await.unwrap();

    let server = strata::server::Server::start(common::config(dir.path(), &args))
        .await
        .unwrap();
    let sasl = server.listener_addr("SASL_PLAINTEXT").unwrap();
    let (mut by_token, code) = with_token(sasl, &made.token_id, &made.hmac).await;
    assert_eq!(code, 0, "the token outlives the restart");
    let md: MetadataResponse = by_token
        .call(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await;
    assert_eq!(md.brokers.len(), 1);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_token_made_through_one_broker_counts_on_every_broker() {
    let settings = common::cluster::Settings {
        protocol: Some("SASL_PLAINTEXT"),
        extra: [
            "--add-scram",
            "SCRAM-SHA-512=[name=alice,password=alice-secret]",
            "--sasl-mechanism-inter-broker-protocol",
            "SCRAM-SHA-512",
            "--inter-broker-sasl-username",
            "broker",
            "--inter-broker-sasl-password",
            "broker-secret",
            "--delegation-token-secret-key",
            "cluster-secret",
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    };
    let Some(cluster) = common::cluster::Cluster::start_with(&[1, 2], settings).await else {
        eprintln!("etcd not installed; skipping");
        return;
    };
    let addr = |node| -> std::net::SocketAddr { cluster.bootstrap_of(node).parse().unwrap() };
    let mut alice = Raw::connect(addr(1)).await;
    let ok = authenticate(&mut alice, "SCRAM-SHA-512", "alice", "alice-secret", "").await;
    assert_eq!(ok.error_code, 0);
    let made = create(&mut alice, CreateDelegationTokenRequest::default()).await;
    assert_eq!(made.error_code, 0);
    let (_, code) = with_token(addr(2), &made.token_id, &made.hmac).await;
    assert_eq!(code, 0, "broker 2 accepts broker 1's token");
    let mut alice2 = Raw::connect(addr(2)).await;
    let ok = authenticate(&mut alice2, "SCRAM-SHA-512", "alice", "alice-secret", "").await;
    assert_eq!(ok.error_code, 0);
    assert_eq!(describe(&mut alice2, None).await.tokens.len(), 1);
    assert_eq!(expire(&mut alice2, &made.hmac, -1).await.error_code, 0);
    let (_, code) = with_token(addr(1), &made.token_id, &made.hmac).await;
    assert_eq!(
        code, SASL_FAILED,
        "expired through broker 2, refused by broker 1"
    );
}
