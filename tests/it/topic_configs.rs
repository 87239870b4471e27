//! Kafka's topic configs end to end: librdkafka's admin client creates a
//! topic with every one of them, describes and alters them; the raw protocol
//! checks what librdkafka does not expose (synonyms, types, documentation,
//! IncrementalAlterConfigs, KIP-467 record errors); and the configs that
//! change behaviour are observed through a real producer and a fetch.

use crate::common;

use std::collections::HashMap;
use std::time::Duration;

use crate::common::now_ms;
use bytes::Bytes;
use common::clients;
use common::{str_bytes, InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResourceResult;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::*;
use kafka_protocol::records::Compression;
use rdkafka::admin::{AdminOptions, ConfigSource, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::consumer::Consumer;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::Offset;
use strata::format::batch::{encode_batch, BatchHeader, CODEC_MASK};

const TIMEOUT: Duration = Duration::from_secs(20);
const RESOURCE_TOPIC: i8 = 2;
const SOURCE_TOPIC: i8 = 1;
const SOURCE_DEFAULT: i8 = 5;

/// Every topic config of Kafka 4.4, each at a valid value other than its default.
const EVERY_CONFIG: &[(&str, &str)] = &[
    ("cleanup.policy", "compact,delete"),
    ("compression.gzip.level", "5"),
    ("compression.lz4.level", "3"),
    ("compression.type", "zstd"),
    ("compression.zstd.level", "10"),
    ("delete.retention.ms", "1000"),
    ("errors.deadletterqueue.group.enable", "true"),
    ("file.delete.delay.ms", "1000"),
    ("flush.messages", "1000"),
    ("flush.ms", "5000"),
    ("follower.replication.throttled.replicas", "0:1"),
    ("index.interval.bytes", "1024"),
    ("leader.replication.throttled.replicas", "*"),
    ("local.retention.bytes", "1000000"),
    ("local.retention.ms", "60000"),
    ("max.compaction.lag.ms", "86400000"),
    ("max.decompressed.message.bytes", "10485760"),
    ("max.message.bytes", "2000000"),
    ("message.timestamp.after.max.ms", "60000"),
    ("message.timestamp.before.max.ms", "86400000"),
    ("message.timestamp.type", "LogAppendTime"),
    ("message.downconversion.enable", "false"),
    ("min.cleanable.dirty.ratio", "0.25"),
    ("min.compaction.lag.ms", "100"),
    ("min.insync.replicas", "2"),
    ("preallocate", "true"),
    ("remote.copy.lag.bytes", "1048576"),
    ("remote.copy.lag.ms", "60000"),
    ("remote.log.copy.disable", "true"),
    ("remote.log.delete.on.disable", "true"),
    ("remote.storage.enable", "true"),
    ("retention.bytes", "100000000"),
    ("retention.ms", "3600000"),
    ("segment.bytes", "2097152"),
    ("segment.index.bytes", "1048576"),
    ("segment.jitter.ms", "1000"),
    ("segment.ms", "3600000"),
    ("unclean.leader.election.enable", "true"),
];

fn producer(bootstrap: &str, extra: &[(&str, &str)]) -> FutureProducer {
    clients::producer(
        bootstrap,
        &[&[("acks", "all"), ("linger.ms", "20")], extra].concat(),
    )
}

fn topic<'a>(name: &str, configs: &[(&'a str, &'a str)]) -> NewTopic<'a> {
    let mut t = NewTopic::new(
        Box::leak(name.to_string().into_boxed_str()),
        1,
        TopicReplication::Fixed(1),
    );
    for (k, v) in configs {
        t = t.set(k, v);
    }
    t
}

async fn create(bootstrap: &str, name: &str, configs: &[(&str, &str)]) {
    clients::create_topic(bootstrap, name, 1, configs).await
}

/// DescribeConfigs v4 with synonyms and documentation, by config name.
async fn describe_raw(
    raw: &mut Raw,
    topic: &str,
) -> HashMap<String, DescribeConfigsResourceResult> {
    let req = DescribeConfigsRequest::default()
        .with_include_synonyms(true)
        .with_include_documentation(true)
        .with_resources(vec![DescribeConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(str_bytes(topic))]);
    let resp: DescribeConfigsResponse = raw.call(ApiKey::DescribeConfigs, 4, &req).await;
    assert_eq!(resp.results[0].error_code, 0);
    resp.results[0]
        .configs
        .iter()
        .map(|c| (c.name.to_string(), c.clone()))
        .collect()
}

fn synonyms(c: &DescribeConfigsResourceResult) -> Vec<(String, String, i8)> {
    c.synonyms
        .iter()
        .map(|s| {
            (
                s.name.to_string(),
                s.value.as_deref().unwrap_or_default().to_string(),
                s.source,
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kafka_topic_config_is_accepted_and_described() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    create(&bs, "all", EVERY_CONFIG).await;

    let described = clients::admin(&bs)
        .describe_configs(&[ResourceSpecifier::Topic("all")], &AdminOptions::new())
        .await
        .unwrap();
    let resource = described.into_iter().next().unwrap().unwrap();
    let entries: HashMap<_, _> = resource
        .entries
        .iter()
        .map(|e| (e.name.as_str(), e))
        .collect();
    for (k, v) in EVERY_CONFIG {
        let e = entries
            .get(k)
            .unwrap_or_else(|| panic!("{k} not described"));
        assert_eq!(e.value.as_deref(), Some(*v), "{k}");
        assert_eq!(e.source, ConfigSource::DynamicTopic, "{k}");
        assert!(!e.is_default, "{k}");
    }
    let fanout = entries["strata.compaction.fanout"];
    assert_eq!(fanout.source, ConfigSource::Default);
    assert_eq!(fanout.value.as_deref(), Some("4"));
    assert_eq!(entries.len(), EVERY_CONFIG.len() + 3);

    // Synonyms: the override, then the broker default under Kafka's broker name.
    let mut raw = Raw::connect(broker.addr()).await;
    let c = describe_raw(&mut raw, "all").await;
    assert_eq!(
        synonyms(&c["retention.ms"]),
        vec![
            ("retention.ms".into(), "3600000".into(), SOURCE_TOPIC),
            (
                "log.retention.ms".into(),
                "604800000".into(),
                SOURCE_DEFAULT
            )
        ]
    );
    let ratio = &c["min.cleanable.dirty.ratio"];
    assert_eq!(ratio.config_type, 6); // DOUBLE
    assert_eq!(
        ratio.synonyms[1].name.as_str(),
        "log.cleaner.min.cleanable.ratio"
    );
    assert_eq!(c["preallocate"].config_type, 1); // BOOLEAN
    assert_eq!(c["cleanup.policy"].config_type, 7); // LIST
    assert_eq!(c["segment.bytes"].config_type, 3); // INT
    assert_eq!(c["compression.type"].config_type, 2); // STRING
    assert_eq!(
        synonyms(&c["compression.type"])[1],
        ("compression.type".into(), "producer".into(), SOURCE_DEFAULT)
    );
    // No broker-wide synonym for the throttles, as in Kafka.
    assert_eq!(
        synonyms(&c["leader.replication.throttled.replicas"]),
        vec![(
            "leader.replication.throttled.replicas".into(),
            "*".into(),
            SOURCE_TOPIC
        )]
    );
    assert!(c
        .values()
        .all(|e| e.documentation.as_ref().is_some_and(|d| !d.is_empty())));

    // A default topic: every value is Kafka's default, from DEFAULT_CONFIG.
    create(&bs, "plain", &[]).await;
    let c = describe_raw(&mut raw, "plain").await;
    let value = |k: &str| c[k].value.as_deref().unwrap().to_string();
    assert_eq!(value("message.timestamp.after.max.ms"), "3600000");
    assert_eq!(value("compression.type"), "producer");
    assert_eq!(value("local.retention.ms"), "-2");
    assert!(c.values().all(|e| e.config_source == SOURCE_DEFAULT));
    assert_eq!(
        synonyms(&c["segment.jitter.ms"]),
        vec![("log.roll.jitter.ms".into(), "0".into(), SOURCE_DEFAULT)]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_values_are_refused_with_invalid_config() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    let bad: &[(&str, &str)] = &[
        ("compression.type", "brotli"),
        ("compression.gzip.level", "0"),
        ("compression.lz4.level", "18"),
        ("compression.zstd.level", "23"),
        ("min.cleanable.dirty.ratio", "1.01"),
        ("min.cleanable.dirty.ratio", "half"),
        ("preallocate", "yes"),
        ("flush.messages", "0"),
        ("flush.ms", "-1"),
        ("index.interval.bytes", "-1"),
        ("segment.index.bytes", "3"),
        ("segment.jitter.ms", "-5"),
        ("local.retention.ms", "-3"),
        ("message.timestamp.before.max.ms", "-1"),
        ("message.timestamp.after.max.ms", "soon"),
        ("max.compaction.lag.ms", "0"),
        ("leader.replication.throttled.replicas", "0-1"),
        ("unclean.leader.election.enable", "1"),
        ("message.downconversion.enable", "sometimes"),
        ("message.format.version", "3.0"),
    ];
    let topics: Vec<NewTopic> = bad
        .iter()
        .enumerate()
        .map(|(i, (k, v))| topic(&format!("bad{i}"), &[(k, v)]))
        .collect();
    let res = clients::admin(&bs)
        .create_topics(&topics, &AdminOptions::new())
        .await
        .unwrap();
    for ((k, v), r) in bad.iter().zip(res) {
        assert_eq!(
            r.map_err(|(_, code)| code),
            Err(RDKafkaErrorCode::InvalidConfig),
            "{k}={v}"
        );
    }
    // Checked together, as Kafka's LogConfig does.
    let res = clients::admin(&bs)
        .create_topics(
            &[topic(
                "lags",
                &[
                    ("min.compaction.lag.ms", "100"),
                    ("max.compaction.lag.ms", "10"),
                ],
            )],
            &AdminOptions::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        res[0],
        Err(("lags".into(), RDKafkaErrorCode::InvalidConfig))
    );
    let md = clients::reader(&bs, &[])
        .fetch_metadata(None, TIMEOUT)
        .unwrap();
    assert!(md.topics().iter().all(|t| !t.name().starts_with("bad")));
}

async fn incremental(
    raw: &mut Raw,
    topic: &str,
    ops: &[(&str, i8, Option<&str>)],
) -> (i16, String) {
    let req = IncrementalAlterConfigsRequest::default().with_resources(vec![
        AlterConfigsResource::default()
            .with_resource_type(RESOURCE_TOPIC)
            .with_resource_name(str_bytes(topic))
            .with_configs(
                ops.iter()
                    .map(|(k, op, v)| {
                        AlterableConfig::default()
                            .with_name(str_bytes(k))
                            .with_config_operation(*op)
                            .with_value(v.map(str_bytes))
                    })
                    .collect(),
            ),
    ]);
    let resp: IncrementalAlterConfigsResponse =
        raw.call(ApiKey::IncrementalAlterConfigs, 1, &req).await;
    let r = &resp.responses[0];
    (
        r.error_code,
        r.error_message.as_deref().unwrap_or_default().to_string(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_alter_sets_deletes_appends_and_subtracts() {
    const SET: i8 = 0;
    const DELETE: i8 = 1;
    const APPEND: i8 = 2;
    const SUBTRACT: i8 = 3;
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    create(&broker.bootstrap(), "inc", &[("retention.ms", "5000")]).await;

    let ok = incremental(
        &mut raw,
        "inc",
        &[
            ("compression.type", SET, Some("lz4")),
            ("min.cleanable.dirty.ratio", SET, Some("0.9")),
            ("cleanup.policy", APPEND, Some("compact")),
            (
                "leader.replication.throttled.replicas",
                APPEND,
                Some("0:1,1:1"),
            ),
            ("retention.ms", DELETE, None),
        ],
    )
    .await;
    assert_eq!(ok.0, 0, "{}", ok.1);
    let c = describe_raw(&mut raw, "inc").await;
    let got = |k: &str| {
        (
            c[k].value.as_deref().unwrap().to_string(),
            c[k].config_source,
        )
    };
    assert_eq!(got("compression.type"), ("lz4".into(), SOURCE_TOPIC));
    assert_eq!(
        got("min.cleanable.dirty.ratio"),
        ("0.9".into(), SOURCE_TOPIC)
    );
    assert_eq!(
        got("cleanup.policy"),
        ("delete,compact".into(), SOURCE_TOPIC)
    );
    assert_eq!(
        got("leader.replication.throttled.replicas"),
        ("0:1,1:1".into(), SOURCE_TOPIC)
    );
    assert_eq!(got("retention.ms"), ("604800000".into(), SOURCE_DEFAULT));

    let ok = incremental(
        &mut raw,
        "inc",
        &[
            ("cleanup.policy", SUBTRACT, Some("delete")),
            (
                "leader.replication.throttled.replicas",
                SUBTRACT,
                Some("0:1"),
            ),
            ("compression.type", DELETE, None),
        ],
    )
    .await;
    assert_eq!(ok.0, 0, "{}", ok.1);
    let c = describe_raw(&mut raw, "inc").await;
    let got = |k: &str| {
        (
            c[k].value.as_deref().unwrap().to_string(),
            c[k].config_source,
        )
    };
    assert_eq!(got("cleanup.policy"), ("compact".into(), SOURCE_TOPIC));
    assert_eq!(
        got("leader.replication.throttled.replicas"),
        ("1:1".into(), SOURCE_TOPIC)
    );
    assert_eq!(got("compression.type"), ("producer".into(), SOURCE_DEFAULT));

    // APPEND to a non-list, or one bad value, changes nothing at all.
    let (code, msg) = incremental(
        &mut raw,
        "inc",
        &[
            ("segment.ms", SET, Some("1000")),
            ("compression.type", APPEND, Some("gzip")),
        ],
    )
    .await;
    assert_eq!(code, ResponseError::InvalidConfig.code());
    assert_eq!(
        msg,
        "Config value append is not allowed for config key: compression.type"
    );
    let (code, msg) = incremental(
        &mut raw,
        "inc",
        &[
            ("segment.ms", SET, Some("1000")),
            ("preallocate", SET, Some("maybe")),
        ],
    )
    .await;
    assert_eq!(code, ResponseError::InvalidConfig.code());
    assert_eq!(
        msg,
        "Invalid value maybe for configuration preallocate: Expected value to be either true or false"
    );
    let c = describe_raw(&mut raw, "inc").await;
    assert_eq!(c["segment.ms"].config_source, SOURCE_DEFAULT);
}

fn record_errors(p: &produce_response::PartitionProduceResponse) -> Vec<(i32, String)> {
    p.record_errors
        .iter()
        .map(|e| {
            (
                e.batch_index,
                e.batch_index_error_message
                    .as_deref()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timestamps_out_of_range_fail_the_batch_with_record_errors() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    create(&bs, "ts", &[("message.timestamp.before.max.ms", "3600000")]).await;
    let hour = 3_600_000;

    // librdkafka sees INVALID_TIMESTAMP for a record too old, and for one
    // too far ahead (message.timestamp.after.max.ms defaults to an hour).
    let p = producer(&bs, &[]);
    for ts in [now_ms() - 2 * hour, now_ms() + 2 * hour] {
        let err = p
            .send(
                FutureRecord::<(), _>::to("ts")
                    .partition(0)
                    .payload("x")
                    .timestamp(ts),
                TIMEOUT,
            )
            .await
            .unwrap_err()
            .0;
        assert_eq!(
            err,
            KafkaError::MessageProduction(RDKafkaErrorCode::InvalidTimestamp),
            "timestamp {ts}"
        );
    }
    let delivered = p
        .send(
            FutureRecord::<(), _>::to("ts")
                .partition(0)
                .payload("x")
                .timestamp(now_ms() - hour / 2),
            TIMEOUT,
        )
        .await
        .unwrap();
    assert_eq!((delivered.partition, delivered.offset), (0, 0));

    // The raw response names the bad records of the batch (KIP-467).
    let mut raw = Raw::connect(broker.addr()).await;
    let now = now_ms();
    let rec = |ts: i64| {
        (
            Some(Bytes::from_static(b"k")),
            Some(Bytes::from_static(b"v")),
            ts,
        )
    };
    let batch = encode_batch(
        vec![rec(now), rec(now - 2 * hour), rec(now), rec(now + 2 * hour)],
        None,
        Compression::Lz4,
    )
    .unwrap();
    let r = raw.produce("ts", 0, batch).await;
    assert_eq!(r.error_code, ResponseError::InvalidTimestamp.code());
    assert_eq!(
        r.error_message.as_deref(),
        Some("One or more records have been rejected due to invalid timestamp")
    );
    let errors = record_errors(&r);
    assert_eq!(errors.iter().map(|e| e.0).collect::<Vec<_>>(), vec![1, 3]);
    assert!(
        errors[0].1.starts_with(&format!(
            "Timestamp {} of message with offset 1 is out of range. The timestamp should be within [",
            now - 2 * hour
        )),
        "{}",
        errors[0].1
    );
    // Nothing of the batch was appended.
    let c = clients::reader(&bs, &[]);
    assert_eq!(c.fetch_watermarks("ts", 0, TIMEOUT).unwrap(), (0, 1));

    // LogAppendTime topics take any timestamp: the broker replaces it.
    create(
        &bs,
        "lat",
        &[
            ("message.timestamp.type", "LogAppendTime"),
            ("message.timestamp.before.max.ms", "0"),
        ],
    )
    .await;
    let batch = encode_batch(vec![rec(now - 10 * hour)], None, Compression::None).unwrap();
    assert_eq!(raw.produce("lat", 0, batch).await.error_code, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyless_records_of_a_compacted_topic_are_named() {
    let broker = InProcess::start(&[]).await;
    create(&broker.bootstrap(), "kc", &[("cleanup.policy", "compact")]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let now = now_ms();
    let keyed = (
        Some(Bytes::from_static(b"k")),
        Some(Bytes::from_static(b"v")),
        now,
    );
    let keyless = (None, Some(Bytes::from_static(b"v")), now);
    let batch = encode_batch(
        vec![keyed.clone(), keyless.clone(), keyed, keyless],
        None,
        Compression::Gzip,
    )
    .unwrap();
    let r = raw.produce("kc", 0, batch).await;
    assert_eq!(r.error_code, ResponseError::InvalidRecord.code());
    let message = "Compacted topic cannot accept message without key in topic partition kc-0.";
    assert_eq!(
        record_errors(&r),
        vec![(1, message.to_string()), (3, message.to_string())]
    );
    assert!(r
        .error_message
        .as_deref()
        .unwrap()
        .starts_with("One or more records have been rejected due to 2 record errors in total"));
}

/// The codec of every batch fetched from offset 0 of partition 0.
async fn stored_codecs(raw: &mut Raw, topic: &str) -> Vec<i16> {
    let records = raw
        .fetch(&common::fetch_request(topic, 0, 0))
        .await
        .records
        .unwrap();
    let mut codecs = Vec::new();
    let mut pos = 0;
    while let Some(h) = BatchHeader::parse(&records[pos..]).unwrap() {
        codecs.push(h.attributes & CODEC_MASK);
        pos += h.size;
    }
    codecs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compression_type_recompresses_to_the_topics_codec() {
    let broker = InProcess::start(&[]).await;
    let bs = broker.bootstrap();
    // (topic, its compression.type, the producer's codec, the stored codec)
    let cases = [
        ("z", "zstd", "none", 4),
        ("g", "gzip", "lz4", 1),
        ("u", "uncompressed", "gzip", 0),
        ("p", "producer", "lz4", 3),
    ];
    for (topic, codec, _, _) in cases {
        create(
            &bs,
            topic,
            &[("compression.type", codec), ("compression.gzip.level", "1")],
        )
        .await;
    }
    let mut raw = Raw::connect(broker.addr()).await;
    for (topic, _, producer_codec, stored) in cases {
        let p = producer(
            &bs,
            &[
                ("compression.type", producer_codec),
                ("enable.idempotence", "true"),
            ],
        );
        let sends: Vec<_> = (0..50)
            .map(|i| {
                let p = p.clone();
                async move {
                    let v = format!("value {i} of a record that compresses well");
                    let k = format!("k{i}");
                    p.send(
                        FutureRecord::to(topic).partition(0).key(&k).payload(&v),
                        TIMEOUT,
                    )
                    .await
                    .map(|_| ())
                    .map_err(|(e, _)| e)
                }
            })
            .collect();
        for r in futures::future::join_all(sends).await {
            r.unwrap();
        }
        let codecs = stored_codecs(&mut raw, topic).await;
        assert!(!codecs.is_empty());
        assert!(codecs.iter().all(|&c| c == stored), "{topic}: {codecs:?}");

        // Consumers read the recompressed batches back unchanged.
        let c = clients::reader(&bs, &[]);
        clients::assign(&c, topic, 1, Offset::Beginning);
        for i in 0..50 {
            let m = c.poll(TIMEOUT).unwrap().unwrap();
            assert_eq!(m.offset(), i);
            assert_eq!(m.key(), Some(format!("k{i}").as_bytes()));
            assert_eq!(
                m.payload(),
                Some(format!("value {i} of a record that compresses well").as_bytes())
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_message_bytes_applies_to_the_batch_as_sent() {
    let broker = InProcess::start(&[]).await;
    create(
        &broker.bootstrap(),
        "small",
        &[("compression.type", "zstd"), ("max.message.bytes", "600")],
    )
    .await;
    let mut raw = Raw::connect(broker.addr()).await;
    let record = |i: usize| {
        (
            Some(Bytes::from(format!("k{i}"))),
            Some(Bytes::from_static(&[b'x'; 100])),
            now_ms(),
        )
    };
    // Over the limit as sent, though zstd would shrink it far below: refused,
    // as Kafka checks the incoming batch before recompressing it.
    let big = encode_batch((0..10).map(record).collect(), None, Compression::None).unwrap();
    assert!(big.len() > 600);
    let r = raw.produce("small", 0, big).await;
    assert_eq!(r.error_code, ResponseError::MessageTooLarge.code());
    let fits = encode_batch((0..3).map(record).collect(), None, Compression::None).unwrap();
    assert!(fits.len() < 600);
    assert_eq!(raw.produce("small", 0, fits).await.error_code, 0);
    assert_eq!(stored_codecs(&mut raw, "small").await, vec![4]);
}

/// ListConfigResources of `types` at `version`: its error code and the
/// (name, type) pairs listed.
async fn list_config_resources(
    raw: &mut Raw,
    types: Vec<i8>,
    version: i16,
) -> (i16, Vec<(String, i8)>) {
    let req = ListConfigResourcesRequest::default().with_resource_types(types);
    let r: ListConfigResourcesResponse = raw.call(ApiKey::ListConfigResources, version, &req).await;
    let listed = r
        .config_resources
        .iter()
        .map(|c| (c.resource_name.to_string(), c.resource_type))
        .collect();
    (r.error_code, listed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_config_resources_names_every_topic_and_broker_and_refuses_broker_loggers() {
    const BROKER: i8 = 4;
    let broker = InProcess::start(&[]).await;
    create(&broker.bootstrap(), "listed-b", &[]).await;
    create(&broker.bootstrap(), "listed-a", &[]).await;
    let mut raw = Raw::connect(broker.addr()).await;

    let (code, all) = list_config_resources(&mut raw, vec![], 1).await;
    assert_eq!(code, 0);
    let topics: Vec<&str> = all
        .iter()
        .filter(|(_, t)| *t == RESOURCE_TOPIC)
        .map(|(n, _)| n.as_str())
        .filter(|n| n.starts_with("listed-"))
        .collect();
    assert_eq!(topics, ["listed-a", "listed-b"]);
    let brokers: Vec<&(String, i8)> = all.iter().filter(|(_, t)| *t == BROKER).collect();
    assert_eq!(brokers.len(), 1, "{all:?}");
    assert!(brokers[0].0.parse::<i32>().is_ok());

    let (code, only) = list_config_resources(&mut raw, vec![BROKER], 1).await;
    assert_eq!((code, only.len()), (0, 1));
    // Version 0 lists client metrics subscriptions, and there are none.
    assert_eq!(
        list_config_resources(&mut raw, vec![], 0).await,
        (0, vec![])
    );
    // Broker loggers have no configs here.
    let (code, _) = list_config_resources(&mut raw, vec![8], 1).await;
    assert_eq!(code, ResponseError::UnsupportedVersion.code());
}
