//! One share-partition (KIP-932): a partition as a share group consumes it.
//!
//! A consumer group gives each partition to one member and remembers one
//! offset. A share group lets any number of members read a partition and
//! remembers each *record*: it is available, acquired by a member (under a
//! lock that expires), acknowledged, or archived. The records between the
//! share-partition start offset (everything before it is done with) and the
//! end of what was ever handed out are *in flight*; their number is capped
//! (`group.share.partition.max.record.locks`), which is what keeps a
//! share-partition's state small enough to hold per record here.
//!
//! A record handed out counts a delivery. Released, or not acknowledged
//! before its lock expires, it becomes available again, unless it has been
//! delivered `group.share.delivery.count.limit` times: then it is archived,
//! so a poison message stops coming back. When the records at the start are
//! all acknowledged or archived the start offset moves past them.
//!
//! Acquiring is not persisted (a restart makes acquired records available
//! again, which at-least-once allows); every other change comes back as the
//! state batches that changed, for the caller to write to
//! `__share_group_state` before it answers, and `restore` rebuilds the
//! share-partition from what was written. Time is passed in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// The group settings a share-partition follows.
#[derive(Debug, Clone)]
pub struct ShareSettings {
    /// group.share.record.lock.duration.ms (share.record.lock.duration.ms).
    pub lock_duration: Duration,
    /// group.share.delivery.count.limit.
    pub delivery_count_limit: i16,
    /// group.share.partition.max.record.locks: most records in flight.
    pub max_in_flight: i64,
    /// share.renew.acknowledge.enable (KIP-1222).
    pub renew_enabled: bool,
    /// share.isolation.level=read_committed: only committed records, and
    /// never those of aborted transactions.
    pub read_committed: bool,
}

impl Default for ShareSettings {
    /// Kafka's defaults.
    fn default() -> Self {
        ShareSettings {
            lock_duration: Duration::from_millis(30_000),
            delivery_count_limit: 5,
            max_in_flight: 2000,
            renew_enabled: true,
            read_committed: false,
        }
    }
}

/// A record's state, with Kafka's codes (`DeliveryState` in the state records).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecordState {
    Available,
    Acquired,
    Acknowledged,
    Archived,
}

impl RecordState {
    pub(crate) fn code(self) -> i8 {
        match self {
            RecordState::Available => 0,
            RecordState::Acquired => 1,
            RecordState::Acknowledged => 2,
            RecordState::Archived => 4,
        }
    }

    pub(crate) fn from_code(code: i8) -> Option<RecordState> {
        match code {
            0 => Some(RecordState::Available),
            1 => Some(RecordState::Acquired),
            2 => Some(RecordState::Acknowledged),
            // 3 is ARCHIVING, on the way to a dead-letter topic.
            3 | 4 => Some(RecordState::Archived),
            _ => None,
        }
    }

    fn is_terminal(self) -> bool {
        matches!(self, RecordState::Acknowledged | RecordState::Archived)
    }
}

/// AcknowledgeTypes of ShareFetch and ShareAcknowledge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AckType {
    /// No record at this offset (a compacted gap, a control record).
    Gap,
    Accept,
    Release,
    Reject,
    /// Keep it, and start its lock over (KIP-1222).
    Renew,
}

impl AckType {
    pub(crate) fn from_code(code: i8) -> Option<AckType> {
        match code {
            0 => Some(AckType::Gap),
            1 => Some(AckType::Accept),
            2 => Some(AckType::Release),
            3 => Some(AckType::Reject),
            4 => Some(AckType::Renew),
            _ => None,
        }
    }
}

/// A range of offsets acknowledged alike: one type for all, or one per offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AckBatch {
    pub first: i64,
    pub last: i64,
    pub types: Vec<AckType>,
}

impl AckBatch {
    fn type_of(&self, offset: i64) -> AckType {
        match self.types.len() {
            1 => self.types[0],
            _ => self.types[(offset - self.first) as usize],
        }
    }
}

