//! Feature versions (KIP-584): cluster-wide switches with a level each,
//! which every broker reports in ApiVersions and an operator changes with
//! UpdateFeatures (`kafka-features.sh`).
//!
//! A client reads the finalized levels to pick what it may use: the Java
//! producer turns to transactions v2 once `transaction.version` reaches 2,
//! and a broker refuses the consumer rebalance protocol (KIP-848) while
//! `group.version` is 0. A level is only worth advertising if the broker
//! behaves differently at it, so the table below lists what Strata
//! implements, up to the level it implements. Kafka's KRaft features
//! (`metadata.version`, `kraft.version`) and the replication one
//! (`eligible.leader.replicas.version`) describe machinery Strata does not
//! have, and it does not report them.
//!
//! Levels are stored as the dynamic broker configs are (the catalog alone,
//! etcd in a cluster) with an epoch that grows with every change: clients
//! take the finalized levels of the highest epoch any broker reported, so a
//! change must come with a higher epoch to be seen. A feature nobody set is
//! at its default, Kafka 4.4's for a new cluster. An update is checked and
//! applied as Kafka's controller does it: every feature named, all or
//! nothing, and the first refusal (by feature name) is the answer.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;

use kafka_protocol::error::ResponseError;
use kafka_protocol::messages::api_versions_response::{FinalizedFeatureKey, SupportedFeatureKey};
use kafka_protocol::messages::update_features_response::UpdatableFeatureResult;
use kafka_protocol::messages::{
    ApiVersionsResponse, UpdateFeaturesRequest, UpdateFeaturesResponse,
};
use kafka_protocol::protocol::StrBytes;
use parking_lot::Mutex;

use super::authorize::{Resource, CLUSTER_DENIED};
use super::broker_configs::etcd_failure;
use super::dispatch::{api, Api, Ctx};
use super::metrics::error_codes;
use super::Broker;
use crate::access::acl::Operation;

pub(super) const UPDATE_FEATURES: Api = api!(
    UpdateFeaturesRequest,
    0..=2,
    later(update_features),
    acl(Operation::Alter, Resource::Cluster, |_| {
        UpdateFeaturesResponse::default().with_error_code(CLUSTER_DENIED)
    })
);

error_codes! {
    UpdateFeaturesResponse => |r, f| {
        f(r.error_code);
        r.results.iter().for_each(|x| f(x.error_code));
    };
}

/// The consumer rebalance protocol (KIP-848) is on from level 1.
pub(crate) const GROUP_VERSION: &str = "group.version";

/// A feature this broker implements: levels `0..=max`, `default` for a
/// cluster where nobody set it.
struct Feature {
    name: &'static str,
    max: i16,
    default: i16,
}

/// Transactions v2 (KIP-890 part 2) from level 2: clients end every
/// transaction with an epoch bump and add partitions by producing to them.
/// Level 1 asks nothing new of clients and behaves as 0 here; it is
/// offered because Kafka offers it.
pub(crate) const TRANSACTION_VERSION: &str = "transaction.version";

/// Kafka Streams' rebalance protocol (KIP-1071) from level 1.
pub(crate) const STREAMS_VERSION: &str = "streams.version";

/// Share groups (KIP-932) from level 1.
pub(crate) const SHARE_VERSION: &str = "share.version";

const FEATURES: &[Feature] = &[
    Feature {
        name: GROUP_VERSION,
        max: 1,
        default: 1,
    },
    Feature {
        name: TRANSACTION_VERSION,
        max: 2,
        default: 2,
    },
    Feature {
        name: STREAMS_VERSION,
        max: 1,
        default: 1,
    },
    Feature {
        name: SHARE_VERSION,
        max: 1,
        default: 1,
    },
];

/// Where the epoch is kept in the stored map, next to the levels; no
/// feature has this name.
const EPOCH_KEY: &str = "epoch";

/// The finalized levels, every implemented feature's, and their epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Finalized {
    epoch: i64,
    levels: BTreeMap<&'static str, i16>,
}

