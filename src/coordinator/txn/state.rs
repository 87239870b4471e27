//! One transactional id's state and Kafka's rules for moving it, as pure
//! functions: each takes the current metadata (or none), the request and the
//! time, and returns the metadata to write next or the error to answer. The
//! coordinator around it writes, waits, and applies; nothing here does I/O or
//! reads a clock, so every rule is tested by calling it.
//!
//! The states are Kafka's (`TransactionState`, whose ids the log records
//! carry): Empty → Ongoing (AddPartitionsToTxn) → PrepareCommit/PrepareAbort
//! (EndTxn, or a timeout) → CompleteCommit/CompleteAbort (once every partition
//! has its marker) → Ongoing again, or Dead when the id expires.
//! PrepareEpochFence is the in-memory state of an ongoing transaction whose
//! producer is being fenced (InitProducerId or a timeout bumped its epoch and
//! the abort is being written).
//!
//! Under transaction version 1 the epoch changes only through InitProducerId
//! and fencing. Version 2 (KIP-890 part 2, a producer that ends its
//! transactions with EndTxn v5 and adds partitions by producing to them)
//! bumps it with every EndTxn: the markers carry the new epoch, so a batch
//! of the finished transaction that reaches a partition late is refused
//! there as fenced instead of opening a transaction nobody will end. A
//! retried EndTxn is recognised by the epoch one below. When the epoch runs
//! out, the bump moves the producer to a new id, drawn when the transaction
//! prepares and taken on when it completes.

use std::collections::BTreeSet;

/// Kafka's TransactionState, with the ids its log records use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) enum TxnState {
    #[default]
    Empty,
    Ongoing,
    PrepareCommit,
    PrepareAbort,
    CompleteCommit,
    CompleteAbort,
    Dead,
    PrepareEpochFence,
}

impl TxnState {
    pub(crate) fn id(self) -> i8 {
        match self {
            TxnState::Empty => 0,
            TxnState::Ongoing => 1,
            TxnState::PrepareCommit => 2,
            TxnState::PrepareAbort => 3,
            TxnState::CompleteCommit => 4,
            TxnState::CompleteAbort => 5,
            TxnState::Dead => 6,
            TxnState::PrepareEpochFence => 7,
        }
    }

    pub(crate) fn from_id(id: i8) -> Option<TxnState> {
        Some(match id {
            0 => TxnState::Empty,
            1 => TxnState::Ongoing,
            2 => TxnState::PrepareCommit,
            3 => TxnState::PrepareAbort,
            4 => TxnState::CompleteCommit,
            5 => TxnState::CompleteAbort,
            6 => TxnState::Dead,
            7 => TxnState::PrepareEpochFence,
            _ => return None,
        })
    }

    /// The name DescribeTransactions and ListTransactions use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TxnState::Empty => "Empty",
            TxnState::Ongoing => "Ongoing",
            TxnState::PrepareCommit => "PrepareCommit",
            TxnState::PrepareAbort => "PrepareAbort",
            TxnState::CompleteCommit => "CompleteCommit",
            TxnState::CompleteAbort => "CompleteAbort",
            TxnState::Dead => "Dead",
            TxnState::PrepareEpochFence => "PrepareEpochFence",
        }
    }

    pub(crate) fn from_name(name: &str) -> Option<TxnState> {
        (0..=7)
            .filter_map(TxnState::from_id)
            .find(|s| s.name() == name)
    }

    fn is_complete(self) -> bool {
        matches!(self, TxnState::CompleteCommit | TxnState::CompleteAbort)
    }

    fn is_prepare(self) -> bool {
        matches!(self, TxnState::PrepareCommit | TxnState::PrepareAbort)
    }
}

/// What is known about one transactional id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TxnMetadata {
    pub producer_id: i64,
    pub producer_epoch: i16,
    /// The id and epoch before the last bump, so that a retried
    /// InitProducerId (KIP-360) gets the same answer (in memory, as in Kafka).
    pub last_producer_id: i64,
    pub last_producer_epoch: i16,
    pub timeout_ms: i32,
    pub state: TxnState,
    pub partitions: BTreeSet<(String, i32)>,
    pub start_ms: i64,
    pub last_update_ms: i64,
    /// The state being written; other requests wait (CONCURRENT_TRANSACTIONS).
    pub pending: Option<TxnState>,
    /// Transactions v2: the id a prepared transaction moves the producer to
    /// when it completes, its epoch being exhausted (else -1).
    pub next_producer_id: i64,
    /// The transaction version of the producer's open or last transaction
    /// (Kafka's ClientTransactionVersion): 2 bumps the epoch at its end, 0
    /// does not.
    pub transaction_version: i16,
}

