//! CreateAcls, DescribeAcls and DeleteAcls (what `kafka-acls.sh` sends).
//!
//! Creating and deleting need ALTER on the cluster, describing DESCRIBE;
//! without `--authorizer` there is no authorizer to hold ACLs and, as in
//! Kafka, all three answer SECURITY_DISABLED. Bindings are stored through
//! `access`, durable before the response is sent.

use std::collections::BTreeMap;
use std::sync::Arc;

use kafka_protocol::messages::create_acls_response::AclCreationResult;
use kafka_protocol::messages::delete_acls_response::{
    DeleteAclsFilterResult, DeleteAclsMatchingAcl,
};
use kafka_protocol::messages::describe_acls_response::{AclDescription, DescribeAclsResource};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::CLUSTER_DENIED;
use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{AclBinding, AclFilter, Operation, PatternType, Permission, ResourceType};

pub(super) const CREATE_ACLS: Api = api!(CreateAclsRequest, 1..=3, later(create_acls));
pub(super) const DESCRIBE_ACLS: Api = api!(
    DescribeAclsRequest,
    1..=3,
    ready(|b, r, cx| describe_acls(b, r, cx))
);
pub(super) const DELETE_ACLS: Api = api!(DeleteAclsRequest, 1..=3, later(delete_acls));

error_codes! {
    CreateAclsResponse => |r, f| r.results.iter().for_each(|c| f(c.error_code));
    DescribeAclsResponse => |r, f| f(r.error_code);
    DeleteAclsResponse => |r, f| for fr in &r.filter_results {
        f(fr.error_code);
        fr.matching_acls.iter().for_each(|m| f(m.error_code));
    };
}

const INVALID_REQUEST: i16 = 42;
const SECURITY_DISABLED: i16 = 54;
const UNKNOWN_SERVER_ERROR: i16 = -1;

