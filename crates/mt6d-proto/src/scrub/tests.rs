//! Tests of `strip` and `clamp_mss` against fixed packets, every checksum checked by a full
//! computation independent of the incremental update under test.

use std::net::Ipv6Addr;

use proptest::prelude::*;

use super::*;
use crate::wire::{hex, pseudo_header_sum, tcp_flags, upper_layer_checksum};

const KINDS: HostIdKinds = HostIdKinds {
    wing: Some(200),
    boucadair: Some(201),
    enabled: Some(202),
};
const POLICY: ScrubPolicy = ScrubPolicy {
    host_id_kinds: KINDS,
    strip_unknown: false,
};

fn addrs() -> (Ipv6Addr, Ipv6Addr) {
    (
        "2001:db8:a::1".parse().unwrap(),
        "2001:db8:b::2".parse().unwrap(),
    )
}

/// An IPv6+TCP packet 2001:db8:a::1:40000 -> 2001:db8:b::2:443 with `opts` (padded by the
/// caller to a multiple of 4), `payload`, and a checksum field as `csum` says.
fn packet(flags: u8, opts: &[u8], payload: &[u8], csum: ChecksumField) -> Vec<u8> {
    assert_eq!(opts.len() % 4, 0);
    let (s, d) = addrs();
    let seg_len = 20 + opts.len() + payload.len();
    let mut p = hex("60000000 0000 06 40");
    p[4..6].copy_from_slice(&(seg_len as u16).to_be_bytes());
    p.extend_from_slice(&s.octets());
    p.extend_from_slice(&d.octets());
    p.extend_from_slice(&hex("9c40 01bb 01020304 05060708"));
    p.push((((20 + opts.len()) / 4) as u8) << 4);
    p.push(flags);
    p.extend_from_slice(&hex("faf0 0000 0000"));
    p.extend_from_slice(opts);
    p.extend_from_slice(payload);
    let c = match csum {
        ChecksumField::Complete => upper_layer_checksum(s, d, 6, &p[40..]),
        ChecksumField::Partial { includes_length } => {
            let len = if includes_length { seg_len as u32 } else { 0 };
            fold(pseudo_header_sum(s, d, len, 6))
        }
    };
    p[56..58].copy_from_slice(&c.to_be_bytes());
    p
}

fn fold(mut s: u32) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s as u16
}

/// The device's (or the kernel's segmentation's) completion of a partial checksum, then a full
/// verification: a GSO super-packet's segments each get their own length added by the kernel,
/// so here the length is added for it when the field left it out.
fn verify(p: &[u8], csum: ChecksumField) -> bool {
    let (s, d) = addrs();
    let ip = Ipv6Packet::new_checked(p).unwrap();
    let seg = ip.payload();
    match csum {
        ChecksumField::Complete => upper_layer_checksum(s, d, 6, seg) == 0,
        ChecksumField::Partial { includes_length } => {
            let mut done = seg.to_vec();
            let mut sum = u32::from(combine(&done, 0));
            if !includes_length {
                sum += seg.len() as u32;
            }
            done[16..18].copy_from_slice(&(!fold(sum)).to_be_bytes());
            upper_layer_checksum(s, d, 6, &done) == 0
        }
    }
}

fn options_of(p: &[u8]) -> Vec<u8> {
    let ip = Ipv6Packet::new_checked(p).unwrap();
    TcpPacket::new_checked(ip.payload())
        .unwrap()
        .options()
        .to_vec()
}

const PAYLOAD: &[u8] = b"GET / HTTP/1.1\r\n";
const LINUX_SYN: &str = "020405a0 0402080a 00001000 00000000 01030307";
const ALL_CSUM: [ChecksumField; 3] = [
    ChecksumField::Complete,
    ChecksumField::Partial {
        includes_length: true,
    },
    ChecksumField::Partial {
        includes_length: false,
    },
];

