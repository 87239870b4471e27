//! The group coordinator: consumer groups under Kafka's classic protocol
//! and under the consumer group protocol of KIP-848, Kafka Streams groups
//! under KIP-1071, and their committed offsets, which all kinds share.
//!
//! This single broker coordinates every group. All group state sits behind
//! one lock and changes synchronously; classic members that must wait for
//! others (JoinGroup, SyncGroup) hold a oneshot receiver that a later request
//! or the timer completes. Consumer-protocol members never wait: each
//! heartbeat is answered from the group's state at once (`consumer`,
//! `streams`). Every change worth keeping is appended to
//! `__consumer_offsets` before it is acknowledged, and startup replays that
//! topic, so offsets and group membership survive restarts, kill -9 included.

pub(crate) mod assignor;
pub(crate) mod consumer;
pub(crate) mod group;
pub(crate) mod group_config;
pub(crate) mod migration;
pub(crate) mod records;
pub(crate) mod share_group;
pub(crate) mod share_partition;
pub(crate) mod share_records;
pub(crate) mod share_session;
pub(crate) mod share_state;
pub(crate) mod share_store;
pub(crate) mod store;
pub(crate) mod streams;
pub(crate) mod streams_records;
pub(crate) mod task_assignor;
pub(crate) mod txn;

#[cfg(test)]
mod hostile_tests;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::catalog::Catalog;
use crate::clock::{SharedClock, SharedRandom};
use crate::log::LogError;
use consumer::{
    ConsumerGroup, ConsumerGroupConfig, HeartbeatParams, HeartbeatResult, TopicMeta, Topics,
};
use group::{Group, GroupState, JoinParams, JoinReply, Pending, SyncReply};
use group_config::GroupConfigs;
use records::{
    decode_assignment_epoch, decode_target, ConsumerGroupValue, ConsumerMemberValue,
    CurrentAssignmentValue, GroupValue, OffsetValue, RecordKey,
};
use store::{OffsetsStore, Replayed};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CoordinatorError {
    #[error("the group id is invalid")]
    InvalidGroupId,
    #[error("session timeout is outside the broker's allowed range")]
    InvalidSessionTimeout,
    #[error("no protocol that every member supports")]
    InconsistentGroupProtocol,
    #[error("the member id is not known to the group")]
    UnknownMemberId,
    #[error("the member must rejoin with the member id {0}")]
    MemberIdRequired(String),
    #[error("the generation is not the group's current one")]
    IllegalGeneration,
    #[error("the group is rebalancing")]
    RebalanceInProgress,
    #[error("another member with the same group.instance.id took over")]
    FencedInstanceId,
    #[error("the group does not exist")]
    GroupIdNotFound,
    /// GROUP_ID_NOT_FOUND with Kafka's wording for the case.
    #[error("{0}")]
    GroupNotFound(String),
    #[error("{0}")]
    StreamsInvalidTopology(String),
    #[error("the group still has members")]
    NonEmptyGroup,
    #[error("offset metadata is larger than {0} bytes")]
    OffsetMetadataTooLarge(usize),
    #[error("unknown topic or partition")]
    UnknownTopicOrPartition,
    #[error("the group's members are subscribed to the topic")]
    GroupSubscribedToTopic,
    #[error("the coordinator could not persist the change: {0}")]
    Storage(String),
    #[error("this broker is not the group's coordinator")]
    NotCoordinator,
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    #[error("the member epoch is fenced")]
    FencedMemberEpoch,
    #[error("the member epoch is stale")]
    StaleMemberEpoch,
    #[error("instance id {0} is still used by another member")]
    UnreleasedInstanceId(String),
    #[error("the group has reached its maximum size of {0} members")]
    GroupMaxSizeReached(usize),
    #[error("{0}")]
    UnsupportedAssignor(String),
    #[error("invalid regular expression: {0}")]
    InvalidRegularExpression(String),
    #[error("{0}")]
    UnsupportedVersion(String),
    #[error("the producer's epoch is older than the one the log knows")]
    InvalidProducerEpoch,
}

impl From<LogError> for CoordinatorError {
    fn from(e: LogError) -> Self {
        match e {
            // Another broker leads the group's partition now.
            LogError::Fenced => CoordinatorError::NotCoordinator,
            e => CoordinatorError::Storage(e.to_string()),
        }
    }
}

/// Kafka's group.* and offsets.* broker settings.
#[derive(Debug, Clone)]
pub struct CoordinatorConfig {
    pub initial_rebalance_delay: Duration,
    pub min_session_timeout: Duration,
    pub max_session_timeout: Duration,
    pub offsets_retention: Duration,
    pub max_metadata_bytes: usize,
    pub offsets_topic_segment_bytes: i32,
    pub wait_for_fsync: bool,
    pub consumer: ConsumerGroupConfig,
    pub streams: streams::StreamsGroupConfig,
    pub share: share_group::ShareGroupConfig,
}

/// One committed offset to store.
#[derive(Debug, Clone)]
pub(crate) struct OffsetCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// Who is committing: a group member, or (generation -1, empty member id)
/// a client managing its own assignment.
#[derive(Debug, Clone)]
pub(crate) struct Committer {
    pub member_id: String,
    pub instance_id: Option<String>,
    /// The generation, or a consumer-protocol member's epoch.
    pub generation: i32,
    /// The OffsetCommit version: consumer-protocol members need v9+.
    pub version: i16,
}

pub(crate) struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
    /// "classic", "consumer" or "streams".
    pub group_type: &'static str,
}

/// A consumer-protocol group, for ConsumerGroupDescribe.
pub(crate) struct ConsumerGroupDescription {
    pub state: &'static str,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub assignor: String,
    pub members: Vec<ConsumerMemberDescription>,
}

/// A Streams group, for StreamsGroupDescribe.
pub(crate) struct StreamsGroupDescription {
    pub state: &'static str,
    pub epoch: i32,
    pub assignment_epoch: i32,
    pub topology: Option<streams_records::Topology>,
    pub configured: Option<streams::Configured>,
    /// Each member and its target.
    pub members: Vec<(streams::Member, task_assignor::TaskSet)>,
}

/// Partitions by topic: (id, name, partitions).
pub(crate) type NamedAssignment = Vec<(uuid::Uuid, String, Vec<i32>)>;

pub(crate) struct ConsumerMemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub epoch: i32,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub assignment: NamedAssignment,
    pub target: NamedAssignment,
    /// The member speaks the classic protocol.
    pub classic: bool,
}

pub(crate) struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

/// Why DescribeGroups has nothing to describe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotDescribed {
    NotFound,
    /// A consumer-protocol (KIP-848) group.
    NotClassic,
}

pub(crate) struct GroupDescription {
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

pub(crate) type PartitionResult = ((String, i32), Result<(), CoordinatorError>);

/// Committed offsets by topic, then partition (`None`: nothing committed).
pub(crate) type TopicOffsets = Vec<(String, Vec<(i32, Option<OffsetValue>)>)>;

pub(crate) struct GroupCoordinator {
    catalog: Arc<Catalog>,
    store: OffsetsStore,
    groups: Mutex<HashMap<String, Group>>,
    /// Locked after `groups` when both are needed.
    txn: Mutex<TxnOffsets>,
    config: CoordinatorConfig,
    /// Each group's overrides of `config` (the GROUP config resource), as
    /// the API layer last read or wrote them.
    group_configs: GroupConfigs,
    clock: SharedClock,
    /// Draws member ids.
    random: SharedRandom,
    /// Cluster mode: the coordinator answers only while this says this
    /// broker serves the offsets topic.
    active: Option<Active>,
}

/// Whether this broker serves the offsets topic now.
pub(crate) type Active = Arc<dyn Fn() -> bool + Send + Sync>;

impl GroupCoordinator {
    /// Rebuilds every group from the offsets topic (see `OffsetsStore::open`).
    pub(crate) async fn open(
        catalog: Arc<Catalog>,
        store: OffsetsStore,
        config: CoordinatorConfig,
        clock: SharedClock,
        random: SharedRandom,
        active: Option<Active>,
    ) -> Result<GroupCoordinator, LogError> {
        let (groups, txn) = load(&store, clock.now()).await?;
        tracing::info!(groups = groups.len(), "group coordinator loaded");
        Ok(GroupCoordinator {
            active,
            catalog,
            store,
            groups: Mutex::new(groups),
            txn: Mutex::new(txn),
            config,
            group_configs: GroupConfigs::default(),
            clock,
            random,
        })
    }

    /// The broker's share group settings with the group's overrides.
    pub(crate) fn share_config(&self, group: &str) -> share_group::ShareGroupConfig {
        self.group_configs.share(group, &self.config.share)
    }

