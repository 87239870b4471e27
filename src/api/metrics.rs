//! What the front end counts: requests per API and version, their latency
//! per API, the error codes answered and the connections open.
//!
//! Every request passes here, produce above all, so the counters a request
//! touches are created once at start-up, one per API and version the
//! dispatch table serves, and found by indexing: a request costs an atomic
//! increment and a latency observation, never a label set built or hashed.
//! Error codes are counted per API, version and code as they occur; a
//! response carrying errors is the exception, so finding its counter by
//! hashing three small integers is cheap enough, and the names are only
//! spelled out when the metrics are scraped.

use std::fmt;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::*;
use prometheus_client::encoding::{EncodeLabelSet, LabelSetEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use super::dispatch::APIS;
use crate::metrics::latency_histogram;

/// Labels `api` and `version`.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct ApiVersion {
    api: i16,
    version: i16,
}

impl EncodeLabelSet for ApiVersion {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        [
            ("api", api_name(self.api)),
            ("version", self.version.to_string()),
        ]
        .encode(encoder)
    }
}

/// Labels `api`, `version` and `error` (Kafka's name for the code).
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct ApiError {
    api: i16,
    version: i16,
    code: i16,
}

impl EncodeLabelSet for ApiError {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        [
            ("api", api_name(self.api)),
            ("version", self.version.to_string()),
            ("error", error_name(self.code)),
        ]
        .encode(encoder)
    }
}

/// Label `api`.
#[derive(Debug, Clone, Hash, PartialEq, Eq)]
struct Api(i16);

impl EncodeLabelSet for Api {
    fn encode(&self, encoder: &mut LabelSetEncoder) -> fmt::Result {
        [("api", api_name(self.0))].encode(encoder)
    }
}

fn api_name(key: i16) -> String {
    match ApiKey::try_from(key) {
        Ok(k) => format!("{k:?}"),
        Err(_) => key.to_string(),
    }
}

/// `NOT_LEADER_OR_FOLLOWER`, as Kafka spells it.
fn error_name(code: i16) -> String {
    let Some(e) = ResponseError::try_from_code(code) else {
        return code.to_string();
    };
    let mut out = String::new();
    for (i, c) in format!("{e:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push('_');
        }
        out.push(c.to_ascii_uppercase());
    }
    out
}

/// The counters of one API.
struct ApiSlot {
    first_version: i16,
    /// By version, from `first_version`.
    requests: Vec<Counter>,
    latency: Histogram,
}

type Latencies = Family<Api, Histogram, fn() -> Histogram>;

pub(crate) struct RequestMetrics {
    /// By API key.
    apis: Vec<Option<ApiSlot>>,
    requests: Family<ApiVersion, Counter>,
    latency: Latencies,
    errors: Family<ApiError, Counter>,
    /// Connections open now.
    pub connections: Gauge,
    /// Connections accepted since start.
    pub connections_accepted: Counter,
}

impl Default for RequestMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestMetrics {
    pub(crate) fn new() -> RequestMetrics {
        let requests = Family::<ApiVersion, Counter>::default();
        let latency: Latencies = Family::new_with_constructor(latency_histogram);
        let max_key = APIS.iter().map(|a| a.key).max().unwrap_or(0);
        let mut apis: Vec<Option<ApiSlot>> = (0..=max_key).map(|_| None).collect();
        for api in APIS {
            let counter = |version| {
                requests
                    .get_or_create(&ApiVersion {
                        api: api.key,
                        version,
                    })
                    .clone()
            };
            apis[api.key as usize] = Some(ApiSlot {
                first_version: *api.versions.start(),
                requests: api.versions.clone().map(counter).collect(),
                latency: latency.get_or_create_owned(&Api(api.key)),
            });
        }
        RequestMetrics {
            apis,
            requests,
            latency,
            errors: Family::default(),
            connections: Gauge::default(),
            connections_accepted: Counter::default(),
        }
    }

    pub(crate) fn register(&self, registry: &mut Registry) {
        registry.register(
            "strata_requests",
            "Requests received, by API and version",
            self.requests.clone(),
        );
        registry.register(
            "strata_request_errors",
            "Error codes answered, by API, version and error (each partition or resource that failed counts once)",
            self.errors.clone(),
        );
        registry.register(
            "strata_request_latency_seconds",
            "Time from a request's arrival to its response being ready, by API",
            self.latency.clone(),
        );
        registry.register(
            "strata_connections_open",
            "Client connections open",
            self.connections.clone(),
        );
        registry.register(
            "strata_connections_accepted",
            "Client connections accepted",
            self.connections_accepted.clone(),
        );
    }

    fn slot(&self, key: i16) -> Option<&ApiSlot> {
        self.apis.get(usize::try_from(key).ok()?)?.as_ref()
    }

