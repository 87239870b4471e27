//! One consumer group under the consumer group protocol (KIP-848).
//!
//! There is no join/sync barrier: every member heartbeats on its own and the
//! coordinator moves the group forward one heartbeat at a time, as Kafka's
//! does. A change of membership, subscriptions or subscribed topics bumps
//! the *group epoch*; the assignor then computes a *target assignment* for
//! that epoch (the *assignment epoch*). Each member is then reconciled
//! towards its target independently: it first gives up (revokes) what the
//! target takes away, staying at its old *member epoch* meanwhile, and only
//! then moves to the new epoch and receives its new partitions — and of
//! those, only the ones whose previous owner has released them. So a
//! partition never has two owners, and members that are not affected by a
//! rebalance keep consuming through it.
//!
//! Heartbeats from a member carry its epoch: a newer one than the
//! coordinator knows, or an older one that is not the just-previous epoch
//! (whose bump may have been lost), is fenced. Members whose session lapses,
//! or that do not revoke within their rebalance timeout, are removed. Static
//! members (with an instance id) may leave temporarily (epoch -2) and come
//! back under a new member id, keeping their partitions.
//!
//! All of this is synchronous and takes the time and the topics as
//! arguments; every change is returned as `__consumer_offsets` records for
//! the caller to append, and `restore` rebuilds the group from them.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use uuid::Uuid;

use super::assignor::{self, Assignment, AssignorMember};
use super::group::JoinParams;
use super::migration::{self, MigrationPolicy};
use super::records::{
    encode_assignment_epoch, encode_target, ClassicMemberMetadata, ConsumerGroupValue,
    ConsumerMemberValue, CurrentAssignmentValue, RecordKey, TopicPartitions,
};
use super::CoordinatorError;

pub(crate) const LEAVE_EPOCH: i32 = -1;
pub(crate) const STATIC_LEAVE_EPOCH: i32 = -2;

/// Records for `__consumer_offsets`, in the order to append them.
pub(crate) type Records = Vec<(RecordKey, Option<Bytes>)>;

/// Kafka's group.consumer.* broker settings.
#[derive(Debug, Clone)]
pub struct ConsumerGroupConfig {
    pub heartbeat_interval: Duration,
    pub session_timeout: Duration,
    /// The server assignors offered; the first is the default.
    pub assignors: Vec<String>,
    pub max_size: usize,
    /// Which way a group with members may switch protocols
    /// (group.consumer.migration.policy).
    pub migration: MigrationPolicy,
}

impl Default for ConsumerGroupConfig {
    /// Kafka's defaults.
    fn default() -> Self {
        ConsumerGroupConfig {
            heartbeat_interval: Duration::from_millis(5000),
            session_timeout: Duration::from_millis(45000),
            assignors: vec![assignor::UNIFORM.to_string(), assignor::RANGE.to_string()],
            max_size: i32::MAX as usize,
            migration: MigrationPolicy::Bidirectional,
        }
    }
}

/// A topic as the group sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicMeta {
    pub id: Uuid,
    pub partitions: i32,
    /// Internal topics are never matched by a regex subscription.
    pub internal: bool,
}

/// Every topic, by name.
pub(crate) type Topics = BTreeMap<String, TopicMeta>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MemberState {
    /// At the target epoch with every partition of its target it can have.
    Stable,
    /// Must revoke partitions before moving to the target epoch.
    UnrevokedPartitions,
    /// At the target epoch, waiting for partitions others still hold.
    UnreleasedPartitions,
}

impl MemberState {
    fn code(self) -> i8 {
        match self {
            MemberState::Stable => 0,
            MemberState::UnrevokedPartitions => 1,
            MemberState::UnreleasedPartitions => 2,
        }
    }

