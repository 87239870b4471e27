//! Producer ids unique across the cluster, handed out in blocks.
//!
//! `<prefix>/producer_ids/next` holds the first id nobody owns. A broker takes
//! a block by compare-and-swapping it forward, then serves `InitProducerId`
//! from the block locally — one etcd round trip per block, not per producer.
//! Ids of a block left unused when a broker stops are simply skipped.

use std::ops::Range;

use super::error::{ClusterError, Result};
use super::etcd::Etcd;
use super::kv::{Compare, Op, Txn};

const CAS_ATTEMPTS: usize = 64;

#[derive(Clone)]
pub struct ProducerIdBlocks {
    etcd: Etcd,
}

impl ProducerIdBlocks {
    pub fn new(etcd: Etcd) -> ProducerIdBlocks {
        ProducerIdBlocks { etcd }
    }

    /// Takes the next `size` ids for this broker alone.
    pub async fn allocate(&self, size: i64) -> Result<Range<i64>> {
        if size < 1 {
            return Err(ClusterError::InvalidArgument(format!("block size {size}")));
        }
        let key = self.etcd.keys().producer_ids();
        for _ in 0..CAS_ATTEMPTS {
            let (start, revision) = match self.etcd.get(&key).await? {
                None => (0, 0),
                Some(kv) => {
                    let start = std::str::from_utf8(&kv.value)
                        .ok()
                        .and_then(|s| s.parse::<i64>().ok())
                        .ok_or_else(|| ClusterError::Malformed {
                            key: key.clone(),
                            reason: "not a decimal integer".into(),
                        })?;
                    (start, kv.mod_revision)
                }
            };
            let end = start.checked_add(size).ok_or_else(|| {
                ClusterError::InvalidArgument("producer ids are exhausted".into())
            })?;
            let txn = Txn::when([Compare::ModRevision(key.clone(), revision)])
                .then([Op::put(key.clone(), end.to_string())]);
            if self.etcd.txn(txn).await?.succeeded {
                return Ok(start..end);
            }
        }
        Err(ClusterError::Conflict(key))
    }
}
