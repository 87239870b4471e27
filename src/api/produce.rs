//! Produce: validate and append one batch per partition, in request order,
//! then wait for durability where acks=all (or the topic's `flush.*`) asks
//! for it.
//!
//! The broker stores batches as the producer sent them and decodes records
//! only when the topic needs a per-record decision: keys on compacted
//! topics, timestamps outside `message.timestamp.{before,after}.max.ms`,
//! or a `compression.type` other than the producer's codec. A refused
//! record fails its whole batch, as in Kafka, and the response names every
//! offending record by its index in the batch (KIP-467's `record_errors`),
//! so a client can tell which record was bad.
//!
//! From version 13 (KIP-516) a producer names topics by id; the handler
//! turns ids into names first, so authorization, appends and leader hints
//! see names as before, and answers each topic under the id it was sent.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_request::TopicProduceData;
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse, TopicName};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;

use super::authorize::{split, TOPIC_DENIED, TXN_ID_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::error::log_error_code;
use super::metrics::error_codes;
use super::{leader_hints, quotas, transactions, Broker};
use crate::access::acl::Operation;
use crate::access::quota::Direction;
use crate::catalog::{ProducePolicy, Topic};
use crate::format::batch::{validate_produced, BatchHeader, CODEC_MASK, HEADER_LEN};
use crate::format::records;
use crate::log::{AppendOutcome, LogError, Partition};

pub(super) const PRODUCE: Api = api!(ProduceRequest, 3..=13, later_or_silent(handle_produce));

error_codes! {
    ProduceResponse => |r, f| for t in &r.responses {
        t.partition_responses.iter().for_each(|p| f(p.error_code));
    };
}

/// Produce: WRITE on each topic; then the produce quota.
fn handle_produce(
    b: &Arc<Broker>,
    r: ProduceRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = Option<ProduceResponse>> + Send + 'static {
    let (r, unknown_ids) = name_topics(b, r);
    let (r, mut denied) = authorize_produce(b, cx, r);
    denied.extend(unknown_ids);
    let throttle = quotas::throttle(
        b,
        cx.principal,
        &cx.client_id(),
        cx.mute,
        Direction::Produce,
        produce_bytes(&r),
    );
    let pending = leader_hints::produce(b, produce(b, r, cx.version), cx.version, cx.listener);
    async move {
        let mut resp = pending.await?;
        resp.responses.extend(denied);
        resp.throttle_time_ms = quotas::millis(throttle);
        Some(resp)
    }
}

/// Every partition of a refused topic gets `code`.
fn refuse(t: TopicProduceData, code: i16) -> TopicProduceResponse {
    TopicProduceResponse::default()
        .with_name(t.name)
        .with_topic_id(t.topic_id)
        .with_partition_responses(
            t.partition_data
                .iter()
                .map(|p| {
                    PartitionProduceResponse::default()
                        .with_index(p.index)
                        .with_base_offset(-1)
                        .with_error_code(code)
                })
                .collect(),
        )
}

/// Fills in the name of each topic sent by id (version 13 on); topics whose
/// id names no topic are answered UNKNOWN_TOPIC_ID, as Kafka does.
fn name_topics(b: &Broker, mut req: ProduceRequest) -> (ProduceRequest, Vec<TopicProduceResponse>) {
    let mut unknown = Vec::new();
    let topics = std::mem::take(&mut req.topic_data);
    for mut t in topics {
        if t.topic_id.is_nil() {
            req.topic_data.push(t);
        } else if let Some(topic) = b.catalog.topic_by_id(t.topic_id) {
            t.name = TopicName(StrBytes::from_string(topic.name().to_string()));
            req.topic_data.push(t);
        } else {
            unknown.push(refuse(t, ResponseError::UnknownTopicId.code()));
        }
    }
    (req, unknown)
}

fn authorize_produce(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: ProduceRequest,
) -> (ProduceRequest, Vec<TopicProduceResponse>) {
    if req
        .transactional_id
        .as_ref()
        .is_some_and(|id| !b.may_write_transactional_id(cx, id))
    {
        // Kafka refuses the whole request: every partition gets the error.
        let topics = std::mem::take(&mut req.topic_data);
        let denied = topics.into_iter().map(|t| refuse(t, TXN_ID_DENIED));
        return (req, denied.collect());
    }
    let (ok, denied) = split(std::mem::take(&mut req.topic_data), |t| {
        b.on_topic(cx, Operation::Write, &t.name)
    });
    req.topic_data = ok;
    let denied = denied
        .into_iter()
        .map(|t| refuse(t, TOPIC_DENIED))
        .collect();
    (req, denied)
}

/// Bytes of record data in a produce request, for the produce quota.
fn produce_bytes(req: &ProduceRequest) -> u64 {
    req.topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
        .sum()
}

/// Why a partition's batch was not appended: the error code, its message
/// and, for record-level problems, the records at fault.
struct Refusal {
    code: i16,
    message: Option<String>,
    record_errors: Vec<(i32, String)>,
}

impl From<LogError> for Refusal {
    fn from(e: LogError) -> Refusal {
        Refusal {
            code: log_error_code(&e),
            message: Some(e.to_string()),
            record_errors: Vec::new(),
        }
    }
}

impl Refusal {
    fn code(code: ResponseError) -> Refusal {
        Refusal {
            code: code.code(),
            message: None,
            record_errors: Vec::new(),
        }
    }
}

/// A partition's batch appended (with what the response and the durability
/// wait need), or why not.
type Appended = Result<(AppendOutcome, Arc<Partition>, ProducePolicy), Refusal>;

/// A transactions v2 batch waiting for the coordinator to add its partition
/// to the producer's transaction: where it goes and what it is.
struct Joining {
    at: (usize, usize),
    _queued: JoinTicket,
    producer: (i64, i16),
    topic: Arc<Topic>,
    index: i32,
    partition: Arc<Partition>,
    policy: ProducePolicy,
    records: Bytes,
}

/// Per producer and partition, how many of its transactions v2 batches wait
/// for the partition to join its transaction. While one waits, the
/// producer's next batches for that partition wait behind it, even once the
/// partition has a transaction open: the first appended opens it while the
/// batches after it still wait, and those arriving meanwhile must not pass
/// them.
#[derive(Default)]
pub(crate) struct Joins(Mutex<HashMap<(i64, uuid::Uuid, i32), usize>>);

impl Joins {
    fn waiting(&self, key: &(i64, uuid::Uuid, i32)) -> bool {
        self.0.lock().contains_key(key)
    }

    fn enter(self: &Arc<Self>, key: (i64, uuid::Uuid, i32)) -> JoinTicket {
        *self.0.lock().entry(key).or_default() += 1;
        JoinTicket {
            joins: self.clone(),
            key,
        }
    }
}

/// A batch's place in `Joins`, given up when it is appended or dropped.
struct JoinTicket {
    joins: Arc<Joins>,
    key: (i64, uuid::Uuid, i32),
}

impl Drop for JoinTicket {
    fn drop(&mut self) {
        let mut waiting = self.joins.0.lock();
        if let Some(n) = waiting.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                waiting.remove(&self.key);
            }
        }
    }
}

