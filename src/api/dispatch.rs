//! The APIs this broker serves, one entry each, in the order ApiVersions
//! lists them.
//!
//! An API is one place. Its module exports its entry (`api!`): the request
//! type, the versions served, the handler and, where one check covers the
//! whole request, the ACL it needs; next to the entry the module says where
//! its responses keep their error codes (`error_codes!`, for the metrics) and
//! holds the authorization of requests that are filtered item by item. The
//! table below only lists the entries. Adding an API used to mean editing
//! the table, `authorize`, the metrics' error-code list and the handler
//! module, with the glue between them in table rows too long to read or
//! format; now it means writing one module and adding one line here, and the
//! compiler refuses an entry whose response does not say where its errors
//! are.
//!
//! The request type gives the API key and is what the body is decoded as,
//! so an entry cannot route one API's frames to another's handler. Dispatch
//! and the ApiVersions response both read this table, so the versions a
//! client is told about are exactly the versions that reach a handler.
//!
//! Handlers keep the signature natural to them; the entry says when the
//! response is ready: `ready` computes it now, `later` returns a future,
//! `later_or_silent` a future that may decide no response is sent at all
//! (produce with acks=0). The handler itself is always called before the
//! reply is handed back, so whatever it does before its first await
//! (produce assigns offsets there) happens in request order.
//!
//! An entry's `acl(operation, resource, denied)` is checked here before the
//! handler runs: the operation on the cluster, or on the group or
//! transactional id the request names (`authorize::Resource`). A refused
//! request is answered at once with the module's `denied` response, counted
//! and metered like any other. APIs that authorize item by item (most of
//! those naming topics) do it in their handler instead, with the helpers in
//! `authorize`.

use std::future::Future;
use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Encodable, StrBytes};

use super::metrics::ErrorCodes;
use super::quotas::{RequestMeter, Throttled};
use crate::principal::Principal;

use super::{
    acls, config_resources, configs, consumer_groups, delegation_tokens, features, fetch, groups,
    log_dirs, metadata, offsets, partitions, produce, producer_id, producers, quorum, quotas,
    scram_credentials, share_fetch, share_groups, share_state, streams_groups, topics,
    transactions, txn_markers, versions, Broker, Reply,
};

pub(super) struct Api {
    /// The API key, taken from the request type.
    pub key: i16,
    pub versions: RangeInclusive<i16>,
    pub handle: Handler,
}

/// Decodes a request body and starts its handler; an error means the body
/// did not decode.
type Handler = fn(&Arc<Broker>, Bytes, Ctx<'_>) -> anyhow::Result<Reply>;

/// What a handler may know about a request besides its body.
pub(crate) struct Ctx<'a> {
    pub key: i16,
    pub version: i16,
    pub client_id: Option<StrBytes>,
    /// The peer's IP address.
    pub client_host: &'a str,
    pub correlation_id: i32,
    pub response_header_version: i16,
    /// Who sent the request, as authentication established it.
    pub principal: &'a Principal,
    /// The name of the listener the request came through: broker endpoints
    /// in responses are that listener's.
    pub listener: &'a str,
    /// Whether delegation token requests may be served on this connection.
    pub delegation_tokens_allowed: bool,
    /// Which connection the request came on.
    pub connection: u64,
    /// The connection's mute, which a throttled response extends.
    pub mute: &'a Arc<super::Mute>,
}

impl Ctx<'_> {
    pub(super) fn client_id(&self) -> String {
        self.client_id.as_deref().unwrap_or_default().to_string()
    }

    /// Counts the response's error codes, when metrics are kept.
    fn count_errors(&self, broker: &Broker) -> impl Fn(&dyn ErrorCodes) + Send + 'static {
        let metrics = broker.metrics.clone();
        let (key, version) = (self.key, self.version);
        move |response| {
            if let Some(m) = &metrics {
                response.each_error(&mut |code| m.error(key, version, code));
            }
        }
    }

    fn encoder(&self) -> Encoder {
        Encoder {
            correlation_id: self.correlation_id,
            header_version: self.response_header_version,
            version: self.version,
        }
    }
}

/// A table entry: `api!(Request, versions, when(handler))`, where `when` is
/// `ready`, `later` or `later_or_silent` and the handler is called as
/// `handler(&broker, request, &ctx)`; with a last argument
/// `acl(operation, resource, denied)` the handler runs only if the
/// principal may perform `operation` on the `authorize::Resource`, and a
/// refused request is answered `denied(&request)`.
macro_rules! api {
    (
        $request:ty,
        $versions:expr,
        $when:ident($handler:expr)
        $(, acl($op:expr, $resource:expr, $denied:expr))?
        $(,)?
    ) => {
        $crate::api::dispatch::Api {
            key: <$request as ::kafka_protocol::protocol::Request>::KEY,
            versions: $versions,
            handle: |broker, mut body, cx| {
                let request = <$request as ::kafka_protocol::protocol::Decodable>::decode(
                    &mut body,
                    cx.version,
                )?;
                $(
                    let resource: $crate::api::authorize::Resource<$request> = $resource;
                    if !resource.allows(broker, &cx, $op, &request) {
                        let denied: fn(&$request) -> _ = $denied;
                        return Ok($crate::api::dispatch::ready(broker, request, cx, |_, r, _| {
                            denied(&r)
                        }));
                    }
                )?
                Ok($crate::api::dispatch::$when(broker, request, cx, $handler))
            },
        }
    };
}
pub(super) use api;

