//! The records of `__consumer_offsets`, in Kafka's own format, so that
//! Kafka's tooling can read the topic and compaction can key on them.
//!
//! Key version 0/1 is a committed offset (group, topic, partition); key
//! version 2 is a group's metadata (group). A null value is a tombstone.

use bytes::{Buf, BufMut, Bytes, BytesMut};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RecordKey {
    Offset {
        group: String,
        topic: String,
        partition: i32,
    },
    Group {
        group: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetValue {
    pub offset: i64,
    pub leader_epoch: i32,
    pub metadata: String,
    pub commit_timestamp: i64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberValue {
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
pub struct GroupValue {
    pub protocol_type: String,
    pub generation: i32,
    pub protocol: Option<String>,
    pub leader: Option<String>,
    pub current_state_timestamp: i64,
    pub members: Vec<MemberValue>,
}

#[derive(Debug, thiserror::Error)]
#[error("malformed __consumer_offsets record: {0}")]
pub struct RecordError(String);

impl RecordKey {
    pub fn encode(&self) -> Bytes {
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
        }
        b.freeze()
    }

    pub fn decode(mut b: &[u8]) -> Result<RecordKey, RecordError> {
        match get_i16(&mut b)? {
            0 | 1 => Ok(RecordKey::Offset {
                group: get_str(&mut b)?,
                topic: get_str(&mut b)?,
                partition: get_i32(&mut b)?,
            }),
            2 => Ok(RecordKey::Group {
                group: get_str(&mut b)?,
            }),
            v => Err(RecordError(format!("unknown key version {v}"))),
        }
    }
}

impl OffsetValue {
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(3);
        b.put_i64(self.offset);
        b.put_i32(self.leader_epoch);
        put_str(&mut b, &self.metadata);
        b.put_i64(self.commit_timestamp);
        b.freeze()
    }

    pub fn decode(mut b: &[u8]) -> Result<OffsetValue, RecordError> {
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
    pub fn encode(&self) -> Bytes {
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

    pub fn decode(mut b: &[u8]) -> Result<GroupValue, RecordError> {
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

fn need(b: &[u8], n: usize) -> Result<(), RecordError> {
    if b.remaining() < n {
        return Err(RecordError("truncated".into()));
    }
    Ok(())
}

fn get_i16(b: &mut &[u8]) -> Result<i16, RecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, RecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, RecordError> {
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
}