/// The first Produce version of a producer on transactions v2 (KIP-890):
/// its first batch in a partition adds the partition to its transaction.
const FIRST_TXN_V2_VERSION: i16 = 12;

/// Appends now; the returned future resolves once the acknowledgement may be
/// sent (`None` for acks=0, which gets no response at all).
///
/// Under transactions v2 a producer does not add partitions to its
/// transaction; its first batch there does. Such a batch is appended only
/// once the coordinator has added the partition (which also fences a batch
/// from a transaction that already ended: its epoch is stale), so it waits
/// inside the reply. Replies go out in order and are awaited one after
/// another, so the producer's next batches for that partition, which find
/// no transaction open there either, wait behind it and keep their order.
pub(super) fn produce(
    broker: &Arc<Broker>,
    req: ProduceRequest,
    version: i16,
) -> impl Future<Output = Option<ProduceResponse>> + Send + 'static {
    let acks = req.acks;
    let timeout = durable_timeout(broker, req.timeout_ms);
    let wait_for_disk = acks == -1 && acks_all_waits(broker);
    let txn_v2 = req
        .transactional_id
        .as_ref()
        .filter(|_| version >= FIRST_TXN_V2_VERSION && !broker.settings.null_sink)
        .map(|id| id.to_string());
    let mut appended: Vec<((usize, usize), Appended)> = Vec::new();
    let mut joining: Vec<Joining> = Vec::new();
    let mut responses = Vec::with_capacity(req.topic_data.len());
    for (ti, topic_data) in req.topic_data.into_iter().enumerate() {
        let topic = broker.catalog.topic(topic_data.name.0.as_str());
        let mut partitions = Vec::with_capacity(topic_data.partition_data.len());
        for (pi, pd) in topic_data.partition_data.into_iter().enumerate() {
            partitions.push(
                PartitionProduceResponse::default()
                    .with_index(pd.index)
                    .with_base_offset(-1),
            );
            let target = topic.as_ref().map(|t| {
                broker
                    .served_partition(t, pd.index, -1)
                    .map(|p| (t.clone(), p, t.produce_policy()))
            });
            let result = if ![-1, 0, 1].contains(&acks) {
                Err(Refusal::code(ResponseError::InvalidRequiredAcks))
            } else if topic.as_ref().is_some_and(|t| t.is_internal()) {
                // Only the broker writes its internal topics.
                Err(Refusal::code(ResponseError::InvalidTopicException))
            } else {
                match target {
                    Some(Ok((topic, partition, policy))) => {
                        let records = pd.records.unwrap_or_default();
                        let joins = txn_v2.as_ref().and_then(|_| {
                            let (producer, open) = transactional(&partition, &records)?;
                            let key = (producer.0, topic.id(), pd.index);
                            (!open || broker.joins.waiting(&key))
                                .then(|| (producer, broker.joins.enter(key)))
                        });
                        if let Some((producer, ticket)) = joins {
                            joining.push(Joining {
                                at: (ti, pi),
                                _queued: ticket,
                                producer,
                                topic,
                                index: pd.index,
                                partition,
                                policy,
                                records,
                            });
                            continue;
                        }
                        append_partition(broker, &topic, partition, policy, pd.index, records)
                    }
                    Some(Err(code)) => Err(Refusal {
                        code,
                        message: None,
                        record_errors: Vec::new(),
                    }),
                    None => Err(Refusal::code(ResponseError::UnknownTopicOrPartition)),
                }
            };
            appended.push(((ti, pi), result));
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(topic_data.name)
                .with_topic_id(topic_data.topic_id)
                .with_partition_responses(partitions),
        );
    }
    let waits = settle(broker, &mut responses, appended, version, wait_for_disk);
    // The fsyncs start now, not when the connection gets to this reply:
    // replies go out in order, so a wait inside the reply would begin only
    // once the request before it was answered, and the requests a producer
    // pipelines to different partitions (librdkafka sends one per partition)
    // would be made durable one after another instead of side by side.
    let durable = (!waits.is_empty()).then(|| {
        let ends: Vec<(Arc<Partition>, i64)> =
            waits.iter().map(|(_, p, end)| (p.clone(), *end)).collect();
        tokio::spawn(async move {
            wait_durable(ends.iter().map(|(p, end)| (p.as_ref(), *end)), timeout).await
        })
    });
    let broker = broker.clone();
    async move {
        // The batches waiting to join are appended while the others' fsyncs
        // run, not after them.
        let mut later = Vec::new();
        if let Some(id) = txn_v2.filter(|_| !joining.is_empty()) {
            let joined = join_transaction(&broker, &id, joining).await;
            later = settle(&broker, &mut responses, joined, version, wait_for_disk);
        }
        let mut codes = match durable {
            None => Vec::new(),
            Some(task) => task.await.unwrap_or_else(|e| {
                tracing::error!(error = %e, "waiting for durability failed");
                vec![ResponseError::KafkaStorageError.code(); waits.len()]
            }),
        };
        let mut waits = waits;
        if !later.is_empty() {
            let ends = later.iter().map(|(_, p, end)| (p.as_ref(), *end));
            codes.extend(wait_durable(ends, timeout).await);
            waits.extend(later);
        }
        for (((ti, pi), _, _), code) in waits.iter().zip(codes) {
            if code != 0 {
                let r = &mut responses[*ti].partition_responses[*pi];
                r.error_code = code;
                r.base_offset = -1;
            }
        }
        (acks != 0).then(|| ProduceResponse::default().with_responses(responses))
    }
}

