//! DescribeConfigs, AlterConfigs and IncrementalAlterConfigs for topics,
//! brokers and groups. A broker's settings are its flags (read-only) and the
//! dynamic configs of `broker_configs`, described with Kafka's sources and
//! synonyms; a group's are in `group_configs`.

use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_configs_response::AlterConfigsResourceResponse;
use kafka_protocol::messages::describe_configs_response::{
    DescribeConfigsResourceResult, DescribeConfigsResult, DescribeConfigsSynonym,
};
use kafka_protocol::messages::incremental_alter_configs_response::AlterConfigsResourceResponse as IncrementalResult;
use kafka_protocol::messages::*;
use kafka_protocol::messages::{
    AlterConfigsRequest, AlterConfigsResponse, DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
};
use kafka_protocol::protocol::StrBytes;

use super::authorize::{CLUSTER_DENIED, GROUP_DENIED, TOPIC_DENIED};
use super::broker_configs::{self, Change, Layers};
use super::dispatch::{api, Api, Ctx};
use super::error::catalog_error_code;
use super::group_configs;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::catalog::config::{definition, list_items, ConfigType, TOPIC_CONFIGS};
use crate::catalog::CatalogError;

pub(super) const DESCRIBE_CONFIGS: Api = api!(
    DescribeConfigsRequest,
    1..=4,
    ready(handle_describe_configs)
);
pub(super) const ALTER_CONFIGS: Api = api!(AlterConfigsRequest, 0..=2, later(handle_alter_configs));
pub(super) const INCREMENTAL_ALTER_CONFIGS: Api = api!(
    IncrementalAlterConfigsRequest,
    0..=1,
    later(handle_incremental_alter_configs)
);

error_codes! {
    DescribeConfigsResponse => |r, f| r.results.iter().for_each(|x| f(x.error_code));
    AlterConfigsResponse => |r, f| r.responses.iter().for_each(|x| f(x.error_code));
    IncrementalAlterConfigsResponse => |r, f| r.responses.iter().for_each(|x| f(x.error_code));
}

fn handle_describe_configs(
    b: &Arc<Broker>,
    r: DescribeConfigsRequest,
    cx: &Ctx<'_>,
) -> DescribeConfigsResponse {
    let (r, denied) = authorize_describe_configs(b, cx, r);
    let mut resp = describe_configs(b, r, cx.version);
    resp.results.extend(denied);
    resp
}

fn handle_alter_configs(
    b: &Arc<Broker>,
    r: AlterConfigsRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = AlterConfigsResponse> + Send + 'static {
    let (r, denied) = authorize_alter_configs(b, cx, r);
    let pending = alter_configs(b.clone(), r);
    async move {
        let mut resp = pending.await;
        resp.responses.extend(denied);
        resp
    }
}

fn handle_incremental_alter_configs(
    b: &Arc<Broker>,
    r: IncrementalAlterConfigsRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = IncrementalAlterConfigsResponse> + Send + 'static {
    let (r, denied) = authorize_incremental_alter_configs(b, cx, r);
    let pending = incremental_alter_configs(b.clone(), r);
    async move {
        let mut resp = pending.await;
        resp.responses.extend(denied);
        resp
    }
}

/// Config resources: topics (2) and groups (32) need the operation on
/// themselves, brokers (4) and broker loggers (8) the cluster one.
fn config_resource_allowed(
    b: &Broker,
    cx: &Ctx<'_>,
    kind: i8,
    name: &str,
    op: Operation,
) -> Result<(), i16> {
    match kind {
        2 if b.on_topic(cx, op, name) => Ok(()),
        2 => Err(TOPIC_DENIED),
        RESOURCE_GROUP if b.on_group(cx, op, name) => Ok(()),
        RESOURCE_GROUP => Err(GROUP_DENIED),
        _ if b.on_cluster(cx, op) => Ok(()),
        _ => Err(CLUSTER_DENIED),
    }
}

