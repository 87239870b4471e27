//! Create/Renew/Expire/DescribeDelegationToken (KIP-48, KIP-373).
//!
//! Kafka's broker decides who may ask before its controller applies the
//! token rules, and so does this module before `auth::tokens` applies them:
//! none of the four is served on a PLAINTEXT or 1-way SSL connection, nor on
//! one that authenticated with a token (a token must not beget tokens),
//! which is DELEGATION_TOKEN_REQUEST_NOT_ALLOWED. A token for another owner
//! needs CREATE_TOKENS on that owner's USER resource; renewers must be
//! `User` principals and an owner must have a principal type. Renewing and expiring need no ACL: the token's owner
//! and renewers may, anyone else gets DELEGATION_TOKEN_OWNER_MISMATCH.
//! Describe shows a principal the tokens it owns, requested or may renew,
//! plus those it may DESCRIBE as a DELEGATION_TOKEN resource or whose owner
//! it may DESCRIBE_TOKENS as a USER resource; a list of owners narrows that
//! to tokens those principals own or renew, and an empty list answers none.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::describe_delegation_token_response::{
    DescribedDelegationToken, DescribedDelegationTokenRenewer,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::{Operation, ResourceType};
use crate::auth::tokens::CreateRequest;
use crate::auth::AuthError;
use crate::principal::Principal;

pub(super) const CREATE_DELEGATION_TOKEN: Api = api!(
    CreateDelegationTokenRequest,
    1..=3,
    later(|b, r, cx| create(b.clone(), r, cx))
);
pub(super) const RENEW_DELEGATION_TOKEN: Api = api!(
    RenewDelegationTokenRequest,
    1..=2,
    later(|b, r, cx| renew(b.clone(), r, cx))
);
pub(super) const EXPIRE_DELEGATION_TOKEN: Api = api!(
    ExpireDelegationTokenRequest,
    1..=2,
    later(|b, r, cx| expire(b.clone(), r, cx))
);
pub(super) const DESCRIBE_DELEGATION_TOKEN: Api = api!(
    DescribeDelegationTokenRequest,
    1..=3,
    later(|b, r, cx| describe(b.clone(), r, cx))
);

error_codes! {
    CreateDelegationTokenResponse => |r, f| f(r.error_code);
    RenewDelegationTokenResponse => |r, f| f(r.error_code);
    ExpireDelegationTokenResponse => |r, f| f(r.error_code);
    DescribeDelegationTokenResponse => |r, f| f(r.error_code);
}

/// Kafka's error code for a token rule's refusal.
fn code(e: &AuthError) -> i16 {
    let error = match e {
        AuthError::TokensDisabled => ResponseError::DelegationTokenAuthDisabled,
        AuthError::TokenNotFound => ResponseError::DelegationTokenNotFound,
        AuthError::TokenExpired => ResponseError::DelegationTokenExpired,
        AuthError::TokenOwnerMismatch(_) => ResponseError::DelegationTokenOwnerMismatch,
        AuthError::InvalidPrincipalType(_) => ResponseError::InvalidPrincipalType,
        e => {
            tracing::warn!(error = %e, "delegation token request failed");
            ResponseError::UnknownServerError
        }
    };
    error.code()
}

const NOT_ALLOWED: i16 = 64; // DELEGATION_TOKEN_REQUEST_NOT_ALLOWED
const AUTHORIZATION_FAILED: i16 = 65; // DELEGATION_TOKEN_AUTHORIZATION_FAILED

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

/// Who asks, and what the ACLs let it do, for checks after an await.
struct Asker {
    principal: Principal,
    host: String,
}

impl Asker {
    fn of(cx: &Ctx<'_>) -> Asker {
        Asker {
            principal: cx.principal.clone(),
            host: cx.client_host.to_string(),
        }
    }

    fn may(&self, b: &Broker, op: Operation, kind: ResourceType, name: &str) -> bool {
        b.access
            .authorize(&self.principal, &self.host, op, kind, name)
    }
}

fn create(
    broker: Arc<Broker>,
    req: CreateDelegationTokenRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = CreateDelegationTokenResponse> + Send + 'static {
    let asker = Asker::of(cx);
    let allowed = cx.delegation_tokens_allowed;
    async move {
        let requester = asker.principal.clone();
        let owner = match req.owner_principal_name.as_deref() {
            Some(name) if !name.is_empty() => Principal {
                kind: req
                    .owner_principal_type
                    .as_deref()
                    .unwrap_or_default()
                    .to_string(),
                name: name.to_string(),
            },
            _ => requester.clone(),
        };
        let response = CreateDelegationTokenResponse::default()
            .with_principal_type(text(&owner.kind))
            .with_principal_name(text(&owner.name))
            .with_token_requester_principal_type(text(&requester.kind))
            .with_token_requester_principal_name(text(&requester.name));
        if !allowed {
            return response.with_error_code(NOT_ALLOWED);
        }
        // An owner without a principal type names nobody (Kafka's
        // KafkaPrincipal refuses a null type).
        if owner.kind.is_empty() {
            return response.with_error_code(ResponseError::InvalidPrincipalType.code());
        }
        if owner != requester
            && !asker.may(
                &broker,
                Operation::CreateTokens,
                ResourceType::User,
                &owner.to_string(),
            )
        {
            return response.with_error_code(AUTHORIZATION_FAILED);
        }
        let renewers: Vec<Principal> = req
            .renewers
            .iter()
            .map(|r| Principal {
                kind: r.principal_type.to_string(),
                name: r.principal_name.to_string(),
            })
            .collect();
        // Checked before the rest, as Kafka's broker does before its controller.
        if renewers.iter().any(|r| r.kind != "User") {
            return response.with_error_code(ResponseError::InvalidPrincipalType.code());
        }
        let created = broker
            .tokens
            .create(CreateRequest {
                requester: requester.clone(),
                owner: (owner != requester).then_some(owner),
                renewers,
                max_lifetime_ms: req.max_lifetime_ms,
            })
            .await;
        match created {
            Ok(c) => response
                .with_issue_timestamp_ms(c.info.issue_ms)
                .with_expiry_timestamp_ms(c.info.expiry_ms)
                .with_max_timestamp_ms(c.info.max_ms)
                .with_token_id(text(&c.info.token_id))
                .with_hmac(Bytes::from(c.hmac)),
            Err(e) => response.with_error_code(code(&e)),
        }
    }
}

