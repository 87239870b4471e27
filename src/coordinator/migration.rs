//! Online migration between the classic and the consumer group protocol
//! (KIP-848), as Kafka 4 does it.
//!
//! A group changes protocol without stopping: the first consumer-protocol
//! member to join a classic group whose members all embed the `consumer`
//! protocol converts it (upgrade), keeping every member's partitions at an
//! epoch equal to the old generation, so nothing is consumed twice; the
//! classic members stay on as classic members of the consumer group
//! (`consumer::ClassicJoined` and around). When the last consumer-protocol
//! member leaves a group that still has classic members, it converts back
//! (downgrade) and rebalances under the classic protocol. Each conversion
//! writes the old kind's tombstones, then the new kind's records, so a replay
//! of `__consumer_offsets` ends in the same group. Which directions are
//! allowed is `group.consumer.migration.policy`; empty groups switch freely.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::consumer_protocol_assignment::TopicPartition as AssignedPartition;
use kafka_protocol::messages::{
    ConsumerProtocolAssignment, ConsumerProtocolSubscription, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

use super::assignor::Assignment;
use super::consumer::{ConsumerGroup, Records, Topics};
use super::group::Group;
use super::records::RecordKey;
use super::{CoordinatorConfig, CoordinatorError};

/// The protocol type of the consumer's embedded protocol.
pub(crate) const CONSUMER_PROTOCOL_TYPE: &str = "consumer";

/// group.consumer.migration.policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MigrationPolicy {
    #[default]
    Bidirectional,
    Upgrade,
    Downgrade,
    Disabled,
}

impl MigrationPolicy {
    pub fn upgrade_enabled(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Bidirectional | MigrationPolicy::Upgrade
        )
    }

    pub fn downgrade_enabled(self) -> bool {
        matches!(
            self,
            MigrationPolicy::Bidirectional | MigrationPolicy::Downgrade
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            MigrationPolicy::Bidirectional => "bidirectional",
            MigrationPolicy::Upgrade => "upgrade",
            MigrationPolicy::Downgrade => "downgrade",
            MigrationPolicy::Disabled => "disabled",
        }
    }

    /// Kafka accepts the names in any case.
    pub fn parse(value: &str) -> Result<MigrationPolicy, String> {
        [
            MigrationPolicy::Bidirectional,
            MigrationPolicy::Upgrade,
            MigrationPolicy::Downgrade,
            MigrationPolicy::Disabled,
        ]
        .into_iter()
        .find(|p| p.name().eq_ignore_ascii_case(value.trim()))
        .ok_or_else(|| {
            format!(
                "unknown migration policy {value:?}: bidirectional, upgrade, downgrade or disabled"
            )
        })
    }
}

/// The version a piece of embedded-protocol metadata starts with.
pub(crate) fn protocol_version(metadata: &[u8]) -> i16 {
    match metadata {
        [a, b, ..] => i16::from_be_bytes([*a, *b]),
        _ => 0,
    }
}

/// A classic member's subscription (`None`: not the consumer protocol's).
pub(crate) fn decode_subscription(mut metadata: &[u8]) -> Option<ConsumerProtocolSubscription> {
    if metadata.len() < 2 {
        return None;
    }
    let version = metadata.get_i16();
    let mut buf = Bytes::copy_from_slice(metadata);
    ConsumerProtocolSubscription::decode(&mut buf, version.clamp(0, 3)).ok()
}

/// A classic member's assignment: partitions by topic name. Empty bytes (a
/// member that never synced) are no partitions.
pub(crate) fn decode_assignment(mut bytes: &[u8]) -> Option<Vec<(String, Vec<i32>)>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    if bytes.len() < 2 {
        return None;
    }
    let version = bytes.get_i16();
    let mut buf = Bytes::copy_from_slice(bytes);
    let a = ConsumerProtocolAssignment::decode(&mut buf, version.clamp(0, 3)).ok()?;
    Some(
        a.assigned_partitions
            .into_iter()
            .map(|tp| (tp.topic.to_string(), tp.partitions))
            .collect(),
    )
}

