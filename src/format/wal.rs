//! A write-ahead log object: the new batches of every partition a broker
//! leads, gathered over one flush interval into one immutable object.
//!
//! In cluster mode an acknowledged write must be in the object store, but a
//! PUT per partition per request would make the request cost grow with the
//! partition count. So a broker appends each stamped batch to one buffer and
//! writes the buffer as one object per flush; an entry table up front says
//! which byte range holds which partition's offsets, so a new leader reads
//! only the table and its own partition's ranges.
//!
//! Layout (big-endian):
//!
//! ```text
//! header   "SWAL" | version u16 | flags u16 | node_id i32 | writer nonce u64 | seq u64 | since u64 |
//!          entries u32
//! entries  × (topic_id [16] | partition i32 | leader_epoch i32 | base_offset i64 | last_offset i64 |
//!             position u64 | length u32)      position: from the start of the batch area
//! batches  the stamped record batches, exactly as in the segment log
//! footer   CRC-32C of everything before it u32
//! ```
//!
//! A fence object (written by whoever takes over a dead broker's partitions,
//! at the sequence number the broker would write next) is the header alone
//! with the `FENCE_ENTRIES` marker as its entry count. The `PLUG` flag marks
//! a fence that only fills a free slot next to the real one (`wal::fence`).
//!
//! `since` is the first sequence number of the writer's run (version 2):
//! with it a reader tells whether a fence cut that run off below an object
//! (`wal::objects_between`). Version 1 objects lack it and still decode.
//!
//! From version 3 on, an entry's `leader_epoch` is the epoch at which the
//! writer led the partition, also for a batch it replayed from an earlier
//! leader; before, it was the batch's own.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::FormatError;

const MAGIC: &[u8; 4] = b"SWAL";
const VERSION: u16 = 3;
pub const HEADER_LEN: usize = 4 + 2 + 2 + 4 + 8 + 8 + 8 + 4;
/// Version 1 had no `since`.
const HEADER_LEN_V1: usize = HEADER_LEN - 8;
/// In a fence's flags: it only plugs a slot.
const PLUG: u16 = 1;
pub const ENTRY_LEN: usize = 16 + 4 + 4 + 8 + 8 + 8 + 4;
const FOOTER_LEN: usize = 4;
/// The entry count of a fence object.
const FENCE_ENTRIES: u32 = u32::MAX;

/// Which writer wrote an object, and its place in that writer's sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalHeader {
    pub node_id: i32,
    /// One run of the writer; tells a retried PUT of its own from a fence.
    pub nonce: u64,
    pub seq: u64,
    /// The first sequence number of the writer's run; `None` in a version 1
    /// object.
    pub since: Option<u64>,
}

/// One partition's batches in an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalEntry {
    pub topic_id: Uuid,
    pub partition: i32,
    /// The epoch at which the writer led the partition when it wrote the
    /// entry, if the object [`WalObject::writer_epochs`]; else the batches'.
    pub leader_epoch: i32,
    pub base_offset: i64,
    pub last_offset: i64,
    /// Position of the batches in the batch area.
    pub position: u64,
    pub length: u32,
}

/// A decoded object: its header, entries, and the batch area.
#[derive(Debug, Clone)]
pub struct WalObject {
    pub header: WalHeader,
    /// `None` for a fence object.
    pub entries: Option<Vec<WalEntry>>,
    pub batches: Bytes,
    /// A fence that only plugs a slot.
    pub plug: bool,
    /// Entries carry the writer's leader epoch (version 3 on).
    pub writer_epochs: bool,
}

impl WalObject {
    pub fn is_fence(&self) -> bool {
        self.entries.is_none()
    }

    /// Whether this is a fence that cuts off the runs begun below it (a
    /// version 2 fence that is not a plug).
    pub fn cuts_runs(&self) -> bool {
        self.is_fence() && !self.plug && self.header.since.is_some()
    }

    /// The batches of `entry`.
    pub fn batches_of(&self, entry: &WalEntry) -> Result<Bytes, FormatError> {
        let start = usize::try_from(entry.position)
            .map_err(|_| FormatError::Corrupt("WAL entry position".into()))?;
        let end = start
            .checked_add(entry.length as usize)
            .filter(|&e| e <= self.batches.len())
            .ok_or_else(|| FormatError::Corrupt("WAL entry runs past the object".into()))?;
        Ok(self.batches.slice(start..end))
    }
}

/// Builds one object from the batches appended during a flush interval.
#[derive(Debug, Default)]
pub struct WalBuilder {
    entries: Vec<WalEntry>,
    batches: BytesMut,
}

impl WalBuilder {
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of batches so far.
    pub fn len(&self) -> usize {
        self.batches.len()
    }

    pub fn entries(&self) -> &[WalEntry] {
        &self.entries
    }

