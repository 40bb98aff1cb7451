//! The daemon's driver of each peer's `mt6d_proto::link::Link` (docs/ARCHITECTURE.md, "The
//! endpoint contract"), and how the threads use the keys it hands out (`PeerKeys`, in
//! `peer.rs`; docs/PROTOCOL.md §9).
//!
//! * A **worker** sealing for the peer uses `PeerKeys::send`, one atomic pointer load per
//!   packet, no lock; it raises `want` when it has no key.
//! * The **peer's worker** (the one that receives for it) holds the peer's [`ReceiveKeys`]
//!   (`Peer::recv`) while it opens a train. It hands the link the handshake messages and
//!   notices that arrive (it is the thread they arrive on, [`on_message`],
//!   `collision::on_notice`) and the first packet opened under a new key ([`on_confirmed`]); it
//!   raises `empty_slot` for a packet naming a key phase it has no key for.
//! * The **main** thread visits a peer ([`tick`]) when its link's deadline passed or a packet
//!   thread flagged it (`link_timers.rs`): it passes the flags on and runs the link's timeout.
//!
//! After every input the caller drains the link ([`drain`]): it sends what the link queued and
//! drains its events. The link applies its key changes itself through `PeerKeys`' side of
//! `mt6d_proto::link::KeyStore` (publishes a new sending key, flags the receive keys for
//! erasure); what comes back asks for a new route table or is logged. The per-peer lock is taken only for these: a few times per rekey interval and
//! once per due timeout, never per data packet.

use std::net::SocketAddrV6;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mt6d_os::{SendMsg, SendScratch, UdpSocket6};
use mt6d_proto::handshake::ReceiveKeys;
use mt6d_proto::link::{Event, Link};
use mt6d_proto::route_sets::RouteSet;
use mt6d_proto::tunnel::HeaderKey;
use mt6d_proto::{KeyPhase, Route, UnixTime};

use super::counter_state::{CounterState, Reserved};
use super::peer::Peer;
use super::routing::RouteTable;
use crate::daemon::entropy::entropy;

/// Largest control message [`send_one`] protects on its stack (handshake messages are 129 and 73
/// bytes, notices 32, keepalives 24).
const MAX_CONTROL_LEN: usize = 512;

/// Sends one control datagram (a handshake message, keepalive, notice or announcement) from
/// `src` to `dst`, its first 8 bytes masked with `header` (the stream's send header key,
/// docs/PROTOCOL.md §4.5; None in plain mode).
pub(super) fn send_one(
    socket: &UdpSocket6,
    src: &SocketAddrV6,
    dst: SocketAddrV6,
    payload: &[u8],
    header: Option<&HeaderKey>,
) -> bool {
    let mut protected = [0u8; MAX_CONTROL_LEN];
    let payload = match header {
        None => payload,
        Some(hk) => {
            let Some(buf) = protected.get_mut(..payload.len()) else {
                log::error!(
                    "control message of {} bytes to {dst} exceeds {MAX_CONTROL_LEN}; not sent",
                    payload.len()
                );
                return false;
            };
            buf.copy_from_slice(payload);
            if let Err(e) = hk.protect(buf) {
                log::error!("control message to {dst}: {e}; not sent");
                return false;
            }
            &*buf
        }
    };
    send_datagram(socket, src, dst, payload)
}

/// Sends one datagram whose header protection is already applied.
fn send_datagram(
    socket: &UdpSocket6,
    src: &SocketAddrV6,
    dst: SocketAddrV6,
    payload: &[u8],
) -> bool {
    let mut scratch = SendScratch::new(1);
    let msg = SendMsg {
        src: *src.ip(),
        dst,
        payload,
        segment_size: None,
    };
    match socket.send_batch(&mut scratch, &[msg]) {
        Ok(1) => true,
        Ok(_) => false,
        Err(e) => {
            log::debug!("control message to {dst}: {e}");
            false
        }
    }
}

