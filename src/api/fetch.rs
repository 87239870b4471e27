//! Fetch: serve stored batches as they are, long-polling until `min_bytes`
//! arrive or `max_wait_ms` passes.
//!
//! Fetch sessions (KIP-227) are not kept: every response carries session id 0,
//! which tells clients to send full fetch requests.

use std::sync::Arc;
use std::time::Duration;

use futures::future::select_all;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
use kafka_protocol::messages::{FetchRequest, FetchResponse, TopicName};
use tokio::sync::watch;
use uuid::Uuid;

use super::error::log_error_code;
use super::Broker;
use crate::catalog::Topic;
use crate::log::Partition;

/// The partitions of a request, resolved once.
struct Wanted {
    topic_name: TopicName,
    topic_id: Uuid,
    partitions: Vec<WantedPartition>,
}

struct WantedPartition {
    index: i32,
    offset: i64,
    max_bytes: i32,
    /// The partition, or the error code to answer with.
    partition: Result<Arc<Partition>, i16>,
}

pub async fn fetch(broker: Arc<Broker>, req: FetchRequest, version: i16) -> FetchResponse {
    if req.session_id != 0 {
        return FetchResponse::default()
            .with_error_code(ResponseError::FetchSessionIdNotFound.code());
    }
    let wanted: Vec<Wanted> = req
        .topics
        .into_iter()
        .map(|ft| {
            let topic: Result<Arc<Topic>, i16> = if version >= 13 {
                broker
                    .catalog
                    .topic_by_id(ft.topic_id)
                    .ok_or(ResponseError::UnknownTopicId.code())
            } else {
                broker
                    .catalog
                    .topic(ft.topic.0.as_str())
                    .ok_or(ResponseError::UnknownTopicOrPartition.code())
            };
            let partitions = ft
                .partitions
                .into_iter()
                .map(|fp| {
                    let p = match &topic {
                        Ok(t) => broker.served_partition(t, fp.partition, fp.current_leader_epoch),
                        Err(code) => Err(*code),
                    };
                    WantedPartition {
                        index: fp.partition,
                        offset: fp.fetch_offset,
                        max_bytes: fp.partition_max_bytes,
                        partition: p,
                    }
                })
                .collect();
            Wanted {
                topic_name: ft.topic,
                topic_id: ft.topic_id,
                partitions,
            }
        })
        .collect();

    let deadline = broker.clock.now() + Duration::from_millis(req.max_wait_ms.max(0) as u64);
    let min_bytes = req.min_bytes.max(0) as usize;
    let max_bytes = if req.max_bytes <= 0 {
        i32::MAX as usize
    } else {
        req.max_bytes as usize
    };
    loop {
        // Subscribe before reading so an append between the read and the wait is not missed.
        let mut watches: Vec<watch::Receiver<i64>> = wanted
            .iter()
            .flat_map(|w| {
                w.partitions
                    .iter()
                    .filter_map(|wp| wp.partition.as_ref().ok().map(|p| p.subscribe()))
            })
            .collect();
        let (topics, bytes, errors) = read_all(&wanted, max_bytes, version).await;
        let now = broker.clock.now();
        if bytes >= min_bytes || errors || watches.is_empty() || now >= deadline {
            return FetchResponse::default().with_responses(topics);
        }
        let changed = select_all(watches.iter_mut().map(|w| Box::pin(w.changed())));
        if tokio::time::timeout(deadline - now, changed).await.is_err() {
            let (topics, _, _) = read_all(&wanted, max_bytes, version).await;
            return FetchResponse::default().with_responses(topics);
        }
    }
}

/// One pass over every requested partition. Returns the topics, the bytes of
/// records gathered and whether any partition failed. Async because offsets
/// below the local segments are read from the object store.
async fn read_all(
    wanted: &[Wanted],
    max_bytes: usize,
    version: i16,
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
                    let budget =
                        (wp.max_bytes.max(0) as usize).min(max_bytes.saturating_sub(total));
                    // KIP-74: the first batch of the response is returned whole, whatever its size.
                    p.fetch(wp.offset, budget, total == 0)
                        .await
                        .map_err(|e| log_error_code(&e))
                }
            };
            partitions.push(match result {
                Ok(slice) => {
                    total += slice.records.len();
                    base.with_high_watermark(slice.high_watermark)
                        .with_last_stable_offset(slice.high_watermark)
                        .with_log_start_offset(slice.log_start_offset)
                        .with_aborted_transactions(Some(Vec::new()))
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
        topics.push(if version >= 13 {
            resp.with_topic_id(w.topic_id)
        } else {
            resp.with_topic(w.topic_name.clone())
        });
    }
    (topics, total, any_error)
}