/// Partitions by topic id as the embedded protocol's assignment, naming
/// the topics; at the version the member's subscription used.
pub(crate) fn encode_assignment(a: &Assignment, topics: &Topics, version: i16) -> Bytes {
    let version = version.clamp(0, 3);
    let partitions = a
        .iter()
        .filter(|(_, ps)| !ps.is_empty())
        .filter_map(|(id, ps)| {
            let (name, _) = topics.iter().find(|(_, t)| t.id == *id)?;
            Some(
                AssignedPartition::default()
                    .with_topic(TopicName(StrBytes::from_string(name.clone())))
                    .with_partitions(ps.iter().copied().collect()),
            )
        })
        .collect();
    let assignment = ConsumerProtocolAssignment::default().with_assigned_partitions(partitions);
    let mut b = BytesMut::new();
    b.put_i16(version);
    assignment
        .encode(&mut b, version)
        .expect("an assignment always encodes");
    b.freeze()
}

/// Converts a classic group with members into a consumer group, for a
/// consumer-protocol member about to join (Kafka's validateOnlineUpgrade
/// and convertToConsumerGroup). GROUP_ID_NOT_FOUND when the policy, the
/// group's protocol or its size forbid it, as Kafka answers.
pub(crate) fn upgrade(
    group: &mut Group,
    topics: &Topics,
    cfg: &CoordinatorConfig,
    now: std::time::Instant,
    now_ms: i64,
    records: &mut Records,
) -> Result<(), CoordinatorError> {
    let refuse = |why: &str| {
        tracing::info!(group = %group.id, "cannot upgrade the classic group: {why}");
        Err(CoordinatorError::GroupIdNotFound)
    };
    if !cfg.consumer.migration.upgrade_enabled() {
        return refuse("the online upgrade is disabled");
    }
    if group.protocol_type.as_deref() != Some(CONSUMER_PROTOCOL_TYPE) {
        return refuse("the group does not use the consumer embedded protocol");
    }
    if group.members().count() >= cfg.consumer.max_size {
        return refuse("the group size exceeds the consumer group maximum size");
    }
    let mut converted = vec![(
        RecordKey::Group {
            group: group.id.clone(),
        },
        None,
    )];
    let cg = ConsumerGroup::from_classic(group, topics, now, now_ms, &mut converted)?;
    tracing::info!(group = %group.id, epoch = cg.epoch, "classic group upgraded to a consumer group");
    group.fail_waiters();
    let offsets = std::mem::take(&mut group.offsets);
    *group = Group::new(&group.id, now_ms);
    group.offsets = offsets;
    group.consumer = Some(cg);
    records.extend(converted);
    Ok(())
}

