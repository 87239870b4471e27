//! Broker settings, from flags or `STRATA_*` environment variables.
//!
//! This is the only place that knows the command line. Every layer below
//! the server takes its own small settings type (`ApiSettings`,
//! `TierSettings`, `StoreSettings`, `CoordinatorConfig`, ...), built here,
//! so a new flag reaches exactly the layer it is handed to. The Kafka names
//! broker DescribeConfigs reports come from `static_configs`, next to the
//! flags; a test checks that every Kafka name a flag's help gives is there.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::api::StaticConfig;
use crate::catalog::config::ConfigType;

pub use crate::auth::client::SaslLogin;
use crate::auth::tls::ClientAuth;
use crate::manifest::fault::Latency;

/// `--ssl-client-auth`: Kafka's ssl.client.auth values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SslClientAuth {
    Required,
    Requested,
    None,
}

impl From<SslClientAuth> for ClientAuth {
    fn from(a: SslClientAuth) -> ClientAuth {
        match a {
            SslClientAuth::Required => ClientAuth::Required,
            SslClientAuth::Requested => ClientAuth::Requested,
            SslClientAuth::None => ClientAuth::None,
        }
    }
}

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
    /// Address to listen on: one PLAINTEXT listener (ignored when --listener is given).
    #[arg(long, env = "STRATA_LISTEN", default_value = "0.0.0.0:9092")]
    pub listen: SocketAddr,

    /// What clients are told to connect to, per listener: `NAME://host:port`
    /// (Kafka's advertised.listeners), repeated or comma-separated. A bare
    /// `host:port` stands for the first listener. Default: each listener's
    /// address, with 0.0.0.0 replaced by localhost.
    #[arg(long, env = "STRATA_ADVERTISED_LISTENER", value_delimiter = ',')]
    pub advertised_listener: Vec<String>,

    /// A listener, `NAME://host:port` (Kafka's listeners), repeated or
    /// comma-separated: `--listener PLAINTEXT://0.0.0.0:9092 --listener
    /// SASL_SSL://0.0.0.0:9093`. The names PLAINTEXT, SSL, SASL_PLAINTEXT and
    /// SASL_SSL are their own security protocols; other names need
    /// --listener-security-protocol-map.
    #[arg(long, env = "STRATA_LISTENERS", value_delimiter = ',')]
    pub listener: Vec<String>,

    /// `NAME:PROTOCOL,...` (Kafka's listener.security.protocol.map) for
    /// listener names that are not protocol names themselves.
    #[arg(long, env = "STRATA_LISTENER_SECURITY_PROTOCOL_MAP")]
    pub listener_security_protocol_map: Option<String>,

    /// PEM certificate chain of SSL and SASL_SSL listeners (ssl.keystore.certificate.chain).
    #[arg(long, env = "STRATA_SSL_CERT_FILE")]
    pub ssl_cert_file: Option<PathBuf>,

    /// PEM private key of that certificate (ssl.keystore.key).
    #[arg(long, env = "STRATA_SSL_KEY_FILE")]
    pub ssl_key_file: Option<PathBuf>,

    /// PEM CA certificates that client certificates must chain to (ssl.truststore.certificates).
    #[arg(long, env = "STRATA_SSL_CA_FILE")]
    pub ssl_ca_file: Option<PathBuf>,

    /// Client certificates on SSL listeners (ssl.client.auth); a trusted
    /// certificate's subject becomes the principal.
    #[arg(long, env = "STRATA_SSL_CLIENT_AUTH", value_enum, default_value_t = SslClientAuth::None)]
    pub ssl_client_auth: SslClientAuth,

    /// SASL mechanisms offered (sasl.enabled.mechanisms).
    #[arg(
        long,
        env = "STRATA_SASL_ENABLED_MECHANISMS",
        value_delimiter = ',',
        default_value = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"
    )]
    pub sasl_enabled_mechanisms: Vec<String>,

    /// Creates a SCRAM credential at start unless the user already has one
    /// for that mechanism, as `kafka-storage.sh format --add-scram`:
    /// `SCRAM-SHA-512=[name=alice,password=secret]`. Repeatable.
    #[arg(long, env = "STRATA_ADD_SCRAM", value_delimiter = ';')]
    pub add_scram: Vec<String>,

    /// The listener this broker's own clients use (inter.broker.listener.name):
    /// its compaction worker, and in cluster mode a transaction coordinator
    /// writing markers at other leaders. Default: the first listener.
    #[arg(long, env = "STRATA_INTER_BROKER_LISTENER_NAME")]
    pub inter_broker_listener_name: Option<String>,

    /// SASL mechanism of the broker's own clients on a SASL inter-broker
    /// listener (sasl.mechanism.inter.broker.protocol). Default: the first
    /// of --sasl-enabled-mechanisms (PLAIN unless changed).
    #[arg(long, env = "STRATA_SASL_MECHANISM_INTER_BROKER_PROTOCOL")]
    pub sasl_mechanism_inter_broker_protocol: Option<String>,

    /// The user the broker authenticates as on a SASL inter-broker listener
    /// (the username of the listener's JAAS config in Kafka). Its SCRAM
    /// credential is created at start when missing; give it --super-users.
    #[arg(long, env = "STRATA_INTER_BROKER_SASL_USERNAME")]
    pub inter_broker_sasl_username: Option<String>,

    /// That user's password; prefer the environment variable, which `ps`
    /// does not show.
    #[arg(
        long,
        env = "STRATA_INTER_BROKER_SASL_PASSWORD",
        hide_env_values = true
    )]
    pub inter_broker_sasl_password: Option<String>,

    /// Longest SASL session before the client must re-authenticate (KIP-368,
    /// connections.max.reauth.ms); 0: no limit.
    #[arg(long, env = "STRATA_CONNECTIONS_MAX_REAUTH_MS", default_value_t = 0)]
    pub connections_max_reauth_ms: u64,

    /// The secret delegation tokens are signed with
    /// (delegation.token.secret.key): every broker of a cluster needs the
    /// same. Without it delegation tokens are disabled. Prefer the
    /// environment variable, which `ps` does not show.
    #[arg(
        long,
        env = "STRATA_DELEGATION_TOKEN_SECRET_KEY",
        hide_env_values = true
    )]
    pub delegation_token_secret_key: Option<String>,

    /// The longest a delegation token lives, renewals included
    /// (delegation.token.max.lifetime.ms; 7 days).
    #[arg(
        long,
        env = "STRATA_DELEGATION_TOKEN_MAX_LIFETIME_MS",
        default_value_t = 7 * 24 * 3_600_000,
        value_parser = clap::value_parser!(i64).range(1..)
    )]
    pub delegation_token_max_lifetime_ms: i64,

    /// How long a delegation token lives until renewed
    /// (delegation.token.expiry.time.ms; 24 hours).
    #[arg(
        long,
        env = "STRATA_DELEGATION_TOKEN_EXPIRY_TIME_MS",
        default_value_t = 24 * 3_600_000,
        value_parser = clap::value_parser!(i64).range(1..)
    )]
    pub delegation_token_expiry_time_ms: i64,

    /// How often expired delegation tokens are removed
    /// (delegation.token.expiry.check.interval.ms; 1 hour).
    #[arg(
        long,
        env = "STRATA_DELEGATION_TOKEN_EXPIRY_CHECK_INTERVAL_MS",
        default_value_t = 3_600_000,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub delegation_token_expiry_check_interval_ms: u64,

    /// Delay before answering a failed authentication and closing
    /// (connection.failed.authentication.delay.ms).
    #[arg(
        long,
        env = "STRATA_CONNECTION_FAILED_AUTHENTICATION_DELAY_MS",
        default_value_t = 100
    )]
    pub connection_failed_authentication_delay_ms: u64,

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

    /// Cluster mode: how long a broker must have been a member before the
    /// controller hands it partitions to even out leadership or fails
    /// partitions over to it; a broker that keeps restarting meanwhile takes
    /// nothing down with it.
    #[arg(long, env = "STRATA_CLUSTER_SETTLE_MS", default_value_t = 10000)]
    pub cluster_settle_ms: u64,

    /// Cluster mode: how often the new batches of every partition this
    /// broker leads are written to the store as one write-ahead log object.
    #[arg(long, env = "STRATA_WAL_FLUSH_MS", default_value_t = 50)]
    pub wal_flush_ms: u64,

    /// Cluster mode: a write-ahead log object is written sooner once this
    /// many bytes are pending.
    #[arg(long, env = "STRATA_WAL_MAX_BYTES", default_value_t = 8 << 20)]
    pub wal_max_bytes: usize,

    /// Cluster mode: a write-ahead log object's PUT not answered within this
    /// many ms is sent again and the first answer wins (0: never). Cuts the
    /// tail of the store's latency for a few more PUTs.
    #[arg(long, env = "STRATA_WAL_HEDGE_MS", default_value_t = 100)]
    pub wal_hedge_ms: u64,

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

    /// Which way a group with members may switch between the classic and the
    /// consumer protocol (group.consumer.migration.policy): bidirectional,
    /// upgrade, downgrade or disabled.
    #[arg(
        long,
        env = "STRATA_GROUP_CONSUMER_MIGRATION_POLICY",
        default_value = "bidirectional",
        value_parser = crate::coordinator::migration::MigrationPolicy::parse
    )]
    pub group_consumer_migration_policy: crate::coordinator::migration::MigrationPolicy,

    /// How often Streams group members heartbeat (group.streams.heartbeat.interval.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_STREAMS_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5000
    )]
    pub group_streams_heartbeat_interval_ms: u64,

    /// Streams group members not heard from for this long are removed
    /// (group.streams.session.timeout.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_STREAMS_SESSION_TIMEOUT_MS",
        default_value_t = 45000
    )]
    pub group_streams_session_timeout_ms: u64,

    /// Standby replicas of each stateful task (group.streams.num.standby.replicas).
    #[arg(
        long,
        env = "STRATA_GROUP_STREAMS_NUM_STANDBY_REPLICAS",
        default_value_t = 0,
        value_parser = clap::value_parser!(u32).range(0..=2)
    )]
    pub group_streams_num_standby_replicas: u32,

    /// How long a new Streams group waits for more members before its first
    /// assignment (group.streams.initial.rebalance.delay.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_STREAMS_INITIAL_REBALANCE_DELAY_MS",
        default_value_t = 3000
    )]
    pub group_streams_initial_rebalance_delay_ms: u64,

    /// The least time between two task assignments of a Streams group
    /// (group.streams.assignment.interval.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_STREAMS_ASSIGNMENT_INTERVAL_MS",
        default_value_t = 1000
    )]
    pub group_streams_assignment_interval_ms: u64,

    /// Most members a Streams group may have (group.streams.max.size).
    #[arg(
        long,
        env = "STRATA_GROUP_STREAMS_MAX_SIZE",
        default_value_t = i32::MAX as u64
    )]
    pub group_streams_max_size: u64,

    /// How often share group members heartbeat (group.share.heartbeat.interval.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_HEARTBEAT_INTERVAL_MS",
        default_value_t = 5000
    )]
    pub group_share_heartbeat_interval_ms: u64,

    /// Share group members not heard from for this long are removed
    /// (group.share.session.timeout.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_SESSION_TIMEOUT_MS",
        default_value_t = 45000
    )]
    pub group_share_session_timeout_ms: u64,

    /// Most members a share group may have (group.share.max.size).
    #[arg(long, env = "STRATA_GROUP_SHARE_MAX_SIZE", default_value_t = 200)]
    pub group_share_max_size: u64,

    /// How long a share consumer holds the records it acquired before they
    /// are delivered to another (group.share.record.lock.duration.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_RECORD_LOCK_DURATION_MS",
        default_value_t = 30000,
        value_parser = clap::value_parser!(u64).range(1000..=3_600_000)
    )]
    pub group_share_record_lock_duration_ms: u64,

    /// The shortest share.record.lock.duration.ms a group may set
    /// (group.share.min.record.lock.duration.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_MIN_RECORD_LOCK_DURATION_MS",
        default_value_t = 15000,
        value_parser = clap::value_parser!(u64).range(1000..=3_600_000)
    )]
    pub group_share_min_record_lock_duration_ms: u64,

    /// The longest share.record.lock.duration.ms a group may set
    /// (group.share.max.record.lock.duration.ms).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_MAX_RECORD_LOCK_DURATION_MS",
        default_value_t = 60000,
        value_parser = clap::value_parser!(u64).range(1000..=3_600_000)
    )]
    pub group_share_max_record_lock_duration_ms: u64,

    /// Deliveries of a record before it is archived, never delivered again
    /// (group.share.delivery.count.limit).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_DELIVERY_COUNT_LIMIT",
        default_value_t = 5,
        value_parser = clap::value_parser!(u64).range(2..=10)
    )]
    pub group_share_delivery_count_limit: u64,

    /// Most records of one share-partition in flight at once
    /// (group.share.partition.max.record.locks).
    #[arg(
        long,
        env = "STRATA_GROUP_SHARE_PARTITION_MAX_RECORD_LOCKS",
        default_value_t = 2000
    )]
    pub group_share_partition_max_record_locks: u64,

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

    /// The longest transaction.timeout.ms a transactional producer may ask
    /// for (transaction.max.timeout.ms).
    #[arg(
        long,
        env = "STRATA_TRANSACTION_MAX_TIMEOUT_MS",
        default_value_t = 900_000,
        value_parser = clap::value_parser!(i32).range(1..)
    )]
    pub transaction_max_timeout_ms: i32,

    /// A transactional id with no transaction for this long is forgotten
    /// (transactional.id.expiration.ms).
    #[arg(
        long,
        env = "STRATA_TRANSACTIONAL_ID_EXPIRATION_MS",
        default_value_t = 604_800_000,
        value_parser = clap::value_parser!(i64).range(1..)
    )]
    pub transactional_id_expiration_ms: i64,

    /// How often transactions past their timeout are looked for and aborted
    /// (transaction.abort.timed.out.transaction.cleanup.interval.ms).
    #[arg(
        long,
        env = "STRATA_TRANSACTION_ABORT_TIMED_OUT_TRANSACTION_CLEANUP_INTERVAL_MS",
        default_value_t = 10_000
    )]
    pub transaction_abort_timed_out_transaction_cleanup_interval_ms: u64,

    /// Tests: wait this long after answering EndTxn before writing its
    /// markers (so that a broker can be killed in between).
    #[arg(long, hide = true, default_value_t = 0)]
    pub txn_marker_delay_ms: u64,

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

    /// Authorize every request with ACLs (Kafka's `authorizer.class.name`):
    /// `acl`. Without it every request is allowed.
    #[arg(long, env = "STRATA_AUTHORIZER", value_enum)]
    pub authorizer: Option<AuthorizerKind>,

    /// Principals allowed everything, `;`-separated (`super.users`), e.g.
    /// `User:admin;User:ops`.
    #[arg(long, env = "STRATA_SUPER_USERS", default_value = "")]
    pub super_users: String,

    /// Allow a request on a resource that no ACL names
    /// (`allow.everyone.if.no.acl.found`).
    #[arg(long, env = "STRATA_ALLOW_EVERYONE_IF_NO_ACL_FOUND", default_value_t = false, action = clap::ArgAction::Set)]
    pub allow_everyone_if_no_acl_found: bool,
}

