//! How many distinct keys a set of segments holds, without reading them.
//!
//! Kafka's cleaner runs when the dirty share of a log passes
//! `min.cleanable.dirty.ratio`. Leveled compaction needs the same figure for a
//! partition's tiered segments: the share of their records that a newer
//! record of the same key supersedes. A segment's key index counts its own
//! distinct keys exactly, but keys repeat across segments, and counting the
//! union would mean reading every index. Instead each segment carries a
//! HyperLogLog sketch of its key hashes (1,024 six-bit registers, about 3 %
//! standard error): the sketch of a union is the register-wise maximum, so
//! the policy estimates the distinct keys of any run of segments from their
//! manifest entries alone.
//!
//! The sketch is written with the segment's descriptor and manifest entry as
//! 1,024 characters, one per register (a register never exceeds 63, so one
//! base64-alphabet character holds it), and only for compacted topics.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

const P: u32 = 10;
const M: usize = 1 << P;
const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// A HyperLogLog sketch of key hashes.
#[derive(Clone, PartialEq, Eq)]
pub struct KeySketch {
    registers: Box<[u8; M]>,
}

impl Default for KeySketch {
    fn default() -> Self {
        KeySketch {
            registers: Box::new([0; M]),
        }
    }
}

impl std::fmt::Debug for KeySketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeySketch(~{:.0} keys)", self.estimate())
    }
}

impl KeySketch {
    /// Adds a key by its hash (`format::records::key_hash`).
    pub fn add(&mut self, hash: u128) {
        let h = hash as u64;
        let index = (h >> (64 - P)) as usize;
        let rank = ((h << P) | (1 << (P - 1))).leading_zeros() as u8 + 1;
        let r = &mut self.registers[index];
        *r = (*r).max(rank);
    }

    /// Folds in another sketch: the result sketches the union.
    pub fn merge(&mut self, other: &KeySketch) {
        for (a, b) in self.registers.iter_mut().zip(other.registers.iter()) {
            *a = (*a).max(*b);
        }
    }

    /// Estimated distinct keys added (with linear counting for small sets).
    pub fn estimate(&self) -> f64 {
        let m = M as f64;
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        // 2^-r, built from its exponent bits.
        let sum: f64 = self
            .registers
            .iter()
            .map(|&r| f64::from_bits((1023 - r as u64) << 52))
            .sum();
        let raw = alpha * m * m / sum;
        let zeros = self.registers.iter().filter(|&&r| r == 0).count();
        if raw <= 2.5 * m && zeros > 0 {
            m * (m / zeros as f64).ln()
        } else {
            raw
        }
    }

    fn encode(&self) -> String {
        self.registers
            .iter()
            .map(|&r| ALPHABET[r.min(63) as usize] as char)
            .collect()
    }

    fn decode(s: &str) -> Result<KeySketch, String> {
        if s.len() != M {
            return Err(format!("a key sketch has {M} registers, not {}", s.len()));
        }
        let mut sketch = KeySketch::default();
        for (r, c) in sketch.registers.iter_mut().zip(s.bytes()) {
            *r = ALPHABET
                .iter()
                .position(|&a| a == c)
                .ok_or_else(|| format!("bad key sketch register {:?}", c as char))?
                as u8;
        }
        Ok(sketch)
    }
}

impl Serialize for KeySketch {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for KeySketch {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<KeySketch, D::Error> {
        let s = String::deserialize(d)?;
        KeySketch::decode(&s).map_err(serde::de::Error::custom)
    }
}

/// What a compacted segment holds, for the policy's dirty-ratio estimate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyStats {
    /// Records in the segment (superseded ones included).
    pub records: u64,
    /// Distinct keys: the entries of its key index.
    pub keys: u64,
    pub sketch: KeySketch,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::records::key_hash;

    fn sketch(keys: std::ops::Range<u64>) -> KeySketch {
        let mut s = KeySketch::default();
        for k in keys {
            s.add(key_hash(&k.to_be_bytes()));
        }
        s
    }

    #[test]
    fn estimates_distinct_keys_within_a_few_percent() {
        for n in [0u64, 1, 200, 5_000, 100_000, 1_000_000] {
            let e = sketch(0..n).estimate();
            let err = (e - n as f64).abs() / (n as f64).max(1.0);
            assert!(err < 0.06, "{n} keys estimated as {e}");
        }
        // Adding a key again changes nothing.
        let mut s = sketch(0..1000);
        let before = s.clone();
        s.add(key_hash(&5u64.to_be_bytes()));
        assert_eq!(s, before);
    }

    #[test]
    fn union_of_sketches_estimates_the_union() {
        let mut a = sketch(0..60_000);
        a.merge(&sketch(40_000..100_000));
        let e = a.estimate();
        assert!((e - 100_000.0).abs() < 5_000.0, "{e}");
        let mut same = sketch(0..200);
        same.merge(&sketch(0..200));
        assert!((same.estimate() - 200.0).abs() < 5.0);
    }

    #[test]
    fn survives_json() {
        let stats = KeyStats {
            records: 7,
            keys: 3,
            sketch: sketch(0..3000),
        };
        let json = serde_json::to_string(&stats).unwrap();
        let back: KeyStats = serde_json::from_str(&json).unwrap();
        assert_eq!(back, stats);
        let bad = json.replace("\"sketch\":\"", "\"sketch\":\"!");
        assert!(serde_json::from_str::<KeyStats>(&bad).is_err());
    }
}
