//! The tunnel payload: how an inner IPv6 packet is carried in the UDP payload between gateways
//! (000 §2.6 Fig. 2.5/2.6, §3.2.4; docs/PROTOCOL.md §4). Owns the three formats, the per-direction
//! AEAD keys, the nonce/AAD layout, the send counter and the replay window.
//!
//! ```text
//! plain:   | inner hdr 0..8 | inner payload                                   |
//! auth:    | counter (8) | inner hdr 0..8 | inner payload | tag (16)          |
//! encrypt: | counter (8) | AEAD(inner hdr 0..8 || inner payload) | tag (16)   |
//! ```
//! Nonce = `00 00 00 00 || counter (u64 BE)`. AAD = outer src (16) || outer dst (16) || src port (2)
//! || dst port (2) || counter (8) [|| inner hdr 0..8 || inner payload, auth mode only].
//! The outer packet never carries IPv6 extension headers (RFC 7872: they are dropped on the path).
//! On the wire the first 8 bytes of every auth/encrypt payload are masked ([`header`], §4.5).
//!
//! A relay link (§10.2) uses encrypt mode with a relay frame as the AEAD plaintext instead of the
//! inner packet without its addresses; nonce, AAD, counters, key phases and replay window are the
//! same ([`Sealer::seal_frame`], [`Opener::open_frame`]):
//! ```text
//! relay link: | counter (8) | AEAD(relay header (12) || relay payload || zero padding) | tag (16) |
//! ```

pub mod header;
mod key_schedule;
mod open;
mod replay;
mod seal;

use std::net::SocketAddrV6;

pub use header::{HeaderError, HeaderKey};
pub use open::{FrameJob, FrameKey, Opener, PacketJob};
pub use replay::ReplayWindow;
pub use seal::Sealer;

pub(crate) use key_schedule::AeadKey;
pub(crate) use open::{decapsulate, Decap};

use crate::key::Subkey;
use crate::wire::IPV6_HEADER_LEN;
use crate::{AeadAlg, Mode};

/// Bytes of the counter field.
pub const COUNTER_LEN: usize = 8;
/// Bytes of the AEAD tag.
pub const TAG_LEN: usize = 16;
/// Inner header bytes carried (the 40-byte header minus both 16-byte addresses).
pub const INNER_HEADER_CARRIED: usize = 8;
/// Counters must stay below 2^63: first bytes with the high bit set are handshake messages
/// (docs/PROTOCOL.md §9).
pub const COUNTER_LIMIT: u64 = 1 << 63;
/// With handshake keys, bit 62 of the counter field is the key phase and the packet number below it
/// starts at 0 per key: it must stay below 2^62.
pub const SESSION_COUNTER_LIMIT: u64 = 1 << 62;
/// A keepalive: counter and tag around an empty body (auth/encrypt only). Sent by the initiator of a
/// handshake to confirm the new keys when it has no data to send (docs/PROTOCOL.md §9.5).
pub const KEEPALIVE_LEN: usize = COUNTER_LEN + TAG_LEN;

/// Which of a peer's two receive key slots a packet was sealed for (bit 62 of the counter field).
/// Static-key streams always use phase 0 (their counters are below 2^62 until the year 2116).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KeyPhase {
    /// Bit 62 clear.
    Zero,
    /// Bit 62 set.
    One,
}

impl KeyPhase {
    /// The phase encoded in a counter field.
    pub const fn of_counter(field: u64) -> KeyPhase {
        if field & SESSION_COUNTER_LIMIT == 0 {
            KeyPhase::Zero
        } else {
            KeyPhase::One
        }
    }
    /// The phase of a tunnel payload in auth/encrypt mode (None if shorter than a counter or a
    /// handshake message).
    pub fn of_payload(payload: &[u8]) -> Option<KeyPhase> {
        let c: [u8; 8] = payload.get(..COUNTER_LEN)?.try_into().ok()?;
        let c = u64::from_be_bytes(c);
        (c < COUNTER_LIMIT).then_some(Self::of_counter(c))
    }
    /// The other phase.
    pub const fn flip(self) -> KeyPhase {
        match self {
            KeyPhase::Zero => KeyPhase::One,
            KeyPhase::One => KeyPhase::Zero,
        }
    }
    /// 0 or 1 (slot index, wire byte).
    pub const fn index(self) -> usize {
        match self {
            KeyPhase::Zero => 0,
            KeyPhase::One => 1,
        }
    }
    /// Parses the wire byte (0 or 1).
    pub const fn from_byte(b: u8) -> Option<KeyPhase> {
        match b {
            0 => Some(KeyPhase::Zero),
            1 => Some(KeyPhase::One),
            _ => None,
        }
    }
    const fn bit(self) -> u64 {
        match self {
            KeyPhase::Zero => 0,
            KeyPhase::One => SESSION_COUNTER_LIMIT,
        }
    }
}

