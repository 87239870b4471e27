//! The records of `__consumer_offsets`, in Kafka's own format, so that
//! Kafka's tooling can read the topic and compaction can key on them.
//!
//! Key version 0/1 is a committed offset (group, topic, partition); key
//! version 2 is a classic group's metadata (group). Versions 3 to 8 are the
//! records of a consumer-protocol (KIP-848) group: its epoch (3), partition
//! metadata (4, only read: the metadata hash in 3 replaces it, as in Kafka
//! 4.1), each member's subscription (5), the target assignment's epoch (6)
//! and per-member target (7), and each member's current assignment (8).
//! Their values use Kafka's flexible encoding (compact strings and arrays,
//! tagged fields). A null value is a tombstone. Versions 17 and 19 to 23
//! are a Streams group's (KIP-1071), whose values `streams_records` codes.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group {
        group: String,
    },
    ConsumerGroup {
        group: String,
    },
    ConsumerPartitionMetadata {
        group: String,
    },
    ConsumerMember {
        group: String,
        member: String,
    },
    TargetAssignment {
        group: String,
    },
    TargetMember {
        group: String,
        member: String,
    },
    CurrentAssignment {
        group: String,
        member: String,
    },
    /// ShareGroupMetadata (key 11): the group's epoch.
    ShareGroup {
        group: String,
    },
    StreamsGroup {
        group: String,
    },
    StreamsMember {
        group: String,
        member: String,
    },
    StreamsTargetAssignment {
        group: String,
    },
    StreamsTargetMember {
        group: String,
        member: String,
    },
    StreamsCurrentAssignment {
        group: String,
        member: String,
    },
    StreamsTopology {
        group: String,
    },
}

/// Partitions by topic id, as the consumer-group records hold them.
pub(crate) type TopicPartitions = Vec<(Uuid, Vec<i32>)>;

/// ConsumerGroupMetadataValue (key 3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ConsumerGroupValue {
    pub epoch: i32,
    /// Of the subscribed topics' names, ids and partition counts (tag 0).
    pub metadata_hash: i64,
}

/// ConsumerGroupMemberMetadataValue (key 5).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ConsumerMemberValue {
    pub instance_id: Option<String>,
    pub rack_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub subscribed_topic_names: Vec<String>,
    pub subscribed_topic_regex: Option<String>,
    pub rebalance_timeout_ms: i32,
    pub server_assignor: Option<String>,
    /// Set for a member that speaks the classic protocol (tag 0).
    pub classic: Option<ClassicMemberMetadata>,
}

/// What a classic member of a consumer group joined with: its session
/// timeout and its (protocol name, metadata) pairs, in preference order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct ClassicMemberMetadata {
    pub session_timeout_ms: i32,
    pub protocols: Vec<(String, Bytes)>,
}

impl ClassicMemberMetadata {
    fn encode(&self, b: &mut BytesMut) {
        b.put_i32(self.session_timeout_ms);
        put_uvarint(b, self.protocols.len() as u64 + 1);
        for (name, metadata) in &self.protocols {
            put_compact_opt_str(b, Some(name));
            put_uvarint(b, metadata.len() as u64 + 1);
            b.put_slice(metadata);
            put_uvarint(b, 0);
        }
        put_uvarint(b, 0);
    }

    fn decode(b: &mut &[u8]) -> Result<ClassicMemberMetadata, RecordError> {
        let session_timeout_ms = get_i32(b)?;
        let count = get_compact_len(b)?;
        let mut protocols = Vec::with_capacity(count.min(64));
        for _ in 0..count {
            let name = get_compact_opt_str(b)?.unwrap_or_default();
            let len = get_compact_len(b)?;
            need(b, len)?;
            let metadata = Bytes::copy_from_slice(&b[..len]);
            b.advance(len);
            get_tagged(b)?;
            protocols.push((name, metadata));
        }
        get_tagged(b)?;
        Ok(ClassicMemberMetadata {
            session_timeout_ms,
            protocols,
        })
    }
}

