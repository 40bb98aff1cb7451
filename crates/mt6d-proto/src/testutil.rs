//! Builders for real, checksummed inner packets and mirrored stream pairs (unit tests only).

use std::net::Ipv6Addr;

use crate::wire::{
    upper_layer_checksum, Icmpv6Repr, Icmpv6Type, Ipv6Packet, Ipv6Repr, UdpRepr, IPV6_HEADER_LEN,
    NEXT_HEADER_ICMPV6, NEXT_HEADER_TCP, NEXT_HEADER_UDP,
};
use crate::{AeadAlg, Endpoint, Mode, SessionKey, Stream, StreamConfig};

pub const A: &str = "2001:db8:a::1";
pub const B: &str = "2001:db8:b::2";

pub fn addr(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

pub fn config(mode: Mode, aead: AeadAlg) -> StreamConfig {
    let mut c = StreamConfig::new(
        Endpoint::new(addr(A)),
        Endpoint::new(addr(B)),
        SessionKey::from_bytes(&[0x5a; 32]).unwrap(),
    );
    c.mode = mode;
    c.aead = aead;
    c
}

/// (stream at A, stream at B).
pub fn pair(mode: Mode, aead: AeadAlg) -> (Stream, Stream) {
    let c = config(mode, aead);
    (
        Stream::new(c.clone()).unwrap(),
        Stream::new(c.mirrored()).unwrap(),
    )
}

fn ipv6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, upper: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; IPV6_HEADER_LEN + upper.len()];
    Ipv6Repr {
        traffic_class: 0x20,
        flow_label: 0xabcde,
        payload_len: upper.len() as u16,
        next_header,
        hop_limit: 63,
        src_addr: src,
        dst_addr: dst,
    }
    .emit(&mut p)
    .unwrap();
    p[IPV6_HEADER_LEN..].copy_from_slice(upper);
    p
}

pub fn udp(src: Ipv6Addr, dst: Ipv6Addr, payload: &[u8]) -> Vec<u8> {
    let mut u = vec![0u8; 8 + payload.len()];
    u[8..].copy_from_slice(payload);
    UdpRepr {
        src_port: 40000,
        dst_port: 53,
    }
    .emit(&mut u, src, dst)
    .unwrap();
    ipv6(src, dst, NEXT_HEADER_UDP, &u)
}

pub fn tcp(src: Ipv6Addr, dst: Ipv6Addr, payload: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20 + payload.len()];
    t[0..2].copy_from_slice(&443u16.to_be_bytes());
    t[2..4].copy_from_slice(&51000u16.to_be_bytes());
    t[4..8].copy_from_slice(&0x0102_0304u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = 0x18; // PSH|ACK
    t[14..16].copy_from_slice(&65535u16.to_be_bytes());
    t[20..].copy_from_slice(payload);
    let c = upper_layer_checksum(src, dst, NEXT_HEADER_TCP, &t);
    t[16..18].copy_from_slice(&c.to_be_bytes());
    ipv6(src, dst, NEXT_HEADER_TCP, &t)
}

pub fn echo(src: Ipv6Addr, dst: Ipv6Addr, payload: &[u8]) -> Vec<u8> {
    let mut m = vec![0u8; 8 + payload.len()];
    m[8..].copy_from_slice(payload);
    Icmpv6Repr {
        msg_type: Icmpv6Type::Other(128),
        code: 0,
        data: 0x1234_0001,
    }
    .emit(&mut m, src, dst)
    .unwrap();
    ipv6(src, dst, NEXT_HEADER_ICMPV6, &m)
}

/// True if the packet's TCP/UDP/ICMPv6 checksum verifies.
pub fn transport_checksum_ok(pkt: &[u8]) -> bool {
    let p = Ipv6Packet::new_checked(pkt).unwrap();
    upper_layer_checksum(p.src_addr(), p.dst_addr(), p.next_header(), p.payload()) == 0
}
