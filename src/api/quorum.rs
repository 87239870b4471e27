//! DescribeQuorum: Kafka's KRaft quorum, as far as it has a counterpart.
//!
//! Kafka keeps its metadata in the `__cluster_metadata` log, replicated by a
//! Raft quorum of controllers. Alone, this broker is its own controller and
//! keeps metadata in its data directory: the quorum is one voter, itself,
//! whose metadata log is empty (end offset and high watermark 0) and which,
//! like a Kafka leader describing itself, is caught up as of the answer. In
//! cluster mode the metadata lives in etcd and one broker is elected
//! controller: it is the one voter and the leader, the other live brokers
//! are observers, the controller's etcd fencing token is the leader epoch,
//! and etcd's revision plays the metadata log's end offset. Every live
//! broker follows etcd through a watch under a live lease (one whose
//! keep-alives stop is no longer listed), so each is reported at that end
//! offset, caught up as of the answer.
//!
//! Kafka reports -1 only for what a leader has not heard yet; nothing here
//! is unknown in that way, so no field is negative (clients check them).

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_quorum_response::{
    Listener, Node, PartitionData, ReplicaState, TopicData,
};
use kafka_protocol::messages::{BrokerId, DescribeQuorumRequest, DescribeQuorumResponse};
use kafka_protocol::protocol::StrBytes;

use super::authorize::{Resource, CLUSTER_DENIED};
use super::dispatch::{api, Api};
use super::metadata::brokers;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;

pub(super) const DESCRIBE_QUORUM: Api = api!(
    DescribeQuorumRequest,
    0..=2,
    ready(|b, r, cx| describe_quorum(b, r, cx.version)),
    acl(Operation::Describe, Resource::Cluster, |_| {
        DescribeQuorumResponse::default().with_error_code(CLUSTER_DENIED)
    })
);

error_codes! {
    DescribeQuorumResponse => |r, f| {
        f(r.error_code);
        for t in &r.topics {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    };
}

const METADATA_TOPIC: &str = "__cluster_metadata";

pub(super) fn describe_quorum(
    broker: &Broker,
    req: DescribeQuorumRequest,
    version: i16,
) -> DescribeQuorumResponse {
    // (leader, epoch, high watermark), and the observers.
    let (leader, epoch, high_watermark) = match &broker.cluster {
        None => (Some(broker.settings.node_id), 0, 0),
        Some(c) => {
            let state = c.view().state();
            let epoch = state.controller_token.clamp(0, i32::MAX as i64) as i32;
            (state.controller, epoch, state.revision)
        }
    };
    let live = brokers(broker, None);
    let now = broker.clock.now_ms();
    let replica = |id: i32| {
        ReplicaState::default()
            .with_replica_id(BrokerId(id))
            .with_log_end_offset(high_watermark)
            .with_last_fetch_timestamp(now)
            .with_last_caught_up_timestamp(now)
    };
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let is_metadata = t.topic_name.0.as_str() == METADATA_TOPIC;
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let d = PartitionData::default().with_partition_index(p.partition_index);
                    if !is_metadata || p.partition_index != 0 {
                        return d.with_error_code(ResponseError::UnknownTopicOrPartition.code());
                    }
                    let Some(leader) = leader else {
                        return d
                            .with_error_code(ResponseError::NotLeaderOrFollower.code())
                            .with_leader_id(BrokerId(-1))
                            .with_leader_epoch(-1);
                    };
                    d.with_leader_id(BrokerId(leader))
                        .with_leader_epoch(epoch)
                        .with_high_watermark(high_watermark)
                        .with_current_voters(vec![replica(leader)])
                        .with_observers(
                            live.iter()
                                .filter(|(id, _, _)| *id != leader)
                                .map(|(id, _, _)| replica(*id))
                                .collect(),
                        )
                })
                .collect();
            TopicData::default()
                .with_topic_name(t.topic_name)
                .with_partitions(partitions)
        })
        .collect();
    let mut resp = DescribeQuorumResponse::default().with_topics(topics);
    if version >= 2 {
        resp = resp.with_nodes(
            live.into_iter()
                .filter(|(id, _, _)| Some(*id) == leader)
                .map(|(id, host, port)| {
                    Node::default()
                        .with_node_id(BrokerId(id))
                        .with_listeners(vec![Listener::default()
                            .with_name(StrBytes::from_static_str("PLAINTEXT"))
                            .with_host(StrBytes::from_string(host))
                            .with_port(port as u16)])
                })
                .collect(),
        );
    }
    resp
}
