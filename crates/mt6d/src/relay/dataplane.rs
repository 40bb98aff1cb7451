//! The relay node's one thread: the transparent socket, the sending sockets, the TUN device of
//! an edge gateway, the node's timers and the control socket, driven by one epoll loop.
//!
//! Per batch of received datagrams: `recvmmsg` (UDP GRO: several datagrams of one link in one
//! buffer) -> the link named by the datagram's (destination, source) -> `handle_datagram`, which
//! opens and re-seals a forwarded frame in the buffer it arrived in, or restores an inner packet
//! there -> forwarded frames leave in one `sendmmsg` from the next link's hashed address and
//! port, a GRO train re-sealed in place leaving as one UDP GSO train; inner packets go to the
//! TUN device in one batched write. Per batch of TUN packets: the end-to-end peer named by the
//! inner (source, destination) -> `send_inner` seals end to end and for the next hop's link,
//! back to back in one buffer -> one `sendmmsg` (GSO trains again). Sending sockets: one UDP
//! socket per local port a link sends from this epoch (a bind per link and epoch), the raw
//! socket for anything without one. No allocation per packet; the only lookups per packet are
//! the link scan (three routes per link) and, at an edge, one hash of the inner address pair.

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch};
use mt6d_os::udp::{RecvBuf, SendMsg, SendScratch};
use mt6d_os::UdpSocket6;
use mt6d_os::{
    Epoll, EpollEvents, GROTable, RecvScratch, TunRecvScratch, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN,
};
use mt6d_proto::relay::cost::LinkState;
use mt6d_proto::relay::node::{E2eId, Event, NodeError, Received, RelayNode, Transmit};
use mt6d_proto::relay::table::Neighbour;
use mt6d_proto::tunnel::frame_payload_len;
use mt6d_proto::UnixTime;
use rand::Rng;

use super::status::{E2eStatus, LinkStatus, RelayStatus, RouteStatus};
use super::{e2e_id, neighbour, RelayError, RelayIo};
use crate::anyip::os;
use crate::config::RelayConfig;
use crate::control::{Asked, ChangeAnswer, ControlServer};
use crate::gateway::clock;
use crate::gateway::signals::Signals;
use crate::gateway::{MAX_GSO_BYTES, MAX_GSO_SEGMENTS};

/// Longest the loop sleeps: it also watches the stop flag and answers the control socket (a
/// request waits at most this long).
const TICK: Duration = Duration::from_millis(50);
/// Buffers in one recvmmsg.
const RX_BATCH: usize = 32;
/// How often the counters are logged (at info) while anything moves.
const REPORT_EVERY: Duration = Duration::from_secs(60);
const SOCKET_TOKEN: u64 = 0;
const TUN_TOKEN: u64 = 1;
/// The first neighbour responder's token; responder `k` has `NDP_TOKEN + k`.
const NDP_TOKEN: u64 = 2;
/// Neighbour discovery frames handled per wake-up at most (the rest at the next one).
const NDP_BUDGET: usize = 64;

/// What the daemon counted around the node (the node counts its own, by spec label).
#[derive(Debug, Default, Clone)]
pub struct IoCounters {
    pub rx_datagrams: u64,
    pub rx_truncated: u64,
    /// Datagrams to the prefix on no current route of any link (a scan, an old epoch's
    /// straggler, a forgery): dropped before any key is used.
    pub rx_no_link: u64,
    /// Datagrams the kernel took, and the ones it refused (a full queue, a GSO error).
    pub tx_datagrams: u64,
    pub tx_send_failed: u64,
    pub socket_queue_drops: u64,
    pub tun_rx_packets: u64,
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
}

/// One datagram to send: (where its bytes are, length, source, destination).
type Span = (usize, usize, usize, SocketAddrV6, SocketAddrV6);

