//! Deciding when a partition needs a merge and queuing the job.
//!
//! The broker that tiers a partition asks its topic's policy, after every
//! change to the manifest, whether a merge is due; if so it appends a job
//! record to `__strata_compaction`, where any worker (in a broker or a
//! standalone `strata compact`) picks it up through its consumer group.
//! A queued job is not queued again while it may still be running; if it
//! was lost (a worker died, the store failed) it is queued again after
//! `requeue_after`, and re-running a job is harmless anyway.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use kafka_protocol::records::Compression;
use parking_lot::Mutex;
use uuid::Uuid;

use super::job::{JobSpec, JOBS_TOPIC};
use super::policy::{self, SegmentDesc};
use crate::catalog::config::{CompactionPolicy, COMPACTION_POLICY};
use crate::catalog::{Catalog, CatalogError, Topic, TopicSpec};
use crate::clock::SharedClock;

/// Whether this broker tends a partition (topic id, index).
pub(crate) type Scope = Arc<dyn Fn(Uuid, i32) -> bool + Send + Sync>;
use crate::format::batch::encode_batch;
use crate::log::LogError;
use crate::manifest::Manifest;

/// Partitions of the job topic: jobs spread over this many workers at most.
const JOB_PARTITIONS: i32 = 4;

/// How often a broker rereads the manifest of a partition with a job
/// outstanding, to see a standalone worker's result.
const CHECK_EVERY: Duration = Duration::from_secs(2);

/// The jobs queued for a partition and not seen done yet.
struct Outstanding {
    /// Sources of each job, and when it was queued.
    jobs: Vec<(Vec<String>, Instant)>,
    /// When the manifest was last reread for them.
    checked: Instant,
}

#[derive(Clone)]
pub(crate) struct SchedulerSettings {
    pub delete_delay_ms: u64,
    pub max_run_ms: u64,
    /// A job not finished after this long is queued again.
    pub requeue_after: Duration,
    /// Cluster mode: the partitions this broker leads; jobs are queued only
    /// for those, into a job partition among them. `None`: every partition.
    pub scope: Option<Scope>,
}

pub(crate) struct Scheduler {
    catalog: Arc<Catalog>,
    settings: SchedulerSettings,
    clock: SharedClock,
    outstanding: Mutex<HashMap<(Uuid, i32), Outstanding>>,
    pub jobs_queued: AtomicU64,
}

impl Scheduler {
    /// The job topic: jobs kept a day, never merged themselves.
    pub(crate) fn topic_spec() -> TopicSpec {
        TopicSpec {
            name: JOBS_TOPIC,
            partitions: JOB_PARTITIONS,
            config: vec![
                ("retention.ms", "86400000".into()),
                ("segment.bytes", "16777216".into()),
                // Merging the job log itself would only queue more jobs.
                (COMPACTION_POLICY, CompactionPolicy::None.name().into()),
            ],
        }
    }

    /// Creates the job topic on first start.
    pub(crate) fn open(
        catalog: Arc<Catalog>,
        settings: SchedulerSettings,
        clock: SharedClock,
    ) -> Result<Scheduler, CatalogError> {
        Scheduler::topic_spec().ensure(&catalog)?;
        Ok(Scheduler {
            catalog,
            settings,
            clock,
            outstanding: Mutex::new(HashMap::new()),
            jobs_queued: AtomicU64::new(0),
        })
    }

