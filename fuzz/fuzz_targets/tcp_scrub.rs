//! TCP option blocks and IPv6+TCP packets from the network through the option iterator, `strip`
//! and `clamp_mss`: must never panic; an error leaves the packet as it was; a rewritten packet is
//! well formed, keeps its payload, holds no identity option, and keeps a valid checksum valid in
//! each checksum mode.
#![no_main]

use std::net::Ipv6Addr;

use libfuzzer_sys::fuzz_target;
use mt6d_proto::scrub::{
    clamp_mss, strip, ChecksumField, ClampOutcome, HostIdKinds, ScrubPolicy, StripOutcome,
    TcpOptions,
};
use mt6d_proto::wire::{
    combine, pseudo_header_sum, upper_layer_checksum, Ipv6Packet, TcpPacket, IPV6_HEADER_LEN,
};

const KINDS: HostIdKinds = HostIdKinds {
    wing: Some(200),
    boucadair: Some(201),
    enabled: Some(202),
};

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

fn addrs(p: &[u8]) -> (Ipv6Addr, Ipv6Addr) {
    let ip = Ipv6Packet::new_checked_header(p).unwrap();
    (ip.src_addr(), ip.dst_addr())
}

/// Writes the checksum field `csum` expects.
fn set_checksum(p: &mut [u8], csum: ChecksumField) {
    let (s, d) = addrs(p);
    let seg = &mut p[IPV6_HEADER_LEN..];
    seg[16..18].copy_from_slice(&[0, 0]);
    let c = match csum {
        ChecksumField::Complete => upper_layer_checksum(s, d, 6, seg),
        ChecksumField::Partial { includes_length } => {
            let len = if includes_length { seg.len() as u32 } else { 0 };
            fold(pseudo_header_sum(s, d, len, 6))
        }
    };
    seg[16..18].copy_from_slice(&c.to_be_bytes());
}

/// True if the checksum is right for `csum`, completing a partial one as the device would.
fn checksum_ok(p: &[u8], csum: ChecksumField) -> bool {
    let (s, d) = addrs(p);
    let mut seg = p[IPV6_HEADER_LEN..].to_vec();
    if let ChecksumField::Partial { includes_length } = csum {
        let mut sum = u32::from(combine(&seg, 0));
        if !includes_length {
            sum += seg.len() as u32;
        }
        seg[16..18].copy_from_slice(&(!fold(sum)).to_be_bytes());
    }
    upper_layer_checksum(s, d, 6, &seg) == 0
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, body)) = data.split_first() else {
        return;
    };
    // The bytes as an option block alone: the walk ends within len + 1 items.
    assert!(TcpOptions::new(body, KINDS).count() <= body.len() + 1);

    let csum = match sel % 3 {
        0 => ChecksumField::Complete,
        1 => ChecksumField::Partial {
            includes_length: true,
        },
        _ => ChecksumField::Partial {
            includes_length: false,
        },
    };
    let policy = ScrubPolicy {
        host_id_kinds: KINDS,
        strip_unknown: sel & 0x20 != 0,
    };
    let mut p = body.to_vec();
    // Most inputs are made into IPv6+TCP with a consistent length and a valid checksum, so the
    // option rewriting behind the header checks is reached.
    let fixed = sel & 0x40 == 0 && p.len() >= IPV6_HEADER_LEN + 20;
    if fixed {
        p[0] = 0x60;
        p[6] = 6;
        let n = (p.len() - IPV6_HEADER_LEN) as u16;
        p[4..6].copy_from_slice(&n.to_be_bytes());
        if TcpPacket::new_checked(&p[IPV6_HEADER_LEN..]).is_ok() {
            set_checksum(&mut p, csum);
        }
    }
    let valid = fixed && TcpPacket::new_checked(&p[IPV6_HEADER_LEN..]).is_ok();
    let before = p.clone();
    match strip(&mut p, &policy, csum) {
        Err(_) => assert_eq!(p, before),
        Ok(StripOutcome::NotTcp { .. }) | Ok(StripOutcome::Unchanged) => assert_eq!(p, before),
        Ok(StripOutcome::Stripped {
            new_len, removed, ..
        }) => {
            assert_eq!(new_len + removed, before.len());
            p.truncate(new_len);
            let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
            let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
            let old = TcpPacket::new_checked(&before[IPV6_HEADER_LEN..]).unwrap();
            assert_eq!(tcp.payload(), old.payload());
            assert_eq!(tcp.options().len() % 4, 0);
            for o in TcpOptions::new(tcp.options(), KINDS) {
                assert!(!o.unwrap().option.is_identity());
            }
            if valid {
                assert!(checksum_ok(&p, csum));
            }
        }
    }
    let before = p.clone();
    let max = u16::from_be_bytes([sel, sel.rotate_left(3)]);
    match clamp_mss(&mut p, max, KINDS, csum) {
        Ok(ClampOutcome::Clamped { to, .. }) => {
            assert_eq!(to, max);
            if valid {
                assert!(checksum_ok(&p, csum));
            }
        }
        _ => assert_eq!(p, before),
    }
});
