//! Merge benchmark: throughput against a plain copy of the same bytes, peak
//! memory of the merge, and the policy's write amplification.
//!
//! Two sealed segments of keyed records are generated, then each measured
//! step runs in a child process of this binary so its peak RSS (VmHWM) is its
//! own: building the key indexes, a plain copy of both logs into one file,
//! the compacting merge and the concatenating merge. All steps read the same
//! bytes in the same run, mostly from the page cache, so the ratio compares
//! the work of the merge with the work of moving the bytes. Then the same
//! through a `file://` object store, as compaction jobs run: a plain copy of
//! both logs into one new object (ranged GETs, multipart PUT) against a whole
//! compaction job (merge from the store, upload, manifest swap).
//!
//! Environment: MERGE_BENCH_SEGMENT_MB (default 1024) per source segment,
//! MERGE_BENCH_KEYS (default 2000000) distinct keys, MERGE_BENCH_CODEC
//! (none, gzip, snappy, lz4, zstd; default none), MERGE_BENCH_DIR (default a
//! temporary directory under target/).

// A benchmark measures real time; clippy.toml keeps the clock to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

use std::fs::File;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use kafka_protocol::records::Compression;
use object_store::ObjectStore;
use strata::catalog::config::TopicConfig;
use strata::compaction::job::{JobSpec, Outcome, Runner};
use strata::compaction::policy::{simulate, simulate_keyed, Leveled};
use strata::compaction::store_source::StoreSegment;
use strata::compaction::{merge, LocalSegment, LocalSink, MergeMode, MergeOptions, SegmentSource};
use strata::format::batch::{encode_batch, stamp_header, BatchHeader, HEADER_LEN};
use strata::log::key_index::{build_for_segment, DEFAULT_BUILD_BUDGET};
use strata::log::segment::Segment;
use strata::manifest::store::{default_url, open, S3Options};
use strata::manifest::{objects, partition_prefix, segment_key};
use strata::manifest::{Manifest, ManifestStore, TieredSegment, WriterEpoch};
use tokio::io::AsyncWriteExt;

const RECORDS_PER_BATCH: usize = 100;
const VALUE_BYTES: usize = 100;

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn codec() -> Compression {
    match std::env::var("MERGE_BENCH_CODEC").as_deref() {
        Ok("gzip") => Compression::Gzip,
        Ok("snappy") => Compression::Snappy,
        Ok("lz4") => Compression::Lz4,
        Ok("zstd") => Compression::Zstd,
        _ => Compression::None,
    }
}

/// xorshift: reproducible keys without a dependency.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// Hex digits of random numbers: compresses about 2:1, like typical payloads.
fn value(rng: &mut Rng) -> Bytes {
    let mut v = String::with_capacity(VALUE_BYTES + 16);
    while v.len() < VALUE_BYTES {
        v.push_str(&format!("{:016x}", rng.next()));
    }
    v.truncate(VALUE_BYTES);
    Bytes::from(v)
}

fn batch(rng: &mut Rng, keys: u64, ts: i64, compression: Compression) -> Bytes {
    let records = (0..RECORDS_PER_BATCH)
        .map(|_| {
            let key = Bytes::from(format!("key-{:012}", rng.next() % keys));
            (Some(key), Some(value(rng)), ts)
        })
        .collect();
    encode_batch(records, None, compression).unwrap()
}

/// Writes a sealed segment of about `bytes` bytes starting at `base`.
fn generate(dir: &Path, base: i64, bytes: u64, keys: u64, seed: u64) -> i64 {
    let mut seg = Segment::create(dir, base, 0).unwrap();
    let mut rng = Rng(seed);
    let compression = codec();
    let mut n = 0i64;
    while seg.size() < bytes {
        let raw = batch(&mut rng, keys, 1_000_000 + n, compression);
        let head = stamp_header(&raw, seg.next_offset(), 0, None);
        let h = BatchHeader::parse(&head).unwrap().unwrap();
        seg.append(
            &head,
            &raw[HEADER_LEN..],
            &h,
            0,
            strata::log::index::INDEX_INTERVAL_BYTES,
        )
        .unwrap();
        n += 1;
    }
    seg.seal(1).unwrap();
    seg.next_offset()
}

