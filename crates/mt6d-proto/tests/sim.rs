//! In-memory two-gateway simulator (quinn-proto `Pair` style): a virtual clock, per-peer clock skew,
//! random delay (reordering), loss and a seeded RNG. Proves that rotation itself loses no packet when
//! skew stays within half an interval, and that replayed and tampered packets are dropped and counted.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::collections::{BTreeMap, HashMap};
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::Duration;

use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Mode, OpenError, Opener, Sealer, SessionKey, Stream,
    StreamConfig, UnixTime,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

const A: &str = "2001:db8:a::1";
const B: &str = "2001:db8:b::2";

struct Peer {
    stream: Stream,
    sealer: Sealer,
    opener: Opener,
    skew_ms: i64,
    delivered: u64,
    drops: HashMap<&'static str, u64>,
}

struct Datagram {
    src: SocketAddrV6,
    dst: SocketAddrV6,
    payload: Vec<u8>,
    to_b: bool,
    inner: Vec<u8>,
}

struct Pair {
    now_ms: u64,
    a: Peer,
    b: Peer,
    rng: ChaCha8Rng,
    in_flight: BTreeMap<(u64, u64), Datagram>,
    seq: u64,
    loss: f64,
    max_delay_ms: u64,
    lost_in_network: u64,
}

fn clock(now_ms: u64, skew_ms: i64) -> UnixTime {
    UnixTime::from_millis(now_ms.saturating_add_signed(skew_ms))
}

impl Pair {
    fn new(
        seed: u64,
        cfg: StreamConfig,
        skew_a: i64,
        skew_b: i64,
        loss: f64,
        max_delay_ms: u64,
    ) -> Self {
        let now_ms = 1_700_000_000_000;
        let mk = |cfg: StreamConfig, skew| {
            let stream = Stream::new(cfg).unwrap();
            let sealer = stream.sealer(clock(now_ms, skew).as_nanos(), u64::MAX);
            let opener = stream.opener();
            Peer {
                stream,
                sealer,
                opener,
                skew_ms: skew,
                delivered: 0,
                drops: HashMap::new(),
            }
        };
        Self {
            now_ms,
            a: mk(cfg.clone(), skew_a),
            b: mk(cfg.mirrored(), skew_b),
            rng: ChaCha8Rng::seed_from_u64(seed),
            in_flight: BTreeMap::new(),
            seq: 0,
            loss,
            max_delay_ms,
            lost_in_network: 0,
        }
    }

    fn inner(src: Ipv6Addr, dst: Ipv6Addr, n: u64) -> Vec<u8> {
        let mut p = vec![0x60, 0, 0, 0, 0, 8, 59, 64];
        p.extend_from_slice(&src.octets());
        p.extend_from_slice(&dst.octets());
        p.extend_from_slice(&n.to_be_bytes());
        p
    }

    /// The sending peer seals on its current send route and puts the datagram on the wire.
    fn send(&mut self, to_b: bool) {
        let from = if to_b { &self.a } else { &self.b };
        let sched = from.stream.schedule(clock(self.now_ms, from.skew_ms));
        let inner = Self::inner(
            from.stream.local_true(),
            from.stream.remote_true(),
            self.seq,
        );
        let mut buf = [0u8; 256];
        let n = from.sealer.seal(&sched.send, &inner, &mut buf).unwrap();
        // The header is masked on the wire (§4.5; plain mode has no header key).
        if let Some(hk) = from.stream.send_header_key() {
            hk.protect(&mut buf[..n]).unwrap();
        }
        self.seq += 1;
        if self.rng.random_bool(self.loss) {
            self.lost_in_network += 1;
            return;
        }
        let at = self.now_ms + self.rng.random_range(0..=self.max_delay_ms);
        let d = Datagram {
            src: sched.send.local,
            dst: sched.send.remote,
            payload: buf[..n].to_vec(),
            to_b,
            inner,
        };
        self.in_flight.insert((at, self.seq), d);
    }

    /// Delivers a datagram: the receiver maps its outer addresses/ports to one of its accept routes.
    fn deliver(&mut self, d: &Datagram) -> Result<(), &'static str> {
        let to = if d.to_b { &mut self.b } else { &mut self.a };
        let sched = to.stream.schedule(clock(self.now_ms, to.skew_ms));
        let Some(route) = sched
            .accept
            .iter()
            .find(|r| r.remote == d.src && r.local == d.dst)
        else {
            *to.drops.entry("no_route").or_default() += 1;
            return Err("no_route");
        };
        let mut payload = d.payload.clone();
        if let Some(hk) = to.stream.recv_header_key() {
            if let Err(e) = hk.unprotect(&mut payload) {
                *to.drops.entry(e.reason()).or_default() += 1;
                return Err(e.reason());
            }
        }
        let mut out = [0u8; 256];
        match to.opener.open(route, &payload, &mut out) {
            Ok(n) => {
                assert_eq!(&out[..n], &d.inner[..]);
                to.delivered += 1;
                Ok(())
            }
            Err(e) => {
                let r = OpenError::reason(&e);
                *to.drops.entry(r).or_default() += 1;
                Err(r)
            }
        }
    }

    fn run_until(&mut self, end_ms: u64, step_ms: u64) {
        while self.now_ms < end_ms {
            self.send(true);
            self.send(false);
            self.now_ms += step_ms;
            while let Some(entry) = self.in_flight.first_entry() {
                if entry.key().0 > self.now_ms {
                    break;
                }
                let d = entry.remove();
                let _ = self.deliver(&d);
            }
        }
    }
}

