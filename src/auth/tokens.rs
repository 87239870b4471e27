//! Delegation tokens (KIP-48, KIP-373): short-lived SCRAM credentials that a
//! user obtains from the broker for itself or, when ACLs allow, for another.
//!
//! A token is a random id and what it is about: its owner, who asked for
//! it, who may renew it, when it was issued, when it expires and the latest
//! expiry renewals may reach. Its password is never stored: as in Kafka it
//! is the HMAC-SHA512 of the token id under `delegation.token.secret.key`,
//! so every broker holding the same secret recomputes it, and a client
//! authenticates with SCRAM as user `<token id>`, password `base64(HMAC)`
//! and the extension `tokenauth=true`, after which it acts as the owner.
//!
//! The records are kept where SCRAM credentials are: one JSON object in the
//! object store for a broker alone (`security/delegation-tokens.json`,
//! rewritten whole on every change), one etcd key per token in a cluster
//! (`<prefix>/tokens/<id>`), read at every use so that a token renewed or
//! expired through any broker counts on all of them at once; a change there
//! is written only if the key is still at the revision it was read at.
//!
//! The rules (who may renew, how far an expiry may go, what an expired
//! token answers) are Kafka's DelegationTokenControlManager's; they live
//! here as plain functions of the stored token and the time, and the API
//! layer turns their errors into Kafka's error codes.

use std::collections::BTreeMap;
use std::sync::Arc;

use base64::Engine;
use hmac::{Hmac, Mac};
use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use sha2::Sha512;
use subtle::ConstantTimeEq;

use super::scram::{Credential, Mechanism, MIN_ITERATIONS};
use super::{store_err, AuthError};
use crate::clock::{SharedClock, SharedRandom};
use crate::cluster::{Compare, Etcd, Op, Txn};
use crate::principal::Principal;

pub(crate) const STORE_KEY: &str = "security/delegation-tokens.json";

/// How often a write that lost a race with another broker is tried again.
const RETRIES: usize = 5;

/// Kafka's delegation.token.* settings.
#[derive(Debug, Clone)]
pub(crate) struct TokenSettings {
    /// delegation.token.secret.key; without it tokens are disabled.
    pub secret_key: Option<String>,
    /// delegation.token.max.lifetime.ms: no renewal goes past issue + this.
    pub max_lifetime_ms: i64,
    /// delegation.token.expiry.time.ms: the expiry a creation or renewal
    /// gives when the request names none (and the longest it may name).
    pub expiry_time_ms: i64,
}

/// One token as it is stored (Kafka's TokenInformation). Principals are in
/// Kafka's `Type:name` form.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct TokenInfo {
    pub token_id: String,
    pub owner: String,
    pub requester: String,
    pub renewers: Vec<String>,
    pub issue_ms: i64,
    pub max_ms: i64,
    pub expiry_ms: i64,
}

impl TokenInfo {
    fn principal(s: &str) -> Principal {
        Principal::parse(s).unwrap_or_else(|| Principal::user(s))
    }

    pub(crate) fn owner(&self) -> Principal {
        Self::principal(&self.owner)
    }

    pub(crate) fn requester(&self) -> Principal {
        Self::principal(&self.requester)
    }

    pub(crate) fn renewers(&self) -> Vec<Principal> {
        self.renewers.iter().map(|r| Self::principal(r)).collect()
    }

    /// Whether it expired (or passed its max lifetime) before `now_ms`.
    pub(crate) fn expired(&self, now_ms: i64) -> bool {
        self.max_ms < now_ms || self.expiry_ms < now_ms
    }

    /// Kafka's allowedToRenew: the owner or a named renewer.
    pub(crate) fn may_renew(&self, p: &Principal) -> bool {
        let name = p.to_string();
        self.owner == name || self.renewers.contains(&name)
    }

    /// Kafka's TokenInformation.ownerOrRenewer, which decides who sees a
    /// token in DescribeDelegationToken: the owner, the requester, a renewer.
    pub(crate) fn owner_or_renewer(&self, p: &Principal) -> bool {
        self.may_renew(p) || self.requester == p.to_string()
    }
}

/// HmacSHA512 of the token id under the secret key, as Kafka computes it.
pub(crate) fn hmac(secret: &str, token_id: &str) -> Vec<u8> {
    let mut mac = <Hmac<Sha512> as hmac::digest::KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC takes keys of any length");
    mac.update(token_id.as_bytes());
    mac.finalize().into_bytes().to_vec()
}