/// Every entry, in the order ApiVersions lists them.
pub(super) const APIS: &[Api] = &[
    produce::PRODUCE,
    fetch::FETCH,
    offsets::LIST_OFFSETS,
    metadata::METADATA,
    versions::API_VERSIONS,
    topics::CREATE_TOPICS,
    topics::DELETE_TOPICS,
    offsets::DELETE_RECORDS,
    producer_id::INIT_PRODUCER_ID,
    transactions::ADD_PARTITIONS_TO_TXN,
    transactions::ADD_OFFSETS_TO_TXN,
    transactions::END_TXN,
    transactions::TXN_OFFSET_COMMIT,
    offsets::OFFSET_FOR_LEADER_EPOCH,
    configs::DESCRIBE_CONFIGS,
    configs::ALTER_CONFIGS,
    topics::CREATE_PARTITIONS,
    configs::INCREMENTAL_ALTER_CONFIGS,
    config_resources::LIST_CONFIG_RESOURCES,
    metadata::DESCRIBE_CLUSTER,
    groups::FIND_COORDINATOR,
    groups::JOIN_GROUP,
    groups::SYNC_GROUP,
    groups::HEARTBEAT,
    groups::LEAVE_GROUP,
    groups::OFFSET_COMMIT,
    groups::OFFSET_FETCH,
    groups::LIST_GROUPS,
    groups::DESCRIBE_GROUPS,
    groups::DELETE_GROUPS,
    groups::OFFSET_DELETE,
    log_dirs::ALTER_REPLICA_LOG_DIRS,
    log_dirs::DESCRIBE_LOG_DIRS,
    acls::CREATE_ACLS,
    acls::DESCRIBE_ACLS,
    acls::DELETE_ACLS,
    partitions::ELECT_LEADERS,
    partitions::ALTER_PARTITION_REASSIGNMENTS,
    partitions::LIST_PARTITION_REASSIGNMENTS,
    transactions::DESCRIBE_TRANSACTIONS,
    transactions::LIST_TRANSACTIONS,
    quotas::DESCRIBE_CLIENT_QUOTAS,
    quotas::ALTER_CLIENT_QUOTAS,
    quorum::DESCRIBE_QUORUM,
    features::UPDATE_FEATURES,
    partitions::DESCRIBE_TOPIC_PARTITIONS,
    consumer_groups::CONSUMER_GROUP_HEARTBEAT,
    consumer_groups::CONSUMER_GROUP_DESCRIBE,
    share_groups::SHARE_GROUP_HEARTBEAT,
    share_groups::SHARE_GROUP_DESCRIBE,
    share_groups::DESCRIBE_SHARE_GROUP_OFFSETS,
    share_groups::ALTER_SHARE_GROUP_OFFSETS,
    share_groups::DELETE_SHARE_GROUP_OFFSETS,
    share_fetch::SHARE_FETCH,
    share_fetch::SHARE_ACKNOWLEDGE,
    share_state::INITIALIZE_SHARE_GROUP_STATE,
    share_state::READ_SHARE_GROUP_STATE,
    share_state::WRITE_SHARE_GROUP_STATE,
    share_state::DELETE_SHARE_GROUP_STATE,
    share_state::READ_SHARE_GROUP_STATE_SUMMARY,
    streams_groups::STREAMS_GROUP_HEARTBEAT,
    streams_groups::STREAMS_GROUP_DESCRIBE,
    streams_groups::STREAMS_GROUP_TOPOLOGY_DESCRIPTION_UPDATE,
    txn_markers::WRITE_TXN_MARKERS,
    producers::DESCRIBE_PRODUCERS,
    scram_credentials::SASL_HANDSHAKE,
    scram_credentials::SASL_AUTHENTICATE,
    scram_credentials::DESCRIBE_USER_SCRAM_CREDENTIALS,
    scram_credentials::ALTER_USER_SCRAM_CREDENTIALS,
    delegation_tokens::CREATE_DELEGATION_TOKEN,
    delegation_tokens::RENEW_DELEGATION_TOKEN,
    delegation_tokens::EXPIRE_DELEGATION_TOKEN,
    delegation_tokens::DESCRIBE_DELEGATION_TOKEN,
];

