//! The write-ahead log of cluster mode: acknowledged means in the object store.
//!
//! A single broker makes `acks=all` durable with fsync, but a cluster must
//! survive the loss of the whole machine, so there a write is acknowledged
//! only once it is in the store. Writing one object per partition per
//! request would make the request cost grow with partitions; instead every
//! partition this broker leads hands its stamped batches to one `Wal`, which
//! writes them as one object per flush (`--wal-flush-ms`, or sooner when
//! `--wal-max-bytes` are pending), like WarpStream, Bufstream and Redpanda's
//! cloud topics. The PUT rate per broker is then about 1000 / flush-ms,
//! whatever the number of partitions. Sealed segments still go to the store
//! as before; the WAL only covers the head until they do.
//!
//! Under light load a tick writes whatever is pending, so a record waits
//! less than one interval. Under heavy load (more than an eighth of
//! `--wal-max-bytes` pending at a tick) a tick writes the object only once
//! its oldest batch has waited a whole interval: objects then hold one to
//! two intervals of data, and the PUTs per GB written fall, for at most one
//! more interval of latency at loads where queueing in the clients already
//! costs more.
//!
//! Objects are `wal/<node>/<seq:020>.wal`, written create-only. A store PUT
//! takes tens of milliseconds, so one object at a time would cap a broker at
//! one flush per round trip and make every record wait for the PUT before
//! its own. Instead up to `WINDOW` objects are in flight at once, and they
//! are acknowledged in sequence order: object `n` only once `1..n` are all
//! in the store. A flush that finds the window full waits, and what is
//! pending grows meanwhile, so heavy load makes bigger objects, not a queue.
//!
//! That order is what makes fencing work. Whoever takes over the partitions
//! of a broker that may still be alive (a lease that expired under a paused
//! process) fences its log (`fence`):
//!
//! 1. It writes a fence object at the next free sequence number `f`. The old
//!    broker's PUT of `f` or above finds its key taken, and it stops
//!    acknowledging anything, for good.
//! 2. Objects below `f` may still be in flight. The old broker took sequence
//!    number `f - 1` (or it is a fence) only while fewer than `WINDOW` objects
//!    were unacknowledged, so nothing below `f - WINDOW` can still land. The
//!    taker writes a fence into every free slot of `f - WINDOW .. f`: a PUT
//!    still in flight for one of them fails as above.
//! 3. Now nothing can land below `f` any more, and the taker reads what is
//!    there (`objects_between`). Everything the old broker acknowledged is
//!    among it. A slot it plugged held an object that never landed, so the
//!    old broker acknowledged nothing from that object on; the objects above
//!    the plug that did land were never acknowledged either, and a
//!    partition's head ends at its first gap (`tier::takeover`).
//! 4. The old broker may also have had objects in flight above `f`, and
//!    they can still land there. The taker never saw them, and the next
//!    leader's history went on without them, so no later reader may take
//!    them either: every object names the first sequence number of its run,
//!    and a reader drops an object if a fence lies between the two
//!    (`objects_between`). The plugs of step 2 do not count: a plug may fill
//!    a slot whose object was collected, below objects the run did
//!    acknowledge, and the objects above a plug that matter are cut by `f`.
//!
//! A restarting broker fences its own log the same way (`fence_own`), and
//! also plugs the `WINDOW - 1` slots above `f`: its earlier run acknowledged
//! nothing from `f` on, so it took no sequence number past them, and no late
//! PUT of it can land among the new run's objects.
//!
//! A PUT whose answer was lost and that landed after all is told apart from
//! a fence by the writer nonce in the object.
//!
//! A store's latency has a long tail (S3 Standard: a median of tens of
//! milliseconds, a 99th percentile of hundreds), and in-order acknowledgement
//! makes every later object wait for a slow one. So a PUT not answered
//! within `hedge_after` is sent again, and the first answer wins (S3's own
//! advice for latency-sensitive writes). Both are create-only PUTs of the
//! same bytes under the same key: whichever lands first, the other finds
//! the key taken by our nonce, which counts as written, as above; and
//! against a fence both fail. So a hedge is one more attempt of the same
//! object and fencing stays as described.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, PutPayload};
use parking_lot::Mutex;
use tokio::sync::{watch, Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::format::wal::{decode, encode_fence, WalBuilder, WalEntry, WalHeader, WalObject};
use crate::format::FormatError;
use crate::log::{DurableMark, HeadSink, LogError};
use crate::metrics::Timer;

const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(2);
/// Appends are refused (retriably) once this many flushes' worth of bytes
/// wait for the store, instead of growing without bound while it is down.
const MAX_PENDING_FLUSHES: usize = 8;

#[derive(Debug, thiserror::Error)]
pub enum WalError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error(transparent)]
    Format(#[from] FormatError),
}

/// `wal/<node>`.
pub fn node_prefix(node_id: i32) -> Path {
    Path::from_iter(["wal", &node_id.to_string()])
}

fn object_key(node_id: i32, seq: u64) -> Path {
    node_prefix(node_id).child(format!("{seq:020}.wal"))
}