/// Sends what `link` queued (on the sockets of `table`) and applies its events to `peer`. Call
/// with the link's lock held, after every input.
pub fn drain(peer: &Peer, link: &mut Link, table: &RouteTable) {
    let mut keys = &peer.keys;
    while let Some(e) = link.poll_event(&mut keys) {
        apply(peer, e);
    }
    while let Some(t) = link.poll_transmit() {
        let Some(socket) = table.sockets.get(&t.src.port()) else {
            // The table predates the set the link chose (it is rebuilt at the next tick); the
            // link's retry or resend timer covers the loss.
            log::debug!(
                "peer {}: no socket for {} yet; {:?} to {} not sent",
                peer.name,
                t.src,
                t.kind,
                t.dst
            );
            continue;
        };
        send_datagram(socket, &t.src, t.dst, &t.bytes);
    }
}

fn apply(peer: &Peer, e: Event) {
    match e {
        Event::KeysErased => log::warn!(
            "peer {}: no successful rekey for {} rekey intervals; keys erased, traffic stops until a handshake succeeds",
            peer.name,
            mt6d_proto::handshake::REJECT_AFTER_REKEYS
        ),
        Event::Established {
            initiator,
            rekey,
            key_id,
        } => {
            let role = if initiator { "initiator" } else { "responder" };
            if rekey {
                log::debug!(
                    "peer {}: rekeyed as {role}, send key {key_id:016x}",
                    peer.name
                );
            } else {
                log::info!(
                    "peer {}: handshake complete as {role}, send key {key_id:016x}",
                    peer.name
                );
            }
        }
        Event::SessionSet { id, activation } => log::debug!(
            "peer {}: session route set {id} from epoch {}",
            peer.name,
            activation.0
        ),
        Event::SetReleased { id } => log::debug!("peer {}: route set {id} released", peer.name),
        Event::RoutesChanged => peer.link.mark_changed(),
    }
}

/// How often a pre-shared key's counter reservation is looked at: it is renewed once half a
/// block remains (2^16 packets with AES-256-GCM, 2^25 with ChaCha20-Poly1305): 3 million and
/// 1.6 billion packets per second of headroom, for one look per pre-shared peer every 20 ms.
const COUNTER_CHECK: Duration = Duration::from_millis(20);

/// The main thread's visit of one peer (due by its link's deadline, or flagged by a packet
/// thread): reserve a pre-shared sealer's next counter block, pass the packet threads' requests
/// to the link, run its timeout when due, and drain it. Returns when to visit next (None: only
/// a flag brings it back) and whether its routes changed (then the table must be rebuilt).
pub fn tick(peer: &Peer, table: &RouteTable, now: UnixTime) -> (Option<UnixTime>, bool) {
    let mut next = None;
    if let Some(counter) = &peer.keys.counter {
        reserve_counters(peer, counter);
        next = Some(after(now, COUNTER_CHECK));
    }
    // What the peer sealed under its newest key, read before the link is locked (a worker
    // holds the receive keys, then the link, for a handshake message): the packet budget holds
    // against both directions, so a peer that never initiates (a server) is rekeyed by us.
    let seen = peer.keys.handshake.then(|| {
        peer.recv
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .newest_packets_seen()
    });
    let mut link = peer.link.lock();
    if let Some(seen) = seen {
        link.note_received(seen);
    }
    if peer.keys.want.swap(false, Ordering::Relaxed) {
        link.handle_no_send_key();
    }
    if peer.keys.empty_slot.swap(false, Ordering::Relaxed) && link.handle_empty_slot(now) {
        log::debug!(
            "peer {}: a packet named a key phase with no key; handshake requested",
            peer.name
        );
    }
    if link.poll_timeout().is_some_and(|t| t <= now) {
        link.handle_timeout(now, entropy);
    }
    drain(peer, &mut link, table);
    let timeout = link.poll_timeout();
    drop(link);
    let next = match (next, timeout) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    (next, peer.link.changed.swap(false, Ordering::Relaxed))
}

