//! Consumer-group APIs: FindCoordinator, JoinGroup, SyncGroup, Heartbeat,
//! LeaveGroup, OffsetCommit, OffsetFetch, ListGroups, DescribeGroups,
//! DeleteGroups and OffsetDelete, translated to and from the coordinator.

use std::future::Future;
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

use super::authorize::{split, Resource, GROUP_DENIED, TOPIC_DENIED, TXN_ID_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{Operation, ResourceType};
use crate::coordinator::group::JoinParams;
use crate::coordinator::records::OffsetValue;
use crate::coordinator::store::OFFSETS_TOPIC;
use crate::coordinator::txn::store::TXN_TOPIC;
use crate::coordinator::{Committer, CoordinatorError, NotDescribed, OffsetCommit, TopicOffsets};

pub(super) const FIND_COORDINATOR: Api = api!(
    FindCoordinatorRequest,
    0..=6,
    ready(handle_find_coordinator)
);
pub(super) const JOIN_GROUP: Api = api!(
    JoinGroupRequest,
    0..=9,
    later(|b, r, cx| {
        let client_host = format!("/{}", cx.client_host);
        join_group(b.clone(), r, cx.version, cx.client_id(), client_host)
    }),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        JoinGroupResponse::default()
            .with_error_code(GROUP_DENIED)
            .with_generation_id(-1)
    })
);
pub(super) const SYNC_GROUP: Api = api!(
    SyncGroupRequest,
    0..=5,
    later(|b, r, cx| sync_group(b.clone(), r, cx.version)),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        SyncGroupResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const HEARTBEAT: Api = api!(
    HeartbeatRequest,
    0..=4,
    ready(|b, r, _| heartbeat(b, r)),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        HeartbeatResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const LEAVE_GROUP: Api = api!(
    LeaveGroupRequest,
    0..=5,
    ready(|b, r, cx| leave_group(b, r, cx.version)),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        LeaveGroupResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const OFFSET_COMMIT: Api =
    api!(OffsetCommitRequest, 2..=10, later(handle_offset_commit));
pub(super) const OFFSET_FETCH: Api = api!(OffsetFetchRequest, 1..=10, ready(handle_offset_fetch));
pub(super) const LIST_GROUPS: Api = api!(ListGroupsRequest, 0..=5, ready(handle_list_groups));
pub(super) const DESCRIBE_GROUPS: Api =
    api!(DescribeGroupsRequest, 0..=6, ready(handle_describe_groups));
pub(super) const DELETE_GROUPS: Api = api!(DeleteGroupsRequest, 0..=3, ready(handle_delete_groups));
pub(super) const OFFSET_DELETE: Api = api!(
    OffsetDeleteRequest,
    0..=0,
    ready(|b, r, _| offset_delete(b, r)),
    acl(Operation::Delete, Resource::Group(|r| &r.group_id), |_| {
        OffsetDeleteResponse::default().with_error_code(GROUP_DENIED)
    })
);

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

fn handle_find_coordinator(
    b: &Arc<Broker>,
    r: FindCoordinatorRequest,
    cx: &Ctx<'_>,
) -> FindCoordinatorResponse {
    let (key_type, key) = (r.key_type, r.key.to_string());
    let mut resp = find_coordinator(b, r, cx.version, cx.listener);
    filter_find_coordinator(b, cx, key_type, &mut resp, &key);
    resp
}

/// OffsetCommit and OffsetFetch v10 name topics by id only (KIP-848). The
/// coordinator keeps offsets by topic name, as Kafka's does, so ids are
/// resolved to names here, before authorization (which is by name), and the
/// answer names each topic by id again; an id no topic has is
/// UNKNOWN_TOPIC_ID for each of its partitions, as in Kafka.
fn topic_name_by_id(b: &Broker, id: uuid::Uuid) -> Option<TopicName> {
    b.catalog.topic_by_id(id).map(|t| TopicName(s(t.name())))
}

/// Names the topics a request sent by id (OffsetCommit v10, TxnOffsetCommit
/// v6): those whose id names a topic get its name and stay in `topics`, the
/// others are returned; the map gives each name the id it was sent as.
pub(super) fn name_topics_by_id<T>(
    b: &Broker,
    topics: &mut Vec<T>,
    id_and_name: impl Fn(&mut T) -> (uuid::Uuid, &mut TopicName),
) -> (Vec<T>, std::collections::HashMap<String, uuid::Uuid>) {
    let mut ids = std::collections::HashMap::new();
    let mut unknown = Vec::new();
    for mut t in std::mem::take(topics) {
        let (id, name) = id_and_name(&mut t);
        match topic_name_by_id(b, id) {
            Some(found) => {
                ids.insert(found.to_string(), id);
                *name = found;
                topics.push(t);
            }
            None => unknown.push(t),
        }
    }
    (unknown, ids)
}

fn topic_id_by_name(b: &Broker, name: &str) -> uuid::Uuid {
    b.catalog.topic(name).map_or(uuid::Uuid::nil(), |t| t.id())
}

fn handle_offset_commit(
    b: &Arc<Broker>,
    mut r: OffsetCommitRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = OffsetCommitResponse> + Send + 'static {
    let by_id = cx.version >= 10;
    let (unknown, ids) = if by_id {
        name_topics_by_id(b, &mut r.topics, |t| (t.topic_id, &mut t.name))
    } else {
        Default::default()
    };
    let unknown: Vec<_> = unknown
        .iter()
        .map(|t| refused_commit(t, ResponseError::UnknownTopicId.code()))
        .collect();
    let (r, denied) = authorize_offset_commit(b, cx, r);
    let pending = offset_commit(b.clone(), r, cx.version);
    async move {
        let mut resp = pending.await;
        resp.topics.extend(denied);
        if by_id {
            for t in &mut resp.topics {
                t.topic_id = ids.get(t.name.as_str()).copied().unwrap_or_default();
            }
        }
        resp.topics.extend(unknown);
        resp
    }
}

fn handle_offset_fetch(
    b: &Arc<Broker>,
    mut r: OffsetFetchRequest,
    cx: &Ctx<'_>,
) -> OffsetFetchResponse {
    let by_id = cx.version >= 10;
    // Per group (in request order), the topics whose ids name no topic.
    let mut unknown: Vec<Vec<OffsetFetchResponseTopics>> = Vec::new();
    if by_id {
        for g in &mut r.groups {
            let mut missing = Vec::new();
            if let Some(topics) = &mut g.topics {
                topics.retain_mut(|t| match topic_name_by_id(b, t.topic_id) {
                    Some(name) => {
                        t.name = name;
                        true
                    }
                    None => {
                        missing.push(unknown_topic_id(t.topic_id, &t.partition_indexes));
                        false
                    }
                });
            }
            unknown.push(missing);
        }
    }
    let group = r.group_id.to_string();
    let mut resp = offset_fetch(b, r, cx.version);
    filter_offset_fetch(b, cx, &mut resp, &group);
    if by_id {
        for (g, missing) in resp.groups.iter_mut().zip(unknown) {
            for t in &mut g.topics {
                t.topic_id = topic_id_by_name(b, t.name.as_str());
            }
            // A v10 client can only name a topic by id: offsets of a topic
            // that no longer exists (no id) are not listed.
            g.topics.retain(|t| !t.topic_id.is_nil());
            if g.error_code == 0 {
                g.topics.extend(missing);
            }
        }
    }
    resp
}

fn unknown_topic_id(id: uuid::Uuid, partitions: &[i32]) -> OffsetFetchResponseTopics {
    OffsetFetchResponseTopics::default()
        .with_topic_id(id)
        .with_partitions(
            partitions
                .iter()
                .map(|p| {
                    OffsetFetchResponsePartitions::default()
                        .with_partition_index(*p)
                        .with_committed_offset(-1)
                        .with_committed_leader_epoch(-1)
                        .with_error_code(ResponseError::UnknownTopicId.code())
                })
                .collect(),
        )
}

fn handle_list_groups(b: &Arc<Broker>, r: ListGroupsRequest, cx: &Ctx<'_>) -> ListGroupsResponse {
    let mut resp = list_groups(b, r, cx.version);
    filter_list_groups(b, cx, &mut resp);
    resp
}

fn handle_describe_groups(
    b: &Arc<Broker>,
    r: DescribeGroupsRequest,
    cx: &Ctx<'_>,
) -> DescribeGroupsResponse {
    let (r, denied) = authorize_describe_groups(b, cx, r);
    let operations = r.include_authorized_operations && cx.version >= 3;
    let mut resp = describe_groups(b, r, cx.version);
    if operations {
        for g in resp.groups.iter_mut().filter(|g| g.error_code == 0) {
            g.authorized_operations =
                b.authorized_operations(cx, ResourceType::Group, g.group_id.as_str());
        }
    }
    resp.groups.extend(denied);
    resp
}

fn handle_delete_groups(
    b: &Arc<Broker>,
    r: DeleteGroupsRequest,
    cx: &Ctx<'_>,
) -> DeleteGroupsResponse {
    let (r, denied) = authorize_delete_groups(b, cx, r);
    let mut resp = delete_groups(b, r, cx.version);
    resp.results.extend(denied);
    resp
}

/// FindCoordinator: DESCRIBE on the group (key type 0) or the transactional id (1).
fn filter_find_coordinator(
    b: &Broker,
    cx: &Ctx<'_>,
    key_type: i8,
    resp: &mut FindCoordinatorResponse,
    single_key: &str,
) {
    let check = |key: &str| -> Option<i16> {
        let (kind, code) = match key_type {
            1 => (ResourceType::TransactionalId, TXN_ID_DENIED),
            _ => (ResourceType::Group, GROUP_DENIED),
        };
        (!b.allowed(cx, Operation::Describe, kind, key)).then_some(code)
    };
    if cx.version < 4 {
        if let Some(code) = check(single_key) {
            *resp = FindCoordinatorResponse::default()
                .with_error_code(code)
                .with_node_id((-1).into());
        }
        return;
    }
    for c in &mut resp.coordinators {
        if let Some(code) = check(&c.key) {
            *c = find_coordinator_response::Coordinator::default()
                .with_key(c.key.clone())
                .with_error_code(code)
                .with_node_id((-1).into());
        }
    }
}

/// OffsetCommit: READ on the group (else every partition gets
/// GROUP_AUTHORIZATION_FAILED) and READ on each topic.
fn authorize_offset_commit(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: OffsetCommitRequest,
) -> (
    OffsetCommitRequest,
    Vec<offset_commit_response::OffsetCommitResponseTopic>,
) {
    let group_ok = b.on_group(cx, Operation::Read, &req.group_id);
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        group_ok && b.on_topic(cx, Operation::Read, &t.name)
    });
    req.topics = ok;
    let code = if group_ok { TOPIC_DENIED } else { GROUP_DENIED };
    let denied = denied.iter().map(|t| refused_commit(t, code)).collect();
    (req, denied)
}

/// An OffsetCommit topic answered `code` for every partition, named as the
/// request named it.
fn refused_commit(
    t: &offset_commit_request::OffsetCommitRequestTopic,
    code: i16,
) -> offset_commit_response::OffsetCommitResponseTopic {
    use offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
    OffsetCommitResponseTopic::default()
        .with_name(t.name.clone())
        .with_topic_id(t.topic_id)
        .with_partitions(
            t.partitions
                .iter()
                .map(|p| {
                    OffsetCommitResponsePartition::default()
                        .with_partition_index(p.partition_index)
                        .with_error_code(code)
                })
                .collect(),
        )
}

/// OffsetFetch: DESCRIBE on each group; topics the principal may not
/// DESCRIBE are left out of the answer, as Kafka does.
fn filter_offset_fetch(
    b: &Broker,
    cx: &Ctx<'_>,
    resp: &mut OffsetFetchResponse,
    single_group: &str,
) {
    if !single_group.is_empty() && !b.on_group(cx, Operation::Describe, single_group) {
        resp.topics.clear();
        resp.error_code = GROUP_DENIED;
    }
    resp.topics
        .retain(|t| b.on_topic(cx, Operation::Describe, &t.name));
    for g in &mut resp.groups {
        if !b.on_group(cx, Operation::Describe, &g.group_id) {
            g.topics.clear();
            g.error_code = GROUP_DENIED;
        }
        g.topics
            .retain(|t| b.on_topic(cx, Operation::Describe, &t.name));
    }
}

fn filter_list_groups(b: &Broker, cx: &Ctx<'_>, resp: &mut ListGroupsResponse) {
    if !b.on_cluster(cx, Operation::Describe) {
        resp.groups
            .retain(|g| b.on_group(cx, Operation::Describe, &g.group_id));
    }
}

fn authorize_describe_groups(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DescribeGroupsRequest,
) -> (
    DescribeGroupsRequest,
    Vec<describe_groups_response::DescribedGroup>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.groups), |g| {
        b.on_group(cx, Operation::Describe, g)
    });
    req.groups = ok;
    let denied = denied
        .into_iter()
        .map(|g| {
            describe_groups_response::DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED)
        })
        .collect();
    (req, denied)
}

