//! The key index of a sealed segment: its keys, by hash, with the offset of
//! each key's newest record in the segment.
//!
//! A merge of compacted segments must know, for every key, which record is
//! the newest across all of its sources. Kafka answers that with an in-memory
//! hash table over the dirty log; here every segment answers it once for
//! itself, at seal time, as a file sorted by key hash. Merging N such files is
//! a streaming merge sort whose memory is N read buffers, and the same merge
//! writes the output segment's key index as a by-product, already sorted.
//!
//! Building the index decodes (and decompresses) every batch of the segment,
//! which is why it happens after sealing and never on the produce or fetch
//! path. A segment may hold more distinct keys than fit the memory budget, so
//! the builder sorts in runs: when its buffer fills it sorts, de-duplicates
//! and spills the buffer to a temporary file, and at the end merges the runs.
//!
//! File format (`<base>.keyindex`, big-endian):
//!
//! ```text
//! header   "SKIX" | version u16 | reserved u16 | base_offset i64 | producers u32 | reserved u32
//! producers × (producer_id i64, base offset of its last batch i64), by producer id
//! entries  × (hash u128 | offset - base_offset u32 | timestamp i64 |
//!             max timestamp of any version of the key i64 | flags u8)   by hash
//! footer   entry count u64 | CRC-32C of everything before it u32
//! ```
//!
//! The counts sit in the footer so the file can be written in one pass to a
//! stream (an object-store upload) without knowing them up front; a reader
//! tells the footer apart by holding back its last 12 bytes.
//!
//! The producer section exists for idempotent producers: a merge must keep
//! the last batch of every producer id, even when compaction empties it, and
//! it learns which batch that is here without a pass over the sources.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};

use bytes::{Buf, BufMut};
use kafka_protocol::records::RecordBatchDecoder;

use super::io::BatchStream;
use super::records::key_hash;
use super::CompactionError;
use crate::log::batch::BatchHeader;
use crate::log::segment::{file_name, sync_dir};

pub const KEY_INDEX_EXT: &str = "keyindex";
const MAGIC: &[u8; 4] = b"SKIX";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 24;
const PRODUCER_LEN: usize = 16;
pub const ENTRY_LEN: usize = 37;
const FOOTER_LEN: usize = 12;
const FLAG_TOMBSTONE: u8 = 1;

/// Entries held in memory while building before a run is spilled: about
/// 48 bytes each, so 12 MiB.
pub const DEFAULT_BUILD_BUDGET: usize = 256 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEntry {
    pub hash: u128,
    /// Offset of the key's newest record (absolute).
    pub offset: i64,
    /// Timestamp of that record.
    pub timestamp: i64,
    /// Newest timestamp among every version of the key that was seen. A merge
    /// may drop a tombstone only if no older version of its key is young
    /// enough to be kept by min.compaction.lag.ms, or the old value would come
    /// back; this field lets it tell without reading the records.
    pub max_version_timestamp: i64,
    /// The newest record has a null value.
    pub tombstone: bool,
}

impl KeyEntry {
    /// Folds two entries of one key: the higher offset wins, timestamps merge.
    pub fn combine(self, other: KeyEntry) -> KeyEntry {
        debug_assert_eq!(self.hash, other.hash);
        let (newer, older) = if self.offset >= other.offset {
            (self, other)
        } else {
            (other, self)
        };
        KeyEntry {
            max_version_timestamp: newer.max_version_timestamp.max(older.max_version_timestamp),
            ..newer
        }
    }
}

/// The last batch of one producer id within a segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerLast {
    pub producer_id: i64,
    pub batch_base_offset: i64,
}

/// Writes a key index to any byte stream in one pass.
pub struct KeyIndexWriter<W: Write> {
    out: W,
    base_offset: i64,
    crc: u32,
    count: u64,
    last_hash: Option<u128>,
}

