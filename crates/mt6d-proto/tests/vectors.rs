//! Frozen test vectors, also printed in docs/PROTOCOL.md §8. A change here is a wire-format change.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::net::Ipv6Addr;

use mt6d_proto::addressing::{
    hashed_address, is_reserved_iid, port, route_addresses, thesis_iid, AddressKeys, Role,
};
use std::time::Duration;

use mt6d_proto::handshake::{Handshake, HandshakeConfig, Outcome, PrivateKey, Psk, ReceiveKeys};
use mt6d_proto::moves::RouteMoves;
use mt6d_proto::route_sets::{RouteSet, SetState};
use mt6d_proto::tunnel::header::key_bytes;
use mt6d_proto::tunnel::HeaderKey;
use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Epoch, KeyPhase, Mode, PortPolicy, SessionKey, Stream,
    StreamConfig, UnixTime,
};
use std::sync::Arc;

fn key() -> SessionKey {
    SessionKey::from_bytes(&(0u8..32).collect::<Vec<_>>()).unwrap()
}
fn low() -> Endpoint {
    Endpoint::new("2001:db8:a::1".parse().unwrap())
}
fn high() -> Endpoint {
    Endpoint::new("2001:db8:b::2".parse().unwrap())
}
const EPOCH: Epoch = Epoch(170_000_000);
/// A pre-shared sealer's first counter after one reserved block (docs/PROTOCOL.md §4.3).
const COUNTER_START: u64 = 1 << 26;

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

#[test]
#[ignore = "prints the vectors; run with --ignored --nocapture to regenerate"]
fn print_vectors() {
    let k = AddressKeys::derive(&key());
    for d in [Derivation::Keyed, Derivation::Thesis] {
        for (ep, role) in [(low(), Role::Low), (high(), Role::High)] {
            let h = hashed_address(&k, d, &ep, role, EPOCH, 0);
            println!("{d} {role:?} addr {} attempt {}", h.addr, h.attempt);
        }
    }
    for (ep, role) in [(low(), Role::Low), (high(), Role::High)] {
        println!(
            "port {role:?} {}",
            port(&k, PortPolicy::Hopping, &ep, role, EPOCH, 0)
        );
        println!(
            "port {role:?} offset 1 {}",
            port(&k, PortPolicy::Hopping, &ep, role, EPOCH, 1)
        );
    }
    let moved = Stream::new(StreamConfig::new(low(), high(), key()))
        .unwrap()
        .route_with_attempt(EPOCH, 1);
    println!("route at offset 1: {} -> {}", moved.local, moved.remote);
    let mac = [0x00, 0xab, 0xcd, 0x11, 0x22, 0x01];
    println!(
        "thesis mac {}",
        hex(&thesis_iid(low().true_addr, &key(), EPOCH.0, Some(mac), 0))
    );
    println!(
        "thesis attempt1 {}",
        hex(&thesis_iid(low().true_addr, &key(), EPOCH.0, None, 1))
    );
    let mut c = StreamConfig::new(low(), high(), key());
    c.jitter = true;
    let s = Stream::new(c.clone()).unwrap();
    for e in [EPOCH.0, EPOCH.0 + 1] {
        println!(
            "jitter {e} {} start {}",
            s.clock().jitter_ms(e),
            s.epoch_start(Epoch(e)).as_millis()
        );
    }
    println!("header keys and mask {:?}", header_vectors());
    println!("notice {}", notice_vector());
    println!("announcement {}", link_announcement_vector());
    for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
        for mode in [Mode::Encrypt, Mode::Auth] {
            let (out, n) = seal_vector(mode, alg);
            println!("{mode} {alg} {}", hex(&out[..n]));
            let mut c = StreamConfig::new(low(), high(), key());
            c.mode = mode;
            c.aead = alg;
            let s = Stream::new(c).unwrap();
            println!("{mode} {alg} counter state id {}", s.counter_state_id());
        }
    }
}

fn inner_packet() -> Vec<u8> {
    // IPv6, next header 59 (no next header), hop limit 64, 4 payload bytes "mt6d".
    let mut p = vec![0x60, 0, 0, 0, 0, 4, 59, 64];
    p.extend_from_slice(&"2001:db8:a::1".parse::<Ipv6Addr>().unwrap().octets());
    p.extend_from_slice(&"2001:db8:b::2".parse::<Ipv6Addr>().unwrap().octets());
    p.extend_from_slice(b"mt6d");
    p
}

fn seal_vector(mode: Mode, alg: AeadAlg) -> ([u8; 128], usize) {
    let mut c = StreamConfig::new(low(), high(), key());
    c.mode = mode;
    c.aead = alg;
    let s = Stream::new(c).unwrap();
    let sealer = s.sealer(COUNTER_START, u64::MAX);
    let mut out = [0u8; 128];
    let n = sealer
        .seal(&s.route(EPOCH), &inner_packet(), &mut out)
        .unwrap();
    // On the wire the first 8 bytes are masked (§4.5); plain mode has no header key.
    if let Some(hk) = s.send_header_key() {
        hk.protect(&mut out[..n]).unwrap();
    }
    (out, n)
}

