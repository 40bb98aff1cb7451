//! Identity keys (X25519, as WireGuard users know them), the optional extra pre-shared key, and the
//! *link key* both peers compute from them with no message at all (docs/PROTOCOL.md §9.1).

use std::fmt;
use std::net::Ipv6Addr;

use zeroize::Zeroizing;

use crate::{ProtoError, SessionKey};

/// Bytes of an X25519 key (private or public) and of a pre-shared key.
pub const KEY_LEN: usize = 32;

/// BLAKE3 `derive_key` contexts of the handshake layer (changing one is wire-incompatible).
pub(crate) mod context {
    /// The link key of a stream (docs/PROTOCOL.md §9.1): both identities and both true
    /// addresses, so that two streams between the same two identities never share one.
    pub const LINK: &str = "mt6d-proto 2026-11-28 stream link key";
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

/// The true addresses of a stream's two ends, as this side names them: `(local, remote)`.
pub type TrueAddresses = (Ipv6Addr, Ipv6Addr);

/// The link key of one stream between two identities (§9.1): what the stream derives its
/// hashed addresses, ports and jitter from, and the handshake its MAC key. Both peers compute
/// the same value:
///
/// ```text
/// link = BLAKE3-derive_key("mt6d-proto 2026-11-28 stream link key",
///                          X25519(own private, peer public) || psk || lower public || higher public
///                          || lower true address || higher true address)
/// ```
///
/// The true addresses make it the stream's own key: two streams between the same two gateways
/// (Host A with Host B, Host A with Host C) would otherwise share a key, and the end both have
/// in common (Host A) would get the same hashed address and port in both.
pub fn link_key(
    local: &PrivateKey,
    remote: &PublicKey,
    psk: &Psk,
    stream: TrueAddresses,
) -> Result<SessionKey, ProtoError> {
    link_key_with_public(local, &local.public_key(), remote, psk, stream)
}

/// [`link_key`] with `local`'s public key given (it must be `local.public_key()`): one X25519
/// instead of two, for a server computing the link keys of a million clients with one identity.
pub fn link_key_with_public(
    local: &PrivateKey,
    local_public: &PublicKey,
    remote: &PublicKey,
    psk: &Psk,
    (local_true, remote_true): TrueAddresses,
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
    // Addresses in the order of their 16 network-order bytes (§1, §9.2's prologue).
    let (lo_true, hi_true) = if local_true < remote_true {
        (local_true, remote_true)
    } else {
        (remote_true, local_true)
    };
    let mut ikm = Zeroizing::new([0u8; 4 * KEY_LEN + 32]);
    ikm[..KEY_LEN].copy_from_slice(&dh[..]);
    ikm[KEY_LEN..2 * KEY_LEN].copy_from_slice(psk.as_bytes());
    ikm[2 * KEY_LEN..3 * KEY_LEN].copy_from_slice(lo.as_bytes());
    ikm[3 * KEY_LEN..4 * KEY_LEN].copy_from_slice(hi.as_bytes());
    ikm[4 * KEY_LEN..4 * KEY_LEN + 16].copy_from_slice(&lo_true.octets());
    ikm[4 * KEY_LEN + 16..].copy_from_slice(&hi_true.octets());
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

    const HOST_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xa);
    const HOST_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xb);
    const HOST_C: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0xc);

    #[test]
    fn both_peers_compute_the_same_link_key_and_a_psk_changes_it() {
        let a = PrivateKey::generate([1; 32]);
        let b = PrivateKey::generate([2; 32]);
        let none = Psk::none();
        let ab = link_key(&a, &b.public_key(), &none, (HOST_A, HOST_B)).unwrap();
        let ba = link_key(&b, &a.public_key(), &none, (HOST_B, HOST_A)).unwrap();
        assert_eq!(ab.as_bytes(), ba.as_bytes());
        let psk = Psk::from_bytes([9; 32]);
        let ab2 = link_key(&a, &b.public_key(), &psk, (HOST_A, HOST_B)).unwrap();
        assert_ne!(ab.as_bytes(), ab2.as_bytes());
        let c = PrivateKey::generate([3; 32]);
        assert_ne!(
            link_key(&a, &c.public_key(), &none, (HOST_A, HOST_B))
                .unwrap()
                .as_bytes(),
            ab.as_bytes()
        );
    }

    /// Two streams between the same two gateways, one host in common (Host A with Host B,
    /// Host A with Host C): each has its own link key, so Host A's end of them gets different
    /// hashed addresses and ports (with one shared key they were equal, and the receiving
    /// gateway could not tell the streams apart).
    #[test]
    fn two_streams_between_the_same_identities_have_their_own_link_keys() {
        let a = PrivateKey::generate([1; 32]);
        let b = PrivateKey::generate([2; 32]);
        let none = Psk::none();
        let ab = link_key(&a, &b.public_key(), &none, (HOST_A, HOST_B)).unwrap();
        let ac = link_key(&a, &b.public_key(), &none, (HOST_A, HOST_C)).unwrap();
        assert_ne!(ab.as_bytes(), ac.as_bytes());
        let stream = |key: &SessionKey, remote: Ipv6Addr| {
            let cfg = crate::StreamConfig::new(
                crate::Endpoint::new(HOST_A),
                crate::Endpoint::new(remote),
                key.clone(),
            );
            crate::Stream::new(cfg).expect("stream")
        };
        let (rb, rc) = (
            stream(&ab, HOST_B).route(crate::Epoch(7)),
            stream(&ac, HOST_C).route(crate::Epoch(7)),
        );
        assert_ne!(rb.local.ip(), rc.local.ip(), "Host A's end of both streams");
        assert_ne!(rb.local.port(), rc.local.port());
    }

    #[test]
    fn low_order_and_own_public_keys_are_refused() {
        let a = PrivateKey::generate([1; 32]);
        assert_eq!(
            link_key(
                &a,
                &PublicKey::from_bytes([0; 32]),
                &Psk::none(),
                (HOST_A, HOST_B)
            )
            .unwrap_err(),
            ProtoError::WeakPublicKey
        );
        assert_eq!(
            link_key(&a, &a.public_key(), &Psk::none(), (HOST_A, HOST_B)).unwrap_err(),
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
