//! The per-partition manifest: which sealed segments are in the store.
//!
//! Every version is a new object `.../manifest/<version:020>.json`, written
//! create-only (`PutMode::Create`): two writers of the same version can never
//! both succeed, and a reader never sees a half-written version. The current
//! manifest is the highest version listed. The writer epoch records who wrote
//! it, so a later issue can fence a stale broker.

use std::sync::Arc;

use bytes::Bytes;
use futures::TryStreamExt;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use serde::{Deserialize, Serialize};

use super::ManifestError;
use crate::clock::{Clock, Random};
use crate::format::control::AbortedTxn;
use crate::format::key_sketch::KeyStats;
use crate::format::segment::{SegmentMeta, SEGMENT_FORMAT_VERSION};

pub const MANIFEST_FORMAT_VERSION: u32 = 1;
/// Older versions kept after a write, for readers that listed just before it.
const KEEP_OLD_VERSIONS: u64 = 8;
/// Lost races in a row before `commit` gives up; each loss means another
/// writer made progress, so this only ends a pathological storm.
const MAX_COMMIT_ATTEMPTS: usize = 16;

/// Who wrote a manifest version: a broker node and one run of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriterEpoch {
    pub node_id: i32,
    pub started_ms: i64,
    /// Tells two runs apart even if they started in the same millisecond.
    pub nonce: String,
}

impl WriterEpoch {
    pub fn new(node_id: i32, clock: &dyn Clock, random: &dyn Random) -> WriterEpoch {
        WriterEpoch {
            node_id,
            started_ms: clock.now_ms(),
            nonce: random.uuid().simple().to_string(),
        }
    }
}

/// A sealed segment in the store: its objects are `<key>.log`, `.index`,
/// `.timeindex` and `.meta`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TieredSegment {
    /// Object key without extension, relative to the store root.
    pub key: String,
    pub base_offset: i64,
    pub next_offset: i64,
    pub max_timestamp: i64,
    pub max_timestamp_position: u64,
    pub size: u64,
    pub level: u32,
    pub batch_count: u64,
    /// Compacted topics: records, distinct keys and their sketch, from which
    /// the policy estimates the share of superseded records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyStats>,
    /// Transactions aborted by markers in this segment, for read_committed
    /// fetches served from the store.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborted: Vec<AbortedTxn>,
}

impl TieredSegment {
    pub fn from_meta(key: String, m: &SegmentMeta) -> TieredSegment {
        TieredSegment {
            key,
            base_offset: m.base_offset,
            next_offset: m.next_offset,
            max_timestamp: m.max_timestamp,
            max_timestamp_position: m.max_timestamp_position,
            size: m.size,
            level: m.level,
            batch_count: m.batch_count,
            keys: m.keys.clone(),
            aborted: m.aborted.clone(),
        }
    }

    /// The descriptor a merge reads (creation times are not kept in the manifest).
    pub fn to_meta(&self) -> SegmentMeta {
        SegmentMeta {
            format_version: SEGMENT_FORMAT_VERSION,
            level: self.level,
            base_offset: self.base_offset,
            next_offset: self.next_offset,
            size: self.size,
            batch_count: self.batch_count,
            max_timestamp: self.max_timestamp,
            max_timestamp_position: self.max_timestamp_position,
            created_ms: 0,
            sealed_ms: 0,
            keys: self.keys.clone(),
            aborted: self.aborted.clone(),
        }
    }

    pub fn object(&self, ext: &str) -> Path {
        Path::from(format!("{}.{ext}", self.key))
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    pub format_version: u32,
    /// 0 for "no manifest yet"; the first one written is version 1.
    pub version: u64,
    pub writer: WriterEpoch,
    pub log_start_offset: i64,
    /// Oldest first, contiguous, none overlapping.
    pub segments: Vec<TieredSegment>,
    pub written_ms: i64,
    /// The partition's leader that last took it over (cluster mode): its
    /// node and leader epoch. A writer of an older epoch is fenced, and the
    /// next leader reads the head back from this node's write-ahead log.
    #[serde(default)]
    pub leader: Option<LeaderMark>,
    /// The partition's last stable offset when the leader last uploaded
    /// (LSOs only grow, so the current one is at least this): merges stay
    /// below it, where every transaction is decided. `None` in manifests
    /// from before transactions, which had none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stable_offset: Option<i64>,
    /// Where the next leader starts reading `leader`'s write-ahead log: its
    /// objects below this sequence number hold nothing of this partition at
    /// or past the manifest's end. Set by the takeover and raised by each
    /// upload; `None` (older manifests): read the whole log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_floor: Option<u64>,
}

/// Who leads a partition, as its manifest records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaderMark {
    pub node_id: i32,
    pub epoch: i32,
}