impl<W: Write> KeyIndexWriter<W> {
    pub fn new(
        mut out: W,
        base_offset: i64,
        producers: &[ProducerLast],
    ) -> Result<Self, CompactionError> {
        let mut head = Vec::with_capacity(HEADER_LEN + producers.len() * PRODUCER_LEN);
        head.extend_from_slice(MAGIC);
        head.put_u16(VERSION);
        head.put_u16(0);
        head.put_i64(base_offset);
        head.put_u32(producers.len() as u32);
        head.put_u32(0);
        for p in producers {
            head.put_i64(p.producer_id);
            head.put_i64(p.batch_base_offset);
        }
        out.write_all(&head)?;
        Ok(KeyIndexWriter {
            out,
            base_offset,
            crc: crc32c::crc32c(&head),
            count: 0,
            last_hash: None,
        })
    }

    pub fn push(&mut self, e: &KeyEntry) -> Result<(), CompactionError> {
        if self.last_hash.is_some_and(|h| h >= e.hash) {
            return Err(CompactionError::CorruptIndex(
                "entries must be pushed in increasing hash order".into(),
            ));
        }
        let rel = u32::try_from(e.offset - self.base_offset).map_err(|_| {
            CompactionError::CorruptIndex(format!(
                "offset {} is outside the segment based at {}",
                e.offset, self.base_offset
            ))
        })?;
        let mut b = [0u8; ENTRY_LEN];
        let mut w = &mut b[..];
        w.put_u128(e.hash);
        w.put_u32(rel);
        w.put_i64(e.timestamp);
        w.put_i64(e.max_version_timestamp);
        w.put_u8(if e.tombstone { FLAG_TOMBSTONE } else { 0 });
        self.out.write_all(&b)?;
        self.crc = crc32c::crc32c_append(self.crc, &b);
        self.count += 1;
        self.last_hash = Some(e.hash);
        Ok(())
    }

