//! Identity keys (X25519, as WireGuard users know them), the optional extra pre-shared key, and the
//! *link key* both peers compute from them with no message at all (docs/PROTOCOL.md §9.1).

use std::fmt;

use zeroize::Zeroizing;

use crate::{ProtoError, SessionKey};

/// Bytes of an X25519 key (private or public) and of a pre-shared key.
pub const KEY_LEN: usize = 32;

/// BLAKE3 `derive_key` contexts of the handshake layer (changing one is wire-incompatible).
pub(crate) mod context {
    pub const LINK: &str = "mt6d-proto 2026-11-21 static link key";
    pub const MAC: &str = "mt6d-proto 2026-11-21 handshake mac key";
    pub const DATA_AES: &str = "mt6d-proto 2026-11-21 session data key aes256-gcm";
    pub const DATA_CHACHA: &str = "mt6d-proto 2026-11-21 session data key chacha20-poly1305";
    /// Session route key (docs/PROTOCOL.md §9.8).
    pub const ROUTE: &str = "mt6d-proto 2026-11-24 session route key";
}

/// A gateway's X25519 private key. Zeroized on drop, redacted in `Debug`.
#[derive(Clone)]
pub struct PrivateKey(x25519_dalek::StaticSecret);

impl PrivateKey {
    /// The key from its 32 bytes (clamping is applied by X25519 itself).
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> PrivateKey {
        PrivateKey(x25519_dalek::StaticSecret::from(bytes))
    }
    /// A new key from 32 bytes of caller-supplied randomness (this crate reads no RNG).
    pub fn generate(entropy: [u8; KEY_LEN]) -> PrivateKey {
        Self::from_bytes(entropy)
    }
    /// The public key to give to peers.
    pub fn public_key(&self) -> PublicKey {
        PublicKey(x25519_dalek::PublicKey::from(&self.0).to_bytes())
    }
    /// The raw bytes, for writing the key file.
    pub fn to_bytes(&self) -> Zeroizing<[u8; KEY_LEN]> {
        Zeroizing::new(self.0.to_bytes())
    }
    /// X25519 with `peer` by AWS-LC (25 us here against curve25519-dalek's 38 us: a server
    /// computes one per client at start; `cargo bench -p mt6d-proto --bench proto --
    /// handshake/x25519`). A low-order peer key gives an all-zero (non-contributory) result,
    /// which AWS-LC refuses: None.
    fn diffie_hellman(&self, peer: &PublicKey) -> Option<Zeroizing<[u8; KEY_LEN]>> {
        use aws_lc_rs::agreement;
        let private = self.to_bytes();
        let key = agreement::PrivateKey::from_private_key(&agreement::X25519, &private[..]).ok()?;
        let mut out = Zeroizing::new([0u8; KEY_LEN]);
        agreement::agree(
            &key,
            agreement::UnparsedPublicKey::new(&agreement::X25519, &peer.0[..]),
            (),
            |secret| {
                out.copy_from_slice(secret);
                Ok(())
            },
        )
        .ok()?;
        Some(out)
    }
}

impl fmt::Debug for PrivateKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PrivateKey([redacted], public {})", self.public_key())
    }
}

/// A peer's X25519 public key.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PublicKey([u8; KEY_LEN]);

impl PublicKey {
    /// The key from its 32 bytes.
    pub const fn from_bytes(bytes: [u8; KEY_LEN]) -> PublicKey {
        PublicKey(bytes)
    }
    /// The raw bytes.
    pub const fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PublicKey({self})")
    }
}

/// Hex of the first 8 bytes: enough to tell keys apart in logs (config files use base64).
impl fmt::Display for PublicKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0[..8] {
            write!(f, "{b:02x}")?;
        }
        f.write_str("..")
    }
}

/// The optional per-peer pre-shared key mixed into the handshake (Noise `psk2`, as WireGuard does)
/// and into the link key: a hedge against a future break of X25519. Zeroized on drop.
#[derive(Clone)]
pub struct Psk(Zeroizing<[u8; KEY_LEN]>);

impl Psk {
    /// The key from its 32 bytes.
    pub fn from_bytes(bytes: [u8; KEY_LEN]) -> Psk {
        Psk(Zeroizing::new(bytes))
    }
    /// No pre-shared key: 32 zero bytes (Noise's and WireGuard's convention).
    pub fn none() -> Psk {
        Psk(Zeroizing::new([0u8; KEY_LEN]))
    }
    pub(crate) fn as_bytes(&self) -> &[u8; KEY_LEN] {
        &self.0
    }
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk([redacted])")
    }
}

