//! Share fetches (KIP-932): ShareFetch and ShareAcknowledge, the share
//! sessions they step, and the share-partitions they acquire records from
//! and acknowledge records in.
//!
//! A share-partition lives on the leader of its partition. Every change an
//! acknowledgement, a release or a lock expiry makes is written to the share
//! coordinator (`__share_group_state`) and is durable before it counts, so a
//! restarted broker, or the next leader, hands out only what was not yet
//! acknowledged. Acquiring is not written: after a crash, records that were
//! acquired and not acknowledged are delivered again, which is the
//! at-least-once contract.
//!
//! A fetch with nothing to hand out waits, up to its MaxWaitMs, for an
//! append to one of its partitions or for records to come back (released,
//! or their lock expired); the share timer expires locks.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::share_fetch_response::{
    AcquiredRecords, PartitionData, ShareFetchableTopicResponse,
};
use kafka_protocol::messages::*;
use parking_lot::Mutex;
use tokio::sync::{watch, Notify};
use uuid::Uuid;

use super::dispatch::{api, Api};
use super::metrics::error_codes;
use super::Broker;
use crate::coordinator::share_partition::{
    AckBatch, AckError, AckType, SharePartition, ShareSettings,
};
use crate::coordinator::share_records::ShareKey;
use crate::coordinator::share_session::{FetchContext, SessionError, ShareSessions};
use crate::coordinator::share_state::Write;
use crate::coordinator::share_store::ShareCoordinator;
use crate::format::batch::BatchHeader;

pub(super) const SHARE_FETCH: Api = api!(
    ShareFetchRequest,
    1..=2,
    later(|b, r, cx| {
        let pending = share_fetch(b.clone(), r, cx.version, cx.connection);
        super::leader_hints::share_fetch(b, pending, cx.listener)
    })
);
pub(super) const SHARE_ACKNOWLEDGE: Api = api!(
    ShareAcknowledgeRequest,
    1..=2,
    later(|b, r, cx| {
        let pending = share_acknowledge(b.clone(), r, cx.version, cx.connection);
        super::leader_hints::share_acknowledge(b, pending, cx.listener)
    })
);

error_codes! {
    ShareFetchResponse => |r, f| f(r.error_code);
    ShareAcknowledgeResponse => |r, f| f(r.error_code);
}

/// How many share sessions a broker keeps (Kafka's
/// group.share.max.share.sessions default).
const MAX_SESSIONS: usize = 2000;

type Key = (String, Uuid, i32);

/// A share-partition, with the epochs its state is written at.
struct Loaded {
    partition: SharePartition,
    leader_epoch: i32,
    state_epoch: i32,
}

/// This broker's share-partitions and share sessions, and the share
/// coordinator their state is written to.
pub(crate) struct ShareState {
    partitions: Mutex<HashMap<Key, Loaded>>,
    /// Share-partitions being loaded in the background (`load_later`).
    loading: Mutex<HashSet<Key>>,
    sessions: Mutex<ShareSessions>,
    pub(super) coordinator: Arc<ShareCoordinator>,
    /// Woken when records become acquirable again (released, lock expired).
    returned: Notify,
}