/// Strips and checks what every successful strip must give: the payload intact, lengths
/// consistent, a valid checksum, a well-formed block without identity options.
fn strip_ok(p: &mut Vec<u8>, csum: ChecksumField) -> StripOutcome {
    let before = p.clone();
    let old_payload = {
        let ip = Ipv6Packet::new_checked(&before[..]).unwrap();
        TcpPacket::new_checked(ip.payload())
            .unwrap()
            .payload()
            .to_vec()
    };
    let out = strip(p, &POLICY, csum).unwrap();
    if let StripOutcome::Stripped {
        new_len, removed, ..
    } = out
    {
        assert_eq!(new_len + removed, before.len());
        p.truncate(new_len);
    } else {
        assert_eq!(*p, before);
    }
    let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
    let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
    assert_eq!(tcp.payload(), &old_payload[..]);
    assert!(verify(p, csum), "{out:?}");
    for o in TcpOptions::new(tcp.options(), KINDS) {
        assert!(!o.unwrap().option.is_identity());
    }
    out
}

#[test]
fn wing_in_a_linux_syn_goes_and_the_header_shrinks() {
    for csum in ALL_CSUM {
        let opts = hex(&format!("{LINUX_SYN} c8043039 "));
        let mut p = packet(tcp_flags::SYN, &opts, &[], csum);
        let out = strip_ok(&mut p, csum);
        assert_eq!(
            out,
            StripOutcome::Stripped {
                options: 1,
                removed: 4,
                new_len: 80
            }
        );
        assert_eq!(options_of(&p), hex(LINUX_SYN));
        assert_eq!(&p[4..6], &[0, 40]);
        assert_eq!(p[52], 0xa0);
    }
}

#[test]
fn every_identity_form_is_removed() {
    let forms = [
        "c8043039",
        "c806c0000201",
        "c80a20010db800000001",
        "c90a001f900000000000",
        "c90a310a000001000000",
        "c90a021f900a00000100",
        "c90af320010db8000001",
        "c90a0401020304050607",
        "ca02",
        "fd060348c633",
        "fe070348 0a0001",
        "fe081f90c0000201",
        // Malformed identity options are removed too.
        "c90a001f900000000001",
        "c805000000",
        "fd02",
    ];
    for form in forms {
        for csum in ALL_CSUM {
            // Identity option first, in the middle of a SYN's options, with payload after.
            let mut opts = hex(form);
            opts.extend_from_slice(&hex("020405a0 0402 01 030307"));
            opts.resize(opts.len().div_ceil(4) * 4, 0);
            let mut p = packet(tcp_flags::SYN, &opts, PAYLOAD, csum);
            let out = strip_ok(&mut p, csum);
            assert!(
                matches!(out, StripOutcome::Stripped { options: 1, .. }),
                "{form}"
            );
            // Linux's layout without timestamps: mss, nop, nop, sackOK, nop, ws.
            assert_eq!(options_of(&p), hex("020405a0 01010402 01030307"), "{form}");
        }
    }
}

#[test]
fn canonical_layout_of_the_kept_options() {
    // Shuffled options with NOP holes, a HOST_ID_ENABLED and a kept unknown (MPTCP capable).
    let opts =
        hex("0303 07 01 ca02 080a 00000001 00000000 0402 1e0c 0081 0102030405060708 020405a0 0000");
    let mut p = packet(tcp_flags::SYN, &opts, &[], ChecksumField::Complete);
    strip_ok(&mut p, ChecksumField::Complete);
    assert_eq!(
        options_of(&p),
        hex("020405a0 0402080a 00000001 00000000 01030307 1e0c0081 01020304 05060708")
    );
    // An ACK with timestamps and SACK, TOA in front.
    let opts = hex("fe081f90c0000201 0101080a 00000002 00000001 0101050a 00000010 00000020");
    let mut p = packet(tcp_flags::ACK, &opts, PAYLOAD, ChecksumField::Complete);
    let out = strip_ok(&mut p, ChecksumField::Complete);
    assert!(matches!(out, StripOutcome::Stripped { removed: 8, .. }));
    assert_eq!(
        options_of(&p),
        hex("0101080a 00000002 00000001 0101050a 00000010 00000020")
    );
}

