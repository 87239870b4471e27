//! Share groups (KIP-932): ShareGroupHeartbeat, ShareFetch and
//! ShareAcknowledge.
//!
//! WIP (branch share-groups): share-partition state is kept in memory on
//! this broker only; persisting it to `__share_group_state`, delayed fetches
//! woken by produce, ShareGroupDescribe, the offsets admin APIs and cluster
//! mode are still to come.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::share_group_heartbeat_response::{Assignment, TopicPartitions};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;
use uuid::Uuid;

use super::authorize::{Resource, GROUP_DENIED};
use super::dispatch::{api, Api};
use super::groups::error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::coordinator::share_group::{HeartbeatParams, ShareGroupConfig};
use crate::coordinator::share_partition::{
    AckBatch, AckError, AckType, SharePartition, ShareSettings,
};
use crate::coordinator::share_records::ShareKey;
use crate::coordinator::share_session::{FetchContext, SessionError, ShareSessions};
use crate::coordinator::share_state::Write;
use crate::coordinator::share_store::ShareCoordinator;
use crate::format::batch::BatchHeader;

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
pub(super) const SHARE_FETCH: Api = api!(
    ShareFetchRequest,
    1..=2,
    later(|b, r, cx| share_fetch(b.clone(), r, cx.version))
);
pub(super) const SHARE_ACKNOWLEDGE: Api = api!(
    ShareAcknowledgeRequest,
    1..=2,
    later(|b, r, cx| share_acknowledge(b.clone(), r, cx.version))
);

error_codes! {
    ShareGroupHeartbeatResponse => |r, f| f(r.error_code);
    ShareGroupDescribeResponse => |r, f| r.groups.iter().for_each(|g| f(g.error_code));
    ShareFetchResponse => |r, f| f(r.error_code);
    ShareAcknowledgeResponse => |r, f| f(r.error_code);
}

type Key = (String, Uuid, i32);

/// This broker's share-partitions and share sessions, and the share
/// coordinator their state is written to.
pub(crate) struct ShareState {
    partitions: Mutex<HashMap<Key, SharePartition>>,
    sessions: Mutex<ShareSessions>,
    coordinator: Arc<ShareCoordinator>,
}

impl ShareState {
    pub(crate) fn new(coordinator: Arc<ShareCoordinator>) -> ShareState {
        ShareState {
            partitions: Mutex::new(HashMap::new()),
            sessions: Mutex::new(ShareSessions::new(2000)),
            coordinator,
        }
    }
}

fn share_key(key: &Key) -> ShareKey {
    ShareKey {
        group: key.0.clone(),
        topic_id: key.1,
        partition: key.2,
    }
}

