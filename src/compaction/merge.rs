//! The streaming merge of contiguous segments into one of the next level.
//!
//! For `cleanup.policy=compact` the merge runs in two passes, neither of
//! which holds a segment in memory:
//!
//! 1. The sources' key indexes, each sorted by key hash, are merged like the
//!    runs of a merge sort. Per key that yields the newest offset across all
//!    sources, which is marked in a bitmap with one bit per offset of the
//!    merged range (records / 8 bytes, however many distinct keys there are).
//!    The same pass writes the output's key index, already sorted.
//! 2. The sources' batches stream in offset order through that bitmap. A batch
//!    whose records all survive is copied byte for byte (decided from a
//!    popcount of its offset range, without decompressing); one that loses
//!    some is rewritten with the survivors' record bytes, recompressed with
//!    its own codec; one that loses all is dropped.
//!
//! The rewrite follows Kafka's cleaner (`MemoryRecords.filterTo`): offsets
//! never change, and a rewritten batch keeps its base offset, last offset
//! delta, base timestamp, producer id and epoch, base sequence and codec, so
//! a consumer sees only gaps and an idempotent producer's sequence numbers
//! stay valid. The last batch of each producer id is never dropped: emptied,
//! it stays as a bare header, as Kafka's `RETAIN_EMPTY` does, because that
//! batch is what rebuilds the producer's state. Records younger than
//! `min.compaction.lag.ms` are kept even when superseded. A tombstone (the
//! newest record of its key, with a null value) is dropped only when the
//! caller says the merge includes the partition's oldest data and the
//! tombstone is older than `delete.retention.ms`, and only if no older value
//! of its key is being kept for its youth, or that value would come back.
//! Records without a key cannot be compacted; like Kafka's cleaner, the merge
//! drops them (once they are past the min lag).
//!
//! For `cleanup.policy=delete` the merge concatenates: every batch is copied
//! byte for byte, so small fresh segments still become large frozen ones.

use std::collections::HashMap;
use std::io::BufReader;

use bytes::BufMut;

use super::io::{KeyIndexSink, SegmentSink, SegmentSource};
use super::CompactionError;
use crate::catalog::config::TopicSettings;
use crate::format::batch::{
    compute_crc, BatchHeader, BatchStream, ATTRIBUTES_OFFSET, BASE_TIMESTAMP_OFFSET,
    BATCH_LENGTH_OFFSET, CODEC_MASK, CRC_OFFSET, HEADER_LEN, LOG_OVERHEAD, MAX_TIMESTAMP_OFFSET,
    RECORD_COUNT_OFFSET,
};
use crate::format::control::AbortedTxn;
use crate::format::key_index::{merge_sorted, KeyIndexReader, KeyIndexWriter, ProducerLast};
use crate::format::key_sketch::{KeySketch, KeyStats};
use crate::format::records;
use crate::format::segment::{SegmentMeta, SEGMENT_FORMAT_VERSION};
use crate::format::FormatError;
use crate::log::index::{SegmentIndex, INDEX_INTERVAL_BYTES};
use crate::log::key_index::{add_batch_records, KeyIndexBuilder, DEFAULT_BUILD_BUDGET};

const KEY_INDEX_READ_BUFFER: usize = 64 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MergeMode {
    /// Keep the newest record per key (`cleanup.policy` includes `compact`).
    Compact,
    /// Copy every batch (`cleanup.policy=delete`).
    Concatenate,
}

#[derive(Debug, Clone, Copy)]
pub struct MergeOptions {
    pub mode: MergeMode,
    /// Level of the output segment (the sources' level + 1).
    pub target_level: u32,
    /// Records with a timestamp at or after this are kept even when
    /// superseded: now - `min.compaction.lag.ms`.
    pub keep_newer_than: i64,
    /// Set only when the merge includes the partition's oldest data:
    /// tombstones older than this (now - `delete.retention.ms`) may go.
    pub tombstone_cutoff: Option<i64>,
    /// Set when the merge ends at the partition's tiered end: its last
    /// batch stays, emptied to a bare header if nothing in it survives, so
    /// the log still reaches its end offset and a consumer reading up to
    /// the high watermark gets there (Kafka never cleans the active
    /// segment, which holds the last batch; here idle heads roll and tier).
    pub keep_last_batch: bool,
    pub now_ms: i64,
}

