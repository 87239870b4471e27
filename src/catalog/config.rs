//! Topic configuration under Kafka's names.
//!
//! Tools that manage topics (Terraform providers, Debezium, Schema Registry,
//! Kafka's own scripts) send whichever of Kafka's topic configs they know,
//! and Kafka refuses a whole CreateTopics entry for one name it does not
//! know. So every topic config Kafka 4.4 defines is here (the deprecated
//! no-op `message.downconversion.enable` included, as 4.x still accepts
//! it), with Kafka's type, default, valid values and broker-wide synonym,
//! and is validated the way Kafka's `ConfigDef` validates it, with the same
//! messages. Whether a config
//! also changes behaviour is a separate question the README's "Topic configs"
//! table answers: some (replication throttles, unclean leader election) mean
//! nothing on one broker, and saying so beats refusing the topic.
//!
//! A topic stores only its overrides; everything else reads Kafka's default.
//! The `strata.*` configs are this broker's own.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::log::AppendConfig;

/// Kafka's ConfigType values as sent in DescribeConfigs v3+.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    Double = 6,
    List = 7,
    /// Kafka's PASSWORD: described with a null value, as sensitive.
    Password = 9,
}

/// The valid values of a config, beyond parsing as its type.
#[derive(Debug, Clone, Copy)]
pub enum Valid {
    Any,
    AtLeast(i64),
    Between(i64, i64),
    /// `[1,...,9] or -1`, as `compression.gzip.level`.
    GzipLevel,
    /// A double in a closed range.
    Ratio(f64, f64),
    OneOf(&'static [&'static str]),
    /// A non-empty list whose items are each one of these.
    ListOf(&'static [&'static str]),
    /// `*`, or `partition:broker` pairs (the replication throttles).
    Replicas,
}

pub struct ConfigDef {
    pub name: &'static str,
    pub default: &'static str,
    pub kind: ConfigType,
    pub valid: Valid,
    /// The broker config that supplies the default (Kafka's "Server Default
    /// Property"), reported as the synonym of a topic's value.
    pub broker: Option<&'static str>,
    pub doc: &'static str,
}

pub const CLEANUP_POLICY: &str = "cleanup.policy";
pub const COMPRESSION_TYPE: &str = "compression.type";
pub const COMPRESSION_GZIP_LEVEL: &str = "compression.gzip.level";
pub const COMPRESSION_LZ4_LEVEL: &str = "compression.lz4.level";
pub const COMPRESSION_ZSTD_LEVEL: &str = "compression.zstd.level";
pub const DELETE_RETENTION_MS: &str = "delete.retention.ms";
pub const FLUSH_MESSAGES: &str = "flush.messages";
pub const FLUSH_MS: &str = "flush.ms";
pub const INDEX_INTERVAL_BYTES: &str = "index.interval.bytes";
pub const MAX_COMPACTION_LAG_MS: &str = "max.compaction.lag.ms";
pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";
pub const MESSAGE_TIMESTAMP_AFTER_MAX_MS: &str = "message.timestamp.after.max.ms";
pub const MESSAGE_TIMESTAMP_BEFORE_MAX_MS: &str = "message.timestamp.before.max.ms";
pub const MESSAGE_TIMESTAMP_TYPE: &str = "message.timestamp.type";
pub const MIN_COMPACTION_LAG_MS: &str = "min.compaction.lag.ms";
pub const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";
pub const RETENTION_BYTES: &str = "retention.bytes";
pub const RETENTION_MS: &str = "retention.ms";
pub const SEGMENT_BYTES: &str = "segment.bytes";
pub const SEGMENT_JITTER_MS: &str = "segment.jitter.ms";
pub const SEGMENT_MS: &str = "segment.ms";
pub const COMPACTION_POLICY: &str = "strata.compaction.policy";
pub const COMPACTION_FANOUT: &str = "strata.compaction.fanout";
pub const COMPACTION_MAX_SEGMENT_BYTES: &str = "strata.compaction.max.segment.bytes";

const LONG_MAX: &str = "9223372036854775807";

