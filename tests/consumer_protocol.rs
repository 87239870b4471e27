//! The consumer group protocol (KIP-848) with librdkafka
//! (`group.protocol=consumer`) and, for what clients never send, raw
//! ConsumerGroupHeartbeat requests: members sharing and handing over
//! partitions, a silent member expiring, regex subscriptions, commits across
//! `kill -9`, a consumer-protocol member next to a classic one in one group,
//! and Kafka's error codes.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{free_port, InProcess, Process, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::consumer_group_heartbeat_request::TopicPartitions;
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::offset_commit_request::{
    OffsetCommitRequestPartition, OffsetCommitRequestTopic,
};
use kafka_protocol::messages::{
    ApiKey, ConsumerGroupDescribeRequest, ConsumerGroupDescribeResponse,
    ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatResponse, GroupId, JoinGroupRequest,
    JoinGroupResponse, ListGroupsRequest, ListGroupsResponse, OffsetCommitRequest,
    OffsetCommitResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);
/// Heartbeats every 500 ms, sessions of 3 s: rebalances in test time.
const FAST: &[&str] = &[
    "--group-consumer-heartbeat-interval-ms",
    "500",
    "--group-consumer-session-timeout-ms",
    "3000",
];

fn member(bootstrap: &str, group: &str, topics: &[&str]) -> BaseConsumer {
    let m: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("group.protocol", "consumer")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    m.subscribe(topics).unwrap();
    m
}

async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let res = admin
        .create_topics(
            &[NewTopic::new(name, partitions, TopicReplication::Fixed(1))],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(res[0].is_ok(), "{res:?}");
}

async fn produce(bootstrap: &str, topic: &str, from: usize, count: usize) {
    let p: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let sends: Vec<_> = (from..from + count)
        .map(|i| {
            let p = p.clone();
            async move {
                let key = format!("k{i}");
                let value = format!("v{i}");
                p.send(FutureRecord::to(topic).key(&key).payload(&value), TIMEOUT)
                    .await
                    .unwrap();
            }
        })
        .collect();
    futures::future::join_all(sends).await;
}

/// Polls every member until `want` distinct values arrived, committing each
/// record; returns how many each member read.
fn consume(members: &[&BaseConsumer], want: usize, seen: &mut BTreeSet<String>) -> Vec<usize> {
    let mut per = vec![0; members.len()];
    let deadline = Instant::now() + TIMEOUT;
    while seen.len() < want {
        assert!(
            Instant::now() < deadline,
            "only {} of {want} records consumed",
            seen.len()
        );
        for (i, m) in members.iter().enumerate() {
            if let Some(Ok(msg)) = m.poll(Duration::from_millis(50)) {
                seen.insert(String::from_utf8(msg.payload().unwrap().to_vec()).unwrap());
                per[i] += 1;
                m.commit_message(&msg, CommitMode::Sync).unwrap();
            }
        }
    }
    per
}

fn assigned(m: &BaseConsumer) -> usize {
    m.assignment().map(|a| a.count()).unwrap_or(0)
}

/// Polls until `check` holds (dropping any record, so call it while there
/// are none to read).
fn poll_until(members: &[&BaseConsumer], what: &str, check: impl Fn() -> bool) {
    let deadline = Instant::now() + TIMEOUT;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        for m in members {
            let _ = m.poll(Duration::from_millis(20));
        }
    }
}

