//! One share group's membership (KIP-932's ShareGroupHeartbeat).
//!
//! Share groups take the consumer group protocol's shape (member epochs,
//! a group epoch bumped by every change of members or subscribed topics, a
//! target assignment computed for it) without its hardest part: since a
//! partition may have any number of readers, nothing is ever revoked before
//! it is reassigned. A member's epoch jumps straight to the assignment
//! epoch with its new partitions; records it still holds elsewhere come back
//! through their locks (`share_partition`), not through the group.
//!
//! The assignor is Kafka's `simple` one in effect: with no more members
//! than partitions each partition has one reader and loads differ by at
//! most one; with more members, every partition gets the same number of
//! readers and every member about one partition. It keeps members on their
//! partitions where it can.
//!
//! Synchronous; time and topics are passed in.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::assignor::Assignment;
use super::consumer::{Topics, LEAVE_EPOCH};
use super::records::{ConsumerGroupValue, RecordKey};
use super::CoordinatorError;
use bytes::Bytes;

/// Kafka's group.share.* settings: membership, and what each
/// share-partition of the group follows.
#[derive(Debug, Clone)]
pub struct ShareGroupConfig {
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    pub max_size: usize,
    pub partition: super::share_partition::ShareSettings,
}

impl Default for ShareGroupConfig {
    /// Kafka's defaults.
    fn default() -> Self {
        ShareGroupConfig {
            heartbeat_interval: Duration::from_millis(5000),
            session_timeout: Duration::from_millis(45000),
            max_size: 200,
            partition: Default::default(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub id: String,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed: BTreeSet<String>,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub assigned: Assignment,
    last_seen: Instant,
}

/// A ShareGroupHeartbeat, decoded; `None` fields are unchanged.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeartbeatParams {
    pub member_id: String,
    pub member_epoch: i32,
    pub rack_id: Option<String>,
    pub subscribed_topic_names: Option<Vec<String>>,
    pub client_id: String,
    pub client_host: String,
}

/// A heartbeat's answer, as for consumer groups; the assignment is sent on
/// a join, a new subscription, or when it changed.
pub(crate) use super::consumer::HeartbeatResult;

/// Kafka's checks before the coordinator (INVALID_REQUEST).
pub(crate) fn validate(group_id: &str, p: &HeartbeatParams) -> Result<(), CoordinatorError> {
    let invalid = |m: &str| Err(CoordinatorError::InvalidRequest(m.to_string()));
    if p.member_id.is_empty() || p.member_id.len() > 36 {
        return invalid("Invalid member id in the request.");
    }
    if group_id.trim().is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if p.rack_id.as_deref().is_some_and(|r| r.trim().is_empty()) {
        return invalid("RackId can't be empty.");
    }
    if p.member_epoch == 0 && p.subscribed_topic_names.as_ref().is_none_or(Vec::is_empty) {
        return invalid("SubscribedTopicNames must be set in first request.");
    }
    if p.member_epoch < LEAVE_EPOCH {
        return invalid("MemberEpoch is invalid.");
    }
    Ok(())
}

pub(crate) struct ShareGroup {
    pub id: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    metadata_hash: i64,
    members: BTreeMap<String, Member>,
    target: BTreeMap<String, Assignment>,
}

impl ShareGroup {
    pub(crate) fn new(id: &str) -> ShareGroup {
        ShareGroup {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            metadata_hash: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
        }
    }

    pub(crate) fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Kafka's share group states.
    pub(crate) fn state(&self) -> &'static str {
        match self.members.is_empty() {
            true => "Empty",
            false => "Stable",
        }
    }

    /// The topics any member subscribes to.
    pub(crate) fn subscribed_topics(&self) -> BTreeSet<String> {
        self.members
            .values()
            .flat_map(|m| m.subscribed.iter().cloned())
            .collect()
    }

    fn metadata_hash(&self, topics: &Topics) -> i64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        let mut eat = |bytes: &[u8]| {
            for b in bytes {
                h ^= u64::from(*b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
        };
        for name in self.subscribed_topics() {
            if let Some(t) = topics.get(&name) {
                eat(name.as_bytes());
                eat(t.id.as_bytes());
                eat(&t.partitions.to_be_bytes());
            }
        }
        h as i64
    }

    /// A group as its epoch record left it: empty, members rejoin.
    pub(crate) fn restore(id: &str, v: &ConsumerGroupValue) -> ShareGroup {
        ShareGroup {
            epoch: v.epoch,
            assignment_epoch: v.epoch,
            metadata_hash: v.metadata_hash,
            ..ShareGroup::new(id)
        }
    }

    /// The group's epoch record (ShareGroupMetadata, key 11; the same
    /// layout as a consumer group's).
    pub(crate) fn epoch_record(&self) -> (RecordKey, Option<Bytes>) {
        let v = ConsumerGroupValue {
            epoch: self.epoch,
            metadata_hash: self.metadata_hash,
        };
        (
            RecordKey::ShareGroup {
                group: self.id.clone(),
            },
            Some(v.encode()),
        )
    }

    /// ShareGroupHeartbeat, validated with `validate`.
    pub(crate) fn heartbeat(
        &mut self,
        p: HeartbeatParams,
        now: Instant,
        topics: &Topics,
        cfg: &ShareGroupConfig,
    ) -> Result<HeartbeatResult, CoordinatorError> {
        if p.member_epoch == LEAVE_EPOCH {
            if !self.members.contains_key(&p.member_id) {
                return Err(CoordinatorError::UnknownMemberId);
            }
            self.remove_members(std::slice::from_ref(&p.member_id), topics);
            return Ok(HeartbeatResult {
                member_id: p.member_id,
                member_epoch: LEAVE_EPOCH,
                heartbeat_interval_ms: 0,
                assignment: None,
            });
        }
        let known = self.members.contains_key(&p.member_id);
        if !known && self.members.len() >= cfg.max_size {
            return Err(CoordinatorError::GroupMaxSizeReached(cfg.max_size));
        }
        let mut bump = false;
        if let Some(m) = self.members.get(&p.member_id) {
            if p.member_epoch != 0
                && (p.member_epoch > m.epoch
                    || (p.member_epoch < m.epoch && p.member_epoch != m.previous_epoch))
            {
                return Err(CoordinatorError::FencedMemberEpoch);
            }
        } else if p.member_epoch != 0 {
            return Err(CoordinatorError::UnknownMemberId);
        } else {
            self.members.insert(
                p.member_id.clone(),
                Member {
                    id: p.member_id.clone(),
                    rack_id: None,
                    client_id: String::new(),
                    client_host: String::new(),
                    subscribed: BTreeSet::new(),
                    epoch: 0,
                    previous_epoch: 0,
                    assigned: Assignment::new(),
                    last_seen: now,
                },
            );
        }
        let m = self.members.get_mut(&p.member_id).expect("present");
        m.last_seen = now;
        m.client_id = p.client_id.clone();
        m.client_host = p.client_host.clone();
        if let Some(r) = &p.rack_id {
            m.rack_id = Some(r.clone());
        }
        if let Some(names) = &p.subscribed_topic_names {
            let names: BTreeSet<String> = names.iter().cloned().collect();
            bump |= names != m.subscribed;
            m.subscribed = names;
        }
        let hash = self.metadata_hash(topics);
        if bump || hash != self.metadata_hash {
            self.epoch += 1;
            self.metadata_hash = hash;
        }
        if self.assignment_epoch < self.epoch {
            self.assign(topics);
        }
        let before = self.members[&p.member_id].assigned.clone();
        self.reconcile(&p.member_id);
        let m = &self.members[&p.member_id];
        let full = p.member_epoch == 0 || p.subscribed_topic_names.is_some();
        Ok(HeartbeatResult {
            member_id: m.id.clone(),
            member_epoch: m.epoch,
            heartbeat_interval_ms: cfg.heartbeat_interval.as_millis() as i32,
            assignment: (full || m.assigned != before).then(|| m.assigned.clone()),
        })
    }

    /// Drops members (left or expired); the group epoch moves on.
    pub(crate) fn remove_members(&mut self, ids: &[String], topics: &Topics) {
        let before = self.members.len();
        for id in ids {
            self.members.remove(id);
            self.target.remove(id);
        }
        if self.members.len() != before {
            self.epoch += 1;
            self.metadata_hash = self.metadata_hash(topics);
            if self.members.is_empty() {
                self.assignment_epoch = self.epoch;
            }
        }
    }

    /// Members not heard from within the session timeout.
    pub(crate) fn expired(&self, now: Instant, cfg: &ShareGroupConfig) -> Vec<String> {
        self.members
            .values()
            .filter(|m| now.duration_since(m.last_seen) > cfg.session_timeout)
            .map(|m| m.id.clone())
            .collect()
    }

    /// No revocation: the member takes its target and the assignment epoch.
    fn reconcile(&mut self, id: &str) {
        let target = self.target.get(id).cloned().unwrap_or_default();
        let epoch = self.assignment_epoch;
        let m = self.members.get_mut(id).expect("present");
        if m.epoch != epoch {
            m.previous_epoch = m.epoch;
            m.epoch = epoch;
        }
        m.assigned = target;
    }

    fn assign(&mut self, topics: &Topics) {
        let mut target: BTreeMap<String, Assignment> = self
            .members
            .keys()
            .map(|id| (id.clone(), Assignment::new()))
            .collect();
        for name in self.subscribed_topics() {
            let Some(t) = topics.get(&name) else { continue };
            let readers: Vec<&Member> = self
                .members
                .values()
                .filter(|m| m.subscribed.contains(&name))
                .collect();
            for (id, ps) in spread(t.id, t.partitions, &readers) {
                if !ps.is_empty() {
                    target.get_mut(&id).expect("member").insert(t.id, ps);
                }
            }
        }
        self.target = target;
        self.assignment_epoch = self.epoch;
    }
}

/// One topic's partitions over its readers: each partition gets
/// ceil(readers / partitions) of them, each reader about the same number of
/// partitions, and a reader keeps a partition it had where that allows.
fn spread(topic: Uuid, partitions: i32, readers: &[&Member]) -> BTreeMap<String, BTreeSet<i32>> {
    let mut out: BTreeMap<String, BTreeSet<i32>> = readers
        .iter()
        .map(|m| (m.id.clone(), BTreeSet::new()))
        .collect();
    if partitions <= 0 || readers.is_empty() {
        return out;
    }
    let n = readers.len();
    let p = partitions as usize;
    let sharing = n.div_ceil(p);
    // Slots: each partition `sharing` times; members take slots in turn.
    let total = sharing * p;
    let quota = |i: usize| (total * (i + 1)).div_ceil(n) - (total * i).div_ceil(n);
    let mut readers_of: Vec<usize> = vec![0; p];
    let mut load: Vec<usize> = vec![0; n];
    // Keep what members had, within their quota and the partition's sharing.
    for (i, m) in readers.iter().enumerate() {
        for part in m.assigned.get(&topic).into_iter().flatten() {
            let part = *part as usize;
            if part < p && load[i] < quota(i) && readers_of[part] < sharing {
                readers_of[part] += 1;
                load[i] += 1;
                out.get_mut(&m.id).expect("reader").insert(part as i32);
            }
        }
    }
    // Hand out the rest: each member in turn takes the least-read partition it lacks.
    let mut progress = true;
    while progress {
        progress = false;
        for (i, m) in readers.iter().enumerate() {
            if load[i] >= quota(i) {
                continue;
            }
            let mine = &out[&m.id];
            let pick = (0..p)
                .filter(|part| readers_of[*part] < sharing && !mine.contains(&(*part as i32)))
                .min_by_key(|part| readers_of[*part]);
            if let Some(part) = pick {
                readers_of[part] += 1;
                load[i] += 1;
                out.get_mut(&m.id).expect("reader").insert(part as i32);
                progress = true;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::consumer::TopicMeta;

    fn topics(partitions: i32) -> Topics {
        Topics::from([(
            "t".to_string(),
            TopicMeta {
                id: Uuid::from_u128(1),
                partitions,
                internal: false,
            },
        )])
    }

    fn join(id: &str) -> HeartbeatParams {
        HeartbeatParams {
            member_id: id.into(),
            member_epoch: 0,
            subscribed_topic_names: Some(vec!["t".into()]),
            ..HeartbeatParams::default()
        }
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn five_members_share_one_partition() {
        let now = Instant::now();
        let cfg = ShareGroupConfig::default();
        let t = topics(1);
        let mut g = ShareGroup::new("g");
        for id in ["a", "b", "c", "d", "e"] {
            g.heartbeat(join(id), now, &t, &cfg).unwrap();
        }
        for id in ["a", "b", "c", "d", "e"] {
            let r = g
                .heartbeat(
                    HeartbeatParams {
                        member_id: id.into(),
                        member_epoch: g.members[id].epoch,
                        ..HeartbeatParams::default()
                    },
                    now,
                    &t,
                    &cfg,
                )
                .unwrap();
            assert_eq!(r.member_epoch, g.epoch);
            assert_eq!(count(&g.members[id].assigned), 1, "{id}");
        }
    }

    #[test]
    fn fewer_members_than_partitions_split_them_evenly_without_overlap() {
        let now = Instant::now();
        let cfg = ShareGroupConfig::default();
        let t = topics(7);
        let mut g = ShareGroup::new("g");
        for id in ["a", "b", "c"] {
            g.heartbeat(join(id), now, &t, &cfg).unwrap();
        }
        g.assign(&t);
        let mut seen = BTreeSet::new();
        let mut loads = Vec::new();
        for a in g.target.values() {
            loads.push(count(a));
            for ps in a.values() {
                for p in ps {
                    assert!(seen.insert(*p), "partition {p} twice");
                }
            }
        }
        assert_eq!(seen.len(), 7);
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
    }

    #[test]
    fn a_member_keeps_its_partitions_when_another_joins() {
        let now = Instant::now();
        let cfg = ShareGroupConfig::default();
        let t = topics(4);
        let mut g = ShareGroup::new("g");
        let a = g.heartbeat(join("a"), now, &t, &cfg).unwrap();
        assert_eq!(count(a.assignment.as_ref().unwrap()), 4);
        g.heartbeat(join("b"), now, &t, &cfg).unwrap();
        let a2 = g
            .heartbeat(
                HeartbeatParams {
                    member_id: "a".into(),
                    member_epoch: a.member_epoch,
                    ..HeartbeatParams::default()
                },
                now,
                &t,
                &cfg,
            )
            .unwrap();
        let kept = a2.assignment.unwrap();
        assert_eq!(count(&kept), 2);
        let before = a.assignment.unwrap();
        for (t, ps) in &kept {
            assert!(ps.is_subset(&before[t]), "{kept:?} not within {before:?}");
        }
    }

    #[test]
    fn leaving_and_expiry_bump_the_epoch_and_bad_requests_get_kafkas_errors() {
        let mut now = Instant::now();
        let cfg = ShareGroupConfig::default();
        let t = topics(2);
        let mut g = ShareGroup::new("g");
        let a = g.heartbeat(join("a"), now, &t, &cfg).unwrap();
        g.heartbeat(join("b"), now, &t, &cfg).unwrap();
        let epoch = g.epoch;
        let left = g
            .heartbeat(
                HeartbeatParams {
                    member_id: "b".into(),
                    member_epoch: LEAVE_EPOCH,
                    ..HeartbeatParams::default()
                },
                now,
                &t,
                &cfg,
            )
            .unwrap();
        assert_eq!((left.member_epoch, g.epoch), (LEAVE_EPOCH, epoch + 1));
        let stale = HeartbeatParams {
            member_id: "a".into(),
            member_epoch: a.member_epoch + 5,
            ..HeartbeatParams::default()
        };
        assert_eq!(
            g.heartbeat(stale, now, &t, &cfg).unwrap_err(),
            CoordinatorError::FencedMemberEpoch
        );
        now += cfg.session_timeout + Duration::from_millis(1);
        assert_eq!(g.expired(now, &cfg), vec!["a".to_string()]);
        for bad in [
            HeartbeatParams::default(),
            HeartbeatParams {
                subscribed_topic_names: None,
                ..join("x")
            },
            HeartbeatParams {
                member_epoch: -2,
                ..join("x")
            },
        ] {
            assert!(matches!(
                validate("g", &bad),
                Err(CoordinatorError::InvalidRequest(_))
            ));
        }
    }
}
