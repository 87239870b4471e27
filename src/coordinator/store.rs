//! The coordinator's state lives in the `__consumer_offsets` topic: every
//! change is a keyed record appended to it, and startup replays it. The
//! topic is compacted by key, so the newest record per key is all that
//! recovery needs; there is no second store. Like any topic it is tiered, so
//! replay reads through to the object store.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::records::RecordKey;
use super::CoordinatorConfig;
use crate::catalog::{Catalog, CatalogError, TopicSpec};
use crate::clock::SharedClock;
use crate::format::batch::{encode_batch, BatchHeader};
use crate::log::{AppendConfig, LogError, Partition};

pub(crate) const OFFSETS_TOPIC: &str = "__consumer_offsets";

/// One record of the offsets topic as replay meets it.
pub(crate) enum Replayed {
    /// Applies at once.
    Record(RecordKey, Option<Bytes>),
    /// Written by TxnOffsetCommit: applies at its producer's COMMIT marker.
    Transactional {
        producer_id: i64,
        producer_epoch: i16,
        sequence: i32,
        key: RecordKey,
        value: Option<Bytes>,
    },
    /// A transaction's COMMIT or ABORT marker.
    Marker { producer_id: i64, commit: bool },
}

pub(crate) struct OffsetsStore {
    partition: Arc<Partition>,
    append_config: AppendConfig,
    wait_for_fsync: bool,
    /// Stamps the records.
    clock: SharedClock,
}

impl OffsetsStore {
    /// `__consumer_offsets`: one compacted partition.
    pub(crate) fn topic_spec(config: &CoordinatorConfig) -> TopicSpec {
        TopicSpec {
            name: OFFSETS_TOPIC,
            partitions: 1,
            config: vec![
                ("cleanup.policy", "compact".into()),
                (
                    "segment.bytes",
                    config.offsets_topic_segment_bytes.to_string(),
                ),
            ],
        }
    }

    /// Opens the offsets topic, creating it on first start. Open it before
    /// the tier, so that the tier attaches it like every other partition.
    pub(crate) fn open(
        catalog: &Catalog,
        config: &CoordinatorConfig,
        clock: SharedClock,
    ) -> Result<OffsetsStore, CatalogError> {
        let topic = OffsetsStore::topic_spec(config).ensure(catalog)?;
        let partition = topic.partition(0).ok_or(CatalogError::UnknownTopic)?;
        let append_config = AppendConfig {
            max_message_bytes: usize::MAX,
            ..topic.append_config()
        };
        Ok(OffsetsStore {
            partition,
            append_config,
            wait_for_fsync: config.wait_for_fsync,
            clock,
        })
    }

    /// Appends records as one batch; returns the end offset to wait for.
    pub(crate) fn append(&self, records: &[(RecordKey, Option<Bytes>)]) -> Result<i64, LogError> {
        if records.is_empty() {
            return Ok(self.partition.end_offset());
        }
        let now = self.clock.now_ms();
        let records = records
            .iter()
            .map(|(key, value)| (Some(key.encode()), value.clone(), now))
            .collect();
        let buf = encode_batch(records, None, Compression::None)?;
        self.append_batch(&buf)
    }

    /// Appends offset records as one transactional batch of producer
    /// `(id, epoch)` starting at `sequence` (TxnOffsetCommit): they count only
    /// once the transaction's COMMIT marker follows them in this log.
    pub(crate) fn append_transactional(
        &self,
        records: &[(RecordKey, Option<Bytes>)],
        producer: (i64, i16, i32),
    ) -> Result<i64, LogError> {
        let now = self.clock.now_ms();
        let (producer_id, producer_epoch, sequence) = producer;
        let records: Vec<Record> = records
            .iter()
            .enumerate()
            .map(|(i, (key, value))| Record {
                transactional: true,
                control: false,
                delete_horizon: false,
                partition_leader_epoch: -1,
                producer_id,
                producer_epoch,
                timestamp_type: TimestampType::Creation,
                offset: i as i64,
                sequence: sequence.wrapping_add(i as i32),
                timestamp: now,
                key: Some(key.encode()),
                value: value.clone(),
                headers: Default::default(),
            })
            .collect();
        let mut buf = bytes::BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &records, &options)
            .map_err(|e| LogError::Corrupt(e.to_string()))?;
        self.append_batch(&buf)
    }

    /// Appends one encoded batch; returns its end offset.
    fn append_batch(&self, buf: &[u8]) -> Result<i64, LogError> {
        let end = self.partition.append(buf, &self.append_config)?.last_offset + 1;
        // Readers of the topic see it once durable, waited for or not.
        self.partition.sync_soon();
        Ok(end)
    }

    /// Waits until appends up to `end` are durable, when the fsync policy asks for it.
    pub(crate) async fn durable(&self, end: i64) -> Result<(), LogError> {
        if self.wait_for_fsync {
            self.partition.wait_durable(end).await?;
        }
        Ok(())
    }

    /// Calls `f` for every record from the start of the log, in order,
    /// reading tiered offsets from the object store.
    pub(crate) async fn replay(&self, mut f: impl FnMut(Replayed)) -> Result<(), LogError> {
        let mut offset = self.partition.log_start_offset();
        loop {
            let slice = self.partition.fetch_log(offset, 1 << 20, true).await?;
            if slice.records.is_empty() {
                return Ok(());
            }
            let mut next = offset;
            let mut pos = 0;
            while let Ok(Some(h)) = BatchHeader::parse(&slice.records[pos..]) {
                next = h.last_offset() + 1;
                pos += h.size;
            }
            let mut data = slice.records;
            let sets = crate::format::records::decode_batches(&mut data)
                .map_err(|e| LogError::Corrupt(e.to_string()))?;
            offset = next;
            for record in sets.into_iter().flat_map(|s| s.records) {
                let Some(key) = record.key else { continue };
                if record.control {
                    // Kafka's control record key: version, then 0 abort / 1 commit.
                    if key.len() >= 4 {
                        let kind = i16::from_be_bytes([key[2], key[3]]);
                        f(Replayed::Marker {
                            producer_id: record.producer_id,
                            commit: kind == 1,
                        });
                    }
                    continue;
                }
                match RecordKey::decode(&key) {
                    Ok(k) if record.transactional => f(Replayed::Transactional {
                        producer_id: record.producer_id,
                        producer_epoch: record.producer_epoch,
                        sequence: record.sequence,
                        key: k,
                        value: record.value,
                    }),
                    Ok(k) => f(Replayed::Record(k, record.value)),
                    Err(e) => {
                        tracing::warn!(error = %e, offset = record.offset, "skipping unreadable offsets record")
                    }
                }
            }
        }
    }
}
