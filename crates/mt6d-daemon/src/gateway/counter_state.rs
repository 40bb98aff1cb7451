//! The persisted high-water mark of each pre-shared auth/encrypt stream's send counter
//! (docs/PROTOCOL.md §4.3). A pre-shared key never changes, so a nonce must never repeat across
//! restarts; the wall clock cannot promise that (boot before NTP, a stepped clock, a spoofed time
//! server). Instead the daemon writes, before any counter of a block is used, the end of that
//! block to `<state_dir>/psk-<id>.counter` and fsyncs it; a restarted daemon starts at the
//! recorded end. The next block is reserved by the main thread's timer when half of the current
//! one is used, so the packet threads never wait for the disk; if the disk falls behind they drop
//! (`seal_counter_not_reserved`) rather than use an unreserved counter.
//!
//! The file is named by a one-way function of the send data key, never by a peer or device
//! name, and every read and write holds the machine's counter lock (`crate::daemon::psk_counters`):
//! a reload that builds the peer again starts above what the old object reserved, and a second
//! daemon holding the same key on this state directory is noticed at the next reservation (the
//! mark moved under us) and answered by a sealer that continues above the other's mark. The
//! counters stay in range 0, `[0, 2^40)`, which no server or relay run draws.
//!
//! The mark is also the key's packet count: every counter below it was used or burnt, so the
//! sealer refuses past the key's packet limit (`psk_counters::packet_limit`) counted over every
//! run, and blocks are a 64th of the limit. A clean stop writes the mark back down to the first
//! counter never used ([`CounterState::release`]), so only a crash costs (one block) of it.
//!
//! Owns the state files; must not be used for handshake keys (fresh keys need no state).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use mt6d_proto::{AeadAlg, Sealer, Stream};

use crate::daemon::psk_counters::{self, packet_limit};

/// The most counters reserved per write: at 10 million packets per second a block lasts 6.7 s
/// and the next one is written 3.3 s ahead. Smaller for a key whose limit is small.
pub const BLOCK: u64 = 1 << 26;

/// Counters reserved per write for a key with `aead`: a 64th of its packet limit, at most
/// [`BLOCK`] (AES-256-GCM: 2^17, 13 ms at 10 million packets per second).
pub fn block(aead: AeadAlg) -> u64 {
    (packet_limit(aead) / 64).clamp(1, BLOCK)
}

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
}

/// What a reservation asks of the sealer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// Raise its limit to this counter ([`Sealer::reserve_until`]).
    Until(u64),
    /// Another holder of the key reserved past our mark: replace the sealer by one that
    /// counts from `first`, below `end` (the old one stops at its old limit).
    Restart { first: u64, end: u64 },
}

/// The reservation of one stream direction.
#[derive(Debug)]
pub struct CounterState {
    path: PathBuf,
    dir: PathBuf,
    /// Counters below this are on stable storage as used-or-reserved.
    reserved: u64,
    /// Counters reserved per write.
    block: u64,
    /// The key's packet limit: no counter at or above it is reserved or sealed.
    limit: u64,
    /// The last write failed (logged once until one succeeds).
    failing: bool,
}

impl CounterState {
    /// Reads the mark of `stream`'s send direction in `dir` (none yet: 0), reserves the block
    /// after it on stable storage, and returns the state and the sealer, which counts from the
    /// mark and refuses past the key's packet limit.
    pub fn open(dir: &Path, stream: &Stream) -> Result<(CounterState, Sealer), CounterStateError> {
        let id = stream.counter_state_id();
        let aead = stream.config().aead;
        let mut state = CounterState {
            path: dir.join(format!("psk-{id}.counter")),
            dir: dir.to_path_buf(),
            reserved: 0,
            block: block(aead),
            limit: packet_limit(aead),
            failing: false,
        };
        let _lock = psk_counters::lock(dir).map_err(CounterStateError::from)?;
        let first = state.read()?;
        state.reserved = first;
        state.persist(first)?;
        let sealer = stream
            .sealer(first, state.reserved)
            .with_key_limit(state.limit);
        Ok((state, sealer))
    }

    /// The reserved limit.
    pub fn reserved(&self) -> u64 {
        self.reserved
    }

    /// The key's packet limit (counters at or past it are never reserved or sealed).
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Reserves the next block once fewer than half a block of counters remain before the limit
    /// (`next`: the counter the sealer uses next). Returns what the sealer must be told.
    pub fn reserve_ahead(&mut self, next: u64) -> Result<Option<Reserved>, CounterStateError> {
        if self.reserved.saturating_sub(next) >= self.block / 2 || self.reserved >= self.limit {
            return Ok(None);
        }
        let result = self.reserve_locked(next);
        match &result {
            Ok(_) => self.failing = false,
            Err(_) => self.failing = true,
        }
        result.map(Some)
    }

