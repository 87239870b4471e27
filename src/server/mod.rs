//! The listener: accepts connections, runs background flushing, and shuts
//! down cleanly (stop accepting, sync every partition).

mod cluster;
mod connection;
mod data_dir;
pub mod frame;
mod http;
pub mod limits;
mod metrics;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::access::Access;
use crate::api::metrics::RequestMetrics;
use anyhow::Context;

use crate::api::{Broker, InterBroker, Listeners};
use crate::auth::{
    self,
    credentials::{Change, Credentials},
};
use crate::catalog::{Catalog, CatalogSettings};
use crate::clock::{self, SharedClock};
use crate::cluster::Endpoint;
use crate::compaction::policy::POLICY_NONE;
use crate::compaction::scheduler::{Scheduler, SchedulerSettings};
use crate::compaction::worker::{self, MergeTotals, OnMerged, WorkerOptions};
use crate::config::{BrokerConfig, FsyncPolicy, SaslLogin, SecurityProtocol};
use crate::coordinator::store::OffsetsStore;
use crate::coordinator::txn::store::{TxnStore, TXN_TOPIC};
use crate::coordinator::txn::TxnCoordinator;
use crate::coordinator::GroupCoordinator;
use crate::log::Visibility;
use crate::manifest::counted::{Counted, RequestCounts};
use crate::manifest::store::open_from_args;
use crate::tier::{self, Tier};

/// A compaction job not done after this long is queued again.
const REQUEUE_AFTER: Duration = Duration::from_secs(300);