impl ShareState {
    pub(crate) fn new(coordinator: Arc<ShareCoordinator>) -> ShareState {
        ShareState {
            partitions: Mutex::new(HashMap::new()),
            loading: Mutex::new(HashSet::new()),
            sessions: Mutex::new(ShareSessions::new(MAX_SESSIONS)),
            coordinator,
            returned: Notify::new(),
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
/// snapshot per key) and waits until it is durable. When this broker is the
/// share coordinator the record is appended under the partitions' lock, so
/// two changes land in their order; a remote coordinator merges what it is
/// sent with what it has (delivery counts and states only move forward).
async fn persist(b: &Broker, key: &Key) -> Result<(), i16> {
    let here = super::share_state::here(b);
    let (w, end) = {
        let mut parts = b.share.partitions.lock();
        let Some(l) = parts.get(key) else {
            return Ok(());
        };
        let w = Write {
            state_epoch: l.state_epoch,
            leader_epoch: l.leader_epoch,
            start_offset: l.partition.start(),
            delivery_complete_count: l.partition.delivery_complete_count(),
            batches: l.partition.state_batches(),
        };
        let end = match here {
            true => match b.share.coordinator.write(&share_key(key), &w) {
                Ok(end) => Some(end),
                Err(e) => return Err(refused(&mut parts, key, super::share_state::code(&e))),
            },
            false => None,
        };
        (w, end)
    };
    let result = match end {
        Some(end) => b
            .share
            .coordinator
            .durable(end)
            .await
            .map_err(|e| super::share_state::code(&e)),
        None => super::share_state::write_remote(b, &share_key(key), &w).await,
    };
    result.map_err(|code| refused(&mut b.share.partitions.lock(), key, code))
}

/// A write the share coordinator refused: if a newer leader or an
/// operator's reset took the state over, this copy is stale and is read
/// again on the next fetch, and the client is sent to the leader.
fn refused(parts: &mut HashMap<Key, Loaded>, key: &Key, code: i16) -> i16 {
    let fenced = [
        ResponseError::FencedLeaderEpoch.code(),
        ResponseError::FencedStateEpoch.code(),
    ];
    if fenced.contains(&code) {
        parts.remove(key);
        return ResponseError::NotLeaderOrFollower.code();
    }
    tracing::warn!(code, "could not write share-partition state");
    code
}

/// Persists the share-partitions a release or an expiry changed, then
/// wakes the fetches waiting for records.
async fn returned(b: &Broker, keys: Vec<Key>) {
    if keys.is_empty() {
        return;
    }
    for key in &keys {
        let _ = persist(b, key).await;
    }
    b.share.returned.notify_waiters();
}

/// The share timer: records whose acquisition lock ran out become
/// available again (or archived at the delivery limit).
pub(crate) async fn run_share_timers(b: Arc<Broker>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        let now = b.clock.now();
        let expired: Vec<Key> = {
            let mut parts = b.share.partitions.lock();
            parts
                .iter_mut()
                .filter(|(_, l)| l.partition.next_lock_deadline().is_some_and(|t| t <= now))
                .filter_map(|(key, l)| {
                    let s = settings(&b, &key.0);
                    let changed = !l.partition.expire_locks(now, &s).is_empty();
                    changed.then(|| key.clone())
                })
                .collect()
        };
        returned(&b, expired).await;
    }
}

/// Drops this broker's copy of share-partitions whose state an operator
/// changed: their next fetch loads the new state. (A leader elsewhere
/// finds out when its next write is fenced.)
pub(super) fn forget(b: &Broker, group: &str, keys: &[(Uuid, i32)]) {
    let mut parts = b.share.partitions.lock();
    for (t, p) in keys {
        parts.remove(&(group.to_string(), *t, *p));
    }
}

/// A client connection closed: the share sessions last used on it end and
/// their members' records are released (Kafka does the same).
pub(crate) async fn connection_closed(b: &Broker, connection: u64) {
    let gone = b.share.sessions.lock().disconnected(connection);
    for ((group, member), partitions) in gone {
        release(b, &group, &member, partitions).await;
    }
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
    b.coordinator.share_config(group).partition
}

/// Where a share-partition nobody read yet starts (share.auto.offset.reset:
/// latest, earliest, or by_duration:<ISO-8601 duration>).
async fn start_offset(b: &Broker, group: &str, p: &crate::log::Partition) -> i64 {
    let configs = b.coordinator.group_configs().get(group);
    let reset = configs.get("share.auto.offset.reset").map(|v| v.trim());
    match reset {
        Some("earliest") => p.log_start_offset(),
        Some(v) if v.starts_with("by_duration:") => {
            let Some(d) =
                crate::coordinator::group_config::iso_duration(&v["by_duration:".len()..])
            else {
                return p.high_watermark();
            };
            let since = b.clock.now_ms() - d.as_millis() as i64;
            match p.find_offset_for_timestamp(since).await {
                Ok(Some((offset, _))) => offset,
                _ => p.high_watermark(),
            }
        }
        _ => p.high_watermark(),
    }
}

/// Applies one partition's acknowledgements and persists the result
/// before they count as done.
async fn acknowledge_partition(
    b: &Broker,
    member: &str,
    key: Key,
    batches: Result<Vec<AckBatch>, AckError>,
    s: &ShareSettings,
) -> i16 {
    // As Kafka, the topic first: a deleted one is UNKNOWN_TOPIC_ID and its
    // share-partition goes, rather than taking acknowledgements.
    let known = b
        .catalog
        .topic_by_id(key.1)
        .map(|t| t.partition(key.2).is_some());
    if known != Some(true) {
        b.share.partitions.lock().remove(&key);
        return match known {
            None => ResponseError::UnknownTopicId.code(),
            Some(_) => ResponseError::UnknownTopicOrPartition.code(),
        };
    }
    let batches = match batches {
        Ok(v) => v,
        Err(e) => return ack_code(&e),
    };
    let (changed, returned_any) = {
        let mut parts = b.share.partitions.lock();
        let Some(l) = parts.get_mut(&key) else {
            return ResponseError::InvalidRecordState.code();
        };
        match l.partition.acknowledge(member, b.clock.now(), &batches, s) {
            Ok(changed) => (
                !changed.is_empty(),
                batches.iter().any(|a| a.types.contains(&AckType::Release)),
            ),
            Err(e) => return ack_code(&e),
        }
    };
    let code = match changed {
        true => persist(b, &key).await.err().unwrap_or(0),
        false => 0,
    };
    if returned_any {
        b.share.returned.notify_waiters();
    }
    code
}

/// A member's share session ended: what it holds on `partitions` is
/// available again.
async fn release(b: &Broker, group: &str, member: &str, partitions: Vec<(Uuid, i32)>) {
    let s = settings(b, group);
    let mut released = Vec::new();
    {
        let mut parts = b.share.partitions.lock();
        for (t, p) in partitions {
            let key = (group.to_string(), t, p);
            if let Some(l) = parts.get_mut(&key) {
                if !l.partition.release_member(member, &s).is_empty() {
                    released.push(key);
                }
            }
        }
    }
    returned(b, released).await;
}

async fn share_fetch(
    b: Arc<Broker>,
    r: ShareFetchRequest,
    version: i16,
    connection: u64,
) -> ShareFetchResponse {
    let top = |code: i16| ShareFetchResponse::default().with_error_code(code);
    if !super::share_groups::enabled(&b) {
        return top(ResponseError::UnsupportedVersion.code());
    }
    let (Some(group), Some(member)) = (r.group_id.as_ref(), r.member_id.as_ref()) else {
        return top(ResponseError::InvalidRequest.code());
    };
    if member.is_empty() || member.len() > 36 || !(0..=1).contains(&r.share_acquire_mode) {
        return top(ResponseError::InvalidRequest.code());
    }
    if r.is_renew_ack && (r.max_records != 0 || r.min_bytes != 0 || r.max_bytes != 0) {
        return top(ResponseError::InvalidRequest.code());
    }
    let (group, member) = (group.to_string(), member.to_string());
    let s = settings(&b, &group);
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
        connection,
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
                version >= 2 && r.is_renew_ack,
            );
            let key = (group.clone(), t.topic_id, p.partition_index);
            let code = acknowledge_partition(&b, &member, key, batches, &s).await;
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
        // Listen before reading, so a release or an append in between is not missed.
        let returned = b.share.returned.notified();
        tokio::pin!(returned);
        returned.as_mut().enable();
        let mut appends: Vec<watch::Receiver<i64>> = Vec::new();
        if fetching {
            for (t, part) in &targets {
                if budget <= 0
                    || got
                        .get(&(*t, *part))
                        .is_some_and(|d| !d.acquired_records.is_empty())
                {
                    continue;
                }
                // As Kafka, which sets share-partitions up in the background
                // and answers with those ready: once this fetch has records
                // (spent some of its budget), one not loaded yet is loaded
                // for the next fetch.
                if budget < i64::from(r.max_records) {
                    let key = (group.clone(), *t, *part);
                    if !b.share.partitions.lock().contains_key(&key) {
                        load_later(&b, key);
                        continue;
                    }
                }
                let limits = Limits {
                    max_records: budget,
                    max_bytes: r.max_bytes,
                    whole_batches: r.share_acquire_mode == 0,
                };
                let (data, watch) =
                    fetch_partition(&b, &group, &member, (*t, *part), limits, &s).await;
                appends.extend(watch);
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
        let now = b.clock.now();
        if any || !fetching || now >= deadline {
            break;
        }
        let appended = async {
            if !appends.is_empty() {
                let (changed, _, _) =
                    select_all(appends.iter_mut().map(|w| Box::pin(w.changed()))).await;
                if changed.is_ok() {
                    return;
                }
            }
            // Nothing to watch, or a partition closed under us: wait for
            // the deadline instead of spinning.
            std::future::pending::<()>().await
        };
        tokio::select! {
            _ = returned => {}
            _ = appended => {}
            _ = tokio::time::sleep(deadline - now) => break,
        }
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
        let mut d = got.remove(&(*t, *part)).unwrap_or_else(|| empty(*part));
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
        push(t, empty(part).with_acknowledge_error_code(code));
    }
    if let FetchContext::Final(partitions) = context {
        release(&b, &group, &member, partitions).await;
    }
    ShareFetchResponse::default()
        .with_acquisition_lock_timeout_ms(s.lock_duration.as_millis() as i32)
        .with_responses(by_topic)
}

/// A partition's answer with nothing in it (Records must not be null).
fn empty(index: i32) -> PartitionData {
    PartitionData::default()
        .with_partition_index(index)
        .with_records(Some(Default::default()))
}

/// Loads a share-partition's state from the share coordinator the first
/// time this broker serves it, or again when its leader epoch changed.
async fn load(b: &Broker, key: &Key, p: &crate::log::Partition, epoch: i32) -> Result<(), i16> {
    let current = b
        .share
        .partitions
        .lock()
        .get(key)
        .is_some_and(|l| l.leader_epoch == epoch);
    if current {
        return Ok(());
    }
    if b.cluster.is_some() {
        // Other brokers' config changes arrive within a second; a new
        // share-partition starts where the group's share.auto.offset.reset
        // says now (an operator sets it just before the first consumer).
        if let Err(e) = super::group_configs::refresh(b).await {
            tracing::warn!(error = %e, "could not reread group configs");
        }
    }
    let start = start_offset(b, &key.0, p).await;
    let state = super::share_state::load(b, &share_key(key), epoch, start)
        .await
        .inspect_err(|&code| tracing::warn!(code, "could not load share-partition state"))?;
    let loaded = Loaded {
        partition: SharePartition::restore(state.start_offset.max(0), &state.batches),
        leader_epoch: epoch,
        state_epoch: state.state_epoch,
    };
    let mut parts = b.share.partitions.lock();
    match parts.get(key) {
        Some(l) if l.leader_epoch == epoch => {}
        _ => {
            parts.insert(key.clone(), loaded);
        }
    }
    Ok(())
}

/// Loads a share-partition in the background, once at a time, and wakes
/// the fetches waiting for records when it is ready.
fn load_later(b: &Arc<Broker>, key: Key) {
    if !b.share.loading.lock().insert(key.clone()) {
        return;
    }
    let b = b.clone();
    tokio::spawn(async move {
        let partition = b
            .catalog
            .topic_by_id(key.1)
            .and_then(|t| t.partition(key.2));
        if let (Some(p), super::Route::Serve(epoch)) = (partition, b.route(key.1, key.2)) {
            if load(&b, &key, &p, epoch).await.is_ok() {
                b.share.returned.notify_waiters();
            }
        }
        b.share.loading.lock().remove(&key);
    });
}

/// Offsets of the batches in `records` not to deliver: control batches,
/// and with `aborted` (read_committed) the batches of aborted transactions.
fn skipped(records: &[u8], aborted: &[crate::format::control::AbortedTxn]) -> Vec<(i64, i64)> {
    let mut out = Vec::new();
    let mut rest = records;
    while let Ok(Some(h)) = BatchHeader::parse(rest) {
        if h.size > rest.len() {
            break;
        }
        let dropped = h.is_control()
            || (h.is_transactional()
                && aborted.iter().any(|a| {
                    a.producer_id == h.producer_id
                        && a.first_offset <= h.base_offset
                        && h.last_offset() <= a.last_offset
                }));
        if dropped {
            out.push((h.base_offset, h.last_offset()));
        }
        rest = &rest[h.size..];
    }
    out
}

/// The last offset of the batch in `records` holding `offset`.
fn batch_last_offset(records: &[u8], offset: i64) -> i64 {
    let mut rest = records;
    while let Ok(Some(h)) = BatchHeader::parse(rest) {
        if h.size > rest.len() {
            break;
        }
        if h.base_offset <= offset && offset <= h.last_offset() {
            return h.last_offset();
        }
        rest = &rest[h.size..];
    }
    offset
}

/// What one partition's read may hand out.
struct Limits {
    max_records: i64,
    max_bytes: i32,
    /// share.acquire.mode=batch_optimized: past `max_records` to the end of
    /// the log batch it stopped in (record_limit stops at it exactly).
    whole_batches: bool,
}

/// Whether this broker is the partition's assigned leader but not serving
/// it yet.
fn taking_over(b: &Broker, topic: Uuid, index: i32) -> bool {
    b.cluster
        .as_ref()
        .and_then(|c| Some(c.leader_of(topic, index)?.0 == c.node_id()))
        .unwrap_or(false)
}

/// Reads one partition from its share-partition's next fetch offset and
/// acquires what was read; with nothing acquired, also a watch of the
/// partition's end to wait on.
async fn fetch_partition(
    b: &Broker,
    group: &str,
    member: &str,
    (topic, index): (Uuid, i32),
    limits: Limits,
    s: &ShareSettings,
) -> (PartitionData, Option<watch::Receiver<i64>>) {
    let base = empty(index);
    let Some(t) = b.catalog.topic_by_id(topic) else {
        return (
            base.with_error_code(ResponseError::UnknownTopicId.code()),
            None,
        );
    };
    let Some(partition) = t.partition(index) else {
        return (
            base.with_error_code(ResponseError::UnknownTopicOrPartition.code()),
            None,
        );
    };
    let epoch = match b.route(topic, index) {
        super::Route::Serve(e) => e,
        // Assigned here and still being taken over: nothing yet, rather than
        // an error the share consumer would retry at once, in a tight loop,
        // for as long as the takeover reads the old leader's log.
        super::Route::Elsewhere if taking_over(b, topic, index) => return (base, None),
        super::Route::Elsewhere => {
            return (
                base.with_error_code(ResponseError::NotLeaderOrFollower.code()),
                None,
            )
        }
    };
    let key = (group.to_string(), topic, index);
    if let Err(code) = load(b, &key, &partition, epoch).await {
        // The client retries on these; any other code would reach the application.
        let code = match code == ResponseError::NotLeaderOrFollower.code() {
            true => code,
            false => ResponseError::ReplicaNotAvailable.code(),
        };
        return (base.with_error_code(code), None);
    }
    let watch = partition.subscribe();
    let readable_end = match s.read_committed {
        true => partition.last_stable_offset(),
        false => partition.high_watermark(),
    };
    let from = {
        let mut parts = b.share.partitions.lock();
        let Some(l) = parts.get_mut(&key) else {
            return (base, Some(watch));
        };
        l.partition.log_start_moved(partition.log_start_offset());
        if !l.partition.can_acquire(readable_end, s) {
            return (base, Some(watch));
        }
        l.partition.next_fetch_offset()
    };
    let max_bytes = limits.max_bytes.max(0) as usize;
    let slice = match s.read_committed {
        true => partition.fetch_committed(from, max_bytes, true).await,
        false => partition.fetch(from, max_bytes, true).await,
    };
    let Ok(slice) = slice else {
        return (base, Some(watch));
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
    let skip = skipped(&slice.records, &slice.aborted);
    let acquired = {
        let mut parts = b.share.partitions.lock();
        let Some(l) = parts.get_mut(&key) else {
            return (base, Some(watch));
        };
        let now = b.clock.now();
        let mut acquired =
            l.partition
                .acquire(member, now, limits.max_records, fetched_end, &skip, s);
        let last = acquired.iter().map(|a| a.last).max();
        if let (true, Some(last)) = (limits.whole_batches, last) {
            // The rest of the batch holding the last record handed out.
            let batch_end = batch_last_offset(&slice.records, last);
            if batch_end > last {
                let rest =
                    l.partition
                        .acquire(member, now, batch_end - last, batch_end + 1, &skip, s);
                acquired.extend(rest);
            }
        }
        acquired
    };
    let Some(last) = acquired.iter().map(|a| a.last).max() else {
        return (base, Some(watch));
    };
    // Only the batches up to the one holding the last record handed out go
    // back (the read may have gone much further, up to MaxBytes).
    let mut len = 0;
    while let Ok(Some(h)) = BatchHeader::parse(&slice.records[len..]) {
        if h.base_offset > last || len + h.size > slice.records.len() {
            break;
        }
        len += h.size;
    }
    let records = slice.records.slice(..len);
    let data = base.with_records(Some(records)).with_acquired_records(
        acquired
            .into_iter()
            .map(|a| {
                AcquiredRecords::default()
                    .with_first_offset(a.first)
                    .with_last_offset(a.last)
                    .with_delivery_count(a.delivery_count)
            })
            .collect(),
    );
    (data, None)
}

async fn share_acknowledge(
    b: Arc<Broker>,
    r: ShareAcknowledgeRequest,
    version: i16,
    connection: u64,
) -> ShareAcknowledgeResponse {
    use kafka_protocol::messages::share_acknowledge_response::{
        PartitionData as AckData, ShareAcknowledgeTopicResponse,
    };
    let top = |code: i16| ShareAcknowledgeResponse::default().with_error_code(code);
    if !super::share_groups::enabled(&b) {
        return top(ResponseError::UnsupportedVersion.code());
    }
    let (Some(group), Some(member)) = (r.group_id.as_ref(), r.member_id.as_ref()) else {
        return top(ResponseError::InvalidRequest.code());
    };
    if member.is_empty() || member.len() > 36 {
        return top(ResponseError::InvalidRequest.code());
    }
    let (group, member) = (group.to_string(), member.to_string());
    let s = settings(&b, &group);
    let closing = match b.share.sessions.lock().acknowledge(
        &group,
        &member,
        r.share_session_epoch,
        connection,
    ) {
        Ok(closing) => closing,
        Err(e) => return top(session_code(&e)),
    };
    let mut responses = Vec::with_capacity(r.topics.len());
    for t in &r.topics {
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in &t.partitions {
            let batches = ack_batches(
                p.acknowledgement_batches
                    .iter()
                    .map(|a| (a.first_offset, a.last_offset, a.acknowledge_types.clone())),
                version >= 2 && r.is_renew_ack,
            );
            let key = (group.clone(), t.topic_id, p.partition_index);
            let code = acknowledge_partition(&b, &member, key, batches, &s).await;
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
    if let Some(partitions) = closing {
        release(&b, &group, &member, partitions).await;
    }
    ShareAcknowledgeResponse::default()
        .with_acquisition_lock_timeout_ms(s.lock_duration.as_millis() as i32)
        .with_responses(responses)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::batch::{encode_batch, encode_transactional_batch};
    use crate::format::control::AbortedTxn;
    use kafka_protocol::records::Compression;

    /// A batch of `n` records at `base`, transactional for `producer`.
    fn batch(base: i64, n: usize, producer: Option<i64>) -> Vec<u8> {
        let records = (0..n)
            .map(|_| (None, Some(bytes::Bytes::from_static(b"v")), 0))
            .collect();
        let b = match producer {
            Some(p) => encode_transactional_batch(records, (p, 0, 0), Compression::None),
            None => encode_batch(records, None, Compression::None),
        };
        let mut b = b.unwrap().to_vec();
        b[..8].copy_from_slice(&base.to_be_bytes());
        b
    }

    #[test]
    fn aborted_transactions_are_skipped_and_committed_ones_are_not() {
        let records = [
            batch(0, 2, None),
            batch(2, 3, Some(7)),
            batch(5, 2, Some(8)),
        ]
        .concat();
        let aborted = [AbortedTxn {
            producer_id: 7,
            first_offset: 2,
            last_offset: 9,
            last_stable_offset: 10,
        }];
        assert_eq!(skipped(&records, &aborted), vec![(2, 4)]);
        assert_eq!(skipped(&records, &[]), vec![]);
    }

    #[test]
    fn a_batch_optimized_acquire_ends_where_the_batch_ends() {
        let records = [batch(0, 2, None), batch(2, 3, None)].concat();
        assert_eq!(batch_last_offset(&records, 0), 1);
        assert_eq!(batch_last_offset(&records, 3), 4);
        assert_eq!(batch_last_offset(&records, 9), 9);
    }
}
