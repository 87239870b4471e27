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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
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

pub struct Health {
    store: Arc<dyn ObjectStore>,
    /// Listening, catalog loaded, jobs started; false again at shutdown.
    serving: AtomicBool,
    registry: OnceLock<Registry>,
    /// The last probe's answer and when (on the runtime's clock) it came.
    probe: Mutex<Option<(Instant, Result<(), String>)>>,
    /// The cluster membership's lease, in cluster mode.
    lease: OnceLock<watch::Receiver<LeaseState>>,
}

impl Health {
    pub fn new(store: Arc<dyn ObjectStore>) -> Arc<Health> {
        Arc::new(Health {
            store,
            serving: AtomicBool::new(false),
            registry: OnceLock::new(),
            probe: Mutex::new(None),
            lease: OnceLock::new(),
        })
    }

    /// In cluster mode: ready only while `lease` is live.
    pub fn member(&self, lease: watch::Receiver<LeaseState>) {
        let _ = self.lease.set(lease);
    }

    /// The broker is up: metrics are served from `registry` from now on.
    pub fn serving(&self, registry: Registry) {
        let _ = self.registry.set(registry);
        self.serving.store(true, Ordering::Release);
    }

    pub fn stopping(&self) {
        self.serving.store(false, Ordering::Release);
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

/// Binds `addr` and serves until `stop` turns true (or its sender is gone).
pub async fn serve(
    addr: SocketAddr,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> std::io::Result<SocketAddr> {
    let app = Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .with_state(health);
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    tokio::spawn(async move {
        let stopped = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(stopped)
            .await
        {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    });
    tracing::info!(%local, "metrics and health checks listening");
    Ok(local)
}

async fn metrics(State(health): State<Arc<Health>>) -> impl IntoResponse {
    let Some(registry) = health.registry.get() else {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            [(header::CONTENT_TYPE, "text/plain")],
            "starting\n".to_string(),
        );
    };
    let mut text = String::with_capacity(64 * 1024);
    match prometheus_text::encode(&mut text, registry) {
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
    if !health.serving.load(Ordering::Acquire) {
        return (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the broker is starting or stopping\n".into(),
        );
    }
    if let Some(lease) = health.lease.get() {
        if *lease.borrow() == LeaseState::Lost {
            return (
                StatusCode::SERVICE_UNAVAILABLE,
                "not ready: the cluster lease in etcd is lost\n".into(),
            );
        }
    }
    match health.store_reachable().await {
        Ok(()) => (StatusCode::OK, "ready\n".into()),
        Err(e) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: the object store is unreachable: {e}\n"),
        ),
    }
}