    /// Adds one stamped batch (its header and its records, as two slices so
    /// the caller need not join them) of `partition`, covering
    /// `base_offset..=last_offset`. Consecutive batches of one partition share
    /// an entry.
    #[allow(clippy::too_many_arguments)]
    pub fn push(
        &mut self,
        topic_id: Uuid,
        partition: i32,
        leader_epoch: i32,
        base_offset: i64,
        last_offset: i64,
        header: &[u8],
        records: &[u8],
    ) {
        let position = self.batches.len() as u64;
        let length = (header.len() + records.len()) as u32;
        self.batches.extend_from_slice(header);
        self.batches.extend_from_slice(records);
        if let Some(last) = self.entries.last_mut() {
            let contiguous = last.topic_id == topic_id
                && last.partition == partition
                && last.leader_epoch == leader_epoch
                && last.last_offset + 1 == base_offset
                && last.position + last.length as u64 == position;
            if contiguous {
                last.last_offset = last_offset;
                last.length += length;
                return;
            }
        }
        self.entries.push(WalEntry {
            topic_id,
            partition,
            leader_epoch,
            base_offset,
            last_offset,
            position,
            length,
        });
    }

    /// Encodes the object and empties the builder.
    pub fn finish(&mut self, header: WalHeader) -> Bytes {
        let entries = std::mem::take(&mut self.entries);
        let batches = std::mem::take(&mut self.batches);
        let mut out = BytesMut::with_capacity(
            HEADER_LEN + entries.len() * ENTRY_LEN + batches.len() + FOOTER_LEN,
        );
        put_header(&mut out, &header, entries.len() as u32, 0);
        for e in &entries {
            out.put_slice(e.topic_id.as_bytes());
            out.put_i32(e.partition);
            out.put_i32(e.leader_epoch);
            out.put_i64(e.base_offset);
            out.put_i64(e.last_offset);
            out.put_u64(e.position);
            out.put_u32(e.length);
        }
        out.put_slice(&batches);
        let crc = crc32c::crc32c(&out);
        out.put_u32(crc);
        out.freeze()
    }
}

/// A fence object at `header.seq`; a `plug` only fills a free slot.
pub fn encode_fence(header: WalHeader, plug: bool) -> Bytes {
    let mut out = BytesMut::with_capacity(HEADER_LEN + FOOTER_LEN);
    put_header(
        &mut out,
        &header,
        FENCE_ENTRIES,
        if plug { PLUG } else { 0 },
    );
    let crc = crc32c::crc32c(&out);
    out.put_u32(crc);
    out.freeze()
}

fn put_header(out: &mut BytesMut, h: &WalHeader, entries: u32, flags: u16) {
    out.put_slice(MAGIC);
    out.put_u16(VERSION);
    out.put_u16(flags);
    out.put_i32(h.node_id);
    out.put_u64(h.nonce);
    out.put_u64(h.seq);
    out.put_u64(h.since.unwrap_or(h.seq));
    out.put_u32(entries);
}

