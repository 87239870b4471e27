//! Kafka Streams' rebalance protocol (KIP-1071): StreamsGroupHeartbeat,
//! StreamsGroupDescribe and StreamsGroupTopologyDescriptionUpdate,
//! translated to and from the coordinator's `streams` groups.
//!
//! The coordinator decides which internal topics (repartition and
//! changelog) a topology lacks; this layer creates them, as Kafka's request
//! handler does, through the same path as CreateTopics and with the
//! requesting principal's CREATE rights, so they exist by the member's next
//! heartbeat. With `streams.version` finalized at 0 every API answers
//! UNSUPPORTED_VERSION, and Streams applications stay on the classic protocol.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::streams_group_describe_response::{self as describe, DescribedGroup};
use kafka_protocol::messages::streams_group_heartbeat_request as hb;
use kafka_protocol::messages::streams_group_heartbeat_response as hbr;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::{split, Resource, GROUP_DENIED, TOPIC_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::groups::error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{Operation, ResourceType, CLUSTER_NAME};
use crate::coordinator::streams::{self, HeartbeatParams, TaskOffsets};
use crate::coordinator::streams_records::{CopartitionGroup, Subtopology, TopicInfo, Topology};
use crate::coordinator::task_assignor::{TaskSet, Tasks};
use crate::principal::Principal;

pub(super) const STREAMS_GROUP_HEARTBEAT: Api = api!(
    StreamsGroupHeartbeatRequest,
    0..=1,
    later(|b, r, cx| {
        let who = Requester {
            principal: cx.principal.clone(),
            host: cx.client_host.to_string(),
        };
        let refused = refuse_topology(b, cx, &r);
        let client = (cx.client_id(), format!("/{}", cx.client_host));
        streams_group_heartbeat(b.clone(), r, cx.version, refused, who, client)
    }),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        StreamsGroupHeartbeatResponse::default().with_error_code(GROUP_DENIED)
    })
);
pub(super) const STREAMS_GROUP_DESCRIBE: Api =
    api!(StreamsGroupDescribeRequest, 0..=1, ready(handle_describe));
pub(super) const STREAMS_GROUP_TOPOLOGY_DESCRIPTION_UPDATE: Api = api!(
    StreamsGroupTopologyDescriptionUpdateRequest,
    0..=0,
    ready(topology_description_update),
    acl(Operation::Read, Resource::Group(|r| &r.group_id), |_| {
        StreamsGroupTopologyDescriptionUpdateResponse::default().with_error_code(GROUP_DENIED)
    })
);

error_codes! {
    StreamsGroupHeartbeatResponse => |r, f| f(r.error_code);
    StreamsGroupDescribeResponse => |r, f| r.groups.iter().for_each(|g| f(g.error_code));
    StreamsGroupTopologyDescriptionUpdateResponse => |r, f| f(r.error_code);
}

/// Kafka's "authorized operations not requested".
const OPERATIONS_NOT_REQUESTED: i32 = i32::MIN;
/// Kafka's internal topics, which no topology may use.
const KAFKA_INTERNAL: [&str; 3] = [
    "__consumer_offsets",
    "__transaction_state",
    "__share_group_state",
];
/// StreamsGroupDescribe v1: no description plugin, so none is stored.
const DESCRIPTION_NOT_REQUESTED: i8 = 0;
const DESCRIPTION_NOT_STORED: i8 = 1;

