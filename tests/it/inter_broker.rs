//! The broker's own connections authenticate like any client: its
//! compaction worker (librdkafka) on a SASL_SSL listener with SCRAM and on
//! an SSL listener requiring client certificates, and in a cluster the
//! WriteTxnMarkers a transaction coordinator sends other leaders over a
//! SASL listener, all under `--authorizer acl` where ANONYMOUS may do
//! nothing and only the broker's principal is a super user.

use crate::common;
use common::clients;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::tls::certs;
use common::InProcess;
use object_store::ObjectStore;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, FutureProducer, FutureRecord, Producer, ThreadedProducer,
};
use rdkafka::{Offset, TopicPartitionList};
use strata::manifest::store::{default_url, open, S3Options};
use strata::manifest::Manifest;

const TIMEOUT: Duration = Duration::from_secs(60);

const COMPACTED: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.bytes", "2000"),
    ("segment.ms", "300"),
    ("min.compaction.lag.ms", "0"),
    ("delete.retention.ms", "0"),
    ("strata.compaction.fanout", "2"),
];

/// The manifest of partition 0 of `topic`, from the store.
async fn manifest(store: &Arc<dyn ObjectStore>, topic: &str) -> Option<Manifest> {
    Some(common::stored_manifest(store, topic, 0).await?.0)
}