    fn reserve_locked(&mut self, next: u64) -> Result<Reserved, CounterStateError> {
        let _lock = psk_counters::lock(&self.dir).map_err(CounterStateError::from)?;
        let mark = self.read()?;
        if mark > self.reserved {
            // Someone else reserved from our mark on: never use a counter of theirs.
            self.persist(mark)?;
            return Ok(Reserved::Restart {
                first: mark,
                end: self.reserved,
            });
        }
        // A sealer that fell behind burns the counters it refused: start the block past them.
        self.persist(self.reserved.max(next))?;
        Ok(Reserved::Until(self.reserved))
    }

    /// A clean stop: no counter at or above `next` was used and none will be (the caller
    /// retired the sealer, [`Sealer::retire`]), so the mark goes back down to `next` if the file
    /// still holds this object's reservation. The next start continues there instead of
    /// charging the key's packet limit with the rest of the block; only a crash spends it.
    pub fn release(&mut self, next: u64) -> Result<(), CounterStateError> {
        let _lock = psk_counters::lock(&self.dir).map_err(CounterStateError::from)?;
        if next >= self.reserved || self.read()? != self.reserved {
            return Ok(());
        }
        psk_counters::write_durably(&self.path, &format!("{next}\n"))?;
        self.reserved = next;
        Ok(())
    }

    /// Whether the last failure was already reported.
    pub fn failing(&self) -> bool {
        self.failing
    }

