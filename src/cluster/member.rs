//! Membership: a broker is in the cluster exactly while its key under
//! `<prefix>/brokers/` exists, and that key lives under an etcd lease the
//! broker keeps alive.
//!
//! The lease is the only failure detector. If the broker dies or is cut off,
//! etcd expires the lease, the key disappears, and the controller moves the
//! broker's partitions. For that to be safe the broker must have stopped
//! serving by then, so it judges its lease by its own clock, conservatively:
//! the lease is good until `ttl` after the last acknowledged keep-alive was
//! *sent* ([`LeaseClock`]) — etcd renewed it no earlier than that. When that
//! deadline passes, or etcd says the lease is gone, [`LeaseState::Lost`] is
//! published and the broker must stop serving. The member then keeps trying to
//! register again with a fresh lease and publishes [`LeaseState::Live`] when
//! it succeeds.
//!
//! Registration is create-only (the key's version must be 0), so a second
//! broker configured with a taken node id is refused while the first is alive.
//! A key still held by this member's own previous lease (etcd extends leases
//! when it restarts, so it may outlive our verdict) is moved to the new lease
//! in one transaction, then the old lease is revoked: that incarnation
//! already stopped serving, and the broker never looks gone meanwhile.

use std::time::Duration;

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp, TxnOpResponse};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::error::{ClusterError, Result};
use super::etcd::{ttl_secs, Etcd};
use super::state::Release;
use super::url::ClusterUrl;
use super::NodeId;

/// What a broker publishes about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    pub node_id: NodeId,
    pub host: String,
    pub port: u16,
    #[serde(default)]
    pub rack: Option<String>,
    /// Every listener's advertised endpoint (the first is `host:port`); empty
    /// in what brokers from before listeners published.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listeners: Vec<Endpoint>,
}

/// Where clients that came through listener `name` reach a broker.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub name: String,
    pub host: String,
    pub port: u16,
}

