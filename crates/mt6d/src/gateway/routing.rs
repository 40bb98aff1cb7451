//! The routing state the data plane reads: for every peer, the route to send on now and the
//! routes to accept, plus the map from a local (hashed address, port) back to its peer and epoch.
//!
//! A new [`RouteTable`] is built at every rotation and published with one atomic pointer swap
//! (000 §3.1.2 does the same with atomic route-list pointers), so the packet threads never take
//! a lock: they load the current table once per batch.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv6Addr;
use std::sync::Arc;

use mt6d_os::UdpSocket6;
use mt6d_proto::{Route, Schedule, UnixTime};

use super::peer::Peer;

/// The routes of one peer at the time the table was built.
#[derive(Debug, Clone)]
pub struct PeerRoutes {
    pub schedule: Schedule,
}

/// Everything the packet threads need to pick or recognise a route.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Indexed like the daemon's peer list.
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
    pub fn compute(peers: &[Arc<Peer>], now: UnixTime) -> RouteTable {
        let mut table = RouteTable::default();
        for (index, peer) in peers.iter().enumerate() {
            let schedule = peer.stream.schedule_moved(now, &peer.lock_moves());
            for route in schedule.accept {
                table
                    .rx
                    .insert((*route.local.ip(), route.local.port()), (index, route));
            }
            table.peers.push(PeerRoutes { schedule });
        }
        table
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
