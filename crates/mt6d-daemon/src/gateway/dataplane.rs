//! The data-plane workers. Each worker is one thread with one epoll over its own TUN queue
//! and the tunnel sockets it owns, and serves both directions: protected side -> tunnel (`tx`,
//! when its TUN queue is readable) and tunnel -> protected side (`rx`, when one of its sockets
//! is). A request and its answer through an idle gateway wake one thread each way, not two.
//!
//! Steering (docs/ARCHITECTURE.md, "Workers"): the kernel spreads the protected side's flows
//! over the TUN queues by flow hash (one flow, one queue); a peer's sockets, every epoch's, are
//! all watched by one worker (`Peer::worker`), so a tunnel flow is never split across workers
//! and an epoch switch cannot reorder it. A worker that writes a flow's packets to its TUN
//! queue is also where the kernel sends that flow's answers (the device's flow table).
//!
//! ```text
//! tx: TUN read (GSO super-packet split) -> peer by inner destination -> Sealer::seal into one
//!     contiguous buffer -> header protection (docs/PROTOCOL.md §4.5) -> runs of equal-size
//!     datagrams on one route -> sendmmsg with UDP GSO, source address per message via
//!     IPV6_PKTINFO
//! rx: epoll over the per-port sockets -> recvmmsg with UDP GRO -> route by (local address,
//!     port) -> header protection removed in place -> classify (notice, handshake, data) ->
//!     Opener::open -> TUN write with GRO coalescing
//! ```
//!
//! Each worker loads the current [`RouteTable`] once per wake-up (an atomic pointer load) and
//! owns all of its buffers; nothing on these paths allocates or logs per packet. The one lock
//! is a peer's receive keys (`Peer::recv`), taken once per received train of that peer: only
//! the peer's own worker receives for it, so it is uncontended. Drops are
//! counted per reason and reported by the housekeeping loop, and so are the kernel's drops in
//! the queues in front of these threads (a socket's receive queue, the TUN transmit queue: see
//! [`crate::status::KernelDrops`]), which a thread kept waiting for a core would otherwise lose
//! silently.

use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use mt6d_os::udp::RecvBuf;
use mt6d_os::{
    Epoll, RecvScratch, SendMsg, SendScratch, Tun, TunRecvScratch, UdpSocket6, IDEAL_BATCH_SIZE,
};
use mt6d_proto::classify::{self, Class};
use mt6d_proto::handshake::ReceiveKeys;
use mt6d_proto::{OpenError, Route, SealError, UnixTime};

use super::counters::DropReason;
use super::delivery::Delivery;
use super::path::PathState;
use super::routing::{RouteTable, RxRoute, SetRoutes};
use super::shared::Shared;
use super::tcp_policy::{Direction, Limits, LogBudget, Verdict};
use super::{collision, session};
use crate::daemon::worker::placement::Placement;
use crate::daemon::worker::{
    self, Carried, Packets, TunBatch, Wake, MAX_GSO_BYTES, MAX_GSO_SEGMENTS,
};

/// Buffers in one recvmmsg.
const RX_BATCH: usize = 32;

fn seal_drop_reason(e: &SealError) -> DropReason {
    match e {
        SealError::Malformed(_) | SealError::HeaderProtection(_) => DropReason::BadLength,
        SealError::WrongSource | SealError::WrongDestination => DropReason::NoPeer,
        SealError::BufferTooSmall { .. } => DropReason::TooBig,
        SealError::KeyLimit => DropReason::KeyLimit,
        _ => DropReason::Io,
    }
}

fn open_drop_reason(e: &OpenError) -> DropReason {
    match e {
        OpenError::NoKey => DropReason::NoKey,
        OpenError::Truncated { .. } | OpenError::BadInner | OpenError::BufferTooSmall { .. } => {
            DropReason::BadLength
        }
        OpenError::BadCounter(_) | OpenError::Replay(_) => DropReason::Replay,
        OpenError::BadTag => DropReason::BadTag,
        _ => DropReason::BadLength,
    }
}

/// A run of sealed datagrams that leave in one sendmsg: same peer and route, equal sizes except
/// possibly a shorter last one (the UDP GSO rule).
#[derive(Debug, Clone, Copy)]
struct Run {
    peer: usize,
    start: usize,
    end: usize,
    segment: usize,
    count: usize,
    closed: bool,
}

