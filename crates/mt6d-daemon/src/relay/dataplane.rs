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
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use crate::config::{LinkConfig, RelayConfig};
use crate::control::{Asked, ChangeAnswer, ControlServer, Request};
use crate::daemon::anyip::ndp::NdpResponder;
use crate::daemon::anyip::os;
use crate::daemon::clock;
use crate::daemon::signals::Signals;
use crate::daemon::wakeup::{Deadlines, MainWait, Nudge, SAFETY_CAP};
use crate::daemon::worker::placement::Placement;
use crate::daemon::worker::{
    self, Carried, Packets, Wake, WorkerLoad, MAX_GSO_BYTES, MAX_GSO_SEGMENTS, TUN_TOKEN,
};
use crate::status::relay::{E2eStatus, LinkStatus, RelayStatus, RouteStatus, WorkerStatus};

/// Longest a worker other than 0 sleeps: it watches the stop flag. Worker 0 sleeps until the
/// node's next timer or its next periodic duty, and signals, control requests and the other
/// workers wake it (`daemon::wakeup`).
const TICK: Duration = Duration::from_millis(50);
/// Buffers in one recvmmsg.
const RX_BATCH: usize = 32;
/// How often the counters are logged (at info) while anything moves.
const REPORT_EVERY: Duration = Duration::from_secs(60);
const SOCKET_TOKEN: u64 = 0;
/// Worker 0: the main thread's wait set (signals, control socket, the other workers).
const WAKE_TOKEN: u64 = 1;
/// How often the metrics thread's snapshot is refreshed.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// The first neighbour responder's token; responder `k` has `NDP_TOKEN + k`.
const NDP_TOKEN: u64 = 2;
/// Neighbour discovery frames handled per wake-up at most (the rest at the next one).
const NDP_BUDGET: usize = 64;

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

/// A received datagram between passes: (buffer index, start, end, what is left to do).
type PendingDatagram = (usize, usize, usize, Pending);

/// Time a receive batch spent waiting for the node's lock and writing to the TUN queue (the
/// `stage_*` counters).
#[derive(Debug, Default)]
struct Spent {
    lock_wait: Duration,
    tun_write: Duration,
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
    /// Each link's current send address and port.
    send_from: BTreeMap<Neighbour, SocketAddrV6>,
    /// The running links: link `i` of the file the node started with is `Neighbour(i)`; a link
    /// a reload adds (or changes) gets the next handle, never one used before
    /// ([`RelayNode::remove_link`]).
    links: BTreeMap<Neighbour, LinkConfig>,
    /// The handle the next link a reload adds gets.
    next_link: u32,
}

