//! `__share_group_state`: where the share coordinator keeps its state.
//!
//! One compacted partition, like `__consumer_offsets` here. Every change is
//! a whole ShareSnapshot of its key (`ShareStates` with zero updates per
//! snapshot), so compaction by key keeps exactly what replay needs. Like
//! every topic it is tiered, so replay reads through to the object store.

use std::sync::Arc;

use kafka_protocol::records::Compression;

use super::share_records::ShareRecordKey;
use super::share_state::{Record, ShareStates};
use crate::catalog::{Catalog, CatalogError, TopicSpec};
use crate::clock::SharedClock;
use crate::format::batch::{encode_batch, BatchHeader};
use crate::log::{AppendConfig, LogError, Partition};

pub(crate) const SHARE_STATE_TOPIC: &str = "__share_group_state";

pub(crate) struct ShareStateStore {
    partition: Arc<Partition>,
    append_config: AppendConfig,
    wait_for_fsync: bool,
    clock: SharedClock,
}

impl ShareStateStore {
    pub(crate) fn topic_spec(segment_bytes: i32) -> TopicSpec {
        TopicSpec {
            name: SHARE_STATE_TOPIC,
            partitions: 1,
            config: vec![
                ("cleanup.policy", "compact".into()),
                ("segment.bytes", segment_bytes.to_string()),
            ],
        }
    }

    /// Opens the topic, creating it on first start (before the tier opens).
    pub(crate) fn open(
        catalog: &Catalog,
        segment_bytes: i32,
        wait_for_fsync: bool,
        clock: SharedClock,
    ) -> Result<ShareStateStore, CatalogError> {
        let topic = ShareStateStore::topic_spec(segment_bytes).ensure(catalog)?;
        let partition = topic.partition(0).ok_or(CatalogError::UnknownTopic)?;
        let append_config = AppendConfig {
            max_message_bytes: usize::MAX,
            ..topic.append_config()
        };
        Ok(ShareStateStore {
            partition,
            append_config,
            wait_for_fsync,
            clock,
        })
    }

    /// Appends records as one batch; returns the end offset to wait for.
    pub(crate) fn append(&self, records: &[Record]) -> Result<i64, LogError> {
        if records.is_empty() {
            return Ok(self.partition.end_offset());
        }
        let now = self.clock.now_ms();
        let records = records
            .iter()
            .map(|(key, value)| (Some(key.encode()), value.clone(), now))
            .collect();
        let buf = encode_batch(records, None, Compression::None)?;
        let end = self
            .partition
            .append(&buf, &self.append_config)?
            .last_offset
            + 1;
        self.partition.sync_soon();
        Ok(end)
    }

    /// Waits until appends up to `end` are durable, when the policy asks for it.
    pub(crate) async fn durable(&self, end: i64) -> Result<(), LogError> {
        if self.wait_for_fsync {
            self.partition.wait_durable(end).await?;
        }
        Ok(())
    }