/// The SCRAM password of a token: its HMAC in standard base64.
pub(crate) fn password(hmac: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(hmac)
}

/// A new token id as Kafka's `Uuid.randomUuid().toString()` writes one:
/// 16 random bytes in URL-safe base64 without padding, never starting
/// with `-` (Kafka draws again then, since such ids read as options).
pub(crate) fn new_token_id(random: &SharedRandom) -> String {
    loop {
        let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(random.uuid().as_bytes());
        if !id.starts_with('-') {
            return id;
        }
    }
}

/// What CreateDelegationToken asks for, once the API layer has checked
/// who may ask it.
pub(crate) struct CreateRequest {
    pub requester: Principal,
    /// None: the requester owns the token.
    pub owner: Option<Principal>,
    pub renewers: Vec<Principal>,
    /// The request's max lifetime; ≤ 0 means the broker's.
    pub max_lifetime_ms: i64,
}

/// A created token and its HMAC.
pub(crate) struct Created {
    pub info: TokenInfo,
    pub hmac: Vec<u8>,
}

enum Write {
    Put(TokenInfo),
    Delete(String),
}

enum Backend {
    Store(Arc<dyn ObjectStore>),
    Etcd { etcd: Etcd, prefix: String },
}

/// The delegation tokens and their rules.
pub(crate) struct Tokens {
    settings: TokenSettings,
    backend: Backend,
    /// Every token (object-store backend only).
    cache: parking_lot::RwLock<BTreeMap<String, TokenInfo>>,
    /// Serializes whole-object rewrites and read-modify-writes.
    write: tokio::sync::Mutex<()>,
    clock: SharedClock,
    random: SharedRandom,
}

impl Tokens {
    pub(crate) async fn open_store(
        store: Arc<dyn ObjectStore>,
        settings: TokenSettings,
        clock: SharedClock,
        random: SharedRandom,
    ) -> Result<Tokens, AuthError> {
        let cache = super::load_json(store.as_ref(), STORE_KEY).await?;
        Ok(Tokens {
            settings,
            backend: Backend::Store(store),
            cache: parking_lot::RwLock::new(cache),
            write: tokio::sync::Mutex::new(()),
            clock,
            random,
        })
    }

    pub(crate) fn open_etcd(
        etcd: Etcd,
        settings: TokenSettings,
        clock: SharedClock,
        random: SharedRandom,
    ) -> Tokens {
        Tokens {
            settings,
            backend: Backend::Etcd {
                prefix: format!("{}tokens/", etcd.keys().root()),
                etcd,
            },
            cache: parking_lot::RwLock::new(BTreeMap::new()),
            write: tokio::sync::Mutex::new(()),
            clock,
            random,
        }
    }

    pub(crate) fn enabled(&self) -> bool {
        self.settings.secret_key.is_some()
    }

    pub(crate) fn now_ms(&self) -> i64 {
        self.clock.now_ms()
    }

    fn secret(&self) -> Result<&str, AuthError> {
        self.settings
            .secret_key
            .as_deref()
            .ok_or(AuthError::TokensDisabled)
    }

    /// The HMAC of a stored token.
    pub(crate) fn hmac_of(&self, info: &TokenInfo) -> Result<Vec<u8>, AuthError> {
        Ok(hmac(self.secret()?, &info.token_id))
    }

    /// Every token with the etcd revision it was read at (0 in the store).
    async fn load(&self) -> Result<Vec<(TokenInfo, i64)>, AuthError> {
        match &self.backend {
            Backend::Store(_) => Ok(self.cache.read().values().map(|t| (t.clone(), 0)).collect()),
            Backend::Etcd { etcd, prefix } => {
                let (_, kvs) = etcd.get_prefix(prefix).await.map_err(store_err)?;
                kvs.iter()
                    .map(|kv| {
                        Ok((
                            serde_json::from_slice(&kv.value).map_err(store_err)?,
                            kv.mod_revision,
                        ))
                    })
                    .collect()
            }
        }
    }

    /// Every stored token, expired ones the periodic check has not removed yet included.
    pub(crate) async fn all(&self) -> Result<Vec<TokenInfo>, AuthError> {
        Ok(self.load().await?.into_iter().map(|(t, _)| t).collect())
    }

