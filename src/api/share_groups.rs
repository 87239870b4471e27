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

use kafka_protocol::error::ResponseError;
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
    if !enabled(&b) {
        return ShareGroupHeartbeatResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code());
    }
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
    match b.coordinator.share_heartbeat(r.group_id.as_str(), params) {
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
            if !enabled(b) {
                return group.with_error_code(ResponseError::UnsupportedVersion.code());
            }
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

pub(super) const DESCRIBE_SHARE_GROUP_OFFSETS: Api = api!(
    DescribeShareGroupOffsetsRequest,
    0..=1,
    later(|b, r, cx| {
        // Authorization needs the request's context, which the answer
        // (reading state from the share coordinator) cannot hold.
        let groups = r
            .groups
            .iter()
            .map(|g| b.on_group(cx, Operation::Describe, g.group_id.as_str()))
            .collect();
        let visible = b
            .catalog
            .topics()
            .into_iter()
            .filter(|t| b.on_topic(cx, Operation::Describe, t.name()))
            .map(|t| t.name().to_string())
            .collect();
        describe_offsets(b.clone(), r, groups, visible)
    })
);
pub(super) const ALTER_SHARE_GROUP_OFFSETS: Api = api!(
    AlterShareGroupOffsetsRequest,
    0..=0,
    later(|b, r, cx| {
        let denied = denied_topics(
            b,
            cx,
            Operation::Read,
            r.topics.iter().map(|t| &t.topic_name),
        );
        alter_offsets(b.clone(), r, denied)
    }),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        AlterShareGroupOffsetsResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const DELETE_SHARE_GROUP_OFFSETS: Api = api!(
    DeleteShareGroupOffsetsRequest,
    0..=0,
    later(|b, r, cx| {
        let denied = denied_topics(
            b,
            cx,
            Operation::Read,
            r.topics.iter().map(|t| &t.topic_name),
        );
        delete_offsets(b.clone(), r, denied)
    }),
    acl(Operation::Delete, Resource::Group(|r| &r.group_id), |_| {
        DeleteShareGroupOffsetsResponse::default().with_error_code(GROUP_DENIED)
    })
);

error_codes! {
    DescribeShareGroupOffsetsResponse => |r, f| r.groups.iter().for_each(|g| {
        f(g.error_code);
        g.topics.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
    });
    AlterShareGroupOffsetsResponse => |r, f| {
        f(r.error_code);
        r.responses.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
    };
    DeleteShareGroupOffsetsResponse => |r, f| {
        f(r.error_code);
        r.responses.iter().for_each(|t| f(t.error_code));
    };
}

/// Whether `share.version` has share groups on.
pub(super) fn enabled(b: &Broker) -> bool {
    b.features.level(super::features::SHARE_VERSION) >= 1
}

/// The named topics `op` is refused on.
fn denied_topics<'a>(
    b: &Broker,
    cx: &super::dispatch::Ctx<'_>,
    op: Operation,
    topics: impl Iterator<Item = &'a TopicName>,
) -> Vec<String> {
    topics
        .filter(|t| !b.on_topic(cx, op, t.as_str()))
        .map(|t| t.to_string())
        .collect()
}

/// DescribeShareGroupOffsets: each share-partition's start offset and lag
/// (the records above the start not yet acknowledged or archived), from
/// the share coordinator's state. `allowed`: DESCRIBE on each group;
/// `visible`: the topics the caller may describe.
async fn describe_offsets(
    b: Arc<Broker>,
    r: DescribeShareGroupOffsetsRequest,
    allowed: Vec<bool>,
    visible: std::collections::HashSet<String>,
) -> DescribeShareGroupOffsetsResponse {
    use kafka_protocol::messages::describe_share_group_offsets_response as d;
    let mut groups = Vec::with_capacity(r.groups.len());
    for (g, allowed) in r.groups.into_iter().zip(allowed) {
        let group =
            d::DescribeShareGroupOffsetsResponseGroup::default().with_group_id(g.group_id.clone());
        if !enabled(&b) {
            groups.push(group.with_error_code(ResponseError::UnsupportedVersion.code()));
            continue;
        }
        if !allowed {
            groups.push(group.with_error_code(GROUP_DENIED));
            continue;
        }
        match describe_group(&b, g, &visible).await {
            Ok(topics) => groups.push(group.with_topics(topics)),
            Err(code) => groups.push(group.with_error_code(code)),
        }
    }
    DescribeShareGroupOffsetsResponse::default().with_groups(groups)
}

async fn describe_group(
    b: &Broker,
    g: kafka_protocol::messages::describe_share_group_offsets_request::DescribeShareGroupOffsetsRequestGroup,
    visible: &std::collections::HashSet<String>,
) -> Result<Vec<kafka_protocol::messages::describe_share_group_offsets_response::DescribeShareGroupOffsetsResponseTopic>, i16>{
    use kafka_protocol::messages::describe_share_group_offsets_response as d;
    let group_id = g.group_id.to_string();
    // Null: every topic the group has state for.
    let wanted: Vec<(String, Vec<i32>)> = match g.topics {
        Some(ts) => ts
            .into_iter()
            .map(|t| (t.topic_name.to_string(), t.partitions))
            .collect(),
        None => {
            let states =
                super::share_state::states_of(b, &group_id, |t| visible.contains(t)).await?;
            let mut by_topic: Vec<(String, Vec<i32>)> = Vec::new();
            for ((id, p), _) in states {
                let Some(t) = b.catalog.topic_by_id(id) else {
                    continue;
                };
                match by_topic.iter_mut().find(|(n, _)| n == t.name()) {
                    Some((_, ps)) => ps.push(p),
                    None => by_topic.push((t.name().to_string(), vec![p])),
                }
            }
            by_topic
        }
    };
    let mut topics = Vec::with_capacity(wanted.len());
    for (name, partitions) in wanted {
        let missing = |code: i16| {
            d::DescribeShareGroupOffsetsResponseTopic::default()
                .with_topic_name(TopicName(s(&name)))
                .with_partitions(
                    partitions
                        .iter()
                        .map(|p| {
                            d::DescribeShareGroupOffsetsResponsePartition::default()
                                .with_partition_index(*p)
                                .with_start_offset(-1)
                                .with_lag(-1)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        };
        if !visible.contains(&name) {
            topics.push(missing(ResponseError::TopicAuthorizationFailed.code()));
            continue;
        }
        let Some(topic) = b.catalog.topic(&name) else {
            topics.push(missing(0));
            continue;
        };
        let keys: Vec<(uuid::Uuid, i32)> = partitions.iter().map(|p| (topic.id(), *p)).collect();
        let summaries = super::share_state::summaries(b, &group_id, &keys).await?;
        let partitions = partitions
            .iter()
            .zip(summaries)
            .map(|(p, sum)| {
                let out = d::DescribeShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(*p)
                    .with_lag(-1);
                let Some(sum) = sum else {
                    return out.with_start_offset(-1);
                };
                let out = out
                    .with_start_offset(sum.start_offset)
                    .with_leader_epoch(sum.leader_epoch);
                if sum.start_offset < 0 || sum.delivery_complete_count < 0 {
                    return out;
                }
                match topic.partition(*p) {
                    Some(part) => out.with_lag(
                        (part.high_watermark()
                            - sum.start_offset
                            - i64::from(sum.delivery_complete_count))
                        .max(0),
                    ),
                    None => out.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
                }
            })
            .collect();
        topics.push(
            d::DescribeShareGroupOffsetsResponseTopic::default()
                .with_topic_name(TopicName(s(&name)))
                .with_topic_id(topic.id())
                .with_partitions(partitions),
        );
    }
    Ok(topics)
}

/// AlterShareGroupOffsets: an empty group's share-partitions start over at
/// the given offsets, with nothing in flight. An absent group is created.
async fn alter_offsets(
    b: Arc<Broker>,
    r: AlterShareGroupOffsetsRequest,
    denied: Vec<String>,
) -> AlterShareGroupOffsetsResponse {
    use kafka_protocol::messages::alter_share_group_offsets_response as a;
    let top = |code: i16, message: Option<String>| {
        AlterShareGroupOffsetsResponse::default()
            .with_error_code(code)
            .with_error_message(message.map(|m| s(&m)))
    };
    if !enabled(&b) {
        return top(ResponseError::UnsupportedVersion.code(), None);
    }
    let group = r.group_id.to_string();
    if let Err(e) = b.coordinator.share_group_empty(&group, true) {
        return top(error_code(&e), Some(e.to_string()));
    }
    let mut resets = Vec::new();
    let mut responses = Vec::with_capacity(r.topics.len());
    for t in &r.topics {
        let name = t.topic_name.to_string();
        let topic = b.catalog.topic(&name);
        let mut out = a::AlterShareGroupOffsetsResponseTopic::default()
            .with_topic_name(t.topic_name.clone())
            .with_topic_id(topic.as_ref().map(|t| t.id()).unwrap_or_default());
        for p in &t.partitions {
            let code = match &topic {
                _ if denied.contains(&name) => ResponseError::TopicAuthorizationFailed.code(),
                Some(topic) if topic.partition(p.partition_index).is_some() => {
                    resets.push(((topic.id(), p.partition_index), p.start_offset));
                    0
                }
                _ => ResponseError::UnknownTopicOrPartition.code(),
            };
            out.partitions.push(
                a::AlterShareGroupOffsetsResponsePartition::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code),
            );
        }
        responses.push(out);
    }
    let keys: Vec<(uuid::Uuid, i32)> = resets.iter().map(|(k, _)| *k).collect();
    if let Err(code) = super::share_state::reset(&b, &group, &resets).await {
        return top(code, None);
    }
    super::share_fetch::forget(&b, &group, &keys);
    AlterShareGroupOffsetsResponse::default().with_responses(responses)
}

/// DeleteShareGroupOffsets: an empty group forgets topics' share state;
/// they start over from share.auto.offset.reset when next read.
async fn delete_offsets(
    b: Arc<Broker>,
    r: DeleteShareGroupOffsetsRequest,
    denied: Vec<String>,
) -> DeleteShareGroupOffsetsResponse {
    use kafka_protocol::messages::delete_share_group_offsets_response as d;
    let top = |code: i16, message: Option<String>| {
        DeleteShareGroupOffsetsResponse::default()
            .with_error_code(code)
            .with_error_message(message.map(|m| s(&m)))
    };
    if !enabled(&b) {
        return top(ResponseError::UnsupportedVersion.code(), None);
    }
    let group = r.group_id.to_string();
    if let Err(e) = b.coordinator.share_group_empty(&group, false) {
        return top(error_code(&e), Some(e.to_string()));
    }
    let names: std::collections::HashSet<String> =
        r.topics.iter().map(|t| t.topic_name.to_string()).collect();
    let held = match super::share_state::states_of(&b, &group, |t| names.contains(t)).await {
        Ok(held) => held,
        Err(code) => return top(code, None),
    };
    let mut keys = Vec::new();
    let mut responses = Vec::with_capacity(r.topics.len());
    for t in &r.topics {
        let name = t.topic_name.to_string();
        let topic = b.catalog.topic(&name);
        let out = d::DeleteShareGroupOffsetsResponseTopic::default()
            .with_topic_name(t.topic_name.clone())
            .with_topic_id(topic.as_ref().map(|t| t.id()).unwrap_or_default());
        let out = match &topic {
            _ if denied.contains(&name) => {
                out.with_error_code(ResponseError::TopicAuthorizationFailed.code())
            }
            None => out.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
            Some(topic) => {
                let of_topic: Vec<(uuid::Uuid, i32)> = held
                    .iter()
                    .map(|(k, _)| *k)
                    .filter(|(id, _)| *id == topic.id())
                    .collect();
                if of_topic.is_empty() {
                    out.with_error_code(ResponseError::UnknownTopicOrPartition.code())
                        .with_error_message(Some(s("There is no offset information to delete.")))
                } else {
                    keys.extend(of_topic);
                    out
                }
            }
        };
        responses.push(out);
    }
    if let Err(code) = super::share_state::delete_states(&b, &group, &keys).await {
        return top(code, None);
    }
    super::share_fetch::forget(&b, &group, &keys);
    DeleteShareGroupOffsetsResponse::default().with_responses(responses)
}

/// A deleted share group's share-partition states go with it.
pub(super) async fn delete_state(b: &Broker, group: &str) {
    let deleted = async {
        let held = super::share_state::states_of(b, group, |_| true).await?;
        let keys: Vec<(uuid::Uuid, i32)> = held.into_iter().map(|(k, _)| k).collect();
        super::share_state::delete_states(b, group, &keys).await?;
        super::share_fetch::forget(b, group, &keys);
        Ok::<(), i16>(())
    };
    if let Err(code) = deleted.await {
        tracing::warn!(group, code, "could not delete a share group's state");
    }
}
