//! Cluster mode's wiring: etcd membership, the write-ahead log, the topic
//! catalog mirrored from etcd, and the loop that takes partitions over and
//! hands them back.
//!
//! Every broker keeps every topic in its local catalog (created with the
//! cluster's topic id), but serves only the partitions it leads, and only
//! once it took them over (`Tier::take_over`: fence the old leader if it is
//! gone, read its head back from its write-ahead log, record the new epoch in
//! the manifest). Losing the lease stops serving everything at once, before
//! etcd can hand the partitions to others. A partition the controller asks
//! back for another broker stops taking appends, waits until its head is in
//! the store, and is released.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use object_store::ObjectStore;
use tokio::sync::watch;
use uuid::Uuid;

use super::config::BrokerConfig;
use crate::catalog::{Catalog, TopicConfig, TopicSpec, DEFAULT_REPLICATION_FACTOR};
use crate::cluster::{
    BrokerInfo, ClusterError, ClusterNode, ClusterUrl, ClusterView, Controller, LeaseState, Member,
    MemberOptions,
};
use crate::coordinator::share_store::{ShareCoordinator, SHARE_STATE_TOPIC};
use crate::coordinator::store::OFFSETS_TOPIC;
use crate::coordinator::txn::store::TXN_TOPIC;
use crate::coordinator::txn::TxnCoordinator;
use crate::coordinator::GroupCoordinator;
use crate::log::Partition;
use crate::tier::{Claim, Tier, WalCollector};
use crate::wal::{self, Wal, WalSettings};

/// How long to wait for etcd to describe the internal topics at startup.
const STARTUP_TIMEOUT: Duration = Duration::from_secs(30);

/// This broker's membership and write-ahead log.
pub(super) struct Joined {
    pub node: Arc<ClusterNode>,
    pub wal: Arc<Wal>,
    pub controller: Controller,
}

/// What this run of the broker registers as.
pub(super) struct Incarnation<'a> {
    pub host: &'a str,
    pub port: i32,
    pub listeners: Vec<crate::cluster::Endpoint>,
    /// The data directory's id, by which a restart knows its dead predecessor.
    pub directory_id: &'a str,
}

