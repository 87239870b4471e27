//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677), the server side.
//!
//! A credential at rest is what RFC 5802 lets a server keep instead of the
//! password: the salt, the iteration count, `StoredKey = H(HMAC(SaltedPassword,
//! "Client Key"))` and `ServerKey = HMAC(SaltedPassword, "Server Key")`. The
//! server checks a client proof against StoredKey and proves itself with
//! ServerKey, so a stolen credential file lets nobody log in as the user
//! (it lets them impersonate the server, which RFC 5802 accepts).
//!
//! Kafka's clients send `SaltedPassword` itself in AlterUserScramCredentials
//! (the client salts, the broker derives the two keys), so both entry points
//! exist: from a password (`--add-scram`, PLAIN checked against a SCRAM
//! credential) and from a salted password.

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use subtle::ConstantTimeEq;

use super::AuthError;

/// Kafka's bounds on the iteration count (ScramMechanism.minIterations/maxIterations).
pub(crate) const MIN_ITERATIONS: i32 = 4096;
pub(crate) const MAX_ITERATIONS: i32 = 16384;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// Kafka's ScramMechanism type byte in Alter/DescribeUserScramCredentials.
    pub fn code(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_code(code: i8) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.code() == code)
    }

    fn hmac(self, key: &[u8], data: &[&[u8]]) -> Vec<u8> {
        fn run<M: Mac + hmac::digest::KeyInit>(key: &[u8], data: &[&[u8]]) -> Vec<u8> {
            let mut mac = <M as hmac::digest::KeyInit>::new_from_slice(key)
                .expect("HMAC takes keys of any length");
            for d in data {
                mac.update(d);
            }
            mac.finalize().into_bytes().to_vec()
        }
        match self {
            Mechanism::Sha256 => run::<Hmac<Sha256>>(key, data),
            Mechanism::Sha512 => run::<Hmac<Sha512>>(key, data),
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    /// RFC 5802 Hi(): PBKDF2 with this mechanism's HMAC.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: u32) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut out = [0u8; 32];
                pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, iterations, &mut out);
                out.to_vec()
            }
            Mechanism::Sha512 => {
                let mut out = [0u8; 64];
                pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, iterations, &mut out);
                out.to_vec()
            }
        }
    }
}

/// What the broker keeps for one user and mechanism.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Credential {
    #[serde(with = "b64")]
    pub salt: Vec<u8>,
    #[serde(with = "b64")]
    pub stored_key: Vec<u8>,
    #[serde(with = "b64")]
    pub server_key: Vec<u8>,
    pub iterations: i32,
}

impl Credential {
    pub(crate) fn from_salted_password(
        mechanism: Mechanism,
        salt: &[u8],
        salted_password: &[u8],
        iterations: i32,
    ) -> Credential {
        let client_key = mechanism.hmac(salted_password, &[b"Client Key"]);
        Credential {
            salt: salt.to_vec(),
            stored_key: mechanism.hash(&client_key),
            server_key: mechanism.hmac(salted_password, &[b"Server Key"]),
            iterations,
        }
    }

    pub(crate) fn from_password(
        mechanism: Mechanism,
        password: &str,
        salt: &[u8],
        iterations: i32,
    ) -> Credential {
        let salted = mechanism.salted_password(password.as_bytes(), salt, iterations as u32);
        Credential::from_salted_password(mechanism, salt, &salted, iterations)
    }

    /// Whether `password` is the one this credential was made from (SASL/PLAIN).
    pub(crate) fn matches_password(&self, mechanism: Mechanism, password: &str) -> bool {
        let other = Credential::from_password(mechanism, password, &self.salt, self.iterations);
        bool::from(other.stored_key.ct_eq(&self.stored_key))
    }
}

mod b64 {
    use base64::engine::general_purpose::STANDARD;
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let s = String::deserialize(d)?;
        STANDARD.decode(s).map_err(serde::de::Error::custom)
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(s: &str) -> Result<Vec<u8>, AuthError> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD
        .decode(s)
        .map_err(|_| AuthError::Malformed("invalid base64"))
}

/// RFC 5802 `saslname`: `=2C` and `=3D` stand for `,` and `=`.
fn decode_saslname(s: &str) -> Result<String, AuthError> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('=') {
        out.push_str(&rest[..i]);
        match rest.get(i..i + 3) {
            Some("=2C") => out.push(','),
            Some("=3D") => out.push('='),
            _ => return Err(AuthError::Malformed("bad escape in user name")),
        }
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Ok(out)
}