/// Keyed updates into a compacted topic through `client`, then waits until
/// a merged (level > 0) segment is in the manifest: only the broker's own
/// worker merges, so it consumed its job through the secured listener.
async fn compacts_through(client: ClientConfig, broker: &InProcess) {
    clients::create_topic_with(&client, "kv", 1, COMPACTED).await;
    let producer: FutureProducer = client
        .clone()
        .set("linger.ms", "0")
        .set("batch.size", "800")
        .create()
        .unwrap();
    for v in 0..30 {
        for k in 0..10 {
            let (key, value) = (format!("key{k}"), format!("key{k}-version{v:03}"));
            producer
                .send(FutureRecord::to("kv").key(&key).payload(&value), TIMEOUT)
                .await
                .unwrap();
        }
    }
    let store = open(&default_url(broker.dir.path()), &S3Options::default()).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let levels: Vec<_> = manifest(&store, "kv")
            .await
            .map(|m| m.segments.iter().map(|s| s.level).collect())
            .unwrap_or_default();
        if levels.iter().any(|l| *l > 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "nothing merged; segment levels {levels:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_compaction_worker_logs_in_with_scram_on_a_sasl_ssl_only_broker() {
    let c = certs();
    let (ca, cert, key) = (
        c.ca.to_str().unwrap(),
        c.cert.to_str().unwrap(),
        c.key.to_str().unwrap(),
    );
    let mut args = vec![
        "--listener",
        "SASL_SSL://127.0.0.1:0",
        "--ssl-cert-file",
        cert,
        "--ssl-key-file",
        key,
        "--ssl-ca-file",
        ca,
        "--sasl-enabled-mechanisms",
        "SCRAM-SHA-512",
        "--authorizer",
        "acl",
        "--super-users",
        "User:broker;User:admin",
        "--add-scram",
        "SCRAM-SHA-512=[name=admin,password=admin-secret]",
        "--tier-interval-ms",
        "50",
        "--compaction-delete-delay-ms",
        "100",
    ];
    // Without the broker's own credentials it does not start, as Kafka.
    let dir = tempfile::tempdir().unwrap();
    let refused = strata::server::Server::start(common::config(dir.path(), &args)).await;
    let err = refused
        .err()
        .expect("a SASL inter-broker listener without credentials");
    assert!(
        err.to_string().contains("--inter-broker-sasl-username"),
        "{err}"
    );
    // Its credential is created from the configured password at start.
    args.extend([
        "--inter-broker-sasl-username",
        "broker",
        "--inter-broker-sasl-password",
        "broker-secret",
    ]);
    let broker = InProcess::start(&args).await;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", broker.bootstrap())
        .set("security.protocol", "sasl_ssl")
        .set("ssl.ca.location", ca)
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("sasl.username", "admin")
        .set("sasl.password", "admin-secret");
    compacts_through(client, &broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_compaction_worker_presents_the_brokers_certificate_on_an_mtls_listener() {
    let c = certs();
    let (ca, cert, key) = (
        c.ca.to_str().unwrap(),
        c.cert.to_str().unwrap(),
        c.key.to_str().unwrap(),
    );
    let broker = InProcess::start(&[
        "--listener",
        "SSL://127.0.0.1:0",
        "--ssl-cert-file",
        cert,
        "--ssl-key-file",
        key,
        "--ssl-ca-file",
        ca,
        "--ssl-client-auth",
        "required",
        "--authorizer",
        "acl",
        "--super-users",
        "User:CN=localhost",
        "--tier-interval-ms",
        "50",
        "--compaction-delete-delay-ms",
        "100",
    ])
    .await;
    let mut client = ClientConfig::new();
    client
        .set("bootstrap.servers", broker.bootstrap())
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", ca)
        .set("ssl.certificate.location", cert)
        .set("ssl.key.location", key);
    compacts_through(client, &broker).await;
}

type TxnProducer = ThreadedProducer<DefaultProducerContext>;

fn admin_client(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("security.protocol", "sasl_plaintext")
        .set("sasl.mechanisms", "SCRAM-SHA-512")
        .set("sasl.username", "admin")
        .set("sasl.password", "admin-secret");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_sasl_only_cluster_markers_reach_other_leaders_as_the_broker_principal() {
    let settings = common::cluster::Settings {
        protocol: Some("SASL_PLAINTEXT"),
        extra: [
            "--authorizer",
            "acl",
            "--super-users",
            "User:broker;User:admin",
            "--add-scram",
            "SCRAM-SHA-512=[name=admin,password=admin-secret]",
            "--sasl-mechanism-inter-broker-protocol",
            "SCRAM-SHA-256",
            "--inter-broker-sasl-username",
            "broker",
            "--inter-broker-sasl-password",
            "broker-secret",
        ]
        .map(String::from)
        .to_vec(),
        ..Default::default()
    };
    let Some(cluster) = common::cluster::Cluster::start_with(&[1, 2, 3], settings).await else {
        eprintln!("etcd not installed; skipping");
        return;
    };
    let client = admin_client(&cluster.bootstrap());
    clients::create_topic_with(&client, "spread", 3, &[]).await;
    // Spread over the brokers, so that markers go to other brokers.
    let deadline = Instant::now() + TIMEOUT;
    let spread = loop {
        match clients::leaders_with(&client, "spread", 3) {
            Some(l) if l.values().collect::<BTreeSet<_>>().len() >= 2 => break l,
            other => assert!(Instant::now() < deadline, "leaders: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let producer: TxnProducer = client
        .clone()
        .set("transactional.id", "spread")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let t = Duration::from_secs(30);
    producer.init_transactions(t).expect("init_transactions");
    producer.begin_transaction().unwrap();
    let mut want = BTreeSet::new();
    for partition in spread.keys() {
        let value = format!("committed to partition {partition}");
        producer
            .send(
                BaseRecord::<(), str>::to("spread")
                    .partition(*partition)
                    .payload(&value),
            )
            .map_err(|(e, _)| e)
            .unwrap();
        want.insert(value);
    }
    producer.commit_transaction(t).expect("commit");
    // Visible to read_committed only once each leader has its COMMIT marker.
    let consumer: BaseConsumer = client
        .clone()
        .set("group.id", "readers")
        .set("enable.auto.commit", "false")
        .set("isolation.level", "read_committed")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset("spread", p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    let mut got = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while got != want && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = m.expect("consume");
            got.insert(String::from_utf8_lossy(m.payload().unwrap_or_default()).into_owned());
        }
    }
    assert_eq!(got, want, "leaders {spread:?}");
}
