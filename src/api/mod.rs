//! The Kafka protocol front end: one module per API family.
//!
//! `Broker::handle_frame` decodes a request frame, runs the handler and
//! returns a `Reply`: a future of the encoded response frame. Everything that
//! must happen in request order (offset assignment above all) runs before the
//! future is returned; the future only waits (for fsync, for data to arrive),
//! which lets the connection pipeline requests while answering in order.
//! Errors from the catalog and the log become Kafka error codes here and
//! nowhere else.

mod configs;
mod error;
mod fetch;
mod groups;
mod metadata;
mod offsets;
mod produce;
mod producer_id;
mod topics;
mod versions;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, RequestHeader, RequestKind, ResponseHeader};
use kafka_protocol::protocol::{Decodable, Encodable};

use crate::catalog::Catalog;
use crate::config::{BrokerConfig, FsyncPolicy};
use crate::coordinator::GroupCoordinator;

pub use versions::SUPPORTED_APIS;

/// An encoded response frame (length prefix included); empty when the
/// protocol sends no response (produce with acks=0); `None` when the response
/// could not be encoded and the connection must close.
pub type Reply = Pin<Box<dyn Future<Output = Option<Bytes>> + Send>>;

/// Why a frame could not be answered; the connection is closed, as Kafka does.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("request frame shorter than a request header")]
    Truncated,
    #[error("unknown API key {0}")]
    UnknownApi(i16),
    #[error("unsupported version {1} of {0:?}")]
    UnsupportedVersion(ApiKey, i16),
    #[error("malformed {0:?} request: {1}")]
    Malformed(ApiKey, String),
}

/// What the handlers need to know about this broker.
pub struct Broker {
    pub catalog: Arc<Catalog>,
    pub coordinator: Arc<GroupCoordinator>,
    pub node_id: i32,
    pub host: String,
    pub port: i32,
    pub num_partitions: i32,
    pub auto_create_topics: bool,
    pub fsync: FsyncPolicy,
    pub null_sink: bool,
}

impl Broker {
    pub fn new(
        catalog: Arc<Catalog>,
        coordinator: Arc<GroupCoordinator>,
        config: &BrokerConfig,
        host: String,
        port: i32,
    ) -> Broker {
        Broker {
            catalog,
            coordinator,
            node_id: config.node_id,
            host,
            port,
            num_partitions: config.num_partitions.max(1),
            auto_create_topics: config.auto_create_topics,
            fsync: config.fsync,
            null_sink: config.null_sink,
        }
    }

