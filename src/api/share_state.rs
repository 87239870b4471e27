//! Share-partition state between brokers (KIP-932's persister): the
//! Initialize, Read, Write, Delete and ReadSummary ShareGroupState APIs
//! (keys 83 to 87), and the side that calls them.
//!
//! The share coordinator is the broker leading `__share_group_state`; the
//! share-partitions live on the leaders of their partitions, and the
//! operator's APIs on the group coordinator. Each reaches the state the
//! same way: a local call when it is the share coordinator itself, else one
//! of these requests to the broker that is. A new leader reads at its
//! leader epoch, which fences the writes of the one before it.
//!
//! The requests come from brokers only: CLUSTER_ACTION on the cluster.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

use super::dispatch::{api, Api};
use super::metrics::error_codes;
use super::{Broker, Route};
use crate::access::acl::Operation;
use crate::coordinator::share_partition::{RecordState, StateBatch};
use crate::coordinator::share_records::ShareKey;
use crate::coordinator::share_state::{ReadState, StateError, Summary, Write};
use crate::coordinator::share_store::{ShareStoreError, SHARE_STATE_TOPIC};

const CLUSTER_DENIED: i16 = 31; // CLUSTER_AUTHORIZATION_FAILED

pub(super) const INITIALIZE_SHARE_GROUP_STATE: Api = api!(
    InitializeShareGroupStateRequest,
    0..=0,
    later(|b, r, cx| {
        let allowed = b.on_cluster(cx, Operation::ClusterAction);
        initialize(b.clone(), r, allowed)
    })
);
pub(super) const READ_SHARE_GROUP_STATE: Api = api!(
    ReadShareGroupStateRequest,
    0..=0,
    later(|b, r, cx| {
        let allowed = b.on_cluster(cx, Operation::ClusterAction);
        read(b.clone(), r, allowed)
    })
);
pub(super) const WRITE_SHARE_GROUP_STATE: Api = api!(
    WriteShareGroupStateRequest,
    0..=1,
    later(|b, r, cx| {
        let allowed = b.on_cluster(cx, Operation::ClusterAction);
        write(b.clone(), r, allowed)
    })
);
pub(super) const DELETE_SHARE_GROUP_STATE: Api = api!(
    DeleteShareGroupStateRequest,
    0..=0,
    later(|b, r, cx| {
        let allowed = b.on_cluster(cx, Operation::ClusterAction);
        delete(b.clone(), r, allowed)
    })
);
pub(super) const READ_SHARE_GROUP_STATE_SUMMARY: Api = api!(
    ReadShareGroupStateSummaryRequest,
    0..=1,
    ready(|b, r, cx| read_summary(b, r, b.on_cluster(cx, Operation::ClusterAction)))
);

error_codes! {
    InitializeShareGroupStateResponse => |r, f| r.results.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
    ReadShareGroupStateResponse => |r, f| r.results.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
    WriteShareGroupStateResponse => |r, f| r.results.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
    DeleteShareGroupStateResponse => |r, f| r.results.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
    ReadShareGroupStateSummaryResponse => |r, f| r.results.iter().flat_map(|t| &t.partitions).for_each(|p| f(p.error_code));
}

/// Kafka's code for a share coordinator's refusal.
pub(super) fn code(e: &ShareStoreError) -> i16 {
    match e {
        ShareStoreError::NotCoordinator => ResponseError::NotCoordinator,
        ShareStoreError::State(StateError::FencedLeaderEpoch) => ResponseError::FencedLeaderEpoch,
        ShareStoreError::State(StateError::FencedStateEpoch) => ResponseError::FencedStateEpoch,
        ShareStoreError::State(StateError::InvalidRequest(_)) => ResponseError::InvalidRequest,
        ShareStoreError::Log(_) => ResponseError::CoordinatorNotAvailable,
    }
    .code()
}

fn key(group: &StrBytes, topic_id: Uuid, partition: i32) -> ShareKey {
    ShareKey {
        group: group.to_string(),
        topic_id,
        partition,
    }
}

fn batches_out<B: Default>(
    batches: &[StateBatch],
    make: impl Fn(B, i64, i64, i8, i16) -> B,
) -> Vec<B> {
    batches
        .iter()
        .map(|s| {
            make(
                B::default(),
                s.first,
                s.last,
                s.state.code(),
                s.delivery_count,
            )
        })
        .collect()
}