/// `--authorizer`: which authorizer runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AuthorizerKind {
    /// Kafka's ACLs (Create/Describe/DeleteAcls), like `StandardAuthorizer`.
    Acl,
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

    /// For benchmarks and tests, not production: hold every store request
    /// by a log-normal delay with this median and 99th percentile, in ms
    /// (`40,160` is like S3 Standard's PUTs, `5,15` like S3 Express One Zone).
    #[arg(long, env = "STRATA_STORE_LATENCY_MS", value_name = "MEDIAN,P99", value_parser = parse_latency)]
    pub store_latency_ms: Option<Latency>,
}

fn parse_latency(s: &str) -> Result<Latency, String> {
    let ms = |v: &str| {
        v.trim()
            .parse::<u64>()
            .map(std::time::Duration::from_millis)
            .map_err(|e| format!("{v:?}: {e}"))
    };
    let (median, p99) = s.split_once(',').ok_or("expected MEDIAN,P99 in ms")?;
    let (median, p99) = (ms(median)?, ms(p99)?);
    if p99 < median {
        return Err("the 99th percentile is below the median".into());
    }
    Ok(Latency { median, p99 })
}

impl StoreArgs {
    pub fn settings(&self) -> crate::manifest::store::StoreSettings {
        crate::manifest::store::StoreSettings {
            url: self.store.clone(),
            s3: crate::manifest::store::S3Options {
                endpoint: self.s3_endpoint.clone(),
                region: self.s3_region.clone(),
                allow_http: self.s3_allow_http,
                virtual_hosted: self.s3_virtual_hosted,
            },
            latency: self.store_latency_ms,
        }
    }
}

