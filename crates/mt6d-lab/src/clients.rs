//! Many MT6D clients played by one process: each client has its own
//! pre-shared session key, its own true address and its own hashed addresses and ports in the
//! client namespace's /64, and speaks to a server role daemon with the protocol crate, exactly
//! as a client gateway in host mode would. Used by the server's netns test and its load bench.
//!
//! The client side needs no per-client kernel state either, and gets none: the namespace's
//! hashed /64 is local through one AnyIP route, one tproxy rule hands every datagram to it to
//! one transparent socket ([`ClientSet::install`]), and requests leave through one raw socket
//! from each client's current hashed address and port. A request is an inner IPv6/UDP packet
//! from the client's true address to the server's echo service; the answer comes back through
//! the tunnel and is opened with that client's keys.
//!
//! A client can move an epoch to its next attempt offset ([`ClientSet::move_epoch`]), as a
//! gateway does when it cannot bind a port or sees its address taken (docs/PROTOCOL.md §5.2):
//! its routes of that epoch change, and it tells the server with a route move notice, sent
//! again every 200 ms ([`ClientSet::send_notices`]) until the server's ack arrives.

use std::collections::HashMap;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::Duration;

use mt6d_os::nftables::NftTable;
use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
use mt6d_os::udp::RecvBuf;
use mt6d_os::{Netlink, RecvScratch, UdpSocket6};
use mt6d_proto::endpoint::{IndexSeed, PeerId, PeerTable};
use mt6d_proto::moves::{is_notice, CollisionOutcome, RouteMoves, NOTICE_LEN};
use mt6d_proto::wire::upper_layer_checksum;
use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Epoch, Mode, Opener, PortPolicy, Sealer, SessionKey, Stream,
    StreamConfig, UnixTime,
};

/// UDP source port of every client's requests (inside the tunnel).
pub const CLIENT_PORT: u16 = 40_000;
/// Requests sealed and sent with one sendmmsg by [`ClientSet::send_batch`].
pub const BATCH: usize = 32;
const SLOT: usize = 2048;

/// The parameters both ends agree on.
#[derive(Debug, Clone)]
pub struct ClientSpec {
    /// The server's true address and hashed /64.
    pub server_true: Ipv6Addr,
    pub server_prefix: Ipv6Addr,
    /// The clients' hashed /64 (local in the client namespace).
    pub client_prefix: Ipv6Addr,
    /// Client `i` (from 0) has the true address `true_base + i + 1`.
    pub true_base: Ipv6Addr,
    pub rotation: Duration,
    pub jitter: bool,
    pub mode: Mode,
    /// Salts every client's key, so that two client sets in one test differ.
    pub key_salt: u8,
}

impl ClientSpec {
    pub fn true_addr(&self, i: usize) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.true_base) + i as u128 + 1)
    }

    /// Client `i`'s pre-shared session key (derived from its index: a lab key, not a secret).
    pub fn key(&self, i: usize) -> [u8; 32] {
        *blake3::hash(&[&[self.key_salt][..], &(i as u64).to_le_bytes()].concat()).as_bytes()
    }

    /// The server's peers file line of client `i`, its public key standing in as an identity.
    pub fn peers_line(&self, name: &str, i: usize) -> String {
        use base64::Engine as _;
        let b64 = base64::engine::general_purpose::STANDARD;
        let id = blake3::hash(&self.key(i));
        format!(
            "{name} {} {} prefix={}/64 key={}\n",
            b64.encode(id.as_bytes()),
            self.true_addr(i),
            self.client_prefix,
            b64.encode(self.key(i))
        )
    }

    /// Client `i`'s stream (tests of the server's side).
    #[doc(hidden)]
    pub fn stream_for_test(&self, i: usize) -> Stream {
        self.stream(i).unwrap_or_else(|e| panic!("client {i}: {e}"))
    }

    fn stream(&self, i: usize) -> Result<Stream, String> {
        let key = SessionKey::from_bytes(&self.key(i)).map_err(|e| e.to_string())?;
        Stream::new(StreamConfig {
            local: Endpoint {
                true_addr: self.true_addr(i),
                external_prefix: Some(self.client_prefix),
                mac: None,
            },
            remote: Endpoint {
                true_addr: self.server_true,
                external_prefix: Some(self.server_prefix),
                mac: None,
            },
            key,
            derivation: Derivation::default(),
            ports: PortPolicy::default(),
            mode: self.mode,
            aead: AeadAlg::default(),
            rotation: self.rotation,
            jitter: self.jitter,
        })
        .map_err(|e| e.to_string())
    }
}

