//! A broker's local mirror of the cluster metadata, for the request path.
//!
//! Metadata and produce requests must not wait on etcd, so each broker keeps a
//! copy: one range read of the prefix, then one watch from the revision after
//! it, applying events to the raw keys and re-deriving the [`ClusterState`].
//! If the watch breaks (etcd down, connection cut) or etcd has compacted the
//! revision the watch needs, the view reads everything again and watches on
//! from there; a stale view is thus only ever *behind*, never inconsistent,
//! and its `revision` tells how far behind.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use uuid::Uuid;

use super::etcd::Etcd;
use super::kv::Event;
use super::member::BrokerInfo;
use super::state::{ClusterState, LedPartition, RawKv};
use super::NodeId;

/// The cluster as this broker last saw it. Clones share the same mirror.
#[derive(Clone)]
pub struct ClusterView {
    node_id: NodeId,
    state: watch::Receiver<Arc<ClusterState>>,
    _task: Arc<AbortOnDrop>,
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl ClusterView {
    /// Starts mirroring; the state is empty (revision 0) until the first read.
    pub fn start(etcd: Etcd, node_id: NodeId) -> ClusterView {
        let (tx, state) = watch::channel(Arc::new(ClusterState::default()));
        let task = tokio::spawn(mirror(etcd, tx));
        ClusterView {
            node_id,
            state,
            _task: Arc::new(AbortOnDrop(task)),
        }
    }

    pub fn state(&self) -> Arc<ClusterState> {
        self.state.borrow().clone()
    }

    /// Fires on every change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<ClusterState>> {
        self.state.clone()
    }

    pub fn brokers(&self) -> Vec<BrokerInfo> {
        self.state().brokers.values().cloned().collect()
    }

    pub fn controller(&self) -> Option<NodeId> {
        self.state().controller
    }

    pub fn leader_of(&self, topic: Uuid, partition: i32) -> Option<(NodeId, i32)> {
        self.state().leader_of(topic, partition)
    }

    /// The partitions this broker leads.
    pub fn my_partitions(&self) -> Vec<LedPartition> {
        self.state().partitions_led_by(self.node_id)
    }

    /// Waits until `done` holds for the state, returning that state.
    pub async fn wait_for(&self, mut done: impl FnMut(&ClusterState) -> bool) -> Arc<ClusterState> {
        let mut rx = self.state.clone();
        loop {
            let s = rx.borrow_and_update().clone();
            if done(&s) {
                return s;
            }
            if rx.changed().await.is_err() {
                return s;
            }
        }
    }
}

async fn mirror(etcd: Etcd, tx: watch::Sender<Arc<ClusterState>>) {
    let keys = etcd.keys().clone();
    let root = keys.root();
    let retry = Duration::from_millis(200);
    loop {
        let (mut revision, kvs) = match etcd.get_prefix(&root).await {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "cluster view read failed");
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        let mut raw: BTreeMap<String, RawKv> = kvs
            .iter()
            .map(|kv| (kv.key.clone(), RawKv::from(kv)))
            .collect();
        tx.send_replace(Arc::new(ClusterState::decode(&keys, revision, &raw)));

        let mut stream = match etcd.watch_prefix(&root, revision + 1).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "cluster view watch failed");
                tokio::time::sleep(retry).await;
                continue;
            }
        };
        while let Some(batch) = stream.next().await {
            if batch.events.is_empty() {
                continue;
            }
            for event in &batch.events {
                match event {
                    Event::Put(kv) => {
                        raw.insert(kv.key.clone(), RawKv::from(kv));
                    }
                    Event::Delete(kv) => {
                        raw.remove(&kv.key);
                    }
                }
                revision = revision.max(event.kv().mod_revision);
            }
            revision = revision.max(batch.revision);
            tx.send_replace(Arc::new(ClusterState::decode(&keys, revision, &raw)));
        }
        tracing::debug!("cluster view watch ended; reading everything again");
        tokio::time::sleep(retry).await;
    }
}
