//! Connection limits, as Kafka sets them: `max.connections`,
//! `max.connections.per.ip` (with per-address overrides) and
//! `connections.max.idle.ms`.
//!
//! They answer different threats and so act differently, like Kafka's
//! acceptor. One address opening too many connections is a misbehaving or
//! hostile client: its extra connection is accepted and closed at once, and
//! it alone suffers. The broker-wide limit protects the process (file
//! descriptors, memory per connection); reaching it says nothing about the
//! next client, so the accept loop stops accepting until a connection ends
//! and the kernel's backlog holds the newcomers meanwhile. An idle
//! connection is closed so that clients that vanished without a FIN do not
//! hold their slot forever.
//!
//! A `Permit` is the slot of one connection; dropping it (the connection's
//! task ending, however it ends) gives the slot back.
//!
//! The three counts are dynamic broker configs in Kafka, and here: `set`
//! changes them for the next accept. Connections already open over a
//! lowered limit stay open, as in Kafka; they only keep newcomers out.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::config::BrokerConfig;

pub(crate) struct ConnectionLimits {
    quotas: Mutex<Quotas>,
    idle: Option<Duration>,
    open: Mutex<Open>,
    freed: Notify,
}

/// max.connections, max.connections.per.ip and its overrides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Quotas {
    pub max: usize,
    pub per_ip: usize,
    pub overrides: HashMap<IpAddr, usize>,
}

#[derive(Default)]
struct Open {
    total: usize,
    by_ip: HashMap<IpAddr, usize>,
}

/// One admitted connection's slot.
pub(crate) struct Permit {
    limits: Arc<ConnectionLimits>,
    ip: IpAddr,
}

impl ConnectionLimits {
    pub(crate) fn new(
        max: usize,
        per_ip: usize,
        overrides: HashMap<IpAddr, usize>,
        idle: Option<Duration>,
    ) -> Arc<ConnectionLimits> {
        Arc::new(ConnectionLimits {
            quotas: Mutex::new(Quotas {
                max: max.max(1),
                per_ip,
                overrides,
            }),
            idle,
            open: Mutex::new(Open::default()),
            freed: Notify::new(),
        })
    }

    pub(crate) fn from_config(c: &BrokerConfig) -> Arc<ConnectionLimits> {
        let idle = (c.connections_max_idle_ms > 0)
            .then(|| Duration::from_millis(c.connections_max_idle_ms as u64));
        ConnectionLimits::new(
            c.max_connections,
            c.max_connections_per_ip,
            c.max_connections_per_ip_overrides.0.clone(),
            idle,
        )
    }

    /// The limits in force.
    pub(crate) fn quotas(&self) -> Quotas {
        self.quotas.lock().clone()
    }

    /// Changes the limits for the connections accepted from now on; a raised
    /// `max` lets a waiting accept loop go on at once.
    pub(crate) fn set(&self, quotas: Quotas) {
        *self.quotas.lock() = Quotas {
            max: quotas.max.max(1),
            ..quotas
        };
        self.freed.notify_waiters();
    }

    /// How long a connection may go without a request before it is closed.
    pub(crate) fn idle(&self) -> Option<Duration> {
        self.idle
    }

    /// Waits until the broker is below `max.connections` (call before accepting).
    pub(crate) async fn wait_for_slot(&self) {
        loop {
            let freed = self.freed.notified();
            let max = self.quotas.lock().max;
            if self.open.lock().total < max {
                return;
            }
            freed.await;
        }
    }

    /// Takes a slot for a connection from `ip`, or `None` when that address
    /// already has its quota (the caller closes the connection).
    pub(crate) fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<Permit> {
        let quota = {
            let q = self.quotas.lock();
            q.overrides.get(&ip).copied().unwrap_or(q.per_ip)
        };
        let mut open = self.open.lock();
        let n = open.by_ip.entry(ip).or_default();
        if *n >= quota {
            if *n == 0 {
                open.by_ip.remove(&ip);
            }
            return None;
        }
        *n += 1;
        open.total += 1;
        Some(Permit {
            limits: self.clone(),
            ip,
        })
    }

    /// Connections currently open.
    #[cfg(test)]
    pub(crate) fn open(&self) -> usize {
        self.open.lock().total
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut open = self.limits.open.lock();
        open.total -= 1;
        if let Some(n) = open.by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.by_ip.remove(&self.ip);
            }
        }
        drop(open);
        self.limits.freed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server::config::parse_ip_overrides;

    #[test]
    fn per_ip_quota_and_overrides_and_slots_come_back() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "::1".parse().unwrap();
        let overrides = parse_ip_overrides("[::1]:0, 10.0.0.9:5").unwrap().0;
        assert_eq!(overrides.get(&b), Some(&0));
        let limits = ConnectionLimits::new(10, 2, overrides, None);
        let p1 = limits.admit(a).unwrap();
        let _p2 = limits.admit(a).unwrap();
        assert!(limits.admit(a).is_none());
        assert!(
            limits.admit(b).is_none(),
            "an override of 0 refuses the address"
        );
        drop(p1);
        assert!(limits.admit(a).is_some());
        assert!(parse_ip_overrides("host:1").is_err());
    }

    #[tokio::test]
    async fn waits_for_a_slot_at_the_broker_limit() {
        let limits = ConnectionLimits::new(1, 10, HashMap::new(), None);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let p = limits.admit(ip).unwrap();
        let l = limits.clone();
        let waiter = tokio::spawn(async move { l.wait_for_slot().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        drop(p);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(limits.open(), 0);
    }

    #[tokio::test]
    async fn raising_the_limits_admits_at_once_and_lowering_keeps_open_connections() {
        let limits = ConnectionLimits::new(1, 1, HashMap::new(), None);
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let first = limits.admit(ip).unwrap();
        assert!(limits.admit(ip).is_none());
        let l = limits.clone();
        let waiter = tokio::spawn(async move { l.wait_for_slot().await });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished());
        limits.set(Quotas {
            max: 3,
            per_ip: 2,
            overrides: HashMap::new(),
        });
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .unwrap()
            .unwrap();
        let second = limits.admit(ip).unwrap();
        limits.set(Quotas {
            max: 1,
            per_ip: 1,
            overrides: HashMap::new(),
        });
        assert_eq!(limits.open(), 2, "lowering closes nothing");
        assert!(limits.admit(ip).is_none());
        drop((first, second));
        assert!(limits.admit(ip).is_some());
    }
}
