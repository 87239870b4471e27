//! Record batches (magic 2) as opaque byte ranges.
//!
//! The broker reads the fixed 61-byte batch header, checks the CRC, and
//! rewrites the few header fields the leader owns (base offset, partition
//! leader epoch and, for LogAppendTime topics, the max timestamp). Everything
//! after the header is stored and served as the producer sent it, whatever
//! its codec, unless a topic config needs the records: produce decodes them
//! for per-record checks and recompresses them for `compression.type`.

use std::io::Read;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::records::{
    Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
};

use super::FormatError;

/// Size of the record batch header up to and including `recordCount`.
pub const HEADER_LEN: usize = 61;
/// Bytes before `batchLength` counts: baseOffset (8) + batchLength (4).
pub const LOG_OVERHEAD: usize = 12;

/// Where the header fields that brokers rewrite sit in a batch.
pub const BATCH_LENGTH_OFFSET: usize = 8;
const LEADER_EPOCH_OFFSET: usize = 12;
pub const CRC_OFFSET: usize = 17;
pub const ATTRIBUTES_OFFSET: usize = 21;
pub const BASE_TIMESTAMP_OFFSET: usize = 27;
pub const MAX_TIMESTAMP_OFFSET: usize = 35;
pub const RECORD_COUNT_OFFSET: usize = 57;
/// The codec bits of a batch's attributes.
pub const CODEC_MASK: i16 = 0x7;

const TIMESTAMP_TYPE_BIT: i16 = 1 << 3;
const TRANSACTIONAL_BIT: i16 = 1 << 4;
const CONTROL_BIT: i16 = 1 << 5;

/// The header fields of one batch, read without touching the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchHeader {
    pub base_offset: i64,
    /// Size of the whole batch in bytes, header included.
    pub size: usize,
    /// The epoch of the leader that appended the batch.
    pub leader_epoch: i32,
    pub magic: i8,
    pub crc: u32,
    pub attributes: i16,
    pub last_offset_delta: i32,
    pub base_timestamp: i64,
    pub max_timestamp: i64,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub base_sequence: i32,
    pub record_count: i32,
}

impl BatchHeader {
    /// Parses the header at the start of `buf`. Returns `None` when `buf` is
    /// shorter than a header; checks only what the header itself can tell.
    pub fn parse(buf: &[u8]) -> Result<Option<BatchHeader>, FormatError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let mut b = buf;
        let base_offset = b.get_i64();
        let batch_length = b.get_i32();
        let leader_epoch = b.get_i32();
        let magic = b.get_i8();
        let crc = b.get_u32();
        let attributes = b.get_i16();
        let last_offset_delta = b.get_i32();
        let base_timestamp = b.get_i64();
        let max_timestamp = b.get_i64();
        let producer_id = b.get_i64();
        let producer_epoch = b.get_i16();
        let base_sequence = b.get_i32();
        let record_count = b.get_i32();
        if magic != 2 {
            return Err(FormatError::UnsupportedMagic(magic));
        }
        if batch_length < (HEADER_LEN - LOG_OVERHEAD) as i32 {
            return Err(FormatError::Corrupt(format!(
                "batch length {batch_length} is shorter than a header"
            )));
        }
        Ok(Some(BatchHeader {
            base_offset,
            size: LOG_OVERHEAD + batch_length as usize,
            leader_epoch,
            magic,
            crc,
            attributes,
            last_offset_delta,
            base_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            record_count,
        }))
    }

    pub fn last_offset(&self) -> i64 {
        self.base_offset + self.last_offset_delta as i64
    }

    pub fn is_log_append_time(&self) -> bool {
        self.attributes & TIMESTAMP_TYPE_BIT != 0
    }

    pub fn is_transactional(&self) -> bool {
        self.attributes & TRANSACTIONAL_BIT != 0
    }

    pub fn is_control(&self) -> bool {
        self.attributes & CONTROL_BIT != 0
    }

    pub fn has_producer_id(&self) -> bool {
        self.producer_id >= 0
    }

    /// Sequence number of the last record in the batch (sequences wrap at i32::MAX).
    pub fn last_sequence(&self) -> i32 {
        if self.base_sequence < 0 {
            return self.base_sequence;
        }
        let last = self.base_sequence as i64 + self.last_offset_delta as i64;
        (last % (i32::MAX as i64 + 1)) as i32
    }
}

