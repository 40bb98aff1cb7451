//! One peer's protocol state in one object, sans-IO in the shape of
//! quinn-proto's `Connection`: the handshake (§9), the data keys' life (answer, confirmation,
//! switch, expiry), the route sets (§9.8) and the route moves' notices (§5.2).
//!
//! # What it owns and what it leaves to the packet path
//! A [`Link`] decides everything about the peer's keys and routes. It does not seal or open data
//! packets: a gateway's packet threads do that without taking a lock, so the link hands its
//! sending key out to the driver's [`KeyStore`] ([`Keys`], or the gateway's own publication
//! behind an atomic pointer) and fills the receiver's own [`ReceiveKeys`] when a handshake
//! message arrives ([`Link::handle_handshake`] borrows it). The packet path reports back the few things the link
//! must know: the first packet opened under a new key ([`Link::handle_confirmed`]), nothing to
//! seal with ([`Link::handle_no_send_key`]), a packet naming a key phase with no key
//! ([`Link::handle_empty_slot`]) and packets opened on a set ([`RouteSet::opened_on`], an atomic,
//! callable without the link).
//!
//! # Contract
//! Inputs, each with the time it happened:
//! - [`Link::handle_timeout`] once `now` reaches [`Link::poll_timeout`] (calling it earlier or more
//!   often is harmless);
//! - [`Link::handle_handshake`] for a handshake-class message (header protection removed) that
//!   arrived on an accept route of one of the link's sets, its source address checked;
//! - [`Link::handle_notice`] likewise for a route-move notice or link-layer announcement;
//! - [`Link::handle_collision`] when the external link shows one of the set's addresses taken;
//! - [`Link::handle_confirmed`], [`Link::handle_no_send_key`], [`Link::handle_empty_slot`] from
//!   the packet path, as above.
//!
//! Outputs:
//! - [`Link::poll_transmit`]: datagrams to send, in order, header protection applied, each with
//!   the (hashed address, port) pair it must leave from and go to;
//! - [`Link::poll_event`]: applies the key changes (a new sending key, no sending key, every
//!   receive key erased) to the driver's [`KeyStore`], then returns what the driver must apply
//!   (route sets bound or released) or may log; no driver applies a key change itself;
//! - [`Link::poll_timeout`]: when to call [`Link::handle_timeout`] next.
//!
//! Call order: after each input, drain [`Link::poll_transmit`] and [`Link::poll_event`] until
//! both return `None`, then wait for the next input or [`Link::poll_timeout`]. Four drivers
//! follow it: the gateway (`gateway/session.rs`, its own [`KeyStore`] over the atomic pointer
//! its packet threads read), the server (`server/shared.rs`, a [`Keys`] per client session),
//! the relay node (`relay/node`, a [`Keys`] per relay link and end-to-end stream) and the
//! simulator (`tests/common/gateway.rs`, a [`Keys`]).
//!
//! Randomness comes in as `entropy` closures (32 bytes, asked for only when a handshake message
//! is made); time comes in as `now`.

use std::collections::VecDeque;
use std::net::SocketAddrV6;
use std::sync::Arc;
use std::time::Duration;

use crate::handshake::{Handshake, HandshakeError, Outcome, ReceiveKeys};
use crate::liveness::{Delays, Liveness, Sample};
use crate::moves::{CollisionOutcome, Evidence, NoticeError, NOTICE_LEN};
use crate::route_sets::{Change, RouteSet, SetState};
use crate::tunnel::KEEPALIVE_LEN;
use crate::{Epoch, KeyPhase, Route, Schedule, Sealer, Stream, UnixTime};

mod keys;

pub use keys::{KeyStore, Keys};

/// How often [`Link::poll_timeout`] asks for a check while a key is in use: the packet budget
/// of a key (`rekey_after_packets`) is a count, not a time, and is checked then.
pub const PACKET_BUDGET_CHECK: Duration = Duration::from_secs(1);

/// How often a side that may initiate samples the packet path for liveness (§9.9) while a key
/// is in use: it notices its first unanswered data this late at most, so a peer that restarted
/// is sent a recovery initiation at most 3.75 s after that data (a responder-only side, which
/// never initiates, samples at [`PACKET_BUDGET_CHECK`]: its keepalives have a second to spare).
pub const LIVENESS_SAMPLE: Duration = Duration::from_millis(250);

