//! Who may do what, and how fast: ACLs, client quotas, and where they are
//! kept.
//!
//! Both are small and read on every request, so the broker holds them in
//! memory as one document and changes them as a whole: a change is read,
//! applied and written back with a compare-and-swap on the version it read,
//! retried on a conflict, and only then visible. The document lives where
//! the topic catalog lives, so it survives a wiped data directory: in the
//! object store (`access.json`) for a broker that runs alone, in etcd for a
//! cluster (its backend is `cluster::access`, which every broker polls).
//! The authorizer is off unless `--authorizer acl` is given, as Kafka
//! without `authorizer.class.name`: then every request is allowed.

pub(crate) mod acl;
pub(crate) mod quota;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use object_store::path::Path;
use object_store::{ObjectStore, PutMode, PutOptions, UpdateVersion};
use parking_lot::RwLock;
use serde::{Deserialize, Serialize};

use crate::principal::Principal;
use acl::{AclBinding, AuthorizerSettings, Operation, ResourceType};
use quota::{Direction, Meters, QuotaEntry};

/// The store key of the document for a broker that runs alone.
pub(crate) const ACCESS_FILE: &str = "access.json";
/// How many times a change is retried against concurrent writers.
const CAS_ATTEMPTS: usize = 16;

#[derive(Debug, thiserror::Error)]
pub(crate) enum AccessError {
    #[error("access document storage: {0}")]
    Storage(String),
    #[error("access document changed concurrently too often")]
    Conflict,
}

/// Everything this module keeps durable.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct AccessDoc {
    #[serde(default)]
    pub acls: Vec<AclBinding>,
    #[serde(default)]
    pub quotas: Vec<QuotaEntry>,
}

/// The version a backend compares on; `None` for a document never written.
pub(crate) type Version = Option<String>;

/// Where the document lives.
pub(crate) trait Backend: Send + Sync {
    fn load(&self) -> BoxFuture<'_, Result<(AccessDoc, Version), AccessError>>;
    /// Writes `doc` if the stored version is still `expected`; `Ok(None)` if it is not.
    fn save<'a>(
        &'a self,
        doc: &'a AccessDoc,
        expected: &'a Version,
    ) -> BoxFuture<'a, Result<Option<Version>, AccessError>>;
}

/// The document as `access.json` in the object store, compared on its ETag.
pub(crate) struct StoreBackend {
    store: Arc<dyn ObjectStore>,
}

impl StoreBackend {
    pub(crate) fn new(store: Arc<dyn ObjectStore>) -> StoreBackend {
        StoreBackend { store }
    }
}

impl Backend for StoreBackend {
    fn load(&self) -> BoxFuture<'_, Result<(AccessDoc, Version), AccessError>> {
        Box::pin(async move {
            match self.store.get(&Path::from(ACCESS_FILE)).await {
                Ok(r) => {
                    let version = r.meta.e_tag.clone();
                    let bytes = r.bytes().await.map_err(storage)?;
                    let doc = serde_json::from_slice(&bytes)
                        .map_err(|e| AccessError::Storage(format!("{ACCESS_FILE}: {e}")))?;
                    Ok((doc, version.or(Some(String::new()))))
                }
                Err(object_store::Error::NotFound { .. }) => Ok((AccessDoc::default(), None)),
                Err(e) => Err(storage(e)),
            }
        })
    }

    fn save<'a>(
        &'a self,
        doc: &'a AccessDoc,
        expected: &'a Version,
    ) -> BoxFuture<'a, Result<Option<Version>, AccessError>> {
        Box::pin(async move {
            let json = serde_json::to_vec_pretty(doc).map_err(storage)?;
            let mode = match expected {
                None => PutMode::Create,
                // A store without ETags: one broker writes it, under the lock in `Access`.
                Some(tag) if tag.is_empty() => PutMode::Overwrite,
                Some(tag) => PutMode::Update(UpdateVersion {
                    e_tag: Some(tag.clone()),
                    version: None,
                }),
            };
            let opts = PutOptions {
                mode,
                ..Default::default()
            };
            let path = Path::from(ACCESS_FILE);
            match self
                .store
                .put_opts(&path, Bytes::from(json).into(), opts)
                .await
            {
                Ok(r) => Ok(Some(r.e_tag.or(Some(String::new())))),
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => Ok(None),
                Err(object_store::Error::NotImplemented) => {
                    // Stores without conditional writes (local files): last writer wins.
                    self.store
                        .put(
                            &path,
                            Bytes::from(serde_json::to_vec_pretty(doc).map_err(storage)?).into(),
                        )
                        .await
                        .map_err(storage)?;
                    Ok(Some(Some(String::new())))
                }
                Err(e) => Err(storage(e)),
            }
        })
    }
}

fn storage(e: impl std::fmt::Display) -> AccessError {
    AccessError::Storage(e.to_string())
}

/// How the broker authorizes: off (everything allowed), or by ACLs.
#[derive(Debug, Clone, Default)]
pub struct AccessSettings {
    pub authorizer: bool,
    pub acl: AuthorizerSettings,
}