impl Finalized {
    /// From the stored map: a name it lacks is at its default, and a name
    /// or level this broker does not implement is ignored.
    fn from_stored(stored: &BTreeMap<String, String>) -> Finalized {
        let epoch = stored
            .get(EPOCH_KEY)
            .and_then(|e| e.parse().ok())
            .unwrap_or(0);
        let levels = FEATURES
            .iter()
            .map(|f| {
                let level = stored
                    .get(f.name)
                    .and_then(|l| l.parse().ok())
                    .filter(|l| (0..=f.max).contains(l))
                    .unwrap_or(f.default);
                (f.name, level)
            })
            .collect();
        Finalized { epoch, levels }
    }

    fn to_stored(&self) -> BTreeMap<String, String> {
        let mut stored: BTreeMap<String, String> = self
            .levels
            .iter()
            .map(|(name, level)| (name.to_string(), level.to_string()))
            .collect();
        stored.insert(EPOCH_KEY.to_string(), self.epoch.to_string());
        stored
    }

    pub(crate) fn level(&self, name: &str) -> i16 {
        self.levels.get(name).copied().unwrap_or(0)
    }
}

/// The levels in force on this broker.
pub(crate) struct Features {
    current: Mutex<Finalized>,
    /// One update at a time on a single node (etcd's compare-and-swap
    /// orders them in a cluster).
    altering: tokio::sync::Mutex<()>,
}

impl Features {
    pub(crate) fn new() -> Features {
        Features {
            current: Mutex::new(Finalized::from_stored(&BTreeMap::new())),
            altering: tokio::sync::Mutex::new(()),
        }
    }

    pub(crate) fn level(&self, name: &str) -> i16 {
        self.current.lock().level(name)
    }

    /// Takes `next` unless what is in force is newer.
    fn set(&self, next: Finalized) {
        let mut current = self.current.lock();
        if next.epoch >= current.epoch {
            *current = next;
        }
    }
}

/// Adds the supported and finalized features to an ApiVersions answer (the
/// fields exist from v3 on; older versions leave them out).
pub(super) fn advertise(broker: &Broker, resp: ApiVersionsResponse) -> ApiVersionsResponse {
    let finalized = broker.features.current.lock().clone();
    let name = |n: &str| StrBytes::from_string(n.to_string());
    resp.with_supported_features(
        FEATURES
            .iter()
            .map(|f| {
                SupportedFeatureKey::default()
                    .with_name(name(f.name))
                    .with_min_version(0)
                    .with_max_version(f.max)
            })
            .collect(),
    )
    .with_finalized_features_epoch(finalized.epoch)
    .with_finalized_features(
        finalized
            .levels
            .iter()
            .filter(|(_, level)| **level > 0)
            .map(|(n, level)| {
                FinalizedFeatureKey::default()
                    .with_name(name(n))
                    .with_min_version_level(*level)
                    .with_max_version_level(*level)
            })
            .collect(),
    )
}

/// Kafka's upgrade types (UpdateFeatures v1 on).
const UPGRADE: i8 = 1;
const SAFE_DOWNGRADE: i8 = 2;
const UNSAFE_DOWNGRADE: i8 = 3;

/// The levels `updates` (feature, level, upgrade type) make of `current`,
/// or the error of the first feature refused.
fn updated(
    current: &Finalized,
    updates: &BTreeMap<String, (i16, i8)>,
    node_id: i32,
) -> Result<Finalized, String> {
    let mut next = current.clone();
    for (name, &(level, upgrade)) in updates {
        let refuse =
            |why: String| format!("Invalid update version {level} for feature {name}. {why}");
        if ![UPGRADE, SAFE_DOWNGRADE, UNSAFE_DOWNGRADE].contains(&upgrade) {
            return Err(refuse(
                "The controller does not support the given upgrade type.".into(),
            ));
        }
        if level < 0 {
            return Err(refuse("A feature version cannot be less than 0.".into()));
        }
        let Some(feature) = FEATURES.iter().find(|f| f.name == name) else {
            return Err(refuse(format!(
                "Local controller {node_id} does not support this feature."
            )));
        };
        if level > feature.max {
            return Err(refuse(format!(
                "Local controller {node_id} only supports versions [0-{}]",
                feature.max
            )));
        }
        let now = current.level(name);
        if level < now && upgrade == UPGRADE {
            return Err(refuse(
                "Can't downgrade the version of this feature without setting the upgrade type to \
                 either safe or unsafe downgrade."
                    .into(),
            ));
        }
        if level > now && upgrade != UPGRADE {
            return Err(refuse("Can't downgrade to a newer version.".into()));
        }
        next.levels.insert(feature.name, level);
    }
    next.epoch = current.epoch + 1;
    Ok(next)
}