/// How a sealer's or opener's counter field is laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CounterSpace {
    /// Static pre-shared key: 63-bit counter from the persisted high-water mark (§4.3).
    Static,
    /// Handshake key: phase bit 62 plus a 62-bit packet number from 0 (§9.5).
    Session(KeyPhase),
}

impl CounterSpace {
    /// The counter field of packet number `n`, or None if `n` is past the space.
    pub(crate) const fn field(self, n: u64) -> Option<u64> {
        match self {
            CounterSpace::Static if n < COUNTER_LIMIT => Some(n),
            CounterSpace::Session(p) if n < SESSION_COUNTER_LIMIT => Some(p.bit() | n),
            _ => None,
        }
    }
    /// Whether a received counter field belongs to this space.
    pub(crate) const fn accepts(self, field: u64) -> bool {
        match self {
            CounterSpace::Static => field < COUNTER_LIMIT,
            CounterSpace::Session(p) => {
                field < COUNTER_LIMIT && KeyPhase::of_counter(field).index() == p.index()
            }
        }
    }
}
/// Bytes [`Sealer::seal_in_place`] needs free in front of the inner packet. The tunnel payload
/// starts 24 bytes into the inner packet (its counter and carried header bytes take the place of
/// the 32 address bytes, so the inner payload never moves), and auth mode's AAD puts the 36 bytes
/// of outer fields in front of the counter (§4.1): 36 - 24 = 12.
pub const SEAL_HEADROOM: usize =
    OUTER_AAD_LEN - COUNTER_LEN - (IPV6_HEADER_LEN - INNER_HEADER_CARRIED - COUNTER_LEN);

/// Bytes [`Opener::open_in_place`] needs free in front of the tunnel payload: the outer fields of
/// auth mode's AAD (§4.1), which go right before the counter. The restored inner packet then
/// starts 24 bytes in front of the payload (`OPEN_HEADROOM - 24`), its payload where it was.
pub const OPEN_HEADROOM: usize = OUTER_AAD_LEN - COUNTER_LEN;

/// Bytes [`Sealer::seal_frame_in_place`] needs free in front of the frame: the counter.
pub const FRAME_HEADROOM: usize = COUNTER_LEN;

/// The shortest relay link payload that is not a keepalive: counter, relay header, tag (§10.2).
pub const MIN_FRAME_PAYLOAD: usize = COUNTER_LEN + crate::wire::relay::frame::HEADER_LEN + TAG_LEN;

/// Bytes of the relay link payload that carries a frame of `frame_len` bytes (counter and tag
/// around it, §10.2).
pub const fn frame_payload_len(frame_len: usize) -> usize {
    frame_len.saturating_add(COUNTER_LEN + TAG_LEN)
}

/// Bytes of outer IPv6 (40) and UDP (8) headers.
pub const OUTER_HEADERS: usize = 48;

/// Bytes the tunnel payload adds to (or, negative, removes from) the inner packet, outer headers
/// excluded: plain -32 (addresses removed), auth/encrypt -32 + 8 + 16 = -8.
pub const fn payload_len(mode: Mode, inner_len: usize) -> usize {
    match mode {
        Mode::Plain => inner_len.saturating_sub(32),
        Mode::Auth | Mode::Encrypt => inner_len.saturating_sub(32) + COUNTER_LEN + TAG_LEN,
    }
}

