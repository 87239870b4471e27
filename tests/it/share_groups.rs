//! Share groups (KIP-932) over the raw protocol, where a client library
//! cannot steer the scenario: the share-partition state in a cluster, when
//! the broker holding `__share_group_state` is killed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::common;

use common::Raw;
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;
use uuid::Uuid;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

const ACCEPT: i8 = 1;

/// A ShareFetch opening a share session (epoch 0) on `partitions`.
fn open_session(
    group: &str,
    member: &str,
    topic: Uuid,
    partitions: &[i32],
    max_wait_ms: i32,
) -> ShareFetchRequest {
    use share_fetch_request::{FetchPartition, FetchTopic};
    ShareFetchRequest::default()
        .with_group_id(Some(s(group).into()))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(0)
        .with_max_wait_ms(max_wait_ms)
        .with_min_bytes(1)
        .with_max_bytes(1 << 20)
        .with_max_records(500)
        .with_batch_size(500)
        .with_topics(vec![FetchTopic::default()
            .with_topic_id(topic)
            .with_partitions(
                partitions
                    .iter()
                    .map(|p| FetchPartition::default().with_partition_index(*p))
                    .collect(),
            )])
}

/// Opens a share session on `raw` for `partitions` and acquires what it
/// can; returns the acquired offsets per partition. The session ends with
/// the connection.
async fn acquire(
    raw: &mut Raw,
    group: &str,
    member: &str,
    topic: Uuid,
    partitions: &[i32],
) -> BTreeMap<i32, Vec<(i64, i16)>> {
    let req = open_session(group, member, topic, partitions, 3000);
    let resp: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &req).await;
    assert_eq!(resp.error_code, 0, "{resp:?}");
    let mut out = BTreeMap::new();
    for t in resp.responses {
        for p in t.partitions {
            assert_eq!(p.error_code, 0, "partition {}: {p:?}", p.partition_index);
            let got: Vec<(i64, i16)> = p
                .acquired_records
                .iter()
                .flat_map(|a| (a.first_offset..=a.last_offset).map(move |o| (o, a.delivery_count)))
                .collect();
            out.insert(p.partition_index, got);
        }
    }
    out
}

/// Accepts offsets 0 to `last` of `partition` in the session `acquire`
/// opened (its next epoch is 1).
async fn accept(raw: &mut Raw, group: &str, member: &str, topic: Uuid, partition: i32, last: i64) {
    use share_acknowledge_request::{AcknowledgePartition, AcknowledgeTopic, AcknowledgementBatch};
    let req = ShareAcknowledgeRequest::default()
        .with_group_id(Some(s(group).into()))
        .with_member_id(Some(s(member)))
        .with_share_session_epoch(1)
        .with_topics(vec![AcknowledgeTopic::default()
            .with_topic_id(topic)
            .with_partitions(vec![AcknowledgePartition::default()
                .with_partition_index(partition)
                .with_acknowledgement_batches(vec![
                    AcknowledgementBatch::default()
                        .with_first_offset(0)
                        .with_last_offset(last)
                        .with_acknowledge_types(vec![ACCEPT]),
                ])])]);
    let resp: ShareAcknowledgeResponse = raw.call(ApiKey::ShareAcknowledge, 1, &req).await;
    assert_eq!(resp.error_code, 0, "{resp:?}");
    let codes: Vec<i16> = resp
        .responses
        .iter()
        .flat_map(|t| t.partitions.iter().map(|p| p.error_code))
        .collect();
    assert_eq!(codes, vec![0], "{resp:?}");
}

fn addr(cluster: &common::cluster::Cluster, node: i32) -> SocketAddr {
    format!("127.0.0.1:{}", cluster.port(node)).parse().unwrap()
}

