//! Records inside a batch, read as raw byte ranges.
//!
//! A merge that drops records from a batch must not disturb the ones it
//! keeps: their offset and timestamp deltas are relative to the batch header,
//! and Kafka's cleaner keeps the header's base offset and last offset so the
//! producer's sequence numbers stay valid. So instead of decoding records into
//! structs and re-encoding them (which would rebase offsets onto the first
//! kept record), the merge walks the decompressed record area, reads only the
//! fields it decides on, and copies the kept records' bytes verbatim; only the
//! codec runs again. The compressors are kafka-protocol's, the same ones its
//! `RecordBatchEncoder` uses, so every codec a producer may choose round-trips.
//!
//! Decompression is where a few bytes from a producer (or from a corrupt
//! disk or object store) can ask for gigabytes: a zstd or gzip bomb expands a
//! thousandfold and more, and a snappy block's header declares a length the
//! decoder allocates before it reads a byte. kafka-protocol's decompressors
//! write into a buffer without limit, so this module does the decompressing
//! with the same libraries into a sink capped at [`MAX_DECOMPRESSED_BYTES`],
//! and checks snappy's declared lengths before handing the block over.
//! Whatever decodes a stored batch into records goes through
//! [`decode_batch`], which is kafka-protocol's decoder with these codecs in
//! place of its own; keeping the cap here rather than in a patched copy of
//! kafka-protocol leaves that copy's codecs as published.

use bytes::{Bytes, BytesMut};
use kafka_protocol::compression::{Compressor, Decompressor, Gzip, Snappy, Zstd};
use kafka_protocol::records::{Compression, RecordBatchDecoder, RecordSet};
use std::io::Write;

use super::batch::{
    compute_crc, ATTRIBUTES_OFFSET, BATCH_LENGTH_OFFSET, CODEC_MASK, CRC_OFFSET, HEADER_LEN,
    LOG_OVERHEAD,
};
use super::FormatError;

/// The fields of one record the merge decides on, and its bytes.
#[derive(Debug, Clone, Copy)]
pub struct RawRecord<'a> {
    /// The whole record, its length prefix included.
    pub bytes: &'a [u8],
    pub offset_delta: i32,
    pub timestamp_delta: i64,
    pub key: Option<&'a [u8]>,
    pub value_is_null: bool,
}

/// The 128-bit hash that stands for a key in key indexes. At 2^-64 collision
/// odds per pair a wrong de-duplication is not a practical concern, and a
/// fixed width keeps index entries fixed-size whatever the key length.
pub fn key_hash(key: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(key)
}

fn codec_name(codec: i16) -> &'static str {
    match codec {
        0 => "none",
        1 => "gzip",
        2 => "snappy",
        3 => "lz4",
        4 => "zstd",
        _ => "unknown",
    }
}

fn codec_err(codec: i16, e: impl std::fmt::Display) -> FormatError {
    FormatError::Codec {
        codec: codec_name(codec),
        reason: e.to_string(),
    }
}

/// The most bytes one batch's record area may decompress to. Past it
/// decompression stops with an error instead of following a bomb (a few
/// kilobytes of zstd or gzip that expand to gigabytes) or a snappy header
/// declaring a length its block cannot hold. Kafka limits batches by their
/// compressed size (`message.max.bytes`, 1 MiB by default), so no real batch
/// comes near this.
pub const MAX_DECOMPRESSED_BYTES: usize = 128 << 20;

/// The uncompressed record area of a batch whose body (after the 61-byte
/// header) is `body`, at most [`MAX_DECOMPRESSED_BYTES`] of it.
pub fn decompress(codec: i16, body: &[u8]) -> Result<Bytes, FormatError> {
    let out = match codec {
        0 => return Ok(Bytes::copy_from_slice(body)),
        1 => {
            let mut d = flate2::write::GzDecoder::new(CappedWriter(Vec::new()));
            d.write_all(body)
                .and_then(|()| d.finish())
                .map(|sink| sink.0)
        }
        2 => {
            check_snappy_lengths(body).map_err(|e| codec_err(2, e))?;
            let mut input = body;
            return Snappy::decompress(&mut input, |b: &mut Bytes| Ok(b.clone()))
                .map_err(|e| codec_err(2, e));
        }
        3 => {
            let mut sink = CappedWriter(Vec::new());
            lz4::Decoder::new(body)
                .and_then(|mut d| std::io::copy(&mut d, &mut sink))
                .map(|_| sink.0)
        }
        4 => {
            let mut sink = CappedWriter(Vec::new());
            zstd::stream::copy_decode(body, &mut sink).map(|()| sink.0)
        }
        other => return Err(codec_err(other, "unknown codec")),
    };
    out.map(Bytes::from).map_err(|e| codec_err(codec, e))
}

