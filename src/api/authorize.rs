//! Authorization of each API, with the operations Kafka's "Operations and
//! Resources on Protocols" table lists and Kafka's error codes.
//!
//! The handlers stay unaware of ACLs: a request naming several topics is
//! split here into what the principal may touch, which the handler serves,
//! and the rest, which is answered with TOPIC_AUTHORIZATION_FAILED and
//! merged into the handler's response; a request about one group, one
//! transactional id or the cluster is refused whole. Without `--authorizer`
//! every check passes and the request reaches its handler unchanged.
//! The transaction APIs are checked here too: WRITE on the transactional id
//! for what a transactional producer sends, DESCRIBE for what the admin
//! tools read, CLUSTER_ACTION for what brokers send each other.

use std::future::Future;

use futures::future::Either;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

use super::dispatch::Ctx;
use super::Broker;
use crate::access::acl::{Operation, ResourceType, CLUSTER_NAME};

pub const TOPIC_DENIED: i16 = 29; // TOPIC_AUTHORIZATION_FAILED
pub const GROUP_DENIED: i16 = 30; // GROUP_AUTHORIZATION_FAILED
pub const CLUSTER_DENIED: i16 = 31; // CLUSTER_AUTHORIZATION_FAILED
pub const TXN_ID_DENIED: i16 = 53; // TRANSACTIONAL_ID_AUTHORIZATION_FAILED

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
    /// Transaction APIs (InitProducerId with an id, AddPartitionsToTxn,
    /// AddOffsetsToTxn, EndTxn, TxnOffsetCommit): WRITE on the
    /// transactional id, else TRANSACTIONAL_ID_AUTHORIZATION_FAILED.
    pub(crate) fn may_write_transactional_id(&self, cx: &Ctx<'_>, id: &str) -> bool {
        self.allowed(cx, Operation::Write, ResourceType::TransactionalId, id)
    }
}

/// The handler's future, or an answer at once.
pub fn or_deny<R, F: Future<Output = R>>(
    allowed: bool,
    denied: impl FnOnce() -> R,
    run: impl FnOnce() -> F,
) -> Either<std::future::Ready<R>, F> {
    if allowed {
        Either::Right(run())
    } else {
        Either::Left(std::future::ready(denied()))
    }
}

fn split<T>(items: Vec<T>, allowed: impl Fn(&T) -> bool) -> (Vec<T>, Vec<T>) {
    items.into_iter().partition(|t| allowed(t))
}