fn update_features(
    b: &Arc<Broker>,
    r: UpdateFeaturesRequest,
    cx: &Ctx<'_>,
) -> impl Future<Output = UpdateFeaturesResponse> + Send + 'static {
    let b = b.clone();
    let version = cx.version;
    async move {
        // Named twice, the last one counts (Kafka collects them in a map).
        let updates: BTreeMap<String, (i16, i8)> = r
            .feature_updates
            .iter()
            .map(|u| {
                let upgrade = match (version, u.allow_downgrade) {
                    (0, true) => SAFE_DOWNGRADE,
                    (0, false) => UPGRADE,
                    _ => u.upgrade_type,
                };
                (u.feature.to_string(), (u.max_version_level, upgrade))
            })
            .collect();
        match update(&b, &updates, r.validate_only).await {
            Ok(()) => UpdateFeaturesResponse::default().with_results(
                updates
                    .keys()
                    .map(|name| {
                        UpdatableFeatureResult::default()
                            .with_feature(StrBytes::from_string(name.clone()))
                    })
                    .collect(),
            ),
            Err((code, message)) => UpdateFeaturesResponse::default()
                .with_error_code(code)
                .with_error_message(Some(StrBytes::from_string(message))),
        }
    }
}

/// Checks `updates` against the stored levels and, unless `validate_only`,
/// stores and applies them.
async fn update(
    broker: &Broker,
    updates: &BTreeMap<String, (i16, i8)>,
    validate_only: bool,
) -> Result<(), (i16, String)> {
    let invalid = |message: String| (ResponseError::InvalidUpdateVersion.code(), message);
    let node_id = broker.settings.node_id;
    let next = match &broker.cluster {
        None => {
            let _one_at_a_time = broker.features.altering.lock().await;
            let stored = broker
                .catalog
                .features()
                .map_err(|e| (ResponseError::UnknownServerError.code(), e.to_string()))?;
            let next =
                updated(&Finalized::from_stored(&stored), updates, node_id).map_err(invalid)?;
            if validate_only {
                return Ok(());
            }
            broker
                .catalog
                .set_features(&next.to_stored())
                .map_err(|e| (ResponseError::UnknownServerError.code(), e.to_string()))?;
            next
        }
        Some(cluster) => {
            let store = cluster.features();
            let prepare = |stored: &BTreeMap<String, String>| {
                updated(&Finalized::from_stored(stored), updates, node_id).map(|n| n.to_stored())
            };
            if validate_only {
                let stored = store.get(STORED).await.map_err(etcd_failure)?;
                return prepare(&stored).map(|_| ()).map_err(invalid);
            }
            let stored = store
                .update(STORED, prepare)
                .await
                .map_err(etcd_failure)?
                .map_err(invalid)?;
            Finalized::from_stored(&stored)
        }
    };
    tracing::info!(levels = ?next.levels, epoch = next.epoch, "feature levels finalized");
    broker.features.set(next);
    Ok(())
}

/// The one resource of the cluster's feature store.
const STORED: &str = "finalized";

