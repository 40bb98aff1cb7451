//! The messages of one exchange (docs/PROTOCOL.md §9.3 to §9.5): making an initiation, answering
//! one within the response rate limit, completing with a response, and the keys both sides
//! derive.

use zeroize::Zeroizing;

use super::state::NoiseState;

use super::identity::session_route_key;
use super::message::{Kind, Message, INITIATION_LEN, RESPONSE_LEN};

use super::message::{frame, INITIATION_PAYLOAD_LEN, NOISE_INITIATION_LEN, NOISE_RESPONSE_LEN};
use super::{
    Handshake, HandshakeError, MacKey, Outcome, SessionKeys, MAX_FUTURE_SKEW, MAX_PENDING,
    RECOVERY_RETRY_MAX, RESPONSES_PER_SEC, RETRY_AFTER, RETRY_MAX, SEEN_EPHEMERALS,
};
use crate::tunnel::KeyPhase;
use crate::{AeadAlg, Epoch, Opener, Route, Sealer, SessionKey, UnixTime};

pub(super) struct Pending {
    pub(super) index: u32,
    /// The epoch of the route the initiation was sent on.
    pub(super) epoch: Epoch,
    pub(super) state: NoiseState,
    pub(super) recv_phase: KeyPhase,
    pub(super) sent_at: UnixTime,
}

/// A token bucket over [`RESPONSES_PER_SEC`], in milli-tokens.
#[derive(Debug, Clone, Copy)]
pub(super) struct Bucket {
    pub(super) milli: u64,
    pub(super) at: UnixTime,
}

impl Bucket {
    pub(super) const FULL: u64 = RESPONSES_PER_SEC as u64 * 1000;
    pub(super) fn take(&mut self, now: UnixTime) -> bool {
        let elapsed_ms = now.as_millis().saturating_sub(self.at.as_millis());
        self.milli = (self.milli + elapsed_ms * u64::from(RESPONSES_PER_SEC)).min(Self::FULL);
        self.at = now;
        if self.milli >= 1000 {
            self.milli -= 1000;
            true
        } else {
            false
        }
    }
}

