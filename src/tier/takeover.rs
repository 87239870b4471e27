//! Taking a partition over as its new leader (cluster mode).
//!
//! The store holds the partition's history (sealed segments in the manifest)
//! and the previous leader's write-ahead log holds its head. The manifest
//! also records who led last, so the new leader knows whose log to read:
//!
//! 1. Reload the manifest. A leader of a newer epoch recorded there means
//!    this takeover is already stale.
//! 2. If the previous leader's broker is gone (its lease expired, it may
//!    still run paused), fence its write-ahead log so it can acknowledge
//!    nothing more; a live previous leader released the partition after
//!    making its head durable, so its log is read as it is.
//! 3. Forget the local head and continue at the manifest's end, with the
//!    last tiered producer snapshot, then append the previous leader's
//!    batches from there on (producer state follows them, so a retrying
//!    idempotent producer gets no duplicates), and wait until they are in
//!    this broker's own write-ahead log.
//! 4. Record this broker and epoch in the next manifest version, but only if
//!    the manifest's end did not move meanwhile (a paused old leader may have
//!    just uploaded a segment: then start over). From that version on, every
//!    manifest write of the old leader is refused.

use std::sync::Arc;

use super::{Tier, TierError};
use crate::catalog::Topic;
use crate::format::batch::BatchHeader;
use crate::format::segment::SNAPSHOT_EXT;
use crate::log::{Partition, RestorePoint};
use crate::manifest::{LeaderMark, ManifestError};
use crate::wal;

/// Attempts before a takeover that keeps racing the old leader gives up.
const ATTEMPTS: usize = 8;

/// The broker taking a partition over.
#[derive(Debug, Clone, Copy)]
pub struct NewLeader {
    pub node_id: i32,
    pub epoch: i32,
    /// Where this broker's own write-ahead log stands: objects below this
    /// sequence number hold everything it made durable, in earlier runs and
    /// in this one (it may take back a partition it led before losing its
    /// lease, whose head then sits in this run's objects).
    pub own_written: u64,
}

impl Tier {
    /// Makes `leader` the leader of `partition`; `alive` tells whether a
    /// broker still holds its lease. Returns the end offset it serves from.
    pub async fn take_over(
        &self,
        topic: &Topic,
        index: i32,
        partition: &Arc<Partition>,
        leader: NewLeader,
        alive: impl Fn(i32) -> bool,
    ) -> Result<i64, TierError> {
        let NewLeader {
            node_id,
            epoch,
            own_written,
        } = leader;
        let store = self.partitions.store().clone();
        let remote = self.partitions.attach(topic, index, partition).await?;
        for _ in 0..ATTEMPTS {
            remote.refresh().await?;
            let m = remote.manifest();
            m.check_leader_epoch(epoch)?;
            let end = m.end_offset().unwrap_or(0).max(m.log_start_offset);
            let producers = match m.segments.last() {
                Some(last) => match store.get(&last.object(SNAPSHOT_EXT)).await {
                    Ok(r) => Some((last.base_offset, r.bytes().await?)),
                    Err(object_store::Error::NotFound { .. }) => None,
                    Err(e) => return Err(e.into()),
                },
                None => None,
            };
            let head = match m.leader {
                None => Vec::new(),
                Some(LeaderMark { node_id: prev, .. }) => {
                    let below = if prev == node_id {
                        own_written
                    } else if alive(prev) {
                        u64::MAX
                    } else {
                        wal::fence(&store, prev, node_id).await?
                    };
                    wal::read_partition(&store, prev, below, topic.id(), index, end).await?
                }
            };
            partition.set_leader_epoch(epoch);
            partition.reset(&RestorePoint {
                next_offset: end,
                log_start_offset: m.log_start_offset,
                producers,
            })?;
            let cfg = topic.append_config();
            for run in &head {
                let mut rest = &run[..];
                while let Some(h) = BatchHeader::parse(rest)? {
                    if h.size > rest.len() {
                        break;
                    }
                    partition.append_recovered(&rest[..h.size], &cfg)?;
                    rest = &rest[h.size..];
                }
            }
            partition.wait_durable(partition.end_offset()).await?;
            let committed = remote
                .manifests
                .commit(&m, &self.partitions.writer, |next| {
                    next.check_leader_epoch(epoch)?;
                    if next.end_offset() != m.end_offset() {
                        return Err(ManifestError::Superseded(
                            "the old leader uploaded meanwhile".into(),
                        ));
                    }
                    next.leader = Some(LeaderMark { node_id, epoch });
                    Ok(())
                })
                .await;
            match committed {
                Ok(next) => {
                    remote.adopt(next);
                    tracing::info!(
                        topic = topic.name(),
                        partition = index,
                        epoch,
                        end = partition.end_offset(),
                        recovered = partition.end_offset() - end,
                        "took the partition over"
                    );
                    return Ok(partition.end_offset());
                }
                Err(ManifestError::Superseded(why)) => {
                    tracing::info!(
                        topic = topic.name(),
                        partition = index,
                        why,
                        "takeover raced; again"
                    );
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(TierError::Corrupt(format!(
            "{}-{index}: takeover kept racing the previous leader",
            topic.name()
        )))
    }
}
