//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics, and
//! a read-only view of the broker's own settings.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalResult;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::error::catalog_error_code;
use super::Broker;
use crate::catalog::config::{definition, ConfigType, TOPIC_CONFIGS};
use crate::catalog::CatalogError;

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;

pub const CONFIG_SOURCE_TOPIC: i8 = 1;
const CONFIG_SOURCE_STATIC_BROKER: i8 = 4;
pub const CONFIG_SOURCE_DEFAULT: i8 = 5;

/// An error code and message for one resource.
type Failure = (i16, String);

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

struct Entry {
    name: String,
    value: String,
    source: i8,
    kind: ConfigType,
    doc: &'static str,
    read_only: bool,
}

pub fn describe_configs(
    broker: &Broker,
    req: DescribeConfigsRequest,
    version: i16,
) -> DescribeConfigsResponse {
    let results = req
        .resources
        .into_iter()
        .map(|r| {
            let result = DescribeConfigsResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone());
            let entries = match r.resource_type {
                RESOURCE_TOPIC => match broker.catalog.topic(r.resource_name.as_str()) {
                    Some(t) => Ok(topic_entries(&t.config())),
                    None => Err(ResponseError::UnknownTopicOrPartition),
                },
                RESOURCE_BROKER => Ok(broker_entries(broker)),
                _ => Err(ResponseError::InvalidRequest),
            };
            let entries = match entries {
                Ok(e) => e,
                Err(code) => {
                    return result
                        .with_error_code(code.code())
                        .with_error_message(Some(StrBytes::from_string(code.to_string())))
                }
            };
            let wanted = r.configuration_keys.as_ref();
            let configs = entries
                .into_iter()
                .filter(|e| wanted.is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name)))
                .map(|e| {
                    let value = Some(StrBytes::from_string(e.value));
                    let mut c = DescribeConfigsResourceResult::default()
                        .with_name(StrBytes::from_string(e.name.clone()))
                        .with_value(value.clone())
                        .with_read_only(e.read_only)
                        .with_config_source(e.source);
                    if req.include_synonyms {
                        c = c.with_synonyms(vec![DescribeConfigsSynonym::default()
                            .with_name(StrBytes::from_string(e.name))
                            .with_value(value)
                            .with_source(e.source)]);
                    }
                    if version >= 3 {
                        c = c.with_config_type(e.kind as i8);
                        if req.include_documentation {
                            c = c.with_documentation(Some(StrBytes::from_static_str(e.doc)));
                        }
                    }
                    c
                })
                .collect();
            result.with_configs(configs)
        })
        .collect();
    DescribeConfigsResponse::default().with_results(results)
}

fn topic_entries(config: &crate::catalog::TopicConfig) -> Vec<Entry> {
    TOPIC_CONFIGS
        .iter()
        .filter_map(|d| {
            let (value, is_override) = config.get(d.name)?;
            Some(Entry {
                name: d.name.to_string(),
                value: value.to_string(),
                source: if is_override {
                    CONFIG_SOURCE_TOPIC
                } else {
                    CONFIG_SOURCE_DEFAULT
                },
                kind: d.kind,
                doc: d.doc,
                read_only: false,
            })
        })
        .collect()
}

fn broker_entries(broker: &Broker) -> Vec<Entry> {
    let entry = |name: &str, value: String, kind: ConfigType| Entry {
        name: name.to_string(),
        value,
        source: CONFIG_SOURCE_STATIC_BROKER,
        kind,
        doc: "",
        read_only: true,
    };
    let default = |name: &str| {
        definition(name)
            .map(|d| d.default.to_string())
            .unwrap_or_default()
    };
    vec![
        entry("node.id", broker.node_id.to_string(), ConfigType::Int),
        entry("broker.id", broker.node_id.to_string(), ConfigType::Int),
        entry(
            "num.partitions",
            broker.num_partitions.to_string(),
            ConfigType::Int,
        ),
        entry(
            "auto.create.topics.enable",
            broker.auto_create_topics.to_string(),
            ConfigType::Boolean,
        ),
        entry("default.replication.factor", "1".into(), ConfigType::Int),
        entry(
            "message.max.bytes",
            default("max.message.bytes"),
            ConfigType::Int,
        ),
        entry(
            "log.segment.bytes",
            default("segment.bytes"),
            ConfigType::Int,
        ),
        entry(
            "log.retention.ms",
            default("retention.ms"),
            ConfigType::Long,
        ),
        entry(
            "log.cleanup.policy",
            default("cleanup.policy"),
            ConfigType::List,
        ),
    ]
}

