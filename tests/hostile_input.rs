//! Hostile input, randomised: request frames for every API the broker
//! advertises (random bodies built from Kafka's primitive types with lying
//! lengths and counts), produced batches mutated and re-checksummed in every
//! codec, decompression bombs and snappy blocks declaring lengths they do not
//! hold. Each case runs against a broker in this process, so a panic in any
//! connection task is seen (a panic hook counts them), and so is every
//! allocation (a counting global allocator keeps the largest one): a declared
//! length must never allocate more than the bytes present justify.
//!
//! The case counts are fixed (proptest with a fixed seed), so the run is
//! bounded and repeatable; `HOSTILE_CASES` multiplies them for a longer hunt.

// Tests read the real clock and draw real ids; clippy.toml keeps that to
// `strata::clock` only in the library.
#![allow(clippy::disallowed_methods)]

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Once;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use kafka_protocol::messages::*;
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use kafka_protocol::records::Compression;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

struct Counting;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
static PANICS: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

const MIB: usize = 1 << 20;

/// The allocation bound is process-wide: one test at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn count_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            PANICS.fetch_add(1, Ordering::SeqCst);
            default(info);
        }));
    });
}

fn cases(n: u32) -> u32 {
    let scale = std::env::var("HOSTILE_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1);
    n * scale
}

fn runner(n: u32, seed: u8) -> TestRunner {
    let config = Config {
        cases: cases(n),
        failure_persistence: None,
        ..Config::default()
    };
    TestRunner::new_with_rng(
        config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &[seed; 32]),
    )
}

/// A small fixed-seed generator for the plain loops (proptest drives the rest).
struct XorShift(u64);

impl XorShift {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// A broker on its own runtime, for a synchronous driver.
struct Broker {
    _rt: tokio::runtime::Runtime,
    inner: common::InProcess,
}

impl Broker {
    fn start(extra: &[&str]) -> Broker {
        count_panics();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let inner = rt.block_on(common::InProcess::start(extra));
        Broker { _rt: rt, inner }
    }
    fn addr(&self) -> SocketAddr {
        self.inner.addr()
    }
}

/// Sends one frame on a fresh connection and waits briefly for an answer or
/// the close; `Some(bytes)` is the response frame.
fn exchange(addr: SocketAddr, frame: &[u8], wait: Duration) -> Option<Vec<u8>> {
    let mut s = TcpStream::connect(addr).expect("the broker accepts connections");
    s.set_read_timeout(Some(wait)).unwrap();
    let _ = s.write_all(frame);
    let mut len = [0u8; 4];
    s.read_exact(&mut len).ok()?;
    let mut body = vec![0u8; i32::from_be_bytes(len).clamp(0, 64 << 20) as usize];
    s.read_exact(&mut body).ok()?;
    Some(body)
}

fn frame(key: ApiKey, version: i16, body: &[u8]) -> Vec<u8> {
    let header = RequestHeader::default()
        .with_request_api_key(key as i16)
        .with_request_api_version(version)
        .with_correlation_id(7)
        .with_client_id(Some(StrBytes::from_static_str("hostile")));
    let mut b = BytesMut::new();
    header
        .encode(&mut b, key.request_header_version(version))
        .unwrap();
    b.extend_from_slice(body);
    let mut f = Vec::with_capacity(b.len() + 4);
    f.put_i32(b.len() as i32);
    f.extend_from_slice(&b);
    f
}

fn encode<R: Encodable>(req: &R, version: i16) -> Vec<u8> {
    let mut b = BytesMut::new();
    req.encode(&mut b, version).unwrap();
    b.to_vec()
}

/// The broker still answers a well-formed request, nothing panicked, and
/// nothing allocated past `bound`.
fn assert_unharmed(addr: SocketAddr, bound: usize, what: &str) {
    let ok = exchange(
        addr,
        &frame(
            ApiKey::ApiVersions,
            3,
            &encode(&ApiVersionsRequest::default(), 3),
        ),
        Duration::from_secs(10),
    );
    assert!(ok.is_some(), "{what}: the broker stopped answering");
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "{what}: a panic (see stderr)"
    );
    let largest = LARGEST.load(Ordering::SeqCst);
    assert!(
        largest <= bound,
        "{what}: an allocation of {largest} bytes (bound {bound})"
    );
}

