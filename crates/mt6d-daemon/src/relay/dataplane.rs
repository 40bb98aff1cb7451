//! The relay node's data plane: `workers` threads (one per online CPU by default), each with its
//! own transparent socket on the node's port (SO_REUSEPORT: the kernel hashes a datagram's
//! addresses and ports, so one link's datagrams of an epoch stay on one worker and are never
//! reordered by it) and, at an edge gateway, its own queue of the multi-queue TUN device (the
//! kernel keeps one inner flow on one queue). Worker 0 also drives the node's timers, the
//! neighbour responders and the control socket.
//!
//! The node is one state machine (routing table, every link's monitor, keys and replay
//! window), shared by the workers behind one lock; what a datagram's first steps need of it is
//! copied out for them (the receive gate, [`RxGate`]), and the AEAD runs outside it. Per batch
//! of received datagrams: `recvmmsg` (UDP GRO: several datagrams of one link in one buffer)
//! without the lock -> still without it, each datagram through the gate: its link named by its
//! (destination, source) (none, such as junk sent to any address of the /64: `rx_no_link`),
//! header protection removed and the frame opened (a forgery on a live route: `rx_refused`,
//! and the node's label in `mt6d status`); a batch of nothing else never takes the lock, but
//! for one short hold when it named a link's empty key slot -> under it, in arrival order,
//! `finish_datagram` (replay window, probes, routing, deliveries; handshake messages,
//! keepalives and rekey races whole, `handle_datagram`) -> without it, forwarded frames
//! sealed for the next link in the buffer they arrived in and, at an edge, the end-to-end
//! payloads opened (`DeliverJob::open`) -> under it again (edges), the end-to-end replay
//! windows (`finish_delivery`) -> one `sendmmsg` from the next link's hashed address and port
//! (a GRO train re-sealed in place leaves as one UDP GSO train), inner packets written to the
//! worker's TUN queue in one batch. The gate is republished under the lock whenever the node's
//! routes or keys change, before anything the node queued is sent (docs/ARCHITECTURE.md
//! "Relays" says why a copy never weakens a check). Per batch of TUN packets: the end-to-end
//! peer named by the inner (source, destination) -> under the lock, `begin_inner` (route,
//! keys) -> without it, the end-to-end and link seals, back to back in one buffer, and one
//! `sendmmsg` (GSO trains again). With one worker each batch is one pass under the lock
//! (`handle_datagram`, `send_inner`). The `stage_lock_ns` counter is the time workers waited
//! for the lock.
//!
//! Sending sockets: one UDP socket per local port a link sends from this epoch (a bind per link
//! and epoch, shared by every worker through an atomically swapped map), the raw socket for
//! anything without one. No allocation per packet; the only lookups per packet are the link scan
//! (three routes per link) and, at an edge, one hash of the inner address pair.

use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv6Addr, SocketAddrV6};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch};
use mt6d_os::udp::{RecvBuf, SendMsg, SendScratch};
use mt6d_os::UdpSocket6;
use mt6d_os::{
    Epoll, GROTable, RawUdp6, RecvScratch, Tun, TunRecvScratch, IDEAL_BATCH_SIZE,
    VIRTIO_NET_HDR_LEN,
};
use mt6d_proto::relay::cost::LinkState;
use mt6d_proto::relay::gate::{Admit, RxGate};
use mt6d_proto::relay::node::{
    DeliverJob, E2eId, Event, Finish, InnerJob, NodeError, OpenJob, Received, RelayNode, SealJob,
    Transmit,
};
use mt6d_proto::relay::table::Neighbour;
use mt6d_proto::tunnel::frame_payload_len;
use mt6d_proto::{OpenError, UnixTime};
use rand::Rng;

use super::{e2e_id, neighbour, RelayError, RelayIo};
use crate::config::RelayConfig;
use crate::control::{Asked, ChangeAnswer, ControlServer};
use crate::daemon::anyip::ndp::NdpResponder;
use crate::daemon::anyip::os;
use crate::daemon::clock;
use crate::daemon::signals::Signals;
use crate::daemon::worker::placement::Placement;
use crate::daemon::worker::{
    self, Carried, Packets, Wake, WorkerLoad, MAX_GSO_BYTES, MAX_GSO_SEGMENTS, TUN_TOKEN,
};
use crate::status::relay::{E2eStatus, LinkStatus, RelayStatus, RouteStatus, WorkerStatus};

/// Longest the loop sleeps: it also watches the stop flag and answers the control socket (a
/// request waits at most this long).
const TICK: Duration = Duration::from_millis(50);
/// Buffers in one recvmmsg.
const RX_BATCH: usize = 32;
/// How often the counters are logged (at info) while anything moves.
const REPORT_EVERY: Duration = Duration::from_secs(60);
const SOCKET_TOKEN: u64 = 0;
/// The first neighbour responder's token; responder `k` has `NDP_TOKEN + k`.
const NDP_TOKEN: u64 = 2;
/// Neighbour discovery frames handled per wake-up at most (the rest at the next one).
const NDP_BUDGET: usize = 64;

