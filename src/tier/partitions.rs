//! The partitions this broker tiers, each attached to its manifest, and what
//! every tier job shares: the store, the cache, this run's writer epoch.
//!
//! A partition's remote part is made with the partition: the catalog asks
//! [`Remotes`] for it when it opens the partition, so the log never has one
//! set later. It starts with an empty manifest, which reads like no remote
//! part at all, and the tier loads the real manifest when it attaches it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use parking_lot::Mutex;
use std::time::Instant;
use uuid::Uuid;

use super::cache::BlockCache;
use super::remote::TieredPartition;
use super::TierError;
use crate::catalog::{Catalog, RemoteParts, Topic};
use crate::clock::SharedClock;
use crate::log::{Partition, RemoteLog};
use crate::manifest::{manifest_dir, partition_prefix, Manifest, ManifestStore, WriterEpoch};

#[derive(Debug, Default)]
pub struct TierStats {
    pub segments_uploaded: AtomicU64,
    pub bytes_uploaded: AtomicU64,
    pub puts: AtomicU64,
    pub upload_failures: AtomicU64,
    /// Sealed bytes not yet in the store, as of the uploader's last pass.
    pub pending_upload_bytes: AtomicU64,
    pub pending_upload_segments: AtomicU64,
    /// Of each sealed segment's objects.
    pub upload_latency: crate::metrics::Timer,
}

/// Whether this broker tends a partition (topic id, index).
pub type Scope = Arc<dyn Fn(Uuid, i32) -> bool + Send + Sync>;

/// The remote part of every partition the catalog opened, by (topic id,
/// index).
pub struct Remotes {
    store: Arc<dyn ObjectStore>,
    cache: BlockCache,
    writer: WriterEpoch,
    parts: Mutex<HashMap<(Uuid, i32), Arc<TieredPartition>>>,
}

impl Remotes {
    /// Built before the catalog, which takes [`Remotes::parts`].
    pub fn new(
        store: Arc<dyn ObjectStore>,
        settings: &super::TierSettings,
        clock: &SharedClock,
    ) -> Arc<Remotes> {
        Arc::new(Remotes {
            cache: BlockCache::new(store.clone(), settings.cache_bytes),
            store,
            // The tier is handed no `Random` yet: its writer nonce is the OS's.
            writer: WriterEpoch::new(settings.node_id, clock.as_ref(), &crate::clock::OsRandom),
            parts: Mutex::new(HashMap::new()),
        })
    }

    /// What the catalog calls for each partition it opens.
    pub fn parts(self: &Arc<Self>) -> RemoteParts {
        let remotes = self.clone();
        Arc::new(move |topic, topic_id, index| {
            let part: Arc<dyn RemoteLog> = remotes.part(topic, topic_id, index);
            part
        })
    }

    fn part(&self, topic: &str, topic_id: Uuid, index: i32) -> Arc<TieredPartition> {
        let mut parts = self.parts.lock();
        let part = parts.entry((topic_id, index)).or_insert_with(|| {
            let prefix = partition_prefix(topic, topic_id, index);
            let manifests = ManifestStore::new(self.store.clone(), manifest_dir(&prefix));
            Arc::new(TieredPartition::new(
                topic,
                topic_id,
                index,
                manifests,
                prefix,
                Manifest::empty(self.writer.clone()),
                self.cache.clone(),
            ))
        });
        part.clone()
    }

    /// The parts whose manifest is loaded, by (topic id, index).
    fn loaded(&self) -> Vec<((Uuid, i32), Arc<TieredPartition>)> {
        let parts = self.parts.lock();
        let loaded = parts.iter().filter(|(_, part)| part.is_loaded());
        loaded.map(|(key, part)| (*key, part.clone())).collect()
    }
}

pub(super) struct TieredPartitions {
    pub(super) clock: SharedClock,
    /// Set in cluster mode: only the partitions this broker leads.
    scope: Option<Scope>,
    remotes: Arc<Remotes>,
    pub(super) catalog: Arc<Catalog>,
    pub(super) writer: WriterEpoch,
    pub(super) stats: TierStats,
}

impl TieredPartitions {
    pub(super) fn new(
        remotes: Arc<Remotes>,
        catalog: Arc<Catalog>,
        scope: Option<Scope>,
        clock: SharedClock,
    ) -> TieredPartitions {
        TieredPartitions {
            writer: remotes.writer.clone(),
            clock,
            scope,
            remotes,
            catalog,
            stats: TierStats::default(),
        }
    }

