//! The settings both gateways of a stream must share, as plain values. Parsing of config files is the
//! daemon's job; this module only gives the enums their stable names (`FromStr`/`Display`).

use std::fmt;
use std::net::Ipv6Addr;
use std::str::FromStr;
use std::time::Duration;

use crate::{ProtoError, SessionKey};

macro_rules! named_enum {
    ($ty:ident, $what:literal, $( $variant:ident => $name:literal ),+ $(,)?) => {
        impl $ty {
            /// The stable configuration name.
            pub const fn name(self) -> &'static str {
                match self { $( $ty::$variant => $name ),+ }
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
        impl FromStr for $ty {
            type Err = ProtoError;
            fn from_str(s: &str) -> Result<Self, ProtoError> {
                match s {
                    $( $name => Ok($ty::$variant), )+
                    _ => Err(ProtoError::UnknownName {
                        what: $what,
                        given: s.to_owned(),
                        expected: concat!($( $name, " " ),+),
                    }),
                }
            }
        }
    };
}

/// Tunnel payload format (docs/PROTOCOL.md §4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Exactly the thesis format: inner header bytes 0..8 then the inner payload (000 §2.6, Fig. 2.5).
    Plain,
    /// Counter, inner bytes in clear, AEAD tag over the outer addresses/ports and everything in clear.
    Auth,
    /// Counter, AEAD ciphertext of the inner bytes, tag. The default (001 §2: encrypted tunnel).
    #[default]
    Encrypt,
}
named_enum!(Mode, "tunnel mode", Plain => "plain", Auth => "auth", Encrypt => "encrypt");

/// AEAD used by `auth` and `encrypt` modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AeadAlg {
    /// AES-256-GCM (000 §3.1.1 chose AES-256; GCM replaces its CBC so packets are authenticated).
    #[default]
    Aes256Gcm,
    /// ChaCha20-Poly1305, for CPUs without AES instructions.
    ChaCha20Poly1305,
}
named_enum!(AeadAlg, "AEAD", Aes256Gcm => "aes256-gcm", ChaCha20Poly1305 => "chacha20-poly1305");

/// How hashed interface identifiers are computed (docs/PROTOCOL.md §2).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Derivation {
    /// Eq. 2.1 of the thesis: SHA-256(true IID || key || salt [|| MAC]) truncated to 64 bits.
    Thesis,
    /// BLAKE3 keyed PRF with a derived address key, role byte and attempt byte.
    #[default]
    Keyed,
}
named_enum!(Derivation, "address derivation", Thesis => "thesis", Keyed => "keyed");

/// Outer UDP ports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PortPolicy {
    /// A keyed-PRF port per endpoint per epoch in 1024..=65535.
    #[default]
    Hopping,
    /// Both endpoints always use this port (1024..=65535).
    Fixed(u16),
}

/// One end of a stream, as both gateways configure it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// The protected host's real address (the inner packet's source or destination).
    pub true_addr: Ipv6Addr,
    /// The /64 that hashed addresses are placed in; `None` = the /64 of `true_addr` (Eq. 2.1).
    /// Only the high 64 bits are used.
    pub external_prefix: Option<Ipv6Addr>,
    /// Optional MAC mixed into the thesis-mode hash (000 §3.1.1). Ignored in keyed mode.
    pub mac: Option<[u8; 6]>,
}

impl Endpoint {
    /// An endpoint whose hashed addresses live in the /64 of its true address, without MAC input.
    pub const fn new(true_addr: Ipv6Addr) -> Self {
        Self {
            true_addr,
            external_prefix: None,
            mac: None,
        }
    }
}

/// Everything needed to build a [`crate::Stream`]. The two gateways' configs are mirror images:
/// `local` of one is `remote` of the other, everything else is equal.
#[derive(Clone, Debug)]
pub struct StreamConfig {
    /// This gateway's protected host.
    pub local: Endpoint,
    /// The peer gateway's protected host.
    pub remote: Endpoint,
    /// Pre-shared session key (000 §2.5.1).
    pub key: SessionKey,
    /// Address derivation.
    pub derivation: Derivation,
    /// Outer port policy.
    pub ports: PortPolicy,
    /// Tunnel payload format.
    pub mode: Mode,
    /// AEAD for `auth`/`encrypt`.
    pub aead: AeadAlg,
    /// Rotation interval R (default 10 s, 000 Table 3.1 `rotation_time`; >= 1 s, whole milliseconds).
    pub rotation: Duration,
    /// Key-derived jitter of epoch boundaries (docs/PROTOCOL.md §3).
    pub jitter: bool,
}

impl StreamConfig {
    /// Default rotation interval: 10 s, the thesis's and 001 §4.1.2's default.
    pub const DEFAULT_ROTATION: Duration = Duration::from_secs(10);

    /// A config with the defaults (keyed derivation, hopping ports, encrypt, AES-256-GCM, 10 s, no jitter).
    pub fn new(local: Endpoint, remote: Endpoint, key: SessionKey) -> Self {
        Self {
            local,
            remote,
            key,
            derivation: Derivation::default(),
            ports: PortPolicy::default(),
            mode: Mode::default(),
            aead: AeadAlg::default(),
            rotation: Self::DEFAULT_ROTATION,
            jitter: false,
        }
    }

    /// The peer's view of the same stream (local and remote swapped).
    pub fn mirrored(&self) -> Self {
        let mut m = self.clone();
        std::mem::swap(&mut m.local, &mut m.remote);
        m
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_roundtrip() {
        for m in [Mode::Plain, Mode::Auth, Mode::Encrypt] {
            assert_eq!(m.to_string().parse::<Mode>(), Ok(m));
        }
        for a in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            assert_eq!(a.to_string().parse::<AeadAlg>(), Ok(a));
        }
        for d in [Derivation::Thesis, Derivation::Keyed] {
            assert_eq!(d.to_string().parse::<Derivation>(), Ok(d));
        }
        assert_eq!("chacha20-poly1305".parse(), Ok(AeadAlg::ChaCha20Poly1305));
        assert!("rot13".parse::<Mode>().is_err());
        assert_eq!(Mode::default(), Mode::Encrypt);
        assert_eq!(AeadAlg::default(), AeadAlg::Aes256Gcm);
        assert_eq!(Derivation::default(), Derivation::Keyed);
        assert_eq!(PortPolicy::default(), PortPolicy::Hopping);
    }
}