/// What the daemon counted around the node (the node counts its own, by spec label), per
/// worker; `mt6d status` shows their sums.
#[derive(Debug, Default, Clone)]
pub struct IoCounters {
    pub rx_datagrams: u64,
    /// Bytes of the datagrams received (what worker placement weighs).
    pub rx_bytes: u64,
    pub rx_truncated: u64,
    /// Datagrams to the prefix on no current route of any link (a scan, an old epoch's
    /// straggler, a forgery): dropped before any key is used.
    pub rx_no_link: u64,
    /// Datagrams on a link's route refused by the receive gate, before the node's lock (a
    /// forgery's tag, a truncated payload, a counter out of its space); by reason in
    /// `gate_drops`, which `mt6d status` adds to the node's `drop_<reason>` counters.
    pub rx_refused: u64,
    pub gate_drops: Vec<(&'static str, u64)>,
    /// Datagrams the kernel took, and the ones it refused (a full queue, a GSO error).
    pub tx_datagrams: u64,
    pub tx_send_failed: u64,
    pub socket_queue_drops: u64,
    pub tun_rx_packets: u64,
    /// Bytes of the inner packets read from the TUN queue.
    pub tun_rx_bytes: u64,
    /// Packets from the protected side between no configured host pair.
    pub tun_no_peer: u64,
    pub tun_no_route: u64,
    /// Inner packets for an end-to-end peer (or a next hop) without keys yet: its handshake
    /// is under way.
    pub tun_no_key: u64,
    /// Inner packets held while their end-to-end peer's first handshake was under way, and
    /// sent when it completed (or dropped, if it expired instead).
    pub tun_staged: u64,
    pub tun_seal_failed: u64,
    /// Forwarded frames whose seal for the next link failed (its counter reservation ran out).
    pub tx_seal_failed: u64,
    pub tun_tx_packets: u64,
    pub tun_write_failures: u64,
    /// Sender sockets that could not be bound (the port is another program's): that link's
    /// frames leave through the raw socket, without GSO.
    pub sender_bind_failed: u64,
    /// Nanoseconds spent per stage of the receive path, summed over batches (003's Fig. 16
    /// stages; divide by `rx_datagrams`): the `recvmmsg` call, the node's work on every datagram
    /// of the batch (header protection, open, route, seal), the `sendmmsg` of the forwarded
    /// ones, the TUN write of the delivered ones. Four clock reads per batch, not per packet.
    pub stage_recv_ns: u64,
    pub stage_node_ns: u64,
    pub stage_send_ns: u64,
    pub stage_tun_write_ns: u64,
    /// Nanoseconds workers waited for the node's lock (both directions; 0 with one worker but
    /// for worker 0's timers and status).
    pub stage_lock_ns: u64,
}

impl IoCounters {
    /// Every counter by its status name.
    fn pairs(&self) -> [(&'static str, u64); 24] {
        [
            ("rx_datagrams", self.rx_datagrams),
            ("rx_bytes", self.rx_bytes),
            ("rx_truncated", self.rx_truncated),
            ("rx_no_link", self.rx_no_link),
            ("rx_refused", self.rx_refused),
            ("tx_datagrams", self.tx_datagrams),
            ("tx_send_failed", self.tx_send_failed),
            ("socket_queue_drops", self.socket_queue_drops),
            ("tun_rx_packets", self.tun_rx_packets),
            ("tun_rx_bytes", self.tun_rx_bytes),
            ("tun_no_peer", self.tun_no_peer),
            ("tun_no_route", self.tun_no_route),
            ("tun_no_key", self.tun_no_key),
            ("tun_staged", self.tun_staged),
            ("tun_seal_failed", self.tun_seal_failed),
            ("tx_seal_failed", self.tx_seal_failed),
            ("tun_tx_packets", self.tun_tx_packets),
            ("tun_write_failures", self.tun_write_failures),
            ("sender_bind_failed", self.sender_bind_failed),
            ("stage_recv_ns", self.stage_recv_ns),
            ("stage_node_ns", self.stage_node_ns),
            ("stage_send_ns", self.stage_send_ns),
            ("stage_tun_write_ns", self.stage_tun_write_ns),
            ("stage_lock_ns", self.stage_lock_ns),
        ]
    }

    /// A datagram the receive gate refused, by the node's label for it.
    fn refused(&mut self, reason: &'static str) {
        self.rx_refused += 1;
        match self.gate_drops.iter_mut().find(|(r, _)| *r == reason) {
            Some((_, n)) => *n += 1,
            // A handful of labels, each pushed once per worker.
            None => self.gate_drops.push((reason, 1)),
        }
    }
}

/// A received datagram between the passes of [`Worker::on_socket`].
enum Pending {
    /// Opened by the receive gate: to finish under the lock.
    Opened(OpenJob),
    /// Its whole work under the lock (`handle_datagram`): a handshake message, a keepalive,
    /// keys in a rekey race, a link with no key to open it.
    Whole(Neighbour),
    /// A forwarded frame to seal without the lock.
    Seal(SealJob),
    /// An end-to-end payload for this edge gateway to open without the lock.
    Deliver(DeliverJob),
    /// Opened (or not): to finish under the lock.
    Delivered(DeliverJob, Result<Range<usize>, OpenError>),
    /// Nothing more to do.
    Done,
}

/// One datagram to send: (where its bytes are, length, source, destination).
type Span = (usize, usize, usize, SocketAddrV6, SocketAddrV6);

/// The sender sockets by the hashed address and port they are bound to.
type Senders = HashMap<SocketAddrV6, Arc<UdpSocket6>>;

/// The node and what changes with it: one lock, taken once per batch by the worker that has
/// one.
struct Core {
    node: RelayNode,
    /// Inner packets for an end-to-end peer whose first handshake is under way, at most
    /// [`STAGED_MAX`] per peer, sent when it completes (a connection's first SYN then waits one
    /// round trip, not TCP's 1 s retransmission).
    staged: HashMap<E2eId, Vec<Vec<u8>>>,
    /// Each link's current send address and port (by link index).
    send_from: Vec<Option<SocketAddrV6>>,
}

/// What every worker shares.
struct Shared<'a> {
    cfg: &'a RelayConfig,
    core: Mutex<Core>,
    /// One UDP socket per hashed address and port a link sends from this epoch, bound to
    /// exactly that pair (so it receives nothing: the tproxy rule hands every datagram for the
    /// prefix to the transparent sockets, and no other address of the machine has the port
    /// open): frames leave through them with UDP GSO, a train of equal-size datagrams to one
    /// destination in one message. Replaced as a whole (under the core lock) when a link's
    /// epoch changes; workers read it without a lock.
    senders: ArcSwap<Senders>,
    /// The node's receive gate ([`RxGate`]): every link's accept routes (e-1, e, e+1 of each
    /// bound route set), their header keys and the link keys that alone open a payload, so
    /// that each received datagram is matched to its link, and refused (junk to the prefix, a
    /// forgery on a live route) or opened, before the node's lock is taken. Replaced as a whole
    /// under the core lock whenever `RelayNode::rx_version` moves on (routes recomputed, keys
    /// changed), at the start of [`Worker::drain`]: before the node's queued handshake messages
    /// are sent, so before a peer can use a key the copy lacks. Routes enter it an epoch
    /// before they are used (§3), so a worker's copy is never older than a route in use; the
    /// node checks the route, the key and the replay window again under its lock.
    gate: ArcSwap<RxGate>,
    /// Sends what has no sender socket (a port another program holds) and the node's own
    /// messages.
    raw: RawUdp6,
    by_pair: HashMap<(Ipv6Addr, Ipv6Addr), E2eId>,
    /// Each worker's counters as of its last wake-up.
    counters: Vec<Mutex<IoCounters>>,
    /// Set when any worker's loop ends (a stop signal, an error, a panic): the others stop.
    stop: AtomicBool,
    /// What each worker moved and where it runs, by worker index.
    load: Box<[WorkerLoad]>,
}

/// One data-plane thread's sockets, queue and buffers.
struct Worker<'a> {
    shared: &'a Shared<'a>,
    index: usize,
    /// Several workers: a received batch is worked on in passes, its AEAD outside the node's
    /// lock ([`Worker::on_socket`]). One worker: in one pass under it (no lock to share, and
    /// the passes cost about 0.15 us per datagram).
    split: bool,
    socket: UdpSocket6,
    tun: Option<Tun>,
    counters: IoCounters,
    /// By receive buffer: the link its (destination, source) names, from the lock-free copy of
    /// the accept routes (None: dropped before the lock).
    links: Vec<Option<Neighbour>>,
    /// The links a receive batch named an empty key slot of (the node is told once per batch).
    empty_slots: Vec<Neighbour>,
    rx_scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    /// Forwarded frames: (buffer index, start in it, length, source, destination).
    spans: Vec<Span>,
    /// The datagrams of a receive batch between its passes: (buffer index, start, end, what is
    /// left to do).
    pending: Vec<(usize, usize, usize, Pending)>,
    /// A TUN batch's packets to seal without the lock: (packet index, where in `sealed`, job).
    inner_jobs: Vec<(usize, usize, InnerJob)>,
    tun_out: Vec<Vec<u8>>,
    tun_ready: usize,
    gro: GROTable,
    tun_scratch: TunRecvScratch,
    tun_packets: Vec<Vec<u8>>,
    tun_sizes: Vec<usize>,
    /// Sealed datagrams of one TUN batch, back to back (room for a full frame each).
    sealed: Vec<u8>,
    send_scratch: RawSendScratch,
    msgs_store: Vec<RawSendMsg<'static>>,
    udp_scratch: SendScratch,
    udp_msgs_store: Vec<SendMsg<'static>>,
    /// Probes, replies, routing and handshake messages and staged packets are sealed here one
    /// at a time.
    control_buf: Vec<u8>,
}

/// Inner packets held per end-to-end peer while its handshake is under way (WireGuard holds
/// 128; a handful covers the first packets of the connections that start it).
const STAGED_MAX: usize = 16;

