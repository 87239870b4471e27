//! What the cluster asks of etcd, as a trait.
//!
//! The cluster's decisions rest on a handful of etcd's guarantees: a
//! transaction that compares revisions and writes atomically, a range read
//! at one revision, a watch that delivers every change from a revision on,
//! and leases that delete their keys when they expire. [`Kv`] names exactly
//! those, in types of this module rather than the gRPC client's, so the
//! membership, election, controller and view code runs unchanged on
//! [`EtcdKv`] (a real etcd) and on [`MemoryKv`](super::MemoryKv), an
//! in-memory etcd whose time is tokio's and whose faults a seed draws: the
//! deterministic tests need to expire a lease at a chosen instant, cut one
//! broker off, and lose the answer to a write that happened.

use async_trait::async_trait;
use etcd_client::{
    Client, DeleteOptions, EventType, GetOptions, LeaseGrantOptions, PutOptions, TxnOpResponse,
    WatchOptions,
};
use futures::stream::{self, BoxStream, StreamExt};

use super::error::{ClusterError, Result};

/// One key as etcd stores it. A missing key compares as all zeros.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: Vec<u8>,
    pub create_revision: i64,
    pub mod_revision: i64,
    /// Writes since the key was created: 1 after the first.
    pub version: i64,
    /// The lease the key lives under; 0 for none.
    pub lease: i64,
}

/// An equality a transaction requires of one key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Compare {
    /// 0: the key does not exist.
    Version(String, i64),
    ModRevision(String, i64),
    CreateRevision(String, i64),
    Lease(String, i64),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    /// `lease` 0: none.
    Put {
        key: String,
        value: Vec<u8>,
        lease: i64,
    },
    Get(String),
    Delete(String),
    DeletePrefix(String),
}

impl Op {
    pub fn put(key: impl Into<String>, value: impl Into<Vec<u8>>) -> Op {
        Op::put_leased(key, value, 0)
    }

    pub fn put_leased(key: impl Into<String>, value: impl Into<Vec<u8>>, lease: i64) -> Op {
        Op::Put {
            key: key.into(),
            value: value.into(),
            lease,
        }
    }
}

/// If every comparison holds, `then`; otherwise `otherwise`. Atomic.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Txn {
    pub when: Vec<Compare>,
    pub then: Vec<Op>,
    pub otherwise: Vec<Op>,
}

impl Txn {
    pub fn when(when: impl IntoIterator<Item = Compare>) -> Txn {
        Txn {
            when: when.into_iter().collect(),
            ..Txn::default()
        }
    }

    pub fn then(mut self, ops: impl IntoIterator<Item = Op>) -> Txn {
        self.then = ops.into_iter().collect();
        self
    }

    pub fn otherwise(mut self, ops: impl IntoIterator<Item = Op>) -> Txn {
        self.otherwise = ops.into_iter().collect();
        self
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResult {
    pub succeeded: bool,
    /// The store's revision after the transaction.
    pub revision: i64,
    /// What each `Get` of the branch taken found, in order.
    pub got: Vec<Option<KeyValue>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    Put(KeyValue),
    /// The key as deleted: `mod_revision` is the deletion's.
    Delete(KeyValue),
}

impl Event {
    pub fn kv(&self) -> &KeyValue {
        match self {
            Event::Put(kv) | Event::Delete(kv) => kv,
        }
    }
}

/// Changes of one revision, or none (progress: the store is at `revision`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    pub revision: i64,
    pub events: Vec<Event>,
}

/// A watch's batches, in revision order. It ends when the watch breaks, is
/// cancelled, or needs a revision the store has compacted away; the watcher
/// then reads everything again.
pub type Watch = BoxStream<'static, WatchBatch>;

/// The part of etcd the cluster uses. Every call may fail with
/// [`ClusterError::Unavailable`] (retriable) or hang; callers bound it.
#[async_trait]
pub trait Kv: Send + Sync + 'static {
    /// The key, or every key under it when `prefix`, with the revision read.
    async fn range(&self, key: &str, prefix: bool) -> Result<(i64, Vec<KeyValue>)>;
    async fn txn(&self, txn: Txn) -> Result<TxnResult>;
    /// Changes under `prefix` from `start_revision` on (inclusive).
    async fn watch(&self, prefix: &str, start_revision: i64) -> Result<Watch>;
    /// A new lease of `ttl_secs` seconds.
    async fn grant(&self, ttl_secs: i64) -> Result<i64>;
    /// Renews `lease` for its full TTL; false if it is gone.
    async fn keep_alive(&self, lease: i64) -> Result<bool>;
    /// Seconds left (negative once gone) and seconds granted.
    async fn time_to_live(&self, lease: i64) -> Result<(i64, i64)>;
    /// Revokes `lease`, deleting its keys; a lease already gone is no error.
    async fn revoke(&self, lease: i64) -> Result<()>;
}

/// A real etcd, through its gRPC client.
pub struct EtcdKv {
    client: Client,
}

