//! KIP-951 leader hints: a Produce (v10+), Fetch (v16+), ShareFetch or
//! ShareAcknowledge partition answered NOT_LEADER_OR_FOLLOWER or
//! FENCED_LEADER_EPOCH names the partition's current leader and epoch, and
//! the response lists that leader's endpoint, so the client re-routes at once
//! instead of waiting for a metadata refresh.
//!
//! The hints are added to the finished response rather than inside the
//! handlers: they depend only on the error codes, and an error found late (a
//! fenced write-ahead log while waiting for acks=all) gets its hint too. In
//! Produce and Fetch they are tagged fields, written only when a live broker
//! is known to lead the partition. In the share responses they are plain
//! fields whose zero value reads as "broker 0 at epoch 0": there an unknown
//! leader is -1, which makes Kafka's share consumer drop the leader it keeps
//! per partition and ask the metadata again (with a stale 0 it kept fetching
//! from the old leader for good).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    fetch_response, produce_response, share_acknowledge_response, share_fetch_response,
};
use kafka_protocol::messages::{
    BrokerId, FetchResponse, ProduceResponse, ShareAcknowledgeResponse, ShareFetchResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::Broker;
use crate::catalog::Topic;
use crate::cluster::BrokerInfo;
use uuid::Uuid;

/// The first Produce version with `current_leader` and `node_endpoints`.
const PRODUCE_VERSION: i16 = 10;
/// The first Fetch version whose leader hints Kafka fills for clients.
const FETCH_VERSION: i16 = 16;

/// Adds the hints to a Produce response once it is ready.
pub(super) fn produce(
    broker: &Arc<Broker>,
    pending: impl Future<Output = Option<ProduceResponse>> + Send + 'static,
    version: i16,
    listener: &str,
) -> impl Future<Output = Option<ProduceResponse>> + Send + 'static {
    let broker = broker.clone();
    let listener = listener.to_string();
    async move {
        let mut resp = pending.await?;
        if version >= PRODUCE_VERSION && broker.cluster.is_some() {
            hint_produce(&broker, &mut resp, &listener);
        }
        Some(resp)
    }
}

/// Adds the hints to a Fetch response once it is ready.
pub(super) fn fetch(
    broker: &Arc<Broker>,
    pending: impl Future<Output = FetchResponse> + Send + 'static,
    version: i16,
    listener: &str,
) -> impl Future<Output = FetchResponse> + Send + 'static {
    let broker = broker.clone();
    let listener = listener.to_string();
    async move {
        let mut resp = pending.await;
        if version >= FETCH_VERSION && broker.cluster.is_some() {
            hint_fetch(&broker, &mut resp, &listener);
        }
        resp
    }
}

/// Writes `share_fetch` and `share_acknowledge`: the same hints over each
/// response's own generated types.
macro_rules! share_hints {
    ($name:ident, $response:ty, $types:ident) => {
        /// Adds the hints to a share response once it is ready.
        pub(super) fn $name(
            broker: &Arc<Broker>,
            pending: impl Future<Output = $response> + Send + 'static,
            listener: &str,
        ) -> impl Future<Output = $response> + Send + 'static {
            let broker = broker.clone();
            let listener = listener.to_string();
            async move {
                let mut resp = pending.await;
                let mut hints = Hints::new(&broker);
                for t in &mut resp.responses {
                    let id = t.topic_id;
                    for p in &mut t.partitions {
                        if let Some((leader, epoch)) =
                            hints.share_leader(id, p.partition_index, p.error_code)
                        {
                            p.current_leader = $types::LeaderIdAndEpoch::default()
                                .with_leader_id(leader)
                                .with_leader_epoch(epoch);
                        }
                    }
                }
                resp.node_endpoints = hints.endpoints(&listener, |id, host, port, rack| {
                    $types::NodeEndpoint::default()
                        .with_node_id(BrokerId(id))
                        .with_host(host)
                        .with_port(port)
                        .with_rack(rack)
                });
                resp
            }
        }
    };
}

