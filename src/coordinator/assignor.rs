//! Server-side partition assignors of the consumer group protocol (KIP-848).
//!
//! Under the new protocol the coordinator, not a group leader, decides who
//! reads what. Kafka ships two assignors and so do we: `uniform` (the
//! default) spreads every subscribed partition so member loads differ by at
//! most one where subscriptions allow it, and keeps each partition with its
//! current owner whenever balance permits, so a rebalance moves as few
//! partitions as possible; `range` gives each member a contiguous range of
//! every topic it subscribes to, which co-partitions topics of equal size.
//! Both are pure functions of the members, their subscriptions and the
//! previous target, so they are tested without a group around them.

use std::collections::{BTreeMap, BTreeSet};

use uuid::Uuid;

/// Partitions by topic id.
pub(crate) type Assignment = BTreeMap<Uuid, BTreeSet<i32>>;

pub(crate) const UNIFORM: &str = "uniform";
pub(crate) const RANGE: &str = "range";

/// One member as the assignor sees it.
pub(crate) struct AssignorMember<'a> {
    pub id: &'a str,
    /// Subscribed topics that exist.
    pub topics: BTreeSet<Uuid>,
    /// Its previous target assignment, for stickiness.
    pub previous: Option<&'a Assignment>,
}

/// The target assignment of every member (members with nothing get an empty
/// one). `topics` maps each subscribed topic to its partition count.
pub(crate) fn assign(
    name: &str,
    members: &[AssignorMember<'_>],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    match name {
        RANGE => range(members, topics),
        _ => uniform(members, topics),
    }
}

