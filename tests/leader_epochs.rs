//! Leader epochs as clients see them: OffsetForLeaderEpoch answers where each
//! epoch ended, on one broker and across failovers in a cluster (3 `strata`
//! processes, real etcd, leaders lost by kill -9), and a partition request
//! sent to the wrong broker is answered with KIP-951's hint to the leader.
//! Records go in through librdkafka; the APIs librdkafka does not expose are
//! sent over the raw protocol.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::time::{Duration, Instant};

use common::cluster::Cluster;
use common::{batch, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::offset_for_leader_epoch_request::{
    OffsetForLeaderPartition, OffsetForLeaderTopic,
};
use kafka_protocol::messages::offset_for_leader_epoch_response::EpochEndOffset;
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::producer::{FutureProducer, FutureRecord};
use uuid::Uuid;

const TOPIC: &str = "epochs";
const TIMEOUT: Duration = Duration::from_secs(60);

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

fn code(e: ResponseError) -> i16 {
    e.code()
}

/// OffsetForLeaderEpoch for one partition: where `requested` ended, asked
/// by a client that believes the leader's epoch is `current`.
async fn epoch_end(
    raw: &mut Raw,
    topic: &str,
    partition: i32,
    current: i32,
    requested: i32,
    version: i16,
) -> EpochEndOffset {
    let req = OffsetForLeaderEpochRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_topics(vec![OffsetForLeaderTopic::default()
            .with_topic(name(topic))
            .with_partitions(vec![OffsetForLeaderPartition::default()
                .with_partition(partition)
                .with_current_leader_epoch(current)
                .with_leader_epoch(requested)])]);
    let resp: OffsetForLeaderEpochResponse =
        raw.call(ApiKey::OffsetForLeaderEpoch, version, &req).await;
    assert_eq!(resp.topics.len(), 1);
    assert_eq!(resp.topics[0].topic, name(topic));
    let p = resp.topics[0].partitions[0].clone();
    assert_eq!(p.partition, partition);
    p
}

/// (error code, leader epoch, end offset) of an OffsetForLeaderEpoch answer.
async fn answer(raw: &mut Raw, current: i32, requested: i32) -> (i16, i32, i64) {
    let p = epoch_end(raw, TOPIC, 0, current, requested, 4).await;
    (p.error_code, p.leader_epoch, p.end_offset)
}

#[tokio::test]
async fn a_single_broker_answers_epoch_zero_with_its_log_end() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let created: CreateTopicsResponse = raw
        .call(
            ApiKey::CreateTopics,
            7,
            &CreateTopicsRequest::default()
                .with_timeout_ms(5000)
                .with_topics(vec![CreatableTopic::default()
                    .with_name(name(TOPIC))
                    .with_num_partitions(1)
                    .with_replication_factor(1)]),
        )
        .await;
    assert_eq!(created.topics[0].error_code, 0);
    for i in 0..3 {
        let req = ProduceRequest::default()
            .with_acks(-1)
            .with_timeout_ms(5000)
            .with_topic_data(vec![TopicProduceData::default()
                .with_name(name(TOPIC))
                .with_partition_data(vec![PartitionProduceData::default()
                    .with_index(0)
                    .with_records(Some(batch(&[b"a", b"b"], -1, 0, 0)))])]);
        let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req).await;
        let p = &resp.responses[0].partition_responses[0];
        assert_eq!((p.error_code, p.base_offset), (0, i * 2));
    }
    // One broker leads at epoch 0 forever: epoch 0 is the current one.
    assert_eq!(answer(&mut raw, 0, 0).await, (0, 0, 6));
    assert_eq!(answer(&mut raw, -1, 0).await, (0, 0, 6));
    for version in [2, 3] {
        let p = epoch_end(&mut raw, TOPIC, 0, 0, 0, version).await;
        assert_eq!((p.error_code, p.leader_epoch, p.end_offset), (0, 0, 6));
    }
    // No epoch after the current one; -1 is undefined.
    assert_eq!(answer(&mut raw, 0, 1).await, (0, -1, -1));
    assert_eq!(answer(&mut raw, 0, -1).await, (0, -1, -1));
    // A client ahead of the broker's epoch.
    let unknown = code(ResponseError::UnknownLeaderEpoch);
    assert_eq!(answer(&mut raw, 1, 0).await.0, unknown);
    // Unknown topics and partitions.
    let missing = code(ResponseError::UnknownTopicOrPartition);
    assert_eq!(
        epoch_end(&mut raw, "nope", 0, -1, 0, 4).await.error_code,
        missing
    );
    assert_eq!(
        epoch_end(&mut raw, TOPIC, 7, -1, 0, 4).await.error_code,
        missing
    );
    assert_eq!(
        epoch_end(&mut raw, TOPIC, -1, -1, 0, 4).await.error_code,
        missing
    );

    // DeleteRecords moves the log start; epoch 0 still ends at the log end.
    let deleted: DeleteRecordsResponse = raw
        .call(
            ApiKey::DeleteRecords,
            2,
            &DeleteRecordsRequest::default()
                .with_timeout_ms(5000)
                .with_topics(vec![DeleteRecordsTopic::default()
                    .with_name(name(TOPIC))
                    .with_partitions(vec![DeleteRecordsPartition::default()
                        .with_partition_index(0)
                        .with_offset(4)])]),
        )
        .await;
    assert_eq!(deleted.topics[0].partitions[0].low_watermark, 4);
    assert_eq!(answer(&mut raw, 0, 0).await, (0, 0, 6));
}

