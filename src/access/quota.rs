//! Client quotas: Kafka's entities, which quota applies to a client, and
//! the byte-rate meters that turn a quota into a throttle time.
//!
//! A quota is set on a user, a client id, or both, each either named or the
//! default (`<default>`). A request from user U with client id C takes the
//! first of Kafka's eight candidates that has the quota key set, from
//! `user=U,client-id=C` down to `client-id=<default>`; the clients that
//! candidate covers share one meter (a quota on `user=U` limits all of U's
//! clients together). A meter counts bytes in one-second samples over the
//! last eleven (Kafka's `quota.window.num` × `quota.window.size.seconds`);
//! when the rate is over the quota, the throttle time is how long the
//! client must stay silent for its rate over the window to come back to
//! the quota: `(rate - quota) / quota × window`, as Kafka computes it.
//!
//! `request_percentage` is metered the same way in nanoseconds of the time
//! handlers spend computing responses (the time their futures are polled,
//! not the time they wait for disks or long polls): Kafka's request-handler
//! thread time, where 100% is one thread.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

pub(crate) const PRODUCER_BYTE_RATE: &str = "producer_byte_rate";
pub(crate) const CONSUMER_BYTE_RATE: &str = "consumer_byte_rate";
pub(crate) const REQUEST_PERCENTAGE: &str = "request_percentage";
/// The keys AlterClientQuotas accepts for user and client-id entities.
pub(crate) const KEYS: [&str; 3] = [PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE];
pub(crate) const USER: &str = "user";
pub(crate) const CLIENT_ID: &str = "client-id";

const SAMPLE_MS: u64 = 1000;
const SAMPLES: usize = 11;

/// Which clients a quota covers. Each part is absent (`None`), the default
/// (`Some(None)`) or a name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, Default)]
pub(crate) struct QuotaEntity {
    pub user: Option<Option<String>>,
    pub client_id: Option<Option<String>>,
}

impl QuotaEntity {
    /// The entity as DescribeClientQuotas lists it: `(type, name)`, `None` for the default.
    pub(crate) fn parts(&self) -> Vec<(&'static str, Option<String>)> {
        let mut v = Vec::new();
        if let Some(u) = &self.user {
            v.push((USER, u.clone()));
        }
        if let Some(c) = &self.client_id {
            v.push((CLIENT_ID, c.clone()));
        }
        v
    }
}

/// One entity's quota values, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct QuotaEntry {
    pub entity: QuotaEntity,
    pub values: BTreeMap<String, f64>,
}

/// The quota for `key` that applies to `(user, client_id)`, and the entity
/// whose clients share its meter (defaults replaced by the actual names).
pub(crate) fn resolve(
    entries: &[QuotaEntry],
    user: &str,
    client_id: &str,
    key: &str,
) -> Option<(f64, QuotaEntity)> {
    let named = |s: &str| Some(Some(s.to_string()));
    let default = Some(None);
    let candidates = [
        (named(user), named(client_id)),
        (named(user), default.clone()),
        (named(user), None),
        (default.clone(), named(client_id)),
        (default.clone(), default.clone()),
        (default.clone(), None),
        (None, named(client_id)),
        (None, default.clone()),
    ];
    candidates.into_iter().find_map(|(u, c)| {
        let entity = QuotaEntity {
            user: u,
            client_id: c,
        };
        let value = entries
            .iter()
            .find(|e| e.entity == entity)
            .and_then(|e| e.values.get(key))?;
        let shared = QuotaEntity {
            user: entity.user.as_ref().map(|_| Some(user.to_string())),
            client_id: entity
                .client_id
                .as_ref()
                .map(|_| Some(client_id.to_string())),
        };
        Some((*value, shared))
    })
}

/// A byte count over the last [`SAMPLES`] one-second samples.
#[derive(Debug, Default)]
struct Meter {
    /// (sample start in ms, bytes), oldest first.
    samples: VecDeque<(u64, u64)>,
}

impl Meter {
    fn record(&mut self, now_ms: u64, bytes: u64) {
        let start = now_ms - now_ms % SAMPLE_MS;
        match self.samples.back_mut() {
            Some((s, b)) if *s == start => *b += bytes,
            _ => self.samples.push_back((start, bytes)),
        }
        let oldest = start.saturating_sub(SAMPLE_MS * (SAMPLES as u64 - 1));
        while self.samples.front().is_some_and(|(s, _)| *s < oldest) {
            self.samples.pop_front();
        }
    }

    /// Bytes per second over the window. Like Kafka, a window younger than
    /// all its samples but one still counts as that long, so that the first
    /// burst of a new client is not measured over a few milliseconds.
    fn rate(&self, now_ms: u64) -> f64 {
        let total: u64 = self.samples.iter().map(|(_, b)| b).sum();
        let first = self.samples.front().map_or(now_ms, |(s, _)| *s);
        let elapsed = (now_ms - first).max(SAMPLE_MS * (SAMPLES as u64 - 1));
        total as f64 * 1000.0 / elapsed as f64
    }

    fn window_ms(&self, now_ms: u64) -> u64 {
        let first = self.samples.front().map_or(now_ms, |(s, _)| *s);
        (now_ms - first).max(SAMPLE_MS * (SAMPLES as u64 - 1))
    }
}

/// What a meter counts: bytes produced, bytes fetched, or the time spent
/// handling requests. Each has its own quota key and meters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Direction {
    Produce,
    Fetch,
    /// Nanoseconds of handler time (a fast handler takes well under a microsecond).
    Request,
}