/// Sequence numbers of the objects under `wal/<node>`, ascending.
async fn list_seqs(store: &Arc<dyn ObjectStore>, node_id: i32) -> Result<Vec<u64>, WalError> {
    let objects: Vec<_> = store
        .list(Some(&node_prefix(node_id)))
        .try_collect()
        .await?;
    let mut seqs: Vec<u64> = objects
        .iter()
        .filter_map(|o| o.location.filename()?.strip_suffix(".wal")?.parse().ok())
        .collect();
    seqs.sort_unstable();
    Ok(seqs)
}

/// How many objects a writer may have written but not yet acknowledged:
/// sequence number `n` is taken only once everything below `n - WINDOW + 1`
/// is acknowledged. Takers rely on it (`fence`), so it is the same for every
/// broker, not a setting.
pub const WINDOW: u64 = 8;

#[derive(Default)]
struct Pending {
    builder: WalBuilder,
    /// The mark each partition reaches once this object is written.
    marks: Vec<(DurableMark, i64)>,
    /// When the oldest batch of this object came.
    oldest: Option<Instant>,
}

/// A tick finding more than `max_bytes / HEAVY` pending lets a young object
/// grow (see the module doc).
const HEAVY: usize = 8;

/// How the write-ahead log writes its objects.
#[derive(Debug, Clone)]
pub struct WalSettings {
    /// Pending batches are written every this often (`--wal-flush-ms`)...
    pub flush_every: Duration,
    /// ...or sooner once this many bytes are pending.
    pub max_bytes: usize,
    /// A PUT not answered by then is sent again; `None`: never.
    pub hedge_after: Option<Duration>,
}

impl WalSettings {
    /// No hedged PUTs.
    pub fn new(flush_every: Duration, max_bytes: usize) -> WalSettings {
        WalSettings {
            flush_every,
            max_bytes,
            hedge_after: None,
        }
    }
}

/// One broker's write-ahead log.
pub struct Wal {
    store: Arc<dyn ObjectStore>,
    node_id: i32,
    nonce: u64,
    /// This run's first sequence number.
    since: u64,
    flush_every: Duration,
    max_bytes: usize,
    hedge_after: Option<Duration>,
    pending: Mutex<Pending>,
    /// Bytes taken for objects not yet written.
    in_flight: AtomicU64,
    kick: Notify,
    /// One permit per object written but not yet acknowledged.
    window: Arc<Semaphore>,
    /// Objects written out of order, waiting for the ones below them.
    landed: Mutex<BTreeMap<u64, Landed>>,
    /// Every object below this sequence number is written and acknowledged.
    acked: watch::Sender<u64>,
    /// The entry tables of the objects this run wrote, until the collector
    /// takes them (`take_tables`), which then need not read them back.
    tables: Mutex<Vec<(u64, Vec<WalEntry>)>>,
    fenced: watch::Sender<bool>,
    next_seq: AtomicU64,
    pub stats: WalStats,
}

/// What the WAL reports to `/metrics`.
#[derive(Default)]
pub struct WalStats {
    /// Objects written.
    pub puts: AtomicU64,
    /// PUTs sent again because the first was slow.
    pub hedged: AtomicU64,
    /// Of each object's PUT, retries included.
    pub put_latency: Timer,
    /// From an object's taking to its acknowledgement, which also waits
    /// for every object below it.
    pub ack_latency: Timer,
}

struct Landed {
    marks: Vec<(DurableMark, i64)>,
    taken: Instant,
    _slot: OwnedSemaphorePermit,
}

