//! The session key and the subkeys derived from it. Owns key-separation: every use of the session key
//! (addresses, ports, jitter, each data direction) gets its own BLAKE3 `derive_key` context, so no two
//! uses ever share a key (docs/PROTOCOL.md §2.3).

use std::fmt;

use zeroize::{Zeroize, Zeroizing};

use crate::{AeadAlg, ProtoError};

/// The pre-shared key of a stream (000 §2.5.1; 16..=64 bytes). Zeroized on drop, redacted in `Debug`.
#[derive(Clone)]
pub struct SessionKey(Zeroizing<Vec<u8>>);

impl SessionKey {
    /// Smallest accepted key (128 bits).
    pub const MIN_LEN: usize = 16;
    /// Largest accepted key (512 bits, the thesis's key size).
    pub const MAX_LEN: usize = 64;

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

/// BLAKE3 `derive_key` contexts. Format per the BLAKE3 docs: "[application] [date] [purpose]".
/// Changing any of these is a wire-incompatible change.
pub(crate) mod context {
    pub const ADDRESS: &str = "mt6d-proto 2025-01-01 hashed address key";
    pub const PORT: &str = "mt6d-proto 2025-01-01 port hopping key";
    pub const JITTER: &str = "mt6d-proto 2025-01-01 epoch jitter key";
    pub const NOTICE: &str = "mt6d-proto 2026-12-01 route move notice key";
    pub const DATA_AES_ROLE0: &str = "mt6d-proto 2025-01-01 data key aes256-gcm sender role 0";
    pub const DATA_AES_ROLE1: &str = "mt6d-proto 2025-01-01 data key aes256-gcm sender role 1";
    pub const DATA_CHACHA_ROLE0: &str =
        "mt6d-proto 2025-01-01 data key chacha20-poly1305 sender role 0";
    pub const DATA_CHACHA_ROLE1: &str =
        "mt6d-proto 2025-01-01 data key chacha20-poly1305 sender role 1";
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

/// The data (AEAD) key used by the sender holding `sender_role` (0 or 1) with `alg`.
pub(crate) fn data_key(key: &SessionKey, alg: AeadAlg, sender_role: u8) -> Subkey {
    let ctx = match (alg, sender_role) {
        (AeadAlg::Aes256Gcm, 0) => context::DATA_AES_ROLE0,
        (AeadAlg::Aes256Gcm, _) => context::DATA_AES_ROLE1,
        (AeadAlg::ChaCha20Poly1305, 0) => context::DATA_CHACHA_ROLE0,
        (AeadAlg::ChaCha20Poly1305, _) => context::DATA_CHACHA_ROLE1,
    };
    Subkey::derive(ctx, key)
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
        let all = [
            Subkey::derive(context::ADDRESS, &k),
            Subkey::derive(context::PORT, &k),
            Subkey::derive(context::JITTER, &k),
            data_key(&k, AeadAlg::Aes256Gcm, 0),
            data_key(&k, AeadAlg::Aes256Gcm, 1),
            data_key(&k, AeadAlg::ChaCha20Poly1305, 0),
            data_key(&k, AeadAlg::ChaCha20Poly1305, 1),
        ];
        for (i, a) in all.iter().enumerate() {
            for b in &all[i + 1..] {
                assert_ne!(a.as_bytes(), b.as_bytes());
            }
        }
    }
}
