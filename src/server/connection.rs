//! One client connection: a reader that decodes and dispatches requests in
//! arrival order, and a writer that sends the replies in that same order.
//!
//! The reader runs each request's ordered part (appends) before reading the
//! next, and hands the reply future to the writer through a bounded channel;
//! the bound limits how many requests one client can have in flight, like
//! Kafka's muting of a busy channel.
//!
//! Authentication happens here, before any request reaches the API layer.
//! On a SASL listener nothing but ApiVersions, SaslHandshake and
//! SaslAuthenticate is answered until the client has authenticated; any other
//! request closes the connection, as Kafka does. A failed authentication is
//! answered with SASL_AUTHENTICATION_FAILED after
//! `--connection-failed-authentication-delay-ms` and the connection closed.
//! With `--connections-max-reauth-ms` (KIP-368) the session ends at that age:
//! the client re-authenticates with a new SaslHandshake on the same
//! connection (as the same principal), and a request after the deadline
//! closes the connection instead. SaslHandshake v0 is followed by raw SASL
//! tokens, each a size-prefixed frame without a header, as in Kafka.

use std::net::SocketAddr;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::{
    ApiKey, RequestHeader, SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
    SaslHandshakeResponse,
};
use kafka_protocol::protocol::{Decodable, StrBytes};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::config::SecurityProtocol;
use super::frame::FrameReader;
use crate::api::metrics::RequestMetrics;
use crate::api::{Broker, Encoder, FrameError, Mute, Reply, Session};
use crate::auth::sasl::{Exchange, Secrets, Step};
use crate::principal::Principal;

const MAX_IN_FLIGHT: usize = 64;
/// Numbers the connections a broker accepts.
static NEXT_CONNECTION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
/// A TLS handshake not done by then is abandoned.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// What the socket under a TLS connection is read in.
const TLS_READ_BUFFER: usize = 64 * 1024;

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

/// What every connection accepted on one listener shares.
pub(super) struct Listener {
    pub name: String,
    pub protocol: SecurityProtocol,
    /// The TLS listener's acceptor, which a dynamic keystore change swaps.
    pub tls: Option<super::dynamic::TlsSwitch>,
    pub sasl: Arc<SaslSettings>,
    /// connections.max.idle.ms: a connection that sends no complete request
    /// for that long is closed.
    pub idle: Option<Duration>,
}

pub(super) struct SaslSettings {
    pub mechanisms: Vec<String>,
    /// SCRAM credentials and delegation tokens.
    pub secrets: Secrets,
    /// KIP-368 session lifetime.
    pub max_reauth: Option<Duration>,
    pub failed_delay: Duration,
}

pub(super) async fn accept(
    stream: TcpStream,
    broker: Arc<Broker>,
    max_frame: usize,
    listener: Arc<Listener>,
) {
    let peer = stream.peer_addr().ok();
    let _ = stream.set_nodelay(true);
    let fd = std::os::fd::AsRawFd::as_raw_fd(&stream);
    match &listener.tls {
        None => {
            let (r, w) = stream.into_split();
            serve(
                FrameReader::new(r, max_frame),
                w,
                peer,
                Principal::anonymous(),
                broker,
                listener,
            )
            .await
        }
        Some(switch) => {
            // The certificate in force now; a later change serves later handshakes.
            let acceptor = switch.read().clone();
            // rustls reads ciphertext 4 KiB at a time: from a buffer, not a
            // system call each.
            let stream = tokio::io::BufReader::with_capacity(TLS_READ_BUFFER, stream);
            let tls = match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream))
                .await
            {
                Ok(Ok(tls)) => tls,
                Ok(Err(e)) => {
                    tracing::info!(?peer, listener = listener.name, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::info!(?peer, listener = listener.name, "TLS handshake timed out");
                    return;
                }
            };
            // Kafka's default principal builder: the subject of a client
            // certificate names the principal on an SSL listener.
            let subject = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|cert| crate::auth::tls::subject_dn(cert));
            let principal = match subject {
                Some(dn) if listener.protocol == SecurityProtocol::Ssl => Principal::user(dn),
                _ => Principal::anonymous(),
            };
            let (r, w) = tokio::io::split(tls);
            let frames = FrameReader::over_socket(r, max_frame, fd);
            serve(frames, w, peer, principal, broker, listener).await
        }
    }
}

/// Where a SASL connection is in its authentication.
enum Auth {
    /// Authenticated, or nothing to authenticate.
    Open,
    /// Waiting for SaslHandshake.
    Handshake,
    /// A mechanism was chosen; `raw`: SaslHandshake v0, tokens without headers.
    Exchanging { exchange: Exchange, raw: bool },
}

