//! The few requests one broker sends another: today only WriteTxnMarkers,
//! from a transaction coordinator to the leader of a partition it does not
//! lead. A request is one short-lived connection to the leader's advertised
//! address (markers are one request per transaction and leader, and the
//! coordinator retries on any failure), encoded with the same protocol
//! types the server decodes.

use std::time::Duration;

use anyhow::{bail, Context};
use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{
    ApiKey, RequestHeader, ResponseHeader, WriteTxnMarkersRequest, WriteTxnMarkersResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// WriteTxnMarkers v1, Kafka's only current version.
const VERSION: i16 = 1;
/// A leader that does not answer within this is tried again later.
const TIMEOUT: Duration = Duration::from_secs(10);
const MAX_RESPONSE: usize = 64 << 20;

pub async fn write_txn_markers(
    addr: &str,
    req: WriteTxnMarkersRequest,
) -> anyhow::Result<WriteTxnMarkersResponse> {
    tokio::time::timeout(TIMEOUT, exchange(addr, req))
        .await
        .with_context(|| format!("no answer from {addr}"))?
}

async fn exchange(
    addr: &str,
    req: WriteTxnMarkersRequest,
) -> anyhow::Result<WriteTxnMarkersResponse> {
    let key = ApiKey::WriteTxnMarkers;
    let correlation_id = 1;
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(VERSION)
        .with_correlation_id(correlation_id)
        .with_client_id(Some(StrBytes::from_static_str("strata-txn-coordinator")));
    let mut buf = BytesMut::new();
    buf.put_i32(0);
    header.encode(&mut buf, key.request_header_version(VERSION))?;
    req.encode(&mut buf, VERSION)?;
    let len = (buf.len() - 4) as i32;
    (&mut buf[0..4]).put_i32(len);
    let mut stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    stream.set_nodelay(true)?;
    stream.write_all(&buf).await?;
    let len = stream.read_i32().await? as usize;
    if len > MAX_RESPONSE {
        bail!("response of {len} bytes from {addr}");
    }
    let mut frame = vec![0u8; len];
    stream.read_exact(&mut frame).await?;
    let mut body = Bytes::from(frame);
    let header = ResponseHeader::decode(&mut body, key.response_header_version(VERSION))?;
    if header.correlation_id != correlation_id {
        bail!("correlation id {} from {addr}", header.correlation_id);
    }
    let resp = WriteTxnMarkersResponse::decode(&mut body, VERSION)?;
    if body.has_remaining() {
        tracing::debug!(extra = body.remaining(), %addr, "trailing bytes after WriteTxnMarkers response");
    }
    Ok(resp)
}
