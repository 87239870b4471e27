//! The phases of a broker's start, in the order they run. Each builds what
//! the next needs, so the order things must be built in is written here and
//! nowhere else:
//!
//! 1. `open_store`: the object store.
//! 2. `serve_health`: `/healthz` answers while the rest starts, the store
//!    included (it may be slow or down).
//! 3. `restore`: a wiped data directory is refilled from the store before
//!    anything reads the directory.
//! 4. `bind_listeners`: the sockets, before joining a cluster, because a
//!    port given as 0 becomes the one registered in etcd.
//! 5. `join_cluster`: etcd membership and the write-ahead log (cluster mode).
//! 6. `open_state`: credentials, the catalog, the coordinators over it, the
//!    tier and the compaction scheduler, ACLs and quotas.
//! 7. `build_api`: the `Broker` the handlers share.
//! 8. `spawn_jobs` and `accept`: every background job and the accept loops.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use object_store::ObjectStore;
use tokio::net::TcpListener;
use tokio::sync::watch;

use super::cluster::{self, Joined};
use super::config::{BrokerConfig, FsyncPolicy, ListenerSpec, SaslLogin, SecurityProtocol};
use super::dynamic::{self, TlsSwitch};
use super::jobs::Jobs;
use super::{connection, data_dir, http, limits};
use crate::access::Access;
use crate::api::metrics::RequestMetrics;
use crate::api::{ApiSettings, Broker, InterBroker, Listeners, Services};
use crate::auth::{self, credentials::Credentials, tokens::Tokens};
use crate::catalog::{Catalog, CatalogSettings, HeadSinks};
use crate::clock::{SharedClock, SharedRandom};
use crate::cluster::Endpoint;
use crate::compaction::scheduler::{Scheduler, SchedulerSettings};
use crate::compaction::worker::{MergeTotals, WorkerOptions};
use crate::coordinator::share_store::{ShareCoordinator, ShareStateStore, SHARE_STATE_TOPIC};
use crate::coordinator::store::{OffsetsStore, OFFSETS_TOPIC};
use crate::coordinator::txn::store::{TxnStore, TXN_TOPIC};
use crate::coordinator::txn::TxnCoordinator;
use crate::coordinator::GroupCoordinator;
use crate::log::Visibility;
use crate::manifest::counted::{Counted, RequestCounts};
use crate::manifest::store::{default_url, open_configured};
use crate::tier::{self, Remotes, Tier, TierSettings};

/// A compaction job not done after this long is queued again.
const REQUEUE_AFTER: Duration = Duration::from_secs(300);

/// The store the flags name (or the one given), counting its requests.
pub(super) fn open_store(
    config: &BrokerConfig,
    store: Option<Arc<dyn ObjectStore>>,
    random: &SharedRandom,
) -> anyhow::Result<(Arc<dyn ObjectStore>, Arc<RequestCounts>)> {
    let store = match store {
        Some(s) => s,
        None => {
            let settings = config.object_store.settings();
            open_configured(&settings, &config.data_dir, random.clone())?
        }
    };
    Ok(Counted::wrap(store))
}

/// Refills a wiped data directory from the store.
pub(super) async fn restore(
    config: &BrokerConfig,
    store: &Arc<dyn ObjectStore>,
) -> anyhow::Result<()> {
    let restored = tier::restore::restore(store, &config.data_dir).await?;
    if restored != Default::default() {
        tracing::info!(
            topics = restored.topics,
            partitions = restored.partitions,
            "restored from the object store"
        );
    }
    Ok(())
}

/// With `--metrics-listen`, the process shows alive (and not ready) while a
/// large data directory recovers.
pub(super) async fn serve_health(
    config: &BrokerConfig,
    store: &Arc<dyn ObjectStore>,
    jobs: &mut Jobs,
) -> anyhow::Result<Option<Arc<http::Health>>> {
    let Some(addr) = config.metrics_listen else {
        return Ok(None);
    };
    let health = http::Health::new(store.clone());
    let serving = http::serve(addr, health.clone(), jobs.stop()).await?;
    jobs.spawn("metrics listener", serving);
    Ok(Some(health))
}