#[test]
fn packed_layout_when_the_aligned_one_does_not_fit() {
    // ts, two SACK blocks, ws, a 5-byte unknown and a WING packed tight in 40 bytes: Linux's
    // layout of what is kept needs 12 + 20 + 4 + 5 = 41 -> 44 bytes, so it is packed (36).
    let opts = hex(
        "080a0000000100000002 0512 0000000100000002 0000000300000004 030307 1e05abcdef c8043039",
    );
    assert_eq!(opts.len(), 40);
    let mut p = packet(tcp_flags::ACK, &opts, PAYLOAD, ChecksumField::Complete);
    let out = strip_ok(&mut p, ChecksumField::Complete);
    assert!(matches!(out, StripOutcome::Stripped { removed: 4, .. }));
    assert_eq!(
        options_of(&p),
        hex("080a0000000100000002 030307 0512 0000000100000002 0000000300000004 1e05abcdef")
    );
}

#[test]
fn strip_unknown_when_asked() {
    let opts = hex("1e04abcd 020405a0 fd04abcd");
    let policy = ScrubPolicy {
        strip_unknown: true,
        ..POLICY
    };
    let mut p = packet(tcp_flags::SYN, &opts, &[], ChecksumField::Complete);
    let out = strip(&mut p, &policy, ChecksumField::Complete).unwrap();
    assert!(matches!(
        out,
        StripOutcome::Stripped {
            options: 2,
            removed: 8,
            new_len: 64
        }
    ));
    p.truncate(64);
    assert_eq!(options_of(&p), hex("020405a0"));
    assert!(verify(&p, ChecksumField::Complete));
    // By default both stay and nothing is written.
    let mut p = packet(tcp_flags::SYN, &opts, &[], ChecksumField::Complete);
    let before = p.clone();
    assert_eq!(
        strip_ok(&mut p, ChecksumField::Complete),
        StripOutcome::Unchanged
    );
    assert_eq!(p, before);
}

#[test]
fn fast_paths_write_nothing() {
    let mut p = packet(tcp_flags::ACK, &[], &[0x55; 1400], ChecksumField::Complete);
    let before = p.clone();
    assert_eq!(
        strip(&mut p, &POLICY, ChecksumField::Complete),
        Ok(StripOutcome::Unchanged)
    );
    assert_eq!(p, before);
    let mut p = packet(
        tcp_flags::SYN,
        &hex(LINUX_SYN),
        &[],
        ChecksumField::Complete,
    );
    let before = p.clone();
    assert_eq!(
        strip(&mut p, &POLICY, ChecksumField::Complete),
        Ok(StripOutcome::Unchanged)
    );
    assert_eq!(p, before);
    let mut udp = p.clone();
    udp[6] = 17;
    assert_eq!(
        strip(&mut udp, &POLICY, ChecksumField::Complete),
        Ok(StripOutcome::NotTcp { next_header: 17 })
    );
}

#[test]
fn a_wrong_checksum_stays_wrong() {
    let opts = hex(&format!("{LINUX_SYN} c8043039 "));
    let mut p = packet(tcp_flags::SYN, &opts, PAYLOAD, ChecksumField::Complete);
    p[57] ^= 0x40;
    strip(&mut p, &POLICY, ChecksumField::Complete).unwrap();
    p.truncate(p.len() - 4);
    assert!(!verify(&p, ChecksumField::Complete));
}