/// The (api, version) pairs the broker advertises.
fn advertised(addr: SocketAddr) -> Vec<(ApiKey, i16)> {
    let mut resp = Bytes::from(
        exchange(
            addr,
            &frame(
                ApiKey::ApiVersions,
                3,
                &encode(&ApiVersionsRequest::default(), 3),
            ),
            Duration::from_secs(10),
        )
        .unwrap(),
    );
    ResponseHeader::decode(&mut resp, 0).unwrap();
    let r = ApiVersionsResponse::decode(&mut resp, 3).unwrap();
    let mut out = Vec::new();
    for k in r.api_keys {
        let Ok(key) = ApiKey::try_from(k.api_key) else {
            continue;
        };
        for v in k.min_version..=k.max_version {
            out.push((key, v));
        }
    }
    out
}

/// Pieces of Kafka encodings, with the lengths and counts a liar would
/// send: every length-prefixed decoder sees huge, negative and wrong ones.
fn piece() -> impl Strategy<Value = Vec<u8>> {
    let int32 = prop_oneof![
        Just(0i32),
        Just(1),
        Just(-1),
        Just(i32::MAX),
        Just(i32::MIN),
        Just(0x033c_0c00),
        Just(1 << 20),
        any::<i32>(),
    ];
    let varint = prop_oneof![
        Just(0u32),
        Just(1),
        Just(2),
        Just(u32::MAX),
        Just(0x1000_0000),
        Just(1 << 20),
        any::<u32>(),
    ];
    prop_oneof![
        int32.prop_map(|v| v.to_be_bytes().to_vec()),
        any::<i16>().prop_map(|v| v.to_be_bytes().to_vec()),
        any::<i64>().prop_map(|v| v.to_be_bytes().to_vec()),
        varint.prop_map(|mut v| {
            let mut out = Vec::new();
            while v >= 0x80 {
                out.push((v as u8) | 0x80);
                v >>= 7;
            }
            out.push(v as u8);
            out
        }),
        "[a-z._-]{0,12}".prop_map(|s| {
            let mut out = (s.len() as i16).to_be_bytes().to_vec();
            out.extend_from_slice(s.as_bytes());
            out
        }),
        proptest::collection::vec(any::<u8>(), 0..24),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    proptest::collection::vec(piece(), 0..24).prop_map(|p| p.concat())
}

#[test]
fn random_frames_for_every_advertised_api_harm_nothing() {
    let _serial = serial();
    let broker = Broker::start(&["--num-partitions", "1"]);
    let apis = advertised(broker.addr());
    assert!(apis.len() > 100, "{} api versions", apis.len());
    LARGEST.store(0, Ordering::SeqCst);
    let addr = broker.addr();
    // Every advertised (api, version) at least once, then random ones.
    let mut runner = runner(600, 1);
    let strategy = (0..apis.len(), body(), any::<u16>());
    let mut sent = 0usize;
    let mut rng = XorShift(0x5eed);
    for &(key, version) in &apis {
        let b = rng.bytes(64);
        exchange(addr, &frame(key, version, &b), Duration::from_millis(100));
        sent += 1;
    }
    let sent = std::cell::Cell::new(sent);
    runner
        .run(&strategy, |(i, b, cut)| {
            let (key, version) = apis[i];
            let mut f = frame(key, version, &b);
            // Sometimes the size prefix lies too (longer than sent: truncated).
            if cut % 5 == 0 {
                let lie = (f.len() as i32 - 4) + (cut as i32 % 1000) + 1;
                f[..4].copy_from_slice(&lie.to_be_bytes());
            }
            exchange(addr, &f, Duration::from_millis(100));
            sent.set(sent.get() + 1);
            Ok(())
        })
        .unwrap();
    // Frames here are under 1 KiB: nothing in the broker justifies more than
    // its own fixed buffers for them.
    assert_unharmed(addr, 16 * MIB, &format!("{} random frames", sent.get()));
}

#[test]
fn a_huge_array_count_in_a_tiny_frame_is_refused_without_allocating_it() {
    let _serial = serial();
    let broker = Broker::start(&[]);
    LARGEST.store(0, Ordering::SeqCst);
    // Metadata v0 whose topic array claims 54 million entries in 5 bytes.
    let answer = exchange(
        broker.addr(),
        &frame(ApiKey::Metadata, 0, &[0x03, 0x3c, 0x0c, 0x00, 0xb6]),
        Duration::from_secs(5),
    );
    assert!(
        answer.is_none(),
        "a malformed request closes the connection"
    );
    // A compact array (v9+) claiming 2^28 entries.
    exchange(
        broker.addr(),
        &frame(ApiKey::Metadata, 12, &[0x80, 0x80, 0x80, 0x80, 0x01]),
        Duration::from_secs(5),
    );
    assert_unharmed(broker.addr(), 4 * MIB, "lying array counts");
}

fn produce_frame(topic: &str, records: Bytes) -> Vec<u8> {
    let req = common::produce_request(topic, 0, records, -1);
    frame(ApiKey::Produce, 9, &encode(&req, 9))
}

fn create_topic_frame(topic: &str, compression: &str) -> Vec<u8> {
    let req = common::create_topics_request(topic, 1, &[("compression.type", compression)]);
    frame(ApiKey::CreateTopics, 7, &encode(&req, 7))
}

/// The error code of the first partition of a Produce v9 response.
fn produce_error(resp: Option<Vec<u8>>) -> Option<i16> {
    let mut b = Bytes::from(resp?);
    ResponseHeader::decode(&mut b, 1).ok()?;
    let r = ProduceResponse::decode(&mut b, 9).ok()?;
    Some(r.responses[0].partition_responses[0].error_code)
}

fn codec_batch(compression: Compression, n: usize) -> Bytes {
    let records = (0..n)
        .map(|i| {
            (
                Some(Bytes::from(format!("key-{i}"))),
                Some(Bytes::from(format!("value-{i}-{}", "x".repeat(i % 50)))),
                1_700_000_000_000 + i as i64,
            )
        })
        .collect();
    strata::format::batch::encode_batch(records, None, compression).unwrap()
}

fn fix_crc(b: &mut [u8]) {
    use strata::format::batch::{compute_crc, CRC_OFFSET};
    if b.len() >= 61 {
        let crc = compute_crc(b);
        b[CRC_OFFSET..CRC_OFFSET + 4].copy_from_slice(&crc.to_be_bytes());
    }
}

/// A batch whose record area is `area`, already compressed with `codec`.
fn batch_with_area(codec: i16, records: i32, area: &[u8]) -> Bytes {
    use strata::format::batch::{HEADER_LEN, LOG_OVERHEAD};
    let mut b = Vec::new();
    b.put_i64(0);
    b.put_i32((HEADER_LEN - LOG_OVERHEAD + area.len()) as i32);
    b.put_i32(-1);
    b.put_i8(2);
    b.put_u32(0);
    b.put_i16(codec);
    b.put_i32(records - 1);
    b.put_i64(1_700_000_000_000);
    b.put_i64(1_700_000_000_000);
    b.put_i64(-1);
    b.put_i16(-1);
    b.put_i32(-1);
    b.put_i32(records);
    b.extend_from_slice(area);
    fix_crc(&mut b);
    Bytes::from(b)
}

#[test]
fn mutated_batches_in_every_codec_get_an_error_code_and_harm_nothing() {
    let _serial = serial();
    let broker = Broker::start(&[]);
    let addr = broker.addr();
    // Topics whose compression.type differs from the producer's make the
    // broker decompress and walk every record.
    for (topic, codec) in [
        ("t-zstd", "zstd"),
        ("t-none", "uncompressed"),
        ("t-gzip", "gzip"),
    ] {
        exchange(
            addr,
            &create_topic_frame(topic, codec),
            Duration::from_secs(10),
        )
        .unwrap();
    }
    let seeds: Vec<Bytes> = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ]
    .into_iter()
    .map(|c| codec_batch(c, 20))
    .collect();
    for (i, s) in seeds.iter().enumerate() {
        for topic in ["t-zstd", "t-none", "t-gzip"] {
            let code = produce_error(exchange(
                addr,
                &produce_frame(topic, s.clone()),
                Duration::from_secs(10),
            ));
            assert_eq!(code, Some(0), "seed {i} to {topic} is accepted as is");
        }
    }
    LARGEST.store(0, Ordering::SeqCst);
    let mutation = (
        0..seeds.len(),
        0..3usize,
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6),
        prop::option::of(any::<prop::sample::Index>()),
        any::<bool>(),
    );
    let accepted = std::cell::Cell::new(0);
    let refused = std::cell::Cell::new(0);
    runner(300, 2)
        .run(&mutation, |(seed, topic, flips, cut, keep_crc)| {
            let mut b = seeds[seed].to_vec();
            for (at, x) in flips {
                let i = at.index(b.len());
                b[i] ^= x | 1;
            }
            if let Some(cut) = cut {
                b.truncate(cut.index(b.len()));
            }
            // A fixed CRC gets the mutation past the checksum into the codec
            // and the record walk.
            if !keep_crc {
                fix_crc(&mut b);
            }
            let topic = ["t-zstd", "t-none", "t-gzip"][topic];
            match produce_error(exchange(
                addr,
                &produce_frame(topic, Bytes::from(b)),
                Duration::from_secs(10),
            )) {
                Some(0) => accepted.set(accepted.get() + 1),
                Some(_) => refused.set(refused.get() + 1),
                None => {}
            }
            Ok(())
        })
        .unwrap();
    let (accepted, refused) = (accepted.get(), refused.get());
    assert!(refused > 0, "{accepted} accepted, {refused} refused");
    assert_unharmed(addr, 4 * MIB, "mutated batches");
}