/// Decodes a whole object, checking its CRC and that every entry lies
/// inside it; a declared count never allocates more than the bytes present.
pub fn decode(bytes: Bytes) -> Result<WalObject, FormatError> {
    let corrupt = |why: &str| FormatError::Corrupt(format!("WAL object: {why}"));
    if bytes.len() < HEADER_LEN_V1 + FOOTER_LEN {
        return Err(corrupt("shorter than a header"));
    }
    let body_len = bytes.len() - FOOTER_LEN;
    let stored_crc = (&bytes[body_len..]).get_u32();
    if crc32c::crc32c(&bytes[..body_len]) != stored_crc {
        return Err(corrupt("CRC mismatch"));
    }
    let mut b = &bytes[..body_len];
    if &b[..4] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    b.advance(4);
    let version = b.get_u16();
    let header_len = match version {
        1 => HEADER_LEN_V1,
        2..=VERSION if body_len >= HEADER_LEN => HEADER_LEN,
        2..=VERSION => return Err(corrupt("shorter than a header")),
        _ => return Err(corrupt(&format!("unknown version {version}"))),
    };
    let flags = b.get_u16();
    let header = WalHeader {
        node_id: b.get_i32(),
        nonce: b.get_u64(),
        seq: b.get_u64(),
        since: (version >= 2).then(|| b.get_u64()),
    };
    let count = b.get_u32();
    if count == FENCE_ENTRIES {
        return Ok(WalObject {
            header,
            entries: None,
            batches: Bytes::new(),
            plug: flags & PLUG != 0,
            writer_epochs: version >= 3,
        });
    }
    let table = (count as usize)
        .checked_mul(ENTRY_LEN)
        .filter(|&t| t <= b.len())
        .ok_or_else(|| corrupt("entry table runs past the object"))?;
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let mut id = [0u8; 16];
        b.copy_to_slice(&mut id);
        entries.push(WalEntry {
            topic_id: Uuid::from_bytes(id),
            partition: b.get_i32(),
            leader_epoch: b.get_i32(),
            base_offset: b.get_i64(),
            last_offset: b.get_i64(),
            position: b.get_u64(),
            length: b.get_u32(),
        });
    }
    let start = header_len + table;
    let object = WalObject {
        header,
        entries: Some(entries),
        batches: bytes.slice(start..body_len),
        plug: false,
        writer_epochs: version >= 3,
    };
    for e in object.entries.iter().flatten() {
        object.batches_of(e)?;
        if e.last_offset < e.base_offset {
            return Err(corrupt("entry ends before it starts"));
        }
    }
    Ok(object)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(seq: u64) -> WalHeader {
        WalHeader {
            node_id: 3,
            nonce: 77,
            seq,
            since: Some(2),
        }
    }

    #[test]
    fn batches_of_each_partition_come_back_from_their_entries() {
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let mut w = WalBuilder::default();
        w.push(a, 0, 5, 10, 12, b"h1", b"records-1");
        w.push(a, 0, 5, 13, 13, b"h2", b"r2");
        w.push(b, 4, 1, 0, 0, b"h3", b"r3");
        assert_eq!(w.entries().len(), 2, "contiguous batches share an entry");
        let obj = decode(w.finish(header(9))).unwrap();
        assert!(w.is_empty());
        assert_eq!(obj.header, header(9));
        let entries = obj.entries.clone().unwrap();
        assert_eq!((entries[0].base_offset, entries[0].last_offset), (10, 13));
        assert_eq!(
            &obj.batches_of(&entries[0]).unwrap()[..],
            b"h1records-1h2r2"
        );
        assert_eq!((entries[1].topic_id, entries[1].partition), (b, 4));
        assert_eq!(&obj.batches_of(&entries[1]).unwrap()[..], b"h3r3");
    }

    /// `object` with its version set to `version`, CRC fixed.
    fn as_version(object: &[u8], version: u16) -> Bytes {
        let mut b = BytesMut::from(&object[..object.len() - FOOTER_LEN]);
        b[4..6].copy_from_slice(&version.to_be_bytes());
        let crc = crc32c::crc32c(&b);
        b.put_u32(crc);
        b.freeze()
    }

    #[test]
    fn only_objects_from_version_3_on_carry_writer_epochs() {
        let mut w = WalBuilder::default();
        w.push(Uuid::from_u128(1), 0, 5, 10, 10, b"h", b"r");
        let v3 = w.finish(header(9));
        assert!(decode(v3.clone()).unwrap().writer_epochs);
        let v2 = decode(as_version(&v3, 2)).unwrap();
        assert!(!v2.writer_epochs);
        assert_eq!(v2.header, header(9));
    }

    #[test]
    fn a_version_1_object_decodes_without_its_runs_start() {
        let mut w = WalBuilder::default();
        w.push(Uuid::from_u128(1), 0, 5, 10, 10, b"h", b"r");
        let v2 = as_version(&w.finish(header(9)), 2);
        // Version 1: the same without `since`, which follows `seq`.
        let since_at = HEADER_LEN_V1 - 4;
        let mut v1 = BytesMut::new();
        v1.put_slice(&v2[..4]);
        v1.put_u16(1);
        v1.put_slice(&v2[6..since_at]);
        v1.put_slice(&v2[since_at + 8..v2.len() - FOOTER_LEN]);
        let crc = crc32c::crc32c(&v1);
        v1.put_u32(crc);
        let obj = decode(v1.freeze()).unwrap();
        assert_eq!(obj.header.since, None);
        assert!(!obj.writer_epochs);
        assert_eq!(obj.header.seq, 9);
        let entry = obj.entries.clone().unwrap()[0];
        assert_eq!(&obj.batches_of(&entry).unwrap()[..], b"hr");
    }

    #[test]
    fn a_fence_decodes_as_a_fence() {
        let obj = decode(encode_fence(header(4), false)).unwrap();
        assert!(obj.is_fence() && obj.cuts_runs());
        assert_eq!(obj.header.seq, 4);
        let plug = decode(encode_fence(header(4), true)).unwrap();
        assert!(plug.is_fence() && !plug.cuts_runs());
    }

    #[test]
    fn damaged_objects_are_refused_without_large_allocations() {
        let mut w = WalBuilder::default();
        w.push(Uuid::from_u128(1), 0, 0, 0, 0, b"h", b"r");
        let good = w.finish(header(1));
        for cut in [0, 3, HEADER_LEN, good.len() - 1] {
            assert!(decode(good.slice(..cut)).is_err());
        }
        let mut flipped = good.to_vec();
        flipped[HEADER_LEN + 3] ^= 1;
        assert!(decode(Bytes::from(flipped)).is_err());
        // A huge declared entry count with a valid CRC is refused, not allocated.
        let mut huge = BytesMut::new();
        put_header(&mut huge, &header(1), 100_000_000, 0);
        let crc = crc32c::crc32c(&huge);
        huge.put_u32(crc);
        assert!(decode(huge.freeze()).is_err());
    }
}