/// Keeps the resources `op` is allowed on and turns each refused one into
/// its answer, `refuse(resource, code)`.
fn retain_allowed<R, D>(
    b: &Broker,
    cx: &Ctx<'_>,
    resources: &mut Vec<R>,
    op: Operation,
    key: impl Fn(&R) -> (i8, &StrBytes),
    refuse: impl Fn(&R, i16) -> D,
) -> Vec<D> {
    let mut denied = Vec::new();
    resources.retain(|r| {
        let (kind, name) = key(r);
        match config_resource_allowed(b, cx, kind, name, op) {
            Ok(()) => true,
            Err(code) => {
                denied.push(refuse(r, code));
                false
            }
        }
    });
    denied
}

fn authorize_describe_configs(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DescribeConfigsRequest,
) -> (
    DescribeConfigsRequest,
    Vec<describe_configs_response::DescribeConfigsResult>,
) {
    let denied = retain_allowed(
        b,
        cx,
        &mut req.resources,
        Operation::DescribeConfigs,
        |r| (r.resource_type, &r.resource_name),
        |r, code| {
            describe_configs_response::DescribeConfigsResult::default()
                .with_error_code(code)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
        },
    );
    (req, denied)
}

fn authorize_alter_configs(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: AlterConfigsRequest,
) -> (
    AlterConfigsRequest,
    Vec<alter_configs_response::AlterConfigsResourceResponse>,
) {
    let denied = retain_allowed(
        b,
        cx,
        &mut req.resources,
        Operation::AlterConfigs,
        |r| (r.resource_type, &r.resource_name),
        |r, code| {
            alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
        },
    );
    (req, denied)
}

fn authorize_incremental_alter_configs(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: IncrementalAlterConfigsRequest,
) -> (
    IncrementalAlterConfigsRequest,
    Vec<incremental_alter_configs_response::AlterConfigsResourceResponse>,
) {
    let denied = retain_allowed(
        b,
        cx,
        &mut req.resources,
        Operation::AlterConfigs,
        |r| (r.resource_type, &r.resource_name),
        |r, code| {
            incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                .with_error_code(code)
                .with_resource_type(r.resource_type)
                .with_resource_name(r.resource_name.clone())
        },
    );
    (req, denied)
}

const RESOURCE_TOPIC: i8 = 2;
const RESOURCE_BROKER: i8 = 4;
const RESOURCE_GROUP: i8 = 32;

pub(super) const CONFIG_SOURCE_TOPIC: i8 = 1;
const CONFIG_SOURCE_DYNAMIC_BROKER: i8 = 2;
const CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER: i8 = 3;
pub(super) const CONFIG_SOURCE_STATIC_BROKER: i8 = 4;
pub(super) const CONFIG_SOURCE_DEFAULT: i8 = 5;

/// An error code and message for one resource.
type Failure = (i16, String);

const OP_SET: i8 = 0;
const OP_DELETE: i8 = 1;
const OP_APPEND: i8 = 2;
const OP_SUBTRACT: i8 = 3;

pub(super) struct Entry {
    pub name: String,
    /// `None` for a secret (a PASSWORD config), which Kafka never shows.
    pub value: Option<String>,
    pub source: i8,
    pub kind: ConfigType,
    pub doc: &'static str,
    pub read_only: bool,
    /// Where the value could come from, in Kafka's order of precedence: the
    /// topic override or dynamic broker configs if any, then the static or
    /// default value (for a topic, the broker-wide default under its own name).
    pub synonyms: Vec<(String, Option<String>, i8)>,
}

