//! Malformed, hostile and out-of-order input over the raw protocol: each case
//! gets Kafka's answer (an error code, or a closed connection where Kafka
//! closes it), and the broker keeps serving everyone else.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use bytes::{Bytes, BytesMut};
use common::{batch, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, StrBytes};
use tokio::io::AsyncWriteExt;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn create(raw: &mut Raw, topic: &str, configs: &[(&str, &str)]) -> i16 {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(name(topic))
            .with_num_partitions(1)
            .with_replication_factor(1)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(StrBytes::from_string(k.to_string()))
                            .with_value(Some(StrBytes::from_string(v.to_string())))
                    })
                    .collect(),
            )]);
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &req).await;
    resp.topics[0].error_code
}

fn produce_req(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

async fn produce(raw: &mut Raw, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
    let resp: ProduceResponse = raw
        .call(
            ApiKey::Produce,
            9,
            &produce_req(topic, partition, records, -1),
        )
        .await;
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

async fn fetch(raw: &mut Raw, topic: &str, offset: i64) -> (i16, i64, usize) {
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])]);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 11, &req).await;
    let p = &resp.responses[0].partitions[0];
    (
        p.error_code,
        p.high_watermark,
        p.records.as_ref().map_or(0, |r| r.len()),
    )
}

/// The broker still answers a well-behaved client.
async fn still_healthy(broker: &InProcess) {
    let mut raw = Raw::connect(broker.addr()).await;
    let resp: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(resp.error_code, 0);
    assert!(!resp.api_keys.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_truncated_and_garbage_frames_close_only_their_connection() {
    let broker = InProcess::start(&["--max-request-bytes", "1048576"]).await;
    let mut bystander = Raw::connect(broker.addr()).await;

    // 2 GiB announced: refused from the size prefix alone.
    let mut big = Raw::connect(broker.addr()).await;
    big.send_bytes(&[0x7f, 0xff, 0xff, 0xff, 0, 0]).await;
    assert!(big.is_closed().await);

    // Negative size.
    let mut neg = Raw::connect(broker.addr()).await;
    neg.send_bytes(&[0xff, 0xff, 0xff, 0xfe]).await;
    assert!(neg.is_closed().await);

    // A frame cut short by the client closing its side.
    let mut cut = Raw::connect(broker.addr()).await;
    cut.send_bytes(&[0, 0, 0, 100, 0, 18, 0, 3]).await;
    cut.stream.shutdown().await.unwrap();
    assert!(cut.is_closed().await);

    // Garbage: a frame whose header is nonsense.
    let mut junk = Raw::connect(broker.addr()).await;
    junk.send_bytes(&[0, 0, 0, 12, 0x42, 0x42, 0x13, 0x37, 1, 2, 3, 4, 5, 6, 7, 8])
        .await;
    assert!(junk.is_closed().await);

    // A known API whose body does not decode.
    let mut bad_body = Raw::connect(broker.addr()).await;
    bad_body
        .send_bytes(&[0, 0, 0, 10, 0, 3, 0, 9, 0, 0, 0, 1, 0xff, 0x7f])
        .await;
    assert!(bad_body.is_closed().await);

    let resp: ApiVersionsResponse = bystander
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    assert_eq!(resp.error_code, 0);
    still_healthy(&broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_api_versions_get_the_v0_fallback_and_unknown_apis_are_closed() {
    let broker = InProcess::start(&[]).await;

    // ApiVersions at a version from the future: answered in v0 with UNSUPPORTED_VERSION and the list.
    let mut raw = Raw::connect(broker.addr()).await;
    raw.send(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    let _ = raw.read_frame().await.unwrap();
    let mut frame = BytesMut::new();
    frame.extend_from_slice(&[0, 0, 0, 8, 0, 18, 0, 99, 0, 0, 0, 42]);
    raw.send_bytes(&frame).await;
    let mut resp = raw.read_frame().await.expect("v0 fallback response");
    let header = ResponseHeader::decode(&mut resp, 0).unwrap();
    assert_eq!(header.correlation_id, 42);
    let body = ApiVersionsResponse::decode(&mut resp, 0).unwrap();
    assert_eq!(body.error_code, ResponseError::UnsupportedVersion.code());
    assert!(body
        .api_keys
        .iter()
        .any(|k| k.api_key == ApiKey::Produce as i16));

    // Any other API at an unsupported version, or an unknown API key: Kafka closes.
    let mut raw = Raw::connect(broker.addr()).await;
    raw.send(ApiKey::Metadata, 12, &MetadataRequest::default())
        .await;
    let _ = raw.read_frame().await.unwrap();
    raw.send_bytes(&[0, 0, 0, 8, 0, 3, 0, 99, 0, 0, 0, 1]).await;
    assert!(raw.is_closed().await);
    let mut raw = Raw::connect(broker.addr()).await;
    raw.send_bytes(&[0, 0, 0, 10, 0x27, 0x0f, 0, 0, 0, 0, 0, 1, 0xff, 0xff])
        .await;
    assert!(raw.is_closed().await);
    // An API that exists in Kafka but that this broker does not advertise
    // (ControlledShutdown, key 7).
    let mut raw = Raw::connect(broker.addr()).await;
    raw.send_bytes(&[0, 0, 0, 10, 0, 7, 0, 3, 0, 0, 0, 1, 0xff, 0xff])
        .await;
    assert!(raw.is_closed().await);
    // A SASL handshake on a PLAINTEXT listener is answered, as Kafka does.
    let mut raw = Raw::connect(broker.addr()).await;
    raw.send(ApiKey::SaslHandshake, 1, &SaslHandshakeRequest::default())
        .await;
    let mut resp = raw.read_frame().await.expect("SaslHandshake response");
    ResponseHeader::decode(&mut resp, 0).unwrap();
    let body = SaslHandshakeResponse::decode(&mut resp, 1).unwrap();
    assert_eq!(body.error_code, ResponseError::IllegalSaslState.code());

    still_healthy(&broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_batches_invalid_names_and_unknown_partitions_get_kafka_error_codes() {
    let broker = InProcess::start(&["--auto-create-topics", "false"]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    assert_eq!(create(&mut raw, "t", &[]).await, 0);
    assert_eq!(
        create(&mut raw, "t", &[]).await,
        ResponseError::TopicAlreadyExists.code()
    );
    for bad in ["bad/name", "..", "with space", &"x".repeat(250)] {
        assert_eq!(
            create(&mut raw, bad, &[]).await,
            ResponseError::InvalidTopicException.code(),
            "{bad}"
        );
    }
    assert_eq!(
        create(&mut raw, "c", &[("cleanup.policy", "shred")]).await,
        ResponseError::InvalidConfig.code()
    );
    assert_eq!(
        create(&mut raw, "c", &[("no.such.config", "1")]).await,
        ResponseError::InvalidConfig.code()
    );

    let md: MetadataResponse = raw
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(name("bad/name"))),
                metadata_request::MetadataRequestTopic::default().with_name(Some(name("missing"))),
            ])),
        )
        .await;
    assert_eq!(
        md.topics[0].error_code,
        ResponseError::InvalidTopicException.code()
    );
    assert_eq!(
        md.topics[1].error_code,
        ResponseError::UnknownTopicOrPartition.code()
    );

    // CRC mismatch: flip one byte of the record data.
    let good = batch(&[b"hello", b"world"], -1, -1, -1);
    let mut corrupt = BytesMut::from(&good[..]);
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0x01;
    assert_eq!(
        produce(&mut raw, "t", 0, corrupt.freeze()).await.0,
        ResponseError::CorruptMessage.code()
    );
    // Truncated batch and two batches in one partition's data.
    assert_eq!(
        produce(&mut raw, "t", 0, good.slice(..good.len() - 3))
            .await
            .0,
        ResponseError::CorruptMessage.code()
    );
    let mut two = BytesMut::from(&good[..]);
    two.extend_from_slice(&good);
    assert_eq!(
        produce(&mut raw, "t", 0, two.freeze()).await.0,
        ResponseError::InvalidRecord.code()
    );
    assert_eq!(
        produce(&mut raw, "t", 0, Bytes::from_static(b"garbage"))
            .await
            .0,
        ResponseError::CorruptMessage.code()
    );
    // Nothing was appended by any of those.
    assert_eq!(fetch(&mut raw, "t", 0).await, (0, 0, 0));

    assert_eq!(
        produce(&mut raw, "t", 7, good.clone()).await.0,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        produce(&mut raw, "nope", 0, good.clone()).await.0,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(produce(&mut raw, "t", 0, good.clone()).await, (0, 0));
    assert_eq!(fetch(&mut raw, "t", 2).await.1, 2);

    // Offsets outside [log start, high watermark].
    assert_eq!(
        fetch(&mut raw, "t", 3).await.0,
        ResponseError::OffsetOutOfRange.code()
    );
    assert_eq!(
        fetch(&mut raw, "t", -5).await.0,
        ResponseError::OffsetOutOfRange.code()
    );

    // acks outside {-1, 0, 1}.
    let resp: ProduceResponse = raw
        .call(ApiKey::Produce, 9, &produce_req("t", 0, good.clone(), 7))
        .await;
    assert_eq!(
        resp.responses[0].partition_responses[0].error_code,
        ResponseError::InvalidRequiredAcks.code()
    );
    still_healthy(&broker).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_over_max_message_bytes_are_refused() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    assert_eq!(
        create(&mut raw, "small", &[("max.message.bytes", "1024")]).await,
        0
    );
    let big = vec![b'x'; 2000];
    assert_eq!(
        produce(&mut raw, "small", 0, batch(&[&big], -1, -1, -1))
            .await
            .0,
        ResponseError::MessageTooLarge.code()
    );
    assert_eq!(
        produce(&mut raw, "small", 0, batch(&[b"fits"], -1, -1, -1)).await,
        (0, 0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idempotent_sequences_detect_duplicates_and_gaps() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    assert_eq!(create(&mut raw, "idem", &[]).await, 0);
    let id = common::init_producer_id(&mut raw).await;
    let first = batch(&[b"a", b"b"], id, 0, 0);
    assert_eq!(produce(&mut raw, "idem", 0, first.clone()).await, (0, 0));
    // A retry of the same batch is acknowledged with its original offset and not stored again.
    assert_eq!(produce(&mut raw, "idem", 0, first).await, (0, 0));
    // A gap in the sequence.
    assert_eq!(
        produce(&mut raw, "idem", 0, batch(&[b"c"], id, 0, 5))
            .await
            .0,
        ResponseError::OutOfOrderSequenceNumber.code()
    );
    // A stale epoch after a bump.
    assert_eq!(
        produce(&mut raw, "idem", 0, batch(&[b"c"], id, 1, 0)).await,
        (0, 2)
    );
    assert_eq!(
        produce(&mut raw, "idem", 0, batch(&[b"d"], id, 0, 2))
            .await
            .0,
        ResponseError::InvalidProducerEpoch.code()
    );
    assert_eq!(
        produce(&mut raw, "idem", 0, batch(&[b"d"], id, 1, 1)).await,
        (0, 3)
    );
    assert_eq!(fetch(&mut raw, "idem", 0).await.1, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_answered_in_order_and_acks_zero_gets_no_response() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    assert_eq!(create(&mut raw, "p", &[]).await, 0);
    for i in 0..50 {
        if i % 10 == 0 {
            raw.send(
                ApiKey::Produce,
                9,
                &produce_req("p", 0, batch(&[b"zero"], -1, -1, -1), 0),
            )
            .await;
        } else if i % 2 == 0 {
            raw.send(
                ApiKey::Produce,
                9,
                &produce_req("p", 0, batch(&[b"v"], -1, -1, -1), -1),
            )
            .await;
        } else {
            raw.send(ApiKey::Metadata, 12, &MetadataRequest::default())
                .await;
        }
    }
    // 50 requests with correlation ids 2..=51; the acks=0 ones (every 10th) get no reply.
    let mut seen = Vec::new();
    let mut last_offset = -1;
    for i in 0..50 {
        if i % 10 == 0 {
            continue;
        }
        let mut frame = raw.read_frame().await.expect("reply");
        let header = ResponseHeader::decode(&mut frame, 1).unwrap();
        seen.push(header.correlation_id);
        if i % 2 == 0 {
            let resp = ProduceResponse::decode(&mut frame, 9).unwrap();
            let off = resp.responses[0].partition_responses[0].base_offset;
            assert!(off > last_offset, "appends happen in request order");
            last_offset = off;
        }
    }
    let expected: Vec<i32> = (0..50).filter(|i| i % 10 != 0).map(|i| i + 2).collect();
    assert_eq!(seen, expected);
    // 20 acks=-1 batches and 5 acks=0 batches, all stored.
    assert_eq!(fetch(&mut raw, "p", 0).await.1, 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_idle_connections_do_not_starve_a_working_client() {
    let broker = InProcess::start(&[]).await;
    let mut idle = Vec::new();
    for i in 0..3000 {
        let mut c = Raw::connect(broker.addr()).await;
        if i % 3 == 0 {
            // Announce a 100 MB frame and never send it: nothing is allocated for it.
            c.send_bytes(&[0x05, 0xf5, 0xe1, 0x00, 0, 0]).await;
        }
        idle.push(c);
    }
    let mut raw = Raw::connect(broker.addr()).await;
    assert_eq!(create(&mut raw, "busy", &[]).await, 0);
    let started = std::time::Instant::now();
    for i in 0..100 {
        assert_eq!(
            produce(&mut raw, "busy", 0, batch(&[b"x"], -1, -1, -1)).await,
            (0, i)
        );
    }
    assert_eq!(fetch(&mut raw, "busy", 0).await.1, 100);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
    drop(idle);
    still_healthy(&broker).await;
}
