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
//! The registry's read lock is taken once per batch, never per packet; a client's opener lock
//! once per received batch of that client. Nothing here allocates or logs per packet. A datagram
//! to an (address, port) that is not a current route of some client, or from the wrong source,
//! is dropped and counted, and nothing is sent back: a scan of the prefix learns nothing.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
use mt6d_os::udp::RecvBuf;
use mt6d_os::{
    Epoll, EpollEvents, GROTable, RecvScratch, Tun, TunRecvScratch, UdpSocket6, IDEAL_BATCH_SIZE,
    VIRTIO_NET_HDR_LEN,
};
use mt6d_proto::handshake::is_handshake;
use mt6d_proto::moves::is_notice;

use super::registry::{bump, Registry};

/// How often an idle worker looks at the shutdown flag.
const POLL: Duration = Duration::from_millis(100);
/// Buffers in one recvmmsg.
const RX_BATCH: usize = 32;
const SOCKET_TOKEN: u64 = 0;
const TUN_TOKEN: u64 = 1;

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
    /// Handshake messages and route-move notices: not served by this version (pre-shared keys).
    pub rx_unsupported: AtomicU64,
    /// Datagrams larger than a receive buffer.
    pub rx_truncated: AtomicU64,
    /// Inner packets from the protected side to no client's true address.
    pub tx_no_client: AtomicU64,
    /// Inner packets that could not be sealed (too big, counter range used up, malformed).
    pub tx_seal_failed: AtomicU64,
    /// Datagrams the kernel refused to send.
    pub tx_send_failed: AtomicU64,
    /// TUN writes the kernel refused.
    pub tun_write_failures: AtomicU64,
    /// Datagrams the kernel dropped in front of a worker (its socket's receive queue was full).
    pub socket_queue_drops: AtomicU64,
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
            ("rx_truncated", r(&self.rx_truncated)),
            ("tx_no_client", r(&self.tx_no_client)),
            ("tx_seal_failed", r(&self.tx_seal_failed)),
            ("tx_send_failed", r(&self.tx_send_failed)),
            ("tun_write_failures", r(&self.tun_write_failures)),
            ("socket_queue_drops", r(&self.socket_queue_drops)),
        ]
    }
}

/// What every worker shares.
#[derive(Debug)]
pub struct Shared {
    pub registry: RwLock<Registry>,
    pub counters: ServerCounters,
    pub shutdown: AtomicBool,
}

/// One worker's kernel objects.
#[derive(Debug)]
pub struct WorkerIo {
    pub socket: UdpSocket6,
    pub raw: RawUdp6,
    pub tun: Tun,
}

/// Serves `io` until shutdown.
pub fn worker_loop(shared: &Arc<Shared>, io: &WorkerIo, tun_mtu: usize) -> mt6d_os::Result<()> {
    let epoll = Epoll::new()?;
    use std::os::fd::AsRawFd;
    io.socket.set_nonblocking(true)?;
    io.tun.set_nonblocking(true)?;
    epoll.add(io.socket.as_raw_fd(), SOCKET_TOKEN)?;
    epoll.add(io.tun.as_raw_fd(), TUN_TOKEN)?;
    let mut events = EpollEvents::with_capacity(4);
    let mut rx = Receive::new(tun_mtu);
    let mut tx = Transmit::new(tun_mtu);
    while !shared.shutdown.load(Ordering::Relaxed) {
        epoll.wait(&mut events, Some(POLL))?;
        for token in events.tokens() {
            match token {
                SOCKET_TOKEN => rx.on_readable(shared, io),
                _ => tx.on_readable(shared, io),
            }
        }
    }
    Ok(())
}

struct Receive {
    scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    inner_cap: usize,
    out: Vec<Vec<u8>>,
    gro: GROTable,
}

impl Receive {
    fn new(tun_mtu: usize) -> Receive {
        Receive {
            scratch: RecvScratch::new(RX_BATCH),
            bufs: (0..RX_BATCH).map(|_| RecvBuf::new()).collect(),
            inner_cap: tun_mtu + 64,
            out: (0..IDEAL_BATCH_SIZE)
                .map(|_| Vec::with_capacity(VIRTIO_NET_HDR_LEN + 65_535))
                .collect(),
            gro: GROTable::default(),
        }
    }

