//! Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups,
//! DeleteGroups and OffsetDelete, translated to and from the coordinator.

use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_groups_response::DeletableGroupResult;
use kafka_protocol::messages::describe_groups_response::{DescribedGroup, DescribedGroupMember};
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::leave_group_response::MemberResponse;
use kafka_protocol::messages::list_groups_response::ListedGroup;
use kafka_protocol::messages::offset_commit_response::{
    OffsetCommitResponsePartition, OffsetCommitResponseTopic,
};
use kafka_protocol::messages::offset_delete_response::{
    OffsetDeleteResponsePartition, OffsetDeleteResponseTopic,
};
use kafka_protocol::messages::offset_fetch_response::{
    OffsetFetchResponseGroup, OffsetFetchResponsePartition, OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic, OffsetFetchResponseTopics,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::metrics::error_codes;
use super::Broker;
use crate::coordinator::group::JoinParams;
use crate::coordinator::records::OffsetValue;
use crate::coordinator::store::OFFSETS_TOPIC;
use crate::coordinator::txn::store::TXN_TOPIC;
use crate::coordinator::{Committer, CoordinatorError, OffsetCommit, TopicOffsets};

error_codes! {
    FindCoordinatorResponse => |r, f| {
        f(r.error_code);
        r.coordinators.iter().for_each(|c| f(c.error_code));
    };
    JoinGroupResponse => |r, f| f(r.error_code);
    SyncGroupResponse => |r, f| f(r.error_code);
    HeartbeatResponse => |r, f| f(r.error_code);
    LeaveGroupResponse => |r, f| {
        f(r.error_code);
        r.members.iter().for_each(|m| f(m.error_code));
    };
    OffsetCommitResponse => |r, f| for t in &r.topics {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
    OffsetFetchResponse => |r, f| {
        f(r.error_code);
        for t in &r.topics {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
        for g in &r.groups {
            f(g.error_code);
            for t in &g.topics {
                t.partitions.iter().for_each(|p| f(p.error_code));
            }
        }
    };
    ListGroupsResponse => |r, f| f(r.error_code);
    DescribeGroupsResponse => |r, f| r.groups.iter().for_each(|g| f(g.error_code));
    DeleteGroupsResponse => |r, f| r.results.iter().for_each(|g| f(g.error_code));
    OffsetDeleteResponse => |r, f| {
        f(r.error_code);
        for t in &r.topics {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    };
}

const GROUP_KEY_TYPE: i8 = 0;
const TRANSACTION_KEY_TYPE: i8 = 1;

pub fn error_code(e: &CoordinatorError) -> i16 {
    match e {
        CoordinatorError::InvalidGroupId => ResponseError::InvalidGroupId,
        CoordinatorError::InvalidSessionTimeout => ResponseError::InvalidSessionTimeout,
        CoordinatorError::InconsistentGroupProtocol => ResponseError::InconsistentGroupProtocol,
        CoordinatorError::UnknownMemberId => ResponseError::UnknownMemberId,
        CoordinatorError::MemberIdRequired(_) => ResponseError::MemberIdRequired,
        CoordinatorError::IllegalGeneration => ResponseError::IllegalGeneration,
        CoordinatorError::RebalanceInProgress => ResponseError::RebalanceInProgress,
        CoordinatorError::FencedInstanceId => ResponseError::FencedInstanceId,
        CoordinatorError::GroupIdNotFound => ResponseError::GroupIdNotFound,
        CoordinatorError::NonEmptyGroup => ResponseError::NonEmptyGroup,
        CoordinatorError::OffsetMetadataTooLarge(_) => ResponseError::OffsetMetadataTooLarge,
        CoordinatorError::UnknownTopicOrPartition => ResponseError::UnknownTopicOrPartition,
        CoordinatorError::GroupSubscribedToTopic => ResponseError::GroupSubscribedToTopic,
        CoordinatorError::Storage(_) => ResponseError::CoordinatorNotAvailable,
        CoordinatorError::NotCoordinator => ResponseError::NotCoordinator,
        CoordinatorError::InvalidRequest(_) => ResponseError::InvalidRequest,
        CoordinatorError::FencedMemberEpoch => ResponseError::FencedMemberEpoch,
        CoordinatorError::StaleMemberEpoch => ResponseError::StaleMemberEpoch,
        CoordinatorError::UnreleasedInstanceId(_) => ResponseError::UnreleasedInstanceId,
        CoordinatorError::GroupMaxSizeReached(_) => ResponseError::GroupMaxSizeReached,
        CoordinatorError::UnsupportedAssignor(_) => ResponseError::UnsupportedAssignor,
        CoordinatorError::InvalidRegularExpression(_) => ResponseError::InvalidRegularExpression,
        CoordinatorError::UnsupportedVersion(_) => ResponseError::UnsupportedVersion,
        CoordinatorError::InvalidProducerEpoch => ResponseError::InvalidProducerEpoch,
    }
    .code()
}

fn code_of(r: &Result<(), CoordinatorError>) -> i16 {
    r.as_ref().err().map_or(0, error_code)
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn opt(v: &Option<StrBytes>) -> Option<String> {
    v.as_ref().map(|x| x.to_string())
}

/// Every group's coordinator: this broker alone, or in cluster mode the
/// leader of the offsets topic's partition (it has one), as in Kafka.
fn group_coordinator(broker: &Broker, listener: &str) -> Option<(i32, String, i32)> {
    let leader = match &broker.cluster {
        None => broker.settings.node_id,
        Some(cluster) => {
            let offsets = broker.catalog.topic(OFFSETS_TOPIC)?;
            cluster.leader_of(offsets.id(), 0)?.0
        }
    };
    super::metadata::brokers(broker, Some(listener))
        .into_iter()
        .find(|(id, _, _)| *id == leader)
}

/// Every transactional id's coordinator: this broker alone, or the leader
/// of `__transaction_state`'s partition.
fn txn_coordinator(broker: &Broker, listener: &str) -> Option<(i32, String, i32)> {
    let Some(cluster) = &broker.cluster else {
        return group_coordinator(broker, listener);
    };
    let txn = broker.catalog.topic(TXN_TOPIC)?;
    let (leader, _) = cluster.leader_of(txn.id(), 0)?;
    super::metadata::brokers(broker, Some(listener))
        .into_iter()
        .find(|(id, _, _)| *id == leader)
}

pub fn find_coordinator(
    broker: &Broker,
    req: FindCoordinatorRequest,
    version: i16,
    listener: &str,
) -> FindCoordinatorResponse {
    let answer = |key: &StrBytes| {
        let c = Coordinator::default().with_key(key.clone());
        let found = match req.key_type {
            GROUP_KEY_TYPE => group_coordinator(broker, listener),
            TRANSACTION_KEY_TYPE => txn_coordinator(broker, listener),
            _ => {
                return c
                    .with_error_code(ResponseError::InvalidRequest.code())
                    .with_error_message(Some(StrBytes::from_static_str("unknown key type")))
                    .with_node_id(BrokerId(-1))
                    .with_port(-1)
            }
        };
        match found {
            Some((node, host, port)) => c
                .with_node_id(BrokerId(node))
                .with_host(s(&host))
                .with_port(port),
            None => c
                .with_error_code(ResponseError::CoordinatorNotAvailable.code())
                .with_node_id(BrokerId(-1))
                .with_port(-1),
        }
    };
    if version >= 4 {
        return FindCoordinatorResponse::default()
            .with_coordinators(req.coordinator_keys.iter().map(answer).collect());
    }
    let c = answer(&req.key);
    let resp = FindCoordinatorResponse::default()
        .with_error_code(c.error_code)
        .with_node_id(c.node_id)
        .with_host(c.host)
        .with_port(c.port);
    if version >= 1 {
        resp.with_error_message(c.error_message)
    } else {
        resp
    }
}

pub async fn join_group(
    broker: Arc<Broker>,
    req: JoinGroupRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> JoinGroupResponse {
    let session = Duration::from_millis(req.session_timeout_ms.max(0) as u64);
    let params = JoinParams {
        member_id: req.member_id.to_string(),
        instance_id: opt(&req.group_instance_id),
        client_id,
        client_host,
        session_timeout: session,
        rebalance_timeout: if version >= 1 {
            Duration::from_millis(req.rebalance_timeout_ms.max(0) as u64)
        } else {
            session
        },
        protocol_type: req.protocol_type.to_string(),
        protocols: req
            .protocols
            .iter()
            .map(|p| (p.name.to_string(), p.metadata.clone()))
            .collect(),
        require_known_member_id: version >= 4,
    };
    match broker.coordinator.join(req.group_id.as_str(), params).await {
        Ok(r) => {
            let members = r
                .members
                .into_iter()
                .map(|(id, iid, metadata)| {
                    let m = JoinGroupResponseMember::default()
                        .with_member_id(s(&id))
                        .with_metadata(metadata);
                    if version >= 5 {
                        m.with_group_instance_id(iid.map(StrBytes::from_string))
                    } else {
                        m
                    }
                })
                .collect();
            JoinGroupResponse::default()
                .with_generation_id(r.generation)
                .with_protocol_type(r.protocol_type.map(StrBytes::from_string))
                .with_protocol_name(Some(StrBytes::from_string(
                    r.protocol_name.unwrap_or_default(),
                )))
                .with_leader(s(&r.leader))
                .with_member_id(s(&r.member_id))
                .with_members(members)
        }
        Err(e) => {
            let member_id = match &e {
                CoordinatorError::MemberIdRequired(id) => s(id),
                _ => req.member_id.clone(),
            };
            JoinGroupResponse::default()
                .with_error_code(error_code(&e))
                .with_generation_id(-1)
                .with_protocol_name(if version >= 7 {
                    None
                } else {
                    Some(StrBytes::default())
                })
                .with_member_id(member_id)
        }
    }
}

pub async fn sync_group(
    broker: Arc<Broker>,
    req: SyncGroupRequest,
    version: i16,
) -> SyncGroupResponse {
    let assignments = req
        .assignments
        .iter()
        .map(|a| (a.member_id.to_string(), a.assignment.clone()))
        .collect();
    let result = broker
        .coordinator
        .sync(
            req.group_id.as_str(),
            req.member_id.as_str(),
            req.group_instance_id.as_deref(),
            req.generation_id,
            req.protocol_type.as_deref(),
            req.protocol_name.as_deref(),
            assignments,
        )
        .await;
    match result {
        Ok(r) => {
            let resp = SyncGroupResponse::default().with_assignment(r.assignment);
            if version >= 5 {
                resp.with_protocol_type(r.protocol_type.map(StrBytes::from_string))
                    .with_protocol_name(r.protocol_name.map(StrBytes::from_string))
            } else {
                resp
            }
        }
        Err(e) => SyncGroupResponse::default().with_error_code(error_code(&e)),
    }
}

pub fn heartbeat(broker: &Broker, req: HeartbeatRequest) -> HeartbeatResponse {
    let r = broker.coordinator.heartbeat(
        req.group_id.as_str(),
        req.member_id.as_str(),
        req.group_instance_id.as_deref(),
        req.generation_id,
    );
    HeartbeatResponse::default().with_error_code(code_of(&r))
}

pub fn leave_group(broker: &Broker, req: LeaveGroupRequest, version: i16) -> LeaveGroupResponse {
    let members: Vec<(String, Option<String>)> = if version >= 3 {
        req.members
            .iter()
            .map(|m| (m.member_id.to_string(), opt(&m.group_instance_id)))
            .collect()
    } else {
        vec![(req.member_id.to_string(), None)]
    };
    match broker.coordinator.leave(req.group_id.as_str(), &members) {
        Err(e) => LeaveGroupResponse::default().with_error_code(error_code(&e)),
        Ok(results) if version >= 3 => LeaveGroupResponse::default().with_members(
            members
                .into_iter()
                .zip(results)
                .map(|((id, iid), r)| {
                    MemberResponse::default()
                        .with_member_id(s(&id))
                        .with_group_instance_id(iid.map(StrBytes::from_string))
                        .with_error_code(code_of(&r))
                })
                .collect(),
        ),
        Ok(results) => {
            LeaveGroupResponse::default().with_error_code(results.first().map_or(0, code_of))
        }
    }
}

pub async fn offset_commit(
    broker: Arc<Broker>,
    req: OffsetCommitRequest,
    version: i16,
) -> OffsetCommitResponse {
    let who = Committer {
        member_id: req.member_id.to_string(),
        instance_id: opt(&req.group_instance_id),
        generation: req.generation_id_or_member_epoch,
        version,
    };
    let offsets: Vec<OffsetCommit> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| OffsetCommit {
                topic: t.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: p.committed_leader_epoch,
                metadata: opt(&p.committed_metadata),
            })
        })
        .collect();
    let outcome = broker
        .coordinator
        .commit(req.group_id.as_str(), &who, offsets)
        .await;
    let topics = req
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let code = match &outcome {
                        Err(e) => error_code(e),
                        Ok(results) => results
                            .iter()
                            .find(|((topic, part), _)| {
                                topic == t.name.as_str() && *part == p.partition_index
                            })
                            .map_or(0, |(_, r)| code_of(r)),
                    };
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect();
            OffsetCommitResponseTopic::default()
                .with_name(t.name.clone())
                .with_partitions(partitions)
        })
        .collect();
    OffsetCommitResponse::default().with_topics(topics)
}

fn fetched_partition(p: i32, v: Option<OffsetValue>) -> (i32, i64, i32, Option<StrBytes>) {
    match v {
        Some(v) => (
            p,
            v.offset,
            v.leader_epoch,
            Some(StrBytes::from_string(v.metadata)),
        ),
        None => (p, -1, -1, Some(StrBytes::default())),
    }
}

/// With require_stable (a read_committed consumer, KIP-447), partitions with
/// transactional offsets not yet committed are answered UNSTABLE_OFFSET_COMMIT
/// and the consumer asks again.
fn unstable(
    broker: &Broker,
    group_id: &str,
    require_stable: bool,
) -> std::collections::HashSet<(String, i32)> {
    if require_stable {
        broker.coordinator.unstable_offsets(group_id)
    } else {
        Default::default()
    }
}

pub fn offset_fetch(broker: &Broker, req: OffsetFetchRequest, version: i16) -> OffsetFetchResponse {
    if version >= 8 {
        let groups = req
            .groups
            .into_iter()
            .map(|g| {
                let wanted = g.topics.map(|ts| {
                    ts.into_iter()
                        .map(|t| (t.name.to_string(), t.partition_indexes))
                        .collect()
                });
                // v9: a consumer-protocol member names itself and its epoch.
                if let Err(e) = broker.coordinator.validate_fetch(
                    g.group_id.as_str(),
                    g.member_id.as_deref(),
                    if version >= 9 { g.member_epoch } else { -1 },
                ) {
                    return OffsetFetchResponseGroup::default()
                        .with_group_id(g.group_id)
                        .with_error_code(error_code(&e));
                }
                let fetched: TopicOffsets = broker
                    .coordinator
                    .fetch_offsets(g.group_id.as_str(), wanted);
                let unstable = unstable(broker, g.group_id.as_str(), req.require_stable);
                let topics = fetched
                    .into_iter()
                    .map(|(t, parts)| {
                        let partitions = parts
                            .into_iter()
                            .map(|(p, v)| {
                                let (p, offset, epoch, meta) = fetched_partition(p, v);
                                let r = OffsetFetchResponsePartitions::default()
                                    .with_partition_index(p)
                                    .with_committed_offset(offset)
                                    .with_committed_leader_epoch(epoch)
                                    .with_metadata(meta);
                                if unstable.contains(&(t.clone(), p)) {
                                    r.with_committed_offset(-1)
                                        .with_error_code(ResponseError::UnstableOffsetCommit.code())
                                } else {
                                    r
                                }
                            })
                            .collect();
                        OffsetFetchResponseTopics::default()
                            .with_name(TopicName(s(&t)))
                            .with_partitions(partitions)
                    })
                    .collect();
                OffsetFetchResponseGroup::default()
                    .with_group_id(g.group_id)
                    .with_topics(topics)
            })
            .collect();
        return OffsetFetchResponse::default().with_groups(groups);
    }
    let wanted = req.topics.map(|ts| {
        ts.into_iter()
            .map(|t| (t.name.to_string(), t.partition_indexes))
            .collect()
    });
    let fetched = broker
        .coordinator
        .fetch_offsets(req.group_id.as_str(), wanted);
    let unstable = unstable(
        broker,
        req.group_id.as_str(),
        version >= 7 && req.require_stable,
    );
    let topics = fetched
        .into_iter()
        .map(|(t, parts)| {
            let partitions = parts
                .into_iter()
                .map(|(p, v)| {
                    let (p, offset, epoch, meta) = fetched_partition(p, v);
                    let r = OffsetFetchResponsePartition::default()
                        .with_partition_index(p)
                        .with_committed_offset(offset)
                        .with_metadata(meta);
                    let r = if version >= 5 {
                        r.with_committed_leader_epoch(epoch)
                    } else {
                        r
                    };
                    if unstable.contains(&(t.clone(), p)) {
                        r.with_committed_offset(-1)
                            .with_error_code(ResponseError::UnstableOffsetCommit.code())
                    } else {
                        r
                    }
                })
                .collect();
            OffsetFetchResponseTopic::default()
                .with_name(TopicName(s(&t)))
                .with_partitions(partitions)
        })
        .collect();
    OffsetFetchResponse::default().with_topics(topics)
}

pub fn list_groups(broker: &Broker, req: ListGroupsRequest, version: i16) -> ListGroupsResponse {
    let groups = broker
        .coordinator
        .list()
        .into_iter()
        .filter(|g| {
            req.types_filter.is_empty()
                || req
                    .types_filter
                    .iter()
                    .any(|t| t.eq_ignore_ascii_case(g.group_type))
        })
        .filter(|g| {
            req.states_filter.is_empty()
                || req
                    .states_filter
                    .iter()
                    .any(|st| st.eq_ignore_ascii_case(g.state))
        })
        .map(|g| {
            let l = ListedGroup::default()
                .with_group_id(GroupId(s(&g.group_id)))
                .with_protocol_type(s(&g.protocol_type));
            let l = if version >= 4 {
                l.with_group_state(StrBytes::from_static_str(g.state))
            } else {
                l
            };
            if version >= 5 {
                l.with_group_type(StrBytes::from_static_str(g.group_type))
            } else {
                l
            }
        })
        .collect();
    ListGroupsResponse::default().with_groups(groups)
}

pub fn describe_groups(
    broker: &Broker,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .into_iter()
        .map(|id| match broker.coordinator.describe(id.as_str()) {
            None => DescribedGroup::default()
                .with_group_id(id)
                .with_group_state(StrBytes::from_static_str("Dead")),
            Some(d) => {
                let members = d
                    .members
                    .into_iter()
                    .map(|m| {
                        let dm = DescribedGroupMember::default()
                            .with_member_id(s(&m.member_id))
                            .with_client_id(s(&m.client_id))
                            .with_client_host(s(&m.client_host))
                            .with_member_metadata(m.metadata)
                            .with_member_assignment(m.assignment);
                        if version >= 4 {
                            dm.with_group_instance_id(m.instance_id.map(StrBytes::from_string))
                        } else {
                            dm
                        }
                    })
                    .collect();
                DescribedGroup::default()
                    .with_group_id(id)
                    .with_group_state(StrBytes::from_static_str(d.state))
                    .with_protocol_type(s(&d.protocol_type))
                    .with_protocol_data(s(&d.protocol))
                    .with_members(members)
            }
        })
        .collect();
    DescribeGroupsResponse::default().with_groups(groups)
}

pub fn delete_groups(broker: &Broker, req: DeleteGroupsRequest) -> DeleteGroupsResponse {
    let results = req
        .groups_names
        .into_iter()
        .map(|g| {
            let r = broker.coordinator.delete_group(g.as_str());
            DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(code_of(&r))
        })
        .collect();
    DeleteGroupsResponse::default().with_results(results)
}

pub fn offset_delete(broker: &Broker, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
    let wanted = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.name.to_string(), p.partition_index))
        })
        .collect();
    match broker
        .coordinator
        .delete_offsets(req.group_id.as_str(), wanted)
    {
        Err(e) => OffsetDeleteResponse::default().with_error_code(error_code(&e)),
        Ok(results) => {
            let topics = req
                .topics
                .iter()
                .map(|t| {
                    let partitions = t
                        .partitions
                        .iter()
                        .map(|p| {
                            let code = results
                                .iter()
                                .find(|((topic, part), _)| {
                                    topic == t.name.as_str() && *part == p.partition_index
                                })
                                .map_or(0, |(_, r)| code_of(r));
                            OffsetDeleteResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect();
                    OffsetDeleteResponseTopic::default()
                        .with_name(t.name.clone())
                        .with_partitions(partitions)
                })
                .collect();
            OffsetDeleteResponse::default().with_topics(topics)
        }
    }
}
