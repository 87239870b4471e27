//! What a scrape reads from the broker's parts: the counts each keeps as
//! plain atomics, the latency histograms handed down to them, and what is
//! computed only when asked (consumer lag: committed offset against the
//! partition's end, for the partitions this broker serves).

use std::fmt;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;

use prometheus_client::registry::Registry;

use crate::api::metrics::RequestMetrics;
use crate::api::{Broker, Route};
use crate::catalog::Traffic;
use crate::compaction::scheduler::Scheduler;
use crate::compaction::worker::MergeTotals;
use crate::manifest::counted::{Op, RequestCounts};
use crate::metrics::Timer;
use crate::tier::Tier;
use crate::wal::Wal;

/// What `/metrics` serves: the request metrics, and everything else read
/// when scraped.
pub(super) fn registry(requests: &RequestMetrics, scraped: Scraped) -> Registry {
    let mut registry = Registry::default();
    requests.register(&mut registry);
    registry.register_collector(Box::new(scraped));
    registry
}

pub(super) struct Scraped {
    pub broker: Arc<Broker>,
    pub tier: Arc<Tier>,
    pub scheduler: Arc<Scheduler>,
    pub store: Arc<RequestCounts>,
    pub merges: Arc<MergeTotals>,
    /// Cluster mode.
    pub wal: Option<Arc<Wal>>,
}

impl fmt::Debug for Scraped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Scraped")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, value: u64) -> fmt::Result {
    let m = ConstCounter::new(value);
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> fmt::Result {
    let m = ConstGauge::new(value);
    m.encode(e.encode_descriptor(name, help, None, m.metric_type())?)
}

fn histogram(e: &mut DescriptorEncoder, name: &str, help: &str, timer: &Timer) -> fmt::Result {
    timer
        .histogram()
        .encode(e.encode_descriptor(name, help, None, MetricType::Histogram)?)
}

