//! What runs on top of partitions keeps working when the partitions are led
//! by different brokers: consumer groups whose members talk to different
//! brokers, compaction jobs taken by the workers every broker runs, and
//! admin requests sent to any broker.

use crate::common;
use common::clients::{self, create_topic, reader};

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{all_leaders, consume_to_end, wait_for_leaders, Cluster, Load, Settings};
use common::{str_bytes, topic_name, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, DeleteRecordsRequest, DeleteRecordsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, OffsetCommitRequest, OffsetCommitResponse,
};
use object_store::ObjectStore;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use strata::manifest::store::{open, S3Options};
use strata::manifest::Manifest;

const TIMEOUT: Duration = Duration::from_secs(60);
const OFFSETS_TOPIC: &str = "__consumer_offsets";

fn addr(bootstrap: &str) -> SocketAddr {
    bootstrap.parse().unwrap()
}

/// Every broker runs its compaction worker, as it does by default.
fn with_workers() -> Settings {
    Settings {
        compaction_worker: true,
        extra: [
            "--tier-interval-ms",
            "50",
            "--compaction-delete-delay-ms",
            "100",
        ]
        .map(String::from)
        .to_vec(),
        ..Settings::default()
    }
}

fn group_member(bootstrap: &str, group: &str) -> BaseConsumer {
    clients::client(
        bootstrap,
        &[
            ("group.id", group),
            ("enable.auto.commit", "false"),
            ("auto.offset.reset", "earliest"),
            ("session.timeout.ms", "10000"),
            ("heartbeat.interval.ms", "300"),
        ],
    )
    .create()
    .unwrap()
}

fn assigned(c: &BaseConsumer) -> BTreeSet<i32> {
    c.assignment()
        .unwrap()
        .elements()
        .iter()
        .map(|e| e.partition())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_group_spread_over_brokers_gets_one_assignment_and_commits_through_the_offsets_leader() {
    const TOPIC: &str = "clicks";
    const PARTITIONS: i32 = 6;
    const GROUP: &str = "dashboards";
    let Some(cluster) = Cluster::start_with(&[1, 2, 3], with_workers()).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    let load = Load::on_new_topic(&bootstrap, TOPIC, PARTITIONS).await;
    load.progress(300).await;
    let report = load.finish().await;
    assert!(report.failed.is_empty(), "{:?}", report.failed);

    // Every broker names the same coordinator: the leader of the offsets
    // topic's partition.
    let leaders = all_leaders(&bootstrap).unwrap();
    let coordinator = leaders[&(OFFSETS_TOPIC.to_string(), 0)];
    for node in cluster.running() {
        let mut raw = Raw::connect(addr(&cluster.bootstrap_of(node))).await;
        let found: FindCoordinatorResponse = raw
            .call(
                ApiKey::FindCoordinator,
                2,
                &FindCoordinatorRequest::default().with_key(str_bytes(GROUP)),
            )
            .await;
        assert_eq!(found.error_code, 0, "from broker {node}");
        assert_eq!(found.node_id.0, coordinator, "from broker {node}");
        // Any other broker refuses group requests, as Kafka does.
        if node != coordinator {
            let commit = OffsetCommitRequest::default()
                .with_group_id(GroupId(str_bytes(GROUP)))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(topic_name(TOPIC))
                    .with_partitions(vec![OffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(1)])]);
            let resp: OffsetCommitResponse = raw.call(ApiKey::OffsetCommit, 2, &commit).await;
            let code = resp.topics[0].partitions[0].error_code;
            assert_eq!(
                code,
                ResponseError::NotCoordinator.code(),
                "commit sent to broker {node}"
            );
        }
    }

    // Two members, each knowing only a broker that is not the coordinator.
    let others: Vec<i32> = cluster
        .running()
        .into_iter()
        .filter(|n| *n != coordinator)
        .collect();
    let members: Vec<BaseConsumer> = others
        .iter()
        .map(|n| group_member(&cluster.bootstrap_of(*n), GROUP))
        .collect();
    for m in &members {
        m.subscribe(&[TOPIC]).unwrap();
    }
    let expected: BTreeSet<String> = report.acked.iter().map(|(_, _, v)| v.clone()).collect();
    let want = expected.len();
    let (members, consumed) = tokio::task::spawn_blocking(move || {
        let mut consumed = BTreeSet::new();
        let deadline = Instant::now() + TIMEOUT;
        loop {
            for m in &members {
                if let Some(Ok(msg)) = m.poll(Duration::from_millis(50)) {
                    consumed.insert(String::from_utf8(msg.payload().unwrap().to_vec()).unwrap());
                }
            }
            let (a, b) = (assigned(&members[0]), assigned(&members[1]));
            let one_assignment = !a.is_empty()
                && !b.is_empty()
                && a.is_disjoint(&b)
                && a.len() + b.len() == PARTITIONS as usize;
            if one_assignment && consumed.len() == want {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "assignments {a:?} and {b:?}; consumed {} of {}",
                consumed.len(),
                want
            );
        }
        for m in &members {
            m.commit_consumer_state(CommitMode::Sync).unwrap();
        }
        (members, consumed)
    })
    .await
    .unwrap();
    assert!(consumed.iter().all(|v| expected.contains(v)));

    // The commits are where the group reads them, whichever broker it asks.
    let ends: BTreeMap<i32, i64> = report
        .acked
        .iter()
        .fold(BTreeMap::new(), |mut m, (p, o, _)| {
            let e = m.entry(*p).or_insert(0);
            *e = (*e).max(o + 1);
            m
        });
    for node in cluster.running() {
        let c = group_member(&cluster.bootstrap_of(node), GROUP);
        let mut tpl = TopicPartitionList::new();
        for p in 0..PARTITIONS {
            tpl.add_partition(TOPIC, p);
        }
        let committed = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
        for (p, end) in &ends {
            let at = committed.find_partition(TOPIC, *p).unwrap().offset();
            assert_eq!(
                at,
                Offset::Offset(*end),
                "partition {p} asked via broker {node}"
            );
        }
    }
    drop(members);
}

