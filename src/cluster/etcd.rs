//! The etcd connection and the key layout.
//!
//! Every request goes through `Etcd::call`, which bounds it with the request
//! timeout: gRPC would otherwise wait for a dead etcd indefinitely, and a
//! broker must answer its clients with a retriable error instead. Keep-alives
//! are bounded by the member, which knows how long its lease has left, and
//! watches by their owners, which know what silence means for them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use uuid::Uuid;

use super::error::{ClusterError, Result};
use super::kv::{Compare, EtcdKv, KeyValue, Kv, Op, Txn, TxnResult, Watch};
use super::url::ClusterUrl;
use super::NodeId;

const KEEP_ALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Where each piece of cluster metadata lives under the prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    /// `prefix` without a trailing `/`, as [`ClusterUrl::prefix`].
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.trim_end_matches('/').to_string(),
        }
    }
    /// Everything Strata writes: `<prefix>/`.
    pub fn root(&self) -> String {
        format!("{}/", self.prefix)
    }
    pub fn brokers(&self) -> String {
        format!("{}/brokers/", self.prefix)
    }
    pub fn broker(&self, node: NodeId) -> String {
        format!("{}{node}", self.brokers())
    }
    pub fn controller(&self) -> String {
        format!("{}/controller", self.prefix)
    }
    pub fn topics(&self) -> String {
        format!("{}/topics/", self.prefix)
    }
    pub fn topic(&self, name: &str) -> String {
        format!("{}{name}", self.topics())
    }
    pub fn assignments(&self) -> String {
        format!("{}/assignment/", self.prefix)
    }
    pub fn assignment(&self, topic: Uuid) -> String {
        format!("{}{topic}", self.assignments())
    }
    pub fn releases(&self) -> String {
        format!("{}/released/", self.prefix)
    }
    pub fn topic_releases(&self, topic: Uuid) -> String {
        format!("{}{topic}/", self.releases())
    }
    pub fn release(&self, topic: Uuid, partition: i32) -> String {
        format!("{}{partition}", self.topic_releases(topic))
    }
    /// The cluster id every broker reports to clients.
    pub fn cluster_id(&self) -> String {
        format!("{}/cluster_id", self.prefix)
    }
    pub fn producer_ids(&self) -> String {
        format!("{}/producer_ids/next", self.prefix)
    }
}

/// A connection to etcd for one cluster prefix. Cheap to clone.
#[derive(Clone)]
pub struct Etcd {
    kv: Arc<dyn Kv>,
    keys: Keys,
    timeout: Duration,
}

impl Etcd {
    /// Connects lazily: an unreachable etcd makes requests fail (retriably),
    /// not this call.
    pub async fn connect(url: &ClusterUrl, timeout: Duration) -> Result<Etcd> {
        // HTTP/2 pings find connections that died silently (a network cut),
        // which would otherwise stall a watch forever. etcd refuses pings more
        // often than every 5 s (--grpc-keepalive-min-time) or on idle
        // connections, closing the connection on clients that do.
        let options = ConnectOptions::new()
            .with_connect_timeout(timeout)
            .with_keep_alive(KEEP_ALIVE_INTERVAL, timeout)
            .with_keep_alive_while_idle(false);
        let client = tokio::time::timeout(timeout, Client::connect(url.endpoints(), Some(options)))
            .await
            .map_err(|_| ClusterError::Unavailable(format!("connecting to {url} timed out")))??;
        Ok(Etcd::new(
            Arc::new(EtcdKv::new(client)),
            &url.prefix,
            timeout,
        ))
    }

    /// Over any [`Kv`], such as the in-memory one of the tests.
    pub fn new(kv: Arc<dyn Kv>, prefix: &str, timeout: Duration) -> Etcd {
        Etcd {
            kv,
            keys: Keys::new(prefix),
            timeout,
        }
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The bound on each request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs one request, bounded by the timeout.
    async fn call<T>(&self, request: impl Future<Output = Result<T>>) -> Result<T> {
        tokio::time::timeout(self.timeout, request)
            .await
            .unwrap_or_else(|_| {
                Err(ClusterError::Unavailable(format!(
                    "no answer from etcd within {:?}",
                    self.timeout
                )))
            })
    }

    pub(crate) async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        self.call(self.kv.txn(txn)).await
    }

    /// Writes `key` unconditionally.
    pub(crate) async fn put(&self, key: &str, value: Vec<u8>) -> Result<()> {
        self.txn(Txn::default().then([Op::put(key, value)])).await?;
        Ok(())
    }

    /// One key's current value.
    pub async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let (_, kvs) = self.call(self.kv.range(key, false)).await?;
        Ok(kvs.into_iter().next())
    }

    /// Every key under `prefix`, read at a single revision, and that revision.
    pub(crate) async fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>)> {
        self.call(self.kv.range(prefix, true)).await
    }

    /// Starts watching `prefix` from `revision` (inclusive).
    pub(crate) async fn watch_prefix(&self, prefix: &str, revision: i64) -> Result<Watch> {
        self.call(self.kv.watch(prefix, revision)).await
    }

    /// A lease of `ttl`, rounded up to whole seconds as etcd counts them.
    pub(crate) async fn grant(&self, ttl: Duration) -> Result<i64> {
        self.call(self.kv.grant(ttl_secs(ttl))).await
    }

    /// Renews `lease`, bounded by `bound` rather than the request timeout;
    /// false if etcd no longer knows it.
    pub(crate) async fn keep_alive(&self, lease: i64, bound: Duration) -> Result<bool> {
        tokio::time::timeout(bound, self.kv.keep_alive(lease))
            .await
            .unwrap_or_else(|_| Err(ClusterError::Unavailable("keep-alive timed out".into())))
    }

    /// Seconds left (negative once gone) and seconds granted.
    pub(crate) async fn time_to_live(&self, lease: i64) -> Result<(i64, i64)> {
        self.call(self.kv.time_to_live(lease)).await
    }

    /// The value of `key`, set to `proposal` unless someone set it first.
    pub async fn agree(&self, key: &str, proposal: &str) -> Result<String> {
        let txn = Txn::when([Compare::Version(key.into(), 0)]).then([Op::put(key, proposal)]);
        self.txn(txn).await?;
        let kv = self
            .get(key)
            .await?
            .ok_or_else(|| ClusterError::Unavailable(format!("{key} vanished")))?;
        Ok(String::from_utf8_lossy(&kv.value).into_owned())
    }

    pub async fn revoke(&self, lease: i64) -> Result<()> {
        self.call(self.kv.revoke(lease)).await
    }
}

/// etcd leases are counted in seconds; round up so a lease never lasts less
/// than asked.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}
