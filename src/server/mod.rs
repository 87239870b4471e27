//! The composition root: reads the command line (`config`), builds every
//! layer in order (`phases`), runs the background jobs (`jobs`), accepts
//! connections, and shuts down cleanly (stop accepting, sync every partition).

mod cluster;
pub mod config;
mod connection;
mod data_dir;
mod dynamic;
pub(crate) mod frame;
mod http;
mod jobs;
pub(crate) mod limits;
mod metrics;
mod phases;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::Broker;
use crate::auth::{
    self,
    credentials::{Change, Credentials},
};
use crate::catalog::config::CompactionPolicy;
use crate::catalog::Catalog;
use crate::clock::{self, Random, SharedClock};
use crate::compaction::scheduler::Scheduler;
use crate::compaction::worker::{self, OnMerged, WorkerOptions};
use crate::coordinator::txn::TxnCoordinator;
use crate::coordinator::GroupCoordinator;
use crate::manifest::counted::RequestCounts;
use crate::tier::Tier;
use config::{BrokerConfig, SaslLogin};
use jobs::Jobs;
use phases::{
    accept, bind_listeners, build_api, join_cluster, open_state, open_store, report_serving,
    restore, serve_health, spawn_jobs,
};

pub struct Server {
    local_addr: SocketAddr,
    /// Every listener's name and bound address, in the order configured.
    listener_addrs: Vec<(String, SocketAddr)>,
    broker: Arc<Broker>,
    stop: watch::Sender<bool>,
    /// Supervises every background job; ends once they have after the stop signal.
    jobs: JoinHandle<()>,
    tier: Arc<Tier>,
    /// Cluster mode: this broker's membership and write-ahead log.
    joined: Option<cluster::Joined>,
    /// Set when the broker must stop serving for good.
    fatal: watch::Sender<Option<String>>,
    store_requests: Arc<RequestCounts>,
    /// Held while the broker runs.
    _data_dir: data_dir::DataDir,
    /// With `--metrics-listen`: what `/readyz` reports.
    health: Option<Arc<http::Health>>,
}

impl Server {
    /// Opens the data directory (recovering every partition) and starts listening.
    pub async fn start(config: BrokerConfig) -> anyhow::Result<Server> {
        Server::start_with_store(config, None).await
    }

    /// Like `start`, with the object store given instead of opened from
    /// `--store` (tests share a `memory://` or fault-injecting store this
    /// way). Each phase builds what the next needs; nothing is wired later.
    pub async fn start_with_store(
        config: BrokerConfig,
        store: Option<Arc<dyn object_store::ObjectStore>>,
    ) -> anyhow::Result<Server> {
        // Built once and handed down: the group coordinator, fetch waits, the
        // tier's jobs and compaction scheduling read time through these.
        let (clock, random) = (clock::system(), clock::os_random());
        let data_dir = data_dir::claim(&config.data_dir, random.as_ref())?;
        let (stop, stop_rx) = watch::channel(false);
        let mut jobs = Jobs::new(stop_rx);
        let (store, store_requests) = open_store(&config, store, &random)?;
        let health = serve_health(&config, &store, &mut jobs).await?;
        restore(&config, &store).await?;
        let listeners = bind_listeners(&config).await?;
        let joined = join_cluster(&config, &store, &listeners, &data_dir).await?;
        let state = open_state(&config, store, joined.as_ref(), &listeners, clock, random).await?;
        let broker = build_api(&config, &state, &listeners, joined.as_ref());
        // Stored dynamic configs (a rotated keystore above all) before any accept.
        broker
            .refresh_dynamic_configs()
            .await
            .map_err(|e| anyhow::anyhow!("reading dynamic broker configs: {e}"))?;
        let (fatal, _) = watch::channel(None);
        let merges = spawn_jobs(
            &config,
            &state,
            &broker,
            joined.as_ref(),
            &listeners,
            &fatal,
            &store_requests,
            &mut jobs,
        );
        let (local_addr, listener_addrs) = accept(listeners, &broker, &config, &mut jobs);
        if let Some(health) = &health {
            report_serving(
                health,
                &broker,
                &state,
                &store_requests,
                merges,
                joined.as_ref(),
            );
        }
        tracing::info!(%local_addr, data_dir = %config.data_dir.display(), fsync = ?config.fsync, "strata broker listening");
        Ok(Server {
            local_addr,
            listener_addrs,
            broker,
            stop,
            jobs: tokio::spawn(jobs.supervise(health.clone())),
            tier: state.tier,
            joined,
            fatal,
            store_requests,
            health,
            _data_dir: data_dir,
        })
    }

    /// The tiered-storage side (tests inspect and drive it).
    pub fn tier(&self) -> &Arc<Tier> {
        &self.tier
    }

