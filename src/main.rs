use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use strata::clock::Clock;
use strata::compaction::{levels, worker};
use strata::manifest::store::open_configured;
use strata::server::config::{BrokerConfig, StoreArgs};
use worker::WorkerOptions;

/// Strata: a Kafka-wire-compatible broker whose log settles into object storage in levels.
#[derive(Parser)]
#[command(name = "strata", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Serve(Box<BrokerConfig>),
    /// Run a standalone compaction worker: it takes jobs from the brokers'
    /// `__strata_compaction` topic as a consumer group member and merges
    /// segments in the object store directly.
    Compact(CompactArgs),
    /// Show a topic's tiered segments by compaction level, from the store.
    Levels(LevelsArgs),
    /// Show a cluster as etcd describes it: brokers, controller, and each
    /// partition's leader and leader epoch.
    Cluster(ClusterArgs),
}

#[derive(Args)]
struct ClusterArgs {
    /// The cluster: `etcd://host:2379[,host:2379...]/prefix`.
    #[arg(long, env = "STRATA_CLUSTER")]
    cluster: String,
}

#[derive(Args)]
struct CompactArgs {
    /// A broker to take jobs from (host:port).
    #[arg(long, env = "STRATA_BOOTSTRAP")]
    bootstrap: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Data directory whose default store to use when --store is not given.
    #[arg(long, env = "STRATA_DATA_DIR", default_value = "./strata-data")]
    data_dir: PathBuf,
    /// Where merges write their output before uploading it (default: a
    /// directory under the system's temporary directory).
    #[arg(long, env = "STRATA_SCRATCH_DIR")]
    scratch_dir: Option<PathBuf>,
    /// Recorded as the writer of the manifests this worker writes.
    #[arg(long, env = "STRATA_NODE_ID", default_value_t = 1000)]
    node_id: i32,
    /// A librdkafka property of the worker's consumer, `KEY=VALUE`,
    /// repeatable: how to reach a secured listener, e.g.
    /// `security.protocol=sasl_ssl`, `sasl.mechanisms=SCRAM-SHA-512`,
    /// `sasl.username=...`, `ssl.ca.location=...`.
    #[arg(long, env = "STRATA_CONSUMER_PROPERTIES", value_delimiter = ';', value_parser = parse_property)]
    consumer_property: Vec<(String, String)>,
    #[arg(long, env = "STRATA_LOG_LEVEL", default_value = "info")]
    log_level: String,
}

#[derive(Args)]
struct LevelsArgs {
    topic: String,
    #[command(flatten)]
    store: StoreArgs,
    /// Data directory whose default store to use when --store is not given.
    #[arg(long, env = "STRATA_DATA_DIR", default_value = "./strata-data")]
    data_dir: PathBuf,
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    match cli.command {
        Command::Serve(config) => {
            init_logging(&config.log_level);
            runtime.block_on(async {
                let server = strata::server::Server::start(*config).await?;
                tokio::select! {
                    r = server.wait() => r,
                    _ = shutdown_signal() => {
                        tracing::info!("shutting down");
                        server.shutdown().await
                    }
                }
            })
        }
        Command::Compact(args) => {
            init_logging(&args.log_level);
            let store = open_configured(
                &args.store.settings(),
                &args.data_dir,
                strata::clock::os_random(),
            )?;
            let scratch = args.scratch_dir.unwrap_or_else(|| {
                std::env::temp_dir().join(format!("strata-compact-{}", std::process::id()))
            });
            let mut opts = WorkerOptions::new(args.bootstrap, args.node_id, scratch);
            opts.client_properties = args.consumer_property;
            runtime.block_on(async {
                let (stop, stop_rx) = tokio::sync::watch::channel(false);
                let worker = tokio::spawn(worker::run(store, opts, None, stop_rx));
                shutdown_signal().await;
                tracing::info!("shutting down");
                stop.send_replace(true);
                worker.await??;
                Ok(())
            })
        }
        Command::Cluster(args) => {
            let url: strata::cluster::ClusterUrl = args.cluster.parse()?;
            let report = runtime.block_on(async {
                let etcd = strata::cluster::Etcd::connect(&url, Duration::from_secs(5)).await?;
                let view = strata::cluster::ClusterView::start(etcd, -1);
                let state = tokio::time::timeout(
                    Duration::from_secs(10),
                    view.wait_for(|s| s.revision > 0),
                )
                .await?;
                anyhow::Ok(state.report())
            })?;
            print!("{report}");
            Ok(())
        }
        Command::Levels(args) => {
            let store = open_configured(
                &args.store.settings(),
                &args.data_dir,
                strata::clock::os_random(),
            )?;
            let now_ms = strata::clock::SystemClock.now_ms();
            let report = runtime.block_on(levels::report(&store, &args.topic, now_ms))?;
            print!("{report}");
            Ok(())
        }
    }
}

fn init_logging(level: &str) {
    let filter = EnvFilter::try_new(level).unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