impl Wal {
    /// Opens this broker's log, continuing after the highest sequence number
    /// in the store (a fence a takeover left included).
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        node_id: i32,
        settings: WalSettings,
    ) -> Result<Arc<Wal>, WalError> {
        let next = list_seqs(&store, node_id)
            .await?
            .last()
            .map_or(1, |s| s + 1);
        Ok(Arc::new(Wal {
            store,
            node_id,
            nonce: rand_nonce(),
            since: next,
            flush_every: settings.flush_every,
            max_bytes: settings.max_bytes.max(1),
            hedge_after: settings.hedge_after,
            pending: Mutex::new(Pending::default()),
            in_flight: AtomicU64::new(0),
            kick: Notify::new(),
            window: Arc::new(Semaphore::new(WINDOW as usize)),
            landed: Mutex::new(BTreeMap::new()),
            acked: watch::Sender::new(next),
            tables: Mutex::new(Vec::new()),
            fenced: watch::Sender::new(false),
            next_seq: AtomicU64::new(next),
            stats: WalStats::default(),
        }))
    }

    /// The sink through which partition `partition` of `topic_id` makes its
    /// appends durable.
    pub fn partition(self: &Arc<Self>, topic_id: Uuid, partition: i32) -> WalPartition {
        WalPartition {
            wal: self.clone(),
            topic_id,
            partition,
        }
    }

    /// The sequence number the next object will be written at: every
    /// object this broker wrote, in this run or earlier ones, lies below it.
    pub fn next_sequence(&self) -> u64 {
        self.next_seq.load(Ordering::Relaxed)
    }

    /// This broker's node id.
    pub fn node_id(&self) -> i32 {
        self.node_id
    }

    /// The entry tables of the objects written since the last call.
    pub fn take_tables(&self) -> Vec<(u64, Vec<WalEntry>)> {
        std::mem::take(&mut *self.tables.lock())
    }

    /// Whether a takeover fenced this broker's log.
    pub fn is_fenced(&self) -> bool {
        *self.fenced.borrow()
    }

    /// Looks for a fence without waiting for the next write to run into it
    /// (after this broker lost its lease, takeovers may have fenced it).
    pub async fn probe(&self) -> Result<bool, WalError> {
        let listed = list_seqs(&self.store, self.node_id).await?;
        // Read after listing: every object of ours in the listing lies below it.
        let next = self.next_seq.load(Ordering::SeqCst);
        if listed.last().is_some_and(|&last| last >= next) {
            self.fenced.send_replace(true);
        }
        Ok(self.is_fenced())
    }

    /// Writes what is pending every flush interval (or sooner when enough
    /// is), up to `WINDOW` objects at a time, until `stop` turns true; then
    /// waits for the objects in flight.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.flush_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut writes = JoinSet::new();
        loop {
            // Biased, so one seed of the simulation always takes one path.
            let ticked = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                Some(_) = writes.join_next(), if !writes.is_empty() => continue,
                _ = tick.tick() => true,
                _ = self.kick.notified() => false,
            };
            if self.is_fenced() {
                break;
            }
            if !self.due(ticked) {
                continue;
            }
            // With the window full the pending object grows meanwhile:
            // heavy load makes bigger objects, not a queue of small ones.
            let slot = tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                slot = self.window.clone().acquire_owned() => slot.expect("never closed"),
            };
            let wal = self.clone();
            writes.spawn(async move { wal.write(slot).await });
        }
        while writes.join_next().await.is_some() {}
    }

    /// Whether the pending batches are to be written now: at a kick (enough
    /// bytes), or at a tick unless the load is heavy and the oldest batch
    /// has not yet waited a whole interval.
    fn due(&self, ticked: bool) -> bool {
        let p = self.pending.lock();
        let Some(oldest) = p.oldest else {
            return false;
        };
        !ticked || p.builder.len() <= self.max_bytes / HEAVY || oldest.elapsed() >= self.flush_every
    }

    /// Writes the pending batches as the next object and waits until every
    /// object taken so far is acknowledged, or the log is fenced.
    pub async fn flush(&self) {
        let slot = self
            .window
            .clone()
            .acquire_owned()
            .await
            .expect("never closed");
        self.write(slot).await;
        let upto = self.next_seq.load(Ordering::SeqCst);
        let (mut acked, mut fenced) = (self.acked.subscribe(), self.fenced.subscribe());
        tokio::select! {
            biased;
            _ = acked.wait_for(|&a| a >= upto) => {}
            _ = fenced.wait_for(|&f| f) => {}
        }
    }

    /// Takes the pending batches as the next object and writes it, retrying
    /// until it is in the store or the log is fenced.
    async fn write(&self, slot: OwnedSemaphorePermit) {
        if self.is_fenced() {
            return;
        }
        let (seq, bytes, marks, len, table) = {
            let mut p = self.pending.lock();
            if p.builder.is_empty() {
                return;
            }
            // Taken under the same lock as the batches: a partition's
            // batches lie in sequence order across objects.
            let seq = self.next_seq.fetch_add(1, Ordering::SeqCst);
            let len = p.builder.len() as u64;
            self.in_flight.fetch_add(len, Ordering::Relaxed);
            let header = WalHeader {
                node_id: self.node_id,
                nonce: self.nonce,
                seq,
                since: Some(self.since),
            };
            let table = p.builder.entries().to_vec();
            p.oldest = None;
            (
                seq,
                p.builder.finish(header),
                std::mem::take(&mut p.marks),
                len,
                table,
            )
        };
        let taken = Instant::now();
        let mut delay = BACKOFF_MIN;
        let outcome = loop {
            if self.is_fenced() {
                break false;
            }
            match self.put(seq, bytes.clone()).await {
                Ok(landed) => break landed,
                Err(e) => {
                    tracing::warn!(seq, error = %e, "writing the WAL object failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(BACKOFF_MAX);
                }
            }
        };
        self.in_flight.fetch_sub(len, Ordering::Relaxed);
        if outcome {
            self.stats.puts.fetch_add(1, Ordering::Relaxed);
            self.stats.put_latency.observe(taken.elapsed());
            self.tables.lock().push((seq, table));
            let landed = Landed {
                marks,
                taken,
                _slot: slot,
            };
            self.land(seq, landed);
            return;
        }
        if !self.fenced.send_replace(true) {
            tracing::error!(
                node = self.node_id,
                seq,
                "this broker's WAL was fenced by a takeover: acknowledging nothing more"
            );
        }
        // Nothing more is written: what waits for a mark learns of the fence.
        *self.pending.lock() = Pending::default();
    }

    /// Records that object `seq` is in the store, and acknowledges, in
    /// sequence order, every object whose predecessors all are.
    fn land(&self, seq: u64, landed: Landed) {
        let mut waiting = self.landed.lock();
        waiting.insert(seq, landed);
        let mut next = *self.acked.borrow();
        while !self.is_fenced() {
            let Some(Landed { marks, taken, .. }) = waiting.remove(&next) else {
                break;
            };
            self.stats.ack_latency.observe(taken.elapsed());
            for (durable, end) in marks {
                durable.send_if_modified(|at| {
                    let advanced = end > *at;
                    *at = (*at).max(end);
                    advanced
                });
            }
            next += 1;
        }
        self.acked
            .send_if_modified(|a| std::mem::replace(a, next) != next);
    }

    /// PUTs object `seq`, hedged: `Ok(true)` once it is ours in the store,
    /// `Ok(false)` when someone else's (a fence) holds the key.
    async fn put(&self, seq: u64, bytes: Bytes) -> Result<bool, WalError> {
        let first = self.put_once(seq, bytes.clone());
        let Some(after) = self.hedge_after else {
            return first.await;
        };
        tokio::pin!(first);
        tokio::select! {
            biased;
            answer = &mut first => return answer,
            _ = tokio::time::sleep(after) => {}
        }
        self.stats.hedged.fetch_add(1, Ordering::Relaxed);
        let second = self.put_once(seq, bytes);
        tokio::pin!(second);
        // The first answer wins; a failure waits for the other one's.
        tokio::select! {
            biased;
            answer = &mut first => match answer {
                Ok(ours) => Ok(ours),
                Err(_) => second.await,
            },
            answer = &mut second => match answer {
                Ok(ours) => Ok(ours),
                Err(_) => first.await,
            },
        }
    }

    async fn put_once(&self, seq: u64, bytes: Bytes) -> Result<bool, WalError> {
        let key = object_key(self.node_id, seq);
        let opts = PutOptions {
            mode: PutMode::Create,
            ..Default::default()
        };
        match self
            .store
            .put_opts(&key, PutPayload::from(bytes), opts)
            .await
        {
            Ok(_) => Ok(true),
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                // Ours if an earlier attempt whose answer was lost landed.
                let there = decode(self.store.get(&key).await?.bytes().await?)?;
                Ok(there.header.nonce == self.nonce && !there.is_fence())
            }
            Err(e) => Err(e.into()),
        }
    }

    fn submit(&self, durable: &DurableMark, entry: Entry<'_>) {
        let mut p = self.pending.lock();
        p.oldest.get_or_insert_with(Instant::now);
        p.builder.push(
            entry.topic_id,
            entry.partition,
            entry.leader_epoch,
            entry.base_offset,
            entry.last_offset,
            entry.header,
            entry.records,
        );
        p.marks.push((durable.clone(), entry.last_offset + 1));
        if p.builder.len() >= self.max_bytes {
            self.kick.notify_one();
        }
    }

    fn check(&self) -> Result<(), LogError> {
        if self.is_fenced() {
            return Err(LogError::Fenced);
        }
        let waiting =
            self.pending.lock().builder.len() as u64 + self.in_flight.load(Ordering::Relaxed);
        if waiting > (self.max_bytes * MAX_PENDING_FLUSHES) as u64 {
            return Err(LogError::Backpressure);
        }
        Ok(())
    }
}

