//! Dynamic broker configs (Kafka's KIP-226): AlterConfigs and
//! IncrementalAlterConfigs on a BROKER resource.
//!
//! Kafka keeps two layers above a broker's static settings: the cluster-wide
//! default (the resource named `""`) and each broker's own (the resource
//! named by its id), the latter winning. Some configs may live in either
//! layer ("cluster-wide" in Kafka's documentation), some only in a broker's
//! own ("per-broker"), because they name that broker's files. Strata has the
//! connection limits of the first kind and the TLS keystores and truststores
//! of its listeners (`listener.name.<listener>.ssl.*`) of the second; every
//! other broker setting is a flag and stays read-only.
//!
//! A change is checked as Kafka checks it, on the broker the client sent it
//! to, which must be the broker it names: the resulting layer must hold
//! only dynamic names of the right types, and the runtime must be able to
//! apply the whole of it (a keystore that does not load is refused, and the
//! old one stays). Only then is it stored (the catalog on a single node,
//! etcd in a cluster, so that it survives restarts and every broker sees the
//! default) and applied. The API layer does not know connections or TLS:
//! the server hands it a [`Reconfigure`] that does.
//!
//! Kafka answers a change its broker validation refuses with
//! INVALID_REQUEST, not INVALID_CONFIG (KAFKA-13609 keeps it so for
//! compatibility), and so does Strata; INVALID_CONFIG is for what Kafka
//! refuses while preparing an incremental change (APPEND to a non-list) and
//! for names no broker has.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use parking_lot::Mutex;

use super::Broker;
use crate::catalog::config::ConfigType;

/// Config names to values.
pub(crate) type Configs = BTreeMap<String, String>;

/// What applies broker configs at runtime; the server implements it.
pub(crate) trait Reconfigure: Send + Sync {
    /// Checks that `configs`, the dynamic configs in force (the default
    /// overlaid with this broker's own), can be applied over the static
    /// settings and, with `apply`, applies them, all or nothing. The error
    /// is the message the client gets.
    fn reconfigure(&self, configs: &Configs, apply: bool) -> Result<(), String>;
}

/// An error code and message for one resource.
pub(super) type Failure = (i16, String);

/// A dynamic config outside the listener prefix: its name, Kafka's type,
/// whether only a broker's own layer may hold it (Kafka's "per-broker"
/// update mode), and the range Kafka's validator allows a number.
struct Dynamic {
    name: &'static str,
    kind: ConfigType,
    per_broker: bool,
    range: Option<(f64, f64)>,
}

const fn dynamic_config(
    name: &'static str,
    kind: ConfigType,
    per_broker: bool,
    range: Option<(f64, f64)>,
) -> Dynamic {
    Dynamic {
        name,
        kind,
        per_broker,
        range,
    }
}

/// The connection limits (cluster-wide; they take effect), then Kafka's
/// per-broker Kerberos and SASL login refresh configs. Strata has neither
/// GSSAPI nor OAUTHBEARER, so those are kept and described but change
/// nothing, exactly as on a Kafka broker without those mechanisms enabled
/// (librdkafka's admin tests alter `sasl.kerberos.min.time.before.relogin`).
const DYNAMIC: &[Dynamic] = &[
    dynamic_config(
        "max.connections",
        ConfigType::Int,
        false,
        Some((0.0, 2147483647.0)),
    ),
    dynamic_config(
        "max.connections.per.ip",
        ConfigType::Int,
        false,
        Some((0.0, 2147483647.0)),
    ),
    dynamic_config(
        "max.connections.per.ip.overrides",
        ConfigType::String,
        false,
        None,
    ),
    dynamic_config("sasl.kerberos.service.name", ConfigType::String, true, None),
    dynamic_config("sasl.kerberos.kinit.cmd", ConfigType::String, true, None),
    dynamic_config(
        "sasl.kerberos.ticket.renew.window.factor",
        ConfigType::Double,
        true,
        None,
    ),
    dynamic_config(
        "sasl.kerberos.ticket.renew.jitter",
        ConfigType::Double,
        true,
        None,
    ),
    dynamic_config(
        "sasl.kerberos.min.time.before.relogin",
        ConfigType::Long,
        true,
        None,
    ),
    dynamic_config(
        "sasl.kerberos.principal.to.local.rules",
        ConfigType::List,
        true,
        None,
    ),
    dynamic_config(
        "sasl.login.refresh.window.factor",
        ConfigType::Double,
        true,
        Some((0.5, 1.0)),
    ),
    dynamic_config(
        "sasl.login.refresh.window.jitter",
        ConfigType::Double,
        true,
        Some((0.0, 0.25)),
    ),
    dynamic_config(
        "sasl.login.refresh.min.period.seconds",
        ConfigType::Int,
        true,
        Some((0.0, 900.0)),
    ),
    dynamic_config(
        "sasl.login.refresh.buffer.seconds",
        ConfigType::Int,
        true,
        Some((0.0, 3600.0)),
    ),
];

