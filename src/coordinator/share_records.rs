//! The records of `__share_group_state`, in Kafka 4.4's layout: a
//! share-partition's full state (ShareSnapshot, type 0) or what one write
//! changed (ShareUpdate, type 1), keyed by group, topic id and partition.
//! Replaying a key's snapshot and the updates after it gives its state;
//! `combine` merges state batches as Kafka's PersisterStateBatchCombiner
//! does, so a snapshot can be written from the last one and its updates.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use uuid::Uuid;

use super::records::{
    get_compact_len, get_i16, get_i32, get_i64, get_tagged, need, put_uvarint, RecordError,
};
use super::share_partition::{RecordState, StateBatch};

/// (group, topic id, partition).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct ShareKey {
    pub group: String,
    pub topic_id: Uuid,
    pub partition: i32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ShareRecordKey {
    Snapshot(ShareKey),
    Update(ShareKey),
}

/// ShareSnapshotValue and ShareUpdateValue: an update has no state epoch
/// or timestamps, and its start offset -1 means unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ShareStateValue {
    pub snapshot_epoch: i32,
    /// Snapshots only.
    pub state_epoch: i32,
    pub leader_epoch: i32,
    pub start_offset: i64,
    /// Tag 0; -1 when unknown.
    pub delivery_complete_count: i32,
    /// Snapshots only.
    pub create_timestamp: i64,
    pub write_timestamp: i64,
    pub batches: Vec<StateBatch>,
}

impl ShareRecordKey {
    pub(crate) fn encode(&self) -> Bytes {
        let (kind, k) = match self {
            ShareRecordKey::Snapshot(k) => (0, k),
            ShareRecordKey::Update(k) => (1, k),
        };
        let mut b = BytesMut::new();
        b.put_i16(kind);
        b.put_i16(k.group.len() as i16);
        b.put_slice(k.group.as_bytes());
        b.put_slice(k.topic_id.as_bytes());
        b.put_i32(k.partition);
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8]) -> Result<ShareRecordKey, RecordError> {
        let b = &mut b;
        let kind = get_i16(b)?;
        let len = get_i16(b)?.max(0) as usize;
        need(b, len + 16)?;
        let group = String::from_utf8(b[..len].to_vec()).map_err(|e| RecordError(e.to_string()))?;
        b.advance(len);
        let topic_id = Uuid::from_slice(&b[..16]).map_err(|e| RecordError(e.to_string()))?;
        b.advance(16);
        let key = ShareKey {
            group,
            topic_id,
            partition: get_i32(b)?,
        };
        match kind {
            0 => Ok(ShareRecordKey::Snapshot(key)),
            1 => Ok(ShareRecordKey::Update(key)),
            k => Err(RecordError(format!("unknown share state record type {k}"))),
        }
    }
}

impl ShareStateValue {
    /// As a ShareSnapshotValue (`snapshot`) or a ShareUpdateValue.
    pub(crate) fn encode(&self, snapshot: bool) -> Bytes {
        let mut b = BytesMut::new();
        b.put_i16(0);
        b.put_i32(self.snapshot_epoch);
        if snapshot {
            b.put_i32(self.state_epoch);
        }
        b.put_i32(self.leader_epoch);
        b.put_i64(self.start_offset);
        if snapshot {
            b.put_i64(self.create_timestamp);
            b.put_i64(self.write_timestamp);
        }
        put_uvarint(&mut b, self.batches.len() as u64 + 1);
        for s in &self.batches {
            b.put_i64(s.first);
            b.put_i64(s.last);
            b.put_i8(s.state.code());
            b.put_i16(s.delivery_count);
            put_uvarint(&mut b, 0);
        }
        if self.delivery_complete_count != -1 {
            put_uvarint(&mut b, 1);
            put_uvarint(&mut b, 0);
            put_uvarint(&mut b, 4);
            b.put_i32(self.delivery_complete_count);
        } else {
            put_uvarint(&mut b, 0);
        }
        b.freeze()
    }

