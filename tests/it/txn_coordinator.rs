//! The transaction coordinator against a real broker: librdkafka's
//! transactional producer (init, begin, send, commit, abort, offsets sent to
//! a transaction, fencing by a second producer with the same
//! transactional.id), and over the raw protocol what clients do not show:
//! FindCoordinator for transactions, Kafka's error codes for wrong states,
//! DescribeTransactions / ListTransactions, the Kafka-format records of
//! `__transaction_state`, the abort of a transaction past its timeout, and
//! a broker killed between the EndTxn answer and the markers.

use crate::common;
use common::clients::{self, send, TxnProducer};

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{free_port, str_bytes, topic_name, InProcess, Process, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::*;
use kafka_protocol::records::{Compression, RecordBatchDecoder};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::Producer;
use rdkafka::{Offset, TopicPartitionList};

const TIMEOUT: Duration = Duration::from_secs(30);

async fn create_topic(bootstrap: &str, name: &str, partitions: i32) {
    clients::create_topic(bootstrap, name, partitions, &[]).await
}

fn producer(bootstrap: &str, transactional_id: &str) -> TxnProducer {
    clients::transactional_producer(bootstrap, transactional_id, &[("linger.ms", "5")], TIMEOUT)
}

/// Every value in `topic` (all partitions), read with `isolation`.
fn read_all(bootstrap: &str, topic: &str, partitions: i32, isolation: &str) -> BTreeSet<String> {
    let c = clients::reader(bootstrap, &[("isolation.level", isolation)]);
    clients::assign(&c, topic, partitions, Offset::Beginning);
    let mut out = BTreeSet::new();
    let mut quiet_since = Instant::now();
    let deadline = Instant::now() + TIMEOUT;
    while quiet_since.elapsed() < Duration::from_secs(2) && Instant::now() < deadline {
        match c.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                out.insert(String::from_utf8_lossy(m.payload().unwrap_or_default()).into());
                quiet_since = Instant::now();
            }
            Some(Err(e)) => panic!("consume: {e}"),
            None => {}
        }
    }
    out
}

fn set(values: &[&str]) -> BTreeSet<String> {
    values.iter().map(|v| v.to_string()).collect()
}

