//! The routing state the data plane reads: for every peer, the route to send on now and the
//! routes to accept, plus the map from a local (hashed address, port) back to its peer and epoch.
//!
//! A new [`RouteTable`] is published at every rotation with one atomic pointer swap (000
//! §3.1.2 does the same with atomic route-list pointers), so the packet threads never take a
//! lock: they load the current table once per batch. It is made from the one before by a delta
//! ([`RouteTable::advance`]): only the peers whose epoch boundary passed or whose routes changed
//! are derived again and have their receive entries replaced; every other peer's routes are
//! shared with the previous table, and its link is not locked.
//!
//! The table also carries the peers themselves: a peer index is only ever read against the
//! table it came from, so a reload that adds or removes peers (`reload.rs`) can never make an
//! index of one peer list name a peer of another. `generation` changes exactly when the peer
//! set does; per-peer state a thread owns (path MTUs, liveness) is
//! carried over by peer identity ([`carry_over`]) when it sees a new one.

use std::collections::{BTreeMap, HashMap};
use std::net::Ipv6Addr;
use std::sync::Arc;

use mt6d_os::UdpSocket6;
use mt6d_proto::tunnel::HeaderKey;
use mt6d_proto::{Route, Schedule, UnixTime};

use super::peer::Peer;
use mt6d_proto::route_sets::RouteSet;

/// One bound route set of a peer at the time the table was built (docs/PROTOCOL.md §9.8).
#[derive(Debug, Clone)]
pub struct SetRoutes {
    pub set: Arc<RouteSet>,
    /// The set's routes at `now` (moved epochs at their agreed offsets): `send` is the route a
    /// handshake-class message on this set travels on now.
    pub schedule: Schedule,
    /// Whether data may arrive on the set (else only handshake-class messages).
    pub data: bool,
}

/// One peer and its routes at the time the table was built.
#[derive(Debug, Clone)]
pub struct PeerRoutes {
    pub peer: Arc<Peer>,
    /// The bound sets, the link set first.
    pub sets: Vec<SetRoutes>,
    /// Which of `sets` data is sent on.
    pub send_set: usize,
}

impl PeerRoutes {
    /// A peer's bound route sets and their schedules at `now`, moved epochs at their agreed
    /// offsets.
    pub fn compute(peer: &Arc<Peer>, now: UnixTime) -> PeerRoutes {
        let epoch = peer.stream.epoch_at(now);
        let selection = peer.link.lock().sets().select(epoch);
        let mut sets = Vec::with_capacity(selection.bound.len());
        let mut send_set = 0;
        for (s, bound) in selection.bound.into_iter().enumerate() {
            let schedule = bound
                .set
                .stream
                .schedule_moved(now, &bound.set.lock_moves());
            if Arc::ptr_eq(&bound.set, &selection.send) {
                send_set = s;
            }
            sets.push(SetRoutes {
                set: bound.set,
                schedule,
                data: bound.data,
            });
        }
        PeerRoutes {
            peer: peer.clone(),
            sets,
            send_set,
        }
    }

    /// The route data is sent on now.
    pub fn send(&self) -> &Route {
        &self.sets[self.send_set].schedule.send
    }

    /// The set data is sent on now.
    pub fn send_set(&self) -> &SetRoutes {
        &self.sets[self.send_set]
    }

    /// Every accepted route of every bound set.
    pub fn accept(&self) -> impl Iterator<Item = &Route> + '_ {
        self.sets.iter().flat_map(|s| s.schedule.accept.iter())
    }

    /// When the routes change next.
    pub fn next_change(&self) -> UnixTime {
        self.sets[self.send_set].schedule.next_change
    }
}

/// What a local (hashed address, port) belongs to.
#[derive(Debug, Clone, Copy)]
pub struct RxRoute {
    pub peer: usize,
    /// Index into the peer's `sets`.
    pub set: usize,
    pub route: Route,
}