pub fn produce(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: ProduceRequest,
) -> (ProduceRequest, Vec<produce_response::TopicProduceResponse>) {
    use produce_response::{PartitionProduceResponse, TopicProduceResponse};
    if req
        .transactional_id
        .as_ref()
        .is_some_and(|id| !b.may_write_transactional_id(cx, id))
    {
        // Kafka refuses the whole request: every partition gets the error.
        let denied = std::mem::take(&mut req.topic_data).into_iter().map(|t| {
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_partition_responses(
                    t.partition_data
                        .iter()
                        .map(|p| {
                            PartitionProduceResponse::default()
                                .with_index(p.index)
                                .with_base_offset(-1)
                                .with_error_code(TXN_ID_DENIED)
                        })
                        .collect(),
                )
        });
        return (req, denied.collect());
    }
    let (ok, denied) = split(std::mem::take(&mut req.topic_data), |t| {
        b.on_topic(cx, Operation::Write, &t.name)
    });
    req.topic_data = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            TopicProduceResponse::default()
                .with_name(t.name)
                .with_partition_responses(
                    t.partition_data
                        .iter()
                        .map(|p| {
                            PartitionProduceResponse::default()
                                .with_index(p.index)
                                .with_base_offset(-1)
                                .with_error_code(TOPIC_DENIED)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// Bytes of record data in a produce request, for the produce quota.
pub fn produce_bytes(req: &ProduceRequest) -> u64 {
    req.topic_data
        .iter()
        .flat_map(|t| &t.partition_data)
        .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
        .sum()
}

pub fn fetch(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: FetchRequest,
) -> (FetchRequest, Vec<fetch_response::FetchableTopicResponse>) {
    use fetch_response::{FetchableTopicResponse, PartitionData};
    let name_of = |t: &fetch_request::FetchTopic| -> Option<String> {
        if t.topic_id.is_nil() {
            Some(t.topic.0.to_string())
        } else {
            b.catalog
                .topic_by_id(t.topic_id)
                .map(|t| t.name().to_string())
        }
    };
    // An unknown topic id is the handler's to answer (UNKNOWN_TOPIC_ID).
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        name_of(t).is_none_or(|n| b.on_topic(cx, Operation::Read, &n))
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            FetchableTopicResponse::default()
                .with_topic(t.topic)
                .with_topic_id(t.topic_id)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            PartitionData::default()
                                .with_partition_index(p.partition)
                                .with_error_code(TOPIC_DENIED)
                                .with_high_watermark(-1)
                                .with_last_stable_offset(-1)
                                .with_log_start_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// Bytes of record data in a fetch response, for the fetch quota.
pub fn fetch_bytes(resp: &FetchResponse) -> u64 {
    resp.responses
        .iter()
        .flat_map(|t| &t.partitions)
        .map(|p| p.records.as_ref().map_or(0, |r| r.len() as u64))
        .sum()
}

pub fn list_offsets(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: ListOffsetsRequest,
) -> (
    ListOffsetsRequest,
    Vec<list_offsets_response::ListOffsetsTopicResponse>,
) {
    use list_offsets_response::{ListOffsetsPartitionResponse, ListOffsetsTopicResponse};
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Describe, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            ListOffsetsTopicResponse::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            ListOffsetsPartitionResponse::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(TOPIC_DENIED)
                                .with_offset(-1)
                                .with_timestamp(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// Metadata: topics the principal may not DESCRIBE are left out of a
/// listing and answered TOPIC_AUTHORIZATION_FAILED when asked for by name;
/// an unknown topic is auto-created only with CREATE (else it is unknown).
pub fn metadata(b: &Broker, cx: &Ctx<'_>, mut req: MetadataRequest) -> MetadataResponse {
    use metadata_response::MetadataResponseTopic;
    let listing = match &req.topics {
        None => true,
        Some(l) => cx.version == 0 && l.is_empty(),
    };
    let mut answered = Vec::new();
    if !listing {
        let mut kept = Vec::new();
        for t in req.topics.take().unwrap_or_default() {
            let name = match &t.name {
                Some(n) if t.topic_id.is_nil() => n.0.to_string(),
                _ => match b.catalog.topic_by_id(t.topic_id) {
                    Some(found) => found.name().to_string(),
                    None => {
                        kept.push(t);
                        continue;
                    }
                },
            };
            let exists = b.catalog.topic(&name).is_some();
            let entry = || {
                MetadataResponseTopic::default()
                    .with_name(t.name.clone())
                    .with_topic_id(t.topic_id)
            };
            if exists && !b.on_topic(cx, Operation::Describe, &name) {
                answered.push(entry().with_error_code(TOPIC_DENIED));
            } else if !exists && !b.may_create_topic(cx, &name) {
                let code = if b.on_topic(cx, Operation::Describe, &name) {
                    ResponseError::UnknownTopicOrPartition.code()
                } else {
                    TOPIC_DENIED
                };
                answered.push(entry().with_error_code(code));
            } else {
                kept.push(t);
            }
        }
        if kept.is_empty() && cx.version == 0 {
            // v0 reads an empty list as every topic.
            let mut resp = super::metadata::metadata(b, req, cx.version, cx.listener);
            resp.topics = answered;
            return resp;
        }
        req.topics = Some(kept);
    }
    let mut resp = super::metadata::metadata(b, req, cx.version, cx.listener);
    if listing {
        resp.topics.retain(|t| {
            t.name
                .as_ref()
                .is_none_or(|n| b.on_topic(cx, Operation::Describe, n))
        });
    }
    resp.topics.extend(answered);
    resp
}

pub fn create_topics(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: CreateTopicsRequest,
) -> (
    CreateTopicsRequest,
    Vec<create_topics_response::CreatableTopicResult>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.may_create_topic(cx, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            create_topics_response::CreatableTopicResult::default()
                .with_name(t.name)
                .with_error_code(TOPIC_DENIED)
                .with_error_message(Some(StrBytes::from_static_str("Authorization failed.")))
                .with_num_partitions(-1)
                .with_replication_factor(-1)
        })
        .collect();
    (req, denied)
}

pub fn delete_topics(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DeleteTopicsRequest,
) -> (
    DeleteTopicsRequest,
    Vec<delete_topics_response::DeletableTopicResult>,
) {
    use delete_topics_response::DeletableTopicResult;
    let may = |name: &str| b.on_topic(cx, Operation::Delete, name);
    let (ok, denied) = split(std::mem::take(&mut req.topic_names), |n| may(n));
    req.topic_names = ok;
    let mut out: Vec<DeletableTopicResult> = denied
        .into_iter()
        .map(|n| {
            DeletableTopicResult::default()
                .with_name(Some(n))
                .with_error_code(TOPIC_DENIED)
        })
        .collect();
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        let name = match &t.name {
            Some(n) => Some(n.0.to_string()),
            None => b
                .catalog
                .topic_by_id(t.topic_id)
                .map(|t| t.name().to_string()),
        };
        name.is_none_or(|n| may(&n))
    });
    req.topics = ok;
    out.extend(denied.into_iter().map(|t| {
        DeletableTopicResult::default()
            .with_name(t.name)
            .with_topic_id(t.topic_id)
            .with_error_code(TOPIC_DENIED)
    }));
    (req, out)
}

pub fn create_partitions(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: CreatePartitionsRequest,
) -> (
    CreatePartitionsRequest,
    Vec<create_partitions_response::CreatePartitionsTopicResult>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Alter, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            create_partitions_response::CreatePartitionsTopicResult::default()
                .with_name(t.name)
                .with_error_code(TOPIC_DENIED)
        })
        .collect();
    (req, denied)
}

pub fn delete_records(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DeleteRecordsRequest,
) -> (
    DeleteRecordsRequest,
    Vec<delete_records_response::DeleteRecordsTopicResult>,
) {
    use delete_records_response::{DeleteRecordsPartitionResult, DeleteRecordsTopicResult};
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Delete, &t.name)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            DeleteRecordsTopicResult::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            DeleteRecordsPartitionResult::default()
                                .with_partition_index(p.partition_index)
                                .with_low_watermark(-1)
                                .with_error_code(TOPIC_DENIED)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

pub fn offset_for_leader_epoch(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: OffsetForLeaderEpochRequest,
) -> (
    OffsetForLeaderEpochRequest,
    Vec<offset_for_leader_epoch_response::OffsetForLeaderTopicResult>,
) {
    use offset_for_leader_epoch_response::{EpochEndOffset, OffsetForLeaderTopicResult};
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        b.on_topic(cx, Operation::Describe, &t.topic)
    });
    req.topics = ok;
    let denied = denied
        .into_iter()
        .map(|t| {
            OffsetForLeaderTopicResult::default()
                .with_topic(t.topic)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            EpochEndOffset::default()
                                .with_partition(p.partition)
                                .with_error_code(TOPIC_DENIED)
                                .with_leader_epoch(-1)
                                .with_end_offset(-1)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// Config resources: topics (2) need the topic operation, brokers (4) and
/// broker loggers (8) the cluster one.
fn config_resource_allowed(
    b: &Broker,
    cx: &Ctx<'_>,
    kind: i8,
    name: &str,
    op: Operation,
) -> Result<(), i16> {
    match kind {
        2 if b.on_topic(cx, op, name) => Ok(()),
        2 => Err(TOPIC_DENIED),
        _ if b.on_cluster(cx, op) => Ok(()),
        _ => Err(CLUSTER_DENIED),
    }
}

pub fn describe_configs(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DescribeConfigsRequest,
) -> (
    DescribeConfigsRequest,
    Vec<describe_configs_response::DescribeConfigsResult>,
) {
    let mut denied = Vec::new();
    req.resources.retain(|r| {
        match config_resource_allowed(
            b,
            cx,
            r.resource_type,
            &r.resource_name,
            Operation::DescribeConfigs,
        ) {
            Ok(()) => true,
            Err(code) => {
                denied.push(
                    describe_configs_response::DescribeConfigsResult::default()
                        .with_error_code(code)
                        .with_resource_type(r.resource_type)
                        .with_resource_name(r.resource_name.clone()),
                );
                false
            }
        }
    });
    (req, denied)
}

pub fn alter_configs(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: AlterConfigsRequest,
) -> (
    AlterConfigsRequest,
    Vec<alter_configs_response::AlterConfigsResourceResponse>,
) {
    let mut denied = Vec::new();
    req.resources.retain(|r| {
        match config_resource_allowed(
            b,
            cx,
            r.resource_type,
            &r.resource_name,
            Operation::AlterConfigs,
        ) {
            Ok(()) => true,
            Err(code) => {
                denied.push(
                    alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_error_code(code)
                        .with_resource_type(r.resource_type)
                        .with_resource_name(r.resource_name.clone()),
                );
                false
            }
        }
    });
    (req, denied)
}

pub fn incremental_alter_configs(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: IncrementalAlterConfigsRequest,
) -> (
    IncrementalAlterConfigsRequest,
    Vec<incremental_alter_configs_response::AlterConfigsResourceResponse>,
) {
    let mut denied = Vec::new();
    req.resources.retain(|r| {
        match config_resource_allowed(
            b,
            cx,
            r.resource_type,
            &r.resource_name,
            Operation::AlterConfigs,
        ) {
            Ok(()) => true,
            Err(code) => {
                denied.push(
                    incremental_alter_configs_response::AlterConfigsResourceResponse::default()
                        .with_error_code(code)
                        .with_resource_type(r.resource_type)
                        .with_resource_name(r.resource_name.clone()),
                );
                false
            }
        }
    });
    (req, denied)
}

/// OffsetCommit: READ on the group (else every partition gets
/// GROUP_AUTHORIZATION_FAILED) and READ on each topic.
pub fn offset_commit(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: OffsetCommitRequest,
) -> (
    OffsetCommitRequest,
    Vec<offset_commit_response::OffsetCommitResponseTopic>,
) {
    use offset_commit_response::{OffsetCommitResponsePartition, OffsetCommitResponseTopic};
    let group_ok = b.on_group(cx, Operation::Read, &req.group_id);
    let (ok, denied) = split(std::mem::take(&mut req.topics), |t| {
        group_ok && b.on_topic(cx, Operation::Read, &t.name)
    });
    req.topics = ok;
    let code = if group_ok { TOPIC_DENIED } else { GROUP_DENIED };
    let denied = denied
        .into_iter()
        .map(|t| {
            OffsetCommitResponseTopic::default()
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            OffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// OffsetFetch: DESCRIBE on each group; topics the principal may not
/// DESCRIBE are left out of the answer, as Kafka does.
pub fn offset_fetch_filter(
    b: &Broker,
    cx: &Ctx<'_>,
    resp: &mut OffsetFetchResponse,
    single_group: &str,
) {
    if !single_group.is_empty() && !b.on_group(cx, Operation::Describe, single_group) {
        resp.topics.clear();
        resp.error_code = GROUP_DENIED;
    }
    resp.topics
        .retain(|t| b.on_topic(cx, Operation::Describe, &t.name));
    for g in &mut resp.groups {
        if !b.on_group(cx, Operation::Describe, &g.group_id) {
            g.topics.clear();
            g.error_code = GROUP_DENIED;
        }
        g.topics
            .retain(|t| b.on_topic(cx, Operation::Describe, &t.name));
    }
}

pub fn list_groups_filter(b: &Broker, cx: &Ctx<'_>, resp: &mut ListGroupsResponse) {
    if !b.on_cluster(cx, Operation::Describe) {
        resp.groups
            .retain(|g| b.on_group(cx, Operation::Describe, &g.group_id));
    }
}

pub fn describe_groups(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DescribeGroupsRequest,
) -> (
    DescribeGroupsRequest,
    Vec<describe_groups_response::DescribedGroup>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.groups), |g| {
        b.on_group(cx, Operation::Describe, g)
    });
    req.groups = ok;
    let denied = denied
        .into_iter()
        .map(|g| {
            describe_groups_response::DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED)
        })
        .collect();
    (req, denied)
}

pub fn consumer_group_describe(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: ConsumerGroupDescribeRequest,
) -> (
    ConsumerGroupDescribeRequest,
    Vec<consumer_group_describe_response::DescribedGroup>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.group_ids), |g| {
        b.on_group(cx, Operation::Describe, g)
    });
    req.group_ids = ok;
    let denied = denied
        .into_iter()
        .map(|g| {
            consumer_group_describe_response::DescribedGroup::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED)
        })
        .collect();
    (req, denied)
}

