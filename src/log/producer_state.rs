//! Idempotent-producer state of one partition.
//!
//! For every producer id the partition remembers the current epoch and the
//! metadata of its last five batches, exactly what Kafka keeps: a retried
//! batch that matches one of them is a duplicate and is answered with the
//! original offsets instead of being appended twice; any other gap or repeat
//! in the sequence numbers is rejected. When a segment seals, the table as of
//! its end is written next to it (`B.producers`, like Kafka's `.snapshot`)
//! and tiered with it; opening a partition starts from the newest snapshot
//! and replays the batch headers after it, so the state survives restarts
//! and a data directory restored from the store. The snapshot also carries
//! the partition's leader epoch history (`leader_epochs`), which needs the
//! same journey.
//!
//! Transactions add two things per producer, as in Kafka: the first offset
//! of its open transaction (the partition's last stable offset is the
//! smallest of these) and the epoch of the coordinator whose marker it saw
//! last, so a marker from a deposed coordinator is refused. A marker ends
//! the open transaction and, when it aborts one that wrote data, tells the
//! partition which offsets read_committed readers must skip.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde::{Deserialize, Serialize};

use super::leader_epochs::LeaderEpochs;
use super::LogError;
use crate::format::batch::BatchHeader;
use crate::format::control::EndTxnMarker;

/// Batches remembered per producer (Kafka's max.in.flight limit for idempotence).
pub const CACHED_BATCHES: usize = 5;
/// Extension of a sealed segment's producer snapshot.
const SNAPSHOT_FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct BatchMetadata {
    pub first_sequence: i32,
    pub last_sequence: i32,
    pub first_offset: i64,
    pub last_offset: i64,
    pub max_timestamp: i64,
}

#[derive(Debug)]
struct ProducerEntry {
    epoch: i16,
    batches: VecDeque<BatchMetadata>,
    /// The epoch of the coordinator that wrote this producer's last marker.
    coordinator_epoch: i32,
    /// The first offset of the producer's open transaction in this partition.
    txn_first_offset: Option<i64>,
    /// The max timestamp of its last batch or marker.
    last_timestamp: i64,
}

impl Default for ProducerEntry {
    fn default() -> ProducerEntry {
        ProducerEntry {
            epoch: 0,
            batches: VecDeque::new(),
            coordinator_epoch: -1,
            txn_first_offset: None,
            last_timestamp: -1,
        }
    }
}

/// A transaction a marker ended in this partition (only one that wrote data
/// here: an empty transaction changes nothing readers see).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompletedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    /// The offset of the marker.
    pub last_offset: i64,
    pub commit: bool,
}

/// What DescribeProducers reports about one producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerInfo {
    pub producer_id: i64,
    pub epoch: i16,
    pub last_sequence: i32,
    pub last_timestamp: i64,
    pub coordinator_epoch: i32,
    /// First offset of the open transaction, or -1.
    pub txn_start_offset: i64,
}

#[derive(Debug, PartialEq, Eq)]
pub enum SequenceCheck {
    Append,
    Duplicate(BatchMetadata),
}

#[derive(Debug, Default)]
pub struct ProducerStates {
    producers: HashMap<i64, ProducerEntry>,
    /// The open transactions: first offset → producer id.
    ongoing: BTreeMap<i64, i64>,
}

/// `B.producers` (JSON): the state after every batch below `end_offset`.
#[derive(Serialize, Deserialize)]
struct Snapshot {
    format_version: u32,
    end_offset: i64,
    producers: Vec<SnapshotEntry>,
    /// Absent in snapshots written before the history was kept.
    #[serde(default)]
    leader_epochs: LeaderEpochs,
}

#[derive(Serialize, Deserialize)]
struct SnapshotEntry {
    producer_id: i64,
    epoch: i16,
    batches: Vec<BatchMetadata>,
    #[serde(default = "no_coordinator_epoch")]
    coordinator_epoch: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    txn_first_offset: Option<i64>,
    #[serde(default = "no_timestamp")]
    last_timestamp: i64,
}

