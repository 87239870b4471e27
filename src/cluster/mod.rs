//! Cluster mode: several brokers on one object store, coordinated through etcd.
//!
//! Sealed segments already live in the object store, so brokers need not copy
//! data to each other: what they must agree on is small metadata — who is
//! alive, who leads each partition and at which leader epoch, which topics
//! exist, which producer ids are taken. Agreement is the hard part of a
//! cluster, so it is delegated to etcd rather than reinvented: every decision
//! is an etcd transaction that compares the revisions it was based on, and
//! liveness is an etcd lease. Data never goes through etcd.
//!
//! Layout under the prefix of the `--cluster etcd://…/prefix` URL:
//!
//! ```text
//! <prefix>/brokers/<node_id>          BrokerInfo JSON, under the broker's lease
//! <prefix>/controller                 {"node_id"}, under the controller's lease
//! <prefix>/topics/<name>              TopicRecord JSON {id, partitions, replication_factor, config}
//! <prefix>/assignment/<topic_id>      {partition: {leader, epoch, handover_to?}}
//! <prefix>/released/<topic_id>/<p>    {leader, epoch}: "I stopped serving this epoch"
//! <prefix>/producer_ids/next          first producer id not yet handed out
//! <prefix>/access                     ACLs and client quotas (`access::AccessDoc` JSON)
//! <prefix>/broker_configs/default      dynamic broker configs, the cluster default (JSON map)
//! <prefix>/broker_configs/<node_id>    dynamic broker configs of one broker (JSON map)
//! <prefix>/features/finalized          finalized feature levels (JSON map)
//! <prefix>/group_configs/<group>        one group's config overrides (JSON map)
//! ```
//!
//! The pieces, each usable and testable alone:
//! - [`ClusterUrl`] parses the flag.
//! - [`Kv`] is what the cluster needs of etcd: [`EtcdKv`] is a real etcd,
//!   [`MemoryKv`] an in-memory one for deterministic tests.
//! - [`Etcd`] is the connection with bounded request timeouts: etcd being
//!   unreachable turns into a retriable [`ClusterError::Unavailable`], never a
//!   hang.
//! - [`Member`] registers the broker under a lease, keeps it alive, reports
//!   losing it on a `watch` channel, and registers again when etcd is back.
//! - [`Controller`] elects one controller (a create-only key under the
//!   member's lease) which runs [`plan`] — a pure function — over what it
//!   read and writes the result fenced by its election revision.
//! - [`TopicStore`] and [`ProducerIdBlocks`] are compare-and-swap stores.
//! - [`ClusterView`] mirrors everything above through one watch, for the
//!   request path to read without touching etcd.
//!
//! # Leadership handover
//!
//! A partition may have only one serving leader per epoch, and a new leader
//! may start only once the old one has stopped. Two ways guarantee it:
//! - The old leader's lease is gone (crash, network cut, or a graceful leave,
//!   which stops serving everything *before* revoking the lease). A broker
//!   treats its lease as lost `ttl` after the last keep-alive that etcd
//!   acknowledged was *sent*, which is never later than etcd expiring it, so it
//!   has stopped before the controller can reassign. The controller then moves
//!   the partition with `epoch + 1`.
//! - Rebalancing towards a newcomer (the old leader is alive): the controller
//!   only sets `handover_to` on the entry; leader and epoch stay. The old
//!   leader sees it in its view, stops serving, and writes a release
//!   ([`Member::release`]) naming the leader and epoch it stopped. Only then
//!   does the controller write `leader = handover_to, epoch + 1` and delete the
//!   release. A release is a promise never to serve that epoch again, so the
//!   controller honours it even if the handover was meanwhile cancelled.
//!
//! A broker serves a partition only while its lease is live, its view has
//! caught up at least to the revision of its registration, and the view says
//! it leads the partition.

mod access;
mod assignment;
mod broker_configs;
mod controller;
mod error;
mod etcd;
mod kv;
mod member;
mod memory;
mod node;
mod producer_ids;
mod state;
mod topics;
mod url;
mod view;

pub use access::{EtcdAccess, POLL as ACCESS_POLL};
pub use assignment::{plan, replicas, Assignment, PartitionLeader, ReleaseAck, TopicAssignment};
pub use broker_configs::BrokerConfigStore;
pub use controller::{Controller, Term};
pub use error::{ClusterError, Result};
pub use etcd::{Etcd, Keys};
pub use kv::{Compare, EtcdKv, Event, KeyValue, Kv, Op, Txn, TxnResult, Watch, WatchBatch};
pub use member::{BrokerInfo, Endpoint, LeaseClock, LeaseState, Member, MemberOptions};
pub use memory::{MemoryEtcd, MemoryKv};
pub use node::ClusterNode;
pub use producer_ids::ProducerIdBlocks;
pub use state::{ClusterState, LedPartition, Release, Versioned};
pub use topics::{TopicRecord, TopicStore};
pub use url::ClusterUrl;
pub use view::ClusterView;

/// A broker's id, as in Kafka's `broker.id`.
pub type NodeId = i32;