/// Who sent a heartbeat, to create internal topics with its rights.
struct Requester {
    principal: Principal,
    host: String,
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// Whether `streams.version` has the protocol on.
fn enabled(b: &Broker) -> bool {
    b.features.level(super::features::STREAMS_VERSION) >= 1
}

/// Every topic a topology names.
fn topology_topics(t: &hb::Topology) -> Vec<String> {
    let mut names: Vec<String> = t
        .subtopologies
        .iter()
        .flat_map(|s| {
            s.source_topics
                .iter()
                .chain(&s.repartition_sink_topics)
                .map(|n| n.0.to_string())
                .chain(
                    s.repartition_source_topics
                        .iter()
                        .map(|r| r.name.0.to_string()),
                )
                .chain(
                    s.state_changelog_topics
                        .iter()
                        .map(|c| c.name.0.to_string()),
                )
        })
        .collect();
    names.sort();
    names.dedup();
    names
}

/// The checks Kafka's request handler makes of a topology before the
/// coordinator sees it: no Kafka internal topics, valid names, and DESCRIBE
/// on every topic.
fn refuse_topology(
    b: &Broker,
    cx: &Ctx<'_>,
    r: &StreamsGroupHeartbeatRequest,
) -> Option<(i16, Option<String>)> {
    let names = topology_topics(r.topology.as_ref()?);
    let internal: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| KAFKA_INTERNAL.contains(n))
        .collect();
    if !internal.is_empty() {
        return Some((
            ResponseError::StreamsInvalidTopology.code(),
            Some(format!(
                "Use of Kafka internal topics {} in a Kafka Streams topology is prohibited.",
                internal.join(",")
            )),
        ));
    }
    let invalid: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| crate::catalog::validate_topic_name(n).is_err())
        .collect();
    if !invalid.is_empty() {
        return Some((
            ResponseError::StreamsInvalidTopology.code(),
            Some(format!(
                "Topic names {} are not valid topic names.",
                invalid.join(",")
            )),
        ));
    }
    if names
        .iter()
        .any(|n| !b.on_topic(cx, Operation::Describe, n))
    {
        return Some((TOPIC_DENIED, None));
    }
    None
}

fn topic_info(t: &hb::TopicInfo) -> TopicInfo {
    TopicInfo {
        name: t.name.0.to_string(),
        partitions: t.partitions,
        replication_factor: t.replication_factor,
        configs: t
            .topic_configs
            .iter()
            .map(|kv| (kv.key.to_string(), kv.value.to_string()))
            .collect(),
    }
}