fn no_coordinator_epoch() -> i32 {
    -1
}

fn no_timestamp() -> i64 {
    -1
}

impl ProducerStates {
    pub fn check(&self, h: &BatchHeader) -> Result<SequenceCheck, LogError> {
        if !h.has_producer_id() {
            return Ok(SequenceCheck::Append);
        }
        let Some(entry) = self.producers.get(&h.producer_id) else {
            // Unknown producer (new, or its state aged out): accept, as Kafka does since KIP-360.
            return Ok(SequenceCheck::Append);
        };
        if h.producer_epoch < entry.epoch {
            return Err(LogError::InvalidProducerEpoch {
                producer_id: h.producer_id,
                epoch: h.producer_epoch,
                current: entry.epoch,
            });
        }
        if entry.txn_first_offset.is_some() && !h.is_transactional() {
            return Err(LogError::InvalidTxnState {
                producer_id: h.producer_id,
            });
        }
        if h.producer_epoch > entry.epoch {
            return if h.base_sequence == 0 {
                Ok(SequenceCheck::Append)
            } else {
                Err(LogError::OutOfOrderSequence {
                    producer_id: h.producer_id,
                    expected: 0,
                    received: h.base_sequence,
                })
            };
        }
        if let Some(dup) = entry
            .batches
            .iter()
            .find(|b| b.first_sequence == h.base_sequence && b.last_sequence == h.last_sequence())
        {
            return Ok(SequenceCheck::Duplicate(*dup));
        }
        let expected = entry
            .batches
            .back()
            .map_or(0, |b| next_sequence(b.last_sequence));
        if entry.batches.is_empty() || h.base_sequence == expected {
            Ok(SequenceCheck::Append)
        } else {
            Err(LogError::OutOfOrderSequence {
                producer_id: h.producer_id,
                expected,
                received: h.base_sequence,
            })
        }
    }

    /// Checks a transaction marker before it is appended: the producer's
    /// epoch must not be older than the one the partition knows (Kafka
    /// answers INVALID_PRODUCER_EPOCH), nor the coordinator's epoch older
    /// than that of the last marker (TRANSACTION_COORDINATOR_FENCED).
    ///
    /// Under transactions v2 (`bumped`) the coordinator writes every marker
    /// one epoch above the transaction's data, so a marker at the epoch the
    /// partition already knows is late: a resend of one written already,
    /// arriving after the producer's next transaction began here at that
    /// epoch. Appending it would end that transaction early; it is refused.
    pub fn check_marker(
        &self,
        producer_id: i64,
        epoch: i16,
        coordinator_epoch: i32,
        bumped: bool,
    ) -> Result<(), LogError> {
        let Some(entry) = self.producers.get(&producer_id) else {
            return Ok(());
        };
        if epoch < entry.epoch || (bumped && epoch == entry.epoch) {
            return Err(LogError::InvalidProducerEpoch {
                producer_id,
                epoch,
                current: entry.epoch,
            });
        }
        if coordinator_epoch < entry.coordinator_epoch {
            return Err(LogError::CoordinatorFenced {
                producer_id,
                coordinator_epoch,
                current: entry.coordinator_epoch,
            });
        }
        Ok(())
    }

    /// Records an appended marker batch `h` saying `marker`: the producer's
    /// open transaction, if it wrote data here, is complete.
    pub fn record_marker(&mut self, h: &BatchHeader, marker: EndTxnMarker) -> Option<CompletedTxn> {
        let entry = self.producers.entry(h.producer_id).or_default();
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        entry.coordinator_epoch = marker.coordinator_epoch;
        entry.last_timestamp = h.max_timestamp;
        let first_offset = entry.txn_first_offset.take()?;
        self.ongoing.remove(&first_offset);
        Some(CompletedTxn {
            producer_id: h.producer_id,
            first_offset,
            last_offset: h.base_offset,
            commit: marker.commit,
        })
    }

