//! Requests made to the object store, counted per operation.
//!
//! Object stores bill per request, and cluster mode's promise is that a
//! broker's PUT rate stays flat however many partitions it leads. The broker
//! wraps whatever store it opened in `Counted` and reports the totals at
//! shutdown; `scripts/bench-cluster` turns them into requests per second.

use std::fmt;
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

/// Requests since the store was opened.
#[derive(Debug, Default)]
pub struct RequestCounts {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub gets: AtomicU64,
    pub lists: AtomicU64,
    pub deletes: AtomicU64,
    pub copies: AtomicU64,
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
pub struct Counted {
    inner: Arc<dyn ObjectStore>,
    counts: Arc<RequestCounts>,
}

impl Counted {
    pub fn wrap(inner: Arc<dyn ObjectStore>) -> (Arc<dyn ObjectStore>, Arc<RequestCounts>) {
        let counts = Arc::new(RequestCounts::default());
        let store = Counted {
            inner,
            counts: counts.clone(),
        };
        (Arc::new(store), counts)
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
        self.inner.put_opts(location, payload, opts).await
    }

    /// Counted as one PUT: the parts of an upload are one object.
    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.counts.puts.fetch_add(1, Relaxed);
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.counts.gets.fetch_add(1, Relaxed);
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.counts.deletes.fetch_add(1, Relaxed);
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        self.counts.lists.fetch_add(1, Relaxed);
        self.inner.list(prefix).boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.counts.lists.fetch_add(1, Relaxed);
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.counts.copies.fetch_add(1, Relaxed);
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.counts.copies.fetch_add(1, Relaxed);
        self.inner.copy_if_not_exists(from, to).await
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
}
