//! Broker settings, from flags or `STRATA_*` environment variables.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// When appended data is fsynced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FsyncPolicy {
    /// Before acknowledging an acks=all (-1) produce request; group-committed.
    Always,
    /// Every `--fsync-interval-ms`, in the background.
    Interval,
    /// Never explicitly (only when segments seal and at shutdown).
    None,
}

#[derive(Debug, Clone, Args)]
pub struct BrokerConfig {
    /// Address to listen on.
    #[arg(long, env = "STRATA_LISTEN", default_value = "0.0.0.0:9092")]
    pub listen: SocketAddr,

    /// host:port that clients are told to connect to (default: the listen
    /// address, with 0.0.0.0 replaced by localhost).
    #[arg(long, env = "STRATA_ADVERTISED_LISTENER")]
    pub advertised_listener: Option<String>,

    /// Serve Prometheus metrics (`/metrics`) and health checks (`/healthz`,
    /// `/readyz`) over HTTP on this address; off when not given.
    #[arg(long, env = "STRATA_METRICS_LISTEN")]
    pub metrics_listen: Option<SocketAddr>,

    /// Directory holding the log and metadata.
    #[arg(long, env = "STRATA_DATA_DIR", default_value = "./strata-data")]
    pub data_dir: PathBuf,

    /// This broker's node id.
    #[arg(long, env = "STRATA_NODE_ID", default_value_t = 1)]
    pub node_id: i32,

    /// Partitions of a topic created without a count (num.partitions).
    #[arg(long, env = "STRATA_NUM_PARTITIONS", default_value_t = 1)]
    pub num_partitions: i32,

    /// Create unknown topics when a client asks for their metadata (auto.create.topics.enable).
    #[arg(long, env = "STRATA_AUTO_CREATE_TOPICS", default_value_t = true, action = clap::ArgAction::Set)]
    pub auto_create_topics: bool,

    /// When to fsync appended data.
    #[arg(long, env = "STRATA_FSYNC", value_enum, default_value_t = FsyncPolicy::Always)]
    pub fsync: FsyncPolicy,

    /// Interval for `--fsync interval`.
    #[arg(long, env = "STRATA_FSYNC_INTERVAL_MS", default_value_t = 1000)]
    pub fsync_interval_ms: u64,

    /// Run as one broker of a cluster coordinated through etcd:
    /// `etcd://host:2379[,host:2379...]/prefix`. Every broker of a cluster
    /// needs its own --node-id and data directory and the same --store; an
    /// acknowledged acks=all write is then in the store, not only on this
    /// machine. Without it the broker runs alone, as before.
    #[arg(long, env = "STRATA_CLUSTER")]
    pub cluster: Option<String>,

    /// Cluster mode: the lease time-to-live; a broker silent this long loses
    /// its partitions to the others.
    #[arg(long, env = "STRATA_CLUSTER_LEASE_TTL_MS", default_value_t = 6000)]
    pub cluster_lease_ttl_ms: u64,

    /// Cluster mode: how often the new batches of every partition this
    /// broker leads are written to the store as one write-ahead log object.
    #[arg(long, env = "STRATA_WAL_FLUSH_MS", default_value_t = 50)]
    pub wal_flush_ms: u64,

    /// Cluster mode: a write-ahead log object is written sooner once this
    /// many bytes are pending.
    #[arg(long, env = "STRATA_WAL_MAX_BYTES", default_value_t = 4 << 20)]
    pub wal_max_bytes: usize,

    /// Cluster mode: the longest a batch stays only in the write-ahead log.
    /// An active segment this old is sealed and uploaded even when its
    /// topic's segment.ms is longer, so that the log objects behind it can
    /// be deleted and a new leader has little to read back.
    #[arg(long, env = "STRATA_WAL_MAX_AGE_MS", default_value_t = 120_000)]
    pub wal_max_age_ms: u64,

