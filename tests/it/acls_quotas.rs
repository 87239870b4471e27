//! ACLs and client quotas against librdkafka (the `rdkafka` crate) and raw
//! requests: a topic the principal may not read is hidden from Metadata and
//! refused with TOPIC_AUTHORIZATION_FAILED, a PREFIXED allow and a LITERAL
//! deny combine as in Kafka, ACLs survive a wiped data directory, and a
//! client over its produce quota is throttled to near its quota, and one over
//! its request_percentage is throttled and muted.
//!
//! Until authentication lands every client is `User:ANONYMOUS`, so the
//! brokers run with `--allow-everyone-if-no-acl-found true`: a resource with
//! no ACL is open, one with ACLs is decided by them.

use crate::common;
use common::clients;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{InProcess, Raw};
use kafka_protocol::messages::create_acls_request::AclCreation;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::{ClientContext, Message};

const TIMEOUT: Duration = Duration::from_secs(20);
const AUTHORIZER: [&str; 4] = [
    "--authorizer",
    "acl",
    "--allow-everyone-if-no-acl-found",
    "true",
];
const TOPIC: i8 = 2;
const LITERAL: i8 = 3;
const PREFIXED: i8 = 4;
const READ: i8 = 3;
const DENY: i8 = 2;
const ALLOW: i8 = 3;

fn acl(name: &str, pattern: i8, principal: &str, op: i8, permission: i8) -> AclCreation {
    AclCreation::default()
        .with_resource_type(TOPIC)
        .with_resource_name(StrBytes::from_string(name.into()))
        .with_resource_pattern_type(pattern)
        .with_principal(StrBytes::from_string(principal.into()))
        .with_host(StrBytes::from_static_str("*"))
        .with_operation(op)
        .with_permission_type(permission)
}

async fn create_acls(addr: std::net::SocketAddr, acls: Vec<AclCreation>) {
    let mut raw = Raw::connect(addr).await;
    let resp: CreateAclsResponse = raw
        .call(
            ApiKey::CreateAcls,
            3,
            &CreateAclsRequest::default().with_creations(acls),
        )
        .await;
    for r in resp.results {
        assert_eq!(r.error_code, 0, "{:?}", r.error_message);
    }
}

async fn produce_one(bootstrap: &str, topic: &str) {
    let p: FutureProducer = clients::producer(bootstrap, &[]);
    p.send(FutureRecord::to(topic).key("k").payload("v"), TIMEOUT)
        .await
        .unwrap();
}

fn consumer(bootstrap: &str) -> BaseConsumer {
    static GROUP: AtomicU64 = AtomicU64::new(0);
    let group = format!("acl-test-{}", GROUP.fetch_add(1, Ordering::Relaxed));
    clients::client(
        bootstrap,
        &[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("auto.offset.reset", "earliest"),
            ("allow.auto.create.topics", "false"),
        ],
    )
    .create()
    .unwrap()
}

/// The first record of `topic`, or the error reading it. A subscription,
/// because librdkafka reports authorization errors of subscribed topics.
fn read_first(bootstrap: &str, topic: &str) -> Result<String, KafkaError> {
    let c = consumer(bootstrap);
    c.subscribe(&[topic]).unwrap();
    let deadline = Instant::now() + TIMEOUT;
    while Instant::now() < deadline {
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => return Ok(String::from_utf8_lossy(m.payload().unwrap()).into()),
            Some(Err(e)) => return Err(e),
            None => {}
        }
    }
    panic!("neither a record nor an error from {topic}");
}

/// A raw Fetch of partition 0 of `topic`: its error code.
async fn fetch_error(addr: std::net::SocketAddr, topic: &str) -> i16 {
    let mut raw = Raw::connect(addr).await;
    let req = common::fetch_request(topic, 0, 0);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &req).await;
    resp.responses[0].partitions[0].error_code
}

