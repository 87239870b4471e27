//! Consumer-group protocol over raw requests: the join handshake, fencing,
//! session expiry and the error codes for bad commits, with no effect on other
//! groups.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::{InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::offset_fetch_request::OffsetFetchRequestTopic;
use kafka_protocol::messages::sync_group_request::SyncGroupRequestAssignment;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

const FAST: &[&str] = &[
    "--group-initial-rebalance-delay-ms",
    "0",
    "--group-min-session-timeout-ms",
    "500",
];

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

fn join_req(
    group: &str,
    member: &str,
    instance: Option<&str>,
    session_ms: i32,
) -> JoinGroupRequest {
    JoinGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_session_timeout_ms(session_ms)
        .with_rebalance_timeout_ms(session_ms)
        .with_member_id(s(member))
        .with_group_instance_id(instance.map(s))
        .with_protocol_type(s("consumer"))
        .with_protocols(vec![JoinGroupRequestProtocol::default()
            .with_name(s("range"))
            .with_metadata(Bytes::from_static(b"sub"))])
}

async fn join(raw: &mut Raw, req: &JoinGroupRequest) -> JoinGroupResponse {
    raw.call(ApiKey::JoinGroup, 7, req).await
}

/// Joins a new dynamic member through the MEMBER_ID_REQUIRED handshake.
async fn join_new(raw: &mut Raw, group: &str, session_ms: i32) -> JoinGroupResponse {
    let first = join(raw, &join_req(group, "", None, session_ms)).await;
    assert_eq!(first.error_code, ResponseError::MemberIdRequired.code());
    assert!(!first.member_id.is_empty());
    let second = join(raw, &join_req(group, &first.member_id, None, session_ms)).await;
    assert_eq!(second.error_code, 0);
    assert_eq!(second.member_id, first.member_id);
    second
}

async fn sync(
    raw: &mut Raw,
    group: &str,
    member: &str,
    generation: i32,
    assignment: &'static [u8],
) -> SyncGroupResponse {
    let req = SyncGroupRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id(generation)
        .with_member_id(s(member))
        .with_assignments(vec![SyncGroupRequestAssignment::default()
            .with_member_id(s(member))
            .with_assignment(Bytes::from_static(assignment))]);
    raw.call(ApiKey::SyncGroup, 5, &req).await
}

async fn heartbeat(
    raw: &mut Raw,
    group: &str,
    member: &str,
    instance: Option<&str>,
    generation: i32,
) -> i16 {
    let req = HeartbeatRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_member_id(s(member))
        .with_group_instance_id(instance.map(s))
        .with_generation_id(generation);
    let resp: HeartbeatResponse = raw.call(ApiKey::Heartbeat, 4, &req).await;
    resp.error_code
}

/// Commits `offset` with `metadata` for (topic, partition) as (group, member, generation).
async fn commit(
    raw: &mut Raw,
    (group, member, generation): (&str, &str, i32),
    (topic, partition): (&str, i32),
    offset: i64,
    metadata: &str,
) -> i16 {
    let req = OffsetCommitRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_generation_id_or_member_epoch(generation)
        .with_member_id(s(member))
        .with_topics(vec![OffsetCommitRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partitions(vec![OffsetCommitRequestPartition::default()
                .with_partition_index(partition)
                .with_committed_offset(offset)
                .with_committed_metadata(Some(s(metadata)))])]);
    let resp: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 8, &req).await;
    resp.topics[0].partitions[0].error_code
}

async fn committed(raw: &mut Raw, group: &str, topic: &str, partition: i32) -> (i64, String) {
    let req = OffsetFetchRequest::default()
        .with_group_id(GroupId(s(group)))
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(TopicName(s(topic)))
            .with_partition_indexes(vec![partition])]));
    let resp: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 7, &req).await;
    let p = &resp.topics[0].partitions[0];
    (
        p.committed_offset,
        p.metadata
            .as_ref()
            .map(|m| m.to_string())
            .unwrap_or_default(),
    )
}

