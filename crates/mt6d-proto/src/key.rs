//! The session key and the subkeys derived from it. Owns key-separation: every use of the session key
//! (addresses, ports, jitter, each data direction) gets its own BLAKE3 `derive_key` context, so no two
//! uses ever share a key (docs/PROTOCOL.md §2.3).

use std::fmt;
use std::net::Ipv6Addr;

use zeroize::{Zeroize, Zeroizing};

use crate::{AeadAlg, Mode, ProtoError};

/// The pre-shared key of a stream (000 §2.5.1; 16..=64 bytes). Zeroized on drop, redacted in `Debug`.
#[derive(Clone)]
pub struct SessionKey(Zeroizing<Vec<u8>>);

impl SessionKey {
    /// Smallest accepted key (128 bits).
    pub const MIN_LEN: usize = 16;
    /// Largest accepted key (512 bits, the thesis's key size).
    pub const MAX_LEN: usize = 64;

    /// A 256-bit key derived by the protocol itself (within the bounds above, so it cannot fail).
    pub fn from_derived(bytes: &[u8; 32]) -> Self {
        Self(Zeroizing::new(bytes.to_vec()))
    }

    /// Copies `bytes` into a new key.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, ProtoError> {
        if !(Self::MIN_LEN..=Self::MAX_LEN).contains(&bytes.len()) {
            return Err(ProtoError::KeyLength { len: bytes.len() });
        }
        Ok(Self(Zeroizing::new(bytes.to_vec())))
    }

    /// The raw key bytes (thesis-mode hashing uses them directly, Eq. 2.1).
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl fmt::Debug for SessionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SessionKey([redacted; {} bytes])", self.0.len())
    }
}

/// BLAKE3 `derive_key` contexts. Format per the BLAKE3 docs: "\[application\] \[date\] \[purpose\]".
/// Changing any of these is a wire-incompatible change.
pub(crate) mod context {
    pub const ADDRESS: &str = "mt6d-proto 2025-01-01 hashed address key";
    pub const PORT: &str = "mt6d-proto 2025-01-01 port hopping key";
    pub const JITTER: &str = "mt6d-proto 2025-01-01 epoch jitter key";
    pub const NOTICE: &str = "mt6d-proto 2026-12-01 route move notice key";
    /// Pre-shared data keys bind the whole stream direction (docs/PROTOCOL.md §2.3, §4.3): the
    /// 2025 contexts derived them from (key, AEAD, role) only, so two streams sharing a key file
    /// sealed under one key.
    pub const STREAM_DATA_AES: &str = "mt6d-proto 2026-11-23 stream data key aes256-gcm";
    pub const STREAM_DATA_CHACHA: &str = "mt6d-proto 2026-11-23 stream data key chacha20-poly1305";
    /// Names the counter state file of a pre-shared stream direction (one-way: the file name says
    /// nothing about the key).
    pub const COUNTER_STATE_ID: &str = "mt6d-proto 2026-11-23 counter state id";
}

/// A 256-bit derived key, zeroized on drop, redacted in `Debug`.
#[derive(Clone)]
pub struct Subkey([u8; 32]);

impl Subkey {
    pub(crate) fn derive(context: &str, key: &SessionKey) -> Self {
        Self(blake3::derive_key(context, key.as_bytes()))
    }
    /// The key bytes.
    pub fn as_bytes(&self) -> &[u8; 32] {
        &self.0
    }
}

impl Drop for Subkey {
    fn drop(&mut self) {
        self.0.zeroize();
    }
}

impl fmt::Debug for Subkey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Subkey([redacted])")
    }
}

/// The pre-shared data (AEAD) key of one stream direction: the sender at `sender_true` (role
/// `sender_role`, 0 or 1) sealing for `receiver_true` in `mode` with `alg` (docs/PROTOCOL.md §2.3):
///
/// ```text
/// dataKey = BLAKE3-derive_key(ctx(alg), sessionKey || mode(1) || senderRole(1)
///                                        || senderTrue(16) || receiverTrue(16))
/// ```
/// `mode` is 1 for auth, 2 for encrypt. The key is the only variable-length input and comes
/// first; the 34 bytes after it are fixed, so the encoding is injective. Two `[[peer]]`s sharing a
/// key file therefore never share a data key unless they are the same stream.
pub(crate) fn data_key(
    key: &SessionKey,
    alg: AeadAlg,
    mode: Mode,
    sender_role: u8,
    sender_true: Ipv6Addr,
    receiver_true: Ipv6Addr,
) -> Subkey {
    let ctx = match alg {
        AeadAlg::Aes256Gcm => context::STREAM_DATA_AES,
        AeadAlg::ChaCha20Poly1305 => context::STREAM_DATA_CHACHA,
    };
    let mode = match mode {
        Mode::Plain => 0u8,
        Mode::Auth => 1,
        Mode::Encrypt => 2,
    };
    let mut h = blake3::Hasher::new_derive_key(ctx);
    h.update(key.as_bytes());
    h.update(&[mode, sender_role]);
    h.update(&sender_true.octets());
    h.update(&receiver_true.octets());
    Subkey(*h.finalize().as_bytes())
}

/// The name of the counter state file of the direction sealed with `data`: 16 hex digits of a
/// one-way function of the data key (docs/PROTOCOL.md §4.3).
pub(crate) fn counter_state_id(data: &Subkey) -> String {
    let id = blake3::derive_key(context::COUNTER_STATE_ID, data.as_bytes());
    id[..8].iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_bounds() {
        assert_eq!(
            SessionKey::from_bytes(&[0; 15]).unwrap_err(),
            ProtoError::KeyLength { len: 15 }
        );
        assert!(SessionKey::from_bytes(&[0; 16]).is_ok());
        assert!(SessionKey::from_bytes(&[0; 64]).is_ok());
        assert!(SessionKey::from_bytes(&[0; 65]).is_err());
    }

    #[test]
    fn debug_is_redacted() {
        let k = SessionKey::from_bytes(&[0xAB; 32]).unwrap();
        let s = format!("{k:?}");
        assert!(!s.to_lowercase().contains("ab"), "{s}");
        let sk = Subkey::derive(context::ADDRESS, &k);
        assert_eq!(format!("{sk:?}"), "Subkey([redacted])");
    }

    #[test]
    fn subkeys_differ() {
        let k = SessionKey::from_bytes(&[7; 32]).unwrap();
        let (a, b, c): (Ipv6Addr, Ipv6Addr, Ipv6Addr) = (
            "2001:db8:a::1".parse().unwrap(),
            "2001:db8:b::2".parse().unwrap(),
            "2001:db8:c::3".parse().unwrap(),
        );
        let aes = AeadAlg::Aes256Gcm;
        let chacha = AeadAlg::ChaCha20Poly1305;
        let all = [
            Subkey::derive(context::ADDRESS, &k),
            Subkey::derive(context::PORT, &k),
            Subkey::derive(context::JITTER, &k),
            data_key(&k, aes, Mode::Encrypt, 0, a, b),
            data_key(&k, aes, Mode::Encrypt, 1, b, a),
            data_key(&k, chacha, Mode::Encrypt, 0, a, b),
            data_key(&k, chacha, Mode::Encrypt, 1, b, a),
            data_key(&k, aes, Mode::Auth, 0, a, b),
            // One key file, two peers: A talks to B and to C under the same key and role. Before
            // the stream was bound these two were the same key (shared key files).
            data_key(&k, aes, Mode::Encrypt, 0, a, c),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.as_bytes(), b.as_bytes());
            }
        }
    }
}
