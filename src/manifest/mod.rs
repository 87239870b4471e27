//! What is in the object store, and who may change it.
//!
//! Keys in the store (relative to the store URL):
//!
//! ```text
//! cluster.json                                       cluster id
//! topics/<topic>/<topic-id>/topic.json               id, partitions, config
//! topics/<topic>/<topic-id>/<p>/manifest/<v:020>.json  manifest versions (create-only)
//! topics/<topic>/<topic-id>/<p>/segments/<base:020>-0.{log,index,timeindex,keyindex,producers,meta}   sealed
//! topics/<topic>/<topic-id>/<p>/segments/<base:020>-<level>-<job>.{...}                   merged
//! ```
//!
//! Segment objects are immutable; the only thing that changes is which of
//! them a partition's manifest names, and every change is a new manifest
//! version written create-only (`versions`). Tiering (uploads, retention)
//! and compaction (merges) both write manifests, so both use this module and
//! neither owns it. The writer epoch recorded in each version says who wrote
//! it; the fencing of stale writers that cluster mode needs belongs here too.
//! `objects` uploads, deletes and garbage-collects segment objects, `store`
//! opens the store a URL names, `counted` counts the requests made to it and
//! `fault` (for tests) injects failures into any store.

pub(crate) mod counted;
#[doc(hidden)]
pub mod fault;
pub mod objects;
pub mod store;
mod versions;

use object_store::path::Path;
use uuid::Uuid;

pub use versions::{
    LeaderMark, Manifest, ManifestStore, TieredSegment, WriterEpoch, MANIFEST_FORMAT_VERSION,
};

#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("local storage: {0}")]
    Io(#[from] std::io::Error),
    #[error("manifest version {version} was written by another writer first")]
    Conflict { version: u64 },
    #[error("the manifest moved on: {0}")]
    Superseded(String),
    #[error("a leader of epoch {current} took the partition over from epoch {epoch}")]
    Fenced { epoch: i32, current: i32 },
    #[error("corrupt object: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Config(String),
}

impl ManifestError {
    /// The object asked for is not in the store.
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            ManifestError::Store(object_store::Error::NotFound { .. })
        )
    }
}

/// The store's copy of the cluster id.
pub const CLUSTER_FILE: &str = "cluster.json";
/// A topic incarnation's description, under its prefix.
pub const TOPIC_FILE: &str = "topic.json";

/// `topics/<topic>/<topic-id>`.
pub fn topic_prefix(topic: &str, id: Uuid) -> Path {
    Path::from_iter(["topics", topic, &id.to_string()])
}

/// `topics/<topic>/<topic-id>/<partition>`.
pub fn partition_prefix(topic: &str, id: Uuid, partition: i32) -> Path {
    topic_prefix(topic, id).child(partition.to_string())
}

/// The prefix of a partition's manifest versions.
pub fn manifest_dir(partition: &Path) -> Path {
    partition.child("manifest")
}

/// Key prefix of a tiered segment's objects (extensions appended).
pub fn segment_key(partition: &Path, base_offset: i64, level: u32) -> String {
    format!("{partition}/segments/{base_offset:020}-{level}")
}