/// Offsets handed to a member, and how often they have been delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Acquired {
    pub first: i64,
    pub last: i64,
    pub delivery_count: i16,
}

/// A run of offsets in one state, as `__share_group_state` holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StateBatch {
    pub first: i64,
    pub last: i64,
    pub state: RecordState,
    pub delivery_count: i16,
}

/// Why an acknowledgement is refused (Kafka's codes, the API layer's to map).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum AckError {
    /// INVALID_RECORD_STATE.
    #[error("{0}")]
    InvalidRecordState(String),
    /// INVALID_REQUEST.
    #[error("{0}")]
    InvalidRequest(String),
}

#[derive(Debug, Clone)]
struct InFlight {
    state: RecordState,
    delivery_count: i16,
    /// The member holding it while acquired.
    member: Option<std::sync::Arc<str>>,
    lock_until: Option<Instant>,
}

#[derive(Debug, Clone)]
pub(crate) struct SharePartition {
    /// Every offset below is done with (the share-partition start offset).
    start: i64,
    /// One past the last offset ever handed out.
    end: i64,
    /// Offsets in [start, end) that were handed out; a gap in the map is an
    /// offset that will not be (archived when the start moved past it).
    records: BTreeMap<i64, InFlight>,
}

impl SharePartition {
    /// A share-partition nobody has read yet, starting at `start` (from
    /// `share.auto.offset.reset`).
    pub(crate) fn new(start: i64) -> SharePartition {
        SharePartition {
            start,
            end: start,
            records: BTreeMap::new(),
        }
    }

    /// Rebuilds it from its persisted start offset and state batches.
    /// Acquisitions are not persisted, so nothing comes back acquired, and
    /// offsets between the batches are available, never delivered.
    pub(crate) fn restore(start: i64, batches: &[StateBatch]) -> SharePartition {
        let mut p = SharePartition::new(start);
        for b in batches {
            for offset in b.first.max(start)..=b.last {
                let state = match b.state {
                    RecordState::Acquired => RecordState::Available,
                    s => s,
                };
                p.records.insert(
                    offset,
                    InFlight {
                        state,
                        delivery_count: b.delivery_count,
                        member: None,
                        lock_until: None,
                    },
                );
                p.end = p.end.max(offset + 1);
            }
        }
        for offset in start..p.end {
            p.records.entry(offset).or_insert(InFlight {
                state: RecordState::Available,
                delivery_count: 0,
                member: None,
                lock_until: None,
            });
        }
        p.advance();
        p
    }

    pub(crate) fn start(&self) -> i64 {
        self.start
    }

    /// Records acknowledged or archived since the start (DeliveryCompleteCount).
    pub(crate) fn delivery_complete_count(&self) -> i32 {
        self.records
            .values()
            .filter(|r| r.state.is_terminal())
            .count() as i32
    }

    /// Where a fetch for this share-partition reads from: the first record
    /// available again, else the first never handed out.
    pub(crate) fn next_fetch_offset(&self) -> i64 {
        self.records
            .iter()
            .find(|(_, r)| r.state == RecordState::Available)
            .map_or(self.end, |(o, _)| *o)
    }

    /// Whether an acquire could hand anything out, given the log's
    /// readable end (high watermark or last stable offset).
    pub(crate) fn can_acquire(&self, readable_end: i64, s: &ShareSettings) -> bool {
        let redeliverable = self
            .records
            .values()
            .any(|r| r.state == RecordState::Available);
        redeliverable || (self.end < readable_end && self.end - self.start < s.max_in_flight)
    }