#[test]
fn errors_leave_the_packet_untouched() {
    let cases: [(&str, &str); 6] = [
        // Framing: length 1, past the end, no length byte, bytes after EOL.
        ("c801 0000", "LengthTooSmall"),
        ("c8043039 020a0000", "PastEnd"),
        ("c8043039 010101 02", "NoLength"),
        ("c8043039 00 010000", "BadPadding"),
        // A malformed option that would be kept: MSS of length 3.
        ("c8043039 020305 00", "BadLength"),
        // Window scale of length 4.
        ("c8043039 03040000", "BadLength"),
    ];
    for (opts, what) in cases {
        let mut p = packet(tcp_flags::SYN, &hex(opts), PAYLOAD, ChecksumField::Complete);
        let before = p.clone();
        let e = strip(&mut p, &POLICY, ChecksumField::Complete).unwrap_err();
        assert!(format!("{e:?}").contains(what), "{opts}: {e:?}");
        assert_eq!(p, before);
    }
    // Truncated IPv6, truncated TCP, a data offset past the segment.
    let good = packet(
        tcp_flags::SYN,
        &hex("c8043039"),
        PAYLOAD,
        ChecksumField::Complete,
    );
    for n in [0, 39, 40, 59, 63] {
        let mut p = good[..n].to_vec();
        if n >= 40 {
            p[4..6].copy_from_slice(&((n - 40) as u16).to_be_bytes());
        }
        let before = p.clone();
        assert!(matches!(
            strip(&mut p, &POLICY, ChecksumField::Complete),
            Err(ScrubError::Wire(_))
        ));
        assert_eq!(p, before);
    }
}

#[test]
fn gso_super_packet_moves_its_payload_once() {
    // A 64 KiB-ish super-packet as virtio-net hands it over: checksum partial without length.
    let payload: Vec<u8> = (0..60_000u32).map(|i| (i * 7) as u8).collect();
    let opts = hex("0101080a 00000002 00000001 fd060348c633 0000");
    let csum = ChecksumField::Partial {
        includes_length: false,
    };
    let mut p = packet(tcp_flags::ACK | tcp_flags::PSH, &opts, &payload, csum);
    let field = p[56..58].to_vec();
    let out = strip_ok(&mut p, csum);
    assert!(matches!(out, StripOutcome::Stripped { removed: 8, .. }));
    // The pseudo-header sum without a length does not depend on the header: unchanged.
    assert_eq!(&p[56..58], &field[..]);
    // A single segment with the length included has it lowered by 8.
    let csum = ChecksumField::Partial {
        includes_length: true,
    };
    let mut p = packet(tcp_flags::ACK, &opts, &payload, csum);
    strip_ok(&mut p, csum);
}

#[test]
fn clamp_lowers_the_mss_of_syns_only() {
    let (s, d) = addrs();
    for csum in ALL_CSUM {
        // MSS at an odd offset (after a NOP) and at an even one.
        for opts in [
            "01 020423c4 000000",
            "020423c4 01030307",
            "c8043039 020423c4",
        ] {
            let mut p = packet(tcp_flags::SYN, &hex(opts), &[], csum);
            let out = clamp_mss(&mut p, 1380, KINDS, csum).unwrap();
            assert_eq!(
                out,
                ClampOutcome::Clamped {
                    from: 9156,
                    to: 1380
                }
            );
            assert!(verify(&p, csum), "{opts}");
            let got: Vec<_> = TcpOptions::new(&options_of(&p), KINDS)
                .filter_map(|o| match o.unwrap().option {
                    TcpOption::Mss(v) => Some(v),
                    _ => None,
                })
                .collect();
            assert_eq!(got, [1380]);
        }
    }
    let mut p = packet(
        tcp_flags::SYN,
        &hex("020405a0"),
        &[],
        ChecksumField::Complete,
    );
    assert_eq!(
        clamp_mss(&mut p, 1440, KINDS, ChecksumField::Complete),
        Ok(ClampOutcome::Unchanged(1440))
    );
    let mut p = packet(
        tcp_flags::ACK,
        &hex("020423c4"),
        &[],
        ChecksumField::Complete,
    );
    assert_eq!(
        clamp_mss(&mut p, 1380, KINDS, ChecksumField::Complete),
        Ok(ClampOutcome::NotSyn)
    );
    let mut p = packet(
        tcp_flags::SYN,
        &hex("01030307"),
        &[],
        ChecksumField::Complete,
    );
    assert_eq!(
        clamp_mss(&mut p, 1380, KINDS, ChecksumField::Complete),
        Ok(ClampOutcome::NoMss)
    );
    let mut p = packet(
        tcp_flags::SYN,
        &hex("020423c4 0200 0000"),
        &[],
        ChecksumField::Complete,
    );
    let before = p.clone();
    assert!(clamp_mss(&mut p, 1380, KINDS, ChecksumField::Complete).is_err());
    assert_eq!(p, before);
    assert!(upper_layer_checksum(s, d, 6, &p[40..]) == 0);
    assert_eq!(mss_for_mtu(1500), 1440);
    assert_eq!(mss_for_mtu(1280), 1220);
    assert_eq!(mss_for_mtu(0), 1220);
}