fn batch_in(first: i64, last: i64, state: i8, count: i16) -> Option<StateBatch> {
    Some(StateBatch {
        first,
        last,
        state: RecordState::from_code(state)?,
        delivery_count: count,
    })
}

async fn initialize(
    b: Arc<Broker>,
    r: InitializeShareGroupStateRequest,
    allowed: bool,
) -> InitializeShareGroupStateResponse {
    use kafka_protocol::messages::initialize_share_group_state_response as o;
    let mut results = Vec::new();
    let mut end = None;
    for t in &r.topics {
        let mut out = o::InitializeStateResult::default().with_topic_id(t.topic_id);
        for p in &t.partitions {
            let k = key(&r.group_id, t.topic_id, p.partition);
            let result = match allowed {
                false => Err(CLUSTER_DENIED),
                true => b
                    .share
                    .coordinator
                    .initialize(&k, p.state_epoch, p.start_offset)
                    .map_err(|e| code(&e)),
            };
            if let Ok(e) = result {
                end = Some(e);
            }
            out.partitions.push(
                o::PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(result.err().unwrap_or(0)),
            );
        }
        results.push(out);
    }
    if let Some(end) = end {
        fail_all_on(
            &b,
            end,
            &mut results,
            |t| &mut t.partitions,
            |p| &mut p.error_code,
        )
        .await;
    }
    InitializeShareGroupStateResponse::default().with_results(results)
}

/// Waits until `end` is durable; if it cannot be, every partition that
/// succeeded fails.
async fn fail_all_on<T, P>(
    b: &Broker,
    end: i64,
    results: &mut [T],
    partitions: impl Fn(&mut T) -> &mut Vec<P>,
    error: impl Fn(&mut P) -> &mut i16,
) {
    if let Err(e) = b.share.coordinator.durable(end).await {
        let c = code(&e);
        for t in results.iter_mut() {
            for p in partitions(t).iter_mut() {
                let slot = error(p);
                if *slot == 0 {
                    *slot = c;
                }
            }
        }
    }
}

async fn read(
    b: Arc<Broker>,
    r: ReadShareGroupStateRequest,
    allowed: bool,
) -> ReadShareGroupStateResponse {
    use kafka_protocol::messages::read_share_group_state_response as o;
    let mut results = Vec::new();
    for t in &r.topics {
        let mut out = o::ReadStateResult::default().with_topic_id(t.topic_id);
        for p in &t.partitions {
            let k = key(&r.group_id, t.topic_id, p.partition);
            let base = o::PartitionResult::default().with_partition(p.partition);
            let read = match allowed {
                false => Err(CLUSTER_DENIED),
                true => b
                    .share
                    .coordinator
                    .read(&k, p.leader_epoch)
                    .await
                    .map_err(|e| code(&e)),
            };
            out.partitions.push(match read {
                Err(c) => base.with_error_code(c),
                Ok(s) => base
                    .with_state_epoch(s.state_epoch)
                    .with_start_offset(s.start_offset)
                    .with_state_batches(batches_out(
                        &s.batches,
                        |b: o::StateBatch, f, l, st, c| {
                            b.with_first_offset(f)
                                .with_last_offset(l)
                                .with_delivery_state(st)
                                .with_delivery_count(c)
                        },
                    )),
            });
        }
        results.push(out);
    }
    ReadShareGroupStateResponse::default().with_results(results)
}

