//! Requests made to the object store, counted per operation.
//!
//! Object stores bill per request, and cluster mode's promise is that a
//! broker's PUT rate stays flat however many partitions it leads. The broker
//! wraps whatever store it opened in `Counted` and reports the totals at
//! shutdown; `scripts/bench-cluster` turns them into requests per second.
//! The same wrapper times each request and counts the failed ones, which
//! the broker's metrics export per operation: a slow or failing store shows
//! there before it shows as produce timeouts.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::BoxStream;
use futures::StreamExt;
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
// Requests are timed on the runtime's clock, which the simulation pauses.
use tokio::time::Instant;

use crate::metrics::Timer;

/// The kinds of request counted (a HEAD is a GET without the body).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Put,
    Get,
    List,
    Delete,
    Copy,
}

impl Op {
    pub(crate) const ALL: [Op; 5] = [Op::Put, Op::Get, Op::List, Op::Delete, Op::Copy];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Put => "put",
            Op::Get => "get",
            Op::List => "list",
            Op::Delete => "delete",
            Op::Copy => "copy",
        }
    }
}

/// Requests since the store was opened.
#[derive(Debug, Default)]
pub(crate) struct RequestCounts {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub copies: AtomicU64,
    errors: [AtomicU64; 5],
    /// Until the answer (a streamed LIST: until its end; an upload in parts:
    /// until it is started).
    latency: [Timer; 5],
}

impl RequestCounts {
    pub(crate) fn requests(&self, op: Op) -> u64 {
        match op {
            Op::Put => &self.puts,
            Op::Get => &self.gets,
            Op::List => &self.lists,
            Op::Delete => &self.deletes,
            Op::Copy => &self.copies,
        }
        .load(Relaxed)
    }

    /// Requests that failed, other than with an answer about the object
    /// itself (not found, already exists, precondition failed), which the
    /// manifest protocol expects all the time.
    pub(crate) fn errors(&self, op: Op) -> u64 {
        self.errors[op as usize].load(Relaxed)
    }

    pub(crate) fn latency(&self, op: Op) -> &Timer {
        &self.latency[op as usize]
    }

    fn failed(&self, op: Op) {
        self.errors[op as usize].fetch_add(1, Relaxed);
    }
}

impl fmt::Display for RequestCounts {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "puts={} put_bytes={} gets={} lists={} deletes={} copies={}",
            self.puts.load(Relaxed),
            self.put_bytes.load(Relaxed),
            self.gets.load(Relaxed),
            self.lists.load(Relaxed),
            self.deletes.load(Relaxed),
            self.copies.load(Relaxed)
        )
    }
}

/// A store that counts the requests passed to the one it wraps.
#[derive(Debug)]
pub(crate) struct Counted {
    inner: Arc<dyn ObjectStore>,
    counts: Arc<RequestCounts>,
}

impl Counted {
    pub(crate) fn wrap(inner: Arc<dyn ObjectStore>) -> (Arc<dyn ObjectStore>, Arc<RequestCounts>) {
        let counts = Arc::new(RequestCounts::default());
        let store = Counted {
            inner,
            counts: counts.clone(),
        };
        (Arc::new(store), counts)
    }
}

/// An error that is the store's answer about an object, not a failure.
fn is_answer(e: &object_store::Error) -> bool {
    use object_store::Error::*;
    matches!(
        e,
        NotFound { .. } | AlreadyExists { .. } | Precondition { .. } | NotModified { .. }
    )
}

impl Counted {
    async fn timed<T>(&self, op: Op, request: impl Future<Output = Result<T>>) -> Result<T> {
        let started = Instant::now();
        let result = request.await;
        self.counts.latency(op).observe(started.elapsed());
        if result.as_ref().is_err_and(|e| !is_answer(e)) {
            self.counts.failed(op);
        }
        result
    }

