//! Fetch sessions (KIP-227) over the raw protocol: a full fetch opens a
//! session, incremental fetches answer only partitions that changed, and
//! bad session ids, epochs and versions get Kafka's errors without harming
//! the session or the connection.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use common::{batch, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_topics_request::CreatableTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic, ForgottenTopic};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

const V: i16 = 13;

fn name(s: &str) -> TopicName {
    TopicName(StrBytes::from_string(s.to_string()))
}

async fn create(raw: &mut Raw, topic: &str, partitions: i32) -> Uuid {
    let req = CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(1)]);
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &req).await;
    assert_eq!(resp.topics[0].error_code, 0);
    resp.topics[0].topic_id
}

async fn produce(raw: &mut Raw, topic: &str, partition: i32, value: &[u8]) {
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(batch(&[value], -1, 0, 0)))])]);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req).await;
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
}

fn partition(index: i32, offset: i64) -> FetchPartition {
    FetchPartition::default()
        .with_partition(index)
        .with_fetch_offset(offset)
        .with_partition_max_bytes(1 << 20)
}

fn request(session_id: i32, epoch: i32, topics: Vec<FetchTopic>) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_session_id(session_id)
        .with_session_epoch(epoch)
        .with_topics(topics)
}

/// (partition, records bytes, high watermark) of every partition answered.
fn answered(resp: &FetchResponse) -> Vec<(i32, usize, i64)> {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| {
            (
                p.partition_index,
                p.records.as_ref().map_or(0, |r| r.len()),
                p.high_watermark,
            )
        })
        .collect()
}

#[tokio::test]
async fn incremental_fetches_answer_only_partitions_that_changed() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let id = create(&mut raw, "sessions", 4).await;
    for p in 0..4 {
        produce(&mut raw, "sessions", p, b"first").await;
    }
    let all = FetchTopic::default()
        .with_topic_id(id)
        .with_partitions((0..4).map(|p| partition(p, 0)).collect());
    let full: FetchResponse = raw.call(ApiKey::Fetch, V, &request(0, 0, vec![all])).await;
    assert_eq!(full.error_code, 0);
    let session = full.session_id;
    assert_ne!(session, 0, "a full fetch opens a session");
    let first = answered(&full);
    assert_eq!(first.len(), 4);
    assert!(first.iter().all(|&(_, bytes, hw)| bytes > 0 && hw == 1));

    // The client moves its positions to 1; nothing new: nothing answered.
    let moved = FetchTopic::default()
        .with_topic_id(id)
        .with_partitions((0..4).map(|p| partition(p, 1)).collect());
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 1, vec![moved]))
        .await;
    assert_eq!((r.error_code, r.session_id), (0, session));
    assert_eq!(answered(&r), vec![]);

    // A record on partition 2 only: an incremental fetch naming no partition
    // reads all four at their session positions and answers partition 2.
    produce(&mut raw, "sessions", 2, b"second").await;
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 2, vec![]))
        .await;
    let got = answered(&r);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!((got[0].0, got[0].2), (2, 2));
    assert!(got[0].1 > 0);
    assert_eq!(r.responses[0].topic_id, id);

    // Forgetting partition 2 and a new record there: not answered any more;
    // a new record on partition 0 is.
    produce(&mut raw, "sessions", 2, b"third").await;
    produce(&mut raw, "sessions", 0, b"fourth").await;
    let forget =
        request(session, 3, vec![]).with_forgotten_topics_data(vec![ForgottenTopic::default()
            .with_topic_id(id)
            .with_partitions(vec![2])]);
    let r: FetchResponse = raw.call(ApiKey::Fetch, V, &forget).await;
    let got = answered(&r);
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), vec![0]);

    // Epoch -1 closes the session: the id is unknown afterwards.
    let close: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, -1, vec![]))
        .await;
    assert_eq!((close.error_code, close.session_id), (0, 0));
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 4, vec![]))
        .await;
    assert_eq!(r.error_code, ResponseError::FetchSessionIdNotFound.code());
}

#[tokio::test]
async fn session_errors_are_kafkas_and_leave_the_session_usable() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let id = create(&mut raw, "session-errors", 1).await;
    let topic = FetchTopic::default()
        .with_topic_id(id)
        .with_partitions(vec![partition(0, 0)]);
    let full: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(0, 0, vec![topic]))
        .await;
    let session = full.session_id;
    assert_ne!(session, 0);

    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session ^ 0x1234, 1, vec![]))
        .await;
    assert_eq!(r.error_code, ResponseError::FetchSessionIdNotFound.code());
    assert_eq!(r.session_id, 0);
    assert!(r.responses.is_empty());

    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 5, vec![]))
        .await;
    assert_eq!(r.error_code, ResponseError::InvalidFetchSessionEpoch.code());

    // A v12 request (topics by name) on a session opened with topic ids.
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, 12, &request(session, 1, vec![]))
        .await;
    assert_eq!(r.error_code, ResponseError::FetchSessionTopicIdError.code());

    // None of that used the epoch up.
    produce(&mut raw, "session-errors", 0, b"v").await;
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 1, vec![]))
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(answered(&r).len(), 1);

    // A new full request naming the session replaces it.
    let topic = FetchTopic::default()
        .with_topic_id(id)
        .with_partitions(vec![partition(0, 0)]);
    let again: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 0, vec![topic]))
        .await;
    assert_ne!(again.session_id, 0);
    assert_ne!(again.session_id, session);
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, V, &request(session, 2, vec![]))
        .await;
    assert_eq!(r.error_code, ResponseError::FetchSessionIdNotFound.code());
}

#[tokio::test]
async fn sessions_by_topic_name_before_v13_and_none_before_v7() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    create(&mut raw, "by-name", 2).await;
    produce(&mut raw, "by-name", 1, b"x").await;
    let topic = || {
        FetchTopic::default()
            .with_topic(name("by-name"))
            .with_partitions(vec![partition(0, 0), partition(1, 0)])
    };
    let full: FetchResponse = raw
        .call(ApiKey::Fetch, 12, &request(0, 0, vec![topic()]))
        .await;
    assert_ne!(full.session_id, 0);
    let r: FetchResponse = raw
        .call(ApiKey::Fetch, 12, &request(full.session_id, 1, vec![]))
        .await;
    assert_eq!(r.error_code, 0);
    // Partition 0 is empty and unchanged; partition 1 still has a record at
    // the position the client left in the session, so it is answered again.
    let got = answered(&r);
    assert_eq!(
        got.iter().map(|g| (g.0, g.2)).collect::<Vec<_>>(),
        vec![(1, 1)]
    );
    assert_eq!(r.responses[0].topic, name("by-name"));

    let old: FetchResponse = raw
        .call(ApiKey::Fetch, 6, &request(0, -1, vec![topic()]))
        .await;
    assert_eq!(old.session_id, 0);
    assert_eq!(answered(&old).len(), 2);
}
