//! Shared test helpers: brokers started in-process or as the built binary,
//! and a minimal raw-protocol client for requests real clients never send.

#![allow(dead_code)]

pub mod clients;
pub mod cluster;
pub mod etcd;
pub mod scram;
pub mod sim;
pub mod tls;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use clap::Parser;
use kafka_protocol::messages::create_topics_request::{CreatableTopic, CreatableTopicConfig};
use kafka_protocol::messages::create_topics_response::CreatableTopicResult;
use kafka_protocol::messages::describe_configs_request::DescribeConfigsResource;
use kafka_protocol::messages::describe_configs_response::DescribeConfigsResult;
use kafka_protocol::messages::fetch_request::{FetchPartition, FetchTopic};
use kafka_protocol::messages::fetch_response::PartitionData;
use kafka_protocol::messages::incremental_alter_configs_request::{
    AlterConfigsResource, AlterableConfig,
};
use kafka_protocol::messages::produce_request::{PartitionProduceData, TopicProduceData};
use kafka_protocol::messages::produce_response::PartitionProduceResponse;
use kafka_protocol::messages::{
    ApiKey, CreateTopicsRequest, CreateTopicsResponse, DescribeConfigsRequest,
    DescribeConfigsResponse, FetchRequest, FetchResponse, IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResponse, ProduceRequest, ProduceResponse, RequestHeader,
    ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use strata::server::config::BrokerConfig;
use strata::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Topic configs for compaction tests: a compacted topic whose small
/// segments roll within 300 ms and are merged, two at a time, as soon as
/// they are sealed; tombstones are not kept.
pub const QUICK_COMPACTION: &[(&str, &str)] = &[
    ("cleanup.policy", "compact"),
    ("segment.bytes", "3000"),
    ("segment.ms", "300"),
    ("min.compaction.lag.ms", "0"),
    ("delete.retention.ms", "0"),
    ("strata.compaction.fanout", "2"),
];

#[derive(Parser)]
struct Args {
    #[command(flatten)]
    config: BrokerConfig,
}

pub fn config(data_dir: &Path, extra: &[&str]) -> BrokerConfig {
    let mut args = vec![
        "strata",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--log-level",
        "warn",
    ];
    args.extend_from_slice(extra);
    Args::parse_from(args).config
}

/// A broker running inside the test process.
pub struct InProcess {
    pub server: Server,
    pub dir: tempfile::TempDir,
}

impl InProcess {
    pub async fn start(extra: &[&str]) -> InProcess {
        let dir = tempfile::tempdir().unwrap();
        let server = Server::start(config(dir.path(), extra)).await.unwrap();
        InProcess { server, dir }
    }
    pub fn addr(&self) -> SocketAddr {
        self.server.local_addr()
    }
    pub fn bootstrap(&self) -> String {
        self.addr().to_string()
    }
}

/// The built `strata` binary running as a child process (killable with -9).
pub struct Process {
    pub child: Child,
    pub port: u16,
    pub data_dir: PathBuf,
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Process {
    pub fn start(data_dir: &Path, port: u16, extra: &[&str]) -> Process {
        let listen = format!("127.0.0.1:{port}");
        // STRATA_TEST_LOG_LEVEL=info shows what the brokers do.
        let level = std::env::var("STRATA_TEST_LOG_LEVEL").unwrap_or_else(|_| "warn".into());
        let child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args([
                "serve",
                "--listen",
                &listen,
                "--data-dir",
                data_dir.to_str().unwrap(),
                "--log-level",
                &level,
            ])
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn strata");
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(&listen).is_err() {
            assert!(std::time::Instant::now() < deadline, "broker did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
        Process {
            child,
            port,
            data_dir: data_dir.to_path_buf(),
        }
    }
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }
    /// SIGKILL: no shutdown hook runs.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A raw Kafka connection speaking whatever we encode.
pub struct Raw {
    pub stream: TcpStream,
    correlation: i32,
}

impl Raw {
    pub async fn connect(addr: SocketAddr) -> Raw {
        Raw {
            stream: TcpStream::connect(addr).await.unwrap(),
            correlation: 0,
        }
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.unwrap();
    }

    /// Sends a request and decodes the response of type `R`.
    pub async fn call<Q: Encodable, R: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> R {
        self.send(key, version, req).await;
        self.receive(key, version).await.expect("response")
    }

    pub async fn send<Q: Encodable>(&mut self, key: ApiKey, version: i16, req: &Q) {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("raw-test")));
        let mut body = BytesMut::new();
        header
            .encode(&mut body, key.request_header_version(version))
            .unwrap();
        req.encode(&mut body, version).unwrap();
        let mut frame = BytesMut::new();
        frame.put_i32(body.len() as i32);
        frame.extend_from_slice(&body);
        self.stream.write_all(&frame).await.unwrap();
    }

    /// Reads one response; `None` if the broker closed the connection.
    pub async fn receive<R: Decodable>(&mut self, key: ApiKey, version: i16) -> Option<R> {
        let mut frame = self.read_frame().await?;
        let _header =
            ResponseHeader::decode(&mut frame, key.response_header_version(version)).unwrap();
        Some(R::decode(&mut frame, version).unwrap())
    }

    pub async fn read_frame(&mut self) -> Option<Bytes> {
        let mut len = [0u8; 4];
        tokio::time::timeout(Duration::from_secs(10), self.stream.read_exact(&mut len))
            .await
            .ok()?
            .ok()?;
        let mut buf = vec![0u8; i32::from_be_bytes(len) as usize];
        self.stream.read_exact(&mut buf).await.ok()?;
        Some(Bytes::from(buf))
    }

    /// CreateTopics v7 of one topic (replication factor 1): its result.
    pub async fn create_topic(
        &mut self,
        topic: &str,
        partitions: i32,
        configs: &[(&str, &str)],
    ) -> CreatableTopicResult {
        let req = create_topics_request(topic, partitions, configs);
        let resp: CreateTopicsResponse = self.call(ApiKey::CreateTopics, 7, &req).await;
        resp.topics[0].clone()
    }

    /// Produce v9 of `records` to one partition with acks=all: its answer.
    pub async fn produce(
        &mut self,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> PartitionProduceResponse {
        let req = produce_request(topic, partition, records, -1);
        let resp: ProduceResponse = self.call(ApiKey::Produce, 9, &req).await;
        resp.responses[0].partition_responses[0].clone()
    }

    /// `produce`'s (error code, base offset).
    pub async fn produce_result(
        &mut self,
        topic: &str,
        partition: i32,
        records: Bytes,
    ) -> (i16, i64) {
        let p = self.produce(topic, partition, records).await;
        (p.error_code, p.base_offset)
    }

    /// DescribeConfigs v4 with synonyms of one resource, only `keys` unless
    /// empty: its result.
    pub async fn describe_configs(
        &mut self,
        resource_type: i8,
        name: &str,
        keys: &[&str],
    ) -> DescribeConfigsResult {
        let keys = (!keys.is_empty()).then(|| keys.iter().map(|k| str_bytes(k)).collect());
        let resp: DescribeConfigsResponse = self
            .call(
                ApiKey::DescribeConfigs,
                4,
                &DescribeConfigsRequest::default()
                    .with_include_synonyms(true)
                    .with_resources(vec![DescribeConfigsResource::default()
                        .with_resource_type(resource_type)
                        .with_resource_name(str_bytes(name))
                        .with_configuration_keys(keys)]),
            )
            .await;
        resp.results.into_iter().next().unwrap()
    }

    /// IncrementalAlterConfigs v1 of `resources` (name, changes), all of
    /// `resource_type`: each one's error code and message.
    pub async fn incremental_alter_configs(
        &mut self,
        resource_type: i8,
        resources: Vec<(&str, Vec<AlterableConfig>)>,
        validate_only: bool,
    ) -> Vec<(i16, String)> {
        let resources = resources
            .into_iter()
            .map(|(name, configs)| {
                AlterConfigsResource::default()
                    .with_resource_type(resource_type)
                    .with_resource_name(str_bytes(name))
                    .with_configs(configs)
            })
            .collect();
        let resp: IncrementalAlterConfigsResponse = self
            .call(
                ApiKey::IncrementalAlterConfigs,
                1,
                &IncrementalAlterConfigsRequest::default()
                    .with_validate_only(validate_only)
                    .with_resources(resources),
            )
            .await;
        resp.responses
            .into_iter()
            .map(|r| {
                let message = r.error_message.map(|m| m.to_string());
                (r.error_code, message.unwrap_or_default())
            })
            .collect()
    }

    /// Fetch v11 of one partition (see `fetch_request`): its answer.
    pub async fn fetch(&mut self, req: &FetchRequest) -> PartitionData {
        let resp: FetchResponse = self.call(ApiKey::Fetch, 11, req).await;
        resp.responses[0].partitions[0].clone()
    }

    /// True once the broker has closed the connection.
    pub async fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        matches!(
            tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut b)).await,
            Ok(Ok(0)) | Ok(Err(_))
        )
    }
}