/// Kafka's topic-level codecs: the four, `uncompressed`, and `producer`
/// (keep whatever the producer used).
pub const COMPRESSION_TYPES: &[&str] =
    &["uncompressed", "zstd", "lz4", "snappy", "gzip", "producer"];

pub(crate) const fn def(
    name: &'static str,
    default: &'static str,
    kind: ConfigType,
    valid: Valid,
    broker: Option<&'static str>,
    doc: &'static str,
) -> ConfigDef {
    ConfigDef {
        name,
        default,
        kind,
        valid,
        broker,
        doc,
    }
}

use ConfigType::{Boolean, Double, Int, List, Long, String as Str};
use Valid::{AtLeast, Between, OneOf};

/// Kafka 4.x's 34 topic configs (`TopicConfig`/`LogConfig`), then Strata's own.
/// `segment.bytes` keeps the pre-4.0 minimum of 14 bytes, which tests and
/// small deployments use to seal segments quickly.
pub const TOPIC_CONFIGS: &[ConfigDef] = &[
    def(CLEANUP_POLICY, "delete", List, Valid::ListOf(&["compact", "delete"]), Some("log.cleanup.policy"),
        "The retention policy of old segments: delete (drop them past retention), compact (keep the newest record per key), or both"),
    def(COMPRESSION_GZIP_LEVEL, "-1", Int, Valid::GzipLevel, Some("compression.gzip.level"),
        "The compression level to use if compression.type is set to gzip"),
    def(COMPRESSION_LZ4_LEVEL, "9", Int, Between(1, 17), Some("compression.lz4.level"),
        "The compression level to use if compression.type is set to lz4"),
    def(COMPRESSION_TYPE, "producer", Str, OneOf(COMPRESSION_TYPES), Some("compression.type"),
        "The final codec of the topic's batches: gzip, snappy, lz4, zstd, uncompressed, or producer to keep the producer's codec"),
    def(COMPRESSION_ZSTD_LEVEL, "3", Int, Between(-131072, 22), Some("compression.zstd.level"),
        "The compression level to use if compression.type is set to zstd"),
    def(DELETE_RETENTION_MS, "86400000", Long, AtLeast(0), Some("log.cleaner.delete.retention.ms"),
        "How long tombstones of a compacted topic are retained"),
    def("errors.deadletterqueue.group.enable", "false", Boolean, Valid::Any, None,
        "Whether share groups may write undeliverable records to this topic as a dead-letter queue"),
    def("file.delete.delay.ms", "60000", Long, AtLeast(0), Some("log.segment.delete.delay.ms"),
        "Time to wait before deleting a file from the filesystem"),
    def(FLUSH_MESSAGES, LONG_MAX, Long, AtLeast(1), Some("log.flush.interval.messages"),
        "Unflushed records after which an append forces an fsync of the partition"),
    def(FLUSH_MS, LONG_MAX, Long, AtLeast(0), Some("log.flush.interval.ms"),
        "Age of the oldest unflushed data after which an append forces an fsync of the partition"),
    def("follower.replication.throttled.replicas", "", List, Valid::Replicas, None,
        "Replicas whose log replication is throttled on the follower side: partition:broker pairs or *"),
    def(INDEX_INTERVAL_BYTES, "4096", Int, AtLeast(0), Some("log.index.interval.bytes"),
        "Bytes of batches between two entries of the sparse offset and time indexes"),
    def("leader.replication.throttled.replicas", "", List, Valid::Replicas, None,
        "Replicas whose log replication is throttled on the leader side: partition:broker pairs or *"),
    def("local.retention.bytes", "-2", Long, AtLeast(-2), Some("log.local.retention.bytes"),
        "Local bytes of a tiered partition kept before deletion; -2 means retention.bytes"),
    def("local.retention.ms", "-2", Long, AtLeast(-2), Some("log.local.retention.ms"),
        "Age of local segments of a tiered partition before deletion; -2 means retention.ms"),
    def(MAX_COMPACTION_LAG_MS, LONG_MAX, Long, AtLeast(1), Some("log.cleaner.max.compaction.lag.ms"),
        "Maximum time a record stays ineligible for compaction"),
    def("max.decompressed.message.bytes", "2147483639", Int, Between(1, 2147483639), Some("max.decompressed.message.bytes"),
        "Largest decompressed size of a single record the broker accepts"),
    def(MAX_MESSAGE_BYTES, "1048588", Int, AtLeast(0), Some("message.max.bytes"),
        "Largest record batch accepted"),
    // Kafka 4.0 removed down-conversion but kept this as a deprecated no-op
    // (KAFKA-18269), to be removed in 5.0: topics that set it still load.
    def("message.downconversion.enable", "true", Boolean, Valid::Any, Some("log.message.downconversion.enable"),
        "Deprecated since Kafka 4.0, where down-conversion was removed: has no effect"),
    def(MESSAGE_TIMESTAMP_AFTER_MAX_MS, "3600000", Long, AtLeast(0), Some("log.message.timestamp.after.max.ms"),
        "How far a CreateTime record's timestamp may lie after the broker's time"),
    def(MESSAGE_TIMESTAMP_BEFORE_MAX_MS, LONG_MAX, Long, AtLeast(0), Some("log.message.timestamp.before.max.ms"),
        "How far a CreateTime record's timestamp may lie before the broker's time"),
    def(MESSAGE_TIMESTAMP_TYPE, "CreateTime", Str, OneOf(&["CreateTime", "LogAppendTime"]), Some("log.message.timestamp.type"),
        "CreateTime keeps the producer's timestamps; LogAppendTime stamps batches with the broker's time"),
    def("min.cleanable.dirty.ratio", "0.5", Double, Valid::Ratio(0.0, 1.0), Some("log.cleaner.min.cleanable.ratio"),
        "Share of the log not yet compacted at which Kafka's cleaner runs"),
    def(MIN_COMPACTION_LAG_MS, "0", Long, AtLeast(0), Some("log.cleaner.min.compaction.lag.ms"),
        "Minimum time a record stays uncompacted"),
    def(MIN_INSYNC_REPLICAS, "1", Int, AtLeast(1), Some("min.insync.replicas"),
        "Replicas that must acknowledge acks=all writes"),
    def("preallocate", "false", Boolean, Valid::Any, Some("log.preallocate"),
        "Preallocate the file of a new segment"),
    def("remote.copy.lag.bytes", "-1", Long, AtLeast(-1), Some("log.remote.copy.lag.bytes"),
        "Newer local bytes after which a sealed segment may be copied to remote storage; -1 means local.retention.bytes"),
    def("remote.copy.lag.ms", "0", Long, AtLeast(-1), Some("log.remote.copy.lag.ms"),
        "Age after which a sealed segment may be copied to remote storage; -1 means local.retention.ms"),
    def("remote.log.copy.disable", "false", Boolean, Valid::Any, None,
        "Stop copying segments of a tiered topic to remote storage"),
    def("remote.log.delete.on.disable", "false", Boolean, Valid::Any, None,
        "Delete remote data when tiered storage is turned off for the topic"),
    def("remote.storage.enable", "false", Boolean, Valid::Any, None,
        "Tier the topic's segments to remote storage"),
    def(RETENTION_BYTES, "-1", Long, Valid::Any, Some("log.retention.bytes"),
        "Partition size beyond which old segments may be deleted; -1 for no limit"),
    def(RETENTION_MS, "604800000", Long, AtLeast(-1), Some("log.retention.ms"),
        "Age after which old segments may be deleted; -1 keeps them forever"),
    def(SEGMENT_BYTES, "1073741824", Int, AtLeast(14), Some("log.segment.bytes"),
        "Size at which the active segment rolls"),
    def("segment.index.bytes", "10485760", Int, AtLeast(4), Some("log.index.size.max.bytes"),
        "Size of the preallocated offset index of a segment"),
    def(SEGMENT_JITTER_MS, "0", Long, AtLeast(0), Some("log.roll.jitter.ms"),
        "Maximum random time taken off segment.ms per segment, so segments of many partitions do not roll together"),
    def(SEGMENT_MS, "604800000", Long, AtLeast(1), Some("log.roll.ms"),
        "Age at which the active segment rolls"),
    def("unclean.leader.election.enable", "false", Boolean, Valid::Any, Some("unclean.leader.election.enable"),
        "Allow a replica outside the ISR to become leader"),
    def(COMPACTION_POLICY, "leveled", Str, OneOf(&["leveled", "none"]), None,
        "Strata: how sealed segments are merged: leveled, or none"),
    def(COMPACTION_FANOUT, "4", Int, AtLeast(2), None,
        "Strata: contiguous segments of one level that merge into one of the next level"),
    // Merged segments keep byte positions in 32 bits.
    def(COMPACTION_MAX_SEGMENT_BYTES, "2147483648", Long, Between(1, u32::MAX as i64), None,
        "Strata: merges whose sources add up to more than this are not scheduled"),
];