pub fn delete_groups(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: DeleteGroupsRequest,
) -> (
    DeleteGroupsRequest,
    Vec<delete_groups_response::DeletableGroupResult>,
) {
    let (ok, denied) = split(std::mem::take(&mut req.groups_names), |g| {
        b.on_group(cx, Operation::Delete, g)
    });
    req.groups_names = ok;
    let denied = denied
        .into_iter()
        .map(|g| {
            delete_groups_response::DeletableGroupResult::default()
                .with_group_id(g)
                .with_error_code(GROUP_DENIED)
        })
        .collect();
    (req, denied)
}

/// FindCoordinator: DESCRIBE on the group (key type 0) or the transactional id (1).
pub fn find_coordinator_filter(
    b: &Broker,
    cx: &Ctx<'_>,
    key_type: i8,
    resp: &mut FindCoordinatorResponse,
    single_key: &str,
) {
    let check = |key: &str| -> Option<i16> {
        let (kind, code) = match key_type {
            1 => (ResourceType::TransactionalId, TXN_ID_DENIED),
            _ => (ResourceType::Group, GROUP_DENIED),
        };
        (!b.allowed(cx, Operation::Describe, kind, key)).then_some(code)
    };
    if cx.version < 4 {
        if let Some(code) = check(single_key) {
            *resp = FindCoordinatorResponse::default()
                .with_error_code(code)
                .with_node_id((-1).into());
        }
        return;
    }
    for c in &mut resp.coordinators {
        if let Some(code) = check(&c.key) {
            *c = find_coordinator_response::Coordinator::default()
                .with_key(c.key.clone())
                .with_error_code(code)
                .with_node_id((-1).into());
        }
    }
}