fn topology(t: &hb::Topology) -> Topology {
    let names = |v: &[TopicName]| v.iter().map(|n| n.0.to_string()).collect();
    Topology {
        epoch: t.epoch,
        subtopologies: t
            .subtopologies
            .iter()
            .map(|s| Subtopology {
                id: s.subtopology_id.to_string(),
                source_topics: names(&s.source_topics),
                source_topic_regex: s.source_topic_regex.iter().map(|r| r.to_string()).collect(),
                changelog_topics: s.state_changelog_topics.iter().map(topic_info).collect(),
                repartition_sink_topics: names(&s.repartition_sink_topics),
                repartition_source_topics: s
                    .repartition_source_topics
                    .iter()
                    .map(topic_info)
                    .collect(),
                copartition_groups: s
                    .copartition_groups
                    .iter()
                    .map(|g| CopartitionGroup {
                        source_topics: g.source_topics.clone(),
                        source_topic_regex: g.source_topic_regex.clone(),
                        repartition_source_topics: g.repartition_source_topics.clone(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn tasks_in(v: &[hb::TaskIds]) -> Tasks {
    let mut out = Tasks::new();
    for t in v {
        out.entry(t.subtopology_id.to_string())
            .or_default()
            .extend(t.partitions.iter().copied());
    }
    out
}

fn offsets_in(v: &Option<Vec<hb::TaskOffset>>) -> Option<TaskOffsets> {
    v.as_ref().map(|v| {
        v.iter()
            .map(|o| (o.subtopology_id.to_string(), o.partition, o.offset))
            .collect()
    })
}

fn params(r: &StreamsGroupHeartbeatRequest, client: (String, String)) -> HeartbeatParams {
    let lists = [&r.active_tasks, &r.standby_tasks, &r.warmup_tasks];
    let sent = lists.iter().filter(|l| l.is_some()).count();
    let owned = match (&r.active_tasks, &r.standby_tasks, &r.warmup_tasks) {
        (Some(a), Some(st), Some(w)) => Some(
            TaskSet {
                active: tasks_in(a),
                standby: tasks_in(st),
                warmup: tasks_in(w),
            }
            .normalized(),
        ),
        _ => None,
    };
    HeartbeatParams {
        member_id: r.member_id.to_string(),
        member_epoch: r.member_epoch,
        endpoint_information_epoch: r.endpoint_information_epoch,
        instance_id: r.instance_id.as_ref().map(|v| v.to_string()),
        rack_id: r.rack_id.as_ref().map(|v| v.to_string()),
        rebalance_timeout_ms: r.rebalance_timeout_ms,
        topology: r.topology.as_ref().map(topology),
        owned,
        partly_owned: sent != 0 && sent != 3,
        process_id: r.process_id.as_ref().map(|v| v.to_string()),
        user_endpoint: r
            .user_endpoint
            .as_ref()
            .map(|e| (e.host.to_string(), e.port)),
        client_tags: r.client_tags.as_ref().map(|tags| {
            tags.iter()
                .map(|kv| (kv.key.to_string(), kv.value.to_string()))
                .collect()
        }),
        task_offsets: offsets_in(&r.task_offsets),
        task_end_offsets: offsets_in(&r.task_end_offsets),
        shutdown_application: r.shutdown_application,
        client_id: client.0,
        client_host: client.1,
    }
}

fn task_ids(tasks: &Tasks) -> Vec<hbr::TaskIds> {
    tasks
        .iter()
        .filter(|(_, ps)| !ps.is_empty())
        .map(|(sid, ps)| {
            hbr::TaskIds::default()
                .with_subtopology_id(s(sid))
                .with_partitions(ps.iter().copied().collect())
        })
        .collect()
}

async fn streams_group_heartbeat(
    broker: Arc<Broker>,
    req: StreamsGroupHeartbeatRequest,
    version: i16,
    refused: Option<(i16, Option<String>)>,
    who: Requester,
    client: (String, String),
) -> StreamsGroupHeartbeatResponse {
    let error = |code: i16, message: Option<String>| {
        StreamsGroupHeartbeatResponse::default()
            .with_error_code(code)
            .with_error_message(message.map(StrBytes::from_string))
    };
    if !enabled(&broker) {
        return error(ResponseError::UnsupportedVersion.code(), None);
    }
    if let Some((code, message)) = refused {
        return error(code, message);
    }
    let params = params(&req, client);
    let result = broker
        .coordinator
        .streams_heartbeat(req.group_id.as_str(), params)
        .await;
    let mut r = match result {
        Ok(r) => r,
        Err(e) => return error(error_code(&e), Some(e.to_string())),
    };
    if !r.create.is_empty() {
        let note = create_internal_topics(&broker, &who, std::mem::take(&mut r.create)).await;
        if let Some(status) = r
            .status
            .iter_mut()
            .find(|(code, _)| *code == streams::MISSING_INTERNAL_TOPICS)
        {
            status.1.push_str(&note);
        }
    }
    let (active, standby, warmup) = match &r.assignment {
        Some(a) => (
            Some(task_ids(&a.active)),
            Some(task_ids(&a.standby)),
            Some(task_ids(&a.warmup)),
        ),
        None => (None, None, None),
    };
    let endpoints = r.endpoints.map(|eps| {
        let partitions = |v: Vec<(String, Vec<i32>)>| {
            v.into_iter()
                .map(|(t, ps)| {
                    hbr::TopicPartition::default()
                        .with_topic(TopicName(s(&t)))
                        .with_partitions(ps)
                })
                .collect()
        };
        eps.into_iter()
            .map(|e| {
                hbr::EndpointToPartitions::default()
                    .with_user_endpoint(
                        hbr::Endpoint::default()
                            .with_host(s(&e.endpoint.0))
                            .with_port(e.endpoint.1),
                    )
                    .with_active_partitions(partitions(e.active))
                    .with_standby_partitions(partitions(e.standby))
            })
            .collect()
    });
    let status = r
        .status
        .into_iter()
        .map(|(code, detail)| {
            hbr::Status::default()
                .with_status_code(code)
                .with_status_detail(StrBytes::from_string(detail))
        })
        .collect();
    let resp = StreamsGroupHeartbeatResponse::default()
        .with_member_id(s(&r.member_id))
        .with_member_epoch(r.member_epoch)
        .with_heartbeat_interval_ms(r.heartbeat_interval_ms)
        .with_task_offset_interval_ms(streams::TASK_OFFSET_INTERVAL_MS)
        .with_status(Some(status))
        .with_active_tasks(active)
        .with_standby_tasks(standby)
        .with_warmup_tasks(warmup)
        .with_endpoint_information_epoch(r.endpoint_information_epoch)
        .with_partitions_by_user_endpoint(endpoints);
    match version {
        0 => resp.with_acceptable_recovery_lag_legacy(streams::ACCEPTABLE_RECOVERY_LAG as i32),
        _ => resp.with_acceptable_recovery_lag(streams::ACCEPTABLE_RECOVERY_LAG),
    }
}

/// Creates the internal topics a group lacks, those the requester may
/// create; returns what to add to the MISSING_INTERNAL_TOPICS status.
async fn create_internal_topics(
    broker: &Arc<Broker>,
    who: &Requester,
    topics: Vec<streams::NewTopic>,
) -> String {
    let allowed = |op, kind, name: &str| {
        broker
            .access
            .authorize(&who.principal, &who.host, op, kind, name)
    };
    let cluster_create = allowed(Operation::Create, ResourceType::Cluster, CLUSTER_NAME);
    let (ok, denied): (Vec<_>, Vec<_>) = topics
        .into_iter()
        .partition(|t| cluster_create || allowed(Operation::Create, ResourceType::Topic, &t.name));
    if !denied.is_empty() {
        let names: Vec<&str> = denied.iter().map(|t| t.name.as_str()).collect();
        return format!("; Unauthorized to CREATE on topics {}.", names.join(", "));
    }
    let req = CreateTopicsRequest::default().with_topics(
        ok.into_iter()
            .map(|t| {
                CreatableTopic::default()
                    .with_name(TopicName(s(&t.name)))
                    .with_num_partitions(t.partitions)
                    .with_replication_factor(t.replication_factor)
                    .with_configs(
                        t.configs
                            .iter()
                            .map(|(k, v)| {
                                CreatableTopicConfig::default()
                                    .with_name(s(k))
                                    .with_value(Some(s(v)))
                            })
                            .collect(),
                    )
            })
            .collect(),
    );
    let resp = super::topics::create_topics(broker.clone(), req, 7).await;
    let failed: Vec<String> = resp
        .topics
        .iter()
        .filter(|t| t.error_code != 0 && t.error_code != ResponseError::TopicAlreadyExists.code())
        .map(|t| {
            let why = t.error_message.as_deref().unwrap_or("unknown error");
            format!("{} ({why})", t.name.0.as_str())
        })
        .collect();
    if failed.is_empty() {
        return String::new();
    }
    tracing::warn!(topics = ?failed, "could not create Streams internal topics");
    let more = match failed.len() {
        n if n > 3 => format!(" and {} more", n - 3),
        _ => String::new(),
    };
    format!(
        "; Creation failed: {}{more}.",
        failed[..failed.len().min(3)].join(", ")
    )
}

fn handle_describe(
    b: &Arc<Broker>,
    mut r: StreamsGroupDescribeRequest,
    cx: &Ctx<'_>,
) -> StreamsGroupDescribeResponse {
    let (ok, denied) = split(std::mem::take(&mut r.group_ids), |g| {
        b.on_group(cx, Operation::Describe, g)
    });
    let denied = denied.into_iter().map(|g| {
        DescribedGroup::default()
            .with_group_id(g)
            .with_error_code(GROUP_DENIED)
    });
    if !enabled(b) {
        let refused = ok.into_iter().map(|g| {
            DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(ResponseError::UnsupportedVersion.code())
        });
        return StreamsGroupDescribeResponse::default()
            .with_groups(refused.chain(denied).collect());
    }
    let mut groups: Vec<DescribedGroup> = ok
        .into_iter()
        .map(|id| describe_group(b, id, r.include_topology_description))
        .collect();
    for g in groups.iter_mut().filter(|g| g.error_code == 0) {
        if r.include_authorized_operations {
            g.authorized_operations =
                b.authorized_operations(cx, ResourceType::Group, g.group_id.as_str());
        }
        // A topology naming a topic the principal may not describe hides the group.
        let hidden = g
            .topology
            .iter()
            .flat_map(|t| t.subtopologies.iter().flatten())
            .any(|s| {
                s.source_topics
                    .iter()
                    .chain(&s.repartition_sink_topics)
                    .chain(s.repartition_source_topics.iter().map(|t| &t.name))
                    .chain(s.state_changelog_topics.iter().map(|t| &t.name))
                    .any(|t| !b.on_topic(cx, Operation::Describe, t.0.as_str()))
            });
        if hidden {
            *g = DescribedGroup::default()
                .with_group_id(g.group_id.clone())
                .with_error_code(TOPIC_DENIED);
        }
    }
    groups.extend(denied);
    StreamsGroupDescribeResponse::default().with_groups(groups)
}

fn describe_tasks(tasks: &Tasks) -> Vec<describe::TaskIds> {
    tasks
        .iter()
        .filter(|(_, ps)| !ps.is_empty())
        .map(|(sid, ps)| {
            describe::TaskIds::default()
                .with_subtopology_id(s(sid))
                .with_partitions(ps.iter().copied().collect())
        })
        .collect()
}

fn describe_assignment(t: &TaskSet) -> describe::Assignment {
    describe::Assignment::default()
        .with_active_tasks(describe_tasks(&t.active))
        .with_standby_tasks(describe_tasks(&t.standby))
        .with_warmup_tasks(describe_tasks(&t.warmup))
}

fn describe_offsets(v: &TaskOffsets) -> Vec<describe::TaskOffset> {
    v.iter()
        .map(|(sid, p, o)| {
            describe::TaskOffset::default()
                .with_subtopology_id(s(sid))
                .with_partition(*p)
                .with_offset(*o)
        })
        .collect()
}

fn describe_group(b: &Broker, id: GroupId, with_description: bool) -> DescribedGroup {
    let group = DescribedGroup::default()
        .with_group_id(id.clone())
        .with_authorized_operations(OPERATIONS_NOT_REQUESTED);
    if id.is_empty() {
        return group.with_error_code(ResponseError::InvalidGroupId.code());
    }
    let d = match b.coordinator.streams_describe(id.as_str()) {
        Ok(d) => d,
        Err(e) => {
            return group
                .with_error_code(error_code(&e))
                .with_error_message(Some(s(&e.to_string())))
                .with_group_state(StrBytes::from_static_str("Dead"))
        }
    };
    // The configured form once ready (partition counts decided), else as sent.
    let internal = d
        .configured
        .as_ref()
        .filter(|c| c.is_ready())
        .map(|c| c.internal.clone())
        .unwrap_or_default();
    let info = |t: &TopicInfo| {
        describe::TopicInfo::default()
            .with_name(TopicName(s(&t.name)))
            .with_partitions(internal.get(&t.name).copied().unwrap_or(t.partitions))
            .with_replication_factor(t.replication_factor)
            .with_topic_configs(
                t.configs
                    .iter()
                    .map(|(k, v)| {
                        describe::KeyValue::default()
                            .with_key(s(k))
                            .with_value(s(v))
                    })
                    .collect(),
            )
    };
    let sorted = |v: &[String]| {
        let mut v: Vec<TopicName> = v.iter().map(|n| TopicName(s(n))).collect();
        v.sort();
        v
    };
    let topology = d.topology.as_ref().map(|t| {
        let mut subs: Vec<&Subtopology> = t.subtopologies.iter().collect();
        subs.sort_by(|a, b| a.id.cmp(&b.id));
        let by_name = |v: &[TopicInfo]| {
            let mut v = v.to_vec();
            v.sort_by(|a, b| a.name.cmp(&b.name));
            v.iter().map(info).collect()
        };
        describe::Topology::default()
            .with_epoch(t.epoch)
            .with_subtopologies(Some(
                subs.into_iter()
                    .map(|st| {
                        describe::Subtopology::default()
                            .with_subtopology_id(s(&st.id))
                            .with_source_topics(sorted(&st.source_topics))
                            .with_repartition_sink_topics(sorted(&st.repartition_sink_topics))
                            .with_state_changelog_topics(by_name(&st.changelog_topics))
                            .with_repartition_source_topics(by_name(&st.repartition_source_topics))
                    })
                    .collect(),
            ))
    });
    let members =
        d.members
            .iter()
            .map(|(m, target)| {
                describe::Member::default()
                    .with_member_id(s(&m.id))
                    .with_member_epoch(m.epoch)
                    .with_instance_id(m.meta.instance_id.as_deref().map(s))
                    .with_rack_id(m.meta.rack_id.as_deref().map(s))
                    .with_client_id(s(&m.meta.client_id))
                    .with_client_host(s(&m.meta.client_host))
                    .with_topology_epoch(m.meta.topology_epoch)
                    .with_process_id(s(&m.meta.process_id))
                    .with_user_endpoint(
                        m.meta.user_endpoint.as_ref().map(|(h, p)| {
                            describe::Endpoint::default().with_host(s(h)).with_port(*p)
                        }),
                    )
                    .with_client_tags(
                        m.meta
                            .client_tags
                            .iter()
                            .map(|(k, v)| {
                                describe::KeyValue::default()
                                    .with_key(s(k))
                                    .with_value(s(v))
                            })
                            .collect(),
                    )
                    .with_task_offsets(describe_offsets(&m.task_offsets))
                    .with_task_end_offsets(describe_offsets(&m.task_end_offsets))
                    .with_assignment(describe_assignment(&m.assigned))
                    .with_target_assignment(describe_assignment(target))
            })
            .collect();
    group
        .with_group_state(StrBytes::from_static_str(d.state))
        .with_group_epoch(d.epoch)
        .with_assignment_epoch(d.assignment_epoch)
        .with_topology(Some(topology.unwrap_or_else(|| {
            describe::Topology::default().with_subtopologies(Some(Vec::new()))
        })))
        .with_members(members)
        .with_topology_description_status(match with_description {
            true => DESCRIPTION_NOT_STORED,
            false => DESCRIPTION_NOT_REQUESTED,
        })
        .with_assignor_name(Some(StrBytes::from_static_str("sticky")))
}

/// Without a topology description plugin (KIP-1331) there is nowhere to keep
/// a description, and Kafka answers so.
fn topology_description_update(
    b: &Arc<Broker>,
    _r: StreamsGroupTopologyDescriptionUpdateRequest,
    _cx: &Ctx<'_>,
) -> StreamsGroupTopologyDescriptionUpdateResponse {
    let message = match enabled(b) {
        true => Some(StrBytes::from_static_str(
            "The broker has no streams group topology description plugin configured.",
        )),
        false => None,
    };
    StreamsGroupTopologyDescriptionUpdateResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_error_message(message)
}
