//! Garbage collection in the store, every `--orphan-scan-interval-ms`:
//! segment objects no manifest names (see `objects::collect_orphans`) and
//! the leftovers of topic deletions a crash cut short.

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use std::time::Instant;
use uuid::Uuid;

use super::partitions::TieredPartitions;
use super::TierError;
use crate::manifest::objects;

pub(super) struct OrphanScan {
    partitions: Arc<TieredPartitions>,
    min_age: Duration,
    interval: Duration,
    last_scan: Mutex<Instant>,
}

impl OrphanScan {
    pub(super) fn new(
        partitions: Arc<TieredPartitions>,
        min_age: Duration,
        interval: Duration,
    ) -> OrphanScan {
        OrphanScan {
            last_scan: Mutex::new(partitions.clock.now()),
            partitions,
            min_age,
            interval,
        }
    }

    pub(super) async fn scan_if_due(&self) {
        let due = {
            let now = self.partitions.clock.now();
            let mut last = self.last_scan.lock();
            let due = now.duration_since(*last) >= self.interval;
            if due {
                *last = now;
            }
            due
        };
        if due {
            self.scan().await;
        }
    }

    async fn scan(&self) {
        let store = self.partitions.store();
        for remote in self.partitions.remotes() {
            if !self.partitions.in_scope(remote.topic_id, remote.index) {
                continue;
            }
            let result = async {
                remote.refresh().await?;
                let n = objects::collect_orphans(
                    store,
                    &remote.prefix,
                    &remote.manifest(),
                    self.partitions.clock.now_ms(),
                    self.min_age,
                )
                .await?;
                Ok::<_, TierError>(n)
            }
            .await;
            match result {
                Ok(0) => {}
                Ok(n) => {
                    tracing::info!(topic = %remote.topic, partition = remote.index, objects = n, "deleted orphaned objects")
                }
                Err(e) => {
                    tracing::warn!(topic = %remote.topic, partition = remote.index, error = %e, "orphan scan failed")
                }
            }
        }
        let live: Vec<Uuid> = self
            .partitions
            .catalog
            .topics()
            .iter()
            .map(|t| t.id())
            .collect();
        match objects::collect_deleted_topics(
            store,
            &live,
            self.partitions.clock.now_ms(),
            self.min_age,
        )
        .await
        {
            Ok(0) => {}
            Ok(n) => tracing::info!(objects = n, "deleted leftovers of deleted topics"),
            Err(e) => tracing::warn!(error = %e, "scan for deleted topics' leftovers failed"),
        }
    }
}
