//! Describe/AlterUserScramCredentials (KIP-554), and the SASL APIs where a
//! connection has nothing to authenticate.
//!
//! Kafka's clients salt the password themselves and send the salted
//! password; the broker keeps only the salt, the iteration count and the two
//! keys derived from it. A user whose alterations break a rule (unknown
//! mechanism, iteration count outside 4096..=16384, a user/mechanism pair
//! named twice, deleting what does not exist) gets the error and none of its
//! alterations; other users in the same request are altered.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::authorize::{Resource, CLUSTER_DENIED};
use super::dispatch::{api, Api};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;
use crate::auth::credentials::Change;
use crate::auth::scram::{Credential, Mechanism, MAX_ITERATIONS, MIN_ITERATIONS};

// Reached only where the connection does not authenticate (see server::connection).
pub(super) const SASL_HANDSHAKE: Api = api!(
    SaslHandshakeRequest,
    0..=1,
    ready(|_, _, _| sasl_handshake_out_of_place())
);
pub(super) const SASL_AUTHENTICATE: Api = api!(
    SaslAuthenticateRequest,
    0..=2,
    ready(|_, _, _| sasl_authenticate_out_of_place())
);
pub(super) const DESCRIBE_USER_SCRAM_CREDENTIALS: Api = api!(
    DescribeUserScramCredentialsRequest,
    0..=0,
    later(|b, r, _| describe(b.clone(), r)),
    acl(Operation::Describe, Resource::Cluster, |_| {
        DescribeUserScramCredentialsResponse::default().with_error_code(CLUSTER_DENIED)
    })
);
pub(super) const ALTER_USER_SCRAM_CREDENTIALS: Api = api!(
    AlterUserScramCredentialsRequest,
    0..=0,
    later(|b, r, _| alter(b.clone(), r)),
    acl(Operation::Alter, Resource::Cluster, alter_denied)
);

error_codes! {
    SaslHandshakeResponse => |r, f| f(r.error_code);
    SaslAuthenticateResponse => |r, f| f(r.error_code);
    DescribeUserScramCredentialsResponse => |r, f| {
        f(r.error_code);
        r.results.iter().for_each(|u| f(u.error_code));
    };
    AlterUserScramCredentialsResponse => |r, f| r.results.iter().for_each(|u| f(u.error_code));
}

/// Every user the request names, refused.
fn alter_denied(r: &AlterUserScramCredentialsRequest) -> AlterUserScramCredentialsResponse {
    let users = (r.deletions.iter().map(|d| &d.name)).chain(r.upsertions.iter().map(|u| &u.name));
    AlterUserScramCredentialsResponse::default().with_results(
        users
            .map(|n| {
                AlterUserScramCredentialsResult::default()
                    .with_user(n.clone())
                    .with_error_code(CLUSTER_DENIED)
            })
            .collect(),
    )
}

/// SaslHandshake on a connection that does not use SASL, or again after a
/// completed authentication while re-authentication is not under way:
/// Kafka answers ILLEGAL_SASL_STATE.
pub(super) fn sasl_handshake_out_of_place() -> SaslHandshakeResponse {
    SaslHandshakeResponse::default().with_error_code(ResponseError::IllegalSaslState.code())
}

pub(super) fn sasl_authenticate_out_of_place() -> SaslAuthenticateResponse {
    SaslAuthenticateResponse::default()
        .with_error_code(ResponseError::IllegalSaslState.code())
        .with_error_message(Some(StrBytes::from_static_str(
            "SaslAuthenticate is not expected on this connection now",
        )))
}

fn msg(s: impl Into<String>) -> Option<StrBytes> {
    Some(StrBytes::from_string(s.into()))
}

pub(super) async fn describe(
    broker: Arc<Broker>,
    req: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let all = match broker.credentials.all().await {
        Ok(all) => all,
        Err(e) => {
            return DescribeUserScramCredentialsResponse::default()
                .with_error_code(ResponseError::UnknownServerError.code())
                .with_error_message(msg(e.to_string()))
        }
    };
    let info = |creds: &crate::auth::credentials::UserCredentials| {
        creds
            .iter()
            .filter_map(|(name, c)| {
                Some(
                    CredentialInfo::default()
                        .with_mechanism(Mechanism::from_name(name)?.code())
                        .with_iterations(c.iterations),
                )
            })
            .collect::<Vec<_>>()
    };
    let requested: Vec<String> = req
        .users
        .unwrap_or_default()
        .into_iter()
        .map(|u| u.name.to_string())
        .collect();
    let results = if requested.is_empty() {
        all.iter()
            .map(|(user, creds)| {
                DescribeUserScramCredentialsResult::default()
                    .with_user(StrBytes::from_string(user.clone()))
                    .with_credential_infos(info(creds))
            })
            .collect()
    } else {
        let mut seen = BTreeMap::new();
        for u in &requested {
            *seen.entry(u.as_str()).or_insert(0) += 1;
        }
        seen.into_iter()
            .map(|(user, count)| {
                let r = DescribeUserScramCredentialsResult::default()
                    .with_user(StrBytes::from_string(user.to_string()));
                if count > 1 {
                    return r
                        .with_error_code(ResponseError::DuplicateResource.code())
                        .with_error_message(msg(format!("Cannot describe SCRAM credentials for the same user twice in a single request: {user}")));
                }
                match all.get(user) {
                    Some(creds) => r.with_credential_infos(info(creds)),
                    None => r
                        .with_error_code(ResponseError::ResourceNotFound.code())
                        .with_error_message(msg(format!("Attempt to describe nonexistent user: {user}"))),
                }
            })
            .collect()
    };
    DescribeUserScramCredentialsResponse::default().with_results(results)
}

