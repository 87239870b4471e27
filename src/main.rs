use clap::{Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use strata::config::BrokerConfig;

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
    Serve(BrokerConfig),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(config) => {
            let filter =
                EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
            tracing_subscriber::fmt()
                .with_env_filter(filter)
                .with_writer(std::io::stderr)
                .init();
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .build()?;
            runtime.block_on(async {
                let server = strata::server::Server::start(config).await?;
                tokio::select! {
                    r = server.wait() => r,
                    _ = shutdown_signal() => {
                        tracing::info!("shutting down");
                        server.shutdown().await
                    }
                }
            })
        }
    }
}

async fn shutdown_signal() {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}
