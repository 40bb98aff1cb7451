//! The server's data-plane workers. Each worker is one thread with one epoll over its own TUN
//! queue and its own transparent socket (all on the one tproxy port, SO_REUSEPORT), and sends
//! through its own raw UDP socket:
//!
//! ```text
//! rx: recvmmsg (UDP GRO) on the transparent socket, each datagram with the (hashed address,
//!     port) it was sent to -> client and epoch by that pair (the endpoint index) -> source
//!     checked against the client's hashed address and port of that epoch -> header protection
//!     removed -> Opener::open (replay window) -> TUN write with GRO coalescing
//! tx: TUN read (GSO split) -> client by (server true, client true) -> Sealer::seal -> header
//!     protection -> sendmmsg on the raw socket, each datagram from the client's current server
//!     (address, port) to its hashed (address, port)
//! ```
//!
//! The receive half is in `receive.rs`, the send half below. The registry's read lock is taken
//! once per batch, never per packet; a client's opener lock
//! (pre-shared key) or session lock (handshake) once per received batch of that client, and a
//! handshake client's session lock once per sent packet (a pre-shared client's sealer takes
//! none). Nothing here allocates or logs per data packet. A datagram to an (address, port) that
//! is not a current route of some client, or from the wrong source, is dropped and counted, and
//! nothing is sent back: a scan of the prefix learns nothing.
//!
//! A client's route move notice (docs/PROTOCOL.md §5.2) is handled here too, by the worker that
//! received it, under that client's own lock (`Registry::handle_notice`, or the handshake
//! client's link); a move queues the client for the main thread, which re-derives its moved
//! routes (`Registry::sync_moves`).
//!
//! A handshake client's messages are handled here, by the worker that received them: the first
//! one must carry a valid link MAC before any state is made for the client (one BLAKE3); then the
//! client's responder-only link answers it (two Diffie-Hellman), the answer leaves at once
//! through this worker's raw socket, and the client goes on the main thread's list to have its
//! new route sets indexed (`Registry::sync_sets`), which happens well before the client sends
//! on them (two epochs after its initiation, docs/PROTOCOL.md §9.8).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use parking_lot::RwLock;

use mt6d_proto::endpoint::PeerId;
use mt6d_proto::link::{Event, Link};
use mt6d_proto::route_sets::RouteSet;
use mt6d_proto::{SealError, UnixTime};

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
use mt6d_os::{Epoll, Tun, TunRecvScratch, UdpSocket6, IDEAL_BATCH_SIZE};

use super::receive::Receive;
use super::registry::{bump, Registry, Session};
use crate::daemon::clock;
use crate::daemon::worker::{self, Carried, Packets, Wake, WorkerLoad, TUN_TOKEN};

const SOCKET_TOKEN: u64 = 0;

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
    /// What each worker moved, by worker index (its own cache line).
    pub load: Box<[WorkerLoad]>,
}

impl Shared {
    /// Asks the main thread to re-index client `id`'s route sets.
    pub fn resync(&self, id: PeerId) {
        self.resync
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(id);
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

/// Sends what `session`'s link queued (through `raw`, when the caller has a socket) and applies
/// its events: a new send key, erased receive keys, route sets to re-index.
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
    while let Some(ev) = session.link.poll_event() {
        match ev {
            Event::SendKey(k) => session.send = k,
            Event::KeysExpired => {
                session.recv.clear();
                session.expired = true;
                d.resync = true;
            }
            Event::Established { .. } => {
                session.expired = false;
                d.established = true;
            }
            Event::SessionSet { .. } | Event::SetReleased { .. } | Event::RoutesChanged => {
                d.resync = true;
            }
        }
    }
    d
}

/// The route set `set` of `link` (0: its link set), if it is still bound.
pub(super) fn set_of(link: &Link, set: u64) -> Option<Arc<RouteSet>> {
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

/// Serves `io` until shutdown: the kit's worker loop ([`worker::serve`]) with the server's
/// receive and send halves plugged in. `index` names the worker's [`WorkerLoad`].
pub fn worker_loop(
    shared: &Arc<Shared>,
    io: &WorkerIo,
    tun_mtu: usize,
    index: usize,
) -> mt6d_os::Result<()> {
    let epoll = Epoll::new()?;
    use std::os::fd::AsRawFd;
    io.socket.set_nonblocking(true)?;
    io.tun.set_nonblocking(true)?;
    epoll.add(io.socket.as_raw_fd(), SOCKET_TOKEN)?;
    epoll.add(io.tun.as_raw_fd(), TUN_TOKEN)?;
    let mut packets = ServerPackets {
        shared,
        io,
        rx: Receive::new(tun_mtu),
        tx: Transmit::new(tun_mtu),
    };
    let load = &shared.load[index % shared.load.len()];
    // Not placed: placement judges light traffic by bytes, and a server's requests are light in
    // bytes but not in packets. With its workers restricted to one CPU, the response time at
    // 10,000-30,000 requests/s rose 3-9 times in interleaved runs (2026-11-28).
    worker::serve(&epoll, index, load, None, &mut packets)
}

/// The server's side of a worker: its kernel objects and buffers.
struct ServerPackets<'a> {
    shared: &'a Shared,
    io: &'a WorkerIo,
    rx: Receive,
    tx: Transmit,
}

impl Packets for ServerPackets<'_> {
    fn outbound(&mut self, _wake: &mut Wake) -> Carried {
        self.tx.on_readable(self.shared, self.io)
    }