pub(super) async fn alter(
    broker: Arc<Broker>,
    req: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    // Per user: its changes, or the first error.
    let mut users: BTreeMap<String, Result<Vec<Change>, (ResponseError, String)>> = BTreeMap::new();
    let mut pairs: BTreeSet<(String, i8)> = BTreeSet::new();
    let fail = |users: &mut BTreeMap<_, _>, user: &str, e: ResponseError, m: String| {
        users.insert(user.to_string(), Err((e, m)));
    };
    let existing = broker.credentials.all().await.unwrap_or_default();
    for d in &req.deletions {
        let user = d.name.to_string();
        let entry = users.entry(user.clone()).or_insert_with(|| Ok(Vec::new()));
        if entry.is_err() {
            continue;
        }
        let Some(m) = Mechanism::from_code(d.mechanism) else {
            fail(
                &mut users,
                &user,
                ResponseError::UnsupportedSaslMechanism,
                format!("Unknown SCRAM mechanism {}", d.mechanism),
            );
            continue;
        };
        if user.is_empty() {
            fail(
                &mut users,
                &user,
                ResponseError::UnacceptableCredential,
                "Username must not be empty".into(),
            );
            continue;
        }
        if !pairs.insert((user.clone(), d.mechanism)) {
            fail(
                &mut users,
                &user,
                ResponseError::DuplicateResource,
                format!("A user credential cannot be altered twice in the same request: {user}"),
            );
            continue;
        }
        if !existing
            .get(&user)
            .is_some_and(|c| c.contains_key(m.name()))
        {
            fail(
                &mut users,
                &user,
                ResponseError::ResourceNotFound,
                format!("Attempt to delete a user credential that does not exist: {user}"),
            );
            continue;
        }
        if let Some(Ok(changes)) = users.get_mut(&user) {
            changes.push(Change::Delete(m));
        }
    }
    for u in &req.upsertions {
        let user = u.name.to_string();
        let entry = users.entry(user.clone()).or_insert_with(|| Ok(Vec::new()));
        if entry.is_err() {
            continue;
        }
        let Some(m) = Mechanism::from_code(u.mechanism) else {
            fail(
                &mut users,
                &user,
                ResponseError::UnsupportedSaslMechanism,
                format!("Unknown SCRAM mechanism {}", u.mechanism),
            );
            continue;
        };
        let bad = if user.is_empty() {
            Some("Username must not be empty".to_string())
        } else if !(MIN_ITERATIONS..=MAX_ITERATIONS).contains(&u.iterations) {
            Some(format!(
                "Iterations {} not in the range {MIN_ITERATIONS}..={MAX_ITERATIONS}",
                u.iterations
            ))
        } else if u.salt.is_empty() || u.salted_password.is_empty() {
            Some("Salt and salted password must not be empty".to_string())
        } else {
            None
        };
        if let Some(why) = bad {
            fail(
                &mut users,
                &user,
                ResponseError::UnacceptableCredential,
                why,
            );
            continue;
        }
        if !pairs.insert((user.clone(), u.mechanism)) {
            fail(
                &mut users,
                &user,
                ResponseError::DuplicateResource,
                format!("A user credential cannot be altered twice in the same request: {user}"),
            );
            continue;
        }
        let credential =
            Credential::from_salted_password(m, &u.salt, &u.salted_password, u.iterations);
        if let Some(Ok(changes)) = users.get_mut(&user) {
            changes.push(Change::Upsert(m, credential));
        }
    }
    let mut changes = Vec::new();
    for (user, r) in &mut users {
        if let Ok(list) = r {
            changes.extend(std::mem::take(list).into_iter().map(|c| (user.clone(), c)));
        }
    }
    let stored = broker.credentials.alter(changes).await;
    let results = users
        .into_iter()
        .map(|(user, r)| {
            let result =
                AlterUserScramCredentialsResult::default().with_user(StrBytes::from_string(user));
            match (r, &stored) {
                (Err((e, m)), _) => result.with_error_code(e.code()).with_error_message(msg(m)),
                (Ok(_), Err(e)) => result
                    .with_error_code(ResponseError::UnknownServerError.code())
                    .with_error_message(msg(e.to_string())),
                (Ok(_), Ok(())) => result,
            }
        })
        .collect();
    AlterUserScramCredentialsResponse::default().with_results(results)
}
