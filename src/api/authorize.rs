//! What authorizing a request is made of, shared by the API modules: the
//! checks on a topic, group, transactional id or the cluster, with the
//! operations Kafka's "Operations and Resources on Protocols" table lists,
//! Kafka's error codes for a refusal, and the helpers that split a request
//! into what may be served and what is refused.
//!
//! Each API says what it needs in its own module. A request about one
//! group, one transactional id or the cluster is refused whole, by the
//! `acl(...)` of its dispatch entry (`Resource`) or, where the refusal
//! depends on more than one check, by its handler (`refusal_or`). A request
//! naming several topics or resources is split by its handler into what the
//! principal may touch, which is served, and the rest, which is answered
//! with the item's error and merged into the response (`split`). The
//! handlers' work stays unaware of ACLs. Without `--authorizer` every check
//! passes and the request reaches its handler unchanged.

use std::future::Future;

use futures::future::Either;

use super::dispatch::Ctx;
use super::Broker;
use crate::access::acl::{Operation, ResourceType, CLUSTER_NAME};

pub(super) const TOPIC_DENIED: i16 = 29; // TOPIC_AUTHORIZATION_FAILED
pub(super) const GROUP_DENIED: i16 = 30; // GROUP_AUTHORIZATION_FAILED
pub(super) const CLUSTER_DENIED: i16 = 31; // CLUSTER_AUTHORIZATION_FAILED
pub(super) const TXN_ID_DENIED: i16 = 53; // TRANSACTIONAL_ID_AUTHORIZATION_FAILED

impl Broker {
    pub(crate) fn allowed(
        &self,
        cx: &Ctx<'_>,
        op: Operation,
        kind: ResourceType,
        name: &str,
    ) -> bool {
        self.access
            .authorize(cx.principal, cx.client_host, op, kind, name)
    }
    pub(crate) fn on_topic(&self, cx: &Ctx<'_>, op: Operation, topic: &str) -> bool {
        self.allowed(cx, op, ResourceType::Topic, topic)
    }
    pub(crate) fn on_group(&self, cx: &Ctx<'_>, op: Operation, group: &str) -> bool {
        self.allowed(cx, op, ResourceType::Group, group)
    }
    pub(crate) fn on_cluster(&self, cx: &Ctx<'_>, op: Operation) -> bool {
        self.allowed(cx, op, ResourceType::Cluster, CLUSTER_NAME)
    }
    /// CreateTopics and auto-creation: CREATE on the cluster or on the topic.
    pub(crate) fn may_create_topic(&self, cx: &Ctx<'_>, topic: &str) -> bool {
        self.on_cluster(cx, Operation::Create) || self.on_topic(cx, Operation::Create, topic)
    }
    /// The operations the principal may perform on a resource, as the bit
    /// field (bit n for operation code n) that Metadata, DescribeCluster,
    /// DescribeTopicPartitions and the group descriptions return: Kafka's
    /// `authorizedOperations`, each operation Kafka supports on the resource
    /// type checked alone (all of them when no authorizer runs).
    pub(crate) fn authorized_operations(
        &self,
        cx: &Ctx<'_>,
        kind: ResourceType,
        name: &str,
    ) -> i32 {
        use Operation::*;
        let supported: &[Operation] = match kind {
            ResourceType::Topic => &[
                Read,
                Write,
                Create,
                Describe,
                Delete,
                Alter,
                DescribeConfigs,
                AlterConfigs,
            ],
            ResourceType::Group => &[Read, Describe, Delete, DescribeConfigs, AlterConfigs],
            ResourceType::Cluster => &[
                Create,
                ClusterAction,
                DescribeConfigs,
                AlterConfigs,
                IdempotentWrite,
                Alter,
                Describe,
            ],
            ResourceType::TransactionalId => &[Describe, Write, TwoPhaseCommit],
            ResourceType::DelegationToken => &[Describe],
            ResourceType::User => &[CreateTokens, DescribeTokens],
            ResourceType::Any => &[],
        };
        supported
            .iter()
            .filter(|op| self.allowed(cx, **op, kind, name))
            .fold(0, |bits, op| bits | 1 << (*op as i32))
    }
    /// Transaction APIs (InitProducerId with an id, AddPartitionsToTxn,
    /// AddOffsetsToTxn, EndTxn, TxnOffsetCommit): WRITE on the
    /// transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    pub(crate) fn may_write_transactional_id(&self, cx: &Ctx<'_>, id: &str) -> bool {
        self.allowed(cx, Operation::Write, ResourceType::TransactionalId, id)
    }
}

/// The refusal at once, if there is one, else the handler's future.
pub(super) fn refusal_or<R, F: Future<Output = R>>(
    refusal: Option<R>,
    run: impl FnOnce() -> F,
) -> Either<std::future::Ready<R>, F> {
    match refusal {
        Some(refused) => Either::Left(std::future::ready(refused)),
        None => Either::Right(run()),
    }
}

/// Splits a request's items into those `allowed` and the rest.
pub(super) fn split<T>(items: Vec<T>, allowed: impl Fn(&T) -> bool) -> (Vec<T>, Vec<T>) {
    items.into_iter().partition(|t| allowed(t))
}

/// What the one check covering a whole request is made on, for the
/// `acl(operation, resource, denied)` of a dispatch entry.
pub(super) enum Resource<Req> {
    Cluster,
    /// The group the request names.
    Group(fn(&Req) -> &str),
    /// The transactional id the request names.
    TransactionalId(fn(&Req) -> &str),
}

impl<Req> Resource<Req> {
    pub(super) fn allows(&self, b: &Broker, cx: &Ctx<'_>, op: Operation, request: &Req) -> bool {
        match self {
            Resource::Cluster => b.on_cluster(cx, op),
            Resource::Group(group) => b.on_group(cx, op, group(request)),
            Resource::TransactionalId(id) => {
                b.allowed(cx, op, ResourceType::TransactionalId, id(request))
            }
        }
    }
}
