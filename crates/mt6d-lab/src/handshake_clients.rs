//! Many clients handshaking with a server role daemon from one process (to measure:
//! "handshakes per second the server completes, and how long 100,000 clients take to come up
//! from cold"). Each client has its own identity key (derived from its index: a lab key), its
//! link set's hashed addresses and ports in the client namespace's /64 (local there through one
//! AnyIP route and one tproxy rule, [`super::clients::ClientSet::install`]), and plays the
//! initiator of docs/PROTOCOL.md §9.3 with the protocol crate's `Handshake`: an initiation on
//! its link set, the response opened, and the keepalive that lets the server confirm the keys.
//! A client is **up** once its handshake completed and the keepalive left.
//!
//! Only the handshake is played: what a client does after (data on its session set) is the
//! business of [`super::clients::ClientSet`] and of real clients (`tests/server_handshake_netns.rs`).

use std::net::Ipv6Addr;
use std::time::Duration;

use mt6d_os::raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
use mt6d_os::udp::RecvBuf;
use mt6d_os::{RecvScratch, UdpSocket6};
use mt6d_proto::endpoint::{PeerId, PeerTable};
use mt6d_proto::handshake::{
    is_handshake, link_key, Handshake, HandshakeConfig, Outcome, PrivateKey, Psk, PublicKey,
};
use mt6d_proto::tunnel::KEEPALIVE_LEN;
use mt6d_proto::{AeadAlg, Derivation, Endpoint, PortPolicy, Stream, StreamConfig, UnixTime};

use super::clients::ClientSpec;

/// What the handshaking side counted.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HandshakeCounters {
    /// Initiations sent (first tries and retries).
    pub initiations: u64,
    /// Handshakes completed (response opened, keepalive sent).
    pub completed: u64,
    /// Datagrams to no client's current route, or from a wrong source.
    pub wrong_route: u64,
    /// Messages refused by a client's handshake, and datagrams that were no handshake message.
    pub rejected: u64,
}

