//! The values of a Streams group's records in `__consumer_offsets`, in
//! Kafka 4.4's layout (version 0, flexible encoding), so the topic reads the
//! same to Kafka's tools as a Kafka broker's: the group's epoch (key 17),
//! each member's metadata (19), the target assignment's epoch (20, coded as
//! the consumer groups' key 6 is) and per-member target (21), each member's
//! current assignment (22), and the topology (23).

use std::collections::BTreeMap;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::records::{
    get_compact_len, get_compact_opt_str, get_i16, get_i32, get_i64, get_tagged, need,
    put_compact_opt_str, put_uvarint, RecordError,
};
use super::task_assignor::{TaskSet, Tasks};

/// StreamsGroupMetadataValue (key 17).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamsGroupValue {
    pub epoch: i32,
    pub metadata_hash: i64,
    /// The topology epoch last found ready, -1 if none (tag 0).
    pub validated_topology_epoch: i32,
    /// The assignment configs the last target was computed with (tag 1).
    pub assignment_configs: Option<Vec<(String, String)>>,
}

/// StreamsGroupMemberMetadataValue (key 19).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct StreamsMemberValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub topology_epoch: i32,
    pub process_id: String,
    pub user_endpoint: Option<(String, u16)>,
    /// Sorted by key.
    pub client_tags: Vec<(String, String)>,
}

/// StreamsGroupCurrentMemberAssignmentValue (key 22).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct StreamsCurrentValue {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    /// 1 stable, 2 unrevoked tasks, 3 unreleased tasks.
    pub state: i8,
    pub assigned: TaskSet,
    pub revoking: TaskSet,
    /// When each active task (assigned or revoking) was given (Kafka 4.4's
    /// AssignmentEpochs, tag 0 of each active TaskIds).
    pub active_epochs: TaskEpochs,
}

/// A topic of a topology (StreamsGroupTopologyValue's TopicInfo).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct TopicInfo {
    pub name: String,
    /// 0: not fixed by the application.
    pub partitions: i32,
    /// 0: the broker's default.
    pub replication_factor: i16,
    pub configs: Vec<(String, String)>,
}

/// One subtopology; copartition groups index into its own topic lists.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Subtopology {
    pub id: String,
    pub source_topics: Vec<String>,
    pub source_topic_regex: Vec<String>,
    pub changelog_topics: Vec<TopicInfo>,
    pub repartition_sink_topics: Vec<String>,
    pub repartition_source_topics: Vec<TopicInfo>,
    pub copartition_groups: Vec<CopartitionGroup>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct CopartitionGroup {
    pub source_topics: Vec<i16>,
    pub source_topic_regex: Vec<i16>,
    pub repartition_source_topics: Vec<i16>,
}

/// StreamsGroupTopologyValue (key 23), as the first member sent it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct Topology {
    pub epoch: i32,
    pub subtopologies: Vec<Subtopology>,
}

fn put_array<T>(b: &mut BytesMut, items: &[T], mut put: impl FnMut(&mut BytesMut, &T)) {
    put_uvarint(b, items.len() as u64 + 1);
    for i in items {
        put(b, i);
    }
}

fn get_array<T>(
    b: &mut &[u8],
    mut get: impl FnMut(&mut &[u8]) -> Result<T, RecordError>,
) -> Result<Vec<T>, RecordError> {
    let n = get_compact_len(b)?;
    let mut out = Vec::with_capacity(n.min(1024));
    for _ in 0..n {
        out.push(get(b)?);
    }
    Ok(out)
}

fn put_string(b: &mut BytesMut, s: &str) {
    put_compact_opt_str(b, Some(s));
}

fn get_string(b: &mut &[u8]) -> Result<String, RecordError> {
    Ok(get_compact_opt_str(b)?.unwrap_or_default())
}

fn put_key_values(b: &mut BytesMut, kvs: &[(String, String)]) {
    put_array(b, kvs, |b, (k, v)| {
        put_string(b, k);
        put_string(b, v);
        put_uvarint(b, 0);
    });
}

