//! The parts of a partition's log that live elsewhere (the object store).
//!
//! The log layer only knows these traits: offsets below the first local
//! segment are answered by whatever implements it (the tier, a layer above), so the
//! log itself never talks to a network or an object store API; in cluster
//! mode new batches are made durable by a `HeadSink` the same way. The futures
//! are boxed because the trait must stay object-safe (`Arc<dyn RemoteLog>`).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::watch;

use super::LogError;
use crate::format::control::AbortedTxn;

pub type RemoteFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, LogError>> + Send + 'a>>;

/// The offset below which a partition's appends are durable. The partition
/// owns it and readers see up to it; whatever makes appends durable (an
/// fsync, the head sink) raises it.
pub type DurableMark = Arc<watch::Sender<i64>>;

/// Where a partition's new batches become durable instead of by a local
/// fsync: in cluster mode, the broker's write-ahead log in the object store.
pub trait HeadSink: Send + Sync {
    /// Whether appends may go on now (not when fenced, nor while too much
    /// waits to become durable).
    fn check(&self) -> Result<(), LogError>;

    /// Takes one stamped batch covering `base_offset..=last_offset`,
    /// appended while this broker led the partition at `leader_epoch`, and
    /// raises `durable` to `last_offset + 1` once it is durable. Called in
    /// offset order, under the partition's append lock.
    fn submit(
        &self,
        durable: &DurableMark,
        leader_epoch: i32,
        base_offset: i64,
        last_offset: i64,
        header: &[u8],
        records: &[u8],
    );

    /// Resolves, with the reason, once the sink will make nothing more
    /// durable (a newer leader fenced its log).
    fn failed(&self) -> Pin<Box<dyn Future<Output = LogError> + Send + '_>>;

    /// A position in the sink's own log at or below which whatever is
    /// submitted from now on lands (the write-ahead log's next sequence
    /// number), so that a reader of that log knows where to start.
    fn position(&self) -> u64;
}

pub trait RemoteLog: Send + Sync {
    /// One past the last offset held remotely; `None` when nothing is.
    fn end_offset(&self) -> Option<i64>;

    /// Bytes of the segments held remotely.
    fn size_bytes(&self) -> u64;

    /// Whole batches from the remote segment holding `offset` (or the next
    /// one), at most `max_bytes` unless `min_one` asks for the first batch
    /// whatever its size. Empty when no remote segment reaches `offset`.
    fn read(&self, offset: i64, max_bytes: usize, min_one: bool) -> RemoteFuture<'_, Bytes>;

    /// The first remote record at or after `start` with a timestamp at or
    /// after `timestamp`, as (offset, timestamp).
    fn offset_for_timestamp(
        &self,
        timestamp: i64,
        start: i64,
    ) -> RemoteFuture<'_, Option<(i64, i64)>>;

    /// (offset, timestamp) of the first remote record at or after `start`
    /// holding the largest remote timestamp.
    fn max_timestamp(&self, start: i64) -> RemoteFuture<'_, Option<(i64, i64)>>;

    /// Adds the aborted transactions of the remote segments overlapping
    /// `from..upper` to `out` (see `format::control::collect_aborted`);
    /// true if no later segment can add any.
    fn aborted_txns(&self, from: i64, upper: i64, out: &mut Vec<AbortedTxn>) -> bool;
}