fn after(t: UnixTime, d: Duration) -> UnixTime {
    UnixTime::from_nanos(t.as_nanos().saturating_add(d.as_nanos() as u64))
}

/// Keeps a pre-shared sealer's reserved counters ahead of its traffic (docs/PROTOCOL.md §4.3):
/// the fsync happens here, on the timer, never on a packet thread.
fn reserve_counters(peer: &Peer, counter: &Mutex<CounterState>) {
    let send = peer.keys.send.load();
    let Some(sealer) = send.as_ref() else {
        return;
    };
    let Some(next) = sealer.next_counter() else {
        return;
    };
    let mut state = counter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if sealer.take_key_limit_notice() {
        log::error!(
            "peer {}: its pre-shared key has protected its limit of {} packets ({}, docs/PROTOCOL.md §4.3); packets to it are dropped (key_limit): give the peer a new key",
            peer.name,
            state.limit(),
            peer.stream.config().aead
        );
    }
    let was_failing = state.failing();
    match state.reserve_ahead(next) {
        Ok(Some(Reserved::Until(limit))) => {
            sealer.reserve_until(limit);
            if was_failing {
                log::info!("peer {}: send counter state written again", peer.name);
            }
        }
        Ok(Some(Reserved::Restart { first, end })) => {
            log::warn!(
                "peer {}: another daemon on this machine reserved send counters of the same pre-shared key; continuing above its reservation (two daemons must not hold one key)",
                peer.name
            );
            let fresh = peer
                .stream
                .sealer(first, end)
                .with_key_limit(state.limit());
            peer.keys.send.store(Some(Arc::new(fresh)));
        }
        Ok(None) => {}
        // Logged once per outage: the tick retries every 20 ms.
        Err(e) if !was_failing => log::error!(
            "peer {}: cannot reserve send counters ({e}); packets are dropped once the reserved ones run out",
            peer.name
        ),
        Err(_) => {}
    }
}

/// A clean stop, after every packet thread ended: retires a pre-shared sealer and gives back the
/// counters it reserved and did not use (docs/PROTOCOL.md §4.3), so a restart does not charge
/// the key's packet limit with them.
pub fn release_counters(peer: &Peer) {
    let (Some(counter), Some(sealer)) = (&peer.keys.counter, peer.keys.send.load_full()) else {
        return;
    };
    let next = sealer.retire();
    let mut state = counter
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Err(e) = state.release(next) {
        log::warn!(
            "peer {}: cannot give back its unused send counters ({e}); they stay spent",
            peer.name
        );
    }
}

/// The receiving worker's handling of a handshake message from `peer` on `arrived_on`, a route of its
/// set `set`. The message's MAC and header protection are the set's, and so are the reply's,
/// which travels on the same set's current route (docs/PROTOCOL.md §9.8). Returns false if it
/// was rejected (counted in the handshake failures).
pub fn on_message(
    peer: &Peer,
    table: &RouteTable,
    set: &Arc<RouteSet>,
    arrived_on: &Route,
    bytes: &[u8],
    recv: &mut ReceiveKeys,
    now: UnixTime,
) -> bool {
    let mut link = peer.link.lock();
    let result = link.handle_handshake(now, set, arrived_on, bytes, recv, entropy);
    drain(peer, &mut link, table);
    match result {
        Ok(()) => {
            peer.counters
                .handshakes_rx
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            true
        }
        Err(err) => {
            log::debug!("peer {}: handshake message rejected: {err}", peer.name);
            false
        }
    }
}

/// The receiving worker opened the first packet under the receive key of `phase` (`key`: its key id): a
/// responder may now send with the matching new key.
pub fn on_confirmed(
    peer: &Peer,
    table: &RouteTable,
    phase: KeyPhase,
    key: Option<u64>,
    now: UnixTime,
) {
    let mut link = peer.link.lock();
    link.handle_confirmed(now, phase, key);
    drain(peer, &mut link, table);
}
