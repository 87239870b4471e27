//! The records of `__transaction_state`, in Kafka's format (TransactionLogKey
//! and TransactionLogValue), so that Kafka's tools could read the topic and
//! compaction keys on the transactional id: the newest record per id is that
//! id's whole state.
//!
//! The key is version 0 and the id. The value is written as version 0 (the
//! plain encoding every Kafka release reads) unless it carries what only
//! Kafka 4's flexible version 1 has room for, in tagged fields: the previous
//! and next producer ids and the transaction version (transactions v2).
//! Both are read. A null value is a tombstone: the id expired.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::state::{TxnMetadata, TxnState};

#[derive(Debug, thiserror::Error)]
#[error("malformed __transaction_state record: {0}")]
pub(crate) struct TxnRecordError(String);

/// Encodes TransactionLogKey v0.
pub(crate) fn encode_key(transactional_id: &str) -> Bytes {
    let mut b = BytesMut::with_capacity(4 + transactional_id.len());
    b.put_i16(0);
    b.put_i16(transactional_id.len() as i16);
    b.put_slice(transactional_id.as_bytes());
    b.freeze()
}

pub(crate) fn decode_key(mut b: &[u8]) -> Result<String, TxnRecordError> {
    let version = get_i16(&mut b)?;
    if version != 0 {
        return Err(TxnRecordError(format!("unknown key version {version}")));
    }
    let len = get_i16(&mut b)?;
    take_str(&mut b, len.max(0) as usize)
}

/// TransactionLogValue v1's tagged fields.
const TAG_PREVIOUS_PRODUCER_ID: u64 = 0;
const TAG_NEXT_PRODUCER_ID: u64 = 1;
const TAG_CLIENT_TRANSACTION_VERSION: u64 = 2;

/// Encodes TransactionLogValue from a transaction's metadata: v0, or v1
/// when a tagged field is not at its default.
pub(crate) fn encode_value(m: &TxnMetadata) -> Bytes {
    let mut tagged: Vec<(u64, Vec<u8>)> = Vec::new();
    if m.last_producer_id >= 0 {
        tagged.push((
            TAG_PREVIOUS_PRODUCER_ID,
            m.last_producer_id.to_be_bytes().to_vec(),
        ));
    }
    if m.next_producer_id >= 0 {
        tagged.push((
            TAG_NEXT_PRODUCER_ID,
            m.next_producer_id.to_be_bytes().to_vec(),
        ));
    }
    if m.transaction_version != 0 {
        tagged.push((
            TAG_CLIENT_TRANSACTION_VERSION,
            m.transaction_version.to_be_bytes().to_vec(),
        ));
    }
    let flexible = !tagged.is_empty();
    let mut b = BytesMut::with_capacity(64);
    b.put_i16(if flexible { 1 } else { 0 });
    b.put_i64(m.producer_id);
    b.put_i16(m.producer_epoch);
    b.put_i32(m.timeout_ms);
    b.put_i8(m.state.id());
    let topics = (m.state != TxnState::Empty).then(|| m.partitions_by_topic());
    match (&topics, flexible) {
        (None, false) => b.put_i32(-1),
        (None, true) => put_uvarint(&mut b, 0),
        (Some(t), false) => b.put_i32(t.len() as i32),
        (Some(t), true) => put_uvarint(&mut b, t.len() as u64 + 1),
    }
    for (topic, partitions) in topics.iter().flatten() {
        if flexible {
            put_uvarint(&mut b, topic.len() as u64 + 1);
        } else {
            b.put_i16(topic.len() as i16);
        }
        b.put_slice(topic.as_bytes());
        if flexible {
            put_uvarint(&mut b, partitions.len() as u64 + 1);
        } else {
            b.put_i32(partitions.len() as i32);
        }
        for p in partitions {
            b.put_i32(*p);
        }
        if flexible {
            put_uvarint(&mut b, 0);
        }
    }
    b.put_i64(m.last_update_ms);
    b.put_i64(m.start_ms);
    if flexible {
        put_uvarint(&mut b, tagged.len() as u64);
        for (tag, data) in tagged {
            put_uvarint(&mut b, tag);
            put_uvarint(&mut b, data.len() as u64);
            b.put_slice(&data);
        }
    }
    b.freeze()
}

fn put_uvarint(b: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        b.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    b.put_u8(v as u8);
}

