//! The etcd connection and the key layout.
//!
//! Every unary request goes through [`Etcd::call`], which bounds it with the
//! request timeout: gRPC would otherwise wait for a dead etcd indefinitely,
//! and a broker must answer its clients with a retriable error instead.
//! Streams (watches, keep-alives) are bounded by their owners, which know
//! what silence means for them.

use std::future::Future;
use std::time::Duration;

use etcd_client::{
    Client, ConnectOptions, GetOptions, KeyValue, LeaseGrantOptions, TxnResponse, WatchOptions,
    WatchStream,
};
use uuid::Uuid;

use super::error::{ClusterError, Result};
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
    pub fn producer_ids(&self) -> String {
        format!("{}/producer_ids/next", self.prefix)
    }
}

/// A connection to etcd for one cluster prefix. Cheap to clone.
#[derive(Clone)]
pub struct Etcd {
    client: Client,
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
        Ok(Etcd {
            client,
            keys: Keys::new(&url.prefix),
            timeout,
        })
    }

    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The bound on each request.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// The underlying client, for what this layer does not wrap.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Runs one request against a clone of the client, bounded by the timeout.
    pub(crate) async fn call<T, F, Fut>(&self, f: F) -> Result<T>
    where
        F: FnOnce(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        match tokio::time::timeout(self.timeout, f(self.client.clone())).await {
            Ok(r) => r.map_err(ClusterError::from),
            Err(_) => Err(ClusterError::Unavailable(format!(
                "no answer from etcd within {:?}",
                self.timeout
            ))),
        }
    }

    pub(crate) async fn txn(&self, txn: etcd_client::Txn) -> Result<TxnResponse> {
        self.call(|mut c| async move { c.txn(txn).await }).await
    }

    /// One key's current value.
    pub(crate) async fn get(&self, key: &str) -> Result<Option<KeyValue>> {
        let key = key.to_string();
        let mut resp = self
            .call(|mut c| async move { c.get(key, None).await })
            .await?;
        Ok(resp.take_kvs().into_iter().next())
    }

    /// Every key under `prefix`, read at a single revision, and that revision.
    pub(crate) async fn get_prefix(&self, prefix: &str) -> Result<(i64, Vec<KeyValue>)> {
        let prefix = prefix.to_string();
        let mut resp = self
            .call(|mut c| async move { c.get(prefix, Some(GetOptions::new().with_prefix())).await })
            .await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((revision, resp.take_kvs()))
    }

    /// Starts watching `prefix` from `revision` (inclusive).
    pub(crate) async fn watch_prefix(&self, prefix: &str, revision: i64) -> Result<WatchStream> {
        let prefix = prefix.to_string();
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(revision);
        self.call(|mut c| async move { c.watch(prefix, Some(options)).await })
            .await
    }

    /// A lease of `ttl`, rounded up to whole seconds as etcd counts them.
    pub(crate) async fn grant(&self, ttl: Duration) -> Result<i64> {
        let secs = ttl_secs(ttl);
        let resp = self
            .call(|mut c| async move { c.lease_grant(secs, None::<LeaseGrantOptions>).await })
            .await?;
        Ok(resp.id())
    }

    pub(crate) async fn revoke(&self, lease: i64) -> Result<()> {
        match self
            .call(|mut c| async move { c.lease_revoke(lease).await })
            .await
        {
            Ok(_) => Ok(()),
            // Already expired or revoked: the goal is reached.
            Err(ClusterError::Etcd(m)) if m.contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// etcd leases are counted in seconds; round up so a lease never lasts less
/// than asked.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    (ttl.as_millis().div_ceil(1000) as i64).max(1)
}
