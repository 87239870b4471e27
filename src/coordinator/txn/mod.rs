//! The transaction coordinator: for every `transactional.id`, its producer
//! id and epoch and its open transaction, kept in Kafka's state machine
//! (`state`), stored in `__transaction_state` (`store`, `records`).
//!
//! A change is decided under one lock by the pure rules of `state`, marked
//! pending (other requests for that id are told CONCURRENT_TRANSACTIONS),
//! appended, and applied only once durable, so nothing is acknowledged that a
//! crash could forget. EndTxn is answered once PrepareCommit/PrepareAbort is
//! durable; the COMMIT/ABORT markers are then written to every partition of
//! the transaction by whoever drains `marker_jobs` (the API layer, which owns
//! the WriteTxnMarkers handler and the inter-broker client), and only after
//! all of them does the coordinator write Complete*. A coordinator that
//! starts, or takes `__transaction_state` over, finds the Prepare* records of
//! transactions whose markers may be missing and sends them again: markers
//! are idempotent at the partition, a missing one is not.
//!
//! Complete* is the one change applied as soon as it is appended, without
//! waiting for its fsync: a producer that commits and begins again at once
//! waits for it, and it would cost every transaction one more fsync in a
//! row. Nothing acknowledged rests on it alone. Losing it in a crash leaves
//! the durable Prepare*, whose markers are resent (harmless: they are
//! already durable, and no later transaction of that producer can have
//! written to its partitions, see below) before Complete* is written again.
//! EndTxn was answered on the Prepare*, and a retried EndTxn's answer
//! (committed, or aborted) holds in either state. Every answer that moves
//! on from the completed state writes a record of its own after it in the
//! same log (the next transaction's AddPartitionsToTxn, InitProducerId,
//! expiry) and waits for that record, which makes the Complete* before it
//! durable too.

pub(crate) mod records;
pub(crate) mod state;
pub(crate) mod store;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::{mpsc, Notify};

use crate::clock::SharedClock;
use state::{EndStep, InitStep, TxnError, TxnMetadata, TxnState};
use store::TxnStore;

/// Draws a new producer id (the catalog's allocator, or etcd's blocks).
pub(crate) type ProducerIdSource =
    Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Result<i64, String>> + Send>> + Send + Sync>;

/// Kafka's transaction.* broker settings.
#[derive(Debug, Clone)]
pub struct TxnConfig {
    /// transaction.max.timeout.ms
    pub max_timeout_ms: i32,
    /// transactional.id.expiration.ms
    pub id_expiration_ms: i64,
    /// segment.bytes of `__transaction_state` when created.
    pub segment_bytes: i32,
    pub wait_for_fsync: bool,
}

impl Default for TxnConfig {
    fn default() -> Self {
        TxnConfig {
            max_timeout_ms: 900_000,
            id_expiration_ms: 604_800_000,
            segment_bytes: 100 << 20,
            wait_for_fsync: true,
        }
    }
}

/// The markers one finished transaction needs: written to every partition,
/// then `TxnCoordinator::complete_markers` closes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MarkerJob {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub commit: bool,
    pub coordinator_epoch: i32,
    pub partitions: Vec<(String, i32)>,
    /// Transactions v2: the markers carry an epoch above the data's, and a
    /// partition refuses one at the epoch it knows (WriteTxnMarkers v2).
    pub bumped: bool,
}

/// One transaction as DescribeTransactions and ListTransactions show it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnDescription {
    pub transactional_id: String,
    pub producer_id: i64,
    pub producer_epoch: i16,
    pub state: TxnState,
    pub timeout_ms: i32,
    pub start_ms: i64,
    pub partitions: Vec<(String, Vec<i32>)>,
}

/// Is this broker the coordinator, and at which epoch of `__transaction_state`'s partition?
pub(crate) type Leadership = Arc<dyn Fn() -> Option<i32> + Send + Sync>;

pub(crate) struct TxnCoordinator {
    store: TxnStore,
    txns: Mutex<HashMap<String, TxnMetadata>>,
    config: TxnConfig,
    clock: SharedClock,
    ids: ProducerIdSource,
    jobs: mpsc::UnboundedSender<MarkerJob>,
    jobs_rx: Mutex<Option<mpsc::UnboundedReceiver<MarkerJob>>>,
    leadership: Option<Leadership>,
    loading: AtomicBool,
    /// Woken whenever a pending change is applied or dropped.
    settled: Notify,
}

