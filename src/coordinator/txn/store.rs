//! `__transaction_state`: the coordinator's only store. Every state change
//! of a transactional id is one keyed record appended here and made durable
//! before the change is acknowledged; startup (and a takeover in cluster
//! mode) replays the topic. It is compacted by key and tiered like
//! `__consumer_offsets`, so the newest record per id is what replay keeps.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::records::Compression;

use crate::catalog::{Catalog, CatalogError, TopicSpec};
use crate::clock::SharedClock;
use crate::format::batch::{encode_batch, BatchHeader};
use crate::log::{AppendConfig, LogError, Partition};

pub(crate) const TXN_TOPIC: &str = "__transaction_state";

pub(crate) struct TxnStore {
    partition: Arc<Partition>,
    append_config: AppendConfig,
    wait_for_fsync: bool,
    clock: SharedClock,
}

impl TxnStore {
    /// One compacted partition: its leader is every transaction's coordinator.
    pub(crate) fn topic_spec(segment_bytes: i32) -> TopicSpec {
        TopicSpec {
            name: TXN_TOPIC,
            partitions: 1,
            config: vec![
                ("cleanup.policy", "compact".into()),
                ("segment.bytes", segment_bytes.to_string()),
            ],
        }
    }

    /// Opens the topic, creating it on first start; before the tier opens,
    /// so that it is tiered like every other partition.
    pub(crate) fn open(
        catalog: &Catalog,
        segment_bytes: i32,
        wait_for_fsync: bool,
        clock: SharedClock,
    ) -> Result<TxnStore, CatalogError> {
        let topic = TxnStore::topic_spec(segment_bytes).ensure(catalog)?;
        let partition = topic.partition(0).ok_or(CatalogError::UnknownTopic)?;
        let append_config = AppendConfig {
            max_message_bytes: usize::MAX,
            ..topic.append_config()
        };
        Ok(TxnStore {
            partition,
            append_config,
            wait_for_fsync,
            clock,
        })
    }

    /// Appends one record; returns the end offset to wait for.
    pub(crate) fn append(&self, key: Bytes, value: Option<Bytes>) -> Result<i64, LogError> {
        let buf = encode_batch(
            vec![(Some(key), value, self.clock.now_ms())],
            None,
            Compression::None,
        )?;
        let end = self
            .partition
            .append(&buf, &self.append_config)?
            .last_offset
            + 1;
        // Readers of the topic see it once durable, waited for or not.
        self.partition.sync_soon();
        Ok(end)
    }

    pub(crate) async fn durable(&self, end: i64) -> Result<(), LogError> {
        if self.wait_for_fsync {
            self.partition.wait_durable(end).await?;
        }
        Ok(())
    }

    /// Every record from the start of the log, in order, through the tier.
    pub(crate) async fn replay(
        &self,
        mut f: impl FnMut(Bytes, Option<Bytes>),
    ) -> Result<(), LogError> {
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
            if next == offset {
                return Ok(());
            }
            let mut data = slice.records;
            let sets = crate::format::records::decode_batches(&mut data)
                .map_err(|e| LogError::Corrupt(e.to_string()))?;
            offset = next;
            for record in sets.into_iter().flat_map(|s| s.records) {
                if record.control {
                    continue;
                }
                if let Some(key) = record.key {
                    f(key, record.value);
                }
            }
        }
    }
}