fn get_key_values(b: &mut &[u8]) -> Result<Vec<(String, String)>, RecordError> {
    get_array(b, |b| {
        let kv = (get_string(b)?, get_string(b)?);
        get_tagged(b)?;
        Ok(kv)
    })
}

fn put_i16s(b: &mut BytesMut, v: &[i16]) {
    put_array(b, v, |b, i| b.put_i16(*i));
}

fn get_i16s(b: &mut &[u8]) -> Result<Vec<i16>, RecordError> {
    get_array(b, get_i16)
}

fn put_strings(b: &mut BytesMut, v: &[String]) {
    put_array(b, v, |b, s| put_string(b, s));
}

fn get_strings(b: &mut &[u8]) -> Result<Vec<String>, RecordError> {
    get_array(b, get_string)
}

/// The member epoch each active task was given at, by (subtopology, partition).
pub(crate) type TaskEpochs = BTreeMap<(String, i32), i32>;

/// `[]TaskIds{SubtopologyId, Partitions []int32}`; with `epochs`, each
/// entry's tag 0 (AssignmentEpochs) holds the partitions' epochs in order.
fn put_tasks(b: &mut BytesMut, tasks: &Tasks, epochs: Option<&TaskEpochs>) {
    let entries: Vec<_> = tasks.iter().filter(|(_, ps)| !ps.is_empty()).collect();
    put_array(b, &entries, |b, (s, ps)| {
        put_string(b, s);
        put_uvarint(b, ps.len() as u64 + 1);
        for p in ps.iter() {
            b.put_i32(*p);
        }
        match epochs {
            Some(epochs) => {
                let mut t = BytesMut::new();
                put_uvarint(&mut t, ps.len() as u64 + 1);
                for p in ps.iter() {
                    t.put_i32(epochs.get(&(s.to_string(), *p)).copied().unwrap_or(0));
                }
                put_uvarint(b, 1);
                put_tagged(b, 0, &t);
            }
            None => put_uvarint(b, 0),
        }
    });
}

fn get_tasks(b: &mut &[u8], epochs: &mut TaskEpochs) -> Result<Tasks, RecordError> {
    let mut out = Tasks::new();
    for (s, ps, es) in get_array(b, |b| {
        let s = get_string(b)?;
        let ps = get_array(b, get_i32)?;
        let mut es = Vec::new();
        for (tag, mut data) in get_tagged(b)? {
            if tag == 0 {
                es = get_array(&mut data, get_i32)?;
            }
        }
        Ok((s, ps, es))
    })? {
        for (p, e) in ps.iter().zip(es) {
            epochs.insert((s.clone(), *p), e);
        }
        out.entry(s).or_default().extend(ps);
    }
    Ok(out)
}

fn put_task_set(b: &mut BytesMut, t: &TaskSet, epochs: Option<&TaskEpochs>) {
    put_tasks(b, &t.active, epochs);
    put_tasks(b, &t.standby, None);
    put_tasks(b, &t.warmup, None);
}

fn get_task_set(b: &mut &[u8], epochs: &mut TaskEpochs) -> Result<TaskSet, RecordError> {
    let mut ignored = TaskEpochs::new();
    Ok(TaskSet {
        active: get_tasks(b, epochs)?,
        standby: get_tasks(b, &mut ignored)?,
        warmup: get_tasks(b, &mut ignored)?,
    }
    .normalized())
}

/// A tagged field's bytes: tag, size, data.
fn put_tagged(b: &mut BytesMut, tag: u64, data: &[u8]) {
    put_uvarint(b, tag);
    put_uvarint(b, data.len() as u64);
    b.put_slice(data);
}

impl StreamsGroupValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(self.epoch);
        b.put_i64(self.metadata_hash);
        let mut tags: Vec<(u64, BytesMut)> = Vec::new();
        if self.validated_topology_epoch != -1 {
            let mut t = BytesMut::new();
            t.put_i32(self.validated_topology_epoch);
            tags.push((0, t));
        }
        if let Some(configs) = &self.assignment_configs {
            let mut t = BytesMut::new();
            put_key_values(&mut t, configs);
            tags.push((1, t));
        }
        put_uvarint(&mut b, tags.len() as u64);
        for (tag, data) in tags {
            put_tagged(&mut b, tag, &data);
        }
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<StreamsGroupValue, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let mut v = StreamsGroupValue {
            epoch: get_i32(b)?,
            metadata_hash: get_i64(b)?,
            validated_topology_epoch: -1,
            assignment_configs: None,
        };
        for (tag, mut data) in get_tagged(b)? {
            match tag {
                0 => v.validated_topology_epoch = get_i32(&mut data)?,
                1 => v.assignment_configs = Some(get_key_values(&mut data)?),
                _ => {}
            }
        }
        Ok(v)
    }
}