/// An answer that came back through the tunnel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    pub client: usize,
    /// The inner datagram's payload.
    pub payload: Vec<u8>,
}

/// What the client side counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ClientCounters {
    pub sent: u64,
    pub replies: u64,
    /// Datagrams to no client's current route, or from a source other than the server's
    /// address of that route: a reply from a wrong source.
    pub wrong_route: u64,
    /// Datagrams that did not open or were not an answer from the echo service.
    pub rejected: u64,
    /// Route move notices sent (resends included), and the server's acks received.
    pub notices_sent: u64,
    pub acks: u64,
}

/// The clients, their routes and keys, and the two sockets they share.
pub struct ClientSet {
    table: PeerTable,
    slots: Vec<usize>,
    /// Made by each client's first request (a million idle clients hold no keys).
    sealers: Vec<Option<Box<Sealer>>>,
    openers: Vec<Option<Box<Opener>>>,
    ids: Vec<PeerId>,
    /// By client index: the route moves of the clients that moved an epoch.
    moves: HashMap<usize, RouteMoves>,
    socket: UdpSocket6,
    raw: RawUdp6,
    raw_scratch: RawSendScratch,
    recv_scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    packet: Vec<u8>,
    sealed: Vec<u8>,
    opened: Vec<u8>,
    pub counters: ClientCounters,
}

