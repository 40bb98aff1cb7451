//! Address collisions (001 §4.1.1; docs/PROTOCOL.md §5.2): a hashed address that another node
//! on the external link already holds (or is claiming) is left for a deterministic alternative
//! that both gateways agree on within the interval, instead of losing the interval.
//!
//! * **Detection** ([`CollisionWatch`], main thread). Addresses are bound with `nodad` so that
//!   they are usable at once (DAD delay was 001's first cause of loss), so the daemon probes
//!   them itself: one duplicate address probe per new address (a Neighbour Solicitation from
//!   `::` to the solicited-node group, as DAD sends), at an instant drawn from the last
//!   [`PROBE_LEAD_MS`] to three quarters of it before its epoch starts, not earlier
//!   ([`probe_window`]). A filtered packet socket receives every Neighbour
//!   Advertisement and probe on the external link. An advertisement from another node for one
//!   of our hashed addresses is only a *claim*: anyone on the link can forge one. The watch asks
//!   the claimant with a unicast confirmation probe; a **collision** is its solicited answer.
//!   A probe from another node for our address is defended by our kernel and only counted.
//! * **Agreement** (`mt6d_proto::moves::RouteMoves`, one per route set, driven through the
//!   peer's `mt6d_proto::link::Link`). The main thread hands the link each confirmed collision
//!   ([`apply_collisions`]) and the receiving worker each notice that arrives ([`on_notice`]); the link
//!   moves the epoch, queues the notices and acknowledgements, and asks for a new table.
//!
//! Nothing here runs per data packet: the packet socket's in-kernel filter drops everything but
//! solicitations and advertisements, and notices are handshake-class messages.

use std::net::Ipv6Addr;
use std::sync::atomic::Ordering;

use mt6d_os::capture::PacketCapture;
use mt6d_proto::link::Notice;
use mt6d_proto::moves::{CollisionOutcome, Evidence, MAX_OFFSET};
use mt6d_proto::wire::{confirmation_probe_frame, dad_probe_frame, NeighborClaim, NeighborFrame};
use mt6d_proto::{Epoch, Route, UnixTime};

use mt6d_proto::control_plan::SendWindow;

use super::error::GatewayError;
use super::peer::Peer;
use super::routing::RouteTable;
use super::session;
use super::shared::Shared;
use mt6d_proto::route_sets::RouteSet;
use std::sync::Arc;

/// Frames examined per tick at most: a flood of advertisements cannot hold the main thread.
const MAX_FRAMES_PER_TICK: usize = 256;
/// How long a confirmation probe waits for the holder's solicited answer. A holder's kernel
/// answers at once (RFC 4861 §7.2.4 has no delay for a unicast solicitation); 1 s also covers a
/// slow host and is short beside the probe lead.
const CONFIRM_WAIT_NS: u64 = 1_000_000_000;
/// Confirmation probes outstanding at most: a flood claiming our addresses from many forged
/// MACs costs at most this many unicast frames per `CONFIRM_WAIT_NS`.
const MAX_PENDING: usize = 16;
/// How long before its epoch starts a new address is probed (capped at half the interval): what
/// detection needs before use, and no more (see [`probe_due`]).
pub const PROBE_LEAD_MS: u64 = 1_000;

/// When the duplicate address probe for an address first used at `epoch_start` may go out:
/// from the lead (below) to three quarters of it before `epoch_start`, at an instant the caller
/// draws for each address on its own (docs/PROTOCOL.md §5.6), so that the probes of one rotation
/// leave in a fresh random order at offsets that say nothing about their stream.
///
/// Collision detection needs the probe before use: its answer, the confirmation probe and its
/// answer (two 20 ms ticks on a link), the move and the notice exchange (one round trip, a few
/// [`mt6d_proto::moves::NOTICE_RESEND`]s if notices are lost) must all finish before the first
/// packet. A probe sent earlier than that only reveals the future address earlier: an observer
/// on the link who sees the probe and then the traffic learns that this MAC will use that
/// address, while the previous epoch is still running. One second (half the interval at most,
/// so at the 1 s minimum interval it still comes after the previous boundary) is the lead; the
/// shortest lead drawn, three quarters of it (375 ms at R = 1 s), still leaves that exchange
/// more than a notice resend to spare.
pub fn probe_window(epoch_start: UnixTime, rotation_ms: u64) -> SendWindow {
    let lead_ns = PROBE_LEAD_MS.min(rotation_ms / 2).saturating_mul(1_000_000);
    let before = |ns: u64| UnixTime::from_nanos(epoch_start.as_nanos().saturating_sub(ns));
    SendWindow::new(before(lead_ns), before(lead_ns / 4 * 3))
}

