//! The remote part of one partition's log: reads of tiered segments through
//! the manifest and the block cache (what `Partition::fetch` calls below the
//! first local segment).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use parking_lot::RwLock;
use uuid::Uuid;

use super::cache::BlockCache;
use super::TierError;
use crate::format::batch::{self, first_record, BatchHeader, HEADER_LEN};
use crate::format::control::{collect_aborted, AbortedTxn};
use crate::log::segment::Located;
use crate::log::{LogError, RemoteFuture, RemoteLog};
use crate::manifest::{Manifest, ManifestStore, TieredSegment};

pub struct TieredPartition {
    pub topic: String,
    pub topic_id: Uuid,
    pub index: i32,
    /// `topics/<topic>/<topic-id>/<partition>`.
    pub prefix: Path,
    pub manifests: ManifestStore,
    /// The newest manifest version this broker knows to be durable.
    manifest: RwLock<Arc<Manifest>>,
    /// Whether the manifest was loaded from the store at least once.
    loaded: AtomicBool,
    cache: BlockCache,
}

impl TieredPartition {
    pub fn new(
        topic: &str,
        topic_id: Uuid,
        index: i32,
        manifests: ManifestStore,
        prefix: Path,
        manifest: Manifest,
        cache: BlockCache,
    ) -> TieredPartition {
        TieredPartition {
            topic: topic.to_string(),
            topic_id,
            index,
            prefix,
            manifests,
            manifest: RwLock::new(Arc::new(manifest)),
            loaded: AtomicBool::new(false),
            cache,
        }
    }

    pub fn manifest(&self) -> Arc<Manifest> {
        self.manifest.read().clone()
    }

    /// Publishes a version after it was written durably.
    pub fn set_manifest(&self, m: Manifest) {
        *self.manifest.write() = Arc::new(m);
    }

    pub fn cache(&self) -> &BlockCache {
        &self.cache
    }

    async fn read_log(&self, seg: &TieredSegment, pos: u64, len: u64) -> Result<Bytes, TierError> {
        self.cache
            .read(
                &format!("{}.log", seg.key),
                seg.size,
                pos..pos.saturating_add(len),
            )
            .await
    }

    /// The first batch from `pos` on whose header satisfies `pred`.
    async fn find(
        &self,
        seg: &TieredSegment,
        mut pos: u64,
        pred: impl Fn(&BatchHeader) -> bool,
    ) -> Result<Option<Located>, TierError> {
        while pos + HEADER_LEN as u64 <= seg.size {
            let buf = self.read_log(seg, pos, HEADER_LEN as u64).await?;
            let header = BatchHeader::parse(&buf)
                .map_err(|e| TierError::Corrupt(format!("{}: {e}", seg.key)))?
                .ok_or_else(|| TierError::Corrupt(format!("{}: short header", seg.key)))?;
            if pred(&header) {
                return Ok(Some(Located {
                    position: pos,
                    header,
                }));
            }
            pos += header.size as u64;
        }
        Ok(None)
    }