/// Writes a share-partition's whole state (its coordinator keeps one
/// snapshot per key) and waits until it is durable.
async fn persist(b: &Broker, key: &Key) -> Result<(), i16> {
    let w = {
        let parts = b.share.partitions.lock();
        let Some(p) = parts.get(key) else {
            return Ok(());
        };
        Write {
            state_epoch: 0,
            leader_epoch: 0,
            start_offset: p.start(),
            delivery_complete_count: p.delivery_complete_count(),
            batches: p.state_batches(),
        }
    };
    b.share
        .coordinator
        .write(&share_key(key), &w)
        .await
        .map_err(|e| {
            tracing::warn!(error = %e, "could not write share-partition state");
            ResponseError::CoordinatorNotAvailable.code()
        })
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
        .share_heartbeat(r.group_id.as_str(), params, &ShareGroupConfig::default())
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

fn session_code(e: &SessionError) -> i16 {
    match e {
        SessionError::NotFound => ResponseError::ShareSessionNotFound,
        SessionError::InvalidEpoch => ResponseError::InvalidShareSessionEpoch,
        SessionError::LimitReached => ResponseError::ShareSessionLimitReached,
        SessionError::InvalidRequest(_) => ResponseError::InvalidRequest,
    }
    .code()
}

fn ack_code(e: &AckError) -> i16 {
    match e {
        AckError::InvalidRecordState(_) => ResponseError::InvalidRecordState,
        AckError::InvalidRequest(_) => ResponseError::InvalidRequest,
    }
    .code()
}

/// Kafka's checks of one partition's acknowledgement batches.
fn ack_batches(
    batches: impl Iterator<Item = (i64, i64, Vec<i8>)>,
    renew: bool,
) -> Result<Vec<AckBatch>, AckError> {
    let invalid = |m: &str| Err(AckError::InvalidRequest(m.to_string()));
    let mut out = Vec::new();
    let mut prev_end = -1;
    for (first, last, types) in batches {
        if first > last || first < prev_end || types.is_empty() {
            return invalid("Invalid acknowledgement batch.");
        }
        if types.len() > 1 && (last - first) as usize != types.len() - 1 {
            return invalid("Invalid acknowledgement batch.");
        }
        let mut parsed = Vec::with_capacity(types.len());
        for t in types {
            match AckType::from_code(t) {
                Some(AckType::Renew) if !renew => return invalid("Invalid acknowledge type."),
                Some(t) => parsed.push(t),
                None => return invalid("Invalid acknowledge type."),
            }
        }
        out.push(AckBatch {
            first,
            last,
            types: parsed,
        });
        prev_end = last;
    }
    Ok(out)
}

/// The group's share settings: its configs over Kafka's defaults.
fn settings(b: &Broker, group: &str) -> ShareSettings {
    let configs = b.coordinator.group_configs().get(group);
    let num = |name: &str| configs.get(name).and_then(|v| v.trim().parse::<i64>().ok());
    let mut s = ShareSettings::default();
    if let Some(v) = num("share.record.lock.duration.ms") {
        s.lock_duration = Duration::from_millis(v.max(0) as u64);
    }
    if let Some(v) = num("share.delivery.count.limit") {
        s.delivery_count_limit = v.clamp(1, i64::from(i16::MAX)) as i16;
    }
    if let Some(v) = num("share.partition.max.record.locks") {
        s.max_in_flight = v.max(1);
    }
    if let Some(v) = configs.get("share.renew.acknowledge.enable") {
        s.renew_enabled = v.trim() == "true";
    }
    s
}

/// Where a share-partition nobody read yet starts (share.auto.offset.reset).
fn start_offset(b: &Broker, group: &str, p: &crate::log::Partition) -> i64 {
    match b
        .coordinator
        .group_configs()
        .get(group)
        .get("share.auto.offset.reset")
        .map(|v| v.trim())
    {
        Some("earliest") => p.log_start_offset(),
        _ => p.high_watermark(),
    }
}

/// Applies one partition's acknowledgements and persists the result
/// before they count as done.
async fn acknowledge_partition(
    b: &Broker,
    group: &str,
    member: &str,
    key: Key,
    batches: Result<Vec<AckBatch>, AckError>,
) -> i16 {
    let batches = match batches {
        Ok(v) => v,
        Err(e) => return ack_code(&e),
    };
    let changed = {
        let mut parts = b.share.partitions.lock();
        let Some(p) = parts.get_mut(&key) else {
            return ResponseError::UnknownTopicOrPartition.code();
        };
        match p.acknowledge(member, b.clock.now(), &batches, &settings(b, group)) {
            Ok(changed) => !changed.is_empty(),
            Err(e) => return ack_code(&e),
        }
    };
    match changed {
        true => persist(b, &key).await.err().unwrap_or(0),
        false => 0,
    }
}

async fn release_session(b: &Broker, group: &str, member: &str) {
    let partitions = b.share.sessions.lock().close(group, member);
    let s = settings(b, group);
    let mut released = Vec::new();
    {
        let mut parts = b.share.partitions.lock();
        for (t, p) in partitions {
            let key = (group.to_string(), t, p);
            if let Some(sp) = parts.get_mut(&key) {
                if !sp.release_member(member, &s).is_empty() {
                    released.push(key);
                }
            }
        }
    }
    for key in released {
        let _ = persist(b, &key).await;
    }
}

async fn share_fetch(b: Arc<Broker>, r: ShareFetchRequest, version: i16) -> ShareFetchResponse {
    let top = |code: i16| ShareFetchResponse::default().with_error_code(code);
    let (Some(group), Some(member)) = (r.group_id.as_ref(), r.member_id.as_ref()) else {
        return top(ResponseError::InvalidRequest.code());
    };
    let (group, member) = (group.to_string(), member.to_string());
    let lock_ms = settings(&b, &group).lock_duration.as_millis() as i32;
    let requested: Vec<(Uuid, i32)> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.topic_id, p.partition_index))
        })
        .collect();
    let forgotten: Vec<(Uuid, i32)> = r
        .forgotten_topics_data
        .iter()
        .flat_map(|t| t.partitions.iter().map(move |p| (t.topic_id, *p)))
        .collect();
    let acking = r.topics.iter().any(|t| {
        t.partitions
            .iter()
            .any(|p| !p.acknowledgement_batches.is_empty())
    });
    let context = b.share.sessions.lock().fetch(
        &group,
        &member,
        r.share_session_epoch,
        &requested,
        &forgotten,
        acking,
        0,
    );
    let context = match context {
        Ok(c) => c,
        Err(e) => return top(session_code(&e)),
    };
    let mut ack_results: HashMap<(Uuid, i32), i16> = HashMap::new();
    for t in &r.topics {
        for p in &t.partitions {
            if p.acknowledgement_batches.is_empty() {
                continue;
            }
            let batches = ack_batches(
                p.acknowledgement_batches
                    .iter()
                    .map(|a| (a.first_offset, a.last_offset, a.acknowledge_types.clone())),
                version >= 2,
            );
            let key = (group.clone(), t.topic_id, p.partition_index);
            let code = acknowledge_partition(&b, &group, &member, key, batches).await;
            ack_results.insert((t.topic_id, p.partition_index), code);
        }
    }
    let (targets, always) = match &context {
        FetchContext::Final(_) => (Vec::new(), Vec::new()),
        FetchContext::Full(ps) => (ps.clone(), ps.clone()),
        FetchContext::Incremental { partitions, added } => (partitions.clone(), added.clone()),
    };
    let deadline = b.clock.now() + Duration::from_millis(r.max_wait_ms.max(0) as u64);
    let mut budget = i64::from(r.max_records.max(0));
    let fetching = !r.is_renew_ack && r.max_records > 0 && r.max_bytes > 0;
    let mut got: HashMap<(Uuid, i32), PartitionData> = HashMap::new();
    loop {
        if fetching {
            for (t, part) in &targets {
                if budget <= 0
                    || got
                        .get(&(*t, *part))
                        .is_some_and(|d| !d.acquired_records.is_empty())
                {
                    continue;
                }
                let data =
                    fetch_partition(&b, &group, &member, *t, *part, budget, r.max_bytes).await;
                budget -= data
                    .acquired_records
                    .iter()
                    .map(|a| a.last_offset - a.first_offset + 1)
                    .sum::<i64>();
                got.insert((*t, *part), data);
            }
        }
        let any = got
            .values()
            .any(|d| !d.acquired_records.is_empty() || d.error_code != 0);
        if any || !fetching || b.clock.now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut by_topic: Vec<ShareFetchableTopicResponse> = Vec::new();
    let mut push = |t: Uuid, d: PartitionData| match by_topic.iter_mut().find(|x| x.topic_id == t) {
        Some(x) => x.partitions.push(d),
        None => by_topic.push(
            ShareFetchableTopicResponse::default()
                .with_topic_id(t)
                .with_partitions(vec![d]),
        ),
    };
    for (t, part) in &targets {
        let mut d = got.remove(&(*t, *part)).unwrap_or_else(|| {
            PartitionData::default()
                .with_partition_index(*part)
                .with_records(Some(Default::default()))
        });
        let ack = ack_results.remove(&(*t, *part));
        if let Some(code) = ack {
            d.acknowledge_error_code = code;
        }
        let answer = !d.acquired_records.is_empty()
            || d.error_code != 0
            || always.contains(&(*t, *part))
            || ack.is_some();
        if answer {
            push(*t, d);
        }
    }
    for ((t, part), code) in ack_results {
        push(
            t,
            PartitionData::default()
                .with_partition_index(part)
                .with_acknowledge_error_code(code)
                .with_records(Some(Default::default())),
        );
    }
    if r.share_session_epoch == -1 {
        release_session(&b, &group, &member).await;
    }
    ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(lock_ms)
        .with_responses(by_topic)
}

