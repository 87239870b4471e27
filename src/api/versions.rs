//! ApiVersions: the APIs and versions in the dispatch table, which are
//! exactly the ones this broker serves.
//!
//! From v5 (KIP-1242) a client that already knows the cluster may say which
//! cluster and node it means to reach. Addresses get reused: a bootstrap
//! name or an advertised host can come to point at another node or at
//! another cluster altogether, and a client that kept talking would mix one
//! cluster's metadata with another's. So a request naming a cluster or node
//! that is not this one is answered REBOOTSTRAP_REQUIRED, and the client
//! starts over from its bootstrap servers, as Kafka 4.4 answers it. Naming
//! only one of the two is malformed (INVALID_REQUEST), as in Kafka's
//! `ApiVersionsRequest.isValid`.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::messages::*;

use super::dispatch::APIS;
use super::dispatch::{api, Api};
use super::metadata::cluster_id;
use super::metrics::error_codes;
use super::Broker;

pub(super) const API_VERSIONS: Api = api!(
    ApiVersionsRequest,
    0..=5,
    ready(|b, r, cx| answer(b, &r, cx.version))
);

error_codes! {
    ApiVersionsResponse => |r, f| f(r.error_code);
}

fn api_list() -> Vec<ApiVersion> {
    APIS.iter()
        .map(|api| {
            ApiVersion::default()
                .with_api_key(api.key)
                .with_min_version(*api.versions.start())
                .with_max_version(*api.versions.end())
        })
        .collect()
}

fn answer(broker: &Broker, req: &ApiVersionsRequest, version: i16) -> ApiVersionsResponse {
    if !is_valid(req, version) {
        return error(ResponseError::InvalidRequest);
    }
    if version >= 5 {
        if let Some(cluster) = &req.cluster_id {
            if cluster.as_str() != cluster_id(broker) || req.node_id != broker.settings.node_id {
                return error(ResponseError::RebootstrapRequired);
            }
        }
    }
    super::features::advertise(broker, response())
}

/// From v5 a cluster id and a node id come together or not at all.
fn is_valid(req: &ApiVersionsRequest, version: i16) -> bool {
    version < 5 || req.cluster_id.is_some() == (req.node_id != -1)
}

/// An error answer carries no API list (Kafka's `getErrorResponse`; only
/// UNSUPPORTED_VERSION, answered before dispatch, lists the versions).
fn error(e: ResponseError) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_error_code(e.code())
}

pub(super) fn response() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(api_list())
}

pub(super) fn unsupported_version_response() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_list())
}