impl MergeOptions {
    /// The options a topic's configuration implies for a merge into
    /// `target_level`; `includes_oldest` says whether the first source is
    /// the partition's oldest segment.
    pub fn for_topic(
        config: &TopicSettings,
        target_level: u32,
        includes_oldest: bool,
        now_ms: i64,
    ) -> MergeOptions {
        MergeOptions {
            mode: if config.cleanup.compact {
                MergeMode::Compact
            } else {
                MergeMode::Concatenate
            },
            target_level,
            keep_newer_than: now_ms.saturating_sub(config.min_compaction_lag_ms),
            tombstone_cutoff: includes_oldest
                .then(|| now_ms.saturating_sub(config.delete_retention_ms)),
            keep_last_batch: false,
            now_ms,
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MergeStats {
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub input_batches: u64,
    pub output_batches: u64,
    /// Batches copied byte for byte.
    pub batches_copied: u64,
    /// Batches rewritten with some of their records.
    pub batches_rewritten: u64,
    /// Batches kept as a bare header for their producer id.
    pub batches_emptied: u64,
    pub batches_dropped: u64,
    pub records_removed: u64,
    pub tombstones_removed: u64,
    /// Records without a key removed from batches that had to be decoded
    /// (a batch dropped whole is not decoded, so its keyless records are
    /// counted only in `records_removed`).
    pub keyless_removed: u64,
    /// Keys in the output's key index.
    pub keys: u64,
}

/// One bit per offset of the merged range.
struct Bitmap {
    base: i64,
    words: Vec<u64>,
}

impl Bitmap {
    fn new(base: i64, span: u64) -> Bitmap {
        Bitmap {
            base,
            words: vec![0; span.div_ceil(64) as usize],
        }
    }
    fn set(&mut self, offset: i64) {
        let i = (offset - self.base) as usize;
        self.words[i / 64] |= 1 << (i % 64);
    }
    fn get(&self, offset: i64) -> bool {
        let i = (offset - self.base) as usize;
        self.words[i / 64] & (1 << (i % 64)) != 0
    }
    /// Set bits in [first, last].
    fn count(&self, first: i64, last: i64) -> u64 {
        let (a, b) = ((first - self.base) as usize, (last - self.base) as usize);
        let (wa, wb) = (a / 64, b / 64);
        let lo_mask = !0u64 << (a % 64);
        let hi_mask = !0u64 >> (63 - b % 64);
        if wa == wb {
            return (self.words[wa] & lo_mask & hi_mask).count_ones() as u64;
        }
        let mut n = (self.words[wa] & lo_mask).count_ones() as u64;
        n += self.words[wa + 1..wb]
            .iter()
            .map(|w| w.count_ones() as u64)
            .sum::<u64>();
        n + (self.words[wb] & hi_mask).count_ones() as u64
    }
}

/// What the output has so far, to write its indexes and descriptor.
struct Output<'a> {
    sink: &'a mut dyn SegmentSink,
    base_offset: i64,
    size: u64,
    batch_count: u64,
    max_timestamp: i64,
    max_timestamp_position: u64,
    records: u64,
    index: SegmentIndex,
}

impl Output<'_> {
    fn emit(&mut self, bytes: &[u8], header: &BatchHeader) -> Result<(), CompactionError> {
        let position = u32::try_from(self.size).map_err(|_| {
            CompactionError::InvalidMerge("output segment would exceed 4 GiB".into())
        })?;
        self.sink.append_log(bytes)?;
        self.index.on_append(
            (header.base_offset - self.base_offset) as u32,
            position,
            bytes.len() as u32,
            header.max_timestamp,
            INDEX_INTERVAL_BYTES,
        );
        if header.max_timestamp > self.max_timestamp {
            self.max_timestamp = header.max_timestamp;
            self.max_timestamp_position = self.size;
        }
        self.size += bytes.len() as u64;
        self.batch_count += 1;
        self.records += header.record_count.max(0) as u64;
        Ok(())
    }
}

/// Merges `sources` (contiguous, oldest first) into one segment written to
/// `sink`, and returns its descriptor (already published by the sink).
///
/// `aborted` lists the partition's aborted transactions that overlap the
/// sources (their markers may lie beyond them); the caller merges only
/// segments below the last stable offset, so every transaction with data
/// here is decided.
pub fn merge(
    sources: &[&dyn SegmentSource],
    sink: &mut dyn SegmentSink,
    opts: &MergeOptions,
    aborted: &[AbortedTxn],
) -> Result<(SegmentMeta, MergeStats), CompactionError> {
    let first = sources
        .first()
        .ok_or_else(|| CompactionError::InvalidMerge("no sources".into()))?
        .meta()
        .clone();
    for pair in sources.windows(2) {
        let (a, b) = (pair[0].meta(), pair[1].meta());
        if a.next_offset != b.base_offset {
            return Err(CompactionError::InvalidMerge(format!(
                "sources are not contiguous: {}..{} then {}",
                a.base_offset, a.next_offset, b.base_offset
            )));
        }
    }
    let base_offset = first.base_offset;
    let next_offset = sources.last().expect("non-empty").meta().next_offset;
    let span = (next_offset - base_offset) as u64;
    // Index entries and key index entries hold offsets relative to the base.
    if span > u32::MAX as u64 {
        return Err(CompactionError::InvalidMerge(format!(
            "{span} offsets do not fit one segment"
        )));
    }
    let mut stats = MergeStats::default();
    let mut out = Output {
        sink,
        base_offset,
        size: 0,
        batch_count: 0,
        max_timestamp: -1,
        max_timestamp_position: 0,
        records: 0,
        index: SegmentIndex::default(),
    };

    let txns = Txns::new(aborted);
    let filter = match opts.mode {
        MergeMode::Concatenate => None,
        MergeMode::Compact => Some(mark_survivors(
            sources,
            out.sink,
            base_offset,
            span,
            opts,
            &txns,
            &mut stats,
        )?),
    };
    let mut cleaner = TxnCleaner::default();
    let mut kept_aborted: Vec<AbortedTxn> = Vec::new();

    let mut kept = Kept::default();
    let mut rebuilt = Vec::new();
    for source in sources {
        let meta = source.meta();
        let mut stream = BatchStream::new(source.log()?);
        while let Some((h, bytes)) = stream.next_batch()? {
            if h.base_offset < meta.base_offset || h.last_offset() >= meta.next_offset {
                return Err(CompactionError::CorruptBatch {
                    offset: h.base_offset,
                    reason: format!(
                        "batch lies outside its segment {}..{}",
                        meta.base_offset, meta.next_offset
                    ),
                });
            }
            stats.input_batches += 1;
            stats.input_bytes += bytes.len() as u64;
            let Some((bits, last_of_producer, _)) = &filter else {
                stats.batches_copied += 1;
                out.emit(bytes, &h)?;
                continue;
            };
            // Transactions, as Kafka's cleaner treats them: an aborted
            // transaction's batches go; a marker goes once no batch of its
            // transaction is left and delete.retention.ms passed (like a
            // tombstone, only in a merge that starts at the oldest data, so
            // no earlier batch of it can remain).
            let discard = if h.is_control() {
                let ended = cleaner.on_marker(&h, &txns, base_offset);
                let gone =
                    ended.discardable && opts.tombstone_cutoff.is_some_and(|c| h.max_timestamp < c);
                if !gone {
                    kept_aborted.extend(ended.aborted);
                }
                gone
            } else {
                cleaner.on_data(&h, &txns)
            };
            let survivors = if discard {
                0
            } else if h.is_control() {
                h.record_count as u64
            } else if h.record_count == 0 {
                // Emptied by an earlier merge: it goes once its producer has a
                // later batch, below.
                u64::MAX
            } else {
                bits.count(h.base_offset, h.last_offset())
            };
            if survivors == h.record_count as u64 {
                stats.batches_copied += 1;
                out.emit(bytes, &h)?;
                continue;
            }
            let kept_count = if survivors == u64::MAX {
                0
            } else if survivors == 0 && (discard || h.max_timestamp < opts.keep_newer_than) {
                // Nothing survives and nothing is young: no need to decode.
                stats.records_removed += h.record_count as u64;
                0
            } else {
                filter_records(&h, bytes, bits, opts, &mut kept, &mut stats)?
            };
            if kept_count == h.record_count as usize && h.record_count > 0 {
                stats.batches_copied += 1;
                out.emit(bytes, &h)?;
            } else if kept_count > 0 {
                rebuild_batch(
                    bytes,
                    &h,
                    &kept.records,
                    kept.max_timestamp,
                    kept_count,
                    &mut rebuilt,
                )?;
                let nh = BatchHeader::parse(&rebuilt)?.expect("a whole header");
                stats.batches_rewritten += 1;
                out.emit(&rebuilt, &nh)?;
            } else if (h.has_producer_id()
                && last_of_producer.get(&h.producer_id) == Some(&h.base_offset))
                || (opts.keep_last_batch && h.last_offset() == next_offset - 1)
            {
                if h.record_count == 0 {
                    stats.batches_copied += 1;
                    out.emit(bytes, &h)?;
                    continue;
                }
                empty_batch(bytes, &h, &mut rebuilt);
                let nh = BatchHeader::parse(&rebuilt)?.expect("a whole header");
                stats.batches_emptied += 1;
                out.emit(&rebuilt, &nh)?;
            } else {
                stats.batches_dropped += 1;
            }
        }
    }

    let (offset_index, time_index) = out.index.encode();
    let keys = filter.map(|(_, _, sketch)| KeyStats {
        records: out.records,
        keys: stats.keys,
        sketch,
    });
    let meta = SegmentMeta {
        format_version: SEGMENT_FORMAT_VERSION,
        level: opts.target_level,
        base_offset,
        // The output covers the sources' whole range even if its last
        // batches were dropped, so the next segment stays contiguous.
        next_offset,
        size: out.size,
        batch_count: out.batch_count,
        max_timestamp: out.max_timestamp,
        max_timestamp_position: out.max_timestamp_position,
        created_ms: sources
            .iter()
            .map(|s| s.meta().created_ms)
            .min()
            .unwrap_or(opts.now_ms),
        sealed_ms: opts.now_ms,
        keys,
        aborted: match opts.mode {
            MergeMode::Concatenate => sources
                .iter()
                .flat_map(|s| s.meta().aborted.iter().copied())
                .collect(),
            MergeMode::Compact => kept_aborted,
        },
    };
    stats.output_bytes = out.size;
    stats.output_batches = out.batch_count;
    out.sink.finish(&offset_index, &time_index, &meta)?;
    Ok((meta, stats))
}

/// Pass 1: merges the key indexes, marks each key's surviving offset and
/// writes the output's key index. Returns the bitmap, per producer id the
/// base offset of its last batch in the merged range, and the sketch of the
/// output's keys.
fn mark_survivors(
    sources: &[&dyn SegmentSource],
    sink: &mut dyn SegmentSink,
    base_offset: i64,
    span: u64,
    opts: &MergeOptions,
    txns: &Txns,
    stats: &mut MergeStats,
) -> Result<(Bitmap, HashMap<i64, i64>, KeySketch), CompactionError> {
    let mut readers = Vec::with_capacity(sources.len());
    let mut last_of_producer = HashMap::new();
    for s in sources {
        let meta = s.meta();
        // A segment's key index counts every record; one holding aborted
        // records gets an index without them, or an aborted value would
        // supersede a committed one.
        let index: Box<dyn std::io::Read + Send + '_> =
            if txns.overlaps(meta.base_offset, meta.next_offset) {
                Box::new(std::io::Cursor::new(committed_key_index(*s, txns)?))
            } else {
                s.key_index()?
            };
        let r = KeyIndexReader::new(BufReader::with_capacity(KEY_INDEX_READ_BUFFER, index))?;
        if r.base_offset() != s.meta().base_offset {
            return Err(FormatError::CorruptIndex(format!(
                "key index of segment {} says base offset {}",
                s.meta().base_offset,
                r.base_offset()
            ))
            .into());
        }
        // Sources are oldest first, so later ones overwrite.
        for p in r.producers() {
            last_of_producer.insert(p.producer_id, p.batch_base_offset);
        }
        readers.push(r);
    }
    let mut producers: Vec<ProducerLast> = last_of_producer
        .iter()
        .map(|(&producer_id, &batch_base_offset)| ProducerLast {
            producer_id,
            batch_base_offset,
        })
        .collect();
    producers.sort_unstable_by_key(|p| p.producer_id);

    let mut bits = Bitmap::new(base_offset, span);
    let mut sketch = KeySketch::default();
    let mut writer = KeyIndexWriter::new(KeyIndexSink(sink), base_offset, &producers)?;
    merge_sorted(&mut readers, |e| {
        let droppable_tombstone = e.tombstone
            && opts.tombstone_cutoff.is_some_and(|c| e.timestamp < c)
            // Not kept for its own youth, and no older value kept for its youth.
            && e.timestamp < opts.keep_newer_than
            && e.max_version_timestamp < opts.keep_newer_than;
        if droppable_tombstone {
            stats.tombstones_removed += 1;
            return Ok(());
        }
        bits.set(e.offset);
        sketch.add(e.hash);
        stats.keys += 1;
        writer.push(&e)
    })?;
    writer.finish()?;
    Ok((bits, last_of_producer, sketch))
}

/// The aborted transactions a merge knows of, by producer id.
struct Txns {
    by_producer: HashMap<i64, Vec<AbortedTxn>>,
}

impl Txns {
    fn new(aborted: &[AbortedTxn]) -> Txns {
        let mut by_producer: HashMap<i64, Vec<AbortedTxn>> = HashMap::new();
        for a in aborted {
            by_producer.entry(a.producer_id).or_default().push(*a);
        }
        Txns { by_producer }
    }