    /// One token by id.
    async fn get(&self, token_id: &str) -> Result<Option<TokenInfo>, AuthError> {
        match &self.backend {
            Backend::Store(_) => Ok(self.cache.read().get(token_id).cloned()),
            Backend::Etcd { etcd, prefix } => {
                match etcd
                    .get(&format!("{prefix}{token_id}"))
                    .await
                    .map_err(store_err)?
                {
                    Some(kv) => Ok(Some(serde_json::from_slice(&kv.value).map_err(store_err)?)),
                    None => Ok(None),
                }
            }
        }
    }

    /// Makes one change durable; in etcd only if the key is still at
    /// `revision` (0: does not exist). False when another broker got there first.
    async fn apply(&self, write: Write, revision: i64) -> Result<bool, AuthError> {
        match &self.backend {
            Backend::Store(store) => {
                let mut all = self.cache.read().clone();
                match &write {
                    Write::Put(t) => {
                        all.insert(t.token_id.clone(), t.clone());
                    }
                    Write::Delete(id) => {
                        all.remove(id);
                    }
                }
                let json = serde_json::to_vec(&all).map_err(store_err)?;
                store
                    .put(&Path::from(STORE_KEY), PutPayload::from(json))
                    .await
                    .map_err(store_err)?;
                *self.cache.write() = all;
                Ok(true)
            }
            Backend::Etcd { etcd, prefix } => {
                let (key, op) = match &write {
                    Write::Put(t) => {
                        let key = format!("{prefix}{}", t.token_id);
                        let json = serde_json::to_vec(t).map_err(store_err)?;
                        (key.clone(), Op::put(key, json))
                    }
                    Write::Delete(id) => {
                        let key = format!("{prefix}{id}");
                        (key.clone(), Op::Delete(key))
                    }
                };
                let txn = Txn::when([Compare::ModRevision(key, revision)]).then([op]);
                Ok(etcd.txn(txn).await.map_err(store_err)?.succeeded)
            }
        }
    }

    /// CreateDelegationToken: expiry at now + expiry.time.ms, never past
    /// now + the smaller of the request's and the broker's max lifetime.
    pub(crate) async fn create(&self, req: CreateRequest) -> Result<Created, AuthError> {
        let secret = self.secret()?.to_string();
        if let Some(bad) = req.renewers.iter().find(|r| r.kind != "User") {
            return Err(AuthError::InvalidPrincipalType(bad.to_string()));
        }
        let now = self.now_ms();
        let mut max_lifetime = self.settings.max_lifetime_ms;
        if req.max_lifetime_ms > 0 {
            max_lifetime = max_lifetime.min(req.max_lifetime_ms);
        }
        let max_ms = now.saturating_add(max_lifetime);
        let expiry_ms = max_ms.min(now.saturating_add(self.settings.expiry_time_ms));
        let info = TokenInfo {
            token_id: new_token_id(&self.random),
            owner: req
                .owner
                .unwrap_or_else(|| req.requester.clone())
                .to_string(),
            requester: req.requester.to_string(),
            renewers: req.renewers.iter().map(|r| r.to_string()).collect(),
            issue_ms: now,
            max_ms,
            expiry_ms,
        };
        let _serial = self.write.lock().await;
        if !self.apply(Write::Put(info.clone()), 0).await? {
            return Err(AuthError::Store("token id already taken".into()));
        }
        tracing::info!(
            token = info.token_id,
            owner = info.owner,
            "delegation token created"
        );
        let hmac = hmac(&secret, &info.token_id);
        Ok(Created { info, hmac })
    }

    /// The stored token whose HMAC is `given`, with its revision.
    async fn by_hmac(&self, given: &[u8]) -> Result<(TokenInfo, i64), AuthError> {
        let secret = self.secret()?;
        self.load()
            .await?
            .into_iter()
            .find(|(t, _)| bool::from(hmac(secret, &t.token_id).ct_eq(given)))
            .ok_or(AuthError::TokenNotFound)
    }

    /// Finds the token by HMAC, lets `rule` decide, writes what it decided
    /// unless another broker changed the token meanwhile (then again).
    async fn modify(
        &self,
        given_hmac: &[u8],
        rule: impl Fn(&TokenInfo, i64) -> Result<(Write, i64), AuthError>,
    ) -> Result<i64, AuthError> {
        self.secret()?;
        let _serial = self.write.lock().await;
        for _ in 0..RETRIES {
            let (token, revision) = self.by_hmac(given_hmac).await?;
            let (write, answer) = rule(&token, self.now_ms())?;
            if self.apply(write, revision).await? {
                return Ok(answer);
            }
        }
        Err(AuthError::Store(
            "the token kept changing under this request".into(),
        ))
    }

