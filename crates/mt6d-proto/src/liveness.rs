//! Liveness (docs/PROTOCOL.md §9.9): WireGuard's two timers, adapted to hashed routes. A side
//! that sent data and heard nothing authenticated from its peer for [`LIVENESS_AFTER`] (plus a
//! random part of [`LIVENESS_JITTER`]) assumes the peer lost its session (a restart) and starts
//! a handshake on the link set; a side that received data and sent nothing back answers with a
//! keepalive at a random instant within [`KEEPALIVE_WITHIN`], so a one-way flow does not look
//! dead to its sender.
//!
//! Sans-IO and lock-free towards the packet path: the packet threads only move counters (the
//! send key's [`crate::Sealer::sealed`] and the route sets' [`crate::route_sets::Heard`]); the
//! link samples them whenever its timeout runs (at least once a second while it holds a key)
//! and [`Liveness::observe`] turns two samples into deadlines. Nothing here sends or reads a
//! clock.
//!
//! Delays are drawn from a keyed PRF ([`Delays`]) under a key derived from the link key: an
//! observer without the peer's keys cannot predict them, and simulations are reproducible.

use std::time::Duration;

use zeroize::Zeroizing;

use crate::UnixTime;

/// A side that received data and sent nothing since answers with a keepalive at a random instant
/// between half this and this long after noticing it (so at most about one keepalive per half
/// of it, whatever the flow).
pub const KEEPALIVE_WITHIN: Duration = Duration::from_secs(1);
/// A side that sent data and has heard no authenticated packet since starts a handshake on the
/// link set this long after noticing it, plus a random part of [`LIVENESS_JITTER`]. Longer than
/// the peer's keepalive bound ([`KEEPALIVE_WITHIN`] after the peer's sample, itself at most a
/// second late) plus a round trip of up to one second.
pub const LIVENESS_AFTER: Duration = Duration::from_secs(3);
/// The random part of the liveness deadline: clients of one restarted server do not all start
/// their handshakes in the same instant.
pub const LIVENESS_JITTER: Duration = Duration::from_millis(500);

/// The counters the link samples: what the packet path did since the link began.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sample {
    /// Data packets sealed under the current send key (keepalives the link made excluded).
    pub sent_data: u64,
    /// Numbers the send key: a new key restarts `sent_data` at zero.
    pub send_key: u64,
    /// Authenticated packets received (data, keepalives, accepted handshake messages).
    pub received: u64,
    /// Data packets received.
    pub received_data: u64,
}

/// What a sample made due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Due {
    /// Send a keepalive now.
    pub keepalive: bool,
    /// The peer did not answer our data: start a handshake on the link set now.
    pub handshake: bool,
}

/// A keyed PRF for the random delays: BLAKE3 keyed by a key derived from the link key, over a
/// counter and the instant.
pub struct Delays {
    key: Zeroizing<[u8; 32]>,
    draws: u64,
}

impl std::fmt::Debug for Delays {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delays")
            .field("draws", &self.draws)
            .finish_non_exhaustive()
    }
}

impl Delays {
    /// Delays keyed by `link` (the link key, or a pre-shared stream key).
    pub fn new(link: &crate::SessionKey) -> Delays {
        Delays {
            key: Zeroizing::new(blake3::derive_key(
                "mt6d-proto 2026-11-28 liveness delays",
                link.as_bytes(),
            )),
            draws: 0,
        }
    }

    /// A delay in `[0, max)`.
    fn draw(&mut self, now: UnixTime, max: Duration) -> Duration {
        self.draws = self.draws.wrapping_add(1);
        let mut input = [0u8; 16];
        input[..8].copy_from_slice(&self.draws.to_be_bytes());
        input[8..].copy_from_slice(&now.as_nanos().to_be_bytes());
        let h = blake3::keyed_hash(&self.key, &input);
        let mut r = [0u8; 8];
        r.copy_from_slice(&h.as_bytes()[..8]);
        let span = (max.as_nanos() as u64).max(1);
        Duration::from_nanos(u64::from_be_bytes(r) % span)
    }
}

/// One peer's liveness timers (see the module documentation).
#[derive(Debug, Default)]
pub struct Liveness {
    last: Option<Sample>,
    /// When our data was first seen unanswered (nothing received since).
    unanswered_since: Option<UnixTime>,
    handshake_at: Option<UnixTime>,
    keepalive_at: Option<UnixTime>,
}

fn after(at: UnixTime, d: Duration) -> UnixTime {
    UnixTime::from_nanos(at.as_nanos().saturating_add(d.as_nanos() as u64))
}

impl Liveness {
    /// Compares `s` with the previous sample (the first one only sets the baseline), updates the
    /// deadlines and says what is due at `now`.
    pub fn observe(&mut self, now: UnixTime, s: Sample, delays: &mut Delays) -> Due {
        let Some(last) = self.last.replace(s) else {
            return Due::default();
        };
        let sent = if s.send_key == last.send_key {
            s.sent_data != last.sent_data
        } else {
            s.sent_data > 0
        };
        if s.received != last.received {
            self.unanswered_since = None;
            self.handshake_at = None;
        }
        if sent {
            // Our data tells the peer we are alive: no keepalive owed.
            self.keepalive_at = None;
            if self.unanswered_since.is_none() {
                self.unanswered_since = Some(now);
                let d = LIVENESS_AFTER + delays.draw(now, LIVENESS_JITTER);
                self.handshake_at = Some(after(now, d));
            }
        } else if s.received_data != last.received_data && self.keepalive_at.is_none() {
            // Never at a fixed offset from the data it answers (§9.9).
            let d = KEEPALIVE_WITHIN / 2 + delays.draw(now, KEEPALIVE_WITHIN / 2);
            self.keepalive_at = Some(after(now, d));
        }
        let mut due = Due::default();
        if self.keepalive_at.is_some_and(|t| t <= now) {
            self.keepalive_at = None;
            due.keepalive = true;
        }
        if self.handshake_at.is_some_and(|t| t <= now) {
            self.handshake_at = None;
            self.unanswered_since = None;
            due.handshake = true;
        }
        due
    }