/// Any option from the forms above, or random bytes.
#[test]
fn injected_options_read_back_with_a_valid_checksum() {
    let (src, _) = addrs();
    let forms = [
        (
            InjectForm::Wing { bytes: 2 },
            InjectData::SourcePort,
            HostIdForm::Wing,
            40000,
        ),
        (
            InjectForm::Wing { bytes: 4 },
            InjectData::Label(7),
            HostIdForm::Wing,
            7,
        ),
        (
            InjectForm::Wing { bytes: 8 },
            InjectData::Prefix,
            HostIdForm::Wing,
            0x0020_010d_b800_0a00,
        ),
        (
            InjectForm::Boucadair,
            InjectData::SourcePort,
            HostIdForm::Boucadair,
            40000,
        ),
        (
            InjectForm::Boucadair,
            InjectData::Prefix,
            HostIdForm::Boucadair,
            0x0020_010d_b800_0a00,
        ),
        (
            InjectForm::Enabled,
            InjectData::SourcePort,
            HostIdForm::Enabled,
            0,
        ),
    ];
    for (form, data, want, value) in forms {
        for csum in ALL_CSUM {
            // A host's own identity option is replaced, not doubled.
            let opts = hex(&format!("{LINUX_SYN} c8041111"));
            let mut p = packet(tcp_flags::SYN, &opts, PAYLOAD, csum);
            let len = p.len();
            p.resize(len + 40, 0xee);
            let mut o = [0u8; 10];
            let n = build_option(form, data, KINDS, src, 40000, &mut o).unwrap();
            let out = inject(&mut p, len, 1500, &o[..n], &POLICY, csum).unwrap();
            let InjectOutcome::Injected { replaced, new_len } = out else {
                panic!("{out:?}");
            };
            assert_eq!(replaced, 1);
            p.truncate(new_len);
            assert!(verify(&p, csum), "{form:?} {csum:?}");
            let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
            let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
            assert_eq!(tcp.payload(), PAYLOAD);
            let ids: Vec<_> = TcpOptions::new(tcp.options(), KINDS)
                .map(|o| o.unwrap())
                .filter_map(|o| identity_value(&o.option))
                .collect();
            assert_eq!(ids, vec![(want, value)], "{form:?}");
            // The standard options keep Linux's layout in front of it.
            assert!(options_of(&p).starts_with(&hex(LINUX_SYN)));
        }
    }
}

#[test]
fn inject_without_room_leaves_the_packet_alone() {
    // 37 bytes of options to keep (no NOP to reclaim in a packed layout): no room for 4 more.
    let opts = hex(
        "020405a0 0402080a 00001000 00000000 01030307 1e12 00810102030405060708090a0b0c0d0e 0000",
    );
    let mut p = packet(tcp_flags::SYN, &opts, &[], ChecksumField::Complete);
    let len = p.len();
    p.resize(len + 40, 0);
    let before = p.clone();
    let o = hex("c8043039");
    let out = inject(&mut p, len, 1500, &o, &POLICY, ChecksumField::Complete).unwrap();
    assert_eq!(out, InjectOutcome::NoRoom);
    assert_eq!(p, before);
    // The MTU bounds it too.
    let mut p = packet(
        tcp_flags::SYN,
        &hex(LINUX_SYN),
        &[],
        ChecksumField::Complete,
    );
    let len = p.len();
    p.resize(len + 40, 0);
    let out = inject(&mut p, len, len, &o, &POLICY, ChecksumField::Complete).unwrap();
    assert_eq!(out, InjectOutcome::NoRoom);
}

