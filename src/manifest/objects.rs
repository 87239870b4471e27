//! The objects of one tiered segment: uploading them from a local segment
//! directory, deleting them, and finding the ones no manifest names.
//!
//! A segment is a `.log` plus small companions, all under one key prefix.
//! The descriptor (`.meta`) is written last and deleted first, so a listing
//! that shows it shows a whole segment. Objects are never modified: a
//! merge's output gets a key of its own, never a source's.

use std::collections::HashSet;
use std::path::Path as FsPath;
use std::sync::Arc;
use std::time::Duration;

use futures::TryStreamExt;
use object_store::path::Path;
use object_store::ObjectStore;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Manifest, ManifestError, TOPIC_FILE};
use crate::format::segment::{
    file_name, SegmentMeta, ALL_EXTENSIONS, INDEX_EXT, KEY_INDEX_EXT, LOG_EXT, META_EXT,
    SNAPSHOT_EXT, TIME_INDEX_EXT,
};

/// Segment logs are streamed to the store in parts of this size.
const UPLOAD_PART: usize = 8 << 20;
/// Parts uploaded at once: bounds an upload's memory to about
/// (1 + this) × UPLOAD_PART (object_store's default of 8 would let one
/// upload hold 72 MiB).
const UPLOAD_PARTS_IN_FLIGHT: usize = 2;

/// Companions uploaded before the descriptor; the key index (compacted
/// topics only) and the producer snapshot (not in old segments) may be absent.
const COMPANIONS: [&str; 4] = [INDEX_EXT, TIME_INDEX_EXT, KEY_INDEX_EXT, SNAPSHOT_EXT];

