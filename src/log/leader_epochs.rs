//! The leader epoch history of a partition: at which offset each leader
//! epoch began (Kafka's `leader-epoch-checkpoint`).
//!
//! A consumer that remembers "offset O, read in epoch E" asks the leader
//! (OffsetForLeaderEpoch) where epoch E ended; an end below O would mean the
//! log it read from was truncated. Strata never truncates, but clients still
//! ask, and the answer must be right across failovers.
//!
//! Every stamped batch carries its epoch, so the history is derived from the
//! batches themselves: an append or a recovered batch whose epoch is newer
//! than the last one begins an entry. Rather than a file of its own it rides
//! in the producer snapshot that every sealed segment gets and that travels
//! with the segment to the store: opening a partition starts from the newest
//! snapshot and replays the batch headers after it, and a restore or a
//! takeover starts from the last tiered segment's snapshot and appends the
//! head from the write-ahead log, whose batches carry their epochs. The
//! current leader's epoch needs no entry until it appends: it is treated as
//! beginning at the log end.
//!
//! When the log start moves (DeleteRecords, retention), entries wholly below
//! it go and the oldest left is moved up to it, as Kafka does, which keeps
//! the history small; offsets themselves never change.

use serde::{Deserialize, Serialize};

/// Kafka's UNDEFINED_EPOCH and UNDEFINED_EPOCH_OFFSET.
pub(crate) const UNDEFINED: (i32, i64) = (-1, -1);

/// One leader epoch and the first offset written in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct EpochStart {
    pub epoch: i32,
    pub start_offset: i64,
}

/// Epochs in increasing order, with increasing start offsets.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct LeaderEpochs(Vec<EpochStart>);

impl LeaderEpochs {
    /// Notes a batch stamped `epoch` at `offset`: a newer epoch begins
    /// there. An older or unstamped one changes nothing (Kafka ignores them
    /// too; epochs only grow along the log).
    pub fn record(&mut self, epoch: i32, offset: i64) {
        if epoch < 0 || self.0.last().is_some_and(|l| l.epoch >= epoch) {
            return;
        }
        self.0.push(EpochStart {
            epoch,
            start_offset: offset,
        });
    }

    /// Forgets what lies below the log start `start`: entries starting at
    /// or below it go, except that the newest of them stays, moved up to
    /// `start` (Kafka's `truncateFromStart`).
    pub fn truncate_from_start(&mut self, start: i64) {
        let below = self.0.partition_point(|e| e.start_offset <= start);
        if below == 0 {
            return;
        }
        self.0.drain(..below - 1);
        self.0[0].start_offset = start;
    }

    pub fn entries(&self) -> &[EpochStart] {
        &self.0
    }

    /// Kafka's answer to OffsetForLeaderEpoch: the largest epoch at most
    /// `requested` and the offset where the next epoch began, or the log end
    /// for the newest epoch. `current` is the epoch the leader serves at
    /// (it begins at `log_end` if nothing was written in it yet). An epoch
    /// older than the whole history gets itself and the start of the oldest
    /// epoch known; one newer than any, or -1, gets [`UNDEFINED`].
    pub fn end_offset_for(&self, requested: i32, current: i32, log_end: i64) -> (i32, i64) {
        let last = self.0.last().map(|e| e.epoch);
        let current = (current >= 0 && last.is_none_or(|l| current > l)).then_some(EpochStart {
            epoch: current,
            start_offset: log_end,
        });
        let epochs = || self.0.iter().chain(current.as_ref());
        if requested < 0 {
            return UNDEFINED;
        }
        if epochs().last().is_some_and(|e| e.epoch == requested) {
            return (requested, log_end);
        }
        let Some(next) = epochs().find(|e| e.epoch > requested) else {
            return UNDEFINED;
        };
        match epochs().take_while(|e| e.epoch <= requested).last() {
            Some(floor) => (floor.epoch, next.start_offset),
            None => (requested, next.start_offset),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn history(entries: &[(i32, i64)]) -> LeaderEpochs {
        let mut h = LeaderEpochs::default();
        for &(epoch, offset) in entries {
            h.record(epoch, offset);
        }
        h
    }

    #[test]
    fn only_a_newer_epoch_begins_an_entry() {
        let h = history(&[(0, 0), (0, 5), (-1, 7), (2, 10), (1, 12), (2, 15), (4, 20)]);
        let starts: Vec<(i32, i64)> = h
            .entries()
            .iter()
            .map(|e| (e.epoch, e.start_offset))
            .collect();
        assert_eq!(starts, [(0, 0), (2, 10), (4, 20)]);
    }

    #[test]
    fn an_epoch_ends_where_the_next_began_and_the_newest_at_the_log_end() {
        let h = history(&[(1, 0), (3, 100), (6, 250)]);
        // Leader at epoch 6, log end 300.
        let at = |epoch| h.end_offset_for(epoch, 6, 300);
        assert_eq!(at(1), (1, 100));
        assert_eq!(at(3), (3, 250));
        assert_eq!(at(6), (6, 300));
        // An epoch that wrote nothing: the largest one below it, ending
        // where the next that did began.
        assert_eq!(at(2), (1, 100));
        assert_eq!(at(5), (3, 250));
        // Older than anything known: itself, ending where history begins.
        assert_eq!(at(0), (0, 0));
        // Newer than the leader's, or undefined.
        assert_eq!(at(7), UNDEFINED);
        assert_eq!(at(-1), UNDEFINED);
    }

    #[test]
    fn a_leader_that_wrote_nothing_yet_ends_the_previous_epoch_at_the_log_end() {
        let h = history(&[(1, 0), (3, 100)]);
        // Taken over at epoch 5 with the log ending at 180.
        assert_eq!(h.end_offset_for(3, 5, 180), (3, 180));
        assert_eq!(h.end_offset_for(4, 5, 180), (3, 180));
        assert_eq!(h.end_offset_for(5, 5, 180), (5, 180));
        assert_eq!(h.end_offset_for(6, 5, 180), UNDEFINED);
        // A single broker with an empty log: epoch 0 ends at the log end.
        let empty = LeaderEpochs::default();
        assert_eq!(empty.end_offset_for(0, 0, 0), (0, 0));
        assert_eq!(empty.end_offset_for(1, 0, 0), UNDEFINED);
    }

    #[test]
    fn a_moved_log_start_keeps_the_epoch_holding_it() {
        let mut h = history(&[(1, 0), (3, 100), (6, 250)]);
        h.truncate_from_start(50);
        assert_eq!(h, history(&[(1, 50), (3, 100), (6, 250)]));
        h.truncate_from_start(100);
        assert_eq!(h, history(&[(3, 100), (6, 250)]));
        h.truncate_from_start(260);
        assert_eq!(h, history(&[(6, 260)]));
        // An epoch that ended below the log start ends there now.
        assert_eq!(h.end_offset_for(3, 6, 300), (3, 260));
        assert_eq!(h.end_offset_for(6, 6, 300), (6, 300));
        let mut empty = LeaderEpochs::default();
        empty.truncate_from_start(10);
        assert!(empty.entries().is_empty());
    }

    #[test]
    fn serializes_as_a_plain_list() {
        let h = history(&[(1, 0), (3, 100)]);
        let json = serde_json::to_string(&h).unwrap();
        assert_eq!(
            json,
            r#"[{"epoch":1,"start_offset":0},{"epoch":3,"start_offset":100}]"#
        );
        assert_eq!(serde_json::from_str::<LeaderEpochs>(&json).unwrap(), h);
    }
}