const KEYS: usize = 20;
const VERSIONS: usize = 30;

/// The manifest of `partition` of `topic`, read from the store.
async fn manifest(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    partition: i32,
) -> Option<(Manifest, strata::catalog::config::TopicConfig)> {
    let (m, file) = common::stored_manifest(store, topic, partition).await?;
    Some((m, file.config))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn workers_on_every_broker_compact_a_topic_whose_partitions_have_different_leaders() {
    const TOPIC: &str = "profiles";
    const PARTITIONS: i32 = 3;
    let Some(cluster) = Cluster::start_with(&[1, 2, 3], with_workers()).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    create_topic(&bootstrap, TOPIC, PARTITIONS, common::QUICK_COMPACTION).await;
    let leaders = wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;
    let spread: BTreeSet<i32> = leaders.values().copied().collect();
    assert!(
        spread.len() >= 2,
        "partitions led by several brokers: {leaders:?}"
    );

    // Keyed updates in small batches, so that they spread over many segments.
    let p: FutureProducer =
        clients::producer(&bootstrap, &[("linger.ms", "0"), ("batch.size", "1000")]);
    let mut latest: BTreeMap<(i32, String), String> = BTreeMap::new();
    for v in 0..VERSIONS {
        let sends: Vec<_> = (0..PARTITIONS)
            .flat_map(|partition| (0..KEYS).map(move |k| (partition, k)))
            .map(|(partition, k)| {
                let key = format!("key{k:02}");
                let value = format!("p{partition}-key{k:02}-version{v:03}");
                latest.insert((partition, key.clone()), value.clone());
                let p = p.clone();
                async move {
                    let record = FutureRecord::to(TOPIC)
                        .key(&key)
                        .payload(&value)
                        .partition(partition);
                    p.send(record, TIMEOUT).await.map_err(|(e, _)| e).unwrap();
                }
            })
            .collect();
        futures::future::join_all(sends).await;
    }
    let end = (KEYS * VERSIONS) as i64;

    // Each partition's leader queues merges; whichever broker's worker takes
    // a job, the merged segments land in that partition's manifest.
    let store = open(
        &format!("file://{}", cluster.store.path().display()),
        &S3Options::default(),
    )
    .unwrap();
    let deadline = Instant::now() + TIMEOUT;
    for partition in 0..PARTITIONS {
        loop {
            if let Some((m, config)) = manifest(&store, TOPIC, partition).await {
                if common::compaction_settled(&m, &config, end) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "partition {partition} not compacted: {:?}",
                    common::levels(&m)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    // Readers see the newest value of every key, in far fewer records: once
    // the leaders have read the manifests that other brokers' workers wrote
    // (they re-read them every few seconds).
    let total = end as usize * PARTITIONS as usize;
    let deadline = Instant::now() + TIMEOUT;
    let got = loop {
        let got = consume_to_end(&bootstrap, TOPIC, PARTITIONS);
        if got.len() < total / 2 || Instant::now() > deadline {
            break got;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let mut newest: BTreeMap<(i32, String), String> = BTreeMap::new();
    for ((partition, _), value) in &got {
        let key = value.split('-').nth(1).unwrap().to_string();
        newest.insert((*partition, key), value.clone());
    }
    assert_eq!(newest, latest, "the newest value of every key");
    assert!(
        got.len() < total / 2,
        "{} of {total} records left",
        got.len()
    );

    // DeleteRecords goes to the partition's leader; another broker says so.
    let leaders = wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;
    let delete = |partition: i32| {
        DeleteRecordsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![DeleteRecordsTopic::default()
                .with_name(topic_name(TOPIC))
                .with_partitions(vec![DeleteRecordsPartition::default()
                    .with_partition_index(partition)
                    .with_offset(end / 2)])])
    };
    let follower = cluster
        .running()
        .into_iter()
        .find(|n| *n != leaders[&0])
        .unwrap();
    let mut raw = Raw::connect(addr(&cluster.bootstrap_of(follower))).await;
    let resp: DeleteRecordsResponse = raw.call(ApiKey::DeleteRecords, 1, &delete(0)).await;
    assert_eq!(
        resp.topics[0].partitions[0].error_code,
        ResponseError::NotLeaderOrFollower.code()
    );
    let mut raw = Raw::connect(addr(&cluster.bootstrap_of(leaders[&0]))).await;
    let resp: DeleteRecordsResponse = raw.call(ApiKey::DeleteRecords, 1, &delete(0)).await;
    let answer = &resp.topics[0].partitions[0];
    assert_eq!(answer.error_code, 0);
    assert_eq!(answer.low_watermark, end / 2);
    let (low, _) = reader(&bootstrap, &[])
        .fetch_watermarks(TOPIC, 0, Duration::from_secs(10))
        .unwrap();
    assert_eq!(low, end / 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn topic_admin_sent_to_any_broker_applies_to_the_whole_cluster() {
    use kafka_protocol::messages::create_partitions_request::CreatePartitionsTopic;
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::{
        CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest,
        CreateTopicsResponse, DeleteTopicsRequest, DeleteTopicsResponse,
    };
    const TOPIC: &str = "audit";
    let Some(cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let brokers = cluster.running();
    let raw_to = |node: i32| Raw::connect(addr(&cluster.bootstrap_of(node)));
    let cluster = &cluster;
    let partitions_everywhere = |count: Option<i32>| async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let seen: Vec<Option<i32>> = cluster
                .running()
                .iter()
                .map(|n| {
                    let md = reader(&cluster.bootstrap_of(*n), &[])
                        .fetch_metadata(Some(TOPIC), Duration::from_secs(5))
                        .ok()?;
                    let t = md.topics().iter().find(|t| t.name() == TOPIC)?;
                    let led = t.partitions().iter().filter(|p| p.leader() >= 0).count();
                    (t.error().is_none() && led == t.partitions().len() && led > 0)
                        .then_some(led as i32)
                })
                .collect();
            if seen.iter().all(|s| *s == count) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{TOPIC}: {seen:?}, wanted {count:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };

    // Created through broker 1, grown through broker 2, deleted through
    // broker 3: every broker sees each change, with leaders.
    let create = CreateTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(TOPIC))
            .with_num_partitions(2)
            .with_replication_factor(1)]);
    let resp: CreateTopicsResponse = raw_to(brokers[0])
        .await
        .call(ApiKey::CreateTopics, 5, &create)
        .await;
    assert_eq!(resp.topics[0].error_code, 0, "{resp:?}");
    partitions_everywhere(Some(2)).await;

    let grow = CreatePartitionsRequest::default()
        .with_timeout_ms(10_000)
        .with_topics(vec![CreatePartitionsTopic::default()
            .with_name(topic_name(TOPIC))
            .with_count(5)
            .with_assignments(None)]);
    let resp: CreatePartitionsResponse = raw_to(brokers[1])
        .await
        .call(ApiKey::CreatePartitions, 2, &grow)
        .await;
    assert_eq!(resp.results[0].error_code, 0, "{resp:?}");
    partitions_everywhere(Some(5)).await;

    let delete = DeleteTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topic_names(vec![topic_name(TOPIC)]);
    let resp: DeleteTopicsResponse = raw_to(brokers[2])
        .await
        .call(ApiKey::DeleteTopics, 4, &delete)
        .await;
    assert_eq!(resp.responses[0].error_code, 0, "{resp:?}");
    partitions_everywhere(None).await;
}

/// Each partition of `topic` as broker `node` describes it in Metadata:
/// (leader, replicas, ISR); empty until every partition has a leader.
async fn replicas_seen_by(
    cluster: &Cluster,
    node: i32,
    topic: &str,
) -> Vec<(i32, Vec<i32>, Vec<i32>)> {
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{MetadataRequest, MetadataResponse};
    let mut raw = Raw::connect(addr(&cluster.bootstrap_of(node))).await;
    let req = MetadataRequest::default()
        .with_topics(Some(vec![
            MetadataRequestTopic::default().with_name(Some(topic_name(topic)))
        ]))
        .with_allow_auto_topic_creation(false);
    let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &req).await;
    let t = &resp.topics[0];
    if t.error_code != 0 || t.partitions.iter().any(|p| p.leader_id.0 < 0) {
        return Vec::new();
    }
    let ids = |v: &[kafka_protocol::messages::BrokerId]| v.iter().map(|b| b.0).collect();
    let mut parts: Vec<_> = t.partitions.iter().collect();
    parts.sort_by_key(|p| p.partition_index);
    parts
        .iter()
        .map(|p| (p.leader_id.0, ids(&p.replica_nodes), ids(&p.isr_nodes)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replication_factors_up_to_the_live_brokers_are_accepted_and_reported_by_every_broker() {
    use kafka_protocol::messages::alter_partition_reassignments_request::{
        ReassignablePartition, ReassignableTopic,
    };
    use kafka_protocol::messages::create_topics_request::CreatableTopic;
    use kafka_protocol::messages::describe_topic_partitions_request::TopicRequest;
    use kafka_protocol::messages::{
        AlterPartitionReassignmentsRequest, AlterPartitionReassignmentsResponse, BrokerId,
        CreateTopicsRequest, CreateTopicsResponse, DescribeTopicPartitionsRequest,
        DescribeTopicPartitionsResponse,
    };
    const TOPIC: &str = "connect-configs";
    const PARTITIONS: i32 = 4;
    let Some(mut cluster) = Cluster::start(&[1, 2, 3]).await else {
        return;
    };
    let create = |name: &str, factor: i16| {
        CreateTopicsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![CreatableTopic::default()
                .with_name(topic_name(name))
                .with_num_partitions(PARTITIONS)
                .with_replication_factor(factor)])
    };
    let mut raw = Raw::connect(addr(&cluster.bootstrap_of(1))).await;
    // Broker 1 may not see the third registration yet on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(15);
    let resp = loop {
        let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &create(TOPIC, 3)).await;
        let unseen = resp.topics[0].error_code
            == kafka_protocol::error::ResponseError::InvalidReplicationFactor.code();
        if !unseen || Instant::now() > deadline {
            break resp;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let created = &resp.topics[0];
    assert_eq!(created.error_code, 0, "{resp:?}");
    assert_eq!(created.replication_factor, 3);

    let resp: CreateTopicsResponse = raw.call(ApiKey::CreateTopics, 7, &create("four", 4)).await;
    let refused = &resp.topics[0];
    assert_eq!(
        refused.error_code,
        ResponseError::InvalidReplicationFactor.code()
    );
    assert_eq!(
        refused.error_message.as_deref(),
        Some("Unable to replicate the partition 4 time(s): The target replication factor of 4 cannot be reached because only 3 broker(s) are registered.")
    );

    let resp: CreateTopicsResponse = raw
        .call(ApiKey::CreateTopics, 7, &create("defaulted", -1))
        .await;
    assert_eq!(resp.topics[0].error_code, 0, "{resp:?}");
    assert_eq!(resp.topics[0].replication_factor, 1);

    // Every broker reports three replicas per partition, the leader first,
    // all in sync, and they all report the same ones.
    let deadline = Instant::now() + Duration::from_secs(30);
    let seen = loop {
        let mut seen = Vec::new();
        for node in cluster.running() {
            seen.push(replicas_seen_by(&cluster, node, TOPIC).await);
        }
        if seen
            .iter()
            .all(|s| s.len() == PARTITIONS as usize && *s == seen[0])
        {
            break seen.swap_remove(0);
        }
        assert!(Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for (leader, replicas, isr) in &seen {
        assert_eq!(replicas.first(), Some(leader), "{seen:?}");
        assert_eq!(
            replicas.iter().collect::<BTreeSet<_>>(),
            [1, 2, 3].iter().collect::<BTreeSet<_>>()
        );
        assert_eq!(isr, replicas);
    }
    assert!(
        cluster.describe().contains("replication factor 3"),
        "{}",
        cluster.describe()
    );
    let defaulted = loop {
        let seen = replicas_seen_by(&cluster, 2, "defaulted").await;
        if !seen.is_empty() {
            break seen;
        }
        assert!(Instant::now() < deadline);
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(defaulted.iter().all(|(l, r, _)| r == &vec![*l]));

    // DescribeTopicPartitions agrees, as kafka-topics.sh --describe reads it.
    let mut raw = Raw::connect(addr(&cluster.bootstrap_of(3))).await;
    let resp: DescribeTopicPartitionsResponse = raw
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(vec![TopicRequest::default().with_name(topic_name(TOPIC))]),
        )
        .await;
    let described: Vec<(i32, Vec<i32>, Vec<i32>)> = resp.topics[0]
        .partitions
        .iter()
        .map(|p| {
            let ids = |v: &[BrokerId]| v.iter().map(|b| b.0).collect();
            (p.leader_id.0, ids(&p.replica_nodes), ids(&p.isr_nodes))
        })
        .collect();
    assert_eq!(described, seen);

    // Reassigning a partition to the replicas it has is a no-op that
    // succeeds; changing their number is refused as Kafka refuses it.
    let reassign = |replicas: Vec<i32>| {
        AlterPartitionReassignmentsRequest::default()
            .with_timeout_ms(10_000)
            .with_topics(vec![ReassignableTopic::default()
                .with_name(topic_name(TOPIC))
                .with_partitions(vec![ReassignablePartition::default()
                    .with_partition_index(0)
                    .with_replicas(Some(
                        replicas.into_iter().map(BrokerId).collect(),
                    ))])])
    };
    let resp: AlterPartitionReassignmentsResponse = raw
        .call(
            ApiKey::AlterPartitionReassignments,
            0,
            &reassign(seen[0].1.clone()),
        )
        .await;
    assert_eq!(resp.responses[0].partitions[0].error_code, 0, "{resp:?}");
    let resp: AlterPartitionReassignmentsResponse = raw
        .call(
            ApiKey::AlterPartitionReassignments,
            1,
            &reassign(vec![seen[0].0]).with_allow_replication_factor_change(false),
        )
        .await;
    let refused = &resp.responses[0].partitions[0];
    assert_eq!(
        refused.error_code,
        ResponseError::InvalidReplicationFactor.code()
    );
    assert_eq!(
        refused.error_message.as_deref(),
        Some("The replication factor is changed from 3 to a different value.")
    );

    // With a broker gone, a factor of 3 is more than the live brokers.
    cluster.stop(3);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut raw = Raw::connect(addr(&cluster.bootstrap_of(1))).await;
    loop {
        let resp: CreateTopicsResponse =
            raw.call(ApiKey::CreateTopics, 7, &create("late", 3)).await;
        let code = resp.topics[0].error_code;
        if code == ResponseError::InvalidReplicationFactor.code() {
            break;
        }
        // Until broker 3's leave shows, the topic may be created; drop it.
        assert!(Instant::now() < deadline, "{resp:?}");
        if code == 0 {
            use kafka_protocol::messages::DeleteTopicsRequest;
            let delete = DeleteTopicsRequest::default()
                .with_timeout_ms(10_000)
                .with_topic_names(vec![topic_name("late")]);
            let _: kafka_protocol::messages::DeleteTopicsResponse =
                raw.call(ApiKey::DeleteTopics, 4, &delete).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Its partitions move to the others, and every partition is reported
    // with the two brokers left.
    loop {
        let seen = replicas_seen_by(&cluster, 1, TOPIC).await;
        let two_left =
            |(l, r, _): &(i32, Vec<i32>, Vec<i32>)| r.len() == 2 && r[0] == *l && !r.contains(&3);
        if !seen.is_empty() && seen.iter().all(two_left) {
            break;
        }
        assert!(Instant::now() < deadline, "{seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
