//! Zero loss at rotation across a router (001 §4.2, Fig. 3-4): the on-link neighbour that will
//! deliver packets to a new hashed address learns that address one interval before any packet
//! needs it.
//!
//! Without this, the first packets to a new hashed address reach a router that must first
//! resolve it with neighbour discovery; a hardware router queues at most one packet per
//! unresolved neighbour (Linux: `unres_qlen`) and drops the rest. 001 measured 10.16 % loss across
//! a router this way. Both ends know every future address in advance, and the rotator binds the
//! next epoch's address one interval early (docs/PROTOCOL.md §3), so right after binding it the
//! gateway sends, *from* the new address, a Neighbour Solicitation for its next hop carrying its
//! own link-layer address. RFC 4861 §7.2.3: the target creates a neighbour cache entry for the
//! source in state STALE, which it uses at once when the first packet arrives (and confirms with
//! a unicast probe, which the bound address answers). The next hop is `external_next_hop`
//! (routed), or on one segment the peer gateway's current hashed address: the peer resolves our
//! new address directly, and learns it the same way.
//!
//! The solicitation carries the gateway's own external MAC and a hashed address: nothing about a
//! protected host (000 §3.2.3).

use std::net::Ipv6Addr;

use mt6d_os::Icmp6Socket;
use mt6d_proto::wire::neighbor_solicitation;

use super::GatewayError;

/// Sends the solicitations; owned by the rotator (main thread).
#[derive(Debug)]
pub struct NeighborPrimer {
    socket: Icmp6Socket,
    external_index: u32,
    mac: [u8; 6],
    next_hop: Option<Ipv6Addr>,
}

impl NeighborPrimer {
    /// `mac` is the external interface's link-layer address; `next_hop` the configured router.
    pub fn open(
        external_index: u32,
        mac: [u8; 6],
        next_hop: Option<Ipv6Addr>,
    ) -> Result<NeighborPrimer, GatewayError> {
        let os = |what: &str| {
            let what = what.to_string();
            move |source| GatewayError::Os { what, source }
        };
        let socket = Icmp6Socket::open().map_err(os("open neighbour discovery socket"))?;
        // Send only: a raw ICMPv6 socket would otherwise queue a copy of every message received.
        socket
            .set_filter_pass_only(&[])
            .map_err(os("neighbour discovery socket filter"))?;
        socket
            .set_hop_limit(255)
            .map_err(os("neighbour discovery hop limit"))?;
        Ok(NeighborPrimer {
            socket,
            external_index,
            mac,
            next_hop,
        })
    }

    /// The neighbour that must learn our new addresses: the router, or (one segment) the peer
    /// gateway at `peer_now`, its hashed address of the current epoch.
    pub fn target(&self, peer_now: Ipv6Addr) -> Ipv6Addr {
        self.next_hop.unwrap_or(peer_now)
    }

    /// Sends one solicitation for `target` from `from`. Failures are reported, never fatal: the
    /// worst outcome is the loss this module exists to avoid.
    pub fn solicit(&self, from: Ipv6Addr, target: Ipv6Addr) -> Result<(), mt6d_os::OsError> {
        let msg = neighbor_solicitation(target, self.mac);
        // Unicast to the target: it is our next hop, so its link-layer address is known (or is
        // resolved once, not per epoch); a multicast solicitation would reach every node.
        self.socket
            .send_via(&msg, target, Some(from), self.external_index)
            .map(|_| ())
    }
}
