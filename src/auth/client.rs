//! The client side of SASL, for the broker's own connections to a listener
//! (the compaction worker speaks through librdkafka; a transaction
//! coordinator writing markers at another leader speaks through this).
//!
//! It is the mirror of `sasl`: tokens in, tokens out, no socket, so it is
//! tested against the server's exchange directly. The SCRAM arithmetic is
//! the one the server checks with (`scram::client`).

use super::sasl::PLAIN;
use super::scram::{client::Client, Mechanism};
use super::AuthError;

/// Who the broker is on a SASL inter-broker listener, and how it proves it.
#[derive(Clone, PartialEq, Eq)]
pub struct SaslLogin {
    pub mechanism: String,
    pub username: String,
    pub password: String,
}

impl std::fmt::Debug for SaslLogin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SaslLogin")
            .field("mechanism", &self.mechanism)
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// One client authentication in progress.
pub enum ClientExchange {
    /// PLAIN sent its only token; the server's answer ends it.
    Plain,
    /// SCRAM sent client-first; next comes server-first.
    ScramFirst(Client),
    /// SCRAM sent client-final; next comes server-final.
    ScramFinal(Client),
    Finished,
}

impl SaslLogin {
    /// Starts an authentication: the exchange and the first token to send.
    pub fn start(&self, nonce: &str) -> Result<(ClientExchange, Vec<u8>), AuthError> {
        if self.mechanism == PLAIN {
            let token = format!("\0{}\0{}", self.username, self.password).into_bytes();
            return Ok((ClientExchange::Plain, token));
        }
        let m = Mechanism::from_name(&self.mechanism)
            .ok_or(AuthError::Malformed("unsupported SASL mechanism"))?;
        let (client, first) = Client::first(m, &self.username, &self.password, nonce);
        Ok((ClientExchange::ScramFirst(client), first))
    }
}

impl ClientExchange {
    /// Feeds the server's token; the next token to send, or `None` once
    /// the exchange is complete (and, for SCRAM, the server proved itself).
    pub fn step(&mut self, server: &[u8]) -> Result<Option<Vec<u8>>, AuthError> {
        match std::mem::replace(self, ClientExchange::Finished) {
            ClientExchange::Plain => Ok(None),
            ClientExchange::ScramFirst(mut client) => {
                let last = client.last(server)?;
                *self = ClientExchange::ScramFinal(client);
                Ok(Some(last))
            }
            ClientExchange::ScramFinal(client) => client.verify(server).map(|()| None),
            ClientExchange::Finished => {
                Err(AuthError::Malformed("authentication already finished"))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::credentials::{Change, Credentials};
    use crate::auth::sasl::{Exchange, Secrets, Step};
    use crate::auth::scram::Credential;
    use std::sync::Arc;

    fn login(mechanism: &str, password: &str) -> SaslLogin {
        SaslLogin {
            mechanism: mechanism.into(),
            username: "broker,1".into(),
            password: password.into(),
        }
    }

    /// Runs a client against the server's exchange; the user it authenticated as.
    async fn run(login: &SaslLogin, creds: &Arc<Credentials>) -> Result<String, AuthError> {
        let mut server = Exchange::start(&login.mechanism).unwrap();
        let (mut client, mut token) = login.start("client-nonce").unwrap();
        let secrets = Secrets::without_tokens(creds.clone()).await;
        loop {
            match server.step(&secrets, &token).await? {
                Step::Challenge(c) => {
                    token = client.step(&c)?.expect("the client expects more");
                }
                Step::Done { token, user, .. } => {
                    assert!(client.step(&token)?.is_none());
                    return Ok(user);
                }
            }
        }
    }

    #[tokio::test]
    async fn every_mechanism_authenticates_against_the_servers_exchange() {
        let store = Arc::new(object_store::memory::InMemory::new());
        let creds = Arc::new(Credentials::open_store(store).await.unwrap());
        for m in Mechanism::ALL {
            let c = Credential::from_password(m, "pw", b"salt-of-the-earth", 4096);
            creds
                .alter(vec![("broker,1".into(), Change::Upsert(m, c))])
                .await
                .unwrap();
        }
        for mechanism in ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] {
            assert_eq!(
                run(&login(mechanism, "pw"), &creds).await.unwrap(),
                "broker,1"
            );
            assert!(run(&login(mechanism, "wrong"), &creds).await.is_err());
        }
        assert!(!format!("{:?}", login("PLAIN", "pw")).contains("pw\""));
    }
}