/// Sets the shared stop flag when a worker's loop ends, however it ends (a panic included).
struct StopOnExit<'a>(&'a AtomicBool);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

/// What worker 0 keeps besides packets (its [`Worker::main_duties`]).
struct MainDuties<'c> {
    ctl: &'c ControlServer,
    ndp: Vec<NdpResponder>,
    started: Instant,
    published: Option<&'c crate::metrics::Published>,
    rng: rand::rngs::ThreadRng,
    last_report: Instant,
    last_rx: u64,
    published_at: Option<Instant>,
}

/// The relay's side of the kit's worker loop: a worker, and for worker 0 the node's duties.
struct RelayPackets<'w, 'a, 'c> {
    worker: &'w mut Worker<'a>,
    signals: &'c Signals,
    main: Option<MainDuties<'c>>,
}

impl Packets for RelayPackets<'_, '_, '_> {
    fn outbound(&mut self, _wake: &mut Wake) -> Carried {
        let c = &self.worker.counters;
        let (packets, bytes) = (c.tun_rx_packets, c.tun_rx_bytes);
        self.worker.on_tun();
        let c = &self.worker.counters;
        Carried {
            packets: c.tun_rx_packets - packets,
            bytes: c.tun_rx_bytes - bytes,
        }
    }

    fn inbound(&mut self, token: u64, _wake: &mut Wake) -> Carried {
        if token == SOCKET_TOKEN {
            let c = &self.worker.counters;
            let (packets, bytes) = (c.rx_datagrams, c.rx_bytes);
            self.worker.on_socket();
            let c = &self.worker.counters;
            return Carried {
                packets: c.rx_datagrams - packets,
                bytes: c.rx_bytes - bytes,
            };
        }
        if let (Some(main), Some(k)) = (&mut self.main, token.checked_sub(NDP_TOKEN)) {
            self.worker.on_ndp(&mut main.ndp, k as usize);
        }
        Carried::NOTHING
    }

    fn after_wake(&mut self, _idle: bool, _wake: &mut Wake) {
        if let Some(main) = &mut self.main {
            self.worker.main_duties(self.signals, main);
        }
        self.worker.publish();
    }

    fn next_wait(&mut self) -> Duration {
        if self.main.is_none() {
            return TICK;
        }
        let now = clock::now();
        let due = self.worker.shared.core.lock().node.poll_timeout();
        Duration::from_nanos(due.as_nanos().saturating_sub(now.as_nanos())).min(TICK)
    }

    fn stopping(&self) -> bool {
        self.worker.stopping(self.signals)
    }
}

/// A relay worker's placement: none. A relay forwards what it receives at once, so its
/// threads hand each datagram on as the gateway's do, but whether restricting a light relay's
/// workers to one CPU helps has not been measured apart from the noise of a loaded machine;
/// until it is, relay workers run where the kernel puts them, as before.
fn placement() -> Option<Placement> {
    None
}

/// Serves until a stop signal (or a fatal error of a worker's loop): worker 0 on this thread,
/// the others on their own.
pub fn serve(
    cfg: &RelayConfig,
    node: RelayNode,
    io: RelayIo,
    signals: &Signals,
    started: Instant,
) -> Result<(), RelayError> {
    let RelayIo {
        sockets,
        raw,
        tuns,
        ndp,
    } = io;
    let workers = sockets.len();
    let ctl = ControlServer::bind(&cfg.control_socket).map_err(|e| {
        RelayError::Setup(format!(
            "control socket {}: {e}",
            cfg.control_socket.display()
        ))
    })?;
    let metrics = cfg
        .metrics_listen
        .map(crate::metrics::MetricsServer::bind)
        .transpose()
        .map_err(|e| RelayError::Setup(e.to_string()))?;
    let published = crate::metrics::Published::empty();
    let gate = ArcSwap::from_pointee(node.rx_gate());
    let shared = Shared {
        cfg,
        gate,
        core: Mutex::new(Core {
            node,
            staged: HashMap::new(),
            send_from: vec![None; cfg.links.len()],
        }),
        senders: ArcSwap::from_pointee(HashMap::new()),
        raw,
        by_pair: cfg
            .e2e
            .iter()
            .enumerate()
            .map(|(j, e)| {
                (
                    (e.stream.local.true_addr, e.stream.remote.true_addr),
                    e2e_id(j),
                )
            })
            .collect(),
        counters: (0..workers).map(|_| Mutex::default()).collect(),
        stop: AtomicBool::new(false),
        load: (0..workers).map(|_| WorkerLoad::default()).collect(),
    };
    let mut tuns = tuns.into_iter();
    let mut all: Vec<Worker<'_>> = sockets
        .into_iter()
        .enumerate()
        .map(|(index, socket)| Worker::new(&shared, index, socket, tuns.next()))
        .collect();
    let tun_mtu = super::inner_mtu(cfg.frame_max);
    log::info!(
        "relay node {} on {}/64: {} links ({}), {} end-to-end peers{}, transit {}, frame_max {}, {workers} worker{}, ready {:.2} s after start",
        cfg.node_id.map_or_else(|| "(no id)".to_string(), |n| n.to_string()),
        cfg.prefix(),
        cfg.links.len(),
        cfg.links.iter().map(|l| format!("{} at {}", l.name, l.address)).collect::<Vec<_>>().join(", "),
        cfg.e2e.len(),
        if cfg.is_edge() { format!(", TUN {} MTU {tun_mtu}", cfg.tun_name) } else { String::new() },
        cfg.transit,
        cfg.frame_max,
        if workers == 1 { "" } else { "s" },
        started.elapsed().as_secs_f64()
    );
    let mut main = all.remove(0);
    let shared = &shared;
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for w in all {
            let index = w.index;
            let spawned = std::thread::Builder::new()
                .name(format!("mt6d-relay-{index}"))
                .spawn_scoped(scope, move || {
                    let _stop = StopOnExit(&shared.stop);
                    let mut w = w;
                    w.serve(signals)
                });
            match spawned {
                Ok(h) => handles.push((index, h)),
                Err(e) => {
                    shared.stop.store(true, Ordering::Release);
                    return Err(RelayError::Setup(format!(
                        "start relay worker {index}: {e}"
                    )));
                }
            }
        }
        if let Some(m) = &metrics {
            let published = &published;
            if let Err(e) = std::thread::Builder::new()
                .name("mt6d-metrics".into())
                .spawn_scoped(scope, move || m.run(published, &shared.stop))
            {
                shared.stop.store(true, Ordering::Release);
                return Err(RelayError::Setup(format!("start metrics thread: {e}")));
            }
            log::info!("metrics on http://{}/metrics", m.local_addr());
        }
        if let Err(e) = mt6d_os::service::ready(&format!(
            "relay node, {} links, {workers} workers",
            cfg.links.len()
        )) {
            log::warn!("tell the service manager we are ready: {e}");
        }
        let result = {
            let _stop = StopOnExit(&shared.stop);
            let published = metrics.as_ref().map(|_| &published);
            main.serve_main(signals, &ctl, ndp, started, published)
        };
        // The first failure is the one to report: a worker's error or panic, else this loop's.
        let mut first = result.err();
        for (index, h) in handles {
            let failure = match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(RelayError::Worker(format!("relay worker {index}: {e}"))),
                Err(_) => Some(RelayError::Worker(format!(
                    "relay worker {index} panicked (see the log above); the node stopped"
                ))),
            };
            if first.is_none() {
                first = failure;
            }
        }
        first.map_or(Ok(()), Err)
    })
}