/// The listeners, bound but not accepting yet.
pub(super) struct Bound {
    sockets: Vec<(TcpListener, ListenerSpec, SocketAddr, Option<TlsSwitch>)>,
    /// max.connections and the like, changed by dynamic broker configs.
    limits: Arc<limits::ConnectionLimits>,
    /// Applies dynamic broker configs to the limits and the TLS listeners.
    runtime: Arc<dynamic::Runtime>,
    /// Every listener's advertised endpoint, in the order configured.
    pub endpoints: Vec<Endpoint>,
    inter: InterBrokerSide,
}

/// How the broker's own clients reach it.
struct InterBrokerSide {
    spec: ListenerSpec,
    login: Option<SaslLogin>,
    tls: Option<Arc<rustls::ClientConfig>>,
    /// Its position among the listeners.
    index: usize,
}

pub(super) async fn bind_listeners(config: &BrokerConfig) -> anyhow::Result<Bound> {
    let specs = config.listeners().map_err(anyhow::Error::msg)?;
    let (inter_spec, inter_login) = config.inter_broker().map_err(anyhow::Error::msg)?;
    for m in &config.sasl_enabled_mechanisms {
        if !auth::sasl::MECHANISMS.contains(&m.as_str()) {
            anyhow::bail!(
                "SASL mechanism {m} is not supported (supported: {:?})",
                auth::sasl::MECHANISMS
            );
        }
    }
    // Client certificates only on SSL listeners: a SASL_SSL client
    // proves itself with SASL (Kafka's KIP-684).
    let acceptor = |protocol: SecurityProtocol| -> anyhow::Result<_> {
        let (Some(cert), Some(key)) = (&config.ssl_cert_file, &config.ssl_key_file) else {
            anyhow::bail!("SSL and SASL_SSL listeners need --ssl-cert-file and --ssl-key-file");
        };
        let client_auth = match protocol {
            SecurityProtocol::Ssl => config.ssl_client_auth.into(),
            _ => auth::tls::ClientAuth::None,
        };
        let tls = auth::tls::server_config(cert, key, config.ssl_ca_file.as_deref(), client_auth)?;
        Ok(tokio_rustls::TlsAcceptor::from(tls))
    };
    let mut sockets = Vec::new();
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
            true => Some(Arc::new(parking_lot::RwLock::new(acceptor(spec.protocol)?))),
            false => None,
        };
        sockets.push((listener, spec.clone(), addr, tls));
    }
    let limits = limits::ConnectionLimits::from_config(config);
    let switches = sockets
        .iter()
        .filter_map(|(_, spec, _, tls)| Some((spec.name.clone(), spec.protocol, tls.clone()?)))
        .collect();
    let runtime = Arc::new(dynamic::Runtime::new(config, limits.clone(), switches)?);
    let index = specs
        .iter()
        .position(|s| s.name == inter_spec.name)
        .expect("inter_broker() picked a configured listener");
    // The acceptor above already required the certificate and key of a TLS listener.
    let tls = match (&config.ssl_cert_file, &config.ssl_key_file) {
        (Some(cert), Some(key)) if inter_spec.protocol.tls() => Some(auth::tls::client_config(
            config.ssl_ca_file.as_deref(),
            cert,
            key,
        )?),
        _ => None,
    };
    Ok(Bound {
        sockets,
        limits,
        runtime,
        endpoints,
        inter: InterBrokerSide {
            spec: inter_spec,
            login: inter_login,
            tls,
            index,
        },
    })
}

pub(super) async fn join_cluster(
    config: &BrokerConfig,
    store: &Arc<dyn ObjectStore>,
    listeners: &Bound,
    data_dir: &data_dir::DataDir,
) -> anyhow::Result<Option<Joined>> {
    let Some(url) = &config.cluster else {
        return Ok(None);
    };
    let first = &listeners.endpoints[0];
    let me = cluster::Incarnation {
        host: &first.host,
        port: first.port as i32,
        listeners: listeners.endpoints.clone(),
        directory_id: &data_dir.id,
    };
    Ok(Some(cluster::join(config, url, store, me).await?))
}