impl std::fmt::Debug for ClientSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientSet")
            .field("clients", &self.ids.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

impl ClientSet {
    /// Makes the client namespace (the calling thread's) answer on the clients' whole /64: an
    /// AnyIP route on lo and a tproxy rule to `port` in table `table`.
    pub fn install(spec: &ClientSpec, table: &str, port: u16) -> Result<NftTable, String> {
        let mut nl = Netlink::open().map_err(|e| e.to_string())?;
        let lo = nl.link_index("lo").map_err(|e| e.to_string())?;
        nl.link_set_up(lo).map_err(|e| e.to_string())?;
        // Installed again by a second set in the same namespace: replace, do not fail.
        let _ = nl.del_local_prefix(spec.client_prefix, 64, lo);
        nl.add_local_prefix(spec.client_prefix, 64, lo)
            .map_err(|e| e.to_string())?;
        let t = NftTable::new(table).map_err(|e| e.to_string())?;
        t.load(&format!(
            "chain prerouting {{\n type filter hook prerouting priority mangle; policy accept;\n \
             ip6 daddr {}/64 meta l4proto udp tproxy ip6 to :{port}\n}}",
            spec.client_prefix
        ))
        .map_err(|e| e.to_string())?;
        Ok(t)
    }

    /// `count` clients at `now`, receiving on `port` (in the calling thread's namespace).
    pub fn new(
        spec: &ClientSpec,
        count: usize,
        port: u16,
        now: UnixTime,
    ) -> Result<ClientSet, String> {
        let (table, ids, slots) = index_clients((0..count).map(|i| spec.stream(i)), count, now)?;
        let sealers = (0..count).map(|_| None).collect();
        let openers = (0..count).map(|_| None).collect();
        let socket = UdpSocket6::bind_transparent(std::net::Ipv6Addr::UNSPECIFIED, port)
            .map_err(|e| e.to_string())?;
        socket.set_nonblocking(true).map_err(|e| e.to_string())?;
        Ok(ClientSet {
            table,
            slots,
            sealers,
            openers,
            ids,
            moves: HashMap::new(),
            socket,
            raw: RawUdp6::open().map_err(|e| e.to_string())?,
            raw_scratch: RawSendScratch::new(BATCH),
            recv_scratch: RecvScratch::new(32),
            bufs: (0..32).map(|_| RecvBuf::new()).collect(),
            packet: vec![0; 2048],
            sealed: vec![0; BATCH * SLOT],
            opened: vec![0; 65_536],
            counters: ClientCounters::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// The receiving socket, for an epoll.
    pub fn socket_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.socket.as_raw_fd()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Advances the clients whose boundary passed; how many.
    pub fn step(&mut self, now: UnixTime) -> usize {
        let (moves, slots) = (&self.moves, &self.slots);
        let offset = |id: PeerId, e| offset_of(moves, slots, id, e);
        self.table.handle_timeout(now, offset, |_, _| {})
    }

    /// Advances at most `max` of the clients whose boundary passed; true when one is left.
    pub fn step_at_most(&mut self, now: UnixTime, max: usize) -> bool {
        let (moves, slots) = (&self.moves, &self.slots);
        let offset = |id: PeerId, e| offset_of(moves, slots, id, e);
        self.table
            .handle_timeout_at_most(now, max, offset, |_, _| {})
            .more
    }

    /// Client `i` moves `epoch` to its next attempt offset for a local reason (docs/PROTOCOL.md
    /// §5.2, "Ports and addresses that cannot be bound"): its routes of the epoch change at once
    /// and its notice leaves ([`ClientSet::send_notices`]).
    pub fn move_epoch(
        &mut self,
        i: usize,
        now: UnixTime,
        epoch: Epoch,
    ) -> Result<CollisionOutcome, String> {
        let id = self.ids[i];
        let stream = self.table.stream(id).ok_or("client gone")?;
        let current = stream.epoch_at(now);
        let m = self
            .moves
            .entry(i)
            .or_insert_with(|| RouteMoves::new(stream));
        let outcome = m.move_locally(now, current, epoch);
        self.table
            .refresh(id, now, |e| m.offset(e))
            .map_err(|e| e.to_string())?;
        self.send_notices(now)?;
        Ok(outcome)
    }

    /// Sends the route move notices due at `now` (first sends and the resends every 200 ms until
    /// the server acknowledges). Returns how many left.
    pub fn send_notices(&mut self, now: UnixTime) -> Result<usize, String> {
        let mut sent = 0;
        for (&i, m) in &mut self.moves {
            let stream = self.table.stream(self.ids[i]).ok_or("client gone")?;
            let schedule = stream.schedule_moved(now, m);
            let mut out = [0u8; NOTICE_LEN];
            while let Some(route) = m.poll_transmit(now, &schedule, &mut out) {
                if let Some(hk) = stream.send_header_key() {
                    hk.protect(&mut out).map_err(|e| e.to_string())?;
                }
                let msg = [RawSendMsg {
                    src: route.local,
                    dst: route.remote,
                    payload: &out,
                }];
                if matches!(self.raw.send_batch(&mut self.raw_scratch, &msg), Ok(1)) {
                    sent += 1;
                }
            }
        }
        self.counters.notices_sent += sent as u64;
        Ok(sent)
    }

    /// Client `i`'s attempt offset of epoch `e` (0 unless it moved it).
    pub fn offset(&self, i: usize, e: Epoch) -> u8 {
        self.moves.get(&i).map_or(0, |m| m.offset(e))
    }

    /// Whether every move of client `i` is acknowledged by the server.
    pub fn settled(&self, i: usize) -> bool {
        self.moves.get(&i).is_none_or(RouteMoves::settled)
    }

    /// When [`ClientSet::step`] must run next.
    pub fn poll_timeout(&self) -> Option<UnixTime> {
        self.table.poll_timeout()
    }

    /// Client `i`'s current route (its hashed address and port, and the server's).
    pub fn route(&self, i: usize) -> Option<mt6d_proto::Route> {
        self.table.send_route(self.ids[i]).copied()
    }

    /// Sends `payload` from client `i`'s true address (port [`CLIENT_PORT`]) to the server's
    /// echo service at `service_port`, through the tunnel.
    pub fn send(
        &mut self,
        spec: &ClientSpec,
        i: usize,
        service_port: u16,
        payload: &[u8],
    ) -> Result<(), String> {
        let sent = self.send_batch(spec, &[i], service_port, |_, buf| {
            buf[..payload.len()].copy_from_slice(payload);
            payload.len()
        })?;
        if sent == 1 {
            Ok(())
        } else {
            Err(format!("client {i}: the kernel refused the request"))
        }
    }

    /// Sends one request per entry of `reqs` (client, payload written by `fill` into the slice it
    /// is given, returning its length), sealed and sent [`BATCH`] at a time. Returns how many
    /// the kernel took.
    pub fn send_batch(
        &mut self,
        spec: &ClientSpec,
        reqs: &[usize],
        service_port: u16,
        mut fill: impl FnMut(usize, &mut [u8]) -> usize,
    ) -> Result<usize, String> {
        let mut sent = 0;
        for chunk in reqs.chunks(BATCH) {
            let mut routes = [None; BATCH];
            for (k, &i) in chunk.iter().enumerate() {
                let id = self.ids[i];
                let route = *self.table.send_route(id).ok_or("client has no route")?;
                let stream = self.table.stream(id).ok_or("client gone")?;
                let plen = fill(k, &mut self.packet[48..SLOT - 100]);
                let len = inner_udp_around(
                    &mut self.packet,
                    spec.true_addr(i),
                    spec.server_true,
                    CLIENT_PORT,
                    service_port,
                    plen,
                );
                let out = &mut self.sealed[k * SLOT..(k + 1) * SLOT];
                let n = sealer(&mut self.sealers[i], stream)
                    .seal(&route, &self.packet[..len], out)
                    .map_err(|e| e.to_string())?;
                if let Some(hk) = stream.send_header_key() {
                    hk.protect(&mut out[..n]).map_err(|e| e.to_string())?;
                }
                routes[k] = Some((route, n));
            }
            let msgs: Vec<RawSendMsg<'_>> = routes
                .iter()
                .enumerate()
                .filter_map(|(k, r)| {
                    r.map(|(route, n)| RawSendMsg {
                        src: route.local,
                        dst: route.remote,
                        payload: &self.sealed[k * SLOT..k * SLOT + n],
                    })
                })
                .collect();
            let mut at = 0;
            while at < msgs.len() {
                match self.raw.send_batch(&mut self.raw_scratch, &msgs[at..]) {
                    Ok(0) | Err(_) => at += 1,
                    Ok(k) => {
                        at += k;
                        sent += k;
                    }
                }
            }
        }
        self.counters.sent += sent as u64;
        Ok(sent)
    }

    /// Takes the answers queued now (none if nothing waits).
    pub fn recv(&mut self, out: &mut Vec<Reply>) -> Result<(), String> {
        self.recv_with(|client, payload| {
            out.push(Reply {
                client,
                payload: payload.to_vec(),
            });
        })
    }

    /// Takes the answers queued now, handing each (client, inner payload) to `on_reply`.
    pub fn recv_with(&mut self, mut on_reply: impl FnMut(usize, &[u8])) -> Result<(), String> {
        loop {
            let got = match self
                .socket
                .recv_ready(&mut self.recv_scratch, &mut self.bufs)
            {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.is_would_block() => return Ok(()),
                Err(e) => return Err(e.to_string()),
            };
            for b in 0..got {
                let buf = &mut self.bufs[b];
                let Some((id, epoch)) = self.table.lookup_local(buf.dst(), buf.dst_port()) else {
                    self.counters.wrong_route += buf.datagrams().count() as u64;
                    continue;
                };
                let Some(route) = self.table.index().route(id, epoch).copied() else {
                    continue;
                };
                if buf.src() != route.remote {
                    self.counters.wrong_route += buf.datagrams().count() as u64;
                    continue;
                }
                let client = self.slots[id.index() as usize];
                let Some(stream) = self.table.stream(id) else {
                    continue;
                };
                let hk = stream.recv_header_key();
                for d in buf.datagrams_mut() {
                    if let Some(hk) = hk {
                        if hk.unprotect(d).is_err() {
                            self.counters.rejected += 1;
                            continue;
                        }
                    }
                    if is_notice(d) {
                        // The server's ack of a route move.
                        let now = mt6d::daemon::clock::now();
                        let acked = self.moves.get_mut(&client).is_some_and(|m| {
                            m.handle_notice(now, stream.epoch_at(now), &route, d)
                                .is_ok()
                        });
                        if acked {
                            self.counters.acks += 1;
                        } else {
                            self.counters.rejected += 1;
                        }
                        continue;
                    }
                    let opener =
                        self.openers[client].get_or_insert_with(|| Box::new(stream.opener()));
                    match opener.open(&route, d, &mut self.opened) {
                        Ok(len) if len >= 48 && self.opened[6] == 17 => {
                            self.counters.replies += 1;
                            on_reply(client, &self.opened[48..len]);
                        }
                        _ => self.counters.rejected += 1,
                    }
                }
            }
        }
    }
}

/// The attempt offset of table entry `id`'s epoch `e` among the clients' `moves`.
fn offset_of(moves: &HashMap<usize, RouteMoves>, slots: &[usize], id: PeerId, e: Epoch) -> u8 {
    if moves.is_empty() {
        return 0;
    }
    slots
        .get(id.index() as usize)
        .and_then(|i| moves.get(i))
        .map_or(0, |m| m.offset(e))
}

/// Client streams in one `PeerTable` (its hash seed drawn at random), each added with its
/// window of `now`: the table, each client's id, and by table slot the client's index.
pub(crate) fn index_clients(
    streams: impl Iterator<Item = Result<Stream, String>>,
    count: usize,
    now: UnixTime,
) -> Result<(PeerTable, Vec<PeerId>, Vec<usize>), String> {
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed).map_err(|e| e.to_string())?;
    let mut table = PeerTable::with_capacity(IndexSeed::from_bytes(seed), count);
    let (mut ids, mut slots) = (Vec::with_capacity(count), Vec::with_capacity(count));
    for (i, stream) in streams.enumerate() {
        let (id, _) = table.add(stream?, now, |_| 0).map_err(|e| e.to_string())?;
        let slot = id.index() as usize;
        if slots.len() <= slot {
            slots.resize(slot + 1, usize::MAX);
        }
        slots[slot] = i;
        ids.push(id);
    }
    Ok((table, ids, slots))
}

/// A client's sealer, made on first use. A lab run is one process life: counters from 1 are
/// new to the server, whose opener for these keys is new too.
fn sealer<'a>(slot: &'a mut Option<Box<Sealer>>, stream: &Stream) -> &'a Sealer {
    slot.get_or_insert_with(|| Box::new(stream.sealer(1, u64::MAX >> 2)))
}

/// 002's UDP echo service: every request is answered with `factor` copies of itself, from
/// `addr`:`port` in namespace `ns`, until `stop` is set. Returns once it is listening.
pub fn echo_service(
    ns: &mt6d_os::Netns,
    addr: Ipv6Addr,
    port: u16,
    factor: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<std::thread::JoinHandle<u64>, String> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let name = ns.name().to_string();
    let handle = std::thread::spawn(move || {
        let entered = mt6d_os::Netns::open(&name).and_then(|n| n.enter_current_thread());
        let sock = match entered
            .map_err(|e| e.to_string())
            .and_then(|()| std::net::UdpSocket::bind(sa(addr, port)).map_err(|e| e.to_string()))
        {
            Ok(s) => s,
            Err(e) => {
                let _ = ready_tx.send(Err(e));
                return 0;
            }
        };
        let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
        // The daemons' buffers: on a 2-core machine shared with a server and a generator at
        // a million clients, the default (about 200 datagrams) overflowed whenever this
        // thread waited 20 ms for a core, and the requests it lost showed as the server's.
        {
            use std::os::fd::AsFd;
            if let Err(e) = mt6d_os::grow_socket_buffers(sock.as_fd(), port) {
                let _ = ready_tx.send(Err(e.to_string()));
                return 0;
            }
        }
        let _ = ready_tx.send(Ok(()));
        let mut buf = vec![0u8; 1500];
        let mut reply = Vec::with_capacity(1500 * factor);
        let mut answered = 0u64;
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok((n, from)) = sock.recv_from(&mut buf) else {
                continue;
            };
            reply.clear();
            for _ in 0..factor {
                reply.extend_from_slice(&buf[..n]);
            }
            if sock.send_to(&reply, from).is_ok() {
                answered += 1;
            }
        }
        answered
    });
    match ready_rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => Ok(handle),
        Ok(Err(e)) => Err(format!("echo service on [{addr}]:{port}: {e}")),
        Err(_) => Err(format!("echo service on [{addr}]:{port} did not start")),
    }
}

