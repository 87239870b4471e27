//! Topic configuration under Kafka's names.
//!
//! A topic stores only its overrides; everything else reads Kafka's default.
//! Every config here is validated and stored; which ones already change
//! behaviour is listed in the README.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Kafka's ConfigType values as sent in DescribeConfigs v3+.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfigType {
    Boolean = 1,
    String = 2,
    Int = 3,
    Long = 5,
    List = 7,
}

pub struct ConfigDef {
    pub name: &'static str,
    pub default: &'static str,
    pub kind: ConfigType,
    pub doc: &'static str,
}

pub const CLEANUP_POLICY: &str = "cleanup.policy";
pub const RETENTION_MS: &str = "retention.ms";
pub const RETENTION_BYTES: &str = "retention.bytes";
pub const SEGMENT_BYTES: &str = "segment.bytes";
pub const SEGMENT_MS: &str = "segment.ms";
pub const MAX_MESSAGE_BYTES: &str = "max.message.bytes";
pub const MESSAGE_TIMESTAMP_TYPE: &str = "message.timestamp.type";
pub const MIN_COMPACTION_LAG_MS: &str = "min.compaction.lag.ms";
pub const MAX_COMPACTION_LAG_MS: &str = "max.compaction.lag.ms";
pub const DELETE_RETENTION_MS: &str = "delete.retention.ms";
pub const MIN_INSYNC_REPLICAS: &str = "min.insync.replicas";
pub const COMPACTION_POLICY: &str = "strata.compaction.policy";
pub const COMPACTION_FANOUT: &str = "strata.compaction.fanout";
pub const COMPACTION_MAX_SEGMENT_BYTES: &str = "strata.compaction.max.segment.bytes";

pub const TOPIC_CONFIGS: &[ConfigDef] = &[
    ConfigDef {
        name: CLEANUP_POLICY,
        default: "delete",
        kind: ConfigType::List,
        doc: "delete, compact, or both",
    },
    ConfigDef {
        name: RETENTION_MS,
        default: "604800000",
        kind: ConfigType::Long,
        doc: "Age after which data may be deleted; -1 keeps forever",
    },
    ConfigDef {
        name: RETENTION_BYTES,
        default: "-1",
        kind: ConfigType::Long,
        doc: "Partition size beyond which old data may be deleted; -1 for no limit",
    },
    ConfigDef {
        name: SEGMENT_BYTES,
        default: "1073741824",
        kind: ConfigType::Int,
        doc: "Size at which the active segment rolls",
    },
    ConfigDef {
        name: SEGMENT_MS,
        default: "604800000",
        kind: ConfigType::Long,
        doc: "Age at which the active segment rolls",
    },
    ConfigDef {
        name: MAX_MESSAGE_BYTES,
        default: "1048588",
        kind: ConfigType::Int,
        doc: "Largest record batch accepted",
    },
    ConfigDef {
        name: MESSAGE_TIMESTAMP_TYPE,
        default: "CreateTime",
        kind: ConfigType::String,
        doc: "CreateTime or LogAppendTime",
    },
    ConfigDef {
        name: MIN_COMPACTION_LAG_MS,
        default: "0",
        kind: ConfigType::Long,
        doc: "Minimum age before a record may be compacted",
    },
    ConfigDef {
        name: MAX_COMPACTION_LAG_MS,
        default: "9223372036854775807",
        kind: ConfigType::Long,
        doc: "Maximum age before a record becomes eligible for compaction",
    },
    ConfigDef {
        name: DELETE_RETENTION_MS,
        default: "86400000",
        kind: ConfigType::Long,
        doc: "How long tombstones are retained",
    },
    ConfigDef {
        name: MIN_INSYNC_REPLICAS,
        default: "1",
        kind: ConfigType::Int,
        doc: "Replicas that must acknowledge acks=all writes (one broker: 1)",
    },
    ConfigDef {
        name: COMPACTION_POLICY,
        default: "leveled",
        kind: ConfigType::String,
        doc: "Strata: how sealed segments are merged: leveled, or none",
    },
    ConfigDef {
        name: COMPACTION_FANOUT,
        default: "4",
        kind: ConfigType::Int,
        doc: "Strata: contiguous segments of one level that merge into one of the next level",
    },
    ConfigDef {
        name: COMPACTION_MAX_SEGMENT_BYTES,
        default: "2147483648",
        kind: ConfigType::Long,
        doc: "Strata: merges whose sources add up to more than this are not scheduled",
    },
];

pub fn definition(name: &str) -> Option<&'static ConfigDef> {
    TOPIC_CONFIGS.iter().find(|d| d.name == name)
}

