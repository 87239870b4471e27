//! The controller: one broker at a time turns membership and the topic catalog
//! into a partition assignment.
//!
//! Election is a create-only key, `<prefix>/controller`, written under the
//! candidate's membership lease — what etcd's election API does, minus the
//! queue. Tying it to the membership lease means a controller that is no
//! longer a member is no longer the controller, with no second lease to keep
//! in step. The key's create revision is the term's fencing token: every write
//! the controller makes compares it, so a deposed controller that still
//! believes in its term (paused, partitioned, slow) has its writes refused by
//! etcd itself. Each write also compares the mod revisions of what the plan was
//! computed from, so it applies only to the state it was computed for, and
//! when it moves a partition away from a broker that is gone, that the broker
//! is still gone: a broker that registered again since may already be
//! serving the partition at the epoch it still holds.
//!
//! The loop is level-triggered: read the whole prefix at one revision, run the
//! pure [`plan`], write the differences one topic per transaction, then wait
//! for anything to change after that revision (or a periodic resync). Missed
//! or duplicated events cannot matter, since every round starts from a full
//! read.
//!
//! Which brokers are settled (see `assignment`) is the one thing the loop
//! remembers between rounds: when it first saw each broker's registration.
//! Brokers already registered when a term starts count as settled, so a new
//! controller does not hold back a healthy cluster.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use uuid::Uuid;

use super::assignment::plan;
use super::error::{ClusterError, Result};
use super::etcd::Etcd;
use super::kv::{Compare, Op, Txn};
use super::member::{LeaseState, Member};
use super::state::{ClusterState, ControllerRecord, RawKv};
use super::NodeId;

/// How often an idle controller re-reads everything even without events.
const RESYNC: Duration = Duration::from_secs(5);

/// One term of one controller: won by [`Term::campaign`], fenced by its token.
pub struct Term {
    etcd: Etcd,
    node_id: NodeId,
    token: i64,
}

impl Term {
    /// Tries to become controller under `lease` (the member's). Returns `None`
    /// while another broker is controller. A key already held under the same
    /// lease is this broker's own term, resumed.
    pub async fn campaign(etcd: &Etcd, node_id: NodeId, lease: i64) -> Result<Option<Term>> {
        Ok(Term::campaign_at(etcd, node_id, lease).await?.0)
    }

    /// [`Term::campaign`], also returning the revision it saw.
    async fn campaign_at(etcd: &Etcd, node_id: NodeId, lease: i64) -> Result<(Option<Term>, i64)> {
        let key = etcd.keys().controller();
        let value = serde_json::to_vec(&ControllerRecord { node_id }).expect("serializable");
        let txn = Txn::when([Compare::Version(key.clone(), 0)])
            .then([Op::put_leased(key.clone(), value, lease)])
            .otherwise([Op::Get(key)]);
        let resp = etcd.txn(txn).await?;
        let revision = resp.revision;
        let token = if resp.succeeded {
            revision
        } else {
            match resp.got.into_iter().next() {
                Some(Some(kv)) if kv.lease == lease => kv.create_revision,
                _ => return Ok((None, revision)),
            }
        };
        let term = Term {
            etcd: etcd.clone(),
            node_id,
            token,
        };
        Ok((Some(term), revision))
    }

    pub fn node_id(&self) -> NodeId {
        self.node_id
    }

    /// The fencing token: the controller key's create revision.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// Reads the whole prefix at one revision.
    pub async fn snapshot(&self) -> Result<ClusterState> {
        read_state(&self.etcd).await
    }

    /// Plans from `state` and writes what differs. Returns the number of
    /// transactions written. Fails with [`ClusterError::NotController`] when
    /// this term is over, and with [`ClusterError::Conflict`] when something
    /// the plan depended on changed since `state` was read.
    pub async fn apply(&self, state: &ClusterState, settled: &BTreeSet<NodeId>) -> Result<usize> {
        if state.controller_token != self.token {
            return Err(ClusterError::NotController);
        }
        let txns = self.writes(state, settled);
        let n = txns.len();
        for txn in txns {
            if !self.etcd.txn(txn).await?.succeeded {
                let current = self.etcd.get(&self.etcd.keys().controller()).await?;
                return Err(match current {
                    Some(kv) if kv.create_revision == self.token => {
                        ClusterError::Conflict("the assignment".into())
                    }
                    _ => ClusterError::NotController,
                });
            }
        }
        Ok(n)
    }

