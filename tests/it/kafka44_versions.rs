//! The versions Kafka 4.4 added, over the raw protocol: each test sends the
//! new version and checks what it changes, next to the version before it.

use crate::common;

use common::{InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

async fn cluster_and_node(raw: &mut Raw) -> (String, i32) {
    let d: DescribeClusterResponse = raw
        .call(
            ApiKey::DescribeCluster,
            1,
            &DescribeClusterRequest::default(),
        )
        .await;
    assert_eq!(d.error_code, 0);
    let node = d.brokers[0].broker_id.0;
    (d.cluster_id.to_string(), node)
}

fn advertised(resp: &ApiVersionsResponse, key: ApiKey) -> (i16, i16) {
    let e = resp
        .api_keys
        .iter()
        .find(|a| a.api_key == key as i16)
        .unwrap_or_else(|| panic!("{key:?} advertised"));
    (e.min_version, e.max_version)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_versions_v5_sends_a_client_that_names_another_cluster_or_node_to_rebootstrap() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let (cluster, node) = cluster_and_node(&mut raw).await;
    let ask = |cluster: Option<&str>, node: i32| {
        ApiVersionsRequest::default()
            .with_client_software_name(s("strata-it"))
            .with_client_software_version(s("1.0"))
            .with_cluster_id(cluster.map(s))
            .with_node_id(node)
    };

    // Not naming a cluster (a bootstrap connection): the list.
    let r: ApiVersionsResponse = raw.call(ApiKey::ApiVersions, 5, &ask(None, -1)).await;
    assert_eq!(r.error_code, 0);
    assert_eq!(advertised(&r, ApiKey::ApiVersions), (0, 5));
    assert_eq!(advertised(&r, ApiKey::DescribeGroups), (0, 6));
    assert_eq!(advertised(&r, ApiKey::DeleteGroups), (0, 3));
    assert_eq!(advertised(&r, ApiKey::DescribeCluster), (0, 2));
    assert_eq!(advertised(&r, ApiKey::DescribeLogDirs), (1, 5));
    assert_eq!(advertised(&r, ApiKey::ListOffsets), (1, 11));
    assert_eq!(advertised(&r, ApiKey::OffsetCommit), (2, 10));
    assert_eq!(advertised(&r, ApiKey::OffsetFetch), (1, 10));

    // Naming this cluster and this node: the list.
    let r: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 5, &ask(Some(&cluster), node))
        .await;
    assert_eq!(r.error_code, 0);
    assert!(!r.api_keys.is_empty());

    // Another cluster, or another node of this one: start over.
    for (c, n) in [("another-cluster", node), (cluster.as_str(), node + 1)] {
        let r: ApiVersionsResponse = raw.call(ApiKey::ApiVersions, 5, &ask(Some(c), n)).await;
        assert_eq!(
            r.error_code,
            ResponseError::RebootstrapRequired.code(),
            "{c} {n}"
        );
        assert!(r.api_keys.is_empty());
    }

    // One without the other is malformed.
    for req in [ask(Some(&cluster), -1), ask(None, node)] {
        let r: ApiVersionsResponse = raw.call(ApiKey::ApiVersions, 5, &req).await;
        assert_eq!(r.error_code, ResponseError::InvalidRequest.code());
    }

    // v4 has no such fields: a wrong guess cannot be sent, the list comes.
    let r: ApiVersionsResponse = raw.call(ApiKey::ApiVersions, 4, &ask(None, -1)).await;
    assert_eq!(r.error_code, 0);
    assert!(!r.api_keys.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_groups_v6_answers_group_id_not_found_for_a_group_that_does_not_exist() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let req = DescribeGroupsRequest::default().with_groups(vec![s("nobody-here").into()]);

    let v5: DescribeGroupsResponse = raw.call(ApiKey::DescribeGroups, 5, &req).await;
    let g = &v5.groups[0];
    assert_eq!((g.error_code, g.group_state.as_str()), (0, "Dead"));

    let v6: DescribeGroupsResponse = raw.call(ApiKey::DescribeGroups, 6, &req).await;
    let g = &v6.groups[0];
    assert_eq!(g.group_id.as_str(), "nobody-here");
    assert_eq!(g.error_code, ResponseError::GroupIdNotFound.code());
    assert_eq!(g.group_state.as_str(), "Dead");
    assert_eq!(
        g.error_message.as_deref(),
        Some("Group nobody-here not found.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_groups_v3_says_why_a_group_was_not_deleted() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let req = DeleteGroupsRequest::default().with_groups_names(vec![s("never-was").into()]);

    let v2: DeleteGroupsResponse = raw.call(ApiKey::DeleteGroups, 2, &req).await;
    assert_eq!(
        v2.results[0].error_code,
        ResponseError::GroupIdNotFound.code()
    );
    assert_eq!(v2.results[0].error_message, None);

    let v3: DeleteGroupsResponse = raw.call(ApiKey::DeleteGroups, 3, &req).await;
    let r = &v3.results[0];
    assert_eq!(r.group_id.as_str(), "never-was");
    assert_eq!(r.error_code, ResponseError::GroupIdNotFound.code());
    let message = r.error_message.as_deref().expect("v3 says why");
    assert!(message.contains("does not exist"), "{message}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_cluster_v2_and_describe_log_dirs_v5_show_no_fenced_broker_and_no_cordoned_dir() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let (cluster, node) = cluster_and_node(&mut raw).await;

    for include_fenced in [false, true] {
        let req = DescribeClusterRequest::default()
            .with_endpoint_type(1)
            .with_include_fenced_brokers(include_fenced);
        let r: DescribeClusterResponse = raw.call(ApiKey::DescribeCluster, 2, &req).await;
        assert_eq!(r.error_code, 0);
        assert_eq!(r.cluster_id.as_str(), cluster);
        assert_eq!(r.brokers.len(), 1);
        assert_eq!(r.brokers[0].broker_id.0, node);
        assert!(!r.brokers[0].is_fenced);
    }

    let r: DescribeLogDirsResponse = raw
        .call(
            ApiKey::DescribeLogDirs,
            5,
            &DescribeLogDirsRequest::default(),
        )
        .await;
    assert_eq!(r.error_code, 0);
    // The data directory and the object store.
    assert_eq!(r.results.len(), 2);
    for dir in &r.results {
        assert_eq!(dir.error_code, 0);
        assert!(!dir.is_cordoned, "{:?}", dir.log_dir);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_commit_and_fetch_v10_name_topics_by_id() {
    use kafka_protocol::messages::offset_commit_request::{
        OffsetCommitRequestPartition, OffsetCommitRequestTopic,
    };
    use kafka_protocol::messages::offset_fetch_request::{
        OffsetFetchRequestGroup, OffsetFetchRequestTopic, OffsetFetchRequestTopics,
    };
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let created = raw.create_topic("by-id", 2, &[]).await;
    assert_eq!(created.error_code, 0);
    let id = created.topic_id;
    let nobody = uuid::Uuid::new_v4();

    let commit = OffsetCommitRequest::default()
        .with_group_id(s("g10").into())
        .with_topics(vec![
            OffsetCommitRequestTopic::default()
                .with_topic_id(id)
                .with_partitions(vec![
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(42),
                    OffsetCommitRequestPartition::default()
                        .with_partition_index(1)
                        .with_committed_offset(7),
                ]),
            OffsetCommitRequestTopic::default()
                .with_topic_id(nobody)
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(1)]),
        ]);
    let r: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 10, &commit).await;
    let mut answers: Vec<_> = r
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions
                .iter()
                .map(move |p| (t.topic_id, p.partition_index, p.error_code))
        })
        .collect();
    answers.sort();
    let mut expected = vec![
        (id, 0, 0),
        (id, 1, 0),
        (nobody, 0, ResponseError::UnknownTopicId.code()),
    ];
    expected.sort();
    assert_eq!(answers, expected);

    // By id, asked for and all of the group's.
    let fetch = |topics: Option<Vec<OffsetFetchRequestTopics>>| {
        OffsetFetchRequest::default().with_groups(vec![OffsetFetchRequestGroup::default()
            .with_group_id(s("g10").into())
            .with_topics(topics)])
    };
    let asked = fetch(Some(vec![
        OffsetFetchRequestTopics::default()
            .with_topic_id(id)
            .with_partition_indexes(vec![0, 1]),
        OffsetFetchRequestTopics::default()
            .with_topic_id(nobody)
            .with_partition_indexes(vec![0]),
    ]));
    for req in [asked, fetch(None)] {
        let r: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 10, &req).await;
        let g = &r.groups[0];
        assert_eq!(g.error_code, 0);
        let mut got: Vec<_> = g
            .topics
            .iter()
            .flat_map(|t| {
                t.partitions.iter().map(move |p| {
                    (
                        t.topic_id,
                        p.partition_index,
                        p.committed_offset,
                        p.error_code,
                    )
                })
            })
            .collect();
        got.sort();
        let mut want = vec![(id, 0, 42, 0), (id, 1, 7, 0)];
        if req.groups[0].topics.is_some() {
            want.push((nobody, 0, -1, ResponseError::UnknownTopicId.code()));
        }
        want.sort();
        assert_eq!(got, want);
    }

    // The same offsets by name, at v7.
    let by_name = OffsetFetchRequest::default()
        .with_group_id(s("g10").into())
        .with_topics(Some(vec![OffsetFetchRequestTopic::default()
            .with_name(s("by-id").into())
            .with_partition_indexes(vec![0, 1])]));
    let r: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 7, &by_name).await;
    let offsets: Vec<_> = r.topics[0]
        .partitions
        .iter()
        .map(|p| (p.partition_index, p.committed_offset))
        .collect();
    assert_eq!(offsets, vec![(0, 42), (1, 7)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_v13_names_topics_by_id_and_fetch_v18_reads_them() {
    use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
    use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let created = raw.create_topic("produce-by-id", 1, &[]).await;
    assert_eq!(created.error_code, 0);
    let id = created.topic_id;
    let nobody = uuid::Uuid::new_v4();

    let by_id = |topic_id, value: &[u8]| {
        TopicProduceData::default()
            .with_topic_id(topic_id)
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(0)
                .with_records(Some(common::batch(&[value], -1, -1, -1)))])
    };
    let req = ProduceRequest::default()
        .with_acks(-1)
        .with_timeout_ms(5000)
        .with_topic_data(vec![by_id(id, b"first"), by_id(nobody, b"lost")]);
    let r: ProduceResponse = raw.call(ApiKey::Produce, 13, &req).await;
    let mut answers: Vec<_> = r
        .responses
        .iter()
        .map(|t| {
            let p = &t.partition_responses[0];
            (t.topic_id, p.error_code, p.base_offset)
        })
        .collect();
    answers.sort();
    let mut expected = vec![
        (id, 0, 0),
        (nobody, ResponseError::UnknownTopicId.code(), -1),
    ];
    expected.sort();
    assert_eq!(answers, expected);

    // The same topic by name at v12 appends after it.
    let (code, offset) = raw
        .produce_result("produce-by-id", 0, common::batch(&[b"second"], -1, -1, -1))
        .await;
    assert_eq!((code, offset), (0, 1));

    let fetch = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic_id(id)
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let r: FetchResponse = raw.call(ApiKey::Fetch, 18, &fetch).await;
    assert_eq!(r.responses[0].topic_id, id);
    let p = &r.responses[0].partitions[0];
    assert_eq!((p.error_code, p.high_watermark), (0, 2));
    let mut records = p.records.clone().expect("records");
    let values: Vec<_> = kafka_protocol::records::RecordBatchDecoder::decode_all(&mut records)
        .expect("decodes")
        .into_iter()
        .flat_map(|set| set.records)
        .map(|r| r.value.expect("value"))
        .collect();
    assert_eq!(values, vec![&b"first"[..], &b"second"[..]]);
}