/// ConsumerGroupCurrentMemberAssignmentValue (key 8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CurrentAssignmentValue {
    pub member_epoch: i32,
    pub previous_member_epoch: i32,
    /// Kafka's MemberState: 0 stable, 1 unrevoked, 2 unreleased partitions.
    pub state: i8,
    pub assigned: TopicPartitions,
    pub revoking: TopicPartitions,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct MemberValue {
    pub member_id: String,
    pub group_instance_id: Option<String>,
    pub client_id: String,
    pub client_host: String,
    pub rebalance_timeout_ms: i32,
    pub session_timeout_ms: i32,
    pub subscription: Bytes,
    pub assignment: Bytes,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp: i64,
    pub members: Vec<MemberValue>,
}

#[derive(Debug, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub(crate) struct RecordError(pub(super) String);

impl RecordKey {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        match self {
            RecordKey::Offset {
                group,
                topic,
                partition,
            } => {
                b.put_i16(1);
                put_str(&mut b, group);
                put_str(&mut b, topic);
                b.put_i32(*partition);
            }
            RecordKey::Group { group } => {
                b.put_i16(2);
                put_str(&mut b, group);
            }
            RecordKey::ConsumerGroup { group } => {
                b.put_i16(3);
                put_str(&mut b, group);
            }
            RecordKey::ConsumerPartitionMetadata { group } => {
                b.put_i16(4);
                put_str(&mut b, group);
            }
            RecordKey::ConsumerMember { group, member } => {
                b.put_i16(5);
                put_str(&mut b, group);
                put_str(&mut b, member);
            }
            RecordKey::TargetAssignment { group } => {
                b.put_i16(6);
                put_str(&mut b, group);
            }
            RecordKey::TargetMember { group, member } => {
                b.put_i16(7);
                put_str(&mut b, group);
                put_str(&mut b, member);
            }
            RecordKey::CurrentAssignment { group, member } => {
                b.put_i16(8);
                put_str(&mut b, group);
                put_str(&mut b, member);
            }
            RecordKey::ShareGroup { group } => {
                b.put_i16(11);
                put_str(&mut b, group);
            }
            RecordKey::StreamsGroup { group }
            | RecordKey::StreamsTargetAssignment { group }
            | RecordKey::StreamsTopology { group } => {
                b.put_i16(match self {
                    RecordKey::StreamsGroup { .. } => 17,
                    RecordKey::StreamsTargetAssignment { .. } => 20,
                    _ => 23,
                });
                put_str(&mut b, group);
            }
            RecordKey::StreamsMember { group, member }
            | RecordKey::StreamsTargetMember { group, member }
            | RecordKey::StreamsCurrentAssignment { group, member } => {
                b.put_i16(match self {
                    RecordKey::StreamsMember { .. } => 19,
                    RecordKey::StreamsTargetMember { .. } => 21,
                    _ => 22,
                });
                put_str(&mut b, group);
                put_str(&mut b, member);
            }
        }
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<RecordKey, RecordError> {
        match get_i16(&mut b)? {
            0 | 1 => Ok(RecordKey::Offset {
                group: get_str(&mut b)?,
                topic: get_str(&mut b)?,
                partition: get_i32(&mut b)?,
            }),
            2 => Ok(RecordKey::Group {
                group: get_str(&mut b)?,
            }),
            3 => Ok(RecordKey::ConsumerGroup {
                group: get_str(&mut b)?,
            }),
            4 => Ok(RecordKey::ConsumerPartitionMetadata {
                group: get_str(&mut b)?,
            }),
            6 => Ok(RecordKey::TargetAssignment {
                group: get_str(&mut b)?,
            }),
            v @ (5 | 7 | 8) => {
                let group = get_str(&mut b)?;
                let member = get_str(&mut b)?;
                Ok(match v {
                    5 => RecordKey::ConsumerMember { group, member },
                    7 => RecordKey::TargetMember { group, member },
                    _ => RecordKey::CurrentAssignment { group, member },
                })
            }
            11 => Ok(RecordKey::ShareGroup {
                group: get_str(&mut b)?,
            }),
            v @ (17 | 20 | 23) => {
                let group = get_str(&mut b)?;
                Ok(match v {
                    17 => RecordKey::StreamsGroup { group },
                    20 => RecordKey::StreamsTargetAssignment { group },
                    _ => RecordKey::StreamsTopology { group },
                })
            }
            v @ (19 | 21 | 22) => {
                let group = get_str(&mut b)?;
                let member = get_str(&mut b)?;
                Ok(match v {
                    19 => RecordKey::StreamsMember { group, member },
                    21 => RecordKey::StreamsTargetMember { group, member },
                    _ => RecordKey::StreamsCurrentAssignment { group, member },
                })
            }
            v => Err(RecordError(format!("unknown key version {v}"))),
        }
    }
}

