//! The transaction APIs a producer and the admin tools use: InitProducerId
//! with a transactional id, AddPartitionsToTxn, AddOffsetsToTxn,
//! TxnOffsetCommit, EndTxn, DescribeTransactions and ListTransactions,
//! translated to and from the transaction coordinator (and, for
//! TxnOffsetCommit, the group coordinator). Also the one task that writes
//! the coordinator's COMMIT/ABORT markers: through the WriteTxnMarkers
//! handler for partitions this broker leads, and as a WriteTxnMarkers
//! request to the leader for the others, until every partition has its
//! marker.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::add_partitions_to_txn_request::AddPartitionsToTxnTopic;
use kafka_protocol::messages::add_partitions_to_txn_response::{
    AddPartitionsToTxnPartitionResult, AddPartitionsToTxnResult, AddPartitionsToTxnTopicResult,
};
use kafka_protocol::messages::describe_transactions_response::{self, TopicData};
use kafka_protocol::messages::list_transactions_response;
use kafka_protocol::messages::txn_offset_commit_response::{
    TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
};
use kafka_protocol::messages::write_txn_markers_request::{
    WritableTxnMarker, WritableTxnMarkerTopic,
};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use tokio::sync::{mpsc, watch};

use super::authorize::{
    refusal_or, split, Resource, CLUSTER_DENIED, GROUP_DENIED, TOPIC_DENIED, TXN_ID_DENIED,
};
use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::{Broker, Route};
use crate::access::acl::{Operation, ResourceType};
use crate::coordinator::store::OFFSETS_TOPIC;
use crate::coordinator::txn::state::{TxnError, TxnState};
use crate::coordinator::txn::MarkerJob;
use crate::coordinator::{Committer, OffsetCommit};

pub(super) const ADD_PARTITIONS_TO_TXN: Api = api!(
    AddPartitionsToTxnRequest,
    0..=5,
    later(handle_add_partitions_to_txn)
);
pub(super) const ADD_OFFSETS_TO_TXN: Api = api!(
    AddOffsetsToTxnRequest,
    0..=4,
    later(handle_add_offsets_to_txn)
);
pub(super) const END_TXN: Api = api!(
    EndTxnRequest,
    0..=5,
    later(|b, r, cx| end_txn(b.clone(), r, cx.version)),
    acl(
        Operation::Write,
        Resource::TransactionalId(|r| &r.transactional_id),
        |_| { EndTxnResponse::default().with_error_code(TXN_ID_DENIED) }
    )
);
pub(super) const TXN_OFFSET_COMMIT: Api = api!(
    TxnOffsetCommitRequest,
    0..=6,
    later(handle_txn_offset_commit)
);
pub(super) const DESCRIBE_TRANSACTIONS: Api = api!(
    DescribeTransactionsRequest,
    0..=0,
    ready(handle_describe_transactions)
);
pub(super) const LIST_TRANSACTIONS: Api = api!(
    ListTransactionsRequest,
    0..=2,
    ready(handle_list_transactions)
);

