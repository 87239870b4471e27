//! The few requests one broker sends another: WriteTxnMarkers, from a
//! transaction coordinator to the leader of a partition it does not lead,
//! and AddPartitionsToTxn, from a leader whose partition a transactions v2
//! producer wrote to first, to the transaction coordinator. A request is
//! one short-lived connection to the other broker's endpoint on the
//! inter-broker listener (one request per transaction and broker, retried
//! by the sender or its client on any failure), encoded with the same
//! protocol types the server decodes.
//!
//! The connection is whatever that listener demands of any client: TLS
//! trusting `--ssl-ca-file` and presenting the broker's certificate, then
//! SaslHandshake and SaslAuthenticate as the broker's own user. The broker
//! is then authorized like anyone else, so its principal needs rights
//! (Kafka's answer, followed here: put it in `--super-users`).

use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, ApiKey, RequestHeader, ResponseHeader,
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest, SaslHandshakeResponse,
    WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::auth::client::SaslLogin;

/// AddPartitionsToTxn v5: batched, as brokers send it (KIP-890).
const ADD_PARTITIONS_VERSION: i16 = 5;
/// A leader that does not answer within this is tried again later.
const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RESPONSE: usize = 64 << 20;

/// How this broker's own requests reach the inter-broker listener of others.
pub(crate) struct InterBroker {
    /// The listener name whose endpoints are dialled.
    pub listener: String,
    tls: Option<tokio_rustls::TlsConnector>,
    sasl: Option<SaslLogin>,
}

impl InterBroker {
    pub(crate) fn new(
        listener: String,
        tls: Option<Arc<rustls::ClientConfig>>,
        sasl: Option<SaslLogin>,
    ) -> InterBroker {
        InterBroker {
            listener,
            tls: tls.map(tokio_rustls::TlsConnector::from),
            sasl,
        }
    }

    /// WriteTxnMarkers at `version`: 2 for transactions v2 markers, else 1.
    pub(crate) async fn write_txn_markers(
        &self,
        host: &str,
        port: i32,
        version: i16,
        req: WriteTxnMarkersRequest,
    ) -> anyhow::Result<WriteTxnMarkersResponse> {
        self.request(host, port, ApiKey::WriteTxnMarkers, version, &req)
            .await
    }

    pub(crate) async fn add_partitions_to_txn(
        &self,
        host: &str,
        port: i32,
        req: AddPartitionsToTxnRequest,
    ) -> anyhow::Result<AddPartitionsToTxnResponse> {
        self.request(
            host,
            port,
            ApiKey::AddPartitionsToTxn,
            ADD_PARTITIONS_VERSION,
            &req,
        )
        .await
    }

    /// One of the share-partition state requests (keys 83 to 87) to the
    /// share coordinator.
    pub(crate) async fn share_state<Q: Encodable, R: Decodable>(
        &self,
        host: &str,
        port: i32,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> anyhow::Result<R> {
        self.request(host, port, key, version, req).await
    }

    async fn request<Q: Encodable, R: Decodable>(
        &self,
        host: &str,
        port: i32,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> anyhow::Result<R> {
        let addr = format!("{host}:{port}");
        let exchange = async {
            let mut conn = self.connect(host, port).await?;
            conn.call(key, version, req).await
        };
        tokio::time::timeout(TIMEOUT, exchange)
            .await
            .with_context(|| format!("no answer from {addr}"))?
            .with_context(|| format!("{key:?} to {addr}"))
    }

    /// A connection to `host:port`, through TLS and SASL as configured.
    async fn connect(&self, host: &str, port: i32) -> anyhow::Result<Connection> {
        let tcp = TcpStream::connect((host, port as u16))
            .await
            .context("connecting")?;
        tcp.set_nodelay(true)?;
        let stream: Box<dyn Stream> = match &self.tls {
            None => Box::new(tcp),
            Some(tls) => {
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .with_context(|| format!("{host} as a TLS server name"))?;
                Box::new(tls.connect(name, tcp).await.context("TLS handshake")?)
            }
        };
        let mut conn = Connection {
            stream,
            correlation: 0,
        };
        if let Some(login) = &self.sasl {
            conn.authenticate(login).await?;
        }
        Ok(conn)
    }
}

trait Stream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Stream for T {}

struct Connection {
    stream: Box<dyn Stream>,
    correlation: i32,
}

impl Connection {
    /// SaslHandshake v1, then SaslAuthenticate v2 until the mechanism is done.
    async fn authenticate(&mut self, login: &SaslLogin) -> anyhow::Result<()> {
        let hs: SaslHandshakeResponse = self
            .call(
                ApiKey::SaslHandshake,
                1,
                &SaslHandshakeRequest::default()
                    .with_mechanism(StrBytes::from_string(login.mechanism.clone())),
            )
            .await?;
        if hs.error_code != 0 {
            let offered: Vec<&str> = hs.mechanisms.iter().map(|m| m.as_str()).collect();
            bail!(
                "SaslHandshake for {} refused with error {} (offered: {offered:?})",
                login.mechanism,
                hs.error_code
            );
        }
        // A SCRAM nonce must be unpredictable: the OS's, never a seeded `Random`.
        #[allow(clippy::disallowed_methods)]
        let nonce = uuid::Uuid::new_v4().simple().to_string();
        let (mut exchange, mut token) = login.start(&nonce)?;
        loop {
            let resp: SaslAuthenticateResponse = self
                .call(
                    ApiKey::SaslAuthenticate,
                    2,
                    &SaslAuthenticateRequest::default().with_auth_bytes(Bytes::from(token)),
                )
                .await?;
            if resp.error_code != 0 {
                bail!(
                    "authenticating as {} with {} failed with error {}: {}",
                    login.username,
                    login.mechanism,
                    resp.error_code,
                    resp.error_message.as_deref().unwrap_or("")
                );
            }
            match exchange.step(&resp.auth_bytes)? {
                Some(next) => token = next,
                None => return Ok(()),
            }
        }
    }

    async fn call<Q: Encodable, R: Decodable>(
        &mut self,
        key: ApiKey,
        version: i16,
        req: &Q,
    ) -> anyhow::Result<R> {
        self.correlation += 1;
        let header = RequestHeader::default()
            .with_request_api_key(key as i16)
            .with_request_api_version(version)
            .with_correlation_id(self.correlation)
            .with_client_id(Some(StrBytes::from_static_str("strata-broker")));
        let mut buf = BytesMut::new();
        buf.put_i32(0);
        header.encode(&mut buf, key.request_header_version(version))?;
        req.encode(&mut buf, version)?;
        let len = (buf.len() - 4) as i32;
        (&mut buf[0..4]).put_i32(len);
        self.stream.write_all(&buf).await?;
        self.stream.flush().await?;
        let len = self.stream.read_i32().await? as usize;
        if len > MAX_RESPONSE {
            bail!("response of {len} bytes");
        }
        let mut frame = vec![0u8; len];
        self.stream.read_exact(&mut frame).await?;
        let mut body = Bytes::from(frame);
        let header = ResponseHeader::decode(&mut body, key.response_header_version(version))?;
        if header.correlation_id != self.correlation {
            bail!("correlation id {} for {:?}", header.correlation_id, key);
        }
        let resp = R::decode(&mut body, version)?;
        if body.has_remaining() {
            tracing::debug!(
                extra = body.remaining(),
                ?key,
                "trailing bytes after a response"
            );
        }
        Ok(resp)
    }
}
