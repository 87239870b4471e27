//! The topic catalog as etcd keys, one per topic: `<prefix>/topics/<name>`.
//!
//! Creation is create-only, so two brokers creating the same topic at once
//! cannot both succeed; every change is a compare-and-swap on the key's mod
//! revision, so concurrent changes are never lost, only retried. Names are
//! opaque here: validating them and the configs is the catalog layer's job.
//! The topic id is fixed at creation and names the assignment, so a topic
//! deleted and created again under the same name is a different topic.
//!
//! The replication factor is kept with the topic only to be reported: the
//! data lives once, in the object store, and any live broker can lead any
//! partition, so the factor says how many brokers a partition is described
//! as having (its leader and the brokers next in line), not how many copies
//! exist. Records written before it was kept read as factor 1.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::error::{ClusterError, Result};
use super::etcd::Etcd;
use super::kv::{Compare, Op, Txn};

/// How many times a compare-and-swap is retried against concurrent writers.
const CAS_ATTEMPTS: usize = 16;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    pub id: Uuid,
    pub partitions: i32,
    #[serde(default = "one")]
    pub replication_factor: i16,
    #[serde(default)]
    pub config: BTreeMap<String, String>,
}

fn one() -> i16 {
    1
}

#[derive(Clone)]
pub struct TopicStore {
    etcd: Etcd,
}

impl TopicStore {
    pub fn new(etcd: Etcd) -> TopicStore {
        TopicStore { etcd }
    }

    /// Creates a topic with a fresh id; [`ClusterError::TopicExists`] if the
    /// name is taken. Whether the cluster has brokers enough for
    /// `replication_factor` is the caller's question: membership changes.
    pub async fn create(
        &self,
        name: &str,
        partitions: i32,
        replication_factor: i16,
        config: BTreeMap<String, String>,
    ) -> Result<TopicRecord> {
        if partitions < 1 {
            return Err(ClusterError::InvalidArgument(format!(
                "a topic needs at least one partition, not {partitions}"
            )));
        }
        if replication_factor < 1 {
            return Err(ClusterError::InvalidArgument(format!(
                "a topic needs a replication factor of at least 1, not {replication_factor}"
            )));
        }
        // The cluster's id for the topic, agreed by the create below. Not
        // injected yet: ClusterNode and its TopicStore are built by
        // server::cluster from server/mod.rs, which holds the broker's `Random`.
        #[allow(clippy::disallowed_methods)]
        let id = Uuid::new_v4();
        let record = TopicRecord {
            id,
            partitions,
            replication_factor,
            config,
        };
        let key = self.etcd.keys().topic(name);
        let txn =
            Txn::when([Compare::Version(key.clone(), 0)]).then([Op::put(key, encode(&record))]);
        if self.etcd.txn(txn).await?.succeeded {
            Ok(record)
        } else {
            Err(ClusterError::TopicExists(name.to_string()))
        }
    }

    pub async fn get(&self, name: &str) -> Result<Option<TopicRecord>> {
        let key = self.etcd.keys().topic(name);
        match self.etcd.get(&key).await? {
            Some(kv) => Ok(Some(decode(&key, &kv.value)?)),
            None => Ok(None),
        }
    }

    /// Every topic, by name.
    pub async fn list(&self) -> Result<BTreeMap<String, TopicRecord>> {
        let prefix = self.etcd.keys().topics();
        let (_, kvs) = self.etcd.get_prefix(&prefix).await?;
        kvs.iter()
            .map(|kv| {
                let record = decode(&kv.key, &kv.value)?;
                Ok((kv.key[prefix.len()..].to_string(), record))
            })
            .collect()
    }

    /// Deletes a topic and returns what it was.
    pub async fn delete(&self, name: &str) -> Result<TopicRecord> {
        let key = self.etcd.keys().topic(name);
        for _ in 0..CAS_ATTEMPTS {
            let Some(kv) = self.etcd.get(&key).await? else {
                return Err(ClusterError::UnknownTopic(name.to_string()));
            };
            let txn = Txn::when([Compare::ModRevision(key.clone(), kv.mod_revision)])
                .then([Op::Delete(key.clone())]);
            if self.etcd.txn(txn).await?.succeeded {
                return decode(&key, &kv.value);
            }
        }
        Err(ClusterError::Conflict(key))
    }

    /// Replaces the topic's config.
    pub async fn alter_config(
        &self,
        name: &str,
        config: BTreeMap<String, String>,
    ) -> Result<TopicRecord> {
        self.update(name, |t| {
            t.config = config.clone();
            Ok(())
        })
        .await
    }

    /// Raises the partition count to `total`; it can only grow.
    pub async fn add_partitions(&self, name: &str, total: i32) -> Result<TopicRecord> {
        self.update(name, |t| {
            if total <= t.partitions {
                return Err(ClusterError::InvalidPartitions {
                    requested: total,
                    current: t.partitions,
                });
            }
            t.partitions = total;
            Ok(())
        })
        .await
    }

    /// Read, change, compare-and-swap on the mod revision; retried on conflict.
    async fn update(
        &self,
        name: &str,
        change: impl Fn(&mut TopicRecord) -> Result<()>,
    ) -> Result<TopicRecord> {
        let key = self.etcd.keys().topic(name);
        for _ in 0..CAS_ATTEMPTS {
            let Some(kv) = self.etcd.get(&key).await? else {
                return Err(ClusterError::UnknownTopic(name.to_string()));
            };
            let mut record = decode(&key, &kv.value)?;
            change(&mut record)?;
            let txn = Txn::when([Compare::ModRevision(key.clone(), kv.mod_revision)])
                .then([Op::put(key.clone(), encode(&record))]);
            if self.etcd.txn(txn).await?.succeeded {
                return Ok(record);
            }
        }
        Err(ClusterError::Conflict(key))
    }
}

fn encode(record: &TopicRecord) -> Vec<u8> {
    serde_json::to_vec(record).expect("serializable")
}

fn decode(key: &str, bytes: &[u8]) -> Result<TopicRecord> {
    serde_json::from_slice(bytes).map_err(|e| ClusterError::Malformed {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_written_before_replication_factors_were_kept_reads_as_factor_one() {
        let old = br#"{"id":"6f0c3a39-2b0e-4c55-9d53-5b1f1f6f9d10","partitions":3,"config":{}}"#;
        let record = decode("k", old).unwrap();
        assert_eq!(record.replication_factor, 1);
        assert_eq!(record.partitions, 3);
    }

    #[test]
    fn the_replication_factor_survives_a_round_trip_through_etcd_json() {
        let record = TopicRecord {
            id: Uuid::nil(),
            partitions: 2,
            replication_factor: 3,
            config: BTreeMap::new(),
        };
        assert_eq!(decode("k", &encode(&record)).unwrap(), record);
    }
}