/// A sink for decompressed bytes that refuses to grow past
/// [`MAX_DECOMPRESSED_BYTES`]; it holds only what the decoder produced.
struct CappedWriter(Vec<u8>);

impl Write for CappedWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.0.len() + buf.len() > MAX_DECOMPRESSED_BYTES {
            return Err(std::io::Error::other(format!(
                "decompressed data exceeds {MAX_DECOMPRESSED_BYTES} bytes"
            )));
        }
        // Grown exactly (doubling, but never past the cap), so the largest
        // allocation is the cap, not twice it.
        if self.0.capacity() - self.0.len() < buf.len() {
            let want = (self.0.len() + buf.len()).max(self.0.len() * 2);
            self.0
                .reserve_exact(want.min(MAX_DECOMPRESSED_BYTES) - self.0.len());
        }
        self.0.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Kafka's snappy is either one raw snappy block or xerial's framing: a
/// 16-byte magic header, then blocks each behind a big-endian u32 length.
const XERIAL_MAGIC: &[u8; 16] = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01";

/// Refuses a snappy record area whose blocks declare more than they can
/// hold. Each block starts with its uncompressed length, which the decoder
/// allocates (zeroed) before decoding the block. Snappy's densest element, a
/// 3-byte copy of 64 bytes, expands at most 64/3 times, so a declared length
/// beyond that of the block is a lie; so is one that would take the whole
/// area past the cap. Framing this walk cannot follow is left to the decoder
/// to refuse.
fn check_snappy_lengths(body: &[u8]) -> Result<(), String> {
    let check = |block: &[u8], so_far: usize| -> Result<usize, String> {
        let declared = snappy_declared_len(block).unwrap_or(0);
        if declared > block.len().saturating_mul(22).saturating_add(32)
            || so_far.saturating_add(declared) > MAX_DECOMPRESSED_BYTES
        {
            return Err(format!(
                "snappy block of {} bytes declares {declared} uncompressed bytes",
                block.len()
            ));
        }
        Ok(so_far + declared)
    };
    let Some(mut rest) = body.strip_prefix(&XERIAL_MAGIC[..]) else {
        return check(body, 0).map(|_| ());
    };
    let mut so_far = 0;
    while let Some((len, after)) = rest.split_first_chunk::<4>() {
        let Some(block) = after.get(..u32::from_be_bytes(*len) as usize) else {
            break;
        };
        so_far = check(block, so_far)?;
        rest = &after[block.len()..];
    }
    Ok(())
}

/// The uncompressed length a raw snappy block declares: a little-endian
/// base-128 varint of at most 5 bytes (`None` if it is not one).
fn snappy_declared_len(block: &[u8]) -> Option<usize> {
    let mut n = 0usize;
    for (i, &b) in block.iter().take(5).enumerate() {
        n |= ((b & 0x7f) as usize) << (7 * i);
        if b < 0x80 {
            return Some(n);
        }
    }
    None
}

/// Decodes one batch into records: kafka-protocol's decoder, with this
/// module's capped codecs in place of its own.
pub fn decode_batch(buf: &mut Bytes) -> anyhow::Result<RecordSet> {
    RecordBatchDecoder::decode_with_custom_compression(buf, Some(decompress_area))
}

/// Decodes every batch in `buf`, as [`decode_batch`] does one.
pub fn decode_batches(buf: &mut Bytes) -> anyhow::Result<Vec<RecordSet>> {
    let mut sets = Vec::new();
    while !buf.is_empty() {
        sets.push(decode_batch(buf)?);
    }
    Ok(sets)
}

fn decompress_area(area: &mut Bytes, compression: Compression) -> anyhow::Result<Bytes> {
    match compression {
        Compression::None => Ok(area.clone()),
        codec => Ok(decompress(codec as i16, area)?),
    }
}