    fn on_readable(&mut self, shared: &Shared, io: &WorkerIo) {
        let got = match io.socket.recv_ready(&mut self.scratch, &mut self.bufs) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::debug!("{e}");
                return;
            }
        };
        let c = &shared.counters;
        let overflowed = io.socket.take_queue_drops();
        if overflowed > 0 {
            bump(&c.socket_queue_drops, overflowed);
        }
        let (mut not_current, mut wrong_source, mut rejected, mut unsupported, mut truncated) =
            (0u64, 0u64, 0u64, 0u64, 0u64);
        let (mut packets, mut bytes) = (0u64, 0u64);
        let mut ready = 0;
        let inner_cap = self.inner_cap;
        let reg = shared
            .registry
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        for buf in &mut self.bufs[..got] {
            if buf.truncated() {
                truncated += 1;
                continue;
            }
            let count = buf.datagrams().count() as u64;
            let Some((id, epoch)) = reg.table().lookup_local(buf.dst(), buf.dst_port()) else {
                not_current += count;
                continue;
            };
            let (Some(route), Some(stream), Some(client)) = (
                reg.table().index().route(id, epoch),
                reg.table().stream(id),
                reg.client(id),
            ) else {
                not_current += count;
                continue;
            };
            if buf.src() != route.remote {
                wrong_source += count;
                continue;
            }
            let header_key = stream.recv_header_key();
            let (mut opened, mut bad) = (0u64, 0u64);
            client.with_opener(stream, |opener| {
                for datagram in buf.datagrams_mut() {
                    if let Some(hk) = header_key {
                        if hk.unprotect(datagram).is_err() {
                            bad += 1;
                            continue;
                        }
                    }
                    if is_handshake(datagram) || is_notice(datagram) {
                        unsupported += 1;
                        continue;
                    }
                    if ready == self.out.len() {
                        flush_to_tun(shared, &io.tun, &mut self.gro, &mut self.out[..ready]);
                        ready = 0;
                    }
                    let slot = &mut self.out[ready];
                    slot.resize(VIRTIO_NET_HDR_LEN + inner_cap, 0);
                    match opener.open(route, datagram, &mut slot[VIRTIO_NET_HDR_LEN..]) {
                        // A keepalive: valid, nothing to deliver.
                        Ok(0) => {}
                        Ok(len) => {
                            slot.truncate(VIRTIO_NET_HDR_LEN + len);
                            ready += 1;
                            opened += 1;
                            bytes += len as u64;
                        }
                        Err(_) => bad += 1,
                    }
                }
            });
            packets += opened;
            rejected += bad;
        }
        drop(reg);
        flush_to_tun(shared, &io.tun, &mut self.gro, &mut self.out[..ready]);
        for (counter, n) in [
            (&c.rx_packets, packets),
            (&c.rx_bytes, bytes),
            (&c.rx_not_current, not_current),
            (&c.rx_wrong_source, wrong_source),
            (&c.rx_rejected, rejected),
            (&c.rx_unsupported, unsupported),
            (&c.rx_truncated, truncated),
        ] {
            if n > 0 {
                bump(counter, n);
            }
        }
    }
}

fn flush_to_tun(shared: &Shared, tun: &Tun, gro: &mut GROTable, packets: &mut [Vec<u8>]) {
    crate::gateway::write_to_tun(tun, gro, packets, &shared.counters.tun_write_failures);
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

/// Empties a vector of borrowed messages and hands back its allocation with a fresh lifetime
/// (std's in-place collect over a same-layout type: no allocation per batch; the vector is
/// empty, so the closure never runs).
fn recycle<'b>(mut v: Vec<RawSendMsg<'_>>) -> Vec<RawSendMsg<'b>> {
    v.clear();
    v.into_iter()
        .map(|m| RawSendMsg {
            src: m.src,
            dst: m.dst,
            payload: &[],
        })
        .collect()
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

    fn on_readable(&mut self, shared: &Shared, io: &WorkerIo) {
        let n = match io
            .tun
            .recv_batch(&mut self.scratch, &mut self.packets, &mut self.sizes, 0)
        {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::warn!("{e}");
                return;
            }
        };
        let c = &shared.counters;
        let (mut no_client, mut seal_failed, mut bytes) = (0u64, 0u64, 0u64);
        self.spans.clear();
        let mut cursor = 0;
        {
            let reg = shared
                .registry
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            let counters = reg.counters();
            for (packet, &size) in self.packets.iter().zip(&self.sizes).take(n) {
                let inner = &packet[..size];
                let Some(id) = inner.get(8..24).zip(inner.get(24..40)).and_then(|(s, d)| {
                    let s: [u8; 16] = s.try_into().ok()?;
                    let d: [u8; 16] = d.try_into().ok()?;
                    reg.table().lookup_inner(s.into(), d.into())
                }) else {
                    no_client += 1;
                    continue;
                };
                let (Some(route), Some(stream), Some(client)) = (
                    reg.table().send_route(id),
                    reg.table().stream(id),
                    reg.client(id),
                ) else {
                    no_client += 1;
                    continue;
                };
                let out = &mut self.sealed[cursor..cursor + self.max_wire];
                let len = match client.sealer(stream, counters).seal(route, inner, out) {
                    Ok(len) => len,
                    Err(_) => {
                        seal_failed += 1;
                        continue;
                    }
                };
                if let Some(hk) = stream.send_header_key() {
                    if hk.protect(&mut out[..len]).is_err() {
                        seal_failed += 1;
                        continue;
                    }
                }
                self.spans.push((cursor, len, route.local, route.remote));
                cursor += len;
                bytes += size as u64;
            }
        }
        let mut msgs = recycle(std::mem::take(&mut self.msgs_store));
        let mut sent = 0usize;
        let mut failed = 0u64;
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
                    failed += 1;
                    i += 1;
                }
                Ok(k) => {
                    sent += k;
                    i += k;
                }
            }
        }
        self.msgs_store = recycle(msgs);
        for (counter, n) in [
            (&c.tx_packets, sent as u64),
            (&c.tx_bytes, bytes),
            (&c.tx_no_client, no_client),
            (&c.tx_seal_failed, seal_failed),
            (&c.tx_send_failed, failed),
        ] {
            if n > 0 {
                bump(counter, n);
            }
        }
    }
}