    fn from_code(code: i8) -> MemberState {
        match code {
            1 => MemberState::UnrevokedPartitions,
            2 => MemberState::UnreleasedPartitions,
            _ => MemberState::Stable,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_names: Vec<String>,
    pub subscribed_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub epoch: i32,
    pub previous_epoch: i32,
    pub state: MemberState,
    /// The partitions it owns (or may take now).
    pub assigned: Assignment,
    /// Partitions it must give up before it gets more.
    pub revoking: Assignment,
    /// Set for a member that speaks the classic protocol (JoinGroup,
    /// SyncGroup, Heartbeat) in this group.
    pub classic: Option<ClassicMemberMetadata>,
    last_seen: Instant,
    revoke_deadline: Option<Instant>,
    /// A classic member must sync (after joining) or rejoin (after being
    /// told to) by then: Kafka's sync and join timeouts.
    classic_deadline: Option<Instant>,
}

impl Member {
    fn new(id: String, now: Instant) -> Member {
        Member {
            id,
            instance_id: None,
            rack_id: None,
            client_id: String::new(),
            client_host: String::new(),
            subscribed_names: Vec::new(),
            subscribed_regex: None,
            server_assignor: None,
            rebalance_timeout_ms: -1,
            epoch: 0,
            previous_epoch: -1,
            state: MemberState::Stable,
            assigned: Assignment::new(),
            revoking: Assignment::new(),
            classic: None,
            last_seen: now,
            revoke_deadline: None,
            classic_deadline: None,
        }
    }

    fn metadata_value(&self) -> ConsumerMemberValue {
        ConsumerMemberValue {
            instance_id: self.instance_id.clone(),
            rack_id: self.rack_id.clone(),
            client_id: self.client_id.clone(),
            client_host: self.client_host.clone(),
            subscribed_topic_names: self.subscribed_names.clone(),
            subscribed_topic_regex: self.subscribed_regex.clone(),
            rebalance_timeout_ms: self.rebalance_timeout_ms,
            server_assignor: self.server_assignor.clone(),
            classic: self.classic.clone(),
        }
    }

    fn assignment_value(&self) -> CurrentAssignmentValue {
        CurrentAssignmentValue {
            member_epoch: self.epoch,
            previous_member_epoch: self.previous_epoch,
            state: self.state.code(),
            assigned: to_records(&self.assigned),
            revoking: to_records(&self.revoking),
        }
    }
}

/// A ConsumerGroupHeartbeat, decoded. `None` fields did not change since
/// the member's last heartbeat.
#[derive(Debug, Clone, Default)]
pub(crate) struct HeartbeatParams {
    pub member_id: String,
    pub member_epoch: i32,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    /// -1: unchanged.
    pub rebalance_timeout_ms: i32,
    pub subscribed_topic_names: Option<Vec<String>>,
    /// An empty string clears the regex.
    pub subscribed_topic_regex: Option<String>,
    pub server_assignor: Option<String>,
    pub owned: Option<TopicPartitions>,
    pub client_id: String,
    pub client_host: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HeartbeatResult {
    pub member_id: String,
    pub member_epoch: i32,
    pub heartbeat_interval_ms: i32,
    /// Sent when it changed or the request was a full one.
    pub assignment: Option<Assignment>,
}

/// Checks the fields Kafka requires (INVALID_REQUEST otherwise).
/// `version` is the ConsumerGroupHeartbeat version: from v1 the client
/// generates its member id.
pub(crate) fn validate(
    group_id: &str,
    p: &HeartbeatParams,
    version: i16,
) -> Result<(), CoordinatorError> {
    let invalid = |m: &str| Err(CoordinatorError::InvalidRequest(m.to_string()));
    if group_id.is_empty() {
        return invalid("GroupId can't be empty.");
    }
    if p.instance_id.as_deref() == Some("") {
        return invalid("InstanceId can't be empty.");
    }
    if p.rack_id.as_deref() == Some("") {
        return invalid("RackId can't be empty.");
    }
    if p.member_id.is_empty() && (version >= 1 || p.member_epoch != 0) {
        return invalid("MemberId can't be empty.");
    }
    match p.member_epoch {
        0 => {
            if p.rebalance_timeout_ms == -1 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if !p.owned.as_ref().is_some_and(Vec::is_empty) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
            if p.subscribed_topic_names.is_none() && p.subscribed_topic_regex.is_none() {
                return invalid(
                    "SubscribedTopicNames or SubscribedTopicRegex must be set in first request.",
                );
            }
        }
        STATIC_LEAVE_EPOCH if p.instance_id.is_none() => {
            return invalid("InstanceId can't be null.");
        }
        e if e < STATIC_LEAVE_EPOCH => return invalid("MemberEpoch is invalid."),
        _ => {}
    }
    Ok(())
}

/// Kafka matches a subscription regex against whole topic names (RE2J's
/// `matches`); Rust's regex crate has RE2's syntax.
pub(crate) fn compile_regex(regex: &str) -> Result<regex::Regex, CoordinatorError> {
    regex::Regex::new(&format!("^(?:{regex})$"))
        .map_err(|e| CoordinatorError::InvalidRegularExpression(e.to_string()))
}

pub(crate) struct ConsumerGroup {
    pub id: String,
    pub epoch: i32,
    pub assignment_epoch: i32,
    metadata_hash: i64,
    members: BTreeMap<String, Member>,
    target: BTreeMap<String, Assignment>,
    /// Who holds each partition (assigned or still revoking): at most one member.
    owners: HashMap<(Uuid, i32), String>,
    /// Wall-clock ms since the group has had no members (offset expiry).
    pub empty_since_ms: i64,
    regexes: HashMap<String, regex::Regex>,
}

impl ConsumerGroup {
    pub(crate) fn new(id: &str, now_ms: i64) -> ConsumerGroup {
        ConsumerGroup {
            id: id.to_string(),
            epoch: 0,
            assignment_epoch: 0,
            metadata_hash: 0,
            members: BTreeMap::new(),
            target: BTreeMap::new(),
            owners: HashMap::new(),
            empty_since_ms: now_ms,
            regexes: HashMap::new(),
        }
    }

    pub(crate) fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    pub(crate) fn member(&self, id: &str) -> Option<&Member> {
        self.members.get(id)
    }

    pub(crate) fn has_members(&self) -> bool {
        !self.members.is_empty()
    }

    pub(crate) fn target_of(&self, member_id: &str) -> Option<&Assignment> {
        self.target.get(member_id)
    }

    /// Kafka's group states: Empty, Assigning, Reconciling, Stable.
    pub(crate) fn state(&self) -> &'static str {
        if self.members.is_empty() {
            "Empty"
        } else if self.epoch > self.assignment_epoch {
            "Assigning"
        } else if self
            .members
            .values()
            .any(|m| m.epoch != self.assignment_epoch || m.state != MemberState::Stable)
        {
            "Reconciling"
        } else {
            "Stable"
        }
    }

    /// The assignor the group uses: the one most members ask for, else the
    /// broker's default.
    pub(crate) fn assignor(&self, cfg: &ConsumerGroupConfig) -> String {
        let mut votes: BTreeMap<&str, usize> = BTreeMap::new();
        for m in self.members.values() {
            if let Some(a) = &m.server_assignor {
                *votes.entry(a).or_default() += 1;
            }
        }
        votes
            .into_iter()
            .max_by_key(|(name, n)| (*n, std::cmp::Reverse(*name)))
            .map(|(name, _)| name.to_string())
            .unwrap_or_else(|| {
                cfg.assignors
                    .first()
                    .cloned()
                    .unwrap_or_else(|| assignor::UNIFORM.to_string())
            })
    }

    fn static_member_id(&self, instance_id: &str) -> Option<String> {
        self.members
            .values()
            .find(|m| m.instance_id.as_deref() == Some(instance_id))
            .map(|m| m.id.clone())
    }

    /// The existing topics a member subscribes to, by name and through its regex.
    fn member_topics(&mut self, member_id: &str, topics: &Topics) -> BTreeSet<String> {
        let Some(m) = self.members.get(member_id) else {
            return BTreeSet::new();
        };
        let mut out: BTreeSet<String> = m
            .subscribed_names
            .iter()
            .filter(|t| topics.contains_key(*t))
            .cloned()
            .collect();
        if let Some(r) = m.subscribed_regex.clone() {
            if !self.regexes.contains_key(&r) {
                match compile_regex(&r) {
                    Ok(re) => {
                        self.regexes.insert(r.clone(), re);
                    }
                    Err(_) => return out,
                }
            }
            let re = &self.regexes[&r];
            out.extend(
                topics
                    .iter()
                    .filter(|(name, t)| !t.internal && re.is_match(name))
                    .map(|(name, _)| name.clone()),
            );
        }
        out
    }

    /// Topic names the members subscribe to, resolved against `topics`.
    pub(crate) fn subscribed_topics(&mut self, topics: &Topics) -> BTreeSet<String> {
        let ids: Vec<String> = self.members.keys().cloned().collect();
        ids.iter()
            .flat_map(|id| self.member_topics(id, topics))
            .collect()
    }

    fn metadata_hash(&mut self, topics: &Topics) -> i64 {
        metadata_hash(&self.subscribed_topics(topics), topics)
    }

    /// ConsumerGroupHeartbeat, validated with `validate`. New member ids
    /// (version 0 clients send none) come from `new_member_id`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn heartbeat(
        &mut self,
        p: HeartbeatParams,
        now: Instant,
        now_ms: i64,
        topics: &Topics,
        cfg: &ConsumerGroupConfig,
        new_member_id: impl FnOnce() -> String,
        records: &mut Records,
    ) -> Result<HeartbeatResult, CoordinatorError> {
        if let Some(name) = &p.server_assignor {
            if !cfg.assignors.iter().any(|a| a == name) {
                return Err(CoordinatorError::UnsupportedAssignor(format!(
                    "ServerAssignor {name} is not supported. Supported assignors: {}.",
                    cfg.assignors.join(", ")
                )));
            }
        }
        if let Some(r) = p
            .subscribed_topic_regex
            .as_deref()
            .filter(|r| !r.is_empty())
        {
            compile_regex(r)?;
        }
        if p.member_epoch == LEAVE_EPOCH || p.member_epoch == STATIC_LEAVE_EPOCH {
            return self.leave(&p, now, now_ms, topics, cfg, records);
        }
        let interval = cfg.heartbeat_interval.as_millis() as i32;
        let member_id = self.admit(&p, now, cfg, new_member_id, records)?;
        let before = self.members[&member_id].clone();
        let changed_subscription;
        {
            let m = self.members.get_mut(&member_id).expect("admitted");
            m.last_seen = now;
            if let Some(iid) = &p.instance_id {
                m.instance_id = Some(iid.clone());
            }
            if let Some(rack) = &p.rack_id {
                m.rack_id = Some(rack.clone());
            }
            if p.rebalance_timeout_ms != -1 {
                m.rebalance_timeout_ms = p.rebalance_timeout_ms;
            }
            if let Some(names) = &p.subscribed_topic_names {
                let mut names = names.clone();
                names.sort();
                names.dedup();
                m.subscribed_names = names;
            }
            if let Some(r) = &p.subscribed_topic_regex {
                m.subscribed_regex = Some(r.clone()).filter(|r| !r.is_empty());
            }
            if let Some(a) = &p.server_assignor {
                m.server_assignor = Some(a.clone());
            }
            m.client_id = p.client_id.clone();
            m.client_host = p.client_host.clone();
            changed_subscription = m.subscribed_names != before.subscribed_names
                || m.subscribed_regex != before.subscribed_regex
                || m.server_assignor != before.server_assignor;
            if m.metadata_value() != before.metadata_value() || p.member_epoch == 0 {
                records.push((
                    member_key(&self.id, &member_id, 5),
                    Some(m.metadata_value().encode()),
                ));
            }
        }
        self.empty_since_ms = now_ms;
        self.refresh(changed_subscription, topics, cfg, records);
        let owned = p.owned.as_ref().map(from_records);
        self.reconcile(&member_id, owned.as_ref(), now, records);
        let m = &self.members[&member_id];
        let full = p.member_epoch == 0
            || (p.rebalance_timeout_ms != -1
                && (p.subscribed_topic_names.is_some() || p.subscribed_topic_regex.is_some())
                && p.owned.is_some());
        Ok(HeartbeatResult {
            member_id: member_id.clone(),
            member_epoch: m.epoch,
            heartbeat_interval_ms: interval,
            assignment: (full || m.assigned != before.assigned).then(|| m.assigned.clone()),
        })
    }

    /// Finds (or, joining, creates) the member a heartbeat is from.
    fn admit(
        &mut self,
        p: &HeartbeatParams,
        now: Instant,
        cfg: &ConsumerGroupConfig,
        new_member_id: impl FnOnce() -> String,
        records: &mut Records,
    ) -> Result<String, CoordinatorError> {
        if p.member_epoch != 0 {
            let m = match &p.instance_id {
                Some(iid) => match self.static_member_id(iid) {
                    Some(id) if id != p.member_id => {
                        return Err(CoordinatorError::FencedInstanceId)
                    }
                    Some(id) => &self.members[&id],
                    None => return Err(CoordinatorError::UnknownMemberId),
                },
                None => self
                    .members
                    .get(&p.member_id)
                    .ok_or(CoordinatorError::UnknownMemberId)?,
            };
            if m.classic.is_some() {
                return Err(CoordinatorError::UnknownMemberId);
            }
            let owned = p.owned.as_ref().map(from_records);
            if p.member_epoch > m.epoch {
                return Err(CoordinatorError::FencedMemberEpoch);
            }
            if p.member_epoch < m.epoch
                && (p.member_epoch != m.previous_epoch
                    || !owned.is_some_and(|o| is_subset(&o, &m.assigned)))
            {
                return Err(CoordinatorError::FencedMemberEpoch);
            }
            return Ok(m.id.clone());
        }
        let member_id = if p.member_id.is_empty() {
            new_member_id()
        } else {
            p.member_id.clone()
        };
        if let Some(iid) = &p.instance_id {
            if let Some(old_id) = self.static_member_id(iid) {
                let old = &self.members[&old_id];
                if old.epoch != STATIC_LEAVE_EPOCH && old_id != member_id {
                    return Err(CoordinatorError::UnreleasedInstanceId(iid.clone()));
                }
                self.take_over(&old_id, &member_id, now, records);
                self.members
                    .get_mut(&member_id)
                    .expect("taken over")
                    .classic = None;
                return Ok(member_id);
            }
        }
        if let Some(m) = self.members.get_mut(&member_id) {
            // A member rejoining under its id (after being fenced, or a
            // client restart) starts over: it owns nothing now.
            let held: Vec<(Uuid, i32)> = m
                .assigned
                .iter()
                .chain(&m.revoking)
                .flat_map(flatten)
                .collect();
            m.assigned.clear();
            m.revoking.clear();
            m.classic = None;
            m.classic_deadline = None;
            m.epoch = 0;
            m.previous_epoch = -1;
            m.state = MemberState::Stable;
            m.revoke_deadline = None;
            for tp in held {
                self.owners.remove(&tp);
            }
            return Ok(member_id);
        }
        if self.members.len() >= cfg.max_size {
            return Err(CoordinatorError::GroupMaxSizeReached(cfg.max_size));
        }
        self.members
            .insert(member_id.clone(), Member::new(member_id.clone(), now));
        Ok(member_id)
    }

    /// A static member is back under a new member id: the new incarnation
    /// takes over its partitions and epoch, so nothing rebalances.
    fn take_over(&mut self, old_id: &str, member_id: &str, now: Instant, records: &mut Records) {
        let mut m = self.members.remove(old_id).expect("present");
        if old_id != member_id {
            for key in [8, 7, 5] {
                records.push((member_key(&self.id, old_id, key), None));
            }
            if let Some(t) = self.target.remove(old_id) {
                records.push((
                    member_key(&self.id, member_id, 7),
                    Some(encode_target(&to_records(&t))),
                ));
                self.target.insert(member_id.to_string(), t);
            }
        }
        if m.epoch == STATIC_LEAVE_EPOCH {
            m.epoch = m.previous_epoch.max(0);
        }
        m.id = member_id.to_string();
        m.last_seen = now;
        for tp in m.assigned.iter().chain(&m.revoking).flat_map(flatten) {
            self.owners.insert(tp, member_id.to_string());
        }
        records.push((
            member_key(&self.id, member_id, 8),
            Some(m.assignment_value().encode()),
        ));
        self.members.insert(member_id.to_string(), m);
    }

    fn leave(
        &mut self,
        p: &HeartbeatParams,
        now: Instant,
        now_ms: i64,
        topics: &Topics,
        cfg: &ConsumerGroupConfig,
        records: &mut Records,
    ) -> Result<HeartbeatResult, CoordinatorError> {
        let id = match &p.instance_id {
            Some(iid) => match self.static_member_id(iid) {
                Some(id) if id != p.member_id => return Err(CoordinatorError::FencedInstanceId),
                Some(id) => id,
                None => return Err(CoordinatorError::UnknownMemberId),
            },
            None if self.members.contains_key(&p.member_id) => p.member_id.clone(),
            None => return Err(CoordinatorError::UnknownMemberId),
        };
        let result = HeartbeatResult {
            member_id: id.clone(),
            member_epoch: p.member_epoch,
            heartbeat_interval_ms: 0,
            assignment: None,
        };
        if p.member_epoch == STATIC_LEAVE_EPOCH {
            // It keeps its partitions for the session timeout, so a restart
            // inside it costs no rebalance.
            let m = self.members.get_mut(&id).expect("present");
            if m.epoch != STATIC_LEAVE_EPOCH {
                m.previous_epoch = m.epoch;
                m.epoch = STATIC_LEAVE_EPOCH;
            }
            m.last_seen = now;
            let value = m.assignment_value().encode();
            records.push((member_key(&self.id, &id, 8), Some(value)));
            return Ok(result);
        }
        self.remove_members(&[id], now_ms, topics, cfg, records);
        Ok(result)
    }

    /// Drops members (left, expired or fenced): their partitions are free
    /// at once, and the group epoch moves on.
    pub(crate) fn remove_members(
        &mut self,
        ids: &[String],
        now_ms: i64,
        topics: &Topics,
        cfg: &ConsumerGroupConfig,
        records: &mut Records,
    ) {
        let mut removed = false;
        for id in ids {
            let Some(m) = self.members.remove(id) else {
                continue;
            };
            removed = true;
            for tp in m.assigned.iter().chain(&m.revoking).flat_map(flatten) {
                if self.owners.get(&tp) == Some(id) {
                    self.owners.remove(&tp);
                }
            }
            self.target.remove(id);
            for key in [8, 7, 5] {
                records.push((member_key(&self.id, id, key), None));
            }
        }
        if removed {
            if self.members.is_empty() {
                self.empty_since_ms = now_ms;
            }
            self.refresh(true, topics, cfg, records);
        }
    }

    /// Bumps the group epoch when subscriptions or the subscribed topics
    /// changed, and computes the target assignment of a new epoch.
    fn refresh(
        &mut self,
        bump: bool,
        topics: &Topics,
        cfg: &ConsumerGroupConfig,
        records: &mut Records,
    ) {
        let hash = self.metadata_hash(topics);
        if bump || hash != self.metadata_hash {
            self.epoch += 1;
            self.metadata_hash = hash;
            let value = ConsumerGroupValue {
                epoch: self.epoch,
                metadata_hash: hash,
            };
            records.push((
                RecordKey::ConsumerGroup {
                    group: self.id.clone(),
                },
                Some(value.encode()),
            ));
        }
        if self.epoch <= self.assignment_epoch {
            return;
        }
        let ids: Vec<String> = self.members.keys().cloned().collect();
        let mut subscriptions: Vec<(String, BTreeSet<Uuid>)> = Vec::new();
        let mut partitions: BTreeMap<Uuid, i32> = BTreeMap::new();
        for id in &ids {
            let names = self.member_topics(id, topics);
            let set = names
                .iter()
                .map(|n| {
                    let t = &topics[n];
                    partitions.insert(t.id, t.partitions);
                    t.id
                })
                .collect();
            subscriptions.push((id.clone(), set));
        }
        let members: Vec<AssignorMember<'_>> = subscriptions
            .iter()
            .map(|(id, set)| AssignorMember {
                id,
                topics: set.clone(),
                previous: self.target.get(id),
            })
            .collect();
        let target = assignor::assign(&self.assignor(cfg), &members, &partitions);
        for (id, a) in &target {
            if self.target.get(id) != Some(a) {
                records.push((
                    member_key(&self.id, id, 7),
                    Some(encode_target(&to_records(a))),
                ));
            }
        }
        self.target = target;
        self.assignment_epoch = self.epoch;
        records.push((
            RecordKey::TargetAssignment {
                group: self.id.clone(),
            },
            Some(encode_assignment_epoch(self.assignment_epoch)),
        ));
    }

    /// Moves a member towards its target (Kafka's CurrentAssignmentBuilder).
    /// `owned` is what the member reported owning, `None` if unchanged.
    fn reconcile(
        &mut self,
        id: &str,
        owned: Option<&Assignment>,
        now: Instant,
        records: &mut Records,
    ) {
        let target = self.target.get(id).cloned().unwrap_or_default();
        let target_epoch = self.assignment_epoch;
        let m = &self.members[id];
        if m.epoch == STATIC_LEAVE_EPOCH {
            return;
        }
        let owns_any = |revoking: &Assignment| match owned {
            None => true,
            Some(o) => revoking
                .iter()
                .flat_map(flatten)
                .any(|(t, p)| o.get(&t).is_some_and(|s| s.contains(&p))),
        };
        match m.state {
            MemberState::Stable if m.epoch == target_epoch => return,
            MemberState::UnrevokedPartitions if owns_any(&m.revoking) => return,
            _ => {}
        }
        let mut kept = Assignment::new();
        let mut revoke = Assignment::new();
        let mut added = Assignment::new();
        let mut unreleased = false;
        let topics: BTreeSet<Uuid> = m.assigned.keys().chain(target.keys()).copied().collect();
        let empty = BTreeSet::new();
        for t in topics {
            let current = m.assigned.get(&t).unwrap_or(&empty);
            let wanted = target.get(&t).unwrap_or(&empty);
            for &p in current {
                let into = if wanted.contains(&p) {
                    &mut kept
                } else {
                    &mut revoke
                };
                into.entry(t).or_default().insert(p);
            }
            for &p in wanted.difference(current) {
                match self.owners.get(&(t, p)) {
                    Some(owner) if owner != id => unreleased = true,
                    _ => {
                        added.entry(t).or_default().insert(p);
                    }
                }
            }
        }
        let (epoch, state, assigned, revoking) = if !revoke.is_empty() && owns_any(&revoke) {
            (m.epoch, MemberState::UnrevokedPartitions, kept, revoke)
        } else {
            let mut assigned = kept;
            for (t, ps) in added {
                assigned.entry(t).or_default().extend(ps);
            }
            let state = if unreleased {
                MemberState::UnreleasedPartitions
            } else {
                MemberState::Stable
            };
            (target_epoch, state, assigned, Assignment::new())
        };
        let rebalance_timeout = Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64);
        let m = self.members.get_mut(id).expect("present");
        if epoch == m.epoch && state == m.state && assigned == m.assigned && revoking == m.revoking
        {
            return;
        }
        for tp in m.assigned.iter().chain(&m.revoking).flat_map(flatten) {
            if self.owners.get(&tp).is_some_and(|o| o == id) {
                self.owners.remove(&tp);
            }
        }
        for tp in assigned.iter().chain(&revoking).flat_map(flatten) {
            self.owners.insert(tp, id.to_string());
        }
        if epoch != m.epoch {
            m.previous_epoch = m.epoch;
            m.epoch = epoch;
        }
        if state == MemberState::UnrevokedPartitions && m.state != state {
            m.revoke_deadline = Some(now + rebalance_timeout);
        } else if state != MemberState::UnrevokedPartitions {
            m.revoke_deadline = None;
        }
        m.state = state;
        m.assigned = assigned;
        m.revoking = revoking;
        let value = m.assignment_value().encode();
        records.push((member_key(&self.id, id, 8), Some(value)));
    }

