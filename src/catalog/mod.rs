//! The catalog: which topics exist, their ids, partitions and configs.
//!
//! Each topic is a directory `topics/<name>/` holding `topic.json` (id,
//! partition count, config overrides) and one directory per partition. The
//! JSON is replaced atomically (temp file, fsync, rename), so a crash leaves
//! either the old or the new description. Deleting a topic renames its
//! directory out of the way first, then removes it in the background.
//!
//! A single broker's dynamic broker configs (Kafka's KIP-226: the cluster
//! default and this broker's own) are kept next to the topics, in
//! `broker-configs.json`, written the same way, and so are the groups'
//! config overrides, in `group-configs.json`. Which names and values are
//! valid is the API layer's question; the catalog only keeps them.

pub mod config;
pub(crate) mod producer_ids;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::RwLock;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::clock::{self, SharedClock, SharedRandom};
use crate::log::index::write_synced;
use crate::log::{
    AppendConfig, HeadSink, LogError, Partition, PartitionSettings, RemoteLog, Visibility,
};
use crate::metrics::Timer;
pub use config::{ProducePolicy, TopicConfig, TopicSettings};
use producer_ids::ProducerIdAllocator;

const CLUSTER_FILE: &str = "cluster.json";
const TOPIC_FILE: &str = "topic.json";
const BROKER_CONFIGS_FILE: &str = "broker-configs.json";
const FEATURES_FILE: &str = "features.json";
const GROUP_CONFIGS_FILE: &str = "group-configs.json";
/// Kafka's limit on topic name length.
const MAX_TOPIC_NAME_LEN: usize = 249;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("Topic '{0}' already exists.")]
    TopicExists(String),
    #[error("{0}")]
    InvalidTopic(String),
    #[error("This server does not host this topic-partition.")]
    UnknownTopic,
    #[error("{0}")]
    InvalidPartitions(String),
    #[error("{0}")]
    InvalidReplicationFactor(String),
    #[error("{0}")]
    InvalidConfig(String),
    #[error(transparent)]
    Log(#[from] LogError),
}

impl From<std::io::Error> for CatalogError {
    fn from(e: std::io::Error) -> Self {
        CatalogError::Log(LogError::Io(e))
    }
}

/// Kafka's `default.replication.factor`, what a request for factor -1 gets.
/// Kafka's default too: a topic created without a factor is described with
/// its leader alone.
pub const DEFAULT_REPLICATION_FACTOR: i16 = 1;

/// The replication factor a topic asking for `requested` gets with
/// `brokers` brokers registered: -1 is the default; otherwise at least one
/// and at most one per broker, refused as Kafka refuses it.
pub fn replication_factor_for(requested: i16, brokers: usize) -> Result<i16, CatalogError> {
    let factor = match requested {
        -1 => DEFAULT_REPLICATION_FACTOR,
        f if f < 1 => {
            return Err(CatalogError::InvalidReplicationFactor(
                "Replication factor must be larger than 0.".into(),
            ))
        }
        f => f,
    };
    if factor as usize > brokers {
        return Err(CatalogError::InvalidReplicationFactor(format!(
            "Unable to replicate the partition {factor} time(s): The target replication factor of {factor} cannot be reached because only {brokers} broker(s) are registered."
        )));
    }
    Ok(factor)
}

