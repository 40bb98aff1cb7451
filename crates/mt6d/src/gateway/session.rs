//! The daemon's side of the handshake, and how the threads use each peer's data keys (`PeerKeys`,
//! in `peer.rs`; docs/PROTOCOL.md §9, docs/ARCHITECTURE.md "Keys").
//!
//! * The **tx** thread seals with `PeerKeys::send`, one atomic pointer load per packet, no lock.
//! * The **rx** thread owns each peer's [`ReceiveKeys`] and handles handshake messages as they
//!   arrive (it is the thread they arrive on): it installs receive keys, publishes an initiator's
//!   new send key at once and a responder's once the peer confirmed it.
//! * The **main** thread's timer ([`tick`]) starts initiations (first contact, retries, rekeys)
//!   and retires keys that outlived their rekey deadline.
//!
//! The per-peer [`Mutex`] is taken only for handshake events: a few times per rekey interval.

use std::net::SocketAddrV6;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use mt6d_os::{SendMsg, SendScratch, UdpSocket6};
use mt6d_proto::handshake::{Outcome, ReceiveKeys};
use mt6d_proto::tunnel::HeaderKey;
use mt6d_proto::{KeyPhase, Route, Sealer, UnixTime};

use super::counter_state::CounterState;
use super::peer::Peer;
use super::routing::RouteTable;
use super::shared::Shared;
use mt6d_proto::route_sets::Change;

/// 32 bytes from the OS for one handshake message, asked for only once a message is due or has
/// passed the MAC (a flood of bogus messages costs no syscall). If the OS has none to give, no
/// handshake message is produced.
fn entropy() -> Option<[u8; 32]> {
    let mut e = [0u8; 32];
    match getrandom::fill(&mut e) {
        Ok(()) => Some(e),
        Err(err) => {
            log::error!("no randomness from the OS for a handshake: {err}");
            None
        }
    }
}

/// Largest control message [`send_one`] protects on its stack (handshake messages are 129 and 73
/// bytes, notices 32, keepalives 24).
const MAX_CONTROL_LEN: usize = 512;

/// Sends one handshake-class datagram (or keepalive) from `src` to `dst`, its first 8 bytes
/// masked with `header` (the stream's send header key, docs/PROTOCOL.md §4.5; None in plain mode).
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
            log::debug!("handshake send to {dst}: {e}");
            false
        }
    }
}

/// The timer's work for one peer: reserve a pre-shared sealer's next counter block, retire
/// expired keys, start an initiation when one is due.
pub fn tick(peer: &Peer, index: usize, table: &RouteTable, now: UnixTime) {
    if let Some(counter) = &peer.keys.counter {
        reserve_counters(peer, counter);
    }
    let Some(mut side) = peer.keys.lock() else {
        return;
    };
    if peer.keys.want.swap(false, Ordering::Relaxed) {
        side.hs.want_handshake();
    }
    if peer.keys.empty_slot.swap(false, Ordering::Relaxed) && side.hs.packet_for_empty_slot(now) {
        log::debug!(
            "peer {}: a packet named a key phase with no key; handshake requested",
            peer.name
        );
    }
    if side.hs.keys_expired(now) && peer.keys.send.load().is_some() {
        log::warn!(
            "peer {}: no successful rekey for {} rekey intervals; keys erased, traffic stops until a handshake succeeds",
            peer.name,
            mt6d_proto::handshake::REJECT_AFTER_REKEYS
        );
        peer.keys.send.store(None);
        side.pending_send.clear();
        peer.keys.erase_recv.store(true, Ordering::Relaxed);
        // The session sets go with their keys: back to the link set (docs/PROTOCOL.md §9.8).
        peer.sets.lock().reset();
        peer.sets.mark_changed();
    }
    let Some(routes) = table.peers.get(index) else {
        return;
    };
    // Initiations travel on the set data is sent on (a rekey chains on the session's routes);
    // after RECOVERY_AFTER unanswered ones, on the link set, which a peer that lost its
    // session (a restart) still has bound (docs/PROTOCOL.md §9.8, "Initiations").
    let epoch = peer.stream.epoch_at(now);
    let chosen = peer
        .sets
        .lock()
        .initiation_set(epoch, side.hs.attempts())
        .clone();
    let Some(set) = routes
        .sets
        .iter()
        .position(|s| Arc::ptr_eq(&s.set, &chosen))
    else {
        // Bound at the next tick (the table predates the change).
        return;
    };
    let Some((route, socket)) = table.route_of(index, set) else {
        return;
    };
    let set = &routes.sets[set].set;
    let sent = peer.keys.send.load().as_ref().map_or(0, |s| s.sealed());
    if let Some(init) = side.hs.poll_on(now, route, set.mac.as_ref(), sent, entropy) {
        log::debug!(
            "peer {}: handshake initiation to {} on {} set {}",
            peer.name,
            route.remote,
            if set.is_link() { "the link" } else { "session" },
            set.id
        );
        send_one(
            socket,
            &route.local,
            route.remote,
            &init,
            set.stream.send_header_key(),
        );
    }
}