/// Encodes one uncompressed batch of `values` (keys "k0", "k1", ...).
pub fn batch(values: &[&[u8]], producer_id: i64, epoch: i16, first_sequence: i32) -> Bytes {
    let records = values
        .iter()
        .enumerate()
        .map(|(i, v)| {
            let key = Some(Bytes::from(format!("k{i}")));
            (
                key,
                Some(Bytes::copy_from_slice(v)),
                1_700_000_000_000 + i as i64,
            )
        })
        .collect();
    let producer = (producer_id >= 0).then_some((producer_id, epoch, first_sequence));
    strata::format::batch::encode_batch(
        records,
        producer,
        kafka_protocol::records::Compression::None,
    )
    .unwrap()
}

/// A fresh idempotent producer id from InitProducerId.
pub async fn init_producer_id(raw: &mut Raw) -> i64 {
    use kafka_protocol::messages::{InitProducerIdRequest, InitProducerIdResponse, ProducerId};
    let resp: InitProducerIdResponse = raw
        .call(
            ApiKey::InitProducerId,
            4,
            &InitProducerIdRequest::default()
                .with_transactional_id(None)
                .with_transaction_timeout_ms(60000)
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1),
        )
        .await;
    assert_eq!(resp.error_code, 0);
    resp.producer_id.0
}

