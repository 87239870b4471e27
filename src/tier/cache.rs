//! Byte ranges of segment objects, fetched in fixed-size blocks and kept in a
//! memory cache bounded by `--cache-bytes`.
//!
//! Fixed blocks make every reader of the same region share one GET and one
//! cache entry, whatever offsets and sizes consumers ask for; concurrent
//! misses of one block are coalesced by moka. A read that touches a block
//! starts fetching the next ones in the background, so a sequential consumer
//! finds them cached when it gets there.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use moka::future::Cache;
use object_store::path::Path;
use object_store::ObjectStore;

use super::TierError;
use crate::log::index::SegmentIndex;

pub(crate) const BLOCK_SIZE: u64 = 1 << 20;
/// Blocks fetched ahead of the last one a read touched.
const PREFETCH_BLOCKS: u64 = 2;

type BlockKey = (Arc<str>, u64);

/// Request counters (for tests and the bench).
#[derive(Debug, Default)]
pub struct Counters {
    pub gets: AtomicU64,
    pub get_bytes: AtomicU64,
    pub hits: AtomicU64,
}

#[derive(Clone)]
pub struct BlockCache {
    store: Arc<dyn ObjectStore>,
    blocks: Cache<BlockKey, Bytes>,
    indexes: Cache<Arc<str>, Arc<SegmentIndex>>,
    pub counters: Arc<Counters>,
}

impl BlockCache {
    pub fn new(store: Arc<dyn ObjectStore>, capacity_bytes: u64) -> BlockCache {
        BlockCache {
            store,
            blocks: Cache::builder()
                .max_capacity(capacity_bytes.max(BLOCK_SIZE))
                .weigher(|k: &BlockKey, v: &Bytes| {
                    (v.len() + k.0.len()).min(u32::MAX as usize) as u32
                })
                .build(),
            // Sparse indexes are small (16 bytes per 4 KiB of log).
            indexes: Cache::builder()
                .max_capacity(64 << 20)
                .weigher(|_, v: &Arc<SegmentIndex>| {
                    (std::mem::size_of_val(v.as_ref()) + 1024) as u32
                })
                .build(),
            counters: Arc::new(Counters::default()),
        }
    }

    /// Bytes `range` of the object `key` whose total size is `size`.
    pub async fn read(&self, key: &str, size: u64, range: Range<u64>) -> Result<Bytes, TierError> {
        let end = range.end.min(size);
        if range.start >= end {
            return Ok(Bytes::new());
        }
        let key: Arc<str> = Arc::from(key);
        let (first, last) = (range.start / BLOCK_SIZE, (end - 1) / BLOCK_SIZE);
        let blocks =
            futures::future::try_join_all((first..=last).map(|b| self.block(key.clone(), size, b)))
                .await?;
        self.prefetch(&key, size, last);
        let skip = (range.start - first * BLOCK_SIZE) as usize;
        let len = (end - range.start) as usize;
        if blocks.len() == 1 {
            return Ok(blocks[0].slice(skip..skip + len));
        }
        let mut out = BytesMut::with_capacity(len);
        for b in &blocks {
            out.extend_from_slice(b);
        }
        Ok(out.freeze().slice(skip..skip + len))
    }

    async fn block(&self, key: Arc<str>, size: u64, block: u64) -> Result<Bytes, TierError> {
        let cache_key = (key.clone(), block);
        if let Some(b) = self.blocks.get(&cache_key).await {
            self.counters.hits.fetch_add(1, Ordering::Relaxed);
            return Ok(b);
        }
        let store = self.store.clone();
        let counters = self.counters.clone();
        self.blocks
            .try_get_with(cache_key, async move {
                let start = block * BLOCK_SIZE;
                let end = (start + BLOCK_SIZE).min(size);
                let bytes = store
                    .get_range(&Path::from(key.as_ref()), start..end)
                    .await?;
                counters.gets.fetch_add(1, Ordering::Relaxed);
                counters
                    .get_bytes
                    .fetch_add(bytes.len() as u64, Ordering::Relaxed);
                Ok::<_, TierError>(bytes)
            })
            .await
            .map_err(TierError::Shared)
    }

    fn prefetch(&self, key: &Arc<str>, size: u64, last: u64) {
        let blocks_total = size.div_ceil(BLOCK_SIZE);
        for b in last + 1..(last + 1 + PREFETCH_BLOCKS).min(blocks_total) {
            if self.blocks.contains_key(&(key.clone(), b)) {
                continue;
            }
            let this = self.clone();
            let key = key.clone();
            tokio::spawn(async move {
                // A failed prefetch is retried by the read that needs the block.
                let _ = this.block(key, size, b).await;
            });
        }
    }

    /// The sparse offset and time index of the segment with object key prefix `key`.
    pub async fn index(&self, key: &str) -> Result<Arc<SegmentIndex>, TierError> {
        let store = self.store.clone();
        let k: Arc<str> = Arc::from(key);
        let counters = self.counters.clone();
        self.indexes
            .try_get_with(k.clone(), async move {
                let (o, t) = futures::future::try_join(
                    async {
                        store
                            .get(&Path::from(format!("{k}.index")))
                            .await?
                            .bytes()
                            .await
                    },
                    async {
                        store
                            .get(&Path::from(format!("{k}.timeindex")))
                            .await?
                            .bytes()
                            .await
                    },
                )
                .await
                .map_err(TierError::Store)?;
                counters.gets.fetch_add(2, Ordering::Relaxed);
                SegmentIndex::from_bytes(&o, &t)
                    .map(Arc::new)
                    .ok_or_else(|| TierError::Corrupt(format!("malformed index of {k}")))
            })
            .await
            .map_err(TierError::Shared)
    }

    /// Forgets a deleted segment's blocks and index (its key is never reused
    /// with other content, so this only frees memory early).
    pub async fn forget(&self, key: &str, size: u64) {
        let log: Arc<str> = Arc::from(format!("{key}.log"));
        for b in 0..size.div_ceil(BLOCK_SIZE) {
            self.blocks.invalidate(&(log.clone(), b)).await;
        }
        self.indexes.invalidate(&Arc::<str>::from(key)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn ranges_across_blocks_match_the_object_and_hit_the_cache() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let data: Vec<u8> = (0..(3 * BLOCK_SIZE + 123))
            .map(|i| (i % 251) as u8)
            .collect();
        store
            .put(&Path::from("x.log"), Bytes::from(data.clone()).into())
            .await
            .unwrap();
        let cache = BlockCache::new(store, 64 << 20);
        let size = data.len() as u64;
        for r in [
            0..10,
            BLOCK_SIZE - 5..BLOCK_SIZE + 5,
            10..3 * BLOCK_SIZE + 100,
        ] {
            let got = cache.read("x.log", size, r.clone()).await.unwrap();
            assert_eq!(&got[..], &data[r.start as usize..r.end as usize]);
        }
        let tail = cache
            .read("x.log", size, size - 3..size + 50)
            .await
            .unwrap();
        assert_eq!(&tail[..], &data[data.len() - 3..]);
        // Let prefetches finish; every block was fetched exactly once.
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        assert_eq!(cache.counters.gets.load(Ordering::Relaxed), 4);
        cache.read("x.log", size, 0..size).await.unwrap();
        assert_eq!(cache.counters.gets.load(Ordering::Relaxed), 4);
    }
}