/// Kafka's reconfigurable SSL configs (`SslConfigs.RECONFIGURABLE_CONFIGS`),
/// settable only per broker and per listener.
pub(crate) const LISTENER_SSL: &[(&str, ConfigType)] = &[
    ("ssl.keystore.type", ConfigType::String),
    ("ssl.keystore.location", ConfigType::String),
    ("ssl.keystore.password", ConfigType::Password),
    ("ssl.key.password", ConfigType::Password),
    ("ssl.keystore.certificate.chain", ConfigType::Password),
    ("ssl.keystore.key", ConfigType::Password),
    ("ssl.truststore.type", ConfigType::String),
    ("ssl.truststore.location", ConfigType::String),
    ("ssl.truststore.password", ConfigType::Password),
    ("ssl.truststore.certificates", ConfigType::Password),
];

const LISTENER_PREFIX: &str = "listener.name.";

/// `listener.name.<listener>.<base>` split into listener and base name.
pub(crate) fn listener_config(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(LISTENER_PREFIX)?.split_once('.')
}

/// A dynamic config's type and whether only a broker's own layer may hold it.
pub(super) fn dynamic(name: &str) -> Option<(ConfigType, bool)> {
    if let Some(d) = DYNAMIC.iter().find(|d| d.name == name) {
        return Some((d.kind, d.per_broker));
    }
    let (_, base) = listener_config(name)?;
    let &(_, kind) = LISTENER_SSL.iter().find(|(n, _)| *n == base)?;
    Some((kind, true))
}

/// Whether a value of this dynamic config is a secret (Kafka's PASSWORD).
pub(super) fn sensitive(name: &str) -> bool {
    matches!(dynamic(name), Some((ConfigType::Password, _)))
}

/// The two layers above the static settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Layers {
    /// The cluster-wide default (resource `""`).
    pub(crate) default: Configs,
    /// This broker's own (resource `<node id>`).
    pub(crate) broker: Configs,
}

impl Layers {
    /// What is in force: this broker's own over the default.
    pub(crate) fn effective(&self) -> Configs {
        let mut all = self.default.clone();
        all.extend(self.broker.iter().map(|(k, v)| (k.clone(), v.clone())));
        all
    }

    fn with(&self, resource: &str, configs: Configs) -> Layers {
        let mut next = self.clone();
        match resource.is_empty() {
            true => next.default = configs,
            false => next.broker = configs,
        }
        next
    }
}

/// This broker's dynamic configs, as stored and applied.
pub(crate) struct DynamicConfigs {
    reconfigure: Arc<dyn Reconfigure>,
    layers: Mutex<Layers>,
    /// Stored layers that could not be applied, so that following the store
    /// reports them once rather than every poll.
    refused: Mutex<Option<Layers>>,
    /// One change at a time on this broker.
    altering: tokio::sync::Mutex<()>,
}

/// One change to one config of a resource.
pub(super) enum Change {
    Set(String, String),
    Delete(String),
    Append(String, String),
    Subtract(String, String),
}

impl DynamicConfigs {
    pub(crate) fn new(reconfigure: Arc<dyn Reconfigure>) -> DynamicConfigs {
        DynamicConfigs {
            reconfigure,
            layers: Mutex::new(Layers::default()),
            refused: Mutex::new(None),
            altering: tokio::sync::Mutex::new(()),
        }
    }

    /// The layers in force.
    pub(crate) fn layers(&self) -> Layers {
        self.layers.lock().clone()
    }
}

fn invalid_request(msg: impl Into<String>) -> Failure {
    (ResponseError::InvalidRequest.code(), msg.into())
}

fn invalid_config(msg: impl Into<String>) -> Failure {
    (ResponseError::InvalidConfig.code(), msg.into())
}

/// A set of names as Kafka's Scala code prints one in its messages.
fn scala_set<'a>(names: impl IntoIterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.into_iter().map(String::as_str).collect();
    format!("Set({})", names.join(", "))
}

