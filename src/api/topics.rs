//! CreateTopics, DeleteTopics and CreatePartitions: in the local catalog
//! when the broker runs alone; in cluster mode in etcd, from where every
//! broker's catalog mirrors them.
//!
//! A replication factor is accepted up to the number of live brokers, as
//! Kafka accepts it up to the number of registered ones: one alone, the
//! members registered in etcd in a cluster. In a cluster it is stored with
//! the topic and only shapes what Metadata reports (see `metadata`); the
//! data is never copied.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::*;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::authorize::{split, TOPIC_DENIED};
use super::configs::CONFIG_SOURCE_DEFAULT;
use super::configs::CONFIG_SOURCE_TOPIC;
use super::dispatch::{api, Api, Ctx};
use super::error::catalog_error_code;
use super::metadata::brokers;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::catalog::config::TOPIC_CONFIGS;
use crate::catalog::{CatalogError, TopicConfig};
use crate::cluster::ClusterError;

pub(super) const CREATE_TOPICS: Api = api!(CreateTopicsRequest, 2..=7, later(handle_create_topics));
pub(super) const DELETE_TOPICS: Api = api!(DeleteTopicsRequest, 1..=6, later(handle_delete_topics));
pub(super) const CREATE_PARTITIONS: Api = api!(
    CreatePartitionsRequest,
    0..=3,
    later(handle_create_partitions)
);

error_codes! {
    CreateTopicsResponse => |r, f| r.topics.iter().for_each(|t| f(t.error_code));
    DeleteTopicsResponse => |r, f| r.responses.iter().for_each(|t| f(t.error_code));
    CreatePartitionsResponse => |r, f| r.results.iter().for_each(|x| f(x.error_code));
}

fn handle_create_topics(
    b: &Arc<Broker>,
    r: CreateTopicsRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = CreateTopicsResponse> + Send + 'static {
    let (r, denied) = authorize_create_topics(b, cx, r);
    let pending = create_topics(b.clone(), r, cx.version);
    async move {
        let mut resp = pending.await;
        resp.topics.extend(denied);
        resp
    }
}

fn handle_delete_topics(
    b: &Arc<Broker>,
    r: DeleteTopicsRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = DeleteTopicsResponse> + Send + 'static {
    let (r, denied) = authorize_delete_topics(b, cx, r);
    let pending = delete_topics(b.clone(), r, cx.version);
    async move {
        let mut resp = pending.await;
        resp.responses.extend(denied);
        resp
    }
}

fn handle_create_partitions(
    b: &Arc<Broker>,
    r: CreatePartitionsRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = CreatePartitionsResponse> + Send + 'static {
    let (r, denied) = authorize_create_partitions(b, cx, r);
    let pending = create_partitions(b.clone(), r);
    async move {
        let mut resp = pending.await;
        resp.results.extend(denied);
        resp
    }
}

fn authorize_create_topics(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: CreateTopicsRequest,
) -> (
    CreateTopicsRequest,
    Vec<create_topics_response::CreatableTopicResult>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.may_create_topic(cx, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            create_topics_response::CreatableTopicResult::default()
                .with_name(t.name)
                .with_error_code(TOPIC_DENIED)
                .with_error_message(Some(StrBytes::from_static_str("Authorization failed.")))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
        })
        .collect();
    (req, denied)
}

fn authorize_delete_topics(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DeleteTopicsRequest,
) -> (
    DeleteTopicsRequest,
    Vec<delete_topics_response::DeletableTopicResult>,
) {
    use delete_topics_response::DeletableTopicResult;
    let may = |name: &str| b.on_topic(cx, Operation::Delete, name);
    let (ok, denied) = split(std::mem::take(&mut req.topic_names), |n| may(n));
    req.topic_names = ok;
    let mut out: Vec<DeletableTopicResult> = denied
        .into_iter()
        .map(|n| {
            DeletableTopicResult::default()
                .with_name(Some(n))
                .with_error_code(TOPIC_DENIED)
        })
        .collect();
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        let name = match &t.name {
            Some(n) => Some(n.0.to_string()),
            None => b
                .catalog
                .topic_by_id(t.topic_id)
                .map(|t| t.name().to_string()),
        };
        name.is_none_or(|n| may(&n))
    });
    req.topics = ok;
    out.extend(denied.into_iter().map(|t| {
        DeletableTopicResult::default()
            .with_name(t.name)
            .with_topic_id(t.topic_id)
            .with_error_code(TOPIC_DENIED)
    }));
    (req, out)
}

fn authorize_create_partitions(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: CreatePartitionsRequest,
) -> (
    CreatePartitionsRequest,
    Vec<create_partitions_response::CreatePartitionsTopicResult>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Alter, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            create_partitions_response::CreatePartitionsTopicResult::default()
                .with_name(t.name)
                .with_error_code(TOPIC_DENIED)
        })
        .collect();
    (req, denied)
}