/// The header-protection keys of both roles, and the mask of sample `000102..0f` under role 0's.
fn header_vectors() -> (String, String, String) {
    let k = key();
    let (k0, k1) = (key_bytes(&k, Role::Low), key_bytes(&k, Role::High));
    let sample: [u8; 16] = core::array::from_fn(|i| i as u8);
    let mask = HeaderKey::from_bytes(&k0).mask(&sample);
    (hex(&*k0), hex(&*k1), hex(&mask))
}

/// Role 0's route move notice for epoch e, offset 1, on its route of epoch e, protected.
fn notice_vector() -> String {
    let mut c = StreamConfig::new(low(), high(), key());
    c.mode = Mode::Encrypt;
    let s = Stream::new(c).unwrap();
    let mut n = RouteMoves::new(&s).frame_notice(&s.route(EPOCH), EPOCH, 1, false);
    s.send_header_key().unwrap().protect(&mut n).unwrap();
    hex(&n)
}

#[test]
fn keyed_addresses_and_ports() {
    let k = AddressKeys::derive(&key());
    let a = hashed_address(&k, Derivation::Keyed, &low(), Role::Low, EPOCH, 0);
    let b = hashed_address(&k, Derivation::Keyed, &high(), Role::High, EPOCH, 0);
    assert_eq!(
        a.addr,
        "2001:db8:a:0:7254:c650:f3a5:d874"
            .parse::<Ipv6Addr>()
            .unwrap()
    );
    assert_eq!(
        b.addr,
        "2001:db8:b:0:e7f9:b0dc:441b:86e9"
            .parse::<Ipv6Addr>()
            .unwrap()
    );
    assert_eq!(
        port(&k, PortPolicy::Hopping, &low(), Role::Low, EPOCH, 0),
        40199
    );
    assert_eq!(
        port(&k, PortPolicy::Hopping, &high(), Role::High, EPOCH, 0),
        22970
    );
}

/// A moved epoch (attempt offset 1, docs/PROTOCOL.md §2.5, §5.2): both addresses and both ports
/// change; offset 0 keeps the ports above.
#[test]
fn moved_epoch_addresses_and_ports() {
    let k = AddressKeys::derive(&key());
    assert_eq!(
        port(&k, PortPolicy::Hopping, &low(), Role::Low, EPOCH, 1),
        37090
    );
    assert_eq!(
        port(&k, PortPolicy::Hopping, &high(), Role::High, EPOCH, 1),
        53308
    );
    let moved = Stream::new(StreamConfig::new(low(), high(), key()))
        .unwrap()
        .route_with_attempt(EPOCH, 1);
    assert_eq!(
        moved.local.to_string(),
        "[2001:db8:a:0:e4f:b44a:6354:cea5]:37090"
    );
    assert_eq!(
        moved.remote.to_string(),
        "[2001:db8:b:0:ac72:54a5:3d6:1ea]:53308"
    );
}

/// Cross-checked independently: `printf '%s' 0000000000000001<key hex>000000000a21fe80 | xxd -r -p |
/// sha256sum` starts with 0731459642e1d7e5 (docs/PROTOCOL.md §8).
#[test]
fn thesis_addresses_match_sha256sum() {
    let k = AddressKeys::derive(&key());
    let a = hashed_address(&k, Derivation::Thesis, &low(), Role::Low, EPOCH, 0);
    let b = hashed_address(&k, Derivation::Thesis, &high(), Role::High, EPOCH, 0);
    assert_eq!(
        a.addr,
        "2001:db8:a:0:731:4596:42e1:d7e5"
            .parse::<Ipv6Addr>()
            .unwrap()
    );
    assert_eq!(
        b.addr,
        "2001:db8:b:0:b172:9a0:b04a:7f4e"
            .parse::<Ipv6Addr>()
            .unwrap()
    );
    let mac = [0x00, 0xab, 0xcd, 0x11, 0x22, 0x01];
    assert_eq!(
        hex(&thesis_iid(low().true_addr, &key(), EPOCH.0, Some(mac), 0)),
        "1553311c39bcc056"
    );
    assert_eq!(
        hex(&thesis_iid(low().true_addr, &key(), EPOCH.0, None, 1)),
        "ee407e9869fa86b8"
    );
}

#[test]
fn jitter_schedule() {
    let mut c = StreamConfig::new(low(), high(), key());
    c.jitter = true;
    let s = Stream::new(c).unwrap();
    assert_eq!(s.clock().jitter_ms(EPOCH.0), 2201);
    assert_eq!(
        s.epoch_start(EPOCH),
        UnixTime::from_millis(1_700_000_002_201)
    );
    assert_eq!(
        s.epoch_start(Epoch(EPOCH.0 + 1)),
        UnixTime::from_millis(1_700_000_011_755)
    );
    assert_eq!(
        s.epoch_at(UnixTime::from_millis(1_700_000_002_200)),
        Epoch(EPOCH.0 - 1)
    );
    assert_eq!(s.epoch_at(UnixTime::from_millis(1_700_000_002_201)), EPOCH);
}

