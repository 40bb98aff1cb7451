//! The epoch schedule: which epoch a wall-clock instant belongs to, when each epoch starts, and the
//! value types a daemon acts on (`Route`, `Schedule`). Owns the jitter rule (docs/PROTOCOL.md §3).
//!
//! `boundary(k) = k*R + j(k)` milliseconds since the Unix epoch, with `j(k) = 0` without jitter and
//! `j(k) = u64_be(BLAKE3-keyed(jitter key, k as u64 BE)[0..8]) mod (R/2)` with it. Since
//! `0 <= j < R/2`, consecutive boundaries are more than `R/2` apart and strictly increasing.
//! This replaces Eq. 3.1 (000 §3.2.2), whose `mod 10` assumes R = 10 s and whose startup offset lets
//! two gateways started at different times disagree on the salt.

use std::net::SocketAddrV6;

use crate::key::Subkey;
use crate::UnixTime;

/// An epoch number: the thesis's salt (Eq. 3.1) generalised to `floor`-style numbering of boundaries.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Epoch(pub u64);

impl Epoch {
    /// The previous epoch (saturating at 0).
    pub fn prev(self) -> Epoch {
        Epoch(self.0.saturating_sub(1))
    }
    /// The next epoch (saturating).
    pub fn next(self) -> Epoch {
        Epoch(self.0.saturating_add(1))
    }
}

/// Outer addresses and ports of one epoch, from this gateway's point of view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Route {
    /// The epoch the route belongs to.
    pub epoch: Epoch,
    /// This gateway's hashed address and UDP port (source when sending).
    pub local: SocketAddrV6,
    /// The peer's hashed address and UDP port (destination when sending).
    pub remote: SocketAddrV6,
}

/// What to do at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Schedule {
    /// The route to send on: the route of the current epoch.
    pub send: Route,
    /// Routes to accept packets on: epochs e-1, e, e+1 (clock skew and packets in flight).
    pub accept: [Route; 3],
    /// When the epoch changes next (then call `schedule` again).
    pub next_change: UnixTime,
}

/// Maps instants to epochs and back for one rotation interval and jitter setting.
#[derive(Clone, Debug)]
pub struct EpochClock {
    rotation_ms: u64,
    jitter: Option<Subkey>,
}

impl EpochClock {
    /// `rotation_ms` must be >= 1000 (checked by `Stream::new`; here values < 2 just disable jitter).
    pub(crate) fn new(rotation_ms: u64, jitter: Option<Subkey>) -> Self {
        Self {
            rotation_ms: rotation_ms.max(1),
            jitter,
        }
    }

    /// The rotation interval R in milliseconds.
    pub fn rotation_ms(&self) -> u64 {
        self.rotation_ms
    }

    /// j(k) in milliseconds, in `0..R/2`.
    pub fn jitter_ms(&self, k: u64) -> u64 {
        let half = self.rotation_ms / 2;
        match &self.jitter {
            Some(key) if half > 0 => {
                let h = blake3::keyed_hash(key.as_bytes(), &k.to_be_bytes());
                let mut b = [0u8; 8];
                b.copy_from_slice(&h.as_bytes()[..8]);
                u64::from_be_bytes(b) % half
            }
            _ => 0,
        }
    }

    /// boundary(k) in milliseconds since the Unix epoch (saturating).
    pub fn boundary_ms(&self, k: u64) -> u64 {
        k.saturating_mul(self.rotation_ms)
            .saturating_add(self.jitter_ms(k))
    }

    /// The epoch containing `now`: the largest k with boundary(k) <= now (0 before boundary(0)).
    pub fn epoch_at(&self, now: UnixTime) -> Epoch {
        let ms = now.as_millis();
        let k = ms / self.rotation_ms;
        // boundary(k) is in [kR, kR + R/2) and boundary(k+1) >= (k+1)R > ms, so the answer is k or k-1.
        if ms >= self.boundary_ms(k) {
            Epoch(k)
        } else {
            Epoch(k.saturating_sub(1))
        }
    }

    /// The instant epoch `e` starts.
    pub fn epoch_start(&self, e: Epoch) -> UnixTime {
        UnixTime::from_millis(self.boundary_ms(e.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::context;
    use crate::SessionKey;

    fn jittered(r: u64) -> EpochClock {
        let k = SessionKey::from_bytes(&[9; 32]).unwrap();
        EpochClock::new(r, Some(Subkey::derive(context::JITTER, &k)))
    }

    #[test]
    fn without_jitter_is_floor() {
        let c = EpochClock::new(10_000, None);
        assert_eq!(c.epoch_at(UnixTime::from_millis(0)), Epoch(0));
        assert_eq!(c.epoch_at(UnixTime::from_millis(9_999)), Epoch(0));
        assert_eq!(c.epoch_at(UnixTime::from_millis(10_000)), Epoch(1));
        assert_eq!(c.epoch_start(Epoch(3)), UnixTime::from_millis(30_000));
    }

    #[test]
    fn jitter_boundaries_are_exact_and_monotonic() {
        let c = jittered(1_000);
        let base = 1_700_000_000_000 / 1_000;
        for k in base..base + 500 {
            let b = c.boundary_ms(k);
            assert!(c.jitter_ms(k) < 500);
            assert!(c.boundary_ms(k + 1) > b + 500);
            assert_eq!(c.epoch_at(UnixTime::from_millis(b)), Epoch(k));
            assert_eq!(c.epoch_at(UnixTime::from_millis(b - 1)), Epoch(k - 1));
            assert_eq!(c.epoch_start(Epoch(k)), UnixTime::from_millis(b));
        }
        assert!((base..base + 100).any(|k| c.jitter_ms(k) != 0));
    }

    #[test]
    fn extreme_times_do_not_panic() {
        let c = jittered(1_000);
        let _ = c.epoch_at(UnixTime::from_nanos(u64::MAX));
        let _ = c.epoch_at(UnixTime::from_nanos(0));
        let _ = c.epoch_start(Epoch(u64::MAX));
        assert_eq!(Epoch(0).prev(), Epoch(0));
    }
}
