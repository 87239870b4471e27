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
//! the abort is being written). These are the semantics of Kafka's transaction
//! version 1: the epoch changes only through InitProducerId and fencing.

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

/// Epochs at or past this start a new producer id (Kafka: Short.MaxValue - 1).
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
        TxnState::Ongoing => {
            let mut next = m.clone();
            next.producer_epoch = next.producer_epoch.saturating_add(1);
            next.state = TxnState::PrepareAbort;
            next.last_update_ms = now_ms;
            next.pending = None;
            Ok(InitStep::AbortFirst(next))
        }
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
/// partition). `None`: every partition is in the transaction already.
pub(crate) fn add_partitions(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
    partitions: &[(String, i32)],
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
    /// The same outcome is already complete (a retried EndTxn): answer at once.
    AlreadyDone,
}

/// EndTxn from the producer.
pub(crate) fn end(
    current: Option<&TxnMetadata>,
    producer_id: i64,
    producer_epoch: i16,
    commit: bool,
    now_ms: i64,
) -> Result<EndStep, TxnError> {
    let m = check_producer(current, producer_id, producer_epoch)?;
    let (prepare, complete) = if commit {
        (TxnState::PrepareCommit, TxnState::CompleteCommit)
    } else {
        (TxnState::PrepareAbort, TxnState::CompleteAbort)
    };
    match m.state {
        TxnState::Ongoing => {
            let mut next = m.clone();
            next.state = prepare;
            next.last_update_ms = now_ms;
            Ok(EndStep::Write(next))
        }
        s if s == complete => Ok(EndStep::AlreadyDone),
        s if s == prepare => Err(TxnError::ConcurrentTransactions),
        TxnState::PrepareEpochFence => Err(TxnError::ConcurrentTransactions),
        TxnState::Dead => Err(TxnError::InvalidProducerIdMapping),
        _ => Err(TxnError::InvalidTxnState),
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
    let mut next = m.clone();
    next.producer_epoch = next.producer_epoch.saturating_add(1);
    next.last_producer_id = -1;
    next.last_producer_epoch = -1;
    next.state = TxnState::PrepareAbort;
    next.last_update_ms = now_ms;
    Some(next)
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
            add_partitions(Some(&m2), 100, 0, &[tp("t", 0)], 2),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            end(Some(&m2), 100, 0, true, 2),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(
            add_partitions(Some(&m2), 7, 1, &[tp("t", 0)], 2),
            Err(TxnError::InvalidProducerIdMapping)
        );
    }

    #[test]
    fn init_during_an_ongoing_transaction_aborts_it_with_a_fencing_epoch_first() {
        let m = fresh(0);
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 1)
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
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 10)
            .unwrap()
            .unwrap();
        assert_eq!((m.state, m.start_ms), (TxnState::Ongoing, 10));
        assert_eq!(
            add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 11),
            Ok(None)
        );
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 1)], 12)
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
            end(Some(&m), 100, 0, true, 1),
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            end(None, 100, 0, true, 1),
            Err(TxnError::InvalidProducerIdMapping)
        );
        let ongoing = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 1)
            .unwrap()
            .unwrap();
        let EndStep::Write(prepared) = end(Some(&ongoing), 100, 0, true, 2).unwrap() else {
            panic!()
        };
        assert_eq!(prepared.state, TxnState::PrepareCommit);
        assert_eq!(
            end(Some(&prepared), 100, 0, true, 3),
            Err(TxnError::ConcurrentTransactions)
        );
        assert_eq!(
            end(Some(&prepared), 100, 0, false, 3),
            Err(TxnError::InvalidTxnState)
        );
        assert_eq!(
            add_partitions(Some(&prepared), 100, 0, &[tp("t", 1)], 3),
            Err(TxnError::ConcurrentTransactions)
        );
        let done = complete(Some(&prepared), 100, 0, 4).unwrap();
        assert_eq!(done.state, TxnState::CompleteCommit);
        assert_eq!(end(Some(&done), 100, 0, true, 5), Ok(EndStep::AlreadyDone));
        assert_eq!(
            end(Some(&done), 100, 0, false, 5),
            Err(TxnError::InvalidTxnState)
        );
        // The next transaction starts afresh.
        let next = add_partitions(Some(&done), 100, 0, &[tp("u", 0)], 6)
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
            add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 1),
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
        let m = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 1_000)
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
            end(Some(&done), 100, 0, true, 61_002),
            Err(TxnError::ProducerFenced)
        );
        assert_eq!(timed_out(&done, 10_000_000), None);
    }

    #[test]
    fn only_idle_ids_expire() {
        let m = fresh(0);
        assert!(!expired(&m, 999, 1000));
        assert!(expired(&m, 1000, 1000));
        let ongoing = add_partitions(Some(&m), 100, 0, &[tp("t", 0)], 0)
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
}
