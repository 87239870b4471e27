//! Transaction markers: the control batches that end a transaction, and the
//! aborted-transaction entries a partition keeps for read_committed readers.
//!
//! A marker is Kafka's control batch: attributes transactional|control, the
//! producer's id and epoch, base sequence -1, one record whose key is
//! (version i16 0, type i16: 0 abort, 1 commit) and whose value is (version
//! i16 0, coordinator epoch i32). Every client recognises it by these bytes
//! and skips it, so the broker writes exactly them.

use bytes::BufMut;
use serde::{Deserialize, Serialize};

use super::batch::{compute_crc, BatchHeader, CRC_OFFSET, HEADER_LEN, LOG_OVERHEAD};
use super::FormatError;

const TRANSACTIONAL_BIT: i16 = 1 << 4;
const CONTROL_BIT: i16 = 1 << 5;
const ABORT: i16 = 0;
const COMMIT: i16 = 1;

/// The end of a transaction, as its marker says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EndTxnMarker {
    pub commit: bool,
    pub coordinator_epoch: i32,
}

/// One aborted transaction of a partition, as Fetch reports it to
/// read_committed consumers: its data lies in `first_offset..last_offset`,
/// `last_offset` being its ABORT marker. `last_stable_offset` is the
/// partition's LSO right after the marker: LSOs only grow, so a reader
/// looking for transactions below some offset can stop at the first entry
/// whose LSO reaches it (no later entry can start below it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct AbortedTxn {
    pub producer_id: i64,
    pub first_offset: i64,
    pub last_offset: i64,
    pub last_stable_offset: i64,
}

/// Adds to `out` the entries of `lists` (per segment, in offset order,
/// starting with the segment holding `from`) of transactions that overlap
/// `from..upper`: aborted at or after `from`, begun before `upper`. Returns
/// whether it is complete: an entry whose LSO reaches `upper` shows that no
/// later transaction began below it.
pub(crate) fn collect_aborted<'a>(
    lists: impl IntoIterator<Item = &'a [AbortedTxn]>,
    from: i64,
    upper: i64,
    out: &mut Vec<AbortedTxn>,
) -> bool {
    for list in lists {
        for a in list {
            if a.last_offset >= from && a.first_offset < upper {
                out.push(*a);
            }
            if a.last_stable_offset >= upper {
                return true;
            }
        }
    }
    false
}

fn put_varint(out: &mut Vec<u8>, v: i64) {
    let mut z = ((v << 1) ^ (v >> 63)) as u64;
    while z >= 0x80 {
        out.push((z as u8 & 0x7f) | 0x80);
        z >>= 7;
    }
    out.push(z as u8);
}

/// Encodes the marker batch at base offset 0 (the log stamps the offset).
pub(crate) fn encode_marker(
    producer_id: i64,
    producer_epoch: i16,
    marker: EndTxnMarker,
    timestamp: i64,
) -> Vec<u8> {
    let mut key = Vec::with_capacity(4);
    key.put_i16(0);
    key.put_i16(if marker.commit { COMMIT } else { ABORT });
    let mut value = Vec::with_capacity(6);
    value.put_i16(0);
    value.put_i32(marker.coordinator_epoch);
    let mut body = Vec::with_capacity(16);
    body.push(0); // record attributes
    put_varint(&mut body, 0); // timestamp delta
    put_varint(&mut body, 0); // offset delta
    put_varint(&mut body, key.len() as i64);
    body.extend_from_slice(&key);
    put_varint(&mut body, value.len() as i64);
    body.extend_from_slice(&value);
    put_varint(&mut body, 0); // headers
    let mut record = Vec::with_capacity(body.len() + 1);
    put_varint(&mut record, body.len() as i64);
    record.extend_from_slice(&body);

    let mut b = Vec::with_capacity(HEADER_LEN + record.len());
    b.put_i64(0);
    b.put_i32((HEADER_LEN - LOG_OVERHEAD + record.len()) as i32);
    b.put_i32(-1);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(TRANSACTIONAL_BIT | CONTROL_BIT);
    b.put_i32(0);
    b.put_i64(timestamp);
    b.put_i64(timestamp);
    b.put_i64(producer_id);
    b.put_i16(producer_epoch);
    b.put_i32(-1);
    b.put_i32(1);
    b.extend_from_slice(&record);
    let crc = compute_crc(&b);
    (&mut b[CRC_OFFSET..CRC_OFFSET + 4]).put_u32(crc);
    b
}

