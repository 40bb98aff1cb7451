//! The fixed IPv6 header (RFC 8200 §3).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |Version| Traffic Class |           Flow Label                  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |         Payload Length        |  Next Header  |   Hop Limit   |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                Source Address (16 bytes)                      |
//! |                Destination Address (16 bytes)                 |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! Bytes 0..8 are what the MT6D tunnel carries (000 §2.6, Fig. 2.5); 8..40 are the addresses it drops.

use std::net::Ipv6Addr;

use super::{read_u16, WireError};

mod field {
    use std::ops::Range;
    pub const VER_TC_FLOW: Range<usize> = 0..4;
    pub const PAYLOAD_LEN: Range<usize> = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// Length of the fixed IPv6 header.
pub const IPV6_HEADER_LEN: usize = 40;
/// Where an IPv6 header's source address lies, for code that looks at a packet's addresses
/// before (or without) checking the rest of it; [`Ipv6Packet`] is the checked view.
pub const IPV6_SRC_ADDR: std::ops::Range<usize> = field::SRC;
/// Where an IPv6 header's destination address lies (see [`IPV6_SRC_ADDR`]).
pub const IPV6_DST_ADDR: std::ops::Range<usize> = field::DST;

/// The source and destination address bytes of an IPv6 packet, checking only that the header's
/// addresses are there: what a data plane keys its peers by before parsing anything else.
#[inline]
pub fn address_bytes(packet: &[u8]) -> Option<(&[u8; 16], &[u8; 16])> {
    let src = packet.get(field::SRC)?.try_into().ok()?;
    let dst = packet.get(field::DST)?.try_into().ok()?;
    Some((src, dst))
}
/// Next Header value for TCP.
pub const NEXT_HEADER_TCP: u8 = 6;
/// Next Header value for UDP.
pub const NEXT_HEADER_UDP: u8 = 17;
/// Next Header value for ICMPv6.
pub const NEXT_HEADER_ICMPV6: u8 = 58;
/// Next Header value "No Next Header".
pub const NEXT_HEADER_NONE: u8 = 59;

const WHAT: &str = "IPv6";

/// A view of an IPv6 packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ipv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Ipv6Packet<T> {
    /// Checks a complete packet: at least 40 bytes, version 6, and exactly `40 + payload length`
    /// bytes (jumbograms, payload length 0 with a hop-by-hop option, are not supported).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_checked_header(buffer)?;
        let need = IPV6_HEADER_LEN + usize::from(p.payload_len());
        let have = p.buffer.as_ref().len();
        if have < need {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need,
            });
        }
        if have > need {
            return Err(WireError::Malformed {
                what: WHAT,
                field: "payload length",
            });
        }
        Ok(p)
    }

    /// Checks only the fixed header (40 bytes, version 6): for packets quoted in ICMPv6 errors,
    /// which may be cut short. `payload()` then returns the bytes present, at most `payload_len`.
    pub fn new_checked_header(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < IPV6_HEADER_LEN {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need: IPV6_HEADER_LEN,
            });
        }
        if buffer.as_ref()[0] >> 4 != 6 {
            return Err(WireError::Malformed {
                what: WHAT,
                field: "version",
            });
        }
        Ok(Self { buffer })
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Traffic class.
    pub fn traffic_class(&self) -> u8 {
        (self.b()[0] << 4) | (self.b()[1] >> 4)
    }
    /// Flow label (20 bits).
    pub fn flow_label(&self) -> u32 {
        let b = self.b();
        (u32::from(b[1] & 0x0f) << 16) | (u32::from(b[2]) << 8) | u32::from(b[3])
    }
    /// Payload length field.
    pub fn payload_len(&self) -> u16 {
        read_u16(self.b(), field::PAYLOAD_LEN.start)
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.b()[field::NEXT_HEADER]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.b()[field::HOP_LIMIT]
    }
    /// Source address.
    pub fn src_addr(&self) -> Ipv6Addr {
        addr(&self.b()[field::SRC])
    }
    /// Destination address.
    pub fn dst_addr(&self) -> Ipv6Addr {
        addr(&self.b()[field::DST])
    }
    /// The first 8 header bytes (everything but the addresses).
    pub fn header_without_addrs(&self) -> &[u8] {
        &self.b()[field::VER_TC_FLOW.start..field::SRC.start]
    }
    /// The payload bytes present (all of them for `new_checked`, possibly fewer for a quote).
    pub fn payload(&self) -> &[u8] {
        let b = self.b();
        let end = (IPV6_HEADER_LEN + usize::from(self.payload_len())).min(b.len());
        &b[IPV6_HEADER_LEN..end]
    }
}

impl<'a> Ipv6Packet<&'a [u8]> {
    /// The payload bytes present, borrowed for the buffer's lifetime.
    pub fn into_payload(self) -> &'a [u8] {
        let end = (IPV6_HEADER_LEN + usize::from(self.payload_len())).min(self.buffer.len());
        &self.buffer[IPV6_HEADER_LEN..end]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Ipv6Packet<T> {
    /// Sets the source address.
    pub fn set_src_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&a.octets());
    }
    /// Sets the destination address.
    pub fn set_dst_addr(&mut self, a: Ipv6Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&a.octets());
    }
    /// Sets the hop limit.
    pub fn set_hop_limit(&mut self, h: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = h;
    }
    /// Mutable payload (bytes present).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = (IPV6_HEADER_LEN + usize::from(self.payload_len())).min(self.b().len());
        &mut self.buffer.as_mut()[IPV6_HEADER_LEN..end]
    }
}

