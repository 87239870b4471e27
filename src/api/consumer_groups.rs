//! The consumer group protocol's own APIs (KIP-848): ConsumerGroupHeartbeat
//! and ConsumerGroupDescribe, translated to and from the coordinator. The
//! offset APIs both protocols share live in `groups`. With `group.version`
//! finalized at 0 both are refused UNSUPPORTED_VERSION, as Kafka refuses
//! them, and consumers stay with (or fall back to) the classic protocol.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_group_describe_response::{
    self as describe, DescribedGroup,
};
use kafka_protocol::messages::consumer_group_heartbeat_response::{self as heartbeat, Assignment};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::{split, Resource, GROUP_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::groups::error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{Operation, ResourceType};
use crate::coordinator::consumer::HeartbeatParams;
use crate::coordinator::{CoordinatorError, NamedAssignment, NotDescribed};

pub(super) const CONSUMER_GROUP_HEARTBEAT: Api = api!(
    ConsumerGroupHeartbeatRequest,
    0..=1,
    later(|b, r, cx| {
        let client_host = format!("/{}", cx.client_host);
        consumer_group_heartbeat(b.clone(), r, cx.version, cx.client_id(), client_host)
    }),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        ConsumerGroupHeartbeatResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const CONSUMER_GROUP_DESCRIBE: Api = api!(
    ConsumerGroupDescribeRequest,
    0..=1,
    ready(handle_consumer_group_describe)
);

error_codes! {
    ConsumerGroupHeartbeatResponse => |r, f| f(r.error_code);
    ConsumerGroupDescribeResponse => |r, f| r.groups.iter().for_each(|g| f(g.error_code));
}

fn handle_consumer_group_describe(
    b: &Arc<Broker>,
    r: ConsumerGroupDescribeRequest,
    cx: &Ctx<'_>,
) -> ConsumerGroupDescribeResponse {
    let (r, denied) = authorize_consumer_group_describe(b, cx, r);
    if !protocol_enabled(b) {
        let refused = r.group_ids.into_iter().map(|g| {
            DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(ResponseError::UnsupportedVersion.code())
        });
        return ConsumerGroupDescribeResponse::default()
            .with_groups(refused.chain(denied).collect());
    }
    let operations = r.include_authorized_operations;
    let mut resp = consumer_group_describe(b, r, cx.version);
    if operations {
        for g in resp.groups.iter_mut().filter(|g| g.error_code == 0) {
            g.authorized_operations =
                b.authorized_operations(cx, ResourceType::Group, g.group_id.as_str());
        }
    }
    resp.groups.extend(denied);
    resp
}

/// Whether `group.version` has the consumer rebalance protocol on.
fn protocol_enabled(b: &Broker) -> bool {
    b.features.level(super::features::GROUP_VERSION) >= 1
}

fn authorize_consumer_group_describe(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: ConsumerGroupDescribeRequest,
) -> (
    ConsumerGroupDescribeRequest,
    Vec<consumer_group_describe_response::DescribedGroup>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.group_ids), |g| {
        b.on_group(cx, Operation::Describe, g)
    });
    req.group_ids = ok;
    let denied = denied
        .into_iter()
        .map(|g| {
            consumer_group_describe_response::DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED)
        })
        .collect();
    (req, denied)
}

/// Kafka's "authorized operations not requested".
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;
/// ConsumerGroupDescribe v1: the member speaks the classic or the consumer protocol.
const CLASSIC_MEMBER: i8 = 0;
const CONSUMER_MEMBER: i8 = 1;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