pub(super) fn describe_configs(
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
            let failure = |e: ResponseError| (e.code(), e.to_string());
            let entries = match r.resource_type {
                RESOURCE_TOPIC => match broker.catalog.topic(r.resource_name.as_str()) {
                    Some(t) => Ok(topic_entries(&t.config())),
                    None => Err(failure(ResponseError::UnknownTopicOrPartition)),
                },
                RESOURCE_BROKER => describe_broker(broker, r.resource_name.as_str()),
                RESOURCE_GROUP => group_configs::describe(broker, r.resource_name.as_str()),
                _ => Err(failure(ResponseError::InvalidRequest)),
            };
            let entries = match entries {
                Ok(e) => e,
                Err((code, msg)) => {
                    return result
                        .with_error_code(code)
                        .with_error_message(Some(StrBytes::from_string(msg)))
                }
            };
            // As in Kafka, no keys and an empty list both ask for everything.
            let wanted = r.configuration_keys.as_ref().filter(|k| !k.is_empty());
            let configs = entries
                .into_iter()
                .filter(|e| wanted.is_none_or(|keys| keys.iter().any(|k| k.as_str() == e.name)))
                .map(|e| {
                    let mut c = DescribeConfigsResourceResult::default()
                        .with_name(StrBytes::from_string(e.name))
                        .with_is_sensitive(e.value.is_none())
                        .with_value(e.value.map(StrBytes::from_string))
                        .with_read_only(e.read_only)
                        .with_config_source(e.source);
                    if req.include_synonyms {
                        c = c.with_synonyms(
                            e.synonyms
                                .into_iter()
                                .map(|(name, value, source)| {
                                    DescribeConfigsSynonym::default()
                                        .with_name(StrBytes::from_string(name))
                                        .with_value(value.map(StrBytes::from_string))
                                        .with_source(source)
                                })
                                .collect(),
                        );
                    }
                    if version >= 3 {
                        c = c.with_config_type(e.kind as i8);
                        if req.include_documentation && !e.doc.is_empty() {
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

/// A topic's configs as Kafka describes them: an override is a
/// TOPIC_CONFIG (the admin client's DYNAMIC_TOPIC_CONFIG); anything else is
/// the broker's default, a DEFAULT_CONFIG since this broker's topic
/// defaults are Kafka's and cannot be changed.
fn topic_entries(config: &crate::catalog::TopicConfig) -> Vec<Entry> {
    TOPIC_CONFIGS
        .iter()
        .filter_map(|d| {
            let (value, is_override) = config.get(d.name)?;
            let mut synonyms = Vec::new();
            if is_override {
                synonyms.push((
                    d.name.to_string(),
                    Some(value.to_string()),
                    CONFIG_SOURCE_TOPIC,
                ));
            }
            if let Some(broker_name) = d.broker {
                synonyms.push((
                    broker_name.to_string(),
                    Some(d.default.to_string()),
                    CONFIG_SOURCE_DEFAULT,
                ));
            }
            Some(Entry {
                name: d.name.to_string(),
                value: Some(value.to_string()),
                source: if is_override {
                    CONFIG_SOURCE_TOPIC
                } else {
                    CONFIG_SOURCE_DEFAULT
                },
                kind: d.kind,
                doc: d.doc,
                read_only: false,
                synonyms,
            })
        })
        .collect()
}

/// One broker setting under its Kafka name, as the broker's flags set it.
#[derive(Debug, Clone)]
pub(crate) struct StaticConfig {
    pub name: &'static str,
    pub value: String,
    pub kind: ConfigType,
}

/// The type of a config the broker describes (dynamic or not), if it has it.
pub(super) fn reported_kind(broker: &Broker, name: &str) -> Option<ConfigType> {
    broker_entries(broker)
        .into_iter()
        .find(|e| e.name == name)
        .map(|e| e.kind)
}

/// A BROKER resource as Kafka describes it on the broker asked: `""` is the
/// cluster default, only its dynamic configs; this broker's id is every
/// setting with the dynamic configs in force over the static ones; any
/// other id is another broker's to describe.
fn describe_broker(broker: &Broker, name: &str) -> Result<Vec<Entry>, Failure> {
    broker_configs::check_resource_name(broker, name).map_err(|(code, _)| {
        (
            code,
            format!(
                "Unexpected broker id, expected {} or empty string, but received {name}",
                broker.settings.node_id
            ),
        )
    })?;
    let layers = broker.dynamic.layers();
    if name.is_empty() {
        return Ok(layers
            .default
            .iter()
            .map(|(k, v)| dynamic_entry(k, v, CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER))
            .collect());
    }
    let mut entries = broker_entries(broker);
    for e in &mut entries {
        overlay(e, &layers);
    }
    // Dynamic configs no flag sets (a listener's keystore): their own entries.
    for (k, v) in &layers.broker {
        if !entries.iter().any(|e| &e.name == k) {
            entries.push(dynamic_entry(k, v, CONFIG_SOURCE_DYNAMIC_BROKER));
        }
    }
    Ok(entries)
}

/// A value shown unless it is a secret.
fn shown(name: &str, value: &str) -> Option<String> {
    (!broker_configs::sensitive(name)).then(|| value.to_string())
}

fn dynamic_entry(name: &str, value: &str, source: i8) -> Entry {
    let kind = broker_configs::dynamic(name).map_or(ConfigType::String, |(k, _)| k);
    Entry {
        name: name.to_string(),
        value: shown(name, value),
        source,
        kind,
        doc: "",
        read_only: false,
        synonyms: vec![(name.to_string(), shown(name, value), source)],
    }
}

/// Puts the dynamic configs in force over a static entry of the same name,
/// with the synonyms in Kafka's order: this broker's, the default, then
/// the static or default value.
fn overlay(e: &mut Entry, layers: &Layers) {
    if broker_configs::dynamic(&e.name).is_none() {
        return;
    }
    e.read_only = false;
    let mut synonyms = Vec::new();
    for (layer, source) in [
        (&layers.broker, CONFIG_SOURCE_DYNAMIC_BROKER),
        (&layers.default, CONFIG_SOURCE_DYNAMIC_DEFAULT_BROKER),
    ] {
        if let Some(v) = layer.get(&e.name) {
            synonyms.push((e.name.clone(), shown(&e.name, v), source));
        }
    }
    if let Some((_, value, source)) = synonyms.first().cloned() {
        e.value = value;
        e.source = source;
    }
    synonyms.append(&mut e.synonyms);
    e.synonyms = synonyms;
}

/// The broker's settings under Kafka's names: those its flags set
/// (STATIC_BROKER_CONFIG, from the server's table of flags), Kafka's fixed
/// values for what cannot be changed here (DEFAULT_CONFIG), then the
/// broker-wide defaults of the topic configs. Read-only except the dynamic
/// configs, which `describe_broker` lays over them.
fn broker_entries(broker: &Broker) -> Vec<Entry> {
    let entry = |name: &'static str, value: String, kind: ConfigType, source: i8| Entry {
        name: name.to_string(),
        value: Some(value.clone()),
        source,
        kind,
        doc: "",
        read_only: true,
        synonyms: vec![(name.to_string(), Some(value), source)],
    };
    let fixed =
        |name, value: &str, kind| entry(name, value.to_string(), kind, CONFIG_SOURCE_DEFAULT);
    let roles = if broker.cluster.is_some() {
        "broker"
    } else {
        "broker,controller"
    };
    let mut entries: Vec<Entry> = broker
        .settings
        .static_configs
        .iter()
        .map(|c| entry(c.name, c.value.clone(), c.kind, CONFIG_SOURCE_STATIC_BROKER))
        .collect();
    entries.extend([
        fixed("process.roles", roles, ConfigType::List),
        entry(
            "advertised.listeners",
            broker
                .endpoints
                .iter()
                .map(|e| format!("{}://{}:{}", e.name, e.host, e.port))
                .collect::<Vec<_>>()
                .join(","),
            ConfigType::List,
            CONFIG_SOURCE_STATIC_BROKER,
        ),
        // Data is kept once, in the object store; there are no follower
        // replicas. A factor only says how many brokers a partition is
        // described with, and the broker's own topics are described alone.
        fixed(
            "default.replication.factor",
            &crate::catalog::DEFAULT_REPLICATION_FACTOR.to_string(),
            ConfigType::Int,
        ),
        fixed("offsets.topic.replication.factor", "1", ConfigType::Int),
        fixed("offsets.topic.num.partitions", "1", ConfigType::Int),
        fixed(
            "transaction.state.log.replication.factor",
            "1",
            ConfigType::Int,
        ),
        fixed("log.retention.hours", "168", ConfigType::Int),
        fixed(
            "group.coordinator.rebalance.protocols",
            "classic,consumer",
            ConfigType::List,
        ),
        fixed("offset.metadata.max.bytes", "4096", ConfigType::Int),
        fixed(
            "remote.log.storage.system.enable",
            "true",
            ConfigType::Boolean,
        ),
        fixed(
            "max.incremental.fetch.session.cache.slots",
            &super::fetch_session::CACHE_SLOTS.to_string(),
            ConfigType::Int,
        ),
    ]);
    entries.extend(TOPIC_CONFIGS.iter().filter_map(|d| {
        let name = d.broker?;
        Some(Entry {
            name: name.to_string(),
            value: Some(d.default.to_string()),
            source: CONFIG_SOURCE_DEFAULT,
            kind: d.kind,
            doc: d.doc,
            read_only: true,
            synonyms: vec![(
                name.to_string(),
                Some(d.default.to_string()),
                CONFIG_SOURCE_DEFAULT,
            )],
        })
    }));
    entries
}

fn unsupported(resource_type: i8) -> Failure {
    (
        ResponseError::InvalidRequest.code(),
        format!("Unknown resource type {resource_type}"),
    )
}

/// Kafka's checks of a BROKER or GROUP resource's changes before anything
/// else: each config named once, values given except to delete, known
/// operations. They become the changes to make.
fn checked_changes(configs: &[(&str, Option<&str>, i8)]) -> Result<Vec<Change>, Failure> {
    let invalid = |msg: String| (ResponseError::InvalidRequest.code(), msg);
    let mut seen = std::collections::HashSet::new();
    if !configs.iter().all(|(n, _, _)| seen.insert(*n)) {
        return Err(invalid("Error due to duplicate config keys".into()));
    }
    let nulls: Vec<&str> = configs
        .iter()
        .filter(|(_, v, op)| v.is_none() && *op != OP_DELETE)
        .map(|(n, _, _)| *n)
        .collect();
    if !nulls.is_empty() {
        return Err(invalid(format!(
            "Null value not supported for : {}",
            nulls.join(", ")
        )));
    }
    if let Some((_, _, op)) = configs.iter().find(|(_, _, op)| !(0..=3).contains(op)) {
        return Err(invalid(format!("Unknown operations type {op}")));
    }
    Ok(configs
        .iter()
        .map(|(n, v, op)| {
            let (n, v) = (n.to_string(), v.unwrap_or_default().to_string());
            match *op {
                OP_SET => Change::Set(n, v),
                OP_DELETE => Change::Delete(n),
                OP_APPEND => Change::Append(n, v),
                _ => Change::Subtract(n, v),
            }
        })
        .collect())
}

/// The BROKER resources named more than once: Kafka refuses each of them.
fn repeated_brokers<'a>(resources: impl Iterator<Item = (i8, &'a str)>) -> Vec<String> {
    let mut seen = std::collections::HashMap::new();
    for (kind, name) in resources.filter(|(k, _)| *k == RESOURCE_BROKER) {
        *seen.entry((kind, name)).or_insert(0) += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|((_, name), _)| name.to_string())
        .collect()
}

/// Alters a BROKER or GROUP resource after Kafka's checks of the request.
/// `repeated`: the BROKER resources the request names more than once.
async fn alter_dynamic(
    broker: &Broker,
    kind: i8,
    name: &str,
    configs: &[(&str, Option<&str>, i8)],
    replace: bool,
    validate_only: bool,
    repeated: &[String],
) -> Result<(), Failure> {
    if kind == RESOURCE_GROUP {
        let changes = checked_changes(configs)?;
        return group_configs::alter(broker, name, changes, replace, validate_only).await;
    }
    if repeated.iter().any(|r| r == name) {
        return Err((
            ResponseError::InvalidRequest.code(),
            "Each resource must appear at most once.".into(),
        ));
    }
    let changes = checked_changes(configs)?;
    broker_configs::check_resource_name(broker, name)?;
    broker_configs::alter(broker, name, changes, replace, validate_only).await
}

fn error_pair(e: CatalogError) -> Failure {
    (catalog_error_code(&e), e.to_string())
}

/// Applies `changes` to topic `name`: in the catalog alone, or in cluster
/// mode in etcd, which every broker's catalog follows.
async fn alter_topic(
    broker: &Broker,
    name: &str,
    changes: &[(&str, Option<&str>)],
    replace: bool,
    validate_only: bool,
) -> Result<(), Failure> {
    let Some(cluster) = &broker.cluster else {
        return broker
            .catalog
            .alter_config(name, changes, replace, validate_only)
            .map_err(error_pair);
    };
    let next = broker
        .catalog
        .altered_config(name, changes, replace)
        .map_err(error_pair)?;
    if validate_only {
        return Ok(());
    }
    cluster
        .topics()
        .alter_config(name, next.overrides)
        .await
        .map(|_| ())
        .map_err(|e| {
            let code = if e.is_retriable() {
                ResponseError::RequestTimedOut
            } else {
                ResponseError::InvalidRequest
            };
            (code.code(), e.to_string())
        })
}

pub(super) async fn alter_configs(
    broker: Arc<Broker>,
    req: AlterConfigsRequest,
) -> AlterConfigsResponse {
    let mut responses = Vec::with_capacity(req.resources.len());
    let repeated = repeated_brokers(
        req.resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.as_str())),
    );
    for r in req.resources {
        responses.push({
            let kind = r.resource_type;
            let result = if kind == RESOURCE_BROKER || kind == RESOURCE_GROUP {
                let configs: Vec<(&str, Option<&str>, i8)> = r
                    .configs
                    .iter()
                    .map(|c| (c.name.as_str(), c.value.as_deref(), OP_SET))
                    .collect();
                let name = r.resource_name.as_str();
                let only = req.validate_only;
                alter_dynamic(&broker, kind, name, &configs, true, only, &repeated).await
            } else if kind != RESOURCE_TOPIC {
                Err(unsupported(r.resource_type))
            } else {
                let changes: Vec<(&str, Option<&str>)> = r
                    .configs
                    .iter()
                    .map(|c| (c.name.as_str(), c.value.as_deref()))
                    .collect();
                let name = r.resource_name.as_str();
                alter_topic(&broker, name, &changes, true, req.validate_only).await
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
        });
    }
    AlterConfigsResponse::default().with_responses(responses)
}

pub(super) async fn incremental_alter_configs(
    broker: Arc<Broker>,
    req: IncrementalAlterConfigsRequest,
) -> IncrementalAlterConfigsResponse {
    let mut responses = Vec::with_capacity(req.resources.len());
    let repeated = repeated_brokers(
        req.resources
            .iter()
            .map(|r| (r.resource_type, r.resource_name.as_str())),
    );
    for r in req.resources {
        let name = r.resource_name.as_str();
        let kind = r.resource_type;
        let result = if kind == RESOURCE_BROKER || kind == RESOURCE_GROUP {
            let configs: Vec<(&str, Option<&str>, i8)> = r
                .configs
                .iter()
                .map(|c| (c.name.as_str(), c.value.as_deref(), c.config_operation))
                .collect();
            let only = req.validate_only;
            alter_dynamic(&broker, kind, name, &configs, false, only, &repeated).await
        } else if kind != RESOURCE_TOPIC {
            Err(unsupported(r.resource_type))
        } else {
            match incremental_changes(&broker, name, &r.configs) {
                Ok(changes) => {
                    let changes: Vec<(&str, Option<&str>)> = changes
                        .iter()
                        .map(|(k, v)| (k.as_str(), v.as_deref()))
                        .collect();
                    alter_topic(&broker, name, &changes, false, req.validate_only).await
                }
                Err(e) => Err(e),
            }
        };
        let resp = IncrementalResult::default()
            .with_resource_type(r.resource_type)
            .with_resource_name(r.resource_name);
        responses.push(match result {
            Ok(()) => resp,
            Err((code, msg)) => resp
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(msg))),
        });
    }
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
                        let op = if op.config_operation == OP_APPEND {
                            "append"
                        } else {
                            "subtract"
                        };
                        return Err(invalid(format!(
                            "Config value {op} is not allowed for config key: {name}"
                        )));
                    }
                    let mut items: Vec<String> = current
                        .get(&name)
                        .map(|(v, _)| list_items(v).into_iter().map(String::from).collect())
                        .unwrap_or_default();
                    for item in list_items(&value.unwrap_or_default()) {
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