/// Cross-checked independently with python3 and the `blake3` and `cryptography` (OpenSSL AES)
/// packages (docs/PROTOCOL.md §8).
#[test]
fn header_protection_keys_mask_and_notice() {
    let (k0, k1, mask) = header_vectors();
    assert_eq!(
        k0,
        "4e17734d5839b990c3cc966867397695f797de49b77c0ece18de9fc8aefd8c7e"
    );
    assert_eq!(
        k1,
        "131ac4117cdf07e181429d89bc72ad93b6208f67b59b4a329a86a7e9a0b4c3f6"
    );
    assert_eq!(mask, "f5f93a299db279a3");
    assert_eq!(
        notice_vector(),
        "4602b406440259070a21fe8001000000ed20ed8c17b48fb24d70a3a467aa6833"
    );
}

/// The sealed payloads as they leave the gateway: AEAD output unchanged from byte 8 on, the
/// counter `0000000004000000` masked (§4.5). Cross-checked as above.
#[test]
fn sealed_payloads() {
    let cases = [
        (
            Mode::Encrypt,
            AeadAlg::Aes256Gcm,
            "f9383c2bae04d97e0579d90f0586f65c41623dd498e91d6e956c9087334f32da563ae2d2",
        ),
        (
            Mode::Auth,
            AeadAlg::Aes256Gcm,
            "fc27a1f3f1ca6ff76000000000043b406d7436649c57d10fe31fbeac2626ab38d94a8dae",
        ),
        (
            Mode::Encrypt,
            AeadAlg::ChaCha20Poly1305,
            "b3ace1076eff439b96dc205be5f2c5a45d0b710bc69db1c4a8fb6ba4fcea9aba441538c0",
        ),
        (
            Mode::Auth,
            AeadAlg::ChaCha20Poly1305,
            "23dad892b76532536000000000043b406d743664cc4c65fd6dd05a2692780473b8fdbed5",
        ),
    ];
    for (mode, alg, want) in cases {
        let (out, n) = seal_vector(mode, alg);
        assert_eq!(hex(&out[..n]), want, "{mode} {alg}");
    }
    let (out, n) = seal_vector(Mode::Plain, AeadAlg::Aes256Gcm);
    assert_eq!(hex(&out[..n]), "6000000000043b406d743664");
}

/// The counter state file names of §4.3 (role 0's direction).
#[test]
fn counter_state_ids() {
    for (mode, alg, want) in [
        (Mode::Encrypt, AeadAlg::Aes256Gcm, "e641bddfb55f5640"),
        (Mode::Auth, AeadAlg::Aes256Gcm, "125344a79dd4867e"),
        (Mode::Encrypt, AeadAlg::ChaCha20Poly1305, "0b7733f6b44f3f5e"),
        (Mode::Auth, AeadAlg::ChaCha20Poly1305, "26aa7d5379103700"),
    ] {
        let mut c = StreamConfig::new(low(), high(), key());
        c.mode = mode;
        c.aead = alg;
        assert_eq!(Stream::new(c).unwrap().counter_state_id(), want);
    }
}

// ---- Derivation rules a second implementation must follow exactly (docs/PROTOCOL.md §2.2-§2.5) ----

/// Keyed IID candidates of attempts 0, 1, 2 (the attempt byte is always appended, §2.2): the
/// values the reserved-IID skip and the role-1 tie-break of §2.4 move to.
fn keyed_candidates() -> Vec<String> {
    let k = AddressKeys::derive(&key());
    let mut v = Vec::new();
    for (ep, role) in [(low(), Role::Low), (high(), Role::High)] {
        for attempt in 0..3 {
            // No candidate here is reserved, so the search from offset `attempt` stops at it.
            let h = hashed_address(&k, Derivation::Keyed, &ep, role, EPOCH, attempt);
            assert_eq!(h.attempt, attempt);
            v.push(hex(&h.addr.octets()[8..]));
        }
    }
    v
}

#[test]
fn keyed_iid_candidates_per_attempt() {
    assert_eq!(
        keyed_candidates(),
        [
            "7254c650f3a5d874",
            "0e4fb44a6354cea5",
            "49a8161fdb9c4c8c",
            "e7f9b0dc441b86e9",
            "ac7254a503d601ea",
            "96549de6fdec42ee",
        ]
    );
}

