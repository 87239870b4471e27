//! Uploading sealed segments: for every partition, roll a segment that
//! `segment.ms` made due, upload the sealed segments beyond the manifest and
//! publish them in the next manifest version, then delete the local files
//! the manifest now covers. It never holds a partition lock across I/O, so
//! produce is never blocked by the store; if uploads lag by more than
//! `--max-pending-upload-bytes`, produce is refused with a retriable error
//! instead of filling the disk. In cluster mode an active segment also rolls
//! once it is `--wal-max-age-ms` old: until it is sealed, the write-ahead log
//! objects holding its batches cannot be deleted, and a new leader would
//! have to read them all back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;

use super::partitions::{Backoffs, TieredPartitions};
use super::remote::TieredPartition;
use super::TierError;
use crate::catalog::Topic;
use crate::format::segment::SegmentMeta;
use crate::log::Partition;
use crate::manifest::{objects, segment_key, TieredSegment};

/// Partitions worked on at once.
const CONCURRENCY: usize = 4;
/// A partition's turn that makes no progress for this long is abandoned and retried.
const TURN_TIMEOUT: Duration = Duration::from_secs(120);

pub(super) struct Uploader {
    partitions: Arc<TieredPartitions>,
    backoffs: Backoffs,
    backpressure: Arc<AtomicBool>,
    max_pending: u64,
    /// Cluster mode: the oldest an active segment may get, in ms.
    head_max_age_ms: Option<i64>,
}

impl Uploader {
    pub(super) fn new(
        partitions: Arc<TieredPartitions>,
        max_pending: u64,
        max_head_age: Option<Duration>,
        backpressure: Arc<AtomicBool>,
    ) -> Uploader {
        Uploader {
            backoffs: Backoffs::new(partitions.clock.clone()),
            partitions,
            backpressure,
            max_pending,
            head_max_age_ms: max_head_age.map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        }
    }

    pub(super) fn backpressure_active(&self) -> bool {
        self.backpressure.load(Ordering::Relaxed)
    }

    /// One pass over every partition.
    pub(super) async fn pass(&self) {
        let work = self.partitions.tended();
        // Backpressure is judged before any store call, so a stalled store
        // cannot keep the flag from rising.
        let mut pending = 0u64;
        let mut pending_segments = 0u64;
        for (topic, index, partition) in &work {
            let mut cfg = topic.append_config();
            if let Some(max) = self.head_max_age_ms {
                cfg.segment_ms = cfg.segment_ms.min(max);
            }
            if let Err(e) = partition.roll_if_due(&cfg) {
                tracing::warn!(topic = topic.name(), partition = index, error = %e, "rolling an idle segment failed");
            }
            let end = self
                .partitions
                .remote(topic.id(), *index)
                .and_then(|r| r.manifest().end_offset())
                .unwrap_or(i64::MIN);
            for s in partition.sealed_segments() {
                if s.base_offset >= end {
                    pending += s.size;
                    pending_segments += 1;
                }
            }
        }
        let stats = &self.partitions.stats;
        stats.pending_upload_bytes.store(pending, Ordering::Relaxed);
        stats
            .pending_upload_segments
            .store(pending_segments, Ordering::Relaxed);
        let over = pending > self.max_pending;
        if self.backpressure.swap(over, Ordering::Relaxed) != over {
            if over {
                tracing::warn!(
                    pending,
                    limit = self.max_pending,
                    "uploads lag: refusing produce until they catch up"
                );
            } else {
                tracing::info!(pending, "uploads caught up: accepting produce again");
            }
        }
        futures::stream::iter(work)
            .for_each_concurrent(CONCURRENCY, |(topic, index, partition)| async move {
                let key = (topic.id(), index);
                if !self.backoffs.ready(key) {
                    return;
                }
                let result = tokio::time::timeout(
                    TURN_TIMEOUT,
                    self.upload_partition(&topic, index, &partition),
                )
                .await
                .unwrap_or_else(|_| {
                    Err(TierError::Corrupt(format!(
                        "no progress in {TURN_TIMEOUT:?}"
                    )))
                });
                self.backoffs.record(key, &result);
                if let Err(e) = result {
                    self.partitions
                        .stats
                        .upload_failures
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(
                        topic = topic.name(),
                        partition = index,
                        error = %e,
                        "tiering failed; will retry"
                    );
                }
            })
            .await;
    }

