//! A configured stream (000 §3.1.2: "the total, end-to-end communication between two hosts"):
//! immutable after `new`, it answers which route to use when and hands out the per-direction
//! [`Sealer`] and [`Opener`]. It never reads a clock: every time-dependent answer takes `now`.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::sync::OnceLock;

use crate::addressing::{self, AddressKeys, Role};
use crate::key::{context, data_key, Subkey};
use crate::tunnel::{self, aead_key, AeadKey, HeaderKey};
use crate::{
    Endpoint, Epoch, EpochClock, Mode, Opener, PortPolicy, ProtoError, Route, Schedule, Sealer,
    StreamConfig, UnixTime,
};

/// One MT6D stream as seen from this gateway. `Send + Sync`; cheap to query.
///
/// Small while idle (a server keeps one per client, docs/ARCHITECTURE.md "Endpoint indexes"):
/// it keeps the session key, the address and port subkeys and the clock; the pre-shared data
/// keys are derived when a sealer or opener is made, and the two header-protection AES-256 key
/// schedules (about 2 KB) are expanded on the first packet and can be released again with
/// [`Stream::release_key_schedules`].
#[derive(Debug)]
pub struct Stream {
    cfg: StreamConfig,
    role: Role,
    keys: AddressKeys,
    clock: EpochClock,
    /// Header-protection keys indexed by sender role (§4.5), expanded on first use.
    header: OnceLock<Box<[HeaderKey; 2]>>,
}

const MAX_ROTATION_MS: u128 = 365 * 24 * 3600 * 1000;

impl Stream {
    /// Validates `cfg` and derives all subkeys.
    pub fn new(cfg: StreamConfig) -> Result<Stream, ProtoError> {
        for ep in [&cfg.local, &cfg.remote] {
            let a = ep.true_addr;
            if a.is_unspecified() || a.is_loopback() || a.is_multicast() {
                return Err(ProtoError::BadTrueAddress { addr: a });
            }
        }
        if cfg.local.true_addr == cfg.remote.true_addr {
            return Err(ProtoError::SameTrueAddress {
                addr: cfg.local.true_addr,
            });
        }
        let ms = cfg.rotation.as_millis();
        if ms < 1000 {
            return Err(ProtoError::RotationTooShort { ms });
        }
        if ms > MAX_ROTATION_MS {
            return Err(ProtoError::RotationTooLong { ms });
        }
        if cfg.rotation.subsec_nanos() % 1_000_000 != 0 {
            return Err(ProtoError::RotationNotMillis);
        }
        if let PortPolicy::Fixed(port) = cfg.ports {
            if port < addressing::PORT_MIN {
                return Err(ProtoError::FixedPortReserved { port });
            }
        }
        let role = Role::of(cfg.local.true_addr, cfg.remote.true_addr);
        let jitter = cfg
            .jitter
            .then(|| Subkey::derive(context::JITTER, &cfg.key));
        // ms <= MAX_ROTATION_MS, which fits u64.
        let clock = EpochClock::new(u64::try_from(ms).unwrap_or(u64::MAX), jitter);
        let keys = AddressKeys::derive(&cfg.key);
        Ok(Stream {
            cfg,
            role,
            keys,
            clock,
            header: OnceLock::new(),
        })
    }

    /// The same stream on another route set (docs/PROTOCOL.md §9.8): hashed addresses, ports,
    /// header-protection keys, route move notice key and pre-shared data keys all derived from
    /// `key` (a session's route key) exactly as from the configured key; the epoch clock, jitter
    /// included, stays the configured one, so every set of a stream shares its epoch boundaries.
    pub fn with_route_key(&self, key: &crate::SessionKey) -> Stream {
        let mut cfg = self.cfg.clone();
        cfg.key = key.clone();
        Stream {
            role: self.role,
            keys: AddressKeys::derive(&cfg.key),
            clock: self.clock.clone(),
            header: OnceLock::new(),
            cfg,
        }
    }

    /// This gateway's role.
    pub fn role(&self) -> Role {
        self.role
    }
    /// The configuration the stream was built from.
    pub fn config(&self) -> &StreamConfig {
        &self.cfg
    }
    /// The epoch clock (rotation interval and jitter).
    pub fn clock(&self) -> &EpochClock {
        &self.clock
    }
    /// The epoch containing `now`.
    pub fn epoch_at(&self, now: UnixTime) -> Epoch {
        self.clock.epoch_at(now)
    }
    /// When epoch `e` starts.
    pub fn epoch_start(&self, e: Epoch) -> UnixTime {
        self.clock.epoch_start(e)
    }