/// The reserved ranges of §2.4 at their bounds (inclusive).
#[test]
fn reserved_iid_bounds() {
    for (v, reserved) in [
        (0u64, true),
        (1, false),
        (0x0200_5EFF_FDFF_FFFF, false),
        (0x0200_5EFF_FE00_0000, true),
        (0x0200_5EFF_FEFF_FFFF, true),
        (0x0200_5EFF_FF00_0000, false),
        (0xFDFF_FFFF_FFFF_FF7F, false),
        (0xFDFF_FFFF_FFFF_FF80, true),
        (0xFDFF_FFFF_FFFF_FFFF, true),
    ] {
        assert_eq!(is_reserved_iid(v.to_be_bytes()), reserved, "{v:016x}");
    }
}

/// Thesis mode has no role input, so two endpoints with the same true IID and the same external
/// /64 derive the same address: role 1 takes its next attempt (§2.4, the tie-break compares whole
/// addresses). Without the shared /64 the IIDs are still equal but the addresses differ: no tie.
fn tie_break_route(shared_prefix: bool) -> [(Ipv6Addr, u8); 2] {
    let k = AddressKeys::derive(&key());
    let mut a = Endpoint::new("2001:db8:a::5".parse().unwrap());
    let mut b = Endpoint::new("2001:db8:b::5".parse().unwrap());
    if shared_prefix {
        a.external_prefix = Some("2001:db8:ff::".parse().unwrap());
        b.external_prefix = a.external_prefix;
    }
    let [x, y] = route_addresses(&k, Derivation::Thesis, &a, &b, EPOCH, 0);
    [(x.addr, x.attempt), (y.addr, y.attempt)]
}

#[test]
fn role_1_tie_break() {
    let ip = |s: &str| s.parse::<Ipv6Addr>().unwrap();
    assert_eq!(
        tie_break_route(true),
        [
            (ip("2001:db8:ff:0:cc4:97a:96eb:b801"), 0),
            (ip("2001:db8:ff:0:d196:d414:101a:51eb"), 1)
        ]
    );
    assert_eq!(
        tie_break_route(false),
        [
            (ip("2001:db8:a:0:cc4:97a:96eb:b801"), 0),
            (ip("2001:db8:b:0:cc4:97a:96eb:b801"), 0)
        ]
    );
}

/// Role 0's route of epoch e at attempt offsets 1..=4 (§2.4, §2.5, §5.2).
fn offset_routes() -> Vec<String> {
    let s = Stream::new(StreamConfig::new(low(), high(), key())).unwrap();
    (1..=4)
        .map(|k| {
            let r = s.route_with_attempt(EPOCH, k);
            format!("{} -> {}", r.local, r.remote)
        })
        .collect()
}

#[test]
fn attempt_offsets() {
    assert_eq!(
        offset_routes(),
        [
            "[2001:db8:a:0:e4f:b44a:6354:cea5]:37090 -> [2001:db8:b:0:ac72:54a5:3d6:1ea]:53308",
            "[2001:db8:a:0:49a8:161f:db9c:4c8c]:8150 -> [2001:db8:b:0:9654:9de6:fdec:42ee]:57518",
            "[2001:db8:a:0:f35c:29df:6045:a3f4]:65021 -> [2001:db8:b:0:37ef:b3f0:f72b:aab8]:47909",
            "[2001:db8:a:0:90a8:4686:b09:57ec]:2503 -> [2001:db8:b:0:4a11:21b5:a41b:2af2]:28625",
        ]
    );
}

#[test]
#[ignore = "prints the derivation-rule vectors; run with --ignored --nocapture to regenerate"]
fn print_rule_vectors() {
    println!("candidates {:?}", keyed_candidates());
    println!("tie {:?}", tie_break_route(true));
    println!("notie {:?}", tie_break_route(false));
    println!("offsets {:#?}", offset_routes());
}

// ---- Identity keys and the handshake (docs/PROTOCOL.md §9) ----

/// Identity private keys of the two gateways: role 0 (`2001:db8:a::1`) `40..5f`, role 1
/// (`2001:db8:b::2`) `60..7f`; no pre-shared key.
fn identity(role: Role) -> PrivateKey {
    let base = match role {
        Role::Low => 0x40u8,
        Role::High => 0x60,
    };
    PrivateKey::from_bytes(core::array::from_fn(|i| base + i as u8))
}

fn handshake(role: Role) -> Handshake {
    let (local, remote, peer) = match role {
        Role::Low => (low(), high(), Role::High),
        Role::High => (high(), low(), Role::Low),
    };
    Handshake::new(HandshakeConfig {
        local_private: identity(role),
        remote_public: identity(peer).public_key(),
        psk: Psk::none(),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: local.true_addr,
        remote_true: remote.true_addr,
        rekey_after: Duration::from_secs(120),
        rekey_after_packets: 1 << 40,
    })
    .unwrap()
}

/// The stream of `role` over the link key (§9.1), encrypt mode.
fn link_stream(role: Role, link: &SessionKey) -> Stream {
    let (local, remote) = match role {
        Role::Low => (low(), high()),
        Role::High => (high(), low()),
    };
    let mut c = StreamConfig::new(local, remote, link.clone());
    c.mode = Mode::Encrypt;
    Stream::new(c).unwrap()
}

