//! The TCP header (RFC 9293 §3.1) as carried directly in an IPv6 payload (RFC 8200 §8.1).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |          Source Port          |       Destination Port        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                        Sequence Number                        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                    Acknowledgment Number                      |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |  Data |       |C|E|U|A|P|R|S|F|                               |
//! | Offset| Rsrvd |W|C|R|C|S|S|Y|I|            Window             |
//! |       |       |R|E|G|K|H|T|N|N|                               |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |           Checksum            |         Urgent Pointer        |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                    [Options]  (data offset * 4 - 20 bytes)    |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! MT6D does not terminate TCP; the gateway reads and rewrites headers of TCP segments it tunnels
//! (identity scrubbing, MSS clamping: `crate::scrub`). Options are read by `crate::scrub::TcpOptions`.

use std::net::Ipv6Addr;

use super::{read_u16, read_u32, upper_layer_checksum, WireError, NEXT_HEADER_TCP};

mod field {
    use std::ops::Range;
    pub const SRC_PORT: Range<usize> = 0..2;
    pub const DST_PORT: Range<usize> = 2..4;
    pub const SEQ: Range<usize> = 4..8;
    pub const ACK: Range<usize> = 8..12;
    pub const DATA_OFFSET: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: Range<usize> = 14..16;
    pub const CHECKSUM: Range<usize> = 16..18;
    pub const URGENT: Range<usize> = 18..20;
}

/// Length of the TCP header without options.
pub const TCP_HEADER_LEN: usize = 20;
/// Largest TCP header (data offset 15): 40 bytes of options.
pub const TCP_MAX_HEADER_LEN: usize = 60;
/// Offset of the checksum field in the TCP header.
pub const TCP_CHECKSUM_OFFSET: usize = field::CHECKSUM.start;
const WHAT: &str = "TCP";

/// TCP flag bits of header byte 13 (RFC 9293 §3.1, RFC 3168 for ECE/CWR).
#[allow(missing_docs)]
pub mod flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
    pub const URG: u8 = 0x20;
    pub const ECE: u8 = 0x40;
    pub const CWR: u8 = 0x80;
}

/// A view of a TCP segment (header, options, payload).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TcpPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> TcpPacket<T> {
    /// Checks a segment: at least 20 bytes, data offset >= 5, and the header the data offset
    /// announces fits in the buffer. The segment is the whole buffer (the IPv6 payload).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < TCP_HEADER_LEN {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need: TCP_HEADER_LEN,
            });
        }
        let p = Self { buffer };
        let hl = p.header_len();
        if hl < TCP_HEADER_LEN {
            return Err(WireError::Malformed {
                what: WHAT,
                field: "data offset",
            });
        }
        if have < hl {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need: hl,
            });
        }
        Ok(p)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
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
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        read_u32(self.b(), field::SEQ.start)
    }
    /// Acknowledgment number.
    pub fn ack(&self) -> u32 {
        read_u32(self.b(), field::ACK.start)
    }
    /// Header length in bytes (data offset * 4): 0..=60, at least 20 once checked.
    pub fn header_len(&self) -> usize {
        usize::from(self.b()[field::DATA_OFFSET] >> 4) * 4
    }
    /// The flag byte (see [`flags`]).
    pub fn flags(&self) -> u8 {
        self.b()[field::FLAGS]
    }
    /// True if SYN is set.
    pub fn syn(&self) -> bool {
        self.flags() & flags::SYN != 0
    }
    /// Window.
    pub fn window(&self) -> u16 {
        read_u16(self.b(), field::WINDOW.start)
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.b(), field::CHECKSUM.start)
    }
    /// Urgent pointer.
    pub fn urgent(&self) -> u16 {
        read_u16(self.b(), field::URGENT.start)
    }
    /// The options area (header bytes 20..header_len).
    pub fn options(&self) -> &[u8] {
        &self.b()[TCP_HEADER_LEN..self.header_len()]
    }
    /// The payload (bytes after the header).
    pub fn payload(&self) -> &[u8] {
        &self.b()[self.header_len()..]
    }
    /// True if the checksum verifies over the whole segment.
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        upper_layer_checksum(src, dst, NEXT_HEADER_TCP, self.b()) == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> TcpPacket<T> {
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, c: u16) {
        self.buffer.as_mut()[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
    }
    /// Mutable options area.
    pub fn options_mut(&mut self) -> &mut [u8] {
        let hl = self.header_len();
        &mut self.buffer.as_mut()[TCP_HEADER_LEN..hl]
    }
}