    /// The first listener's bound address.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The bound address of the listener named `name`.
    pub fn listener_addr(&self, name: &str) -> Option<SocketAddr> {
        self.listener_addrs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| *a)
    }

    /// Runs until the accept loop ends (it only ends on shutdown).
    /// Fails when the broker cannot go on (cluster mode: fenced by a newer
    /// leader after a pause), so that it exits and starts afresh.
    pub async fn wait(&self) -> anyhow::Result<()> {
        let mut rx = self.stop.subscribe();
        let mut fatal = self.fatal.subscribe();
        tokio::select! {
            _ = rx.wait_for(|s| *s) => Ok(()),
            f = fatal.wait_for(|f| f.is_some()) => match f.ok().and_then(|f| f.clone()) {
                Some(why) => Err(anyhow::anyhow!(why)),
                None => Ok(()),
            },
        }
    }

    /// Stops accepting connections and makes everything appended durable.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        if let Some(h) = &self.health {
            h.stopping();
        }
        self.stop.send_replace(true);
        if let Some(j) = self.joined {
            // Hand over at once instead of after a lease TTL: stop serving,
            // make every head durable, then leave.
            j.node.stop_all();
            j.wal.flush().await;
            if let Err(e) = j.controller.resign().await {
                tracing::warn!(error = %e, "resigning as controller failed");
            }
            if let Err(e) = j.node.member().leave().await {
                tracing::warn!(error = %e, "leaving the cluster failed; the lease will expire");
            }
        }
        let catalog = self.broker.catalog.clone();
        tokio::task::spawn_blocking(move || {
            for p in catalog.all_partitions() {
                if let Err(e) = p.sync_blocking() {
                    tracing::error!(dir = %p.dir().display(), error = %e, "sync at shutdown failed");
                }
            }
        })
        .await?;
        if let Err(e) = self.jobs.await {
            tracing::error!(error = %e, "supervising the background jobs failed");
        }
        tracing::info!(requests = %self.store_requests, "object store requests since start");
        tracing::info!("shutdown complete");
        Ok(())
    }
}

/// The broker's own SASL user gets a SCRAM credential from its configured
/// password when it has none for the mechanism (for PLAIN: none at all), so
/// that a fresh deployment needs no step before its brokers can talk.
async fn add_inter_broker_user(
    credentials: &Credentials,
    login: &SaslLogin,
    random: &dyn Random,
) -> anyhow::Result<()> {
    let have = credentials.user(&login.username).await?;
    let mechanism = match auth::scram::Mechanism::from_name(&login.mechanism) {
        Some(m) => m,
        // PLAIN is checked against any SCRAM credential.
        None if !have.is_empty() => return Ok(()),
        None => auth::scram::Mechanism::Sha512,
    };
    if have.contains_key(mechanism.name()) {
        return Ok(());
    }
    let salt = random.uuid().as_bytes().to_vec();
    let credential = tokio::task::spawn_blocking({
        let password = login.password.clone();
        move || {
            auth::scram::Credential::from_password(
                mechanism,
                &password,
                &salt,
                auth::scram::MIN_ITERATIONS,
            )
        }
    })
    .await?;
    credentials
        .alter(vec![(
            login.username.clone(),
            Change::Upsert(mechanism, credential),
        )])
        .await?;
    tracing::info!(
        user = login.username,
        mechanism = mechanism.name(),
        "created the SCRAM credential of the inter-broker user from its configured password"
    );
    Ok(())
}

/// Creates the `--add-scram` credentials a user does not have yet.
async fn add_scram_users(
    credentials: &Credentials,
    flags: &[String],
    random: &dyn Random,
) -> anyhow::Result<()> {
    for flag in flags {
        let (mechanism, user, password, iterations) = auth::credentials::parse_add_scram(flag)
            .map_err(|e| anyhow::anyhow!("--add-scram: {e}"))?;
        if credentials
            .user(&user)
            .await?
            .contains_key(mechanism.name())
        {
            continue;
        }
        let salt = random.uuid().as_bytes().to_vec();
        let credential =
            auth::scram::Credential::from_password(mechanism, &password, &salt, iterations);
        credentials
            .alter(vec![(user.clone(), Change::Upsert(mechanism, credential))])
            .await?;
        tracing::info!(
            user,
            mechanism = mechanism.name(),
            "SCRAM credential created"
        );
    }
    Ok(())
}

async fn accept_loop(
    listener: TcpListener,
    broker: Arc<Broker>,
    max_frame: usize,
    limits: Arc<limits::ConnectionLimits>,
    shared: Arc<connection::Listener>,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            // At max.connections nothing is accepted until a slot frees.
            accepted = async { limits.wait_for_slot().await; listener.accept().await } => match accepted {
                Ok((stream, peer)) => {
                    let Some(permit) = limits.admit(peer.ip()) else {
                        tracing::info!(%peer, "closing connection: max.connections.per.ip reached");
                        continue;
                    };
                    let (broker, shared) = (broker.clone(), shared.clone());
                    tokio::spawn(async move {
                        connection::accept(stream, broker, max_frame, shared).await;
                        drop(permit);
                    });
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Every second, at debug level under its own target, so that a benchmark
/// can turn the counts into rates over the interval it measures.
async fn log_store_requests(
    counts: Arc<RequestCounts>,
    clock: SharedClock,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                let at_ms = clock.now_ms();
                tracing::debug!(target: "strata::store_requests", at_ms, requests = %counts);
            }
        }
    }
}