/// The entry serving `key` at `version`, if any.
pub(super) fn find(key: i16, version: i16) -> Option<&'static Api> {
    APIS.iter()
        .find(|api| api.key == key && api.versions.contains(&version))
}

pub(super) fn ready<Req, Resp: Encodable + ErrorCodes + Throttled>(
    broker: &Arc<Broker>,
    request: Req,
    cx: Ctx<'_>,
    handler: impl FnOnce(&Arc<Broker>, Req, &Ctx<'_>) -> Resp,
) -> Reply {
    let meter = RequestMeter::new(broker, &cx);
    let started = meter.as_ref().map(RequestMeter::now);
    let mut response = handler(broker, request, &cx);
    if let (Some(meter), Some(started)) = (meter, started) {
        meter.charge(&mut response, meter.since(started));
    }
    if let Some(m) = &broker.metrics {
        response.each_error(&mut |code| m.error(cx.key, cx.version, code));
    }
    ready_frame(cx.encoder().frame(&response))
}

pub(super) fn later<Req, Fut>(
    broker: &Arc<Broker>,
    request: Req,
    cx: Ctx<'_>,
    handler: impl FnOnce(&Arc<Broker>, Req, &Ctx<'_>) -> Fut,
) -> Reply
where
    Fut: Future + Send + 'static,
    Fut::Output: Encodable + ErrorCodes + Throttled,
{
    let meter = RequestMeter::new(broker, &cx);
    let started = meter.as_ref().map(RequestMeter::now);
    let pending = handler(broker, request, &cx);
    let called = meter
        .as_ref()
        .zip(started)
        .map(|(m, s)| m.since(s))
        .unwrap_or_default();
    let encoder = cx.encoder();
    let count_errors = cx.count_errors(broker);
    Box::pin(async move {
        let (mut response, busy) = quotas::busy_time(pending, meter.as_ref()).await;
        if let Some(meter) = meter {
            meter.charge(&mut response, called + busy);
        }
        count_errors(&response);
        encoder.frame(&response)
    })
}

pub(super) fn later_or_silent<Req, Resp, Fut>(
    broker: &Arc<Broker>,
    request: Req,
    cx: Ctx<'_>,
    handler: impl FnOnce(&Arc<Broker>, Req, &Ctx<'_>) -> Fut,
) -> Reply
where
    Fut: Future<Output = Option<Resp>> + Send + 'static,
    Resp: Encodable + ErrorCodes + Throttled,
{
    let meter = RequestMeter::new(broker, &cx);
    let started = meter.as_ref().map(RequestMeter::now);
    let pending = handler(broker, request, &cx);
    let called = meter
        .as_ref()
        .zip(started)
        .map(|(m, s)| m.since(s))
        .unwrap_or_default();
    let encoder = cx.encoder();
    let count_errors = cx.count_errors(broker);
    Box::pin(async move {
        match quotas::busy_time(pending, meter.as_ref()).await {
            (Some(mut response), busy) => {
                if let Some(meter) = meter {
                    meter.charge(&mut response, called + busy);
                }
                count_errors(&response);
                encoder.frame(&response)
            }
            (None, _) => Some(Bytes::new()),
        }
    })
}

pub(super) fn ready_frame(frame: Option<Bytes>) -> Reply {
    Box::pin(std::future::ready(frame))
}

/// How to frame one request's response.
#[derive(Clone, Copy)]
pub(crate) struct Encoder {
    pub correlation_id: i32,
    pub header_version: i16,
    pub version: i16,
}

impl Encoder {
    /// Encodes a response frame: length, response header, body.
    pub(crate) fn frame<T: Encodable>(self, body: &T) -> Option<Bytes> {
        let mut buf = BytesMut::with_capacity(256);
        buf.put_i32(0);
        let header = ResponseHeader::default().with_correlation_id(self.correlation_id);
        let result = header
            .encode(&mut buf, self.header_version)
            .and_then(|_| body.encode(&mut buf, self.version));
        if let Err(e) = result {
            // Our bug, not the client's: say so loudly and drop the connection.
            tracing::error!(error = %e, version = self.version, response = std::any::type_name::<T>(), "could not encode response");
            return None;
        }
        let len = (buf.len() - 4) as i32;
        (&mut buf[0..4]).put_i32(len);
        Some(buf.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_api_has_one_entry() {
        let mut keys: Vec<i16> = APIS.iter().map(|api| api.key).collect();
        keys.sort();
        keys.dedup();
        assert_eq!(keys.len(), APIS.len());
    }

    #[test]
    fn every_entry_is_a_known_api_with_versions() {
        for api in APIS {
            assert!(ApiKey::try_from(api.key).is_ok(), "api key {}", api.key);
            assert!(!api.versions.is_empty(), "api key {}", api.key);
        }
    }
}