async fn serve<R, W>(
    mut frames: FrameReader<R>,
    write_half: W,
    peer: Option<SocketAddr>,
    mut principal: Principal,
    broker: Arc<Broker>,
    listener: Arc<Listener>,
) where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let client_host = peer.map(|p| p.ip().to_string()).unwrap_or_default();
    let open = Open::new(broker.metrics.clone());
    let (tx, rx) = mpsc::channel::<Queued>(MAX_IN_FLIGHT);
    let writer = tokio::spawn(write_replies(rx, write_half, broker.metrics.clone()));

    let sasl = listener.protocol.sasl();
    let mut auth = if sasl { Auth::Handshake } else { Auth::Open };
    let mut authenticated: Option<Principal> = None;
    // Whether the session authenticated with a delegation token.
    let mut by_token = false;
    let mut expires: Option<Instant> = None;
    let mut lifetime: Option<Duration> = None;
    let mute = Arc::new(Mute::default());
    let connection = NEXT_CONNECTION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    loop {
        // A throttled client's next request waits out its throttle (KIP-219).
        let muted = mute.remaining(broker.clock.now_ms().max(0) as u64);
        if !muted.is_zero() {
            tokio::time::sleep(muted).await;
        }
        let next = match listener.idle {
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
        let mut sasl_cx = SaslCx {
            settings: &listener.sasl,
            auth: &mut auth,
            authenticated: &mut authenticated,
            by_token: &mut by_token,
            expires: &mut expires,
            lifetime: &mut lifetime,
            now_ms: broker.clock.now_ms(),
        };
        let reply = if sasl {
            match sasl_cx.intercept(frame.clone()).await {
                Intercept::Pass => None,
                Intercept::Reply(reply) => Some((reply, false)),
                Intercept::ReplyAndClose(reply, why) => {
                    tracing::info!(?peer, listener = listener.name, reason = %why, "closing connection");
                    Some((reply, true))
                }
                Intercept::Close(why) => {
                    tracing::info!(?peer, listener = listener.name, reason = %why, "closing connection");
                    break;
                }
            }
        } else {
            None
        };
        if let Some(p) = &authenticated {
            if *p != principal {
                principal = p.clone();
            }
        }
        let (reply, close) = match reply {
            Some(r) => r,
            None => {
                let session = Session {
                    principal: &principal,
                    client_host: &client_host,
                    listener: &listener.name,
                    delegation_tokens_allowed: delegation_tokens_allowed(
                        listener.protocol,
                        &principal,
                        by_token,
                    ),
                    connection,
                };
                match broker.handle_frame(frame, &session, &mute) {
                    Ok(reply) => (reply, false),
                    Err(e) => {
                        if let (Some(m), Some((key, version))) = (&open.0, api) {
                            let code = match e {
                                FrameError::UnsupportedVersion(..) => {
                                    ResponseError::UnsupportedVersion
                                }
                                _ => ResponseError::InvalidRequest,
                            };
                            m.error(key, version, code.code());
                        }
                        tracing::info!(?peer, error = %e, "closing connection");
                        break;
                    }
                }
            }
        };
        if tx.send((reply, arrived)).await.is_err() || close {
            break;
        }
    }
    // Replies already dispatched are still delivered before the socket closes.
    drop(tx);
    let _ = writer.await;
    crate::api::connection_closed(&broker, connection).await;
}

/// What the reader hands the writer: a reply, with its API key and arrival
/// time when latencies are kept.
type Queued = (Reply, Option<(i16, Instant)>);