impl BrokerConfig {
    /// The listeners to open: `--listener`s, else one PLAINTEXT on `--listen`.
    pub fn listeners(&self) -> Result<Vec<ListenerSpec>, String> {
        let map = parse_protocol_map(self.listener_security_protocol_map.as_deref())?;
        let mut out: Vec<ListenerSpec> = Vec::new();
        if self.listener.is_empty() {
            out.push(ListenerSpec {
                name: "PLAINTEXT".to_string(),
                protocol: SecurityProtocol::Plaintext,
                bind: self.listen,
                advertised: None,
            });
        }
        for l in &self.listener {
            let (name, host, port) = parse_listener(l)?;
            let protocol = match map.iter().find(|(n, _)| *n == name) {
                Some((_, p)) => *p,
                None => SecurityProtocol::from_name(&name).ok_or_else(|| {
                    format!("listener {name} has no security protocol: name it in --listener-security-protocol-map")
                })?,
            };
            let host = if host.is_empty() {
                "0.0.0.0".to_string()
            } else {
                host
            };
            let bind = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), port))
                .map_err(|e| format!("listener {l}: {e}"))?
                .next()
                .ok_or_else(|| format!("listener {l}: no address"))?;
            if out.iter().any(|o| o.name == name) {
                return Err(format!("listener {name} given twice"));
            }
            out.push(ListenerSpec {
                name,
                protocol,
                bind,
                advertised: None,
            });
        }
        for (i, adv) in self.advertised_listener.iter().enumerate() {
            let (name, host, port) = if adv.contains("://") {
                parse_listener(adv)?
            } else if i == 0 {
                let (host, port) = match adv.rsplit_once(':') {
                    Some((h, p)) => (
                        h.to_string(),
                        p.parse().map_err(|_| format!("bad port in {adv}"))?,
                    ),
                    None => (adv.clone(), 0),
                };
                (
                    out[0].name.clone(),
                    host.trim_matches(['[', ']']).to_string(),
                    port,
                )
            } else {
                return Err(format!("advertised listener {adv} needs a NAME:// prefix"));
            };
            let spec = out
                .iter_mut()
                .find(|o| o.name == name)
                .ok_or_else(|| format!("advertised listener {adv} names no --listener"))?;
            spec.advertised = Some((host, port));
        }
        Ok(out)
    }

    /// The listener the broker's own clients use, and on a SASL listener
    /// how they log in. Refuses what Kafka refuses at start: an unknown
    /// listener name, a mechanism not enabled, a SASL listener without the
    /// broker's credentials.
    pub fn inter_broker(&self) -> Result<(ListenerSpec, Option<SaslLogin>), String> {
        let listeners = self.listeners()?;
        let spec = match &self.inter_broker_listener_name {
            None => listeners[0].clone(),
            Some(name) => listeners
                .iter()
                .find(|l| &l.name == name)
                .cloned()
                .ok_or_else(|| {
                    format!("--inter-broker-listener-name {name} names no --listener")
                })?,
        };
        if !spec.protocol.sasl() {
            return Ok((spec, None));
        }
        let mechanism = match &self.sasl_mechanism_inter_broker_protocol {
            Some(m) => m.clone(),
            None => self
                .sasl_enabled_mechanisms
                .first()
                .cloned()
                .ok_or("--sasl-enabled-mechanisms is empty")?,
        };
        if !self.sasl_enabled_mechanisms.contains(&mechanism) {
            return Err(format!(
                "--sasl-mechanism-inter-broker-protocol {mechanism} is not in --sasl-enabled-mechanisms"
            ));
        }
        let (Some(username), Some(password)) = (
            &self.inter_broker_sasl_username,
            &self.inter_broker_sasl_password,
        ) else {
            return Err(format!(
                "the inter-broker listener {} is {}: give the broker's own credentials with --inter-broker-sasl-username and STRATA_INTER_BROKER_SASL_PASSWORD",
                spec.name,
                spec.protocol.name()
            ));
        };
        let login = SaslLogin {
            mechanism,
            username: username.clone(),
            password: password.clone(),
        };
        Ok((spec, Some(login)))
    }

    /// Whether any listener speaks SASL.
    pub fn any_sasl(&self) -> bool {
        self.listeners()
            .map(|ls| ls.iter().any(|l| l.protocol.sasl()))
            .unwrap_or(false)
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
                migration: self.group_consumer_migration_policy,
            },
            streams: crate::coordinator::streams::StreamsGroupConfig {
                heartbeat_interval: Duration::from_millis(self.group_streams_heartbeat_interval_ms),
                session_timeout: Duration::from_millis(self.group_streams_session_timeout_ms),
                num_standby_replicas: self.group_streams_num_standby_replicas,
                initial_rebalance_delay: Duration::from_millis(
                    self.group_streams_initial_rebalance_delay_ms,
                ),
                assignment_interval: Duration::from_millis(
                    self.group_streams_assignment_interval_ms,
                ),
                max_size: self.group_streams_max_size as usize,
            },
            share: crate::coordinator::share_group::ShareGroupConfig {
                heartbeat_interval: Duration::from_millis(self.group_share_heartbeat_interval_ms),
                session_timeout: Duration::from_millis(self.group_share_session_timeout_ms),
                max_size: self.group_share_max_size as usize,
                partition: crate::coordinator::share_partition::ShareSettings {
                    lock_duration: Duration::from_millis(self.group_share_record_lock_duration_ms),
                    delivery_count_limit: self.group_share_delivery_count_limit as i16,
                    max_in_flight: self.group_share_partition_max_record_locks as i64,
                    renew_enabled: true,
                    read_committed: false,
                },
            },
        }
    }

    pub fn transactions(&self) -> crate::coordinator::txn::TxnConfig {
        crate::coordinator::txn::TxnConfig {
            max_timeout_ms: self.transaction_max_timeout_ms,
            id_expiration_ms: self.transactional_id_expiration_ms,
            segment_bytes: self.offsets_topic_segment_bytes,
            wait_for_fsync: self.fsync == FsyncPolicy::Always || self.cluster.is_some(),
        }
    }

    /// The authorizer's settings.
    /// Kafka's delegation.token.* settings.
    pub(crate) fn delegation_tokens(&self) -> crate::auth::tokens::TokenSettings {
        crate::auth::tokens::TokenSettings {
            secret_key: self
                .delegation_token_secret_key
                .clone()
                .filter(|k| !k.is_empty()),
            max_lifetime_ms: self.delegation_token_max_lifetime_ms,
            expiry_time_ms: self.delegation_token_expiry_time_ms,
        }
    }

    pub fn access(&self) -> crate::access::AccessSettings {
        crate::access::AccessSettings {
            authorizer: self.authorizer.is_some(),
            acl: crate::access::acl::AuthorizerSettings {
                super_users: self
                    .super_users
                    .split(';')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string)
                    .collect(),
                allow_everyone_if_no_acl_found: self.allow_everyone_if_no_acl_found,
            },
        }
    }

    /// The settings these flags set, under Kafka's names, as broker
    /// DescribeConfigs reports them.
    pub(crate) fn static_configs(&self) -> Vec<StaticConfig> {
        use ConfigType::{Boolean, Int, List, Long, String as Str};
        let c = |name, value: String, kind| StaticConfig { name, value, kind };
        let listeners = self.listeners().unwrap_or_default();
        let joined = |f: &dyn Fn(&ListenerSpec) -> String| {
            listeners.iter().map(f).collect::<Vec<_>>().join(",")
        };
        let data_dir = self.data_dir.display().to_string();
        let overrides = self.max_connections_per_ip_overrides.0.iter();
        vec![
            c("node.id", self.node_id.to_string(), Int),
            c("broker.id", self.node_id.to_string(), Int),
            c(
                "listeners",
                joined(&|l| format!("{}://{}", l.name, l.bind)),
                List,
            ),
            c(
                "listener.security.protocol.map",
                joined(&|l| format!("{}:{}", l.name, l.protocol.name())),
                List,
            ),
            c(
                "inter.broker.listener.name",
                self.inter_broker_listener_name
                    .clone()
                    .or_else(|| listeners.first().map(|l| l.name.clone()))
                    .unwrap_or_default(),
                Str,
            ),
            c(
                "sasl.mechanism.inter.broker.protocol",
                self.sasl_mechanism_inter_broker_protocol
                    .clone()
                    .or_else(|| self.sasl_enabled_mechanisms.first().cloned())
                    .unwrap_or_default(),
                Str,
            ),
            c(
                "sasl.enabled.mechanisms",
                self.sasl_enabled_mechanisms.join(","),
                List,
            ),
            c(
                "ssl.client.auth",
                format!("{:?}", self.ssl_client_auth).to_ascii_lowercase(),
                Str,
            ),
            c(
                "connections.max.reauth.ms",
                self.connections_max_reauth_ms.to_string(),
                Long,
            ),
            c(
                "delegation.token.max.lifetime.ms",
                self.delegation_token_max_lifetime_ms.to_string(),
                Long,
            ),
            c(
                "delegation.token.expiry.time.ms",
                self.delegation_token_expiry_time_ms.to_string(),
                Long,
            ),
            c(
                "delegation.token.expiry.check.interval.ms",
                self.delegation_token_expiry_check_interval_ms.to_string(),
                Long,
            ),
            c(
                "connection.failed.authentication.delay.ms",
                self.connection_failed_authentication_delay_ms.to_string(),
                Int,
            ),
            c("max.connections", self.max_connections.to_string(), Int),
            c(
                "max.connections.per.ip",
                self.max_connections_per_ip.to_string(),
                Int,
            ),
            c(
                "max.connections.per.ip.overrides",
                overrides
                    .map(|(ip, n)| format!("{ip}:{n}"))
                    .collect::<Vec<_>>()
                    .join(","),
                Str,
            ),
            c(
                "connections.max.idle.ms",
                self.connections_max_idle_ms.to_string(),
                Long,
            ),
            c("log.dirs", data_dir.clone(), List),
            c("log.dir", data_dir, Str),
            c(
                "num.partitions",
                self.num_partitions.max(1).to_string(),
                Int,
            ),
            c(
                "auto.create.topics.enable",
                self.auto_create_topics.to_string(),
                Boolean,
            ),
            c(
                "log.retention.check.interval.ms",
                self.tier_interval_ms.to_string(),
                Long,
            ),
            c(
                "log.flush.interval.ms",
                match self.fsync {
                    FsyncPolicy::Always => "0".to_string(),
                    FsyncPolicy::Interval => self.fsync_interval_ms.to_string(),
                    FsyncPolicy::None => i64::MAX.to_string(),
                },
                Long,
            ),
            c(
                "socket.request.max.bytes",
                self.max_request_bytes.to_string(),
                Int,
            ),
            c(
                "group.initial.rebalance.delay.ms",
                self.group_initial_rebalance_delay_ms.to_string(),
                Int,
            ),
            c(
                "group.min.session.timeout.ms",
                self.group_min_session_timeout_ms.to_string(),
                Int,
            ),
            c(
                "group.max.session.timeout.ms",
                self.group_max_session_timeout_ms.to_string(),
                Int,
            ),
            c(
                "group.consumer.heartbeat.interval.ms",
                self.group_consumer_heartbeat_interval_ms.to_string(),
                Int,
            ),
            c(
                "group.consumer.session.timeout.ms",
                self.group_consumer_session_timeout_ms.to_string(),
                Int,
            ),
            c(
                "group.consumer.assignors",
                self.group_consumer_assignors.0.join(","),
                List,
            ),
            c(
                "group.consumer.max.size",
                self.group_consumer_max_size.to_string(),
                Int,
            ),
            c(
                "group.consumer.migration.policy",
                self.group_consumer_migration_policy.name().to_string(),
                Str,
            ),
            c(
                "group.streams.heartbeat.interval.ms",
                self.group_streams_heartbeat_interval_ms.to_string(),
                Int,
            ),
            c(
                "group.streams.session.timeout.ms",
                self.group_streams_session_timeout_ms.to_string(),
                Int,
            ),
            c(
                "group.streams.num.standby.replicas",
                self.group_streams_num_standby_replicas.to_string(),
                Int,
            ),
            c(
                "group.streams.initial.rebalance.delay.ms",
                self.group_streams_initial_rebalance_delay_ms.to_string(),
                Int,
            ),
            c(
                "group.streams.assignment.interval.ms",
                self.group_streams_assignment_interval_ms.to_string(),
                Int,
            ),
            c(
                "group.streams.max.size",
                self.group_streams_max_size.to_string(),
                Int,
            ),
            c(
                "group.share.heartbeat.interval.ms",
                self.group_share_heartbeat_interval_ms.to_string(),
                Int,
            ),
            c(
                "group.share.session.timeout.ms",
                self.group_share_session_timeout_ms.to_string(),
                Int,
            ),
            c(
                "group.share.max.size",
                self.group_share_max_size.to_string(),
                Int,
            ),
            c(
                "group.share.record.lock.duration.ms",
                self.group_share_record_lock_duration_ms.to_string(),
                Int,
            ),
            c(
                "group.share.min.record.lock.duration.ms",
                self.group_share_min_record_lock_duration_ms.to_string(),
                Int,
            ),
            c(
                "group.share.max.record.lock.duration.ms",
                self.group_share_max_record_lock_duration_ms.to_string(),
                Int,
            ),
            c(
                "group.share.delivery.count.limit",
                self.group_share_delivery_count_limit.to_string(),
                Int,
            ),
            c(
                "group.share.partition.max.record.locks",
                self.group_share_partition_max_record_locks.to_string(),
                Int,
            ),
            c(
                "offsets.retention.minutes",
                self.offsets_retention_minutes.to_string(),
                Int,
            ),
            c(
                "offsets.retention.check.interval.ms",
                self.offsets_retention_check_interval_ms.to_string(),
                Long,
            ),
            c(
                "offsets.topic.segment.bytes",
                self.offsets_topic_segment_bytes.to_string(),
                Int,
            ),
            c(
                "transaction.max.timeout.ms",
                self.transaction_max_timeout_ms.to_string(),
                Int,
            ),
            c(
                "transactional.id.expiration.ms",
                self.transactional_id_expiration_ms.to_string(),
                Int,
            ),
            c(
                "transaction.abort.timed.out.transaction.cleanup.interval.ms",
                self.transaction_abort_timed_out_transaction_cleanup_interval_ms
                    .to_string(),
                Int,
            ),
            c(
                "authorizer.class.name",
                match self.authorizer {
                    // What Kafka's own ACL authorizer is called; it behaves alike.
                    Some(AuthorizerKind::Acl) => {
                        "org.apache.kafka.metadata.authorizer.StandardAuthorizer".into()
                    }
                    None => String::new(),
                },
                Str,
            ),
            c("super.users", self.super_users.clone(), List),
            c(
                "allow.everyone.if.no.acl.found",
                self.allow_everyone_if_no_acl_found.to_string(),
                Boolean,
            ),
        ]
    }

    pub fn fsync_interval(&self) -> Duration {
        Duration::from_millis(self.fsync_interval_ms.max(1))
    }
}

