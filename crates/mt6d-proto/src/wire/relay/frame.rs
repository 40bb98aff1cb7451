//! The relay frame: what a relay reads inside a link's AEAD (docs/PROTOCOL.md §10.2-§10.4).
//!
//! ```text
//!  0        1        2        3        4                                    12
//! +--------+--------+--------+--------+-------------------------------------+
//! |  kind  |  hops  |      length     |          destination (8)            |
//! +--------+--------+--------+--------+-------------------------------------+
//! | relay payload (length bytes)                     | padding (zeros)      |
//! ```
//! A frame is the AEAD plaintext of an encrypt-mode payload on a relay link (§10.2), in place of
//! the inner packet without its addresses; only the two ends of one link ever see it. Kinds
//! `0x01` data and `0x02` end-to-end handshake are forwarded towards `destination`, an edge
//! gateway's node id; `0x03` routing and `0x04` probe are link-local (hops 1, destination zero).
//! The first byte of a frame is below `0x10`, an inner packet's is `0x6?`: the two plaintexts of
//! §4 and §10 cannot be mistaken for each other. Every frame is padded to a size class
//! ([`frame_len`], §10.4) so that probes and routing messages look like small data.

use super::{read_node_id, read_u16, NodeId, RelayError, NODE_ID_LEN};

mod field {
    use std::ops::Range;
    pub const KIND: usize = 0;
    pub const HOPS: usize = 1;
    pub const LENGTH: Range<usize> = 2..4;
    pub const DESTINATION: Range<usize> = 4..12;
}

/// Bytes of the relay header.
pub const HEADER_LEN: usize = 12;
/// Smallest relay payload of a forwarded frame: a route tag (8) and the shortest end-to-end
/// payload, a keepalive (24, §9.5).
pub const MIN_FORWARDED_PAYLOAD: usize = 8 + 24;
/// The smallest size class: frames below it are padded up to it (§10.4).
pub const MIN_FRAME: usize = 128;
/// Size classes above [`MIN_FRAME`] are multiples of this.
pub const FRAME_STEP: usize = 64;
/// `frameMax` for 1500-byte links: 1500 - 72 (outer IPv6 and UDP 48, link counter and tag 24).
pub const DEFAULT_FRAME_MAX: usize = 1428;
/// The smallest `frameMax` a relay network may use: IPv6's minimum MTU, 1280, minus 72.
pub const MIN_FRAME_MAX: usize = 1208;
const WHAT: &str = "relay frame";

/// What a frame carries (its first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// End-to-end data (a §4 tunnel payload of the end-to-end stream, after its route tag).
    Data,
    /// An end-to-end handshake message (§9.3, after its route tag); relays rate-limit these.
    E2eHandshake,
    /// A routing message for the link's other end (§10.9).
    Routing,
    /// A probe request or reply for the link's other end (§10.6).
    Probe,
}

impl Kind {
    /// The wire byte.
    pub const fn byte(self) -> u8 {
        match self {
            Kind::Data => 0x01,
            Kind::E2eHandshake => 0x02,
            Kind::Routing => 0x03,
            Kind::Probe => 0x04,
        }
    }
    /// Parses the wire byte.
    pub const fn from_byte(b: u8) -> Option<Kind> {
        match b {
            0x01 => Some(Kind::Data),
            0x02 => Some(Kind::E2eHandshake),
            0x03 => Some(Kind::Routing),
            0x04 => Some(Kind::Probe),
            _ => None,
        }
    }
    /// Whether frames of this kind travel towards a destination (else they stay on one link).
    pub const fn is_forwarded(self) -> bool {
        matches!(self, Kind::Data | Kind::E2eHandshake)
    }
}

/// The length of the frame that carries `payload_len` bytes of relay payload on a network whose
/// largest frame is `frame_max` (§10.4): `min(frame_max, max(128, 64 * ceil((12 + len) / 64)))`.
/// Never below `12 + payload_len`: a payload that does not fit `frame_max` is the caller's error
/// ([`RelayRepr::write_frame`] refuses it).
pub fn frame_len(payload_len: usize, frame_max: usize) -> usize {
    let need = HEADER_LEN.saturating_add(payload_len);
    let class = need.div_ceil(FRAME_STEP).saturating_mul(FRAME_STEP);
    class.max(MIN_FRAME).min(frame_max).max(need)
}

