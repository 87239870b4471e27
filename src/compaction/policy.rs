//! Which segments to merge next: a small, swappable policy.
//!
//! The default, `Leveled`, is the rule "F contiguous segments of level N make
//! one of level N+1" (with F = 2 a level-N segment holds 2^N sealed segments'
//! worth of offsets). Every byte is then rewritten about once per level, so
//! write amplification grows with log_F of the partition's size while the
//! number of segments (objects in the store) stays below (F-1) per level: a
//! larger fan-out writes less and leaves more objects. `simulate` measures
//! both for a workload so the default can be chosen from numbers, and the
//! bench prints them.
//!
//! Two escapes bound the schedule. A merge whose sources add up to more than
//! `strata.compaction.max.segment.bytes` is not proposed, so for
//! `cleanup.policy=delete` segments freeze at that size instead of being
//! rewritten forever (compacted segments shrink, so they keep merging while
//! their live data fits). And `max.compaction.lag.ms` forces a level-0
//! segment whose records are all older than the lag into a merge even before
//! F of them are there, because until its first merge nothing in it is
//! de-duplicated.
//!
//! The policy sees only descriptors (offsets, level, size, max timestamp) of
//! sealed segments, so the same code schedules local segments and segments
//! listed in a tiered-storage manifest; the active segment is never offered.

use crate::catalog::config::TopicConfig;
use crate::format::segment::SegmentMeta;
use crate::manifest::TieredSegment;

/// What the policy knows about a sealed segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentDesc {
    pub base_offset: i64,
    pub next_offset: i64,
    pub level: u32,
    pub max_timestamp: i64,
    pub size: u64,
}

impl From<&SegmentMeta> for SegmentDesc {
    fn from(m: &SegmentMeta) -> SegmentDesc {
        SegmentDesc {
            base_offset: m.base_offset,
            next_offset: m.next_offset,
            level: m.level,
            max_timestamp: m.max_timestamp,
            size: m.size,
        }
    }
}

impl From<&TieredSegment> for SegmentDesc {
    fn from(s: &TieredSegment) -> SegmentDesc {
        SegmentDesc {
            base_offset: s.base_offset,
            next_offset: s.next_offset,
            level: s.level,
            max_timestamp: s.max_timestamp,
            size: s.size,
        }
    }
}

/// A merge to run: `count` segments starting at index `first` of the list
/// the policy was given.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Job {
    pub first: usize,
    pub count: usize,
    pub base_offset: i64,
    pub next_offset: i64,
    pub target_level: u32,
    /// Proposed because of max.compaction.lag.ms rather than a full level.
    pub forced: bool,
}

pub trait CompactionPolicy: Send + Sync {
    /// The next merge for a partition whose sealed segments are `segments`
    /// (oldest first), or `None` when nothing is due.
    fn next_job(&self, segments: &[SegmentDesc], now_ms: i64) -> Option<Job>;
}

/// Every merge the policy wants now over disjoint ranges of `segments`
/// (they can run in parallel): the policy's choice, then its choices
/// among the segments left of it and right of it, and so on.
pub fn disjoint_jobs(
    policy: &dyn CompactionPolicy,
    segments: &[SegmentDesc],
    now_ms: i64,
) -> Vec<Job> {
    let mut jobs = Vec::new();
    let mut ranges = vec![(0, segments.len())];
    while let Some((start, end)) = ranges.pop() {
        let Some(mut job) = policy.next_job(&segments[start..end], now_ms) else {
            continue;
        };
        job.first += start;
        ranges.push((start, job.first));
        ranges.push((job.first + job.count, end));
        jobs.push(job);
    }
    jobs.sort_by_key(|j| j.first);
    jobs
}

/// Never merges.
pub struct NoCompaction;

impl CompactionPolicy for NoCompaction {
    fn next_job(&self, _: &[SegmentDesc], _: i64) -> Option<Job> {
        None
    }
}

/// F contiguous segments of level N make one of level N+1.
#[derive(Debug, Clone, Copy)]
pub struct Leveled {
    pub fanout: usize,
    pub max_segment_bytes: u64,
    /// `max.compaction.lag.ms` for compacted topics; `i64::MAX` otherwise.
    pub max_compaction_lag_ms: i64,
}

pub const POLICY_LEVELED: &str = "leveled";
pub const POLICY_NONE: &str = "none";

/// Merged segments must keep byte positions and relative offsets in 32 bits.
const MAX_SPAN: i64 = u32::MAX as i64;

