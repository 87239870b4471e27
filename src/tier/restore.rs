//! Rebuilding a lost data directory from the store, before the catalog opens.
//!
//! If the data directory is new (no `cluster.json`), write the `topic.json`
//! of every topic in the store (same id, partitions and configs). A data
//! directory that was in use keeps its own topic list: a topic missing there
//! was deleted, and its leftovers in the store must not bring it back. Then,
//! for every partition with a
//! manifest but no local segment, fetch the newest tiered segment's producer
//! snapshot, create an empty active segment at the manifest's end offset and
//! record the manifest's log start offset. The
//! catalog then opens as usual and the tier serves everything below the
//! active segment from the store. Pure file preparation keeps the catalog
//! and the log unaware of restores.

use std::path::Path as FsPath;
use std::sync::Arc;

use object_store::path::Path;
use object_store::ObjectStore;

use super::manifest::ManifestStore;
use super::{partition_prefix, TierError};
use crate::catalog::TopicFile;
use crate::log::index::write_synced;
use crate::log::producer_state::SNAPSHOT_EXT;
use crate::log::segment::file_name;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub topics: usize,
    pub partitions: usize,
}

/// The topic description under `topics/<name>/`: one id per name normally;
/// leftovers of a deleted incarnation lose to the newest `topic.json`.
pub async fn newest_topic_file(
    store: &Arc<dyn ObjectStore>,
    name_prefix: &Path,
) -> Result<Option<TopicFile>, TierError> {
    let ids = store.list_with_delimiter(Some(name_prefix)).await?;
    let mut best: Option<(i64, TopicFile)> = None;
    for id_prefix in ids.common_prefixes {
        let r = match store.get(&id_prefix.child("topic.json")).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let stamp = r.meta.last_modified.timestamp_millis();
        let file: TopicFile = serde_json::from_slice(&r.bytes().await?)
            .map_err(|e| TierError::Corrupt(format!("{id_prefix}/topic.json: {e}")))?;
        if best.as_ref().is_none_or(|(s, _)| stamp > *s) {
            best = Some((stamp, file));
        }
    }
    Ok(best.map(|(_, f)| f))
}

pub async fn restore(
    store: &Arc<dyn ObjectStore>,
    data_dir: &FsPath,
) -> Result<Restored, TierError> {
    let mut restored = Restored::default();
    std::fs::create_dir_all(data_dir.join("topics"))?;
    let cluster = data_dir.join("cluster.json");
    let fresh = !cluster.exists();
    if fresh {
        match store.get(&Path::from("cluster.json")).await {
            Ok(r) => write_synced(&cluster, &r.bytes().await?)?,
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
        let Some(file) = newest_topic_file(store, &name_prefix).await? else {
            continue;
        };
        let dir = data_dir.join("topics").join(&name);
        let local = std::fs::read(dir.join("topic.json"))
            .ok()
            .and_then(|b| serde_json::from_slice::<TopicFile>(&b).ok());
        match local {
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
                std::fs::create_dir_all(&dir)?;
                let json = serde_json::to_vec_pretty(&file).map_err(std::io::Error::other)?;
                write_synced(&dir.join("topic.json"), &json)?;
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
                partition_prefix(&name, file.id, p).child("manifest"),
            );
            let Some(m) = manifests.load_latest().await? else {
                continue;
            };
            let pdir = dir.join(p.to_string());
            std::fs::create_dir_all(&pdir)?;
            let has_segments = std::fs::read_dir(&pdir)?
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with(".log"));
            if !has_segments {
                // Before the log, which marks the partition as restored: the
                // producer state as of the tiered end, so that idempotent
                // producers go on with their sequences.
                if let Some(last) = m.segments.last() {
                    match store.get(&last.object(SNAPSHOT_EXT)).await {
                        Ok(r) => write_synced(
                            &pdir.join(file_name(last.base_offset, SNAPSHOT_EXT)),
                            &r.bytes().await?,
                        )?,
                        Err(object_store::Error::NotFound { .. }) => {}
                        Err(e) => return Err(e.into()),
                    }
                }
                let base = m.end_offset().unwrap_or(0).max(m.log_start_offset);
                std::fs::File::create(pdir.join(file_name(base, "log")))?.sync_all()?;
                restored.partitions += 1;
            }
            let lso_path = pdir.join("log-start-offset");
            let local_lso = std::fs::read_to_string(&lso_path)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok());
            if local_lso.is_none_or(|l| l < m.log_start_offset) {
                write_synced(&lso_path, m.log_start_offset.to_string().as_bytes())?;
            }
        }
    }
    Ok(restored)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::{Catalog, TopicConfig};
    use crate::tier::manifest::{Manifest, TieredSegment, WriterEpoch};
    use crate::tier::topic_prefix;
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
        let w = WriterEpoch::new(1);
        let m = Manifest::empty(w.clone()).next(&w, |m| {
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
            });
        });
        ManifestStore::new(
            store.clone(),
            partition_prefix("t", file.id, 0).child("manifest"),
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
        let cat = Catalog::open(dir.path()).unwrap();
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
        drop(Catalog::open(dir.path()).unwrap());
        assert_eq!(
            restore(&store, dir.path()).await.unwrap(),
            Restored::default()
        );
        assert!(Catalog::open(dir.path()).unwrap().topic("t").is_none());
    }
}
