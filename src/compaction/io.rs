//! Where a merge reads its sources and writes its output.
//!
//! A merge needs very little from storage: each source as one sequential
//! stream of batches plus one sequential stream of its key index, and an
//! output it can append to and then publish, descriptor last. Those two
//! traits are all it sees, so the same merge runs against local segment
//! files (implemented here) and against objects in a store (a ranged GET and
//! a multipart upload, implemented with tiered storage).

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use super::CompactionError;
use crate::format::segment::{
    file_name, SegmentMeta, INDEX_EXT, KEY_INDEX_EXT, LOG_EXT, META_EXT, TIME_INDEX_EXT,
};
use crate::log::index::write_synced;
use crate::log::key_index;
use crate::log::segment::sync_dir;

/// The output log's write buffer.
const WRITE_BUFFER: usize = 1 << 20;

/// One sealed segment as a merge input.
pub trait SegmentSource {
    /// The segment's descriptor (offsets, level, size).
    fn meta(&self) -> &SegmentMeta;
    /// The `.log` bytes from the start, read sequentially once.
    fn log(&self) -> Result<Box<dyn Read + Send + '_>, CompactionError>;
    /// The key index bytes, read sequentially once.
    fn key_index(&self) -> Result<Box<dyn Read + Send + '_>, CompactionError>;
}

/// The output of a merge. Nothing written is visible until `finish`
/// returns; an implementation publishes the descriptor last so a crash
/// leaves either nothing or a whole segment.
pub trait SegmentSink {
    /// Appends to the output's `.log`.
    fn append_log(&mut self, bytes: &[u8]) -> Result<(), CompactionError>;
    /// Appends to the output's key index.
    fn append_key_index(&mut self, bytes: &[u8]) -> Result<(), CompactionError>;
    /// Writes the sparse indexes and then the descriptor, making the output whole.
    fn finish(
        &mut self,
        offset_index: &[u8],
        time_index: &[u8],
        meta: &SegmentMeta,
    ) -> Result<(), CompactionError>;
}

/// Adapts a sink's key index stream to `Write` for `KeyIndexWriter`.
pub(crate) struct KeyIndexSink<'a>(pub &'a mut dyn SegmentSink);

impl Write for KeyIndexSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .append_key_index(buf)
            .map_err(std::io::Error::other)?;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A sealed segment in a local partition directory.
pub struct LocalSegment {
    dir: PathBuf,
    meta: SegmentMeta,
}

impl LocalSegment {
    /// Opens the sealed segment based at `base_offset`; only its descriptor
    /// is read, and a segment without one (the active one) is refused.
    pub fn open(dir: &Path, base_offset: i64) -> Result<LocalSegment, CompactionError> {
        let raw = std::fs::read(dir.join(file_name(base_offset, META_EXT))).map_err(|e| {
            CompactionError::InvalidMerge(format!(
                "segment {base_offset} in {} is not sealed: {e}",
                dir.display()
            ))
        })?;
        let meta: SegmentMeta = serde_json::from_slice(&raw)
            .map_err(|e| CompactionError::InvalidMerge(format!("bad descriptor: {e}")))?;
        Ok(LocalSegment {
            dir: dir.to_path_buf(),
            meta,
        })
    }

    /// Every sealed segment of a partition directory, oldest first.
    pub fn list(dir: &Path) -> Result<Vec<LocalSegment>, CompactionError> {
        let mut bases = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            if let Some(base) = name
                .to_string_lossy()
                .strip_suffix(".meta")
                .and_then(|b| b.parse::<i64>().ok())
            {
                bases.push(base);
            }
        }
        bases.sort_unstable();
        bases.into_iter().map(|b| Self::open(dir, b)).collect()
    }

    pub fn key_index_path(&self) -> PathBuf {
        self.dir
            .join(file_name(self.meta.base_offset, KEY_INDEX_EXT))
    }

    /// Builds the key index if the segment has none yet (sealed before its
    /// topic became compacted, or a crash between seal and index).
    pub fn ensure_key_index(&self) -> Result<PathBuf, CompactionError> {
        Ok(key_index::ensure_for_segment(
            &self.dir,
            self.meta.base_offset,
        )?)
    }
}

