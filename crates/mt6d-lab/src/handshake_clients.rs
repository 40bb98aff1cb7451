//! Many clients handshaking with a server role daemon from one process (to measure:
//! "handshakes per second the server completes, and how long 100,000 clients take to come up
//! from cold"). Each client has its own identity key (derived from its index: a lab key), its
//! link set's hashed addresses and ports in the client namespace's /64 (local there through one
//! AnyIP route and one tproxy rule, [`super::clients::ClientSet::install`]), and plays the
//! initiator of docs/PROTOCOL.md §9.3 with the protocol crate's `Handshake`: an initiation on
//! its link set, the response opened, then one request to the server's echo service sealed
//! with the new keys (on the link set, where a new session's data starts, §9.8), which lets
//! the server confirm them. A client is **up** (served) once the echo's answer came back and
//! opened under the new session's receive key: authenticated data from the server, not just
//! its handshake response. An unanswered request is sent again after [`REQUEST_RETRY`],
//! doubling up to four times that, so that a storm's clients do not add a second storm.
//!
//! One `HandshakeClients` owns a range of the clients and its own two sockets, so several can
//! run on several threads, each with its own hashed /64 and receiving port
//! (`mt6d bench --server`'s generator threads). Only the handshake and that first exchange are
//! played: what a client does after (data on its session set) is the business of
//! [`super::clients::ClientSet`] and of real clients (`tests/server_handshake_netns.rs`).

use std::net::Ipv6Addr;
use std::time::Duration;

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
use mt6d_os::udp::RecvBuf;
use mt6d_os::{RecvScratch, UdpSocket6};
use mt6d_proto::endpoint::{PeerId, PeerTable};
use mt6d_proto::handshake::{
    is_handshake, link_key, Handshake, HandshakeConfig, Outcome, PrivateKey, Psk, PublicKey,
};
use mt6d_proto::liveness::{LIVENESS_AFTER, LIVENESS_JITTER};
use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Opener, PortPolicy, Route, Sealer, Stream, StreamConfig,
    UnixTime,
};

use super::clients::{inner_udp_around, ClientSpec, CLIENT_PORT};

/// A client whose request went unanswered sends it again after this long, then after twice and
/// four times as long (a new counter each time: the server's replay window drops nothing it
/// has not seen).
pub const REQUEST_RETRY: Duration = Duration::from_secs(1);
/// The longest wait between two tries of a request, in [`REQUEST_RETRY`]s.
const REQUEST_RETRY_MAX: u64 = 4;
/// Bytes of a request's payload: the client's index, little-endian (the echo returns it).
const TOKEN: usize = 8;
/// Room for one sealed request or one opened answer.
const SLOT: usize = 2048;

/// What the handshaking side counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeCounters {
    /// Initiations sent (first tries and retries).
    pub initiations: u64,
    /// Handshakes completed (response opened, the first request sent).
    pub completed: u64,
    /// Requests sent after a completed handshake (first tries and retries).
    pub requests: u64,
    /// Clients served: the echo's answer opened under the new session's key.
    pub served: u64,
    /// Sessions given up by the liveness rule (requests unanswered), handshaken again.
    pub lost: u64,
    /// Data for a client already served (the answers to its earlier tries of the request),
    /// not opened.
    pub late: u64,
    /// Datagrams to no client's current route, or from a wrong source.
    pub wrong_route: u64,
    /// Messages refused by a client's handshake, and datagrams that were no handshake message.
    pub rejected: u64,
}

/// A completed handshake's keys, while the client waits for the echo's answer.
struct Session {
    send: Sealer,
    recv: Opener,
    /// The session set's entry in the table (docs/PROTOCOL.md §9.8): the server's data moves
    /// there at `activation`, and so do the client's requests.
    set: PeerId,
    activation: mt6d_proto::Epoch,
    asked_at: UnixTime,
    /// The first try: with no answer `LIVENESS_AFTER` (plus jitter) later, the session is
    /// taken for lost (docs/PROTOCOL.md §9.9 rule 2: the server may have forgotten an answer
    /// it saw no data for), and the client handshakes again.
    first_asked: UnixTime,
    /// The wait before the next try, in [`REQUEST_RETRY`]s.
    backoff: u64,
}