    fn endpoints(&self) -> (&Endpoint, &Endpoint) {
        match self.role {
            Role::Low => (&self.cfg.local, &self.cfg.remote),
            Role::High => (&self.cfg.remote, &self.cfg.local),
        }
    }

    /// Reads a byte of each part of the stream a route derivation reads (endpoints, address
    /// and port keys, clock) and returns them mixed, for a caller that reads a batch of
    /// streams back to back so that their cache misses overlap (`PeerTable::handle_timeout`).
    /// Only for `black_box`: the value means nothing.
    pub(crate) fn touch(&self) -> u8 {
        self.cfg.local.true_addr.octets()[0]
            ^ self.cfg.remote.true_addr.octets()[15]
            ^ self.keys.touch()
            ^ self.clock.rotation_ms() as u8
    }

    /// The route of epoch `e`.
    pub fn route(&self, e: Epoch) -> Route {
        self.route_with_attempt(e, 0)
    }

    /// The route of epoch `e` with both address searches starting at `attempt_offset` and, for an
    /// offset above 0, both hopping ports derived with it (docs/PROTOCOL.md §2.4, §2.5): how both
    /// peers leave an address taken on the link or a port taken on a host (§5.2). Both peers must
    /// use the same offset.
    pub fn route_with_attempt(&self, e: Epoch, attempt_offset: u8) -> Route {
        let (low, high) = self.endpoints();
        let [a_low, a_high] = addressing::route_addresses(
            &self.keys,
            self.cfg.derivation,
            low,
            high,
            e,
            attempt_offset,
        );
        let p_low = addressing::port(
            &self.keys,
            self.cfg.ports,
            low,
            Role::Low,
            e,
            attempt_offset,
        );
        let p_high = addressing::port(
            &self.keys,
            self.cfg.ports,
            high,
            Role::High,
            e,
            attempt_offset,
        );
        let low_sa = SocketAddrV6::new(a_low.addr, p_low, 0, 0);
        let high_sa = SocketAddrV6::new(a_high.addr, p_high, 0, 0);
        let (local, remote) = match self.role {
            Role::Low => (low_sa, high_sa),
            Role::High => (high_sa, low_sa),
        };
        Route {
            epoch: e,
            local,
            remote,
        }
    }

    /// What to send on, what to accept, and when to ask again, at `now`.
    pub fn schedule(&self, now: UnixTime) -> Schedule {
        self.schedule_with(now, |_| 0)
    }

    /// [`Stream::schedule`] with the routes of moved epochs at their agreed attempt offsets
    /// (docs/PROTOCOL.md §5.2).
    pub fn schedule_moved(&self, now: UnixTime, moves: &crate::moves::RouteMoves) -> Schedule {
        self.schedule_with(now, |e| moves.offset(e))
    }

    fn schedule_with(&self, now: UnixTime, offset: impl Fn(Epoch) -> u8) -> Schedule {
        let e = self.epoch_at(now);
        let route = |e: Epoch| self.route_with_attempt(e, offset(e));
        let send = route(e);
        Schedule {
            send,
            accept: [route(e.prev()), send, route(e.next())],
            next_change: self.epoch_start(e.next()),
        }
    }

    /// The sealer for this gateway's direction. Its counter starts at `first` and stops before
    /// `reserved_until` until [`Sealer::reserve_until`] raises the limit: the caller persists the
    /// limit before handing it over, so no restart can go below a counter already used
    /// (docs/PROTOCOL.md §4.3). Plain mode has no counter and ignores both.
    pub fn sealer(&self, first: u64, reserved_until: u64) -> Sealer {
        let sealer = Sealer::new(
            self.cfg.mode,
            self.data_key(self.role),
            first,
            reserved_until,
            self.cfg.local.true_addr,
            self.cfg.remote.true_addr,
        );
        // Building the key schedule left a copy in the frames below this one.
        crate::secrets::scrub_stack();
        sealer
    }

    /// The name under which this gateway's send counter is persisted: 16 hex digits of a one-way
    /// function of the send data key (distinct per stream direction, mode and AEAD; reveals
    /// nothing about the key). docs/PROTOCOL.md §4.3.
    pub fn counter_state_id(&self) -> String {
        let id = crate::key::counter_state_id(&self.data_subkey(self.role));
        crate::secrets::scrub_stack();
        id
    }