/// Everything the packet threads need to pick or recognise a route.
#[derive(Debug, Default)]
pub struct RouteTable {
    /// Which peer set this table was built from (bumped by every applied reload).
    pub generation: u64,
    /// The peers in configuration order; an index is valid only in this table. Shared with the
    /// tables before and after it for the peers whose routes did not change between them.
    pub peers: Vec<Arc<PeerRoutes>>,
    /// Local (hashed address, port) -> the peer, route set and accepted route it belongs to.
    pub rx: HashMap<(Ipv6Addr, u16), RxRoute>,
    /// The open tunnel sockets by local port: one per port in use (with port hopping, one per
    /// peer, set and epoch in the accept window; with a fixed port, one).
    pub sockets: BTreeMap<u16, Arc<UdpSocket6>>,
    /// (local true, remote true) -> peer, filled only above [`SCAN_PEERS`] peers; shared by
    /// every table of one generation.
    inner: Arc<HashMap<(Ipv6Addr, Ipv6Addr), usize>>,
}

/// Up to this many peers an inner packet's peer is found by comparing addresses in order (a
/// few 32-byte compares beat hashing them); above, by one hash lookup.
pub const SCAN_PEERS: usize = 8;

impl RouteTable {
    /// Computes every peer's bound route sets and their schedules at `now`, moved epochs at their
    /// agreed offsets. Sockets are attached by the caller, which owns their creation.
    pub fn compute(peers: &[Arc<Peer>], generation: u64, now: UnixTime) -> RouteTable {
        let mut table = RouteTable {
            generation,
            ..RouteTable::default()
        };
        for (index, peer) in peers.iter().enumerate() {
            let routes = Arc::new(PeerRoutes::compute(peer, now));
            table.insert_rx(index, &routes);
            table.peers.push(routes);
        }
        if table.peers.len() > SCAN_PEERS {
            table.inner = Arc::new(
                table
                    .peers
                    .iter()
                    .enumerate()
                    .map(|(i, r)| ((r.peer.stream.local_true(), r.peer.stream.remote_true()), i))
                    .collect(),
            );
        }
        table
    }

    /// The table at `now`, made from `prev` by a delta: a peer whose routes cannot have changed
    /// since `prev` (its routes' next change is after `now` and it is not in `changed`) keeps
    /// `prev`'s routes, shared, without its link being locked; every other one is derived again
    /// and its receive entries replaced. Falls back to [`RouteTable::compute`] when the peer
    /// set is not `prev`'s (another generation). The result is the table `compute` would give,
    /// but for a local (address, port) two peers both claim, which keeps the older claim (the
    /// chance is 2^-144 per pair of routes; a collision on the link is what §5.2 handles).
    ///
    /// Costs one derivation per due peer, plus copying the receive map (no hashing).
    pub fn advance(
        prev: &RouteTable,
        peers: &[Arc<Peer>],
        generation: u64,
        now: UnixTime,
        changed: &[usize],
    ) -> RouteTable {
        let same_peers = prev.generation == generation
            && prev.peers.len() == peers.len()
            && prev
                .peers
                .iter()
                .zip(peers)
                .all(|(r, p)| Arc::ptr_eq(&r.peer, p));
        if !same_peers {
            return RouteTable::compute(peers, generation, now);
        }
        let mut table = RouteTable {
            generation,
            peers: prev.peers.clone(),
            rx: prev.rx.clone(),
            sockets: BTreeMap::new(),
            inner: prev.inner.clone(),
        };
        for (index, peer) in peers.iter().enumerate() {
            if prev.peers[index].next_change() > now && !changed.contains(&index) {
                continue;
            }
            for route in prev.peers[index].accept() {
                let key = (*route.local.ip(), route.local.port());
                if table.rx.get(&key).is_some_and(|r| r.peer == index) {
                    table.rx.remove(&key);
                }
            }
            let routes = Arc::new(PeerRoutes::compute(peer, now));
            table.insert_rx(index, &routes);
            table.peers[index] = routes;
        }
        table
    }