/// A cluster-wide change that failed: the code, and why.
fn cluster_error(e: ClusterError) -> (i16, String) {
    let code = match &e {
        ClusterError::TopicExists(_) => ResponseError::TopicAlreadyExists,
        ClusterError::UnknownTopic(_) => ResponseError::UnknownTopicOrPartition,
        ClusterError::InvalidPartitions { .. } => ResponseError::InvalidPartitions,
        e if e.is_retriable() => ResponseError::RequestTimedOut,
        _ => ResponseError::InvalidRequest,
    };
    (code.code(), e.to_string())
}

fn catalog_error(e: CatalogError) -> (i16, String) {
    (catalog_error_code(&e), e.to_string())
}

pub(super) async fn create_topics(
    broker: Arc<Broker>,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let mut topics = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        topics.push({
            let name = t.name.0.to_string();
            let partitions = if !t.assignments.is_empty() {
                t.assignments.len() as i32
            } else if t.num_partitions == -1 {
                broker.settings.num_partitions
            } else {
                t.num_partitions
            };
            // A manual assignment names each partition's replicas, and so the factor.
            let requested = match t.assignments.first() {
                Some(a) => i16::try_from(a.broker_ids.len()).unwrap_or(i16::MAX),
                None => t.replication_factor,
            };
            let configs: Vec<(&str, Option<&str>)> = t
                .configs
                .iter()
                .map(|c| (c.name.as_str(), c.value.as_deref()))
                .collect();
            // Live brokers: alone, this one; in a cluster, those registered in etcd.
            let registered = brokers(&broker, None).len();
            let validated = new_topic_assignment(&broker, &t.assignments).and_then(|()| {
                broker
                    .catalog
                    .validate_new_topic(&name, partitions, requested, registered, &configs)
                    .map_err(catalog_error)
            });
            let result = match (&broker.cluster, validated) {
                (_, Err(e)) => Err(e),
                (_, Ok((c, factor))) if req.validate_only => Ok((c, factor, None)),
                (Some(cluster), Ok((c, factor))) => cluster
                    .topics()
                    .create(&name, partitions, factor, c.overrides.clone())
                    .await
                    .map(|r| (c, r.replication_factor, Some(r.id)))
                    .map_err(cluster_error),
                (None, Ok((_, factor))) => broker
                    .catalog
                    .create_topic(&name, partitions, requested, &configs)
                    .map(|t| (t.config(), factor, Some(t.id())))
                    .map_err(catalog_error),
            };
            let resp = CreatableTopicResult::default().with_name(t.name.clone());
            match result {
                Ok((config, factor, id)) => {
                    let resp = resp
                        .with_num_partitions(partitions)
                        .with_replication_factor(factor);
                    let resp = if version >= 7 {
                        resp.with_topic_id(id.unwrap_or_default())
                    } else {
                        resp
                    };
                    resp.with_configs(Some(config_entries(&config)))
                }
                Err((code, message)) => resp
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(message))),
            }
        });
    }
    CreateTopicsResponse::default().with_topics(topics)
}

fn config_entries(config: &TopicConfig) -> Vec<CreatableTopicConfigs> {
    TOPIC_CONFIGS
        .iter()
        .filter_map(|d| {
            let (value, is_override) = config.get(d.name)?;
            Some(
                CreatableTopicConfigs::default()
                    .with_name(StrBytes::from_static_str(d.name))
                    .with_value(Some(StrBytes::from_string(value.to_string())))
                    .with_config_source(if is_override {
                        CONFIG_SOURCE_TOPIC
                    } else {
                        CONFIG_SOURCE_DEFAULT
                    }),
            )
        })
        .collect()
}

pub(super) async fn delete_topics(
    broker: Arc<Broker>,
    req: DeleteTopicsRequest,
    version: i16,
) -> DeleteTopicsResponse {
    // v6 names topics by name or id; older versions send a list of names.
    let targets: Vec<(Option<String>, uuid::Uuid)> = if version >= 6 {
        req.topics
            .into_iter()
            .map(|t| (t.name.map(|n| n.0.to_string()), t.topic_id))
            .collect()
    } else {
        req.topic_names
            .into_iter()
            .map(|n| (Some(n.0.to_string()), uuid::Uuid::nil()))
            .collect()
    };
    let mut responses = Vec::with_capacity(targets.len());
    for (name, id) in targets {
        responses.push({
            let name =
                name.or_else(|| broker.catalog.topic_by_id(id).map(|t| t.name().to_string()));
            let result = match (&name, &broker.cluster) {
                (Some(n), Some(cluster)) => match cluster.topics().delete(n).await {
                    Ok(record) => Ok(record.id),
                    Err(ClusterError::UnknownTopic(_)) => Err(CatalogError::UnknownTopic),
                    Err(e) => Err(CatalogError::InvalidTopic(e.to_string())),
                }
                .inspect(|_| broker.coordinator.forget_topic(n)),
                (Some(n), None) => broker
                    .catalog
                    .delete_topic(n)
                    .inspect(|_| broker.coordinator.forget_topic(n)),
                (None, _) => Err(CatalogError::UnknownTopic),
            };
            let mut resp = DeletableTopicResult::default()
                .with_name(name.map(|n| TopicName(StrBytes::from_string(n))));
            if version >= 6 {
                resp = resp.with_topic_id(id);
            }
            match result {
                Ok(deleted_id) if version >= 6 => resp.with_topic_id(deleted_id),
                Ok(_) => resp,
                Err(CatalogError::UnknownTopic) if version >= 6 && !id.is_nil() => {
                    resp.with_error_code(ResponseError::UnknownTopicId.code())
                }
                Err(e) => resp.with_error_code(catalog_error_code(&e)),
            }
        });
    }
    DeleteTopicsResponse::default().with_responses(responses)
}