/// InitProducerId: WRITE on the transactional id, or for an idempotent
/// producer IDEMPOTENT_WRITE on the cluster or WRITE on any topic (KIP-679).
pub fn init_producer_id_error(
    b: &Broker,
    cx: &Ctx<'_>,
    req: &InitProducerIdRequest,
) -> Option<i16> {
    match &req.transactional_id {
        Some(id) if !b.may_write_transactional_id(cx, id) => Some(TXN_ID_DENIED),
        Some(_) => None,
        None => {
            let may = b.on_cluster(cx, Operation::IdempotentWrite)
                || !b.access.authorizer_enabled()
                || b.catalog
                    .topics()
                    .iter()
                    .any(|t| b.on_topic(cx, Operation::Write, t.name()));
            (!may).then_some(CLUSTER_DENIED)
        }
    }
}

/// AddPartitionsToTxn. v0–v3 (a producer): WRITE on the transactional id and
/// on every topic; any refusal refuses the request whole, the refused
/// partitions with their error and the others with OPERATION_NOT_ATTEMPTED,
/// as Kafka does. v4+ (brokers, batched): CLUSTER_ACTION on the cluster.
pub fn add_partitions_to_txn(
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
pub fn add_offsets_to_txn(
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

/// EndTxn: WRITE on the transactional id.
pub fn end_txn(b: &Broker, cx: &Ctx<'_>, req: &EndTxnRequest) -> Option<EndTxnResponse> {
    (!b.may_write_transactional_id(cx, &req.transactional_id))
        .then(|| EndTxnResponse::default().with_error_code(TXN_ID_DENIED))
}

/// TxnOffsetCommit: WRITE on the transactional id (when given) and READ on
/// the group, else every partition is refused with that error; then READ on
/// each topic, the refused topics answered here and the rest committed.
pub fn txn_offset_commit(
    b: &Broker,
    cx: &Ctx<'_>,
    mut req: TxnOffsetCommitRequest,
) -> (
    TxnOffsetCommitRequest,
    Vec<txn_offset_commit_response::TxnOffsetCommitResponseTopic>,
) {
    use txn_offset_commit_response::{
        TxnOffsetCommitResponsePartition, TxnOffsetCommitResponseTopic,
    };
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
                .with_name(t.name)
                .with_partitions(
                    t.partitions
                        .iter()
                        .map(|p| {
                            TxnOffsetCommitResponsePartition::default()
                                .with_partition_index(p.partition_index)
                                .with_error_code(code)
                        })
                        .collect(),
                )
        })
        .collect();
    (req, denied)
}