/// How long AddPartitionsToTxn / AddOffsetsToTxn wait for the previous
/// transaction's markers before answering CONCURRENT_TRANSACTIONS. A producer
/// that commits and at once begins the next transaction arrives while the
/// markers are still being written; told to retry, clients back off for up
/// to 100 ms, which would cap a producer at a few commits a second.
const CONCURRENT_WAIT: std::time::Duration = std::time::Duration::from_millis(1000);

impl TxnCoordinator {
    /// Replays `__transaction_state` and queues the markers of every
    /// transaction found prepared but not complete. In cluster mode
    /// `leadership` says whether this broker leads the topic's partition;
    /// one that does not yet loads it when it takes the partition over.
    pub(crate) async fn open(
        store: TxnStore,
        config: TxnConfig,
        clock: SharedClock,
        ids: ProducerIdSource,
        leadership: Option<Leadership>,
    ) -> Result<TxnCoordinator, TxnError> {
        let (jobs, rx) = mpsc::unbounded_channel();
        let c = TxnCoordinator {
            store,
            txns: Mutex::new(HashMap::new()),
            config,
            clock,
            ids,
            jobs,
            jobs_rx: Mutex::new(Some(rx)),
            leadership,
            loading: AtomicBool::new(false),
            settled: Notify::new(),
        };
        if c.is_coordinator() {
            c.reload().await?;
        }
        Ok(c)
    }

    /// The marker jobs, for the one task that sends them (taken once).
    pub(crate) fn marker_jobs(&self) -> Option<mpsc::UnboundedReceiver<MarkerJob>> {
        self.jobs_rx.lock().take()
    }

    /// Cluster mode: the coordinator answers only while this broker leads
    /// `__transaction_state` (set once).
    fn coordinator_epoch(&self) -> Result<i32, TxnError> {
        if self.loading.load(Ordering::Acquire) {
            return Err(TxnError::LoadInProgress);
        }
        match self.leadership.as_ref() {
            None => Ok(0),
            Some(l) => l().ok_or(TxnError::NotCoordinator),
        }
    }

    /// Whether this broker coordinates transactions now.
    pub(crate) fn is_coordinator(&self) -> bool {
        self.leadership.as_ref().is_none_or(|l| l().is_some())
    }

