//! Rebuilding a lost data directory from the store, before the catalog opens.
//!
//! If the data directory is new (no cluster id yet), describe every topic in
//! the store locally (same id, partitions and configs). A data directory that
//! was in use keeps its own topic list: a topic missing there was deleted,
//! and its leftovers in the store must not bring it back. Then every
//! partition with a manifest but no local segment continues at the
//! manifest's end offset, with the newest tiered producer snapshot and the
//! manifest's log start offset. The catalog then opens as usual and the tier
//! serves everything below the active segment from the store. The files are
//! the catalog's (`Seed`) and the log's (`Partition::prepare_restore`) to
//! write; this module only says what they hold.

use std::path::Path as FsPath;
use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;

use super::TierError;
use crate::catalog::{ClusterFile, Seed, TopicFile};
use crate::format::segment::SNAPSHOT_EXT;
use crate::log::{Partition, RestorePoint};
use crate::manifest::objects::newest_topic_file;
use crate::manifest::{manifest_dir, partition_prefix, ManifestStore, CLUSTER_FILE};

#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Restored {
    pub topics: usize,
    pub partitions: usize,
}

pub(crate) async fn restore(
    store: &Arc<dyn ObjectStore>,
    data_dir: &FsPath,
) -> Result<Restored, TierError> {
    let mut restored = Restored::default();
    let seed = Seed::new(data_dir)?;
    let fresh = seed.is_new();
    if fresh {
        match store.get(&Path::from(CLUSTER_FILE)).await {
            Ok(r) => {
                let file: ClusterFile = serde_json::from_slice(&r.bytes().await?)
                    .map_err(|e| TierError::Corrupt(format!("{CLUSTER_FILE}: {e}")))?;
                seed.set_cluster_id(&file.cluster_id)?;
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let names = store
        .list_with_delimiter(Some(&Path::from("topics")))
        .await?;
    for name_prefix in names.common_prefixes {
        let Some(name) = name_prefix.filename().map(str::to_string) else {
            continue;
        };
        let Some(file) = newest_topic_file::<TopicFile>(store, &name_prefix).await? else {
            continue;
        };
        match seed.topic(&name) {
            Some(l) if l.id != file.id => {
                tracing::warn!(topic = name, local = %l.id, store = %file.id, "local topic differs from the store's; keeping the local one");
                continue;
            }
            Some(_) => {}
            None if !fresh => {
                tracing::info!(
                    topic = name,
                    "topic in the store but deleted locally; not restoring it"
                );
                continue;
            }
            None => {
                seed.add_topic(&name, &file)?;
                restored.topics += 1;
                tracing::info!(
                    topic = name,
                    partitions = file.partitions,
                    "restored topic from the store"
                );
            }
        }
        for p in 0..file.partitions as i32 {
            let manifests = ManifestStore::new(
                store.clone(),
                manifest_dir(&partition_prefix(&name, file.id, p)),
            );
            let Some(m) = manifests.load_latest().await? else {
                continue;
            };
            let dir = seed.partition_dir(&name, p);
            let producers = match m.segments.last() {
                Some(last) if !Partition::has_segments(&dir) => {
                    match store.get(&last.object(SNAPSHOT_EXT)).await {
                        Ok(r) => Some((last.base_offset, r.bytes().await?)),
                        Err(object_store::Error::NotFound { .. }) => None,
                        Err(e) => return Err(e.into()),
                    }
                }
                _ => None,
            };
            let point = RestorePoint {
                next_offset: m.end_offset().unwrap_or(0).max(m.log_start_offset),
                log_start_offset: m.log_start_offset,
                producers,
            };
            if Partition::prepare_restore(&dir, &point)? {
                restored.partitions += 1;
            }
        }
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, TopicConfig};
    use crate::manifest::{topic_prefix, Manifest, TieredSegment, WriterEpoch};
    use bytes::Bytes;
    use object_store::memory::InMemory;
    use uuid::Uuid;

    /// A store holding topic `t` (2 partitions; partition 0 tiered up to 300
    /// with log start 120) and a leftover older incarnation of `t`.
    async fn store_with_topic() -> (Arc<dyn ObjectStore>, Uuid) {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let old = TopicFile {
            id: Uuid::new_v4(),
            partitions: 9,
            config: TopicConfig::default(),
        };
        let put = |key: Path, json: Vec<u8>| {
            let store = store.clone();
            async move { store.put(&key, Bytes::from(json).into()).await.unwrap() }
        };
        put(
            topic_prefix("t", old.id).child("topic.json"),
            serde_json::to_vec(&old).unwrap(),
        )
        .await;
        // Modification times must differ for "newest wins".
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        let mut config = TopicConfig::default();
        config.set("retention.ms", Some("123")).unwrap();
        let file = TopicFile {
            id: Uuid::new_v4(),
            partitions: 2,
            config,
        };
        put(
            topic_prefix("t", file.id).child("topic.json"),
            serde_json::to_vec(&file).unwrap(),
        )
        .await;
        let w = WriterEpoch::new(1, &crate::clock::SystemClock, &crate::clock::OsRandom);
        let m = Manifest::empty(w.clone()).next(&w, 0, |m| {
            m.log_start_offset = 120;
            m.segments.push(TieredSegment {
                key: "k".into(),
                base_offset: 100,
                next_offset: 300,
                max_timestamp: 0,
                max_timestamp_position: 0,
                size: 10,
                level: 0,
                batch_count: 1,
                keys: None,
                aborted: Vec::new(),
            });
        });
        ManifestStore::new(
            store.clone(),
            manifest_dir(&partition_prefix("t", file.id, 0)),
        )
        .create(&m)
        .await
        .unwrap();
        (store, file.id)
    }

    #[tokio::test]
    async fn new_data_dir_gets_topics_and_partitions_that_continue_the_log() {
        let (store, id) = store_with_topic().await;
        let dir = tempfile::tempdir().unwrap();
        let r = restore(&store, dir.path()).await.unwrap();
        assert_eq!(
            r,
            Restored {
                topics: 1,
                partitions: 1
            }
        );
        let cat = Catalog::open(dir.path(), Default::default()).unwrap();
        let t = cat.topic("t").unwrap();
        assert_eq!((t.id(), t.partition_count()), (id, 2));
        assert_eq!(t.config().get("retention.ms"), Some(("123", true)));
        let p0 = t.partition(0).unwrap();
        assert_eq!((p0.log_start_offset(), p0.end_offset()), (120, 300));
        let p1 = t.partition(1).unwrap();
        assert_eq!((p1.log_start_offset(), p1.end_offset()), (0, 0));
        // Restoring again changes nothing.
        drop(cat);
        assert_eq!(
            restore(&store, dir.path()).await.unwrap(),
            Restored::default()
        );
    }

    #[tokio::test]
    async fn data_dir_in_use_does_not_resurrect_deleted_topics() {
        let (store, _) = store_with_topic().await;
        let dir = tempfile::tempdir().unwrap();
        drop(Catalog::open(dir.path(), Default::default()).unwrap());
        assert_eq!(
            restore(&store, dir.path()).await.unwrap(),
            Restored::default()
        );
        assert!(Catalog::open(dir.path(), Default::default())
            .unwrap()
            .topic("t")
            .is_none());
    }
}