    /// The earliest deadline (keepalive or handshake), if any.
    pub fn poll_timeout(&self) -> Option<UnixTime> {
        match (self.keepalive_at, self.handshake_at) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// No send key any more: forget everything (the next key starts a new baseline).
    pub fn reset(&mut self) {
        *self = Liveness::default();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_800_000_000_000 + ms)
    }

    fn delays() -> Delays {
        Delays::new(&crate::SessionKey::from_bytes(&[3; 32]).unwrap())
    }

    fn sample(sent: u64, rx: u64, rx_data: u64) -> Sample {
        Sample {
            sent_data: sent,
            send_key: 1,
            received: rx,
            received_data: rx_data,
        }
    }

    #[test]
    fn data_sent_and_never_answered_asks_for_a_handshake_within_the_bound_and_once() {
        let (mut l, mut d) = (Liveness::default(), delays());
        assert_eq!(l.observe(at(0), sample(0, 0, 0), &mut d), Due::default());
        assert_eq!(l.observe(at(1000), sample(5, 0, 0), &mut d), Due::default());
        let deadline = l.poll_timeout().unwrap();
        assert!(deadline >= at(4000) && deadline < at(4500), "{deadline:?}");
        // More data, still nothing back: the deadline stays that of the first unanswered.
        l.observe(at(2000), sample(9, 0, 0), &mut d);
        assert_eq!(l.poll_timeout(), Some(deadline));
        let due = l.observe(deadline, sample(12, 0, 0), &mut d);
        assert!(due.handshake && !due.keepalive);
        // The next unanswered data starts a new wait, not an immediate second handshake.
        let due = l.observe(
            after(deadline, Duration::from_secs(1)),
            sample(15, 0, 0),
            &mut d,
        );
        assert!(!due.handshake);
    }

    #[test]
    fn anything_heard_from_the_peer_cancels_the_handshake() {
        let (mut l, mut d) = (Liveness::default(), delays());
        l.observe(at(0), sample(0, 0, 0), &mut d);
        l.observe(at(1000), sample(5, 0, 0), &mut d);
        // A keepalive arrived (no data): the peer is alive.
        let due = l.observe(at(2000), sample(5, 1, 0), &mut d);
        assert_eq!(due, Due::default());
        assert_eq!(l.poll_timeout(), None);
        assert!(!l.observe(at(10_000), sample(5, 1, 0), &mut d).handshake);
    }

    #[test]
    fn data_received_and_not_answered_is_answered_by_a_keepalive_at_a_random_instant() {
        let mut offsets = Vec::new();
        for run in 0..16u64 {
            let (mut l, mut d) = (Liveness::default(), delays());
            let t0 = at(run * 7919);
            l.observe(t0, sample(0, 0, 0), &mut d);
            l.observe(after(t0, Duration::from_secs(1)), sample(0, 3, 3), &mut d);
            let due_at = l.poll_timeout().unwrap();
            let offset = due_at.as_nanos() - after(t0, Duration::from_secs(1)).as_nanos();
            assert!(offset >= KEEPALIVE_WITHIN.as_nanos() as u64 / 2);
            assert!(offset < KEEPALIVE_WITHIN.as_nanos() as u64);
            offsets.push(offset);
            let due = l.observe(due_at, sample(0, 3, 3), &mut d);
            assert!(due.keepalive && !due.handshake);
            // A keepalive is not data: receiving only keepalives owes none back.
            l.observe(
                after(due_at, Duration::from_secs(1)),
                sample(0, 4, 3),
                &mut d,
            );
            assert_eq!(l.poll_timeout(), None);
        }
        offsets.sort_unstable();
        offsets.dedup();
        assert!(offsets.len() > 12, "not a fixed offset: {offsets:?}");
    }

    #[test]
    fn our_own_data_replaces_the_keepalive_and_a_new_key_is_a_new_baseline() {
        let (mut l, mut d) = (Liveness::default(), delays());
        l.observe(at(0), sample(0, 0, 0), &mut d);
        l.observe(at(1000), sample(0, 2, 2), &mut d);
        assert!(l.poll_timeout().is_some());
        // We sent data before the keepalive was due: none goes out.
        let due = l.observe(at(1100), sample(1, 2, 2), &mut d);
        assert!(!due.keepalive);
        // A new send key whose counter restarted below the old one's still counts as sent.
        let s = Sample {
            sent_data: 1,
            send_key: 2,
            received: 3,
            received_data: 3,
        };
        assert_eq!(l.observe(at(1200), s, &mut d), Due::default());
        assert!(l.poll_timeout().is_some());
    }
}
