//! One consumer group under Kafka's classic rebalance protocol.
//!
//! The state machine follows Kafka's GroupCoordinator: Empty →
//! PreparingRebalance (members join, or are dropped when the rebalance timeout
//! passes) → CompletingRebalance (the leader's SyncGroup brings the
//! assignment) → Stable, and back to PreparingRebalance whenever membership or
//! subscriptions change. Everything here is synchronous and takes the current
//! time, and the randomness new member ids are drawn from, as arguments, so
//! tests can drive it step by step; waiting members get a oneshot receiver
//! that a later call completes, so the coordinator can drive it from requests
//! and a timer.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::oneshot;

use super::records::{GroupValue, MemberValue, OffsetValue, RecordKey};
use super::{CoordinatorConfig, CoordinatorError};
use crate::clock::Random;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GroupState {
    Empty,
    PreparingRebalance,
    CompletingRebalance,
    Stable,
}

impl GroupState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            GroupState::Empty => "Empty",
            GroupState::PreparingRebalance => "PreparingRebalance",
            GroupState::CompletingRebalance => "CompletingRebalance",
            GroupState::Stable => "Stable",
        }
    }
}

/// A JoinGroup request, decoded.
#[derive(Debug, Clone)]
pub(crate) struct JoinParams {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocol_type: String,
    pub protocols: Vec<(String, Bytes)>,
    /// JoinGroup v4+: a new dynamic member first gets MEMBER_ID_REQUIRED.
    pub require_known_member_id: bool,
}

#[derive(Debug, Clone)]
pub(crate) struct JoinResult {
    pub generation: i32,
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub leader: String,
    pub member_id: String,
    /// Only the leader gets the members and their metadata for the chosen protocol.
    pub members: Vec<(String, Option<String>, Bytes)>,
}

#[derive(Debug, Clone)]
pub(crate) struct SyncResult {
    pub protocol_type: Option<String>,
    pub protocol_name: Option<String>,
    pub assignment: Bytes,
}

pub(crate) type JoinReply = Result<JoinResult, CoordinatorError>;
pub(crate) type SyncReply = Result<SyncResult, CoordinatorError>;

pub(crate) enum Pending<T> {
    Ready(Result<T, CoordinatorError>),
    Wait(oneshot::Receiver<Result<T, CoordinatorError>>),
}

#[derive(Debug)]
pub(crate) struct Member {
    pub id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub session_timeout: Duration,
    pub rebalance_timeout: Duration,
    pub protocols: Vec<(String, Bytes)>,
    pub assignment: Bytes,
    last_seen: Instant,
    join_waiter: Option<oneshot::Sender<JoinReply>>,
    sync_waiter: Option<oneshot::Sender<SyncReply>>,
}

impl Member {
    /// The member's metadata for `protocol` (its subscription).
    pub(crate) fn metadata(&self, protocol: &str) -> Bytes {
        self.protocols
            .iter()
            .find(|(n, _)| n == protocol)
            .map(|(_, m)| m.clone())
            .unwrap_or_default()
    }
}

struct Rebalance {
    /// Members that have not rejoined by then are dropped.
    deadline: Instant,
    /// The first rebalance of an empty group waits out
    /// group.initial.rebalance.delay.ms so members starting together land in
    /// one generation; each new joiner extends it, up to `deadline`.
    initial_delay_until: Option<Instant>,
}

pub(crate) struct Group {
    pub id: String,
    pub state: GroupState,
    pub protocol_type: Option<String>,
    pub protocol: Option<String>,
    pub generation: i32,
    pub leader: Option<String>,
    /// In join order; the first member becomes leader when one is needed.
    members: BTreeMap<u64, Member>,
    join_order: u64,
    /// Member ids handed out with MEMBER_ID_REQUIRED, until they expire.
    pending: HashMap<String, Instant>,
    pub offsets: BTreeMap<(String, i32), OffsetValue>,
    /// Wall-clock ms of the last state change (offset expiry counts from here).
    pub state_since_ms: i64,
    rebalance: Option<Rebalance>,
    /// Group metadata changed and must be written to the offsets log.
    pub dirty: bool,
    /// Set while the group runs the consumer protocol (KIP-848) instead;
    /// the classic state above is then empty. Offsets are shared.
    pub consumer: Option<super::consumer::ConsumerGroup>,
    /// Set while the group is a Streams group (KIP-1071).
    pub streams: Option<super::streams::StreamsGroup>,
    /// Set while the group is a share group (KIP-932).
    pub share: Option<super::share_group::ShareGroup>,
}

impl Group {
    pub(crate) fn new(id: &str, now_ms: i64) -> Group {
        Group {
            id: id.to_string(),
            state: GroupState::Empty,
            protocol_type: None,
            protocol: None,
            generation: 0,
            leader: None,
            members: BTreeMap::new(),
            join_order: 0,
            pending: HashMap::new(),
            offsets: BTreeMap::new(),
            state_since_ms: now_ms,
            rebalance: None,
            dirty: false,
            consumer: None,
            streams: None,
            share: None,
        }
    }

