//! An in-memory etcd for deterministic tests of the cluster code.
//!
//! [`MemoryEtcd`] keeps keys, revisions, leases and watches as etcd does, on
//! tokio's clock, so a test on a paused runtime decides when a lease runs
//! out. Each broker talks to it through its own [`MemoryKv`], whose faults
//! the test sets and a seed draws: latency on every request, the answer to a
//! request lost after the request took effect (what a timeout after a write
//! looks like), and a cut, in which requests hang and watches end, as when a
//! network partition separates that broker from etcd while etcd goes on
//! expiring its lease.

use std::collections::hash_map::DefaultHasher;
use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Weak};
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::StreamExt;
use parking_lot::Mutex;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use super::error::{ClusterError, Result};
use super::kv::{Compare, Event, KeyValue, Kv, Op, Txn, TxnResult, Watch, WatchBatch};

/// How often expired leases are collected when nothing else happens.
const REAP_EVERY: Duration = Duration::from_millis(50);

struct Lease {
    granted: i64,
    deadline: Instant,
}

struct Watcher {
    prefix: String,
    tx: mpsc::UnboundedSender<WatchBatch>,
}

#[derive(Default)]
struct State {
    revision: i64,
    kvs: BTreeMap<String, KeyValue>,
    leases: BTreeMap<i64, Lease>,
    next_lease: i64,
    /// Every change since `compacted`, by revision, for watches that start in
    /// the past.
    history: Vec<(i64, Event)>,
    compacted: i64,
    watchers: Vec<Watcher>,
}

/// The store. Cheap to clone; clones share it.
#[derive(Clone)]
pub struct MemoryEtcd {
    state: Arc<Mutex<State>>,
}

impl Default for MemoryEtcd {
    fn default() -> Self {
        MemoryEtcd::new()
    }
}

impl MemoryEtcd {
    /// Starts the store's lease reaper on the current runtime; it stops when
    /// the last clone is dropped.
    pub fn new() -> MemoryEtcd {
        let state = Arc::new(Mutex::new(State {
            next_lease: 1,
            ..State::default()
        }));
        tokio::spawn(reap(Arc::downgrade(&state)));
        MemoryEtcd { state }
    }

    /// A connection for one client, with its own faults drawn from `seed`.
    pub fn client(&self, seed: u64) -> MemoryKv {
        let (cut, _) = watch::channel(false);
        MemoryKv {
            etcd: self.clone(),
            faults: Arc::new(Faults {
                cut,
                draws: Mutex::new(Draws {
                    seed,
                    asked: HashMap::new(),
                    lose_percent: 0,
                    max_latency: Duration::ZERO,
                }),
            }),
        }
    }

    /// The current revision.
    pub fn revision(&self) -> i64 {
        self.state.lock().revision
    }

    /// Forgets history up to `revision`: watches that start at or below it
    /// end at once, as etcd cancels them with its compact revision.
    pub fn compact(&self, revision: i64) {
        let mut s = self.state.lock();
        let revision = revision.min(s.revision);
        s.history.retain(|(r, _)| *r > revision);
        s.compacted = s.compacted.max(revision);
    }

    /// Every key under `prefix`, as stored now.
    pub fn dump(&self, prefix: &str) -> Vec<KeyValue> {
        let s = self.state.lock();
        s.kvs
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(_, kv)| kv.clone())
            .collect()
    }
}