fn vm_hwm_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Runs one measured step in this process (as the child).
fn child(step: &str, src: &Path, out: &Path) {
    let t = Instant::now();
    let mut detail = String::new();
    match step {
        "keyindex" => {
            for s in LocalSegment::list(src).unwrap() {
                build_for_segment(src, s.meta().base_offset, DEFAULT_BUILD_BUDGET).unwrap();
            }
        }
        "copy" => {
            let mut w =
                BufWriter::with_capacity(1 << 20, File::create(out.join("copy.log")).unwrap());
            let mut buf = vec![0u8; 1 << 20];
            for s in LocalSegment::list(src).unwrap() {
                let mut r = s.log().unwrap();
                loop {
                    let n = r.read(&mut buf).unwrap();
                    if n == 0 {
                        break;
                    }
                    w.write_all(&buf[..n]).unwrap();
                }
            }
            w.into_inner().unwrap().sync_all().unwrap();
        }
        "compact" | "concat" => {
            let sources = LocalSegment::list(src).unwrap();
            let refs: Vec<&dyn SegmentSource> =
                sources.iter().map(|s| s as &dyn SegmentSource).collect();
            let mut sink = LocalSink::create(out, 0).unwrap();
            let opts = MergeOptions {
                mode: if step == "compact" {
                    MergeMode::Compact
                } else {
                    MergeMode::Concatenate
                },
                target_level: 1,
                // Every generated record is older than min.compaction.lag.ms.
                keep_newer_than: 2_000_000_000,
                tombstone_cutoff: None,
                keep_last_batch: false,
                now_ms: 2_000_000_000,
            };
            let (meta, stats) = merge(&refs, &mut sink, &opts, &[]).unwrap();
            detail = format!(
                "output {} MiB, {} batches copied, {} rewritten, {} dropped, {} keys",
                meta.size >> 20,
                stats.batches_copied,
                stats.batches_rewritten,
                stats.batches_dropped,
                stats.keys
            );
        }
        "store-copy" | "store-compact" => detail = store_step(step, src, out),
        other => panic!("unknown step {other}"),
    }
    println!(
        "RESULT {} {} {}",
        t.elapsed().as_secs_f64(),
        vm_hwm_kib(),
        detail
    );
}

const TOPIC: &str = "bench";

fn topic_id() -> uuid::Uuid {
    uuid::Uuid::from_u128(0x5747_a7a0)
}

fn store_at(root: &Path) -> Arc<dyn ObjectStore> {
    open(&default_url(root), &S3Options::default()).unwrap()
}

/// Uploads the generated segments into a `file://` store under `root` and
/// writes a manifest naming them, as the broker's uploader would.
fn upload_sources(src: &Path, root: &Path) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let store = store_at(root);
        let prefix = partition_prefix(TOPIC, topic_id(), 0);
        let writer = WriterEpoch::new(1, &strata::clock::SystemClock, &strata::clock::OsRandom);
        let mut segments = Vec::new();
        for s in LocalSegment::list(src).unwrap() {
            let key = segment_key(&prefix, s.meta().base_offset, 0);
            objects::upload_segment(&store, src, s.meta(), &key)
                .await
                .unwrap();
            segments.push(TieredSegment::from_meta(key, s.meta()));
        }
        let m = Manifest::empty(writer.clone()).next(&writer, 0, |m| m.segments = segments);
        ManifestStore::new(store, prefix.child("manifest"))
            .create(&m)
            .await
            .unwrap();
    });
}

