//! Producer id allocation that never hands out an id twice, across restarts.
//!
//! Ids are reserved in blocks: the end of the current block is written
//! durably before any id from it is used, so after a crash allocation resumes
//! past everything that might have been handed out.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;

use crate::log::index::write_synced;
use crate::log::LogError;

const BLOCK: i64 = 1000;

pub(crate) struct ProducerIdAllocator {
    path: PathBuf,
    state: Mutex<(i64, i64)>,
}

impl ProducerIdAllocator {
    /// `max_seen` is the largest producer id found in any partition's log.
    pub(crate) fn open(
        path: &Path,
        max_seen: Option<i64>,
    ) -> Result<ProducerIdAllocator, LogError> {
        let reserved = std::fs::read_to_string(path)
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .unwrap_or(0);
        let next = reserved.max(max_seen.map_or(0, |m| m + 1));
        Ok(ProducerIdAllocator {
            path: path.to_path_buf(),
            state: Mutex::new((next, next)),
        })
    }

    pub(crate) fn allocate(&self) -> Result<i64, LogError> {
        let mut st = self.state.lock();
        let (next, reserved_end) = *st;
        if next >= reserved_end {
            let end = next + BLOCK;
            write_synced(&self.path, end.to_string().as_bytes())?;
            st.1 = end;
        }
        st.0 = next + 1;
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_not_reused_after_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("producer-ids");
        let a = ProducerIdAllocator::open(&path, None).unwrap();
        let first: Vec<i64> = (0..3).map(|_| a.allocate().unwrap()).collect();
        assert_eq!(first, vec![0, 1, 2]);
        let b = ProducerIdAllocator::open(&path, None).unwrap();
        assert!(b.allocate().unwrap() >= 3);
        let c = ProducerIdAllocator::open(&path, Some(5000)).unwrap();
        assert_eq!(c.allocate().unwrap(), 5001);
    }
}