#[test]
fn decompression_bombs_and_lying_snappy_lengths_are_refused() {
    let _serial = serial();
    let broker = Broker::start(&[]);
    let addr = broker.addr();
    exchange(
        addr,
        &create_topic_frame("t-bomb", "uncompressed"),
        Duration::from_secs(10),
    )
    .unwrap();
    // 512 MiB of zeros, four times the cap, in a few hundred kilobytes.
    let gib = 512 * MIB;
    let zeros = vec![0u8; 4 * MIB];
    let mut zstd = zstd::stream::Encoder::new(Vec::new(), 1).unwrap();
    let mut gzip = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    for _ in 0..gib / zeros.len() {
        zstd.write_all(&zeros).unwrap();
        gzip.write_all(&zeros).unwrap();
    }
    let zstd = zstd.finish().unwrap();
    let gzip = gzip.finish().unwrap();
    drop(zeros);
    // A raw snappy block whose header declares 4 GiB - 1.
    let snappy_lie = [0xff, 0xff, 0xff, 0xff, 0x0f, 0x00];
    // Xerial framing with one such block.
    let mut xerial = b"\x82SNAPPY\x00\x00\x00\x00\x01\x00\x00\x00\x01".to_vec();
    xerial.extend_from_slice(&(snappy_lie.len() as u32).to_be_bytes());
    xerial.extend_from_slice(&snappy_lie);
    LARGEST.store(0, Ordering::SeqCst);
    for (name, codec, area) in [
        ("zstd bomb", 4, &zstd[..]),
        ("gzip bomb", 1, &gzip[..]),
        ("raw snappy lying length", 2, &snappy_lie[..]),
        ("xerial snappy lying length", 2, &xerial[..]),
    ] {
        let code = produce_error(exchange(
            addr,
            &produce_frame("t-bomb", batch_with_area(codec, 1, area)),
            Duration::from_secs(30),
        ));
        assert!(
            matches!(code, Some(c) if c != 0),
            "{name}: refused with an error code, got {code:?}"
        );
    }
    // The cap on decompressed bytes, not the 512 MiB the bombs expand to.
    assert_unharmed(
        addr,
        strata::format::records::MAX_DECOMPRESSED_BYTES + MIB,
        "bombs",
    );
}