/// A range of the clients, their link sets and handshakes, and the two sockets they share.
pub struct HandshakeClients {
    spec: ClientSpec,
    server_public: PublicKey,
    /// The spec's index of this set's client 0 (keys and true addresses are the spec's).
    first: usize,
    /// The server's echo service port.
    echo_port: u16,
    table: PeerTable,
    /// Table slot -> client.
    slots: Vec<usize>,
    ids: Vec<PeerId>,
    privates: Vec<PrivateKey>,
    /// The handshake of each client with one under way.
    pending: Vec<Option<Box<Handshake>>>,
    /// The keys of each client whose handshake completed and whose request is unanswered.
    sessions: Vec<Option<Box<Session>>>,
    /// The clients with a session (some may have lost it since: checked on use).
    awaiting: Vec<usize>,
    /// Each client's current session set in the table, kept once it is served (until the
    /// client loses its session): the server may answer there.
    session_sets: Vec<Option<PeerId>>,
    up: Vec<bool>,
    /// The client lost its session ([`HandshakeClients::lose_session`]): its next handshake is a
    /// recovery one (docs/PROTOCOL.md §9.9).
    recovering: Vec<bool>,
    socket: UdpSocket6,
    raw: RawUdp6,
    raw_scratch: RawSendScratch,
    recv_scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
    packet: Vec<u8>,
    sealed: Vec<u8>,
    opened: Vec<u8>,
    pub counters: HandshakeCounters,
}

impl std::fmt::Debug for HandshakeClients {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeClients")
            .field("clients", &self.ids.len())
            .field("counters", &self.counters)
            .finish_non_exhaustive()
    }
}

/// Client `i`'s identity key (a lab key, from its index and the spec's salt: not a secret).
pub fn identity(spec: &ClientSpec, i: usize) -> PrivateKey {
    PrivateKey::generate(*blake3::hash(&spec.key(i)).as_bytes())
}

/// The server's peers-file line of handshake client `i` (no `key=`): name, public key, true
/// address, prefix.
pub fn peers_line(spec: &ClientSpec, name: &str, i: usize) -> String {
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::STANDARD;
    format!(
        "{name} {} {} prefix={}/64\n",
        b64.encode(identity(spec, i).public_key().as_bytes()),
        spec.true_addr(i),
        spec.client_prefix
    )
}

fn entropy() -> Option<[u8; 32]> {
    let mut e = [0u8; 32];
    getrandom::fill(&mut e).ok().map(|()| e)
}