/// WriteTxnMarkers (sent by transaction coordinators): CLUSTER_ACTION on the
/// cluster, else every partition is refused.
pub fn write_txn_markers(
    b: &Broker,
    cx: &Ctx<'_>,
    req: &WriteTxnMarkersRequest,
) -> Option<WriteTxnMarkersResponse> {
    use write_txn_markers_response::{
        WritableTxnMarkerPartitionResult, WritableTxnMarkerResult, WritableTxnMarkerTopicResult,
    };
    if b.on_cluster(cx, Operation::ClusterAction) {
        return None;
    }
    let markers = req
        .markers
        .iter()
        .map(|m| {
            WritableTxnMarkerResult::default()
                .with_producer_id(m.producer_id)
                .with_topics(
                    m.topics
                        .iter()
                        .map(|t| {
                            WritableTxnMarkerTopicResult::default()
                                .with_name(t.name.clone())
                                .with_partitions(
                                    t.partition_indexes
                                        .iter()
                                        .map(|p| {
                                            WritableTxnMarkerPartitionResult::default()
                                                .with_partition_index(*p)
                                                .with_error_code(CLUSTER_DENIED)
                                        })
                                        .collect(),
                                )
                        })
                        .collect(),
                )
        })
        .collect();
    Some(WriteTxnMarkersResponse::default().with_markers(markers))
}

/// DescribeTransactions: DESCRIBE on each transactional id.
pub fn describe_transactions_filter(
    b: &Broker,
    cx: &Ctx<'_>,
    resp: &mut DescribeTransactionsResponse,
) {
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
pub fn list_transactions_filter(b: &Broker, cx: &Ctx<'_>, resp: &mut ListTransactionsResponse) {
    resp.transaction_states.retain(|s| {
        b.allowed(
            cx,
            Operation::Describe,
            ResourceType::TransactionalId,
            &s.transactional_id,
        )
    });
}

/// DescribeProducers: READ on each topic.
pub fn describe_producers_filter(b: &Broker, cx: &Ctx<'_>, resp: &mut DescribeProducersResponse) {
    for t in &mut resp.topics {
        if !b.on_topic(cx, Operation::Read, &t.name) {
            for p in &mut t.partitions {
                p.active_producers.clear();
                p.error_code = TOPIC_DENIED;
            }
        }
    }
}
