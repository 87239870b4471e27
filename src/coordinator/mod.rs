//! The group coordinator: consumer groups under Kafka's classic protocol and
//! their committed offsets.
//!
//! This single broker coordinates every group. All group state sits behind
//! one lock and changes synchronously; members that must wait for others
//! (JoinGroup, SyncGroup) hold a oneshot receiver that a later request or the
//! timer completes. Every change worth keeping is appended to
//! `__consumer_offsets` before it is acknowledged, and startup replays that
//! topic, so offsets and group membership survive restarts, kill -9 included.

pub mod group;
pub mod records;
pub mod store;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::catalog::Catalog;
use crate::clock::{SharedClock, SharedRandom};
use crate::log::LogError;
use group::{Group, GroupState, JoinParams, JoinReply, Pending, SyncReply};
use records::{GroupValue, OffsetValue, RecordKey};
use store::OffsetsStore;

#[derive(Debug, Clone, thiserror::Error)]
pub enum CoordinatorError {
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
}

impl From<LogError> for CoordinatorError {
    fn from(e: LogError) -> Self {
        CoordinatorError::Storage(e.to_string())
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
}

/// One committed offset to store.
#[derive(Debug, Clone)]
pub struct OffsetCommit {
    pub topic: String,
    pub partition: i32,
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: Option<String>,
}

/// Who is committing: a group member, or (generation -1, empty member id)
/// a client managing its own assignment.
#[derive(Debug, Clone)]
pub struct Committer {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub generation: i32,
}

pub struct GroupListing {
    pub group_id: String,
    pub protocol_type: String,
    pub state: &'static str,
}

pub struct MemberDescription {
    pub member_id: String,
    pub instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub metadata: Bytes,
    pub assignment: Bytes,
}

pub struct GroupDescription {
    pub state: &'static str,
    pub protocol_type: String,
    pub protocol: String,
    pub members: Vec<MemberDescription>,
}

pub type PartitionResult = ((String, i32), Result<(), CoordinatorError>);

/// Committed offsets by topic, then partition (`None`: nothing committed).
pub type TopicOffsets = Vec<(String, Vec<(i32, Option<OffsetValue>)>)>;

pub struct GroupCoordinator {
    catalog: Arc<Catalog>,
    store: OffsetsStore,
    groups: Mutex<HashMap<String, Group>>,
    config: CoordinatorConfig,
    clock: SharedClock,
    /// Draws member ids.
    random: SharedRandom,
    active: std::sync::OnceLock<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl GroupCoordinator {
    /// Rebuilds every group from the offsets topic (see `OffsetsStore::open`).
    pub async fn open(
        catalog: Arc<Catalog>,
        store: OffsetsStore,
        config: CoordinatorConfig,
        clock: SharedClock,
        random: SharedRandom,
    ) -> Result<GroupCoordinator, LogError> {
        let groups = load(&store, clock.now()).await?;
        tracing::info!(groups = groups.len(), "group coordinator loaded");
        Ok(GroupCoordinator {
            active: std::sync::OnceLock::new(),
            catalog,
            store,
            groups: Mutex::new(groups),
            config,
            clock,
            random,
        })
    }

    /// Reads the group state again from the offsets topic (cluster mode: after
    /// taking its partition over, whose log may have moved on elsewhere).
    /// Members waiting for a rebalance are dropped; they rejoin.
    pub async fn reload(&self) -> Result<(), LogError> {
        let groups = load(&self.store, self.clock.now()).await?;
        tracing::info!(groups = groups.len(), "group coordinator reloaded");
        *self.groups.lock() = groups;
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

    /// Cluster mode: the coordinator answers only while `active` says this
    /// broker serves the offsets topic (set once).
    pub fn set_active(&self, active: Arc<dyn Fn() -> bool + Send + Sync>) {
        let _ = self.active.set(active);
    }

    fn check_active(&self) -> Result<(), CoordinatorError> {
        match self.active.get() {
            Some(active) if !active() => Err(CoordinatorError::NotCoordinator),
            _ => Ok(()),
        }
    }

    pub async fn join(&self, group_id: &str, params: JoinParams) -> JoinReply {
        self.check_active()?;
        if group_id.is_empty() {
            return Err(CoordinatorError::InvalidGroupId);
        }
        if params.session_timeout < self.config.min_session_timeout
            || params.session_timeout > self.config.max_session_timeout
        {
            return Err(CoordinatorError::InvalidSessionTimeout);
        }
        let pending = {
            let mut groups = self.groups.lock();
            let group = groups
                .entry(group_id.to_string())
                .or_insert_with(|| Group::new(group_id, self.clock.now_ms()));
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
    pub async fn sync(
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

    pub fn heartbeat(
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
        group.heartbeat(member_id, instance_id, generation, self.clock.now())
    }

    /// LeaveGroup for each (member id, instance id); one result per member.
    pub fn leave(
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
        let results = members
            .iter()
            .map(|(m, i)| group.leave(m, i.as_deref(), now, now_ms, &self.config))
            .collect();
        self.persist_group(group);
        Ok(results)
    }

    /// OffsetCommit. The outer error applies to every partition.
    pub async fn commit(
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
                None => return Err(CoordinatorError::IllegalGeneration),
            };
            if simple {
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

    /// Committed offsets of a group: the named partitions, or all of them.
    pub fn fetch_offsets(
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

    pub fn list(&self) -> Vec<GroupListing> {
        let groups = self.groups.lock();
        let mut out: Vec<GroupListing> = groups
            .values()
            .map(|g| GroupListing {
                group_id: g.id.clone(),
                protocol_type: g.protocol_type.clone().unwrap_or_default(),
                state: g.state.name(),
            })
            .collect();
        out.sort_by(|a, b| a.group_id.cmp(&b.group_id));
        out
    }

    pub fn describe(&self, group_id: &str) -> Option<GroupDescription> {
        let groups = self.groups.lock();
        let g = groups.get(group_id)?;
        let protocol = g.protocol.clone().unwrap_or_default();
        let stable = g.state == GroupState::Stable;
        Some(GroupDescription {
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
    pub fn delete_group(&self, group_id: &str) -> Result<(), CoordinatorError> {
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
        records.push((
            RecordKey::Group {
                group: group_id.to_string(),
            },
            None,
        ));
        self.store.append(&records)?;
        groups.remove(group_id);
        Ok(())
    }

    /// OffsetDelete: refused for topics the group's members subscribe to.
    pub fn delete_offsets(
        &self,
        group_id: &str,
        partitions: Vec<(String, i32)>,
    ) -> Result<Vec<PartitionResult>, CoordinatorError> {
        let mut groups = self.groups.lock();
        let group = groups
            .get_mut(group_id)
            .ok_or(CoordinatorError::GroupIdNotFound)?;
        let subscribed = if group.has_members() {
            group.subscribed_topics()
        } else {
            Vec::new()
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
    pub fn forget_topic(&self, topic: &str) {
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
    pub fn tick(&self, expire_offsets: bool) {
        let (now, now_ms) = (self.clock.now(), self.clock.now_ms());
        let mut groups = self.groups.lock();
        let mut tombstones = Vec::new();
        for g in groups.values_mut() {
            g.tick(now, now_ms, &self.config);
            self.persist_group(g);
            if expire_offsets && g.state == GroupState::Empty {
                tombstones.extend(expire(
                    g,
                    now_ms,
                    self.config.offsets_retention.as_millis() as i64,
                ));
            }
        }
        let dead: Vec<String> = groups
            .values()
            .filter(|g| g.is_idle())
            .map(|g| g.id.clone())
            .collect();
        for id in dead {
            groups.remove(&id);
            tombstones.push((RecordKey::Group { group: id }, None));
        }
        if let Err(e) = self.store.append(&tombstones) {
            tracing::error!(error = %e, "could not write offset expirations");
        }
    }
}

/// Group state as the offsets topic holds it.
async fn load(store: &OffsetsStore, now: Instant) -> Result<HashMap<String, Group>, LogError> {
    let mut groups: HashMap<String, Group> = HashMap::new();
    store
        .replay(|key, value| match (key, value) {
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
            (RecordKey::Group { group }, None) => {
                groups.remove(&group);
            }
        })
        .await?;
    Ok(groups)
}

/// Offsets of an empty group past retention (KIP-211: counted from when the
/// group became empty; for groups that never had members, from the commit).
fn expire(g: &mut Group, now_ms: i64, retention_ms: i64) -> Vec<(RecordKey, Option<Bytes>)> {
    let since_empty = g.protocol_type.is_some().then_some(g.state_since_ms);
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
        let catalog = Arc::new(Catalog::open(dir).unwrap());
        catalog.create_topic("t", 1, 1, &[]).unwrap();
        let config = CoordinatorConfig {
            initial_rebalance_delay: Duration::ZERO,
            min_session_timeout: Duration::from_secs(1),
            max_session_timeout: Duration::from_secs(300),
            offsets_retention,
            max_metadata_bytes: 4096,
            offsets_topic_segment_bytes: 1 << 20,
            wait_for_fsync: false,
        };
        let store = OffsetsStore::open(&catalog, &config, clock.clone()).unwrap();
        let random = Arc::new(SeededRandom::new(1));
        GroupCoordinator::open(catalog, store, config, clock, random)
            .await
            .unwrap()
    }

    fn committed(c: &GroupCoordinator) -> Option<i64> {
        let fetched = c.fetch_offsets("g", Some(vec![("t".to_string(), vec![0])]));
        fetched[0].1[0].1.as_ref().map(|v| v.offset)
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
