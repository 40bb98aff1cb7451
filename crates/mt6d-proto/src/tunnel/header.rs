//! Header protection (docs/PROTOCOL.md §4.5): the first 8 bytes of every auth/encrypt tunnel
//! payload - a data packet's counter (phase bit, packet number), a keepalive's counter, a
//! handshake message's type and reserved bytes, a route move notice's type, flags and epoch - are
//! XORed with a mask computed from the payload's last 16 bytes, as QUIC does (RFC 9001 §5.4).
//!
//! ```text
//! | masked (8) | ... | sample = last 16 bytes (AEAD tag or BLAKE3 mac) |
//! mask    = AES-256-ECB(hpKey(sender role), sample)[0..8]          (RFC 9001 §5.4.3, 8 bytes)
//! hpKey(r)= BLAKE3-derive_key("mt6d-proto 2026-11-23 header protection key sender role r",
//!                             sessionKey)
//! ```
//!
//! A layer over *finished* payloads: the sender seals or frames the payload first, then calls
//! [`HeaderKey::protect`]; the receiver calls [`HeaderKey::unprotect`] with the key of the peer's
//! role before it classifies the payload (high bit of byte 0: handshake class) and opens it. So
//! message layouts stay independent of it: the only rule is "first 8 bytes masked from the last
//! 16". Every protected payload is at least [`MIN_PROTECTED_LEN`] = 24 bytes (a keepalive), so the
//! masked bytes and the sample never overlap and unmasking needs only the key and the payload.
//!
//! Why it holds (RFC 9001 §5.4.1, §9.5): the sample is an AEAD tag or a keyed-BLAKE3 mac, different
//! for every packet ever sent (fresh nonce / fresh ephemeral key / different route), so the mask is
//! a PRF output on a fresh input and the masked bytes are uniformly random to anyone without the
//! header key. A constant per-epoch XOR would not do: the low bits of a counter that toggles would
//! still show through (counter mod 2^k).
//!
//! Plain mode is not protected (it has no tag to sample and carries the inner header in clear).
//!
//! **Why AES:** one AES block with AES-NI (the RustCrypto `aes` crate picks it at run time, with a
//! bitsliced constant-time fallback) costs a few nanoseconds; a keyed BLAKE3 of the 16-byte sample
//! measured ~95 ns, a third of an AES-256-GCM seal+open of a 1400-byte packet (docs/PROTOCOL.md
//! §4.5). ring's QUIC header-protection key gives only 5 mask bytes; we mask 8.

use std::fmt;

use aes::cipher::generic_array::GenericArray;
use aes::cipher::{BlockEncrypt, KeyInit};
use aes::Aes256;
use zeroize::Zeroizing;

use crate::addressing::Role;
use crate::SessionKey;

/// Bytes masked at the start of a payload.
pub const MASKED_LEN: usize = 8;
/// Bytes sampled at the end of a payload.
pub const SAMPLE_LEN: usize = 16;
/// Shortest payload that can be protected: the masked bytes and the sample must not overlap.
/// Every auth/encrypt payload is at least this long (a keepalive is exactly 24 bytes).
pub const MIN_PROTECTED_LEN: usize = MASKED_LEN + SAMPLE_LEN;

/// BLAKE3 `derive_key` contexts of the header-protection keys, by sender role.
/// Changing either is a wire-incompatible change.
pub const CONTEXT_ROLE0: &str = "mt6d-proto 2026-11-23 header protection key sender role 0";
/// See [`CONTEXT_ROLE0`].
pub const CONTEXT_ROLE1: &str = "mt6d-proto 2026-11-23 header protection key sender role 1";

/// Why a payload could not be protected or unprotected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HeaderError {
    /// Shorter than the masked bytes plus the sample.
    #[error("tunnel payload of {have} bytes is shorter than the {MIN_PROTECTED_LEN}-byte minimum for header protection")]
    TooShort {
        /// Bytes in the payload.
        have: usize,
    },
}

impl HeaderError {
    /// A stable label for drop counters.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooShort { .. } => "header_too_short",
        }
    }
}

/// The raw 32-byte header-protection key of `sender` (test vectors; [`HeaderKey::derive`] keeps
/// only the AES key schedule).
pub fn key_bytes(session_key: &SessionKey, sender: Role) -> Zeroizing<[u8; 32]> {
    let ctx = match sender {
        Role::Low => CONTEXT_ROLE0,
        Role::High => CONTEXT_ROLE1,
    };
    Zeroizing::new(blake3::derive_key(ctx, session_key.as_bytes()))
}

/// The header-protection key of one sender role (an AES-256 key schedule, zeroized on drop by the
/// `aes` crate's `zeroize` feature), redacted in `Debug`.
#[derive(Clone)]
pub struct HeaderKey(Aes256);

impl HeaderKey {
    /// The key the gateway holding `sender` uses to protect what it sends (and its peer to
    /// unprotect it), from the stream's session key (the link key with identity keys, §9.1).
    pub fn derive(session_key: &SessionKey, sender: Role) -> HeaderKey {
        Self::from_bytes(&key_bytes(session_key, sender))
    }

