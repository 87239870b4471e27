//! KIP-951 leader hints: a Produce (v10+) or Fetch (v16+) partition answered
//! NOT_LEADER_OR_FOLLOWER or FENCED_LEADER_EPOCH names the partition's
//! current leader and epoch, and the response lists that leader's endpoint,
//! so the client re-routes at once instead of waiting for a metadata refresh.
//!
//! The hints are added to the finished response rather than inside the
//! handlers: they depend only on the error codes, and an error found late (a
//! fenced write-ahead log while waiting for acks=all) gets its hint too. They
//! are written only when a live broker is known to lead the partition, which
//! only happens in cluster mode; the tagged fields stay absent otherwise.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{fetch_response, produce_response};
use kafka_protocol::messages::{BrokerId, FetchResponse, ProduceResponse};
use kafka_protocol::protocol::StrBytes;

use super::Broker;
use crate::catalog::Topic;
use crate::cluster::BrokerInfo;

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
        let redirects = [
            ResponseError::NotLeaderOrFollower.code(),
            ResponseError::FencedLeaderEpoch.code(),
        ];
        if !redirects.contains(&code) {
            return None;
        }
        let cluster = self.broker.cluster.as_ref()?;
        let (leader, epoch) = cluster.leader_of(topic()?.id(), partition)?;
        let brokers = self.brokers.get_or_insert_with(|| cluster.brokers());
        let info = brokers.iter().find(|b| b.node_id == leader)?;
        self.named.insert(leader, info.clone());
        Some((leader, epoch))
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
    resp.node_endpoints = hints
        .named
        .into_values()
        .filter_map(|b| {
            let (host, port) = b.endpoint(Some(listener))?;
            Some(
                produce_response::NodeEndpoint::default()
                    .with_node_id(BrokerId(b.node_id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port.into())
                    .with_rack(b.rack.map(StrBytes::from_string)),
            )
        })
        .collect();
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
    resp.node_endpoints = hints
        .named
        .into_values()
        .filter_map(|b| {
            let (host, port) = b.endpoint(Some(listener))?;
            Some(
                fetch_response::NodeEndpoint::default()
                    .with_node_id(BrokerId(b.node_id))
                    .with_host(StrBytes::from_string(host))
                    .with_port(port.into())
                    .with_rack(b.rack.map(StrBytes::from_string)),
            )
        })
        .collect();
}