impl HandshakeClients {
    /// The clients `range` of `spec` (their keys and true addresses are the spec's of those
    /// indices; this set calls them 0, 1, ...) at `now`, towards the server with identity
    /// `server_public` and its echo service on `echo_port`, receiving on `port` (in the calling
    /// thread's namespace; the sockets stay there whichever thread uses them later). Each
    /// client's link key is one X25519, computed on every CPU.
    pub fn new(
        spec: &ClientSpec,
        server_public: PublicKey,
        range: std::ops::Range<usize>,
        echo_port: u16,
        port: u16,
        now: UnixTime,
    ) -> Result<HandshakeClients, String> {
        let (first, count) = (range.start, range.len());
        let privates: Vec<PrivateKey> = range.map(|i| identity(spec, i)).collect();
        let indexes: Vec<usize> = (0..count).collect();
        let links = mt6d::keys::par_map(&indexes, |&i| {
            let own = spec.true_addr(first + i);
            link_key(
                &privates[i],
                &server_public,
                &Psk::none(),
                (own, spec.server_true),
            )
            .map_err(|e| e.to_string())
        });
        let streams = links.into_iter().enumerate().map(|(i, key)| {
            let key = key?;
            Stream::new(StreamConfig {
                local: Endpoint {
                    true_addr: spec.true_addr(first + i),
                    external_prefix: Some(spec.client_prefix),
                    mac: None,
                },
                remote: Endpoint {
                    true_addr: spec.server_true,
                    external_prefix: Some(spec.server_prefix),
                    mac: None,
                },
                key,
                derivation: Derivation::default(),
                ports: PortPolicy::default(),
                mode: spec.mode,
                aead: AeadAlg::default(),
                rotation: spec.rotation,
                jitter: spec.jitter,
            })
            .map_err(|e| e.to_string())
        });
        let (table, ids, slots) = super::clients::index_clients(streams, count, now)?;
        let socket = UdpSocket6::bind_transparent(std::net::Ipv6Addr::UNSPECIFIED, port)
            .map_err(|e| e.to_string())?;
        socket.set_nonblocking(true).map_err(|e| e.to_string())?;
        // The daemons' buffers: a storm's answers arrive faster than one thread takes them
        // while it computes X25519s, and the default (about 200 datagrams) would drop them.
        {
            use std::os::fd::AsFd;
            mt6d_os::grow_socket_buffers(socket.as_fd(), port).map_err(|e| e.to_string())?;
        }
        Ok(HandshakeClients {
            spec: spec.clone(),
            server_public,
            first,
            echo_port,
            table,
            slots,
            ids,
            privates,
            pending: (0..count).map(|_| None).collect(),
            sessions: (0..count).map(|_| None).collect(),
            awaiting: Vec::new(),
            session_sets: vec![None; count],
            up: vec![false; count],
            recovering: vec![false; count],
            socket,
            raw: RawUdp6::open().map_err(|e| e.to_string())?,
            raw_scratch: RawSendScratch::new(1),
            recv_scratch: RecvScratch::new(32),
            bufs: (0..32).map(|_| RecvBuf::new()).collect(),
            packet: vec![0; SLOT],
            sealed: vec![0; SLOT],
            opened: vec![0; SLOT],
            counters: HandshakeCounters::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether client `i` is served: its handshake completed and the echo's answer to its
    /// request opened under the new keys.
    pub fn is_up(&self, i: usize) -> bool {
        self.up[i]
    }

    /// Client `i`'s server lost its session (a restart) and the client noticed, by its liveness
    /// rule (docs/PROTOCOL.md §9.9): it is down again, and its next handshake is a recovery one
    /// (on its link set, retries at most 2 s apart plus jitter), as a real client's would be.
    pub fn lose_session(&mut self, i: usize) {
        self.up[i] = false;
        self.pending[i] = None;
        self.sessions[i] = None;
        self.recovering[i] = true;
        if let Some(set) = self.session_sets[i].take() {
            self.table.remove(set);
        }
    }

    /// Advances the clients whose boundary passed.
    pub fn step(&mut self, now: UnixTime) {
        self.table.handle_timeout(now, |_, _| 0, |_, _| {});
    }

    /// Sends client `i`'s initiation if one is due (its first, or a retry after the
    /// handshake's backoff: 1 s, 2 s, then 4 s). Returns whether one left. A client whose
    /// handshake completed and waits for its answer sends none.
    pub fn initiate(&mut self, i: usize, now: UnixTime) -> Result<bool, String> {
        if self.up[i] || self.sessions[i].is_some() {
            return Ok(false);
        }
        let id = self.ids[i];
        let route = *self.table.send_route(id).ok_or("client has no route")?;
        let stream = self.table.stream(id).ok_or("client gone")?;
        if self.pending[i].is_none() {
            let cfg = HandshakeConfig {
                local_private: self.privates[i].clone(),
                remote_public: self.server_public,
                psk: Psk::none(),
                mode: self.spec.mode,
                aead: AeadAlg::default(),
                local_true: self.spec.true_addr(self.first + i),
                remote_true: self.spec.server_true,
                rekey_after: Duration::from_secs(120),
                rekey_after_packets: 1 << 23,
            };
            let mut hs = Handshake::with_link_key(cfg, stream.config().key.clone())
                .map_err(|e| e.to_string())?;
            if self.recovering[i] {
                hs.liveness_failed();
            }
            self.pending[i] = Some(Box::new(hs));
        }
        let Some(hs) = self.pending[i].as_mut() else {
            return Ok(false);
        };
        let Some(mut init) = hs.poll(now, &route, 0, entropy) else {
            return Ok(false);
        };
        if let Some(hk) = stream.send_header_key() {
            hk.protect(&mut init).map_err(|e| e.to_string())?;
        }
        self.sealed[..init.len()].copy_from_slice(&init);
        self.send(route.local, route.remote, init.len());
        self.counters.initiations += 1;
        Ok(true)
    }

    fn send(&mut self, src: std::net::SocketAddrV6, dst: std::net::SocketAddrV6, len: usize) {
        let msg = [RawSendMsg {
            src,
            dst,
            payload: &self.sealed[..len],
        }];
        let _ = self.raw.send_batch(&mut self.raw_scratch, &msg);
    }

    /// Seals client `i`'s request to the echo service with its session's send key and sends
    /// it on the client's current route (of its link set, where a new session's data starts).
    fn ask(&mut self, i: usize, now: UnixTime) -> Result<(), String> {
        let Some(session) = self.sessions[i].as_mut() else {
            return Ok(());
        };
        let link = self.table.stream(self.ids[i]).ok_or("client gone")?;
        // On the link set (the session set's parent) until the activation epoch, then on the
        // session set (§9.8).
        let id = if link.epoch_at(now) >= session.activation {
            session.set
        } else {
            self.ids[i]
        };
        let route = *self.table.send_route(id).ok_or("client has no route")?;
        let stream = self.table.stream(id).ok_or("client gone")?;
        self.packet[48..48 + TOKEN].copy_from_slice(&((self.first + i) as u64).to_le_bytes());
        let len = inner_udp_around(
            &mut self.packet,
            self.spec.true_addr(self.first + i),
            self.spec.server_true,
            CLIENT_PORT,
            self.echo_port,
            TOKEN,
        );
        let n = session
            .send
            .seal(&route, &self.packet[..len], &mut self.sealed)
            .map_err(|e| e.to_string())?;
        if let Some(hk) = stream.send_header_key() {
            hk.protect(&mut self.sealed[..n])
                .map_err(|e| e.to_string())?;
        }
        self.send(route.local, route.remote, n);
        // When it left, not when the caller's turn began: a starved generator's turn can
        // last seconds, and the liveness deadline runs from the send.
        if let Some(session) = self.sessions[i].as_mut() {
            session.asked_at = mt6d::daemon::clock::now().max(now);
        }
        self.counters.requests += 1;
        Ok(())
    }

    /// Sends again the requests whose wait ran out (1, 2, then every 4 [`REQUEST_RETRY`]s);
    /// a client whose first request went unanswered for the liveness rule's deadline loses
    /// its session, and its next [`HandshakeClients::initiate`] starts a recovery handshake.
    /// Returns how many requests left.
    pub fn retry_requests(&mut self, now: UnixTime) -> Result<usize, String> {
        let mut sent = 0;
        let mut k = 0;
        while k < self.awaiting.len() {
            let i = self.awaiting[k];
            let Some(session) = self.sessions[i].as_mut() else {
                // Served, or its session lost since.
                self.awaiting.swap_remove(k);
                continue;
            };
            // §9.9 rule 2's deadline, its random part from the client and the instant.
            let jitter = (i as u64)
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(session.first_asked.as_millis())
                % (LIVENESS_JITTER.as_millis() as u64);
            if now.as_millis()
                >= session.first_asked.as_millis() + LIVENESS_AFTER.as_millis() as u64 + jitter
            {
                self.lose_session(i);
                self.awaiting.swap_remove(k);
                self.counters.lost += 1;
                continue;
            }
            let wait = REQUEST_RETRY.as_millis() as u64 * session.backoff;
            if now.as_millis() >= session.asked_at.as_millis() + wait {
                session.backoff = (session.backoff * 2).min(REQUEST_RETRY_MAX);
                self.ask(i, now)?;
                sent += 1;
            }
            k += 1;
        }
        Ok(sent)
    }

    /// Takes the datagrams queued now (none if nothing waits): a response completes its
    /// client's handshake, which then sends its request; an answer that opens under a
    /// client's new session key makes it served, and it is handed to `on_up`.
    pub fn recv(&mut self, now: UnixTime, mut on_up: impl FnMut(usize)) -> Result<(), String> {
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
                let Some((id, route, client)) = self.route_of(b) else {
                    continue;
                };
                let mut completed: Option<(mt6d_proto::handshake::SessionKeys, Stream)> = None;
                let mut served = false;
                {
                    let Some(stream) = self.table.stream(id) else {
                        continue;
                    };
                    let hk = stream.recv_header_key();
                    for d in self.bufs[b].datagrams_mut() {
                        if let Some(hk) = hk {
                            if hk.unprotect(d).is_err() {
                                self.counters.rejected += 1;
                                continue;
                            }
                        }
                        if !is_handshake(d) {
                            // Data: the echo's answer, under the new session's key.
                            let Some(session) = self.sessions[client].as_mut() else {
                                if self.up[client] {
                                    self.counters.late += 1;
                                } else {
                                    self.counters.rejected += 1;
                                }
                                continue;
                            };
                            let want = ((self.first + client) as u64).to_le_bytes();
                            match session.recv.open(&route, d, &mut self.opened) {
                                Ok(len)
                                    if is_answer(
                                        &self.opened[..len],
                                        self.spec.server_true,
                                        self.echo_port,
                                        &want,
                                    ) =>
                                {
                                    served = true;
                                }
                                _ => self.counters.rejected += 1,
                            }
                            continue;
                        }
                        let Some(hs) = self.pending[client].as_mut() else {
                            self.counters.rejected += 1;
                            continue;
                        };
                        match hs.handle(now, &route, &route, d, entropy) {
                            Ok(Outcome::Completed { keys, .. }) => {
                                let set = stream.with_route_key(&keys.route);
                                completed = Some((keys, set));
                            }
                            _ => self.counters.rejected += 1,
                        }
                    }
                }
                if let Some((keys, set_stream)) = completed {
                    self.complete(client, keys, set_stream, now)?;
                }
                if served && self.sessions[client].take().is_some() {
                    self.up[client] = true;
                    self.recovering[client] = false;
                    self.counters.served += 1;
                    on_up(client);
                }
            }
        }
    }

    /// The table entry, route and client of received buffer `b`, if it came to a current
    /// route of one from the route's remote end; counted as to a wrong route if not.
    fn route_of(&mut self, b: usize) -> Option<(PeerId, Route, usize)> {
        let (dst, port, src) = {
            let buf = &self.bufs[b];
            (buf.dst(), buf.dst_port(), buf.src())
        };
        let Some((id, epoch)) = self.table.lookup_local(dst, port) else {
            self.counters.wrong_route += 1;
            return None;
        };
        let route = self.table.index().route(id, epoch).copied()?;
        if src != route.remote {
            self.counters.wrong_route += 1;
            return None;
        }
        Some((id, route, self.slots[id.index() as usize]))
    }

    /// Client `client`'s handshake completed with `keys`: its session set joins the table
    /// (replacing any earlier one), and it sends its request under the new keys.
    fn complete(
        &mut self,
        client: usize,
        keys: mt6d_proto::handshake::SessionKeys,
        set_stream: Stream,
        now: UnixTime,
    ) -> Result<(), String> {
        // The session set, accepted on from now (its routes rotate with the rest).
        let (set, _) = self
            .table
            .add_secondary(set_stream, now, |_| 0)
            .map_err(|e| e.to_string())?;
        if self.slots.len() <= set.index() as usize {
            self.slots.resize(set.index() as usize + 1, usize::MAX);
        }
        self.slots[set.index() as usize] = client;
        if let Some(old) = self.session_sets[client].replace(set) {
            self.table.remove(old);
        }
        self.pending[client] = None;
        self.sessions[client] = Some(Box::new(Session {
            send: keys.send,
            recv: keys.recv,
            set,
            activation: keys.initiation_epoch.next().next(),
            asked_at: now,
            first_asked: now,
            backoff: 1,
        }));
        self.awaiting.push(client);
        self.counters.completed += 1;
        self.ask(client, now)?;
        if let Some(session) = self.sessions[client].as_mut() {
            session.first_asked = session.asked_at;
        }
        Ok(())
    }

    /// Client `i`'s true address.
    pub fn true_addr(&self, i: usize) -> Ipv6Addr {
        self.spec.true_addr(self.first + i)
    }
}

/// Whether `inner` (an opened tunnel packet) is the echo's answer to a request carrying
/// `token`: IPv6/UDP from the server's true address and echo port to [`CLIENT_PORT`], its
/// payload starting with the token (the echo may repeat the request). An empty `inner` is a
/// keepalive, no answer.
fn is_answer(inner: &[u8], server: Ipv6Addr, echo_port: u16, token: &[u8; TOKEN]) -> bool {
    use mt6d_proto::wire::{Ipv6Packet, UdpPacket};
    let Ok(ip) = Ipv6Packet::new_checked(inner) else {
        return false;
    };
    if ip.next_header() != 17 || ip.src_addr() != server {
        return false;
    }
    let Ok(udp) = UdpPacket::new_checked(ip.payload()) else {
        return false;
    };
    udp.src_port() == echo_port && udp.dst_port() == CLIENT_PORT && udp.payload().starts_with(token)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    const SERVER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 1, 0, 0, 0, 1);
    const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xc1, 1, 0, 0, 0, 8);

    /// An echo answer from `src`:`sport` to the client's [`CLIENT_PORT`] carrying `payload`.
    fn answer(src: Ipv6Addr, sport: u16, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; 48 + payload.len()];
        buf[48..].copy_from_slice(payload);
        let n = inner_udp_around(&mut buf, src, CLIENT, sport, CLIENT_PORT, payload.len());
        buf.truncate(n);
        buf
    }

    #[test]
    fn only_the_echo_of_the_clients_own_token_serves_it() {
        let token = 7u64.to_le_bytes();
        assert!(is_answer(
            &answer(SERVER, 3540, &token),
            SERVER,
            3540,
            &token
        ));
        // The echo may repeat the request (002's factor).
        let twice = [token, token].concat();
        assert!(is_answer(
            &answer(SERVER, 3540, &twice),
            SERVER,
            3540,
            &token
        ));
        // Another client's token, another source, another port: not this client's answer.
        let other = 8u64.to_le_bytes();
        assert!(!is_answer(
            &answer(SERVER, 3540, &other),
            SERVER,
            3540,
            &token
        ));
        let elsewhere = Ipv6Addr::new(0x2001, 0xdb8, 5, 1, 0, 0, 0, 2);
        assert!(!is_answer(
            &answer(elsewhere, 3540, &token),
            SERVER,
            3540,
            &token
        ));
        assert!(!is_answer(
            &answer(SERVER, 3541, &token),
            SERVER,
            3540,
            &token
        ));
    }

    #[test]
    fn a_keepalive_or_a_truncated_packet_is_no_answer() {
        let token = 7u64.to_le_bytes();
        // An opened keepalive is empty.
        assert!(!is_answer(&[], SERVER, 3540, &token));
        let full = answer(SERVER, 3540, &token);
        for cut in [1, 39, 40, 47, full.len() - 1] {
            assert!(
                !is_answer(&full[..cut], SERVER, 3540, &token),
                "cut at {cut}"
            );
        }
        // Not UDP.
        let mut tcp = full.clone();
        tcp[6] = 6;
        assert!(!is_answer(&tcp, SERVER, 3540, &token));
    }
}