async fn write(
    b: Arc<Broker>,
    r: WriteShareGroupStateRequest,
    allowed: bool,
) -> WriteShareGroupStateResponse {
    use kafka_protocol::messages::write_share_group_state_response as o;
    let mut results = Vec::new();
    let mut end = None;
    for t in &r.topics {
        let mut out = o::WriteStateResult::default().with_topic_id(t.topic_id);
        for p in &t.partitions {
            let k = key(&r.group_id, t.topic_id, p.partition);
            let batches: Option<Vec<StateBatch>> = p
                .state_batches
                .iter()
                .map(|s| {
                    batch_in(
                        s.first_offset,
                        s.last_offset,
                        s.delivery_state,
                        s.delivery_count,
                    )
                })
                .collect();
            let result = match (allowed, batches) {
                (false, _) => Err(CLUSTER_DENIED),
                (true, None) => Err(ResponseError::InvalidRequest.code()),
                (true, Some(batches)) => {
                    let w = Write {
                        state_epoch: p.state_epoch,
                        leader_epoch: p.leader_epoch,
                        start_offset: p.start_offset,
                        delivery_complete_count: p.delivery_complete_count,
                        batches,
                    };
                    b.share.coordinator.write(&k, &w).map_err(|e| code(&e))
                }
            };
            if let Ok(e) = result {
                end = Some(e);
            }
            out.partitions.push(
                o::PartitionResult::default()
                    .with_partition(p.partition)
                    .with_error_code(result.err().unwrap_or(0)),
            );
        }
        results.push(out);
    }
    if let Some(end) = end {
        fail_all_on(
            &b,
            end,
            &mut results,
            |t| &mut t.partitions,
            |p| &mut p.error_code,
        )
        .await;
    }
    WriteShareGroupStateResponse::default().with_results(results)
}

async fn delete(
    b: Arc<Broker>,
    r: DeleteShareGroupStateRequest,
    allowed: bool,
) -> DeleteShareGroupStateResponse {
    use kafka_protocol::messages::delete_share_group_state_response as o;
    let keys: Vec<ShareKey> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| key(&r.group_id, t.topic_id, p.partition))
        })
        .collect();
    let result = match allowed {
        false => Err(CLUSTER_DENIED),
        true => match b.share.coordinator.delete(&keys) {
            Ok(end) => b.share.coordinator.durable(end).await.map_err(|e| code(&e)),
            Err(e) => Err(code(&e)),
        },
    };
    let c = result.err().unwrap_or(0);
    let results = r
        .topics
        .iter()
        .map(|t| {
            o::DeleteStateResult::default()
                .with_topic_id(t.topic_id)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            o::PartitionResult::default()
                                .with_partition(p.partition)
                                .with_error_code(c)
                        })
                        .collect(),
                )
        })
        .collect();
    DeleteShareGroupStateResponse::default().with_results(results)
}

fn read_summary(
    b: &Arc<Broker>,
    r: ReadShareGroupStateSummaryRequest,
    allowed: bool,
) -> ReadShareGroupStateSummaryResponse {
    use kafka_protocol::messages::read_share_group_state_summary_response as o;
    let results = r
        .topics
        .iter()
        .map(|t| {
            let partitions = t
                .partitions
                .iter()
                .map(|p| {
                    let base = o::PartitionResult::default().with_partition(p.partition);
                    if !allowed {
                        return base.with_error_code(CLUSTER_DENIED);
                    }
                    match b
                        .share
                        .coordinator
                        .summary(&key(&r.group_id, t.topic_id, p.partition))
                    {
                        Err(e) => base.with_error_code(code(&e)),
                        // Kafka's answer for a share-partition without a state.
                        Ok(None) => base.with_start_offset(-1).with_delivery_complete_count(-1),
                        Ok(Some(s)) => base
                            .with_state_epoch(s.state_epoch)
                            .with_leader_epoch(s.leader_epoch)
                            .with_start_offset(s.start_offset)
                            .with_delivery_complete_count(s.delivery_complete_count),
                    }
                })
                .collect();
            o::ReadStateSummaryResult::default()
                .with_topic_id(t.topic_id)
                .with_partitions(partitions)
        })
        .collect();
    ReadShareGroupStateSummaryResponse::default().with_results(results)
}

/// The share coordinator's keys for partitions of `group`.
fn share_keys(group: &str, keys: &[(Uuid, i32)]) -> Vec<ShareKey> {
    keys.iter()
        .map(|(t, p)| ShareKey {
            group: group.to_string(),
            topic_id: *t,
            partition: *p,
        })
        .collect()
}

/// Per-partition entries grouped by topic, in first-seen order, as the
/// state requests list them.
fn by_topic<P>(parts: impl Iterator<Item = (Uuid, P)>) -> Vec<(Uuid, Vec<P>)> {
    let mut out: Vec<(Uuid, Vec<P>)> = Vec::new();
    for (t, p) in parts {
        match out.iter_mut().find(|(id, _)| *id == t) {
            Some((_, ps)) => ps.push(p),
            None => out.push((t, vec![p])),
        }
    }
    out
}

