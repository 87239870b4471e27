//! A cluster of `strata` processes on 127.0.0.1 for tests: one real etcd,
//! one `file://` object store, brokers started, stopped (SIGTERM), killed
//! (-9) or lost (-9 and their disk) by node id. A broker keeps its data
//! directory and port across a stop, so starting it again is a restart.
//!
//! Clusters run one at a time per test binary (all of `tests/it` is one): a
//! handful of brokers and an etcd per test are all a small machine can keep
//! within the lease TTL.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::stream::{FuturesUnordered, StreamExt};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::Consumer;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};

use super::clients::{assign, client, create_topic, leaders_with, reader};
use super::etcd::EtcdServer;
use super::{free_port, Process};

/// The lease TTL the tests run with: failover tests wait about this long.
pub const LEASE_TTL: Duration = Duration::from_secs(2);

static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How every broker of a cluster runs.
#[derive(Clone, Debug)]
pub struct Settings {
    pub lease_ttl: Duration,
    /// Whether each broker runs a compaction worker (the broker's default).
    pub compaction_worker: bool,
    /// More `strata serve` flags for every broker.
    pub extra: Vec<String>,
    /// The security protocol of each broker's one listener (on its port);
    /// `None`: PLAINTEXT.
    pub protocol: Option<&'static str>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            lease_ttl: LEASE_TTL,
            compaction_worker: false,
            extra: Vec::new(),
            protocol: None,
        }
    }
}

/// A broker's data directory and port, kept while it is stopped.
struct Node {
    dir: tempfile::TempDir,
    port: u16,
    process: Option<Process>,
}

pub struct Cluster {
    pub etcd: EtcdServer,
    pub store: tempfile::TempDir,
    settings: Settings,
    nodes: BTreeMap<i32, Node>,
    _one_at_a_time: tokio::sync::MutexGuard<'static, ()>,
}

impl Cluster {
    /// Brokers `nodes` with the default settings; `None` without etcd.
    pub async fn start(nodes: &[i32]) -> Option<Cluster> {
        Cluster::start_with(nodes, Settings::default()).await
    }

    pub async fn start_with(nodes: &[i32], settings: Settings) -> Option<Cluster> {
        let guard = ONE_AT_A_TIME.lock().await;
        let etcd = EtcdServer::start()?;
        etcd.ready().await;
        let mut cluster = Cluster {
            etcd,
            store: tempfile::tempdir().unwrap(),
            settings,
            nodes: BTreeMap::new(),
            _one_at_a_time: guard,
        };
        for &node in nodes {
            cluster.start_broker(node);
        }
        Some(cluster)
    }

    /// Starts broker `node`: again on its data directory and port if it ran
    /// before and was stopped or killed, afresh otherwise.
    pub fn start_broker(&mut self, node: i32) {
        let store = format!("file://{}", self.store.path().display());
        let etcd = self.etcd_url();
        let ttl = self.settings.lease_ttl.as_millis().to_string();
        let worker = self.settings.compaction_worker.to_string();
        let entry = self.nodes.entry(node).or_insert_with(|| Node {
            dir: tempfile::tempdir().unwrap(),
            port: free_port(),
            process: None,
        });
        assert!(entry.process.is_none(), "broker {node} already runs");
        let node_id = node.to_string();
        let mut args = vec![
            "--node-id",
            &node_id,
            "--cluster",
            &etcd,
            "--store",
            &store,
            "--cluster-lease-ttl-ms",
            &ttl,
            "--wal-flush-ms",
            "10",
            "--compaction-worker",
            &worker,
        ];
        let listener = self
            .settings
            .protocol
            .map(|p| format!("{p}://127.0.0.1:{}", entry.port));
        if let Some(l) = &listener {
            args.extend(["--listener", l.as_str()]);
        }
        args.extend(self.settings.extra.iter().map(String::as_str));
        entry.process = Some(Process::start(entry.dir.path(), entry.port, &args));
    }

    /// Stops broker `node` gracefully (SIGTERM) and waits until it exited;
    /// returns how long the shutdown took. Its directory stays.
    pub fn stop(&mut self, node: i32) -> Duration {
        let mut process = self.take(node);
        let started = Instant::now();
        signal(&process, "-TERM");
        let deadline = started + Duration::from_secs(30);
        loop {
            if let Some(status) = process.child.try_wait().unwrap() {
                assert!(status.success(), "broker {node} shut down with {status}");
                return started.elapsed();
            }
            assert!(Instant::now() < deadline, "broker {node} did not shut down");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// kill -9: the broker dies; its directory stays.
    pub fn kill9(&mut self, node: i32) {
        self.take(node).kill9();
    }

    /// Loses the machine of broker `node`: kill -9, then its disk.
    pub fn lose(&mut self, node: i32) {
        self.kill9(node);
        let dir = self.nodes.remove(&node).unwrap().dir;
        let path = dir.path().to_path_buf();
        drop(dir);
        assert!(!path.exists());
    }

    fn take(&mut self, node: i32) -> Process {
        let entry = self.nodes.get_mut(&node).expect("a known broker");
        entry.process.take().expect("a running broker")
    }

    pub fn process(&self, node: i32) -> &Process {
        self.nodes[&node]
            .process
            .as_ref()
            .expect("a running broker")
    }

    /// The running brokers.
    pub fn running(&self) -> Vec<i32> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.process.is_some())
            .map(|(id, _)| *id)
            .collect()
    }