impl Default for TxnMetadata {
    fn default() -> Self {
        TxnMetadata {
            producer_id: -1,
            producer_epoch: -1,
            last_producer_id: -1,
            last_producer_epoch: -1,
            timeout_ms: 60_000,
            state: TxnState::Empty,
            partitions: BTreeSet::new(),
            start_ms: -1,
            last_update_ms: -1,
            pending: None,
            next_producer_id: -1,
            transaction_version: 0,
        }
    }
}

impl TxnMetadata {
    pub(crate) fn partitions_by_topic(&self) -> Vec<(String, Vec<i32>)> {
        let mut out: Vec<(String, Vec<i32>)> = Vec::new();
        for (t, p) in &self.partitions {
            match out.last_mut() {
                Some((last, ps)) if last == t => ps.push(*p),
                _ => out.push((t.clone(), vec![*p])),
            }
        }
        out
    }

    /// The state others see: the fence while it is being written.
    pub(crate) fn visible_state(&self) -> TxnState {
        match self.pending {
            Some(TxnState::PrepareEpochFence) => TxnState::PrepareEpochFence,
            _ => self.state,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum TxnError {
    #[error("another operation on the transaction is in progress")]
    ConcurrentTransactions,
    #[error("the producer id does not match the transactional id")]
    InvalidProducerIdMapping,
    #[error("a newer producer with the same transactional id fenced this one")]
    ProducerFenced,
    #[error("the transaction is not in a state that allows this")]
    InvalidTxnState,
    #[error("the transaction timeout is larger than the broker allows or not positive")]
    InvalidTransactionTimeout,
    #[error("unknown transactional id")]
    TransactionalIdNotFound,
    #[error("this broker is not the transaction coordinator")]
    NotCoordinator,
    #[error("the transaction coordinator is loading its state")]
    LoadInProgress,
    #[error("the producer id space is exhausted or not available: {0}")]
    NoProducerId(String),
    #[error("the transaction state could not be written: {0}")]
    Storage(String),
}

/// What InitProducerId does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum InitStep {
    /// A producer id must be drawn first (a new transactional id, or an
    /// exhausted epoch); ask again with it.
    NeedProducerId,
    /// Write this metadata, then answer with its id and epoch.
    Write(TxnMetadata),
    /// A retried request (KIP-360): answer with this id and epoch, no write.
    Answer(i64, i16),
    /// The previous producer's transaction is still open: write this abort
    /// (with the fencing epoch), send its markers, and answer
    /// CONCURRENT_TRANSACTIONS so that the client retries.
    AbortFirst(TxnMetadata),
}

/// Epochs at or past this start a new producer id (Kafka: Short.MaxValue - 1;
/// Short.MaxValue itself is kept for the coordinator's fencing bump).
const EPOCH_EXHAUSTED: i16 = i16::MAX - 1;

/// InitProducerId with a transactional id. `expected` is the producer's own
/// id and epoch when it asks to bump them (KIP-360), `fresh_id` an id drawn
/// after a `NeedProducerId`.
pub(crate) fn init(
    current: Option<&TxnMetadata>,
    timeout_ms: i32,
    max_timeout_ms: i32,
    expected: Option<(i64, i16)>,
    fresh_id: Option<i64>,
    now_ms: i64,
) -> Result<InitStep, TxnError> {
    if timeout_ms <= 0 || timeout_ms > max_timeout_ms {
        return Err(TxnError::InvalidTransactionTimeout);
    }
    let Some(m) = current.filter(|m| m.state != TxnState::Dead) else {
        let Some(id) = fresh_id else {
            return Ok(InitStep::NeedProducerId);
        };
        return Ok(InitStep::Write(TxnMetadata {
            producer_id: id,
            producer_epoch: 0,
            timeout_ms,
            state: TxnState::Empty,
            start_ms: -1,
            last_update_ms: now_ms,
            ..TxnMetadata::default()
        }));
    };
    if m.pending.is_some() {
        return Err(TxnError::ConcurrentTransactions);
    }
    if let Some((pid, epoch)) = expected {
        let current = (m.producer_id, m.producer_epoch);
        let retried = m.last_producer_epoch >= 0
            && (pid, epoch)
                == (
                    if m.last_producer_id >= 0 {
                        m.last_producer_id
                    } else {
                        m.producer_id
                    },
                    m.last_producer_epoch,
                );
        if retried && m.state != TxnState::Ongoing {
            return Ok(InitStep::Answer(m.producer_id, m.producer_epoch));
        }
        if (pid, epoch) != current {
            return Err(TxnError::ProducerFenced);
        }
    }
    match m.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
            Err(TxnError::ConcurrentTransactions)
        }
        TxnState::Ongoing => Ok(InitStep::AbortFirst(fence(m, now_ms))),
        TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort => {
            let mut next = m.clone();
            next.last_producer_id = -1;
            next.last_producer_epoch = m.producer_epoch;
            if m.producer_epoch >= EPOCH_EXHAUSTED {
                let Some(id) = fresh_id else {
                    return Ok(InitStep::NeedProducerId);
                };
                next.last_producer_id = m.producer_id;
                next.producer_id = id;
                next.producer_epoch = 0;
            } else {
                next.producer_epoch += 1;
            }
            next.timeout_ms = timeout_ms;
            next.state = TxnState::Empty;
            next.partitions.clear();
            next.start_ms = -1;
            next.last_update_ms = now_ms;
            Ok(InitStep::Write(next))
        }
        TxnState::Dead => unreachable!("filtered above"),
    }
}

