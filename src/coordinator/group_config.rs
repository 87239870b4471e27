//! Group configs (KIP-848's dynamic group configs, the GROUP config
//! resource): per-group overrides of the broker's `group.consumer.*`,
//! `group.share.*` and `group.streams.*` settings, under Kafka 4.4's names
//! and with its checks.
//!
//! Overrides are plain name/value maps here, kept by group id. Where they
//! are stored (the catalog, or etcd in a cluster) is the API layer's
//! business; it hands every change to [`GroupConfigs`], which the
//! coordinator reads each time it answers a heartbeat or expires a session.
//! The consumer and streams configs take effect on the next heartbeat. The
//! share configs are kept and described for the share group protocol, which
//! this broker does not serve yet.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::Duration;

use parking_lot::RwLock;

use super::consumer::ConsumerGroupConfig;
use super::streams::StreamsGroupConfig;
use crate::catalog::config::{check, def, list_items, ConfigDef, ConfigType, Valid};

pub(crate) type Configs = BTreeMap<String, String>;

pub(crate) const CONSUMER_SESSION_TIMEOUT_MS: &str = "consumer.session.timeout.ms";
pub(crate) const CONSUMER_HEARTBEAT_INTERVAL_MS: &str = "consumer.heartbeat.interval.ms";
const RACK_TAGS: &str = "streams.rack.aware.assignment.tags";

/// One group config: its definition (the default is Kafka's broker
/// default) and the range Kafka's broker settings allow it.
pub(crate) struct GroupConfigDef {
    pub def: ConfigDef,
    range: Option<(i64, i64)>,
}

const fn group(
    name: &'static str,
    default: &'static str,
    kind: ConfigType,
    range: Option<(i64, i64)>,
    broker: Option<&'static str>,
    doc: &'static str,
) -> GroupConfigDef {
    let valid = match kind {
        ConfigType::Int => Valid::AtLeast(0),
        _ => Valid::Any,
    };
    GroupConfigDef {
        def: def(name, default, kind, valid, broker, doc),
        range,
    }
}

const fn one_of(
    name: &'static str,
    default: &'static str,
    allowed: &'static [&'static str],
    doc: &'static str,
) -> GroupConfigDef {
    GroupConfigDef {
        def: def(
            name,
            default,
            ConfigType::String,
            Valid::OneOf(allowed),
            None,
            doc,
        ),
        range: None,
    }
}

use ConfigType::{Boolean, Int, List, String as Str};

