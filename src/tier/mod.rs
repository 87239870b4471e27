//! Tiered storage: sealed segments become immutable objects in an object
//! store, and the local disk keeps the active segment plus what awaits upload.
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
//! The log layer sees this module only as a `RemoteLog` attached to each
//! partition; the background loop in `uploader` rolls, uploads, expires and
//! releases segments; `restore` rebuilds an empty data directory from the store.

pub mod cache;
pub mod fault;
pub mod manifest;
pub mod objects;
pub mod remote;
pub mod restore;
pub mod store;
pub mod uploader;

use object_store::path::Path;
use uuid::Uuid;

pub use uploader::Tier;

#[derive(Debug, thiserror::Error)]
pub enum TierError {
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
    #[error("local storage: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Log(#[from] crate::log::LogError),
    #[error("manifest version {version} was written by another writer first")]
    Conflict { version: u64 },
    #[error("the manifest moved on: {0}")]
    Superseded(String),
    #[error("corrupt object: {0}")]
    Corrupt(String),
    #[error("{0}")]
    Config(String),
    /// One failed load, reported to every reader that waited for it.
    #[error(transparent)]
    Shared(std::sync::Arc<TierError>),
}

/// `topics/<topic>/<topic-id>`.
pub fn topic_prefix(topic: &str, id: Uuid) -> Path {
    Path::from_iter(["topics", topic, &id.to_string()])
}

/// `topics/<topic>/<topic-id>/<partition>`.
pub fn partition_prefix(topic: &str, id: Uuid, partition: i32) -> Path {
    topic_prefix(topic, id).child(partition.to_string())
}

/// Key prefix of a tiered segment's objects (extensions appended).
pub fn segment_key(partition: &Path, base_offset: i64, level: u32) -> String {
    format!("{partition}/segments/{base_offset:020}-{level}")
}
