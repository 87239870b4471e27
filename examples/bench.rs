//! Throughput benchmark client for `scripts/bench`: librdkafka producing and
//! consuming as fast as it can, one JSON line of results per run.

// A benchmark measures real time; clippy.toml keeps the clock to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context as _};
use clap::{Args, Parser, Subcommand};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext, ThreadedProducer};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use serde_json::json;

#[derive(Parser)]
#[command(about = "Strata benchmark client")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a topic (replication factor 1).
    Create {
        #[command(flatten)]
        target: Target,
        /// Topic config overrides, `name=value`.
        #[arg(long = "config")]
        configs: Vec<String>,
    },
    /// Produce records and report throughput and delivery latency.
    Produce {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        records: u64,
        /// Payload bytes per record.
        #[arg(long, default_value_t = 100)]
        size: usize,
        /// With N > 0, record i has the key `k<i mod N>` (every key updated
        /// in turn); without, records have no key.
        #[arg(long, default_value_t = 0)]
        keys: u64,
        /// 0, 1 or -1 (all).
        #[arg(long, default_value = "1", allow_hyphen_values = true)]
        acks: String,
        #[arg(long, default_value_t = 5)]
        linger_ms: u32,
        /// batch.size: the most bytes librdkafka puts in one batch.
        #[arg(long, default_value_t = 1_000_000)]
        batch_bytes: u32,
        /// queue.buffering.max.messages: bounds how long a record can wait
        /// in the client, which dominates latency under saturation.
        #[arg(long, default_value_t = 1_000_000)]
        queue_messages: u32,
        #[command(flatten)]
        txn: TxnArgs,
    },
    /// Produce at a steady rate with acks=all and idempotence for
    /// `--seconds`, and report the longest gap between acknowledgements per
    /// partition: across a leader's loss, how long its partitions stalled.
    Steady {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        seconds: u64,
        /// Records per second over all partitions.
        #[arg(long, default_value_t = 2000)]
        rate: u64,
    },
    /// Produce at a steady rate for `--seconds` while a consumer reads the
    /// partitions' ends, and report produce→consume latency (how long a
    /// record took from its send to its arrival at the consumer) and
    /// produce latency (from its send to its acknowledgement).
    E2e {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Records per second over all partitions.
        #[arg(long, default_value_t = 1000)]
        rate: u64,
        /// Payload bytes per record (at least 8: the send instant).
        #[arg(long, default_value_t = 100)]
        size: usize,
        /// 0, 1 or -1 (all).
        #[arg(long, default_value = "-1", allow_hyphen_values = true)]
        acks: String,
        /// Requests in flight per connection, without idempotence. librdkafka
        /// sends one partition per produce request and, idempotent, at most
        /// 5 at a time, so against a broker that answers in tens of
        /// milliseconds its records queue in the client; this lifts that.
        #[arg(long)]
        in_flight: Option<u32>,
    },
    /// Read `--records` records back from offset 0 of every partition.
    Consume {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        records: u64,
        /// read_committed (librdkafka's default) or read_uncommitted.
        #[arg(long, default_value = "read_committed")]
        isolation: String,
    },
    /// Count the records readable from offset 0 to the end of partition 0.
    Count {
        #[command(flatten)]
        target: Target,
    },
}

/// Idempotent or transactional produce (both imply acks=all).
#[derive(Args)]
struct TxnArgs {
    #[arg(long)]
    idempotence: bool,
    /// Produce in transactions of this transactional.id, committed every
    /// `--commit-every-ms` or every `--commit-every-records`, whichever
    /// comes first (0: no such bound).
    #[arg(long)]
    transactional_id: Option<String>,
    #[arg(long, default_value_t = 0)]
    commit_every_ms: u64,
    #[arg(long, default_value_t = 0)]
    commit_every_records: u64,
}

#[derive(Args)]
struct Target {
    #[arg(long, default_value = "127.0.0.1:9092")]
    bootstrap: String,
    #[arg(long)]
    topic: String,
    #[arg(long, default_value_t = 1)]
    partitions: i32,
    /// More librdkafka settings, `name=value` (e.g. security.protocol).
    #[arg(long = "client-property")]
    properties: Vec<String>,
}