impl Manifest {
    pub fn empty(writer: WriterEpoch) -> Manifest {
        Manifest {
            format_version: MANIFEST_FORMAT_VERSION,
            version: 0,
            writer,
            log_start_offset: 0,
            segments: Vec::new(),
            written_ms: 0,
            leader: None,
            stable_offset: None,
            wal_floor: None,
        }
    }

    /// Refuses a write by a leader of epoch `epoch` once a newer leader
    /// took the partition over.
    pub fn check_leader_epoch(&self, epoch: i32) -> Result<(), ManifestError> {
        match self.leader {
            Some(l) if l.epoch > epoch => Err(ManifestError::Fenced {
                epoch,
                current: l.epoch,
            }),
            _ => Ok(()),
        }
    }

    /// How many segments, from the first, lie wholly below the stable
    /// offset: only those may be merged.
    pub fn stable_segments(&self) -> usize {
        self.segments
            .iter()
            .take_while(|s| self.stable_offset.is_none_or(|lso| s.next_offset <= lso))
            .count()
    }

    /// The aborted transactions of the whole tiered log that overlap
    /// `from..upper`.
    pub fn aborted_txns(&self, from: i64, upper: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        let lists = self
            .segments
            .iter()
            .filter(|s| s.next_offset > from)
            .map(|s| &s.aborted[..]);
        crate::format::control::collect_aborted(lists, from, upper, &mut out);
        out
    }

    /// One past the last tiered offset, if any segment is tiered.
    pub fn end_offset(&self) -> Option<i64> {
        self.segments.last().map(|s| s.next_offset)
    }

    pub fn size_bytes(&self) -> u64 {
        self.segments.iter().map(|s| s.size).sum()
    }

    /// The segment holding `offset`, or the first one after it.
    pub fn segment_for(&self, offset: i64) -> Option<&TieredSegment> {
        let i = self.segments.partition_point(|s| s.next_offset <= offset);
        self.segments.get(i)
    }

    /// The next version, written by `writer` at `written_ms`, with `edit` applied.
    pub fn next(
        &self,
        writer: &WriterEpoch,
        written_ms: i64,
        edit: impl FnOnce(&mut Manifest),
    ) -> Manifest {
        let mut m = self.clone();
        m.version = self.version + 1;
        m.writer = writer.clone();
        m.written_ms = written_ms;
        edit(&mut m);
        m
    }
}

/// Reads and writes the manifest versions of one partition.
#[derive(Clone)]
pub struct ManifestStore {
    store: Arc<dyn ObjectStore>,
    dir: Path,
}

fn version_key(dir: &Path, version: u64) -> Path {
    dir.child(format!("{version:020}.json"))
}

impl ManifestStore {
    /// `dir` is the partition's `.../<partition>/manifest` prefix.
    pub fn new(store: Arc<dyn ObjectStore>, dir: Path) -> ManifestStore {
        ManifestStore { store, dir }
    }

    /// Versions present, ascending.
    async fn versions(&self) -> Result<Vec<u64>, ManifestError> {
        let metas: Vec<_> = self.store.list(Some(&self.dir)).try_collect().await?;
        let mut v: Vec<u64> = metas
            .iter()
            .filter_map(|m| m.location.filename()?.strip_suffix(".json")?.parse().ok())
            .collect();
        v.sort_unstable();
        Ok(v)
    }

