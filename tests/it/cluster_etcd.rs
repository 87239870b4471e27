//! The cluster layer against a real etcd: each test starts its own `etcd`
//! process (temporary data dir, free ports), killed when the test ends.
//! Brokers are in-process [`Member`]s, each with its own etcd client.

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use common::etcd::EtcdServer;
use strata::cluster::{
    BrokerInfo, ClusterError, ClusterState, ClusterUrl, ClusterView, Controller, Etcd, LeaseState,
    Member, MemberOptions, NodeId, ProducerIdBlocks, Term, TopicStore,
};
use tokio::task::JoinHandle;

const TTL: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
/// Generous bound for anything that should happen "soon" on a loaded machine.
const SOON: Duration = Duration::from_secs(10);

fn info(node_id: NodeId, directory_id: Option<&str>) -> BrokerInfo {
    BrokerInfo {
        listeners: Vec::new(),
        node_id,
        host: "127.0.0.1".into(),
        port: 9000 + node_id as u16,
        rack: None,
        directory_id: directory_id.map(str::to_string),
    }
}

async fn join(url: &ClusterUrl, node_id: NodeId) -> Result<Member, ClusterError> {
    join_from(url, node_id, None).await
}

/// Joins as a broker running on the data directory `directory_id`.
async fn join_from(
    url: &ClusterUrl,
    node_id: NodeId,
    directory_id: Option<&str>,
) -> Result<Member, ClusterError> {
    let options = MemberOptions {
        ttl: TTL,
        request_timeout: REQUEST_TIMEOUT,
    };
    Member::join(url, info(node_id, directory_id), options).await
}

/// Waits until `done` holds for the view's state.
async fn until(
    view: &ClusterView,
    what: &str,
    done: impl FnMut(&ClusterState) -> bool,
) -> Arc<ClusterState> {
    match tokio::time::timeout(SOON, view.wait_for(done)).await {
        Ok(state) => state,
        Err(_) => panic!(
            "timed out waiting for {what}; last state: {:#?}",
            view.state()
        ),
    }
}

