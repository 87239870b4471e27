//! The SASL mechanisms as exchanges of SaslAuthenticate tokens.
//!
//! PLAIN (RFC 4616) is one client message; SCRAM is two round trips. Both
//! look users up in the SCRAM credential store: PLAIN derives the salted
//! password with the stored salt and compares the result, so the broker
//! never holds a clear password, and a user can use PLAIN as soon as any
//! SCRAM credential is set for it (SCRAM-SHA-512 is tried first).
//!
//! SCRAM with the extension `tokenauth=true` authenticates a delegation
//! token instead (`tokens`): the user name is the token id, the password
//! the token's HMAC, and the session's principal is the token's owner.
//!
//! An unknown user fails like a wrong password. For SCRAM the exchange goes
//! on with a made-up credential and fails at the proof, so a client cannot
//! tell which user names exist (RFC 5802 section 5.1).

use std::sync::Arc;

use super::credentials::Credentials;
use super::scram::{ClientFirst, Credential, Mechanism, ServerExchange};
use super::tokens::Tokens;
use super::AuthError;

pub(crate) const PLAIN: &str = "PLAIN";

/// Every mechanism this broker implements, in the order a handshake lists them.
pub(crate) const MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

pub(crate) enum Step {
    /// Send this token and wait for the client's next one.
    Challenge(Vec<u8>),
    /// Authenticated as `user`; send the final token.
    Done {
        token: Vec<u8>,
        user: String,
        /// With a delegation token: its expiry (ms since the epoch).
        delegation: Option<i64>,
    },
}

/// Where the exchanges look credentials up.
pub(crate) struct Secrets {
    pub credentials: Arc<Credentials>,
    pub tokens: Arc<Tokens>,
}

#[cfg(test)]
impl Secrets {
    /// The credentials, and no delegation tokens (no secret key).
    pub(crate) async fn without_tokens(credentials: Arc<Credentials>) -> Secrets {
        let settings = super::tokens::TokenSettings {
            secret_key: None,
            max_lifetime_ms: 1,
            expiry_time_ms: 1,
        };
        let store = Arc::new(object_store::memory::InMemory::new());
        let tokens = Tokens::open_store(
            store,
            settings,
            crate::clock::system(),
            Arc::new(crate::clock::SeededRandom::new(0)),
        )
        .await
        .expect("an empty store opens");
        Secrets {
            credentials,
            tokens: Arc::new(tokens),
        }
    }
}

/// One authentication in progress.
pub(crate) enum Exchange {
    Plain,
    ScramFirst(Mechanism),
    ScramFinal {
        exchange: Box<ServerExchange>,
        /// Whom the session is for: the user, or a token's owner.
        user: String,
        /// The user has no credential: fail at the proof.
        unknown: bool,
        /// A delegation token's expiry.
        delegation: Option<i64>,
    },
    Finished,
}

impl Exchange {
    /// The exchange for a mechanism name a handshake chose, if implemented.
    pub(crate) fn start(mechanism: &str) -> Option<Exchange> {
        if mechanism == PLAIN {
            return Some(Exchange::Plain);
        }
        Mechanism::from_name(mechanism).map(Exchange::ScramFirst)
    }