    /// The highest version, or `None` when the partition was never tiered.
    pub async fn load_latest(&self) -> Result<Option<Manifest>, ManifestError> {
        // A version can vanish between list and get (pruned by a newer
        // writer); list again then.
        for _ in 0..5 {
            let Some(&latest) = self.versions().await?.last() else {
                return Ok(None);
            };
            match self.store.get(&version_key(&self.dir, latest)).await {
                Ok(r) => {
                    let bytes = r.bytes().await?;
                    let m: Manifest = serde_json::from_slice(&bytes)
                        .map_err(|e| ManifestError::Corrupt(format!("manifest {latest}: {e}")))?;
                    return Ok(Some(m));
                }
                Err(object_store::Error::NotFound { .. }) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(ManifestError::Corrupt(
            "manifest versions keep disappearing".into(),
        ))
    }

    /// Writes `m` as a new version; `ManifestError::Conflict` if that version
    /// already exists (another writer won).
    pub async fn create(&self, m: &Manifest) -> Result<(), ManifestError> {
        let json =
            serde_json::to_vec_pretty(m).map_err(|e| ManifestError::Corrupt(e.to_string()))?;
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(
                &version_key(&self.dir, m.version),
                PutPayload::from(Bytes::from(json)),
                opts,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                Err(ManifestError::Conflict { version: m.version })
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Writes the version after `base` with `edit` applied. When another
    /// writer (the broker's uploader, a compaction worker) wrote that version
    /// first, the latest version is loaded and `edit` applied to it again, so
    /// writers never undo each other's changes; `edit` must therefore be
    /// written against whatever version it is given, and fails (ending the
    /// commit) when that version no longer allows it. Each attempt is
    /// stamped with the time `clock` reads.
    pub async fn commit(
        &self,
        base: &Manifest,
        writer: &WriterEpoch,
        clock: &dyn Clock,
        mut edit: impl FnMut(&mut Manifest) -> Result<(), ManifestError>,
    ) -> Result<Manifest, ManifestError> {
        let mut base = base.clone();
        for _ in 0..MAX_COMMIT_ATTEMPTS {
            let mut next = base.next(writer, clock.now_ms(), |_| {});
            edit(&mut next)?;
            match self.create(&next).await {
                Ok(()) => {
                    if let Err(e) = self.prune(next.version).await {
                        tracing::debug!(error = %e, "pruning old manifest versions failed");
                    }
                    return Ok(next);
                }
                Err(ManifestError::Conflict { version }) => {
                    base = self
                        .load_latest()
                        .await?
                        .ok_or(ManifestError::Conflict { version })?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(ManifestError::Conflict {
            version: base.version + 1,
        })
    }

    /// Deletes versions older than the last few below `current`. Best effort:
    /// a leftover old version is harmless, readers take the highest.
    pub async fn prune(&self, current: u64) -> Result<(), ManifestError> {
        for v in self.versions().await? {
            if v + KEEP_OLD_VERSIONS < current {
                match self.store.delete(&version_key(&self.dir, v)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{OsRandom, SystemClock};
    use crate::manifest::store::{open, S3Options};

    fn segment(base: i64, next: i64) -> TieredSegment {
        TieredSegment {
            key: format!("seg/{base:020}-0"),
            base_offset: base,
            next_offset: next,
            max_timestamp: base,
            max_timestamp_position: 0,
            size: 100,
            level: 0,
            batch_count: 1,
            keys: None,
            aborted: Vec::new(),
        }
    }

    #[test]
    fn only_segments_below_the_stable_offset_are_mergeable() {
        let mut m = Manifest::empty(WriterEpoch::new(1, &SystemClock, &OsRandom));
        m.segments = vec![segment(0, 10), segment(10, 20), segment(20, 30)];
        assert_eq!(m.stable_segments(), 3, "no transactions: all of them");
        m.stable_offset = Some(20);
        assert_eq!(m.stable_segments(), 2);
        m.stable_offset = Some(19);
        assert_eq!(m.stable_segments(), 1);
        m.segments[2].aborted = vec![AbortedTxn {
            producer_id: 5,
            first_offset: 8,
            last_offset: 25,
            last_stable_offset: 26,
        }];
        assert_eq!(m.aborted_txns(0, 10).len(), 1);
        assert!(m.aborted_txns(26, 30).is_empty());
    }

    async fn exactly_one_of_two_writers_wins(store: Arc<dyn ObjectStore>) {
        let dir = Path::from("topics/t/id/0/manifest");
        let a = ManifestStore::new(store.clone(), dir.clone());
        let b = ManifestStore::new(store.clone(), dir);
        let (wa, wb) = (
            WriterEpoch::new(1, &SystemClock, &OsRandom),
            WriterEpoch::new(2, &SystemClock, &OsRandom),
        );
        let v1 = Manifest::empty(wa.clone()).next(&wa, 0, |m| m.segments.push(segment(0, 10)));
        a.create(&v1).await.unwrap();
        // Both load version 1 and race to write version 2.
        let base_a = a.load_latest().await.unwrap().unwrap();
        let base_b = b.load_latest().await.unwrap().unwrap();
        assert_eq!(base_a, v1);
        let next_a = base_a.next(&wa, 0, |m| m.segments.push(segment(10, 20)));
        let next_b = base_b.next(&wb, 0, |m| m.segments.push(segment(10, 30)));
        let (ra, rb) = tokio::join!(a.create(&next_a), b.create(&next_b));
        assert!(
            ra.is_ok() ^ rb.is_ok(),
            "exactly one writer must win: {ra:?} {rb:?}"
        );
        let loser = if ra.is_ok() { rb } else { ra };
        assert!(matches!(loser, Err(ManifestError::Conflict { version: 2 })));
        let latest = a.load_latest().await.unwrap().unwrap();
        assert_eq!(latest.version, 2);
        assert!(latest == next_a || latest == next_b);
        // The loser reloads and builds on the winner's version.
        let again = latest.next(&wb, 0, |m| m.log_start_offset = 5);
        b.create(&again).await.unwrap();
        assert_eq!(a.load_latest().await.unwrap().unwrap(), again);
    }

    #[tokio::test]
    async fn concurrent_writers_memory() {
        let store = open("memory://", &S3Options::default()).unwrap();
        exactly_one_of_two_writers_wins(store).await;
    }

    #[tokio::test]
    async fn concurrent_writers_file() {
        let dir = tempfile::tempdir().unwrap();
        let url = crate::manifest::store::default_url(dir.path());
        let store = open(&url, &S3Options::default()).unwrap();
        exactly_one_of_two_writers_wins(store).await;
    }

    #[tokio::test]
    async fn many_racing_writers_one_winner_per_version() {
        let store = open("memory://", &S3Options::default()).unwrap();
        let ms = ManifestStore::new(store, Path::from("m"));
        let w = WriterEpoch::new(1, &SystemClock, &OsRandom);
        let base = Manifest::empty(w.clone());
        let tries: Vec<_> = (0..8)
            .map(|i| {
                let ms = ms.clone();
                let m = base.next(&w, 0, |m| m.log_start_offset = i);
                tokio::spawn(async move { ms.create(&m).await.is_ok() })
            })
            .collect();
        let mut wins = 0;
        for t in tries {
            wins += t.await.unwrap() as usize;
        }
        assert_eq!(wins, 1);
    }

    #[tokio::test]
    async fn latest_is_highest_and_prune_keeps_recent() {
        let store = open("memory://", &S3Options::default()).unwrap();
        let ms = ManifestStore::new(store, Path::from("m"));
        assert!(ms.load_latest().await.unwrap().is_none());
        let w = WriterEpoch::new(1, &SystemClock, &OsRandom);
        let mut m = Manifest::empty(w.clone());
        for i in 0..20 {
            m = m.next(&w, 0, |m| m.segments.push(segment(i * 10, i * 10 + 10)));
            ms.create(&m).await.unwrap();
        }
        ms.prune(m.version).await.unwrap();
        let left = ms.versions().await.unwrap();
        assert_eq!(left.first(), Some(&(20 - KEEP_OLD_VERSIONS)));
        let latest = ms.load_latest().await.unwrap().unwrap();
        assert_eq!(latest.version, 20);
        assert_eq!(latest.segment_for(55).unwrap().base_offset, 50);
        assert_eq!(latest.end_offset(), Some(200));
        assert!(latest.segment_for(200).is_none());
    }
}