/// One data-plane worker: the kit's worker loop ([`worker::serve`]) over `epoll` (its TUN
/// queue, `queues[index]`, and its sockets), serving both directions until shutdown. What it
/// opens it writes into its own queue while that is light, and into the next worker's queue
/// while it carries bulk ([`Delivery`]; docs/ARCHITECTURE.md "Workers": the device sends a
/// flow's answers to the queue its packets were written into); a SYN-ACK into the queue its SYN
/// was read from ([`super::syn_queues`]). `index` also names its [`worker::WorkerLoad`].
pub fn worker_loop(
    shared: &Shared,
    index: usize,
    queues: &[Tun],
    epoll: &Epoll,
    tun_mtu: usize,
    path: &PathState,
) {
    let mut packets = GatewayPackets {
        shared,
        index,
        queues,
        path,
        tx: Transmit::new(tun_mtu),
        rx: Receive::new(tun_mtu),
        delivery: Delivery::new(),
    };
    let load = &shared.load[index % shared.load.len()];
    let placement = Placement::new(mt6d_os::thread_affinity().ok());
    if let Err(e) = worker::serve(epoll, index, load, Some(placement), &mut packets) {
        log::error!("data-plane worker {index}: {e}; stopping");
        shared.shutdown.store(true, Ordering::Relaxed);
    }
}

/// The gateway's side of a worker: its queues, buffers and delivery choice.
struct GatewayPackets<'a> {
    shared: &'a Shared,
    index: usize,
    queues: &'a [Tun],
    path: &'a PathState,
    tx: Transmit,
    rx: Receive,
    delivery: Delivery,
}

impl Packets for GatewayPackets<'_> {
    fn outbound(&mut self, _wake: &mut Wake) -> Carried {
        let table = self.shared.table.load();
        let tun = &self.queues[self.index];
        let limits = tcp_limits(self.path);
        let (packets, bytes) = self
            .tx
            .on_readable(self.shared, &table, (tun, self.index), limits);
        Carried { packets, bytes }
    }

    fn inbound(&mut self, token: u64, wake: &mut Wake) -> Carried {
        let table = self.shared.table.load();
        let Some(socket) = u16::try_from(token)
            .ok()
            .and_then(|p| table.sockets.get(&p))
        else {
            return Carried::NOTHING;
        };
        let now = wake.now();
        let next = (self.index + 1) % self.queues.len();
        let queue = if self.delivery.next_queue() {
            next
        } else {
            self.index
        };
        let batch = Batch {
            shared: self.shared,
            table: &table,
            queues: self.queues,
            deliver: queue,
            limits: tcp_limits(self.path),
            now,
        };
        let (packets, bytes) = self.rx.on_readable(&batch, socket);
        if packets > 0 {
            self.delivery.delivered(now, bytes);
        }
        Carried { packets, bytes }
    }

    fn after_wake(&mut self, idle: bool, _wake: &mut Wake) {
        // Idle: erase the keys the timer took back from this worker's peers now rather than
        // at their next packet.
        if idle {
            erase_expired_keys(self.shared, self.index);
        }
    }

    fn stopping(&self) -> bool {
        self.shared.shutdown.load(Ordering::Relaxed)
    }
}

/// Erases the receive keys of the peers this worker receives for whose keys expired with no
/// rekey (the timer raised `erase_recv`).
fn erase_expired_keys(shared: &Shared, index: usize) {
    let table = shared.table.load();
    for routes in &table.peers {
        let p = &routes.peer;
        if p.worker.get() == Some(&index) && p.keys.erase_recv.load(Ordering::Relaxed) {
            let mut keys = p.recv.lock().unwrap_or_else(PoisonError::into_inner);
            if p.keys.erase_recv.swap(false, Ordering::Relaxed) {
                keys.clear();
            }
        }
    }
}