    /// Whether producer `producer_id` at `epoch` has a transaction open
    /// here: its further batches need no word with the coordinator.
    pub fn in_transaction(&self, producer_id: i64, epoch: i16) -> bool {
        self.producers
            .get(&producer_id)
            .is_some_and(|e| e.epoch == epoch && e.txn_first_offset.is_some())
    }

    /// The first offset of the oldest open transaction: nothing at or past
    /// it is stable.
    pub fn first_unstable_offset(&self) -> Option<i64> {
        self.ongoing.keys().next().copied()
    }

    /// Every producer the partition knows, by id.
    pub fn describe(&self) -> Vec<ProducerInfo> {
        let mut out: Vec<ProducerInfo> = self
            .producers
            .iter()
            .map(|(id, e)| ProducerInfo {
                producer_id: *id,
                epoch: e.epoch,
                last_sequence: e.batches.back().map_or(-1, |b| b.last_sequence),
                last_timestamp: e.last_timestamp,
                coordinator_epoch: e.coordinator_epoch,
                txn_start_offset: e.txn_first_offset.unwrap_or(-1),
            })
            .collect();
        out.sort_unstable_by_key(|p| p.producer_id);
        out
    }

    /// Records an appended data batch (`h` carries its assigned base
    /// offset); a transactional one opens the producer's transaction here
    /// unless one is open.
    pub fn record(&mut self, h: &BatchHeader) {
        if !h.has_producer_id() || h.is_control() {
            return;
        }
        let entry = self.producers.entry(h.producer_id).or_default();
        if h.producer_epoch != entry.epoch {
            entry.epoch = h.producer_epoch;
            entry.batches.clear();
        }
        entry.last_timestamp = h.max_timestamp;
        if h.is_transactional() && entry.txn_first_offset.is_none() {
            entry.txn_first_offset = Some(h.base_offset);
            self.ongoing.insert(h.base_offset, h.producer_id);
        }
        entry.batches.push_back(BatchMetadata {
            first_sequence: h.base_sequence,
            last_sequence: h.last_sequence(),
            first_offset: h.base_offset,
            last_offset: h.last_offset(),
            max_timestamp: h.max_timestamp,
        });
        if entry.batches.len() > CACHED_BATCHES {
            entry.batches.pop_front();
        }
    }

    pub fn max_producer_id(&self) -> Option<i64> {
        self.producers.keys().copied().max()
    }

    /// The snapshot of this state and the leader epoch history, taken when
    /// every offset below `end_offset` is recorded.
    pub fn snapshot(&self, end_offset: i64, epochs: &LeaderEpochs) -> Result<Vec<u8>, LogError> {
        let mut producers: Vec<SnapshotEntry> = self
            .producers
            .iter()
            .map(|(id, e)| SnapshotEntry {
                producer_id: *id,
                epoch: e.epoch,
                batches: e.batches.iter().copied().collect(),
                coordinator_epoch: e.coordinator_epoch,
                txn_first_offset: e.txn_first_offset,
                last_timestamp: e.last_timestamp,
            })
            .collect();
        producers.sort_unstable_by_key(|e| e.producer_id);
        serde_json::to_vec(&Snapshot {
            format_version: SNAPSHOT_FORMAT_VERSION,
            end_offset,
            producers,
            leader_epochs: epochs.clone(),
        })
        .map_err(|e| LogError::Corrupt(e.to_string()))
    }

