//! Everything under the prefix, decoded: what the controller plans from and
//! what a [`ClusterView`](super::ClusterView) shows.
//!
//! Both read the whole prefix at one revision (a single range read, or a watch
//! applied on top of one), so a state is always a consistent cut. A value that
//! does not decode is logged and skipped rather than poisoning the rest: one
//! bad key must not take the cluster's metadata down with it.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::assignment::{Assignment, PartitionLeader, ReleaseAck, TopicAssignment};
use super::etcd::Keys;
use super::kv::KeyValue;
use super::member::BrokerInfo;
use super::topics::TopicRecord;
use super::NodeId;

/// A value with the revision it was last written at, for compare-and-swap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub mod_revision: i64,
}

/// What a leader writes once it stopped serving a partition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    pub leader: NodeId,
    pub epoch: i32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ControllerRecord {
    pub node_id: NodeId,
}

/// A partition some broker leads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LedPartition {
    pub topic: Uuid,
    pub partition: i32,
    pub epoch: i32,
    /// The controller asks the leader to stop and release it for this broker.
    pub handover_to: Option<NodeId>,
}

/// One raw key as read from etcd.
#[derive(Clone, Debug)]
pub(crate) struct RawKv {
    pub value: Vec<u8>,
    pub mod_revision: i64,
    pub create_revision: i64,
}

impl From<&KeyValue> for RawKv {
    fn from(kv: &KeyValue) -> Self {
        RawKv {
            value: kv.value.clone(),
            mod_revision: kv.mod_revision,
            create_revision: kv.create_revision,
        }
    }
}

/// The cluster's metadata at one etcd revision.
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    /// The etcd revision this state reflects; 0 until first read.
    pub revision: i64,
    pub brokers: BTreeMap<NodeId, BrokerInfo>,
    /// The mod revision of each broker's registration: a new one is a new
    /// incarnation (a restart, a takeover of its own registration).
    pub registrations: BTreeMap<NodeId, i64>,
    pub controller: Option<NodeId>,
    /// Create revision of the controller key: the controller's fencing token.
    pub controller_token: i64,
    pub topics: BTreeMap<String, Versioned<TopicRecord>>,
    pub assignment: BTreeMap<Uuid, Versioned<TopicAssignment>>,
    pub releases: BTreeMap<(Uuid, i32), Versioned<Release>>,
}

impl ClusterState {
    /// Decodes the keys under `keys.root()` (full key → value).
    pub(crate) fn decode(
        keys: &Keys,
        revision: i64,
        raw: &BTreeMap<String, RawKv>,
    ) -> ClusterState {
        let mut s = ClusterState {
            revision,
            ..ClusterState::default()
        };
        let controller_key = keys.controller();
        let (brokers, topics, assignments, releases) = (
            keys.brokers(),
            keys.topics(),
            keys.assignments(),
            keys.releases(),
        );
        for (key, kv) in raw {
            let ok = if let Some(id) = key.strip_prefix(&brokers) {
                decode_into(&kv.value, |b: BrokerInfo| {
                    id.parse::<NodeId>()
                        .ok()
                        .filter(|id| *id == b.node_id)
                        .map(|id| {
                            s.brokers.insert(id, b);
                            s.registrations.insert(id, kv.mod_revision);
                        })
                })
            } else if key == &controller_key {
                decode_into(&kv.value, |c: ControllerRecord| {
                    s.controller = Some(c.node_id);
                    s.controller_token = kv.create_revision;
                    Some(())
                })
            } else if let Some(name) = key.strip_prefix(&topics) {
                decode_into(&kv.value, |t: TopicRecord| {
                    s.topics.insert(name.to_string(), versioned(t, kv));
                    Some(())
                })
            } else if let Some(id) = key.strip_prefix(&assignments) {
                decode_into(&kv.value, |a: TopicAssignment| {
                    let id = Uuid::parse_str(id).ok()?;
                    s.assignment.insert(id, versioned(a, kv));
                    Some(())
                })
            } else if let Some(rest) = key.strip_prefix(&releases) {
                decode_into(&kv.value, |r: Release| {
                    let (id, p) = rest.split_once('/')?;
                    let id = Uuid::parse_str(id).ok()?;
                    s.releases.insert((id, p.parse().ok()?), versioned(r, kv));
                    Some(())
                })
            } else {
                true
            };
            if !ok {
                tracing::warn!(key, "skipping malformed cluster metadata");
            }
        }
        s
    }

