//! ApiVersions: the APIs and versions in the dispatch table, which are
//! exactly the ones this broker serves.

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::ApiVersionsResponse;
use kafka_protocol::messages::*;

use super::dispatch::APIS;
use super::dispatch::{api, Api};
use super::metrics::error_codes;

pub(super) const API_VERSIONS: Api = api!(ApiVersionsRequest, 0..=4, ready(|_, _, _| response()));

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

pub(super) fn response() -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(api_list())
}

pub(super) fn unsupported_version_response() -> ApiVersionsResponse {
    ApiVersionsResponse::default()
        .with_error_code(ResponseError::UnsupportedVersion.code())
        .with_api_keys(api_list())
}
