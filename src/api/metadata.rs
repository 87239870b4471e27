//! Metadata and DescribeCluster: alone, one broker leading every partition;
//! in cluster mode every live broker, and each partition's assigned leader
//! and leader epoch.
//!
//! The data lives in the object store, not on followers, so there is no
//! replica that could fall behind: a partition's replicas are the brokers
//! that could serve it, and all of them are in sync. Alone that is the
//! broker itself. In a cluster it is the leader followed by the next live
//! brokers, as many as the topic's replication factor asks for
//! (`cluster::replicas`): the brokers a client or tool asking for a factor
//! of 3 expects to see, each of which could take the partition over. A
//! factor above the live brokers shows as fewer replicas, as Kafka shows a
//! replica on a broker that is gone as missing from the ISR.
//!
//! DescribeCluster v2 (KIP-1073) lets an admin ask for fenced brokers too
//! (`IncludeFencedBrokers`) and marks each broker `IsFenced`. Kafka keeps a
//! registered broker that stopped heartbeating, fenced, until it is
//! unregistered; here a broker is known only while its membership lease is
//! alive, and one that loses it is gone from the view at once. So every
//! broker listed is unfenced, and asking for fenced ones adds none.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::authorize::{Resource, CLUSTER_DENIED, TOPIC_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::error::catalog_error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{Operation, ResourceType, CLUSTER_NAME};
use crate::catalog::{validate_topic_name, Topic, DEFAULT_REPLICATION_FACTOR};

pub(super) const METADATA: Api = api!(MetadataRequest, 0..=13, ready(handle_metadata));
pub(super) const DESCRIBE_CLUSTER: Api = api!(
    DescribeClusterRequest,
    0..=2,
    ready(|b, r, cx| {
        let operations = r.include_cluster_authorized_operations;
        let mut resp = describe_cluster(b, r, cx.version, cx.listener);
        if operations {
            resp.cluster_authorized_operations =
                b.authorized_operations(cx, ResourceType::Cluster, CLUSTER_NAME);
        }
        resp
    }),
    acl(Operation::Describe, Resource::Cluster, |_| {
        DescribeClusterResponse::default().with_error_code(CLUSTER_DENIED)
    })
);

