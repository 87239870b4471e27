//! The operator's HTTP endpoint (`--metrics-listen`): `/metrics` in
//! Prometheus' text format, `/healthz` and `/readyz`.
//!
//! It starts before anything else so that an orchestrator sees the process
//! alive (`/healthz`) while a large data directory is still recovering, and
//! not ready (`/readyz`, 503) until the broker listens with its catalog
//! loaded and the object store answers. The store probe is a HEAD of a key
//! that does not exist (not found is an answer), cached for a second so a
//! load balancer polling many times a second costs the store one request.
//! In cluster mode the broker is also not ready while its etcd lease is
//! lost: it serves nothing then, and clients should go elsewhere.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use axum::Router;
use object_store::path::Path;
use object_store::ObjectStore;
use prometheus_client::encoding::prometheus_text;
use prometheus_client::registry::Registry;
use tokio::sync::{watch, Mutex};
use tokio::time::Instant;

use crate::cluster::LeaseState;

/// How long a store probe's answer is reused.
const PROBE_TTL: Duration = Duration::from_secs(1);
/// A store that has not answered by then counts as unreachable.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
const PROBE_KEY: &str = "strata-readyz-probe";

pub(super) struct Health {
    store: Arc<dyn ObjectStore>,
    stage: parking_lot::RwLock<Stage>,
    /// Background jobs that ended while the broker was serving.
    dead_jobs: parking_lot::Mutex<Vec<&'static str>>,
    /// The last probe's answer and when (on the runtime's clock) it came.
    probe: Mutex<Option<(Instant, Result<(), String>)>>,
}

/// Where the broker is in its life.
enum Stage {
    Starting,
    /// Listening, catalog loaded, jobs started.
    Serving {
        registry: Arc<Registry>,
        /// The cluster membership's lease, in cluster mode: ready only
        /// while it is live.
        lease: Option<watch::Receiver<LeaseState>>,
    },
    Stopping,
}

impl Health {
    pub(super) fn new(store: Arc<dyn ObjectStore>) -> Arc<Health> {
        Arc::new(Health {
            store,
            stage: parking_lot::RwLock::new(Stage::Starting),
            dead_jobs: parking_lot::Mutex::new(Vec::new()),
            probe: Mutex::new(None),
        })
    }

    /// The broker is up: metrics are served from `registry` from now on.
    pub(super) fn serving(&self, registry: Registry, lease: Option<watch::Receiver<LeaseState>>) {
        *self.stage.write() = Stage::Serving {
            registry: Arc::new(registry),
            lease,
        };
    }

    pub(super) fn stopping(&self) {
        *self.stage.write() = Stage::Stopping;
    }

    /// A background job ended while the broker served: it is not ready again.
    pub(super) fn job_died(&self, name: &'static str) {
        self.dead_jobs.lock().push(name);
    }

    fn registry(&self) -> Option<Arc<Registry>> {
        match &*self.stage.read() {
            Stage::Serving { registry, .. } => Some(registry.clone()),
            _ => None,
        }
    }

    /// Why the broker is not ready, as far as it knows without the store.
    pub(super) fn not_ready(&self) -> Option<String> {
        match &*self.stage.read() {
            Stage::Serving { lease, .. } => {
                if lease
                    .as_ref()
                    .is_some_and(|l| *l.borrow() == LeaseState::Lost)
                {
                    return Some("the cluster lease in etcd is lost".into());
                }
            }
            _ => return Some("the broker is starting or stopping".into()),
        }
        let dead = self.dead_jobs.lock();
        (!dead.is_empty()).then(|| format!("background jobs ended: {}", dead.join(", ")))
    }

    async fn store_reachable(&self) -> Result<(), String> {
        let mut last = self.probe.lock().await;
        if let Some((at, result)) = last.as_ref() {
            if at.elapsed() < PROBE_TTL {
                return result.clone();
            }
        }
        let result = match tokio::time::timeout(
            PROBE_TIMEOUT,
            self.store.head(&Path::from(PROBE_KEY)),
        )
        .await
        {
            Ok(Ok(_)) | Ok(Err(object_store::Error::NotFound { .. })) => Ok(()),
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer in {PROBE_TIMEOUT:?}")),
        };
        *last = Some((Instant::now(), result.clone()));
        result
    }
}

/// Binds `addr`; the future returned serves until `stop` turns true (or
/// its sender is gone).
pub(super) async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<impl std::future::Future<Output = ()> + Send + 'static> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tracing::info!(%local, "metrics and health checks listening");
    Ok(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    })
}

async fn metrics(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let Some(registry) = health.registry() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain")],
            "starting\n".to_string(),
        );
    };
    let mut text = String::with_capacity(64 * 1024);
    match prometheus_text::encode(&mut text, &registry) {
        Ok(()) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, prometheus_text::CONTENT_TYPE)],
            text,
        ),
        Err(_) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain")],
            "encoding the metrics failed\n".to_string(),
        ),
    }
}

async fn readyz(State(health): State<Arc<Health>>) -> (StatusCode, String) {
    if let Some(why) = health.not_ready() {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        );
    }
    match health.store_reachable().await {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: the object store is unreachable: {e}\n"),
        ),
    }
}
