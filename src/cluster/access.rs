//! The ACL and quota document in etcd: one key, `<prefix>/access`, changed
//! by compare-and-swap on its mod revision, so two brokers changing ACLs at
//! once both land (the loser rereads and reapplies its change). Every
//! broker rereads it every [`POLL`], which bounds how long a change takes
//! to reach the whole cluster.

use std::time::Duration;

use futures::future::BoxFuture;

use super::etcd::Etcd;
use super::kv::{Compare, Op, Txn};
use crate::access::{AccessDoc, AccessError, Backend, Version};

/// How often each broker rereads the document.
pub const POLL: Duration = Duration::from_secs(1);

pub struct EtcdAccess {
    etcd: Etcd,
}

impl EtcdAccess {
    pub fn new(etcd: Etcd) -> EtcdAccess {
        EtcdAccess { etcd }
    }

    fn key(&self) -> String {
        format!("{}access", self.etcd.keys().root())
    }
}

fn unavailable(e: impl std::fmt::Display) -> AccessError {
    AccessError::Storage(e.to_string())
}

impl Backend for EtcdAccess {
    fn load(&self) -> BoxFuture<'_, Result<(AccessDoc, Version), AccessError>> {
        Box::pin(async move {
            let key = self.key();
            match self.etcd.get(&key).await.map_err(unavailable)? {
                Some(kv) => {
                    let doc = serde_json::from_slice(&kv.value)
                        .map_err(|e| AccessError::Storage(format!("{key}: {e}")))?;
                    Ok((doc, Some(kv.mod_revision.to_string())))
                }
                None => Ok((AccessDoc::default(), None)),
            }
        })
    }

    fn save<'a>(
        &'a self,
        doc: &'a AccessDoc,
        expected: &'a Version,
    ) -> BoxFuture<'a, Result<Option<Version>, AccessError>> {
        Box::pin(async move {
            let key = self.key();
            let json = serde_json::to_vec(doc).map_err(unavailable)?;
            let compare = match expected {
                None => Compare::Version(key.clone(), 0),
                Some(rev) => {
                    Compare::ModRevision(key.clone(), rev.parse::<i64>().map_err(unavailable)?)
                }
            };
            let txn = Txn::when([compare]).then([Op::put(key, json)]);
            let resp = self.etcd.txn(txn).await.map_err(unavailable)?;
            if !resp.succeeded {
                return Ok(None);
            }
            Ok(Some(Some(resp.revision.to_string())))
        })
    }
}