/// Total on-wire overhead of `mode` relative to the inner packet, outer IPv6 + UDP included:
/// plain 16 (the thesis's figure, 000 §2.6.1), auth and encrypt 40.
pub const fn overhead(mode: Mode) -> usize {
    match mode {
        Mode::Plain => OUTER_HEADERS - 32,
        Mode::Auth | Mode::Encrypt => OUTER_HEADERS - 32 + COUNTER_LEN + TAG_LEN,
    }
}

/// Length of the fixed part of a tunnel payload (everything but the inner payload) in `mode`.
pub const fn fixed_len(mode: Mode) -> usize {
    match mode {
        Mode::Plain => INNER_HEADER_CARRIED,
        Mode::Auth | Mode::Encrypt => COUNTER_LEN + INNER_HEADER_CARRIED + TAG_LEN,
    }
}

/// Why a packet could not be sealed. Each variant is a drop reason ([`SealError::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SealError {
    /// The inner bytes are not one complete IPv6 packet (short, version != 6, length field wrong).
    #[error("inner packet malformed: {0}")]
    Malformed(crate::wire::WireError),
    /// The inner source is not the stream's local true address.
    #[error("inner source address is not the stream's local true address")]
    WrongSource,
    /// The inner destination is not the stream's remote true address.
    #[error("inner destination address is not the stream's remote true address")]
    WrongDestination,
    /// `out` cannot hold the tunnel payload.
    #[error("output buffer of {have} bytes too small, need {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
    /// The counter ran out (static key: 2^63 ns since 1970, year 2262; handshake key: 2^62
    /// packets, long after the rekey budget).
    #[error("send counter exhausted")]
    CounterExhausted,
    /// Static key: the next counter is not yet covered by the persisted high-water mark (the
    /// daemon reserves the next block ahead; this means it fell behind or cannot write its state
    /// file). docs/PROTOCOL.md §4.3.
    #[error("send counter not yet reserved on stable storage")]
    CounterNotReserved,
    /// Pre-shared key: it has protected as many packets as its AEAD allows (docs/PROTOCOL.md
    /// §4.3, RFC 9001 §6.6); the operator must give the peer a new key.
    #[error("the pre-shared key reached its packet limit: give the peer a new key")]
    KeyLimit,
    /// Plain mode has no counter or tag, so it has no keepalive.
    #[error("plain mode has no keepalive")]
    NoKeepaliveInPlain,
    /// Relay frames travel on encrypt-mode links only (the relay header must not be readable on
    /// the wire), and end-to-end payloads over relays are encrypt-mode only (relays see them;
    /// docs/PROTOCOL.md §10.1).
    #[error(
        "relay frames and end-to-end payloads need an encrypt-mode stream, this one is {mode}"
    )]
    NotEncrypt {
        /// The stream's mode.
        mode: Mode,
    },
    /// The bytes to seal as a relay frame are not a valid frame (or the frame to write does not
    /// fit), so a relay link never carries anything but frames.
    #[error("not a valid relay frame: {0}")]
    BadFrame(crate::wire::relay::RelayError),
    /// Header protection (docs/PROTOCOL.md §4.5) could not be applied to the sealed payload.
    /// Every sealed auth or encrypt payload is long enough, so this means a caller bug; the
    /// payload is not sent (its counter is spent, never reused).
    #[error("header protection: {0}")]
    HeaderProtection(HeaderError),
}

impl SealError {
    /// A stable label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Malformed(_) => "seal_malformed",
            Self::WrongSource => "seal_wrong_source",
            Self::WrongDestination => "seal_wrong_destination",
            Self::BufferTooSmall { .. } => "seal_buffer_too_small",
            Self::CounterExhausted => "seal_counter_exhausted",
            Self::CounterNotReserved => "seal_counter_not_reserved",
            Self::KeyLimit => "seal_key_limit",
            Self::NoKeepaliveInPlain => "seal_no_keepalive_in_plain",
            Self::NotEncrypt { .. } => "seal_not_encrypt",
            Self::BadFrame(_) => "seal_bad_frame",
            Self::HeaderProtection(_) => "seal_header_protection",
        }
    }
}