    /// Members whose session lapsed, or that did not revoke within their
    /// rebalance timeout.
    pub(crate) fn expired(&self, now: Instant, cfg: &ConsumerGroupConfig) -> Vec<String> {
        self.members
            .values()
            .filter(|m| {
                let session = match &m.classic {
                    Some(c) => Duration::from_millis(c.session_timeout_ms.max(0) as u64),
                    None => cfg.session_timeout,
                };
                now.duration_since(m.last_seen) > session
                    || m.revoke_deadline.is_some_and(|d| now >= d)
                    || m.classic_deadline.is_some_and(|d| now >= d)
            })
            .map(|m| m.id.clone())
            .collect()
    }

    /// Tombstones of the group's own records, for deleting an empty group.
    pub(crate) fn tombstones(&self) -> Records {
        vec![
            (
                RecordKey::TargetAssignment {
                    group: self.id.clone(),
                },
                None,
            ),
            (
                RecordKey::ConsumerGroup {
                    group: self.id.clone(),
                },
                None,
            ),
        ]
    }

    // Replay of the records above.

    pub(crate) fn restore_group(&mut self, v: &ConsumerGroupValue) {
        self.epoch = v.epoch;
        self.metadata_hash = v.metadata_hash;
    }

    pub(crate) fn restore_member(
        &mut self,
        id: &str,
        v: Option<ConsumerMemberValue>,
        now: Instant,
    ) {
        let Some(v) = v else {
            self.members.remove(id);
            return;
        };
        let m = self
            .members
            .entry(id.to_string())
            .or_insert_with(|| Member::new(id.to_string(), now));
        m.instance_id = v.instance_id;
        m.rack_id = v.rack_id;
        m.client_id = v.client_id;
        m.client_host = v.client_host;
        m.subscribed_names = v.subscribed_topic_names;
        m.subscribed_regex = v.subscribed_topic_regex;
        m.rebalance_timeout_ms = v.rebalance_timeout_ms;
        m.server_assignor = v.server_assignor;
        m.classic = v.classic;
    }

