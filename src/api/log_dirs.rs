//! DescribeLogDirs: where this broker keeps each partition it serves, and
//! how many bytes.
//!
//! Kafka answers with its log directories. Here a partition's data lives in
//! two places, so the answer has two entries: the data directory, with each
//! partition's local segments (the active one and sealed ones not yet
//! released) and the disk's total and usable bytes; and the object store,
//! named by its URL, with each partition's tiered segments (its total and
//! usable bytes are unknown: -1). Tools that sum a broker's log dirs (`kafka-log-dirs.sh`,
//! rebalancers) thus see both, and can tell them apart by name. v5 adds
//! `IsCordoned` (a cordoned directory takes no new partitions); neither
//! place here can be cordoned, so it is always false.
//!
//! AlterReplicaLogDirs: Kafka moves a replica between the log directories
//! of one broker. Here a partition is always in both of its places, and
//! there is no other to move it to, so the answer is Kafka's for a replica
//! already in the directory asked for (NONE, nothing to move), or its
//! errors: LOG_DIR_NOT_FOUND for a directory that is not one of the two
//! (checked first, as Kafka checks it first), UNKNOWN_TOPIC_OR_PARTITION for
//! a partition that does not exist, REPLICA_NOT_AVAILABLE for one another
//! broker serves (it has no local data here, as DescribeLogDirs shows).

use std::path::Path;

use std::collections::BTreeMap;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::alter_replica_log_dirs_response::{
    AlterReplicaLogDirPartitionResult, AlterReplicaLogDirTopicResult,
};
use kafka_protocol::messages::describe_log_dirs_response::{
    DescribeLogDirsPartition, DescribeLogDirsResult, DescribeLogDirsTopic,
};
use kafka_protocol::messages::{
    AlterReplicaLogDirsRequest, AlterReplicaLogDirsResponse, DescribeLogDirsRequest,
    DescribeLogDirsResponse, TopicName,
};
use kafka_protocol::protocol::StrBytes;

use super::authorize::{Resource, CLUSTER_DENIED};
use super::dispatch::{api, Api};
use super::metrics::error_codes;
use super::{Broker, Route};
use crate::access::acl::Operation;
use crate::catalog::Topic;

pub(super) const DESCRIBE_LOG_DIRS: Api = api!(
    DescribeLogDirsRequest,
    1..=5,
    ready(|b, r, _| describe_log_dirs(b, r)),
    acl(Operation::Describe, Resource::Cluster, |_| {
        DescribeLogDirsResponse::default().with_error_code(CLUSTER_DENIED)
    })
);

pub(super) const ALTER_REPLICA_LOG_DIRS: Api = api!(
    AlterReplicaLogDirsRequest,
    1..=2,
    ready(|b, r, _| alter_replica_log_dirs(b, r)),
    acl(Operation::Alter, Resource::Cluster, |r| {
        every_partition(r, |_, _, _| CLUSTER_DENIED)
    })
);

error_codes! {
    DescribeLogDirsResponse => |r, f| {
        f(r.error_code);
        r.results.iter().for_each(|d| f(d.error_code));
    };
    AlterReplicaLogDirsResponse => |r, f| for t in &r.results {
        t.partitions.iter().for_each(|p| f(p.error_code));
    };
}

pub(super) fn describe_log_dirs(
    broker: &Broker,
    req: DescribeLogDirsRequest,
) -> DescribeLogDirsResponse {
    // (topic, partitions asked for; None = all)
    let wanted: Vec<(std::sync::Arc<Topic>, Option<Vec<i32>>)> = match req.topics {
        None => broker
            .catalog
            .topics()
            .into_iter()
            .map(|t| (t, None))
            .collect(),
        Some(list) => list
            .into_iter()
            .filter_map(|t| {
                let topic = broker.catalog.topic(t.topic.0.as_str())?;
                Some((topic, Some(t.partitions)))
            })
            .collect(),
    };
    let mut local = Vec::new();
    let mut tiered = Vec::new();
    for (topic, asked) in wanted {
        let indexes: Vec<i32> =
            asked.unwrap_or_else(|| (0..topic.partition_count() as i32).collect());
        let mut local_parts = Vec::new();
        let mut tiered_parts = Vec::new();
        for index in indexes {
            // Like Kafka, only the partitions this broker hosts.
            if broker.route(topic.id(), index) == Route::Elsewhere {
                continue;
            }
            let Some(partition) = topic.partition(index) else {
                continue;
            };
            let local_bytes: u64 = partition.local_segment_sizes().iter().map(|(_, s)| s).sum();
            local_parts.push(entry(index, local_bytes));
            tiered_parts.push(entry(index, partition.tiered_bytes()));
        }
        let name = TopicName(StrBytes::from_string(topic.name().to_string()));
        if !local_parts.is_empty() {
            local.push(
                DescribeLogDirsTopic::default()
                    .with_name(name.clone())
                    .with_partitions(local_parts),
            );
            tiered.push(
                DescribeLogDirsTopic::default()
                    .with_name(name)
                    .with_partitions(tiered_parts),
            );
        }
    }
    let (total, usable) = disk_space(&broker.settings.data_dir).unwrap_or((-1, -1));
    let store = broker.settings.store_url.clone();
    DescribeLogDirsResponse::default().with_results(vec![
        DescribeLogDirsResult::default()
            .with_log_dir(StrBytes::from_string(local_log_dir(broker)))
            .with_topics(local)
            .with_total_bytes(total)
            .with_usable_bytes(usable),
        DescribeLogDirsResult::default()
            .with_log_dir(StrBytes::from_string(store))
            .with_topics(tiered)
            .with_total_bytes(-1)
            .with_usable_bytes(-1),
    ])
}

