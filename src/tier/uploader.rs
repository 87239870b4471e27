//! The tier's background loop: for every partition, roll a segment that
//! `segment.ms` made due, upload sealed segments and publish them in the next
//! manifest version, apply retention and DeleteRecords to the manifest, and
//! delete local files the manifest now covers. It never holds a partition
//! lock across I/O, so produce is never blocked by the store; if uploads lag
//! by more than `--max-pending-upload-bytes`, produce is refused with a
//! retriable error instead of filling the disk.

use std::collections::HashMap;
use std::path::Path as FsPath;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use parking_lot::Mutex;
use tokio::sync::watch;
use tokio::time::Instant;
use uuid::Uuid;

use super::cache::BlockCache;
use super::manifest::{Manifest, ManifestStore, TieredSegment, WriterEpoch};
use super::remote::TieredPartition;
use super::{objects, partition_prefix, segment_key, topic_prefix, TierError};
use crate::catalog::{Catalog, Topic, TopicFile};
use crate::compaction::scheduler::{Scheduler, SchedulerSettings};
use crate::compaction::LocalSegment;
use crate::config::BrokerConfig;
use crate::log::segment::SegmentMeta;
use crate::log::{now_ms, Partition};

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Partitions worked on at once.
const CONCURRENCY: usize = 4;
/// A compaction job not done after this long is queued again.
const REQUEUE_AFTER: Duration = Duration::from_secs(300);
/// A partition's turn that makes no progress for this long is abandoned and retried.
const TEND_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Default)]
pub struct TierStats {
    pub segments_uploaded: AtomicU64,
    pub bytes_uploaded: AtomicU64,
    pub puts: AtomicU64,
    pub upload_failures: AtomicU64,
}

struct Backoff {
    next_try: Instant,
    delay: Duration,
}

struct Entry {
    remote: Arc<TieredPartition>,
    backoff: Mutex<Backoff>,
}

pub struct Tier {
    store: Arc<dyn ObjectStore>,
    catalog: Arc<Catalog>,
    cache: BlockCache,
    writer: WriterEpoch,
    partitions: Mutex<HashMap<(Uuid, i32), Arc<Entry>>>,
    /// topic.json as last written to the store, by topic id.
    synced_topics: Mutex<HashMap<Uuid, (String, Vec<u8>)>>,
    backpressure: Arc<AtomicBool>,
    max_pending: u64,
    interval: Duration,
    pub scheduler: Scheduler,
    orphan_min_age: Duration,
    orphan_scan_interval: Duration,
    last_orphan_scan: Mutex<Instant>,
    pub stats: TierStats,
}