pub struct Server {
    local_addr: SocketAddr,
    /// Every listener's name and bound address, in the order configured.
    listener_addrs: Vec<(String, SocketAddr)>,
    broker: Arc<Broker>,
    stop: watch::Sender<bool>,
    accept: Vec<JoinHandle<()>>,
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
    /// `--store` (tests share a `memory://` or fault-injecting store this way).
    pub async fn start_with_store(
        config: BrokerConfig,
        store: Option<Arc<dyn object_store::ObjectStore>>,
    ) -> anyhow::Result<Server> {
        // Built once and handed down: the group coordinator, fetch waits, the
        // tier's jobs and compaction scheduling read time through these.
        let clock = clock::system();
        let random = clock::os_random();
        let data_dir_claim = data_dir::claim(&config.data_dir, random.as_ref())?;
        let store = match store {
            Some(s) => s,
            None => open_from_args(&config.object_store, &config.data_dir)?,
        };
        let (store, store_requests) = Counted::wrap(store);
        let (stop, stop_rx) = watch::channel(false);
        // First of all, so that the process shows alive (and not ready)
        // while a large data directory recovers.
        let health = match config.metrics_listen {
            Some(addr) => {
                let health = http::Health::new(store.clone());
                http::serve(addr, health.clone(), stop_rx.clone()).await?;
                Some(health)
            }
            None => None,
        };
        // A wiped data directory is refilled from the store before the catalog reads it.
        let restored = tier::restore::restore(&store, &config.data_dir).await?;
        if restored != Default::default() {
            tracing::info!(
                topics = restored.topics,
                partitions = restored.partitions,
                "restored from the object store"
            );
        }
        let data_dir = config.data_dir.clone();
        let coordinator_config = config.coordinator();
        let txn_config = config.transactions();
        let scheduler_settings = SchedulerSettings {
            delete_delay_ms: config.compaction_delete_delay_ms,
            max_run_ms: config.orphan_min_age_ms / 2,
            requeue_after: REQUEUE_AFTER,
        };
        let specs = config.listeners().map_err(anyhow::Error::msg)?;
        let (inter_spec, inter_login) = config.inter_broker().map_err(anyhow::Error::msg)?;
        // Client certificates only on SSL listeners: a SASL_SSL client
        // proves itself with SASL (Kafka's KIP-684).
        let acceptor = |protocol: SecurityProtocol| -> anyhow::Result<_> {
            let (Some(cert), Some(key)) = (&config.ssl_cert_file, &config.ssl_key_file) else {
                anyhow::bail!("SSL and SASL_SSL listeners need --ssl-cert-file and --ssl-key-file");
            };
            let client_auth = match protocol {
                SecurityProtocol::Ssl => config.ssl_client_auth,
                _ => auth::tls::ClientAuth::None,
            };
            let tls =
                auth::tls::server_config(cert, key, config.ssl_ca_file.as_deref(), client_auth)?;
            Ok(tokio_rustls::TlsAcceptor::from(tls))
        };
        for m in &config.sasl_enabled_mechanisms {
            if !auth::sasl::MECHANISMS.contains(&m.as_str()) {
                anyhow::bail!(
                    "SASL mechanism {m} is not supported (supported: {:?})",
                    auth::sasl::MECHANISMS
                );
            }
        }
        let mut bound = Vec::new();
        let mut endpoints = Vec::new();
        for spec in &specs {
            let listener = TcpListener::bind(spec.bind)
                .await
                .with_context(|| format!("listener {} on {}", spec.name, spec.bind))?;
            let addr = listener.local_addr()?;
            let (host, port) = match &spec.advertised {
                Some((host, port)) => (host.clone(), if *port == 0 { addr.port() } else { *port }),
                None if addr.ip().is_unspecified() => ("localhost".to_string(), addr.port()),
                None => (addr.ip().to_string(), addr.port()),
            };
            endpoints.push(Endpoint {
                name: spec.name.clone(),
                host,
                port,
            });
            let tls = match spec.protocol.tls() {
                true => Some(acceptor(spec.protocol)?),
                false => None,
            };
            bound.push((listener, spec.clone(), addr, tls));
        }
        let local_addr = bound[0].2;
        let bound_addrs: Vec<SocketAddr> = bound.iter().map(|b| b.2).collect();
        let inter_index = specs
            .iter()
            .position(|s| s.name == inter_spec.name)
            .expect("inter_broker() picked a configured listener");
        // The acceptor above already required the certificate and key of a TLS listener.
        let inter_tls = match (&config.ssl_cert_file, &config.ssl_key_file) {
            (Some(cert), Some(key)) if inter_spec.protocol.tls() => {
                let ca = config.ssl_ca_file.as_ref();
                let tls = auth::tls::client_config(ca.map(|p| p.as_path()), cert, key)?;
                Some((tls, ca, cert, key))
            }
            _ => None,
        };
        let (host, port) = (endpoints[0].host.clone(), endpoints[0].port as i32);
        let joined = match &config.cluster {
            Some(url) => {
                let me = cluster::Incarnation {
                    host: &host,
                    port,
                    listeners: endpoints.clone(),
                    directory_id: &data_dir_claim.id,
                };
                Some(cluster::join(&config, url, &store, me).await?)
            }
            None => None,
        };
        let credentials = match &joined {
            Some(j) => {
                let etcd = j.node.member().etcd();
                auth::credentials::Credentials::open_etcd(etcd.client(), &etcd.keys().root())
            }
            None => auth::credentials::Credentials::open_store(store.clone()).await?,
        };
        let credentials = Arc::new(credentials);
        add_scram_users(&credentials, &config.add_scram).await?;
        if let Some(login) = &inter_login {
            add_inter_broker_user(&credentials, login).await?;
        }
        // Consumers see only what is durable wherever durability is promised.
        let durable =
            (config.fsync == FsyncPolicy::Always && !config.null_sink) || joined.is_some();
        let catalog_settings = CatalogSettings {
            visibility: if durable {
                Visibility::Durable
            } else {
                Visibility::Appended
            },
        };
        let catalog =
            tokio::task::spawn_blocking(move || Catalog::open(&data_dir, catalog_settings))
                .await??;
        let catalog = Arc::new(catalog);
        if let Some(j) = &joined {
            let internal = [
                OffsetsStore::topic_spec(&coordinator_config),
                TxnStore::topic_spec(txn_config.segment_bytes),
                Scheduler::topic_spec(),
            ];
            cluster::adopt_topics(&j.node, &catalog, &internal).await?;
        }
        let (offsets, txn_store, scheduler) = {
            let coordinator_config = coordinator_config.clone();
            let txn_config = txn_config.clone();
            let clock = clock.clone();
            let catalog = catalog.clone();
            tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
                // Before the tier opens, so that a first start's new offsets,
                // transaction and jobs topics get their remote parts with every other partition.
                let offsets = OffsetsStore::open(&catalog, &coordinator_config, clock.clone())?;
                let txn_store = TxnStore::open(
                    &catalog,
                    txn_config.segment_bytes,
                    txn_config.wait_for_fsync,
                    clock.clone(),
                )?;
                let scheduler = Scheduler::open(catalog.clone(), scheduler_settings, clock)?;
                Ok((offsets, txn_store, Arc::new(scheduler)))
            })
            .await??
        };
        // ACLs and quotas live where the topic catalog does: etcd or the store.
        let access_backend: Box<dyn crate::access::Backend> = match &joined {
            Some(j) => Box::new(crate::cluster::EtcdAccess::new(
                j.node.member().etcd().clone(),
            )),
            None => Box::new(crate::access::StoreBackend::new(store.clone())),
        };
        let access = Arc::new(Access::open(config.access(), access_backend).await?);
        let tier = Tier::open(store, catalog.clone(), &config, clock.clone()).await?;
        if let Some(j) = &joined {
            // Uploads, retention, orphan scans and merges: only what this broker serves.
            let node = j.node.clone();
            let serves: tier::Scope = Arc::new(move |t, p| node.serving(t, p).is_some());
            tier.set_scope(serves.clone());
            tier.limit_head_age(Duration::from_millis(config.wal_max_age_ms));
            scheduler.set_scope(serves);
        }
        // After the tier: the replay reads tiered offsets through it.
        let coordinator = Arc::new(
            GroupCoordinator::open(
                catalog.clone(),
                offsets,
                coordinator_config,
                clock.clone(),
                random,
            )
            .await?,
        );
        let cluster_node = joined.as_ref().map(|j| j.node.clone());
        let lease = cluster_node.as_ref().map(|n| n.member().subscribe());
        let txn_leadership = cluster_node.as_ref().and_then(|node| {
            let id = catalog.topic(TXN_TOPIC)?.id();
            let node = node.clone();
            let l: crate::coordinator::txn::Leadership = Arc::new(move || node.serving(id, 0));
            Some(l)
        });
        let txn = Arc::new(
            TxnCoordinator::open(
                txn_store,
                txn_config,
                clock.clone(),
                Broker::producer_ids(catalog.clone(), cluster_node),
                txn_leadership,
            )
            .await?,
        );
        let mut broker = Broker::new(
            catalog,
            coordinator.clone(),
            txn.clone(),
            &config,
            clock.clone(),
            joined.as_ref().map(|j| j.node.clone()),
            access.clone(),
            Listeners {
                endpoints: endpoints.clone(),
                credentials: credentials.clone(),
                inter_broker: Arc::new(InterBroker::new(
                    inter_spec.name.clone(),
                    inter_tls.as_ref().map(|t| t.0.clone()),
                    inter_login.clone(),
                )),
            },
        );
        let request_metrics = health.as_ref().map(|_| Arc::new(RequestMetrics::new()));
        broker.metrics = request_metrics.clone();
        let broker = Arc::new(broker);
        let (fatal, _) = watch::channel(None);
        if let Some(j) = &joined {
            tokio::spawn(j.wal.clone().run(stop_rx.clone()));
            let leadership = cluster::Leadership {
                node: j.node.clone(),
                catalog: broker.catalog.clone(),
                tier: tier.clone(),
                wal: j.wal.clone(),
                coordinator: coordinator.clone(),
                txn: txn.clone(),
                fatal: fatal.clone(),
            };
            tokio::spawn(leadership.run(stop_rx.clone()));
            tokio::spawn(cluster::collect_wal(tier.clone(), stop_rx.clone()));
        }
        if joined.is_some() {
            tokio::spawn(follow_access(access, stop_rx.clone()));
        }
        tokio::spawn(tier.clone().run(stop_rx.clone()));
        tokio::spawn(log_store_requests(store_requests.clone(), stop_rx.clone()));
        tokio::spawn(schedule_compactions(
            tier.clone(),
            broker.catalog.clone(),
            scheduler.clone(),
            stop_rx.clone(),
        ));
        let merges = Arc::new(MergeTotals::default());
        if config.compaction_worker {
            // Its own listener's bound address; through TLS the advertised
            // host, the name the certificate is for.
            let addr = bound_addrs[inter_index];
            let bootstrap = if inter_tls.is_some() {
                let e = &endpoints[inter_index];
                format!("{}:{}", e.host, e.port)
            } else if addr.ip().is_unspecified() {
                SocketAddr::new(std::net::Ipv4Addr::LOCALHOST.into(), addr.port()).to_string()
            } else {
                addr.to_string()
            };
            let mut opts = WorkerOptions::new(
                bootstrap,
                config.node_id,
                config.data_dir.join("compaction"),
            );
            opts.client_properties = worker_security(
                inter_spec.protocol,
                inter_login.as_ref(),
                inter_tls.as_ref(),
            );
            opts.totals = merges.clone();
            tokio::spawn(run_compaction_worker(
                tier.clone(),
                scheduler.clone(),
                opts,
                stop_rx.clone(),
            ));
        }
        if let Some(jobs) = txn.marker_jobs() {
            tokio::spawn(crate::api::run_markers(
                broker.clone(),
                jobs,
                Duration::from_millis(config.txn_marker_delay_ms),
                stop_rx.clone(),
            ));
        }
        tokio::spawn(run_txn_timers(
            txn,
            Duration::from_millis(
                config
                    .transaction_abort_timed_out_transaction_cleanup_interval_ms
                    .max(1),
            ),
            stop_rx.clone(),
        ));
        let retention_check =
            Duration::from_millis(config.offsets_retention_check_interval_ms.max(1));
        tokio::spawn(run_coordinator_timers(
            coordinator,
            clock,
            retention_check,
            stop_rx.clone(),
        ));
        if config.fsync == FsyncPolicy::Interval {
            tokio::spawn(flush_periodically(
                broker.clone(),
                config.fsync_interval(),
                stop_rx.clone(),
            ));
        }
        let sasl = Arc::new(connection::SaslSettings {
            mechanisms: config.sasl_enabled_mechanisms.clone(),
            credentials,
            max_reauth: (config.connections_max_reauth_ms > 0)
                .then(|| Duration::from_millis(config.connections_max_reauth_ms)),
            failed_delay: Duration::from_millis(config.connection_failed_authentication_delay_ms),
        });
        let limits = limits::ConnectionLimits::from_config(&config);
        let mut accept = Vec::new();
        let mut listener_addrs = Vec::new();
        for ((listener, spec, addr, tls), endpoint) in bound.into_iter().zip(&endpoints) {
            let shared = Arc::new(connection::Listener {
                name: spec.name.clone(),
                protocol: spec.protocol,
                tls,
                sasl: sasl.clone(),
                idle: limits.idle(),
            });
            accept.push(tokio::spawn(accept_loop(
                listener,
                broker.clone(),
                config.max_request_bytes,
                limits.clone(),
                shared,
                stop_rx.clone(),
            )));
            tracing::info!(listener = spec.name, protocol = spec.protocol.name(), %addr, advertised = %format!("{}:{}", endpoint.host, endpoint.port), "listening");
            listener_addrs.push((spec.name.clone(), addr));
        }
        if let (Some(health), Some(requests)) = (&health, &request_metrics) {
            let mut registry = Registry::default();
            requests.register(&mut registry);
            registry.register_collector(Box::new(metrics::Scraped {
                broker: broker.clone(),
                tier: tier.clone(),
                scheduler: scheduler.clone(),
                store: store_requests.clone(),
                merges,
            }));
            if let Some(lease) = lease {
                health.member(lease);
            }
            health.serving(registry);
        }
        tracing::info!(%local_addr, advertised = %format!("{host}:{port}"), data_dir = %config.data_dir.display(), fsync = ?config.fsync, "strata broker listening");
        Ok(Server {
            local_addr,
            listener_addrs,
            broker,
            stop,
            accept,
            tier,
            joined,
            fatal,
            store_requests,
            health,
            _data_dir: data_dir_claim,
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
        for a in &self.accept {
            a.abort();
        }
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
        tracing::info!(requests = %self.store_requests, "object store requests since start");
        tracing::info!("shutdown complete");
        Ok(())
    }
}