    /// Running brokers that exited by themselves, with their exit status.
    pub fn exited(&mut self) -> Vec<(i32, std::process::ExitStatus)> {
        self.nodes
            .iter_mut()
            .filter_map(|(id, n)| {
                let status = n.process.as_mut()?.child.try_wait().unwrap()?;
                Some((*id, status))
            })
            .collect()
    }

    /// Bootstrap servers: every running broker.
    pub fn bootstrap(&self) -> String {
        self.running()
            .iter()
            .map(|n| self.bootstrap_of(*n))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// One broker's address (whether it runs or not).
    pub fn bootstrap_of(&self, node: i32) -> String {
        format!("127.0.0.1:{}", self.nodes[&node].port)
    }

    pub fn port(&self, node: i32) -> u16 {
        self.nodes[&node].port
    }

    pub fn etcd_url(&self) -> String {
        format!("etcd://127.0.0.1:{}/strata-test", self.etcd.client_port)
    }

    /// Stops etcd (SIGKILL); its data stays for [`Cluster::start_etcd`].
    pub fn stop_etcd(&mut self) {
        self.etcd.kill();
    }

    /// Starts etcd again on the same data directory and ports.
    pub async fn start_etcd(&mut self) {
        self.etcd.spawn();
        self.etcd.ready().await;
    }

    /// What `strata cluster` prints.
    pub fn describe(&self) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["cluster", "--cluster", &self.etcd_url()])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    }
}

/// Sends `sig` (as `kill` spells it: "-STOP", "-CONT", "-TERM") to a broker.
pub fn signal(process: &Process, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &process.child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

/// Leader node of every partition of every topic (internal ones too), as
/// metadata reports it; partitions without a leader are left out.
pub fn all_leaders(bootstrap: &str) -> Option<BTreeMap<(String, i32), i32>> {
    let md = reader(bootstrap, &[])
        .fetch_metadata(None, Duration::from_secs(5))
        .ok()?;
    Some(
        md.topics()
            .iter()
            .flat_map(|t| {
                t.partitions()
                    .iter()
                    .filter(|p| p.error().is_none() && p.leader() >= 0)
                    .map(|p| ((t.name().to_string(), p.id()), p.leader()))
            })
            .collect(),
    )
}

/// Leader node of each partition of `topic`, once every one has a leader.
pub fn leaders(bootstrap: &str, topic: &str, partitions: i32) -> Option<BTreeMap<i32, i32>> {
    leaders_with(&client(bootstrap, &[]), topic, partitions)
}

/// Waits (up to a minute) until every partition of `topic` has a leader and
/// `ok` holds for the leaders.
pub async fn wait_for_leaders(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    ok: impl Fn(&BTreeMap<i32, i32>) -> bool,
) -> BTreeMap<i32, i32> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(l) = leaders(bootstrap, topic, partitions).filter(|l| ok(l)) {
            return l;
        }
        assert!(
            Instant::now() < deadline,
            "{topic}: leaders never as expected: {:?}",
            leaders(bootstrap, topic, partitions)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Number of partitions (of all topics) each broker leads.
pub fn leader_counts(leaders: &BTreeMap<(String, i32), i32>) -> BTreeMap<i32, usize> {
    let mut counts = BTreeMap::new();
    for node in leaders.values() {
        *counts.entry(*node).or_insert(0) += 1;
    }
    counts
}

/// An idempotent `acks=all` producer that rides out failovers.
pub fn producer(bootstrap: &str) -> FutureProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "45000")
        .set("retry.backoff.ms", "50")
        .set("retry.backoff.max.ms", "500")
        // A paused broker holds requests: give up on it soon and retry elsewhere.
        .set("request.timeout.ms", "5000")
        // A paused broker keeps its connections open, so only fresh metadata
        // tells the client its partitions moved.
        .set("topic.metadata.refresh.interval.ms", "1000")
        .create()
        .unwrap()
}

/// One acknowledged record: partition, offset, value.
pub type Acked = (i32, i64, String);

/// What a [`Load`] saw.
#[derive(Debug, Default)]
pub struct LoadReport {
    pub sent: usize,
    pub acked: Vec<Acked>,
    /// Records the client gave up on, with its error.
    pub failed: Vec<(String, String)>,
    /// Longest time from send to acknowledgement.
    pub max_latency: Duration,
}

/// A producer sending keyed records `v0`, `v1`, ... round-robin over the
/// partitions of a topic, about 500 a second, until finished.
pub struct Load {
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<LoadReport>,
}

impl Load {
    /// Creates `topic` with `partitions`, waits until every partition has a
    /// leader and starts a load on it through an idempotent `producer`.
    pub async fn on_new_topic(bootstrap: &str, topic: &str, partitions: i32) -> Load {
        create_topic(bootstrap, topic, partitions, &[]).await;
        wait_for_leaders(bootstrap, topic, partitions, |_| true).await;
        Load::start(producer(bootstrap), topic, partitions)
    }

