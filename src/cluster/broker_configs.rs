//! Dynamic broker configs (Kafka's KIP-226) as etcd keys:
//! `<prefix>/broker_configs/default` for the cluster-wide default and
//! `<prefix>/broker_configs/<node_id>` for one broker's own, each a JSON map
//! of config names to values. The finalized feature levels (KIP-584) are
//! one more such map, `<prefix>/features/finalized`, and each group's config
//! overrides another, `<prefix>/group_configs/<group>`.
//!
//! Every change is a compare-and-swap on the key's mod revision, so two
//! brokers changing the default at once both land: the loser rereads and
//! applies its change again. Every broker rereads its two keys every
//! [`POLL`](super::ACCESS_POLL), as it does the ACLs, which bounds how long
//! a change of the default takes to reach the whole cluster. Names and
//! values are opaque here: which are valid is the API layer's question.

use std::collections::BTreeMap;

use super::error::{ClusterError, Result};
use super::etcd::Etcd;
use super::kv::{Compare, Op, Txn};

/// How many times a compare-and-swap is retried against concurrent writers.
const CAS_ATTEMPTS: usize = 16;

type Configs = BTreeMap<String, String>;

#[derive(Clone)]
pub struct BrokerConfigStore {
    etcd: Etcd,
    /// The directory under the prefix: `broker_configs`, `features` or
    /// `group_configs`.
    dir: &'static str,
}

impl BrokerConfigStore {
    pub fn new(etcd: Etcd) -> BrokerConfigStore {
        BrokerConfigStore {
            etcd,
            dir: "broker_configs",
        }
    }

    /// The finalized feature levels, as the one resource `finalized`.
    pub fn features(etcd: Etcd) -> BrokerConfigStore {
        BrokerConfigStore {
            etcd,
            dir: "features",
        }
    }

    /// Each group's config overrides, one resource per group.
    pub fn groups(etcd: Etcd) -> BrokerConfigStore {
        BrokerConfigStore {
            etcd,
            dir: "group_configs",
        }
    }

    fn dir(&self) -> String {
        format!("{}{}/", self.etcd.keys().root(), self.dir)
    }

    /// `""` is the cluster default, as in Kafka's resource names.
    fn key(&self, resource: &str) -> String {
        let name = if resource.is_empty() {
            "default"
        } else {
            resource
        };
        format!("{}{name}", self.dir())
    }

    /// Every resource's configs, by resource name.
    pub async fn all(&self) -> Result<BTreeMap<String, Configs>> {
        let dir = self.dir();
        let (_, kvs) = self.etcd.get_prefix(&dir).await?;
        kvs.iter()
            .map(|kv| {
                let configs = decode(&kv.key, &kv.value)?;
                Ok((kv.key[dir.len()..].to_string(), configs))
            })
            .collect()
    }

    /// The configs stored for `resource` (empty when none are).
    pub async fn get(&self, resource: &str) -> Result<Configs> {
        let key = self.key(resource);
        match self.etcd.get(&key).await? {
            Some(kv) => decode(&key, &kv.value),
            None => Ok(Configs::new()),
        }
    }

    /// Replaces the configs of `resource` by what `change` makes of the
    /// stored ones; an `Err` from `change` is returned as is and nothing is
    /// written. Retried on conflict, so `change` may run more than once.
    pub async fn update<E>(
        &self,
        resource: &str,
        mut change: impl FnMut(&Configs) -> std::result::Result<Configs, E>,
    ) -> Result<std::result::Result<Configs, E>> {
        let key = self.key(resource);
        for _ in 0..CAS_ATTEMPTS {
            let (current, compare) = match self.etcd.get(&key).await? {
                Some(kv) => (
                    decode(&key, &kv.value)?,
                    Compare::ModRevision(key.clone(), kv.mod_revision),
                ),
                None => (Configs::new(), Compare::Version(key.clone(), 0)),
            };
            let next = match change(&current) {
                Ok(next) => next,
                Err(e) => return Ok(Err(e)),
            };
            let write = match next.is_empty() {
                true => Op::Delete(key.clone()),
                false => Op::put(
                    key.clone(),
                    serde_json::to_vec(&next).expect("serializable"),
                ),
            };
            let txn = Txn::when([compare]).then([write]);
            if self.etcd.txn(txn).await?.succeeded {
                return Ok(Ok(next));
            }
        }
        Err(ClusterError::Conflict(key))
    }
}

fn decode(key: &str, bytes: &[u8]) -> Result<Configs> {
    serde_json::from_slice(bytes).map_err(|e| ClusterError::Malformed {
        key: key.to_string(),
        reason: e.to_string(),
    })
}