/// CRC-32C over everything the batch CRC covers (attributes to the end).
pub fn compute_crc(batch: &[u8]) -> u32 {
    crc32c::crc32c(&batch[ATTRIBUTES_OFFSET..])
}

/// Validates one whole batch as received from a producer: structure, CRC and
/// the invariants a freshly produced batch must satisfy.
pub fn validate_produced(batch: &[u8]) -> Result<BatchHeader, FormatError> {
    let header = BatchHeader::parse(batch)?
        .ok_or_else(|| FormatError::Corrupt("truncated batch header".into()))?;
    if header.size != batch.len() {
        return Err(FormatError::Corrupt(format!(
            "batch length field says {} bytes but {} were sent",
            header.size,
            batch.len()
        )));
    }
    if compute_crc(batch) != header.crc {
        return Err(FormatError::Corrupt("record batch CRC mismatch".into()));
    }
    if header.record_count <= 0 || header.last_offset_delta != header.record_count - 1 {
        return Err(FormatError::InvalidRecord(format!(
            "batch has {} records but last offset delta {}",
            header.record_count, header.last_offset_delta
        )));
    }
    if header.is_control() {
        return Err(FormatError::InvalidRecord(
            "producers may not write control batches".into(),
        ));
    }
    Ok(header)
}

/// Splits `buf` into the sizes of the whole, well-formed batches at its start
/// (header sanity only). Stops at the first incomplete or malformed batch.
pub fn whole_batches_len(buf: &[u8]) -> usize {
    let mut pos = 0;
    while let Ok(Some(h)) = BatchHeader::parse(&buf[pos..]) {
        if pos + h.size > buf.len() {
            break;
        }
        pos += h.size;
    }
    pos
}

/// Bytes of the whole batches at the start of `buf` whose offsets all lie
/// below `limit` (a high watermark, which falls between batches).
pub fn batches_below_len(buf: &[u8], limit: i64) -> usize {
    let mut pos = 0;
    while let Ok(Some(h)) = BatchHeader::parse(&buf[pos..]) {
        if pos + h.size > buf.len() || h.last_offset() >= limit {
            break;
        }
        pos += h.size;
    }
    pos
}

/// The records of the whole, well-formed batches at the start of `buf`, as
/// their headers count them (control batches included).
pub fn count_records(buf: &[u8]) -> u64 {
    let (mut pos, mut records) = (0, 0u64);
    while let Ok(Some(h)) = BatchHeader::parse(&buf[pos..]) {
        if pos + h.size > buf.len() {
            break;
        }
        records += h.record_count.max(0) as u64;
        pos += h.size;
    }
    records
}

/// The header of a validated batch with the leader-owned fields stamped:
/// base offset, partition leader epoch and, for LogAppendTime, the max
/// timestamp. Only that last one is covered by the CRC, so only then is the
/// CRC recomputed (over the unchanged records, never re-encoded). The caller
/// writes this header followed by `batch[HEADER_LEN..]`, so the records are
/// never copied.
pub fn stamp_header(
    batch: &[u8],
    base_offset: i64,
    leader_epoch: i32,
    log_append_time: Option<i64>,
) -> [u8; HEADER_LEN] {
    let mut out = [0u8; HEADER_LEN];
    out.copy_from_slice(&batch[..HEADER_LEN]);
    (&mut out[0..8]).put_i64(base_offset);
    (&mut out[LEADER_EPOCH_OFFSET..LEADER_EPOCH_OFFSET + 4]).put_i32(leader_epoch);
    if let Some(now) = log_append_time {
        let attrs = i16::from_be_bytes([out[ATTRIBUTES_OFFSET], out[ATTRIBUTES_OFFSET + 1]])
            | TIMESTAMP_TYPE_BIT;
        (&mut out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2]).put_i16(attrs);
        (&mut out[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8]).put_i64(now);
        let crc = crc32c::crc32c_append(
            crc32c::crc32c(&out[ATTRIBUTES_OFFSET..]),
            &batch[HEADER_LEN..],
        );
        (&mut out[CRC_OFFSET..CRC_OFFSET + 4]).put_u32(crc);
    }
    out
}