/// What a datagram from [`Link::poll_transmit`] carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransmitKind {
    Initiation,
    Response,
    /// Sent by an initiator on completion, so that the responder confirms without data, or by
    /// either side to answer data it had nothing to send back for (liveness, §9.9).
    Keepalive,
    /// A route-move notice or its acknowledgement.
    Notice,
}

/// One datagram to send: leave from `src` to `dst` with `bytes` as the UDP payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    /// The [`RouteSet::id`] of the set whose route it travels on.
    pub set: u64,
    pub kind: TransmitKind,
    /// Header protection applied (§4.5).
    pub bytes: Vec<u8>,
}

/// What the driver must apply or may log. Key changes never appear here: [`Link::poll_event`]
/// applies them to the driver's [`KeyStore`] first.
#[derive(Debug)]
pub enum Event {
    /// No rekey succeeded for `REJECT_AFTER_REKEYS` intervals: the [`KeyStore`] was told to drop
    /// the sending key and erase every receive key. Traffic stops until a handshake succeeds.
    KeysErased,
    /// A handshake completed and its keys are in use.
    Established {
        /// This side sent the answered initiation.
        initiator: bool,
        /// The keys replace earlier ones.
        rekey: bool,
        /// The key id of the new sending key.
        key_id: u64,
    },
    /// A session's route set was made (bound at once, data on it from `activation`).
    SessionSet { id: u64, activation: Epoch },
    /// A parent set is no longer bound.
    SetReleased { id: u64 },
    /// The sets to bind or their routes changed: rebind ([`Link::select`]) and rebuild what maps
    /// addresses to this link.
    RoutesChanged,
}

/// What a notice was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Notice {
    /// A route-move notice or acknowledgement; `moved`: one of our routes moved with it.
    Move { moved: bool },
    /// The peer's authenticated external link-layer address (§5.2, "Pinned neighbours").
    LinkAddress([u8; 6]),
}

/// What the link queued for [`Link::poll_event`]: key changes for the store, events for the
/// driver, in the order they happened.
#[derive(Debug)]
enum Queued {
    Send(Option<Arc<Sealer>>),
    EraseReceive,
    Event(Event),
}

/// One peer: see the module documentation.
#[derive(Debug)]
pub struct Link {
    stream: Stream,
    /// None with a pre-shared key (no handshake, the link set only).
    hs: Option<Handshake>,
    sets: SetState,
    /// The sending key handed out last.
    send: Option<Arc<Sealer>>,
    /// Responder: the send key of each answered initiation, by the key id of its receive key
    /// (the peer completes with whichever answer reaches it first, §9.5).
    pending_send: Vec<(u64, Arc<Sealer>)>,
    transmits: VecDeque<Transmit>,
    events: VecDeque<Queued>,
    /// The `now` of the last [`Link::handle_timeout`].
    last_timeout: Option<UnixTime>,
    /// The stamp of the last link-layer announcement taken (§5.5): an older one is a replay.
    link_stamp: Option<UnixTime>,
    /// Liveness timers (§9.9), fed by samples of the packet path's counters.
    liveness: Liveness,
    delays: Delays,
    /// Numbers the sending keys handed out, for the liveness samples.
    send_key_number: u64,
    /// Keepalives the link sealed under the current sending key: not data.
    keepalives_sealed: u64,
    /// Handshake messages from the peer that were accepted: authenticated packets too.
    handshakes_heard: u64,
    /// Packets the peer sealed under its newest key, as the driver last told
    /// ([`Link::note_received`]).
    received: u64,
}

impl Link {
    /// A peer keyed by handshakes: no keys until the first one completes.
    pub fn with_handshake(stream: Stream, hs: Handshake) -> Link {
        Link::new(stream, Some(hs))
    }

    /// A peer with a pre-shared key: the driver seals and opens with the stream's own keys; the
    /// link keeps the link set and its moves.
    pub fn pre_shared(stream: Stream) -> Link {
        Link::new(stream, None)
    }