    /// One transaction per topic whose assignment or releases must change.
    fn writes(&self, state: &ClusterState, settled: &BTreeSet<NodeId>) -> Vec<Txn> {
        let keys = self.etcd.keys();
        let live: BTreeSet<NodeId> = state.brokers.keys().copied().collect();
        let next = plan(
            &live,
            settled,
            &state.partition_counts(),
            &state.assignment(),
            &state.release_acks(),
        );
        let fence = || Compare::CreateRevision(keys.controller(), self.token);
        let mut txns = Vec::new();

        for (name, topic) in &state.topics {
            let id = topic.value.id;
            let Some(new) = next.get(&id) else { continue };
            let mut compares = vec![
                fence(),
                Compare::ModRevision(keys.topic(name), topic.mod_revision),
            ];
            let mut ops = Vec::new();
            let current = state.assignment.get(&id);
            if current.map(|c| &c.value) != Some(new) {
                compares.push(Compare::ModRevision(
                    keys.assignment(id),
                    current.map_or(0, |c| c.mod_revision),
                ));
                // A partition leaves a broker without its release only because
                // that broker is gone; if it registered again since the read,
                // it may be serving the partition, and the plan must be redone.
                let gone: BTreeSet<NodeId> = current
                    .into_iter()
                    .flat_map(|c| c.value.iter())
                    .filter(|(p, old)| {
                        !live.contains(&old.leader)
                            && new
                                .get(p)
                                .is_none_or(|n| (n.leader, n.epoch) != (old.leader, old.epoch))
                    })
                    .map(|(_, old)| old.leader)
                    .collect();
                compares.extend(
                    gone.into_iter()
                        .map(|n| Compare::Version(keys.broker(n), 0)),
                );
                let value = serde_json::to_vec(new).expect("serializable");
                ops.push(Op::put(keys.assignment(id), value));
            }
            // A release is consumed (or stale) once the entry it names is gone.
            for ((_, p), r) in state.releases.range((id, i32::MIN)..=(id, i32::MAX)) {
                let entry = new.get(p);
                if entry.is_none_or(|e| (e.leader, e.epoch) != (r.value.leader, r.value.epoch)) {
                    let key = keys.release(id, *p);
                    compares.push(Compare::ModRevision(key.clone(), r.mod_revision));
                    ops.push(Op::Delete(key));
                }
            }
            if !ops.is_empty() {
                txns.push(Txn::when(compares).then(ops));
            }
        }

        // Leftovers of deleted topics.
        let live_ids: BTreeSet<Uuid> = state.topics.values().map(|t| t.value.id).collect();
        let mut dead_ids: BTreeSet<Uuid> = state.assignment.keys().copied().collect();
        dead_ids.extend(state.releases.keys().map(|(t, _)| *t));
        for id in dead_ids.difference(&live_ids) {
            txns.push(Txn::when([fence()]).then([
                Op::Delete(keys.assignment(*id)),
                Op::DeletePrefix(keys.topic_releases(*id)),
            ]));
        }
        txns
    }
}

/// Reads everything under the prefix at one revision.
pub(crate) async fn read_state(etcd: &Etcd) -> Result<ClusterState> {
    let (revision, kvs) = etcd.get_prefix(&etcd.keys().root()).await?;
    let raw = kvs
        .iter()
        .map(|kv| (kv.key.clone(), RawKv::from(kv)))
        .collect();
    Ok(ClusterState::decode(etcd.keys(), revision, &raw))
}

/// A broker's candidacy: campaigns whenever there is no controller, and keeps
/// the assignment up to date while elected. The role is bound to the member's
/// lease, so [`Member::leave`] (or a crash) ends it; to stop being a candidate
/// while staying a member, [`Controller::resign`]. Merely dropping this stops
/// the work but not the role, as a hung controller would.
pub struct Controller {
    etcd: Etcd,
    lease: watch::Receiver<LeaseState>,
    elected: watch::Receiver<bool>,
    task: JoinHandle<()>,
}

impl Controller {
    /// `settle`: how long a broker must have been registered to be settled.
    pub fn spawn(member: &Member, settle: Duration) -> Controller {
        let (tx, elected) = watch::channel(false);
        let task = tokio::spawn(controller_loop(
            member.etcd().clone(),
            member.node_id(),
            member.subscribe(),
            tx,
            settle,
        ));
        Controller {
            etcd: member.etcd().clone(),
            lease: member.subscribe(),
            elected,
            task,
        }
    }

    /// Stops campaigning and gives up the role if held, so that another
    /// broker takes over at once.
    pub async fn resign(self) -> Result<()> {
        self.task.abort();
        let LeaseState::Live { lease, .. } = *self.lease.borrow() else {
            return Ok(());
        };
        let key = self.etcd.keys().controller();
        let txn = Txn::when([Compare::Lease(key.clone(), lease)]).then([Op::Delete(key)]);
        self.etcd.txn(txn).await?;
        Ok(())
    }

    /// Whether this broker believes it is the controller right now.
    pub fn is_controller(&self) -> bool {
        *self.elected.borrow()
    }

