//! What a server's workers and its main thread share: the registry behind its lock, the
//! workers' counters, the shutdown flag and the clients to re-index; each worker's kernel
//! objects; and the one way a client's link is drained (its queued messages sent, its events
//! applied), used by the worker that received a handshake-class message and by the main
//! thread's link timers alike.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use parking_lot::RwLock;

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
use mt6d_os::{Tun, UdpSocket6};
use mt6d_proto::endpoint::PeerId;
use mt6d_proto::link::{Event, Link};
use mt6d_proto::route_sets::RouteSet;

use super::registry::{Registry, Session};
use crate::daemon::wakeup::Nudge;
use crate::daemon::worker::WorkerLoad;

/// What the workers counted, all of them together (one relaxed add per batch and reason).
#[derive(Debug, Default)]
pub struct ServerCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// Datagrams to an (address, port) of the prefix that is no client's current route: scans,
    /// stale epochs, removed clients.
    pub rx_not_current: AtomicU64,
    /// Datagrams to a current route from another source than that client's hashed address.
    pub rx_wrong_source: AtomicU64,
    /// Datagrams that did not open: forged, replayed, damaged, too short.
    pub rx_rejected: AtomicU64,
    /// Link-layer announcements (the server pins no neighbour entry), and handshake messages
    /// for a client with a pre-shared key.
    pub rx_unsupported: AtomicU64,
    /// Route move notices and acks from clients that passed every check (docs/PROTOCOL.md §5.2).
    pub notices_received: AtomicU64,
    /// Route move notices refused: malformed, a bad MAC, an epoch outside the window.
    pub notices_refused: AtomicU64,
    /// Notices that moved a client's route of an epoch to a new attempt offset.
    pub routes_moved: AtomicU64,
    /// Handshake messages refused: no valid link MAC for a client with no session yet, or
    /// refused by the client's handshake (bad MAC, replay, stale, rate limit, Noise failure).
    pub rx_handshake_rejected: AtomicU64,
    /// Initiations answered.
    pub handshakes_answered: AtomicU64,
    /// Handshakes confirmed (the client's first packet under the new keys opened).
    pub handshakes_confirmed: AtomicU64,
    /// Data for a handshake client with no key for it (no session, or a key phase with no key).
    pub rx_no_key: AtomicU64,
    /// Datagrams larger than a receive buffer.
    pub rx_truncated: AtomicU64,
    /// Inner packets from the protected side to no client's true address.
    pub tx_no_client: AtomicU64,
    /// Inner packets that could not be sealed (too big, counter range used up, malformed).
    pub tx_seal_failed: AtomicU64,
    /// Inner packets to a pre-shared client whose key has protected as many packets as its AEAD
    /// allows in this run (docs/PROTOCOL.md §4.3): logged once per client; it needs a new key.
    pub tx_key_limit: AtomicU64,
    /// Inner packets to a handshake client with no send key (it has not handshaken, or its keys
    /// expired): the server never initiates, so they are dropped until the client does.
    pub tx_no_key: AtomicU64,
    /// Datagrams the kernel refused to send.
    pub tx_send_failed: AtomicU64,
    /// TUN writes the kernel refused.
    pub tun_write_failures: AtomicU64,
    /// Datagrams the kernel dropped in front of a worker (its socket's receive queue was full).
    pub socket_queue_drops: AtomicU64,
    /// Server addresses announced to the router before their epoch (priming, main thread).
    pub ns_primed: AtomicU64,
    /// Announcements the kernel refused.
    pub ns_prime_failures: AtomicU64,
}