impl Handshake {
    pub(super) fn builder(&self, entropy: [u8; 32]) -> snow::Builder<'_> {
        snow::Builder::with_resolver(
            self.params.clone(),
            Box::new(super::rng::EntropyResolver::new(entropy)),
        )
    }

    pub(super) fn initiate(
        &mut self,
        now: UnixTime,
        route: &Route,
        mac: Option<&MacKey>,
        entropy: [u8; 32],
    ) -> Result<[u8; INITIATION_LEN], snow::Error> {
        let private = self.cfg.local_private.to_bytes();
        let state = self
            .builder(entropy)
            .local_private_key(&private[..])?
            .remote_public_key(self.cfg.remote_public.as_bytes())?
            .prologue(&self.prologue)?
            .build_initiator()?;
        let mut state = NoiseState::new(state, self.cfg.psk.as_bytes())?;
        let recv_phase = self.next_recv_phase();
        // The index and the jitter come from the same entropy as the ephemeral key, through a
        // separate derivation (the ephemeral's own stream is `super::rng::EntropyResolver`'s).
        let extra =
            blake3::derive_key("mt6d-proto 2026-11-23 handshake index and jitter", &entropy);
        let index = u32::from_be_bytes([extra[0], extra[1], extra[2], extra[3]]);
        let jitter = u64::from(u16::from_be_bytes([extra[4], extra[5]]));
        self.own_timestamp = self.own_timestamp.saturating_add(1).max(now.as_nanos());
        let mut payload = [0u8; INITIATION_PAYLOAD_LEN];
        payload[..8].copy_from_slice(&self.own_timestamp.to_be_bytes());
        payload[8] = recv_phase.index() as u8;
        let mut noise = [0u8; NOISE_INITIATION_LEN];
        let n = state.write_message(&payload, &mut noise)?;
        debug_assert_eq!(n, NOISE_INITIATION_LEN);
        let mut out = [0u8; INITIATION_LEN];
        frame(
            Kind::Initiation,
            index,
            &noise,
            &mac.unwrap_or(&self.mac_key).0,
            &route.local,
            &route.remote,
            &mut out,
        );
        self.remember(&noise[..32], route.epoch);
        // An index still in use (chance 2^-32) would make the older attempt unreachable: drop it.
        self.pending.retain(|p| p.index != index);
        if self.pending.len() >= MAX_PENDING {
            self.pending.remove(0);
        }
        self.pending.push(Pending {
            index,
            epoch: route.epoch,
            state,
            recv_phase,
            sent_at: now,
        });
        self.attempts = self.attempts.saturating_add(1);
        let cap = if self.recovering {
            RECOVERY_RETRY_MAX
        } else {
            RETRY_MAX
        };
        let base = RETRY_AFTER
            .saturating_mul(1 << self.attempts.saturating_sub(1).min(8))
            .min(cap);
        // Jitter: up to a quarter of the interval, so two gateways that failed together do not
        // retry in lockstep.
        let extra_ns = (base.as_nanos() as u64 / 4).saturating_mul(jitter) / 65_536;
        self.retry_at = Some(UnixTime::from_nanos(
            now.as_nanos()
                .saturating_add(base.as_nanos() as u64)
                .saturating_add(extra_ns),
        ));
        self.want = false;
        self.stats.initiations_sent += 1;
        Ok(out)
    }

    /// The handshake is done (completed, or the peer's won): no more retries.
    pub(super) fn settle(&mut self) {
        self.pending.clear();
        self.recovering = false;
        self.attempts = 0;
        self.retry_at = None;
        self.want = false;
    }

    /// New receive keys go to the slot the newest confirmed key does not use.
    pub(super) fn next_recv_phase(&self) -> KeyPhase {
        self.confirmed_recv.map_or(KeyPhase::Zero, KeyPhase::flip)
    }

    /// Remembers an ephemeral key sent or received on a route of `epoch`. A route is accepted
    /// from the epoch before its own to the one after (§3), so entries two epochs older than the
    /// newest can no longer pass a MAC and are forgotten.
    pub(super) fn remember(&mut self, ephemeral: &[u8], epoch: Epoch) {
        let mut key = [0u8; 32];
        key.copy_from_slice(ephemeral);
        let newest = self
            .seen
            .values()
            .map(|e| e.0)
            .max()
            .unwrap_or(0)
            .max(epoch.0);
        self.seen.retain(|_, e| e.0.saturating_add(2) >= newest);
        if self.seen.len() >= SEEN_EPHEMERALS {
            let oldest = self.seen.values().map(|e| e.0).min().unwrap_or(0);
            self.seen.retain(|_, e| e.0 != oldest);
        }
        self.seen.insert(key, epoch);
    }

    pub(super) fn seen(&self, ephemeral: &[u8]) -> bool {
        <&[u8; 32]>::try_from(ephemeral).is_ok_and(|k| self.seen.contains_key(k))
    }

    /// Handles a handshake message that arrived on accept route `arrived_on` (its outer source is
    /// `arrived_on.remote`). A response, if any, is framed for `reply_route` (the current send
    /// route). `entropy` is called only for a message that passed every cheap check and needs a
    /// response. Every rejection is counted in [`Handshake::stats`].
    pub fn handle(
        &mut self,
        now: UnixTime,
        arrived_on: &Route,
        reply_route: &Route,
        bytes: &[u8],
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        self.handle_on(now, arrived_on, reply_route, None, bytes, entropy)
    }

    /// [`Handshake::handle`] for a message that arrived on a route of the route set whose MAC
    /// key is `mac` (None: the link set's); the reply, if any, is framed with the same key, for a
    /// route of the same set (docs/PROTOCOL.md §9.8).
    pub fn handle_on(
        &mut self,
        now: UnixTime,
        arrived_on: &Route,
        reply_route: &Route,
        mac: Option<&MacKey>,
        bytes: &[u8],
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        let r = self.handle_inner(now, arrived_on, reply_route, mac, bytes, entropy);
        // Noise reads and writes, and the new keys' schedules, left copies in frames below this
        // one (also when the message was refused half-way).
        crate::secrets::scrub_stack();
        if let Err(e) = r {
            self.stats.failures[e.index()] += 1;
        }
        r
    }

    pub(super) fn handle_inner(
        &mut self,
        now: UnixTime,
        arrived_on: &Route,
        reply_route: &Route,
        mac: Option<&MacKey>,
        bytes: &[u8],
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        let msg = Message::new_checked(bytes)?;
        // A copy (zeroized on drop): handshake messages are rare, and `self` is borrowed below.
        let mac = mac.unwrap_or(&self.mac_key).clone();
        msg.verify_mac(&mac.0, &arrived_on.remote, &arrived_on.local)?;
        if self.seen(msg.ephemeral()) {
            return Err(HandshakeError::Replayed);
        }
        // Remembered before any other check or Diffie-Hellman: whatever happens to this message
        // (stale, rate-limited, a lost race), its replays cost one hash and one lookup.
        self.remember(msg.ephemeral(), arrived_on.epoch);
        match msg.kind() {
            Kind::Initiation => {
                self.respond(now, &msg, arrived_on.epoch, reply_route, &mac, entropy)
            }
            Kind::Response => self.complete(now, &msg),
        }
    }

    pub(super) fn respond(
        &mut self,
        now: UnixTime,
        msg: &Message<'_>,
        initiation_epoch: Epoch,
        reply_route: &Route,
        mac: &MacKey,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<Outcome, HandshakeError> {
        if !self.pending.is_empty() && self.preferred {
            return Err(HandshakeError::Simultaneous);
        }
        if !self.bucket.take(now) {
            return Err(HandshakeError::RateLimited);
        }
        let entropy = entropy().ok_or(HandshakeError::NoEntropy)?;
        let private = self.cfg.local_private.to_bytes();
        let mut state = self
            .builder(entropy)
            .local_private_key(&private[..])
            .and_then(|b| b.prologue(&self.prologue))
            .and_then(|b| b.build_responder())
            .and_then(|state| NoiseState::new(state, self.cfg.psk.as_bytes()))
            .map_err(|_| HandshakeError::Decrypt)?;
        let mut payload = [0u8; INITIATION_PAYLOAD_LEN + 16];
        let n = state
            .read_message(msg.noise(), &mut payload)
            .map_err(|_| HandshakeError::Decrypt)?;
        if state.get_remote_static() != Some(&self.cfg.remote_public.as_bytes()[..]) {
            // The MAC key is shared by this pair only, so this takes a thief of our own key.
            return Err(HandshakeError::Decrypt);
        }
        if n != INITIATION_PAYLOAD_LEN {
            return Err(HandshakeError::BadPayload);
        }
        let mut ts = [0u8; 8];
        ts.copy_from_slice(&payload[..8]);
        let ts = u64::from_be_bytes(ts);
        let send_phase = KeyPhase::from_byte(payload[8]).ok_or(HandshakeError::BadPayload)?;
        if ts <= self.peer_timestamp {
            return Err(HandshakeError::StaleTimestamp);
        }
        if ts
            > now
                .as_nanos()
                .saturating_add(MAX_FUTURE_SKEW.as_nanos() as u64)
        {
            return Err(HandshakeError::FutureTimestamp);
        }
        self.peer_timestamp = ts;
        // Our own initiations lose (or there are none): the peer's handshake goes ahead.
        self.settle();
        let recv_phase = self.next_recv_phase();
        let mut noise = [0u8; NOISE_RESPONSE_LEN];
        let written = state
            .write_message(&[recv_phase.index() as u8], &mut noise)
            .map_err(|_| HandshakeError::Decrypt)?;
        debug_assert_eq!(written, NOISE_RESPONSE_LEN);
        self.remember(&noise[..32], reply_route.epoch);
        let hash = handshake_hash(&state);
        let (i2r, r2i) = state.dangerously_get_raw_split();
        let (i2r, r2i) = (Zeroizing::new(i2r), Zeroizing::new(r2i));
        drop(state);
        let route = session_route_key(&i2r, &r2i, &hash);
        let mut reply = [0u8; RESPONSE_LEN];
        frame(
            Kind::Response,
            msg.index(),
            &noise,
            &mac.0,
            &reply_route.local,
            &reply_route.remote,
            &mut reply,
        );
        self.awaiting = Some(recv_phase);
        self.answered_at = Some(now);
        self.awaiting_rekey = self.established.is_some();
        self.stats.responses_sent += 1;
        let keys = self.keys(&r2i, send_phase, &i2r, recv_phase, route, initiation_epoch);
        Ok(Outcome::Responded { reply, keys })
    }

    pub(super) fn complete(
        &mut self,
        now: UnixTime,
        msg: &Message<'_>,
    ) -> Result<Outcome, HandshakeError> {
        // The index names the attempt: a response to none of ours costs no Diffie-Hellman.
        let Some(at) = self.pending.iter().position(|p| p.index == msg.index()) else {
            return Err(HandshakeError::UnexpectedResponse);
        };
        let mut payload = [0u8; 1 + 16];
        // A failed read leaves the attempt as it was (snow restores its symmetric state), so
        // the genuine response can still complete it.
        let n = self.pending[at]
            .state
            .read_message(msg.noise(), &mut payload)
            .map_err(|_| HandshakeError::Decrypt)?;
        let send_phase = match (n, KeyPhase::from_byte(payload[0])) {
            (1, Some(p)) => p,
            // Authenticated by the peer's keys yet malformed: the peer is broken; the attempt is
            // spent, retries continue on their timer.
            _ => {
                self.pending.remove(at);
                return Err(HandshakeError::BadPayload);
            }
        };
        let mut pending = self.pending.remove(at);
        let hash = handshake_hash(&pending.state);
        let (i2r, r2i) = pending.state.dangerously_get_raw_split();
        let (i2r, r2i) = (Zeroizing::new(i2r), Zeroizing::new(r2i));
        let recv_phase = pending.recv_phase;
        let initiation_epoch = pending.epoch;
        drop(pending);
        let route = session_route_key(&i2r, &r2i, &hash);
        let rekey = self.established.is_some();
        self.confirmed_recv = Some(recv_phase);
        self.awaiting = None;
        self.established = Some(now);
        self.settle();
        self.stats.completed += 1;
        self.stats.rekeys += u64::from(rekey);
        self.stats.last_completed = Some(now);
        let keys = self.keys(&i2r, send_phase, &r2i, recv_phase, route, initiation_epoch);
        Ok(Outcome::Completed { keys, rekey })
    }

    /// Responder: the peer sent a packet under the receive key of phase `phase`
    /// ([`Opened::confirmed`](super::Opened::confirmed) reports it): the handshake is complete, the
    /// send key of [`Outcome::Responded`] may be used. Returns whether `phase` was the one awaited.
    pub fn confirm(&mut self, now: UnixTime, phase: KeyPhase) -> bool {
        if self.awaiting != Some(phase) {
            return false;
        }
        self.awaiting = None;
        self.confirmed_recv = Some(phase);
        self.established = Some(now);
        self.settle();
        self.stats.completed += 1;
        self.stats.rekeys += u64::from(self.awaiting_rekey);
        self.stats.last_completed = Some(now);
        true
    }

    pub(super) fn keys(
        &self,
        send: &[u8; 32],
        send_phase: KeyPhase,
        recv: &[u8; 32],
        recv_phase: KeyPhase,
        route: SessionKey,
        initiation_epoch: Epoch,
    ) -> SessionKeys {
        let ctx = match self.cfg.aead {
            AeadAlg::Aes256Gcm => super::identity::context::DATA_AES,
            AeadAlg::ChaCha20Poly1305 => super::identity::context::DATA_CHACHA,
        };
        let s = Zeroizing::new(blake3::derive_key(ctx, send));
        let r = Zeroizing::new(blake3::derive_key(ctx, recv));
        let c = &self.cfg;
        SessionKeys {
            send: Sealer::for_session(c.mode, c.aead, &s, send_phase, c.local_true, c.remote_true),
            recv: Opener::for_session(c.mode, c.aead, &r, recv_phase, c.local_true, c.remote_true),
            route,
            initiation_epoch,
        }
    }
}

/// The Noise handshake hash `h` of a finished handshake (32 bytes with BLAKE2s).
pub(super) fn handshake_hash(state: &snow::HandshakeState) -> Zeroizing<[u8; 32]> {
    let mut h = Zeroizing::new([0u8; 32]);
    let got = state.get_handshake_hash();
    let n = got.len().min(32);
    h[..n].copy_from_slice(&got[..n]);
    h
}