impl Target {
    /// A client of the bootstrap servers with the extra settings.
    fn client(&self) -> anyhow::Result<ClientConfig> {
        let mut config = ClientConfig::new();
        config.set("bootstrap.servers", &self.bootstrap);
        for p in &self.properties {
            let (name, value) = p
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--client-property {p}: expected name=value"))?;
            config.set(name, value);
        }
        Ok(config)
    }
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Create { target, configs } => create(&target, &configs),
        Command::Produce {
            target,
            records,
            size,
            keys,
            acks,
            linger_ms,
            batch_bytes,
            queue_messages,
            txn,
        } => produce(
            &target,
            records,
            Shape { size, keys },
            &acks,
            (linger_ms, batch_bytes),
            queue_messages,
            &txn,
        ),
        Command::Steady {
            target,
            seconds,
            rate,
        } => steady(&target, seconds, rate),
        Command::Consume {
            target,
            records,
            isolation,
        } => consume(&target, records, &isolation),
        Command::E2e {
            target,
            seconds,
            rate,
            size,
            acks,
            in_flight,
        } => end_to_end(&target, seconds, rate, size.max(8), &acks, in_flight),
        Command::Count { target } => count(&target),
    }
}

fn create(t: &Target, configs: &[String]) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = t.client()?.create()?;
    let mut topic = NewTopic::new(&t.topic, t.partitions, TopicReplication::Fixed(1));
    for c in configs {
        let (name, value) = c
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--config {c}: expected name=value"))?;
        topic = topic.set(name, value);
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let res = rt.block_on(admin.create_topics(&[topic], &AdminOptions::new()))?;
    match &res[0] {
        Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => Ok(()),
        Err((name, code)) => bail!("creating {name}: {code}"),
    }
}

/// Records per-record latency from the enqueue instant carried as the
/// delivery opaque (nanoseconds since `start`, so no allocation per record).
struct Latencies {
    start: Instant,
    micros: Mutex<Vec<u32>>,
    failed: AtomicU64,
}

impl ClientContext for Latencies {}

impl ProducerContext for Latencies {
    type DeliveryOpaque = usize;

    fn delivery(&self, result: &DeliveryResult<'_>, enqueued_ns: usize) {
        if let Err((e, _)) = result {
            if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                eprintln!("delivery failed: {e}");
            }
            return;
        }
        let us = (self.start.elapsed().as_nanos() as usize - enqueued_ns) / 1000;
        self.micros.lock().unwrap().push(us as u32);
    }
}

/// Records: payload bytes, and keys cycled through (0: no key).
struct Shape {
    size: usize,
    keys: u64,
}

