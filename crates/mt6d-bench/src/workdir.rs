//! A run's work directory (test files, keys, configurations), removed on every exit path.

use std::path::PathBuf;

/// Removes the work directory (test files, keys, configs) on every exit path.
pub struct RemoveDir(pub PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