/// The attributes of a SCRAM message (`a=value,b=value`), in order.
fn attributes(message: &str) -> Result<Vec<(char, &str)>, AuthError> {
    message
        .split(',')
        .map(|part| {
            let mut chars = part.chars();
            match (chars.next(), chars.next()) {
                (Some(k), Some('=')) if k.is_ascii_alphabetic() => Ok((k, &part[2..])),
                _ => Err(AuthError::Malformed("bad SCRAM attribute")),
            }
        })
        .collect()
}

/// The parsed client-first message.
#[derive(Debug)]
pub(crate) struct ClientFirst {
    pub user: String,
    pub nonce: String,
    /// SCRAM extensions, in order.
    pub extensions: Vec<(String, String)>,
    /// The message without its GS2 header, which the proof covers.
    bare: String,
}

impl ClientFirst {
    /// Whether the client authenticates with a delegation token
    /// (`tokenauth=true`, case-insensitive as in Kafka's ScramExtensions).
    pub(crate) fn token_auth(&self) -> bool {
        self.extensions
            .iter()
            .any(|(k, v)| k == "tokenauth" && v.eq_ignore_ascii_case("true"))
    }

    pub(crate) fn parse(message: &[u8]) -> Result<ClientFirst, AuthError> {
        let message =
            std::str::from_utf8(message).map_err(|_| AuthError::Malformed("not UTF-8"))?;
        // gs2-header: channel binding flag, optional authzid, then the bare message.
        let mut parts = message.splitn(3, ',');
        let cbind = parts.next().unwrap_or_default();
        let _authzid = parts.next().ok_or(AuthError::Malformed("no GS2 header"))?;
        let bare = parts
            .next()
            .ok_or(AuthError::Malformed("no client-first-message-bare"))?;
        if cbind != "n" && cbind != "y" {
            // "p=": channel binding, which Kafka does not offer either.
            return Err(AuthError::Malformed("channel binding is not supported"));
        }
        let mut parts = bare.split(',');
        let user = match parts.next().and_then(|p| p.strip_prefix("n=")) {
            Some(v) => decode_saslname(v)?,
            None => return Err(AuthError::Malformed("no user name")),
        };
        let nonce = match parts.next().and_then(|p| p.strip_prefix("r=")) {
            Some(v) if !v.is_empty() => v.to_string(),
            _ => return Err(AuthError::Malformed("no client nonce")),
        };
        // Kafka's SCRAM extensions (KIP-48): `key=value` after the nonce,
        // keys of word characters; `tokenauth=true` names a delegation token.
        let mut extensions = Vec::new();
        for part in parts {
            match part.split_once('=') {
                Some((k, v))
                    if !k.is_empty()
                        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') =>
                {
                    extensions.push((k.to_string(), v.to_string()))
                }
                _ => return Err(AuthError::Malformed("bad SCRAM extension")),
            }
        }
        Ok(ClientFirst {
            user,
            nonce,
            extensions,
            bare: bare.to_string(),
        })
    }
}

/// A server's exchange after the client-first message and the credential lookup.
pub(crate) struct ServerExchange {
    mechanism: Mechanism,
    credential: Credential,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

impl ServerExchange {
    /// `server_nonce` is random bytes of the server's choosing.
    pub(crate) fn new(
        mechanism: Mechanism,
        client: ClientFirst,
        credential: Credential,
        server_nonce: &[u8],
    ) -> ServerExchange {
        let nonce = format!("{}{}", client.nonce, b64(server_nonce));
        let server_first = format!(
            "r={nonce},s={},i={}",
            b64(&credential.salt),
            credential.iterations
        );
        ServerExchange {
            mechanism,
            credential,
            client_first_bare: client.bare,
            server_first,
            nonce,
        }
    }

    pub(crate) fn server_first(&self) -> &[u8] {
        self.server_first.as_bytes()
    }

    /// Checks the client-final message; on success, the server-final message.
    pub(crate) fn finish(&self, client_final: &[u8]) -> Result<Vec<u8>, AuthError> {
        let message =
            std::str::from_utf8(client_final).map_err(|_| AuthError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = message
            .rsplit_once(",p=")
            .ok_or(AuthError::Malformed("no client proof"))?;
        let attrs = attributes(without_proof)?;
        let nonce = attrs
            .iter()
            .find(|(k, _)| *k == 'r')
            .map(|(_, v)| *v)
            .ok_or(AuthError::Malformed("no nonce"))?;
        // librdkafka before 2.6.1 sends the client nonce once more in front
        // of the combined one; Kafka 3.8.1+ accepts a nonce that ends with
        // the server's, and so does this (the proof covers what was sent).
        if !nonce.ends_with(&self.nonce) {
            return Err(AuthError::Failed("nonce mismatch".into()));
        }
        let proof = unb64(proof)?;
        let auth_message = format!(
            "{},{},{}",
            self.client_first_bare, self.server_first, without_proof
        );
        let m = self.mechanism;
        let signature = m.hmac(&self.credential.stored_key, &[auth_message.as_bytes()]);
        if proof.len() != signature.len() {
            return Err(AuthError::Failed("invalid credentials".into()));
        }
        let client_key: Vec<u8> = proof.iter().zip(&signature).map(|(a, b)| a ^ b).collect();
        let stored = m.hash(&client_key);
        if !bool::from(stored.ct_eq(&self.credential.stored_key)) {
            return Err(AuthError::Failed("invalid credentials".into()));
        }
        let server_signature = m.hmac(&self.credential.server_key, &[auth_message.as_bytes()]);
        Ok(format!("v={}", b64(&server_signature)).into_bytes())
    }
}

/// The client side: the broker's own connections to a SCRAM listener
/// (inter-broker), and the tests of the server side.
pub(crate) mod client {
    use super::*;