/// The link key of a pair of identities (§9.1): what the stream derives its hashed addresses,
/// ports and jitter from, and the handshake its MAC key. Both peers compute the same value:
///
/// ```text
/// link = BLAKE3-derive_key("mt6d-proto 2026-11-21 static link key",
///                          X25519(own private, peer public) || psk || lower public || higher public)
/// ```
pub fn link_key(
    local: &PrivateKey,
    remote: &PublicKey,
    psk: &Psk,
) -> Result<SessionKey, ProtoError> {
    link_key_with_public(local, &local.public_key(), remote, psk)
}

/// [`link_key`] with `local`'s public key given (it must be `local.public_key()`): one X25519
/// instead of two, for a server computing the link keys of a million clients with one identity.
pub fn link_key_with_public(
    local: &PrivateKey,
    local_public: &PublicKey,
    remote: &PublicKey,
    psk: &Psk,
) -> Result<SessionKey, ProtoError> {
    let local_public = *local_public;
    if local_public == *remote {
        return Err(ProtoError::SamePublicKey);
    }
    let dh = local
        .diffie_hellman(remote)
        .ok_or(ProtoError::WeakPublicKey)?;
    let (lo, hi) = if local_public < *remote {
        (local_public, *remote)
    } else {
        (*remote, local_public)
    };
    let mut ikm = Zeroizing::new([0u8; 4 * KEY_LEN]);
    ikm[..KEY_LEN].copy_from_slice(&dh[..]);
    ikm[KEY_LEN..2 * KEY_LEN].copy_from_slice(psk.as_bytes());
    ikm[2 * KEY_LEN..3 * KEY_LEN].copy_from_slice(lo.as_bytes());
    ikm[3 * KEY_LEN..].copy_from_slice(hi.as_bytes());
    let link = Zeroizing::new(blake3::derive_key(context::LINK, &ikm[..]));
    SessionKey::from_bytes(&link[..])
}

/// The route key of one completed handshake (docs/PROTOCOL.md §9.8): the key of the session's
/// route set (addresses, ports, header keys, MACs; the jitter stays the link key's) that only the two
/// holders of the handshake's ephemeral keys can compute. Both sides pass the initiator-to-responder
/// key first, so both compute the same value:
///
/// ```text
/// route = BLAKE3-derive_key("mt6d-proto 2026-11-24 session route key",
///                           k_i2r(32) || k_r2i(32) || handshakeHash(32))
/// ```
pub fn session_route_key(
    k_i2r: &[u8; KEY_LEN],
    k_r2i: &[u8; KEY_LEN],
    handshake_hash: &[u8; KEY_LEN],
) -> SessionKey {
    let mut ikm = Zeroizing::new([0u8; 3 * KEY_LEN]);
    ikm[..KEY_LEN].copy_from_slice(k_i2r);
    ikm[KEY_LEN..2 * KEY_LEN].copy_from_slice(k_r2i);
    ikm[2 * KEY_LEN..].copy_from_slice(handshake_hash);
    let route = Zeroizing::new(blake3::derive_key(context::ROUTE, &ikm[..]));
    SessionKey::from_derived(&route)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_peers_compute_the_same_link_key_and_a_psk_changes_it() {
        let a = PrivateKey::generate([1; 32]);
        let b = PrivateKey::generate([2; 32]);
        let none = Psk::none();
        let ab = link_key(&a, &b.public_key(), &none).unwrap();
        let ba = link_key(&b, &a.public_key(), &none).unwrap();
        assert_eq!(ab.as_bytes(), ba.as_bytes());
        let psk = Psk::from_bytes([9; 32]);
        let ab2 = link_key(&a, &b.public_key(), &psk).unwrap();
        assert_ne!(ab.as_bytes(), ab2.as_bytes());
        let c = PrivateKey::generate([3; 32]);
        assert_ne!(
            link_key(&a, &c.public_key(), &none).unwrap().as_bytes(),
            ab.as_bytes()
        );
    }

    #[test]
    fn low_order_and_own_public_keys_are_refused() {
        let a = PrivateKey::generate([1; 32]);
        assert_eq!(
            link_key(&a, &PublicKey::from_bytes([0; 32]), &Psk::none()).unwrap_err(),
            ProtoError::WeakPublicKey
        );
        assert_eq!(
            link_key(&a, &a.public_key(), &Psk::none()).unwrap_err(),
            ProtoError::SamePublicKey
        );
    }

    #[test]
    fn secrets_are_redacted() {
        let a = PrivateKey::generate([7; 32]);
        let dbg = format!("{a:?} {:?}", Psk::from_bytes([7; 32]));
        assert!(!dbg.contains("0707"), "{dbg}");
    }
}