impl<'a> Worker<'a> {
    fn new(shared: &'a Shared<'a>, index: usize, socket: UdpSocket6, tun: Option<Tun>) -> Self {
        let cfg = shared.cfg;
        let slot = frame_payload_len(cfg.frame_max);
        let tun_mtu = super::inner_mtu(cfg.frame_max);
        Worker {
            shared,
            index,
            split: shared.counters.len() > 1,
            socket,
            tun,
            counters: IoCounters::default(),
            rx_scratch: RecvScratch::new(RX_BATCH),
            bufs: (0..RX_BATCH).map(|_| RecvBuf::new()).collect(),
            links: vec![None; RX_BATCH],
            empty_slots: Vec::with_capacity(4),
            spans: Vec::with_capacity(RX_BATCH * 64),
            pending: Vec::with_capacity(RX_BATCH * 64),
            inner_jobs: Vec::with_capacity(IDEAL_BATCH_SIZE),
            tun_out: (0..IDEAL_BATCH_SIZE)
                .map(|_| Vec::with_capacity(VIRTIO_NET_HDR_LEN + 65_535))
                .collect(),
            tun_ready: 0,
            gro: GROTable::default(),
            tun_scratch: TunRecvScratch::new(),
            tun_packets: vec![vec![0u8; tun_mtu + 64]; IDEAL_BATCH_SIZE],
            tun_sizes: vec![0; IDEAL_BATCH_SIZE],
            sealed: vec![0u8; IDEAL_BATCH_SIZE * slot],
            send_scratch: RawSendScratch::new(RX_BATCH * 64),
            msgs_store: Vec::with_capacity(RX_BATCH * 64),
            udp_scratch: SendScratch::new(RX_BATCH * 64),
            udp_msgs_store: Vec::with_capacity(RX_BATCH * 64),
            control_buf: vec![0u8; slot],
        }
    }

    /// The worker's epoll: its transparent socket and its TUN queue.
    fn epoll(&self) -> Result<Epoll, RelayError> {
        let cfg = self.shared.cfg;
        let epoll = Epoll::new().map_err(os("epoll"))?;
        self.socket
            .set_nonblocking(true)
            .map_err(os("make the transparent socket non-blocking"))?;
        epoll
            .add(self.socket.as_raw_fd(), SOCKET_TOKEN)
            .map_err(os("watch the transparent socket"))?;
        if let Some(tun) = &self.tun {
            tun.set_nonblocking(true)
                .map_err(os(format!("make {} non-blocking", cfg.tun_name)))?;
            epoll
                .add(tun.as_raw_fd(), TUN_TOKEN)
                .map_err(os(format!("watch {}", cfg.tun_name)))?;
        }
        Ok(epoll)
    }

    /// Whether this worker's loop should end: a stop signal, or another worker ended.
    fn stopping(&self, signals: &Signals) -> bool {
        signals.stop_requested() || self.shared.stop.load(Ordering::Acquire)
    }

    /// Makes this worker's counters visible to `mt6d status` (one uncontended lock per wake-up).
    fn publish(&self) {
        self.shared.counters[self.index]
            .lock()
            .clone_from(&self.counters);
    }

    /// A worker other than 0: its socket and queue until the node stops, in the kit's worker
    /// loop.
    fn serve(&mut self, signals: &Signals) -> Result<(), RelayError> {
        let epoll = self.epoll()?;
        let index = self.index;
        let load = &self.shared.load[index];
        let mut packets = RelayPackets {
            worker: self,
            signals,
            main: None,
        };
        worker::serve(&epoll, index, load, placement(), &mut packets).map_err(os("wait"))?;
        Ok(())
    }

    /// Worker 0: its socket and queue, and the node's timers, the neighbour responders, the
    /// control socket and the periodic counter line, in the kit's worker loop (which waits at
    /// most until the node's next timer).
    fn serve_main(
        &mut self,
        signals: &Signals,
        ctl: &ControlServer,
        ndp: Vec<NdpResponder>,
        started: Instant,
        published: Option<&crate::metrics::Published>,
    ) -> Result<(), RelayError> {
        let epoll = self.epoll()?;
        for (k, r) in ndp.iter().enumerate() {
            use std::os::fd::AsFd;
            epoll
                .add(r.capture().as_fd().as_raw_fd(), NDP_TOKEN + k as u64)
                .map_err(os("watch the neighbour responder"))?;
        }
        let mut main = MainDuties {
            ctl,
            ndp,
            started,
            published,
            rng: rand::rng(),
            last_report: Instant::now(),
            last_rx: 0,
            published_at: None,
        };
        self.housekeeping(&mut main.rng);
        let index = self.index;
        let load = &self.shared.load[index];
        let mut packets = RelayPackets {
            worker: self,
            signals,
            main: Some(main),
        };
        worker::serve(&epoll, index, load, placement(), &mut packets).map_err(os("wait"))?;
        Ok(())
    }

