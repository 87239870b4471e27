//! The versions Kafka 4.4 added, over the raw protocol: each test sends the
//! new version and checks what it changes, next to the version before it.

use crate::common;

use common::{InProcess, Raw};
use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use kafka_protocol::protocol::StrBytes;

fn s(v: &str) -> StrBytes {
    StrBytes::from_string(v.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_groups_v6_answers_group_id_not_found_for_a_group_that_does_not_exist() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let req = DescribeGroupsRequest::default().with_groups(vec![s("nobody-here").into()]);

    let v5: DescribeGroupsResponse = raw.call(ApiKey::DescribeGroups, 5, &req).await;
    let g = &v5.groups[0];
    assert_eq!((g.error_code, g.group_state.as_str()), (0, "Dead"));

    let v6: DescribeGroupsResponse = raw.call(ApiKey::DescribeGroups, 6, &req).await;
    let g = &v6.groups[0];
    assert_eq!(g.group_id.as_str(), "nobody-here");
    assert_eq!(g.error_code, ResponseError::GroupIdNotFound.code());
    assert_eq!(g.group_state.as_str(), "Dead");
    assert_eq!(
        g.error_message.as_deref(),
        Some("Group nobody-here not found.")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_groups_v3_says_why_a_group_was_not_deleted() {
    let broker = InProcess::start(&[]).await;
    let mut raw = Raw::connect(broker.addr()).await;
    let req = DeleteGroupsRequest::default().with_groups_names(vec![s("never-was").into()]);

    let v2: DeleteGroupsResponse = raw.call(ApiKey::DeleteGroups, 2, &req).await;
    assert_eq!(
        v2.results[0].error_code,
        ResponseError::GroupIdNotFound.code()
    );
    assert_eq!(v2.results[0].error_message, None);

    let v3: DeleteGroupsResponse = raw.call(ApiKey::DeleteGroups, 3, &req).await;
    let r = &v3.results[0];
    assert_eq!(r.group_id.as_str(), "never-was");
    assert_eq!(r.error_code, ResponseError::GroupIdNotFound.code());
    let message = r.error_message.as_deref().expect("v3 says why");
    assert!(message.contains("does not exist"), "{message}");
}
