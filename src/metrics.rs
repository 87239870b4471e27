//! Measurement handles the lower layers record into.
//!
//! The broker exports its metrics over HTTP (`server::http`), but what is
//! measured happens far below that: an fsync in the log, an upload in the
//! tier, a request to the object store. Those layers must not know about
//! HTTP nor about the registry that names and exports the series, so they
//! are handed only what they record into: a `Timer`, a latency histogram
//! that is cheap to clone and to share. Counts that already exist as plain
//! atomics (bytes per topic, uploads, cache hits) are read at scrape time
//! instead, so recording them costs the hot path nothing more.

use std::time::Duration;

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

/// A histogram of latencies in seconds, from 50 µs to about 52 s in factors
/// of two: wide enough for an fsync on a fast disk and for a PUT to a
/// distant store.
pub(crate) fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.000_05, 2.0, 21))
}

/// A latency histogram; clones record into the same one.
#[derive(Debug, Clone)]
pub struct Timer(Histogram);

impl Default for Timer {
    fn default() -> Timer {
        Timer(latency_histogram())
    }
}

impl Timer {
    pub fn observe(&self, elapsed: Duration) {
        self.0.observe(elapsed.as_secs_f64());
    }

    /// The histogram, for registering under a name.
    pub fn histogram(&self) -> Histogram {
        self.0.clone()
    }
}
