//! librdkafka (the `rdkafka` crate) as the tests drive it: clients from a
//! bootstrap address or from a prepared `ClientConfig` (a secured one),
//! topics created through the admin client, and the produce, assign and
//! poll loops more than one test file needs.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::message::BorrowedMessage;
use rdkafka::producer::{
    BaseRecord, DefaultProducerContext, FutureProducer, FutureRecord, Producer, ThreadedProducer,
};
use rdkafka::{Message, Offset, TopicPartitionList};

/// A producer whose transactions the test drives.
pub type TxnProducer = ThreadedProducer<DefaultProducerContext>;

/// `bootstrap.servers` and then `settings`, in order.
pub fn client(bootstrap: &str, settings: &[(&str, &str)]) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap);
    for (k, v) in settings {
        c.set(*k, *v);
    }
    c
}

pub fn admin(bootstrap: &str) -> AdminClient<DefaultClientContext> {
    client(bootstrap, &[]).create().unwrap()
}

/// A producer with `settings` (acks, linger.ms, ... as the test needs them).
pub fn producer(bootstrap: &str, settings: &[(&str, &str)]) -> FutureProducer {
    client(bootstrap, settings).create().unwrap()
}

/// A consumer that reads by assignment and commits nothing on its own (its
/// group id is not used for a subscription), with `settings`.
pub fn reader(bootstrap: &str, settings: &[(&str, &str)]) -> BaseConsumer {
    reader_with(&client(bootstrap, settings))
}

/// `reader` on a prepared client configuration.
pub fn reader_with(client: &ClientConfig) -> BaseConsumer {
    client
        .clone()
        .set("group.id", "unused")
        .set("enable.auto.commit", "false")
        .create()
        .unwrap()
}

/// Creates `name` with `partitions` and topic `configs`.
pub async fn create_topic(bootstrap: &str, name: &str, partitions: i32, configs: &[(&str, &str)]) {
    create_topic_with(&client(bootstrap, &[]), name, partitions, configs).await
}

/// `create_topic` through a prepared client configuration.
pub async fn create_topic_with(
    client: &ClientConfig,
    name: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) {
    let admin: AdminClient<DefaultClientContext> = client.create().unwrap();
    let mut topic = NewTopic::new(name, partitions, TopicReplication::Fixed(1));
    for (k, v) in configs {
        topic = topic.set(k, v);
    }
    let created = admin
        .create_topics(&[topic], &AdminOptions::new())
        .await
        .unwrap();
    assert!(created[0].is_ok(), "create {name}: {created:?}");
}

/// Leader node of each partition of `topic`, once every one has a leader.
pub fn leaders_with(
    client: &ClientConfig,
    topic: &str,
    partitions: i32,
) -> Option<BTreeMap<i32, i32>> {
    let md = reader_with(client)
        .fetch_metadata(Some(topic), Duration::from_secs(5))
        .ok()?;
    let t = md.topics().iter().find(|t| t.name() == topic)?;
    let leaders: BTreeMap<i32, i32> = t
        .partitions()
        .iter()
        .filter(|p| p.error().is_none() && p.leader() >= 0)
        .map(|p| (p.id(), p.leader()))
        .collect();
    (leaders.len() == partitions as usize).then_some(leaders)
}

/// Assigns partitions `0..partitions` of `topic`, each from `offset`.
pub fn assign<C: ConsumerContext>(
    c: &BaseConsumer<C>,
    topic: &str,
    partitions: i32,
    offset: Offset,
) {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, offset).unwrap();
    }
    c.assign(&tpl).unwrap();
}

/// Sends `k{i}`/`v{i}` for every `i` of `range` to `topic` (the partitioner
/// picks the partition), all at once; panics on any failed delivery.
pub async fn produce_numbered(
    p: &FutureProducer,
    topic: &str,
    range: std::ops::Range<usize>,
    timeout: Duration,
) {
    let sends: Vec<_> = range
        .map(|i| {
            let p = p.clone();
            async move {
                let key = format!("k{i}");
                let value = format!("v{i}");
                p.send(FutureRecord::to(topic).key(&key).payload(&value), timeout)
                    .await
                    .unwrap();
            }
        })
        .collect();
    futures::future::join_all(sends).await;
}

/// The values `v{i}` of `produce_numbered` for `range`.
pub fn numbered_values(range: std::ops::Range<usize>) -> BTreeSet<String> {
    range.map(|i| format!("v{i}")).collect()
}

/// Polls every member until `want` distinct values arrived in `seen`,
/// committing each record (errors while a broker restarts are skipped);
/// returns how many each member read.
pub fn consume_committing<C: ConsumerContext>(
    members: &[&BaseConsumer<C>],
    want: usize,
    seen: &mut BTreeSet<String>,
    timeout: Duration,
) -> Vec<usize> {
    let mut per = vec![0; members.len()];
    let deadline = Instant::now() + timeout;
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

/// How many partitions the member is assigned.
pub fn assigned<C: ConsumerContext>(m: &BaseConsumer<C>) -> usize {
    m.assignment().map(|a| a.count()).unwrap_or(0)
}

/// A transactional producer (`transactional.id` and then `settings`), its
/// transactions initialised.
pub fn transactional_producer(
    bootstrap: &str,
    transactional_id: &str,
    settings: &[(&str, &str)],
    timeout: Duration,
) -> TxnProducer {
    let mut c = client(bootstrap, &[("transactional.id", transactional_id)]);
    for (k, v) in settings {
        c.set(*k, *v);
    }
    let p: TxnProducer = c.create().unwrap();
    p.init_transactions(timeout).expect("init_transactions");
    p
}

/// Enqueues `value` for `partition` of `topic`.
pub fn send(p: &TxnProducer, topic: &str, partition: i32, value: &str) {
    p.send(
        BaseRecord::<(), str>::to(topic)
            .partition(partition)
            .payload(value),
    )
    .map_err(|(e, _)| e)
    .expect("enqueue");
}

/// Assigns `partition` of `topic` from `offset` and polls until `count`
/// records arrived (panics after `timeout`); `each` maps a record.
pub fn read_partition<T>(
    c: &BaseConsumer,
    topic: &str,
    partition: i32,
    offset: Offset,
    count: usize,
    timeout: Duration,
    each: impl Fn(&BorrowedMessage<'_>) -> T,
) -> Vec<T> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, offset).unwrap();
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + timeout;
    let mut out = Vec::new();
    while out.len() < count {
        assert!(
            Instant::now() < deadline,
            "only {} of {count} records arrived",
            out.len()
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            out.push(each(&m.unwrap()));
        }
    }
    out
}

/// The value of a record as text.
pub fn text(m: &BorrowedMessage<'_>) -> String {
    String::from_utf8(m.payload().unwrap().to_vec()).unwrap()
}

/// The sum of the offsets the member's group committed for partitions
/// `0..partitions` of `topic`.
pub fn committed_total<C: ConsumerContext>(
    m: &BaseConsumer<C>,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> i64 {
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Invalid).unwrap();
    }
    let committed = m.committed_offsets(tpl, timeout).unwrap();
    committed
        .elements()
        .iter()
        .map(|e| e.offset().to_raw().unwrap())
        .sum()
}

/// The high watermark of each partition `0..partitions` of `topic`, as the
/// reader `c` sees it (read_committed readers see the same).
pub fn high_watermarks(
    c: &BaseConsumer,
    topic: &str,
    partitions: i32,
    timeout: Duration,
) -> BTreeMap<i32, i64> {
    (0..partitions)
        .map(|p| (p, c.fetch_watermarks(topic, p, timeout).unwrap().1))
        .collect()
}
