//! DescribeProducers: the producers a partition's leader knows, as
//! `kafka-transactions.sh describe-producers` shows them (Kafka answers from
//! the same producer state that checks sequences and tracks transactions).

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_producers_response::{
    PartitionResponse, ProducerState, TopicResponse,
};
use kafka_protocol::messages::{DescribeProducersRequest, DescribeProducersResponse, ProducerId};

use super::authorize::TOPIC_DENIED;
use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;

pub(super) const DESCRIBE_PRODUCERS: Api = api!(
    DescribeProducersRequest,
    0..=0,
    ready(handle_describe_producers)
);

error_codes! {
    DescribeProducersResponse => |r, f| for t in &r.topics {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
}

fn handle_describe_producers(
    b: &Arc<Broker>,
    r: DescribeProducersRequest,
    cx: &Ctx<'_>,
) -> DescribeProducersResponse {
    let mut resp = describe_producers(b, r);
    filter_describe_producers(b, cx, &mut resp);
    resp
}

/// DescribeProducers: READ on each topic.
fn filter_describe_producers(b: &Broker, cx: &Ctx<'_>, resp: &mut DescribeProducersResponse) {
    for t in &mut resp.topics {
        if !b.on_topic(cx, Operation::Read, &t.name) {
            for p in &mut t.partitions {
                p.active_producers.clear();
                p.error_code = TOPIC_DENIED;
            }
        }
    }
}

pub(super) fn describe_producers(
    broker: &Broker,
    req: DescribeProducersRequest,
) -> DescribeProducersResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.catalog.topic(t.name.0.as_str());
            let partitions = t
                .partition_indexes
                .into_iter()
                .map(|index| {
                    let resp = PartitionResponse::default().with_partition_index(index);
                    let served = match &topic {
                        Some(topic) => broker.served_partition(topic, index, -1),
                        None => Err(ResponseError::UnknownTopicOrPartition.code()),
                    };
                    match served {
                        Err(code) => resp.with_error_code(code),
                        Ok(partition) => resp.with_active_producers(
                            partition
                                .producers()
                                .into_iter()
                                .map(|p| {
                                    ProducerState::default()
                                        .with_producer_id(ProducerId(p.producer_id))
                                        .with_producer_epoch(p.epoch as i32)
                                        .with_last_sequence(p.last_sequence)
                                        .with_last_timestamp(p.last_timestamp)
                                        .with_coordinator_epoch(p.coordinator_epoch)
                                        .with_current_txn_start_offset(p.txn_start_offset)
                                })
                                .collect(),
                        ),
                    }
                })
                .collect();
            TopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DescribeProducersResponse::default().with_topics(topics)
}