pub fn definition(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

fn unknown(name: &str) -> String {
    format!("Unknown topic config name: {name}")
}

/// Checks a value for a named config; the error says why, in Kafka's words
/// (`ConfigDef`'s parse and validator messages).
pub fn validate(name: &str, value: &str) -> Result<(), String> {
    check(definition(name).ok_or_else(|| unknown(name))?, value)
}

/// Checks a value against a config's definition, in Kafka's words.
pub fn check(def: &ConfigDef, value: &str) -> Result<(), String> {
    let name = def.name;
    let why = |reason: String| format!("Invalid value {value} for configuration {name}: {reason}");
    let v = value.trim();
    let number = match def.kind {
        Int => Some(
            v.parse::<i32>()
                .map_err(|_| why("Not a number of type INT".into()))? as i64,
        ),
        Long => Some(
            v.parse::<i64>()
                .map_err(|_| why("Not a number of type LONG".into()))?,
        ),
        Double => {
            let d: f64 = v
                .parse()
                .ok()
                .filter(|d: &f64| d.is_finite())
                .ok_or_else(|| why("Not a number of type DOUBLE".into()))?;
            if let Valid::Ratio(min, max) = def.valid {
                if d < min {
                    return Err(why(format!("Value must be at least {min}")));
                }
                if d > max {
                    return Err(why(format!("Value must be no more than {max}")));
                }
            }
            None
        }
        Boolean => {
            if !v.eq_ignore_ascii_case("true") && !v.eq_ignore_ascii_case("false") {
                return Err(why("Expected value to be either true or false".into()));
            }
            None
        }
        Str | List | ConfigType::Password => None,
    };
    match (def.valid, number) {
        (AtLeast(min), Some(n)) if n < min => Err(why(format!("Value must be at least {min}"))),
        (Between(min, _), Some(n)) if n < min => Err(why(format!("Value must be at least {min}"))),
        (Between(_, max), Some(n)) if n > max => {
            Err(why(format!("Value must be no more than {max}")))
        }
        (Valid::GzipLevel, Some(n)) if n != -1 && !(1..=9).contains(&n) => {
            Err(why("Value must be between 1 and 9, or -1".into()))
        }
        (OneOf(allowed), _) if !allowed.contains(&v) => Err(why(format!(
            "String must be one of: {}",
            allowed.join(", ")
        ))),
        (Valid::ListOf(allowed), _) => {
            let items = list_items(v);
            match items.iter().find(|i| !allowed.contains(i)) {
                Some(bad) => Err(why(format!(
                    "Invalid value {bad}: String must be one of: {}",
                    allowed.join(", ")
                ))),
                None if items.is_empty() => Err(why(format!(
                    "Empty list; must be a list of {}",
                    allowed.join(", ")
                ))),
                None => Ok(()),
            }
        }
        (Valid::Replicas, _) => {
            let items = list_items(v);
            let pair = |s: &str| {
                s.split_once(':').is_some_and(|(p, b)| {
                    p.trim().parse::<u32>().is_ok() && b.trim().parse::<u32>().is_ok()
                })
            };
            if items == ["*"] || items.iter().all(|i| pair(i)) {
                Ok(())
            } else {
                Err(why("must be the literal '*' or a list of replicas in the following format: [partitionId]:[brokerId],[partitionId]:[brokerId],...".into()))
            }
        }
        _ => Ok(()),
    }
}

/// The items of a list value, trimmed, without empty ones.
pub fn list_items(value: &str) -> Vec<&str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .collect()
}

