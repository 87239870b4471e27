//! The share coordinator's state: each share-partition's persisted state,
//! as `__share_group_state` holds it (Kafka's ShareCoordinatorShard).
//!
//! The broker leading a partition keeps its share-partitions in memory
//! (`share_partition`) and writes each change here before it answers; a new
//! leader reads the state back. Epochs fence the writers: a write or read
//! with a leader epoch older than the last one seen is refused, so a deposed
//! leader cannot overwrite its successor's state, and the state epoch fences
//! writes from before the state was initialized again (an offsets reset).
//!
//! Every change is one record, a full ShareSnapshot or a ShareUpdate of the
//! batches that changed; after `updates_per_snapshot` updates the next
//! write is a snapshot again, so replay stays short. Pure: the caller
//! appends the records and feeds replay through `apply`.

use std::collections::HashMap;

use bytes::Bytes;

use super::share_partition::StateBatch;
use super::share_records::{combine, ShareKey, ShareRecordKey, ShareStateValue};

/// Errors, each the code of the same name in the state APIs' answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum StateError {
    #[error("{0}")]
    InvalidRequest(String),
    #[error("the leader epoch is older than the share-partition's")]
    FencedLeaderEpoch,
    #[error("the state epoch is older than the share-partition's")]
    FencedStateEpoch,
}

/// What a new leader reads back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ReadState {
    pub state_epoch: i32,
    pub start_offset: i64,
    pub batches: Vec<StateBatch>,
}

/// A write: the start offset when it was made, and the batches it changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Write {
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    pub delivery_complete_count: i32,
    pub batches: Vec<StateBatch>,
}

/// ReadShareGroupStateSummary: where a share-partition starts and how
/// many records above that are done with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    pub start_offset: i64,
    pub delivery_complete_count: i32,
    pub leader_epoch: i32,
    pub state_epoch: i32,
}

#[derive(Debug, Clone)]
struct Entry {
    value: ShareStateValue,
    updates: usize,
}

pub(crate) type Record = (ShareRecordKey, Option<Bytes>);

pub(crate) struct ShareStates {
    entries: HashMap<ShareKey, Entry>,
    updates_per_snapshot: usize,
}

impl ShareStates {
    pub(crate) fn new(updates_per_snapshot: usize) -> ShareStates {
        ShareStates {
            entries: HashMap::new(),
            updates_per_snapshot,
        }
    }

    /// InitializeShareGroupState: a fresh state at `start` (-1: not known yet).
    pub(crate) fn initialize(
        &mut self,
        key: &ShareKey,
        state_epoch: i32,
        start: i64,
        now_ms: i64,
    ) -> Result<Record, StateError> {
        if key.partition < 0 || state_epoch < 0 {
            return Err(StateError::InvalidRequest("Invalid request.".into()));
        }
        let old = self.entries.get(key);
        if old.is_some_and(|e| e.value.state_epoch > state_epoch) {
            return Err(StateError::FencedStateEpoch);
        }
        let value = ShareStateValue {
            snapshot_epoch: old.map_or(0, |e| e.value.snapshot_epoch + 1),
            state_epoch,
            leader_epoch: 0,
            start_offset: start,
            delivery_complete_count: if start == -1 { -1 } else { 0 },
            create_timestamp: now_ms,
            write_timestamp: now_ms,
            batches: Vec::new(),
        };
        let record = (
            ShareRecordKey::Snapshot(key.clone()),
            Some(value.encode(true)),
        );
        self.apply(&record);
        Ok(record)
    }

    /// ReadShareGroupState. A newer leader epoch is remembered (a record
    /// with no batches), which fences the leaders before it.
    pub(crate) fn read(
        &mut self,
        key: &ShareKey,
        leader_epoch: i32,
        now_ms: i64,
    ) -> Result<(ReadState, Option<Record>), StateError> {
        let Some(e) = self.entries.get(key) else {
            return Err(StateError::InvalidRequest(
                "Read operation on uninitialized share partition not allowed.".into(),
            ));
        };
        if e.value.leader_epoch > leader_epoch {
            return Err(StateError::FencedLeaderEpoch);
        }
        let read = ReadState {
            state_epoch: e.value.state_epoch,
            start_offset: e.value.start_offset,
            batches: e.value.batches.clone(),
        };
        if e.value.leader_epoch == leader_epoch {
            return Ok((read, None));
        }
        let write = Write {
            state_epoch: e.value.state_epoch,
            leader_epoch,
            start_offset: -1,
            delivery_complete_count: e.value.delivery_complete_count,
            batches: Vec::new(),
        };
        let record = self.write(key, &write, now_ms)?;
        Ok((read, Some(record)))
    }