/// One step through the store in `src`'s sibling `store/` directory.
fn store_step(step: &str, src: &Path, out: &Path) -> String {
    let root = src.parent().unwrap().join("store");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let store = store_at(&root);
        let prefix = partition_prefix(TOPIC, topic_id(), 0);
        let m = ManifestStore::new(store.clone(), prefix.child("manifest"))
            .load_latest()
            .await
            .unwrap()
            .unwrap();
        if step == "store-copy" {
            let handle = tokio::runtime::Handle::current();
            let scratch = out.to_path_buf();
            let copied = tokio::task::spawn_blocking(move || {
                let mut w = object_store::buffered::BufWriter::with_capacity(
                    store.clone(),
                    prefix.child("copy.log"),
                    8 << 20,
                );
                let mut buf = vec![0u8; 1 << 20];
                let mut copied = 0u64;
                for seg in &m.segments {
                    let source =
                        StoreSegment::new(store.clone(), seg, handle.clone(), scratch.clone());
                    let mut r = source.log().unwrap();
                    loop {
                        let n = r.read(&mut buf).unwrap();
                        if n == 0 {
                            break;
                        }
                        handle.block_on(w.write_all(&buf[..n])).unwrap();
                        copied += n as u64;
                    }
                }
                handle.block_on(w.shutdown()).unwrap();
                copied
            })
            .await
            .unwrap();
            return format!("copied {} MiB into one object", copied >> 20);
        }
        let job = JobSpec {
            topic: TOPIC.into(),
            topic_id: topic_id(),
            partition: 0,
            sources: m.segments.iter().map(|s| s.key.clone()).collect(),
            target_level: 1,
            config: TopicConfig::from_pairs([("cleanup.policy", Some("compact"))]).unwrap(),
            delete_delay_ms: 0,
            max_run_ms: u64::MAX / 2,
            queued_ms: 0,
        };
        match Runner::new(store, 1, out.to_path_buf())
            .run(&job)
            .await
            .unwrap()
        {
            Outcome::Merged(m) => format!(
                "output {} MiB, {} records removed",
                m.output.size >> 20,
                m.stats.records_removed
            ),
            Outcome::Stale(reason) => panic!("stale job: {reason}"),
        }
    })
}

struct Measured {
    secs: f64,
    hwm_mib: f64,
    detail: String,
}

