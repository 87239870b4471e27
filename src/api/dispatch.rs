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

use super::metrics::ErrorCodes;
use super::quotas::{RequestMeter, Throttled};
use crate::access::acl::Operation;
use crate::access::quota::Direction;
use crate::principal::Principal;

use super::{
    acls, authorize as az, configs, consumer_groups, fetch, groups, leader_hints, log_dirs,
    metadata, offsets, partitions, produce, producer_id, producers, quorum, quotas,
    scram_credentials, topics, transactions, txn_markers, versions, Broker, Reply,
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
    pub principal: &'a Principal,
    /// The name of the listener the request came through: broker endpoints
    /// in responses are that listener's.
    pub listener: &'a str,
    /// The connection's mute, which a throttled response extends.
    pub mute: &'a Arc<super::Mute>,
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
    api!(ProduceRequest, 3..=12, later_or_silent(produce)),
    api!(FetchRequest, 4..=17, later(fetch)),
    api!(ListOffsetsRequest, 1..=10, later(|b, r, cx| { let (r, denied) = az::list_offsets(b, cx, r); let f = offsets::list_offsets(b.clone(), r, cx.version); async move { let mut resp = f.await; resp.topics.extend(denied); resp } })),
    api!(MetadataRequest, 0..=13, ready(|b, r, cx| az::metadata(b, cx, r))),
    api!(ApiVersionsRequest, 0..=4, ready(|_, _, _| versions::response())),
    api!(CreateTopicsRequest, 2..=7, later(|b, r, cx| { let (r, denied) = az::create_topics(b, cx, r); let f = topics::create_topics(b.clone(), r, cx.version); async move { let mut resp = f.await; resp.topics.extend(denied); resp } })),
    api!(DeleteTopicsRequest, 1..=6, later(|b, r, cx| { let (r, denied) = az::delete_topics(b, cx, r); let f = topics::delete_topics(b.clone(), r, cx.version); async move { let mut resp = f.await; resp.responses.extend(denied); resp } })),
    api!(DeleteRecordsRequest, 0..=2, ready(|b, r, cx| { let (r, denied) = az::delete_records(b, cx, r); let mut resp = offsets::delete_records(b, r); resp.topics.extend(denied); resp })),
    api!(InitProducerIdRequest, 0..=5, later(|b, r, cx| az::or_deny(az::init_producer_id_error(b, cx, &r).is_none(), || InitProducerIdResponse::default().with_error_code(az::init_producer_id_error(b, cx, &r).unwrap_or_default()).with_producer_id((-1).into()).with_producer_epoch(-1), || producer_id::init_producer_id(b.clone(), r.clone(), cx.version)))),
    api!(AddPartitionsToTxnRequest, 0..=5, later(|b, r, cx| { let denied = az::add_partitions_to_txn(b, cx, &r); az::or_deny(denied.is_none(), || denied.unwrap_or_default(), || transactions::add_partitions_to_txn(b.clone(), r, cx.version)) })),
    api!(AddOffsetsToTxnRequest, 0..=4, later(|b, r, cx| { let denied = az::add_offsets_to_txn(b, cx, &r); az::or_deny(denied.is_none(), || denied.unwrap_or_default(), || transactions::add_offsets_to_txn(b.clone(), r, cx.version)) })),
    api!(EndTxnRequest, 0..=4, later(|b, r, cx| { let denied = az::end_txn(b, cx, &r); az::or_deny(denied.is_none(), || denied.unwrap_or_default(), || transactions::end_txn(b.clone(), r, cx.version)) })),
    api!(TxnOffsetCommitRequest, 0..=4, later(|b, r, cx| { let (r, denied) = az::txn_offset_commit(b, cx, r); let f = transactions::txn_offset_commit(b.clone(), r, cx.version); async move { let mut resp = f.await; resp.topics.extend(denied); resp } })),
    api!(OffsetForLeaderEpochRequest, 2..=4, ready(|b, r, cx| { let (r, denied) = az::offset_for_leader_epoch(b, cx, r); let mut resp = offsets::offset_for_leader_epoch(b, r); resp.topics.extend(denied); resp })),
    api!(DescribeConfigsRequest, 1..=4, ready(|b, r, cx| { let (r, denied) = az::describe_configs(b, cx, r); let mut resp = configs::describe_configs(b, r, cx.version); resp.results.extend(denied); resp })),
    api!(AlterConfigsRequest, 0..=2, later(|b, r, cx| { let (r, denied) = az::alter_configs(b, cx, r); let f = configs::alter_configs(b.clone(), r); async move { let mut resp = f.await; resp.responses.extend(denied); resp } })),
    api!(CreatePartitionsRequest, 0..=3, later(|b, r, cx| { let (r, denied) = az::create_partitions(b, cx, r); let f = topics::create_partitions(b.clone(), r); async move { let mut resp = f.await; resp.results.extend(denied); resp } })),
    api!(IncrementalAlterConfigsRequest, 0..=1, later(|b, r, cx| { let (r, denied) = az::incremental_alter_configs(b, cx, r); let f = configs::incremental_alter_configs(b.clone(), r); async move { let mut resp = f.await; resp.responses.extend(denied); resp } })),
    api!(DescribeClusterRequest, 0..=1, ready(|b, r, cx| if b.on_cluster(cx, Operation::Describe) { metadata::describe_cluster(b, r, cx.version, cx.listener) } else { DescribeClusterResponse::default().with_error_code(az::CLUSTER_DENIED) })),
    api!(FindCoordinatorRequest, 0..=6, ready(|b, r, cx| { let (kt, key) = (r.key_type, r.key.to_string()); let mut resp = groups::find_coordinator(b, r, cx.version, cx.listener); az::find_coordinator_filter(b, cx, kt, &mut resp, &key); resp })),
    api!(JoinGroupRequest, 0..=9, later(|b, r, cx| az::or_deny(b.on_group(cx, Operation::Read, &r.group_id), || JoinGroupResponse::default().with_error_code(az::GROUP_DENIED).with_generation_id(-1), || groups::join_group(b.clone(), r.clone(), cx.version, cx.client_id(), format!("/{}", cx.client_host))))),
    api!(SyncGroupRequest, 0..=5, later(|b, r, cx| az::or_deny(b.on_group(cx, Operation::Read, &r.group_id), || SyncGroupResponse::default().with_error_code(az::GROUP_DENIED), || groups::sync_group(b.clone(), r.clone(), cx.version)))),
    api!(HeartbeatRequest, 0..=4, ready(|b, r, cx| if b.on_group(cx, Operation::Read, &r.group_id) { groups::heartbeat(b, r) } else { HeartbeatResponse::default().with_error_code(az::GROUP_DENIED) })),
    api!(LeaveGroupRequest, 0..=5, ready(|b, r, cx| if b.on_group(cx, Operation::Read, &r.group_id) { groups::leave_group(b, r, cx.version) } else { LeaveGroupResponse::default().with_error_code(az::GROUP_DENIED) })),
    api!(OffsetCommitRequest, 2..=9, later(|b, r, cx| { let (r, denied) = az::offset_commit(b, cx, r); let f = groups::offset_commit(b.clone(), r, cx.version); async move { let mut resp = f.await; resp.topics.extend(denied); resp } })),
    api!(OffsetFetchRequest, 1..=9, ready(|b, r, cx| { let group = r.group_id.to_string(); let mut resp = groups::offset_fetch(b, r, cx.version); az::offset_fetch_filter(b, cx, &mut resp, &group); resp })),
    api!(ListGroupsRequest, 0..=5, ready(|b, r, cx| { let mut resp = groups::list_groups(b, r, cx.version); az::list_groups_filter(b, cx, &mut resp); resp })),
    api!(DescribeGroupsRequest, 0..=5, ready(|b, r, cx| { let (r, denied) = az::describe_groups(b, cx, r); let mut resp = groups::describe_groups(b, r, cx.version); resp.groups.extend(denied); resp })),
    api!(DeleteGroupsRequest, 0..=2, ready(|b, r, cx| { let (r, denied) = az::delete_groups(b, cx, r); let mut resp = groups::delete_groups(b, r); resp.results.extend(denied); resp })),
    api!(OffsetDeleteRequest, 0..=0, ready(|b, r, cx| if b.on_group(cx, Operation::Delete, &r.group_id) { groups::offset_delete(b, r) } else { OffsetDeleteResponse::default().with_error_code(az::GROUP_DENIED) })),
    api!(DescribeLogDirsRequest, 1..=4, ready(|b, r, cx| if b.on_cluster(cx, Operation::Describe) { log_dirs::describe_log_dirs(b, r) } else { DescribeLogDirsResponse::default().with_error_code(az::CLUSTER_DENIED) })),
    api!(CreateAclsRequest, 1..=3, later(acls::create_acls)),
    api!(DescribeAclsRequest, 1..=3, ready(|b, r, cx| acls::describe_acls(b, r, cx))),
    api!(DeleteAclsRequest, 1..=3, later(acls::delete_acls)),
    api!(ElectLeadersRequest, 0..=2, ready(|b, r, cx| if b.on_cluster(cx, Operation::Alter) { partitions::elect_leaders(b, r) } else { ElectLeadersResponse::default().with_error_code(az::CLUSTER_DENIED) })),
    api!(AlterPartitionReassignmentsRequest, 0..=1, ready(|b, r, cx| if b.on_cluster(cx, Operation::Alter) { partitions::alter_partition_reassignments(b, r) } else { AlterPartitionReassignmentsResponse::default().with_error_code(az::CLUSTER_DENIED) })),
    api!(ListPartitionReassignmentsRequest, 0..=0, ready(|b, r, cx| if b.on_cluster(cx, Operation::Describe) { partitions::list_partition_reassignments(b, r) } else { ListPartitionReassignmentsResponse::default().with_error_code(az::CLUSTER_DENIED) })),
    api!(DescribeTransactionsRequest, 0..=0, ready(|b, r, cx| { let mut resp = transactions::describe_transactions(b, r); az::describe_transactions_filter(b, cx, &mut resp); resp })),
    api!(ListTransactionsRequest, 0..=2, ready(|b, r, cx| { let mut resp = transactions::list_transactions(b, r, cx.version); az::list_transactions_filter(b, cx, &mut resp); resp })),
    api!(DescribeClientQuotasRequest, 0..=1, ready(|b, r, cx| quotas::describe_client_quotas(b, r, cx))),
    api!(AlterClientQuotasRequest, 0..=1, later(quotas::alter_client_quotas)),
    api!(DescribeQuorumRequest, 0..=2, ready(|b, r, cx| if b.on_cluster(cx, Operation::Describe) { quorum::describe_quorum(b, r, cx.version) } else { DescribeQuorumResponse::default().with_error_code(az::CLUSTER_DENIED) })),
    api!(DescribeTopicPartitionsRequest, 0..=0, ready(|b, r, cx| { let mut resp = partitions::describe_topic_partitions(b, r); for t in &mut resp.topics { if t.name.as_ref().is_some_and(|n| !b.on_topic(cx, Operation::Describe, n)) { t.partitions.clear(); t.error_code = az::TOPIC_DENIED; } } resp })),
    api!(ConsumerGroupHeartbeatRequest, 0..=1, later(|b, r, cx| az::or_deny(b.on_group(cx, Operation::Read, &r.group_id), || ConsumerGroupHeartbeatResponse::default().with_error_code(az::GROUP_DENIED), || consumer_groups::consumer_group_heartbeat(b.clone(), r.clone(), cx.version, cx.client_id(), format!("/{}", cx.client_host))))),
    api!(ConsumerGroupDescribeRequest, 0..=1, ready(|b, r, cx| { let (r, denied) = az::consumer_group_describe(b, cx, r); let mut resp = consumer_groups::consumer_group_describe(b, r, cx.version); resp.groups.extend(denied); resp })),
    api!(WriteTxnMarkersRequest, 1..=1, later(|b, r, cx| { let denied = az::write_txn_markers(b, cx, &r); az::or_deny(denied.is_none(), || denied.unwrap_or_default(), || txn_markers::write_txn_markers(b.clone(), r)) })),
    api!(DescribeProducersRequest, 0..=0, ready(|b, r, cx| { let mut resp = producers::describe_producers(b, r); az::describe_producers_filter(b, cx, &mut resp); resp })),
    // Reached only where the connection does not authenticate (see server::connection).
    api!(SaslHandshakeRequest, 0..=1, ready(|_, _, _| scram_credentials::sasl_handshake_out_of_place())),
    api!(SaslAuthenticateRequest, 0..=2, ready(|_, _, _| scram_credentials::sasl_authenticate_out_of_place())),
    api!(DescribeUserScramCredentialsRequest, 0..=0, later(|b, r, cx| az::or_deny(b.on_cluster(cx, Operation::Describe), || DescribeUserScramCredentialsResponse::default().with_error_code(az::CLUSTER_DENIED), || scram_credentials::describe(b.clone(), r.clone())))),
    api!(AlterUserScramCredentialsRequest, 0..=0, later(|b, r, cx| az::or_deny(b.on_cluster(cx, Operation::Alter), || AlterUserScramCredentialsResponse::default().with_results(r.deletions.iter().map(|d| &d.name).chain(r.upsertions.iter().map(|u| &u.name)).map(|n| alter_user_scram_credentials_response::AlterUserScramCredentialsResult::default().with_user(n.clone()).with_error_code(az::CLUSTER_DENIED)).collect()), || scram_credentials::alter(b.clone(), r.clone())))),
];