async fn topic_id(addr: SocketAddr, topic: &str) -> Uuid {
    let mut raw = Raw::connect(addr).await;
    let md: MetadataResponse = raw
        .call(
            ApiKey::Metadata,
            12,
            &MetadataRequest::default().with_topics(Some(vec![
                metadata_request::MetadataRequestTopic::default().with_name(Some(s(topic).into())),
            ])),
        )
        .await;
    md.topics[0].topic_id
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_acknowledgements_survive_a_kill_of_the_share_coordinator() {
    let Some(mut cluster) = common::cluster::Cluster::start(&[1, 2]).await else {
        return;
    };
    let bs = cluster.bootstrap();
    common::clients::create_topic(&bs, "shq", 2, &[]).await;
    let producer = common::clients::producer(&bs, &[]);
    common::clients::produce_numbered(&producer, "shq", 0..40, Duration::from_secs(30)).await;
    let leaders = common::cluster::leaders(&bs, "shq", 2).expect("leaders");
    let state_leader =
        common::cluster::leaders(&bs, "__share_group_state", 1).expect("state leader")[&0];
    let topic = topic_id(addr(&cluster, 1), "shq").await;
    // A ShareFetch at the broker not leading a partition names its leader
    // (KIP-951): Kafka's share consumer keeps each partition's leader and
    // only moves on such a hint.
    for (p, leader) in &leaders {
        let other = 3 - leader;
        let mut raw = Raw::connect(addr(&cluster, other)).await;
        let req = open_session("probe", "probe-member", topic, &[*p], 0);
        let resp: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &req).await;
        let d = &resp.responses[0].partitions[0];
        assert_eq!(d.error_code, ResponseError::NotLeaderOrFollower.code());
        assert_eq!(
            (d.current_leader.leader_id, d.current_leader.leader_epoch),
            (*leader, 0)
        );
        let ports: Vec<_> = resp
            .node_endpoints
            .iter()
            .map(|e| (e.node_id.0, e.port))
            .collect();
        assert_eq!(ports, [(*leader, cluster.port(*leader) as i32)]);
    }
    // The group reads from the start (share.auto.offset.reset=earliest),
    // set through each broker so that both apply it at once.
    for node in [1, 2] {
        let mut raw = Raw::connect(addr(&cluster, node)).await;
        let set = raw
            .incremental_alter_configs(
                32, // GROUP
                vec![(
                    "shq-g",
                    vec![common::config_op(
                        "share.auto.offset.reset",
                        0,
                        Some("earliest"),
                    )],
                )],
                false,
            )
            .await;
        assert!(set.iter().all(|(code, _)| *code == 0), "{set:?}");
    }

    // Each partition is read on its leader, one of them not the share
    // coordinator, whose state goes there over WriteShareGroupState.
    let member = Uuid::new_v4().simple().to_string()[..22].to_string();
    let mut held = BTreeMap::new();
    // Open until the kill: the rest stays acquired, not released.
    let mut sessions = Vec::new();
    for (p, leader) in &leaders {
        let mut raw = Raw::connect(addr(&cluster, *leader)).await;
        let got = acquire(&mut raw, "shq-g", &member, topic, &[*p]).await;
        let offsets = &got[p];
        assert!(!offsets.is_empty(), "nothing acquired on partition {p}");
        assert!(offsets.iter().all(|(_, c)| *c == 1), "{offsets:?}");
        // The first half is accepted; the rest stays acquired.
        let last = offsets.len() as i64 / 2 - 1;
        accept(&mut raw, "shq-g", &member, topic, *p, last).await;
        held.insert(*p, (last, offsets.len() as i64));
        sessions.push(raw);
    }
    eprintln!("data leaders {leaders:?}, share coordinator {state_leader}");

    // The share coordinator dies. The survivor takes `__share_group_state`
    // over, replays it from the object store, and serves both partitions.
    cluster.kill9(state_leader);
    drop(sessions);
    let survivor = if state_leader == 1 { 2 } else { 1 };
    // Until it has taken over, an attempt may get one partition and an
    // error on the other; what each attempt acquired stays held by the
    // member, so the attempts' records are put together.
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut again: BTreeMap<i32, Vec<i64>> = BTreeMap::new();
    loop {
        let got = tokio::time::timeout(
            Duration::from_secs(10),
            try_acquire(addr(&cluster, survivor), "shq-g", &member, topic),
        )
        .await;
        for (p, offsets) in got.unwrap_or_default() {
            again
                .entry(p)
                .or_default()
                .extend(offsets.iter().map(|(o, _)| *o));
        }
        let complete = held.iter().all(|(p, (last, total))| {
            again
                .get(p)
                .is_some_and(|got| (last + 1..*total).all(|o| got.contains(&o)))
        });
        if complete {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the survivor never handed out every unacknowledged record: {again:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (p, (last_accepted, _)) in held {
        let back: Vec<&i64> = again[&p].iter().filter(|o| **o <= last_accepted).collect();
        assert!(
            back.is_empty(),
            "partition {p}: accepted records came back: {back:?}"
        );
    }
}

/// `acquire` on both partitions; a partition that answers with an error
/// (the survivor is still taking over) is left out.
async fn try_acquire(
    addr: SocketAddr,
    group: &str,
    member: &str,
    topic: Uuid,
) -> BTreeMap<i32, Vec<(i64, i16)>> {
    let mut raw = Raw::connect(addr).await;
    let req = open_session(group, member, topic, &[0, 1], 1000);
    let resp: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &req).await;
    let mut out = BTreeMap::new();
    if resp.error_code != 0 {
        return out;
    }
    for t in resp.responses {
        for p in t.partitions {
            let retriable = [
                ResponseError::NotLeaderOrFollower.code(),
                ResponseError::ReplicaNotAvailable.code(),
            ];
            if retriable.contains(&p.error_code) {
                continue;
            }
            assert_eq!(p.error_code, 0, "{p:?}");
            let got = p
                .acquired_records
                .iter()
                .flat_map(|a| (a.first_offset..=a.last_offset).map(move |o| (o, a.delivery_count)))
                .collect();
            out.insert(p.partition_index, got);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn share_requests_in_wrong_states_get_kafkas_errors_and_share_version_zero_turns_them_off() {
    use share_acknowledge_request::AcknowledgeTopic;
    let server = common::InProcess::start(&[]).await;
    let mut raw = Raw::connect(server.addr()).await;
    raw.create_topic("shs", 1, &[]).await;
    let topic = topic_id(server.addr(), "shs").await;
    let fetch = |epoch: i32, member: &str| {
        ShareFetchRequest::default()
            .with_group_id(Some(s("shs-g").into()))
            .with_member_id(Some(s(member)))
            .with_share_session_epoch(epoch)
            .with_max_records(10)
            .with_max_bytes(1 << 20)
            .with_topics(vec![share_fetch_request::FetchTopic::default()
                .with_topic_id(topic)
                .with_partitions(vec![
                    share_fetch_request::FetchPartition::default(),
                ])])
    };
    // A session that was never opened, an empty member id, a bad acquire mode.
    let r: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &fetch(3, "m1")).await;
    assert_eq!(r.error_code, ResponseError::ShareSessionNotFound.code());
    let r: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &fetch(0, "")).await;
    assert_eq!(r.error_code, ResponseError::InvalidRequest.code());
    let r: ShareFetchResponse = raw
        .call(
            ApiKey::ShareFetch,
            2,
            &fetch(0, "m1").with_share_acquire_mode(7),
        )
        .await;
    assert_eq!(r.error_code, ResponseError::InvalidRequest.code());
    // Opened at epoch 0, the next is 1: a wrong epoch is refused, and a
    // ShareAcknowledge may not open a session.
    let r: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &fetch(0, "m1")).await;
    assert_eq!(r.error_code, 0);
    let r: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &fetch(5, "m1")).await;
    assert_eq!(r.error_code, ResponseError::InvalidShareSessionEpoch.code());
    let ack = ShareAcknowledgeRequest::default()
        .with_group_id(Some(s("shs-g").into()))
        .with_member_id(Some(s("m1")))
        .with_share_session_epoch(0)
        .with_topics(vec![AcknowledgeTopic::default().with_topic_id(topic)]);
    let r: ShareAcknowledgeResponse = raw.call(ApiKey::ShareAcknowledge, 1, &ack).await;
    assert_eq!(r.error_code, ResponseError::InvalidShareSessionEpoch.code());
    // Acknowledgements for a topic id the broker does not know (deleted):
    // UNKNOWN_TOPIC_ID for that partition.
    use share_acknowledge_request::{AcknowledgePartition, AcknowledgementBatch};
    let gone = ack
        .with_share_session_epoch(1)
        .with_topics(vec![AcknowledgeTopic::default()
            .with_topic_id(Uuid::new_v4())
            .with_partitions(vec![AcknowledgePartition::default()
                .with_acknowledgement_batches(vec![
                    AcknowledgementBatch::default().with_acknowledge_types(vec![ACCEPT]),
                ])])]);
    let r: ShareAcknowledgeResponse = raw.call(ApiKey::ShareAcknowledge, 1, &gone).await;
    assert_eq!(r.error_code, 0);
    let code = r.responses[0].partitions[0].error_code;
    assert_eq!(code, ResponseError::UnknownTopicId.code());
    // Offsets of a group that does not exist cannot be deleted.
    let del = DeleteShareGroupOffsetsRequest::default()
        .with_group_id(s("nobody").into())
        .with_topics(vec![
            delete_share_group_offsets_request::DeleteShareGroupOffsetsRequestTopic::default()
                .with_topic_name(s("shs").into()),
        ]);
    let r: DeleteShareGroupOffsetsResponse =
        raw.call(ApiKey::DeleteShareGroupOffsets, 0, &del).await;
    assert_eq!(r.error_code, ResponseError::GroupIdNotFound.code());
    // The inter-broker state APIs answer for uninitialized state as Kafka does.
    let read = ReadShareGroupStateRequest::default()
        .with_group_id(s("shs-g"))
        .with_topics(vec![
            read_share_group_state_request::ReadStateData::default()
                .with_topic_id(topic)
                .with_partitions(vec![
                    read_share_group_state_request::PartitionData::default()
                        .with_partition(0)
                        .with_leader_epoch(0),
                ]),
        ]);
    let r: ReadShareGroupStateResponse = raw.call(ApiKey::ReadShareGroupState, 0, &read).await;
    assert_eq!(
        r.results[0].partitions[0].error_code, 0,
        "the fetch above initialized it"
    );

    // share.version 0: every share API answers UNSUPPORTED_VERSION.
    use update_features_request::FeatureUpdateKey;
    let off = UpdateFeaturesRequest::default()
        .with_timeout_ms(5000)
        .with_feature_updates(vec![FeatureUpdateKey::default()
            .with_feature(s("share.version"))
            .with_max_version_level(0)
            .with_upgrade_type(2)]);
    let r: UpdateFeaturesResponse = raw.call(ApiKey::UpdateFeatures, 1, &off).await;
    assert_eq!(r.error_code, 0);
    let hb = ShareGroupHeartbeatRequest::default()
        .with_group_id(s("shs-g").into())
        .with_member_id(s("m2"))
        .with_subscribed_topic_names(Some(vec![s("shs").into()]));
    let r: ShareGroupHeartbeatResponse = raw.call(ApiKey::ShareGroupHeartbeat, 1, &hb).await;
    assert_eq!(r.error_code, ResponseError::UnsupportedVersion.code());
    let r: ShareFetchResponse = raw.call(ApiKey::ShareFetch, 1, &fetch(0, "m2")).await;
    assert_eq!(r.error_code, ResponseError::UnsupportedVersion.code());
}
