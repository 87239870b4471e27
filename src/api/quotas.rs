//! DescribeClientQuotas and AlterClientQuotas (`kafka-configs.sh
//! --entity-type users|clients`), and the throttling of Produce and Fetch.
//!
//! Quotas are stored through `access`, durable before AlterClientQuotas
//! answers. A produce is measured by the record bytes it carries, a fetch
//! by those it returns; once a client's meter is over its quota the
//! response carries `throttle_time_ms` and the connection is muted for that
//! long (KIP-219): the broker reads nothing more from it until then.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::CLUSTER_DENIED;
use super::dispatch::Ctx;
use super::{Broker, Mute};
use crate::access::acl::Operation;
use crate::access::quota::{self, Direction, QuotaEntity, QuotaEntry};
use crate::principal::Principal;

const INVALID_REQUEST: i16 = 42;
const UNKNOWN_SERVER_ERROR: i16 = -1;

fn text(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

/// How long the request's sender must now wait, after `bytes` more.
pub fn throttle(
    b: &Broker,
    principal: &Principal,
    client_id: &str,
    mute: &Mute,
    direction: Direction,
    bytes: u64,
) -> Duration {
    let now = b.clock.now_ms().max(0) as u64;
    let t = b
        .access
        .record_bytes(direction, principal, client_id, bytes, now);
    if !t.is_zero() {
        mute.extend(now + t.as_millis() as u64);
    }
    t
}

pub fn millis(t: Duration) -> i32 {
    t.as_millis().min(i32::MAX as u128) as i32
}

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

pub fn describe_client_quotas(
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

pub fn alter_client_quotas(
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