/// Reads one partition from its share-partition's next fetch offset and
/// acquires what was read.
async fn fetch_partition(
    b: &Broker,
    group: &str,
    member: &str,
    topic: Uuid,
    index: i32,
    max_records: i64,
    max_bytes: i32,
) -> PartitionData {
    let base = PartitionData::default()
        .with_partition_index(index)
        .with_records(Some(Default::default()));
    let Some(partition) = b
        .catalog
        .topic_by_id(topic)
        .and_then(|t| t.partition(index))
    else {
        return base.with_error_code(ResponseError::UnknownTopicOrPartition.code());
    };
    let key = (group.to_string(), topic, index);
    let now = b.clock.now();
    let s = settings(b, group);
    if !b.share.partitions.lock().contains_key(&key) {
        let start = start_offset(b, group, &partition);
        let loaded = match b.share.coordinator.load(&share_key(&key), 0, start).await {
            Ok(state) => SharePartition::restore(state.start_offset.max(0), &state.batches),
            Err(e) => {
                tracing::warn!(error = %e, "could not load share-partition state");
                return base.with_error_code(ResponseError::CoordinatorNotAvailable.code());
            }
        };
        b.share
            .partitions
            .lock()
            .entry(key.clone())
            .or_insert(loaded);
    }
    let expired = {
        let mut parts = b.share.partitions.lock();
        let sp = parts.get_mut(&key).expect("loaded above");
        !sp.expire_locks(now, &s).is_empty()
    };
    if expired {
        let _ = persist(b, &key).await;
    }
    let from = {
        let mut parts = b.share.partitions.lock();
        let sp = parts.get_mut(&key).expect("loaded above");
        if !sp.can_acquire(partition.high_watermark(), &s) {
            return base;
        }
        sp.next_fetch_offset()
    };
    let slice = match partition.fetch(from, max_bytes.max(0) as usize, true).await {
        Ok(s) => s,
        Err(_) => return base,
    };
    let mut rest = &slice.records[..];
    let mut fetched_end = from;
    while let Ok(Some(h)) = BatchHeader::parse(rest) {
        if h.size > rest.len() {
            break;
        }
        fetched_end = h.last_offset() + 1;
        rest = &rest[h.size..];
    }
    let acquired = {
        let mut parts = b.share.partitions.lock();
        let sp = parts.get_mut(&key).expect("created above");
        sp.acquire(member, now, max_records, fetched_end, &[], &s)
    };
    if acquired.is_empty() {
        return base;
    }
    base.with_records(Some(slice.records))
        .with_acquired_records(
            acquired
                .into_iter()
                .map(|a| {
                    AcquiredRecords::default()
                        .with_first_offset(a.first)
                        .with_last_offset(a.last)
                        .with_delivery_count(a.delivery_count)
                })
                .collect(),
        )
}

