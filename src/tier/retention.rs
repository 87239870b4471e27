//! Retention on the tiered log: `retention.ms`, `retention.bytes` and
//! DeleteRecords move the log start offset, first locally (no reader is
//! served below it from then on), then in the manifest; only once no durable
//! manifest names a dropped segment are its objects deleted.

use std::sync::Arc;

use super::partitions::{Backoffs, TieredPartitions};
use super::remote::TieredPartition;
use super::TierError;
use crate::catalog::Topic;
use crate::log::Partition;
use crate::manifest::{objects, TieredSegment};

pub(super) struct Retention {
    partitions: Arc<TieredPartitions>,
    backoffs: Backoffs,
}

impl Retention {
    pub(super) fn new(partitions: Arc<TieredPartitions>) -> Retention {
        Retention {
            backoffs: Backoffs::new(partitions.clock.clone()),
            partitions,
        }
    }

    pub(super) async fn pass(&self) {
        for (topic, index, partition) in self.partitions.tended() {
            let key = (topic.id(), index);
            let Some(remote) = self.partitions.remote(topic.id(), index) else {
                continue;
            };
            if !self.backoffs.ready(key) {
                continue;
            }
            let result = self.expire(&topic, &partition, &remote).await;
            self.backoffs.record(key, &result);
            if let Err(e) = result {
                tracing::warn!(topic = topic.name(), partition = index, error = %e, "retention failed; will retry");
            }
        }
    }

    /// Applies retention.ms / retention.bytes and DeleteRecords to the
    /// manifest, then deletes the objects of dropped segments.
    async fn expire(
        &self,
        topic: &Topic,
        partition: &Arc<Partition>,
        remote: &TieredPartition,
    ) -> Result<(), TierError> {
        let m = remote.manifest();
        let cfg = topic.settings();
        let mut start = partition.log_start_offset();
        if cfg.cleanup.delete {
            let live: Vec<&TieredSegment> = m
                .segments
                .iter()
                .filter(|s| s.next_offset > start)
                .collect();
            if let Some(retention_ms) = cfg.retention_ms {
                let cutoff = self.partitions.clock.now_ms().saturating_sub(retention_ms);
                for s in &live {
                    if s.max_timestamp >= cutoff {
                        break;
                    }
                    start = start.max(s.next_offset);
                }
            }
            if let Some(retention_bytes) = cfg.retention_bytes {
                let tiered_end = m.end_offset().unwrap_or(i64::MIN);
                let local: u64 = partition
                    .local_segment_sizes()
                    .iter()
                    .filter(|(base, _)| *base >= tiered_end)
                    .map(|(_, size)| size)
                    .sum();
                let mut total: u64 = local
                    + live
                        .iter()
                        .filter(|s| s.next_offset > start)
                        .map(|s| s.size)
                        .sum::<u64>();
                let candidates: Vec<&TieredSegment> = live
                    .iter()
                    .copied()
                    .filter(|s| s.next_offset > start)
                    .collect();
                for s in candidates {
                    if total.saturating_sub(s.size) < retention_bytes as u64 {
                        break;
                    }
                    total -= s.size;
                    start = s.next_offset;
                }
            }
            if start > partition.log_start_offset() {
                // Local first: from here on no reader is served below `start`.
                partition.delete_records(start)?;
            }
        }
        let start = partition.log_start_offset();
        if start <= m.log_start_offset {
            return Ok(());
        }
        let dropped: Vec<TieredSegment> = m
            .segments
            .iter()
            .filter(|s| s.next_offset <= start)
            .cloned()
            .collect();
        self.partitions
            .commit(remote, partition.leader_epoch(), |m| {
                m.log_start_offset = m.log_start_offset.max(start);
                m.segments.retain(|s| s.next_offset > start);
            })
            .await?;
        // Only now that no durable manifest names them may the objects go.
        for s in dropped {
            objects::delete_segment(self.partitions.store(), &s.key).await?;
            self.partitions.cache().forget(&s.key, s.size).await;
        }
        Ok(())
    }
}
