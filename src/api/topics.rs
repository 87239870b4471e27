//! CreateTopics, DeleteTopics and CreatePartitions.

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
use super::Broker;
use crate::catalog::config::TOPIC_CONFIGS;
use crate::catalog::{CatalogError, TopicConfig};

pub fn create_topics(
    broker: &Broker,
    req: CreateTopicsRequest,
    version: i16,
) -> CreateTopicsResponse {
    let topics = req
        .topics
        .into_iter()
        .map(|t| {
            let name = t.name.0.to_string();
            let partitions = if !t.assignments.is_empty() {
                t.assignments.len() as i32
            } else if t.num_partitions == -1 {
                broker.num_partitions
            } else {
                t.num_partitions
            };
            let configs: Vec<(&str, Option<&str>)> = t
                .configs
                .iter()
                .map(|c| (c.name.as_str(), c.value.as_deref()))
                .collect();
            let result = if req.validate_only {
                broker
                    .catalog
                    .validate_new_topic(&name, partitions, t.replication_factor, &configs)
                    .map(|c| (c, None))
            } else {
                broker
                    .catalog
                    .create_topic(&name, partitions, t.replication_factor, &configs)
                    .map(|t| (t.config(), Some(t.id())))
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
                Err(e) => resp
                    .with_error_code(catalog_error_code(&e))
                    .with_error_message(Some(StrBytes::from_string(e.to_string()))),
            }
        })
        .collect();
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

pub fn delete_topics(
    broker: &Broker,
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
    let responses = targets
        .into_iter()
        .map(|(name, id)| {
            let name =
                name.or_else(|| broker.catalog.topic_by_id(id).map(|t| t.name().to_string()));
            let result = match &name {
                Some(n) => broker
                    .catalog
                    .delete_topic(n)
                    .inspect(|_| broker.coordinator.forget_topic(n)),
                None => Err(CatalogError::UnknownTopic),
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
        })
        .collect();
    DeleteTopicsResponse::default().with_responses(responses)
}

pub fn create_partitions(
    broker: &Broker,
    req: CreatePartitionsRequest,
) -> CreatePartitionsResponse {
    let results = req
        .topics
        .into_iter()
        .map(|t| {
            let resp = CreatePartitionsTopicResult::default().with_name(t.name.clone());
            match broker
                .catalog
                .create_partitions(t.name.0.as_str(), t.count, req.validate_only)
            {
                Ok(()) => resp,
                Err(e) => resp
                    .with_error_code(catalog_error_code(&e))
                    .with_error_message(Some(StrBytes::from_string(e.to_string()))),
            }
        })
        .collect();
    CreatePartitionsResponse::default().with_results(results)
}