    pub(super) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.remotes.store
    }

    pub(super) fn cache(&self) -> &BlockCache {
        &self.remotes.cache
    }

    /// Attaches every partition of the catalog.
    pub(super) async fn attach_all(&self) -> Result<(), TierError> {
        let work = self.all();
        futures::stream::iter(work.iter().map(|(t, i, p)| self.attach(t, *i, p)))
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    pub(super) fn in_scope(&self, topic_id: Uuid, partition: i32) -> bool {
        self.scope.as_ref().is_none_or(|s| s(topic_id, partition))
    }

    /// The partitions of [`Self::all`] this broker tends.
    pub(super) fn tended(&self) -> Vec<(Arc<Topic>, i32, Arc<Partition>)> {
        let mut all = self.all();
        all.retain(|(t, i, _)| self.in_scope(t.id(), *i));
        all
    }

    /// Every (topic, partition index, partition): all are tiered, internal
    /// topics too, so a wiped data directory gets `__consumer_offsets` back.
    pub(super) fn all(&self) -> Vec<(Arc<Topic>, i32, Arc<Partition>)> {
        self.catalog
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

    /// The partition's remote part, loading its manifest the first time.
    pub(super) async fn attach(
        &self,
        topic: &Topic,
        index: i32,
        partition: &Arc<Partition>,
    ) -> Result<Arc<TieredPartition>, TierError> {
        debug_assert!(
            partition.has_remote(),
            "the catalog was opened without `Remotes::parts`"
        );
        let remote = self.remotes.part(topic.name(), topic.id(), index);
        remote.load().await?;
        Ok(remote)
    }

    /// The partition's remote part, once attached.
    pub(super) fn remote(&self, topic_id: Uuid, partition: i32) -> Option<Arc<TieredPartition>> {
        let parts = self.remotes.parts.lock();
        let part = parts.get(&(topic_id, partition))?;
        part.is_loaded().then(|| part.clone())
    }

    /// Every attached partition, in (topic id, index) order.
    pub(super) fn remotes(&self) -> Vec<Arc<TieredPartition>> {
        let mut all: Vec<_> = self.remotes.loaded();
        all.sort_unstable_by_key(|(key, _)| *key);
        all.into_iter().map(|(_, remote)| remote).collect()
    }

    pub(super) fn manifest_of(&self, topic: &str, partition: i32) -> Option<Arc<Manifest>> {
        let id = self.catalog.topic(topic)?.id();
        self.remote(id, partition).map(|r| r.manifest())
    }

    /// Forgets the partitions of a deleted topic.
    pub(super) fn detach_topic(&self, topic_id: Uuid) {
        self.remotes
            .parts
            .lock()
            .retain(|(id, _), _| *id != topic_id);
    }

    /// Writes the next manifest version with `edit` applied, on top of
    /// whatever a compaction worker or an earlier run of this broker wrote.
    /// A leader of an older epoch than the manifest records is fenced.
    pub(super) async fn commit(
        &self,
        remote: &TieredPartition,
        leader_epoch: i32,
        edit: impl Fn(&mut Manifest),
    ) -> Result<(), TierError> {
        let next = remote
            .manifests
            .commit(&remote.manifest(), &self.writer, self.clock.as_ref(), |m| {
                m.check_leader_epoch(leader_epoch)?;
                edit(m);
                Ok(())
            })
            .await?;
        self.stats.puts.fetch_add(1, Ordering::Relaxed);
        remote.adopt(next);
        Ok(())
    }
}

const BACKOFF_MIN: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Per-partition exponential backoff after failures, so a job does not
/// hammer a store that keeps failing for one partition.
pub(super) struct Backoffs {
    clock: SharedClock,
    by_partition: Mutex<HashMap<(Uuid, i32), (Instant, Duration)>>,
}

impl Backoffs {
    pub(super) fn new(clock: SharedClock) -> Backoffs {
        Backoffs {
            clock,
            by_partition: Mutex::new(HashMap::new()),
        }
    }

    pub(super) fn ready(&self, key: (Uuid, i32)) -> bool {
        let now = self.clock.now();
        self.by_partition
            .lock()
            .get(&key)
            .is_none_or(|(next_try, _)| now >= *next_try)
    }

    pub(super) fn record<T, E>(&self, key: (Uuid, i32), result: &Result<T, E>) {
        let now = self.clock.now();
        let mut map = self.by_partition.lock();
        match result {
            Ok(_) => {
                map.remove(&key);
            }
            Err(_) => {
                let delay = map.get(&key).map_or(BACKOFF_MIN, |(_, d)| *d);
                map.insert(key, (now + delay, (delay * 2).min(BACKOFF_MAX)));
            }
        }
    }
}
