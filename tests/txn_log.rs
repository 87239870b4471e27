//! The log side of transactions over the raw protocol: transactional
//! batches, the markers WriteTxnMarkers appends, the last stable offset and
//! the aborted transactions read_committed fetches get, across restarts.
//! (The transaction coordinator and whole-client flows are tested elsewhere;
//! here the test plays the coordinator.)

mod common;

use bytes::Bytes;
use common::{init_producer_id, InProcess, Process, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::records::{Compression, RecordBatchDecoder};

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn create(raw: &mut Raw, topic: &str, partitions: i32, configs: &[(&str, &str)]) {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(name(topic))
            .with_num_partitions(partitions)
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
    assert_eq!(resp.topics[0].error_code, 0);
}

/// A transactional batch of `values` (keys "k0", "k1", ...).
fn txn_batch(values: &[&str], producer_id: i64, epoch: i16, first_sequence: i32) -> Bytes {
    let records = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            (
                Some(Bytes::from(format!("k{i}"))),
                Some(Bytes::copy_from_slice(v.as_bytes())),
                1_700_000_000_000 + i as i64,
            )
        })
        .collect();
    strata::format::batch::encode_transactional_batch(
        records,
        (producer_id, epoch, first_sequence),
        Compression::None,
    )
    .unwrap()
}

/// Produces `records` with acks=all; (error code, base offset).
async fn produce(raw: &mut Raw, topic: &str, partition: i32, records: Bytes) -> (i16, i64) {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])]);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req).await;
    let p = &resp.responses[0].partition_responses[0];
    (p.error_code, p.base_offset)
}

/// Sends one marker for `partitions` of `topic`; the error code of each.
async fn marker(
    raw: &mut Raw,
    producer: (i64, i16),
    commit: bool,
    coordinator_epoch: i32,
    topic: &str,
    partitions: &[i32],
) -> Vec<i16> {
    let req = WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(producer.0))
        .with_producer_epoch(producer.1)
        .with_transaction_result(commit)
        .with_coordinator_epoch(coordinator_epoch)
        .with_topics(vec![WritableTxnMarkerTopic::default()
            .with_name(name(topic))
            .with_partition_indexes(partitions.to_vec())])]);
    let resp: WriteTxnMarkersResponse = raw.call(ApiKey::WriteTxnMarkers, 1, &req).await;
    assert_eq!(resp.markers.len(), 1);
    assert_eq!(resp.markers[0].producer_id.0, producer.0);
    resp.markers[0].topics[0]
        .partitions
        .iter()
        .map(|p| p.error_code)
        .collect()
}

/// What a fetch of one partition returned.
#[derive(Debug)]
struct Fetched {
    error_code: i16,
    high_watermark: i64,
    last_stable_offset: i64,
    aborted: Vec<(i64, i64)>,
    /// (offset, value or control marker text) of every record, control
    /// records as "COMMIT"/"ABORT".
    records: Vec<(i64, String)>,
}

async fn fetch(raw: &mut Raw, topic: &str, offset: i64, isolation_level: i8) -> Fetched {
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_isolation_level(isolation_level)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])]);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 11, &req).await;
    let p = &resp.responses[0].partitions[0];
    let mut records = Vec::new();
    let mut buf: Bytes = p.records.clone().unwrap_or_default();
    while !buf.is_empty() {
        let set = RecordBatchDecoder::decode(&mut buf).unwrap();
        for r in set.records {
            let text = if r.control {
                let key = r.key.unwrap();
                if key[3] == 1 { "COMMIT" } else { "ABORT" }.to_string()
            } else {
                String::from_utf8(r.value.unwrap_or_default().to_vec()).unwrap()
            };
            records.push((r.offset, text));
        }
    }
    Fetched {
        error_code: p.error_code,
        high_watermark: p.high_watermark,
        last_stable_offset: p.last_stable_offset,
        aborted: p
            .aborted_transactions
            .as_ref()
            .map(|a| {
                a.iter()
                    .map(|t| (t.producer_id.0, t.first_offset))
                    .collect()
            })
            .unwrap_or_default(),
        records,
    }
}

