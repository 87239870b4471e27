//! The partition log: whole record batches in segments on local disk.
//!
//! Only the newest segment of a partition accepts appends; a segment that
//! rolls is sealed (fsynced, indexes written, descriptor written last) and
//! never changes again. The log validates and stamps batches but never decodes
//! records, except to answer a by-timestamp lookup inside a single batch.

pub mod index;
pub mod key_index;
pub(crate) mod leader_epochs;
pub(crate) mod partition;
pub mod producer_state;
pub(crate) mod remote;
pub mod segment;

pub use partition::{
    AppendConfig, AppendOutcome, FetchSlice, Partition, PartitionSettings, RestorePoint, Visibility,
};
pub use remote::{DurableMark, HeadSink, RemoteFuture, RemoteLog};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("storage I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("corrupt record batch: {0}")]
    Corrupt(String),
    #[error("invalid record: {0}")]
    InvalidRecord(String),
    #[error("unsupported record batch magic {0}; only magic 2 is accepted")]
    UnsupportedMagic(i8),
    #[error("record batch of {size} bytes exceeds max.message.bytes {max}")]
    MessageTooLarge { size: usize, max: usize },
    #[error("offset {offset} is outside the log [{start}, {end}]")]
    OffsetOutOfRange { offset: i64, start: i64, end: i64 },
    #[error("producer {producer_id}: expected sequence {expected}, received {received}")]
    OutOfOrderSequence {
        producer_id: i64,
        expected: i32,
        received: i32,
    },
    #[error("producer {producer_id}: epoch {epoch} is older than current epoch {current}")]
    InvalidProducerEpoch {
        producer_id: i64,
        epoch: i16,
        current: i16,
    },
    #[error(
        "producer {producer_id}: coordinator epoch {coordinator_epoch} is older than {current}"
    )]
    CoordinatorFenced {
        producer_id: i64,
        coordinator_epoch: i32,
        current: i32,
    },
    #[error("producer {producer_id} wrote a non-transactional batch inside its open transaction")]
    InvalidTxnState { producer_id: i64 },
    #[error("object store: {0}")]
    Remote(String),
    #[error("too many sealed bytes wait for upload to the object store; retry later")]
    Backpressure,
    #[error("this broker is no longer the partition's leader")]
    Fenced,
}

impl From<crate::format::FormatError> for LogError {
    fn from(e: crate::format::FormatError) -> Self {
        use crate::format::FormatError as F;
        match e {
            F::Io(e) => LogError::Io(e),
            F::UnsupportedMagic(m) => LogError::UnsupportedMagic(m),
            F::InvalidRecord(r) => LogError::InvalidRecord(r),
            e @ (F::Corrupt(_) | F::CorruptIndex(_) | F::Codec { .. }) => {
                LogError::Corrupt(e.to_string())
            }
        }
    }
}