fn any_option() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(hex("020405a0")),
        Just(hex("030307")),
        Just(hex("0402")),
        Just(hex("01")),
        Just(hex("080a0000000100000002")),
        Just(hex("050a0000001000000020")),
        Just(hex("c8043039")),
        Just(hex("c80a20010db800000001")),
        Just(hex("c90a021f900a00000100")),
        Just(hex("c90a001f900000000001")),
        Just(hex("ca02")),
        Just(hex("fd060348c633")),
        Just(hex("fe081f90c0000201")),
        Just(hex("1e04abcd")),
        proptest::collection::vec(any::<u8>(), 1..6),
    ]
}

proptest! {
    #[test]
    fn strip_and_clamp_never_break_a_packet(
        opts in proptest::collection::vec(any_option(), 0..8),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        flags in any::<u8>(),
        mode in 0usize..3,
        max_mss in any::<u16>(),
    ) {
        let csum = ALL_CSUM[mode];
        let mut block: Vec<u8> = opts.concat();
        block.truncate(40);
        block.resize(block.len().div_ceil(4) * 4, 0);
        let mut p = packet(flags, &block, &payload, csum);
        // The fast path agrees with the classifying walk.
        if is_clean(&block, &POLICY) {
            for o in TcpOptions::new(&block, KINDS) {
                prop_assert!(o.is_ok_and(|o| !o.option.is_identity()));
            }
        }
        let before = p.clone();
        match strip(&mut p, &POLICY, csum) {
            Err(_) => prop_assert_eq!(&p, &before),
            Ok(_) => {
                p = before.clone();
                strip_ok(&mut p, csum);
                let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
                let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
                prop_assert_eq!(tcp.options().len() % 4, 0);
                for o in TcpOptions::new(tcp.options(), KINDS) {
                    prop_assert!(o.is_ok());
                }
            }
        }
        let before = p.clone();
        match clamp_mss(&mut p, max_mss, KINDS, csum) {
            Ok(ClampOutcome::Clamped { .. }) => prop_assert!(verify(&p, csum)),
            _ => prop_assert_eq!(&p, &before),
        }
    }

    #[test]
    fn random_packets_never_panic(mut p in proptest::collection::vec(any::<u8>(), 0..200), mode in 0usize..3) {
        if p.len() >= 40 {
            p[0] = 0x60;
            p[6] = 6;
            let n = (p.len() - 40) as u16;
            p[4..6].copy_from_slice(&n.to_be_bytes());
        }
        let before = p.clone();
        if strip(&mut p, &POLICY, ALL_CSUM[mode]).is_err() {
            prop_assert_eq!(&p, &before);
        }
        let before = p.clone();
        if clamp_mss(&mut p, 1200, KINDS, ALL_CSUM[mode]).is_err() {
            prop_assert_eq!(&p, &before);
        }
    }
}

/// Normalises a SYN and checks what every normalised SYN must be: a valid checksum, a
/// well-formed block without timestamps, the payload intact.
fn normalize_ok(p: &mut Vec<u8>, segments: u16, csum: ChecksumField) -> NormalizeOutcome {
    let before = window_of(p);
    let out = normalize_syn(p, &POLICY, segments, csum).unwrap();
    assert!(window_of(p) <= before);
    if let NormalizeOutcome::Normalized { new_len, .. } = out {
        p.truncate(new_len);
    }
    assert!(verify(p, csum), "{out:?}");
    let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
    let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
    for o in TcpOptions::new(tcp.options(), KINDS) {
        assert!(!matches!(o.unwrap().option, TcpOption::Timestamps { .. }));
    }
    out
}

fn window_of(p: &[u8]) -> u16 {
    u16::from_be_bytes([p[54], p[55]])
}