fn values(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("v{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_partitions_and_take_over_when_one_leaves() {
    let broker = InProcess::start(FAST).await;
    let bs = broker.bootstrap();
    create_topic(&bs, "orders", 4).await;
    let a = member(&bs, "g1", &["orders"]);
    let b = member(&bs, "g1", &["orders"]);
    poll_until(&[&a, &b], "a 2/2 split", || {
        (assigned(&a), assigned(&b)) == (2, 2)
    });
    produce(&bs, "orders", 0, 400).await;
    let mut seen = BTreeSet::new();
    let per = consume(&[&a, &b], 400, &mut seen);
    assert!(per.iter().all(|n| *n > 0), "both members consumed: {per:?}");
    assert_eq!(seen, values(0..400));

    // b leaves; a takes every partition and reads what comes next from
    // where b committed.
    b.unsubscribe();
    drop(b);
    poll_until(&[&a], "a to own all four", || assigned(&a) == 4);
    produce(&bs, "orders", 400, 100).await;
    let mut later = BTreeSet::new();
    consume(&[&a], 100, &mut later);
    assert_eq!(later, values(400..500));
    let extra = a.poll(Duration::from_millis(500));
    assert!(extra.is_none(), "a record was delivered twice");
}

fn heartbeat(member: &str, epoch: i32) -> ConsumerGroupHeartbeatRequest {
    ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId("g2".into()))
        .with_member_id(StrBytes::from_string(member.to_string()))
        .with_member_epoch(epoch)
        .with_rebalance_timeout_ms(-1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_member_is_expired_and_its_partitions_move_back() {
    let broker = InProcess::start(FAST).await;
    let bs = broker.bootstrap();
    create_topic(&bs, "orders", 2).await;
    produce(&bs, "orders", 0, 100).await;
    let a = member(&bs, "g2", &["orders"]);
    let mut seen = BTreeSet::new();
    consume(&[&a], 100, &mut seen);
    assert_eq!(assigned(&a), 2);

    // A member on a raw connection joins: it gets a partition only once a
    // has revoked it, then goes silent like a crashed process.
    let mut raw = Raw::connect(broker.addr()).await;
    let join = heartbeat("raw-member", 0)
        .with_rebalance_timeout_ms(10_000)
        .with_subscribed_topic_names(Some(vec![TopicName("orders".into())]))
        .with_topic_partitions(Some(vec![]));
    let joined: ConsumerGroupHeartbeatResponse =
        raw.call(ApiKey::ConsumerGroupHeartbeat, 0, &join).await;
    assert_eq!(joined.error_code, 0);
    let epoch = joined.member_epoch;
    assert!(epoch >= 2, "joining bumped the group epoch: {epoch}");
    let mut got = joined
        .assignment
        .map(|a| a.topic_partitions)
        .unwrap_or_default();
    let deadline = Instant::now() + TIMEOUT;
    while got.iter().map(|t| t.partitions.len()).sum::<usize>() == 0 {
        assert!(
            Instant::now() < deadline,
            "the raw member never got a partition"
        );
        // a must hand one over before the raw member gets it.
        let _ = a.poll(Duration::from_millis(100));
        let owned: Vec<TopicPartitions> = Vec::new();
        let r: ConsumerGroupHeartbeatResponse = raw
            .call(
                ApiKey::ConsumerGroupHeartbeat,
                0,
                &heartbeat("raw-member", epoch).with_topic_partitions(Some(owned)),
            )
            .await;
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
        if let Some(assignment) = r.assignment {
            got = assignment.topic_partitions;
        }
    }
    assert_eq!(assigned(&a), 1, "a partition had two owners");

    // Silence: after the 3 s session the partition goes back to a, which
    // reads everything new.
    produce(&bs, "orders", 100, 50).await;
    let mut later = BTreeSet::new();
    consume(&[&a], 50, &mut later);
    assert_eq!(assigned(&a), 2);
    assert_eq!(later, values(100..150));
    let r: ConsumerGroupHeartbeatResponse = raw
        .call(
            ApiKey::ConsumerGroupHeartbeat,
            0,
            &heartbeat("raw-member", epoch),
        )
        .await;
    assert_eq!(r.error_code, ResponseError::UnknownMemberId.code());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_regex_subscription_picks_up_a_topic_created_later() {
    let broker = InProcess::start(FAST).await;
    let bs = broker.bootstrap();
    create_topic(&bs, "metrics-cpu", 1).await;
    create_topic(&bs, "logs", 1).await;
    produce(&bs, "metrics-cpu", 0, 10).await;
    produce(&bs, "logs", 0, 10).await;
    let m = member(&bs, "g3", &["^metrics-.*"]);
    let mut seen = BTreeSet::new();
    consume(&[&m], 10, &mut seen);
    assert_eq!(seen, values(0..10));

    create_topic(&bs, "metrics-disk", 2).await;
    poll_until(&[&m], "the new topic", || assigned(&m) == 3);
    produce(&bs, "metrics-disk", 10, 20).await;
    let mut later = BTreeSet::new();
    consume(&[&m], 20, &mut later);
    assert_eq!(
        later,
        values(10..30),
        "read only the new topic, never `logs`"
    );
    assert_eq!(assigned(&m), 3);
    let topics: BTreeSet<String> = m
        .assignment()
        .unwrap()
        .elements()
        .iter()
        .map(|e| e.topic().to_string())
        .collect();
    assert_eq!(
        topics,
        BTreeSet::from(["metrics-cpu".into(), "metrics-disk".into()])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_group_and_its_offsets_survive_kill_minus_nine() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Process::start(dir.path(), port, FAST);
    let bs = broker.bootstrap();
    create_topic(&bs, "orders", 3).await;
    produce(&bs, "orders", 0, 300).await;
    let m = member(&bs, "durable", &["orders"]);
    let mut seen = BTreeSet::new();
    consume(&[&m], 300, &mut seen);
    broker.kill9();

    // The member keeps running across the crash: its epoch and partitions
    // were persisted, so it carries on where it was.
    let broker = Process::start(dir.path(), port, FAST);
    let bs = broker.bootstrap();
    produce(&bs, "orders", 300, 30).await;
    let mut later = BTreeSet::new();
    consume(&[&m], 30, &mut later);
    assert_eq!(later, values(300..330));
    m.unsubscribe();
    drop(m);

    broker.kill9();
    let broker = Process::start(dir.path(), port, FAST);
    let bs = broker.bootstrap();
    let m = member(&bs, "durable", &["orders"]);
    let mut tpl = TopicPartitionList::new();
    for p in 0..3 {
        tpl.add_partition_offset("orders", p, Offset::Invalid)
            .unwrap();
    }
    let committed = m.committed_offsets(tpl, TIMEOUT).unwrap();
    let total: i64 = committed
        .elements()
        .iter()
        .map(|e| e.offset().to_raw().unwrap())
        .sum();
    assert_eq!(total, 330, "every commit survived two kill -9s");
    poll_until(&[&m], "the restarted member's assignment", || {
        assigned(&m) == 3
    });
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        assert!(
            m.poll(Duration::from_millis(100)).is_none(),
            "committed record delivered again"
        );
    }
}

async fn hb(raw: &mut Raw, req: ConsumerGroupHeartbeatRequest) -> ConsumerGroupHeartbeatResponse {
    raw.call(ApiKey::ConsumerGroupHeartbeat, 1, &req).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_heartbeats_and_cross_protocol_requests_get_kafkas_errors() {
    let mut args = FAST.to_vec();
    args.extend(["--group-initial-rebalance-delay-ms", "0"]);
    let broker = InProcess::start(&args).await;
    let bs = broker.bootstrap();
    create_topic(&bs, "orders", 2).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let join = |member: &str| {
        heartbeat(member, 0)
            .with_group_id(GroupId("g4".into()))
            .with_rebalance_timeout_ms(10_000)
            .with_subscribed_topic_names(Some(vec![TopicName("orders".into())]))
            .with_topic_partitions(Some(vec![]))
    };
    let invalid = ResponseError::InvalidRequest.code();
    assert_eq!(
        hb(&mut raw, join("")).await.error_code,
        invalid,
        "v1 needs a member id"
    );
    assert_eq!(
        hb(&mut raw, join("m").with_rebalance_timeout_ms(-1))
            .await
            .error_code,
        invalid
    );
    assert_eq!(
        hb(&mut raw, join("m").with_topic_partitions(None))
            .await
            .error_code,
        invalid
    );
    assert_eq!(
        hb(&mut raw, join("m").with_member_epoch(-3))
            .await
            .error_code,
        invalid
    );
    assert_eq!(
        hb(
            &mut raw,
            join("m").with_server_assignor(Some("sticky".into()))
        )
        .await
        .error_code,
        ResponseError::UnsupportedAssignor.code()
    );
    assert_eq!(
        hb(
            &mut raw,
            join("m").with_subscribed_topic_regex(Some("(".into()))
        )
        .await
        .error_code,
        ResponseError::InvalidRegularExpression.code()
    );
    assert_eq!(
        hb(
            &mut raw,
            heartbeat("m", 3).with_group_id(GroupId("nope".into()))
        )
        .await
        .error_code,
        ResponseError::GroupIdNotFound.code()
    );
    let joined = hb(
        &mut raw,
        join("m").with_server_assignor(Some("range".into())),
    )
    .await;
    assert_eq!((joined.error_code, joined.member_epoch), (0, 1));
    assert_eq!(joined.heartbeat_interval_ms, 500);
    let partitions = joined.assignment.unwrap().topic_partitions;
    assert_eq!(partitions[0].partitions, [0, 1]);
    assert_eq!(
        hb(
            &mut raw,
            heartbeat("m", 5).with_group_id(GroupId("g4".into()))
        )
        .await
        .error_code,
        ResponseError::FencedMemberEpoch.code()
    );
    assert_eq!(
        hb(
            &mut raw,
            heartbeat("x", 1).with_group_id(GroupId("g4".into()))
        )
        .await
        .error_code,
        ResponseError::UnknownMemberId.code()
    );

    // Offsets: consumer-protocol members commit with v9 and their epoch.
    let commit = |epoch: i32| {
        OffsetCommitRequest::default()
            .with_group_id(GroupId("g4".into()))
            .with_member_id("m".into())
            .with_generation_id_or_member_epoch(epoch)
            .with_topics(vec![OffsetCommitRequestTopic::default()
                .with_name(TopicName("orders".into()))
                .with_partitions(vec![OffsetCommitRequestPartition::default()
                    .with_partition_index(0)
                    .with_committed_offset(0)])])
    };
    let code = |r: OffsetCommitResponse| r.topics[0].partitions[0].error_code;
    let ok = code(raw.call(ApiKey::OffsetCommit, 9, &commit(1)).await);
    assert_eq!(ok, 0);
    let stale = code(raw.call(ApiKey::OffsetCommit, 9, &commit(0)).await);
    assert_eq!(stale, ResponseError::StaleMemberEpoch.code());
    let old = code(raw.call(ApiKey::OffsetCommit, 8, &commit(1)).await);
    assert_eq!(old, ResponseError::UnsupportedVersion.code());

    // A classic member joins a non-empty consumer group only with the
    // consumer protocol embedded (this one's subscription is empty)...
    let classic = JoinGroupRequest::default()
        .with_group_id(GroupId("g4".into()))
        .with_session_timeout_ms(10_000)
        .with_rebalance_timeout_ms(10_000)
        .with_protocol_type("consumer".into())
        .with_protocols(vec![
            JoinGroupRequestProtocol::default().with_name("range".into())
        ]);
    // (v3: no member-id handshake.)
    let r: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 3, &classic).await;
    assert_eq!(
        r.error_code,
        ResponseError::InconsistentGroupProtocol.code()
    );
    // ...and ListGroups / ConsumerGroupDescribe show it as a consumer group.
    let listed: ListGroupsResponse = raw
        .call(
            ApiKey::ListGroups,
            5,
            &ListGroupsRequest::default().with_types_filter(vec!["consumer".into()]),
        )
        .await;
    let g4 = listed
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == "g4")
        .unwrap();
    assert_eq!(
        (g4.group_type.as_str(), g4.group_state.as_str()),
        ("consumer", "Stable")
    );
    let described: ConsumerGroupDescribeResponse = raw
        .call(
            ApiKey::ConsumerGroupDescribe,
            1,
            &ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId("g4".into()), GroupId("missing".into())]),
        )
        .await;
    let g = &described.groups[0];
    assert_eq!(
        (g.error_code, g.group_epoch, g.assignor_name.as_str()),
        (0, 1, "range")
    );
    assert_eq!(
        g.members[0].assignment.topic_partitions[0]
            .topic_name
            .as_str(),
        "orders"
    );
    assert_eq!(
        described.groups[1].error_code,
        ResponseError::GroupIdNotFound.code()
    );

    // Once the member leaves, the empty group can turn classic.
    let left = hb(
        &mut raw,
        heartbeat("m", -1).with_group_id(GroupId("g4".into())),
    )
    .await;
    assert_eq!((left.error_code, left.member_epoch), (0, -1));
    let r: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 3, &classic).await;
    assert_eq!(r.error_code, 0, "an empty consumer group becomes classic");
    // Now a non-empty classic group whose member's embedded protocol is
    // malformed: it cannot be upgraded (Kafka answers GROUP_ID_NOT_FOUND).
    let mut raw2 = Raw::connect(broker.addr()).await;
    let r: ConsumerGroupHeartbeatResponse = raw2
        .call(ApiKey::ConsumerGroupHeartbeat, 1, &join("m2"))
        .await;
    assert_eq!(r.error_code, ResponseError::GroupIdNotFound.code());
}