    pub struct Client {
        mechanism: Mechanism,
        password: String,
        first_bare: String,
        nonce: String,
        /// What the server must prove in its final message.
        server_signature: Option<Vec<u8>>,
    }

    impl Client {
        /// The client-first message for `user`, with a client `nonce` of
        /// printable characters other than `,`.
        pub fn first(
            mechanism: Mechanism,
            user: &str,
            password: &str,
            nonce: &str,
        ) -> (Client, Vec<u8>) {
            Client::first_with_extensions(mechanism, user, password, nonce, "")
        }

        /// The client-first message with SCRAM extensions
        /// (`tokenauth=true` for a delegation token), `key=value,...`.
        pub fn first_with_extensions(
            mechanism: Mechanism,
            user: &str,
            password: &str,
            nonce: &str,
            extensions: &str,
        ) -> (Client, Vec<u8>) {
            let name = user.replace('=', "=3D").replace(',', "=2C");
            let mut first_bare = format!("n={name},r={nonce}");
            if !extensions.is_empty() {
                first_bare.push(',');
                first_bare.push_str(extensions);
            }
            let msg = format!("n,,{first_bare}").into_bytes();
            (
                Client {
                    mechanism,
                    password: password.to_string(),
                    first_bare,
                    nonce: nonce.to_string(),
                    server_signature: None,
                },
                msg,
            )
        }

        /// The client-final message for a server-first message.
        pub fn last(&mut self, server_first: &[u8]) -> Result<Vec<u8>, AuthError> {
            self.last_with_nonce_prefix(server_first, "")
        }

        /// As librdkafka before 2.6.1 when `prefix` is not empty: `prefix`
        /// in front of the combined nonce.
        pub fn last_with_nonce_prefix(
            &mut self,
            server_first: &[u8],
            prefix: &str,
        ) -> Result<Vec<u8>, AuthError> {
            let sf = std::str::from_utf8(server_first)
                .map_err(|_| AuthError::Malformed("server-first not UTF-8"))?;
            let attrs = attributes(sf)?;
            let get = |k| {
                attrs
                    .iter()
                    .find(|(c, _)| *c == k)
                    .map(|(_, v)| *v)
                    .ok_or(AuthError::Malformed("incomplete server-first message"))
            };
            let nonce = get('r')?;
            if !nonce.starts_with(&self.nonce) || nonce.len() == self.nonce.len() {
                return Err(AuthError::Failed(
                    "server nonce does not extend ours".into(),
                ));
            }
            let salt = unb64(get('s')?)?;
            let iterations: u32 = get('i')?
                .parse()
                .map_err(|_| AuthError::Malformed("bad iteration count"))?;
            // As Kafka's client: a weaker count than the mechanism allows is refused.
            if iterations < MIN_ITERATIONS as u32 {
                return Err(AuthError::Failed(format!(
                    "{iterations} iterations are fewer than {MIN_ITERATIONS}"
                )));
            }
            let m = self.mechanism;
            let salted = m.salted_password(self.password.as_bytes(), &salt, iterations);
            let client_key = m.hmac(&salted, &[b"Client Key"]);
            let stored = m.hash(&client_key);
            let without_proof = format!("c=biws,r={prefix}{nonce}");
            let auth = format!("{},{sf},{without_proof}", self.first_bare);
            let sig = m.hmac(&stored, &[auth.as_bytes()]);
            let proof: Vec<u8> = client_key.iter().zip(&sig).map(|(a, b)| a ^ b).collect();
            let server_key = m.hmac(&salted, &[b"Server Key"]);
            self.server_signature = Some(m.hmac(&server_key, &[auth.as_bytes()]));
            Ok(format!("{without_proof},p={}", b64(&proof)).into_bytes())
        }

