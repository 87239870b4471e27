//! What a broker running alone says about replicas, log directories and the
//! metadata quorum, over the raw protocol: Kafka's answers for a single
//! broker with a single data directory.

use crate::common;

use common::{topic_name, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_replica_log_dirs_request::{
    AlterReplicaLogDir, AlterReplicaLogDirTopic,
};
use kafka_protocol::messages::describe_quorum_request::{PartitionData, TopicData};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn move_to(dir: &str, topic: &str, partitions: Vec<i32>) -> AlterReplicaLogDir {
    AlterReplicaLogDir::default()
        .with_path(StrBytes::from_string(dir.to_string()))
        .with_topics(vec![AlterReplicaLogDirTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(partitions)])
}

/// (topic, partition) → error code.
fn codes(resp: &AlterReplicaLogDirsResponse) -> Vec<(String, i32, i16)> {
    resp.results
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(|p| (t.topic_name.0.to_string(), p.partition_index, p.error_code))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_may_be_moved_only_to_the_directory_it_is_already_in() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    assert_eq!(raw.create_topic("moves", 2, &[]).await.error_code, 0);

    // The directory names DescribeLogDirs gives are the ones to ask for.
    let dirs: DescribeLogDirsResponse = raw
        .call(
            ApiKey::DescribeLogDirs,
            4,
            &DescribeLogDirsRequest::default().with_topics(None),
        )
        .await;
    let data_dir = dirs.results[0].log_dir.to_string();
    assert!(std::path::Path::new(&data_dir).is_absolute(), "{data_dir}");

    for version in [1, 2] {
        let req = AlterReplicaLogDirsRequest::default().with_dirs(vec![
            move_to(&data_dir, "moves", vec![0, 1, 7]),
            move_to("/somewhere/else", "elsewhere", vec![0]),
            move_to(&data_dir, "missing", vec![0]),
        ]);
        let resp: AlterReplicaLogDirsResponse =
            raw.call(ApiKey::AlterReplicaLogDirs, version, &req).await;
        assert_eq!(
            codes(&resp),
            vec![
                ("elsewhere".into(), 0, ResponseError::LogDirNotFound.code()),
                (
                    "missing".into(),
                    0,
                    ResponseError::UnknownTopicOrPartition.code()
                ),
                ("moves".into(), 0, 0),
                ("moves".into(), 1, 0),
                (
                    "moves".into(),
                    7,
                    ResponseError::UnknownTopicOrPartition.code()
                ),
            ],
            "v{version}"
        );
    }

    // An unknown directory is refused before the partition is looked at.
    let req = AlterReplicaLogDirsRequest::default().with_dirs(vec![move_to(
        &format!("{data_dir}/"),
        "moves",
        vec![0],
    )]);
    let resp: AlterReplicaLogDirsResponse = raw.call(ApiKey::AlterReplicaLogDirs, 2, &req).await;
    assert_eq!(
        codes(&resp),
        vec![("moves".into(), 0, ResponseError::LogDirNotFound.code())]
    );

    // ApiVersions advertises Kafka 4's versions.
    let versions: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 3, &ApiVersionsRequest::default())
        .await;
    let entry = versions
        .api_keys
        .iter()
        .find(|a| a.api_key == ApiKey::AlterReplicaLogDirs as i16)
        .expect("AlterReplicaLogDirs advertised");
    assert_eq!((entry.min_version, entry.max_version), (1, 2));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_metadata_quorum_of_a_single_broker_has_no_negative_field() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let req = DescribeQuorumRequest::default().with_topics(vec![TopicData::default()
        .with_topic_name(topic_name("__cluster_metadata"))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    for version in 0..=2 {
        let resp: DescribeQuorumResponse = raw.call(ApiKey::DescribeQuorum, version, &req).await;
        assert_eq!(resp.error_code, 0);
        let p = &resp.topics[0].partitions[0];
        assert_eq!(p.error_code, 0);
        assert!(p.leader_id.0 >= 0 && p.leader_epoch >= 0 && p.high_watermark >= 0);
        assert_eq!(p.current_voters.len(), 1);
        for r in p.current_voters.iter().chain(&p.observers) {
            assert_eq!(r.replica_id, p.leader_id);
            assert!(r.log_end_offset >= 0, "v{version}: {r:?}");
            // v0 has no times (they decode as -1).
            if version >= 1 {
                assert!(r.last_fetch_timestamp >= 0, "v{version}: {r:?}");
                assert!(r.last_caught_up_timestamp >= 0, "v{version}: {r:?}");
            }
        }
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_replica_assignments_must_name_registered_brokers_once_each() {
    use create_partitions_request::{CreatePartitionsAssignment, CreatePartitionsTopic};
    use create_topics_request::{CreatableReplicaAssignment, CreatableTopic};
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let invalid = ResponseError::InvalidReplicaAssignment.code();
    let create = |name: &str, replicas: Vec<Vec<i32>>| {
        let assignments = replicas
            .into_iter()
            .enumerate()
            .map(|(i, ids)| {
                CreatableReplicaAssignment::default()
                    .with_partition_index(i as i32)
                    .with_broker_ids(ids.into_iter().map(BrokerId).collect())
            })
            .collect();
        CreateTopicsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(topic_name(name))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
                .with_assignments(assignments)])
    };
    let cases = [
        (
            "unknown",
            vec![vec![7]],
            invalid,
            "includes broker 7, but no such broker is registered",
        ),
        (
            "twice",
            vec![vec![1, 1]],
            invalid,
            "includes the broker 1 more than once",
        ),
        (
            "empty",
            vec![vec![1], vec![]],
            invalid,
            "an empty replica list",
        ),
        ("mine", vec![vec![1], vec![1]], 0, ""),
    ];
    for (name, replicas, code, message) in cases {
        let resp: CreateTopicsResponse = raw
            .call(ApiKey::CreateTopics, 7, &create(name, replicas))
            .await;
        let t = &resp.topics[0];
        assert_eq!(t.error_code, code, "{name}: {:?}", t.error_message);
        assert!(
            t.error_message.as_deref().unwrap_or("").contains(message),
            "{name}: {:?}",
            t.error_message
        );
    }

    let mut twice = create("twice-0", vec![vec![1], vec![1]]);
    twice.topics[0].assignments[1].partition_index = 0;
    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &twice).await;
    assert_eq!(
        resp.topics[0].error_message.as_deref(),
        Some("Found multiple manual partition assignments for partition 0")
    );

    let grow = |count: i32, replicas: Vec<Vec<i32>>| {
        let assignments = replicas
            .into_iter()
            .map(|ids| {
                CreatePartitionsAssignment::default()
                    .with_broker_ids(ids.into_iter().map(BrokerId).collect())
            })
            .collect();
        CreatePartitionsRequest::default()
            .with_timeout_ms(5000)
            .with_topics(vec![CreatePartitionsTopic::default()
                .with_name(topic_name("mine"))
                .with_count(count)
                .with_assignments(Some(assignments))])
    };
    let cases = [
        (
            4,
            vec![vec![1]],
            invalid,
            "Attempted to add 2 additional partition(s), but only 1 assignment(s) were specified.",
        ),
        (
            4,
            vec![vec![1], vec![0]],
            invalid,
            "includes broker 0, but no such broker is registered",
        ),
        (4, vec![vec![1], vec![1]], 0, ""),
    ];
    for (count, replicas, code, message) in cases {
        let resp: CreatePartitionsResponse = raw
            .call(ApiKey::CreatePartitions, 3, &grow(count, replicas))
            .await;
        let r = &resp.results[0];
        assert_eq!(r.error_code, code, "{:?}", r.error_message);
        assert!(
            r.error_message.as_deref().unwrap_or("").contains(message),
            "{:?}",
            r.error_message
        );
    }
}