    /// The pre-shared data key of `sender`'s direction (docs/PROTOCOL.md §2.3). Derived per
    /// call (one BLAKE3 of about 70 bytes) rather than kept: it is needed only when a sealer or
    /// opener is made, and a server keeps a stream per idle client.
    fn data_subkey(&self, sender: Role) -> Subkey {
        let (low, high) = self.endpoints();
        let (from, to) = match sender {
            Role::Low => (low.true_addr, high.true_addr),
            Role::High => (high.true_addr, low.true_addr),
        };
        data_key(
            &self.cfg.key,
            self.cfg.aead,
            self.cfg.mode,
            sender.byte(),
            from,
            to,
        )
    }

    /// The opener for the peer's direction, with an empty replay window.
    pub fn opener(&self) -> Opener {
        let opener = Opener::new(
            self.cfg.mode,
            self.data_key(self.role.peer()),
            self.cfg.local.true_addr,
            self.cfg.remote.true_addr,
        );
        crate::secrets::scrub_stack();
        opener
    }

    pub(crate) fn data_key(&self, sender: Role) -> Option<AeadKey> {
        match self.cfg.mode {
            Mode::Plain => None,
            Mode::Auth | Mode::Encrypt => Some(aead_key(
                self.cfg.mode,
                self.cfg.aead,
                &self.data_subkey(sender),
            )),
        }
    }

    /// The key that masks the first 8 bytes of every payload this gateway sends (data, keepalives,
    /// handshake messages, route move notices; §4.5), applied after sealing or framing. None in
    /// plain mode, which is not protected.
    pub fn send_header_key(&self) -> Option<&HeaderKey> {
        self.header_key(self.role)
    }

    /// The key that unmasks every payload the peer sends, applied before classifying it. None in
    /// plain mode.
    pub fn recv_header_key(&self) -> Option<&HeaderKey> {
        self.header_key(self.role.peer())
    }

    fn header_key(&self, sender: Role) -> Option<&HeaderKey> {
        match self.cfg.mode {
            Mode::Plain => None,
            Mode::Auth | Mode::Encrypt => Some(&self.key_schedules()[sender.byte() as usize]),
        }
    }

    /// Both header-protection keys, expanded into AES-256 key schedules by the first call after
    /// [`Stream::new`] or [`Stream::release_key_schedules`].
    fn key_schedules(&self) -> &[HeaderKey; 2] {
        self.header.get_or_init(|| {
            let keys = Box::new([
                HeaderKey::derive(&self.cfg.key, Role::Low),
                HeaderKey::derive(&self.cfg.key, Role::High),
            ]);
            // Expanding the schedules left copies of the keys in the frames below this one.
            crate::secrets::scrub_stack();
            keys
        })
    }

    /// Frees the two header-protection key schedules (zeroized on drop, about 2 KB) of a stream
    /// that has gone idle; its next packet expands them again (a few hundred nanoseconds). The
    /// keys and every value on the wire are unchanged.
    pub fn release_key_schedules(&mut self) {
        self.header = OnceLock::new();
    }

