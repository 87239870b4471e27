//! Cluster mode end to end: `strata` processes on 127.0.0.1 sharing one
//! `file://` object store and a real etcd, driven by librdkafka. A broker is
//! lost by `kill -9` and by deleting its data directory; nothing it
//! acknowledged may be lost or duplicated.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::{Duration, Instant};

use common::etcd::EtcdServer;
use common::{free_port, Process};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

const TOPIC: &str = "orders";
const PARTITIONS: i32 = 3;
const TIMEOUT: Duration = Duration::from_secs(60);

struct Cluster {
    etcd: EtcdServer,
    store: tempfile::TempDir,
    brokers: BTreeMap<i32, (Process, tempfile::TempDir)>,
}

impl Cluster {
    async fn start(nodes: &[i32]) -> Option<Cluster> {
        let etcd = EtcdServer::start()?;
        etcd.ready().await;
        let mut cluster = Cluster {
            etcd,
            store: tempfile::tempdir().unwrap(),
            brokers: BTreeMap::new(),
        };
        for &node in nodes {
            cluster.start_broker(node);
        }
        Some(cluster)
    }

    fn start_broker(&mut self, node: i32) {
        let dir = tempfile::tempdir().unwrap();
        let store = format!("file://{}", self.store.path().display());
        let etcd = self.etcd_url();
        let process = Process::start(
            dir.path(),
            free_port(),
            &[
                "--node-id",
                &node.to_string(),
                "--cluster",
                &etcd,
                "--store",
                &store,
                "--cluster-lease-ttl-ms",
                "2000",
                "--wal-flush-ms",
                "10",
                "--compaction-worker",
                "false",
            ],
        );
        self.brokers.insert(node, (process, dir));
    }

    fn etcd_url(&self) -> String {
        format!("etcd://127.0.0.1:{}/strata-test", self.etcd.client_port)
    }

    /// What `strata cluster` prints.
    fn describe(&self) -> String {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["cluster", "--cluster", &self.etcd_url()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }

    fn bootstrap(&self) -> String {
        self.brokers
            .values()
            .map(|(p, _)| p.bootstrap())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Loses the machine of broker `node`: kill -9, then its disk.
    fn lose(&mut self, node: i32) {
        let (process, dir) = self.brokers.remove(&node).unwrap();
        process.kill9();
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!Path::new(&path).exists());
    }
}

fn metadata_consumer(bootstrap: &str) -> BaseConsumer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap()
}

/// Creates the test topic; idle segments roll within a second, so that the
/// write-ahead log soon becomes collectable.
async fn create_topic(bootstrap: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let topic = NewTopic::new(TOPIC, PARTITIONS, TopicReplication::Fixed(1))
        .set("segment.ms", "1000")
        .set("strata.compaction.policy", "none");
    let created = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
}

/// Leader node of each partition, once every partition has one.
fn leaders(bootstrap: &str) -> Option<BTreeMap<i32, i32>> {
    let md = metadata_consumer(bootstrap)
        .fetch_metadata(Some(TOPIC), Duration::from_secs(5))
        .ok()?;
    let topic = md.topics().iter().find(|t| t.name() == TOPIC)?;
    let leaders: BTreeMap<i32, i32> = topic
        .partitions()
        .iter()
        .filter(|p| p.error().is_none() && p.leader() >= 0)
        .map(|p| (p.id(), p.leader()))
        .collect();
    (leaders.len() == PARTITIONS as usize).then_some(leaders)
}

/// Whether `node` leads any partition of any topic.
fn leads_something(bootstrap: &str, node: i32) -> bool {
    metadata_consumer(bootstrap)
        .fetch_metadata(None, Duration::from_secs(5))
        .is_ok_and(|md| {
            md.topics()
                .iter()
                .flat_map(|t| t.partitions())
                .any(|p| p.leader() == node)
        })
}

