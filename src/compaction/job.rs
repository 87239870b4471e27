//! One compaction job: merge contiguous segments of a partition's manifest
//! into one segment of the next level, in the store.
//!
//! The steps are ordered so that a worker killed between any two of them
//! loses and duplicates nothing, and re-running the job is harmless:
//!
//! 1. Merge the sources (read from the store) into a scratch directory and
//!    upload the output under a key of its own (`<base>-<level>-<job run>`).
//!    Killed here: the output is an orphan no manifest names; the job is
//!    redelivered and runs again with a fresh key.
//! 2. Write the next manifest version with the sources replaced by the
//!    output, create-only. If the sources are no longer all there (another
//!    run of the job, retention, a racing worker), the job is stale: its
//!    output is deleted and nothing changes. Killed after the write: the
//!    redelivered job finds its sources gone and is dropped.
//! 3. After `delete_delay_ms`, so fetches that read the previous manifest
//!    finish, delete the sources. Killed before: they stay as orphans.
//!
//! Orphans are deleted by the broker's orphan scan once older than
//! `orphan_min_age`; a run that could not reach step 2 within half that
//! age gives up, so the scan never takes an output about to be named.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use object_store::ObjectStore;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::io::{LocalSink, SegmentSource};
use super::merge::{merge, MergeOptions, MergeStats};
use super::store_source::StoreSegment;
use super::CompactionError;
use crate::catalog::config::TopicConfig;
use crate::clock::{self, SharedClock, SharedRandom};
use crate::format::control::AbortedTxn;
use crate::format::segment::{file_name, SNAPSHOT_EXT};
use crate::manifest::{
    manifest_dir, objects, partition_prefix, segment_key, Manifest, ManifestError, ManifestStore,
    TieredSegment, WriterEpoch,
};

/// Jobs whose sources add up to no more than this are merged in the task
/// that runs them, from sources fetched whole (`StoreSegment::fetch`): a
/// millisecond or so of CPU, and no blocking thread. Bigger ones stream
/// their sources on a blocking thread.
pub const INLINE_MERGE_BYTES: u64 = 1 << 20;

/// The internal topic jobs are queued on.
pub const JOBS_TOPIC: &str = "__strata_compaction";
/// The consumer group of the workers.
pub const WORKER_GROUP: &str = "strata-compaction";

/// A job as queued: which segments to merge and everything a worker that
/// sees only the store and this record needs to know.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobSpec {
    pub topic: String,
    pub topic_id: Uuid,
    pub partition: i32,
    /// Object keys of the sources, oldest first, contiguous when queued.
    pub sources: Vec<String>,
    pub target_level: u32,
    /// The topic's configuration overrides when the job was queued.
    pub config: TopicConfig,
    pub delete_delay_ms: u64,
    /// A run that has not written its manifest after this long gives up.
    pub max_run_ms: u64,
    pub queued_ms: i64,
}

impl JobSpec {
    /// The record key: jobs of one partition share it, so they land on one
    /// job partition and run in order.
    pub fn record_key(&self) -> String {
        format!("{}/{}", self.topic_id, self.partition)
    }

    fn manifests(&self, store: &Arc<dyn ObjectStore>) -> ManifestStore {
        ManifestStore::new(store.clone(), manifest_dir(&self.prefix()))
    }

    fn prefix(&self) -> object_store::path::Path {
        partition_prefix(&self.topic, self.topic_id, self.partition)
    }
}

/// Where the sources sit in a manifest: their index, if all are present
/// contiguously in order.
fn locate(m: &Manifest, sources: &[String]) -> Option<usize> {
    let first = m.segments.iter().position(|s| s.key == sources[0])?;
    let run = m.segments.get(first..first + sources.len())?;
    run.iter()
        .zip(sources)
        .all(|(s, k)| s.key == *k)
        .then_some(first)
}

#[derive(Debug)]
pub enum Outcome {
    /// The output replaced the sources.
    Merged(Box<Merged>),
    /// Nothing to do: the sources are gone or changed.
    Stale(String),
}

#[derive(Debug)]
pub struct Merged {
    pub output: TieredSegment,
    /// The manifest version that names the output.
    pub manifest: Manifest,
    pub stats: MergeStats,
}

