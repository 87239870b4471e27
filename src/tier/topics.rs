//! The store's copy of the catalog: `cluster.json` once, and each topic's
//! `topic.json` whenever it changes, so that a wiped data directory can be
//! restored; a topic deleted from the catalog loses its objects, its
//! description first (without it a restore ignores the leftovers).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{PutMode, PutOptions, PutPayload};
use parking_lot::Mutex;
use uuid::Uuid;

use super::partitions::TieredPartitions;
use super::TierError;
use crate::catalog::{ClusterFile, Topic, TopicFile};
use crate::manifest::{topic_prefix, CLUSTER_FILE, TOPIC_FILE};

pub(super) struct TopicSync {
    partitions: Arc<TieredPartitions>,
    /// topic.json as last written to the store, by topic id.
    synced: Mutex<HashMap<Uuid, (String, Vec<u8>)>>,
}

impl TopicSync {
    pub(super) fn new(partitions: Arc<TieredPartitions>) -> TopicSync {
        TopicSync {
            partitions,
            synced: Mutex::new(HashMap::new()),
        }
    }

    /// Writes `cluster.json` unless the store has one.
    pub(super) async fn put_cluster_file(&self) -> Result<(), TierError> {
        let file = ClusterFile {
            cluster_id: self.partitions.catalog.cluster_id().to_string(),
        };
        let json = serde_json::to_vec(&file).map_err(|e| TierError::Corrupt(e.to_string()))?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .partitions
            .store()
            .put_opts(&Path::from(CLUSTER_FILE), Bytes::from(json).into(), opts)
            .await
        {
            Ok(_) | Err(object_store::Error::AlreadyExists { .. }) => Ok(()),
            Err(object_store::Error::Precondition { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Keeps `topic.json` in the store equal to the catalog's, and removes
    /// the objects of topics deleted since.
    pub(super) async fn sync(&self) -> Result<(), TierError> {
        let store = self.partitions.store();
        let topics: Vec<Arc<Topic>> = self.partitions.catalog.topics();
        for t in &topics {
            let file = TopicFile {
                id: t.id(),
                partitions: t.partition_count() as u32,
                config: t.config(),
            };
            let json =
                serde_json::to_vec_pretty(&file).map_err(|e| TierError::Corrupt(e.to_string()))?;
            let unchanged = self
                .synced
                .lock()
                .get(&t.id())
                .is_some_and(|(_, j)| *j == json);
            if unchanged {
                continue;
            }
            store
                .put(
                    &topic_prefix(t.name(), t.id()).child(TOPIC_FILE),
                    PutPayload::from(Bytes::from(json.clone())),
                )
                .await?;
            self.partitions.stats.puts.fetch_add(1, Ordering::Relaxed);
            self.synced
                .lock()
                .insert(t.id(), (t.name().to_string(), json));
        }
        let gone: Vec<(Uuid, String)> = self
            .synced
            .lock()
            .iter()
            .filter(|(id, _)| !topics.iter().any(|t| t.id() == **id))
            .map(|(id, (name, _))| (*id, name.clone()))
            .collect();
        for (id, name) in gone {
            self.partitions.detach_topic(id);
            let prefix = topic_prefix(&name, id);
            match store.delete(&prefix.child(TOPIC_FILE)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let keys: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
            for k in keys {
                match store.delete(&k.location).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            self.synced.lock().remove(&id);
            tracing::info!(topic = name, "deleted topic's objects from the store");
        }
        Ok(())
    }
}