fn is_denied(e: &KafkaError) -> bool {
    e.rdkafka_error_code() == Some(RDKafkaErrorCode::TopicAuthorizationFailed)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_principal_without_read_is_refused_and_does_not_see_the_topic() {
    let broker = InProcess::start(&AUTHORIZER).await;
    let bootstrap = broker.bootstrap();
    produce_one(&bootstrap, "open").await;
    produce_one(&bootstrap, "secret").await;
    // Only bob may read "secret": the anonymous client now may not even describe it.
    create_acls(
        broker.addr(),
        vec![acl("secret", LITERAL, "User:bob", READ, ALLOW)],
    )
    .await;

    let c = consumer(&bootstrap);
    let all = c.fetch_metadata(None, TIMEOUT).unwrap();
    let names: Vec<&str> = all.topics().iter().map(|t| t.name()).collect();
    assert!(names.contains(&"open"), "{names:?}");
    assert!(!names.contains(&"secret"), "{names:?}");
    let one = c.fetch_metadata(Some("secret"), TIMEOUT).unwrap();
    assert_eq!(
        one.topics()[0].error(),
        Some(rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED)
    );

    assert_eq!(read_first(&bootstrap, "open").unwrap(), "v");
    let err = read_first(&bootstrap, "secret").unwrap_err();
    assert!(is_denied(&err), "{err:?}");
    assert_eq!(fetch_error(broker.addr(), "secret").await, 29);
    assert_eq!(fetch_error(broker.addr(), "open").await, 0);

    // Produce needs WRITE: refused the same way.
    let mut raw = Raw::connect(broker.addr()).await;
    let req = common::produce_request("secret", 0, common::batch(&[b"x"], -1, 0, 0), 1);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req).await;
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 29);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_prefixed_allow_and_a_literal_deny_combine_as_in_kafka() {
    let broker = InProcess::start(&AUTHORIZER).await;
    let bootstrap = broker.bootstrap();
    for t in ["orders-eu", "orders-secret"] {
        produce_one(&bootstrap, t).await;
    }
    create_acls(
        broker.addr(),
        vec![
            acl("orders-", PREFIXED, "User:ANONYMOUS", READ, ALLOW),
            acl("orders-secret", LITERAL, "User:ANONYMOUS", READ, DENY),
        ],
    )
    .await;
    assert_eq!(read_first(&bootstrap, "orders-eu").unwrap(), "v");
    let err = read_first(&bootstrap, "orders-secret").unwrap_err();
    assert!(is_denied(&err), "{err:?}");
    assert_eq!(fetch_error(broker.addr(), "orders-secret").await, 29);
    // READ implies DESCRIBE and the deny is of READ only: still listed.
    let names: Vec<String> = consumer(&bootstrap)
        .fetch_metadata(None, TIMEOUT)
        .unwrap()
        .topics()
        .iter()
        .map(|t| t.name().to_string())
        .collect();
    assert!(names.contains(&"orders-secret".to_string()), "{names:?}");

    // DescribeAcls with a MATCH filter lists both bindings that apply.
    let mut raw = Raw::connect(broker.addr()).await;
    let resp: DescribeAclsResponse = raw
        .call(
            ApiKey::DescribeAcls,
            3,
            &DescribeAclsRequest::default()
                .with_resource_type_filter(TOPIC)
                .with_resource_name_filter(Some(StrBytes::from_static_str("orders-secret")))
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_pattern_type_filter(2)
                .with_operation(1)
                .with_permission_type(1),
        )
        .await;
    assert_eq!(resp.error_code, 0);
    assert_eq!(resp.resources.len(), 2, "{:?}", resp.resources);
}

#[tokio::test(flavor = "multi_thread")]
async fn acls_survive_a_restart_with_a_wiped_data_dir() {
    let store = tempfile::tempdir().unwrap();
    let url = format!("file://{}", store.path().display());
    let mut args = AUTHORIZER.to_vec();
    args.extend(["--store", url.as_str()]);
    let data = tempfile::tempdir().unwrap();
    let broker = common::Process::start(data.path(), common::free_port(), &args);
    produce_one(&broker.bootstrap(), "kept").await;
    let addr: std::net::SocketAddr = broker.bootstrap().parse().unwrap();
    create_acls(
        addr,
        vec![acl("kept", LITERAL, "User:ANONYMOUS", READ, DENY)],
    )
    .await;
    broker.kill9();
    std::fs::remove_dir_all(data.path()).unwrap();

    let broker = common::Process::start(data.path(), common::free_port(), &args);
    let addr: std::net::SocketAddr = broker.bootstrap().parse().unwrap();
    let mut raw = Raw::connect(addr).await;
    let resp: DescribeAclsResponse = raw
        .call(
            ApiKey::DescribeAcls,
            3,
            &DescribeAclsRequest::default()
                .with_resource_type_filter(1)
                .with_resource_name_filter(None)
                .with_principal_filter(None)
                .with_host_filter(None)
                .with_pattern_type_filter(1)
                .with_operation(1)
                .with_permission_type(1),
        )
        .await;
    assert_eq!(resp.resources.len(), 1);
    assert_eq!(resp.resources[0].resource_name.as_str(), "kept");
    assert_eq!(resp.resources[0].acls[0].permission_type, DENY);
    // And still enforced (the topic itself came back from the store too).
    assert_eq!(fetch_error(addr, "kept").await, 29);
}

