//! The APIs this broker serves, one entry each.
//!
//! An entry names the request type, the versions served and the handler.
//! The request type gives the API key and is what the body is decoded as,
//! so an entry cannot route one API's frames to another's handler. Dispatch
//! and the ApiVersions response both read this table, so the versions a
//! client is told about are exactly the versions that reach a handler.
//!
//! Handlers keep the signature natural to them; the entry adapts it with a
//! closure and says when the response is ready: `ready` computes it now,
//! `later` returns a future, `later_or_silent` a future that may decide no
//! response is sent at all (produce with acks=0). The handler itself is
//! always called before the reply is handed back, so whatever it does before
//! its first await (produce assigns offsets there) happens in request order.

use std::future::Future;
use std::ops::RangeInclusive;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, Request, StrBytes};

use crate::principal::Principal;

use super::metrics::ErrorCodes;
use super::{
    configs, consumer_groups, fetch, groups, leader_hints, log_dirs, metadata, offsets, partitions,
    produce, producer_id, quorum, topics, versions, Broker, Reply,
};

pub struct Api {
    /// The API key, taken from the request type.
    pub key: i16,
    pub versions: RangeInclusive<i16>,
    pub handle: Handler,
}

/// Decodes a request body and starts its handler; an error means the body
/// did not decode.
type Handler = fn(&Arc<Broker>, Bytes, Ctx<'_>) -> anyhow::Result<Reply>;

/// What a handler may know about a request besides its body.
pub struct Ctx<'a> {
    pub key: i16,
    pub version: i16,
    pub client_id: Option<StrBytes>,
    /// The peer's IP address.
    pub client_host: &'a str,
    pub correlation_id: i32,
    pub response_header_version: i16,
    /// Who sent the request, as authentication established it.
    #[allow(dead_code)] // read by authorization (issue 13), built next
    pub principal: &'a Principal,
}

impl Ctx<'_> {
    fn client_id(&self) -> String {
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

macro_rules! api {
    ($request:ty, $versions:expr, $when:ident($handler:expr)) => {
        Api {
            key: <$request as Request>::KEY,
            versions: $versions,
            handle: |broker, mut body, cx| {
                let request = <$request as Decodable>::decode(&mut body, cx.version)?;
                Ok($when(broker, request, cx, $handler))
            },
        }
    };
}

/// In the order ApiVersions lists them.
#[rustfmt::skip]
pub const APIS: &[Api] = &[
    api!(ProduceRequest, 3..=12, later_or_silent(|b, r, cx| leader_hints::produce(b, produce::produce(b, r, cx.version), cx.version))),
    api!(FetchRequest, 4..=17, later(|b, r, cx| leader_hints::fetch(b, fetch::fetch(b.clone(), r, cx.version), cx.version))),
    api!(ListOffsetsRequest, 1..=10, later(|b, r, cx| offsets::list_offsets(b.clone(), r, cx.version))),
    api!(MetadataRequest, 0..=13, ready(|b, r, cx| metadata::metadata(b, r, cx.version))),
    api!(ApiVersionsRequest, 0..=4, ready(|_, _, _| versions::response())),
    api!(CreateTopicsRequest, 2..=7, later(|b, r, cx| topics::create_topics(b.clone(), r, cx.version))),
    api!(DeleteTopicsRequest, 1..=6, later(|b, r, cx| topics::delete_topics(b.clone(), r, cx.version))),
    api!(DeleteRecordsRequest, 0..=2, ready(|b, r, _| offsets::delete_records(b, r))),
    api!(InitProducerIdRequest, 0..=5, later(|b, r, _| producer_id::init_producer_id(b.clone(), r))),
    api!(OffsetForLeaderEpochRequest, 2..=4, ready(|b, r, _| offsets::offset_for_leader_epoch(b, r))),
    api!(DescribeConfigsRequest, 1..=4, ready(|b, r, cx| configs::describe_configs(b, r, cx.version))),
    api!(AlterConfigsRequest, 0..=2, later(|b, r, _| configs::alter_configs(b.clone(), r))),
    api!(CreatePartitionsRequest, 0..=3, later(|b, r, _| topics::create_partitions(b.clone(), r))),
    api!(IncrementalAlterConfigsRequest, 0..=1, later(|b, r, _| configs::incremental_alter_configs(b.clone(), r))),
    api!(DescribeClusterRequest, 0..=1, ready(|b, r, cx| metadata::describe_cluster(b, r, cx.version))),
    api!(FindCoordinatorRequest, 0..=6, ready(|b, r, cx| groups::find_coordinator(b, r, cx.version))),
    api!(JoinGroupRequest, 0..=9, later(|b, r, cx| groups::join_group(b.clone(), r, cx.version, cx.client_id(), format!("/{}", cx.client_host)))),
    api!(SyncGroupRequest, 0..=5, later(|b, r, cx| groups::sync_group(b.clone(), r, cx.version))),
    api!(HeartbeatRequest, 0..=4, ready(|b, r, _| groups::heartbeat(b, r))),
    api!(LeaveGroupRequest, 0..=5, ready(|b, r, cx| groups::leave_group(b, r, cx.version))),
    api!(OffsetCommitRequest, 2..=9, later(|b, r, cx| groups::offset_commit(b.clone(), r, cx.version))),
    api!(OffsetFetchRequest, 1..=9, ready(|b, r, cx| groups::offset_fetch(b, r, cx.version))),
    api!(ListGroupsRequest, 0..=5, ready(|b, r, cx| groups::list_groups(b, r, cx.version))),
    api!(DescribeGroupsRequest, 0..=5, ready(|b, r, cx| groups::describe_groups(b, r, cx.version))),
    api!(DeleteGroupsRequest, 0..=2, ready(|b, r, _| groups::delete_groups(b, r))),
    api!(OffsetDeleteRequest, 0..=0, ready(|b, r, _| groups::offset_delete(b, r))),
    api!(DescribeLogDirsRequest, 1..=4, ready(|b, r, _| log_dirs::describe_log_dirs(b, r))),
    api!(ElectLeadersRequest, 0..=2, ready(|b, r, _| partitions::elect_leaders(b, r))),
    api!(AlterPartitionReassignmentsRequest, 0..=1, ready(|b, r, _| partitions::alter_partition_reassignments(b, r))),
    api!(ListPartitionReassignmentsRequest, 0..=0, ready(|b, r, _| partitions::list_partition_reassignments(b, r))),
    api!(DescribeQuorumRequest, 0..=2, ready(|b, r, cx| quorum::describe_quorum(b, r, cx.version))),
    api!(DescribeTopicPartitionsRequest, 0..=0, ready(|b, r, _| partitions::describe_topic_partitions(b, r))),
    api!(ConsumerGroupHeartbeatRequest, 0..=1, later(|b, r, cx| consumer_groups::consumer_group_heartbeat(b.clone(), r, cx.version, cx.client_id(), format!("/{}", cx.client_host)))),
    api!(ConsumerGroupDescribeRequest, 0..=1, ready(|b, r, cx| consumer_groups::consumer_group_describe(b, r, cx.version))),
];

/// The entry serving `key` at `version`, if any.
pub fn find(key: i16, version: i16) -> Option<&'static Api> {
    APIS.iter()
        .find(|api| api.key == key && api.versions.contains(&version))
}