error_codes! {
    MetadataResponse => |r, f| {
        f(r.error_code);
        for t in &r.topics {
            f(t.error_code);
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    };
    DescribeClusterResponse => |r, f| f(r.error_code);
}

/// Metadata: topics the principal may not DESCRIBE are left out of a
/// listing and answered TOPIC_AUTHORIZATION_FAILED when asked for by name;
/// an unknown topic is auto-created only with CREATE (else it is unknown).
fn handle_metadata(b: &Arc<Broker>, req: MetadataRequest, cx: &Ctx<'_>) -> MetadataResponse {
    let topic_operations = req.include_topic_authorized_operations && cx.version >= 8;
    let cluster_operations =
        req.include_cluster_authorized_operations && (8..=10).contains(&cx.version);
    let mut resp = authorized_metadata(b, req, cx);
    if topic_operations {
        for t in resp
            .topics
            .iter_mut()
            .filter(|t| t.error_code != TOPIC_DENIED)
        {
            if let Some(name) = &t.name {
                t.topic_authorized_operations =
                    b.authorized_operations(cx, ResourceType::Topic, name);
            }
        }
    }
    if cluster_operations {
        resp.cluster_authorized_operations =
            b.authorized_operations(cx, ResourceType::Cluster, CLUSTER_NAME);
    }
    resp
}

fn authorized_metadata(
    b: &Arc<Broker>,
    mut req: MetadataRequest,
    cx: &Ctx<'_>,
) -> MetadataResponse {
    use metadata_response::MetadataResponseTopic;
    let listing = match &req.topics {
        None => true,
        Some(l) => cx.version == 0 && l.is_empty(),
    };
    let mut answered = Vec::new();
    if !listing {
        let mut kept = Vec::new();
        for t in req.topics.take().unwrap_or_default() {
            let name = match &t.name {
                Some(n) if t.topic_id.is_nil() => n.0.to_string(),
                _ => match b.catalog.topic_by_id(t.topic_id) {
                    Some(found) => found.name().to_string(),
                    None => {
                        kept.push(t);
                        continue;
                    }
                },
            };
            let exists = b.catalog.topic(&name).is_some();
            let entry = || {
                MetadataResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
            };
            if exists && !b.on_topic(cx, Operation::Describe, &name) {
                answered.push(entry().with_error_code(TOPIC_DENIED));
            } else if !exists && !b.may_create_topic(cx, &name) {
                let code = if b.on_topic(cx, Operation::Describe, &name) {
                    ResponseError::UnknownTopicOrPartition.code()
                } else {
                    TOPIC_DENIED
                };
                answered.push(entry().with_error_code(code));
            } else {
                kept.push(t);
            }
        }
        if kept.is_empty() && cx.version == 0 {
            // v0 reads an empty list as every topic.
            let mut resp = metadata(b, req, cx.version, cx.listener);
            resp.topics = answered;
            return resp;
        }
        req.topics = Some(kept);
    }
    let mut resp = metadata(b, req, cx.version, cx.listener);
    if listing {
        resp.topics.retain(|t| {
            t.name
                .as_ref()
                .is_none_or(|n| b.on_topic(cx, Operation::Describe, n))
        });
    }
    resp.topics.extend(answered);
    resp
}

pub(super) fn metadata(
    broker: &Broker,
    req: MetadataRequest,
    version: i16,
    listener: &str,
) -> MetadataResponse {
    let catalog = &broker.catalog;
    // v0 has no null list: an empty list there means every topic.
    let requested = match req.topics {
        Some(t) if !(version == 0 && t.is_empty()) => Some(t),
        _ => None,
    };
    let allow_auto_create = version < 4 || req.allow_auto_topic_creation;
    let topics = match requested {
        None => catalog
            .topics()
            .iter()
            .map(|t| describe_topic(broker, t, version))
            .collect(),
        Some(list) => list
            .into_iter()
            .map(|rt| {
                // As in Kafka, a topic id wins over the name: the Java
                // consumer resolves ids from a KIP-848 assignment with an
                // empty name.
                let name = rt
                    .name
                    .as_ref()
                    .filter(|_| rt.topic_id.is_nil())
                    .map(|n| n.0.to_string());
                let found = match &name {
                    Some(n) => catalog.topic(n),
                    None => catalog.topic_by_id(rt.topic_id),
                };
                match (found, name) {
                    (Some(t), _) => describe_topic(broker, &t, version),
                    (None, None) => MetadataResponseTopic::default()
                        .with_name(None)
                        .with_topic_id(rt.topic_id)
                        .with_error_code(ResponseError::UnknownTopicId.code()),
                    (None, Some(n)) => {
                        let err = |code: i16| {
                            MetadataResponseTopic::default()
                                .with_name(Some(TopicName(StrBytes::from_string(n.clone()))))
                                .with_error_code(code)
                        };
                        if let Err(e) = validate_topic_name(&n) {
                            err(catalog_error_code(&e))
                        } else if allow_auto_create
                            && broker.settings.auto_create_topics
                            && broker.cluster.is_some()
                        {
                            // Created through etcd; the client retries until
                            // the topic has a leader.
                            create_in_cluster(broker, &n);
                            err(ResponseError::LeaderNotAvailable.code())
                        } else if allow_auto_create && broker.settings.auto_create_topics {
                            match catalog.create_topic(&n, broker.settings.num_partitions, 1, &[]) {
                                Ok(t) => describe_topic(broker, &t, version),
                                Err(e) => err(catalog_error_code(&e)),
                            }
                        } else {
                            err(ResponseError::UnknownTopicOrPartition.code())
                        }
                    }
                }
            })
            .collect(),
    };
    let brokers = brokers(broker, Some(listener))
        .into_iter()
        .map(|(id, host, port)| {
            MetadataResponseBroker::default()
                .with_node_id(BrokerId(id))
                .with_host(StrBytes::from_string(host))
                .with_port(port)
        })
        .collect();
    MetadataResponse::default()
        .with_brokers(brokers)
        .with_cluster_id(Some(StrBytes::from_string(cluster_id(broker))))
        .with_controller_id(BrokerId(controller_id(broker)))
        .with_topics(topics)
}

/// (node id, host, port) of every live broker that has `listener` (None:
/// every live broker, at its first listener's endpoint).
pub(super) fn brokers(broker: &Broker, listener: Option<&str>) -> Vec<(i32, String, i32)> {
    match &broker.cluster {
        None => {
            let own = broker
                .endpoints
                .iter()
                .find(|e| Some(e.name.as_str()) == listener)
                .map(|e| (e.host.clone(), e.port as i32))
                .unwrap_or_else(|| (broker.host.clone(), broker.port));
            vec![(broker.settings.node_id, own.0, own.1)]
        }
        Some(c) => c
            .brokers()
            .into_iter()
            .filter_map(|b| {
                let (host, port) = b.endpoint(listener)?;
                Some((b.node_id, host, port as i32))
            })
            .collect(),
    }
}

pub(super) fn cluster_id(broker: &Broker) -> String {
    match &broker.cluster {
        None => broker.catalog.cluster_id().to_string(),
        Some(c) => c.cluster_id().to_string(),
    }
}

fn controller_id(broker: &Broker) -> i32 {
    match &broker.cluster {
        None => broker.settings.node_id,
        Some(c) => c.controller().unwrap_or(-1),
    }
}

/// Auto-creates a topic in cluster mode, in the background: the catalog
/// follows once etcd has it.
fn create_in_cluster(broker: &Broker, name: &str) {
    let Some(cluster) = broker.cluster.clone() else {
        return;
    };
    let (name, partitions) = (name.to_string(), broker.settings.num_partitions);
    tokio::spawn(async move {
        let created = cluster
            .topics()
            .create(
                &name,
                partitions,
                DEFAULT_REPLICATION_FACTOR,
                Default::default(),
            )
            .await;
        if let Err(e) = created {
            tracing::debug!(topic = name, error = %e, "auto-creating a topic failed");
        }
    });
}

/// The partition's leader and leader epoch.
pub(super) fn leader(broker: &Broker, topic: &Topic, partition: i32) -> Option<(i32, i32)> {
    match &broker.cluster {
        None => Some((broker.settings.node_id, 0)),
        Some(c) => c.leader_of(topic.id(), partition),
    }
}

/// Where a partition is: leader, leader epoch and replicas (leader first,
/// see the module docs; all of them in sync), from one view of the cluster.
pub(super) struct Placement {
    pub leader: i32,
    pub epoch: i32,
    pub replicas: Vec<BrokerId>,
}

pub(super) fn placement(broker: &Broker, topic: &Topic, partition: i32) -> Option<Placement> {
    let (leader, epoch, replicas) = match &broker.cluster {
        None => {
            let node = broker.settings.node_id;
            (node, 0, vec![node])
        }
        Some(c) => {
            let state = c.view().state();
            let (leader, epoch) = state.leader_of(topic.id(), partition)?;
            let replicas = state.replicas_of(topic.name(), topic.id(), partition)?;
            (leader, epoch, replicas)
        }
    };
    Some(Placement {
        leader,
        epoch,
        replicas: replicas.into_iter().map(BrokerId).collect(),
    })
}

fn describe_topic(broker: &Broker, topic: &Topic, version: i16) -> MetadataResponseTopic {
    let partitions = (0..topic.partition_count() as i32)
        .map(|i| {
            let p = MetadataResponsePartition::default().with_partition_index(i);
            match placement(broker, topic, i) {
                Some(at) => p
                    .with_leader_id(BrokerId(at.leader))
                    .with_leader_epoch(at.epoch)
                    .with_isr_nodes(at.replicas.clone())
                    .with_replica_nodes(at.replicas),
                None => p
                    .with_error_code(ResponseError::LeaderNotAvailable.code())
                    .with_leader_id(BrokerId(-1))
                    .with_leader_epoch(-1),
            }
        })
        .collect();
    MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_string(
            topic.name().to_string(),
        ))))
        .with_topic_id(if version >= 10 {
            topic.id()
        } else {
            Uuid::nil()
        })
        .with_is_internal(topic.is_internal())
        .with_partitions(partitions)
}

pub(super) fn describe_cluster(
    broker: &Broker,
    _req: DescribeClusterRequest,
    _version: i16,
    listener: &str,
) -> DescribeClusterResponse {
    let brokers = brokers(broker, Some(listener))
        .into_iter()
        .map(|(id, host, port)| {
            DescribeClusterBroker::default()
                .with_broker_id(BrokerId(id))
                .with_host(StrBytes::from_string(host))
                .with_port(port)
        })
        .collect();
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(cluster_id(broker)))
        .with_controller_id(BrokerId(controller_id(broker)))
        .with_brokers(brokers)
}