/// What the produce path checks and does to a topic's batches beyond what
/// the log's `AppendConfig` covers: read once per partition of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducePolicy {
    /// Records without a key are refused (`cleanup.policy` has `compact`).
    pub compact: bool,
    /// `message.timestamp.{before,after}.max.ms`, for CreateTime topics only.
    pub timestamp_window_ms: Option<(i64, i64)>,
    /// The codec and level batches are stored in; `None` keeps the producer's.
    pub compression: Option<(i16, Option<i32>)>,
    pub flush_messages: Option<i64>,
    pub flush_ms: Option<i64>,
}

/// A topic's overrides.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicConfig {
    pub overrides: BTreeMap<String, String>,
}

impl TopicConfig {
    pub fn from_pairs<'a>(
        pairs: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
    ) -> Result<TopicConfig, String> {
        let mut cfg = TopicConfig::default();
        for (k, v) in pairs {
            cfg.set(k, v)?;
        }
        cfg.check_together()?;
        Ok(cfg)
    }

    /// Sets (or with `None`, removes) an override after validating it.
    pub fn set(&mut self, name: &str, value: Option<&str>) -> Result<(), String> {
        match value {
            Some(v) => {
                validate(name, v)?;
                self.overrides
                    .insert(name.to_string(), v.trim().to_string());
            }
            None => {
                definition(name).ok_or_else(|| unknown(name))?;
                self.overrides.remove(name);
            }
        }
        Ok(())
    }

    /// The checks Kafka's `LogConfig.validate` makes across configs, once
    /// all of a request's changes are applied.
    pub fn check_together(&self) -> Result<(), String> {
        let (min, max) = (
            self.number(MIN_COMPACTION_LAG_MS),
            self.number(MAX_COMPACTION_LAG_MS),
        );
        if min > max {
            return Err(format!(
                "conflict topic config setting {MIN_COMPACTION_LAG_MS} ({min}) > {MAX_COMPACTION_LAG_MS} ({max})"
            ));
        }
        Ok(())
    }

    /// The effective value and whether it is an override.
    pub fn get(&self, name: &str) -> Option<(&str, bool)> {
        if let Some(v) = self.overrides.get(name) {
            return Some((v.as_str(), true));
        }
        definition(name).map(|d| (d.default, false))
    }

    fn number(&self, name: &str) -> i64 {
        self.get(name)
            .and_then(|(v, _)| v.parse().ok())
            .unwrap_or(0)
    }

    /// The effective values, parsed. Values were validated when set, so one
    /// that does not parse (only a hand-edited file has one) takes the
    /// nearest valid reading instead of failing.
    pub fn settings(&self) -> TopicSettings {
        let cleanup: Vec<&str> = self
            .get(CLEANUP_POLICY)
            .map(|(v, _)| list_items(v))
            .unwrap_or_default();
        let compact = cleanup.contains(&"compact");
        let log_append_time = self
            .get(MESSAGE_TIMESTAMP_TYPE)
            .is_some_and(|(v, _)| v == "LogAppendTime");
        let level = |name| Some(self.number(name) as i32);
        let compression = match self.get(COMPRESSION_TYPE).map_or("producer", |(v, _)| v) {
            "uncompressed" => Some((0, None)),
            "gzip" => Some((1, level(COMPRESSION_GZIP_LEVEL))),
            "snappy" => Some((2, None)),
            "lz4" => Some((3, level(COMPRESSION_LZ4_LEVEL))),
            "zstd" => Some((4, level(COMPRESSION_ZSTD_LEVEL))),
            _ => None,
        };
        // Kafka's default for flush.*, Long.MAX_VALUE, means never.
        let unless_max = |name| Some(self.number(name)).filter(|&n| n < i64::MAX);
        let unless_negative = |name| Some(self.number(name)).filter(|&n| n >= 0);
        TopicSettings {
            append: AppendConfig {
                max_message_bytes: self.number(MAX_MESSAGE_BYTES).max(0) as usize,
                segment_bytes: self.number(SEGMENT_BYTES).max(14) as u64,
                segment_ms: self.number(SEGMENT_MS).max(1),
                segment_jitter_ms: self.number(SEGMENT_JITTER_MS).max(0),
                index_interval_bytes: self.number(INDEX_INTERVAL_BYTES).max(0) as u64,
                log_append_time,
                compact,
            },
            produce: ProducePolicy {
                compact,
                timestamp_window_ms: (!log_append_time).then(|| {
                    (
                        self.number(MESSAGE_TIMESTAMP_BEFORE_MAX_MS).max(0),
                        self.number(MESSAGE_TIMESTAMP_AFTER_MAX_MS).max(0),
                    )
                }),
                compression,
                flush_messages: unless_max(FLUSH_MESSAGES),
                flush_ms: unless_max(FLUSH_MS),
            },
            cleanup: CleanupPolicy {
                delete: cleanup.contains(&"delete"),
                compact,
            },
            retention_ms: unless_negative(RETENTION_MS),
            retention_bytes: unless_negative(RETENTION_BYTES),
            min_compaction_lag_ms: self.number(MIN_COMPACTION_LAG_MS).max(0),
            max_compaction_lag_ms: self.number(MAX_COMPACTION_LAG_MS).max(0),
            min_cleanable_dirty_ratio: self
                .get("min.cleanable.dirty.ratio")
                .and_then(|(v, _)| v.parse::<f64>().ok())
                .filter(|r| (0.0..=1.0).contains(r))
                .unwrap_or(0.5),
            delete_retention_ms: self.number(DELETE_RETENTION_MS).max(0),
            compaction: match self.get(COMPACTION_POLICY) {
                Some(("none", _)) => CompactionPolicy::None,
                _ => CompactionPolicy::Leveled,
            },
            compaction_fanout: self.number(COMPACTION_FANOUT).max(2) as usize,
            compaction_max_segment_bytes: self
                .number(COMPACTION_MAX_SEGMENT_BYTES)
                .clamp(1, u32::MAX as i64) as u64,
        }
    }
}

