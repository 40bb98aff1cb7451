//! Neighbour Discovery (RFC 4861 §4.3, §4.4) as far as the gateway needs it:
//!
//! * a Neighbour Solicitation **emitter** for priming the on-link next hop with a new hashed
//!   address (001 §4.2; docs/PROTOCOL.md §5.1);
//! * a **duplicate address probe** (RFC 4862 §5.4.2: a solicitation from the unspecified address
//!   to the target's solicited-node group, no options) as a whole Ethernet frame, because the
//!   daemon binds hashed addresses with `nodad` and probes them itself (docs/PROTOCOL.md §5.2);
//! * a checked **parser** of received Ethernet frames carrying a solicitation or an
//!   advertisement, which tells who (by link-layer address) claims which target address.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Type 135/136  |    Code 0     |          Checksum             |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  Reserved (NS); R|S|O flags and reserved (NA)                 |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                       Target Address (16)                     |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Type 1 SLLA / 2 TLLA | Length 1 |  Link-layer address (6) ... |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! A receiver that is the target of a solicitation creates or updates an entry for its source
//! with the source link-layer address, in state STALE (RFC 4861 §7.2.3): usable at once,
//! confirmed by unicast probes later. Every ND message leaves with hop limit 255 (§7.1), and a
//! receiver drops others (§7.1.1, §7.1.2), as the parser here does.

use std::net::Ipv6Addr;

use super::{
    read_u16, upper_layer_checksum, Ipv6Packet, Ipv6Repr, WireError, IPV6_HEADER_LEN,
    NEXT_HEADER_ICMPV6,
};

const WHAT: &str = "neighbour discovery frame";

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: Range<usize> = 2..4;
    pub const TARGET: Range<usize> = 8..24;
    pub const OPT_TYPE: usize = 24;
    pub const OPT_LEN: usize = 25;
    pub const OPT_LLADDR: Range<usize> = 26..32;
}

/// Bytes of a Neighbour Solicitation with a source link-layer address option (Ethernet).
pub const NEIGHBOR_SOLICITATION_LEN: usize = 32;
/// ICMPv6 type of a Neighbour Solicitation.
pub const NEIGHBOR_SOLICITATION: u8 = 135;
/// ICMPv6 type of a Neighbour Advertisement.
pub const NEIGHBOR_ADVERTISEMENT: u8 = 136;
/// Option type: source link-layer address (also in router discovery messages).
pub(super) const OPT_SOURCE_LLADDR: u8 = 1;
/// Option type: target link-layer address.
const OPT_TARGET_LLADDR: u8 = 2;
/// Bytes of a solicitation or advertisement before its options.
const ND_FIXED_LEN: usize = 24;
/// Ethernet header: destination (6), source (6), EtherType (2).
pub const ETHERNET_HEADER_LEN: usize = 14;
const ETHERTYPE_IPV6: u16 = 0x86dd;
/// Bytes of a duplicate address probe frame: Ethernet, IPv6, a solicitation without options.
pub const DAD_PROBE_FRAME_LEN: usize = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + ND_FIXED_LEN;

/// The ICMPv6 part of a Neighbour Solicitation for `target` carrying `mac` as source link-layer
/// address. The checksum is left 0: it covers the IPv6 source, which the sending socket picks
/// (and the kernel fills in the checksum of raw ICMPv6 sockets, RFC 3542 §3.1).
pub fn neighbor_solicitation(target: Ipv6Addr, mac: [u8; 6]) -> [u8; NEIGHBOR_SOLICITATION_LEN] {
    let mut m = [0u8; NEIGHBOR_SOLICITATION_LEN];
    m[field::TYPE] = NEIGHBOR_SOLICITATION;
    m[field::TARGET].copy_from_slice(&target.octets());
    m[field::OPT_TYPE] = OPT_SOURCE_LLADDR;
    m[field::OPT_LEN] = 1; // in units of 8 bytes
    m[field::OPT_LLADDR].copy_from_slice(&mac);
    m
}