/// The clients, their link sets and handshakes, and the two sockets they share.
pub struct HandshakeClients {
    spec: ClientSpec,
    server_public: PublicKey,
    table: PeerTable,
    /// Table slot -> client.
    slots: Vec<usize>,
    ids: Vec<PeerId>,
    privates: Vec<PrivateKey>,
    /// The handshake of each client with one under way.
    pending: Vec<Option<Box<Handshake>>>,
    up: Vec<bool>,
    /// The client lost its session ([`HandshakeClients::lose_session`]): its next handshake is a
    /// recovery one (docs/PROTOCOL.md §9.9).
    recovering: Vec<bool>,
    socket: UdpSocket6,
    raw: RawUdp6,
    raw_scratch: RawSendScratch,
    recv_scratch: RecvScratch,
    bufs: Vec<RecvBuf>,
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
    /// `count` clients of `spec` at `now` towards the server with identity `server_public`,
    /// receiving on `port` (in the calling thread's namespace). Each client's link key is one
    /// X25519, computed on every CPU.
    pub fn new(
        spec: &ClientSpec,
        server_public: PublicKey,
        count: usize,
        port: u16,
        now: UnixTime,
    ) -> Result<HandshakeClients, String> {
        let privates: Vec<PrivateKey> = (0..count).map(|i| identity(spec, i)).collect();
        let links = mt6d::keys::par_map(&privates, |p| {
            link_key(p, &server_public, &Psk::none()).map_err(|e| e.to_string())
        });
        let streams = links.into_iter().enumerate().map(|(i, key)| {
            let key = key?;
            Stream::new(StreamConfig {
                local: Endpoint {
                    true_addr: spec.true_addr(i),
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
        Ok(HandshakeClients {
            spec: spec.clone(),
            server_public,
            table,
            slots,
            ids,
            privates,
            pending: (0..count).map(|_| None).collect(),
            up: vec![false; count],
            recovering: vec![false; count],
            socket,
            raw: RawUdp6::open().map_err(|e| e.to_string())?,
            raw_scratch: RawSendScratch::new(1),
            recv_scratch: RecvScratch::new(32),
            bufs: (0..32).map(|_| RecvBuf::new()).collect(),
            counters: HandshakeCounters::default(),
        })
    }

    pub fn len(&self) -> usize {
        self.ids.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Whether client `i` completed its handshake.
    pub fn is_up(&self, i: usize) -> bool {
        self.up[i]
    }

    /// Client `i`'s server lost its session (a restart) and the client noticed, by its liveness
    /// rule (docs/PROTOCOL.md §9.9): it is down again, and its next handshake is a recovery one
    /// (on its link set, retries at most 2 s apart plus jitter), as a real client's would be.
    pub fn lose_session(&mut self, i: usize) {
        self.up[i] = false;
        self.pending[i] = None;
        self.recovering[i] = true;
    }

    /// Advances the clients whose boundary passed.
    pub fn step(&mut self, now: UnixTime) {
        self.table.handle_timeout(now, |_, _| 0, |_, _| {});
    }

    /// Sends client `i`'s initiation if one is due (its first, or a retry after the
    /// handshake's backoff: 1 s, 2 s, then 4 s). Returns whether one left.
    pub fn initiate(&mut self, i: usize, now: UnixTime) -> Result<bool, String> {
        if self.up[i] {
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
                local_true: self.spec.true_addr(i),
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
        self.send(route.local, route.remote, &init);
        self.counters.initiations += 1;
        Ok(true)
    }

    fn send(&mut self, src: std::net::SocketAddrV6, dst: std::net::SocketAddrV6, payload: &[u8]) {
        let msg = [RawSendMsg { src, dst, payload }];
        let _ = self.raw.send_batch(&mut self.raw_scratch, &msg);
    }

    /// Takes the responses queued now (none if nothing waits): each completes its client's
    /// handshake, which then sends its keepalive and is handed to `on_up`.
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
                let (dst, port, src) = {
                    let buf = &self.bufs[b];
                    (buf.dst(), buf.dst_port(), buf.src())
                };
                let Some((id, epoch)) = self.table.lookup_local(dst, port) else {
                    self.counters.wrong_route += 1;
                    continue;
                };
                let Some(route) = self.table.index().route(id, epoch).copied() else {
                    continue;
                };
                if src != route.remote {
                    self.counters.wrong_route += 1;
                    continue;
                }
                let client = self.slots[id.index() as usize];
                let mut keepalive: Option<([u8; KEEPALIVE_LEN], usize)> = None;
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
                        let (true, Some(hs)) = (is_handshake(d), self.pending[client].as_mut())
                        else {
                            self.counters.rejected += 1;
                            continue;
                        };
                        match hs.handle(now, &route, &route, d, entropy) {
                            Ok(Outcome::Completed { keys, .. }) => {
                                let mut ka = [0u8; KEEPALIVE_LEN];
                                let n = keys
                                    .send
                                    .seal_keepalive(&route, &mut ka)
                                    .map_err(|e| e.to_string())?;
                                if let Some(hk) = stream.send_header_key() {
                                    hk.protect(&mut ka[..n]).map_err(|e| e.to_string())?;
                                }
                                keepalive = Some((ka, n));
                            }
                            _ => self.counters.rejected += 1,
                        }
                    }
                }
                if let Some((ka, n)) = keepalive {
                    self.send(route.local, route.remote, &ka[..n]);
                    self.pending[client] = None;
                    self.up[client] = true;
                    self.recovering[client] = false;
                    self.counters.completed += 1;
                    on_up(client);
                }
            }
        }
    }

    /// Client `i`'s true address.
    pub fn true_addr(&self, i: usize) -> Ipv6Addr {
        self.spec.true_addr(i)
    }
}
