//! Route moves: how both gateways of a stream leave a hashed address that is already used on a
//! link, within the interval, instead of losing it (001 §4.1.1: "all packets sent during the
//! rotation interval will have mismatched addresses and be dropped"; docs/PROTOCOL.md §5.2).
//!
//! A gateway that sees another node hold or probe one of its hashed addresses moves that epoch's
//! route to the next **attempt offset** ([`crate::Stream::route_with_attempt`]: both addresses of
//! the epoch change, so nothing links the moved route to the original one) and tells the peer
//! with a **route move notice**, a 32-byte message of the handshake class (first byte 0x83),
//! authenticated with a BLAKE3 MAC over the route it travels on, like handshake messages (§9.3):
//!
//! ```text
//!  0      1       2      4              12       13         16               32
//! | 0x83 | flags | 0 0  | epoch (8, BE) | offset | 0 0 0    | mac (16)        |
//! flags: 0x01 = ack (an answer; never answered itself), other bits 0
//! mac = BLAKE3-keyed(noticeKey, outerSrc(16) || outerDst(16) || srcPort(2) || dstPort(2)
//!                               || message[0..16])[0..16]
//! noticeKey = BLAKE3-derive_key("mt6d-proto 2026-12-01 route move notice key", sessionKey)
//! ```
//!
//! Agreement ([`RouteMoves`], one per peer, sans-IO): offsets only grow (the larger one wins),
//! so both sides converge whatever the order, loss or duplication of notices. A side that moved
//! on its own sends its notice every [`NOTICE_RESEND`] until a message from the peer shows the
//! same offset (a notice or an ack); a side that receives a notice answers it with one ack
//! carrying its own offset. Acks are never answered, so no exchange loops. Entries live for the
//! epochs e-1 ..= e+2 (the accept window and one epoch of clock skew) and vanish after.
//!
//! Which epochs a gateway moves on its own (docs/PROTOCOL.md §5.2, "Move rules"): never e-1 (the
//! route both sides fall back on, and the one notices about e travel on), the current epoch e
//! only on [`Evidence::Confirmed`] (a unicast probe answered by the claimed holder), e+1 and e+2
//! on any evidence the caller accepts. A node on the link that forges one frame for e-1 and one
//! for e therefore moves nothing. Notices travel on the **last agreed route**: the send route
//! if its epoch is not moved-but-unconfirmed, else the previous epoch's (never moved by us).
//!
//! It never reads a clock or does IO: `now` and the current epoch come in, message bytes go out
//! into the caller's buffer.

use std::net::SocketAddrV6;

use subtle::ConstantTimeEq;

use crate::handshake::message_mac;
use crate::key::{context, Subkey};
use crate::{Epoch, Route, Schedule, Stream, UnixTime};

/// Type byte of a route move notice (handshake class: high bit set, docs/PROTOCOL.md §9.3).
pub const TYPE_NOTICE: u8 = 0x83;
/// Bytes of a notice.
pub const NOTICE_LEN: usize = 32;
/// Flag: this notice answers one of the peer's.
pub const FLAG_ACK: u8 = 0x01;
/// The largest offset a route can be moved to. An attacker on the link can forge advertisements
/// for every address it sees probed; past this many moves in one epoch the route stays where it
/// is (and the collision is counted) rather than churn.
pub const MAX_OFFSET: u8 = 4;
/// How often an unanswered notice is sent again.
pub const NOTICE_RESEND_MS: u64 = 200;
/// [`NOTICE_RESEND_MS`] as a duration, for documentation links.
pub const NOTICE_RESEND: std::time::Duration = std::time::Duration::from_millis(NOTICE_RESEND_MS);

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const FLAGS: usize = 1;
    pub const RESERVED1: Range<usize> = 2..4;
    pub const EPOCH: Range<usize> = 4..12;
    pub const OFFSET: usize = 12;
    pub const RESERVED2: Range<usize> = 13..16;
    pub const MAC: Range<usize> = 16..32;
    pub const LLADDR: Range<usize> = 2..8;
    pub const LINK_STAMP: Range<usize> = 8..16;
}

/// What the pad that hides the announcement's stamp is derived from (with the route), distinct
/// from every 16-byte message prefix a MAC is computed over.
const LINK_PAD_LABEL: &[u8] = b"mt6d link pad";

/// Type byte of a link-layer address announcement (docs/PROTOCOL.md §5.2, "Pinned
/// neighbours"): same length, MAC and key as a notice.
pub const TYPE_LINK: u8 = 0x84;

/// Whether a tunnel payload is a route move notice or a link-layer address announcement (call
/// after `handshake::is_handshake`); [`is_link_announcement`] tells them apart.
pub fn is_notice(payload: &[u8]) -> bool {
    matches!(payload.first(), Some(&TYPE_NOTICE) | Some(&TYPE_LINK))
}

/// Whether a payload [`is_notice`] accepted is a link-layer address announcement.
pub fn is_link_announcement(payload: &[u8]) -> bool {
    payload.first() == Some(&TYPE_LINK)
}