/// The protected side -> tunnel half of a worker: its buffers.
struct Transmit {
    max_wire: usize,
    scratch: TunRecvScratch,
    packets: Vec<Vec<u8>>,
    sizes: Vec<usize>,
    sealed: Vec<u8>,
    runs: Vec<Run>,
    send_scratch: SendScratch,
    msgs_store: Vec<SendMsg<'static>>,
    log_budget: LogBudget,
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
            runs: Vec::with_capacity(IDEAL_BATCH_SIZE),
            send_scratch: SendScratch::new(IDEAL_BATCH_SIZE),
            msgs_store: Vec::with_capacity(IDEAL_BATCH_SIZE),
            log_budget: LogBudget::default(),
        }
    }

    /// Reads one batch from the TUN queue, seals it and sends it. Returns the packets sealed
    /// and their bytes on the wire.
    fn on_readable(
        &mut self,
        shared: &Shared,
        table: &RouteTable,
        (tun, queue): (&Tun, usize),
        limits: Limits,
    ) -> (u64, u64) {
        let max_wire = self.max_wire;
        let n = match tun.recv_batch(&mut self.scratch, &mut self.packets, &mut self.sizes, 0) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return (0, 0),
            Err(e) => {
                // A malformed GSO packet from the kernel is reported as an error for that read
                // only; the device itself stays usable.
                log::warn!("{e}");
                return (0, 0);
            }
        };
        self.runs.clear();
        let mut cursor = 0;
        let mut unmatched = 0u64;
        for i in 0..n {
            let size = self.sizes[i];
            let packet = &mut self.packets[i];
            let out = &mut self.sealed[cursor..cursor + max_wire];
            let Some((peer, len)) = seal_one(
                shared,
                table,
                (packet, size),
                out,
                (queue, limits, &mut self.log_budget),
                &mut unmatched,
            ) else {
                continue;
            };
            push_run(&mut self.runs, peer, cursor, len);
            cursor += len;
        }
        if unmatched > 0 {
            shared.unmatched.drop_n(DropReason::NoPeer, unmatched);
        }
        let msgs = SendMsg::recycle(std::mem::take(&mut self.msgs_store));
        let runs = &self.runs;
        self.msgs_store = send_runs(table, runs, &self.sealed, &mut self.send_scratch, msgs);
        let packets = runs.iter().map(|r| r.count as u64).sum();
        (packets, cursor as u64)
    }
}

/// Seals one inner packet read from TUN queue `queue` into `out`, header protection applied,
/// after its peer's TCP policy: its peer and wire length, or `None` when it is dropped (counted;
/// a packet for no peer in `unmatched`).
fn seal_one(
    shared: &Shared,
    table: &RouteTable,
    (packet, size): (&mut [u8], usize),
    out: &mut [u8],
    (queue, limits, log_budget): (usize, Limits, &mut LogBudget),
    unmatched: &mut u64,
) -> Option<(usize, usize)> {
    let matched = mt6d_proto::wire::address_bytes(&packet[..size])
        .and_then(|(src, dst)| table.peer_for_inner(src, dst));
    let Some(peer) = matched.or_else(|| own_error_peer(table, &mut packet[..size])) else {
        *unmatched += 1;
        return None;
    };
    let p = table.peer(peer);
    // The peer's TCP policy before sealing; a dropped segment is counted there.
    let size = match p
        .tcp
        .apply(packet, size, Direction::Out, limits, &p.name, log_budget)
    {
        Verdict::Forward(len) => len,
        Verdict::Drop => return None,
    };
    let inner = &packet[..size];
    shared.syn_queues.note_read(inner, queue);
    let Some((route, _)) = table.send_route(peer) else {
        p.counters.tx.drop_n(DropReason::UnknownAddress, 1);
        return None;
    };
    let keys = &p.keys;
    let sealer = keys.send.load();
    let Some(sealer) = sealer.as_deref() else {
        // The main thread hears of it once per visit, not once per packet.
        if !keys.want.swap(true, Ordering::Relaxed) {
            shared.attention.push(table.generation, peer);
        }
        p.counters.tx.drop_n(DropReason::NoKey, 1);
        return None;
    };
    // Sealed and its counter masked in one step (docs/PROTOCOL.md §4.5).
    let len = match sealer.seal_protected(route, table.send_header_key(peer), inner, out) {
        Ok(len) => len,
        Err(e) => {
            p.counters.tx.drop_n(seal_drop_reason(&e), 1);
            return None;
        }
    };
    // Two relaxed loads and stores (docs/PROTOCOL.md §5): what an ICMPv6 error from the path
    // must quote to be believed. Recorded as it leaves (masked): a quote holds the wire bytes.
    p.sent.record(&out[..len]);
    Some((peer, len))
}