    /// Feeds the client's next token.
    pub(crate) async fn step(
        &mut self,
        secrets: &Secrets,
        token: &[u8],
    ) -> Result<Step, AuthError> {
        let credentials = &secrets.credentials;
        match std::mem::replace(self, Exchange::Finished) {
            Exchange::Plain => {
                let (user, password) = parse_plain(token)?;
                let creds = credentials.user(&user).await?;
                let candidates: Vec<(Mechanism, Credential)> =
                    [Mechanism::Sha512, Mechanism::Sha256]
                        .into_iter()
                        .filter_map(|m| creds.get(m.name()).map(|c| (m, c.clone())))
                        .collect();
                // PBKDF2 costs milliseconds: off the I/O threads.
                let ok = tokio::task::spawn_blocking(move || {
                    candidates
                        .first()
                        .is_some_and(|(m, c)| c.matches_password(*m, &password))
                })
                .await
                .unwrap_or(false);
                if ok {
                    Ok(Step::Done {
                        token: Vec::new(),
                        user,
                        delegation: None,
                    })
                } else {
                    Err(AuthError::Failed(format!(
                        "invalid username or password for {user}"
                    )))
                }
            }
            Exchange::ScramFirst(m) => {
                let first = ClientFirst::parse(token)?;
                let (found, user, delegation) = if first.token_auth() {
                    // Kafka's ScramSaslServer: the token's owner is the session's user.
                    match secrets
                        .tokens
                        .scram_credential(&first.user, m, random_bytes())
                        .await
                        .map_err(|e| AuthError::Store(e.to_string()))?
                    {
                        Some((info, credential)) => {
                            (Some(credential), info.owner().name, Some(info.expiry_ms))
                        }
                        None => (None, first.user.clone(), None),
                    }
                } else {
                    let found = credentials.user(&first.user).await?.get(m.name()).cloned();
                    (found, first.user.clone(), None)
                };
                let unknown = found.is_none();
                let credential = found.unwrap_or_else(|| Credential {
                    salt: random_bytes(),
                    stored_key: random_bytes(),
                    server_key: random_bytes(),
                    iterations: super::scram::MIN_ITERATIONS,
                });
                let exchange = ServerExchange::new(m, first, credential, &random_bytes());
                let challenge = exchange.server_first().to_vec();
                *self = Exchange::ScramFinal {
                    exchange: Box::new(exchange),
                    user,
                    unknown,
                    delegation,
                };
                Ok(Step::Challenge(challenge))
            }
            Exchange::ScramFinal {
                exchange,
                user,
                unknown,
                delegation,
            } => {
                let token = exchange
                    .finish(token)
                    .map_err(|_| AuthError::Failed(format!("invalid credentials for {user}")))?;
                if unknown {
                    return Err(AuthError::Failed(format!("invalid credentials for {user}")));
                }
                Ok(Step::Done {
                    token,
                    user,
                    delegation,
                })
            }
            Exchange::Finished => Err(AuthError::Malformed("authentication already finished")),
        }
    }
}

// SCRAM nonces and the decoy credentials of unknown users must be
// unpredictable: the OS's, never a seeded `Random`.
#[allow(clippy::disallowed_methods)]
fn random_bytes() -> Vec<u8> {
    let mut out = uuid::Uuid::new_v4().as_bytes().to_vec();
    out.extend_from_slice(uuid::Uuid::new_v4().as_bytes());
    out
}

