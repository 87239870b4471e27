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
//!    neither the manifest's end nor its leader moved meanwhile (a paused old
//!    leader may have just uploaded a segment, or finished a takeover of its
//!    own and be serving from a log nobody fenced: then start over). From that
//!    version on, every manifest write of the old leader is refused.
//!
//! The previous leader's log may also hold entries of an earlier time it
//! led the partition, which a later leader since rewrote (objects that
//! landed past a gap, or a head the manifest never took in). Every entry
//! records the epoch at which its writer led (a replayed batch is written
//! again at the replaying leader's epoch), and only the entries of the
//! leadership the manifest records are replayed (objects written before
//! `format::wal` version 3 lack that epoch, so all of theirs are).
//!
//! Objects of the previous leader may have been in flight when it was fenced
//! (`wal::fence` plugs their slots), so its log can have a gap. It
//! acknowledged nothing at or past an object that never landed, so a
//! partition's head ends at its first gap.
//!
//! A broker that dies leaves many partitions at once, so takeovers go in
//! rounds: every partition's manifest is read concurrently, each previous
//! leader is fenced once, and its write-ahead log is read once, object by
//! object, handing each entry to the partition it belongs to. The stall
//! after a failure then grows with the size of the dead broker's log, not
//! with that size times its partition count.
//!
//! Nor need the whole log be read. The manifest records a floor
//! (`wal_floor`) below which the leader's log holds nothing of the
//! partition past the manifest's end: where the taker's own log stood
//! before step 3 (the head is written again from there on), raised by each
//! upload to where the log stood when the new head segment was made (only
//! while the partition takes appends: between step 3's reset and step 4 the
//! head is still only in the previous log). A round reads from the smallest
//! floor of the partitions it takes from one leader.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use uuid::Uuid;

use super::remote::TieredPartition;
use super::{Tier, TierError};
use crate::catalog::Topic;
use crate::format::batch::BatchHeader;
use crate::format::segment::SNAPSHOT_EXT;
use crate::format::wal::WalEntry;
use crate::log::{Partition, RestorePoint};
use crate::manifest::{LeaderMark, Manifest, ManifestError};
use crate::wal;

/// Attempts before a takeover that keeps racing the old leader gives up.
const ATTEMPTS: usize = 8;
/// Partitions whose manifests are read, or committed, at once.
const CONCURRENCY: usize = 16;

/// A partition to take over, at the epoch the controller gave it.
#[derive(Clone)]
pub struct Claim {
    pub topic: Arc<Topic>,
    pub index: i32,
    pub partition: Arc<Partition>,
    pub epoch: i32,
}

/// A claim whose manifest was read: where its head starts and whose log holds it.
struct Prepared {
    claim: Claim,
    remote: Arc<TieredPartition>,
    manifest: Arc<Manifest>,
    restore: RestorePoint,
    /// The broker that led last, and at which epoch.
    previous: Option<LeaderMark>,
}

