//! A tiered segment as a merge source, read straight from the object store.
//!
//! The merge is synchronous and sequential, so a source is a plain `Read`
//! that fetches the object in ranged GETs of `CHUNK` bytes as it goes: memory
//! is one chunk per open stream whatever the segment's size, and nothing is
//! staged on disk. Runs on a blocking thread and drives the async store
//! through the runtime handle it was given.
//!
//! A source no bigger than one chunk costs one GET however it is read, so
//! [`StoreSegment::fetch`] reads such a segment whole, up front, in async
//! code: a small merge then needs neither a blocking thread nor the runtime
//! handle, and runs in the task that asked for it (see `job`), which also
//! keeps it on a simulation's paused clock.

use std::fs::File;
use std::io::{BufWriter, Read};
use std::path::PathBuf;
use std::sync::Arc;

use bytes::{Buf, Bytes};
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::runtime::Handle;

use super::io::SegmentSource;
use super::CompactionError;
use crate::format::batch::BatchStream;
use crate::format::segment::SegmentMeta;
use crate::format::segment::{KEY_INDEX_EXT, LOG_EXT};
use crate::log::key_index::{add_batch_records, KeyIndexBuilder, DEFAULT_BUILD_BUDGET};
use crate::manifest::{ManifestError, TieredSegment};

pub(crate) const CHUNK: u64 = 4 << 20;

pub struct StoreSegment {
    store: Arc<dyn ObjectStore>,
    key: String,
    meta: SegmentMeta,
    body: Body,
    /// Where a missing key index is built.
    scratch: PathBuf,
}

/// Where a source's bytes come from.
enum Body {
    /// Ranged GETs as the merge reads, through this runtime.
    Streamed(Handle),
    /// Read whole before the merge; no key index object if `None`.
    Fetched {
        log: Bytes,
        key_index: Option<Bytes>,
    },
}

impl StoreSegment {
    pub fn new(
        store: Arc<dyn ObjectStore>,
        segment: &TieredSegment,
        handle: Handle,
        scratch: PathBuf,
    ) -> StoreSegment {
        StoreSegment {
            store,
            key: segment.key.clone(),
            meta: segment.to_meta(),
            body: Body::Streamed(handle),
            scratch,
        }
    }

    /// The segment read whole now: its log and its key index, if it has one.
    pub async fn fetch(
        store: Arc<dyn ObjectStore>,
        segment: &TieredSegment,
        scratch: PathBuf,
    ) -> Result<StoreSegment, CompactionError> {
        let object = |ext: &str| Path::from(format!("{}.{ext}", segment.key));
        let log = get_all(&store, &object(LOG_EXT))
            .await
            .map_err(ManifestError::from)?;
        if log.len() as u64 != segment.size {
            return Err(CompactionError::InvalidMerge(format!(
                "{} holds {} bytes, its manifest entry {}",
                object(LOG_EXT),
                log.len(),
                segment.size
            )));
        }
        let key_index = match get_all(&store, &object(KEY_INDEX_EXT)).await {
            Ok(bytes) => Some(bytes),
            Err(object_store::Error::NotFound { .. }) => None,
            Err(e) => return Err(ManifestError::from(e).into()),
        };
        Ok(StoreSegment {
            store,
            key: segment.key.clone(),
            meta: segment.to_meta(),
            body: Body::Fetched { log, key_index },
            scratch,
        })
    }

    fn streamed(&self, handle: &Handle, ext: &str, size: u64) -> ObjectReader {
        ObjectReader {
            store: self.store.clone(),
            path: Path::from(format!("{}.{ext}", self.key)),
            size,
            position: 0,
            chunk: Bytes::new(),
            handle: handle.clone(),
        }
    }

    fn log_reader(&self) -> Box<dyn Read + Send + '_> {
        match &self.body {
            Body::Streamed(handle) => Box::new(self.streamed(handle, LOG_EXT, self.meta.size)),
            Body::Fetched { log, .. } => Box::new(log.clone().reader()),
        }
    }

    /// Segments sealed before key indexes were uploaded (or whose index was
    /// still being built at upload) get one built here from the log, spilled
    /// to the scratch directory with the same bounded budget as at seal time.
    fn build_key_index(&self) -> Result<File, CompactionError> {
        std::fs::create_dir_all(&self.scratch)?;
        let mut builder =
            KeyIndexBuilder::new(self.meta.base_offset, DEFAULT_BUILD_BUDGET, &self.scratch);
        let mut stream = BatchStream::new(self.log_reader());
        while let Some((header, bytes)) = stream.next_batch()? {
            add_batch_records(&mut builder, &header, bytes)?;
        }
        // Only a unique scratch name, removed below once open.
        #[allow(clippy::disallowed_methods)]
        let path = self.scratch.join(format!(
            "{}.{}",
            uuid::Uuid::new_v4().simple(),
            KEY_INDEX_EXT
        ));
        let out = builder.finish(BufWriter::new(File::create(&path)?))?;
        drop(out.into_inner().map_err(|e| e.into_error())?);
        let file = File::open(&path)?;
        // Open files outlive their name: nothing to clean up later.
        std::fs::remove_file(&path)?;
        Ok(file)
    }
}

impl SegmentSource for StoreSegment {
    fn meta(&self) -> &SegmentMeta {
        &self.meta
    }

    fn log(&self) -> Result<Box<dyn Read + Send + '_>, CompactionError> {
        Ok(self.log_reader())
    }

    fn key_index(&self) -> Result<Box<dyn Read + Send + '_>, CompactionError> {
        let handle = match &self.body {
            Body::Streamed(handle) => handle,
            Body::Fetched {
                key_index: Some(bytes),
                ..
            } => return Ok(Box::new(bytes.clone().reader())),
            Body::Fetched {
                key_index: None, ..
            } => return Ok(Box::new(self.build_key_index()?)),
        };
        let path = Path::from(format!("{}.{KEY_INDEX_EXT}", self.key));
        match handle.block_on(self.store.head(&path)) {
            Ok(head) => Ok(Box::new(self.streamed(handle, KEY_INDEX_EXT, head.size))),
            Err(object_store::Error::NotFound { .. }) => Ok(Box::new(self.build_key_index()?)),
            Err(e) => Err(ManifestError::from(e).into()),
        }
    }
}

async fn get_all(store: &Arc<dyn ObjectStore>, path: &Path) -> object_store::Result<Bytes> {
    store.get(path).await?.bytes().await
}

/// Sequential reads of one object through ranged GETs.
struct ObjectReader {
    store: Arc<dyn ObjectStore>,
    path: Path,
    size: u64,
    position: u64,
    chunk: Bytes,
    handle: Handle,
}

impl Read for ObjectReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.chunk.is_empty() {
            if self.position >= self.size {
                return Ok(0);
            }
            let end = (self.position + CHUNK).min(self.size);
            self.chunk = self
                .handle
                .block_on(self.store.get_range(&self.path, self.position..end))
                .map_err(std::io::Error::other)?;
            if self.chunk.is_empty() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("{} ended at {} of {}", self.path, self.position, self.size),
                ));
            }
            self.position += self.chunk.len() as u64;
        }
        let n = buf.len().min(self.chunk.len());
        buf[..n].copy_from_slice(&self.chunk[..n]);
        self.chunk.advance(n);
        Ok(n)
    }
}