    /// The merges the topic's policy wants for this manifest, leaving out
    /// those queued recently. Jobs whose sources left the manifest are
    /// done (or stale) and forgotten.
    pub(crate) fn due(&self, topic: &Topic, partition: i32, manifest: &Manifest) -> Vec<JobSpec> {
        let key = (topic.id(), partition);
        let config = topic.config();
        // Nothing at or past the last stable offset is merged: an undecided
        // transaction's record must not supersede a committed one.
        let descs: Vec<SegmentDesc> = manifest.segments[..manifest.stable_segments()]
            .iter()
            .map(SegmentDesc::from)
            .collect();
        let now = self.clock.now_ms();
        let jobs =
            policy::disjoint_jobs(policy::for_topic(&topic.settings()).as_ref(), &descs, now);
        let mut outstanding = self.outstanding.lock();
        if let Some(o) = outstanding.get_mut(&key) {
            let present: HashSet<&str> = manifest.segments.iter().map(|s| s.key.as_str()).collect();
            let instant = self.clock.now();
            o.jobs.retain(|(sources, at)| {
                instant.duration_since(*at) < self.settings.requeue_after
                    && sources.iter().all(|k| present.contains(k.as_str()))
            });
            if o.jobs.is_empty() {
                outstanding.remove(&key);
            }
        }
        let queued = outstanding.get(&key);
        jobs.into_iter()
            .map(|job| {
                let sources: Vec<String> = manifest.segments[job.first..job.first + job.count]
                    .iter()
                    .map(|s| s.key.clone())
                    .collect();
                (job, sources)
            })
            // Not while a queued job may still be merging any of the same
            // segments: one of the two would only find its sources gone.
            .filter(|(_, sources)| {
                queued.is_none_or(|o| {
                    !o.jobs
                        .iter()
                        .any(|(s, _)| s.iter().any(|k| sources.contains(k)))
                })
            })
            .map(|(job, sources)| JobSpec {
                topic: topic.name().to_string(),
                topic_id: topic.id(),
                partition,
                sources,
                target_level: job.target_level,
                config: config.clone(),
                delete_delay_ms: self.settings.delete_delay_ms,
                max_run_ms: self.settings.max_run_ms,
                queued_ms: now,
            })
            .collect()
    }

    /// Whether this broker schedules merges of the partition: when it runs
    /// alone, always; in a cluster, when it leads the job partition the
    /// partition's jobs go to. Every partition thus has one scheduler, even
    /// one whose leader leads no job partition (a cluster may have more
    /// brokers than the job topic has partitions).
    pub(crate) fn tends(&self, topic_id: Uuid, partition: i32) -> bool {
        let Some(serves) = &self.settings.scope else {
            return true;
        };
        self.catalog.topic(JOBS_TOPIC).is_some_and(|jobs| {
            let home = home(topic_id, partition, jobs.partition_count() as i32);
            serves(jobs.id(), home)
        })
    }

    /// Appends the job to the job topic, to the partition its key hashes to
    /// (in a cluster, unless another broker took that partition meanwhile:
    /// then not queued now, and it comes up again there).
    pub(crate) fn queue(&self, job: JobSpec) -> Result<(), LogError> {
        let topic = self
            .catalog
            .topic(JOBS_TOPIC)
            .ok_or_else(|| LogError::Corrupt(format!("{JOBS_TOPIC} is missing")))?;
        let key = job.record_key();
        if !self.tends(job.topic_id, job.partition) {
            return Ok(());
        }
        let index = home(job.topic_id, job.partition, topic.partition_count() as i32);
        let partition = topic
            .partition(index)
            .ok_or_else(|| LogError::Corrupt(format!("{JOBS_TOPIC} lost partition {index}")))?;
        let value = serde_json::to_vec(&job).map_err(|e| LogError::Corrupt(e.to_string()))?;
        let batch = encode_batch(
            vec![(
                Some(Bytes::from(key)),
                Some(Bytes::from(value)),
                self.clock.now_ms(),
            )],
            None,
            Compression::None,
        )?;
        partition.append(&batch, &topic.append_config())?;
        partition.sync_soon();
        tracing::debug!(
            topic = job.topic,
            partition = job.partition,
            sources = job.sources.len(),
            level = job.target_level,
            "queued compaction job"
        );
        let now = self.clock.now();
        self.outstanding
            .lock()
            .entry((job.topic_id, job.partition))
            .or_insert_with(|| Outstanding {
                jobs: Vec::new(),
                checked: now,
            })
            .jobs
            .push((job.sources, now));
        self.jobs_queued.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// Whether jobs are outstanding for the partition and its manifest was
    /// not reread for a while (a worker elsewhere may have finished them).
    pub(crate) fn should_check(&self, topic_id: Uuid, partition: i32) -> bool {
        let now = self.clock.now();
        let mut outstanding = self.outstanding.lock();
        match outstanding.get_mut(&(topic_id, partition)) {
            Some(o) if now.duration_since(o.checked) >= CHECK_EVERY => {
                o.checked = now;
                true
            }
            _ => false,
        }
    }

    /// Jobs this broker queued that no manifest has shown done yet: the
    /// compaction queue as far as this broker can tell.
    pub(crate) fn outstanding_jobs(&self) -> usize {
        self.outstanding.lock().values().map(|o| o.jobs.len()).sum()
    }

    /// Whether any job was ever queued (the broker's worker starts then).
    pub(crate) fn has_jobs(&self) -> bool {
        self.catalog.topic(JOBS_TOPIC).is_some_and(|t| {
            t.partitions()
                .iter()
                .any(|p| p.end_offset() > p.log_start_offset())
        })
    }
}

/// The job partition that jobs for partition `partition` of `topic_id` go to.
fn home(topic_id: Uuid, partition: i32, job_partitions: i32) -> i32 {
    let key = format!("{topic_id}/{partition}");
    (xxhash_rust::xxh3::xxh3_64(key.as_bytes()) % job_partitions.max(1) as u64) as i32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::manifest::{TieredSegment, WriterEpoch};

    const START: i64 = 1_700_000_000_000;

    fn scheduler(dir: &std::path::Path, clock: Arc<ManualClock>) -> (Arc<Catalog>, Scheduler) {
        let catalog = Arc::new(Catalog::open(dir, Default::default()).unwrap());
        let settings = SchedulerSettings {
            delete_delay_ms: 0,
            max_run_ms: 1000,
            requeue_after: Duration::from_secs(300),
            scope: None,
        };
        let s = Scheduler::open(catalog.clone(), settings, clock).unwrap();
        (catalog, s)
    }

    fn manifest(segments: usize, max_timestamp: i64) -> Manifest {
        let w = WriterEpoch::new(1, &crate::clock::SystemClock, &crate::clock::OsRandom);
        Manifest::empty(w.clone()).next(&w, 0, |m| {
            for i in 0..segments as i64 {
                m.segments.push(TieredSegment {
                    key: format!("s/{i}"),
                    base_offset: i * 10,
                    next_offset: i * 10 + 10,
                    max_timestamp,
                    max_timestamp_position: 0,
                    size: 100,
                    level: 0,
                    batch_count: 1,
                    keys: None,
                    aborted: Vec::new(),
                });
            }
        })
    }

    #[test]
    fn a_lone_segment_of_a_compacted_topic_is_merged_once_max_compaction_lag_passes() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let (catalog, s) = scheduler(dir.path(), clock.clone());
        let topic = catalog
            .create_topic(
                "t",
                1,
                1,
                &[
                    ("cleanup.policy", Some("compact")),
                    ("max.compaction.lag.ms", Some("60000")),
                ],
            )
            .unwrap();
        let m = manifest(1, START);
        assert!(s.due(&topic, 0, &m).is_empty());
        clock.advance(Duration::from_secs(61));
        let due = s.due(&topic, 0, &m);
        assert_eq!(due.len(), 1);
        assert_eq!(due[0].sources, vec!["s/0".to_string()]);
        assert_eq!(due[0].queued_ms, START + 61_000);
    }