impl State {
    /// Expires leases whose deadline passed, deleting their keys in one
    /// revision per lease.
    fn expire(&mut self, now: Instant) {
        let expired: Vec<i64> = self
            .leases
            .iter()
            .filter(|(_, l)| l.deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in expired {
            self.drop_lease(id);
        }
    }

    fn drop_lease(&mut self, id: i64) -> bool {
        if self.leases.remove(&id).is_none() {
            return false;
        }
        let keys: Vec<String> = self
            .kvs
            .values()
            .filter(|kv| kv.lease == id)
            .map(|kv| kv.key.clone())
            .collect();
        if !keys.is_empty() {
            let revision = self.revision + 1;
            let events = keys
                .iter()
                .filter_map(|k| self.delete(k, revision))
                .collect();
            self.commit(revision, events);
        }
        true
    }

    fn delete(&mut self, key: &str, revision: i64) -> Option<Event> {
        let mut kv = self.kvs.remove(key)?;
        kv.mod_revision = revision;
        Some(Event::Delete(kv))
    }

    fn compare(&self, c: &Compare) -> bool {
        let field = |key: &str, f: fn(&KeyValue) -> i64| self.kvs.get(key).map_or(0, f);
        match c {
            Compare::Version(k, v) => field(k, |kv| kv.version) == *v,
            Compare::ModRevision(k, v) => field(k, |kv| kv.mod_revision) == *v,
            Compare::CreateRevision(k, v) => field(k, |kv| kv.create_revision) == *v,
            Compare::Lease(k, v) => field(k, |kv| kv.lease) == *v,
        }
    }

    fn txn(&mut self, txn: Txn) -> Result<TxnResult> {
        let succeeded = txn.when.iter().all(|c| self.compare(c));
        let ops = if succeeded { txn.then } else { txn.otherwise };
        for op in &ops {
            if let Op::Put { lease, .. } = op {
                if *lease != 0 && !self.leases.contains_key(lease) {
                    return Err(ClusterError::Etcd(
                        "etcdserver: requested lease not found".into(),
                    ));
                }
            }
        }
        let revision = self.revision + 1;
        let (mut got, mut events) = (Vec::new(), Vec::new());
        for op in ops {
            match op {
                Op::Get(key) => got.push(self.kvs.get(&key).cloned()),
                Op::Put { key, value, lease } => {
                    let old = self.kvs.get(&key);
                    let kv = KeyValue {
                        create_revision: old.map_or(revision, |o| o.create_revision),
                        version: old.map_or(0, |o| o.version) + 1,
                        key: key.clone(),
                        value,
                        mod_revision: revision,
                        lease,
                    };
                    self.kvs.insert(key, kv.clone());
                    events.push(Event::Put(kv));
                }
                Op::Delete(key) => events.extend(self.delete(&key, revision)),
                Op::DeletePrefix(prefix) => {
                    let keys: Vec<String> = self
                        .kvs
                        .range(prefix.clone()..)
                        .take_while(|(k, _)| k.starts_with(&prefix))
                        .map(|(k, _)| k.clone())
                        .collect();
                    for k in keys {
                        events.extend(self.delete(&k, revision));
                    }
                }
            }
        }
        if !events.is_empty() {
            self.commit(revision, events);
        }
        Ok(TxnResult {
            succeeded,
            revision: self.revision,
            got,
        })
    }

    /// Records one revision's changes and tells the watchers.
    fn commit(&mut self, revision: i64, events: Vec<Event>) {
        self.revision = revision;
        self.watchers.retain(|w| {
            let mine: Vec<Event> = events
                .iter()
                .filter(|e| e.kv().key.starts_with(&w.prefix))
                .cloned()
                .collect();
            mine.is_empty()
                || w.tx
                    .send(WatchBatch {
                        revision,
                        events: mine,
                    })
                    .is_ok()
        });
        self.history
            .extend(events.into_iter().map(|e| (revision, e)));
    }
}

async fn reap(state: Weak<Mutex<State>>) {
    loop {
        tokio::time::sleep(REAP_EVERY).await;
        let Some(state) = state.upgrade() else { return };
        state.lock().expire(Instant::now());
    }
}

/// A client's faults, and the draws that apply them.
struct Faults {
    cut: watch::Sender<bool>,
    draws: Mutex<Draws>,
}

/// A request's fate is drawn from the seed, the request, and how many times
/// the client made it before, not from a sequence shared by the client's
/// tasks: tasks woken at one instant run in an order tokio draws at random,
/// and the draws must not depend on it.
struct Draws {
    seed: u64,
    asked: HashMap<String, u64>,
    lose_percent: u64,
    max_latency: Duration,
}

/// A request's latency, and whether its answer is lost.
struct Fate {
    latency: Duration,
    lost: bool,
}

impl Draws {
    fn fate(&mut self, request: String) -> Fate {
        let mut h = DefaultHasher::new();
        (self.seed, &request).hash(&mut h);
        let n = self.asked.entry(request).or_default();
        *n += 1;
        n.hash(&mut h);
        let draw = splitmix(h.finish());
        let max = self.max_latency.as_micros() as u64;
        let extra = if max == 0 { 0 } else { draw % max };
        Fate {
            // At least a millisecond: no request is instantaneous, so a lease
            // etcd renewed always outlasts the holder's own idea of it.
            latency: Duration::from_millis(1) + Duration::from_micros(extra),
            lost: (splitmix(draw) % 100) < self.lose_percent,
        }
    }
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One client's connection to a [`MemoryEtcd`].
#[derive(Clone)]
pub struct MemoryKv {
    etcd: MemoryEtcd,
    faults: Arc<Faults>,
}

impl MemoryKv {
    /// Cuts this client off (requests hang, watches end) or reconnects it.
    pub fn set_cut(&self, cut: bool) {
        self.faults.cut.send_replace(cut);
    }