impl Tier {
    /// Makes `node_id` the leader of every claimed partition; `alive` tells
    /// whether a broker still holds its lease. `own_written` is where this
    /// broker's own log stands: objects below it hold everything it made
    /// durable, in earlier runs and in this one (it may take back a partition
    /// it led before losing its lease, whose head then sits in this run's
    /// objects). Returns, per claim, the end offset it serves from.
    pub async fn take_over(
        &self,
        claims: Vec<Claim>,
        node_id: i32,
        own_written: u64,
        alive: impl Fn(i32) -> bool,
    ) -> Vec<(Claim, Result<i64, TierError>)> {
        let mut done = Vec::with_capacity(claims.len());
        let mut pending = claims;
        for _ in 0..ATTEMPTS {
            if pending.is_empty() {
                break;
            }
            let prepared: Vec<_> = futures::stream::iter(pending.drain(..))
                .map(|c| async move {
                    let p = self.prepare(&c).await;
                    (c, p)
                })
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            // Ordered, so that the rounds go the same way every time (simulation).
            let mut by_previous: BTreeMap<Option<i32>, Vec<Prepared>> = BTreeMap::new();
            for (claim, p) in prepared {
                match p {
                    Ok(p) => by_previous
                        .entry(p.previous.map(|l| l.node_id))
                        .or_default()
                        .push(p),
                    Err(e) => done.push((claim, Err(e))),
                }
            }
            for (previous, group) in by_previous {
                let below = match previous {
                    None => Ok(0),
                    Some(prev) if prev == node_id => Ok(own_written),
                    Some(prev) if alive(prev) => Ok(u64::MAX),
                    Some(prev) => wal::fence(self.partitions.store(), prev, node_id)
                        .await
                        .map_err(TierError::from),
                };
                let replayed = match below {
                    Ok(below) => self.replay(previous, below, group).await,
                    Err(e) => {
                        let e = Arc::new(e);
                        done.extend(
                            group
                                .into_iter()
                                .map(|p| (p.claim, Err(TierError::Shared(e.clone())))),
                        );
                        continue;
                    }
                };
                let finished: Vec<_> = futures::stream::iter(replayed)
                    .map(|(p, r)| async move {
                        match r {
                            Ok(()) => self.finish(p, node_id, own_written).await,
                            Err(e) => (p.claim, Err(e)),
                        }
                    })
                    .buffer_unordered(CONCURRENCY)
                    .collect()
                    .await;
                for (claim, r) in finished {
                    match r {
                        Err(TierError::Manifest(ManifestError::Superseded(why))) => {
                            tracing::info!(
                                topic = claim.topic.name(),
                                partition = claim.index,
                                why,
                                "takeover raced; again"
                            );
                            pending.push(claim);
                        }
                        r => done.push((claim, r)),
                    }
                }
            }
        }
        done.extend(pending.into_iter().map(|c| {
            let why = format!(
                "{}-{}: takeover kept racing the previous leader",
                c.topic.name(),
                c.index
            );
            (c, Err(TierError::Corrupt(why)))
        }));
        done
    }

    /// Reads the claim's latest manifest: the head starts at its end.
    async fn prepare(&self, claim: &Claim) -> Result<Prepared, TierError> {
        let store = self.partitions.store();
        let remote = self
            .partitions
            .attach(&claim.topic, claim.index, &claim.partition)
            .await?;
        remote.refresh().await?;
        let m = remote.manifest();
        m.check_leader_epoch(claim.epoch)?;
        let producers = match m.segments.last() {
            Some(last) => match store.get(&last.object(SNAPSHOT_EXT)).await {
                Ok(r) => Some((last.base_offset, r.bytes().await?)),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => return Err(e.into()),
            },
            None => None,
        };
        Ok(Prepared {
            claim: claim.clone(),
            restore: RestorePoint {
                next_offset: m.end_offset().unwrap_or(0).max(m.log_start_offset),
                log_start_offset: m.log_start_offset,
                producers,
            },
            previous: m.leader,
            remote,
            manifest: m,
        })
    }

    /// Restarts every head of `group` at its manifest's end and appends the
    /// batches that `previous`'s log holds below `below`, reading that log
    /// once for the whole group.
    async fn replay(
        &self,
        previous: Option<i32>,
        below: u64,
        group: Vec<Prepared>,
    ) -> Vec<(Prepared, Result<(), TierError>)> {
        let mut results: Vec<(Prepared, Result<(), TierError>)> = group
            .into_iter()
            .map(|p| {
                p.claim.partition.set_leader_epoch(p.claim.epoch);
                let r = p.claim.partition.reset(&p.restore).map_err(TierError::from);
                (p, r)
            })
            .collect();
        let Some(previous) = previous else {
            return results;
        };
        let index: HashMap<(Uuid, i32), usize> = results
            .iter()
            .enumerate()
            .map(|(i, (p, _))| ((p.claim.topic.id(), p.claim.index), i))
            .collect();
        // Every partition's head lies in `previous`'s objects from its floor on.
        let from = results
            .iter()
            .map(|(p, _)| p.manifest.wal_floor.unwrap_or(0))
            .min()
            .unwrap_or(0);
        let started = tokio::time::Instant::now();
        let store = self.partitions.store();
        let objects = match wal::objects_between(store, previous, from, below).await {
            Ok(o) => o,
            Err(e) => return fail_all(results, e.into()),
        };
        futures::pin_mut!(objects);
        let mut read = 0usize;
        loop {
            let object = match objects.try_next().await {
                Ok(Some(o)) => o,
                Ok(None) => break,
                Err(e) => return fail_all(results, e.into()),
            };
            read += 1;
            for e in object.entries.iter().flatten() {
                let Some(&i) = index.get(&(e.topic_id, e.partition)) else {
                    continue;
                };
                let (p, r) = &mut results[i];
                // Objects before version 3 carry the batches' epochs: all replayed.
                let led_then =
                    !object.writer_epochs || p.previous.is_some_and(|l| l.epoch == e.leader_epoch);
                if r.is_ok() && led_then {
                    *r = object
                        .batches_of(e)
                        .map_err(TierError::from)
                        .and_then(|run| append_run(p, e, run));
                }
            }
        }
        // A takeover's time goes mostly here: one read of every object
        // the previous leader's log still holds.
        tracing::info!(
            previous,
            partitions = results.len(),
            from,
            objects = read,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "read the previous leader's write-ahead log"
        );
        results
    }

