//! Fetch sessions (KIP-227): the broker remembers what a consumer fetches,
//! so that the consumer's next requests name only what changed.
//!
//! A consumer of many partitions would otherwise send every partition and
//! offset in each fetch, and get every partition back in each response,
//! even when nothing arrived. With a session, the first (full) request names
//! them all and the response carries a session id; later (incremental)
//! requests carry that id and the next epoch, list only partitions added or
//! whose fetch position moved, and `forgotten_topics_data` for those
//! dropped; their responses list only partitions with records, a changed
//! high watermark or log start offset, or an error. The broker never moves a
//! session's fetch offsets itself: the client resends a partition when its
//! position changes.
//!
//! The cache follows Kafka's `FetchSessionCache`: at most
//! `max.incremental.fetch.session.cache.slots` (1000) sessions per broker.
//! When full, a new session may evict one unused for 120 s, or else, among
//! sessions older than 120 s, the smallest one if it is smaller than the
//! newcomer; otherwise the newcomer gets no session (id 0) and keeps sending
//! full requests, which is always correct. A request with an unknown id gets
//! `FETCH_SESSION_ID_NOT_FOUND`, one with the wrong epoch
//! `INVALID_FETCH_SESSION_EPOCH`, one whose version disagrees with the session
//! about topic ids `FETCH_SESSION_TOPIC_ID_ERROR`; the client then starts
//! over with a full request. Epoch -1 closes a session.
//!
//! This module is the state machine alone (time and ids are passed in or
//! injected); `fetch` reads the partitions it names.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use parking_lot::Mutex;
use uuid::Uuid;

use crate::clock::SharedRandom;

/// Kafka's `max.incremental.fetch.session.cache.slots` default.
pub(super) const CACHE_SLOTS: usize = 1000;
/// Kafka's `MIN_INCREMENTAL_FETCH_SESSION_EVICTION_MS`.
pub(super) const EVICTION_MS: i64 = 120_000;

const INITIAL_EPOCH: i32 = 0;
const FINAL_EPOCH: i32 = -1;

/// A topic as the request version names it: by name before v13, by id from v13.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum TopicRef {
    Name(Arc<str>),
    Id(Uuid),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct PartitionKey {
    pub topic: TopicRef,
    pub partition: i32,
}

/// Where and how much to fetch from one partition, as the client last said.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Position {
    pub fetch_offset: i64,
    pub max_bytes: i32,
    pub current_leader_epoch: i32,
}

/// What a response told the client about one partition; an incremental
/// response repeats a partition only when this changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Answered {
    pub high_watermark: i64,
    pub log_start_offset: i64,
    pub last_stable_offset: i64,
    pub has_records: bool,
    pub error_code: i16,
}

/// How to serve one fetch request.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Answer with this top-level error, session id 0 and no partitions.
    Error(i16),
    /// Fetch these, without a session (response session id 0).
    Sessionless(Vec<(PartitionKey, Position)>),
    /// Fetch these and offer a session holding them.
    Full(Vec<(PartitionKey, Position)>),
    /// Fetch every partition of the session; answer only what changed.
    Incremental {
        session_id: i32,
        partitions: Vec<(PartitionKey, Position)>,
    },
}

struct Cached {
    key: PartitionKey,
    position: Position,
    /// -1 until answered, and after an error, so the partition is sent next time.
    high_watermark: i64,
    log_start_offset: i64,
    last_stable_offset: i64,
}

struct Session {
    /// The epoch the next incremental request must carry.
    epoch: i32,
    uses_topic_ids: bool,
    /// In the order they are read; partitions that returned records move to
    /// the end, so that a response filled by `max_bytes` cannot starve the
    /// partitions after them (Kafka does the same).
    partitions: Vec<Cached>,
    /// Where each partition is in `partitions`.
    index: HashMap<PartitionKey, usize>,
    created_ms: i64,
    last_used_ms: i64,
}