/// An owned TCP header without options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TcpRepr {
    /// Source port.
    pub src_port: u16,
    /// Destination port.
    pub dst_port: u16,
    /// Sequence number.
    pub seq: u32,
    /// Acknowledgment number.
    pub ack: u32,
    /// Flag byte.
    pub flags: u8,
    /// Window.
    pub window: u16,
    /// Urgent pointer.
    pub urgent: u16,
}

impl TcpRepr {
    /// Reads the fixed header of a checked segment (options are read with `scrub::TcpOptions`).
    pub fn parse<T: AsRef<[u8]>>(p: &TcpPacket<T>) -> Self {
        Self {
            src_port: p.src_port(),
            dst_port: p.dst_port(),
            seq: p.seq(),
            ack: p.ack(),
            flags: p.flags(),
            window: p.window(),
            urgent: p.urgent(),
        }
    }
    /// Header bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        TCP_HEADER_LEN
    }
    /// Writes a header with data offset 5 into `buf[..20]` for a segment of `buf.len()` bytes whose
    /// payload is already in `buf[20..]`, with the checksum computed over `src`/`dst`.
    pub fn emit(&self, buf: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr) -> Result<(), WireError> {
        if buf.len() < TCP_HEADER_LEN {
            return Err(WireError::BufferTooSmall {
                have: buf.len(),
                need: TCP_HEADER_LEN,
            });
        }
        buf[field::SRC_PORT].copy_from_slice(&self.src_port.to_be_bytes());
        buf[field::DST_PORT].copy_from_slice(&self.dst_port.to_be_bytes());
        buf[field::SEQ].copy_from_slice(&self.seq.to_be_bytes());
        buf[field::ACK].copy_from_slice(&self.ack.to_be_bytes());
        buf[field::DATA_OFFSET] = 5 << 4;
        buf[field::FLAGS] = self.flags;
        buf[field::WINDOW].copy_from_slice(&self.window.to_be_bytes());
        buf[field::CHECKSUM].copy_from_slice(&[0, 0]);
        buf[field::URGENT].copy_from_slice(&self.urgent.to_be_bytes());
        let c = upper_layer_checksum(src, dst, NEXT_HEADER_TCP, buf);
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

    // 1234 -> 80, seq 1, ack 0, data offset 6, SYN, window 65535, MSS 1440 option, no payload.
    const SYN: &str = "04d2 0050 00000001 00000000 60 02 ffff 0000 0000 020405a0";

    #[test]
    fn decode() {
        let b = hex(SYN);
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(
            TcpRepr::parse(&p),
            TcpRepr {
                src_port: 1234,
                dst_port: 80,
                seq: 1,
                ack: 0,
                flags: flags::SYN,
                window: 0xffff,
                urgent: 0
            }
        );
        assert_eq!(p.header_len(), 24);
        assert!(p.syn());
        assert_eq!(p.options(), &hex("020405a0")[..]);
        assert!(p.payload().is_empty());
    }

    #[test]
    fn encode_and_checksum() {
        let (s, d) = addrs();
        let mut b = hex("0000000000000000000000000000000000000000 68656c6c6f");
        let r = TcpRepr {
            src_port: 1234,
            dst_port: 80,
            seq: 7,
            ack: 9,
            flags: flags::ACK | flags::PSH,
            window: 512,
            urgent: 0,
        };
        r.emit(&mut b, s, d).unwrap();
        let p = TcpPacket::new_checked(&b[..]).unwrap();
        assert_eq!(TcpRepr::parse(&p), r);
        assert_eq!(p.payload(), b"hello");
        assert!(p.verify_checksum(s, d));
        assert!(!p.verify_checksum(d, "2001:db8::3".parse().unwrap()));
        assert!(r.emit(&mut [0u8; 19], s, d).is_err());
    }

    #[test]
    fn truncated_and_malformed() {
        let b = hex(SYN);
        for n in 0..TCP_HEADER_LEN {
            assert!(matches!(
                TcpPacket::new_checked(&b[..n]),
                Err(WireError::Truncated { .. })
            ));
        }
        // Data offset 6 needs 24 bytes.
        assert!(matches!(
            TcpPacket::new_checked(&b[..23]),
            Err(WireError::Truncated { need: 24, .. })
        ));
        // Data offset 4 and 0 are below the fixed header.
        for off in [0u8, 0x40] {
            let mut m = b.clone();
            m[12] = off;
            assert!(matches!(
                TcpPacket::new_checked(&m[..]),
                Err(WireError::Malformed { .. })
            ));
        }
        // Data offset 15 with 24 bytes.
        let mut m = b.clone();
        m[12] = 0xf0;
        assert!(TcpPacket::new_checked(&m[..]).is_err());
    }
}
