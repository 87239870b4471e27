//! Leveled compaction against segments written by a real broker: a librdkafka
//! producer writes keyed updates into a compacted topic with tiny segments,
//! the sealed segments are merged into a new directory, and the Partition
//! reader over the result must show exactly one record per live key in the
//! merged range and the uncompacted head untouched.

use crate::common;
use common::clients;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use crate::common::now_ms;
use bytes::Bytes;
use common::InProcess;
use kafka_protocol::records::RecordBatchDecoder;
use rdkafka::producer::{FutureProducer, FutureRecord};
use strata::catalog::config::TopicConfig;
use strata::compaction::{merge, LocalSegment, LocalSink, MergeOptions, SegmentSource};
use strata::format::segment::file_name;
use strata::log::{Partition, Visibility};

const TIMEOUT: Duration = Duration::from_secs(20);
const KEYS: usize = 20;
const VERSIONS: usize = 60;
const DELETED: usize = 4;

type Rec = (i64, Option<Bytes>, Option<Bytes>);

/// Every record of a partition, read through `Partition::read` from offset 0
/// across whatever gaps compaction left.
fn read_all(p: &Partition) -> Vec<Rec> {
    let mut out = Vec::new();
    let mut offset = 0;
    while offset < p.end_offset() {
        let slice = p.read(offset, 1 << 20, true).unwrap();
        assert!(!slice.records.is_empty(), "stuck at offset {offset}");
        let mut buf = slice.records.clone();
        for set in RecordBatchDecoder::decode_all(&mut buf).unwrap() {
            for r in set.records {
                if r.offset >= offset {
                    out.push((r.offset, r.key, r.value));
                }
            }
        }
        let mut b = &slice.records[..];
        while let Ok(Some(h)) = strata::format::batch::BatchHeader::parse(b) {
            offset = offset.max(h.last_offset() + 1);
            b = &b[h.size..];
        }
    }
    out
}