/// What the broker keeps and serves from.
pub(super) struct State {
    pub clock: SharedClock,
    pub random: SharedRandom,
    pub catalog: Arc<Catalog>,
    pub coordinator: Arc<GroupCoordinator>,
    pub txn: Arc<TxnCoordinator>,
    pub share: Arc<ShareCoordinator>,
    pub scheduler: Arc<Scheduler>,
    pub tier: Arc<Tier>,
    pub access: Arc<Access>,
    pub credentials: Arc<Credentials>,
    pub tokens: Arc<Tokens>,
}

pub(super) async fn open_state(
    config: &BrokerConfig,
    store: Arc<dyn ObjectStore>,
    joined: Option<&Joined>,
    listeners: &Bound,
    clock: SharedClock,
    random: SharedRandom,
) -> anyhow::Result<State> {
    let credentials = Arc::new(match joined {
        Some(j) => Credentials::open_etcd(j.node.member().etcd().clone()),
        None => Credentials::open_store(store.clone()).await?,
    });
    // Delegation tokens are kept where the SCRAM credentials are.
    let tokens = Arc::new(match joined {
        Some(j) => Tokens::open_etcd(
            j.node.member().etcd().clone(),
            config.delegation_tokens(),
            clock.clone(),
            random.clone(),
        ),
        None => {
            Tokens::open_store(
                store.clone(),
                config.delegation_tokens(),
                clock.clone(),
                random.clone(),
            )
            .await?
        }
    });
    super::add_scram_users(&credentials, &config.add_scram, random.as_ref()).await?;
    if let Some(login) = &listeners.inter.login {
        super::add_inter_broker_user(&credentials, login, random.as_ref()).await?;
    }
    // Consumers see only what is durable wherever durability is promised.
    let durable = (config.fsync == FsyncPolicy::Always && !config.null_sink) || joined.is_some();
    let backpressure = Arc::new(AtomicBool::new(false));
    // Cluster mode: uploads, retention, orphan scans, merges and the
    // coordinators only for what this broker serves.
    let node = joined.map(|j| j.node.clone());
    let serves: Option<tier::Scope> = node.clone().map(|node| {
        let s: tier::Scope = Arc::new(move |t, p| node.serving(t, p).is_some());
        s
    });
    let tier_settings = TierSettings {
        node_id: config.node_id,
        cache_bytes: config.cache_bytes,
        max_pending_upload_bytes: config.max_pending_upload_bytes,
        backpressure: backpressure.clone(),
        interval: Duration::from_millis(config.tier_interval_ms),
        orphan_min_age: Duration::from_millis(config.orphan_min_age_ms),
        orphan_scan_interval: Duration::from_millis(config.orphan_scan_interval_ms),
        scope: serves.clone(),
        max_head_age: joined.map(|_| Duration::from_millis(config.wal_max_age_ms)),
    };
    // Every partition the catalog opens continues in the store.
    let remotes = Remotes::new(store.clone(), &tier_settings, &clock);
    let catalog_settings = CatalogSettings {
        visibility: if durable {
            Visibility::Durable
        } else {
            Visibility::Appended
        },
        // Cluster mode: appends are durable once in the write-ahead log.
        head_sinks: joined.map(|j| {
            let wal = j.wal.clone();
            let sinks: HeadSinks =
                Arc::new(move |topic, index| Arc::new(wal.partition(topic, index)));
            sinks
        }),
        remote_parts: Some(remotes.parts()),
        backpressure: Some(backpressure),
    };
    let data_dir = config.data_dir.clone();
    let catalog = {
        let (clock, random) = (clock.clone(), random.clone());
        tokio::task::spawn_blocking(move || {
            Catalog::open_with(&data_dir, catalog_settings, clock, random)
        })
        .await??
    };
    let catalog = Arc::new(catalog);
    let coordinator_config = config.coordinator();
    let txn_config = config.transactions();
    if let Some(j) = joined {
        let internal = [
            OffsetsStore::topic_spec(&coordinator_config),
            TxnStore::topic_spec(txn_config.segment_bytes),
            Scheduler::topic_spec(),
            ShareStateStore::topic_spec(coordinator_config.offsets_topic_segment_bytes),
        ];
        cluster::adopt_topics(&j.node, &catalog, &internal).await?;
    }
    let scheduler_settings = SchedulerSettings {
        delete_delay_ms: config.compaction_delete_delay_ms,
        max_run_ms: config.orphan_min_age_ms / 2,
        requeue_after: REQUEUE_AFTER,
        scope: serves,
    };
    let (offsets, txn_store, scheduler, share_store) = {
        let (coordinator_config, txn_config) = (coordinator_config.clone(), txn_config.clone());
        let (clock, catalog) = (clock.clone(), catalog.clone());
        tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
            // Before the tier opens, so that it loads the manifests of a
            // first start's new offsets, transaction and jobs topics with the rest.
            let offsets = OffsetsStore::open(&catalog, &coordinator_config, clock.clone())?;
            let txn_store = TxnStore::open(
                &catalog,
                txn_config.segment_bytes,
                txn_config.wait_for_fsync,
                clock.clone(),
            )?;
            let share_store = ShareStateStore::open(
                &catalog,
                coordinator_config.offsets_topic_segment_bytes,
                coordinator_config.wait_for_fsync,
                clock.clone(),
            )?;
            let scheduler = Scheduler::open(catalog.clone(), scheduler_settings, clock)?;
            Ok((offsets, txn_store, Arc::new(scheduler), share_store))
        })
        .await??
    };
    // ACLs and quotas live where the topic catalog does: etcd or the store.
    let access_backend: Box<dyn crate::access::Backend> = match joined {
        Some(j) => Box::new(crate::cluster::EtcdAccess::new(
            j.node.member().etcd().clone(),
        )),
        None => Box::new(crate::access::StoreBackend::new(store.clone())),
    };
    let access = Arc::new(Access::open(config.access(), access_backend).await?);
    let tier = Tier::open(remotes, catalog.clone(), tier_settings, clock.clone()).await?;
    // Whether this broker serves partition 0 of an internal topic now.
    let leads = |topic: &str| {
        let id = catalog.topic(topic)?.id();
        let node = node.clone()?;
        Some(move || node.serving(id, 0))
    };
    // After the tier: the replay reads tiered offsets through it.
    let coordinator = GroupCoordinator::open(
        catalog.clone(),
        offsets,
        coordinator_config,
        clock.clone(),
        random.clone(),
        leads(OFFSETS_TOPIC).map(|l| {
            let a: crate::coordinator::Active = Arc::new(move || l().is_some());
            a
        }),
    )
    .await?;
    let txn = TxnCoordinator::open(
        txn_store,
        txn_config,
        clock.clone(),
        Broker::producer_ids(catalog.clone(), node.clone()),
        leads(TXN_TOPIC).map(|l| {
            let l: crate::coordinator::txn::Leadership = Arc::new(l);
            l
        }),
    )
    .await?;
    let share = Arc::new(
        ShareCoordinator::open(
            share_store,
            clock.clone(),
            leads(SHARE_STATE_TOPIC).map(|l| {
                let a: crate::coordinator::Active = Arc::new(move || l().is_some());
                a
            }),
        )
        .await?,
    );
    Ok(State {
        share,
        clock,
        random,
        catalog,
        coordinator: Arc::new(coordinator),
        txn: Arc::new(txn),
        scheduler,
        tier,
        access,
        credentials,
        tokens,
    })
}

