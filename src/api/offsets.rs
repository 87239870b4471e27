//! ListOffsets (earliest, earliest local, latest, latest tiered, earliest
//! pending upload, max timestamp, by timestamp), OffsetForLeaderEpoch and
//! DeleteRecords.
//!
//! The special timestamps are Kafka's; -5 (KIP-1005) is taken from v9 and
//! -6 (KIP-1023) from v11, the versions that define them. -6 is the first
//! offset not yet in the object store (KIP-1023: where a new replica may
//! start fetching, everything below being in remote storage). A partition always has a tiered
//! part here, so -6 is answered as Kafka answers it for a topic with remote
//! storage: one past the last tiered offset (never below the log start);
//! the log start while nothing is tiered and nothing was released locally
//! either; otherwise, and for a partition without a tiered part, -1.

use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_response::{
    DeleteRecordsPartitionResult, DeleteRecordsTopicResult,
};
use kafka_protocol::messages::list_offsets_response::{
    ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::{
    EpochEndOffset, OffsetForLeaderTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::messages::{
    DeleteRecordsRequest, DeleteRecordsResponse, ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
};

use super::authorize::{split, TOPIC_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::error::log_error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::log::{LogError, Partition};

pub(super) const LIST_OFFSETS: Api = api!(ListOffsetsRequest, 1..=11, later(handle_list_offsets));
pub(super) const DELETE_RECORDS: Api =
    api!(DeleteRecordsRequest, 0..=2, ready(handle_delete_records));
pub(super) const OFFSET_FOR_LEADER_EPOCH: Api = api!(
    OffsetForLeaderEpochRequest,
    2..=4,
    ready(handle_offset_for_leader_epoch)
);

error_codes! {
    ListOffsetsResponse => |r, f| for t in &r.topics {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
    DeleteRecordsResponse => |r, f| for t in &r.topics {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
    OffsetForLeaderEpochResponse => |r, f| for t in &r.topics {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
}

fn handle_list_offsets(
    b: &Arc<Broker>,
    r: ListOffsetsRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = ListOffsetsResponse> + Send + 'static {
    let (r, denied) = authorize_list_offsets(b, cx, r);
    let pending = list_offsets(b.clone(), r, cx.version);
    async move {
        let mut resp = pending.await;
        resp.topics.extend(denied);
        resp
    }
}

fn handle_delete_records(
    b: &Arc<Broker>,
    r: DeleteRecordsRequest,
    cx: &Ctx<'_>,
) -> DeleteRecordsResponse {
    let (r, denied) = authorize_delete_records(b, cx, r);
    let mut resp = delete_records(b, r);
    resp.topics.extend(denied);
    resp
}

fn handle_offset_for_leader_epoch(
    b: &Arc<Broker>,
    r: OffsetForLeaderEpochRequest,
    cx: &Ctx<'_>,
) -> OffsetForLeaderEpochResponse {
    let (r, denied) = authorize_offset_for_leader_epoch(b, cx, r);
    let mut resp = offset_for_leader_epoch(b, r);
    resp.topics.extend(denied);
    resp
}

fn authorize_list_offsets(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: ListOffsetsRequest,
) -> (
    ListOffsetsRequest,
    Vec<list_offsets_response::ListOffsetsTopicResponse>,
) {
    use list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Describe, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED)
                                .with_offset(-1)
                                .with_timestamp(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

fn authorize_delete_records(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DeleteRecordsRequest,
) -> (
    DeleteRecordsRequest,
    Vec<delete_records_response::DeleteRecordsTopicResult>,
) {
    use delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Delete, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            DeleteRecordsPartitionResult::default()
                                .with_partition_index(p.partition_index)
                                .with_low_watermark(-1)
                                .with_error_code(TOPIC_DENIED)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

fn authorize_offset_for_leader_epoch(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: OffsetForLeaderEpochRequest,
) -> (
    OffsetForLeaderEpochRequest,
    Vec<offset_for_leader_epoch_response::OffsetForLeaderTopicResult>,
) {
    use offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Describe, &t.topic)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            EpochEndOffset::default()
                                .with_partition(p.partition)
                                .with_error_code(TOPIC_DENIED)
                                .with_leader_epoch(-1)
                                .with_end_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

const LATEST: i64 = -1;
const EARLIEST: i64 = -2;
const MAX_TIMESTAMP: i64 = -3;
const EARLIEST_LOCAL: i64 = -4;
const LATEST_TIERED: i64 = -5;
const EARLIEST_PENDING_UPLOAD: i64 = -6;

/// The lowest special timestamp a ListOffsets version defines.
fn lowest_spec(version: i16) -> i64 {
    match version {
        ..=8 => EARLIEST_LOCAL,
        9 | 10 => LATEST_TIERED,
        _ => EARLIEST_PENDING_UPLOAD,
    }
}

/// Async because timestamp lookups may read tiered segments from the store.
pub(super) async fn list_offsets(
    broker: Arc<Broker>,
    req: ListOffsetsRequest,
    version: i16,
) -> ListOffsetsResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let topic = broker.catalog.topic(t.name.0.as_str());
        let mut partitions = Vec::with_capacity(t.partitions.len());
        for p in t.partitions {
            let resp =
                ListOffsetsPartitionResponse::default().with_partition_index(p.partition_index);
            let served = match &topic {
                Some(t) => broker.served_partition(t, p.partition_index, p.current_leader_epoch),
                None => Err(ResponseError::UnknownTopicOrPartition.code()),
            };
            let partition = match served {
                Ok(partition) => partition,
                Err(code) => {
                    partitions.push(resp.with_error_code(code));
                    continue;
                }
            };
            if p.timestamp < lowest_spec(version) {
                // Specs below those the version defines are not defined.
                partitions.push(resp.with_error_code(ResponseError::InvalidRequest.code()));
                continue;
            }
            let read_committed = req.isolation_level == 1;
            partitions.push(
                match lookup(&partition, p.timestamp, read_committed).await {
                    Ok(Some((offset, timestamp))) => resp
                        .with_offset(offset)
                        .with_timestamp(timestamp)
                        // The field exists from v4 on; encoding it earlier fails.
                        .with_leader_epoch(if version >= 4 {
                            partition.leader_epoch()
                        } else {
                            -1
                        }),
                    Ok(None) => resp.with_offset(-1).with_timestamp(-1),
                    Err(e) => resp.with_error_code(log_error_code(&e)),
                },
            );
        }
        topics.push(
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(partitions),
        );
    }
    ListOffsetsResponse::default().with_topics(topics)
}

/// `read_committed` readers see only offsets below the last stable
/// offset, as in Kafka: LATEST is the LSO, and a lookup by timestamp finds
/// nothing at or past it.
async fn lookup(
    partition: &Partition,
    spec: i64,
    read_committed: bool,
) -> Result<Option<(i64, i64)>, LogError> {
    let found = match spec {
        LATEST if read_committed => return Ok(Some((partition.last_stable_offset(), -1))),
        MAX_TIMESTAMP => partition.find_max_timestamp().await?,
        ts if ts >= 0 => partition.find_offset_for_timestamp(ts).await?,
        _ => return fixed(partition, spec),
    };
    let fetchable = if read_committed {
        partition.last_stable_offset()
    } else {
        partition.high_watermark()
    };
    Ok(found.filter(|(offset, _)| *offset < fetchable))
}

fn fixed(partition: &Partition, spec: i64) -> Result<Option<(i64, i64)>, LogError> {
    match spec {
        LATEST => Ok(Some((partition.high_watermark(), -1))),
        // The log start offset already counts tiered segments and DeleteRecords.
        EARLIEST => Ok(Some((partition.log_start_offset(), -1))),
        EARLIEST_LOCAL => Ok(Some((partition.local_start_offset(), -1))),
        // The last offset in the object store, -1 while nothing is there (as Kafka).
        LATEST_TIERED => Ok(Some((
            partition.tiered_end_offset().map_or(-1, |end| end - 1),
            -1,
        ))),
        EARLIEST_PENDING_UPLOAD => Ok(earliest_pending_upload(partition).map(|o| (o, -1))),
        other => Err(LogError::InvalidRecord(format!(
            "unknown offset spec {other}"
        ))),
    }
}

/// Kafka's `UnifiedLog.fetchEarliestPendingUploadOffset` (see the module
/// doc); `None` is its -1 answer.
fn earliest_pending_upload(partition: &Partition) -> Option<i64> {
    if !partition.is_tiered() {
        return None;
    }
    let log_start = partition.log_start_offset();
    match partition.tiered_end_offset() {
        Some(end) => Some(end.max(log_start)),
        None => (partition.local_start_offset() == log_start).then_some(log_start),
    }
}

/// Where each asked-for leader epoch ended (the Java consumer validates its
/// position with this after a leader change or when it resumes from a
/// committed offset). The client's `current_leader_epoch` is checked as
/// Fetch checks it. Followers (`replica_id` >= 0) get the same answer; there
/// are none in Strata.
pub(super) fn offset_for_leader_epoch(
    broker: &Broker,
    req: OffsetForLeaderEpochRequest,
) -> OffsetForLeaderEpochResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.catalog.topic(t.topic.0.as_str());
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let resp = EpochEndOffset::default().with_partition(p.partition);
                    let served = match &topic {
                        Some(t) => broker.served_partition(t, p.partition, p.current_leader_epoch),
                        None => Err(ResponseError::UnknownTopicOrPartition.code()),
                    };
                    match served {
                        Err(code) => resp.with_error_code(code),
                        Ok(partition) => {
                            let (epoch, end) = partition.end_offset_for_epoch(p.leader_epoch);
                            resp.with_leader_epoch(epoch).with_end_offset(end)
                        }
                    }
                })
                .collect();
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(partitions)
        })
        .collect();
    OffsetForLeaderEpochResponse::default().with_topics(topics)
}

pub(super) fn delete_records(broker: &Broker, req: DeleteRecordsRequest) -> DeleteRecordsResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let topic = broker.catalog.topic(t.name.0.as_str());
            let partitions = t
                .partitions
                .into_iter()
                .map(|p| {
                    let resp = DeleteRecordsPartitionResult::default()
                        .with_partition_index(p.partition_index);
                    let served = match &topic {
                        Some(t) => broker.served_partition(t, p.partition_index, -1),
                        None => Err(ResponseError::UnknownTopicOrPartition.code()),
                    };
                    match served {
                        Err(code) => resp.with_low_watermark(-1).with_error_code(code),
                        Ok(partition) => match partition.delete_records(p.offset) {
                            Ok(low) => resp.with_low_watermark(low),
                            Err(e) => resp
                                .with_low_watermark(-1)
                                .with_error_code(log_error_code(&e)),
                        },
                    }
                })
                .collect();
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(partitions)
        })
        .collect();
    DeleteRecordsResponse::default().with_topics(topics)
}