    /// Reads every transactional id from the topic again (startup, and in
    /// cluster mode after taking its partition over), then resends the
    /// markers of prepared transactions.
    pub(crate) async fn reload(&self) -> Result<(), TxnError> {
        self.loading.store(true, Ordering::Release);
        let mut loaded: HashMap<String, TxnMetadata> = HashMap::new();
        let replayed = self
            .store
            .replay(|key, value| {
                let id = match records::decode_key(&key) {
                    Ok(id) => id,
                    Err(e) => {
                        tracing::warn!(error = %e, "skipping unreadable transaction key");
                        return;
                    }
                };
                match value.map(|v| records::decode_value(&v)) {
                    None => {
                        loaded.remove(&id);
                    }
                    Some(Ok(m)) => {
                        loaded.insert(id, m);
                    }
                    Some(Err(e)) => {
                        tracing::warn!(error = %e, id, "skipping unreadable transaction record")
                    }
                }
            })
            .await;
        if let Err(e) = replayed {
            self.loading.store(false, Ordering::Release);
            return Err(TxnError::Storage(e.to_string()));
        }
        let epoch = self.leadership.as_ref().and_then(|l| l()).unwrap_or(0);
        let prepared: Vec<MarkerJob> = loaded
            .iter()
            .filter(|(_, m)| matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort))
            .map(|(id, m)| job(id, m, epoch))
            .collect();
        tracing::info!(
            transactional_ids = loaded.len(),
            prepared = prepared.len(),
            "transaction coordinator loaded"
        );
        *self.txns.lock() = loaded;
        self.loading.store(false, Ordering::Release);
        for j in prepared {
            let _ = self.jobs.send(j);
        }
        Ok(())
    }

    /// Writes `next` for `id`, marked `pending` meanwhile, and applies it
    /// once durable. Called with the lock released.
    async fn persist(
        &self,
        id: &str,
        next: TxnMetadata,
        pending: TxnState,
    ) -> Result<(), TxnError> {
        let (end, inserted) = {
            let mut txns = self.txns.lock();
            let value = (next.state != TxnState::Dead).then(|| records::encode_value(&next));
            let end = self
                .store
                .append(records::encode_key(id), value)
                .map_err(|e| TxnError::Storage(e.to_string()))?;
            let inserted = match txns.get_mut(id) {
                Some(m) => {
                    m.pending = Some(pending);
                    false
                }
                None => {
                    let mut placeholder = next.clone();
                    placeholder.pending = Some(pending);
                    txns.insert(id.to_string(), placeholder);
                    true
                }
            };
            (end, inserted)
        };
        let durable = self.store.durable(end).await;
        let mut txns = self.txns.lock();
        self.settled.notify_waiters();
        match durable {
            Ok(()) if next.state == TxnState::Dead => {
                txns.remove(id);
                Ok(())
            }
            Ok(()) => {
                txns.insert(
                    id.to_string(),
                    TxnMetadata {
                        pending: None,
                        ..next
                    },
                );
                Ok(())
            }
            Err(e) => {
                // Not durable: the change did not happen. A placeholder for a
                // new id goes; an existing id keeps its previous state.
                if inserted {
                    txns.remove(id);
                } else if let Some(m) = txns.get_mut(id) {
                    m.pending = None;
                }
                Err(TxnError::Storage(e.to_string()))
            }
        }
    }

    /// InitProducerId with a transactional id: the producer id and epoch to
    /// use, or CONCURRENT_TRANSACTIONS while the previous producer's open
    /// transaction is being aborted.
    pub(crate) async fn init_producer_id(
        &self,
        id: &str,
        timeout_ms: i32,
        expected: Option<(i64, i16)>,
    ) -> Result<(i64, i16), TxnError> {
        let max = self.config.max_timeout_ms;
        let (step, epoch) = self
            .decide(
                id,
                |m, fresh, now| state::init(m, timeout_ms, max, expected, fresh, now),
                |s| matches!(s, InitStep::NeedProducerId),
            )
            .await?;
        match step {
            InitStep::NeedProducerId => unreachable!("drawn by decide"),
            InitStep::Answer(pid, e) => Ok((pid, e)),
            InitStep::Write(next) => {
                let answer = (next.producer_id, next.producer_epoch);
                self.persist(id, next, TxnState::Empty).await?;
                Ok(answer)
            }
            InitStep::AbortFirst(next) => {
                let j = job(id, &next, epoch);
                self.persist(id, next, TxnState::PrepareEpochFence).await?;
                tracing::info!(
                    transactional_id = id,
                    "fencing the previous producer: aborting its transaction"
                );
                let _ = self.jobs.send(j);
                Err(TxnError::ConcurrentTransactions)
            }
        }
    }

    /// `id`'s next step by the rule `decide` (given the metadata, a fresh
    /// producer id if one was drawn, and the time), decided under the lock,
    /// with the coordinator epoch it was decided at. When the rule asks for
    /// a producer id (`needs_id`), one is drawn and the rule asked again.
    async fn decide<S>(
        &self,
        id: &str,
        decide: impl Fn(Option<&TxnMetadata>, Option<i64>, i64) -> Result<S, TxnError>,
        needs_id: impl Fn(&S) -> bool,
    ) -> Result<(S, i32), TxnError> {
        let mut fresh = None;
        loop {
            let (step, epoch) = {
                let txns = self.txns.lock();
                let epoch = self.coordinator_epoch()?;
                (decide(txns.get(id), fresh, self.clock.now_ms())?, epoch)
            };
            if !needs_id(&step) {
                return Ok((step, epoch));
            }
            fresh = Some((self.ids)().await.map_err(TxnError::NoProducerId)?);
        }
    }

    /// AddPartitionsToTxn / AddOffsetsToTxn, or under transactions v2
    /// (`version` 2) a Produce or TxnOffsetCommit: adds partitions to the
    /// open transaction (starting it), durably. While the previous
    /// transaction is still being completed this waits for it, up to
    /// `CONCURRENT_WAIT`.
    pub(crate) async fn add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[(String, i32)],
        version: i16,
    ) -> Result<(), TxnError> {
        let deadline = tokio::time::Instant::now() + CONCURRENT_WAIT;
        loop {
            // Registered before the state is read, so no change is missed.
            let settled = self.settled.notified();
            tokio::pin!(settled);
            settled.as_mut().enable();
            match self
                .try_add_partitions(id, producer_id, producer_epoch, partitions, version)
                .await
            {
                Err(TxnError::ConcurrentTransactions) if tokio::time::Instant::now() < deadline => {
                    let _ = tokio::time::timeout_at(deadline, settled).await;
                }
                result => return result,
            }
        }
    }

    async fn try_add_partitions(
        &self,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partitions: &[(String, i32)],
        version: i16,
    ) -> Result<(), TxnError> {
        let next = {
            let txns = self.txns.lock();
            self.coordinator_epoch()?;
            state::add_partitions(
                txns.get(id),
                producer_id,
                producer_epoch,
                partitions,
                version,
                self.clock.now_ms(),
            )?
        };
        match next {
            None => Ok(()),
            Some(next) => self.persist(id, next, TxnState::Ongoing).await,
        }
    }

    /// AddPartitionsToTxn v4+ with verify_only: is the partition in the
    /// producer's ongoing transaction?
    pub(crate) fn verify_partition(
        &self,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partition: &(String, i32),
    ) -> Result<(), TxnError> {
        let txns = self.txns.lock();
        self.coordinator_epoch()?;
        state::verify_partition(txns.get(id), producer_id, producer_epoch, partition)
    }

    /// Whether a TxnOffsetCommit may go ahead: the producer owns the id and
    /// its transaction includes `partition` (the group's offsets partition).
    pub(crate) fn check_offsets_partition(
        &self,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        partition: &(String, i32),
    ) -> Result<(), TxnError> {
        self.verify_partition(id, producer_id, producer_epoch, partition)
    }

    /// EndTxn: answered once Prepare* is durable; the markers follow.
    /// `version` 2 (EndTxn v5) bumps the epoch; the answer is the producer
    /// id and epoch for the producer's next transaction.
    pub(crate) async fn end_txn(
        &self,
        id: &str,
        producer_id: i64,
        producer_epoch: i16,
        commit: bool,
        version: i16,
    ) -> Result<(i64, i16), TxnError> {
        let (step, epoch) = self
            .decide(
                id,
                |m, fresh, now| {
                    state::end(m, producer_id, producer_epoch, commit, version, fresh, now)
                },
                |s| matches!(s, EndStep::NeedProducerId),
            )
            .await?;
        match step {
            EndStep::NeedProducerId => unreachable!("drawn by decide"),
            EndStep::AlreadyDone(pid, e) => Ok((pid, e)),
            EndStep::Write(next) => {
                let j = job(id, &next, epoch);
                let pending = next.state;
                let answer = state::next_producer(&next);
                self.persist(id, next, pending).await?;
                let _ = self.jobs.send(j);
                Ok(answer)
            }
        }
    }

    /// Every marker of `job` is written: the transaction is complete.
    /// Applied once appended, without waiting for it to be durable (see the
    /// module docs), so that the producer's next transaction can start.
    pub(crate) fn complete_markers(&self, job: &MarkerJob) -> Result<(), TxnError> {
        let mut txns = self.txns.lock();
        self.coordinator_epoch()?;
        let Some(next) = state::complete(
            txns.get(&job.transactional_id),
            job.producer_id,
            job.producer_epoch,
            self.clock.now_ms(),
        ) else {
            return Ok(());
        };
        self.store
            .append(
                records::encode_key(&job.transactional_id),
                Some(records::encode_value(&next)),
            )
            .map_err(|e| TxnError::Storage(e.to_string()))?;
        txns.insert(job.transactional_id.clone(), next);
        self.settled.notify_waiters();
        Ok(())
    }

    /// Whether the markers of `job` are still wanted: the coordinator still
    /// holds that transaction prepared (a new coordinator may have finished it).
    pub(crate) fn wants_markers(&self, job: &MarkerJob) -> bool {
        self.is_coordinator()
            && self
                .txns
                .lock()
                .get(&job.transactional_id)
                .is_some_and(|m| {
                    (m.producer_id, m.producer_epoch) == (job.producer_id, job.producer_epoch)
                        && matches!(m.state, TxnState::PrepareCommit | TxnState::PrepareAbort)
                })
    }

    /// Aborts transactions open longer than their timeout and forgets ids
    /// idle past `transactional.id.expiration.ms`. Returns how many of each.
    pub(crate) async fn tick(&self) -> (usize, usize) {
        if self.coordinator_epoch().is_err() {
            return (0, 0);
        }
        let now = self.clock.now_ms();
        let (timed_out, expired): (Vec<String>, Vec<String>) = {
            let txns = self.txns.lock();
            let timed_out = txns
                .iter()
                .filter(|(_, m)| state::timed_out(m, now).is_some())
                .map(|(id, _)| id.clone())
                .collect();
            let expired = txns
                .iter()
                .filter(|(_, m)| state::expired(m, now, self.config.id_expiration_ms))
                .map(|(id, _)| id.clone())
                .collect();
            (timed_out, expired)
        };
        let mut aborted = 0;
        for id in &timed_out {
            let prepared = {
                let txns = self.txns.lock();
                let Ok(epoch) = self.coordinator_epoch() else {
                    break;
                };
                txns.get(id)
                    .and_then(|m| state::timed_out(m, now))
                    .map(|next| (job(id, &next, epoch), next))
            };
            let Some((j, next)) = prepared else { continue };
            match self.persist(id, next, TxnState::PrepareEpochFence).await {
                Ok(()) => {
                    tracing::info!(transactional_id = %id, "aborting a transaction past its timeout");
                    aborted += 1;
                    let _ = self.jobs.send(j);
                }
                Err(e) => {
                    tracing::warn!(transactional_id = %id, error = %e, "could not abort a timed-out transaction")
                }
            }
        }
        let mut gone = 0;
        for id in &expired {
            let dead = {
                let txns = self.txns.lock();
                txns.get(id)
                    .filter(|m| state::expired(m, now, self.config.id_expiration_ms))
                    .map(|m| TxnMetadata {
                        state: TxnState::Dead,
                        ..m.clone()
                    })
            };
            let Some(dead) = dead else { continue };
            match self.persist(id, dead, TxnState::Dead).await {
                Ok(()) => gone += 1,
                Err(e) => {
                    tracing::warn!(transactional_id = %id, error = %e, "could not expire a transactional id")
                }
            }
        }
        (aborted, gone)
    }

    /// DescribeTransactions for one id.
    pub(crate) fn describe(&self, id: &str) -> Result<TxnDescription, TxnError> {
        let txns = self.txns.lock();
        self.coordinator_epoch()?;
        let m = txns
            .get(id)
            .filter(|m| m.state != TxnState::Dead)
            .ok_or(TxnError::TransactionalIdNotFound)?;
        Ok(describe(id, m))
    }

    /// ListTransactions: every id, filtered by the caller.
    pub(crate) fn list(&self) -> Result<Vec<TxnDescription>, TxnError> {
        let txns = self.txns.lock();
        self.coordinator_epoch()?;
        let mut out: Vec<TxnDescription> = txns
            .iter()
            .filter(|(_, m)| m.state != TxnState::Dead)
            .map(|(id, m)| describe(id, m))
            .collect();
        out.sort_by(|a, b| a.transactional_id.cmp(&b.transactional_id));
        Ok(out)
    }
}