/// Flips, cuts and extends `seed` as the strategy's values say.
fn mutate(
    seed: &[u8],
    flips: Vec<(prop::sample::Index, u8)>,
    cut: Option<prop::sample::Index>,
    tail: &[u8],
) -> Vec<u8> {
    let mut b = seed.to_vec();
    if !b.is_empty() {
        for (at, x) in flips {
            let i = at.index(b.len());
            b[i] ^= x | 1;
        }
        if let Some(cut) = cut {
            b.truncate(cut.index(b.len()));
        }
    }
    b.extend_from_slice(tail);
    b
}

fn mutation() -> impl Strategy<
    Value = (
        Vec<(prop::sample::Index, u8)>,
        Option<prop::sample::Index>,
        Vec<u8>,
    ),
> {
    (
        proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..6),
        prop::option::of(any::<prop::sample::Index>()),
        proptest::collection::vec(any::<u8>(), 0..8),
    )
}

/// The stored formats, as a corrupt disk or a hostile object store would
/// hand them back: WAL objects, key indexes, manifests, producer snapshots,
/// record batches (through kafka-protocol's decoder and the compaction's
/// record walk, every codec). Each decoder returns an error or a value.
#[test]
fn mutated_stored_formats_decode_to_errors_without_panics_or_large_allocations() {
    use strata::format::key_index::{KeyEntry, KeyIndexReader, KeyIndexWriter, ProducerLast};
    use strata::format::wal::{self, WalBuilder, WalHeader};
    let _serial = serial();
    count_panics();

    let batch = codec_batch(Compression::None, 5);
    let mut w = WalBuilder::default();
    w.push(
        uuid::Uuid::from_u128(1),
        0,
        3,
        0,
        4,
        &batch[..61],
        &batch[61..],
    );
    w.push(
        uuid::Uuid::from_u128(2),
        1,
        3,
        10,
        14,
        &batch[..61],
        &batch[61..],
    );
    let wal_object = w
        .finish(WalHeader {
            node_id: 1,
            nonce: 2,
            seq: 3,
            since: Some(1),
        })
        .to_vec();
    let mut index = KeyIndexWriter::new(
        Vec::new(),
        100,
        &[ProducerLast {
            producer_id: 7,
            batch_base_offset: 100,
        }],
    )
    .unwrap();
    for i in 0..20u128 {
        index
            .push(&KeyEntry {
                hash: i * 1_000_003,
                offset: 100 + i as i64,
                timestamp: 5,
                max_version_timestamp: 5,
                tombstone: i % 3 == 0,
            })
            .unwrap();
    }
    let index = index.finish().unwrap();
    let manifest = serde_json::to_vec(&strata::manifest::Manifest::empty(
        strata::manifest::WriterEpoch::new(
            1,
            &strata::clock::SystemClock,
            &strata::clock::OsRandom,
        ),
    ))
    .unwrap();
    let snapshot = strata::log::producer_state::ProducerStates::default()
        .snapshot(42, &Default::default())
        .unwrap();
    let batches: Vec<Bytes> = [
        Compression::None,
        Compression::Gzip,
        Compression::Snappy,
        Compression::Lz4,
        Compression::Zstd,
    ]
    .into_iter()
    .map(|c| codec_batch(c, 30))
    .collect();

    LARGEST.store(0, Ordering::SeqCst);
    let mut runner = runner(2000, 4);
    runner
        .run(&(0..9usize, mutation()), |(which, (flips, cut, tail))| {
            match which {
                0 => {
                    let b = mutate(&wal_object, flips, cut, &tail);
                    if let Ok(o) = wal::decode(Bytes::from(b)) {
                        for e in o.entries.clone().unwrap_or_default() {
                            let _ = o.batches_of(&e);
                        }
                    }
                }
                1 => {
                    let b = mutate(&index, flips, cut, &tail);
                    if let Ok(mut r) = KeyIndexReader::new(&b[..]) {
                        let _ = r.read_all();
                    }
                }
                2 => {
                    let b = mutate(&manifest, flips, cut, &tail);
                    let _ = serde_json::from_slice::<strata::manifest::Manifest>(&b);
                }
                3 => {
                    let b = mutate(&snapshot, flips, cut, &tail);
                    let _ = strata::log::producer_state::ProducerStates::from_snapshot(&b);
                }
                n => {
                    let mut b = mutate(&batches[n - 4], flips, cut, &tail);
                    fix_crc(&mut b);
                    let _ = strata::format::records::decode_batch(&mut Bytes::from(b.clone()));
                    if let Ok(Some(h)) = strata::format::batch::BatchHeader::parse(&b) {
                        if b.len() >= 61 {
                            let codec = h.attributes & strata::format::batch::CODEC_MASK;
                            if let Ok(area) = strata::format::records::decompress(codec, &b[61..]) {
                                let _ =
                                    strata::format::records::walk(&area, h.record_count, |_| {});
                            }
                        }
                    }
                }
            }
            Ok(())
        })
        .unwrap();
    assert_eq!(PANICS.load(Ordering::SeqCst), 0, "a decoder panicked");
    let largest = LARGEST.load(Ordering::SeqCst);
    assert!(largest <= 4 * MIB, "a decoder allocated {largest} bytes");
}