#[test]
fn two_stacks_syns_normalise_to_one_layout_and_window() {
    for csum in ALL_CSUM {
        // Linux (timestamps on, window 64800) and a Windows-like stack (no timestamps, its own
        // layout, window 64240).
        let mut linux = packet(tcp_flags::SYN, &hex(LINUX_SYN), &[], csum);
        linux[54..56].copy_from_slice(&64800u16.to_be_bytes());
        let linux = packet_with_csum(linux, csum);
        let mut other = packet(
            tcp_flags::SYN,
            &hex("020405a0 01030307 01010402"),
            &[],
            csum,
        );
        other[54..56].copy_from_slice(&64240u16.to_be_bytes());
        let other = packet_with_csum(other, csum);
        let (mut a, mut b) = (linux.clone(), other.clone());
        let out_a = normalize_ok(&mut a, 10, csum);
        let out_b = normalize_ok(&mut b, 10, csum);
        assert_eq!(
            out_a,
            NormalizeOutcome::Normalized {
                timestamps: true,
                relaid: true,
                window_lowered: true,
                new_len: linux.len() - 8,
            }
        );
        assert_eq!(
            out_b,
            NormalizeOutcome::Normalized {
                timestamps: false,
                relaid: true,
                window_lowered: true,
                new_len: other.len(),
            }
        );
        assert_eq!(options_of(&a), hex("020405a0 01010402 01030307"));
        assert_eq!(options_of(&a), options_of(&b));
        assert_eq!((window_of(&a), window_of(&b)), (14_400, 14_400));
        // 10 segments of the SYN's MSS (1440): p0f's `mss*10`.
        // Normalised again: nothing to do, nothing written.
        let again = a.clone();
        let out = normalize_ok(&mut a, 10, csum);
        assert!(matches!(
            out,
            NormalizeOutcome::Normalized {
                relaid: false,
                window_lowered: false,
                ..
            }
        ));
        assert_eq!(a, again);
    }
}

/// Recomputes the checksum field of a test packet after its header was edited.
fn packet_with_csum(mut p: Vec<u8>, csum: ChecksumField) -> Vec<u8> {
    if csum == ChecksumField::Complete {
        let (s, d) = addrs();
        p[56..58].fill(0);
        let c = upper_layer_checksum(s, d, 6, &p[40..]);
        p[56..58].copy_from_slice(&c.to_be_bytes());
    }
    p
}

#[test]
fn normalise_keeps_accepted_identity_options_lower_windows_only_and_skips_non_syns() {
    // A WING the policy accepted stays, after the standard options; a window below the
    // normalised one stays.
    let opts = hex("c8043039 020405a0 0402080a 00001000 00000000 01030307");
    let mut p = packet(
        tcp_flags::SYN | tcp_flags::ACK,
        &opts,
        PAYLOAD,
        ChecksumField::Complete,
    );
    p[54..56].copy_from_slice(&1000u16.to_be_bytes());
    let mut p = packet_with_csum(p, ChecksumField::Complete);
    let out = normalize_ok(&mut p, 10, ChecksumField::Complete);
    assert!(matches!(
        out,
        NormalizeOutcome::Normalized {
            timestamps: true,
            window_lowered: false,
            ..
        }
    ));
    assert_eq!(options_of(&p), hex("020405a0 01010402 01030307 c8043039"));
    assert_eq!(window_of(&p), 1000);
    let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
    assert_eq!(
        TcpPacket::new_checked(ip.payload()).unwrap().payload(),
        PAYLOAD
    );
    // Not a SYN, not TCP: untouched.
    let mut ack = packet(
        tcp_flags::ACK,
        &hex("0101080a 00000002 00000001"),
        PAYLOAD,
        ChecksumField::Complete,
    );
    let before = ack.clone();
    assert_eq!(
        normalize_syn(&mut ack, &POLICY, 100, ChecksumField::Complete),
        Ok(NormalizeOutcome::NotSyn)
    );
    assert_eq!(ack, before);
    ack[6] = 17;
    assert!(matches!(
        normalize_syn(&mut ack, &POLICY, 100, ChecksumField::Complete),
        Ok(NormalizeOutcome::NotTcp { next_header: 17 })
    ));
    // A malformed block: an error, untouched.
    let mut bad = packet(
        tcp_flags::SYN,
        &hex("02040000 08000000"),
        &[],
        ChecksumField::Complete,
    );
    let before = bad.clone();
    assert!(normalize_syn(&mut bad, &POLICY, 100, ChecksumField::Complete).is_err());
    assert_eq!(bad, before);
}