/// A link-layer address announcement (32 bytes), authenticated like a notice:
/// ```text
/// 0x84 | 00 | lladdr (6) | stamp ^ pad (8) | mac (16), mac over the route as for a notice
/// stamp = the sender's clock when it sent the message, nanoseconds since the Unix epoch (BE)
/// pad   = BLAKE3-keyed(noticeKey, outerSrc || outerDst || srcPort || dstPort || "mt6d link pad")[0..8]
/// ```
/// The MAC sits in bytes 2..8, all under header protection (docs/PROTOCOL.md §4.5) in auth and
/// encrypt mode, and the stamp is hidden under a route-bound pseudorandom pad: no byte of the
/// message is the same in two epochs, so an observer past a router (who does not see the
/// Ethernet source) cannot follow the announcement from one epoch to the next, nor read the
/// sender's clock.
/// The sender's external MAC, told to the peer inside the authenticated channel, so that the
/// peer can pin its neighbour entries for the sender's hashed addresses (a forged advertisement
/// on the link then changes nothing). The stamp makes it fresh (docs/PROTOCOL.md §5.2): the
/// receiver takes only a stamp inside the epoch of the route it arrived on and later than the
/// last one it took from the peer, so an announcement recorded before the peer restarted with
/// a new MAC cannot pin the dead MAC again once the new one has arrived.
pub(crate) fn emit_link(
    key: &Subkey,
    route: &Route,
    lladdr: [u8; 6],
    now: UnixTime,
) -> [u8; NOTICE_LEN] {
    let mut m = [0u8; NOTICE_LEN];
    m[field::TYPE] = TYPE_LINK;
    m[field::LLADDR].copy_from_slice(&lladdr);
    let pad = message_mac(key.as_bytes(), &route.local, &route.remote, LINK_PAD_LABEL);
    let sealed = now.as_nanos() ^ u64::from_be_bytes(pad[..8].try_into().unwrap_or([0; 8]));
    m[field::LINK_STAMP].copy_from_slice(&sealed.to_be_bytes());
    let mac = message_mac(
        key.as_bytes(),
        &route.local,
        &route.remote,
        &m[..field::MAC.start],
    );
    m[field::MAC].copy_from_slice(&mac);
    m
}

/// Why a notice was not acted on. Labels are stable (`mt6d status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoticeError {
    /// Not 32 bytes, a wrong type byte, unknown flags, non-zero reserved bytes, offset 0 or
    /// above [`MAX_OFFSET`].
    #[error("malformed route move notice")]
    Malformed,
    /// The MAC does not verify for the route it arrived on (forged, or replayed on another route).
    #[error("route move notice with a bad MAC")]
    BadMac,
    /// The epoch is not within e-1 ..= e+2 of the receiver's clock.
    #[error("route move notice for epoch {0}, outside the window")]
    OutsideWindow(u64),
    /// A link-layer announcement whose stamp is not inside the epoch of the route it arrived
    /// on, or not later than the last one taken from the peer (a replay).
    #[error("stale link-layer address announcement")]
    Stale,
}

impl NoticeError {
    /// A stable label for counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed => "notice_malformed",
            Self::BadMac => "notice_bad_mac",
            Self::OutsideWindow(_) => "notice_outside_window",
            Self::Stale => "link_announcement_stale",
        }
    }
}

/// A checked view of a notice: `new_checked` validates length and every fixed field once.
#[derive(Debug, Clone, Copy)]
pub struct NoticePacket<'a> {
    bytes: &'a [u8; NOTICE_LEN],
}

impl<'a> NoticePacket<'a> {
    /// Checks length, type, flags, reserved bytes and the offset range.
    pub fn new_checked(bytes: &'a [u8]) -> Result<NoticePacket<'a>, NoticeError> {
        let bytes: &[u8; NOTICE_LEN] = bytes.try_into().map_err(|_| NoticeError::Malformed)?;
        if bytes[field::TYPE] != TYPE_NOTICE
            || bytes[field::FLAGS] & !FLAG_ACK != 0
            || bytes[field::RESERVED1] != [0, 0]
            || bytes[field::RESERVED2] != [0, 0, 0]
            || !(1..=MAX_OFFSET).contains(&bytes[field::OFFSET])
        {
            return Err(NoticeError::Malformed);
        }
        Ok(NoticePacket { bytes })
    }
    /// The moved epoch.
    pub fn epoch(&self) -> Epoch {
        let mut e = [0u8; 8];
        e.copy_from_slice(&self.bytes[field::EPOCH]);
        Epoch(u64::from_be_bytes(e))
    }
    /// The sender's attempt offset for that epoch.
    pub fn offset(&self) -> u8 {
        self.bytes[field::OFFSET]
    }
    /// Whether it answers a notice.
    pub fn is_ack(&self) -> bool {
        self.bytes[field::FLAGS] & FLAG_ACK != 0
    }
    /// Verifies the MAC for a notice that travelled from `src` to `dst`; constant time.
    pub fn verify_mac(
        &self,
        key: &Subkey,
        src: &SocketAddrV6,
        dst: &SocketAddrV6,
    ) -> Result<(), NoticeError> {
        let want = message_mac(key.as_bytes(), src, dst, &self.bytes[..field::MAC.start]);
        if bool::from(want.ct_eq(&self.bytes[field::MAC])) {
            Ok(())
        } else {
            Err(NoticeError::BadMac)
        }
    }
}

/// Writes a notice for `route` (sent from `route.local` to `route.remote`).
pub(crate) fn emit_notice(
    key: &Subkey,
    route: &Route,
    epoch: Epoch,
    offset: u8,
    ack: bool,
) -> [u8; NOTICE_LEN] {
    let mut m = [0u8; NOTICE_LEN];
    m[field::TYPE] = TYPE_NOTICE;
    m[field::FLAGS] = if ack { FLAG_ACK } else { 0 };
    m[field::EPOCH].copy_from_slice(&epoch.0.to_be_bytes());
    m[field::OFFSET] = offset;
    let mac = message_mac(
        key.as_bytes(),
        &route.local,
        &route.remote,
        &m[..field::MAC.start],
    );
    m[field::MAC].copy_from_slice(&mac);
    m
}

/// One moved epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Entry {
    epoch: Epoch,
    offset: u8,
    /// The peer has shown this offset (or a larger one, which replaced it).
    confirmed: bool,
    /// A notice of the peer's awaits our ack.
    ack_due: bool,
    /// When our own notice goes out next (unconfirmed entries only).
    next_send: UnixTime,
}

