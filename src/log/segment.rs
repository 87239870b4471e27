//! One segment: a file of whole record batches, its sparse indexes and, once
//! sealed, a small descriptor (the file set is named in `format::segment`).
//!
//! The descriptor is written last when the segment seals; a sealed segment
//! never changes again, so its files can be uploaded as immutable objects.
//! A segment without a descriptor is the active one, or one a crash caught
//! while sealing; recovery validates it batch by batch.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::index::{write_synced, SegmentIndex, INDEX_INTERVAL_BYTES};
use super::leader_epochs::LeaderEpochs;
use super::producer_state::ProducerStates;
use super::LogError;
use crate::format::batch::{self, BatchHeader, HEADER_LEN};
use crate::format::control::AbortedTxn;
use crate::format::segment::{
    file_name, SegmentMeta, INDEX_EXT, KEY_INDEX_EXT, LOG_EXT, META_EXT, SEGMENT_FORMAT_VERSION,
    SNAPSHOT_EXT, TIME_INDEX_EXT,
};
use bytes::{Bytes, BytesMut};

pub struct Segment {
    base_offset: i64,
    dir: PathBuf,
    file: Arc<File>,
    size: u64,
    next_offset: i64,
    batch_count: u64,
    max_timestamp: i64,
    max_timestamp_position: u64,
    created_ms: i64,
    index: SegmentIndex,
    meta: Option<SegmentMeta>,
    /// Transactions aborted by markers in this segment, oldest first.
    aborted: Vec<AbortedTxn>,
}

/// A batch position found by scanning headers.
#[derive(Debug, Clone, Copy)]
pub struct Located {
    pub position: u64,
    pub header: BatchHeader,
}

