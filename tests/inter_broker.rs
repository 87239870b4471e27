//! The broker's own connections authenticate like any client: its
//! compaction worker (librdkafka) on a SASL_SSL listener with SCRAM and on
//! an SSL listener requiring client certificates, and in a cluster the
//! WriteTxnMarkers a transaction coordinator sends other leaders over a
//! SASL listener, all under `--authorizer acl` where ANONYMOUS may do
//! nothing and only the broker's principal is a super user.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::InProcess;
use object_store::ObjectStore;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, FutureProducer, FutureRecord, Producer, ThreadedProducer,
};
use rdkafka::{Offset, TopicPartitionList};
use strata::catalog::TopicFile;
use strata::manifest::objects::newest_topic_file;
use strata::manifest::store::{default_url, open, S3Options};
use strata::manifest::{partition_prefix, Manifest, ManifestStore};

const TIMEOUT: Duration = Duration::from_secs(60);

/// A CA and a certificate signed by it for localhost and 127.0.0.1, usable
/// by a server and as a client certificate (subject `CN=localhost`).
struct Certs {
    _dir: tempfile::TempDir,
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn certs() -> Certs {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| dir.path().join(n);
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let s = |p: &Path| p.to_str().unwrap().to_string();
    let (ca, ca_key, cert, key, csr, ext) = (
        s(&p("ca.pem")),
        s(&p("ca.key")),
        s(&p("broker.pem")),
        s(&p("broker.key")),
        s(&p("broker.csr")),
        s(&p("ext")),
    );
    std::fs::write(
        &ext,
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=strata test ca",
        "-keyout",
        &ca_key,
        "-out",
        &ca,
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        &key,
        "-out",
        &csr,
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        &csr,
        "-CA",
        &ca,
        "-CAkey",
        &ca_key,
        "-CAcreateserial",
        "-days",
        "2",
        "-out",
        &cert,
        "-extfile",
        &ext,
    ]);
    Certs {
        ca: ca.into(),
        cert: cert.into(),
        key: key.into(),
        _dir: dir,
    }
}

const COMPACTED: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.bytes", "2000"),
    ("segment.ms", "300"),
    ("min.compaction.lag.ms", "0"),
    ("delete.retention.ms", "0"),
    ("strata.compaction.fanout", "2"),
];

async fn create_topic(client: &ClientConfig, name: &str, partitions: i32, cfg: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = client.create().unwrap();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in cfg {
        topic = topic.set(k, v);
    }
    let res = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(res[0].is_ok(), "{res:?}");
}

/// The manifest of partition 0 of `topic`, from the store.
async fn manifest(store: &Arc<dyn ObjectStore>, topic: &str) -> Option<Manifest> {
    let path = object_store::path::Path::from_iter(["topics", topic]);
    let file: TopicFile = newest_topic_file(store, &path).await.unwrap()?;
    ManifestStore::new(
        store.clone(),
        partition_prefix(topic, file.id, 0).child("manifest"),
    )
    .load_latest()
    .await
    .unwrap()
}

/// Keyed updates into a compacted topic through `client`, then waits until
/// a merged (level > 0) segment is in the manifest: only the broker's own
/// worker merges, so it consumed its job through the secured listener.
async fn compacts_through(client: ClientConfig, broker: &InProcess) {
    create_topic(&client, "kv", 1, COMPACTED).await;
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

/// Leader of each partition of `topic`, once every one has a leader.
fn leaders(client: &ClientConfig, topic: &str, partitions: i32) -> Option<BTreeMap<i32, i32>> {
    let consumer: BaseConsumer = client.clone().set("group.id", "unused").create().unwrap();
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .ok()?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    let leaders: BTreeMap<i32, i32> = t
        .partitions()
        .iter()
        .filter(|p| p.error().is_none() && p.leader() >= 0)
        .map(|p| (p.id(), p.leader()))
        .collect();
    (leaders.len() == partitions as usize).then_some(leaders)
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
    create_topic(&client, "spread", 3, &[]).await;
    // Spread over the brokers, so that markers go to other brokers.
    let deadline = Instant::now() + TIMEOUT;
    let spread = loop {
        match leaders(&client, "spread", 3) {
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