/// An uploaded output not yet named by a manifest (after step 1).
#[derive(Debug)]
pub struct Uploaded {
    pub output: TieredSegment,
    pub stats: MergeStats,
    started: Instant,
}

/// Runs jobs against one store.
#[derive(Clone)]
pub struct Runner {
    store: Arc<dyn ObjectStore>,
    writer: WriterEpoch,
    scratch: PathBuf,
    /// Compaction lags, how long a job ran, manifest timestamps.
    clock: SharedClock,
    /// Output names.
    random: SharedRandom,
    inline_merge_bytes: u64,
}

impl Runner {
    /// With the system's clock and randomness.
    pub fn new(store: Arc<dyn ObjectStore>, node_id: i32, scratch: PathBuf) -> Runner {
        Runner::with(store, node_id, scratch, clock::system(), clock::os_random())
    }

    pub fn with(
        store: Arc<dyn ObjectStore>,
        node_id: i32,
        scratch: PathBuf,
        clock: SharedClock,
        random: SharedRandom,
    ) -> Runner {
        Runner {
            store,
            writer: WriterEpoch::new(node_id, clock.as_ref(), random.as_ref()),
            scratch,
            clock,
            random,
            inline_merge_bytes: INLINE_MERGE_BYTES,
        }
    }

    /// Merges jobs whose sources add up to at most `bytes` in the task
    /// (default [`INLINE_MERGE_BYTES`]); 0 streams every job.
    pub fn inline_merge_bytes(self, bytes: u64) -> Runner {
        Runner {
            inline_merge_bytes: bytes,
            ..self
        }
    }

    /// Steps 1 and 2; the caller deletes the sources after the delay
    /// (`delete_sources`).
    pub async fn run(&self, job: &JobSpec) -> Result<Outcome, CompactionError> {
        match self.merge_and_upload(job).await? {
            Err(stale) => Ok(Outcome::Stale(stale)),
            Ok(uploaded) => self.swap(job, uploaded).await,
        }
    }

    /// Step 1. `Ok(Err(reason))` when the job is stale before it starts.
    pub async fn merge_and_upload(
        &self,
        job: &JobSpec,
    ) -> Result<Result<Uploaded, String>, CompactionError> {
        let started = self.clock.now();
        if job.sources.is_empty() {
            return Err(CompactionError::BadJob("no sources".into()));
        }
        let Some(manifest) = job.manifests(&self.store).load_latest().await? else {
            return Ok(Err("the partition has no manifest".into()));
        };
        let Some(first) = locate(&manifest, &job.sources) else {
            return Ok(Err("sources no longer in the manifest".into()));
        };
        if first + job.sources.len() > manifest.stable_segments() {
            return Ok(Err("sources reach past the last stable offset".into()));
        }
        let segments = manifest.segments[first..first + job.sources.len()].to_vec();
        let aborted = manifest.aborted_txns(
            segments[0].base_offset,
            segments[segments.len() - 1].next_offset,
        );
        let run_id = self.random.uuid().simple().to_string();
        let base = segments[0].base_offset;
        let key = format!(
            "{}-{run_id}",
            segment_key(&job.prefix(), base, job.target_level)
        );
        let work = self.scratch.join(&run_id);
        std::fs::create_dir_all(&work)?;
        let ends_at_end = first + segments.len() == manifest.segments.len();
        let result = self
            .merge_into(
                job,
                &segments,
                aborted,
                (first == 0, ends_at_end),
                work.clone(),
                &key,
            )
            .await;
        let _ = std::fs::remove_dir_all(&work);
        let (output, stats) = result?;
        Ok(Ok(Uploaded {
            output,
            stats,
            started,
        }))
    }

