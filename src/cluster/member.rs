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
//! A key still held by a lease of a dead incarnation is taken over instead, as
//! KRaft accepts a broker's new incarnation: it moves to the new lease in one
//! transaction, then the old lease is revoked, so the controller never sees
//! the broker gone and its partitions stay put; the broker then fences its
//! earlier runs' write-ahead log before serving. An incarnation is known dead
//! when it was this member's own previous lease (etcd extends leases when it
//! restarts, so one may outlive our verdict), when it registered from this
//! broker's data directory (which a live process would still hold locked), or
//! when its lease is not being renewed: a live broker renews every third of
//! its TTL, so its lease never runs below half of it. A lease that keeps
//! being renewed belongs to a live process, and the node id is refused.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::error::{ClusterError, Result};
use super::etcd::{ttl_secs, Etcd};
use super::kv::{Compare, Op, Txn};
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
    /// The id of the data directory the broker runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub directory_id: Option<String>,
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
        self.etcd.put(&key, value).await
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

/// Grants a lease and registers the broker under it. Returns the lease, the
/// revision of the registration and the lease's clock.
async fn register(
    etcd: &Etcd,
    info: &BrokerInfo,
    ttl: Duration,
    previous: Option<i64>,
) -> Result<(i64, i64, LeaseClock)> {
    let sent_at = Instant::now();
    let lease = etcd.grant(ttl).await?;
    let clock = LeaseClock::new(sent_at, ttl);
    match claim_key(etcd, info, lease, previous).await {
        Ok(revision) => Ok((lease, revision, clock)),
        Err(e) => {
            // Best effort: an unused lease would otherwise linger for a TTL.
            let _ = etcd.revoke(lease).await;
            Err(e)
        }
    }
}

/// Attempts at registering while the key keeps changing under us.
const CLAIM_ATTEMPTS: usize = 5;

/// Puts the broker key under `lease`: created if free, taken over from a dead
/// incarnation (see the module doc). Returns the revision of the write.
async fn claim_key(
    etcd: &Etcd,
    info: &BrokerInfo,
    lease: i64,
    previous: Option<i64>,
) -> Result<i64> {
    let key = etcd.keys().broker(info.node_id);
    let value = serde_json::to_vec(info).expect("serializable");
    let put = || Op::put_leased(key.clone(), value.clone(), lease);
    for _ in 0..CLAIM_ATTEMPTS {
        let create = Txn::when([Compare::Version(key.clone(), 0)])
            .then([put()])
            .otherwise([Op::Get(key.clone())]);
        let resp = etcd.txn(create).await?;
        if resp.succeeded {
            return Ok(resp.revision);
        }
        let Some(Some(held)) = resp.got.into_iter().next() else {
            continue; // gone meanwhile
        };
        let holder = held.lease;
        let same_directory = info.directory_id.is_some()
            && serde_json::from_slice::<BrokerInfo>(&held.value)
                .is_ok_and(|theirs| theirs.directory_id == info.directory_id);
        if previous != Some(holder) && !same_directory {
            match lease_holder(etcd, holder).await? {
                Holder::Alive => return Err(ClusterError::NodeIdInUse(info.node_id)),
                Holder::Gone => continue,
                Holder::Dead => {}
            }
        }
        let take = Txn::when([
            Compare::Lease(key.clone(), holder),
            Compare::ModRevision(key.clone(), held.mod_revision),
        ])
        .then([put()]);
        let resp = etcd.txn(take).await?;
        if !resp.succeeded {
            continue;
        }
        tracing::info!(
            node = info.node_id,
            old_lease = holder,
            "took over the registration of this broker's earlier incarnation"
        );
        // What else the old lease holds (the controller key) goes with it;
        // if this fails, it expires.
        if let Err(e) = etcd.revoke(holder).await {
            tracing::debug!(lease = holder, error = %e, "revoking the old lease failed");
        }
        return Ok(resp.revision);
    }
    Err(ClusterError::Conflict(key))
}

/// What became of the process holding a lease.
#[derive(Debug, PartialEq, Eq)]
enum Holder {
    /// It keeps renewing the lease.
    Alive,
    /// It stopped renewing: dead, or hung past a renewal.
    Dead,
    /// The lease expired.
    Gone,
}

/// Watches `lease` until it shows whether its holder renews it. etcd reports
/// the time left in whole seconds, rounded down; a holder renewing every
/// third of the TTL never lets it fall below half, and a dead one's falls
/// there within half the TTL and a second.
async fn lease_holder(etcd: &Etcd, lease: i64) -> Result<Holder> {
    const POLL: Duration = Duration::from_millis(100);
    let started = Instant::now();
    loop {
        let (left, granted) = etcd.time_to_live(lease).await?;
        if left < 0 {
            return Ok(Holder::Gone);
        }
        if (left + 1) * 2 <= granted {
            return Ok(Holder::Dead);
        }
        let watched = Duration::from_secs(granted.max(0) as u64) / 2 + Duration::from_millis(1500);
        if started.elapsed() >= watched {
            return Ok(Holder::Alive);
        }
        tokio::time::sleep(POLL).await;
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

/// Keeps `lease` alive; returns once it must be considered lost. A renewal
/// counts from when it was sent, and one not answered within a third of the
/// TTL (or before the lease would run out) is sent again.
async fn keep_lease(etcd: &Etcd, lease: i64, ttl: Duration, clock: &mut LeaseClock) {
    let interval = ttl / 3;
    let retry = (ttl / 10).clamp(Duration::from_millis(100), Duration::from_secs(1));
    loop {
        let sent_at = Instant::now();
        if clock.expired(sent_at) {
            return;
        }
        let bound = interval.min(clock.remaining(sent_at));
        let wait = match etcd.keep_alive(lease, bound).await {
            Ok(true) => {
                clock.renewed(sent_at, ttl);
                interval
            }
            // etcd no longer knows the lease: revoked or expired.
            Ok(false) => return,
            Err(_) => retry,
        };
        let now = Instant::now();
        let next = (sent_at + wait).max(now);
        tokio::time::sleep_until(next.min(now + clock.remaining(now))).await;
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
