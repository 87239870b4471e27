//! The server-side task assignor of Streams groups (KIP-1071).
//!
//! A Streams application is cut into subtopologies, and each subtopology
//! into one task per input partition. Tasks hold state (RocksDB stores
//! restored from changelogs), so moving one is expensive: the assignor is
//! sticky first and balanced second, like Kafka's `StickyTaskAssignor`.
//! Every task goes active to exactly one member, and loads differ by at most
//! one task; a task stays with its previous owner whenever that keeps the
//! balance. Standby replicas (warm copies of a task's state) go to members of
//! *other* processes than the active one and than each other, since a copy
//! on the same machine would not survive that machine; where no such member
//! exists the standby is left out, as in Kafka.
//!
//! A pure function of the members and the tasks, tested without a group.

use std::collections::{BTreeMap, BTreeSet};

/// Partitions (task numbers) by subtopology id.
pub(crate) type Tasks = BTreeMap<String, BTreeSet<i32>>;

/// A member's tasks of each kind.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TaskSet {
    pub active: Tasks,
    pub standby: Tasks,
    pub warmup: Tasks,
}

/// Which of a member's task lists a task is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Kind {
    Active,
    Standby,
    Warmup,
}

pub(crate) type Task = (String, i32);

impl TaskSet {
    pub(crate) fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    pub(crate) fn kind(&self, kind: Kind) -> &Tasks {
        match kind {
            Kind::Active => &self.active,
            Kind::Standby => &self.standby,
            Kind::Warmup => &self.warmup,
        }
    }

    fn kind_mut(&mut self, kind: Kind) -> &mut Tasks {
        match kind {
            Kind::Active => &mut self.active,
            Kind::Standby => &mut self.standby,
            Kind::Warmup => &mut self.warmup,
        }
    }

    /// Every (kind, subtopology, partition).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (Kind, &str, i32)> + '_ {
        [Kind::Active, Kind::Standby, Kind::Warmup]
            .into_iter()
            .flat_map(move |k| {
                self.kind(k)
                    .iter()
                    .flat_map(move |(s, ps)| ps.iter().map(move |p| (k, s.as_str(), *p)))
            })
    }

    pub(crate) fn contains(&self, kind: Kind, subtopology: &str, partition: i32) -> bool {
        self.kind(kind)
            .get(subtopology)
            .is_some_and(|ps| ps.contains(&partition))
    }

    /// Whether the task is here under any kind.
    pub(crate) fn holds(&self, subtopology: &str, partition: i32) -> bool {
        [Kind::Active, Kind::Standby, Kind::Warmup]
            .into_iter()
            .any(|k| self.contains(k, subtopology, partition))
    }

    pub(crate) fn insert(&mut self, kind: Kind, subtopology: &str, partition: i32) {
        self.kind_mut(kind)
            .entry(subtopology.to_string())
            .or_default()
            .insert(partition);
    }

    /// Drops empty subtopology entries, so equal sets compare equal.
    pub(crate) fn normalized(mut self) -> TaskSet {
        for k in [Kind::Active, Kind::Standby, Kind::Warmup] {
            self.kind_mut(k).retain(|_, ps| !ps.is_empty());
        }
        self
    }
}

/// One member as the assignor sees it.
pub(crate) struct TaskMember<'a> {
    pub id: &'a str,
    /// Members of one process (one Streams instance) share its state directory.
    pub process_id: &'a str,
    /// Its previous target, for stickiness.
    pub previous: Option<&'a TaskSet>,
}