/// Kafka 4.4's public group configs (GroupConfig), with the default and
/// the min/max broker settings of a broker that leaves them at Kafka's.
pub(crate) const GROUP_CONFIGS: &[GroupConfigDef] = &[
    group(
        CONSUMER_SESSION_TIMEOUT_MS,
        "45000",
        Int,
        Some((45000, 60000)),
        Some("group.consumer.session.timeout.ms"),
        "The timeout to detect client failures when using the consumer group protocol.",
    ),
    group(
        CONSUMER_HEARTBEAT_INTERVAL_MS,
        "5000",
        Int,
        Some((5000, 15000)),
        Some("group.consumer.heartbeat.interval.ms"),
        "The heartbeat interval given to the members of a consumer group.",
    ),
    group(
        "consumer.assignment.interval.ms",
        "1000",
        Int,
        Some((0, 15000)),
        Some("group.consumer.assignment.interval.ms"),
        "The interval between assignment updates for a consumer group.",
    ),
    group(
        "share.session.timeout.ms",
        "45000",
        Int,
        Some((45000, 60000)),
        Some("group.share.session.timeout.ms"),
        "The timeout to detect client failures when using the share group protocol.",
    ),
    group(
        "share.heartbeat.interval.ms",
        "5000",
        Int,
        Some((5000, 15000)),
        Some("group.share.heartbeat.interval.ms"),
        "The heartbeat interval given to the members of a share group.",
    ),
    group(
        "share.record.lock.duration.ms",
        "30000",
        Int,
        Some((15000, 60000)),
        Some("group.share.record.lock.duration.ms"),
        "The record acquisition lock duration in milliseconds for share groups.",
    ),
    group(
        "share.delivery.count.limit",
        "5",
        Int,
        Some((2, 10)),
        Some("group.share.delivery.count.limit"),
        "The maximum number of delivery attempts for a record delivered to a share group.",
    ),
    group(
        "share.partition.max.record.locks",
        "2000",
        Int,
        Some((100, 4000)),
        Some("group.share.partition.max.record.locks"),
        "Share-group record lock limit per share-partition.",
    ),
    group(
        "share.auto.offset.reset",
        "latest",
        Str,
        None,
        None,
        "The strategy to initialize the share-partition start offset: earliest, latest, or \
         by_duration:<ISO8601 duration>.",
    ),
    one_of(
        "share.isolation.level",
        "read_uncommitted",
        &["read_committed", "read_uncommitted"],
        "Controls how to read records written transactionally.",
    ),
    group(
        "share.renew.acknowledge.enable",
        "true",
        Boolean,
        None,
        None,
        "Whether the renew acknowledge type is enabled for the share group.",
    ),
    group(
        "share.assignment.interval.ms",
        "1000",
        Int,
        Some((0, 15000)),
        Some("group.share.assignment.interval.ms"),
        "The interval between assignment updates for a share group.",
    ),
    group(
        "streams.session.timeout.ms",
        "45000",
        Int,
        Some((45000, 60000)),
        Some("group.streams.session.timeout.ms"),
        "The timeout to detect client failures when using the streams group protocol.",
    ),
    group(
        "streams.heartbeat.interval.ms",
        "5000",
        Int,
        Some((5000, 15000)),
        Some("group.streams.heartbeat.interval.ms"),
        "The heartbeat interval given to the members.",
    ),
    group(
        "streams.num.standby.replicas",
        "0",
        Int,
        Some((0, 2)),
        Some("group.streams.num.standby.replicas"),
        "The number of standby replicas for each task.",
    ),
    group(
        "streams.initial.rebalance.delay.ms",
        "3000",
        Int,
        None,
        Some("group.streams.initial.rebalance.delay.ms"),
        "The amount of time the group coordinator will wait for more streams clients to join \
         a new group before performing the first rebalance.",
    ),
    group(
        "streams.assignment.interval.ms",
        "1000",
        Int,
        Some((0, 15000)),
        Some("group.streams.assignment.interval.ms"),
        "The interval between assignment updates for a streams group.",
    ),
    group(
        RACK_TAGS,
        "",
        List,
        None,
        Some("group.streams.rack.aware.assignment.tags"),
        "List of client tag keys used to distribute standby replicas across Kafka Streams \
         instances.",
    ),
    group(
        "errors.deadletterqueue.topic.name",
        "",
        Str,
        None,
        None,
        "The name of the topic to be used as the dead-letter queue (DLQ) topic for this share \
         group. If blank (the default), the group does not have a DLQ topic.",
    ),
    group(
        "errors.deadletterqueue.copy.record.enable",
        "false",
        Boolean,
        None,
        None,
        "When writing onto the dead-letter queue topic, whether to copy the original record \
         onto the DLQ topic, or just write a record containing the context information headers.",
    ),
];

/// Group configs whose bounds are broker configs, as Kafka's
/// group.share.{min,max}.record.lock.duration.ms; `range` holds their
/// defaults.
const BROKER_BOUNDS: &[(&str, &str, &str)] = &[(
    "share.record.lock.duration.ms",
    "group.share.min.record.lock.duration.ms",
    "group.share.max.record.lock.duration.ms",
)];

pub(crate) fn group_config(name: &str) -> Option<&'static GroupConfigDef> {
    GROUP_CONFIGS.iter().find(|d| d.def.name == name)
}