    /// Hands up to `max_records` records to `member`: available ones first,
    /// then new ones, within the in-flight cap. The caller read the log from
    /// `next_fetch_offset` and `fetched_end` is one past the last offset it
    /// got: only records whose bytes go back with the answer may be handed
    /// out (the client takes a missing one for a gap and archives it).
    /// `skip` are ranges not to deliver (aborted transactions under
    /// read_committed): they are archived instead.
    pub(crate) fn acquire(
        &mut self,
        member: &str,
        now: Instant,
        max_records: i64,
        fetched_end: i64,
        skip: &[(i64, i64)],
        s: &ShareSettings,
    ) -> Vec<Acquired> {
        if self.end < self.start {
            self.end = self.start;
        }
        let skipped = |o: i64| skip.iter().any(|(f, l)| (*f..=*l).contains(&o));
        let mut taken: Vec<(i64, i16)> = Vec::new();
        let lock_until = Some(now + s.lock_duration);
        let holder: std::sync::Arc<str> = member.into();
        let again: Vec<i64> = self
            .records
            .iter()
            .filter(|(o, r)| r.state == RecordState::Available && **o < fetched_end)
            .map(|(o, _)| *o)
            .collect();
        for o in again {
            if taken.len() as i64 >= max_records {
                break;
            }
            let r = self.records.get_mut(&o).expect("present");
            if skipped(o) {
                r.state = RecordState::Archived;
                continue;
            }
            r.state = RecordState::Acquired;
            r.delivery_count += 1;
            r.member = Some(holder.clone());
            r.lock_until = lock_until;
            taken.push((o, r.delivery_count));
        }
        while (taken.len() as i64) < max_records
            && self.end < fetched_end
            && self.end - self.start < s.max_in_flight
        {
            let o = self.end;
            self.end += 1;
            let r = match skipped(o) {
                true => InFlight {
                    state: RecordState::Archived,
                    delivery_count: 0,
                    member: None,
                    lock_until: None,
                },
                false => {
                    taken.push((o, 1));
                    InFlight {
                        state: RecordState::Acquired,
                        delivery_count: 1,
                        member: Some(holder.clone()),
                        lock_until,
                    }
                }
            };
            self.records.insert(o, r);
        }
        self.advance();
        let mut out: Vec<Acquired> = Vec::new();
        for (o, count) in taken {
            match out.last_mut() {
                Some(a) if a.last + 1 == o && a.delivery_count == count => a.last = o,
                _ => out.push(Acquired {
                    first: o,
                    last: o,
                    delivery_count: count,
                }),
            }
        }
        out
    }

    /// Applies a member's acknowledgements, all or nothing; returns the
    /// state batches to persist. Offsets below the start are already done
    /// with and skipped.
    pub(crate) fn acknowledge(
        &mut self,
        member: &str,
        now: Instant,
        batches: &[AckBatch],
        s: &ShareSettings,
    ) -> Result<Vec<StateBatch>, AckError> {
        let invalid_state = |m: &str| Err(AckError::InvalidRecordState(m.to_string()));
        for b in batches {
            if b.last >= self.end {
                return Err(AckError::InvalidRequest(
                    "The last offset in request is past acquired records.".into(),
                ));
            }
            for o in b.first.max(self.start)..=b.last {
                let Some(r) = self.records.get(&o) else {
                    return invalid_state("The request batch offsets are not found in the cache.");
                };
                if r.state != RecordState::Acquired {
                    return invalid_state("The record is not in the acquired state.");
                }
                if r.member.as_deref() != Some(member) {
                    return invalid_state("Member is not the owner of batch record");
                }
                if b.type_of(o) == AckType::Renew && !s.renew_enabled {
                    return invalid_state(
                        "Renewing acquisition locks is not enabled for the group.",
                    );
                }
            }
        }
        let mut changed = Vec::new();
        for b in batches {
            for o in b.first.max(self.start)..=b.last {
                let r = self.records.get_mut(&o).expect("checked");
                let state = match b.type_of(o) {
                    AckType::Renew => {
                        r.lock_until = Some(now + s.lock_duration);
                        continue;
                    }
                    AckType::Accept => RecordState::Acknowledged,
                    AckType::Gap | AckType::Reject => RecordState::Archived,
                    AckType::Release if r.delivery_count >= s.delivery_count_limit => {
                        RecordState::Archived
                    }
                    AckType::Release => RecordState::Available,
                };
                Self::settle(r, state);
                changed.push(o);
            }
        }
        let out = self.batches_of(&changed);
        self.advance();
        Ok(out)
    }