    pub fn start(producer: FutureProducer, topic: &str, partitions: i32) -> Load {
        Load::start_at(producer, topic, partitions, 0)
    }

    /// Like [`Load::start`], with values from `v<first>` on (after an
    /// earlier load's `sent`).
    pub fn start_at(producer: FutureProducer, topic: &str, partitions: i32, first: usize) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let acked = Arc::new(AtomicUsize::new(0));
        let task = tokio::spawn(produce_until(
            producer,
            topic.to_string(),
            partitions,
            first as u32,
            stop.clone(),
            acked.clone(),
        ));
        Load { stop, acked, task }
    }

    /// Records acknowledged so far.
    pub fn acked(&self) -> usize {
        self.acked.load(Ordering::Relaxed)
    }

    /// Waits until `n` more records are acknowledged than now.
    pub async fn progress(&self, n: usize) {
        let target = self.acked() + n;
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.acked() < target {
            assert!(
                Instant::now() < deadline,
                "producing stalled at {}",
                self.acked()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops sending and waits for every record in flight.
    pub async fn finish(self) -> LoadReport {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap()
    }
}

async fn produce_until(
    producer: FutureProducer,
    topic: String,
    partitions: i32,
    first: u32,
    stop: Arc<AtomicBool>,
    acked: Arc<AtomicUsize>,
) -> LoadReport {
    let mut report = LoadReport::default();
    let mut in_flight = FuturesUnordered::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut i = first;
    let outcome =
        |report: &mut LoadReport, (value, sent_at, result): (String, Instant, _)| match result {
            Ok(delivery) => {
                let delivery: rdkafka::producer::future_producer::Delivery = delivery;
                report.max_latency = report.max_latency.max(sent_at.elapsed());
                report
                    .acked
                    .push((delivery.partition, delivery.offset, value));
                acked.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                let e: rdkafka::error::KafkaError = e;
                report.failed.push((value, e.to_string()));
            }
        };
    while !stop.load(Ordering::Relaxed) {
        tokio::select! {
            _ = tick.tick() => {
                // At most a few hundred records wait at a time.
                for _ in 0..5 {
                    if in_flight.len() >= 300 {
                        break;
                    }
                    let value = format!("v{i}");
                    let key = format!("k{i}");
                    let partition = (i % partitions as u32) as i32;
                    i += 1;
                    report.sent += 1;
                    let p = producer.clone();
                    let topic = topic.clone();
                    in_flight.push(async move {
                        let sent_at = Instant::now();
                        let record = FutureRecord::to(&topic)
                            .partition(partition)
                            .key(&key)
                            .payload(&value);
                        let result = p.send(record, Duration::from_secs(60)).await;
                        (value, sent_at, result)
                    });
                }
            }
            Some(done) = in_flight.next() => outcome(&mut report, done),
        }
    }
    while let Some(done) = in_flight.next().await {
        outcome(&mut report, done);
    }
    report
}

/// Every record of `topic` from the beginning, by (partition, offset), read
/// until `expected` records or a minute passed; no offset may come twice.
pub fn consume_all(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
    expected: usize,
) -> BTreeMap<(i32, i64), String> {
    let c = reader(bootstrap, &[]);
    assign(&c, topic, partitions, Offset::Beginning);
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < expected && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let value = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            let previous = got.insert((m.partition(), m.offset()), value);
            assert!(previous.is_none(), "offset read twice");
        }
    }
    got
}

/// Every record of `topic` up to the high watermarks of the moment (offsets
/// a compaction removed are skipped), by (partition, offset).
pub fn consume_to_end(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> BTreeMap<(i32, i64), String> {
    let c = reader(bootstrap, &[]);
    let mut tpl = TopicPartitionList::new();
    let mut left = BTreeMap::new();
    for p in 0..partitions {
        let (_, high) = c
            .fetch_watermarks(topic, p, Duration::from_secs(10))
            .unwrap();
        if high > 0 {
            left.insert(p, high);
        }
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    c.assign(&tpl).unwrap();
    let mut got = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !left.is_empty() {
        assert!(
            Instant::now() < deadline,
            "never reached the ends: {left:?}"
        );
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            let value = m
                .payload()
                .map(|v| String::from_utf8(v.to_vec()).unwrap())
                .unwrap_or_default();
            got.insert((m.partition(), m.offset()), value);
            if left
                .get(&m.partition())
                .is_some_and(|h| m.offset() >= h - 1)
            {
                left.remove(&m.partition());
            }
        }
    }
    got
}

/// Every acknowledged record is in `got` at its offset, and no value is
/// there twice.
pub fn assert_exactly_once(acked: &[Acked], got: &BTreeMap<(i32, i64), String>) {
    for (partition, offset, value) in acked {
        assert_eq!(
            got.get(&(*partition, *offset)),
            Some(value),
            "acknowledged {value} at {partition}/{offset} must be there"
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (at, value) in got {
        assert!(seen.insert(value), "{value} twice (again at {at:?})");
    }
}
