//! A partition: an ordered set of segments, the producer state, and the
//! bookkeeping that makes appends durable.
//!
//! Appends, rolls and offset assignment happen under one short lock. Reads
//! take a view of the segment under the lock and do their I/O outside it.
//! Durability is group-committed: a producer that needs its batch on disk
//! waits until some fsync covering its offset finished; whoever gets the sync
//! lock first syncs for everyone queued behind it.
//!
//! Readers see the log only up to its high watermark. Where the broker
//! promises durability (`--fsync always`, or a head sink: the write-ahead log
//! of cluster mode) that is the durable end, not the end of what was
//! appended: a record a crash or a failover can still lose or rewrite is
//! never served, as Kafka serves nothing above the high watermark its
//! replicas agreed on. Consumers waiting at the end are woken by the mark
//! itself, when durability advances.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::watch;

use super::index::write_synced;
use super::key_index::{build_for_segment, DEFAULT_BUILD_BUDGET};
use super::leader_epochs::LeaderEpochs;
use super::producer_state::{ProducerInfo, ProducerStates, Restored, SequenceCheck};
use super::remote::{DurableMark, HeadSink, RemoteLog};
use super::segment::Segment;
use super::LogError;
use crate::clock::{self, SharedClock};
use crate::format::batch::{self, first_record, BatchHeader};
use crate::format::control::{self, AbortedTxn, EndTxnMarker};
use crate::format::key_sketch::KeyStats;
use crate::format::segment::{file_name, SegmentMeta, SNAPSHOT_EXT};
use crate::metrics::Timer;

const LOG_START_FILE: &str = "log-start-offset";

/// How far readers see a partition's log.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Visibility {
    /// Everything appended: nothing is promised beyond the page cache
    /// (`--fsync interval` or `never`), as a Kafka leader without followers.
    #[default]
    Appended,
    /// Only what is durable: fsynced, or made durable by a head sink.
    Durable,
}

/// Where a read stops.
#[derive(Debug, Clone, Copy)]
enum Upto {
    HighWatermark,
    LogEnd,
}

/// The topic configuration an append needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendConfig {
    pub max_message_bytes: usize,
    pub segment_bytes: u64,
    pub segment_ms: i64,
    /// `segment.jitter.ms`: up to this much is taken off `segment_ms`, per segment.
    pub segment_jitter_ms: i64,
    /// `index.interval.bytes` of the sparse indexes.
    pub index_interval_bytes: u64,
    pub log_append_time: bool,
    /// `cleanup.policy` includes `compact`: sealed segments get a key index.
    pub compact: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AppendOutcome {
    pub base_offset: i64,
    pub last_offset: i64,
    /// The broker's timestamp for LogAppendTime topics, else -1.
    pub log_append_time: i64,
    pub log_start_offset: i64,
    /// The batch was a retry of one already in the log.
    pub duplicate: bool,
}

#[derive(Debug, Clone)]
pub struct FetchSlice {
    /// Whole batches starting at or before the fetch offset.
    pub records: Bytes,
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub last_stable_offset: i64,
    /// read_committed only: the aborted transactions overlapping `records`.
    pub aborted: Vec<AbortedTxn>,
}

/// What a partition is opened with, besides its directory.
#[derive(Clone)]
pub struct PartitionSettings {
    /// How far readers see the log.
    pub visibility: Visibility,
    /// Where fsync latencies go.
    pub sync_timer: Option<Timer>,
    /// Makes appends durable instead of fsync (cluster mode: the write-ahead log).
    pub head_sink: Option<Arc<dyn HeadSink>>,
    /// The part of the log in the object store, below the local segments.
    pub remote: Option<Arc<dyn RemoteLog>>,
    /// The broker-wide flag that refuses appends while uploads lag; `None`:
    /// never refused (internal topics, whose writes are small and urgent).
    pub backpressure: Option<Arc<AtomicBool>>,
    /// Segment ages (`segment.ms`), `flush.ms`, marker timestamps.
    pub clock: SharedClock,
}

impl Default for PartitionSettings {
    /// The system's clock, nothing attached.
    fn default() -> PartitionSettings {
        PartitionSettings {
            visibility: Visibility::default(),
            sync_timer: None,
            head_sink: None,
            remote: None,
            backpressure: None,
            clock: clock::system(),
        }
    }
}

impl From<Visibility> for PartitionSettings {
    fn from(visibility: Visibility) -> PartitionSettings {
        PartitionSettings {
            visibility,
            ..Default::default()
        }
    }
}

pub struct Partition {
    dir: PathBuf,
    state: Mutex<State>,
    end_offset: watch::Sender<i64>,
    durable: DurableMark,
    visibility: Visibility,
    sync_lock: tokio::sync::Mutex<()>,
    /// Offsets below the first local segment, once the tier attached it.
    remote: Option<Arc<dyn RemoteLog>>,
    /// Set by the tier while too many sealed bytes wait for upload.
    backpressure: Option<Arc<AtomicBool>>,
    /// Makes appends durable instead of fsync (cluster mode).
    head_sink: Option<Arc<dyn HeadSink>>,
    /// Stamped into every batch appended; a single broker stays at 0.
    leader_epoch: AtomicI32,
    /// When the last fsync finished (or the partition opened), for `flush.ms`.
    last_sync_ms: AtomicI64,
    /// Where fsync latencies go.
    sync_timer: Option<Timer>,
    /// Segment ages (`segment.ms`), `flush.ms`, marker timestamps.
    clock: SharedClock,
}

struct State {
    /// By base offset; the last one is the active segment.
    segments: BTreeMap<i64, Segment>,
    log_start_offset: i64,
    producers: ProducerStates,
    epochs: LeaderEpochs,
    /// False unless this broker leads the partition (cluster mode): until a
    /// takeover has ended, and from a handover on. Checked under the lock,
    /// so once `stop_appends` returns the end offset is final. Consumers'
    /// reads are refused too: a takeover resets the log to the store's end
    /// and replays the head, and a reader shown an end below its position
    /// would be sent back to its `auto.offset.reset`.
    appends_open: bool,
    /// The head sink's position when each segment since the last reset or
    /// open was created: every batch of the segment lies at or above it.
    sink_positions: BTreeMap<i64, u64>,
}

impl State {
    fn active(&self) -> &Segment {
        self.segments
            .values()
            .next_back()
            .expect("a partition always has an active segment")
    }
    fn active_mut(&mut self) -> &mut Segment {
        self.segments
            .values_mut()
            .next_back()
            .expect("a partition always has an active segment")
    }
    fn end_offset(&self) -> i64 {
        self.active().next_offset()
    }
    /// min(first offset of the open transactions, high watermark).
    fn last_stable_offset(&self, high_watermark: i64) -> i64 {
        self.producers
            .first_unstable_offset()
            .map_or(high_watermark, |first| first.min(high_watermark))
    }
    /// Records a batch just appended to the active segment in the producer
    /// state and the epoch history; an ABORT marker that ends a transaction
    /// with data here adds it to the segment's aborted transactions.
    fn track(&mut self, h: &BatchHeader, marker: Option<EndTxnMarker>) {
        if let Some(aborted) = replay(&mut self.producers, &mut self.epochs, h, marker) {
            self.active_mut().push_aborted(aborted);
        }
    }
    /// The segment holding `offset`, or the next one after a gap.
    fn segment_for(&self, offset: i64) -> Option<&Segment> {
        if let Some((_, s)) = self.segments.range(..=offset).next_back() {
            if s.next_offset() > offset {
                return Some(s);
            }
        }
        self.segments.range(offset + 1..).next().map(|(_, s)| s)
    }
}

/// The share of `segment.jitter.ms` of the segment at `base_offset` of the
/// partition in `dir`.
fn segment_jitter(dir: &Path, base_offset: i64, cfg: &AppendConfig) -> i64 {
    let bound = cfg.segment_jitter_ms.min(cfg.segment_ms);
    if bound <= 0 {
        return 0;
    }
    let hash = xxhash_rust::xxh3::xxh3_64_with_seed(
        dir.as_os_str().as_encoded_bytes(),
        base_offset as u64,
    );
    (hash % bound as u64) as i64
}

