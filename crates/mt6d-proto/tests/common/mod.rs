//! What the simulator tests share: the two gateways' true addresses, the virtual clock's start and
//! a handshake configuration each test adjusts with struct-update syntax.

#![allow(dead_code)] // each test binary uses its own subset
#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test

pub mod gateway;

use std::net::Ipv6Addr;
use std::time::Duration;

use mt6d_proto::handshake::{HandshakeConfig, PrivateKey, Psk};
use mt6d_proto::{AeadAlg, Mode};

/// Gateway A's protected host.
pub const A: &str = "2001:db8:a::1";
/// Gateway B's protected host.
pub const B: &str = "2001:db8:b::2";
/// Virtual clock start (Unix ms): an ordinary epoch far from any boundary case.
pub const START_MS: u64 = 1_800_000_000_000;

pub fn ip(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// Encrypt mode, AES-256-GCM, no pre-shared key, rekey after 120 s and a packet budget no
/// simulation reaches.
pub fn handshake_config(
    own: &PrivateKey,
    peer: &PrivateKey,
    local: &str,
    remote: &str,
) -> HandshakeConfig {
    HandshakeConfig {
        local_private: own.clone(),
        remote_public: peer.public_key(),
        psk: Psk::none(),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: ip(local),
        remote_true: ip(remote),
        rekey_after: Duration::from_secs(120),
        rekey_after_packets: 1 << 40,
    }
}

/// A 56-byte IPv6/UDP packet from `src` to `dst` whose 8-byte payload is `seq` (big-endian): what
/// the simulations send through the tunnel and count on the far side.
pub fn udp_packet(src: Ipv6Addr, dst: Ipv6Addr, seq: u64) -> [u8; 56] {
    let mut p = [0u8; 56];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&16u16.to_be_bytes());
    p[6] = 17;
    p[7] = 64;
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    p[44..46].copy_from_slice(&16u16.to_be_bytes());
    p[48..].copy_from_slice(&seq.to_be_bytes());
    p
}