fn describe(id: &str, m: &TxnMetadata) -> TxnDescription {
    TxnDescription {
        transactional_id: id.to_string(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        state: m.visible_state(),
        timeout_ms: m.timeout_ms,
        start_ms: m.start_ms,
        partitions: m.partitions_by_topic(),
    }
}

fn job(id: &str, m: &TxnMetadata, coordinator_epoch: i32) -> MarkerJob {
    MarkerJob {
        transactional_id: id.to_string(),
        producer_id: m.producer_id,
        producer_epoch: m.producer_epoch,
        commit: m.state == TxnState::PrepareCommit,
        coordinator_epoch,
        partitions: m.partitions.iter().cloned().collect(),
        bumped: m.transaction_version >= 2,
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::catalog::Catalog;
    use crate::clock::ManualClock;

    fn ids() -> ProducerIdSource {
        let next = Arc::new(std::sync::atomic::AtomicI64::new(1000));
        Arc::new(move || {
            let id = next.fetch_add(1, Ordering::Relaxed);
            Box::pin(async move { Ok(id) })
        })
    }

    fn config() -> TxnConfig {
        TxnConfig {
            max_timeout_ms: 900_000,
            id_expiration_ms: 3_600_000,
            segment_bytes: 1 << 20,
            wait_for_fsync: true,
        }
    }

    /// A coordinator over `dir` (fresh or not), living by `clock`, and its marker jobs.
    async fn open(
        dir: &std::path::Path,
        clock: Arc<ManualClock>,
    ) -> (TxnCoordinator, mpsc::UnboundedReceiver<MarkerJob>) {
        let catalog = Catalog::open(dir, Default::default()).unwrap();
        let store = TxnStore::open(&catalog, 1 << 20, true, clock.clone()).unwrap();
        let c = TxnCoordinator::open(store, config(), clock, ids(), None)
            .await
            .unwrap();
        let jobs = c.marker_jobs().unwrap();
        (c, jobs)
    }

    fn tp(t: &str, p: i32) -> (String, i32) {
        (t.to_string(), p)
    }

    #[tokio::test]
    async fn a_committed_transaction_is_prepared_marked_completed_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, mut jobs) = open(dir.path(), clock.clone()).await;
        let (pid, epoch) = c.init_producer_id("tx", 60_000, None).await.unwrap();
        assert_eq!((pid, epoch), (1000, 0));
        c.add_partitions("tx", pid, epoch, &[tp("a", 0), tp("b", 1)], 0)
            .await
            .unwrap();
        assert_eq!(c.describe("tx").unwrap().state, TxnState::Ongoing);
        c.end_txn("tx", pid, epoch, true, 0).await.unwrap();
        let job = jobs.try_recv().unwrap();
        assert_eq!(
            job,
            MarkerJob {
                transactional_id: "tx".into(),
                producer_id: pid,
                producer_epoch: epoch,
                commit: true,
                coordinator_epoch: 0,
                partitions: vec![tp("a", 0), tp("b", 1)],
                bumped: false,
            }
        );
        assert!(c.wants_markers(&job));
        assert_eq!(c.describe("tx").unwrap().state, TxnState::PrepareCommit);
        c.complete_markers(&job).unwrap();
        assert!(!c.wants_markers(&job));
        let d = c.describe("tx").unwrap();
        assert_eq!(d.state, TxnState::CompleteCommit);
        assert!(d.partitions.is_empty());
        // A retried EndTxn is answered without another round of markers.
        c.end_txn("tx", pid, epoch, true, 0).await.unwrap();
        assert!(jobs.try_recv().is_err());
        drop(c);
        let (c, mut jobs) = open(dir.path(), clock).await;
        let d = c.describe("tx").unwrap();
        assert_eq!(
            (d.producer_id, d.producer_epoch, d.state),
            (pid, epoch, TxnState::CompleteCommit)
        );
        assert!(jobs.try_recv().is_err(), "nothing to resend");
        // The next producer session bumps the epoch that was replayed.
        assert_eq!(
            c.init_producer_id("tx", 60_000, None).await.unwrap(),
            (pid, 1)
        );
    }

    #[tokio::test]
    async fn a_restart_between_the_end_txn_answer_and_the_markers_resends_them() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, mut jobs) = open(dir.path(), clock.clone()).await;
        let (pid, epoch) = c.init_producer_id("tx", 60_000, None).await.unwrap();
        c.add_partitions("tx", pid, epoch, &[tp("a", 0)], 0)
            .await
            .unwrap();
        c.end_txn("tx", pid, epoch, false, 0).await.unwrap();
        let sent = jobs.try_recv().unwrap();
        // The broker dies before any marker is written.
        drop((c, jobs));
        let (c, mut jobs) = open(dir.path(), clock).await;
        let resent = jobs.try_recv().unwrap();
        assert_eq!(resent, sent);
        assert!(!resent.commit);
        assert_eq!(c.describe("tx").unwrap().state, TxnState::PrepareAbort);
        // Until the markers are written, the producer is told to wait.
        assert_eq!(
            c.init_producer_id("tx", 60_000, None).await,
            Err(TxnError::ConcurrentTransactions)
        );
        c.complete_markers(&resent).unwrap();
        assert_eq!(c.describe("tx").unwrap().state, TxnState::CompleteAbort);
    }

    #[tokio::test]
    async fn under_transactions_v2_each_end_bumps_the_epoch_and_a_restart_keeps_the_version() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, mut jobs) = open(dir.path(), clock.clone()).await;
        let (pid, epoch) = c.init_producer_id("tx", 60_000, None).await.unwrap();
        c.add_partitions("tx", pid, epoch, &[tp("a", 0)], 2)
            .await
            .unwrap();
        assert_eq!(
            c.end_txn("tx", pid, epoch, true, 2).await,
            Ok((pid, epoch + 1))
        );
        let job = jobs.try_recv().unwrap();
        assert!(job.bumped);
        assert_eq!(
            job.producer_epoch,
            epoch + 1,
            "the markers carry the new epoch"
        );
        // The broker dies before the markers; the retried EndTxn, with the
        // epoch before the bump, waits for them and then gets its answer.
        drop((c, jobs));
        let (c, mut jobs) = open(dir.path(), clock).await;
        let resent = jobs.try_recv().unwrap();
        assert_eq!(resent, job);
        assert_eq!(
            c.end_txn("tx", pid, epoch, true, 2).await,
            Err(TxnError::ConcurrentTransactions)
        );
        c.complete_markers(&resent).unwrap();
        assert_eq!(
            c.end_txn("tx", pid, epoch, true, 2).await,
            Ok((pid, epoch + 1))
        );
        assert_eq!(
            c.add_partitions("tx", pid, epoch, &[tp("a", 0)], 2).await,
            Err(TxnError::ProducerFenced),
            "a late batch of the ended transaction is fenced"
        );
        c.add_partitions("tx", pid, epoch + 1, &[tp("a", 0)], 2)
            .await
            .unwrap();
    }

    /// The active segment file of `__transaction_state` under `dir`.
    fn txn_log_file(dir: &std::path::Path) -> std::path::PathBuf {
        fn walk(d: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
            for e in std::fs::read_dir(d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, out);
                } else if p.extension().is_some_and(|e| e == "log")
                    && p.to_string_lossy().contains(store::TXN_TOPIC)
                {
                    out.push(p);
                }
            }
        }
        let mut logs = Vec::new();
        walk(dir, &mut logs);
        logs.sort();
        logs.pop().unwrap()
    }

    #[tokio::test]
    async fn a_complete_record_lost_before_its_fsync_is_redone_from_the_prepare_record() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, mut jobs) = open(dir.path(), clock.clone()).await;
        let (pid, epoch) = c.init_producer_id("tx", 60_000, None).await.unwrap();
        c.add_partitions("tx", pid, epoch, &[tp("a", 0)], 0)
            .await
            .unwrap();
        c.end_txn("tx", pid, epoch, true, 0).await.unwrap();
        let job = jobs.try_recv().unwrap();
        let durable_len = std::fs::metadata(txn_log_file(dir.path())).unwrap().len();
        c.complete_markers(&job).unwrap();
        // Completed at once: the next transaction may begin.
        assert_eq!(c.describe("tx").unwrap().state, TxnState::CompleteCommit);
        drop((c, jobs));
        // A power loss takes the Complete record, which nobody waited for.
        let log = std::fs::OpenOptions::new()
            .write(true)
            .open(txn_log_file(dir.path()))
            .unwrap();
        assert!(log.metadata().unwrap().len() > durable_len);
        log.set_len(durable_len).unwrap();
        drop(log);
        let (c, mut jobs) = open(dir.path(), clock).await;
        assert_eq!(c.describe("tx").unwrap().state, TxnState::PrepareCommit);
        let resent = jobs.try_recv().unwrap();
        assert_eq!(resent, job, "the same commit markers are written again");
        c.complete_markers(&resent).unwrap();
        c.add_partitions("tx", pid, epoch, &[tp("b", 0)], 0)
            .await
            .unwrap();
        assert_eq!(c.describe("tx").unwrap().state, TxnState::Ongoing);
    }

    #[tokio::test]
    async fn a_new_producer_aborts_the_open_transaction_of_the_old_one_before_it_gets_its_epoch() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, mut jobs) = open(dir.path(), clock.clone()).await;
        let (pid, epoch) = c.init_producer_id("tx", 60_000, None).await.unwrap();
        c.add_partitions("tx", pid, epoch, &[tp("a", 0)], 0)
            .await
            .unwrap();
        assert_eq!(
            c.init_producer_id("tx", 60_000, None).await,
            Err(TxnError::ConcurrentTransactions)
        );
        let abort = jobs.try_recv().unwrap();
        assert!(!abort.commit);
        assert_eq!(
            abort.producer_epoch,
            epoch + 1,
            "markers carry the fencing epoch"
        );
        // The old producer is fenced at once.
        assert_eq!(
            c.end_txn("tx", pid, epoch, true, 0).await,
            Err(TxnError::ProducerFenced)
        );
        c.complete_markers(&abort).unwrap();
        assert_eq!(
            c.init_producer_id("tx", 60_000, None).await.unwrap(),
            (pid, epoch + 2)
        );
    }

    #[tokio::test]
    async fn transactions_past_their_timeout_are_aborted_and_idle_ids_expire() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, mut jobs) = open(dir.path(), clock.clone()).await;
        let (pid, epoch) = c.init_producer_id("slow", 10_000, None).await.unwrap();
        c.add_partitions("slow", pid, epoch, &[tp("a", 0)], 0)
            .await
            .unwrap();
        let (idle, _) = c.init_producer_id("idle", 10_000, None).await.unwrap();
        clock.advance(Duration::from_millis(9_999));
        assert_eq!(c.tick().await, (0, 0));
        clock.advance(Duration::from_millis(1));
        assert_eq!(c.tick().await, (1, 0));
        let abort = jobs.try_recv().unwrap();
        assert_eq!(
            (abort.producer_id, abort.producer_epoch, abort.commit),
            (pid, epoch + 1, false)
        );
        c.complete_markers(&abort).unwrap();
        assert_eq!(
            c.add_partitions("slow", pid, epoch, &[tp("a", 0)], 0).await,
            Err(TxnError::ProducerFenced)
        );
        // An hour without a transaction: both ids are forgotten, durably.
        clock.advance(Duration::from_secs(3600));
        assert_eq!(c.tick().await, (0, 2));
        assert_eq!(c.describe("idle"), Err(TxnError::TransactionalIdNotFound));
        drop((c, jobs));
        let (c, _jobs) = open(dir.path(), clock).await;
        assert!(c.list().unwrap().is_empty());
        let (fresh, _) = c.init_producer_id("idle", 10_000, None).await.unwrap();
        assert_ne!(fresh, idle, "a forgotten id starts with a new producer id");
    }

    #[tokio::test]
    async fn wrong_producers_and_states_get_kafkas_errors() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let (c, _jobs) = open(dir.path(), clock).await;
        assert_eq!(
            c.init_producer_id("tx", 900_001, None).await,
            Err(TxnError::InvalidTransactionTimeout)
        );
        assert_eq!(
            c.add_partitions("nobody", 1, 0, &[tp("a", 0)], 0).await,
            Err(TxnError::InvalidProducerIdMapping)
        );
        let (pid, epoch) = c.init_producer_id("tx", 60_000, None).await.unwrap();
        assert_eq!(
            c.end_txn("tx", pid, epoch, true, 0).await,
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            c.end_txn("tx", pid + 1, epoch, true, 0).await,
            Err(TxnError::InvalidProducerIdMapping)
        );
        assert_eq!(c.describe("nobody"), Err(TxnError::TransactionalIdNotFound));
    }
}