/// Housekeeping of every peer's route sets (docs/PROTOCOL.md §9.8): forgets answers never
/// confirmed, releases parents the peer no longer uses, and reports whether a set was bound or
/// released since the last call (then the table must be rebuilt).
pub fn take_set_changes(shared: &Shared, now: UnixTime) -> bool {
    let mut changed = false;
    for routes in &shared.table.load().peers {
        let p = &routes.peer;
        if let Some(Change::Released { id }) = p.sets.lock().expire(p.stream.epoch_at(now), now) {
            log::debug!("peer {}: route set {id} released", p.name);
            changed = true;
        }
        changed |= p.sets.changed.swap(false, Ordering::Relaxed);
    }
    changed
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
    let was_failing = state.failing();
    match state.reserve_ahead(next) {
        Ok(Some(limit)) => {
            sealer.reserve_until(limit);
            if was_failing {
                log::info!("peer {}: send counter state written again", peer.name);
            }
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

/// The rx thread's handling of a handshake message from `peer` on `arrived_on`, a route of its
/// set `set` in `table`. The message's MAC and header protection are the set's, and so are the
/// reply's, which travels on the same set's current route (docs/PROTOCOL.md §9.8). Returns
/// false if it was rejected (counted in the handshake failures).
#[allow(clippy::too_many_arguments)]
pub fn on_message(
    peer: &Peer,
    index: usize,
    table: &RouteTable,
    set: usize,
    arrived_on: &Route,
    bytes: &[u8],
    recv: &mut ReceiveKeys,
    now: UnixTime,
) -> bool {
    let Some(mut side) = peer.keys.lock() else {
        return false;
    };
    let Some((reply_route, socket)) = table.route_of(index, set) else {
        return false;
    };
    let set = &table.peers[index].sets[set].set;
    let header = set.stream.send_header_key();
    let epoch = peer.stream.epoch_at(now);
    match side.hs.handle_on(
        now,
        arrived_on,
        reply_route,
        set.mac.as_ref(),
        bytes,
        entropy,
    ) {
        Ok(Outcome::Responded { reply, keys }) => {
            let id = keys.recv.key_id().unwrap_or(0);
            peer.sets.lock().answered(
                &peer.stream,
                id,
                &keys.route,
                keys.initiation_epoch,
                set.clone(),
                now,
            );
            peer.sets.mark_changed();
            recv.install(keys.recv, false, now);
            side.pending_send.push((id, Arc::new(keys.send)));
            // Bounded like the receive side's spare keys.
            if side.pending_send.len() > mt6d_proto::handshake::MAX_PENDING {
                side.pending_send.remove(0);
            }
            send_one(
                socket,
                &reply_route.local,
                reply_route.remote,
                &reply,
                header,
            );
            log::debug!("peer {}: answered a handshake initiation", peer.name);
            true
        }
        Ok(Outcome::Completed { keys, rekey }) => {
            // The response came back on the set the initiation went out on: the new session's
            // parent, which carries its data until the activation epoch.
            let new = peer.sets.lock().completed(
                &peer.stream,
                &keys.route,
                keys.initiation_epoch,
                set.clone(),
                epoch,
            );
            peer.sets.mark_changed();
            log::debug!(
                "peer {}: session route set {} from epoch {}",
                peer.name,
                new.id,
                new.activation.0
            );
            recv.install(keys.recv, true, now);
            let sealer = Arc::new(keys.send);
            // The keepalive makes the responder confirm the keys even if no data is waiting.
            let mut ka = [0u8; mt6d_proto::tunnel::KEEPALIVE_LEN];
            if let Ok(n) = sealer.seal_keepalive(reply_route, &mut ka) {
                send_one(
                    socket,
                    &reply_route.local,
                    reply_route.remote,
                    &ka[..n],
                    header,
                );
            }
            log_established(peer, rekey, &sealer, "initiator");
            peer.keys.send.store(Some(sealer));
            side.pending_send.clear();
            // Requests raised while there was no key are answered by this handshake.
            peer.keys.want.store(false, Ordering::Relaxed);
            true
        }
        Err(err) => {
            log::debug!("peer {}: handshake message rejected: {err}", peer.name);
            false
        }
    }
}

/// The rx thread opened the first packet under the receive key of `phase` (`key`: its key id): a
/// responder may now send with the matching new key.
pub fn on_confirmed(peer: &Peer, phase: KeyPhase, key: Option<u64>, now: UnixTime) {
    let Some(mut side) = peer.keys.lock() else {
        return;
    };
    let rekey = side.hs.stats().completed > 0;
    if side.hs.confirm(now, phase) {
        let at = side
            .pending_send
            .iter()
            .position(|(id, _)| Some(*id) == key);
        let chosen = at.map(|i| side.pending_send.swap_remove(i).1);
        side.pending_send.clear();
        let epoch = peer.stream.epoch_at(now);
        if let Some(id) = peer.sets.lock().confirmed(key, epoch) {
            peer.sets.mark_changed();
            log::debug!("peer {}: session route set {id} confirmed", peer.name);
        }
        if let Some(sealer) = chosen {
            log_established(peer, rekey, &sealer, "responder");
            peer.keys.send.store(Some(sealer));
            peer.keys.want.store(false, Ordering::Relaxed);
        }
    }
}

fn log_established(peer: &Peer, rekey: bool, sealer: &Sealer, role: &str) {
    let id = sealer.key_id().unwrap_or(0);
    if rekey {
        log::debug!("peer {}: rekeyed as {role}, send key {id:016x}", peer.name);
    } else {
        log::info!(
            "peer {}: handshake complete as {role}, send key {id:016x}",
            peer.name
        );
    }
}