fn authorize_delete_groups(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DeleteGroupsRequest,
) -> (
    DeleteGroupsRequest,
    Vec<delete_groups_response::DeletableGroupResult>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.groups_names), |g| {
        b.on_group(cx, Operation::Delete, g)
    });
    req.groups_names = ok;
    let denied = denied
        .into_iter()
        .map(|g| {
            delete_groups_response::DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED)
        })
        .collect();
    (req, denied)
}

const GROUP_KEY_TYPE: i8 = 0;
const TRANSACTION_KEY_TYPE: i8 = 1;

pub(super) fn error_code(e: &CoordinatorError) -> i16 {
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
        CoordinatorError::GroupNotFound(_) => ResponseError::GroupIdNotFound,
        CoordinatorError::StreamsInvalidTopology(_) => ResponseError::StreamsInvalidTopology,
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
pub(super) fn txn_coordinator(broker: &Broker, listener: &str) -> Option<(i32, String, i32)> {
    let Some(cluster) = &broker.cluster else {
        return group_coordinator(broker, listener);
    };
    let txn = broker.catalog.topic(TXN_TOPIC)?;
    let (leader, _) = cluster.leader_of(txn.id(), 0)?;
    super::metadata::brokers(broker, Some(listener))
        .into_iter()
        .find(|(id, _, _)| *id == leader)
}

pub(super) fn find_coordinator(
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

pub(super) async fn join_group(
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

pub(super) async fn sync_group(
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

pub(super) fn heartbeat(broker: &Broker, req: HeartbeatRequest) -> HeartbeatResponse {
    let r = broker.coordinator.heartbeat(
        req.group_id.as_str(),
        req.member_id.as_str(),
        req.group_instance_id.as_deref(),
        req.generation_id,
    );
    HeartbeatResponse::default().with_error_code(code_of(&r))
}

pub(super) fn leave_group(
    broker: &Broker,
    req: LeaveGroupRequest,
    version: i16,
) -> LeaveGroupResponse {
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

pub(super) async fn offset_commit(
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

pub(super) fn offset_fetch(
    broker: &Broker,
    req: OffsetFetchRequest,
    version: i16,
) -> OffsetFetchResponse {
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

pub(super) fn list_groups(
    broker: &Broker,
    req: ListGroupsRequest,
    version: i16,
) -> ListGroupsResponse {
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

pub(super) fn describe_groups(
    broker: &Broker,
    req: DescribeGroupsRequest,
    version: i16,
) -> DescribeGroupsResponse {
    let groups = req
        .groups
        .into_iter()
        .map(|id| match broker.coordinator.describe(id.as_str()) {
            // KIP-1043: from v6 a group DescribeGroups cannot describe is
            // GROUP_ID_NOT_FOUND with Kafka's message; before, a "Dead" group
            // without an error.
            Err(missing) => {
                let dead =
                    DescribedGroup::default().with_group_state(StrBytes::from_static_str("Dead"));
                let dead = if version >= 6 {
                    let message = match missing {
                        NotDescribed::NotFound => format!("Group {} not found.", id.as_str()),
                        NotDescribed::NotClassic => {
                            format!("Group {} is not a classic group.", id.as_str())
                        }
                    };
                    dead.with_error_code(ResponseError::GroupIdNotFound.code())
                        .with_error_message(Some(StrBytes::from_string(message)))
                } else {
                    dead
                };
                dead.with_group_id(id)
            }
            Ok(d) => {
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

/// From v3 a group that could not be deleted says why (`ErrorMessage`).
pub(super) fn delete_groups(
    broker: &Arc<Broker>,
    req: DeleteGroupsRequest,
    version: i16,
) -> DeleteGroupsResponse {
    let results = req
        .groups_names
        .into_iter()
        .map(|g| {
            let share = broker.coordinator.is_share_group(g.as_str());
            let r = broker.coordinator.delete_group(g.as_str());
            if share && r.is_ok() {
                // The group is gone already; its share-partition states
                // follow (a new group of that name must not inherit them).
                let (b, g) = (broker.clone(), g.to_string());
                tokio::spawn(async move { super::share_groups::delete_state(&b, &g).await });
            }
            let result = DeletableGroupResult::default().with_error_code(code_of(&r));
            let result = match &r {
                Err(e) if version >= 3 => {
                    result.with_error_message(Some(StrBytes::from_string(e.to_string())))
                }
                _ => result,
            };
            result.with_group_id(g)
        })
        .collect();
    DeleteGroupsResponse::default().with_results(results)
}

pub(super) fn offset_delete(broker: &Broker, req: OffsetDeleteRequest) -> OffsetDeleteResponse {
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