impl OffsetValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(3);
        b.put_i64(self.offset);
        b.put_i32(self.leader_epoch);
        put_str(&mut b, &self.metadata);
        b.put_i64(self.commit_timestamp);
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<OffsetValue, RecordError> {
        let version = get_i16(&mut b)?;
        let offset = get_i64(&mut b)?;
        let leader_epoch = if version >= 3 { get_i32(&mut b)? } else { -1 };
        let metadata = get_str(&mut b)?;
        let commit_timestamp = get_i64(&mut b)?;
        if version == 1 {
            get_i64(&mut b)?; // expire timestamp, unused since Kafka 2.1
        }
        Ok(OffsetValue {
            offset,
            leader_epoch,
            metadata,
            commit_timestamp,
        })
    }
}

impl GroupValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(3);
        put_str(&mut b, &self.protocol_type);
        b.put_i32(self.generation);
        put_opt_str(&mut b, self.protocol.as_deref());
        put_opt_str(&mut b, self.leader.as_deref());
        b.put_i64(self.current_state_timestamp);
        b.put_i32(self.members.len() as i32);
        for m in &self.members {
            put_str(&mut b, &m.member_id);
            put_opt_str(&mut b, m.group_instance_id.as_deref());
            put_str(&mut b, &m.client_id);
            put_str(&mut b, &m.client_host);
            b.put_i32(m.rebalance_timeout_ms);
            b.put_i32(m.session_timeout_ms);
            put_bytes(&mut b, &m.subscription);
            put_bytes(&mut b, &m.assignment);
        }
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<GroupValue, RecordError> {
        let version = get_i16(&mut b)?;
        let protocol_type = get_str(&mut b)?;
        let generation = get_i32(&mut b)?;
        let protocol = get_opt_str(&mut b)?;
        let leader = get_opt_str(&mut b)?;
        let current_state_timestamp = if version >= 2 { get_i64(&mut b)? } else { -1 };
        let count = get_i32(&mut b)?;
        let mut members = Vec::new();
        for _ in 0..count.max(0) {
            let member_id = get_str(&mut b)?;
            let group_instance_id = if version >= 3 {
                get_opt_str(&mut b)?
            } else {
                None
            };
            let client_id = get_str(&mut b)?;
            let client_host = get_str(&mut b)?;
            let session_timeout_ms;
            let rebalance_timeout_ms;
            if version >= 1 {
                rebalance_timeout_ms = get_i32(&mut b)?;
                session_timeout_ms = get_i32(&mut b)?;
            } else {
                session_timeout_ms = get_i32(&mut b)?;
                rebalance_timeout_ms = session_timeout_ms;
            }
            let subscription = get_bytes(&mut b)?;
            let assignment = get_bytes(&mut b)?;
            members.push(MemberValue {
                member_id,
                group_instance_id,
                client_id,
                client_host,
                rebalance_timeout_ms,
                session_timeout_ms,
                subscription,
                assignment,
            });
        }
        Ok(GroupValue {
            protocol_type,
            generation,
            protocol,
            leader,
            current_state_timestamp,
            members,
        })
    }
}

impl ConsumerGroupValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(self.epoch);
        if self.metadata_hash != 0 {
            put_uvarint(&mut b, 1);
            put_uvarint(&mut b, 0);
            put_uvarint(&mut b, 8);
            b.put_i64(self.metadata_hash);
        } else {
            put_uvarint(&mut b, 0);
        }
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<ConsumerGroupValue, RecordError> {
        get_i16(&mut b)?;
        let epoch = get_i32(&mut b)?;
        let mut metadata_hash = 0;
        for (tag, mut data) in get_tagged(&mut b)? {
            if tag == 0 {
                metadata_hash = get_i64(&mut data)?;
            }
        }
        Ok(ConsumerGroupValue {
            epoch,
            metadata_hash,
        })
    }
}