    fn overlaps(&self, base: i64, next: i64) -> bool {
        self.by_producer
            .values()
            .flatten()
            .any(|a| a.first_offset < next && a.last_offset >= base)
    }

    /// The aborted transaction data batch `h` belongs to, if any: a
    /// producer has one transaction open at a time, so its batches between
    /// an aborted transaction's first offset and its marker are that
    /// transaction's.
    fn aborted_of(&self, h: &BatchHeader) -> Option<&AbortedTxn> {
        if !h.is_transactional() || h.is_control() {
            return None;
        }
        self.by_producer
            .get(&h.producer_id)?
            .iter()
            .find(|a| a.first_offset <= h.base_offset && h.base_offset < a.last_offset)
    }

    /// The aborted transaction whose marker is batch `h`.
    fn ended_by(&self, h: &BatchHeader) -> Option<&AbortedTxn> {
        self.by_producer
            .get(&h.producer_id)?
            .iter()
            .find(|a| a.last_offset == h.base_offset)
    }
}

/// What a merge saw of each producer's transactions so far (Kafka's
/// `CleanedTransactionMetadata`).
#[derive(Default)]
struct TxnCleaner {
    /// Producers whose committed (or not yet ended) transaction has a batch
    /// in the merge.
    committed_data: std::collections::HashSet<i64>,
    /// Aborted transactions (by marker offset) with a batch in the merge.
    aborted_data: std::collections::HashSet<i64>,
}

/// What becomes of a marker.
struct MarkerFate {
    /// No batch of its transaction is left.
    discardable: bool,
    /// The aborted transaction it ends, kept in the output's index with it.
    aborted: Option<AbortedTxn>,
}

impl TxnCleaner {
    /// Whether data batch `h` is discarded: it belongs to an aborted transaction.
    fn on_data(&mut self, h: &BatchHeader, txns: &Txns) -> bool {
        if let Some(a) = txns.aborted_of(h) {
            self.aborted_data.insert(a.last_offset);
            return true;
        }
        if h.is_transactional() {
            self.committed_data.insert(h.producer_id);
        }
        false
    }