impl ServerCounters {
    /// (name, value) of every counter, for logs and tests.
    pub fn snapshot(&self) -> Vec<(&'static str, u64)> {
        let r = |c: &AtomicU64| c.load(Ordering::Relaxed);
        vec![
            ("rx_packets", r(&self.rx_packets)),
            ("rx_bytes", r(&self.rx_bytes)),
            ("tx_packets", r(&self.tx_packets)),
            ("tx_bytes", r(&self.tx_bytes)),
            ("rx_not_current", r(&self.rx_not_current)),
            ("rx_wrong_source", r(&self.rx_wrong_source)),
            ("rx_rejected", r(&self.rx_rejected)),
            ("rx_unsupported", r(&self.rx_unsupported)),
            ("notices_received", r(&self.notices_received)),
            ("notices_refused", r(&self.notices_refused)),
            ("routes_moved", r(&self.routes_moved)),
            ("rx_handshake_rejected", r(&self.rx_handshake_rejected)),
            ("handshakes_answered", r(&self.handshakes_answered)),
            ("handshakes_confirmed", r(&self.handshakes_confirmed)),
            ("rx_no_key", r(&self.rx_no_key)),
            ("rx_truncated", r(&self.rx_truncated)),
            ("tx_no_client", r(&self.tx_no_client)),
            ("tx_seal_failed", r(&self.tx_seal_failed)),
            ("tx_key_limit", r(&self.tx_key_limit)),
            ("tx_no_key", r(&self.tx_no_key)),
            ("tx_send_failed", r(&self.tx_send_failed)),
            ("tun_write_failures", r(&self.tun_write_failures)),
            ("socket_queue_drops", r(&self.socket_queue_drops)),
            ("ns_primed", r(&self.ns_primed)),
            ("ns_prime_failures", r(&self.ns_prime_failures)),
        ]
    }
}

/// What every worker shares.
#[derive(Debug)]
pub struct Shared {
    pub registry: RwLock<Registry>,
    pub counters: ServerCounters,
    pub shutdown: AtomicBool,
    /// Handshake clients whose route sets changed: the main thread re-indexes them
    /// (`Registry::sync_sets`) and follows their links' timeouts.
    pub resync: Mutex<Vec<PeerId>>,
    /// Wakes the main thread: the push that finds `resync` empty, and a worker that ends.
    pub wake: Nudge,
    /// What each worker moved, by worker index (its own cache line).
    pub load: Box<[WorkerLoad]>,
}

impl Shared {
    /// Asks the main thread to re-index client `id`'s route sets.
    /// The push that finds the queue empty wakes the main thread (it takes the whole queue
    /// after each wake-up, so a later push finds it awake or about to wake).
    pub fn resync(&self, id: PeerId) {
        let first = {
            let mut q = self.resync.lock().unwrap_or_else(PoisonError::into_inner);
            q.push(id);
            q.len() == 1
        };
        if first {
            self.wake.nudge();
        }
    }
}

/// What handling a handshake-class input made the link do.
#[derive(Debug, Default, Clone, Copy)]
pub struct Drained {
    /// Route sets changed, or keys expired: re-index the client.
    pub resync: bool,
    /// A handshake was established (as responder: confirmed).
    pub established: bool,
    /// Datagrams the link queued and the kernel refused.
    pub send_failed: u64,
}

/// Sends what `session`'s link queued (through `raw`, when the caller has a socket) and drains
/// its events: the key changes go to the session's [`mt6d_proto::link::Keys`] (a new send key,
/// erased receive keys), the rest says what to re-index.
pub fn drain(session: &mut Session, mut raw: Option<(&RawUdp6, &mut RawSendScratch)>) -> Drained {
    let mut d = Drained::default();
    while let Some(t) = session.link.poll_transmit() {
        match &mut raw {
            Some((sock, scratch)) => {
                let msg = [RawSendMsg {
                    src: t.src,
                    dst: t.dst,
                    payload: &t.bytes,
                }];
                if !matches!(sock.send_batch(scratch, &msg), Ok(1)) {
                    d.send_failed += 1;
                }
            }
            // Only tests drain without a socket.
            None => log::debug!("dropped a {:?} queued on a timeout", t.kind),
        }
    }
    while let Some(ev) = session.link.poll_event(&mut session.keys) {
        match ev {
            Event::KeysErased => d.resync = true,
            Event::Established { .. } => d.established = true,
            Event::SessionSet { .. } | Event::SetReleased { .. } | Event::RoutesChanged => {
                d.resync = true;
            }
        }
    }
    d
}

/// The route set `set` of `link` (0: its link set), if it is still bound.
pub fn set_of(link: &Link, set: u64) -> Option<Arc<RouteSet>> {
    if set == 0 {
        return Some(link.sets().link().clone());
    }
    link.sets().bound_sets().find(|s| s.id == set).cloned()
}

/// One worker's kernel objects.
#[derive(Debug)]
pub struct WorkerIo {
    pub socket: UdpSocket6,
    pub raw: RawUdp6,
    pub tun: Tun,
}
