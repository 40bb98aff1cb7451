//! What the daemon's threads share: the peers, the published route table and the shutdown flag.
//! Its own file because every thread's module names it (the packet threads, the collision
//! watch, the ICMPv6 and router threads, the rotation), and none of them should have to import
//! another thread's module for it.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_swap::ArcSwap;

use super::counters::DirectionCounters;
use super::peer::Peer;
use super::routing::RouteTable;

/// What both packet threads share.
#[derive(Debug)]
pub struct Shared {
    pub peers: Vec<Arc<Peer>>,
    pub table: ArcSwap<RouteTable>,
    pub shutdown: AtomicBool,
    /// Packets that match no peer (unknown inner destination, unknown outer route).
    pub unmatched: DirectionCounters,
}

impl Shared {
    /// The peer (stream) of an inner packet: its local host is the source, its remote host the
    /// destination. A linear scan: gateways have a handful of peers, and comparing 32 bytes a
    /// few times beats hashing them.
    pub(super) fn peer_for_inner(&self, src: &[u8], dst: &[u8]) -> Option<usize> {
        self.peers.iter().position(|p| {
            p.stream.remote_true().octets() == dst && p.stream.local_true().octets() == src
        })
    }
}
