//! Who leads which partition: a pure function from what the controller read to
//! what it should write.
//!
//! Keeping the decision free of I/O and clocks makes it testable exhaustively
//! and makes the controller loop dull: read, [`plan`], write if different.
//! Running it again on its own output changes nothing, so a controller that
//! crashes halfway and a successor that redoes the work agree.
//!
//! Rules, in order:
//! 1. A partition whose leader is live and has not released it keeps leader and
//!    epoch. A handover towards a broker that is gone is cancelled.
//! 2. A partition without a usable leader — new, leader dead, or leader
//!    released it — gets one: the handover target if it is live, otherwise the
//!    least loaded broker, a settled one (below) for a partition that had a
//!    leader. Epoch is the old one + 1, or 0 for a new partition.
//! 3. While the most loaded broker has two more partitions than the least
//!    loaded settled one, one partition moves between them, cheapest move first:
//!    re-placing a partition rule 2 just placed, cancelling a handover back
//!    towards its current leader, starting a handover, retargeting one.
//!    Load counts a partition in handover at its target, so moves already under
//!    way are not repeated, and each move fixes exactly one unit of imbalance:
//!    a joining broker takes only its fair share, and nothing else moves.
//!
//! Rule 3 only ever *starts* handovers for partitions with a live leader; the
//! leader and epoch change when the old leader's release arrives (rule 2).
//!
//! A broker is *settled* once it has been a member for a while (the
//! controller decides; see `controller`). Until then it gets new partitions
//! but neither failovers nor handovers, so that a broker restarting again and
//! again (a crash loop, a failing machine) does not take partitions down with
//! it each time; Kafka similarly waits for its periodic preferred-leader
//! election before leadership returns to a restarted broker.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::NodeId;

/// The leader of one partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionLeader {
    pub leader: NodeId,
    /// Kafka's leader epoch: bumped each time the leader changes.
    pub epoch: i32,
    /// Set while the controller waits for `leader` to release the partition
    /// so that this broker can take over.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handover_to: Option<NodeId>,
}

impl PartitionLeader {
    /// Where the partition is heading: the handover target, else the leader.
    pub fn destination(&self) -> NodeId {
        self.handover_to.unwrap_or(self.leader)
    }
}

/// Partition index → leader, for one topic.
pub type TopicAssignment = BTreeMap<i32, PartitionLeader>;
/// Topic id → its partitions' leaders.
pub type Assignment = BTreeMap<Uuid, TopicAssignment>;

/// A leader's promise that it stopped serving a partition at an epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ReleaseAck {
    pub topic: Uuid,
    pub partition: i32,
    pub leader: NodeId,
    pub epoch: i32,
}

/// The assignment the controller should write, given the live brokers (and
/// which of them are settled), every topic's partition count, the current
/// assignment and the releases received. Topics absent from `topics` are
/// absent from the result.
pub fn plan(
    live: &BTreeSet<NodeId>,
    settled: &BTreeSet<NodeId>,
    topics: &BTreeMap<Uuid, i32>,
    current: &Assignment,
    released: &BTreeSet<ReleaseAck>,
) -> Assignment {
    let mut next = Assignment::new();
    if live.is_empty() {
        // Nobody can lead; keep what is recorded for the topics that exist.
        for (topic, &count) in topics {
            if let Some(cur) = current.get(topic) {
                next.insert(*topic, cur.range(0..count).map(|(p, e)| (*p, *e)).collect());
            }
        }
        return next;
    }

    let mut load: BTreeMap<NodeId, usize> = live.iter().map(|n| (*n, 0)).collect();
    let mut orphans = Vec::new();
    for (topic, &count) in topics {
        let cur = current.get(topic);
        let out = next.entry(*topic).or_default();
        for partition in 0..count {
            let entry = cur.and_then(|c| c.get(&partition)).copied();
            match entry {
                Some(mut e)
                    if live.contains(&e.leader)
                        && !released.contains(&ReleaseAck {
                            topic: *topic,
                            partition,
                            leader: e.leader,
                            epoch: e.epoch,
                        }) =>
                {
                    if e.handover_to
                        .is_some_and(|t| t == e.leader || !live.contains(&t))
                    {
                        e.handover_to = None;
                    }
                    *load.get_mut(&e.destination()).expect("live") += 1;
                    out.insert(partition, e);
                }
                old => orphans.push((*topic, partition, old)),
            }
        }
    }

    let mut placed = BTreeSet::new();
    for (topic, partition, old) in orphans {
        let leader = old
            .and_then(|e| e.handover_to)
            .filter(|t| live.contains(t))
            .unwrap_or_else(|| {
                // Spread the topic first, as Kafka spreads a topic's replicas.
                let spread = topic_spread(&next[&topic], live);
                let failover = old.is_some() && load.keys().any(|n| settled.contains(n));
                *load
                    .iter()
                    .filter(|(n, _)| !failover || settled.contains(*n))
                    .min_by_key(|(n, l)| (spread[*n], **l, **n))
                    .expect("live is not empty")
                    .0
            });
        let epoch = old.map_or(0, |e| e.epoch + 1);
        *load.get_mut(&leader).expect("live") += 1;
        next.get_mut(&topic).expect("inserted above").insert(
            partition,
            PartitionLeader {
                leader,
                epoch,
                handover_to: None,
            },
        );
        placed.insert((topic, partition));
    }

    loop {
        let (&src, &most) = load
            .iter()
            .max_by_key(|(n, l)| (**l, **n))
            .expect("live is not empty");
        let Some(dst) = least_loaded(&load, settled) else {
            break;
        };
        if most - load[&dst] <= 1 {
            break;
        }
        move_one(&mut next, &placed, src, dst);
        *load.get_mut(&src).expect("live") -= 1;
        *load.get_mut(&dst).expect("live") += 1;
    }
    next
}