    pub(crate) fn restore_target(&mut self, id: &str, v: Option<TopicPartitions>) {
        match v {
            Some(v) => {
                self.target.insert(id.to_string(), from_records(&v));
            }
            None => {
                self.target.remove(id);
            }
        }
    }

    pub(crate) fn restore_assignment_epoch(&mut self, epoch: Option<i32>) {
        self.assignment_epoch = epoch.unwrap_or(0);
    }

    pub(crate) fn restore_current(
        &mut self,
        id: &str,
        v: Option<CurrentAssignmentValue>,
        now: Instant,
    ) {
        let Some(v) = v else { return };
        let m = self
            .members
            .entry(id.to_string())
            .or_insert_with(|| Member::new(id.to_string(), now));
        m.epoch = v.member_epoch;
        m.previous_epoch = v.previous_member_epoch;
        m.state = MemberState::from_code(v.state);
        m.assigned = from_records(&v.assigned);
        m.revoking = from_records(&v.revoking);
    }

    /// After replay: who owns what, and fresh timers (a restart costs no
    /// member its session).
    pub(crate) fn finish_restore(&mut self, now: Instant) {
        self.owners.clear();
        for m in self.members.values_mut() {
            m.last_seen = now;
            if m.state == MemberState::UnrevokedPartitions {
                m.revoke_deadline =
                    Some(now + Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64));
            }
            for tp in m.assigned.iter().chain(&m.revoking).flat_map(flatten) {
                self.owners.insert(tp, m.id.clone());
            }
        }
    }
}

/// What a classic member's JoinGroup gets back from a consumer group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassicJoined {
    pub member_id: String,
    /// The member's epoch, which classic members use as their generation.
    pub generation: i32,
    pub protocol_name: String,
}