/// Polls `f` until it returns Some, or panics after `TIMEOUT`.
async fn eventually<T, F: std::future::Future<Output = Option<T>>>(
    what: &str,
    mut f: impl FnMut() -> F,
) -> T {
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn describe(raw: &mut Raw, id: &str) -> describe_transactions_response::TransactionState {
    let resp: DescribeTransactionsResponse = raw
        .call(
            ApiKey::DescribeTransactions,
            0,
            &DescribeTransactionsRequest::default()
                .with_transactional_ids(vec![TransactionalId(str_bytes(id))]),
        )
        .await;
    resp.transaction_states.into_iter().next().unwrap()
}

async fn state_of(addr: std::net::SocketAddr, id: &str) -> String {
    let mut raw = Raw::connect(addr).await;
    describe(&mut raw, id).await.transaction_state.to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn committed_transactions_are_read_and_aborted_ones_are_not() {
    let b = InProcess::start(&[]).await;
    let bootstrap = b.bootstrap();
    create_topic(&bootstrap, "orders", 2).await;
    let p = producer(&bootstrap, "orders-writer");
    p.begin_transaction().unwrap();
    send(&p, "orders", 0, "c0");
    send(&p, "orders", 1, "c1");
    p.commit_transaction(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send(&p, "orders", 0, "a0");
    send(&p, "orders", 1, "a1");
    // Sent, so that the abort has records to hide (librdkafka drops unsent ones).
    p.flush(TIMEOUT).unwrap();
    p.abort_transaction(TIMEOUT).unwrap();
    p.begin_transaction().unwrap();
    send(&p, "orders", 1, "c2");
    p.commit_transaction(TIMEOUT).unwrap();

    // Everything was written; read_committed skips the aborted transaction.
    assert_eq!(
        read_all(&bootstrap, "orders", 2, "read_uncommitted"),
        set(&["c0", "c1", "a0", "a1", "c2"])
    );
    assert_eq!(
        read_all(&bootstrap, "orders", 2, "read_committed"),
        set(&["c0", "c1", "c2"])
    );
    // The coordinator's view, as kafka-transactions.sh shows it.
    let addr = b.addr();
    eventually("the last transaction to complete", || async {
        (state_of(addr, "orders-writer").await == "CompleteCommit").then_some(())
    })
    .await;
    let mut raw = Raw::connect(addr).await;
    let d = describe(&mut raw, "orders-writer").await;
    assert_eq!((d.error_code, d.producer_epoch), (0, 0));
    assert!(
        d.topics.is_empty(),
        "a complete transaction holds no partitions"
    );
    let listed: ListTransactionsResponse = raw
        .call(
            ApiKey::ListTransactions,
            1,
            &ListTransactionsRequest::default()
                .with_state_filters(vec![str_bytes("CompleteCommit"), str_bytes("Bogus")])
                .with_duration_filter(-1),
        )
        .await;
    assert_eq!(listed.unknown_state_filters, vec![str_bytes("Bogus")]);
    assert_eq!(listed.transaction_states.len(), 1);
    assert_eq!(listed.transaction_states[0].producer_id, d.producer_id);
    let none: ListTransactionsResponse = raw
        .call(
            ApiKey::ListTransactions,
            1,
            &ListTransactionsRequest::default()
                .with_producer_id_filters(vec![ProducerId(d.producer_id.0 + 1)])
                .with_duration_filter(-1),
        )
        .await;
    assert!(none.transaction_states.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_producer_with_the_same_transactional_id_fences_the_first() {
    let b = InProcess::start(&[]).await;
    let bootstrap = b.bootstrap();
    create_topic(&bootstrap, "fenced", 1).await;
    let old = producer(&bootstrap, "shared-id");
    old.begin_transaction().unwrap();
    send(&old, "fenced", 0, "from-the-old-one");
    old.flush(TIMEOUT).unwrap();
    // The new producer's init aborts the old one's open transaction first.
    let new = producer(&bootstrap, "shared-id");
    let err = old.commit_transaction(TIMEOUT).unwrap_err();
    assert!(
        err.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::Fenced),
        "the old producer must learn it is fenced: {err:?}"
    );
    new.begin_transaction().unwrap();
    send(&new, "fenced", 0, "from-the-new-one");
    new.commit_transaction(TIMEOUT).unwrap();
    assert_eq!(
        read_all(&bootstrap, "fenced", 1, "read_committed"),
        set(&["from-the-new-one"])
    );
    let mut raw = Raw::connect(b.addr()).await;
    let d = describe(&mut raw, "shared-id").await;
    assert_eq!(
        d.producer_epoch, 2,
        "epoch 0, the fence (1), the new producer (2)"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offsets_sent_to_a_transaction_reach_the_group_only_when_it_commits() {
    let b = InProcess::start(&[]).await;
    let bootstrap = b.bootstrap();
    create_topic(&bootstrap, "in", 1).await;
    create_topic(&bootstrap, "out", 1).await;
    let group: BaseConsumer = clients::client(
        &bootstrap,
        &[
            ("group.id", "processors"),
            ("enable.auto.commit", "false"),
            ("isolation.level", "read_committed"),
        ],
    )
    .create()
    .unwrap();
    let committed = |group: &BaseConsumer| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition("in", 0);
        let got = group.committed_offsets(tpl, TIMEOUT).unwrap();
        got.find_partition("in", 0).unwrap().offset()
    };
    let offsets = |at: i64| {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("in", 0, Offset::Offset(at))
            .unwrap();
        tpl
    };
    let p = producer(&bootstrap, "processor-1");
    p.begin_transaction().unwrap();
    send(&p, "out", 0, "aborted output");
    p.send_offsets_to_transaction(&offsets(5), &group.group_metadata().unwrap(), TIMEOUT)
        .unwrap();
    p.abort_transaction(TIMEOUT).unwrap();
    assert_eq!(
        committed(&group),
        Offset::Invalid,
        "aborted offsets never count"
    );
    p.begin_transaction().unwrap();
    send(&p, "out", 0, "committed output");
    p.send_offsets_to_transaction(&offsets(7), &group.group_metadata().unwrap(), TIMEOUT)
        .unwrap();
    p.commit_transaction(TIMEOUT).unwrap();
    assert_eq!(committed(&group), Offset::Offset(7));
    // The offsets survive a restart: replay honours the COMMIT marker.
    let dir = b.dir;
    b.server.shutdown().await.unwrap();
    drop(group);
    let server = strata::server::Server::start(common::config(dir.path(), &[]))
        .await
        .unwrap();
    let group: BaseConsumer = clients::client(
        &server.local_addr().to_string(),
        &[("group.id", "processors")],
    )
    .create()
    .unwrap();
    assert_eq!(committed(&group), Offset::Offset(7));
    server.shutdown().await.unwrap();
}

async fn init(raw: &mut Raw, id: &str, timeout_ms: i32, version: i16) -> InitProducerIdResponse {
    raw.call(
        ApiKey::InitProducerId,
        version,
        &InitProducerIdRequest::default()
            .with_transactional_id(Some(TransactionalId(str_bytes(id))))
            .with_transaction_timeout_ms(timeout_ms)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1),
    )
    .await
}

async fn add_partitions(
    raw: &mut Raw,
    id: &str,
    producer: (i64, i16),
    topic: &str,
    partitions: Vec<i32>,
    version: i16,
) -> i16 {
    let req = AddPartitionsToTxnRequest::default()
        .with_v3_and_below_transactional_id(TransactionalId(str_bytes(id)))
        .with_v3_and_below_producer_id(ProducerId(producer.0))
        .with_v3_and_below_producer_epoch(producer.1)
        .with_v3_and_below_topics(vec![AddPartitionsToTxnTopic::default()
            .with_name(topic_name(topic))
            .with_partitions(partitions)]);
    let resp: AddPartitionsToTxnResponse =
        raw.call(ApiKey::AddPartitionsToTxn, version, &req).await;
    resp.results_by_topic_v3_and_below[0].results_by_partition[0].partition_error_code
}

async fn end(raw: &mut Raw, id: &str, producer: (i64, i16), commit: bool, version: i16) -> i16 {
    end_txn(raw, id, producer, commit, version).await.error_code
}

async fn end_txn(
    raw: &mut Raw,
    id: &str,
    producer: (i64, i16),
    commit: bool,
    version: i16,
) -> EndTxnResponse {
    let req = EndTxnRequest::default()
        .with_transactional_id(TransactionalId(str_bytes(id)))
        .with_producer_id(ProducerId(producer.0))
        .with_producer_epoch(producer.1)
        .with_committed(commit);
    raw.call(ApiKey::EndTxn, version, &req).await
}

/// Produces one transactional record `value` to partition 0 of `topic`.
async fn produce(
    raw: &mut Raw,
    id: &str,
    topic: &str,
    producer: (i64, i16),
    seq: i32,
    value: &str,
) {
    assert_eq!(
        produce_at(raw, id, (topic, 0), producer, seq, value, 9).await,
        0
    );
}

/// Produces one transactional record with Produce `version`; the error code.
async fn produce_at(
    raw: &mut Raw,
    id: &str,
    place: (&str, i32),
    producer: (i64, i16),
    seq: i32,
    value: &str,
    version: i16,
) -> i16 {
    let req = txn_produce_request(id, place, producer, seq, value);
    let resp: ProduceResponse = raw.call(ApiKey::Produce, version, &req).await;
    resp.responses[0].partition_responses[0].error_code
}

fn txn_produce_request(
    id: &str,
    (topic, partition): (&str, i32),
    producer: (i64, i16),
    seq: i32,
    value: &str,
) -> ProduceRequest {
    let records = strata::format::batch::encode_transactional_batch(
        vec![(
            None,
            Some(Bytes::from(value.to_string())),
            1_700_000_000_000,
        )],
        (producer.0, producer.1, seq),
        Compression::None,
    )
    .unwrap();
    common::produce_request(topic, partition, records, -1)
        .with_transactional_id(Some(TransactionalId(str_bytes(id))))
}

/// EndTxn v5 (transactions v2): the error code and the producer id and
/// epoch for the next transaction.
async fn end_v2(raw: &mut Raw, id: &str, producer: (i64, i16), commit: bool) -> (i16, (i64, i16)) {
    let resp = end_txn(raw, id, producer, commit, 5).await;
    (resp.error_code, (resp.producer_id.0, resp.producer_epoch))
}

/// (is control, producer id, control type or value) of every record of partition 0.
async fn records(raw: &mut Raw, topic: &str) -> Vec<(bool, i64, String)> {
    records_of(raw, topic, 0).await
}

async fn records_of(raw: &mut Raw, topic: &str, partition: i32) -> Vec<(bool, i64, String)> {
    let req = common::fetch_request(topic, partition, 0);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &req).await;
    let p = &resp.responses[0].partitions[0];
    assert_eq!(p.error_code, 0, "fetch {topic}-{partition}");
    let mut data = p.records.clone().unwrap_or_default();
    let mut out = Vec::new();
    for set in RecordBatchDecoder::decode_all(&mut data).unwrap() {
        for r in set.records {
            let what = if r.control {
                let k = r.key.unwrap();
                if i16::from_be_bytes([k[2], k[3]]) == 1 {
                    "COMMIT"
                } else {
                    "ABORT"
                }
                .to_string()
            } else {
                String::from_utf8_lossy(&r.value.unwrap_or_default()).into()
            };
            out.push((r.control, r.producer_id, what));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_transactions_v2_producing_adds_partitions_and_every_end_bumps_the_epoch() {
    let b = InProcess::start(&[]).await;
    let mut raw = Raw::connect(b.addr()).await;
    create_topic(&b.bootstrap(), "v2", 1).await;
    create_topic(&b.bootstrap(), "v2-other", 1).await;
    let i = init(&mut raw, "tv2", 60_000, 5).await;
    let p0 = (i.producer_id.0, i.producer_epoch);
    let fenced = ResponseError::InvalidProducerEpoch.code();

    // No AddPartitionsToTxn: Produce v12 adds the partition.
    assert_eq!(
        produce_at(&mut raw, "tv2", ("v2", 0), p0, 0, "a", 12).await,
        0
    );
    let d = describe(&mut raw, "tv2").await;
    assert_eq!(d.transaction_state.as_str(), "Ongoing");
    assert_eq!(d.topics[0].topic.as_str(), "v2");
    // TxnOffsetCommit v5 adds the group's offsets partition itself.
    let commit = TxnOffsetCommitRequest::default()
        .with_transactional_id(TransactionalId(str_bytes("tv2")))
        .with_group_id(str_bytes("g").into())
        .with_producer_id(ProducerId(p0.0))
        .with_producer_epoch(p0.1)
        .with_generation_id_or_member_epoch(-1)
        .with_topics(vec![
            txn_offset_commit_request::TxnOffsetCommitRequestTopic::default()
                .with_name(topic_name("v2"))
                .with_partitions(vec![
                    txn_offset_commit_request::TxnOffsetCommitRequestPartition::default()
                        .with_partition_index(0)
                        .with_committed_offset(7),
                ]),
        ]);
    let r: TxnOffsetCommitResponse = raw.call(ApiKey::TxnOffsetCommit, 5, &commit).await;
    assert_eq!(r.topics[0].partitions[0].error_code, 0);
    let d = describe(&mut raw, "tv2").await;
    let topics: Vec<&str> = d.topics.iter().map(|t| t.topic.as_str()).collect();
    assert_eq!(topics, ["__consumer_offsets", "v2"]);

    let (code, p1) = end_v2(&mut raw, "tv2", p0, true).await;
    assert_eq!((code, p1), (0, (p0.0, p0.1 + 1)), "the epoch is bumped");
    eventually("the commit to complete", || async {
        (state_of(b.addr(), "tv2").await == "CompleteCommit").then_some(())
    })
    .await;
    // A retried EndTxn carries the old epoch and gets the same answer.
    assert_eq!(end_v2(&mut raw, "tv2", p0, true).await, (0, p1));
    assert_eq!(
        end_v2(&mut raw, "tv2", p0, false).await.0,
        ResponseError::InvalidTxnState.code()
    );

    // A batch of the committed transaction arriving late is fenced, in a
    // partition the transaction wrote to (by the marker's epoch) and in one
    // it never reached (by the coordinator).
    assert_eq!(
        produce_at(&mut raw, "tv2", ("v2", 0), p0, 1, "late", 12).await,
        fenced
    );
    assert_eq!(
        produce_at(&mut raw, "tv2", ("v2-other", 0), p0, 0, "late", 12).await,
        fenced
    );

    // The next transaction starts at the new epoch, from sequence 0.
    assert_eq!(
        produce_at(&mut raw, "tv2", ("v2", 0), p1, 0, "b", 12).await,
        0
    );
    let (code, p2) = end_v2(&mut raw, "tv2", p1, false).await;
    assert_eq!((code, p2), (0, (p0.0, p0.1 + 2)));
    eventually("the abort to complete", || async {
        (state_of(b.addr(), "tv2").await == "CompleteAbort").then_some(())
    })
    .await;
    let pid = p0.0;
    assert_eq!(
        records(&mut raw, "v2").await,
        vec![
            (false, pid, "a".to_string()),
            (true, pid, "COMMIT".to_string()),
            (false, pid, "b".to_string()),
            (true, pid, "ABORT".to_string()),
        ]
    );
    assert!(records(&mut raw, "v2-other").await.is_empty());
    let fetch = OffsetFetchRequest::default()
        .with_group_id(str_bytes("g").into())
        .with_topics(Some(vec![
            offset_fetch_request::OffsetFetchRequestTopic::default()
                .with_name(topic_name("v2"))
                .with_partition_indexes(vec![0]),
        ]));
    let r: OffsetFetchResponse = raw.call(ApiKey::OffsetFetch, 7, &fetch).await;
    assert_eq!(r.topics[0].partitions[0].committed_offset, 7);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_transactions_v2_pipelined_batches_keep_their_order_while_their_partition_joins() {
    // A broker whose acks=all writes wait ~20 ms for the store: each batch
    // appended after the join waits that long for its answer, and batches
    // sent meanwhile find the partition's transaction open while earlier
    // ones are still queued.
    let settings = common::cluster::Settings {
        extra: vec!["--store-latency-ms".into(), "20,40".into()],
        ..Default::default()
    };
    let Some(cluster) = common::cluster::Cluster::start_with(&[1], settings).await else {
        return;
    };
    let addr: std::net::SocketAddr = cluster.bootstrap_of(1).parse().unwrap();
    let mut raw = Raw::connect(addr).await;
    create_topic(&cluster.bootstrap(), "v2-pipe", 1).await;
    common::cluster::wait_for_leaders(&cluster.bootstrap(), "v2-pipe", 1, |l| l.len() == 1).await;
    let bootstrap = cluster.bootstrap();
    eventually("a transaction coordinator", || coordinator_port(&bootstrap)).await;
    eventually("the partition to take writes", || async move {
        let mut warm = Raw::connect(addr).await;
        let batch = common::batch(&[b"warm"], -1, -1, -1);
        (warm.produce_result("v2-pipe", 0, batch).await.0 == 0).then_some(())
    })
    .await;
    let i = init(&mut raw, "pipe", 60_000, 5).await;
    let mut producer = (i.producer_id.0, i.producer_epoch);
    let mut want = vec![(false, -1, "warm".to_string())];
    for txn in 0..5 {
        // As a producer with requests in flight sends them: without waiting
        // for answers, a little apart. The first one joins the partition
        // to the transaction; the others must be appended after it, in
        // order, also those arriving once it is appended.
        for seq in 0..20 {
            let value = format!("{txn}-{seq}");
            let req = txn_produce_request("pipe", ("v2-pipe", 0), producer, seq, &value);
            raw.send(ApiKey::Produce, 12, &req).await;
            want.push((false, producer.0, value));
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        for seq in 0..20 {
            let r: ProduceResponse = raw.receive(ApiKey::Produce, 12).await.unwrap();
            let code = r.responses[0].partition_responses[0].error_code;
            assert_eq!(code, 0, "transaction {txn} batch {seq}");
        }
        let (code, next) = end_v2(&mut raw, "pipe", producer, true).await;
        assert_eq!(code, 0);
        producer = next;
        want.push((true, producer.0, "COMMIT".to_string()));
    }
    eventually("the last commit to complete", || async {
        (state_of(addr, "pipe").await == "CompleteCommit").then_some(())
    })
    .await;
    assert_eq!(records(&mut raw, "v2-pipe").await, want);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_requests_get_kafkas_error_codes() {
    let b = InProcess::start(&["--transaction-max-timeout-ms", "60000"]).await;
    create_topic(&b.bootstrap(), "t", 1).await;
    let mut raw = Raw::connect(b.addr()).await;
    // FindCoordinator for a transactional id names this broker.
    let found: FindCoordinatorResponse = raw
        .call(
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(1)
                .with_coordinator_keys(vec![str_bytes("tx")]),
        )
        .await;
    assert_eq!(found.coordinators[0].error_code, 0);
    assert_eq!(found.coordinators[0].port, b.addr().port() as i32);
    let r = init(&mut raw, "tx", 60_001, 4).await;
    assert_eq!(
        r.error_code,
        ResponseError::InvalidTransactionTimeout.code()
    );
    assert_eq!(r.producer_id.0, -1);
    let r = init(&mut raw, "tx", 60_000, 4).await;
    assert_eq!((r.error_code, r.producer_epoch), (0, 0));
    let pid = r.producer_id.0;
    // Nothing added yet: EndTxn has nothing to end.
    assert_eq!(
        end(&mut raw, "tx", (pid, 0), true, 3).await,
        ResponseError::InvalidTxnState.code()
    );
    assert_eq!(
        end(&mut raw, "tx", (pid + 1, 0), true, 3).await,
        ResponseError::InvalidProducerIdMapping.code()
    );
    assert_eq!(
        add_partitions(&mut raw, "tx", (pid, 0), "missing", vec![0], 3).await,
        ResponseError::UnknownTopicOrPartition.code()
    );
    assert_eq!(
        add_partitions(&mut raw, "tx", (pid, 0), "t", vec![0], 3).await,
        0
    );
    // A second session fences the first: its open transaction is aborted
    // first, and until then the new producer is told to retry.
    let r = init(&mut raw, "tx", 60_000, 4).await;
    assert_eq!(r.error_code, ResponseError::ConcurrentTransactions.code());
    let addr = b.addr();
    let r = eventually("the fencing abort to complete", || async move {
        let mut raw = Raw::connect(addr).await;
        let r = init(&mut raw, "tx", 60_000, 4).await;
        (r.error_code == 0).then_some(r)
    })
    .await;
    assert_eq!((r.producer_id.0, r.producer_epoch), (pid, 2));
    assert_eq!(
        add_partitions(&mut raw, "tx", (pid, 0), "t", vec![0], 3).await,
        ResponseError::ProducerFenced.code()
    );
    // Clients from before KIP-588 are told INVALID_PRODUCER_EPOCH instead.
    assert_eq!(
        add_partitions(&mut raw, "tx", (pid, 0), "t", vec![0], 1).await,
        ResponseError::InvalidProducerEpoch.code()
    );
    assert_eq!(
        end(&mut raw, "tx", (pid, 1), true, 1).await,
        ResponseError::InvalidProducerEpoch.code()
    );
    assert_eq!(
        describe(&mut raw, "unknown").await.error_code,
        ResponseError::TransactionalIdNotFound.code()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_producer_that_vanishes_mid_transaction_is_aborted_after_its_timeout() {
    let b = InProcess::start(&[
        "--transaction-abort-timed-out-transaction-cleanup-interval-ms",
        "100",
    ])
    .await;
    create_topic(&b.bootstrap(), "t", 1).await;
    let mut raw = Raw::connect(b.addr()).await;
    let r = init(&mut raw, "gone", 1_000, 4).await;
    let producer = (r.producer_id.0, r.producer_epoch);
    assert_eq!(
        add_partitions(&mut raw, "gone", producer, "t", vec![0], 3).await,
        0
    );
    produce(&mut raw, "gone", "t", producer, 0, "never committed").await;
    let addr = b.addr();
    eventually("the timed-out transaction to be aborted", || async move {
        (state_of(addr, "gone").await == "CompleteAbort").then_some(())
    })
    .await;
    let d = describe(&mut raw, "gone").await;
    assert_eq!(
        d.producer_epoch, 1,
        "the abort fences the vanished producer"
    );
    assert_eq!(
        records(&mut raw, "t").await,
        vec![
            (false, producer.0, "never committed".to_string()),
            (true, producer.0, "ABORT".to_string())
        ]
    );
    assert_eq!(
        end(&mut raw, "gone", producer, true, 3).await,
        ResponseError::ProducerFenced.code()
    );
}

/// Reads `__transaction_state` as Kafka's tools would: TransactionLogKey v0
/// and TransactionLogValue v0, decoded here by hand from Kafka's schema.
async fn transaction_log(raw: &mut Raw) -> Vec<(String, i64, i16, i8)> {
    let req = FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(TopicName(str_bytes("__transaction_state")))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(0)
                .with_fetch_offset(0)
                .with_partition_max_bytes(1 << 20)])]);
    let resp: FetchResponse = raw.call(ApiKey::Fetch, 12, &req).await;
    let mut data = resp.responses[0].partitions[0]
        .records
        .clone()
        .unwrap_or_default();
    let mut out = Vec::new();
    for set in RecordBatchDecoder::decode_all(&mut data).unwrap() {
        for r in set.records {
            let k = r.key.unwrap();
            assert_eq!(i16::from_be_bytes([k[0], k[1]]), 0, "key version");
            let len = i16::from_be_bytes([k[2], k[3]]) as usize;
            let id = String::from_utf8(k[4..4 + len].to_vec()).unwrap();
            let v = r.value.unwrap();
            assert_eq!(i16::from_be_bytes([v[0], v[1]]), 0, "value version");
            let pid = i64::from_be_bytes(v[2..10].try_into().unwrap());
            let epoch = i16::from_be_bytes([v[10], v[11]]);
            let status = v[16] as i8;
            out.push((id, pid, epoch, status));
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_killed_after_answering_end_txn_writes_the_markers_when_it_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let broker = Process::start(dir.path(), port, &["--txn-marker-delay-ms", "600000"]);
    let addr: std::net::SocketAddr = broker.bootstrap().parse().unwrap();
    create_topic(&broker.bootstrap(), "t", 1).await;
    let mut raw = Raw::connect(addr).await;
    let r = init(&mut raw, "crashy", 60_000, 4).await;
    let producer = (r.producer_id.0, r.producer_epoch);
    assert_eq!(
        add_partitions(&mut raw, "crashy", producer, "t", vec![0], 3).await,
        0
    );
    produce(
        &mut raw,
        "crashy",
        "t",
        producer,
        0,
        "committed before the crash",
    )
    .await;
    assert_eq!(end(&mut raw, "crashy", producer, true, 3).await, 0);
    // Answered, so PrepareCommit is durable; the markers are held back.
    assert_eq!(
        describe(&mut raw, "crashy")
            .await
            .transaction_state
            .as_str(),
        "PrepareCommit"
    );
    assert_eq!(records(&mut raw, "t").await.len(), 1, "no marker yet");
    drop(raw);
    broker.kill9();
    let broker = Process::start(dir.path(), port, &[]);
    eventually("the restarted coordinator to finish the commit", || async {
        (state_of(addr, "crashy").await == "CompleteCommit").then_some(())
    })
    .await;
    let mut raw = Raw::connect(addr).await;
    assert_eq!(
        records(&mut raw, "t").await,
        vec![
            (false, producer.0, "committed before the crash".to_string()),
            (true, producer.0, "COMMIT".to_string())
        ]
    );
    // Every state change is in the topic, in Kafka's format:
    // Empty (0), Ongoing (1), PrepareCommit (2), CompleteCommit (4).
    let log = transaction_log(&mut raw).await;
    let statuses: Vec<i8> = log.iter().map(|(_, _, _, st)| *st).collect();
    assert_eq!(statuses, vec![0, 1, 2, 4]);
    assert!(log
        .iter()
        .all(|(id, pid, epoch, _)| id == "crashy" && (*pid, *epoch) == producer));
    drop(broker);
}

/// The port of the transaction coordinator FindCoordinator names (asking `via`).
async fn coordinator_port(via: &str) -> Option<u16> {
    let mut raw = Raw::connect(via.parse().unwrap()).await;
    let found: FindCoordinatorResponse = raw
        .call(
            ApiKey::FindCoordinator,
            4,
            &FindCoordinatorRequest::default()
                .with_key_type(1)
                .with_coordinator_keys(vec![str_bytes("spread")]),
        )
        .await;
    let c = &found.coordinators[0];
    (c.error_code == 0).then_some(c.port as u16)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_markers_reach_every_leader_and_a_new_coordinator_finishes_what_the_old_one_prepared(
) {
    let settings = common::cluster::Settings {
        extra: vec!["--txn-marker-delay-ms".into(), "1500".into()],
        ..Default::default()
    };
    let Some(mut cluster) = common::cluster::Cluster::start_with(&[1, 2, 3], settings).await else {
        return;
    };
    let bootstrap = cluster.bootstrap();
    clients::create_topic(&bootstrap, "spread", 3, &[]).await;
    let leaders = common::cluster::wait_for_leaders(&bootstrap, "spread", 3, |l| {
        // Spread over the brokers, so that markers go to other brokers.
        l.len() == 3 && l.values().collect::<BTreeSet<_>>().len() >= 2
    })
    .await;
    let node_of_port = |cluster: &common::cluster::Cluster, port: u16| {
        cluster
            .running()
            .into_iter()
            .find(|n| cluster.port(*n) == port)
            .unwrap()
    };
    let first = bootstrap.split(',').next().unwrap().to_string();
    let port = eventually("a transaction coordinator", || coordinator_port(&first)).await;
    let coordinator = node_of_port(&cluster, port);
    let addr_of = |cluster: &common::cluster::Cluster, node: i32| -> std::net::SocketAddr {
        cluster.bootstrap_of(node).parse().unwrap()
    };
    // Two transactions over all three partitions, whatever their leaders:
    // the first on transactions v2 (each leader has the coordinator add its
    // partition, the markers bump the epoch) completes normally; the second,
    // on v1, is prepared and then its coordinator is killed before any
    // marker is written.
    let mut raw = Raw::connect(addr_of(&cluster, coordinator)).await;
    let r = init(&mut raw, "spread", 60_000, 4).await;
    assert_eq!(r.error_code, 0);
    let mut producer = (r.producer_id.0, r.producer_epoch);
    for (round, commit) in [(0, true), (1, false)] {
        let v2 = round == 0;
        if !v2 {
            assert_eq!(
                add_partitions(&mut raw, "spread", producer, "spread", vec![0, 1, 2], 3).await,
                0
            );
        }
        for (partition, leader) in &leaders {
            let mut to_leader = Raw::connect(addr_of(&cluster, *leader)).await;
            let value = format!("round {round} partition {partition}");
            let version = if v2 { 12 } else { 9 };
            let code = produce_at(
                &mut to_leader,
                "spread",
                ("spread", *partition),
                producer,
                0,
                &value,
                version,
            )
            .await;
            assert_eq!(code, 0, "round {round} partition {partition} at {leader}");
        }
        if v2 {
            let (code, next) = end_v2(&mut raw, "spread", producer, commit).await;
            assert_eq!((code, next), (0, (producer.0, producer.1 + 1)));
            producer = next;
        } else {
            assert_eq!(end(&mut raw, "spread", producer, commit, 3).await, 0);
        }
        if round == 0 {
            let addr = addr_of(&cluster, coordinator);
            eventually("the first transaction to complete", || async move {
                (state_of(addr, "spread").await == "CompleteCommit").then_some(())
            })
            .await;
        }
    }
    drop(raw);
    cluster.kill9(coordinator);
    // The partition of __transaction_state moves; its new leader replays the
    // PrepareAbort and writes the markers the dead coordinator never sent.
    let state_at = |cluster: &common::cluster::Cluster| {
        let addrs: Vec<std::net::SocketAddr> = cluster
            .running()
            .iter()
            .map(|n| addr_of(cluster, *n))
            .collect();
        async move {
            for a in addrs {
                let mut raw = Raw::connect(a).await;
                let d = describe(&mut raw, "spread").await;
                if d.error_code == 0 {
                    return Some(d.transaction_state.to_string());
                }
            }
            None
        }
    };
    let deadline = Instant::now() + TIMEOUT;
    loop {
        if state_at(&cluster).await.as_deref() == Some("CompleteAbort") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the new coordinator did not finish the abort"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every partition, wherever it is led now, holds both rounds and their markers.
    let survivors = cluster.bootstrap();
    let leaders = common::cluster::wait_for_leaders(&survivors, "spread", 3, |l| {
        l.len() == 3 && l.values().all(|n| *n != coordinator)
    })
    .await;
    for (partition, leader) in leaders {
        let mut raw = Raw::connect(addr_of(&cluster, leader)).await;
        let got = records_of(&mut raw, "spread", partition).await;
        let want = vec![
            (false, producer.0, format!("round 0 partition {partition}")),
            (true, producer.0, "COMMIT".to_string()),
            (false, producer.0, format!("round 1 partition {partition}")),
            (true, producer.0, "ABORT".to_string()),
        ];
        assert_eq!(got, want, "partition {partition}");
    }
}