/// The resource name of a BROKER resource: `""` (the cluster default) or
/// this broker's id, as Kafka requires of the broker a change is sent to.
pub(super) fn check_resource_name(broker: &Broker, name: &str) -> Result<(), Failure> {
    if name.is_empty() {
        return Ok(());
    }
    let id: i32 = name
        .parse()
        .map_err(|_| invalid_request(format!("Node id must be an integer, but it is: {name}")))?;
    if id != broker.settings.node_id {
        return Err(invalid_request(format!(
            "Unexpected broker id, expected {}, but received {name}",
            broker.settings.node_id
        )));
    }
    Ok(())
}

/// Checks a whole layer as Kafka's `DynamicBrokerConfig.validateConfigs`
/// does, in its order: names that cannot change, security configs without
/// their listener, values of the wrong type, per-broker configs in the
/// default. `read_only(name)` says whether the broker has `name` at all.
fn validate_layer(
    configs: &Configs,
    per_broker: bool,
    read_only: &dyn Fn(&str) -> bool,
) -> Result<(), Failure> {
    let fixed: Vec<&String> = configs.keys().filter(|n| read_only(n)).collect();
    if !fixed.is_empty() {
        return Err(invalid_request(format!(
            "Cannot update these configs dynamically: {}",
            scala_set(fixed)
        )));
    }
    let unprefixed: Vec<&String> = configs
        .keys()
        .filter(|n| LISTENER_SSL.iter().any(|(s, _)| s == n))
        .collect();
    if !unprefixed.is_empty() {
        return Err(invalid_request(format!(
            "These security configs can be dynamically updated only per-listener using the listener prefix: {}",
            scala_set(unprefixed)
        )));
    }
    if let Some(unknown) = configs.keys().find(|n| dynamic(n).is_none()) {
        return Err(invalid_config(format!(
            "Unknown broker config name: {unknown}"
        )));
    }
    for (name, value) in configs {
        let (kind, _) = dynamic(name).expect("checked above");
        let why = |reason: &str| {
            invalid_request(format!(
                "Invalid value {value} for configuration {name}: {reason}"
            ))
        };
        let v = value.trim();
        let number = match kind {
            ConfigType::Int => v
                .parse::<i32>()
                .map(f64::from)
                .map_err(|_| why("Not a number of type INT"))?,
            ConfigType::Long => v
                .parse::<i64>()
                .map(|n| n as f64)
                .map_err(|_| why("Not a number of type LONG"))?,
            ConfigType::Double => v
                .parse::<f64>()
                .ok()
                .filter(|d| d.is_finite())
                .ok_or_else(|| why("Not a number of type DOUBLE"))?,
            _ => continue,
        };
        let range = DYNAMIC
            .iter()
            .find(|d| d.name == name)
            .and_then(|d| d.range);
        if let Some((min, max)) = range {
            if number < min {
                return Err(why(&format!("Value must be at least {min}")));
            }
            if number > max {
                return Err(why(&format!("Value must be no more than {max}")));
            }
        }
    }
    if !per_broker {
        let own: Vec<&String> = configs
            .keys()
            .filter(|n| matches!(dynamic(n), Some((_, true))))
            .collect();
        if !own.is_empty() {
            return Err(invalid_request(format!(
                "Cannot update these configs at default cluster level, broker id must be specified: {}",
                scala_set(own)
            )));
        }
    }
    Ok(())
}

/// The layer `changes` make of `current`: with `replace` (legacy
/// AlterConfigs) the changes are the whole layer. APPEND and SUBTRACT are
/// Kafka's, for list configs only; `kind(name)` is the type of any config
/// the broker has.
pub(super) fn changed(
    current: &Configs,
    changes: &[Change],
    replace: bool,
    kind: &dyn Fn(&str) -> Option<ConfigType>,
) -> Result<Configs, Failure> {
    let mut next = if replace {
        Configs::new()
    } else {
        current.clone()
    };
    for change in changes {
        match change {
            Change::Set(name, value) => {
                next.insert(name.clone(), value.clone());
            }
            Change::Delete(name) => {
                next.remove(name);
            }
            Change::Append(name, value) | Change::Subtract(name, value) => {
                let append = matches!(change, Change::Append(..));
                match kind(name) {
                    None => return Err(invalid_config(format!("Unknown config name: {name}"))),
                    Some(ConfigType::List) => {}
                    Some(_) => {
                        return Err(invalid_config(format!(
                            "Config value {} is not allowed for config key: {name}",
                            if append { "append" } else { "subtract" }
                        )))
                    }
                }
                let mut items: Vec<String> = next
                    .get(name)
                    .map(|v| {
                        v.split(',')
                            .filter(|s| !s.is_empty())
                            .map(String::from)
                            .collect()
                    })
                    .unwrap_or_default();
                for item in value.split(',') {
                    if append {
                        if !items.iter().any(|i| i == item) {
                            items.push(item.to_string());
                        }
                    } else {
                        items.retain(|i| i != item);
                    }
                }
                next.insert(name.clone(), items.join(","));
            }
        }
    }
    Ok(next)
}

