//! Handshake message layout and the route-bound MAC (docs/PROTOCOL.md §9.3). A checked view: every
//! length is verified before a field is read.
//!
//! ```text
//! initiation: 0x81 | 00 00 00 | index (4) | Noise IK message 1 (105) | mac (16)   = 129 bytes
//! response:   0x82 | 00 00 00 | index (4) | Noise IK message 2 (49)  | mac (16)   =  73 bytes
//! mac = BLAKE3-keyed(macKey, outerSrc(16) || outerDst(16) || srcPort(2) || dstPort(2)
//!                            || message[0 .. len-16])[0..16]
//! ```
//! `index` (big-endian) is the initiator's name for its attempt; the response echoes it, so the
//! initiator finds the attempt it answers before any Diffie-Hellman (WireGuard's sender/receiver
//! index, docs/PROTOCOL.md §9.3). The type byte stays first and the mac last, so a mask over the
//! first bytes sampled from the last 16 can be laid over every message.

use std::net::SocketAddrV6;

use subtle::ConstantTimeEq;

use super::HandshakeError;

/// Type byte of an initiation.
pub const TYPE_INITIATION: u8 = 0x81;
/// Type byte of a response.
pub const TYPE_RESPONSE: u8 = 0x82;
/// Type byte and three reserved zero bytes.
pub const TYPE_LEN: usize = 4;
/// Bytes of the attempt index.
pub const INDEX_LEN: usize = 4;
/// Type, reserved bytes and index.
pub const HEADER_LEN: usize = TYPE_LEN + INDEX_LEN;
/// Bytes of the MAC.
pub const MAC_LEN: usize = 16;
/// Noise IK message 1 with a 9-byte payload: e (32) + encrypted s (32 + 16) + payload (9 + 16).
pub const NOISE_INITIATION_LEN: usize = 32 + 48 + INITIATION_PAYLOAD_LEN + 16;
/// Noise IK message 2 with a 1-byte payload: e (32) + payload (1 + 16).
pub const NOISE_RESPONSE_LEN: usize = 32 + RESPONSE_PAYLOAD_LEN + 16;
/// Initiation plaintext: timestamp (8, ns since 1970) || the initiator's receive phase (1).
pub const INITIATION_PAYLOAD_LEN: usize = 9;
/// Response plaintext: the responder's receive phase (1).
pub const RESPONSE_PAYLOAD_LEN: usize = 1;
/// Whole initiation.
pub const INITIATION_LEN: usize = HEADER_LEN + NOISE_INITIATION_LEN + MAC_LEN;
/// Whole response.
pub const RESPONSE_LEN: usize = HEADER_LEN + NOISE_RESPONSE_LEN + MAC_LEN;

/// Whether a tunnel payload is a handshake message (first byte's high bit; data packets' counters
/// stay below 2^63, plain payloads start with 0x6?).
pub fn is_handshake(payload: &[u8]) -> bool {
    payload.first().is_some_and(|b| b & 0x80 != 0)
}

/// Which handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Noise IK message 1.
    Initiation,
    /// Noise IK message 2.
    Response,
}

/// A checked view of a handshake message.
#[derive(Debug, Clone, Copy)]
pub struct Message<'a> {
    kind: Kind,
    bytes: &'a [u8],
}

impl<'a> Message<'a> {
    /// Checks type, reserved bytes and exact length.
    pub fn new_checked(bytes: &'a [u8]) -> Result<Message<'a>, HandshakeError> {
        let (kind, len) = match bytes.first() {
            Some(&TYPE_INITIATION) => (Kind::Initiation, INITIATION_LEN),
            Some(&TYPE_RESPONSE) => (Kind::Response, RESPONSE_LEN),
            _ => return Err(HandshakeError::UnknownType),
        };
        if bytes.len() != len || bytes[1..TYPE_LEN] != [0, 0, 0] {
            return Err(HandshakeError::BadLength);
        }
        Ok(Message { kind, bytes })
    }
    /// The message type.
    pub fn kind(&self) -> Kind {
        self.kind
    }
    /// The attempt index: the initiator's for an initiation, echoed by a response.
    pub fn index(&self) -> u32 {
        let mut b = [0u8; INDEX_LEN];
        b.copy_from_slice(&self.bytes[TYPE_LEN..HEADER_LEN]);
        u32::from_be_bytes(b)
    }
    /// The Noise message.
    pub fn noise(&self) -> &'a [u8] {
        &self.bytes[HEADER_LEN..self.bytes.len() - MAC_LEN]
    }
    /// The sender's ephemeral public key (the Noise message's first 32 bytes, in clear).
    pub fn ephemeral(&self) -> &'a [u8] {
        &self.noise()[..32]
    }
    /// Verifies the MAC for a message that arrived from `src` to `dst`; constant time.
    pub fn verify_mac(
        &self,
        mac_key: &[u8; 32],
        src: &SocketAddrV6,
        dst: &SocketAddrV6,
    ) -> Result<(), HandshakeError> {
        let split = self.bytes.len() - MAC_LEN;
        let want = mac(mac_key, src, dst, &self.bytes[..split]);
        if bool::from(want.ct_eq(&self.bytes[split..])) {
            Ok(())
        } else {
            Err(HandshakeError::BadMac)
        }
    }
}