struct Entry<'a> {
    topic_id: Uuid,
    partition: i32,
    leader_epoch: i32,
    base_offset: i64,
    last_offset: i64,
    header: &'a [u8],
    records: &'a [u8],
}

/// One partition's view of the broker's WAL (the log's `HeadSink`).
pub struct WalPartition {
    wal: Arc<Wal>,
    topic_id: Uuid,
    partition: i32,
}

impl HeadSink for WalPartition {
    fn check(&self) -> Result<(), LogError> {
        self.wal.check()
    }

    /// A batch submitted now is taken by a write that draws its sequence
    /// number afterwards, under the same lock.
    fn position(&self) -> u64 {
        self.wal.next_seq.load(Ordering::SeqCst)
    }

    fn submit(
        &self,
        durable: &DurableMark,
        leader_epoch: i32,
        base_offset: i64,
        last_offset: i64,
        header: &[u8],
        records: &[u8],
    ) {
        self.wal.submit(
            durable,
            Entry {
                topic_id: self.topic_id,
                partition: self.partition,
                leader_epoch,
                base_offset,
                last_offset,
                header,
                records,
            },
        );
    }

    fn failed(&self) -> Pin<Box<dyn Future<Output = LogError> + Send + '_>> {
        let mut fenced = self.wal.fenced.subscribe();
        Box::pin(async move {
            // The sender lives as long as the `Wal` this sink holds.
            let _ = fenced.wait_for(|f| *f).await;
            LogError::Fenced
        })
    }
}

/// Fences the WAL of broker `node_id`: writes a fence object at its next
/// free sequence number, and into every free slot of the window below it,
/// so that broker can acknowledge nothing more. Returns the fence's sequence
/// number: every object the broker wrote and may have acknowledged lies
/// below it, and no object of the broker can land there any more.
pub async fn fence(store: &Arc<dyn ObjectStore>, node_id: i32, by: i32) -> Result<u64, WalError> {
    let mut seq = list_seqs(store, node_id).await?.last().map_or(1, |s| s + 1);
    while !put_fence(store, node_id, seq, by, false).await? {
        // The broker wrote that one first: it stays below the fence.
        seq += 1;
    }
    let present = list_seqs(store, node_id).await?;
    for hole in seq.saturating_sub(WINDOW).max(1)..seq {
        if present.binary_search(&hole).is_err() {
            // Landed meanwhile if taken: then it is read with the rest.
            put_fence(store, node_id, hole, by, true).await?;
        }
    }
    Ok(seq)
}

