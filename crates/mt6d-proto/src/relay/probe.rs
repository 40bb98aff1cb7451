//! Probes: the relay payload of a kind-`0x04` frame (docs/PROTOCOL.md §10.6).
//!
//! ```text
//! probe (8 bytes): type (1) | 00 00 00 | sequence (4)
//! type 0x01 request, 0x02 reply (echoes the request's sequence)
//! ```
//! Each end of a link sends a request every 50 ms +- 25 % inside the link's tunnel, padded to the
//! 128-byte size class like small data (§10.4); the other end answers at once. The prober keeps
//! the departure times itself ([`super::cost::LinkMonitor`]), so a reply carries nothing the
//! neighbour could get wrong but the sequence.

use super::{read_u32, RelayError};

mod field {
    use std::ops::Range;
    pub const TYPE: usize = 0;
    pub const RESERVED: Range<usize> = 1..4;
    pub const SEQUENCE: Range<usize> = 4..8;
}

/// Bytes of a probe.
pub const PROBE_LEN: usize = 8;

/// Request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProbeType {
    /// Sent every 50 ms +- 25 % by each end of a link.
    Request,
    /// The answer, sent at once, echoing the sequence.
    Reply,
}

impl ProbeType {
    const fn byte(self) -> u8 {
        match self {
            ProbeType::Request => 0x01,
            ProbeType::Reply => 0x02,
        }
    }
}

/// A checked view of a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Probe<T> {
    /// Checks a frame's relay payload: exactly 8 bytes, a known type, zero reserved bytes.
    pub fn new_checked(buffer: T) -> Result<Self, RelayError> {
        let b = buffer.as_ref();
        if b.len() < PROBE_LEN {
            return Err(RelayError::Truncated {
                what: "probe",
                have: b.len(),
                need: PROBE_LEN,
            });
        }
        if b.len() != PROBE_LEN {
            return Err(RelayError::BadProbe { field: "length" });
        }
        if !matches!(b[field::TYPE], 0x01 | 0x02) {
            return Err(RelayError::BadProbe { field: "type" });
        }
        if b[field::RESERVED] != [0, 0, 0] {
            return Err(RelayError::BadProbe { field: "reserved" });
        }
        Ok(Self { buffer })
    }
    /// Request or reply.
    pub fn probe_type(&self) -> ProbeType {
        if self.buffer.as_ref()[field::TYPE] == 0x01 {
            ProbeType::Request
        } else {
            ProbeType::Reply
        }
    }
    /// The sequence number.
    pub fn sequence(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SEQUENCE.start)
    }
}

/// An owned probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProbeRepr {
    /// Request or reply.
    pub probe_type: ProbeType,
    /// The request's sequence number (echoed by the reply).
    pub sequence: u32,
}

impl ProbeRepr {
    /// A request with `sequence`.
    pub const fn request(sequence: u32) -> ProbeRepr {
        ProbeRepr {
            probe_type: ProbeType::Request,
            sequence,
        }
    }
    /// The reply to this request.
    pub const fn reply(self) -> ProbeRepr {
        ProbeRepr {
            probe_type: ProbeType::Reply,
            sequence: self.sequence,
        }
    }
    /// Reads a checked probe.
    pub fn parse<T: AsRef<[u8]>>(p: &Probe<T>) -> ProbeRepr {
        ProbeRepr {
            probe_type: p.probe_type(),
            sequence: p.sequence(),
        }
    }
    /// Bytes `emit` writes.
    pub const fn buffer_len(&self) -> usize {
        PROBE_LEN
    }
    /// The 8 bytes of the probe.
    pub fn to_bytes(&self) -> [u8; PROBE_LEN] {
        let mut b = [0u8; PROBE_LEN];
        b[field::TYPE] = self.probe_type.byte();
        b[field::SEQUENCE].copy_from_slice(&self.sequence.to_be_bytes());
        b
    }
    /// Writes the probe into `buf[..8]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), RelayError> {
        let Some(out) = buf.get_mut(..PROBE_LEN) else {
            return Err(RelayError::BufferTooSmall {
                have: buf.len(),
                need: PROBE_LEN,
            });
        };
        out.copy_from_slice(&self.to_bytes());
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::hex;
    use super::*;

    #[test]
    fn encode_decode() {
        let req = ProbeRepr::request(0x0102_0304);
        assert_eq!(&req.to_bytes()[..], &hex("01000000 01020304")[..]);
        let rep = req.reply();
        let mut buf = [0xffu8; 9];
        rep.emit(&mut buf).unwrap();
        assert_eq!(&buf[..8], &hex("02000000 01020304")[..]);
        assert_eq!(buf[8], 0xff);
        let p = Probe::new_checked(&buf[..8]).unwrap();
        assert_eq!(p.probe_type(), ProbeType::Reply);
        assert_eq!(p.sequence(), 0x0102_0304);
        assert_eq!(ProbeRepr::parse(&p), rep);
        assert_eq!(rep.buffer_len(), 8);
        assert!(rep.emit(&mut [0u8; 7]).is_err());
    }

    #[test]
    fn truncated_and_malformed() {
        let good = hex("01000000 00000007");
        for n in 0..8 {
            assert!(matches!(
                Probe::new_checked(&good[..n]),
                Err(RelayError::Truncated { .. })
            ));
        }
        let mut long = good.clone();
        long.push(0);
        assert_eq!(
            Probe::new_checked(&long[..]).unwrap_err(),
            RelayError::BadProbe { field: "length" }
        );
        for t in [0x00, 0x03, 0x81] {
            let mut b = good.clone();
            b[0] = t;
            assert_eq!(
                Probe::new_checked(b).unwrap_err(),
                RelayError::BadProbe { field: "type" }
            );
        }
        for i in 1..4 {
            let mut b = good.clone();
            b[i] = 1;
            assert_eq!(
                Probe::new_checked(b).unwrap_err(),
                RelayError::BadProbe { field: "reserved" }
            );
        }
    }
}