/// Where the share coordinator is.
enum Coordinator {
    Here,
    At(String, i32),
}

fn locate(b: &Broker) -> Result<Coordinator, i16> {
    let unavailable = ResponseError::CoordinatorNotAvailable.code();
    let Some(topic) = b.catalog.topic(SHARE_STATE_TOPIC) else {
        return Err(unavailable);
    };
    if b.cluster.is_none() {
        return Ok(Coordinator::Here);
    }
    if let Route::Serve(_) = b.route(topic.id(), 0) {
        return Ok(Coordinator::Here);
    }
    let (node, _) = b
        .cluster
        .as_ref()
        .and_then(|c| c.leader_of(topic.id(), 0))
        .ok_or(unavailable)?;
    let inter = &b.inter_broker;
    super::metadata::brokers(b, Some(&inter.listener))
        .into_iter()
        .find(|(id, _, _)| *id == node)
        .map(|(_, host, port)| Coordinator::At(host, port))
        .ok_or(unavailable)
}

fn unreachable(e: anyhow::Error) -> i16 {
    tracing::warn!(error = %e, "the share coordinator did not answer");
    ResponseError::CoordinatorNotAvailable.code()
}

/// The first partition result's error of a one-partition answer.
fn first_error<'a>(codes: impl Iterator<Item = &'a i16>) -> Result<(), i16> {
    match codes.copied().find(|c| *c != 0) {
        Some(c) => Err(c),
        None => Ok(()),
    }
}

/// A share-partition's state for its leader at `leader_epoch`, first
/// initialized at `start` if it has none.
pub(super) async fn load(
    b: &Broker,
    k: &ShareKey,
    leader_epoch: i32,
    start: i64,
) -> Result<ReadState, i16> {
    use kafka_protocol::messages::{
        initialize_share_group_state_request as i, read_share_group_state_request as rd,
    };
    let (host, port) = match locate(b)? {
        Coordinator::Here => {
            return b
                .share
                .coordinator
                .load(k, leader_epoch, start)
                .await
                .map_err(|e| code(&e))
        }
        Coordinator::At(host, port) => (host, port),
    };
    let group = StrBytes::from_string(k.group.clone());
    let read_req = ReadShareGroupStateRequest::default()
        .with_group_id(group.clone())
        .with_topics(vec![rd::ReadStateData::default()
            .with_topic_id(k.topic_id)
            .with_partitions(vec![rd::PartitionData::default()
                .with_partition(k.partition)
                .with_leader_epoch(leader_epoch)])]);
    for _ in 0..2 {
        let resp: ReadShareGroupStateResponse = b
            .inter_broker
            .share_state(&host, port, ApiKey::ReadShareGroupState, 0, &read_req)
            .await
            .map_err(unreachable)?;
        let p = resp
            .results
            .into_iter()
            .flat_map(|t| t.partitions)
            .next()
            .ok_or(ResponseError::CoordinatorNotAvailable.code())?;
        if p.error_code == ResponseError::InvalidRequest.code() {
            // Not initialized yet.
            let init = InitializeShareGroupStateRequest::default()
                .with_group_id(group.clone())
                .with_topics(vec![i::InitializeStateData::default()
                    .with_topic_id(k.topic_id)
                    .with_partitions(vec![i::PartitionData::default()
                        .with_partition(k.partition)
                        .with_state_epoch(0)
                        .with_start_offset(start)])]);
            let resp: InitializeShareGroupStateResponse = b
                .inter_broker
                .share_state(&host, port, ApiKey::InitializeShareGroupState, 0, &init)
                .await
                .map_err(unreachable)?;
            first_error(
                resp.results
                    .iter()
                    .flat_map(|t| &t.partitions)
                    .map(|p| &p.error_code),
            )?;
            continue;
        }
        if p.error_code != 0 {
            return Err(p.error_code);
        }
        let batches = p
            .state_batches
            .iter()
            .filter_map(|s| {
                batch_in(
                    s.first_offset,
                    s.last_offset,
                    s.delivery_state,
                    s.delivery_count,
                )
            })
            .collect();
        return Ok(ReadState {
            state_epoch: p.state_epoch,
            start_offset: p.start_offset,
            batches,
        });
    }
    Err(ResponseError::CoordinatorNotAvailable.code())
}

