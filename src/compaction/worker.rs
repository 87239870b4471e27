//! A compaction worker: consumes jobs from `__strata_compaction` as a
//! member of the `strata-compaction` consumer group, through the Kafka
//! protocol, and runs them against the object store directly. The broker
//! runs one against itself; `strata compact` runs more anywhere, and the
//! group spreads the job partitions over all of them.
//!
//! A job's offset is committed once its manifest write is done (or it
//! proved stale); a worker that dies before that leaves the job to be
//! redelivered to the next owner of its partition, which is safe because
//! jobs are idempotent. Sources are deleted after the job's delay by a
//! detached task; if the worker dies first, the orphan scan takes them.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use object_store::ObjectStore;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{CommitMode, Consumer, StreamConsumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::watch;

use super::job::{JobSpec, Merged, Outcome, Runner, JOBS_TOPIC, WORKER_GROUP};
use super::CompactionError;
use crate::clock::{self, SharedClock, SharedRandom};
use crate::manifest::Manifest;

/// Told about every manifest a job wrote (the broker adopts it at once
/// instead of finding out at its next write or failed read).
pub type OnMerged = Arc<dyn Fn(&JobSpec, &Manifest) + Send + Sync>;

#[derive(Clone)]
pub struct WorkerOptions {
    pub bootstrap: String,
    pub group_id: String,
    pub node_id: i32,
    pub scratch_dir: PathBuf,
    /// More librdkafka properties: how to connect and authenticate
    /// (`security.protocol`, `sasl.*`, `ssl.*`).
    pub client_properties: Vec<(String, String)>,
    /// What this worker's merges read and wrote.
    pub totals: Arc<MergeTotals>,
    /// Time and output names for the jobs; the system's unless replaced.
    pub clock: SharedClock,
    pub random: SharedRandom,
}

impl std::fmt::Debug for WorkerOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let properties: Vec<(&str, &str)> = self
            .client_properties
            .iter()
            .map(|(k, v)| (k.as_str(), if k.contains("password") { "***" } else { v }))
            .collect();
        f.debug_struct("WorkerOptions")
            .field("bootstrap", &self.bootstrap)
            .field("group_id", &self.group_id)
            .field("node_id", &self.node_id)
            .field("scratch_dir", &self.scratch_dir)
            .field("client_properties", &properties)
            .finish_non_exhaustive()
    }
}

/// Merges done and the segment bytes they read and wrote.
#[derive(Debug, Default)]
pub struct MergeTotals {
    pub merges: AtomicU64,
    pub input_bytes: AtomicU64,
    pub output_bytes: AtomicU64,
}

impl WorkerOptions {
    pub fn new(bootstrap: String, node_id: i32, scratch_dir: PathBuf) -> WorkerOptions {
        WorkerOptions {
            bootstrap,
            group_id: WORKER_GROUP.to_string(),
            node_id,
            scratch_dir,
            client_properties: Vec::new(),
            totals: Arc::default(),
            clock: clock::system(),
            random: clock::os_random(),
        }
    }
}

/// Consumes and runs jobs until `stop` turns true.
pub async fn run(
    store: Arc<dyn ObjectStore>,
    opts: WorkerOptions,
    on_merged: Option<OnMerged>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), CompactionError> {
    let mut config = ClientConfig::new();
    for (k, v) in &opts.client_properties {
        config.set(k, v);
    }
    let consumer: StreamConsumer = config
        .set("bootstrap.servers", &opts.bootstrap)
        .set("group.id", &opts.group_id)
        .set("enable.auto.commit", "false")
        .set("auto.offset.reset", "earliest")
        // A worker that dies mid-job hands its partitions (and the job) to
        // the others this soon.
        .set("session.timeout.ms", "10000")
        .set("heartbeat.interval.ms", "1000")
        .set("client.id", format!("strata-compaction-{}", opts.node_id))
        .create()?;
    consumer.subscribe(&[JOBS_TOPIC])?;
    let runner = Runner::with(
        store,
        opts.node_id,
        opts.scratch_dir.clone(),
        opts.clock.clone(),
        opts.random.clone(),
    );
    tracing::info!(
        bootstrap = opts.bootstrap,
        group = opts.group_id,
        "compaction worker started"
    );
    loop {
        let message = tokio::select! {
            _ = stop.wait_for(|s| *s) => break,
            m = consumer.recv() => m,
        };
        let message = match message {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(error = %e, "reading compaction jobs failed");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let (partition, offset) = (message.partition(), message.offset());
        match message.payload().map(serde_json::from_slice::<JobSpec>) {
            Some(Ok(job)) => run_one(&runner, job, on_merged.as_ref(), &opts.totals).await,
            Some(Err(e)) => {
                tracing::warn!(partition, offset, error = %e, "skipping malformed compaction job")
            }
            None => tracing::warn!(partition, offset, "skipping empty compaction job"),
        }
        let mut done = TopicPartitionList::new();
        done.add_partition_offset(JOBS_TOPIC, partition, Offset::Offset(offset + 1))?;
        if let Err(e) = consumer.commit(&done, CommitMode::Async) {
            tracing::warn!(error = %e, "committing a compaction job failed; it may run again");
        }
    }
    Ok(())
}

async fn run_one(
    runner: &Runner,
    job: JobSpec,
    on_merged: Option<&OnMerged>,
    totals: &MergeTotals,
) {
    match runner.run(&job).await {
        Ok(Outcome::Merged(merged)) => {
            let Merged {
                output,
                manifest,
                stats,
            } = *merged;
            totals.merges.fetch_add(1, Ordering::Relaxed);
            totals
                .input_bytes
                .fetch_add(stats.input_bytes, Ordering::Relaxed);
            totals
                .output_bytes
                .fetch_add(stats.output_bytes, Ordering::Relaxed);
            tracing::info!(
                topic = job.topic,
                partition = job.partition,
                sources = job.sources.len(),
                level = output.level,
                input_bytes = stats.input_bytes,
                output_bytes = stats.output_bytes,
                records_removed = stats.records_removed,
                "compacted"
            );
            if let Some(f) = on_merged {
                f(&job, &manifest);
            }
            let runner = runner.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(job.delete_delay_ms)).await;
                if let Err(e) = runner.delete_sources(&job).await {
                    tracing::warn!(topic = job.topic, partition = job.partition, error = %e, "deleting compaction sources failed; the orphan scan will");
                }
            });
        }
        Ok(Outcome::Stale(reason)) => {
            tracing::info!(
                topic = job.topic,
                partition = job.partition,
                reason,
                "dropped a stale compaction job"
            )
        }
        Err(e) => {
            tracing::warn!(topic = job.topic, partition = job.partition, error = %e, "compaction job failed; it will be queued again")
        }
    }
}