    /// Uploads the partition's sealed segments beyond the manifest, oldest
    /// first, then releases the local copies the manifest covers.
    async fn upload_partition(
        &self,
        topic: &Topic,
        index: i32,
        partition: &Arc<Partition>,
    ) -> Result<(), TierError> {
        let remote = self.partitions.attach(topic, index, partition).await?;
        let end = remote.manifest().end_offset().unwrap_or(i64::MIN);
        let start = partition.log_start_offset();
        let todo: Vec<SegmentMeta> = partition
            .sealed_segments()
            .into_iter()
            .filter(|s| s.base_offset >= end && s.size > 0 && s.next_offset > start)
            .collect();
        if !todo.is_empty() {
            let mut uploaded = Vec::with_capacity(todo.len());
            let compact = topic.settings().cleanup.compact;
            for meta in &todo {
                let mut tiered = TieredSegment::from_meta(
                    segment_key(&remote.prefix, meta.base_offset, meta.level),
                    meta,
                );
                if compact {
                    // Merges read the key index from the store; building it
                    // here (if the build after sealing has not finished)
                    // saves every merge from rebuilding it from the log. Its
                    // key count and sketch go into the manifest for the
                    // policy's dirty-ratio estimate (every offset of a
                    // segment written by appends is a record).
                    let p = partition.clone();
                    let (base, records) = (
                        meta.base_offset,
                        (meta.next_offset - meta.base_offset) as u64,
                    );
                    let stats =
                        tokio::task::spawn_blocking(move || p.ensure_key_index(base, records))
                            .await
                            .map_err(|e| TierError::Corrupt(format!("key index task: {e}")))??;
                    tiered.keys = Some(stats);
                }
                if let Err(e) = self.upload_segment(partition, meta, &tiered.key).await {
                    if uploaded.is_empty() {
                        return Err(e);
                    }
                    // What did upload is committed, and the turn counts as
                    // progress (no backoff): a store that errs now and then
                    // must not hold a partition's uploads back for good.
                    tracing::warn!(topic = topic.name(), partition = index, error = %e, "uploading a segment failed; committing the ones before it");
                    break;
                }
                uploaded.push(tiered);
            }
            let stable_offset = partition.last_stable_offset();
            let epoch = partition.leader_epoch();
            self.partitions
                .commit(&remote, epoch, |m| {
                    let end = m.end_offset().unwrap_or(i64::MIN);
                    m.segments
                        .extend(uploaded.iter().filter(|s| s.base_offset >= end).cloned());
                    // The head now starts at the next segment, whose batches
                    // all lie at or past where the log was when it was made.
                    // Only the leader that recorded itself keeps the floor of
                    // its own log.
                    if m.leader.is_some_and(|l| l.epoch == epoch) {
                        let head = m.end_offset().unwrap_or(i64::MIN);
                        if let Some(floor) = partition.sink_position_from(head) {
                            m.wal_floor = Some(m.wal_floor.map_or(floor, |f| f.max(floor)));
                        }
                    }
                    m.stable_offset = Some(
                        m.stable_offset
                            .map_or(stable_offset, |s| s.max(stable_offset)),
                    );
                })
                .await?;
        }
        release_tiered(partition, &remote)
    }

    async fn upload_segment(
        &self,
        partition: &Partition,
        meta: &SegmentMeta,
        key: &str,
    ) -> Result<(), TierError> {
        let started = self.partitions.clock.now();
        let puts =
            objects::upload_segment(self.partitions.store(), partition.dir(), meta, key).await?;
        let stats = &self.partitions.stats;
        stats.upload_latency.observe(
            self.partitions
                .clock
                .now()
                .saturating_duration_since(started),
        );
        stats.puts.fetch_add(puts, Ordering::Relaxed);
        stats.segments_uploaded.fetch_add(1, Ordering::Relaxed);
        stats.bytes_uploaded.fetch_add(meta.size, Ordering::Relaxed);
        tracing::debug!(key, size = meta.size, "uploaded segment");
        Ok(())
    }
}

/// The manifest is durable: local copies of what it holds can go.
fn release_tiered(partition: &Partition, remote: &TieredPartition) -> Result<(), TierError> {
    let tiered_end = remote.manifest().end_offset().unwrap_or(i64::MIN);
    for meta in partition.sealed_segments() {
        if meta.next_offset <= tiered_end || meta.size == 0 {
            partition.release_local(meta.base_offset)?;
        }
    }
    Ok(())
}