impl Partition {
    /// Opens (or creates) the partition in `dir`, recovering the active
    /// segment and rebuilding the producer state and the leader epoch
    /// history from the newest snapshot and the batch headers after it.
    /// What survived on disk counts as durable.
    pub fn open(dir: &Path, settings: impl Into<PartitionSettings>) -> Result<Partition, LogError> {
        let settings = settings.into();
        std::fs::create_dir_all(dir)?;
        let log_start_offset = std::fs::read_to_string(dir.join(LOG_START_FILE))
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(0);
        let mut bases = Vec::new();
        let mut snapshots = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let name = entry?.file_name();
            let name = name.to_string_lossy();
            let base = |ext: &str| name.strip_suffix(ext).and_then(|b| b.parse::<i64>().ok());
            if let Some(b) = base(".log") {
                bases.push(b);
            } else if let Some(b) = base(&format!(".{SNAPSHOT_EXT}")) {
                snapshots.push(b);
            } else if name.ends_with(".tmp") {
                std::fs::remove_file(dir.join(&*name))?;
            }
        }
        let now = settings.clock.now_ms();
        let mut segments = BTreeMap::new();
        for base in bases {
            segments.insert(base, Segment::open(dir, base, now)?);
        }
        if segments.is_empty() {
            segments.insert(
                log_start_offset,
                Segment::create(dir, log_start_offset, now)?,
            );
        }
        let (snapshot_base, restored) = newest_snapshot(dir, snapshots, &segments);
        let Restored {
            end_offset: from,
            mut producers,
            mut epochs,
        } = restored;
        prune_snapshots(dir, snapshot_base, &segments)?;
        let last = segments.keys().next_back().copied();
        for seg in segments.values_mut() {
            let after_snapshot = seg.next_offset() > from;
            if after_snapshot {
                // Only markers are read beyond their header.
                let reader = seg.reader();
                let mut failed = None;
                let mut aborted = Vec::new();
                seg.reader().scan(0, |loc| {
                    if loc.header.last_offset() < from {
                        return true;
                    }
                    let marker = if loc.header.is_control() {
                        match reader
                            .read_at(loc.position, loc.header.size)
                            .and_then(|b| Ok(control::parse_marker(&b)?))
                        {
                            Ok(m) => m,
                            Err(e) => {
                                failed = Some(e);
                                return false;
                            }
                        }
                    } else {
                        None
                    };
                    aborted.extend(replay(&mut producers, &mut epochs, &loc.header, marker));
                    true
                })?;
                if let Some(e) = failed {
                    return Err(e);
                }
                // A sealed segment's descriptor has its aborted list already.
                if seg.meta().is_none() {
                    for a in aborted {
                        seg.push_aborted(a);
                    }
                }
            }
            if seg.meta().is_none() && Some(seg.base_offset()) != last {
                // A crash interrupted sealing: the data is complete (the next
                // segment exists only after this one was synced), so finish
                // it; the producer state is its end's only if replayed up to it.
                if after_snapshot {
                    seg.seal_with_producers(now, &producers, &epochs)?;
                } else {
                    seg.seal(now)?;
                }
            }
        }
        epochs.truncate_from_start(log_start_offset);
        let state = State {
            segments,
            log_start_offset,
            producers,
            epochs,
            // In a cluster the partition takes appends once taken over.
            appends_open: settings.head_sink.is_none(),
            sink_positions: BTreeMap::new(),
        };
        let end = state.end_offset();
        Ok(Partition {
            dir: dir.to_path_buf(),
            state: Mutex::new(state),
            end_offset: watch::Sender::new(end),
            durable: Arc::new(watch::Sender::new(end)),
            visibility: settings.visibility,
            sync_lock: tokio::sync::Mutex::new(()),
            remote: settings.remote,
            backpressure: settings.backpressure,
            head_sink: settings.head_sink,
            leader_epoch: AtomicI32::new(0),
            last_sync_ms: AtomicI64::new(now),
            sync_timer: settings.sync_timer,
            clock: settings.clock,
        })
    }

    /// Validates, stamps and appends one batch as produced by a client.
    pub fn append(&self, raw: &[u8], cfg: &AppendConfig) -> Result<AppendOutcome, LogError> {
        let header = batch::validate_produced(raw)?;
        if raw.len() > cfg.max_message_bytes {
            return Err(LogError::MessageTooLarge {
                size: raw.len(),
                max: cfg.max_message_bytes,
            });
        }
        self.check_writable()?;
        let st = self.lock_led()?;
        if let SequenceCheck::Duplicate(m) = st.producers.check(&header)? {
            return Ok(AppendOutcome {
                base_offset: m.first_offset,
                last_offset: m.last_offset,
                log_append_time: if cfg.log_append_time {
                    m.max_timestamp
                } else {
                    -1
                },
                log_start_offset: st.log_start_offset,
                duplicate: true,
            });
        }
        self.append_locked(st, raw, header, None, cfg)
    }

    /// Appends the marker that ends producer `producer_id`'s transaction
    /// (WriteTxnMarkers). Markers bypass sequence checks, but a producer
    /// epoch older than the partition knows (or, for a transactions v2
    /// marker, `bumped`, not newer), or a coordinator epoch older than the
    /// last marker's, is refused.
    pub fn append_marker(
        &self,
        producer_id: i64,
        producer_epoch: i16,
        marker: EndTxnMarker,
        bumped: bool,
        cfg: &AppendConfig,
    ) -> Result<AppendOutcome, LogError> {
        self.check_writable()?;
        let raw = control::encode_marker(producer_id, producer_epoch, marker, self.clock.now_ms());
        let header = BatchHeader::parse(&raw)?.expect("a marker is a whole batch");
        let st = self.lock_led()?;
        st.producers.check_marker(
            producer_id,
            producer_epoch,
            marker.coordinator_epoch,
            bumped,
        )?;
        self.append_locked(st, &raw, header, Some(marker), cfg)
    }

    /// The state, locked, if this broker leads the partition: a broker
    /// that does not answers no append, a duplicate neither (its log may
    /// hold what it never made durable), and no consumer read.
    fn lock_led(&self) -> Result<parking_lot::MutexGuard<'_, State>, LogError> {
        let st = self.state.lock();
        if !st.appends_open {
            return Err(LogError::Fenced);
        }
        Ok(st)
    }

    /// The state, locked for a read: a consumer's read (up to the high
    /// watermark) only while this broker leads; the broker's own replay of
    /// its internal topics (up to the log end) at any time.
    fn lock_for(&self, upto: Upto) -> Result<parking_lot::MutexGuard<'_, State>, LogError> {
        match upto {
            Upto::HighWatermark => self.lock_led(),
            Upto::LogEnd => Ok(self.state.lock()),
        }
    }

    fn check_writable(&self) -> Result<(), LogError> {
        if self
            .backpressure
            .as_ref()
            .is_some_and(|b| b.load(Ordering::Relaxed))
        {
            return Err(LogError::Backpressure);
        }
        if let Some(sink) = &self.head_sink {
            sink.check()?;
        }
        Ok(())
    }

    /// Stamps `raw` (checked by the caller under this lock) at the end of
    /// the log and appends it.
    fn append_locked(
        &self,
        mut st: parking_lot::MutexGuard<'_, State>,
        raw: &[u8],
        header: BatchHeader,
        marker: Option<EndTxnMarker>,
        cfg: &AppendConfig,
    ) -> Result<AppendOutcome, LogError> {
        let now = self.clock.now_ms();
        self.maybe_roll(&mut st, cfg, raw.len(), now)?;
        let base_offset = st.end_offset();
        let append_time = cfg.log_append_time.then_some(now);
        let leader_epoch = self.leader_epoch.load(Ordering::Relaxed);
        let header_bytes = batch::stamp_header(raw, base_offset, leader_epoch, append_time);
        let stamped_header = BatchHeader {
            base_offset,
            leader_epoch,
            max_timestamp: append_time.unwrap_or(header.max_timestamp),
            ..header
        };
        st.active_mut().append(
            &header_bytes,
            &raw[batch::HEADER_LEN..],
            &stamped_header,
            now,
            cfg.index_interval_bytes,
        )?;
        st.track(&stamped_header, marker);
        if let Some(sink) = &self.head_sink {
            sink.submit(
                &self.durable,
                leader_epoch,
                base_offset,
                stamped_header.last_offset(),
                &header_bytes,
                &raw[batch::HEADER_LEN..],
            );
        }
        let log_start_offset = st.log_start_offset;
        drop(st);
        let last_offset = stamped_header.last_offset();
        self.end_offset.send_replace(last_offset + 1);
        Ok(AppendOutcome {
            base_offset,
            last_offset,
            log_append_time: append_time.unwrap_or(-1),
            log_start_offset,
            duplicate: false,
        })
    }

    fn maybe_roll(
        &self,
        st: &mut State,
        cfg: &AppendConfig,
        incoming: usize,
        now: i64,
    ) -> Result<(), LogError> {
        let active = st.active();
        if active.is_empty() {
            return Ok(());
        }
        let too_big = active.size() + incoming as u64 > cfg.segment_bytes;
        let too_old = now - active.created_ms()
            >= cfg.segment_ms - self.roll_jitter(active.base_offset(), cfg);
        // Index entries hold 32-bit relative offsets.
        let offsets_full = active.next_offset() - active.base_offset() > (u32::MAX / 2) as i64;
        if !(too_big || too_old || offsets_full) {
            return Ok(());
        }
        let next = active.next_offset();
        let sealed_base = active.base_offset();
        st.segments
            .values_mut()
            .next_back()
            .expect("a partition always has an active segment")
            .seal_with_producers(now, &st.producers, &st.epochs)?;
        if cfg.compact {
            build_key_index_in_background(self.dir.clone(), sealed_base);
        }
        st.segments
            .insert(next, Segment::create(&self.dir, next, now)?);
        if let Some(sink) = &self.head_sink {
            st.sink_positions
                .retain(|base, _| st.segments.contains_key(base));
            st.sink_positions.insert(next, sink.position());
        }
        tracing::debug!(dir = %self.dir.display(), base_offset = next, "rolled segment");
        Ok(())
    }

    /// Kafka draws a random `segment.jitter.ms` share per segment; a hash of
    /// the partition and the segment's base offset spreads rolls the same
    /// way and stays the same across restarts.
    fn roll_jitter(&self, base_offset: i64, cfg: &AppendConfig) -> i64 {
        segment_jitter(&self.dir, base_offset, cfg)
    }

    /// Reads whole batches from `offset` on, below the high watermark, at
    /// most `max_bytes` unless `min_one` asks for the first batch whatever
    /// its size (KIP-74). An offset between the high watermark and the end
    /// of the log reads nothing, as in Kafka.
    pub fn read(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<FetchSlice, LogError> {
        self.read_upto(offset, max_bytes, min_one, Upto::HighWatermark)
    }

    fn read_upto(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        upto: Upto,
    ) -> Result<FetchSlice, LogError> {
        let mut from = offset;
        loop {
            let (
                reader,
                position,
                seg_end,
                limit,
                high_watermark,
                log_start_offset,
                last_stable_offset,
            ) = {
                let st = self.lock_for(upto)?;
                let hw = self.high_watermark_locked(&st);
                let lso = st.last_stable_offset(hw);
                let (start, end) = (st.log_start_offset, st.end_offset());
                let limit = match upto {
                    Upto::HighWatermark => hw,
                    Upto::LogEnd => end,
                };
                if from == offset && (offset < start || offset > end) {
                    return Err(LogError::OffsetOutOfRange { offset, start, end });
                }
                if from == offset && self.below_local(&st, offset) {
                    // Only `fetch` may read there: the next local segment is not the answer.
                    return Err(LogError::Remote(format!(
                        "offset {offset} is only in the object store"
                    )));
                }
                let seg = (from < limit).then(|| st.segment_for(from)).flatten();
                match seg {
                    Some(seg) => (
                        Some(seg.reader()),
                        seg.index_position(from),
                        seg.next_offset(),
                        limit,
                        hw,
                        start,
                        lso,
                    ),
                    None => (None, 0, end, limit, hw, start, lso),
                }
            };
            let mut records = Bytes::new();
            if let Some(reader) = &reader {
                match reader.locate(position, from)? {
                    Some(loc) => {
                        let data = reader.read_at(loc.position, max_bytes)?;
                        let whole = batch::whole_batches_len(&data);
                        records = if whole > 0 {
                            data.slice(..whole)
                        } else if min_one {
                            reader.read_at(loc.position, loc.header.size)?
                        } else {
                            Bytes::new()
                        };
                        if seg_end > limit {
                            records.truncate(batch::batches_below_len(&records, limit));
                        }
                    }
                    // Compaction can remove the last batches of a sealed
                    // segment; as in Kafka, the read goes on in the next one.
                    None if seg_end < limit && seg_end > from => {
                        from = seg_end;
                        continue;
                    }
                    None => {}
                }
            }
            return Ok(FetchSlice {
                records,
                high_watermark,
                log_start_offset,
                last_stable_offset,
                aborted: Vec::new(),
            });
        }
    }

    /// The first record (offset, timestamp) with a timestamp at or after `timestamp`.
    pub fn offset_for_timestamp(&self, timestamp: i64) -> Result<Option<(i64, i64)>, LogError> {
        let (reader, position, start) = {
            let st = self.state.lock();
            let start = st.log_start_offset;
            let Some(seg) = st
                .segments
                .values()
                .find(|s| s.next_offset() > start && s.max_timestamp() >= timestamp)
            else {
                return Ok(None);
            };
            (seg.reader(), seg.time_index_position(timestamp), start)
        };
        let mut pos = position;
        loop {
            let Some(loc) = reader.locate_time(pos, timestamp)? else {
                return Ok(None);
            };
            if loc.header.last_offset() >= start {
                let found = first_record(
                    &reader.read_at(loc.position, loc.header.size)?,
                    &loc.header,
                    |o, ts| o >= start && ts >= timestamp,
                )?;
                if found.is_some() {
                    return Ok(found);
                }
            }
            pos = loc.position + loc.header.size as u64;
        }
    }

    /// The (offset, timestamp) of the first record with the largest timestamp.
    pub fn max_timestamp(&self) -> Result<Option<(i64, i64)>, LogError> {
        let (reader, position, max_ts) = {
            let st = self.state.lock();
            let start = st.log_start_offset;
            let mut best: Option<&Segment> = None;
            for s in st
                .segments
                .values()
                .filter(|s| s.next_offset() > start && !s.is_empty())
            {
                if best.is_none_or(|b| s.max_timestamp() > b.max_timestamp()) {
                    best = Some(s);
                }
            }
            let Some(seg) = best else { return Ok(None) };
            (
                seg.reader(),
                seg.max_timestamp_position(),
                seg.max_timestamp(),
            )
        };
        let Some(loc) = reader.locate(position, i64::MIN)? else {
            return Ok(None);
        };
        Ok(first_record(
            &reader.read_at(loc.position, loc.header.size)?,
            &loc.header,
            |_, ts| ts == max_ts,
        )?)
    }

    /// Moves the log start offset forward (DeleteRecords); `offset` -1 means
    /// the high watermark, and no offset above it is accepted, as in Kafka.
    /// Whole segments below it are deleted.
    pub fn delete_records(&self, offset: i64) -> Result<i64, LogError> {
        let mut st = self.state.lock();
        let (start, hw) = (st.log_start_offset, self.high_watermark_locked(&st));
        let target = if offset == -1 { hw } else { offset };
        if target < 0 || target > hw {
            return Err(LogError::OffsetOutOfRange {
                offset,
                start,
                end: hw,
            });
        }
        if target <= start {
            return Ok(start);
        }
        write_synced(
            &self.dir.join(LOG_START_FILE),
            target.to_string().as_bytes(),
        )?;
        st.log_start_offset = target;
        st.epochs.truncate_from_start(target);
        let active_base = st.active().base_offset();
        let doomed: Vec<i64> = st
            .segments
            .values()
            .filter(|s| s.next_offset() <= target && s.base_offset() != active_base)
            .map(|s| s.base_offset())
            .collect();
        for base in doomed {
            if let Some(seg) = st.segments.remove(&base) {
                seg.delete_files()?;
            }
        }
        Ok(target)
    }

    /// Becomes the partition's leader afresh: forgets every local segment,
    /// which may hold what an earlier leadership appended but never made
    /// durable, and continues at `point` as a restore does. The batches the
    /// previous leader made durable beyond it follow through
    /// [`Partition::append_recovered`]; other appends wait for
    /// [`Partition::start_appends`].
    pub fn reset(&self, point: &RestorePoint) -> Result<(), LogError> {
        let mut st = self.state.lock();
        for seg in std::mem::take(&mut st.segments).into_values() {
            seg.delete_files()?;
        }
        let mut restored = match &point.producers {
            Some((base, bytes)) => {
                write_synced(&self.dir.join(file_name(*base, SNAPSHOT_EXT)), bytes)?;
                ProducerStates::from_snapshot(bytes)?
            }
            None => Restored::default(),
        };
        restored.epochs.truncate_from_start(point.log_start_offset);
        write_synced(
            &self.dir.join(LOG_START_FILE),
            point.log_start_offset.to_string().as_bytes(),
        )?;
        let now = self.clock.now_ms();
        st.segments.insert(
            point.next_offset,
            Segment::create(&self.dir, point.next_offset, now)?,
        );
        st.sink_positions = self
            .head_sink
            .iter()
            .map(|sink| (point.next_offset, sink.position()))
            .collect();
        st.log_start_offset = point.log_start_offset;
        st.producers = restored.producers;
        st.epochs = restored.epochs;
        st.appends_open = self.head_sink.is_none();
        drop(st);
        self.end_offset.send_replace(point.next_offset);
        self.durable.send_replace(point.next_offset);
        Ok(())
    }

    /// Appends a batch another leader stamped and made durable (read back
    /// from its write-ahead log), keeping its offsets, epoch and timestamps.
    /// A batch wholly below the end is skipped; one that would leave a gap
    /// or overlap the end is corrupt. Returns the new end offset.
    pub fn append_recovered(&self, stamped: &[u8], cfg: &AppendConfig) -> Result<i64, LogError> {
        let header = BatchHeader::parse(stamped)?
            .filter(|h| h.size == stamped.len())
            .ok_or_else(|| LogError::Corrupt("recovered batch is not one whole batch".into()))?;
        if batch::compute_crc(stamped) != header.crc {
            return Err(LogError::Corrupt("recovered batch CRC mismatch".into()));
        }
        let mut st = self.state.lock();
        let end = st.end_offset();
        if header.last_offset() < end {
            return Ok(end);
        }
        if header.base_offset != end {
            return Err(LogError::Corrupt(format!(
                "recovered batch at {} does not continue the log at {end}",
                header.base_offset
            )));
        }
        let now = self.clock.now_ms();
        self.maybe_roll(&mut st, cfg, stamped.len(), now)?;
        let (head, records) = stamped.split_at(batch::HEADER_LEN);
        let marker = if header.is_control() {
            control::parse_marker(stamped)?
        } else {
            None
        };
        st.active_mut()
            .append(head, records, &header, now, cfg.index_interval_bytes)?;
        st.track(&header, marker);
        if let Some(sink) = &self.head_sink {
            // The entry carries this leadership's epoch, not the batch's:
            // a takeover replays only the entries of the leadership the
            // manifest records.
            sink.submit(
                &self.durable,
                self.leader_epoch.load(Ordering::Relaxed),
                header.base_offset,
                header.last_offset(),
                head,
                records,
            );
        }
        drop(st);
        let next = header.last_offset() + 1;
        self.end_offset.send_replace(next);
        Ok(next)
    }

    pub fn log_start_offset(&self) -> i64 {
        self.state.lock().log_start_offset
    }

    /// One past the last offset appended (the log end offset).
    pub fn end_offset(&self) -> i64 {
        *self.end_offset.borrow()
    }

    /// Readers see the log below this offset (see the module doc).
    pub fn high_watermark(&self) -> i64 {
        self.high_watermark_locked(&self.state.lock())
    }

    fn high_watermark_locked(&self, st: &State) -> i64 {
        let end = st.end_offset();
        if self.durable_visible() {
            (*self.durable.borrow()).min(end)
        } else {
            end
        }
    }

    fn durable_visible(&self) -> bool {
        self.visibility == Visibility::Durable || self.has_head_sink()
    }

    /// Notified whenever the high watermark may have moved (fetch long-polls on it).
    pub fn subscribe(&self) -> watch::Receiver<i64> {
        if self.durable_visible() {
            self.durable.subscribe()
        } else {
            self.end_offset.subscribe()
        }
    }

    /// Readers wait for the durable end to reach what was appended: starts
    /// an fsync covering it unless one is running or nothing waits (a head
    /// sink makes its appends durable by itself).
    pub fn sync_soon(self: &Arc<Self>) {
        if self.visibility != Visibility::Durable
            || self.has_head_sink()
            || *self.durable.borrow() >= self.end_offset()
        {
            return;
        }
        let partition = self.clone();
        tokio::spawn(async move {
            if let Err(e) = partition.sync().await {
                tracing::error!(dir = %partition.dir.display(), error = %e, "fsync failed");
            }
        });
    }

    /// Where leader epoch `requested` ended, as OffsetForLeaderEpoch answers:
    /// (the largest epoch at most `requested`, its end offset), or (-1, -1).
    pub fn end_offset_for_epoch(&self, requested: i32) -> (i32, i64) {
        let st = self.state.lock();
        st.epochs
            .end_offset_for(requested, self.leader_epoch(), st.end_offset())
    }

    /// The leader epoch history: (epoch, first offset written in it).
    pub fn leader_epochs(&self) -> Vec<(i32, i64)> {
        let st = self.state.lock();
        st.epochs
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect()
    }

    /// Whether the producer at `epoch` has a transaction open here.
    pub fn in_transaction(&self, producer_id: i64, epoch: i16) -> bool {
        self.state
            .lock()
            .producers
            .in_transaction(producer_id, epoch)
    }

    pub fn max_producer_id(&self) -> Option<i64> {
        self.state.lock().producers.max_producer_id()
    }

    /// The last stable offset: nothing at or past it may reach a
    /// read_committed reader, since a transaction still open may abort.
    pub fn last_stable_offset(&self) -> i64 {
        let st = self.state.lock();
        st.last_stable_offset(self.high_watermark_locked(&st))
    }

    /// Every producer this partition knows (DescribeProducers).
    pub fn producers(&self) -> Vec<ProducerInfo> {
        self.state.lock().producers.describe()
    }

    /// Descriptors of the sealed segments, oldest first.
    pub fn sealed_segments(&self) -> Vec<SegmentMeta> {
        self.state
            .lock()
            .segments
            .values()
            .filter_map(|s| s.meta().cloned())
            .collect()
    }

    /// Waits until every offset below `end` is durable: in the head sink
    /// when one is attached, else on disk, syncing if nobody else is.
    pub async fn wait_durable(&self, end: i64) -> Result<(), LogError> {
        if let Some(sink) = &self.head_sink {
            let mut durable = self.durable.subscribe();
            return tokio::select! {
                biased;
                _ = durable.wait_for(|d| *d >= end) => Ok(()),
                e = sink.failed() => {
                    if *self.durable.borrow() >= end { Ok(()) } else { Err(e) }
                }
            };
        }
        loop {
            if *self.durable.borrow() >= end {
                return Ok(());
            }
            let _guard = self.sync_lock.lock().await;
            if *self.durable.borrow() >= end {
                return Ok(());
            }
            self.sync_now().await?;
        }
    }

    /// Whether a topic's `flush.messages` or `flush.ms` asks for an fsync:
    /// that many offsets are not yet durable, or unflushed data is waiting
    /// and the last fsync is that old.
    pub fn flush_due(&self, messages: Option<i64>, ms: Option<i64>) -> bool {
        let unflushed = self.end_offset() - *self.durable.borrow();
        unflushed > 0
            && (messages.is_some_and(|m| unflushed >= m)
                || ms.is_some_and(|ms| {
                    self.clock
                        .now_ms()
                        .saturating_sub(self.last_sync_ms.load(Ordering::Relaxed))
                        >= ms
                }))
    }

    /// Syncs everything appended so far; a no-op when nothing is pending.
    pub async fn sync(&self) -> Result<(), LogError> {
        let end = self.end_offset();
        self.wait_durable(end).await
    }

    async fn sync_now(&self) -> Result<(), LogError> {
        let (file, end) = {
            let st = self.state.lock();
            (st.active().file(), st.end_offset())
        };
        // Rolled segments were synced when they sealed, so syncing the active
        // file makes everything below `end` durable.
        let started = self.clock.now();
        tokio::task::spawn_blocking(move || file.sync_data())
            .await
            .map_err(|e| LogError::Io(std::io::Error::other(e)))??;
        if let Some(t) = &self.sync_timer {
            t.observe(self.clock.now().saturating_duration_since(started));
        }
        self.last_sync_ms
            .store(self.clock.now_ms(), Ordering::Relaxed);
        self.durable.send_if_modified(|d| {
            let advanced = end > *d;
            *d = (*d).max(end);
            advanced
        });
        Ok(())
    }

    /// Syncs the active segment from a blocking context (shutdown).
    pub fn sync_blocking(&self) -> Result<(), LogError> {
        let file = self.state.lock().active().file();
        file.sync_data()?;
        Ok(())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Builds the key index of the sealed segment `base_offset` unless it
    /// has one already, and returns what it says about the segment's keys;
    /// `records` is the segment's record count.
    pub fn ensure_key_index(&self, base_offset: i64, records: u64) -> Result<KeyStats, LogError> {
        let path = super::key_index::ensure_for_segment(&self.dir, base_offset)?;
        super::key_index::key_stats(&path, records)
    }
}

// ---- Tiering hooks: the only parts of the log that know a remote part exists.
impl Partition {
    /// Whether the log has a part in the object store.
    pub fn has_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// The head sink's position at or below which every batch from
    /// `offset` on lies, if `offset` starts a segment created since the last
    /// reset (uploads end at segment boundaries). Only while the partition
    /// takes appends: between a takeover's reset and its end, the head is
    /// still only in the previous leader's log.
    pub fn sink_position_from(&self, offset: i64) -> Option<u64> {
        let st = self.state.lock();
        st.appends_open
            .then(|| st.sink_positions.get(&offset).copied())
            .flatten()
    }

    /// Whether appends are made durable by a head sink.
    pub fn has_head_sink(&self) -> bool {
        self.head_sink.is_some()
    }

    /// Refuses every append from now on (`LogError::Fenced`): another
    /// broker leads the partition now.
    pub fn stop_appends(&self) {
        self.state.lock().appends_open = false;
    }

    /// Takes appends again, once a takeover made this broker the leader.
    pub fn start_appends(&self) {
        self.state.lock().appends_open = true;
    }

    /// The leader epoch stamped into batches from now on.
    pub fn set_leader_epoch(&self, epoch: i32) {
        self.leader_epoch.store(epoch, Ordering::Relaxed);
    }

    pub fn leader_epoch(&self) -> i32 {
        self.leader_epoch.load(Ordering::Relaxed)
    }

    /// Whether `offset` lies below the first local segment with a remote
    /// part attached that covers it, so only the remote part can answer.
    fn below_local(&self, st: &State, offset: i64) -> bool {
        let first_local = st.segments.keys().next().copied().unwrap_or(i64::MAX);
        offset < first_local
            && self
                .remote
                .as_ref()
                .and_then(|r| r.end_offset())
                .is_some_and(|end| offset < end)
    }

    /// Like `read`, but offsets below the local segments come from the remote part.
    pub async fn fetch(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<FetchSlice, LogError> {
        self.fetch_upto(offset, max_bytes, min_one, Upto::HighWatermark)
            .await
    }

    /// `fetch` past the high watermark, up to the end of the log: the
    /// broker replays its internal topics from everything its log holds.
    pub async fn fetch_log(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<FetchSlice, LogError> {
        self.fetch_upto(offset, max_bytes, min_one, Upto::LogEnd)
            .await
    }

    async fn fetch_upto(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
        upto: Upto,
    ) -> Result<FetchSlice, LogError> {
        let remote = {
            let st = self.lock_for(upto)?;
            let (start, end) = (st.log_start_offset, st.end_offset());
            if offset < start || offset > end {
                return Err(LogError::OffsetOutOfRange { offset, start, end });
            }
            if !self.below_local(&st, offset) {
                None
            } else {
                let hw = self.high_watermark_locked(&st);
                let limit = match upto {
                    Upto::HighWatermark => hw,
                    Upto::LogEnd => end,
                };
                let lso = st.last_stable_offset(hw);
                Some((self.remote.as_ref().cloned(), limit, hw, start, lso))
            }
        };
        match remote {
            Some((Some(remote), limit, high_watermark, log_start_offset, last_stable_offset)) => {
                let mut records = remote.read(offset, max_bytes, min_one).await?;
                // A segment sealed and uploaded before its head was durable.
                if remote.end_offset().is_some_and(|end| end > limit) {
                    records.truncate(batch::batches_below_len(&records, limit));
                }
                Ok(FetchSlice {
                    records,
                    high_watermark,
                    log_start_offset,
                    last_stable_offset,
                    aborted: Vec::new(),
                })
            }
            _ => self.read_upto(offset, max_bytes, min_one, upto),
        }
    }

    /// `fetch` for a read_committed reader: only whole batches below the
    /// last stable offset, with the aborted transactions among them, which
    /// the client needs to skip their records.
    pub async fn fetch_committed(
        &self,
        offset: i64,
        max_bytes: usize,
        min_one: bool,
    ) -> Result<FetchSlice, LogError> {
        let mut slice = self.fetch(offset, max_bytes, min_one).await?;
        let lso = slice.last_stable_offset;
        let mut rest = &slice.records[..];
        let (mut stable, mut upper) = (0, offset);
        while let Some(h) = BatchHeader::parse(rest)?.filter(|h| h.size <= rest.len()) {
            if h.base_offset >= lso {
                break;
            }
            stable += h.size;
            upper = h.last_offset() + 1;
            rest = &rest[h.size..];
        }
        slice.records.truncate(stable);
        if upper > offset {
            slice.aborted = self.aborted_txns(offset, upper);
        }
        Ok(slice)
    }

    /// The aborted transactions overlapping `from..upper`, in the object
    /// store and on local disk, by first offset.
    pub fn aborted_txns(&self, from: i64, upper: i64) -> Vec<AbortedTxn> {
        let mut out = Vec::new();
        let complete = self
            .remote
            .as_ref()
            .is_some_and(|r| r.aborted_txns(from, upper, &mut out));
        if !complete {
            let st = self.state.lock();
            let lists = st
                .segments
                .values()
                .filter(|s| s.next_offset() > from)
                .map(|s| s.aborted());
            control::collect_aborted(lists, from, upper, &mut out);
        }
        // Segments both tiered and still local are seen twice.
        out.sort_unstable_by_key(|a| (a.first_offset, a.producer_id, a.last_offset));
        out.dedup();
        out
    }

    /// `offset_for_timestamp` over the remote part first (its offsets are
    /// all lower), then the local segments.
    pub async fn find_offset_for_timestamp(
        &self,
        timestamp: i64,
    ) -> Result<Option<(i64, i64)>, LogError> {
        if let Some(remote) = self.remote.as_ref() {
            let start = self.log_start_offset();
            if let Some(found) = remote.offset_for_timestamp(timestamp, start).await? {
                return Ok(Some(found));
            }
        }
        self.offset_for_timestamp(timestamp)
    }

    /// `max_timestamp` over the remote part and the local segments; on a tie
    /// the lower (remote) offset wins, as the first record with it.
    pub async fn find_max_timestamp(&self) -> Result<Option<(i64, i64)>, LogError> {
        let remote = match self.remote.as_ref() {
            Some(r) => r.max_timestamp(self.log_start_offset()).await?,
            None => None,
        };
        let local = self.max_timestamp()?;
        Ok(match (remote, local) {
            (Some(r), Some(l)) => Some(if l.1 > r.1 { l } else { r }),
            (r, l) => r.or(l),
        })
    }

    /// Seals the active segment if `segment.ms` passed without an append to
    /// roll it, so quiet partitions still reach the store. True if it rolled.
    pub fn roll_if_due(&self, cfg: &AppendConfig) -> Result<bool, LogError> {
        let mut st = self.state.lock();
        let before = st.segments.len();
        self.maybe_roll(&mut st, cfg, 0, self.clock.now_ms())?;
        Ok(st.segments.len() > before)
    }

    /// Deletes the local files of the sealed segment at `base_offset` once the
    /// remote part covers it: local disk keeps only the head and a cache.
    pub fn release_local(&self, base_offset: i64) -> Result<bool, LogError> {
        let remote_end = self.remote.as_ref().and_then(|r| r.end_offset());
        let mut st = self.state.lock();
        let active_base = st.active().base_offset();
        let Some(seg) = st.segments.get(&base_offset) else {
            return Ok(false);
        };
        // An empty sealed segment holds nothing to lose.
        let covered = seg.is_empty() || remote_end.is_some_and(|e| e >= seg.next_offset());
        if base_offset == active_base || seg.meta().is_none() || !covered {
            return Ok(false);
        }
        if let Some(seg) = st.segments.remove(&base_offset) {
            seg.release_files()?;
        }
        prune_snapshots(&self.dir, base_offset, &st.segments)?;
        Ok(true)
    }

    /// Whether the partition has a tiered part at all (Kafka's "remote log
    /// enabled"); the server always gives it one, some tests do not.
    pub fn is_tiered(&self) -> bool {
        self.remote.is_some()
    }

    /// One past the last offset held in the object store, if any is.
    pub fn tiered_end_offset(&self) -> Option<i64> {
        self.remote.as_ref().and_then(|r| r.end_offset())
    }

    /// Bytes of this partition held in the object store.
    pub fn tiered_bytes(&self) -> u64 {
        self.remote.as_ref().map_or(0, |r| r.size_bytes())
    }

    /// The first offset still on local disk (Kafka's local log start offset).
    pub fn local_start_offset(&self) -> i64 {
        let st = self.state.lock();
        let first_local = st.segments.keys().next().copied().unwrap_or(i64::MAX);
        first_local.max(st.log_start_offset).min(st.end_offset())
    }

    /// (base offset, size) of every local segment, the active one last.
    pub fn local_segment_sizes(&self) -> Vec<(i64, u64)> {
        self.state
            .lock()
            .segments
            .values()
            .map(|s| (s.base_offset(), s.size()))
            .collect()
    }
}

/// Where a partition whose older data lives elsewhere (the object store)
/// continues, for [`Partition::prepare_restore`].
#[derive(Debug, Clone)]
pub struct RestorePoint {
    /// The first offset the local log will hold.
    pub next_offset: i64,
    pub log_start_offset: i64,
    /// The producer snapshot of the segment ending at `next_offset`: that
    /// segment's base offset and the snapshot's bytes.
    pub producers: Option<(i64, Bytes)>,
}

impl Partition {
    /// Whether the (not yet opened) partition directory `dir` holds a log.
    pub fn has_segments(dir: &Path) -> bool {
        std::fs::read_dir(dir).is_ok_and(|entries| {
            entries
                .filter_map(|e| e.ok())
                .any(|e| e.file_name().to_string_lossy().ends_with(".log"))
        })
    }

    /// Prepares the (not yet opened) partition directory `dir` to continue
    /// at `point`: a directory without segments gets the producer snapshot
    /// and an empty active segment at `point.next_offset`, and any directory
    /// gets its log start offset raised to `point.log_start_offset`. Returns
    /// whether the directory had no segments.
    pub fn prepare_restore(dir: &Path, point: &RestorePoint) -> Result<bool, LogError> {
        std::fs::create_dir_all(dir)?;
        let has_segments = Partition::has_segments(dir);
        if !has_segments {
            // Before the log, whose presence marks the partition as restored:
            // the producer state as of that offset, so idempotent producers
            // go on with their sequences.
            if let Some((base, bytes)) = &point.producers {
                write_synced(&dir.join(file_name(*base, SNAPSHOT_EXT)), bytes)?;
            }
            let log = dir.join(file_name(
                point.next_offset,
                crate::format::segment::LOG_EXT,
            ));
            std::fs::File::create(log)?.sync_all()?;
        }
        let path = dir.join(LOG_START_FILE);
        let local = std::fs::read_to_string(&path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok());
        if local.is_none_or(|l| l < point.log_start_offset) {
            write_synced(&path, point.log_start_offset.to_string().as_bytes())?;
        }
        Ok(!has_segments)
    }
}

/// Records batch `h` (with the marker it holds, if a control batch) in the
/// producer state and the epoch history. Returns the transaction an ABORT
/// marker ended, if it wrote data here, for the marker's segment.
fn replay(
    producers: &mut ProducerStates,
    epochs: &mut LeaderEpochs,
    h: &BatchHeader,
    marker: Option<EndTxnMarker>,
) -> Option<AbortedTxn> {
    epochs.record(h.leader_epoch, h.base_offset);
    let Some(marker) = marker else {
        producers.record(h);
        return None;
    };
    let done = producers.record_marker(h, marker)?;
    if done.commit {
        return None;
    }
    let end = h.last_offset() + 1;
    Some(AbortedTxn {
        producer_id: done.producer_id,
        first_offset: done.first_offset,
        last_offset: done.last_offset,
        last_stable_offset: producers
            .first_unstable_offset()
            .map_or(end, |f| f.min(end)),
    })
}

/// The producer state and epoch history to start from: the newest readable
/// snapshot of a sealed segment or of one whose data is only in the store (a
/// snapshot next to an unsealed log may be ahead of what recovery keeps).
/// Returns its segment's base and what it holds; without one, replay starts
/// from nothing.
fn newest_snapshot(
    dir: &Path,
    mut bases: Vec<i64>,
    segments: &BTreeMap<i64, Segment>,
) -> (i64, Restored) {
    bases.sort_unstable_by(|a, b| b.cmp(a));
    for base in bases {
        if segments.get(&base).is_some_and(|s| s.meta().is_none()) {
            continue;
        }
        let path = dir.join(file_name(base, SNAPSHOT_EXT));
        match std::fs::read(&path)
            .map_err(LogError::from)
            .and_then(|b| ProducerStates::from_snapshot(&b))
        {
            Ok(restored) => return (base, restored),
            Err(e) => {
                tracing::warn!(snapshot = %path.display(), error = %e, "ignoring unreadable producer snapshot")
            }
        }
    }
    let nothing = Restored {
        end_offset: i64::MIN,
        ..Restored::default()
    };
    (i64::MIN, nothing)
}

/// Deletes the snapshots below `base` whose segments are no longer local:
/// the newer one holds all they do.
fn prune_snapshots(
    dir: &Path,
    base: i64,
    segments: &BTreeMap<i64, Segment>,
) -> Result<(), LogError> {
    let suffix = format!(".{SNAPSHOT_EXT}");
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let old = name
            .to_string_lossy()
            .strip_suffix(&suffix)
            .and_then(|b| b.parse::<i64>().ok())
            .filter(|b| *b < base && !segments.contains_key(b));
        if old.is_some() {
            match std::fs::remove_file(dir.join(&name)) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e.into()),
                _ => {}
            }
        }
    }
    Ok(())
}

