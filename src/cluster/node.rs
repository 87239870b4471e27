//! This broker's place in the cluster, as the request path sees it.
//!
//! Requests must be answered from memory: who the brokers are, who leads a
//! partition at which epoch (the mirrored `ClusterView`), and whether this
//! broker serves a partition right now. Leading is not yet serving: between
//! being assigned a partition and serving it, a broker takes it over (fences
//! the old leader, reads its head back), and between being asked to hand it
//! over and releasing it, it stops appending and makes its head durable. So
//! the serving set is kept here, changed only by the server's leadership
//! loop, and consulted by every produce, fetch and offsets request.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::RwLock;
use uuid::Uuid;

use super::{BrokerInfo, ClusterView, Member, NodeId, TopicStore};

pub struct ClusterNode {
    cluster_id: String,
    member: Arc<Member>,
    view: ClusterView,
    topics: TopicStore,
    /// Partitions served now, with the epoch they are served at.
    serving: RwLock<HashMap<(Uuid, i32), i32>>,
    /// Producer ids left in the block this broker took from etcd.
    producer_ids: tokio::sync::Mutex<std::ops::Range<i64>>,
}

/// Producer ids taken from etcd at a time.
const PRODUCER_ID_BLOCK: i64 = 1000;

impl ClusterNode {
    pub fn new(cluster_id: String, member: Arc<Member>, view: ClusterView) -> ClusterNode {
        ClusterNode {
            cluster_id,
            topics: TopicStore::new(member.etcd().clone()),
            member,
            view,
            serving: RwLock::new(HashMap::new()),
            producer_ids: tokio::sync::Mutex::new(0..0),
        }
    }

    /// A producer id no other broker of the cluster hands out.
    pub async fn next_producer_id(&self) -> super::Result<i64> {
        let mut ids = self.producer_ids.lock().await;
        if ids.is_empty() {
            let blocks = super::ProducerIdBlocks::new(self.member.etcd().clone());
            *ids = blocks.allocate(PRODUCER_ID_BLOCK).await?;
        }
        let id = ids.start;
        ids.start += 1;
        Ok(id)
    }

    /// The id every broker of the cluster reports.
    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    pub fn node_id(&self) -> NodeId {
        self.member.node_id()
    }

    pub fn member(&self) -> &Arc<Member> {
        &self.member
    }

    pub fn view(&self) -> &ClusterView {
        &self.view
    }

    pub fn topics(&self) -> &TopicStore {
        &self.topics
    }

    /// Dynamic broker configs, the cluster default's and each broker's.
    pub fn broker_configs(&self) -> super::BrokerConfigStore {
        super::BrokerConfigStore::new(self.member.etcd().clone())
    }

    /// The finalized feature levels (KIP-584).
    pub fn features(&self) -> super::BrokerConfigStore {
        super::BrokerConfigStore::features(self.member.etcd().clone())
    }

    /// Each group's config overrides.
    pub fn group_configs(&self) -> super::BrokerConfigStore {
        super::BrokerConfigStore::groups(self.member.etcd().clone())
    }

    /// Live brokers, by node id.
    pub fn brokers(&self) -> Vec<BrokerInfo> {
        self.view.brokers()
    }

    pub fn controller(&self) -> Option<NodeId> {
        self.view.controller()
    }

    /// The partition's leader and leader epoch, as assigned.
    pub fn leader_of(&self, topic: Uuid, partition: i32) -> Option<(NodeId, i32)> {
        self.view.leader_of(topic, partition)
    }

    /// The epoch this broker serves the partition at, if it does.
    pub fn serving(&self, topic: Uuid, partition: i32) -> Option<i32> {
        self.serving.read().get(&(topic, partition)).copied()
    }

    pub fn start_serving(&self, topic: Uuid, partition: i32, epoch: i32) {
        self.serving.write().insert((topic, partition), epoch);
    }

    pub fn stop_serving(&self, topic: Uuid, partition: i32) -> Option<i32> {
        self.serving.write().remove(&(topic, partition))
    }

    /// Stops serving everything (the lease is lost); returns what was served.
    pub fn stop_all(&self) -> Vec<((Uuid, i32), i32)> {
        self.serving.write().drain().collect()
    }

    pub fn served(&self) -> Vec<((Uuid, i32), i32)> {
        self.serving.read().iter().map(|(k, v)| (*k, *v)).collect()
    }
}
