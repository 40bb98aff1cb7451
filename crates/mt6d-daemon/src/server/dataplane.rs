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

use std::sync::atomic::Ordering;
use std::sync::Arc;

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch};
use mt6d_os::{Epoll, TunRecvScratch, IDEAL_BATCH_SIZE};
use mt6d_proto::endpoint::PeerId;
use mt6d_proto::{SealError, UnixTime};

use super::receive::Receive;
use super::registry::{bump, Registry, Session};
use super::shared::{Shared, WorkerIo};
use crate::daemon::clock;
use crate::daemon::worker::{self, Carried, Packets, Wake, TUN_TOKEN};

const SOCKET_TOKEN: u64 = 0;

/// Serves `io` until shutdown: the kit's worker loop ([`worker::serve`]) with the server's
/// receive and send halves plugged in. `index` names the worker's
/// [`WorkerLoad`](crate::daemon::worker::WorkerLoad).
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
    let Some((len, route)) = sealed else {
        t.seal_failed += 1;
        return None;
    };
    Some((len, route))
}

/// What sealing for one client gave, header protection applied: the length and the route, or
/// `None` (a seal failure); the outer `None` is a drop already counted.
type Sealed = Option<Option<(usize, mt6d_proto::Route)>>;

/// A handshake client's packet: its link's send key, on the route set data goes on now.
fn seal_for_session(
    reg: &Registry,
    id: PeerId,
    session: &Session,
    inner: &[u8],
    out: &mut [u8],
    now: &mut Option<UnixTime>,
    t: &mut TxCounts,
) -> Sealed {
    let (Some(sealer), Some(link_stream)) = (session.keys.send(), reg.table().stream(id)) else {
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
            .seal_protected(route, stream.send_header_key(), inner, out)
            .ok()
            .map(|len| (len, *route)),
    )
}

/// A pre-shared client's packet, under its sealer (made on first use from the machine's
/// counter reservation).
fn seal_pre_shared(
    reg: &Registry,
    id: PeerId,
    client: &super::registry::Client,
    inner: &[u8],
    out: &mut [u8],
    t: &mut TxCounts,
) -> Sealed {
    let (Some(route), Some(stream)) = (reg.table().send_route(id), reg.table().stream(id)) else {
        t.no_client += 1;
        return None;
    };
    let Some(sealer) = client.sealer(stream, reg.counters()) else {
        t.seal_failed += 1;
        return None;
    };
    match sealer.seal_protected(route, stream.send_header_key(), inner, out) {
        Ok(len) => Some(Some((len, *route))),
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