impl Session {
    fn new(uses_topic_ids: bool, partitions: Vec<Cached>, now_ms: i64) -> Session {
        let mut s = Session {
            epoch: next_epoch(INITIAL_EPOCH),
            uses_topic_ids,
            partitions,
            index: HashMap::new(),
            created_ms: now_ms,
            last_used_ms: now_ms,
        };
        s.reindex();
        s
    }

    fn reindex(&mut self) {
        self.index = self
            .partitions
            .iter()
            .enumerate()
            .map(|(i, c)| (c.key.clone(), i))
            .collect();
    }

    fn update(&mut self, requested: Vec<(PartitionKey, Position)>, forgotten: &[PartitionKey]) {
        for (key, position) in requested {
            match self.index.get(&key) {
                Some(&i) => self.partitions[i].position = position,
                None => {
                    self.index.insert(key.clone(), self.partitions.len());
                    self.partitions.push(Cached {
                        key,
                        position,
                        high_watermark: -1,
                        log_start_offset: -1,
                        last_stable_offset: -1,
                    });
                }
            }
        }
        if !forgotten.is_empty() {
            self.partitions.retain(|c| !forgotten.contains(&c.key));
            self.reindex();
        }
    }

    fn positions(&self) -> Vec<(PartitionKey, Position)> {
        self.partitions
            .iter()
            .map(|c| (c.key.clone(), c.position))
            .collect()
    }

    /// Moves the partitions at `indexes` (ascending) to the end, in order.
    fn move_to_end(&mut self, indexes: &[usize]) {
        if indexes.is_empty() {
            return;
        }
        let mut moved = Vec::with_capacity(indexes.len());
        let mut kept = Vec::with_capacity(self.partitions.len());
        let mut next = indexes.iter().peekable();
        for (i, c) in std::mem::take(&mut self.partitions).into_iter().enumerate() {
            if next.peek() == Some(&&i) {
                next.next();
                moved.push(c);
            } else {
                kept.push(c);
            }
        }
        kept.extend(moved);
        self.partitions = kept;
        self.reindex();
    }
}

/// Kafka's `JFetchMetadata.nextEpoch`: 1, 2, ..., i32::MAX, 1, ...
fn next_epoch(epoch: i32) -> i32 {
    if epoch < 0 {
        FINAL_EPOCH
    } else if epoch == i32::MAX {
        1
    } else {
        epoch + 1
    }
}

/// One broker's fetch sessions.
pub(crate) struct FetchSessions {
    sessions: Mutex<HashMap<i32, Session>>,
    capacity: usize,
    random: SharedRandom,
}

impl FetchSessions {
    pub(crate) fn new(capacity: usize, random: SharedRandom) -> FetchSessions {
        FetchSessions {
            sessions: Mutex::new(HashMap::new()),
            capacity,
            random,
        }
    }

    /// Decides how to serve a request (Kafka's `FetchManager.newContext`).
    /// `version` decides whether topics go by id (v13+); sessions exist from v7.
    pub(crate) fn plan(
        &self,
        version: i16,
        session_id: i32,
        epoch: i32,
        requested: Vec<(PartitionKey, Position)>,
        forgotten: Vec<PartitionKey>,
        now_ms: i64,
    ) -> Plan {
        if version < 7 {
            return Plan::Sessionless(requested);
        }
        let mut sessions = self.sessions.lock();
        if epoch == INITIAL_EPOCH || epoch == FINAL_EPOCH {
            // A full request closes the session it names.
            if session_id != 0 {
                sessions.remove(&session_id);
            }
            return if epoch == FINAL_EPOCH {
                Plan::Sessionless(requested)
            } else {
                Plan::Full(requested)
            };
        }
        let Some(session) = sessions.get_mut(&session_id) else {
            return Plan::Error(ResponseError::FetchSessionIdNotFound.code());
        };
        if session.epoch != epoch {
            return Plan::Error(ResponseError::InvalidFetchSessionEpoch.code());
        }
        if session.uses_topic_ids != (version >= 13) {
            return Plan::Error(ResponseError::FetchSessionTopicIdError.code());
        }
        session.update(requested, &forgotten);
        if session.partitions.is_empty() {
            sessions.remove(&session_id);
            return Plan::Sessionless(Vec::new());
        }
        session.last_used_ms = now_ms;
        session.epoch = next_epoch(session.epoch);
        Plan::Incremental {
            session_id,
            partitions: session.positions(),
        }
    }