    /// Locks that ran out: their records are available again (or archived
    /// at the delivery limit). Returns the batches to persist.
    pub(crate) fn expire_locks(&mut self, now: Instant, s: &ShareSettings) -> Vec<StateBatch> {
        self.release_where(s, |r| r.lock_until.is_some_and(|t| now >= t))
    }

    /// A member's share session ended: what it holds is available again.
    pub(crate) fn release_member(&mut self, member: &str, s: &ShareSettings) -> Vec<StateBatch> {
        self.release_where(s, |r| r.member.as_deref() == Some(member))
    }

    /// The earliest lock deadline, for the caller's timer.
    pub(crate) fn next_lock_deadline(&self) -> Option<Instant> {
        self.records.values().filter_map(|r| r.lock_until).min()
    }

    /// The log's start moved (retention, DeleteRecords): what is gone is
    /// archived unread.
    pub(crate) fn log_start_moved(&mut self, log_start: i64) {
        if log_start <= self.start {
            return;
        }
        self.records = self.records.split_off(&log_start);
        self.start = log_start;
        self.end = self.end.max(log_start);
        self.advance();
    }

    /// The whole state, for a snapshot.
    pub(crate) fn state_batches(&self) -> Vec<StateBatch> {
        let offsets: Vec<i64> = self.records.keys().copied().collect();
        self.batches_of(&offsets)
    }

    fn release_where(
        &mut self,
        s: &ShareSettings,
        which: impl Fn(&InFlight) -> bool,
    ) -> Vec<StateBatch> {
        let mut changed = Vec::new();
        for (o, r) in self.records.iter_mut() {
            if r.state != RecordState::Acquired || !which(r) {
                continue;
            }
            let state = match r.delivery_count >= s.delivery_count_limit {
                true => RecordState::Archived,
                false => RecordState::Available,
            };
            Self::settle(r, state);
            changed.push(*o);
        }
        let out = self.batches_of(&changed);
        self.advance();
        out
    }

    fn settle(r: &mut InFlight, state: RecordState) {
        r.state = state;
        r.member = None;
        r.lock_until = None;
    }

    /// Runs of consecutive `offsets` (ascending) with one state and count.
    fn batches_of(&self, offsets: &[i64]) -> Vec<StateBatch> {
        let mut out: Vec<StateBatch> = Vec::new();
        for o in offsets {
            let r = &self.records[o];
            // Acquiring is not persisted: an acquired record is written as it
            // was before, available with one delivery less.
            let (state, count) = match r.state {
                RecordState::Acquired => (RecordState::Available, r.delivery_count - 1),
                s => (s, r.delivery_count),
            };
            match out.last_mut() {
                Some(b) if b.last + 1 == *o && b.state == state && b.delivery_count == count => {
                    b.last = *o
                }
                _ => out.push(StateBatch {
                    first: *o,
                    last: *o,
                    state,
                    delivery_count: count,
                }),
            }
        }
        out
    }