    /// RenewDelegationToken: the new expiry, now + the smaller of the
    /// request's period and expiry.time.ms, never past the max timestamp.
    pub(crate) async fn renew(
        &self,
        given_hmac: &[u8],
        renewer: &Principal,
        period_ms: i64,
    ) -> Result<i64, AuthError> {
        let default = self.settings.expiry_time_ms;
        self.modify(given_hmac, |token, now| {
            if token.expired(now) {
                return Err(AuthError::TokenExpired);
            }
            if !token.may_renew(renewer) {
                return Err(AuthError::TokenOwnerMismatch(renewer.to_string()));
            }
            let mut lifetime = default;
            if period_ms > 0 {
                lifetime = lifetime.min(period_ms);
            }
            let expiry = token.max_ms.min(now.saturating_add(lifetime));
            let renewed = TokenInfo {
                expiry_ms: expiry,
                ..token.clone()
            };
            Ok((Write::Put(renewed), expiry))
        })
        .await
    }

    /// ExpireDelegationToken: a negative period removes the token at once
    /// (and Kafka answers that period as the expiry), any other sets the
    /// expiry to now + period, never past the max timestamp.
    pub(crate) async fn expire(
        &self,
        given_hmac: &[u8],
        by: &Principal,
        period_ms: i64,
    ) -> Result<i64, AuthError> {
        self.modify(given_hmac, |token, now| {
            if token.expired(now) {
                return Err(AuthError::TokenExpired);
            }
            if !token.may_renew(by) {
                return Err(AuthError::TokenOwnerMismatch(by.to_string()));
            }
            if period_ms < 0 {
                return Ok((Write::Delete(token.token_id.clone()), period_ms));
            }
            let expiry = token.max_ms.min(now.saturating_add(period_ms));
            let expired = TokenInfo {
                expiry_ms: expiry,
                ..token.clone()
            };
            Ok((Write::Put(expired), expiry))
        })
        .await
    }

    /// The periodic check (delegation.token.expiry.check.interval.ms):
    /// removes every token past its expiry or max timestamp; how many.
    pub(crate) async fn remove_expired(&self) -> Result<usize, AuthError> {
        let _serial = self.write.lock().await;
        let now = self.now_ms();
        let mut removed = 0;
        for (token, revision) in self.load().await? {
            if token.expired(now)
                && self
                    .apply(Write::Delete(token.token_id.clone()), revision)
                    .await?
            {
                tracing::info!(
                    token = token.token_id,
                    owner = token.owner,
                    "delegation token expired and removed"
                );
                removed += 1;
            }
        }
        Ok(removed)
    }