/// Adds a sealed datagram of `len` bytes at `start` for `peer` to the last run if it can leave
/// in the same UDP GSO send (same peer, not longer than the run's segments, within the limits),
/// else starts a run.
fn push_run(runs: &mut Vec<Run>, peer: usize, start: usize, len: usize) {
    match runs.last_mut() {
        Some(r)
            if r.peer == peer
                && !r.closed
                && len <= r.segment
                && r.count < MAX_GSO_SEGMENTS
                && r.end - r.start + len <= MAX_GSO_BYTES =>
        {
            r.end += len;
            r.count += 1;
            r.closed = len < r.segment;
        }
        _ => runs.push(Run {
            peer,
            start,
            end: start + len,
            segment: len,
            count: 1,
            closed: false,
        }),
    }
}

/// The peer of an ICMPv6 error this gateway's own stack sent about a packet that came out of
/// the tunnel (a hop limit that ran out here: a traceroute's hop), readdressed from the local
/// protected host and counted for the peer; `None` for anything else. Only packets that match
/// no peer by their addresses come here, so the data path pays nothing for it.
fn own_error_peer(table: &RouteTable, packet: &mut [u8]) -> Option<usize> {
    let mut peer = None;
    mt6d_proto::icmp::readdress_own_error(packet, |local, remote| {
        peer = table.peer_for_inner(&local.octets(), &remote.octets());
        peer.is_some()
    })?;
    let peer = peer?;
    table
        .peer(peer)
        .counters
        .own_errors
        .fetch_add(1, Ordering::Relaxed);
    Some(peer)
}

/// Sends every run, grouping consecutive runs that leave through the same socket into one
/// sendmmsg. Counts what left and what the kernel refused. Returns the (emptied) message vector
/// so its allocation is reused.
fn send_runs<'a>(
    table: &RouteTable,
    runs: &[Run],
    sealed: &'a [u8],
    scratch: &mut SendScratch,
    mut msgs: Vec<SendMsg<'a>>,
) -> Vec<SendMsg<'static>> {
    let mut i = 0;
    while i < runs.len() {
        let Some((_, socket)) = table.send_route(runs[i].peer) else {
            i += 1;
            continue;
        };
        let gso = socket.gso_supported();
        msgs.clear();
        let mut j = i;
        while j < runs.len() {
            let r = runs[j];
            let Some((r_route, r_socket)) = table.send_route(r.peer) else {
                break;
            };
            if !Arc::ptr_eq(r_socket, socket) {
                break;
            }
            let payload = &sealed[r.start..r.end];
            if gso && r.count > 1 {
                msgs.push(SendMsg {
                    src: *r_route.local.ip(),
                    dst: r_route.remote,
                    payload,
                    segment_size: u16::try_from(r.segment).ok(),
                });
            } else {
                for chunk in payload.chunks(r.segment) {
                    msgs.push(SendMsg {
                        src: *r_route.local.ip(),
                        dst: r_route.remote,
                        payload: chunk,
                        segment_size: None,
                    });
                }
            }
            j += 1;
        }
        send_all(table, socket, scratch, &msgs, &runs[i..j]);
        i = j;
    }
    SendMsg::recycle(msgs)
}

