//! The file set of one segment, named once for the log, the store and merges.
//!
//! A segment with base offset B (20 digits, zero-padded like Kafka) is
//! `B.log`, the batches exactly as served to consumers, plus companions:
//! `B.index` and `B.timeindex` the sparse indexes, `B.keyindex` the key index
//! (compacted topics), `B.producers` the producer state as of the segment's
//! end, and `B.meta` the descriptor, written last when the segment seals. A
//! sealed segment never changes again, so the same names serve as the
//! extensions of its objects in the store; the descriptor carries what a
//! merge needs without reading the log (level, offsets, max timestamp, size).

use serde::{Deserialize, Serialize};

use super::control::AbortedTxn;
use super::key_sketch::KeyStats;

pub const SEGMENT_FORMAT_VERSION: u32 = 1;

pub const LOG_EXT: &str = "log";
pub const INDEX_EXT: &str = "index";
pub const TIME_INDEX_EXT: &str = "timeindex";
pub const KEY_INDEX_EXT: &str = "keyindex";
/// The producer state snapshot (`log::producer_state`).
pub const SNAPSHOT_EXT: &str = "producers";
pub const META_EXT: &str = "meta";

/// Every extension of a segment, descriptor first: the order to delete them
/// in, so that a listing showing a descriptor shows a whole segment.
pub const ALL_EXTENSIONS: [&str; 6] = [
    META_EXT,
    INDEX_EXT,
    TIME_INDEX_EXT,
    KEY_INDEX_EXT,
    SNAPSHOT_EXT,
    LOG_EXT,
];

/// `B.ext` for the segment with base offset B.
pub fn file_name(base_offset: i64, ext: &str) -> String {
    format!("{base_offset:020}.{ext}")
}

/// Descriptor of a sealed segment (`B.meta`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SegmentMeta {
    pub format_version: u32,
    /// Compaction level: 0 for a segment sealed from the head of the log.
    pub level: u32,
    pub base_offset: i64,
    /// One past the last offset the segment covers.
    pub next_offset: i64,
    pub size: u64,
    pub batch_count: u64,
    pub max_timestamp: i64,
    /// Position of the first batch holding `max_timestamp`.
    pub max_timestamp_position: u64,
    pub created_ms: i64,
    pub sealed_ms: i64,
    /// Records, distinct keys and a key sketch (compacted topics; set when the
    /// key index is known: by a merge, or by the upload of a sealed segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys: Option<KeyStats>,
    /// The transactions aborted by a marker in this segment (Kafka's
    /// `.txnindex`), oldest marker first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aborted: Vec<AbortedTxn>,
}