    fn new(stream: Stream, hs: Option<Handshake>) -> Link {
        let sets = SetState::new(Arc::new(RouteSet::link(&stream)));
        Link {
            hs,
            sets,
            send: None,
            pending_send: Vec::new(),
            transmits: VecDeque::new(),
            events: VecDeque::new(),
            last_timeout: None,
            link_stamp: None,
            liveness: Liveness::default(),
            delays: Delays::new(&stream.config().key),
            send_key_number: 0,
            keepalives_sealed: 0,
            handshakes_heard: 0,
            stream,
            received: 0,
        }
    }

    /// The link stream (the link key's addresses, ports and epoch clock).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The handshake, if the peer uses one (statistics, tests).
    pub fn handshake(&self) -> Option<&Handshake> {
        self.hs.as_ref()
    }

    /// The route sets.
    pub fn sets(&self) -> &SetState {
        &self.sets
    }

    /// The sending key handed out last (None before the first handshake, after expiry, and with
    /// a pre-shared key).
    pub fn send_key(&self) -> Option<&Arc<Sealer>> {
        self.send.as_ref()
    }

    /// What to bind at `now` and which set data goes on ([`SetState::select`]).
    pub fn select(&self, now: UnixTime) -> crate::route_sets::Selection {
        self.sets.select(self.stream.epoch_at(now))
    }

    /// The routes of `set` at `now`, moved epochs at their agreed offsets: `send` is where a
    /// handshake-class message on the set goes.
    pub fn schedule_of(set: &RouteSet, now: UnixTime) -> Schedule {
        set.stream.schedule_moved(now, &set.lock_moves())
    }