    fn insert_rx(&mut self, index: usize, routes: &PeerRoutes) {
        for (s, set) in routes.sets.iter().enumerate() {
            for route in &set.schedule.accept {
                self.rx.insert(
                    (*route.local.ip(), route.local.port()),
                    RxRoute {
                        peer: index,
                        set: s,
                        route: *route,
                    },
                );
            }
        }
    }

    /// Peer `i` of this table.
    pub fn peer(&self, i: usize) -> &Peer {
        &self.peers[i].peer
    }

    /// The peer (stream) of an inner packet: its local host is the source, its remote host the
    /// destination. Up to [`SCAN_PEERS`] peers a linear scan (comparing 32 bytes a few times
    /// beats hashing them), above one hash lookup.
    pub fn peer_for_inner(&self, src: &[u8], dst: &[u8]) -> Option<usize> {
        if self.peers.len() > SCAN_PEERS {
            let src = <[u8; 16]>::try_from(src).ok()?;
            let dst = <[u8; 16]>::try_from(dst).ok()?;
            return self
                .inner
                .get(&(Ipv6Addr::from(src), Ipv6Addr::from(dst)))
                .copied();
        }
        self.peers.iter().position(|r| {
            r.peer.stream.remote_true().octets() == dst
                && r.peer.stream.local_true().octets() == src
        })
    }