impl StreamsMemberValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        put_compact_opt_str(&mut b, self.instance_id.as_deref());
        put_compact_opt_str(&mut b, self.rack_id.as_deref());
        put_string(&mut b, &self.client_id);
        put_string(&mut b, &self.client_host);
        b.put_i32(self.rebalance_timeout_ms);
        b.put_i32(self.topology_epoch);
        put_string(&mut b, &self.process_id);
        match &self.user_endpoint {
            Some((host, port)) => {
                b.put_i8(1);
                put_string(&mut b, host);
                b.put_u16(*port);
                put_uvarint(&mut b, 0);
            }
            None => b.put_i8(-1),
        }
        put_key_values(&mut b, &self.client_tags);
        put_uvarint(&mut b, 0);
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<StreamsMemberValue, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let instance_id = get_compact_opt_str(b)?;
        let rack_id = get_compact_opt_str(b)?;
        let client_id = get_string(b)?;
        let client_host = get_string(b)?;
        let rebalance_timeout_ms = get_i32(b)?;
        let topology_epoch = get_i32(b)?;
        let process_id = get_string(b)?;
        need(b, 1)?;
        // A nullable struct: -1 for null, 1 before a value.
        let user_endpoint = if b.get_i8() < 0 {
            None
        } else {
            let host = get_string(b)?;
            need(b, 2)?;
            let port = b.get_u16();
            get_tagged(b)?;
            Some((host, port))
        };
        let client_tags = get_key_values(b)?;
        Ok(StreamsMemberValue {
            instance_id,
            rack_id,
            client_id,
            client_host,
            rebalance_timeout_ms,
            topology_epoch,
            process_id,
            user_endpoint,
            client_tags,
        })
    }
}

/// StreamsGroupTargetAssignmentMemberValue (key 21).
pub(crate) fn encode_target(t: &TaskSet) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    put_task_set(&mut b, t, None);
    put_uvarint(&mut b, 0);
    b.freeze()
}

pub(crate) fn decode_target(mut b: &[u8]) -> Result<TaskSet, RecordError> {
    get_i16(&mut b)?;
    get_task_set(&mut b, &mut TaskEpochs::new())
}

impl StreamsCurrentValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(self.member_epoch);
        b.put_i32(self.previous_member_epoch);
        b.put_i8(self.state);
        put_task_set(&mut b, &self.assigned, Some(&self.active_epochs));
        put_task_set(&mut b, &self.revoking, Some(&self.active_epochs));
        put_uvarint(&mut b, 0);
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<StreamsCurrentValue, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let member_epoch = get_i32(b)?;
        let previous_member_epoch = get_i32(b)?;
        need(b, 1)?;
        let state = b.get_i8();
        let mut active_epochs = TaskEpochs::new();
        let assigned = get_task_set(b, &mut active_epochs)?;
        let revoking = get_task_set(b, &mut active_epochs)?;
        Ok(StreamsCurrentValue {
            member_epoch,
            previous_member_epoch,
            state,
            assigned,
            revoking,
            active_epochs,
        })
    }
}

fn put_topic_info(b: &mut BytesMut, t: &TopicInfo) {
    put_string(b, &t.name);
    b.put_i32(t.partitions);
    b.put_i16(t.replication_factor);
    put_key_values(b, &t.configs);
    put_uvarint(b, 0);
}

fn get_topic_info(b: &mut &[u8]) -> Result<TopicInfo, RecordError> {
    let t = TopicInfo {
        name: get_string(b)?,
        partitions: get_i32(b)?,
        replication_factor: get_i16(b)?,
        configs: get_key_values(b)?,
    };
    get_tagged(b)?;
    Ok(t)
}

