//! The routing state the data plane reads: for every peer, the route to send on now and the
//! routes to accept, plus the map from a local (hashed address, port) back to its peer and epoch.
//!
//! A new [`RouteTable`] is built at every rotation and published with one atomic pointer swap
//! (000 §3.1.2 does the same with atomic route-list pointers), so the packet threads never take
//! a lock: they load the current table once per batch.
//!
//! The table also carries the peers themselves: a peer index is only ever read against the
//! table it came from, so a reload that adds or removes peers (`reload.rs`) can never make an
//! index of one peer list name a peer of another. `generation` changes exactly when the peer
//! set does; per-peer state a thread owns (the rx thread's receive keys, path MTUs, liveness) is
//! carried over by peer identity ([`carry_over`]) when it sees a new one.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv6Addr;
use std::sync::Arc;

use mt6d_os::UdpSocket6;
use mt6d_proto::{Route, Schedule, UnixTime};

use super::peer::Peer;

/// One peer and its routes at the time the table was built.
#[derive(Debug, Clone)]
pub struct PeerRoutes {
    pub peer: Arc<Peer>,
    pub schedule: Schedule,
}

/// Everything the packet threads need to pick or recognise a route.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Which peer set this table was built from (bumped by every applied reload).
    pub generation: u64,
    /// The peers in configuration order; an index is valid only in this table.
    pub peers: Vec<PeerRoutes>,
    /// Local (hashed address, port) -> (peer index, the accepted route it belongs to).
    pub rx: HashMap<(Ipv6Addr, u16), (usize, Route)>,
    /// The open tunnel sockets by local port: one per port in use (with port hopping, one per
    /// peer and epoch in the accept window; with a fixed port, one).
    pub sockets: BTreeMap<u16, Arc<UdpSocket6>>,
}

impl RouteTable {
    /// Computes every peer's schedule at `now`, moved epochs at their agreed offsets. Sockets are attached by the caller, which owns
    /// their creation.
    pub fn compute(peers: &[Arc<Peer>], generation: u64, now: UnixTime) -> RouteTable {
        let mut table = RouteTable {
            generation,
            ..RouteTable::default()
        };
        for (index, peer) in peers.iter().enumerate() {
            let schedule = peer.stream.schedule_moved(now, &peer.lock_moves());
            for route in schedule.accept {
                table
                    .rx
                    .insert((*route.local.ip(), route.local.port()), (index, route));
            }
            table.peers.push(PeerRoutes {
                peer: peer.clone(),
                schedule,
            });
        }
        table
    }

    /// Peer `i` of this table.
    pub fn peer(&self, i: usize) -> &Peer {
        &self.peers[i].peer
    }

    /// The peer (stream) of an inner packet: its local host is the source, its remote host the
    /// destination. A linear scan: gateways have a handful of peers, and comparing 32 bytes a
    /// few times beats hashing them.
    pub fn peer_for_inner(&self, src: &[u8], dst: &[u8]) -> Option<usize> {
        self.peers.iter().position(|r| {
            r.peer.stream.remote_true().octets() == dst
                && r.peer.stream.local_true().octets() == src
        })
    }

    /// Every local port the table needs a socket for.
    pub fn local_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.peers
            .iter()
            .flat_map(|p| p.schedule.accept.iter().map(|r| r.local.port()))
    }

    /// Every local hashed address the table needs bound on the external interface.
    pub fn local_addresses(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.peers
            .iter()
            .flat_map(|p| p.schedule.accept.iter().map(|r| *r.local.ip()))
    }

    /// The route to send on for a peer and the socket whose port it uses.
    pub fn send_route(&self, peer: usize) -> Option<(&Route, &Arc<UdpSocket6>)> {
        let route = &self.peers.get(peer)?.schedule.send;
        Some((route, self.sockets.get(&route.local.port())?))
    }
}

/// Per-peer state a thread owns, re-indexed for `table`'s peer set: an unchanged peer (the same
/// `Arc`) keeps its state, a new one gets `fresh`, a removed one's is dropped. Allocates: call
/// it only when the generation changed.
pub fn carry_over<T>(
    old: Vec<(Arc<Peer>, T)>,
    table: &RouteTable,
    mut fresh: impl FnMut(&Arc<Peer>) -> T,
) -> Vec<(Arc<Peer>, T)> {
    let mut old: Vec<Option<(Arc<Peer>, T)>> = old.into_iter().map(Some).collect();
    table
        .peers
        .iter()
        .map(|r| {
            old.iter_mut()
                .find(|o| o.as_ref().is_some_and(|(p, _)| Arc::ptr_eq(p, &r.peer)))
                .and_then(Option::take)
                .unwrap_or_else(|| (r.peer.clone(), fresh(&r.peer)))
        })
        .collect()
}