struct Plane<'a> {
    cfg: &'a RelayConfig,
    node: RelayNode,
    io: RelayIo,
    by_pair: HashMap<(Ipv6Addr, Ipv6Addr), E2eId>,
    counters: IoCounters,
    rx_scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    /// Forwarded frames: (buffer index, start in it, length, source, destination).
    spans: Vec<Span>,
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
    /// One UDP socket per hashed address and port a link sends from this epoch, bound to
    /// exactly that pair (so it receives nothing: the tproxy rule hands every datagram for the
    /// prefix to the transparent socket, and no other address of the machine has the port
    /// open): frames leave through them with UDP GSO, a train of equal-size datagrams to one
    /// destination in one message. The raw socket sends what has no such socket (a port
    /// another program holds).
    senders: HashMap<SocketAddrV6, UdpSocket6>,
    /// Each link's current send address and port (by link index).
    send_from: Vec<Option<SocketAddrV6>>,
    udp_scratch: SendScratch,
    udp_msgs_store: Vec<SendMsg<'static>>,
    /// Probes, replies and routing messages are sealed here one at a time.
    control_buf: Vec<u8>,
    /// Inner packets for an end-to-end peer whose first handshake is under way, at most
    /// [`STAGED_MAX`] per peer, sent when it completes (a connection's first SYN then waits one
    /// round trip, not TCP's 1 s retransmission).
    staged: HashMap<E2eId, Vec<Vec<u8>>>,
}

/// Inner packets held per end-to-end peer while its handshake is under way (WireGuard holds
/// 128; a handful covers the first packets of the connections that start it).
const STAGED_MAX: usize = 16;