fn invalid_assignment(message: String) -> (i16, String) {
    (ResponseError::InvalidReplicaAssignment.code(), message)
}

/// Kafka's checks of a manual replica assignment (CreateTopics,
/// CreatePartitions), each answered INVALID_REPLICA_ASSIGNMENT with Kafka's
/// message: every partition names registered brokers, each once, and as
/// many as the partitions before it (`width`: for new partitions of a
/// topic, the replicas it has).
fn check_assignment<'a>(
    broker: &Broker,
    assignments: impl Iterator<Item = &'a [BrokerId]>,
    mut width: Option<usize>,
) -> Result<(), (i16, String)> {
    let registered: BTreeSet<i32> = brokers(broker, None).iter().map(|b| b.0).collect();
    for replicas in assignments {
        if replicas.is_empty() {
            return Err(invalid_assignment(
                "The manual partition assignment includes an empty replica list.".into(),
            ));
        }
        let mut seen = BTreeSet::new();
        for id in replicas {
            if !seen.insert(id.0) {
                return Err(invalid_assignment(format!(
                    "The manual partition assignment includes the broker {} more than once.",
                    id.0
                )));
            }
            if !registered.contains(&id.0) {
                return Err(invalid_assignment(format!(
                    "The manual partition assignment includes broker {}, but no such broker is registered.",
                    id.0
                )));
            }
        }
        match width {
            Some(w) if w != replicas.len() => {
                return Err(invalid_assignment(format!(
                    "The manual partition assignment includes a partition with {} replica(s), but this \
                     is not consistent with previous partitions, which have {w} replica(s).",
                    replicas.len()
                )))
            }
            _ => width = Some(replicas.len()),
        }
    }
    Ok(())
}

/// CreateTopics' assignment, if any: partitions 0, 1, ... each once, each
/// passing `check_assignment`.
fn new_topic_assignment(
    broker: &Broker,
    assignments: &[create_topics_request::CreatableReplicaAssignment],
) -> Result<(), (i16, String)> {
    let mut indexes = BTreeSet::new();
    for a in assignments {
        if !indexes.insert(a.partition_index) {
            return Err(invalid_assignment(format!(
                "Found multiple manual partition assignments for partition {}",
                a.partition_index
            )));
        }
    }
    if indexes.iter().copied().ne(0..assignments.len() as i32) {
        return Err(invalid_assignment(
            "partitions should be a consecutive 0-based integer sequence".into(),
        ));
    }
    check_assignment(broker, assignments.iter().map(|a| &a.broker_ids[..]), None)
}

/// CreatePartitions' assignment, if any: one per partition added, each
/// passing `check_assignment`.
fn new_partitions_assignment(
    broker: &Broker,
    topic: &str,
    count: i32,
    assignments: Option<&[create_partitions_request::CreatePartitionsAssignment]>,
) -> Result<(), (i16, String)> {
    let (Some(assignments), Some(t)) = (assignments, broker.catalog.topic(topic)) else {
        return Ok(());
    };
    let added = i64::from(count) - t.partition_count() as i64;
    if added <= 0 {
        return Ok(()); // not an increase: the catalog says so
    }
    if assignments.len() as i64 != added {
        return Err(invalid_assignment(format!(
            "Attempted to add {added} additional partition(s), but only {} assignment(s) were specified.",
            assignments.len()
        )));
    }
    let factor = super::metadata::placement(broker, &t, 0).map(|p| p.replicas.len());
    check_assignment(
        broker,
        assignments.iter().map(|a| &a.broker_ids[..]),
        factor,
    )
}

pub(super) async fn create_partitions(
    broker: Arc<Broker>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let resp = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let name = t.name.0.as_str();
        // The catalog checks the count either way (and does all the work alone).
        let validate_only = req.validate_only || broker.cluster.is_some();
        let mut result =
            new_partitions_assignment(&broker, name, t.count, t.assignments.as_deref()).and_then(
                |()| {
                    broker
                        .catalog
                        .create_partitions(name, t.count, validate_only)
                        .map_err(catalog_error)
                },
            );
        if let (Ok(()), Some(cluster), false) = (&result, &broker.cluster, req.validate_only) {
            result = cluster
                .topics()
                .add_partitions(name, t.count)
                .await
                .map(|_| ())
                .map_err(cluster_error);
        }
        results.push(match result {
            Ok(()) => resp,
            Err((code, message)) => resp
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message))),
        });
    }
    CreatePartitionsResponse::default().with_results(results)
}
