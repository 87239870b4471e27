//! `strata levels TOPIC`: what compaction has made of a topic, read from
//! the store alone (so it works with the broker down, or from anywhere that
//! can reach the bucket).

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;

use super::policy::{self, SegmentDesc};
use crate::catalog::TopicFile;
use crate::manifest::objects::newest_topic_file;
use crate::manifest::{manifest_dir, partition_prefix, ManifestError, ManifestStore};

/// Per partition: segments and bytes by level, object count, the merge the
/// policy would run next, and how long the oldest unmerged segment has
/// waited, as of `now_ms`.
pub async fn report(
    store: &Arc<dyn ObjectStore>,
    topic: &str,
    now_ms: i64,
) -> Result<String, ManifestError> {
    let Some(file) =
        newest_topic_file::<TopicFile>(store, &Path::from_iter(["topics", topic])).await?
    else {
        return Err(ManifestError::Config(format!(
            "topic {topic} is not in the store"
        )));
    };
    let config = file.config;
    let settings = config.settings();
    let policy = policy::for_topic(&settings);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "topic {topic} (id {}), {} partitions, cleanup.policy={}, compaction: {} fan-out {}",
        file.id,
        file.partitions,
        if settings.cleanup.compact {
            "compact"
        } else {
            "delete"
        },
        settings.compaction.name(),
        settings.compaction_fanout
    );
    let now = now_ms;
    for p in 0..file.partitions as i32 {
        let prefix = partition_prefix(topic, file.id, p);
        let manifest = ManifestStore::new(store.clone(), manifest_dir(&prefix))
            .load_latest()
            .await?;
        let objects = store
            .list(Some(&prefix))
            .try_fold(0usize, |n, _| async move { Ok(n + 1) })
            .await?;
        let Some(m) = manifest else {
            let _ = writeln!(out, "partition {p}: nothing tiered yet ({objects} objects)");
            continue;
        };
        let mut levels: BTreeMap<u32, (usize, u64)> = BTreeMap::new();
        for s in &m.segments {
            let e = levels.entry(s.level).or_default();
            e.0 += 1;
            e.1 += s.size;
        }
        let descs: Vec<SegmentDesc> = m.segments.iter().map(SegmentDesc::from).collect();
        let next = match policy.next_job(&descs, now) {
            Some(j) => format!(
                "{} x L{} -> L{}{}",
                j.count,
                j.target_level - 1,
                j.target_level,
                match j.reason {
                    policy::Reason::Level => "",
                    policy::Reason::MaxLag => " (max.compaction.lag.ms)",
                    policy::Reason::DirtyRatio => " (min.cleanable.dirty.ratio)",
                }
            ),
            None => "none".into(),
        };
        let lag = m
            .segments
            .iter()
            .find(|s| s.level == 0)
            .map_or("-".into(), |s| {
                format!("{:.1} s", (now - s.max_timestamp).max(0) as f64 / 1000.0)
            });
        let dirty = if settings.cleanup.compact {
            format!(", dirty ratio {:.2}", policy::dirty_share(&descs))
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "partition {p}: offsets {}..{}, {} segments, {} bytes, {objects} objects, manifest v{}, next merge: {next}, compaction lag: {lag}{dirty}",
            m.log_start_offset,
            m.end_offset().unwrap_or(m.log_start_offset),
            m.segments.len(),
            m.size_bytes(),
            m.version
        );
        for (level, (count, bytes)) in levels {
            let _ = writeln!(out, "  L{level}: {count} segments, {bytes} bytes");
        }
    }
    Ok(out)
}