/// Counts the bytes of acknowledged records.
struct Delivered(Arc<AtomicU64>);
impl ClientContext for Delivered {}
impl ProducerContext for Delivered {
    type DeliveryOpaque = ();
    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Ok(m) = result {
            self.0.fetch_add(m.payload_len() as u64, Ordering::Relaxed);
        }
    }
}

async fn set_quota(addr: std::net::SocketAddr, client_id: &str, key: &str, value: f64) {
    use alter_client_quotas_request::{EntityData, EntryData, OpData};
    let mut raw = Raw::connect(addr).await;
    let req = AlterClientQuotasRequest::default().with_entries(vec![EntryData::default()
        .with_entity(vec![EntityData::default()
            .with_entity_type(StrBytes::from_static_str("client-id"))
            .with_entity_name(Some(StrBytes::from_string(client_id.into())))])
        .with_ops(vec![OpData::default()
            .with_key(StrBytes::from_string(key.into()))
            .with_value(value)])]);
    let resp: AlterClientQuotasResponse = raw.call(ApiKey::AlterClientQuotas, 1, &req).await;
    assert_eq!(
        resp.entries[0].error_code, 0,
        "{:?}",
        resp.entries[0].error_message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_over_its_produce_quota_is_throttled_near_the_quota() {
    const QUOTA: f64 = 200_000.0;
    let broker = InProcess::start(&[]).await;
    let bootstrap = broker.bootstrap();
    produce_one(&bootstrap, "metered").await;
    set_quota(broker.addr(), "c1", "producer_byte_rate", QUOTA).await;
    set_quota(broker.addr(), "raw-test", "producer_byte_rate", 1000.0).await;

    // The raw client is told how long to wait once it is over.
    let mut raw = Raw::connect(broker.addr()).await;
    let value = vec![b'x'; 20_000];
    let req = common::produce_request("metered", 0, common::batch(&[&value], -1, 0, 0), 1);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, 9, &req).await;
    assert_eq!(resp.responses[0].partition_responses[0].error_code, 0);
    assert!(resp.throttle_time_ms > 0, "{}", resp.throttle_time_ms);

    // librdkafka as fast as it can: what is acknowledged stays near the quota.
    let delivered = Arc::new(AtomicU64::new(0));
    let producer: ThreadedProducer<Delivered> = ClientConfig::new()
        .set("bootstrap.servers", &bootstrap)
        .set("client.id", "c1")
        .set("acks", "1")
        .set("linger.ms", "5")
        .set("batch.size", "16384")
        .set("queue.buffering.max.kbytes", "4096")
        .create_with_context(Delivered(delivered.clone()))
        .unwrap();
    let payload = vec![b'y'; 1000];
    // Measured after the first burst (a young window counts as ten seconds
    // long, so a new client may send ten seconds' worth at once, as in Kafka)
    // and over more than a whole window.
    let start = Instant::now();
    let (warm_up, end) = (Duration::from_secs(4), Duration::from_secs(17));
    let mut at_warm_up = None;
    while start.elapsed() < end {
        if at_warm_up.is_none() && start.elapsed() >= warm_up {
            at_warm_up = Some((Instant::now(), delivered.load(Ordering::Relaxed)));
        }
        match producer.send(BaseRecord::to("metered").payload(&payload).key("k")) {
            Ok(()) => {}
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), _)) => {
                std::thread::sleep(Duration::from_millis(5))
            }
            Err((e, _)) => panic!("{e:?}"),
        }
    }
    let (t0, b0) = at_warm_up.unwrap();
    let bytes = (delivered.load(Ordering::Relaxed) - b0) as f64;
    let rate = bytes / t0.elapsed().as_secs_f64();
    producer.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
    assert!(
        rate > QUOTA * 0.5 && rate < QUOTA * 1.6,
        "{rate:.0} B/s against a quota of {QUOTA} B/s"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_client_over_its_request_percentage_is_throttled_and_muted() {
    let broker = InProcess::start(&[]).await;
    // 0.01% of a thread: a millisecond of handler time in a ten-second window.
    set_quota(broker.addr(), "raw-test", "request_percentage", 0.01).await;

    let mut raw = Raw::connect(broker.addr()).await;
    let req = MetadataRequest::default().with_topics(None);
    let mut throttle = 0;
    for _ in 0..20_000 {
        let resp: MetadataResponse = raw.call(ApiKey::Metadata, 12, &req).await;
        throttle = resp.throttle_time_ms;
        if throttle > 0 {
            break;
        }
    }
    assert!(throttle > 0, "never throttled");
    // The broker reads nothing more from the connection until then.
    let started = Instant::now();
    let _: MetadataResponse = raw.call(ApiKey::Metadata, 12, &req).await;
    assert!(
        started.elapsed() >= Duration::from_millis(throttle as u64 * 9 / 10),
        "answered after {:?}, throttled for {throttle} ms",
        started.elapsed()
    );
}

async fn describe_all_acls(addr: std::net::SocketAddr) -> DescribeAclsResponse {
    let mut raw = Raw::connect(addr).await;
    raw.call(
        ApiKey::DescribeAcls,
        3,
        &DescribeAclsRequest::default()
            .with_resource_type_filter(1)
            .with_resource_name_filter(None)
            .with_principal_filter(None)
            .with_host_filter(None)
            .with_pattern_type_filter(1)
            .with_operation(1)
            .with_permission_type(1),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn in_a_cluster_acls_and_quotas_set_on_one_broker_reach_the_others_through_etcd() {
    let settings = common::cluster::Settings {
        extra: AUTHORIZER.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let Some(cluster) = common::cluster::Cluster::start_with(&[1, 2], settings).await else {
        eprintln!("etcd not installed; skipping");
        return;
    };
    let one: std::net::SocketAddr = cluster.bootstrap_of(1).parse().unwrap();
    let two: std::net::SocketAddr = cluster.bootstrap_of(2).parse().unwrap();
    create_acls(
        one,
        vec![acl("shared", LITERAL, "User:ANONYMOUS", READ, DENY)],
    )
    .await;
    set_quota(two, "c9", "consumer_byte_rate", 4096.0).await;

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let acls = describe_all_acls(two).await;
        let mut raw = Raw::connect(one).await;
        let quotas: DescribeClientQuotasResponse = raw
            .call(
                ApiKey::DescribeClientQuotas,
                1,
                &DescribeClientQuotasRequest::default(),
            )
            .await;
        let quota_seen = quotas.entries.as_ref().is_some_and(|e| {
            e.iter().any(|q| {
                q.values
                    .iter()
                    .any(|v| v.key.as_str() == "consumer_byte_rate" && v.value == 4096.0)
            })
        });
        if acls.resources.len() == 1 && quota_seen {
            assert_eq!(acls.resources[0].resource_name.as_str(), "shared");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not propagated: {acls:?} {quotas:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The transaction APIs: WRITE on the transactional id (EndTxn,
/// AddOffsetsToTxn, AddPartitionsToTxn), WRITE on each topic added, DESCRIBE
/// for DescribeTransactions; a transactional librdkafka producer whose id
/// and topic carry no ACL commits through the same checks.
#[tokio::test(flavor = "multi_thread")]
async fn transaction_apis_need_write_on_the_transactional_id_and_the_topics() {
    const TRANSACTIONAL_ID: i8 = 5;
    const WRITE: i8 = 4;
    let broker = InProcess::start(&AUTHORIZER).await;
    let bootstrap = broker.bootstrap();
    produce_one(&bootstrap, "open").await;
    produce_one(&bootstrap, "secret").await;
    create_acls(
        broker.addr(),
        vec![
            acl("secret", LITERAL, "User:bob", WRITE, ALLOW),
            acl("txn-secret", LITERAL, "User:bob", WRITE, ALLOW)
                .with_resource_type(TRANSACTIONAL_ID),
        ],
    )
    .await;

    let p: FutureProducer = clients::producer(&bootstrap, &[("transactional.id", "txn-ok")]);
    p.init_transactions(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    p.send(FutureRecord::to("open").key("k").payload("t"), TIMEOUT)
        .await
        .unwrap();
    p.commit_transaction(TIMEOUT).unwrap();

    let s = |v: &str| StrBytes::from_string(v.into());
    let mut raw = Raw::connect(broker.addr()).await;
    let end: EndTxnResponse = raw
        .call(
            ApiKey::EndTxn,
            3,
            &EndTxnRequest::default()
                .with_transactional_id(TransactionalId(s("txn-secret")))
                .with_producer_id(ProducerId(1))
                .with_committed(true),
        )
        .await;
    assert_eq!(end.error_code, 53);
    let offsets: AddOffsetsToTxnResponse = raw
        .call(
            ApiKey::AddOffsetsToTxn,
            3,
            &AddOffsetsToTxnRequest::default()
                .with_transactional_id(TransactionalId(s("txn-secret")))
                .with_group_id(GroupId(s("g"))),
        )
        .await;
    assert_eq!(offsets.error_code, 53);

    // WRITE on "open" but not on "secret": the whole request is refused,
    // "secret" with TOPIC_AUTHORIZATION_FAILED, "open" not attempted.
    let topic = |name: &str| {
        add_partitions_to_txn_request::AddPartitionsToTxnTopic::default()
            .with_name(TopicName(s(name)))
            .with_partitions(vec![0])
    };
    let add: AddPartitionsToTxnResponse = raw
        .call(
            ApiKey::AddPartitionsToTxn,
            3,
            &AddPartitionsToTxnRequest::default()
                .with_v3_and_below_transactional_id(TransactionalId(s("txn-ok")))
                .with_v3_and_below_producer_id(ProducerId(1))
                .with_v3_and_below_topics(vec![topic("open"), topic("secret")]),
        )
        .await;
    let codes: Vec<(String, i16)> = add
        .results_by_topic_v3_and_below
        .iter()
        .map(|t| {
            (
                t.name.to_string(),
                t.results_by_partition[0].partition_error_code,
            )
        })
        .collect();
    assert_eq!(
        codes,
        [("open".to_string(), 55), ("secret".to_string(), 29)]
    );

    let described: DescribeTransactionsResponse = raw
        .call(
            ApiKey::DescribeTransactions,
            0,
            &DescribeTransactionsRequest::default().with_transactional_ids(vec![
                TransactionalId(s("txn-ok")),
                TransactionalId(s("txn-secret")),
            ]),
        )
        .await;
    let codes: Vec<i16> = described
        .transaction_states
        .iter()
        .map(|t| t.error_code)
        .collect();
    assert_eq!(codes, [0, 53]);
}

/// Metadata and DescribeTopicPartitions report the operations the principal
/// may perform, one bit per operation code: every topic operation on a topic
/// no ACL names, only READ and the DESCRIBE it implies on one whose only ACL
/// allows READ.
#[tokio::test(flavor = "multi_thread")]
async fn authorized_operations_follow_the_acls() {
    const ALL_TOPIC_OPERATIONS: i32 =
        (1 << 3) | (1 << 4) | (1 << 5) | (1 << 6) | (1 << 7) | (1 << 8) | (1 << 10) | (1 << 11);
    const READ_AND_DESCRIBE: i32 = (1 << 3) | (1 << 8);
    let broker = InProcess::start(&AUTHORIZER).await;
    let bootstrap = broker.bootstrap();
    produce_one(&bootstrap, "open").await;
    produce_one(&bootstrap, "readable").await;
    create_acls(
        broker.addr(),
        vec![acl("readable", LITERAL, "User:ANONYMOUS", READ, ALLOW)],
    )
    .await;

    let s = |v: &str| StrBytes::from_string(v.into());
    let mut raw = Raw::connect(broker.addr()).await;
    let metadata: MetadataResponse = raw
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default()
                .with_topics(Some(
                    ["open", "readable"]
                        .map(|t| {
                            metadata_request::MetadataRequestTopic::default()
                                .with_name(Some(TopicName(s(t))))
                        })
                        .to_vec(),
                ))
                .with_include_topic_authorized_operations(true),
        )
        .await;
    let operations: Vec<(String, i32)> = metadata
        .topics
        .iter()
        .map(|t| {
            (
                t.name.as_ref().unwrap().to_string(),
                t.topic_authorized_operations,
            )
        })
        .collect();
    assert_eq!(
        operations,
        [
            ("open".to_string(), ALL_TOPIC_OPERATIONS),
            ("readable".to_string(), READ_AND_DESCRIBE)
        ]
    );

    let described: DescribeTopicPartitionsResponse = raw
        .call(
            ApiKey::DescribeTopicPartitions,
            0,
            &DescribeTopicPartitionsRequest::default()
                .with_topics(vec![
                    describe_topic_partitions_request::TopicRequest::default()
                        .with_name(TopicName(s("readable"))),
                ])
                .with_response_partition_limit(10),
        )
        .await;
    assert_eq!(
        described.topics[0].topic_authorized_operations,
        READ_AND_DESCRIBE
    );
}