/// Least loaded settled broker, the smallest id among equals.
fn least_loaded(load: &BTreeMap<NodeId, usize>, settled: &BTreeSet<NodeId>) -> Option<NodeId> {
    load.iter()
        .filter(|(n, _)| settled.contains(*n))
        .min_by_key(|(n, l)| (**l, **n))
        .map(|(n, _)| *n)
}

/// How many partitions of one topic head to each live broker.
fn topic_spread(parts: &TopicAssignment, live: &BTreeSet<NodeId>) -> BTreeMap<NodeId, usize> {
    let mut spread: BTreeMap<NodeId, usize> = live.iter().map(|n| (*n, 0)).collect();
    for e in parts.values() {
        if let Some(c) = spread.get_mut(&e.destination()) {
            *c += 1;
        }
    }
    spread
}

/// Moves one partition heading to `src` so that it heads to `dst`, choosing
/// the cheapest kind of move available (see the module docs) among the moves
/// that keep each topic spread: a partition moves only from a broker with more
/// of its topic than `dst` has, unless no such partition is left.
fn move_one(next: &mut Assignment, placed: &BTreeSet<(Uuid, i32)>, src: NodeId, dst: NodeId) {
    let rank = |topic: &Uuid, partition: &i32, e: &PartitionLeader| -> Option<u8> {
        if e.destination() != src {
            return None;
        }
        Some(if placed.contains(&(*topic, *partition)) {
            0
        } else if e.leader == dst {
            1
        } else if e.handover_to.is_none() {
            2
        } else {
            3
        })
    };
    let mut best: Option<((bool, u8), Uuid, i32)> = None;
    for (topic, parts) in next.iter() {
        let count = |node: NodeId| parts.values().filter(|e| e.destination() == node).count();
        let unspreads = count(src) <= count(dst);
        for (partition, e) in parts {
            if let Some(r) = rank(topic, partition, e) {
                let key = (unspreads, r);
                if best.is_none_or(|(b, _, _)| key < b) {
                    best = Some((key, *topic, *partition));
                }
            }
        }
    }
    let ((_, rank), topic, partition) = best.expect("a broker with load >= 2 has a partition");
    let e = next
        .get_mut(&topic)
        .and_then(|t| t.get_mut(&partition))
        .expect("found above");
    match rank {
        0 => e.leader = dst,
        1 => e.handover_to = None,
        _ => e.handover_to = Some(dst),
    }
}