impl Direction {
    pub(crate) fn key(self) -> &'static str {
        match self {
            Direction::Produce => PRODUCER_BYTE_RATE,
            Direction::Fetch => CONSUMER_BYTE_RATE,
            Direction::Request => REQUEST_PERCENTAGE,
        }
    }

    /// One unit of the quota in what the meter counts per second: a byte for
    /// the byte rates; for `request_percentage`, where 100 is one thread
    /// busy all the time, ten million nanoseconds.
    fn scale(self) -> f64 {
        match self {
            Direction::Request => 10_000_000.0,
            Direction::Produce | Direction::Fetch => 1.0,
        }
    }
}

/// Every meter of the broker, by direction and the entity that shares it.
#[derive(Default)]
pub(crate) struct Meters {
    meters: Mutex<HashMap<(Direction, QuotaEntity), Meter>>,
}

impl Meters {
    /// Records `amount` against the meter `quota` names and returns how long
    /// the client must now be throttled (zero under the quota).
    pub(crate) fn record(
        &self,
        direction: Direction,
        quota: (f64, QuotaEntity),
        amount: u64,
        now_ms: u64,
    ) -> Duration {
        let (limit, entity) = quota;
        let limit = limit * direction.scale();
        let mut meters = self.meters.lock();
        let meter = meters.entry((direction, entity)).or_default();
        meter.record(now_ms, amount);
        throttle(meter.rate(now_ms), limit, meter.window_ms(now_ms))
    }
}

/// Kafka's `(rate - quota) / quota × window`, zero at or under the quota.
fn throttle(rate: f64, limit: f64, window_ms: u64) -> Duration {
    if limit <= 0.0 {
        return Duration::from_millis(window_ms);
    }
    if rate <= limit {
        return Duration::ZERO;
    }
    Duration::from_millis(((rate - limit) / limit * window_ms as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(user: Option<Option<&str>>, client: Option<Option<&str>>, rate: f64) -> QuotaEntry {
        let own = |o: Option<Option<&str>>| o.map(|n| n.map(str::to_string));
        QuotaEntry {
            entity: QuotaEntity {
                user: own(user),
                client_id: own(client),
            },
            values: [(PRODUCER_BYTE_RATE.to_string(), rate)].into(),
        }
    }

    #[test]
    fn the_most_specific_quota_applies_in_kafkas_order() {
        let entries = vec![
            entry(None, Some(None), 1.0),
            entry(None, Some(Some("c1")), 2.0),
            entry(Some(None), None, 3.0),
            entry(Some(Some("alice")), None, 4.0),
            entry(Some(Some("alice")), Some(Some("c1")), 5.0),
        ];
        let rate = |u, c| resolve(&entries, u, c, PRODUCER_BYTE_RATE).map(|(r, _)| r);
        assert_eq!(rate("alice", "c1"), Some(5.0));
        assert_eq!(rate("alice", "c2"), Some(4.0));
        assert_eq!(rate("bob", "c1"), Some(3.0));
        assert_eq!(
            resolve(&entries[..2], "bob", "c1", PRODUCER_BYTE_RATE)
                .unwrap()
                .0,
            2.0
        );
        assert_eq!(
            resolve(&entries[..2], "bob", "c9", PRODUCER_BYTE_RATE)
                .unwrap()
                .0,
            1.0
        );
        assert_eq!(resolve(&entries, "bob", "c1", CONSUMER_BYTE_RATE), None);
        // A user quota is shared by all of the user's clients.
        let (_, shared) = resolve(&entries, "alice", "c2", PRODUCER_BYTE_RATE).unwrap();
        assert_eq!(
            shared,
            QuotaEntity {
                user: Some(Some("alice".into())),
                client_id: None
            }
        );
    }

    #[test]
    fn a_client_over_its_quota_is_throttled_until_its_rate_is_back() {
        let meters = Meters::default();
        let q = || (1000.0, QuotaEntity::default());
        // 5 KB in the first second: 10 s window counted, 500 B/s, under 1000.
        assert_eq!(
            meters.record(Direction::Produce, q(), 5_000, 0),
            Duration::ZERO
        );
        // 20 KB more: 2500 B/s over a 10 s window → (2500-1000)/1000 × 10 s.
        let t = meters.record(Direction::Produce, q(), 20_000, 500);
        assert_eq!(t, Duration::from_millis(15_000));
        // Fetch has its own meter.
        assert_eq!(
            meters.record(Direction::Fetch, q(), 10, 600),
            Duration::ZERO
        );
    }

    #[test]
    fn request_percentage_meters_nanoseconds_of_handler_time() {
        let meters = Meters::default();
        let entity = QuotaEntity {
            user: None,
            client_id: Some(Some("c".into())),
        };
        // 1% of a thread is 10 ms a second: 100 ms over the ten-second
        // window a young meter counts as.
        let q = || (1.0, entity.clone());
        assert!(meters
            .record(Direction::Request, q(), 90_000_000, 0)
            .is_zero());
        let t = meters.record(Direction::Request, q(), 20_000_000, 1);
        // 110 ms against 100 ms allowed: 10% over, a tenth of the window.
        assert_eq!(t, Duration::from_millis(1000));
        // Bytes and time do not share meters.
        assert!(meters
            .record(Direction::Produce, (1000.0, entity.clone()), 100, 2)
            .is_zero());
    }
}