error_codes! {
    AddPartitionsToTxnResponse => |r, f| {
        f(r.error_code);
        let topics = r.results_by_transaction.iter().flat_map(|t| &t.topic_results);
        for t in topics.chain(&r.results_by_topic_v3_and_below) {
            t.results_by_partition.iter().for_each(|p| f(p.partition_error_code));
        }
    };
    AddOffsetsToTxnResponse => |r, f| f(r.error_code);
    EndTxnResponse => |r, f| f(r.error_code);
    TxnOffsetCommitResponse => |r, f| for t in &r.topics {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
    DescribeTransactionsResponse => |r, f| r.transaction_states.iter().for_each(|t| f(t.error_code));
    ListTransactionsResponse => |r, f| f(r.error_code);
}

fn handle_add_partitions_to_txn(
    b: &Arc<Broker>,
    r: AddPartitionsToTxnRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = AddPartitionsToTxnResponse> + Send + 'static {
    refusal_or(authorize_add_partitions_to_txn(b, cx, &r), || {
        add_partitions_to_txn(b.clone(), r, cx.version)
    })
}

fn handle_add_offsets_to_txn(
    b: &Arc<Broker>,
    r: AddOffsetsToTxnRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = AddOffsetsToTxnResponse> + Send + 'static {
    refusal_or(authorize_add_offsets_to_txn(b, cx, &r), || {
        add_offsets_to_txn(b.clone(), r, cx.version)
    })
}

/// TxnOffsetCommit; from v6 topics are named by id (resolved to names
/// first, as for OffsetCommit v10, and answered by id again).
fn handle_txn_offset_commit(
    b: &Arc<Broker>,
    mut r: TxnOffsetCommitRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = TxnOffsetCommitResponse> + Send + 'static {
    let by_id = cx.version >= 6;
    let (unknown, ids) = if by_id {
        super::groups::name_topics_by_id(b, &mut r.topics, |t| (t.topic_id, &mut t.name))
    } else {
        Default::default()
    };
    let unknown: Vec<_> = unknown
        .into_iter()
        .map(|t| {
            let code = ResponseError::UnknownTopicId.code();
            TxnOffsetCommitResponseTopic::default()
                .with_topic_id(t.topic_id)
                .with_partitions(partition_codes(&t.partitions, code))
        })
        .collect();
    let (r, denied) = authorize_txn_offset_commit(b, cx, r);
    let pending = txn_offset_commit(b.clone(), r, cx.version);
    async move {
        let mut resp = pending.await;
        resp.topics.extend(denied);
        if by_id {
            for t in &mut resp.topics {
                t.topic_id = ids.get(t.name.as_str()).copied().unwrap_or_default();
            }
        }
        resp.topics.extend(unknown);
        resp
    }
}

/// Every partition of a TxnOffsetCommit topic answered with `code`.
fn partition_codes(
    partitions: &[txn_offset_commit_request::TxnOffsetCommitRequestPartition],
    code: i16,
) -> Vec<TxnOffsetCommitResponsePartition> {
    partitions
        .iter()
        .map(|p| {
            TxnOffsetCommitResponsePartition::default()
                .with_partition_index(p.partition_index)
                .with_error_code(code)
        })
        .collect()
}

fn handle_describe_transactions(
    b: &Arc<Broker>,
    r: DescribeTransactionsRequest,
    cx: &Ctx<'_>,
) -> DescribeTransactionsResponse {
    let mut resp = describe_transactions(b, r);
    filter_describe_transactions(b, cx, &mut resp);
    resp
}

fn handle_list_transactions(
    b: &Arc<Broker>,
    r: ListTransactionsRequest,
    cx: &Ctx<'_>,
) -> ListTransactionsResponse {
    let mut resp = list_transactions(b, r, cx.version);
    filter_list_transactions(b, cx, &mut resp);
    resp
}

/// AddPartitionsToTxn. v0–v3 (a producer): WRITE on the transactional id and
/// on every topic; any refusal refuses the request whole, the refused
/// partitions with their error and the others with OPERATION_NOT_ATTEMPTED,
/// as Kafka does. v4+ (brokers, batched): CLUSTER_ACTION on the cluster.
fn authorize_add_partitions_to_txn(
    b: &Broker,
    cx: &Ctx<'_>,
    req: &AddPartitionsToTxnRequest,
) -> Option<AddPartitionsToTxnResponse> {
    use add_partitions_to_txn_response::{
        AddPartitionsToTxnPartitionResult, AddPartitionsToTxnTopicResult,
    };
    if cx.version >= 4 {
        return (!b.on_cluster(cx, Operation::ClusterAction))
            .then(|| AddPartitionsToTxnResponse::default().with_error_code(CLUSTER_DENIED));
    }
    let id_ok = b.may_write_transactional_id(cx, &req.v3_and_below_transactional_id);
    let topic_ok = |name: &str| id_ok && b.on_topic(cx, Operation::Write, name);
    if req.v3_and_below_topics.iter().all(|t| topic_ok(&t.name)) {
        return None;
    }
    let not_attempted = ResponseError::OperationNotAttempted.code();
    let results = req
        .v3_and_below_topics
        .iter()
        .map(|t| {
            let code = match (id_ok, topic_ok(&t.name)) {
                (false, _) => TXN_ID_DENIED,
                (true, false) => TOPIC_DENIED,
                (true, true) => not_attempted,
            };
            AddPartitionsToTxnTopicResult::default()
                .with_name(t.name.clone())
                .with_results_by_partition(
                    t.partitions
                        .iter()
                        .map(|p| {
                            AddPartitionsToTxnPartitionResult::default()
                                .with_partition_index(*p)
                                .with_partition_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    Some(AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results))
}

/// AddOffsetsToTxn: WRITE on the transactional id, READ on the group.
fn authorize_add_offsets_to_txn(
    b: &Broker,
    cx: &Ctx<'_>,
    req: &AddOffsetsToTxnRequest,
) -> Option<AddOffsetsToTxnResponse> {
    let code = if !b.may_write_transactional_id(cx, &req.transactional_id) {
        TXN_ID_DENIED
    } else if !b.on_group(cx, Operation::Read, &req.group_id) {
        GROUP_DENIED
    } else {
        return None;
    };
    Some(AddOffsetsToTxnResponse::default().with_error_code(code))
}

/// TxnOffsetCommit: WRITE on the transactional id (when given) and READ on
/// the group, else every partition is refused with that error; then READ on
/// each topic, the refused topics answered here and the rest committed.
fn authorize_txn_offset_commit(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: TxnOffsetCommitRequest,
) -> (
    TxnOffsetCommitRequest,
    Vec<txn_offset_commit_response::TxnOffsetCommitResponseTopic>,
) {
    let whole = if !req.transactional_id.is_empty()
        && !b.may_write_transactional_id(cx, &req.transactional_id)
    {
        Some(TXN_ID_DENIED)
    } else if !b.on_group(cx, Operation::Read, &req.group_id) {
        Some(GROUP_DENIED)
    } else {
        None
    };
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        whole.is_none() && b.on_topic(cx, Operation::Read, &t.name)
    });
    req.topics = ok;
    let code = whole.unwrap_or(TOPIC_DENIED);
    let denied = denied
        .into_iter()
        .map(|t| {
            TxnOffsetCommitResponseTopic::default()
                .with_partitions(partition_codes(&t.partitions, code))
                .with_name(t.name)
        })
        .collect();
    (req, denied)
}

/// DescribeTransactions: DESCRIBE on each transactional id.
fn filter_describe_transactions(b: &Broker, cx: &Ctx<'_>, resp: &mut DescribeTransactionsResponse) {
    for s in &mut resp.transaction_states {
        if !b.allowed(
            cx,
            Operation::Describe,
            ResourceType::TransactionalId,
            &s.transactional_id,
        ) {
            *s = describe_transactions_response::TransactionState::default()
                .with_transactional_id(s.transactional_id.clone())
                .with_error_code(TXN_ID_DENIED)
                .with_producer_id((-1).into())
                .with_producer_epoch(-1)
                .with_transaction_start_time_ms(-1);
        }
    }
}

/// ListTransactions: only the ids the principal may DESCRIBE.
fn filter_list_transactions(b: &Broker, cx: &Ctx<'_>, resp: &mut ListTransactionsResponse) {
    resp.transaction_states.retain(|s| {
        b.allowed(
            cx,
            Operation::Describe,
            ResourceType::TransactionalId,
            &s.transactional_id,
        )
    });
}

/// Kafka's code for a coordinator error. Before KIP-588 (InitProducerId v4,
/// AddPartitionsToTxn, AddOffsetsToTxn and EndTxn v2) a fenced producer is
/// told INVALID_PRODUCER_EPOCH.
fn code(e: &TxnError, fenced_code_known: bool) -> i16 {
    match e {
        TxnError::ConcurrentTransactions => ResponseError::ConcurrentTransactions,
        TxnError::InvalidProducerIdMapping => ResponseError::InvalidProducerIdMapping,
        TxnError::ProducerFenced if fenced_code_known => ResponseError::ProducerFenced,
        TxnError::ProducerFenced => ResponseError::InvalidProducerEpoch,
        TxnError::InvalidTxnState => ResponseError::InvalidTxnState,
        TxnError::InvalidTransactionTimeout => ResponseError::InvalidTransactionTimeout,
        TxnError::TransactionalIdNotFound => ResponseError::TransactionalIdNotFound,
        TxnError::NotCoordinator => ResponseError::NotCoordinator,
        TxnError::LoadInProgress => ResponseError::CoordinatorLoadInProgress,
        TxnError::NoProducerId(_) | TxnError::Storage(_) => ResponseError::CoordinatorNotAvailable,
    }
    .code()
}

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

/// InitProducerId for a transactional producer.
pub(super) async fn init_producer_id(
    broker: Arc<Broker>,
    req: InitProducerIdRequest,
    version: i16,
) -> InitProducerIdResponse {
    let resp = InitProducerIdResponse::default();
    let id = req
        .transactional_id
        .as_ref()
        .map(|t| t.to_string())
        .unwrap_or_default();
    let failed = |code: i16| {
        InitProducerIdResponse::default()
            .with_error_code(code)
            .with_producer_id(ProducerId(-1))
            .with_producer_epoch(-1)
    };
    if id.is_empty() {
        return failed(ResponseError::InvalidRequest.code());
    }
    let expected = (req.producer_id.0 >= 0 && req.producer_epoch >= 0)
        .then_some((req.producer_id.0, req.producer_epoch));
    match broker
        .txn
        .init_producer_id(&id, req.transaction_timeout_ms, expected)
        .await
    {
        Ok((pid, epoch)) => resp
            .with_producer_id(ProducerId(pid))
            .with_producer_epoch(epoch),
        Err(e) => {
            if !matches!(
                e,
                TxnError::ConcurrentTransactions | TxnError::NotCoordinator
            ) {
                tracing::info!(transactional_id = %id, error = %e, "InitProducerId refused");
            }
            failed(code(&e, version >= 4))
        }
    }
}

/// Whether a partition exists, for AddPartitionsToTxn.
fn known(broker: &Broker, topic: &str, partition: i32) -> bool {
    broker
        .catalog
        .topic(topic)
        .is_some_and(|t| t.partition(partition).is_some())
}

/// One transaction's partitions: added (or verified), each with its code.
async fn add_one(
    broker: &Broker,
    id: &str,
    producer_id: i64,
    producer_epoch: i16,
    verify_only: bool,
    topics: &[AddPartitionsToTxnTopic],
    version: i16,
) -> Vec<AddPartitionsToTxnTopicResult> {
    let wanted: Vec<(String, i32)> = topics
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| (t.name.to_string(), *p)))
        .collect();
    let mut codes: BTreeMap<(String, i32), i16> = BTreeMap::new();
    if verify_only {
        for tp in &wanted {
            let c = broker
                .txn
                .verify_partition(id, producer_id, producer_epoch, tp)
                .err()
                .map_or(0, |e| code(&e, true));
            codes.insert(tp.clone(), c);
        }
    } else {
        let unknown: Vec<&(String, i32)> = wanted
            .iter()
            .filter(|(t, p)| !known(broker, t, *p))
            .collect();
        if !unknown.is_empty() {
            // As Kafka: the unknown partitions fail, the others are not attempted.
            for tp in &wanted {
                let c = if unknown.contains(&tp) {
                    ResponseError::UnknownTopicOrPartition
                } else {
                    ResponseError::OperationNotAttempted
                };
                codes.insert(tp.clone(), c.code());
            }
        } else {
            // v4+ comes from brokers: the partitions a transactions v2
            // producer wrote to first.
            let txn_version = if version >= 4 { 2 } else { 0 };
            let c = broker
                .txn
                .add_partitions(id, producer_id, producer_epoch, &wanted, txn_version)
                .await
                .err()
                .map_or(0, |e| code(&e, version >= 2));
            codes.extend(wanted.iter().map(|tp| (tp.clone(), c)));
        }
    }
    let mut by_topic: Vec<AddPartitionsToTxnTopicResult> = Vec::new();
    for ((topic, partition), c) in codes {
        let r = AddPartitionsToTxnPartitionResult::default()
            .with_partition_index(partition)
            .with_partition_error_code(c);
        match by_topic.last_mut() {
            Some(t) if t.name.as_str() == topic => t.results_by_partition.push(r),
            _ => by_topic.push(
                AddPartitionsToTxnTopicResult::default()
                    .with_name(TopicName(s(&topic)))
                    .with_results_by_partition(vec![r]),
            ),
        }
    }
    by_topic
}

/// AddPartitionsToTxn: v0–v3 from a producer (one transaction), v4+ batched
/// (several transactions, possibly verify-only, as brokers send them).
pub(super) async fn add_partitions_to_txn(
    broker: Arc<Broker>,
    req: AddPartitionsToTxnRequest,
    version: i16,
) -> AddPartitionsToTxnResponse {
    if version <= 3 {
        let results = add_one(
            &broker,
            &req.v3_and_below_transactional_id,
            req.v3_and_below_producer_id.0,
            req.v3_and_below_producer_epoch,
            false,
            &req.v3_and_below_topics,
            version,
        )
        .await;
        return AddPartitionsToTxnResponse::default().with_results_by_topic_v3_and_below(results);
    }
    let mut out = Vec::with_capacity(req.transactions.len());
    for t in &req.transactions {
        let results = add_one(
            &broker,
            &t.transactional_id,
            t.producer_id.0,
            t.producer_epoch,
            t.verify_only,
            &t.topics,
            version,
        )
        .await;
        out.push(
            AddPartitionsToTxnResult::default()
                .with_transactional_id(t.transactional_id.clone())
                .with_topic_results(results),
        );
    }
    AddPartitionsToTxnResponse::default().with_results_by_transaction(out)
}

/// The partition of `__consumer_offsets` that holds a group's offsets
/// (there is one).
fn offsets_partition() -> (String, i32) {
    (OFFSETS_TOPIC.to_string(), 0)
}

/// AddOffsetsToTxn: the group's offsets partition joins the transaction.
pub(super) async fn add_offsets_to_txn(
    broker: Arc<Broker>,
    req: AddOffsetsToTxnRequest,
    version: i16,
) -> AddOffsetsToTxnResponse {
    let result = if req.group_id.is_empty() {
        Err(ResponseError::InvalidGroupId.code())
    } else {
        broker
            .txn
            .add_partitions(
                &req.transactional_id,
                req.producer_id.0,
                req.producer_epoch,
                &[offsets_partition()],
                0,
            )
            .await
            .map_err(|e| code(&e, version >= 2))
    };
    AddOffsetsToTxnResponse::default().with_error_code(result.err().unwrap_or(0))
}

/// TxnOffsetCommit: offsets kept pending in the group coordinator until the
/// transaction's COMMIT marker reaches `__consumer_offsets`.
pub(super) async fn txn_offset_commit(
    broker: Arc<Broker>,
    req: TxnOffsetCommitRequest,
    version: i16,
) -> TxnOffsetCommitResponse {
    let all = |c: i16| {
        let topics = req
            .topics
            .iter()
            .map(|t| {
                TxnOffsetCommitResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_partitions(partition_codes(&t.partitions, c))
            })
            .collect();
        TxnOffsetCommitResponse::default().with_topics(topics)
    };
    if version >= 5 {
        // Transactions v2: the commit itself adds the group's offsets
        // partition to the transaction (there is no AddOffsetsToTxn).
        let producer = (req.producer_id.0, req.producer_epoch);
        let added = add_implicitly(
            &broker,
            &req.transactional_id,
            producer,
            vec![offsets_partition()],
        );
        if let Err(c) = added.await {
            return all(match ResponseError::try_from_code(c) {
                Some(ResponseError::NotCoordinator | ResponseError::CoordinatorLoadInProgress) => {
                    ResponseError::CoordinatorNotAvailable.code()
                }
                _ => c,
            });
        }
    } else if broker.txn.is_coordinator() {
        // When this broker also coordinates the transaction, check that the
        // offsets partition was added (AddOffsetsToTxn first), so that no
        // pending offsets wait for a marker that will never come.
        if let Err(e) = broker.txn.check_offsets_partition(
            &req.transactional_id,
            req.producer_id.0,
            req.producer_epoch,
            &offsets_partition(),
        ) {
            let c = match e {
                TxnError::ProducerFenced => ResponseError::ProducerFenced.code(),
                TxnError::LoadInProgress => ResponseError::CoordinatorLoadInProgress.code(),
                _ => ResponseError::InvalidTxnState.code(),
            };
            return all(c);
        }
    }
    let who = Committer {
        member_id: if version >= 3 {
            req.member_id.to_string()
        } else {
            String::new()
        },
        instance_id: req.group_instance_id.as_ref().map(|i| i.to_string()),
        generation: if version >= 3 {
            req.generation_id_or_member_epoch
        } else {
            -1
        },
        version,
    };
    let offsets: Vec<OffsetCommit> = req
        .topics
        .iter()
        .flat_map(|t| {
            t.partitions.iter().map(|p| OffsetCommit {
                topic: t.name.to_string(),
                partition: p.partition_index,
                offset: p.committed_offset,
                leader_epoch: if version >= 2 {
                    p.committed_leader_epoch
                } else {
                    -1
                },
                metadata: p.committed_metadata.as_ref().map(|m| m.to_string()),
            })
        })
        .collect();
    let results = match broker
        .coordinator
        .txn_commit(
            &req.group_id,
            req.producer_id.0,
            req.producer_epoch,
            &who,
            offsets,
        )
        .await
    {
        Ok(r) => r,
        Err(e) => return all(super::groups::error_code(&e)),
    };
    let mut topics: Vec<TxnOffsetCommitResponseTopic> = Vec::new();
    for ((topic, partition), r) in results {
        let p = TxnOffsetCommitResponsePartition::default()
            .with_partition_index(partition)
            .with_error_code(r.err().map_or(0, |e| super::groups::error_code(&e)));
        match topics.last_mut() {
            Some(t) if t.name.as_str() == topic => t.partitions.push(p),
            _ => topics.push(
                TxnOffsetCommitResponseTopic::default()
                    .with_name(TopicName(s(&topic)))
                    .with_partitions(vec![p]),
            ),
        }
    }
    TxnOffsetCommitResponse::default().with_topics(topics)
}

/// EndTxn: answered once PrepareCommit/PrepareAbort is durable. v5 is
/// transactions v2: the epoch is bumped, and the answer carries the
/// producer id and epoch of the producer's next transaction.
pub(super) async fn end_txn(
    broker: Arc<Broker>,
    req: EndTxnRequest,
    version: i16,
) -> EndTxnResponse {
    let result = broker
        .txn
        .end_txn(
            &req.transactional_id,
            req.producer_id.0,
            req.producer_epoch,
            req.committed,
            if version >= 5 { 2 } else { 0 },
        )
        .await;
    let (code, (pid, epoch)) = match result {
        Ok(next) => (0, next),
        Err(e) => (code(&e, version >= 2), (-1, -1)),
    };
    EndTxnResponse::default()
        .with_error_code(code)
        .with_producer_id(ProducerId(pid))
        .with_producer_epoch(epoch)
}

/// Transactions v2: adds `partitions` to the producer's transaction for the
/// Produce or TxnOffsetCommit that reached them first, at this broker's
/// coordinator, or with AddPartitionsToTxn v5 at the broker that leads
/// `__transaction_state`. An error is the coordinator's code (KIP-588's:
/// PRODUCER_FENCED for a fenced producer); COORDINATOR_NOT_AVAILABLE when
/// it could not be asked.
pub(super) async fn add_implicitly(
    broker: &Arc<Broker>,
    id: &str,
    (producer_id, producer_epoch): (i64, i16),
    partitions: Vec<(String, i32)>,
) -> Result<(), i16> {
    if id.is_empty() {
        return Err(ResponseError::InvalidRequest.code());
    }
    if broker.txn.is_coordinator() {
        return broker
            .txn
            .add_partitions(id, producer_id, producer_epoch, &partitions, 2)
            .await
            .map_err(|e| code(&e, true));
    }
    let unavailable = ResponseError::CoordinatorNotAvailable.code();
    let inter = &broker.inter_broker;
    let Some((node, host, port)) = super::groups::txn_coordinator(broker, &inter.listener) else {
        return Err(unavailable);
    };
    let mut topics: Vec<AddPartitionsToTxnTopic> = Vec::new();
    for (topic, p) in partitions {
        match topics.last_mut() {
            Some(t) if t.name.as_str() == topic => t.partitions.push(p),
            _ => topics.push(
                AddPartitionsToTxnTopic::default()
                    .with_name(TopicName(s(&topic)))
                    .with_partitions(vec![p]),
            ),
        }
    }
    let req = AddPartitionsToTxnRequest::default().with_transactions(vec![
        add_partitions_to_txn_request::AddPartitionsToTxnTransaction::default()
            .with_transactional_id(TransactionalId(s(id)))
            .with_producer_id(ProducerId(producer_id))
            .with_producer_epoch(producer_epoch)
            .with_verify_only(false)
            .with_topics(topics),
    ]);
    match inter.add_partitions_to_txn(&host, port, req).await {
        Err(e) => {
            tracing::debug!(coordinator = node, error = %e, "adding partitions to a transaction failed");
            Err(unavailable)
        }
        Ok(resp) if resp.error_code != 0 => Err(resp.error_code),
        Ok(resp) => match resp
            .results_by_transaction
            .iter()
            .flat_map(|t| &t.topic_results)
            .flat_map(|t| &t.results_by_partition)
            .map(|p| p.partition_error_code)
            .find(|c| *c != 0)
        {
            Some(c) => Err(c),
            None => Ok(()),
        },
    }
}

/// DescribeTransactions.
pub(super) fn describe_transactions(
    broker: &Broker,
    req: DescribeTransactionsRequest,
) -> DescribeTransactionsResponse {
    let states = req
        .transactional_ids
        .iter()
        .map(|id| {
            let base = describe_transactions_response::TransactionState::default()
                .with_transactional_id(id.clone())
                .with_producer_id(ProducerId(-1))
                .with_producer_epoch(-1)
                .with_transaction_start_time_ms(-1);
            match broker.txn.describe(id) {
                Ok(d) => base
                    .with_transaction_state(s(d.state.name()))
                    .with_transaction_timeout_ms(d.timeout_ms)
                    .with_transaction_start_time_ms(d.start_ms)
                    .with_producer_id(ProducerId(d.producer_id))
                    .with_producer_epoch(d.producer_epoch)
                    .with_topics(
                        d.partitions
                            .into_iter()
                            .map(|(t, ps)| {
                                TopicData::default()
                                    .with_topic(TopicName(s(&t)))
                                    .with_partitions(ps)
                            })
                            .collect(),
                    ),
                Err(e) => base.with_error_code(code(&e, true)),
            }
        })
        .collect();
    DescribeTransactionsResponse::default().with_transaction_states(states)
}

/// ListTransactions: the transactions this broker coordinates, filtered
/// by state, producer id, running time (v1+) and id pattern (v2+).
pub(super) fn list_transactions(
    broker: &Broker,
    req: ListTransactionsRequest,
    version: i16,
) -> ListTransactionsResponse {
    let resp = ListTransactionsResponse::default();
    let mut states = BTreeSet::new();
    let mut unknown = Vec::new();
    for name in &req.state_filters {
        match TxnState::from_name(name) {
            Some(st) => {
                states.insert(st.id());
            }
            None => unknown.push(name.clone()),
        }
    }
    let pattern = match req
        .transactional_id_pattern
        .as_deref()
        .filter(|p| version >= 2 && !p.is_empty())
    {
        None => None,
        Some(p) => match regex::Regex::new(&format!("^(?:{p})$")) {
            Ok(r) => Some(r),
            Err(_) => return resp.with_error_code(ResponseError::InvalidRegularExpression.code()),
        },
    };
    let listed = match broker.txn.list() {
        Ok(l) => l,
        // Every broker is asked; one that coordinates nothing lists nothing.
        Err(TxnError::NotCoordinator) => Vec::new(),
        Err(e) => return resp.with_error_code(code(&e, true)),
    };
    let now = broker.clock.now_ms();
    let pids: BTreeSet<i64> = req.producer_id_filters.iter().map(|p| p.0).collect();
    let out = listed
        .into_iter()
        .filter(|d| states.is_empty() || states.contains(&d.state.id()))
        .filter(|d| pids.is_empty() || pids.contains(&d.producer_id))
        .filter(|d| {
            version < 1
                || req.duration_filter < 0
                || (d.start_ms >= 0 && now - d.start_ms >= req.duration_filter)
        })
        .filter(|d| {
            pattern
                .as_ref()
                .is_none_or(|r| r.is_match(&d.transactional_id))
        })
        .map(|d| {
            list_transactions_response::TransactionState::default()
                .with_transactional_id(TransactionalId(s(&d.transactional_id)))
                .with_producer_id(ProducerId(d.producer_id))
                .with_transaction_state(s(d.state.name()))
        })
        .collect();
    resp.with_unknown_state_filters(unknown)
        .with_transaction_states(out)
}

/// Writes the markers of every finished transaction the coordinator queues,
/// each in its own task, until `stop`. `delay` holds them back after the
/// EndTxn answer (tests kill the broker in that window).
pub(crate) async fn run_markers(
    broker: Arc<Broker>,
    mut jobs: mpsc::UnboundedReceiver<MarkerJob>,
    delay: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let watch = stop.clone();
    loop {
        let job = tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            job = jobs.recv() => job,
        };
        match job {
            Some(job) => {
                tokio::spawn(send_markers(broker.clone(), job, delay, watch.clone()));
            }
            None => return,
        }
    }
}