    pub fn is_cut(&self) -> bool {
        *self.faults.cut.borrow()
    }

    /// Each request waits up to `max_latency` more before it takes effect, and
    /// `lose_percent` of the answers are lost after it did.
    pub fn set_faults(&self, max_latency: Duration, lose_percent: u64) {
        let mut d = self.faults.draws.lock();
        d.max_latency = max_latency;
        d.lose_percent = lose_percent.min(100);
    }

    /// Waits out the request's latency, then, unless cut, applies `f` to the
    /// store; the answer may then be lost.
    async fn request<T>(
        &self,
        request: String,
        f: impl FnOnce(&mut State, Instant) -> Result<T>,
    ) -> Result<T> {
        let fate = self.faults.draws.lock().fate(request);
        tokio::time::sleep(fate.latency).await;
        self.wait_connected().await;
        let result = {
            let mut s = self.etcd.state.lock();
            let now = Instant::now();
            s.expire(now);
            f(&mut s, now)
        };
        if fate.lost {
            return Err(ClusterError::Unavailable(
                "injected: the answer was lost".into(),
            ));
        }
        result
    }

    /// Hangs while cut, as a request to an unreachable etcd does.
    async fn wait_connected(&self) {
        let mut cut = self.faults.cut.subscribe();
        let _ = cut.wait_for(|c| !c).await;
    }
}

#[async_trait]
impl Kv for MemoryKv {
    async fn range(&self, key: &str, prefix: bool) -> Result<(i64, Vec<KeyValue>)> {
        self.request(format!("range {key}"), |s, _| {
            let kvs = if prefix {
                s.kvs
                    .range(key.to_string()..)
                    .take_while(|(k, _)| k.starts_with(key))
                    .map(|(_, kv)| kv.clone())
                    .collect()
            } else {
                s.kvs.get(key).cloned().into_iter().collect()
            };
            Ok((s.revision, kvs))
        })
        .await
    }

    async fn txn(&self, txn: Txn) -> Result<TxnResult> {
        self.request(format!("txn {txn:?}"), |s, _| s.txn(txn))
            .await
    }

    async fn watch(&self, prefix: &str, start_revision: i64) -> Result<Watch> {
        let prefix = prefix.to_string();
        let rx = self
            .request(format!("watch {prefix} {start_revision}"), |s, _| {
                let (tx, rx) = mpsc::unbounded_channel();
                if start_revision <= s.compacted {
                    return Ok(rx); // tx dropped: the watch ends at once
                }
                let mut past: BTreeMap<i64, Vec<Event>> = BTreeMap::new();
                for (r, e) in &s.history {
                    if *r >= start_revision && e.kv().key.starts_with(&prefix) {
                        past.entry(*r).or_default().push(e.clone());
                    }
                }
                for (revision, events) in past {
                    let _ = tx.send(WatchBatch { revision, events });
                }
                s.watchers.push(Watcher { prefix, tx });
                Ok(rx)
            })
            .await?;
        // The watch ends when this client is cut off.
        let cut = self.faults.cut.subscribe();
        let batches = futures::stream::unfold((rx, cut), |(mut rx, mut cut)| async move {
            let batch = tokio::select! {
                biased;
                b = rx.recv() => b,
                _ = cut.wait_for(|c| *c) => None,
            };
            batch.map(|b| (b, (rx, cut)))
        });
        Ok(batches.boxed())
    }