/// The policy a topic's configuration selects.
pub fn for_topic(cfg: &TopicConfig) -> Box<dyn CompactionPolicy> {
    if cfg.compaction_policy() == POLICY_NONE {
        return Box::new(NoCompaction);
    }
    Box::new(Leveled {
        fanout: cfg.compaction_fanout(),
        max_segment_bytes: cfg.compaction_max_segment_bytes(),
        max_compaction_lag_ms: if cfg.compact() {
            cfg.max_compaction_lag_ms()
        } else {
            i64::MAX
        },
    })
}

impl Leveled {
    fn fits(&self, group: &[SegmentDesc]) -> bool {
        let size: u64 = group.iter().map(|s| s.size).sum();
        let span =
            group.last().map_or(0, |s| s.next_offset) - group.first().map_or(0, |s| s.base_offset);
        size <= self.max_segment_bytes && span <= MAX_SPAN
    }

    fn job(first: usize, group: &[SegmentDesc], forced: bool) -> Job {
        Job {
            first,
            count: group.len(),
            base_offset: group[0].base_offset,
            next_offset: group[group.len() - 1].next_offset,
            target_level: group[0].level + 1,
            forced,
        }
    }
}

/// Index ranges of maximal runs of contiguous segments of one level.
fn runs(segments: &[SegmentDesc]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = 0;
    for i in 1..=segments.len() {
        let breaks = i == segments.len()
            || segments[i].level != segments[i - 1].level
            || segments[i].base_offset != segments[i - 1].next_offset;
        if breaks {
            out.push((start, i));
            start = i;
        }
    }
    out
}

impl CompactionPolicy for Leveled {
    fn next_job(&self, segments: &[SegmentDesc], now_ms: i64) -> Option<Job> {
        let fanout = self.fanout.max(2);
        let runs = runs(segments);
        // Lowest level first: that is where segments pile up fastest, and
        // merging there keeps the object count down soonest.
        let mut best: Option<Job> = None;
        for &(start, end) in &runs {
            let mut i = start;
            while i + fanout <= end {
                let group = &segments[i..i + fanout];
                if self.fits(group) {
                    if best.is_none_or(|b| group[0].level < b.target_level - 1) {
                        best = Some(Self::job(i, group, false));
                    }
                    break;
                }
                i += 1;
            }
        }
        if best.is_some() {
            return best;
        }
        if self.max_compaction_lag_ms == i64::MAX {
            return None;
        }
        let stale_before = now_ms.saturating_sub(self.max_compaction_lag_ms);
        for &(start, end) in &runs {
            if segments[start].level != 0 {
                continue;
            }
            if let Some(i) = (start..end).find(|&i| segments[i].max_timestamp < stale_before) {
                let end = end.min(i + fanout);
                // Shrink until it fits; a single segment always may be
                // compacted on its own.
                let mut j = end;
                while j > i + 1 && !self.fits(&segments[i..j]) {
                    j -= 1;
                }
                return Some(Self::job(i, &segments[i..j], true));
            }
        }
        None
    }
}

/// What ingesting a partition under a policy costs.
#[derive(Debug, Clone, PartialEq)]
pub struct SimulationReport {
    pub ingested_bytes: u64,
    pub segments_sealed: u64,
    /// Bytes written by sealing and by merges, per byte ingested.
    pub write_amplification: f64,
    pub merges: u64,
    /// Segments (one set of objects each) left at the end.
    pub segments_final: usize,
    /// The most segments the partition held at any time.
    pub segments_max: usize,
    pub max_level: u32,
}