    /// Moves the start past acknowledged and archived records.
    fn advance(&mut self) {
        while self.start < self.end {
            match self.records.get(&self.start) {
                Some(r) if r.state.is_terminal() => {
                    self.records.remove(&self.start);
                    self.start += 1;
                }
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> ShareSettings {
        ShareSettings {
            lock_duration: Duration::from_secs(30),
            delivery_count_limit: 3,
            max_in_flight: 100,
            renew_enabled: true,
            read_committed: false,
        }
    }

    fn ack(first: i64, last: i64, t: AckType) -> AckBatch {
        AckBatch {
            first,
            last,
            types: vec![t],
        }
    }

    fn range(first: i64, last: i64, delivery_count: i16) -> Acquired {
        Acquired {
            first,
            last,
            delivery_count,
        }
    }

    #[test]
    fn members_share_a_partition_record_by_record() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        assert_eq!(p.acquire("a", now, 3, 10, &[], &s), vec![range(0, 2, 1)]);
        assert_eq!(p.acquire("b", now, 3, 10, &[], &s), vec![range(3, 5, 1)]);
        assert_eq!(p.next_fetch_offset(), 6);
        // b finishes first: the start stays at a's records.
        p.acknowledge("b", now, &[ack(3, 5, AckType::Accept)], &s)
            .unwrap();
        assert_eq!(p.start(), 0);
        let written = p
            .acknowledge("a", now, &[ack(0, 2, AckType::Accept)], &s)
            .unwrap();
        assert_eq!(
            written,
            vec![StateBatch {
                first: 0,
                last: 2,
                state: RecordState::Acknowledged,
                delivery_count: 1
            }]
        );
        assert_eq!(p.start(), 6);
    }

    #[test]
    fn a_released_record_comes_back_and_a_rejected_one_does_not() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        p.acquire("a", now, 2, 2, &[], &s);
        let batch = AckBatch {
            first: 0,
            last: 1,
            types: vec![AckType::Release, AckType::Reject],
        };
        p.acknowledge("a", now, &[batch], &s).unwrap();
        assert_eq!(p.next_fetch_offset(), 0);
        assert_eq!(p.acquire("b", now, 5, 2, &[], &s), vec![range(0, 0, 2)]);
    }

    #[test]
    fn an_unacknowledged_record_is_redelivered_after_its_lock_and_archived_at_the_limit() {
        let s = settings();
        let mut now = Instant::now();
        let mut p = SharePartition::new(0);
        for delivery in 1..=3 {
            assert_eq!(
                p.acquire("a", now, 1, 1, &[], &s),
                vec![range(0, 0, delivery)]
            );
            assert!(
                p.expire_locks(now, &s).is_empty(),
                "locked for the duration"
            );
            now += s.lock_duration;
            let written = p.expire_locks(now, &s);
            assert_eq!(written.len(), 1);
        }
        // The third lapse archives the poison record and the start moves past it.
        assert_eq!(p.start(), 1);
        assert!(p.acquire("a", now, 1, 1, &[], &s).is_empty());
    }

    #[test]
    fn acknowledgements_of_records_not_held_are_refused_whole() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        p.acquire("a", now, 2, 4, &[], &s);
        p.acquire("b", now, 2, 4, &[], &s);
        let err = p
            .acknowledge(
                "a",
                now,
                &[ack(0, 1, AckType::Accept), ack(2, 2, AckType::Accept)],
                &s,
            )
            .unwrap_err();
        assert_eq!(
            err,
            AckError::InvalidRecordState("Member is not the owner of batch record".into())
        );
        // Nothing of the refused request was applied.
        assert_eq!(p.start(), 0);
        assert!(matches!(
            p.acknowledge("a", now, &[ack(0, 9, AckType::Accept)], &s),
            Err(AckError::InvalidRequest(_))
        ));
        p.acknowledge("a", now, &[ack(0, 1, AckType::Accept)], &s)
            .unwrap();
        assert!(matches!(
            p.acknowledge("a", now, &[ack(0, 1, AckType::Accept)], &s),
            Ok(v) if v.is_empty()
        ));
    }

