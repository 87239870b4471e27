//! The partition admin APIs tools probe: DescribeTopicPartitions (KIP-966),
//! ElectLeaders, ListPartitionReassignments and AlterPartitionReassignments.
//!
//! The data lives in the object store, so there is nothing to replicate and
//! no follower to elect or move to. A partition's replicas are reported as
//! its leader followed by the brokers that could take it over, up to the
//! topic's replication factor (see `metadata`), always all in sync. Alone,
//! this broker leads everything; in cluster mode the controller assigns
//! leaders and moves them when a broker dies. So a partition with a leader
//! needs no election (ELECTION_NOT_NEEDED, as Kafka answers when the
//! preferred replica already leads); a reassignment to the replicas the
//! partition is reported with is a successful no-op, and any other is
//! refused with Kafka's error for it; no reassignment is ever in progress.

use std::collections::BTreeSet;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_partition_reassignments_response::{
    ReassignablePartitionResponse, ReassignableTopicResponse,
};
use kafka_protocol::messages::describe_topic_partitions_response::{
    Cursor, DescribeTopicPartitionsResponsePartition, DescribeTopicPartitionsResponseTopic,
};
use kafka_protocol::messages::elect_leaders_response::{PartitionResult, ReplicaElectionResult};
use kafka_protocol::messages::{
    AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
    DescribeTopicPartitionsRequest, DescribeTopicPartitionsResponse, ElectLeadersRequest,
    ElectLeadersResponse, ListPartitionReassignmentsRequest, ListPartitionReassignmentsResponse,
    TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::authorize::{Resource, CLUSTER_DENIED, TOPIC_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::metadata::{brokers, leader, placement};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{Operation, ResourceType};

pub(super) const ELECT_LEADERS: Api = api!(
    ElectLeadersRequest,
    0..=2,
    ready(|b, r, _| elect_leaders(b, r)),
    acl(Operation::Alter, Resource::Cluster, |_| {
        ElectLeadersResponse::default().with_error_code(CLUSTER_DENIED)
    })
);
pub(super) const ALTER_PARTITION_REASSIGNMENTS: Api = api!(
    AlterPartitionReassignmentsRequest,
    0..=1,
    ready(|b, r, _| alter_partition_reassignments(b, r)),
    acl(Operation::Alter, Resource::Cluster, |_| {
        AlterPartitionReassignmentsResponse::default().with_error_code(CLUSTER_DENIED)
    })
);
pub(super) const LIST_PARTITION_REASSIGNMENTS: Api = api!(
    ListPartitionReassignmentsRequest,
    0..=0,
    ready(|b, r, _| list_partition_reassignments(b, r)),
    acl(Operation::Describe, Resource::Cluster, |_| {
        ListPartitionReassignmentsResponse::default().with_error_code(CLUSTER_DENIED)
    })
);
pub(super) const DESCRIBE_TOPIC_PARTITIONS: Api = api!(
    DescribeTopicPartitionsRequest,
    0..=0,
    ready(handle_describe_topic_partitions)
);

error_codes! {
    ElectLeadersResponse => |r, f| {
        f(r.error_code);
        for t in &r.replica_election_results {
            t.partition_result.iter().for_each(|p| f(p.error_code));
        }
    };
    AlterPartitionReassignmentsResponse => |r, f| {
        f(r.error_code);
        for t in &r.responses {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    };
    ListPartitionReassignmentsResponse => |r, f| f(r.error_code);
    DescribeTopicPartitionsResponse => |r, f| for t in &r.topics {
        f(t.error_code);
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
}

/// DescribeTopicPartitions: a topic the principal may not DESCRIBE is
/// answered TOPIC_AUTHORIZATION_FAILED, without its partitions.
fn handle_describe_topic_partitions(
    b: &Arc<Broker>,
    r: DescribeTopicPartitionsRequest,
    cx: &Ctx<'_>,
) -> DescribeTopicPartitionsResponse {
    let mut resp = describe_topic_partitions(b, r);
    for t in &mut resp.topics {
        if t.name
            .as_ref()
            .is_some_and(|n| !b.on_topic(cx, Operation::Describe, n))
        {
            t.partitions.clear();
            t.error_code = TOPIC_DENIED;
        } else if let (Some(n), 0) = (&t.name, t.error_code) {
            // Always reported here, as Kafka does.
            t.topic_authorized_operations = b.authorized_operations(cx, ResourceType::Topic, n);
        }
    }
    resp
}

/// Kafka's `max.request.partition.size.limit` default: the most partitions
/// one DescribeTopicPartitions response holds.
const MAX_PARTITIONS_PER_RESPONSE: i32 = 2000;

const PREFERRED_ELECTION: i8 = 0;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn message(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

/// Topics in name order from the cursor on, at most
/// `response_partition_limit` partitions, and the cursor to continue from.
pub(super) fn describe_topic_partitions(
    broker: &Broker,
    req: DescribeTopicPartitionsRequest,
) -> DescribeTopicPartitionsResponse {
    let mut budget = match req.response_partition_limit {
        l if l <= 0 => MAX_PARTITIONS_PER_RESPONSE,
        l => l.min(MAX_PARTITIONS_PER_RESPONSE),
    };
    // Named topics, or all; in name order either way, as Kafka.
    let names: BTreeSet<String> = if req.topics.is_empty() {
        broker
            .catalog
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect()
    } else {
        req.topics.iter().map(|t| t.name.0.to_string()).collect()
    };
    let (first_topic, first_partition) = match &req.cursor {
        Some(c) => {
            let topic = c.topic_name.0.to_string();
            if c.partition_index < 0 || (!req.topics.is_empty() && !names.contains(&topic)) {
                // Kafka fails the whole request for a cursor outside the request.
                return DescribeTopicPartitionsResponse::default().with_topics(vec![
                    DescribeTopicPartitionsResponseTopic::default()
                        .with_name(Some(c.topic_name.clone()))
                        .with_error_code(ResponseError::InvalidRequest.code()),
                ]);
            }
            (Some(topic), c.partition_index)
        }
        None => (None, 0),
    };
    let mut topics = Vec::new();
    let mut next_cursor = None;
    let mut names = names
        .into_iter()
        .filter(|n| first_topic.as_ref().is_none_or(|f| n >= f))
        .peekable();
    while let Some(topic_name) = names.next() {
        let Some(topic) = broker.catalog.topic(&topic_name) else {
            topics.push(
                DescribeTopicPartitionsResponseTopic::default()
                    .with_name(Some(name(&topic_name)))
                    .with_error_code(ResponseError::UnknownTopicOrPartition.code()),
            );
            continue;
        };
        let start = if first_topic.as_deref() == Some(topic_name.as_str()) {
            first_partition
        } else {
            0
        };
        let count = topic.partition_count() as i32;
        let mut partitions = Vec::new();
        let mut index = start;
        while index < count && budget > 0 {
            partitions.push(describe_partition(broker, &topic, index));
            index += 1;
            budget -= 1;
        }
        topics.push(
            DescribeTopicPartitionsResponseTopic::default()
                .with_name(Some(name(&topic_name)))
                .with_topic_id(topic.id())
                .with_is_internal(topic.is_internal())
                .with_partitions(partitions),
        );
        if index < count {
            next_cursor = Some((topic_name, index));
            break;
        }
        if budget == 0 {
            if let Some(next) = names.peek() {
                next_cursor = Some((next.clone(), 0));
            }
            break;
        }
    }
    DescribeTopicPartitionsResponse::default()
        .with_topics(topics)
        .with_next_cursor(next_cursor.map(|(topic, partition)| {
            Cursor::default()
                .with_topic_name(name(&topic))
                .with_partition_index(partition)
        }))
}

fn describe_partition(
    broker: &Broker,
    topic: &crate::catalog::Topic,
    index: i32,
) -> DescribeTopicPartitionsResponsePartition {
    let p = DescribeTopicPartitionsResponsePartition::default()
        .with_partition_index(index)
        .with_eligible_leader_replicas(Some(Vec::new()))
        .with_last_known_elr(Some(Vec::new()));
    match placement(broker, topic, index) {
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
}

/// A partition that has a leader needs no election; one without has no
/// replica that could be elected (the controller assigns one when it can).
pub(super) fn elect_leaders(broker: &Broker, req: ElectLeadersRequest) -> ElectLeadersResponse {
    let all = req.topic_partitions.is_none();
    let wanted: Vec<(String, Vec<i32>)> = match req.topic_partitions {
        Some(list) => list
            .into_iter()
            .map(|t| (t.topic.0.to_string(), t.partitions))
            .collect(),
        None => broker
            .catalog
            .topics()
            .iter()
            .map(|t| {
                let n = t.partition_count() as i32;
                (t.name().to_string(), (0..n).collect())
            })
            .collect(),
    };
    let results = wanted
        .into_iter()
        .filter_map(|(topic_name, partitions)| {
            let topic = broker.catalog.topic(&topic_name);
            let results: Vec<PartitionResult> = partitions
                .into_iter()
                .map(|index| {
                    let r = PartitionResult::default().with_partition_id(index);
                    let exists = topic
                        .as_ref()
                        .is_some_and(|t| index >= 0 && (index as usize) < t.partition_count());
                    if !exists {
                        return r
                            .with_error_code(ResponseError::UnknownTopicOrPartition.code())
                            .with_error_message(message(
                                "The topic or partition does not exist",
                            ));
                    }
                    match leader(broker, topic.as_ref().expect("exists"), index) {
                        Some(_) => r
                            .with_error_code(ResponseError::ElectionNotNeeded.code())
                            .with_error_message(message(
                                "The partition's preferred replica already leads it",
                            )),
                        None if req.election_type == PREFERRED_ELECTION => r
                            .with_error_code(ResponseError::PreferredLeaderNotAvailable.code())
                            .with_error_message(message(
                                "No replica of the partition is available; the controller assigns a leader",
                            )),
                        None => r
                            .with_error_code(ResponseError::EligibleLeadersNotAvailable.code())
                            .with_error_message(message(
                                "No replica of the partition is available; the controller assigns a leader",
                            )),
                    }
                })
                // Asked for every partition, Kafka lists only those it elected or failed to.
                .filter(|r| !all || r.error_code != ResponseError::ElectionNotNeeded.code())
                .collect();
            (!results.is_empty()).then(|| {
                ReplicaElectionResult::default()
                    .with_topic(name(&topic_name))
                    .with_partition_result(results)
            })
        })
        .collect();
    ElectLeadersResponse::default().with_replica_election_results(results)
}

/// Nothing is ever being reassigned.
pub(super) fn list_partition_reassignments(
    _broker: &Broker,
    _req: ListPartitionReassignmentsRequest,
) -> ListPartitionReassignmentsResponse {
    ListPartitionReassignmentsResponse::default()
}

/// Each partition keeps the replicas it is reported with: naming exactly
/// those, leader first, is a no-op that succeeds; anything else is refused
/// with the error Kafka gives for it.
pub(super) fn alter_partition_reassignments(
    broker: &Broker,
    req: AlterPartitionReassignmentsRequest,
) -> AlterPartitionReassignmentsResponse {
    let live: BTreeSet<i32> = brokers(broker, None)
        .into_iter()
        .map(|(id, _, _)| id)
        .collect();
    let responses = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.catalog.topic(t.name.0.as_str());
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let r = ReassignablePartitionResponse::default()
                        .with_partition_index(p.partition_index);
                    let (code, why) = reassign(
                        broker,
                        topic.as_deref(),
                        p.partition_index,
                        p.replicas.as_deref(),
                        &live,
                        req.allow_replication_factor_change,
                    );
                    r.with_error_code(code.map_or(0, |c| c.code()))
                        .with_error_message(why.map(StrBytes::from_string))
                })
                .collect();
            ReassignableTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    AlterPartitionReassignmentsResponse::default()
        .with_allow_replication_factor_change(req.allow_replication_factor_change)
        .with_responses(responses)
}

fn reassign(
    broker: &Broker,
    topic: Option<&crate::catalog::Topic>,
    index: i32,
    replicas: Option<&[BrokerId]>,
    live: &BTreeSet<i32>,
    allow_replication_factor_change: bool,
) -> (Option<ResponseError>, Option<String>) {
    let Some(topic) = topic.filter(|t| index >= 0 && (index as usize) < t.partition_count()) else {
        return (Some(ResponseError::UnknownTopicOrPartition), None);
    };
    let Some(replicas) = replicas else {
        // Cancelling: there is nothing to cancel.
        return (
            Some(ResponseError::NoReassignmentInProgress),
            Some(format!(
                "No ongoing reassignment for {}-{index}",
                topic.name()
            )),
        );
    };
    let refuse = |e: ResponseError, why: String| (Some(e), Some(why));
    if replicas.is_empty() {
        return refuse(
            ResponseError::InvalidReplicaAssignment,
            "The manual partition assignment includes an empty replica list.".into(),
        );
    }
    let ids: BTreeSet<i32> = replicas.iter().map(|b| b.0).collect();
    if ids.len() != replicas.len() {
        return refuse(
            ResponseError::InvalidReplicaAssignment,
            "The manual partition assignment includes duplicate broker ids.".into(),
        );
    }
    if let Some(unknown) = ids.iter().find(|id| !live.contains(id)) {
        return refuse(
            ResponseError::InvalidReplicaAssignment,
            format!("The manual partition assignment includes broker {unknown}, which is not registered."),
        );
    }
    let current = placement(broker, topic, index).map(|at| at.replicas);
    let factor = current.as_ref().map_or(1, |r| r.len());
    if replicas.len() != factor {
        return if allow_replication_factor_change {
            refuse(
                ResponseError::InvalidReplicaAssignment,
                "A partition's replicas are its leader and the brokers that would take it over; their number is the topic's replication factor, fixed at creation."
                    .into(),
            )
        } else {
            refuse(
                ResponseError::InvalidReplicationFactor,
                format!("The replication factor is changed from {factor} to a different value."),
            )
        };
    }
    match current {
        Some(current) if current == replicas => (None, None),
        _ => refuse(
            ResponseError::InvalidReplicaAssignment,
            "The cluster controller decides which broker leads a partition; it cannot be moved by hand."
                .into(),
        ),
    }
}