    pub fn subscribe(&self) -> watch::Receiver<bool> {
        self.elected.clone()
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// When the controller first saw each broker's current registration.
struct Arrivals {
    settle: Duration,
    /// Registration mod revision, and when it was first seen (`None`: at the
    /// term's start, settled).
    seen: HashMap<NodeId, (i64, Option<Instant>)>,
}

impl Arrivals {
    fn new(settle: Duration) -> Arrivals {
        Arrivals {
            settle,
            seen: HashMap::new(),
        }
    }

    /// The settled brokers of `state`, after noting the registrations it
    /// shows. The term's first read (`first`) settles everyone in it.
    fn settled(&mut self, state: &ClusterState, first: bool, now: Instant) -> BTreeSet<NodeId> {
        self.seen.retain(|n, _| state.registrations.contains_key(n));
        for (node, revision) in &state.registrations {
            let since = (!first).then_some(now);
            match self.seen.get(node) {
                Some((seen, _)) if seen == revision => {}
                _ => {
                    self.seen.insert(*node, (*revision, since));
                }
            }
        }
        self.seen
            .iter()
            .filter(|(_, (_, since))| since.is_none_or(|t| now.duration_since(t) >= self.settle))
            .map(|(n, _)| *n)
            .collect()
    }
}

async fn controller_loop(
    etcd: Etcd,
    node_id: NodeId,
    mut lease: watch::Receiver<LeaseState>,
    elected: watch::Sender<bool>,
    settle: Duration,
) {
    let backoff = Duration::from_millis(200);
    loop {
        elected.send_replace(false);
        let LeaseState::Live { lease: id, .. } = *lease.borrow_and_update() else {
            if lease.changed().await.is_err() {
                return;
            }
            continue;
        };
        let term = match Term::campaign_at(&etcd, node_id, id).await {
            Ok((Some(term), _)) => term,
            Ok((None, seen)) => {
                // Someone else leads: wait for its key to change, or our lease.
                let key = etcd.keys().controller();
                if !wait_for_change(&etcd, &key, seen + 1, &mut lease).await {
                    return;
                }
                continue;
            }
            Err(e) => {
                tracing::debug!(node_id, error = %e, "campaign failed");
                tokio::time::sleep(backoff).await;
                continue;
            }
        };
        tracing::info!(node_id, token = term.token(), "elected controller");
        elected.send_replace(true);
        let mut arrivals = Arrivals::new(settle);
        let mut first = true;
        loop {
            if !matches!(*lease.borrow_and_update(), LeaseState::Live { lease: l, .. } if l == id) {
                break;
            }
            let state = match term.snapshot().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(node_id, error = %e, "controller read failed");
                    tokio::time::sleep(backoff).await;
                    continue;
                }
            };
            let settled = arrivals.settled(&state, first, Instant::now());
            first = false;
            match term.apply(&state, &settled).await {
                Ok(_) => {
                    let root = etcd.keys().root();
                    if !wait_for_change(&etcd, &root, state.revision + 1, &mut lease).await {
                        return;
                    }
                }
                Err(ClusterError::NotController) => break,
                Err(ClusterError::Conflict(_)) => {}
                Err(e) => {
                    tracing::debug!(node_id, error = %e, "controller write failed");
                    tokio::time::sleep(backoff).await;
                }
            }
        }
        tracing::info!(node_id, "no longer controller");
    }
}

/// Waits until something under `prefix` changes from `revision` on, the
/// lease state changes, or the resync period passes. False once the member is
/// gone.
async fn wait_for_change(
    etcd: &Etcd,
    prefix: &str,
    revision: i64,
    lease: &mut watch::Receiver<LeaseState>,
) -> bool {
    let events = async {
        match etcd.watch_prefix(prefix, revision).await {
            Ok(mut stream) => loop {
                match stream.next().await {
                    Some(batch) if batch.events.is_empty() => continue,
                    _ => return,
                }
            },
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    };
    // Biased: which of several ready branches wins must not be drawn at
    // random, so that a simulation's seed decides everything.
    tokio::select! {
        biased;
        _ = events => true,
        changed = lease.changed() => changed.is_ok(),
        _ = tokio::time::sleep(RESYNC) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registered(brokers: &[(NodeId, i64)]) -> ClusterState {
        ClusterState {
            registrations: brokers.iter().copied().collect(),
            ..ClusterState::default()
        }
    }

    fn nodes(ids: &[NodeId]) -> BTreeSet<NodeId> {
        ids.iter().copied().collect()
    }

    #[test]
    fn a_broker_settles_after_the_delay_and_again_after_each_new_registration() {
        let second = Duration::from_secs(1);
        let mut arrivals = Arrivals::new(10 * second);
        let t0 = Instant::now();
        // Whoever is registered when the term starts is settled.
        assert_eq!(
            arrivals.settled(&registered(&[(1, 5)]), true, t0),
            nodes(&[1])
        );
        let two = registered(&[(1, 5), (2, 7)]);
        assert_eq!(arrivals.settled(&two, false, t0 + second), nodes(&[1]));
        assert_eq!(
            arrivals.settled(&two, false, t0 + 11 * second),
            nodes(&[1, 2])
        );
        // 1 restarts (a new registration): it settles anew.
        let restarted = registered(&[(1, 9), (2, 7)]);
        assert_eq!(
            arrivals.settled(&restarted, false, t0 + 12 * second),
            nodes(&[2])
        );
        assert_eq!(
            arrivals.settled(&restarted, false, t0 + 22 * second),
            nodes(&[1, 2])
        );
        // 2 leaves and comes back with the same revision it had: forgotten meanwhile.
        arrivals.settled(&registered(&[(1, 9)]), false, t0 + 23 * second);
        assert_eq!(
            arrivals.settled(&restarted, false, t0 + 24 * second),
            nodes(&[1])
        );
    }
}
