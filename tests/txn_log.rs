//! The log side of transactions over the raw protocol: transactional
//! batches, the markers WriteTxnMarkers appends, the last stable offset and
//! the aborted transactions read_committed fetches get, across restarts.
//! (The transaction coordinator and whole-client flows are tested elsewhere;
//! here the test plays the coordinator.)

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

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
    /// The producer id of each record.
    producers: Vec<i64>,
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
    let mut producers = Vec::new();
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
            producers.push(r.producer_id);
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
        producers,
    }
}

/// Reads `topic` read_committed from `from` up to its LSO and keeps what a
/// Kafka client keeps: records of aborted transactions (from their first
/// offset to their producer's ABORT marker) and markers are dropped.
/// Returns the values, the aborted (producer, first offset) pairs and the LSO.
async fn read_committed(
    raw: &mut Raw,
    topic: &str,
    from: i64,
) -> (Vec<String>, Vec<(i64, i64)>, i64) {
    let mut offset = from;
    let mut all = Vec::new();
    let mut aborted: Vec<(i64, i64)> = Vec::new();
    let lso = loop {
        let f = fetch(raw, topic, offset, 1).await;
        assert_eq!(f.error_code, 0);
        assert!(f.records.iter().all(|(o, _)| *o < f.last_stable_offset));
        for a in f.aborted {
            if !aborted.contains(&a) {
                aborted.push(a);
            }
        }
        for ((o, text), pid) in f.records.into_iter().zip(f.producers) {
            if o >= offset {
                offset = o + 1;
                all.push((o, pid, text));
            }
        }
        if offset >= f.last_stable_offset || all.is_empty() && f.last_stable_offset <= from {
            break f.last_stable_offset;
        }
    };
    aborted.sort_by_key(|a| a.1);
    let mut pending = aborted.iter().peekable();
    let mut skipping = std::collections::HashSet::new();
    let mut values = Vec::new();
    for (o, pid, text) in all {
        while let Some(a) = pending.next_if(|a| a.1 <= o) {
            skipping.insert(a.0);
        }
        match text.as_str() {
            "ABORT" => {
                skipping.remove(&pid);
            }
            "COMMIT" => {}
            _ if skipping.contains(&pid) => {}
            _ => values.push(text),
        }
    }
    (values, aborted, lso)
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
    // Another transaction, left open.
    let other = init_producer_id(&mut raw).await;
    assert_eq!(
        produce(&mut raw, "k", 0, txn_batch(&["c"], other, 0, 0)).await,
        (0, 3)
    );
    broker.kill9();

    let broker = Process::start(dir.path(), port, &[]);
    let mut raw = Raw::connect(broker.bootstrap().parse().unwrap()).await;
    let f = fetch(&mut raw, "k", 0, 0).await;
    assert_eq!(
        f.records,
        [
            (0, "a".into()),
            (1, "b".into()),
            (2, "ABORT".into()),
            (3, "c".into())
        ]
    );
    // Replayed from the head: the open transaction holds the LSO, and the
    // aborted one is named to read_committed readers.
    let (values, aborted, lso) = read_committed(&mut raw, "k", 0).await;
    assert!(values.is_empty());
    assert_eq!((aborted, lso), (vec![(pid, 0)], 3));
    // The replayed marker is the producer's last: an older coordinator's
    // marker stays refused after the restart.
    assert_eq!(
        marker(&mut raw, (pid, 0), true, 2, "k", &[0]).await,
        [ResponseError::TransactionCoordinatorFenced.code()]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aborted_and_open_transactions_are_tiered_and_come_back_from_the_store() {
    use object_store::{memory::InMemory, ObjectStore};
    use std::sync::Arc;
    use strata::server::Server;

    let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
    let data = tempfile::tempdir().unwrap();
    let start = |store: Arc<dyn ObjectStore>| {
        let config = common::config(data.path(), &["--tier-interval-ms", "50"]);
        async move { Server::start_with_store(config, Some(store)).await.unwrap() }
    };
    let server = start(store.clone()).await;
    let mut raw = Raw::connect(server.local_addr()).await;
    let configs = [
        ("segment.bytes", "4096"),
        ("segment.ms", "300"),
        ("retention.ms", "-1"),
    ];
    create(&mut raw, "tx", 1, &configs).await;
    let (a, b, c) = (
        init_producer_id(&mut raw).await,
        init_producer_id(&mut raw).await,
        init_producer_id(&mut raw).await,
    );
    let values = |who: &str, i: i32| -> Vec<String> {
        (0..5)
            .map(|j| format!("{who}-{i}-{j}-{}", "x".repeat(40)))
            .collect()
    };
    let batch_of = |who: &str, pid: i64, i: i32| {
        let v = values(who, i);
        let v: Vec<&str> = v.iter().map(|s| s.as_str()).collect();
        txn_batch(&v, pid, 0, i * 5)
    };
    // a aborts, b commits, interleaved over several 4 KiB segments.
    for i in 0..10 {
        assert_eq!(produce(&mut raw, "tx", 0, batch_of("a", a, i)).await.0, 0);
        assert_eq!(produce(&mut raw, "tx", 0, batch_of("b", b, i)).await.0, 0);
    }
    assert_eq!(marker(&mut raw, (a, 0), false, 0, "tx", &[0]).await, [0]);
    assert_eq!(marker(&mut raw, (b, 0), true, 0, "tx", &[0]).await, [0]);
    // c stays open.
    let (code, c_first) = produce(&mut raw, "tx", 0, batch_of("c", c, 0)).await;
    assert_eq!(code, 0);
    let committed: Vec<String> = (0..10).flat_map(|i| values("b", i)).collect();

    let expect = |got: (Vec<String>, Vec<(i64, i64)>, i64)| {
        assert_eq!(got.0, committed);
        assert_eq!(got.1, [(a, 0)]);
        assert_eq!(got.2, c_first);
    };
    // Everything reaches the store and leaves the local disk (the idle head
    // rolls after segment.ms).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let tiered = server
            .tier()
            .manifest_of("tx", 0)
            .and_then(|m| m.end_offset())
            .unwrap_or(0);
        let local_logs = std::fs::read_dir(data.path().join("topics/tx/0"))
            .unwrap()
            .filter(|e| {
                e.as_ref()
                    .unwrap()
                    .file_name()
                    .to_string_lossy()
                    .ends_with(".log")
            })
            .count();
        if tiered > c_first && local_logs == 1 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not tiered: {tiered}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    expect(read_committed(&mut raw, "tx", 0).await);
    // read_uncommitted sees everything, with the LSO reported as well.
    let f = fetch(&mut raw, "tx", c_first, 0).await;
    assert_eq!(f.records[0].0, c_first);
    assert_eq!(f.last_stable_offset, c_first);
    server.shutdown().await.unwrap();

    // A broker on an empty data directory: the aborted index from the
    // manifest, the open transaction from the last segment's snapshot.
    std::fs::remove_dir_all(data.path()).unwrap();
    std::fs::create_dir_all(data.path()).unwrap();
    let server = start(store).await;
    let mut raw = Raw::connect(server.local_addr()).await;
    expect(read_committed(&mut raw, "tx", 0).await);
    assert_eq!(marker(&mut raw, (c, 0), false, 0, "tx", &[0]).await, [0]);
    let (values_after, aborted, lso) = read_committed(&mut raw, "tx", c_first).await;
    assert!(values_after.is_empty());
    assert_eq!(aborted, [(c, c_first)]);
    assert_eq!(lso, c_first + 6);
    server.shutdown().await.unwrap();
}

async fn latest(raw: &mut Raw, topic: &str, isolation_level: i8) -> i64 {
    use kafka_protocol::messages::list_offsets_request::{ListOffsetsPartition, ListOffsetsTopic};
    let req = ListOffsetsRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_isolation_level(isolation_level)
        .with_topics(vec![ListOffsetsTopic::default()
            .with_name(name(topic))
            .with_partitions(vec![ListOffsetsPartition::default()
                .with_partition_index(0)
                .with_timestamp(-1)])]);
    let resp: ListOffsetsResponse = raw.call(ApiKey::ListOffsets, 7, &req).await;
    let p = &resp.topics[0].partitions[0];
    assert_eq!(p.error_code, 0);
    p.offset
}

#[tokio::test]
async fn read_committed_fetches_and_list_offsets_stop_at_the_last_stable_offset() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    create(&mut raw, "lso", 1, &[]).await;
    let (a, b) = (
        init_producer_id(&mut raw).await,
        init_producer_id(&mut raw).await,
    );
    produce(&mut raw, "lso", 0, common::batch(&[b"plain"], -1, -1, -1)).await;
    produce(&mut raw, "lso", 0, txn_batch(&["a0"], a, 0, 0)).await; // 1
    produce(&mut raw, "lso", 0, txn_batch(&["b0"], b, 0, 0)).await; // 2
    produce(&mut raw, "lso", 0, txn_batch(&["a1"], a, 0, 1)).await; // 3
    assert_eq!(
        (
            latest(&mut raw, "lso", 0).await,
            latest(&mut raw, "lso", 1).await
        ),
        (4, 1)
    );
    let f = fetch(&mut raw, "lso", 0, 1).await;
    assert_eq!((f.high_watermark, f.last_stable_offset), (4, 1));
    assert_eq!(f.records, [(0, "plain".into())]);
    assert!(fetch(&mut raw, "lso", 1, 1).await.records.is_empty());

    assert_eq!(marker(&mut raw, (a, 0), true, 0, "lso", &[0]).await, [0]); // 4
    assert_eq!(latest(&mut raw, "lso", 1).await, 2);
    assert_eq!(marker(&mut raw, (b, 0), false, 0, "lso", &[0]).await, [0]); // 5
    assert_eq!(latest(&mut raw, "lso", 1).await, 6);
    let (values, aborted, lso) = read_committed(&mut raw, "lso", 0).await;
    assert_eq!(values, ["plain", "a0", "a1"]);
    assert_eq!(aborted, [(b, 2)]);
    assert_eq!(lso, 6);
}

#[tokio::test]
async fn describe_producers_shows_epochs_sequences_and_open_transactions() {
    use kafka_protocol::messages::describe_producers_request::TopicRequest;
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    create(&mut raw, "dp", 1, &[]).await;
    let (a, b) = (
        init_producer_id(&mut raw).await,
        init_producer_id(&mut raw).await,
    );
    produce(&mut raw, "dp", 0, txn_batch(&["x", "y"], a, 0, 0)).await; // 0-1
    produce(&mut raw, "dp", 0, txn_batch(&["z"], b, 0, 0)).await; // 2
    assert_eq!(marker(&mut raw, (b, 0), true, 5, "dp", &[0]).await, [0]);
    let req = DescribeProducersRequest::default().with_topics(vec![
        TopicRequest::default()
            .with_name(name("dp"))
            .with_partition_indexes(vec![0, 3]),
        TopicRequest::default()
            .with_name(name("missing"))
            .with_partition_indexes(vec![0]),
    ]);
    let resp: DescribeProducersResponse = raw.call(ApiKey::DescribeProducers, 0, &req).await;
    let parts = &resp.topics[0].partitions;
    assert_eq!(parts[0].error_code, 0);
    let mut got: Vec<_> = parts[0]
        .active_producers
        .iter()
        .map(|p| {
            (
                p.producer_id.0,
                p.producer_epoch,
                p.last_sequence,
                p.coordinator_epoch,
                p.current_txn_start_offset,
            )
        })
        .collect();
    got.sort();
    assert_eq!(got, [(a, 0, 1, -1, 0), (b, 0, 0, 5, -1)]);
    assert!(parts[0]
        .active_producers
        .iter()
        .all(|p| p.last_timestamp > 0));
    let unknown = ResponseError::UnknownTopicOrPartition.code();
    assert_eq!(parts[1].error_code, unknown);
    assert_eq!(resp.topics[1].partitions[0].error_code, unknown);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_leader_rebuilds_open_and_aborted_transactions_from_the_write_ahead_log() {
    use common::cluster::{create_topic, wait_for_leaders, Cluster};
    let Some(mut cluster) = Cluster::start(&[1, 2]).await else {
        return;
    };
    create_topic(&cluster.bootstrap(), "ctx", 1, &[]).await;
    let leader = wait_for_leaders(&cluster.bootstrap(), "ctx", 1, |_| true).await[&0];
    let mut raw = Raw::connect(cluster.bootstrap_of(leader).parse().unwrap()).await;
    let (a, b) = (
        init_producer_id(&mut raw).await,
        init_producer_id(&mut raw).await,
    );
    assert_eq!(
        produce(&mut raw, "ctx", 0, txn_batch(&["a0", "a1"], a, 0, 0)).await,
        (0, 0)
    );
    assert_eq!(
        produce(&mut raw, "ctx", 0, txn_batch(&["b0"], b, 0, 0)).await,
        (0, 2)
    );
    // Acknowledged once in the write-ahead log, like acks=all.
    assert_eq!(marker(&mut raw, (a, 0), false, 0, "ctx", &[0]).await, [0]);
    assert_eq!(
        produce(&mut raw, "ctx", 0, txn_batch(&["b1"], b, 0, 1)).await,
        (0, 4)
    );
    cluster.kill9(leader);

    let other = if leader == 1 { 2 } else { 1 };
    let bootstrap = cluster.bootstrap_of(other);
    wait_for_leaders(&bootstrap, "ctx", 1, |l| l[&0] == other).await;
    let mut raw = Raw::connect(bootstrap.parse().unwrap()).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while fetch(&mut raw, "ctx", 0, 1).await.error_code != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the new leader never served"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    // b's transaction is still open at offset 2; a's aborted one is named.
    let (values, aborted, lso) = read_committed(&mut raw, "ctx", 0).await;
    assert!(values.is_empty(), "{values:?}");
    assert_eq!((aborted, lso), (vec![(a, 0)], 2));
    // The new leader knows the coordinator epoch of a's marker...
    assert_eq!(
        marker(&mut raw, (a, 0), true, -1, "ctx", &[0]).await,
        [ResponseError::TransactionCoordinatorFenced.code()]
    );
    // ...and b's transaction, which its marker now ends.
    assert_eq!(marker(&mut raw, (b, 0), true, 0, "ctx", &[0]).await, [0]);
    let (values, aborted, lso) = read_committed(&mut raw, "ctx", 0).await;
    assert_eq!(values, ["b0", "b1"]);
    assert_eq!((aborted, lso), (vec![(a, 0)], 6));
}