    /// Rebuilds the states from the whole log.
    pub(crate) async fn replay(&self) -> Result<ShareStates, LogError> {
        let mut states = ShareStates::new(0);
        let mut offset = self.partition.log_start_offset();
        loop {
            let slice = self.partition.fetch_log(offset, 1 << 20, true).await?;
            if slice.records.is_empty() {
                return Ok(states);
            }
            let mut pos = 0;
            while let Ok(Some(h)) = BatchHeader::parse(&slice.records[pos..]) {
                offset = h.last_offset() + 1;
                pos += h.size;
            }
            let mut data = slice.records;
            let sets = crate::format::records::decode_batches(&mut data)
                .map_err(|e| LogError::Corrupt(e.to_string()))?;
            for record in sets.into_iter().flat_map(|s| s.records) {
                let Some(key) = record.key.filter(|_| !record.control) else {
                    continue;
                };
                match ShareRecordKey::decode(&key) {
                    Ok(k) => states.apply(&(k, record.value)),
                    Err(e) => tracing::warn!(error = %e, "skipping unreadable share state record"),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::coordinator::share_partition::{RecordState, StateBatch};
    use crate::coordinator::share_records::ShareKey;
    use crate::coordinator::share_state::Write;

    #[tokio::test]
    async fn the_state_survives_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let key = ShareKey {
            group: "g".into(),
            topic_id: uuid::Uuid::from_u128(5),
            partition: 0,
        };
        let write = Write {
            state_epoch: 0,
            leader_epoch: 1,
            start_offset: 3,
            delivery_complete_count: 0,
            batches: vec![StateBatch {
                first: 3,
                last: 5,
                state: RecordState::Available,
                delivery_count: 2,
            }],
        };
        let want = {
            let catalog = Catalog::open(dir.path(), Default::default()).unwrap();
            let store =
                ShareStateStore::open(&catalog, 1 << 20, false, ManualClock::new(0)).unwrap();
            let mut states = ShareStates::new(0);
            let init = states.initialize(&key, 0, 0, 1).unwrap();
            let w = states.write(&key, &write, 2).unwrap();
            store.append(&[init, w]).unwrap();
            states.read(&key, 1, 3).unwrap().0
        };
        let catalog = Catalog::open(dir.path(), Default::default()).unwrap();
        let store = ShareStateStore::open(&catalog, 1 << 20, false, ManualClock::new(0)).unwrap();
        let mut replayed = store.replay().await.unwrap();
        assert_eq!(replayed.read(&key, 1, 4).unwrap().0, want);
        assert_eq!(want.start_offset, 3);
    }
}

/// The share coordinator: the states behind `__share_group_state`, written
/// through before each change is acknowledged.
pub(crate) struct ShareCoordinator {
    store: ShareStateStore,
    states: parking_lot::Mutex<ShareStates>,
    clock: SharedClock,
    /// Cluster mode: whether this broker leads the topic now; only then
    /// does it answer.
    active: Option<super::Active>,
}

/// Why the share coordinator could not serve a request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ShareStoreError {
    #[error(transparent)]
    State(#[from] super::share_state::StateError),
    #[error(transparent)]
    Log(#[from] LogError),
    #[error("this broker is not the share coordinator")]
    NotCoordinator,
}

impl ShareCoordinator {
    /// Replays the topic (after the tier opened, so tiered records are read).
    pub(crate) async fn open(
        store: ShareStateStore,
        clock: SharedClock,
        active: Option<super::Active>,
    ) -> Result<ShareCoordinator, LogError> {
        let states = store.replay().await?;
        Ok(ShareCoordinator {
            store,
            states: parking_lot::Mutex::new(states),
            clock,
            active,
        })
    }

    /// Reads the states again (cluster mode: after taking the topic over,
    /// whose log another broker may have written since).
    pub(crate) async fn reload(&self) -> Result<(), LogError> {
        let states = self.store.replay().await?;
        *self.states.lock() = states;
        Ok(())
    }

    fn check_active(&self) -> Result<(), ShareStoreError> {
        match &self.active {
            Some(active) if !active() => Err(ShareStoreError::NotCoordinator),
            _ => Ok(()),
        }
    }

    /// A share-partition's state for its leader at `leader_epoch`, first
    /// initialized at `start` if it has none.
    pub(crate) async fn load(
        &self,
        key: &super::share_records::ShareKey,
        leader_epoch: i32,
        start: i64,
    ) -> Result<super::share_state::ReadState, ShareStoreError> {
        self.check_active()?;
        let now = self.clock.now_ms();
        let (read, records) = {
            let mut states = self.states.lock();
            let mut records = Vec::new();
            let read = match states.read(key, leader_epoch, now) {
                Ok((read, fence)) => {
                    records.extend(fence);
                    read
                }
                Err(super::share_state::StateError::InvalidRequest(_)) => {
                    records.push(states.initialize(key, 0, start, now)?);
                    let (read, fence) = states.read(key, leader_epoch, now)?;
                    records.extend(fence);
                    read
                }
                Err(e) => return Err(e.into()),
            };
            (read, records)
        };
        let end = self.store.append(&records)?;
        self.store.durable(end).await?;
        Ok(read)
    }

    /// InitializeShareGroupState: a fresh state at `start`; returns the
    /// offset to wait on with `durable`.
    pub(crate) fn initialize(
        &self,
        key: &super::share_records::ShareKey,
        state_epoch: i32,
        start: i64,
    ) -> Result<i64, ShareStoreError> {
        self.check_active()?;
        let now = self.clock.now_ms();
        let record = self
            .states
            .lock()
            .initialize(key, state_epoch, start, now)?;
        Ok(self.store.append(&[record])?)
    }

    /// ReadShareGroupState: the state for a leader at `leader_epoch`,
    /// which fences older leaders once durable.
    pub(crate) async fn read(
        &self,
        key: &super::share_records::ShareKey,
        leader_epoch: i32,
    ) -> Result<super::share_state::ReadState, ShareStoreError> {
        self.check_active()?;
        let now = self.clock.now_ms();
        let (read, fence) = self.states.lock().read(key, leader_epoch, now)?;
        if let Some(fence) = fence {
            let end = self.store.append(&[fence])?;
            self.store.durable(end).await?;
        }
        Ok(read)
    }

    /// Applies a share-partition's new state and appends its record; the
    /// change is durable once `durable` returns for the offset given back.
    /// Callers append under their own lock, so writes land in their order.
    pub(crate) fn write(
        &self,
        key: &super::share_records::ShareKey,
        w: &super::share_state::Write,
    ) -> Result<i64, ShareStoreError> {
        self.check_active()?;
        let now = self.clock.now_ms();
        let record = self.states.lock().write(key, w, now)?;
        Ok(self.store.append(&[record])?)
    }

    /// ReadShareGroupStateSummary: `None` for a share-partition without a state.
    pub(crate) fn summary(
        &self,
        key: &super::share_records::ShareKey,
    ) -> Result<Option<super::share_state::Summary>, ShareStoreError> {
        self.check_active()?;
        Ok(self.states.lock().summary(key))
    }

    /// Starts share-partitions over at the given offsets with nothing in
    /// flight (AlterShareGroupOffsets), at a higher state epoch.
    pub(crate) fn reset(
        &self,
        starts: &[(super::share_records::ShareKey, i64)],
    ) -> Result<i64, ShareStoreError> {
        self.check_active()?;
        let now = self.clock.now_ms();
        let mut states = self.states.lock();
        let mut records = Vec::with_capacity(starts.len());
        for (key, start) in starts {
            let epoch = states.next_state_epoch(key);
            records.push(states.initialize(key, epoch, *start, now)?);
        }
        Ok(self.store.append(&records)?)
    }

    /// Forgets share-partitions' states (DeleteShareGroupOffsets,
    /// DeleteGroups).
    pub(crate) fn delete(
        &self,
        keys: &[super::share_records::ShareKey],
    ) -> Result<i64, ShareStoreError> {
        self.check_active()?;
        let mut states = self.states.lock();
        let records: Vec<_> = keys.iter().filter_map(|k| states.delete(k)).collect();
        Ok(self.store.append(&records)?)
    }

    /// Waits until what was appended up to `end` is durable.
    pub(crate) async fn durable(&self, end: i64) -> Result<(), ShareStoreError> {
        Ok(self.store.durable(end).await?)
    }
}