    /// Counts a request the broker serves; false for one it does not.
    pub(crate) fn request(&self, key: i16, version: i16) -> bool {
        let counter = self.slot(key).and_then(|s| {
            s.requests
                .get(usize::try_from(version - s.first_version).ok()?)
        });
        match counter {
            Some(c) => {
                c.inc();
                true
            }
            None => false,
        }
    }

    pub(crate) fn latency(&self, key: i16, elapsed: std::time::Duration) {
        if let Some(s) = self.slot(key) {
            s.latency.observe(elapsed.as_secs_f64());
        }
    }

    /// Counts one error code answered (0, no error, is not counted).
    pub(crate) fn error(&self, key: i16, version: i16, code: i16) {
        if code != 0 {
            self.errors
                .get_or_create(&ApiError {
                    api: key,
                    version,
                    code,
                })
                .inc();
        }
    }
}

/// The error codes a response carries, wherever its type keeps them.
pub(crate) trait ErrorCodes {
    fn each_error(&self, f: &mut dyn FnMut(i16));
}

/// Says where a response keeps its error codes: `Type => |r, f| body;`
/// calls `f` with each of them. Every API's module writes this for its own
/// responses, next to its table entry, so a new API cannot be served without
/// its errors being counted (dispatch requires the impl).
macro_rules! error_codes {
    ($($t:ty => |$r:ident, $f:ident| $body:expr;)*) => {
        $(impl $crate::api::metrics::ErrorCodes for $t {
            fn each_error(&self, $f: &mut dyn FnMut(i16)) {
                let $r = self;
                $body
            }
        })*
    };
}
pub(crate) use error_codes;

#[cfg(test)]
mod tests {
    use super::*;

    fn scrape(metrics: &RequestMetrics) -> String {
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn counts_requests_by_api_and_version_and_errors_by_name() {
        let m = RequestMetrics::new();
        assert!(m.request(ApiKey::Produce as i16, 9));
        assert!(m.request(ApiKey::Produce as i16, 9));
        assert!(!m.request(ApiKey::Produce as i16, 99), "unserved version");
        assert!(!m.request(-1, 0));
        m.error(
            ApiKey::Fetch as i16,
            12,
            ResponseError::NotLeaderOrFollower.code(),
        );
        m.error(ApiKey::Fetch as i16, 12, 0);
        let text = scrape(&m);
        assert!(
            text.contains(r#"strata_requests_total{api="Produce",version="9"} 2"#),
            "{text}"
        );
        assert!(
            text.contains(
                r#"strata_request_errors_total{api="Fetch",version="12",error="NOT_LEADER_OR_FOLLOWER"} 1"#
            ),
            "{text}"
        );
        assert_eq!(text.matches("strata_request_errors_total{").count(), 1);
    }

    /// What the metrics add to one Produce request, measured directly (the
    /// end-to-end comparison in `scripts/bench-metrics` is at the mercy of
    /// the machine's load): counting it, two clock reads, the latency
    /// observation and the walk over its response's error codes, on one
    /// thread and on two sharing the same counters.
    #[test]
    #[ignore = "a measurement, run by scripts/bench-metrics"]
    fn per_request_cost() {
        use kafka_protocol::messages::produce_response::*;
        let m = std::sync::Arc::new(RequestMetrics::new());
        let response = ProduceResponse::default()
            .with_responses(vec![TopicProduceResponse::default()
                .with_partition_responses(vec![PartitionProduceResponse::default()])]);
        const N: u32 = 2_000_000;
        let run = |m: &RequestMetrics| {
            let started = std::time::Instant::now();
            for _ in 0..N {
                let arrived = std::time::Instant::now();
                assert!(m.request(ApiKey::Produce as i16, 9));
                response.each_error(&mut |code| m.error(ApiKey::Produce as i16, 9, code));
                m.latency(ApiKey::Produce as i16, arrived.elapsed());
            }
            started.elapsed().as_nanos() as f64 / N as f64
        };
        let alone = run(&m);
        let shared: Vec<f64> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..2).map(|_| s.spawn(|| run(&m))).collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        println!(
            "metrics per Produce request: {alone:.0} ns on one thread, {:.0} ns each on two sharing the counters",
            shared.iter().sum::<f64>() / shared.len() as f64
        );
    }

    #[test]
    fn produce_errors_are_found_in_every_partition() {
        use kafka_protocol::messages::produce_response::*;
        let partition = |code| PartitionProduceResponse::default().with_error_code(code);
        let response =
            ProduceResponse::default().with_responses(vec![TopicProduceResponse::default()
                .with_partition_responses(vec![partition(0), partition(6), partition(10)])]);
        let mut codes = Vec::new();
        response.each_error(&mut |c| codes.push(c));
        assert_eq!(codes, [0, 6, 10]);
    }
}