/// A topic's configuration, parsed once when it changes and read by field.
#[derive(Debug, Clone, PartialEq)]
pub struct TopicSettings {
    /// What appends check and how segments roll.
    pub append: AppendConfig,
    /// What produce checks and how batches are stored.
    pub produce: ProducePolicy,
    pub cleanup: CleanupPolicy,
    /// `retention.ms`; `None`: kept forever.
    pub retention_ms: Option<i64>,
    /// `retention.bytes`; `None`: no limit.
    pub retention_bytes: Option<i64>,
    pub min_compaction_lag_ms: i64,
    pub max_compaction_lag_ms: i64,
    /// `min.cleanable.dirty.ratio`, in [0, 1].
    pub min_cleanable_dirty_ratio: f64,
    pub delete_retention_ms: i64,
    pub compaction: CompactionPolicy,
    pub compaction_fanout: usize,
    pub compaction_max_segment_bytes: u64,
}

/// `cleanup.policy`: `delete`, `compact` or both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupPolicy {
    pub delete: bool,
    pub compact: bool,
}

/// `strata.compaction.policy`: how sealed segments merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompactionPolicy {
    /// Contiguous segments of one level merge into the next.
    Leveled,
    /// Never merged (the compaction job topic itself).
    None,
}

impl CompactionPolicy {
    pub fn name(self) -> &'static str {
        match self {
            CompactionPolicy::Leveled => "leveled",
            CompactionPolicy::None => "none",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_kafka_names_and_values() {
        assert!(validate("cleanup.policy", "compact,delete").is_ok());
        assert!(validate("cleanup.policy", "shred").is_err());
        assert!(validate("cleanup.policy", "").is_err());
        assert!(validate("retention.ms", "-1").is_ok());
        assert!(validate("retention.ms", "soon").is_err());
        assert!(validate("segment.bytes", "10").is_err());
        assert!(validate("message.timestamp.type", "LogAppendTime").is_ok());
        assert!(validate("no.such.config", "1").is_err());
        assert!(validate("strata.compaction.fanout", "8").is_ok());
        assert!(validate("strata.compaction.fanout", "1").is_err());
        assert!(validate("strata.compaction.policy", "none").is_ok());
        assert!(validate("strata.compaction.policy", "tiered").is_err());
        assert!(validate("strata.compaction.max.segment.bytes", "4294967296").is_err());
    }

    #[test]
    fn kafka_ranges_and_messages() {
        let err = |n, v| validate(n, v).unwrap_err();
        assert_eq!(
            err("compression.type", "brotli"),
            "Invalid value brotli for configuration compression.type: String must be one of: uncompressed, zstd, lz4, snappy, gzip, producer"
        );
        assert_eq!(
            err("min.cleanable.dirty.ratio", "1.5"),
            "Invalid value 1.5 for configuration min.cleanable.dirty.ratio: Value must be no more than 1"
        );
        assert_eq!(
            err("preallocate", "yes"),
            "Invalid value yes for configuration preallocate: Expected value to be either true or false"
        );
        assert_eq!(
            err("flush.messages", "0"),
            "Invalid value 0 for configuration flush.messages: Value must be at least 1"
        );
        assert!(err("segment.index.bytes", "2147483648").ends_with("Not a number of type INT"));
        assert!(validate("compression.gzip.level", "-1").is_ok());
        assert!(validate("compression.gzip.level", "9").is_ok());
        assert!(validate("compression.gzip.level", "0").is_err());
        assert!(validate("compression.lz4.level", "18").is_err());
        assert!(validate("compression.zstd.level", "-131072").is_ok());
        assert!(validate("compression.zstd.level", "23").is_err());
        assert!(validate("local.retention.ms", "-2").is_ok());
        assert!(validate("local.retention.ms", "-3").is_err());
        assert!(validate("max.compaction.lag.ms", "0").is_err());
        assert!(validate("min.cleanable.dirty.ratio", "NaN").is_err());
        assert!(validate("unclean.leader.election.enable", "TRUE").is_ok());
        assert!(validate("leader.replication.throttled.replicas", "*").is_ok());
        assert!(validate("leader.replication.throttled.replicas", "0:1, 1:1").is_ok());
        assert!(validate("leader.replication.throttled.replicas", "").is_ok());
        assert!(validate("follower.replication.throttled.replicas", "0-1").is_err());
        assert!(validate("message.downconversion.enable", "false").is_ok());
        assert!(validate("message.format.version", "3.0").is_err());
    }

    #[test]
    fn every_default_is_valid() {
        for d in TOPIC_CONFIGS {
            assert!(validate(d.name, d.default).is_ok(), "{}", d.name);
        }
        // Kafka 4.4's 38 topic configs and Strata's 3.
        assert_eq!(TOPIC_CONFIGS.len(), 41);
    }

    #[test]
    fn compaction_lags_checked_together() {
        let err = TopicConfig::from_pairs([
            ("min.compaction.lag.ms", Some("10")),
            ("max.compaction.lag.ms", Some("5")),
        ])
        .unwrap_err();
        assert!(err.starts_with("conflict topic config setting min.compaction.lag.ms (10)"));
    }

    #[test]
    fn overrides_shadow_defaults() {
        let mut c = TopicConfig::default();
        assert_eq!(c.get("retention.ms"), Some(("604800000", false)));
        c.set("retention.ms", Some("5")).unwrap();
        assert_eq!(c.get("retention.ms"), Some(("5", true)));
        c.set("retention.ms", None).unwrap();
        assert_eq!(c.get("retention.ms"), Some(("604800000", false)));
        assert_eq!(c.settings().produce.compression, None);
        c.set("compression.type", Some("zstd")).unwrap();
        assert_eq!(c.settings().produce.compression, Some((4, Some(3))));
    }
}
