//! `__consumer_offsets` records from a hostile or corrupt log: every decoder
//! fed valid encodings with bytes flipped, cut and extended, and random
//! bytes, must return an error or a value, never panic; counts read from the
//! record must not reserve more than the record could hold (the decoders cap
//! their preallocation). Fixed seed and case count, so CI time is bounded.

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use uuid::Uuid;

use super::records::*;

fn seeds() -> Vec<Vec<u8>> {
    let id = Uuid::from_u128(42);
    let mut out: Vec<Vec<u8>> = vec![
        RecordKey::Offset {
            group: "g".into(),
            topic: "t".into(),
            partition: 3,
        }
        .encode()
        .to_vec(),
        RecordKey::ConsumerMember {
            group: "g".into(),
            member: "m".into(),
        }
        .encode()
        .to_vec(),
        OffsetValue {
            offset: 5,
            leader_epoch: 1,
            metadata: "meta".into(),
            commit_timestamp: 9,
        }
        .encode()
        .to_vec(),
        ConsumerGroupValue {
            epoch: 7,
            metadata_hash: 3,
        }
        .encode()
        .to_vec(),
        ConsumerMemberValue {
            instance_id: Some("i".into()),
            rack_id: None,
            client_id: "c".into(),
            client_host: "/127.0.0.1".into(),
            subscribed_topic_names: vec!["a".into(), "b".into()],
            subscribed_topic_regex: Some("t.*".into()),
            rebalance_timeout_ms: 300_000,
            server_assignor: Some("range".into()),
            classic: Some(ClassicMemberMetadata {
                session_timeout_ms: 45_000,
                protocols: vec![("range".into(), bytes::Bytes::from_static(b"meta"))],
            }),
        }
        .encode()
        .to_vec(),
        encode_target(&vec![(id, vec![0, 2]), (Uuid::from_u128(7), vec![])]).to_vec(),
        encode_assignment_epoch(9).to_vec(),
        CurrentAssignmentValue {
            member_epoch: 3,
            previous_member_epoch: 2,
            state: 1,
            assigned: vec![(id, vec![1])],
            revoking: vec![(id, vec![0])],
        }
        .encode()
        .to_vec(),
    ];
    out.push(Vec::new());
    out
}

/// Every decoder on `b`; only their not panicking matters here.
fn decode_all(b: &[u8]) {
    let _ = RecordKey::decode(b);
    let _ = OffsetValue::decode(b);
    let _ = GroupValue::decode(b);
    let _ = ConsumerGroupValue::decode(b);
    let _ = ConsumerMemberValue::decode(b);
    let _ = decode_assignment_epoch(b);
    let _ = decode_target(b);
    let _ = CurrentAssignmentValue::decode(b);
}

#[test]
fn mutated_and_random_offsets_topic_records_decode_to_errors_not_panics() {
    let seeds = seeds();
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 3000,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::from_seed(RngAlgorithm::ChaCha, &[3; 32]),
    );
    let mutation = (
        0..seeds.len(),
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        prop::option::of(any::<prop::sample::Index>()),
        proptest::collection::vec(any::<u8>(), 0..8),
        proptest::collection::vec(any::<u8>(), 0..64),
    );
    runner
        .run(&mutation, |(seed, flips, cut, tail, random)| {
            let mut b = seeds[seed].clone();
            if !b.is_empty() {
                for (at, x) in flips {
                    let i = at.index(b.len());
                    b[i] ^= x | 1;
                }
            }
            if let Some(cut) = cut {
                if !b.is_empty() {
                    b.truncate(cut.index(b.len()));
                }
            }
            b.extend_from_slice(&tail);
            decode_all(&b);
            decode_all(&random);
            Ok(())
        })
        .unwrap();
    // Counts of i32::MAX and varints of u32::MAX in a few bytes.
    for lie in [
        &[0, 3, 0x7f, 0xff, 0xff, 0xff][..],
        &[0, 0, 0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0x0f],
        &[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff, 0x0f],
    ] {
        decode_all(lie);
    }
}