/// A checked view of a relay frame: after [`RelayFrame::new_checked`] every rule of §10.3 holds
/// and no accessor can panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayFrame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> RelayFrame<T> {
    /// Checks a whole frame (the AEAD plaintext of one link payload): the header, the kind's
    /// rules for hops, destination and length, and zero padding.
    pub fn new_checked(buffer: T) -> Result<Self, RelayError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(RelayError::Truncated {
                what: WHAT,
                have: b.len(),
                need: HEADER_LEN,
            });
        }
        let kind_byte = b[field::KIND];
        let Some(kind) = Kind::from_byte(kind_byte) else {
            return Err(RelayError::BadKind(kind_byte));
        };
        let hops = b[field::HOPS];
        let hops_ok = if kind.is_forwarded() {
            hops >= 1
        } else {
            hops == 1
        };
        if !hops_ok {
            return Err(RelayError::BadHops {
                kind: kind_byte,
                hops,
            });
        }
        let zero_destination = b[field::DESTINATION] == [0; NODE_ID_LEN];
        if kind.is_forwarded() == zero_destination {
            return Err(RelayError::BadDestination { kind: kind_byte });
        }
        let len = usize::from(read_u16(b, field::LENGTH.start));
        let end = HEADER_LEN + len;
        if b.len() < end {
            return Err(RelayError::Truncated {
                what: WHAT,
                have: b.len(),
                need: end,
            });
        }
        if kind.is_forwarded() && len < MIN_FORWARDED_PAYLOAD {
            return Err(RelayError::BadLength {
                len,
                min: MIN_FORWARDED_PAYLOAD,
            });
        }
        if b[end..].iter().any(|&x| x != 0) {
            return Err(RelayError::BadPadding);
        }
        Ok(Self { buffer })
    }

    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The kind.
    pub fn kind(&self) -> Kind {
        // Checked by `new_checked`; the fallback is never taken.
        Kind::from_byte(self.b()[field::KIND]).unwrap_or(Kind::Probe)
    }
    /// The hop limit.
    pub fn hops(&self) -> u8 {
        self.b()[field::HOPS]
    }
    /// Bytes of relay payload.
    pub fn payload_len(&self) -> usize {
        usize::from(read_u16(self.b(), field::LENGTH.start))
    }
    /// The destination edge gateway ([`NodeId::RESERVED`] on link-local kinds).
    pub fn destination(&self) -> NodeId {
        read_node_id(self.b(), field::DESTINATION.start)
    }
    /// The relay payload.
    pub fn payload(&self) -> &[u8] {
        &self.b()[HEADER_LEN..HEADER_LEN + self.payload_len()]
    }
    /// The whole frame, padding included.
    pub fn as_bytes(&self) -> &[u8] {
        self.b()
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> RelayFrame<T> {
    /// Sets the hop limit (a relay decrements it before it forwards, §10.3).
    pub fn set_hops(&mut self, hops: u8) {
        self.buffer.as_mut()[field::HOPS] = hops;
    }
    /// The relay payload, writable (the destination removes the e2e payload's header protection
    /// in place, §10.5).
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let len = self.payload_len();
        &mut self.buffer.as_mut()[HEADER_LEN..HEADER_LEN + len]
    }
}

impl<'a> RelayFrame<&'a mut [u8]> {
    /// The relay payload, writable and borrowed for the buffer's lifetime.
    pub fn into_payload_mut(self) -> &'a mut [u8] {
        let len = self.payload_len();
        &mut self.buffer[HEADER_LEN..HEADER_LEN + len]
    }
}

impl<'a> RelayFrame<&'a [u8]> {
    /// The relay payload, borrowed for the buffer's lifetime.
    pub fn into_payload(self) -> &'a [u8] {
        let len = self.payload_len();
        &self.buffer[HEADER_LEN..HEADER_LEN + len]
    }
}

/// An owned relay header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RelayRepr {
    /// What the frame carries.
    pub kind: Kind,
    /// Hop limit: [`crate::relay::HOP_LIMIT`] from an edge gateway; 1 on link-local kinds.
    pub hops: u8,
    /// Bytes of relay payload.
    pub payload_len: u16,
    /// The destination edge gateway; [`NodeId::RESERVED`] on link-local kinds.
    pub destination: NodeId,
}