/// librdkafka's settings for the inter-broker listener (`ssl.*` as the
/// listener's own files: the CA it trusts, the broker's certificate).
fn worker_security(
    protocol: SecurityProtocol,
    login: Option<&SaslLogin>,
    tls: Option<&InterBrokerTls<'_>>,
) -> Vec<(String, String)> {
    let mut out = vec![(
        "security.protocol".to_string(),
        protocol.name().to_ascii_lowercase(),
    )];
    if let Some(login) = login {
        out.push(("sasl.mechanisms".into(), login.mechanism.clone()));
        out.push(("sasl.username".into(), login.username.clone()));
        out.push(("sasl.password".into(), login.password.clone()));
    }
    if let Some((_, ca, cert, key)) = tls {
        let files = [
            ("ssl.ca.location", *ca),
            ("ssl.certificate.location", Some(*cert)),
            ("ssl.key.location", Some(*key)),
        ];
        for (k, path) in files {
            if let Some(path) = path {
                out.push((k.into(), path.display().to_string()));
            }
        }
    }
    out
}

/// The inter-broker TLS client config and the CA (none: the system's),
/// certificate and key files.
type InterBrokerTls<'a> = (
    Arc<rustls::ClientConfig>,
    Option<&'a std::path::PathBuf>,
    &'a std::path::PathBuf,
    &'a std::path::PathBuf,
);

/// The broker's own SASL user gets a SCRAM credential from its configured
/// password when it has none for the mechanism (for PLAIN: none at all), so
/// that a fresh deployment needs no step before its brokers can talk.
async fn add_inter_broker_user(credentials: &Credentials, login: &SaslLogin) -> anyhow::Result<()> {
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
    let salt = uuid::Uuid::new_v4().as_bytes().to_vec();
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
async fn add_scram_users(credentials: &Credentials, flags: &[String]) -> anyhow::Result<()> {
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
        let salt = uuid::Uuid::new_v4().as_bytes().to_vec();
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
async fn log_store_requests(counts: Arc<RequestCounts>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.changed() => return,
            _ = tick.tick() => {
                let at_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap_or_default()
                    .as_millis();
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
            if topic.config().compaction_policy() == POLICY_NONE {
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

/// Cluster mode: rereads the ACLs and quotas other brokers change.
async fn follow_access(access: Arc<Access>, mut stop: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(crate::cluster::ACCESS_POLL);
    loop {
        tokio::select! {
            _ = tick.tick() => {
                if let Err(e) = access.refresh().await {
                    tracing::warn!(error = %e, "rereading ACLs and quotas failed");
                }
            }
            _ = stop.changed() => return,
        }
    }
}