/// A confirmation probe awaiting its answer.
#[derive(Debug, Clone, Copy)]
struct Pending {
    addr: Ipv6Addr,
    by: [u8; 6],
    sent: UnixTime,
}

/// What the watch saw since the last summary (logged once per rotation at most).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WatchSummary {
    /// Advertisements from other nodes naming one of our hashed addresses.
    pub advertisements: u64,
    /// Duplicate address probes from other nodes for one of them (our kernel defends them).
    pub probes: u64,
    /// Distinct link-layer addresses among them (counted up to 16).
    pub senders: Vec<[u8; 6]>,
    /// Confirmation probes sent, and claims they confirmed.
    pub confirmation_probes: u64,
    pub confirmed: u64,
}

impl WatchSummary {
    fn is_empty(&self) -> bool {
        self.advertisements == 0 && self.probes == 0
    }
}

/// The probe sender and advertisement watch of the external interface.
#[derive(Debug)]
pub struct CollisionWatch {
    capture: PacketCapture,
    mac: [u8; 6],
    /// Source of confirmation probes: the holder answers it, unicast.
    link_local: Ipv6Addr,
    buf: Vec<u8>,
    /// Duplicate address probes waiting for their drawn time ([`probe_window`]).
    queued: Vec<(Ipv6Addr, UnixTime)>,
    pending: Vec<Pending>,
    summary: WatchSummary,
    /// Probes sent, confirmation probes sent, claims seen and confirmed, frames that failed the
    /// parser (counted, never logged per frame).
    pub probes: u64,
    pub confirmation_probes: u64,
    pub claims: u64,
    pub confirmed: u64,
    pub malformed: u64,
}

/// A hashed address of ours that another node claims, confirmed by its answer to a unicast
/// probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collision {
    pub addr: Ipv6Addr,
    pub by: [u8; 6],
}

/// The EUI-64 link-local address of `mac` (RFC 4291 App. A), for an interface that has none.
fn eui64_link_local(m: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        m[0] ^ 0x02,
        m[1],
        m[2],
        0xff,
        0xfe,
        m[3],
        m[4],
        m[5],
    ])
}

impl CollisionWatch {
    /// Opens the watch on `interface`, whose link-layer address is `mac` and link-local address
    /// `link_local` (None: the EUI-64 one; the answer to a probe is sent to our MAC either way,
    /// from the option the probe carries).
    pub fn open(
        interface: &str,
        mac: [u8; 6],
        link_local: Option<Ipv6Addr>,
    ) -> Result<CollisionWatch, GatewayError> {
        let capture = PacketCapture::open_neighbor_discovery(interface).map_err(|source| {
            GatewayError::Os {
                what: format!("watch neighbour discovery on {interface}"),
                source,
            }
        })?;
        Ok(CollisionWatch {
            capture,
            mac,
            link_local: link_local.unwrap_or_else(|| eui64_link_local(mac)),
            buf: vec![0u8; 512],
            queued: Vec::new(),
            pending: Vec::new(),
            summary: WatchSummary::default(),
            probes: 0,
            confirmation_probes: 0,
            claims: 0,
            confirmed: 0,
            malformed: 0,
        })
    }

    /// The earliest drawn instant of a queued probe, if one is queued.
    pub fn next_due(&self) -> Option<UnixTime> {
        self.queued.iter().map(|(_, due)| *due).min()
    }