    fn inbound(&mut self, _token: u64, _wake: &mut Wake) -> Carried {
        self.rx.on_readable(self.shared, self.io)
    }

    fn stopping(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
    }
}

struct Transmit {
    max_wire: usize,
    scratch: TunRecvScratch,
    packets: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    sealed: Vec<u8>,
    /// (start, len, source, destination) of each sealed datagram in `sealed`.
    spans: Vec<(usize, usize, std::net::SocketAddrV6, std::net::SocketAddrV6)>,
    send_scratch: RawSendScratch,
    msgs_store: Vec<RawSendMsg<'static>>,
}

impl Transmit {
    fn new(tun_mtu: usize) -> Transmit {
        let max_wire = tun_mtu + 64;
        Transmit {
            max_wire,
            scratch: TunRecvScratch::new(),
            packets: vec![vec![0u8; max_wire]; IDEAL_BATCH_SIZE],
            sizes: vec![0usize; IDEAL_BATCH_SIZE],
            sealed: vec![0u8; IDEAL_BATCH_SIZE * max_wire],
            spans: Vec::with_capacity(IDEAL_BATCH_SIZE),
            send_scratch: RawSendScratch::new(IDEAL_BATCH_SIZE),
            msgs_store: Vec::with_capacity(IDEAL_BATCH_SIZE),
        }
    }

    fn on_readable(&mut self, shared: &Shared, io: &WorkerIo) -> Carried {
        let n = match io
            .tun
            .recv_batch(&mut self.scratch, &mut self.packets, &mut self.sizes, 0)
        {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return Carried::NOTHING,
            Err(e) => {
                log::warn!("{e}");
                return Carried::NOTHING;
            }
        };
        let mut t = TxCounts::default();
        // Read once per batch, and only for a handshake client (which set data goes on).
        let mut now: Option<UnixTime> = None;
        self.spans.clear();
        let mut cursor = 0;
        {
            let reg = shared.registry.read();
            for (packet, &size) in self.packets.iter().zip(&self.sizes).take(n) {
                let out = &mut self.sealed[cursor..cursor + self.max_wire];
                let Some((len, route)) = seal_one(&reg, &packet[..size], out, &mut now, &mut t)
                else {
                    continue;
                };
                self.spans.push((cursor, len, route.local, route.remote));
                cursor += len;
                t.bytes += size as u64;
            }
        }
        self.send(io, &mut t);
        t.publish(shared);
        Carried {
            packets: t.sent,
            bytes: t.bytes,
        }
    }

    /// Sends every sealed datagram through the raw socket; a refused one is counted and the
    /// rest go on.
    fn send(&mut self, io: &WorkerIo, t: &mut TxCounts) {
        let mut msgs = RawSendMsg::recycle(std::mem::take(&mut self.msgs_store));
        let mut i = 0;
        while i < self.spans.len() {
            msgs.clear();
            for &(start, len, src, dst) in &self.spans[i..] {
                msgs.push(RawSendMsg {
                    src,
                    dst,
                    payload: &self.sealed[start..start + len],
                });
            }
            match io.raw.send_batch(&mut self.send_scratch, &msgs) {
                Ok(0) | Err(_) => {
                    // The first message was refused: count it and go on with the rest.
                    t.failed += 1;
                    i += 1;
                }
                Ok(k) => {
                    t.sent += k as u64;
                    i += k;
                }
            }
        }
        self.msgs_store = RawSendMsg::recycle(msgs);
    }
}

/// What one batch from the TUN queue counted.
#[derive(Debug, Default)]
struct TxCounts {
    sent: u64,
    bytes: u64,
    no_client: u64,
    seal_failed: u64,
    key_limit: u64,
    no_key: u64,
    failed: u64,
}