    /// A listing whose failures (reported by the stream) are counted, timed
    /// until its end.
    fn counted_list(
        &self,
        listing: BoxStream<'static, Result<ObjectMeta>>,
    ) -> BoxStream<'static, Result<ObjectMeta>> {
        let state = (listing, Instant::now(), self.counts.clone());
        futures::stream::unfold(state, |(mut listing, started, counts)| async move {
            match listing.next().await {
                Some(item) => {
                    if item.as_ref().is_err_and(|e| !is_answer(e)) {
                        counts.failed(Op::List);
                    }
                    Some((item, (listing, started, counts)))
                }
                None => {
                    counts.latency(Op::List).observe(started.elapsed());
                    None
                }
            }
        })
        .boxed()
    }
}

impl fmt::Display for Counted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Counted({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for Counted {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.counts.puts.fetch_add(1, Relaxed);
        self.counts
            .put_bytes
            .fetch_add(payload.content_length() as u64, Relaxed);
        self.timed(Op::Put, self.inner.put_opts(location, payload, opts))
            .await
    }

    /// Counted as one PUT: the parts of an upload are one object.
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.counts.puts.fetch_add(1, Relaxed);
        self.timed(Op::Put, self.inner.put_multipart_opts(location, opts))
            .await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.counts.gets.fetch_add(1, Relaxed);
        self.timed(Op::Get, self.inner.get_opts(location, options))
            .await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.counts.deletes.fetch_add(1, Relaxed);
        self.timed(Op::Delete, self.inner.delete(location)).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counts.lists.fetch_add(1, Relaxed);
        self.counted_list(self.inner.list(prefix))
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.counts.lists.fetch_add(1, Relaxed);
        self.timed(Op::List, self.inner.list_with_delimiter(prefix))
            .await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.counts.copies.fetch_add(1, Relaxed);
        self.timed(Op::Copy, self.inner.copy(from, to)).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.counts.copies.fetch_add(1, Relaxed);
        self.timed(Op::Copy, self.inner.copy_if_not_exists(from, to))
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object_store::memory::InMemory;

    #[tokio::test]
    async fn counts_each_request_by_operation() {
        let (store, counts) = Counted::wrap(Arc::new(InMemory::new()));
        let key = Path::from("a/b");
        store
            .put(&key, PutPayload::from_static(b"hello"))
            .await
            .unwrap();
        store.get(&key).await.unwrap();
        store.list(None).collect::<Vec<_>>().await;
        store.delete(&key).await.unwrap();
        assert_eq!(
            counts.to_string(),
            "puts=1 put_bytes=5 gets=1 lists=1 deletes=1 copies=0"
        );
    }

    #[tokio::test]
    async fn counts_failed_requests_but_not_answers_and_times_every_one() {
        let faulty = Arc::new(super::super::fault::FaultyStore::new(Arc::new(
            InMemory::new(),
        )));
        let (store, counts) = Counted::wrap(faulty.clone());
        let key = Path::from("a/b");
        assert!(store.get(&key).await.is_err(), "not found: an answer");
        store
            .put(&key, PutPayload::from_static(b"hello"))
            .await
            .unwrap();
        let create = PutOptions::from(object_store::PutMode::Create);
        let again = store.put_opts(&key, PutPayload::from_static(b"x"), create);
        assert!(again.await.is_err(), "already exists: an answer");
        faulty.set(super::super::fault::Fault::Fail);
        assert!(store.get(&key).await.is_err());
        assert_eq!(counts.requests(Op::Get), 2);
        assert_eq!(counts.errors(Op::Get), 1);
        assert_eq!(counts.requests(Op::Put), 2);
        assert_eq!(counts.errors(Op::Put), 0);
        let mut text = String::new();
        let mut registry = prometheus_client::registry::Registry::default();
        faulty.set(super::super::fault::Fault::None);
        assert_eq!(store.list(None).collect::<Vec<_>>().await.len(), 1);
        registry.register("get", "", counts.latency(Op::Get).histogram());
        registry.register("list", "", counts.latency(Op::List).histogram());
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("get_count 2"), "{text}");
        assert!(text.contains("list_count 1"), "{text}");
    }
}