/// Checks a topic name by Kafka's rules: 1-249 of `[a-zA-Z0-9._-]`, not `.` or `..`.
pub fn validate_topic_name(name: &str) -> Result<(), CatalogError> {
    let invalid = |why: &str| {
        Err(CatalogError::InvalidTopic(format!(
            "Topic name \"{name}\" is illegal, {why}"
        )))
    };
    if name.is_empty() {
        return invalid("it can't be empty");
    }
    if name == "." || name == ".." {
        return invalid("it can't be '.' or '..'");
    }
    if name.len() > MAX_TOPIC_NAME_LEN {
        return invalid("it can't be longer than 249 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
    {
        return invalid("it contains a character other than ASCII alphanumerics, '.', '_' and '-'");
    }
    Ok(())
}

/// A topic the broker creates for itself, described before it exists (so
/// that a cluster can agree on it before any broker creates it locally).
#[derive(Debug, Clone)]
pub struct TopicSpec {
    pub name: &'static str,
    pub partitions: i32,
    pub config: Vec<(&'static str, String)>,
}

impl TopicSpec {
    /// Creates the topic unless the catalog has it.
    pub fn ensure(&self, catalog: &Catalog) -> Result<Arc<Topic>, CatalogError> {
        if let Some(t) = catalog.topic(self.name) {
            return Ok(t);
        }
        let pairs: Vec<(&str, Option<&str>)> = self
            .config
            .iter()
            .map(|(k, v)| (*k, Some(v.as_str())))
            .collect();
        catalog.create_topic(self.name, self.partitions, 1, &pairs)
    }
}

/// `topic.json`; the tier keeps a copy in the object store.
#[derive(Debug, Serialize, Deserialize)]
pub struct TopicFile {
    pub id: Uuid,
    pub partitions: u32,
    #[serde(default)]
    pub config: TopicConfig,
}

pub struct Topic {
    name: String,
    id: Uuid,
    dir: PathBuf,
    /// The overrides as given, and parsed.
    config: RwLock<(TopicConfig, Arc<TopicSettings>)>,
    partitions: RwLock<Vec<Arc<Partition>>>,
    traffic: Traffic,
    sync_timer: Timer,
    /// How its partitions are opened.
    settings: CatalogSettings,
    clock: SharedClock,
}

/// Bytes and records produced to and fetched from a topic since the broker
/// started: two relaxed additions per partition a request touches, read
/// when metrics are scraped.
#[derive(Debug, Default)]
pub struct Traffic {
    pub bytes_in: AtomicU64,
    pub records_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub records_out: AtomicU64,
}

impl Traffic {
    pub fn produced(&self, bytes: u64, records: u64) {
        self.bytes_in.fetch_add(bytes, Ordering::Relaxed);
        self.records_in.fetch_add(records, Ordering::Relaxed);
    }

    pub fn fetched(&self, bytes: u64, records: u64) {
        self.bytes_out.fetch_add(bytes, Ordering::Relaxed);
        self.records_out.fetch_add(records, Ordering::Relaxed);
    }
}

impl Topic {
    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn id(&self) -> Uuid {
        self.id
    }
    pub fn config(&self) -> TopicConfig {
        self.config.read().0.clone()
    }
    /// The effective configuration, parsed when it last changed.
    pub fn settings(&self) -> Arc<TopicSettings> {
        self.config.read().1.clone()
    }
    pub fn partition_count(&self) -> usize {
        self.partitions.read().len()
    }
    pub fn partition(&self, index: i32) -> Option<Arc<Partition>> {
        usize::try_from(index)
            .ok()
            .and_then(|i| self.partitions.read().get(i).cloned())
    }
    pub fn partitions(&self) -> Vec<Arc<Partition>> {
        self.partitions.read().clone()
    }
    pub fn traffic(&self) -> &Traffic {
        &self.traffic
    }
    pub fn is_internal(&self) -> bool {
        self.name.starts_with("__")
    }

    pub fn append_config(&self) -> AppendConfig {
        self.config.read().1.append
    }

    pub fn produce_policy(&self) -> ProducePolicy {
        self.config.read().1.produce
    }

    fn set_config(&self, config: TopicConfig) {
        *self.config.write() = parsed(config);
    }

    fn persist(&self) -> Result<(), CatalogError> {
        let file = TopicFile {
            id: self.id,
            partitions: self.partition_count() as u32,
            config: self.config(),
        };
        let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
        write_synced(&self.dir.join(TOPIC_FILE), &json)?;
        Ok(())
    }

    fn open_partitions(&self, count: usize) -> Result<(), CatalogError> {
        let mut parts = self.partitions.write();
        while parts.len() < count {
            let index = parts.len() as i32;
            let settings = PartitionSettings {
                visibility: self.settings.visibility,
                sync_timer: Some(self.sync_timer.clone()),
                head_sink: self.settings.head_sinks.as_ref().map(|f| f(self.id, index)),
                remote: (self.settings.remote_parts.as_ref())
                    .map(|f| f(&self.name, self.id, index)),
                backpressure: match self.is_internal() {
                    true => None,
                    false => self.settings.backpressure.clone(),
                },
                clock: self.clock.clone(),
            };
            let p = Partition::open(&self.dir.join(index.to_string()), settings)?;
            parts.push(Arc::new(p));
        }
        Ok(())
    }
}

/// A topic's overrides with their parsed reading.
fn parsed(config: TopicConfig) -> (TopicConfig, Arc<TopicSettings>) {
    let settings = Arc::new(config.settings());
    (config, settings)
}

/// A data directory before the catalog opens it: what a restore from the
/// object store may fill in, through the same files the catalog reads.
pub struct Seed {
    root: PathBuf,
}

impl Seed {
    pub fn new(data_dir: &Path) -> Result<Seed, CatalogError> {
        std::fs::create_dir_all(data_dir.join("topics"))?;
        Ok(Seed {
            root: data_dir.to_path_buf(),
        })
    }

    /// Never opened by a catalog: it has no cluster id yet.
    pub fn is_new(&self) -> bool {
        !self.root.join(CLUSTER_FILE).exists()
    }

    /// Adopts the cluster id a previous incarnation of this broker used.
    pub fn set_cluster_id(&self, cluster_id: &str) -> Result<(), CatalogError> {
        write_cluster_file(&self.root, cluster_id)
    }

    /// The local description of topic `name`, if any.
    pub fn topic(&self, name: &str) -> Option<TopicFile> {
        let bytes = std::fs::read(self.topic_dir(name).join(TOPIC_FILE)).ok()?;
        serde_json::from_slice(&bytes).ok()
    }

    /// Describes topic `name` locally as `file` says.
    pub fn add_topic(&self, name: &str, file: &TopicFile) -> Result<(), CatalogError> {
        validate_topic_name(name)?;
        let dir = self.topic_dir(name);
        std::fs::create_dir_all(&dir)?;
        let json = serde_json::to_vec_pretty(file).map_err(std::io::Error::other)?;
        write_synced(&dir.join(TOPIC_FILE), &json)?;
        Ok(())
    }

    /// Where partition `index` of topic `name` keeps its log.
    pub fn partition_dir(&self, name: &str, index: i32) -> PathBuf {
        self.topic_dir(name).join(index.to_string())
    }

    fn topic_dir(&self, name: &str) -> PathBuf {
        self.root.join("topics").join(name)
    }
}

fn write_cluster_file(data_dir: &Path, cluster_id: &str) -> Result<(), CatalogError> {
    let json = serde_json::to_vec(&ClusterFile {
        cluster_id: cluster_id.to_string(),
    })
    .map_err(std::io::Error::other)?;
    write_synced(&data_dir.join(CLUSTER_FILE), &json)?;
    Ok(())
}

/// How the catalog opens partitions.
#[derive(Clone, Default)]
pub struct CatalogSettings {
    /// How far readers see each partition's log.
    pub visibility: Visibility,
    /// Cluster mode: what makes each partition's appends durable (its
    /// part of the write-ahead log), by topic id and partition index.
    pub head_sinks: Option<HeadSinks>,
    /// Where each partition's log continues in the object store (the
    /// tier's `Remotes`), by topic name, topic id and partition index.
    pub remote_parts: Option<RemoteParts>,
    /// The broker-wide flag that refuses appends to user topics while
    /// uploads lag. Internal topics are exempt: consumers and transactions
    /// stall without their small writes.
    pub backpressure: Option<Arc<AtomicBool>>,
}

/// The head sink of a partition, by topic id and index.
pub type HeadSinks = Arc<dyn Fn(Uuid, i32) -> Arc<dyn HeadSink> + Send + Sync>;

/// The remote part of a partition's log, by topic name, id and index.
pub type RemoteParts = Arc<dyn Fn(&str, Uuid, i32) -> Arc<dyn RemoteLog> + Send + Sync>;

/// `broker-configs.json` and `group-configs.json`: configs by resource
/// name (for brokers, `""` is the default).
type ConfigsFile = BTreeMap<String, BTreeMap<String, String>>;

pub struct Catalog {
    root: PathBuf,
    /// Serializes rewrites of `broker-configs.json` and `group-configs.json`.
    configs_lock: parking_lot::Mutex<()>,
    topics: RwLock<HashMap<String, Arc<Topic>>>,
    pub cluster_id: String,
    producer_ids: ProducerIdAllocator,
    sync_timer: Timer,
    settings: CatalogSettings,
    /// Handed to every partition.
    clock: SharedClock,
    /// Topic ids and the cluster id.
    random: SharedRandom,
}

/// `cluster.json`; the tier keeps a copy in the object store.
#[derive(Serialize, Deserialize)]
pub struct ClusterFile {
    pub cluster_id: String,
}

impl Catalog {
    /// Opens the catalog under `data_dir`, recovering every partition, with
    /// the system's clock and randomness.
    pub fn open(data_dir: &Path, settings: CatalogSettings) -> Result<Catalog, CatalogError> {
        Catalog::open_with(data_dir, settings, clock::system(), clock::os_random())
    }

    /// Like `open`, with time read from `clock` and ids drawn from `random`.
    pub fn open_with(
        data_dir: &Path,
        settings: CatalogSettings,
        clock: SharedClock,
        random: SharedRandom,
    ) -> Result<Catalog, CatalogError> {
        let topics_dir = data_dir.join("topics");
        std::fs::create_dir_all(&topics_dir)?;
        std::fs::create_dir_all(data_dir.join("deleted"))?;
        let cluster_id = match std::fs::read(data_dir.join(CLUSTER_FILE))
            .ok()
            .and_then(|b| serde_json::from_slice::<ClusterFile>(&b).ok())
        {
            Some(c) => c.cluster_id,
            None => {
                let id = base64_uuid(random.uuid());
                write_cluster_file(data_dir, &id)?;
                id
            }
        };
        let sync_timer = Timer::default();
        let mut topics = HashMap::new();
        for entry in std::fs::read_dir(&topics_dir)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(bytes) = std::fs::read(entry.path().join(TOPIC_FILE)) else {
                tracing::warn!(dir = %entry.path().display(), "ignoring topic directory without topic.json");
                continue;
            };
            let file: TopicFile = serde_json::from_slice(&bytes).map_err(std::io::Error::other)?;
            let topic = Topic {
                name: name.clone(),
                id: file.id,
                dir: entry.path(),
                config: RwLock::new(parsed(file.config)),
                partitions: RwLock::new(Vec::new()),
                traffic: Traffic::default(),
                sync_timer: sync_timer.clone(),
                settings: settings.clone(),
                clock: clock.clone(),
            };
            topic.open_partitions(file.partitions as usize)?;
            topics.insert(name, Arc::new(topic));
        }
        let max_seen = topics
            .values()
            .flat_map(|t| t.partitions())
            .filter_map(|p| p.max_producer_id())
            .max();
        let producer_ids = ProducerIdAllocator::open(&data_dir.join("producer-ids"), max_seen)?;
        // Leftovers of deletions a crash interrupted.
        let _ = std::fs::remove_dir_all(data_dir.join("deleted"));
        std::fs::create_dir_all(data_dir.join("deleted"))?;
        Ok(Catalog {
            root: data_dir.to_path_buf(),
            configs_lock: parking_lot::Mutex::new(()),
            topics: RwLock::new(topics),
            cluster_id,
            producer_ids,
            sync_timer,
            settings,
            clock,
            random,
        })
    }

    /// Latencies of the fsyncs that make appends durable, every partition's.
    pub fn sync_timer(&self) -> &Timer {
        &self.sync_timer
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn topic(&self, name: &str) -> Option<Arc<Topic>> {
        self.topics.read().get(name).cloned()
    }

    pub fn topic_by_id(&self, id: Uuid) -> Option<Arc<Topic>> {
        self.topics.read().values().find(|t| t.id == id).cloned()
    }

    /// All topics, sorted by name.
    pub fn topics(&self) -> Vec<Arc<Topic>> {
        let mut v: Vec<_> = self.topics.read().values().cloned().collect();
        v.sort_by(|a, b| a.name.cmp(&b.name));
        v
    }

    pub fn allocate_producer_id(&self) -> Result<i64, CatalogError> {
        Ok(self.producer_ids.allocate()?)
    }

    /// Checks that a topic could be created (name, partitions, replication, configs)
    /// with `brokers` brokers registered; its configs and replication factor.
    pub fn validate_new_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        brokers: usize,
        config: &[(&str, Option<&str>)],
    ) -> Result<(TopicConfig, i16), CatalogError> {
        validate_topic_name(name)?;
        if self.topics.read().contains_key(name) {
            return Err(CatalogError::TopicExists(name.to_string()));
        }
        if partitions <= 0 {
            return Err(CatalogError::InvalidPartitions(
                "Number of partitions must be larger than 0.".into(),
            ));
        }
        let factor = replication_factor_for(replication_factor, brokers)?;
        let config =
            TopicConfig::from_pairs(config.iter().copied()).map_err(CatalogError::InvalidConfig)?;
        Ok((config, factor))
    }

    pub fn create_topic(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        config: &[(&str, Option<&str>)],
    ) -> Result<Arc<Topic>, CatalogError> {
        let (config, _) =
            self.validate_new_topic(name, partitions, replication_factor, 1, config)?;
        let mut topics = self.topics.write();
        if topics.contains_key(name) {
            return Err(CatalogError::TopicExists(name.to_string()));
        }
        self.insert_topic(&mut topics, name, self.random.uuid(), partitions, config)
    }

    /// Makes the local catalog hold topic `name` as the cluster describes it
    /// (cluster mode): created with the cluster's id, grown to `partitions`,
    /// with `config`. A local topic of the same name but another id is an
    /// older incarnation and is replaced.
    pub fn adopt_topic(
        &self,
        name: &str,
        id: Uuid,
        partitions: i32,
        config: TopicConfig,
    ) -> Result<Arc<Topic>, CatalogError> {
        validate_topic_name(name)?;
        if let Some(t) = self.topic(name) {
            if t.id == id {
                let grown = t.partition_count() < partitions as usize;
                let changed = t.config.read().0 != config;
                if grown {
                    t.open_partitions(partitions as usize)?;
                }
                if changed {
                    t.set_config(config);
                }
                if grown || changed {
                    t.persist()?;
                }
                return Ok(t);
            }
            self.delete_topic(name)?;
        }
        let mut topics = self.topics.write();
        self.insert_topic(&mut topics, name, id, partitions, config)
    }

    fn insert_topic(
        &self,
        topics: &mut HashMap<String, Arc<Topic>>,
        name: &str,
        id: Uuid,
        partitions: i32,
        config: TopicConfig,
    ) -> Result<Arc<Topic>, CatalogError> {
        let dir = self.root.join("topics").join(name);
        if dir.exists() {
            std::fs::remove_dir_all(&dir)?;
        }
        std::fs::create_dir_all(&dir)?;
        let topic = Topic {
            name: name.to_string(),
            id,
            dir,
            config: RwLock::new(parsed(config)),
            partitions: RwLock::new(Vec::new()),
            traffic: Traffic::default(),
            sync_timer: self.sync_timer.clone(),
            settings: self.settings.clone(),
            clock: self.clock.clone(),
        };
        topic.open_partitions(partitions as usize)?;
        topic.persist()?;
        crate::log::segment::sync_dir(&self.root.join("topics"))?;
        let topic = Arc::new(topic);
        topics.insert(name.to_string(), topic.clone());
        tracing::info!(topic = name, partitions, "created topic");
        Ok(topic)
    }

    pub fn delete_topic(&self, name: &str) -> Result<Uuid, CatalogError> {
        let topic = self
            .topics
            .write()
            .remove(name)
            .ok_or(CatalogError::UnknownTopic)?;
        let graveyard = self
            .root
            .join("deleted")
            .join(format!("{}-{}", topic.name, topic.id));
        std::fs::rename(&topic.dir, &graveyard)?;
        crate::log::segment::sync_dir(&self.root.join("topics"))?;
        std::thread::spawn(move || {
            if let Err(e) = std::fs::remove_dir_all(&graveyard) {
                tracing::warn!(dir = %graveyard.display(), error = %e, "could not remove deleted topic");
            }
        });
        tracing::info!(topic = name, "deleted topic");
        Ok(topic.id)
    }

    /// Grows a topic to `count` partitions (Kafka never shrinks them).
    pub fn create_partitions(
        &self,
        name: &str,
        count: i32,
        validate_only: bool,
    ) -> Result<(), CatalogError> {
        let topic = self.topic(name).ok_or(CatalogError::UnknownTopic)?;
        let current = topic.partition_count() as i32;
        if count < current {
            return Err(CatalogError::InvalidPartitions(format!(
                "Topic currently has {current} partitions, which is higher than the requested {count}."
            )));
        }
        if count == current {
            return Err(CatalogError::InvalidPartitions(format!(
                "Topic already has {current} partitions."
            )));
        }
        if validate_only {
            return Ok(());
        }
        topic.open_partitions(count as usize)?;
        topic.persist()
    }

    /// The dynamic broker configs stored for `resource`: `""` is the cluster
    /// default, a broker id that broker's own.
    pub fn broker_configs(&self, resource: &str) -> Result<BTreeMap<String, String>, CatalogError> {
        Ok(self
            .read_json::<ConfigsFile>(BROKER_CONFIGS_FILE)?
            .remove(resource)
            .unwrap_or_default())
    }

    /// Replaces the dynamic broker configs of `resource`, durably.
    pub fn set_broker_configs(
        &self,
        resource: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        self.set_configs(BROKER_CONFIGS_FILE, resource, configs)
    }

    /// Every group's config overrides (the GROUP config resource).
    pub fn group_configs(&self) -> Result<ConfigsFile, CatalogError> {
        self.read_json(GROUP_CONFIGS_FILE)
    }

    /// Replaces the config overrides of `group`, durably.
    pub fn set_group_configs(
        &self,
        group: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        self.set_configs(GROUP_CONFIGS_FILE, group, configs)
    }

    fn set_configs(
        &self,
        file: &str,
        resource: &str,
        configs: BTreeMap<String, String>,
    ) -> Result<(), CatalogError> {
        let _one_writer = self.configs_lock.lock();
        let mut all: ConfigsFile = self.read_json(file)?;
        if configs.is_empty() {
            all.remove(resource);
        } else {
            all.insert(resource.to_string(), configs);
        }
        self.write_json(file, &all)
    }

    /// The finalized feature levels as stored (KIP-584), opaque here.
    pub fn features(&self) -> Result<BTreeMap<String, String>, CatalogError> {
        self.read_json(FEATURES_FILE)
    }

    /// Replaces the stored feature levels, durably.
    pub fn set_features(&self, features: &BTreeMap<String, String>) -> Result<(), CatalogError> {
        self.write_json(FEATURES_FILE, features)
    }

    fn read_json<T: Default + serde::de::DeserializeOwned>(
        &self,
        file: &str,
    ) -> Result<T, CatalogError> {
        match std::fs::read(self.root.join(file)) {
            Ok(bytes) => Ok(serde_json::from_slice(&bytes).map_err(std::io::Error::other)?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(T::default()),
            Err(e) => Err(e.into()),
        }
    }

    fn write_json<T: Serialize>(&self, file: &str, value: &T) -> Result<(), CatalogError> {
        let json = serde_json::to_vec_pretty(value).map_err(std::io::Error::other)?;
        write_synced(&self.root.join(file), &json)?;
        Ok(())
    }

    /// Applies config changes: `Some` sets, `None` deletes. With `replace`,
    /// every override not named is removed (legacy AlterConfigs).
    pub fn alter_config(
        &self,
        name: &str,
        changes: &[(&str, Option<&str>)],
        replace: bool,
        validate_only: bool,
    ) -> Result<(), CatalogError> {
        let next = self.altered_config(name, changes, replace)?;
        if validate_only {
            return Ok(());
        }
        let topic = self.topic(name).ok_or(CatalogError::UnknownTopic)?;
        topic.set_config(next);
        topic.persist()
    }

    /// The topic's config with `changes` applied, validated but not stored
    /// (in cluster mode etcd stores it, and every catalog follows).
    pub fn altered_config(
        &self,
        name: &str,
        changes: &[(&str, Option<&str>)],
        replace: bool,
    ) -> Result<TopicConfig, CatalogError> {
        let topic = self.topic(name).ok_or(CatalogError::UnknownTopic)?;
        let mut next = if replace {
            TopicConfig::default()
        } else {
            topic.config()
        };
        for (k, v) in changes {
            next.set(k, *v).map_err(CatalogError::InvalidConfig)?;
        }
        next.check_together().map_err(CatalogError::InvalidConfig)?;
        Ok(next)
    }

    /// Every partition of every topic (for background flushing and shutdown).
    pub fn all_partitions(&self) -> Vec<Arc<Partition>> {
        self.topics
            .read()
            .values()
            .flat_map(|t| t.partitions())
            .collect()
    }
}

/// Kafka prints cluster ids as URL-safe base64 of a UUID without padding.
fn base64_uuid(id: Uuid) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let bytes = id.as_bytes();
    let mut out = String::new();
    let mut acc = 0u32;
    let mut bits = 0;
    for &b in bytes {
        acc = (acc << 8) | b as u32;
        bits += 8;
        while bits >= 6 {
            bits -= 6;
            out.push(ALPHABET[((acc >> bits) & 63) as usize] as char);
        }
    }
    if bits > 0 {
        out.push(ALPHABET[((acc << (6 - bits)) & 63) as usize] as char);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replication_factor_is_refused_beyond_the_registered_brokers() {
        assert_eq!(replication_factor_for(3, 3).unwrap(), 3);
        assert_eq!(replication_factor_for(1, 1).unwrap(), 1);
        let e = replication_factor_for(2, 1).unwrap_err();
        assert!(matches!(e, CatalogError::InvalidReplicationFactor(_)));
        assert_eq!(
            e.to_string(),
            "Unable to replicate the partition 2 time(s): The target replication factor of 2 cannot be reached because only 1 broker(s) are registered."
        );
        assert!(replication_factor_for(4, 3).is_err());
    }

    #[test]
    fn replication_factor_minus_one_is_the_default_and_zero_is_refused() {
        assert_eq!(
            replication_factor_for(-1, 3).unwrap(),
            DEFAULT_REPLICATION_FACTOR
        );
        for bad in [0, -2] {
            assert!(matches!(
                replication_factor_for(bad, 3),
                Err(CatalogError::InvalidReplicationFactor(_))
            ));
        }
    }

    #[test]
    fn topic_names_follow_kafka_rules() {
        assert!(validate_topic_name("orders.v1_x-2").is_ok());
        for bad in ["", ".", "..", "a/b", "sp ace", &"x".repeat(250)] {
            assert!(
                matches!(validate_topic_name(bad), Err(CatalogError::InvalidTopic(_))),
                "{bad}"
            );
        }
    }

    /// Ids come from the catalog's `Random`: a seed repeats them.
    #[test]
    fn cluster_and_topic_ids_come_from_the_random() {
        use crate::clock::{Random, SeededRandom};
        let open = |dir: &Path| {
            let random = Arc::new(SeededRandom::new(5));
            Catalog::open_with(dir, Default::default(), clock::system(), random).unwrap()
        };
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (ca, cb) = (open(a.path()), open(b.path()));
        let expected = SeededRandom::new(5);
        assert_eq!(ca.cluster_id(), base64_uuid(expected.uuid()));
        assert_eq!(ca.cluster_id(), cb.cluster_id());
        let (ta, tb) = (
            ca.create_topic("t", 1, 1, &[]).unwrap(),
            cb.create_topic("t", 1, 1, &[]).unwrap(),
        );
        assert_eq!(ta.id(), expected.uuid());
        assert_eq!(ta.id(), tb.id());
    }

    #[test]
    fn topics_survive_reopen_and_deletion_is_final() {
        let dir = tempfile::tempdir().unwrap();
        let cat = Catalog::open(dir.path(), Default::default()).unwrap();
        let t = cat
            .create_topic("a", 2, 1, &[("retention.ms", Some("1000"))])
            .unwrap();
        let id = t.id();
        assert!(matches!(
            cat.create_topic("a", 1, 1, &[]),
            Err(CatalogError::TopicExists(_))
        ));
        cat.create_partitions("a", 4, false).unwrap();
        cat.create_topic("b", 1, 1, &[]).unwrap();
        cat.delete_topic("b").unwrap();
        let cluster = cat.cluster_id().to_string();
        drop(cat);
        let cat = Catalog::open(dir.path(), Default::default()).unwrap();
        let t = cat.topic("a").unwrap();
        assert_eq!((t.id(), t.partition_count()), (id, 4));
        assert_eq!(t.config().get("retention.ms"), Some(("1000", true)));
        assert!(cat.topic("b").is_none());
        assert_eq!(cat.cluster_id(), cluster);
        assert_eq!(cluster.len(), 22);
    }
}