    /// Waits until the replayed head is in this broker's own log, then
    /// records this broker as the leader in the next manifest version.
    async fn finish(
        &self,
        p: Prepared,
        node_id: i32,
        own_written: u64,
    ) -> (Claim, Result<i64, TierError>) {
        let Prepared {
            claim,
            remote,
            manifest: m,
            restore,
            ..
        } = p;
        let epoch = claim.epoch;
        let partition = &claim.partition;
        if let Err(e) = partition.wait_durable(partition.end_offset()).await {
            return (claim, Err(e.into()));
        }
        let clock = self.partitions.clock.as_ref();
        let committed = remote
            .manifests
            .commit(&m, &self.partitions.writer, clock, |next| {
                next.check_leader_epoch(epoch)?;
                if next.end_offset() != m.end_offset() {
                    return Err(ManifestError::Superseded(
                        "the old leader uploaded meanwhile".into(),
                    ));
                }
                let mine = Some(LeaderMark { node_id, epoch });
                if next.leader != m.leader && next.leader != mine {
                    // A leader of an older epoch finished its own takeover
                    // after this one read the manifest: it may be serving,
                    // and only reading the manifest again fences it.
                    return Err(ManifestError::Superseded(
                        "another leader recorded itself meanwhile".into(),
                    ));
                }
                // The head was replayed into this broker's log, from
                // `own_written` on.
                next.wal_floor = Some(own_written);
                next.leader = mine;
                Ok(())
            })
            .await;
        match committed {
            Ok(next) => {
                remote.adopt(next);
                partition.start_appends();
                let end = partition.end_offset();
                tracing::info!(
                    topic = claim.topic.name(),
                    partition = claim.index,
                    epoch,
                    end,
                    recovered = end - restore.next_offset,
                    "took the partition over"
                );
                (claim, Ok(end))
            }
            Err(e) => (claim, Err(e.into())),
        }
    }
}

/// Appends the batches of one write-ahead log entry that the head lacks.
fn append_run(p: &Prepared, entry: &WalEntry, run: Bytes) -> Result<(), TierError> {
    if entry.last_offset < p.restore.next_offset {
        return Ok(());
    }
    let cfg = p.claim.topic.append_config();
    let mut rest = &run[..];
    while let Some(h) = BatchHeader::parse(rest)? {
        if h.size > rest.len() {
            break;
        }
        if h.base_offset > p.claim.partition.end_offset() {
            // An object below this one never landed (a takeover fenced its
            // slot while it was in flight), so the old leader acknowledged
            // nothing from there on: the head ends at the gap.
            tracing::debug!(
                topic = p.claim.topic.name(),
                partition = p.claim.index,
                gap_at = p.claim.partition.end_offset(),
                next = h.base_offset,
                "the previous leader's log has a gap; its head ends there"
            );
            break;
        }
        p.claim.partition.append_recovered(&rest[..h.size], &cfg)?;
        rest = &rest[h.size..];
    }
    Ok(())
}

/// Every claim of a group fails when its previous leader's log cannot be read.
fn fail_all(
    results: Vec<(Prepared, Result<(), TierError>)>,
    e: TierError,
) -> Vec<(Prepared, Result<(), TierError>)> {
    let e = Arc::new(e);
    results
        .into_iter()
        .map(|(p, _)| (p, Err(TierError::Shared(e.clone()))))
        .collect()
}