    /// Each group's config overrides, which take effect at its next heartbeat.
    pub(crate) fn group_configs(&self) -> &GroupConfigs {
        &self.group_configs
    }

    /// Reads the group state again from the offsets topic (cluster mode: after
    /// taking its partition over, whose log may have moved on elsewhere).
    /// Members waiting for a rebalance are dropped; they rejoin.
    pub(crate) async fn reload(&self) -> Result<(), LogError> {
        let (groups, txn) = load(&self.store, self.clock.now()).await?;
        tracing::info!(groups = groups.len(), "group coordinator reloaded");
        let mut locked = self.groups.lock();
        *locked = groups;
        *self.txn.lock() = txn;
        Ok(())
    }

    /// Writes the metadata of a group that changed. Membership changes are
    /// not waited on: a lost one only costs the members a rejoin.
    fn persist_group(&self, group: &mut Group) {
        if !group.dirty {
            return;
        }
        group.dirty = false;
        let value = group.to_value();
        if let Err(e) = self.store.append(&[(
            RecordKey::Group {
                group: group.id.clone(),
            },
            Some(value.encode()),
        )]) {
            tracing::error!(group = %group.id, error = %e, "could not persist group metadata");
        }
    }

    fn check_active(&self) -> Result<(), CoordinatorError> {
        match &self.active {
            Some(active) if !active() => Err(CoordinatorError::NotCoordinator),
            _ => Ok(()),
        }
    }