/// The MAC of `covered` sent from `src` to `dst`.
pub(crate) fn mac(
    mac_key: &[u8; 32],
    src: &SocketAddrV6,
    dst: &SocketAddrV6,
    covered: &[u8],
) -> [u8; MAC_LEN] {
    let mut h = blake3::Hasher::new_keyed(mac_key);
    h.update(&src.ip().octets());
    h.update(&dst.ip().octets());
    h.update(&src.port().to_be_bytes());
    h.update(&dst.port().to_be_bytes());
    h.update(covered);
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&h.finalize().as_bytes()[..MAC_LEN]);
    out
}

/// Frames a Noise message: header with `index`, message, MAC for `src` -> `dst`. `out` is exactly
/// the message length for its type.
pub(crate) fn frame(
    kind: Kind,
    index: u32,
    noise: &[u8],
    mac_key: &[u8; 32],
    src: &SocketAddrV6,
    dst: &SocketAddrV6,
    out: &mut [u8],
) {
    out[0] = match kind {
        Kind::Initiation => TYPE_INITIATION,
        Kind::Response => TYPE_RESPONSE,
    };
    out[1..TYPE_LEN].fill(0);
    out[TYPE_LEN..HEADER_LEN].copy_from_slice(&index.to_be_bytes());
    let split = out.len() - MAC_LEN;
    out[HEADER_LEN..split].copy_from_slice(noise);
    let m = mac(mac_key, src, dst, &out[..split]);
    out[split..].copy_from_slice(&m);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv6Addr;

    fn sa(last: u16, port: u16) -> SocketAddrV6 {
        SocketAddrV6::new(
            Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, last),
            port,
            0,
            0,
        )
    }

    #[test]
    fn framing_roundtrips_and_the_mac_binds_route_and_bytes() {
        let key = [5u8; 32];
        let noise = [0xabu8; NOISE_INITIATION_LEN];
        let mut out = [0u8; INITIATION_LEN];
        frame(
            Kind::Initiation,
            0x0102_0304,
            &noise,
            &key,
            &sa(1, 1000),
            &sa(2, 2000),
            &mut out,
        );
        assert!(is_handshake(&out));
        let m = Message::new_checked(&out).unwrap();
        assert_eq!(m.kind(), Kind::Initiation);
        assert_eq!(m.noise(), &noise[..]);
        assert_eq!(m.index(), 0x0102_0304);
        assert_eq!(&out[4..8], &[1, 2, 3, 4]);
        assert_eq!(out.len(), 129);
        assert!(m.verify_mac(&key, &sa(1, 1000), &sa(2, 2000)).is_ok());
        for (s, d) in [
            (sa(2, 1000), sa(1, 2000)),
            (sa(1, 1001), sa(2, 2000)),
            (sa(1, 1000), sa(2, 2001)),
            (sa(1, 1000), sa(3, 2000)),
        ] {
            assert_eq!(m.verify_mac(&key, &s, &d), Err(HandshakeError::BadMac));
        }
        assert_eq!(
            m.verify_mac(&[6u8; 32], &sa(1, 1000), &sa(2, 2000)),
            Err(HandshakeError::BadMac)
        );
        for i in 0..out.len() {
            let mut t = out;
            t[i] ^= 1;
            let r = Message::new_checked(&t)
                .and_then(|m| m.verify_mac(&key, &sa(1, 1000), &sa(2, 2000)));
            assert!(r.is_err(), "flipping byte {i} must be caught");
        }
    }

    #[test]
    fn lengths_and_types_are_checked() {
        assert_eq!(
            Message::new_checked(&[]).unwrap_err(),
            HandshakeError::UnknownType
        );
        assert_eq!(
            Message::new_checked(&[0x83; 73]).unwrap_err(),
            HandshakeError::UnknownType
        );
        let mut r = [0u8; RESPONSE_LEN + 1];
        r[0] = TYPE_RESPONSE;
        assert_eq!(
            Message::new_checked(&r).unwrap_err(),
            HandshakeError::BadLength
        );
        assert!(Message::new_checked(&r[..RESPONSE_LEN]).is_ok());
        r[2] = 1;
        assert_eq!(
            Message::new_checked(&r[..RESPONSE_LEN]).unwrap_err(),
            HandshakeError::BadLength
        );
        assert!(!is_handshake(&[0x60, 0, 0]));
        assert!(!is_handshake(&[]));
    }
}