async fn flush_periodically(
    broker: Arc<Broker>,
    every: std::time::Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                for p in broker.catalog.all_partitions() {
                    if let Err(e) = p.sync().await {
                        tracing::error!(dir = %p.dir().display(), error = %e, "background fsync failed");
                    }
                }
            }
        }
    }
}

/// The broker's own compaction worker. It starts once the first job is
/// queued, so a broker that never compacts never joins the worker group.
async fn run_compaction_worker(
    tier: Arc<Tier>,
    scheduler: Arc<Scheduler>,
    opts: WorkerOptions,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while !scheduler.has_jobs() {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
    }
    let adopter = tier.clone();
    let on_merged: OnMerged =
        Arc::new(move |job, manifest| adopter.adopt(job.topic_id, job.partition, manifest));
    if let Err(e) = worker::run(tier.store().clone(), opts, Some(on_merged), stop).await {
        tracing::error!(error = %e, "the compaction worker stopped");
    }
}

/// How often the manifest of a partition that another broker also writes is
/// read again: one this broker schedules merges for but does not lead (the
/// leader uploads), or leads but does not schedule (merges from elsewhere,
/// which its reads must see).
const REREAD_SHARED: Duration = Duration::from_secs(3);

/// Queues the merges each partition's compaction policy wants, against the
/// tier's manifests: checked every tier interval, and against the latest
/// manifest in the store only when a merge looks due or a queued job may
/// have finished (a worker elsewhere may have changed the manifest).
async fn schedule_compactions(
    tier: Arc<Tier>,
    catalog: Arc<Catalog>,
    scheduler: Arc<Scheduler>,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(tier.interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut reread = std::collections::HashMap::new();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {}
        }
        for topic in catalog.topics() {
            if topic.settings().compaction == CompactionPolicy::None {
                continue;
            }
            for index in 0..topic.partition_count() as i32 {
                let schedules = scheduler.tends(topic.id(), index);
                let leads = tier.tends(topic.id(), index);
                if !schedules && !leads {
                    continue;
                }
                let remote = match tier.remote_of(&topic, index).await {
                    Ok(Some(r)) => r,
                    Ok(None) => continue,
                    Err(e) => {
                        tracing::warn!(topic = topic.name(), partition = index, error = %e, "reading the manifest failed; will retry");
                        continue;
                    }
                };
                // Cluster mode: another broker's uploads or merges change the
                // manifest unseen here but for a reread.
                let now = tokio::time::Instant::now();
                let key = (topic.id(), index);
                let stale = !(schedules && leads)
                    && reread.get(&key).is_none_or(|at| now - *at >= REREAD_SHARED);
                if stale {
                    reread.insert(key, now);
                }
                let check = schedules
                    && (!scheduler.due(&topic, index, &remote.manifest()).is_empty()
                        || scheduler.should_check(topic.id(), index));
                if !stale && !check {
                    continue;
                }
                let queued = async {
                    remote.refresh().await?;
                    if schedules {
                        for job in scheduler.due(&topic, index, &remote.manifest()) {
                            scheduler.queue(job)?;
                        }
                    }
                    anyhow::Ok(())
                };
                if let Err(e) = queued.await {
                    tracing::warn!(topic = topic.name(), partition = index, error = %e, "queuing compaction jobs failed; will retry");
                }
            }
        }
    }
}

/// Drives group timeouts (sessions, rebalances) and offset expiry.
async fn run_coordinator_timers(
    coordinator: Arc<GroupCoordinator>,
    clock: SharedClock,
    retention_check: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    let mut last_expiry = clock.now();
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                let now = clock.now();
                let expire = now.duration_since(last_expiry) >= retention_check;
                if expire {
                    last_expiry = now;
                }
                coordinator.tick(expire);
            }
        }
    }
}

/// Aborts transactions past their timeout and expires idle transactional ids.
async fn run_txn_timers(
    txn: Arc<TxnCoordinator>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                let (aborted, expired) = txn.tick().await;
                if aborted + expired > 0 {
                    tracing::debug!(aborted, expired, "transaction timers");
                }
            }
        }
    }
}

/// delegation.token.expiry.check.interval.ms: removes expired tokens. In a
/// cluster every broker runs it; a removal is conditional on the token not
/// having changed since it was read, so two brokers never undo a renewal.
async fn remove_expired_tokens(
    tokens: Arc<crate::auth::tokens::Tokens>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                if let Err(e) = tokens.remove_expired().await {
                    tracing::warn!(error = %e, "could not remove expired delegation tokens");
                }
            }
        }
    }
}

/// Cluster mode: reruns `refresh` every poll, to follow what other brokers
/// change in etcd (ACLs and quotas, dynamic broker configs, feature levels).
async fn follow<E, F>(
    what: &'static str,
    mut refresh: impl FnMut() -> F,
    mut stop: watch::Receiver<bool>,
) where
    E: std::fmt::Display,
    F: std::future::Future<Output = Result<(), E>>,
{
    let mut tick = tokio::time::interval(crate::cluster::ACCESS_POLL);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = refresh().await {
                    tracing::warn!(error = %e, "rereading {what} failed");
                }
            }
            _ = stop.changed() => return,
        }
    }
}