    pub(crate) async fn join(&self, group_id: &str, params: JoinParams) -> JoinReply {
        self.check_active()?;
        if group_id.is_empty() {
            return Err(CoordinatorError::InvalidGroupId);
        }
        if params.session_timeout < self.config.min_session_timeout
            || params.session_timeout > self.config.max_session_timeout
        {
            return Err(CoordinatorError::InvalidSessionTimeout);
        }
        let mixed = {
            let mut groups = self.groups.lock();
            let group = groups
                .entry(group_id.to_string())
                .or_insert_with(|| Group::new(group_id, self.clock.now_ms()));
            // An empty Streams group becomes a classic one, as in Kafka.
            if let Some(sg) = &group.streams {
                if sg.has_members() {
                    return Err(CoordinatorError::InconsistentGroupProtocol);
                }
                self.store.append(&sg.tombstones())?;
                group.streams = None;
            }
            if let Some(cg) = &mut group.consumer {
                // A consumer group with members takes the classic member in
                // (online migration); an empty one becomes a classic group,
                // as in Kafka.
                if cg.has_members() {
                    let topics = self.topics();
                    let mut records = Vec::new();
                    let client = params.client_id.clone();
                    let random = &self.random;
                    let joined = cg.classic_join(
                        params,
                        self.clock.now(),
                        self.clock.now_ms(),
                        &topics,
                        &self.config.consumer,
                        || format!("{client}-{}", random.uuid()),
                        &mut records,
                    );
                    Err((joined, self.store.append(&records)?))
                } else {
                    self.store.append(&cg.tombstones())?;
                    group.consumer = None;
                    Ok(params)
                }
            } else {
                Ok(params)
            }
        };
        let params = match mixed {
            Ok(params) => params,
            Err((joined, end)) => {
                self.store.durable(end).await?;
                let j = joined?;
                return Ok(group::JoinResult {
                    generation: j.generation,
                    protocol_type: Some(migration::CONSUMER_PROTOCOL_TYPE.to_string()),
                    protocol_name: Some(j.protocol_name),
                    leader: String::new(),
                    member_id: j.member_id,
                    members: Vec::new(),
                });
            }
        };
        let pending = {
            let mut groups = self.groups.lock();
            let group = groups
                .entry(group_id.to_string())
                .or_insert_with(|| Group::new(group_id, self.clock.now_ms()));
            if group.consumer.is_some() {
                // A consumer-protocol member got in between: join again.
                return Err(CoordinatorError::RebalanceInProgress);
            }
            let pending = group.join(
                params,
                self.clock.now(),
                self.clock.now_ms(),
                &self.config,
                &*self.random,
            );
            self.persist_group(group);
            pending
        };
        resolve(pending).await
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn sync(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
        protocol_type: Option<&str>,
        protocol_name: Option<&str>,
        assignments: Vec<(String, Bytes)>,
    ) -> SyncReply {
        self.check_active()?;
        let pending = {
            let mut groups = self.groups.lock();
            let Some(group) = groups.get_mut(group_id) else {
                return Err(CoordinatorError::UnknownMemberId);
            };
            if let Some(cg) = &mut group.consumer {
                let (name, assignment) = cg.classic_sync(
                    member_id,
                    instance_id,
                    generation,
                    protocol_type,
                    protocol_name,
                    self.clock.now(),
                    &self.topics(),
                )?;
                return Ok(group::SyncResult {
                    protocol_type: Some(migration::CONSUMER_PROTOCOL_TYPE.to_string()),
                    protocol_name: Some(name),
                    assignment,
                });
            }
            let pending = group.sync(
                member_id,
                instance_id,
                generation,
                protocol_type,
                protocol_name,
                assignments,
                self.clock.now(),
                self.clock.now_ms(),
            );
            self.persist_group(group);
            pending
        };
        resolve(pending).await
    }

    pub(crate) fn heartbeat(
        &self,
        group_id: &str,
        member_id: &str,
        instance_id: Option<&str>,
        generation: i32,
    ) -> Result<(), CoordinatorError> {
        self.check_active()?;
        let mut groups = self.groups.lock();
        let group = groups
            .get_mut(group_id)
            .ok_or(CoordinatorError::UnknownMemberId)?;
        if let Some(cg) = &mut group.consumer {
            return cg.classic_heartbeat(member_id, instance_id, generation, self.clock.now());
        }
        group.heartbeat(member_id, instance_id, generation, self.clock.now())
    }

    /// LeaveGroup for each (member id, instance id); one result per member.
    pub(crate) fn leave(
        &self,
        group_id: &str,
        members: &[(String, Option<String>)],
    ) -> Result<Vec<Result<(), CoordinatorError>>, CoordinatorError> {
        self.check_active()?;
        let mut groups = self.groups.lock();
        let group = groups
            .get_mut(group_id)
            .ok_or(CoordinatorError::UnknownMemberId)?;
        let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
        if let Some(cg) = &group.consumer {
            let topics = self.topics();
            let mut records = Vec::new();
            let resolved: Vec<Result<String, CoordinatorError>> = members
                .iter()
                .map(|(m, i)| cg.leaving_member(m, i.as_deref()))
                .collect();
            let ids: Vec<String> = resolved.iter().flatten().cloned().collect();
            let cfg = &self.config;
            if !migration::downgrade_without(group, &ids, &topics, cfg, now, now_ms, &mut records) {
                if let Some(cg) = &mut group.consumer {
                    cg.remove_members(&ids, now_ms, &topics, &cfg.consumer, &mut records);
                }
            }
            self.store.append(&records)?;
            return Ok(resolved.into_iter().map(|r| r.map(|_| ())).collect());
        }
        let results = members
            .iter()
            .map(|(m, i)| group.leave(m, i.as_deref(), now, now_ms, &self.config))
            .collect();
        self.persist_group(group);
        Ok(results)
    }

    /// OffsetCommit. The outer error applies to every partition.
    pub(crate) async fn commit(
        &self,
        group_id: &str,
        who: &Committer,
        offsets: Vec<OffsetCommit>,
    ) -> Result<Vec<PartitionResult>, CoordinatorError> {
        self.check_active()?;
        if group_id.is_empty() {
            return Err(CoordinatorError::InvalidGroupId);
        }
        let (results, end) = {
            let mut groups = self.groups.lock();
            let simple =
                who.generation < 0 && who.member_id.is_empty() && who.instance_id.is_none();
            let group = match groups.get_mut(group_id) {
                Some(g) => g,
                None if simple => groups
                    .entry(group_id.to_string())
                    .or_insert_with(|| Group::new(group_id, self.clock.now_ms())),
                // As Kafka answers a member of a group it does not know.
                None if who.version >= 9 => return Err(CoordinatorError::GroupIdNotFound),
                None => return Err(CoordinatorError::IllegalGeneration),
            };
            if let Some(cg) = &group.consumer {
                check_consumer_commit(cg, who)?;
            } else if let Some(sg) = &group.streams {
                let partitions: Vec<(String, i32)> = offsets
                    .iter()
                    .map(|c| (c.topic.clone(), c.partition))
                    .collect();
                sg.check_commit(
                    &who.member_id,
                    who.generation,
                    Some(who.version),
                    &partitions,
                )?;
            } else if simple {
                if group.has_members() {
                    return Err(CoordinatorError::UnknownMemberId);
                }
            } else {
                if !group.members().any(|m| m.id == who.member_id) && who.instance_id.is_none() {
                    return Err(CoordinatorError::UnknownMemberId);
                }
                if let Some(iid) = &who.instance_id {
                    match group
                        .members()
                        .find(|m| m.instance_id.as_deref() == Some(iid.as_str()))
                    {
                        Some(m) if m.id != who.member_id => {
                            return Err(CoordinatorError::FencedInstanceId)
                        }
                        Some(_) => {}
                        None => return Err(CoordinatorError::UnknownMemberId),
                    }
                }
                if who.generation != group.generation {
                    return Err(CoordinatorError::IllegalGeneration);
                }
                if group.state == GroupState::CompletingRebalance {
                    return Err(CoordinatorError::RebalanceInProgress);
                }
            }
            let now = self.clock.now_ms();
            let mut results = Vec::with_capacity(offsets.len());
            let mut records = Vec::new();
            let mut accepted = Vec::new();
            for c in offsets {
                let key = (c.topic.clone(), c.partition);
                let metadata = c.metadata.unwrap_or_default();
                let exists = self
                    .catalog
                    .topic(&c.topic)
                    .is_some_and(|t| t.partition(c.partition).is_some());
                if !exists {
                    results.push((key, Err(CoordinatorError::UnknownTopicOrPartition)));
                } else if metadata.len() > self.config.max_metadata_bytes {
                    results.push((
                        key,
                        Err(CoordinatorError::OffsetMetadataTooLarge(
                            self.config.max_metadata_bytes,
                        )),
                    ));
                } else {
                    let value = OffsetValue {
                        offset: c.offset,
                        leader_epoch: c.leader_epoch,
                        metadata,
                        commit_timestamp: now,
                    };
                    records.push((
                        RecordKey::Offset {
                            group: group_id.to_string(),
                            topic: c.topic,
                            partition: c.partition,
                        },
                        Some(value.encode()),
                    ));
                    accepted.push((key.clone(), value));
                    results.push((key, Ok(())));
                }
            }
            let end = self.store.append(&records)?;
            group.offsets.extend(accepted);
            (results, end)
        };
        self.store.durable(end).await?;
        Ok(results)
    }

    /// TxnOffsetCommit: the offsets are written to `__consumer_offsets` as
    /// a transactional batch of the producer and kept pending; the group
    /// sees them only when the transaction's COMMIT marker reaches that
    /// partition (`complete_transaction`). A member given (v3+) must be the
    /// group's current one, as for OffsetCommit.
    pub(crate) async fn txn_commit(
        &self,
        group_id: &str,
        producer_id: i64,
        producer_epoch: i16,
        who: &Committer,
        offsets: Vec<OffsetCommit>,
    ) -> Result<Vec<PartitionResult>, CoordinatorError> {
        self.check_active()?;
        if group_id.is_empty() {
            return Err(CoordinatorError::InvalidGroupId);
        }
        let (results, end) = {
            let groups = self.groups.lock();
            if !who.member_id.is_empty() || who.generation >= 0 {
                let g = groups
                    .get(group_id)
                    .ok_or(CoordinatorError::IllegalGeneration)?;
                if let Some(sg) = &g.streams {
                    let partitions: Vec<(String, i32)> = offsets
                        .iter()
                        .map(|c| (c.topic.clone(), c.partition))
                        .collect();
                    sg.check_commit(&who.member_id, who.generation, None, &partitions)?;
                }
                match &g.consumer {
                    None if g.streams.is_some() => {}
                    Some(cg) => {
                        let m = cg
                            .member(&who.member_id)
                            .ok_or(CoordinatorError::UnknownMemberId)?;
                        if m.epoch != who.generation {
                            return Err(CoordinatorError::IllegalGeneration);
                        }
                    }
                    None => {
                        let member = g.members().find(|m| m.id == who.member_id);
                        let Some(member) = member else {
                            return Err(CoordinatorError::UnknownMemberId);
                        };
                        if who.instance_id.is_some() && member.instance_id != who.instance_id {
                            return Err(CoordinatorError::FencedInstanceId);
                        }
                        if who.generation != g.generation {
                            return Err(CoordinatorError::IllegalGeneration);
                        }
                    }
                }
            }
            let now = self.clock.now_ms();
            let mut results = Vec::with_capacity(offsets.len());
            let mut records = Vec::new();
            for c in offsets {
                let key = (c.topic.clone(), c.partition);
                let metadata = c.metadata.unwrap_or_default();
                let exists = self
                    .catalog
                    .topic(&c.topic)
                    .is_some_and(|t| t.partition(c.partition).is_some());
                if !exists {
                    results.push((key, Err(CoordinatorError::UnknownTopicOrPartition)));
                } else if metadata.len() > self.config.max_metadata_bytes {
                    results.push((
                        key,
                        Err(CoordinatorError::OffsetMetadataTooLarge(
                            self.config.max_metadata_bytes,
                        )),
                    ));
                } else {
                    let value = OffsetValue {
                        offset: c.offset,
                        leader_epoch: c.leader_epoch,
                        metadata,
                        commit_timestamp: now,
                    };
                    records.push((
                        RecordKey::Offset {
                            group: group_id.to_string(),
                            topic: c.topic,
                            partition: c.partition,
                        },
                        Some(value.encode()),
                    ));
                    results.push((key, Ok(())));
                }
            }
            if records.is_empty() {
                return Ok(results);
            }
            let mut txn = self.txn.lock();
            let mut sequence = txn.next_sequence(producer_id, producer_epoch);
            let mut appended = self
                .store
                .append_transactional(&records, (producer_id, producer_epoch, sequence));
            // The log's producer state is the authority on sequences (ours
            // is rebuilt from what replay saw, which compaction may thin).
            if let Err(LogError::OutOfOrderSequence { expected, .. }) = appended {
                sequence = expected;
                appended = self
                    .store
                    .append_transactional(&records, (producer_id, producer_epoch, sequence));
            }
            let end = match appended {
                Ok(end) => end,
                Err(LogError::InvalidProducerEpoch { .. }) => {
                    return Err(CoordinatorError::InvalidProducerEpoch)
                }
                Err(e) => return Err(e.into()),
            };
            txn.sequences.insert(
                producer_id,
                (producer_epoch, sequence.wrapping_add(records.len() as i32)),
            );
            txn.pending.entry(producer_id).or_default().extend(records);
            (results, end)
        };
        self.store.durable(end).await?;
        Ok(results)
    }

    /// A COMMIT or ABORT marker of `producer_id` reached `__consumer_offsets`:
    /// its pending transactional offsets become the group's, or are dropped.
    pub(crate) fn complete_transaction(&self, producer_id: i64, commit: bool) {
        let mut groups = self.groups.lock();
        let pending = self.txn.lock().pending.remove(&producer_id);
        if !commit {
            return;
        }
        let now = self.clock.now();
        for (key, value) in pending.unwrap_or_default() {
            apply_record(&mut groups, key, value, now);
        }
    }

    /// Partitions of `group_id` with transactional offsets not yet committed
    /// (OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT for them).
    pub(crate) fn unstable_offsets(
        &self,
        group_id: &str,
    ) -> std::collections::HashSet<(String, i32)> {
        let txn = self.txn.lock();
        txn.pending
            .values()
            .flatten()
            .filter_map(|(key, _)| match key {
                RecordKey::Offset {
                    group,
                    topic,
                    partition,
                } if group == group_id => Some((topic.clone(), *partition)),
                _ => None,
            })
            .collect()
    }

    /// OffsetFetch v9+ names the member asking: a consumer-protocol member
    /// must be known and at its current epoch (as Kafka checks).
    pub(crate) fn validate_fetch(
        &self,
        group_id: &str,
        member_id: Option<&str>,
        member_epoch: i32,
    ) -> Result<(), CoordinatorError> {
        self.check_active()?;
        let groups = self.groups.lock();
        if member_id.is_none() && member_epoch < 0 {
            return Ok(());
        }
        if let Some(sg) = groups.get(group_id).and_then(|g| g.streams.as_ref()) {
            return sg.check_fetch(member_id.unwrap_or_default(), member_epoch);
        }
        let Some(cg) = groups.get(group_id).and_then(|g| g.consumer.as_ref()) else {
            return Ok(());
        };
        let m = member_id
            .and_then(|id| cg.member(id))
            .ok_or(CoordinatorError::UnknownMemberId)?;
        if m.epoch != member_epoch {
            return Err(match m.classic {
                Some(_) => CoordinatorError::IllegalGeneration,
                None => CoordinatorError::StaleMemberEpoch,
            });
        }
        Ok(())
    }

    /// Every topic as consumer groups see it.
    fn topics(&self) -> Topics {
        self.catalog
            .topics()
            .iter()
            .map(|t| {
                let meta = TopicMeta {
                    id: t.id(),
                    partitions: t.partition_count() as i32,
                    internal: t.is_internal(),
                };
                (t.name().to_string(), meta)
            })
            .collect()
    }

    /// ConsumerGroupHeartbeat (`version` of the request). A member joining
    /// (epoch 0) creates the group, or takes over an empty classic one.
    pub(crate) async fn consumer_heartbeat(
        &self,
        group_id: &str,
        params: HeartbeatParams,
        version: i16,
    ) -> Result<HeartbeatResult, CoordinatorError> {
        self.check_active()?;
        consumer::validate(group_id, &params, version)?;
        let topics = self.topics();
        let mut records = Vec::new();
        let (result, end) = {
            let mut groups = self.groups.lock();
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            let joining = params.member_epoch == 0;
            let created = !groups.contains_key(group_id);
            let group = match groups.get_mut(group_id) {
                Some(g) => g,
                None if joining => groups
                    .entry(group_id.to_string())
                    .or_insert_with(|| Group::new(group_id, now_ms)),
                None => return Err(CoordinatorError::GroupIdNotFound),
            };
            if group.streams.is_some() {
                return Err(CoordinatorError::GroupNotFound(format!(
                    "Group {group_id} is not a consumer group."
                )));
            }
            if group.consumer.is_none() && joining && group.has_members() {
                migration::upgrade(group, &topics, &self.config, now, now_ms, &mut records)?;
            }
            if group.consumer.is_none() {
                if !joining || group.has_members() {
                    return Err(CoordinatorError::GroupIdNotFound);
                }
                group.start_over(now_ms, &mut records);
                group.consumer = Some(ConsumerGroup::new(group_id, now_ms));
            }
            // The last consumer-protocol member leaving a group with classic
            // members turns it classic at its current epoch.
            let leaver = group
                .consumer
                .as_ref()
                .and_then(|cg| cg.member(&params.member_id))
                .filter(|m| {
                    params.member_epoch == consumer::LEAVE_EPOCH
                        && (params.instance_id.is_none() || params.instance_id == m.instance_id)
                })
                .map(|m| vec![m.id.clone()])
                .unwrap_or_default();
            let cfg = &self.config;
            let result = if migration::downgrade_without(
                group,
                &leaver,
                &topics,
                cfg,
                now,
                now_ms,
                &mut records,
            ) {
                Ok(HeartbeatResult {
                    member_id: params.member_id,
                    member_epoch: consumer::LEAVE_EPOCH,
                    heartbeat_interval_ms: 0,
                    assignment: None,
                })
            } else {
                let cg = group.consumer.as_mut().expect("set above");
                let random = &self.random;
                cg.heartbeat(
                    params,
                    now,
                    now_ms,
                    &topics,
                    &self.group_configs.consumer(group_id, &cfg.consumer),
                    || random.uuid().to_string(),
                    &mut records,
                )
            };
            // A refused first heartbeat leaves no group behind.
            if result.is_err() && created {
                groups.remove(group_id);
            }
            (result, self.store.append(&records)?)
        };
        if !records.is_empty() {
            self.store.durable(end).await?;
        }
        result
    }

    /// ConsumerGroupDescribe: GROUP_ID_NOT_FOUND unless it is a consumer group.
    pub(crate) fn consumer_describe(
        &self,
        group_id: &str,
    ) -> Result<ConsumerGroupDescription, CoordinatorError> {
        self.check_active()?;
        let topics = self.topics();
        let by_id: HashMap<uuid::Uuid, &str> = topics
            .iter()
            .map(|(name, t)| (t.id, name.as_str()))
            .collect();
        let named = |a: &assignor::Assignment| -> NamedAssignment {
            a.iter()
                .filter(|(_, ps)| !ps.is_empty())
                .map(|(id, ps)| {
                    let name = by_id.get(id).copied().unwrap_or_default().to_string();
                    (*id, name, ps.iter().copied().collect())
                })
                .collect()
        };
        let groups = self.groups.lock();
        let cg = groups
            .get(group_id)
            .and_then(|g| g.consumer.as_ref())
            .ok_or(CoordinatorError::GroupIdNotFound)?;
        Ok(ConsumerGroupDescription {
            state: cg.state(),
            epoch: cg.epoch,
            assignment_epoch: cg.assignment_epoch,
            assignor: cg.assignor(&self.config.consumer),
            members: cg
                .members()
                .map(|m| ConsumerMemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    rack_id: m.rack_id.clone(),
                    epoch: m.epoch,
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    subscribed_topic_names: m.subscribed_names.clone(),
                    subscribed_topic_regex: m.subscribed_regex.clone(),
                    assignment: named(&m.assigned),
                    target: cg.target_of(&m.id).map(&named).unwrap_or_default(),
                    classic: m.classic.is_some(),
                })
                .collect(),
        })
    }