    /// Largest request frame accepted (socket.request.max.bytes).
    #[arg(long, env = "STRATA_MAX_REQUEST_BYTES", default_value_t = 104_857_600)]
    pub max_request_bytes: usize,

    /// Delay of the first rebalance of an empty group (group.initial.rebalance.delay.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_INITIAL_REBALANCE_DELAY_MS",
        default_value_t = 3000
    )]
    pub group_initial_rebalance_delay_ms: u64,

    /// Smallest session.timeout.ms a consumer may ask for (group.min.session.timeout.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_MIN_SESSION_TIMEOUT_MS",
        default_value_t = 6000
    )]
    pub group_min_session_timeout_ms: u64,

    /// Largest session.timeout.ms a consumer may ask for (group.max.session.timeout.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_MAX_SESSION_TIMEOUT_MS",
        default_value_t = 1_800_000
    )]
    pub group_max_session_timeout_ms: u64,

    /// How often consumer-protocol members heartbeat (group.consumer.heartbeat.interval.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_CONSUMER_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5000
    )]
    pub group_consumer_heartbeat_interval_ms: u64,

    /// Consumer-protocol members not heard from for this long are removed
    /// (group.consumer.session.timeout.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_CONSUMER_SESSION_TIMEOUT_MS",
        default_value_t = 45000
    )]
    pub group_consumer_session_timeout_ms: u64,

    /// Server-side assignors offered to consumer-protocol groups, the first
    /// being the default (group.consumer.assignors): uniform, range.
    #[arg(
        long,
        env = "STRATA_GROUP_CONSUMER_ASSIGNORS",
        default_value = "uniform,range",
        value_parser = parse_assignors
    )]
    pub group_consumer_assignors: Assignors,

    /// Most members a consumer-protocol group may have (group.consumer.max.size).
    #[arg(
        long,
        env = "STRATA_GROUP_CONSUMER_MAX_SIZE",
        default_value_t = i32::MAX as u64
    )]
    pub group_consumer_max_size: u64,

    /// How long committed offsets of an empty group are kept (offsets.retention.minutes).
    #[arg(
        long,
        env = "STRATA_OFFSETS_RETENTION_MINUTES",
        default_value_t = 10080
    )]
    pub offsets_retention_minutes: u64,

    /// How often expired offsets are removed (offsets.retention.check.interval.ms).
    #[arg(
        long,
        env = "STRATA_OFFSETS_RETENTION_CHECK_INTERVAL_MS",
        default_value_t = 600_000
    )]
    pub offsets_retention_check_interval_ms: u64,

    /// segment.bytes given to `__consumer_offsets` when it is created (offsets.topic.segment.bytes).
    #[arg(
        long,
        env = "STRATA_OFFSETS_TOPIC_SEGMENT_BYTES",
        default_value_t = 104_857_600,
        value_parser = clap::value_parser!(i32).range(14..)
    )]
    pub offsets_topic_segment_bytes: i32,

    /// Most connections the broker holds open (max.connections); at the
    /// limit it stops accepting until one closes.
    #[arg(long, env = "STRATA_MAX_CONNECTIONS", default_value_t = i32::MAX as usize)]
    pub max_connections: usize,

    /// Most connections from one address (max.connections.per.ip); one more
    /// is closed as soon as it is accepted.
    #[arg(long, env = "STRATA_MAX_CONNECTIONS_PER_IP", default_value_t = i32::MAX as usize)]
    pub max_connections_per_ip: usize,

    /// Per-address exceptions to --max-connections-per-ip, as
    /// `address:count,...` (max.connections.per.ip.overrides).
    #[arg(
        long,
        env = "STRATA_MAX_CONNECTIONS_PER_IP_OVERRIDES",
        default_value = "",
        value_parser = parse_ip_overrides
    )]
    pub max_connections_per_ip_overrides: IpOverrides,

    /// A connection that sends no request for this long is closed
    /// (connections.max.idle.ms); 0 or less keeps idle connections.
    #[arg(
        long,
        env = "STRATA_CONNECTIONS_MAX_IDLE_MS",
        default_value_t = 600_000,
        allow_negative_numbers = true
    )]
    pub connections_max_idle_ms: i64,

    /// Log filter (error, warn, info, debug, trace or a tracing directive).
    #[arg(long, env = "STRATA_LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// Benchmark baseline: acknowledge produce requests without storing them.
    #[arg(long, hide = true)]
    pub null_sink: bool,

    // ---- Tiered storage (src/tier) and compaction (src/compaction).
    #[command(flatten)]
    pub object_store: StoreArgs,

    /// Bytes of object-store blocks kept in memory for reads of tiered segments.
    #[arg(long, env = "STRATA_CACHE_BYTES", default_value_t = 268_435_456)]
    pub cache_bytes: u64,

    /// Sealed bytes allowed to wait for upload before produce is refused
    /// with a retriable error (backpressure instead of filling the disk).
    #[arg(
        long,
        env = "STRATA_MAX_PENDING_UPLOAD_BYTES",
        default_value_t = 8_589_934_592
    )]
    pub max_pending_upload_bytes: u64,

    /// How often the tier scans partitions for segments to roll, upload and expire.
    #[arg(long, env = "STRATA_TIER_INTERVAL_MS", default_value_t = 500)]
    pub tier_interval_ms: u64,

    /// Swapped-out compaction sources stay readable this long, so fetches
    /// that read the previous manifest can finish.
    #[arg(
        long,
        env = "STRATA_COMPACTION_DELETE_DELAY_MS",
        default_value_t = 60_000
    )]
    pub compaction_delete_delay_ms: u64,

    /// Segment objects no manifest names are deleted once this old (sources
    /// of an interrupted compaction, outputs that lost a race). A merge that
    /// cannot write its manifest within half of this gives up.
    #[arg(long, env = "STRATA_ORPHAN_MIN_AGE_MS", default_value_t = 3_600_000)]
    pub orphan_min_age_ms: u64,

    /// How often the store is scanned for orphaned objects.
    #[arg(
        long,
        env = "STRATA_ORPHAN_SCAN_INTERVAL_MS",
        default_value_t = 600_000
    )]
    pub orphan_scan_interval_ms: u64,

    /// Run a compaction worker inside the broker; it joins the same consumer
    /// group as `strata compact` workers.
    #[arg(long, env = "STRATA_COMPACTION_WORKER", default_value_t = true, action = clap::ArgAction::Set)]
    pub compaction_worker: bool,
}