    /// Whole batches from the first segment at or after `offset` that still
    /// holds a batch reaching it: compaction can empty the tail of a segment,
    /// or a whole segment, and a reader must step over that gap.
    async fn read_from(
        &self,
        manifest: &Manifest,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<Bytes, TierError> {
        let first = manifest
            .segments
            .partition_point(|s| s.next_offset <= offset);
        for seg in &manifest.segments[first..] {
            let index = self.cache.index(&seg.key).await?;
            let rel = (offset.max(seg.base_offset) - seg.base_offset).min(u32::MAX as i64) as u32;
            let start = index.lookup_offset(rel) as u64;
            let Some(loc) = self.find(seg, start, |h| h.last_offset() >= offset).await? else {
                continue;
            };
            let data = self.read_log(seg, loc.position, max_bytes as u64).await?;
            let whole = batch::whole_batches_len(&data);
            return Ok(if whole > 0 {
                data.slice(..whole)
            } else if min_one {
                self.read_log(seg, loc.position, loc.header.size as u64)
                    .await?
            } else {
                Bytes::new()
            });
        }
        Ok(Bytes::new())
    }

    async fn read_impl(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<Bytes, TierError> {
        let manifest = self.manifest();
        match self.read_from(&manifest, offset, max_bytes, min_one).await {
            Err(e) if e.is_not_found() => {
                // A compaction elsewhere replaced the segment and its grace
                // period is over: read through the newer manifest.
                if !self.refresh().await? {
                    return Err(e);
                }
                let manifest = self.manifest();
                self.read_from(&manifest, offset, max_bytes, min_one).await
            }
            other => other,
        }
    }

    /// Loads the latest manifest version from the store; true when it is
    /// newer than the one in use.
    pub async fn refresh(&self) -> Result<bool, TierError> {
        match self.manifests.load_latest().await? {
            Some(latest) => Ok(self.adopt(latest)),
            None => Ok(false),
        }
    }

    /// Loads the manifest unless it was loaded before. Two callers may
    /// both load; the newer version wins either way.
    pub(crate) async fn load(&self) -> Result<(), TierError> {
        if !self.is_loaded() {
            self.refresh().await?;
            self.loaded.store(true, Ordering::Release);
        }
        Ok(())
    }

    pub(crate) fn is_loaded(&self) -> bool {
        self.loaded.load(Ordering::Acquire)
    }

    /// Takes `m` if it is newer than the version in use (versions only grow).
    pub fn adopt(&self, m: Manifest) -> bool {
        let mut current = self.manifest.write();
        if m.version > current.version {
            *current = Arc::new(m);
            true
        } else {
            false
        }
    }

    async fn offset_for_timestamp_impl(
        &self,
        timestamp: i64,
        start: i64,
    ) -> Result<Option<(i64, i64)>, TierError> {
        let manifest = self.manifest();
        for seg in manifest
            .segments
            .iter()
            .filter(|s| s.next_offset > start && s.max_timestamp >= timestamp)
        {
            let index = self.cache.index(&seg.key).await?;
            let mut pos = index.lookup_offset(index.lookup_time(timestamp)) as u64;
            while let Some(loc) = self
                .find(seg, pos, |h| h.max_timestamp >= timestamp)
                .await?
            {
                if loc.header.last_offset() >= start {
                    let data = self
                        .read_log(seg, loc.position, loc.header.size as u64)
                        .await?;
                    let found =
                        first_record(&data, &loc.header, |o, ts| o >= start && ts >= timestamp)?;
                    if found.is_some() {
                        return Ok(found);
                    }
                }
                pos = loc.position + loc.header.size as u64;
            }
        }
        Ok(None)
    }

    async fn max_timestamp_impl(&self, start: i64) -> Result<Option<(i64, i64)>, TierError> {
        let manifest = self.manifest();
        let mut best: Option<&TieredSegment> = None;
        for s in manifest
            .segments
            .iter()
            .filter(|s| s.next_offset > start && s.size > 0)
        {
            if best.is_none_or(|b| s.max_timestamp > b.max_timestamp) {
                best = Some(s);
            }
        }
        let Some(seg) = best else { return Ok(None) };
        let Some(loc) = self.find(seg, seg.max_timestamp_position, |_| true).await? else {
            return Ok(None);
        };
        let data = self
            .read_log(seg, loc.position, loc.header.size as u64)
            .await?;
        let max_ts = seg.max_timestamp;
        Ok(first_record(&data, &loc.header, |_, ts| ts == max_ts)?)
    }
}

fn to_log(e: TierError) -> LogError {
    match e {
        TierError::Log(l) => l,
        other => LogError::Remote(other.to_string()),
    }
}

impl RemoteLog for TieredPartition {
    fn end_offset(&self) -> Option<i64> {
        self.manifest.read().end_offset()
    }

    fn size_bytes(&self) -> u64 {
        self.manifest.read().segments.iter().map(|s| s.size).sum()
    }

    fn read(&self, offset: i64, max_bytes: usize, min_one: bool) -> RemoteFuture<'_, Bytes> {
        Box::pin(async move {
            self.read_impl(offset, max_bytes, min_one)
                .await
                .map_err(to_log)
        })
    }

    fn offset_for_timestamp(
        &self,
        timestamp: i64,
        start: i64,
    ) -> RemoteFuture<'_, Option<(i64, i64)>> {
        Box::pin(async move {
            self.offset_for_timestamp_impl(timestamp, start)
                .await
                .map_err(to_log)
        })
    }

    fn max_timestamp(&self, start: i64) -> RemoteFuture<'_, Option<(i64, i64)>> {
        Box::pin(async move { self.max_timestamp_impl(start).await.map_err(to_log) })
    }

    fn aborted_txns(&self, from: i64, upper: i64, out: &mut Vec<AbortedTxn>) -> bool {
        let manifest = self.manifest.read();
        let lists = manifest
            .segments
            .iter()
            .filter(|s| s.next_offset > from)
            .map(|s| &s.aborted[..]);
        collect_aborted(lists, from, upper, out)
    }
}
