//! Where every pre-shared key's send counters come from, for every role (docs/PROTOCOL.md §4.3).
//! A pre-shared key never changes, so no counter may be sealed under it twice: not after a
//! restart or a crash, not when a reload or `mt6d peer remove` + `peer add` makes a new client
//! object for the same key, not after the TUN device was renamed, and not when a second daemon
//! on the machine holds the same key.
//!
//! The 2^63 static counters of a key are split into ranges of 2^40 ([`RUN_BITS`]):
//! * range 0, `[0, 2^40)`, is the **per-key state files'** (`gateway::counter_state`,
//!   `psk-<id>.counter`, named by a one-way function of the key): a gateway or host reserves
//!   it block by block;
//! * range `g >= 1`, `[g * 2^40, (g + 1) * 2^40)`, is **one server or relay run's**: the run
//!   draws `g` at start from `<state_dir>/psk.generation`, one number for every role and
//!   instance that uses the directory, whatever its TUN device is called, under the exclusive
//!   `flock` of `<state_dir>/psk.lock`, and writes it back durably before any key is used.
//!
//! So, for any key, two daemons on the machine that use the same state directory (two servers
//! sharing a client key, a relay and a server, a server and a gateway) and two runs of one
//! daemon never draw the same counter, and a server with a million clients needs no file per
//! key. Within a run a server that removes a client and adds it again continues it above the
//! counters its earlier incarnation used (`server::registry`, the in-run retirement).
//!
//! Owns `psk.generation` and `psk.lock`; must not be used for handshake keys (fresh keys need no
//! state). Today's generation files, `server-<tun>.generation` and `relay-<tun>.generation`
//! (before the shared file), are read at every draw and honoured: no upgrade restarts lower.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};

use mt6d_proto::AeadAlg;
use nix::fcntl::{Flock, FlockArg};

/// Counters per range: per run and key (server, relay), and the per-key state files' range.
pub const RUN_BITS: u32 = 40;
/// The end of range 0, the per-key state files' counters.
pub const STATE_FILE_END: u64 = 1 << RUN_BITS;
/// Runs before the counter space is used up (2^62 counters / 2^40 per run).
pub const MAX_GENERATION: u64 = (1 << (62 - RUN_BITS)) - 1;
/// The machine's run generation, shared by every role and instance using the directory.
pub const GENERATION_FILE: &str = "psk.generation";
/// Held (`flock`, exclusive) while a generation is drawn or a state file is read and written.
pub const LOCK_FILE: &str = "psk.lock";

/// RFC 9001 §6.6's confidentiality limit for AES-GCM: 2^23 packets under one key.
pub const AES_GCM_PACKET_LIMIT: u64 = 1 << 23;

/// How many packets a pre-shared key may protect in one direction (docs/PROTOCOL.md §4.3): for
/// AES-256-GCM RFC 9001 §6.6's confidentiality limit, 2^23; ChaCha20-Poly1305's limit is above
/// the counter space, so one range of counters, 2^40, bounds it.
pub fn packet_limit(aead: AeadAlg) -> u64 {
    match aead {
        AeadAlg::Aes256Gcm => AES_GCM_PACKET_LIMIT,
        AeadAlg::ChaCha20Poly1305 => STATE_FILE_END,
    }
}

/// Send counters a sealer may use: `[first, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CounterRange {
    pub first: u64,
    pub end: u64,
}

/// Why no run generation could be drawn.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GenerationError {
    #[error("{path}: {what}: {source}")]
    Io {
        path: PathBuf,
        what: &'static str,
        source: io::Error,
    },
    #[error("{path}: not a generation file (expected one decimal number); refusing to guess, which could repeat a nonce: restore it, or give every pre-shared client and link a new key and delete it")]
    Corrupt { path: PathBuf },
    #[error("{path}: the counter space of pre-shared keys is used up after {MAX_GENERATION} runs; give every pre-shared client and link a new key and delete the file")]
    Exhausted { path: PathBuf },
}

/// The machine's counter lock, held until dropped.
pub struct CounterLock {
    _lock: Flock<File>,
}

impl std::fmt::Debug for CounterLock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CounterLock")
    }
}

/// Takes the exclusive lock of `dir` (made with mode 0700 if missing), waiting for another
/// daemon that holds it (it holds it for one read and one durable write).
pub fn lock(dir: &Path) -> Result<CounterLock, (PathBuf, &'static str, io::Error)> {
    crate::daemon::files::private_dir(dir, false)
        .map_err(|e| (dir.to_path_buf(), "create the state directory", e))?;
    let path = dir.join(LOCK_FILE);
    let file = crate::daemon::files::open_private(&path).map_err(|e| (path.clone(), "open", e))?;
    let lock = Flock::lock(file, FlockArg::LockExclusive)
        .map_err(|(_, errno)| (path, "lock", io::Error::from(errno)))?;
    Ok(CounterLock { _lock: lock })
}

