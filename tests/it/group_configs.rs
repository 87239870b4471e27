//! Group configs (the GROUP config resource) over the raw protocol: an
//! override is described with Kafka's GROUP_CONFIG source and synonyms,
//! reaches the group's members at their next heartbeat, survives a restart,
//! is listed by ListConfigResources, and bad changes get Kafka's codes.

use crate::common;

use common::{config_op, str_bytes, Raw};
use kafka_protocol::messages::incremental_alter_configs_request::AlterableConfig;
use kafka_protocol::messages::*;
use strata::server::Server;

const GROUP: i8 = 32;
const SET: i8 = 0;
const DELETE: i8 = 1;
const SOURCE_GROUP: i8 = 8;
/// The broker's own value, which a flag sets.
const SOURCE_STATIC: i8 = 4;
const INVALID_CONFIG: i16 = 40;
const INVALID_REQUEST: i16 = 42;
const HEARTBEAT: &str = "consumer.heartbeat.interval.ms";

/// IncrementalAlterConfigs of one GROUP resource: its error code and message.
async fn alter(
    raw: &mut Raw,
    group: &str,
    changes: Vec<AlterableConfig>,
    validate_only: bool,
) -> (i16, String) {
    let mut answers = raw
        .incremental_alter_configs(GROUP, vec![(group, changes)], validate_only)
        .await;
    answers.remove(0)
}

/// Value, source and synonyms (name, value, source) of one group config.
type Described = (String, i8, Vec<(String, String, i8)>);

async fn described(raw: &mut Raw, group: &str, key: &str) -> Described {
    let result = raw.describe_configs(GROUP, group, &[key]).await;
    assert_eq!(result.error_code, 0, "{:?}", result.error_message);
    let c = &result.configs[0];
    let text = |v: &Option<kafka_protocol::protocol::StrBytes>| v.as_ref().unwrap().to_string();
    (
        text(&c.value),
        c.config_source,
        c.synonyms
            .iter()
            .map(|y| (y.name.to_string(), text(&y.value), y.source))
            .collect(),
    )
}

/// A new consumer-protocol member of `group` joins: the answer.
async fn join(raw: &mut Raw, group: &str) -> ConsumerGroupHeartbeatResponse {
    let join = ConsumerGroupHeartbeatRequest::default()
        .with_group_id(GroupId(str_bytes(group)))
        .with_member_id(str_bytes(&uuid::Uuid::new_v4().to_string()))
        .with_member_epoch(0)
        .with_rebalance_timeout_ms(10_000)
        .with_subscribed_topic_names(Some(vec![TopicName(str_bytes("orders"))]))
        .with_topic_partitions(Some(vec![]));
    raw.call(ApiKey::ConsumerGroupHeartbeat, 0, &join).await
}

