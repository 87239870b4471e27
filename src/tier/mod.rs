//! Tiered storage: sealed segments become immutable objects in an object
//! store, and the local disk keeps the active segment plus what awaits upload.
//!
//! The log sees this module only as a `RemoteLog` attached to each partition
//! (`remote`, reading through the block `cache`). The work in the background
//! is split by job, each owning its own state: `uploader` rolls, uploads and
//! releases segments and judges backpressure, `retention` applies
//! `retention.*` and DeleteRecords to manifests, `orphans` deletes objects no
//! manifest names, `topics` keeps `topic.json` in the store and removes
//! deleted topics. `Tier` owns them and the registry of tiered partitions
//! they share, and runs them in turn. `restore` rebuilds an empty data
//! directory from the store. The object layout and the manifests themselves
//! belong to `crate::manifest`, which compaction writes too.

pub(crate) mod cache;
mod orphans;
mod partitions;
pub(crate) mod remote;
pub(crate) mod restore;
mod retention;
mod takeover;
mod topics;
mod uploader;
mod wal_gc;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use tokio::sync::watch;
use uuid::Uuid;

use crate::catalog::Catalog;
use crate::clock::SharedClock;
use crate::manifest::{Manifest, ManifestError};
use cache::BlockCache;
use orphans::OrphanScan;
pub use partitions::Remotes;
use partitions::TieredPartitions;
pub use partitions::{Scope, TierStats};
use remote::TieredPartition;
use retention::Retention;
pub use takeover::Claim;
use topics::TopicSync;
use uploader::Uploader;
pub use wal_gc::WalCollector;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error(transparent)]
    Manifest(#[from] ManifestError),
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("local storage: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Log(#[from] crate::log::LogError),
    #[error(transparent)]
    Catalog(#[from] crate::catalog::CatalogError),
    #[error(transparent)]
    Wal(#[from] crate::wal::WalError),
    #[error("corrupt object: {0}")]
    Corrupt(String),
    /// One failed load, reported to every reader that waited for it.
    #[error(transparent)]
    Shared(Arc<TierError>),
}

impl From<crate::format::FormatError> for TierError {
    fn from(e: crate::format::FormatError) -> Self {
        TierError::Log(e.into())
    }
}

impl TierError {
    /// The object asked for is not in the store.
    pub fn is_not_found(&self) -> bool {
        match self {
            TierError::Store(object_store::Error::NotFound { .. }) => true,
            TierError::Manifest(m) => m.is_not_found(),
            TierError::Shared(inner) => inner.is_not_found(),
            _ => false,
        }
    }
}

/// What the tier's jobs need to know; the server builds it from its flags.
#[derive(Clone)]
pub struct TierSettings {
    pub node_id: i32,
    /// Bytes of store blocks kept in memory for reads of tiered segments.
    pub cache_bytes: u64,
    /// Sealed bytes allowed to wait for upload before produce is refused.
    pub max_pending_upload_bytes: u64,
    /// Raised while more than that waits; the catalog's partitions of user
    /// topics refuse appends while it is (`CatalogSettings::backpressure`).
    pub backpressure: Arc<AtomicBool>,
    /// How often the jobs run.
    pub interval: Duration,
    /// Objects no manifest names are deleted once this old.
    pub orphan_min_age: Duration,
    pub orphan_scan_interval: Duration,
    /// Cluster mode: the partitions this broker tends (leads); `None`: all.
    pub scope: Option<Scope>,
    /// Cluster mode: active segments roll once this old, whatever their
    /// `segment.ms`, so the write-ahead log behind them can be collected.
    pub max_head_age: Option<Duration>,
}

impl TierSettings {
    /// The defaults of the broker's flags, for node `node_id` running alone.
    pub fn new(node_id: i32) -> TierSettings {
        TierSettings {
            node_id,
            cache_bytes: 256 << 20,
            max_pending_upload_bytes: 8 << 30,
            backpressure: Default::default(),
            interval: Duration::from_millis(500),
            orphan_min_age: Duration::from_secs(3600),
            orphan_scan_interval: Duration::from_secs(600),
            scope: None,
            max_head_age: None,
        }
    }
}

/// The tier of one broker: the partitions it tiers and the jobs that tend them.
pub struct Tier {
    partitions: Arc<TieredPartitions>,
    uploader: Uploader,
    retention: Retention,
    orphans: OrphanScan,
    topics: TopicSync,
    interval: Duration,
}

impl Tier {
    /// Attaches every partition to its manifest (so reads of tiered offsets
    /// work before the first client connects).
    /// `catalog` must have been opened with `remotes.parts()`.
    pub async fn open(
        remotes: Arc<Remotes>,
        catalog: Arc<Catalog>,
        settings: TierSettings,
        clock: SharedClock,
    ) -> Result<Arc<Tier>, TierError> {
        let partitions = Arc::new(TieredPartitions::new(
            remotes,
            catalog,
            settings.scope,
            clock,
        ));
        // Until its manifest is loaded a partition cannot tell tiered offsets
        // from a gap, so the broker does not start without the store.
        partitions.attach_all().await?;
        let topics = TopicSync::new(partitions.clone());
        topics.put_cluster_file().await?;
        Ok(Arc::new(Tier {
            uploader: Uploader::new(
                partitions.clone(),
                settings.max_pending_upload_bytes,
                settings.max_head_age,
                settings.backpressure,
            ),
            retention: Retention::new(partitions.clone()),
            orphans: OrphanScan::new(
                partitions.clone(),
                settings.orphan_min_age,
                settings.orphan_scan_interval,
            ),
            topics,
            partitions,
            interval: settings.interval.max(Duration::from_millis(10)),
        }))
    }

    pub fn store(&self) -> &Arc<dyn ObjectStore> {
        self.partitions.store()
    }

    pub fn cache(&self) -> &BlockCache {
        self.partitions.cache()
    }

    pub fn stats(&self) -> &TierStats {
        &self.partitions.stats
    }

    /// How often the jobs run.
    pub fn interval(&self) -> Duration {
        self.interval
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

    /// One turn of every job.
    pub async fn pass(&self) {
        if let Err(e) = self.topics.sync().await {
            tracing::warn!(error = %e, "syncing topic descriptions to the store failed");
        }
        self.uploader.pass().await;
        self.retention.pass().await;
        self.orphans.scan_if_due().await;
    }

    /// The remote part of a partition, once attached.
    pub fn remote(&self, topic_id: Uuid, partition: i32) -> Option<Arc<TieredPartition>> {
        self.partitions.remote(topic_id, partition)
    }

    /// The remote part of a partition, attaching it first if needed (in a
    /// cluster, a partition led elsewhere is attached only when this broker
    /// needs its manifest, e.g. to schedule its merges).
    pub async fn remote_of(
        &self,
        topic: &crate::catalog::Topic,
        index: i32,
    ) -> Result<Option<Arc<TieredPartition>>, TierError> {
        if let Some(r) = self.remote(topic.id(), index) {
            return Ok(Some(r));
        }
        let Some(partition) = topic.partition(index) else {
            return Ok(None);
        };
        Ok(Some(
            self.partitions.attach(topic, index, &partition).await?,
        ))
    }

    /// Whether this broker tends the partition's uploads (cluster mode: it
    /// serves it).
    pub fn tends(&self, topic_id: Uuid, partition: i32) -> bool {
        self.partitions.in_scope(topic_id, partition)
    }

    /// The durable manifest of a partition, by topic name.
    pub fn manifest_of(&self, topic: &str, partition: i32) -> Option<Arc<Manifest>> {
        self.partitions.manifest_of(topic, partition)
    }

    /// Takes a manifest a compaction worker in this process just wrote.
    pub fn adopt(&self, topic_id: Uuid, partition: i32, manifest: &Manifest) {
        if let Some(remote) = self.remote(topic_id, partition) {
            remote.adopt(manifest.clone());
        }
    }

    /// Whether produce is being refused because uploads lag.
    pub fn backpressure_active(&self) -> bool {
        self.uploader.backpressure_active()
    }
}

/// A catalog in `dir` whose partitions continue in `store`, and its tier,
/// both with the defaults of node 1.
#[cfg(test)]
pub(crate) async fn open_with_catalog(
    store: Arc<dyn ObjectStore>,
    dir: &std::path::Path,
    clock: SharedClock,
) -> (Arc<Catalog>, Arc<Tier>) {
    let settings = TierSettings::new(1);
    let remotes = Remotes::new(store, &settings, &clock);
    let catalog_settings = crate::catalog::CatalogSettings {
        remote_parts: Some(remotes.parts()),
        ..Default::default()
    };
    let catalog = Arc::new(Catalog::open(dir, catalog_settings).unwrap());
    let tier = Tier::open(remotes, catalog.clone(), settings, clock)
        .await
        .unwrap();
    (catalog, tier)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::format::batch::encode_batch;
    use bytes::Bytes;
    use futures::TryStreamExt;
    use kafka_protocol::records::Compression;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn segments_leave_manifest_and_store_once_the_clock_passes_retention() {
        const START: i64 = 1_700_000_000_000;
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let (catalog, tier) = open_with_catalog(store.clone(), dir.path(), clock.clone()).await;
        let topic = catalog
            .create_topic(
                "t",
                1,
                1,
                &[
                    ("retention.ms", Some("60000")),
                    ("segment.bytes", Some("1024")),
                ],
            )
            .unwrap();
        let partition = topic.partition(0).unwrap();
        for i in 0..20 {
            let value = Bytes::from(vec![b'v'; 200]);
            let key = Bytes::from(format!("k{i}"));
            let batch = encode_batch(
                vec![(Some(key), Some(value), START)],
                None,
                Compression::None,
            )
            .unwrap();
            partition.append(&batch, &topic.append_config()).unwrap();
        }
        tier.pass().await;
        let tiered = tier.manifest_of("t", 0).unwrap();
        let tiered_end = tiered.end_offset().expect("sealed segments were uploaded");
        assert!(tiered.segments.len() >= 2);
        let objects = || async {
            let listed: Vec<_> = store
                .list(Some(&object_store::path::Path::from("topics/t")))
                .try_collect()
                .await
                .unwrap();
            listed
                .iter()
                .filter(|o| o.location.as_ref().contains("/segments/"))
                .count()
        };
        assert!(objects().await > 0);

        clock.advance(Duration::from_secs(59));
        tier.pass().await;
        assert_eq!(tier.manifest_of("t", 0).unwrap().log_start_offset, 0);

        clock.advance(Duration::from_secs(2));
        tier.pass().await;
        let expired = tier.manifest_of("t", 0).unwrap();
        assert!(expired.segments.is_empty());
        assert_eq!(expired.log_start_offset, tiered_end);
        assert_eq!(partition.log_start_offset(), tiered_end);
        assert_eq!(objects().await, 0);
    }
}