    /// StreamsGroupHeartbeat. A member joining (epoch 0) creates the group,
    /// or takes over an empty classic one (or one only offsets were
    /// committed to, as by a reset before the application first ran).
    pub(crate) async fn streams_heartbeat(
        &self,
        group_id: &str,
        params: streams::HeartbeatParams,
    ) -> Result<streams::HeartbeatResult, CoordinatorError> {
        self.check_active()?;
        streams::validate(group_id, &params)?;
        let topics = self.topics();
        let mut records = Vec::new();
        let (result, end) = {
            let mut groups = self.groups.lock();
            let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
            let joining = params.member_epoch == 0;
            let created = !groups.contains_key(group_id);
            let not_streams = || {
                CoordinatorError::GroupNotFound(format!("Group {group_id} is not a streams group."))
            };
            let group = match groups.get_mut(group_id) {
                Some(g) => g,
                None if joining => groups
                    .entry(group_id.to_string())
                    .or_insert_with(|| Group::new(group_id, now_ms)),
                None => {
                    return Err(CoordinatorError::GroupNotFound(format!(
                        "Streams group {group_id} not found."
                    )))
                }
            };
            if group.streams.is_none() {
                if !joining || group.consumer.is_some() || group.has_members() {
                    return Err(not_streams());
                }
                group.start_over(now_ms, &mut records);
                group.streams = Some(streams::StreamsGroup::new(group_id, now_ms));
            }
            let sg = group.streams.as_mut().expect("set above");
            let cfg = self.group_configs.streams(group_id, &self.config.streams);
            let result = sg.heartbeat(params, now, now_ms, &topics, &cfg, &mut records);
            // A refused first heartbeat leaves no group behind.
            if result.is_err() && created {
                groups.remove(group_id);
            }
            (result, self.store.append(&records)?)
        };
        if !records.is_empty() {
            self.store.durable(end).await?;
        }
        result
    }

    /// ShareGroupHeartbeat. A member joining creates the group.
    pub(crate) fn share_heartbeat(
        &self,
        group_id: &str,
        params: share_group::HeartbeatParams,
    ) -> Result<share_group::HeartbeatResult, CoordinatorError> {
        let cfg = &self.share_config(group_id);
        self.check_active()?;
        share_group::validate(group_id, &params)?;
        let topics = self.topics();
        let mut groups = self.groups.lock();
        let now_ms = self.clock.now_ms();
        let group = match groups.get_mut(group_id) {
            Some(g) => g,
            None if params.member_epoch == 0 => groups
                .entry(group_id.to_string())
                .or_insert_with(|| Group::new(group_id, now_ms)),
            // Membership is not persisted yet: after a restart a member must
            // rejoin, which UNKNOWN_MEMBER_ID makes it do (GROUP_ID_NOT_FOUND
            // is fatal to the Java client).
            None => return Err(CoordinatorError::UnknownMemberId),
        };
        if group.share.is_none() {
            if group.has_members() || group.consumer.is_some() || group.streams.is_some() {
                return Err(CoordinatorError::GroupNotFound(format!(
                    "Group {group_id} is not a share group."
                )));
            }
            group.share = Some(share_group::ShareGroup::new(group_id));
        }
        let sg = group.share.as_mut().expect("set above");
        let epoch = sg.epoch;
        let result = sg.heartbeat(params, self.clock.now(), &topics, cfg);
        // Membership is not written (members rejoin after a failover); the
        // group and its epoch are, so it outlives its members.
        if sg.epoch != epoch {
            if let Err(e) = self.store.append(&[sg.epoch_record()]) {
                tracing::error!(group = group_id, error = %e, "could not persist share group");
            }
        }
        result
    }

