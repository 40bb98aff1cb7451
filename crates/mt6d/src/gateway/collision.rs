//! Address collisions (001 §4.1.1; docs/PROTOCOL.md §5.2): a hashed address that another node
//! on the external link already holds (or is claiming) is left for a deterministic alternative
//! that both gateways agree on within the interval, instead of losing the interval.
//!
//! * **Detection** ([`CollisionWatch`], main thread). Addresses are bound with `nodad` so that
//!   they are usable at once (DAD delay was 001's first cause of loss), so the daemon probes
//!   them itself: right after binding, one duplicate address probe per new address (a
//!   Neighbour Solicitation from `::` to the solicited-node group, as DAD sends). A filtered
//!   packet socket receives every Neighbour Advertisement and probe on the external link; one
//!   whose target is one of our hashed addresses and whose link-layer address is not ours is a
//!   collision, whether it answers our probe or arrives later unsolicited.
//! * **Agreement** (`mt6d_proto::moves::RouteMoves`, one per peer behind a mutex taken only for
//!   collisions, notices and the housekeeping tick). The main thread moves the epoch, rebinds
//!   and republishes the table, and sends the notices the state machine asks for; the rx thread
//!   hands it the notices that arrive ([`on_notice`]).
//!
//! Nothing here runs per data packet: the packet socket's in-kernel filter drops everything but
//! solicitations and advertisements, and notices are handshake-class messages.

use std::net::Ipv6Addr;
use std::sync::atomic::Ordering;

use mt6d_os::capture::PacketCapture;
use mt6d_proto::moves::{CollisionOutcome, MAX_OFFSET, NOTICE_LEN};
use mt6d_proto::wire::{dad_probe_frame, NeighborFrame};
use mt6d_proto::{Epoch, Route, UnixTime};

use super::dataplane::Shared;
use super::routing::{Peer, RouteTable};
use super::GatewayError;

/// Frames examined per tick at most: a flood of advertisements cannot hold the main thread.
const MAX_FRAMES_PER_TICK: usize = 256;

/// The probe sender and advertisement watch of the external interface.
#[derive(Debug)]
pub struct CollisionWatch {
    capture: PacketCapture,
    mac: [u8; 6],
    buf: Vec<u8>,
    /// Probes sent, frames that failed the parser (counted, never logged per frame).
    pub probes: u64,
    pub malformed: u64,
}

/// A hashed address of ours that another node claims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Collision {
    pub addr: Ipv6Addr,
    pub by: [u8; 6],
}

impl CollisionWatch {
    /// Opens the watch on `interface`, whose link-layer address is `mac`.
    pub fn open(interface: &str, mac: [u8; 6]) -> Result<CollisionWatch, GatewayError> {
        let capture = PacketCapture::open_neighbor_discovery(interface).map_err(|source| {
            GatewayError::Os {
                what: format!("watch neighbour discovery on {interface}"),
                source,
            }
        })?;
        Ok(CollisionWatch {
            capture,
            mac,
            buf: vec![0u8; 512],
            probes: 0,
            malformed: 0,
        })
    }

    /// Sends one duplicate address probe for `addr`. A failure is logged once per call (one per
    /// new address, on the main thread) and costs only the detection of that address.
    pub fn probe(&mut self, addr: Ipv6Addr) {
        match self.capture.send(&dad_probe_frame(addr, self.mac)) {
            Ok(_) => self.probes += 1,
            Err(e) => log::debug!("duplicate address probe for {addr}: {e}"),
        }
    }

    /// Drains the frames received since the last call; `ours` says whether an address is one of
    /// our bound hashed addresses.
    pub fn poll(&mut self, ours: impl Fn(Ipv6Addr) -> bool) -> Vec<Collision> {
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
            match NeighborFrame::parse(frame) {
                Ok(f) if f.claimed_by_other(self.mac) && ours(f.target) => {
                    let c = Collision {
                        addr: f.target,
                        by: f.lladdr.unwrap_or(f.eth_src),
                    };
                    if !found.contains(&c) {
                        found.push(c);
                    }
                }
                Ok(_) => {}
                Err(_) => self.malformed += 1,
            }
        }
        found
    }
}