/// What happened to a notice that passed every check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoticeOutcome {
    /// This side's route of the epoch changed: rebuild the route table.
    pub moved: bool,
}

/// How sure the caller is that another node holds the address ([`RouteMoves::on_collision`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Evidence {
    /// One frame claimed it (an advertisement, a probe): anyone on the link can send that.
    Unconfirmed,
    /// The claimed holder answered a unicast probe for the address, or the address cannot be
    /// used for a local reason (a port that cannot be bound): enough to move the current epoch.
    Confirmed,
}

/// What [`RouteMoves::on_collision`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollisionOutcome {
    /// The epoch moved to this offset: rebuild the route table.
    Moved(u8),
    /// The address is no longer the epoch's (an earlier report already moved it): nothing to do.
    AlreadyMoved,
    /// [`MAX_OFFSET`] reached; the route stays.
    Exhausted,
    /// The epoch is not within e ..= e+2.
    OutsideWindow,
    /// The epoch is e-1: never moved (it carries the notices about e and the packets still in
    /// flight; moving it could only lose them).
    PreviousEpoch,
    /// The current epoch, on [`Evidence::Unconfirmed`]: confirm first (a unicast probe).
    NeedsConfirmation,
}

/// Counters of one peer's route moves.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoveStats {
    /// Collisions on our own addresses that moved a route.
    pub collisions: u64,
    /// Collisions that could not move the route ([`MAX_OFFSET`] reached).
    pub exhausted: u64,
    /// Routes moved because the peer's notice or ack said so.
    pub moved_by_peer: u64,
    /// Notices (not acks) sent.
    pub notices_sent: u64,
    /// Acks sent.
    pub acks_sent: u64,
    /// Valid notices and acks received.
    pub received: u64,
}

/// Epochs an entry may be for, relative to the current epoch e: e-1 ..= e+2.
const WINDOW: usize = 4;

/// One peer's route moves and their agreement state (see the module documentation).
///
/// Call order: [`RouteMoves::expire`] when the epoch changes (or on every tick),
/// [`RouteMoves::on_collision`] when the link shows one of our addresses taken,
/// [`RouteMoves::handle_notice`] for every notice that arrives, then build routes with
/// [`RouteMoves::offset`] (or [`Stream::schedule_moved`]) and drain [`RouteMoves::poll_transmit`]
/// until it returns `None`, sending each message on the route it names.
#[derive(Debug)]
pub struct RouteMoves {
    key: Subkey,
    entries: [Option<Entry>; WINDOW],
    stats: MoveStats,
}

fn in_window(current: Epoch, e: Epoch) -> bool {
    e.0.saturating_add(1) >= current.0 && e.0 <= current.0.saturating_add(2)
}

impl RouteMoves {
    /// No moves yet; the notice key comes from the stream's session key.
    pub fn new(stream: &Stream) -> RouteMoves {
        RouteMoves {
            key: Subkey::derive(context::NOTICE, &stream.config().key),
            entries: [None; WINDOW],
            stats: MoveStats::default(),
        }
    }

    /// A notice under this stream's key for `route`, as the peer would send it (for tests and
    /// fuzzing: [`RouteMoves::poll_transmit`] is how a gateway produces them).
    pub fn frame_notice(
        &self,
        route: &Route,
        epoch: Epoch,
        offset: u8,
        ack: bool,
    ) -> [u8; NOTICE_LEN] {
        emit_notice(&self.key, route, epoch, offset, ack)
    }

    /// Our link-layer address announcement for `route` ([`TYPE_LINK`]), stamped `now`.
    pub fn frame_link(&self, route: &Route, lladdr: [u8; 6], now: UnixTime) -> [u8; NOTICE_LEN] {
        emit_link(&self.key, route, lladdr, now)
    }

    /// Checks a link-layer address announcement that arrived on `arrived_on` (an accept route,
    /// its source checked by the caller) and returns the peer's MAC and the message's stamp.
    /// Every check of a notice applies: exact length, type, zero flags, MAC for that route in
    /// constant time (the stamp is covered by the MAC). A group MAC (low bit of the first byte
    /// set: multicast, broadcast) is refused: not an interface's. Freshness (the stamp against
    /// the route's epoch and the last one taken) is the caller's: it spans the peer's sets
    /// (`crate::link::Link::handle_notice`).
    pub fn handle_link(
        &self,
        arrived_on: &Route,
        bytes: &[u8],
    ) -> Result<([u8; 6], UnixTime), NoticeError> {
        let bytes: &[u8; NOTICE_LEN] = bytes.try_into().map_err(|_| NoticeError::Malformed)?;
        if bytes[field::TYPE] != TYPE_LINK
            || bytes[field::FLAGS] != 0
            || bytes[field::LLADDR.start] & 0x01 != 0
        {
            return Err(NoticeError::Malformed);
        }
        let want = message_mac(
            self.key.as_bytes(),
            &arrived_on.remote,
            &arrived_on.local,
            &bytes[..field::MAC.start],
        );
        if !bool::from(want.ct_eq(&bytes[field::MAC])) {
            return Err(NoticeError::BadMac);
        }
        let mut m = [0u8; 6];
        m.copy_from_slice(&bytes[field::LLADDR]);
        let pad = message_mac(
            self.key.as_bytes(),
            &arrived_on.remote,
            &arrived_on.local,
            LINK_PAD_LABEL,
        );
        let mut sealed = [0u8; 8];
        sealed.copy_from_slice(&bytes[field::LINK_STAMP]);
        let mut p = [0u8; 8];
        p.copy_from_slice(&pad[..8]);
        let stamp = u64::from_be_bytes(sealed) ^ u64::from_be_bytes(p);
        Ok((m, UnixTime::from_nanos(stamp)))
    }