/// Writes an IPv6/UDP packet (checksum included) around a payload already at
/// `buf[48..48 + plen]`; returns the packet's length.
pub fn inner_udp_around(
    buf: &mut [u8],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    sport: u16,
    dport: u16,
    plen: usize,
) -> usize {
    let udp_len = 8 + plen;
    buf[0] = 0x60;
    buf[1..4].fill(0);
    buf[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    buf[6] = 17;
    buf[7] = 64;
    buf[8..24].copy_from_slice(&src.octets());
    buf[24..40].copy_from_slice(&dst.octets());
    buf[40..42].copy_from_slice(&sport.to_be_bytes());
    buf[42..44].copy_from_slice(&dport.to_be_bytes());
    buf[44..46].copy_from_slice(&(udp_len as u16).to_be_bytes());
    buf[46..48].fill(0);
    let mut sum = upper_layer_checksum(src, dst, 17, &buf[40..48 + plen]);
    if sum == 0 {
        sum = 0xffff;
    }
    buf[46..48].copy_from_slice(&sum.to_be_bytes());
    48 + plen
}

/// A socket address on `addr`.
pub fn sa(addr: Ipv6Addr, port: u16) -> SocketAddrV6 {
    SocketAddrV6::new(addr, port, 0, 0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use mt6d_proto::wire::UdpPacket;

    #[test]
    fn inner_packets_carry_a_valid_checksum() {
        let mut buf = vec![0u8; 128];
        let (s, d): (Ipv6Addr, Ipv6Addr) = (
            "2001:db8:c1:1::5".parse().unwrap(),
            "2001:db8:5:1::1".parse().unwrap(),
        );
        buf[48..53].copy_from_slice(b"hello");
        let n = inner_udp_around(&mut buf, s, d, 40_000, 3540, 5);
        assert_eq!(n, 53);
        let udp = UdpPacket::new_checked(&buf[40..n]).unwrap();
        assert!(udp.verify_checksum(s, d));
        assert_eq!(udp.payload(), b"hello");
    }
}