fn range(
    members: &[AssignorMember<'_>],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let mut out: BTreeMap<String, Assignment> = members
        .iter()
        .map(|m| (m.id.to_string(), Assignment::new()))
        .collect();
    for (&topic, &count) in topics {
        let mut subscribers: Vec<&str> = members
            .iter()
            .filter(|m| m.topics.contains(&topic))
            .map(|m| m.id)
            .collect();
        if subscribers.is_empty() {
            continue;
        }
        subscribers.sort();
        let n = subscribers.len() as i32;
        let (each, extra) = (count / n, count % n);
        let mut start = 0;
        for (i, id) in subscribers.iter().enumerate() {
            let len = each + i32::from((i as i32) < extra);
            if len > 0 {
                out.get_mut(*id)
                    .expect("member listed")
                    .insert(topic, (start..start + len).collect());
            }
            start += len;
        }
    }
    out
}

fn uniform(
    members: &[AssignorMember<'_>],
    topics: &BTreeMap<Uuid, i32>,
) -> BTreeMap<String, Assignment> {
    let n = members.len();
    let mut owned: Vec<Vec<(Uuid, i32)>> = vec![Vec::new(); n];
    let mut taken: BTreeSet<(Uuid, i32)> = BTreeSet::new();
    // 1. Every member keeps what it had and still subscribes to.
    for (i, m) in members.iter().enumerate() {
        for (topic, parts) in m.previous.into_iter().flatten() {
            let Some(&count) = topics.get(topic) else {
                continue;
            };
            if !m.topics.contains(topic) {
                continue;
            }
            for &p in parts {
                if p < count && taken.insert((*topic, p)) {
                    owned[i].push((*topic, p));
                }
            }
        }
    }
    // 2. Partitions nobody holds go to the least loaded subscriber.
    for (&topic, &count) in topics {
        for p in 0..count {
            if taken.contains(&(topic, p)) {
                continue;
            }
            let best = (0..n)
                .filter(|&i| members[i].topics.contains(&topic))
                .min_by_key(|&i| (owned[i].len(), i));
            if let Some(i) = best {
                taken.insert((topic, p));
                owned[i].push((topic, p));
            }
        }
    }
    // 3. Move partitions from the most to the least loaded members while a
    // move narrows a gap of two or more. Each move lowers the sum of squared
    // loads, so this ends.
    loop {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by_key(|&i| (owned[i].len(), i));
        let mut moved = false;
        'search: for &from in order.iter().rev() {
            for &to in &order {
                if owned[from].len() <= owned[to].len() + 1 {
                    break;
                }
                // The most recently added partition the receiver can take.
                if let Some(pos) = owned[from]
                    .iter()
                    .rposition(|(t, _)| members[to].topics.contains(t))
                {
                    let tp = owned[from].remove(pos);
                    owned[to].push(tp);
                    moved = true;
                    break 'search;
                }
            }
        }
        if !moved {
            break;
        }
    }
    members
        .iter()
        .zip(owned)
        .map(|(m, parts)| {
            let mut a = Assignment::new();
            for (t, p) in parts {
                a.entry(t).or_default().insert(p);
            }
            (m.id.to_string(), a)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn member<'a>(
        id: &'a str,
        topics: &[Uuid],
        previous: Option<&'a Assignment>,
    ) -> AssignorMember<'a> {
        AssignorMember {
            id,
            topics: topics.iter().copied().collect(),
            previous,
        }
    }

    fn count(a: &Assignment) -> usize {
        a.values().map(BTreeSet::len).sum()
    }

    /// Every partition of every subscribed topic is assigned exactly once.
    fn assert_complete(out: &BTreeMap<String, Assignment>, topics: &BTreeMap<Uuid, i32>) {
        let mut seen = BTreeSet::new();
        for a in out.values() {
            for (topic, parts) in a {
                for p in parts {
                    assert!(seen.insert((*topic, *p)), "{topic}-{p} assigned twice");
                }
            }
        }
        let all: usize = topics.values().map(|c| *c as usize).sum();
        assert_eq!(seen.len(), all);
    }

    #[test]
    fn uniform_balances_one_topic_over_members() {
        let topics = BTreeMap::from([(t(1), 7)]);
        let members = [
            member("a", &[t(1)], None),
            member("b", &[t(1)], None),
            member("c", &[t(1)], None),
        ];
        let out = assign(UNIFORM, &members, &topics);
        assert_complete(&out, &topics);
        let mut loads: Vec<usize> = out.values().map(count).collect();
        loads.sort();
        assert_eq!(loads, [2, 2, 3]);
    }

    #[test]
    fn uniform_keeps_partitions_with_their_owner_when_a_member_joins() {
        let topics = BTreeMap::from([(t(1), 6)]);
        let first = assign(
            UNIFORM,
            &[member("a", &[t(1)], None), member("b", &[t(1)], None)],
            &topics,
        );
        let (a, b) = (&first["a"], &first["b"]);
        let second = assign(
            UNIFORM,
            &[
                member("a", &[t(1)], Some(a)),
                member("b", &[t(1)], Some(b)),
                member("c", &[t(1)], None),
            ],
            &topics,
        );
        assert_complete(&second, &topics);
        for id in ["a", "b", "c"] {
            assert_eq!(count(&second[id]), 2, "{id}");
        }
        // Nothing moved between the two old members: each kept a subset.
        assert!(second["a"][&t(1)].is_subset(&a[&t(1)]));
        assert!(second["b"][&t(1)].is_subset(&b[&t(1)]));
    }

    #[test]
    fn uniform_with_different_subscriptions_gives_each_topic_only_to_its_subscribers() {
        let topics = BTreeMap::from([(t(1), 4), (t(2), 2)]);
        let members = [
            member("a", &[t(1), t(2)], None),
            member("b", &[t(1)], None),
            member("c", &[t(2)], None),
        ];
        let out = assign(UNIFORM, &members, &topics);
        assert_complete(&out, &topics);
        assert!(!out["b"].contains_key(&t(2)));
        assert!(!out["c"].contains_key(&t(1)));
        let loads: Vec<usize> = out.values().map(count).collect();
        assert_eq!(loads, [2, 2, 2]);
    }

    #[test]
    fn uniform_drops_partitions_of_topics_a_member_no_longer_subscribes_to() {
        let topics = BTreeMap::from([(t(1), 2), (t(2), 2)]);
        let had: Assignment = BTreeMap::from([
            (t(1), BTreeSet::from([0, 1])),
            (t(2), BTreeSet::from([0, 1])),
        ]);
        let out = assign(
            UNIFORM,
            &[member("a", &[t(2)], Some(&had)), member("b", &[t(1)], None)],
            &topics,
        );
        assert_eq!(out["a"], BTreeMap::from([(t(2), BTreeSet::from([0, 1]))]));
        assert_eq!(out["b"], BTreeMap::from([(t(1), BTreeSet::from([0, 1]))]));
    }

    #[test]
    fn range_gives_each_member_a_contiguous_range_of_every_topic() {
        let topics = BTreeMap::from([(t(1), 5), (t(2), 5)]);
        let members = [
            member("b", &[t(1), t(2)], None),
            member("a", &[t(1), t(2)], None),
        ];
        let out = assign(RANGE, &members, &topics);
        assert_complete(&out, &topics);
        for topic in [t(1), t(2)] {
            assert_eq!(out["a"][&topic], BTreeSet::from([0, 1, 2]));
            assert_eq!(out["b"][&topic], BTreeSet::from([3, 4]));
        }
    }

    #[test]
    fn more_members_than_partitions_leaves_some_members_empty() {
        let topics = BTreeMap::from([(t(1), 1)]);
        for name in [UNIFORM, RANGE] {
            let out = assign(
                name,
                &[member("a", &[t(1)], None), member("b", &[t(1)], None)],
                &topics,
            );
            assert_complete(&out, &topics);
            assert_eq!(out.values().filter(|a| count(a) == 0).count(), 1, "{name}");
        }
    }
}