/// Classic members of a consumer group (KIP-848's online migration): their
/// JoinGroup, SyncGroup, Heartbeat and LeaveGroup are translated onto the
/// member state machine above, so they get partitions from the server-side
/// assignor and hand them over through the same reconciliation as
/// consumer-protocol members. A rejoin stands in for the heartbeat that
/// reports what the member owns; Heartbeat answers REBALANCE_IN_PROGRESS
/// when the member has something to catch up with.
impl ConsumerGroup {
    /// Once the `leaving` members are gone, will there be members left, all
    /// of them speaking the classic protocol?
    pub(crate) fn only_classic_members_without(&self, leaving: &[String]) -> bool {
        let mut rest = self.members.values().filter(|m| !leaving.contains(&m.id));
        let mut any = false;
        let all = rest.all(|m| {
            any = true;
            m.classic.is_some()
        });
        any && all
    }

    /// Kafka's supportsClassicProtocols: the embedded consumer protocol, and
    /// one protocol name every classic member supports.
    fn supports_classic(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if protocol_type != migration::CONSUMER_PROTOCOL_TYPE || protocols.is_empty() {
            return false;
        }
        let classic: Vec<&ClassicMemberMetadata> = self
            .members
            .values()
            .filter_map(|m| m.classic.as_ref())
            .collect();
        protocols.iter().any(|(name, _)| {
            classic
                .iter()
                .all(|c| c.protocols.iter().any(|(n, _)| n == name))
        })
    }

    /// The classic member a SyncGroup or Heartbeat names (Kafka's
    /// validateConsumerGroupMember and throwIfMemberDoesNotUseClassicProtocol).
    fn classic_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<&Member, CoordinatorError> {
        let m = match instance_id {
            Some(iid) => {
                let id = self
                    .static_member_id(iid)
                    .ok_or(CoordinatorError::UnknownMemberId)?;
                if id != member_id {
                    return Err(CoordinatorError::FencedInstanceId);
                }
                &self.members[&id]
            }
            None => self
                .members
                .get(member_id)
                .ok_or(CoordinatorError::UnknownMemberId)?,
        };
        if m.classic.is_none() {
            return Err(CoordinatorError::UnknownMemberId);
        }
        Ok(m)
    }

    /// Is a partition of the member's target still held by another member?
    fn waiting_on_unreleased(&self, m: &Member) -> bool {
        let Some(target) = self.target.get(&m.id) else {
            return false;
        };
        target.iter().flat_map(flatten).any(|(t, p)| {
            !m.assigned.get(&t).is_some_and(|s| s.contains(&p))
                && self.owners.get(&(t, p)).is_some_and(|o| *o != m.id)
        })
    }

    /// JoinGroup from a classic member. New member ids come from `new_member_id`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn classic_join(
        &mut self,
        p: JoinParams,
        now: Instant,
        now_ms: i64,
        topics: &Topics,
        cfg: &ConsumerGroupConfig,
        new_member_id: impl FnOnce() -> String,
        records: &mut Records,
    ) -> Result<ClassicJoined, CoordinatorError> {
        if !self.supports_classic(&p.protocol_type, &p.protocols) {
            return Err(CoordinatorError::InconsistentGroupProtocol);
        }
        let (first_name, first_metadata) = p.protocols[0].clone();
        let subscription = migration::decode_subscription(&first_metadata)
            .ok_or(CoordinatorError::InconsistentGroupProtocol)?;
        let full = |members: &BTreeMap<String, Member>, id: &str| {
            !members.contains_key(id) && members.len() >= cfg.max_size
        };
        let member_id = match &p.instance_id {
            Some(iid) => match self.static_member_id(iid) {
                Some(old) if p.member_id.is_empty() => {
                    let id = new_member_id();
                    self.take_over(&old, &id, now, records);
                    id
                }
                Some(old) if old == p.member_id => old,
                Some(_) => return Err(CoordinatorError::FencedInstanceId),
                None if !p.member_id.is_empty() => return Err(CoordinatorError::UnknownMemberId),
                None => new_member_id(),
            },
            None if p.member_id.is_empty() => {
                let id = new_member_id();
                if full(&self.members, &id) {
                    return Err(CoordinatorError::GroupMaxSizeReached(cfg.max_size));
                }
                if p.require_known_member_id {
                    return Err(CoordinatorError::MemberIdRequired(id));
                }
                id
            }
            None => p.member_id.clone(),
        };
        if full(&self.members, &member_id) {
            return Err(CoordinatorError::GroupMaxSizeReached(cfg.max_size));
        }
        if self
            .members
            .get(&member_id)
            .is_some_and(|m| m.classic.is_none())
        {
            return Err(CoordinatorError::UnknownMemberId);
        }
        let before = self
            .members
            .entry(member_id.clone())
            .or_insert_with(|| Member::new(member_id.clone(), now))
            .clone();
        let m = self.members.get_mut(&member_id).expect("inserted");
        m.last_seen = now;
        if p.instance_id.is_some() {
            m.instance_id = p.instance_id.clone();
        }
        if let Some(rack) = &subscription.rack_id {
            m.rack_id = Some(rack.to_string());
        }
        m.rebalance_timeout_ms = p.rebalance_timeout.as_millis() as i32;
        let mut names: Vec<String> = subscription.topics.iter().map(|t| t.to_string()).collect();
        names.sort();
        names.dedup();
        m.subscribed_names = names;
        m.subscribed_regex = None;
        m.client_id = p.client_id.clone();
        m.client_host = p.client_host.clone();
        m.classic = Some(ClassicMemberMetadata {
            session_timeout_ms: p.session_timeout.as_millis() as i32,
            protocols: p.protocols.clone(),
        });
        m.classic_deadline = Some(now + p.rebalance_timeout);
        let changed_subscription = m.subscribed_names != before.subscribed_names
            || m.subscribed_regex != before.subscribed_regex;
        if m.metadata_value() != before.metadata_value() {
            records.push((
                member_key(&self.id, &member_id, 5),
                Some(m.metadata_value().encode()),
            ));
        }
        self.empty_since_ms = now_ms;
        self.refresh(changed_subscription, topics, cfg, records);
        let mut owned = Assignment::new();
        for tp in &subscription.owned_partitions {
            if let Some(t) = topics.get(tp.topic.as_str()) {
                owned
                    .entry(t.id)
                    .or_default()
                    .extend(tp.partitions.iter().copied());
            }
        }
        self.reconcile(&member_id, Some(&owned), now, records);
        Ok(ClassicJoined {
            generation: self.members[&member_id].epoch,
            member_id,
            protocol_name: first_name,
        })
    }

    /// If a rebalance started since the member joined, it must rejoin first
    /// (unless it is still revoking: that finishes with its next rejoin).
    fn check_classic_rebalance(&mut self, id: &str, now: Instant) -> Result<(), CoordinatorError> {
        let epoch = self.epoch;
        let m = self.members.get_mut(id).expect("validated");
        if epoch > m.epoch && m.state != MemberState::UnrevokedPartitions {
            let timeout = Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64);
            m.classic_deadline.get_or_insert(now + timeout);
            return Err(CoordinatorError::RebalanceInProgress);
        }
        Ok(())
    }

    /// SyncGroup from a classic member: its current assignment, in the
    /// embedded consumer protocol at the version it subscribed with.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn classic_sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        now: Instant,
        topics: &Topics,
    ) -> Result<(String, Bytes), CoordinatorError> {
        let m = self.classic_member(member_id, instance_id)?;
        if generation != m.epoch {
            return Err(CoordinatorError::IllegalGeneration);
        }
        let (name, metadata) = m
            .classic
            .as_ref()
            .and_then(|c| c.protocols.first().cloned())
            .unwrap_or_default();
        if protocol_type.is_some_and(|t| t != migration::CONSUMER_PROTOCOL_TYPE)
            || protocol_name.is_some_and(|n| n != name)
        {
            return Err(CoordinatorError::InconsistentGroupProtocol);
        }
        let id = m.id.clone();
        self.check_classic_rebalance(&id, now)?;
        let m = self.members.get_mut(&id).expect("validated");
        m.classic_deadline = None;
        m.last_seen = now;
        let version = migration::protocol_version(&metadata);
        Ok((
            name,
            migration::encode_assignment(&m.assigned, topics, version),
        ))
    }

    /// Heartbeat from a classic member: REBALANCE_IN_PROGRESS when it must
    /// rejoin to catch up with the group epoch, finish revoking, or collect
    /// partitions that have been released to it.
    pub(crate) fn classic_heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Result<(), CoordinatorError> {
        let m = self.classic_member(member_id, instance_id)?;
        if generation != m.epoch {
            return Err(CoordinatorError::IllegalGeneration);
        }
        let rejoin = m.epoch < self.epoch
            || m.state == MemberState::UnrevokedPartitions
            || (m.state == MemberState::UnreleasedPartitions && !self.waiting_on_unreleased(m));
        let id = m.id.clone();
        let m = self.members.get_mut(&id).expect("validated");
        m.last_seen = now;
        if rejoin {
            let timeout = Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64);
            m.classic_deadline.get_or_insert(now + timeout);
            return Err(CoordinatorError::RebalanceInProgress);
        }
        Ok(())
    }

    /// The member a LeaveGroup names (of either kind: the admin client
    /// removes members this way too).
    pub(crate) fn leaving_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<String, CoordinatorError> {
        match instance_id {
            Some(iid) => {
                let id = self
                    .static_member_id(iid)
                    .ok_or(CoordinatorError::UnknownMemberId)?;
                if !member_id.is_empty() && id != member_id {
                    return Err(CoordinatorError::FencedInstanceId);
                }
                Ok(id)
            }
            None if self.members.contains_key(member_id) => Ok(member_id.to_string()),
            None => Err(CoordinatorError::UnknownMemberId),
        }
    }

    /// A classic group's members, as consumer-group members that keep their
    /// assignment at epoch = the generation (Kafka's fromClassicGroup). The
    /// records that write the new group out are appended to `records`.
    pub(crate) fn from_classic(
        g: &super::group::Group,
        topics: &Topics,
        now: Instant,
        now_ms: i64,
        records: &mut Records,
    ) -> Result<ConsumerGroup, CoordinatorError> {
        let mut cg = ConsumerGroup::new(&g.id, now_ms);
        cg.epoch = g.generation;
        cg.assignment_epoch = g.generation;
        let protocol = g.protocol.clone();
        for cm in g.members() {
            let name = protocol
                .clone()
                .or_else(|| cm.protocols.first().map(|(n, _)| n.clone()))
                .unwrap_or_default();
            let subscription = migration::decode_subscription(&cm.metadata(&name))
                .ok_or(CoordinatorError::GroupIdNotFound)?;
            let mut assigned = Assignment::new();
            for (topic, partitions) in migration::decode_assignment(&cm.assignment)
                .ok_or(CoordinatorError::GroupIdNotFound)?
            {
                let Some(t) = topics.get(&topic) else {
                    continue;
                };
                for p in partitions {
                    // A partition keeps at most one owner, whatever a stale
                    // assignment says.
                    if let std::collections::hash_map::Entry::Vacant(e) = cg.owners.entry((t.id, p))
                    {
                        e.insert(cm.id.clone());
                        assigned.entry(t.id).or_default().insert(p);
                    }
                }
            }
            let mut names: Vec<String> =
                subscription.topics.iter().map(|t| t.to_string()).collect();
            names.sort();
            names.dedup();
            let mut m = Member::new(cm.id.clone(), now);
            m.instance_id = cm.instance_id.clone();
            m.rack_id = subscription.rack_id.as_ref().map(|r| r.to_string());
            m.client_id = cm.client_id.clone();
            m.client_host = cm.client_host.clone();
            m.subscribed_names = names;
            m.rebalance_timeout_ms = cm.rebalance_timeout.as_millis() as i32;
            m.epoch = g.generation;
            m.previous_epoch = g.generation;
            m.assigned = assigned.clone();
            m.classic = Some(ClassicMemberMetadata {
                session_timeout_ms: cm.session_timeout.as_millis() as i32,
                protocols: cm.protocols.clone(),
            });
            cg.target.insert(cm.id.clone(), assigned);
            cg.members.insert(cm.id.clone(), m);
        }
        for m in cg.members.values() {
            records.push((
                member_key(&cg.id, &m.id, 5),
                Some(m.metadata_value().encode()),
            ));
        }
        records.push((
            RecordKey::ConsumerGroup {
                group: cg.id.clone(),
            },
            Some(
                ConsumerGroupValue {
                    epoch: cg.epoch,
                    metadata_hash: 0,
                }
                .encode(),
            ),
        ));
        for (id, t) in &cg.target {
            records.push((
                member_key(&cg.id, id, 7),
                Some(encode_target(&to_records(t))),
            ));
        }
        records.push((
            RecordKey::TargetAssignment {
                group: cg.id.clone(),
            },
            Some(encode_assignment_epoch(cg.assignment_epoch)),
        ));
        for m in cg.members.values() {
            records.push((
                member_key(&cg.id, &m.id, 8),
                Some(m.assignment_value().encode()),
            ));
        }
        Ok(cg)
    }

    /// Tombstones of every record of the group and its members (the group
    /// goes back to the classic protocol).
    pub(crate) fn all_tombstones(&self) -> Records {
        let mut records = Records::new();
        for id in self.members.keys() {
            for key in [8, 7, 5] {
                records.push((member_key(&self.id, id, key), None));
            }
        }
        records.extend(self.tombstones());
        records
    }
}