/// Kafka's security protocols.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecurityProtocol {
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn from_name(name: &str) -> Option<SecurityProtocol> {
        Some(match name {
            "PLAINTEXT" => SecurityProtocol::Plaintext,
            "SSL" => SecurityProtocol::Ssl,
            "SASL_PLAINTEXT" => SecurityProtocol::SaslPlaintext,
            "SASL_SSL" => SecurityProtocol::SaslSsl,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    pub fn tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// One listener as configured.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerSpec {
    pub name: String,
    pub protocol: SecurityProtocol,
    pub bind: SocketAddr,
    /// (host, port) clients are told; port 0: the port bound.
    pub advertised: Option<(String, u16)>,
}

/// `NAME://host:port`; the host may be empty or an IPv6 address in brackets.
fn parse_listener(s: &str) -> Result<(String, String, u16), String> {
    let (name, addr) = s
        .split_once("://")
        .ok_or_else(|| format!("listener {s:?}: expected NAME://host:port"))?;
    let (host, port) = addr
        .rsplit_once(':')
        .ok_or_else(|| format!("listener {s:?}: no port"))?;
    let port = port
        .parse()
        .map_err(|_| format!("listener {s:?}: bad port"))?;
    let name = name.to_ascii_uppercase();
    if name.is_empty() {
        return Err(format!("listener {s:?}: empty name"));
    }
    Ok((name, host.trim_matches(['[', ']']).to_string(), port))
}

fn parse_protocol_map(s: Option<&str>) -> Result<Vec<(String, SecurityProtocol)>, String> {
    let Some(s) = s else { return Ok(Vec::new()) };
    s.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (name, proto) = e
                .split_once(':')
                .ok_or_else(|| format!("protocol map entry {e:?}: expected NAME:PROTOCOL"))?;
            let proto = SecurityProtocol::from_name(&proto.to_ascii_uppercase())
                .ok_or_else(|| format!("protocol map entry {e:?}: unknown protocol"))?;
            Ok((name.to_ascii_uppercase(), proto))
        })
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        config: BrokerConfig,
    }

    fn config(args: &[&str]) -> BrokerConfig {
        let mut all = vec!["strata"];
        all.extend_from_slice(args);
        Cli::parse_from(all).config
    }

    #[test]
    fn every_kafka_name_a_flag_gives_is_reported_by_describe_configs() {
        use clap::CommandFactory;
        // Kafka takes the first three as PEM contents; here the flags name
        // files. The secret key is a secret: Kafka reports it as sensitive,
        // without its value, which this broker's DescribeConfigs cannot say
        // yet, so it is left out.
        const NOT_REPORTED: [&str; 4] = [
            "ssl.keystore.certificate.chain",
            "ssl.keystore.key",
            "ssl.truststore.certificates",
            "delegation.token.secret.key",
        ];
        let reported: Vec<&str> = config(&[])
            .static_configs()
            .iter()
            .map(|c| c.name)
            .collect();
        let name = regex::Regex::new(r"\((?:Kafka's )?`?([a-z]+(?:\.[a-z]+)+)`?\)").unwrap();
        let mut checked = 0;
        for arg in Cli::command().get_arguments() {
            let help = arg
                .get_long_help()
                .or(arg.get_help())
                .map(|h| h.to_string());
            for m in name.captures_iter(&help.unwrap_or_default()) {
                let kafka = m.get(1).unwrap().as_str();
                if kafka != "advertised.listeners" && !NOT_REPORTED.contains(&kafka) {
                    assert!(
                        reported.contains(&kafka),
                        "--{} ({kafka}) is not reported",
                        arg.get_id()
                    );
                    checked += 1;
                }
            }
        }
        assert!(checked > 25, "only {checked} flags name a Kafka config");
    }

    #[test]
    fn listeners_default_to_one_plaintext_on_listen() {
        let c = config(&[
            "--listen",
            "127.0.0.1:9999",
            "--advertised-listener",
            "kafka:19092",
        ]);
        let ls = c.listeners().unwrap();
        assert_eq!(ls.len(), 1);
        assert_eq!(ls[0].name, "PLAINTEXT");
        assert_eq!(ls[0].protocol, SecurityProtocol::Plaintext);
        assert_eq!(ls[0].bind, "127.0.0.1:9999".parse().unwrap());
        assert_eq!(ls[0].advertised, Some(("kafka".to_string(), 19092)));
    }

    #[test]
    fn the_inter_broker_listener_defaults_to_the_first_and_a_sasl_one_needs_a_login() {
        let two = ["--listener", "PLAINTEXT://:0,INTERNAL://:0"];
        let map = ["--listener-security-protocol-map", "INTERNAL:SASL_SSL"];
        let (spec, login) = config(&[&two[..], &map[..]].concat())
            .inter_broker()
            .unwrap();
        assert_eq!((spec.name.as_str(), login), ("PLAINTEXT", None));
        let named = [
            &two[..],
            &map[..],
            &["--inter-broker-listener-name", "INTERNAL"],
        ]
        .concat();
        let err = config(&named).inter_broker().unwrap_err();
        assert!(err.contains("--inter-broker-sasl-username"), "{err}");
        let creds = ["--inter-broker-sasl-username", "broker"];
        let pw = ["--inter-broker-sasl-password", "pw"];
        let (spec, login) = config(&[&named[..], &creds[..], &pw[..]].concat())
            .inter_broker()
            .unwrap();
        assert_eq!(spec.protocol, SecurityProtocol::SaslSsl);
        let login = login.unwrap();
        // The first enabled mechanism unless one is named.
        assert_eq!(
            (login.mechanism.as_str(), login.username.as_str()),
            ("PLAIN", "broker")
        );
        let scram = ["--sasl-mechanism-inter-broker-protocol", "SCRAM-SHA-512"];
        let full = [&named[..], &creds[..], &pw[..], &scram[..]].concat();
        let login = config(&full).inter_broker().unwrap().1.unwrap();
        assert_eq!(login.mechanism, "SCRAM-SHA-512");
        let only_plain = ["--sasl-enabled-mechanisms", "PLAIN"];
        let err = config(&[&full[..], &only_plain[..]].concat())
            .inter_broker()
            .unwrap_err();
        assert!(err.contains("not in --sasl-enabled-mechanisms"), "{err}");
        let unknown = [&two[..], &["--inter-broker-listener-name", "OTHER"]].concat();
        assert!(config(&unknown).inter_broker().is_err());
    }

    #[test]
    fn named_listeners_take_protocols_from_names_or_the_map() {
        let c = config(&[
            "--listener",
            "PLAINTEXT://127.0.0.1:9092,INTERNAL://:9093",
            "--listener",
            "SASL_SSL://127.0.0.1:9094",
            "--listener-security-protocol-map",
            "INTERNAL:SASL_PLAINTEXT",
            "--advertised-listener",
            "SASL_SSL://broker.example.com:443",
        ]);
        let ls = c.listeners().unwrap();
        let protos: Vec<_> = ls.iter().map(|l| (l.name.as_str(), l.protocol)).collect();
        assert_eq!(
            protos,
            [
                ("PLAINTEXT", SecurityProtocol::Plaintext),
                ("INTERNAL", SecurityProtocol::SaslPlaintext),
                ("SASL_SSL", SecurityProtocol::SaslSsl)
            ]
        );
        assert!(ls[1].bind.ip().is_unspecified());
        assert_eq!(
            ls[2].advertised,
            Some(("broker.example.com".to_string(), 443))
        );
        assert!(config(&["--listener", "CUSTOM://:1"]).listeners().is_err());
        assert!(
            config(&["--listener", "SSL://:1", "--listener", "SSL://:2"])
                .listeners()
                .is_err()
        );
        assert!(config(&[
            "--listener",
            "SSL://:1",
            "--advertised-listener",
            "SASL_SSL://h:1"
        ])
        .listeners()
        .is_err());
    }
}