pub(super) fn build_api(
    config: &BrokerConfig,
    state: &State,
    listeners: &Bound,
    joined: Option<&Joined>,
) -> Arc<Broker> {
    let settings = ApiSettings {
        node_id: config.node_id,
        num_partitions: config.num_partitions,
        auto_create_topics: config.auto_create_topics,
        fsync_acks: config.fsync == FsyncPolicy::Always,
        null_sink: config.null_sink,
        data_dir: config.data_dir.clone(),
        store_url: config
            .object_store
            .store
            .clone()
            .unwrap_or_else(|| default_url(&config.data_dir)),
        static_configs: config.static_configs(),
    };
    let services = Services {
        catalog: state.catalog.clone(),
        coordinator: state.coordinator.clone(),
        txn: state.txn.clone(),
        share: state.share.clone(),
        clock: state.clock.clone(),
        cluster: joined.map(|j| j.node.clone()),
        access: state.access.clone(),
        // Kept only where they are served.
        metrics: config
            .metrics_listen
            .map(|_| Arc::new(RequestMetrics::new())),
        reconfigure: listeners.runtime.clone(),
    };
    let inter = &listeners.inter;
    Arc::new(Broker::new(
        settings,
        services,
        Listeners {
            endpoints: listeners.endpoints.clone(),
            credentials: state.credentials.clone(),
            tokens: state.tokens.clone(),
            inter_broker: Arc::new(InterBroker::new(
                inter.spec.name.clone(),
                inter.tls.clone(),
                inter.login.clone(),
            )),
        },
    ))
}