    /// Handles one request frame (without its length prefix) from `client_host`.
    pub fn handle_frame(
        self: &Arc<Self>,
        frame: Bytes,
        client_host: &str,
    ) -> Result<Reply, FrameError> {
        if frame.len() < 8 {
            return Err(FrameError::Truncated);
        }
        let mut peek = &frame[..];
        let api_key = peek.get_i16();
        let version = peek.get_i16();
        let key = ApiKey::try_from(api_key).map_err(|_| FrameError::UnknownApi(api_key))?;
        let supported = versions::supported(key);
        if key == ApiKey::ApiVersions
            && !supported.is_some_and(|(min, max)| (min..=max).contains(&version))
        {
            // KIP-511: answer an unknown ApiVersions version with v0 and the list,
            // so the client can retry with a version both sides speak.
            let correlation_id = (&frame[4..8]).get_i32();
            let body = versions::unsupported_version_response();
            return Ok(ready(encode_frame(correlation_id, 0, &body, 0)));
        }
        match supported {
            Some((min, max)) if (min..=max).contains(&version) => {}
            _ => return Err(FrameError::UnsupportedVersion(key, version)),
        }
        let mut buf = frame;
        let header = RequestHeader::decode(&mut buf, key.request_header_version(version))
            .map_err(|e| FrameError::Malformed(key, e.to_string()))?;
        let request = RequestKind::decode(key, &mut buf, version)
            .map_err(|e| FrameError::Malformed(key, e.to_string()))?;
        let cid = header.correlation_id;
        let rh = key.response_header_version(version);
        let reply = match request {
            RequestKind::ApiVersions(_) => {
                ready(encode_frame(cid, rh, &versions::response(), version))
            }
            RequestKind::Metadata(r) => ready(encode_frame(
                cid,
                rh,
                &metadata::metadata(self, r, version),
                version,
            )),
            RequestKind::DescribeCluster(r) => ready(encode_frame(
                cid,
                rh,
                &metadata::describe_cluster(self, r, version),
                version,
            )),
            RequestKind::Produce(r) => {
                let pending = produce::produce(self, r, version);
                Box::pin(async move {
                    match pending.await {
                        Some(response) => encode_frame(cid, rh, &response, version),
                        None => Some(Bytes::new()),
                    }
                })
            }
            RequestKind::Fetch(r) => {
                let broker = self.clone();
                Box::pin(async move {
                    encode_frame(cid, rh, &fetch::fetch(&broker, r, version).await, version)
                })
            }
            RequestKind::ListOffsets(r) => {
                let broker = self.clone();
                Box::pin(async move {
                    let response = offsets::list_offsets(&broker, r, version).await;
                    encode_frame(cid, rh, &response, version)
                })
            }
            RequestKind::DeleteRecords(r) => ready(encode_frame(
                cid,
                rh,
                &offsets::delete_records(self, r),
                version,
            )),
            RequestKind::CreateTopics(r) => ready(encode_frame(
                cid,
                rh,
                &topics::create_topics(self, r, version),
                version,
            )),
            RequestKind::DeleteTopics(r) => ready(encode_frame(
                cid,
                rh,
                &topics::delete_topics(self, r, version),
                version,
            )),
            RequestKind::CreatePartitions(r) => ready(encode_frame(
                cid,
                rh,
                &topics::create_partitions(self, r),
                version,
            )),
            RequestKind::DescribeConfigs(r) => ready(encode_frame(
                cid,
                rh,
                &configs::describe_configs(self, r, version),
                version,
            )),
            RequestKind::AlterConfigs(r) => ready(encode_frame(
                cid,
                rh,
                &configs::alter_configs(self, r),
                version,
            )),
            RequestKind::IncrementalAlterConfigs(r) => ready(encode_frame(
                cid,
                rh,
                &configs::incremental_alter_configs(self, r),
                version,
            )),
            RequestKind::FindCoordinator(r) => ready(encode_frame(
                cid,
                rh,
                &groups::find_coordinator(self, r, version),
                version,
            )),
            RequestKind::JoinGroup(r) => {
                let broker = self.clone();
                let client_id = header.client_id.map(|c| c.to_string()).unwrap_or_default();
                let client_host = format!("/{client_host}");
                Box::pin(async move {
                    let resp =
                        groups::join_group(&broker, r, version, &client_id, &client_host).await;
                    encode_frame(cid, rh, &resp, version)
                })
            }
            RequestKind::SyncGroup(r) => {
                let broker = self.clone();
                Box::pin(async move {
                    encode_frame(
                        cid,
                        rh,
                        &groups::sync_group(&broker, r, version).await,
                        version,
                    )
                })
            }
            RequestKind::Heartbeat(r) => {
                ready(encode_frame(cid, rh, &groups::heartbeat(self, r), version))
            }
            RequestKind::LeaveGroup(r) => ready(encode_frame(
                cid,
                rh,
                &groups::leave_group(self, r, version),
                version,
            )),
            RequestKind::OffsetCommit(r) => {
                let broker = self.clone();
                Box::pin(async move {
                    encode_frame(cid, rh, &groups::offset_commit(&broker, r).await, version)
                })
            }
            RequestKind::OffsetFetch(r) => ready(encode_frame(
                cid,
                rh,
                &groups::offset_fetch(self, r, version),
                version,
            )),
            RequestKind::ListGroups(r) => ready(encode_frame(
                cid,
                rh,
                &groups::list_groups(self, r, version),
                version,
            )),
            RequestKind::DescribeGroups(r) => ready(encode_frame(
                cid,
                rh,
                &groups::describe_groups(self, r, version),
                version,
            )),
            RequestKind::DeleteGroups(r) => ready(encode_frame(
                cid,
                rh,
                &groups::delete_groups(self, r),
                version,
            )),
            RequestKind::OffsetDelete(r) => ready(encode_frame(
                cid,
                rh,
                &groups::offset_delete(self, r),
                version,
            )),
            RequestKind::InitProducerId(r) => ready(encode_frame(
                cid,
                rh,
                &producer_id::init_producer_id(self, r),
                version,
            )),
            _ => return Err(FrameError::UnsupportedVersion(key, version)),
        };
        Ok(reply)
    }
}

fn ready(frame: Option<Bytes>) -> Reply {
    Box::pin(std::future::ready(frame))
}

/// Encodes a response frame: length, response header, body.
fn encode_frame<T: Encodable + std::fmt::Debug>(
    correlation_id: i32,
    header_version: i16,
    body: &T,
    version: i16,
) -> Option<Bytes> {
    let mut buf = BytesMut::with_capacity(256);
    buf.put_i32(0);
    let header = ResponseHeader::default().with_correlation_id(correlation_id);
    let result = header
        .encode(&mut buf, header_version)
        .and_then(|_| body.encode(&mut buf, version));
    if let Err(e) = result {
        // Our bug, not the client's: say so loudly and drop the connection.
        tracing::error!(error = %e, version, response = std::any::type_name::<T>(), "could not encode response");
        return None;
    }
    let len = (buf.len() - 4) as i32;
    (&mut buf[0..4]).put_i32(len);
    Some(buf.freeze())
}