/// Checks that a request comes from the producer that owns the id now.
fn check_producer(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
) -> Result<&TxnMetadata, TxnError> {
    let m = current
        .filter(|m| m.state != TxnState::Dead)
        .ok_or(TxnError::InvalidProducerIdMapping)?;
    if m.next_producer_id >= 0 && m.next_producer_id == producer_id && producer_epoch == 0 {
        // The producer was told its new id; the transaction that moves it
        // there is still completing.
        return Err(TxnError::ConcurrentTransactions);
    }
    if m.producer_id != producer_id {
        return Err(TxnError::InvalidProducerIdMapping);
    }
    if m.producer_epoch != producer_epoch {
        return Err(TxnError::ProducerFenced);
    }
    if m.pending.is_some() {
        return Err(TxnError::ConcurrentTransactions);
    }
    Ok(m)
}

/// AddPartitionsToTxn (and AddOffsetsToTxn, which adds the group's offsets
/// partition), or under transactions v2 (`version` 2) the partitions a
/// producer's Produce or TxnOffsetCommit adds. `None`: every partition is
/// in the transaction already.
pub(crate) fn add_partitions(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
    partitions: &[(String, i32)],
    version: i16,
    now_ms: i64,
) -> Result<Option<TxnMetadata>, TxnError> {
    let m = check_producer(current, producer_id, producer_epoch)?;
    match m.state {
        TxnState::PrepareCommit | TxnState::PrepareAbort | TxnState::PrepareEpochFence => {
            return Err(TxnError::ConcurrentTransactions)
        }
        TxnState::Dead => return Err(TxnError::InvalidProducerIdMapping),
        TxnState::Ongoing if partitions.iter().all(|p| m.partitions.contains(p)) => {
            return Ok(None)
        }
        _ => {}
    }
    let mut next = m.clone();
    if m.state != TxnState::Ongoing {
        next.partitions.clear();
        next.start_ms = now_ms;
        next.transaction_version = version;
    }
    next.state = TxnState::Ongoing;
    next.partitions.extend(partitions.iter().cloned());
    next.last_update_ms = now_ms;
    Ok(Some(next))
}

/// Whether a broker's verify-only AddPartitionsToTxn (v4+) finds the
/// partition in the producer's ongoing transaction.
pub(crate) fn verify_partition(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
    partition: &(String, i32),
) -> Result<(), TxnError> {
    let m = current.ok_or(TxnError::InvalidProducerIdMapping)?;
    if m.producer_id != producer_id {
        return Err(TxnError::InvalidProducerIdMapping);
    }
    if m.producer_epoch != producer_epoch {
        return Err(TxnError::ProducerFenced);
    }
    if m.state == TxnState::Ongoing && m.partitions.contains(partition) {
        Ok(())
    } else {
        Err(TxnError::InvalidTxnState)
    }
}

/// What EndTxn does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EndStep {
    /// Write this Prepare* metadata, answer, then send the markers.
    Write(TxnMetadata),
    /// The same outcome is already complete (a retried EndTxn): answer at
    /// once with this producer id and epoch.
    AlreadyDone(i64, i16),
    /// Transactions v2 with the epoch exhausted: draw the producer's next
    /// id, then ask again with it.
    NeedProducerId,
}

/// Epochs at or past this start a new producer id (Kafka: Short.MaxValue - 1).
fn exhausted(epoch: i16) -> bool {
    epoch >= EPOCH_EXHAUSTED
}

