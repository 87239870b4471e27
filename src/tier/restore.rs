//! Rebuilding a lost data directory from the store, before the catalog opens.
//!
//! For every topic in the store that the data directory lacks, write its
//! `topic.json` (same id, partitions and configs); for every partition with a
//! manifest but no local segment, create an empty active segment at the
//! manifest's end offset and record the manifest's log start offset. The
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
use crate::log::segment::file_name;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Restored {
    pub topics: usize,
    pub partitions: usize,
}

pub async fn restore(
    store: &Arc<dyn ObjectStore>,
    data_dir: &FsPath,
) -> Result<Restored, TierError> {
    let mut restored = Restored::default();
    std::fs::create_dir_all(data_dir.join("topics"))?;
    let cluster = data_dir.join("cluster.json");
    if !cluster.exists() {
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
        // One id per name normally; leftovers of a deleted incarnation lose
        // to the newest topic.json.
        let ids = store.list_with_delimiter(Some(&name_prefix)).await?;
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
        let Some((_, file)) = best else { continue };
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