fn run_child(step: &str, src: &Path, out: &Path) -> Measured {
    let _ = std::fs::remove_dir_all(out);
    std::fs::create_dir_all(out).unwrap();
    let o = Command::new(std::env::current_exe().unwrap())
        .args(["child", step, src.to_str().unwrap(), out.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{step}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap();
    let mut parts = line.splitn(3, ' ');
    let secs: f64 = parts.next().unwrap().parse().unwrap();
    let hwm: f64 = parts.next().unwrap().parse().unwrap();
    Measured {
        secs,
        hwm_mib: hwm / 1024.0,
        detail: parts.next().unwrap_or("").to_string(),
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() == 5 && args[1] == "child" {
        child(&args[2], Path::new(&args[3]), Path::new(&args[4]));
        return;
    }
    let seg_mb = env_u64("MERGE_BENCH_SEGMENT_MB", 1024);
    let keys = env_u64("MERGE_BENCH_KEYS", 2_000_000);
    let root = std::env::var("MERGE_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/merge-bench"));
    let _ = std::fs::remove_dir_all(&root);
    let src = root.join("src");
    std::fs::create_dir_all(&src).unwrap();

    println!(
        "== merge bench: 2 segments x {seg_mb} MiB, {keys} keys, codec {:?}, {RECORDS_PER_BATCH} records/batch",
        codec()
    );
    let t = Instant::now();
    let next = generate(&src, 0, seg_mb << 20, keys, 0x9e3779b97f4a7c15);
    generate(&src, next, seg_mb << 20, keys, 0x2545f4914f6cdd1d);
    let input: u64 = LocalSegment::list(&src)
        .unwrap()
        .iter()
        .map(|s| s.meta().size)
        .sum();
    let input_mib = input as f64 / (1 << 20) as f64;
    println!(
        "generated {input_mib:.0} MiB in {:.1}s",
        t.elapsed().as_secs_f64()
    );

    let ki = run_child("keyindex", &src, &root.join("ki"));
    println!(
        "key index build : {:7.2}s {:8.1} MiB/s   peak RSS {:6.1} MiB",
        ki.secs,
        input_mib / ki.secs,
        ki.hwm_mib
    );
    let copy = run_child("copy", &src, &root.join("copy"));
    println!(
        "plain copy      : {:7.2}s {:8.1} MiB/s   peak RSS {:6.1} MiB",
        copy.secs,
        input_mib / copy.secs,
        copy.hwm_mib
    );
    for step in ["compact", "concat"] {
        let m = run_child(step, &src, &root.join(step));
        println!(
            "merge {step:<9} : {:7.2}s {:8.1} MiB/s   peak RSS {:6.1} MiB   throughput/copy {:.2}   ({})",
            m.secs,
            input_mib / m.secs,
            m.hwm_mib,
            copy.secs / m.secs,
            m.detail
        );
    }

    // The same through a file:// object store.
    let t = Instant::now();
    upload_sources(&src, &root.join("store"));
    println!(
        "uploaded to a file:// store in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let copy = run_child("store-copy", &src, &root.join("store-copy"));
    println!(
        "store copy      : {:7.2}s {:8.1} MiB/s   peak RSS {:6.1} MiB   ({})",
        copy.secs,
        input_mib / copy.secs,
        copy.hwm_mib,
        copy.detail
    );
    let job = run_child("store-compact", &src, &root.join("store-compact"));
    println!(
        "compaction job  : {:7.2}s {:8.1} MiB/s   peak RSS {:6.1} MiB   throughput/copy {:.2}   ({})",
        job.secs,
        input_mib / job.secs,
        job.hwm_mib,
        copy.secs / job.secs,
        job.detail
    );

    let total = 2_000_000_000u64;
    for seg in [1u64 << 20, 8 << 20] {
        println!("== policy: 2 GB into one partition, {} MiB segments (cleanup.policy=delete: nothing shrinks)", seg >> 20);
        for fanout in [2usize, 4, 8, 16] {
            let r = simulate(
                &Leveled {
                    fanout,
                    max_segment_bytes: u32::MAX as u64,
                    max_compaction_lag_ms: i64::MAX,
                    dirty_ratio: None,
                    min_compaction_lag_ms: 0,
                },
                seg,
                total,
                None,
            );
            println!(
                "fanout {fanout:2}: write amplification {:5.2}  segments at end {:3}  max {:3}  merges {:5}  levels {}",
                r.write_amplification, r.segments_final, r.segments_max, r.merges, r.max_level
            );
        }
    }
    println!("== policy: 200 MiB of 1 KiB updates to 20,000 keys, 1 MiB segments, fan-out 4 (cleanup.policy=compact)");
    for ratio in [None, Some(0.5), Some(0.25)] {
        let r = simulate_keyed(
            &Leveled {
                fanout: 4,
                max_segment_bytes: u32::MAX as u64,
                max_compaction_lag_ms: i64::MAX,
                dirty_ratio: ratio,
                min_compaction_lag_ms: 0,
            },
            1 << 20,
            1024,
            20_000,
            200 << 20,
        );
        println!(
            "min.cleanable.dirty.ratio {:>4}: write amplification {:5.2}  tiered at end {:.2} x live  most {:.2} x live  merges {}",
            ratio.map_or("off".to_string(), |r| r.to_string()),
            r.report.write_amplification,
            r.final_bytes as f64 / r.live_bytes as f64,
            r.max_bytes as f64 / r.live_bytes as f64,
            r.report.merges
        );
    }
    let _ = std::fs::remove_dir_all(&root);
}