/// FNV-1a over the name, id and partition count of each of `names` that
/// exists: a group's view of its topics, which changes when they do.
pub(crate) fn metadata_hash(names: &BTreeSet<impl AsRef<str>>, topics: &Topics) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for name in names {
        if let Some(t) = topics.get(name.as_ref()) {
            eat(name.as_ref().as_bytes());
            eat(t.id.as_bytes());
            eat(&t.partitions.to_be_bytes());
        }
    }
    h as i64
}

/// The key of a member's record: 5 subscription, 7 target, 8 current assignment.
fn member_key(group: &str, member: &str, kind: u8) -> RecordKey {
    let (group, member) = (group.to_string(), member.to_string());
    match kind {
        5 => RecordKey::ConsumerMember { group, member },
        7 => RecordKey::TargetMember { group, member },
        _ => RecordKey::CurrentAssignment { group, member },
    }
}

fn flatten<'a>((t, ps): (&'a Uuid, &'a BTreeSet<i32>)) -> impl Iterator<Item = (Uuid, i32)> + 'a {
    ps.iter().map(move |p| (*t, *p))
}

fn is_subset(a: &Assignment, of: &Assignment) -> bool {
    a.iter()
        .all(|(t, ps)| ps.is_empty() || of.get(t).is_some_and(|o| ps.is_subset(o)))
}

pub(crate) fn to_records(a: &Assignment) -> TopicPartitions {
    a.iter()
        .filter(|(_, ps)| !ps.is_empty())
        .map(|(t, ps)| (*t, ps.iter().copied().collect()))
        .collect()
}