/// Ingests `total_bytes` into one partition in sealed segments of
/// `segment_bytes`, running the policy to quiescence after each seal.
/// With `live_bytes` set, a merge's output is capped at that size, a crude
/// model of a compacted topic whose distinct keys hold that much data;
/// without it every byte survives, as in `cleanup.policy=delete`.
pub fn simulate(
    policy: &dyn CompactionPolicy,
    segment_bytes: u64,
    total_bytes: u64,
    live_bytes: Option<u64>,
) -> SimulationReport {
    let mut segments: Vec<SegmentDesc> = Vec::new();
    let (mut written, mut ingested, mut sealed, mut merges) = (0u64, 0u64, 0u64, 0u64);
    let mut segments_max = 0;
    let mut next_offset = 0i64;
    // One offset per KiB keeps offsets realistic without mattering here.
    let offsets_per_segment = (segment_bytes / 1024).max(1) as i64;
    while ingested < total_bytes {
        let size = segment_bytes.min(total_bytes - ingested);
        segments.push(SegmentDesc {
            base_offset: next_offset,
            next_offset: next_offset + offsets_per_segment,
            level: 0,
            max_timestamp: sealed as i64,
            size,
        });
        next_offset += offsets_per_segment;
        ingested += size;
        written += size;
        sealed += 1;
        segments_max = segments_max.max(segments.len());
        while let Some(job) = policy.next_job(&segments, sealed as i64) {
            let group = &segments[job.first..job.first + job.count];
            let mut size: u64 = group.iter().map(|s| s.size).sum();
            if let Some(live) = live_bytes {
                size = size.min(live);
            }
            let merged = SegmentDesc {
                base_offset: job.base_offset,
                next_offset: job.next_offset,
                level: job.target_level,
                max_timestamp: group.iter().map(|s| s.max_timestamp).max().unwrap_or(-1),
                size,
            };
            written += size;
            merges += 1;
            segments.splice(job.first..job.first + job.count, [merged]);
        }
    }
    SimulationReport {
        ingested_bytes: ingested,
        segments_sealed: sealed,
        write_amplification: written as f64 / ingested.max(1) as f64,
        merges,
        segments_final: segments.len(),
        segments_max,
        max_level: segments.iter().map(|s| s.level).max().unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(base: i64, len: i64, level: u32, size: u64) -> SegmentDesc {
        SegmentDesc {
            base_offset: base,
            next_offset: base + len,
            level,
            max_timestamp: base,
            size,
        }
    }

    fn leveled(fanout: usize) -> Leveled {
        Leveled {
            fanout,
            max_segment_bytes: u64::MAX,
            max_compaction_lag_ms: i64::MAX,
        }
    }

    #[test]
    fn merges_fanout_contiguous_segments_of_one_level() {
        let p = leveled(2);
        let segs = [seg(0, 10, 1, 100), seg(10, 10, 0, 10)];
        assert_eq!(p.next_job(&segs, 0), None);
        let segs = [seg(0, 10, 1, 100), seg(10, 10, 0, 10), seg(20, 10, 0, 10)];
        let job = p.next_job(&segs, 0).unwrap();
        assert_eq!((job.first, job.count, job.target_level), (1, 2, 1));
        assert_eq!((job.base_offset, job.next_offset), (10, 30));
        // A gap breaks contiguity.
        let segs = [seg(0, 10, 0, 10), seg(11, 10, 0, 10)];
        assert_eq!(p.next_job(&segs, 0), None);
        assert_eq!(NoCompaction.next_job(&segs, 0), None);
    }

    #[test]
    fn size_cap_freezes_segments_and_lag_forces_a_lone_segment() {
        let p = Leveled {
            max_segment_bytes: 150,
            ..leveled(2)
        };
        let segs = [seg(0, 10, 0, 100), seg(10, 10, 0, 100), seg(20, 10, 0, 40)];
        let job = p.next_job(&segs, 0).unwrap();
        assert_eq!((job.first, job.count), (1, 2));
        let p = Leveled {
            max_compaction_lag_ms: 100,
            ..leveled(4)
        };
        let segs = [seg(0, 10, 1, 100), seg(10, 10, 0, 100)];
        assert_eq!(p.next_job(&segs, 50), None);
        let job = p.next_job(&segs, 1000).unwrap();
        assert!(job.forced);
        assert_eq!((job.first, job.count, job.target_level), (1, 1, 1));
    }

    /// Write amplification and objects for a few fan-outs: 2 GB into one
    /// partition in 1 MiB segments.
    #[test]
    fn simulation_reports_write_amplification_and_objects() {
        let total = 2_000_000_000;
        let mut last_wa = f64::MAX;
        for fanout in [2, 4, 8, 16] {
            let r = simulate(&leveled(fanout), 1 << 20, total, None);
            println!(
                "fanout {fanout:2}: write amplification {:.2}, segments final {}, max {}, merges {}, top level {}",
                r.write_amplification, r.segments_final, r.segments_max, r.merges, r.max_level
            );
            assert!(r.write_amplification < last_wa);
            last_wa = r.write_amplification;
            assert!(r.segments_final <= (fanout - 1) * (r.max_level as usize + 1));
        }
        let r = simulate(&NoCompaction, 1 << 20, total, None);
        assert_eq!(r.write_amplification, 1.0);
        assert_eq!(r.segments_final as u64, r.segments_sealed);
        // A compacted topic with little live data stays small.
        let r = simulate(&leveled(4), 1 << 20, total, Some(8 << 20));
        assert!(r.write_amplification < 3.0, "{r:?}");
        assert!(r.segments_final < 40, "{r:?}");
    }
}