/// Appends `raw` to `out`, compressed with `codec`.
pub fn compress(codec: i16, raw: &[u8], out: &mut Vec<u8>) -> Result<(), FormatError> {
    let fill = |tmp: &mut BytesMut| {
        tmp.extend_from_slice(raw);
        Ok(())
    };
    let res = match codec {
        0 => {
            out.extend_from_slice(raw);
            return Ok(());
        }
        1 => <Gzip as Compressor<Vec<u8>>>::compress(out, fill),
        2 => <Snappy as Compressor<Vec<u8>>>::compress(out, fill),
        3 => return compress_lz4(raw, out),
        4 => <Zstd as Compressor<Vec<u8>>>::compress(out, fill),
        other => return Err(codec_err(other, "unknown codec")),
    };
    res.map_err(|e| codec_err(codec, e))
}

/// LZ4 frames with independent blocks (all Kafka's Java reader accepts), at
/// the fast level: kafka-protocol's compressor uses level 4, which selects
/// LZ4HC and made recompression the bottleneck of a merge several times over.
fn compress_lz4(raw: &[u8], out: &mut Vec<u8>) -> Result<(), FormatError> {
    let mut enc = lz4::EncoderBuilder::new()
        .level(0)
        .block_mode(lz4::BlockMode::Independent)
        .build(out)
        .map_err(|e| codec_err(3, e))?;
    enc.write_all(raw).map_err(|e| codec_err(3, e))?;
    let (_, res) = enc.finish();
    res.map_err(|e| codec_err(3, e))
}

/// A produced batch with its records compressed by `codec` at `level` (the
/// codec's default for `None`), for a topic whose `compression.type` is not
/// the producer's. Only the record area is re-encoded, from `area` (the
/// batch's records, uncompressed): every header field stays as the producer
/// sent it (base offset, deltas, timestamps, producer id, epoch and base
/// sequence, so idempotent retries still match) except the codec bits, the
/// length and the CRC, which are recomputed.
pub fn recompress(
    batch: &[u8],
    area: &[u8],
    codec: i16,
    level: Option<i32>,
) -> Result<Vec<u8>, FormatError> {
    let mut out = Vec::with_capacity(HEADER_LEN + area.len());
    out.extend_from_slice(&batch[..HEADER_LEN]);
    match (codec, level) {
        (1, Some(level)) => {
            // Kafka's -1 is the zlib default.
            let level = if level < 0 {
                flate2::Compression::default()
            } else {
                flate2::Compression::new(level as u32)
            };
            let mut enc = flate2::write::GzEncoder::new(&mut out, level);
            enc.write_all(area).map_err(|e| codec_err(1, e))?;
            enc.finish().map_err(|e| codec_err(1, e))?;
        }
        (3, Some(level)) => {
            // Levels above 2 select LZ4HC, as Kafka's do.
            let mut enc = lz4::EncoderBuilder::new()
                .level(level.max(0) as u32)
                .block_mode(lz4::BlockMode::Independent)
                .build(&mut out)
                .map_err(|e| codec_err(3, e))?;
            enc.write_all(area).map_err(|e| codec_err(3, e))?;
            let (_, res) = enc.finish();
            res.map_err(|e| codec_err(3, e))?;
        }
        (4, Some(level)) => {
            zstd::stream::copy_encode(area, &mut out, level).map_err(|e| codec_err(4, e))?
        }
        _ => compress(codec, area, &mut out)?,
    }
    let length = (out.len() - LOG_OVERHEAD) as i32;
    out[BATCH_LENGTH_OFFSET..BATCH_LENGTH_OFFSET + 4].copy_from_slice(&length.to_be_bytes());
    let attrs = i16::from_be_bytes([out[ATTRIBUTES_OFFSET], out[ATTRIBUTES_OFFSET + 1]]);
    let attrs = (attrs & !CODEC_MASK) | codec;
    out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&attrs.to_be_bytes());
    let crc = compute_crc(&out);
    out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    Ok(out)
}

fn varint(buf: &[u8], pos: &mut usize) -> Result<i64, String> {
    let mut raw: u64 = 0;
    let mut shift = 0;
    loop {
        let b = *buf.get(*pos).ok_or("truncated varint")?;
        *pos += 1;
        raw |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return Err("varint too long".into());
        }
    }
    // Kafka's varints are zigzag-encoded.
    Ok(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

fn bytes_field<'a>(buf: &'a [u8], pos: &mut usize) -> Result<Option<&'a [u8]>, String> {
    let len = varint(buf, pos)?;
    if len < 0 {
        return Ok(None);
    }
    let end = pos
        .checked_add(len as usize)
        .filter(|&e| e <= buf.len())
        .ok_or("field runs past its record")?;
    let field = &buf[*pos..end];
    *pos = end;
    Ok(Some(field))
}