fn addr(b: &[u8]) -> Ipv6Addr {
    let mut o = [0u8; 16];
    o.copy_from_slice(b);
    Ipv6Addr::from(o)
}

/// An owned IPv6 fixed header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Repr {
    /// Traffic class.
    pub traffic_class: u8,
    /// Flow label (low 20 bits used).
    pub flow_label: u32,
    /// Payload length.
    pub payload_len: u16,
    /// Next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Source.
    pub src_addr: Ipv6Addr,
    /// Destination.
    pub dst_addr: Ipv6Addr,
}

impl Ipv6Repr {
    /// Reads the header of a checked packet.
    pub fn parse<T: AsRef<[u8]>>(p: &Ipv6Packet<T>) -> Self {
        Self {
            traffic_class: p.traffic_class(),
            flow_label: p.flow_label(),
            payload_len: p.payload_len(),
            next_header: p.next_header(),
            hop_limit: p.hop_limit(),
            src_addr: p.src_addr(),
            dst_addr: p.dst_addr(),
        }
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        IPV6_HEADER_LEN
    }
    /// Writes all 40 header bytes at the start of `buf`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), WireError> {
        let Some(b) = buf.get_mut(..IPV6_HEADER_LEN) else {
            return Err(WireError::BufferTooSmall {
                have: buf.len(),
                need: IPV6_HEADER_LEN,
            });
        };
        let vtf =
            (6u32 << 28) | (u32::from(self.traffic_class) << 20) | (self.flow_label & 0xf_ffff);
        b[field::VER_TC_FLOW].copy_from_slice(&vtf.to_be_bytes());
        b[field::PAYLOAD_LEN].copy_from_slice(&self.payload_len.to_be_bytes());
        b[field::NEXT_HEADER] = self.next_header;
        b[field::HOP_LIMIT] = self.hop_limit;
        b[field::SRC].copy_from_slice(&self.src_addr.octets());
        b[field::DST].copy_from_slice(&self.dst_addr.octets());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::hex;
    use super::*;

    // Version 6, TC 0xb8, flow 0x12345, payload 4, next header UDP, hop limit 64,
    // 2001:db8::1 -> 2001:db8::2, payload de ad be ef.
    const PACKET: &str = "6b812345 0004 11 40
        20010db8000000000000000000000001 20010db8000000000000000000000002 deadbeef";

    fn repr() -> Ipv6Repr {
        Ipv6Repr {
            traffic_class: 0xb8,
            flow_label: 0x12345,
            payload_len: 4,
            next_header: NEXT_HEADER_UDP,
            hop_limit: 64,
            src_addr: "2001:db8::1".parse().unwrap(),
            dst_addr: "2001:db8::2".parse().unwrap(),
        }
    }

    #[test]
    fn decode() {
        let bytes = hex(PACKET);
        let p = Ipv6Packet::new_checked(&bytes[..]).unwrap();
        assert_eq!(Ipv6Repr::parse(&p), repr());
        assert_eq!(p.payload(), &[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(p.header_without_addrs(), &bytes[..8]);
    }

    #[test]
    fn encode() {
        let mut buf = vec![0xffu8; 44];
        repr().emit(&mut buf).unwrap();
        buf[40..].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        assert_eq!(buf, hex(PACKET));
        assert!(repr().emit(&mut [0u8; 39]).is_err());
    }

    #[test]
    fn truncated_and_malformed() {
        let bytes = hex(PACKET);
        for n in 0..bytes.len() {
            assert!(Ipv6Packet::new_checked(&bytes[..n]).is_err(), "{n}");
        }
        // A quote may be cut anywhere after the header.
        let q = Ipv6Packet::new_checked_header(&bytes[..42]).unwrap();
        assert_eq!(q.payload(), &[0xde, 0xad]);
        let mut long = bytes.clone();
        long.push(0);
        assert!(matches!(
            Ipv6Packet::new_checked(&long[..]),
            Err(WireError::Malformed { .. })
        ));
        let mut v4 = bytes.clone();
        v4[0] = 0x45;
        assert!(matches!(
            Ipv6Packet::new_checked(&v4[..]),
            Err(WireError::Malformed {
                field: "version",
                ..
            })
        ));
    }

    #[test]
    fn setters() {
        let mut bytes = hex(PACKET);
        let mut p = Ipv6Packet::new_checked(&mut bytes[..]).unwrap();
        p.set_src_addr("2001:db8::9".parse().unwrap());
        p.set_dst_addr("2001:db8::8".parse().unwrap());
        p.set_hop_limit(1);
        p.payload_mut()[0] = 0;
        assert_eq!(p.src_addr(), "2001:db8::9".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.dst_addr(), "2001:db8::8".parse::<Ipv6Addr>().unwrap());
        assert_eq!(p.hop_limit(), 1);
        assert_eq!(p.payload()[0], 0);
    }
}
