//! Property tests: every mode/AEAD round-trips arbitrary inner packets, and two gateways built from
//! mirrored configs always agree on addresses and ports.

#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
use std::net::Ipv6Addr;
use std::time::Duration;

use mt6d_proto::{
    AeadAlg, Derivation, Endpoint, Epoch, Mode, PortPolicy, SessionKey, Stream, StreamConfig,
    UnixTime,
};
use proptest::prelude::*;

fn packet(src: Ipv6Addr, dst: Ipv6Addr, head: [u8; 8], payload: &[u8]) -> Vec<u8> {
    let mut p = head.to_vec();
    p[0] = 0x60 | (p[0] & 0x0f);
    p[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

fn mode() -> impl Strategy<Value = Mode> {
    prop_oneof![Just(Mode::Plain), Just(Mode::Auth), Just(Mode::Encrypt)]
}
fn alg() -> impl Strategy<Value = AeadAlg> {
    prop_oneof![Just(AeadAlg::Aes256Gcm), Just(AeadAlg::ChaCha20Poly1305)]
}
fn addr() -> impl Strategy<Value = Ipv6Addr> {
    any::<u128>().prop_map(|v| Ipv6Addr::from((v >> 4) | (0x2u128 << 124)))
}

proptest! {
    #[test]
    fn roundtrip(mode in mode(), alg in alg(), head in any::<[u8; 8]>(),
                 payload in proptest::collection::vec(any::<u8>(), 0..3000),
                 key in proptest::collection::vec(any::<u8>(), 16..=64), epoch in any::<u32>(), now in 0u64..(1 << 62)) {
        let (a, b): (Ipv6Addr, Ipv6Addr) = ("2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap());
        let mut c = StreamConfig::new(Endpoint::new(a), Endpoint::new(b), SessionKey::from_bytes(&key).unwrap());
        c.mode = mode;
        c.aead = alg;
        let sa = Stream::new(c.clone()).unwrap();
        let sb = Stream::new(c.mirrored()).unwrap();
        let inner = packet(a, b, head, &payload);
        let mut wire = vec![0u8; inner.len() + 64];
        let n = sa.sealer(UnixTime::from_nanos(now).as_nanos(), u64::MAX).seal(&sa.route(Epoch(epoch.into())), &inner, &mut wire).unwrap();
        prop_assert_eq!(n + 48, inner.len() + sa.overhead());
        // Header protection on the wire (§4.5): the sender's send key is the receiver's recv key.
        prop_assert_eq!(sa.send_header_key().is_some(), mode != Mode::Plain);
        if let (Some(tx), Some(rx)) = (sa.send_header_key(), sb.recv_header_key()) {
            tx.protect(&mut wire[..n]).unwrap();
            rx.unprotect(&mut wire[..n]).unwrap();
        }
        let mut out = vec![0u8; inner.len()];
        let m = sb.opener().open(&sb.route(Epoch(epoch.into())), &wire[..n], &mut out).unwrap();
        prop_assert_eq!(&out[..m], &inner[..]);
    }

    #[test]
    fn peers_agree(a in addr(), b in addr(), key in proptest::collection::vec(any::<u8>(), 16..=64),
                   thesis in any::<bool>(), hop in any::<bool>(), jitter in any::<bool>(),
                   rot_ms in 1000u64..100_000, now_ms in 0u64..(1u64 << 44), mac in any::<Option<[u8; 6]>>(),
                   ext in any::<Option<u64>>()) {
        prop_assume!(a != b);
        let mut local = Endpoint::new(a);
        local.mac = mac;
        local.external_prefix = ext.map(|p| Ipv6Addr::from(u128::from(p) << 64));
        let mut c = StreamConfig::new(local, Endpoint::new(b), SessionKey::from_bytes(&key).unwrap());
        c.derivation = if thesis { Derivation::Thesis } else { Derivation::Keyed };
        c.ports = if hop { PortPolicy::Hopping } else { PortPolicy::Fixed(4789) };
        c.jitter = jitter;
        c.rotation = Duration::from_millis(rot_ms);
        let sa = Stream::new(c.clone()).unwrap();
        let sb = Stream::new(c.mirrored()).unwrap();
        let now = UnixTime::from_millis(now_ms);
        let (ea, eb) = (sa.epoch_at(now), sb.epoch_at(now));
        prop_assert_eq!(ea, eb);
        let (ra, rb) = (sa.schedule(now), sb.schedule(now));
        prop_assert_eq!(ra.next_change, rb.next_change);
        prop_assert!(ra.next_change > now);
        for (x, y) in ra.accept.iter().zip(rb.accept.iter()) {
            prop_assert_eq!(x.local, y.remote);
            prop_assert_eq!(x.remote, y.local);
            prop_assert_ne!(x.local.ip(), x.remote.ip());
            prop_assert!(x.local.port() >= 1024 && x.remote.port() >= 1024);
        }
    }
}
