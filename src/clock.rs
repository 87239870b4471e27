//! Time and randomness, injected.
//!
//! Timeouts are most of what a group coordinator does: sessions expire,
//! rebalances time out, offsets outlive their retention. Code that reads the
//! system clock itself can only be tested by sleeping, which makes tests slow
//! and flaky, and code that draws its own random ids cannot be replayed. So
//! whoever needs the time or a fresh id is handed a `Clock` or a `Random` at
//! construction: the broker builds the system ones once, tests build a
//! `ManualClock` that moves only when told to and a `SeededRandom` that
//! repeats itself.
//!
//! This is the one module that reads the system's (clippy.toml forbids the
//! calls everywhere else).
#![allow(clippy::disallowed_methods)]

use std::fmt::Debug;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use uuid::Uuid;

pub trait Clock: Send + Sync + Debug {
    /// Wall-clock milliseconds since the Unix epoch.
    fn now_ms(&self) -> i64;
    /// Monotonic time.
    fn now(&self) -> Instant;
}

pub type SharedClock = Arc<dyn Clock>;

/// The operating system's clocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> i64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or(0)
    }

    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests). Both readings move together.
#[derive(Debug)]
pub struct ManualClock {
    start_ms: i64,
    base: Instant,
    advanced: Mutex<Duration>,
}

impl ManualClock {
    pub fn new(start_ms: i64) -> Arc<ManualClock> {
        Arc::new(ManualClock {
            start_ms,
            base: Instant::now(),
            advanced: Mutex::new(Duration::ZERO),
        })
    }

    pub fn advance(&self, by: Duration) {
        *self.advanced.lock() += by;
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> i64 {
        self.start_ms + self.advanced.lock().as_millis() as i64
    }

    fn now(&self) -> Instant {
        self.base + *self.advanced.lock()
    }
}

pub trait Random: Send + Sync + Debug {
    fn uuid(&self) -> Uuid;
}

pub type SharedRandom = Arc<dyn Random>;

/// The operating system's randomness.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsRandom;

impl Random for OsRandom {
    fn uuid(&self) -> Uuid {
        Uuid::new_v4()
    }
}

/// Deterministic ids for tests: the same seed gives the same sequence.
#[derive(Debug)]
pub struct SeededRandom {
    state: Mutex<u64>,
}

impl SeededRandom {
    pub fn new(seed: u64) -> SeededRandom {
        SeededRandom {
            state: Mutex::new(seed),
        }
    }

    /// SplitMix64: well mixed for any seed, zero included.
    fn next_u64(&self) -> u64 {
        let mut state = self.state.lock();
        *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = *state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

impl Random for SeededRandom {
    fn uuid(&self) -> Uuid {
        let bits = (u128::from(self.next_u64()) << 64) | u128::from(self.next_u64());
        uuid::Builder::from_random_bytes(bits.to_be_bytes()).into_uuid()
    }
}

pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

pub fn os_random() -> SharedRandom {
    Arc::new(OsRandom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manual_clock_moves_both_readings_only_when_advanced() {
        let clock = ManualClock::new(1_000);
        let (ms, at) = (clock.now_ms(), clock.now());
        assert_eq!((clock.now_ms(), clock.now()), (ms, at));
        clock.advance(Duration::from_millis(250));
        assert_eq!(clock.now_ms(), 1_250);
        assert_eq!(clock.now() - at, Duration::from_millis(250));
    }

    #[test]
    fn seeded_random_repeats_its_sequence_and_ids_differ() {
        let (a, b) = (SeededRandom::new(7), SeededRandom::new(7));
        let first = a.uuid();
        assert_eq!(first, b.uuid());
        assert_ne!(first, a.uuid());
        assert_eq!(first.get_version_num(), 4);
    }
}