/// Pushes `msgs` through `sendmmsg` until all are taken or the kernel refuses; counts per peer.
fn send_all(
    table: &RouteTable,
    socket: &mt6d_os::UdpSocket6,
    scratch: &mut SendScratch,
    msgs: &[SendMsg<'_>],
    runs: &[Run],
) {
    let mut done = 0;
    let mut failed = false;
    while done < msgs.len() {
        match socket.send_batch(scratch, &msgs[done..]) {
            Ok(0) => {
                failed = true;
                break;
            }
            Ok(k) => done += k,
            Err(e) => {
                log::debug!("{e}");
                failed = true;
                break;
            }
        }
    }
    for r in runs {
        let c = &table.peer(r.peer).counters.tx;
        if failed {
            // Counting exactly which runs made it would need per-message bookkeeping; a refused
            // batch is rare (queue full) and is reported as such.
            c.drop_n(DropReason::Io, r.count as u64);
        } else {
            c.add(r.count as u64, (r.end - r.start) as u64);
        }
    }
}

/// The MSS to clamp SYNs to and the largest inner packet, from the TUN MTU now (it follows the
/// path MTU): read once per batch.
fn tcp_limits(path: &PathState) -> Limits {
    let mtu = path.tunnel_mtu.load(Ordering::Relaxed);
    let mtu = u16::try_from(mtu).unwrap_or(u16::MAX);
    Limits {
        mss: mt6d_proto::scrub::mss_for_mtu(mtu),
        mtu: usize::from(mtu),
    }
}

/// The tunnel -> protected side half of a worker: its buffers.
struct Receive {
    scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    batch: TunBatch,
    log_budget: LogBudget,
}

/// What every datagram of a received batch is handled with.
struct Batch<'a> {
    shared: &'a Shared,
    table: &'a RouteTable,
    queues: &'a [Tun],
    /// The queue opened packets are written into.
    deliver: usize,
    limits: Limits,
    now: UnixTime,
}

impl Receive {
    fn new(tun_mtu: usize) -> Receive {
        Receive {
            scratch: RecvScratch::new(RX_BATCH),
            bufs: (0..RX_BATCH).map(|_| RecvBuf::new()).collect(),
            batch: TunBatch::new(tun_mtu + 64),
            log_budget: LogBudget::default(),
        }
    }

    /// Reads what `socket` holds (one recvmmsg), opens it and writes it to TUN queue
    /// `queues[deliver]` (a SYN-ACK to its SYN's queue). Handshake messages and notices go to
    /// the peer's link. Returns the packets and bytes delivered.
    fn on_readable(&mut self, b: &Batch<'_>, socket: &UdpSocket6) -> (u64, u64) {
        // Never blocks: epoll said readable, and a readiness with nothing to read must not
        // park this worker in one socket while the others fill.
        let got = match socket.recv_ready(&mut self.scratch, &mut self.bufs) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return (0, 0),
            Err(e) => {
                log::debug!("{e}");
                return (0, 0);
            }
        };
        let overflowed = socket.take_queue_drops();
        if overflowed > 0 {
            b.shared
                .socket_queue_drops
                .fetch_add(overflowed, Ordering::Relaxed);
        }
        let (mut delivered, mut delivered_bytes) = (0u64, 0u64);
        for buf in &mut self.bufs[..got] {
            let (packets, bytes) = b.train(
                buf,
                socket.local_port(),
                &mut self.batch,
                &mut self.log_budget,
            );
            delivered += packets;
            delivered_bytes += bytes;
        }
        self.batch
            .flush(&b.queues[b.deliver], &b.shared.tun_write_failures);
        (delivered, delivered_bytes)
    }
}