/// Decodes TransactionLogValue v0 or v1.
pub(crate) fn decode_value(mut b: &[u8]) -> Result<TxnMetadata, TxnRecordError> {
    let version = get_i16(&mut b)?;
    let flexible = match version {
        0 => false,
        1 => true,
        v => return Err(TxnRecordError(format!("unknown value version {v}"))),
    };
    let producer_id = get_i64(&mut b)?;
    let producer_epoch = get_i16(&mut b)?;
    let timeout_ms = get_i32(&mut b)?;
    need(b, 1)?;
    let status = b.get_i8();
    let state = TxnState::from_id(status)
        .ok_or_else(|| TxnRecordError(format!("unknown transaction status {status}")))?;
    let count = array_len(&mut b, flexible)?;
    let mut partitions = std::collections::BTreeSet::new();
    for _ in 0..count.unwrap_or(0) {
        let topic = if flexible {
            let len = get_uvarint(&mut b)?;
            take_str(&mut b, len.saturating_sub(1) as usize)?
        } else {
            let len = get_i16(&mut b)?;
            take_str(&mut b, len.max(0) as usize)?
        };
        for _ in 0..array_len(&mut b, flexible)?.unwrap_or(0) {
            partitions.insert((topic.clone(), get_i32(&mut b)?));
        }
        if flexible {
            skip_tagged(&mut b)?;
        }
    }
    let last_update_ms = get_i64(&mut b)?;
    let start_ms = get_i64(&mut b)?;
    let mut m = TxnMetadata {
        producer_id,
        producer_epoch,
        timeout_ms,
        state,
        partitions,
        last_update_ms,
        start_ms,
        ..TxnMetadata::default()
    };
    if flexible {
        for _ in 0..get_uvarint(&mut b)? {
            let tag = get_uvarint(&mut b)?;
            let len = get_uvarint(&mut b)? as usize;
            need(b, len)?;
            let mut data = &b[..len];
            match tag {
                TAG_PREVIOUS_PRODUCER_ID => m.last_producer_id = get_i64(&mut data)?,
                TAG_NEXT_PRODUCER_ID => m.next_producer_id = get_i64(&mut data)?,
                TAG_CLIENT_TRANSACTION_VERSION => m.transaction_version = get_i16(&mut data)?,
                _ => {}
            }
            b.advance(len);
        }
    }
    Ok(m)
}

fn array_len(b: &mut &[u8], flexible: bool) -> Result<Option<usize>, TxnRecordError> {
    if flexible {
        let n = get_uvarint(b)?;
        Ok((n > 0).then(|| (n - 1) as usize))
    } else {
        let n = get_i32(b)?;
        Ok((n >= 0).then_some(n as usize))
    }
}

fn skip_tagged(b: &mut &[u8]) -> Result<(), TxnRecordError> {
    for _ in 0..get_uvarint(b)? {
        let _tag = get_uvarint(b)?;
        let len = get_uvarint(b)? as usize;
        need(b, len)?;
        b.advance(len);
    }
    Ok(())
}

fn need(b: &[u8], n: usize) -> Result<(), TxnRecordError> {
    if b.len() < n {
        return Err(TxnRecordError("truncated".into()));
    }
    Ok(())
}

fn get_i16(b: &mut &[u8]) -> Result<i16, TxnRecordError> {
    need(b, 2)?;
    Ok(b.get_i16())
}

fn get_i32(b: &mut &[u8]) -> Result<i32, TxnRecordError> {
    need(b, 4)?;
    Ok(b.get_i32())
}

fn get_i64(b: &mut &[u8]) -> Result<i64, TxnRecordError> {
    need(b, 8)?;
    Ok(b.get_i64())
}

fn get_uvarint(b: &mut &[u8]) -> Result<u64, TxnRecordError> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        need(b, 1)?;
        let byte = b.get_u8();
        v |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(TxnRecordError("varint too long".into()))
}

