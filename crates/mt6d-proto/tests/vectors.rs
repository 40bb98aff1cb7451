//! Frozen test vectors, also printed in docs/PROTOCOL.md §8. A change here is a wire-format change.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::net::Ipv6Addr;

use mt6d_proto::addressing::{hashed_address, port, thesis_iid, AddressKeys, Role};
use mt6d_proto::moves::RouteMoves;
use mt6d_proto::tunnel::header::key_bytes;
use mt6d_proto::tunnel::HeaderKey;
use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Epoch, Mode, PortPolicy, SessionKey, Stream, StreamConfig,
    UnixTime,
};

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

/// The session route key (docs/session-routes.md, a draft not yet followed by the daemon) from
/// k_i2r = 00..1f, k_r2i = 20..3f, handshake hash = 40..5f, and the route it gives at epoch e
/// (the §2 derivation unchanged, with the route key as the session key). The key was cross-checked
/// with the Python `blake3` package:
/// `blake3.blake3(bytes(range(96)), derive_key_context="mt6d-proto 2026-11-24 session route key")`.
#[test]
fn session_route_key_and_route() {
    let i2r: [u8; 32] = std::array::from_fn(|i| i as u8);
    let r2i: [u8; 32] = std::array::from_fn(|i| 32 + i as u8);
    let h: [u8; 32] = std::array::from_fn(|i| 64 + i as u8);
    let route = mt6d_proto::handshake::session_route_key(&i2r, &r2i, &h).unwrap();
    assert_eq!(
        hex(route.as_bytes()),
        "3a93f304cb351437bfbdab3a5155bd3578740e35c0daf1e6ded8f147235549ad"
    );
    let r = Stream::new(StreamConfig::new(low(), high(), route))
        .unwrap()
        .route(EPOCH);
    assert_eq!(
        format!("{} -> {}", r.local, r.remote),
        "[2001:db8:a:0:59a0:2892:8c84:4207]:50081 -> [2001:db8:b:0:1e47:2c0a:1355:3d29]:4182"
    );
}
