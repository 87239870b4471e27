//! ListConfigResources (KIP-1142): which resources have configs to describe.
//!
//! Version 0 was KIP-1000's ListClientMetricsResources and lists client
//! metrics subscriptions only; version 1 takes the resource types to list,
//! all of them when none is given. Strata answers for the types it has
//! configs of: every topic, every live broker and every group with config
//! overrides. It has no client metrics subscriptions, so that list is
//! truly empty; a
//! type it cannot describe at all (broker loggers, an unknown id) gets
//! Kafka's answer for a type the broker does not support, UNSUPPORTED_VERSION.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::list_config_resources_response::ConfigResource;
use kafka_protocol::messages::{ListConfigResourcesRequest, ListConfigResourcesResponse};
use kafka_protocol::protocol::StrBytes;

use super::authorize::{Resource, CLUSTER_DENIED};
use super::dispatch::{api, Api};
use super::metadata::brokers;
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;

pub(super) const LIST_CONFIG_RESOURCES: Api = api!(
    ListConfigResourcesRequest,
    0..=1,
    ready(|b, r, cx| list_config_resources(b, r, cx.version)),
    acl(Operation::DescribeConfigs, Resource::Cluster, |_| {
        ListConfigResourcesResponse::default().with_error_code(CLUSTER_DENIED)
    })
);

error_codes! {
    ListConfigResourcesResponse => |r, f| f(r.error_code);
}

const TOPIC: i8 = 2;
const BROKER: i8 = 4;
const CLIENT_METRICS: i8 = 16;
const GROUP: i8 = 32;
/// What an empty list of types asks for.
const LISTED_BY_DEFAULT: [i8; 4] = [TOPIC, BROKER, CLIENT_METRICS, GROUP];

fn list_config_resources(
    broker: &Broker,
    req: ListConfigResourcesRequest,
    version: i16,
) -> ListConfigResourcesResponse {
    let types = match version {
        0 => vec![CLIENT_METRICS],
        _ if req.resource_types.is_empty() => LISTED_BY_DEFAULT.to_vec(),
        _ => req.resource_types,
    };
    if types.iter().any(|t| !LISTED_BY_DEFAULT.contains(t)) {
        return ListConfigResourcesResponse::default()
            .with_error_code(ResponseError::UnsupportedVersion.code());
    }
    let resource = |name: String, kind: i8| {
        ConfigResource::default()
            .with_resource_name(StrBytes::from_string(name))
            .with_resource_type(kind)
    };
    let mut listed = Vec::new();
    if types.contains(&TOPIC) {
        let mut names: Vec<String> = broker
            .catalog
            .topics()
            .iter()
            .map(|t| t.name().to_string())
            .collect();
        names.sort();
        listed.extend(names.into_iter().map(|n| resource(n, TOPIC)));
    }
    if types.contains(&BROKER) {
        let mut ids: Vec<i32> = brokers(broker, None).into_iter().map(|b| b.0).collect();
        ids.sort();
        listed.extend(ids.into_iter().map(|id| resource(id.to_string(), BROKER)));
    }
    if types.contains(&GROUP) {
        let groups = broker.coordinator.group_configs().all();
        listed.extend(groups.into_keys().map(|g| resource(g, GROUP)));
    }
    ListConfigResourcesResponse::default().with_config_resources(listed)
}