impl TxCounts {
    /// Adds the batch's counts to the workers' counters (one relaxed add per nonzero count).
    fn publish(&self, shared: &Shared) {
        let c = &shared.counters;
        for (counter, n) in [
            (&c.tx_packets, self.sent),
            (&c.tx_bytes, self.bytes),
            (&c.tx_no_client, self.no_client),
            (&c.tx_seal_failed, self.seal_failed),
            (&c.tx_key_limit, self.key_limit),
            (&c.tx_no_key, self.no_key),
            (&c.tx_send_failed, self.failed),
        ] {
            if n > 0 {
                bump(counter, n);
            }
        }
    }
}

/// Seals `inner` for the client its addresses name into `out`, header protection applied: the
/// wire length and the route it leaves on, or `None` (counted in `t`).
fn seal_one(
    reg: &Registry,
    inner: &[u8],
    out: &mut [u8],
    now: &mut Option<UnixTime>,
    t: &mut TxCounts,
) -> Option<(usize, mt6d_proto::Route)> {
    let Some(id) = mt6d_proto::wire::address_bytes(inner)
        .and_then(|(s, d)| reg.table().lookup_inner((*s).into(), (*d).into()))
    else {
        t.no_client += 1;
        return None;
    };
    let Some(client) = reg.client(id) else {
        t.no_client += 1;
        return None;
    };
    let sealed = match client.session() {
        Some(guard) => {
            // A handshake client: its link's send key, on the set data goes on now.
            let Some(session) = guard.as_ref() else {
                t.no_key += 1;
                return None;
            };
            seal_for_session(reg, id, session, inner, out, now, t)?
        }
        None => seal_pre_shared(reg, id, client, inner, out, t)?,
    };
    let Some((len, route, header_key)) = sealed else {
        t.seal_failed += 1;
        return None;
    };
    if let Some(hk) = header_key {
        if hk.protect(&mut out[..len]).is_err() {
            t.seal_failed += 1;
            return None;
        }
    }
    Some((len, route))
}

/// What sealing for one client gave: the length, the route and the header key, or `None` (a
/// seal failure); the outer `None` is a drop already counted.
type Sealed<'r> = Option<
    Option<(
        usize,
        mt6d_proto::Route,
        Option<&'r mt6d_proto::tunnel::HeaderKey>,
    )>,
>;

/// A handshake client's packet: its link's send key, on the route set data goes on now.
fn seal_for_session<'r>(
    reg: &'r Registry,
    id: PeerId,
    session: &Session,
    inner: &[u8],
    out: &mut [u8],
    now: &mut Option<UnixTime>,
    t: &mut TxCounts,
) -> Sealed<'r> {
    let (Some(sealer), Some(link_stream)) = (session.send.as_ref(), reg.table().stream(id)) else {
        t.no_key += 1;
        return None;
    };
    let at = *now.get_or_insert_with(clock::now);
    let set = session.link.sets().send_set(link_stream.epoch_at(at)).id;
    let Some(entry) = session.entry_of(id, set) else {
        t.no_key += 1;
        return None;
    };
    let (Some(route), Some(stream)) = (reg.table().send_route(entry), reg.table().stream(entry))
    else {
        t.no_key += 1;
        return None;
    };
    Some(
        sealer
            .seal(route, inner, out)
            .ok()
            .map(|len| (len, *route, stream.send_header_key())),
    )
}

/// A pre-shared client's packet, under its sealer (made on first use from the machine's
/// counter reservation).
fn seal_pre_shared<'r>(
    reg: &'r Registry,
    id: PeerId,
    client: &super::registry::Client,
    inner: &[u8],
    out: &mut [u8],
    t: &mut TxCounts,
) -> Sealed<'r> {
    let (Some(route), Some(stream)) = (reg.table().send_route(id), reg.table().stream(id)) else {
        t.no_client += 1;
        return None;
    };
    let Some(sealer) = client.sealer(stream, reg.counters()) else {
        t.seal_failed += 1;
        return None;
    };
    match sealer.seal(route, inner, out) {
        Ok(len) => Some(Some((len, *route, stream.send_header_key()))),
        Err(SealError::KeyLimit) => {
            t.key_limit += 1;
            // Once per client and run: a flag flips, no line per packet.
            if sealer.take_key_limit_notice() {
                log::error!(
                    "client {}: its pre-shared key has protected its limit of {} packets in this run ({}, docs/PROTOCOL.md §4.3); packets to it are dropped (tx_key_limit): give the client a new key",
                    client.name,
                    crate::daemon::psk_counters::packet_limit(stream.config().aead),
                    stream.config().aead
                );
            }
            None
        }
        Err(_) => Some(None),
    }
}