async fn wait_for_leaders(
    bootstrap: &str,
    ok: impl Fn(&BTreeMap<i32, i32>) -> bool,
) -> BTreeMap<i32, i32> {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(l) = leaders(bootstrap).filter(|l| ok(l)) {
            return l;
        }
        assert!(Instant::now() < deadline, "partitions never got leaders");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "2")
        .set("message.timeout.ms", "30000")
        .set("retry.backoff.ms", "100")
        // A paused broker holds requests: give up on it soon and retry elsewhere.
        .set("request.timeout.ms", "5000")
        // A paused broker keeps its connections open, so only fresh metadata
        // tells the client its partitions moved.
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .unwrap()
}

/// Produces `values` (round-robin over the partitions); returns each
/// acknowledged value with its partition and offset.
async fn produce(p: &FutureProducer, values: std::ops::Range<u32>) -> Vec<(i32, i64, String)> {
    produce_outcomes(p, values)
        .await
        .into_iter()
        .map(|r| r.expect("every record is acknowledged, across the failover"))
        .collect()
}

/// Like `produce`, but a record may fail (the client gave up on it); only
/// the acknowledged ones are returned.
async fn produce_acknowledged(
    p: &FutureProducer,
    values: std::ops::Range<u32>,
) -> Vec<(i32, i64, String)> {
    let outcomes = produce_outcomes(p, values).await;
    let failed = outcomes.iter().filter(|r| r.is_err()).count();
    if failed > 0 {
        eprintln!("{failed} records were not acknowledged");
    }
    outcomes.into_iter().flatten().collect()
}

async fn produce_outcomes(
    p: &FutureProducer,
    values: std::ops::Range<u32>,
) -> Vec<Result<(i32, i64, String), rdkafka::error::KafkaError>> {
    let sends: Vec<_> = values
        .map(|i| {
            let value = format!("v{i}");
            let key = format!("k{i}");
            let partition = (i % PARTITIONS as u32) as i32;
            let p = p.clone();
            async move {
                let record = FutureRecord::to(TOPIC)
                    .partition(partition)
                    .key(&key)
                    .payload(&value);
                p.send(record, TIMEOUT)
                    .await
                    .map(|delivery| (delivery.partition, delivery.offset, value.clone()))
                    .map_err(|(e, _)| e)
            }
        })
        .collect();
    futures::future::join_all(sends).await
}

