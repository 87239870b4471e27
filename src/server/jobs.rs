//! The broker's background jobs, owned in one place.
//!
//! Every job the broker starts runs until the stop signal, so one that ends
//! before it has stopped doing its work: the tier no longer uploads, or
//! transactions no longer time out. Such a death is logged and makes
//! `/readyz` fail, so that an orchestrator replaces the broker instead of
//! leaving it half alive. At shutdown the jobs get a grace period to finish
//! what they do on stop, and the rest are cancelled.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::http::Health;

/// How long the jobs get to finish after the stop signal.
const GRACE: Duration = Duration::from_secs(10);

pub(super) struct Jobs {
    set: JoinSet<&'static str>,
    stop: watch::Receiver<bool>,
}

impl Jobs {
    pub(super) fn new(stop: watch::Receiver<bool>) -> Jobs {
        Jobs {
            set: JoinSet::new(),
            stop,
        }
    }

    /// The stop signal every job follows.
    pub(super) fn stop(&self) -> watch::Receiver<bool> {
        self.stop.clone()
    }

    pub(super) fn spawn(
        &mut self,
        name: &'static str,
        job: impl Future<Output = ()> + Send + 'static,
    ) {
        self.set.spawn(async move {
            if AssertUnwindSafe(job).catch_unwind().await.is_err() {
                tracing::error!(job = name, "background job panicked");
            }
            name
        });
    }

    /// Watches the jobs until the stop signal, then waits for them to end.
    pub(super) async fn supervise(mut self, health: Option<Arc<Health>>) {
        let mut stop = self.stop.clone();
        loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                Some(ended) = self.set.join_next() => {
                    if *self.stop.borrow() {
                        // It ended because the broker is stopping.
                        break;
                    }
                    let name = ended.unwrap_or("unknown");
                    tracing::error!(job = name, "a background job ended while the broker was serving");
                    if let Some(h) = &health {
                        h.job_died(name);
                    }
                }
            }
        }
        let drained = async { while self.set.join_next().await.is_some() {} };
        if tokio::time::timeout(GRACE, drained).await.is_err() {
            tracing::warn!(
                left = self.set.len(),
                "background jobs still running after {GRACE:?}; cancelled"
            );
            self.set.shutdown().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_job_that_ends_while_serving_fails_readiness_and_one_ending_at_stop_does_not() {
        let health = Health::new(Arc::new(object_store::memory::InMemory::new()));
        health.serving(Default::default(), None);
        let (stop, stopped) = watch::channel(false);
        let mut jobs = Jobs::new(stopped);
        jobs.spawn("quitter", async {});
        let mut rx = jobs.stop();
        jobs.spawn("follower", async move {
            let _ = rx.wait_for(|s| *s).await;
        });
        let supervising = tokio::spawn(jobs.supervise(Some(health.clone())));
        tokio::time::timeout(Duration::from_secs(5), async {
            while health.not_ready().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await
        .expect("the dead job is reported");
        stop.send_replace(true);
        supervising.await.unwrap();
        let why = health.not_ready().unwrap();
        assert_eq!(why, "background jobs ended: quitter");
    }
}