impl ConsumerMemberValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        put_compact_opt_str(&mut b, self.instance_id.as_deref());
        put_compact_opt_str(&mut b, self.rack_id.as_deref());
        put_compact_opt_str(&mut b, Some(&self.client_id));
        put_compact_opt_str(&mut b, Some(&self.client_host));
        put_uvarint(&mut b, self.subscribed_topic_names.len() as u64 + 1);
        for t in &self.subscribed_topic_names {
            put_compact_opt_str(&mut b, Some(t));
        }
        put_compact_opt_str(&mut b, self.subscribed_topic_regex.as_deref());
        b.put_i32(self.rebalance_timeout_ms);
        put_compact_opt_str(&mut b, self.server_assignor.as_deref());
        match &self.classic {
            Some(c) => {
                let mut tagged = BytesMut::new();
                c.encode(&mut tagged);
                put_uvarint(&mut b, 1);
                put_uvarint(&mut b, 0);
                put_uvarint(&mut b, tagged.len() as u64);
                b.put_slice(&tagged);
            }
            None => put_uvarint(&mut b, 0),
        }
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<ConsumerMemberValue, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let instance_id = get_compact_opt_str(b)?;
        let rack_id = get_compact_opt_str(b)?;
        let client_id = get_compact_opt_str(b)?.unwrap_or_default();
        let client_host = get_compact_opt_str(b)?.unwrap_or_default();
        let count = get_compact_len(b)?;
        let mut subscribed_topic_names = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            subscribed_topic_names.push(get_compact_opt_str(b)?.unwrap_or_default());
        }
        let subscribed_topic_regex = get_compact_opt_str(b)?;
        let rebalance_timeout_ms = get_i32(b)?;
        let server_assignor = get_compact_opt_str(b)?;
        let mut classic = None;
        for (tag, mut data) in get_tagged(b)? {
            if tag == 0 {
                classic = Some(ClassicMemberMetadata::decode(&mut data)?);
            }
        }
        Ok(ConsumerMemberValue {
            classic,
            instance_id,
            rack_id,
            client_id,
            client_host,
            subscribed_topic_names,
            subscribed_topic_regex,
            rebalance_timeout_ms,
            server_assignor,
        })
    }
}

/// ConsumerGroupTargetAssignmentMetadataValue (key 6): the assignment epoch.
pub(crate) fn encode_assignment_epoch(epoch: i32) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    b.put_i32(epoch);
    put_uvarint(&mut b, 0);
    b.freeze()
}

pub(crate) fn decode_assignment_epoch(mut b: &[u8]) -> Result<i32, RecordError> {
    get_i16(&mut b)?;
    get_i32(&mut b)
}

/// ConsumerGroupTargetAssignmentMemberValue (key 7).
pub(crate) fn encode_target(partitions: &TopicPartitions) -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    put_topic_partitions(&mut b, partitions);
    put_uvarint(&mut b, 0);
    b.freeze()
}

pub(crate) fn decode_target(mut b: &[u8]) -> Result<TopicPartitions, RecordError> {
    get_i16(&mut b)?;
    get_topic_partitions(&mut b)
}

impl CurrentAssignmentValue {
    pub(crate) fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(self.member_epoch);
        b.put_i32(self.previous_member_epoch);
        b.put_i8(self.state);
        put_topic_partitions(&mut b, &self.assigned);
        put_topic_partitions(&mut b, &self.revoking);
        put_uvarint(&mut b, 0);
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<CurrentAssignmentValue, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let member_epoch = get_i32(b)?;
        let previous_member_epoch = get_i32(b)?;
        need(b, 1)?;
        let state = b.get_i8();
        let assigned = get_topic_partitions(b)?;
        let revoking = get_topic_partitions(b)?;
        Ok(CurrentAssignmentValue {
            member_epoch,
            previous_member_epoch,
            state,
            assigned,
            revoking,
        })
    }
}

/// `[]TopicPartitions{TopicId uuid, Partitions []int32}`, compact, with
/// empty tagged fields per entry.
fn put_topic_partitions(b: &mut BytesMut, tps: &TopicPartitions) {
    put_uvarint(b, tps.len() as u64 + 1);
    for (id, parts) in tps {
        b.put_slice(id.as_bytes());
        put_uvarint(b, parts.len() as u64 + 1);
        for p in parts {
            b.put_i32(*p);
        }
        put_uvarint(b, 0);
    }
}

