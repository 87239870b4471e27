//! DescribeClientQuotas and AlterClientQuotas (`kafka-configs.sh
//! --entity-type users|clients`), and the throttling of Produce and Fetch.
//!
//! Quotas are stored through `access`, durable before AlterClientQuotas
//! answers. A produce is measured by the record bytes it carries, a fetch
//! by those it returns; once a client's meter is over its quota the
//! response carries `throttle_time_ms` and the connection is muted for that
//! long (KIP-219): the broker reads nothing more from it until then. Every
//! request with a `throttle_time_ms` is also charged the time its handler
//! ran against `request_percentage` (see `access::quota`), and throttled the
//! same way when over it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::CLUSTER_DENIED;
use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::{Broker, Mute};
use crate::access::acl::Operation;
use crate::access::quota::{self, Direction, QuotaEntity, QuotaEntry};
use crate::principal::Principal;

pub(super) const DESCRIBE_CLIENT_QUOTAS: Api = api!(
    DescribeClientQuotasRequest,
    0..=1,
    ready(|b, r, cx| describe_client_quotas(b, r, cx))
);
pub(super) const ALTER_CLIENT_QUOTAS: Api =
    api!(AlterClientQuotasRequest, 0..=1, later(alter_client_quotas));

error_codes! {
    DescribeClientQuotasResponse => |r, f| f(r.error_code);
    AlterClientQuotasResponse => |r, f| r.entries.iter().for_each(|e| f(e.error_code));
}

const INVALID_REQUEST: i16 = 42;
const UNKNOWN_SERVER_ERROR: i16 = -1;