share_hints!(share_fetch, ShareFetchResponse, share_fetch_response);
share_hints!(
    share_acknowledge,
    ShareAcknowledgeResponse,
    share_acknowledge_response
);

/// Whether a partition error sends the client to another leader.
fn redirects(code: i16) -> bool {
    code == ResponseError::NotLeaderOrFollower.code()
        || code == ResponseError::FencedLeaderEpoch.code()
}

/// The leaders named so far, and their endpoints.
struct Hints<'a> {
    broker: &'a Broker,
    brokers: Option<Vec<BrokerInfo>>,
    named: BTreeMap<i32, BrokerInfo>,
}

impl<'a> Hints<'a> {
    fn new(broker: &'a Broker) -> Hints<'a> {
        Hints {
            broker,
            brokers: None,
            named: BTreeMap::new(),
        }
    }

    /// The live leader and epoch of a partition answered with `code`.
    fn leader(
        &mut self,
        topic: impl FnOnce() -> Option<Arc<Topic>>,
        partition: i32,
        code: i16,
    ) -> Option<(i32, i32)> {
        if !redirects(code) {
            return None;
        }
        let cluster = self.broker.cluster.as_ref()?;
        let (leader, epoch) = cluster.leader_of(topic()?.id(), partition)?;
        let brokers = self.brokers.get_or_insert_with(|| cluster.brokers());
        let info = brokers.iter().find(|b| b.node_id == leader)?;
        self.named.insert(leader, info.clone());
        Some((leader, epoch))
    }

    /// A share response's hint: the live leader, or -1 for an unknown one.
    fn share_leader(&mut self, topic: Uuid, partition: i32, code: i16) -> Option<(i32, i32)> {
        let broker = self.broker;
        let leader = self.leader(|| broker.catalog.topic_by_id(topic), partition, code);
        leader.or(redirects(code).then_some((-1, -1)))
    }

    /// The named leaders' endpoints on `listener`, each built by `make`
    /// from its id, host, port and rack.
    fn endpoints<T>(
        self,
        listener: &str,
        make: impl Fn(i32, StrBytes, i32, Option<StrBytes>) -> T,
    ) -> Vec<T> {
        self.named
            .into_values()
            .filter_map(|b| {
                let (host, port) = b.endpoint(Some(listener))?;
                let rack = b.rack.map(StrBytes::from_string);
                Some(make(
                    b.node_id,
                    StrBytes::from_string(host),
                    port.into(),
                    rack,
                ))
            })
            .collect()
    }
}

fn hint_produce(broker: &Broker, resp: &mut ProduceResponse, listener: &str) {
    let mut hints = Hints::new(broker);
    for t in &mut resp.responses {
        let topic = || broker.catalog.topic(t.name.0.as_str());
        for p in &mut t.partition_responses {
            if let Some((leader, epoch)) = hints.leader(topic, p.index, p.error_code) {
                p.current_leader = produce_response::LeaderIdAndEpoch::default()
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(epoch);
            }
        }
    }
    resp.node_endpoints = hints.endpoints(listener, |id, host, port, rack| {
        produce_response::NodeEndpoint::default()
            .with_node_id(BrokerId(id))
            .with_host(host)
            .with_port(port)
            .with_rack(rack)
    });
}

fn hint_fetch(broker: &Broker, resp: &mut FetchResponse, listener: &str) {
    let mut hints = Hints::new(broker);
    for t in &mut resp.responses {
        // Fetch v13+ names topics by id.
        let id = t.topic_id;
        let topic = || broker.catalog.topic_by_id(id);
        for p in &mut t.partitions {
            if let Some((leader, epoch)) = hints.leader(topic, p.partition_index, p.error_code) {
                p.current_leader = fetch_response::LeaderIdAndEpoch::default()
                    .with_leader_id(BrokerId(leader))
                    .with_leader_epoch(epoch);
            }
        }
    }
    resp.node_endpoints = hints.endpoints(listener, |id, host, port, rack| {
        fetch_response::NodeEndpoint::default()
            .with_node_id(BrokerId(id))
            .with_host(host)
            .with_port(port)
            .with_rack(rack)
    });
}