    fn on_marker(&mut self, h: &BatchHeader, txns: &Txns, merge_base: i64) -> MarkerFate {
        if h.record_count == 0 {
            // Emptied by an earlier merge.
            return MarkerFate {
                discardable: true,
                aborted: None,
            };
        }
        let committed_data = self.committed_data.remove(&h.producer_id);
        match txns.ended_by(h) {
            Some(a) => MarkerFate {
                discardable: !self.aborted_data.remove(&a.last_offset)
                    && a.first_offset >= merge_base,
                aborted: Some(*a),
            },
            None => MarkerFate {
                discardable: !committed_data,
                aborted: None,
            },
        }
    }
}

/// The key index of `source` without the records of aborted transactions.
fn committed_key_index(
    source: &dyn SegmentSource,
    txns: &Txns,
) -> Result<Vec<u8>, CompactionError> {
    let meta = source.meta();
    let mut builder = KeyIndexBuilder::new(
        meta.base_offset,
        DEFAULT_BUILD_BUDGET,
        &std::env::temp_dir(),
    );
    let mut stream = BatchStream::new(source.log()?);
    while let Some((h, bytes)) = stream.next_batch()? {
        if txns.aborted_of(&h).is_some() {
            builder.add_batch(&h);
        } else {
            add_batch_records(&mut builder, &h, bytes)?;
        }
    }
    Ok(builder.finish(Vec::new())?)
}

/// The survivors of one batch, reused across batches.
#[derive(Default)]
struct Kept {
    records: Vec<u8>,
    max_timestamp: i64,
}

/// Decodes one batch and collects the bytes of the records that survive.
fn filter_records(
    h: &BatchHeader,
    bytes: &[u8],
    bits: &Bitmap,
    opts: &MergeOptions,
    kept: &mut Kept,
    stats: &mut MergeStats,
) -> Result<usize, CompactionError> {
    let corrupt = |reason: String| CompactionError::CorruptBatch {
        offset: h.base_offset,
        reason,
    };
    if compute_crc(bytes) != h.crc {
        return Err(corrupt("CRC mismatch".into()));
    }
    let area = records::decompress(h.attributes & CODEC_MASK, &bytes[HEADER_LEN..])?;
    kept.records.clear();
    kept.max_timestamp = -1;
    let mut count = 0usize;
    let mut walk_err = None;
    records::walk(&area, h.record_count, |r| {
        let offset = h.base_offset + r.offset_delta as i64;
        if offset < h.base_offset || offset > h.last_offset() {
            walk_err = Some(format!(
                "record offset delta {} out of range",
                r.offset_delta
            ));
            return;
        }
        let ts = if h.is_log_append_time() {
            h.max_timestamp
        } else {
            h.base_timestamp + r.timestamp_delta
        };
        if bits.get(offset) || ts >= opts.keep_newer_than {
            kept.records.extend_from_slice(r.bytes);
            kept.max_timestamp = kept.max_timestamp.max(ts);
            count += 1;
        } else {
            stats.records_removed += 1;
            if r.key.is_none() {
                stats.keyless_removed += 1;
            }
        }
    })
    .map_err(corrupt)?;
    if let Some(e) = walk_err {
        return Err(corrupt(e));
    }
    Ok(count)
}

/// A batch with only `kept` records: the original header with its length,
/// record count, max timestamp and CRC updated, the records recompressed
/// with the original codec. Base offset, last offset delta and base
/// timestamp stay, so the kept records' deltas need no rewriting.
fn rebuild_batch(
    original: &[u8],
    h: &BatchHeader,
    kept: &[u8],
    kept_max_timestamp: i64,
    kept_count: usize,
    out: &mut Vec<u8>,
) -> Result<(), CompactionError> {
    out.clear();
    out.extend_from_slice(&original[..HEADER_LEN]);
    records::compress(h.attributes & CODEC_MASK, kept, out)?;
    let len = (out.len() - LOG_OVERHEAD) as i32;
    (&mut out[BATCH_LENGTH_OFFSET..BATCH_LENGTH_OFFSET + 4]).put_i32(len);
    if !h.is_log_append_time() {
        // Kafka recomputes the max timestamp from what is kept; under
        // LogAppendTime it is the append time of the whole batch and stays.
        (&mut out[MAX_TIMESTAMP_OFFSET..MAX_TIMESTAMP_OFFSET + 8]).put_i64(kept_max_timestamp);
    }
    (&mut out[RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4]).put_i32(kept_count as i32);
    let crc = compute_crc(out);
    (&mut out[CRC_OFFSET..CRC_OFFSET + 4]).put_u32(crc);
    Ok(())
}

/// A bare header standing for an emptied batch, as Kafka's
/// `DefaultRecordBatch.writeEmptyHeader` writes it: no codec, no records,
/// both timestamps set to the batch's max timestamp, offsets and producer
/// fields unchanged.
fn empty_batch(original: &[u8], h: &BatchHeader, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&original[..HEADER_LEN]);
    (&mut out[BATCH_LENGTH_OFFSET..BATCH_LENGTH_OFFSET + 4])
        .put_i32((HEADER_LEN - LOG_OVERHEAD) as i32);
    (&mut out[ATTRIBUTES_OFFSET..ATTRIBUTES_OFFSET + 2]).put_i16(h.attributes & !CODEC_MASK);
    (&mut out[BASE_TIMESTAMP_OFFSET..BASE_TIMESTAMP_OFFSET + 8]).put_i64(h.max_timestamp);
    (&mut out[RECORD_COUNT_OFFSET..RECORD_COUNT_OFFSET + 4]).put_i32(0);
    let crc = compute_crc(out);
    (&mut out[CRC_OFFSET..CRC_OFFSET + 4]).put_u32(crc);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::Path;