fn copy_segment_files(from: &Path, to: &Path, base: i64) {
    for ext in ["log", "index", "timeindex", "meta"] {
        let src = from.join(file_name(base, ext));
        if src.exists() {
            std::fs::copy(&src, to.join(file_name(base, ext))).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merged_segments_keep_one_record_per_live_key() {
    // No uploads during the test: the merge reads the sealed segments from local disk.
    let broker = InProcess::start(&["--tier-interval-ms", "3600000"]).await;
    let bs = broker.bootstrap();
    let configs = [
        ("cleanup.policy", "compact"),
        ("segment.bytes", "4096"),
        ("delete.retention.ms", "0"),
    ];
    clients::create_topic(&bs, "updates", 1, &configs).await;

    let producer: FutureProducer = clients::producer(
        &bs,
        &[
            ("acks", "all"),
            ("linger.ms", "2"),
            ("enable.idempotence", "true"),
            ("compression.type", "lz4"),
        ],
    );
    // VERSIONS rounds over KEYS keys; the first DELETED keys end in a tombstone.
    let mut produced: Vec<Rec> = Vec::new();
    for round in 0..VERSIONS {
        let ops: Vec<(String, Option<String>)> = (0..KEYS)
            .map(|k| {
                let key = format!("key-{k}");
                let value = (round + 1 < VERSIONS || k >= DELETED)
                    .then(|| format!("{key}-v{round}-{}", "x".repeat(k * 3)));
                (key, value)
            })
            .collect();
        let pending: Vec<_> = ops
            .iter()
            .map(|(key, value)| {
                let mut rec = FutureRecord::<str, str>::to("updates")
                    .partition(0)
                    .key(key);
                if let Some(v) = value {
                    rec = rec.payload(v);
                }
                producer.send(rec, TIMEOUT)
            })
            .collect();
        for ((key, value), fut) in ops.iter().zip(pending) {
            let offset = fut.await.unwrap().offset;
            produced.push((
                offset,
                Some(Bytes::from(key.clone())),
                value.clone().map(Bytes::from),
            ));
        }
    }
    // A short tail that stays in the active segment, uncompacted.
    for i in 0..3 {
        let offset = producer
            .send(
                FutureRecord::<str, str>::to("updates")
                    .partition(0)
                    .key("key-0")
                    .payload(&format!("tail-{i}")),
                TIMEOUT,
            )
            .await
            .unwrap()
            .offset;
        produced.push((
            offset,
            Some(Bytes::from("key-0")),
            Some(Bytes::from(format!("tail-{i}"))),
        ));
    }
    produced.sort_by_key(|r| r.0);

    let dir = broker.dir.path().join("topics/updates/0");
    let sealed = LocalSegment::list(&dir).unwrap();
    assert!(sealed.len() >= 4, "only {} sealed segments", sealed.len());
    let merged_end = sealed.last().unwrap().meta().next_offset;
    let active_base = merged_end;
    assert!(dir.join(file_name(active_base, "log")).exists());

    let out = tempfile::tempdir().unwrap();
    let refs: Vec<&dyn SegmentSource> = sealed.iter().map(|s| s as &dyn SegmentSource).collect();
    let mut sink = LocalSink::create(out.path(), 0).unwrap();
    let cfg = TopicConfig::from_pairs(configs.iter().map(|(k, v)| (*k, Some(*v)))).unwrap();
    // Wait a millisecond so every produced record is older than "now".
    std::thread::sleep(Duration::from_millis(5));
    let opts = MergeOptions::for_topic(&cfg.settings(), 1, true, now_ms());
    let (meta, stats) = merge(&refs, &mut sink, &opts, &[]).unwrap();
    assert_eq!(
        (meta.base_offset, meta.next_offset, meta.level),
        (0, merged_end, 1)
    );
    assert!(stats.output_bytes < stats.input_bytes / 4, "{stats:?}");
    assert!(
        stats.tombstones_removed as usize >= DELETED - 1,
        "{stats:?}"
    );

    // The merged segment plus the untouched active segment form the log.
    copy_segment_files(&dir, out.path(), active_base);
    let log = Partition::open(out.path(), Visibility::default()).unwrap();
    let got = read_all(&log);

    // Merged range: exactly the newest record of every key whose newest
    // record there is not a tombstone.
    let mut newest: BTreeMap<Bytes, Rec> = BTreeMap::new();
    for r in produced.iter().filter(|r| r.0 < merged_end) {
        newest.insert(r.1.clone().unwrap(), r.clone());
    }
    let mut want: Vec<Rec> = newest.into_values().filter(|r| r.2.is_some()).collect();
    want.sort_by_key(|r| r.0);
    let got_merged: Vec<Rec> = got.iter().filter(|r| r.0 < merged_end).cloned().collect();
    assert_eq!(got_merged, want);
    let live = got_merged.len();
    assert!((KEYS - DELETED..=KEYS).contains(&live), "{live} live keys");

    // Uncompacted data: untouched, record for record and byte for byte.
    let tail: Vec<Rec> = produced
        .iter()
        .filter(|r| r.0 >= merged_end)
        .cloned()
        .collect();
    assert_eq!(
        got.iter()
            .filter(|r| r.0 >= merged_end)
            .cloned()
            .collect::<Vec<_>>(),
        tail
    );
    assert_eq!(
        std::fs::read(dir.join(file_name(active_base, "log"))).unwrap(),
        std::fs::read(out.path().join(file_name(active_base, "log"))).unwrap()
    );

    // A fetch at a removed offset returns the next surviving record.
    let removed = (0..merged_end)
        .find(|o| !want.iter().any(|r| r.0 == *o))
        .unwrap();
    let slice = log.read(removed, 1 << 20, true).unwrap();
    let mut buf = slice.records.clone();
    let first = RecordBatchDecoder::decode_all(&mut buf).unwrap()[0]
        .records
        .iter()
        .find(|r| r.offset >= removed)
        .map(|r| r.offset);
    assert_eq!(first, want.iter().map(|r| r.0).find(|o| *o >= removed));
}