async fn create_topic(raw: &mut Raw, name: &str) {
    let req = CreateTopicsRequest::default().with_topics(vec![CreatableTopic::default()
        .with_name(TopicName(s(name)))
        .with_num_partitions(2)
        .with_replication_factor(1)]);
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_sync_heartbeat_and_fencing() {
    let broker = InProcess::start(FAST).await;
    let mut a = Raw::connect(broker.addr()).await;
    let mut b = Raw::connect(broker.addr()).await;

    assert_eq!(
        join(&mut a, &join_req("", "", None, 10_000))
            .await
            .error_code,
        ResponseError::InvalidGroupId.code()
    );
    assert_eq!(
        join(&mut a, &join_req("g", "", None, 100)).await.error_code,
        ResponseError::InvalidSessionTimeout.code()
    );
    assert_eq!(
        join(&mut a, &join_req("g", "who-is-this", None, 10_000))
            .await
            .error_code,
        ResponseError::UnknownMemberId.code()
    );

    let first = join_new(&mut a, "g", 10_000).await;
    assert_eq!(first.generation_id, 1);
    assert_eq!(first.leader, first.member_id);
    assert_eq!(first.protocol_name.as_deref(), Some("range"));
    assert_eq!(first.members.len(), 1);
    let me = first.member_id.to_string();
    assert_eq!(
        sync(&mut a, "g", &me, 1, b"mine").await.assignment,
        Bytes::from_static(b"mine")
    );
    assert_eq!(heartbeat(&mut a, "g", &me, None, 1).await, 0);
    assert_eq!(
        heartbeat(&mut a, "g", &me, None, 0).await,
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        heartbeat(&mut a, "g", "stranger", None, 1).await,
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        heartbeat(&mut a, "nogroup", &me, None, 1).await,
        ResponseError::UnknownMemberId.code()
    );

    // A second member triggers a rebalance; the first learns it from its heartbeat and rejoins.
    let b_first = join(&mut b, &join_req("g", "", None, 10_000)).await;
    let b_id = b_first.member_id.to_string();
    b.send(ApiKey::JoinGroup, 7, &join_req("g", &b_id, None, 10_000))
        .await;
    // (on another connection: give the broker a moment to take b's join)
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        heartbeat(&mut a, "g", &me, None, 1).await,
        ResponseError::RebalanceInProgress.code()
    );
    let rejoin = join(&mut a, &join_req("g", &me, None, 10_000)).await;
    let b_join: JoinGroupResponse = b.receive(ApiKey::JoinGroup, 7).await.unwrap();
    assert_eq!(rejoin.generation_id, 2);
    assert_eq!(b_join.generation_id, 2);
    assert_eq!(rejoin.members.len(), 2, "the leader sees every member");
    assert!(b_join.members.is_empty());
    // Follower waits for the leader's assignment.
    let req = SyncGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_generation_id(2)
        .with_member_id(s(&b_id));
    b.send(ApiKey::SyncGroup, 5, &req).await;
    let leader_sync = SyncGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_generation_id(2)
        .with_member_id(s(&me))
        .with_assignments(vec![
            SyncGroupRequestAssignment::default()
                .with_member_id(s(&me))
                .with_assignment(Bytes::from_static(b"p0")),
            SyncGroupRequestAssignment::default()
                .with_member_id(s(&b_id))
                .with_assignment(Bytes::from_static(b"p1")),
        ]);
    let resp: SyncGroupResponse = a.call(ApiKey::SyncGroup, 5, &leader_sync).await;
    assert_eq!(resp.assignment, Bytes::from_static(b"p0"));
    let resp: SyncGroupResponse = b.receive(ApiKey::SyncGroup, 5).await.unwrap();
    assert_eq!(resp.assignment, Bytes::from_static(b"p1"));

    // Describe shows both members and their assignments.
    let d: DescribeGroupsResponse = a
        .call(
            ApiKey::DescribeGroups,
            5,
            &DescribeGroupsRequest::default().with_groups(vec![GroupId(s("g"))]),
        )
        .await;
    assert_eq!(d.groups[0].group_state.as_str(), "Stable");
    assert_eq!(d.groups[0].members.len(), 2);

    // The leader leaves; the remaining member is alone after rejoining.
    let leave = LeaveGroupRequest::default()
        .with_group_id(GroupId(s("g")))
        .with_members(vec![
            leave_group_request::MemberIdentity::default().with_member_id(s(&me))
        ]);
    let resp: LeaveGroupResponse = a.call(ApiKey::LeaveGroup, 5, &leave).await;
    assert_eq!(resp.members[0].error_code, 0);
    assert_eq!(
        heartbeat(&mut b, "g", &b_id, None, 2).await,
        ResponseError::RebalanceInProgress.code()
    );
    let alone = join(&mut b, &join_req("g", &b_id, None, 10_000)).await;
    assert_eq!(
        (alone.generation_id, alone.leader.to_string()),
        (3, b_id.clone())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_members_are_fenced_and_sessions_expire() {
    let broker = InProcess::start(FAST).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let j = join(&mut raw, &join_req("st", "", Some("instance-1"), 1000)).await;
    assert_eq!(j.error_code, 0, "static members skip MEMBER_ID_REQUIRED");
    let old = j.member_id.to_string();
    sync(&mut raw, "st", &old, j.generation_id, b"a").await;
    // The same instance restarts: new member id, same generation, no rebalance.
    let again = join(&mut raw, &join_req("st", "", Some("instance-1"), 1000)).await;
    assert_eq!(again.error_code, 0);
    assert_ne!(again.member_id.to_string(), old);
    assert_eq!(again.generation_id, j.generation_id);
    assert_eq!(
        heartbeat(&mut raw, "st", &old, Some("instance-1"), j.generation_id).await,
        ResponseError::FencedInstanceId.code()
    );
    let new_id = again.member_id.to_string();
    assert_eq!(
        heartbeat(&mut raw, "st", &new_id, Some("instance-1"), j.generation_id).await,
        0
    );

    // Without heartbeats the session (1 s) expires and the group empties.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    assert_eq!(
        heartbeat(&mut raw, "st", &new_id, Some("instance-1"), j.generation_id).await,
        ResponseError::UnknownMemberId.code()
    );
    let groups: ListGroupsResponse = raw
        .call(ApiKey::ListGroups, 4, &ListGroupsRequest::default())
        .await;
    assert!(groups
        .groups
        .iter()
        .all(|g| g.group_id.as_str() != "st" || g.group_state.as_str() == "Empty"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_commits_get_error_codes_and_leave_other_groups_alone() {
    let broker = InProcess::start(FAST).await;
    let mut raw = Raw::connect(broker.addr()).await;
    create_topic(&mut raw, "t").await;

    // A standalone (generation -1) commit by another group, to check it stays untouched.
    assert_eq!(
        commit(&mut raw, ("bystander", "", -1), ("t", 0), 5, "keep").await,
        0
    );

    let j = join_new(&mut raw, "g", 10_000).await;
    let me = j.member_id.to_string();
    sync(&mut raw, "g", &me, j.generation_id, b"x").await;
    assert_eq!(
        commit(&mut raw, ("g", &me, j.generation_id), ("t", 1), 42, "ok").await,
        0
    );
    assert_eq!(
        commit(&mut raw, ("g", &me, j.generation_id), ("nope", 0), 1, "").await,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        commit(&mut raw, ("g", &me, j.generation_id), ("t", 9), 1, "").await,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        commit(&mut raw, ("g", &me, j.generation_id - 1), ("t", 1), 1, "").await,
        ResponseError::IllegalGeneration.code()
    );
    assert_eq!(
        commit(
            &mut raw,
            ("g", "intruder", j.generation_id),
            ("t", 1),
            1,
            ""
        )
        .await,
        ResponseError::UnknownMemberId.code()
    );
    assert_eq!(
        commit(&mut raw, ("g", "", -1), ("t", 1), 1, "").await,
        ResponseError::UnknownMemberId.code(),
        "active group refuses standalone commits"
    );
    let huge = "m".repeat(5000);
    assert_eq!(
        commit(&mut raw, ("g", &me, j.generation_id), ("t", 1), 1, &huge).await,
        ResponseError::OffsetMetadataTooLarge.code()
    );

    assert_eq!(
        committed(&mut raw, "g", "t", 1).await,
        (42, "ok".to_string())
    );
    assert_eq!(committed(&mut raw, "g", "t", 0).await.0, -1);
    assert_eq!(
        committed(&mut raw, "bystander", "t", 0).await,
        (5, "keep".to_string())
    );

    // Deleting a group with members is refused; an empty one goes with its offsets.
    let del: DeleteGroupsResponse = raw
        .call(
            ApiKey::DeleteGroups,
            2,
            &DeleteGroupsRequest::default().with_groups_names(vec![GroupId(s("g"))]),
        )
        .await;
    assert_eq!(
        del.results[0].error_code,
        ResponseError::NonEmptyGroup.code()
    );
    let del: DeleteGroupsResponse = raw
        .call(
            ApiKey::DeleteGroups,
            2,
            &DeleteGroupsRequest::default()
                .with_groups_names(vec![GroupId(s("bystander")), GroupId(s("ghost"))]),
        )
        .await;
    assert_eq!(del.results[0].error_code, 0);
    assert_eq!(
        del.results[1].error_code,
        ResponseError::GroupIdNotFound.code()
    );
    assert_eq!(committed(&mut raw, "bystander", "t", 0).await.0, -1);
    assert_eq!(committed(&mut raw, "g", "t", 1).await.0, 42);
}