    async fn merge_into(
        &self,
        job: &JobSpec,
        segments: &[TieredSegment],
        aborted: Vec<AbortedTxn>,
        (includes_oldest, ends_at_end): (bool, bool),
        work: PathBuf,
        key: &str,
    ) -> Result<(TieredSegment, MergeStats), CompactionError> {
        let opts = MergeOptions {
            keep_last_batch: ends_at_end,
            ..MergeOptions::for_topic(
                &job.config.settings(),
                job.target_level,
                includes_oldest,
                self.clock.now_ms(),
            )
        };
        let base = segments[0].base_offset;
        let total: u64 = segments.iter().map(|s| s.size).sum();
        let (meta, stats) = if total <= self.inline_merge_bytes {
            let mut sources = Vec::with_capacity(segments.len());
            for s in segments {
                sources.push(StoreSegment::fetch(self.store.clone(), s, work.join("spill")).await?);
            }
            let refs: Vec<&dyn SegmentSource> =
                sources.iter().map(|s| s as &dyn SegmentSource).collect();
            let mut sink = LocalSink::create(&work, base)?;
            merge(&refs, &mut sink, &opts, &aborted)?
        } else {
            let store = self.store.clone();
            let handle = tokio::runtime::Handle::current();
            let sources = segments.to_vec();
            let dir = work.clone();
            tokio::task::spawn_blocking(move || {
                let sources: Vec<StoreSegment> = sources
                    .iter()
                    .map(|s| StoreSegment::new(store.clone(), s, handle.clone(), dir.join("spill")))
                    .collect();
                let refs: Vec<&dyn SegmentSource> =
                    sources.iter().map(|s| s as &dyn SegmentSource).collect();
                let mut sink = LocalSink::create(&dir, base)?;
                merge(&refs, &mut sink, &opts, &aborted)
            })
            .await
            .map_err(|e| CompactionError::InvalidMerge(format!("merge task failed: {e}")))??
        };
        // The output ends where its last source does, so that source's
        // producer snapshot is the output's (a restore reads the newest).
        let last = segments.last().expect("a job has sources");
        match self.store.get(&last.object(SNAPSHOT_EXT)).await {
            Ok(r) => {
                let bytes = r.bytes().await.map_err(ManifestError::from)?;
                std::fs::write(work.join(file_name(base, SNAPSHOT_EXT)), bytes)?
            }
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(ManifestError::from(e).into()),
        }
        objects::upload_segment(&self.store, &work, &meta, key).await?;
        Ok((TieredSegment::from_meta(key.to_string(), &meta), stats))
    }

    /// Step 2: names the output in a new manifest version instead of the
    /// sources, or deletes the output when that is no longer possible.
    pub async fn swap(&self, job: &JobSpec, up: Uploaded) -> Result<Outcome, CompactionError> {
        let manifests = job.manifests(&self.store);
        let give_up = Duration::from_millis(job.max_run_ms);
        if self.clock.now().saturating_duration_since(up.started) > give_up {
            objects::delete_segment(&self.store, &up.output.key).await?;
            return Ok(Outcome::Stale(format!(
                "ran longer than {give_up:?}; orphan collection may already take its output"
            )));
        }
        let Some(base) = manifests.load_latest().await? else {
            objects::delete_segment(&self.store, &up.output.key).await?;
            return Ok(Outcome::Stale("the partition has no manifest".into()));
        };
        let output = up.output.clone();
        let result = manifests
            .commit(&base, &self.writer, self.clock.as_ref(), |m| {
                let first = locate(m, &job.sources).ok_or_else(|| {
                    ManifestError::Superseded("sources no longer in the manifest".into())
                })?;
                m.segments
                    .splice(first..first + job.sources.len(), [output.clone()]);
                Ok(())
            })
            .await;
        match result {
            Ok(manifest) => Ok(Outcome::Merged(Box::new(Merged {
                output: up.output,
                manifest,
                stats: up.stats,
            }))),
            Err(ManifestError::Superseded(reason)) => {
                // A write reported as failed may still have landed.
                if let Some(latest) = manifests.load_latest().await? {
                    if latest.segments.iter().any(|s| s.key == up.output.key) {
                        return Ok(Outcome::Merged(Box::new(Merged {
                            output: up.output,
                            manifest: latest,
                            stats: up.stats,
                        })));
                    }
                }
                objects::delete_segment(&self.store, &up.output.key).await?;
                Ok(Outcome::Stale(reason))
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Step 3: deletes the sources' objects (call after the delay).
    pub async fn delete_sources(&self, job: &JobSpec) -> Result<(), CompactionError> {
        for key in &job.sources {
            objects::delete_segment(&self.store, key).await?;
        }
        Ok(())
    }
}
