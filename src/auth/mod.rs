//! Who is on the other end of a connection: TLS client certificates and SASL.
//!
//! A listener's security protocol (Kafka's PLAINTEXT, SSL, SASL_PLAINTEXT,
//! SASL_SSL) says what a connection must prove. TLS gives a principal only
//! when the client presented a certificate (its subject, as Kafka's default
//! principal builder names it); SASL gives the user name it authenticated.
//! The exchanges here are pure: the server layer feeds them the bytes of
//! SaslAuthenticate requests and sends back what they answer, so every
//! mechanism is tested without a socket.
//!
//! SCRAM credentials are salted at rest and kept where the topic catalog is
//! (`credentials`); PLAIN is checked against those same credentials, so one
//! `kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[password=...]'`
//! gives a user both mechanisms and no password is ever stored.
//! Delegation tokens (`tokens`) are SCRAM credentials too, derived from a
//! token's HMAC when a client names one with `tokenauth=true`.

pub(crate) mod client;
pub(crate) mod credentials;
pub(crate) mod sasl;
pub(crate) mod scram;
pub(crate) mod tls;
pub(crate) mod tokens;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    /// The client sent something the mechanism does not allow.
    #[error("malformed SASL message: {0}")]
    Malformed(&'static str),
    /// Unknown user, wrong password, wrong proof.
    #[error("authentication failed: {0}")]
    Failed(String),
    #[error("TLS configuration: {0}")]
    Tls(String),
    #[error("credential store: {0}")]
    Store(String),
    #[error("delegation tokens are disabled (no delegation.token.secret.key)")]
    TokensDisabled,
    #[error("no delegation token has this HMAC")]
    TokenNotFound,
    #[error("the delegation token has expired")]
    TokenExpired,
    #[error("{0} is neither the owner nor a renewer of the token")]
    TokenOwnerMismatch(String),
    #[error("renewers must be User principals, not {0}")]
    InvalidPrincipalType(String),
}

fn store_err(e: impl std::fmt::Display) -> AuthError {
    AuthError::Store(e.to_string())
}

/// The JSON document at `key` of the object store (credentials, tokens),
/// or the empty one if there is none yet.
async fn load_json<T: Default + serde::de::DeserializeOwned>(
    store: &dyn object_store::ObjectStore,
    key: &str,
) -> Result<T, AuthError> {
    match store.get(&object_store::path::Path::from(key)).await {
        Ok(got) => {
            let bytes = got.bytes().await.map_err(store_err)?;
            serde_json::from_slice(&bytes).map_err(store_err)
        }
        Err(object_store::Error::NotFound { .. }) => Ok(T::default()),
        Err(e) => Err(store_err(e)),
    }
}
