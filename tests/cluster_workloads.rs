//! What runs on top of partitions keeps working when the partitions are led
//! by different brokers: consumer groups whose members talk to different
//! brokers, compaction jobs taken by the workers every broker runs, and
//! admin requests sent to any broker.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::cluster::{
    all_leaders, consume_to_end, create_topic, metadata_consumer, producer, wait_for_leaders,
    Cluster, Load, Settings,
};
use common::Raw;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::delete_records_request::{
    DeleteRecordsPartition, DeleteRecordsTopic,
};
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, DeleteRecordsRequest, DeleteRecordsResponse, FindCoordinatorRequest,
    FindCoordinatorResponse, GroupId, OffsetCommitRequest, OffsetCommitResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use object_store::ObjectStore;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Message, Offset, TopicPartitionList};
use strata::catalog::TopicFile;
use strata::clock::{Clock, SystemClock};
use strata::compaction::policy::{for_topic, SegmentDesc};
use strata::manifest::objects::newest_topic_file;
use strata::manifest::store::{open, S3Options};
use strata::manifest::{partition_prefix, Manifest, ManifestStore};

const TIMEOUT: Duration = Duration::from_secs(60);
const OFFSETS_TOPIC: &str = "__consumer_offsets";

fn now_ms() -> i64 {
    SystemClock.now_ms()
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

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
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "300")
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
    create_topic(&bootstrap, TOPIC, PARTITIONS, &[]).await;
    wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;
    let load = Load::start(producer(&bootstrap), TOPIC, PARTITIONS);
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
                &FindCoordinatorRequest::default().with_key(s(GROUP)),
            )
            .await;
        assert_eq!(found.error_code, 0, "from broker {node}");
        assert_eq!(found.node_id.0, coordinator, "from broker {node}");
        // Any other broker refuses group requests, as Kafka does.
        if node != coordinator {
            let commit = OffsetCommitRequest::default()
                .with_group_id(GroupId(s(GROUP)))
                .with_generation_id_or_member_epoch(-1)
                .with_topics(vec![OffsetCommitRequestTopic::default()
                    .with_name(TopicName(s(TOPIC)))
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

const KV_CONFIG: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.bytes", "3000"),
    ("segment.ms", "300"),
    ("min.compaction.lag.ms", "0"),
    ("delete.retention.ms", "0"),
    ("strata.compaction.fanout", "2"),
];
const KEYS: usize = 20;
const VERSIONS: usize = 30;

/// The manifest of `partition` of `topic`, read from the store.
async fn manifest(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    partition: i32,
) -> Option<(Manifest, strata::catalog::config::TopicConfig)> {
    let file: TopicFile = newest_topic_file(
        store,
        &object_store::path::Path::from_iter(["topics", topic]),
    )
    .await
    .unwrap()?;
    let m = ManifestStore::new(
        store.clone(),
        partition_prefix(topic, file.id, partition).child("manifest"),
    )
    .load_latest()
    .await
    .unwrap()?;
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
    create_topic(&bootstrap, TOPIC, PARTITIONS, KV_CONFIG).await;
    let leaders = wait_for_leaders(&bootstrap, TOPIC, PARTITIONS, |_| true).await;
    let spread: BTreeSet<i32> = leaders.values().copied().collect();
    assert!(
        spread.len() >= 2,
        "partitions led by several brokers: {leaders:?}"
    );

    // Keyed updates in small batches, so that they spread over many segments.
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("linger.ms", "0")
        .set("batch.size", "1000")
        .create()
        .unwrap();
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
                let descs: Vec<SegmentDesc> = m.segments.iter().map(SegmentDesc::from).collect();
                let settled = m.end_offset() == Some(end)
                    && m.segments.iter().any(|s| s.level > 0)
                    && for_topic(&config).next_job(&descs, now_ms()).is_none();
                if settled {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "partition {partition} not compacted: {:?}",
                    m.segments
                        .iter()
                        .map(|s| (s.base_offset, s.level))
                        .collect::<Vec<_>>()
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
                .with_name(TopicName(s(TOPIC)))
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
    let (low, _) = metadata_consumer(&bootstrap)
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
                    let md = metadata_consumer(&cluster.bootstrap_of(*n))
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
            .with_name(TopicName(s(TOPIC)))
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
            .with_name(TopicName(s(TOPIC)))
            .with_count(5)]);
    let resp: CreatePartitionsResponse = raw_to(brokers[1])
        .await
        .call(ApiKey::CreatePartitions, 2, &grow)
        .await;
    assert_eq!(resp.results[0].error_code, 0, "{resp:?}");
    partitions_everywhere(Some(5)).await;

    let delete = DeleteTopicsRequest::default()
        .with_timeout_ms(10_000)
        .with_topic_names(vec![TopicName(s(TOPIC))]);
    let resp: DeleteTopicsResponse = raw_to(brokers[2])
        .await
        .call(ApiKey::DeleteTopics, 4, &delete)
        .await;
    assert_eq!(resp.responses[0].error_code, 0, "{resp:?}");
    partitions_everywhere(None).await;
}