fn classic_member(bootstrap: &str, group: &str, topics: &[&str]) -> BaseConsumer {
    let m: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("group.protocol", "classic")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500")
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    m.subscribe(topics).unwrap();
    m
}

/// ConsumerGroupDescribe v1: the group's type as ListGroups says, and its
/// members' types (0 classic, 1 consumer), sorted.
async fn group_kinds(raw: &mut Raw, group: &str) -> (String, Vec<i8>) {
    let listed: ListGroupsResponse = raw
        .call(ApiKey::ListGroups, 5, &ListGroupsRequest::default())
        .await;
    let kind = listed
        .groups
        .iter()
        .find(|g| g.group_id.as_str() == group)
        .map(|g| g.group_type.to_string())
        .unwrap_or_default();
    let described: ConsumerGroupDescribeResponse = raw
        .call(
            ApiKey::ConsumerGroupDescribe,
            1,
            &ConsumerGroupDescribeRequest::default()
                .with_group_ids(vec![GroupId(StrBytes::from_string(group.to_string()))]),
        )
        .await;
    let mut types: Vec<i8> = described.groups[0]
        .members
        .iter()
        .map(|m| m.member_type)
        .collect();
    types.sort();
    (kind, types)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_protocol_member_shares_a_group_with_a_classic_member() {
    let mut args = FAST.to_vec();
    args.extend(["--group-initial-rebalance-delay-ms", "0"]);
    let broker = InProcess::start(&args).await;
    let bs = broker.bootstrap();
    create_topic(&bs, "mixed", 4).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let a = classic_member(&bs, "mixed-g", &["mixed"]);
    poll_until(&[&a], "the classic member to own all four", || {
        assigned(&a) == 4
    });
    produce(&bs, "mixed", 0, 100).await;
    let mut seen = BTreeSet::new();
    consume(&[&a], 100, &mut seen);
    assert_eq!(group_kinds(&mut raw, "mixed-g").await.0, "classic");

    // librdkafka with group.protocol=consumer upgrades the group; the
    // classic member rejoins and keeps half.
    let b = member(&bs, "mixed-g", &["mixed"]);
    poll_until(&[&a, &b], "a 2/2 split", || {
        (assigned(&a), assigned(&b)) == (2, 2)
    });
    assert_eq!(
        group_kinds(&mut raw, "mixed-g").await,
        ("consumer".to_string(), vec![0, 1])
    );
    produce(&bs, "mixed", 100, 400).await;
    let mut seen = BTreeSet::new();
    let per = consume(&[&a, &b], 400, &mut seen);
    assert!(per.iter().all(|n| *n > 0), "both members consumed: {per:?}");
    assert_eq!(seen, values(100..500));
    assert_eq!(per.iter().sum::<usize>(), 400, "a record was read twice");

    // The consumer-protocol member leaves: a classic group again, and the
    // classic member reads everything after it from the committed offsets.
    b.unsubscribe();
    drop(b);
    poll_until(&[&a], "a to own all four again", || assigned(&a) == 4);
    assert_eq!(group_kinds(&mut raw, "mixed-g").await.0, "classic");
    produce(&bs, "mixed", 500, 100).await;
    let mut later = BTreeSet::new();
    let per = consume(&[&a], 100, &mut later);
    assert_eq!(later, values(500..600));
    assert_eq!(per, [100], "a record was read twice");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mixed_group_survives_kill_minus_nine_of_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut args = FAST.to_vec();
    args.extend(["--group-initial-rebalance-delay-ms", "0"]);
    let broker = Process::start(dir.path(), port, &args);
    let bs = broker.bootstrap();
    create_topic(&bs, "mixed-durable", 4).await;
    let a = classic_member(&bs, "mixed-durable-g", &["mixed-durable"]);
    poll_until(&[&a], "the classic member to own all four", || {
        assigned(&a) == 4
    });
    let b = member(&bs, "mixed-durable-g", &["mixed-durable"]);
    poll_until(&[&a, &b], "a 2/2 split", || {
        (assigned(&a), assigned(&b)) == (2, 2)
    });
    produce(&bs, "mixed-durable", 0, 200).await;
    let mut seen = BTreeSet::new();
    let per = consume(&[&a, &b], 200, &mut seen);
    assert_eq!(per.iter().sum::<usize>(), 200);
    broker.kill9();

    // Both members ride through the crash: the mixed group, its members and
    // their partitions were replayed from __consumer_offsets.
    let broker = Process::start(dir.path(), port, &args);
    let bs = broker.bootstrap();
    let mut raw = Raw::connect(bs.parse().unwrap()).await;
    assert_eq!(
        group_kinds(&mut raw, "mixed-durable-g").await,
        ("consumer".to_string(), vec![0, 1])
    );
    produce(&bs, "mixed-durable", 200, 100).await;
    let mut later = BTreeSet::new();
    let per = consume(&[&a, &b], 100, &mut later);
    assert_eq!(later, values(200..300));
    assert_eq!(per.iter().sum::<usize>(), 100, "a record was read twice");
    assert_eq!((assigned(&a), assigned(&b)), (2, 2));
}