const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// Writes one transaction's markers to every partition, retrying those that
/// fail until written (or no longer wanted: another coordinator took over,
/// or finished it), then completes the transaction.
async fn send_markers(
    broker: Arc<Broker>,
    job: MarkerJob,
    delay: Duration,
    mut stop: watch::Receiver<bool>,
) {
    if !delay.is_zero() {
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
    let mut remaining: BTreeSet<(String, i32)> = job.partitions.iter().cloned().collect();
    let mut backoff = Duration::from_millis(50);
    loop {
        if !broker.txn.wants_markers(&job) {
            return;
        }
        if !remaining.is_empty() {
            let written = write_markers(&broker, &job, &remaining).await;
            for tp in written {
                remaining.remove(&tp);
            }
        }
        if remaining.is_empty() {
            match broker.txn.complete_markers(&job) {
                Ok(()) => return,
                Err(TxnError::NotCoordinator) => return,
                Err(e) => {
                    tracing::warn!(transactional_id = %job.transactional_id, error = %e, "could not complete the transaction; will retry")
                }
            }
        }
        tokio::select! {
            _ = stop.wait_for(|s| *s) => return,
            _ = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// One round: the partitions whose marker is now written (or that no
/// longer exist), grouped into one request per leader.
async fn write_markers(
    broker: &Arc<Broker>,
    job: &MarkerJob,
    partitions: &BTreeSet<(String, i32)>,
) -> Vec<(String, i32)> {
    let mut done = Vec::new();
    let mut by_leader: BTreeMap<Option<i32>, Vec<(String, i32)>> = BTreeMap::new();
    for (topic, p) in partitions {
        let Some(t) = broker
            .catalog
            .topic(topic)
            .filter(|t| t.partition(*p).is_some())
        else {
            // Deleted meanwhile: nothing left to mark, as in Kafka.
            done.push((topic.clone(), *p));
            continue;
        };
        let leader = match broker.route(t.id(), *p) {
            Route::Serve(_) => None,
            Route::Elsewhere => match broker
                .cluster
                .as_ref()
                .and_then(|c| c.leader_of(t.id(), *p))
            {
                Some((node, _)) => Some(node),
                None => continue,
            },
        };
        by_leader
            .entry(leader)
            .or_default()
            .push((topic.clone(), *p));
    }
    for (leader, tps) in by_leader {
        let req = marker_request(job, &tps);
        let version = if job.bumped { 2 } else { 1 };
        let resp = match leader {
            None => Ok(super::txn_markers::write_txn_markers(broker.clone(), req).await),
            Some(node) => {
                let inter = &broker.inter_broker;
                let endpoint = super::metadata::brokers(broker, Some(&inter.listener))
                    .into_iter()
                    .find(|(id, _, _)| *id == node);
                match endpoint {
                    Some((_, host, port)) => {
                        inter.write_txn_markers(&host, port, version, req).await
                    }
                    None => continue,
                }
            }
        };
        let resp = match resp {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(leader = ?leader, error = %e, "sending markers failed; will retry");
                continue;
            }
        };
        for marker in resp.markers {
            for t in marker.topics {
                for p in t.partitions {
                    let tp = (t.name.to_string(), p.partition_index);
                    match ResponseError::try_from_code(p.error_code) {
                        None => done.push(tp),
                        // Gone, or the partition's producer moved past this
                        // epoch already: nothing to write there.
                        Some(ResponseError::UnknownTopicOrPartition)
                        | Some(ResponseError::InvalidProducerEpoch) => {
                            tracing::warn!(topic = %tp.0, partition = tp.1, code = p.error_code, transactional_id = %job.transactional_id, "marker not written");
                            done.push(tp)
                        }
                        Some(e) => {
                            tracing::debug!(topic = %tp.0, partition = tp.1, error = ?e, "marker not written yet; will retry")
                        }
                    }
                }
            }
        }
    }
    done
}

fn marker_request(job: &MarkerJob, partitions: &[(String, i32)]) -> WriteTxnMarkersRequest {
    let mut topics: Vec<WritableTxnMarkerTopic> = Vec::new();
    for (topic, p) in partitions {
        match topics.last_mut() {
            Some(t) if t.name.as_str() == topic => t.partition_indexes.push(*p),
            _ => topics.push(
                WritableTxnMarkerTopic::default()
                    .with_name(TopicName(s(topic)))
                    .with_partition_indexes(vec![*p]),
            ),
        }
    }
    WriteTxnMarkersRequest::default().with_markers(vec![WritableTxnMarker::default()
        .with_producer_id(ProducerId(job.producer_id))
        .with_producer_epoch(job.producer_epoch)
        .with_transaction_result(job.commit)
        .with_coordinator_epoch(job.coordinator_epoch)
        .with_transaction_version(if job.bumped { 2 } else { 1 })
        .with_topics(topics)])
}