    /// Whether `group_id` is a share group; GROUP_ID_NOT_FOUND if it is
    /// another kind, and with `create` an absent one becomes an empty
    /// share group (AlterShareGroupOffsets). NON_EMPTY_GROUP while it has
    /// members: its offsets change only while nobody reads.
    pub(crate) fn share_group_empty(
        &self,
        group_id: &str,
        create: bool,
    ) -> Result<(), CoordinatorError> {
        self.check_active()?;
        if group_id.is_empty() {
            return Err(CoordinatorError::InvalidGroupId);
        }
        let mut groups = self.groups.lock();
        let g = match groups.get_mut(group_id) {
            Some(g) => g,
            None if create => {
                let mut g = Group::new(group_id, self.clock.now_ms());
                let sg = share_group::ShareGroup::new(group_id);
                self.store.append(&[sg.epoch_record()])?;
                g.share = Some(sg);
                groups.entry(group_id.to_string()).or_insert(g)
            }
            None => return Err(CoordinatorError::GroupIdNotFound),
        };
        match &g.share {
            None => Err(CoordinatorError::GroupNotFound(format!(
                "Group {group_id} is not a share group."
            ))),
            Some(_) if g.has_members() => Err(CoordinatorError::NonEmptyGroup),
            Some(_) => Ok(()),
        }
    }

    /// Whether `group_id` is a share group.
    pub(crate) fn is_share_group(&self, group_id: &str) -> bool {
        self.groups
            .lock()
            .get(group_id)
            .is_some_and(|g| g.share.is_some())
    }

    /// ShareGroupDescribe: the group's state, epochs and members with their
    /// assignments, or GROUP_ID_NOT_FOUND unless it is a share group.
    pub(crate) fn share_describe(
        &self,
        group_id: &str,
    ) -> Result<(&'static str, i32, i32, Vec<share_group::Member>), CoordinatorError> {
        self.check_active()?;
        let groups = self.groups.lock();
        let g = groups.get(group_id).ok_or_else(|| {
            CoordinatorError::GroupNotFound(format!("Group {group_id} not found."))
        })?;
        let sg = g.share.as_ref().ok_or_else(|| {
            CoordinatorError::GroupNotFound(format!("Group {group_id} is not a share group."))
        })?;
        Ok((
            sg.state(),
            sg.epoch,
            sg.assignment_epoch,
            sg.members().cloned().collect(),
        ))
    }

    /// StreamsGroupDescribe: GROUP_ID_NOT_FOUND unless it is a Streams group.
    pub(crate) fn streams_describe(
        &self,
        group_id: &str,
    ) -> Result<StreamsGroupDescription, CoordinatorError> {
        self.check_active()?;
        let topics = self.topics();
        let groups = self.groups.lock();
        let g = groups.get(group_id).ok_or_else(|| {
            CoordinatorError::GroupNotFound(format!("Group {group_id} not found."))
        })?;
        let sg = g.streams.as_ref().ok_or_else(|| {
            CoordinatorError::GroupNotFound(format!("Group {group_id} is not a streams group."))
        })?;
        Ok(StreamsGroupDescription {
            state: sg.state(),
            epoch: sg.epoch,
            assignment_epoch: sg.assignment_epoch,
            topology: sg.topology.clone(),
            configured: sg.configured(&topics),
            members: sg
                .members()
                .map(|m| (m.clone(), sg.target_of(&m.id).cloned().unwrap_or_default()))
                .collect(),
        })
    }

    /// Committed offsets of a group: the named partitions, or all of them.
    pub(crate) fn fetch_offsets(
        &self,
        group_id: &str,
        wanted: Option<Vec<(String, Vec<i32>)>>,
    ) -> TopicOffsets {
        let groups = self.groups.lock();
        let offsets = groups.get(group_id).map(|g| &g.offsets);
        match wanted {
            Some(topics) => topics
                .into_iter()
                .map(|(t, parts)| {
                    let found = parts
                        .into_iter()
                        .map(|p| (p, offsets.and_then(|o| o.get(&(t.clone(), p)).cloned())))
                        .collect();
                    (t, found)
                })
                .collect(),
            None => {
                let mut by_topic: TopicOffsets = Vec::new();
                for ((t, p), v) in offsets.into_iter().flatten() {
                    match by_topic.last_mut() {
                        Some((last, parts)) if last == t => parts.push((*p, Some(v.clone()))),
                        _ => by_topic.push((t.clone(), vec![(*p, Some(v.clone()))])),
                    }
                }
                by_topic
            }
        }
    }

