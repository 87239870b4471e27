//! What a broker running alone says about replicas, log directories and the
//! metadata quorum, over the raw protocol: Kafka's answers for a single
//! broker with a single data directory.

use crate::common;

use common::{topic_name, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_broker_refuses_more_than_one_replica_and_takes_minus_one_as_one() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let create = |name: &str, factor: i16| {
        CreateTopicsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![create_topics_request::CreatableTopic::default()
                .with_name(topic_name(name))
                .with_num_partitions(1)
                .with_replication_factor(factor)])
    };
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &create("three", 3)).await;
    let t = &resp.topics[0];
    assert_eq!(t.error_code, ResponseError::InvalidReplicationFactor.code());
    assert_eq!(
        t.error_message.as_deref(),
        Some("Unable to replicate the partition 3 time(s): The target replication factor of 3 cannot be reached because only 1 broker(s) are registered.")
    );

    let resp: CreateTopicsResponse = raw
        .call(ApiKey::CreateTopics, 7, &create("default", -1))
        .await;
    let t = &resp.topics[0];
    assert_eq!((t.error_code, t.replication_factor), (0, 1));
}