    #[test]
    fn no_job_is_queued_over_a_segment_a_queued_job_may_still_be_merging() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let (catalog, s) = scheduler(dir.path(), clock.clone());
        let topic = catalog
            .create_topic(
                "t",
                1,
                1,
                &[
                    ("cleanup.policy", Some("compact")),
                    ("max.compaction.lag.ms", Some("60000")),
                ],
            )
            .unwrap();
        clock.advance(Duration::from_secs(61));
        let due = s.due(&topic, 0, &manifest(1, START));
        assert_eq!(due.len(), 1);
        s.queue(due[0].clone()).unwrap();
        // A second old segment: the policy now wants both, but s/0 may
        // still be in the first job's merge.
        let m = manifest(2, START);
        assert!(s.due(&topic, 0, &m).is_empty());
        clock.advance(Duration::from_secs(300));
        let due = s.due(&topic, 0, &m);
        assert_eq!(due[0].sources, vec!["s/0".to_string(), "s/1".to_string()]);
    }

    #[test]
    fn a_queued_job_is_queued_again_only_after_requeue_after() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(START);
        let (catalog, s) = scheduler(dir.path(), clock.clone());
        let topic = catalog.create_topic("t", 1, 1, &[]).unwrap();
        let m = manifest(4, START);
        let due = s.due(&topic, 0, &m);
        assert_eq!(due.len(), 1, "four level-0 segments make one merge");
        assert!(!s.has_jobs());
        s.queue(due[0].clone()).unwrap();
        assert!(s.has_jobs());
        assert!(s.due(&topic, 0, &m).is_empty(), "it may still be running");
        assert!(!s.should_check(topic.id(), 0));
        clock.advance(CHECK_EVERY);
        assert!(
            s.should_check(topic.id(), 0),
            "a worker elsewhere may be done"
        );
        clock.advance(Duration::from_secs(300));
        assert_eq!(s.due(&topic, 0, &m).len(), 1, "lost, so queued again");
    }
}