    pub fn finish(mut self) -> Result<W, CompactionError> {
        let mut f = [0u8; FOOTER_LEN];
        let mut w = &mut f[..8];
        w.put_u64(self.count);
        let crc = crc32c::crc32c_append(self.crc, &f[..8]);
        (&mut f[8..]).put_u32(crc);
        self.out.write_all(&f)?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// Reads a key index sequentially from any byte stream, checking its CRC
/// when the footer arrives.
pub struct KeyIndexReader<R: Read> {
    input: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    done: bool,
    base_offset: i64,
    producers: Vec<ProducerLast>,
    crc: u32,
    count: u64,
}

const READ_CHUNK: usize = 64 * 1024;

impl<R: Read> KeyIndexReader<R> {
    pub fn new(input: R) -> Result<Self, CompactionError> {
        let mut r = KeyIndexReader {
            input,
            buf: vec![0; READ_CHUNK],
            start: 0,
            end: 0,
            eof: false,
            done: false,
            base_offset: 0,
            producers: Vec::new(),
            crc: 0,
            count: 0,
        };
        if !r.fill(HEADER_LEN)? {
            return Err(CompactionError::CorruptIndex(
                "shorter than a header".into(),
            ));
        }
        let head = r.take(HEADER_LEN);
        if &head[..4] != MAGIC {
            return Err(CompactionError::CorruptIndex("bad magic".into()));
        }
        let mut h = &head[4..];
        let version = h.get_u16();
        if version != VERSION {
            return Err(CompactionError::CorruptIndex(format!(
                "unsupported version {version}"
            )));
        }
        h.advance(2);
        r.base_offset = h.get_i64();
        let producers = h.get_u32() as usize;
        r.crc = crc32c::crc32c(&head);
        for _ in 0..producers {
            if !r.fill(PRODUCER_LEN)? {
                return Err(CompactionError::CorruptIndex("truncated producers".into()));
            }
            let p = r.take(PRODUCER_LEN);
            r.crc = crc32c::crc32c_append(r.crc, &p);
            let mut p = &p[..];
            r.producers.push(ProducerLast {
                producer_id: p.get_i64(),
                batch_base_offset: p.get_i64(),
            });
        }
        Ok(r)
    }

    /// Makes at least `n` unread bytes available; false at end of input.
    fn fill(&mut self, n: usize) -> Result<bool, CompactionError> {
        while self.end - self.start < n && !self.eof {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() < n {
                self.buf.resize(n.max(READ_CHUNK), 0);
            }
            let got = self.input.read(&mut self.buf[self.end..])?;
            if got == 0 {
                self.eof = true;
            }
            self.end += got;
        }
        Ok(self.end - self.start >= n)
    }

    fn take(&mut self, n: usize) -> Vec<u8> {
        let v = self.buf[self.start..self.start + n].to_vec();
        self.start += n;
        v
    }

    pub fn base_offset(&self) -> i64 {
        self.base_offset
    }

    pub fn producers(&self) -> &[ProducerLast] {
        &self.producers
    }

    pub fn next_entry(&mut self) -> Result<Option<KeyEntry>, CompactionError> {
        if self.done {
            return Ok(None);
        }
        // An entry is there only if a whole footer still follows it.
        if !self.fill(ENTRY_LEN + FOOTER_LEN)? {
            let left = self.end - self.start;
            if left != FOOTER_LEN {
                return Err(CompactionError::CorruptIndex(format!(
                    "{left} trailing bytes are neither an entry nor a footer"
                )));
            }
            let f = self.take(FOOTER_LEN);
            let count = (&f[..8]).get_u64();
            let crc = crc32c::crc32c_append(self.crc, &f[..8]);
            if count != self.count || crc != (&f[8..]).get_u32() {
                return Err(CompactionError::CorruptIndex(
                    "footer count or CRC does not match".into(),
                ));
            }
            self.done = true;
            return Ok(None);
        }
        let raw = &self.buf[self.start..self.start + ENTRY_LEN];
        self.crc = crc32c::crc32c_append(self.crc, raw);
        let mut b = raw;
        let hash = b.get_u128();
        let rel = b.get_u32();
        let timestamp = b.get_i64();
        let max_version_timestamp = b.get_i64();
        let flags = b.get_u8();
        self.start += ENTRY_LEN;
        self.count += 1;
        Ok(Some(KeyEntry {
            hash,
            offset: self.base_offset + rel as i64,
            timestamp,
            max_version_timestamp,
            tombstone: flags & FLAG_TOMBSTONE != 0,
        }))
    }

    /// Reads every remaining entry (tests and small indexes only).
    pub fn read_all(&mut self) -> Result<Vec<KeyEntry>, CompactionError> {
        let mut v = Vec::new();
        while let Some(e) = self.next_entry()? {
            v.push(e);
        }
        Ok(v)
    }
}

/// Sorts by (hash, offset) and folds each key's entries into one.
fn sort_dedup(entries: &mut Vec<KeyEntry>) {
    entries.sort_unstable_by_key(|e| (e.hash, e.offset));
    entries.dedup_by(|later, kept| {
        if later.hash == kept.hash {
            *kept = kept.combine(*later);
            true
        } else {
            false
        }
    });
}

/// A spilled, sorted run; its file goes away with it.
struct Run {
    path: PathBuf,
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Builds a key index from the records of one segment within a memory budget.
pub struct KeyIndexBuilder {
    base_offset: i64,
    budget: usize,
    spill_dir: PathBuf,
    entries: Vec<KeyEntry>,
    runs: Vec<Run>,
    producers: BTreeMap<i64, i64>,
}

impl KeyIndexBuilder {
    /// `budget` entries are kept in memory; beyond that, sorted runs are
    /// spilled to temporary files in `spill_dir`.
    pub fn new(base_offset: i64, budget: usize, spill_dir: &Path) -> KeyIndexBuilder {
        KeyIndexBuilder {
            base_offset,
            budget: budget.max(1),
            spill_dir: spill_dir.to_path_buf(),
            entries: Vec::new(),
            runs: Vec::new(),
            producers: BTreeMap::new(),
        }
    }

    /// Notes a batch (in offset order) for the producer section.
    pub fn add_batch(&mut self, header: &BatchHeader) {
        if header.has_producer_id() {
            self.producers
                .insert(header.producer_id, header.base_offset);
        }
    }

    pub fn add_record(
        &mut self,
        key: &[u8],
        offset: i64,
        timestamp: i64,
        tombstone: bool,
    ) -> Result<(), CompactionError> {
        self.entries.push(KeyEntry {
            hash: key_hash(key),
            offset,
            timestamp,
            max_version_timestamp: timestamp,
            tombstone,
        });
        if self.entries.len() >= self.budget {
            self.spill()?;
        }
        Ok(())
    }

    fn spill(&mut self) -> Result<(), CompactionError> {
        sort_dedup(&mut self.entries);
        let path = self.spill_dir.join(format!(
            ".{}-run-{}.tmp",
            file_name(self.base_offset, KEY_INDEX_EXT),
            uuid::Uuid::new_v4().simple()
        ));
        let run = Run { path };
        let mut w = KeyIndexWriter::new(
            BufWriter::new(File::create(&run.path)?),
            self.base_offset,
            &[],
        )?;
        for e in &self.entries {
            w.push(e)?;
        }
        w.finish()?;
        self.runs.push(run);
        self.entries.clear();
        Ok(())
    }

    /// Number of runs spilled so far.
    pub fn spilled_runs(&self) -> usize {
        self.runs.len()
    }

    /// Writes the finished index to `out`.
    pub fn finish<W: Write>(mut self, out: W) -> Result<W, CompactionError> {
        let producers: Vec<ProducerLast> = self
            .producers
            .iter()
            .map(|(&producer_id, &batch_base_offset)| ProducerLast {
                producer_id,
                batch_base_offset,
            })
            .collect();
        let mut w = KeyIndexWriter::new(out, self.base_offset, &producers)?;
        if self.runs.is_empty() {
            sort_dedup(&mut self.entries);
            for e in &self.entries {
                w.push(e)?;
            }
            return w.finish();
        }
        if !self.entries.is_empty() {
            self.spill()?;
        }
        let mut readers = Vec::with_capacity(self.runs.len());
        for run in &self.runs {
            readers.push(KeyIndexReader::new(BufReader::new(File::open(&run.path)?))?);
        }
        merge_sorted(&mut readers, |group| w.push(&group))?;
        w.finish()
    }
}

/// K-way merge of sorted key index streams: calls `f` once per key with the
/// key's entries folded together. Memory: one entry per stream.
pub fn merge_sorted<R: Read>(
    readers: &mut [KeyIndexReader<R>],
    mut f: impl FnMut(KeyEntry) -> Result<(), CompactionError>,
) -> Result<(), CompactionError> {
    let mut heads: Vec<Option<KeyEntry>> = Vec::with_capacity(readers.len());
    let mut heap = BinaryHeap::new();
    for (i, r) in readers.iter_mut().enumerate() {
        let e = r.next_entry()?;
        if let Some(e) = e {
            heap.push(Reverse((e.hash, i)));
        }
        heads.push(e);
    }
    let mut current: Option<KeyEntry> = None;
    while let Some(Reverse((hash, i))) = heap.pop() {
        let e = heads[i].take().expect("heap entries have heads");
        current = match current {
            Some(c) if c.hash == hash => Some(c.combine(e)),
            Some(c) => {
                f(c)?;
                Some(e)
            }
            None => Some(e),
        };
        if let Some(next) = readers[i].next_entry()? {
            heap.push(Reverse((next.hash, i)));
            heads[i] = Some(next);
        }
    }
    if let Some(c) = current {
        f(c)?;
    }
    Ok(())
}

/// Builds the key index of a sealed local segment from its batches and
/// writes it next to the segment (temporary file, fsync, rename), so a
/// reader never sees half an index. Returns the index path.
pub fn build_for_segment(
    dir: &Path,
    base_offset: i64,
    budget: usize,
) -> Result<PathBuf, CompactionError> {
    let log = File::open(dir.join(file_name(base_offset, "log")))?;
    let mut builder = KeyIndexBuilder::new(base_offset, budget, dir);
    let mut stream = BatchStream::new(log);
    while let Some((header, bytes)) = stream.next_batch()? {
        add_batch_records(&mut builder, &header, bytes)?;
    }
    let path = dir.join(file_name(base_offset, KEY_INDEX_EXT));
    // A unique temporary name: the background build after sealing and a
    // merge that finds the index missing may race, and each must rename a
    // whole file of its own.
    let tmp = dir.join(format!(
        "{}.{}.tmp",
        file_name(base_offset, KEY_INDEX_EXT),
        uuid::Uuid::new_v4().simple()
    ));
    let out = builder.finish(BufWriter::new(File::create(&tmp)?))?;
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    sync_dir(dir)?;
    Ok(path)
}

/// Decodes one batch and adds its keyed records to `builder`.
pub fn add_batch_records(
    builder: &mut KeyIndexBuilder,
    header: &BatchHeader,
    bytes: &[u8],
) -> Result<(), CompactionError> {
    builder.add_batch(header);
    // Control records carry no user key; the merge copies them untouched.
    if header.is_control() || header.record_count == 0 {
        return Ok(());
    }
    let mut buf = bytes;
    let set = RecordBatchDecoder::decode(&mut buf).map_err(|e| CompactionError::CorruptBatch {
        offset: header.base_offset,
        reason: e.to_string(),
    })?;
    for r in &set.records {
        let Some(key) = &r.key else { continue };
        let ts = if header.is_log_append_time() {
            header.max_timestamp
        } else {
            r.timestamp
        };
        builder.add_record(key, r.offset, ts, r.value.is_none())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries_for(keys: &[(u32, i64, bool)]) -> Vec<(u128, i64, bool)> {
        let mut m: BTreeMap<u128, (i64, bool)> = BTreeMap::new();
        for &(k, off, tomb) in keys {
            m.insert(key_hash(&k.to_be_bytes()), (off, tomb));
        }
        m.into_iter().map(|(h, (o, t))| (h, o, t)).collect()
    }

    fn build(keys: &[(u32, i64, bool)], budget: usize) -> (Vec<KeyEntry>, usize) {
        let dir = tempfile::tempdir().unwrap();
        let mut b = KeyIndexBuilder::new(100, budget, dir.path());
        for &(k, off, tomb) in keys {
            b.add_record(&k.to_be_bytes(), off, off * 10, tomb).unwrap();
        }
        b.add_batch(&BatchHeader {
            base_offset: 120,
            size: 61,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: 0,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: 9,
            producer_epoch: 0,
            base_sequence: 0,
            record_count: 1,
        });
        let runs_before = b.spilled_runs();
        let bytes = b.finish(Vec::new()).unwrap();
        // Spill files are gone once the builder is.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        let mut r = KeyIndexReader::new(&bytes[..]).unwrap();
        assert_eq!(r.base_offset(), 100);
        assert_eq!(
            r.producers(),
            &[ProducerLast {
                producer_id: 9,
                batch_base_offset: 120
            }]
        );
        (r.read_all().unwrap(), runs_before)
    }

    fn workload() -> Vec<(u32, i64, bool)> {
        // 50 keys, many versions each, in offset order.
        (0..1000)
            .map(|i| ((i * 7 % 50) as u32, 100 + i as i64, i % 13 == 0))
            .collect()
    }

    #[test]
    fn round_trip_keeps_newest_per_key() {
        let keys = workload();
        let (got, runs) = build(&keys, 1 << 20);
        assert_eq!(runs, 0);
        let want = entries_for(&keys);
        assert_eq!(
            got.iter()
                .map(|e| (e.hash, e.offset, e.tombstone))
                .collect::<Vec<_>>(),
            want
        );
        for e in &got {
            assert_eq!(e.timestamp, e.offset * 10);
            assert!(e.max_version_timestamp >= e.timestamp);
        }
    }

    #[test]
    fn external_sort_with_tiny_budget_gives_the_same_index() {
        let keys = workload();
        let (small, runs) = build(&keys, 7);
        assert!(runs > 100, "expected many spilled runs, got {runs}");
        let (big, _) = build(&keys, 1 << 20);
        assert_eq!(small, big);
    }

    #[test]
    fn corruption_is_detected() {
        let dir = tempfile::tempdir().unwrap();
        let mut b = KeyIndexBuilder::new(0, 10, dir.path());
        for i in 0..20u32 {
            b.add_record(&i.to_be_bytes(), i as i64, 0, false).unwrap();
        }
        let mut bytes = b.finish(Vec::new()).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        let mut r = KeyIndexReader::new(&bytes[..]).unwrap();
        assert!(matches!(
            r.read_all(),
            Err(CompactionError::CorruptIndex(_))
        ));
        assert!(KeyIndexReader::new(&bytes[..3]).is_err());
    }
}