/// The producer id and epoch of a transactional batch, and whether its
/// producer has a transaction open in `partition` at that epoch (else the
/// coordinator must add the partition first).
fn transactional(partition: &Partition, records: &[u8]) -> Option<((i64, i16), bool)> {
    let h = BatchHeader::parse(records).ok().flatten()?;
    (h.is_transactional() && h.has_producer_id()).then(|| {
        let open = partition.in_transaction(h.producer_id, h.producer_epoch);
        ((h.producer_id, h.producer_epoch), open)
    })
}

/// Has the coordinator add each waiting batch's partition to its
/// producer's transaction (one request per producer), then appends the
/// batches whose partition it added.
async fn join_transaction(
    broker: &Arc<Broker>,
    id: &str,
    joining: Vec<Joining>,
) -> Vec<((usize, usize), Appended)> {
    let mut by_producer: BTreeMap<(i64, i16), Vec<Joining>> = BTreeMap::new();
    for j in joining {
        by_producer.entry(j.producer).or_default().push(j);
    }
    let mut out = Vec::new();
    for (producer, batches) in by_producer {
        // A batch queued behind another that has since opened the
        // transaction here needs no word with the coordinator.
        let partitions: Vec<(String, i32)> = batches
            .iter()
            .filter(|j| !j.partition.in_transaction(producer.0, producer.1))
            .map(|j| (j.topic.name().to_string(), j.index))
            .collect();
        let added = if partitions.is_empty() {
            Ok(())
        } else {
            transactions::add_implicitly(broker, id, producer, partitions).await
        };
        for j in batches {
            let result = match added {
                Ok(()) => {
                    append_partition(broker, &j.topic, j.partition, j.policy, j.index, j.records)
                }
                Err(code) => Err(Refusal {
                    code: not_joined(code),
                    message: None,
                    record_errors: Vec::new(),
                }),
            };
            out.push((j.at, result));
        }
    }
    out
}