/// Registers in etcd, fences this node's earlier runs (a paused one must
/// not acknowledge anything more), and opens the write-ahead log.
pub(super) async fn join(
    config: &BrokerConfig,
    url: &str,
    store: &Arc<dyn ObjectStore>,
    me: Incarnation<'_>,
) -> anyhow::Result<Joined> {
    let url: ClusterUrl = url.parse().context("--cluster")?;
    let info = BrokerInfo {
        node_id: config.node_id,
        host: me.host.to_string(),
        port: me.port as u16,
        rack: None,
        listeners: me.listeners,
        directory_id: Some(me.directory_id.to_string()),
    };
    let options = MemberOptions {
        ttl: Duration::from_millis(config.cluster_lease_ttl_ms.max(1000)),
        ..MemberOptions::default()
    };
    // etcd may be starting too: retriable failures are retried for a while.
    let deadline = tokio::time::Instant::now() + STARTUP_TIMEOUT;
    let member = loop {
        match Member::join(&url, info.clone(), options).await {
            Ok(m) => break m,
            Err(e) if e.is_retriable() && tokio::time::Instant::now() < deadline => {
                tracing::warn!(error = %e, "etcd not reachable yet; retrying");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let etcd = member.etcd();
    // This broker's proposal, if it is the first. Not injected yet: the
    // broker's `Random` is built in server/mod.rs, which does not pass it here.
    #[allow(clippy::disallowed_methods)]
    let proposal = Uuid::new_v4().simple().to_string();
    let cluster_id = etcd.agree(&etcd.keys().cluster_id(), &proposal).await?;
    let own_floor = wal::fence_own(store, config.node_id).await?;
    let wal_settings = WalSettings {
        flush_every: Duration::from_millis(config.wal_flush_ms.max(1)),
        max_bytes: config.wal_max_bytes,
        hedge_after: (config.wal_hedge_ms > 0).then(|| Duration::from_millis(config.wal_hedge_ms)),
    };
    let wal = Wal::open(store.clone(), config.node_id, wal_settings).await?;
    let view = ClusterView::start(member.etcd().clone(), config.node_id);
    view.wait_for(|s| s.revision > 0).await;
    let controller = Controller::spawn(&member, Duration::from_millis(config.cluster_settle_ms));
    tracing::info!(node = config.node_id, %url, own_floor, "joined the cluster");
    Ok(Joined {
        node: Arc::new(ClusterNode::new(cluster_id, Arc::new(member), view)),
        wal,
        controller,
    })
}

/// Describes the broker's internal topics in etcd unless another broker did,
/// then mirrors every topic etcd knows into the local catalog, so the
/// internal topics open locally with the cluster's ids.
pub(super) async fn adopt_topics(
    node: &ClusterNode,
    catalog: &Catalog,
    internal: &[TopicSpec],
) -> anyhow::Result<()> {
    for spec in internal {
        if node.topics().get(spec.name).await?.is_some() {
            continue;
        }
        let config: BTreeMap<String, String> = spec
            .config
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        match node
            .topics()
            .create(
                spec.name,
                spec.partitions,
                DEFAULT_REPLICATION_FACTOR,
                config,
            )
            .await
        {
            Ok(_) | Err(ClusterError::TopicExists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let names: Vec<&str> = internal.iter().map(|s| s.name).collect();
    tokio::time::timeout(
        STARTUP_TIMEOUT,
        node.view()
            .wait_for(|s| names.iter().all(|n| s.topics.contains_key(*n))),
    )
    .await
    .context("etcd did not show the internal topics")?;
    sync_topics(node, catalog)?;
    Ok(())
}

/// Makes the local catalog hold exactly the topics etcd describes.
fn sync_topics(node: &ClusterNode, catalog: &Catalog) -> anyhow::Result<()> {
    let state = node.view().state();
    for (name, record) in &state.topics {
        let record = &record.value;
        let config = TopicConfig {
            overrides: record.config.clone(),
        };
        catalog.adopt_topic(name, record.id, record.partitions, config)?;
    }
    for topic in catalog.topics() {
        if !state.topics.contains_key(topic.name()) {
            catalog.delete_topic(topic.name())?;
        }
    }
    Ok(())
}

/// How often write-ahead log objects are checked for collection.
const WAL_COLLECT_EVERY: Duration = Duration::from_secs(10);

/// Deletes write-ahead log objects whose data sealed segments hold, until
/// `stop`: this broker's own and those of brokers no longer registered.
pub(super) async fn collect_wal(
    tier: Arc<Tier>,
    node: Arc<ClusterNode>,
    wal: Arc<Wal>,
    mut stop: watch::Receiver<bool>,
) {
    let mut collector = WalCollector::default();
    let mut tick = tokio::time::interval(WAL_COLLECT_EVERY);
    loop {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tick.tick() => {}
        }
        let others: HashSet<i32> = node
            .brokers()
            .into_iter()
            .map(|b| b.node_id)
            .filter(|&id| id != node.node_id())
            .collect();
        collector.learn(wal.node_id(), wal.take_tables());
        match collector.collect(&tier, &others).await {
            Ok(0) => {}
            Ok(n) => tracing::debug!(objects = n, "collected write-ahead log objects"),
            Err(e) => tracing::warn!(error = %e, "collecting write-ahead log objects failed"),
        }
    }
}

/// What the leadership loop drives.
pub(super) struct Leadership {
    pub node: Arc<ClusterNode>,
    pub catalog: Arc<Catalog>,
    pub tier: Arc<Tier>,
    pub wal: Arc<Wal>,
    pub coordinator: Arc<GroupCoordinator>,
    /// Coordinates transactions while this broker leads `__transaction_state`.
    pub txn: Arc<TxnCoordinator>,
    /// Keeps share-partition states while this broker leads `__share_group_state`.
    pub share: Arc<ShareCoordinator>,
    /// Told why when this run of the broker must end.
    pub fatal: watch::Sender<Option<String>>,
}

impl Leadership {
    /// Follows the view until `stop`: topics mirrored, partitions taken over
    /// or released, everything dropped when the lease is lost.
    pub(super) async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut changes = self.node.view().subscribe();
        let mut lease = self.node.member().subscribe();
        let mut retry = tokio::time::interval(Duration::from_millis(500));
        let mut released: HashSet<(Uuid, i32, i32)> = HashSet::new();
        let mut lost = false;
        loop {
            tokio::select! {
                _ = stop.wait_for(|s| *s) => return,
                _ = changes.changed() => {}
                _ = lease.changed() => {}
                _ = retry.tick() => {}
            }
            let live = matches!(self.node.member().lease_state(), LeaseState::Live { .. });
            if live && lost {
                // Back after losing the lease: the partitions may have been
                // taken over meanwhile, and this broker fenced.
                match self.wal.probe().await {
                    Ok(_) => lost = false,
                    Err(e) => tracing::warn!(error = %e, "could not check for a fence"),
                }
            }
            lost |= !live;
            if self.wal.is_fenced() {
                // A newer leader took this broker's partitions after it was
                // paused past its lease: nothing it holds may be served. A
                // fresh run fences its own earlier runs and starts clean.
                self.stop_leading_all();
                if let Err(e) = self.node.member().leave().await {
                    tracing::warn!(error = %e, "leaving the cluster failed");
                }
                let why = "fenced by a newer leader after a pause; restart to rejoin";
                tracing::error!("{why}");
                self.fatal.send_replace(Some(why.into()));
                return;
            }
            let registered = match self.node.member().lease_state() {
                LeaseState::Live { revision, .. } => revision,
                LeaseState::Lost => {
                    let dropped = self.stop_leading_all();
                    if dropped > 0 {
                        tracing::warn!(
                            partitions = dropped,
                            "lease lost: serving nothing until it is back"
                        );
                    }
                    // A newer incarnation or leader may have fenced this
                    // run meanwhile; then it can never serve again.
                    if let Err(e) = self.wal.probe().await {
                        tracing::debug!(error = %e, "could not check for a fence");
                    }
                    continue;
                }
            };
            let state = self.node.view().state();
            if state.revision < registered {
                continue;
            }
            if let Err(e) = sync_topics(&self.node, &self.catalog) {
                tracing::warn!(error = %e, "mirroring topics from etcd failed");
            }
            let mine = state.partitions_led_by(self.node.node_id());
            for ((topic, partition), epoch) in self.node.served() {
                let still = mine
                    .iter()
                    .any(|l| l.topic == topic && l.partition == partition && l.epoch == epoch);
                if !still {
                    self.stop_leading(topic, partition);
                    tracing::info!(%topic, partition, epoch, "no longer the leader");
                }
            }
            let mut releases = Vec::new();
            let mut claims = Vec::new();
            for led in mine {
                let key = (led.topic, led.partition, led.epoch);
                if led.handover_to.is_some() {
                    if !released.contains(&key) {
                        releases.push(key);
                    }
                    continue;
                }
                if self.node.serving(led.topic, led.partition) == Some(led.epoch) {
                    continue;
                }
                match self.claim(led.topic, led.partition, led.epoch) {
                    Some(c) => claims.push(c),
                    None => {
                        tracing::debug!(topic = %led.topic, partition = led.partition, "not mirrored yet")
                    }
                }
            }
            // A release waits on the store and on etcd; losing the lease
            // meanwhile must still stop everything at once (the next pass).
            let mut lost = self.node.member().subscribe();
            let handed = tokio::select! {
                biased;
                _ = lost.wait_for(|s| *s == LeaseState::Lost) => continue,
                handed = futures::future::join_all(
                    releases.iter().map(|&(t, p, e)| self.release(t, p, e)),
                ) => handed,
            };
            released.extend(
                releases
                    .into_iter()
                    .zip(handed)
                    .filter_map(|(key, ok)| ok.then_some(key)),
            );
            if !claims.is_empty() {
                let alive = |node: i32| state.brokers.contains_key(&node);
                self.take_over(claims, alive).await;
            }
        }
    }

    fn claim(&self, topic_id: Uuid, index: i32, epoch: i32) -> Option<Claim> {
        let topic = self.catalog.topic_by_id(topic_id)?;
        let partition = topic.partition(index)?;
        Some(Claim {
            topic,
            index,
            partition,
            epoch,
        })
    }

    /// Takes the claimed partitions over in one round and serves those that
    /// made it; the others are tried again on the next pass.
    async fn take_over(&self, claims: Vec<Claim>, alive: impl Fn(i32) -> bool) {
        // This broker may have led some of them until it lost its lease a
        // moment ago: what it appended then must be in its log before the
        // takeover reads the head back from there. Appends stop first, or
        // one could land after the end waited for.
        let ttl = self.node.member().ttl();
        let flushed = futures::future::join_all(claims.iter().map(|c| {
            c.partition.stop_appends();
            let appended = c.partition.end_offset();
            tokio::time::timeout(ttl, c.partition.wait_durable(appended))
        }))
        .await;
        if flushed.iter().any(|f| !matches!(f, Ok(Ok(())))) {
            tracing::warn!("the write-ahead log is not writable; takeovers wait");
            return;
        }
        let me = self.node.node_id();
        let own_written = self.wal.next_sequence();
        let LeaseState::Live { lease, .. } = self.node.member().lease_state() else {
            return;
        };
        for (claim, taken) in self.tier.take_over(claims, me, own_written, alive).await {
            let (topic_id, index, epoch) = (claim.topic.id(), claim.index, claim.epoch);
            // The controller may have moved the partition if the lease was
            // lost during the takeover: then the next pass stops everything.
            if !matches!(self.node.member().lease_state(), LeaseState::Live { lease: l, .. } if l == lease)
            {
                tracing::info!(topic = %topic_id, partition = index, epoch, "lease lost during the takeover; not serving");
                continue;
            }
            let ready = match taken {
                Ok(_) if claim.topic.name() == OFFSETS_TOPIC => {
                    self.coordinator.reload().await.map_err(anyhow::Error::from)
                }
                Ok(_) if claim.topic.name() == SHARE_STATE_TOPIC => {
                    self.share.reload().await.map_err(anyhow::Error::from)
                }
                // Replayed once served (the coordinator answers only then),
                // below; prepared transactions get their markers again.
                Ok(_) if claim.topic.name() == TXN_TOPIC => Ok(()),
                Ok(_) => Ok(()),
                Err(e) => Err(e.into()),
            };
            match ready {
                Ok(()) if claim.topic.name() == TXN_TOPIC => {
                    self.node.start_serving(topic_id, index, epoch);
                    if let Err(e) = self.txn.reload().await {
                        tracing::warn!(error = %e, "loading the transaction state failed; will retry");
                        self.node.stop_serving(topic_id, index);
                    }
                }
                Ok(()) => self.node.start_serving(topic_id, index, epoch),
                Err(e) => {
                    tracing::warn!(topic = %topic_id, partition = index, epoch, error = %e, "takeover failed; will retry")
                }
            }
        }
    }

    /// Stops serving the partition and refuses appends to it, the internal
    /// ones too (the group coordinator writes on its own timers): what
    /// this broker appended after the next leader read its log would be
    /// acknowledged and then lost.
    fn stop_leading(&self, topic_id: Uuid, index: i32) -> Option<Arc<Partition>> {
        self.node.stop_serving(topic_id, index);
        let p = self.catalog.topic_by_id(topic_id)?.partition(index)?;
        p.stop_appends();
        Some(p)
    }

    /// Stops leading every partition; returns how many it led.
    fn stop_leading_all(&self) -> usize {
        let led = self.node.served();
        for ((topic_id, index), _) in &led {
            self.stop_leading(*topic_id, *index);
        }
        led.len()
    }

    /// Stops serving a partition the controller hands to another broker,
    /// waits until its head is in the store, and releases it. True once
    /// released.
    async fn release(&self, topic_id: Uuid, index: i32, epoch: i32) -> bool {
        let durable = match self.stop_leading(topic_id, index) {
            Some(p) => p.wait_durable(p.end_offset()).await,
            None => Ok(()),
        };
        if let Err(e) = durable {
            tracing::warn!(%topic_id, partition = index, error = %e, "could not make the head durable before handing over");
            return false;
        }
        match self.node.member().release(topic_id, index, epoch).await {
            Ok(()) => {
                tracing::info!(%topic_id, partition = index, epoch, "handed the partition over");
                true
            }
            Err(e) => {
                tracing::warn!(%topic_id, partition = index, error = %e, "release failed; will retry");
                false
            }
        }
    }
}