fn text(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

/// How long the request's sender must now wait, after using `amount` more.
pub(super) fn throttle(
    b: &Broker,
    principal: &Principal,
    client_id: &str,
    mute: &Mute,
    direction: Direction,
    amount: u64,
) -> Duration {
    let now = b.clock.now_ms().max(0) as u64;
    let t = b
        .access
        .record_usage(direction, principal, client_id, amount, now);
    if !t.is_zero() {
        mute.extend(now + t.as_millis() as u64);
    }
    t
}

pub(super) fn millis(t: Duration) -> i32 {
    t.as_millis().min(i32::MAX as u128) as i32
}

/// Charges one request's handler time to its client's `request_percentage`
/// quota. Made only while some quota is set, so that a broker without
/// quotas neither clones the principal nor reads the clock per request.
pub(super) struct RequestMeter {
    broker: Arc<Broker>,
    principal: Principal,
    client_id: String,
    mute: Arc<Mute>,
}

impl RequestMeter {
    pub(super) fn new(b: &Arc<Broker>, cx: &Ctx<'_>) -> Option<RequestMeter> {
        if b.access.doc().quotas.is_empty() {
            return None;
        }
        Some(RequestMeter {
            broker: b.clone(),
            principal: cx.principal.clone(),
            client_id: cx.client_id.as_deref().unwrap_or_default().to_string(),
            mute: cx.mute.clone(),
        })
    }

    /// The broker's clock, which times what requests cost.
    pub(super) fn now(&self) -> Instant {
        self.broker.clock.now()
    }

    pub(super) fn since(&self, started: Instant) -> Duration {
        self.now().saturating_duration_since(started)
    }

    /// Records `busy` and puts the resulting throttle into the response.
    /// Responses without `throttle_time_ms` (SASL, WriteTxnMarkers) are
    /// exempt, as in Kafka.
    pub(super) fn charge(&self, response: &mut impl Throttled, busy: Duration) {
        let Some(field) = response.throttle_time_ms() else {
            return;
        };
        let t = throttle(
            &self.broker,
            &self.principal,
            &self.client_id,
            &self.mute,
            Direction::Request,
            busy.as_nanos() as u64,
        );
        *field = (*field).max(millis(t));
    }
}

/// Polls `f` and adds up the time spent in its polls when metered: what a
/// request costs the broker's threads, without the time it waits.
pub(super) async fn busy_time<F: std::future::Future>(
    f: F,
    meter: Option<&RequestMeter>,
) -> (F::Output, Duration) {
    let mut f = std::pin::pin!(f);
    let mut busy = Duration::ZERO;
    let out = std::future::poll_fn(|cx| {
        let Some(meter) = meter else {
            return f.as_mut().poll(cx);
        };
        let started = meter.now();
        let r = f.as_mut().poll(cx);
        busy += meter.since(started);
        r
    })
    .await;
    (out, busy)
}

/// A response whose client can be told to back off.
pub(super) trait Throttled {
    fn throttle_time_ms(&mut self) -> Option<&mut i32>;
}

macro_rules! throttled {
    ($($t:ty),* ; without $($u:ty),*) => {
        $(impl Throttled for $t {
            fn throttle_time_ms(&mut self) -> Option<&mut i32> {
                Some(&mut self.throttle_time_ms)
            }
        })*
        $(impl Throttled for $u {
            fn throttle_time_ms(&mut self) -> Option<&mut i32> {
                None
            }
        })*
    };
}

throttled!(
    ProduceResponse, FetchResponse, ListOffsetsResponse, MetadataResponse, ApiVersionsResponse,
    CreateTopicsResponse, DeleteTopicsResponse, DeleteRecordsResponse, InitProducerIdResponse,
    AddPartitionsToTxnResponse, AddOffsetsToTxnResponse, EndTxnResponse, TxnOffsetCommitResponse,
    OffsetForLeaderEpochResponse, DescribeConfigsResponse, AlterConfigsResponse,
    CreatePartitionsResponse, IncrementalAlterConfigsResponse, DescribeClusterResponse,
    FindCoordinatorResponse, JoinGroupResponse, SyncGroupResponse, HeartbeatResponse,
    LeaveGroupResponse, OffsetCommitResponse, OffsetFetchResponse, ListGroupsResponse,
    DescribeGroupsResponse, DeleteGroupsResponse, OffsetDeleteResponse, AlterReplicaLogDirsResponse,
    DescribeLogDirsResponse,
    CreateAclsResponse, DescribeAclsResponse, DeleteAclsResponse, ElectLeadersResponse,
    AlterPartitionReassignmentsResponse, ListPartitionReassignmentsResponse,
    DescribeTransactionsResponse, ListTransactionsResponse, DescribeClientQuotasResponse,
    AlterClientQuotasResponse, DescribeTopicPartitionsResponse, ConsumerGroupHeartbeatResponse,
    ConsumerGroupDescribeResponse, DescribeProducersResponse, DescribeUserScramCredentialsResponse,
    AlterUserScramCredentialsResponse, ListConfigResourcesResponse, CreateDelegationTokenResponse,
    RenewDelegationTokenResponse, ExpireDelegationTokenResponse, DescribeDelegationTokenResponse,
    UpdateFeaturesResponse, StreamsGroupHeartbeatResponse, StreamsGroupDescribeResponse,
    StreamsGroupTopologyDescriptionUpdateResponse, ShareGroupHeartbeatResponse, ShareFetchResponse,
    ShareGroupDescribeResponse, ShareAcknowledgeResponse, DescribeShareGroupOffsetsResponse,
    AlterShareGroupOffsetsResponse, DeleteShareGroupOffsetsResponse;
    without DescribeQuorumResponse, WriteTxnMarkersResponse, SaslHandshakeResponse,
    InitializeShareGroupStateResponse, ReadShareGroupStateResponse, WriteShareGroupStateResponse,
    DeleteShareGroupStateResponse, ReadShareGroupStateSummaryResponse,
    SaslAuthenticateResponse
);

fn entity_of(parts: impl Iterator<Item = (String, Option<String>)>) -> Result<QuotaEntity, String> {
    let mut e = QuotaEntity::default();
    for (kind, name) in parts {
        let slot = match kind.as_str() {
            quota::USER => &mut e.user,
            quota::CLIENT_ID => &mut e.client_id,
            other => return Err(format!("Unsupported quota entity type {other}")),
        };
        if slot.is_some() {
            return Err(format!("Duplicate {kind} entity in the request"));
        }
        *slot = Some(name);
    }
    if e.user.is_none() && e.client_id.is_none() {
        return Err("Invalid empty client quota entity".into());
    }
    Ok(e)
}

pub(super) fn describe_client_quotas(
    b: &Broker,
    req: DescribeClientQuotasRequest,
    cx: &Ctx<'_>,
) -> DescribeClientQuotasResponse {
    use describe_client_quotas_response::{EntityData, EntryData, ValueData};
    if !b.on_cluster(cx, Operation::DescribeConfigs) {
        return DescribeClientQuotasResponse::default()
            .with_error_code(CLUSTER_DENIED)
            .with_error_message(text("Cluster authorization failed."));
    }
    for c in &req.components {
        if c.entity_type.as_str() != quota::USER && c.entity_type.as_str() != quota::CLIENT_ID {
            return DescribeClientQuotasResponse::default()
                .with_error_code(INVALID_REQUEST)
                .with_error_message(text(format!(
                    "Unsupported quota entity type {}",
                    c.entity_type
                )));
        }
    }
    let matches = |e: &QuotaEntity| {
        let parts = e.parts();
        let all = req.components.iter().all(|c| {
            let part = parts.iter().find(|(k, _)| *k == c.entity_type.as_str());
            match (c.match_type, part) {
                (_, None) => false,
                // 0: exactly this name; 1: the default; 2: any.
                (0, Some((_, name))) => name.as_deref() == c._match.as_deref(),
                (1, Some((_, name))) => name.is_none(),
                (_, Some(_)) => true,
            }
        });
        all && (!req.strict || parts.len() == req.components.len())
    };
    let entries = b
        .access
        .doc()
        .quotas
        .iter()
        .filter(|q| matches(&q.entity) && !q.values.is_empty())
        .map(|q| {
            EntryData::default()
                .with_entity(
                    q.entity
                        .parts()
                        .into_iter()
                        .map(|(k, n)| {
                            EntityData::default()
                                .with_entity_type(StrBytes::from_static_str(k))
                                .with_entity_name(n.map(StrBytes::from_string))
                        })
                        .collect(),
                )
                .with_values(
                    q.values
                        .iter()
                        .map(|(k, v)| {
                            ValueData::default()
                                .with_key(StrBytes::from_string(k.clone()))
                                .with_value(*v)
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeClientQuotasResponse::default().with_entries(Some(entries))
}

/// An entry's entity and its changes (`None` removes the key), or why it is refused.
type Checked = Result<(QuotaEntity, Vec<(String, Option<f64>)>), (i16, String)>;

pub(super) fn alter_client_quotas(
    b: &Arc<Broker>,
    req: AlterClientQuotasRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = AlterClientQuotasResponse> + Send + 'static {
    use alter_client_quotas_response::{EntityData, EntryData};
    let allowed = b.on_cluster(cx, Operation::AlterConfigs);
    let b = b.clone();
    async move {
        let echo = |e: &alter_client_quotas_request::EntryData| -> Vec<EntityData> {
            e.entity
                .iter()
                .map(|d| {
                    EntityData::default()
                        .with_entity_type(d.entity_type.clone())
                        .with_entity_name(d.entity_name.clone())
                })
                .collect()
        };
        let checked: Vec<Checked> = req
            .entries
            .iter()
            .map(|e| {
                if !allowed {
                    return Err((CLUSTER_DENIED, "Cluster authorization failed.".to_string()));
                }
                let entity = entity_of(e.entity.iter().map(|d| {
                    (
                        d.entity_type.to_string(),
                        d.entity_name.as_ref().map(|n| n.to_string()),
                    )
                }))
                .map_err(|m| (INVALID_REQUEST, m))?;
                let mut ops = Vec::new();
                for op in &e.ops {
                    let key = op.key.to_string();
                    if !quota::KEYS.contains(&key.as_str()) {
                        return Err((INVALID_REQUEST, format!("Invalid configuration key {key}")));
                    }
                    let positive = op.value.is_finite() && op.value > 0.0;
                    if !op.remove && !positive {
                        return Err((
                            INVALID_REQUEST,
                            format!("Illegal value {} for {key}: it must be positive", op.value),
                        ));
                    }
                    ops.push((key, (!op.remove).then_some(op.value)));
                }
                Ok((entity, ops))
            })
            .collect();
        let stored = if req.validate_only {
            Ok(())
        } else {
            let valid: Vec<_> = checked
                .iter()
                .filter_map(|c| c.as_ref().ok())
                .cloned()
                .collect();
            b.access
                .update(|doc| {
                    for (entity, ops) in &valid {
                        let i = match doc.quotas.iter().position(|q| q.entity == *entity) {
                            Some(i) => i,
                            None => {
                                doc.quotas.push(QuotaEntry {
                                    entity: entity.clone(),
                                    values: BTreeMap::new(),
                                });
                                doc.quotas.len() - 1
                            }
                        };
                        for (k, v) in ops {
                            match v {
                                Some(v) => doc.quotas[i].values.insert(k.clone(), *v),
                                None => doc.quotas[i].values.remove(k),
                            };
                        }
                    }
                    doc.quotas.retain(|q| !q.values.is_empty());
                })
                .await
        };
        let entries = req
            .entries
            .iter()
            .zip(checked)
            .map(|(e, c)| {
                let (code, msg) = match (c, &stored) {
                    (Err((code, m)), _) => (code, text(m)),
                    (Ok(_), Ok(())) => (0, None),
                    (Ok(_), Err(err)) => (UNKNOWN_SERVER_ERROR, text(err.to_string())),
                };
                EntryData::default()
                    .with_error_code(code)
                    .with_error_message(msg)
                    .with_entity(echo(e))
            })
            .collect();
        AlterClientQuotasResponse::default().with_entries(entries)
    }
}