fn ready<Req, Resp: Encodable + ErrorCodes>(
    broker: &Arc<Broker>,
    request: Req,
    cx: Ctx<'_>,
    handler: impl FnOnce(&Arc<Broker>, Req, &Ctx<'_>) -> Resp,
) -> Reply {
    let response = handler(broker, request, &cx);
    if let Some(m) = &broker.metrics {
        response.each_error(&mut |code| m.error(cx.key, cx.version, code));
    }
    ready_frame(cx.encoder().frame(&response))
}

fn later<Req, Fut>(
    broker: &Arc<Broker>,
    request: Req,
    cx: Ctx<'_>,
    handler: impl FnOnce(&Arc<Broker>, Req, &Ctx<'_>) -> Fut,
) -> Reply
where
    Fut: Future + Send + 'static,
    Fut::Output: Encodable + ErrorCodes,
{
    let pending = handler(broker, request, &cx);
    let encoder = cx.encoder();
    let count_errors = cx.count_errors(broker);
    Box::pin(async move {
        let response = pending.await;
        count_errors(&response);
        encoder.frame(&response)
    })
}

fn later_or_silent<Req, Resp, Fut>(
    broker: &Arc<Broker>,
    request: Req,
    cx: Ctx<'_>,
    handler: impl FnOnce(&Arc<Broker>, Req, &Ctx<'_>) -> Fut,
) -> Reply
where
    Fut: Future<Output = Option<Resp>> + Send + 'static,
    Resp: Encodable + ErrorCodes,
{
    let pending = handler(broker, request, &cx);
    let encoder = cx.encoder();
    let count_errors = cx.count_errors(broker);
    Box::pin(async move {
        match pending.await {
            Some(response) => {
                count_errors(&response);
                encoder.frame(&response)
            }
            None => Some(Bytes::new()),
        }
    })
}

pub fn ready_frame(frame: Option<Bytes>) -> Reply {
    Box::pin(std::future::ready(frame))
}

/// How to frame one request's response.
#[derive(Clone, Copy)]
pub struct Encoder {
    pub correlation_id: i32,
    pub header_version: i16,
    pub version: i16,
}

impl Encoder {
    /// Encodes a response frame: length, response header, body.
    pub fn frame<T: Encodable>(self, body: &T) -> Option<Bytes> {
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