/// Uploads the local segment `base` of `dir` under `key`: the log, then its
/// companions, then the descriptor, each streamed (a key index can be tens
/// of MiB). Returns the number of objects written.
pub async fn upload_segment(
    store: &Arc<dyn ObjectStore>,
    dir: &FsPath,
    meta: &SegmentMeta,
    key: &str,
) -> Result<u64, ManifestError> {
    let base = meta.base_offset;
    upload_file(
        store,
        &dir.join(file_name(base, LOG_EXT)),
        key,
        LOG_EXT,
        Some(meta.size),
    )
    .await?;
    let mut objects = 1;
    for ext in COMPANIONS.iter().chain(&[META_EXT]) {
        match upload_file(store, &dir.join(file_name(base, ext)), key, ext, None).await {
            Ok(()) => objects += 1,
            Err(ManifestError::Io(e))
                if e.kind() == std::io::ErrorKind::NotFound
                    && [KEY_INDEX_EXT, SNAPSHOT_EXT].contains(ext) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(objects)
}

/// Streams the local file `path` (its first `len` bytes, if given) to
/// `<key>.<ext>`: one PUT when it fits in a part, a multipart upload beyond.
async fn upload_file(
    store: &Arc<dyn ObjectStore>,
    path: &FsPath,
    key: &str,
    ext: &str,
    len: Option<u64>,
) -> Result<(), ManifestError> {
    let file = tokio::fs::File::open(path).await?;
    let len = match len {
        Some(l) => l,
        None => file.metadata().await?.len(),
    };
    let mut writer = object_store::buffered::BufWriter::with_capacity(
        store.clone(),
        Path::from(format!("{key}.{ext}")),
        UPLOAD_PART,
    )
    .with_max_concurrency(UPLOAD_PARTS_IN_FLIGHT);
    let copied = tokio::io::copy(&mut file.take(len), &mut writer).await?;
    if copied != len {
        writer.abort().await?;
        return Err(ManifestError::Corrupt(format!(
            "{}: read {copied} of {len} bytes",
            path.display()
        )));
    }
    writer.shutdown().await?;
    Ok(())
}

/// Deletes every object of the segment `key`, descriptor first; objects
/// already gone are fine (deletes are retried after crashes).
pub async fn delete_segment(store: &Arc<dyn ObjectStore>, key: &str) -> Result<(), ManifestError> {
    for ext in ALL_EXTENSIONS {
        match store.delete(&Path::from(format!("{key}.{ext}"))).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Deletes the segment objects under `partition` that `manifest` does not
/// name and that are older than `min_age` at `now_ms`: sources a crashed compaction
/// swapped out but never deleted, outputs of merges that lost a race or
/// died before their manifest write, uploads retention overtook. Objects
/// at or beyond the manifest's end are left alone, since they may be an
/// upload about to be committed. Returns the number of objects deleted.
pub async fn collect_orphans(
    store: &Arc<dyn ObjectStore>,
    partition: &Path,
    manifest: &Manifest,
    now_ms: i64,
    min_age: Duration,
) -> Result<usize, ManifestError> {
    let named: HashSet<&str> = manifest.segments.iter().map(|s| s.key.as_str()).collect();
    let end = manifest.end_offset().unwrap_or(i64::MIN);
    let cutoff = cutoff_ms(now_ms, min_age);
    let objects: Vec<_> = store
        .list(Some(&partition.child("segments")))
        .try_collect()
        .await?;
    let mut deleted = 0;
    for o in objects {
        let location = o.location.as_ref();
        let Some((key, _ext)) = location.rsplit_once('.') else {
            continue;
        };
        if named.contains(key) || o.last_modified.timestamp_millis() > cutoff {
            continue;
        }
        let base = o
            .location
            .filename()
            .and_then(|f| f.split(['-', '.']).next())
            .and_then(|b| b.parse::<i64>().ok());
        if base.is_none_or(|b| b >= end) {
            continue;
        }
        match store.delete(&o.location).await {
            Ok(()) => deleted += 1,
            Err(object_store::Error::NotFound { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(deleted)
}

/// Deletes the objects of topic incarnations whose `topic.json` is gone
/// (a deletion removes it first, so these are deletions a crash cut short)
/// once all their objects are older than `min_age` at `now_ms`. Incarnations in `live`
/// (this broker's topics) are never touched. Returns the objects deleted.
pub async fn collect_deleted_topics(
    store: &Arc<dyn ObjectStore>,
    live: &[uuid::Uuid],
    now_ms: i64,
    min_age: Duration,
) -> Result<usize, ManifestError> {
    let cutoff = cutoff_ms(now_ms, min_age);
    let mut deleted = 0;
    let names = store
        .list_with_delimiter(Some(&Path::from("topics")))
        .await?;
    for name in names.common_prefixes {
        for id in store
            .list_with_delimiter(Some(&name))
            .await?
            .common_prefixes
        {
            let is_live = id
                .filename()
                .and_then(|f| f.parse::<uuid::Uuid>().ok())
                .is_some_and(|i| live.contains(&i));
            if is_live {
                continue;
            }
            match store.head(&id.child(TOPIC_FILE)).await {
                Ok(_) => continue,
                Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            let objects: Vec<_> = store.list(Some(&id)).try_collect().await?;
            if objects
                .iter()
                .any(|o| o.last_modified.timestamp_millis() > cutoff)
            {
                continue;
            }
            for o in objects {
                match store.delete(&o.location).await {
                    Ok(()) => deleted += 1,
                    Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
    Ok(deleted)
}

/// The topic description under `topics/<name>/`: one id per name normally;
/// leftovers of a deleted incarnation lose to the newest `topic.json`.
pub async fn newest_topic_file<T: serde::de::DeserializeOwned>(
    store: &Arc<dyn ObjectStore>,
    name_prefix: &Path,
) -> Result<Option<T>, ManifestError> {
    let ids = store.list_with_delimiter(Some(name_prefix)).await?;
    let mut best: Option<(i64, T)> = None;
    for id_prefix in ids.common_prefixes {
        let r = match store.get(&id_prefix.child(TOPIC_FILE)).await {
            Ok(r) => r,
            Err(object_store::Error::NotFound { .. }) => continue,
            Err(e) => return Err(e.into()),
        };
        let stamp = r.meta.last_modified.timestamp_millis();
        let file: T = serde_json::from_slice(&r.bytes().await?)
            .map_err(|e| ManifestError::Corrupt(format!("{id_prefix}/topic.json: {e}")))?;
        if best.as_ref().is_none_or(|(s, _)| stamp > *s) {
            best = Some((stamp, file));
        }
    }
    Ok(best.map(|(_, f)| f))
}

/// `min_age` before `now_ms`: objects last modified later are too young.
/// Milliseconds, like the clock: an object written in the millisecond
/// `now_ms` names is not younger than it.
fn cutoff_ms(now_ms: i64, min_age: Duration) -> i64 {
    now_ms.saturating_sub(i64::try_from(min_age.as_millis()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::Clock;
    use crate::format::segment::SEGMENT_FORMAT_VERSION;
    use crate::manifest::store::{default_url, open, S3Options};

    /// Logs larger than one upload part go up as multipart uploads; a segment
    /// without a key index or producer snapshot uploads without them.
    #[tokio::test]
    async fn leftovers_of_a_deleted_topic_go_and_live_topics_stay() {
        let store: Arc<dyn ObjectStore> = Arc::new(object_store::memory::InMemory::new());
        let (gone, live, foreign) = (
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
            uuid::Uuid::new_v4(),
        );
        let put = |key: String| {
            let store = store.clone();
            async move { store.put(&Path::from(key), "x".into()).await.unwrap() }
        };
        // A deletion cut short: topic.json already gone, segments left.
        put(format!("topics/a/{gone}/0/segments/1-0.log")).await;
        put(format!("topics/a/{gone}/0/manifest/1.json")).await;
        // This broker's topic, even while its topic.json is missing.
        put(format!("topics/a/{live}/0/segments/1-0.log")).await;
        // Another broker's topic, described.
        put(format!("topics/b/{foreign}/topic.json")).await;
        put(format!("topics/b/{foreign}/0/segments/1-0.log")).await;

        let now = crate::clock::SystemClock.now_ms();
        let young = collect_deleted_topics(&store, &[live], now, Duration::from_secs(3600)).await;
        assert_eq!(young.unwrap(), 0);
        assert_eq!(
            collect_deleted_topics(&store, &[live], now, Duration::ZERO)
                .await
                .unwrap(),
            2
        );
        let left: Vec<_> = store.list(None).try_collect().await.unwrap();
        let mut left: Vec<String> = left.iter().map(|o| o.location.to_string()).collect();
        left.sort();
        assert_eq!(
            left,
            vec![
                format!("topics/a/{live}/0/segments/1-0.log"),
                format!("topics/b/{foreign}/0/segments/1-0.log"),
                format!("topics/b/{foreign}/topic.json"),
            ]
        );
    }

    #[tokio::test]
    async fn uploads_a_multipart_log_and_skips_absent_companions() {
        let dir = tempfile::tempdir().unwrap();
        let size = 2 * UPLOAD_PART as u64 + 123;
        let log: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join(file_name(0, "log")), &log).unwrap();
        for ext in ["index", "timeindex", "meta"] {
            std::fs::write(dir.path().join(file_name(0, ext)), ext).unwrap();
        }
        let meta = SegmentMeta {
            format_version: SEGMENT_FORMAT_VERSION,
            level: 0,
            base_offset: 0,
            next_offset: 10,
            size,
            batch_count: 1,
            max_timestamp: 0,
            max_timestamp_position: 0,
            created_ms: 0,
            sealed_ms: 0,
            keys: None,
            aborted: Vec::new(),
        };
        let root = tempfile::tempdir().unwrap();
        let store = open(&default_url(root.path()), &S3Options::default()).unwrap();
        let puts = upload_segment(&store, dir.path(), &meta, "topics/t/id/0/segments/x-0")
            .await
            .unwrap();
        assert_eq!(puts, 4);
        let got = store
            .get(&Path::from("topics/t/id/0/segments/x-0.log"))
            .await
            .unwrap()
            .bytes()
            .await
            .unwrap();
        assert_eq!(got.len() as u64, size);
        assert!(got[..] == log[..]);
    }
}
