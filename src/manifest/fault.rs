//! An object store that fails or stalls requests on demand, wrapped around a
//! real one: how tests show the broker keeps serving from the head and the
//! cache while the store is down, and catches up when it returns. It can
//! also hold every request by a log-normal delay, like S3's, so benchmarks
//! see a remote store's latency with none of a store server's CPU on the
//! machine (`--store-latency-ms`).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::stream::{BoxStream, StreamExt};
use object_store::path::Path;
use object_store::{
    GetOptions, GetResult, ListResult, MultipartUpload, ObjectMeta, ObjectStore,
    PutMultipartOptions, PutOptions, PutPayload, PutResult, Result,
};
use tokio::sync::watch;

use crate::clock::SharedRandom;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Requests pass through.
    None,
    /// Every request fails at once.
    Fail,
    /// Every request waits until the fault changes (then passes or fails).
    Stall,
    /// Every n-th request fails, the others pass: a store that errs now
    /// and then.
    FailEvery(u64),
}

/// A log-normal latency: half the requests take less than `median`, 99% less
/// than `p99`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Latency {
    pub median: Duration,
    pub p99: Duration,
}

impl Latency {
    /// `median · e^(σz)` for a standard normal `z` (Box–Muller over two
    /// uniforms from `random`), with σ putting the 99th percentile at `p99`.
    fn draw(&self, random: &SharedRandom) -> Duration {
        const Z99: f64 = 2.326;
        // A v4 UUID's bits are random but for the version (bits 76..80)
        // and the variant (bits 62..64).
        let bits = random.uuid().as_u128();
        let u1 = (bits >> 80) as f64 / (1u64 << 48) as f64;
        let u2 = (bits as u64 & ((1 << 62) - 1)) as f64 / (1u64 << 62) as f64;
        let z = (-2.0 * (1.0 - u1).ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let ratio = self.p99.as_secs_f64() / self.median.as_secs_f64().max(1e-9);
        let sigma = ratio.max(1.0).ln() / Z99;
        self.median.mul_f64((sigma * z).exp())
    }
}

#[derive(Debug)]
pub struct FaultyStore {
    inner: Arc<dyn ObjectStore>,
    fault: watch::Sender<Fault>,
    latency: Option<(Latency, SharedRandom)>,
    /// Requests that reached the inner store.
    pub passed: Arc<AtomicU64>,
    /// Requests refused by the fault.
    pub refused: Arc<AtomicU64>,
}

impl FaultyStore {
    pub fn new(inner: Arc<dyn ObjectStore>) -> FaultyStore {
        FaultyStore {
            inner,
            fault: watch::Sender::new(Fault::None),
            latency: None,
            passed: Arc::default(),
            refused: Arc::default(),
        }
    }

    /// Every request passed on waits a draw of `latency` first.
    pub fn with_latency(
        inner: Arc<dyn ObjectStore>,
        latency: Latency,
        random: SharedRandom,
    ) -> FaultyStore {
        FaultyStore {
            latency: Some((latency, random)),
            ..FaultyStore::new(inner)
        }
    }

    fn delay(&self) -> Option<Duration> {
        self.latency.as_ref().map(|(l, random)| l.draw(random))
    }

    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Waits out a stall, fails under `Fail`, and holds a passed request
    /// by a draw of the latency. `'static`, so a listing can run it first.
    fn gate(&self) -> impl std::future::Future<Output = Result<()>> + Send + 'static {
        let mut rx = self.fault.subscribe();
        let delay = self.delay();
        let (passed, refused) = (self.passed.clone(), self.refused.clone());
        async move {
            loop {
                let mut fault = *rx.borrow_and_update();
                if let Fault::FailEvery(n) = fault {
                    let seen = passed.load(Ordering::Relaxed) + refused.load(Ordering::Relaxed);
                    fault = if (seen + 1) % n.max(1) == 0 {
                        Fault::Fail
                    } else {
                        Fault::None
                    };
                }
                match fault {
                    Fault::None | Fault::FailEvery(_) => {
                        passed.fetch_add(1, Ordering::Relaxed);
                        if let Some(delay) = delay {
                            tokio::time::sleep(delay).await;
                        }
                        return Ok(());
                    }
                    Fault::Fail => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        return Err(object_store::Error::Generic {
                            store: "faulty",
                            source: "injected failure".into(),
                        });
                    }
                    Fault::Stall => {
                        if rx.changed().await.is_err() {
                            return Ok(());
                        }
                    }
                }
            }
        }
    }
}

