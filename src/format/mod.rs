//! Bytes on disk and on the wire: record batches, the records inside them,
//! key indexes, and the names of a segment's files.
//!
//! Every layer above reads and writes these bytes: the log stamps batch
//! headers on produce, merges rewrite batches and key indexes, the tier
//! uploads a segment's file set. Each layout is defined here once, so that a
//! header offset or an extension cannot drift apart between two copies.
//! Nothing here opens a file: functions take byte slices, `Read` or `Write`.

pub mod batch;
pub(crate) mod control;
pub mod key_index;
pub(crate) mod key_sketch;
pub mod records;
pub mod segment;
pub mod wal;

#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    #[error("unsupported record batch magic {0}; only magic 2 is accepted")]
    UnsupportedMagic(i8),
    #[error("corrupt key index: {0}")]
    CorruptIndex(String),
    #[error("{codec} codec failed: {reason}")]
    Codec { codec: &'static str, reason: String },
}