/// The solicited-node multicast group of `addr` (RFC 4291 §2.7.1): ff02::1:ffXX:XXXX with the
/// address's low 24 bits.
pub fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | u16::from(o[13]),
        u16::from_be_bytes([o[14], o[15]]),
    )
}

/// A duplicate address probe for `target` as a whole Ethernet frame from `src_mac` (RFC 4862
/// §5.4.2): IPv6 source unspecified, destination the target's solicited-node group (Ethernet
/// 33:33 + its low 32 bits, RFC 2464 §7), hop limit 255, a solicitation with no option (a probe
/// must not carry a source link-layer address) and its checksum. A node that holds `target`
/// answers with an advertisement to all nodes; one that is probing it too sees a duplicate.
pub fn dad_probe_frame(target: Ipv6Addr, src_mac: [u8; 6]) -> [u8; DAD_PROBE_FRAME_LEN] {
    let group = solicited_node(target);
    let mut f = [0u8; DAD_PROBE_FRAME_LEN];
    let g = group.octets();
    f[..6].copy_from_slice(&[0x33, 0x33, g[12], g[13], g[14], g[15]]);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let repr = Ipv6Repr {
        traffic_class: 0,
        flow_label: 0,
        payload_len: ND_FIXED_LEN as u16,
        next_header: NEXT_HEADER_ICMPV6,
        hop_limit: 255,
        src_addr: Ipv6Addr::UNSPECIFIED,
        dst_addr: group,
    };
    let ip = &mut f[ETHERNET_HEADER_LEN..];
    // The slice is exactly header + 24 bytes long, so emit cannot run out of room.
    if repr.emit(ip).is_ok() {
        let icmp = &mut ip[IPV6_HEADER_LEN..];
        icmp[field::TYPE] = NEIGHBOR_SOLICITATION;
        icmp[field::TARGET].copy_from_slice(&target.octets());
        let sum = upper_layer_checksum(
            Ipv6Addr::UNSPECIFIED,
            group,
            NEXT_HEADER_ICMPV6,
            &icmp[..ND_FIXED_LEN],
        );
        icmp[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }
    f
}

/// Bytes of a confirmation probe frame: Ethernet, IPv6, a solicitation with an SLLA option.
pub const CONFIRMATION_PROBE_FRAME_LEN: usize =
    ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + NEIGHBOR_SOLICITATION_LEN;
/// Solicited flag of an advertisement (RFC 4861 §4.4), in its first flags byte.
const NA_FLAG_SOLICITED: u8 = 0x40;

/// A **confirmation probe** (docs/PROTOCOL.md §5.2): a unicast Neighbour Solicitation for
/// `target` sent only to the node that claimed it (Ethernet destination `to_mac`), from our
/// link-local address `src` and MAC `src_mac` with a source link-layer option, IPv6 destination
/// `target` itself, hop limit 255. A node that really holds `target` answers with a *solicited*
/// advertisement unicast to `src` (RFC 4861 §7.2.4); a node that only sends forged frames does
/// not, and one that answers is, for the link, a holder. An unsolicited flood of advertisements
/// (Solicited flag clear, or to all nodes) never confirms.
pub fn confirmation_probe_frame(
    target: Ipv6Addr,
    src: Ipv6Addr,
    src_mac: [u8; 6],
    to_mac: [u8; 6],
) -> [u8; CONFIRMATION_PROBE_FRAME_LEN] {
    let mut f = [0u8; CONFIRMATION_PROBE_FRAME_LEN];
    f[..6].copy_from_slice(&to_mac);
    f[6..12].copy_from_slice(&src_mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let repr = Ipv6Repr {
        traffic_class: 0,
        flow_label: 0,
        payload_len: NEIGHBOR_SOLICITATION_LEN as u16,
        next_header: NEXT_HEADER_ICMPV6,
        hop_limit: 255,
        src_addr: src,
        dst_addr: target,
    };
    let ip = &mut f[ETHERNET_HEADER_LEN..];
    // The slice is exactly header + 32 bytes long, so emit cannot run out of room.
    if repr.emit(ip).is_ok() {
        let icmp = &mut ip[IPV6_HEADER_LEN..];
        icmp.copy_from_slice(&neighbor_solicitation(target, src_mac));
        let sum = upper_layer_checksum(src, target, NEXT_HEADER_ICMPV6, icmp);
        icmp[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    }
    f
}

/// Bytes of an advertisement frame: Ethernet, IPv6, an advertisement with a target link-layer
/// address option.
pub const ADVERTISEMENT_FRAME_LEN: usize = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + ND_FIXED_LEN + 8;
/// Override flag of an advertisement (RFC 4861 §4.4), in its first flags byte.
const NA_FLAG_OVERRIDE: u8 = 0x20;

/// The **answer to a solicitation** for an address this node serves (RFC 4861 §7.2.4), as a
/// whole Ethernet frame from `own_mac`: the server role answers for its currently valid hashed
/// addresses itself, because a prefix made local as a whole (an AnyIP route) is not resolved
/// by the kernel on the link (docs/ARCHITECTURE.md, "The server role").
///
/// * An address resolution or unreachability check (a solicitation from a unicast address) is
///   answered to its sender, Solicited and Override set, at the link-layer address the
///   solicitation carried (its option, else its Ethernet source).
/// * A duplicate address probe (from `::`) is answered to all nodes (`ff02::1`), Override set,
///   Solicited clear (RFC 4862 §5.4.3: the address is in use, defend it).
///
/// The IPv6 source is the target itself, hop limit 255, with a target link-layer address
/// option. `None` for an advertisement: only solicitations are answered. Whether `ns.target` is
/// ours is the caller's question; this only builds the bytes.
pub fn advertisement_frame(
    ns: &NeighborFrame,
    own_mac: [u8; 6],
) -> Option<[u8; ADVERTISEMENT_FRAME_LEN]> {
    let (dst, to_mac, flags) = match ns.claim {
        NeighborClaim::Advertisement => return None,
        NeighborClaim::Probe => (
            Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
            [0x33, 0x33, 0, 0, 0, 1],
            NA_FLAG_OVERRIDE,
        ),
        NeighborClaim::Resolution => (
            ns.src,
            ns.lladdr.unwrap_or(ns.eth_src),
            NA_FLAG_SOLICITED | NA_FLAG_OVERRIDE,
        ),
    };
    let mut f = [0u8; ADVERTISEMENT_FRAME_LEN];
    f[..6].copy_from_slice(&to_mac);
    f[6..12].copy_from_slice(&own_mac);
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let icmp_len = ND_FIXED_LEN + 8;
    let repr = Ipv6Repr {
        traffic_class: 0,
        flow_label: 0,
        payload_len: icmp_len as u16,
        next_header: NEXT_HEADER_ICMPV6,
        hop_limit: 255,
        src_addr: ns.target,
        dst_addr: dst,
    };
    let ip = &mut f[ETHERNET_HEADER_LEN..];
    // The slice is exactly header + 32 bytes long, so emit cannot run out of room.
    repr.emit(ip).ok()?;
    let icmp = &mut ip[IPV6_HEADER_LEN..];
    icmp[field::TYPE] = NEIGHBOR_ADVERTISEMENT;
    icmp[4] = flags;
    icmp[field::TARGET].copy_from_slice(&ns.target.octets());
    icmp[field::OPT_TYPE] = OPT_TARGET_LLADDR;
    icmp[field::OPT_LEN] = 1;
    icmp[field::OPT_LLADDR].copy_from_slice(&own_mac);
    let sum = upper_layer_checksum(ns.target, dst, NEXT_HEADER_ICMPV6, icmp);
    icmp[field::CHECKSUM].copy_from_slice(&sum.to_be_bytes());
    Some(f)
}

/// What a received solicitation or advertisement says about its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NeighborClaim {
    /// An advertisement: the sender holds `target`.
    Advertisement,
    /// A duplicate address probe (solicitation from the unspecified address): the sender wants
    /// `target`.
    Probe,
    /// An ordinary solicitation (address resolution or unreachability detection): says nothing
    /// about who holds the target.
    Resolution,
}

/// A checked Ethernet frame carrying a Neighbour Solicitation or Advertisement. `parse` checks
/// every length, the EtherType, the IPv6 header, hop limit 255, code 0, the ICMPv6 checksum and
/// the option lengths (RFC 4861 §7.1.1, §7.1.2) before any field is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighborFrame {
    /// Ethernet source address.
    pub eth_src: [u8; 6],
    /// IPv6 source address.
    pub src: Ipv6Addr,
    /// IPv6 destination address.
    pub dst: Ipv6Addr,
    /// The target address.
    pub target: Ipv6Addr,
    /// What the message claims.
    pub claim: NeighborClaim,
    /// An advertisement with the Solicited flag (RFC 4861 §4.4): an answer to a unicast
    /// solicitation, which is how a holder answers a confirmation probe.
    pub solicited: bool,
    /// The link-layer address option (source for a solicitation, target for an advertisement).
    pub lladdr: Option<[u8; 6]>,
}

fn malformed(field: &'static str) -> WireError {
    WireError::Malformed { what: WHAT, field }
}

impl NeighborFrame {
    /// Parses `frame` (from the Ethernet header on; trailing padding allowed).
    pub fn parse(frame: &[u8]) -> Result<NeighborFrame, WireError> {
        let truncated = |need| WireError::Truncated {
            what: WHAT,
            have: frame.len(),
            need,
        };
        if frame.len() < ETHERNET_HEADER_LEN {
            return Err(truncated(ETHERNET_HEADER_LEN));
        }
        if read_u16(frame, 12) != ETHERTYPE_IPV6 {
            return Err(malformed("EtherType"));
        }
        let mut eth_src = [0u8; 6];
        eth_src.copy_from_slice(&frame[6..12]);
        let ip = &frame[ETHERNET_HEADER_LEN..];
        let header = Ipv6Packet::new_checked_header(ip)?;
        let end = IPV6_HEADER_LEN + usize::from(header.payload_len());
        let ip = ip
            .get(..end)
            .ok_or_else(|| truncated(ETHERNET_HEADER_LEN + end))?;
        let ip = Ipv6Packet::new_checked(ip)?;
        if ip.next_header() != NEXT_HEADER_ICMPV6 {
            return Err(malformed("next header"));
        }
        if ip.hop_limit() != 255 {
            return Err(malformed("hop limit"));
        }
        let icmp = ip.payload();
        if icmp.len() < ND_FIXED_LEN {
            return Err(truncated(
                ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + ND_FIXED_LEN,
            ));
        }
        if icmp[field::CODE] != 0 {
            return Err(malformed("code"));
        }
        if upper_layer_checksum(ip.src_addr(), ip.dst_addr(), NEXT_HEADER_ICMPV6, icmp) != 0 {
            return Err(malformed("checksum"));
        }
        let (claim, wanted_option) = match icmp[field::TYPE] {
            NEIGHBOR_ADVERTISEMENT => (NeighborClaim::Advertisement, OPT_TARGET_LLADDR),
            NEIGHBOR_SOLICITATION if ip.src_addr().is_unspecified() => {
                (NeighborClaim::Probe, OPT_SOURCE_LLADDR)
            }
            NEIGHBOR_SOLICITATION => (NeighborClaim::Resolution, OPT_SOURCE_LLADDR),
            _ => return Err(malformed("type")),
        };
        let mut t = [0u8; 16];
        t.copy_from_slice(&icmp[field::TARGET]);
        let target = Ipv6Addr::from(t);
        if target.is_multicast() {
            return Err(malformed("target"));
        }
        // Options: (type, length in 8-byte units, data); a zero length is invalid (§4.6).
        let mut lladdr = None;
        let mut opts = &icmp[ND_FIXED_LEN..];
        while !opts.is_empty() {
            let [kind, units, ..] = *opts else {
                return Err(malformed("option"));
            };
            let len = usize::from(units) * 8;
            if len == 0 || len > opts.len() {
                return Err(malformed("option length"));
            }
            if kind == wanted_option && len == 8 {
                let mut m = [0u8; 6];
                m.copy_from_slice(&opts[2..8]);
                lladdr = Some(m);
            }
            opts = &opts[len..];
        }
        // RFC 4862 §5.4.2: a probe carries no source link-layer address.
        if claim == NeighborClaim::Probe && lladdr.is_some() {
            return Err(malformed("option in probe"));
        }
        Ok(NeighborFrame {
            eth_src,
            src: ip.src_addr(),
            dst: ip.dst_addr(),
            target,
            claim,
            solicited: claim == NeighborClaim::Advertisement && icmp[4] & NA_FLAG_SOLICITED != 0,
            lladdr,
        })
    }

    /// Whether this frame shows another node (not `own_mac`) holding or wanting its target.
    pub fn claimed_by_other(&self, own_mac: [u8; 6]) -> bool {
        match self.claim {
            NeighborClaim::Resolution => false,
            NeighborClaim::Advertisement | NeighborClaim::Probe => {
                self.eth_src != own_mac && self.lladdr.is_none_or(|m| m != own_mac)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    #[test]
    fn solicitation_bytes() {
        let ns = neighbor_solicitation(
            "2001:db8:a::1".parse().unwrap(),
            [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30],
        );
        assert_eq!(
            ns.to_vec(),
            hex("87000000 00000000 20010db8000a00000000000000000001 0101 02005e102030")
        );
    }

    const MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0a];
    const OTHER: [u8; 6] = [0x02, 0, 0, 0, 0, 0x0b];

    fn target() -> Ipv6Addr {
        "2001:db8:a::1234:5678".parse().unwrap()
    }

    #[test]
    fn probe_frame_bytes_and_round_trip() {
        let f = dad_probe_frame(target(), MAC);
        // Ethernet to 33:33:ff:34:56:78, IPv6 :: -> ff02::1:ff34:5678, hop limit 255, NS.
        assert_eq!(
            f.to_vec(),
            hex("3333ff345678 02000000000a 86dd \
                 60000000 0018 3a ff 00000000000000000000000000000000 ff0200000000000000000001ff345678 \
                 87 00 8d8c 00000000 20010db8000a00000000000012345678")
        );
        let p = NeighborFrame::parse(&f).unwrap();
        assert_eq!(p.claim, NeighborClaim::Probe);
        assert_eq!(p.target, target());
        assert_eq!(p.eth_src, MAC);
        assert_eq!(p.lladdr, None);
        assert!(!p.claimed_by_other(MAC), "our own probe is no collision");
        assert!(p.claimed_by_other(OTHER));
    }

    /// An advertisement as Linux sends it in answer to a probe: to all nodes, O flag, TLLA.
    fn advert(eth_src: [u8; 6], tlla: [u8; 6]) -> Vec<u8> {
        advert_to(eth_src, tlla, "ff02::1".parse().unwrap(), 0x20)
    }

    fn advert_to(eth_src: [u8; 6], tlla: [u8; 6], dst: Ipv6Addr, flags: u8) -> Vec<u8> {
        let src: Ipv6Addr = target();
        let mut icmp = vec![0u8; 32];
        icmp[0] = NEIGHBOR_ADVERTISEMENT;
        icmp[4] = flags;
        icmp[8..24].copy_from_slice(&target().octets());
        icmp[24] = OPT_TARGET_LLADDR;
        icmp[25] = 1;
        icmp[26..32].copy_from_slice(&tlla);
        let sum = upper_layer_checksum(src, dst, NEXT_HEADER_ICMPV6, &icmp);
        icmp[2..4].copy_from_slice(&sum.to_be_bytes());
        let mut f = vec![0u8; ETHERNET_HEADER_LEN + IPV6_HEADER_LEN];
        f[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&eth_src);
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        Ipv6Repr {
            traffic_class: 0,
            flow_label: 0,
            payload_len: 32,
            next_header: NEXT_HEADER_ICMPV6,
            hop_limit: 255,
            src_addr: src,
            dst_addr: dst,
        }
        .emit(&mut f[ETHERNET_HEADER_LEN..])
        .unwrap();
        f.extend_from_slice(&icmp);
        f
    }

    #[test]
    fn advertisement_from_another_node_is_a_claim() {
        let f = advert(OTHER, OTHER);
        let p = NeighborFrame::parse(&f).unwrap();
        assert_eq!(p.claim, NeighborClaim::Advertisement);
        assert_eq!(p.lladdr, Some(OTHER));
        assert!(p.claimed_by_other(MAC));
        assert!(!NeighborFrame::parse(&advert(MAC, MAC))
            .unwrap()
            .claimed_by_other(MAC));
        // Trailing Ethernet padding is allowed.
        let mut padded = f.clone();
        padded.extend_from_slice(&[0; 4]);
        assert_eq!(NeighborFrame::parse(&padded).unwrap(), p);
    }

    #[test]
    fn malformed_frames_are_refused() {
        let good = advert(OTHER, OTHER);
        for cut in 0..good.len() {
            assert!(NeighborFrame::parse(&good[..cut]).is_err(), "cut at {cut}");
        }
        let broken = |at: usize, v: u8| {
            let mut f = good.clone();
            f[at] = v;
            NeighborFrame::parse(&f)
        };
        let icmp = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN;
        assert!(broken(12, 0x08).is_err(), "EtherType");
        assert!(broken(ETHERNET_HEADER_LEN + 7, 254).is_err(), "hop limit");
        assert!(broken(icmp + 1, 1).is_err(), "code");
        assert!(broken(icmp + 9, 0xff).is_err(), "checksum");
        assert!(broken(icmp + 25, 0).is_err(), "zero option length");
        assert!(broken(icmp + 25, 2).is_err(), "option past the end");
    }

    #[test]
    fn confirmation_probe_bytes_and_the_answer_it_expects() {
        let ll: Ipv6Addr = "fe80::1".parse().unwrap();
        let f = confirmation_probe_frame(target(), ll, MAC, OTHER);
        // Ethernet unicast to the claimant; IPv6 fe80::1 -> the target; NS with our SLLA.
        assert_eq!(
            f.to_vec(),
            hex("02000000000b 02000000000a 86dd \
                 60000000 0020 3a ff fe800000000000000000000000000001 20010db8000a00000000000012345678 \
                 87 00 4a39 00000000 20010db8000a00000000000012345678 0101 02000000000a")
        );
        let p = NeighborFrame::parse(&f).unwrap();
        assert_eq!(p.claim, NeighborClaim::Resolution, "not a claim of ours");
        assert_eq!((p.src, p.dst, p.lladdr), (ll, target(), Some(MAC)));
        // The holder's answer: solicited, to our link-local address.
        let answer = NeighborFrame::parse(&advert_to(OTHER, OTHER, ll, 0x60)).unwrap();
        assert!(answer.solicited);
        assert_eq!(answer.dst, ll);
        // A flood's advertisement (override only, to all nodes) is not solicited.
        let flood = NeighborFrame::parse(&advert(OTHER, OTHER)).unwrap();
        assert!(!flood.solicited);
    }

    #[test]
    fn a_resolution_is_answered_to_its_sender_solicited_with_our_link_layer_address() {
        let ll: Ipv6Addr = "fe80::b".parse().unwrap();
        // Another node (OTHER, fe80::b) resolves the target: the confirmation probe's shape.
        let ns = NeighborFrame::parse(&confirmation_probe_frame(target(), ll, OTHER, MAC))
            .expect("a solicitation");
        let na = advertisement_frame(&ns, MAC).expect("answered");
        // Ethernet to the solicitation's SLLA; IPv6 target -> fe80::b, hop limit 255; NA with
        // Solicited and Override, the target, our TLLA. The checksum was computed apart (RFC 1071
        // over the pseudo-header and message, in Python).
        assert_eq!(
            na.to_vec(),
            hex("02000000000b 02000000000a 86dd \
                 60000000 0020 3a ff 20010db8000a00000000000012345678 fe80000000000000000000000000000b \
                 88 00 e82e 60000000 20010db8000a00000000000012345678 0201 02000000000a")
        );
        // Our own parser reads it back as what a resolver expects: solicited, from us, for it.
        let back = NeighborFrame::parse(&na).expect("a valid advertisement");
        assert_eq!(back.claim, NeighborClaim::Advertisement);
        assert!(back.solicited);
        assert_eq!((back.src, back.dst, back.target), (target(), ll, target()));
        assert_eq!((back.eth_src, back.lladdr), (MAC, Some(MAC)));
    }

    #[test]
    fn a_duplicate_address_probe_is_answered_to_all_nodes_unsolicited() {
        let ns = NeighborFrame::parse(&dad_probe_frame(target(), OTHER)).expect("a probe");
        let na = advertisement_frame(&ns, MAC).expect("defended");
        let back = NeighborFrame::parse(&na).expect("a valid advertisement");
        assert_eq!(&na[..6], &[0x33, 0x33, 0, 0, 0, 1]);
        assert_eq!(back.dst, "ff02::1".parse::<Ipv6Addr>().unwrap());
        assert!(!back.solicited, "RFC 4862 §5.4.3: not solicited");
        assert_eq!(back.lladdr, Some(MAC));
        // Override is set: the defence replaces a cached entry.
        assert_eq!(
            na[ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + 4],
            NA_FLAG_OVERRIDE
        );
    }

    #[test]
    fn a_solicitation_without_its_option_is_answered_to_its_ethernet_source() {
        let ll: Ipv6Addr = "fe80::b".parse().unwrap();
        let mut f = confirmation_probe_frame(target(), ll, OTHER, MAC).to_vec();
        // Drop the option: payload 24 bytes, checksum over the shorter message.
        f.truncate(ETHERNET_HEADER_LEN + IPV6_HEADER_LEN + ND_FIXED_LEN);
        f[ETHERNET_HEADER_LEN + 4..ETHERNET_HEADER_LEN + 6].copy_from_slice(&24u16.to_be_bytes());
        let icmp = ETHERNET_HEADER_LEN + IPV6_HEADER_LEN;
        f[icmp + 2..icmp + 4].copy_from_slice(&[0, 0]);
        let sum = upper_layer_checksum(ll, target(), NEXT_HEADER_ICMPV6, &f[icmp..]);
        f[icmp + 2..icmp + 4].copy_from_slice(&sum.to_be_bytes());
        let ns = NeighborFrame::parse(&f).expect("a solicitation without options");
        assert_eq!(ns.lladdr, None);
        let na = advertisement_frame(&ns, MAC).expect("answered");
        assert_eq!(&na[..6], &OTHER, "the Ethernet source it came from");
    }

    #[test]
    fn an_advertisement_is_never_answered() {
        let na = NeighborFrame::parse(&advert(OTHER, OTHER)).expect("an advertisement");
        assert_eq!(advertisement_frame(&na, MAC), None);
    }
}