    /// WriteShareGroupState.
    pub(crate) fn write(
        &mut self,
        key: &ShareKey,
        w: &Write,
        now_ms: i64,
    ) -> Result<Record, StateError> {
        let Some(e) = self.entries.get(key) else {
            return Err(StateError::InvalidRequest(
                "Write operation on uninitialized share partition not allowed.".into(),
            ));
        };
        let cur = &e.value;
        if cur.leader_epoch > w.leader_epoch {
            return Err(StateError::FencedLeaderEpoch);
        }
        if cur.state_epoch > w.state_epoch {
            return Err(StateError::FencedStateEpoch);
        }
        let start = w.start_offset.max(cur.start_offset);
        let dcc = match w.start_offset.cmp(&cur.start_offset) {
            std::cmp::Ordering::Equal => w.delivery_complete_count.max(cur.delivery_complete_count),
            std::cmp::Ordering::Less => cur.delivery_complete_count,
            std::cmp::Ordering::Greater => w.delivery_complete_count,
        };
        let record = if e.updates >= self.updates_per_snapshot {
            let value = ShareStateValue {
                snapshot_epoch: cur.snapshot_epoch + 1,
                state_epoch: cur.state_epoch,
                leader_epoch: w.leader_epoch,
                start_offset: start,
                delivery_complete_count: dcc,
                create_timestamp: now_ms,
                write_timestamp: now_ms,
                batches: combine(&cur.batches, &w.batches, start),
            };
            (
                ShareRecordKey::Snapshot(key.clone()),
                Some(value.encode(true)),
            )
        } else {
            let value = ShareStateValue {
                snapshot_epoch: cur.snapshot_epoch,
                state_epoch: -1,
                leader_epoch: w.leader_epoch,
                start_offset: start,
                delivery_complete_count: dcc,
                create_timestamp: -1,
                write_timestamp: -1,
                batches: combine(&[], &w.batches, start),
            };
            (
                ShareRecordKey::Update(key.clone()),
                Some(value.encode(false)),
            )
        };
        self.apply(&record);
        Ok(record)
    }

    pub(crate) fn summary(&self, key: &ShareKey) -> Option<Summary> {
        self.entries.get(key).map(|e| Summary {
            start_offset: e.value.start_offset,
            delivery_complete_count: e.value.delivery_complete_count,
            leader_epoch: e.value.leader_epoch,
            state_epoch: e.value.state_epoch,
        })
    }

    /// The state epoch an operator's reset is written at: above every
    /// epoch the share-partition had, so its leader's next write is fenced.
    pub(crate) fn next_state_epoch(&self, key: &ShareKey) -> i32 {
        self.entries.get(key).map_or(0, |e| e.value.state_epoch + 1)
    }

    /// DeleteShareGroupState: a snapshot tombstone, if there was a state.
    pub(crate) fn delete(&mut self, key: &ShareKey) -> Option<Record> {
        self.entries.remove(key)?;
        Some((ShareRecordKey::Snapshot(key.clone()), None))
    }