/// A record for [`encode_batch`]: key, value (None is a tombstone), timestamp.
pub type NewRecord = (Option<Bytes>, Option<Bytes>, i64);

/// Encodes records into one magic-2 batch at offsets 0.., as a producer
/// would: the broker's own writes use it, and so do tests and benches.
/// `producer` is (producer id, epoch, base sequence) for an idempotent batch.
pub fn encode_batch(
    records: Vec<NewRecord>,
    producer: Option<(i64, i16, i32)>,
    compression: Compression,
) -> Result<Bytes, FormatError> {
    encode(records, producer, compression, false)
}

/// Like [`encode_batch`], for a transactional producer's batch.
pub fn encode_transactional_batch(
    records: Vec<NewRecord>,
    producer: (i64, i16, i32),
    compression: Compression,
) -> Result<Bytes, FormatError> {
    encode(records, Some(producer), compression, true)
}

fn encode(
    records: Vec<NewRecord>,
    producer: Option<(i64, i16, i32)>,
    compression: Compression,
    transactional: bool,
) -> Result<Bytes, FormatError> {
    let (producer_id, producer_epoch, first_sequence) = producer.unwrap_or((-1, -1, -1));
    let records: Vec<Record> = records
        .into_iter()
        .enumerate()
        .map(|(i, (key, value, timestamp))| Record {
            transactional,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id,
            producer_epoch,
            timestamp_type: TimestampType::Creation,
            offset: i as i64,
            // The encoder starts a new batch unless offset - sequence stays constant.
            sequence: first_sequence.wrapping_add(i as i32),
            timestamp,
            key,
            value,
            headers: Default::default(),
        })
        .collect();
    let mut buf = BytesMut::new();
    let options = RecordEncodeOptions {
        version: 2,
        compression,
    };
    RecordBatchEncoder::encode(&mut buf, &records, &options)
        .map_err(|e| FormatError::Corrupt(e.to_string()))?;
    Ok(buf.freeze())
}

/// Decodes one batch and returns the first record matching `pred(offset, timestamp)`.
pub fn first_record(
    data: &Bytes,
    header: &BatchHeader,
    pred: impl Fn(i64, i64) -> bool,
) -> Result<Option<(i64, i64)>, FormatError> {
    if header.is_log_append_time() {
        // Every record of the batch carries the batch's max timestamp.
        let ts = header.max_timestamp;
        return Ok((header.base_offset..=header.last_offset())
            .find(|&o| pred(o, ts))
            .map(|o| (o, ts)));
    }
    let mut buf = data.clone();
    let set = super::records::decode_batch(&mut buf)
        .map_err(|e| FormatError::Corrupt(format!("undecodable batch: {e}")))?;
    Ok(set
        .records
        .iter()
        .find(|r| pred(r.offset, r.timestamp))
        .map(|r| (r.offset, r.timestamp)))
}

const STREAM_BUFFER: usize = 1 << 20;

/// Whole batches, one at a time, from a sequential byte stream. Memory is one
/// buffer, grown only for a batch larger than it.
pub struct BatchStream<R: Read> {
    input: R,
    buf: Vec<u8>,
    start: usize,
    end: usize,
    eof: bool,
    /// Bytes handed out so far (the position of the next batch).
    position: u64,
}

impl<R: Read> BatchStream<R> {
    pub fn new(input: R) -> BatchStream<R> {
        BatchStream {
            input,
            buf: vec![0; STREAM_BUFFER],
            start: 0,
            end: 0,
            eof: false,
            position: 0,
        }
    }

