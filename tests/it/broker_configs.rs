//! Dynamic broker configs (KIP-226) end to end: set per broker and as the
//! cluster default through librdkafka's admin client and the raw protocol,
//! observed on real sockets (connection limits), described with Kafka's
//! sources and synonyms, kept across a restart, refused with Kafka's codes,
//! and a TLS listener's keystore rotated without a restart.

use crate::common;

use std::time::Duration;

use common::tls::{certs, Certs};
use common::{config_op, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;
use kafka_protocol::messages::*;
use rdkafka::admin::{AdminOptions, AlterConfig, ConfigSource, ResourceSpecifier};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use strata::server::Server;

const BROKER: i8 = 4;
const NODE: i32 = 1;
const SET: i8 = 0;
const DELETE: i8 = 1;
const APPEND: i8 = 2;
const SOURCE_DYNAMIC: i8 = 2;
const SOURCE_DYNAMIC_DEFAULT: i8 = 3;
const SOURCE_STATIC: i8 = 4;
const INVALID_REQUEST: i16 = 42;
const INVALID_CONFIG: i16 = 40;
const TIMEOUT: Duration = Duration::from_secs(20);

async fn describe(raw: &mut Raw, name: &str, keys: &[&str]) -> DescribeConfigsResult {
    raw.describe_configs(BROKER, name, keys).await
}

/// Value, source and synonyms (name, value, source) of one broker config.
type Described = (Option<String>, i8, Vec<(String, Option<String>, i8)>);

async fn described(raw: &mut Raw, name: &str, key: &str) -> Option<Described> {
    let result = describe(raw, name, &[key]).await;
    assert_eq!(result.error_code, 0, "{:?}", result.error_message);
    let c = result
        .configs
        .into_iter()
        .find(|c| c.name.as_str() == key)?;
    let s = |v: Option<kafka_protocol::protocol::StrBytes>| v.map(|v| v.to_string());
    Some((
        s(c.value),
        c.config_source,
        c.synonyms
            .into_iter()
            .map(|y| (y.name.to_string(), s(y.value), y.source))
            .collect(),
    ))
}

/// IncrementalAlterConfigs of BROKER resources: (name, changes).
async fn incremental(
    raw: &mut Raw,
    resources: Vec<(&str, Vec<AlterableConfig>)>,
    validate_only: bool,
) -> Vec<(i16, String)> {
    raw.incremental_alter_configs(BROKER, resources, validate_only)
        .await
}

async fn set(raw: &mut Raw, resource: &str, name: &str, value: &str) {
    let r = incremental(
        raw,
        vec![(resource, vec![config_op(name, SET, Some(value))])],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{name}={value} on {resource:?}: {}", r[0].1);
}

/// Whether the broker still admits a third connection from 127.0.0.1 while
/// `held` are open.
async fn admits_another(broker: &InProcess, held: usize) -> bool {
    let mut open = Vec::new();
    for _ in 0..held {
        let mut raw = Raw::connect(broker.addr()).await;
        let _: ApiVersionsResponse = raw
            .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
            .await;
        open.push(raw);
    }
    let mut extra = Raw::connect(broker.addr()).await;
    !extra.is_closed().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_broker_connection_limit_takes_effect_at_once_and_deleting_it_restores_the_flag() {
    let broker = InProcess::start(&["--max-connections-per-ip", "100"]).await;
    let mut admin = Raw::connect(broker.addr()).await;
    assert!(admits_another(&broker, 2).await);
    set(&mut admin, "1", "max.connections.per.ip", "3").await;
    // The admin connection is one of the three.
    assert!(!admits_another(&broker, 2).await, "the limit of 3 holds");
    let (value, source, synonyms) = described(&mut admin, "1", "max.connections.per.ip")
        .await
        .unwrap();
    assert_eq!(
        (value.as_deref(), source),
        (Some("3"), SOURCE_DYNAMIC),
        "{synonyms:?}"
    );
    let names: Vec<_> = synonyms
        .iter()
        .map(|(_, v, s)| (v.as_deref(), *s))
        .collect();
    assert_eq!(
        names,
        [(Some("3"), SOURCE_DYNAMIC), (Some("100"), SOURCE_STATIC)]
    );
    let r = incremental(
        &mut admin,
        vec![("1", vec![config_op("max.connections.per.ip", DELETE, None)])],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    assert!(admits_another(&broker, 2).await, "the flag's 100 is back");
    let (value, source, _) = described(&mut admin, "1", "max.connections.per.ip")
        .await
        .unwrap();
    assert_eq!((value.as_deref(), source), (Some("100"), SOURCE_STATIC));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_default_applies_under_the_brokers_own_with_synonyms_in_kafkas_order() {
    let broker = InProcess::start(&[]).await;
    let mut admin = Raw::connect(broker.addr()).await;
    set(&mut admin, "", "max.connections.per.ip", "2").await;
    assert!(
        !admits_another(&broker, 1).await,
        "the default of 2 applies"
    );
    set(&mut admin, "1", "max.connections.per.ip", "50").await;
    assert!(admits_another(&broker, 2).await, "the broker's own 50 wins");
    let (value, source, synonyms) = described(&mut admin, "1", "max.connections.per.ip")
        .await
        .unwrap();
    assert_eq!((value.as_deref(), source), (Some("50"), SOURCE_DYNAMIC));
    let sources: Vec<i8> = synonyms.iter().map(|s| s.2).collect();
    assert_eq!(
        sources,
        [SOURCE_DYNAMIC, SOURCE_DYNAMIC_DEFAULT, SOURCE_STATIC]
    );
    // The default resource lists its own configs only.
    let default = describe(&mut admin, "", &[]).await;
    assert_eq!(default.error_code, 0);
    let listed: Vec<_> = default
        .configs
        .iter()
        .map(|c| {
            (
                c.name.to_string(),
                c.value.as_ref().map(|v| v.to_string()),
                c.config_source,
                c.read_only,
            )
        })
        .collect();
    assert_eq!(
        listed,
        [(
            "max.connections.per.ip".to_string(),
            Some("2".to_string()),
            SOURCE_DYNAMIC_DEFAULT,
            false
        )]
    );
    // librdkafka's admin client sees the same, read-only flags included.
    let client = common::clients::admin(&broker.bootstrap());
    let described = client
        .describe_configs(&[ResourceSpecifier::Broker(NODE)], &AdminOptions::new())
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().unwrap();
    let entry = resource.get("max.connections.per.ip").unwrap();
    assert_eq!(entry.value.as_deref(), Some("50"));
    assert!(matches!(entry.source, ConfigSource::DynamicBroker));
    assert!(!entry.is_read_only);
    let num_partitions = resource.get("num.partitions").unwrap();
    assert!(num_partitions.is_read_only);
    assert!(matches!(num_partitions.source, ConfigSource::StaticBroker));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafkas_alter_configs_replaces_the_brokers_layer_and_it_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let start = || async {
        Server::start(common::config(dir.path(), &[]))
            .await
            .unwrap()
    };
    let server = start().await;
    let client = common::clients::admin(&server.local_addr().to_string());
    let alter = AlterConfig::new(ResourceSpecifier::Broker(NODE))
        .set("max.connections", "500")
        .set("max.connections.per.ip", "40");
    let results = client
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results[0].is_ok(), "{results:?}");
    // AlterConfigs replaces the whole layer: only the one named stays.
    let alter = AlterConfig::new(ResourceSpecifier::Broker(NODE)).set("max.connections", "600");
    let results = client
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results[0].is_ok(), "{results:?}");
    drop(client);
    server.shutdown().await.unwrap();

    let server = start().await;
    let mut raw = Raw::connect(server.local_addr()).await;
    let (value, source, _) = described(&mut raw, "1", "max.connections").await.unwrap();
    assert_eq!((value.as_deref(), source), (Some("600"), SOURCE_DYNAMIC));
    let (_, source, _) = described(&mut raw, "1", "max.connections.per.ip")
        .await
        .unwrap();
    assert_eq!(source, SOURCE_STATIC, "replaced by the second AlterConfigs");
    drop(raw);
    server.shutdown().await.unwrap();
}

/// What librdkafka's 0081_admin alters on a broker: a per-broker Kerberos
/// config, kept and described though Strata has no GSSAPI (as on a Kafka
/// broker without it), refused at the cluster default and when malformed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn librdkafkas_admin_test_broker_config_is_accepted_per_broker_only() {
    let broker = InProcess::start(&[]).await;
    let client = common::clients::admin(&broker.bootstrap());
    let alter = AlterConfig::new(ResourceSpecifier::Broker(NODE))
        .set("sasl.kerberos.min.time.before.relogin", "58000");
    let results = client
        .alter_configs(&[alter], &AdminOptions::new())
        .await
        .unwrap();
    assert!(results[0].is_ok(), "{results:?}");
    let mut raw = Raw::connect(broker.addr()).await;
    let (value, source, _) = described(&mut raw, "1", "sasl.kerberos.min.time.before.relogin")
        .await
        .unwrap();
    assert_eq!((value.as_deref(), source), (Some("58000"), SOURCE_DYNAMIC));
    let key = "sasl.kerberos.min.time.before.relogin";
    let r = incremental(
        &mut raw,
        vec![("", vec![config_op(key, SET, Some("1"))])],
        false,
    )
    .await;
    assert_eq!(r[0].0, INVALID_REQUEST, "{}", r[0].1);
    let r = incremental(
        &mut raw,
        vec![("1", vec![config_op(key, SET, Some("soon"))])],
        false,
    )
    .await;
    assert_eq!(r[0].0, INVALID_REQUEST, "{}", r[0].1);
    assert!(r[0].1.contains("Not a number of type LONG"), "{}", r[0].1);
    let r = incremental(
        &mut raw,
        vec![(
            "1",
            vec![config_op(
                "sasl.login.refresh.window.factor",
                SET,
                Some("0.2"),
            )],
        )],
        false,
    )
    .await;
    assert_eq!(
        (r[0].0, r[0].1.as_str()),
        (
            INVALID_REQUEST,
            "Invalid value 0.2 for configuration sasl.login.refresh.window.factor: Value must be at least 0.5"
        )
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_changes_get_kafkas_error_codes_and_change_nothing() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let one = |name: &str, value: &str| vec![config_op(name, SET, Some(value))];
    let cases: Vec<(&str, Vec<AlterableConfig>, i16, &str)> = vec![
        (
            "1",
            one("num.partitions", "3"),
            INVALID_REQUEST,
            "Cannot update these configs dynamically: Set(num.partitions)",
        ),
        (
            "1",
            one("no.such.config", "3"),
            INVALID_CONFIG,
            "Unknown broker config name",
        ),
        (
            "1",
            one("max.connections", "lots"),
            INVALID_REQUEST,
            "Not a number of type INT",
        ),
        (
            "1",
            one("max.connections.per.ip.overrides", "not-an-address:3"),
            INVALID_REQUEST,
            "max.connections.per.ip.overrides",
        ),
        (
            "2",
            one("max.connections", "10"),
            INVALID_REQUEST,
            "Unexpected broker id, expected 1, but received 2",
        ),
        (
            "one",
            one("max.connections", "10"),
            INVALID_REQUEST,
            "Node id must be an integer",
        ),
        (
            "",
            one("listener.name.ssl.ssl.keystore.location", "/k.pem"),
            INVALID_REQUEST,
            "broker id must be specified",
        ),
        (
            "1",
            one("ssl.keystore.location", "/k.pem"),
            INVALID_REQUEST,
            "only per-listener",
        ),
        (
            "1",
            one("listener.name.plaintext.ssl.keystore.location", "/k.pem"),
            INVALID_REQUEST,
            "no SSL or SASL_SSL listener named PLAINTEXT",
        ),
        (
            "1",
            vec![config_op("max.connections", APPEND, Some("3"))],
            INVALID_CONFIG,
            "Config value append is not allowed for config key: max.connections",
        ),
        (
            "1",
            vec![config_op("max.connections", SET, None)],
            INVALID_REQUEST,
            "Null value not supported for : max.connections",
        ),
        (
            "1",
            vec![
                config_op("max.connections", SET, Some("3")),
                config_op("max.connections", DELETE, None),
            ],
            INVALID_REQUEST,
            "duplicate config keys",
        ),
    ];
    for (resource, configs, code, message) in cases {
        let r = incremental(&mut raw, vec![(resource, configs)], false).await;
        assert_eq!(r[0].0, code, "{resource:?}: {}", r[0].1);
        assert!(r[0].1.contains(message), "{resource:?}: {}", r[0].1);
    }
    // The same resource twice: both refused, neither applied.
    let r = incremental(
        &mut raw,
        vec![
            ("1", one("max.connections", "10")),
            ("1", one("max.connections", "11")),
        ],
        false,
    )
    .await;
    assert!(r.iter().all(|(c, _)| *c == INVALID_REQUEST), "{r:?}");
    // validate_only checks and stores nothing.
    let r = incremental(&mut raw, vec![("1", one("max.connections", "10"))], true).await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    let (_, source, _) = described(&mut raw, "1", "max.connections").await.unwrap();
    assert_eq!(source, SOURCE_STATIC);
    // Describing another broker is that broker's job.
    let other = describe(&mut raw, "7", &[]).await;
    assert_eq!(other.error_code, ResponseError::InvalidRequest.code());
    // The broker still serves.
    let _: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
}

/// An SSL listener on `certs`' keystore.
async fn tls_broker(certs: &Certs) -> InProcess {
    InProcess::start(&[
        "--listener",
        "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "--ssl-cert-file",
        certs.cert.to_str().unwrap(),
        "--ssl-key-file",
        certs.key.to_str().unwrap(),
    ])
    .await
}

/// Whether a new librdkafka client trusting only `ca` can fetch metadata
/// over the SSL listener.
fn connects_trusting(server: &Server, ca: &std::path::Path) -> bool {
    let addr = server.listener_addr("SSL").unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", format!("localhost:{}", addr.port()))
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", ca.to_str().unwrap())
        .set("group.id", "tls-probe")
        .create()
        .unwrap();
    consumer
        .fetch_metadata(None, Duration::from_secs(5))
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_keystore_serves_new_connections_while_open_ones_keep_working() {
    let (old, new, stranger) = (certs(), certs(), certs_for("/CN=someone-else"));
    let broker = tls_broker(&old).await;
    let mut admin = Raw::connect(broker.addr()).await;
    assert!(connects_trusting(&broker.server, &old.ca));
    assert!(!connects_trusting(&broker.server, &new.ca));
    // A connection opened before the rotation. librdkafka drops its
    // bootstrap connection once metadata names broker 1 and connects to
    // that in the background; ListGroups, sent to every broker the metadata
    // named, waits until that connection is up. (No group.id: a consumer
    // group's coordinator connection would also open in the background.)
    let addr = broker.server.listener_addr("SSL").unwrap();
    let open: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", format!("localhost:{}", addr.port()))
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", old.ca.to_str().unwrap())
        .create()
        .unwrap();
    open.fetch_metadata(None, TIMEOUT).unwrap();
    open.fetch_group_list(None, TIMEOUT).unwrap();

    // A keystore that does not load is refused, and the old one stays.
    let garbage = new.cert.with_file_name("garbage.pem");
    std::fs::write(&garbage, "not a keystore").unwrap();
    let location = "listener.name.ssl.ssl.keystore.location";
    let r = incremental(
        &mut admin,
        vec![(
            "1",
            vec![config_op(location, SET, Some(garbage.to_str().unwrap()))],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, INVALID_REQUEST, "{}", r[0].1);
    // So is one for another subject (Kafka's ssl.allow.dn.changes=false).
    let r = incremental(
        &mut admin,
        vec![(
            "1",
            vec![config_op(
                location,
                SET,
                Some(stranger.keystore().to_str().unwrap()),
            )],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, INVALID_REQUEST, "{}", r[0].1);
    assert!(
        r[0].1.contains("DistinguishedName does not match"),
        "{}",
        r[0].1
    );
    assert!(connects_trusting(&broker.server, &old.ca));

    let keystore = new.keystore();
    let r = incremental(
        &mut admin,
        vec![(
            "1",
            vec![
                config_op("listener.name.ssl.ssl.keystore.type", SET, Some("PEM")),
                config_op(location, SET, Some(keystore.to_str().unwrap())),
            ],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    assert!(
        connects_trusting(&broker.server, &new.ca),
        "new handshakes get the new certificate"
    );
    assert!(!connects_trusting(&broker.server, &old.ca));
    // The connection made before still answers over its old session.
    open.fetch_metadata(None, TIMEOUT).unwrap();
    let (value, source, _) = described(&mut admin, "1", location).await.unwrap();
    assert_eq!(value.as_deref(), keystore.to_str());
    assert_eq!(source, SOURCE_DYNAMIC);

    // Inline PEM (ssl.keystore.certificate.chain/key) is sensitive: never shown.
    let chain = std::fs::read_to_string(&old.cert).unwrap();
    let key = std::fs::read_to_string(&old.key).unwrap();
    let r = incremental(
        &mut admin,
        vec![(
            "1",
            vec![
                config_op(location, DELETE, None),
                config_op(
                    "listener.name.ssl.ssl.keystore.certificate.chain",
                    SET,
                    Some(&chain),
                ),
                config_op("listener.name.ssl.ssl.keystore.key", SET, Some(&key)),
            ],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    assert!(connects_trusting(&broker.server, &old.ca));
    let result = describe(&mut admin, "1", &["listener.name.ssl.ssl.keystore.key"]).await;
    let entry = &result.configs[0];
    assert!(entry.is_sensitive && entry.value.is_none());
}

/// A CA and a localhost certificate with another subject.
fn certs_for(subject: &str) -> Certs {
    common::tls::certs_with_subject(subject)
}

/// Waits up to ten seconds for broker `node` at `addr` to describe `key` as `want`.
async fn eventually(addr: std::net::SocketAddr, node: i32, key: &str, want: (Option<&str>, i8)) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let mut raw = Raw::connect(addr).await;
        let got = described(&mut raw, &node.to_string(), key).await.unwrap();
        if (got.0.as_deref(), got.1) == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{key} on broker {node}: {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_the_default_reaches_every_broker_and_a_brokers_own_stays_its_own() {
    let Some(mut cluster) = common::cluster::Cluster::start(&[1, 2]).await else {
        return;
    };
    let addr = |node: i32| -> std::net::SocketAddr {
        format!("127.0.0.1:{}", cluster.port(node)).parse().unwrap()
    };
    let (one, two) = (addr(1), addr(2));
    let mut raw = Raw::connect(one).await;
    set(&mut raw, "", "max.connections", "5000").await;
    // Broker 2 changes only its own layer, through itself.
    let r = incremental(
        &mut raw,
        vec![("2", vec![config_op("max.connections", SET, Some("6000"))])],
        false,
    )
    .await;
    assert_eq!(r[0].0, INVALID_REQUEST, "{}", r[0].1);
    let mut raw2 = Raw::connect(two).await;
    set(&mut raw2, "2", "max.connections", "6000").await;
    eventually(
        one,
        1,
        "max.connections",
        (Some("5000"), SOURCE_DYNAMIC_DEFAULT),
    )
    .await;
    eventually(two, 2, "max.connections", (Some("6000"), SOURCE_DYNAMIC)).await;
    // Deleting broker 2's own lets the default through, after a restart too.
    let r = incremental(
        &mut raw2,
        vec![("2", vec![config_op("max.connections", DELETE, None)])],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    set(&mut raw, "", "max.connections", "5001").await;
    drop((raw, raw2));
    cluster.stop(2);
    cluster.start_broker(2);
    eventually(
        two,
        2,
        "max.connections",
        (Some("5001"), SOURCE_DYNAMIC_DEFAULT),
    )
    .await;
}

/// Whether a new librdkafka client presenting `client`'s certificate (and
/// trusting `server_ca`) gets metadata from the SSL listener.
fn admitted_with(server: &Server, server_ca: &std::path::Path, client: &Certs) -> bool {
    let addr = server.listener_addr("SSL").unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", format!("localhost:{}", addr.port()))
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", server_ca.to_str().unwrap())
        .set("ssl.certificate.location", client.cert.to_str().unwrap())
        .set("ssl.key.location", client.key.to_str().unwrap())
        .set("group.id", "mtls-probe")
        .create()
        .unwrap();
    consumer
        .fetch_metadata(None, Duration::from_secs(5))
        .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replaced_truststore_decides_which_client_certificates_new_connections_may_use() {
    let (server, other) = (certs(), certs());
    let broker = InProcess::start(&[
        "--listener",
        "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "--ssl-cert-file",
        server.cert.to_str().unwrap(),
        "--ssl-key-file",
        server.key.to_str().unwrap(),
        "--ssl-ca-file",
        server.ca.to_str().unwrap(),
        "--ssl-client-auth",
        "required",
    ])
    .await;
    assert!(admitted_with(&broker.server, &server.ca, &server));
    assert!(!admitted_with(&broker.server, &server.ca, &other));
    let mut admin = Raw::connect(broker.addr()).await;
    let trusted = "listener.name.ssl.ssl.truststore.location";
    set(&mut admin, "1", trusted, other.ca.to_str().unwrap()).await;
    assert!(admitted_with(&broker.server, &server.ca, &other));
    assert!(!admitted_with(&broker.server, &server.ca, &server));
    // Both CAs inline; then deleting it brings the flag's CA back.
    let both = [&server.ca, &other.ca]
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<String>();
    let r = incremental(
        &mut admin,
        vec![(
            "1",
            vec![
                config_op(trusted, DELETE, None),
                config_op(
                    "listener.name.ssl.ssl.truststore.certificates",
                    SET,
                    Some(&both),
                ),
            ],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    assert!(admitted_with(&broker.server, &server.ca, &server));
    assert!(admitted_with(&broker.server, &server.ca, &other));
    let r = incremental(
        &mut admin,
        vec![(
            "1",
            vec![config_op(
                "listener.name.ssl.ssl.truststore.certificates",
                DELETE,
                None,
            )],
        )],
        false,
    )
    .await;
    assert_eq!(r[0].0, 0, "{}", r[0].1);
    assert!(!admitted_with(&broker.server, &server.ca, &other));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_keystore_is_served_again_after_a_restart() {
    let (old, new) = (certs(), certs());
    let dir = tempfile::tempdir().unwrap();
    let args = [
        "--listener",
        "PLAINTEXT://127.0.0.1:0,SSL://127.0.0.1:0",
        "--ssl-cert-file",
        old.cert.to_str().unwrap(),
        "--ssl-key-file",
        old.key.to_str().unwrap(),
    ];
    let start = || async {
        Server::start(common::config(dir.path(), &args))
            .await
            .unwrap()
    };
    let server = start().await;
    let mut admin = Raw::connect(server.local_addr()).await;
    let keystore = new.keystore();
    set(
        &mut admin,
        "1",
        "listener.name.ssl.ssl.keystore.location",
        keystore.to_str().unwrap(),
    )
    .await;
    assert!(connects_trusting(&server, &new.ca));
    drop(admin);
    server.shutdown().await.unwrap();
    // The flags still name the old certificate; the stored config wins.
    let server = start().await;
    assert!(
        connects_trusting(&server, &new.ca),
        "the stored keystore is applied before accepting"
    );
    assert!(!connects_trusting(&server, &old.ca));
    server.shutdown().await.unwrap();
}