impl fmt::Display for FaultyStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "FaultyStore({})", self.inner)
    }
}

#[async_trait]
impl ObjectStore for FaultyStore {
    async fn put_opts(
        &self,
        location: &Path,
        payload: PutPayload,
        opts: PutOptions,
    ) -> Result<PutResult> {
        self.gate().await?;
        self.inner.put_opts(location, payload, opts).await
    }

    async fn put_multipart_opts(
        &self,
        location: &Path,
        opts: PutMultipartOptions,
    ) -> Result<Box<dyn MultipartUpload>> {
        self.gate().await?;
        self.inner.put_multipart_opts(location, opts).await
    }

    async fn get_opts(&self, location: &Path, options: GetOptions) -> Result<GetResult> {
        self.gate().await?;
        self.inner.get_opts(location, options).await
    }

    async fn delete(&self, location: &Path) -> Result<()> {
        self.gate().await?;
        self.inner.delete(location).await
    }

    fn list(&self, prefix: Option<&Path>) -> BoxStream<'static, Result<ObjectMeta>> {
        let inner = self.inner.clone();
        let prefix = prefix.cloned();
        futures::stream::once(self.gate())
            .flat_map(move |r| match r {
                Ok(()) => inner.list(prefix.as_ref()),
                Err(e) => futures::stream::once(async move { Err(e) }).boxed(),
            })
            .boxed()
    }

    async fn list_with_delimiter(&self, prefix: Option<&Path>) -> Result<ListResult> {
        self.gate().await?;
        self.inner.list_with_delimiter(prefix).await
    }

    async fn copy(&self, from: &Path, to: &Path) -> Result<()> {
        self.gate().await?;
        self.inner.copy(from, to).await
    }

    async fn copy_if_not_exists(&self, from: &Path, to: &Path) -> Result<()> {
        self.gate().await?;
        self.inner.copy_if_not_exists(from, to).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::TryStreamExt;
    use object_store::memory::InMemory;
    use std::time::Duration;

    #[tokio::test]
    async fn fails_stalls_and_recovers() {
        let store = Arc::new(FaultyStore::new(Arc::new(InMemory::new())));
        let p = Path::from("a");
        store
            .put(&p, Bytes::from_static(b"1").into())
            .await
            .unwrap();
        store.set(Fault::Fail);
        assert!(store.get(&p).await.is_err());
        assert!(store.list(None).try_collect::<Vec<_>>().await.is_err());
        store.set(Fault::Stall);
        let s2 = store.clone();
        let pending = tokio::spawn(async move { s2.get(&p).await.is_ok() });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!pending.is_finished());
        store.set(Fault::None);
        assert!(pending.await.unwrap());
        assert_eq!(
            store
                .list(None)
                .try_collect::<Vec<_>>()
                .await
                .unwrap()
                .len(),
            1
        );
    }

    #[test]
    fn latency_draws_have_the_median_and_99th_percentile_asked_for() {
        let latency = Latency {
            median: Duration::from_millis(40),
            p99: Duration::from_millis(160),
        };
        let random: SharedRandom = Arc::new(crate::clock::OsRandom);
        let mut draws: Vec<Duration> = (0..20_000).map(|_| latency.draw(&random)).collect();
        draws.sort_unstable();
        let ms = |q: f64| draws[(q * draws.len() as f64) as usize].as_secs_f64() * 1000.0;
        assert!((36.0..44.0).contains(&ms(0.5)), "median {}", ms(0.5));
        assert!((130.0..195.0).contains(&ms(0.99)), "p99 {}", ms(0.99));
    }
}