/// The marker a control batch holds; `None` for a batch that is not a
/// control batch or a control batch of another type (Kafka has others).
pub(crate) fn parse_marker(batch: &[u8]) -> Result<Option<EndTxnMarker>, FormatError> {
    let header = BatchHeader::parse(batch)?
        .ok_or_else(|| FormatError::Corrupt("truncated control batch".into()))?;
    if !header.is_control() {
        return Ok(None);
    }
    let area = &batch[HEADER_LEN..header.size.min(batch.len())];
    let (key, value) = first_record(area)
        .ok_or_else(|| FormatError::Corrupt("undecodable control record".into()))?;
    if key.len() < 4 {
        return Err(FormatError::Corrupt("control record key too short".into()));
    }
    let commit = match i16::from_be_bytes([key[2], key[3]]) {
        COMMIT => true,
        ABORT => false,
        _ => return Ok(None),
    };
    let coordinator_epoch = match value {
        [_, _, a, b, c, d, ..] => i32::from_be_bytes([*a, *b, *c, *d]),
        _ => return Err(FormatError::Corrupt("marker value too short".into())),
    };
    Ok(Some(EndTxnMarker {
        commit,
        coordinator_epoch,
    }))
}

/// Key and value of the first record in an uncompressed record area.
fn first_record(area: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut pos = 0;
    read_varint(area, &mut pos)?; // length
    pos += 1; // attributes
    read_varint(area, &mut pos)?; // timestamp delta
    read_varint(area, &mut pos)?; // offset delta
    let key_len = usize::try_from(read_varint(area, &mut pos)?).ok()?;
    let key = area.get(pos..pos + key_len)?;
    pos += key_len;
    let value_len = usize::try_from(read_varint(area, &mut pos)?).ok()?;
    let value = area.get(pos..pos + value_len)?;
    Some((key, value))
}

fn read_varint(buf: &[u8], pos: &mut usize) -> Option<i64> {
    let mut raw: u64 = 0;
    let mut shift = 0;
    loop {
        let b = *buf.get(*pos)?;
        *pos += 1;
        raw |= ((b & 0x7f) as u64) << shift;
        if b & 0x80 == 0 {
            break;
        }
        shift += 7;
        if shift > 63 {
            return None;
        }
    }
    Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::batch::tests::make_batch;
    use bytes::Bytes;
    use kafka_protocol::records::RecordBatchDecoder;

    #[test]
    fn markers_round_trip_and_decode_as_kafka_control_records() {
        for commit in [true, false] {
            let marker = EndTxnMarker {
                commit,
                coordinator_epoch: 7,
            };
            let b = encode_marker(42, 3, marker, 1000);
            let h = BatchHeader::parse(&b).unwrap().unwrap();
            assert!(h.is_control() && h.is_transactional());
            assert_eq!(
                (h.producer_id, h.producer_epoch, h.record_count),
                (42, 3, 1)
            );
            assert_eq!(compute_crc(&b), h.crc);
            assert_eq!(parse_marker(&b).unwrap(), Some(marker));
            // Kafka's own decoder sees one control record with that key.
            let set = RecordBatchDecoder::decode(&mut Bytes::from(b)).unwrap();
            let r = &set.records[0];
            assert!(r.control && r.transactional);
            assert_eq!(&r.key.as_ref().unwrap()[..], &[0, 0, 0, commit as u8]);
            assert_eq!(&r.value.as_ref().unwrap()[..], &[0, 0, 0, 0, 0, 7]);
        }
    }

    #[test]
    fn collecting_aborted_transactions_stops_where_the_lso_passed_the_range() {
        let t = |pid, first, last, lso| AbortedTxn {
            producer_id: pid,
            first_offset: first,
            last_offset: last,
            last_stable_offset: lso,
        };
        let seg1 = [t(1, 0, 5, 6), t(2, 3, 12, 10)];
        let seg2 = [t(3, 20, 25, 26), t(4, 30, 40, 41)];
        let lists = || [&seg1[..], &seg2[..]];
        let mut out = Vec::new();
        // 6..21: pid 1 ended before it, pid 2 overlaps, pid 3 began at 20;
        // pid 3's LSO (26) passes 21, so pid 4 is not even looked at.
        assert!(collect_aborted(lists(), 6, 21, &mut out));
        assert_eq!(out, [seg1[1], seg2[0]]);
        out.clear();
        assert!(!collect_aborted(lists(), 0, 100, &mut out));
        assert_eq!(out.len(), 4);
    }

    #[test]
    fn a_data_batch_is_no_marker() {
        assert_eq!(parse_marker(&make_batch(1, 5, 0, 0, 1)).unwrap(), None);
    }
}