    /// The capture's descriptor, readable when a neighbour discovery frame arrived.
    pub fn capture_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::{AsFd, AsRawFd};
        self.capture.as_fd().as_raw_fd()
    }

    /// Queues one duplicate address probe for `addr`, sent at `due` (at once if past).
    pub fn probe_at(&mut self, addr: Ipv6Addr, due: UnixTime) {
        if !self.queued.iter().any(|(a, _)| *a == addr) {
            self.queued.push((addr, due));
        }
    }

    /// Sends the probes that are due, for addresses still bound (`ours`), in the order of
    /// their drawn instants.
    fn send_due(&mut self, now: UnixTime, ours: &impl Fn(Ipv6Addr) -> bool) {
        self.queued.retain(|(addr, _)| ours(*addr));
        if self.queued.iter().all(|(_, due)| *due > now) {
            return;
        }
        let mut due: Vec<(UnixTime, Ipv6Addr)> = Vec::new();
        self.queued.retain(|&(addr, at)| {
            if at <= now {
                due.push((at, addr));
            }
            at > now
        });
        due.sort();
        for (_, addr) in due {
            // A failure costs only the detection of that address; once per address.
            match self.capture.send(&dad_probe_frame(addr, self.mac)) {
                Ok(_) => self.probes += 1,
                Err(e) => log::debug!("duplicate address probe for {addr}: {e}"),
            }
        }
    }

    /// Asks `by`, which claimed `addr`, to answer for it (at most once per wait, per pair).
    fn confirm(&mut self, addr: Ipv6Addr, by: [u8; 6], now: UnixTime) {
        if self.pending.iter().any(|p| p.addr == addr && p.by == by) {
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            return;
        }
        let frame = confirmation_probe_frame(addr, self.link_local, self.mac, by);
        match self.capture.send(&frame) {
            Ok(_) => {
                self.confirmation_probes += 1;
                self.summary.confirmation_probes += 1;
                self.pending.push(Pending {
                    addr,
                    by,
                    sent: now,
                });
            }
            Err(e) => log::debug!("confirmation probe for {addr}: {e}"),
        }
    }

    /// Sends due probes, drains the frames received since the last call and returns the
    /// collisions confirmed; `ours` says whether an address is one of our bound hashed
    /// addresses. A claim (an advertisement from another node) only triggers a confirmation
    /// probe to its sender; a probe from another node for our address is defended by our own
    /// kernel (RFC 4862 §5.4.3) and only counted.
    pub fn poll(&mut self, now: UnixTime, ours: impl Fn(Ipv6Addr) -> bool) -> Vec<Collision> {
        self.send_due(now, &ours);
        self.pending
            .retain(|p| now.as_nanos() < p.sent.as_nanos().saturating_add(CONFIRM_WAIT_NS));
        let mut found = Vec::new();
        for _ in 0..MAX_FRAMES_PER_TICK {
            let n = match self.capture.recv_nowait(&mut self.buf) {
                Ok(Some(f)) => f.captured,
                Ok(None) => break,
                Err(e) => {
                    log::debug!("neighbour discovery watch: {e}");
                    break;
                }
            };
            let Some(frame) = self.buf.get(..n) else {
                break;
            };
            let f = match NeighborFrame::parse(frame) {
                Ok(f) => f,
                Err(_) => {
                    self.malformed += 1;
                    continue;
                }
            };
            if !f.claimed_by_other(self.mac) || !ours(f.target) {
                continue;
            }
            let by = f.lladdr.unwrap_or(f.eth_src);
            self.claims += 1;
            if self.summary.senders.len() < 16 && !self.summary.senders.contains(&by) {
                self.summary.senders.push(by);
            }
            match f.claim {
                NeighborClaim::Probe => self.summary.probes += 1,
                NeighborClaim::Advertisement => {
                    self.summary.advertisements += 1;
                    let answer = f.solicited && !f.dst.is_multicast();
                    let asked = self
                        .pending
                        .iter()
                        .position(|p| p.addr == f.target && p.by == by);
                    match (answer, asked) {
                        (true, Some(i)) => {
                            self.pending.swap_remove(i);
                            self.confirmed += 1;
                            self.summary.confirmed += 1;
                            let c = Collision { addr: f.target, by };
                            if !found.contains(&c) {
                                found.push(c);
                            }
                        }
                        _ => self.confirm(f.target, by, now),
                    }
                }
                NeighborClaim::Resolution => {}
            }
        }
        found
    }

    /// What was seen since the last call, then reset.
    pub fn take_summary(&mut self) -> WatchSummary {
        std::mem::take(&mut self.summary)
    }
}

/// Logs one line summarising a rotation's claims on our addresses, if there were any: a flood
/// of forged frames costs one line per rotation, not one per frame.
pub fn log_summary(s: &WatchSummary) {
    if s.is_empty() {
        return;
    }
    let senders: Vec<String> = s.senders.iter().map(|m| mac_text(*m)).collect();
    log::warn!(
        "neighbour messages claiming our hashed addresses since the last rotation: {} advertisement(s), {} duplicate address probe(s) from {}{}; {} confirmation probe(s) sent, {} answered (a collision)",
        s.advertisements,
        s.probes,
        senders.join(", "),
        if s.senders.len() >= 16 { " and more" } else { "" },
        s.confirmation_probes,
        s.confirmed
    );
}