/// One whole exchange with fixed entropy: role 0 initiates at the start of epoch e (no jitter),
/// role 1 answers, role 0 completes and sends its keepalive (phase 0, packet 0), role 1 confirms
/// it and sends a keepalive of its own; then role 0 rekeys 1 s later (new entropy) and the
/// keepalive of the second key carries phase 1. Every payload as it leaves (header-protected)
/// and, for the handshake messages, unprotected too.
#[derive(Debug)]
struct Transcript {
    link: String,
    public: [String; 2],
    initiation: String,
    initiation_wire: String,
    response: String,
    response_wire: String,
    keepalive_i: String,
    keepalive_r: String,
    rekey_keepalive_i: String,
    /// The first handshake's session route key K(X) (§9.8), the same on both sides.
    route_key: String,
    /// Its session set's activation epoch a(X) = e_init + 2 (§9.8).
    activation: Epoch,
    /// Role 0's route of the session set at a(X), keyed derivation (the transcript's), local ->
    /// remote; role 1's is its mirror.
    session_route_keyed: String,
    /// The same with `derivation = "thesis"` (§2.1 with K(X) as the session key): the link key,
    /// the handshake and K(X) do not depend on the derivation; the ports do not either.
    session_route_thesis: String,
    /// The session set's handshake MAC key (§9.3) and role 0's header-protection key (§4.5).
    session_mac_key: String,
    session_hp0: String,
}

fn transcript() -> Transcript {
    let (mut a, mut b) = (handshake(Role::Low), handshake(Role::High));
    let link = a.link_key().clone();
    assert_eq!(hex(link.as_bytes()), hex(b.link_key().as_bytes()));
    let (sa, sb) = (
        link_stream(Role::Low, &link),
        link_stream(Role::High, &link),
    );
    let (ra, rb) = (sa.route(EPOCH), sb.route(EPOCH));
    let t0 = sa.epoch_start(EPOCH);
    let protect = |s: &Stream, bytes: &[u8]| {
        let mut w = bytes.to_vec();
        s.send_header_key().unwrap().protect(&mut w).unwrap();
        hex(&w)
    };

    let init = a.poll(t0, &ra, 0, || Some([0xe0; 32])).unwrap();
    let Outcome::Responded { reply, keys: kb } =
        b.handle(t0, &rb, &rb, &init, || Some([0xe1; 32])).unwrap()
    else {
        panic!("role 1 must answer");
    };
    let Outcome::Completed { keys: ka, .. } = a.handle(t0, &ra, &ra, &reply, || None).unwrap()
    else {
        panic!("role 0 must complete");
    };
    let mut buf = [0u8; 64];
    let n = ka.send.seal_keepalive(&ra, &mut buf).unwrap();
    let keepalive_i = protect(&sa, &buf[..n]);
    // Role 1 opens it under its new receive key and confirms; its send key is then usable.
    let mut recv_b = ReceiveKeys::new();
    recv_b.install(kb.recv, false, t0);
    let w = buf[..n].to_vec();
    let opened = recv_b.open(t0, &rb, &w, &mut [0u8; 64]).unwrap();
    assert_eq!(opened.len, 0);
    assert_eq!(opened.confirmed, Some(KeyPhase::Zero));
    assert!(b.confirm(t0, KeyPhase::Zero));
    let n = kb.send.seal_keepalive(&rb, &mut buf).unwrap();
    let keepalive_r = protect(&sb, &buf[..n]);

    let t1 = UnixTime::from_millis(t0.as_millis() + 1000);
    a.want_handshake();
    let init2 = a.poll(t1, &ra, 1, || Some([0xe2; 32])).unwrap();
    let Outcome::Responded { reply: reply2, .. } =
        b.handle(t1, &rb, &rb, &init2, || Some([0xe3; 32])).unwrap()
    else {
        panic!("role 1 must answer the rekey");
    };
    let Outcome::Completed { keys: ka2, .. } = a.handle(t1, &ra, &ra, &reply2, || None).unwrap()
    else {
        panic!("role 0 must complete the rekey");
    };
    let n = ka2.send.seal_keepalive(&ra, &mut buf).unwrap();
    let rekey_keepalive_i = protect(&sa, &buf[..n]);

    // The first handshake's session set, made as the link makes it (§9.8): both sides derive
    // one route key, and the initiation's epoch (e: it travelled on the link set's route of e)
    // sets the activation. Each side's set is its link stream with the route key.
    assert_eq!(hex(ka.route.as_bytes()), hex(kb.route.as_bytes()));
    assert_eq!((ka.initiation_epoch, kb.initiation_epoch), (EPOCH, EPOCH));
    let session_set = |base: &Stream| {
        let mut sets = SetState::new(Arc::new(RouteSet::link(base)));
        let parent = sets.link().clone();
        sets.completed(base, &ka.route, ka.initiation_epoch, parent, EPOCH)
    };
    let set_a = session_set(&sa);
    let activation = set_a.activation;
    let r = set_a.stream.route(activation);
    let rb = sb.with_route_key(&kb.route).route(activation);
    assert_eq!(
        (rb.local, rb.remote),
        (r.remote, r.local),
        "role 1 mirrors role 0"
    );
    let mut thesis = sa.config().clone();
    thesis.derivation = Derivation::Thesis;
    let set_t = session_set(&Stream::new(thesis).unwrap());
    assert_eq!(set_t.activation, activation);
    let rt = set_t.stream.route(activation);
    let session_hp0 = key_bytes(&ka.route, Role::Low);
    // The set's own header key (§4.5) is the one derived from K(X): the mask of a zeroed
    // keepalive-sized payload is the mask of sample 00..00 under hpKey(K(X), role 0).
    let mut masked = [0u8; 24];
    set_a
        .stream
        .send_header_key()
        .unwrap()
        .protect(&mut masked)
        .unwrap();
    assert_eq!(
        masked[..8],
        HeaderKey::from_bytes(&session_hp0).mask(&[0u8; 16])[..]
    );

    Transcript {
        link: hex(link.as_bytes()),
        public: [
            hex(identity(Role::Low).public_key().as_bytes()),
            hex(identity(Role::High).public_key().as_bytes()),
        ],
        initiation: hex(&init),
        initiation_wire: protect(&sa, &init),
        response: hex(&reply),
        response_wire: protect(&sb, &reply),
        keepalive_i,
        keepalive_r,
        rekey_keepalive_i,
        route_key: hex(ka.route.as_bytes()),
        activation,
        session_route_keyed: format!("{} -> {}", r.local, r.remote),
        session_route_thesis: format!("{} -> {}", rt.local, rt.remote),
        session_mac_key: hex(&blake3::derive_key(
            "mt6d-proto 2026-11-21 handshake mac key",
            ka.route.as_bytes(),
        )),
        session_hp0: hex(&*session_hp0),
    }
}