/// Calls `f` for each of the `count` records in an uncompressed record area.
pub fn walk<'a>(
    area: &'a [u8],
    count: i32,
    mut f: impl FnMut(RawRecord<'a>),
) -> Result<(), String> {
    let mut pos = 0usize;
    for _ in 0..count {
        let start = pos;
        let len = varint(area, &mut pos)?;
        let end = pos
            .checked_add(usize::try_from(len).map_err(|_| "negative record length")?)
            .filter(|&e| e <= area.len())
            .ok_or("record runs past its batch")?;
        let body = &area[..end];
        let mut p = pos + 1; // attributes (unused by Kafka, always 0)
        let timestamp_delta = varint(body, &mut p)?;
        let offset_delta = varint(body, &mut p)? as i32;
        let key = bytes_field(body, &mut p)?;
        let value_is_null = bytes_field(body, &mut p)?.is_none();
        f(RawRecord {
            bytes: &area[start..end],
            offset_delta,
            timestamp_delta,
            key,
            value_is_null,
        });
        pos = end;
    }
    if pos != area.len() {
        return Err(format!(
            "{} bytes left after {count} records",
            area.len() - pos
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::batch::{validate_produced, BatchHeader};
    use kafka_protocol::records::{
        Compression, Record, RecordBatchEncoder, RecordEncodeOptions, TimestampType,
    };

    fn record(offset: i64, key: Option<&str>, value: Option<&str>) -> Record {
        Record {
            transactional: false,
            control: false,
            delete_horizon: false,
            partition_leader_epoch: -1,
            producer_id: -1,
            producer_epoch: -1,
            timestamp_type: TimestampType::Creation,
            offset,
            // The encoder keeps records in one batch while offset - sequence
            // is constant; the batch's base sequence comes out as -1.
            sequence: offset as i32 - 1,
            timestamp: 1000 + offset * 10,
            key: key.map(|k| Bytes::copy_from_slice(k.as_bytes())),
            value: value.map(|v| Bytes::copy_from_slice(v.as_bytes())),
            headers: Default::default(),
        }
    }

    #[test]
    fn walks_records_of_every_codec() {
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let recs = vec![
                record(0, Some("a"), Some("1")),
                record(1, None, Some("2")),
                record(2, Some("b"), None),
            ];
            let mut buf = BytesMut::new();
            RecordBatchEncoder::encode(
                &mut buf,
                &recs,
                &RecordEncodeOptions {
                    version: 2,
                    compression,
                },
            )
            .unwrap();
            let codec = i16::from_be_bytes([buf[21], buf[22]]) & CODEC_MASK;
            let area = decompress(codec, &buf[61..]).unwrap();
            let mut seen = Vec::new();
            walk(&area, 3, |r| {
                seen.push((r.offset_delta, r.timestamp_delta, r.key, r.value_is_null))
            })
            .unwrap();
            assert_eq!(
                seen,
                vec![
                    (0, 0, Some(&b"a"[..]), false),
                    (1, 10, None, false),
                    (2, 20, Some(&b"b"[..]), true)
                ]
            );
            let mut again = Vec::new();
            compress(codec, &area, &mut again).unwrap();
            assert_eq!(decompress(codec, &again).unwrap(), area);
        }
    }

    #[test]
    fn recompression_keeps_the_header_and_records() {
        let mut recs: Vec<Record> = (0..50)
            .map(|i| record(i, Some("key"), Some("a value that repeats itself")))
            .collect();
        for r in &mut recs {
            r.producer_id = 7;
            r.producer_epoch = 2;
            r.sequence += 11;
        }
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &recs, &options).unwrap();
        let before = BatchHeader::parse(&buf).unwrap().unwrap();
        for (codec, level) in [
            (1, Some(9)),
            (1, Some(-1)),
            (2, None),
            (3, Some(9)),
            (4, Some(-5)),
            (4, Some(19)),
            (0, None),
        ] {
            let out = recompress(&buf, &buf[HEADER_LEN..], codec, level).unwrap();
            let after = validate_produced(&out).unwrap();
            assert_eq!(after.attributes & CODEC_MASK, codec);
            assert_eq!(
                (
                    after.base_offset,
                    after.last_offset_delta,
                    after.base_timestamp,
                    after.max_timestamp
                ),
                (
                    before.base_offset,
                    before.last_offset_delta,
                    before.base_timestamp,
                    before.max_timestamp
                )
            );
            assert_eq!(
                (
                    after.producer_id,
                    after.producer_epoch,
                    after.base_sequence,
                    after.record_count
                ),
                (7, 2, 10, 50)
            );
            assert_eq!(
                decompress(codec, &out[HEADER_LEN..]).unwrap(),
                &buf[HEADER_LEN..]
            );
            if codec != 0 {
                assert!(
                    out.len() < buf.len(),
                    "codec {codec} did not shrink the batch"
                );
            }
        }
    }

    /// A batch whose record area is `body` exactly, as `codec` would leave
    /// it, with a correct length and CRC.
    fn batch_with_body(codec: i16, body: &[u8]) -> Vec<u8> {
        let mut buf = BytesMut::new();
        let options = RecordEncodeOptions {
            version: 2,
            compression: Compression::None,
        };
        RecordBatchEncoder::encode(&mut buf, &[record(0, Some("k"), Some("v"))], &options).unwrap();
        let mut out = buf[..HEADER_LEN].to_vec();
        out.extend_from_slice(body);
        let length = (out.len() - LOG_OVERHEAD) as i32;
        out[BATCH_LENGTH_OFFSET..BATCH_LENGTH_OFFSET + 4].copy_from_slice(&length.to_be_bytes());
        out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2].copy_from_slice(&codec.to_be_bytes());
        let crc = compute_crc(&out);
        out[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        out
    }

    #[test]
    fn decompression_stops_at_the_cap_in_every_codec() {
        let zeros = vec![0u8; MAX_DECOMPRESSED_BYTES + 1];
        let at_cap = &zeros[..MAX_DECOMPRESSED_BYTES];
        for codec in [1, 3, 4] {
            let mut bomb = Vec::new();
            compress(codec, &zeros, &mut bomb).unwrap();
            let err = decompress(codec, &bomb).unwrap_err().to_string();
            assert!(err.contains("exceeds"), "codec {codec}: {err}");
            // kafka-protocol's decoder, given this module's codecs, stops too.
            let err = decode_batch(&mut Bytes::from(batch_with_body(codec, &bomb)))
                .unwrap_err()
                .to_string();
            assert!(err.contains("exceeds"), "codec {codec}: {err}");
            let mut full = Vec::new();
            compress(codec, at_cap, &mut full).unwrap();
            assert_eq!(decompress(codec, &full).unwrap().len(), at_cap.len());
        }
    }

    #[test]
    fn snappy_blocks_must_hold_what_they_declare() {
        // A raw block declaring 4 GiB - 1 in six bytes.
        let raw_lie = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
        // Xerial framing: a real block, then a lying one.
        let mut xerial = XERIAL_MAGIC.to_vec();
        let mut real = Vec::new();
        compress(2, b"an honest block", &mut real).unwrap();
        let first = &real[XERIAL_MAGIC.len() + 4..];
        for block in [first, &raw_lie[..]] {
            xerial.extend_from_slice(&(block.len() as u32).to_be_bytes());
            xerial.extend_from_slice(block);
        }
        for body in [&raw_lie[..], &xerial[..]] {
            let err = decompress(2, body).unwrap_err().to_string();
            assert!(err.contains("declares 4294967295"), "{err}");
            let err = decode_batch(&mut Bytes::from(batch_with_body(2, body)))
                .unwrap_err()
                .to_string();
            assert!(err.contains("declares 4294967295"), "{err}");
        }
        // Blocks that hold what they declare, many of them, decode.
        let text: Vec<u8> = (0..200_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let mut framed = Vec::new();
        compress(2, &text, &mut framed).unwrap();
        assert!(framed.starts_with(XERIAL_MAGIC));
        assert_eq!(decompress(2, &framed).unwrap(), text);
    }

    #[test]
    fn decode_batch_reads_every_codec() {
        let recs = vec![record(0, Some("a"), Some("1")), record(1, None, None)];
        for compression in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let mut buf = BytesMut::new();
            let options = RecordEncodeOptions {
                version: 2,
                compression,
            };
            RecordBatchEncoder::encode(&mut buf, &recs, &options).unwrap();
            let mut twice = buf.clone();
            twice.extend_from_slice(&buf);
            let sets = decode_batches(&mut twice.freeze()).unwrap();
            assert_eq!(sets.len(), 2);
            for set in sets {
                assert_eq!(set.compression, compression);
                let got: Vec<_> = set
                    .records
                    .iter()
                    .map(|r| (r.offset, r.key.clone()))
                    .collect();
                assert_eq!(got, vec![(0, Some(Bytes::from("a"))), (1, None)]);
            }
        }
    }
}