    /// Worker 0's duties besides packets, after every wake-up: the node's timers, metrics,
    /// control requests and the counter line.
    fn main_duties(&mut self, signals: &Signals, main: &mut MainDuties<'_>) {
        if signals.take_reload() {
            log::warn!(
                "SIGHUP: the relay role does not reload its file yet; restart it to apply changes"
            );
        }
        self.housekeeping(&mut main.rng);
        // The metrics thread serves the newest status; once a second is enough.
        if let Some(p) = main.published {
            if main
                .published_at
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(1))
            {
                let st = crate::status::AnyStatus::Relay(self.status(main.started, &main.ndp));
                p.store(Some(std::sync::Arc::new(st)));
                main.published_at = Some(Instant::now());
            }
        }
        while let Some(pending) = main.ctl.next_request() {
            match pending.request.clone() {
                Asked::Status => pending.reply(&self.status(main.started, &main.ndp)),
                Asked::Change(_) => pending.reply(&ChangeAnswer {
                    error: Some(
                        "the relay role has no runtime changes yet: edit the file and restart"
                            .into(),
                    ),
                    ..ChangeAnswer::default()
                }),
                Asked::Unknown(why) => pending.reply(&ChangeAnswer {
                    error: Some(why),
                    ..ChangeAnswer::default()
                }),
            }
        }
        if main.last_report.elapsed() >= REPORT_EVERY {
            let counters = self.counter_map(&self.shared.core.lock(), &main.ndp);
            let rx = counters.get("rx_datagrams").copied().unwrap_or(0);
            if rx != main.last_rx {
                log::info!("{}", counter_line(&counters));
                main.last_rx = rx;
            }
            main.last_report = Instant::now();
        }
    }

    fn link_name(&self, n: Neighbour) -> &'a str {
        let cfg = self.shared.cfg;
        usize::try_from(n.0)
            .ok()
            .and_then(|i| cfg.links.get(i))
            .map_or("?", |l| l.name.as_str())
    }

    fn e2e_name(&self, id: E2eId) -> &'a str {
        let cfg = self.shared.cfg;
        usize::try_from(id.0)
            .ok()
            .and_then(|i| cfg.e2e.get(i))
            .map_or("?", |e| e.name.as_str())
    }

    /// Timers due, then whatever the node queued: link-local frames to send, events to log.
    fn housekeeping(&mut self, rng: &mut impl Rng) {
        let shared = self.shared;
        let mut core = shared.core.lock();
        let now = clock::now();
        if core.node.poll_timeout() <= now {
            core.node.handle_timeout(now, || rng.random());
        }
        self.drain(&mut core, now);
    }

    /// Sends what the node queued (probes, replies, routing and handshake messages), applies
    /// and logs its events, and sends the packets held for peers that just got keys.
    fn drain(&mut self, core: &mut Core, now: UnixTime) {
        self.publish_gate(core);
        self.send_control(core, now);
        let mut keyed = Vec::new();
        while let Some(ev) = core.node.poll_event() {
            if let Event::E2eKeyed { peer, .. } = ev {
                keyed.push(peer);
            }
            self.log_event(core, ev);
        }
        for peer in keyed {
            self.send_staged(core, now, peer);
        }
        self.publish_gate(core);
        self.send_control(core, now);
    }

    /// A new receive gate for every worker if the node's routes or keys changed since the last
    /// (one comparison per link; a rebuild a few times per link and epoch). Under the core lock.
    fn publish_gate(&self, core: &Core) {
        if core.node.rx_version() != self.shared.gate.load().version() {
            self.shared.gate.store(Arc::new(core.node.rx_gate()));
        }
    }

    /// The packets held for `peer` while its handshake was under way, now that it has keys.
    fn send_staged(&mut self, core: &mut Core, now: UnixTime, peer: E2eId) {
        for inner in core.staged.remove(&peer).unwrap_or_default() {
            match core
                .node
                .send_inner(now, peer, &inner, &mut self.control_buf)
            {
                Ok(t) => self.send_control_buf(&t),
                Err(_) => self.counters.tun_no_key += 1,
            }
        }
    }

    /// Sends every queued probe, reply, routing and handshake message.
    fn send_control(&mut self, core: &mut Core, now: UnixTime) {
        while let Some(t) = core.node.poll_transmit(now, &mut self.control_buf) {
            self.send_control_buf(&t);
        }
    }

    /// Sends what `t` says the node wrote into the control buffer, through the raw socket.
    fn send_control_buf(&mut self, t: &Transmit) {
        let msg = [RawSendMsg {
            src: t.route.local,
            dst: t.route.remote,
            payload: &self.control_buf[..t.len],
        }];
        match self.shared.raw.send_batch(&mut self.send_scratch, &msg) {
            Ok(1) => self.counters.tx_datagrams += 1,
            _ => self.counters.tx_send_failed += 1,
        }
    }

    /// Applies one event of the node (a link's new sending address) and logs it.
    fn log_event(&mut self, core: &mut Core, ev: Event) {
        match ev {
            Event::LinkSchedule { link, schedule } => {
                log::debug!(
                    "link {}: epoch {}, sending {} -> {}",
                    self.link_name(link),
                    schedule.send.epoch.0,
                    schedule.send.local,
                    schedule.send.remote
                );
                if let Some(p) = usize::try_from(link.0)
                    .ok()
                    .and_then(|i| core.send_from.get_mut(i))
                {
                    *p = Some(schedule.send.local);
                }
                self.reconcile_senders(core);
            }
            Event::LinkCost { link, cost } if !cost.is_finite() => {
                log::warn!("link {}: dead (no probe answered)", self.link_name(link));
            }
            Event::LinkCost { link, cost } => {
                log::info!("link {}: cost {}", self.link_name(link), cost.0);
            }
            Event::LinkKeyed {
                link,
                initiator,
                rekey,
            } => {
                let what = if rekey { "rekeyed" } else { "keyed" };
                let side = if initiator { "we initiated" } else { "it initiated" };
                if rekey {
                    log::debug!("link {}: {what} ({side})", self.link_name(link));
                } else {
                    log::info!("link {}: {what} by a handshake ({side})", self.link_name(link));
                }
            }
            Event::E2eKeyed {
                peer,
                initiator,
                rekey,
            } => {
                let side = if initiator { "we initiated" } else { "it initiated" };
                if rekey {
                    log::debug!("end-to-end peer {}: rekeyed ({side})", self.e2e_name(peer));
                } else {
                    log::info!(
                        "end-to-end peer {}: keyed by a handshake through the relays ({side})",
                        self.e2e_name(peer)
                    );
                }
            }
            Event::E2eKeysExpired { peer } => {
                core.staged.remove(&peer);
                log::warn!(
                    "end-to-end peer {}: keys expired with no rekey: its hosts' packets are refused until a handshake completes (is a route to its edge gateway up, and is its public_key right?)",
                    self.e2e_name(peer)
                );
            }
            Event::LinkKeysExpired { link } => log::warn!(
                "link {}: keys expired with no rekey: it carries nothing until a handshake completes (is the neighbour up, and is its public_key right?)",
                self.link_name(link)
            ),
            Event::RouteChanged {
                destination,
                next_hop: Some(n),
            } => log::info!("route to {destination}: via {}", self.link_name(n)),
            Event::RouteChanged {
                destination,
                next_hop: None,
            } => log::warn!("route to {destination}: none (unreachable)"),
        }
    }

    /// One batch of datagrams from the links. Several workers, in passes: (1) without the
    /// node's lock, each datagram through the receive gate ([`RxGate::admit`]): on no link's
    /// route, or refused (a forgery's tag), it is counted and dropped there; opened, it waits
    /// for the node; a handshake message, a keepalive or a rekey race waits for the node's own
    /// path; (2) under the lock, in arrival order, the replay windows, probes, routing and
    /// forwarding decisions (`finish_datagram`), the node's path whole for the rest
    /// (`handle_datagram`); (3) without it, the forwarded frames sealed for their next link and,
    /// at an edge gateway, the end-to-end payloads opened (`DeliverJob::open`); (4) at an edge
    /// gateway, under it again, the end-to-end replay windows (`finish_delivery`). Then the
    /// sends and the TUN write, without it. A batch of junk and forgeries never takes the lock.
    /// With one worker, one pass under the lock (`handle_datagram`: the same steps in a row)
    /// for every datagram on a link's route.
    fn on_socket(&mut self) {
        let t0 = Instant::now();
        let got = match self.socket.recv_ready(&mut self.rx_scratch, &mut self.bufs) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::debug!("{e}");
                return;
            }
        };
        self.counters.socket_queue_drops += self.socket.take_queue_drops();
        self.counters.rx_bytes += self.bufs[..got].iter().map(|b| b.len() as u64).sum::<u64>();
        let t1 = Instant::now();
        self.counters.stage_recv_ns += nanos(t1 - t0);
        let mut tun_write = Duration::ZERO;
        let mut lock_wait = Duration::ZERO;
        self.spans.clear();
        self.tun_ready = 0;
        // Out of `self` while the node works on them (moves of the vectors, no copy).
        let mut bufs = std::mem::take(&mut self.bufs);
        let mut pending = std::mem::take(&mut self.pending);
        pending.clear();
        let shared = self.shared;
        // Pass 1, without the lock: each buffer's link by its (destination, source), else
        // dropped; with several workers, each datagram through the gate.
        let mut admitted = 0;
        {
            let gate = shared.gate.load();
            for (b, buf) in bufs[..got].iter_mut().enumerate() {
                self.links[b] = None;
                if buf.truncated() {
                    self.counters.rx_truncated += 1;
                    continue;
                }
                let local = SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0);
                let remote = buf.src();
                let len = buf.len();
                let seg = buf.segment_size().map_or(len, usize::from).max(1);
                let Some(link) = gate.link_of(local, remote) else {
                    self.counters.rx_no_link += len.div_ceil(seg) as u64;
                    continue;
                };
                self.links[b] = Some(link);
                if !self.split {
                    admitted += 1;
                    continue;
                }
                let data = buf.data_mut();
                let mut start = 0;
                while start < len {
                    let end = (start + seg).min(len);
                    self.counters.rx_datagrams += 1;
                    match gate.admit(local, remote, &mut data[start..end]) {
                        Admit::NoRoute => self.counters.rx_no_link += 1,
                        Admit::Refused(_, reason) => self.counters.refused(reason),
                        Admit::Node(link) => pending.push((b, start, end, Pending::Whole(link))),
                        Admit::NoKey(link) => {
                            self.counters.refused(OpenError::NoKey.reason());
                            if !self.empty_slots.contains(&link) {
                                self.empty_slots.push(link);
                            }
                        }
                        Admit::Opened(job) => pending.push((b, start, end, Pending::Opened(job))),
                    }
                    start = end;
                }
            }
        }
        if admitted > 0 {
            // One worker: every datagram whole under the (uncontended) lock.
            let t = Instant::now();
            let mut core = shared.core.lock();
            lock_wait += t.elapsed();
            let now = clock::now();
            for (b, buf) in bufs[..got].iter_mut().enumerate() {
                let Some(link) = self.links[b] else {
                    continue;
                };
                let local = SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0);
                let remote = buf.src();
                let len = buf.len();
                let seg = buf.segment_size().map_or(len, usize::from).max(1);
                let data = buf.data_mut();
                let mut start = 0;
                while start < len {
                    let end = (start + seg).min(len);
                    self.counters.rx_datagrams += 1;
                    let datagram = &mut data[start..end];
                    let r = core
                        .node
                        .handle_datagram(now, link, local, remote, datagram);
                    tun_write += self.take_received(b, start, r, datagram);
                    start = end;
                }
            }
            self.drain(&mut core, now);
        }
        // Pass 2, under the lock, in arrival order.
        let mut deliveries = false;
        if !pending.is_empty() || !self.empty_slots.is_empty() {
            let t = Instant::now();
            let mut core = shared.core.lock();
            lock_wait += t.elapsed();
            let now = clock::now();
            for link in self.empty_slots.drain(..) {
                core.node.note_empty_slot(now, link);
            }
            for (b, start, end, p) in &mut pending {
                let buf = &mut bufs[*b];
                let (local, remote) = (
                    SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0),
                    buf.src(),
                );
                let data = &mut buf.data_mut()[*start..*end];
                let received = match std::mem::replace(p, Pending::Done) {
                    Pending::Opened(job) => {
                        match core.node.finish_datagram(now, &job, Ok(()), data) {
                            Finish::Done(r) => r,
                            Finish::Seal(seal) => {
                                *p = Pending::Seal(seal);
                                continue;
                            }
                            Finish::Deliver(d) => {
                                *p = Pending::Deliver(d);
                                deliveries = true;
                                continue;
                            }
                        }
                    }
                    Pending::Whole(link) => {
                        core.node.handle_datagram(now, link, local, remote, data)
                    }
                    _ => continue,
                };
                tun_write += self.take_received(*b, *start, received, data);
            }
            self.drain(&mut core, now);
        }
        // Pass 3, without the lock: seals for the next link, end-to-end opens.
        let mut sealed_here = false;
        for (b, start, end, p) in &mut pending {
            let data = &mut bufs[*b].data_mut()[*start..*end];
            match p {
                Pending::Seal(seal) => match seal.seal(data) {
                    Ok(t) => {
                        self.spans
                            .push((*b, *start, t.len, t.route.local, t.route.remote));
                        sealed_here = true;
                    }
                    Err(e) => {
                        self.counters.tx_seal_failed += 1;
                        note_key_limit(&e);
                        log::debug!("seal a forwarded frame: {e}");
                    }
                },
                Pending::Deliver(d) => {
                    let opened = d.open(data);
                    if let Pending::Deliver(d) = std::mem::replace(p, Pending::Done) {
                        *p = Pending::Delivered(d, opened);
                    }
                }
                _ => {}
            }
        }
        // Pass 4, under the lock: the end-to-end replay windows.
        if deliveries {
            let t = Instant::now();
            let mut core = shared.core.lock();
            lock_wait += t.elapsed();
            let now = clock::now();
            for (b, start, end, p) in &mut pending {
                if let Pending::Delivered(d, opened) = std::mem::replace(p, Pending::Done) {
                    let received = core.node.finish_delivery(now, &d, opened);
                    let data = &bufs[*b].data()[*start..*end];
                    tun_write += self.take_received(*b, *start, received, data);
                }
            }
            self.drain(&mut core, now);
        }
        if sealed_here {
            // Back in arrival order, so that a GRO train forwarded whole leaves as one GSO train.
            self.spans.sort_unstable_by_key(|s| (s.0, s.1));
        }
        self.pending = pending;
        tun_write += self.flush_tun();
        let t3 = Instant::now();
        let spans = std::mem::take(&mut self.spans);
        self.send_spans(&spans, |b, start, len| &bufs[b].data()[start..start + len]);
        self.spans = spans;
        self.bufs = bufs;
        let c = &mut self.counters;
        c.stage_lock_ns += nanos(lock_wait);
        c.stage_send_ns += nanos(t3.elapsed());
        c.stage_tun_write_ns += nanos(tun_write);
        c.stage_node_ns += nanos((t3 - t1).saturating_sub(tun_write + lock_wait));
    }

    /// What the node left of datagram `data` (at `start` of buffer `b`): a frame to send, an
    /// inner packet for the TUN queue, or nothing. Returns the time a full TUN batch took to
    /// write (rare: more inner packets in one receive than a batch holds).
    fn take_received(&mut self, b: usize, start: usize, r: Received, data: &[u8]) -> Duration {
        let mut tun_write = Duration::ZERO;
        match r {
            Received::Forward(t) => {
                self.spans
                    .push((b, start, t.len, t.route.local, t.route.remote));
            }
            Received::Deliver { range, .. } => {
                if self.tun_ready == self.tun_out.len() {
                    tun_write = self.flush_tun();
                }
                let slot = &mut self.tun_out[self.tun_ready];
                slot.clear();
                slot.resize(VIRTIO_NET_HDR_LEN, 0);
                slot.extend_from_slice(&data[range]);
                self.tun_ready += 1;
            }
            Received::Consumed => {}
        }
        tun_write
    }

    /// Neighbour Solicitations on link interface `k`: answered for the links' current
    /// addresses only (`RelayNode::answers_for`), so a scan of the /64 from the segment learns
    /// nothing.
    fn on_ndp(&mut self, ndp: &mut [NdpResponder], k: usize) {
        let core = self.shared.core.lock();
        if let Some(r) = ndp.get_mut(k) {
            if let Err(e) = r.serve_ready(|a| core.node.answers_for(a), NDP_BUDGET) {
                let interface = self
                    .shared
                    .cfg
                    .link_interfaces()
                    .get(k)
                    .copied()
                    .unwrap_or("?");
                log::warn!("neighbour responder on {interface}: {e}");
            }
        }
    }

    /// One batch of inner packets from the protected side (edge gateways): read from this
    /// worker's TUN queue without the node's lock; under it, each packet's peer, route and keys
    /// (`begin_inner`); without it, sealed end to end and for the next link (`InnerJob::seal`)
    /// and sent. With one worker, sealed under the lock in the same pass (`send_inner`).
    fn on_tun(&mut self) {
        let Some(tun) = &self.tun else { return };
        let n = match tun.recv_batch(
            &mut self.tun_scratch,
            &mut self.tun_packets,
            &mut self.tun_sizes,
            0,
        ) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::warn!("{e}");
                return;
            }
        };
        self.counters.tun_rx_bytes += self.tun_sizes[..n]
            .iter()
            .map(|&len| len as u64)
            .sum::<u64>();
        let shared = self.shared;
        self.spans.clear();
        let mut jobs = std::mem::take(&mut self.inner_jobs);
        jobs.clear();
        {
            let t0 = Instant::now();
            let mut core = shared.core.lock();
            self.counters.stage_lock_ns += nanos(t0.elapsed());
            let now = clock::now();
            let mut cursor = 0;
            for i in 0..n {
                self.counters.tun_rx_packets += 1;
                let inner = &self.tun_packets[i][..self.tun_sizes[i]];
                let pair = mt6d_proto::wire::address_bytes(inner)
                    .map(|(s, d)| (Ipv6Addr::from(*s), Ipv6Addr::from(*d)));
                let Some(&id) = pair.and_then(|p| shared.by_pair.get(&p)) else {
                    self.counters.tun_no_peer += 1;
                    continue;
                };
                // Back to back, so that equal-size datagrams to one destination form a GSO train.
                let result = if self.split {
                    // Sealed below, without the lock.
                    core.node.begin_inner(now, id, inner.len()).map(|job| {
                        let at = cursor;
                        cursor += job.wire_len();
                        jobs.push((i, at, job));
                    })
                } else {
                    let out = &mut self.sealed[cursor..];
                    core.node.send_inner(now, id, inner, out).map(|t| {
                        self.spans
                            .push((0, cursor, t.len, t.route.local, t.route.remote));
                        cursor += t.len;
                    })
                };
                match result {
                    Ok(()) => {}
                    Err(NodeError::NoRoute(_)) => self.counters.tun_no_route += 1,
                    Err(NodeError::NoE2eKey(_)) => {
                        let held = core.staged.entry(id).or_default();
                        if held.len() < STAGED_MAX {
                            held.push(inner.to_vec());
                            self.counters.tun_staged += 1;
                        } else {
                            self.counters.tun_no_key += 1;
                        }
                    }
                    Err(NodeError::NoKey(_)) => self.counters.tun_no_key += 1,
                    Err(e) => {
                        self.counters.tun_seal_failed += 1;
                        log::debug!("seal for end-to-end peer {}: {e}", id.0);
                    }
                }
            }
            self.drain(&mut core, now);
        }
        for (i, at, job) in &jobs {
            let inner = &self.tun_packets[*i][..self.tun_sizes[*i]];
            match job.seal(inner, &mut self.sealed[*at..]) {
                Ok(t) => self
                    .spans
                    .push((0, *at, t.len, t.route.local, t.route.remote)),
                Err(e) => {
                    self.counters.tun_seal_failed += 1;
                    if let NodeError::Seal(e) = &e {
                        note_key_limit(e);
                    }
                    log::debug!("seal for an end-to-end peer: {e}");
                }
            }
        }
        self.inner_jobs = jobs;
        let spans = std::mem::take(&mut self.spans);
        let sealed = std::mem::take(&mut self.sealed);
        self.send_spans(&spans, |_, start, len| &sealed[start..start + len]);
        self.sealed = sealed;
        self.spans = spans;
    }

    /// Opens a sender socket for every link's current send address and port and closes the
    /// ones no link sends from any more (at most one bind per link and epoch), then publishes
    /// the new map to every worker. Under the core lock: one writer at a time.
    fn reconcile_senders(&mut self, core: &Core) {
        let wanted: Vec<SocketAddrV6> = core.send_from.iter().flatten().copied().collect();
        let old = self.shared.senders.load();
        let mut next: Senders = HashMap::with_capacity(wanted.len());
        for from in wanted {
            let existing = old.get(&from).or_else(|| next.get(&from)).cloned();
            if let Some(sock) = existing {
                next.insert(from, sock);
                continue;
            }
            match UdpSocket6::bind_to(from) {
                Ok(sock) => {
                    next.insert(from, Arc::new(sock));
                }
                // Sent through the raw socket instead (no GSO), as the server role does.
                Err(e) => {
                    self.counters.sender_bind_failed += 1;
                    log::debug!("sender socket for {from}: {e}; using the raw socket");
                }
            }
        }
        self.shared.senders.store(Arc::new(next));
    }

    /// Sends each span's bytes: runs of spans from one address and port go out through its socket
    /// in `sendmmsg` batches, consecutive equal-size datagrams to one destination adjacent in
    /// memory as one UDP GSO message; spans without a sender socket through the raw socket.
    /// A refused message is counted and skipped.
    fn send_spans<'b>(&mut self, spans: &[Span], bytes: impl Fn(usize, usize, usize) -> &'b [u8]) {
        let senders = self.shared.senders.load();
        let mut i = 0;
        while i < spans.len() {
            let from = spans[i].3;
            let run = spans[i..].iter().take_while(|s| s.3 == from).count();
            let run_spans = &spans[i..i + run];
            match senders.get(&from) {
                Some(sock) => {
                    let mut msgs = SendMsg::recycle(std::mem::take(&mut self.udp_msgs_store));
                    let gso = sock.gso_supported();
                    let mut k = 0;
                    while k < run_spans.len() {
                        let (b, start, len, src, dst) = run_spans[k];
                        let mut end = start + len;
                        let mut count = 1;
                        // Extend the train: same buffer, adjacent, same size, same pair.
                        while gso && count < MAX_GSO_SEGMENTS {
                            match run_spans.get(k + count) {
                                Some(&(b2, s2, l2, src2, dst2))
                                    if b2 == b
                                        && s2 == end
                                        && l2 == len
                                        && src2 == src
                                        && dst2 == dst
                                        && end + l2 - start <= MAX_GSO_BYTES =>
                                {
                                    end += l2;
                                    count += 1;
                                }
                                _ => break,
                            }
                        }
                        let whole = bytes(b, start, end - start);
                        msgs.push(SendMsg {
                            src: *src.ip(),
                            dst,
                            payload: whole,
                            segment_size: (count > 1)
                                .then(|| u16::try_from(len).unwrap_or(u16::MAX)),
                        });
                        k += count;
                    }
                    // Counted in datagrams, as the raw socket's: a refused GSO message is all
                    // of its datagrams refused.
                    let datagrams = |m: &SendMsg<'_>| {
                        m.segment_size
                            .map_or(1, |s| m.payload.len().div_ceil(usize::from(s).max(1)))
                            as u64
                    };
                    let mut sent_msgs = 0;
                    while sent_msgs < msgs.len() {
                        match sock.send_batch(&mut self.udp_scratch, &msgs[sent_msgs..]) {
                            Ok(0) | Err(_) => {
                                self.counters.tx_send_failed += datagrams(&msgs[sent_msgs]);
                                sent_msgs += 1;
                            }
                            Ok(n) => {
                                let sent: u64 =
                                    msgs[sent_msgs..sent_msgs + n].iter().map(datagrams).sum();
                                self.counters.tx_datagrams += sent;
                                sent_msgs += n;
                            }
                        }
                    }
                    self.udp_msgs_store = SendMsg::recycle(msgs);
                }
                None => self.send_raw(run_spans, &bytes),
            }
            i += run;
        }
    }

    /// Sends spans through the raw socket, one datagram per message.
    fn send_raw<'b>(&mut self, spans: &[Span], bytes: &impl Fn(usize, usize, usize) -> &'b [u8]) {
        let mut msgs = RawSendMsg::recycle(std::mem::take(&mut self.msgs_store));
        let mut i = 0;
        while i < spans.len() {
            msgs.clear();
            for &(b, start, len, src, dst) in &spans[i..] {
                msgs.push(RawSendMsg {
                    src,
                    dst,
                    payload: bytes(b, start, len),
                });
            }
            match self.shared.raw.send_batch(&mut self.send_scratch, &msgs) {
                Ok(0) | Err(_) => {
                    self.counters.tx_send_failed += 1;
                    i += 1;
                }
                Ok(k) => {
                    self.counters.tx_datagrams += k as u64;
                    i += k;
                }
            }
        }
        self.msgs_store = RawSendMsg::recycle(msgs);
    }

    /// Writes the delivered inner packets to this worker's TUN queue; returns the time it took.
    fn flush_tun(&mut self) -> Duration {
        if self.tun_ready == 0 {
            return Duration::ZERO;
        }
        let start = Instant::now();
        if let Some(tun) = &self.tun {
            let packets = &mut self.tun_out[..self.tun_ready];
            match tun.send_batch(&mut self.gro, packets, VIRTIO_NET_HDR_LEN) {
                Ok(_) => self.counters.tun_tx_packets += self.tun_ready as u64,
                Err(e) => {
                    self.counters.tun_write_failures += 1;
                    log::debug!("{e}");
                }
            }
        }
        self.tun_ready = 0;
        start.elapsed()
    }

    /// Every counter: the workers' sums, the node's, the neighbour responders'.
    fn counter_map(&self, core: &Core, ndp: &[NdpResponder]) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for w in &self.shared.counters {
            for (k, v) in w.lock().pairs() {
                *m.entry(k.to_string()).or_insert(0) += v;
            }
        }
        let n = core.node.counters();
        for (k, v) in [
            ("forwarded", n.forwarded),
            ("delivered", n.delivered),
            ("originated", n.originated),
            ("probes_answered", n.probes_answered),
            ("routing_received", n.routing_received),
            ("keepalives", n.keepalives),
        ] {
            m.insert(k.to_string(), v);
        }
        for (label, v) in n.drop_labels() {
            m.insert(format!("drop_{label}"), v);
        }
        // What the receive gate refused before the node saw it, under the node's labels.
        for w in &self.shared.counters {
            for (label, v) in &w.lock().gate_drops {
                *m.entry(format!("drop_{label}")).or_insert(0) += v;
            }
        }
        for r in ndp {
            let d = r.counters();
            for (k, v) in [
                ("ndp_answered", d.answered),
                ("ndp_defended", d.defended),
                ("ndp_not_current", d.not_current),
                ("ndp_malformed", d.malformed),
                ("ndp_send_errors", d.send_errors),
            ] {
                *m.entry(k.to_string()).or_insert(0) += v;
            }
        }
        m
    }

    fn status(&self, started: Instant, ndp: &[NdpResponder]) -> RelayStatus {
        let cfg = self.shared.cfg;
        let core = self.shared.core.lock();
        let node = &core.node;
        let table = node.table();
        let links = cfg
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let n = neighbour(i);
                let m = node.monitor(n);
                let (lost, sent) = m.map_or((0, 0), |m| m.loss());
                let hs = node.link_handshake(n).map(|h| h.stats());
                let now = clock::now();
                LinkStatus {
                    keys: keys_label(l.handshake.is_some(), node.link_keyed(n)),
                    handshakes: hs.map_or(0, |h| h.completed),
                    last_handshake_secs: hs
                        .and_then(|h| h.last_completed)
                        .map(|t| now.as_nanos().saturating_sub(t.as_nanos()) / 1_000_000_000),
                    route_set: node.link_route_set(n).unwrap_or(0),
                    name: l.name.clone(),
                    address: l.address.to_string(),
                    state: match m.map(|m| m.state()) {
                        Some(LinkState::Up) => "up",
                        Some(LinkState::Probation { .. }) => "probation",
                        _ => "down",
                    }
                    .to_string(),
                    cost: m.map_or(u16::MAX, |m| m.cost().0),
                    rtt_ms: m.and_then(|m| m.srtt()).map(|d| d.as_secs_f64() * 1e3),
                    probes_lost: lost,
                    probes_sent: sent,
                    route: node
                        .link_schedule(n)
                        .map(|s| format!("{} -> {}", s.send.local, s.send.remote))
                        .unwrap_or_default(),
                }
            })
            .collect();
        let routes = table
            .routes()
            .map(|(d, r)| RouteStatus {
                destination: d.to_string(),
                next_hop: self.link_name(r.next_hop).to_string(),
                metric: r.metric.0,
            })
            .collect();
        let now = clock::now();
        let e2e = cfg
            .e2e
            .iter()
            .enumerate()
            .map(|(j, e)| E2eStatus {
                keys: keys_label(e.handshake.is_some(), node.e2e_keyed(e2e_id(j))),
                handshakes: node
                    .e2e_handshake(e2e_id(j))
                    .map_or(0, |h| h.stats().completed),
                last_handshake_secs: node
                    .e2e_handshake(e2e_id(j))
                    .and_then(|h| h.stats().last_completed)
                    .map(|t| now.as_nanos().saturating_sub(t.as_nanos()) / 1_000_000_000),
                name: e.name.clone(),
                destination: e.destination.to_string(),
                local_host: e.stream.local.true_addr.to_string(),
                remote_host: e.stream.remote.true_addr.to_string(),
                next_hop: table
                    .next_hop(&e.destination)
                    .map(|n| self.link_name(n).to_string()),
            })
            .collect();
        RelayStatus {
            role: "relay".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_secs: started.elapsed().as_secs(),
            config: cfg.path.display().to_string(),
            node_id: cfg.node_id.filter(|_| cfg.is_edge()).map(|n| n.to_string()),
            transit: cfg.transit,
            prefix: cfg.prefix().to_string(),
            tun: cfg.is_edge().then(|| cfg.tun_name.clone()),
            links,
            routes,
            e2e,
            workers: self
                .shared
                .counters
                .iter()
                .zip(self.shared.load.iter())
                .map(|(w, load)| {
                    let w = w.lock();
                    let load = load.status();
                    WorkerStatus {
                        rx_datagrams: w.rx_datagrams,
                        tun_rx_packets: w.tun_rx_packets,
                        tx_datagrams: w.tx_datagrams,
                        wakeups: load.wakeups,
                        placement: load.placement,
                    }
                })
                .collect(),
            counters: self.counter_map(&core, ndp),
        }
    }
}

/// The counters that moved, as `name=value` pairs on one line.
fn counter_line(counters: &BTreeMap<String, u64>) -> String {
    counters
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `mt6d status` says of a link's or end-to-end peer's keys.
fn keys_label(handshake: bool, keyed: bool) -> String {
    match (handshake, keyed) {
        (false, _) => "pre-shared",
        (true, true) => "handshake",
        (true, false) => "none (handshake under way)",
    }
    .to_string()
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Logs, once per process, that a pre-shared link or end-to-end key reached its packet limit
/// (docs/PROTOCOL.md §4.3): its packets are refused from then on (counted in `tx_seal_failed`
/// or `tun_seal_failed`) until it has a new key. One flag, flipped on the refusal path only.
fn note_key_limit(e: &mt6d_proto::SealError) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if matches!(e, mt6d_proto::SealError::KeyLimit) && !SAID.swap(true, Ordering::Relaxed) {
        log::error!(
            "a pre-shared key of this node has protected its limit of packets in this run (2^23 with aes256-gcm, docs/PROTOCOL.md §4.3); what it would seal is dropped: give that link or end-to-end peer a new key, or use handshake keys"
        );
    }
}
