//! One simulated gateway: a driver of [`Link`] as the daemon is one (docs/ARCHITECTURE.md, "The
//! endpoint contract"). It holds what the daemon's packet threads use (the receive keys, the
//! published sending key) in the link's own holder, [`Keys`], and asks the link everything
//! else, so the simulations test the link's rules and not a copy of them.

use std::collections::HashMap;
use std::net::SocketAddrV6;
use std::sync::Arc;
use std::time::Duration;

use mt6d_proto::handshake::{is_handshake, Handshake, HandshakeConfig, HandshakeStats};
use mt6d_proto::link::{Keys, Link, Transmit, TransmitKind};
use mt6d_proto::moves::is_notice;
use mt6d_proto::route_sets::RouteSet;
use mt6d_proto::{Endpoint, OpenError, Stream, StreamConfig, UnixTime};

use super::udp_packet;

/// A datagram on the simulated wire.
#[derive(Debug, Clone)]
pub struct Packet {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    pub bytes: Vec<u8>,
    /// A handshake message (initiation or response): what a replaying attacker records.
    pub handshake: bool,
}

impl From<Transmit> for Packet {
    fn from(t: Transmit) -> Packet {
        Packet {
            src: t.src,
            dst: t.dst,
            handshake: matches!(t.kind, TransmitKind::Initiation | TransmitKind::Response),
            bytes: t.bytes,
        }
    }
}

/// One gateway of a simulation.
pub struct SimGateway {
    pub link: Link,
    /// The receive keys and the sending key as the daemon's tx thread sees it.
    pub keys: Keys,
    /// Sequence numbers of the inner packets delivered, in arrival order.
    pub delivered: Vec<u64>,
    pub drops: HashMap<&'static str, u64>,
    /// Every (key id, counter field) this side sealed, data and keepalives.
    pub nonces: Vec<(u64, u64)>,
}

impl SimGateway {
    /// A gateway with identity keys; its link stream rotates every `rotation`.
    pub fn new(cfg: HandshakeConfig, rotation: Duration) -> SimGateway {
        SimGateway::configured(cfg, |sc| sc.rotation = rotation)
    }

    /// A gateway with identity keys whose link stream's configuration `adjust` changes.
    pub fn configured(cfg: HandshakeConfig, adjust: impl FnOnce(&mut StreamConfig)) -> SimGateway {
        SimGateway::build(cfg, adjust, false)
    }

    /// A server's view of one client: a link whose handshake only answers (it never initiates),
    /// as the server role makes it (docs/ARCHITECTURE.md, "The server role").
    pub fn responder_only(cfg: HandshakeConfig, rotation: Duration) -> SimGateway {
        SimGateway::build(cfg, |sc| sc.rotation = rotation, true)
    }

    fn build(
        cfg: HandshakeConfig,
        adjust: impl FnOnce(&mut StreamConfig),
        responder_only: bool,
    ) -> SimGateway {
        let mut hs = Handshake::new(cfg.clone()).unwrap();
        if responder_only {
            hs.set_responder_only();
        }
        let mut sc = StreamConfig::new(
            Endpoint::new(cfg.local_true),
            Endpoint::new(cfg.remote_true),
            hs.link_key().clone(),
        );
        adjust(&mut sc);
        SimGateway {
            link: Link::with_handshake(Stream::new(sc).unwrap(), hs),
            keys: Keys::new(),
            delivered: Vec::new(),
            drops: HashMap::new(),
            nonces: Vec::new(),
        }
    }

    pub fn stream(&self) -> &Stream {
        self.link.stream()
    }

    pub fn hs_stats(&self) -> &HandshakeStats {
        self.link.handshake().unwrap().stats()
    }

    pub fn drop_reason(&mut self, r: &'static str) {
        *self.drops.entry(r).or_default() += 1;
    }

    /// Applies the link's events and takes its datagrams, as the daemon does after every input.
    pub fn drain(&mut self) -> Vec<Packet> {
        while self.link.poll_event(&mut self.keys).is_some() {}
        let mut out = Vec::new();
        while let Some(t) = self.link.poll_transmit() {
            if t.kind == TransmitKind::Keepalive {
                self.record_keepalive(&t);
            }
            out.push(t.into());
        }
        out
    }

    /// The keepalive's counter field, read back through its set's header key.
    fn record_keepalive(&mut self, t: &Transmit) {
        let set = self.set_by_id(t.set).unwrap();
        let mut bytes = t.bytes.clone();
        set.stream
            .send_header_key()
            .unwrap()
            .unprotect(&mut bytes)
            .unwrap();
        let key = self.keys.send().and_then(|s| s.key_id()).unwrap();
        self.nonces
            .push((key, u64::from_be_bytes(bytes[..8].try_into().unwrap())));
    }