    /// The next datagram to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmits.pop_front()
    }

    /// Applies the key changes queued before the next event to `keys`, then returns that event
    /// (None: nothing left; the key changes are applied all the same).
    pub fn poll_event(&mut self, keys: &mut impl KeyStore) -> Option<Event> {
        loop {
            match self.events.pop_front()? {
                Queued::Send(key) => keys.publish_send(key),
                Queued::EraseReceive => keys.erase_receive_keys(),
                Queued::Event(e) => return Some(e),
            }
        }
    }

    /// When [`Link::handle_timeout`] must run next (None: only an input can give it work).
    /// `UnixTime` 0 means at once.
    pub fn poll_timeout(&self) -> Option<UnixTime> {
        let mut next: Option<UnixTime> = None;
        let mut take = |t: Option<UnixTime>| {
            if let Some(t) = t {
                next = Some(next.map_or(t, |n| n.min(t)));
            }
        };
        if let Some(hs) = &self.hs {
            take(hs.poll_timeout(self.send.is_some()));
        }
        let last = self.last_timeout.unwrap_or(UnixTime::from_nanos(0));
        let after =
            |d: Duration| UnixTime::from_nanos(last.as_nanos().saturating_add(d.as_nanos() as u64));
        if self.send.is_some() {
            // Also the liveness samples' period (§9.9).
            let period = match &self.hs {
                Some(hs) if !hs.is_responder_only() => LIVENESS_SAMPLE,
                _ => PACKET_BUDGET_CHECK,
            };
            take(Some(after(period)));
            if self.hs.is_some() {
                take(self.liveness.poll_timeout());
            }
        }
        // Set housekeeping and the moves' windows go by epoch; an answer awaiting confirmation
        // is forgotten after the initiation's lifetime, checked at least once a second.
        let epoch_end = self.stream.epoch_start(self.stream.epoch_at(last).next());
        if self.sets.housekeeping_pending() {
            take(Some(epoch_end.min(after(Duration::from_secs(1)))));
        }
        for set in self.sets.bound_sets() {
            let moves = set.lock_moves();
            take(moves.poll_timeout());
            if moves.moved().next().is_some() {
                take(Some(epoch_end));
            }
        }
        next
    }

    /// How many packets the peer has sealed under its newest confirmed key as far as the
    /// packets opened show ([`ReceiveKeys::newest_packets_seen`]); call it before
    /// [`Link::handle_timeout`]. The packet budget (`rekey_after_packets`) is then held against
    /// both directions: a peer that never initiates (a responder-only server) is rekeyed by this
    /// side when it has sent that many packets, and never seals far past its AEAD's limit.
    pub fn note_received(&mut self, packets: u64) {
        self.received = packets;
    }

    /// Time passed: expire keys that outlived their rekeys, release sets the peer left, resend
    /// notices, and start an initiation when one is due (first contact, a wanted handshake, a
    /// rekey, a retry). `entropy` is asked only if an initiation is made.
    pub fn handle_timeout(&mut self, now: UnixTime, entropy: impl FnOnce() -> Option<[u8; 32]>) {
        self.last_timeout = Some(now);
        let epoch = self.stream.epoch_at(now);
        if self.send.is_some() && self.hs.as_ref().is_some_and(|hs| hs.keys_expired(now)) {
            self.send = None;
            self.pending_send.clear();
            // The session sets go with their keys: back to the link set (§9.8).
            self.sets.reset();
            self.events.push_back(Queued::Send(None));
            self.events.push_back(Queued::EraseReceive);
            self.event(Event::KeysErased);
            self.event(Event::RoutesChanged);
        }
        self.check_liveness(now, epoch);
        if let Some(Change::Released { id }) = self.sets.expire(epoch, now) {
            self.event(Event::SetReleased { id });
            self.event(Event::RoutesChanged);
        }
        let sets: Vec<Arc<RouteSet>> = self.sets.bound_sets().cloned().collect();
        for set in &sets {
            let due = {
                let mut moves = set.lock_moves();
                let before = moves.moved().count();
                moves.expire(epoch);
                if moves.moved().count() != before {
                    self.event(Event::RoutesChanged);
                }
                moves.poll_timeout().is_some_and(|t| t <= now)
            };
            if due {
                self.queue_notices(set, now);
            }
        }
        let Some(hs) = &mut self.hs else {
            return;
        };
        // The budget counts both directions under the current keys (see `note_received`).
        let sent = self
            .send
            .as_ref()
            .map_or(0, |s| s.sealed())
            .max(self.received);
        if !hs.initiation_due(now, sent) {
            return;
        }
        // Initiations travel on the set data is sent on (a rekey chains on the session's
        // routes); after RECOVERY_AFTER unanswered ones, or at once when the peer stopped
        // answering our data, on the link set, which a peer that lost its session (a restart)
        // still binds (§9.8, "Initiations"; §9.9).
        let set = if hs.recovering() {
            self.sets.link().clone()
        } else {
            self.sets.initiation_set(epoch, hs.attempts()).clone()
        };
        let route = Link::schedule_of(&set, now).send;
        if let Some(init) = hs.poll_on(now, &route, set.mac.as_ref(), sent, entropy) {
            self.queue(&set, &route, TransmitKind::Initiation, &init);
        }
    }

    /// A handshake message arrived on `arrived_on`, an accept route of `set`. The message's MAC
    /// and header protection are the set's, and so are the reply's, which goes out on the same
    /// set's current route (§9.8). New receive keys go into `recv`. A rejection is counted in the
    /// handshake's statistics and returned.
    #[allow(clippy::too_many_arguments)]
    pub fn handle_handshake(
        &mut self,
        now: UnixTime,
        set: &Arc<RouteSet>,
        arrived_on: &Route,
        bytes: &[u8],
        recv: &mut ReceiveKeys,
        entropy: impl FnOnce() -> Option<[u8; 32]>,
    ) -> Result<(), HandshakeError> {
        let Some(hs) = &mut self.hs else {
            return Err(HandshakeError::NotKeyed);
        };
        let reply_route = Link::schedule_of(set, now).send;
        let epoch = self.stream.epoch_at(now);
        let outcome = hs.handle_on(
            now,
            arrived_on,
            &reply_route,
            set.mac.as_ref(),
            bytes,
            entropy,
        )?;
        // An accepted message is an authenticated packet from the peer (liveness, §9.9).
        self.handshakes_heard += 1;
        match outcome {
            Outcome::Responded { reply, keys } => {
                let id = keys.recv.key_id().unwrap_or(0);
                self.sets.answered(
                    &self.stream,
                    id,
                    &keys.route,
                    keys.initiation_epoch,
                    set.clone(),
                    now,
                );
                recv.install(keys.recv, false, now);
                self.pending_send.push((id, Arc::new(keys.send)));
                // Bounded like the receive side's spare keys.
                if self.pending_send.len() > crate::handshake::MAX_PENDING {
                    self.pending_send.remove(0);
                }
                self.event(Event::RoutesChanged);
                self.queue(set, &reply_route, TransmitKind::Response, &reply);
            }
            Outcome::Completed { keys, rekey } => {
                // The response came back on the set the initiation went out on: the new
                // session's parent, which carries its data until the activation epoch.
                let new = self.sets.completed(
                    &self.stream,
                    &keys.route,
                    keys.initiation_epoch,
                    set.clone(),
                    epoch,
                );
                self.event(Event::SessionSet {
                    id: new.id,
                    activation: new.activation,
                });
                self.event(Event::RoutesChanged);
                recv.install(keys.recv, true, now);
                let sealer = Arc::new(keys.send);
                // The keepalive makes the responder confirm the keys even if no data waits.
                let mut ka = [0u8; KEEPALIVE_LEN];
                let sealed = sealer.seal_keepalive(&reply_route, &mut ka);
                if let Ok(n) = sealed {
                    self.queue(set, &reply_route, TransmitKind::Keepalive, &ka[..n]);
                }
                self.established(sealer, true, rekey);
                self.keepalives_sealed = u64::from(sealed.is_ok());
                self.pending_send.clear();
            }
        }
        Ok(())
    }

    /// The packet path opened the first packet under the receive key of `phase` (`key`: its key
    /// id): a responder now sends with the matching new key and the answered set is current.
    pub fn handle_confirmed(&mut self, now: UnixTime, phase: KeyPhase, key: Option<u64>) {
        let Some(hs) = &mut self.hs else {
            return;
        };
        let rekey = hs.stats().completed > 0;
        if !hs.confirm(now, phase) {
            return;
        }
        let at = self
            .pending_send
            .iter()
            .position(|(id, _)| Some(*id) == key);
        let chosen = at.map(|i| self.pending_send.swap_remove(i).1);
        self.pending_send.clear();
        if self
            .sets
            .confirmed(key, self.stream.epoch_at(now))
            .is_some()
        {
            self.event(Event::RoutesChanged);
        }
        if let Some(sealer) = chosen {
            self.established(sealer, false, rekey);
        }
    }

    /// The packet path had a packet to send and no key: ask for a handshake at the next
    /// [`Link::handle_timeout`] (a handshake under way keeps its backoff).
    pub fn handle_no_send_key(&mut self) {
        if let Some(hs) = &mut self.hs {
            hs.want_handshake();
        }
    }

    /// The path to the peer just came up ([`Handshake::path_up`]): with no keys, initiate at
    /// the next [`Link::handle_timeout`].
    pub fn handle_path_up(&mut self) {
        if self.send.is_none() {
            if let Some(hs) = &mut self.hs {
                hs.path_up();
            }
        }
    }

    /// A packet named a key phase with no key. It may be forged: a handshake is asked for at
    /// most once per holdoff and never while a fresh key exists. Returns whether it asked.
    pub fn handle_empty_slot(&mut self, now: UnixTime) -> bool {
        self.hs
            .as_mut()
            .is_some_and(|hs| hs.packet_for_empty_slot(now))
    }

    /// A route-move notice or link-layer announcement arrived on `arrived_on`, an accept route of
    /// `set` (source checked, header protection removed). An acknowledgement, if one is owed,
    /// is queued at once.
    pub fn handle_notice(
        &mut self,
        now: UnixTime,
        set: &Arc<RouteSet>,
        arrived_on: &Route,
        bytes: &[u8],
    ) -> Result<Notice, NoticeError> {
        if crate::moves::is_link_announcement(bytes) {
            let (mac, stamp) = set.lock_moves().handle_link(arrived_on, bytes)?;
            // Fresh (§5.2): stamped inside the epoch of the route it travelled on, which the
            // route MAC binds, and later than the last one taken from this peer on any set.
            if self.stream.epoch_at(stamp) != arrived_on.epoch
                || self.link_stamp.is_some_and(|last| stamp <= last)
            {
                return Err(NoticeError::Stale);
            }
            self.link_stamp = Some(stamp);
            return Ok(Notice::LinkAddress(mac));
        }
        let current = self.stream.epoch_at(now);
        let outcome = set
            .lock_moves()
            .handle_notice(now, current, arrived_on, bytes)?;
        if outcome.moved {
            self.event(Event::RoutesChanged);
        }
        self.queue_notices(set, now);
        Ok(Notice::Move {
            moved: outcome.moved,
        })
    }

    /// The external link showed our address of `epoch` on `set`, derived at attempt `offset`,
    /// taken by another node (§5.2): move the epoch if the rules allow, and queue the notices
    /// that tell the peer.
    pub fn handle_collision(
        &mut self,
        now: UnixTime,
        set: &Arc<RouteSet>,
        epoch: Epoch,
        offset: u8,
        evidence: Evidence,
    ) -> CollisionOutcome {
        let current = self.stream.epoch_at(now);
        let outcome = set
            .lock_moves()
            .on_collision(now, current, epoch, offset, evidence);
        if matches!(outcome, CollisionOutcome::Moved(_)) {
            self.event(Event::RoutesChanged);
            self.queue_notices(set, now);
        }
        outcome
    }

    /// Queues the notices and acknowledgements `set`'s moves have due.
    fn queue_notices(&mut self, set: &Arc<RouteSet>, now: UnixTime) {
        let schedule = Link::schedule_of(set, now);
        let mut out = [0u8; NOTICE_LEN];
        loop {
            let route = set.lock_moves().poll_transmit(now, &schedule, &mut out);
            let Some(route) = route else {
                break;
            };
            self.queue(set, &route, TransmitKind::Notice, &out);
        }
    }

    /// Samples the packet path's counters and sends what liveness made due (§9.9): a keepalive
    /// on the set data goes on now, or a handshake on the link set at the next check of
    /// [`Link::handle_timeout`]. Only with a sending key and a handshake.
    fn check_liveness(&mut self, now: UnixTime, epoch: Epoch) {
        let (Some(send), Some(hs)) = (&self.send, &mut self.hs) else {
            self.liveness.reset();
            return;
        };
        let (received, received_data) = self.sets.link().traffic().sample();
        let sample = Sample {
            sent_data: send.sealed().saturating_sub(self.keepalives_sealed),
            send_key: self.send_key_number,
            received: received.wrapping_add(self.handshakes_heard),
            received_data,
        };
        let due = self.liveness.observe(now, sample, &mut self.delays);
        if due.handshake {
            hs.liveness_failed();
        }
        if due.keepalive {
            let sealer = send.clone();
            let set = self.sets.send_set(epoch).clone();
            let route = Link::schedule_of(&set, now).send;
            let mut ka = [0u8; KEEPALIVE_LEN];
            if let Ok(n) = sealer.seal_keepalive(&route, &mut ka) {
                self.keepalives_sealed += 1;
                self.queue(&set, &route, TransmitKind::Keepalive, &ka[..n]);
            }
        }
    }

    fn established(&mut self, sealer: Arc<Sealer>, initiator: bool, rekey: bool) {
        let key_id = sealer.key_id().unwrap_or(0);
        self.send_key_number += 1;
        self.keepalives_sealed = 0;
        // New keys both ways: the peer's count under the old ones no longer applies.
        self.received = 0;
        self.send = Some(sealer.clone());
        self.events.push_back(Queued::Send(Some(sealer)));
        self.event(Event::Established {
            initiator,
            rekey,
            key_id,
        });
    }

    fn event(&mut self, e: Event) {
        self.events.push_back(Queued::Event(e));
    }

    fn queue(&mut self, set: &RouteSet, route: &Route, kind: TransmitKind, payload: &[u8]) {
        let mut bytes = payload.to_vec();
        if let Some(hk) = set.stream.send_header_key() {
            // Every payload queued here is longer than the protected header.
            if hk.protect(&mut bytes).is_err() {
                return;
            }
        }
        self.transmits.push_back(Transmit {
            src: route.local,
            dst: route.remote,
            set: set.id,
            kind,
            bytes,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::tests::configs;
    use crate::handshake::Psk;
    use crate::{Endpoint, StreamConfig};

    fn link(cfg: crate::handshake::HandshakeConfig) -> Link {
        let hs = Handshake::new(cfg.clone()).unwrap();
        let mut sc = StreamConfig::new(
            Endpoint::new(cfg.local_true),
            Endpoint::new(cfg.remote_true),
            hs.link_key().clone(),
        );
        sc.rotation = Duration::from_secs(2);
        Link::with_handshake(Stream::new(sc).unwrap(), hs)
    }

    fn at(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_800_000_000_000 + ms)
    }

    /// The accept route of any bound set of `l` that `t` arrives on, with its set.
    fn arrival(l: &Link, now: UnixTime, t: &Transmit) -> (Arc<RouteSet>, Route) {
        l.select(now)
            .bound
            .iter()
            .find_map(|b| {
                Link::schedule_of(&b.set, now)
                    .accept
                    .into_iter()
                    .find(|r| r.local == t.dst && r.remote == t.src)
                    .map(|r| (b.set.clone(), r))
            })
            .unwrap()
    }

    fn deliver(to: &mut Link, recv: &mut ReceiveKeys, now: UnixTime, t: &Transmit) {
        let (set, route) = arrival(to, now, t);
        let mut bytes = t.bytes.clone();
        set.stream
            .recv_header_key()
            .unwrap()
            .unprotect(&mut bytes)
            .unwrap();
        to.handle_handshake(now, &set, &route, &bytes, recv, || Some([7; 32]))
            .unwrap();
    }

    #[test]
    fn a_link_announcement_recorded_before_a_restart_cannot_pin_the_dead_mac_again() {
        const DEAD: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
        const NEW: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
        let (ca, cb) = configs(Psk::from_bytes([1; 32]));
        let link_set = |l: &Link, now: UnixTime| {
            l.select(now)
                .bound
                .iter()
                .find(|b| b.set.is_link())
                .map(|b| b.set.clone())
                .unwrap()
        };
        let a = link(ca.clone());
        let mut b = link(cb.clone());
        // A announces on its send route of the link set (the link key is static: it outlives
        // a restart of A, as a pre-shared key does).
        let set_a = link_set(&a, at(100));
        let route = Link::schedule_of(&set_a, at(100)).send;
        let recorded = set_a.lock_moves().frame_link(&route, DEAD, at(100));
        let set_b = link_set(&b, at(100));
        let on = Link::schedule_of(&set_b, at(100))
            .accept
            .into_iter()
            .find(|r| r.local == route.remote && r.remote == route.local)
            .unwrap();
        assert_eq!(
            b.handle_notice(at(100), &set_b, &on, &recorded),
            Ok(Notice::LinkAddress(DEAD))
        );
        // A restarts with a new MAC within the same epoch and announces it on the same route.
        let a = link(ca);
        let fresh = link_set(&a, at(300))
            .lock_moves()
            .frame_link(&route, NEW, at(300));
        assert_eq!(
            b.handle_notice(at(300), &set_b, &on, &fresh),
            Ok(Notice::LinkAddress(NEW))
        );
        // The recording, replayed: refused, and so is the fresh one a second time.
        for replay in [recorded, fresh] {
            assert_eq!(
                b.handle_notice(at(400), &set_b, &on, &replay),
                Err(NoticeError::Stale)
            );
        }
        // A stamp outside the epoch of the route it arrived on (its route MAC is valid):
        // refused even by a receiver that took nothing yet.
        let mut b = link(cb);
        let set_b = link_set(&b, at(100));
        let elsewhere = set_a.lock_moves().frame_link(&route, DEAD, at(100 + 2_000));
        assert_eq!(
            b.handle_notice(at(100), &set_b, &on, &elsewhere),
            Err(NoticeError::Stale)
        );
    }

    #[test]
    fn a_fresh_link_asks_for_its_first_handshake_at_once_and_then_waits_for_the_retry() {
        let (ca, _) = configs(Psk::from_bytes([1; 32]));
        let mut a = link(ca);
        assert_eq!(a.poll_timeout(), Some(UnixTime::from_nanos(0)));
        a.handle_timeout(at(0), || Some([1; 32]));
        let t = a.poll_transmit().unwrap();
        assert_eq!(t.kind, TransmitKind::Initiation);
        assert!(a.poll_transmit().is_none());
        // The retry is between 1 s and 1.25 s later, and nothing goes out before it.
        let next = a.poll_timeout().unwrap();
        assert!(next >= at(1000) && next <= at(1250), "{next:?}");
        a.handle_timeout(at(999), || Some([2; 32]));
        assert!(a.poll_transmit().is_none());
        a.handle_timeout(next, || Some([2; 32]));
        assert_eq!(a.poll_transmit().unwrap().kind, TransmitKind::Initiation);
    }

    /// A initiates at 0, B answers at 5 ms, A completes at 10 ms; returns the pair, B's receive
    /// keys and B's answer.
    fn one_round_trip() -> (Link, Link, ReceiveKeys, Transmit) {
        let (ca, cb) = configs(Psk::from_bytes([1; 32]));
        let (mut a, mut b) = (link(ca), link(cb));
        let (mut ra, mut rb) = (ReceiveKeys::new(), ReceiveKeys::new());
        a.handle_timeout(at(0), || Some([1; 32]));
        let init = a.poll_transmit().unwrap();
        deliver(&mut b, &mut rb, at(5), &init);
        let resp = b.poll_transmit().unwrap();
        deliver(&mut a, &mut ra, at(10), &resp);
        (a, b, rb, resp)
    }

    #[test]
    fn a_round_trip_hands_out_keys_and_binds_a_session_set_on_both_sides() {
        let (mut a, mut b, mut rb, resp) = one_round_trip();
        assert_eq!(resp.kind, TransmitKind::Response);
        // B holds no sending key until A confirms; its answered set is bound already.
        assert!(b.send_key().is_none());
        assert_eq!(b.select(at(5)).bound.len(), 2);
        let ka = a.poll_transmit().unwrap();
        assert_eq!(ka.kind, TransmitKind::Keepalive);
        let mut keys_a = Keys::new();
        while a.poll_event(&mut keys_a).is_some() {}
        assert!(keys_a.send().is_some());
        // B opens the keepalive and confirms.
        let (set, route) = arrival(&b, at(15), &ka);
        let mut bytes = ka.bytes.clone();
        set.stream
            .recv_header_key()
            .unwrap()
            .unprotect(&mut bytes)
            .unwrap();
        let mut out = [0u8; 64];
        let opened = rb.open(at(15), &route, &bytes, &mut out).unwrap();
        b.handle_confirmed(at(15), opened.confirmed.unwrap(), opened.confirmed_key);
        assert!(b.send_key().is_some());
        let mut keys_b = Keys::new();
        let events: Vec<Event> = std::iter::from_fn(|| b.poll_event(&mut keys_b)).collect();
        assert!(keys_b.send().is_some());
        assert!(events.iter().any(|e| matches!(
            e,
            Event::Established {
                initiator: false,
                rekey: false,
                ..
            }
        )));
        // Both send on the same session set from its activation.
        let (sa, sb) = (
            a.sets().switch_epoch().unwrap(),
            b.sets().switch_epoch().unwrap(),
        );
        assert_eq!(sa.1, sb.1);
    }

    #[test]
    fn keys_that_outlive_their_rekeys_are_taken_back_and_the_link_set_is_alone_again() {
        let (mut a, ..) = one_round_trip();
        let mut keys = Keys::new();
        while a.poll_event(&mut keys).is_some() {}
        while a.poll_transmit().is_some() {}
        // Rekey every 120 s, keys rejected after 3: the timeout names the expiry instant at the
        // latest, and the expiry hands the key back.
        let expiry = at(10 + 360_000 + 1);
        assert!(a.poll_timeout().unwrap() <= expiry);
        a.handle_timeout(expiry, || None);
        assert!(keys.send().is_some());
        let events: Vec<Event> = std::iter::from_fn(|| a.poll_event(&mut keys)).collect();
        assert!(matches!(events[0], Event::KeysErased), "{events:?}");
        assert!(keys.send().is_none() && keys.expired());
        assert!(a.send_key().is_none());
        assert_eq!(a.select(expiry).bound.len(), 1);
    }

    #[test]
    fn a_pre_shared_link_has_no_handshake_and_no_timeout_of_its_own() {
        let (ca, _) = configs(Psk::from_bytes([1; 32]));
        let mut a = link(ca);
        a.hs = None;
        assert_eq!(a.poll_timeout(), None);
        a.handle_timeout(at(0), || Some([1; 32]));
        assert!(a.poll_transmit().is_none());
        a.handle_no_send_key();
        assert!(!a.handle_empty_slot(at(0)));
    }
}
