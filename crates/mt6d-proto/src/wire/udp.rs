//! The UDP header (RFC 768; checksum mandatory over IPv6, RFC 8200 §8.1).
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  Source Port    |   Dest Port     |
//! +--------+--------+--------+--------+
//! |     Length      |    Checksum     |
//! +--------+--------+--------+--------+
//! ```
//! MT6D carries its tunnel payload in UDP (000 §2.6.1).

use std::net::Ipv6Addr;

use super::{read_u16, upper_layer_checksum, WireError, NEXT_HEADER_UDP};

mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const LENGTH: Range<usize> = 4..6;
    pub const CHECKSUM: Range<usize> = 6..8;
}

/// Length of the UDP header.
pub const UDP_HEADER_LEN: usize = 8;
const WHAT: &str = "UDP";

/// A view of a UDP datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UdpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdpPacket<T> {
    /// Checks a complete datagram: 8..=len bytes, length field >= 8 and == buffer length.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let p = Self::new_checked_header(buffer)?;
        let have = p.buffer.as_ref().len();
        let need = usize::from(p.len());
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
                field: "length",
            });
        }
        Ok(p)
    }

    /// Checks only the header (8 bytes, length field >= 8): for datagrams quoted in ICMPv6 errors.
    pub fn new_checked_header(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < UDP_HEADER_LEN {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need: UDP_HEADER_LEN,
            });
        }
        let p = Self { buffer };
        if usize::from(p.len()) < UDP_HEADER_LEN {
            return Err(WireError::Malformed {
                what: WHAT,
                field: "length",
            });
        }
        Ok(p)
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        read_u16(self.b(), field::SRC_PORT.start)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        read_u16(self.b(), field::DST_PORT.start)
    }
    /// Length field (header + payload).
    pub fn len(&self) -> u16 {
        read_u16(self.b(), field::LENGTH.start)
    }
    /// True if the length field says there is no payload.
    pub fn is_empty(&self) -> bool {
        usize::from(self.len()) == UDP_HEADER_LEN
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.b(), field::CHECKSUM.start)
    }
    /// Payload bytes present (at most `len - 8`).
    pub fn payload(&self) -> &[u8] {
        let b = self.b();
        &b[UDP_HEADER_LEN..usize::from(self.len()).min(b.len())]
    }
    /// True if the checksum verifies over the complete datagram (zero is invalid over IPv6).
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        self.checksum() != 0 && upper_layer_checksum(src, dst, NEXT_HEADER_UDP, self.b()) == 0
    }
}

impl<'a> UdpPacket<&'a [u8]> {
    /// The payload bytes present, borrowed for the buffer's lifetime.
    pub fn into_payload(self) -> &'a [u8] {
        &self.buffer[UDP_HEADER_LEN..usize::from(self.len()).min(self.buffer.len())]
    }
}

/// An owned UDP header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct UdpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
}

impl UdpRepr {
    /// Reads a checked datagram's ports.
    pub fn parse<T: AsRef<[u8]>>(p: &UdpPacket<T>) -> Self {
        Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
        }
    }
    /// Header bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        UDP_HEADER_LEN
    }
    /// Writes the header into `buf[..8]` for a datagram of `buf.len()` bytes whose payload is already
    /// in `buf[8..]`, with the checksum computed over `src`/`dst`.
    pub fn emit(&self, buf: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr) -> Result<(), WireError> {
        if buf.len() < UDP_HEADER_LEN {
            return Err(WireError::BufferTooSmall {
                have: buf.len(),
                need: UDP_HEADER_LEN,
            });
        }
        let Ok(len) = u16::try_from(buf.len()) else {
            return Err(WireError::Malformed {
                what: WHAT,
                field: "length",
            });
        };
        buf[field::SRC_PORT].copy_from_slice(&self.src_port.to_be_bytes());
        buf[field::DST_PORT].copy_from_slice(&self.dst_port.to_be_bytes());
        buf[field::LENGTH].copy_from_slice(&len.to_be_bytes());
        buf[field::CHECKSUM].copy_from_slice(&[0, 0]);
        let mut c = upper_layer_checksum(src, dst, NEXT_HEADER_UDP, buf);
        if c == 0 {
            c = 0xffff; // RFC 768: a computed zero is sent as all ones.
        }
        buf[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::hex;
    use super::*;

    fn addrs() -> (Ipv6Addr, Ipv6Addr) {
        (
            "2001:db8::1".parse().unwrap(),
            "2001:db8::2".parse().unwrap(),
        )
    }

    #[test]
    fn encode_decode() {
        let (s, d) = addrs();
        let mut buf = hex("0000000000000000 68656c6c6f"); // "hello"
        UdpRepr {
            src_port: 1234,
            dst_port: 53,
        }
        .emit(&mut buf, s, d)
        .unwrap();
        assert_eq!(&buf[..6], &hex("04d2 0035 000d")[..]);
        let p = UdpPacket::new_checked(&buf[..]).unwrap();
        assert_eq!(
            UdpRepr::parse(&p),
            UdpRepr {
                src_port: 1234,
                dst_port: 53
            }
        );
        assert_eq!(p.payload(), b"hello");
        assert!(p.verify_checksum(s, d));
        assert!(!p.verify_checksum(d, "2001:db8::3".parse().unwrap()));
    }

    #[test]
    fn truncated_and_malformed() {
        let buf = hex("04d2 0035 000d 0000 68656c6c6f");
        for n in 0..buf.len() {
            assert!(UdpPacket::new_checked(&buf[..n]).is_err());
        }
        assert_eq!(
            UdpPacket::new_checked_header(&buf[..10]).unwrap().payload(),
            b"he"
        );
        assert!(UdpPacket::new_checked(&hex("04d2 0035 0007 0000")[..]).is_err());
        assert!(UdpPacket::new_checked(&hex("04d2 0035 0008 0000 00")[..]).is_err());
    }
}