impl SegmentSource for LocalSegment {
    fn meta(&self) -> &SegmentMeta {
        &self.meta
    }
    fn log(&self) -> Result<Box<dyn Read + Send + '_>, CompactionError> {
        let f = File::open(self.dir.join(file_name(self.meta.base_offset, LOG_EXT)))?;
        // The descriptor's size bounds the read: bytes past it are not part
        // of the sealed segment.
        Ok(Box::new(f.take(self.meta.size)))
    }
    fn key_index(&self) -> Result<Box<dyn Read + Send + '_>, CompactionError> {
        Ok(Box::new(File::open(self.ensure_key_index()?)?))
    }
}

/// Writes a merged segment into a local directory: temporary files first,
/// renamed into place, descriptor last.
pub struct LocalSink {
    dir: PathBuf,
    base_offset: i64,
    log: Option<BufWriter<File>>,
    key_index: Option<BufWriter<File>>,
    finished: bool,
}

impl LocalSink {
    pub fn create(dir: &Path, base_offset: i64) -> Result<LocalSink, CompactionError> {
        for ext in [LOG_EXT, META_EXT] {
            if dir.join(file_name(base_offset, ext)).exists() {
                return Err(CompactionError::InvalidMerge(format!(
                    "{} already has a segment at {base_offset}; write the output elsewhere",
                    dir.display()
                )));
            }
        }
        let mut sink = LocalSink {
            dir: dir.to_path_buf(),
            base_offset,
            log: None,
            key_index: None,
            finished: false,
        };
        sink.log = Some(BufWriter::with_capacity(
            WRITE_BUFFER,
            File::create(sink.tmp(LOG_EXT))?,
        ));
        Ok(sink)
    }

    fn tmp(&self, ext: &str) -> PathBuf {
        self.dir
            .join(format!("{}.merge.tmp", file_name(self.base_offset, ext)))
    }

    fn publish(&self, w: BufWriter<File>, ext: &str) -> Result<(), CompactionError> {
        let f = w.into_inner().map_err(|e| e.into_error())?;
        f.sync_all()?;
        std::fs::rename(
            self.tmp(ext),
            self.dir.join(file_name(self.base_offset, ext)),
        )?;
        Ok(())
    }
}

impl SegmentSink for LocalSink {
    fn append_log(&mut self, bytes: &[u8]) -> Result<(), CompactionError> {
        match &mut self.log {
            Some(w) => Ok(w.write_all(bytes)?),
            None => Err(CompactionError::InvalidMerge(
                "sink already finished".into(),
            )),
        }
    }

    fn append_key_index(&mut self, bytes: &[u8]) -> Result<(), CompactionError> {
        if self.key_index.is_none() {
            self.key_index = Some(BufWriter::new(File::create(self.tmp(KEY_INDEX_EXT))?));
        }
        Ok(self
            .key_index
            .as_mut()
            .expect("just created")
            .write_all(bytes)?)
    }

    fn finish(
        &mut self,
        offset_index: &[u8],
        time_index: &[u8],
        meta: &SegmentMeta,
    ) -> Result<(), CompactionError> {
        let log = self
            .log
            .take()
            .ok_or_else(|| CompactionError::InvalidMerge("sink already finished".into()))?;
        self.publish(log, LOG_EXT)?;
        if let Some(k) = self.key_index.take() {
            self.publish(k, KEY_INDEX_EXT)?;
        }
        write_synced(
            &self.dir.join(file_name(self.base_offset, INDEX_EXT)),
            offset_index,
        )?;
        write_synced(
            &self.dir.join(file_name(self.base_offset, TIME_INDEX_EXT)),
            time_index,
        )?;
        let json = serde_json::to_vec_pretty(meta).map_err(std::io::Error::other)?;
        write_synced(&self.dir.join(file_name(self.base_offset, META_EXT)), &json)?;
        sync_dir(&self.dir)?;
        self.finished = true;
        Ok(())
    }
}

impl Drop for LocalSink {
    fn drop(&mut self) {
        if !self.finished {
            for ext in [LOG_EXT, KEY_INDEX_EXT] {
                let _ = std::fs::remove_file(self.tmp(ext));
            }
        }
    }
}