    use bytes::Bytes;
    use kafka_protocol::records::{Compression, RecordBatchDecoder};

    use super::*;
    use crate::compaction::io::{LocalSegment, LocalSink};
    use crate::format::batch::encode_batch;
    use crate::log::{AppendConfig, Partition, Visibility};

    const OLD: i64 = 1_000_000;
    const PRODUCER: i64 = 4242;

    /// (offset, key, value, timestamp) of a decoded record.
    type Rec = (i64, Option<Bytes>, Option<Bytes>, i64);

    struct Spec {
        keys: Vec<Option<String>>,
        tombstone_every: usize,
        compression: Compression,
        producer: Option<i32>,
        timestamp: i64,
    }

    fn encode(spec: &Spec, serial: &mut u64) -> Bytes {
        let records = spec
            .keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                *serial += 1;
                let tomb = spec.tombstone_every > 0
                    && (*serial).is_multiple_of(spec.tombstone_every as u64);
                let value = (!tomb).then(|| Bytes::from(format!("value-{serial}")));
                (
                    k.as_ref().map(|k| Bytes::from(k.clone())),
                    value,
                    spec.timestamp + i as i64,
                )
            })
            .collect();
        let producer = spec.producer.map(|seq| (PRODUCER, 0, seq));
        encode_batch(records, producer, spec.compression).unwrap()
    }

    fn cfg(segment_bytes: u64) -> AppendConfig {
        AppendConfig {
            max_message_bytes: 1 << 20,
            segment_bytes,
            segment_ms: i64::MAX,
            segment_jitter_ms: 0,
            index_interval_bytes: 4096,
            log_append_time: false,
            compact: false,
        }
    }

    /// A partition of keyed updates: `batches` batches of 6 records over
    /// 5 keys plus keyless records, every codec, tombstones, and an
    /// idempotent producer for some batches.
    fn keyed_partition(dir: &Path, batches: usize, timestamp: i64) -> Partition {
        let p = Partition::open(dir, Visibility::default()).unwrap();
        let codecs = [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ];
        let mut serial = 0;
        let mut seq = 0;
        for b in 0..batches {
            let keys = (0..6)
                .map(|i| (i != 5 || b % 4 != 0).then(|| format!("key-{}", (b + i * 3) % 5)))
                .collect();
            let producer = (b % 3 == 1).then_some(seq);
            let spec = Spec {
                keys,
                tombstone_every: 7,
                compression: codecs[b % codecs.len()],
                producer,
                timestamp: timestamp + b as i64 * 10,
            };
            if producer.is_some() {
                seq += 6;
            }
            p.append(&encode(&spec, &mut serial), &cfg(600)).unwrap();
        }
        // A deleted key, followed by enough updates of another key that the
        // tombstone lands in a sealed segment.
        let tail = [
            (Some("key-1".to_string()), 1),
            (Some("filler".to_string()), 0),
        ];
        for (i, (key, tombstone_every)) in std::iter::once(tail[0].clone())
            .chain(std::iter::repeat_n(tail[1].clone(), 8))
            .enumerate()
        {
            let spec = Spec {
                keys: vec![key],
                tombstone_every,
                compression: Compression::None,
                producer: None,
                timestamp: timestamp + (batches + i) as i64 * 10,
            };
            p.append(&encode(&spec, &mut serial), &cfg(600)).unwrap();
        }
        p
    }

    fn decode_batches(bytes: &[u8]) -> Vec<(BatchHeader, Vec<Rec>)> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < bytes.len() {
            let h = BatchHeader::parse(&bytes[pos..]).unwrap().unwrap();
            let mut b = Bytes::copy_from_slice(&bytes[pos..pos + h.size]);
            let set = RecordBatchDecoder::decode(&mut b).unwrap();
            let recs = set
                .records
                .into_iter()
                .map(|r| (r.offset, r.key, r.value, r.timestamp))
                .collect();
            out.push((h, recs));
            pos += h.size;
        }
        out
    }

    fn read_log(dir: &Path, base: i64) -> Vec<u8> {
        std::fs::read(dir.join(crate::format::segment::file_name(base, "log"))).unwrap()
    }

    fn run_merge(
        sources: &[LocalSegment],
        out_dir: &Path,
        opts: &MergeOptions,
    ) -> (SegmentMeta, MergeStats) {
        let refs: Vec<&dyn SegmentSource> =
            sources.iter().map(|s| s as &dyn SegmentSource).collect();
        let mut sink = LocalSink::create(out_dir, sources[0].meta().base_offset).unwrap();
        merge(&refs, &mut sink, opts, &[]).unwrap()
    }

    fn compact_opts(now: i64) -> MergeOptions {
        MergeOptions {
            mode: MergeMode::Compact,
            target_level: 1,
            keep_newer_than: now,
            tombstone_cutoff: None,
            keep_last_batch: false,
            now_ms: now,
        }
    }

    fn all_batches(sources: &[LocalSegment], dir: &Path) -> Vec<(BatchHeader, Vec<Rec>)> {
        sources
            .iter()
            .flat_map(|s| decode_batches(&read_log(dir, s.meta().base_offset)))
            .collect()
    }

    /// (key, value or "COMMIT"/"ABORT") of every record, with the batch's producer.
    fn contents(bytes: &[u8]) -> Vec<(i64, String, String)> {
        decode_batches(bytes)
            .into_iter()
            .flat_map(|(h, recs)| {
                recs.into_iter().map(move |r| {
                    let key = r.1.map(|k| String::from_utf8_lossy(&k).into_owned());
                    let text = if h.is_control() {
                        let k = key.clone().map(|k| k.into_bytes()).unwrap_or_default();
                        if k[3] == 1 { "COMMIT" } else { "ABORT" }.to_string()
                    } else {
                        String::from_utf8_lossy(&r.2.unwrap_or_default()).into_owned()
                    };
                    let key = if h.is_control() {
                        String::new()
                    } else {
                        key.unwrap()
                    };
                    (h.producer_id, key, text)
                })
            })
            .collect()
    }

    #[test]
    fn aborted_records_never_supersede_and_go_with_their_markers_in_time() {
        use crate::format::batch::encode_transactional_batch;
        use crate::format::control::EndTxnMarker;
        let src = tempfile::tempdir().unwrap();
        let p = Partition::open(src.path(), Visibility::default()).unwrap();
        let rec = |k: &str, v: &str| {
            (
                Some(Bytes::from(k.to_string())),
                Some(Bytes::from(v.to_string())),
                OLD,
            )
        };
        let cfg = cfg(1 << 20);
        let plain = |records| encode_batch(records, None, Compression::None).unwrap();
        let txn = |pid, records| {
            encode_transactional_batch(records, (pid, 0, 0), Compression::None).unwrap()
        };
        let end = |commit| EndTxnMarker {
            commit,
            coordinator_epoch: 0,
        };
        p.append(&plain(vec![rec("a", "a0"), rec("b", "b0")]), &cfg)
            .unwrap();
        p.append(
            &txn(10, vec![rec("a", "aborted"), rec("b", "aborted")]),
            &cfg,
        )
        .unwrap();
        p.append(&txn(20, vec![rec("c", "c1")]), &cfg).unwrap();
        p.append_marker(10, 0, end(false), false, &cfg).unwrap();
        p.append_marker(20, 0, end(true), false, &cfg).unwrap();
        p.append_marker(30, 0, end(false), false, &cfg).unwrap(); // no data: no entry
        p.append(&plain(vec![rec("d", "d0")]), &cfg).unwrap();
        assert!(p
            .roll_if_due(&AppendConfig {
                segment_ms: 0,
                ..cfg
            })
            .unwrap());
        let aborted = p.aborted_txns(0, p.end_offset());
        assert_eq!(aborted.len(), 1);
        let sources = LocalSegment::list(src.path()).unwrap();
        for s in &sources {
            s.ensure_key_index().unwrap();
        }
        let refs: Vec<&dyn SegmentSource> =
            sources.iter().map(|s| s as &dyn SegmentSource).collect();

        // Within delete.retention.ms: aborted data goes, every marker stays.
        let out = tempfile::tempdir().unwrap();
        let mut sink = LocalSink::create(out.path(), 0).unwrap();
        let (meta, _) = merge(&refs, &mut sink, &compact_opts(2 * OLD), &aborted).unwrap();
        let got = contents(&read_log(out.path(), 0));
        let row = |pid: i64, k: &str, v: &str| (pid, k.to_string(), v.to_string());
        assert_eq!(
            got,
            [
                row(-1, "a", "a0"),
                row(-1, "b", "b0"),
                row(20, "c", "c1"),
                row(10, "", "ABORT"),
                row(20, "", "COMMIT"),
                row(30, "", "ABORT"),
                row(-1, "d", "d0"),
            ]
        );
        assert_eq!(meta.aborted, aborted, "its marker stays, so does the entry");

        // Merged again past delete.retention.ms: the markers whose
        // transactions left no data go (emptied: each is its producer's last
        // batch), the COMMIT of live data stays, and so does the index entry
        // of nothing.
        let again = LocalSegment::open(out.path(), 0).unwrap();
        let out2 = tempfile::tempdir().unwrap();
        let mut sink = LocalSink::create(out2.path(), 0).unwrap();
        let opts = MergeOptions {
            tombstone_cutoff: Some(i64::MAX),
            ..compact_opts(2 * OLD)
        };
        let (meta2, _) = merge(&[&again], &mut sink, &opts, &meta.aborted).unwrap();
        let got = contents(&read_log(out2.path(), 0));
        assert_eq!(
            got,
            [
                row(-1, "a", "a0"),
                row(-1, "b", "b0"),
                row(20, "c", "c1"),
                row(20, "", "COMMIT"),
                row(-1, "d", "d0"),
            ]
        );
        assert!(meta2.aborted.is_empty());
        let emptied_markers = decode_batches(&read_log(out2.path(), 0))
            .iter()
            .filter(|(h, r)| h.is_control() && r.is_empty())
            .count();
        assert_eq!(emptied_markers, 2);
    }

    #[test]
    fn compaction_keeps_newest_per_key_and_kafka_batch_invariants() {
        let src = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let p = keyed_partition(src.path(), 60, OLD);
        let sources = LocalSegment::list(src.path()).unwrap();
        assert!(sources.len() >= 4, "only {} sealed segments", sources.len());
        let input = all_batches(&sources, src.path());
        let (meta, stats) = run_merge(&sources, out.path(), &compact_opts(2 * OLD));

        // Expected: the newest record of each key; keyless records dropped.
        let mut newest: BTreeMap<Bytes, Rec> = BTreeMap::new();
        for (_, recs) in &input {
            for r in recs {
                if let Some(k) = &r.1 {
                    newest.insert(k.clone(), r.clone());
                }
            }
        }
        let mut want: Vec<Rec> = newest.into_values().collect();
        want.sort_by_key(|r| r.0);

        let output = decode_batches(&read_log(out.path(), meta.base_offset));
        let got: Vec<Rec> = output.iter().flat_map(|(_, r)| r.clone()).collect();
        assert_eq!(got, want);
        assert!(want.iter().any(|r| r.2.is_none()), "a tombstone is kept");
        assert!(input.iter().flat_map(|(_, r)| r).any(|r| r.1.is_none()));
        assert_eq!(stats.keys, 6);

        // Every output batch keeps its input batch's offsets, codec and producer fields.
        let by_base: BTreeMap<i64, &BatchHeader> =
            input.iter().map(|(h, _)| (h.base_offset, h)).collect();
        for (h, recs) in &output {
            let orig = by_base[&h.base_offset];
            assert_eq!(h.last_offset_delta, orig.last_offset_delta);
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.base_sequence),
                (orig.producer_id, orig.producer_epoch, orig.base_sequence)
            );
            if h.record_count > 0 {
                assert_eq!(h.attributes & CODEC_MASK, orig.attributes & CODEC_MASK);
                assert_eq!(h.max_timestamp, recs.iter().map(|r| r.3).max().unwrap());
            }
        }
        // The producer's last batch survives, emptied or not.
        let last_producer_batch = input
            .iter()
            .filter(|(h, _)| h.producer_id == PRODUCER)
            .map(|(h, _)| h.base_offset)
            .max()
            .unwrap();
        assert!(output
            .iter()
            .any(|(h, _)| h.base_offset == last_producer_batch));
        assert!(stats.batches_dropped > 0);

        // Descriptor, indexes and reads through a Partition over the output.
        assert_eq!(meta.level, 1);
        assert_eq!(meta.base_offset, sources[0].meta().base_offset);
        assert_eq!(meta.next_offset, sources.last().unwrap().meta().next_offset);
        drop(p);
        let merged = Partition::open(out.path(), Visibility::default()).unwrap();
        assert_eq!(merged.sealed_segments()[0], meta);
        let first_kept = want[0].0;
        let gap = (0..first_kept)
            .find(|o| {
                !output
                    .iter()
                    .any(|(h, _)| h.base_offset <= *o && h.last_offset() >= *o)
            })
            .expect("a removed offset");
        let slice = merged.read(gap, 1 << 20, true).unwrap();
        let h = BatchHeader::parse(&slice.records).unwrap().unwrap();
        assert!(h.last_offset() >= gap);
        let next = output.iter().find(|(h, _)| h.last_offset() >= gap).unwrap();
        assert_eq!(h.base_offset, next.0.base_offset);
    }

    #[test]
    fn merging_merged_segments_matches_one_big_merge() {
        let src = tempfile::tempdir().unwrap();
        let (l1, l2, all) = (
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
            tempfile::tempdir().unwrap(),
        );
        let _p = keyed_partition(src.path(), 80, OLD);
        let sources = LocalSegment::list(src.path()).unwrap();
        let half = sources.len() / 2;
        let opts = compact_opts(2 * OLD);
        let (m1, _) = run_merge(&sources[..half], l1.path(), &opts);
        let first = LocalSegment::open(l1.path(), m1.base_offset).unwrap();
        let rest: Vec<LocalSegment> = sources[half..]
            .iter()
            .map(|s| LocalSegment::open(src.path(), s.meta().base_offset).unwrap())
            .collect();
        let mut two_level = vec![first];
        two_level.extend(rest);
        let (m2, _) = run_merge(
            &two_level,
            l2.path(),
            &MergeOptions {
                target_level: 2,
                ..opts
            },
        );
        let (m_all, _) = run_merge(&sources, all.path(), &opts);
        let records = |dir: &Path, base| -> Vec<Rec> {
            decode_batches(&read_log(dir, base))
                .into_iter()
                .flat_map(|(_, r)| r)
                .collect()
        };
        assert_eq!(
            records(l2.path(), m2.base_offset),
            records(all.path(), m_all.base_offset)
        );
        assert_eq!(m2.level, 2);
        let idx = |dir: &Path, base| {
            let f =
                std::fs::File::open(dir.join(crate::format::segment::file_name(base, "keyindex")))
                    .unwrap();
            KeyIndexReader::new(f).unwrap().read_all().unwrap()
        };
        assert_eq!(
            idx(l2.path(), m2.base_offset),
            idx(all.path(), m_all.base_offset)
        );
    }

    #[test]
    fn tombstones_go_only_when_allowed_and_young_records_stay() {
        let src = tempfile::tempdir().unwrap();
        let _p = keyed_partition(src.path(), 60, OLD);
        let sources = LocalSegment::list(src.path()).unwrap();
        let now = 2 * OLD;
        let kept_tombstones = |opts: &MergeOptions| {
            let out = tempfile::tempdir().unwrap();
            let (meta, stats) = run_merge(&sources, out.path(), opts);
            let recs: Vec<Rec> = decode_batches(&read_log(out.path(), meta.base_offset))
                .into_iter()
                .flat_map(|(_, r)| r)
                .collect();
            (
                recs.iter()
                    .filter(|r| r.2.is_none() && r.1.is_some())
                    .count(),
                recs.len(),
                stats,
            )
        };
        let (with_cutoff_none, total, _) = kept_tombstones(&compact_opts(now));
        assert!(with_cutoff_none > 0);
        // Oldest data included and tombstones older than the retention: gone.
        let (n, _, stats) = kept_tombstones(&MergeOptions {
            tombstone_cutoff: Some(now),
            ..compact_opts(now)
        });
        assert_eq!(n, 0);
        assert_eq!(stats.tombstones_removed as usize, with_cutoff_none);
        // delete.retention.ms not yet passed: kept.
        let (n, _, _) = kept_tombstones(&MergeOptions {
            tombstone_cutoff: Some(OLD),
            ..compact_opts(now)
        });
        assert_eq!(n, with_cutoff_none);
        // min.compaction.lag.ms covering the newer half keeps all of it.
        let cutoff = OLD + 300;
        let (_, total_lagged, _) = kept_tombstones(&MergeOptions {
            keep_newer_than: cutoff,
            ..compact_opts(now)
        });
        let young: usize = all_batches(&sources, src.path())
            .iter()
            .flat_map(|(_, r)| r)
            .filter(|r| r.3 >= cutoff)
            .count();
        assert!(total_lagged >= young && total_lagged > total);
    }

    #[test]
    fn concatenation_copies_every_byte() {
        let src = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let _p = keyed_partition(src.path(), 40, OLD);
        let sources = LocalSegment::list(src.path()).unwrap();
        let (meta, stats) = run_merge(
            &sources,
            out.path(),
            &MergeOptions {
                mode: MergeMode::Concatenate,
                ..compact_opts(0)
            },
        );
        let want: Vec<u8> = sources
            .iter()
            .flat_map(|s| read_log(src.path(), s.meta().base_offset))
            .collect();
        assert_eq!(read_log(out.path(), meta.base_offset), want);
        assert_eq!(stats.batches_copied, stats.input_batches);
        assert!(!out
            .path()
            .join(crate::format::segment::file_name(
                meta.base_offset,
                "keyindex"
            ))
            .exists());
        // The copied segment reads like the originals.
        let merged = Partition::open(out.path(), Visibility::default()).unwrap();
        let slice = merged.read(7, 1 << 20, true).unwrap();
        assert!(
            BatchHeader::parse(&slice.records)
                .unwrap()
                .unwrap()
                .base_offset
                <= 7
        );
    }

    #[test]
    fn emptied_last_batch_of_a_producer_stays_as_a_header() {
        let src = tempfile::tempdir().unwrap();
        let out = tempfile::tempdir().unwrap();
        let p = Partition::open(src.path(), Visibility::default()).unwrap();
        let mut serial = 0;
        let key = || vec![Some("k".to_string()); 3];
        for b in 0..12 {
            // Two idempotent batches first, then plain overwrites of the same key.
            let spec = Spec {
                keys: key(),
                tombstone_every: 0,
                compression: Compression::Zstd,
                producer: (b < 2).then_some(b * 3),
                timestamp: OLD + b as i64,
            };
            p.append(&encode(&spec, &mut serial), &cfg(300)).unwrap();
        }
        let sources = LocalSegment::list(src.path()).unwrap();
        let (meta, stats) = run_merge(&sources, out.path(), &compact_opts(2 * OLD));
        let output = decode_batches(&read_log(out.path(), meta.base_offset));
        let empties: Vec<&BatchHeader> = output
            .iter()
            .filter(|(h, _)| h.record_count == 0)
            .map(|(h, _)| h)
            .collect();
        assert_eq!(stats.batches_emptied, 1);
        assert_eq!(empties.len(), 1);
        let e = empties[0];
        // The producer's second batch: offsets 3..=5, sequence 3, no codec.
        assert_eq!(
            (e.base_offset, e.last_offset(), e.producer_id),
            (3, 5, PRODUCER)
        );
        assert_eq!((e.base_sequence, e.last_sequence()), (3, 5));
        assert_eq!(e.attributes & CODEC_MASK, 0);
        assert_eq!(e.size, HEADER_LEN);
        // The first producer batch is gone entirely.
        assert!(!output.iter().any(|(h, _)| h.base_offset == 0));
        // Producer state rebuilt from the merged segment still knows the sequence.
        drop(p);
        let merged = Partition::open(out.path(), Visibility::default()).unwrap();
        assert_eq!(merged.max_producer_id(), Some(PRODUCER));
        drop(merged);

        // Once the producer writes again, the next merge drops the bare header.
        let more = tempfile::tempdir().unwrap();
        let mut seg =
            crate::log::segment::Segment::create(more.path(), meta.next_offset, 0).unwrap();
        let spec = Spec {
            keys: key(),
            tombstone_every: 0,
            compression: Compression::Gzip,
            producer: Some(6),
            timestamp: OLD + 100,
        };
        let raw = encode(&spec, &mut serial);
        let head = crate::format::batch::stamp_header(&raw, meta.next_offset, 0, None);
        let h = BatchHeader::parse(&head).unwrap().unwrap();
        seg.append(&head, &raw[HEADER_LEN..], &h, 0, INDEX_INTERVAL_BYTES)
            .unwrap();
        seg.seal(0).unwrap();
        let sources = vec![
            LocalSegment::open(out.path(), meta.base_offset).unwrap(),
            LocalSegment::open(more.path(), meta.next_offset).unwrap(),
        ];
        let out2 = tempfile::tempdir().unwrap();
        let (meta2, _) = run_merge(&sources, out2.path(), &compact_opts(2 * OLD));
        let output = decode_batches(&read_log(out2.path(), meta2.base_offset));
        assert_eq!(output.len(), 1);
        assert_eq!(output[0].0.base_offset, meta.next_offset);
        assert_eq!(output[0].1.len(), 1);
    }

    #[test]
    fn a_merge_at_the_log_end_keeps_its_last_batch_as_a_bare_header() {
        let src = tempfile::tempdir().unwrap();
        let p = Partition::open(src.path(), Visibility::default()).unwrap();
        let mut serial = 0;
        for i in 0..12 {
            let spec = Spec {
                keys: vec![Some("gone".to_string())],
                tombstone_every: 1,
                compression: Compression::None,
                producer: None,
                timestamp: OLD + i,
            };
            p.append(&encode(&spec, &mut serial), &cfg(200)).unwrap();
        }
        let sources = LocalSegment::list(src.path()).unwrap();
        assert!(sources.len() >= 2);
        let end = sources.last().unwrap().meta().next_offset;
        // Every record is a tombstone past delete.retention.ms: all go.
        let opts = MergeOptions {
            tombstone_cutoff: Some(2 * OLD),
            ..compact_opts(2 * OLD)
        };
        let out = tempfile::tempdir().unwrap();
        let (meta, _) = run_merge(&sources, out.path(), &opts);
        assert!(decode_batches(&read_log(out.path(), meta.base_offset)).is_empty());
        let out = tempfile::tempdir().unwrap();
        let (meta, _) = run_merge(
            &sources,
            out.path(),
            &MergeOptions {
                keep_last_batch: true,
                ..opts
            },
        );
        let batches = decode_batches(&read_log(out.path(), meta.base_offset));
        assert_eq!(batches.len(), 1);
        assert_eq!(batches[0].0.record_count, 0);
        assert_eq!(batches[0].0.last_offset(), end - 1);
    }

    #[test]
    fn bitmap_counts_ranges() {
        let mut b = Bitmap::new(100, 300);
        for o in [100, 163, 164, 227, 228, 399] {
            b.set(o);
        }
        assert_eq!(b.count(100, 399), 6);
        assert_eq!(b.count(101, 163), 1);
        assert_eq!(b.count(164, 228), 3);
        assert_eq!(b.count(229, 398), 0);
        assert!(b.get(399) && !b.get(398));
    }

    #[test]
    fn refuses_gaps_and_existing_output() {
        let src = tempfile::tempdir().unwrap();
        let _p = keyed_partition(src.path(), 40, OLD);
        let sources = LocalSegment::list(src.path()).unwrap();
        let refs: Vec<&dyn SegmentSource> = vec![&sources[0], &sources[2]];
        let out = tempfile::tempdir().unwrap();
        let mut sink = LocalSink::create(out.path(), 0).unwrap();
        assert!(matches!(
            merge(&refs, &mut sink, &compact_opts(0), &[]),
            Err(CompactionError::InvalidMerge(_))
        ));
        drop(sink);
        assert_eq!(std::fs::read_dir(out.path()).unwrap().count(), 0);
        assert!(LocalSink::create(src.path(), 0).is_err());
    }
}