    /// The state in a snapshot, the offset it was taken at, and the leader
    /// epoch history up to there.
    pub fn from_snapshot(bytes: &[u8]) -> Result<Restored, LogError> {
        let s: Snapshot = serde_json::from_slice(bytes)
            .map_err(|e| LogError::Corrupt(format!("producer snapshot: {e}")))?;
        if s.format_version != SNAPSHOT_FORMAT_VERSION {
            return Err(LogError::Corrupt(format!(
                "producer snapshot format {} is not {SNAPSHOT_FORMAT_VERSION}",
                s.format_version
            )));
        }
        let ongoing = s
            .producers
            .iter()
            .filter_map(|e| Some((e.txn_first_offset?, e.producer_id)))
            .collect();
        let producers = s
            .producers
            .into_iter()
            .map(|e| {
                let entry = ProducerEntry {
                    epoch: e.epoch,
                    batches: e.batches.into_iter().collect(),
                    coordinator_epoch: e.coordinator_epoch,
                    txn_first_offset: e.txn_first_offset,
                    last_timestamp: e.last_timestamp,
                };
                (e.producer_id, entry)
            })
            .collect();
        Ok(Restored {
            end_offset: s.end_offset,
            producers: ProducerStates { producers, ongoing },
            epochs: s.leader_epochs,
        })
    }
}

/// What a snapshot holds.
#[derive(Debug, Default)]
pub struct Restored {
    pub end_offset: i64,
    pub producers: ProducerStates,
    pub epochs: LeaderEpochs,
}

