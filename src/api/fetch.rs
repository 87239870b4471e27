//! Fetch: serve stored batches as they are, long-polling until `min_bytes`
//! arrive or `max_wait_ms` passes.
//!
//! A read_committed fetch (`isolation_level` 1) gets only batches below the
//! last stable offset, with the aborted transactions among them; the client
//! drops those transactions' records itself, as Kafka's protocol has it, so
//! the stored bytes are still served untouched. Every fetch reports the LSO.
//!
//! Which partitions a request reads, and which of them its response lists,
//! is the fetch session's business (`fetch_session`, KIP-227); this module
//! reads them.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::{
    fetch_request, fetch_response, FetchRequest, FetchResponse, ProducerId, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use tokio::sync::watch;

use super::authorize::{split, TOPIC_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::error::log_error_code;
use super::fetch_session::{Answered, PartitionKey, Plan, Position, TopicRef};
use super::metrics::error_codes;
use super::{leader_hints, quotas, Broker};
use crate::access::acl::Operation;
use crate::access::quota::Direction;
use crate::catalog::Topic;
use crate::format::batch;
use crate::log::Partition;

pub(super) const FETCH: Api = api!(FetchRequest, 4..=18, later(handle_fetch));

error_codes! {
    FetchResponse => |r, f| {
        f(r.error_code);
        for t in &r.responses {
            t.partitions.iter().for_each(|p| f(p.error_code));
        }
    };
}

/// Fetch: READ on each topic; then the fetch quota on what was read.
fn handle_fetch(
    b: &Arc<Broker>,
    r: FetchRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = FetchResponse> + Send + 'static {
    let (r, denied) = authorize_fetch(b, cx, r);
    let pending = leader_hints::fetch(b, fetch(b.clone(), r, cx.version), cx.version, cx.listener);
    let (b, principal, client_id, mute) = (
        b.clone(),
        cx.principal.clone(),
        cx.client_id(),
        cx.mute.clone(),
    );
    async move {
        let mut resp = pending.await;
        resp.responses.extend(denied);
        let throttle = quotas::throttle(
            &b,
            &principal,
            &client_id,
            &mute,
            Direction::Fetch,
            fetch_bytes(&resp),
        );
        resp.throttle_time_ms = quotas::millis(throttle);
        resp
    }
}

fn authorize_fetch(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: FetchRequest,
) -> (FetchRequest, Vec<fetch_response::FetchableTopicResponse>) {
    use fetch_response::{FetchableTopicResponse, PartitionData};
    let name_of = |t: &fetch_request::FetchTopic| -> Option<String> {
        if t.topic_id.is_nil() {
            Some(t.topic.0.to_string())
        } else {
            b.catalog
                .topic_by_id(t.topic_id)
                .map(|t| t.name().to_string())
        }
    };
    // An unknown topic id is the handler's to answer (UNKNOWN_TOPIC_ID).
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        name_of(t).is_none_or(|n| b.on_topic(cx, Operation::Read, &n))
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            FetchableTopicResponse::default()
                .with_topic(t.topic)
                .with_topic_id(t.topic_id)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_error_code(TOPIC_DENIED)
                                .with_high_watermark(-1)
                                .with_last_stable_offset(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// Bytes of record data in a fetch response, for the fetch quota.
fn fetch_bytes(resp: &FetchResponse) -> u64 {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
        .sum()
}

/// The partitions of one topic to read, resolved once.
struct Wanted {
    topic: TopicRef,
    /// Where the bytes read are counted, when the topic exists.
    found: Option<Arc<Topic>>,
    partitions: Vec<WantedPartition>,
}

struct WantedPartition {
    index: i32,
    position: Position,
    /// The partition, or the error code to answer with.
    partition: Result<Arc<Partition>, i16>,
}

/// What becomes of the response's session.
enum Session {
    None,
    /// Offer a new session holding what was read.
    Create,
    /// Answer only the partitions of this session that changed.
    Incremental(i32),
}

pub(super) async fn fetch(broker: Arc<Broker>, req: FetchRequest, version: i16) -> FetchResponse {
    let topic_ref = |name: &TopicName, id: uuid::Uuid| {
        if version >= 13 {
            TopicRef::Id(id)
        } else {
            TopicRef::Name(name.0.as_str().into())
        }
    };
    let requested = req
        .topics
        .iter()
        .flat_map(|ft| {
            let topic = topic_ref(&ft.topic, ft.topic_id);
            ft.partitions.iter().map(move |fp| {
                let key = PartitionKey {
                    topic: topic.clone(),
                    partition: fp.partition,
                };
                let position = Position {
                    fetch_offset: fp.fetch_offset,
                    max_bytes: fp.partition_max_bytes,
                    current_leader_epoch: fp.current_leader_epoch,
                };
                (key, position)
            })
        })
        .collect();
    let forgotten = req
        .forgotten_topics_data
        .iter()
        .flat_map(|ft| {
            let topic = topic_ref(&ft.topic, ft.topic_id);
            ft.partitions.iter().map(move |&partition| PartitionKey {
                topic: topic.clone(),
                partition,
            })
        })
        .collect();
    let now_ms = broker.clock.now_ms();
    let plan = broker.fetch_sessions.plan(
        version,
        req.session_id,
        req.session_epoch,
        requested,
        forgotten,
        now_ms,
    );
    let (partitions, session) = match plan {
        Plan::Error(code) => return FetchResponse::default().with_error_code(code),
        Plan::Sessionless(p) => (p, Session::None),
        Plan::Full(p) => (p, Session::Create),
        Plan::Incremental {
            session_id,
            partitions,
        } => (partitions, Session::Incremental(session_id)),
    };
    let wanted = resolve(&broker, partitions);

    let deadline = broker.clock.now() + Duration::from_millis(req.max_wait_ms.max(0) as u64);
    let min_bytes = req.min_bytes.max(0) as usize;
    let read_committed = req.isolation_level == 1;
    let max_bytes = if req.max_bytes <= 0 {
        i32::MAX as usize
    } else {
        req.max_bytes as usize
    };
    let topics = loop {
        // Subscribe before reading so an append between the read and the wait is not missed.
        let mut watches: Vec<watch::Receiver<i64>> = wanted
            .iter()
            .flat_map(|w| {
                w.partitions
                    .iter()
                    .filter_map(|wp| wp.partition.as_ref().ok().map(|p| p.subscribe()))
            })
            .collect();
        let (topics, bytes, errors) = read_all(&wanted, max_bytes, read_committed).await;
        // A reader at an end appended but not yet durable starts the fsync.
        for w in &wanted {
            for p in w
                .partitions
                .iter()
                .filter_map(|wp| wp.partition.as_ref().ok())
            {
                p.sync_soon();
            }
        }
        let now = broker.clock.now();
        if bytes >= min_bytes || errors || watches.is_empty() || now >= deadline {
            break topics;
        }
        let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        if tokio::time::timeout(deadline - now, changed).await.is_err() {
            break read_all(&wanted, max_bytes, read_committed).await.0;
        }
    };
    answer(&broker, session, &wanted, topics, version)
}

/// Looks up each partition once, grouping them by topic in request order.
fn resolve(broker: &Broker, partitions: Vec<(PartitionKey, Position)>) -> Vec<Wanted> {
    let mut wanted: Vec<Wanted> = Vec::new();
    let mut by_topic: HashMap<TopicRef, (usize, Result<Arc<Topic>, i16>)> = HashMap::new();
    for (key, position) in partitions {
        let (slot, topic) = by_topic.entry(key.topic.clone()).or_insert_with(|| {
            let topic = match &key.topic {
                TopicRef::Id(id) => broker
                    .catalog
                    .topic_by_id(*id)
                    .ok_or(ResponseError::UnknownTopicId.code()),
                TopicRef::Name(name) => broker
                    .catalog
                    .topic(name)
                    .ok_or(ResponseError::UnknownTopicOrPartition.code()),
            };
            wanted.push(Wanted {
                topic: key.topic.clone(),
                found: topic.as_ref().ok().cloned(),
                partitions: Vec::new(),
            });
            (wanted.len() - 1, topic)
        });
        let partition = match topic {
            Ok(t) => broker.served_partition(t, key.partition, position.current_leader_epoch),
            Err(code) => Err(*code),
        };
        wanted[*slot].partitions.push(WantedPartition {
            index: key.partition,
            position,
            partition,
        });
    }
    wanted
}

/// The response: everything read, or for an incremental session only what
/// changed; a full request's response offers a new session.
fn answer(
    broker: &Broker,
    session: Session,
    wanted: &[Wanted],
    mut topics: Vec<FetchableTopicResponse>,
    version: i16,
) -> FetchResponse {
    for (w, t) in wanted.iter().zip(&topics) {
        let Some(found) = &w.found else { continue };
        for pd in &t.partitions {
            if let Some(records) = pd.records.as_ref().filter(|r| !r.is_empty()) {
                found
                    .traffic()
                    .fetched(records.len() as u64, batch::count_records(records));
            }
        }
    }
    let answered = || {
        wanted.iter().zip(&topics).flat_map(|(w, t)| {
            w.partitions.iter().zip(&t.partitions).map(|(wp, pd)| {
                let key = PartitionKey {
                    topic: w.topic.clone(),
                    partition: wp.index,
                };
                let a = Answered {
                    high_watermark: pd.high_watermark,
                    log_start_offset: pd.log_start_offset,
                    last_stable_offset: pd.last_stable_offset,
                    has_records: pd.records.as_ref().is_some_and(|r| !r.is_empty()),
                    error_code: pd.error_code,
                };
                (key, wp.position, a)
            })
        })
    };
    let now_ms = broker.clock.now_ms();
    let session_id = match session {
        Session::None => 0,
        Session::Create => broker
            .fetch_sessions
            .create(version, answered().collect(), now_ms),
        Session::Incremental(id) => {
            let list: Vec<_> = answered().map(|(k, _, a)| (k, a)).collect();
            let mut keep = broker.fetch_sessions.select(id, &list).into_iter();
            for t in &mut topics {
                t.partitions.retain(|_| keep.next().unwrap_or(true));
            }
            topics.retain(|t| !t.partitions.is_empty());
            id
        }
    };
    FetchResponse::default()
        .with_session_id(session_id)
        .with_responses(topics)
}

/// One pass over every requested partition. Returns the topics, the bytes of
/// records gathered and whether any partition failed. Async because offsets
/// below the local segments are read from the object store.
async fn read_all(
    wanted: &[Wanted],
    max_bytes: usize,
    read_committed: bool,
) -> (Vec<FetchableTopicResponse>, usize, bool) {
    let mut total = 0usize;
    let mut any_error = false;
    let mut topics = Vec::with_capacity(wanted.len());
    for w in wanted {
        let mut partitions = Vec::with_capacity(w.partitions.len());
        for wp in &w.partitions {
            let base = PartitionData::default().with_partition_index(wp.index);
            let result = match wp.partition.as_ref() {
                Err(c) => Err(*c),
                Ok(p) => {
                    let budget = (wp.position.max_bytes.max(0) as usize)
                        .min(max_bytes.saturating_sub(total));
                    // KIP-74: the first batch of the response is returned whole, whatever its size.
                    let (offset, min_one) = (wp.position.fetch_offset, total == 0);
                    let slice = if read_committed {
                        p.fetch_committed(offset, budget, min_one).await
                    } else {
                        p.fetch(offset, budget, min_one).await
                    };
                    slice.map_err(|e| log_error_code(&e))
                }
            };
            partitions.push(match result {
                Ok(slice) => {
                    total += slice.records.len();
                    let aborted = slice
                        .aborted
                        .iter()
                        .map(|a| {
                            AbortedTransaction::default()
                                .with_producer_id(ProducerId(a.producer_id))
                                .with_first_offset(a.first_offset)
                        })
                        .collect();
                    base.with_high_watermark(slice.high_watermark)
                        .with_last_stable_offset(slice.last_stable_offset)
                        .with_log_start_offset(slice.log_start_offset)
                        .with_aborted_transactions(Some(aborted))
                        .with_records(Some(slice.records))
                }
                Err(code) => {
                    any_error = true;
                    base.with_error_code(code)
                        .with_high_watermark(-1)
                        .with_last_stable_offset(-1)
                        .with_log_start_offset(-1)
                        .with_records(Some(Default::default()))
                }
            });
        }
        let resp = FetchableTopicResponse::default().with_partitions(partitions);
        topics.push(match &w.topic {
            TopicRef::Id(id) => resp.with_topic_id(*id),
            TopicRef::Name(name) => {
                resp.with_topic(TopicName(StrBytes::from_string(name.to_string())))
            }
        });
    }
    (topics, total, any_error)
}