    /// What SCRAM with `tokenauth=true` authenticates against: the owner and
    /// expiry of an unexpired token and a credential for its password,
    /// salted afresh. None for an unknown or expired token, or when tokens
    /// are disabled.
    pub(crate) async fn scram_credential(
        &self,
        token_id: &str,
        mechanism: Mechanism,
        salt: Vec<u8>,
    ) -> Result<Option<(TokenInfo, Credential)>, AuthError> {
        let Some(secret) = self.settings.secret_key.clone() else {
            return Ok(None);
        };
        let Some(token) = self.get(token_id).await? else {
            return Ok(None);
        };
        if token.expired(self.now_ms()) {
            return Ok(None);
        }
        let id = token.token_id.clone();
        // PBKDF2 costs milliseconds: off the I/O threads.
        let credential = tokio::task::spawn_blocking(move || {
            let password = password(&hmac(&secret, &id));
            Credential::from_password(mechanism, &password, &salt, MIN_ITERATIONS)
        })
        .await
        .map_err(store_err)?;
        Ok(Some((token, credential)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock, SeededRandom};
    use std::time::Duration;

    const HOUR: i64 = 3_600_000;

    fn settings(secret: Option<&str>) -> TokenSettings {
        TokenSettings {
            secret_key: secret.map(str::to_string),
            max_lifetime_ms: 7 * 24 * HOUR,
            expiry_time_ms: 24 * HOUR,
        }
    }

    async fn open(
        store: &Arc<dyn ObjectStore>,
        secret: Option<&str>,
    ) -> (Tokens, Arc<ManualClock>) {
        let clock = ManualClock::new(1_000_000);
        let tokens = Tokens::open_store(
            store.clone(),
            settings(secret),
            clock.clone(),
            Arc::new(SeededRandom::new(7)),
        )
        .await
        .unwrap();
        (tokens, clock)
    }

    fn alice() -> Principal {
        Principal::user("alice")
    }

    #[test]
    fn hmac_is_hmac_sha512_of_the_id_under_the_secret() {
        // RFC 4231, test case 2: what javax.crypto's HmacSHA512 gives Kafka.
        let got = hmac("Jefe", "what do ya want for nothing?");
        let want = "164b7a7bfcf819e2e395fbe73b56e0a387bd64222e831fd610270cd7ea250554\
                    9758bf75c05a994a6d034f65f8f0e6fdcaeab1a34d4a6b4b636e070a38bce737";
        let hex: String = got.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, want);
        assert_eq!(password(&[0xfb, 0xff]), "+/8=", "standard base64, padded");
    }

    #[tokio::test]
    async fn lifetimes_are_capped_renewals_follow_the_rules_and_tokens_survive_a_reopen() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let (tokens, clock) = open(&store, Some("s3cr3t")).await;
        let now = clock.now_ms();
        let created = tokens
            .create(CreateRequest {
                requester: alice(),
                owner: None,
                renewers: vec![Principal::user("bob")],
                max_lifetime_ms: 2 * HOUR,
            })
            .await
            .unwrap();
        assert_eq!(created.info.max_ms, now + 2 * HOUR);
        assert_eq!(
            created.info.expiry_ms,
            now + 2 * HOUR,
            "expiry capped by max"
        );
        assert_eq!(created.info.token_id.len(), 22);
        // Renewal by a stranger, then by the renewer, capped by max.
        assert_eq!(
            tokens
                .renew(&created.hmac, &Principal::user("eve"), HOUR)
                .await,
            Err(AuthError::TokenOwnerMismatch("User:eve".into()))
        );
        clock.advance(Duration::from_secs(1800));
        let renewed = tokens
            .renew(&created.hmac, &Principal::user("bob"), HOUR)
            .await
            .unwrap();
        assert_eq!(renewed, clock.now_ms() + HOUR);
        assert_eq!(
            tokens.renew(&created.hmac, &alice(), 10 * HOUR).await,
            Ok(now + 2 * HOUR)
        );
        assert_eq!(
            tokens.renew(b"not an hmac", &alice(), HOUR).await,
            Err(AuthError::TokenNotFound)
        );
        // The store keeps it, without its HMAC.
        let raw = store
            .get(&Path::from(STORE_KEY))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains(&password(&created.hmac)));
        let (reopened, _) = open(&store, Some("s3cr3t")).await;
        assert_eq!(reopened.all().await.unwrap().len(), 1);
        // Expired by time: renew and expire say so; the check removes it.
        clock.advance(Duration::from_millis(2 * HOUR as u64));
        assert_eq!(
            tokens.expire(&created.hmac, &alice(), 0).await,
            Err(AuthError::TokenExpired)
        );
        assert_eq!(tokens.remove_expired().await.unwrap(), 1);
        assert!(tokens.all().await.unwrap().is_empty());
    }

    #[tokio::test]
    async fn a_negative_expiry_period_removes_the_token_at_once() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let (tokens, _) = open(&store, Some("k")).await;
        let t = tokens
            .create(CreateRequest {
                requester: alice(),
                owner: None,
                renewers: vec![],
                max_lifetime_ms: 0,
            })
            .await
            .unwrap();
        assert_eq!(tokens.expire(&t.hmac, &alice(), -1).await, Ok(-1));
        assert!(tokens.all().await.unwrap().is_empty());
        assert_eq!(
            tokens.expire(&t.hmac, &alice(), -1).await,
            Err(AuthError::TokenNotFound)
        );
    }

    #[tokio::test]
    async fn without_a_secret_key_nothing_is_created() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let (tokens, _) = open(&store, None).await;
        let req = CreateRequest {
            requester: alice(),
            owner: None,
            renewers: vec![],
            max_lifetime_ms: 0,
        };
        assert!(matches!(
            tokens.create(req).await,
            Err(AuthError::TokensDisabled)
        ));
        assert_eq!(
            tokens.renew(b"x", &alice(), 1).await,
            Err(AuthError::TokensDisabled)
        );
    }
}
