//! SCRAM credentials, durable where the topic catalog is durable.
//!
//! A broker alone keeps them as one JSON object in the object store
//! (`security/scram-credentials.json`), read at start and rewritten whole on
//! every change, so a wiped data directory loses none. A cluster keeps one
//! etcd key per user (`<prefix>/scram/<user>`), read at every authentication
//! so that a credential changed through any broker counts on all of them at
//! once. Either way only salts, iteration counts and the derived keys are
//! written, never a password.

use std::collections::BTreeMap;
use std::sync::Arc;

use object_store::path::Path;
use object_store::{ObjectStore, PutPayload};
use parking_lot::RwLock;

use super::scram::{Credential, Mechanism};
use super::{store_err, AuthError};
use crate::cluster::{Etcd, Op, Txn};

/// A user's credentials, by mechanism name.
pub(crate) type UserCredentials = BTreeMap<String, Credential>;

pub(crate) const STORE_KEY: &str = "security/scram-credentials.json";

/// One change of AlterUserScramCredentials.
pub(crate) enum Change {
    Upsert(Mechanism, Credential),
    Delete(Mechanism),
}

pub(crate) struct Credentials {
    backend: Backend,
    /// Every user's credentials (object-store backend only).
    cache: RwLock<BTreeMap<String, UserCredentials>>,
    /// Serializes whole-object rewrites.
    write: tokio::sync::Mutex<()>,
}

enum Backend {
    Store(Arc<dyn ObjectStore>),
    Etcd { etcd: Etcd, prefix: String },
}

impl Credentials {
    pub(crate) async fn open_store(store: Arc<dyn ObjectStore>) -> Result<Credentials, AuthError> {
        let cache = super::load_json(store.as_ref(), STORE_KEY).await?;
        Ok(Credentials {
            backend: Backend::Store(store),
            cache: RwLock::new(cache),
            write: tokio::sync::Mutex::new(()),
        })
    }

    pub(crate) fn open_etcd(etcd: Etcd) -> Credentials {
        Credentials {
            backend: Backend::Etcd {
                prefix: format!("{}scram/", etcd.keys().root()),
                etcd,
            },
            cache: RwLock::new(BTreeMap::new()),
            write: tokio::sync::Mutex::new(()),
        }
    }

    /// One user's credentials (empty when the user has none).
    pub(crate) async fn user(&self, name: &str) -> Result<UserCredentials, AuthError> {
        match &self.backend {
            Backend::Store(_) => Ok(self.cache.read().get(name).cloned().unwrap_or_default()),
            Backend::Etcd { etcd, prefix } => {
                match etcd
                    .get(&format!("{prefix}{name}"))
                    .await
                    .map_err(store_err)?
                {
                    Some(kv) => serde_json::from_slice(&kv.value).map_err(store_err),
                    None => Ok(BTreeMap::new()),
                }
            }
        }
    }

    /// Every user that has a credential.
    pub(crate) async fn all(&self) -> Result<BTreeMap<String, UserCredentials>, AuthError> {
        match &self.backend {
            Backend::Store(_) => Ok(self.cache.read().clone()),
            Backend::Etcd { etcd, prefix } => {
                let (_, kvs) = etcd.get_prefix(prefix).await.map_err(store_err)?;
                let mut out = BTreeMap::new();
                for kv in kvs {
                    let name = kv.key.strip_prefix(prefix.as_str()).unwrap_or(&kv.key);
                    out.insert(
                        name.to_string(),
                        serde_json::from_slice(&kv.value).map_err(store_err)?,
                    );
                }
                Ok(out)
            }
        }
    }

