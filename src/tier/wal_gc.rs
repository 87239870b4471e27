//! Collecting write-ahead log objects once sealed segments hold their data.
//!
//! A WAL object only stands in for the head of the partitions it names until
//! their sealed segments reach the manifest; from then on it is garbage,
//! whoever wrote it (a dead broker's objects are read once by the leaders
//! that took its partitions over, and then nobody needs them). So every
//! broker looks at every node's objects: one whose every entry ends below its
//! partition's tiered end goes. Fences stay (a paused writer must still run
//! into one), and so does a node's newest object, since a fence is written
//! at the sequence number after the newest one. Entry tables are read once
//! and remembered.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};

use uuid::Uuid;

use super::{Tier, TierError};
use crate::format::wal::WalEntry;
use crate::wal;

/// What the collector remembers between passes.
#[derive(Default)]
pub struct WalCollector {
    /// Entry tables read so far, by (node, seq); `None` for a fence.
    tables: HashMap<(i32, u64), Option<Vec<WalEntry>>>,
}

impl WalCollector {
    /// Deletes the WAL objects whose data the manifests hold. Returns how
    /// many went.
    pub async fn collect(&mut self, tier: &Tier) -> Result<usize, TierError> {
        let store = tier.store().clone();
        let listed = wal::list_all(&store).await?;
        let present: HashSet<(i32, u64)> = listed
            .iter()
            .flat_map(|(n, seqs)| seqs.iter().map(move |s| (*n, *s)))
            .collect();
        self.tables.retain(|k, _| present.contains(k));
        let mut refreshed: HashSet<(Uuid, i32)> = HashSet::new();
        let mut deleted = 0;
        for (node, seqs) in listed {
            let Some((_, older)) = seqs.split_last() else {
                continue;
            };
            for &seq in older {
                if let Entry::Vacant(slot) = self.tables.entry((node, seq)) {
                    slot.insert(wal::entries(&store, node, seq).await?);
                }
                let Some(table) = &self.tables[&(node, seq)] else {
                    continue;
                };
                let mut covered = true;
                for e in table {
                    let Some(remote) = tier.remote(e.topic_id, e.partition) else {
                        covered = false;
                        break;
                    };
                    let end = |r: &super::remote::TieredPartition| {
                        r.manifest().end_offset().unwrap_or(i64::MIN)
                    };
                    if end(&remote) <= e.last_offset && refreshed.insert((e.topic_id, e.partition))
                    {
                        // Led elsewhere, the copy here may be stale.
                        remote.refresh().await?;
                    }
                    if end(&remote) <= e.last_offset {
                        covered = false;
                        break;
                    }
                }
                if covered {
                    wal::delete(&store, node, seq).await?;
                    self.tables.remove(&(node, seq));
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }
}