/// Before the `leaving` members are removed from a consumer group: if only
/// classic members would remain and the policy allows, the group becomes a
/// classic group of them instead, at the same epoch, and rebalances (Kafka's
/// validateOnlineDowngradeWithFencedMembers and convertToClassicGroup).
/// Returns whether it did; if not, the caller removes the members.
pub(crate) fn downgrade_without(
    group: &mut Group,
    leaving: &[String],
    topics: &Topics,
    cfg: &CoordinatorConfig,
    now: std::time::Instant,
    now_ms: i64,
    records: &mut Records,
) -> bool {
    let Some(cg) = &group.consumer else {
        return false;
    };
    if leaving.is_empty()
        || !cg.only_classic_members_without(leaving)
        || !cfg.consumer.migration.downgrade_enabled()
    {
        return false;
    }
    records.extend(cg.all_tombstones());
    let mut classic = Group::from_consumer(cg, leaving, topics, now, now_ms, cfg);
    classic.offsets = std::mem::take(&mut group.offsets);
    records.push((
        RecordKey::Group {
            group: classic.id.clone(),
        },
        Some(classic.to_value().encode()),
    ));
    classic.dirty = false;
    tracing::info!(group = %classic.id, generation = classic.generation, "consumer group downgraded to a classic group");
    *group = classic;
    true
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use kafka_protocol::messages::ConsumerProtocolSubscription;

    use super::*;
    use crate::catalog::Catalog;
    use crate::clock::{ManualClock, SeededRandom};
    use crate::coordinator::consumer::{HeartbeatParams, LEAVE_EPOCH};
    use crate::coordinator::group::JoinParams;
    use crate::coordinator::store::OffsetsStore;
    use crate::coordinator::{Committer, GroupCoordinator, OffsetCommit};

    /// A coordinator over `dir` (topic `t` with 4 partitions is created
    /// once) with the given policy.
    async fn coordinator(
        dir: &std::path::Path,
        clock: Arc<ManualClock>,
        policy: MigrationPolicy,
    ) -> GroupCoordinator {
        let catalog = Arc::new(Catalog::open(dir, Default::default()).unwrap());
        if catalog.topic("t").is_none() {
            catalog.create_topic("t", 4, 1, &[]).unwrap();
        }
        let mut config = CoordinatorConfig {
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
        config.consumer.migration = policy;
        let store = OffsetsStore::open(&catalog, &config, clock.clone()).unwrap();
        GroupCoordinator::open(
            catalog,
            store,
            config,
            clock,
            Arc::new(SeededRandom::new(7)),
            None,
        )
        .await
        .unwrap()
    }

    fn subscription(owned: &[i32]) -> Bytes {
        use kafka_protocol::messages::consumer_protocol_subscription::TopicPartition;
        let s = ConsumerProtocolSubscription::default()
            .with_topics(vec![StrBytes::from_static_str("t")])
            .with_owned_partitions(if owned.is_empty() {
                vec![]
            } else {
                vec![TopicPartition::default()
                    .with_topic(TopicName(StrBytes::from_static_str("t")))
                    .with_partitions(owned.to_vec())]
            });
        let mut b = BytesMut::new();
        b.put_i16(1);
        s.encode(&mut b, 1).unwrap();
        b.freeze()
    }

    fn join_params(member_id: &str, owned: &[i32]) -> JoinParams {
        JoinParams {
            member_id: member_id.to_string(),
            instance_id: None,
            client_id: "classic".to_string(),
            client_host: "/127.0.0.1".to_string(),
            session_timeout: Duration::from_secs(10),
            rebalance_timeout: Duration::from_secs(10),
            protocol_type: CONSUMER_PROTOCOL_TYPE.to_string(),
            protocols: vec![("range".to_string(), subscription(owned))],
            require_known_member_id: false,
        }
    }

    fn partitions(assignment: &Bytes) -> Vec<i32> {
        let mut ps: Vec<i32> = decode_assignment(assignment)
            .unwrap()
            .into_iter()
            .flat_map(|(_, ps)| ps)
            .collect();
        ps.sort();
        ps
    }

    fn consumer_join(member_id: &str) -> HeartbeatParams {
        HeartbeatParams {
            member_id: member_id.into(),
            member_epoch: 0,
            rebalance_timeout_ms: 10_000,
            subscribed_topic_names: Some(vec!["t".into()]),
            owned: Some(vec![]),
            ..Default::default()
        }
    }

    fn consumer_beat(
        member_id: &str,
        epoch: i32,
        owned: &[i32],
        id: uuid::Uuid,
    ) -> HeartbeatParams {
        HeartbeatParams {
            member_id: member_id.into(),
            member_epoch: epoch,
            rebalance_timeout_ms: -1,
            owned: Some(vec![(id, owned.to_vec())]),
            ..Default::default()
        }
    }

    /// A classic member that joined an empty group, got all of `t` from its
    /// own (leader) SyncGroup and committed offset 5 on t-0: (member id, generation).
    async fn stable_classic_member(c: &GroupCoordinator) -> (String, i32) {
        let joined = c.join("g", join_params("", &[])).await.unwrap();
        let id = joined.member_id;
        let everything = encode_assignment(
            &[(c.topics()["t"].id, (0..4).collect())]
                .into_iter()
                .collect(),
            &c.topics(),
            1,
        );
        let synced = c
            .sync(
                "g",
                &id,
                None,
                joined.generation,
                None,
                None,
                vec![(id.clone(), everything)],
            )
            .await
            .unwrap();
        assert_eq!(partitions(&synced.assignment), [0, 1, 2, 3]);
        let who = Committer {
            member_id: id.clone(),
            instance_id: None,
            generation: joined.generation,
            version: 8,
        };
        let offset = OffsetCommit {
            topic: "t".into(),
            partition: 0,
            offset: 5,
            leader_epoch: -1,
            metadata: None,
        };
        c.commit("g", &who, vec![offset]).await.unwrap();
        (id, joined.generation)
    }

    fn committed(c: &GroupCoordinator) -> Option<i64> {
        let fetched = c.fetch_offsets("g", Some(vec![("t".to_string(), vec![0])]));
        fetched[0].1[0].1.as_ref().map(|v| v.offset)
    }

    #[tokio::test]
    async fn a_consumer_member_upgrades_a_classic_group_and_partitions_move_without_two_owners() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Bidirectional).await;
        let topic = c.topics()["t"].id;
        let (a, generation) = stable_classic_member(&c).await;
        // The consumer-protocol member converts the group; a still owns
        // everything, so b waits for its share.
        let b = c
            .consumer_heartbeat("g", consumer_join("b"), 1)
            .await
            .unwrap();
        assert_eq!(b.member_epoch, generation + 1);
        assert_eq!(b.assignment.as_ref().map(|a| a.len()), Some(0));
        assert_eq!(c.list()[0].group_type, "consumer");
        assert_eq!(committed(&c), Some(5), "offsets survive the upgrade");
        // a is told to rejoin; it revoked everything (eager) and gets its half.
        assert_eq!(
            c.heartbeat("g", &a, None, generation),
            Err(CoordinatorError::RebalanceInProgress)
        );
        let rejoined = c.join("g", join_params(&a, &[])).await.unwrap();
        assert_eq!(
            (rejoined.member_id.as_str(), rejoined.generation),
            (a.as_str(), generation + 1)
        );
        assert!(rejoined.leader.is_empty() && rejoined.members.is_empty());
        let synced = c
            .sync(
                "g",
                &a,
                None,
                rejoined.generation,
                Some("consumer"),
                Some("range"),
                vec![],
            )
            .await
            .unwrap();
        let a_parts = partitions(&synced.assignment);
        assert_eq!(a_parts.len(), 2);
        c.heartbeat("g", &a, None, rejoined.generation).unwrap();
        // Now b gets the other half.
        let b = c
            .consumer_heartbeat("g", consumer_beat("b", b.member_epoch, &[], topic), 1)
            .await
            .unwrap();
        let b_parts: Vec<i32> = b.assignment.unwrap()[&topic].iter().copied().collect();
        assert_eq!(b_parts.len(), 2);
        assert!(b_parts.iter().all(|p| !a_parts.contains(p)));
        let d = c.consumer_describe("g").unwrap();
        assert_eq!(d.members.len(), 2);
        assert!(d.members.iter().any(|m| m.classic && m.member_id == a));
        assert!(d.members.iter().any(|m| !m.classic && m.member_id == "b"));
        // The classic member commits with its generation, as before.
        let who = Committer {
            member_id: a.clone(),
            instance_id: None,
            generation: rejoined.generation,
            version: 8,
        };
        let offset = |o| OffsetCommit {
            topic: "t".into(),
            partition: a_parts[0],
            offset: o,
            leader_epoch: -1,
            metadata: None,
        };
        c.commit("g", &who, vec![offset(9)]).await.unwrap();
        let stale = Committer { generation, ..who };
        assert_eq!(
            c.commit("g", &stale, vec![offset(10)]).await.err(),
            Some(CoordinatorError::IllegalGeneration)
        );
        // After a restart (replay of __consumer_offsets) the mixed group is
        // the same, and both members carry on without rejoining.
        drop(c);
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Bidirectional).await;
        let d = c.consumer_describe("g").unwrap();
        assert_eq!(d.members.len(), 2);
        assert!(d.members.iter().any(|m| m.classic && m.member_id == a));
        c.heartbeat("g", &a, None, rejoined.generation).unwrap();
        let synced = c
            .sync("g", &a, None, rejoined.generation, None, None, vec![])
            .await
            .unwrap();
        assert_eq!(partitions(&synced.assignment), a_parts);
        let again = c
            .consumer_heartbeat("g", consumer_beat("b", b.member_epoch, &b_parts, topic), 1)
            .await
            .unwrap();
        assert_eq!(again.member_epoch, b.member_epoch);
        let fetched = c.fetch_offsets("g", Some(vec![("t".to_string(), vec![a_parts[0]])]));
        assert_eq!(fetched[0].1[0].1.as_ref().map(|v| v.offset), Some(9));
    }

    #[tokio::test]
    async fn the_last_consumer_member_leaving_downgrades_the_group_and_it_rebalances() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Bidirectional).await;
        // b first: a consumer group, which a classic member then joins.
        let b = c
            .consumer_heartbeat("g", consumer_join("b"), 1)
            .await
            .unwrap();
        let a = c.join("g", join_params("", &[])).await.unwrap();
        assert_eq!(c.list()[0].group_type, "consumer");
        let leave = HeartbeatParams {
            member_id: "b".into(),
            member_epoch: LEAVE_EPOCH,
            rebalance_timeout_ms: -1,
            ..Default::default()
        };
        assert_eq!(b.member_epoch, 1);
        c.consumer_heartbeat("g", leave, 1).await.unwrap();
        // A classic group again, rebalancing, with a as its only member.
        assert_eq!(c.list()[0].group_type, "classic");
        let d = c.describe("g").unwrap();
        assert_eq!(d.state, "PreparingRebalance");
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].member_id, a.member_id);
        // At the epoch it had: the classic member is told to rejoin, not fenced.
        assert_eq!(
            c.heartbeat("g", &a.member_id, None, a.generation),
            Err(CoordinatorError::RebalanceInProgress)
        );
        let rejoined = c.join("g", join_params(&a.member_id, &[])).await.unwrap();
        assert_eq!(rejoined.leader, a.member_id, "a leads the classic group");
        assert!(rejoined.generation > a.generation);
        // Replayed after a restart: a classic group, no consumer records left.
        drop(c);
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Bidirectional).await;
        assert_eq!(c.list()[0].group_type, "classic");
        assert_eq!(
            c.consumer_describe("g").err(),
            Some(CoordinatorError::GroupIdNotFound)
        );
        assert_eq!(c.describe("g").unwrap().members.len(), 1);
    }

    #[tokio::test]
    async fn the_migration_policy_refuses_the_directions_it_disables() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Downgrade).await;
        stable_classic_member(&c).await;
        assert_eq!(
            c.consumer_heartbeat("g", consumer_join("b"), 1).await.err(),
            Some(CoordinatorError::GroupIdNotFound)
        );
        assert_eq!(c.list()[0].group_type, "classic");
        drop(c);

        let dir = tempfile::tempdir().unwrap();
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Upgrade).await;
        c.consumer_heartbeat("g", consumer_join("b"), 1)
            .await
            .unwrap();
        let a = c.join("g", join_params("", &[])).await.unwrap();
        // A classic member of another protocol type cannot join at all.
        let mut connect = join_params("", &[]);
        connect.protocol_type = "connect".into();
        assert_eq!(
            c.join("g", connect).await.err(),
            Some(CoordinatorError::InconsistentGroupProtocol)
        );
        let leave = HeartbeatParams {
            member_id: "b".into(),
            member_epoch: LEAVE_EPOCH,
            rebalance_timeout_ms: -1,
            ..Default::default()
        };
        c.consumer_heartbeat("g", leave, 1).await.unwrap();
        // No downgrade: a consumer group with one classic member.
        assert_eq!(c.list()[0].group_type, "consumer");
        let d = c.consumer_describe("g").unwrap();
        assert_eq!(d.members.len(), 1);
        assert!(d.members[0].classic && d.members[0].member_id == a.member_id);
    }

    #[tokio::test]
    async fn a_classic_member_whose_session_lapses_is_removed_from_the_consumer_group() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(1_700_000_000_000);
        let c = coordinator(dir.path(), clock.clone(), MigrationPolicy::Bidirectional).await;
        let b = c
            .consumer_heartbeat("g", consumer_join("b"), 1)
            .await
            .unwrap();
        c.join("g", join_params("", &[])).await.unwrap();
        assert_eq!(c.consumer_describe("g").unwrap().members.len(), 2);
        // b keeps heartbeating; the classic member's 10 s session lapses.
        let topic = c.topics()["t"].id;
        let mut owned: Vec<i32> = Vec::new();
        let mut epoch = b.member_epoch;
        for _ in 0..3 {
            clock.advance(Duration::from_secs(4));
            let r = c
                .consumer_heartbeat("g", consumer_beat("b", epoch, &owned, topic), 1)
                .await
                .unwrap();
            epoch = r.member_epoch;
            if let Some(a) = r.assignment {
                owned = a
                    .get(&topic)
                    .map(|s| s.iter().copied().collect())
                    .unwrap_or_default();
            }
            c.tick(false);
        }
        let d = c.consumer_describe("g").unwrap();
        assert_eq!(d.members.len(), 1);
        assert_eq!(d.members[0].member_id, "b");
    }
}
