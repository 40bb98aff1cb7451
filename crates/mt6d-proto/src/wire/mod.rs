//! Zero-copy views (`*Packet<T: AsRef<[u8]>>`, checked once by `new_checked`, then accessors cannot
//! panic) and owned `*Repr`s for every format the crate parses, in the style of smoltcp `wire`.
//! Owns byte layouts only: no policy, no crypto.

mod checksum;
mod icmpv6;
mod ipv6;
mod ndisc;
pub mod relay;
mod router;
mod tcp;
mod udp;

pub use checksum::{checksum, combine, pseudo_header_sum, upper_layer_checksum};
pub use icmpv6::{Icmpv6Packet, Icmpv6Repr, Icmpv6Type};
pub use ipv6::{
    address_bytes, Ipv6Packet, Ipv6Repr, IPV6_DST_ADDR, IPV6_HEADER_LEN, IPV6_SRC_ADDR,
    NEXT_HEADER_ICMPV6, NEXT_HEADER_NONE, NEXT_HEADER_TCP, NEXT_HEADER_UDP,
};
pub use ndisc::{
    advertisement_frame, confirmation_probe_frame, dad_probe_frame, neighbor_solicitation,
    solicited_node, NeighborClaim, NeighborFrame, ADVERTISEMENT_FRAME_LEN,
    CONFIRMATION_PROBE_FRAME_LEN, DAD_PROBE_FRAME_LEN, ETHERNET_HEADER_LEN, NEIGHBOR_ADVERTISEMENT,
    NEIGHBOR_SOLICITATION, NEIGHBOR_SOLICITATION_LEN,
};
pub use router::{
    router_advertisement, router_solicitation, RouterMessage, ROUTER_ADVERTISEMENT,
    ROUTER_ADVERTISEMENT_LEN, ROUTER_SOLICITATION, ROUTER_SOLICITATION_LEN,
};
pub use tcp::{
    flags as tcp_flags, TcpPacket, TcpRepr, TCP_CHECKSUM_OFFSET, TCP_HEADER_LEN, TCP_MAX_HEADER_LEN,
};
pub use udp::{UdpPacket, UdpRepr, UDP_HEADER_LEN};

/// Why bytes could not be read as a packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// Fewer bytes than the header, or than a length field claims.
    #[error("{what}: {have} bytes, need {need}")]
    Truncated {
        /// Which format.
        what: &'static str,
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
    /// A field has a value the format does not allow (IPv6 version != 6, UDP length < 8, ...).
    #[error("{what}: malformed {field}")]
    Malformed {
        /// Which format.
        what: &'static str,
        /// Which field.
        field: &'static str,
    },
    /// The output buffer is too small for `emit`.
    #[error("buffer of {have} bytes too small, need {need}")]
    BufferTooSmall {
        /// Bytes available.
        have: usize,
        /// Bytes required.
        need: usize,
    },
}

pub(crate) fn read_u16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

pub(crate) fn read_u32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[cfg(test)]
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}