fn renew(
    broker: Arc<Broker>,
    req: RenewDelegationTokenRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = RenewDelegationTokenResponse> + Send + 'static {
    let asker = Asker::of(cx);
    let allowed = cx.delegation_tokens_allowed;
    async move {
        let response = RenewDelegationTokenResponse::default();
        if !allowed {
            return response.with_error_code(NOT_ALLOWED);
        }
        match broker
            .tokens
            .renew(&req.hmac, &asker.principal, req.renew_period_ms)
            .await
        {
            Ok(expiry) => response.with_expiry_timestamp_ms(expiry),
            Err(e) => response.with_error_code(code(&e)),
        }
    }
}

fn expire(
    broker: Arc<Broker>,
    req: ExpireDelegationTokenRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = ExpireDelegationTokenResponse> + Send + 'static {
    let asker = Asker::of(cx);
    let allowed = cx.delegation_tokens_allowed;
    async move {
        let response = ExpireDelegationTokenResponse::default();
        if !allowed {
            return response.with_error_code(NOT_ALLOWED);
        }
        match broker
            .tokens
            .expire(&req.hmac, &asker.principal, req.expiry_time_period_ms)
            .await
        {
            Ok(expiry) => response.with_expiry_timestamp_ms(expiry),
            Err(e) => response.with_error_code(code(&e)),
        }
    }
}

fn describe(
    broker: Arc<Broker>,
    req: DescribeDelegationTokenRequest,
    cx: &Ctx<'_>,
) -> impl std::future::Future<Output = DescribeDelegationTokenResponse> + Send + 'static {
    let asker = Asker::of(cx);
    let allowed = cx.delegation_tokens_allowed;
    async move {
        let response = DescribeDelegationTokenResponse::default();
        if !allowed {
            return response.with_error_code(NOT_ALLOWED);
        }
        if !broker.tokens.enabled() {
            return response.with_error_code(ResponseError::DelegationTokenAuthDisabled.code());
        }
        let owners: Option<Vec<Principal>> = req.owners.map(|owners| {
            owners
                .iter()
                .map(|o| Principal {
                    kind: o.principal_type.to_string(),
                    name: o.principal_name.to_string(),
                })
                .collect()
        });
        if owners.as_ref().is_some_and(Vec::is_empty) {
            return response;
        }
        let all = match broker.tokens.all().await {
            Ok(all) => all,
            Err(e) => return response.with_error_code(code(&e)),
        };
        let me = &asker.principal;
        let mut tokens = Vec::new();
        for t in all {
            // Kafka's DelegationTokenManager.filterToken.
            let requested = owners
                .as_ref()
                .is_none_or(|owners| owners.iter().any(|o| t.owner_or_renewer(o)));
            let visible = t.owner_or_renewer(me)
                || asker.may(
                    &broker,
                    Operation::Describe,
                    ResourceType::DelegationToken,
                    &t.token_id,
                )
                || asker.may(
                    &broker,
                    Operation::DescribeTokens,
                    ResourceType::User,
                    &t.owner,
                );
            if !(requested && visible) {
                continue;
            }
            let hmac = match broker.tokens.hmac_of(&t) {
                Ok(h) => h,
                Err(e) => return response.with_error_code(code(&e)),
            };
            let (owner, requester) = (t.owner(), t.requester());
            tokens.push(
                DescribedDelegationToken::default()
                    .with_principal_type(text(&owner.kind))
                    .with_principal_name(text(&owner.name))
                    .with_token_requester_principal_type(text(&requester.kind))
                    .with_token_requester_principal_name(text(&requester.name))
                    .with_issue_timestamp(t.issue_ms)
                    .with_expiry_timestamp(t.expiry_ms)
                    .with_max_timestamp(t.max_ms)
                    .with_token_id(text(&t.token_id))
                    .with_hmac(Bytes::from(hmac))
                    .with_renewers(
                        t.renewers()
                            .into_iter()
                            .map(|r| {
                                DescribedDelegationTokenRenewer::default()
                                    .with_principal_type(text(&r.kind))
                                    .with_principal_name(text(&r.name))
                            })
                            .collect(),
                    ),
            );
        }
        response.with_tokens(tokens)
    }
}