/// Produce: WRITE on each topic; then the produce quota.
fn produce(
    b: &Arc<Broker>,
    r: ProduceRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = Option<ProduceResponse>> + Send + 'static {
    let (r, denied) = az::produce(b, cx, r);
    let throttle = quotas::throttle(
        b,
        cx.principal,
        &cx.client_id(),
        cx.mute,
        Direction::Produce,
        az::produce_bytes(&r),
    );
    let pending = leader_hints::produce(
        b,
        produce::produce(b, r, cx.version),
        cx.version,
        cx.listener,
    );
    async move {
        let mut resp = pending.await?;
        resp.responses.extend(denied);
        resp.throttle_time_ms = quotas::millis(throttle);
        Some(resp)
    }
}

/// Fetch: READ on each topic; then the fetch quota on what was read.
fn fetch(
    b: &Arc<Broker>,
    r: FetchRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = FetchResponse> + Send + 'static {
    let (r, denied) = az::fetch(b, cx, r);
    let pending = leader_hints::fetch(
        b,
        fetch::fetch(b.clone(), r, cx.version),
        cx.version,
        cx.listener,
    );
    let (b, principal, client_id, mute) = (
        b.clone(),
        cx.principal.clone(),
        cx.client_id(),
        cx.mute.clone(),
    );
    async move {
        let mut resp = pending.await;
        resp.responses.extend(denied);
        let throttle = quotas::throttle(
            &b,
            &principal,
            &client_id,
            &mute,
            Direction::Fetch,
            az::fetch_bytes(&resp),
        );
        resp.throttle_time_ms = quotas::millis(throttle);
        resp
    }
}

/// The entry serving `key` at `version`, if any.
pub fn find(key: i16, version: i16) -> Option<&'static Api> {
    APIS.iter()
        .find(|api| api.key == key && api.versions.contains(&version))
}

fn ready<Req, Resp: Encodable + ErrorCodes + Throttled>(
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

fn later<Req, Fut>(
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

fn later_or_silent<Req, Resp, Fut>(
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