impl Batch<'_> {
    /// One received train (one source, one destination): its peer and route set by the
    /// (address, port) it was sent to, checked against its source; then every datagram under
    /// the peer's receive keys, taken once. Returns the packets and bytes delivered.
    fn train(
        &self,
        buf: &mut RecvBuf,
        port: u16,
        batch: &mut TunBatch,
        log_budget: &mut LogBudget,
    ) -> (u64, u64) {
        let (shared, table) = (self.shared, self.table);
        if buf.truncated() {
            shared.unmatched.drop_n(DropReason::BadLength, 1);
            return (0, 0);
        }
        let Some(&RxRoute {
            peer,
            set: set_index,
            route,
        }) = table.rx.get(&(buf.dst(), port))
        else {
            shared
                .unmatched
                .drop_n(DropReason::UnknownAddress, buf.datagrams().count() as u64);
            return (0, 0);
        };
        let p = table.peer(peer);
        let bound = &table.peers[peer].sets[set_index];
        let counters = &p.counters.rx;
        if buf.src() != route.remote {
            counters.drop_n(DropReason::UnknownAddress, buf.datagrams().count() as u64);
            return (0, 0);
        }
        // Once per train; only this peer's worker takes it (and the link, for a handshake
        // message, inside it: always in this order).
        let mut keys = p.recv.lock().unwrap_or_else(PoisonError::into_inner);
        if p.keys.erase_recv.load(Ordering::Relaxed)
            && p.keys.erase_recv.swap(false, Ordering::Relaxed)
        {
            keys.clear();
        }
        keys.expire(self.now);
        let (mut packets, mut bytes) = (0u64, 0u64);
        let header_key = bound.set.stream.recv_header_key();
        for datagram in buf.datagrams_mut() {
            // Unmask before classifying (docs/PROTOCOL.md §4.5): the class, the counter and
            // the key phase are all in the masked bytes. Garbage unmasks to garbage and is
            // refused by the class's own check.
            let Ok(class) = classify::receive(header_key, datagram) else {
                counters.drop_n(DropReason::BadLength, 1);
                continue;
            };
            let datagram = &*datagram;
            let handled = match class {
                Class::Notice | Class::LinkAnnouncement => {
                    collision::on_notice(p, table, &bound.set, &route, datagram, self.now)
                }
                Class::Handshake => {
                    session::on_message(p, table, &bound.set, &route, datagram, &mut keys, self.now)
                }
                Class::Data => {
                    let target = (peer, bound, &route);
                    if let Some(len) = self.data(target, datagram, &mut keys, batch, log_budget) {
                        packets += 1;
                        bytes += len as u64;
                    }
                    continue;
                }
            };
            if handled {
                shared.attention.push(table.generation, peer);
            } else {
                counters.drop_n(DropReason::Handshake, 1);
            }
        }
        drop(keys);
        counters.add(packets, bytes);
        (packets, bytes)
    }

    /// A data packet or keepalive of peer `peer` on `route` of `bound`: opened into the batch,
    /// the TCP policy applied. Returns the length delivered (None: nothing to deliver).
    fn data(
        &self,
        (peer, bound, route): (usize, &SetRoutes, &Route),
        datagram: &[u8],
        keys: &mut ReceiveKeys,
        batch: &mut TunBatch,
        log_budget: &mut LogBudget,
    ) -> Option<usize> {
        let (shared, table) = (self.shared, self.table);
        let p = table.peer(peer);
        let counters = &p.counters.rx;
        let tun = &self.queues[self.deliver];
        let slot = batch.slot(tun, &shared.tun_write_failures);
        let opened = match keys.open(self.now, route, datagram, slot) {
            // The link set after the session's switch takes handshake-class messages only
            // (docs/PROTOCOL.md §9.8). The table may predate an answer just given on it (a
            // restarted peer's keepalive follows at once), so the live state decides; only
            // authenticated packets to a link set closed to data ask it, so forgeries never
            // take the lock.
            Ok(_) if !bound.data && !p.link.lock().sets().takes_data(&bound.set) => {
                counters.drop_n(DropReason::UnknownAddress, 1);
                return None;
            }
            Ok(opened) => opened,
            Err(e) => {
                if e == OpenError::NoKey && !p.keys.empty_slot.swap(true, Ordering::Relaxed) {
                    shared.attention.push(table.generation, peer);
                }
                counters.drop_n(open_drop_reason(&e), 1);
                return None;
            }
        };
        bound.set.opened(route.epoch, opened.len);
        if let Some(phase) = opened.confirmed {
            session::on_confirmed(p, table, phase, opened.confirmed_key, self.now);
            shared.attention.push(table.generation, peer);
        }
        // A keepalive confirms keys and carries nothing to deliver.
        if opened.len == 0 {
            return None;
        }
        let len = match p.tcp.apply(
            slot,
            opened.len,
            Direction::In,
            self.limits,
            &p.name,
            log_budget,
        ) {
            Verdict::Forward(len) => len,
            Verdict::Drop => return None,
        };
        batch.commit(len);
        // Rare (a SYN-ACK whose SYN another queue read): what precedes it goes first, so the
        // batch keeps its order.
        if let Some(q) = batch
            .last()
            .and_then(|inner| shared.syn_queues.queue_for(inner))
            .filter(|&q| q != self.deliver && q < self.queues.len())
        {
            batch.flush_last_to(tun, &self.queues[q], &shared.tun_write_failures);
        }
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drop_reasons_name_what_happened() {
        assert_eq!(open_drop_reason(&OpenError::BadTag), DropReason::BadTag);
        assert_eq!(open_drop_reason(&OpenError::NoKey), DropReason::NoKey);
        assert_eq!(
            seal_drop_reason(&SealError::WrongDestination),
            DropReason::NoPeer
        );
    }
}