    /// Brokers, controller, and each partition's leader and epoch, as
    /// `strata cluster` prints them.
    pub fn report(&self) -> String {
        use std::fmt::Write;
        let mut out = String::new();
        let controller = self.controller.map_or("none".into(), |c| c.to_string());
        let _ = writeln!(out, "controller: {controller}");
        for b in self.brokers.values() {
            let led = self.partitions_led_by(b.node_id).len();
            let _ = writeln!(
                out,
                "broker {} at {}:{} leads {led} partitions",
                b.node_id, b.host, b.port
            );
        }
        for (name, topic) in &self.topics {
            let t = &topic.value;
            let _ = writeln!(
                out,
                "topic {name} ({}), {} partitions, replication factor {}",
                t.id, t.partitions, t.replication_factor
            );
            for p in 0..t.partitions {
                let leader = match self.assignment.get(&t.id).and_then(|a| a.value.get(&p)) {
                    Some(l) => {
                        let handover = l
                            .handover_to
                            .map_or(String::new(), |n| format!(", handing over to {n}"));
                        format!("leader {} epoch {}{handover}", l.leader, l.epoch)
                    }
                    None => "no leader".into(),
                };
                let _ = writeln!(out, "  {name}-{p}: {leader}");
            }
        }
        out
    }

    /// Leader and epoch of a partition, if assigned.
    pub fn leader_of(&self, topic: Uuid, partition: i32) -> Option<(NodeId, i32)> {
        let e = self.assignment.get(&topic)?.value.get(&partition)?;
        Some((e.leader, e.epoch))
    }

    /// The partition's reported replicas (see [`replicas`](super::replicas)):
    /// its leader, then live brokers up to the replication factor topic
    /// `name` was created with, if it is still the topic with `id`.
    pub fn replicas_of(&self, name: &str, id: Uuid, partition: i32) -> Option<Vec<NodeId>> {
        let (leader, _) = self.leader_of(id, partition)?;
        let factor = self
            .topics
            .get(name)
            .filter(|t| t.value.id == id)
            .map_or(1, |t| t.value.replication_factor);
        Some(super::replicas(
            leader,
            self.brokers.keys().copied(),
            factor,
        ))
    }

    /// The partitions `node` leads, in (topic, partition) order.
    pub fn partitions_led_by(&self, node: NodeId) -> Vec<LedPartition> {
        let mut out = Vec::new();
        for (topic, a) in &self.assignment {
            for (partition, e) in &a.value {
                if e.leader == node {
                    out.push(LedPartition {
                        topic: *topic,
                        partition: *partition,
                        epoch: e.epoch,
                        handover_to: e.handover_to,
                    });
                }
            }
        }
        out
    }

    /// The assignment without revisions.
    pub fn assignment(&self) -> Assignment {
        self.assignment
            .iter()
            .map(|(t, a)| (*t, a.value.clone()))
            .collect()
    }

    /// Topic id → partition count.
    pub fn partition_counts(&self) -> BTreeMap<Uuid, i32> {
        self.topics
            .values()
            .map(|t| (t.value.id, t.value.partitions))
            .collect()
    }

    /// Releases as the planner takes them.
    pub fn release_acks(&self) -> BTreeSet<ReleaseAck> {
        self.releases
            .iter()
            .map(|((topic, partition), r)| ReleaseAck {
                topic: *topic,
                partition: *partition,
                leader: r.value.leader,
                epoch: r.value.epoch,
            })
            .collect()
    }