/// The broker's ACLs and quotas, in memory and durable.
pub(crate) struct Access {
    settings: AccessSettings,
    current: RwLock<(Arc<AccessDoc>, Version)>,
    backend: Box<dyn Backend>,
    /// Serializes this broker's changes (other brokers are caught by the version).
    writing: tokio::sync::Mutex<()>,
    meters: Meters,
}

impl Access {
    /// Loads the document from `backend`.
    pub(crate) async fn open(
        settings: AccessSettings,
        backend: Box<dyn Backend>,
    ) -> Result<Access, AccessError> {
        let (doc, version) = backend.load().await?;
        Ok(Access {
            settings,
            current: RwLock::new((Arc::new(doc), version)),
            backend,
            writing: tokio::sync::Mutex::new(()),
            meters: Meters::default(),
        })
    }

    /// Whether requests are authorized at all (`--authorizer acl`).
    pub(crate) fn authorizer_enabled(&self) -> bool {
        self.settings.authorizer
    }

    pub(crate) fn doc(&self) -> Arc<AccessDoc> {
        self.current.read().0.clone()
    }

    /// Whether `principal` from `host` may perform `op` on `(kind, name)`.
    pub(crate) fn authorize(
        &self,
        principal: &Principal,
        host: &str,
        op: Operation,
        kind: ResourceType,
        name: &str,
    ) -> bool {
        if !self.settings.authorizer {
            return true;
        }
        let doc = self.doc();
        acl::authorize(
            &self.settings.acl,
            &doc.acls,
            principal,
            host,
            op,
            kind,
            name,
        )
    }

    /// Applies `change` to the durable document (retrying it on a newer one
    /// if another broker changed it meanwhile) and returns what it returned.
    pub(crate) async fn update<R>(
        &self,
        mut change: impl FnMut(&mut AccessDoc) -> R,
    ) -> Result<R, AccessError> {
        let _one_at_a_time = self.writing.lock().await;
        for _ in 0..CAS_ATTEMPTS {
            let (base, version) = self.current.read().clone();
            let mut next = (*base).clone();
            let result = change(&mut next);
            if next == *base {
                return Ok(result);
            }
            match self.backend.save(&next, &version).await? {
                Some(v) => {
                    *self.current.write() = (Arc::new(next), v);
                    return Ok(result);
                }
                None => self.refresh().await?,
            }
        }
        Err(AccessError::Conflict)
    }

    /// Rereads the document (cluster mode: what other brokers changed).
    pub(crate) async fn refresh(&self) -> Result<(), AccessError> {
        let (doc, version) = self.backend.load().await?;
        let mut current = self.current.write();
        if current.1 != version {
            *current = (Arc::new(doc), version);
        }
        Ok(())
    }

    /// Records `amount` (bytes produced or fetched, or nanoseconds of
    /// handler time) used by `(user, client_id)` and returns how long to
    /// throttle it (zero without a quota or under it).
    pub(crate) fn record_usage(
        &self,
        direction: Direction,
        principal: &Principal,
        client_id: &str,
        amount: u64,
        now_ms: u64,
    ) -> Duration {
        let doc = self.doc();
        if doc.quotas.is_empty() {
            return Duration::ZERO;
        }
        match quota::resolve(&doc.quotas, &principal.name, client_id, direction.key()) {
            Some(q) => self.meters.record(direction, q, amount, now_ms),
            None => Duration::ZERO,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use acl::{PatternType, Permission};
    use object_store::memory::InMemory;

    fn binding(name: &str) -> AclBinding {
        AclBinding {
            resource_type: ResourceType::Topic,
            resource_name: name.into(),
            pattern_type: PatternType::Literal,
            principal: "User:alice".into(),
            host: "*".into(),
            operation: Operation::Read,
            permission: Permission::Allow,
        }
    }

    #[tokio::test]
    async fn changes_are_durable_and_two_writers_lose_nothing() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let settings = AccessSettings {
            authorizer: true,
            ..Default::default()
        };
        let a = Access::open(settings.clone(), Box::new(StoreBackend::new(store.clone())))
            .await
            .unwrap();
        let b = Access::open(settings.clone(), Box::new(StoreBackend::new(store.clone())))
            .await
            .unwrap();
        a.update(|d| d.acls.push(binding("x"))).await.unwrap();
        // b still holds the old version: its write conflicts, rereads, and keeps a's.
        b.update(|d| d.acls.push(binding("y"))).await.unwrap();
        let reopened = Access::open(settings, Box::new(StoreBackend::new(store)))
            .await
            .unwrap();
        assert_eq!(reopened.doc().acls, vec![binding("x"), binding("y")]);
        let alice = Principal::user("alice");
        assert!(reopened.authorize(&alice, "h", Operation::Read, ResourceType::Topic, "y"));
        assert!(!reopened.authorize(&alice, "h", Operation::Write, ResourceType::Topic, "y"));
    }

    #[tokio::test]
    async fn without_an_authorizer_everything_is_allowed() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        let access = Access::open(
            AccessSettings::default(),
            Box::new(StoreBackend::new(store)),
        )
        .await
        .unwrap();
        access.update(|d| d.acls.push(binding("x"))).await.unwrap();
        let bob = Principal::user("bob");
        assert!(access.authorize(&bob, "h", Operation::Read, ResourceType::Topic, "x"));
    }
}