/// Writes a share-partition's state at the share coordinator, which is
/// another broker (`write_here` covers this one), and waits for it.
pub(super) async fn write_remote(b: &Broker, k: &ShareKey, w: &Write) -> Result<(), i16> {
    use kafka_protocol::messages::write_share_group_state_request as wr;
    let Coordinator::At(host, port) = locate(b)? else {
        return Err(ResponseError::NotCoordinator.code());
    };
    let req = WriteShareGroupStateRequest::default()
        .with_group_id(StrBytes::from_string(k.group.clone()))
        .with_topics(vec![wr::WriteStateData::default()
            .with_topic_id(k.topic_id)
            .with_partitions(vec![wr::PartitionData::default()
                .with_partition(k.partition)
                .with_state_epoch(w.state_epoch)
                .with_leader_epoch(w.leader_epoch)
                .with_start_offset(w.start_offset)
                .with_delivery_complete_count(w.delivery_complete_count)
                .with_state_batches(batches_out(
                    &w.batches,
                    |b: wr::StateBatch, f, l, s, c| {
                        b.with_first_offset(f)
                            .with_last_offset(l)
                            .with_delivery_state(s)
                            .with_delivery_count(c)
                    },
                ))])]);
    let resp: WriteShareGroupStateResponse = b
        .inter_broker
        .share_state(&host, port, ApiKey::WriteShareGroupState, 1, &req)
        .await
        .map_err(unreachable)?;
    first_error(
        resp.results
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| &p.error_code),
    )
}

/// Whether this broker is the share coordinator.
pub(super) fn here(b: &Broker) -> bool {
    matches!(locate(b), Ok(Coordinator::Here))
}

/// The summaries of `keys` (of one group), `None` where there is no state.
pub(super) async fn summaries(
    b: &Broker,
    group: &str,
    keys: &[(Uuid, i32)],
) -> Result<Vec<Option<Summary>>, i16> {
    use kafka_protocol::messages::read_share_group_state_summary_request as rs;
    let (host, port) = match locate(b)? {
        Coordinator::Here => {
            return share_keys(group, keys)
                .iter()
                .map(|k| b.share.coordinator.summary(k).map_err(|e| code(&e)))
                .collect()
        }
        Coordinator::At(host, port) => (host, port),
    };
    let parts = keys
        .iter()
        .map(|(t, p)| (*t, rs::PartitionData::default().with_partition(*p)));
    let topics = by_topic(parts)
        .into_iter()
        .map(|(t, ps)| {
            rs::ReadStateSummaryData::default()
                .with_topic_id(t)
                .with_partitions(ps)
        })
        .collect();
    let req = ReadShareGroupStateSummaryRequest::default()
        .with_group_id(StrBytes::from_string(group.to_string()))
        .with_topics(topics);
    let resp: ReadShareGroupStateSummaryResponse = b
        .inter_broker
        .share_state(&host, port, ApiKey::ReadShareGroupStateSummary, 1, &req)
        .await
        .map_err(unreachable)?;
    keys.iter()
        .map(|(t, p)| {
            let r = resp
                .results
                .iter()
                .filter(|r| r.topic_id == *t)
                .flat_map(|r| &r.partitions)
                .find(|r| r.partition == *p)
                .ok_or(ResponseError::CoordinatorNotAvailable.code())?;
            if r.error_code != 0 {
                return Err(r.error_code);
            }
            Ok(
                (r.start_offset >= 0 || r.delivery_complete_count >= 0).then_some(Summary {
                    start_offset: r.start_offset,
                    delivery_complete_count: r.delivery_complete_count,
                    leader_epoch: r.leader_epoch,
                    state_epoch: r.state_epoch,
                }),
            )
        })
        .collect()
}