fn finalized(resp: &ApiVersionsResponse) -> (i64, Vec<(String, i16)>) {
    let levels = resp
        .finalized_features
        .iter()
        .map(|f| (f.name.to_string(), f.max_version_level))
        .collect();
    (resp.finalized_features_epoch, levels)
}

/// UpdateFeatures as `kafka-features.sh` sends it (v1 on: an upgrade type).
fn update_features(feature: &str, level: i16, upgrade_type: i8) -> UpdateFeaturesRequest {
    use kafka_protocol::messages::update_features_request::FeatureUpdateKey;
    UpdateFeaturesRequest::default()
        .with_timeout_ms(5000)
        .with_feature_updates(vec![FeatureUpdateKey::default()
            .with_feature(s(feature))
            .with_max_version_level(level)
            .with_upgrade_type(upgrade_type)])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn update_features_turns_the_consumer_protocol_off_and_the_level_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let start = || async {
        strata::server::Server::start(common::config(dir.path(), &[]))
            .await
            .unwrap()
    };
    let server = start().await;
    let mut raw = Raw::connect(server.local_addr()).await;
    let versions: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default())
        .await;
    assert_eq!(advertised(&versions, ApiKey::UpdateFeatures), (0, 2));
    assert_eq!(
        finalized(&versions),
        (
            0,
            vec![
                ("group.version".into(), 1),
                ("share.version".into(), 1),
                ("streams.version".into(), 1),
                ("transaction.version".into(), 2)
            ]
        )
    );
    let supported: Vec<_> = versions
        .supported_features
        .iter()
        .map(|f| (f.name.to_string(), f.min_version, f.max_version))
        .collect();
    assert_eq!(
        supported,
        vec![
            ("group.version".to_string(), 0, 1),
            ("transaction.version".to_string(), 0, 2),
            ("streams.version".to_string(), 0, 1),
            ("share.version".to_string(), 0, 1)
        ]
    );

    // A downgrade sent as an upgrade, and a level nobody supports: refused
    // at the top level, with nothing changed.
    for (level, upgrade) in [(0, 1), (2, 1)] {
        let r: UpdateFeaturesResponse = raw
            .call(
                ApiKey::UpdateFeatures,
                1,
                &update_features("group.version", level, upgrade),
            )
            .await;
        assert_eq!(r.error_code, ResponseError::InvalidUpdateVersion.code());
        assert!(r.results.is_empty());
    }
    let validate = update_features("group.version", 0, 2).with_validate_only(true);
    let r: UpdateFeaturesResponse = raw.call(ApiKey::UpdateFeatures, 2, &validate).await;
    assert_eq!(r.error_code, 0);
    let versions: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default())
        .await;
    assert_eq!(finalized(&versions).0, 0, "validate_only changes nothing");

    let r: UpdateFeaturesResponse = raw
        .call(
            ApiKey::UpdateFeatures,
            1,
            &update_features("group.version", 0, 2),
        )
        .await;
    assert_eq!(r.error_code, 0);
    assert_eq!(r.results.len(), 1);
    assert_eq!(
        (r.results[0].feature.as_str(), r.results[0].error_code),
        ("group.version", 0)
    );
    drop(raw);
    server.shutdown().await.unwrap();

    let server = start().await;
    let mut raw = Raw::connect(server.local_addr()).await;
    let versions: ApiVersionsResponse = raw
        .call(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default())
        .await;
    assert_eq!(
        finalized(&versions),
        (
            1,
            vec![
                ("share.version".into(), 1),
                ("streams.version".into(), 1),
                ("transaction.version".into(), 2)
            ]
        )
    );
    let heartbeat = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(s("off").into())
        .with_member_id(s(&uuid::Uuid::new_v4().to_string()))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(30000)
        .with_subscribed_topic_names(Some(vec![s("t").into()]))
        .with_topic_partitions(Some(vec![]));
    let r: ConsumerGroupHeartbeatResponse = raw
        .call(ApiKey::ConsumerGroupHeartbeat, 1, &heartbeat)
        .await;
    assert_eq!(r.error_code, ResponseError::UnsupportedVersion.code());

    // Back on (v0: allow_downgrade false is an upgrade).
    use kafka_protocol::messages::update_features_request::FeatureUpdateKey;
    let v0 = UpdateFeaturesRequest::default()
        .with_timeout_ms(5000)
        .with_feature_updates(vec![FeatureUpdateKey::default()
            .with_feature(s("group.version"))
            .with_max_version_level(1)]);
    let r: UpdateFeaturesResponse = raw.call(ApiKey::UpdateFeatures, 0, &v0).await;
    assert_eq!(r.error_code, 0);
    let r: ConsumerGroupHeartbeatResponse = raw
        .call(ApiKey::ConsumerGroupHeartbeat, 1, &heartbeat)
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert!(r.member_epoch >= 1);
    drop(raw);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_feature_level_set_through_one_broker_reaches_the_others() {
    let Some(cluster) = common::cluster::Cluster::start(&[1, 2]).await else {
        return;
    };
    let addr = |node: i32| -> std::net::SocketAddr {
        format!("127.0.0.1:{}", cluster.port(node)).parse().unwrap()
    };
    let mut one = Raw::connect(addr(1)).await;
    let r: UpdateFeaturesResponse = one
        .call(
            ApiKey::UpdateFeatures,
            2,
            &update_features("group.version", 0, 2),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let mut two = Raw::connect(addr(2)).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let versions: ApiVersionsResponse = two
            .call(ApiKey::ApiVersions, 4, &ApiVersionsRequest::default())
            .await;
        if finalized(&versions)
            == (
                1,
                vec![
                    ("share.version".into(), 1),
                    ("streams.version".into(), 1),
                    ("transaction.version".into(), 2),
                ],
            )
        {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            finalized(&versions)
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    // The next update is checked against the stored level, whichever broker takes it.
    let r: UpdateFeaturesResponse = two
        .call(
            ApiKey::UpdateFeatures,
            2,
            &update_features("group.version", 0, 2),
        )
        .await;
    assert_eq!(r.error_code, 0, "a no-op downgrade to the current level");
    let r: UpdateFeaturesResponse = two
        .call(
            ApiKey::UpdateFeatures,
            2,
            &update_features("group.version", 1, 2),
        )
        .await;
    assert_eq!(r.error_code, ResponseError::InvalidUpdateVersion.code());
}

/// A Streams member's first heartbeat, as Kafka Streams sends it, for a
/// topology reading `source` into a store with a changelog.
fn streams_join(group: &str, source: &str) -> StreamsGroupHeartbeatRequest {
    use kafka_protocol::messages::streams_group_heartbeat_request::{
        Subtopology, TopicInfo, Topology,
    };
    StreamsGroupHeartbeatRequest::default()
        .with_group_id(s(group).into())
        .with_member_id(s(&uuid::Uuid::new_v4().to_string()))
        .with_member_epoch(0)
        .with_endpoint_information_epoch(-1)
        .with_rebalance_timeout_ms(30000)
        .with_process_id(Some(s("p1")))
        .with_topology(Some(Topology::default().with_subtopologies(vec![
            Subtopology::default()
                .with_subtopology_id(s("0"))
                .with_source_topics(vec![s(source).into()])
                .with_state_changelog_topics(vec![TopicInfo::default()
                    .with_name(s(&format!("{group}-store-changelog")).into())]),
        ])))
        .with_active_tasks(Some(vec![]))
        .with_standby_tasks(Some(vec![]))
        .with_warmup_tasks(Some(vec![]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_groups_answer_with_statuses_and_streams_version_zero_turns_them_off() {
    let server = InProcess::start(&["--group-streams-initial-rebalance-delay-ms", "0"]).await;
    let mut raw = Raw::connect(server.addr()).await;
    // No source topic yet: a member at the group's epoch, no tasks, and why.
    let r: StreamsGroupHeartbeatResponse = raw
        .call(
            ApiKey::StreamsGroupHeartbeat,
            1,
            &streams_join("sg", "sg-in"),
        )
        .await;
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    let status: Vec<(i8, String)> = r
        .status
        .unwrap()
        .iter()
        .map(|st| (st.status_code, st.status_detail.to_string()))
        .collect();
    assert_eq!(
        status,
        vec![(1, "Source topics sg-in are missing.".to_string())]
    );
    assert_eq!(r.active_tasks, Some(vec![]));
    assert_eq!(r.acceptable_recovery_lag, 10_000);
    // A Kafka internal topic in a topology is refused.
    let bad: StreamsGroupHeartbeatResponse = raw
        .call(
            ApiKey::StreamsGroupHeartbeat,
            1,
            &streams_join("sg2", "__consumer_offsets"),
        )
        .await;
    assert_eq!(bad.error_code, ResponseError::StreamsInvalidTopology.code());
    let d: StreamsGroupDescribeResponse = raw
        .call(
            ApiKey::StreamsGroupDescribe,
            0,
            &StreamsGroupDescribeRequest::default()
                .with_group_ids(vec![s("sg").into(), s("none").into()]),
        )
        .await;
    assert_eq!(d.groups[0].group_state.as_str(), "NotReady");
    assert_eq!(d.groups[0].members.len(), 1);
    assert_eq!(
        d.groups[1].error_code,
        ResponseError::GroupIdNotFound.code()
    );

    let off: UpdateFeaturesResponse = raw
        .call(
            ApiKey::UpdateFeatures,
            1,
            &update_features("streams.version", 0, 2),
        )
        .await;
    assert_eq!(off.error_code, 0);
    let r: StreamsGroupHeartbeatResponse = raw
        .call(
            ApiKey::StreamsGroupHeartbeat,
            1,
            &streams_join("sg3", "sg-in"),
        )
        .await;
    assert_eq!(r.error_code, ResponseError::UnsupportedVersion.code());
}

/// The member's tasks as a heartbeat reports them.
fn owned(
    r: &StreamsGroupHeartbeatResponse,
) -> Option<Vec<streams_group_heartbeat_request::TaskIds>> {
    r.active_tasks.as_ref().map(|ts| {
        ts.iter()
            .map(|t| {
                streams_group_heartbeat_request::TaskIds::default()
                    .with_subtopology_id(t.subtopology_id.clone())
                    .with_partitions(t.partitions.clone())
            })
            .collect()
    })
}

/// The group's coordinator, asked of `via` until one answers.
async fn streams_coordinator(via: std::net::SocketAddr, group: &str, not: i32) -> i32 {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        if let Ok(mut raw) =
            tokio::time::timeout(std::time::Duration::from_secs(2), Raw::connect(via)).await
        {
            let found: FindCoordinatorResponse = raw
                .call(
                    ApiKey::FindCoordinator,
                    2,
                    &FindCoordinatorRequest::default().with_key(s(group)),
                )
                .await;
            if found.error_code == 0 && found.node_id.0 != not {
                return found.node_id.0;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no coordinator for {group}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_a_streams_group_survives_its_coordinator_being_killed() {
    let Some(mut cluster) = common::cluster::Cluster::start(&[1, 2]).await else {
        return;
    };
    common::clients::create_topic(&cluster.bootstrap(), "sgc-in", 3, &[]).await;
    let port = |c: &common::cluster::Cluster, node: i32| -> std::net::SocketAddr {
        format!("127.0.0.1:{}", c.port(node)).parse().unwrap()
    };
    let first = streams_coordinator(port(&cluster, 1), "sgc", -1).await;
    let mut raw = Raw::connect(port(&cluster, first)).await;
    // Join, then heartbeat until the broker has created the changelog and
    // assigned all three tasks.
    let join = streams_join("sgc", "sgc-in");
    let member = join.member_id.clone();
    let mut r: StreamsGroupHeartbeatResponse =
        raw.call(ApiKey::StreamsGroupHeartbeat, 1, &join).await;
    let mut tasks = owned(&r).unwrap_or_default();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while tasks.iter().map(|t| t.partitions.len()).sum::<usize>() < 3 {
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
        assert!(std::time::Instant::now() < deadline, "no tasks: {r:?}");
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        let beat = StreamsGroupHeartbeatRequest::default()
            .with_group_id(s("sgc").into())
            .with_member_id(member.clone())
            .with_member_epoch(r.member_epoch)
            .with_endpoint_information_epoch(r.endpoint_information_epoch)
            .with_active_tasks(Some(tasks.clone()))
            .with_standby_tasks(Some(vec![]))
            .with_warmup_tasks(Some(vec![]));
        r = raw.call(ApiKey::StreamsGroupHeartbeat, 1, &beat).await;
        if let Some(t) = owned(&r) {
            tasks = t;
        }
    }
    let epoch = r.member_epoch;
    let internal = common::cluster::leaders(&cluster.bootstrap(), "sgc-store-changelog", 3);
    assert!(
        internal.is_some_and(|l| l.len() == 3),
        "changelog not created with 3 partitions"
    );

    // The coordinator dies; the other broker takes the offsets topic over
    // and knows the member, its epoch and its tasks.
    cluster.kill9(first);
    let survivor = if first == 1 { 2 } else { 1 };
    let next = streams_coordinator(port(&cluster, survivor), "sgc", first).await;
    let mut raw = Raw::connect(port(&cluster, next)).await;
    let beat = StreamsGroupHeartbeatRequest::default()
        .with_group_id(s("sgc").into())
        .with_member_id(member.clone())
        .with_member_epoch(epoch)
        .with_endpoint_information_epoch(-1)
        .with_active_tasks(Some(tasks.clone()))
        .with_standby_tasks(Some(vec![]))
        .with_warmup_tasks(Some(vec![]));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let r = loop {
        let r: StreamsGroupHeartbeatResponse =
            raw.call(ApiKey::StreamsGroupHeartbeat, 1, &beat).await;
        let retriable = [
            ResponseError::NotCoordinator.code(),
            ResponseError::CoordinatorNotAvailable.code(),
            ResponseError::CoordinatorLoadInProgress.code(),
        ];
        if !retriable.contains(&r.error_code) || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    };
    assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    assert_eq!(r.member_epoch, epoch);
    assert_eq!(r.active_tasks, None, "the assignment did not change");
}