pub(super) async fn consumer_group_heartbeat(
    broker: Arc<Broker>,
    req: ConsumerGroupHeartbeatRequest,
    version: i16,
    client_id: String,
    client_host: String,
) -> ConsumerGroupHeartbeatResponse {
    if !protocol_enabled(&broker) {
        return ConsumerGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code());
    }
    let params = HeartbeatParams {
        member_id: req.member_id.to_string(),
        member_epoch: req.member_epoch,
        instance_id: req.instance_id.as_ref().map(|v| v.to_string()),
        rack_id: req.rack_id.as_ref().map(|v| v.to_string()),
        rebalance_timeout_ms: req.rebalance_timeout_ms,
        subscribed_topic_names: req
            .subscribed_topic_names
            .as_ref()
            .map(|ts| ts.iter().map(|t| t.to_string()).collect()),
        subscribed_topic_regex: req.subscribed_topic_regex.as_ref().map(|v| v.to_string()),
        server_assignor: req.server_assignor.as_ref().map(|v| v.to_string()),
        owned: req.topic_partitions.as_ref().map(|tps| {
            tps.iter()
                .map(|tp| (tp.topic_id, tp.partitions.clone()))
                .collect()
        }),
        client_id,
        client_host,
    };
    let result = broker
        .coordinator
        .consumer_heartbeat(req.group_id.as_str(), params, version)
        .await;
    match result {
        Ok(r) => ConsumerGroupHeartbeatResponse::default()
            .with_member_id(Some(s(&r.member_id)))
            .with_member_epoch(r.member_epoch)
            .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
            .with_assignment(r.assignment.map(|a| {
                Assignment::default().with_topic_partitions(
                    a.into_iter()
                        .filter(|(_, ps)| !ps.is_empty())
                        .map(|(id, ps)| {
                            heartbeat::TopicPartitions::default()
                                .with_topic_id(id)
                                .with_partitions(ps.into_iter().collect())
                        })
                        .collect(),
                )
            })),
        Err(e) => ConsumerGroupHeartbeatResponse::default()
            .with_error_code(error_code(&e))
            .with_error_message(Some(s(&e.to_string()))),
    }
}

fn assignment(a: NamedAssignment) -> describe::Assignment {
    describe::Assignment::default().with_topic_partitions(
        a.into_iter()
            .map(|(id, name, partitions)| {
                describe::TopicPartitions::default()
                    .with_topic_id(id)
                    .with_topic_name(TopicName(s(&name)))
                    .with_partitions(partitions)
            })
            .collect(),
    )
}

pub(super) fn consumer_group_describe(
    broker: &Broker,
    req: ConsumerGroupDescribeRequest,
    version: i16,
) -> ConsumerGroupDescribeResponse {
    let groups = req
        .group_ids
        .into_iter()
        .map(|id| {
            let group = DescribedGroup::default()
                .with_group_id(id.clone())
                .with_authorized_operations(OPERATIONS_NOT_REQUESTED);
            match broker.coordinator.consumer_describe(id.as_str()) {
                Err(e) => {
                    let message = match &e {
                        // Kafka's two messages: no group at all, or a classic one.
                        CoordinatorError::GroupIdNotFound => {
                            match broker.coordinator.describe(id.as_str()) {
                                Err(NotDescribed::NotFound) => {
                                    format!("Group {} not found.", id.as_str())
                                }
                                _ => format!("Group {} is not a consumer group.", id.as_str()),
                            }
                        }
                        other => other.to_string(),
                    };
                    group
                        .with_error_code(error_code(&e))
                        .with_error_message(Some(s(&message)))
                        .with_group_state(StrBytes::from_static_str("Dead"))
                }
                Ok(d) => group
                    .with_group_state(StrBytes::from_static_str(d.state))
                    .with_group_epoch(d.epoch)
                    .with_assignment_epoch(d.assignment_epoch)
                    .with_assignor_name(s(&d.assignor))
                    .with_members(
                        d.members
                            .into_iter()
                            .map(|m| {
                                let member_type = match m.classic {
                                    true => CLASSIC_MEMBER,
                                    false => CONSUMER_MEMBER,
                                };
                                let member = describe::Member::default()
                                    .with_member_id(s(&m.member_id))
                                    .with_instance_id(m.instance_id.map(StrBytes::from_string))
                                    .with_rack_id(m.rack_id.map(StrBytes::from_string))
                                    .with_member_epoch(m.epoch)
                                    .with_client_id(s(&m.client_id))
                                    .with_client_host(s(&m.client_host))
                                    .with_subscribed_topic_names(
                                        m.subscribed_topic_names
                                            .iter()
                                            .map(|t| TopicName(s(t)))
                                            .collect(),
                                    )
                                    .with_subscribed_topic_regex(
                                        m.subscribed_topic_regex.map(StrBytes::from_string),
                                    )
                                    .with_assignment(assignment(m.assignment))
                                    .with_target_assignment(assignment(m.target));
                                if version >= 1 {
                                    member.with_member_type(member_type)
                                } else {
                                    member
                                }
                            })
                            .collect(),
                    ),
            }
        })
        .collect();
    ConsumerGroupDescribeResponse::default().with_groups(groups)
}