/// Every record of the topic, by (partition, offset).
fn consume_all(bootstrap: &str, expected: usize) -> BTreeMap<(i32, i64), String> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition_offset(TOPIC, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + TIMEOUT;
    while got.len() < expected && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let value = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            let previous = got.insert((m.partition(), m.offset()), value);
            assert!(previous.is_none(), "offset read twice");
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acknowledged_records_survive_the_loss_of_their_leaders_machine() {
    let Some(mut cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap).await;
    let before = wait_for_leaders(&bootstrap, |_| true).await;
    // `strata cluster` shows what etcd holds: the brokers and the leaders.
    let shown = cluster.describe();
    for node in [1, 2, 3] {
        assert!(
            shown.contains(&format!("broker {node} at 127.0.0.1:")),
            "{shown}"
        );
    }
    for (partition, leader) in &before {
        let line = format!("{TOPIC}-{partition}: leader {leader} epoch ");
        assert!(shown.contains(&line), "{line} in {shown}");
    }
    // Leaders spread over every partition of every topic, internal ones too.
    let spread: BTreeSet<i32> = before.values().copied().collect();
    assert!(spread.len() >= 2, "leaders spread over brokers: {before:?}");

    let p = producer(&bootstrap);
    let mut acked = produce(&p, 0..600).await;
    // The machine leading partition 0 goes away, with its disk.
    let victim = before[&0];
    cluster.lose(victim);
    let lost_at = Instant::now();
    acked.extend(produce(&p, 600..1200).await);
    let stall = lost_at.elapsed();
    let survivors = cluster.bootstrap();
    let after = wait_for_leaders(&survivors, |l| !l.values().any(|n| *n == victim)).await;
    eprintln!("leaders {before:?} -> {after:?}; producing across the loss took {stall:?}");

    // The broker comes back (a new machine, same node id) and takes a share
    // of the partitions (of some topic) by handover.
    cluster.start_broker(victim);
    let bootstrap = cluster.bootstrap();
    let deadline = Instant::now() + TIMEOUT;
    while !leads_something(&bootstrap, victim) {
        assert!(
            Instant::now() < deadline,
            "the returning broker got no share"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    wait_for_leaders(&bootstrap, |_| true).await;
    acked.extend(produce(&p, 1200..1500).await);

    let got = consume_all(&bootstrap, acked.len());
    for (partition, offset, value) in &acked {
        assert_eq!(
            got.get(&(*partition, *offset)),
            Some(value),
            "acknowledged {value} at {partition}/{offset} must be there"
        );
    }
    let values: BTreeSet<&String> = got.values().collect();
    assert_eq!(
        values.len(),
        got.len(),
        "no record twice (idempotence across failover)"
    );
    assert_eq!(got.len(), acked.len());

    // Once sealed segments hold the data, the write-ahead log objects go
    // (a dead broker's too); what stays is each node's newest and fences.
    let written = wal_data_objects(cluster.store.path());
    let deadline = Instant::now() + TIMEOUT;
    loop {
        let left = wal_data_objects(cluster.store.path());
        if left == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{left} of {written} WAL objects never collected"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("{written} WAL objects with data collected");
}

/// WAL objects holding data that are not their node's newest.
fn wal_data_objects(store: &Path) -> usize {
    let Ok(nodes) = std::fs::read_dir(store.join("wal")) else {
        return 0;
    };
    let mut count = 0;
    for node in nodes {
        let mut files: Vec<_> = std::fs::read_dir(node.unwrap().path())
            .unwrap()
            .map(|f| f.unwrap().path())
            .collect();
        files.sort();
        files.pop();
        for f in files {
            let Ok(bytes) = std::fs::read(&f) else {
                continue;
            };
            let object = strata::format::wal::decode(bytes.into()).unwrap();
            count += usize::from(!object.is_fence());
        }
    }
    count
}

fn signal(process: &Process, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &process.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_leader_acknowledges_nothing_after_losing_its_partitions() {
    let Some(cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap).await;
    let before = wait_for_leaders(&bootstrap, |_| true).await;
    let p = producer(&bootstrap);
    let mut acked = produce(&p, 0..300).await;

    // The leader of partition 0 freezes for longer than its lease while
    // producers go on; its partitions move to the others.
    let zombie = before[&0];
    let (process, _) = &cluster.brokers[&zombie];
    signal(process, "-STOP");
    let others: Vec<String> = cluster
        .brokers
        .iter()
        .filter(|(n, _)| **n != zombie)
        .map(|(_, (p, _))| p.bootstrap())
        .collect();
    wait_for_leaders(&others.join(","), |l| !l.values().any(|n| *n == zombie)).await;
    // Records caught in the paused broker may fail (the client times them
    // out); what matters is that none is acknowledged and then lost.
    acked.extend(produce_acknowledged(&p, 300..900).await);
    // It wakes up believing it still leads: whatever it was sent meanwhile
    // must not be acknowledged by it, and nothing acknowledged may be lost.
    signal(process, "-CONT");
    acked.extend(produce_acknowledged(&p, 900..1200).await);
    assert!(
        acked.len() >= 1000,
        "most records went through: {}",
        acked.len()
    );

    let got = consume_all(&others.join(","), acked.len());
    for (partition, offset, value) in &acked {
        assert_eq!(got.get(&(*partition, *offset)), Some(value), "{value} lost");
    }
    let values: BTreeSet<&String> = got.values().collect();
    assert_eq!(values.len(), got.len(), "no record twice");
    let sent = |v: &String| v[1..].parse::<u32>().is_ok_and(|i| i < 1200);
    assert!(got.values().all(sent), "only records the producer sent");
}