    /// After a full fetch: a new session holding `partitions` as answered,
    /// if there is room; its id, or 0 (no session) when there is none.
    pub(crate) fn create(
        &self,
        version: i16,
        partitions: Vec<(PartitionKey, Position, Answered)>,
        now_ms: i64,
    ) -> i32 {
        let mut sessions = self.sessions.lock();
        if sessions.len() >= self.capacity && !evict_one(&mut sessions, partitions.len(), now_ms) {
            return 0;
        }
        let id = loop {
            let id = (self.random.uuid().as_u128() as u32 & 0x7fff_ffff) as i32;
            if id != 0 && !sessions.contains_key(&id) {
                break id;
            }
        };
        let partitions: Vec<Cached> = partitions
            .into_iter()
            .map(|(key, position, answered)| Cached {
                key,
                position,
                high_watermark: if answered.error_code != 0 {
                    -1
                } else {
                    answered.high_watermark
                },
                log_start_offset: answered.log_start_offset,
                last_stable_offset: answered.last_stable_offset,
            })
            .collect();
        tracing::debug!(
            session_id = id,
            partitions = partitions.len(),
            "fetch session created"
        );
        sessions.insert(id, Session::new(version >= 13, partitions, now_ms));
        id
    }

    /// After an incremental fetch: whether each answered partition goes into
    /// the response (Kafka's `CachedPartition.maybeUpdateResponseData`),
    /// remembering what the client is told.
    pub(crate) fn select(
        &self,
        session_id: i32,
        answered: &[(PartitionKey, Answered)],
    ) -> Vec<bool> {
        let mut sessions = self.sessions.lock();
        let Some(session) = sessions.get_mut(&session_id) else {
            // Closed meanwhile: the client must see everything it asked for.
            return vec![true; answered.len()];
        };
        let mut with_records = Vec::new();
        let selected = answered
            .iter()
            .map(|(key, a)| {
                let Some(&i) = session.index.get(key) else {
                    return true;
                };
                if a.has_records {
                    with_records.push(i);
                }
                let c = &mut session.partitions[i];
                let mut include = a.has_records;
                if c.high_watermark != a.high_watermark {
                    include = true;
                    c.high_watermark = a.high_watermark;
                }
                if c.log_start_offset != a.log_start_offset {
                    include = true;
                    c.log_start_offset = a.log_start_offset;
                }
                if c.last_stable_offset != a.last_stable_offset {
                    include = true;
                    c.last_stable_offset = a.last_stable_offset;
                }
                if a.error_code != 0 {
                    c.high_watermark = -1;
                    include = true;
                }
                include
            })
            .collect();
        with_records.sort_unstable();
        session.move_to_end(&with_records);
        selected
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.sessions.lock().len()
    }
}