async fn share_acknowledge(
    b: Arc<Broker>,
    r: ShareAcknowledgeRequest,
    version: i16,
) -> ShareAcknowledgeResponse {
    use kafka_protocol::messages::share_acknowledge_response::{
        PartitionData as AckData, ShareAcknowledgeTopicResponse,
    };
    let top = |code: i16| ShareAcknowledgeResponse::default().with_error_code(code);
    let (Some(group), Some(member)) = (r.group_id.as_ref(), r.member_id.as_ref()) else {
        return top(ResponseError::InvalidRequest.code());
    };
    let (group, member) = (group.to_string(), member.to_string());
    if let Err(e) = b
        .share
        .sessions
        .lock()
        .acknowledge(&group, &member, r.share_session_epoch)
    {
        return top(session_code(&e));
    }
    let mut responses = Vec::with_capacity(r.topics.len());
    for t in &r.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let batches = ack_batches(
                p.acknowledgement_batches
                    .iter()
                    .map(|a| (a.first_offset, a.last_offset, a.acknowledge_types.clone())),
                version >= 2,
            );
            let key = (group.clone(), t.topic_id, p.partition_index);
            let code = acknowledge_partition(&b, &group, &member, key, batches).await;
            partitions.push(
                AckData::default()
                    .with_partition_index(p.partition_index)
                    .with_error_code(code),
            );
        }
        responses.push(
            ShareAcknowledgeTopicResponse::default()
                .with_topic_id(t.topic_id)
                .with_partitions(partitions),
        );
    }
    if r.share_session_epoch == -1 {
        release_session(&b, &group, &member).await;
    }
    ShareAcknowledgeResponse::default()
        .with_acquisition_lock_timeout_ms(settings(&b, &group).lock_duration.as_millis() as i32)
        .with_responses(responses)
}
