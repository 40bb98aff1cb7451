//! The send counters a server run may use under its clients' pre-shared session keys
//! (docs/PROTOCOL.md §4.3: a nonce must never repeat under a key that never changes).
//!
//! The gateway persists one high-water mark per stream (`gateway::counter_state`); a file per
//! client would be a million files. The server instead persists one number, its run generation
//! `g`, in `<state_dir>/server-<tun>.generation`: at start it reads `g`, writes `g + 1` and
//! fsyncs (file and directory) before any client key is used, and every client's sealer in this
//! run numbers its packets from `(g + 1) << 40` to just below `(g + 2) << 40`. Two runs never
//! share a counter, whatever the clock says; a client that sends 2^40 packets in one run (12
//! days at a million packets per second) stops being sent to (counted as
//! `seal_counter_not_reserved`) until the next start. 2^22 starts fit in the 2^62 counters.

use std::fs;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use super::registry::CounterRange;

/// Counters per run and client.
pub const RUN_BITS: u32 = 40;
/// Runs before the counter space is used up (2^62 counters / 2^40 per run).
pub const MAX_GENERATION: u64 = (1 << (62 - RUN_BITS)) - 1;

/// Why the generation could not be reserved.
#[derive(Debug, thiserror::Error)]
pub enum GenerationError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: not a generation file (expected one decimal number); refusing to guess, which could repeat a nonce: restore it, or give every client a new key and delete it")]
    Corrupt { path: PathBuf },
    #[error("{path}: the counter space of these keys is used up after {MAX_GENERATION} starts; give every client a new key and delete the file")]
    Exhausted { path: PathBuf },
}

/// Reserves the next generation in `dir` for the server whose TUN device is `tun`.
pub fn reserve(dir: &Path, tun: &str) -> Result<CounterRange, GenerationError> {
    reserve_named(dir, &format!("server-{tun}"))
}

/// Reserves the next generation kept in `dir/<name>.generation` (the relay role keeps its own).
pub fn reserve_named(dir: &Path, name: &str) -> Result<CounterRange, GenerationError> {
    let path = dir.join(format!("{name}.generation"));
    let io = |what| {
        let path = path.clone();
        move |source| GenerationError::Io { path, what, source }
    };
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io("create the state directory"))?;
    let last = match fs::read_to_string(&path) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .map_err(|_| GenerationError::Corrupt { path: path.clone() })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => 0,
        Err(e) => return Err(io("read")(e)),
    };
    let g = last + 1;
    if g > MAX_GENERATION {
        return Err(GenerationError::Exhausted { path });
    }
    crate::gateway::counter_state::write_durably(&path, &format!("{g}\n"))
        .map_err(|(path, what, source)| GenerationError::Io { path, what, source })?;
    Ok(CounterRange {
        first: g << RUN_BITS,
        end: (g + 1) << RUN_BITS,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn every_start_gets_counters_no_earlier_start_had() {
        let dir = std::env::temp_dir().join(format!("mt6d-gen-{}", std::process::id()));
        let a = reserve(&dir, "s0").unwrap();
        let b = reserve(&dir, "s0").unwrap();
        assert_eq!(a.end, b.first);
        assert!(a.first < a.end && b.first < b.end);
        // Another server on the same state directory has its own file.
        assert_eq!(reserve(&dir, "s1").unwrap(), a);
        fs::write(dir.join("server-s0.generation"), "x\n").unwrap();
        assert!(matches!(
            reserve(&dir, "s0"),
            Err(GenerationError::Corrupt { .. })
        ));
        fs::write(
            dir.join("server-s0.generation"),
            format!("{MAX_GENERATION}\n"),
        )
        .unwrap();
        assert!(matches!(
            reserve(&dir, "s0"),
            Err(GenerationError::Exhausted { .. })
        ));
        fs::remove_dir_all(&dir).unwrap();
    }
}