/// Fences a restarting broker's own log as a taker would, and plugs the
/// slots above the fence that its earlier run could still write (module
/// doc), so that [`Wal::open`] starts the new run past them. Returns the
/// fence's sequence number.
pub async fn fence_own(store: &Arc<dyn ObjectStore>, node_id: i32) -> Result<u64, WalError> {
    let seq = fence(store, node_id, node_id).await?;
    for above in seq + 1..seq + WINDOW {
        // Taken: a late object of the earlier run, which the fence cuts off.
        put_fence(store, node_id, above, node_id, true).await?;
    }
    Ok(seq)
}

/// Writes a fence at `seq` unless something is there; true if it was written.
async fn put_fence(
    store: &Arc<dyn ObjectStore>,
    node_id: i32,
    seq: u64,
    by: i32,
    plug: bool,
) -> Result<bool, WalError> {
    let header = WalHeader {
        node_id: by,
        nonce: rand_nonce(),
        seq,
        since: Some(seq),
    };
    let fence = encode_fence(header, plug);
    let opts = PutOptions {
        mode: PutMode::Create,
        ..Default::default()
    };
    match store
        .put_opts(&object_key(node_id, seq), fence.into(), opts)
        .await
    {
        Ok(_) => Ok(true),
        Err(object_store::Error::AlreadyExists { .. })
        | Err(object_store::Error::Precondition { .. }) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Broker `node_id`'s objects from sequence `from` to below `below`, in
/// sequence order, without fences, collected objects, and the objects a
/// fence cut off from the start of their run (module doc, step 4). A few are
/// fetched ahead, and only a bounded number are held at a time however long
/// the log.
///
/// A run's objects above a fence that cuts them lie within `WINDOW` of it
/// (the writer took no sequence number that far past the unacknowledged
/// one the fence took), so the fences that cut objects from `from` on lie
/// in the `WINDOW` slots below it: those are read too, for their fences.
pub async fn objects_between(
    store: &Arc<dyn ObjectStore>,
    node_id: i32,
    from: u64,
    below: u64,
) -> Result<impl Stream<Item = Result<WalObject, WalError>> + use<>, WalError> {
    let mut seqs = list_seqs(store, node_id).await?;
    let first = from.saturating_sub(WINDOW);
    seqs.retain(|&s| first <= s && s < below);
    let store = store.clone();
    let fetches = seqs.into_iter().map(move |seq| {
        let store = store.clone();
        async move {
            match store.get(&object_key(node_id, seq)).await {
                Ok(r) => Ok(Some(decode(r.bytes().await?)?)),
                // Collected: everything in it was in a sealed segment already.
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(WalError::from(e)),
            }
        }
    });
    // Fences are kept by the collector, so every reader sees the same ones.
    let mut fences = BTreeSet::new();
    Ok(futures::stream::iter(fetches)
        .buffered(READ_AHEAD)
        .try_filter_map(move |o| {
            let o = o.filter(|o| {
                if o.cuts_runs() {
                    fences.insert(o.header.seq);
                }
                let cut = |since| fences.range(since..o.header.seq).next().is_some();
                !o.is_fence() && !o.header.since.is_some_and(cut) && o.header.seq >= from
            });
            async move { Ok(o) }
        }))
}

/// Objects fetched ahead by [`objects_between`].
const READ_AHEAD: usize = 16;

/// Every object in the store's write-ahead logs, by node: its sequence
/// numbers, ascending.
pub async fn list_all(store: &Arc<dyn ObjectStore>) -> Result<BTreeMap<i32, Vec<u64>>, WalError> {
    let objects: Vec<_> = store.list(Some(&Path::from("wal"))).try_collect().await?;
    let mut by_node: BTreeMap<i32, Vec<u64>> = BTreeMap::new();
    for o in objects {
        let mut parts = o.location.parts();
        let (Some(_), Some(node), Some(file)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        let node = node.as_ref().parse::<i32>().ok();
        let seq = file
            .as_ref()
            .strip_suffix(".wal")
            .and_then(|s| s.parse::<u64>().ok());
        if let (Some(node), Some(seq)) = (node, seq) {
            by_node.entry(node).or_default().push(seq);
        }
    }
    for seqs in by_node.values_mut() {
        seqs.sort_unstable();
    }
    Ok(by_node)
}

/// The entries of one object (`None` for a fence); `Ok(None)` too when it is gone.
pub async fn entries(
    store: &Arc<dyn ObjectStore>,
    node_id: i32,
    seq: u64,
) -> Result<Option<Vec<crate::format::wal::WalEntry>>, WalError> {
    match store.get(&object_key(node_id, seq)).await {
        Ok(r) => Ok(decode(r.bytes().await?)?.entries),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Deletes object `seq` of node `node_id` (gone already is fine).
pub async fn delete(store: &Arc<dyn ObjectStore>, node_id: i32, seq: u64) -> Result<(), WalError> {
    match store.delete(&object_key(node_id, seq)).await {
        Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

// Tells this writer's objects from another's after an ambiguous put; it
// must differ between brokers and runs (so never a seeded `Random`), and
// nothing depends on its value beyond that.
#[allow(clippy::disallowed_methods)]
fn rand_nonce() -> u64 {
    Uuid::new_v4().as_u64_pair().0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manifest::fault::{Fault, FaultyStore};
    use object_store::memory::InMemory;

    fn store() -> Arc<dyn ObjectStore> {
        Arc::new(InMemory::new())
    }

    /// The batches of partition `partition` of `topic_id` in broker `node_id`'s
    /// objects below sequence `below`, from offset `from` on, in offset order
    /// and without overlaps.
    async fn read_partition(
        store: &Arc<dyn ObjectStore>,
        node_id: i32,
        below: u64,
        topic_id: Uuid,
        partition: i32,
        from: i64,
    ) -> Result<Vec<Bytes>, WalError> {
        let mut by_offset: BTreeMap<i64, (i64, Bytes)> = BTreeMap::new();
        let objects = objects_between(store, node_id, 0, below).await?;
        futures::pin_mut!(objects);
        while let Some(object) = objects.try_next().await? {
            for e in object.entries.iter().flatten() {
                if e.topic_id == topic_id && e.partition == partition && e.last_offset >= from {
                    by_offset.insert(e.base_offset, (e.last_offset, object.batches_of(e)?));
                }
            }
        }
        let mut out = Vec::with_capacity(by_offset.len());
        let mut next = i64::MIN;
        for (base, (last, bytes)) in by_offset {
            if base >= next {
                out.push(bytes);
                next = last + 1;
            }
        }
        Ok(out)
    }

    /// A partition's sink and its durable mark, as `Partition` holds them.
    struct Sink {
        sink: WalPartition,
        durable: DurableMark,
    }

    fn sink(wal: &Arc<Wal>, topic_id: Uuid, partition: i32, end: i64) -> Sink {
        Sink {
            sink: wal.partition(topic_id, partition),
            durable: Arc::new(watch::Sender::new(end)),
        }
    }

    async fn append(s: &Sink, base: i64, last: i64, body: &[u8]) {
        s.sink.check().unwrap();
        s.sink.submit(&s.durable, 0, base, last, b"H", body);
    }

    async fn wait_durable(s: &Sink, end: i64) -> Result<(), LogError> {
        let mut durable = s.durable.subscribe();
        tokio::select! {
            biased;
            _ = durable.wait_for(|d| *d >= end) => Ok(()),
            e = s.sink.failed() => Err(e),
        }
    }

    #[tokio::test]
    async fn a_slow_put_is_sent_again_and_the_first_answer_acknowledges_the_object() {
        let faulty = Arc::new(FaultyStore::new(store()));
        let settings = WalSettings {
            hedge_after: Some(Duration::from_millis(20)),
            ..WalSettings::new(Duration::from_millis(5), 1 << 20)
        };
        let wal = Wal::open(faulty.clone(), 1, settings).await.unwrap();
        let p = sink(&wal, Uuid::from_u128(1), 0, 0);
        append(&p, 0, 0, b"a").await;
        // Both requests wait in the store until it answers again; the first
        // answer acknowledges the object.
        faulty.set(Fault::Stall);
        let flushing = tokio::spawn({
            let wal = wal.clone();
            async move { wal.flush().await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(wal.stats.hedged.load(Ordering::Relaxed), 1);
        faulty.set(Fault::None);
        flushing.await.unwrap();
        assert!(!wal.is_fenced());
        wait_durable(&p, 1).await.unwrap();
        assert_eq!(wal.stats.puts.load(Ordering::Relaxed), 1);
        let store: Arc<dyn ObjectStore> = faulty;
        let got = read_partition(&store, 1, u64::MAX, Uuid::from_u128(1), 0, 0);
        assert_eq!(got.await.unwrap(), vec![Bytes::from_static(b"Ha")]);
    }

    #[tokio::test(start_paused = true)]
    async fn under_heavy_load_a_tick_lets_a_young_object_grow() {
        let settings = WalSettings::new(Duration::from_millis(50), 8000);
        let wal = Wal::open(store(), 1, settings).await.unwrap();
        let (stop, stopped) = watch::channel(false);
        let running = tokio::spawn(wal.clone().run(stopped));
        let p = sink(&wal, Uuid::from_u128(1), 0, 0);
        let puts = || wal.stats.puts.load(Ordering::Relaxed);
        // Ticks at 0, 50, 100, ... ms. Light load: a small batch that came
        // 10 ms before a tick is written at that tick.
        tokio::time::sleep(Duration::from_millis(90)).await;
        append(&p, 0, 0, &[1; 100]).await;
        tokio::time::sleep(Duration::from_millis(15)).await;
        assert_eq!(puts(), 1);
        // Heavy: more than an eighth of max_bytes, 10 ms before the tick at
        // 150 ms, waits for the tick at 200.
        tokio::time::sleep(Duration::from_millis(35)).await;
        append(&p, 1, 1, &[2; 2000]).await;
        tokio::time::sleep(Duration::from_millis(15)).await;
        assert_eq!(puts(), 1);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(puts(), 2);
        wait_durable(&p, 2).await.unwrap();
        stop.send_replace(true);
        running.await.unwrap();
    }

    #[tokio::test]
    async fn acknowledges_once_the_object_is_written_and_reads_back_per_partition() {
        let store = store();
        let wal = Wal::open(
            store.clone(),
            1,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let (a, b) = (Uuid::from_u128(1), Uuid::from_u128(2));
        let pa = sink(&wal, a, 0, 0);
        let pb = sink(&wal, b, 3, 100);
        append(&pa, 0, 1, b"a0").await;
        append(&pb, 100, 100, b"b0").await;
        append(&pa, 2, 2, b"a1").await;
        let waiting = wait_durable(&pa, 3);
        wal.flush().await;
        waiting.await.unwrap();
        wait_durable(&pb, 101).await.unwrap();
        assert_eq!(
            wal.stats.puts.load(Ordering::Relaxed),
            1,
            "one object for both partitions"
        );
        let got = read_partition(&store, 1, u64::MAX, a, 0, 0).await.unwrap();
        assert_eq!(
            got,
            vec![Bytes::from_static(b"Ha0"), Bytes::from_static(b"Ha1")]
        );
        let got = read_partition(&store, 1, u64::MAX, b, 3, 100)
            .await
            .unwrap();
        assert_eq!(got, vec![Bytes::from_static(b"Hb0")]);
        assert!(read_partition(&store, 1, u64::MAX, a, 0, 3)
            .await
            .unwrap()
            .is_empty());
    }

    #[tokio::test]
    async fn a_fenced_writer_acknowledges_nothing_more_and_a_reopened_one_goes_on() {
        let store = store();
        let wal = Wal::open(
            store.clone(),
            7,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let p = sink(&wal, Uuid::from_u128(1), 0, 0);
        append(&p, 0, 0, b"kept").await;
        wal.flush().await;
        wait_durable(&p, 1).await.unwrap();
        let fence_seq = fence(&store, 7, 2).await.unwrap();
        assert_eq!(fence_seq, 2);
        append(&p, 1, 1, b"lost").await;
        let waiting = wait_durable(&p, 2);
        wal.flush().await;
        assert!(matches!(waiting.await, Err(LogError::Fenced)));
        assert!(matches!(p.sink.check(), Err(LogError::Fenced)));
        // Below the fence is exactly what was acknowledged.
        let below = read_partition(&store, 7, fence_seq, Uuid::from_u128(1), 0, 0)
            .await
            .unwrap();
        assert_eq!(below, vec![Bytes::from_static(b"Hkept")]);
        // A new run of the broker starts after the fence.
        let again = Wal::open(
            store.clone(),
            7,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let p = sink(&again, Uuid::from_u128(1), 0, 1);
        append(&p, 1, 1, b"new").await;
        again.flush().await;
        wait_durable(&p, 2).await.unwrap();
        assert_eq!(list_seqs(&store, 7).await.unwrap(), vec![1, 2, 3]);
    }

    #[tokio::test]
    async fn objects_are_acknowledged_in_sequence_order_whatever_order_they_land_in() {
        let wal = Wal::open(
            store(),
            1,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let (first, second): (DurableMark, DurableMark) = (
            Arc::new(watch::Sender::new(0)),
            Arc::new(watch::Sender::new(0)),
        );
        let slot = || wal.window.clone().try_acquire_owned().unwrap();
        let (slot1, slot2) = (slot(), slot());
        wal.land(
            2,
            Landed {
                marks: vec![(second.clone(), 10)],
                taken: Instant::now(),
                _slot: slot2,
            },
        );
        assert_eq!(*second.borrow(), 0, "object 1 is not in the store yet");
        assert_eq!(*wal.acked.borrow(), 1);
        wal.land(
            1,
            Landed {
                marks: vec![(first.clone(), 5)],
                taken: Instant::now(),
                _slot: slot1,
            },
        );
        assert_eq!((*first.borrow(), *second.borrow()), (5, 10));
        assert_eq!(*wal.acked.borrow(), 3);
        assert_eq!(wal.window.available_permits(), WINDOW as usize);
    }

    #[tokio::test]
    async fn a_taker_plugs_the_slots_of_objects_still_in_flight() {
        let store = store();
        let wal = Wal::open(
            store.clone(),
            7,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let object = |seq| {
            let mut b = WalBuilder::default();
            b.push(Uuid::from_u128(1), 0, 0, seq as i64, seq as i64, b"H", b"x");
            b.finish(WalHeader {
                node_id: 7,
                nonce: wal.nonce,
                seq,
                since: Some(wal.since),
            })
        };
        // Objects 1 and 12 landed; 2..=11 were in flight (only 5..=11 can
        // be, with 12 taken while fewer than WINDOW were unacknowledged).
        assert!(wal.put(1, object(1)).await.unwrap());
        assert!(wal.put(12, object(12)).await.unwrap());
        assert_eq!(fence(&store, 7, 2).await.unwrap(), 13);
        let mut expected = vec![1];
        expected.extend(12 - WINDOW + 1..=13);
        assert_eq!(list_seqs(&store, 7).await.unwrap(), expected);
        assert!(!wal.put(9, object(9)).await.unwrap(), "a plug is not ours");
        assert!(!wal.put(13, object(13)).await.unwrap(), "nor the fence");
    }

    /// One single-entry object of `wal`'s run at `seq`.
    fn object_of(wal: &Wal, seq: u64) -> Bytes {
        let mut b = WalBuilder::default();
        b.push(Uuid::from_u128(1), 0, 0, 0, 0, b"H", b"x");
        b.finish(WalHeader {
            node_id: 7,
            nonce: wal.nonce,
            seq,
            since: Some(wal.since),
        })
    }

    async fn seqs_read(store: &Arc<dyn ObjectStore>) -> Vec<u64> {
        seqs_read_from(store, 0).await
    }

    async fn seqs_read_from(store: &Arc<dyn ObjectStore>, from: u64) -> Vec<u64> {
        objects_between(store, 7, from, u64::MAX)
            .await
            .unwrap()
            .map_ok(|o| o.header.seq)
            .try_collect()
            .await
            .unwrap()
    }

    /// Node 7's first run writes object 1; a taker fences at 2 while the
    /// run has 2..=4 in flight, and 3 lands afterwards, above the fence.
    /// Then the broker restarts (`fence_own`) and opens its second run.
    async fn a_run_cut_off_by_a_fence(store: &Arc<dyn ObjectStore>) -> (Arc<Wal>, Arc<Wal>) {
        let settings = WalSettings::new(Duration::from_millis(5), 1 << 20);
        let first = Wal::open(store.clone(), 7, settings.clone()).await.unwrap();
        assert!(first.put(1, object_of(&first, 1)).await.unwrap());
        assert_eq!(fence(store, 7, 2).await.unwrap(), 2);
        assert!(first.put(3, object_of(&first, 3)).await.unwrap());
        assert_eq!(fence_own(store, 7).await.unwrap(), 4);
        let second = Wal::open(store.clone(), 7, settings).await.unwrap();
        (first, second)
    }

    #[tokio::test]
    async fn objects_of_a_run_a_fence_cut_off_are_not_read_even_when_they_land_above_it() {
        let store = store();
        let (first, second) = a_run_cut_off_by_a_fence(&store).await;
        // The new run starts past every slot the old one may still write,
        // and a late PUT of the old run finds a plug.
        assert_eq!(second.next_sequence(), 4 + WINDOW);
        assert!(!first.put(5, object_of(&first, 5)).await.unwrap());
        assert!(second.put(12, object_of(&second, 12)).await.unwrap());
        assert_eq!(seqs_read(&store).await, vec![1, 12]);
    }

    #[tokio::test]
    async fn reading_from_a_floor_still_drops_what_a_fence_below_it_cut_off() {
        let store = store();
        let (_, second) = a_run_cut_off_by_a_fence(&store).await;
        assert!(second.put(12, object_of(&second, 12)).await.unwrap());
        // Object 3 lies past a floor of 3, and the fence at 2 that cuts it
        // off lies below the floor: it is dropped all the same.
        for (from, read) in [
            (0, vec![1, 12]),
            (3, vec![12]),
            (12, vec![12]),
            (13, vec![]),
        ] {
            assert_eq!(seqs_read_from(&store, from).await, read, "from {from}");
        }
    }

    #[tokio::test]
    async fn a_plug_in_a_collected_slot_cuts_off_nothing() {
        let store = store();
        let settings = WalSettings::new(Duration::from_millis(5), 1 << 20);
        let wal = Wal::open(store.clone(), 7, settings).await.unwrap();
        for seq in 1..=3 {
            assert!(wal.put(seq, object_of(&wal, seq)).await.unwrap());
        }
        delete(&store, 7, 2).await.unwrap();
        // The taker plugs slot 2, below objects the run acknowledged.
        assert_eq!(fence(&store, 7, 2).await.unwrap(), 4);
        assert_eq!(seqs_read(&store).await, vec![1, 3]);
    }

    #[tokio::test]
    async fn a_put_that_landed_but_looked_failed_counts_as_written() {
        let store = store();
        let wal = Wal::open(
            store.clone(),
            1,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let mut builder = WalBuilder::default();
        builder.push(Uuid::from_u128(1), 0, 0, 0, 0, b"H", b"x");
        let header = WalHeader {
            node_id: 1,
            nonce: wal.nonce,
            seq: 1,
            since: Some(wal.since),
        };
        let bytes = builder.finish(header);
        assert!(wal.put(1, bytes.clone()).await.unwrap());
        assert!(wal.put(1, bytes).await.unwrap(), "its own earlier write");
        fence(&store, 1, 9).await.unwrap();
        let other = Bytes::from_static(b"irrelevant");
        assert!(!wal.put(2, other).await.unwrap(), "a fence is not ours");
    }

    #[tokio::test]
    async fn overlapping_entries_read_back_once() {
        let store = store();
        let wal = Wal::open(
            store.clone(),
            1,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let id = Uuid::from_u128(5);
        let p = sink(&wal, id, 0, 0);
        append(&p, 0, 4, b"first").await;
        wal.flush().await;
        append(&p, 5, 9, b"second").await;
        wal.flush().await;
        let got = read_partition(&store, 1, u64::MAX, id, 0, 3).await.unwrap();
        assert_eq!(
            got,
            vec![
                Bytes::from_static(b"Hfirst"),
                Bytes::from_static(b"Hsecond")
            ]
        );
    }
}