/// Why a received tunnel payload was dropped. Each variant is a drop reason ([`OpenError::reason`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// Shorter than the mode's fixed part.
    #[error("tunnel payload of {have} bytes is shorter than the {need}-byte minimum")]
    Truncated {
        /// Bytes received.
        have: usize,
        /// Minimum for the mode.
        need: usize,
    },
    /// Counter with the handshake bit set, or (handshake keys) with the other key phase.
    #[error("counter {0:#x} has a reserved bit set or belongs to another key phase")]
    BadCounter(u64),
    /// Counter already seen or older than the replay window.
    #[error("counter {0} replayed or too old")]
    Replay(u64),
    /// No receive key for the packet's key phase (no handshake yet, or the peer restarted and
    /// uses keys this gateway never had).
    #[error("no receive key for this packet's key phase")]
    NoKey,
    /// The AEAD tag did not verify (tampered, wrong key, or wrong route).
    #[error("authentication tag did not verify")]
    BadTag,
    /// The restored inner header is not IPv6 or its payload length disagrees with the bytes carried.
    #[error("restored inner packet is invalid (version or payload length)")]
    BadInner,
    /// `out` cannot hold the restored inner packet.
    #[error("output buffer of {have} bytes too small, need {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
    /// Relay frames are opened on encrypt-mode links only (docs/PROTOCOL.md §10.1).
    #[error("relay frames need an encrypt-mode stream, this one is {mode}")]
    NotEncrypt {
        /// The stream's mode.
        mode: Mode,
    },
    /// The payload opened (its tag verified) but its plaintext is not a relay frame: §10.3's
    /// refusals, labelled as there (`relay_bad_kind` for an inner packet sealed by a peer that
    /// takes the link for a direct stream).
    #[error("opened payload is not a relay frame: {0}")]
    BadFrame(crate::wire::relay::RelayError),
}

impl OpenError {
    /// A stable label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "open_truncated",
            Self::BadCounter(_) => "open_bad_counter",
            Self::Replay(_) => "open_replay",
            Self::NoKey => "open_no_key",
            Self::BadTag => "open_bad_tag",
            Self::BadInner => "open_bad_inner",
            Self::BufferTooSmall { .. } => "open_buffer_too_small",
            Self::NotEncrypt { .. } => "open_not_encrypt",
            Self::BadFrame(e) => e.reason(),
        }
    }
}

pub(crate) fn aead_key(mode: Mode, alg: AeadAlg, key: &Subkey) -> AeadKey {
    aead_key_bytes(mode, alg, key.as_bytes())
}

pub(crate) fn aead_key_bytes(mode: Mode, alg: AeadAlg, key: &[u8; 32]) -> AeadKey {
    AeadKey::new(mode, alg, key)
}

/// Bytes of the AEAD nonce.
pub(crate) const NONCE_LEN: usize = 12;

/// The nonce of a counter field: `00 00 00 00 || counter (u64 BE)` (§4.1).
pub(crate) fn nonce_bytes(counter: u64) -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[4..].copy_from_slice(&counter.to_be_bytes());
    n
}

/// Length of the fixed AAD prefix.
pub(crate) const OUTER_AAD_LEN: usize = 16 + 16 + 2 + 2 + COUNTER_LEN;

/// The outer fields and counter authenticated by every AEAD tag, for a packet from `src` to `dst`.
pub(crate) fn outer_aad(
    src: &SocketAddrV6,
    dst: &SocketAddrV6,
    counter: u64,
) -> [u8; OUTER_AAD_LEN] {
    let mut a = [0u8; OUTER_AAD_LEN];
    a[0..16].copy_from_slice(&src.ip().octets());
    a[16..32].copy_from_slice(&dst.ip().octets());
    a[32..34].copy_from_slice(&src.port().to_be_bytes());
    a[34..36].copy_from_slice(&dst.port().to_be_bytes());
    a[36..44].copy_from_slice(&counter.to_be_bytes());
    a
}

/// A checked view of a tunnel payload in a given mode (for parsers, fuzzers and ICMP quotes).
#[derive(Debug, Clone, Copy)]
pub struct TunnelPayload<T: AsRef<[u8]>> {
    buffer: T,
    mode: Mode,
}