impl Tier {
    /// Attaches every partition to its manifest (so reads of tiered offsets
    /// work before the first client connects).
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        catalog: Arc<Catalog>,
        config: &BrokerConfig,
    ) -> Result<Arc<Tier>, TierError> {
        let orphan_min_age = Duration::from_millis(config.orphan_min_age_ms);
        let scheduler = Scheduler::open(
            catalog.clone(),
            SchedulerSettings {
                delete_delay_ms: config.compaction_delete_delay_ms,
                max_run_ms: config.orphan_min_age_ms / 2,
                requeue_after: REQUEUE_AFTER,
            },
        )
        .map_err(|e| TierError::Config(e.to_string()))?;
        let tier = Arc::new(Tier {
            cache: BlockCache::new(store.clone(), config.cache_bytes),
            store,
            catalog,
            writer: WriterEpoch::new(config.node_id),
            partitions: Mutex::new(HashMap::new()),
            synced_topics: Mutex::new(HashMap::new()),
            backpressure: Arc::new(AtomicBool::new(false)),
            max_pending: config.max_pending_upload_bytes,
            interval: Duration::from_millis(config.tier_interval_ms.max(10)),
            scheduler,
            orphan_min_age,
            orphan_scan_interval: Duration::from_millis(config.orphan_scan_interval_ms),
            last_orphan_scan: Mutex::new(Instant::now()),
            stats: TierStats::default(),
        });
        // Until its manifest is loaded a partition cannot tell tiered offsets
        // from a gap, so the broker does not start without the store.
        let work = all_partitions(&tier.catalog);
        futures::stream::iter(work.iter().map(|(t, i, p)| tier.entry(t, *i, p)))
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        tier.put_cluster_file().await?;
        Ok(tier)
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.store
    }

    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    /// Runs passes until `stop` turns true.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                changed = stop.changed() => {
                    if changed.is_err() || *stop.borrow() {
                        return;
                    }
                }
                _ = tick.tick() => self.pass().await,
            }
        }
    }

    /// The remote part of a partition, once attached.
    pub fn remote(&self, topic_id: Uuid, partition: i32) -> Option<Arc<TieredPartition>> {
        self.partitions
            .lock()
            .get(&(topic_id, partition))
            .map(|e| e.remote.clone())
    }

    /// The durable manifest of a partition, by topic name.
    pub fn manifest_of(&self, topic: &str, partition: i32) -> Option<Arc<Manifest>> {
        let id = self.catalog.topic(topic)?.id();
        self.remote(id, partition).map(|r| r.manifest())
    }

    /// Takes a manifest a compaction worker in this process just wrote.
    pub fn adopt(&self, topic_id: Uuid, partition: i32, manifest: &Manifest) {
        if let Some(remote) = self.remote(topic_id, partition) {
            remote.adopt(manifest.clone());
        }
    }

    /// Whether produce is being refused because uploads lag.
    pub fn backpressure_active(&self) -> bool {
        self.backpressure.load(Ordering::Relaxed)
    }

    async fn put_cluster_file(&self) -> Result<(), TierError> {
        let json = serde_json::json!({ "cluster_id": self.catalog.cluster_id() }).to_string();
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&Path::from("cluster.json"), Bytes::from(json).into(), opts)
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(object_store::Error::Precondition { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// The partition's tier state, loading its manifest the first time.
    async fn entry(
        &self,
        topic: &Topic,
        index: i32,
        partition: &Arc<Partition>,
    ) -> Result<Arc<Entry>, TierError> {
        let key = (topic.id(), index);
        if let Some(e) = self.partitions.lock().get(&key) {
            return Ok(e.clone());
        }
        let prefix = partition_prefix(topic.name(), topic.id(), index);
        let manifests = ManifestStore::new(self.store.clone(), prefix.child("manifest"));
        let manifest = manifests
            .load_latest()
            .await?
            .unwrap_or_else(|| Manifest::empty(self.writer.clone()));
        let remote = Arc::new(TieredPartition::new(
            topic.name(),
            topic.id(),
            index,
            manifests,
            prefix,
            manifest,
            self.cache.clone(),
        ));
        partition.attach_remote(remote.clone());
        partition.attach_backpressure(self.backpressure.clone());
        let entry = Arc::new(Entry {
            remote,
            backoff: Mutex::new(Backoff {
                next_try: Instant::now(),
                delay: BACKOFF_MIN,
            }),
        });
        Ok(self.partitions.lock().entry(key).or_insert(entry).clone())
    }

    /// One pass over every topic and partition.
    pub async fn pass(&self) {
        if let Err(e) = self.sync_topics().await {
            tracing::warn!(error = %e, "syncing topic descriptions to the store failed");
        }
        let work = all_partitions(&self.catalog);
        // Backpressure is judged before any store call, so a stalled store
        // cannot keep the flag from rising.
        let mut pending = 0u64;
        for (topic, index, partition) in &work {
            if let Err(e) = partition.roll_if_due(&topic.append_config()) {
                tracing::warn!(topic = topic.name(), partition = index, error = %e, "rolling an idle segment failed");
            }
            let end = self
                .remote(topic.id(), *index)
                .and_then(|r| r.manifest().end_offset())
                .unwrap_or(i64::MIN);
            pending += partition
                .sealed_segments()
                .iter()
                .filter(|s| s.base_offset >= end)
                .map(|s| s.size)
                .sum::<u64>();
        }
        let over = pending > self.max_pending;
        if self.backpressure.swap(over, Ordering::Relaxed) != over {
            if over {
                tracing::warn!(
                    pending,
                    limit = self.max_pending,
                    "uploads lag: refusing produce until they catch up"
                );
            } else {
                tracing::info!(pending, "uploads caught up: accepting produce again");
            }
        }
        let scan_due = {
            let mut last = self.last_orphan_scan.lock();
            let due = last.elapsed() >= self.orphan_scan_interval;
            if due {
                *last = Instant::now();
            }
            due
        };
        if scan_due {
            self.scan_orphans().await;
        }
        futures::stream::iter(work)
            .for_each_concurrent(CONCURRENCY, |(topic, index, partition)| async move {
                let result =
                    tokio::time::timeout(TEND_TIMEOUT, self.tend(&topic, index, &partition)).await;
                let error = match result {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => format!("no progress in {TEND_TIMEOUT:?}"),
                };
                self.stats.upload_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    topic = topic.name(),
                    partition = index,
                    error,
                    "tiering failed; will retry"
                );
            })
            .await;
    }

    /// Uploads, expires and releases one partition, unless it is backing
    /// off after a failure.
    async fn tend(
        &self,
        topic: &Topic,
        index: i32,
        partition: &Arc<Partition>,
    ) -> Result<(), TierError> {
        let entry = self.entry(topic, index, partition).await?;
        let remote = &entry.remote;
        if Instant::now() < entry.backoff.lock().next_try {
            return Ok(());
        }
        let result = self.tend_now(topic, partition, remote).await;
        let mut b = entry.backoff.lock();
        match &result {
            Ok(()) => b.delay = BACKOFF_MIN,
            Err(_) => {
                b.next_try = Instant::now() + b.delay;
                b.delay = (b.delay * 2).min(BACKOFF_MAX);
            }
        }
        result
    }

    async fn tend_now(
        &self,
        topic: &Topic,
        partition: &Arc<Partition>,
        remote: &TieredPartition,
    ) -> Result<(), TierError> {
        // Upload sealed segments beyond the manifest, oldest first.
        let end = remote.manifest().end_offset().unwrap_or(i64::MIN);
        let start = partition.log_start_offset();
        let todo: Vec<SegmentMeta> = partition
            .sealed_segments()
            .into_iter()
            .filter(|s| s.base_offset >= end && s.size > 0 && s.next_offset > start)
            .collect();
        if !todo.is_empty() {
            let mut uploaded = Vec::with_capacity(todo.len());
            let compact = topic.config().compact();
            for meta in &todo {
                if compact {
                    // Merges read the key index from the store; building it
                    // here (if the build after sealing has not finished)
                    // saves every merge from rebuilding it from the log.
                    let (dir, base) = (partition.dir().to_path_buf(), meta.base_offset);
                    tokio::task::spawn_blocking(move || {
                        LocalSegment::open(&dir, base)?.ensure_key_index()
                    })
                    .await
                    .map_err(|e| TierError::Corrupt(format!("key index task: {e}")))?
                    .map_err(|e| TierError::Corrupt(format!("key index of {base}: {e}")))?;
                }
                let key = segment_key(&remote.prefix, meta.base_offset, meta.level);
                self.upload_segment(partition.dir(), meta, &key).await?;
                uploaded.push(TieredSegment::from_meta(key, meta));
            }
            self.commit(remote, |m| {
                let end = m.end_offset().unwrap_or(i64::MIN);
                m.segments
                    .extend(uploaded.iter().filter(|s| s.base_offset >= end).cloned());
            })
            .await?;
        }
        self.expire(topic, partition, remote).await?;
        // The manifest is durable: local copies of what it holds can go.
        let tiered_end = remote.manifest().end_offset().unwrap_or(i64::MIN);
        for meta in partition.sealed_segments() {
            if meta.next_offset <= tiered_end || meta.size == 0 {
                partition.release_local(meta.base_offset)?;
            }
        }
        self.schedule(topic, remote).await
    }

    /// Queues the merges the topic's policy wants, if any, against the
    /// latest manifest (a worker may have changed it since this broker
    /// last wrote or read it).
    async fn schedule(&self, topic: &Topic, remote: &TieredPartition) -> Result<(), TierError> {
        let index = remote.index;
        if self
            .scheduler
            .due(topic, index, &remote.manifest())
            .is_empty()
            && !self.scheduler.should_check(topic.id(), index)
        {
            return Ok(());
        }
        remote.refresh().await?;
        for job in self.scheduler.due(topic, index, &remote.manifest()) {
            self.scheduler.queue(job)?;
        }
        Ok(())
    }

    /// Deletes segment objects no manifest names (see `objects::collect_orphans`).
    async fn scan_orphans(&self) {
        let remotes: Vec<Arc<TieredPartition>> = self
            .partitions
            .lock()
            .values()
            .map(|e| e.remote.clone())
            .collect();
        for remote in remotes {
            let result = async {
                remote.refresh().await?;
                objects::collect_orphans(
                    &self.store,
                    &remote.prefix,
                    &remote.manifest(),
                    self.orphan_min_age,
                )
                .await
            }
            .await;
            match result {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(topic = %remote.topic, partition = remote.index, objects = n, "deleted orphaned objects")
                }
                Err(e) => {
                    tracing::warn!(topic = %remote.topic, partition = remote.index, error = %e, "orphan scan failed")
                }
            }
        }
        let live: Vec<Uuid> = self.catalog.topics().iter().map(|t| t.id()).collect();
        match objects::collect_deleted_topics(&self.store, &live, self.orphan_min_age).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(objects = n, "deleted leftovers of deleted topics"),
            Err(e) => tracing::warn!(error = %e, "scan for deleted topics' leftovers failed"),
        }
    }

    /// Applies retention.ms / retention.bytes and DeleteRecords to the
    /// manifest, then deletes the objects of dropped segments.
    async fn expire(
        &self,
        topic: &Topic,
        partition: &Arc<Partition>,
        remote: &TieredPartition,
    ) -> Result<(), TierError> {
        let m = remote.manifest();
        let cfg = topic.config();
        let number = |name: &str| {
            cfg.get(name)
                .and_then(|(v, _)| v.parse::<i64>().ok())
                .unwrap_or(-1)
        };
        let deletes = cfg
            .get("cleanup.policy")
            .is_some_and(|(v, _)| v.split(',').any(|p| p.trim() == "delete"));
        let mut start = partition.log_start_offset();
        if deletes {
            let live: Vec<&TieredSegment> = m
                .segments
                .iter()
                .filter(|s| s.next_offset > start)
                .collect();
            let retention_ms = number("retention.ms");
            if retention_ms >= 0 {
                let cutoff = now_ms().saturating_sub(retention_ms);
                for s in &live {
                    if s.max_timestamp >= cutoff {
                        break;
                    }
                    start = start.max(s.next_offset);
                }
            }
            let retention_bytes = number("retention.bytes");
            if retention_bytes >= 0 {
                let tiered_end = m.end_offset().unwrap_or(i64::MIN);
                let local: u64 = partition
                    .local_segment_sizes()
                    .iter()
                    .filter(|(base, _)| *base >= tiered_end)
                    .map(|(_, size)| size)
                    .sum();
                let mut total: u64 = local
                    + live
                        .iter()
                        .filter(|s| s.next_offset > start)
                        .map(|s| s.size)
                        .sum::<u64>();
                let candidates: Vec<&TieredSegment> = live
                    .iter()
                    .copied()
                    .filter(|s| s.next_offset > start)
                    .collect();
                for s in candidates {
                    if total.saturating_sub(s.size) < retention_bytes as u64 {
                        break;
                    }
                    total -= s.size;
                    start = s.next_offset;
                }
            }
            if start > partition.log_start_offset() {
                // Local first: from here on no reader is served below `start`.
                partition.delete_records(start)?;
            }
        }
        let start = partition.log_start_offset();
        if start <= m.log_start_offset {
            return Ok(());
        }
        let dropped: Vec<TieredSegment> = m
            .segments
            .iter()
            .filter(|s| s.next_offset <= start)
            .cloned()
            .collect();
        self.commit(remote, |m| {
            m.log_start_offset = m.log_start_offset.max(start);
            m.segments.retain(|s| s.next_offset > start);
        })
        .await?;
        // Only now that no durable manifest names them may the objects go.
        for s in dropped {
            objects::delete_segment(&self.store, &s.key).await?;
            self.cache.forget(&s.key, s.size).await;
        }
        Ok(())
    }

    /// Writes the next manifest version with `edit` applied, on top of
    /// whatever a compaction worker or an earlier run of this broker wrote.
    async fn commit(
        &self,
        remote: &TieredPartition,
        edit: impl Fn(&mut Manifest),
    ) -> Result<(), TierError> {
        let next = remote
            .manifests
            .commit(&remote.manifest(), &self.writer, |m| {
                edit(m);
                Ok(())
            })
            .await?;
        self.stats.puts.fetch_add(1, Ordering::Relaxed);
        remote.set_manifest(next);
        Ok(())
    }

    async fn upload_segment(
        &self,
        dir: &FsPath,
        meta: &SegmentMeta,
        key: &str,
    ) -> Result<(), TierError> {
        let puts = objects::upload_segment(&self.store, dir, meta, key).await?;
        self.stats.puts.fetch_add(puts, Ordering::Relaxed);
        self.stats.segments_uploaded.fetch_add(1, Ordering::Relaxed);
        self.stats
            .bytes_uploaded
            .fetch_add(meta.size, Ordering::Relaxed);
        tracing::debug!(key, size = meta.size, "uploaded segment");
        Ok(())
    }

    /// Keeps `topic.json` in the store equal to the catalog's, and removes
    /// the objects of topics deleted since.
    async fn sync_topics(&self) -> Result<(), TierError> {
        let topics: Vec<Arc<Topic>> = self.catalog.topics();
        for t in &topics {
            let file = TopicFile {
                id: t.id(),
                partitions: t.partition_count() as u32,
                config: t.config(),
            };
            let json =
                serde_json::to_vec_pretty(&file).map_err(|e| TierError::Corrupt(e.to_string()))?;
            let unchanged = self
                .synced_topics
                .lock()
                .get(&t.id())
                .is_some_and(|(_, j)| *j == json);
            if unchanged {
                continue;
            }
            self.store
                .put(
                    &topic_prefix(t.name(), t.id()).child("topic.json"),
                    PutPayload::from(Bytes::from(json.clone())),
                )
                .await?;
            self.stats.puts.fetch_add(1, Ordering::Relaxed);
            self.synced_topics
                .lock()
                .insert(t.id(), (t.name().to_string(), json));
        }
        let gone: Vec<(Uuid, String)> = self
            .synced_topics
            .lock()
            .iter()
            .filter(|(id, _)| !topics.iter().any(|t| t.id() == **id))
            .map(|(id, (name, _))| (*id, name.clone()))
            .collect();
        for (id, name) in gone {
            self.partitions.lock().retain(|(tid, _), _| *tid != id);
            let prefix = topic_prefix(&name, id);
            // topic.json first: without it a restore ignores the leftovers.
            match self.store.delete(&prefix.child("topic.json")).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let keys: Vec<_> = self.store.list(Some(&prefix)).try_collect().await?;
            for k in keys {
                match self.store.delete(&k.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            self.synced_topics.lock().remove(&id);
            tracing::info!(topic = name, "deleted topic's objects from the store");
        }
        Ok(())
    }
}

/// Every (topic, partition index, partition): all are tiered, internal
/// topics too, so a wiped data directory gets `__consumer_offsets` back.
fn all_partitions(catalog: &Catalog) -> Vec<(Arc<Topic>, i32, Arc<Partition>)> {
    catalog
        .topics()
        .into_iter()
        .flat_map(|t| {
            t.partitions()
                .into_iter()
                .enumerate()
                .map(move |(i, p)| (t.clone(), i as i32, p))
                .collect::<Vec<_>>()
        })
        .collect()
}