impl Core {
    /// A link's name (for logs and status), also after a reload removed it.
    fn link_name(&self, n: Neighbour) -> &str {
        self.links.get(&n).map_or("(removed)", |l| l.name.as_str())
    }
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
    /// The node's timer worker 0 sleeps until (nanoseconds of the wall clock), written under
    /// the core lock: a worker that leaves the node with an earlier one wakes it ([`wake`]).
    ///
    /// [`wake`]: Shared::wake
    main_deadline: AtomicU64,
    /// Wakes worker 0.
    wake: Nudge,
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
    /// The datagrams of a receive batch between its passes.
    pending: Vec<PendingDatagram>,
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
    /// What worker 0 sleeps on besides its socket and queue.
    wait: MainWait,
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
        if let (Some(main), WAKE_TOKEN) = (&mut self.main, token) {
            // Clears the signal pipe and the workers' eventfd; what woke it is served by
            // `after_wake`, as every wake-up is.
            if let Err(e) = main.wait.wait(Duration::ZERO) {
                log::warn!("relay: reading the main wait set: {e}");
            }
            return Carried::NOTHING;
        }
        if let (Some(main), Some(k)) = (&mut self.main, token.checked_sub(NDP_TOKEN)) {
            self.worker.on_ndp(&mut main.ndp, k as usize);
        }
        Carried::NOTHING
    }

    fn after_wake(&mut self, _idle: bool, _wake: &mut Wake) {
        // Timers first, then this worker's counters, then what reads them (status, metrics):
        // a status answered in this wake-up counts what this wake-up received.
        if let Some(main) = &mut self.main {
            self.worker.housekeeping(&mut main.rng);
        }
        self.worker.publish();
        if let Some(main) = &mut self.main {
            self.worker.main_duties(self.signals, main);
        }
    }

    fn next_wait(&mut self) -> Duration {
        let Some(main) = &self.main else {
            return TICK;
        };
        let now = clock::now();
        let shared = self.worker.shared;
        let due = {
            let core = shared.core.lock();
            let due = core.node.poll_timeout();
            shared
                .main_deadline
                .store(due.as_nanos(), Ordering::Relaxed);
            due
        };
        let mut d = Deadlines::from(now);
        d.at(Some(due))
            .instant(main.ctl.next_deadline())
            .instant(Some(main.last_report + REPORT_EVERY));
        if main.published.is_some() {
            d.instant(main.published_at.map(|t| t + PUBLISH_EVERY));
        }
        d.wait()
    }

    fn longest_wait(&self) -> Duration {
        if self.main.is_some() {
            SAFETY_CAP
        } else {
            worker::POLL
        }
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

impl<'a> Shared<'a> {
    /// What the workers of a node with `workers` threads share, the node in its lock.
    fn new(
        cfg: &'a RelayConfig,
        node: RelayNode,
        raw: RawUdp6,
        workers: usize,
        wake: Nudge,
    ) -> Shared<'a> {
        Shared {
            gate: ArcSwap::from_pointee(node.rx_gate()),
            cfg,
            core: Mutex::new(Core {
                node,
                staged: HashMap::new(),
                send_from: BTreeMap::new(),
                links: cfg
                    .links
                    .iter()
                    .enumerate()
                    .map(|(i, l)| (neighbour(i), l.clone()))
                    .collect(),
                next_link: u32::try_from(cfg.links.len()).unwrap_or(u32::MAX),
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
            main_deadline: AtomicU64::new(0),
            wake,
        }
    }
}

/// The log line of a started node: its links, peers, workers and time to ready.
fn start_line(cfg: &RelayConfig, workers: usize, started: Instant) -> String {
    let tun_mtu = super::inner_mtu(cfg.frame_max);
    format!(
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
    )
}

/// Waits for the other workers; the first one's failure (an error or a panic), if any.
fn join_workers(
    handles: Vec<(
        usize,
        std::thread::ScopedJoinHandle<'_, Result<(), RelayError>>,
    )>,
) -> Option<RelayError> {
    let mut first = None;
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
    first
}

/// Serves until a stop signal (or a fatal error of a worker's loop): worker 0 on this thread,
/// the others on their own.
pub fn serve(
    cfg: &RelayConfig,
    node: RelayNode,
    io: RelayIo,
    signals: &Signals,
    started: Instant,
    wait: MainWait,
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
    let shared = Shared::new(cfg, node, raw, workers, wait.nudge());
    let mut tuns = tuns.into_iter();
    let mut all: Vec<Worker<'_>> = sockets
        .into_iter()
        .enumerate()
        .map(|(index, socket)| Worker::new(&shared, index, socket, tuns.next()))
        .collect();
    log::info!("{}", start_line(cfg, workers, started));
    let mut main = all.remove(0);
    let shared = &shared;
    std::thread::scope(|scope| {
        let mut handles = Vec::new();
        for w in all {
            let index = w.index;
            let ended = shared.wake.on_drop();
            let spawned = std::thread::Builder::new()
                .name(format!("mt6d-relay-{index}"))
                .spawn_scoped(scope, move || {
                    // Dropped in reverse order: the stop flag is set, then worker 0 woken.
                    let _ended = ended;
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
            main.serve_main(signals, (&ctl, wait), ndp, started, published)
        };
        // The first failure is the one to report: a worker's error or panic, else this loop's.
        let first = result.err().or(join_workers(handles));
        first.map_or(Ok(()), Err)
    })
}

mod io_counters;
mod receive;
mod reload;
mod send;
mod status;

pub use io_counters::IoCounters;

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
    /// control socket and the periodic counter line, in the kit's worker loop (which waits
    /// until the node's next timer or periodic duty, at most `daemon::wakeup::SAFETY_CAP`;
    /// signals, control requests and the other workers wake it through the main wait set).
    fn serve_main(
        &mut self,
        signals: &Signals,
        (ctl, mut wait): (&ControlServer, MainWait),
        ndp: Vec<NdpResponder>,
        started: Instant,
        published: Option<&crate::metrics::Published>,
    ) -> Result<(), RelayError> {
        let epoll = self.epoll()?;
        wait.watch_control(ctl)
            .map_err(|e| RelayError::Setup(e.to_string()))?;
        epoll
            .add(wait.as_raw_fd(), WAKE_TOKEN)
            .map_err(os("watch the main wait set"))?;
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
            wait,
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

    /// Worker 0's duties besides packets and timers, after every wake-up: metrics, control
    /// requests and the counter line.
    fn main_duties(&mut self, signals: &Signals, main: &mut MainDuties<'_>) {
        if signals.take_reload() {
            self.reload("SIGHUP");
        }
        // The metrics thread serves the newest status; once a second is enough.
        if let Some(p) = main.published {
            if main
                .published_at
                .is_none_or(|t| t.elapsed() >= PUBLISH_EVERY)
            {
                let st = crate::status::AnyStatus::Relay(self.status(main.started, &main.ndp));
                p.store(Some(std::sync::Arc::new(st)));
                main.published_at = Some(Instant::now());
            }
        }
        while let Some(pending) = main.ctl.next_request() {
            match pending.request.clone() {
                Asked::Status => pending.reply(&self.status(main.started, &main.ndp)),
                Asked::Change(Request::Reload) => pending.reply(&self.reload("mt6d reload")),
                Asked::Change(_) => pending.reply(&ChangeAnswer {
                    error: Some(
                        "the relay role changes its links by its file only: edit it and run `mt6d reload`"
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
                log::info!("{}", status::counter_line(&counters));
                main.last_rx = rx;
            }
            main.last_report = Instant::now();
        }
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
        self.wake_main_if_sooner(core);
    }

    /// A worker other than 0 that left the node with a timer sooner than the one worker 0
    /// sleeps until wakes it (a handshake message, a probe reply or a cost change handled
    /// here may bring a timer forward). Worker 0 recomputes its deadline after every wake-up.
    fn wake_main_if_sooner(&self, core: &Core) {
        if self.index == 0 {
            return;
        }
        let due = core.node.poll_timeout().as_nanos();
        let main = &self.shared.main_deadline;
        if due < main.load(Ordering::Relaxed) {
            // Under the core lock, as worker 0's own store: one wake-up per sooner timer.
            main.store(due, Ordering::Relaxed);
            self.shared.wake.nudge();
        }
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
                    core.link_name(link),
                    schedule.send.epoch.0,
                    schedule.send.local,
                    schedule.send.remote
                );
                // An event the node queued before a reload removed the link binds nothing.
                if core.links.contains_key(&link) {
                    core.send_from.insert(link, schedule.send.local);
                }
                self.reconcile_senders(core);
            }
            Event::LinkCost { link, cost } if !cost.is_finite() => {
                log::warn!("link {}: dead (no probe answered)", core.link_name(link));
            }
            Event::LinkCost { link, cost } => {
                log::info!("link {}: cost {}", core.link_name(link), cost.0);
            }
            Event::LinkKeyed {
                link,
                initiator,
                rekey,
            } => {
                let what = if rekey { "rekeyed" } else { "keyed" };
                let side = if initiator { "we initiated" } else { "it initiated" };
                if rekey {
                    log::debug!("link {}: {what} ({side})", core.link_name(link));
                } else {
                    log::info!("link {}: {what} by a handshake ({side})", core.link_name(link));
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
                core.link_name(link)
            ),
            Event::RouteChanged {
                destination,
                next_hop: Some(n),
            } => log::info!("route to {destination}: via {}", core.link_name(n)),
            Event::RouteChanged {
                destination,
                next_hop: None,
            } => log::warn!("route to {destination}: none (unreachable)"),
        }
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