pub(crate) fn from_records(tps: &TopicPartitions) -> Assignment {
    let mut a = Assignment::new();
    for (t, ps) in tps {
        if !ps.is_empty() {
            a.entry(*t).or_default().extend(ps.iter().copied());
        }
    }
    a
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::clock::{Clock, ManualClock};
    use crate::coordinator::records::RecordKey;

    const SECOND: Duration = Duration::from_secs(1);

    fn topic(n: u128, partitions: i32) -> TopicMeta {
        TopicMeta {
            id: Uuid::from_u128(n),
            partitions,
            internal: false,
        }
    }

    /// A group with the clock it lives by and every record it wrote.
    struct Harness {
        group: ConsumerGroup,
        clock: Arc<ManualClock>,
        topics: Topics,
        cfg: ConsumerGroupConfig,
        log: Records,
    }

    impl Harness {
        fn new(topics: &[(&str, TopicMeta)]) -> Harness {
            let clock = ManualClock::new(1_700_000_000_000);
            Harness {
                group: ConsumerGroup::new("g", clock.now_ms()),
                clock,
                topics: topics
                    .iter()
                    .map(|(n, t)| (n.to_string(), t.clone()))
                    .collect(),
                cfg: ConsumerGroupConfig {
                    session_timeout: 10 * SECOND,
                    ..Default::default()
                },
                log: Vec::new(),
            }
        }

        fn send(&mut self, p: HeartbeatParams) -> Result<HeartbeatResult, CoordinatorError> {
            validate("g", &p, 1)?;
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            self.group.heartbeat(
                p,
                now,
                now_ms,
                &self.topics,
                &self.cfg,
                || "generated".into(),
                &mut self.log,
            )
        }

        fn join(&mut self, id: &str, topics: &[&str]) -> HeartbeatResult {
            self.send(join_params(id, topics)).unwrap()
        }

        /// A heartbeat reporting what the member owns.
        fn beat(
            &mut self,
            id: &str,
            epoch: i32,
            owned: &Assignment,
        ) -> Result<HeartbeatResult, CoordinatorError> {
            self.send(HeartbeatParams {
                member_id: id.into(),
                member_epoch: epoch,
                rebalance_timeout_ms: -1,
                owned: Some(to_records(owned)),
                ..Default::default()
            })
        }

        fn advance(&mut self, by: Duration) {
            self.clock.advance(by);
            let expired = self.group.expired(self.clock.now(), &self.cfg);
            let now_ms = self.clock.now_ms();
            self.group
                .remove_members(&expired, now_ms, &self.topics, &self.cfg, &mut self.log);
        }

        fn assert_single_owners(&self) {
            let mut seen = BTreeSet::new();
            for m in self.group.members() {
                for tp in m.assigned.iter().chain(&m.revoking).flat_map(flatten) {
                    assert!(seen.insert(tp), "{tp:?} owned twice");
                }
            }
        }
    }

    fn join_params(id: &str, topics: &[&str]) -> HeartbeatParams {
        HeartbeatParams {
            member_id: id.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 30_000,
            subscribed_topic_names: Some(topics.iter().map(|t| t.to_string()).collect()),
            owned: Some(Vec::new()),
            client_id: "client".into(),
            client_host: "/127.0.0.1".into(),
            ..Default::default()
        }
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn first_member_gets_every_partition_at_epoch_one() {
        let mut h = Harness::new(&[("t", topic(1, 4))]);
        let r = h.join("a", &["t"]);
        assert_eq!(r.member_epoch, 1);
        assert_eq!(r.heartbeat_interval_ms, 5000);
        assert_eq!(count(r.assignment.as_ref().unwrap()), 4);
        assert_eq!(h.group.state(), "Stable");
        assert_eq!((h.group.epoch, h.group.assignment_epoch), (1, 1));
    }

    #[test]
    fn partitions_move_to_a_new_member_only_after_the_old_owner_revokes_them() {
        let mut h = Harness::new(&[("t", topic(1, 4))]);
        let a_all = h.join("a", &["t"]).assignment.unwrap();
        // b joins: epoch 2, but everything is still a's.
        let b = h.join("b", &["t"]);
        assert_eq!(h.group.epoch, 2);
        assert_eq!(b.member_epoch, 2);
        assert_eq!(
            count(b.assignment.as_ref().unwrap()),
            0,
            "got partitions a still owns"
        );
        assert_eq!(h.group.state(), "Reconciling");
        h.assert_single_owners();
        // a is asked to give two up and stays at epoch 1 meanwhile.
        let a = h.beat("a", 1, &a_all).unwrap();
        assert_eq!(a.member_epoch, 1);
        let a_kept = a.assignment.unwrap();
        assert_eq!(count(&a_kept), 2);
        // Until a says it revoked them, b gets nothing.
        assert_eq!(h.beat("b", 2, &Assignment::new()).unwrap().assignment, None);
        assert_eq!(h.beat("a", 1, &a_all).unwrap().member_epoch, 1);
        // a revoked: it moves to epoch 2, and b's next heartbeat brings the rest.
        let a = h.beat("a", 1, &a_kept).unwrap();
        assert_eq!(a.member_epoch, 2);
        let b_got = h
            .beat("b", 2, &Assignment::new())
            .unwrap()
            .assignment
            .unwrap();
        assert_eq!(count(&b_got), 2);
        assert!(b_got[&Uuid::from_u128(1)].is_disjoint(&a_kept[&Uuid::from_u128(1)]));
        h.assert_single_owners();
        h.beat("b", 2, &b_got).unwrap();
        assert_eq!(h.group.state(), "Stable");
    }

    #[test]
    fn a_member_leaving_frees_its_partitions_for_the_others() {
        let mut h = Harness::new(&[("t", topic(1, 4))]);
        let a_all = h.join("a", &["t"]).assignment.unwrap();
        h.join("b", &["t"]);
        let a_kept = h.beat("a", 1, &a_all).unwrap().assignment.unwrap();
        h.beat("a", 1, &a_kept).unwrap();
        let b_got = h
            .beat("b", 2, &Assignment::new())
            .unwrap()
            .assignment
            .unwrap();
        // a leaves: b gets everything at once, nothing to wait for.
        let left = h
            .send(HeartbeatParams {
                member_id: "a".into(),
                member_epoch: LEAVE_EPOCH,
                rebalance_timeout_ms: -1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(left.member_epoch, LEAVE_EPOCH);
        let b = h.beat("b", 2, &b_got).unwrap();
        assert_eq!(b.member_epoch, 3);
        assert_eq!(count(b.assignment.as_ref().unwrap()), 4);
        assert!(h.log.contains(&(
            RecordKey::ConsumerMember {
                group: "g".into(),
                member: "a".into()
            },
            None
        )));
    }

    #[test]
    fn a_member_whose_session_lapses_is_removed_and_its_partitions_reassigned() {
        let mut h = Harness::new(&[("t", topic(1, 2))]);
        let a_all = h.join("a", &["t"]).assignment.unwrap();
        h.join("b", &["t"]);
        let a_kept = h.beat("a", 1, &a_all).unwrap().assignment.unwrap();
        h.beat("a", 1, &a_kept).unwrap();
        // Only b keeps heartbeating.
        let mut b_owned = Assignment::new();
        for _ in 0..3 {
            h.advance(4 * SECOND);
            let r = h
                .beat("b", h.group.member("b").unwrap().epoch, &b_owned)
                .unwrap();
            if let Some(a) = r.assignment {
                b_owned = a;
            }
        }
        assert!(h.group.member("a").is_none(), "a outlived its session");
        assert_eq!(count(&b_owned), 2);
        assert_eq!(
            h.beat("a", 2, &a_kept),
            Err(CoordinatorError::UnknownMemberId),
            "a must rejoin"
        );
    }

    #[test]
    fn a_member_that_never_revokes_is_fenced_after_its_rebalance_timeout() {
        let mut h = Harness::new(&[("t", topic(1, 2))]);
        let a_all = h.join("a", &["t"]).assignment.unwrap();
        h.join("b", &["t"]);
        h.beat("a", 1, &a_all).unwrap();
        // a keeps heartbeating but still claims everything.
        for _ in 0..5 {
            h.advance(5 * SECOND);
            h.beat("a", 1, &a_all).unwrap();
            h.beat("b", 2, &Assignment::new()).unwrap();
        }
        assert!(h.group.member("a").is_some());
        h.advance(5 * SECOND);
        assert!(h.group.member("a").is_none(), "not fenced after 30 s");
        let b = h
            .beat("b", h.group.member("b").unwrap().epoch, &Assignment::new())
            .unwrap();
        assert_eq!(count(b.assignment.as_ref().unwrap()), 2);
    }

    #[test]
    fn epochs_newer_or_older_than_the_last_two_are_fenced() {
        let mut h = Harness::new(&[("t", topic(1, 2))]);
        let a_all = h.join("a", &["t"]).assignment.unwrap();
        h.join("b", &["t"]);
        let a_kept = h.beat("a", 1, &a_all).unwrap().assignment.unwrap();
        h.beat("a", 1, &a_kept).unwrap();
        assert_eq!(h.group.member("a").unwrap().epoch, 2);
        assert_eq!(
            h.beat("a", 3, &a_kept),
            Err(CoordinatorError::FencedMemberEpoch)
        );
        // The previous epoch is accepted (the bump may have been lost) if it
        // owns no more than its assignment...
        assert_eq!(h.beat("a", 1, &a_kept).unwrap().member_epoch, 2);
        // ...but not with partitions it gave up.
        assert_eq!(
            h.beat("a", 1, &a_all),
            Err(CoordinatorError::FencedMemberEpoch)
        );
        // A fenced member rejoins with epoch 0 and starts over.
        let again = h.join("a", &["t"]);
        assert!(again.member_epoch >= 2);
        h.assert_single_owners();
    }

    #[test]
    fn static_member_rejoining_after_a_temporary_leave_keeps_its_partitions() {
        let mut h = Harness::new(&[("t", topic(1, 2))]);
        let mut p = join_params("old", &["t"]);
        p.instance_id = Some("i1".into());
        let first = h.send(p.clone()).unwrap();
        let epoch = h.group.epoch;
        // Another process with the same instance id cannot join meanwhile.
        let mut other = p.clone();
        other.member_id = "new".into();
        assert_eq!(
            h.send(other.clone()),
            Err(CoordinatorError::UnreleasedInstanceId("i1".into()))
        );
        let left = h
            .send(HeartbeatParams {
                member_id: "old".into(),
                member_epoch: STATIC_LEAVE_EPOCH,
                instance_id: Some("i1".into()),
                rebalance_timeout_ms: -1,
                ..Default::default()
            })
            .unwrap();
        assert_eq!(left.member_epoch, STATIC_LEAVE_EPOCH);
        // Back under a new member id: same partitions, same epoch, no rebalance.
        let back = h.send(other).unwrap();
        assert_eq!(back.member_id, "new");
        assert_eq!(back.assignment, first.assignment);
        assert_eq!(back.member_epoch, first.member_epoch);
        assert_eq!(h.group.epoch, epoch);
        assert!(h.group.member("old").is_none());
        // The old incarnation is fenced.
        let mut stale = HeartbeatParams {
            member_id: "old".into(),
            member_epoch: 1,
            instance_id: Some("i1".into()),
            rebalance_timeout_ms: -1,
            ..Default::default()
        };
        assert_eq!(
            h.send(stale.clone()),
            Err(CoordinatorError::FencedInstanceId)
        );
        stale.instance_id = None;
        assert_eq!(h.send(stale), Err(CoordinatorError::UnknownMemberId));
    }

    #[test]
    fn a_regex_subscription_picks_up_a_topic_created_later() {
        let mut h = Harness::new(&[("orders-1", topic(1, 1)), ("other", topic(2, 1))]);
        let mut p = join_params("a", &[]);
        p.subscribed_topic_names = None;
        p.subscribed_topic_regex = Some("orders-.*".into());
        let r = h.send(p).unwrap();
        assert_eq!(
            r.assignment.unwrap().keys().copied().collect::<Vec<_>>(),
            [Uuid::from_u128(1)]
        );
        let owned = h.group.member("a").unwrap().assigned.clone();
        h.topics.insert("orders-2".into(), topic(3, 2));
        let r = h.beat("a", 1, &owned).unwrap();
        assert_eq!(r.member_epoch, 2, "a new matching topic bumps the epoch");
        assert_eq!(count(r.assignment.as_ref().unwrap()), 3);
        // Internal topics never match.
        h.topics.insert(
            "orders-internal".into(),
            TopicMeta {
                internal: true,
                ..topic(4, 1)
            },
        );
        let owned = h.group.member("a").unwrap().assigned.clone();
        assert_eq!(h.beat("a", 2, &owned).unwrap().member_epoch, 2);
    }

    #[test]
    fn bad_requests_get_kafkas_errors() {
        let mut h = Harness::new(&[("t", topic(1, 1))]);
        let invalid = |r: Result<HeartbeatResult, CoordinatorError>| {
            matches!(r, Err(CoordinatorError::InvalidRequest(_)))
        };
        let mut p = join_params("a", &["t"]);
        p.rebalance_timeout_ms = -1;
        assert!(invalid(h.send(p)));
        let mut p = join_params("a", &["t"]);
        p.owned = None;
        assert!(invalid(h.send(p)));
        let mut p = join_params("a", &["t"]);
        p.subscribed_topic_names = None;
        assert!(invalid(h.send(p)));
        assert!(
            invalid(h.send(join_params("", &["t"]))),
            "v1 needs a member id"
        );
        let mut p = join_params("a", &["t"]);
        p.member_epoch = -3;
        assert!(invalid(h.send(p)));
        let mut p = join_params("a", &["t"]);
        p.server_assignor = Some("sticky".into());
        assert!(matches!(
            h.send(p),
            Err(CoordinatorError::UnsupportedAssignor(_))
        ));
        let mut p = join_params("a", &["t"]);
        p.subscribed_topic_regex = Some("(".into());
        assert!(matches!(
            h.send(p),
            Err(CoordinatorError::InvalidRegularExpression(_))
        ));
        h.cfg.max_size = 1;
        h.join("a", &["t"]);
        assert_eq!(
            h.send(join_params("b", &["t"])),
            Err(CoordinatorError::GroupMaxSizeReached(1))
        );
        // Version 0 clients let the coordinator pick the member id.
        let p = join_params("", &["t"]);
        validate("g", &p, 0).unwrap();
    }

    #[test]
    fn the_members_preferred_assignor_wins_over_the_default() {
        let mut h = Harness::new(&[("t", topic(1, 4))]);
        assert_eq!(h.group.assignor(&h.cfg), "uniform");
        let mut p = join_params("a", &["t"]);
        p.server_assignor = Some("range".into());
        h.send(p).unwrap();
        assert_eq!(h.group.assignor(&h.cfg), "range");
    }

    #[test]
    fn replaying_the_records_rebuilds_the_group() {
        let mut h = Harness::new(&[("t", topic(1, 4))]);
        let a_all = h.join("a", &["t"]).assignment.unwrap();
        h.join("b", &["t"]);
        h.beat("a", 1, &a_all).unwrap();
        h.join("c", &["t"]);
        let mut restored = ConsumerGroup::new("g", 0);
        let now = h.clock.now();
        for (key, value) in h.log.clone() {
            match key {
                RecordKey::ConsumerGroup { .. } => {
                    restored.restore_group(&ConsumerGroupValue::decode(&value.unwrap()).unwrap())
                }
                RecordKey::ConsumerMember { member, .. } => restored.restore_member(
                    &member,
                    value.map(|v| ConsumerMemberValue::decode(&v).unwrap()),
                    now,
                ),
                RecordKey::TargetMember { member, .. } => restored.restore_target(
                    &member,
                    value.map(|v| super::super::records::decode_target(&v).unwrap()),
                ),
                RecordKey::TargetAssignment { .. } => restored.restore_assignment_epoch(
                    value.map(|v| super::super::records::decode_assignment_epoch(&v).unwrap()),
                ),
                RecordKey::CurrentAssignment { member, .. } => restored.restore_current(
                    &member,
                    value.map(|v| CurrentAssignmentValue::decode(&v).unwrap()),
                    now,
                ),
                other => panic!("unexpected record {other:?}"),
            }
        }
        restored.finish_restore(now);
        assert_eq!(
            (restored.epoch, restored.assignment_epoch),
            (h.group.epoch, h.group.assignment_epoch)
        );
        assert_eq!(restored.state(), h.group.state());
        assert_eq!(restored.target, h.group.target);
        assert_eq!(restored.owners, h.group.owners);
        for m in h.group.members() {
            let r = restored.member(&m.id).unwrap();
            assert_eq!(
                (r.epoch, r.previous_epoch, r.state),
                (m.epoch, m.previous_epoch, m.state)
            );
            assert_eq!((&r.assigned, &r.revoking), (&m.assigned, &m.revoking));
            assert_eq!(r.metadata_value(), m.metadata_value());
        }
    }
}