/// Kafka's checks (GroupConfig.validate) of the overrides a group would
/// have: known names, values of the right type within the broker's bounds,
/// sessions longer than heartbeats. `defaults` gives the broker's value of
/// a config the group does not override, and of a broker config by its own
/// name (the bounds above). The error is Kafka's message.
pub(crate) fn validate(configs: &Configs, defaults: impl Fn(&str) -> String) -> Result<(), String> {
    for (name, value) in configs {
        let d = group_config(name).ok_or_else(|| format!("Unknown group config name: {name}"))?;
        check(&d.def, value)?;
        let range =
            d.range.map(
                |(min, max)| match BROKER_BOUNDS.iter().find(|(n, _, _)| n == name) {
                    Some((_, lo, hi)) => (
                        defaults(lo).parse().unwrap_or(min),
                        defaults(hi).parse().unwrap_or(max),
                    ),
                    None => (min, max),
                },
            );
        if let (Some((min, max)), Ok(n)) = (range, value.trim().parse::<i64>()) {
            if n < min || n > max {
                return Err(format!(
                    "{name} must be in the range {min} to {max} inclusive."
                ));
            }
        }
    }
    if let Some(tags) = configs.get(RACK_TAGS) {
        let items = list_items(tags);
        let unique: std::collections::HashSet<&&str> = items.iter().collect();
        if unique.len() != items.len() {
            return Err(format!("{RACK_TAGS} must not contain duplicate tag keys."));
        }
    }
    if let Some(reset) = configs.get("share.auto.offset.reset") {
        check_auto_offset_reset(reset)?;
    }
    if let Some(topic) = configs
        .get("errors.deadletterqueue.topic.name")
        .filter(|t| t.starts_with("__"))
    {
        return Err(format!(
            "errors.deadletterqueue.topic.name: DLQ topic name must not start with '__' ({topic})"
        ));
    }
    for kind in ["consumer", "share", "streams"] {
        let (session, heartbeat) = (
            format!("{kind}.session.timeout.ms"),
            format!("{kind}.heartbeat.interval.ms"),
        );
        if !configs.contains_key(&session) && !configs.contains_key(&heartbeat) {
            continue;
        }
        let value = |name: &str| {
            configs
                .get(name)
                .cloned()
                .unwrap_or_else(|| defaults(name))
                .trim()
                .parse::<i64>()
                .unwrap_or_default()
        };
        if value(&session) <= value(&heartbeat) {
            return Err(format!("{session} must be greater than {heartbeat}"));
        }
    }
    Ok(())
}

/// `latest`, `earliest` or `by_duration:` and a non-negative ISO 8601
/// duration (`PnDTnHnMn.nS`), as Kafka's ShareGroupAutoOffsetResetStrategy.
fn check_auto_offset_reset(value: &str) -> Result<(), String> {
    let why = |reason: &str| {
        format!("Invalid value {value} for configuration share.auto.offset.reset: {reason}")
    };
    match value.trim() {
        "latest" | "earliest" => Ok(()),
        v => match v.strip_prefix("by_duration:") {
            Some(d) if iso_duration(d.trim()).is_some() => Ok(()),
            Some(_) => Err(why("Invalid ISO8601 format or negative duration")),
            None => Err(why("Invalid value")),
        },
    }
}

/// A non-negative `PnDTnHnMn.nS` duration, as java.time.Duration parses it.
pub(crate) fn iso_duration(d: &str) -> Option<std::time::Duration> {
    let rest = d.strip_prefix('P').or_else(|| d.strip_prefix('p'))?;
    let (days, time) = match rest.split_once(['T', 't']) {
        Some((days, time)) => (days, Some(time)),
        None => (rest, None),
    };
    let mut any = false;
    let mut seconds = 0f64;
    let mut part = |s: &str, units: &[(char, f64)]| -> bool {
        let mut s = s;
        let mut at = 0;
        while !s.is_empty() {
            let Some(end) = s.find(|c: char| c.is_ascii_alphabetic()) else {
                return false;
            };
            let (number, unit) = (&s[..end], s[end..].chars().next().expect("found"));
            let Some(i) = units
                .iter()
                .position(|(u, _)| u.eq_ignore_ascii_case(&unit))
                .filter(|i| *i >= at)
            else {
                return false;
            };
            let value = match unit.eq_ignore_ascii_case(&'S') {
                true => number.parse::<f64>().ok().filter(|n| *n >= 0.0),
                false => number.parse::<u64>().ok().map(|n| n as f64),
            };
            let Some(value) = value.filter(|_| !number.starts_with('+')) else {
                return false;
            };
            seconds += value * units[i].1;
            any = true;
            at = i + 1;
            s = &s[end + 1..];
        }
        true
    };
    let valid = part(days, &[('D', 86_400.0)])
        && time.is_none_or(|t| !t.is_empty() && part(t, &[('H', 3600.0), ('M', 60.0), ('S', 1.0)]))
        && any;
    valid.then(|| std::time::Duration::from_secs_f64(seconds))
}