fn get_topic_partitions(b: &mut &[u8]) -> Result<TopicPartitions, RecordError> {
    let count = get_compact_len(b)?;
    let mut out = Vec::with_capacity(count.min(1024));
    for _ in 0..count {
        need(b, 16)?;
        let id = Uuid::from_slice(&b[..16]).map_err(|e| RecordError(e.to_string()))?;
        b.advance(16);
        let n = get_compact_len(b)?;
        let mut parts = Vec::with_capacity(n.min(1 << 16));
        for _ in 0..n {
            parts.push(get_i32(b)?);
        }
        get_tagged(b)?;
        out.push((id, parts));
    }
    Ok(out)
}

pub(super) fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

pub(super) fn get_uvarint(b: &mut &[u8]) -> Result<u64, RecordError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        need(b, 1)?;
        let byte = b.get_u8();
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(RecordError("varint too long".into()))
}

/// A compact array or string length: the stored value minus one; a null
/// (stored 0) reads as empty.
pub(super) fn get_compact_len(b: &mut &[u8]) -> Result<usize, RecordError> {
    Ok(get_uvarint(b)?.saturating_sub(1) as usize)
}

pub(super) fn put_compact_opt_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => {
            put_uvarint(b, s.len() as u64 + 1);
            b.put_slice(s.as_bytes());
        }
        None => put_uvarint(b, 0),
    }
}

pub(super) fn get_compact_opt_str(b: &mut &[u8]) -> Result<Option<String>, RecordError> {
    let len = get_uvarint(b)?;
    if len == 0 {
        return Ok(None);
    }
    let len = (len - 1) as usize;
    need(b, len)?;
    let s = String::from_utf8(b[..len].to_vec()).map_err(|e| RecordError(e.to_string()))?;
    b.advance(len);
    Ok(Some(s))
}

/// A tagged-fields section: (tag, data) pairs.
pub(super) fn get_tagged<'a>(b: &mut &'a [u8]) -> Result<Vec<(u64, &'a [u8])>, RecordError> {
    let count = get_uvarint(b)?;
    let mut out = Vec::new();
    for _ in 0..count {
        let tag = get_uvarint(b)?;
        let size = get_uvarint(b)? as usize;
        need(b, size)?;
        out.push((tag, &b[..size]));
        b.advance(size);
    }
    Ok(out)
}

fn put_str(b: &mut BytesMut, s: &str) {
    b.put_i16(s.len() as i16);
    b.put_slice(s.as_bytes());
}

fn put_opt_str(b: &mut BytesMut, s: Option<&str>) {
    match s {
        Some(s) => put_str(b, s),
        None => b.put_i16(-1),
    }
}

fn put_bytes(b: &mut BytesMut, v: &[u8]) {
    b.put_i32(v.len() as i32);
    b.put_slice(v);
}

pub(super) fn need(b: &[u8], n: usize) -> Result<(), RecordError> {
    if b.remaining() < n {
        return Err(RecordError("truncated".into()));
    }
    Ok(())
}

pub(super) fn get_i16(b: &mut &[u8]) -> Result<i16, RecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

pub(super) fn get_i32(b: &mut &[u8]) -> Result<i32, RecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

pub(super) fn get_i64(b: &mut &[u8]) -> Result<i64, RecordError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn get_opt_str(b: &mut &[u8]) -> Result<Option<String>, RecordError> {
    let len = get_i16(b)?;
    if len < 0 {
        return Ok(None);
    }
    need(b, len as usize)?;
    let s =
        String::from_utf8(b[..len as usize].to_vec()).map_err(|e| RecordError(e.to_string()))?;
    b.advance(len as usize);
    Ok(Some(s))
}

fn get_str(b: &mut &[u8]) -> Result<String, RecordError> {
    Ok(get_opt_str(b)?.unwrap_or_default())
}

