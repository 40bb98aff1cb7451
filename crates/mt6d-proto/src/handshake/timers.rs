//! When a [`Handshake`] initiates (docs/PROTOCOL.md §9.3, §9.9): retries with back-off,
//! rekeys, a peer that stopped answering, packets for an empty key slot, and
//! [`Handshake::poll`] / [`Handshake::poll_timeout`].

use std::time::Duration;

use super::message::INITIATION_LEN;

use super::{
    elapsed, Handshake, MacKey, EMPTY_SLOT_HOLDOFF, NON_PREFERRED_REKEY_DELAY, PENDING_LIFETIME,
    REJECT_AFTER_REKEYS,
};
use crate::{Route, UnixTime};

impl Handshake {
    /// The peer answered none of our data for the liveness bound (docs/PROTOCOL.md §9.9): it
    /// probably lost our session (a restart). An initiation is due at once, and this handshake's
    /// initiations go on the link set ([`Handshake::recovering`]) with retries at most
    /// [`RECOVERY_RETRY_MAX`](super::RECOVERY_RETRY_MAX) apart, until one completes. Returns
    /// whether it started one (not when answering only, nor while such a handshake is already under
    /// way).
    pub fn liveness_failed(&mut self) -> bool {
        if self.responder_only || self.recovering {
            return false;
        }
        self.recovering = true;
        self.want = true;
        self.retry_at = None;
        self.stats.liveness_failures += 1;
        true
    }

    /// Ask for a handshake at the next [`Handshake::poll`] (no send key). Retries of a handshake
    /// already under way keep their backoff.
    pub fn want_handshake(&mut self) {
        self.want = true;
    }

    /// The path to the peer just came up (over relays: the first route to its edge gateway,
    /// docs/PROTOCOL.md §10.5). Without keys, an unfinished handshake's next initiation is due
    /// at once and its backoff starts again: the attempts so far were sent where nothing could
    /// arrive. With keys, or answering only, nothing changes.
    pub fn path_up(&mut self) {
        if self.responder_only || self.established.is_some() {
            return;
        }
        self.attempts = 0;
        self.retry_at = None;
        self.want = true;
    }

    /// A packet arrived for a key phase we hold no key for (`open_no_key`). Such a packet is 32
    /// forged bytes away for anyone, so it asks for a handshake only if no fresh confirmed key
    /// exists (newer than the rekey interval) and none was asked for this way in the last
    /// [`EMPTY_SLOT_HOLDOFF`]. Returns whether it asked.
    pub fn packet_for_empty_slot(&mut self, now: UnixTime) -> bool {
        let fresh = self.confirmed_recv.is_some()
            && self
                .established
                .is_some_and(|at| elapsed(at, now) < self.cfg.rekey_after);
        let recent = self
            .empty_slot_at
            .is_some_and(|at| elapsed(at, now) < EMPTY_SLOT_HOLDOFF);
        if fresh || recent {
            return false;
        }
        self.empty_slot_at = Some(now);
        self.want = true;
        true
    }

    /// The initiation to send on `send_route` now, if one is due: no keys yet, keys wanted, the
    /// rekey interval or packet budget reached (`sent` = packets under the current send key), or
    /// the retry time of an unanswered handshake reached ([`RETRY_AFTER`](super::RETRY_AFTER)
    /// doubling to [`RETRY_MAX`](super::RETRY_MAX), with jitter). Older initiations stay answerable
    /// for [`PENDING_LIFETIME`]. `entropy` gives 32 fresh random bytes and is called only when an
    /// initiation is made (None: no randomness, no initiation).
    pub fn poll(
        &mut self,
        now: UnixTime,
        send_route: &Route,
        sent: u64,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Option<[u8; INITIATION_LEN]> {
        self.poll_on(now, send_route, None, sent, entropy)
    }

    /// [`Handshake::poll`] for a route of the route set whose MAC key is `mac` (None: the link
    /// set's, docs/PROTOCOL.md §9.8).
    pub fn poll_on(
        &mut self,
        now: UnixTime,
        send_route: &Route,
        mac: Option<&MacKey>,
        sent: u64,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Option<[u8; INITIATION_LEN]> {
        if !self.initiation_due(now, sent) {
            return None;
        }
        let initiation = self.initiate(now, send_route, mac, entropy()?).ok();
        // The Noise message left the ephemeral key and chaining values in frames below this one.
        crate::secrets::scrub_stack();
        initiation
    }

    /// Whether [`Handshake::poll_on`] would make an initiation at `now` (`sent`: packets under
    /// the current send key). Forgets initiations older than [`PENDING_LIFETIME`]. Lets a caller
    /// build the route only when one is due.
    pub fn initiation_due(&mut self, now: UnixTime, sent: u64) -> bool {
        self.pending
            .retain(|p| elapsed(p.sent_at, now) < PENDING_LIFETIME);
        if self.responder_only {
            return false;
        }
        if self.retry_at.is_some_and(|at| now < at) {
            return false;
        }
        // We answered the peer's initiation and wait for its first packet: its handshake is the
        // one under way (a second one would race it). If our answer was lost, the peer retries.
        if self.awaiting.is_some()
            && self
                .answered_at
                .is_some_and(|at| elapsed(at, now) < PENDING_LIFETIME)
        {
            return false;
        }
        self.retry_at.is_some()
            || self.want
            || sent >= self.cfg.rekey_after_packets
            || self
                .established
                .is_none_or(|at| elapsed(at, now) >= self.rekey_interval())
    }

    /// The earliest instant at which [`Handshake::initiation_due`] can turn true without a new
    /// input (a message, [`Handshake::want_handshake`]), or at which keys expire
    /// ([`Handshake::keys_expired`], counted only while `holds_keys`). `UnixTime` 0 means at
    /// once. The packet budget (`rekey_after_packets`) is not a time: callers check it when
    /// they poll.
    pub fn poll_timeout(&self, holds_keys: bool) -> Option<UnixTime> {
        let after = |at: UnixTime, d: Duration| {
            UnixTime::from_nanos(at.as_nanos().saturating_add(d.as_nanos() as u64))
        };
        if self.responder_only {
            // Only the keys' expiry is a time.
            let limit = self.cfg.rekey_after * REJECT_AFTER_REKEYS + Duration::from_nanos(1);
            return self
                .established
                .filter(|_| holds_keys)
                .map(|at| after(at, limit));
        }
        // Nothing can be due before these gates open.
        let mut gate = self.retry_at.unwrap_or(UnixTime::from_nanos(0));
        if self.awaiting.is_some() {
            if let Some(at) = self.answered_at {
                gate = gate.max(after(at, PENDING_LIFETIME));
            }
        }
        let due = match self.established {
            _ if self.retry_at.is_some() || self.want => UnixTime::from_nanos(0),
            None => UnixTime::from_nanos(0),
            Some(at) => after(at, self.rekey_interval()),
        };
        let mut next = gate.max(due);
        if holds_keys {
            if let Some(at) = self.established {
                // keys_expired is strict: the first instant past the limit.
                let limit = self.cfg.rekey_after * REJECT_AFTER_REKEYS + Duration::from_nanos(1);
                next = next.min(after(at, limit));
            }
        }
        Some(next)
    }

    /// The preferred initiator rekeys first; the other side waits a little longer so the two do
    /// not race every time.
    pub(super) fn rekey_interval(&self) -> Duration {
        if self.preferred {
            self.cfg.rekey_after
        } else {
            self.cfg.rekey_after + NON_PREFERRED_REKEY_DELAY
        }
    }
}