impl BrokerInfo {
    /// The endpoint for clients of `listener` (any: the first). A broker
    /// without that listener has none, and Kafka leaves it out of Metadata.
    pub fn endpoint(&self, listener: Option<&str>) -> Option<(String, u16)> {
        match listener {
            Some(name) if !self.listeners.is_empty() => self
                .listeners
                .iter()
                .find(|e| e.name == name)
                .map(|e| (e.host.clone(), e.port)),
            _ => Some((self.host.clone(), self.port)),
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub struct MemberOptions {
    /// Lease time-to-live, in whole seconds: how long a dead broker keeps its
    /// partitions, and how long an etcd outage is tolerated.
    pub ttl: Duration,
    /// Bound on each etcd request.
    pub request_timeout: Duration,
}

impl Default for MemberOptions {
    fn default() -> Self {
        MemberOptions {
            ttl: Duration::from_secs(6),
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// Whether this broker may serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Registered under `lease`; the registration was written at `revision`.
    Live { lease: i64, revision: i64 },
    /// The lease expired or could not be renewed in time: stop serving.
    Lost,
}

/// The broker's own, conservative idea of when its lease runs out.
#[derive(Clone, Copy, Debug)]
pub struct LeaseClock {
    deadline: Instant,
}

impl LeaseClock {
    /// A lease granted (or renewed) by a request sent at `sent_at`.
    pub fn new(sent_at: Instant, ttl: Duration) -> LeaseClock {
        LeaseClock {
            deadline: sent_at + ttl,
        }
    }

    /// A keep-alive sent at `sent_at` was acknowledged.
    pub fn renewed(&mut self, sent_at: Instant, ttl: Duration) {
        self.deadline = self.deadline.max(sent_at + ttl);
    }

    pub fn expired(&self, now: Instant) -> bool {
        now >= self.deadline
    }

    pub fn remaining(&self, now: Instant) -> Duration {
        self.deadline.saturating_duration_since(now)
    }
}

/// This broker's membership. Dropping it stops the keep-alives (the lease
/// then expires, as after a crash); [`Member::leave`] revokes it at once.
pub struct Member {
    etcd: Etcd,
    info: BrokerInfo,
    ttl: Duration,
    state: watch::Receiver<LeaseState>,
    task: JoinHandle<()>,
}

impl Member {
    /// Connects and registers; fails with [`ClusterError::NodeIdInUse`] if a
    /// live broker holds the node id.
    pub async fn join(
        url: &ClusterUrl,
        info: BrokerInfo,
        options: MemberOptions,
    ) -> Result<Member> {
        let etcd = Etcd::connect(url, options.request_timeout).await?;
        Member::join_with(etcd, info, options.ttl).await
    }

    /// Registers over an existing connection.
    pub async fn join_with(etcd: Etcd, info: BrokerInfo, ttl: Duration) -> Result<Member> {
        let ttl = Duration::from_secs(ttl_secs(ttl) as u64);
        let (lease, revision, clock) = register(&etcd, &info, ttl, None).await?;
        let (tx, state) = watch::channel(LeaseState::Live { lease, revision });
        let task = tokio::spawn(keep_alive_loop(
            etcd.clone(),
            info.clone(),
            ttl,
            lease,
            clock,
            tx,
        ));
        Ok(Member {
            etcd,
            info,
            ttl,
            state,
            task,
        })
    }

    pub fn node_id(&self) -> NodeId {
        self.info.node_id
    }

    pub fn info(&self) -> &BrokerInfo {
        &self.info
    }

    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    pub fn etcd(&self) -> &Etcd {
        &self.etcd
    }

    pub fn lease_state(&self) -> LeaseState {
        *self.state.borrow()
    }

    /// Fires whenever the lease is lost or a new one is live.
    pub fn subscribe(&self) -> watch::Receiver<LeaseState> {
        self.state.clone()
    }

    /// Declares that this broker stopped serving `partition` of `topic` at
    /// `epoch` and will never serve that epoch again, so the controller may
    /// hand it to another broker.
    pub async fn release(&self, topic: Uuid, partition: i32, epoch: i32) -> Result<()> {
        let key = self.etcd.keys().release(topic, partition);
        let value = serde_json::to_vec(&Release {
            leader: self.info.node_id,
            epoch,
        })
        .expect("serializable");
        self.etcd
            .call(|mut c| async move { c.put(key, value, None).await })
            .await?;
        Ok(())
    }

    /// Leaves the cluster: the caller has stopped serving; the lease is
    /// revoked so the controller reassigns at once instead of after a TTL.
    pub async fn leave(&self) -> Result<()> {
        self.task.abort();
        let state = *self.state.borrow();
        match state {
            LeaseState::Live { lease, .. } => self.etcd.revoke(lease).await,
            LeaseState::Lost => Ok(()),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Grants a lease and creates the broker key under it, create-only. Returns
/// the lease, the revision of the registration and the lease's clock.
async fn register(
    etcd: &Etcd,
    info: &BrokerInfo,
    ttl: Duration,
    previous: Option<i64>,
) -> Result<(i64, i64, LeaseClock)> {
    let key = etcd.keys().broker(info.node_id);
    let value = serde_json::to_vec(info).expect("serializable");
    let sent_at = Instant::now();
    let lease = etcd.grant(ttl).await?;
    let clock = LeaseClock::new(sent_at, ttl);
    let create = || {
        Txn::new()
            .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key.clone(),
                value.clone(),
                Some(PutOptions::new().with_lease(lease)),
            )])
            .or_else([TxnOp::get(key.clone(), None)])
    };
    let outcome = async {
        let mut resp = etcd.txn(create()).await?;
        if !resp.succeeded() {
            let holder = match resp.op_responses().into_iter().next() {
                Some(TxnOpResponse::Get(g)) => g.kvs().first().map(|kv| kv.lease()),
                _ => None,
            };
            let Some(previous) = previous.filter(|p| holder == Some(*p)) else {
                return Err(ClusterError::NodeIdInUse(info.node_id));
            };
            // Our own previous incarnation, which already stopped serving:
            // the key moves to the new lease in one step, so that the
            // controller never sees this broker gone and moves its
            // partitions (after an etcd restart every broker is here).
            let take = Txn::new()
                .when([Compare::lease(key.clone(), CompareOp::Equal, previous)])
                .and_then([TxnOp::put(
                    key.clone(),
                    value.clone(),
                    Some(PutOptions::new().with_lease(lease)),
                )]);
            resp = etcd.txn(take).await?;
            if !resp.succeeded() {
                return Err(ClusterError::NodeIdInUse(info.node_id));
            }
            // What else the old lease holds (the controller key) goes with
            // it; if this fails, it expires.
            if let Err(e) = etcd.revoke(previous).await {
                tracing::debug!(lease = previous, error = %e, "revoking the old lease failed");
            }
        }
        Ok(resp.header().map_or(0, |h| h.revision()))
    }
    .await;
    match outcome {
        Ok(revision) => Ok((lease, revision, clock)),
        Err(e) => {
            // Best effort: an unused lease would otherwise linger for a TTL.
            let _ = etcd.revoke(lease).await;
            Err(e)
        }
    }
}

async fn keep_alive_loop(
    etcd: Etcd,
    info: BrokerInfo,
    ttl: Duration,
    mut lease: i64,
    mut clock: LeaseClock,
    tx: watch::Sender<LeaseState>,
) {
    let retry = (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        keep_lease(&etcd, lease, ttl, &mut clock).await;
        tracing::warn!(node = info.node_id, lease, "etcd lease lost: stop serving");
        tx.send_replace(LeaseState::Lost);
        loop {
            match register(&etcd, &info, ttl, Some(lease)).await {
                Ok((new_lease, revision, new_clock)) => {
                    tracing::info!(node = info.node_id, lease = new_lease, "registered again");
                    lease = new_lease;
                    clock = new_clock;
                    tx.send_replace(LeaseState::Live { lease, revision });
                    break;
                }
                Err(e @ ClusterError::NodeIdInUse(_)) => {
                    tracing::warn!(error = %e, "cannot register again");
                    tokio::time::sleep(retry).await;
                }
                Err(e) => {
                    tracing::debug!(node = info.node_id, error = %e, "registering again failed");
                    tokio::time::sleep(retry).await;
                }
            }
        }
    }
}

/// Keeps `lease` alive; returns once it must be considered lost.
async fn keep_lease(etcd: &Etcd, lease: i64, ttl: Duration, clock: &mut LeaseClock) {
    let interval = ttl / 3;
    let retry = (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        let now = Instant::now();
        if clock.expired(now) {
            return;
        }
        // Opening the stream sends a first keep-alive and awaits its answer.
        let sent_at = now;
        let bound = clock.remaining(now).min(etcd.timeout());
        let opened =
            tokio::time::timeout(bound, async { etcd.client().lease_keep_alive(lease).await })
                .await;
        let (mut keeper, mut stream) = match opened {
            Ok(Ok(pair)) => pair,
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(m))) if m.contains("not found") => {
                return
            }
            _ => {
                tokio::time::sleep(retry.min(clock.remaining(Instant::now()))).await;
                continue;
            }
        };
        clock.renewed(sent_at, ttl);
        loop {
            let now = Instant::now();
            tokio::time::sleep(interval.min(clock.remaining(now))).await;
            let sent_at = Instant::now();
            if clock.expired(sent_at) || keeper.keep_alive().await.is_err() {
                break;
            }
            let bound = interval.min(clock.remaining(sent_at));
            match tokio::time::timeout(bound, stream.message()).await {
                Ok(Ok(Some(resp))) if resp.ttl() > 0 => clock.renewed(sent_at, ttl),
                // etcd no longer knows the lease: revoked or expired.
                Ok(Ok(Some(_))) => return,
                _ => break,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_clock_counts_from_when_the_keep_alive_was_sent() {
        let t0 = Instant::now();
        let ttl = Duration::from_secs(6);
        let mut clock = LeaseClock::new(t0, ttl);
        assert!(!clock.expired(t0 + Duration::from_secs(5)));
        assert!(clock.expired(t0 + ttl));
        // A keep-alive sent at t0+4 and answered late still counts from t0+4.
        clock.renewed(t0 + Duration::from_secs(4), ttl);
        assert!(!clock.expired(t0 + Duration::from_secs(9)));
        assert!(clock.expired(t0 + Duration::from_secs(10)));
        assert_eq!(
            clock.remaining(t0 + Duration::from_secs(7)),
            Duration::from_secs(3)
        );
        // An answer to an older keep-alive, arriving out of order, never shortens it.
        clock.renewed(t0 + Duration::from_secs(1), ttl);
        assert!(!clock.expired(t0 + Duration::from_secs(9)));
        assert_eq!(
            clock.remaining(t0 + Duration::from_secs(11)),
            Duration::ZERO
        );
    }
}