/// Every group's overrides, as last stored.
#[derive(Default)]
pub(crate) struct GroupConfigs(RwLock<BTreeMap<String, Configs>>);

impl GroupConfigs {
    pub(crate) fn get(&self, group: &str) -> Configs {
        self.0.read().get(group).cloned().unwrap_or_default()
    }

    pub(crate) fn all(&self) -> BTreeMap<String, Configs> {
        self.0.read().clone()
    }

    pub(crate) fn set(&self, group: &str, configs: Configs) {
        let mut all = self.0.write();
        if configs.is_empty() {
            all.remove(group);
        } else {
            all.insert(group.to_string(), configs);
        }
    }

    pub(crate) fn replace(&self, all: BTreeMap<String, Configs>) {
        *self.0.write() = all;
    }

    /// The consumer-protocol settings of `group`: the broker's, with the
    /// group's overrides of the session timeout and heartbeat interval.
    pub(crate) fn consumer<'a>(
        &self,
        group: &str,
        broker: &'a ConsumerGroupConfig,
    ) -> Cow<'a, ConsumerGroupConfig> {
        let all = self.0.read();
        let Some(configs) = all.get(group) else {
            return Cow::Borrowed(broker);
        };
        let ms = |name: &str| {
            configs
                .get(name)
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_millis)
        };
        let mut cfg = broker.clone();
        if let Some(d) = ms(CONSUMER_SESSION_TIMEOUT_MS) {
            cfg.session_timeout = d;
        }
        if let Some(d) = ms(CONSUMER_HEARTBEAT_INTERVAL_MS) {
            cfg.heartbeat_interval = d;
        }
        Cow::Owned(cfg)
    }

    /// The broker's share group settings with the group's overrides.
    pub(crate) fn share(
        &self,
        group: &str,
        broker: &super::share_group::ShareGroupConfig,
    ) -> super::share_group::ShareGroupConfig {
        let mut cfg = broker.clone();
        let all = self.0.read();
        let Some(configs) = all.get(group) else {
            return cfg;
        };
        let num = |name: &str| configs.get(name).and_then(|v| v.trim().parse::<u64>().ok());
        if let Some(v) = num("share.session.timeout.ms") {
            cfg.session_timeout = Duration::from_millis(v);
        }
        if let Some(v) = num("share.heartbeat.interval.ms") {
            cfg.heartbeat_interval = Duration::from_millis(v);
        }
        let p = &mut cfg.partition;
        if let Some(v) = num("share.record.lock.duration.ms") {
            p.lock_duration = Duration::from_millis(v);
        }
        if let Some(v) = num("share.delivery.count.limit") {
            p.delivery_count_limit = v.clamp(1, i16::MAX as u64) as i16;
        }
        if let Some(v) = num("share.partition.max.record.locks") {
            p.max_in_flight = v.max(1) as i64;
        }
        if let Some(v) = configs.get("share.renew.acknowledge.enable") {
            p.renew_enabled = v.trim() == "true";
        }
        if let Some(v) = configs.get("share.isolation.level") {
            p.read_committed = v.trim() == "read_committed";
        }
        cfg
    }

    /// The broker's streams group settings with the group's overrides.
    pub(crate) fn streams<'a>(
        &self,
        group: &str,
        broker: &'a StreamsGroupConfig,
    ) -> Cow<'a, StreamsGroupConfig> {
        let all = self.0.read();
        let Some(configs) = all.get(group) else {
            return Cow::Borrowed(broker);
        };
        let num = |name: &str| configs.get(name).and_then(|v| v.trim().parse::<u64>().ok());
        let mut cfg = broker.clone();
        if let Some(v) = num("streams.session.timeout.ms") {
            cfg.session_timeout = Duration::from_millis(v);
        }
        if let Some(v) = num("streams.heartbeat.interval.ms") {
            cfg.heartbeat_interval = Duration::from_millis(v);
        }
        if let Some(v) = num("streams.num.standby.replicas") {
            cfg.num_standby_replicas = v as u32;
        }
        if let Some(v) = num("streams.initial.rebalance.delay.ms") {
            cfg.initial_rebalance_delay = Duration::from_millis(v);
        }
        if let Some(v) = num("streams.assignment.interval.ms") {
            cfg.assignment_interval = Duration::from_millis(v);
        }
        Cow::Owned(cfg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn configs(pairs: &[(&str, &str)]) -> Configs {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn defaults(name: &str) -> String {
        group_config(name).map_or(String::new(), |d| d.def.default.to_string())
    }

    #[test]
    fn values_outside_the_broker_bounds_are_refused_in_kafkas_words() {
        let err = validate(&configs(&[(CONSUMER_SESSION_TIMEOUT_MS, "1000")]), defaults);
        assert_eq!(
            err.unwrap_err(),
            "consumer.session.timeout.ms must be in the range 45000 to 60000 inclusive."
        );
        assert!(validate(
            &configs(&[(CONSUMER_SESSION_TIMEOUT_MS, "50000")]),
            defaults
        )
        .is_ok());
        let err = validate(&configs(&[("consumer.nope", "1")]), defaults).unwrap_err();
        assert_eq!(err, "Unknown group config name: consumer.nope");
        let err = validate(&configs(&[("share.delivery.count.limit", "x")]), defaults);
        assert!(err.unwrap_err().ends_with("Not a number of type INT"));
    }

    #[test]
    fn the_lock_duration_bounds_are_the_brokers() {
        let c = configs(&[("share.record.lock.duration.ms", "3000")]);
        assert_eq!(
            validate(&c, defaults).unwrap_err(),
            "share.record.lock.duration.ms must be in the range 15000 to 60000 inclusive."
        );
        let short_locks = |n: &str| match n {
            "group.share.min.record.lock.duration.ms" => "1000".to_string(),
            n => defaults(n),
        };
        assert!(validate(&c, short_locks).is_ok());
    }

    #[test]
    fn a_session_must_outlast_the_heartbeat_interval() {
        let c = configs(&[
            ("share.session.timeout.ms", "45000"),
            ("share.heartbeat.interval.ms", "15000"),
        ]);
        assert!(validate(&c, defaults).is_ok());
        // A heartbeat override checked against the broker's session timeout.
        let c = configs(&[("streams.heartbeat.interval.ms", "15000")]);
        let long_heartbeats = |n: &str| match n {
            "streams.session.timeout.ms" => "15000".to_string(),
            n => defaults(n),
        };
        assert_eq!(
            validate(&c, long_heartbeats).unwrap_err(),
            "streams.session.timeout.ms must be greater than streams.heartbeat.interval.ms"
        );
    }

    #[test]
    fn an_iso_duration_is_read_as_java_reads_it() {
        let secs = |d: &str| iso_duration(d).map(|d| d.as_secs_f64());
        assert_eq!(secs("PT1H"), Some(3600.0));
        assert_eq!(secs("P1DT2H30M"), Some(86_400.0 + 9000.0));
        assert_eq!(secs("PT0.5S"), Some(0.5));
        assert_eq!(secs("PT2M1H"), None, "units out of order");
        assert_eq!(secs("P1H"), None, "hours before T");
    }

    #[test]
    fn share_auto_offset_reset_takes_a_non_negative_iso_duration() {
        for ok in [
            "latest",
            "earliest",
            "by_duration:PT1H",
            "by_duration:P1DT2H30M",
            "by_duration:PT0.5S",
        ] {
            assert!(check_auto_offset_reset(ok).is_ok(), "{ok}");
        }
        for bad in [
            "newest",
            "by_duration:",
            "by_duration:P",
            "by_duration:PT-1H",
            "by_duration:1H",
            "by_duration:PT",
        ] {
            assert!(check_auto_offset_reset(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_groups_overrides_replace_the_broker_consumer_settings() {
        let table = GroupConfigs::default();
        let broker = ConsumerGroupConfig::default();
        assert!(matches!(table.consumer("g", &broker), Cow::Borrowed(_)));
        table.set("g", configs(&[(CONSUMER_HEARTBEAT_INTERVAL_MS, "7000")]));
        let cfg = table.consumer("g", &broker);
        assert_eq!(cfg.heartbeat_interval, Duration::from_millis(7000));
        assert_eq!(cfg.session_timeout, broker.session_timeout);
        table.set("g", Configs::new());
        assert!(table.all().is_empty());
    }
}