impl Segment {
    pub fn create(dir: &Path, base_offset: i64, now_ms: i64) -> Result<Segment, LogError> {
        let path = dir.join(file_name(base_offset, LOG_EXT));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)?;
        sync_dir(dir)?;
        Ok(Segment::empty(dir, base_offset, file, now_ms))
    }

    /// Opens an existing segment. A sealed one is trusted as far as its
    /// descriptor goes (its size must match); anything else is scanned and
    /// validated by CRC, and a torn or corrupt tail is truncated away.
    pub fn open(dir: &Path, base_offset: i64, now_ms: i64) -> Result<Segment, LogError> {
        let path = dir.join(file_name(base_offset, LOG_EXT));
        let file = OpenOptions::new().read(true).write(true).open(&path)?;
        let len = file.metadata()?.len();
        let meta: Option<SegmentMeta> = std::fs::read(dir.join(file_name(base_offset, META_EXT)))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .filter(|m: &SegmentMeta| m.size == len && m.base_offset == base_offset);
        let mut seg = Segment::empty(dir, base_offset, file, now_ms);
        match meta {
            Some(m) => {
                seg.size = m.size;
                seg.next_offset = m.next_offset;
                seg.batch_count = m.batch_count;
                seg.max_timestamp = m.max_timestamp;
                seg.max_timestamp_position = m.max_timestamp_position;
                seg.created_ms = m.created_ms;
                seg.aborted = m.aborted.clone();
                let (ip, tp) = seg.index_paths();
                seg.index = match SegmentIndex::read_files(&ip, &tp) {
                    Some(idx) => idx,
                    None => {
                        tracing::info!(segment = %path.display(), "rebuilding missing index");
                        let idx = seg.rebuild_index()?;
                        idx.write_files(&ip, &tp)?;
                        idx
                    }
                };
                seg.meta = Some(m);
            }
            None => seg.recover(len)?,
        }
        Ok(seg)
    }

    fn empty(dir: &Path, base_offset: i64, file: File, now_ms: i64) -> Segment {
        Segment {
            base_offset,
            dir: dir.to_path_buf(),
            file: Arc::new(file),
            size: 0,
            next_offset: base_offset,
            batch_count: 0,
            max_timestamp: -1,
            max_timestamp_position: 0,
            created_ms: now_ms,
            index: SegmentIndex::default(),
            meta: None,
            aborted: Vec::new(),
        }
    }

    /// Validates every batch from the start and truncates after the last good one.
    fn recover(&mut self, len: u64) -> Result<(), LogError> {
        let mut pos = 0u64;
        let mut header_buf = [0u8; HEADER_LEN];
        let mut expected_next: Option<i64> = None;
        while pos + HEADER_LEN as u64 <= len {
            self.file.read_exact_at(&mut header_buf, pos)?;
            let Ok(Some(h)) = BatchHeader::parse(&header_buf) else {
                break;
            };
            if pos + h.size as u64 > len || expected_next.is_some_and(|n| h.base_offset < n) {
                break;
            }
            let mut data = vec![0u8; h.size];
            self.file.read_exact_at(&mut data, pos)?;
            if batch::compute_crc(&data) != h.crc {
                break;
            }
            self.track(&h, pos, INDEX_INTERVAL_BYTES);
            expected_next = Some(h.last_offset() + 1);
            pos += h.size as u64;
        }
        if pos < len {
            tracing::warn!(
                segment = %self.log_path().display(),
                valid_bytes = pos,
                file_bytes = len,
                "truncating torn or corrupt tail"
            );
            self.file.set_len(pos)?;
            self.file.sync_all()?;
        }
        Ok(())
    }

    fn track(&mut self, h: &BatchHeader, pos: u64, index_interval_bytes: u64) {
        let rel = (h.base_offset - self.base_offset) as u32;
        self.index.on_append(
            rel,
            pos as u32,
            h.size as u32,
            h.max_timestamp,
            index_interval_bytes,
        );
        if h.max_timestamp > self.max_timestamp {
            self.max_timestamp = h.max_timestamp;
            self.max_timestamp_position = pos;
        }
        self.batch_count += 1;
        self.size = pos + h.size as u64;
        self.next_offset = h.last_offset() + 1;
    }

    fn rebuild_index(&self) -> Result<SegmentIndex, LogError> {
        let mut idx = SegmentIndex::default();
        self.scan(0, |loc| {
            let rel = (loc.header.base_offset - self.base_offset) as u32;
            idx.on_append(
                rel,
                loc.position as u32,
                loc.header.size as u32,
                loc.header.max_timestamp,
                INDEX_INTERVAL_BYTES,
            );
            true
        })?;
        Ok(idx)
    }

    /// Appends a batch as its stamped header and its untouched body. The
    /// caller has validated it and assigned offsets.
    pub fn append(
        &mut self,
        header: &[u8],
        body: &[u8],
        stamped: &BatchHeader,
        now_ms: i64,
        index_interval_bytes: u64,
    ) -> Result<(), LogError> {
        debug_assert!(self.meta.is_none(), "append to a sealed segment");
        if self.size == 0 {
            // segment.ms counts from the first batch, not from when the file was made.
            self.created_ms = now_ms;
        }
        let pos = self.size;
        self.file.write_all_at(header, pos)?;
        self.file.write_all_at(body, pos + header.len() as u64)?;
        self.track(stamped, pos, index_interval_bytes);
        Ok(())
    }

    /// Makes the segment immutable: data and indexes on disk, then the descriptor.
    pub fn seal(&mut self, now_ms: i64) -> Result<(), LogError> {
        self.seal_inner(now_ms, None)
    }

    /// Like `seal`, also writing the snapshot of `producers` and `epochs`
    /// (the partition's producer state and leader epoch history as of this
    /// segment's end) before the descriptor, so a sealed segment always has a
    /// complete snapshot.
    pub fn seal_with_producers(
        &mut self,
        now_ms: i64,
        producers: &ProducerStates,
        epochs: &LeaderEpochs,
    ) -> Result<(), LogError> {
        self.seal_inner(now_ms, Some((producers, epochs)))
    }

    fn seal_inner(
        &mut self,
        now_ms: i64,
        state: Option<(&ProducerStates, &LeaderEpochs)>,
    ) -> Result<(), LogError> {
        if self.meta.is_some() {
            return Ok(());
        }
        self.file.sync_all()?;
        let (ip, tp) = self.index_paths();
        self.index.write_files(&ip, &tp)?;
        if let Some((p, epochs)) = state {
            write_synced(
                &self.dir.join(file_name(self.base_offset, SNAPSHOT_EXT)),
                &p.snapshot(self.next_offset, epochs)?,
            )?;
        }
        let meta = SegmentMeta {
            format_version: SEGMENT_FORMAT_VERSION,
            level: 0,
            base_offset: self.base_offset,
            next_offset: self.next_offset,
            size: self.size,
            batch_count: self.batch_count,
            max_timestamp: self.max_timestamp,
            max_timestamp_position: self.max_timestamp_position,
            created_ms: self.created_ms,
            sealed_ms: now_ms,
            keys: None,
            aborted: self.aborted.clone(),
        };
        let json =
            serde_json::to_vec_pretty(&meta).map_err(|e| LogError::Corrupt(e.to_string()))?;
        write_synced(&self.dir.join(file_name(self.base_offset, META_EXT)), &json)?;
        sync_dir(&self.dir)?;
        self.meta = Some(meta);
        Ok(())
    }

    /// A lock-free view of the bytes written so far; sealed bytes never
    /// change and the head only grows, so the view stays valid.
    pub fn reader(&self) -> SegmentReader {
        SegmentReader {
            file: self.file.clone(),
            size: self.size,
        }
    }

    /// Position from which to scan for `offset`.
    pub fn index_position(&self, offset: i64) -> u64 {
        let rel = (offset.max(self.base_offset) - self.base_offset).min(u32::MAX as i64) as u32;
        self.index.lookup_offset(rel) as u64
    }

    /// Position from which to scan for the first batch at or after `timestamp`.
    pub fn time_index_position(&self, timestamp: i64) -> u64 {
        self.index.lookup_offset(self.index.lookup_time(timestamp)) as u64
    }

    fn scan(&self, position: u64, f: impl FnMut(Located) -> bool) -> Result<(), LogError> {
        self.reader().scan(position, f)
    }

    pub fn file(&self) -> Arc<File> {
        self.file.clone()
    }
    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }
    pub fn next_offset(&self) -> i64 {
        self.next_offset
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn max_timestamp(&self) -> i64 {
        self.max_timestamp
    }
    pub fn max_timestamp_position(&self) -> u64 {
        self.max_timestamp_position
    }
    pub fn created_ms(&self) -> i64 {
        self.created_ms
    }
    pub fn is_empty(&self) -> bool {
        self.size == 0
    }
    /// The transactions aborted by markers in this segment.
    pub fn aborted(&self) -> &[AbortedTxn] {
        &self.aborted
    }

    /// Records a transaction aborted by a marker appended to this
    /// (unsealed) segment.
    pub fn push_aborted(&mut self, aborted: AbortedTxn) {
        debug_assert!(self.meta.is_none(), "aborted entry for a sealed segment");
        self.aborted.push(aborted);
    }

    pub fn meta(&self) -> Option<&SegmentMeta> {
        self.meta.as_ref()
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join(file_name(self.base_offset, LOG_EXT))
    }

    fn index_paths(&self) -> (PathBuf, PathBuf) {
        (
            self.dir.join(file_name(self.base_offset, INDEX_EXT)),
            self.dir.join(file_name(self.base_offset, TIME_INDEX_EXT)),
        )
    }

    /// Removes every file of the segment.
    pub fn delete_files(&self) -> Result<(), LogError> {
        // `keyindex` is written by compaction after sealing, when the topic is compacted.
        self.remove_files(&[
            META_EXT,
            SNAPSHOT_EXT,
            KEY_INDEX_EXT,
            INDEX_EXT,
            TIME_INDEX_EXT,
            LOG_EXT,
        ])
    }

    /// Removes the segment's files except its producer snapshot, which
    /// stays the partition's starting state once the data is only in the store.
    pub fn release_files(&self) -> Result<(), LogError> {
        self.remove_files(&[META_EXT, KEY_INDEX_EXT, INDEX_EXT, TIME_INDEX_EXT, LOG_EXT])
    }

    fn remove_files(&self, exts: &[&str]) -> Result<(), LogError> {
        for ext in exts {
            match std::fs::remove_file(self.dir.join(file_name(self.base_offset, ext))) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
        Ok(())
    }
}

pub struct SegmentReader {
    file: Arc<File>,
    size: u64,
}

impl SegmentReader {
    /// Visits batch headers from `position` on until `f` returns false.
    pub fn scan(
        &self,
        mut position: u64,
        mut f: impl FnMut(Located) -> bool,
    ) -> Result<(), LogError> {
        let mut header_buf = [0u8; HEADER_LEN];
        while position + HEADER_LEN as u64 <= self.size {
            self.file.read_exact_at(&mut header_buf, position)?;
            let header = BatchHeader::parse(&header_buf)?
                .ok_or_else(|| LogError::Corrupt("short header inside segment".into()))?;
            if !f(Located { position, header }) {
                break;
            }
            position += header.size as u64;
        }
        Ok(())
    }

    /// The first batch from `position` on holding an offset at or after `offset`.
    pub fn locate(&self, position: u64, offset: i64) -> Result<Option<Located>, LogError> {
        self.find(position, |h| h.last_offset() >= offset)
    }

    /// The first batch from `position` on whose max timestamp is at or after `timestamp`.
    pub fn locate_time(&self, position: u64, timestamp: i64) -> Result<Option<Located>, LogError> {
        self.find(position, |h| h.max_timestamp >= timestamp)
    }

    fn find(
        &self,
        position: u64,
        pred: impl Fn(&BatchHeader) -> bool,
    ) -> Result<Option<Located>, LogError> {
        let mut found = None;
        self.scan(position, |loc| {
            if pred(&loc.header) {
                found = Some(loc);
                false
            } else {
                true
            }
        })?;
        Ok(found)
    }

    /// Reads up to `len` bytes at `position`, never past the view's end.
    pub fn read_at(&self, position: u64, len: usize) -> Result<Bytes, LogError> {
        let len = len.min(self.size.saturating_sub(position) as usize);
        read_range(&self.file, position, len)
    }

    pub fn size(&self) -> u64 {
        self.size
    }
}

/// Reads `len` bytes at `position` (fewer at end of file) into one buffer.
fn read_range(file: &File, position: u64, len: usize) -> Result<Bytes, LogError> {
    let mut buf = BytesMut::zeroed(len);
    let mut filled = 0;
    while filled < len {
        let n = file.read_at(&mut buf[filled..], position + filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    buf.truncate(filled);
    Ok(buf.freeze())
}

pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)?.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::batch::{stamp_header, tests::make_batch};
    use std::io::Write;

    fn append_n(seg: &mut Segment, n: usize) {
        for _ in 0..n {
            let raw = make_batch(2, -1, -1, -1, 100);
            let s = stamp_header(&raw, seg.next_offset(), 0, None);
            let h = BatchHeader::parse(&s).unwrap().unwrap();
            seg.append(&s, &raw[HEADER_LEN..], &h, 0, INDEX_INTERVAL_BYTES)
                .unwrap();
        }
    }

    #[test]
    fn recovery_truncates_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 0, 0).unwrap();
        append_n(&mut seg, 3);
        let good = seg.size();
        drop(seg);
        let path = dir.path().join(file_name(0, "log"));
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&make_batch(2, -1, -1, -1, 0)[..30]).unwrap();
        let seg = Segment::open(dir.path(), 0, 0).unwrap();
        assert_eq!(seg.size(), good);
        assert_eq!(seg.next_offset(), 6);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), good);
    }

    #[test]
    fn recovery_truncates_at_bad_crc() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 0, 0).unwrap();
        append_n(&mut seg, 3);
        let size = seg.size();
        drop(seg);
        let path = dir.path().join(file_name(0, "log"));
        let mut bytes = std::fs::read(&path).unwrap();
        let last = bytes.len() - 2;
        bytes[last] ^= 0x55;
        std::fs::write(&path, &bytes).unwrap();
        let seg = Segment::open(dir.path(), 0, 0).unwrap();
        assert_eq!(seg.next_offset(), 4);
        assert!(seg.size() < size);
    }

    #[test]
    fn sealed_segment_reopens_from_descriptor_and_rebuilds_lost_index() {
        let dir = tempfile::tempdir().unwrap();
        let mut seg = Segment::create(dir.path(), 10, 0).unwrap();
        append_n(&mut seg, 100);
        seg.seal(5).unwrap();
        let expected = seg
            .reader()
            .locate(seg.index_position(51), 51)
            .unwrap()
            .unwrap()
            .position;
        std::fs::remove_file(dir.path().join(file_name(10, "index"))).unwrap();
        let seg = Segment::open(dir.path(), 10, 0).unwrap();
        assert_eq!(seg.meta().unwrap().next_offset, 210);
        assert_eq!(
            seg.reader()
                .locate(seg.index_position(51), 51)
                .unwrap()
                .unwrap()
                .position,
            expected
        );
        assert!(dir.path().join(file_name(10, "index")).exists());
    }
}
