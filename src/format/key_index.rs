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
//! The builder, which reads a segment's batches, lives with the log
//! (`log::key_index`); this module only encodes and decodes the bytes.
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
use std::collections::BinaryHeap;
use std::io::{Read, Write};

use bytes::{Buf, BufMut};

use super::FormatError;

const MAGIC: &[u8; 4] = b"SKIX";
const VERSION: u16 = 1;
const HEADER_LEN: usize = 24;
const PRODUCER_LEN: usize = 16;
pub const ENTRY_LEN: usize = 37;
const FOOTER_LEN: usize = 12;
const FLAG_TOMBSTONE: u8 = 1;

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
    ) -> Result<Self, FormatError> {
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

    pub fn push(&mut self, e: &KeyEntry) -> Result<(), FormatError> {
        if self.last_hash.is_some_and(|h| h >= e.hash) {
            return Err(FormatError::CorruptIndex(
                "entries must be pushed in increasing hash order".into(),
            ));
        }
        let rel = u32::try_from(e.offset - self.base_offset).map_err(|_| {
            FormatError::CorruptIndex(format!(
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

    pub fn finish(mut self) -> Result<W, FormatError> {
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
    pub fn new(input: R) -> Result<Self, FormatError> {
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
            return Err(FormatError::CorruptIndex("shorter than a header".into()));
        }
        let head = r.take(HEADER_LEN);
        if &head[..4] != MAGIC {
            return Err(FormatError::CorruptIndex("bad magic".into()));
        }
        let mut h = &head[4..];
        let version = h.get_u16();
        if version != VERSION {
            return Err(FormatError::CorruptIndex(format!(
                "unsupported version {version}"
            )));
        }
        h.advance(2);
        r.base_offset = h.get_i64();
        let producers = h.get_u32() as usize;
        r.crc = crc32c::crc32c(&head);
        for _ in 0..producers {
            if !r.fill(PRODUCER_LEN)? {
                return Err(FormatError::CorruptIndex("truncated producers".into()));
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
    fn fill(&mut self, n: usize) -> Result<bool, FormatError> {
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

    pub fn next_entry(&mut self) -> Result<Option<KeyEntry>, FormatError> {
        if self.done {
            return Ok(None);
        }
        // An entry is there only if a whole footer still follows it.
        if !self.fill(ENTRY_LEN + FOOTER_LEN)? {
            let left = self.end - self.start;
            if left != FOOTER_LEN {
                return Err(FormatError::CorruptIndex(format!(
                    "{left} trailing bytes are neither an entry nor a footer"
                )));
            }
            let f = self.take(FOOTER_LEN);
            let count = (&f[..8]).get_u64();
            let crc = crc32c::crc32c_append(self.crc, &f[..8]);
            if count != self.count || crc != (&f[8..]).get_u32() {
                return Err(FormatError::CorruptIndex(
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
    pub fn read_all(&mut self) -> Result<Vec<KeyEntry>, FormatError> {
        let mut v = Vec::new();
        while let Some(e) = self.next_entry()? {
            v.push(e);
        }
        Ok(v)
    }
}

/// Sorts by (hash, offset) and folds each key's entries into one.
pub fn sort_dedup(entries: &mut Vec<KeyEntry>) {
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

/// K-way merge of sorted key index streams: calls `f` once per key with the
/// key's entries folded together. Memory: one entry per stream.
pub fn merge_sorted<R: Read, E: From<FormatError>>(
    readers: &mut [KeyIndexReader<R>],
    mut f: impl FnMut(KeyEntry) -> Result<(), E>,
) -> Result<(), E> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(hash: u128, offset: i64) -> KeyEntry {
        KeyEntry {
            hash,
            offset,
            timestamp: offset * 10,
            max_version_timestamp: offset * 10,
            tombstone: offset % 3 == 0,
        }
    }

    fn encode(entries: &[KeyEntry]) -> Vec<u8> {
        let producers = [ProducerLast {
            producer_id: 9,
            batch_base_offset: 120,
        }];
        let mut w = KeyIndexWriter::new(Vec::new(), 100, &producers).unwrap();
        for e in entries {
            w.push(e).unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn written_index_reads_back_with_its_producers() {
        let entries: Vec<KeyEntry> = (0..50).map(|i| entry(i * 7, 100 + i as i64)).collect();
        let bytes = encode(&entries);
        let mut r = KeyIndexReader::new(&bytes[..]).unwrap();
        assert_eq!(r.base_offset(), 100);
        assert_eq!(r.producers()[0].batch_base_offset, 120);
        assert_eq!(r.read_all().unwrap(), entries);
    }

    #[test]
    fn entries_out_of_hash_order_are_refused() {
        let mut w = KeyIndexWriter::new(Vec::new(), 0, &[]).unwrap();
        w.push(&entry(5, 1)).unwrap();
        assert!(matches!(
            w.push(&entry(4, 2)),
            Err(FormatError::CorruptIndex(_))
        ));
    }

    #[test]
    fn corruption_is_detected() {
        let entries: Vec<KeyEntry> = (0..20).map(|i| entry(i, i as i64 + 100)).collect();
        let mut bytes = encode(&entries);
        let mid = bytes.len() / 2;
        bytes[mid] ^= 1;
        let mut r = KeyIndexReader::new(&bytes[..]).unwrap();
        assert!(matches!(r.read_all(), Err(FormatError::CorruptIndex(_))));
        assert!(KeyIndexReader::new(&bytes[..3]).is_err());
    }

    #[test]
    fn merging_sorted_streams_folds_each_key_to_its_newest_entry() {
        let a = encode(&[entry(1, 101), entry(3, 103)]);
        let b = encode(&[entry(1, 110), entry(2, 111)]);
        let mut readers = vec![
            KeyIndexReader::new(&a[..]).unwrap(),
            KeyIndexReader::new(&b[..]).unwrap(),
        ];
        let mut out = Vec::new();
        merge_sorted::<_, FormatError>(&mut readers, |e| {
            out.push((e.hash, e.offset));
            Ok(())
        })
        .unwrap();
        assert_eq!(out, vec![(1, 110), (2, 111), (3, 103)]);
    }
}