/// Builds a sealed segment's key index off the produce path: it decodes and
/// decompresses the whole segment. A failure only costs time later, since a
/// merge builds a missing index itself.
fn build_key_index_in_background(dir: PathBuf, base_offset: i64) {
    let spawned = std::thread::Builder::new()
        .name("key-index".into())
        .spawn(move || {
            if let Err(e) = build_for_segment(&dir, base_offset, DEFAULT_BUILD_BUDGET) {
                tracing::warn!(dir = %dir.display(), base_offset, error = %e, "key index build failed");
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "could not start key index build");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::batch::tests::make_batch;

    fn cfg() -> AppendConfig {
        AppendConfig {
            max_message_bytes: 1 << 20,
            segment_bytes: 1000,
            segment_ms: i64::MAX,
            segment_jitter_ms: 0,
            index_interval_bytes: 4096,
            log_append_time: false,
            compact: false,
        }
    }

    #[test]
    fn index_interval_bytes_sets_the_index_density() {
        for (interval, indexed_second) in [(0, true), (4096, false)] {
            let dir = tempfile::tempdir().unwrap();
            let p = Partition::open(dir.path(), Visibility::default()).unwrap();
            let cfg = AppendConfig {
                segment_bytes: 1 << 20,
                index_interval_bytes: interval,
                ..cfg()
            };
            let first = make_batch(2, -1, -1, -1, 1000);
            p.append(&first, &cfg).unwrap();
            p.append(&make_batch(2, -1, -1, -1, 1001), &cfg).unwrap();
            let position = p.state.lock().active().index_position(2);
            assert_eq!(
                position == first.len() as u64,
                indexed_second,
                "interval {interval}"
            );
        }
    }

    #[tokio::test]
    async fn flush_due_counts_unsynced_offsets_and_fsync_age() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        // Nothing to flush: never due.
        assert!(!p.flush_due(Some(1), Some(0)));
        p.append(&make_batch(2, -1, -1, -1, 1), &cfg()).unwrap();
        assert!(p.flush_due(Some(2), None));
        assert!(!p.flush_due(Some(3), None));
        assert!(!p.flush_due(None, None));
        assert!(!p.flush_due(None, Some(60_000)));
        assert!(p.flush_due(None, Some(0)));
        p.sync().await.unwrap();
        assert!(!p.flush_due(Some(1), Some(0)));
    }

    #[tokio::test]
    async fn durable_visibility_serves_only_what_was_fsynced() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partition::open(dir.path(), Visibility::Durable).unwrap();
        p.append(&make_batch(2, -1, -1, -1, 1), &cfg()).unwrap();
        let slice = p.read(0, 1 << 20, true).unwrap();
        assert!(slice.records.is_empty(), "not fsynced yet");
        assert_eq!(
            (slice.high_watermark, slice.last_stable_offset),
            (0, 0),
            "the marks stop at the durable end"
        );
        assert_eq!((p.high_watermark(), p.end_offset()), (0, 2));
        assert!(
            matches!(p.delete_records(2), Err(LogError::OffsetOutOfRange { .. })),
            "DeleteRecords stops at the high watermark"
        );
        let woken = p.subscribe();
        p.sync().await.unwrap();
        assert!(woken.has_changed().unwrap(), "waiting readers are woken");
        let slice = p.read(0, 1 << 20, true).unwrap();
        assert_eq!(slice.high_watermark, 2);
        assert_eq!(batch::count_records(&slice.records), 2);
    }

    /// Raises the marks it is handed only when told to, like a write-ahead
    /// log whose store has not answered yet.
    #[derive(Default)]
    struct HeldSink {
        submitted: Mutex<Vec<(DurableMark, i64)>>,
        fenced: watch::Sender<bool>,
    }

    impl HeldSink {
        fn release(&self) {
            for (mark, end) in self.submitted.lock().drain(..) {
                mark.send_replace(end);
            }
        }
    }

    impl HeadSink for HeldSink {
        fn check(&self) -> Result<(), LogError> {
            Ok(())
        }
        fn submit(&self, durable: &DurableMark, _: i32, _: i64, last: i64, _: &[u8], _: &[u8]) {
            self.submitted.lock().push((durable.clone(), last + 1));
        }
        fn position(&self) -> u64 {
            self.submitted.lock().len() as u64
        }
        fn failed(
            &self,
        ) -> std::pin::Pin<Box<dyn std::future::Future<Output = LogError> + Send + '_>> {
            let mut fenced = self.fenced.subscribe();
            Box::pin(async move {
                let _ = fenced.wait_for(|f| *f).await;
                LogError::Fenced
            })
        }
    }

    /// A partition with a head sink, as a cluster's broker opens it, taken over at 0.
    fn led_partition(dir: &Path, sink: Arc<HeldSink>) -> Arc<Partition> {
        let settings = PartitionSettings {
            visibility: Visibility::Appended,
            head_sink: Some(sink),
            ..Default::default()
        };
        let p = Arc::new(Partition::open(dir, settings).unwrap());
        p.reset(&RestorePoint {
            next_offset: 0,
            log_start_offset: 0,
            producers: None,
        })
        .unwrap();
        p.start_appends();
        p
    }

    #[tokio::test]
    async fn a_head_sink_holds_the_high_watermark_until_its_store_has_the_batch() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Arc::new(HeldSink::default());
        let p = led_partition(dir.path(), sink.clone());
        p.append(&make_batch(3, -1, -1, -1, 1), &cfg()).unwrap();
        assert_eq!((p.high_watermark(), p.end_offset()), (0, 3));
        assert!(p.read(0, 1 << 20, true).unwrap().records.is_empty());
        assert!(
            !p.fetch_log(0, 1 << 20, true)
                .await
                .unwrap()
                .records
                .is_empty(),
            "the broker's own replays read the whole log"
        );
        let waiting = tokio::spawn({
            let p = p.clone();
            async move { p.wait_durable(3).await }
        });
        let mut woken = p.subscribe();
        sink.release();
        woken.changed().await.unwrap();
        waiting.await.unwrap().unwrap();
        assert_eq!(p.high_watermark(), 3);
        assert_eq!(
            batch::count_records(&p.read(0, 1 << 20, true).unwrap().records),
            3
        );

        // A fenced sink fails whoever waits for what it never made durable.
        p.append(&make_batch(1, -1, -1, -1, 2), &cfg()).unwrap();
        let waiting = tokio::spawn({
            let p = p.clone();
            async move { p.wait_durable(4).await }
        });
        sink.fenced.send_replace(true);
        assert!(matches!(waiting.await.unwrap(), Err(LogError::Fenced)));
        assert_eq!(p.high_watermark(), 3);
    }

    #[test]
    fn a_partition_handed_over_takes_no_appends_until_taken_over_again() {
        let dir = tempfile::tempdir().unwrap();
        let settings = PartitionSettings {
            head_sink: Some(Arc::new(HeldSink::default())),
            ..Default::default()
        };
        let opened = Partition::open(dir.path(), settings).unwrap();
        let refused = opened.append(&make_batch(1, -1, -1, -1, 1), &cfg());
        assert!(matches!(refused, Err(LogError::Fenced)), "not led yet");
        drop(opened);

        let p = led_partition(dir.path(), Arc::new(HeldSink::default()));
        p.append(&make_batch(2, -1, -1, -1, 1), &cfg()).unwrap();
        p.stop_appends();
        let marker = EndTxnMarker {
            commit: true,
            coordinator_epoch: 0,
        };
        assert!(matches!(
            p.append(&make_batch(1, -1, -1, -1, 2), &cfg()),
            Err(LogError::Fenced)
        ));
        assert!(matches!(
            p.append_marker(7, 0, marker, false, &cfg()),
            Err(LogError::Fenced)
        ));
        assert_eq!(p.end_offset(), 2, "the end a handover reads is final");

        p.reset(&RestorePoint {
            next_offset: 2,
            log_start_offset: 0,
            producers: None,
        })
        .unwrap();
        let refused = p.append(&make_batch(1, -1, -1, -1, 3), &cfg());
        assert!(
            matches!(refused, Err(LogError::Fenced)),
            "until the takeover ends"
        );
        p.start_appends();
        p.append(&make_batch(1, -1, -1, -1, 3), &cfg()).unwrap();
        assert_eq!(p.end_offset(), 3);
    }

    #[tokio::test]
    async fn a_partition_not_led_answers_no_consumer_reads() {
        let dir = tempfile::tempdir().unwrap();
        let sink = Arc::new(HeldSink::default());
        let p = led_partition(dir.path(), sink.clone());
        p.append(&make_batch(3, -1, -1, -1, 1), &cfg()).unwrap();
        sink.release();
        assert_eq!(p.fetch(2, 1 << 20, true).await.unwrap().high_watermark, 3);

        // A takeover of its own partition: the log goes back to the store's
        // end, 1, before the head is replayed. A reader at 2 must not be
        // told the log ends below it.
        p.stop_appends();
        p.reset(&RestorePoint {
            next_offset: 1,
            log_start_offset: 0,
            producers: None,
        })
        .unwrap();
        assert!(matches!(
            p.fetch(2, 1 << 20, true).await,
            Err(LogError::Fenced)
        ));
        assert!(matches!(p.read(0, 1 << 20, true), Err(LogError::Fenced)));
        assert!(
            p.fetch_log(0, 1 << 20, true).await.is_ok(),
            "the broker's own replay of its internal topics still reads"
        );
        // What the reader would have been told without the gate.
        p.start_appends();
        assert!(matches!(
            p.fetch(2, 1 << 20, true).await,
            Err(LogError::OffsetOutOfRange { .. })
        ));
    }

    #[test]
    fn segment_jitter_shortens_segment_ms_per_segment() {
        let root = tempfile::tempdir().unwrap();
        let jittered = |segment_ms| AppendConfig {
            segment_ms,
            segment_jitter_ms: i64::MAX,
            ..cfg()
        };
        assert_eq!(segment_jitter(root.path(), 0, &cfg()), 0);
        let spread: std::collections::HashSet<i64> = (0..100)
            .map(|b| segment_jitter(root.path(), b, &jittered(1000)))
            .collect();
        assert!(spread.iter().all(|j| (0..1000).contains(j)) && spread.len() > 50);
        // A partition whose first segment's jitter leaves at most 3 ms of a
        // 10 s segment.ms (one in about 3,000): it rolls at once, which
        // without jitter it would not.
        let segment_ms = 10_000;
        let dir = (0..)
            .map(|i| root.path().join(i.to_string()))
            .find(|d| segment_ms - segment_jitter(d, 0, &jittered(segment_ms)) <= 3)
            .unwrap();
        let p = Partition::open(&dir, Visibility::default()).unwrap();
        assert!(segment_ms - p.roll_jitter(0, &jittered(segment_ms)) <= 3);
        p.append(&make_batch(1, -1, -1, -1, 1), &cfg()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
        let plain = AppendConfig {
            segment_ms,
            ..cfg()
        };
        assert!(!p.roll_if_due(&plain).unwrap());
        assert!(p.roll_if_due(&jittered(segment_ms)).unwrap());
    }

    #[test]
    fn appends_roll_and_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        for i in 0..50 {
            let out = p
                .append(&make_batch(2, -1, -1, -1, 1000 + i), &cfg())
                .unwrap();
            assert_eq!(out.base_offset, i * 2);
        }
        assert!(p.sealed_segments().len() > 3);
        let slice = p.read(33, 1 << 20, true).unwrap();
        let first = BatchHeader::parse(&slice.records).unwrap().unwrap();
        assert_eq!(first.base_offset, 32);
        assert_eq!(p.offset_for_timestamp(1010).unwrap(), Some((20, 1010)));
        assert_eq!(p.max_timestamp().unwrap(), Some((98, 1049)));
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.end_offset(), 100);
        assert!(matches!(
            p.read(101, 100, true),
            Err(LogError::OffsetOutOfRange { .. })
        ));
        assert_eq!(p.delete_records(41).unwrap(), 41);
        assert!(matches!(
            p.read(40, 100, true),
            Err(LogError::OffsetOutOfRange { .. })
        ));
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.log_start_offset(), 41);
    }

    /// A remote part holding offsets below `end`, answering with a marker.
    /// Covers offsets below `end` once a test sets it (-1: nothing yet).
    struct FakeRemote {
        end: AtomicI64,
    }

    impl FakeRemote {
        fn new() -> Arc<FakeRemote> {
            Arc::new(FakeRemote {
                end: AtomicI64::new(-1),
            })
        }

        fn cover_to(&self, end: i64) {
            self.end.store(end, Ordering::Relaxed);
        }
    }

    impl RemoteLog for FakeRemote {
        fn end_offset(&self) -> Option<i64> {
            Some(self.end.load(Ordering::Relaxed)).filter(|e| *e >= 0)
        }
        fn read(&self, _: i64, _: usize, _: bool) -> crate::log::RemoteFuture<'_, Bytes> {
            Box::pin(async { Ok(Bytes::from_static(b"remote")) })
        }
        fn offset_for_timestamp(
            &self,
            ts: i64,
            _: i64,
        ) -> crate::log::RemoteFuture<'_, Option<(i64, i64)>> {
            Box::pin(async move { Ok((ts <= 1003).then_some((3, 1003))) })
        }
        fn size_bytes(&self) -> u64 {
            0
        }

        fn max_timestamp(&self, _: i64) -> crate::log::RemoteFuture<'_, Option<(i64, i64)>> {
            Box::pin(async { Ok(Some((5, 5000))) })
        }

        fn aborted_txns(&self, _: i64, _: i64, _: &mut Vec<AbortedTxn>) -> bool {
            false
        }
    }

    #[tokio::test]
    async fn offsets_below_released_segments_come_from_the_remote_part() {
        let dir = tempfile::tempdir().unwrap();
        let flag = Arc::new(AtomicBool::new(false));
        let remote = FakeRemote::new();
        let settings = PartitionSettings {
            remote: Some(remote.clone()),
            backpressure: Some(flag.clone()),
            ..Default::default()
        };
        let p = Partition::open(dir.path(), settings).unwrap();
        for i in 0..50 {
            p.append(&make_batch(2, -1, -1, -1, 1000 + i), &cfg())
                .unwrap();
        }
        let sealed = p.sealed_segments();
        let remote_end = sealed[1].next_offset;
        // Nothing is released before a remote part covers it.
        assert!(!p.release_local(sealed[0].base_offset).unwrap());
        remote.cover_to(remote_end);
        assert!(p.release_local(sealed[0].base_offset).unwrap());
        assert!(p.release_local(sealed[1].base_offset).unwrap());
        assert!(!p.release_local(sealed[2].base_offset).unwrap());
        assert!(!dir
            .path()
            .join(file_name(0, crate::format::segment::LOG_EXT))
            .exists());

        assert_eq!(
            &p.fetch(0, 1000, true).await.unwrap().records[..],
            b"remote"
        );
        assert!(matches!(p.read(0, 1000, true), Err(LogError::Remote(_))));
        let local = p.fetch(remote_end, 1 << 20, true).await.unwrap();
        let h = BatchHeader::parse(&local.records).unwrap().unwrap();
        assert_eq!(h.base_offset, remote_end);
        // Timestamps: the remote part first; the larger max timestamp wins.
        assert_eq!(
            p.find_offset_for_timestamp(1001).await.unwrap(),
            Some((3, 1003))
        );
        assert_eq!(
            p.find_offset_for_timestamp(1040).await.unwrap(),
            Some((80, 1040))
        );
        assert_eq!(p.find_max_timestamp().await.unwrap(), Some((5, 5000)));

        flag.store(true, Ordering::Relaxed);
        assert!(matches!(
            p.append(&make_batch(1, -1, -1, -1, 1), &cfg()),
            Err(LogError::Backpressure)
        ));
        flag.store(false, Ordering::Relaxed);
        p.append(&make_batch(1, -1, -1, -1, 1), &cfg()).unwrap();
        let due = AppendConfig {
            segment_ms: 0,
            segment_jitter_ms: 0,
            index_interval_bytes: 4096,
            ..cfg()
        };
        assert!(p.roll_if_due(&due).unwrap());
        assert!(
            !p.roll_if_due(&due).unwrap(),
            "an empty segment never rolls"
        );
    }

    #[test]
    fn idempotent_retry_is_not_appended_twice_even_after_restart() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        let b = make_batch(3, 77, 0, 0, 1);
        assert!(!p.append(&b, &cfg()).unwrap().duplicate);
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        let again = p.append(&b, &cfg()).unwrap();
        assert!(again.duplicate);
        assert_eq!(again.base_offset, 0);
        assert_eq!(p.end_offset(), 3);
        assert!(matches!(
            p.append(&make_batch(1, 77, 0, 9, 1), &cfg()),
            Err(LogError::OutOfOrderSequence { .. })
        ));
    }

    #[test]
    fn producer_state_outlives_released_segments_through_their_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let remote = FakeRemote::new();
        let settings = PartitionSettings {
            remote: Some(remote.clone()),
            ..Default::default()
        };
        let p = Partition::open(dir.path(), settings).unwrap();
        let mut last = None;
        for seq in 0..30 {
            let b = make_batch(2, 77, 0, seq * 2, 1000 + seq as i64);
            last = Some((b.clone(), p.append(&b, &cfg()).unwrap().base_offset));
        }
        let (last, last_offset) = last.unwrap();
        let due = AppendConfig {
            segment_ms: 0,
            segment_jitter_ms: 0,
            index_interval_bytes: 4096,
            ..cfg()
        };
        assert!(p.roll_if_due(&due).unwrap());
        remote.cover_to(p.end_offset());
        for s in p.sealed_segments() {
            assert!(p.release_local(s.base_offset).unwrap());
        }
        let count = |ext: &str| {
            std::fs::read_dir(dir.path())
                .unwrap()
                .filter(|e| {
                    let name = e.as_ref().unwrap().file_name();
                    name.to_string_lossy().ends_with(ext)
                })
                .count()
        };
        // Only the active segment's data and the newest snapshot are left.
        assert_eq!((count(".log"), count(".producers")), (1, 1));
        drop(p);

        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.max_producer_id(), Some(77));
        let retry = p.append(&last, &cfg()).unwrap();
        assert!(retry.duplicate);
        assert_eq!(retry.base_offset, last_offset);
        assert!(matches!(
            p.append(&make_batch(1, 77, 0, 61, 1), &cfg()),
            Err(LogError::OutOfOrderSequence { expected: 60, .. })
        ));
        let next = p.append(&make_batch(1, 77, 0, 60, 1), &cfg()).unwrap();
        assert!(!next.duplicate);
        assert_eq!(next.base_offset, 60);
    }

    /// Appends `batches` batches of two records at leader epoch `epoch`.
    fn append_at(p: &Partition, epoch: i32, batches: usize) {
        p.set_leader_epoch(epoch);
        for _ in 0..batches {
            p.append(&make_batch(2, -1, -1, -1, 1), &cfg()).unwrap();
        }
    }

    fn roll_now(p: &Partition) {
        let due = AppendConfig {
            segment_ms: 0,
            ..cfg()
        };
        assert!(p.roll_if_due(&due).unwrap());
    }

    #[test]
    fn leader_epoch_history_survives_reopen_release_and_a_moved_log_start() {
        let dir = tempfile::tempdir().unwrap();
        let remote = FakeRemote::new();
        let with_remote = || PartitionSettings {
            remote: Some(remote.clone()),
            ..Default::default()
        };
        let p = Partition::open(dir.path(), with_remote()).unwrap();
        // A fresh single broker: epoch 0 ends at the log end.
        assert_eq!(p.end_offset_for_epoch(0), (0, 0));
        append_at(&p, 0, 5);
        append_at(&p, 3, 20);
        append_at(&p, 7, 3);
        let history = vec![(0, 0), (3, 10), (7, 50)];
        assert_eq!(p.leader_epochs(), history);
        assert_eq!(p.sealed_segments().len(), 2, "the history spans segments");
        assert_eq!(p.end_offset_for_epoch(3), (3, 50));
        assert_eq!(p.end_offset_for_epoch(5), (3, 50));
        assert_eq!(p.end_offset_for_epoch(7), (7, 56));
        assert_eq!(p.end_offset_for_epoch(8), (-1, -1));
        // Reopened: the newest snapshot plus the headers of the active segment.
        drop(p);
        let p = Partition::open(dir.path(), with_remote()).unwrap();
        assert_eq!(p.leader_epochs(), history);
        assert_eq!(p.end_offset_for_epoch(3), (3, 50));
        // With every sealed segment's data gone from local disk, only the
        // newest snapshot holds it.
        roll_now(&p);
        remote.cover_to(p.end_offset());
        for s in p.sealed_segments() {
            assert!(p.release_local(s.base_offset).unwrap());
        }
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.leader_epochs(), history);
        // DeleteRecords: the epoch holding the new log start starts there.
        p.delete_records(30).unwrap();
        assert_eq!(p.leader_epochs(), [(3, 30), (7, 50)]);
        assert_eq!(p.end_offset_for_epoch(0), (0, 30));
        assert_eq!(p.end_offset_for_epoch(3), (3, 50));
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.leader_epochs(), [(3, 30), (7, 50)]);
    }

    #[test]
    fn a_restore_or_takeover_continues_the_history_from_the_tiered_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let old = Partition::open(dir.path(), Visibility::default()).unwrap();
        append_at(&old, 1, 10);
        append_at(&old, 2, 5);
        roll_now(&old);
        let tiered = old.sealed_segments().pop().unwrap();
        // The head the old leader made durable in its write-ahead log only.
        append_at(&old, 2, 3);
        append_at(&old, 4, 2);
        let history = vec![(1, 0), (2, 20), (4, 36)];
        assert_eq!(old.leader_epochs(), history);
        let snapshot =
            std::fs::read(dir.path().join(file_name(tiered.base_offset, SNAPSHOT_EXT))).unwrap();
        let point = RestorePoint {
            next_offset: tiered.next_offset,
            log_start_offset: 0,
            producers: Some((tiered.base_offset, Bytes::from(snapshot))),
        };

        // Restore into an empty data directory: the tiered part's history.
        let restored = tempfile::tempdir().unwrap();
        assert!(Partition::prepare_restore(restored.path(), &point).unwrap());
        let p = Partition::open(restored.path(), Visibility::default()).unwrap();
        assert_eq!(p.leader_epochs(), [(1, 0), (2, 20)]);

        // Takeover at epoch 6: the tiered snapshot, then the head read back.
        let taken = tempfile::tempdir().unwrap();
        let p = Partition::open(taken.path(), Visibility::default()).unwrap();
        append_at(&p, 0, 4); // a stale local head, forgotten
        p.set_leader_epoch(6);
        p.reset(&point).unwrap();
        let mut offset = point.next_offset;
        while offset < old.end_offset() {
            let slice = old.read(offset, 1 << 20, true).unwrap();
            let mut rest = &slice.records[..];
            while let Some(h) = BatchHeader::parse(rest).unwrap() {
                offset = p.append_recovered(&rest[..h.size], &cfg()).unwrap();
                rest = &rest[h.size..];
            }
        }
        assert_eq!(p.leader_epochs(), history);
        // Nothing written at epoch 6 yet: epoch 4 ends at the log end.
        assert_eq!(p.end_offset_for_epoch(4), (4, 40));
        assert_eq!(p.end_offset_for_epoch(6), (6, 40));
        append_at(&p, 6, 1);
        assert_eq!(p.end_offset_for_epoch(4), (4, 40));
        assert_eq!(p.end_offset_for_epoch(5), (4, 40));
        assert_eq!(p.end_offset_for_epoch(6), (6, 42));
        assert_eq!(p.leader_epochs(), [(1, 0), (2, 20), (4, 36), (6, 40)]);
    }

    /// A transactional batch of `count` records.
    fn txn_batch(count: i32, pid: i64, seq: i32) -> Vec<u8> {
        let mut b = make_batch(count, pid, 0, seq, 1000);
        b[batch::ATTRIBUTES_OFFSET + 1] |= 1 << 4;
        let crc = batch::compute_crc(&b);
        b[batch::CRC_OFFSET..batch::CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
        b
    }

    fn end(commit: bool) -> EndTxnMarker {
        EndTxnMarker {
            commit,
            coordinator_epoch: 0,
        }
    }

    /// Base offsets of the batches a fetch returned.
    fn bases(slice: &FetchSlice) -> Vec<i64> {
        let mut out = Vec::new();
        let mut rest = &slice.records[..];
        while let Some(h) = BatchHeader::parse(rest).unwrap() {
            out.push(h.base_offset);
            rest = &rest[h.size..];
        }
        out
    }

    #[tokio::test]
    async fn read_committed_stops_at_the_lso_and_names_the_aborted_transactions() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        let cfg = AppendConfig {
            segment_bytes: 1 << 20,
            ..cfg()
        };
        p.append(&txn_batch(2, 1, 0), &cfg).unwrap(); // 0-1
        p.append(&make_batch(2, -1, -1, -1, 1), &cfg).unwrap(); // 2-3
        p.append(&txn_batch(2, 2, 0), &cfg).unwrap(); // 4-5
        assert_eq!(p.last_stable_offset(), 0);
        assert!(p
            .fetch_committed(0, 1 << 20, true)
            .await
            .unwrap()
            .records
            .is_empty());
        let all = p.fetch(0, 1 << 20, true).await.unwrap();
        assert_eq!((bases(&all), all.last_stable_offset), (vec![0, 2, 4], 0));

        p.append_marker(1, 0, end(false), false, &cfg).unwrap(); // 6
        assert_eq!(p.last_stable_offset(), 4);
        let committed = p.fetch_committed(0, 1 << 20, true).await.unwrap();
        assert_eq!(bases(&committed), [0, 2]);
        let aborted = AbortedTxn {
            producer_id: 1,
            first_offset: 0,
            last_offset: 6,
            last_stable_offset: 4,
        };
        assert_eq!(committed.aborted, [aborted]);
        // Kafka names every transaction overlapping the range, though pid 1
        // wrote nothing in 2..4 itself.
        assert_eq!(
            p.fetch_committed(2, 1 << 20, true).await.unwrap().aborted,
            [aborted]
        );

        p.append_marker(2, 0, end(true), false, &cfg).unwrap(); // 7
        assert_eq!(p.last_stable_offset(), 8);
        let committed = p.fetch_committed(0, 1 << 20, true).await.unwrap();
        assert_eq!(bases(&committed), [0, 2, 4, 6, 7]);
        assert_eq!(committed.aborted, [aborted]);
        // Past its marker, it is over.
        assert!(p
            .fetch_committed(7, 1 << 20, true)
            .await
            .unwrap()
            .aborted
            .is_empty());

        // An open transaction and the aborted index survive a reopen, in the
        // active segment (replayed) and in a sealed one (its descriptor).
        p.append(&txn_batch(1, 1, 2), &cfg).unwrap(); // 8
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.last_stable_offset(), 8);
        assert_eq!(p.aborted_txns(0, 9), [aborted]);
        roll_now(&p);
        drop(p);
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        assert_eq!(p.sealed_segments()[0].aborted, [aborted]);
        assert_eq!(p.aborted_txns(0, 9), [aborted]);
        assert_eq!(p.last_stable_offset(), 8);
        p.append_marker(1, 0, end(false), false, &cfg).unwrap(); // 9
        assert_eq!(p.last_stable_offset(), 10);
        assert_eq!(p.aborted_txns(5, 10).len(), 2);
    }

    #[test]
    fn a_restore_or_takeover_continues_open_transactions_from_the_tiered_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let old = Partition::open(dir.path(), Visibility::default()).unwrap();
        old.append(&txn_batch(2, 7, 0), &cfg()).unwrap(); // 0-1, open across the seal
        roll_now(&old);
        let tiered = old.sealed_segments().pop().unwrap();
        old.append(&make_batch(1, -1, -1, -1, 1), &cfg()).unwrap(); // 2
        old.append_marker(7, 0, end(false), false, &cfg()).unwrap(); // 3
        let snapshot =
            std::fs::read(dir.path().join(file_name(tiered.base_offset, SNAPSHOT_EXT))).unwrap();
        let point = RestorePoint {
            next_offset: tiered.next_offset,
            log_start_offset: 0,
            producers: Some((tiered.base_offset, Bytes::from(snapshot))),
        };

        let restored = tempfile::tempdir().unwrap();
        assert!(Partition::prepare_restore(restored.path(), &point).unwrap());
        let p = Partition::open(restored.path(), Visibility::default()).unwrap();
        assert_eq!(p.last_stable_offset(), 0, "the tiered transaction is open");

        // Takeover: the snapshot, then the head read back (marker included).
        let taken = tempfile::tempdir().unwrap();
        let p = Partition::open(taken.path(), Visibility::default()).unwrap();
        p.reset(&point).unwrap();
        assert_eq!(p.last_stable_offset(), 0);
        let slice = old.read(point.next_offset, 1 << 20, true).unwrap();
        let mut rest = &slice.records[..];
        while let Some(h) = BatchHeader::parse(rest).unwrap() {
            p.append_recovered(&rest[..h.size], &cfg()).unwrap();
            rest = &rest[h.size..];
        }
        assert_eq!(p.last_stable_offset(), 4);
        assert_eq!(
            p.aborted_txns(0, 4),
            [AbortedTxn {
                producer_id: 7,
                first_offset: 0,
                last_offset: 3,
                last_stable_offset: 4
            }]
        );
    }

    /// `flush.ms` and `segment.ms` age on the partition's clock, not the
    /// system's: nothing waits here.
    #[test]
    fn flush_ms_and_segment_ms_follow_the_clock() {
        let dir = tempfile::tempdir().unwrap();
        let clock = crate::clock::ManualClock::new(1_000);
        let settings = PartitionSettings {
            clock: clock.clone(),
            ..Default::default()
        };
        let p = Partition::open(dir.path(), settings).unwrap();
        let cfg = AppendConfig {
            segment_ms: 10_000,
            ..cfg()
        };
        p.append(&make_batch(2, -1, -1, -1, 1), &cfg).unwrap();
        assert!(!p.flush_due(None, Some(100)));
        clock.advance(std::time::Duration::from_millis(100));
        assert!(p.flush_due(None, Some(100)));
        p.append(&make_batch(2, -1, -1, -1, 2), &cfg).unwrap();
        assert_eq!(p.state.lock().segments.len(), 1);
        clock.advance(std::time::Duration::from_millis(10_000));
        p.append(&make_batch(2, -1, -1, -1, 3), &cfg).unwrap();
        assert_eq!(p.state.lock().segments.len(), 2, "rolled at segment.ms");
    }

    #[test]
    fn whole_batches_only_and_min_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = Partition::open(dir.path(), Visibility::default()).unwrap();
        let b = make_batch(4, -1, -1, -1, 1);
        p.append(&b, &cfg()).unwrap();
        p.append(&b, &cfg()).unwrap();
        assert_eq!(
            p.read(0, b.len() + 10, false).unwrap().records.len(),
            b.len()
        );
        assert_eq!(p.read(0, 10, false).unwrap().records.len(), 0);
        assert_eq!(p.read(0, 10, true).unwrap().records.len(), b.len());
        assert_eq!(p.read(8, 10, true).unwrap().records.len(), 0);
    }
}
