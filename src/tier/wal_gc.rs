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
//! and remembered; a broker's own come from its log (`learn`), unread.
//!
//! A live broker collects its own objects; the others leave them to it, so
//! each object's table is read once, not once per broker. A dead broker's
//! objects are everybody's. And a partition this broker leads is never
//! refreshed from the store: its uploads are the only ones that move the
//! tiered end, and they went through this broker. (Skipping an object or a
//! refresh only keeps an object longer, never deletes one early.)

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use uuid::Uuid;

use super::remote::TieredPartition;
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
    /// Remembers the entry tables of objects `node` wrote (its own log's
    /// `Wal::take_tables`), so that collecting them costs no GET.
    pub fn learn(&mut self, node: i32, tables: Vec<(u64, Vec<WalEntry>)>) {
        for (seq, table) in tables {
            self.tables.insert((node, seq), Some(table));
        }
    }

    /// Deletes the WAL objects whose data the manifests hold, but for the
    /// objects of `others` (live brokers besides this one, which collect
    /// their own). Returns how many went.
    pub async fn collect(
        &mut self,
        tier: &Tier,
        others: &HashSet<i32>,
    ) -> Result<usize, TierError> {
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
            if others.contains(&node) {
                continue;
            }
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
                    let Some(remote) = remote_of(tier, e.topic_id, e.partition).await? else {
                        covered = false;
                        break;
                    };
                    let end = |r: &TieredPartition| r.manifest().end_offset().unwrap_or(i64::MIN);
                    if end(&remote) <= e.last_offset
                        && !tier.tends(e.topic_id, e.partition)
                        && refreshed.insert((e.topic_id, e.partition))
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

/// The tiered state of a partition, attached now if nothing attached it yet.
/// A broker attaches the partitions it knew at startup and those it took
/// over; a topic created later and led elsewhere, such as one half of a dead
/// broker's partitions, would otherwise pin every object naming it forever.
/// `None` for a partition the catalog does not (yet) have.
async fn remote_of(
    tier: &Tier,
    topic_id: Uuid,
    index: i32,
) -> Result<Option<Arc<TieredPartition>>, TierError> {
    if let Some(remote) = tier.remote(topic_id, index) {
        return Ok(Some(remote));
    }
    let Some(topic) = tier.partitions.catalog.topic_by_id(topic_id) else {
        return Ok(None);
    };
    let Some(partition) = topic.partition(index) else {
        return Ok(None);
    };
    Ok(Some(
        tier.partitions.attach(&topic, index, &partition).await?,
    ))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bytes::Bytes;
    use kafka_protocol::records::Compression;
    use object_store::memory::InMemory;
    use object_store::ObjectStore;

    use super::*;
    use crate::catalog::TopicConfig;
    use crate::clock::ManualClock;
    use crate::format::batch::encode_batch;
    use crate::log::HeadSink;
    use crate::wal::{Wal, WalSettings};

    #[tokio::test]
    async fn objects_naming_a_partition_this_broker_never_led_are_collected() {
        let store: Arc<dyn ObjectStore> = Arc::new(InMemory::new());
        const NOW: i64 = 1_700_000_000_000;
        let clock = ManualClock::new(NOW);
        // This broker starts before the topic exists, and never leads it.
        let here = tempfile::tempdir().unwrap();
        let (catalog, tier) =
            crate::tier::open_with_catalog(store.clone(), here.path(), clock.clone()).await;
        // Its leader seals and uploads segments of it.
        let there = tempfile::tempdir().unwrap();
        let (leader_catalog, leader) =
            crate::tier::open_with_catalog(store.clone(), there.path(), clock).await;
        let topic = leader_catalog
            .create_topic("t", 1, 1, &[("segment.bytes", Some("1024"))])
            .unwrap();
        let partition = topic.partition(0).unwrap();
        for i in 0..20 {
            let record = (
                Some(Bytes::from(format!("k{i}"))),
                Some(Bytes::from(vec![b'v'; 200])),
                NOW,
            );
            let batch = encode_batch(vec![record], None, Compression::None).unwrap();
            partition.append(&batch, &topic.append_config()).unwrap();
        }
        leader.pass().await;
        assert!(leader.manifest_of("t", 0).unwrap().end_offset().unwrap() > 1);
        catalog
            .adopt_topic("t", topic.id(), 1, TopicConfig::default())
            .unwrap();
        // A (dead) broker's log holds offsets 0 and 1 of it, one object each.
        let wal = Wal::open(
            store.clone(),
            9,
            WalSettings::new(Duration::from_millis(5), 1 << 20),
        )
        .await
        .unwrap();
        let sink = wal.partition(topic.id(), 0);
        let durable = Arc::new(tokio::sync::watch::Sender::new(0));
        for offset in 0..2 {
            sink.submit(&durable, 0, offset, offset, b"H", b"x");
            wal.flush().await;
        }

        let mut collector = WalCollector::default();
        collector.learn(9, wal.take_tables());
        let collected = collector.collect(&tier, &HashSet::new()).await.unwrap();
        assert_eq!(collected, 1, "all but the node's newest object");
        let left = wal::list_all(&store).await.unwrap();
        assert_eq!(left.get(&9), Some(&vec![2]));
    }
}