    async fn grant(&self, ttl_secs: i64) -> Result<i64> {
        self.request(format!("grant {ttl_secs}"), |s, now| {
            let id = s.next_lease;
            s.next_lease += 1;
            s.leases.insert(
                id,
                Lease {
                    granted: ttl_secs,
                    deadline: now + Duration::from_secs(ttl_secs.max(1) as u64),
                },
            );
            Ok(id)
        })
        .await
    }

    async fn keep_alive(&self, lease: i64) -> Result<bool> {
        self.request(format!("keep-alive {lease}"), |s, now| {
            Ok(match s.leases.get_mut(&lease) {
                Some(l) => {
                    l.deadline = now + Duration::from_secs(l.granted.max(1) as u64);
                    true
                }
                None => false,
            })
        })
        .await
    }

    async fn time_to_live(&self, lease: i64) -> Result<(i64, i64)> {
        self.request(format!("time-to-live {lease}"), |s, now| {
            Ok(match s.leases.get(&lease) {
                Some(l) => (
                    l.deadline.saturating_duration_since(now).as_secs() as i64,
                    l.granted,
                ),
                None => (-1, 0),
            })
        })
        .await
    }

    async fn revoke(&self, lease: i64) -> Result<()> {
        self.request(format!("revoke {lease}"), |s, _| {
            s.drop_lease(lease);
            Ok(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_lease_not_kept_alive_expires_and_takes_its_keys_with_it() {
        let etcd = MemoryEtcd::new();
        let kv = etcd.client(1);
        let lease = kv.grant(2).await.unwrap();
        let put =
            Txn::when([Compare::Version("k".into(), 0)]).then([Op::put_leased("k", "v", lease)]);
        assert!(kv.txn(put.clone()).await.unwrap().succeeded);
        assert!(!kv.txn(put).await.unwrap().succeeded, "create-only");
        let mut watch = kv.watch("k", etcd.revision() + 1).await.unwrap();

        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert!(kv.keep_alive(lease).await.unwrap());
        tokio::time::sleep(Duration::from_millis(1500)).await;
        assert_eq!(kv.range("k", false).await.unwrap().1.len(), 1, "renewed");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(kv.range("k", false).await.unwrap().1.is_empty(), "expired");
        assert!(!kv.keep_alive(lease).await.unwrap());
        let batch = watch.next().await.unwrap();
        assert!(matches!(&batch.events[..], [Event::Delete(kv)] if kv.key == "k"));
    }

    #[tokio::test(start_paused = true)]
    async fn a_lost_answer_still_took_effect_and_a_cut_client_hangs() {
        let etcd = MemoryEtcd::new();
        let kv = etcd.client(7);
        kv.set_faults(Duration::ZERO, 100);
        let err = kv.txn(Txn::default().then([Op::put("a", "1")])).await;
        assert!(matches!(err, Err(ClusterError::Unavailable(_))));
        assert_eq!(etcd.dump("a").len(), 1);

        let other = etcd.client(8);
        let mut watch = other.watch("", 1).await.unwrap();
        assert_eq!(watch.next().await.unwrap().revision, 1, "history replayed");
        other.set_cut(true);
        assert!(watch.next().await.is_none(), "a cut ends watches");
        let hung = tokio::time::timeout(Duration::from_secs(5), other.range("a", false)).await;
        assert!(hung.is_err());
        other.set_cut(false);
        assert_eq!(other.range("a", true).await.unwrap().1.len(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_watch_from_a_compacted_revision_ends_at_once() {
        let etcd = MemoryEtcd::new();
        let kv = etcd.client(1);
        for i in 0..3 {
            kv.txn(Txn::default().then([Op::put("x", i.to_string())]))
                .await
                .unwrap();
        }
        etcd.compact(2);
        assert!(kv.watch("x", 2).await.unwrap().next().await.is_none());
        let mut from3 = kv.watch("x", 3).await.unwrap();
        assert_eq!(from3.next().await.unwrap().revision, 3);
    }
}