/// A client sending garbage on many connections at once does not disturb a
/// well-behaved librdkafka producer and consumer on the same broker.
#[test]
fn a_hostile_client_does_not_harm_a_good_one() {
    use rdkafka::config::ClientConfig;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    use rdkafka::Message;
    let _serial = serial();
    let broker = Broker::start(&[]);
    let addr = broker.addr();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let apis = advertised(addr);
    let hostile = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut rng = XorShift(9);
            let mut sent = 0u32;
            while !stop.load(Ordering::Relaxed) {
                let (key, version) = apis[rng.below(apis.len())];
                let body = rng.bytes(200);
                let mut f = frame(key, version, &body);
                if rng.below(5) == 0 {
                    f[..4].copy_from_slice(&(rng.next() as i32).to_be_bytes());
                }
                exchange(addr, &f, Duration::from_millis(20));
                sent += 1;
            }
            sent
        })
    };
    let producer: ThreadedProducer<DefaultProducerContext> = ClientConfig::new()
        .set("bootstrap.servers", addr.to_string())
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .unwrap();
    let n = 2000;
    for i in 0..n {
        let payload = format!("good-{i}");
        let key = i.to_string();
        loop {
            match producer.send(BaseRecord::to("good").key(&key).payload(&payload)) {
                Ok(()) => break,
                Err((_, _)) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
    }
    producer.flush(Duration::from_secs(60)).unwrap();
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", addr.to_string())
        .set("group.id", "good-readers")
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    consumer.subscribe(&["good"]).unwrap();
    let mut seen = std::collections::BTreeSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while seen.len() < n && std::time::Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            let v = String::from_utf8(m.payload().unwrap().to_vec()).unwrap();
            seen.insert(v);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let garbage = hostile.join().unwrap();
    assert_eq!(
        seen.len(),
        n,
        "every record read back while {garbage} garbage frames arrived"
    );
    assert!(garbage > 100, "the hostile client sent {garbage} frames");
    assert_eq!(PANICS.load(Ordering::SeqCst), 0);
}