fn config(mode: Mode, derivation: Derivation, rotation_ms: u64, jitter: bool) -> StreamConfig {
    let mut c = StreamConfig::new(
        Endpoint::new(A.parse().unwrap()),
        Endpoint::new(B.parse().unwrap()),
        SessionKey::from_bytes(b"sim key: 0123456789abcdef0123456789").unwrap(),
    );
    c.mode = mode;
    c.derivation = derivation;
    c.rotation = Duration::from_millis(rotation_ms);
    c.jitter = jitter;
    c.aead = AeadAlg::Aes256Gcm;
    c
}

#[test]
fn no_packet_lost_to_rotation_over_1000_rotations_with_skew() {
    const R: u64 = 1000;
    const MAX_DELAY: u64 = 40;
    const STEP: u64 = 37; // deliveries happen on step boundaries: up to STEP of extra delay.
    for (seed, mode, derivation, jitter, skew_a, skew_b) in [
        (1, Mode::Encrypt, Derivation::Keyed, true, 210, -210),
        (2, Mode::Auth, Derivation::Thesis, true, -420, 0),
        (3, Mode::Plain, Derivation::Keyed, true, 0, 420),
        // Without jitter boundaries are R apart: each peer may be off by nearly half an interval.
        (4, Mode::Encrypt, Derivation::Keyed, false, 460, -460),
    ] {
        // With jitter consecutive boundaries are more than R/2 apart (R without), so while relative
        // skew + delay stays within that, sender and receiver epochs differ by at most one and the
        // accept window e-1..e+1 covers every packet.
        let budget = if jitter { R / 2 } else { R };
        assert!(u64::try_from(i64::abs(skew_a - skew_b)).unwrap() + MAX_DELAY + STEP <= budget);
        let mut p = Pair::new(
            seed,
            config(mode, derivation, R, jitter),
            skew_a,
            skew_b,
            0.01,
            MAX_DELAY,
        );
        let start = p.now_ms;
        p.run_until(start + 1000 * R, STEP);
        let (a, b) = (&p.a, &p.b);
        assert!(
            a.drops.is_empty() && b.drops.is_empty(),
            "{mode}: {:?} {:?}",
            a.drops,
            b.drops
        );
        let sent = p.seq;
        assert_eq!(
            a.delivered + b.delivered + p.lost_in_network,
            sent,
            "{mode}"
        );
        assert!(
            p.a.stream.epoch_at(clock(p.now_ms, 0)).0 - p.a.stream.epoch_at(clock(start, 0)).0
                >= 999
        );
    }
}

#[test]
fn replayed_and_tampered_packets_are_rejected_and_counted() {
    let mut p = Pair::new(
        7,
        config(Mode::Encrypt, Derivation::Keyed, 1000, true),
        100,
        -100,
        0.0,
        30,
    );
    let start = p.now_ms;
    let mut replayed = 0;
    let mut tampered = std::collections::HashMap::new();
    for i in 0..2000u64 {
        p.send(true);
        p.now_ms += 25;
        while let Some(entry) = p.in_flight.first_entry() {
            if entry.key().0 > p.now_ms {
                break;
            }
            let d = entry.remove();
            if i % 11 == 0 {
                // Tampered before the genuine copy arrives: rejected without touching the window.
                let mut t = Datagram {
                    payload: d.payload.clone(),
                    inner: d.inner.clone(),
                    ..d
                };
                let len = t.payload.len();
                let at = p.rng.random_range(8..len);
                t.payload[at] ^= 1 << p.rng.random_range(0..8);
                let r = p.deliver(&t);
                if at < len - 16 {
                    assert_eq!(r, Err("open_bad_tag"));
                } else {
                    // A changed tag is a changed header-protection sample (§4.5): the counter
                    // unmasks to garbage, refused by the counter check, the window or the tag.
                    assert!(
                        matches!(r, Err("open_bad_tag" | "open_bad_counter" | "open_replay")),
                        "{r:?}"
                    );
                }
                *tampered.entry(r.unwrap_err()).or_insert(0u64) += 1;
            }
            assert_eq!(p.deliver(&d), Ok(()));
            if i % 7 == 0 {
                assert_eq!(p.deliver(&d), Err("open_replay"));
                replayed += 1;
            }
        }
    }
    assert!(p.now_ms - start > 40 * 1000);
    let t = |r: &str| tampered.get(r).copied().unwrap_or(0);
    assert!(t("open_bad_tag") > 100, "{tampered:?}");
    assert_eq!(
        p.b.drops.get("open_replay").copied(),
        Some(replayed + t("open_replay"))
    );
    assert_eq!(
        p.b.drops.get("open_bad_tag").copied(),
        Some(t("open_bad_tag"))
    );
    assert_eq!(
        p.b.drops.get("open_bad_counter").copied().unwrap_or(0),
        t("open_bad_counter")
    );
    assert!(!p.b.drops.contains_key("no_route"));
}