fn text(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

fn binding(c: &create_acls_request::AclCreation) -> Result<AclBinding, String> {
    let b = AclBinding {
        resource_type: ResourceType::from_code(c.resource_type).ok_or("Invalid resourceType")?,
        resource_name: c.resource_name.to_string(),
        pattern_type: PatternType::from_code(c.resource_pattern_type)
            .ok_or("Invalid patternType")?,
        principal: c.principal.to_string(),
        host: c.host.to_string(),
        operation: Operation::from_code(c.operation).ok_or("Invalid operation")?,
        permission: Permission::from_code(c.permission_type).ok_or("Invalid permissionType")?,
    };
    b.validate()?;
    Ok(b)
}

#[allow(clippy::too_many_arguments)]
fn filter(
    kind: i8,
    name: Option<&StrBytes>,
    pattern: i8,
    principal: Option<&StrBytes>,
    host: Option<&StrBytes>,
    op: i8,
    perm: i8,
) -> Result<AclFilter, String> {
    Ok(AclFilter {
        resource_type: ResourceType::from_code(kind).ok_or("Invalid resourceType filter")?,
        resource_name: name.map(|n| n.to_string()),
        pattern_type: PatternType::from_code(pattern).ok_or("Invalid patternType filter")?,
        principal: principal.map(|p| p.to_string()),
        host: host.map(|h| h.to_string()),
        operation: Operation::from_code(op).ok_or("Invalid operation filter")?,
        permission: Permission::from_code(perm).ok_or("Invalid permissionType filter")?,
    })
}

fn refusal(b: &Broker, cx: &Ctx<'_>, op: Operation) -> Option<(i16, &'static str)> {
    if !b.access.authorizer_enabled() {
        Some((
            SECURITY_DISABLED,
            "No Authorizer is configured on the broker",
        ))
    } else if !b.on_cluster(cx, op) {
        Some((CLUSTER_DENIED, "Cluster authorization failed."))
    } else {
        None
    }
}

pub(super) fn create_acls(
    b: &Arc<Broker>,
    req: CreateAclsRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = CreateAclsResponse> + Send + 'static {
    let refused = refusal(b, cx, Operation::Alter);
    let b = b.clone();
    async move {
        let result = |code: i16, msg: Option<StrBytes>| {
            AclCreationResult::default()
                .with_error_code(code)
                .with_error_message(msg)
        };
        if let Some((code, msg)) = refused {
            let results = req
                .creations
                .iter()
                .map(|_| result(code, text(msg)))
                .collect();
            return CreateAclsResponse::default().with_results(results);
        }
        let parsed: Vec<Result<AclBinding, String>> = req.creations.iter().map(binding).collect();
        let valid: Vec<AclBinding> = parsed
            .iter()
            .filter_map(|p| p.as_ref().ok().cloned())
            .collect();
        let stored = b
            .access
            .update(|doc| {
                for acl in &valid {
                    if !doc.acls.contains(acl) {
                        doc.acls.push(acl.clone());
                    }
                }
            })
            .await;
        let results = parsed
            .into_iter()
            .map(|p| match (p, &stored) {
                (Err(why), _) => result(INVALID_REQUEST, text(why)),
                (Ok(_), Ok(())) => result(0, None),
                (Ok(_), Err(e)) => result(UNKNOWN_SERVER_ERROR, text(e.to_string())),
            })
            .collect();
        CreateAclsResponse::default().with_results(results)
    }
}

/// Bindings grouped by resource pattern, as both responses list them.
fn by_resource(
    acls: Vec<AclBinding>,
) -> BTreeMap<(ResourceType, String, PatternType), Vec<AclBinding>> {
    let mut m: BTreeMap<_, Vec<AclBinding>> = BTreeMap::new();
    for a in acls {
        m.entry((a.resource_type, a.resource_name.clone(), a.pattern_type))
            .or_default()
            .push(a);
    }
    m
}

pub(super) fn describe_acls(
    b: &Broker,
    req: DescribeAclsRequest,
    cx: &Ctx<'_>,
) -> DescribeAclsResponse {
    if let Some((code, msg)) = refusal(b, cx, Operation::Describe) {
        return DescribeAclsResponse::default()
            .with_error_code(code)
            .with_error_message(text(msg));
    }
    let f = match filter(
        req.resource_type_filter,
        req.resource_name_filter.as_ref(),
        req.pattern_type_filter,
        req.principal_filter.as_ref(),
        req.host_filter.as_ref(),
        req.operation,
        req.permission_type,
    ) {
        Ok(f) => f,
        Err(why) => {
            return DescribeAclsResponse::default()
                .with_error_code(INVALID_REQUEST)
                .with_error_message(text(why))
        }
    };
    let matching = b
        .access
        .doc()
        .acls
        .iter()
        .filter(|a| f.matches(a))
        .cloned()
        .collect();
    let resources = by_resource(matching)
        .into_iter()
        .map(|((kind, name, pattern), acls)| {
            DescribeAclsResource::default()
                .with_resource_type(kind.code())
                .with_resource_name(StrBytes::from_string(name))
                .with_pattern_type(pattern.code())
                .with_acls(
                    acls.into_iter()
                        .map(|a| {
                            AclDescription::default()
                                .with_principal(StrBytes::from_string(a.principal))
                                .with_host(StrBytes::from_string(a.host))
                                .with_operation(a.operation.code())
                                .with_permission_type(a.permission.code())
                        })
                        .collect(),
                )
        })
        .collect();
    DescribeAclsResponse::default().with_resources(resources)
}

pub(super) fn delete_acls(
    b: &Arc<Broker>,
    req: DeleteAclsRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = DeleteAclsResponse> + Send + 'static {
    let refused = refusal(b, cx, Operation::Alter);
    let b = b.clone();
    async move {
        if let Some((code, msg)) = refused {
            let results = req
                .filters
                .iter()
                .map(|_| {
                    DeleteAclsFilterResult::default()
                        .with_error_code(code)
                        .with_error_message(text(msg))
                })
                .collect();
            return DeleteAclsResponse::default().with_filter_results(results);
        }
        let filters: Vec<Result<AclFilter, String>> = req
            .filters
            .iter()
            .map(|f| {
                filter(
                    f.resource_type_filter,
                    f.resource_name_filter.as_ref(),
                    f.pattern_type_filter,
                    f.principal_filter.as_ref(),
                    f.host_filter.as_ref(),
                    f.operation,
                    f.permission_type,
                )
            })
            .collect();
        let removed = b
            .access
            .update(|doc| {
                let mut removed: Vec<Vec<AclBinding>> = vec![Vec::new(); filters.len()];
                doc.acls.retain(|a| {
                    // A binding matched by several filters is reported by each.
                    let hits: Vec<usize> = filters
                        .iter()
                        .enumerate()
                        .filter(|(_, f)| f.as_ref().is_ok_and(|f| f.matches(a)))
                        .map(|(i, _)| i)
                        .collect();
                    for i in &hits {
                        removed[*i].push(a.clone());
                    }
                    hits.is_empty()
                });
                removed
            })
            .await;
        let results = match removed {
            Err(e) => filters
                .iter()
                .map(|_| {
                    DeleteAclsFilterResult::default()
                        .with_error_code(UNKNOWN_SERVER_ERROR)
                        .with_error_message(text(e.to_string()))
                })
                .collect(),
            Ok(removed) => filters
                .iter()
                .zip(removed)
                .map(|(f, acls)| match f {
                    Err(why) => DeleteAclsFilterResult::default()
                        .with_error_code(INVALID_REQUEST)
                        .with_error_message(text(why.clone())),
                    Ok(_) => DeleteAclsFilterResult::default().with_matching_acls(
                        acls.into_iter()
                            .map(|a| {
                                DeleteAclsMatchingAcl::default()
                                    .with_resource_type(a.resource_type.code())
                                    .with_resource_name(StrBytes::from_string(a.resource_name))
                                    .with_pattern_type(a.pattern_type.code())
                                    .with_principal(StrBytes::from_string(a.principal))
                                    .with_host(StrBytes::from_string(a.host))
                                    .with_operation(a.operation.code())
                                    .with_permission_type(a.permission.code())
                            })
                            .collect(),
                    ),
                })
                .collect(),
        };
        DeleteAclsResponse::default().with_filter_results(results)
    }
}