    fn set_by_id(&self, id: u64) -> Option<Arc<RouteSet>> {
        self.link.sets().bound_sets().find(|s| s.id == id).cloned()
    }

    /// The timer fired (or the simulation just ticks): the link's timeout, then its output.
    pub fn timeout(&mut self, now: UnixTime, entropy: [u8; 32]) -> Vec<Packet> {
        self.keys.recv_mut().expire(now);
        // As the daemon's timer: the packet budget counts what the peer sent too.
        self.link
            .note_received(self.keys.recv().newest_packets_seen());
        self.link.handle_timeout(now, || Some(entropy));
        // With randomness at hand, a timeout leaves nothing due at the same instant: a driver
        // that sleeps until `poll_timeout` never spins.
        let next = self.link.poll_timeout();
        assert!(
            next.is_none_or(|t| t > now),
            "due again at once: {next:?} at {now:?}"
        );
        self.drain()
    }

    /// The protected host sends inner packet `seq`: sealed on the route of the set data goes on
    /// now, or dropped as `no_send_key` (and a handshake asked for).
    pub fn send_data(&mut self, now: UnixTime, seq: u64) -> Option<Packet> {
        let Some(sealer) = self.keys.send().cloned() else {
            self.link.handle_no_send_key();
            self.drop_reason("no_send_key");
            return None;
        };
        let set = self
            .link
            .sets()
            .send_set(self.link.stream().epoch_at(now))
            .clone();
        let route = Link::schedule_of(&set, now).send;
        let s = self.stream();
        let packet = udp_packet(s.local_true(), s.remote_true(), seq);
        let mut out = vec![0u8; packet.len() + 64];
        let header = set.stream.send_header_key();
        let n = sealer
            .seal_protected(&route, header, &packet, &mut out)
            .unwrap();
        out.truncate(n);
        // The counter field as on the wire, unmasked with the header key's mask of the sample.
        let sample = out[n - 16..].try_into().unwrap();
        let mask = header.unwrap().mask(&sample);
        let field: [u8; 8] = std::array::from_fn(|i| out[i] ^ mask[i]);
        self.nonces
            .push((sealer.key_id().unwrap(), u64::from_be_bytes(field)));
        Some(Packet {
            src: route.local,
            dst: route.remote,
            bytes: out,
            handshake: false,
        })
    }

    /// A datagram arrives: its set is the bound one whose accept routes hold its (source,
    /// destination), else it is dropped as `unknown_route`. Returns what the link sends back.
    pub fn receive(&mut self, now: UnixTime, p: &Packet, entropy: [u8; 32]) -> Vec<Packet> {
        let mut selection = self.link.select(now);
        // Most datagrams arrive on the set data goes on: look there first.
        if let Some(i) = selection
            .bound
            .iter()
            .position(|b| Arc::ptr_eq(&b.set, &selection.send))
        {
            selection.bound.swap(0, i);
        }
        let found = selection.bound.iter().find_map(|b| {
            Link::schedule_of(&b.set, now)
                .accept
                .into_iter()
                .find(|r| r.local == p.dst && r.remote == p.src)
                .map(|r| (b.clone(), r))
        });
        let Some((bound, route)) = found else {
            self.drop_reason("unknown_route");
            return Vec::new();
        };
        let set = bound.set;
        let mut bytes = p.bytes.clone();
        // Unmask with the set's header key before classifying (§4.5).
        if let Err(e) = set.stream.recv_header_key().unwrap().unprotect(&mut bytes) {
            self.drop_reason(e.reason());
            return Vec::new();
        }
        if is_notice(&bytes) {
            if self.link.handle_notice(now, &set, &route, &bytes).is_err() {
                self.drop_reason("notice_refused");
            }
            return self.drain();
        }
        if is_handshake(&bytes) {
            if let Err(e) =
                self.link
                    .handle_handshake(now, &set, &route, &bytes, self.keys.recv_mut(), || {
                        Some(entropy)
                    })
            {
                self.drop_reason(e.reason());
            }
            return self.drain();
        }
        let mut out = [0u8; 256];
        match self.keys.recv_mut().open(now, &route, &bytes, &mut out) {
            Ok(_) if !bound.data && !self.link.sets().takes_data(&set) => {
                self.drop_reason("unknown_address");
            }
            Ok(opened) => {
                set.opened(route.epoch, opened.len);
                if let Some(phase) = opened.confirmed {
                    self.link.handle_confirmed(now, phase, opened.confirmed_key);
                }
                if opened.len >= 56 {
                    self.delivered
                        .push(u64::from_be_bytes(out[48..56].try_into().unwrap()));
                }
            }
            Err(e) => {
                if e == OpenError::NoKey {
                    self.link.handle_empty_slot(now);
                }
                self.drop_reason(e.reason());
            }
        }
        self.drain()
    }
}
