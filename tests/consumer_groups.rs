//! Consumer groups with librdkafka: balancing, members leaving and crashing,
//! static membership, and committed offsets that survive `kill -9`.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use common::{free_port, InProcess, Process, Raw};
use kafka_protocol::messages::join_group_request::JoinGroupRequestProtocol;
use kafka_protocol::messages::{
    ApiKey, ConsumerProtocolSubscription, GroupId, JoinGroupRequest, JoinGroupResponse,
    SyncGroupRequest,
};
use kafka_protocol::protocol::Encodable;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientContext, Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);
const FAST: &[&str] = &[
    "--group-initial-rebalance-delay-ms",
    "0",
    "--group-min-session-timeout-ms",
    "1000",
];

#[derive(Default)]
struct Counting {
    assigned: AtomicUsize,
}

impl ClientContext for Counting {}
impl ConsumerContext for Counting {
    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if matches!(rebalance, Rebalance::Assign(_)) {
            self.assigned.fetch_add(1, Ordering::SeqCst);
        }
    }
}

type Member = BaseConsumer<Counting>;

fn member(bootstrap: &str, group: &str, extra: &[(&str, &str)]) -> Arc<Member> {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "500");
    for (k, v) in extra {
        c.set(*k, *v);
    }
    let m: Member = c.create_with_context(Counting::default()).unwrap();
    m.subscribe(&["orders"]).unwrap();
    Arc::new(m)
}

async fn setup(bootstrap: &str, partitions: i32, records: usize) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .unwrap();
    let res = admin
        .create_topics(
            &[NewTopic::new(
                "orders",
                partitions,
                TopicReplication::Fixed(1),
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert!(res[0].is_ok());
    produce(bootstrap, 0, records).await;
}

async fn produce(bootstrap: &str, from: usize, count: usize) {
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
                p.send(
                    FutureRecord::to("orders").key(&key).payload(&value),
                    TIMEOUT,
                )
                .await
                .unwrap();
            }
        })
        .collect();
    futures::future::join_all(sends).await;
}

/// Polls every member until `want` distinct values arrived, committing after each record.
fn consume_all(
    members: &[&Member],
    want: usize,
    seen: &mut BTreeSet<String>,
    per_member: &mut HashMap<usize, usize>,
) {
    let deadline = Instant::now() + TIMEOUT;
    while seen.len() < want {
        assert!(
            Instant::now() < deadline,
            "only {} of {want} records consumed",
            seen.len()
        );
        for (i, m) in members.iter().enumerate() {
            if let Some(msg) = m.poll(Duration::from_millis(50)) {
                // Transport errors while a broker restarts are reported, not fatal.
                let Ok(msg) = msg else { continue };
                seen.insert(String::from_utf8(msg.payload().unwrap().to_vec()).unwrap());
                *per_member.entry(i).or_default() += 1;
                m.commit_message(&msg, CommitMode::Sync).unwrap();
            }
        }
    }
}