impl RelayRepr {
    /// The header of a link-local frame (routing or probe) with `payload_len` bytes of payload.
    pub const fn link_local(kind: Kind, payload_len: u16) -> RelayRepr {
        RelayRepr {
            kind,
            hops: 1,
            payload_len,
            destination: NodeId::RESERVED,
        }
    }
    /// Reads a checked frame's header.
    pub fn parse<T: AsRef<[u8]>>(f: &RelayFrame<T>) -> RelayRepr {
        RelayRepr {
            kind: f.kind(),
            hops: f.hops(),
            // A checked frame's length field fits in u16 by construction.
            payload_len: u16::try_from(f.payload_len()).unwrap_or(u16::MAX),
            destination: f.destination(),
        }
    }
    /// Bytes of the header `emit` writes.
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }
    /// Writes the header into `buf[..12]` and zeros after the payload, for a frame of
    /// `buf.len()` bytes whose payload is already in `buf[12..12 + payload_len]`.
    pub fn emit(&self, buf: &mut [u8]) -> Result<(), RelayError> {
        let end = HEADER_LEN + usize::from(self.payload_len);
        if buf.len() < end {
            return Err(RelayError::BufferTooSmall {
                have: buf.len(),
                need: end,
            });
        }
        buf[field::KIND] = self.kind.byte();
        buf[field::HOPS] = self.hops;
        buf[field::LENGTH].copy_from_slice(&self.payload_len.to_be_bytes());
        buf[field::DESTINATION].copy_from_slice(self.destination.as_bytes());
        buf[end..].fill(0);
        Ok(())
    }
    /// Writes a whole frame - header, `payload` (whose length must equal `payload_len`), padding
    /// to its size class under `frame_max` - into `buf` and returns its length.
    pub fn write_frame(
        &self,
        payload: &[u8],
        frame_max: usize,
        buf: &mut [u8],
    ) -> Result<usize, RelayError> {
        if payload.len() != usize::from(self.payload_len) {
            return Err(RelayError::LengthMismatch {
                field: usize::from(self.payload_len),
                payload: payload.len(),
            });
        }
        let max = frame_max.saturating_sub(HEADER_LEN);
        if payload.len() > max {
            return Err(RelayError::TooLong {
                len: payload.len(),
                max,
            });
        }
        let len = frame_len(payload.len(), frame_max);
        if buf.len() < len {
            return Err(RelayError::BufferTooSmall {
                have: buf.len(),
                need: len,
            });
        }
        let out = &mut buf[..len];
        out[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(payload);
        self.emit(out)?;
        Ok(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::hex;

    const DEST: [u8; 8] = [0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88];

    fn data_frame() -> Vec<u8> {
        // kind 1, hops 16, length 32, destination, 32 payload bytes, 84 bytes of padding.
        let mut f = hex("01 10 0020 1122334455667788");
        f.extend((0u8..32).collect::<Vec<_>>());
        f.resize(128, 0);
        f
    }

    #[test]
    fn decode() {
        let buf = data_frame();
        let f = RelayFrame::new_checked(&buf[..]).unwrap();
        assert_eq!(f.kind(), Kind::Data);
        assert_eq!(f.hops(), 16);
        assert_eq!(f.payload_len(), 32);
        assert_eq!(f.destination(), NodeId::from_bytes(DEST));
        assert_eq!(f.payload(), &(0u8..32).collect::<Vec<_>>()[..]);
        assert_eq!(
            RelayRepr::parse(&f),
            RelayRepr {
                kind: Kind::Data,
                hops: 16,
                payload_len: 32,
                destination: NodeId::from_bytes(DEST),
            }
        );
        assert_eq!(f.into_payload().len(), 32);
    }

    #[test]
    fn encode_writes_every_byte() {
        let repr = RelayRepr {
            kind: Kind::Data,
            hops: 16,
            payload_len: 32,
            destination: NodeId::from_bytes(DEST),
        };
        let payload: Vec<u8> = (0u8..32).collect();
        let mut buf = [0xeeu8; 200];
        let n = repr
            .write_frame(&payload, DEFAULT_FRAME_MAX, &mut buf)
            .unwrap();
        assert_eq!(n, 128);
        assert_eq!(&buf[..n], &data_frame()[..]);
        assert_eq!(buf[n], 0xee, "nothing written past the frame");
        assert_eq!(repr.header_len(), HEADER_LEN);
    }

    #[test]
    fn truncated_input_is_an_error() {
        let buf = data_frame();
        for n in 0..HEADER_LEN + 32 {
            assert!(
                matches!(
                    RelayFrame::new_checked(&buf[..n]),
                    Err(RelayError::Truncated { .. })
                ),
                "{n} bytes"
            );
        }
        // Without padding it is still a valid frame.
        assert!(RelayFrame::new_checked(&buf[..HEADER_LEN + 32]).is_ok());
    }

    #[test]
    fn each_header_rule_refuses() {
        let good = data_frame();
        let with = |i: usize, v: u8| {
            let mut b = good.clone();
            b[i] = v;
            RelayFrame::new_checked(b).unwrap_err()
        };
        assert_eq!(with(0, 0x00), RelayError::BadKind(0));
        assert_eq!(with(0, 0x05), RelayError::BadKind(5));
        assert_eq!(with(0, 0x60), RelayError::BadKind(0x60), "an inner packet");
        assert_eq!(with(1, 0), RelayError::BadHops { kind: 1, hops: 0 });
        assert_eq!(with(3, 31), RelayError::BadLength { len: 31, min: 32 });
        assert_eq!(with(127, 1), RelayError::BadPadding);
        // Link-local kinds: hops exactly 1 and no destination.
        assert_eq!(with(0, 0x03), RelayError::BadHops { kind: 3, hops: 16 });
        let mut probe = hex("04 01 0008 0000000000000000 01000000 00000001");
        probe.resize(128, 0);
        assert!(RelayFrame::new_checked(&probe[..]).is_ok());
        probe[4] = 1;
        assert_eq!(
            RelayFrame::new_checked(&probe[..]).unwrap_err(),
            RelayError::BadDestination { kind: 4 }
        );
        // A forwarded frame with the reserved destination.
        let mut b = good.clone();
        b[4..12].fill(0);
        assert_eq!(
            RelayFrame::new_checked(b).unwrap_err(),
            RelayError::BadDestination { kind: 1 }
        );
        // A length past the end.
        let mut b = good.clone();
        b[2] = 0xff;
        assert!(matches!(
            RelayFrame::new_checked(b),
            Err(RelayError::Truncated { .. })
        ));
    }

    #[test]
    fn a_relay_decrements_the_hop_limit_in_place() {
        let mut buf = data_frame();
        let mut f = RelayFrame::new_checked(&mut buf[..]).unwrap();
        let h = f.hops();
        f.set_hops(h - 1);
        assert_eq!(buf[1], 15);
    }

    #[test]
    fn size_classes() {
        let m = DEFAULT_FRAME_MAX;
        assert_eq!(frame_len(0, m), 128);
        assert_eq!(frame_len(8, m), 128, "a probe");
        assert_eq!(frame_len(116, m), 128);
        assert_eq!(frame_len(117, m), 192);
        assert_eq!(frame_len(180, m), 192);
        assert_eq!(frame_len(181, m), 256);
        assert_eq!(frame_len(1404, m), 1428, "capped at frameMax");
        assert_eq!(frame_len(1416, m), 1428, "the largest inner packet");
        assert_eq!(frame_len(1500, m), 1512, "never below what it holds");
        for len in 0..=1416 {
            let f = frame_len(len, m);
            assert!(f >= 12 + len && f <= m);
            assert!(f == m || (f >= MIN_FRAME && f % FRAME_STEP == 0), "{len}");
        }
        // Routing messages of the table's largest size fit the smallest frameMax.
        const { assert!(HEADER_LEN + 4 + 96 * 12 <= MIN_FRAME_MAX) };
    }

    #[test]
    fn writer_refuses_what_does_not_fit() {
        let repr = RelayRepr::link_local(Kind::Routing, 16);
        let mut small = [0u8; 100];
        assert_eq!(
            repr.write_frame(&[0; 16], DEFAULT_FRAME_MAX, &mut small),
            Err(RelayError::BufferTooSmall {
                have: 100,
                need: 128
            })
        );
        let big = RelayRepr::link_local(Kind::Routing, 1417);
        let mut buf = [0u8; 2000];
        assert!(matches!(
            big.write_frame(&[0; 1417], DEFAULT_FRAME_MAX, &mut buf),
            Err(RelayError::TooLong { .. })
        ));
        assert!(repr
            .write_frame(&[0; 15], DEFAULT_FRAME_MAX, &mut buf)
            .is_err());
        assert!(repr.emit(&mut [0u8; 27]).is_err());
    }
}