impl<T: AsRef<[u8]>> TunnelPayload<T> {
    /// Checks that `buffer` is at least the mode's fixed length.
    pub fn new_checked(buffer: T, mode: Mode) -> Result<Self, OpenError> {
        let have = buffer.as_ref().len();
        let need = fixed_len(mode);
        if have < need {
            return Err(OpenError::Truncated { have, need });
        }
        Ok(Self { buffer, mode })
    }
    fn b(&self) -> &[u8] {
        self.buffer.as_ref()
    }
    /// The counter (None in plain mode).
    pub fn counter(&self) -> Option<u64> {
        match self.mode {
            Mode::Plain => None,
            Mode::Auth | Mode::Encrypt => {
                let mut c = [0u8; 8];
                c.copy_from_slice(&self.b()[..COUNTER_LEN]);
                Some(u64::from_be_bytes(c))
            }
        }
    }
    /// The protected body: inner header bytes 0..8 and inner payload, in clear (plain, auth) or
    /// encrypted (encrypt).
    pub fn body(&self) -> &[u8] {
        let b = self.b();
        match self.mode {
            Mode::Plain => b,
            Mode::Auth | Mode::Encrypt => &b[COUNTER_LEN..b.len() - TAG_LEN],
        }
    }
    /// Everything the tag covers after the outer fields (counter and body), auth/encrypt only.
    pub fn authenticated(&self) -> &[u8] {
        let b = self.b();
        match self.mode {
            Mode::Plain => b,
            Mode::Auth | Mode::Encrypt => &b[..b.len() - TAG_LEN],
        }
    }
    /// The tag (empty in plain mode).
    pub fn tag(&self) -> &[u8] {
        let b = self.b();
        match self.mode {
            Mode::Plain => &[],
            Mode::Auth | Mode::Encrypt => &b[b.len() - TAG_LEN..],
        }
    }
    /// Inner payload length implied by the payload size.
    pub fn inner_payload_len(&self) -> usize {
        self.b().len() - fixed_len(self.mode)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overheads_match_the_spec() {
        assert_eq!(overhead(Mode::Plain), 16);
        assert_eq!(overhead(Mode::Auth), 40);
        assert_eq!(overhead(Mode::Encrypt), 40);
        assert_eq!(payload_len(Mode::Plain, 100) + OUTER_HEADERS, 116);
        assert_eq!(payload_len(Mode::Encrypt, 100) + OUTER_HEADERS, 140);
    }

    #[test]
    fn view_truncated_and_fields() {
        assert!(TunnelPayload::new_checked(&[0u8; 7][..], Mode::Plain).is_err());
        assert!(TunnelPayload::new_checked(&[0u8; 31][..], Mode::Encrypt).is_err());
        let mut b = [0u8; 40];
        b[7] = 9;
        b[39] = 0xee;
        let v = TunnelPayload::new_checked(&b[..], Mode::Auth).unwrap();
        assert_eq!(v.counter(), Some(9));
        assert_eq!(v.body().len(), 16);
        assert_eq!(v.tag()[15], 0xee);
        assert_eq!(v.inner_payload_len(), 8);
        let p = TunnelPayload::new_checked(&b[..], Mode::Plain).unwrap();
        assert_eq!(p.counter(), None);
        assert_eq!(p.inner_payload_len(), 32);
    }

    #[test]
    fn reasons_are_distinct() {
        let o = [
            OpenError::Truncated { have: 0, need: 1 },
            OpenError::BadCounter(0),
            OpenError::Replay(0),
            OpenError::NoKey,
            OpenError::BadTag,
            OpenError::BadInner,
            OpenError::BufferTooSmall { have: 0, need: 1 },
            OpenError::NotEncrypt { mode: Mode::Auth },
            OpenError::BadFrame(crate::wire::relay::RelayError::BadKind(0x60)),
        ];
        let s: std::collections::HashSet<_> = o.iter().map(|e| e.reason()).collect();
        assert_eq!(s.len(), o.len());
    }
}