#[tokio::test]
async fn markers_end_transactions_and_are_refused_from_fenced_producers_and_coordinators() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    create(&mut raw, "t", 2, &[]).await;
    let pid = init_producer_id(&mut raw).await;

    assert_eq!(
        produce(&mut raw, "t", 0, txn_batch(&["a", "b", "c"], pid, 0, 0)).await,
        (0, 0)
    );
    assert_eq!(
        produce(&mut raw, "t", 0, txn_batch(&["d", "e"], pid, 0, 3)).await,
        (0, 3)
    );
    // Inside its open transaction a producer writes transactionally only.
    let plain = common::batch(&[b"x"], pid, 0, 5);
    assert_eq!(
        produce(&mut raw, "t", 0, plain).await.0,
        ResponseError::InvalidTxnState.code()
    );
    assert_eq!(marker(&mut raw, (pid, 0), true, 1, "t", &[0]).await, [0]);
    let f = fetch(&mut raw, "t", 0, 0).await;
    assert_eq!(f.error_code, 0);
    assert_eq!(f.high_watermark, 6);
    assert_eq!(
        f.records,
        [
            (0, "a".into()),
            (1, "b".into()),
            (2, "c".into()),
            (3, "d".into()),
            (4, "e".into()),
            (5, "COMMIT".into())
        ]
    );

    // The producer's next epoch (a new session): seq restarts at 0.
    assert_eq!(
        produce(&mut raw, "t", 0, txn_batch(&["f"], pid, 1, 0)).await,
        (0, 6)
    );
    // Older producer epoch: fenced, for data and markers alike.
    assert_eq!(
        produce(&mut raw, "t", 0, txn_batch(&["g"], pid, 0, 5))
            .await
            .0,
        ResponseError::InvalidProducerEpoch.code()
    );
    assert_eq!(
        marker(&mut raw, (pid, 0), false, 1, "t", &[0]).await,
        [ResponseError::InvalidProducerEpoch.code()]
    );
    // A marker from a deposed coordinator (older coordinator epoch).
    assert_eq!(
        marker(&mut raw, (pid, 1), false, 0, "t", &[0]).await,
        [ResponseError::TransactionCoordinatorFenced.code()]
    );
    // Unknown partitions; and a partition without data of the transaction
    // still takes its marker, as in Kafka.
    assert_eq!(
        marker(&mut raw, (pid, 1), false, 1, "t", &[0, 1, 7]).await,
        [0, 0, ResponseError::UnknownTopicOrPartition.code()]
    );
    assert_eq!(
        marker(&mut raw, (pid, 1), false, 1, "nope", &[0]).await,
        [ResponseError::UnknownTopicOrPartition.code()]
    );
    let f = fetch(&mut raw, "t", 6, 0).await;
    assert_eq!(f.records, [(6, "f".into()), (7, "ABORT".into())]);
}

#[tokio::test]
async fn an_acknowledged_marker_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let broker = Process::start(dir.path(), port, &[]);
    let addr = broker.bootstrap().parse().unwrap();
    let mut raw = Raw::connect(addr).await;
    create(&mut raw, "k", 1, &[]).await;
    let pid = init_producer_id(&mut raw).await;
    assert_eq!(
        produce(&mut raw, "k", 0, txn_batch(&["a", "b"], pid, 0, 0)).await,
        (0, 0)
    );
    assert_eq!(marker(&mut raw, (pid, 0), false, 3, "k", &[0]).await, [0]);
    broker.kill9();

    let broker = Process::start(dir.path(), port, &[]);
    let mut raw = Raw::connect(broker.bootstrap().parse().unwrap()).await;
    let f = fetch(&mut raw, "k", 0, 0).await;
    assert_eq!(
        f.records,
        [(0, "a".into()), (1, "b".into()), (2, "ABORT".into())]
    );
    // The replayed marker is the producer's last: an older coordinator's
    // marker stays refused after the restart.
    assert_eq!(
        marker(&mut raw, (pid, 0), true, 2, "k", &[0]).await,
        [ResponseError::TransactionCoordinatorFenced.code()]
    );
}
