//! Zero loss at rotation across a router (001 §4.2, Fig. 3-4): the on-link neighbour that will
//! deliver packets to a new hashed address learns that address shortly before any packet needs
//! it, and no earlier (docs/PROTOCOL.md §5.1).
//!
//! Without this, the first packets to a new hashed address reach a router that must first
//! resolve it with neighbour discovery; a hardware router queues at most one packet per
//! unresolved neighbour (Linux: `unres_qlen`) and drops the rest. 001 measured 10.16 % loss across
//! a router this way. Both ends know every future address in advance, so between
//! `mt6d_proto::control_plan::PRIME_LEAD_MAX` and [`PRIME_LEAD`] before an epoch starts (at an
//! instant drawn per message, docs/PROTOCOL.md §5.6) the gateway sends, *from* its address of that epoch, a Neighbour Solicitation
//! carrying its own link-layer address, to its next hop: `external_next_hop` (routed), or on one
//! segment the peer gateway's address *of the same epoch* (which the peer has bound an interval
//! early). RFC 4861 §7.2.3: the target creates a neighbour cache entry for the source in state
//! STALE, which it uses at once when the first packet arrives (and confirms later with a
//! unicast probe, which the bound address answers); the peer does the same towards us.
//!
//! Linking (the promise "unlinkable on the wire"): the solicitation and its answer name one epoch's
//! addresses and the router's, never two epochs; it is sent when the data is about to name the
//! address anyway. The solicitation carries the gateway's own external MAC and a hashed address:
//! nothing about a protected host (000 §3.2.3).

use std::net::Ipv6Addr;

use mt6d_os::Icmp6Socket;
use mt6d_proto::wire::neighbor_solicitation;

use super::SetupError;

/// The shortest time before an epoch starts that its address is announced. Must exceed the
/// clock skew between the gateways (the peer may start sending that much early), the main
/// loop's tick (20 ms) and the time the neighbour takes to process the solicitation (well under
/// 1 ms); docs/PROTOCOL.md §5.1 argues the value. Always below R/2, the shortest interval.
pub const PRIME_LEAD: std::time::Duration = mt6d_proto::control_plan::PRIME_LEAD_MIN;

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
    ) -> Result<NeighborPrimer, SetupError> {
        let os = |what: &str| {
            let what = what.to_string();
            move |source| SetupError { what, source }
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

    /// Lets the solicitations leave from addresses that are local through a local route only
    /// (the server role's AnyIP prefix) rather than bound to the interface.
    pub fn allow_routed_sources(&self) -> Result<(), mt6d_os::OsError> {
        self.socket.set_freebind()
    }

    /// The neighbour that must learn our address of an epoch: the router, or (one segment) the
    /// peer gateway at `peer_same_epoch`, its hashed address of that same epoch.
    pub fn target(&self, peer_same_epoch: Ipv6Addr) -> Ipv6Addr {
        self.next_hop.unwrap_or(peer_same_epoch)
    }

    /// One segment: the peer gateway is our neighbour (no `external_next_hop`).
    pub fn on_link(&self) -> bool {
        self.next_hop.is_none()
    }

    /// Sends one solicitation for `target` from `from`. Failures are reported, never fatal: the
    /// worst outcome is the loss this module exists to avoid.
    pub fn solicit(&self, from: Ipv6Addr, target: Ipv6Addr) -> Result<(), mt6d_os::OsError> {
        let msg = neighbor_solicitation(target, self.mac);
        // Unicast to the target: a router's link-layer address is known (resolved once, not per
        // epoch); on one segment the kernel resolves the peer's new address first if the peer
        // has not announced it yet, with a multicast solicitation from the same new address of
        // ours, which announces it as well. A multicast solicitation of our own would reach
        // every node.
        self.socket
            .send_via(&msg, target, Some(from), self.external_index)
            .map(|_| ())
    }
}