    /// Rebuilds a group from its last stored metadata: members come back as
    /// they were, with fresh session timers, so a restart causes no rebalance.
    pub(crate) fn restore(id: &str, v: &GroupValue, now: Instant) -> Group {
        let mut g = Group::new(id, v.current_state_timestamp);
        g.protocol_type = Some(v.protocol_type.clone()).filter(|p| !p.is_empty());
        g.protocol = v.protocol.clone();
        g.generation = v.generation;
        g.leader = v.leader.clone();
        for m in &v.members {
            let protocol = v.protocol.clone().unwrap_or_default();
            g.insert_member(Member {
                id: m.member_id.clone(),
                instance_id: m.group_instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout: Duration::from_millis(m.session_timeout_ms.max(0) as u64),
                rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64),
                protocols: vec![(protocol, m.subscription.clone())],
                assignment: m.assignment.clone(),
                last_seen: now,
                join_waiter: None,
                sync_waiter: None,
            });
        }
        g.state = if g.members.is_empty() {
            GroupState::Empty
        } else {
            GroupState::Stable
        };
        g
    }

    pub(crate) fn to_value(&self) -> GroupValue {
        let protocol = self.protocol.clone().unwrap_or_default();
        GroupValue {
            protocol_type: self.protocol_type.clone().unwrap_or_default(),
            generation: self.generation,
            protocol: self.protocol.clone(),
            leader: self.leader.clone(),
            current_state_timestamp: self.state_since_ms,
            members: self
                .members
                .values()
                .map(|m| MemberValue {
                    member_id: m.id.clone(),
                    group_instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    rebalance_timeout_ms: m.rebalance_timeout.as_millis() as i32,
                    session_timeout_ms: m.session_timeout.as_millis() as i32,
                    subscription: m.metadata(&protocol),
                    assignment: m.assignment.clone(),
                })
                .collect(),
        }
    }

    pub(crate) fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    /// Answers every waiting JoinGroup and SyncGroup with
    /// REBALANCE_IN_PROGRESS (the group is changing protocol; they rejoin).
    pub(crate) fn fail_waiters(&mut self) {
        for m in self.members.values_mut() {
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(Err(CoordinatorError::RebalanceInProgress));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(Err(CoordinatorError::RebalanceInProgress));
            }
        }
    }

    /// The classic group a consumer group's classic members form when it
    /// goes back to the classic protocol (Kafka's fromConsumerGroup): the
    /// generation is the group epoch, each member's assignment its target,
    /// and a rebalance starts at once so the members rejoin under the
    /// classic protocol. The `leaving` members are left out.
    pub(crate) fn from_consumer(
        cg: &super::consumer::ConsumerGroup,
        leaving: &[String],
        topics: &super::consumer::Topics,
        now: Instant,
        now_ms: i64,
        cfg: &CoordinatorConfig,
    ) -> Group {
        let mut g = Group::new(&cg.id, now_ms);
        g.protocol_type = Some(super::migration::CONSUMER_PROTOCOL_TYPE.to_string());
        g.generation = cg.epoch;
        for m in cg.members().filter(|m| !leaving.contains(&m.id)) {
            let Some(c) = &m.classic else { continue };
            g.insert_member(Member {
                id: m.id.clone(),
                instance_id: m.instance_id.clone(),
                client_id: m.client_id.clone(),
                client_host: m.client_host.clone(),
                session_timeout: Duration::from_millis(c.session_timeout_ms.max(0) as u64),
                rebalance_timeout: Duration::from_millis(m.rebalance_timeout_ms.max(0) as u64),
                protocols: c.protocols.clone(),
                assignment: Bytes::new(),
                last_seen: now,
                join_waiter: None,
                sync_waiter: None,
            });
        }
        g.leader = g.members.values().next().map(|m| m.id.clone());
        let protocol = g.select_protocol();
        for m in g.members.values_mut() {
            let version = super::migration::protocol_version(&m.metadata(&protocol));
            let target = cg.target_of(&m.id).cloned().unwrap_or_default();
            m.assignment = super::migration::encode_assignment(&target, topics, version);
        }
        g.protocol = Some(protocol);
        g.state = GroupState::Stable;
        g.prepare_rebalance(now, now_ms, cfg);
        g
    }

    /// Starts the group over for another protocol, keeping its committed
    /// offsets; an empty classic group's metadata gets its tombstone.
    pub(crate) fn start_over(
        &mut self,
        now_ms: i64,
        records: &mut Vec<(RecordKey, Option<Bytes>)>,
    ) {
        if self.protocol_type.is_some() {
            records.push((
                RecordKey::Group {
                    group: self.id.clone(),
                },
                None,
            ));
        }
        let offsets = std::mem::take(&mut self.offsets);
        *self = Group::new(&self.id.clone(), now_ms);
        self.offsets = offsets;
    }

    /// Members under either protocol.
    pub(crate) fn has_members(&self) -> bool {
        !self.members.is_empty()
            || self.consumer.as_ref().is_some_and(|c| c.has_members())
            || self.streams.as_ref().is_some_and(|s| s.has_members())
            || self
                .share
                .as_ref()
                .is_some_and(|s| s.members().next().is_some())
    }

    fn key_of(&self, id: &str) -> Option<u64> {
        self.members
            .iter()
            .find(|(_, m)| m.id == id)
            .map(|(k, _)| *k)
    }

    fn member_mut(&mut self, id: &str) -> Option<&mut Member> {
        self.members.values_mut().find(|m| m.id == id)
    }

    fn member(&self, id: &str) -> Option<&Member> {
        self.members.values().find(|m| m.id == id)
    }

    fn static_member(&self, instance_id: &str) -> Option<&Member> {
        self.members
            .values()
            .find(|m| m.instance_id.as_deref() == Some(instance_id))
    }

    fn insert_member(&mut self, m: Member) {
        self.join_order += 1;
        self.members.insert(self.join_order, m);
    }

    fn set_state(&mut self, state: GroupState, now_ms: i64) {
        self.state = state;
        self.state_since_ms = now_ms;
    }

    /// Can a member with these protocols join? (Kafka's supportsProtocols.)
    fn supports(&self, protocol_type: &str, protocols: &[(String, Bytes)]) -> bool {
        if protocol_type.is_empty() || protocols.is_empty() {
            return false;
        }
        if self.members.is_empty() {
            return true;
        }
        self.protocol_type.as_deref() == Some(protocol_type)
            && protocols.iter().any(|(name, _)| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(n, _)| n == name))
            })
    }

    /// Checks a member id (and static instance id) against the group.
    fn validate_member(
        &self,
        member_id: &str,
        instance_id: Option<&str>,
    ) -> Result<(), CoordinatorError> {
        if let Some(iid) = instance_id {
            match self.static_member(iid) {
                Some(m) if m.id != member_id => return Err(CoordinatorError::FencedInstanceId),
                Some(_) => return Ok(()),
                None => return Err(CoordinatorError::UnknownMemberId),
            }
        }
        if self.member(member_id).is_none() {
            return Err(CoordinatorError::UnknownMemberId);
        }
        Ok(())
    }

    /// JoinGroup; new member ids are drawn from `random`.
    pub(crate) fn join(
        &mut self,
        p: JoinParams,
        now: Instant,
        now_ms: i64,
        cfg: &CoordinatorConfig,
        random: &dyn Random,
    ) -> Pending<JoinResult> {
        if !self.supports(&p.protocol_type, &p.protocols) {
            return Pending::Ready(Err(CoordinatorError::InconsistentGroupProtocol));
        }
        if let Some(iid) = p.instance_id.clone() {
            return self.join_static(p, &iid, now, now_ms, cfg, random);
        }
        if p.member_id.is_empty() {
            let id = format!("{}-{}", p.client_id, random.uuid());
            if p.require_known_member_id {
                self.pending.insert(id.clone(), now + p.session_timeout);
                return Pending::Ready(Err(CoordinatorError::MemberIdRequired(id)));
            }
            return self.add_member_and_rebalance(id, p, now, now_ms, cfg);
        }
        if self.pending.remove(&p.member_id).is_some() {
            let id = p.member_id.clone();
            return self.add_member_and_rebalance(id, p, now, now_ms, cfg);
        }
        if self.member(&p.member_id).is_none() {
            return Pending::Ready(Err(CoordinatorError::UnknownMemberId));
        }
        self.rejoin(p, now, now_ms, cfg)
    }

    fn join_static(
        &mut self,
        p: JoinParams,
        iid: &str,
        now: Instant,
        now_ms: i64,
        cfg: &CoordinatorConfig,
        random: &dyn Random,
    ) -> Pending<JoinResult> {
        let Some(old_id) = self.static_member(iid).map(|m| m.id.clone()) else {
            if !p.member_id.is_empty() {
                return Pending::Ready(Err(CoordinatorError::UnknownMemberId));
            }
            let id = format!("{iid}-{}", random.uuid());
            return self.add_member_and_rebalance(id, p, now, now_ms, cfg);
        };
        if !p.member_id.is_empty() {
            if p.member_id != old_id {
                return Pending::Ready(Err(CoordinatorError::FencedInstanceId));
            }
            return self.rejoin(p, now, now_ms, cfg);
        }
        // A restarted static member: it takes over its old identity under a new
        // member id, and the old incarnation is fenced.
        let new_id = format!("{iid}-{}", random.uuid());
        let current_leader = self.leader.clone();
        let changed;
        {
            let m = self.member_mut(&old_id).expect("static member present");
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(Err(CoordinatorError::FencedInstanceId));
            }
            if let Some(w) = m.sync_waiter.take() {
                let _ = w.send(Err(CoordinatorError::FencedInstanceId));
            }
            changed = m.protocols != p.protocols;
            m.id = new_id.clone();
            m.protocols = p.protocols.clone();
            m.session_timeout = p.session_timeout;
            m.rebalance_timeout = p.rebalance_timeout;
            m.client_id = p.client_id.clone();
            m.client_host = p.client_host.clone();
            m.last_seen = now;
        }
        if current_leader.as_deref() == Some(old_id.as_str()) {
            self.leader = Some(new_id.clone());
        }
        self.dirty = true;
        match self.state {
            GroupState::Stable if !changed => {
                // As in Kafka: no rebalance, and the reply names the previous
                // leader id, so even a returning leader just syncs its
                // existing assignment instead of computing a new one.
                let mut result = self.join_result(&new_id, false);
                result.leader = current_leader.unwrap_or_default();
                Pending::Ready(Ok(result))
            }
            GroupState::PreparingRebalance => self.await_join(&new_id, now, now_ms),
            _ => {
                self.prepare_rebalance(now, now_ms, cfg);
                self.await_join(&new_id, now, now_ms)
            }
        }
    }

    fn add_member_and_rebalance(
        &mut self,
        id: String,
        p: JoinParams,
        now: Instant,
        now_ms: i64,
        cfg: &CoordinatorConfig,
    ) -> Pending<JoinResult> {
        if self.members.is_empty() {
            self.protocol_type = Some(p.protocol_type.clone());
        }
        self.insert_member(Member {
            id: id.clone(),
            instance_id: p.instance_id,
            client_id: p.client_id,
            client_host: p.client_host,
            session_timeout: p.session_timeout,
            rebalance_timeout: p.rebalance_timeout,
            protocols: p.protocols,
            assignment: Bytes::new(),
            last_seen: now,
            join_waiter: None,
            sync_waiter: None,
        });
        self.prepare_rebalance(now, now_ms, cfg);
        self.await_join(&id, now, now_ms)
    }

    fn rejoin(
        &mut self,
        p: JoinParams,
        now: Instant,
        now_ms: i64,
        cfg: &CoordinatorConfig,
    ) -> Pending<JoinResult> {
        let id = p.member_id.clone();
        let is_leader = self.leader.as_deref() == Some(id.as_str());
        let m = self.member_mut(&id).expect("member present");
        let changed = m.protocols != p.protocols;
        m.protocols = p.protocols;
        m.session_timeout = p.session_timeout;
        m.rebalance_timeout = p.rebalance_timeout;
        m.last_seen = now;
        match self.state {
            GroupState::PreparingRebalance => self.await_join(&id, now, now_ms),
            GroupState::CompletingRebalance if !changed => {
                Pending::Ready(Ok(self.join_result(&id, is_leader)))
            }
            GroupState::Stable if !changed && !is_leader => {
                Pending::Ready(Ok(self.join_result(&id, false)))
            }
            _ => {
                self.prepare_rebalance(now, now_ms, cfg);
                self.await_join(&id, now, now_ms)
            }
        }
    }

    fn await_join(&mut self, id: &str, now: Instant, now_ms: i64) -> Pending<JoinResult> {
        let (tx, rx) = oneshot::channel();
        if let Some(m) = self.member_mut(id) {
            if let Some(old) = m.join_waiter.replace(tx) {
                let _ = old.send(Err(CoordinatorError::UnknownMemberId));
            }
        }
        self.try_complete_join(now, now_ms);
        Pending::Wait(rx)
    }

    fn prepare_rebalance(&mut self, now: Instant, now_ms: i64, cfg: &CoordinatorConfig) {
        let max_timeout = self
            .members
            .values()
            .map(|m| m.rebalance_timeout)
            .max()
            .unwrap_or_default();
        if self.state == GroupState::PreparingRebalance {
            if let Some(r) = &mut self.rebalance {
                if r.initial_delay_until.is_some() {
                    r.initial_delay_until =
                        Some((now + cfg.initial_rebalance_delay).min(r.deadline));
                }
            }
            return;
        }
        if self.state == GroupState::CompletingRebalance {
            for m in self.members.values_mut() {
                if let Some(w) = m.sync_waiter.take() {
                    let _ = w.send(Err(CoordinatorError::RebalanceInProgress));
                }
            }
        }
        let initial = self.state == GroupState::Empty && !cfg.initial_rebalance_delay.is_zero();
        self.rebalance = Some(Rebalance {
            deadline: now + max_timeout,
            initial_delay_until: initial
                .then(|| now + cfg.initial_rebalance_delay.min(max_timeout)),
        });
        self.set_state(GroupState::PreparingRebalance, now_ms);
    }

    /// Completes the join phase once every member has rejoined (and no
    /// initial delay or member-id handshake is outstanding).
    fn try_complete_join(&mut self, now: Instant, now_ms: i64) {
        if self.state != GroupState::PreparingRebalance {
            return;
        }
        let delaying = self
            .rebalance
            .as_ref()
            .and_then(|r| r.initial_delay_until)
            .is_some_and(|t| now < t);
        let all_joined =
            self.members.values().all(|m| m.join_waiter.is_some()) && self.pending.is_empty();
        if all_joined && !delaying {
            self.complete_join(now, now_ms);
        }
    }

    fn complete_join(&mut self, now: Instant, now_ms: i64) {
        // Members that did not rejoin in time leave the group.
        self.members.retain(|_, m| m.join_waiter.is_some());
        self.rebalance = None;
        self.generation += 1;
        self.dirty = true;
        if self.members.is_empty() {
            self.protocol = None;
            self.leader = None;
            self.set_state(GroupState::Empty, now_ms);
            return;
        }
        self.protocol = Some(self.select_protocol());
        if self
            .leader
            .as_ref()
            .is_none_or(|l| self.member(l).is_none())
        {
            self.leader = self.members.values().next().map(|m| m.id.clone());
        }
        self.set_state(GroupState::CompletingRebalance, now_ms);
        let leader = self.leader.clone().unwrap_or_default();
        let ids: Vec<String> = self.members.values().map(|m| m.id.clone()).collect();
        for id in ids {
            let result = self.join_result(&id, id == leader);
            let m = self.member_mut(&id).expect("member present");
            m.assignment = Bytes::new();
            m.last_seen = now;
            if let Some(w) = m.join_waiter.take() {
                let _ = w.send(Ok(result));
            }
        }
    }

    /// The protocol every member supports that most members prefer.
    fn select_protocol(&self) -> String {
        let first = self.members.values().next().expect("members present");
        let candidates: Vec<&String> = first
            .protocols
            .iter()
            .map(|(n, _)| n)
            .filter(|n| {
                self.members
                    .values()
                    .all(|m| m.protocols.iter().any(|(x, _)| x == *n))
            })
            .collect();
        let mut votes: HashMap<&String, usize> = HashMap::new();
        for m in self.members.values() {
            if let Some((n, _)) = m.protocols.iter().find(|(n, _)| candidates.contains(&n)) {
                *votes.entry(n).or_default() += 1;
            }
        }
        let mut best: Option<(&String, usize)> = None;
        for c in candidates {
            let v = votes.get(c).copied().unwrap_or(0);
            if best.is_none_or(|(_, bv)| v > bv) {
                best = Some((c, v));
            }
        }
        best.map(|(c, _)| c.clone()).unwrap_or_default()
    }

    fn join_result(&self, member_id: &str, with_members: bool) -> JoinResult {
        let protocol = self.protocol.clone().unwrap_or_default();
        JoinResult {
            generation: self.generation,
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            leader: self.leader.clone().unwrap_or_default(),
            member_id: member_id.to_string(),
            members: if with_members {
                self.members
                    .values()
                    .map(|m| (m.id.clone(), m.instance_id.clone(), m.metadata(&protocol)))
                    .collect()
            } else {
                Vec::new()
            },
        }
    }

    fn check_protocol(
        &self,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
    ) -> Result<(), CoordinatorError> {
        let mismatch = |asked: Option<&str>, have: &Option<String>| {
            asked.is_some_and(|a| have.as_deref() != Some(a))
        };
        if mismatch(protocol_type, &self.protocol_type) || mismatch(protocol_name, &self.protocol) {
            return Err(CoordinatorError::InconsistentGroupProtocol);
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sync(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
        now: Instant,
        now_ms: i64,
    ) -> Pending<SyncResult> {
        if let Err(e) = self.validate_member(member_id, instance_id) {
            return Pending::Ready(Err(e));
        }
        if generation != self.generation {
            return Pending::Ready(Err(CoordinatorError::IllegalGeneration));
        }
        if let Err(e) = self.check_protocol(protocol_type, protocol_name) {
            return Pending::Ready(Err(e));
        }
        match self.state {
            GroupState::Empty => Pending::Ready(Err(CoordinatorError::UnknownMemberId)),
            GroupState::PreparingRebalance => {
                Pending::Ready(Err(CoordinatorError::RebalanceInProgress))
            }
            GroupState::Stable => Pending::Ready(Ok(self.sync_result(member_id))),
            GroupState::CompletingRebalance => {
                let (tx, rx) = oneshot::channel();
                let m = self.member_mut(member_id).expect("validated");
                m.last_seen = now;
                m.sync_waiter = Some(tx);
                if self.leader.as_deref() == Some(member_id) {
                    let mut assigned: HashMap<String, Bytes> = assignments.into_iter().collect();
                    for m in self.members.values_mut() {
                        m.assignment = assigned.remove(&m.id).unwrap_or_default();
                    }
                    self.set_state(GroupState::Stable, now_ms);
                    self.dirty = true;
                    let ids: Vec<String> = self.members.values().map(|m| m.id.clone()).collect();
                    for id in ids {
                        let result = self.sync_result(&id);
                        if let Some(w) = self.member_mut(&id).and_then(|m| m.sync_waiter.take()) {
                            let _ = w.send(Ok(result));
                        }
                    }
                }
                Pending::Wait(rx)
            }
        }
    }

    fn sync_result(&self, member_id: &str) -> SyncResult {
        SyncResult {
            protocol_type: self.protocol_type.clone(),
            protocol_name: self.protocol.clone(),
            assignment: self
                .member(member_id)
                .map(|m| m.assignment.clone())
                .unwrap_or_default(),
        }
    }

    pub(crate) fn heartbeat(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        now: Instant,
    ) -> Result<(), CoordinatorError> {
        if self.state == GroupState::Empty {
            return Err(CoordinatorError::UnknownMemberId);
        }
        self.validate_member(member_id, instance_id)?;
        if generation != self.generation {
            return Err(CoordinatorError::IllegalGeneration);
        }
        self.member_mut(member_id).expect("validated").last_seen = now;
        match self.state {
            GroupState::PreparingRebalance => Err(CoordinatorError::RebalanceInProgress),
            _ => Ok(()),
        }
    }

    /// Removes a member that leaves (LeaveGroup); pending member ids may leave too.
    pub(crate) fn leave(
        &mut self,
        member_id: &str,
        instance_id: Option<&str>,
        now: Instant,
        now_ms: i64,
        cfg: &CoordinatorConfig,
    ) -> Result<(), CoordinatorError> {
        let id = match instance_id {
            Some(iid) => {
                let m = self
                    .static_member(iid)
                    .ok_or(CoordinatorError::UnknownMemberId)?;
                if !member_id.is_empty() && m.id != member_id {
                    return Err(CoordinatorError::FencedInstanceId);
                }
                m.id.clone()
            }
            None => {
                if self.pending.remove(member_id).is_some() {
                    self.try_complete_join(now, now_ms);
                    return Ok(());
                }
                self.member(member_id)
                    .ok_or(CoordinatorError::UnknownMemberId)?
                    .id
                    .clone()
            }
        };
        self.remove_member(&id, now, now_ms, cfg);
        Ok(())
    }

    fn remove_member(&mut self, id: &str, now: Instant, now_ms: i64, cfg: &CoordinatorConfig) {
        let Some(key) = self.key_of(id) else { return };
        if let Some(m) = self.members.remove(&key) {
            if let Some(w) = m.join_waiter {
                let _ = w.send(Err(CoordinatorError::UnknownMemberId));
            }
            if let Some(w) = m.sync_waiter {
                let _ = w.send(Err(CoordinatorError::UnknownMemberId));
            }
        }
        self.dirty = true;
        match self.state {
            GroupState::Stable | GroupState::CompletingRebalance => {
                self.prepare_rebalance(now, now_ms, cfg);
                self.try_complete_join(now, now_ms);
            }
            GroupState::PreparingRebalance => self.try_complete_join(now, now_ms),
            GroupState::Empty => {}
        }
    }

    /// Session expiry, member-id handshakes that never came back, and
    /// rebalance deadlines.
    pub(crate) fn tick(&mut self, now: Instant, now_ms: i64, cfg: &CoordinatorConfig) {
        let before = self.pending.len();
        self.pending.retain(|_, deadline| *deadline > now);
        if self.pending.len() != before {
            self.try_complete_join(now, now_ms);
        }
        let expired: Vec<String> = self
            .members
            .values()
            .filter(|m| {
                m.join_waiter.is_none() && now.duration_since(m.last_seen) > m.session_timeout
            })
            .map(|m| m.id.clone())
            .collect();
        for id in expired {
            tracing::info!(group = %self.id, member = %id, "member session expired");
            self.remove_member(&id, now, now_ms, cfg);
        }
        if self.state == GroupState::PreparingRebalance {
            if let Some(r) = &mut self.rebalance {
                if r.initial_delay_until.is_some_and(|t| now >= t) {
                    r.initial_delay_until = None;
                }
            }
            self.try_complete_join(now, now_ms);
            if self.state == GroupState::PreparingRebalance
                && self.rebalance.as_ref().is_some_and(|r| now >= r.deadline)
            {
                self.complete_join(now, now_ms);
            }
        }
    }

    /// Can the group be deleted (DeleteGroups)?
    pub(crate) fn is_empty_group(&self) -> bool {
        self.state == GroupState::Empty && !self.has_members()
    }

    /// Nothing left to remember: no members, no member-id handshakes, no offsets.
    pub(crate) fn is_idle(&self) -> bool {
        self.is_empty_group() && self.pending.is_empty() && self.offsets.is_empty()
    }

    /// Topics the members subscribe to, for consumer groups.
    pub(crate) fn subscribed_topics(&self) -> Vec<String> {
        use kafka_protocol::messages::ConsumerProtocolSubscription;
        use kafka_protocol::protocol::Decodable;
        if self.protocol_type.as_deref() != Some("consumer") {
            return Vec::new();
        }
        let protocol = self.protocol.clone().unwrap_or_default();
        let mut topics = Vec::new();
        for m in self.members.values() {
            let mut meta = m.metadata(&protocol);
            if meta.len() < 2 {
                continue;
            }
            let version = i16::from_be_bytes([meta[0], meta[1]]);
            bytes::Buf::advance(&mut meta, 2);
            if let Ok(sub) = ConsumerProtocolSubscription::decode(&mut meta, version.clamp(0, 3)) {
                topics.extend(sub.topics.iter().map(|t| t.to_string()));
            }
        }
        topics.sort();
        topics.dedup();
        topics
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Debug;
    use std::sync::Arc;

    use super::*;
    use crate::clock::{Clock, ManualClock, SeededRandom};

    const SEED: u64 = 42;
    const SESSION: Duration = Duration::from_secs(10);
    const REBALANCE: Duration = Duration::from_secs(30);
    const SECOND: Duration = Duration::from_secs(1);

    /// A group with the clock it lives by and the ids it hands out.
    struct Harness {
        group: Group,
        clock: Arc<ManualClock>,
        random: SeededRandom,
        cfg: CoordinatorConfig,
    }

    impl Harness {
        fn new(initial_rebalance_delay: Duration) -> Harness {
            let clock = ManualClock::new(1_700_000_000_000);
            Harness {
                group: Group::new("g", clock.now_ms()),
                clock,
                random: SeededRandom::new(SEED),
                cfg: CoordinatorConfig {
                    initial_rebalance_delay,
                    min_session_timeout: SECOND,
                    max_session_timeout: Duration::from_secs(300),
                    offsets_retention: Duration::from_secs(7 * 24 * 3600),
                    max_metadata_bytes: 4096,
                    offsets_topic_segment_bytes: 1 << 20,
                    wait_for_fsync: false,
                    consumer: Default::default(),
                    streams: Default::default(),
                    share: Default::default(),
                },
            }
        }

        fn join(&mut self, member_id: &str, instance_id: Option<&str>) -> Pending<JoinResult> {
            let params = JoinParams {
                member_id: member_id.to_string(),
                instance_id: instance_id.map(str::to_string),
                client_id: "client".to_string(),
                client_host: "/127.0.0.1".to_string(),
                session_timeout: SESSION,
                rebalance_timeout: REBALANCE,
                protocol_type: "consumer".to_string(),
                protocols: vec![("range".to_string(), Bytes::from_static(b"subscription"))],
                require_known_member_id: true,
            };
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            self.group
                .join(params, now, now_ms, &self.cfg, &self.random)
        }

        /// The MEMBER_ID_REQUIRED handshake of a new dynamic member, then its join.
        fn join_new(&mut self) -> (String, Pending<JoinResult>) {
            let id = match ready(self.join("", None)) {
                Err(CoordinatorError::MemberIdRequired(id)) => id,
                other => panic!("expected MEMBER_ID_REQUIRED, got {other:?}"),
            };
            let pending = self.join(&id, None);
            (id, pending)
        }

        fn sync(
            &mut self,
            member_id: &str,
            instance_id: Option<&str>,
            generation: i32,
            assignments: &[(&str, &[u8])],
        ) -> Pending<SyncResult> {
            let assignments = assignments
                .iter()
                .map(|(id, a)| (id.to_string(), Bytes::copy_from_slice(a)))
                .collect();
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            self.group.sync(
                member_id,
                instance_id,
                generation,
                None,
                None,
                assignments,
                now,
                now_ms,
            )
        }

        fn heartbeat(&mut self, member_id: &str, generation: i32) -> Result<(), CoordinatorError> {
            let now = self.clock.now();
            self.group.heartbeat(member_id, None, generation, now)
        }

        /// Moves the clock and lets the coordinator's timer run once.
        fn advance(&mut self, by: Duration) {
            self.clock.advance(by);
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            self.group.tick(now, now_ms, &self.cfg);
        }

        /// Two dynamic members, joined in one generation (1) and synced:
        /// (leader, follower).
        fn stable_pair(&mut self) -> (String, String) {
            assert!(!self.cfg.initial_rebalance_delay.is_zero());
            let (a, a_join) = self.join_new();
            let (b, b_join) = self.join_new();
            self.advance(self.cfg.initial_rebalance_delay);
            let (a_join, b_join) = (answer(a_join).unwrap(), answer(b_join).unwrap());
            assert_eq!((a_join.generation, b_join.generation), (1, 1));
            assert_eq!(a_join.leader, a);
            let b_sync = self.sync(&b, None, 1, &[]);
            let plan = [(a.as_str(), &b"a-parts"[..]), (b.as_str(), &b"b-parts"[..])];
            let a_sync = self.sync(&a, None, 1, &plan);
            assert_eq!(answer(a_sync).unwrap().assignment, &b"a-parts"[..]);
            assert_eq!(answer(b_sync).unwrap().assignment, &b"b-parts"[..]);
            assert_eq!(self.group.state, GroupState::Stable);
            (a, b)
        }

        fn member_ids(&self) -> Vec<String> {
            self.group.members().map(|m| m.id.clone()).collect()
        }
    }

    /// An answer given at once.
    fn ready<T: Debug>(pending: Pending<T>) -> Result<T, CoordinatorError> {
        match pending {
            Pending::Ready(r) => r,
            Pending::Wait(_) => panic!("expected an answer at once"),
        }
    }

    /// The answer, given at once or already sent to the waiting member.
    fn answer<T: Debug>(pending: Pending<T>) -> Result<T, CoordinatorError> {
        match pending {
            Pending::Ready(r) => r,
            Pending::Wait(mut rx) => rx.try_recv().expect("no answer yet"),
        }
    }

    fn waiting<T: Debug>(pending: Pending<T>) -> oneshot::Receiver<Result<T, CoordinatorError>> {
        match pending {
            Pending::Wait(rx) => rx,
            Pending::Ready(r) => panic!("expected to wait, got {r:?}"),
        }
    }

    #[test]
    fn new_member_gets_member_id_required_then_joins_with_that_id() {
        let mut h = Harness::new(Duration::ZERO);
        let (id, join) = h.join_new();
        assert_eq!(id, format!("client-{}", SeededRandom::new(SEED).uuid()));
        let joined = answer(join).unwrap();
        assert_eq!(joined.member_id, id);
        assert_eq!(joined.leader, id);
        assert_eq!(joined.generation, 1);
        assert_eq!(joined.members.len(), 1, "the leader gets the member list");
        assert_eq!(h.group.state, GroupState::CompletingRebalance);
    }

    #[test]
    fn joining_with_an_id_never_handed_out_is_unknown_member() {
        let mut h = Harness::new(Duration::ZERO);
        assert!(matches!(
            ready(h.join("client-made-up", None)),
            Err(CoordinatorError::UnknownMemberId)
        ));
    }

    #[test]
    fn initial_rebalance_delay_holds_the_first_join_until_the_clock_passes_it() {
        let mut h = Harness::new(3 * SECOND);
        let (_, join) = h.join_new();
        let mut join = waiting(join);
        h.advance(2 * SECOND);
        assert!(join.try_recv().is_err(), "answered inside the delay");
        assert_eq!(h.group.state, GroupState::PreparingRebalance);
        h.advance(SECOND);
        assert_eq!(join.try_recv().unwrap().unwrap().generation, 1);
    }

    #[test]
    fn members_joining_during_the_initial_delay_land_in_one_generation() {
        let mut h = Harness::new(3 * SECOND);
        let (_, first) = h.join_new();
        let mut first = waiting(first);
        h.advance(2 * SECOND);
        // The second joiner restarts the delay.
        let (_, second) = h.join_new();
        let mut second = waiting(second);
        h.advance(2 * SECOND);
        assert!(first.try_recv().is_err(), "the delay was not extended");
        h.advance(SECOND);
        let (first, second) = (first.try_recv().unwrap(), second.try_recv().unwrap());
        assert_eq!(first.unwrap().generation, 1);
        assert_eq!(second.unwrap().generation, 1);
    }

    #[test]
    fn member_that_stops_heartbeating_is_removed_after_session_timeout() {
        let mut h = Harness::new(3 * SECOND);
        let (a, b) = h.stable_pair();
        // Only `a` keeps heartbeating.
        for _ in 0..2 {
            h.advance(4 * SECOND);
            h.heartbeat(&a, 1).unwrap();
        }
        assert_eq!(
            h.member_ids(),
            [a.as_str(), b.as_str()],
            "removed within the session"
        );
        h.advance(3 * SECOND);
        assert_eq!(h.member_ids(), [a.as_str()]);
        // The survivor is told to rejoin and gets a generation of its own.
        assert_eq!(h.group.state, GroupState::PreparingRebalance);
        assert!(matches!(
            h.heartbeat(&a, 1),
            Err(CoordinatorError::RebalanceInProgress)
        ));
        let rejoined = answer(h.join(&a, None)).unwrap();
        assert_eq!(rejoined.generation, 2);
        assert_eq!(rejoined.members.len(), 1);
    }

    #[test]
    fn rebalance_timeout_evicts_members_that_did_not_rejoin() {
        let mut h = Harness::new(3 * SECOND);
        let (a, b) = h.stable_pair();
        // The leader rejoining starts a rebalance; `b` stays alive but never rejoins.
        let mut rejoin = waiting(h.join(&a, None));
        for _ in 0..5 {
            h.advance(5 * SECOND);
            assert!(matches!(
                h.heartbeat(&b, 1),
                Err(CoordinatorError::RebalanceInProgress)
            ));
        }
        assert!(
            rejoin.try_recv().is_err(),
            "completed before the rebalance timeout"
        );
        h.advance(5 * SECOND);
        let joined = rejoin.try_recv().unwrap().unwrap();
        assert_eq!(joined.generation, 2);
        assert_eq!(h.member_ids(), [a.as_str()]);
        assert!(matches!(
            h.heartbeat(&b, 1),
            Err(CoordinatorError::UnknownMemberId)
        ));
    }

    #[test]
    fn static_member_rejoining_within_its_session_keeps_its_assignment_and_fences_the_old_one() {
        let mut h = Harness::new(Duration::ZERO);
        let old = answer(h.join("", Some("instance-1"))).unwrap();
        assert_eq!(old.generation, 1);
        let plan = [(old.member_id.as_str(), &b"parts"[..])];
        answer(h.sync(&old.member_id, Some("instance-1"), 1, &plan)).unwrap();
        // Restarted: same instance id, no member id, inside the session.
        h.advance(SESSION / 2);
        let new = answer(h.join("", Some("instance-1"))).unwrap();
        assert_ne!(new.member_id, old.member_id);
        assert_eq!(new.generation, 1, "no rebalance");
        assert_eq!(h.group.state, GroupState::Stable);
        let synced = answer(h.sync(&new.member_id, Some("instance-1"), 1, &[])).unwrap();
        assert_eq!(synced.assignment, &b"parts"[..]);
        // The old incarnation is fenced.
        assert!(matches!(
            h.group
                .heartbeat(&old.member_id, Some("instance-1"), 1, h.clock.now()),
            Err(CoordinatorError::FencedInstanceId)
        ));
        assert!(matches!(
            answer(h.sync(&old.member_id, Some("instance-1"), 1, &[])),
            Err(CoordinatorError::FencedInstanceId)
        ));
    }

    #[test]
    fn heartbeat_and_sync_from_an_old_generation_get_illegal_generation() {
        let mut h = Harness::new(3 * SECOND);
        let (a, b) = h.stable_pair();
        let a_join = h.join(&a, None);
        let b_join = h.join(&b, None);
        assert_eq!(answer(a_join).unwrap().generation, 2);
        assert_eq!(answer(b_join).unwrap().generation, 2);
        assert!(matches!(
            h.heartbeat(&b, 1),
            Err(CoordinatorError::IllegalGeneration)
        ));
        assert!(matches!(
            answer(h.sync(&b, None, 1, &[])),
            Err(CoordinatorError::IllegalGeneration)
        ));
        h.heartbeat(&b, 2).unwrap();
    }
}