/// Starts every background job; returns the compaction worker's totals.
#[allow(clippy::too_many_arguments)]
pub(super) fn spawn_jobs(
    config: &BrokerConfig,
    state: &State,
    broker: &Arc<Broker>,
    joined: Option<&Joined>,
    listeners: &Bound,
    fatal: &watch::Sender<Option<String>>,
    store_requests: &Arc<RequestCounts>,
    jobs: &mut Jobs,
) -> Arc<MergeTotals> {
    let stop = jobs.stop();
    if let Some(j) = joined {
        jobs.spawn("write-ahead log", j.wal.clone().run(stop.clone()));
        let leadership = cluster::Leadership {
            node: j.node.clone(),
            catalog: state.catalog.clone(),
            tier: state.tier.clone(),
            wal: j.wal.clone(),
            coordinator: state.coordinator.clone(),
            txn: state.txn.clone(),
            share: state.share.clone(),
            fatal: fatal.clone(),
        };
        jobs.spawn("leadership", leadership.run(stop.clone()));
        jobs.spawn(
            "write-ahead log collection",
            cluster::collect_wal(
                state.tier.clone(),
                j.node.clone(),
                j.wal.clone(),
                stop.clone(),
            ),
        );
        let access = state.access.clone();
        let refresh_access = move || {
            let access = access.clone();
            async move { access.refresh().await }
        };
        jobs.spawn(
            "ACL and quota refresh",
            super::follow("ACLs and quotas", refresh_access, stop.clone()),
        );
        let refreshed = broker.clone();
        let refresh_configs = move || {
            let broker = refreshed.clone();
            async move { broker.refresh_dynamic_configs().await }
        };
        jobs.spawn(
            "dynamic broker config refresh",
            super::follow("dynamic broker configs", refresh_configs, stop.clone()),
        );
    }
    jobs.spawn("tier", state.tier.clone().run(stop.clone()));
    jobs.spawn(
        "store request log",
        super::log_store_requests(store_requests.clone(), state.clock.clone(), stop.clone()),
    );
    jobs.spawn(
        "compaction scheduling",
        super::schedule_compactions(
            state.tier.clone(),
            state.catalog.clone(),
            state.scheduler.clone(),
            stop.clone(),
        ),
    );
    let merges = Arc::new(MergeTotals::default());
    if config.compaction_worker {
        let inter = &listeners.inter;
        // Its own listener's bound address; through TLS the advertised
        // host, the name the certificate is for.
        let addr = listeners.sockets[inter.index].2;
        let bootstrap = if inter.tls.is_some() {
            let e = &listeners.endpoints[inter.index];
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
        opts.client_properties = worker_security(config, inter);
        opts.totals = merges.clone();
        opts.clock = state.clock.clone();
        opts.random = state.random.clone();
        jobs.spawn(
            "compaction worker",
            super::run_compaction_worker(
                state.tier.clone(),
                state.scheduler.clone(),
                opts,
                stop.clone(),
            ),
        );
    }
    if let Some(markers) = state.txn.marker_jobs() {
        jobs.spawn(
            "transaction markers",
            crate::api::run_markers(
                broker.clone(),
                markers,
                Duration::from_millis(config.txn_marker_delay_ms),
                stop.clone(),
            ),
        );
    }
    let txn_every = config
        .transaction_abort_timed_out_transaction_cleanup_interval_ms
        .max(1);
    jobs.spawn(
        "transaction timers",
        super::run_txn_timers(
            state.txn.clone(),
            Duration::from_millis(txn_every),
            stop.clone(),
        ),
    );
    if state.tokens.enabled() {
        jobs.spawn(
            "delegation token expiry",
            super::remove_expired_tokens(
                state.tokens.clone(),
                Duration::from_millis(config.delegation_token_expiry_check_interval_ms.max(1)),
                stop.clone(),
            ),
        );
    }
    jobs.spawn(
        "share timers",
        crate::api::run_share_timers(broker.clone(), stop.clone()),
    );
    let retention_check = Duration::from_millis(config.offsets_retention_check_interval_ms.max(1));
    jobs.spawn(
        "group timers",
        super::run_coordinator_timers(
            state.coordinator.clone(),
            state.clock.clone(),
            retention_check,
            stop.clone(),
        ),
    );
    if config.fsync == FsyncPolicy::Interval {
        jobs.spawn(
            "interval fsync",
            super::flush_periodically(broker.clone(), config.fsync_interval(), stop),
        );
    }
    merges
}

/// Starts accepting on every listener; returns the first one's address and
/// every listener's name and address.
pub(super) fn accept(
    listeners: Bound,
    broker: &Arc<Broker>,
    config: &BrokerConfig,
    jobs: &mut Jobs,
) -> (SocketAddr, Vec<(String, SocketAddr)>) {
    let sasl = Arc::new(connection::SaslSettings {
        mechanisms: config.sasl_enabled_mechanisms.clone(),
        secrets: crate::auth::sasl::Secrets {
            credentials: broker.credentials.clone(),
            tokens: broker.tokens.clone(),
        },
        max_reauth: (config.connections_max_reauth_ms > 0)
            .then(|| Duration::from_millis(config.connections_max_reauth_ms)),
        failed_delay: Duration::from_millis(config.connection_failed_authentication_delay_ms),
    });
    let limits = listeners.limits;
    let mut addrs = Vec::new();
    for ((listener, spec, addr, tls), endpoint) in
        listeners.sockets.into_iter().zip(&listeners.endpoints)
    {
        let shared = Arc::new(connection::Listener {
            name: spec.name.clone(),
            protocol: spec.protocol,
            tls,
            sasl: sasl.clone(),
            idle: limits.idle(),
        });
        jobs.spawn(
            "accept loop",
            super::accept_loop(
                listener,
                broker.clone(),
                config.max_request_bytes,
                limits.clone(),
                shared,
                jobs.stop(),
            ),
        );
        tracing::info!(listener = spec.name, protocol = spec.protocol.name(), %addr, advertised = %format!("{}:{}", endpoint.host, endpoint.port), "listening");
        addrs.push((spec.name, addr));
    }
    (addrs[0].1, addrs)
}

/// librdkafka's settings for the inter-broker listener (`ssl.*` as the
/// listener's own files: the CA it trusts, the broker's certificate).
fn worker_security(config: &BrokerConfig, inter: &InterBrokerSide) -> Vec<(String, String)> {
    let mut out = vec![(
        "security.protocol".to_string(),
        inter.spec.protocol.name().to_ascii_lowercase(),
    )];
    if let Some(login) = &inter.login {
        out.push(("sasl.mechanisms".into(), login.mechanism.clone()));
        out.push(("sasl.username".into(), login.username.clone()));
        out.push(("sasl.password".into(), login.password.clone()));
    }
    if inter.tls.is_some() {
        let files = [
            ("ssl.ca.location", config.ssl_ca_file.as_ref()),
            ("ssl.certificate.location", config.ssl_cert_file.as_ref()),
            ("ssl.key.location", config.ssl_key_file.as_ref()),
        ];
        for (k, path) in files {
            if let Some(path) = path {
                out.push((k.into(), path.display().to_string()));
            }
        }
    }
    out
}

/// Turns `/readyz` to serving and `/metrics` on, for this run's broker and jobs.
pub(super) fn report_serving(
    health: &http::Health,
    broker: &Arc<Broker>,
    state: &State,
    store: &Arc<RequestCounts>,
    merges: Arc<MergeTotals>,
    joined: Option<&Joined>,
) {
    let Some(requests) = &broker.metrics else {
        return;
    };
    let scraped = super::metrics::Scraped {
        broker: broker.clone(),
        tier: state.tier.clone(),
        scheduler: state.scheduler.clone(),
        store: store.clone(),
        merges,
        wal: joined.map(|j| j.wal.clone()),
    };
    let lease = joined.map(|j| j.node.member().subscribe());
    health.serving(super::metrics::registry(requests, scraped), lease);
}