fn assigned(m: &Member) -> usize {
    m.assignment().map(|a| a.count()).unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_share_partitions_and_take_over_when_one_leaves() {
    let broker = InProcess::start(FAST).await;
    let bs = broker.bootstrap();
    setup(&bs, 4, 400).await;
    let a = member(&bs, "g1", &[]);
    let b = member(&bs, "g1", &[]);
    let mut seen = BTreeSet::new();
    let mut per = HashMap::new();
    consume_all(&[&a, &b], 400, &mut seen, &mut per);
    assert_eq!(
        (assigned(&a), assigned(&b)),
        (2, 2),
        "four partitions split between two members"
    );
    assert!(
        per.values().all(|n| *n > 0),
        "both members consumed: {per:?}"
    );

    // b leaves the group cleanly; a takes every partition and reads what comes next.
    drop(b);
    produce(&bs, 400, 100).await;
    let mut later = BTreeSet::new();
    consume_all(&[&a], 100, &mut later, &mut HashMap::new());
    assert_eq!(assigned(&a), 4);
    assert_eq!(later, (400..500).map(|i| format!("v{i}")).collect());
}

/// A consumer-protocol subscription to "orders", as a Java client encodes it.
fn subscription() -> Bytes {
    let mut b = BytesMut::new();
    b.put_i16(0);
    ConsumerProtocolSubscription::default()
        .with_topics(vec!["orders".into()])
        .encode(&mut b, 0)
        .unwrap();
    b.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_member_is_expired_and_its_partitions_move() {
    let broker = InProcess::start(FAST).await;
    let bs = broker.bootstrap();
    setup(&bs, 2, 100).await;
    let a = member(&bs, "g2", &[]);
    let mut seen = BTreeSet::new();
    consume_all(&[&a], 100, &mut seen, &mut HashMap::new());
    assert_eq!(assigned(&a), 2);

    // A member on a raw connection joins, gets a partition, then goes silent
    // like a crashed process: no heartbeat, no LeaveGroup.
    let mut raw = Raw::connect(broker.addr()).await;
    let join = |member: &str| {
        JoinGroupRequest::default()
            .with_group_id(GroupId("g2".into()))
            .with_session_timeout_ms(1500)
            .with_rebalance_timeout_ms(10_000)
            .with_member_id(member.to_string().into())
            .with_protocol_type("consumer".into())
            .with_protocols(vec![JoinGroupRequestProtocol::default()
                .with_name("range".into())
                .with_metadata(subscription())])
    };
    let first: JoinGroupResponse = raw.call(ApiKey::JoinGroup, 7, &join("")).await;
    raw.send(ApiKey::JoinGroup, 7, &join(first.member_id.as_str()))
        .await;
    let deadline = Instant::now() + TIMEOUT;
    let joined: JoinGroupResponse = loop {
        let _ = a.poll(Duration::from_millis(50));
        if let Ok(Some(r)) =
            tokio::time::timeout(Duration::from_millis(10), raw.receive(ApiKey::JoinGroup, 7)).await
        {
            break r;
        }
        assert!(Instant::now() < deadline, "rebalance did not complete");
    };
    let sync = SyncGroupRequest::default()
        .with_group_id(GroupId("g2".into()))
        .with_generation_id(joined.generation_id)
        .with_member_id(joined.member_id.clone());
    raw.send(ApiKey::SyncGroup, 5, &sync).await;
    while assigned(&a) != 1 {
        let _ = a.poll(Duration::from_millis(50));
        assert!(Instant::now() < deadline, "a never gave up a partition");
    }
    // The silent member's session expires; a gets both partitions back and reads everything new.
    produce(&bs, 100, 50).await;
    let mut later = BTreeSet::new();
    consume_all(&[&a], 50, &mut later, &mut HashMap::new());
    assert_eq!(assigned(&a), 2);
    assert_eq!(later, (100..150).map(|i| format!("v{i}")).collect());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_member_restarting_within_its_session_causes_no_rebalance() {
    let broker = InProcess::start(FAST).await;
    let bs = broker.bootstrap();
    setup(&bs, 2, 50).await;
    let stable = member(&bs, "g3", &[("group.instance.id", "stable-1")]);
    let bouncing = member(&bs, "g3", &[("group.instance.id", "bouncing-1")]);
    let mut seen = BTreeSet::new();
    consume_all(&[&stable, &bouncing], 50, &mut seen, &mut HashMap::new());
    let before = stable.context().assigned.load(Ordering::SeqCst);
    let before_assignment = assigned(&bouncing);
    drop(bouncing);
    let bouncing = member(&bs, "g3", &[("group.instance.id", "bouncing-1")]);
    produce(&bs, 50, 20).await;
    let mut later = BTreeSet::new();
    consume_all(&[&stable, &bouncing], 20, &mut later, &mut HashMap::new());
    assert_eq!(assigned(&bouncing), before_assignment);
    assert_eq!(
        stable.context().assigned.load(Ordering::SeqCst),
        before,
        "the other member saw no rebalance"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn groups_and_committed_offsets_survive_kill_minus_nine() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Process::start(dir.path(), port, FAST);
    let bs = broker.bootstrap();
    setup(&bs, 3, 300).await;
    let m = member(&bs, "durable-group", &[]);
    let mut seen = BTreeSet::new();
    consume_all(&[&m], 300, &mut seen, &mut HashMap::new());
    let rebalances = m.context().assigned.load(Ordering::SeqCst);
    broker.kill9();

    // The member keeps running across the broker's crash and restart: its
    // membership was persisted, so it carries on without a rebalance.
    let broker = Process::start(dir.path(), port, FAST);
    let bs = broker.bootstrap();
    produce(&bs, 300, 30).await;
    let mut later = BTreeSet::new();
    consume_all(&[&m], 30, &mut later, &mut HashMap::new());
    assert_eq!(later, (300..330).map(|i| format!("v{i}")).collect());
    assert_eq!(
        m.context().assigned.load(Ordering::SeqCst),
        rebalances,
        "no rebalance after the restart"
    );
    drop(m);

    broker.kill9();
    let broker = Process::start(dir.path(), port, FAST);
    let bs = broker.bootstrap();
    let m = member(&bs, "durable-group", &[]);
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
    // Nothing committed is delivered again.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert!(m.poll(Duration::from_millis(100)).is_none());
    }
}