fn get_bytes(b: &mut &[u8]) -> Result<Bytes, RecordError> {
    let len = get_i32(b)?;
    if len < 0 {
        return Ok(Bytes::new());
    }
    need(b, len as usize)?;
    let v = Bytes::copy_from_slice(&b[..len as usize]);
    b.advance(len as usize);
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_round_trip() {
        let k = RecordKey::Offset {
            group: "g".into(),
            topic: "t".into(),
            partition: 3,
        };
        assert_eq!(RecordKey::decode(&k.encode()).unwrap(), k);
        let k = RecordKey::Group { group: "g".into() };
        assert_eq!(RecordKey::decode(&k.encode()).unwrap(), k);
        let v = OffsetValue {
            offset: 42,
            leader_epoch: 0,
            metadata: "meta".into(),
            commit_timestamp: 7,
        };
        assert_eq!(OffsetValue::decode(&v.encode()).unwrap(), v);
        let g = GroupValue {
            protocol_type: "consumer".into(),
            generation: 5,
            protocol: Some("range".into()),
            leader: Some("m1".into()),
            current_state_timestamp: 9,
            members: vec![MemberValue {
                member_id: "m1".into(),
                group_instance_id: Some("i1".into()),
                client_id: "c".into(),
                client_host: "/127.0.0.1".into(),
                rebalance_timeout_ms: 300000,
                session_timeout_ms: 45000,
                subscription: Bytes::from_static(b"sub"),
                assignment: Bytes::from_static(b"asg"),
            }],
        };
        assert_eq!(GroupValue::decode(&g.encode()).unwrap(), g);
        assert!(RecordKey::decode(&[0, 9]).is_err());
    }

    #[test]
    fn consumer_group_records_round_trip() {
        for k in [
            RecordKey::ConsumerGroup { group: "g".into() },
            RecordKey::ConsumerPartitionMetadata { group: "g".into() },
            RecordKey::TargetAssignment { group: "g".into() },
            RecordKey::ConsumerMember {
                group: "g".into(),
                member: "m".into(),
            },
            RecordKey::TargetMember {
                group: "g".into(),
                member: "m".into(),
            },
            RecordKey::CurrentAssignment {
                group: "g".into(),
                member: "m".into(),
            },
        ] {
            assert_eq!(RecordKey::decode(&k.encode()).unwrap(), k);
        }
        for hash in [0, -5] {
            let v = ConsumerGroupValue {
                epoch: 7,
                metadata_hash: hash,
            };
            assert_eq!(ConsumerGroupValue::decode(&v.encode()).unwrap(), v);
        }
        let m = ConsumerMemberValue {
            instance_id: Some("i".into()),
            rack_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            subscribed_topic_names: vec!["a".into(), "b".into()],
            subscribed_topic_regex: Some("t.*".into()),
            rebalance_timeout_ms: 300_000,
            server_assignor: Some("range".into()),
            classic: None,
        };
        assert_eq!(ConsumerMemberValue::decode(&m.encode()).unwrap(), m);
        // A classic member's protocols ride in tag 0.
        let classic = ConsumerMemberValue {
            classic: Some(ClassicMemberMetadata {
                session_timeout_ms: 45_000,
                protocols: vec![
                    ("range".into(), Bytes::from_static(b"\x00\x03sub")),
                    ("cooperative-sticky".into(), Bytes::new()),
                ],
            }),
            ..m.clone()
        };
        let encoded = classic.encode();
        assert_eq!(ConsumerMemberValue::decode(&encoded).unwrap(), classic);
        assert_eq!(
            &encoded[..m.encode().len() - 1],
            &m.encode()[..m.encode().len() - 1]
        );
        let id = Uuid::from_u128(42);
        let tps = vec![(id, vec![0, 2]), (Uuid::from_u128(7), vec![])];
        assert_eq!(decode_target(&encode_target(&tps)).unwrap(), tps);
        assert_eq!(
            decode_assignment_epoch(&encode_assignment_epoch(9)).unwrap(),
            9
        );
        let c = CurrentAssignmentValue {
            member_epoch: 3,
            previous_member_epoch: 2,
            state: 1,
            assigned: vec![(id, vec![1])],
            revoking: vec![(id, vec![0])],
        };
        assert_eq!(CurrentAssignmentValue::decode(&c.encode()).unwrap(), c);
    }

    #[test]
    fn consumer_group_epoch_value_matches_kafkas_layout() {
        // Version 0, epoch 5, no tagged fields.
        let v = ConsumerGroupValue {
            epoch: 5,
            metadata_hash: 0,
        };
        assert_eq!(&v.encode()[..], &[0, 0, 0, 0, 0, 5, 0]);
        // Key: type 3, then the group id as an int16-length string.
        let k = RecordKey::ConsumerGroup { group: "ab".into() };
        assert_eq!(&k.encode()[..], &[0, 3, 0, 2, b'a', b'b']);
    }
}