/// Leader node and epoch of partition 0 of `TOPIC`, and the topic id, as
/// the broker at `addr` reports them.
async fn leader(addr: std::net::SocketAddr) -> Option<(i32, i32, Uuid)> {
    let mut raw = Raw::connect(addr).await;
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(name(TOPIC)))
        ]))
        .with_allow_auto_topic_creation(false);
    let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &req).await;
    let t = resp.topics.first()?;
    let p = t.partitions.iter().find(|p| p.partition_index == 0)?;
    (t.error_code == 0 && p.error_code == 0 && p.leader_id.0 >= 0).then_some((
        p.leader_id.0,
        p.leader_epoch,
        t.topic_id,
    ))
}

/// Waits until a live broker of `cluster` reports a leader of partition 0
/// other than `old` at an epoch above `epoch`.
async fn new_leader(cluster: &Cluster, old: Option<i32>, epoch: i32) -> (i32, i32, Uuid) {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        for node in cluster.running() {
            if let Some(l) = leader(cluster.bootstrap_of(node).parse().unwrap()).await {
                if Some(l.0) != old && l.1 > epoch && cluster.running().contains(&l.0) {
                    return l;
                }
            }
        }
        assert!(Instant::now() < deadline, "partition 0 got no new leader");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Produces `count` records to partition 0 through librdkafka; returns the
/// offset of the last one.
async fn produce(bootstrap: &str, count: usize) -> i64 {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("message.timeout.ms", "30000")
        .create()
        .unwrap();
    let mut last = -1;
    for i in 0..count {
        let value = format!("v{i}");
        let record = FutureRecord::to(TOPIC)
            .partition(0)
            .key("k")
            .payload(&value);
        let delivery = p.send(record, TIMEOUT).await.map_err(|(e, _)| e).unwrap();
        last = delivery.offset;
    }
    last
}

/// One past the last offset in the store's newest manifest of partition 0.
fn tiered_end(store: &std::path::Path) -> i64 {
    let Ok(ids) = std::fs::read_dir(store.join("topics").join(TOPIC)) else {
        return -1;
    };
    let mut end = -1;
    for id in ids {
        let dir = id.unwrap().path().join("0").join("manifest");
        let Ok(versions) = std::fs::read_dir(&dir) else {
            continue;
        };
        let newest = versions.map(|v| v.unwrap().path()).max();
        let Some(bytes) = newest.and_then(|p| std::fs::read(p).ok()) else {
            continue;
        };
        let Ok(m) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
            continue;
        };
        if let Some(next) = m["segments"]
            .as_array()
            .and_then(|s| s.last())
            .and_then(|s| s["next_offset"].as_i64())
        {
            end = end.max(next);
        }
    }
    end
}

fn produce_v(topic: &str) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(batch(&[b"x"], -1, 0, 0)))])])
}

fn fetch_v(topic_id: Uuid, current_leader_epoch: i32) -> FetchRequest {
    FetchRequest::default()
        .with_replica_id(BrokerId(-1))
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(name(TOPIC))
            .with_topic_id(topic_id)
            .with_partitions(vec![FetchPartition::default()
                .with_current_leader_epoch(current_leader_epoch)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])])
}