/// Reads the stored levels: at start-up and, in a cluster, every poll, to
/// follow changes made through other brokers.
pub(crate) async fn refresh(broker: &Broker) -> Result<(), String> {
    let stored = match &broker.cluster {
        None => broker.catalog.features().map_err(|e| e.to_string())?,
        Some(cluster) => cluster
            .features()
            .get(STORED)
            .await
            .map_err(|e| e.to_string())?,
    };
    broker.features.set(Finalized::from_stored(&stored));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn finalized(group_version: i16) -> Finalized {
        Finalized {
            epoch: 3,
            levels: BTreeMap::from([
                (GROUP_VERSION, group_version),
                (TRANSACTION_VERSION, 2),
                (STREAMS_VERSION, 1),
                (SHARE_VERSION, 1),
            ]),
        }
    }

    fn update(name: &str, level: i16, upgrade: i8) -> BTreeMap<String, (i16, i8)> {
        BTreeMap::from([(name.to_string(), (level, upgrade))])
    }

    #[test]
    fn a_new_cluster_has_kafkas_default_levels_at_epoch_zero() {
        let f = Finalized::from_stored(&BTreeMap::new());
        assert_eq!((f.epoch, f.level(GROUP_VERSION)), (0, 1));
        assert_eq!(f.level(TRANSACTION_VERSION), 2);
        assert_eq!(f.level(STREAMS_VERSION), 1);
        assert_eq!(f.level(SHARE_VERSION), 1);
    }

    #[test]
    fn stored_levels_round_trip_and_unknown_ones_are_ignored() {
        let f = finalized(0);
        assert_eq!(Finalized::from_stored(&f.to_stored()), f);
        let odd = BTreeMap::from([
            ("group.version".to_string(), "9".to_string()),
            ("metadata.version".to_string(), "27".to_string()),
        ]);
        assert_eq!(Finalized::from_stored(&odd).level(GROUP_VERSION), 1);
    }

    #[test]
    fn downgrades_need_a_downgrade_type_and_upgrades_forbid_one() {
        let at_one = finalized(1);
        let down = updated(&at_one, &update(GROUP_VERSION, 0, UPGRADE), 1).unwrap_err();
        assert!(down.contains("without setting the upgrade type"), "{down}");
        let next = updated(&at_one, &update(GROUP_VERSION, 0, SAFE_DOWNGRADE), 1).unwrap();
        assert_eq!((next.epoch, next.level(GROUP_VERSION)), (4, 0));
        let up = updated(&next, &update(GROUP_VERSION, 1, UNSAFE_DOWNGRADE), 1).unwrap_err();
        assert!(up.contains("Can't downgrade to a newer version."), "{up}");
        assert!(updated(&next, &update(GROUP_VERSION, 1, UPGRADE), 1).is_ok());
    }

    #[test]
    fn unknown_features_levels_and_upgrade_types_are_refused_with_kafkas_messages() {
        let f = finalized(1);
        let cases = [
            (update("metadata.version", 27, UPGRADE), "Invalid update version 27 for feature metadata.version. Local controller 7 does not support this feature."),
            (update(GROUP_VERSION, 2, UPGRADE), "Invalid update version 2 for feature group.version. Local controller 7 only supports versions [0-1]"),
            (update(GROUP_VERSION, -1, SAFE_DOWNGRADE), "Invalid update version -1 for feature group.version. A feature version cannot be less than 0."),
            (update(GROUP_VERSION, 1, 0), "Invalid update version 1 for feature group.version. The controller does not support the given upgrade type."),
        ];
        for (updates, message) in cases {
            assert_eq!(updated(&f, &updates, 7).unwrap_err(), message);
        }
    }

    #[test]
    fn one_refused_feature_refuses_the_whole_update() {
        let mut updates = update(GROUP_VERSION, 0, SAFE_DOWNGRADE);
        updates.insert(SHARE_VERSION.to_string(), (2, UPGRADE));
        assert!(updated(&finalized(1), &updates, 1).is_err());
    }

    #[test]
    fn an_older_epoch_does_not_replace_a_newer_one() {
        let features = Features::new();
        features.set(finalized(0));
        features.set(Finalized::from_stored(&BTreeMap::new()));
        assert_eq!(features.level(GROUP_VERSION), 0);
    }
}