/// The type of any config the broker has, dynamic or read-only.
fn kind_of(broker: &Broker, name: &str) -> Option<ConfigType> {
    dynamic(name)
        .map(|(k, _)| k)
        .or_else(|| super::configs::reported_kind(broker, name))
}

/// A config the broker has and cannot change.
fn read_only(broker: &Broker, name: &str) -> bool {
    dynamic(name).is_none() && super::configs::reported_kind(broker, name).is_some()
}

/// Checks, stores and applies `changes` to BROKER resource `resource`
/// (already checked to be `""` or this broker's id).
pub(super) async fn alter(
    broker: &Broker,
    resource: &str,
    changes: Vec<Change>,
    replace: bool,
    validate_only: bool,
) -> Result<(), Failure> {
    let dynamic_configs = &broker.dynamic;
    let _one_at_a_time = dynamic_configs.altering.lock().await;
    let per_broker = !resource.is_empty();
    let prepare = |current: &Configs| -> Result<Configs, Failure> {
        let next = changed(current, &changes, replace, &|n| kind_of(broker, n))?;
        validate_layer(&next, per_broker, &|n| read_only(broker, n))?;
        let layers = dynamic_configs.layers().with(resource, next.clone());
        dynamic_configs
            .reconfigure
            .reconfigure(&layers.effective(), false)
            .map_err(invalid_request)?;
        Ok(next)
    };
    let stored = match &broker.cluster {
        None => {
            let current = broker
                .catalog
                .broker_configs(resource)
                .map_err(|e| (ResponseError::UnknownServerError.code(), e.to_string()))?;
            let next = prepare(&current)?;
            if validate_only {
                return Ok(());
            }
            broker
                .catalog
                .set_broker_configs(resource, next.clone())
                .map_err(|e| (ResponseError::UnknownServerError.code(), e.to_string()))?;
            next
        }
        Some(cluster) => {
            let store = cluster.broker_configs();
            if validate_only {
                let current = store.get(resource).await.map_err(etcd_failure)?;
                return prepare(&current).map(|_| ());
            }
            store
                .update(resource, prepare)
                .await
                .map_err(etcd_failure)??
        }
    };
    let layers = dynamic_configs.layers().with(resource, stored);
    apply(dynamic_configs, layers);
    Ok(())
}

/// An etcd failure as the client sees it: retriable ones time out.
pub(super) fn etcd_failure(e: crate::cluster::ClusterError) -> Failure {
    let code = if e.is_retriable() {
        ResponseError::RequestTimedOut
    } else {
        ResponseError::UnknownServerError
    };
    (code.code(), e.to_string())
}

/// Applies `layers` and records them as in force; what cannot be applied
/// (checked before storing, so only a file that changed since) is logged
/// and the previous configs stay.
fn apply(dynamic_configs: &DynamicConfigs, layers: Layers) {
    if *dynamic_configs.layers.lock() == layers {
        return;
    }
    match dynamic_configs
        .reconfigure
        .reconfigure(&layers.effective(), true)
    {
        Ok(()) => {
            tracing::info!(configs = ?redacted(&layers.effective()), "dynamic broker configs applied");
            *dynamic_configs.layers.lock() = layers;
            *dynamic_configs.refused.lock() = None;
        }
        Err(e) => {
            let mut refused = dynamic_configs.refused.lock();
            if refused.as_ref() != Some(&layers) {
                tracing::error!(error = %e, configs = ?redacted(&layers.effective()), "stored dynamic broker configs cannot be applied; keeping the previous ones");
                *refused = Some(layers);
            }
        }
    }
}

/// The configs with every secret's value hidden, for logs.
fn redacted(configs: &Configs) -> BTreeMap<&str, &str> {
    configs
        .iter()
        .map(|(k, v)| {
            let v = if sensitive(k) { "[hidden]" } else { v.as_str() };
            (k.as_str(), v)
        })
        .collect()
}

