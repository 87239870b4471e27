//! Leveled streaming compaction of sealed segments.
//!
//! Kafka's log cleaner builds a hash table of every key in the dirty part of
//! the log and rewrites the log against it, so its memory grows with the key
//! space and it needs the whole log on one local disk. Strata instead treats
//! sealed segments like the runs of an LSM tree: each one carries a key index
//! sorted by key hash (`format::key_index`), written once when the segment seals. A
//! merge of N contiguous segments is then a true streaming merge sort of N
//! sorted files that yields, per key, the newest offset; those survivors are
//! marked in one bit per offset, and the records stream through that filter
//! in offset order into one segment of the next level (`merge`). Memory is the
//! fan-in times a read buffer plus the bitmaps (records / 8 bytes), whatever
//! the size of the segments or of the key space.
//!
//! Which segments to merge, and when, is a small swappable `policy`: by
//! default a fixed number of contiguous level-N segments make one level-N+1
//! segment, so every byte is rewritten about once per level.
//!
//! The merge reads and writes through two narrow traits (`SegmentSource`,
//! `SegmentSink` in `io`), with local-file implementations in `io` and
//! store-backed sources in `store_source`. Jobs (`job`) run merges against
//! the store and swap their output into the partition's manifest
//! (`crate::manifest`, which tiering writes too); the `scheduler` queues them
//! on an internal topic and `worker`s consume them. The broker's `server`
//! wires the scheduler to the tier's manifests, so this module never calls
//! the tier nor the tier this module. Nothing here touches the produce or
//! fetch path: record batches are only decompressed here, off to the side.

pub(crate) mod io;
pub mod job;
pub mod levels;
pub(crate) mod merge;
pub mod policy;
pub(crate) mod scheduler;
pub mod store_source;
pub mod worker;

pub use io::{LocalSegment, LocalSink, SegmentSink, SegmentSource};
pub use merge::{merge, MergeMode, MergeOptions, MergeStats};
pub use policy::{CompactionPolicy, Job, Leveled, NoCompaction, SegmentDesc};

#[derive(Debug, thiserror::Error)]
pub enum CompactionError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Log(#[from] crate::log::LogError),
    #[error("corrupt record batch at offset {offset}: {reason}")]
    CorruptBatch { offset: i64, reason: String },
    #[error("invalid merge: {0}")]
    InvalidMerge(String),
    #[error(transparent)]
    Format(#[from] crate::format::FormatError),
    #[error(transparent)]
    Manifest(#[from] crate::manifest::ManifestError),
    #[error("kafka client: {0}")]
    Client(#[from] rdkafka::error::KafkaError),
    #[error("malformed job record: {0}")]
    BadJob(String),
}