/// The target of every member. `tasks` is the task count of each
/// subtopology; each gets `standby_replicas` standbys where other processes
/// allow it.
pub(crate) fn assign(
    members: &[TaskMember<'_>],
    tasks: &BTreeMap<String, i32>,
    standby_replicas: u32,
) -> BTreeMap<String, TaskSet> {
    let mut out: BTreeMap<String, TaskSet> = members
        .iter()
        .map(|m| (m.id.to_string(), TaskSet::default()))
        .collect();
    if members.is_empty() {
        return out;
    }
    let all: Vec<Task> = tasks
        .iter()
        .flat_map(|(s, n)| (0..*n).map(move |p| (s.clone(), p)))
        .collect();
    // Active tasks: each member's share is floor(n/m) or one more.
    let n = all.len();
    let m = members.len();
    let (base, extra) = (n / m, n % m);
    let mut load: BTreeMap<&str, usize> = members.iter().map(|m| (m.id, 0)).collect();
    let mut with_extra = 0;
    let mut unassigned = Vec::new();
    for (s, p) in &all {
        let owner = members.iter().find(|m| {
            m.previous
                .is_some_and(|prev| prev.contains(Kind::Active, s, *p))
        });
        match owner {
            Some(o) if load[o.id] < base || (load[o.id] == base && with_extra < extra) => {
                if load[o.id] == base {
                    with_extra += 1;
                }
                *load.get_mut(o.id).expect("member") += 1;
                out.get_mut(o.id)
                    .expect("member")
                    .insert(Kind::Active, s, *p);
            }
            _ => unassigned.push((s.clone(), *p)),
        }
    }
    for (s, p) in unassigned {
        let least = *load
            .iter()
            .min_by_key(|(id, l)| (**l, **id))
            .map(|(id, _)| id)
            .expect("members");
        *load.get_mut(least).expect("member") += 1;
        out.get_mut(least)
            .expect("member")
            .insert(Kind::Active, &s, p);
    }
    // Standbys: on processes that hold no copy of the task yet, previous
    // standby owners first, then the least loaded.
    let process: BTreeMap<&str, &str> = members.iter().map(|m| (m.id, m.process_id)).collect();
    for _ in 0..standby_replicas {
        for (s, p) in &all {
            let taken: BTreeSet<&str> = out
                .iter()
                .filter(|(_, t)| t.holds(s, *p))
                .map(|(id, _)| process[id.as_str()])
                .collect();
            let candidates: Vec<&TaskMember<'_>> = members
                .iter()
                .filter(|m| !taken.contains(m.process_id))
                .collect();
            let sticky = candidates.iter().find(|m| {
                m.previous
                    .is_some_and(|prev| prev.contains(Kind::Standby, s, *p))
            });
            let chosen = sticky.or_else(|| candidates.iter().min_by_key(|m| (load[m.id], m.id)));
            if let Some(c) = chosen {
                *load.get_mut(c.id).expect("member") += 1;
                out.get_mut(c.id)
                    .expect("member")
                    .insert(Kind::Standby, s, *p);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member<'a>(id: &'a str, process: &'a str, previous: Option<&'a TaskSet>) -> TaskMember<'a> {
        TaskMember {
            id,
            process_id: process,
            previous,
        }
    }

    fn actives(t: &TaskSet) -> usize {
        t.active.values().map(BTreeSet::len).sum()
    }

    #[test]
    fn every_task_goes_active_to_exactly_one_member_and_loads_differ_by_at_most_one() {
        let tasks = BTreeMap::from([("0".to_string(), 5), ("1".to_string(), 3)]);
        let members = [
            member("a", "p1", None),
            member("b", "p1", None),
            member("c", "p2", None),
        ];
        let out = assign(&members, &tasks, 0);
        let mut seen = BTreeSet::new();
        for t in out.values() {
            for (k, s, p) in t.iter() {
                assert_eq!(k, Kind::Active);
                assert!(seen.insert((s.to_string(), p)), "task {s}_{p} twice");
            }
        }
        assert_eq!(seen.len(), 8);
        let loads: Vec<usize> = out.values().map(actives).collect();
        assert!(
            loads.iter().max().unwrap() - loads.iter().min().unwrap() <= 1,
            "{loads:?}"
        );
    }

    #[test]
    fn a_new_member_takes_tasks_without_moving_the_others_needlessly() {
        let tasks = BTreeMap::from([("0".to_string(), 4)]);
        let first = assign(
            &[member("a", "p1", None), member("b", "p2", None)],
            &tasks,
            0,
        );
        let members = [
            member("a", "p1", first.get("a")),
            member("b", "p2", first.get("b")),
            member("c", "p3", None),
        ];
        let next = assign(&members, &tasks, 0);
        // a and b keep what they still may have; c gets the rest.
        for id in ["a", "b"] {
            let kept = next[id].active["0"].is_subset(&first[id].active["0"]);
            assert!(kept, "{id} was given a task it did not have: {next:?}");
        }
        assert_eq!(actives(&next["c"]), 1);
    }

    #[test]
    fn standbys_go_to_other_processes_or_nowhere() {
        let tasks = BTreeMap::from([("0".to_string(), 3)]);
        let members = [
            member("a", "p1", None),
            member("b", "p1", None),
            member("c", "p2", None),
        ];
        let out = assign(&members, &tasks, 1);
        for p in 0..3 {
            let holders: Vec<&str> = out
                .iter()
                .filter(|(_, t)| t.holds("0", p))
                .map(|(id, _)| if id == "c" { "p2" } else { "p1" })
                .collect();
            assert_eq!(holders.len(), 2, "task 0_{p}: {out:?}");
            assert_ne!(
                holders[0], holders[1],
                "active and standby of 0_{p} on one process"
            );
        }
        // One process: no standby anywhere.
        let alone = assign(
            &[member("a", "p1", None), member("b", "p1", None)],
            &tasks,
            1,
        );
        assert!(alone.values().all(|t| t.standby.is_empty()), "{alone:?}");
    }
}
