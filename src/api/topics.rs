//! CreateTopics, DeleteTopics and CreatePartitions: in the local catalog
//! when the broker runs alone; in cluster mode in etcd, from where every
//! broker's catalog mirrors them.

use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::create_partitions_response::CreatePartitionsTopicResult;
use kafka_protocol::messages::create_topics_response::{
    CreatableTopicConfigs, CreatableTopicResult,
};
use kafka_protocol::messages::delete_topics_response::DeletableTopicResult;
use kafka_protocol::messages::{
    CreatePartitionsRequest, CreatePartitionsResponse, CreateTopicsRequest, CreateTopicsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::configs::CONFIG_SOURCE_DEFAULT;
use super::configs::CONFIG_SOURCE_TOPIC;
use super::error::catalog_error_code;
use super::metrics::error_codes;
use super::Broker;
use crate::catalog::config::TOPIC_CONFIGS;
use crate::catalog::{CatalogError, TopicConfig};
use crate::cluster::ClusterError;

error_codes! {
    CreateTopicsResponse => |r, f| r.topics.iter().for_each(|t| f(t.error_code));
    DeleteTopicsResponse => |r, f| r.responses.iter().for_each(|t| f(t.error_code));
    CreatePartitionsResponse => |r, f| r.results.iter().for_each(|x| f(x.error_code));
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

pub async fn create_topics(
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
            let configs: Vec<(&str, Option<&str>)> = t
                .configs
                .iter()
                .map(|c| (c.name.as_str(), c.value.as_deref()))
                .collect();
            let validated = broker
                .catalog
                .validate_new_topic(&name, partitions, t.replication_factor, &configs)
                .map_err(catalog_error);
            let result = match (&broker.cluster, validated) {
                (_, Err(e)) => Err(e),
                (_, Ok(c)) if req.validate_only => Ok((c, None)),
                (Some(cluster), Ok(c)) => cluster
                    .topics()
                    .create(&name, partitions, c.overrides.clone())
                    .await
                    .map(|r| (c, Some(r.id)))
                    .map_err(cluster_error),
                (None, Ok(_)) => broker
                    .catalog
                    .create_topic(&name, partitions, t.replication_factor, &configs)
                    .map(|t| (t.config(), Some(t.id())))
                    .map_err(catalog_error),
            };
            let resp = CreatableTopicResult::default().with_name(t.name.clone());
            match result {
                Ok((config, id)) => {
                    let resp = resp
                        .with_num_partitions(partitions)
                        .with_replication_factor(1);
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

pub async fn delete_topics(
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

pub async fn create_partitions(
    broker: Arc<Broker>,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let mut results = Vec::with_capacity(req.topics.len());
    for t in req.topics {
        let resp = CreatePartitionsTopicResult::default().with_name(t.name.clone());
        let name = t.name.0.as_str();
        // The catalog checks the count either way (and does all the work alone).
        let validate_only = req.validate_only || broker.cluster.is_some();
        let mut result = broker
            .catalog
            .create_partitions(name, t.count, validate_only)
            .map_err(catalog_error);
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
