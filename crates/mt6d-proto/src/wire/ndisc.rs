//! Neighbour Solicitation (RFC 4861 §4.3), emit only: the gateway uses it to make the on-link
//! router (or, on one segment, the peer gateway) create a neighbour cache entry for a hashed
//! address before any traffic needs it (001 §4.2; docs/PROTOCOL.md §5.1).
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |   Type 135    |    Code 0     |          Checksum             |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                           Reserved                            |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! |                       Target Address (16)                     |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! | Type 1 (SLLA) |   Length 1    |  Link-layer address (6)  ...  |
//! +-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+-+
//! ```
//! A receiver that is the target creates or updates an entry for the solicitation's source with
//! the source link-layer address, in state STALE (RFC 4861 §7.2.3): usable at once, confirmed by
//! unicast probes later. The message must leave with hop limit 255 (§7.1).

use std::net::Ipv6Addr;

mod field {
    use core::ops::Range;
    pub const TYPE: usize = 0;
    pub const TARGET: Range<usize> = 8..24;
    pub const OPT_TYPE: usize = 24;
    pub const OPT_LEN: usize = 25;
    pub const OPT_LLADDR: Range<usize> = 26..32;
}

/// Bytes of a Neighbour Solicitation with a source link-layer address option (Ethernet).
pub const NEIGHBOR_SOLICITATION_LEN: usize = 32;
/// ICMPv6 type of a Neighbour Solicitation.
pub const NEIGHBOR_SOLICITATION: u8 = 135;
/// Option type: source link-layer address.
const OPT_SOURCE_LLADDR: u8 = 1;

/// The ICMPv6 part of a Neighbour Solicitation for `target` carrying `mac` as source link-layer
/// address. The checksum is left 0: it covers the IPv6 source, which the sending socket picks
/// (and the kernel fills in the checksum of raw ICMPv6 sockets, RFC 3542 §3.1).
pub fn neighbor_solicitation(target: Ipv6Addr, mac: [u8; 6]) -> [u8; NEIGHBOR_SOLICITATION_LEN] {
    let mut m = [0u8; NEIGHBOR_SOLICITATION_LEN];
    m[field::TYPE] = NEIGHBOR_SOLICITATION;
    m[field::TARGET].copy_from_slice(&target.octets());
    m[field::OPT_TYPE] = OPT_SOURCE_LLADDR;
    m[field::OPT_LEN] = 1; // in units of 8 bytes
    m[field::OPT_LLADDR].copy_from_slice(&mac);
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::hex;

    #[test]
    fn solicitation_bytes() {
        let ns = neighbor_solicitation(
            "2001:db8:a::1".parse().unwrap(),
            [0x02, 0x00, 0x5e, 0x10, 0x20, 0x30],
        );
        assert_eq!(
            ns.to_vec(),
            hex("87000000 00000000 20010db8000a00000000000000000001 0101 02005e102030")
        );
    }
}