/// What a producer is told when its partition could not join its
/// transaction, as Kafka's brokers tell it: a fenced producer
/// INVALID_PRODUCER_EPOCH (the transaction is aborted), a coordinator that
/// is busy with the previous transaction or out of reach
/// NOT_ENOUGH_REPLICAS (the batch is retried), anything else as the
/// coordinator answered.
fn not_joined(code: i16) -> i16 {
    match ResponseError::try_from_code(code) {
        Some(ResponseError::ProducerFenced) => ResponseError::InvalidProducerEpoch.code(),
        Some(
            ResponseError::ConcurrentTransactions
            | ResponseError::CoordinatorNotAvailable
            | ResponseError::NotCoordinator
            | ResponseError::CoordinatorLoadInProgress,
        ) => ResponseError::NotEnoughReplicas.code(),
        _ => code,
    }
}

/// Checks and appends one partition's batch.
fn append_partition(
    broker: &Broker,
    topic: &Topic,
    partition: Arc<Partition>,
    policy: ProducePolicy,
    index: i32,
    records: Bytes,
) -> Appended {
    let now = broker.clock.now_ms();
    let config = topic.append_config();
    let batch = prepare(
        now,
        &policy,
        config.max_message_bytes,
        (topic.name(), index),
        records,
    )?;
    let out = append_one(broker, &partition, &config, &batch)?;
    if !out.duplicate {
        let records = out.last_offset - out.base_offset + 1;
        topic
            .traffic()
            .produced(batch.len() as u64, records.max(0) as u64);
    }
    Ok((out, partition, policy))
}