/// The heartbeat interval a new consumer-protocol member of `group` is given.
async fn heartbeat_interval(raw: &mut Raw, group: &str) -> i32 {
    let resp = join(raw, group).await;
    assert_eq!(resp.error_code, 0, "{:?}", resp.error_message);
    resp.heartbeat_interval_ms
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_override_reaches_its_members_and_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let start = || async {
        Server::start(common::config(dir.path(), &[]))
            .await
            .unwrap()
    };
    let server = start().await;
    let mut raw = Raw::connect(server.local_addr()).await;
    let broker_default = (
        "group.consumer.heartbeat.interval.ms".to_string(),
        "5000".to_string(),
        SOURCE_STATIC,
    );
    assert_eq!(
        described(&mut raw, "g", HEARTBEAT).await,
        (
            "5000".to_string(),
            SOURCE_STATIC,
            vec![broker_default.clone()]
        )
    );
    // The group needs not exist yet.
    let set = alter(
        &mut raw,
        "g",
        vec![config_op(HEARTBEAT, SET, Some("7000"))],
        false,
    )
    .await;
    assert_eq!(set, (0, String::new()));
    assert_eq!(
        described(&mut raw, "g", HEARTBEAT).await,
        (
            "7000".to_string(),
            SOURCE_GROUP,
            vec![
                (HEARTBEAT.to_string(), "7000".to_string(), SOURCE_GROUP),
                broker_default.clone()
            ]
        )
    );
    assert_eq!(heartbeat_interval(&mut raw, "g").await, 7000);
    assert_eq!(heartbeat_interval(&mut raw, "other").await, 5000);
    drop(raw);
    server.shutdown().await.unwrap();

    let server = start().await;
    let mut raw = Raw::connect(server.local_addr()).await;
    assert_eq!(described(&mut raw, "g", HEARTBEAT).await.0, "7000");
    assert_eq!(heartbeat_interval(&mut raw, "g").await, 7000);
    let listed: ListConfigResourcesResponse = raw
        .call(
            ApiKey::ListConfigResources,
            1,
            &ListConfigResourcesRequest::default().with_resource_types(vec![GROUP]),
        )
        .await;
    let names: Vec<String> = listed
        .config_resources
        .iter()
        .map(|r| r.resource_name.to_string())
        .collect();
    assert_eq!(names, ["g"]);

    // DELETE gives the broker's value back.
    let deleted = alter(
        &mut raw,
        "g",
        vec![config_op(HEARTBEAT, DELETE, None)],
        false,
    )
    .await;
    assert_eq!(deleted.0, 0);
    assert_eq!(described(&mut raw, "g", HEARTBEAT).await.1, SOURCE_STATIC);
    assert_eq!(heartbeat_interval(&mut raw, "g").await, 5000);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_group_configs_get_kafkas_codes_and_change_nothing() {
    let broker = common::InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let refused = [
        (
            "g",
            vec![config_op("consumer.session.timeout.ms", SET, Some("1000"))],
            (INVALID_CONFIG, "consumer.session.timeout.ms must be in the range 45000 to 60000 inclusive."),
        ),
        (
            "g",
            vec![config_op("consumer.no.such", SET, Some("1"))],
            (INVALID_CONFIG, "Unknown group config name: consumer.no.such"),
        ),
        (
            "g",
            vec![config_op("share.isolation.level", SET, Some("dirty"))],
            (
                INVALID_CONFIG,
                "Invalid value dirty for configuration share.isolation.level: String must be one of: read_committed, read_uncommitted",
            ),
        ),
        (
            "",
            vec![config_op(HEARTBEAT, SET, Some("6000"))],
            (INVALID_REQUEST, "Group name must not be empty"),
        ),
        (
            "g",
            vec![config_op(HEARTBEAT, SET, Some("6000")), config_op(HEARTBEAT, SET, Some("7000"))],
            (INVALID_REQUEST, "Error due to duplicate config keys"),
        ),
    ];
    for (group, changes, (code, message)) in refused {
        let got = alter(&mut raw, group, changes, false).await;
        assert_eq!(got, (code, message.to_string()));
    }
    // Checked but not stored.
    let checked = alter(
        &mut raw,
        "g",
        vec![config_op(HEARTBEAT, SET, Some("6000"))],
        true,
    )
    .await;
    assert_eq!(checked.0, 0);
    assert_eq!(described(&mut raw, "g", HEARTBEAT).await.0, "5000");
    assert_eq!(heartbeat_interval(&mut raw, "g").await, 5000);
}

/// In a cluster an override set through one broker is described by the
/// others and applied by the group's coordinator, wherever it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_a_cluster_an_override_set_through_one_broker_reaches_the_coordinator() {
    let Some(cluster) = common::cluster::Cluster::start(&[1, 2]).await else {
        return;
    };
    let addr = |node: i32| -> std::net::SocketAddr {
        format!("127.0.0.1:{}", cluster.port(node)).parse().unwrap()
    };
    let mut one = Raw::connect(addr(1)).await;
    let set = alter(
        &mut one,
        "g",
        vec![config_op(HEARTBEAT, SET, Some("7000"))],
        false,
    )
    .await;
    assert_eq!(set, (0, String::new()));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    for node in [1, 2] {
        let mut raw = Raw::connect(addr(node)).await;
        while described(&mut raw, "g", HEARTBEAT).await.0 != "7000" {
            assert!(
                std::time::Instant::now() < deadline,
                "node {node} never saw it"
            );
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        }
    }
    // The coordinator's broker may still be taking the offsets topic over.
    loop {
        let found: FindCoordinatorResponse = one
            .call(
                ApiKey::FindCoordinator,
                4,
                &FindCoordinatorRequest::default().with_coordinator_keys(vec![str_bytes("g")]),
            )
            .await;
        let node = found.coordinators[0].node_id.0;
        if node >= 0 {
            let joined = join(&mut Raw::connect(addr(node)).await, "g").await;
            if joined.error_code == 0 {
                assert_eq!(joined.heartbeat_interval_ms, 7000);
                return;
            }
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no coordinator answered"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}