    /// Replays one record (of replay, or just written).
    pub(crate) fn apply(&mut self, (key, value): &Record) {
        match (key, value) {
            (ShareRecordKey::Snapshot(k), None) => {
                self.entries.remove(k);
            }
            (ShareRecordKey::Snapshot(k), Some(v)) => {
                if let Ok(value) = ShareStateValue::decode(v, true) {
                    self.entries.insert(k.clone(), Entry { value, updates: 0 });
                }
            }
            (ShareRecordKey::Update(k), Some(v)) => {
                let (Some(e), Ok(u)) = (self.entries.get_mut(k), ShareStateValue::decode(v, false))
                else {
                    return;
                };
                let start = match u.start_offset {
                    -1 => e.value.start_offset,
                    s => s,
                };
                e.value.batches = combine(&e.value.batches, &u.batches, start);
                e.value.start_offset = start;
                if u.leader_epoch != -1 {
                    e.value.leader_epoch = u.leader_epoch;
                }
                e.value.delivery_complete_count = u.delivery_complete_count;
                e.updates += 1;
            }
            (ShareRecordKey::Update(_), None) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::share_partition::RecordState;
    use uuid::Uuid;

    fn key() -> ShareKey {
        ShareKey {
            group: "g".into(),
            topic_id: Uuid::from_u128(1),
            partition: 0,
        }
    }

    fn batch(first: i64, last: i64, state: RecordState, count: i16) -> StateBatch {
        StateBatch {
            first,
            last,
            state,
            delivery_count: count,
        }
    }

    fn write(leader_epoch: i32, start: i64, batches: Vec<StateBatch>) -> Write {
        Write {
            state_epoch: 0,
            leader_epoch,
            start_offset: start,
            delivery_complete_count: -1,
            batches,
        }
    }

    #[test]
    fn writes_accumulate_and_replay_to_the_same_state() {
        let mut s = ShareStates::new(2);
        let mut log = vec![s.initialize(&key(), 0, 0, 1).unwrap()];
        for (i, w) in [
            write(1, 0, vec![batch(0, 4, RecordState::Acknowledged, 1)]),
            write(1, 5, vec![batch(5, 6, RecordState::Available, 1)]),
            write(1, 5, vec![batch(7, 7, RecordState::Archived, 3)]),
        ]
        .iter()
        .enumerate()
        {
            log.push(s.write(&key(), w, 10 + i as i64).unwrap());
        }
        // The third write came after two updates: a snapshot.
        assert!(matches!(log.last().unwrap().0, ShareRecordKey::Snapshot(_)));
        let (read, _) = s.read(&key(), 1, 20).unwrap();
        assert_eq!(read.start_offset, 5);
        assert_eq!(
            read.batches,
            vec![
                batch(5, 6, RecordState::Available, 1),
                batch(7, 7, RecordState::Archived, 3)
            ]
        );
        let mut replayed = ShareStates::new(2);
        for r in &log {
            replayed.apply(r);
        }
        assert_eq!(replayed.read(&key(), 1, 20).unwrap().0, read);
    }

    #[test]
    fn a_deposed_leader_is_fenced_once_a_newer_one_read() {
        let mut s = ShareStates::new(500);
        s.initialize(&key(), 0, 0, 1).unwrap();
        s.write(&key(), &write(1, 0, vec![]), 2).unwrap();
        let (_, fence) = s.read(&key(), 2, 3).unwrap();
        assert!(fence.is_some(), "a newer leader epoch is written down");
        assert_eq!(
            s.write(&key(), &write(1, 0, vec![]), 4).unwrap_err(),
            StateError::FencedLeaderEpoch
        );
        assert!(matches!(
            s.read(
                &ShareKey {
                    partition: 9,
                    ..key()
                },
                2,
                5
            ),
            Err(StateError::InvalidRequest(_))
        ));
        assert!(s.delete(&key()).is_some());
        assert!(s.delete(&key()).is_none());
    }

    #[test]
    fn an_operator_reset_fences_the_leader_writing_the_old_state() {
        let mut s = ShareStates::new(0);
        s.initialize(&key(), 0, 0, 1).unwrap();
        s.write(
            &key(),
            &write(1, 0, vec![batch(0, 4, RecordState::Acknowledged, 1)]),
            2,
        )
        .unwrap();
        let epoch = s.next_state_epoch(&key());
        assert_eq!(epoch, 1);
        s.initialize(&key(), epoch, 2, 3).unwrap();
        let summary = s.summary(&key()).unwrap();
        assert_eq!((summary.start_offset, summary.state_epoch), (2, 1));
        // The leader still writes at state epoch 0.
        assert_eq!(
            s.write(&key(), &write(1, 5, vec![]), 4),
            Err(StateError::FencedStateEpoch)
        );
    }
}