fn not_a_topic(resource_type: i8) -> Failure {
    if resource_type == RESOURCE_BROKER {
        (
            ResponseError::InvalidRequest.code(),
            "Broker configs are read-only in Strata; set them with flags".into(),
        )
    } else {
        (
            ResponseError::InvalidRequest.code(),
            format!("Unsupported resource type {resource_type}"),
        )
    }
}

fn error_pair(e: CatalogError) -> Failure {
    (catalog_error_code(&e), e.to_string())
}

pub fn alter_configs(broker: &Broker, req: AlterConfigsRequest) -> AlterConfigsResponse {
    let responses = req
        .resources
        .into_iter()
        .map(|r| {
            let result = if r.resource_type != RESOURCE_TOPIC {
                Err(not_a_topic(r.resource_type))
            } else {
                let changes: Vec<(&str, Option<&str>)> = r
                    .configs
                    .iter()
                    .map(|c| (c.name.as_str(), c.value.as_deref()))
                    .collect();
                broker
                    .catalog
                    .alter_config(r.resource_name.as_str(), &changes, true, req.validate_only)
                    .map_err(error_pair)
            };
            let resp = AlterConfigsResourceResponse::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name);
            match result {
                Ok(()) => resp,
                Err((code, msg)) => resp
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(msg))),
            }
        })
        .collect();
    AlterConfigsResponse::default().with_responses(responses)
}

pub fn incremental_alter_configs(
    broker: &Broker,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let responses = req
        .resources
        .into_iter()
        .map(|r| {
            let result = if r.resource_type != RESOURCE_TOPIC {
                Err(not_a_topic(r.resource_type))
            } else {
                incremental_changes(broker, r.resource_name.as_str(), &r.configs).and_then(
                    |changes| {
                        let changes: Vec<(&str, Option<&str>)> = changes
                            .iter()
                            .map(|(k, v)| (k.as_str(), v.as_deref()))
                            .collect();
                        broker
                            .catalog
                            .alter_config(
                                r.resource_name.as_str(),
                                &changes,
                                false,
                                req.validate_only,
                            )
                            .map_err(error_pair)
                    },
                )
            };
            let resp = IncrementalResult::default()
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name);
            match result {
                Ok(()) => resp,
                Err((code, msg)) => resp
                    .with_error_code(code)
                    .with_error_message(Some(StrBytes::from_string(msg))),
            }
        })
        .collect();
    IncrementalAlterConfigsResponse::default().with_responses(responses)
}

/// Turns SET/DELETE/APPEND/SUBTRACT operations into plain set/delete changes.
fn incremental_changes(
    broker: &Broker,
    topic: &str,
    ops: &[kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig],
) -> Result<Vec<(String, Option<String>)>, Failure> {
    let current = broker
        .catalog
        .topic(topic)
        .ok_or_else(|| error_pair(CatalogError::UnknownTopic))?
        .config();
    let invalid = |msg: String| (ResponseError::InvalidConfig.code(), msg);
    ops.iter()
        .map(|op| {
            let name = op.name.to_string();
            let value = op.value.as_ref().map(|v| v.to_string());
            match op.config_operation {
                OP_SET => Ok((name, Some(value.unwrap_or_default()))),
                OP_DELETE => Ok((name, None)),
                OP_APPEND | OP_SUBTRACT => {
                    let def = definition(&name)
                        .ok_or_else(|| invalid(format!("Unknown topic config name: {name}")))?;
                    if def.kind != ConfigType::List {
                        return Err(invalid(format!(
                            "Config {name} is not a list; APPEND and SUBTRACT need one"
                        )));
                    }
                    let mut items: Vec<String> = current
                        .get(&name)
                        .map(|(v, _)| {
                            v.split(',')
                                .map(|s| s.trim().to_string())
                                .filter(|s| !s.is_empty())
                                .collect()
                        })
                        .unwrap_or_default();
                    for item in value
                        .unwrap_or_default()
                        .split(',')
                        .map(str::trim)
                        .filter(|s| !s.is_empty())
                    {
                        if op.config_operation == OP_APPEND {
                            if !items.iter().any(|i| i == item) {
                                items.push(item.to_string());
                            }
                        } else {
                            items.retain(|i| i != item);
                        }
                    }
                    Ok((name, Some(items.join(","))))
                }
                other => Err(invalid(format!("Unknown config operation {other}"))),
            }
        })
        .collect()
}