/// Writes each partition's outcome into its response; returns the appends
/// to wait for (position, partition, end offset).
fn settle(
    broker: &Broker,
    responses: &mut [TopicProduceResponse],
    appended: Vec<((usize, usize), Appended)>,
    version: i16,
    wait_for_disk: bool,
) -> Vec<((usize, usize), Arc<Partition>, i64)> {
    let mut waits = Vec::new();
    for ((ti, pi), result) in appended {
        let resp = &mut responses[ti].partition_responses[pi];
        match result {
            Ok((out, partition, policy)) => {
                resp.base_offset = out.base_offset;
                resp.log_append_time_ms = out.log_append_time;
                resp.log_start_offset = out.log_start_offset;
                let flush = (policy.flush_messages.is_some() || policy.flush_ms.is_some())
                    && partition.flush_due(policy.flush_messages, policy.flush_ms);
                if wait_for_disk || (flush && !broker.settings.null_sink) {
                    waits.push(((ti, pi), partition, out.last_offset + 1));
                } else {
                    // Consumers see it once durable, whatever the acks.
                    partition.sync_soon();
                }
            }
            Err(refusal) => {
                resp.error_code = refusal.code;
                if version >= 8 {
                    resp.error_message = refusal.message.map(StrBytes::from_string);
                    resp.record_errors = refusal
                        .record_errors
                        .into_iter()
                        .map(|(index, message)| {
                            BatchIndexAndErrorMessage::default()
                                .with_batch_index(index)
                                .with_batch_index_error_message(Some(StrBytes::from_string(
                                    message,
                                )))
                        })
                        .collect();
                }
            }
        }
    }
    waits
}

/// Whether an acks=all write waits for durability: an fsync under
/// `--fsync always`, the write-ahead log in the store in cluster mode.
pub(super) fn acks_all_waits(broker: &Broker) -> bool {
    (broker.settings.fsync_acks || broker.cluster.is_some()) && !broker.settings.null_sink
}

/// How long an acks=all write may wait for durability. Kafka answers
/// REQUEST_TIMED_OUT when acks=all is not met in time; only the store's
/// write-ahead log can keep an acknowledgement waiting that long.
pub(super) fn durable_timeout(broker: &Broker, timeout_ms: i32) -> Option<std::time::Duration> {
    (broker.cluster.is_some()).then(|| std::time::Duration::from_millis(timeout_ms.max(0) as u64))
}

/// Waits until each (partition, end) is durable; returns, in order, 0 or
/// the error code to answer that partition with.
pub(super) async fn wait_durable<'a>(
    waits: impl Iterator<Item = (&'a Partition, i64)>,
    timeout: Option<std::time::Duration>,
) -> Vec<i16> {
    // The partitions' fsyncs run side by side, not one after another.
    let waits: Vec<_> = waits.map(|(p, end)| p.wait_durable(end)).collect();
    let n = waits.len();
    let all = futures::future::join_all(waits);
    let outcomes = match timeout {
        None => Some(all.await),
        Some(t) => tokio::time::timeout(t, all).await.ok(),
    };
    (0..n)
        .map(|i| match outcomes.as_ref().map(|o| &o[i]) {
            Some(Ok(())) => 0,
            Some(Err(e)) => {
                tracing::error!(error = %e, "making the batch durable failed; failing acks=all write");
                log_error_code(e)
            }
            None => ResponseError::RequestTimedOut.code(),
        })
        .collect()
}