#[test]
#[ignore = "prints the handshake transcript; run with --ignored --nocapture to regenerate"]
fn print_transcript() {
    println!("{:#?}", transcript());
}

/// Link key, one Noise exchange with fixed ephemeral keys (mac included), the keepalives of the
/// first key (phase 0) and of the rekey (phase 1). Cross-checked independently by
/// `scripts/check-vectors.py` (python3, `blake3`, `cryptography`, a Noise written from its
/// specification), which also derives the data keys these keepalives are sealed under.
#[test]
fn handshake_transcript() {
    let t = transcript();
    assert_eq!(
        t.link,
        "bb99ba206ad441e09e3f4f10f48e2097fdbbd40f53c7f418a5a918ba9c495504"
    );
    assert_eq!(
        t.public,
        [
            "79a631eede1bf9c98f12032cdeadd0e7a079398fc786b88cc846ec89af85a51a",
            "675dd574ed7789310b3d2e7681f3790b466c773b1521fecf36577958371ea52f"
        ]
    );
    assert_eq!(
        t.initiation,
        concat!(
            "810000009e0d989ca9a83574cf53197028ce6b5c2daa99bffc104dcdcf80de7adb4af8d828903b0e",
            "9f1c872a891da762dad07823d1cd47fcf5baf4fd00d660969fc2a3c82610e8a63f3516fcd115a6b1",
            "198184573a93dbf91d308ea6b173e9a004767df3ccefcd32a861692864b30037585a8892942eb3f8",
            "9a0e368610bb4dc5e7"
        )
    );
    assert_eq!(&t.initiation_wire[..16], "e06e9da61802197a");
    assert_eq!(t.initiation_wire[16..], t.initiation[16..]);
    assert_eq!(
        t.response,
        concat!(
            "820000009e0d989cb23e915663e34f6a271881682e25f3200ec8eab9bc5f7defbde62b0d89b1e52d",
            "20993b794b7487c4b67930284f53732ef6fbc797e0bfd96c143b61df5cf194a8bd"
        )
    );
    assert_eq!(&t.response_wire[..16], "544ce691d3d47cdc");
    assert_eq!(t.response_wire[16..], t.response[16..]);
    assert_eq!(
        t.keepalive_i,
        "a45d0f18b2d2328b41a3ca89fa929a7b4e278253b91451f0"
    );
    assert_eq!(
        t.keepalive_r,
        "11a78130357909534be500895fc8d89619809511949eded2"
    );
    assert_eq!(
        t.rekey_keepalive_i,
        "b6fcd38ee2d79693691444bf57128719b35a0852d73c0196"
    );
}

