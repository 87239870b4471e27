//! Opening the object store the broker's settings name.
//!
//! `file:///path` (the default, `<data-dir>/objects`), `s3://bucket/prefix`
//! (credentials and the rest from the usual `AWS_*` variables, overridden by
//! the `--s3-*` flags, so MinIO/SeaweedFS/Ceph/R2 work) and `memory://` (a
//! fresh in-process store, for tests). gs:// and az:// would be the same few
//! lines with object_store's `gcp` / `azure` features; they are not compiled in.

use std::path::Path as FsPath;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::memory::InMemory;
use object_store::path::Path;
use object_store::prefix::PrefixStore;
use object_store::ObjectStore;

use super::fault::{FaultyStore, Latency};
use super::ManifestError;
use crate::clock::SharedRandom;

/// The store URL used when none is given.
pub fn default_url(data_dir: &FsPath) -> String {
    let abs =
        std::path::absolute(data_dir.join("objects")).unwrap_or_else(|_| data_dir.join("objects"));
    format!("file://{}", abs.display())
}

/// S3 settings that flags may override (everything else comes from `AWS_*`).
#[derive(Debug, Clone, Default)]
pub struct S3Options {
    pub endpoint: Option<String>,
    pub region: Option<String>,
    pub allow_http: Option<bool>,
    pub virtual_hosted: bool,
}

/// Where sealed segments live: the store's URL (default: the `file://`
/// store under the data directory) and the S3 settings.
#[derive(Debug, Clone, Default)]
pub struct StoreSettings {
    pub url: Option<String>,
    pub s3: S3Options,
    /// Benchmarks and tests: every request is held by a draw of this first.
    pub latency: Option<Latency>,
}

/// Opens the store `settings` name, by default the `file://` store under
/// `data_dir`; `random` draws the latency, if one is set.
pub fn open_configured(
    settings: &StoreSettings,
    data_dir: &FsPath,
    random: SharedRandom,
) -> Result<Arc<dyn ObjectStore>, ManifestError> {
    let url = settings
        .url
        .clone()
        .unwrap_or_else(|| default_url(data_dir));
    let store = open(&url, &settings.s3)?;
    Ok(match settings.latency {
        Some(latency) => Arc::new(FaultyStore::with_latency(store, latency, random)),
        None => store,
    })
}

/// Opens the store for `url`; every key the broker uses is relative to it.
pub fn open(url: &str, s3: &S3Options) -> Result<Arc<dyn ObjectStore>, ManifestError> {
    let bad = |why: &str| ManifestError::Config(format!("store URL {url:?}: {why}"));
    let parsed = url::Url::parse(url).map_err(|e| bad(&e.to_string()))?;
    match parsed.scheme() {
        "memory" => Ok(Arc::new(InMemory::new())),
        "file" => {
            let dir = parsed
                .to_file_path()
                .map_err(|_| bad("not an absolute local path"))?;
            std::fs::create_dir_all(&dir)
                .map_err(|e| bad(&format!("cannot create {}: {e}", dir.display())))?;
            let fs = LocalFileSystem::new_with_prefix(&dir)?;
            Ok(Arc::new(fs))
        }
        "s3" | "s3a" => {
            let bucket = parsed
                .host_str()
                .filter(|b| !b.is_empty())
                .ok_or_else(|| bad("no bucket"))?;
            let mut b = AmazonS3Builder::from_env()
                .with_bucket_name(bucket)
                .with_virtual_hosted_style_request(s3.virtual_hosted);
            if let Some(e) = &s3.endpoint {
                b = b.with_endpoint(e);
            }
            if let Some(r) = &s3.region {
                b = b.with_region(r);
            }
            if let Some(h) = s3.allow_http {
                b = b.with_allow_http(h);
            }
            let s3 = b.build()?;
            let prefix = parsed.path().trim_matches('/');
            if prefix.is_empty() {
                Ok(Arc::new(s3))
            } else {
                Ok(Arc::new(PrefixStore::new(s3, Path::from(prefix))))
            }
        }
        "gs" | "az" | "abfs" | "azure" => Err(bad(
            "this build has no gcp/azure support (object_store features `gcp`/`azure`)",
        )),
        other => Err(bad(&format!("unknown scheme {other}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[tokio::test]
    async fn file_store_roots_keys_under_its_directory() {
        let dir = tempfile::tempdir().unwrap();
        let url = default_url(dir.path());
        let store = open(&url, &S3Options::default()).unwrap();
        store
            .put(&Path::from("a/b.txt"), Bytes::from_static(b"x").into())
            .await
            .unwrap();
        assert!(dir.path().join("objects/a/b.txt").exists());
    }

    #[test]
    fn rejects_unknown_and_uncompiled_schemes() {
        let o = S3Options::default();
        assert!(matches!(open("ftp://x", &o), Err(ManifestError::Config(_))));
        assert!(matches!(
            open("gs://bucket", &o),
            Err(ManifestError::Config(_))
        ));
        assert!(matches!(open("s3://", &o), Err(ManifestError::Config(_))));
        assert!(open("memory://", &o).is_ok());
    }

    #[test]
    fn s3_url_builds_with_flags() {
        let o = S3Options {
            endpoint: Some("http://127.0.0.1:9".into()),
            region: Some("us-east-1".into()),
            allow_http: Some(true),
            virtual_hosted: false,
        };
        assert!(open("s3://bucket/some/prefix", &o).is_ok());
    }
}