    /// Every local port the table needs a socket for.
    pub fn local_ports(&self) -> impl Iterator<Item = u16> + '_ {
        self.peers
            .iter()
            .flat_map(|p| p.accept().map(|r| r.local.port()))
    }

    /// Every local hashed address the table needs bound on the external interface.
    pub fn local_addresses(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        self.peers
            .iter()
            .flat_map(|p| p.accept().map(|r| *r.local.ip()))
    }

    /// The route to send data on for a peer and the socket whose port it uses.
    pub fn send_route(&self, peer: usize) -> Option<(&Route, &Arc<UdpSocket6>)> {
        self.route_of(peer, self.peers.get(peer)?.send_set)
    }

    /// The current route of set `set` of a peer (what a handshake-class message on that set
    /// travels on) and the socket whose port it uses.
    pub fn route_of(&self, peer: usize, set: usize) -> Option<(&Route, &Arc<UdpSocket6>)> {
        let route = &self.peers.get(peer)?.sets.get(set)?.schedule.send;
        Some((route, self.sockets.get(&route.local.port())?))
    }

    /// The header-protection key of what this gateway sends to a peer on its data route (None in
    /// plain mode).
    pub fn send_header_key(&self, peer: usize) -> Option<&HeaderKey> {
        self.peers[peer].send_set().set.stream.send_header_key()
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

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::gateway::peer::PeerKeys;
    use mt6d_proto::{Endpoint, SessionKey, Stream, StreamConfig};

    fn peer(i: u16) -> Arc<Peer> {
        let local: Ipv6Addr = "2001:db8:a::1".parse().unwrap();
        let remote = Ipv6Addr::new(0x2001, 0xdb8, 0xb, 0, 0, 0, 0, i + 1);
        let key = SessionKey::from_bytes(&[i as u8 + 1; 32]).unwrap();
        // Boundaries of their own: jittered (odd peers) and of 1 to 3 s.
        let stream = || {
            let mut config =
                StreamConfig::new(Endpoint::new(local), Endpoint::new(remote), key.clone());
            config.jitter = i % 2 == 1;
            config.rotation = std::time::Duration::from_secs(1 + u64::from(i % 3));
            Stream::new(config).unwrap()
        };
        let s = stream();
        let keys = PeerKeys::pre_shared(s.sealer(0, 0), None);
        Arc::new(Peer::new(format!("p{i}"), s, stream(), keys, None))
    }

    /// The receive map as comparable data.
    fn rx_of(t: &RouteTable) -> BTreeMap<(Ipv6Addr, u16), (usize, usize, Route)> {
        t.rx.iter()
            .map(|(k, r)| (*k, (r.peer, r.set, r.route)))
            .collect()
    }

    #[test]
    fn a_rotation_derives_only_the_due_peers_and_gives_what_a_rebuild_gives() {
        let peers: Vec<Arc<Peer>> = (0..20).map(peer).collect();
        let t0 = UnixTime::from_millis(1_800_000_000_000);
        let first = RouteTable::compute(&peers, 1, t0);
        // Nothing due: every peer's routes are shared, the map unchanged.
        let same = RouteTable::advance(&first, &peers, 1, t0, &[]);
        assert!(same
            .peers
            .iter()
            .zip(&first.peers)
            .all(|(a, b)| Arc::ptr_eq(a, b)));
        assert_eq!(rx_of(&same), rx_of(&first));
        // Each peer has a jittered boundary of its own: step from boundary to boundary through
        // three rotations of every peer, as the rotator does.
        let mut table = first;
        let mut now = t0;
        let (mut steps, mut partial) = (0, 0);
        while steps < 200 {
            now = table.peers.iter().map(|p| p.next_change()).min().unwrap();
            let next = RouteTable::advance(&table, &peers, 1, now, &[]);
            let due: Vec<usize> = (0..peers.len())
                .filter(|&i| !Arc::ptr_eq(&next.peers[i], &table.peers[i]))
                .collect();
            assert!(!due.is_empty(), "a boundary passed and nobody was derived");
            partial += usize::from(due.len() < peers.len() / 2);
            for (i, r) in table.peers.iter().enumerate() {
                assert_eq!(due.contains(&i), r.next_change() <= now, "peer {i}");
            }
            let rebuilt = RouteTable::compute(&peers, 1, now);
            assert_eq!(rx_of(&next), rx_of(&rebuilt), "at {now:?}");
            for (a, b) in next.peers.iter().zip(&rebuilt.peers) {
                assert_eq!(a.send(), b.send());
                assert_eq!(a.next_change(), b.next_change());
            }
            table = next;
            steps += 1;
            if now.as_nanos() > t0.as_nanos() + 10 * 1_000_000_000 {
                break;
            }
        }
        assert!(steps >= 20, "only {steps} boundaries");
        assert!(
            partial * 2 > steps,
            "{partial} of {steps} steps derived under half the peers"
        );
        // A peer named as changed is derived again though not due; a new generation rebuilds.
        let changed = RouteTable::advance(&table, &peers, 1, now, &[3]);
        assert!(!Arc::ptr_eq(&changed.peers[3], &table.peers[3]));
        assert!(Arc::ptr_eq(&changed.peers[4], &table.peers[4]));
        let reloaded = RouteTable::advance(&table, &peers, 2, now, &[]);
        assert!(reloaded
            .peers
            .iter()
            .zip(&table.peers)
            .all(|(a, b)| !Arc::ptr_eq(a, b)));
        assert_eq!(reloaded.inner.len(), peers.len());
    }

    #[test]
    fn an_inner_pair_finds_its_peer_by_scan_and_by_hash_alike() {
        for n in [3u16, SCAN_PEERS as u16, SCAN_PEERS as u16 + 5] {
            let peers: Vec<Arc<Peer>> = (0..n).map(peer).collect();
            let table = RouteTable::compute(&peers, 1, UnixTime::from_millis(1_800_000_000_000));
            assert_eq!(table.inner.is_empty(), usize::from(n) <= SCAN_PEERS);
            for (i, p) in peers.iter().enumerate() {
                let (src, dst) = (p.stream.local_true(), p.stream.remote_true());
                assert_eq!(
                    table.peer_for_inner(&src.octets(), &dst.octets()),
                    Some(i),
                    "{n} peers"
                );
                // Reversed (a packet towards our own host) and unknown pairs match nothing.
                assert_eq!(table.peer_for_inner(&dst.octets(), &src.octets()), None);
            }
            let stranger = Ipv6Addr::new(0x2001, 0xdb8, 0xc, 0, 0, 0, 0, 1);
            let local = peers[0].stream.local_true();
            assert_eq!(
                table.peer_for_inner(&local.octets(), &stranger.octets()),
                None
            );
            assert_eq!(table.peer_for_inner(&[0; 4], &[0; 16]), None, "short slice");
        }
    }
}