/// The replicas a partition is reported with: its leader first, then the
/// live brokers after it in node-id order, wrapping around, until there are
/// `replication_factor` (fewer if fewer brokers are live).
///
/// Nothing is copied to them: every broker reads the same object store, so
/// any live broker could take the partition over, and these are the ones
/// named for it. Walking on from the leader's id spreads the followers of a
/// topic's partitions as Kafka's round-robin placement spreads replicas, and
/// depends only on the leader and membership, so every broker reports the
/// same list.
pub fn replicas(
    leader: NodeId,
    live: impl IntoIterator<Item = NodeId>,
    replication_factor: i16,
) -> Vec<NodeId> {
    let others: BTreeSet<NodeId> = live.into_iter().filter(|n| *n != leader).collect();
    let wanted = usize::try_from(replication_factor).unwrap_or(0).max(1);
    let after = others.range(leader..).chain(others.range(..leader));
    std::iter::once(leader)
        .chain(after.copied())
        .take(wanted)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replicas_are_the_leader_then_the_next_live_brokers_by_id() {
        assert_eq!(replicas(2, [1, 2, 3], 3), vec![2, 3, 1]);
        assert_eq!(replicas(3, [1, 2, 3], 2), vec![3, 1]);
        assert_eq!(replicas(1, [3, 1, 2], 1), vec![1]);
    }

    #[test]
    fn replicas_are_as_many_as_live_brokers_allow() {
        assert_eq!(replicas(5, [1, 5], 3), vec![5, 1]);
        // A leader not (yet) seen live still leads; the rest follow it.
        assert_eq!(replicas(4, [1, 2, 3], 3), vec![4, 1, 2]);
        assert_eq!(replicas(1, [], 3), vec![1]);
    }

    /// xorshift64*: enough randomness for generating cases, reproducible by seed.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
        fn chance(&mut self, percent: u64) -> bool {
            self.below(100) < percent
        }
    }

    fn topic(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn nodes(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    fn leaders(a: &Assignment) -> BTreeMap<NodeId, usize> {
        let mut m = BTreeMap::new();
        for e in a.values().flat_map(|t| t.values()) {
            *m.entry(e.leader).or_insert(0) += 1;
        }
        m
    }

    fn destinations(a: &Assignment, live: &BTreeSet<NodeId>) -> Vec<usize> {
        let mut m: BTreeMap<NodeId, usize> = live.iter().map(|n| (*n, 0)).collect();
        for e in a.values().flat_map(|t| t.values()) {
            *m.get_mut(&e.destination()).unwrap() += 1;
        }
        m.into_values().collect()
    }

    /// Every old leader releases every partition it is asked to hand over.
    fn all_releases(a: &Assignment) -> BTreeSet<ReleaseAck> {
        let mut r = BTreeSet::new();
        for (topic, parts) in a {
            for (p, e) in parts {
                if e.handover_to.is_some() {
                    r.insert(ReleaseAck {
                        topic: *topic,
                        partition: *p,
                        leader: e.leader,
                        epoch: e.epoch,
                    });
                }
            }
        }
        r
    }

    /// The invariants every plan satisfies, checked against its input.
    fn check(
        live: &BTreeSet<NodeId>,
        topics: &BTreeMap<Uuid, i32>,
        current: &Assignment,
        released: &BTreeSet<ReleaseAck>,
        next: &Assignment,
    ) {
        assert_eq!(
            next.keys().collect::<Vec<_>>(),
            topics.keys().collect::<Vec<_>>(),
            "exactly the existing topics"
        );
        for (topic, &count) in topics {
            let parts = &next[topic];
            assert_eq!(
                parts.keys().copied().collect::<Vec<_>>(),
                (0..count).collect::<Vec<_>>()
            );
            for (p, e) in parts {
                assert!(
                    live.contains(&e.leader),
                    "{topic} {p}: leader {} not live",
                    e.leader
                );
                if let Some(t) = e.handover_to {
                    assert!(
                        live.contains(&t) && t != e.leader,
                        "{topic} {p}: bad handover {e:?}"
                    );
                }
                let old = current.get(topic).and_then(|t| t.get(p));
                match old {
                    None => assert_eq!(e.epoch, 0, "new partition starts at epoch 0"),
                    Some(o) if o.leader == e.leader && e.epoch == o.epoch => {
                        // Unchanged leader: allowed only if it could keep it.
                        let ack = ReleaseAck {
                            topic: *topic,
                            partition: *p,
                            leader: o.leader,
                            epoch: o.epoch,
                        };
                        assert!(!released.contains(&ack), "{topic} {p}: released yet kept");
                    }
                    Some(o) => {
                        assert_eq!(e.epoch, o.epoch + 1, "{topic} {p}: {o:?} -> {e:?}");
                        let ack = ReleaseAck {
                            topic: *topic,
                            partition: *p,
                            leader: o.leader,
                            epoch: o.epoch,
                        };
                        assert!(
                            !live.contains(&o.leader) || released.contains(&ack),
                            "{topic} {p}: leadership taken from live {} without release",
                            o.leader
                        );
                        assert!(e.handover_to.is_none());
                    }
                }
            }
        }
        let d = destinations(next, live);
        assert!(
            d.iter().max().unwrap() - d.iter().min().unwrap() <= 1,
            "unfair: {d:?}"
        );
        // Running again on the result, with nothing released, changes nothing.
        assert_eq!(
            &plan(live, live, topics, next, &BTreeSet::new()),
            next,
            "not a fixed point"
        );
    }

    #[test]
    fn new_topics_spread_evenly_from_epoch_zero() {
        let live = nodes(&[1, 2, 3]);
        let topics = BTreeMap::from([(topic(1), 4), (topic(2), 5)]);
        let a = plan(&live, &live, &topics, &Assignment::new(), &BTreeSet::new());
        check(&live, &topics, &Assignment::new(), &BTreeSet::new(), &a);
        assert_eq!(leaders(&a).into_values().collect::<Vec<_>>(), [3, 3, 3]);
        assert!(a
            .values()
            .flat_map(|t| t.values())
            .all(|e| e.epoch == 0 && e.handover_to.is_none()));
    }

    #[test]
    fn dead_leaders_partitions_move_with_a_new_epoch_and_others_stay() {
        let topics = BTreeMap::from([(topic(1), 9)]);
        let a = plan(
            &nodes(&[1, 2, 3]),
            &nodes(&[1, 2, 3]),
            &topics,
            &Assignment::new(),
            &BTreeSet::new(),
        );
        let live = nodes(&[1, 2]);
        let b = plan(&live, &live, &topics, &a, &BTreeSet::new());
        check(&live, &topics, &a, &BTreeSet::new(), &b);
        for (p, old) in &a[&topic(1)] {
            let new = b[&topic(1)][p];
            if old.leader == 3 {
                assert_ne!(new.leader, 3);
                assert_eq!(new.epoch, old.epoch + 1);
            } else {
                assert_eq!(&new, old);
            }
        }
        assert_eq!(leaders(&b)[&1] + leaders(&b)[&2], 9);
    }

    #[test]
    fn a_joining_broker_takes_its_share_by_handover_and_nothing_else_moves() {
        let topics = BTreeMap::from([(topic(1), 7), (topic(2), 5)]);
        let a = plan(
            &nodes(&[1, 2, 3]),
            &nodes(&[1, 2, 3]),
            &topics,
            &Assignment::new(),
            &BTreeSet::new(),
        );
        let live = nodes(&[1, 2, 3, 4]);
        let b = plan(&live, &live, &topics, &a, &BTreeSet::new());
        check(&live, &topics, &a, &BTreeSet::new(), &b);
        // Leaders and epochs unchanged; exactly 12/4 = 3 handovers, all towards 4.
        let handovers: Vec<_> = b
            .values()
            .flat_map(|t| t.values())
            .filter_map(|e| e.handover_to)
            .collect();
        assert_eq!(handovers, [4, 4, 4]);
        assert_eq!(leaders(&a), leaders(&b));
        // Releases complete them: 4 leads 3, with epoch + 1.
        let released = all_releases(&b);
        let c = plan(&live, &live, &topics, &b, &released);
        check(&live, &topics, &b, &released, &c);
        assert_eq!(leaders(&c).into_values().collect::<Vec<_>>(), [3, 3, 3, 3]);
        for (t, parts) in &c {
            for (p, e) in parts {
                let before = b[t][p];
                if before.handover_to.is_some() {
                    assert_eq!((e.leader, e.epoch), (4, before.epoch + 1));
                }
            }
        }
    }

    #[test]
    fn a_broker_not_yet_settled_gets_new_partitions_but_no_failover_or_handover() {
        let topics = BTreeMap::from([(topic(1), 6)]);
        let three = nodes(&[1, 2, 3]);
        let a = plan(
            &three,
            &three,
            &topics,
            &Assignment::new(),
            &BTreeSet::new(),
        );
        // Broker 3 dies and comes back: while it settles, 1 and 2 keep what
        // they took over, and its own old partitions do not return to it.
        let two = nodes(&[1, 2]);
        let b = plan(&two, &two, &topics, &a, &BTreeSet::new());
        let c = plan(&three, &two, &topics, &b, &BTreeSet::new());
        assert_eq!(c, b, "nothing handed to the unsettled broker");
        // Broker 1 dies meanwhile: its partitions fail over to 2 only.
        let d = plan(&nodes(&[2, 3]), &nodes(&[2]), &topics, &c, &BTreeSet::new());
        assert_eq!(leaders(&d).get(&3), None, "{d:?}");
        // New partitions spread over every live broker, settled or not.
        let more = BTreeMap::from([(topic(1), 6), (topic(2), 2)]);
        let e = plan(&nodes(&[2, 3]), &nodes(&[2]), &more, &d, &BTreeSet::new());
        assert!(e[&topic(2)].values().any(|p| p.leader == 3), "{e:?}");
        // Once settled, 3 takes its share by handover.
        let f = plan(&three, &three, &topics, &b, &BTreeSet::new());
        let handovers = f
            .values()
            .flat_map(|t| t.values())
            .filter(|e| e.handover_to == Some(3));
        assert_eq!(handovers.count(), 2);
    }

    #[test]
    fn a_handover_to_a_broker_that_died_is_cancelled() {
        let topics = BTreeMap::from([(topic(1), 6)]);
        let a = plan(
            &nodes(&[1, 2]),
            &nodes(&[1, 2]),
            &topics,
            &Assignment::new(),
            &BTreeSet::new(),
        );
        let b = plan(
            &nodes(&[1, 2, 3]),
            &nodes(&[1, 2, 3]),
            &topics,
            &a,
            &BTreeSet::new(),
        );
        assert_eq!(
            b[&topic(1)]
                .values()
                .filter(|e| e.handover_to == Some(3))
                .count(),
            2
        );
        let c = plan(
            &nodes(&[1, 2]),
            &nodes(&[1, 2]),
            &topics,
            &b,
            &BTreeSet::new(),
        );
        assert_eq!(c, a);
    }

    #[test]
    fn a_release_is_honoured_even_when_the_handover_was_cancelled() {
        let topics = BTreeMap::from([(topic(1), 1)]);
        let current = Assignment::from([(
            topic(1),
            TopicAssignment::from([(
                0,
                PartitionLeader {
                    leader: 1,
                    epoch: 5,
                    handover_to: None,
                },
            )]),
        )]);
        let released = BTreeSet::from([ReleaseAck {
            topic: topic(1),
            partition: 0,
            leader: 1,
            epoch: 5,
        }]);
        let live = nodes(&[1]);
        let next = plan(&live, &live, &topics, &current, &released);
        check(&live, &topics, &current, &released, &next);
        assert_eq!(
            next[&topic(1)][&0].epoch,
            6,
            "the released epoch is never served again"
        );
        // A release of an older epoch is stale and ignored.
        let stale = BTreeSet::from([ReleaseAck {
            epoch: 4,
            ..*released.first().unwrap()
        }]);
        assert_eq!(plan(&live, &live, &topics, &current, &stale), current);
    }

    #[test]
    fn deleted_topics_and_partitions_beyond_the_count_are_dropped() {
        let topics = BTreeMap::from([(topic(1), 3), (topic(2), 2)]);
        let live = nodes(&[1, 2]);
        let a = plan(&live, &live, &topics, &Assignment::new(), &BTreeSet::new());
        let fewer = BTreeMap::from([(topic(2), 1)]);
        let b = plan(&live, &live, &fewer, &a, &BTreeSet::new());
        assert_eq!(b.len(), 1);
        assert_eq!(b[&topic(2)].len(), 1);
        assert_eq!(b[&topic(2)][&0], a[&topic(2)][&0]);
    }

    #[test]
    fn with_no_live_broker_nothing_is_invented() {
        let topics = BTreeMap::from([(topic(1), 2)]);
        let a = plan(
            &nodes(&[7]),
            &nodes(&[7]),
            &BTreeMap::from([(topic(1), 1)]),
            &Assignment::new(),
            &BTreeSet::new(),
        );
        let b = plan(
            &BTreeSet::new(),
            &BTreeSet::new(),
            &topics,
            &a,
            &BTreeSet::new(),
        );
        assert_eq!(
            b, a,
            "partition 1 stays without a leader until a broker is live"
        );
    }

    /// Random clusters evolving through joins, deaths, new topics, partition
    /// additions and releases: every step keeps the invariants, epochs never go
    /// backwards, and once everything is released the spread of actual leaders
    /// is fair.
    #[test]
    fn randomized_histories_keep_the_invariants() {
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut live: BTreeSet<NodeId> = (1..=1 + rng.below(4) as NodeId).collect();
            let mut next_node = 10;
            let mut topics = BTreeMap::new();
            let mut next_topic = 1;
            let mut current = Assignment::new();
            let mut max_epoch: BTreeMap<(Uuid, i32), i32> = BTreeMap::new();
            for _step in 0..40 {
                match rng.below(6) {
                    0 => {
                        live.insert(next_node);
                        next_node += 1;
                    }
                    1 if live.len() > 1 => {
                        let victim = *live
                            .iter()
                            .nth(rng.below(live.len() as u64) as usize)
                            .unwrap();
                        live.remove(&victim);
                    }
                    2 => {
                        topics.insert(topic(next_topic), 1 + rng.below(12) as i32);
                        next_topic += 1;
                    }
                    3 if !topics.is_empty() => {
                        let t = *topics
                            .keys()
                            .nth(rng.below(topics.len() as u64) as usize)
                            .unwrap();
                        *topics.get_mut(&t).unwrap() += 1 + rng.below(3) as i32;
                    }
                    4 if !topics.is_empty() && rng.chance(30) => {
                        let t = *topics
                            .keys()
                            .nth(rng.below(topics.len() as u64) as usize)
                            .unwrap();
                        topics.remove(&t);
                    }
                    _ => {}
                }
                // Some of the requested handovers have been released.
                let released: BTreeSet<ReleaseAck> = all_releases(&current)
                    .into_iter()
                    .filter(|_| rng.chance(50))
                    .collect();
                let next = plan(&live, &live, &topics, &current, &released);
                check(&live, &topics, &current, &released, &next);
                for (t, parts) in &next {
                    for (p, e) in parts {
                        let seen = max_epoch.entry((*t, *p)).or_insert(e.epoch);
                        assert!(e.epoch >= *seen, "seed {seed}: epoch went backwards");
                        *seen = e.epoch;
                    }
                }
                current = next;
            }
            let released = all_releases(&current);
            let done = plan(&live, &live, &topics, &current, &released);
            check(&live, &topics, &current, &released, &done);
            assert!(done
                .values()
                .flat_map(|t| t.values())
                .all(|e| e.handover_to.is_none()));
            let mut counts: Vec<usize> = live
                .iter()
                .map(|n| {
                    done.values()
                        .flat_map(|t| t.values())
                        .filter(|e| e.leader == *n)
                        .count()
                })
                .collect();
            counts.sort();
            assert!(
                counts.last().unwrap() - counts.first().unwrap() <= 1,
                "seed {seed}: {counts:?}"
            );
        }
    }

    /// From any fair assignment, a joining broker causes exactly as many
    /// handovers as its fair share, all towards it.
    #[test]
    fn randomized_joins_move_only_the_newcomers_share() {
        for seed in 1..=200u64 {
            let mut rng = Rng(seed.wrapping_mul(0xd1b5_4a32_d192_ed03) | 1);
            let live: BTreeSet<NodeId> = (1..=1 + rng.below(6) as NodeId).collect();
            let topics: BTreeMap<Uuid, i32> = (0..1 + rng.below(5))
                .map(|t| (topic(t as u128), 1 + rng.below(20) as i32))
                .collect();
            let a = plan(&live, &live, &topics, &Assignment::new(), &BTreeSet::new());
            let mut joined = live.clone();
            joined.insert(100);
            let b = plan(&joined, &joined, &topics, &a, &BTreeSet::new());
            check(&joined, &topics, &a, &BTreeSet::new(), &b);
            let total: i32 = topics.values().sum();
            let share = total as usize / joined.len();
            let moved: Vec<_> = b
                .values()
                .flat_map(|t| t.values())
                .filter(|e| e.handover_to.is_some())
                .collect();
            assert_eq!(moved.len(), share, "seed {seed}");
            assert!(moved.iter().all(|e| e.handover_to == Some(100)));
            assert_eq!(leaders(&a), leaders(&b));
        }
    }
}