    /// Tunnel mode.
    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }
    /// Bytes the tunnel adds to an inner packet on the wire, outer IPv6 + UDP included (16 or 40).
    pub fn overhead(&self) -> usize {
        tunnel::overhead(self.cfg.mode)
    }
    /// The largest inner packet that fits a path MTU of `path_mtu` bytes.
    pub fn inner_mtu(&self, path_mtu: usize) -> usize {
        path_mtu.saturating_sub(self.overhead())
    }
    /// The local protected host's address.
    pub fn local_true(&self) -> Ipv6Addr {
        self.cfg.local.true_addr
    }
    /// The remote protected host's address.
    pub fn remote_true(&self) -> Ipv6Addr {
        self.cfg.remote.true_addr
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::SessionKey;

    pub(crate) fn cfg() -> StreamConfig {
        StreamConfig::new(
            Endpoint::new("2001:db8:a::1".parse().unwrap()),
            Endpoint::new("2001:db8:b::2".parse().unwrap()),
            SessionKey::from_bytes(&[0x5a; 32]).unwrap(),
        )
    }

    #[test]
    fn validation() {
        let mut c = cfg();
        c.remote.true_addr = c.local.true_addr;
        assert!(matches!(
            Stream::new(c),
            Err(ProtoError::SameTrueAddress { .. })
        ));
        let mut c = cfg();
        c.rotation = Duration::from_millis(999);
        assert!(matches!(
            Stream::new(c),
            Err(ProtoError::RotationTooShort { ms: 999 })
        ));
        let mut c = cfg();
        c.rotation = Duration::from_micros(1_000_500);
        assert_eq!(Stream::new(c).unwrap_err(), ProtoError::RotationNotMillis);
        let mut c = cfg();
        c.ports = PortPolicy::Fixed(80);
        assert!(Stream::new(c).is_err());
        let mut c = cfg();
        c.local.true_addr = Ipv6Addr::UNSPECIFIED;
        assert!(Stream::new(c).is_err());
        let mut c = cfg();
        c.rotation = Duration::from_millis(1000);
        assert!(Stream::new(c).is_ok());
    }

    #[test]
    fn peers_mirror_each_other() {
        let c = cfg();
        let a = Stream::new(c.clone()).unwrap();
        let b = Stream::new(c.mirrored()).unwrap();
        assert_ne!(a.role(), b.role());
        for e in 0..50 {
            let ra = a.route(Epoch(e));
            let rb = b.route(Epoch(e));
            assert_eq!(ra.local, rb.remote);
            assert_eq!(ra.remote, rb.local);
        }
    }

    #[test]
    fn schedule_covers_neighbours() {
        let s = Stream::new(cfg()).unwrap();
        let now = UnixTime::from_millis(1_700_000_005_000);
        let sch = s.schedule(now);
        assert_eq!(sch.send.epoch, Epoch(170_000_000));
        assert_eq!(
            sch.accept.map(|r| r.epoch.0),
            [169_999_999, 170_000_000, 170_000_001]
        );
        assert_eq!(sch.next_change, UnixTime::from_millis(1_700_000_010_000));
        assert_eq!(s.overhead(), 40);
    }

    #[test]
    fn a_route_set_keeps_the_clock_and_changes_every_route() {
        let mut c = cfg();
        c.jitter = true;
        let link = Stream::new(c.clone()).unwrap();
        let k = SessionKey::from_bytes(&[0x77; 32]).unwrap();
        let set = link.with_route_key(&k);
        let peer = Stream::new(c.mirrored()).unwrap().with_route_key(&k);
        for e in 100..140 {
            assert_eq!(link.epoch_start(Epoch(e)), set.epoch_start(Epoch(e)));
            let (a, b) = (link.route(Epoch(e)), set.route(Epoch(e)));
            assert_ne!(a.local.ip(), b.local.ip());
            assert_ne!(a.remote.ip(), b.remote.ip());
            assert_eq!(set.route(Epoch(e)).local, peer.route(Epoch(e)).remote);
        }
        let mask = |s: &Stream| {
            let mut b = [0u8; 40];
            s.send_header_key().unwrap().protect(&mut b).unwrap();
            b
        };
        assert_ne!(mask(&link), mask(&set));
        // Built the same way as a stream configured with that key, apart from the clock.
        let mut direct = c.clone();
        direct.key = k;
        let direct = Stream::new(direct).unwrap();
        assert_eq!(direct.route(Epoch(7)), set.route(Epoch(7)));
    }

    #[test]
    fn released_key_schedules_come_back_the_same() {
        let mut s = Stream::new(cfg()).unwrap();
        let sample = [0x3c; 16];
        let before = s.send_header_key().unwrap().mask(&sample);
        let recv = s.recv_header_key().unwrap().mask(&sample);
        assert_ne!(before, recv);
        s.release_key_schedules();
        assert_eq!(s.send_header_key().unwrap().mask(&sample), before);
        assert_eq!(s.recv_header_key().unwrap().mask(&sample), recv);
        // The same keys as built directly from the session key (§4.5).
        let direct = HeaderKey::derive(&s.config().key, s.role());
        assert_eq!(direct.mask(&sample), before);
        let mut plain = cfg();
        plain.mode = Mode::Plain;
        assert!(Stream::new(plain).unwrap().send_header_key().is_none());
    }

    #[test]
    fn an_idle_stream_is_small() {
        // What a server keeps per idle client (docs/ARCHITECTURE.md, "Endpoint indexes"): no
        // expanded AES key schedule until the first packet.
        assert!(
            std::mem::size_of::<Stream>() <= 320,
            "{}",
            std::mem::size_of::<Stream>()
        );
    }

    #[test]
    fn stream_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Stream>();
        check::<Sealer>();
        fn send<T: Send>() {}
        send::<Opener>();
    }
}