    /// A key from raw bytes (tests, fuzzing, a second implementation's vectors).
    pub fn from_bytes(bytes: &[u8; 32]) -> HeaderKey {
        HeaderKey(Aes256::new(GenericArray::from_slice(bytes)))
    }

    /// The mask for a 16-byte sample: the first 8 bytes of its AES-256 encryption.
    pub fn mask(&self, sample: &[u8; SAMPLE_LEN]) -> [u8; MASKED_LEN] {
        let mut block = GenericArray::from(*sample);
        self.0.encrypt_block(&mut block);
        let mut m = [0u8; MASKED_LEN];
        m.copy_from_slice(&block[..MASKED_LEN]);
        m
    }

    /// Masks the first 8 bytes of a finished payload (sealed, or framed with its mac), in place.
    pub fn protect(&self, payload: &mut [u8]) -> Result<(), HeaderError> {
        self.apply(payload)
    }

    /// Unmasks the first 8 bytes of a received payload, in place. Anything at least 24 bytes
    /// long unmasks to *something*; a forged or garbled payload then fails its class's check
    /// (tag, mac, type) like any forgery.
    pub fn unprotect(&self, payload: &mut [u8]) -> Result<(), HeaderError> {
        self.apply(payload)
    }

    /// XOR is its own inverse and the sample is never masked, so protect and unprotect are the
    /// same operation.
    fn apply(&self, payload: &mut [u8]) -> Result<(), HeaderError> {
        let len = payload.len();
        if len < MIN_PROTECTED_LEN {
            return Err(HeaderError::TooShort { have: len });
        }
        let (head, rest) = payload.split_at_mut(MASKED_LEN);
        let mut sample = [0u8; SAMPLE_LEN];
        sample.copy_from_slice(&rest[rest.len() - SAMPLE_LEN..]);
        let mask = self.mask(&sample);
        for (b, m) in head.iter_mut().zip(mask) {
            *b ^= m;
        }
        Ok(())
    }
}

impl fmt::Debug for HeaderKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("HeaderKey([redacted])")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> HeaderKey {
        HeaderKey::from_bytes(&[7; 32])
    }

    #[test]
    fn round_trip_touches_only_the_first_eight_bytes() {
        for len in [24usize, 25, 32, 69, 125, 1400] {
            let orig: Vec<u8> = (0..len).map(|i| (i * 31 + 5) as u8).collect();
            let mut p = orig.clone();
            key().protect(&mut p).unwrap();
            assert_ne!(p[..8], orig[..8], "len {len}");
            assert_eq!(p[8..], orig[8..], "len {len}");
            key().unprotect(&mut p).unwrap();
            assert_eq!(p, orig);
        }
    }

    #[test]
    fn short_payloads_are_refused_not_touched() {
        for len in 0..MIN_PROTECTED_LEN {
            let mut p = vec![0xaa; len];
            assert_eq!(
                key().unprotect(&mut p),
                Err(HeaderError::TooShort { have: len })
            );
            assert!(p.iter().all(|&b| b == 0xaa));
        }
    }

    #[test]
    fn mask_depends_on_key_and_every_sample_byte() {
        let s = [0u8; SAMPLE_LEN];
        let m = key().mask(&s);
        assert_ne!(m, HeaderKey::from_bytes(&[8; 32]).mask(&s));
        for i in 0..SAMPLE_LEN {
            let mut t = s;
            t[i] ^= 1;
            assert_ne!(key().mask(&t), m, "sample byte {i}");
        }
    }

    #[test]
    fn roles_get_distinct_keys_and_debug_is_redacted() {
        let k = SessionKey::from_bytes(&[1; 32]).unwrap();
        let (a, b) = (key_bytes(&k, Role::Low), key_bytes(&k, Role::High));
        assert_ne!(*a, *b);
        assert_eq!(*a, blake3::derive_key(CONTEXT_ROLE0, k.as_bytes()));
        let hk = HeaderKey::derive(&k, Role::Low);
        assert_eq!(format!("{hk:?}"), "HeaderKey([redacted])");
        let s = [3u8; SAMPLE_LEN];
        assert_eq!(hk.mask(&s), HeaderKey::from_bytes(&a).mask(&s));
        assert_ne!(hk.mask(&s), HeaderKey::from_bytes(&b).mask(&s));
    }

    /// FIPS-197 Appendix C.3 (AES-256): key 00..1f, plaintext 00112233..ff, ciphertext
    /// 8ea2b7ca516745bfeafc49904b496089: the mask is its first 8 bytes.
    #[test]
    fn mask_is_aes256_of_the_sample() {
        let key: [u8; 32] = core::array::from_fn(|i| i as u8);
        let sample: [u8; 16] = core::array::from_fn(|i| (i as u8) * 0x11);
        assert_eq!(
            HeaderKey::from_bytes(&key).mask(&sample),
            [0x8e, 0xa2, 0xb7, 0xca, 0x51, 0x67, 0x45, 0xbf]
        );
    }
}