fn mac_text(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// The peer, route set, epoch and attempt offset whose local address is `addr`, among the
/// accept routes of `table` (the offset is recomputed: the table may predate a move the rx
/// thread just applied).
fn owner(table: &RouteTable, addr: Ipv6Addr) -> Option<(usize, &Arc<RouteSet>, Epoch, u8)> {
    table.peers.iter().enumerate().find_map(|(i, routes)| {
        routes.sets.iter().find_map(|set| {
            let route = set.schedule.accept.iter().find(|r| *r.local.ip() == addr)?;
            let stream = &set.set.stream;
            let offset = (0..=MAX_OFFSET)
                .find(|&k| *stream.route_with_attempt(route.epoch, k).local.ip() == addr)?;
            Some((i, &set.set, route.epoch, offset))
        })
    })
}

/// Hands the collisions the watch saw to their peers' links, which move the epochs, send the
/// notices and ask for a new table.
pub fn apply_collisions(shared: &Shared, found: &[Collision], now: UnixTime) {
    let table = shared.table.load();
    for c in found {
        let Some((i, set, epoch, offset)) = owner(&table, c.addr) else {
            continue;
        };
        let p = table.peer(i);
        let mut link = p.link.lock();
        // Only confirmed claims reach here: the holder answered our unicast probe.
        let outcome = link.handle_collision(now, set, epoch, offset, Evidence::Confirmed);
        session::drain(p, &mut link, &table);
        // Visited in this tick: the move rebinds, and the link's deadline changed.
        shared.attention.push(table.generation, i);
        match outcome {
            CollisionOutcome::Moved(k) => log::warn!(
                "peer {}: hashed address {} of epoch {} is in use on the link by {}; both gateways move that epoch to attempt offset {k}",
                p.name,
                c.addr,
                epoch.0,
                mac_text(c.by)
            ),
            CollisionOutcome::Exhausted => log::warn!(
                "peer {}: hashed address {} of epoch {} is in use on the link by {}, and the epoch already moved {MAX_OFFSET} times; keeping it",
                p.name,
                c.addr,
                epoch.0,
                mac_text(c.by)
            ),
            // e-1 is never moved (PROTOCOL §5.2): the collision costs the rest of its packets
            // to this address, which the holder now shares; bounded by one interval.
            CollisionOutcome::AlreadyMoved
            | CollisionOutcome::OutsideWindow
            | CollisionOutcome::PreviousEpoch
            | CollisionOutcome::NeedsConfirmation => {}
        }
    }
}

/// Tells the peer whose send route is `route` our external MAC on it (once per send route, at
/// the instant the rotation drew for it: a lost copy is replaced on the next), so that it can
/// pin its neighbour entries for our hashed addresses. Nothing is sent if no peer of `table`
/// sends on `route` any more (it moved).
pub fn announce_link_on(table: &RouteTable, route: &Route, mac: [u8; 6], now: UnixTime) {
    let Some(set) = table
        .peers
        .iter()
        .map(|r| r.send_set())
        .find(|s| s.schedule.send == *route)
    else {
        return;
    };
    let msg = set.set.lock_moves().frame_link(route, mac, now);
    if let Some(socket) = table.sockets.get(&route.local.port()) {
        session::send_one(
            socket,
            &route.local,
            route.remote,
            &msg,
            set.set.stream.send_header_key(),
        );
    }
}

/// The receiving worker's handling of a notice from `peer` on `arrived_on`, a route of `set` (its
/// source already checked). Returns false if it was refused (counted).
pub fn on_notice(
    peer: &Peer,
    table: &RouteTable,
    set: &Arc<RouteSet>,
    arrived_on: &Route,
    bytes: &[u8],
    now: UnixTime,
) -> bool {
    let mut link = peer.link.lock();
    let result = link.handle_notice(now, set, arrived_on, bytes);
    session::drain(peer, &mut link, table);
    drop(link);
    match result {
        Ok(Notice::LinkAddress(mac)) => {
            if peer.set_lladdr(mac) {
                // The pins follow with the next table.
                peer.link.mark_changed();
                log::info!(
                    "peer {}: external link-layer address {} (authenticated); its hashed addresses are pinned to it",
                    peer.name,
                    mac_text(mac)
                );
            }
            true
        }
        Ok(Notice::Move { moved }) => {
            if moved {
                // At most MAX_OFFSET times per epoch: authenticated, so not attacker-driven.
                log::info!(
                    "peer {}: the peer moved a route away from an address collision",
                    peer.name
                );
            }
            true
        }
        // Counted, not logged: forged notices arrive at packet rate.
        Err(_) => {
            peer.notices_refused.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}