/// Makes room for a session of `size` partitions (Kafka's `tryEvict`): the
/// least recently used session if unused for `EVICTION_MS`, else the
/// smallest session older than `EVICTION_MS` if it is smaller than the
/// newcomer.
fn evict_one(sessions: &mut HashMap<i32, Session>, size: usize, now_ms: i64) -> bool {
    let stale = sessions
        .iter()
        .min_by_key(|(id, s)| (s.last_used_ms, **id))
        .filter(|(_, s)| now_ms - s.last_used_ms > EVICTION_MS)
        .map(|(id, _)| *id);
    let victim = stale.or_else(|| {
        let old: BTreeSet<(usize, i32)> = sessions
            .iter()
            .filter(|(_, s)| now_ms - s.created_ms > EVICTION_MS)
            .map(|(id, s)| (s.partitions.len(), *id))
            .collect();
        old.first()
            .filter(|(smallest, _)| size > *smallest)
            .map(|(_, id)| *id)
    });
    match victim {
        Some(id) => {
            sessions.remove(&id);
            true
        }
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SeededRandom;

    const V: i16 = 13;

    fn key(p: i32) -> PartitionKey {
        PartitionKey {
            topic: TopicRef::Id(Uuid::from_u128(7)),
            partition: p,
        }
    }

    fn pos(offset: i64) -> Position {
        Position {
            fetch_offset: offset,
            max_bytes: 1 << 20,
            current_leader_epoch: -1,
        }
    }

    fn answered(hw: i64) -> Answered {
        Answered {
            high_watermark: hw,
            log_start_offset: 0,
            last_stable_offset: hw,
            has_records: false,
            error_code: 0,
        }
    }

    fn cache(slots: usize) -> FetchSessions {
        FetchSessions::new(slots, Arc::new(SeededRandom::new(1)))
    }

    /// A full fetch of `n` partitions answered at high watermark 5.
    fn open(s: &FetchSessions, n: i32, now: i64) -> i32 {
        let wanted: Vec<_> = (0..n).map(|p| (key(p), pos(0))).collect();
        let Plan::Full(parts) = s.plan(V, 0, 0, wanted, vec![], now) else {
            panic!("not a full fetch");
        };
        s.create(
            V,
            parts
                .into_iter()
                .map(|(k, p)| (k, p, answered(5)))
                .collect(),
            now,
        )
    }

    #[test]
    fn incremental_fetch_names_every_session_partition_and_answers_only_changes() {
        let s = cache(10);
        let id = open(&s, 3, 0);
        assert_ne!(id, 0);
        // Only partition 1 moved: the plan still reads all three.
        let plan = s.plan(V, id, 1, vec![(key(1), pos(5))], vec![], 1);
        let Plan::Incremental { partitions, .. } = plan else {
            panic!("{plan:?}")
        };
        assert_eq!(
            partitions,
            vec![(key(0), pos(0)), (key(1), pos(5)), (key(2), pos(0))]
        );
        let mut with_records = answered(5);
        with_records.has_records = true;
        let selected = s.select(
            id,
            &[
                (key(0), answered(5)),
                (key(1), with_records),
                (key(2), answered(6)),
            ],
        );
        assert_eq!(selected, vec![false, true, true]);
        // The new high watermark was told once.
        let Plan::Incremental { .. } = s.plan(V, id, 2, vec![], vec![], 2) else {
            panic!()
        };
        assert_eq!(s.select(id, &[(key(2), answered(6))]), vec![false]);
    }

    #[test]
    fn partitions_that_returned_records_are_read_last_next_time() {
        let s = cache(10);
        let id = open(&s, 3, 0);
        s.plan(V, id, 1, vec![], vec![], 0);
        let mut with_records = answered(5);
        with_records.has_records = true;
        s.select(
            id,
            &[
                (key(0), with_records),
                (key(1), answered(5)),
                (key(2), answered(5)),
            ],
        );
        let Plan::Incremental { partitions, .. } = s.plan(V, id, 2, vec![], vec![], 0) else {
            panic!()
        };
        let order: Vec<i32> = partitions.iter().map(|(k, _)| k.partition).collect();
        assert_eq!(order, vec![1, 2, 0]);
    }

    #[test]
    fn errors_are_always_answered_and_resent_once_they_clear() {
        let s = cache(10);
        let id = open(&s, 1, 0);
        let mut failed = answered(-1);
        failed.error_code = 6;
        s.plan(V, id, 1, vec![], vec![], 0);
        assert_eq!(s.select(id, &[(key(0), failed)]), vec![true]);
        s.plan(V, id, 2, vec![], vec![], 0);
        assert_eq!(s.select(id, &[(key(0), answered(5))]), vec![true]);
    }

    #[test]
    fn forgotten_partitions_leave_the_session_and_an_emptied_session_closes() {
        let s = cache(10);
        let id = open(&s, 2, 0);
        let plan = s.plan(V, id, 1, vec![], vec![key(0)], 0);
        assert_eq!(
            plan,
            Plan::Incremental {
                session_id: id,
                partitions: vec![(key(1), pos(0))]
            }
        );
        assert_eq!(
            s.plan(V, id, 2, vec![], vec![key(1)], 0),
            Plan::Sessionless(vec![])
        );
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn unknown_ids_wrong_epochs_and_topic_id_mismatches_are_refused() {
        let s = cache(10);
        let id = open(&s, 1, 0);
        let code = |p| match p {
            Plan::Error(c) => c,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(s.plan(V, id + 1, 1, vec![], vec![], 0)),
            ResponseError::FetchSessionIdNotFound.code()
        );
        assert_eq!(
            code(s.plan(V, id, 2, vec![], vec![], 0)),
            ResponseError::InvalidFetchSessionEpoch.code()
        );
        assert_eq!(
            code(s.plan(12, id, 1, vec![], vec![], 0)),
            ResponseError::FetchSessionTopicIdError.code()
        );
        // None of these used up the epoch.
        assert!(matches!(
            s.plan(V, id, 1, vec![], vec![], 0),
            Plan::Incremental { .. }
        ));
    }

    #[test]
    fn a_full_request_or_the_final_epoch_closes_the_named_session() {
        let s = cache(10);
        let id = open(&s, 1, 0);
        assert_eq!(
            s.plan(V, id, FINAL_EPOCH, vec![], vec![], 0),
            Plan::Sessionless(vec![])
        );
        assert_eq!(s.len(), 0);
        let id = open(&s, 1, 0);
        assert!(matches!(s.plan(V, id, 0, vec![], vec![], 0), Plan::Full(_)));
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn old_versions_never_get_a_session() {
        let s = cache(10);
        assert_eq!(
            s.plan(6, 0, 0, vec![(key(0), pos(0))], vec![], 0),
            Plan::Sessionless(vec![(key(0), pos(0))])
        );
    }

    #[test]
    fn a_full_cache_evicts_the_stale_then_smaller_old_sessions_else_refuses() {
        let s = cache(2);
        let a = open(&s, 5, 0);
        let b = open(&s, 2, 0);
        // Full, nothing older than the eviction time: no session.
        assert_eq!(open(&s, 9, 1_000), 0);
        // Both old, both used recently: only the smaller one goes, and only
        // for a bigger newcomer.
        s.plan(V, a, 1, vec![], vec![], EVICTION_MS + 10);
        s.plan(V, b, 1, vec![], vec![], EVICTION_MS + 10);
        assert_eq!(open(&s, 2, EVICTION_MS + 20), 0);
        let c = open(&s, 3, EVICTION_MS + 20);
        assert_ne!(c, 0);
        assert!(matches!(
            s.plan(V, b, 2, vec![], vec![], EVICTION_MS + 30),
            Plan::Error(_)
        ));
        // `a` unused for longer than the eviction time goes for anyone.
        let d = open(&s, 1, 2 * EVICTION_MS + 20);
        assert_ne!(d, 0);
        assert!(matches!(
            s.plan(V, a, 2, vec![], vec![], 2 * EVICTION_MS + 30),
            Plan::Error(_)
        ));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn epochs_wrap_to_one() {
        assert_eq!(next_epoch(0), 1);
        assert_eq!(next_epoch(i32::MAX), 1);
    }
}
