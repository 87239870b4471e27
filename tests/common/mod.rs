//! Shared test helpers: brokers started in-process or as the built binary,
//! and a minimal raw-protocol client for requests real clients never send.

#![allow(dead_code)]

pub mod cluster;
pub mod etcd;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use clap::Parser;
use kafka_protocol::messages::{ApiKey, RequestHeader, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use strata::server::config::BrokerConfig;
use strata::server::Server;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

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
