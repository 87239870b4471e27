//! The GROUP config resource (KIP-848's group configs): DescribeConfigs,
//! AlterConfigs and IncrementalAlterConfigs of one group's overrides.
//!
//! A group needs not exist to have configs, as in Kafka: they are kept by
//! name, in the catalog or in etcd, and handed to the coordinator, which
//! applies them at the group's next heartbeat. In a cluster every broker
//! rereads them with the dynamic broker configs, so the coordinator
//! follows a change made through any broker.

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;

use super::broker_configs::{changed, etcd_failure, Change, Failure};
use super::configs::{Entry, CONFIG_SOURCE_DEFAULT, CONFIG_SOURCE_STATIC_BROKER};
use super::Broker;
use crate::coordinator::group_config::{self, group_config, Configs, GROUP_CONFIGS};

const CONFIG_SOURCE_GROUP: i8 = 8;

fn check_name(group: &str) -> Result<(), Failure> {
    match group.is_empty() {
        true => Err((
            ResponseError::InvalidRequest.code(),
            "Group name must not be empty".into(),
        )),
        false => Ok(()),
    }
}

/// The broker's value of a group config's broker synonym, and its source:
/// a flag's (STATIC_BROKER_CONFIG) or Kafka's default.
fn broker_value(broker: &Broker, name: &str) -> (String, i8) {
    let configs = &broker.settings.static_configs;
    let Some(d) = group_config(name) else {
        // A broker config by its own name (a group config's bound).
        return configs
            .iter()
            .find(|c| c.name == name)
            .map_or((String::new(), CONFIG_SOURCE_DEFAULT), |c| {
                (c.value.clone(), CONFIG_SOURCE_STATIC_BROKER)
            });
    };
    d.def
        .broker
        .and_then(|synonym| configs.iter().find(|c| c.name == synonym))
        .map_or((d.def.default.to_string(), CONFIG_SOURCE_DEFAULT), |c| {
            (c.value.clone(), CONFIG_SOURCE_STATIC_BROKER)
        })
}

/// Every group config of `group`, as Kafka describes them: the group's
/// override (GROUP_CONFIG) over the broker's value under its own name.
pub(super) fn describe(broker: &Broker, group: &str) -> Result<Vec<Entry>, Failure> {
    check_name(group)?;
    let overrides = broker.coordinator.group_configs().get(group);
    Ok(GROUP_CONFIGS
        .iter()
        .map(|d| {
            let (default, source) = broker_value(broker, d.def.name);
            let mut synonyms = Vec::new();
            let value = match overrides.get(d.def.name) {
                Some(v) => {
                    synonyms.push((d.def.name.to_string(), Some(v.clone()), CONFIG_SOURCE_GROUP));
                    v.clone()
                }
                None => default.clone(),
            };
            let synonym = d.def.broker.unwrap_or(d.def.name);
            synonyms.push((synonym.to_string(), Some(default), source));
            Entry {
                name: d.def.name.to_string(),
                value: Some(value),
                source: synonyms[0].2,
                kind: d.def.kind,
                doc: d.def.doc,
                read_only: false,
                synonyms,
            }
        })
        .collect())
}

/// Changes the overrides of `group` after Kafka's checks of the result,
/// stores them and hands them to the coordinator.
pub(super) async fn alter(
    broker: &Broker,
    group: &str,
    changes: Vec<Change>,
    replace: bool,
    validate_only: bool,
) -> Result<(), Failure> {
    check_name(group)?;
    let kind = |name: &str| group_config(name).map(|d| d.def.kind);
    let prepare = |current: &Configs| -> Result<Configs, Failure> {
        let next = changed(current, &changes, replace, &kind)?;
        group_config::validate(&next, |name| broker_value(broker, name).0)
            .map_err(|e| (ResponseError::InvalidConfig.code(), e))?;
        Ok(next)
    };
    let unknown_server =
        |e: crate::catalog::CatalogError| (ResponseError::UnknownServerError.code(), e.to_string());
    let stored = match &broker.cluster {
        None => {
            let current = broker
                .catalog
                .group_configs()
                .map_err(unknown_server)?
                .remove(group)
                .unwrap_or_default();
            let next = prepare(&current)?;
            if validate_only {
                return Ok(());
            }
            broker
                .catalog
                .set_group_configs(group, next.clone())
                .map_err(unknown_server)?;
            next
        }
        Some(cluster) => {
            let store = cluster.group_configs();
            if validate_only {
                let current = store.get(group).await.map_err(etcd_failure)?;
                return prepare(&current).map(|_| ());
            }
            store.update(group, prepare).await.map_err(etcd_failure)??
        }
    };
    broker.coordinator.group_configs().set(group, stored);
    Ok(())
}

/// Rereads every group's overrides from where they are stored.
pub(super) async fn refresh(broker: &Broker) -> Result<(), String> {
    let all: BTreeMap<String, Configs> = match &broker.cluster {
        None => broker.catalog.group_configs().map_err(|e| e.to_string())?,
        Some(cluster) => cluster
            .group_configs()
            .all()
            .await
            .map_err(|e| e.to_string())?,
    };
    broker.coordinator.group_configs().replace(all);
    Ok(())
}