fn produce(
    t: &Target,
    records: u64,
    Shape { size, keys }: Shape,
    acks: &str,
    (linger_ms, batch_bytes): (u32, u32),
    queue_messages: u32,
    txn: &TxnArgs,
) -> anyhow::Result<()> {
    let ctx = Latencies {
        start: Instant::now(),
        micros: Mutex::new(Vec::with_capacity(records as usize)),
        failed: AtomicU64::new(0),
    };
    let mut config = t.client()?;
    config
        .set("acks", acks)
        .set("linger.ms", linger_ms.to_string())
        .set("batch.size", batch_bytes.to_string())
        // Let batch.size, not the message count, close a batch.
        .set("batch.num.messages", "1000000")
        .set("compression.type", "none")
        .set("queue.buffering.max.messages", queue_messages.to_string())
        .set("queue.buffering.max.kbytes", "1048576");
    if txn.idempotence {
        config.set("enable.idempotence", "true");
    }
    if let Some(id) = &txn.transactional_id {
        config.set("transactional.id", id);
    }
    let producer: ThreadedProducer<Latencies> = config.create_with_context(ctx)?;
    // Metadata first, so connection setup is not part of the measurement.
    producer
        .client()
        .fetch_metadata(Some(&t.topic), Duration::from_secs(10))?;
    let transactional = txn.transactional_id.is_some();
    if transactional {
        producer.init_transactions(Duration::from_secs(30))?;
    } else if txn.idempotence {
        // Likewise the producer id: one record, not counted, before the clock
        // starts (init_transactions fetched it for a transactional producer).
        let record = BaseRecord::<str, [u8], usize>::with_opaque_to(&t.topic, 0)
            .payload(&b"warm-up"[..])
            .partition(0);
        producer.send(record).map_err(|(e, _)| e)?;
        flush(&producer, Duration::from_secs(30))?;
        producer.context().micros.lock().unwrap().clear();
    }
    let commit_every_ms = Duration::from_millis(txn.commit_every_ms);
    // (records in, start of) the open transaction
    let mut open: Option<(u64, Instant)> = None;
    let mut commits = 0u64;

    let payload: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    let start = Instant::now();
    let since_start = || producer.context().start.elapsed().as_nanos() as usize;
    let mut key = String::new();
    for i in 0..records {
        if transactional && open.is_none() {
            producer.begin_transaction()?;
            open = Some((0, Instant::now()));
        }
        key.clear();
        if keys > 0 {
            use std::fmt::Write;
            let _ = write!(key, "k{:09}", i % keys);
        }
        let mut record = BaseRecord::<str, [u8], usize>::with_opaque_to(&t.topic, since_start())
            .payload(&payload[..])
            .partition((i % t.partitions as u64) as i32);
        if keys > 0 {
            record = record.key(key.as_str());
        }
        loop {
            match producer.send(record) {
                Ok(()) => break,
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    std::thread::sleep(Duration::from_micros(500));
                    record = r.delivery_opaque(since_start());
                }
                Err((e, _)) => return Err(e).context("enqueue"),
            }
        }
        if let Some((n, began)) = &mut open {
            *n += 1;
            if (txn.commit_every_records > 0 && *n >= txn.commit_every_records)
                || (txn.commit_every_ms > 0 && began.elapsed() >= commit_every_ms)
            {
                commit(&producer, Duration::from_secs(60)).context("commit")?;
                commits += 1;
                open = None;
            }
        }
    }
    if open.is_some() {
        commit(&producer, Duration::from_secs(60)).context("commit")?;
        commits += 1;
    }
    flush(&producer, Duration::from_secs(120))?;
    let secs = start.elapsed().as_secs_f64();

    let ctx = producer.context();
    let failed = ctx.failed.load(Ordering::Relaxed);
    ensure!(failed == 0, "{failed} of {records} records failed");
    let mut lat = std::mem::take(&mut *ctx.micros.lock().unwrap());
    ensure!(
        lat.len() as u64 == records,
        "{} of {records} delivered",
        lat.len()
    );
    lat.sort_unstable();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize] as f64 / 1000.0;
    report(
        records,
        size as u64 * records,
        secs,
        Some((pct(0.50), pct(0.99))),
        transactional.then_some(commits),
    );
    Ok(())
}

// The rdkafka crate's `flush` (and `commit_transaction`, which calls it
// first) polls in 100 ms steps: `BaseProducer::poll` returns only at its
// deadline, so a flush with records in flight sleeps at least 100 ms even
// though they are acknowledged in a few. A librdkafka application flushes
// and commits through librdkafka itself, which waits for the last delivery
// report (served by the ThreadedProducer's thread) and nothing more; so do
// these two, or every commit would measure the crate's sleep.

/// `rd_kafka_commit_transaction`: flush (linger ignored), then EndTxn.
fn commit(producer: &ThreadedProducer<Latencies>, timeout: Duration) -> anyhow::Result<()> {
    use rdkafka::bindings as rd;
    let ptr = producer.client().native_ptr();
    // SAFETY: the handle outlives the call; the error is read and freed once.
    unsafe {
        let err = rd::rd_kafka_commit_transaction(ptr, timeout.as_millis() as i32);
        if err.is_null() {
            return Ok(());
        }
        let msg = std::ffi::CStr::from_ptr(rd::rd_kafka_error_string(err))
            .to_string_lossy()
            .into_owned();
        rd::rd_kafka_error_destroy(err);
        bail!("{msg}")
    }
}

/// `rd_kafka_flush`: returns once every record has its delivery report.
fn flush(producer: &ThreadedProducer<Latencies>, timeout: Duration) -> anyhow::Result<()> {
    let ptr = producer.client().native_ptr();
    // SAFETY: the handle outlives the call.
    let err = unsafe { rdkafka::bindings::rd_kafka_flush(ptr, timeout.as_millis() as i32) };
    ensure!(
        err == rdkafka::types::RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
        "flush: {err:?}"
    );
    Ok(())
}

/// Per partition: the last acknowledgement and the longest gap between two.
#[derive(Default)]
struct Acks {
    partitions: Mutex<Vec<(Option<Instant>, Duration)>>,
    acked: AtomicU64,
    failed: AtomicU64,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        let m = match result {
            Ok(m) => m,
            Err((e, _)) => {
                if self.failed.fetch_add(1, Ordering::Relaxed) == 0 {
                    eprintln!("delivery failed: {e}");
                }
                return;
            }
        };
        self.acked.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let mut partitions = self.partitions.lock().unwrap();
        let (last, gap) = &mut partitions[m.partition() as usize];
        if let Some(last) = last {
            *gap = (*gap).max(now - *last);
        }
        *last = Some(now);
    }
}

