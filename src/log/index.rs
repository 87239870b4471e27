//! Sparse offset and time indexes of one segment.
//!
//! An entry is added every `index.interval.bytes` of log (4096 unless the
//! topic says otherwise; recovery and merges use the default), so a lookup lands
//! within a few KiB of the wanted batch and a short header scan finishes it.
//! The active segment keeps its indexes in memory only (recovery rebuilds them
//! from the log); sealing writes them next to the log as immutable files in the
//! same big-endian layout Kafka uses, ready to be uploaded with the segment.

use std::io::Write;
use std::path::Path;

use bytes::{Buf, BufMut};

use super::LogError;

pub const INDEX_INTERVAL_BYTES: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffsetEntry {
    /// Offset relative to the segment's base offset.
    pub relative_offset: u32,
    pub position: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeEntry {
    pub timestamp: i64,
    pub relative_offset: u32,
}

#[derive(Debug, Default, Clone)]
pub struct SegmentIndex {
    offsets: Vec<OffsetEntry>,
    times: Vec<TimeEntry>,
    bytes_since_last_entry: u64,
}

impl SegmentIndex {
    /// Records a batch appended at `position`; the first batch after each
    /// interval gets an entry, and the time index only grows with time.
    pub fn on_append(
        &mut self,
        relative_offset: u32,
        position: u32,
        size: u32,
        max_timestamp: i64,
        interval_bytes: u64,
    ) {
        if self.offsets.is_empty() || self.bytes_since_last_entry >= interval_bytes {
            self.offsets.push(OffsetEntry {
                relative_offset,
                position,
            });
            if self
                .times
                .last()
                .is_none_or(|t| max_timestamp > t.timestamp)
            {
                self.times.push(TimeEntry {
                    timestamp: max_timestamp,
                    relative_offset,
                });
            }
            self.bytes_since_last_entry = 0;
        }
        self.bytes_since_last_entry += size as u64;
    }

    /// Position of the last indexed batch starting at or before `relative_offset`.
    pub fn lookup_offset(&self, relative_offset: u32) -> u32 {
        let i = self
            .offsets
            .partition_point(|e| e.relative_offset <= relative_offset);
        if i == 0 {
            0
        } else {
            self.offsets[i - 1].position
        }
    }

    /// Relative offset from which to scan for the first record with a
    /// timestamp at or after `timestamp`.
    pub fn lookup_time(&self, timestamp: i64) -> u32 {
        let i = self.times.partition_point(|e| e.timestamp < timestamp);
        if i == 0 {
            0
        } else {
            self.times[i - 1].relative_offset
        }
    }

    /// Drops entries at or beyond `position` (after a truncation).
    pub fn truncate_to_position(&mut self, position: u32) {
        self.offsets.retain(|e| e.position < position);
        let last = self.offsets.last().map(|e| e.relative_offset);
        self.times
            .retain(|t| last.is_some_and(|l| t.relative_offset <= l));
        self.bytes_since_last_entry = INDEX_INTERVAL_BYTES;
    }

    pub fn write_files(&self, offset_path: &Path, time_path: &Path) -> Result<(), LogError> {
        let (offsets, times) = self.encode();
        write_synced(offset_path, &offsets)?;
        write_synced(time_path, &times)
    }

    /// The bytes of the offset and time index files.
    pub fn encode(&self) -> (Vec<u8>, Vec<u8>) {
        let mut offsets = Vec::with_capacity(self.offsets.len() * 8);
        for e in &self.offsets {
            offsets.put_u32(e.relative_offset);
            offsets.put_u32(e.position);
        }
        let mut times = Vec::with_capacity(self.times.len() * 12);
        for e in &self.times {
            times.put_i64(e.timestamp);
            times.put_u32(e.relative_offset);
        }
        (offsets, times)
    }

    /// Loads index files; `None` if either is missing or malformed, in which
    /// case the caller rebuilds them from the log.
    pub fn read_files(offset_path: &Path, time_path: &Path) -> Option<SegmentIndex> {
        let offsets = std::fs::read(offset_path).ok()?;
        let times = std::fs::read(time_path).ok()?;
        SegmentIndex::from_bytes(&offsets, &times)
    }

    /// Parses the two index files' contents (also as fetched from the object store).
    pub fn from_bytes(offsets: &[u8], times: &[u8]) -> Option<SegmentIndex> {
        if !offsets.len().is_multiple_of(8) || !times.len().is_multiple_of(12) {
            return None;
        }
        let mut idx = SegmentIndex::default();
        let mut b = offsets;
        while b.has_remaining() {
            idx.offsets.push(OffsetEntry {
                relative_offset: b.get_u32(),
                position: b.get_u32(),
            });
        }
        let mut b = times;
        while b.has_remaining() {
            idx.times.push(TimeEntry {
                timestamp: b.get_i64(),
                relative_offset: b.get_u32(),
            });
        }
        idx.bytes_since_last_entry = INDEX_INTERVAL_BYTES;
        Some(idx)
    }
}

/// Writes a whole file durably: temp file, fsync, rename, so readers never see
/// a half-written file.
pub fn write_synced(path: &Path, data: &[u8]) -> Result<(), LogError> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(data)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_lookup_and_roundtrip() {
        let mut idx = SegmentIndex::default();
        for i in 0..100u32 {
            idx.on_append(i, i * 1000, 1000, 10 * i as i64, INDEX_INTERVAL_BYTES);
        }
        // an entry every ~4 KiB: batches 0, 5, 10, ...
        assert_eq!(idx.lookup_offset(0), 0);
        assert_eq!(idx.lookup_offset(7), 5000);
        assert_eq!(idx.lookup_time(72), 5);
        let dir = tempfile::tempdir().unwrap();
        let (o, t) = (dir.path().join("a.index"), dir.path().join("a.timeindex"));
        idx.write_files(&o, &t).unwrap();
        let back = SegmentIndex::read_files(&o, &t).unwrap();
        assert_eq!(back.offsets, idx.offsets);
        assert_eq!(back.times, idx.times);
    }
}