/// KIP-951 checks: what `raw` (connected to a broker that does not lead
/// partition 0) answers to Produce and Fetch, old and new versions.
async fn leader_hints_point_to(raw: &mut Raw, leader: i32, epoch: i32, port: u16, id: Uuid) {
    let not_leader = code(ResponseError::NotLeaderOrFollower);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 11, &produce_v(TOPIC)).await;
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, not_leader);
    assert_eq!(
        (p.current_leader.leader_id.0, p.current_leader.leader_epoch),
        (leader, epoch)
    );
    assert_eq!(resp.node_endpoints.len(), 1, "{:?}", resp.node_endpoints);
    let e = &resp.node_endpoints[0];
    assert_eq!(
        (e.node_id.0, e.host.as_str(), e.port),
        (leader, "127.0.0.1", port as i32)
    );
    // Before v10 there are no such fields.
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &produce_v(TOPIC)).await;
    let p = &resp.responses[0].partition_responses[0];
    assert_eq!(p.error_code, not_leader);
    assert_eq!(p.current_leader.leader_id.0, -1);
    assert!(resp.node_endpoints.is_empty());

    let resp: FetchResponse = raw.call(ApiKey::Fetch, 16, &fetch_v(id, -1)).await;
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, not_leader);
    assert_eq!(
        (p.current_leader.leader_id.0, p.current_leader.leader_epoch),
        (leader, epoch)
    );
    let e = &resp.node_endpoints[0];
    assert_eq!((e.node_id.0, e.port), (leader, port as i32));
    // Kafka fills them for clients from Fetch v16 on.
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 15, &fetch_v(id, -1)).await;
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, not_leader);
    assert_eq!(p.current_leader.leader_id.0, -1);
    assert!(resp.node_endpoints.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn epochs_end_where_the_next_leader_began_across_failovers() {
    let Some(mut cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", cluster.bootstrap())
        .create()
        .unwrap();
    // Idle segments roll within a second, so they soon reach the store.
    let topic = NewTopic::new(TOPIC, 1, TopicReplication::Fixed(1))
        .set("segment.ms", "1000")
        .set("strata.compaction.policy", "none");
    let created = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(created[0].is_ok(), "{created:?}");
    drop(admin);

    let (first, e1, topic_id) = new_leader(&cluster, None, -1).await;
    assert_eq!(produce(&cluster.bootstrap(), 50).await, 49);
    let mut raw = Raw::connect(cluster.bootstrap_of(first).parse().unwrap()).await;
    assert_eq!(answer(&mut raw, e1, e1).await, (0, e1, 50));

    // A broker that does not lead the partition names the one that does.
    let other = *cluster.running().iter().find(|n| **n != first).unwrap();
    let mut wrong = Raw::connect(cluster.bootstrap_of(other).parse().unwrap()).await;
    assert_eq!(
        answer(&mut wrong, e1, e1).await.0,
        code(ResponseError::NotLeaderOrFollower)
    );
    leader_hints_point_to(&mut wrong, first, e1, cluster.port(first), topic_id).await;

    // The leader is lost; the next one continues at epoch e2 from offset 50.
    cluster.kill9(first);
    let (second, e2, _) = new_leader(&cluster, Some(first), e1).await;
    assert_eq!(produce(&cluster.bootstrap(), 30).await, 79);
    let mut raw = Raw::connect(cluster.bootstrap_of(second).parse().unwrap()).await;
    assert_eq!(answer(&mut raw, e2, e1).await, (0, e1, 50));
    assert_eq!(answer(&mut raw, e2, e2).await, (0, e2, 80));
    assert_eq!(answer(&mut raw, -1, e1).await, (0, e1, 50));
    // A client still at the old epoch is fenced, one ahead is told to wait.
    assert_eq!(
        answer(&mut raw, e1, e1).await.0,
        code(ResponseError::FencedLeaderEpoch)
    );
    assert_eq!(
        answer(&mut raw, e2 + 1, e2).await.0,
        code(ResponseError::UnknownLeaderEpoch)
    );
    // A stale fetch gets FENCED_LEADER_EPOCH with the leader to go on with.
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 16, &fetch_v(topic_id, e1)).await;
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, code(ResponseError::FencedLeaderEpoch));
    assert_eq!(
        (p.current_leader.leader_id.0, p.current_leader.leader_epoch),
        (second, e2)
    );

    // Once the segments holding both epochs are in the store, the next
    // leader learns the history from there, not from a write-ahead log.
    let deadline = Instant::now() + TIMEOUT;
    while tiered_end(cluster.store.path()) < 80 {
        assert!(
            Instant::now() < deadline,
            "segments never reached the store"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.kill9(second);
    let (third, e3, _) = new_leader(&cluster, Some(second), e2).await;
    assert_eq!(produce(&cluster.bootstrap(), 20).await, 99);
    let mut raw = Raw::connect(cluster.bootstrap_of(third).parse().unwrap()).await;
    assert_eq!(answer(&mut raw, e3, e1).await, (0, e1, 50));
    assert_eq!(answer(&mut raw, e3, e2).await, (0, e2, 80));
    assert_eq!(answer(&mut raw, e3, e3).await, (0, e3, 100));
    assert_eq!(answer(&mut raw, e3, e3 + 1).await, (0, -1, -1));
    assert_eq!(
        answer(&mut raw, e2, e2).await.0,
        code(ResponseError::FencedLeaderEpoch)
    );
}
