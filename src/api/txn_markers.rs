//! WriteTxnMarkers: the transaction coordinator ends a transaction in each
//! of its partitions by appending a COMMIT or ABORT marker there.
//!
//! A marker is what makes a transaction's records visible to read_committed
//! consumers, or skipped by them, so it is durable before it is answered,
//! exactly like an acks=all produce: fsynced under `--fsync always`, in the
//! write-ahead log in cluster mode. The coordinator sends this request to
//! each partition's leader (itself included) and retries a partition until
//! it succeeds, so every error here is one Kafka answers and the coordinator
//! understands: NOT_LEADER_OR_FOLLOWER, UNKNOWN_TOPIC_OR_PARTITION,
//! INVALID_PRODUCER_EPOCH for a producer epoch older than the partition's,
//! TRANSACTION_COORDINATOR_FENCED for a coordinator epoch older than the
//! last marker's. A transactions v2 marker (v2, `transaction_version` 2)
//! carries the epoch the coordinator bumped to, one above the data's, and
//! is refused at an epoch the partition already knows.

use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::write_txn_markers_response::{
    WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::messages::{WriteTxnMarkersRequest, WriteTxnMarkersResponse};

use super::authorize::{refusal_or, CLUSTER_DENIED};
use super::dispatch::{api, Api, Ctx};
use super::error::log_error_code;
use super::metrics::error_codes;
use super::produce::{acks_all_waits, durable_timeout, wait_durable};
use super::Broker;
use crate::access::acl::Operation;
use crate::coordinator::store::OFFSETS_TOPIC;
use crate::format::control::EndTxnMarker;
use crate::log::Partition;

pub(super) const WRITE_TXN_MARKERS: Api = api!(
    WriteTxnMarkersRequest,
    1..=2,
    later(handle_write_txn_markers)
);

error_codes! {
    WriteTxnMarkersResponse => |r, f| for t in r.markers.iter().flat_map(|m| &m.topics) {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
}

fn handle_write_txn_markers(
    b: &Arc<Broker>,
    r: WriteTxnMarkersRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = WriteTxnMarkersResponse> + Send + 'static {
    refusal_or(authorize_write_txn_markers(b, cx, &r), || {
        write_txn_markers(b.clone(), r)
    })
}

/// WriteTxnMarkers (sent by transaction coordinators): CLUSTER_ACTION on the
/// cluster, else every partition is refused.
fn authorize_write_txn_markers(
    b: &Broker,
    cx: &Ctx<'_>,
    req: &WriteTxnMarkersRequest,
) -> Option<WriteTxnMarkersResponse> {
    use write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    if b.on_cluster(cx, Operation::ClusterAction) {
        return None;
    }
    let markers = req
        .markers
        .iter()
        .map(|m| {
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(
                    m.topics
                        .iter()
                        .map(|t| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(t.name.clone())
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|p| {
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(*p)
                                                .with_error_code(CLUSTER_DENIED)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
        })
        .collect();
    Some(WriteTxnMarkersResponse::default().with_markers(markers))
}

/// How long a marker may wait for the write-ahead log (Kafka writes markers
/// with `request.timeout.ms`, 30 s by default).
const MARKER_TIMEOUT_MS: i32 = 30_000;

pub(super) async fn write_txn_markers(
    broker: Arc<Broker>,
    req: WriteTxnMarkersRequest,
) -> WriteTxnMarkersResponse {
    let wait = acks_all_waits(&broker);
    // (marker, topic, partition) of each append to wait for.
    let mut waits: Vec<(usize, usize, usize, Arc<Partition>, i64)> = Vec::new();
    let mut markers = Vec::with_capacity(req.markers.len());
    let committed: Vec<(i64, bool)> = req
        .markers
        .iter()
        .map(|m| (m.producer_id.0, m.transaction_result))
        .collect();
    for (mi, m) in req.markers.into_iter().enumerate() {
        let marker = EndTxnMarker {
            commit: m.transaction_result,
            coordinator_epoch: m.coordinator_epoch,
        };
        let mut topics = Vec::with_capacity(m.topics.len());
        for (ti, t) in m.topics.into_iter().enumerate() {
            let topic = broker.catalog.topic(t.name.0.as_str());
            let mut partitions = Vec::with_capacity(t.partition_indexes.len());
            for (pi, index) in t.partition_indexes.into_iter().enumerate() {
                let target = match &topic {
                    None => Err(ResponseError::UnknownTopicOrPartition.code()),
                    Some(topic) => broker
                        .served_partition(topic, index, -1)
                        .map(|p| (p, topic.append_config())),
                };
                let appended = target.and_then(|(partition, cfg)| {
                    partition
                        .append_marker(
                            m.producer_id.0,
                            m.producer_epoch,
                            marker,
                            m.transaction_version >= 2,
                            &cfg,
                        )
                        .map(|out| (partition, out.last_offset + 1))
                        .map_err(|e| {
                            tracing::debug!(producer_id = m.producer_id.0, error = %e, "marker refused");
                            log_error_code(&e)
                        })
                });
                let code = match appended {
                    Ok((partition, end)) => {
                        if wait {
                            waits.push((mi, ti, pi, partition, end));
                        }
                        0
                    }
                    Err(code) => code,
                };
                partitions.push(
                    WritableTxnMarkerPartitionResult::default()
                        .with_partition_index(index)
                        .with_error_code(code),
                );
            }
            topics.push(
                WritableTxnMarkerTopicResult::default()
                    .with_name(t.name)
                    .with_partitions(partitions),
            );
        }
        markers.push(
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(topics),
        );
    }
    let codes = wait_durable(
        waits.iter().map(|(_, _, _, p, end)| (p.as_ref(), *end)),
        durable_timeout(&broker, MARKER_TIMEOUT_MS),
    )
    .await;
    for ((mi, ti, pi, _, _), code) in waits.iter().zip(codes) {
        if code != 0 {
            markers[*mi].topics[*ti].partitions[*pi].error_code = code;
        }
    }
    // A marker in `__consumer_offsets` makes the transaction's offsets
    // (TxnOffsetCommit) the group's, or drops them.
    for (m, result) in committed.iter().zip(&markers) {
        let written = result.topics.iter().any(|t| {
            t.name.0.as_str() == OFFSETS_TOPIC && t.partitions.iter().any(|p| p.error_code == 0)
        });
        if written {
            broker.coordinator.complete_transaction(m.0, m.1);
        }
    }
    WriteTxnMarkersResponse::default().with_markers(markers)
}