/// One metric with a series per label set.
fn family<S: EncodeLabelSet, M: EncodeMetric>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    kind: MetricType,
    series: impl IntoIterator<Item = (S, M)>,
) -> fmt::Result {
    let mut m = e.encode_descriptor(name, help, None, kind)?;
    for (labels, value) in series {
        value.encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

impl Scraped {
    fn topics(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let topics = self.broker.catalog.topics();
        let per_topic = |e: &mut DescriptorEncoder, name, help, read: fn(&Traffic) -> u64| {
            family(
                e,
                name,
                help,
                MetricType::Counter,
                topics.iter().map(|t| {
                    (
                        [("topic", t.name().to_string())],
                        ConstCounter::new(read(t.traffic())),
                    )
                }),
            )
        };
        per_topic(
            e,
            "strata_topic_bytes_in",
            "Record batch bytes appended by produce requests, by topic",
            |t| t.bytes_in.load(Relaxed),
        )?;
        per_topic(
            e,
            "strata_topic_records_in",
            "Records appended by produce requests, by topic",
            |t| t.records_in.load(Relaxed),
        )?;
        per_topic(
            e,
            "strata_topic_bytes_out",
            "Record batch bytes returned to fetch requests, by topic",
            |t| t.bytes_out.load(Relaxed),
        )?;
        per_topic(
            e,
            "strata_topic_records_out",
            "Records in the batches returned to fetch requests, by topic",
            |t| t.records_out.load(Relaxed),
        )
    }

    /// Committed offset against end offset, for each partition with a
    /// committed offset that this broker serves (another broker's end offset
    /// is not known here).
    fn consumer_lag(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let broker = &self.broker;
        let mut series = Vec::new();
        for group in broker.coordinator.list() {
            for (topic_name, partitions) in broker.coordinator.fetch_offsets(&group.group_id, None)
            {
                let Some(topic) = broker.catalog.topic(&topic_name) else {
                    continue;
                };
                for (index, committed) in partitions {
                    let (Some(committed), Some(partition)) = (committed, topic.partition(index))
                    else {
                        continue;
                    };
                    if broker.route(topic.id(), index) == Route::Elsewhere {
                        continue;
                    }
                    let lag = (partition.high_watermark() - committed.offset).max(0);
                    series.push((
                        [
                            ("group", group.group_id.clone()),
                            ("topic", topic_name.clone()),
                            ("partition", index.to_string()),
                        ],
                        ConstGauge::new(lag),
                    ));
                }
            }
        }
        family(
            e,
            "strata_consumer_group_lag",
            "End offset minus committed offset, by group and partition (partitions this broker serves)",
            MetricType::Gauge,
            series,
        )
    }

    fn store(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let ops = |read: &dyn Fn(Op) -> u64| {
            Op::ALL
                .map(|op| ([("operation", op.name())], ConstCounter::new(read(op))))
                .into_iter()
                .collect::<Vec<_>>()
        };
        family(
            e,
            "strata_store_requests",
            "Requests to the object store, by operation",
            MetricType::Counter,
            ops(&|op| self.store.requests(op)),
        )?;
        family(
            e,
            "strata_store_request_errors",
            "Requests to the object store that failed (not found, already exists and precondition failed are answers, not failures), by operation",
            MetricType::Counter,
            ops(&|op| self.store.errors(op)),
        )?;
        family(
            e,
            "strata_store_request_latency_seconds",
            "Latency of requests to the object store, by operation (LIST: until its last page)",
            MetricType::Histogram,
            Op::ALL.map(|op| {
                (
                    [("operation", op.name())],
                    self.store.latency(op).histogram(),
                )
            }),
        )?;
        counter(
            e,
            "strata_store_put_bytes",
            "Bytes written to the object store by single PUTs",
            self.store.put_bytes.load(Relaxed),
        )
    }

    fn tier(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let stats = self.tier.stats();
        gauge(
            e,
            "strata_tier_upload_backlog_bytes",
            "Sealed segment bytes not yet uploaded, as of the uploader's last pass",
            stats.pending_upload_bytes.load(Relaxed) as f64,
        )?;
        gauge(
            e,
            "strata_tier_upload_backlog_segments",
            "Sealed segments not yet uploaded, as of the uploader's last pass",
            stats.pending_upload_segments.load(Relaxed) as f64,
        )?;
        counter(
            e,
            "strata_tier_segments_uploaded",
            "Sealed segments uploaded to the object store",
            stats.segments_uploaded.load(Relaxed),
        )?;
        counter(
            e,
            "strata_tier_bytes_uploaded",
            "Sealed segment bytes uploaded to the object store",
            stats.bytes_uploaded.load(Relaxed),
        )?;
        counter(
            e,
            "strata_tier_upload_failures",
            "Upload turns of a partition that failed (retried)",
            stats.upload_failures.load(Relaxed),
        )?;
        histogram(
            e,
            "strata_tier_upload_latency_seconds",
            "Time to upload one sealed segment's objects",
            &stats.upload_latency,
        )?;
        let cache = &self.tier.cache().counters;
        let (hits, misses) = (cache.hits.load(Relaxed), cache.gets.load(Relaxed));
        counter(
            e,
            "strata_cache_hits",
            "Reads of tiered data served from the block cache",
            hits,
        )?;
        counter(
            e,
            "strata_cache_misses",
            "Blocks of tiered data loaded from the object store (read-ahead included)",
            misses,
        )?;
        gauge(
            e,
            "strata_cache_hit_ratio",
            "Cache hits over hits and misses since start (0 before any read)",
            if hits + misses == 0 {
                0.0
            } else {
                hits as f64 / (hits + misses) as f64
            },
        )
    }

    fn compaction(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        gauge(
            e,
            "strata_compaction_jobs_outstanding",
            "Merges this broker queued that are not done yet",
            self.scheduler.outstanding_jobs() as f64,
        )?;
        let merges = &self.merges;
        counter(
            e,
            "strata_compaction_merges",
            "Merges done by this broker's compaction worker",
            merges.merges.load(Relaxed),
        )?;
        counter(
            e,
            "strata_compaction_input_bytes",
            "Segment bytes read by this broker's merges (bytes merged)",
            merges.input_bytes.load(Relaxed),
        )?;
        let written = merges.output_bytes.load(Relaxed);
        counter(
            e,
            "strata_compaction_output_bytes",
            "Segment bytes written by this broker's merges",
            written,
        )?;
        let uploaded = self.tier.stats().bytes_uploaded.load(Relaxed);
        if uploaded > 0 {
            gauge(
                e,
                "strata_compaction_write_amplification",
                "Segment bytes this broker wrote to the store (uploads and merges) per byte uploaded",
                (uploaded + written) as f64 / uploaded as f64,
            )?;
        }
        Ok(())
    }
}

impl Scraped {
    fn wal(&self, e: &mut DescriptorEncoder) -> fmt::Result {
        let Some(wal) = &self.wal else {
            return Ok(());
        };
        counter(
            e,
            "strata_wal_objects_written",
            "Write-ahead log objects written to the object store",
            wal.stats.puts.load(Relaxed),
        )?;
        counter(
            e,
            "strata_wal_hedged_puts",
            "Write-ahead log PUTs sent again because the first was not answered in --wal-hedge-ms",
            wal.stats.hedged.load(Relaxed),
        )?;
        histogram(
            e,
            "strata_wal_put_latency_seconds",
            "Time to PUT one write-ahead log object, retries included",
            &wal.stats.put_latency,
        )?;
        histogram(
            e,
            "strata_wal_ack_latency_seconds",
            "From a write-ahead log object's taking to its acknowledgement (after every earlier object)",
            &wal.stats.ack_latency,
        )
    }
}

impl Collector for Scraped {
    fn encode(&self, mut e: DescriptorEncoder) -> fmt::Result {
        self.topics(&mut e)?;
        self.consumer_lag(&mut e)?;
        self.store(&mut e)?;
        self.tier(&mut e)?;
        self.compaction(&mut e)?;
        self.wal(&mut e)?;
        histogram(
            &mut e,
            "strata_log_fsync_latency_seconds",
            "Time of the fsyncs that make appended batches durable",
            self.broker.catalog.sync_timer(),
        )
    }
}