/// Starts share-partitions of `group` over at the given offsets
/// (AlterShareGroupOffsets), each at a state epoch above its last.
pub(super) async fn reset(
    b: &Broker,
    group: &str,
    starts: &[((Uuid, i32), i64)],
) -> Result<(), i16> {
    use kafka_protocol::messages::initialize_share_group_state_request as i;
    if starts.is_empty() {
        return Ok(());
    }
    let (host, port) = match locate(b)? {
        Coordinator::Here => {
            let keys: Vec<(Uuid, i32)> = starts.iter().map(|(k, _)| *k).collect();
            let keyed: Vec<(ShareKey, i64)> = share_keys(group, &keys)
                .into_iter()
                .zip(starts.iter().map(|(_, s)| *s))
                .collect();
            let end = b.share.coordinator.reset(&keyed).map_err(|e| code(&e))?;
            return b.share.coordinator.durable(end).await.map_err(|e| code(&e));
        }
        Coordinator::At(host, port) => (host, port),
    };
    let keys: Vec<(Uuid, i32)> = starts.iter().map(|(k, _)| *k).collect();
    let epochs = summaries(b, group, &keys).await?;
    let parts = starts.iter().zip(epochs).map(|(((t, p), start), summary)| {
        let part = i::PartitionData::default()
            .with_partition(*p)
            .with_state_epoch(summary.map_or(0, |s| s.state_epoch + 1))
            .with_start_offset(*start);
        (*t, part)
    });
    let topics = by_topic(parts)
        .into_iter()
        .map(|(t, ps)| {
            i::InitializeStateData::default()
                .with_topic_id(t)
                .with_partitions(ps)
        })
        .collect();
    let req = InitializeShareGroupStateRequest::default()
        .with_group_id(StrBytes::from_string(group.to_string()))
        .with_topics(topics);
    let resp: InitializeShareGroupStateResponse = b
        .inter_broker
        .share_state(&host, port, ApiKey::InitializeShareGroupState, 0, &req)
        .await
        .map_err(unreachable)?;
    first_error(
        resp.results
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| &p.error_code),
    )
}

/// Forgets share-partitions' states (DeleteShareGroupOffsets, DeleteGroups).
pub(super) async fn delete_states(
    b: &Broker,
    group: &str,
    keys: &[(Uuid, i32)],
) -> Result<(), i16> {
    use kafka_protocol::messages::delete_share_group_state_request as d;
    if keys.is_empty() {
        return Ok(());
    }
    let (host, port) = match locate(b)? {
        Coordinator::Here => {
            let end = b
                .share
                .coordinator
                .delete(&share_keys(group, keys))
                .map_err(|e| code(&e))?;
            return b.share.coordinator.durable(end).await.map_err(|e| code(&e));
        }
        Coordinator::At(host, port) => (host, port),
    };
    let parts = keys
        .iter()
        .map(|(t, p)| (*t, d::PartitionData::default().with_partition(*p)));
    let topics = by_topic(parts)
        .into_iter()
        .map(|(t, ps)| {
            d::DeleteStateData::default()
                .with_topic_id(t)
                .with_partitions(ps)
        })
        .collect();
    let req = DeleteShareGroupStateRequest::default()
        .with_group_id(StrBytes::from_string(group.to_string()))
        .with_topics(topics);
    let resp: DeleteShareGroupStateResponse = b
        .inter_broker
        .share_state(&host, port, ApiKey::DeleteShareGroupState, 0, &req)
        .await
        .map_err(unreachable)?;
    first_error(
        resp.results
            .iter()
            .flat_map(|t| &t.partitions)
            .map(|p| &p.error_code),
    )
}

/// Every share-partition of `group` with a state, among the topics
/// `visible` lets through: all partitions of those topics are asked about.
pub(super) async fn states_of(
    b: &Broker,
    group: &str,
    visible: impl Fn(&str) -> bool,
) -> Result<Vec<((Uuid, i32), Summary)>, i16> {
    let keys: Vec<(Uuid, i32)> = b
        .catalog
        .topics()
        .into_iter()
        .filter(|t| !t.name().starts_with("__") && visible(t.name()))
        .flat_map(|t| (0..t.partition_count() as i32).map(move |p| (t.id(), p)))
        .collect();
    let summaries = summaries(b, group, &keys).await?;
    Ok(keys
        .into_iter()
        .zip(summaries)
        .filter_map(|(k, s)| Some((k, s?)))
        .collect())
}
