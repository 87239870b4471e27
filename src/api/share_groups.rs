//! Share groups (KIP-932): membership (ShareGroupHeartbeat), what an
//! operator sees (ShareGroupDescribe, DescribeShareGroupOffsets) and what an
//! operator changes (AlterShareGroupOffsets, DeleteShareGroupOffsets).
//!
//! The group coordinator keeps the members and spreads the partitions over
//! them; the share coordinator keeps where each share-partition starts and
//! what is done with. Offsets are changed only while the group is empty,
//! through the share coordinator at a higher state epoch, which fences a
//! partition leader still holding the old state.

use std::sync::Arc;

use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::{Resource, GROUP_DENIED};
use super::dispatch::{api, Api};
use super::groups::error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::coordinator::share_group::HeartbeatParams;

pub(super) const SHARE_GROUP_HEARTBEAT: Api = api!(
    ShareGroupHeartbeatRequest,
    1..=1,
    later(|b, r, cx| {
        let client = (cx.client_id(), format!("/{}", cx.client_host));
        share_group_heartbeat(b.clone(), r, client)
    }),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        ShareGroupHeartbeatResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const SHARE_GROUP_DESCRIBE: Api = api!(
    ShareGroupDescribeRequest,
    1..=1,
    ready(share_group_describe)
);
error_codes! {
    ShareGroupHeartbeatResponse => |r, f| f(r.error_code);
    ShareGroupDescribeResponse => |r, f| r.groups.iter().for_each(|g| f(g.error_code));
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

async fn share_group_heartbeat(
    b: Arc<Broker>,
    r: ShareGroupHeartbeatRequest,
    client: (String, String),
) -> ShareGroupHeartbeatResponse {
    let params = HeartbeatParams {
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        rack_id: r.rack_id.map(|v| v.to_string()),
        subscribed_topic_names: r
            .subscribed_topic_names
            .map(|ts| ts.iter().map(|t| t.0.to_string()).collect()),
        client_id: client.0,
        client_host: client.1,
    };
    match b
        .coordinator
        .share_heartbeat(r.group_id.as_str(), params)
    {
        Ok(res) => ShareGroupHeartbeatResponse::default()
            .with_member_id(Some(s(&res.member_id)))
            .with_member_epoch(res.member_epoch)
            .with_heartbeat_interval_ms(res.heartbeat_interval_ms)
            .with_assignment(res.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .map(|(id, ps)| {
                            TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(ps.into_iter().collect())
                        })
                        .collect(),
                )
            })),
        Err(e) => ShareGroupHeartbeatResponse::default()
            .with_error_code(error_code(&e))
            .with_error_message(Some(s(&e.to_string()))),
    }
}

fn share_group_describe(
    b: &Arc<Broker>,
    r: ShareGroupDescribeRequest,
    cx: &super::dispatch::Ctx<'_>,
) -> ShareGroupDescribeResponse {
    use kafka_protocol::messages::share_group_describe_response as d;
    let groups = r
        .group_ids
        .into_iter()
        .map(|id| {
            let group = d::DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(i32::MIN);
            if !b.on_group(cx, Operation::Describe, id.as_str()) {
                return group.with_error_code(GROUP_DENIED);
            }
            match b.coordinator.share_describe(id.as_str()) {
                Err(e) => group
                    .with_error_code(error_code(&e))
                    .with_error_message(Some(s(&e.to_string())))
                    .with_group_state(StrBytes::from_static_str("Dead")),
                Ok((state, epoch, assignment_epoch, members)) => group
                    .with_group_state(StrBytes::from_static_str(state))
                    .with_group_epoch(epoch)
                    .with_assignment_epoch(assignment_epoch)
                    .with_assignor_name(StrBytes::from_static_str("simple"))
                    .with_members(
                        members
                            .into_iter()
                            .map(|m| {
                                let tps = m
                                    .assigned
                                    .iter()
                                    .filter_map(|(id, ps)| {
                                        let t = b.catalog.topic_by_id(*id)?;
                                        Some(
                                            d::TopicPartitions::default()
                                                .with_topic_id(*id)
                                                .with_topic_name(TopicName(s(t.name())))
                                                .with_partitions(ps.iter().copied().collect()),
                                        )
                                    })
                                    .collect();
                                d::Member::default()
                                    .with_member_id(s(&m.id))
                                    .with_rack_id(m.rack_id.as_deref().map(s))
                                    .with_member_epoch(m.epoch)
                                    .with_client_id(s(&m.client_id))
                                    .with_client_host(s(&m.client_host))
                                    .with_subscribed_topic_names(
                                        m.subscribed.iter().map(|t| TopicName(s(t))).collect(),
                                    )
                                    .with_assignment(
                                        d::Assignment::default().with_topic_partitions(tps),
                                    )
                            })
                            .collect(),
                    ),
            }
        })
        .collect();
    ShareGroupDescribeResponse::default().with_groups(groups)
}