#[test]
fn normalised_hop_limit_and_flow_label_are_one_per_flow() {
    const KEY: [u64; 2] = [0x0123_4567_89ab_cdef, 0xfedc_ba98_7654_3210];
    let mut a = packet(
        tcp_flags::SYN,
        &hex(LINUX_SYN),
        &[],
        ChecksumField::Complete,
    );
    // Traffic class 0xb8 (EF), flow label 0x12345, hop limit 255: a stack's own values.
    a[..4].copy_from_slice(&hex("6b812345"));
    a[7] = 255;
    let mut b = packet(tcp_flags::ACK, &[], PAYLOAD, ChecksumField::Complete);
    b[7] = 128;
    let (ca, cb) = (a.clone(), b.clone());
    normalize_ip(&mut a, 64, &KEY);
    normalize_ip(&mut b, 64, &KEY);
    assert_eq!((a[7], b[7]), (64, 64));
    // Traffic class kept; the label is the flow's, not the stack's; the segments unchanged.
    assert_eq!(a[0..2][0], 0x6b);
    assert_eq!(a[1] >> 4, 0x8);
    let label = |p: &[u8]| u32::from_be_bytes([0, p[1] & 0x0f, p[2], p[3]]);
    assert_eq!(label(&a), label(&b));
    assert_ne!(label(&a), 0);
    assert_eq!(Some(label(&a)), flow_label(&a, &KEY));
    assert_eq!(a[8..], ca[8..]);
    assert_eq!(b[8..], cb[8..]);
    assert!(verify(&a, ChecksumField::Complete));
    // Another port, another key: another label.
    let mut c = cb.clone();
    c[40] ^= 1;
    assert_ne!(flow_label(&c, &KEY), Some(label(&b)));
    assert_ne!(flow_label(&cb, &[1, 2]), Some(label(&b)));
    // Too short, or not IPv6: untouched.
    let mut short = a[..39].to_vec();
    let s = short.clone();
    normalize_ip(&mut short, 1, &KEY);
    assert_eq!(short, s);
    let mut v4 = cb.clone();
    v4[0] = 0x45;
    let v = v4.clone();
    normalize_ip(&mut v4, 1, &KEY);
    assert_eq!(v4, v);
}

proptest! {
    #[test]
    fn normalise_never_breaks_a_syn(
        opts in proptest::collection::vec(any_option(), 0..8),
        payload in proptest::collection::vec(any::<u8>(), 0..32),
        ack in any::<bool>(),
        mode in 0usize..3,
        window in any::<u16>(),
        segments in any::<u16>(),
    ) {
        let csum = ALL_CSUM[mode];
        let mut block: Vec<u8> = opts.concat();
        block.truncate(40);
        block.resize(block.len().div_ceil(4) * 4, 0);
        let flags = tcp_flags::SYN | if ack { tcp_flags::ACK } else { 0 };
        let mut p = packet(flags, &block, &payload, csum);
        p[54..56].copy_from_slice(&window.to_be_bytes());
        let mut p = packet_with_csum(p, csum);
        let before = p.clone();
        match normalize_syn(&mut p, &POLICY, segments, csum) {
            Err(_) => prop_assert_eq!(&p, &before),
            Ok(_) => {
                p = before.clone();
                normalize_ok(&mut p, segments, csum);
                if segments == u16::MAX {
                    prop_assert_eq!(window_of(&p), window);
                }
                let ip = Ipv6Packet::new_checked(&p[..]).unwrap();
                let tcp = TcpPacket::new_checked(ip.payload()).unwrap();
                prop_assert_eq!(tcp.payload(), &payload[..]);
                prop_assert!(tcp.options().len() <= block.len());
            }
        }
    }
}