fn take_str(b: &mut &[u8], len: usize) -> Result<String, TxnRecordError> {
    need(b, len)?;
    let s = std::str::from_utf8(&b[..len])
        .map_err(|e| TxnRecordError(e.to_string()))?
        .to_string();
    b.advance(len);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_version_zero_and_the_id() {
        let k = encode_key("tx-1");
        assert_eq!(&k[..], &[0, 0, 0, 4, b't', b'x', b'-', b'1']);
        assert_eq!(decode_key(&k).unwrap(), "tx-1");
        assert!(decode_key(&[0, 1, 0, 0]).is_err());
    }

    #[test]
    fn values_round_trip_with_their_partitions() {
        let mut m = TxnMetadata {
            producer_id: 42,
            producer_epoch: 3,
            timeout_ms: 60_000,
            state: TxnState::PrepareCommit,
            last_update_ms: 1_700_000_000_500,
            start_ms: 1_700_000_000_000,
            ..TxnMetadata::default()
        };
        m.partitions.insert(("b".into(), 1));
        m.partitions.insert(("a".into(), 0));
        m.partitions.insert(("a".into(), 2));
        let v = encode_value(&m);
        let back = decode_value(&v).unwrap();
        assert_eq!(back.producer_id, 42);
        assert_eq!(back.producer_epoch, 3);
        assert_eq!(back.timeout_ms, 60_000);
        assert_eq!(back.state, TxnState::PrepareCommit);
        assert_eq!(back.partitions, m.partitions);
        assert_eq!(
            (back.last_update_ms, back.start_ms),
            (m.last_update_ms, m.start_ms)
        );
    }

    #[test]
    fn an_empty_transaction_has_null_partitions_as_kafka_writes_it() {
        let m = TxnMetadata {
            producer_id: 7,
            state: TxnState::Empty,
            ..TxnMetadata::default()
        };
        let v = encode_value(&m);
        // version, producer id, epoch, timeout, status, then the null array.
        assert_eq!(&v[17..21], &(-1i32).to_be_bytes());
        assert!(decode_value(&v).unwrap().partitions.is_empty());
    }

    #[test]
    fn kafka_4_flexible_values_are_read() {
        // TransactionLogValue v1: compact arrays and strings, tagged fields.
        let mut b = BytesMut::new();
        b.put_i16(1);
        b.put_i64(9);
        b.put_i16(2);
        b.put_i32(30_000);
        b.put_i8(1); // Ongoing
        b.put_u8(2); // one topic
        b.put_u8(4); // "top"
        b.put_slice(b"top");
        b.put_u8(3); // two partitions
        b.put_i32(0);
        b.put_i32(5);
        b.put_u8(0); // no tagged fields in the topic
        b.put_i64(200);
        b.put_i64(100);
        b.put_u8(1); // one tagged field: PreviousProducerId
        b.put_u8(0);
        b.put_u8(8);
        b.put_i64(8);
        let m = decode_value(&b).unwrap();
        assert_eq!(
            (m.producer_id, m.producer_epoch, m.state),
            (9, 2, TxnState::Ongoing)
        );
        assert_eq!(m.partitions.len(), 2);
        assert!(m.partitions.contains(&("top".to_string(), 5)));
        assert_eq!((m.last_update_ms, m.start_ms), (200, 100));
    }

    #[test]
    fn transactions_v2_fields_are_written_as_v1_tagged_fields_and_read_back() {
        let mut m = TxnMetadata {
            producer_id: 42,
            producer_epoch: i16::MAX,
            last_producer_id: 41,
            next_producer_id: 43,
            transaction_version: 2,
            state: TxnState::PrepareCommit,
            start_ms: 5,
            last_update_ms: 6,
            ..TxnMetadata::default()
        };
        m.partitions.insert(("a".into(), 3));
        let v = encode_value(&m);
        assert_eq!(&v[..2], &1i16.to_be_bytes());
        let back = decode_value(&v).unwrap();
        assert_eq!(
            (
                back.last_producer_id,
                back.next_producer_id,
                back.transaction_version
            ),
            (41, 43, 2)
        );
        assert_eq!(back.partitions, m.partitions);
        assert_eq!(
            (back.producer_epoch, back.start_ms, back.last_update_ms),
            (i16::MAX, 5, 6)
        );
        m.state = TxnState::Empty;
        assert!(decode_value(&encode_value(&m))
            .unwrap()
            .partitions
            .is_empty());
    }

    #[test]
    fn truncated_values_are_errors_not_panics() {
        for m in [
            TxnMetadata::default(),
            TxnMetadata {
                transaction_version: 2,
                state: TxnState::Ongoing,
                partitions: [("t".to_string(), 1)].into(),
                ..TxnMetadata::default()
            },
        ] {
            let v = encode_value(&m);
            for cut in 0..v.len() {
                assert!(decode_value(&v[..cut]).is_err(), "cut at {cut}");
            }
        }
    }
}