impl EtcdKv {
    pub fn new(client: Client) -> EtcdKv {
        EtcdKv { client }
    }
}

fn from_etcd(kv: &etcd_client::KeyValue) -> KeyValue {
    KeyValue {
        key: String::from_utf8_lossy(kv.key()).into_owned(),
        value: kv.value().to_vec(),
        create_revision: kv.create_revision(),
        mod_revision: kv.mod_revision(),
        version: kv.version(),
        lease: kv.lease(),
    }
}

fn to_etcd_compare(c: Compare) -> etcd_client::Compare {
    use etcd_client::{Compare as C, CompareOp::Equal};
    match c {
        Compare::Version(k, v) => C::version(k, Equal, v),
        Compare::ModRevision(k, v) => C::mod_revision(k, Equal, v),
        Compare::CreateRevision(k, v) => C::create_revision(k, Equal, v),
        Compare::Lease(k, v) => C::lease(k, Equal, v),
    }
}

fn to_etcd_op(op: Op) -> etcd_client::TxnOp {
    use etcd_client::TxnOp;
    match op {
        Op::Put { key, value, lease } => {
            let options = (lease != 0).then(|| PutOptions::new().with_lease(lease));
            TxnOp::put(key, value, options)
        }
        Op::Get(key) => TxnOp::get(key, None),
        Op::Delete(key) => TxnOp::delete(key, None),
        Op::DeletePrefix(key) => TxnOp::delete(key, Some(DeleteOptions::new().with_prefix())),
    }
}

#[async_trait]
impl Kv for EtcdKv {
    async fn range(&self, key: &str, prefix: bool) -> Result<(i64, Vec<KeyValue>)> {
        let options = prefix.then(|| GetOptions::new().with_prefix());
        let resp = self.client.clone().get(key, options).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        Ok((revision, resp.kvs().iter().map(from_etcd).collect()))
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        let etcd_txn = etcd_client::Txn::new()
            .when(
                txn.when
                    .into_iter()
                    .map(to_etcd_compare)
                    .collect::<Vec<_>>(),
            )
            .and_then(txn.then.into_iter().map(to_etcd_op).collect::<Vec<_>>())
            .or_else(
                txn.otherwise
                    .into_iter()
                    .map(to_etcd_op)
                    .collect::<Vec<_>>(),
            );
        let resp = self.client.clone().txn(etcd_txn).await?;
        let got = resp
            .op_responses()
            .into_iter()
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g.kvs().first().map(from_etcd)),
                _ => None,
            })
            .collect();
        Ok(TxnResult {
            succeeded: resp.succeeded(),
            revision: resp.header().map_or(0, |h| h.revision()),
            got,
        })
    }

    async fn watch(&self, prefix: &str, start_revision: i64) -> Result<Watch> {
        let options = WatchOptions::new()
            .with_prefix()
            .with_start_revision(start_revision);
        let stream = self.client.clone().watch(prefix, Some(options)).await?;
        Ok(stream::unfold(stream, |mut stream| async move {
            let resp = stream.message().await.ok()??;
            if resp.canceled() || resp.compact_revision() != 0 {
                tracing::info!(
                    reason = resp.cancel_reason(),
                    compacted = resp.compact_revision(),
                    "etcd ended a watch"
                );
                return None;
            }
            let events = resp
                .events()
                .iter()
                .filter_map(|e| {
                    let kv = from_etcd(e.kv()?);
                    Some(match e.event_type() {
                        EventType::Put => Event::Put(kv),
                        EventType::Delete => Event::Delete(kv),
                    })
                })
                .collect();
            let revision = resp.header().map_or(0, |h| h.revision());
            Some((WatchBatch { revision, events }, stream))
        })
        .boxed())
    }

    async fn grant(&self, ttl_secs: i64) -> Result<i64> {
        let resp = self
            .client
            .clone()
            .lease_grant(ttl_secs, None::<LeaseGrantOptions>)
            .await?;
        Ok(resp.id())
    }

    async fn keep_alive(&self, lease: i64) -> Result<bool> {
        // Opening the stream sends a keep-alive and awaits its answer, which
        // the client turns into an error when etcd no longer knows the lease.
        match self.client.clone().lease_keep_alive(lease).await {
            Ok(_) => Ok(true),
            Err(etcd_client::Error::LeaseKeepAliveError(m)) if m.contains("not found") => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    async fn time_to_live(&self, lease: i64) -> Result<(i64, i64)> {
        let resp = self.client.clone().lease_time_to_live(lease, None).await?;
        Ok((resp.ttl(), resp.granted_ttl()))
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        match self.client.clone().lease_revoke(lease).await {
            Ok(_) => Ok(()),
            Err(e) => match ClusterError::from(e) {
                // Already expired or revoked: the goal is reached.
                ClusterError::Etcd(m) if m.contains("lease not found") => Ok(()),
                e => Err(e),
            },
        }
    }
}
