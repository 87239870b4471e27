//! What the deterministic simulations share: a seeded generator, the seeds
//! to run (`SIM_SEED`, `SIM_SEEDS`, `SIM_FIRST_SEED`), a runtime on tokio's
//! paused clock, and a runner that spreads seeds over every core.

use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

/// splitmix64: small, fast, and the same everywhere.
#[derive(Clone)]
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }
    pub fn pick<T: Copy>(&mut self, from: &[T]) -> Option<T> {
        (!from.is_empty()).then(|| from[self.below(from.len() as u64) as usize])
    }
}

pub fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|_| panic!("{name}: not a number")))
}

/// `SIM_SEED` alone, or `SIM_SEEDS` seeds (`default` unless set) from
/// `SIM_FIRST_SEED` (1 unless set).
pub fn seeds(default: u64) -> Vec<u64> {
    match env_u64("SIM_SEED") {
        Some(seed) => vec![seed],
        None => {
            let first = env_u64("SIM_FIRST_SEED").unwrap_or(1);
            (first..first + env_u64("SIM_SEEDS").unwrap_or(default)).collect()
        }
    }
}

/// A single-threaded runtime whose clock only moves when every task waits,
/// so that a seed decides everything.
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .unwrap()
}

/// Runs `simulate` for every seed, one thread per core, and returns the
/// outcomes `failed` picks out, by seed.
pub fn run_seeds<O: Send>(
    seeds: &[u64],
    simulate: impl Fn(u64) -> O + Sync,
    failed: impl Fn(&O) -> bool + Sync,
) -> Vec<(u64, O)> {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    let next = AtomicUsize::new(0);
    let failing = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { return };
                let outcome = simulate(seed);
                if failed(&outcome) {
                    failing.lock().push((seed, outcome));
                }
            });
        }
    });
    let mut failing = failing.into_inner();
    failing.sort_by_key(|(seed, _)| *seed);
    failing
}

/// Checks that two runs of `seed` did the same: the same lines, once sorted
/// (tokio's watch channels wake tasks waiting at one instant in a random
/// order). `SIM_DUMP=dir` writes both traces there.
pub fn assert_same_runs(seed: u64, name: &str, mut a: Vec<String>, mut b: Vec<String>) {
    a.sort();
    b.sort();
    if let Some(dir) = std::env::var_os("SIM_DUMP") {
        for (run, trace) in [("first", &a), ("second", &b)] {
            let path = std::path::PathBuf::from(&dir).join(format!("{name}-{seed}-{run}.txt"));
            std::fs::write(path, trace.join("\n")).unwrap();
        }
    }
    let first_difference = a.iter().zip(&b).position(|(x, y)| x != y);
    assert!(
        first_difference.is_none() && a.len() == b.len(),
        "seed {seed} ran differently the second time, from line {first_difference:?}:\n{:?}\n{:?}",
        first_difference.map(|i| &a[i]),
        first_difference.map(|i| &b[i]),
    );
}

/// Fails with the anomalies and the trace of `seed`, if it had any.
pub fn assert_no_anomalies(seed: u64, anomalies: &[String], trace: &[String]) {
    assert!(
        anomalies.is_empty(),
        "seed {seed}:\n  {}\n\ntrace:\n{}",
        anomalies.join("\n  "),
        trace.join("\n")
    );
}