/// Where sealed segments live; shared by `strata serve`, `strata compact`
/// and `strata levels`.
#[derive(Debug, Clone, Default, Args)]
pub struct StoreArgs {
    /// Object store for sealed segments: file:///path, s3://bucket/prefix or
    /// memory:// (default: file://<data-dir>/objects).
    #[arg(long, env = "STRATA_STORE")]
    pub store: Option<String>,

    /// S3 endpoint (MinIO, SeaweedFS, Ceph, R2, ...); default: AWS_ENDPOINT_URL or AWS.
    #[arg(long, env = "STRATA_S3_ENDPOINT")]
    pub s3_endpoint: Option<String>,

    /// S3 region; default: AWS_REGION / AWS_DEFAULT_REGION, else us-east-1.
    #[arg(long, env = "STRATA_S3_REGION")]
    pub s3_region: Option<String>,

    /// Allow plain http:// endpoints (default: AWS_ALLOW_HTTP, else false).
    #[arg(long, env = "STRATA_S3_ALLOW_HTTP", action = clap::ArgAction::Set)]
    pub s3_allow_http: Option<bool>,

    /// Virtual-hosted-style requests (bucket in the host name); off means
    /// path-style, which self-hosted S3 servers need.
    #[arg(long, env = "STRATA_S3_VIRTUAL_HOSTED", default_value_t = false, action = clap::ArgAction::Set)]
    pub s3_virtual_hosted: bool,
}