    /// Applies changes to several users and makes them durable before returning.
    pub(crate) async fn alter(&self, changes: Vec<(String, Change)>) -> Result<(), AuthError> {
        if changes.is_empty() {
            return Ok(());
        }
        let _serial = self.write.lock().await;
        let mut by_user: BTreeMap<String, UserCredentials> = BTreeMap::new();
        for (user, _) in &changes {
            if !by_user.contains_key(user) {
                by_user.insert(user.clone(), self.user(user).await?);
            }
        }
        for (user, change) in changes {
            let creds = by_user.get_mut(&user).expect("loaded above");
            match change {
                Change::Upsert(m, c) => {
                    creds.insert(m.name().to_string(), c);
                }
                Change::Delete(m) => {
                    creds.remove(m.name());
                }
            }
        }
        match &self.backend {
            Backend::Store(store) => {
                let mut all = self.cache.read().clone();
                for (user, creds) in by_user {
                    if creds.is_empty() {
                        all.remove(&user);
                    } else {
                        all.insert(user, creds);
                    }
                }
                let json = serde_json::to_vec(&all).map_err(store_err)?;
                store
                    .put(&Path::from(STORE_KEY), PutPayload::from(json))
                    .await
                    .map_err(store_err)?;
                *self.cache.write() = all;
            }
            Backend::Etcd { etcd, prefix } => {
                let mut ops = Vec::new();
                for (user, creds) in by_user {
                    let key = format!("{prefix}{user}");
                    if creds.is_empty() {
                        ops.push(Op::Delete(key));
                    } else {
                        let json = serde_json::to_vec(&creds).map_err(store_err)?;
                        ops.push(Op::put(key, json));
                    }
                }
                etcd.txn(Txn::default().then(ops))
                    .await
                    .map_err(store_err)?;
            }
        }
        Ok(())
    }
}

/// The form of `kafka-storage.sh format --add-scram`:
/// `SCRAM-SHA-512=[name=alice,password=secret]`, optionally `iterations=N`
/// (the salt is always drawn at random).
pub(crate) fn parse_add_scram(s: &str) -> Result<(Mechanism, String, String, i32), String> {
    let (mech, rest) = s
        .split_once('=')
        .ok_or_else(|| format!("expected MECHANISM=[name=...,password=...] in {s:?}"))?;
    let mechanism =
        Mechanism::from_name(mech.trim()).ok_or_else(|| format!("unknown mechanism {mech:?}"))?;
    let inner = rest
        .trim()
        .strip_prefix('[')
        .and_then(|r| r.strip_suffix(']'))
        .ok_or_else(|| format!("expected [...] after {mech} in {s:?}"))?;
    let (mut name, mut password, mut iterations) = (None, None, 4096);
    for part in inner.split(',') {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("expected key=value in {part:?}"))?;
        let v = v.trim().trim_matches('"');
        match k.trim() {
            "name" => name = Some(v.to_string()),
            "password" => password = Some(v.to_string()),
            "iterations" => iterations = v.parse().map_err(|_| format!("bad iterations {v:?}"))?,
            other => return Err(format!("unknown key {other:?} in {s:?}")),
        }
    }
    Ok((
        mechanism,
        name.ok_or("name= is missing")?,
        password.ok_or("password= is missing")?,
        iterations,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn credentials_survive_a_reopen_and_hold_no_password() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let creds = Credentials::open_store(store.clone()).await.unwrap();
        let c = Credential::from_password(Mechanism::Sha512, "hunter2", b"salt", 4096);
        creds
            .alter(vec![(
                "alice".into(),
                Change::Upsert(Mechanism::Sha512, c.clone()),
            )])
            .await
            .unwrap();
        let raw = store
            .get(&Path::from(STORE_KEY))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert!(!String::from_utf8_lossy(&raw).contains("hunter2"));
        let reopened = Credentials::open_store(store.clone()).await.unwrap();
        assert_eq!(reopened.user("alice").await.unwrap()["SCRAM-SHA-512"], c);
        reopened
            .alter(vec![("alice".into(), Change::Delete(Mechanism::Sha512))])
            .await
            .unwrap();
        assert!(Credentials::open_store(store)
            .await
            .unwrap()
            .all()
            .await
            .unwrap()
            .is_empty());
    }

    #[test]
    fn add_scram_flag_parses_kafka_form() {
        let (m, name, pw, it) =
            parse_add_scram("SCRAM-SHA-512=[name=alice,password=alice-secret]").unwrap();
        assert_eq!(
            (m, name.as_str(), pw.as_str(), it),
            (Mechanism::Sha512, "alice", "alice-secret", 4096)
        );
        assert!(parse_add_scram("SCRAM-SHA-1=[name=a,password=b]").is_err());
        assert!(parse_add_scram("SCRAM-SHA-256=[name=a]").is_err());
    }
}