    fn fill(&mut self, n: usize) -> Result<bool, FormatError> {
        while self.end - self.start < n && !self.eof {
            if self.start > 0 {
                self.buf.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            if self.buf.len() < n {
                self.buf.resize(n, 0);
            }
            let got = self.input.read(&mut self.buf[self.end..])?;
            if got == 0 {
                self.eof = true;
            }
            self.end += got;
        }
        Ok(self.end - self.start >= n)
    }

    /// The next batch's header and bytes; `None` at a clean end of stream.
    pub fn next_batch(&mut self) -> Result<Option<(BatchHeader, &[u8])>, FormatError> {
        if !self.fill(HEADER_LEN)? {
            if self.end == self.start {
                return Ok(None);
            }
            return Err(FormatError::Corrupt(format!(
                "torn header at position {}",
                self.position
            )));
        }
        let header = BatchHeader::parse(&self.buf[self.start..self.end])?
            .expect("a whole header is buffered");
        if !self.fill(header.size)? {
            return Err(FormatError::Corrupt(format!(
                "torn batch at offset {} (position {})",
                header.base_offset, self.position
            )));
        }
        let at = self.start;
        self.start += header.size;
        self.position += header.size as u64;
        Ok(Some((header, &self.buf[at..at + header.size])))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a minimal valid batch with `count` empty-bodied records for tests.
    pub(crate) fn make_batch(
        count: i32,
        producer_id: i64,
        epoch: i16,
        base_sequence: i32,
        ts: i64,
    ) -> Vec<u8> {
        let mut records = Vec::new();
        for i in 0..count {
            // length, attributes, timestampDelta, offsetDelta, keyLen(-1), valueLen(1) 'x', headers 0
            let body = [0u8, 0, (i as u8) << 1, 1, 2, b'x', 0];
            records.push((body.len() as u8) << 1);
            records.extend_from_slice(&body);
        }
        let mut b = Vec::new();
        b.put_i64(0);
        b.put_i32((HEADER_LEN - LOG_OVERHEAD + records.len()) as i32);
        b.put_i32(-1);
        b.put_i8(2);
        b.put_u32(0);
        b.put_i16(0);
        b.put_i32(count - 1);
        b.put_i64(ts);
        b.put_i64(ts);
        b.put_i64(producer_id);
        b.put_i16(epoch);
        b.put_i32(base_sequence);
        b.put_i32(count);
        b.extend_from_slice(&records);
        let crc = compute_crc(&b);
        (&mut b[CRC_OFFSET..CRC_OFFSET + 4]).put_u32(crc);
        b
    }

    #[test]
    fn parses_and_validates() {
        let b = make_batch(3, 7, 1, 10, 1000);
        let h = validate_produced(&b).unwrap();
        assert_eq!(h.record_count, 3);
        assert_eq!(h.last_sequence(), 12);
        assert_eq!(h.producer_id, 7);
        assert_eq!(h.size, b.len());
    }

    #[test]
    fn rejects_corrupt_crc() {
        let mut b = make_batch(1, -1, -1, -1, 0);
        let last = b.len() - 1;
        b[last] ^= 0xff;
        assert!(matches!(
            validate_produced(&b),
            Err(FormatError::Corrupt(_))
        ));
    }

    #[test]
    fn stamping_offset_keeps_crc_and_log_append_time_recomputes_it() {
        let b = make_batch(2, -1, -1, -1, 5);
        let stamp = |at| [&stamp_header(&b, 42, 0, at)[..], &b[HEADER_LEN..]].concat();
        let s = stamp(None);
        let h = BatchHeader::parse(&s).unwrap().unwrap();
        assert_eq!(h.base_offset, 42);
        assert_eq!(compute_crc(&s), h.crc);
        let s = stamp(Some(99));
        let h = BatchHeader::parse(&s).unwrap().unwrap();
        assert!(h.is_log_append_time());
        assert_eq!(h.max_timestamp, 99);
        assert_eq!(compute_crc(&s), h.crc);
    }

    #[test]
    fn sequence_wraps() {
        let b = make_batch(3, 1, 0, i32::MAX - 1, 0);
        let h = BatchHeader::parse(&b).unwrap().unwrap();
        assert_eq!(h.last_sequence(), 0);
    }

    #[test]
    fn whole_batches_stops_at_partial() {
        let mut buf = make_batch(1, -1, -1, -1, 0);
        let one = buf.len();
        buf.extend_from_slice(&make_batch(1, -1, -1, -1, 0)[..10]);
        assert_eq!(whole_batches_len(&buf), one);
    }
}