fn next_sequence(s: i32) -> i32 {
    if s == i32::MAX {
        0
    } else {
        s + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(pid: i64, epoch: i16, seq: i32, count: i32, base_offset: i64) -> BatchHeader {
        BatchHeader {
            base_offset,
            size: 100,
            leader_epoch: 0,
            magic: 2,
            crc: 0,
            attributes: 0,
            last_offset_delta: count - 1,
            base_timestamp: 0,
            max_timestamp: 0,
            producer_id: pid,
            producer_epoch: epoch,
            base_sequence: seq,
            record_count: count,
        }
    }

    #[test]
    fn in_order_duplicate_and_gap() {
        let mut s = ProducerStates::default();
        let b0 = header(1, 0, 0, 5, 0);
        assert_eq!(s.check(&b0).unwrap(), SequenceCheck::Append);
        s.record(&b0);
        let b1 = header(1, 0, 5, 5, 5);
        assert_eq!(s.check(&b1).unwrap(), SequenceCheck::Append);
        s.record(&b1);
        match s.check(&header(1, 0, 0, 5, -1)).unwrap() {
            SequenceCheck::Duplicate(m) => assert_eq!((m.first_offset, m.last_offset), (0, 4)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            s.check(&header(1, 0, 20, 1, -1)),
            Err(LogError::OutOfOrderSequence { expected: 10, .. })
        ));
        assert!(matches!(
            s.check(&header(1, 0, 3, 1, -1)),
            Err(LogError::OutOfOrderSequence { .. })
        ));
    }

    #[test]
    fn epochs_fence_and_reset() {
        let mut s = ProducerStates::default();
        s.record(&header(1, 3, 0, 1, 0));
        assert!(matches!(
            s.check(&header(1, 2, 1, 1, -1)),
            Err(LogError::InvalidProducerEpoch { .. })
        ));
        assert!(matches!(
            s.check(&header(1, 4, 7, 1, -1)),
            Err(LogError::OutOfOrderSequence { .. })
        ));
        assert_eq!(
            s.check(&header(1, 4, 0, 1, -1)).unwrap(),
            SequenceCheck::Append
        );
    }

    #[test]
    fn snapshot_round_trip_keeps_epochs_sequences_and_offsets() {
        let mut s = ProducerStates::default();
        for i in 0..7 {
            s.record(&header(9, 2, i * 3, 3, 100 + i as i64 * 3));
        }
        s.record(&header(4, 0, 0, 1, 200));
        let mut epochs = LeaderEpochs::default();
        epochs.record(0, 0);
        epochs.record(3, 150);
        let restored = ProducerStates::from_snapshot(&s.snapshot(201, &epochs).unwrap()).unwrap();
        let (end, back) = (restored.end_offset, restored.producers);
        assert_eq!(end, 201);
        assert_eq!(restored.epochs, epochs);
        assert_eq!(back.max_producer_id(), Some(9));
        // The last batch is a duplicate with its original offsets; older
        // ones than the five kept are not, and the sequence goes on.
        match back.check(&header(9, 2, 18, 3, -1)).unwrap() {
            SequenceCheck::Duplicate(m) => assert_eq!((m.first_offset, m.last_offset), (118, 120)),
            other => panic!("{other:?}"),
        }
        assert!(matches!(
            back.check(&header(9, 2, 6, 3, -1)).unwrap(),
            SequenceCheck::Duplicate(_)
        ));
        assert!(back.check(&header(9, 2, 3, 3, -1)).is_err());
        assert_eq!(
            back.check(&header(9, 2, 21, 1, -1)).unwrap(),
            SequenceCheck::Append
        );
        assert!(matches!(
            back.check(&header(9, 1, 21, 1, -1)),
            Err(LogError::InvalidProducerEpoch { current: 2, .. })
        ));
        assert!(matches!(
            back.check(&header(4, 0, 5, 1, -1)),
            Err(LogError::OutOfOrderSequence { expected: 1, .. })
        ));
        assert!(ProducerStates::from_snapshot(b"{}").is_err());
    }

    #[test]
    fn a_snapshot_from_before_leader_epochs_reads_with_an_empty_history() {
        let old = br#"{"format_version":1,"end_offset":7,"producers":[]}"#;
        let restored = ProducerStates::from_snapshot(old).unwrap();
        assert_eq!(restored.end_offset, 7);
        assert!(restored.epochs.entries().is_empty());
    }

    fn txn(pid: i64, epoch: i16, seq: i32, count: i32, base_offset: i64) -> BatchHeader {
        BatchHeader {
            attributes: 1 << 4,
            ..header(pid, epoch, seq, count, base_offset)
        }
    }

    fn marker_at(pid: i64, epoch: i16, offset: i64) -> BatchHeader {
        BatchHeader {
            attributes: (1 << 4) | (1 << 5),
            base_sequence: -1,
            ..header(pid, epoch, -1, 1, offset)
        }
    }

    fn end(commit: bool, coordinator_epoch: i32) -> EndTxnMarker {
        EndTxnMarker {
            commit,
            coordinator_epoch,
        }
    }

    #[test]
    fn open_transactions_set_the_first_unstable_offset_until_their_marker() {
        let mut s = ProducerStates::default();
        s.record(&header(9, 0, 0, 2, 0));
        assert_eq!(s.first_unstable_offset(), None);
        s.record(&txn(1, 0, 0, 2, 2));
        s.record(&txn(2, 0, 0, 1, 4));
        s.record(&txn(1, 0, 2, 1, 5));
        assert_eq!(s.first_unstable_offset(), Some(2));
        // A plain batch inside the open transaction is refused.
        assert!(matches!(
            s.check(&header(1, 0, 3, 1, -1)),
            Err(LogError::InvalidTxnState { producer_id: 1 })
        ));
        assert_eq!(
            s.record_marker(&marker_at(1, 0, 6), end(false, 4)),
            Some(CompletedTxn {
                producer_id: 1,
                first_offset: 2,
                last_offset: 6,
                commit: false
            })
        );
        assert_eq!(s.first_unstable_offset(), Some(4));
        // A marker for a transaction without data here completes nothing.
        assert_eq!(s.record_marker(&marker_at(1, 0, 7), end(true, 4)), None);
        let described = s.describe();
        assert_eq!(described.len(), 3);
        assert_eq!(described[1].txn_start_offset, 4);
        assert_eq!(described[0].coordinator_epoch, 4);
        assert_eq!(described[0].last_sequence, 2);
        assert_eq!(
            s.record_marker(&marker_at(2, 0, 8), end(true, 4))
                .map(|t| t.commit),
            Some(true)
        );
        assert_eq!(s.first_unstable_offset(), None);
    }

    #[test]
    fn markers_from_older_producer_or_coordinator_epochs_are_refused() {
        let mut s = ProducerStates::default();
        assert!(
            s.check_marker(5, 0, 0, false).is_ok(),
            "unknown producers pass"
        );
        s.record(&txn(5, 2, 0, 1, 0));
        s.record_marker(&marker_at(5, 2, 1), end(true, 3));
        assert!(matches!(
            s.check_marker(5, 1, 3, false),
            Err(LogError::InvalidProducerEpoch { current: 2, .. })
        ));
        assert!(matches!(
            s.check_marker(5, 2, 2, false),
            Err(LogError::CoordinatorFenced { current: 3, .. })
        ));
        assert!(s.check_marker(5, 3, 3, false).is_ok());
        // A marker at a newer producer epoch (the coordinator's bump on
        // abort) resets the sequence: the next epoch starts anywhere.
        s.record_marker(&marker_at(5, 3, 2), end(false, 3));
        assert_eq!(
            s.check(&txn(5, 3, 0, 1, -1)).unwrap(),
            SequenceCheck::Append
        );
    }

    #[test]
    fn under_transactions_v2_a_marker_at_the_epoch_of_the_next_transaction_is_refused() {
        let mut s = ProducerStates::default();
        s.record(&txn(5, 2, 0, 1, 0));
        assert!(s.in_transaction(5, 2));
        assert!(!s.in_transaction(5, 3));
        assert!(s.check_marker(5, 3, 0, true).is_ok(), "one above the data");
        s.record_marker(&marker_at(5, 3, 1), end(true, 0));
        assert!(!s.in_transaction(5, 3));
        // The producer's next transaction begins at the bumped epoch...
        assert_eq!(
            s.check(&txn(5, 3, 0, 1, -1)).unwrap(),
            SequenceCheck::Append
        );
        s.record(&txn(5, 3, 0, 1, 2));
        // ...and a late copy of the marker must not end it; a late batch of
        // the previous transaction is fenced.
        assert!(matches!(
            s.check_marker(5, 3, 0, true),
            Err(LogError::InvalidProducerEpoch { current: 3, .. })
        ));
        assert!(
            s.check_marker(5, 3, 0, false).is_ok(),
            "v1 markers keep the epoch"
        );
        assert!(matches!(
            s.check(&txn(5, 2, 1, 1, -1)),
            Err(LogError::InvalidProducerEpoch { current: 3, .. })
        ));
    }

    #[test]
    fn a_snapshot_keeps_open_transactions_and_coordinator_epochs() {
        let mut s = ProducerStates::default();
        s.record(&txn(1, 0, 0, 2, 10));
        s.record(&txn(2, 1, 0, 2, 12));
        s.record_marker(&marker_at(2, 1, 14), end(false, 6));
        let back =
            ProducerStates::from_snapshot(&s.snapshot(15, &LeaderEpochs::default()).unwrap())
                .unwrap()
                .producers;
        assert_eq!(back.first_unstable_offset(), Some(10));
        assert_eq!(back.describe(), s.describe());
        assert!(matches!(
            back.check_marker(2, 1, 5, false),
            Err(LogError::CoordinatorFenced { .. })
        ));
        let mut back = back;
        assert_eq!(
            back.record_marker(&marker_at(1, 0, 15), end(false, 6))
                .map(|t| t.first_offset),
            Some(10)
        );
        assert_eq!(back.first_unstable_offset(), None);
    }

    #[test]
    fn only_last_five_are_remembered() {
        let mut s = ProducerStates::default();
        for i in 0..7 {
            s.record(&header(9, 0, i, 1, i as i64));
        }
        assert!(matches!(
            s.check(&header(9, 0, 2, 1, -1)).unwrap(),
            SequenceCheck::Duplicate(_)
        ));
        assert!(s.check(&header(9, 0, 1, 1, -1)).is_err());
    }
}
