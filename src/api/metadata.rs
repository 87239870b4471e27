//! Metadata and DescribeCluster: one broker, leader of every partition.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_cluster_response::DescribeClusterBroker;
use kafka_protocol::messages::metadata_response::{
    MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
};
use kafka_protocol::messages::{
    BrokerId, DescribeClusterRequest, DescribeClusterResponse, MetadataRequest, MetadataResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::error::catalog_error_code;
use super::Broker;
use crate::catalog::{validate_topic_name, Topic};

pub fn metadata(broker: &Broker, req: MetadataRequest, version: i16) -> MetadataResponse {
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
                let name = rt.name.as_ref().map(|n| n.0.to_string());
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
                        } else if allow_auto_create && broker.auto_create_topics {
                            match catalog.create_topic(&n, broker.num_partitions, 1, &[]) {
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
    MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(broker.node_id))
            .with_host(StrBytes::from_string(broker.host.clone()))
            .with_port(broker.port)])
        .with_cluster_id(Some(StrBytes::from_string(
            catalog.cluster_id().to_string(),
        )))
        .with_controller_id(BrokerId(broker.node_id))
        .with_topics(topics)
}

fn describe_topic(broker: &Broker, topic: &Topic, version: i16) -> MetadataResponseTopic {
    let node = BrokerId(broker.node_id);
    let partitions = (0..topic.partition_count() as i32)
        .map(|i| {
            MetadataResponsePartition::default()
                .with_partition_index(i)
                .with_leader_id(node)
                .with_leader_epoch(0)
                .with_replica_nodes(vec![node])
                .with_isr_nodes(vec![node])
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

pub fn describe_cluster(
    broker: &Broker,
    _req: DescribeClusterRequest,
    _version: i16,
) -> DescribeClusterResponse {
    DescribeClusterResponse::default()
        .with_cluster_id(StrBytes::from_string(
            broker.catalog.cluster_id().to_string(),
        ))
        .with_controller_id(BrokerId(broker.node_id))
        .with_brokers(vec![DescribeClusterBroker::default()
            .with_broker_id(BrokerId(broker.node_id))
            .with_host(StrBytes::from_string(broker.host.clone()))
            .with_port(broker.port)])
}