fn steady(t: &Target, seconds: u64, rate: u64) -> anyhow::Result<()> {
    let ctx = Acks {
        partitions: Mutex::new(vec![(None, Duration::ZERO); t.partitions as usize]),
        ..Acks::default()
    };
    let producer: ThreadedProducer<Acks> = t
        .client()?
        .set("acks", "all")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("message.timeout.ms", "120000")
        .create_with_context(ctx)?;
    producer
        .client()
        .fetch_metadata(Some(&t.topic), Duration::from_secs(10))?;
    let payload = [7u8; 100];
    let start = Instant::now();
    let total = seconds * rate;
    for i in 0..total {
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let record = BaseRecord::<(), [u8], ()>::to(&t.topic)
            .payload(&payload[..])
            .partition((i % t.partitions as u64) as i32);
        if let Err((e, _)) = producer.send(record) {
            bail!("enqueue: {e}");
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let ctx = producer.context();
    let gaps: Vec<f64> = ctx
        .partitions
        .lock()
        .unwrap()
        .iter()
        .map(|(_, gap)| gap.as_secs_f64() * 1000.0)
        .collect();
    println!(
        "{}",
        json!({
            "records": total,
            "acked": ctx.acked.load(Ordering::Relaxed),
            "failed": ctx.failed.load(Ordering::Relaxed),
            "max_gap_ms": gaps,
        })
    );
    Ok(())
}

fn end_to_end(
    t: &Target,
    seconds: u64,
    rate: u64,
    size: usize,
    acks: &str,
    in_flight: Option<u32>,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let total = seconds * rate;
    let consumer: BaseConsumer = t
        .client()?
        .set("group.id", "strata-bench")
        .set("enable.auto.commit", "false")
        .set("fetch.wait.max.ms", "500")
        .set("fetch.queue.backoff.ms", "0")
        .create()?;
    // Read from the ends as they are before the first record is sent.
    let mut tpl = TopicPartitionList::new();
    for p in 0..t.partitions {
        let (_, high) = consumer.fetch_watermarks(&t.topic, p, Duration::from_secs(10))?;
        tpl.add_partition_offset(&t.topic, p, Offset::Offset(high))?;
    }
    consumer.assign(&tpl)?;
    let reader = std::thread::spawn(move || -> anyhow::Result<Vec<u64>> {
        let mut micros = Vec::with_capacity(total as usize);
        let mut last_progress = Instant::now();
        while (micros.len() as u64) < total {
            match consumer.poll(Duration::from_millis(100)) {
                Some(Ok(m)) => {
                    let sent = m
                        .payload()
                        .and_then(|p| p.get(..8))
                        .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                        .context("a record without its send instant")?;
                    let now = start.elapsed().as_nanos() as u64;
                    micros.push(now.saturating_sub(sent) / 1000);
                    last_progress = Instant::now();
                }
                Some(Err(e)) => bail!("consume: {e}"),
                None if last_progress.elapsed() > Duration::from_secs(30) => {
                    bail!("stalled after {} of {total} records", micros.len())
                }
                None => {}
            }
        }
        Ok(micros)
    });
    let mut config = t.client()?;
    config.set("acks", acks).set("linger.ms", "1");
    match in_flight {
        Some(n) => {
            config.set("max.in.flight.requests.per.connection", n.to_string());
        }
        None if acks == "-1" || acks == "all" => {
            config.set("enable.idempotence", "true");
        }
        None => {}
    }
    let acked = Latencies {
        start,
        micros: Mutex::new(Vec::with_capacity(total as usize)),
        failed: AtomicU64::new(0),
    };
    let producer: ThreadedProducer<Latencies> = config.create_with_context(acked)?;
    let mut payload = vec![7u8; size];
    for i in 0..total {
        let due = start + Duration::from_secs_f64(1.0 + i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let sent = start.elapsed().as_nanos() as u64;
        payload[..8].copy_from_slice(&sent.to_le_bytes());
        let record = BaseRecord::<(), [u8], usize>::with_opaque_to(&t.topic, sent as usize)
            .payload(&payload[..])
            .partition((i % t.partitions as u64) as i32);
        if let Err((e, _)) = producer.send(record) {
            bail!("enqueue: {e}");
        }
    }
    producer.flush(Duration::from_secs(60))?;
    let mut micros = reader.join().expect("reader thread")?;
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    let context = producer.context();
    let mut acked = std::mem::take(&mut *context.micros.lock().unwrap());
    acked.sort_unstable();
    ensure!(!acked.is_empty(), "no record was acknowledged");
    let ack_at = |q: f64| acked[((acked.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    println!(
        "{}",
        json!({
            "records": micros.len(),
            "failed": context.failed.load(Ordering::Relaxed),
            "e2e_p50_ms": at(0.5),
            "e2e_p99_ms": at(0.99),
            "e2e_max_ms": at(1.0),
            "ack_p50_ms": ack_at(0.5),
            "ack_p99_ms": ack_at(0.99),
            "ack_max_ms": ack_at(1.0),
        })
    );
    Ok(())
}

fn consume(t: &Target, records: u64, isolation: &str) -> anyhow::Result<()> {
    let consumer: BaseConsumer = t
        .client()?
        .set("isolation.level", isolation)
        // Required by librdkafka, unused: reading by assignment only.
        .set("group.id", "strata-bench")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .set("fetch.max.bytes", "52428800")
        .set("max.partition.fetch.bytes", "8388608")
        .set("queued.max.messages.kbytes", "262144")
        // librdkafka pauses fetching for fetch.queue.backoff.ms (default 1 s)
        // once a partition holds queued.min.messages (default 100k), which
        // with small records caps a reader at ~100k records/s.
        .set("queued.min.messages", "1000000")
        .set("fetch.queue.backoff.ms", "10")
        .set("fetch.wait.max.ms", "100")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..t.partitions {
        tpl.add_partition_offset(&t.topic, p, Offset::Beginning)?;
    }
    consumer.assign(&tpl)?;

    let (mut count, mut bytes) = (0u64, 0u64);
    let mut start = None;
    let mut last_progress = Instant::now();
    while count < records {
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                // Timed from the first record: connecting and the first
                // ListOffsets round trip are not throughput.
                start.get_or_insert_with(Instant::now);
                count += 1;
                bytes += m.payload_len() as u64;
                last_progress = Instant::now();
            }
            Some(Err(e)) => bail!("consume: {e}"),
            None if last_progress.elapsed() > Duration::from_secs(15) => {
                bail!("stalled after {count} of {records} records")
            }
            None => {}
        }
    }
    let secs = start.map_or(0.0, |s| s.elapsed().as_secs_f64());
    report(count, bytes, secs, None, None);
    Ok(())
}

fn count(t: &Target) -> anyhow::Result<()> {
    let consumer: BaseConsumer = t
        .client()?
        .set("group.id", "strata-bench")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&t.topic, 0, Offset::Beginning)?;
    consumer.assign(&tpl)?;
    let (mut records, mut bytes) = (0u64, 0u64);
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        ensure!(
            Instant::now() < deadline,
            "no end of partition after {records} records"
        );
        match consumer.poll(Duration::from_millis(100)) {
            Some(Ok(m)) => {
                records += 1;
                bytes += (m.payload_len() + m.key_len()) as u64;
            }
            Some(Err(KafkaError::PartitionEOF(_))) => break,
            Some(Err(e)) => bail!("count: {e}"),
            None => {}
        }
    }
    println!(
        "{}",
        json!({ "records": records, "key_and_value_bytes": bytes })
    );
    Ok(())
}

fn report(records: u64, bytes: u64, secs: f64, latency: Option<(f64, f64)>, commits: Option<u64>) {
    let mut out = json!({
        "records": records,
        "seconds": secs,
        "records_per_sec": records as f64 / secs,
        "mb_per_sec": bytes as f64 / secs / 1e6,
        "cpu_seconds": cpu_seconds(),
    });
    if let Some((p50, p99)) = latency {
        out["p50_ms"] = json!(p50);
        out["p99_ms"] = json!(p99);
    }
    if let Some(commits) = commits {
        out["commits"] = json!(commits);
    }
    println!("{out}");
}

/// This process's user + system CPU time, to tell a client-bound run from a
/// broker-bound one.
fn cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let fields: Vec<&str> = stat.rsplit_once(") ")?.1.split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().ok()? + fields[12].parse::<u64>().ok()?;
    // USER_HZ: fixed at 100 in the Linux ABI.
    Some(ticks as f64 / 100.0)
}
