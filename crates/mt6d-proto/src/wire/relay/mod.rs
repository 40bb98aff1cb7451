//! The relay layer's wire vocabulary (docs/PROTOCOL.md §10): node ids, the relay frame and the
//! errors of every relay format. Here, below both the tunnel layer (which seals and opens frames
//! on relay links) and the relay layer (`crate::relay`, which routes them), so that neither
//! imports the other for it.

pub mod frame;

use std::fmt;

/// Bytes of a node id.
pub const NODE_ID_LEN: usize = 8;

/// A node's name in the relay network: the first 8 bytes of a BLAKE3 key derivation from its
/// identity public key (docs/PROTOCOL.md §10.1), so it needs no numbering authority and nobody can
/// grind a key onto someone else's id (2^64 work). All-zero is reserved: link-local frames carry
/// it as "no destination".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NodeId([u8; NODE_ID_LEN]);

impl NodeId {
    /// The reserved all-zero id.
    pub const RESERVED: NodeId = NodeId([0; NODE_ID_LEN]);

    /// An id from its bytes (as read from the wire or from a test).
    pub const fn from_bytes(bytes: [u8; NODE_ID_LEN]) -> NodeId {
        NodeId(bytes)
    }
    /// The 8 bytes.
    pub const fn as_bytes(&self) -> &[u8; NODE_ID_LEN] {
        &self.0
    }
    /// Whether this is the reserved all-zero id.
    pub fn is_reserved(&self) -> bool {
        self.0 == [0; NODE_ID_LEN]
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in &self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "NodeId({self})")
    }
}

/// Why bytes could not be read (or written) as a relay frame, probe or routing message. Every
/// variant is a dropped frame with a stable label ([`RelayError::reason`]) for counters; none is
/// answered (docs/PROTOCOL.md §10.3, §10.6, §10.9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RelayError {
    /// Fewer bytes than the format's fixed part or than a length field claims.
    #[error("{what}: {have} bytes, need {need}")]
    Truncated {
        /// Which format.
        what: &'static str,
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
    /// A relay header kind other than 0x01..=0x04.
    #[error("relay frame of unknown kind {0:#04x}")]
    BadKind(u8),
    /// A hop limit the kind does not allow (0 on a forwarded kind, not 1 on a link-local one).
    #[error("relay frame of kind {kind:#04x} with hop limit {hops}")]
    BadHops {
        /// The kind byte.
        kind: u8,
        /// The hop limit.
        hops: u8,
    },
    /// A forwarded frame whose payload is shorter than a route tag plus a keepalive.
    #[error("relay frame payload of {len} bytes is shorter than {min}")]
    BadLength {
        /// The length field.
        len: usize,
        /// The minimum for the kind.
        min: usize,
    },
    /// A forwarded frame with the reserved destination, or a link-local one with another.
    #[error("relay frame of kind {kind:#04x} with a destination its kind does not allow")]
    BadDestination {
        /// The kind byte.
        kind: u8,
    },
    /// Non-zero bytes after the payload.
    #[error("relay frame with non-zero padding")]
    BadPadding,
    /// A probe that is not 8 bytes of a known type with zero reserved bytes.
    #[error("probe: malformed {field}")]
    BadProbe {
        /// Which field.
        field: &'static str,
    },
    /// A routing message that breaks a rule of §10.9.
    #[error("routing message: malformed {field}")]
    BadRouting {
        /// Which field.
        field: &'static str,
    },
    /// A payload too long for the length field or for the frame being written.
    #[error("payload of {len} bytes does not fit a relay frame of at most {max}")]
    TooLong {
        /// Payload bytes.
        len: usize,
        /// The most that fits.
        max: usize,
    },
    /// A header to write whose length field is not the length of the payload given with it.
    #[error("header says {field} bytes of payload, {payload} given")]
    LengthMismatch {
        /// The header's length field.
        field: usize,
        /// The payload's length.
        payload: usize,
    },
    /// The output buffer is too small for the frame or message being written.
    #[error("buffer of {have} bytes too small, need {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
    /// An end-to-end payload whose route tag names no route of the receiver's accept windows
    /// (§10.5): not for any bound set, from an epoch outside e-1..=e+1, or forged.
    #[error("route tag {0:02x?} names no route of an accept window")]
    UnknownTag([u8; 8]),
}

impl RelayError {
    /// A stable label for drop counters (the names of docs/PROTOCOL.md §10).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Truncated { .. } => "relay_truncated",
            Self::BadKind(_) => "relay_bad_kind",
            Self::BadHops { .. } => "relay_bad_hops",
            Self::BadLength { .. } => "relay_bad_length",
            Self::BadDestination { .. } => "relay_bad_destination",
            Self::BadPadding => "relay_bad_padding",
            Self::BadProbe { .. } => "relay_bad_probe",
            Self::BadRouting { .. } => "relay_bad_routing",
            Self::TooLong { .. } => "relay_too_long",
            Self::LengthMismatch { .. } => "relay_length_mismatch",
            Self::BufferTooSmall { .. } => "relay_buffer_too_small",
            Self::UnknownTag(_) => "relay_unknown_tag",
        }
    }
}

pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

pub(crate) fn read_node_id(b: &[u8], at: usize) -> NodeId {
    let mut id = [0u8; NODE_ID_LEN];
    id.copy_from_slice(&b[at..at + NODE_ID_LEN]);
    NodeId(id)
}