    /// Whether every partition of every topic has a leader and no handover is
    /// pending: the cluster is at rest.
    pub fn settled(&self) -> bool {
        self.topics.values().all(|t| {
            self.assignment.get(&t.value.id).is_some_and(|a| {
                (0..t.value.partitions).all(|p| {
                    a.value
                        .get(&p)
                        .is_some_and(|e: &PartitionLeader| e.handover_to.is_none())
                })
            })
        })
    }
}

fn versioned<T>(value: T, kv: &RawKv) -> Versioned<T> {
    Versioned {
        value,
        mod_revision: kv.mod_revision,
    }
}

fn decode_into<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    f: impl FnOnce(T) -> Option<()>,
) -> bool {
    serde_json::from_slice(bytes).ok().and_then(f).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(entries: &[(&str, &str, i64)]) -> BTreeMap<String, RawKv> {
        entries
            .iter()
            .map(|(k, v, rev)| {
                let kv = RawKv {
                    value: v.as_bytes().to_vec(),
                    mod_revision: *rev,
                    create_revision: rev - 1,
                };
                (k.to_string(), kv)
            })
            .collect()
    }

    #[test]
    fn decodes_every_kind_of_key_and_skips_what_does_not_parse() {
        let id = Uuid::from_u128(7);
        let keys = Keys::new("/c");
        let raw = raw(&[
            (
                "/c/brokers/1",
                r#"{"node_id":1,"host":"h","port":9092}"#,
                10,
            ),
            (
                "/c/brokers/2",
                r#"{"node_id":3,"host":"h","port":9092}"#,
                11,
            ),
            ("/c/brokers/4", "not json", 12),
            ("/c/controller", r#"{"node_id":1}"#, 13),
            (
                "/c/topics/a/b",
                &format!(r#"{{"id":"{id}","partitions":2,"config":{{"k":"v"}}}}"#),
                14,
            ),
            (
                &format!("/c/assignment/{id}"),
                r#"{"0":{"leader":1,"epoch":3},"1":{"leader":1,"epoch":0,"handover_to":2}}"#,
                15,
            ),
            ("/c/assignment/not-a-uuid", "{}", 16),
            (
                &format!("/c/released/{id}/1"),
                r#"{"leader":1,"epoch":0}"#,
                17,
            ),
            ("/c/producer_ids/next", "1000", 18),
            (
                "/other/brokers/5",
                r#"{"node_id":5,"host":"h","port":1}"#,
                19,
            ),
        ]);
        let s = ClusterState::decode(&keys, 20, &raw);
        assert_eq!(s.revision, 20);
        assert_eq!(
            s.brokers.keys().copied().collect::<Vec<_>>(),
            [1],
            "id must match the key"
        );
        assert_eq!((s.controller, s.controller_token), (Some(1), 12));
        let topic = &s.topics["a/b"];
        assert_eq!(
            (topic.value.id, topic.value.partitions, topic.mod_revision),
            (id, 2, 14)
        );
        assert_eq!(s.leader_of(id, 0), Some((1, 3)));
        assert_eq!(s.leader_of(id, 2), None);
        assert_eq!(s.assignment.len(), 1);
        assert_eq!(
            s.partitions_led_by(1)
                .iter()
                .map(|p| p.handover_to)
                .collect::<Vec<_>>(),
            [None, Some(2)]
        );
        assert_eq!(
            s.release_acks().into_iter().collect::<Vec<_>>(),
            [ReleaseAck {
                topic: id,
                partition: 1,
                leader: 1,
                epoch: 0
            }]
        );
        assert_eq!(s.partition_counts(), BTreeMap::from([(id, 2)]));
        assert!(!s.settled(), "a handover is pending");
    }
}