/// Serves until a stop signal (or a fatal error of the loop itself).
pub fn serve(
    cfg: &RelayConfig,
    node: RelayNode,
    io: RelayIo,
    signals: &Signals,
    started: Instant,
) -> Result<(), RelayError> {
    let epoll = Epoll::new().map_err(os("epoll"))?;
    io.socket
        .set_nonblocking(true)
        .map_err(os("make the transparent socket non-blocking"))?;
    epoll
        .add(io.socket.as_raw_fd(), SOCKET_TOKEN)
        .map_err(os("watch the transparent socket"))?;
    if let Some(tun) = &io.tun {
        tun.set_nonblocking(true)
            .map_err(os(format!("make {} non-blocking", cfg.tun_name)))?;
        epoll
            .add(tun.as_raw_fd(), TUN_TOKEN)
            .map_err(os(format!("watch {}", cfg.tun_name)))?;
    }
    for (k, r) in io.ndp.iter().enumerate() {
        use std::os::fd::AsFd;
        epoll
            .add(r.capture().as_fd().as_raw_fd(), NDP_TOKEN + k as u64)
            .map_err(os("watch the neighbour responder"))?;
    }
    let ctl = ControlServer::bind(&cfg.control_socket).map_err(|e| {
        RelayError::Setup(format!(
            "control socket {}: {e}",
            cfg.control_socket.display()
        ))
    })?;
    let slot = frame_payload_len(cfg.frame_max);
    let tun_mtu = super::inner_mtu(cfg.frame_max);
    let mut plane = Plane {
        cfg,
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
        node,
        io,
        counters: IoCounters::default(),
        rx_scratch: RecvScratch::new(RX_BATCH),
        bufs: (0..RX_BATCH).map(|_| RecvBuf::new()).collect(),
        spans: Vec::with_capacity(RX_BATCH * 64),
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
        senders: HashMap::new(),
        send_from: vec![None; cfg.links.len()],
        udp_scratch: SendScratch::new(RX_BATCH * 64),
        udp_msgs_store: Vec::with_capacity(RX_BATCH * 64),
        control_buf: vec![0u8; slot],
        staged: HashMap::new(),
    };
    log::info!(
        "relay node {} on {}/64: {} links ({}), {} end-to-end peers{}, transit {}, frame_max {}, ready {:.2} s after start",
        cfg.node_id.map_or_else(|| "(no id)".to_string(), |n| n.to_string()),
        cfg.prefix(),
        cfg.links.len(),
        cfg.links.iter().map(|l| format!("{} at {}", l.name, l.address)).collect::<Vec<_>>().join(", "),
        cfg.e2e.len(),
        if cfg.is_edge() { format!(", TUN {} MTU {tun_mtu}", cfg.tun_name) } else { String::new() },
        cfg.transit,
        cfg.frame_max,
        started.elapsed().as_secs_f64()
    );
    if let Err(e) = mt6d_os::service::ready(&format!("relay node, {} links", cfg.links.len())) {
        log::warn!("tell the service manager we are ready: {e}");
    }
    let mut events = EpollEvents::with_capacity(4);
    let mut rng = rand::rng();
    let mut last_report = Instant::now();
    let mut last_rx = 0;
    plane.housekeeping(&mut rng);
    loop {
        if signals.stop_requested() {
            return Ok(());
        }
        if signals.take_reload() {
            log::warn!(
                "SIGHUP: the relay role does not reload its file yet; restart it to apply changes"
            );
        }
        let now = clock::now();
        let wait = Duration::from_nanos(
            plane
                .node
                .poll_timeout()
                .as_nanos()
                .saturating_sub(now.as_nanos()),
        )
        .min(TICK);
        epoll.wait(&mut events, Some(wait)).map_err(os("wait"))?;
        for token in events.tokens() {
            match token {
                SOCKET_TOKEN => plane.on_socket(),
                TUN_TOKEN => plane.on_tun(),
                t if t >= NDP_TOKEN => plane.on_ndp((t - NDP_TOKEN) as usize),
                _ => {}
            }
        }
        plane.housekeeping(&mut rng);
        while let Some(pending) = ctl.next_request() {
            match pending.request.clone() {
                Asked::Status => pending.reply(&plane.status(started)),
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
        if last_report.elapsed() >= REPORT_EVERY {
            if plane.counters.rx_datagrams != last_rx {
                log::info!("{}", plane.counter_line());
                last_rx = plane.counters.rx_datagrams;
            }
            last_report = Instant::now();
        }
    }
}

impl Plane<'_> {
    fn link_name(&self, n: Neighbour) -> &str {
        usize::try_from(n.0)
            .ok()
            .and_then(|i| self.cfg.links.get(i))
            .map_or("?", |l| l.name.as_str())
    }

    fn e2e_name(&self, id: E2eId) -> &str {
        usize::try_from(id.0)
            .ok()
            .and_then(|i| self.cfg.e2e.get(i))
            .map_or("?", |e| e.name.as_str())
    }

    /// Timers due, then whatever the node queued: link-local frames to send, events to log.
    fn housekeeping(&mut self, rng: &mut impl Rng) {
        let now = clock::now();
        if self.node.poll_timeout() <= now {
            self.node.handle_timeout(now, || rng.random());
        }
        self.drain(now);
    }

    /// Sends what the node queued (probes, replies, routing and handshake messages), applies
    /// and logs its events, and sends the packets held for peers that just got keys.
    fn drain(&mut self, now: UnixTime) {
        self.send_control(now);
        let mut keyed = Vec::new();
        while let Some(ev) = self.node.poll_event() {
            if let Event::E2eKeyed { peer, .. } = ev {
                keyed.push(peer);
            }
            self.log_event(ev);
        }
        for peer in keyed {
            self.send_staged(now, peer);
        }
        self.send_control(now);
    }

    /// The packets held for `peer` while its handshake was under way, now that it has keys.
    fn send_staged(&mut self, now: UnixTime, peer: E2eId) {
        for inner in self.staged.remove(&peer).unwrap_or_default() {
            match self
                .node
                .send_inner(now, peer, &inner, &mut self.control_buf)
            {
                Ok(t) => self.send_control_buf(&t),
                Err(_) => self.counters.tun_no_key += 1,
            }
        }
    }

    /// Sends every queued probe, reply, routing and handshake message.
    fn send_control(&mut self, now: UnixTime) {
        while let Some(t) = self.node.poll_transmit(now, &mut self.control_buf) {
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
        match self.io.raw.send_batch(&mut self.send_scratch, &msg) {
            Ok(1) => self.counters.tx_datagrams += 1,
            _ => self.counters.tx_send_failed += 1,
        }
    }

    /// Applies one event of the node (a link's new sending address) and logs it.
    fn log_event(&mut self, ev: Event) {
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
                    .and_then(|i| self.send_from.get_mut(i))
                {
                    *p = Some(schedule.send.local);
                }
                self.reconcile_senders();
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
                self.staged.remove(&peer);
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

    /// One batch of datagrams from the links.
    fn on_socket(&mut self) {
        let t0 = Instant::now();
        let got = match self
            .io
            .socket
            .recv_ready(&mut self.rx_scratch, &mut self.bufs)
        {
            Ok(n) => n,
            Err(e) if e.is_would_block() => return,
            Err(e) => {
                log::debug!("{e}");
                return;
            }
        };
        self.counters.socket_queue_drops += self.io.socket.take_queue_drops();
        let t1 = Instant::now();
        self.counters.stage_recv_ns += nanos(t1 - t0);
        let mut tun_write = Duration::ZERO;
        let now = clock::now();
        self.spans.clear();
        self.tun_ready = 0;
        // Out of `self` while the node works on them (a move of the vector, no copy).
        let mut bufs = std::mem::take(&mut self.bufs);
        for (b, buf) in bufs[..got].iter_mut().enumerate() {
            if buf.truncated() {
                self.counters.rx_truncated += 1;
                continue;
            }
            let local = SocketAddrV6::new(buf.dst(), buf.dst_port(), 0, 0);
            let remote = buf.src();
            let len = buf.len();
            let seg = buf.segment_size().map_or(len, usize::from).max(1);
            let Some(link) = self.node.link_of(local, remote) else {
                self.counters.rx_no_link += len.div_ceil(seg) as u64;
                continue;
            };
            let data = buf.data_mut();
            let mut start = 0;
            while start < len {
                let end = (start + seg).min(len);
                self.counters.rx_datagrams += 1;
                match self
                    .node
                    .handle_datagram(now, link, local, remote, &mut data[start..end])
                {
                    Received::Forward(t) => {
                        self.spans
                            .push((b, start, t.len, t.route.local, t.route.remote));
                    }
                    Received::Deliver { range, .. } => {
                        let inner = &data[start + range.start..start + range.end];
                        if self.tun_ready == self.tun_out.len() {
                            tun_write += self.flush_tun();
                        }
                        let slot = &mut self.tun_out[self.tun_ready];
                        slot.clear();
                        slot.resize(VIRTIO_NET_HDR_LEN, 0);
                        slot.extend_from_slice(inner);
                        self.tun_ready += 1;
                    }
                    Received::Consumed => {}
                }
                start = end;
            }
        }
        tun_write += self.flush_tun();
        let t2 = Instant::now();
        let spans = std::mem::take(&mut self.spans);
        self.send_spans(&spans, |b, start, len| &bufs[b].data()[start..start + len]);
        self.spans = spans;
        self.bufs = bufs;
        let c = &mut self.counters;
        c.stage_send_ns += nanos(t2.elapsed());
        c.stage_tun_write_ns += nanos(tun_write);
        c.stage_node_ns += nanos((t2 - t1).saturating_sub(tun_write));
        self.drain(now);
    }

    /// Neighbour Solicitations on link interface `k`: answered for the links' current
    /// addresses only (`RelayNode::answers_for`), so a scan of the /64 from the segment learns
    /// nothing.
    fn on_ndp(&mut self, k: usize) {
        let node = &self.node;
        if let Some(r) = self.io.ndp.get_mut(k) {
            if let Err(e) = r.serve_ready(|a| node.answers_for(a), NDP_BUDGET) {
                let interface = self.cfg.link_interfaces().get(k).copied().unwrap_or("?");
                log::warn!("neighbour responder on {interface}: {e}");
            }
        }
    }

    /// One batch of inner packets from the protected side (edge gateways).
    fn on_tun(&mut self) {
        let Some(tun) = &self.io.tun else { return };
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
        let now = clock::now();
        self.spans.clear();
        let mut cursor = 0;
        for i in 0..n {
            self.counters.tun_rx_packets += 1;
            let inner = &self.tun_packets[i][..self.tun_sizes[i]];
            let pair = inner.get(8..24).zip(inner.get(24..40)).and_then(|(s, d)| {
                let s: [u8; 16] = s.try_into().ok()?;
                let d: [u8; 16] = d.try_into().ok()?;
                Some((Ipv6Addr::from(s), Ipv6Addr::from(d)))
            });
            let Some(&id) = pair.and_then(|p| self.by_pair.get(&p)) else {
                self.counters.tun_no_peer += 1;
                continue;
            };
            // Back to back, so that equal-size datagrams to one destination form a GSO train.
            let out = &mut self.sealed[cursor..];
            match self.node.send_inner(now, id, inner, out) {
                Ok(t) => {
                    self.spans
                        .push((0, cursor, t.len, t.route.local, t.route.remote));
                    cursor += t.len;
                }
                Err(NodeError::NoRoute(_)) => self.counters.tun_no_route += 1,
                Err(NodeError::NoE2eKey(_)) => {
                    let held = self.staged.entry(id).or_default();
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
        let spans = std::mem::take(&mut self.spans);
        let sealed = std::mem::take(&mut self.sealed);
        self.send_spans(&spans, |_, start, len| &sealed[start..start + len]);
        self.sealed = sealed;
        self.spans = spans;
        self.drain(now);
    }

    /// Opens a sender socket for every link's current send address and port and closes the
    /// ones no link sends from any more (at most one bind per link and epoch).
    fn reconcile_senders(&mut self) {
        let wanted: Vec<SocketAddrV6> = self.send_from.iter().flatten().copied().collect();
        self.senders.retain(|a, _| wanted.contains(a));
        for from in wanted {
            if self.senders.contains_key(&from) {
                continue;
            }
            match UdpSocket6::bind_to(from) {
                Ok(sock) => {
                    self.senders.insert(from, sock);
                }
                // Sent through the raw socket instead (no GSO), as the server role does.
                Err(e) => {
                    self.counters.sender_bind_failed += 1;
                    log::debug!("sender socket for {from}: {e}; using the raw socket");
                }
            }
        }
    }

    /// Sends each span's bytes: runs of spans from one address and port go out through its socket
    /// in `sendmmsg` batches, consecutive equal-size datagrams to one destination adjacent in
    /// memory as one UDP GSO message; spans without a sender socket through the raw socket.
    /// A refused message is counted and skipped.
    fn send_spans<'b>(&mut self, spans: &[Span], bytes: impl Fn(usize, usize, usize) -> &'b [u8]) {
        let mut i = 0;
        while i < spans.len() {
            let from = spans[i].3;
            let run = spans[i..].iter().take_while(|s| s.3 == from).count();
            let run_spans = &spans[i..i + run];
            match self.senders.get(&from) {
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
            match self.io.raw.send_batch(&mut self.send_scratch, &msgs) {
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

    /// Writes the delivered inner packets; returns the time it took.
    fn flush_tun(&mut self) -> Duration {
        if self.tun_ready == 0 {
            return Duration::ZERO;
        }
        let start = Instant::now();
        if let Some(tun) = &self.io.tun {
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

    fn counter_map(&self) -> std::collections::BTreeMap<String, u64> {
        let c = &self.counters;
        let n = self.node.counters();
        let mut m: std::collections::BTreeMap<String, u64> = [
            ("rx_datagrams", c.rx_datagrams),
            ("rx_truncated", c.rx_truncated),
            ("rx_no_link", c.rx_no_link),
            ("tx_datagrams", c.tx_datagrams),
            ("tx_send_failed", c.tx_send_failed),
            ("socket_queue_drops", c.socket_queue_drops),
            ("tun_rx_packets", c.tun_rx_packets),
            ("tun_no_peer", c.tun_no_peer),
            ("tun_no_route", c.tun_no_route),
            ("tun_no_key", c.tun_no_key),
            ("tun_staged", c.tun_staged),
            ("tun_seal_failed", c.tun_seal_failed),
            ("tun_tx_packets", c.tun_tx_packets),
            ("tun_write_failures", c.tun_write_failures),
            ("sender_bind_failed", c.sender_bind_failed),
            ("stage_recv_ns", c.stage_recv_ns),
            ("stage_node_ns", c.stage_node_ns),
            ("stage_send_ns", c.stage_send_ns),
            ("stage_tun_write_ns", c.stage_tun_write_ns),
            ("forwarded", n.forwarded),
            ("delivered", n.delivered),
            ("originated", n.originated),
            ("probes_answered", n.probes_answered),
            ("routing_received", n.routing_received),
            ("keepalives", n.keepalives),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        for (label, v) in n.drop_labels() {
            m.insert(format!("drop_{label}"), v);
        }
        for r in &self.io.ndp {
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

    fn counter_line(&self) -> String {
        self.counter_map()
            .iter()
            .filter(|(_, v)| **v > 0)
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn status(&self, started: Instant) -> RelayStatus {
        let cfg = self.cfg;
        let table = self.node.table();
        let links = cfg
            .links
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let n = neighbour(i);
                let m = self.node.monitor(n);
                let (lost, sent) = m.map_or((0, 0), |m| m.loss());
                let hs = self.node.link_handshake(n).map(|h| h.stats());
                let now = clock::now();
                LinkStatus {
                    keys: keys_label(l.handshake.is_some(), self.node.link_keyed(n)),
                    handshakes: hs.map_or(0, |h| h.completed),
                    last_handshake_secs: hs
                        .and_then(|h| h.last_completed)
                        .map(|t| now.as_nanos().saturating_sub(t.as_nanos()) / 1_000_000_000),
                    route_set: self.node.link_route_set(n).unwrap_or(0),
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
                    route: self
                        .node
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
                keys: keys_label(e.handshake.is_some(), self.node.e2e_keyed(e2e_id(j))),
                handshakes: self
                    .node
                    .e2e_handshake(e2e_id(j))
                    .map_or(0, |h| h.stats().completed),
                last_handshake_secs: self
                    .node
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
            counters: self.counter_map(),
        }
    }
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