/// The data directory as DescribeLogDirs names it: an absolute path, the
/// form Kafka compares AlterReplicaLogDirs' paths with.
fn local_log_dir(broker: &Broker) -> String {
    let data_dir = &broker.settings.data_dir;
    let data_dir = std::path::absolute(data_dir).unwrap_or_else(|_| data_dir.clone());
    data_dir.display().to_string()
}

/// Each partition of the request, once (a later directory for the same
/// partition replaces an earlier one, as in Kafka), answered by `code` and
/// grouped by topic.
fn every_partition(
    req: &AlterReplicaLogDirsRequest,
    mut code: impl FnMut(&str, &str, i32) -> i16,
) -> AlterReplicaLogDirsResponse {
    let mut wanted: BTreeMap<(&str, i32), &str> = BTreeMap::new();
    for dir in &req.dirs {
        for t in &dir.topics {
            for &p in &t.partitions {
                wanted.insert((t.name.0.as_str(), p), dir.path.as_str());
            }
        }
    }
    let mut results: Vec<AlterReplicaLogDirTopicResult> = Vec::new();
    for ((topic, index), dir) in wanted {
        let result = AlterReplicaLogDirPartitionResult::default()
            .with_partition_index(index)
            .with_error_code(code(dir, topic, index));
        match results.last_mut() {
            Some(t) if t.topic_name.0.as_str() == topic => t.partitions.push(result),
            _ => results.push(
                AlterReplicaLogDirTopicResult::default()
                    .with_topic_name(TopicName(StrBytes::from_string(topic.to_string())))
                    .with_partitions(vec![result]),
            ),
        }
    }
    AlterReplicaLogDirsResponse::default().with_results(results)
}

pub(super) fn alter_replica_log_dirs(
    broker: &Broker,
    req: AlterReplicaLogDirsRequest,
) -> AlterReplicaLogDirsResponse {
    let dirs = [local_log_dir(broker), broker.settings.store_url.clone()];
    every_partition(&req, |dir, topic, index| {
        let error = if !dirs.iter().any(|d| d == dir) {
            Some(ResponseError::LogDirNotFound)
        } else {
            match broker.catalog.topic(topic) {
                Some(t) if t.partition(index).is_some() => match broker.route(t.id(), index) {
                    Route::Serve(_) => None,
                    Route::Elsewhere => Some(ResponseError::ReplicaNotAvailable),
                },
                _ => Some(ResponseError::UnknownTopicOrPartition),
            }
        };
        error.map_or(0, |e| e.code())
    })
}

fn entry(index: i32, bytes: u64) -> DescribeLogDirsPartition {
    DescribeLogDirsPartition::default()
        .with_partition_index(index)
        .with_partition_size(bytes as i64)
        .with_offset_lag(0)
        .with_is_future_key(false)
}

/// (total, usable) bytes of the file system holding `dir`.
fn disk_space(dir: &Path) -> Option<(i64, i64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `path` is a NUL-terminated string and `st` a valid out pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return None;
    }
    let block = st.f_frsize as i64;
    Some((st.f_blocks as i64 * block, st.f_bavail as i64 * block))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_space_of_an_existing_directory_is_known() {
        let (total, usable) = disk_space(Path::new("/")).unwrap();
        assert!(total > 0 && usable >= 0 && usable <= total);
        assert!(disk_space(Path::new("/no/such/dir")).is_none());
    }
}