impl BrokerConfig {
    /// The advertised (host, port).
    pub fn advertised(&self) -> (String, i32) {
        if let Some(adv) = &self.advertised_listener {
            if let Some((host, port)) = adv.rsplit_once(':') {
                if let Ok(port) = port.parse() {
                    return (host.trim_matches(['[', ']']).to_string(), port);
                }
            }
            return (adv.clone(), self.listen.port() as i32);
        }
        let host = if self.listen.ip().is_unspecified() {
            "localhost".to_string()
        } else {
            self.listen.ip().to_string()
        };
        (host, self.listen.port() as i32)
    }

    pub fn coordinator(&self) -> crate::coordinator::CoordinatorConfig {
        crate::coordinator::CoordinatorConfig {
            initial_rebalance_delay: Duration::from_millis(self.group_initial_rebalance_delay_ms),
            min_session_timeout: Duration::from_millis(self.group_min_session_timeout_ms),
            max_session_timeout: Duration::from_millis(self.group_max_session_timeout_ms),
            offsets_retention: Duration::from_secs(self.offsets_retention_minutes * 60),
            // Kafka's offset.metadata.max.bytes.
            max_metadata_bytes: 4096,
            offsets_topic_segment_bytes: self.offsets_topic_segment_bytes,
            wait_for_fsync: self.fsync == FsyncPolicy::Always || self.cluster.is_some(),
            consumer: crate::coordinator::consumer::ConsumerGroupConfig {
                heartbeat_interval: Duration::from_millis(
                    self.group_consumer_heartbeat_interval_ms,
                ),
                session_timeout: Duration::from_millis(self.group_consumer_session_timeout_ms),
                assignors: self.group_consumer_assignors.0.clone(),
                max_size: self.group_consumer_max_size as usize,
            },
        }
    }

    pub fn fsync_interval(&self) -> Duration {
        Duration::from_millis(self.fsync_interval_ms.max(1))
    }
}

/// The server assignors named by `--group-consumer-assignors`.
#[derive(Debug, Clone)]
pub struct Assignors(pub Vec<String>);

/// Accepts the short names and Kafka's class names of its two assignors.
fn parse_assignors(value: &str) -> Result<Assignors, String> {
    let mut out = Vec::new();
    for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let short = match name {
            "uniform" | "org.apache.kafka.coordinator.group.assignor.UniformAssignor" => "uniform",
            "range" | "org.apache.kafka.coordinator.group.assignor.RangeAssignor" => "range",
            other => return Err(format!("unknown assignor {other} (known: uniform, range)")),
        };
        if !out.iter().any(|n| n == short) {
            out.push(short.to_string());
        }
    }
    if out.is_empty() {
        return Err("at least one assignor is needed".to_string());
    }
    Ok(Assignors(out))
}

/// `--max-connections-per-ip-overrides`: `address:count` pairs separated by
/// commas, as Kafka's `max.connections.per.ip.overrides` (addresses only,
/// no host names to resolve).
#[derive(Debug, Clone, Default)]
pub struct IpOverrides(pub std::collections::HashMap<std::net::IpAddr, usize>);

pub fn parse_ip_overrides(value: &str) -> Result<IpOverrides, String> {
    let mut out = std::collections::HashMap::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (ip, n) = pair
            .rsplit_once(':')
            .ok_or_else(|| format!("{pair}: expected address:count"))?;
        let ip: std::net::IpAddr = ip
            .trim_matches(['[', ']'])
            .parse()
            .map_err(|e| format!("{pair}: {e}"))?;
        let n: usize = n.parse().map_err(|e| format!("{pair}: {e}"))?;
        out.insert(ip, n);
    }
    Ok(IpOverrides(out))
}