pub fn topic_name(name: &str) -> TopicName {
    TopicName(str_bytes(name))
}

pub fn str_bytes(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// One change of an IncrementalAlterConfigs resource: `operation` is
/// Kafka's SET (0), DELETE (1), APPEND (2) or SUBTRACT (3).
pub fn config_op(name: &str, operation: i8, value: Option<&str>) -> AlterableConfig {
    AlterableConfig::default()
        .with_name(str_bytes(name))
        .with_config_operation(operation)
        .with_value(value.map(str_bytes))
}

/// CreateTopics of one topic with `partitions`, replication factor 1 and
/// topic `configs`.
pub fn create_topics_request(
    topic: &str,
    partitions: i32,
    configs: &[(&str, &str)],
) -> CreateTopicsRequest {
    CreateTopicsRequest::default()
        .with_timeout_ms(5000)
        .with_topics(vec![CreatableTopic::default()
            .with_name(topic_name(topic))
            .with_num_partitions(partitions)
            .with_replication_factor(1)
            .with_configs(
                configs
                    .iter()
                    .map(|(k, v)| {
                        CreatableTopicConfig::default()
                            .with_name(str_bytes(k))
                            .with_value(Some(str_bytes(v)))
                    })
                    .collect(),
            )])
}

/// Produce of `records` to one partition of `topic`.
pub fn produce_request(topic: &str, partition: i32, records: Bytes, acks: i16) -> ProduceRequest {
    ProduceRequest::default()
        .with_acks(acks)
        .with_timeout_ms(5000)
        .with_topic_data(vec![TopicProduceData::default()
            .with_name(topic_name(topic))
            .with_partition_data(vec![PartitionProduceData::default()
                .with_index(partition)
                .with_records(Some(records))])])
}

/// Fetch of one partition of `topic` from `offset`: no wait, up to 1 MiB.
pub fn fetch_request(topic: &str, partition: i32, offset: i64) -> FetchRequest {
    FetchRequest::default()
        .with_max_wait_ms(0)
        .with_max_bytes(1 << 20)
        .with_topics(vec![FetchTopic::default()
            .with_topic(topic_name(topic))
            .with_partitions(vec![FetchPartition::default()
                .with_partition(partition)
                .with_fetch_offset(offset)
                .with_partition_max_bytes(1 << 20)])])
}

/// How many `.log` segment files partition 0 of `topic` has on local disk.
pub fn local_log_files(data_dir: &Path, topic: &str) -> usize {
    std::fs::read_dir(data_dir.join("topics").join(topic).join("0"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        })
        .count()
}

/// The latest manifest of `partition` of `topic` in `store`, with the topic
/// file (id, config) it belongs to; `None` until both exist.
pub async fn stored_manifest(
    store: &std::sync::Arc<dyn object_store::ObjectStore>,
    topic: &str,
    partition: i32,
) -> Option<(strata::manifest::Manifest, strata::catalog::TopicFile)> {
    use strata::manifest::{objects::newest_topic_file, partition_prefix, ManifestStore};
    let path = object_store::path::Path::from_iter(["topics", topic]);
    let file: strata::catalog::TopicFile = newest_topic_file(store, &path).await.unwrap()?;
    let m = ManifestStore::new(
        store.clone(),
        partition_prefix(topic, file.id, partition).child("manifest"),
    )
    .load_latest()
    .await
    .unwrap()?;
    Some((m, file))
}

/// Whether compaction of a partition is done for now: its manifest `m`
/// reaches `end`, something was merged and the topic's policy (`config`)
/// wants no more jobs.
/// Wall-clock milliseconds, as the broker reads them.
pub fn now_ms() -> i64 {
    use strata::clock::Clock;
    strata::clock::SystemClock.now_ms()
}

pub fn compaction_settled(
    m: &strata::manifest::Manifest,
    config: &strata::catalog::config::TopicConfig,
    end: i64,
) -> bool {
    use strata::compaction::policy::{for_topic, SegmentDesc};
    let descs: Vec<SegmentDesc> = m.segments.iter().map(SegmentDesc::from).collect();
    m.end_offset() == Some(end)
        && m.segments.iter().any(|s| s.level > 0)
        && for_topic(&config.settings())
            .next_job(&descs, now_ms())
            .is_none()
}

/// (base offset, level) of every segment of `m`, for failure messages.
pub fn levels(m: &strata::manifest::Manifest) -> Vec<(i64, u32)> {
    m.segments
        .iter()
        .map(|s| (s.base_offset, s.level))
        .collect()
}