    /// The attempt offset of epoch `e` (0 unless moved).
    pub fn offset(&self, e: Epoch) -> u8 {
        self.find(e).map_or(0, |i| self.slot(i).offset)
    }

    /// Counters.
    pub fn stats(&self) -> MoveStats {
        self.stats
    }

    /// The moved epochs and their offsets, oldest first.
    pub fn moved(&self) -> impl Iterator<Item = (Epoch, u8)> + '_ {
        let mut v: Vec<(Epoch, u8)> = self
            .entries
            .iter()
            .flatten()
            .map(|e| (e.epoch, e.offset))
            .collect();
        v.sort();
        v.into_iter()
    }

    /// Whether every move has been confirmed by the peer (tests and status).
    pub fn settled(&self) -> bool {
        self.entries
            .iter()
            .flatten()
            .all(|e| e.confirmed && !e.ack_due)
    }

    fn find(&self, e: Epoch) -> Option<usize> {
        self.entries
            .iter()
            .position(|s| s.is_some_and(|s| s.epoch == e))
    }

    fn slot(&self, i: usize) -> Entry {
        // Only called with an index `find` or `insert` returned.
        self.entries[i].unwrap_or(Entry {
            epoch: Epoch(0),
            offset: 0,
            confirmed: true,
            ack_due: false,
            next_send: UnixTime::from_nanos(0),
        })
    }

    /// The entry for `e`, created (offset 0) if missing. None if no slot is free, which cannot
    /// happen while callers keep to the window and call `expire`.
    fn entry(&mut self, e: Epoch, now: UnixTime) -> Option<&mut Entry> {
        let i = match self.find(e) {
            Some(i) => i,
            None => {
                let i = self.entries.iter().position(Option::is_none)?;
                self.entries[i] = Some(Entry {
                    epoch: e,
                    offset: 0,
                    confirmed: true,
                    ack_due: false,
                    next_send: now,
                });
                i
            }
        };
        self.entries[i].as_mut()
    }

    /// Forgets epochs older than `current - 1` (they left the accept window).
    pub fn expire(&mut self, current: Epoch) {
        for s in &mut self.entries {
            if s.is_some_and(|e| !in_window(current, e.epoch) && e.epoch < current) {
                *s = None;
            }
        }
    }

    /// Another node holds or probes our address of epoch `epoch`, which we derived with
    /// `offset`: move that epoch to the next offset and start telling the peer, within the move
    /// rules of the module documentation (e-1 never; e only on [`Evidence::Confirmed`]).
    pub fn on_collision(
        &mut self,
        now: UnixTime,
        current: Epoch,
        epoch: Epoch,
        offset: u8,
        evidence: Evidence,
    ) -> CollisionOutcome {
        if epoch < current && in_window(current, epoch) {
            return CollisionOutcome::PreviousEpoch;
        }
        if !in_window(current, epoch) {
            return CollisionOutcome::OutsideWindow;
        }
        if epoch == current && evidence != Evidence::Confirmed {
            return CollisionOutcome::NeedsConfirmation;
        }
        self.expire(current);
        let Some(e) = self.entry(epoch, now) else {
            return CollisionOutcome::OutsideWindow;
        };
        if e.offset != offset {
            return CollisionOutcome::AlreadyMoved;
        }
        if e.offset >= MAX_OFFSET {
            self.stats.exhausted += 1;
            return CollisionOutcome::Exhausted;
        }
        // A reserved IID at offset k+1 makes the search (§2.4) land where offset k did only if
        // k's own candidate was reserved too: probability below 2^-38, not worth a loop here.
        e.offset += 1;
        e.confirmed = false;
        e.next_send = now;
        let moved = e.offset;
        self.stats.collisions += 1;
        CollisionOutcome::Moved(moved)
    }

    /// Moves epoch `epoch` away from its present offset for a reason found locally (its address
    /// or port cannot be used here), as a confirmed collision does: the same rules, the same
    /// notices, so the peer follows.
    pub fn move_locally(
        &mut self,
        now: UnixTime,
        current: Epoch,
        epoch: Epoch,
    ) -> CollisionOutcome {
        let offset = self.offset(epoch);
        self.on_collision(now, current, epoch, offset, Evidence::Confirmed)
    }

    /// Whether the route of `e` is one both sides use: not moved by us without the peer having
    /// shown the same offset.
    fn agreed(&self, e: Epoch) -> bool {
        self.find(e).is_none_or(|i| self.slot(i).confirmed)
    }

    /// A notice arrived on `arrived_on` (one of our accept routes, its source checked by the
    /// caller). Verifies it and applies the larger offset.
    pub fn handle_notice(
        &mut self,
        now: UnixTime,
        current: Epoch,
        arrived_on: &Route,
        bytes: &[u8],
    ) -> Result<NoticeOutcome, NoticeError> {
        let n = NoticePacket::new_checked(bytes)?;
        n.verify_mac(&self.key, &arrived_on.remote, &arrived_on.local)?;
        let epoch = n.epoch();
        if !in_window(current, epoch) {
            return Err(NoticeError::OutsideWindow(epoch.0));
        }
        self.expire(current);
        self.stats.received += 1;
        let Some(e) = self.entry(epoch, now) else {
            return Err(NoticeError::OutsideWindow(epoch.0));
        };
        let mut moved = false;
        if n.offset() > e.offset {
            e.offset = n.offset();
            moved = true;
        }
        if n.offset() == e.offset {
            e.confirmed = true;
        }
        if !n.is_ack() {
            e.ack_due = true;
        }
        if moved {
            self.stats.moved_by_peer += 1;
        }
        Ok(NoticeOutcome { moved })
    }

    /// The next message to send, if any is due at `now`: writes it into `out` and returns the
    /// route to send it on, taken from `schedule` (the schedule built with this state's offsets):
    /// the last agreed route, i.e. the send route unless we moved its epoch and the peer has not
    /// shown that offset yet, else the previous epoch's route (never moved by us, bound on both
    /// sides). A notice therefore never travels on a route the peer may not have bound.
    pub fn poll_transmit(
        &mut self,
        now: UnixTime,
        schedule: &Schedule,
        out: &mut [u8; NOTICE_LEN],
    ) -> Option<Route> {
        let route = if self.agreed(schedule.send.epoch) || !self.agreed(schedule.accept[0].epoch) {
            schedule.send
        } else {
            schedule.accept[0]
        };
        for e in self.entries.iter_mut().flatten() {
            if e.ack_due {
                e.ack_due = false;
                *out = emit_notice(&self.key, &route, e.epoch, e.offset, true);
                self.stats.acks_sent += 1;
                return Some(route);
            }
            if !e.confirmed && now >= e.next_send {
                e.next_send = UnixTime::from_nanos(now.as_nanos() + NOTICE_RESEND_MS * 1_000_000);
                *out = emit_notice(&self.key, &route, e.epoch, e.offset, false);
                self.stats.notices_sent += 1;
                return Some(route);
            }
        }
        None
    }

    /// When `poll_transmit` next has something to send without a new input (None: nothing).
    pub fn poll_timeout(&self) -> Option<UnixTime> {
        self.entries
            .iter()
            .flatten()
            .filter(|e| !e.confirmed)
            .map(|e| e.next_send)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;
    use crate::testutil::pair;
    use crate::{AeadAlg, Mode, Schedule};

    const R_MS: u64 = 10_000;

    fn at(ms: u64) -> UnixTime {
        UnixTime::from_millis(ms)
    }

    /// Two gateways' moves and streams, and a channel with loss and duplication: the in-memory
    /// pair (../shared/STYLE.md §14) for the agreement.
    struct Pair {
        streams: [Stream; 2],
        moves: [RouteMoves; 2],
        rng: ChaCha8Rng,
        loss: f64,
        dup: f64,
        delivered: usize,
    }

    impl Pair {
        fn new(mode: Mode, seed: u64, loss: f64, dup: f64) -> Pair {
            let (a, b) = pair(mode, AeadAlg::Aes256Gcm);
            let moves = [RouteMoves::new(&a), RouteMoves::new(&b)];
            Pair {
                streams: [a, b],
                moves,
                rng: ChaCha8Rng::seed_from_u64(seed),
                loss,
                dup,
                delivered: 0,
            }
        }

        fn schedule(&self, side: usize, now: UnixTime) -> Schedule {
            self.streams[side].schedule_moved(now, &self.moves[side])
        }

        /// Drains both sides once; each message is lost or duplicated at random, and delivered
        /// to the receiver's matching accept route.
        fn step(&mut self, now: UnixTime) {
            for from in 0..2 {
                let to = 1 - from;
                let sch = self.schedule(from, now);
                let mut out = [0u8; NOTICE_LEN];
                let mut sent = Vec::new();
                while let Some(route) = self.moves[from].poll_transmit(now, &sch, &mut out) {
                    sent.push((route, out));
                }
                for (route, msg) in sent {
                    if self.rng.random_bool(self.loss) {
                        continue;
                    }
                    let copies = if self.rng.random_bool(self.dup) { 2 } else { 1 };
                    for _ in 0..copies {
                        let rx = self.schedule(to, now);
                        // Delivered only if the receiver accepts that (local, remote) pair.
                        let Some(on) = rx
                            .accept
                            .iter()
                            .find(|r| r.local == route.remote && r.remote == route.local)
                        else {
                            continue;
                        };
                        let current = self.streams[to].epoch_at(now);
                        self.moves[to]
                            .handle_notice(now, current, on, &msg)
                            .unwrap();
                        self.delivered += 1;
                    }
                }
            }
        }
    }

    #[test]
    fn both_sides_move_the_same_epoch_despite_loss_and_duplicates() {
        for seed in 0..20 {
            let mut p = Pair::new(Mode::Encrypt, seed, 0.5, 0.3);
            // Epoch 100 has just started at both; A finds its address of epoch 101 taken.
            let mut now = 100 * R_MS + 50;
            let e = Epoch(101);
            let before = p.schedule(0, at(now)).accept[2];
            assert_eq!(
                p.moves[0].on_collision(at(now), Epoch(100), e, 0, Evidence::Unconfirmed),
                CollisionOutcome::Moved(1)
            );
            // Within the interval, well before epoch 101 starts, both sides agree.
            while !(p.moves[0].settled() && p.moves[1].settled()) {
                p.step(at(now));
                now += 20;
                assert!(
                    now < 101 * R_MS,
                    "seed {seed}: no agreement within the interval"
                );
            }
            let (a, b) = (p.schedule(0, at(now)), p.schedule(1, at(now)));
            assert_eq!(a.accept[2].local, b.accept[2].remote, "seed {seed}");
            assert_eq!(a.accept[2].remote, b.accept[2].local, "seed {seed}");
            assert_ne!(a.accept[2].local, before.local, "A's address moved");
            assert_ne!(a.accept[2].remote, before.remote, "B's address moved too");
            assert_eq!(p.moves[0].offset(e), 1);
            assert_eq!(p.moves[1].offset(e), 1);
            assert_eq!(p.moves[1].stats().moved_by_peer, 1);
            // Settled means silent: no more messages.
            let sch = p.schedule(0, at(now));
            assert_eq!(p.moves[0].poll_transmit(at(now), &sch, &mut [0; 32]), None);
            assert_eq!(p.moves[0].poll_timeout(), None);
        }
    }

    #[test]
    fn both_sides_colliding_and_a_second_collision_converge_on_the_larger_offset() {
        let mut p = Pair::new(Mode::Plain, 7, 0.2, 0.2);
        let now = 100 * R_MS + 50;
        let e = Epoch(101);
        p.moves[0].on_collision(at(now), Epoch(100), e, 0, Evidence::Unconfirmed);
        p.moves[1].on_collision(at(now), Epoch(100), e, 0, Evidence::Unconfirmed);
        // A's offset-1 address collides too before anything was exchanged.
        assert_eq!(
            p.moves[0].on_collision(at(now), Epoch(100), e, 1, Evidence::Unconfirmed),
            CollisionOutcome::Moved(2)
        );
        // A report about the address it already left changes nothing.
        assert_eq!(
            p.moves[0].on_collision(at(now), Epoch(100), e, 1, Evidence::Unconfirmed),
            CollisionOutcome::AlreadyMoved
        );
        let mut t = now;
        while !(p.moves[0].settled() && p.moves[1].settled()) {
            p.step(at(t));
            t += 20;
            assert!(t < 101 * R_MS);
        }
        assert_eq!((p.moves[0].offset(e), p.moves[1].offset(e)), (2, 2));
    }

    #[test]
    fn a_current_epoch_notice_travels_on_the_previous_route() {
        let mut p = Pair::new(Mode::Auth, 1, 0.0, 0.0);
        let now = at(100 * R_MS + 5_000);
        p.moves[0].on_collision(now, Epoch(100), Epoch(100), 0, Evidence::Confirmed);
        let sch = p.schedule(0, now);
        let mut out = [0u8; NOTICE_LEN];
        let route = p.moves[0].poll_transmit(now, &sch, &mut out).unwrap();
        assert_eq!(route.epoch, Epoch(99));
        assert_eq!(route, p.streams[0].route(Epoch(99)));
        // That copy was never delivered; the resend is.
        let later = at(100 * R_MS + 5_000 + NOTICE_RESEND_MS);
        p.step(later);
        p.step(later);
        assert!(p.moves[0].settled() && p.moves[1].settled());
        assert_eq!(
            p.schedule(1, now).send.local,
            p.schedule(0, now).send.remote
        );
    }

    #[test]
    fn forged_replayed_elsewhere_and_out_of_window_notices_are_refused() {
        let p = Pair::new(Mode::Encrypt, 1, 0.0, 0.0);
        let (a, b) = (&p.streams[0], &p.streams[1]);
        let mut rx = RouteMoves::new(b);
        let now = at(100 * R_MS);
        let cur = Epoch(100);
        let sent_on = a.route(cur);
        let seen_on = b.route(cur);
        let good = emit_notice(&p.moves[0].key, &sent_on, Epoch(101), 1, false);
        // A different key (another stream, or an attacker's guess).
        let mut other_cfg = crate::testutil::config(Mode::Encrypt, AeadAlg::Aes256Gcm);
        other_cfg.key = crate::SessionKey::from_bytes(&[9; 32]).unwrap();
        let other = RouteMoves::new(&Stream::new(other_cfg).unwrap());
        let forged = emit_notice(&other.key, &sent_on, Epoch(101), 1, false);
        assert_eq!(
            rx.handle_notice(now, cur, &seen_on, &forged),
            Err(NoticeError::BadMac)
        );
        // The right MAC, replayed on the next epoch's route.
        assert_eq!(
            rx.handle_notice(now, cur, &b.route(Epoch(101)), &good),
            Err(NoticeError::BadMac)
        );
        let mut flipped = good;
        flipped[12] = 2;
        assert_eq!(
            rx.handle_notice(now, cur, &seen_on, &flipped),
            Err(NoticeError::BadMac)
        );
        for e in [98, 103, u64::MAX] {
            let far = emit_notice(&p.moves[0].key, &sent_on, Epoch(e), 1, false);
            assert_eq!(
                rx.handle_notice(now, cur, &seen_on, &far),
                Err(NoticeError::OutsideWindow(e))
            );
        }
        for (at_byte, v) in [
            (0, 0x82),
            (1, 0x02),
            (2, 1),
            (12, 0),
            (12, MAX_OFFSET + 1),
            (15, 1),
        ] {
            let mut m = good;
            m[at_byte] = v;
            assert_eq!(
                rx.handle_notice(now, cur, &seen_on, &m),
                Err(NoticeError::Malformed),
                "byte {at_byte} = {v}"
            );
        }
        for cut in 0..NOTICE_LEN {
            assert_eq!(
                rx.handle_notice(now, cur, &seen_on, &good[..cut]),
                Err(NoticeError::Malformed)
            );
        }
        assert_eq!(rx.offset(Epoch(101)), 0, "nothing moved");
        // The genuine one, twice: one move, two acks due (each notice is answered once).
        assert_eq!(
            rx.handle_notice(now, cur, &seen_on, &good),
            Ok(NoticeOutcome { moved: true })
        );
        assert_eq!(
            rx.handle_notice(now, cur, &seen_on, &good),
            Ok(NoticeOutcome { moved: false })
        );
        assert_eq!(rx.offset(Epoch(101)), 1);
        assert_eq!(rx.stats().moved_by_peer, 1);
    }

    #[test]
    fn moves_vanish_when_the_epoch_leaves_the_window_and_are_capped() {
        let p = Pair::new(Mode::Encrypt, 1, 0.0, 0.0);
        let mut m = RouteMoves::new(&p.streams[0]);
        let now = at(100 * R_MS);
        for k in 0..MAX_OFFSET {
            assert_eq!(
                m.on_collision(now, Epoch(100), Epoch(102), k, Evidence::Unconfirmed),
                CollisionOutcome::Moved(k + 1)
            );
        }
        assert_eq!(
            m.on_collision(
                now,
                Epoch(100),
                Epoch(102),
                MAX_OFFSET,
                Evidence::Unconfirmed
            ),
            CollisionOutcome::Exhausted
        );
        assert_eq!(
            m.on_collision(now, Epoch(100), Epoch(103), 0, Evidence::Unconfirmed),
            CollisionOutcome::OutsideWindow
        );
        m.expire(Epoch(103));
        assert_eq!(m.offset(Epoch(102)), MAX_OFFSET, "still in the window");
        m.expire(Epoch(104));
        assert_eq!(m.offset(Epoch(102)), 0, "gone with its epoch");
        assert!(m.settled());
    }

    #[test]
    fn an_ack_is_never_answered() {
        let mut p = Pair::new(Mode::Encrypt, 3, 0.0, 0.0);
        let now = at(100 * R_MS + 10);
        p.moves[0].on_collision(now, Epoch(100), Epoch(101), 0, Evidence::Unconfirmed);
        p.step(now);
        let delivered = p.delivered;
        assert_eq!(delivered, 2, "one notice, one ack");
        for _ in 0..5 {
            p.step(now);
        }
        assert_eq!(p.delivered, delivered, "silence after the ack");
        let total = |m: &RouteMoves| m.stats().notices_sent + m.stats().acks_sent;
        assert_eq!(total(&p.moves[0]) + total(&p.moves[1]), 2);
    }

    /// Whether A's send route is one B accepts from A right now, and the other way round.
    fn routes_agree(p: &Pair, now: UnixTime) -> bool {
        let (a, b) = (p.schedule(0, now), p.schedule(1, now));
        let fits = |send: &Route, rx: &Schedule| {
            rx.accept
                .iter()
                .any(|r| r.local == send.remote && r.remote == send.local)
        };
        fits(&a.send, &b) && fits(&b.send, &a)
    }

    /// Two frames per epoch from a node on the link: a forged advertisement or
    /// probe for e-1 and one for e, every epoch. e-1 is never moved, e not without a confirmed
    /// probe, so nothing moves, nothing is sent, and the send routes keep matching.
    #[test]
    fn two_forged_frames_per_epoch_move_nothing() {
        let mut p = Pair::new(Mode::Encrypt, 5, 0.0, 0.0);
        for e in 100..120u64 {
            for t in [e * R_MS + 10, e * R_MS + R_MS / 2] {
                let now = at(t);
                let cur = Epoch(e);
                assert_eq!(
                    p.moves[0].on_collision(now, cur, Epoch(e - 1), 0, Evidence::Unconfirmed),
                    CollisionOutcome::PreviousEpoch
                );
                // Even a confirmed claim on e-1 does not move it: its packets are in flight.
                assert_eq!(
                    p.moves[0].on_collision(now, cur, Epoch(e - 1), 0, Evidence::Confirmed),
                    CollisionOutcome::PreviousEpoch
                );
                assert_eq!(
                    p.moves[0].on_collision(now, cur, cur, 0, Evidence::Unconfirmed),
                    CollisionOutcome::NeedsConfirmation
                );
                p.step(now);
                assert!(routes_agree(&p, now), "epoch {e}");
            }
        }
        assert_eq!(p.delivered, 0, "no notice at all");
        assert_eq!(p.moves[0].stats().collisions, 0);
        assert!(p.moves[0].moved().next().is_none());
    }

    /// A confirmed collision on the current epoch: A moves it, and its notice goes on e-1's
    /// route (the last one both sides agree on), not on the moved route B has not bound; B
    /// follows and the send routes match again within a few resends, despite loss.
    #[test]
    fn a_confirmed_current_epoch_move_converges_on_the_last_agreed_route() {
        for seed in 0..20 {
            let mut p = Pair::new(Mode::Encrypt, seed, 0.4, 0.2);
            let start = 100 * R_MS + 3_000;
            let cur = Epoch(100);
            assert_eq!(
                p.moves[0].on_collision(at(start), cur, cur, 0, Evidence::Confirmed),
                CollisionOutcome::Moved(1)
            );
            let sch = p.schedule(0, at(start));
            let mut out = [0u8; NOTICE_LEN];
            let route = p.moves[0].poll_transmit(at(start), &sch, &mut out).unwrap();
            assert_eq!(route, p.streams[0].route(Epoch(99)), "seed {seed}");
            let mut t = start + NOTICE_RESEND_MS;
            while !(p.moves[0].settled() && p.moves[1].settled()) {
                p.step(at(t));
                t += 20;
                assert!(t < start + 5_000, "seed {seed}: no agreement");
            }
            assert!(routes_agree(&p, at(t)), "seed {seed}");
            assert_eq!(p.moves[1].offset(cur), 1);
            // Agreed now: a later notice (about e+1) travels on the moved send route.
            p.moves[0].on_collision(at(t), cur, Epoch(101), 0, Evidence::Unconfirmed);
            let sch = p.schedule(0, at(t));
            let route = p.moves[0].poll_transmit(at(t), &sch, &mut out).unwrap();
            assert_eq!(
                route,
                p.streams[0].route_with_attempt(cur, 1),
                "seed {seed}"
            );
        }
    }

    /// Before this rule, a forged frame for e-1 and one for e moved both at A, and A's notice
    /// about e went out on its moved e-1 route, which B never bound: no agreement until e ended.
    /// The rule that prevents it is tested directly: after A moved e-1 (when it was current,
    /// and the peer has not answered yet), notices fall back to the send route, never to an
    /// unagreed e-1.
    #[test]
    fn notices_never_use_a_route_the_peer_has_not_shown() {
        let p = Pair::new(Mode::Encrypt, 1, 0.0, 0.0);
        let mut m = RouteMoves::new(&p.streams[0]);
        let t = at(100 * R_MS + 100);
        // Epoch 100 moved while current (confirmed), then the clock passes to 101.
        m.on_collision(t, Epoch(100), Epoch(100), 0, Evidence::Confirmed);
        let later = at(101 * R_MS + 100);
        m.on_collision(later, Epoch(101), Epoch(101), 0, Evidence::Confirmed);
        let sch = p.streams[0].schedule_moved(later, &m);
        let mut out = [0u8; NOTICE_LEN];
        let route = m.poll_transmit(later, &sch, &mut out).unwrap();
        // Neither 101 nor 100 is agreed: the send route is the best guess (the peer accepts
        // e-1 ..= e+1 and follows whichever notice arrives first).
        assert_eq!(route, sch.send);
    }

    #[test]
    fn a_local_move_follows_the_same_rules() {
        let p = Pair::new(Mode::Encrypt, 1, 0.0, 0.0);
        let mut m = RouteMoves::new(&p.streams[0]);
        let now = at(100 * R_MS);
        assert_eq!(
            m.move_locally(now, Epoch(100), Epoch(102)),
            CollisionOutcome::Moved(1)
        );
        assert_eq!(
            m.move_locally(now, Epoch(100), Epoch(102)),
            CollisionOutcome::Moved(2)
        );
        assert_eq!(
            m.move_locally(now, Epoch(100), Epoch(100)),
            CollisionOutcome::Moved(1)
        );
        assert_eq!(
            m.move_locally(now, Epoch(100), Epoch(99)),
            CollisionOutcome::PreviousEpoch
        );
        assert!(!m.settled());
    }

    #[test]
    fn link_announcements_authenticate_and_bind_to_their_route() {
        let p = Pair::new(Mode::Plain, 1, 0.0, 0.0);
        let (a, b) = (&p.streams[0], &p.streams[1]);
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        let sent = at(100 * R_MS + 10);
        let msg = p.moves[0].frame_link(&a.route(Epoch(100)), mac, sent);
        assert_eq!(msg[0], TYPE_LINK);
        assert_eq!(msg[2..8], mac);
        // No byte after the header-protected eight is constant across epochs: the pad differs.
        let next = p.moves[0].frame_link(&a.route(Epoch(101)), mac, sent);
        assert_ne!(msg[8..16], next[8..16]);
        assert_ne!(msg[8..16], [0u8; 8]);
        // Nor on one route: the stamp differs, and the clock does not show through the pad.
        let later = p.moves[0].frame_link(&a.route(Epoch(100)), mac, at(100 * R_MS + 11));
        assert_ne!(msg, later);
        assert_ne!(msg[8..16], sent.as_nanos().to_be_bytes());
        assert!(is_notice(&msg) && is_link_announcement(&msg));
        let on = b.route(Epoch(100));
        assert_eq!(p.moves[1].handle_link(&on, &msg), Ok((mac, sent)));
        // Another route, a flipped byte, a truncation, a multicast MAC: refused.
        assert_eq!(
            p.moves[1].handle_link(&b.route(Epoch(101)), &msg),
            Err(NoticeError::BadMac)
        );
        let mut f = msg;
        f[5] ^= 1;
        assert_eq!(p.moves[1].handle_link(&on, &f), Err(NoticeError::BadMac));
        assert_eq!(
            p.moves[1].handle_link(&on, &msg[..31]),
            Err(NoticeError::Malformed)
        );
        let multicast = p.moves[0].frame_link(&a.route(Epoch(100)), [0x33, 0x33, 0, 0, 0, 1], sent);
        assert_eq!(
            p.moves[1].handle_link(&on, &multicast),
            Err(NoticeError::Malformed)
        );
        // A notice is not an announcement and the other way round.
        assert_eq!(
            NoticePacket::new_checked(&msg).unwrap_err(),
            NoticeError::Malformed
        );
        let notice = p.moves[0].frame_notice(&a.route(Epoch(100)), Epoch(101), 1, false);
        assert_eq!(
            p.moves[1].handle_link(&on, &notice),
            Err(NoticeError::Malformed)
        );
    }
}