/// Sends the replies in request order. Replies that are ready go out in one
/// write; one that is not yet (waiting for durability) must not hold back
/// those before it, so the buffer is flushed before waiting for it.
async fn write_replies<W: AsyncWrite + Unpin>(
    mut rx: mpsc::Receiver<Queued>,
    write_half: W,
    metrics: Option<Arc<RequestMetrics>>,
) {
    let mut out = BufWriter::with_capacity(64 * 1024, write_half);
    while let Some((mut reply, arrived)) = rx.recv().await {
        let frame = match futures::poll!(&mut reply) {
            Poll::Ready(frame) => frame,
            Poll::Pending => {
                if out.flush().await.is_err() {
                    break;
                }
                reply.await
            }
        };
        let Some(frame) = frame else {
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
}

enum Intercept {
    /// Not a SASL matter: the API layer answers.
    Pass,
    Reply(Reply),
    ReplyAndClose(Reply, String),
    Close(String),
}

struct SaslCx<'a> {
    settings: &'a SaslSettings,
    auth: &'a mut Auth,
    authenticated: &'a mut Option<Principal>,
    by_token: &'a mut bool,
    expires: &'a mut Option<Instant>,
    /// The session lifetime the last authentication granted.
    lifetime: &'a mut Option<Duration>,
    /// Wall-clock time, to which a token's expiry is compared.
    now_ms: i64,
}

/// Kafka's KafkaApis.allowTokenRequests: delegation token requests are
/// refused on PLAINTEXT, on SSL without a client certificate, and on
/// connections that authenticated with a token.
fn delegation_tokens_allowed(
    protocol: SecurityProtocol,
    principal: &Principal,
    by_token: bool,
) -> bool {
    match protocol {
        SecurityProtocol::Plaintext => false,
        SecurityProtocol::Ssl => principal.name != Principal::ANONYMOUS,
        SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl => !by_token,
    }
}

fn ready(frame: Option<Bytes>) -> Reply {
    Box::pin(std::future::ready(frame))
}

impl SaslCx<'_> {
    async fn intercept(&mut self, frame: Bytes) -> Intercept {
        if let Auth::Exchanging { raw: true, .. } = self.auth {
            return self.raw_token(frame).await;
        }
        if frame.len() < 8 {
            return Intercept::Pass; // the API layer refuses it
        }
        let key = i16::from_be_bytes([frame[0], frame[1]]);
        let version = i16::from_be_bytes([frame[2], frame[3]]);
        let Ok(api) = ApiKey::try_from(key) else {
            return Intercept::Pass;
        };
        match api {
            ApiKey::ApiVersions => Intercept::Pass,
            ApiKey::SaslHandshake if version <= 1 => {
                // First authentication, or KIP-368 re-authentication.
                if matches!(self.auth, Auth::Exchanging { .. }) {
                    return Intercept::Close("SaslHandshake during an exchange".into());
                }
                self.handshake(frame, version)
            }
            ApiKey::SaslAuthenticate if version <= 2 => match self.auth {
                Auth::Exchanging { .. } => self.authenticate(frame, version).await,
                _ => Intercept::Pass, // ILLEGAL_SASL_STATE from the API layer
            },
            _ => match self.auth {
                Auth::Open => {
                    if self.expires.is_some_and(|e| Instant::now() >= e) {
                        return Intercept::Close(
                            "session expired (connections.max.reauth.ms)".into(),
                        );
                    }
                    Intercept::Pass
                }
                _ => Intercept::Close(format!("{api:?} request before authentication")),
            },
        }
    }

    fn header(frame: &mut Bytes, api: ApiKey, version: i16) -> Option<(Encoder, RequestHeader)> {
        let header = RequestHeader::decode(frame, api.request_header_version(version)).ok()?;
        let encoder = Encoder {
            correlation_id: header.correlation_id,
            header_version: api.response_header_version(version),
            version,
        };
        Some((encoder, header))
    }

    fn handshake(&mut self, mut frame: Bytes, version: i16) -> Intercept {
        let Some((encoder, _)) = Self::header(&mut frame, ApiKey::SaslHandshake, version) else {
            return Intercept::Close("malformed SaslHandshake header".into());
        };
        let Ok(req) = SaslHandshakeRequest::decode(&mut frame, version) else {
            return Intercept::Close("malformed SaslHandshake".into());
        };
        let mechanisms = self
            .settings
            .mechanisms
            .iter()
            .map(|m| StrBytes::from_string(m.clone()))
            .collect();
        let mechanism = req.mechanism.to_string();
        let enabled = self.settings.mechanisms.contains(&mechanism);
        let exchange = enabled.then(|| Exchange::start(&mechanism)).flatten();
        match exchange {
            Some(exchange) => {
                *self.auth = Auth::Exchanging {
                    exchange,
                    raw: version == 0,
                };
                let resp = SaslHandshakeResponse::default().with_mechanisms(mechanisms);
                Intercept::Reply(ready(encoder.frame(&resp)))
            }
            None => {
                let resp = SaslHandshakeResponse::default()
                    .with_error_code(ResponseError::UnsupportedSaslMechanism.code())
                    .with_mechanisms(mechanisms);
                Intercept::ReplyAndClose(
                    ready(encoder.frame(&resp)),
                    format!("unsupported SASL mechanism {mechanism}"),
                )
            }
        }
    }

    /// Runs one step; Ok(Some(principal)) when authentication completed.
    async fn step(&mut self, token: &[u8]) -> Result<(Vec<u8>, bool), String> {
        let Auth::Exchanging { exchange, .. } = &mut *self.auth else {
            return Err("no exchange".into());
        };
        match exchange.step(&self.settings.secrets, token).await {
            Ok(Step::Challenge(t)) => Ok((t, false)),
            Ok(Step::Done {
                token,
                user,
                delegation,
            }) => {
                let principal = Principal::user(user);
                if let Some(before) = &*self.authenticated {
                    if *before != principal {
                        return Err(format!(
                            "re-authentication as {principal} on a connection of {before}"
                        ));
                    }
                }
                *self.authenticated = Some(principal);
                *self.by_token = delegation.is_some();
                *self.auth = Auth::Open;
                // As Kafka: a token's session ends no later than the token.
                let until_token = delegation.map(|expiry| {
                    Duration::from_millis(expiry.saturating_sub(self.now_ms).max(0) as u64)
                });
                let lifetime = self
                    .settings
                    .max_reauth
                    .map(|d| until_token.map_or(d, |t| t.min(d)));
                *self.lifetime = lifetime;
                *self.expires = lifetime.map(|d| Instant::now() + d);
                Ok((token, true))
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn delayed(&self, frame: Option<Bytes>) -> Reply {
        let delay = self.settings.failed_delay;
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            frame
        })
    }

    async fn authenticate(&mut self, mut frame: Bytes, version: i16) -> Intercept {
        let Some((encoder, _)) = Self::header(&mut frame, ApiKey::SaslAuthenticate, version) else {
            return Intercept::Close("malformed SaslAuthenticate header".into());
        };
        let Ok(req) = SaslAuthenticateRequest::decode(&mut frame, version) else {
            return Intercept::Close("malformed SaslAuthenticate".into());
        };
        match self.step(&req.auth_bytes).await {
            Ok((token, done)) => {
                let mut resp = SaslAuthenticateResponse::default().with_auth_bytes(token.into());
                if done {
                    if let Some(d) = *self.lifetime {
                        resp = resp.with_session_lifetime_ms(d.as_millis() as i64);
                    }
                }
                Intercept::Reply(ready(encoder.frame(&resp)))
            }
            Err(why) => {
                let resp = SaslAuthenticateResponse::default()
                    .with_error_code(ResponseError::SaslAuthenticationFailed.code())
                    .with_error_message(Some(StrBytes::from_string(format!(
                        "Authentication failed: {why}"
                    ))));
                Intercept::ReplyAndClose(self.delayed(encoder.frame(&resp)), why)
            }
        }
    }

    /// After SaslHandshake v0: the frame is a bare token and so is the answer.
    async fn raw_token(&mut self, frame: Bytes) -> Intercept {
        match self.step(&frame).await {
            Ok((token, _)) => {
                let mut out = BytesMut::with_capacity(4 + token.len());
                out.put_i32(token.len() as i32);
                out.put_slice(&token);
                Intercept::Reply(ready(Some(out.freeze())))
            }
            // No error can be framed here: close after the delay.
            Err(why) => Intercept::ReplyAndClose(self.delayed(Some(Bytes::new())), why),
        }
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio::sync::oneshot;

    use super::*;

    fn ready(bytes: &'static [u8]) -> Queued {
        (
            Box::pin(async move { Some(Bytes::from_static(bytes)) }),
            None,
        )
    }

    #[tokio::test]
    async fn a_reply_goes_out_while_the_next_one_still_waits() {
        let (client, server) = tokio::io::duplex(1024);
        let (tx, rx) = mpsc::channel(8);
        let writer = tokio::spawn(write_replies(rx, server, None));
        let (release, released) = oneshot::channel::<()>();
        tx.send(ready(b"first")).await.unwrap();
        let later: Reply = Box::pin(async move {
            released.await.ok()?;
            Some(Bytes::from_static(b"second"))
        });
        tx.send((later, None)).await.unwrap();
        let mut client = client;
        let mut got = [0u8; 5];
        tokio::time::timeout(Duration::from_secs(5), client.read_exact(&mut got))
            .await
            .expect("the first reply was held back behind the second")
            .unwrap();
        assert_eq!(&got, b"first");
        release.send(()).unwrap();
        drop(tx);
        let mut rest = Vec::new();
        client.read_to_end(&mut rest).await.unwrap();
        assert_eq!(rest, b"second");
        writer.await.unwrap();
    }
}