/// RFC 4616: `[authzid] NUL authcid NUL passwd`; Kafka refuses an authzid
/// other than the user itself.
fn parse_plain(token: &[u8]) -> Result<(String, String), AuthError> {
    let text = std::str::from_utf8(token).map_err(|_| AuthError::Malformed("not UTF-8"))?;
    let mut parts = text.split('\0');
    let (Some(authzid), Some(user), Some(password), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(AuthError::Malformed(
            "PLAIN expects authzid NUL user NUL password",
        ));
    };
    if user.is_empty() || password.is_empty() {
        return Err(AuthError::Malformed("empty user or password"));
    }
    if !authzid.is_empty() && authzid != user {
        return Err(AuthError::Failed(
            "authorization id must equal the user".into(),
        ));
    }
    Ok((user.to_string(), password.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credentials::Change;
    use crate::auth::scram::client::Client;

    async fn store_with_alice() -> Secrets {
        let store = Arc::new(object_store::memory::InMemory::new());
        let creds = Arc::new(Credentials::open_store(store.clone()).await.unwrap());
        let c = Credential::from_password(Mechanism::Sha512, "secret", b"NaCl", 4096);
        creds
            .alter(vec![("alice".into(), Change::Upsert(Mechanism::Sha512, c))])
            .await
            .unwrap();
        let settings = crate::auth::tokens::TokenSettings {
            secret_key: Some("key".into()),
            max_lifetime_ms: 3_600_000,
            expiry_time_ms: 3_600_000,
        };
        let tokens = Tokens::open_store(
            store,
            settings,
            crate::clock::system(),
            Arc::new(crate::clock::SeededRandom::new(1)),
        )
        .await
        .unwrap();
        Secrets {
            credentials: creds,
            tokens: Arc::new(tokens),
        }
    }

    #[tokio::test]
    async fn plain_is_checked_against_the_scram_credential() {
        let creds = store_with_alice().await;
        for (token, ok) in [
            (&b"\0alice\0secret"[..], true),
            (b"alice\0alice\0secret", true),
            (b"\0alice\0wrong", false),
            (b"\0bob\0secret", false),
            (b"mallory\0alice\0secret", false),
            (b"alice\0secret", false),
        ] {
            let mut ex = Exchange::start("PLAIN").unwrap();
            let got = ex.step(&creds, token).await;
            assert_eq!(matches!(got, Ok(Step::Done { .. })), ok, "{token:?}");
        }
    }

    #[tokio::test]
    async fn scram_succeeds_only_with_the_password_of_a_known_user() {
        let creds = store_with_alice().await;
        for (user, password, ok) in [
            ("alice", "secret", true),
            ("alice", "nope", false),
            ("bob", "secret", false),
        ] {
            let mut ex = Exchange::start("SCRAM-SHA-512").unwrap();
            let (mut client, first) = Client::first(Mechanism::Sha512, user, password, "cnonce");
            let Ok(Step::Challenge(server_first)) = ex.step(&creds, &first).await else {
                panic!("no challenge for {user}");
            };
            let got = ex.step(&creds, &client.last(&server_first).unwrap()).await;
            match got {
                Ok(Step::Done { user: u, token, .. }) => {
                    assert!(ok);
                    assert_eq!(u, user);
                    assert!(token.starts_with(b"v="));
                }
                Ok(Step::Challenge(_)) => panic!("a third round"),
                Err(_) => assert!(!ok, "{user}/{password} refused"),
            }
        }
        // No SHA-256 credential for alice.
        let mut ex = Exchange::start("SCRAM-SHA-256").unwrap();
        let (mut client, first) = Client::first(Mechanism::Sha256, "alice", "secret", "n");
        let Ok(Step::Challenge(sf)) = ex.step(&creds, &first).await else {
            panic!()
        };
        assert!(ex.step(&creds, &client.last(&sf).unwrap()).await.is_err());
    }

    #[tokio::test]
    async fn a_delegation_token_authenticates_as_its_owner_only_with_tokenauth() {
        use crate::auth::tokens::{password, CreateRequest};
        let secrets = store_with_alice().await;
        let created = secrets
            .tokens
            .create(CreateRequest {
                requester: crate::principal::Principal::user("alice"),
                owner: Some(crate::principal::Principal::user("carol")),
                renewers: vec![],
                max_lifetime_ms: 0,
            })
            .await
            .unwrap();
        let id = created.info.token_id.clone();
        let pw = password(&created.hmac);
        for m in Mechanism::ALL {
            for (tokenauth, password, ok) in [
                (true, pw.as_str(), true),
                (true, "wrong", false),
                (false, pw.as_str(), false),
            ] {
                let mut ex = Exchange::start(m.name()).unwrap();
                let (mut client, first) = if tokenauth {
                    Client::first_with_extensions(m, &id, password, "cn", "tokenauth=true")
                } else {
                    Client::first(m, &id, password, "cn")
                };
                let Ok(Step::Challenge(sf)) = ex.step(&secrets, &first).await else {
                    panic!("no challenge")
                };
                let got = ex.step(&secrets, &client.last(&sf).unwrap()).await;
                match got {
                    Ok(Step::Done {
                        user, delegation, ..
                    }) => {
                        assert!(ok, "{m:?} {tokenauth} {password}");
                        assert_eq!(user, "carol");
                        assert_eq!(delegation, Some(created.info.expiry_ms));
                    }
                    _ => assert!(!ok, "{m:?} {tokenauth} {password} refused"),
                }
            }
        }
        // An expired-at-once token authenticates no more.
        secrets
            .tokens
            .expire(
                &created.hmac,
                &crate::principal::Principal::user("carol"),
                -1,
            )
            .await
            .unwrap();
        let mut ex = Exchange::start("SCRAM-SHA-256").unwrap();
        let (mut client, first) =
            Client::first_with_extensions(Mechanism::Sha256, &id, &pw, "cn", "tokenauth=true");
        let Ok(Step::Challenge(sf)) = ex.step(&secrets, &first).await else {
            panic!()
        };
        assert!(ex.step(&secrets, &client.last(&sf).unwrap()).await.is_err());
    }
}
