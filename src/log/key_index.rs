//! Building a sealed segment's key index (the format is `format::key_index`).
//!
//! Building decodes (and decompresses) every batch of the segment, which is
//! why it happens after sealing and never on the produce or fetch path. A
//! segment may hold more distinct keys than fit the memory budget, so the
//! builder sorts in runs: when its buffer fills it sorts, de-duplicates and
//! spills the buffer to a temporary file next to the segment, and at the end
//! merges the runs.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};

use super::segment::sync_dir;
use super::LogError;
use crate::format::batch::{BatchHeader, BatchStream};
use crate::format::key_index::{
    merge_sorted, sort_dedup, KeyEntry, KeyIndexReader, KeyIndexWriter, ProducerLast,
};
use crate::format::key_sketch::{KeySketch, KeyStats};
use crate::format::records::{decode_batch, key_hash};
use crate::format::segment::{file_name, KEY_INDEX_EXT};

/// Entries held in memory while building before a run is spilled: about
/// 48 bytes each, so 12 MiB.
pub const DEFAULT_BUILD_BUDGET: usize = 256 * 1024;

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
    ) -> Result<(), LogError> {
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

    fn spill(&mut self) -> Result<(), LogError> {
        sort_dedup(&mut self.entries);
        // Only a unique temporary name, gone when the build ends.
        #[allow(clippy::disallowed_methods)]
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
    pub fn finish<W: Write>(mut self, out: W) -> Result<W, LogError> {
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
            return Ok(w.finish()?);
        }
        if !self.entries.is_empty() {
            self.spill()?;
        }
        let mut readers = Vec::with_capacity(self.runs.len());
        for run in &self.runs {
            readers.push(KeyIndexReader::new(BufReader::new(File::open(&run.path)?))?);
        }
        merge_sorted(&mut readers, |group| w.push(&group))?;
        Ok(w.finish()?)
    }
}

/// Builds the key index of a sealed local segment from its batches and
/// writes it next to the segment (temporary file, fsync, rename), so a
/// reader never sees half an index. Returns the index path.
pub fn build_for_segment(dir: &Path, base_offset: i64, budget: usize) -> Result<PathBuf, LogError> {
    let log = File::open(dir.join(file_name(base_offset, "log")))?;
    let mut builder = KeyIndexBuilder::new(base_offset, budget, dir);
    let mut stream = BatchStream::new(log);
    while let Some((header, bytes)) = stream.next_batch()? {
        add_batch_records(&mut builder, &header, bytes)?;
    }
    let path = dir.join(file_name(base_offset, KEY_INDEX_EXT));
    // A unique temporary name: the background build after sealing and a
    // merge that finds the index missing may race, and each must rename a
    // whole file of its own. Only unique: the name never outlives the rename.
    #[allow(clippy::disallowed_methods)]
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

/// The key index of the sealed segment `base_offset` in `dir`, built if the
/// segment has none yet (sealed before its topic became compacted, or a
/// crash between seal and index).
pub fn ensure_for_segment(dir: &Path, base_offset: i64) -> Result<PathBuf, LogError> {
    let path = dir.join(file_name(base_offset, KEY_INDEX_EXT));
    if path.exists() {
        return Ok(path);
    }
    build_for_segment(dir, base_offset, DEFAULT_BUILD_BUDGET)
}

/// Counts and sketches the keys of the key index at `path`, for a segment of
/// `records` records.
pub fn key_stats(path: &Path, records: u64) -> Result<KeyStats, LogError> {
    let mut reader = KeyIndexReader::new(BufReader::new(File::open(path)?))?;
    let mut sketch = KeySketch::default();
    let mut keys = 0;
    while let Some(e) = reader.next_entry()? {
        sketch.add(e.hash);
        keys += 1;
    }
    Ok(KeyStats {
        records,
        keys,
        sketch,
    })
}

/// Decodes one batch and adds its keyed records to `builder`.
pub fn add_batch_records(
    builder: &mut KeyIndexBuilder,
    header: &BatchHeader,
    bytes: &[u8],
) -> Result<(), LogError> {
    builder.add_batch(header);
    // Control records carry no user key; the merge copies them untouched.
    if header.is_control() || header.record_count == 0 {
        return Ok(());
    }
    // The capped decoder reads `Bytes`; kafka-protocol copied a slice's
    // batch into `Bytes` before decoding it anyway.
    let set = decode_batch(&mut bytes::Bytes::copy_from_slice(bytes))
        .map_err(|e| LogError::Corrupt(format!("batch at offset {}: {e}", header.base_offset)))?;
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
            leader_epoch: 0,
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
}