/// The session set of the transcript's first handshake (docs/PROTOCOL.md §9.8): route key,
/// activation epoch, role 0's routes at that epoch under keyed and thesis derivation, the set's
/// MAC key and role 0's header key. Cross-checked independently by `scripts/check-vectors.py`,
/// which also prints the Noise handshake hash the route key is derived from.
#[test]
fn session_set_of_the_transcript() {
    let t = transcript();
    assert_eq!(
        t.route_key,
        "cd6e65ba64a39d27f94056b86892f7befb2d64176404cff035cd3c24cbe1b821"
    );
    assert_eq!(t.activation, Epoch(EPOCH.0 + 2));
    assert_eq!(
        t.session_route_keyed,
        "[2001:db8:a:0:79b8:b2b:d718:507b]:13515 -> [2001:db8:b:0:517b:1c9d:e41:2a9]:12350"
    );
    assert_eq!(
        t.session_route_thesis,
        "[2001:db8:a:0:404b:375d:139a:1a27]:13515 -> [2001:db8:b:0:d32b:7617:398d:4563]:12350"
    );
    assert_eq!(
        t.session_mac_key,
        "242b07507d59653b9384e912ca4263bb2040d248e105a4b97b44f9ba7af47277"
    );
    assert_eq!(
        t.session_hp0,
        "7b670b62c17fba3572dc4090d57fabace3ccd083e49ccb8bd0b33855b3b65f2f"
    );
}

/// The session route key (docs/PROTOCOL.md §9.8) from
/// k_i2r = 00..1f, k_r2i = 20..3f, handshake hash = 40..5f, and the route it gives at epoch e
/// (the §2 derivation unchanged, with the route key as the session key). The key was cross-checked
/// with the Python `blake3` package:
/// `blake3.blake3(bytes(range(96)), derive_key_context="mt6d-proto 2026-11-24 session route key")`.
#[test]
fn session_route_key_and_route() {
    let i2r: [u8; 32] = std::array::from_fn(|i| i as u8);
    let r2i: [u8; 32] = std::array::from_fn(|i| 32 + i as u8);
    let h: [u8; 32] = std::array::from_fn(|i| 64 + i as u8);
    let route = mt6d_proto::handshake::session_route_key(&i2r, &r2i, &h);
    assert_eq!(
        hex(route.as_bytes()),
        "3a93f304cb351437bfbdab3a5155bd3578740e35c0daf1e6ded8f147235549ad"
    );
    let r = Stream::new(StreamConfig::new(low(), high(), route.clone()))
        .unwrap()
        .route(EPOCH);
    assert_eq!(
        format!("{} -> {}", r.local, r.remote),
        "[2001:db8:a:0:59a0:2892:8c84:4207]:50081 -> [2001:db8:b:0:1e47:2c0a:1355:3d29]:4182"
    );
    // The session's route set (PROTOCOL §9.8): the same route from a link stream rekeyed with
    // the route key (the epoch clock stays the link stream's), the set's handshake MAC key, and
    // the low side's header mask of 24 zero bytes under the set's header key (§4.5).
    let link = Stream::new(StreamConfig::new(low(), high(), key())).unwrap();
    let set = link.with_route_key(&route);
    assert_eq!(set.route(EPOCH), r);
    assert_eq!(
        hex(&blake3::derive_key(
            "mt6d-proto 2026-11-21 handshake mac key",
            route.as_bytes()
        )),
        "ae82aa5c87c9a1c0de8526e3fc2d6db333e1308bd02f4fd31914aa805b9a9576"
    );
    let mut masked = [0u8; 24];
    set.send_header_key().unwrap().protect(&mut masked).unwrap();
    assert_eq!(
        hex(&masked),
        "080d0b17f765be9500000000000000000000000000000000"
    );
}