/// EndTxn from the producer; `version` 2 (EndTxn v5) bumps the epoch.
pub(crate) fn end(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    version: i16,
    fresh_id: Option<i64>,
    now_ms: i64,
) -> Result<EndStep, TxnError> {
    let (prepare, complete) = if commit {
        (TxnState::PrepareCommit, TxnState::CompleteCommit)
    } else {
        (TxnState::PrepareAbort, TxnState::CompleteAbort)
    };
    if let Some(m) = current.filter(|m| m.transaction_version >= 2 && m.pending.is_none()) {
        // A retry of the EndTxn that bumped the epoch carries the epoch
        // before the bump (or, when the bump moved to a new id, the old id
        // at the last epoch). Only the epoch is compared, which survives a
        // restart; a fence moves two epochs so that its producer does not
        // pass for a retry.
        // A fence from the last epoch could only move one (to
        // Short.MaxValue), which no EndTxn bump reaches without a new id.
        let bumped_here = m.producer_epoch < i16::MAX || m.next_producer_id >= 0;
        let retry = (m.state.is_prepare() || m.state.is_complete())
            && ((m.producer_id == producer_id
                && bumped_here
                && m.producer_epoch == producer_epoch.wrapping_add(1))
                || (m.state.is_complete()
                    && m.last_producer_id == producer_id
                    && exhausted(producer_epoch)
                    && m.producer_epoch == 0));
        if retry {
            return match m.state {
                s if s == complete => Ok(EndStep::AlreadyDone(m.producer_id, m.producer_epoch)),
                s if s == prepare => Err(TxnError::ConcurrentTransactions),
                _ => Err(TxnError::InvalidTxnState),
            };
        }
    }
    let m = check_producer(current, producer_id, producer_epoch)?;
    // Under v2 a producer may abort a transaction none of whose batches has
    // reached a partition yet (so none was added). The epoch is bumped all
    // the same: those batches may still arrive, and must find it fenced.
    let empty_abort = version >= 2
        && !commit
        && matches!(
            m.state,
            TxnState::Empty | TxnState::CompleteCommit | TxnState::CompleteAbort
        );
    match m.state {
        _ if empty_abort => {
            let mut next = m.clone();
            next.partitions.clear();
            next.start_ms = now_ms;
            next.transaction_version = version;
            next.state = TxnState::Ongoing;
            end(
                Some(&next),
                producer_id,
                producer_epoch,
                false,
                version,
                fresh_id,
                now_ms,
            )
        }
        TxnState::Ongoing => {
            let mut next = m.clone();
            next.state = prepare;
            next.last_update_ms = now_ms;
            next.transaction_version = version;
            if version >= 2 {
                if exhausted(m.producer_epoch) {
                    let Some(id) = fresh_id else {
                        return Ok(EndStep::NeedProducerId);
                    };
                    next.next_producer_id = id;
                }
                next.last_producer_epoch = m.producer_epoch;
                next.producer_epoch = m.producer_epoch.saturating_add(1);
            }
            Ok(EndStep::Write(next))
        }
        // Under v2 the epoch matches only the next transaction's: it ends
        // while the previous one's markers are still being written.
        TxnState::PrepareCommit | TxnState::PrepareAbort if m.transaction_version >= 2 => {
            Err(TxnError::ConcurrentTransactions)
        }
        s if s == complete && m.transaction_version < 2 => {
            Ok(EndStep::AlreadyDone(m.producer_id, m.producer_epoch))
        }
        s if s == prepare => Err(TxnError::ConcurrentTransactions),
        TxnState::PrepareEpochFence => Err(TxnError::ConcurrentTransactions),
        TxnState::Dead => Err(TxnError::InvalidProducerIdMapping),
        _ => Err(TxnError::InvalidTxnState),
    }
}

/// The producer id and epoch an EndTxn v5 answer gives the producer for
/// its next transaction, once `m` (Prepare*) is written.
pub(crate) fn next_producer(m: &TxnMetadata) -> (i64, i16) {
    if m.next_producer_id >= 0 {
        (m.next_producer_id, 0)
    } else {
        (m.producer_id, m.producer_epoch)
    }
}

/// Once every partition has its marker: Complete*, with no partitions.
/// `None` when the transaction moved on meanwhile (nothing to complete).
pub(crate) fn complete(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
    now_ms: i64,
) -> Option<TxnMetadata> {
    let m = current?;
    if m.pending.is_some()
        || !m.state.is_prepare()
        || (m.producer_id, m.producer_epoch) != (producer_id, producer_epoch)
    {
        return None;
    }
    let mut next = m.clone();
    next.state = if m.state == TxnState::PrepareCommit {
        TxnState::CompleteCommit
    } else {
        TxnState::CompleteAbort
    };
    if m.next_producer_id >= 0 {
        next.last_producer_id = m.producer_id;
        next.last_producer_epoch = m.producer_epoch;
        next.producer_id = m.next_producer_id;
        next.producer_epoch = 0;
        next.next_producer_id = -1;
    }
    next.partitions.clear();
    next.last_update_ms = now_ms;
    Some(next)
}

