//! ICMPv6 messages (RFC 4443 §2.1), with the error types MT6D translates (000 §2.6.3, §3.2.3).
//!
//! ```text
//! +--------+--------+--------+--------+
//! |  Type  |  Code  |    Checksum     |
//! +--------+--------+--------+--------+
//! |  Data (MTU / pointer / unused)    |
//! +--------+--------+--------+--------+
//! |  Invoking packet (errors) ...     |
//! ```

use std::net::Ipv6Addr;

use super::{read_u16, read_u32, upper_layer_checksum, WireError, NEXT_HEADER_ICMPV6};

mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: std::ops::Range<usize> = 2..4;
    pub const DATA: std::ops::Range<usize> = 4..8;
}

/// Length of the ICMPv6 header including the 4-byte data field errors always carry.
pub const ICMPV6_HEADER_LEN: usize = 8;
const WHAT: &str = "ICMPv6";

/// ICMPv6 message types this crate names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Icmpv6Type {
    /// 1, Destination Unreachable.
    DestinationUnreachable,
    /// 2, Packet Too Big (data = MTU).
    PacketTooBig,
    /// 3, Time Exceeded.
    TimeExceeded,
    /// 4, Parameter Problem (data = pointer).
    ParameterProblem,
    /// Any other type.
    Other(u8),
}

impl Icmpv6Type {
    /// From the type byte.
    pub fn from_u8(v: u8) -> Self {
        match v {
            1 => Self::DestinationUnreachable,
            2 => Self::PacketTooBig,
            3 => Self::TimeExceeded,
            4 => Self::ParameterProblem,
            v => Self::Other(v),
        }
    }
    /// The type byte.
    pub fn to_u8(self) -> u8 {
        match self {
            Self::DestinationUnreachable => 1,
            Self::PacketTooBig => 2,
            Self::TimeExceeded => 3,
            Self::ParameterProblem => 4,
            Self::Other(v) => v,
        }
    }
    /// True for error messages (types 0..=127, RFC 4443 §2.1).
    pub fn is_error(self) -> bool {
        self.to_u8() < 128
    }
}

/// A view of an ICMPv6 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Icmpv6Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Icmpv6Packet<T> {
    /// Checks that the 8-byte header is present.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let have = buffer.as_ref().len();
        if have < ICMPV6_HEADER_LEN {
            return Err(WireError::Truncated {
                what: WHAT,
                have,
                need: ICMPV6_HEADER_LEN,
            });
        }
        Ok(Self { buffer })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// Message type.
    pub fn msg_type(&self) -> Icmpv6Type {
        Icmpv6Type::from_u8(self.b()[field::TYPE])
    }
    /// Code.
    pub fn code(&self) -> u8 {
        self.b()[field::CODE]
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        read_u16(self.b(), field::CHECKSUM.start)
    }
    /// The 32-bit data field (MTU for Packet Too Big, pointer for Parameter Problem).
    pub fn data(&self) -> u32 {
        read_u32(self.b(), field::DATA.start)
    }
    /// Bytes after the header (the invoking packet for errors).
    pub fn payload(&self) -> &[u8] {
        &self.b()[ICMPV6_HEADER_LEN..]
    }
    /// True if the checksum verifies for a message from `src` to `dst`.
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        upper_layer_checksum(src, dst, NEXT_HEADER_ICMPV6, self.b()) == 0
    }
}

impl<'a> Icmpv6Packet<&'a [u8]> {
    /// Bytes after the header, borrowed for the buffer's lifetime.
    pub fn into_payload(self) -> &'a [u8] {
        &self.buffer[ICMPV6_HEADER_LEN..]
    }
}

/// An owned ICMPv6 header (the payload is written by the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Icmpv6Repr {
    /// Type.
    pub msg_type: Icmpv6Type,
    /// Code.
    pub code: u8,
    /// The data field.
    pub data: u32,
}

impl Icmpv6Repr {
    /// Reads a checked message's header.
    pub fn parse<T: AsRef<[u8]>>(p: &Icmpv6Packet<T>) -> Self {
        Self {
            msg_type: p.msg_type(),
            code: p.code(),
            data: p.data(),
        }
    }
    /// Header bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        ICMPV6_HEADER_LEN
    }
    /// Writes the header into `buf[..8]` for a message of `buf.len()` bytes whose body is already in
    /// `buf[8..]`, with the checksum computed for `src` -> `dst`.
    pub fn emit(&self, buf: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr) -> Result<(), WireError> {
        if buf.len() < ICMPV6_HEADER_LEN {
            return Err(WireError::BufferTooSmall {
                have: buf.len(),
                need: ICMPV6_HEADER_LEN,
            });
        }
        buf[field::TYPE] = self.msg_type.to_u8();
        buf[field::CODE] = self.code;
        buf[field::CHECKSUM].copy_from_slice(&[0, 0]);
        buf[field::DATA].copy_from_slice(&self.data.to_be_bytes());
        let c = upper_layer_checksum(src, dst, NEXT_HEADER_ICMPV6, buf);
        buf[field::CHECKSUM].copy_from_slice(&c.to_be_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::hex;
    use super::*;

    #[test]
    fn encode_decode() {
        let s: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let d: Ipv6Addr = "2001:db8::2".parse().unwrap();
        let mut buf = hex("0000000000000000 6000000000003a40");
        let r = Icmpv6Repr {
            msg_type: Icmpv6Type::PacketTooBig,
            code: 0,
            data: 1280,
        };
        r.emit(&mut buf, s, d).unwrap();
        assert_eq!(&buf[..2], &[2, 0]);
        assert_eq!(&buf[4..8], &hex("00000500")[..]);
        let p = Icmpv6Packet::new_checked(&buf[..]).unwrap();
        assert_eq!(Icmpv6Repr::parse(&p), r);
        assert!(p.verify_checksum(s, d));
        assert_eq!(p.payload(), &hex("6000000000003a40")[..]);
        assert!(Icmpv6Type::PacketTooBig.is_error());
        assert!(!Icmpv6Type::from_u8(128).is_error());
    }

    #[test]
    fn truncated() {
        for n in 0..8 {
            assert!(Icmpv6Packet::new_checked(&[0u8; 8][..n]).is_err());
        }
        assert!(Icmpv6Repr {
            msg_type: Icmpv6Type::Other(1),
            code: 0,
            data: 0
        }
        .emit(&mut [0u8; 7], Ipv6Addr::UNSPECIFIED, Ipv6Addr::UNSPECIFIED)
        .is_err());
    }
}