impl Topology {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(self.epoch);
        put_array(&mut b, &self.subtopologies, |b, s| {
            put_string(b, &s.id);
            put_strings(b, &s.source_topics);
            put_strings(b, &s.source_topic_regex);
            put_array(b, &s.changelog_topics, put_topic_info);
            put_strings(b, &s.repartition_sink_topics);
            put_array(b, &s.repartition_source_topics, put_topic_info);
            put_array(b, &s.copartition_groups, |b, g| {
                put_i16s(b, &g.source_topics);
                put_i16s(b, &g.source_topic_regex);
                put_i16s(b, &g.repartition_source_topics);
                put_uvarint(b, 0);
            });
            put_uvarint(b, 0);
        });
        put_uvarint(&mut b, 0);
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<Topology, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let epoch = get_i32(b)?;
        let subtopologies = get_array(b, |b| {
            let s = Subtopology {
                id: get_string(b)?,
                source_topics: get_strings(b)?,
                source_topic_regex: get_strings(b)?,
                changelog_topics: get_array(b, get_topic_info)?,
                repartition_sink_topics: get_strings(b)?,
                repartition_source_topics: get_array(b, get_topic_info)?,
                copartition_groups: get_array(b, |b| {
                    let g = CopartitionGroup {
                        source_topics: get_i16s(b)?,
                        source_topic_regex: get_i16s(b)?,
                        repartition_source_topics: get_i16s(b)?,
                    };
                    get_tagged(b)?;
                    Ok(g)
                })?,
            };
            get_tagged(b)?;
            Ok(s)
        })?;
        Ok(Topology {
            epoch,
            subtopologies,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::coordinator::task_assignor::Kind;

    #[test]
    fn streams_group_values_round_trip() {
        let group = StreamsGroupValue {
            epoch: 7,
            metadata_hash: -3,
            validated_topology_epoch: 2,
            assignment_configs: Some(vec![("num.standby.replicas".into(), "1".into())]),
        };
        assert_eq!(StreamsGroupValue::decode(&group.encode()).unwrap(), group);
        let member = StreamsMemberValue {
            instance_id: Some("i".into()),
            rack_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            rebalance_timeout_ms: 300_000,
            topology_epoch: 1,
            process_id: "p".into(),
            user_endpoint: Some(("localhost".into(), 8080)),
            client_tags: vec![("zone".into(), "a".into())],
        };
        assert_eq!(
            StreamsMemberValue::decode(&member.encode()).unwrap(),
            member
        );
        let mut tasks = TaskSet::default();
        tasks.insert(Kind::Active, "0", 2);
        tasks.insert(Kind::Standby, "1", 0);
        assert_eq!(decode_target(&encode_target(&tasks)).unwrap(), tasks);
        let current = StreamsCurrentValue {
            member_epoch: 4,
            previous_member_epoch: 3,
            state: 2,
            assigned: tasks.clone(),
            revoking: TaskSet::default(),
            active_epochs: TaskEpochs::from([(("0".to_string(), 2), 3)]),
        };
        assert_eq!(
            StreamsCurrentValue::decode(&current.encode()).unwrap(),
            current
        );
        let topology = Topology {
            epoch: 0,
            subtopologies: vec![Subtopology {
                id: "0".into(),
                source_topics: vec!["in".into()],
                changelog_topics: vec![TopicInfo {
                    name: "app-store-changelog".into(),
                    configs: vec![("cleanup.policy".into(), "compact".into())],
                    ..TopicInfo::default()
                }],
                copartition_groups: vec![CopartitionGroup {
                    source_topics: vec![0],
                    ..CopartitionGroup::default()
                }],
                ..Subtopology::default()
            }],
        };
        assert_eq!(Topology::decode(&topology.encode()).unwrap(), topology);
    }

    #[test]
    fn the_group_epoch_value_matches_kafkas_layout() {
        let v = StreamsGroupValue {
            epoch: 1,
            metadata_hash: 2,
            validated_topology_epoch: -1,
            assignment_configs: None,
        };
        // version, epoch, hash, no tagged fields.
        assert_eq!(
            &v.encode()[..],
            &[0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0]
        );
    }
}