/// Draws the next run generation of `dir` for a server or relay run and returns its counters:
/// above every generation drawn before in `dir` by any role or instance, today's per-TUN files
/// included.
pub fn reserve_run(dir: &Path) -> Result<CounterRange, GenerationError> {
    let io = |(path, what, source)| GenerationError::Io { path, what, source };
    let _lock = lock(dir).map_err(io)?;
    let mut last = 0;
    let entries = fs::read_dir(dir).map_err(|e| io((dir.to_path_buf(), "list", e)))?;
    for entry in entries {
        let entry = entry.map_err(|e| io((dir.to_path_buf(), "list", e)))?;
        let path = entry.path();
        if path.extension().is_none_or(|x| x != "generation") {
            continue;
        }
        let text = fs::read_to_string(&path).map_err(|e| io((path.clone(), "read", e)))?;
        let g = text
            .trim()
            .parse::<u64>()
            .map_err(|_| GenerationError::Corrupt { path: path.clone() })?;
        last = last.max(g);
    }
    let path = dir.join(GENERATION_FILE);
    let g = last + 1;
    if g > MAX_GENERATION {
        return Err(GenerationError::Exhausted { path });
    }
    write_durably(&path, &format!("{g}\n")).map_err(io)?;
    Ok(CounterRange {
        first: g << RUN_BITS,
        end: (g + 1) << RUN_BITS,
    })
}

/// Replaces `path` with `text` durably: a temporary file beside it (mode 0600, created with
/// `O_EXCL | O_NOFOLLOW`: [`crate::daemon::files::create_temporary`]), fsync, rename into place, fsync
/// of the directory. A crash leaves the old or the new contents, never a mix. Errors name the
/// file and the step.
pub(crate) fn write_durably(
    path: &Path,
    text: &str,
) -> Result<(), (PathBuf, &'static str, io::Error)> {
    use std::io::Write as _;
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
    let mut f = crate::daemon::files::create_temporary(&tmp).map_err(at(&tmp, "create"))?;
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
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mt6d-psk-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn disjoint(runs: &[CounterRange]) {
        for (i, a) in runs.iter().enumerate() {
            assert!(a.first < a.end && a.first >= STATE_FILE_END, "{a:?}");
            for b in &runs[i + 1..] {
                assert!(
                    a.end <= b.first || b.end <= a.first,
                    "{a:?} and {b:?} overlap"
                );
            }
        }
    }

    #[test]
    fn every_run_gets_counters_no_earlier_run_had() {
        let d = dir("runs");
        let a = reserve_run(&d).unwrap();
        let b = reserve_run(&d).unwrap();
        assert_eq!(a.end, b.first);
        assert_eq!(a.first, 1 << RUN_BITS, "range 0 is the state files'");
        disjoint(&[a, b]);
        fs::write(d.join(GENERATION_FILE), "x\n").unwrap();
        let e = reserve_run(&d).unwrap_err();
        assert!(matches!(e, GenerationError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("psk.generation"), "{e}");
        fs::write(d.join(GENERATION_FILE), format!("{MAX_GENERATION}\n")).unwrap();
        assert!(matches!(
            reserve_run(&d),
            Err(GenerationError::Exhausted { .. })
        ));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn an_upgrade_honours_every_per_tun_generation_file() {
        // Before the shared file each server and relay kept `<role>-<tun>.generation`: the
        // first draw after an upgrade starts above the highest of them.
        let d = dir("upgrade");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("server-mt6ds0.generation"), "7\n").unwrap();
        fs::write(d.join("relay-mt6dr0.generation"), "12\n").unwrap();
        let r = reserve_run(&d).unwrap();
        assert_eq!(r.first, 13 << RUN_BITS);
        assert_eq!(reserve_run(&d).unwrap().first, 14 << RUN_BITS);
        // A corrupt old file is refused, not skipped.
        fs::write(d.join("server-old.generation"), "seven\n").unwrap();
        let e = reserve_run(&d).unwrap_err();
        assert!(e.to_string().contains("server-old.generation"), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn daemons_drawing_at_once_never_share_a_run() {
        // Two servers sharing a client key, or a relay and a server, started together.
        let d = dir("race");
        let runs: Vec<CounterRange> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| (0..4).map(|_| reserve_run(&d).unwrap()).collect::<Vec<_>>()))
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        assert_eq!(runs.len(), 32);
        disjoint(&runs);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn the_limit_is_rfc_9001s_for_aes_gcm() {
        assert_eq!(packet_limit(AeadAlg::Aes256Gcm), 1 << 23);
        assert_eq!(packet_limit(AeadAlg::ChaCha20Poly1305), STATE_FILE_END);
    }
}