/// The relay vectors of docs/PROTOCOL.md §10.10 that need the AEAD: (b) the e2e relay payload
/// of §8's stream (encrypt, aes256-gcm, counter 2^26) sealed for role 0's route of epoch e taken
/// as a virtual route: route tag || §8's sealed payload, header protection applied; (a) the data
/// frame carrying it to role 1's node id, sealed as the link payload of a relay link from
/// relay X `2001:db8:c::1` (role 0) to relay Y `2001:db8:d::2` under link key `202122...3f`
/// (pre-shared: the §2.3 data key and §4.5 header key derived from it as for any stream), on
/// X's route of epoch e, counter 2^26, header protection applied.
#[test]
fn relay_link_and_e2e_payloads() {
    use mt6d_proto::relay::e2e::{seal_e2e, RouteTagKey, VirtualRoute};
    use mt6d_proto::relay::frame::DEFAULT_FRAME_MAX;
    use mt6d_proto::relay::{Kind, NodeId, RelayRepr, HOP_LIMIT};

    let mut c = StreamConfig::new(low(), high(), key());
    c.mode = Mode::Encrypt;
    let e2e = Stream::new(c).unwrap();
    let via = VirtualRoute::new(e2e.route(EPOCH), &RouteTagKey::derive(&key()));
    let mut payload = [0u8; 64];
    let n = seal_e2e(
        &e2e.sealer(COUNTER_START, u64::MAX),
        e2e.send_header_key().unwrap(),
        &via,
        &inner_packet(),
        &mut payload,
    )
    .unwrap();
    let payload = &payload[..n];
    assert_eq!(
        hex(payload),
        "7ad5648d71e9edf4f9383c2bae04d97e0579d90f0586f65c41623dd498e91d6e956c9087334f32da563ae2d2"
    );
    let (want, _) = seal_vector(Mode::Encrypt, AeadAlg::Aes256Gcm);
    assert_eq!(
        &payload[8..],
        &want[..n - 8],
        "behind its tag, §8's payload"
    );

    let link_key = SessionKey::from_bytes(&(32u8..64).collect::<Vec<_>>()).unwrap();
    let mut c = StreamConfig::new(
        Endpoint::new("2001:db8:c::1".parse().unwrap()),
        Endpoint::new("2001:db8:d::2".parse().unwrap()),
        link_key,
    );
    c.mode = Mode::Encrypt;
    let link = Stream::new(c).unwrap();
    assert_eq!(link.role(), Role::Low);
    let route = link.route(EPOCH);
    assert_eq!(
        format!("{} -> {}", route.local, route.remote),
        "[2001:db8:c:0:80be:999b:618a:29fa]:32001 -> [2001:db8:d:0:9820:ba67:a8e8:192a]:41209"
    );
    let repr = RelayRepr {
        kind: Kind::Data,
        hops: HOP_LIMIT,
        payload_len: u16::try_from(n).unwrap(),
        destination: NodeId::from_bytes([0xb4, 0x02, 0xd1, 0x33, 0x8c, 0x60, 0xf4, 0xc8]),
    };
    let mut wire = [0u8; 256];
    let m = link
        .sealer(COUNTER_START, u64::MAX)
        .seal_frame(&route, &repr, payload, DEFAULT_FRAME_MAX, &mut wire)
        .unwrap();
    assert_eq!(m, 8 + 128 + 16);
    link.send_header_key()
        .unwrap()
        .protect(&mut wire[..m])
        .unwrap();
    assert_eq!(
        hex(&wire[..m]),
        "a75adfdff900daa326e1047cdb598788c0c0a3de261209b9c2510cbe1ce9920851fbea103b74e8d6\
         a883416fa7edb6c841099ad393b997b255729abd5a43eddfb11bb112489e7ce2a3fcdcc87eb004e1\
         366fe5182010bf005e0de6a64e41a0051b818b572c90ad9e814deac3df428da59bc865d84867b131\
         93dd57258eead4a19cda18a4c24fc6136f365e25bf40c83757b08c5f93f5850c"
    );
    // And back: the receiving relay unmasks and opens it to the frame.
    let mut c = link.config().mirrored();
    c.mode = Mode::Encrypt;
    let peer = Stream::new(c).unwrap();
    peer.recv_header_key()
        .unwrap()
        .unprotect(&mut wire[..m])
        .unwrap();
    let f = peer
        .opener()
        .open_frame(&peer.route(EPOCH), &mut wire[..m])
        .unwrap()
        .unwrap();
    assert_eq!(
        (f.kind(), f.hops(), f.payload()),
        (Kind::Data, HOP_LIMIT, payload)
    );
}

// ---- Link-layer address announcement (0x84) with its freshness stamp (§5.5) ----

/// Role 0's link-layer address announcement of MAC `02:00:5e:10:00:01` on its route of epoch
/// e, stamped one second into the epoch, protected.
fn link_announcement_vector() -> String {
    let mut c = StreamConfig::new(low(), high(), key());
    c.mode = Mode::Encrypt;
    let s = Stream::new(c).unwrap();
    let stamp = UnixTime::from_nanos(1_700_000_001_000_000_000);
    assert_eq!(s.epoch_at(stamp), EPOCH);
    let mac = [0x02, 0x00, 0x5e, 0x10, 0x00, 0x01];
    let mut n = RouteMoves::new(&s).frame_link(&s.route(EPOCH), mac, stamp);
    s.send_header_key().unwrap().protect(&mut n).unwrap();

    // Role 1 reads the MAC and the stamp back from the wire bytes.
    let mut c = s.config().mirrored();
    c.mode = Mode::Encrypt;
    let peer = Stream::new(c).unwrap();
    let mut got = n;
    peer.recv_header_key().unwrap().unprotect(&mut got).unwrap();
    assert!(mt6d_proto::moves::is_link_announcement(&got));
    assert_eq!(
        RouteMoves::new(&peer).handle_link(&peer.route(EPOCH), &got),
        Ok((mac, stamp))
    );
    hex(&n)
}

/// Cross-checked by scripts/check-vectors.py (docs/PROTOCOL.md §8).
#[test]
fn link_announcement_with_its_stamp() {
    assert_eq!(
        link_announcement_vector(),
        "11646ca9867773a1de24f32c9e2cbb035930602c8bd28ec504943402ab604663"
    );
}