async fn until_lease(member: &Member, what: &str, done: impl Fn(LeaseState) -> bool) -> LeaseState {
    let mut rx = member.subscribe();
    let wait = async {
        loop {
            let s = *rx.borrow_and_update();
            if done(s) {
                return s;
            }
            rx.changed().await.unwrap();
        }
    };
    tokio::time::timeout(SOON, wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

fn broker_ids(s: &ClusterState) -> Vec<NodeId> {
    s.brokers.keys().copied().collect()
}

/// Leaders per broker.
fn leader_counts(s: &ClusterState) -> BTreeMap<NodeId, usize> {
    let mut m = BTreeMap::new();
    for a in s.assignment.values() {
        for e in a.value.values() {
            *m.entry(e.leader).or_insert(0) += 1;
        }
    }
    m
}

/// A broker as far as the cluster layer goes: membership, controller
/// candidacy, view, and a stand-in for the partition layer that "stops
/// serving" whatever it is asked to hand over and releases it.
struct Broker {
    member: Arc<Member>,
    view: ClusterView,
    controller: Controller,
    releaser: JoinHandle<()>,
}

impl Broker {
    async fn start(url: &ClusterUrl, node_id: NodeId) -> Broker {
        let member = Arc::new(join(url, node_id).await.unwrap());
        let view = ClusterView::start(member.etcd().clone(), node_id);
        let controller = Controller::spawn(&member, Duration::ZERO);
        let releaser = tokio::spawn(release_handovers(Arc::downgrade(&member), view.clone()));
        Broker {
            member,
            view,
            controller,
            releaser,
        }
    }

    /// Stops without leaving, as kill -9 would: the lease runs out.
    fn crash(self) {
        self.releaser.abort();
    }
}

async fn release_handovers(member: Weak<Member>, view: ClusterView) {
    let mut changes = view.subscribe();
    let mut done = BTreeSet::new();
    loop {
        for p in view.my_partitions() {
            if p.handover_to.is_some() && done.insert((p.topic, p.partition, p.epoch)) {
                let Some(member) = member.upgrade() else {
                    return;
                };
                if member.release(p.topic, p.partition, p.epoch).await.is_err() {
                    done.remove(&(p.topic, p.partition, p.epoch));
                }
            }
        }
        if changes.changed().await.is_err() {
            return;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_that_stops_keeping_alive_disappears_from_every_view() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    etcd.ready().await;
    let url = etcd.url();
    let m1 = join(&url, 1).await.unwrap();
    let m2 = join(&url, 2).await.unwrap();
    let m3 = join(&url, 3).await.unwrap();
    let v1 = ClusterView::start(m1.etcd().clone(), 1);
    let v2 = ClusterView::start(m2.etcd().clone(), 2);
    for v in [&v1, &v2] {
        until(v, "three brokers", |s| broker_ids(s) == [1, 2, 3]).await;
    }
    assert_eq!(v1.brokers()[2], info(3, None));

    let crashed = Instant::now();
    drop(m3);
    for v in [&v1, &v2] {
        until(v, "broker 3 gone", |s| broker_ids(s) == [1, 2]).await;
    }
    // Gone by lease expiry, not by anything the dropped member did.
    let took = crashed.elapsed();
    assert!(
        took >= TTL / 2,
        "removed after {took:?}, before its lease could expire"
    );
    assert!(matches!(m1.lease_state(), LeaseState::Live { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_id_held_by_a_live_broker_is_refused_until_it_leaves() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    etcd.ready().await;
    let url = etcd.url();
    let first = join(&url, 1).await.unwrap();
    let view = ClusterView::start(first.etcd().clone(), 1);
    until(&view, "broker 1", |s| broker_ids(s) == [1]).await;

    let err = join(&url, 1)
        .await
        .err()
        .expect("duplicate node id accepted");
    assert!(matches!(err, ClusterError::NodeIdInUse(1)), "{err}");
    assert!(!err.is_retriable());
    assert!(join(&url, 2).await.is_ok(), "other ids are unaffected");

    // A graceful leave frees the id at once, not after a TTL.
    let left = Instant::now();
    first.leave().await.unwrap();
    until(&view, "broker 1 gone", |s| !s.brokers.contains_key(&1)).await;
    assert!(left.elapsed() < TTL, "leave waited for the lease to expire");
    let again = join(&url, 1).await.unwrap();
    assert!(matches!(again.lease_state(), LeaseState::Live { .. }));
}

/// The revision at which broker `node`'s registration key was created.
async fn created_at(etcd: &Etcd, node: NodeId) -> Option<i64> {
    let key = etcd.keys().broker(node);
    etcd.get(&key).await.unwrap().map(|kv| kv.create_revision)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_broker_takes_over_the_registration_of_its_dead_incarnation() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let client = etcd.ready().await;
    let url = etcd.url();
    // Restarted on its data directory, and on a wiped one (a new id).
    for (crashed_on, restarted_on) in [("dir-a", "dir-a"), ("dir-a", "dir-b")] {
        let crashed = join_from(&url, 1, Some(crashed_on)).await.unwrap();
        let registered = created_at(&client, 1).await;
        // kill -9: the keep-alives stop, the lease lingers for its TTL.
        drop(crashed);
        let restarted = join_from(&url, 1, Some(restarted_on))
            .await
            .expect("a restart after a crash is not refused");
        assert!(matches!(restarted.lease_state(), LeaseState::Live { .. }));
        let now = created_at(&client, 1).await;
        assert_eq!(
            now, registered,
            "{restarted_on}: the registration was taken over, never deleted (the broker never looked gone)"
        );
        restarted.leave().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_lease_is_reported_lost_and_the_member_registers_again() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let admin = etcd.ready().await;
    let member = join(&etcd.url(), 1).await.unwrap();
    let LeaseState::Live { lease, .. } = member.lease_state() else {
        panic!("not live")
    };
    let view = ClusterView::start(admin.clone(), 99);
    until(&view, "broker 1", |s| broker_ids(s) == [1]).await;

    let mut states = member.subscribe();
    admin.revoke(lease).await.unwrap();
    tokio::time::timeout(TTL, async {
        while *states.borrow_and_update() != LeaseState::Lost {
            states.changed().await.unwrap();
        }
    })
    .await
    .expect("lease loss not reported within one TTL");

    let again = until_lease(
        &member,
        "a new lease",
        |s| matches!(s, LeaseState::Live { lease: l, .. } if l != lease),
    )
    .await;
    let LeaseState::Live { revision, .. } = again else {
        unreachable!()
    };
    until(&view, "broker 1 back", |s| {
        broker_ids(s) == [1] && s.revision >= revision
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_controller_at_a_time_and_another_takes_over_when_its_lease_goes() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let admin = etcd.ready().await;
    let url = etcd.url();
    let mut brokers = BTreeMap::new();
    for id in 1..=3 {
        brokers.insert(id, Broker::start(&url, id).await);
    }
    let view = ClusterView::start(admin.clone(), 99);

    let believers = |brokers: &BTreeMap<NodeId, Broker>| -> Vec<NodeId> {
        brokers
            .iter()
            .filter(|(_, b)| b.controller.is_controller())
            .map(|(id, _)| *id)
            .collect()
    };
    let first = until(&view, "a controller", |s| s.controller.is_some())
        .await
        .controller
        .unwrap();
    let deadline = Instant::now() + SOON;
    while believers(&brokers) != [first] {
        assert!(
            Instant::now() < deadline,
            "controllers: {:?}",
            believers(&brokers)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Revoking the controller's lease deposes it: another takes over, and the
    // old one stops believing and, registered again, stays a follower.
    let LeaseState::Live { lease, .. } = brokers[&first].member.lease_state() else {
        panic!()
    };
    admin.revoke(lease).await.unwrap();
    let second = until(&view, "a new controller", |s| {
        s.controller.is_some_and(|c| c != first)
    })
    .await
    .controller
    .unwrap();
    let deadline = Instant::now() + SOON;
    while believers(&brokers) != [second] {
        assert!(
            Instant::now() < deadline,
            "controllers: {:?}",
            believers(&brokers)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until(&view, "the old controller registered again", |s| {
        broker_ids(s) == [1, 2, 3]
    })
    .await;
    assert_eq!(view.controller(), Some(second));

    // A controller that crashes loses the role when its lease expires.
    brokers.remove(&second).unwrap().crash();
    let third = until(&view, "a third controller", |s| {
        s.controller.is_some_and(|c| c != second)
    })
    .await
    .controller
    .unwrap();

    // Resigning hands the role over at once, without waiting for a lease.
    let resigned = Instant::now();
    let b = brokers.remove(&third).unwrap();
    b.controller.resign().await.unwrap();
    let fourth = until(&view, "a controller after resigning", |s| {
        s.controller.is_some_and(|c| c != third)
    })
    .await
    .controller
    .unwrap();
    assert!(resigned.elapsed() < TTL, "waited for a lease to expire");
    assert_eq!(brokers.keys().copied().collect::<Vec<_>>(), [fourth]);
    assert!(
        matches!(b.member.lease_state(), LeaseState::Live { .. }),
        "resigning left the cluster"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deposed_controllers_stale_write_is_rejected() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    etcd.ready().await;
    let url = etcd.url();
    let m1 = join(&url, 1).await.unwrap();
    let m2 = join(&url, 2).await.unwrap();
    let lease = |m: &Member| match m.lease_state() {
        LeaseState::Live { lease, .. } => lease,
        LeaseState::Lost => panic!("lease lost"),
    };
    let t1 = Term::campaign(m1.etcd(), 1, lease(&m1))
        .await
        .unwrap()
        .expect("1 elected");
    assert!(
        Term::campaign(m2.etcd(), 2, lease(&m2))
            .await
            .unwrap()
            .is_none(),
        "two controllers"
    );

    let settled = |s: &ClusterState| s.brokers.keys().copied().collect::<BTreeSet<_>>();
    let topics = TopicStore::new(m1.etcd().clone());
    let topic = topics.create("t", 3, 1, BTreeMap::new()).await.unwrap();
    let stale = t1.snapshot().await.unwrap();
    assert_eq!(stale.controller, Some(1));

    // Controller 1 leaves; 2 is elected; 1 then writes what it planned.
    m1.leave().await.unwrap();
    let t2 = Term::campaign(m2.etcd(), 2, lease(&m2))
        .await
        .unwrap()
        .expect("2 elected");
    assert_ne!(t1.token(), t2.token());
    let err = t1
        .apply(&stale, &settled(&stale))
        .await
        .expect_err("stale controller wrote");
    assert!(matches!(err, ClusterError::NotController), "{err}");
    assert!(
        t2.snapshot().await.unwrap().assignment.is_empty(),
        "stale write landed"
    );

    // The new controller's writes land; one computed from an outdated read
    // does not, even from the right controller.
    let before = t2.snapshot().await.unwrap();
    assert_eq!(t2.apply(&before, &settled(&before)).await.unwrap(), 1);
    let err = t2
        .apply(&before, &settled(&before))
        .await
        .expect_err("outdated plan written");
    assert!(matches!(err, ClusterError::Conflict(_)), "{err}");
    let now = t2.snapshot().await.unwrap();
    assert_eq!(now.leader_of(topic.id, 0), Some((2, 0)));
    assert_eq!(leader_counts(&now), BTreeMap::from([(2, 3)]));
    assert_eq!(
        t2.apply(&now, &settled(&now)).await.unwrap(),
        0,
        "nothing left to change"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_spread_move_off_a_dead_broker_and_rebalance_onto_a_newcomer() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let admin = etcd.ready().await;
    let url = etcd.url();
    let mut brokers = BTreeMap::new();
    for id in 1..=3 {
        brokers.insert(id, Broker::start(&url, id).await);
    }
    let topics = TopicStore::new(admin.clone());
    topics.create("a", 5, 1, BTreeMap::new()).await.unwrap();
    topics.create("b", 7, 1, BTreeMap::new()).await.unwrap();
    let view = brokers[&1].view.clone();

    let spread = until(&view, "12 partitions spread over 3", |s| {
        s.settled() && leader_counts(s) == BTreeMap::from([(1, 4), (2, 4), (3, 4)])
    })
    .await;
    assert!(spread
        .assignment
        .values()
        .flat_map(|a| a.value.values())
        .all(|e| e.epoch == 0));
    let led_by_3 = spread.partitions_led_by(3);
    let v3 = &brokers[&3].view;
    until(v3, "3 sees the spread", |s| s.revision >= spread.revision).await;
    assert_eq!(v3.my_partitions(), led_by_3);

    // Broker 3 dies: its partitions move with epoch + 1, nothing else moves.
    brokers.remove(&3).unwrap().crash();
    let after_death = until(&view, "3's partitions moved", |s| {
        broker_ids(s) == [1, 2]
            && s.settled()
            && leader_counts(s) == BTreeMap::from([(1, 6), (2, 6)])
    })
    .await;
    for (topic, a) in &spread.assignment {
        for (p, before) in &a.value {
            let (leader, epoch) = after_death.leader_of(*topic, *p).unwrap();
            if before.leader == 3 {
                assert_eq!(epoch, 1, "{topic}/{p}");
            } else {
                assert_eq!(
                    (leader, epoch),
                    (before.leader, before.epoch),
                    "{topic}/{p} moved"
                );
            }
        }
    }
    assert!(led_by_3
        .iter()
        .all(|p| after_death.leader_of(p.topic, p.partition).unwrap().1 == 1));

    // Broker 4 joins: it gets its fair share by handover (old leader releases,
    // new one takes over at epoch + 1) and the rest stays.
    brokers.insert(4, Broker::start(&url, 4).await);
    let balanced = until(&view, "rebalanced onto 4", |s| {
        s.settled()
            && s.releases.is_empty()
            && leader_counts(s) == BTreeMap::from([(1, 4), (2, 4), (4, 4)])
    })
    .await;
    for (topic, a) in &after_death.assignment {
        for (p, before) in &a.value {
            let (leader, epoch) = balanced.leader_of(*topic, *p).unwrap();
            if leader == 4 {
                assert_eq!(epoch, before.epoch + 1, "{topic}/{p}");
            } else {
                assert_eq!(
                    (leader, epoch),
                    (before.leader, before.epoch),
                    "{topic}/{p} moved"
                );
            }
        }
    }
    let v4 = &brokers[&4].view;
    until(v4, "4 sees the balanced assignment", |s| {
        s.revision >= balanced.revision
    })
    .await;
    assert_eq!(v4.my_partitions().len(), 4);
    assert!(v4.my_partitions().iter().all(|p| p.handover_to.is_none()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_creation_is_exclusive_and_changes_are_compare_and_swap() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    let a = TopicStore::new(etcd.ready().await);
    let b = TopicStore::new(Etcd::connect(&etcd.url(), REQUEST_TIMEOUT).await.unwrap());

    let config = BTreeMap::from([("cleanup.policy".to_string(), "compact".to_string())]);
    let created = a.create("orders", 3, 3, config.clone()).await.unwrap();
    let err = b
        .create("orders", 8, 1, BTreeMap::new())
        .await
        .expect_err("created twice");
    assert!(
        matches!(&err, ClusterError::TopicExists(n) if n == "orders"),
        "{err}"
    );
    assert_eq!(b.get("orders").await.unwrap(), Some(created.clone()));
    assert!(matches!(
        a.create("zero", 0, 1, BTreeMap::new()).await,
        Err(ClusterError::InvalidArgument(_))
    ));
    assert!(matches!(
        a.create("unreplicated", 1, 0, BTreeMap::new()).await,
        Err(ClusterError::InvalidArgument(_))
    ));

    // Racing partition increases from two brokers: none is lost.
    let mut racers = Vec::new();
    for n in 4..=15 {
        let store = if n % 2 == 0 { a.clone() } else { b.clone() };
        racers.push(tokio::spawn(async move {
            store.add_partitions("orders", n).await
        }));
    }
    for r in racers {
        match r.await.unwrap() {
            Ok(_) | Err(ClusterError::InvalidPartitions { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }
    let grown = a.get("orders").await.unwrap().unwrap();
    assert_eq!(
        (
            grown.id,
            grown.partitions,
            grown.replication_factor,
            &grown.config
        ),
        (created.id, 15, 3, &config)
    );
    let err = b
        .add_partitions("orders", 15)
        .await
        .expect_err("shrunk or kept");
    assert!(matches!(
        err,
        ClusterError::InvalidPartitions {
            requested: 15,
            current: 15
        }
    ));

    let altered = b.alter_config("orders", BTreeMap::new()).await.unwrap();
    assert!(altered.config.is_empty());
    assert!(matches!(
        a.alter_config("nope", BTreeMap::new()).await,
        Err(ClusterError::UnknownTopic(_))
    ));

    a.create("other", 1, 1, BTreeMap::new()).await.unwrap();
    assert_eq!(
        b.list().await.unwrap().keys().collect::<Vec<_>>(),
        ["orders", "other"]
    );
    assert_eq!(b.delete("orders").await.unwrap().id, created.id);
    assert!(matches!(
        a.delete("orders").await,
        Err(ClusterError::UnknownTopic(_))
    ));
    let recreated = a.create("orders", 1, 1, BTreeMap::new()).await.unwrap();
    assert_ne!(
        recreated.id, created.id,
        "a new topic under an old name is a new topic"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_id_blocks_from_two_members_never_overlap() {
    let Some(etcd) = EtcdServer::start() else {
        return;
    };
    etcd.ready().await;
    let url = etcd.url();
    let m1 = join(&url, 1).await.unwrap();
    let m2 = join(&url, 2).await.unwrap();
    let mut tasks = Vec::new();
    for m in [&m1, &m2] {
        for _ in 0..2 {
            let blocks = ProducerIdBlocks::new(m.etcd().clone());
            tasks.push(tokio::spawn(async move {
                let mut got = Vec::new();
                for _ in 0..15 {
                    got.push(blocks.allocate(1000).await.unwrap());
                }
                got
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort_by_key(|r| r.start);
    assert_eq!(all.len(), 60);
    assert_eq!(all[0].start, 0);
    for pair in all.windows(2) {
        assert_eq!(pair[0].end, pair[1].start, "gap or overlap: {pair:?}");
    }
    assert!(all.iter().all(|r| r.end - r.start == 1000));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_gives_retriable_errors_and_the_cluster_recovers_after_restart() {
    let Some(mut etcd) = EtcdServer::start() else {
        return;
    };
    let admin = etcd.ready().await;
    let url = etcd.url();
    let b1 = Broker::start(&url, 1).await;
    let b2 = Broker::start(&url, 2).await;
    let topics = TopicStore::new(admin.clone());
    let topic = topics.create("t", 4, 1, BTreeMap::new()).await.unwrap();
    for b in [&b1, &b2] {
        until(&b.view, "t assigned over two brokers", |s| {
            s.settled() && leader_counts(s) == BTreeMap::from([(1, 2), (2, 2)])
        })
        .await;
    }
    let before = b1.view.state();

    etcd.kill();
    let killed = Instant::now();
    // Calls fail, retriably, within their bound instead of hanging.
    let bounded = REQUEST_TIMEOUT * 3;
    let err = tokio::time::timeout(bounded, topics.create("u", 1, 1, BTreeMap::new()))
        .await
        .expect("create hung while etcd was down")
        .expect_err("create succeeded without etcd");
    assert!(err.is_retriable(), "{err}");
    let err = tokio::time::timeout(bounded, join(&url, 3))
        .await
        .expect("join hung while etcd was down")
        .err()
        .expect("joined without etcd");
    assert!(err.is_retriable(), "{err}");
    let blocks = ProducerIdBlocks::new(b2.member.etcd().clone());
    let err = tokio::time::timeout(bounded, blocks.allocate(10))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_retriable(), "{err}");
    let err = tokio::time::timeout(bounded, b1.member.release(topic.id, 0, 0))
        .await
        .unwrap()
        .unwrap_err();
    assert!(err.is_retriable(), "{err}");

    // Unable to renew, each member declares its lease lost within one TTL
    // (plus scheduling slack), so it stops serving before etcd could move on.
    for b in [&b1, &b2] {
        until_lease(&b.member, "lease lost", |s| s == LeaseState::Lost).await;
    }
    let lost_after = killed.elapsed();
    assert!(
        lost_after <= TTL + Duration::from_secs(1),
        "lost after {lost_after:?}"
    );
    // The views keep the last state they saw.
    assert_eq!(
        b2.view.leader_of(topic.id, 0),
        before.leader_of(topic.id, 0)
    );

    etcd.spawn();
    let mut revisions = Vec::new();
    for b in [&b1, &b2] {
        let live = until_lease(&b.member, "registered again", |s| {
            matches!(s, LeaseState::Live { .. })
        })
        .await;
        let LeaseState::Live { revision, .. } = live else {
            unreachable!()
        };
        revisions.push(revision);
    }
    let newest = *revisions.iter().max().unwrap();
    for b in [&b1, &b2] {
        until(&b.view, "converged after the outage", |s| {
            s.revision >= newest
                && broker_ids(s) == [1, 2]
                && s.controller.is_some()
                && s.settled()
                && leader_counts(s).values().sum::<usize>() == 4
        })
        .await;
    }
    let deadline = Instant::now() + SOON;
    loop {
        match topics.create("u", 1, 1, BTreeMap::new()).await {
            Ok(_) => break,
            Err(e) if e.is_retriable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
    until(&b2.view, "u assigned", |s| {
        s.topics.contains_key("u") && s.settled()
    })
    .await;
}