        /// Checks the server-final message: the server knew the credential.
        pub fn verify(&self, server_final: &[u8]) -> Result<(), AuthError> {
            let text = std::str::from_utf8(server_final)
                .map_err(|_| AuthError::Malformed("server-final not UTF-8"))?;
            let attrs = attributes(text)?;
            if let Some((_, e)) = attrs.iter().find(|(k, _)| *k == 'e') {
                return Err(AuthError::Failed(format!("server refused: {e}")));
            }
            let v = attrs
                .iter()
                .find(|(k, _)| *k == 'v')
                .ok_or(AuthError::Malformed("no server signature"))?;
            let expected = self
                .server_signature
                .as_ref()
                .ok_or(AuthError::Malformed("server-final before client-final"))?;
            if bool::from(unb64(v.1)?.ct_eq(expected)) {
                Ok(())
            } else {
                Err(AuthError::Failed("wrong server signature".into()))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The example exchange of RFC 7677, section 3.
    #[test]
    fn rfc7677_example_exchange_verifies() {
        let salt = unb64("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let credential = Credential::from_password(Mechanism::Sha256, "pencil", &salt, 4096);
        let first = ClientFirst::parse(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO").unwrap();
        assert_eq!(first.user, "user");
        let mut exchange = ServerExchange::new(Mechanism::Sha256, first, credential, b"");
        // The RFC's server nonce, in place of a random one.
        exchange.nonce = "rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0".to_string();
        exchange.server_first = format!("r={},s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096", exchange.nonce);
        let last = exchange
            .finish(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
            .unwrap();
        assert_eq!(last, b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    #[test]
    fn wrong_password_is_refused_for_both_mechanisms() {
        for m in Mechanism::ALL {
            let credential = Credential::from_password(m, "right", b"salty", 4096);
            for (password, ok) in [("right", true), ("wrong", false)] {
                let (mut client, first) = client::Client::first(m, "alice", password, "abc");
                let parsed = ClientFirst::parse(&first).unwrap();
                let exchange = ServerExchange::new(m, parsed, credential.clone(), b"srv");
                let last = client.last(exchange.server_first()).unwrap();
                let finished = exchange.finish(&last);
                assert_eq!(finished.is_ok(), ok, "{m:?} {password}");
                if let Ok(server_final) = finished {
                    client.verify(&server_final).unwrap();
                    assert!(client.verify(b"v=AAAA").is_err());
                }
            }
            assert!(credential.matches_password(m, "right"));
            assert!(!credential.matches_password(m, "wrong"));
        }
    }

    #[test]
    fn old_librdkafkas_doubled_client_nonce_is_accepted_a_foreign_one_not() {
        let m = Mechanism::Sha256;
        let credential = Credential::from_password(m, "pw", b"salt", 4096);
        for (prefix, ok) in [("", true), ("cnonce", true), ("other", true)] {
            let (mut client, first) = client::Client::first(m, "u", "pw", "cnonce");
            let exchange = ServerExchange::new(
                m,
                ClientFirst::parse(&first).unwrap(),
                credential.clone(),
                b"s",
            );
            let last = client
                .last_with_nonce_prefix(exchange.server_first(), prefix)
                .unwrap();
            assert_eq!(exchange.finish(&last).is_ok(), ok, "{prefix}");
        }
        // A nonce without the server's part is refused by both sides.
        let (mut client, first) = client::Client::first(m, "u", "pw", "cnonce");
        let exchange =
            ServerExchange::new(m, ClientFirst::parse(&first).unwrap(), credential, b"s");
        let forged = b"r=cnonce,s=c2FsdA==,i=4096";
        assert!(client.last(forged).is_err());
        let mut other = client::Client::first(m, "u", "pw", "cnonce").0;
        let last = other
            .last_with_nonce_prefix(b"r=cnonceX,s=c2FsdA==,i=4096", "")
            .unwrap();
        assert!(exchange.finish(&last).is_err());
    }

    #[test]
    fn escaped_user_names_and_bad_messages() {
        let first = ClientFirst::parse(b"n,,n=a=2Cb=3Dc,r=x").unwrap();
        assert_eq!(first.user, "a,b=c");
        assert!(!first.token_auth());
        let token = ClientFirst::parse(b"n,,n=tok,r=x,tokenauth=TRUE,other=").unwrap();
        assert!(token.token_auth());
        assert_eq!(token.extensions.len(), 2);
        assert!(!ClientFirst::parse(b"n,,n=t,r=x,tokenauth=false")
            .unwrap()
            .token_auth());
        for bad in [
            &b"n,,n=a=2,r=x"[..],
            b"p=tls,,n=a,r=x",
            b"n,,r=x",
            b"",
            b"n,,n=a",
            b"n,,n=a,r=x,=v",
            b"n,,n=a,r=x,noequals",
            b"n,,n=a,r=x,t-k=v",
            b"\xff",
        ] {
            assert!(ClientFirst::parse(bad).is_err(), "{bad:?}");
        }
    }
}
