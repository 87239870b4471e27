//! Produce: validate and append one batch per partition, in request order,
//! then wait for durability where acks=all asks for it.

use std::future::Future;
use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::produce_response::{PartitionProduceResponse, TopicProduceResponse};
use kafka_protocol::messages::{ProduceRequest, ProduceResponse};
use kafka_protocol::protocol::StrBytes;

use super::error::log_error_code;
use super::Broker;
use crate::config::FsyncPolicy;
use crate::format::batch::{validate_produced, BatchHeader, CODEC_MASK, HEADER_LEN};
use crate::format::records;
use crate::log::{LogError, Partition};

/// Appends now; the returned future resolves once the acknowledgement may be
/// sent (`None` for acks=0, which gets no response at all).
pub fn produce(
    broker: &Arc<Broker>,
    req: ProduceRequest,
    version: i16,
) -> impl Future<Output = Option<ProduceResponse>> + Send + 'static {
    let acks = req.acks;
    // Kafka answers REQUEST_TIMED_OUT when acks=all is not met in time; only
    // the store's write-ahead log can keep an acknowledgement waiting that long.
    let timeout = (broker.cluster.is_some())
        .then(|| std::time::Duration::from_millis(req.timeout_ms.max(0) as u64));
    // In cluster mode acks=all waits for the write-ahead log in the store.
    let wait_for_disk =
        acks == -1 && (broker.fsync == FsyncPolicy::Always || broker.cluster.is_some());
    let mut durable_waits: Vec<(usize, usize, Arc<Partition>, i64)> = Vec::new();
    let mut responses = Vec::with_capacity(req.topic_data.len());
    for (ti, topic_data) in req.topic_data.into_iter().enumerate() {
        let topic = broker.catalog.topic(topic_data.name.0.as_str());
        let mut partitions = Vec::with_capacity(topic_data.partition_data.len());
        for (pi, pd) in topic_data.partition_data.into_iter().enumerate() {
            let mut resp = PartitionProduceResponse::default()
                .with_index(pd.index)
                .with_base_offset(-1);
            let target = topic
                .as_ref()
                .map(|t| broker.served_partition(t, pd.index, -1).map(|p| (t, p)));
            let result = if ![-1, 0, 1].contains(&acks) {
                Err((ResponseError::InvalidRequiredAcks.code(), None))
            } else if topic.as_ref().is_some_and(|t| t.is_internal()) {
                // Only the broker writes its internal topics.
                Err((ResponseError::InvalidTopicException.code(), None))
            } else if let Some(Ok((topic, partition))) = target {
                append_one(broker, &partition, &topic.append_config(), pd.records)
                    .map(|out| (out, partition))
                    .map_err(|e| (log_error_code(&e), Some(e.to_string())))
            } else if let Some(Err(code)) = target {
                Err((code, None))
            } else {
                Err((ResponseError::UnknownTopicOrPartition.code(), None))
            };
            match result {
                Ok((out, partition)) => {
                    resp = resp
                        .with_base_offset(out.base_offset)
                        .with_log_append_time_ms(out.log_append_time)
                        .with_log_start_offset(out.log_start_offset);
                    if wait_for_disk && !broker.null_sink {
                        durable_waits.push((ti, pi, partition, out.last_offset + 1));
                    }
                }
                Err((code, message)) => {
                    resp = resp.with_error_code(code);
                    if version >= 8 {
                        resp = resp.with_error_message(message.map(StrBytes::from_string));
                    }
                }
            }
            partitions.push(resp);
        }
        responses.push(
            TopicProduceResponse::default()
                .with_name(topic_data.name)
                .with_partition_responses(partitions),
        );
    }
    async move {
        // The partitions' fsyncs run side by side, not one after another.
        let waits = durable_waits
            .iter()
            .map(|(_, _, partition, end)| partition.wait_durable(*end));
        let all = futures::future::join_all(waits);
        let outcomes = match timeout {
            None => Some(all.await),
            Some(t) => tokio::time::timeout(t, all).await.ok(),
        };
        for (i, (ti, pi, _, _)) in durable_waits.iter().enumerate() {
            let code = match outcomes.as_ref().map(|o| &o[i]) {
                Some(Ok(())) => continue,
                Some(Err(e)) => {
                    tracing::error!(error = %e, "making the batch durable failed; failing acks=all produce");
                    log_error_code(e)
                }
                None => ResponseError::RequestTimedOut.code(),
            };
            let r = &mut responses[*ti].partition_responses[*pi];
            r.error_code = code;
            r.base_offset = -1;
        }
        (acks != 0).then(|| ProduceResponse::default().with_responses(responses))
    }
}

fn append_one(
    broker: &Broker,
    partition: &Partition,
    config: &crate::log::AppendConfig,
    records: Option<Bytes>,
) -> Result<crate::log::AppendOutcome, LogError> {
    let records = records.unwrap_or_default();
    // Produce v3+ carries exactly one record batch per partition.
    let header = BatchHeader::parse(&records)?
        .ok_or_else(|| LogError::Corrupt("no complete record batch".into()))?;
    if header.size > records.len() {
        return Err(LogError::Corrupt(format!(
            "record batch claims {} bytes but only {} were sent",
            header.size,
            records.len()
        )));
    }
    if header.size < records.len() {
        return Err(LogError::InvalidRecord(
            "produce requests with version 3 or above must contain exactly one record batch per partition".into(),
        ));
    }
    if config.compact {
        require_keys(&records)?;
    }
    if broker.null_sink {
        return Ok(crate::log::AppendOutcome {
            base_offset: 0,
            last_offset: header.last_offset_delta as i64,
            log_append_time: -1,
            log_start_offset: 0,
            duplicate: false,
        });
    }
    partition.append(&records, config)
}

/// Kafka refuses records without a key on a compacted topic (INVALID_RECORD):
/// compaction could only drop them. This decodes the batch, so only
/// compacted topics pay for it.
fn require_keys(batch: &[u8]) -> Result<(), LogError> {
    let header = validate_produced(batch)?;
    if header.is_control() {
        return Ok(());
    }
    let area = records::decompress(header.attributes & CODEC_MASK, &batch[HEADER_LEN..])?;
    let mut keyless = false;
    records::walk(&area, header.record_count, |r| keyless |= r.key.is_none())
        .map_err(LogError::Corrupt)?;
    if keyless {
        return Err(LogError::InvalidRecord(
            "Compacted topic cannot accept message without key".into(),
        ));
    }
    Ok(())
}