/// Reads the stored default and this broker's own configs and applies them
/// if they changed: at start-up, before any listener accepts, and in a
/// cluster every poll, to follow changes made through other brokers.
pub(crate) async fn refresh(broker: &Broker) -> Result<(), String> {
    let own = broker.settings.node_id.to_string();
    let layers = match &broker.cluster {
        None => Layers {
            default: broker
                .catalog
                .broker_configs("")
                .map_err(|e| e.to_string())?,
            broker: broker
                .catalog
                .broker_configs(&own)
                .map_err(|e| e.to_string())?,
        },
        Some(cluster) => {
            let store = cluster.broker_configs();
            Layers {
                default: store.get("").await.map_err(|e| e.to_string())?,
                broker: store.get(&own).await.map_err(|e| e.to_string())?,
            }
        }
    };
    let _not_while_altering = broker.dynamic.altering.lock().await;
    apply(&broker.dynamic, layers);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layer(pairs: &[(&str, &str)]) -> Configs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn code(r: Result<(), Failure>) -> i16 {
        r.map(|_| 0).unwrap_or_else(|(c, _)| c)
    }

    #[test]
    fn layers_are_checked_in_kafkas_order_with_its_codes() {
        let read_only = |n: &str| n == "num.partitions";
        let check = |pairs: &[(&str, &str)], per_broker| {
            validate_layer(&layer(pairs), per_broker, &read_only)
        };
        assert_eq!(code(check(&[("max.connections", "10")], false)), 0);
        let (c, msg) = check(&[("num.partitions", "3")], true).unwrap_err();
        assert_eq!(c, ResponseError::InvalidRequest.code());
        assert_eq!(
            msg,
            "Cannot update these configs dynamically: Set(num.partitions)"
        );
        let (c, msg) = check(&[("ssl.keystore.location", "/k.pem")], true).unwrap_err();
        assert_eq!(c, ResponseError::InvalidRequest.code());
        assert!(msg.contains("only per-listener"), "{msg}");
        assert_eq!(
            code(check(&[("no.such.config", "1")], true)),
            ResponseError::InvalidConfig.code()
        );
        let (c, msg) = check(&[("max.connections", "ten")], true).unwrap_err();
        assert_eq!(c, ResponseError::InvalidRequest.code());
        assert_eq!(
            msg,
            "Invalid value ten for configuration max.connections: Not a number of type INT"
        );
        assert!(check(&[("max.connections.per.ip", "-1")], true).is_err());
        let ssl = [("listener.name.ssl.ssl.keystore.location", "/k.pem")];
        assert_eq!(code(check(&ssl, true)), 0);
        let (c, msg) = check(&ssl, false).unwrap_err();
        assert_eq!(c, ResponseError::InvalidRequest.code());
        assert!(msg.contains("broker id must be specified"), "{msg}");
    }

    #[test]
    fn append_and_subtract_only_on_lists() {
        let kind = |n: &str| match n {
            "super.users" => Some(ConfigType::List),
            "max.connections" => Some(ConfigType::Int),
            _ => None,
        };
        let current = layer(&[("max.connections", "5")]);
        let append = |name: &str| {
            changed(
                &current,
                &[Change::Append(name.into(), "x".into())],
                false,
                &kind,
            )
        };
        let (c, msg) = append("max.connections").unwrap_err();
        assert_eq!(c, ResponseError::InvalidConfig.code());
        assert_eq!(
            msg,
            "Config value append is not allowed for config key: max.connections"
        );
        assert_eq!(
            append("nope").unwrap_err().0,
            ResponseError::InvalidConfig.code()
        );
        let next = changed(
            &current,
            &[
                Change::Append("super.users".into(), "User:a,User:b".into()),
                Change::Subtract("super.users".into(), "User:a".into()),
                Change::Delete("max.connections".into()),
            ],
            false,
            &kind,
        )
        .unwrap();
        assert_eq!(next, layer(&[("super.users", "User:b")]));
        let replaced = changed(
            &current,
            &[Change::Set("max.connections.per.ip".into(), "3".into())],
            true,
            &kind,
        )
        .unwrap();
        assert_eq!(replaced, layer(&[("max.connections.per.ip", "3")]));
    }

    #[test]
    fn a_brokers_own_layer_wins_over_the_default() {
        let layers = Layers {
            default: layer(&[("max.connections", "10"), ("max.connections.per.ip", "2")]),
            broker: layer(&[("max.connections", "20")]),
        };
        assert_eq!(
            layers.effective(),
            layer(&[("max.connections", "20"), ("max.connections.per.ip", "2")])
        );
    }
}