/// Checks the one batch of a partition's data (`place`: topic and
/// partition) and applies the topic's policy: returns the batch to append,
/// recompressed if the topic asks for another codec.
fn prepare(
    now: i64,
    policy: &ProducePolicy,
    max_message_bytes: usize,
    place: (&str, i32),
    records: Bytes,
) -> Result<Bytes, Refusal> {
    // Produce v3+ carries exactly one record batch per partition.
    let header = BatchHeader::parse(&records)
        .map_err(LogError::from)?
        .ok_or_else(|| LogError::Corrupt("no complete record batch".into()))?;
    if header.size > records.len() {
        return Err(LogError::Corrupt(format!(
            "record batch claims {} bytes but only {} were sent",
            header.size,
            records.len()
        ))
        .into());
    }
    if header.size < records.len() {
        return Err(LogError::InvalidRecord(
            "produce requests with version 3 or above must contain exactly one record batch per partition".into(),
        )
        .into());
    }
    let codec = header.attributes & CODEC_MASK;
    let recompress = policy.compression.filter(|(target, _)| *target != codec);
    // Record timestamps must lie in [now - before, now + after]. The batch
    // header's max timestamp rules out the future side without decoding;
    // the past side needs the records unless it is unbounded (the default).
    let check_times = policy.timestamp_window_ms.and_then(|(before, after)| {
        let (earliest, latest) = (now.saturating_sub(before), now.saturating_add(after));
        (before < i64::MAX || header.max_timestamp > latest).then_some((earliest, latest))
    });
    if !policy.compact && check_times.is_none() && recompress.is_none() {
        return Ok(records);
    }
    // As in Kafka, a batch too large as sent is refused before it is
    // decoded (the log checks again after any recompression).
    if records.len() > max_message_bytes {
        return Err(LogError::MessageTooLarge {
            size: records.len(),
            max: max_message_bytes,
        }
        .into());
    }
    let header = validate_produced(&records).map_err(LogError::from)?;
    let area = records::decompress(codec, &records[HEADER_LEN..]).map_err(LogError::from)?;
    let mut errors: Vec<(i32, String)> = Vec::new();
    let mut bad_time = false;
    let mut index = 0;
    records::walk(&area, header.record_count, |r| {
        let timestamp = header.base_timestamp.wrapping_add(r.timestamp_delta);
        if policy.compact && r.key.is_none() {
            errors.push((
                index,
                format!(
                    "Compacted topic cannot accept message without key in topic partition {}-{}.",
                    place.0, place.1
                ),
            ));
        } else if let Some((earliest, latest)) = check_times {
            // -1 is "no timestamp" (NO_TIMESTAMP), which Kafka lets through.
            if timestamp != -1 && (timestamp < earliest || timestamp > latest) {
                bad_time = true;
                errors.push((
                    index,
                    format!(
                        "Timestamp {timestamp} of message with offset {index} is out of range. \
                         The timestamp should be within [{earliest}, {latest}]"
                    ),
                ));
            }
        }
        index += 1;
    })
    .map_err(LogError::Corrupt)?;
    if bad_time {
        return Err(Refusal {
            code: ResponseError::InvalidTimestamp.code(),
            message: Some("One or more records have been rejected due to invalid timestamp".into()),
            record_errors: errors,
        });
    }
    if !errors.is_empty() {
        let first: Vec<String> = errors
            .iter()
            .take(3)
            .map(|(i, m)| format!("RecordError(batchIndex={i}, message='{m}')"))
            .collect();
        return Err(Refusal {
            code: ResponseError::InvalidRecord.code(),
            message: Some(format!(
                "One or more records have been rejected due to {} record errors in total, and only showing the first three errors at most: [{}]",
                errors.len(),
                first.join(", ")
            )),
            record_errors: errors,
        });
    }
    match recompress {
        Some((codec, level)) => Ok(records::recompress(&records, &area, codec, level)
            .map_err(LogError::from)?
            .into()),
        None => Ok(records),
    }
}

fn append_one(
    broker: &Broker,
    partition: &Partition,
    config: &crate::log::AppendConfig,
    batch: &[u8],
) -> Result<crate::log::AppendOutcome, LogError> {
    if broker.settings.null_sink {
        let header = BatchHeader::parse(batch)?
            .ok_or_else(|| LogError::Corrupt("no complete record batch".into()))?;
        return Ok(crate::log::AppendOutcome {
            base_offset: 0,
            last_offset: header.last_offset_delta as i64,
            log_append_time: -1,
            log_start_offset: 0,
            duplicate: false,
        });
    }
    partition.append(batch, config)
}
