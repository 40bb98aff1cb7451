//! Configuration-layer errors. Per-packet errors live next to the code that raises them
//! ([`crate::SealError`], [`crate::OpenError`], [`crate::wire::WireError`], [`crate::icmp::IcmpError`]).

use std::net::Ipv6Addr;

/// Why a key or a stream configuration was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ProtoError {
    /// Session keys are 16..=64 bytes (000 §2.5.1: the reference used 512 bits).
    #[error("session key is {len} bytes; it must be 16..=64 bytes")]
    KeyLength {
        /// Length given.
        len: usize,
    },
    /// Both endpoints of a stream have the same true address, so roles cannot be assigned.
    #[error(
        "local and remote true address are both {addr}; a stream needs two distinct endpoints"
    )]
    SameTrueAddress {
        /// The shared address.
        addr: Ipv6Addr,
    },
    /// Rotation intervals below one second are refused (address binding and DAD take that long, 001 §4.1.1).
    #[error("rotation interval {ms} ms is below the 1000 ms minimum")]
    RotationTooShort {
        /// Interval given, in milliseconds.
        ms: u128,
    },
    /// Rotation intervals must fit the u64 millisecond arithmetic of the schedule (and be sane).
    #[error("rotation interval {ms} ms is above the 1-year maximum")]
    RotationTooLong {
        /// Interval given, in milliseconds.
        ms: u128,
    },
    /// A rotation interval with a sub-millisecond part.
    #[error("rotation interval must be a whole number of milliseconds")]
    RotationNotMillis,
    /// `PortPolicy::Fixed(p)` with a well-known port (0..=1023).
    #[error("fixed tunnel port {port} is a well-known port; use 1024..=65535")]
    FixedPortReserved {
        /// Port given.
        port: u16,
    },
    /// A multicast/unspecified/loopback true address cannot be an MT6D endpoint.
    #[error("{addr} cannot be a true address (unspecified, loopback or multicast)")]
    BadTrueAddress {
        /// Address given.
        addr: Ipv6Addr,
    },
    /// The peer's public key is this gateway's own.
    #[error("the peer's public key is this gateway's own public key")]
    SamePublicKey,
    /// The peer's public key is a low-order point (X25519 would give an all-zero secret).
    #[error("the peer's public key is a weak (low-order) X25519 point")]
    WeakPublicKey,
    /// Handshake keys need a counter and a tag: mode auth or encrypt.
    #[error("handshake keys need mode \"auth\" or \"encrypt\"; \"plain\" works only with a pre-shared session key")]
    HandshakeNeedsAead,
    /// Rekey intervals below one second are refused.
    #[error("rekey interval {ms} ms is below the 1000 ms minimum")]
    RekeyTooShort {
        /// Interval given, in milliseconds.
        ms: u128,
    },
    /// Unknown name for a `FromStr` enum.
    #[error("unknown {what} {given:?}; expected one of {expected}")]
    UnknownName {
        /// Which setting.
        what: &'static str,
        /// What was given.
        given: String,
        /// Accepted spellings.
        expected: &'static str,
    },
}