    #[test]
    fn renewing_restarts_the_lock() {
        let s = settings();
        let mut now = Instant::now();
        let mut p = SharePartition::new(0);
        p.acquire("a", now, 1, 1, &[], &s);
        now += s.lock_duration / 2;
        assert!(p
            .acknowledge("a", now, &[ack(0, 0, AckType::Renew)], &s)
            .unwrap()
            .is_empty());
        now += s.lock_duration / 2;
        assert!(
            p.expire_locks(now, &s).is_empty(),
            "the renewed lock still holds"
        );
        let off = ShareSettings {
            renew_enabled: false,
            ..settings()
        };
        assert!(matches!(
            p.acknowledge("a", now, &[ack(0, 0, AckType::Renew)], &off),
            Err(AckError::InvalidRecordState(_))
        ));
    }

    #[test]
    fn the_in_flight_cap_limits_new_records_but_not_redeliveries() {
        let s = ShareSettings {
            max_in_flight: 3,
            ..settings()
        };
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        assert_eq!(p.acquire("a", now, 10, 10, &[], &s), vec![range(0, 2, 1)]);
        assert!(!p.can_acquire(10, &s));
        p.acknowledge("a", now, &[ack(1, 1, AckType::Release)], &s)
            .unwrap();
        assert!(p.can_acquire(10, &s));
        assert_eq!(p.acquire("b", now, 10, 10, &[], &s), vec![range(1, 1, 2)]);
    }

    #[test]
    fn a_members_session_ending_releases_what_it_holds() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        p.acquire("a", now, 2, 4, &[], &s);
        p.acquire("b", now, 2, 4, &[], &s);
        assert_eq!(p.release_member("a", &s).len(), 1);
        assert_eq!(p.acquire("c", now, 5, 4, &[], &s), vec![range(0, 1, 2)]);
    }

    #[test]
    fn aborted_records_are_archived_not_delivered() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        let got = p.acquire("a", now, 10, 6, &[(1, 2)], &s);
        assert_eq!(got, vec![range(0, 0, 1), range(3, 5, 1)]);
        p.acknowledge("a", now, &[ack(0, 0, AckType::Accept)], &s)
            .unwrap();
        assert_eq!(p.start(), 3);
    }

    #[test]
    fn restoring_the_written_state_rebuilds_the_partition_without_acquisitions() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(10);
        p.acquire("a", now, 5, 20, &[], &s);
        let mut written = Vec::new();
        written.extend(
            p.acknowledge(
                "a",
                now,
                &[ack(11, 11, AckType::Accept), ack(12, 12, AckType::Release)],
                &s,
            )
            .unwrap(),
        );
        // What a snapshot holds, replayed: 10 and 13-14 were only acquired.
        let restored = SharePartition::restore(p.start(), &p.state_batches());
        assert_eq!(restored.start(), 10);
        assert_eq!(restored.next_fetch_offset(), 10);
        assert_eq!(restored.delivery_complete_count(), 1);
        let mut restored = restored;
        let again = restored.acquire("b", now, 10, 20, &[], &s);
        assert_eq!(again[0], range(10, 10, 1));
        assert!(again.contains(&range(12, 12, 2)));
        assert!(!written.is_empty());
    }

    #[test]
    fn only_records_the_fetch_read_are_handed_out() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        p.acquire("a", now, 20, 20, &[], &s);
        let acks = [ack(0, 8, AckType::Accept), ack(9, 19, AckType::Release)];
        p.acknowledge("a", now, &acks, &s).unwrap();
        // The fetch from offset 9 read only up to 15: 16-19 stay available.
        assert_eq!(p.next_fetch_offset(), 9);
        assert_eq!(p.acquire("b", now, 100, 16, &[], &s), vec![range(9, 15, 2)]);
        assert_eq!(p.next_fetch_offset(), 16);
    }

    #[test]
    fn the_log_start_moving_archives_what_is_gone() {
        let s = settings();
        let now = Instant::now();
        let mut p = SharePartition::new(0);
        p.acquire("a", now, 3, 10, &[], &s);
        p.log_start_moved(5);
        assert_eq!(p.start(), 5);
        assert_eq!(p.acquire("a", now, 2, 10, &[], &s), vec![range(5, 6, 1)]);
    }
}