/// An ongoing transaction past its timeout: the abort to write, with the
/// producer's epoch bumped so that it is fenced (as Kafka does).
pub(crate) fn timed_out(m: &TxnMetadata, now_ms: i64) -> Option<TxnMetadata> {
    if m.pending.is_some()
        || m.state != TxnState::Ongoing
        || m.start_ms + i64::from(m.timeout_ms) > now_ms
    {
        return None;
    }
    let mut next = fence(m, now_ms);
    next.last_producer_id = -1;
    Some(next)
}

/// The abort that fences an ongoing transaction's producer. Under
/// transactions v2 the epoch moves up twice, as the fence and the end of
/// the transaction each bump it in Kafka: the epoch one below the new one,
/// which a retried EndTxn would carry, is then one the producer never had.
fn fence(m: &TxnMetadata, now_ms: i64) -> TxnMetadata {
    let mut next = m.clone();
    let bumps = if m.transaction_version >= 2 { 2 } else { 1 };
    next.producer_epoch = next.producer_epoch.saturating_add(bumps);
    next.last_producer_epoch = -1;
    next.state = TxnState::PrepareAbort;
    next.last_update_ms = now_ms;
    next.pending = None;
    next
}

/// Whether an idle id has outlived `transactional.id.expiration.ms`.
pub(crate) fn expired(m: &TxnMetadata, now_ms: i64, expiration_ms: i64) -> bool {
    m.pending.is_none()
        && (m.state == TxnState::Empty || m.state.is_complete())
        && m.last_update_ms + expiration_ms <= now_ms
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: i32 = 900_000;

    fn fresh(now: i64) -> TxnMetadata {
        match init(None, 60_000, MAX, None, Some(100), now).unwrap() {
            InitStep::Write(m) => m,
            other => panic!("{other:?}"),
        }
    }

    fn tp(t: &str, p: i32) -> (String, i32) {
        (t.to_string(), p)
    }

    #[test]
    fn a_new_transactional_id_needs_an_id_then_starts_empty_at_epoch_zero() {
        assert_eq!(
            init(None, 60_000, MAX, None, None, 0).unwrap(),
            InitStep::NeedProducerId
        );
        let m = fresh(5);
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.state),
            (100, 0, TxnState::Empty)
        );
        assert_eq!(m.last_update_ms, 5);
    }

    #[test]
    fn timeouts_above_the_maximum_or_not_positive_are_refused() {
        for t in [0, -1, MAX + 1] {
            assert_eq!(
                init(None, t, MAX, None, Some(1), 0),
                Err(TxnError::InvalidTransactionTimeout)
            );
        }
        assert!(init(None, MAX, MAX, None, Some(1), 0).is_ok());
    }

    #[test]
    fn a_second_init_bumps_the_epoch_and_fences_the_first_producer() {
        let m = fresh(0);
        let InitStep::Write(m2) = init(Some(&m), 60_000, MAX, None, None, 1).unwrap() else {
            panic!()
        };
        assert_eq!((m2.producer_id, m2.producer_epoch), (100, 1));
        assert_eq!(
            add_partitions(Some(&m2), 100, 0, &[tp("t", 0)], 0, 2),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            end(Some(&m2), 100, 0, true, 0, None, 2),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            add_partitions(Some(&m2), 7, 1, &[tp("t", 0)], 0, 2),
            Err(TxnError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn init_during_an_ongoing_transaction_aborts_it_with_a_fencing_epoch_first() {
        let m = fresh(0);
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 1)
            .unwrap()
            .unwrap();
        let InitStep::AbortFirst(abort) = init(Some(&m), 60_000, MAX, None, None, 2).unwrap()
        else {
            panic!()
        };
        assert_eq!(abort.state, TxnState::PrepareAbort);
        assert_eq!(abort.producer_epoch, 1);
        assert_eq!(abort.partitions, m.partitions);
        // While the abort is prepared, a retry is told to wait.
        assert_eq!(
            init(Some(&abort), 60_000, MAX, None, None, 3),
            Err(TxnError::ConcurrentTransactions)
        );
        // Once complete, the retry gets the next epoch.
        let done = complete(Some(&abort), 100, 1, 4).unwrap();
        assert_eq!(done.state, TxnState::CompleteAbort);
        assert!(done.partitions.is_empty());
        let InitStep::Write(again) = init(Some(&done), 60_000, MAX, None, None, 5).unwrap() else {
            panic!()
        };
        assert_eq!(again.producer_epoch, 2);
    }

    #[test]
    fn kip_360_a_producer_bumps_its_own_epoch_and_a_retry_gets_the_same_answer() {
        let m = fresh(0);
        let InitStep::Write(m2) = init(Some(&m), 60_000, MAX, Some((100, 0)), None, 1).unwrap()
        else {
            panic!()
        };
        assert_eq!(m2.producer_epoch, 1);
        // The answer was lost; the producer asks again with its old epoch.
        assert_eq!(
            init(Some(&m2), 60_000, MAX, Some((100, 0)), None, 2).unwrap(),
            InitStep::Answer(100, 1)
        );
        // Someone with an epoch that never was is fenced.
        assert_eq!(
            init(Some(&m2), 60_000, MAX, Some((100, 7)), None, 2),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn an_exhausted_epoch_moves_to_a_new_producer_id() {
        let mut m = fresh(0);
        m.producer_epoch = i16::MAX - 1;
        assert_eq!(
            init(Some(&m), 60_000, MAX, None, None, 1).unwrap(),
            InitStep::NeedProducerId
        );
        let InitStep::Write(m2) = init(Some(&m), 60_000, MAX, None, Some(555), 1).unwrap() else {
            panic!()
        };
        assert_eq!((m2.producer_id, m2.producer_epoch), (555, 0));
        assert_eq!(m2.last_producer_id, 100);
    }

    #[test]
    fn adding_partitions_starts_the_transaction_and_repeats_write_nothing() {
        let m = fresh(0);
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 10)
            .unwrap()
            .unwrap();
        assert_eq!((m.state, m.start_ms), (TxnState::Ongoing, 10));
        assert_eq!(
            add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 11),
            Ok(None)
        );
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 1)], 0, 12)
            .unwrap()
            .unwrap();
        assert_eq!(m.partitions.len(), 2);
        assert_eq!(m.start_ms, 10, "the start is the first add");
        assert!(verify_partition(Some(&m), 100, 0, &tp("t", 1)).is_ok());
        assert_eq!(
            verify_partition(Some(&m), 100, 0, &tp("t", 9)),
            Err(TxnError::InvalidTxnState)
        );
    }

    #[test]
    fn end_txn_follows_kafkas_table_of_states() {
        let m = fresh(0);
        assert_eq!(
            end(Some(&m), 100, 0, true, 0, None, 1),
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            end(None, 100, 0, true, 0, None, 1),
            Err(TxnError::InvalidProducerIdMapping)
        );
        let ongoing = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 1)
            .unwrap()
            .unwrap();
        let EndStep::Write(prepared) = end(Some(&ongoing), 100, 0, true, 0, None, 2).unwrap()
        else {
            panic!()
        };
        assert_eq!(prepared.state, TxnState::PrepareCommit);
        assert_eq!(
            end(Some(&prepared), 100, 0, true, 0, None, 3),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(
            end(Some(&prepared), 100, 0, false, 0, None, 3),
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            add_partitions(Some(&prepared), 100, 0, &[tp("t", 1)], 0, 3),
            Err(TxnError::ConcurrentTransactions)
        );
        let done = complete(Some(&prepared), 100, 0, 4).unwrap();
        assert_eq!(done.state, TxnState::CompleteCommit);
        assert_eq!(
            end(Some(&done), 100, 0, true, 0, None, 5),
            Ok(EndStep::AlreadyDone(100, 0))
        );
        assert_eq!(
            end(Some(&done), 100, 0, false, 0, None, 5),
            Err(TxnError::InvalidTxnState)
        );
        // The next transaction starts afresh.
        let next = add_partitions(Some(&done), 100, 0, &[tp("u", 0)], 0, 6)
            .unwrap()
            .unwrap();
        assert_eq!(next.partitions.len(), 1);
        assert_eq!(next.start_ms, 6);
    }

    #[test]
    fn a_pending_write_makes_others_wait() {
        let mut m = fresh(0);
        m.pending = Some(TxnState::Ongoing);
        assert_eq!(
            add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 1),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(
            init(Some(&m), 1000, MAX, None, None, 1),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(complete(Some(&m), 100, 0, 1), None);
    }

    #[test]
    fn an_ongoing_transaction_times_out_with_its_producer_fenced() {
        let m = fresh(0);
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 1_000)
            .unwrap()
            .unwrap();
        assert_eq!(timed_out(&m, 60_999), None);
        let abort = timed_out(&m, 61_000).unwrap();
        assert_eq!(
            (abort.state, abort.producer_epoch),
            (TxnState::PrepareAbort, 1)
        );
        let done = complete(Some(&abort), 100, 1, 61_001).unwrap();
        assert_eq!(
            end(Some(&done), 100, 0, true, 0, None, 61_002),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(timed_out(&done, 10_000_000), None);
    }

    #[test]
    fn only_idle_ids_expire() {
        let m = fresh(0);
        assert!(!expired(&m, 999, 1000));
        assert!(expired(&m, 1000, 1000));
        let ongoing = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0, 0)
            .unwrap()
            .unwrap();
        assert!(!expired(&ongoing, 1_000_000, 1000));
    }

    #[test]
    fn state_names_and_ids_round_trip() {
        for id in 0..=7 {
            let s = TxnState::from_id(id).unwrap();
            assert_eq!(s.id(), id);
            assert_eq!(TxnState::from_name(s.name()), Some(s));
        }
        assert_eq!(TxnState::from_id(8), None);
    }

    fn ongoing_v2(epoch: i16) -> TxnMetadata {
        let mut m = fresh(0);
        m.producer_epoch = epoch;
        add_partitions(Some(&m), 100, epoch, &[tp("t", 0)], 2, 1)
            .unwrap()
            .unwrap()
    }

    fn prepared(step: Result<EndStep, TxnError>) -> TxnMetadata {
        match step.unwrap() {
            EndStep::Write(m) => m,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn v2_every_end_bumps_the_epoch_and_the_markers_carry_it() {
        let m = ongoing_v2(0);
        assert_eq!(m.transaction_version, 2);
        let p = prepared(end(Some(&m), 100, 0, true, 2, None, 2));
        assert_eq!(
            (p.state, p.producer_epoch, p.last_producer_epoch),
            (TxnState::PrepareCommit, 1, 0)
        );
        assert_eq!(next_producer(&p), (100, 1));
        let done = complete(Some(&p), 100, 1, 3).unwrap();
        assert_eq!(
            (done.state, done.producer_epoch),
            (TxnState::CompleteCommit, 1)
        );
        // The next transaction runs at the bumped epoch; the old one is fenced.
        assert_eq!(
            add_partitions(Some(&done), 100, 0, &[tp("t", 0)], 2, 4),
            Err(TxnError::ProducerFenced)
        );
        let next = add_partitions(Some(&done), 100, 1, &[tp("t", 0)], 2, 4)
            .unwrap()
            .unwrap();
        let p2 = prepared(end(Some(&next), 100, 1, false, 2, None, 5));
        assert_eq!((p2.state, p2.producer_epoch), (TxnState::PrepareAbort, 2));
    }

    #[test]
    fn v2_a_retried_end_carries_the_epoch_before_the_bump() {
        let p = prepared(end(Some(&ongoing_v2(3)), 100, 3, true, 2, None, 2));
        // Retried while the markers are still being written: wait.
        assert_eq!(
            end(Some(&p), 100, 3, true, 2, None, 3),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(
            end(Some(&p), 100, 3, false, 2, None, 3),
            Err(TxnError::InvalidTxnState)
        );
        let done = complete(Some(&p), 100, 4, 4).unwrap();
        // Retried once complete: the same answer as the first time.
        assert_eq!(
            end(Some(&done), 100, 3, true, 2, None, 5),
            Ok(EndStep::AlreadyDone(100, 4))
        );
        assert_eq!(
            end(Some(&done), 100, 3, false, 2, None, 5),
            Err(TxnError::InvalidTxnState)
        );
        // At the current epoch with nothing open, EndTxn is a wrong state,
        // and an epoch further back is fenced.
        assert_eq!(
            end(Some(&done), 100, 4, true, 2, None, 5),
            Err(TxnError::InvalidTxnState)
        );
        // The next transaction's abort, before the markers of this one are
        // written, waits for them.
        assert_eq!(
            end(Some(&p), 100, 4, false, 2, None, 4),
            Err(TxnError::ConcurrentTransactions)
        );
        // An abort of a transaction that added nothing still bumps the
        // epoch, fencing its batches still on the way; it has no markers.
        let abort = prepared(end(Some(&done), 100, 4, false, 2, None, 5));
        assert_eq!(
            (abort.state, abort.producer_epoch),
            (TxnState::PrepareAbort, 5)
        );
        assert!(abort.partitions.is_empty());
        assert_eq!(
            end(Some(&done), 100, 2, true, 2, None, 5),
            Err(TxnError::ProducerFenced)
        );
    }

    #[test]
    fn v2_an_exhausted_epoch_moves_to_a_new_id_when_the_transaction_completes() {
        let m = ongoing_v2(i16::MAX - 1);
        assert_eq!(
            end(Some(&m), 100, i16::MAX - 1, true, 2, None, 2),
            Ok(EndStep::NeedProducerId)
        );
        let p = prepared(end(Some(&m), 100, i16::MAX - 1, true, 2, Some(555), 2));
        assert_eq!(p.producer_epoch, i16::MAX, "the markers use the last epoch");
        assert_eq!(next_producer(&p), (555, 0));
        // The producer, told its new id, waits for the completion.
        assert_eq!(
            add_partitions(Some(&p), 555, 0, &[tp("t", 0)], 2, 3),
            Err(TxnError::ConcurrentTransactions)
        );
        let done = complete(Some(&p), 100, i16::MAX, 4).unwrap();
        assert_eq!(
            (done.producer_id, done.producer_epoch, done.last_producer_id),
            (555, 0, 100)
        );
        assert_eq!(
            end(Some(&done), 100, i16::MAX - 1, true, 2, None, 5),
            Ok(EndStep::AlreadyDone(555, 0))
        );
        assert!(add_partitions(Some(&done), 555, 0, &[tp("t", 0)], 2, 6)
            .unwrap()
            .is_some());
    }

    #[test]
    fn v2_a_fenced_transaction_moves_two_epochs_so_its_producer_cannot_pass_for_a_retry() {
        let m = ongoing_v2(5);
        let abort = timed_out(&m, 1_000_000).unwrap();
        assert_eq!(
            (abort.state, abort.producer_epoch),
            (TxnState::PrepareAbort, 7)
        );
        let done = complete(Some(&abort), 100, 7, 1_000_001).unwrap();
        assert_eq!(
            end(Some(&done), 100, 5, false, 2, None, 1_000_002),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            end(Some(&done), 100, 5, true, 2, None, 1_000_002),
            Err(TxnError::ProducerFenced)
        );
        let InitStep::AbortFirst(fenced) =
            init(Some(&ongoing_v2(5)), 60_000, MAX, None, None, 2).unwrap()
        else {
            panic!()
        };
        assert_eq!(fenced.producer_epoch, 7);
    }

    /// A transactions v2 producer over seeded random schedules: its batches
    /// add partitions, it commits and aborts, EndTxn answers get lost and
    /// are retried, markers complete, transactions time out, the producer
    /// restarts, and some schedules start near the end of the epochs. The
    /// coordinator's producer id and epoch never go back, every prepared
    /// transaction's markers carry an epoch above its data's, and a retried
    /// EndTxn is answered as the first one was.
    #[test]
    fn v2_random_schedules_keep_epochs_rising_and_answer_retries_alike() {
        for seed in 0..2000u64 {
            let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
            let mut next = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state
            };
            let mut m = fresh(0);
            if seed % 4 == 0 {
                m.producer_epoch = i16::MAX - 3;
            }
            let mut client = (m.producer_id, m.producer_epoch);
            let mut data_epoch = None;
            // The last EndTxn sent: (producer, commit) and its answer.
            type Producer = (i64, i16);
            let mut sent: Option<(Producer, bool, Producer)> = None;
            let mut ids = 1000;
            for now in 1..300 {
                let before = (m.producer_id, m.producer_epoch);
                match next() % 7 {
                    0 | 1 => {
                        let tp = tp("t", (next() % 3) as i32);
                        if let Ok(Some(n)) =
                            add_partitions(Some(&m), client.0, client.1, &[tp], 2, now)
                        {
                            data_epoch = Some(client.1);
                            m = n;
                        }
                    }
                    2 | 3 => {
                        let commit = next() % 2 == 0;
                        ids += 1;
                        let step = end(Some(&m), client.0, client.1, commit, 2, Some(ids), now);
                        if let Ok(EndStep::Write(p)) = step {
                            if let Some(e) = data_epoch.take() {
                                assert!(
                                    p.producer_epoch > e,
                                    "seed {seed}: markers at {} over data at {e}",
                                    p.producer_epoch
                                );
                            }
                            let answer = next_producer(&p);
                            sent = Some((client, commit, answer));
                            m = p;
                            if next() % 3 != 0 {
                                client = answer; // else the answer is lost
                            }
                        } else if let Ok(EndStep::AlreadyDone(pid, e)) = step {
                            if let Some((req, c, answer)) =
                                sent.filter(|(req, c, _)| *req == client && *c == commit)
                            {
                                assert_eq!(
                                    (pid, e),
                                    answer,
                                    "seed {seed}: retry of {req:?} commit {c}"
                                );
                            }
                            client = (pid, e);
                        }
                    }
                    4 => {
                        if let Some(n) = complete(Some(&m), m.producer_id, m.producer_epoch, now) {
                            m = n;
                        }
                    }
                    5 => {
                        if let Some(n) = timed_out(&m, now + 10_000_000) {
                            data_epoch = None;
                            m = n;
                        }
                    }
                    _ => {
                        ids += 1;
                        if let Ok(InitStep::Write(n)) =
                            init(Some(&m), 60_000, MAX, None, Some(ids), now)
                        {
                            client = (n.producer_id, n.producer_epoch);
                            data_epoch = None;
                            sent = None;
                            m = n;
                        }
                    }
                }
                assert!(
                    (m.producer_id, m.producer_epoch) >= before,
                    "seed {seed}: {before:?} -> {m:?}"
                );
            }
        }
    }
}