    /// The mark on stable storage (no file: 0).
    fn read(&self) -> Result<u64, CounterStateError> {
        match fs::read_to_string(&self.path) {
            Ok(text) => text
                .trim()
                .parse::<u64>()
                .map_err(|_| CounterStateError::Corrupt {
                    path: self.path.clone(),
                }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(0),
            Err(source) => Err(CounterStateError::Io {
                path: self.path.clone(),
                what: "read",
                source,
            }),
        }
    }

    /// Writes `from + block` (at most the limit) durably and only then raises the in-memory
    /// limit. At or past the limit nothing is written: the sealer refuses anyway.
    fn persist(&mut self, from: u64) -> Result<(), CounterStateError> {
        if from >= self.limit {
            self.reserved = self.reserved.max(from);
            return Ok(());
        }
        let end = from.saturating_add(self.block).min(self.limit);
        psk_counters::write_durably(&self.path, &format!("{end}\n"))?;
        self.reserved = end;
        Ok(())
    }
}

impl From<(PathBuf, &'static str, io::Error)> for CounterStateError {
    fn from((path, what, source): (PathBuf, &'static str, io::Error)) -> Self {
        CounterStateError::Io { path, what, source }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use mt6d_proto::{Endpoint, Epoch, SealError, SessionKey, StreamConfig};

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("mt6d-counter-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        d
    }

    fn stream(key: u8, aead: AeadAlg) -> Stream {
        let mut cfg = StreamConfig::new(
            Endpoint::new("2001:db8:a::1".parse().unwrap()),
            Endpoint::new("2001:db8:b::2".parse().unwrap()),
            SessionKey::from_bytes(&[key; 32]).unwrap(),
        );
        cfg.aead = aead;
        Stream::new(cfg).unwrap()
    }

    /// Seals a keepalive and returns its counter.
    fn seal(s: &Sealer, stream: &Stream) -> Result<u64, SealError> {
        let mut out = [0u8; 64];
        s.seal_keepalive(&stream.route(Epoch(1)), &mut out)?;
        Ok(u64::from_be_bytes(out[..8].try_into().unwrap()))
    }

    #[test]
    fn restarts_start_above_every_counter_reserved_before() {
        let d = dir("restart");
        let st = stream(0x5a, AeadAlg::ChaCha20Poly1305);
        let (mut s, sealer) = CounterState::open(&d, &st).unwrap();
        assert_eq!(seal(&sealer, &st), Ok(0));
        assert_eq!(s.reserved(), BLOCK);
        assert_eq!(s.reserve_ahead(10).unwrap(), None, "plenty left");
        assert_eq!(
            s.reserve_ahead(BLOCK / 2 + 1).unwrap(),
            Some(Reserved::Until(2 * BLOCK))
        );
        // A crash here: the next run starts past everything reserved, whatever the clock says.
        drop(s);
        let (s2, sealer2) = CounterState::open(&d, &st).unwrap();
        assert_eq!(seal(&sealer2, &st), Ok(2 * BLOCK));
        assert_eq!(s2.reserved(), 3 * BLOCK);
        let other = stream(0x5b, AeadAlg::ChaCha20Poly1305);
        let (_, sealer3) = CounterState::open(&d, &other).unwrap();
        assert_eq!(seal(&sealer3, &other), Ok(0), "each key has its own file");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_corrupt_file_is_refused_not_guessed() {
        let d = dir("corrupt");
        let st = stream(1, AeadAlg::Aes256Gcm);
        fs::create_dir_all(&d).unwrap();
        let path = d.join(format!("psk-{}.counter", st.counter_state_id()));
        fs::write(&path, "twelve\n").unwrap();
        let e = CounterState::open(&d, &st).unwrap_err();
        assert!(matches!(e, CounterStateError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains(&path.display().to_string()), "{e}");
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_clean_stop_gives_back_the_unused_rest_of_the_block() {
        // Without it every restart of an AES key's gateway would spend 2^17 of its 2^23 packets.
        let d = dir("release");
        let st = stream(5, AeadAlg::Aes256Gcm);
        let (mut s, sealer) = CounterState::open(&d, &st).unwrap();
        for want in 0..3 {
            assert_eq!(seal(&sealer, &st), Ok(want));
        }
        s.release(sealer.retire()).unwrap();
        assert!(seal(&sealer, &st).is_err(), "retired");
        let (mut s2, again) = CounterState::open(&d, &st).unwrap();
        assert_eq!(
            seal(&again, &st),
            Ok(3),
            "continues above every counter used"
        );
        // Another holder moved the mark since: it is never lowered.
        let (_other, _) = CounterState::open(&d, &st).unwrap();
        s2.release(again.retire()).unwrap();
        let (_, third) = CounterState::open(&d, &st).unwrap();
        let b = block(AeadAlg::Aes256Gcm);
        assert_eq!(seal(&third, &st), Ok(3 + 2 * b));
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_sealer_that_fell_behind_gets_a_block_past_its_counter() {
        let d = dir("behind");
        let st = stream(2, AeadAlg::ChaCha20Poly1305);
        let (mut s, _) = CounterState::open(&d, &st).unwrap();
        // The sealer burnt counters past the limit while the disk was slow.
        assert_eq!(
            s.reserve_ahead(BLOCK + 5).unwrap(),
            Some(Reserved::Until(2 * BLOCK + 5))
        );
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_pre_shared_aes_key_stops_at_its_packet_limit_across_restarts() {
        // RFC 9001 §6.6's 2^23 packets under one AES-GCM key, counted over every run.
        let d = dir("limit");
        let st = stream(3, AeadAlg::Aes256Gcm);
        fs::create_dir_all(&d).unwrap();
        let path = d.join(format!("psk-{}.counter", st.counter_state_id()));
        fs::write(&path, format!("{}\n", (1u64 << 23) - 2)).unwrap();
        let (mut state, sealer) = CounterState::open(&d, &st).unwrap();
        assert_eq!(
            state.reserved(),
            1 << 23,
            "reserved up to the limit, not past it"
        );
        assert!(seal(&sealer, &st).is_ok());
        assert!(seal(&sealer, &st).is_ok());
        assert_eq!(
            seal(&sealer, &st),
            Err(SealError::KeyLimit),
            "sealed past the limit"
        );
        assert!(sealer.take_key_limit_notice());
        assert_eq!(state.reserve_ahead(1 << 23).unwrap(), None);
        // A restart does not give the key a new budget.
        drop(state);
        let (_, again) = CounterState::open(&d, &st).unwrap();
        assert_eq!(seal(&again, &st), Err(SealError::KeyLimit));
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            format!("{}\n", 1u64 << 23)
        );
        // Blocks are a 64th of the limit: a crash costs at most that.
        assert_eq!(block(AeadAlg::Aes256Gcm), 1 << 17);
        fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_second_holder_of_the_key_is_never_given_a_counter_of_the_first() {
        // Two daemons on one state directory with the same pre-shared key, or a reload whose
        // new peer object opened the file while the old one still seals.
        let d = dir("shared");
        let st = stream(4, AeadAlg::Aes256Gcm);
        let b = block(AeadAlg::Aes256Gcm);
        let (mut one, s1) = CounterState::open(&d, &st).unwrap();
        let (mut two, s2) = CounterState::open(&d, &st).unwrap();
        assert_eq!(seal(&s1, &st), Ok(0));
        assert_eq!(
            seal(&s2, &st),
            Ok(b),
            "starts above the first's reservation"
        );
        // The first runs low: the mark moved under it, so its next counters start above the
        // second's reservation, in a new sealer.
        let r = one.reserve_ahead(b - 1).unwrap();
        assert_eq!(
            r,
            Some(Reserved::Restart {
                first: 2 * b,
                end: 3 * b
            })
        );
        let r2 = two.reserve_ahead(2 * b - 1).unwrap();
        assert_eq!(
            r2,
            Some(Reserved::Restart {
                first: 3 * b,
                end: 4 * b
            })
        );
        fs::remove_dir_all(&d).unwrap();
    }
}
