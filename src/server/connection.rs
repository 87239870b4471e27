//! One client connection: a reader that decodes and dispatches requests in
//! arrival order, and a writer that sends the replies in that same order.
//!
//! The reader runs each request's ordered part (appends) before reading the
//! next, and hands the reply future to the writer through a bounded channel;
//! the bound limits how many requests one client can have in flight, like
//! Kafka's muting of a busy channel.

use std::sync::Arc;
use std::time::Instant;

use kafka_protocol::error::ResponseError;
use tokio::io::{AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;

use super::frame::FrameReader;
use crate::api::metrics::RequestMetrics;
use crate::api::{Broker, FrameError, Reply};
use crate::principal::Principal;

const MAX_IN_FLIGHT: usize = 64;

/// Counts the connection as open while it lives.
struct Open(Option<Arc<RequestMetrics>>);

impl Open {
    fn new(metrics: Option<Arc<RequestMetrics>>) -> Open {
        if let Some(m) = &metrics {
            m.connections.inc();
            m.connections_accepted.inc();
        }
        Open(metrics)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        if let Some(m) = &self.0 {
            m.connections.dec();
        }
    }
}

/// The API key and version a request frame starts with.
fn api_of(frame: &[u8]) -> Option<(i16, i16)> {
    let head = frame.get(..4)?;
    Some((
        i16::from_be_bytes([head[0], head[1]]),
        i16::from_be_bytes([head[2], head[3]]),
    ))
}

/// `idle`: connections.max.idle.ms; a connection that sends no complete
/// request for that long is closed.
pub async fn serve(
    stream: TcpStream,
    broker: Arc<Broker>,
    max_frame: usize,
    idle: Option<std::time::Duration>,
) {
    let open = Open::new(broker.metrics.clone());
    let peer = stream.peer_addr().ok();
    let client_host = peer.map(|p| p.ip().to_string()).unwrap_or_default();
    let principal = Principal::anonymous();
    let _ = stream.set_nodelay(true);
    let (read_half, write_half) = stream.into_split();
    // Each reply goes with its API key and arrival time when latencies are kept.
    let (tx, mut rx) = mpsc::channel::<(Reply, Option<(i16, Instant)>)>(MAX_IN_FLIGHT);

    let metrics = broker.metrics.clone();
    let writer = tokio::spawn(async move {
        let mut out = BufWriter::with_capacity(64 * 1024, write_half);
        while let Some((reply, arrived)) = rx.recv().await {
            let Some(frame) = reply.await else {
                break;
            };
            if let (Some(m), Some((key, at))) = (&metrics, arrived) {
                m.latency(key, at.elapsed());
            }
            if !frame.is_empty() && out.write_all(&frame).await.is_err() {
                break;
            }
            if rx.is_empty() && out.flush().await.is_err() {
                break;
            }
        }
        let _ = out.shutdown().await;
    });

    let mut frames = FrameReader::new(read_half, max_frame);
    loop {
        let next = match idle {
            Some(idle) => match tokio::time::timeout(idle, frames.next()).await {
                Ok(next) => next,
                Err(_) => {
                    tracing::info!(?peer, "closing idle connection (connections.max.idle.ms)");
                    break;
                }
            },
            None => frames.next().await,
        };
        let frame = match next {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                tracing::info!(?peer, error = %e, "closing connection");
                break;
            }
        };
        let api = api_of(&frame);
        let arrived = match (&open.0, api) {
            (Some(m), Some((key, version))) if m.request(key, version) => {
                Some((key, Instant::now()))
            }
            _ => None,
        };
        match broker.handle_frame(frame, &client_host, &principal) {
            Ok(reply) => {
                if tx.send((reply, arrived)).await.is_err() {
                    break;
                }
            }
            Err(e) => {
                if let (Some(m), Some((key, version))) = (&open.0, api) {
                    let code = match e {
                        FrameError::UnsupportedVersion(..) => ResponseError::UnsupportedVersion,
                        _ => ResponseError::InvalidRequest,
                    };
                    m.error(key, version, code.code());
                }
                tracing::info!(?peer, error = %e, "closing connection");
                break;
            }
        }
    }
    // Replies already dispatched are still delivered before the socket closes.
    drop(tx);
    let _ = writer.await;
}