fn mac_text(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// The peer, epoch and attempt offset whose local address is `addr`, among the accept routes of
/// `table` (the offset is recomputed: the table may predate a move the rx thread just applied).
fn owner(shared: &Shared, table: &RouteTable, addr: Ipv6Addr) -> Option<(usize, Epoch, u8)> {
    table.peers.iter().enumerate().find_map(|(i, routes)| {
        let route = routes
            .schedule
            .accept
            .iter()
            .find(|r| *r.local.ip() == addr)?;
        let stream = &shared.peers[i].stream;
        let offset = (0..=MAX_OFFSET)
            .find(|&k| *stream.route_with_attempt(route.epoch, k).local.ip() == addr)?;
        Some((i, route.epoch, offset))
    })
}

/// Applies the collisions the watch saw; true if a route moved (the table must be rebuilt).
pub fn apply_collisions(shared: &Shared, found: &[Collision], now: UnixTime) -> bool {
    let table = shared.table.load();
    let mut moved = false;
    for c in found {
        let Some((i, epoch, offset)) = owner(shared, &table, c.addr) else {
            continue;
        };
        let p = &shared.peers[i];
        let current = p.stream.epoch_at(now);
        let outcome = p.lock_moves().on_collision(now, current, epoch, offset);
        match outcome {
            CollisionOutcome::Moved(k) => {
                moved = true;
                log::warn!(
                    "peer {}: hashed address {} of epoch {} is in use on the link by {}; both gateways move that epoch to attempt offset {k}",
                    p.name,
                    c.addr,
                    epoch.0,
                    mac_text(c.by)
                );
            }
            CollisionOutcome::Exhausted => log::warn!(
                "peer {}: hashed address {} of epoch {} is in use on the link by {}, and the epoch already moved {MAX_OFFSET} times; keeping it",
                p.name,
                c.addr,
                epoch.0,
                mac_text(c.by)
            ),
            CollisionOutcome::AlreadyMoved | CollisionOutcome::OutsideWindow => {}
        }
    }
    moved
}

/// Housekeeping for every peer: forget epochs that left the window, and whether the rx thread
/// applied a peer's move since the last tick (then the table must be rebuilt).
pub fn take_peer_moves(shared: &Shared, now: UnixTime) -> bool {
    let mut changed = false;
    for p in &shared.peers {
        p.lock_moves().expire(p.stream.epoch_at(now));
        changed |= p.moves_changed.swap(false, Ordering::Relaxed);
    }
    changed
}

/// Sends the notices and acks every peer's state machine has due, on the published table.
pub fn send_notices(shared: &Shared, table: &RouteTable, now: UnixTime) {
    for (p, routes) in shared.peers.iter().zip(&table.peers) {
        let mut moves = p.lock_moves();
        let mut out = [0u8; NOTICE_LEN];
        while let Some(route) = moves.poll_transmit(now, &routes.schedule, &mut out) {
            if let Some(socket) = table.sockets.get(&route.local.port()) {
                super::session::send_one(
                    socket,
                    &route.local,
                    route.remote,
                    &out,
                    p.stream.send_header_key(),
                );
            }
        }
    }
}

/// The rx thread's handling of a notice from `peer` on `arrived_on` (its source already
/// checked). Returns false if it was refused (counted).
pub fn on_notice(peer: &Peer, arrived_on: &Route, bytes: &[u8], now: UnixTime) -> bool {
    let current = peer.stream.epoch_at(now);
    let result = peer
        .lock_moves()
        .handle_notice(now, current, arrived_on, bytes);
    match result {
        Ok(outcome) => {
            if outcome.moved {
                peer.moves_changed.store(true, Ordering::Relaxed);
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