    pub(crate) fn list(&self) -> Vec<GroupListing> {
        let groups = self.groups.lock();
        let mut out: Vec<GroupListing> = groups
            .values()
            .map(|g| match &g.consumer {
                None if g.share.is_some() => GroupListing {
                    group_id: g.id.clone(),
                    protocol_type: "share".to_string(),
                    state: g.share.as_ref().map_or("Empty", |s| s.state()),
                    group_type: "share",
                },
                None if g.streams.is_some() => GroupListing {
                    group_id: g.id.clone(),
                    protocol_type: "streams".to_string(),
                    state: g.streams.as_ref().map_or("Empty", |s| s.state()),
                    group_type: "streams",
                },
                Some(cg) => GroupListing {
                    group_id: g.id.clone(),
                    protocol_type: "consumer".to_string(),
                    state: cg.state(),
                    group_type: "consumer",
                },
                None => GroupListing {
                    group_id: g.id.clone(),
                    protocol_type: g.protocol_type.clone().unwrap_or_default(),
                    state: g.state.name(),
                    group_type: "classic",
                },
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    /// DescribeGroups: classic groups only (consumer groups are described
    /// by ConsumerGroupDescribe, as in Kafka).
    pub(crate) fn describe(&self, group_id: &str) -> Result<GroupDescription, NotDescribed> {
        let groups = self.groups.lock();
        let g = groups.get(group_id).ok_or(NotDescribed::NotFound)?;
        if g.consumer.is_some() || g.streams.is_some() || g.share.is_some() {
            return Err(NotDescribed::NotClassic);
        }
        let protocol = g.protocol.clone().unwrap_or_default();
        let stable = g.state == GroupState::Stable;
        Ok(GroupDescription {
            state: g.state.name(),
            protocol_type: g.protocol_type.clone().unwrap_or_default(),
            protocol: protocol.clone(),
            members: g
                .members()
                .map(|m| MemberDescription {
                    member_id: m.id.clone(),
                    instance_id: m.instance_id.clone(),
                    client_id: m.client_id.clone(),
                    client_host: m.client_host.clone(),
                    metadata: if stable {
                        m.metadata(&protocol)
                    } else {
                        Bytes::new()
                    },
                    assignment: if stable {
                        m.assignment.clone()
                    } else {
                        Bytes::new()
                    },
                })
                .collect(),
        })
    }

    /// DeleteGroups: only groups without members; their offsets go too.
    pub(crate) fn delete_group(&self, group_id: &str) -> Result<(), CoordinatorError> {
        let mut groups = self.groups.lock();
        let group = groups
            .get(group_id)
            .ok_or(CoordinatorError::GroupIdNotFound)?;
        if !group.is_empty_group() {
            return Err(CoordinatorError::NonEmptyGroup);
        }
        let mut records: Vec<(RecordKey, Option<Bytes>)> = group
            .offsets
            .keys()
            .map(|(t, p)| {
                (
                    RecordKey::Offset {
                        group: group_id.to_string(),
                        topic: t.clone(),
                        partition: *p,
                    },
                    None,
                )
            })
            .collect();
        match (&group.consumer, &group.streams, &group.share) {
            (Some(cg), _, _) => records.extend(cg.tombstones()),
            (_, Some(sg), _) => records.extend(sg.tombstones()),
            (_, _, Some(sg)) => records.push((sg.epoch_record().0, None)),
            (None, None, None) => records.push((
                RecordKey::Group {
                    group: group_id.to_string(),
                },
                None,
            )),
        }
        self.store.append(&records)?;
        groups.remove(group_id);
        Ok(())
    }

    /// OffsetDelete: refused for topics the group's members subscribe to.
    pub(crate) fn delete_offsets(
        &self,
        group_id: &str,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<PartitionResult>, CoordinatorError> {
        let mut groups = self.groups.lock();
        let group = groups
            .get_mut(group_id)
            .ok_or(CoordinatorError::GroupIdNotFound)?;
        let has_members = group.has_members();
        let subscribed: Vec<String> = match &mut group.consumer {
            None if group.streams.is_some() => match group.streams.as_ref() {
                Some(sg) if has_members => sg.input_topics().into_iter().collect(),
                _ => Vec::new(),
            },
            Some(cg) => {
                let topics = self.topics();
                cg.subscribed_topics(&topics).into_iter().collect()
            }
            None if has_members => group.subscribed_topics(),
            None => Vec::new(),
        };
        let mut results = Vec::new();
        let mut records = Vec::new();
        for (topic, partition) in partitions {
            if subscribed.contains(&topic) {
                results.push((
                    (topic, partition),
                    Err(CoordinatorError::GroupSubscribedToTopic),
                ));
                continue;
            }
            if group.offsets.remove(&(topic.clone(), partition)).is_some() {
                records.push((
                    RecordKey::Offset {
                        group: group_id.to_string(),
                        topic: topic.clone(),
                        partition,
                    },
                    None,
                ));
            }
            results.push(((topic, partition), Ok(())));
        }
        self.store.append(&records)?;
        Ok(results)
    }

    /// Drops the committed offsets of a deleted topic from every group.
    pub(crate) fn forget_topic(&self, topic: &str) {
        let mut groups = self.groups.lock();
        let mut records = Vec::new();
        for g in groups.values_mut() {
            let gone: Vec<(String, i32)> = g
                .offsets
                .keys()
                .filter(|(t, _)| t == topic)
                .cloned()
                .collect();
            for key in gone {
                g.offsets.remove(&key);
                records.push((
                    RecordKey::Offset {
                        group: g.id.clone(),
                        topic: key.0,
                        partition: key.1,
                    },
                    None,
                ));
            }
        }
        if let Err(e) = self.store.append(&records) {
            tracing::error!(topic, error = %e, "could not drop offsets of deleted topic");
        }
    }

    /// Timer work: expired sessions and rebalance deadlines, and with
    /// `expire_offsets`, offsets past offsets.retention.minutes.
    pub(crate) fn tick(&self, expire_offsets: bool) {
        let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
        let mut groups = self.groups.lock();
        let mut tombstones = Vec::new();
        let mut topics = None;
        for g in groups.values_mut() {
            let expired = g
                .consumer
                .as_ref()
                .map(|cg| {
                    cg.expired(
                        now,
                        &self.group_configs.consumer(&g.id, &self.config.consumer),
                    )
                })
                .unwrap_or_default();
            if !expired.is_empty() {
                tracing::info!(group = %g.id, members = ?expired, "consumer group members expired");
                let topics = topics.get_or_insert_with(|| self.topics());
                let cfg = &self.config;
                let records = &mut tombstones;
                if !migration::downgrade_without(g, &expired, topics, cfg, now, now_ms, records) {
                    if let Some(cg) = &mut g.consumer {
                        cg.remove_members(&expired, now_ms, topics, &cfg.consumer, records);
                    }
                }
            }
            let expired = g
                .streams
                .as_ref()
                .map(|sg| {
                    sg.expired(
                        now,
                        &self.group_configs.streams(&g.id, &self.config.streams),
                    )
                })
                .unwrap_or_default();
            if !expired.is_empty() {
                tracing::info!(group = %g.id, members = ?expired, "streams group members expired");
                let topics = topics.get_or_insert_with(|| self.topics());
                let cfg = self.group_configs.streams(&g.id, &self.config.streams);
                if let Some(sg) = &mut g.streams {
                    sg.remove_members(&expired, now_ms, topics, &cfg, &mut tombstones);
                }
            }
            let expired = g
                .share
                .as_ref()
                .map(|sg| sg.expired(now, &self.group_configs.share(&g.id, &self.config.share)))
                .unwrap_or_default();
            if !expired.is_empty() {
                tracing::info!(group = %g.id, members = ?expired, "share group members expired");
                let topics = topics.get_or_insert_with(|| self.topics());
                if let Some(sg) = &mut g.share {
                    sg.remove_members(&expired, topics);
                }
            }
            g.tick(now, now_ms, &self.config);
            self.persist_group(g);
            if expire_offsets && g.state == GroupState::Empty && !g.has_members() {
                tombstones.extend(expire(
                    g,
                    now_ms,
                    self.config.offsets_retention.as_millis() as i64,
                ));
            }
        }
        // Empty consumer groups go only with the offset expiry pass, as in
        // Kafka, so a member whose session just lapsed is told
        // UNKNOWN_MEMBER_ID (and rejoins), not GROUP_ID_NOT_FOUND.
        let dead: Vec<String> = groups
            .values()
            .filter(|g| {
                g.is_idle()
                    && g.share.is_none()
                    && (expire_offsets || (g.consumer.is_none() && g.streams.is_none()))
            })
            .map(|g| g.id.clone())
            .collect();
        for id in dead {
            match groups.remove(&id).map(|g| (g.consumer, g.streams)) {
                Some((Some(cg), _)) => tombstones.extend(cg.tombstones()),
                Some((_, Some(sg))) => tombstones.extend(sg.tombstones()),
                _ => tombstones.push((RecordKey::Group { group: id }, None)),
            }
        }
        if let Err(e) = self.store.append(&tombstones) {
            tracing::error!(error = %e, "could not write offset expirations");
        }
    }
}

/// Group state as the offsets topic holds it.
/// Offsets committed inside transactions (TxnOffsetCommit) that wait for
/// their transaction's marker, and the next sequence number of each
/// producer's transactional batches in the offsets log.
#[derive(Default)]
struct TxnOffsets {
    pending: HashMap<i64, Vec<(RecordKey, Option<Bytes>)>>,
    sequences: HashMap<i64, (i16, i32)>,
}

impl TxnOffsets {
    fn next_sequence(&self, producer_id: i64, epoch: i16) -> i32 {
        match self.sequences.get(&producer_id) {
            Some(&(e, next)) if e == epoch => next,
            _ => 0,
        }
    }
}

async fn load(
    store: &OffsetsStore,
    now: Instant,
) -> Result<(HashMap<String, Group>, TxnOffsets), LogError> {
    let mut groups: HashMap<String, Group> = HashMap::new();
    let mut txn = TxnOffsets::default();
    store
        .replay(|replayed| match replayed {
            Replayed::Record(key, value) => apply_record(&mut groups, key, value, now),
            Replayed::Transactional {
                producer_id,
                producer_epoch,
                sequence,
                key,
                value,
            } => {
                let next = sequence.wrapping_add(1);
                txn.sequences.insert(producer_id, (producer_epoch, next));
                txn.pending
                    .entry(producer_id)
                    .or_default()
                    .push((key, value));
            }
            Replayed::Marker {
                producer_id,
                commit,
            } => {
                let pending = txn.pending.remove(&producer_id).unwrap_or_default();
                if commit {
                    for (key, value) in pending {
                        apply_record(&mut groups, key, value, now);
                    }
                }
            }
        })
        .await?;
    for g in groups.values_mut() {
        if let Some(cg) = &mut g.consumer {
            cg.finish_restore(now);
        }
        if let Some(sg) = &mut g.streams {
            sg.finish_restore(now);
        }
    }
    Ok((groups, txn))
}

/// Applies one record of the offsets topic to the groups being rebuilt.
fn apply_record(
    groups: &mut HashMap<String, Group>,
    key: RecordKey,
    value: Option<Bytes>,
    now: Instant,
) {
    match (key, value) {
        (
            RecordKey::Offset {
                group,
                topic,
                partition,
            },
            Some(v),
        ) => match OffsetValue::decode(&v) {
            Ok(v) => {
                let g = groups
                    .entry(group.clone())
                    .or_insert_with(|| Group::new(&group, v.commit_timestamp));
                g.offsets.insert((topic, partition), v);
            }
            Err(e) => tracing::warn!(error = %e, "skipping unreadable offset record"),
        },
        (
            RecordKey::Offset {
                group,
                topic,
                partition,
            },
            None,
        ) => {
            if let Some(g) = groups.get_mut(&group) {
                g.offsets.remove(&(topic, partition));
            }
        }
        (RecordKey::Group { group }, Some(v)) => match GroupValue::decode(&v) {
            Ok(v) => {
                let mut restored = Group::restore(&group, &v, now);
                if let Some(old) = groups.remove(&group) {
                    restored.offsets = old.offsets;
                }
                groups.insert(group, restored);
            }
            Err(e) => tracing::warn!(error = %e, "skipping unreadable group record"),
        },
        // The classic metadata is gone (deleted, expired, or the group
        // moved to the consumer protocol); offsets have their own records.
        (RecordKey::Group { group }, None) => {
            if let Some(g) = groups.get_mut(&group).filter(|g| g.consumer.is_none()) {
                if g.offsets.is_empty() {
                    groups.remove(&group);
                } else {
                    let mut fresh = Group::new(&group, g.state_since_ms);
                    fresh.offsets = std::mem::take(&mut g.offsets);
                    *g = fresh;
                }
            }
        }
        (key, value) => restore_consumer(groups, key, value, now),
    }
}

/// Replays one consumer-group record (keys 3 to 8).
fn restore_consumer(
    groups: &mut HashMap<String, Group>,
    key: RecordKey,
    value: Option<Bytes>,
    now: Instant,
) {
    let result: Result<(), records::RecordError> = (|| {
        match key {
            RecordKey::ConsumerGroup { group } => match value {
                Some(v) => {
                    let v = ConsumerGroupValue::decode(&v)?;
                    consumer_of(groups, &group).restore_group(&v);
                }
                None => {
                    if let Some(g) = groups.get_mut(&group) {
                        g.consumer = None;
                        if g.offsets.is_empty() {
                            groups.remove(&group);
                        }
                    }
                }
            },
            RecordKey::ConsumerMember { group, member } => {
                let v = value.map(|v| ConsumerMemberValue::decode(&v)).transpose()?;
                if v.is_some() || groups.contains_key(&group) {
                    consumer_of(groups, &group).restore_member(&member, v, now);
                }
            }
            RecordKey::TargetMember { group, member } => {
                let v = value.map(|v| decode_target(&v)).transpose()?;
                if v.is_some() || groups.contains_key(&group) {
                    consumer_of(groups, &group).restore_target(&member, v);
                }
            }
            RecordKey::TargetAssignment { group } => {
                let v = value.map(|v| decode_assignment_epoch(&v)).transpose()?;
                if v.is_some() || groups.contains_key(&group) {
                    consumer_of(groups, &group).restore_assignment_epoch(v);
                }
            }
            RecordKey::CurrentAssignment { group, member } => {
                let v = value
                    .map(|v| CurrentAssignmentValue::decode(&v))
                    .transpose()?;
                if v.is_some() {
                    consumer_of(groups, &group).restore_current(&member, v, now);
                }
            }
            RecordKey::ShareGroup { group } => match value {
                Some(v) => {
                    let v = ConsumerGroupValue::decode(&v)?;
                    let g = groups
                        .entry(group.clone())
                        .or_insert_with(|| Group::new(&group, 0));
                    g.share = Some(share_group::ShareGroup::restore(&group, &v));
                }
                None => {
                    if let Some(g) = groups.get_mut(&group) {
                        g.share = None;
                        if g.offsets.is_empty() {
                            groups.remove(&group);
                        }
                    }
                }
            },
            key @ (RecordKey::StreamsGroup { .. }
            | RecordKey::StreamsMember { .. }
            | RecordKey::StreamsTargetAssignment { .. }
            | RecordKey::StreamsTargetMember { .. }
            | RecordKey::StreamsCurrentAssignment { .. }
            | RecordKey::StreamsTopology { .. }) => restore_streams(groups, key, value, now)?,
            // Kafka 4.1 no longer writes partition metadata (the epoch
            // record's metadata hash replaced it); older records are skipped.
            _ => {}
        }
        Ok(())
    })();
    if let Err(e) = result {
        tracing::warn!(error = %e, "skipping unreadable consumer group record");
    }
}

/// Replays one Streams group record (keys 17 to 23). A tombstone of the
/// group's epoch record ends the group (its offsets stay).
fn restore_streams(
    groups: &mut HashMap<String, Group>,
    key: RecordKey,
    value: Option<Bytes>,
    now: Instant,
) -> Result<(), records::RecordError> {
    use streams_records as sr;
    let (group, member) = match &key {
        RecordKey::StreamsMember { group, member }
        | RecordKey::StreamsTargetMember { group, member }
        | RecordKey::StreamsCurrentAssignment { group, member } => (group.clone(), member.clone()),
        RecordKey::StreamsGroup { group }
        | RecordKey::StreamsTargetAssignment { group }
        | RecordKey::StreamsTopology { group } => (group.clone(), String::new()),
        _ => return Ok(()),
    };
    let exists = groups.get(&group).is_some_and(|g| g.streams.is_some());
    if value.is_none() && !exists {
        return Ok(());
    }
    if let (RecordKey::StreamsGroup { .. }, None) = (&key, &value) {
        if let Some(g) = groups.get_mut(&group) {
            g.streams = None;
            if g.offsets.is_empty() {
                groups.remove(&group);
            }
        }
        return Ok(());
    }
    let g = groups
        .entry(group.clone())
        .or_insert_with(|| Group::new(&group, 0));
    let sg = g
        .streams
        .get_or_insert_with(|| streams::StreamsGroup::new(&group, 0));
    let v = value.as_deref();
    match key {
        RecordKey::StreamsGroup { .. } => {
            sg.restore_group(sr::StreamsGroupValue::decode(v.unwrap_or_default())?)
        }
        RecordKey::StreamsTopology { .. } => {
            sg.restore_topology(v.map(sr::Topology::decode).transpose()?)
        }
        RecordKey::StreamsMember { .. } => sg.restore_member(
            &member,
            v.map(sr::StreamsMemberValue::decode).transpose()?,
            now,
        ),
        RecordKey::StreamsTargetMember { .. } => {
            sg.restore_target(&member, v.map(sr::decode_target).transpose()?)
        }
        RecordKey::StreamsTargetAssignment { .. } => {
            sg.restore_assignment_epoch(v.map(records::decode_assignment_epoch).transpose()?)
        }
        RecordKey::StreamsCurrentAssignment { .. } => {
            if let Some(v) = v {
                sg.restore_current(&member, sr::StreamsCurrentValue::decode(v)?, now);
            }
        }
        _ => {}
    }
    Ok(())
}

fn consumer_of<'a>(groups: &'a mut HashMap<String, Group>, id: &str) -> &'a mut ConsumerGroup {
    let g = groups
        .entry(id.to_string())
        .or_insert_with(|| Group::new(id, 0));
    g.consumer.get_or_insert_with(|| ConsumerGroup::new(id, 0))
}

/// OffsetCommit against a consumer-protocol group (Kafka's
/// ConsumerGroup.validateOffsetCommit).
fn check_consumer_commit(cg: &ConsumerGroup, who: &Committer) -> Result<(), CoordinatorError> {
    if who.generation < 0 && !cg.has_members() {
        return Ok(());
    }
    let m = cg
        .member(&who.member_id)
        .ok_or(CoordinatorError::UnknownMemberId)?;
    if m.classic.is_some() {
        return match who.generation == m.epoch {
            true => Ok(()),
            false => Err(CoordinatorError::IllegalGeneration),
        };
    }
    if who.version < 9 {
        return Err(CoordinatorError::UnsupportedVersion(
            "OffsetCommit version 9 or above must be used by members using the consumer group protocol".into(),
        ));
    }
    if who.generation != m.epoch {
        return Err(CoordinatorError::StaleMemberEpoch);
    }
    Ok(())
}

/// Offsets of an empty group past retention (KIP-211: counted from when the
/// group became empty; for groups that never had members, from the commit).
fn expire(g: &mut Group, now_ms: i64, retention_ms: i64) -> Vec<(RecordKey, Option<Bytes>)> {
    let since_empty = match (&g.consumer, &g.streams) {
        (Some(cg), _) => Some(cg.empty_since_ms),
        (_, Some(sg)) => Some(sg.empty_since_ms),
        _ => g.protocol_type.is_some().then_some(g.state_since_ms),
    };
    let gone: Vec<(String, i32)> = g
        .offsets
        .iter()
        .filter(|(_, v)| since_empty.unwrap_or(v.commit_timestamp) + retention_ms <= now_ms)
        .map(|(k, _)| k.clone())
        .collect();
    gone.into_iter()
        .map(|(t, p)| {
            g.offsets.remove(&(t.clone(), p));
            (
                RecordKey::Offset {
                    group: g.id.clone(),
                    topic: t,
                    partition: p,
                },
                None,
            )
        })
        .collect()
}

async fn resolve<T>(pending: Pending<T>) -> Result<T, CoordinatorError> {
    match pending {
        Pending::Ready(r) => r,
        Pending::Wait(rx) => rx
            .await
            .unwrap_or(Err(CoordinatorError::RebalanceInProgress)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{ManualClock, SeededRandom};

    fn offset(ts: i64) -> OffsetValue {
        OffsetValue {
            offset: 1,
            leader_epoch: -1,
            metadata: String::new(),
            commit_timestamp: ts,
        }
    }

    #[test]
    fn offsets_of_empty_groups_expire_after_retention() {
        // A group that had members: retention counts from when it became empty.
        let mut g = Group::new("g", 1_000);
        g.protocol_type = Some("consumer".into());
        g.offsets.insert(("t".into(), 0), offset(0));
        assert!(expire(&mut g, 1_500, 1_000).is_empty());
        assert_eq!(expire(&mut g, 2_000, 1_000).len(), 1);
        assert!(g.offsets.is_empty());
        // A standalone committer: each offset counts from its own commit.
        let mut g = Group::new("s", 0);
        g.offsets.insert(("t".into(), 0), offset(100));
        g.offsets.insert(("t".into(), 1), offset(900));
        let gone = expire(&mut g, 1_200, 1_000);
        assert_eq!(gone.len(), 1);
        assert_eq!(g.offsets.len(), 1);
    }

    /// A coordinator over a fresh data directory with one topic `t`, living by `clock`.
    async fn coordinator(
        dir: &std::path::Path,
        clock: Arc<ManualClock>,
        offsets_retention: Duration,
    ) -> GroupCoordinator {
        let catalog = Arc::new(Catalog::open(dir, Default::default()).unwrap());
        catalog.create_topic("t", 1, 1, &[]).unwrap();
        let config = CoordinatorConfig {
            initial_rebalance_delay: Duration::ZERO,
            min_session_timeout: Duration::from_secs(1),
            max_session_timeout: Duration::from_secs(300),
            offsets_retention,
            max_metadata_bytes: 4096,
            offsets_topic_segment_bytes: 1 << 20,
            wait_for_fsync: false,
            consumer: Default::default(),
            streams: Default::default(),
            share: Default::default(),
        };
        let store = OffsetsStore::open(&catalog, &config, clock.clone()).unwrap();
        let random = Arc::new(SeededRandom::new(1));
        GroupCoordinator::open(catalog, store, config, clock, random, None)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_refused_first_heartbeat_leaves_no_group_behind() {
        use streams_records::{Subtopology, TopicInfo, Topology};
        let dir = tempfile::tempdir().unwrap();
        let c = coordinator(dir.path(), ManualClock::new(0), Duration::from_secs(60)).await;
        // A repartition topic nobody writes: STREAMS_INVALID_TOPOLOGY.
        let topology = Topology {
            epoch: 0,
            subtopologies: vec![Subtopology {
                id: "0".into(),
                repartition_source_topics: vec![TopicInfo {
                    name: "orphan-repartition".into(),
                    ..TopicInfo::default()
                }],
                ..Subtopology::default()
            }],
        };
        let join = streams::HeartbeatParams {
            member_id: "m".into(),
            rebalance_timeout_ms: 1000,
            topology: Some(topology),
            owned: Some(Default::default()),
            ..Default::default()
        };
        let refused = c.streams_heartbeat("g", join).await;
        assert!(matches!(
            refused,
            Err(CoordinatorError::StreamsInvalidTopology(_))
        ));
        assert!(c.list().is_empty(), "a group is left");
        let bad_assignor = HeartbeatParams {
            member_id: "m".into(),
            rebalance_timeout_ms: 1000,
            subscribed_topic_names: Some(vec!["t".into()]),
            server_assignor: Some("nope".into()),
            owned: Some(Vec::new()),
            ..Default::default()
        };
        assert!(c.consumer_heartbeat("h", bad_assignor, 1).await.is_err());
        assert!(c.list().is_empty(), "a group is left");
    }

    fn committed(c: &GroupCoordinator) -> Option<i64> {
        let fetched = c.fetch_offsets("g", Some(vec![("t".to_string(), vec![0])]));
        fetched[0].1[0].1.as_ref().map(|v| v.offset)
    }

    #[tokio::test]
    async fn a_classic_groups_offsets_stay_when_it_moves_to_the_consumer_protocol_and_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let c = coordinator(dir.path(), clock.clone(), Duration::from_secs(3600)).await;
        let id = classic_member_with_commit(&c, 5).await;
        c.leave("g", &[(id, None)]).unwrap();
        // A consumer-protocol member takes the empty classic group over.
        let joined = c
            .consumer_heartbeat(
                "g",
                HeartbeatParams {
                    member_id: "m1".into(),
                    member_epoch: 0,
                    rebalance_timeout_ms: 10_000,
                    subscribed_topic_names: Some(vec!["t".into()]),
                    owned: Some(vec![]),
                    ..Default::default()
                },
                1,
            )
            .await
            .unwrap();
        assert_eq!(joined.member_epoch, 1);
        assert_eq!(committed(&c), Some(5));
        // After a restart (replay of __consumer_offsets) it is still a
        // consumer group with its member, and the offset is still there.
        drop(c);
        let c = reopen(dir.path(), clock.clone()).await;
        assert_eq!(committed(&c), Some(5));
        let d = c.consumer_describe("g").unwrap();
        assert_eq!((d.epoch, d.members.len(), d.members[0].epoch), (1, 1, 1));
        assert_eq!(c.list()[0].group_type, "consumer");
        // The member commits with its epoch; an older epoch is stale.
        let commit = |generation: i32| Committer {
            member_id: "m1".into(),
            instance_id: None,
            generation,
            version: 9,
        };
        let offset = |o: i64| OffsetCommit {
            topic: "t".into(),
            partition: 0,
            offset: o,
            leader_epoch: -1,
            metadata: None,
        };
        c.commit("g", &commit(1), vec![offset(7)]).await.unwrap();
        assert_eq!(committed(&c), Some(7));
        assert_eq!(
            c.commit("g", &commit(0), vec![offset(8)]).await.err(),
            Some(CoordinatorError::StaleMemberEpoch)
        );
    }

    /// A coordinator over an existing data directory.
    async fn reopen(dir: &std::path::Path, clock: Arc<ManualClock>) -> GroupCoordinator {
        let catalog = Arc::new(Catalog::open(dir, Default::default()).unwrap());
        let config = CoordinatorConfig {
            initial_rebalance_delay: Duration::ZERO,
            min_session_timeout: Duration::from_secs(1),
            max_session_timeout: Duration::from_secs(300),
            offsets_retention: Duration::from_secs(3600),
            max_metadata_bytes: 4096,
            offsets_topic_segment_bytes: 1 << 20,
            wait_for_fsync: false,
            consumer: Default::default(),
            streams: Default::default(),
            share: Default::default(),
        };
        let store = OffsetsStore::open(&catalog, &config, clock.clone()).unwrap();
        let random = Arc::new(SeededRandom::new(2));
        GroupCoordinator::open(catalog, store, config, clock, random, None)
            .await
            .unwrap()
    }

    /// A classic member of "g" that committed `offset` for t-0.
    async fn classic_member_with_commit(c: &GroupCoordinator, offset: i64) -> String {
        let joined = c
            .join(
                "g",
                JoinParams {
                    member_id: String::new(),
                    instance_id: None,
                    client_id: "client".to_string(),
                    client_host: "/127.0.0.1".to_string(),
                    session_timeout: Duration::from_secs(10),
                    rebalance_timeout: Duration::from_secs(10),
                    protocol_type: "consumer".to_string(),
                    protocols: vec![("range".to_string(), Bytes::new())],
                    require_known_member_id: false,
                },
            )
            .await
            .unwrap();
        let id = joined.member_id;
        c.sync(
            "g",
            &id,
            None,
            1,
            None,
            None,
            vec![(id.clone(), Bytes::new())],
        )
        .await
        .unwrap();
        let who = Committer {
            member_id: id.clone(),
            instance_id: None,
            generation: 1,
            version: 8,
        };
        let o = OffsetCommit {
            topic: "t".to_string(),
            partition: 0,
            offset,
            leader_epoch: -1,
            metadata: None,
        };
        c.commit("g", &who, vec![o]).await.unwrap();
        id
    }

    #[tokio::test]
    async fn offsets_of_a_group_left_empty_expire_once_retention_passes() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let retention = Duration::from_secs(60);
        let c = coordinator(dir.path(), clock.clone(), retention).await;
        let joined = c
            .join(
                "g",
                JoinParams {
                    member_id: String::new(),
                    instance_id: None,
                    client_id: "client".to_string(),
                    client_host: "/127.0.0.1".to_string(),
                    session_timeout: Duration::from_secs(10),
                    rebalance_timeout: Duration::from_secs(10),
                    protocol_type: "consumer".to_string(),
                    protocols: vec![("range".to_string(), Bytes::new())],
                    require_known_member_id: false,
                },
            )
            .await
            .unwrap();
        let id = joined.member_id;
        c.sync(
            "g",
            &id,
            None,
            1,
            None,
            None,
            vec![(id.clone(), Bytes::new())],
        )
        .await
        .unwrap();
        let who = Committer {
            member_id: id.clone(),
            instance_id: None,
            generation: 1,
            version: 8,
        };
        let offset = OffsetCommit {
            topic: "t".to_string(),
            partition: 0,
            offset: 5,
            leader_epoch: -1,
            metadata: None,
        };
        c.commit("g", &who, vec![offset]).await.unwrap();
        // Retention counts from when the last member left, not from the commit.
        clock.advance(Duration::from_secs(30));
        c.leave("g", &[(id, None)]).unwrap();
        assert_eq!(c.describe("g").unwrap().state, "Empty");
        clock.advance(retention - Duration::from_secs(1));
        c.tick(true);
        assert_eq!(committed(&c), Some(5));
        clock.advance(Duration::from_secs(1));
        c.tick(false);
        assert_eq!(committed(&c), Some(5), "expired without being asked to");
        c.tick(true);
        assert_eq!(committed(&c), None);
    }
}
