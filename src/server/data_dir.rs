//! One broker process per data directory, and a name for the directory.
//!
//! Two processes on one data directory would corrupt each other's segments,
//! so the broker holds an exclusive lock on `.lock` in it while it runs; the
//! kernel drops the lock when the process dies, kill -9 included. The
//! directory also keeps a random id (`directory.id`, as Kafka's
//! `meta.properties` does). Cluster mode registers it with the broker, and
//! that is how a restarted broker recognises a registration left by its own
//! dead incarnation: the process that made it ran on this directory, and
//! since this process holds the lock now, it no longer runs.

use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::path::Path;

use anyhow::Context;

use crate::clock::Random;
use crate::log::index::write_synced;

const LOCK_FILE: &str = ".lock";
const ID_FILE: &str = "directory.id";

/// The data directory, held by this process until dropped.
pub(super) struct DataDir {
    pub id: String,
    _lock: File,
}

/// Locks `path` (created if missing) and reads its id, making one up first.
pub(super) fn claim(path: &Path, random: &dyn Random) -> anyhow::Result<DataDir> {
    std::fs::create_dir_all(path)
        .with_context(|| format!("creating data directory {}", path.display()))?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path.join(LOCK_FILE))
        .with_context(|| format!("opening {}", path.join(LOCK_FILE).display()))?;
    if let Err(e) = lock.try_lock() {
        anyhow::bail!(
            "data directory {} is in use by another broker process ({e})",
            path.display()
        );
    }
    let id_path = path.join(ID_FILE);
    let id = match std::fs::read_to_string(&id_path) {
        Ok(id) if !id.trim().is_empty() => id.trim().to_string(),
        Ok(_) => new_id(&id_path, random)?,
        Err(e) if e.kind() == ErrorKind::NotFound => new_id(&id_path, random)?,
        Err(e) => return Err(e).with_context(|| format!("reading {}", id_path.display())),
    };
    Ok(DataDir { id, _lock: lock })
}

fn new_id(path: &Path, random: &dyn Random) -> anyhow::Result<String> {
    let id = random.uuid().simple().to_string();
    write_synced(path, id.as_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::SeededRandom;

    #[test]
    fn a_directory_is_held_by_one_claim_and_keeps_its_id() {
        let dir = tempfile::tempdir().unwrap();
        let random = SeededRandom::new(7);
        let first = claim(dir.path(), &random).unwrap();
        let err = claim(dir.path(), &random).err().expect("claimed twice");
        assert!(err.to_string().contains("in use"), "{err}");
        let id = first.id.clone();
        drop(first);
        assert_eq!(claim(dir.path(), &random).unwrap().id, id);
    }
}