    pub(crate) fn decode(mut b: &[u8], snapshot: bool) -> Result<ShareStateValue, RecordError> {
        let b = &mut b;
        get_i16(b)?;
        let snapshot_epoch = get_i32(b)?;
        let state_epoch = if snapshot { get_i32(b)? } else { -1 };
        let leader_epoch = get_i32(b)?;
        let start_offset = get_i64(b)?;
        let (create_timestamp, write_timestamp) = match snapshot {
            true => (get_i64(b)?, get_i64(b)?),
            false => (-1, -1),
        };
        let n = get_compact_len(b)?;
        let mut batches = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            let first = get_i64(b)?;
            let last = get_i64(b)?;
            need(b, 1)?;
            let code = b.get_i8();
            let state = RecordState::from_code(code)
                .ok_or_else(|| RecordError(format!("unknown delivery state {code}")))?;
            let delivery_count = get_i16(b)?;
            get_tagged(b)?;
            batches.push(StateBatch {
                first,
                last,
                state,
                delivery_count,
            });
        }
        let mut delivery_complete_count = -1;
        for (tag, mut data) in get_tagged(b)? {
            if tag == 0 {
                delivery_complete_count = get_i32(&mut data)?;
            }
        }
        Ok(ShareStateValue {
            snapshot_epoch,
            state_epoch,
            leader_epoch,
            start_offset,
            delivery_complete_count,
            create_timestamp,
            write_timestamp,
            batches,
        })
    }
}

/// Kafka's PersisterStateBatchCombiner: `newer` over `older`, everything
/// below `start` dropped. Where ranges overlap the higher delivery count
/// wins, then the higher state; neighbours alike are coalesced.
pub(crate) fn combine(older: &[StateBatch], newer: &[StateBatch], start: i64) -> Vec<StateBatch> {
    use std::collections::BTreeMap;
    let mut by_offset: BTreeMap<i64, (i16, i8, RecordState)> = BTreeMap::new();
    for b in older.iter().chain(newer) {
        for o in b.first.max(start)..=b.last {
            let candidate = (b.delivery_count, b.state.code(), b.state);
            by_offset
                .entry(o)
                .and_modify(|cur| {
                    if (candidate.0, candidate.1) > (cur.0, cur.1) {
                        *cur = candidate;
                    }
                })
                .or_insert(candidate);
        }
    }
    let mut out: Vec<StateBatch> = Vec::new();
    for (o, (count, _, state)) in by_offset {
        match out.last_mut() {
            Some(b) if b.last + 1 == o && b.state == state && b.delivery_count == count => {
                b.last = o
            }
            _ => out.push(StateBatch {
                first: o,
                last: o,
                state,
                delivery_count: count,
            }),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(first: i64, last: i64, state: RecordState, delivery_count: i16) -> StateBatch {
        StateBatch {
            first,
            last,
            state,
            delivery_count,
        }
    }

    #[test]
    fn keys_and_values_round_trip() {
        let key = ShareKey {
            group: "g".into(),
            topic_id: Uuid::from_u128(7),
            partition: 3,
        };
        for k in [
            ShareRecordKey::Snapshot(key.clone()),
            ShareRecordKey::Update(key),
        ] {
            assert_eq!(ShareRecordKey::decode(&k.encode()).unwrap(), k);
        }
        let v = ShareStateValue {
            snapshot_epoch: 2,
            state_epoch: 1,
            leader_epoch: 4,
            start_offset: 100,
            delivery_complete_count: 3,
            create_timestamp: 10,
            write_timestamp: 11,
            batches: vec![batch(100, 102, RecordState::Acknowledged, 1)],
        };
        assert_eq!(ShareStateValue::decode(&v.encode(true), true).unwrap(), v);
        let update = ShareStateValue {
            state_epoch: -1,
            create_timestamp: -1,
            write_timestamp: -1,
            delivery_complete_count: -1,
            ..v
        };
        assert_eq!(
            ShareStateValue::decode(&update.encode(false), false).unwrap(),
            update
        );
    }

    #[test]
    fn combining_keeps_the_further_delivered_state_and_drops_what_is_below_the_start() {
        let older = [
            batch(0, 4, RecordState::Available, 1),
            batch(5, 9, RecordState::Acknowledged, 1),
        ];
        let newer = [batch(3, 6, RecordState::Available, 2)];
        assert_eq!(
            combine(&older, &newer, 2),
            vec![
                batch(2, 2, RecordState::Available, 1),
                batch(3, 6, RecordState::Available, 2),
                batch(7, 9, RecordState::Acknowledged, 1),
            ]
        );
    }
}
