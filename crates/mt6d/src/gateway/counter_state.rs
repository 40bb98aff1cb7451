//! The persisted high-water mark of each pre-shared auth/encrypt stream's send counter
//! (docs/PROTOCOL.md §4.3). A pre-shared key never changes, so a nonce must never repeat across
//! restarts; the wall clock cannot promise that (boot before NTP, a stepped clock, a spoofed time
//! server). Instead the daemon writes, before any counter of a block is used, the end of that
//! block to `<state_dir>/psk-<id>.counter` and fsyncs it; a restarted daemon starts at the
//! recorded end. The next block is reserved by the main thread's timer when half of the current
//! one is used, so the packet threads never wait for the disk; if the disk falls behind they drop
//! (`seal_counter_not_reserved`) rather than use an unreserved counter.
//!
//! Owns the state files; must not be used for handshake keys (fresh keys need no state).

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

/// Counters reserved per write: at 10 million packets per second a block lasts 6.7 s and the
/// next one is written 3.3 s ahead; a crash skips at most one block of the 2^63 available.
pub const BLOCK: u64 = 1 << 26;

/// Why the counter state could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CounterStateError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{path}: not a counter state file (expected one decimal number); refusing to guess a counter, which could repeat a nonce: restore the file or give the peer a new key and delete it")]
    Corrupt { path: PathBuf },
    #[error("{path}: the send counter of this key is used up; give the peer a new key")]
    Exhausted { path: PathBuf },
}

/// The reservation of one stream direction.
#[derive(Debug)]
pub struct CounterState {
    path: PathBuf,
    /// Counters below this are on stable storage as used-or-reserved.
    reserved: u64,
    /// The last write failed (logged once until one succeeds).
    failing: bool,
}

impl CounterState {
    /// Reads the mark of stream direction `id` in `dir` (none yet: 0), reserves the block after it
    /// on stable storage, and returns the state and the first counter to use.
    pub fn open(dir: &Path, id: &str) -> Result<(CounterState, u64), CounterStateError> {
        let io = |what, source| CounterStateError::Io {
            path: dir.to_path_buf(),
            what,
            source,
        };
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| io("create state directory", e))?;
        let path = dir.join(format!("psk-{id}.counter"));
        let first = match fs::read_to_string(&path) {
            Ok(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|_| CounterStateError::Corrupt { path: path.clone() })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(source) => {
                return Err(CounterStateError::Io {
                    path,
                    what: "read",
                    source,
                })
            }
        };
        let mut state = CounterState {
            path,
            reserved: first,
            failing: false,
        };
        state.persist(first)?;
        Ok((state, first))
    }

    /// The reserved limit.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// Reserves the next block once fewer than half a block of counters remain before the limit
    /// (`next`: the counter the sealer uses next). Returns the new limit to hand to the sealer.
    pub fn reserve_ahead(&mut self, next: u64) -> Result<Option<u64>, CounterStateError> {
        if self.reserved.saturating_sub(next) >= BLOCK / 2 {
            return Ok(None);
        }
        // A sealer that fell behind burns the counters it refused: start the block past them.
        let from = self.reserved.max(next);
        match self.persist(from) {
            Ok(()) => {
                self.failing = false;
                Ok(Some(self.reserved))
            }
            Err(e) if self.failing => Err(e),
            Err(e) => {
                self.failing = true;
                Err(e)
            }
        }
    }

    /// Whether the last failure was already reported.
    pub fn failing(&self) -> bool {
        self.failing
    }

    /// Writes `from + BLOCK` durably (temporary file, fsync, rename, fsync of the directory) and
    /// only then raises the in-memory limit.
    fn persist(&mut self, from: u64) -> Result<(), CounterStateError> {
        let end = from
            .checked_add(BLOCK)
            .filter(|e| *e <= mt6d_proto::tunnel::COUNTER_LIMIT)
            .ok_or_else(|| CounterStateError::Exhausted {
                path: self.path.clone(),
            })?;
        write_durably(&self.path, &format!("{end}\n"))
            .map_err(|(path, what, source)| CounterStateError::Io { path, what, source })?;
        self.reserved = end;
        Ok(())
    }
}

/// Replaces `path` with `text` durably: a temporary file beside it (mode 0600, created with
/// `O_EXCL | O_NOFOLLOW`: [`crate::files::create_temporary`]), fsync, rename
/// into place, fsync of the directory. A crash leaves the old or the new contents, never a
/// mix. Errors name the file and the step.
pub(crate) fn write_durably(
    path: &Path,
    text: &str,
) -> Result<(), (PathBuf, &'static str, io::Error)> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    fn at(
        p: &Path,
        what: &'static str,
    ) -> impl FnOnce(io::Error) -> (PathBuf, &'static str, io::Error) {
        let p = p.to_path_buf();
        move |e| (p, what, e)
    }
    let mut f = crate::files::create_temporary(&tmp).map_err(at(&tmp, "create"))?;
    f.write_all(text.as_bytes()).map_err(at(&tmp, "write"))?;
    f.sync_all().map_err(at(&tmp, "fsync"))?;
    drop(f);
    fs::rename(&tmp, path).map_err(at(path, "rename into place"))?;
    if let Some(dir) = path.parent() {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(at(dir, "fsync directory"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mt6d-counter-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn restarts_start_above_every_counter_reserved_before() {
        let d = dir("restart");
        let (mut s, first) = CounterState::open(&d, "00aa").expect("must succeed");
        assert_eq!(first, 0);
        assert_eq!(s.reserved(), BLOCK);
        assert_eq!(
            s.reserve_ahead(10).expect("must succeed"),
            None,
            "plenty left"
        );
        assert_eq!(
            s.reserve_ahead(BLOCK / 2 + 1).expect("must succeed"),
            Some(2 * BLOCK)
        );
        // A crash here: the next run starts past everything reserved, whatever the clock says.
        drop(s);
        let (s2, first2) = CounterState::open(&d, "00aa").expect("must succeed");
        assert_eq!(first2, 2 * BLOCK);
        assert_eq!(s2.reserved(), 3 * BLOCK);
        let (_, other) = CounterState::open(&d, "00bb").expect("must succeed");
        assert_eq!(other, 0, "each stream direction has its own file");
        fs::remove_dir_all(&d).expect("must succeed");
    }

    #[test]
    fn a_corrupt_file_is_refused_not_guessed() {
        let d = dir("corrupt");
        fs::create_dir_all(&d).expect("must succeed");
        fs::write(d.join("psk-01.counter"), "twelve\n").expect("must succeed");
        let e = CounterState::open(&d, "01").expect_err("must fail");
        assert!(matches!(e, CounterStateError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("psk-01.counter"), "{e}");
        fs::remove_dir_all(&d).expect("must succeed");
    }

    #[test]
    fn a_sealer_that_fell_behind_gets_a_block_past_its_counter() {
        let d = dir("behind");
        let (mut s, _) = CounterState::open(&d, "02").expect("must succeed");
        // The sealer burnt counters past the limit while the disk was slow.
        assert_eq!(
            s.reserve_ahead(BLOCK + 5).expect("must succeed"),
            Some(2 * BLOCK + 5)
        );
        fs::remove_dir_all(&d).expect("must succeed");
    }
}