/// Checks a value for a named config; the error says why, in Kafka's words.
pub fn validate(name: &str, value: &str) -> Result<(), String> {
    let def = definition(name).ok_or_else(|| format!("Unknown topic config name: {name}"))?;
    let bad = || format!("Invalid value {value} for configuration {name}");
    match def.kind {
        ConfigType::Int => {
            let v: i32 = value.trim().parse().map_err(|_| bad())?;
            let min = match name {
                SEGMENT_BYTES => 14,
                MAX_MESSAGE_BYTES => 0,
                MIN_INSYNC_REPLICAS => 1,
                COMPACTION_FANOUT => 2,
                _ => i32::MIN,
            };
            if v < min {
                return Err(format!("{}: Value must be at least {min}", bad()));
            }
        }
        ConfigType::Long => {
            let v: i64 = value.trim().parse().map_err(|_| bad())?;
            let min = match name {
                RETENTION_MS | RETENTION_BYTES => -1,
                SEGMENT_MS | COMPACTION_MAX_SEGMENT_BYTES => 1,
                _ => 0,
            };
            if v < min {
                return Err(format!("{}: Value must be at least {min}", bad()));
            }
            // Merged segments keep byte positions in 32 bits.
            if name == COMPACTION_MAX_SEGMENT_BYTES && v > u32::MAX as i64 {
                return Err(format!("{}: Value must be at most {}", bad(), u32::MAX));
            }
        }
        ConfigType::List => {
            let parts: Vec<&str> = value.split(',').map(str::trim).collect();
            if parts.is_empty() || parts.iter().any(|p| *p != "delete" && *p != "compact") {
                return Err(format!("{}: must be a list of delete and compact", bad()));
            }
        }
        ConfigType::String => {
            if name == MESSAGE_TIMESTAMP_TYPE && value != "CreateTime" && value != "LogAppendTime" {
                return Err(format!("{}: must be CreateTime or LogAppendTime", bad()));
            }
            if name == COMPACTION_POLICY && value != "leveled" && value != "none" {
                return Err(format!("{}: must be leveled or none", bad()));
            }
        }
        ConfigType::Boolean => {
            value.parse::<bool>().map_err(|_| bad())?;
        }
    }
    Ok(())
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
                definition(name).ok_or_else(|| format!("Unknown topic config name: {name}"))?;
                self.overrides.remove(name);
            }
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

    pub fn segment_bytes(&self) -> u64 {
        self.number(SEGMENT_BYTES).max(14) as u64
    }
    pub fn segment_ms(&self) -> i64 {
        self.number(SEGMENT_MS).max(1)
    }
    pub fn max_message_bytes(&self) -> usize {
        self.number(MAX_MESSAGE_BYTES).max(0) as usize
    }
    /// `cleanup.policy` includes `compact`.
    pub fn compact(&self) -> bool {
        self.get(CLEANUP_POLICY)
            .is_some_and(|(v, _)| v.split(',').any(|p| p.trim() == "compact"))
    }
    pub fn min_compaction_lag_ms(&self) -> i64 {
        self.number(MIN_COMPACTION_LAG_MS).max(0)
    }
    pub fn max_compaction_lag_ms(&self) -> i64 {
        self.number(MAX_COMPACTION_LAG_MS).max(0)
    }
    pub fn delete_retention_ms(&self) -> i64 {
        self.number(DELETE_RETENTION_MS).max(0)
    }
    pub fn compaction_policy(&self) -> &str {
        self.get(COMPACTION_POLICY).map_or("leveled", |(v, _)| v)
    }
    pub fn compaction_fanout(&self) -> usize {
        self.number(COMPACTION_FANOUT).max(2) as usize
    }
    pub fn compaction_max_segment_bytes(&self) -> u64 {
        self.number(COMPACTION_MAX_SEGMENT_BYTES)
            .clamp(1, u32::MAX as i64) as u64
    }
    pub fn log_append_time(&self) -> bool {
        self.get(MESSAGE_TIMESTAMP_TYPE)
            .is_some_and(|(v, _)| v == "LogAppendTime")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validates_kafka_names_and_values() {
        assert!(validate("cleanup.policy", "compact,delete").is_ok());
        assert!(validate("cleanup.policy", "shred").is_err());
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
    fn overrides_shadow_defaults() {
        let mut c = TopicConfig::default();
        assert_eq!(c.get("retention.ms"), Some(("604800000", false)));
        c.set("retention.ms", Some("5")).unwrap();
        assert_eq!(c.get("retention.ms"), Some(("5", true)));
        c.set("retention.ms", None).unwrap();
        assert_eq!(c.get("retention.ms"), Some(("604800000", false)));
    }
}
