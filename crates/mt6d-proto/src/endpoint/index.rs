//! The two indexes that route packets to peers, kept up to date by per-peer deltas:
//!
//! * **local**: (local hashed address, local port) -> (peer, epoch), for every route of every
//!   peer's accept window (docs/PROTOCOL.md §3: epochs e-1, e, e+1). The receive path asks it
//!   once per datagram with the datagram's destination.
//! * **inner**: (local true address, remote true address) -> peer, one entry per peer. The send
//!   path asks it once per inner packet with the packet's (source, destination).
//!
//! A rotation of one peer ([`RouteIndex::set_window`]) derives only the routes that enter its
//! window (one per epoch advanced, plus any epoch whose attempt offset changed, §5.2), inserts
//! their keys and removes the keys of the routes that left: O(1) per peer, independent of how
//! many peers there are. Nothing is rebuilt.
//!
//! It owns no clock and no randomness: the epoch comes in from the caller's schedule, routes
//! from the caller's derivation ([`crate::Stream::route_with_attempt`]), and the hash key from
//! an [`IndexSeed`].

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::net::{Ipv6Addr, SocketAddrV6};

use super::claims::Claims;
use super::hasher::{IndexSeed, SeededState};
use super::PeerId;
use crate::{Epoch, Route};

/// Routes a peer has in its accept window: epochs e-1, e and e+1 (docs/PROTOCOL.md §3).
pub const WINDOW: usize = 3;

/// A local (hashed address, port), hashed as its 18 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct LocalKey {
    addr: [u8; 16],
    port: u16,
}

impl LocalKey {
    fn of(sa: &SocketAddrV6) -> LocalKey {
        LocalKey {
            addr: sa.ip().octets(),
            port: sa.port(),
        }
    }
}

impl Hash for LocalKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.addr);
        state.write(&self.port.to_be_bytes());
    }
}

/// An inner (source, destination) pair, hashed as its 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InnerKey {
    src: [u8; 16],
    dst: [u8; 16],
}

impl Hash for InnerKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.src);
        state.write(&self.dst);
    }
}

#[derive(Clone, Copy, Debug)]
struct Installed {
    route: Route,
    offset: u8,
}

#[derive(Debug)]
struct PeerRoutes {
    generation: u32,
    live: bool,
    /// Whether `inner` is this peer's entry in the inner map (false for a secondary peer,
    /// [`RouteIndex::add_secondary`]).
    claims_inner: bool,
    inner: InnerKey,
    current: Epoch,
    window: [Option<Installed>; WINDOW],
}

/// Why the index refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// The id is stale (its peer was removed) or was never added.
    #[error("peer {peer:?} is not in the route index (removed, or never added)")]
    UnknownPeer {
        /// The id given.
        peer: PeerId,
    },
    /// The id's slot holds a live peer already (the caller's slab and the index disagree).
    #[error("slot of {peer:?} is held by {held_by:?}")]
    SlotInUse {
        /// The id given.
        peer: PeerId,
        /// The live peer of that slot.
        held_by: PeerId,
    },
    /// All 2^32 peer slots are in use.
    #[error("no peer slot left")]
    Full,
    /// Another peer has the same inner (local true, remote true) pair: the two streams are one
    /// stream configured twice, and inner packets could not tell them apart.
    #[error("inner pair ({local_true}, {remote_true}) already belongs to {held_by:?}")]
    InnerTaken {
        /// The local protected host.
        local_true: Ipv6Addr,
        /// The remote protected host.
        remote_true: Ipv6Addr,
        /// The peer that has it.
        held_by: PeerId,
    },
}

/// What one call changed for one peer: the routes to bind (local address, socket of the local
/// port) and the routes to release, so the caller changes the kernel by the same delta.
/// Fixed size, no allocation.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct WindowDelta {
    added: [Option<Route>; WINDOW],
    removed: [Option<Route>; WINDOW],
    contested: [Option<Route>; WINDOW],
}

impl WindowDelta {
    /// Routes that entered the window.
    pub fn added(&self) -> impl Iterator<Item = &Route> + '_ {
        self.added.iter().flatten()
    }
    /// Routes that left the window.
    pub fn removed(&self) -> impl Iterator<Item = &Route> + '_ {
        self.removed.iter().flatten()
    }
    /// Added routes whose local (address, port) another route of the index also claims, so
    /// that neither is found by [`RouteIndex::lookup_local`] (see there). The caller moves the
    /// epoch as for an address collision (`moves::RouteMoves::move_locally`, docs/PROTOCOL.md
    /// §5.2) and calls [`RouteIndex::set_window`] again with the new offset.
    pub fn contested(&self) -> impl Iterator<Item = &Route> + '_ {
        self.contested.iter().flatten()
    }
    fn push(list: &mut [Option<Route>; WINDOW], r: Route) {
        if let Some(slot) = list.iter_mut().find(|s| s.is_none()) {
            *slot = Some(r);
        }
    }
}

/// The route indexes of an endpoint with many peers (module docs). Peers are named by the
/// [`PeerId`]s of the caller's [`super::PeerSlab`]; the index keeps the generation of each id it
/// was given and refuses stale ones.
///
/// Call order: [`RouteIndex::add_peer`] once, then [`RouteIndex::set_window`] at every epoch
/// change of that peer (its timer, [`super::Timers`]) and whenever one of its epochs moves;
/// [`RouteIndex::remove_peer`] at the end. The packet paths call
/// [`RouteIndex::lookup_local`] and [`RouteIndex::lookup_inner`], then [`RouteIndex::route`] /
/// [`RouteIndex::send_route`] for the route itself.
///
/// Costs: lookups are one SipHash-1-3 of 18 or 32 bytes and one hash table probe, no
/// allocation. `set_window` is O([`WINDOW`]) plus one route derivation and one insert per route
/// that enters the window and one remove per route that leaves. Memory: see
/// docs/ARCHITECTURE.md ("Endpoint indexes") for the measured bytes per peer.
#[derive(Debug)]
pub struct RouteIndex {
    /// Local keys and the (peer, epoch) claiming each; a key claimed twice is found by nobody.
    local: Claims<LocalKey>,
    inner: HashMap<InnerKey, PeerId, SeededState>,
    /// By slot.
    peers: Vec<PeerRoutes>,
    len: usize,
}

impl RouteIndex {
    /// An empty index whose hash tables are keyed by `seed` (draw it at random per process: the
    /// local index is probed with attacker-chosen destinations).
    pub fn new(seed: IndexSeed) -> RouteIndex {
        RouteIndex::with_capacity(seed, 0)
    }

    /// An empty index with room for `peers` peers and their windows without rehashing.
    pub fn with_capacity(seed: IndexSeed, peers: usize) -> RouteIndex {
        let state = SeededState::new(seed);
        RouteIndex {
            local: Claims::with_capacity(state, peers.saturating_mul(WINDOW)),
            inner: HashMap::with_capacity_and_hasher(peers, state),
            peers: Vec::with_capacity(peers),
            len: 0,
        }
    }

    /// Adds a peer with an empty window and its inner pair. O(1) amortised.
    pub fn add_peer(
        &mut self,
        peer: PeerId,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
    ) -> Result<(), IndexError> {
        self.insert_peer(peer, local_true, remote_true, true)
    }

    /// Adds a **secondary** peer: local routes like any peer's, but no inner pair, so
    /// [`RouteIndex::lookup_inner`] never returns it. One peer's further route sets use it
    /// (docs/PROTOCOL.md §9.8: a session's set shares the stream's true addresses with its link
    /// set, which keeps the inner pair). O(1) amortised.
    pub fn add_secondary(
        &mut self,
        peer: PeerId,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
    ) -> Result<(), IndexError> {
        self.insert_peer(peer, local_true, remote_true, false)
    }

    fn insert_peer(
        &mut self,
        peer: PeerId,
        local_true: Ipv6Addr,
        remote_true: Ipv6Addr,
        claims_inner: bool,
    ) -> Result<(), IndexError> {
        let slot = peer.slot();
        if let Some(p) = self.peers.get(slot).filter(|p| p.live) {
            return Err(IndexError::SlotInUse {
                peer,
                held_by: PeerId::from_parts(peer.index(), p.generation),
            });
        }
        let key = InnerKey {
            src: local_true.octets(),
            dst: remote_true.octets(),
        };
        if claims_inner {
            match self.inner.entry(key) {
                Entry::Occupied(o) => {
                    return Err(IndexError::InnerTaken {
                        local_true,
                        remote_true,
                        held_by: *o.get(),
                    })
                }
                Entry::Vacant(v) => {
                    v.insert(peer);
                }
            }
        }
        let routes = PeerRoutes {
            generation: peer.generation(),
            live: true,
            claims_inner,
            inner: key,
            current: Epoch(0),
            window: [None; WINDOW],
        };
        if slot < self.peers.len() {
            self.peers[slot] = routes;
        } else {
            // Slots of the caller's slab are dense; fill any gap with dead entries.
            while self.peers.len() < slot {
                self.peers.push(PeerRoutes {
                    generation: 0,
                    live: false,
                    claims_inner: false,
                    inner: key,
                    current: Epoch(0),
                    window: [None; WINDOW],
                });
            }
            self.peers.push(routes);
        }
        self.len += 1;
        Ok(())
    }

    /// Removes a peer, its inner pair and every route of its window (returned as `removed`, for
    /// the caller to release). O(WINDOW).
    pub fn remove_peer(&mut self, peer: PeerId) -> Result<WindowDelta, IndexError> {
        let p = self.peer_mut(peer)?;
        p.live = false;
        let (inner, claimed) = (p.inner, p.claims_inner);
        let window = std::mem::replace(&mut p.window, [None; WINDOW]);
        if claimed {
            self.inner.remove(&inner);
        }
        self.len -= 1;
        let mut delta = WindowDelta::default();
        for inst in window.into_iter().flatten() {
            self.local
                .unclaim(LocalKey::of(&inst.route.local), (peer, inst.route.epoch));
            WindowDelta::push(&mut delta.removed, inst.route);
        }
        Ok(delta)
    }

    /// Makes `peer`'s window the accept window of epoch `current` (e-1, e, e+1; fewer at the
    /// ends of the epoch range): routes of epochs that left it, or whose attempt offset
    /// `offset(epoch)` differs from the one they were derived with, are removed; each epoch
    /// missing is derived with `derive(epoch, offset(epoch))` (which must return that epoch's
    /// route, normally `|e, k| stream.route_with_attempt(e, k)`) and inserted. Advancing one
    /// epoch therefore costs one derivation, one insert and one remove; calling it again with
    /// the same arguments costs three `offset` calls and changes nothing.
    pub fn set_window(
        &mut self,
        peer: PeerId,
        current: Epoch,
        offset: impl Fn(Epoch) -> u8,
        mut derive: impl FnMut(Epoch, u8) -> Route,
    ) -> Result<WindowDelta, IndexError> {
        let want = window_of(current);
        let p = self.peer_mut(peer)?;
        p.current = current;
        let mut delta = WindowDelta::default();
        let mut leaving = [None; WINDOW];
        for (slot, out) in p.window.iter_mut().zip(&mut leaving) {
            if let Some(inst) = slot {
                let e = inst.route.epoch;
                if !want.contains(&Some(e)) || offset(e) != inst.offset {
                    *out = slot.take();
                }
            }
        }
        let mut entering = [None; WINDOW];
        for (e, out) in want.iter().flatten().zip(&mut entering) {
            if !p.window.iter().flatten().any(|i| i.route.epoch == *e) {
                let k = offset(*e);
                let route = derive(*e, k);
                debug_assert_eq!(route.epoch, *e, "derive must return the epoch's route");
                if let Some(free) = p.window.iter_mut().find(|s| s.is_none()) {
                    *free = Some(Installed { route, offset: k });
                    *out = Some(route);
                }
            }
        }
        for inst in leaving.into_iter().flatten() {
            self.local
                .unclaim(LocalKey::of(&inst.route.local), (peer, inst.route.epoch));
            WindowDelta::push(&mut delta.removed, inst.route);
        }
        for route in entering.iter().flatten() {
            self.local
                .claim(LocalKey::of(&route.local), (peer, route.epoch));
            WindowDelta::push(&mut delta.added, *route);
        }
        // After all claims: two routes of this call may contest each other.
        for route in entering.into_iter().flatten() {
            if self.local.is_contested(&LocalKey::of(&route.local)) {
                WindowDelta::push(&mut delta.contested, route);
            }
        }
        Ok(delta)
    }

    /// The epochs (with their offsets) that [`RouteIndex::set_window`] with the same arguments
    /// would derive: those of the window of `current` not installed at `offset(epoch)`. Lets a
    /// caller derive a batch of peers' routes before it changes the index (see
    /// [`RouteIndex::warm`]). Empty for an unknown peer.
    pub(crate) fn entering(
        &self,
        peer: PeerId,
        current: Epoch,
        offset: impl Fn(Epoch) -> u8,
    ) -> [Option<(Epoch, u8)>; WINDOW] {
        let mut out = [None; WINDOW];
        let Some(p) = self.peer(peer) else {
            return out;
        };
        for (e, slot) in window_of(current).into_iter().flatten().zip(&mut out) {
            let k = offset(e);
            let installed = p
                .window
                .iter()
                .flatten()
                .any(|i| i.route.epoch == e && i.offset == k);
            if !installed {
                *slot = Some((e, k));
            }
        }
        out
    }

    /// Reads `peer`'s window entry (its current epoch, 0 for an unknown peer), for a caller that
    /// reads a batch of peers' state back to back (see [`RouteIndex::warm`]).
    pub(crate) fn touch(&self, peer: PeerId) -> u64 {
        self.peer(peer).map_or(0, |p| p.current.0)
    }

    /// Reads, without changing anything, the table slots that a following
    /// [`RouteIndex::set_window`]`(peer, current, ..)` adding `entering` will touch: the keys of
    /// the routes that leave the window and of those that enter it. With a million peers each is
    /// a cache miss; reading a batch of peers' slots back to back lets the processor overlap
    /// those misses (they do not depend on each other), where `set_window` one peer after
    /// another waits for each in turn. Returns how many keys were present, for the caller to
    /// pass to `black_box` so the reads are kept.
    pub(crate) fn warm<'a>(
        &self,
        peer: PeerId,
        current: Epoch,
        entering: impl Iterator<Item = &'a Route>,
    ) -> usize {
        let mut present = 0;
        if let Some(p) = self.peer(peer) {
            let want = window_of(current);
            for inst in p.window.iter().flatten() {
                if !want.contains(&Some(inst.route.epoch)) {
                    present += usize::from(self.local.is_found(&LocalKey::of(&inst.route.local)));
                }
            }
        }
        for r in entering {
            present += usize::from(self.local.is_found(&LocalKey::of(&r.local)));
        }
        present
    }

    /// The peer and epoch a datagram to local `(addr, port)` belongs to. `None` for a key no
    /// route has, and for a **contested** key: two routes (of two peers, or two epochs of one)
    /// whose local address and port are equal. Picking either could hand one peer's packet to
    /// the other (in plain mode nothing would catch it), so neither gets it until one leaves,
    /// and [`WindowDelta::contested`] tells the caller to move the epoch. O(1), no allocation.
    pub fn lookup_local(&self, addr: Ipv6Addr, port: u16) -> Option<(PeerId, Epoch)> {
        let key = LocalKey {
            addr: addr.octets(),
            port,
        };
        self.local.get(&key)
    }

    /// Whether `(addr, port)` is claimed by more than one route (for a drop reason). O(1).
    pub fn is_contested(&self, addr: Ipv6Addr, port: u16) -> bool {
        let key = LocalKey {
            addr: addr.octets(),
            port,
        };
        self.local.is_contested(&key)
    }

    /// Local keys claimed by more than one route.
    pub fn contested_len(&self) -> usize {
        self.local.contested_len()
    }

    /// The peer whose stream carries inner packets from `src` (the local protected host) to
    /// `dst` (the remote one). O(1), no allocation.
    pub fn lookup_inner(&self, src: Ipv6Addr, dst: Ipv6Addr) -> Option<PeerId> {
        let key = InnerKey {
            src: src.octets(),
            dst: dst.octets(),
        };
        self.inner.get(&key).copied()
    }

    /// The route of `epoch` in `peer`'s window. O(WINDOW).
    pub fn route(&self, peer: PeerId, epoch: Epoch) -> Option<&Route> {
        self.peer(peer)?
            .window
            .iter()
            .flatten()
            .map(|i| &i.route)
            .find(|r| r.epoch == epoch)
    }

    /// The route to send on: the window's current epoch. O(WINDOW).
    pub fn send_route(&self, peer: PeerId) -> Option<&Route> {
        let current = self.peer(peer)?.current;
        self.route(peer, current)
    }

    /// Every route of `peer`'s window, in no particular order.
    pub fn window(&self, peer: PeerId) -> impl Iterator<Item = &Route> + '_ {
        self.peer(peer)
            .into_iter()
            .flat_map(|p| p.window.iter().flatten().map(|i| &i.route))
    }

    /// Live peers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No live peer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn peer(&self, peer: PeerId) -> Option<&PeerRoutes> {
        self.peers
            .get(peer.slot())
            .filter(|p| p.live && p.generation == peer.generation())
    }

    fn peer_mut(&mut self, peer: PeerId) -> Result<&mut PeerRoutes, IndexError> {
        self.peers
            .get_mut(peer.slot())
            .filter(|p| p.live && p.generation == peer.generation())
            .ok_or(IndexError::UnknownPeer { peer })
    }
}

/// The distinct epochs of the accept window of `e`, saturating at both ends of the range.
fn window_of(e: Epoch) -> [Option<Epoch>; WINDOW] {
    let prev = (e.0 > 0).then(|| Epoch(e.0 - 1));
    let next = e.0.checked_add(1).map(Epoch);
    [prev, Some(e), next]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, SessionKey, Stream, StreamConfig};

    const SEED: IndexSeed = IndexSeed::from_bytes([3; 16]);

    fn id(i: u32) -> PeerId {
        PeerId::from_parts(i, 0)
    }
    fn a(s: &str) -> Ipv6Addr {
        s.parse().unwrap()
    }
    fn stream(i: u32) -> Stream {
        let mut key = [0u8; 32];
        key[..4].copy_from_slice(&i.to_be_bytes());
        Stream::new(StreamConfig::new(
            Endpoint::new(a("2001:db8:a::1")),
            Endpoint::new(Ipv6Addr::from(
                (0x2001_0db8_000b_u128 << 80) | (u128::from(i) + 1),
            )),
            SessionKey::from_bytes(&key).unwrap(),
        ))
        .unwrap()
    }
    fn add(ix: &mut RouteIndex, peer: PeerId, s: &Stream) {
        ix.add_peer(peer, s.local_true(), s.remote_true()).unwrap();
    }
    fn rotate(ix: &mut RouteIndex, peer: PeerId, s: &Stream, e: u64) -> WindowDelta {
        ix.set_window(peer, Epoch(e), |_| 0, |e, k| s.route_with_attempt(e, k))
            .unwrap()
    }
    /// A made-up route of `epoch` with local (addr, port) = (2001:db8::`addr`, `port`).
    fn fake(epoch: Epoch, addr: u16, port: u16) -> Route {
        Route {
            epoch,
            local: SocketAddrV6::new(
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, addr),
                port,
                0,
                0,
            ),
            remote: SocketAddrV6::new(a("2001:db8:ffff::1"), 4000, 0, 0),
        }
    }

    #[test]
    fn real_routes_are_found_by_local_key_and_inner_pair() {
        let mut ix = RouteIndex::new(SEED);
        let streams: Vec<Stream> = (0..20).map(stream).collect();
        for (i, s) in streams.iter().enumerate() {
            add(&mut ix, id(i as u32), s);
            let d = rotate(&mut ix, id(i as u32), s, 100);
            assert_eq!(d.added().count(), 3);
            assert_eq!(d.removed().count(), 0);
            assert_eq!(d.contested().count(), 0);
        }
        assert_eq!(ix.len(), 20);
        for (i, s) in streams.iter().enumerate() {
            let p = id(i as u32);
            for e in 99..=101 {
                let r = s.route(Epoch(e));
                assert_eq!(
                    ix.lookup_local(*r.local.ip(), r.local.port()),
                    Some((p, Epoch(e)))
                );
                assert_eq!(ix.route(p, Epoch(e)), Some(&r));
            }
            assert_eq!(ix.send_route(p), Some(&s.route(Epoch(100))));
            assert_eq!(ix.lookup_inner(s.local_true(), s.remote_true()), Some(p));
            assert_eq!(ix.lookup_inner(s.remote_true(), s.local_true()), None);
        }
        let r = streams[0].route(Epoch(102));
        assert_eq!(ix.lookup_local(*r.local.ip(), r.local.port()), None);
    }

    #[test]
    fn advancing_one_epoch_is_a_delta_of_one_route() {
        let mut ix = RouteIndex::new(SEED);
        let s = stream(7);
        add(&mut ix, id(0), &s);
        rotate(&mut ix, id(0), &s, 100);
        let d = rotate(&mut ix, id(0), &s, 101);
        assert_eq!(
            d.added().copied().collect::<Vec<_>>(),
            [s.route(Epoch(102))]
        );
        assert_eq!(
            d.removed().copied().collect::<Vec<_>>(),
            [s.route(Epoch(99))]
        );
        let gone = s.route(Epoch(99));
        assert_eq!(ix.lookup_local(*gone.local.ip(), gone.local.port()), None);
        // The same call again changes nothing and derives nothing.
        let d = ix
            .set_window(
                id(0),
                Epoch(101),
                |_| 0,
                |_, _| unreachable!("nothing to derive"),
            )
            .unwrap();
        assert_eq!(d, WindowDelta::default());
        // A jump replaces the whole window.
        let d = rotate(&mut ix, id(0), &s, 500);
        assert_eq!((d.added().count(), d.removed().count()), (3, 3));
        assert_eq!(ix.window(id(0)).count(), 3);
    }

    #[test]
    fn a_moved_epoch_is_rederived_alone() {
        let mut ix = RouteIndex::new(SEED);
        let s = stream(1);
        add(&mut ix, id(0), &s);
        rotate(&mut ix, id(0), &s, 100);
        let moved = |e: Epoch| u8::from(e == Epoch(101));
        let d = ix
            .set_window(id(0), Epoch(100), moved, |e, k| s.route_with_attempt(e, k))
            .unwrap();
        let new = s.route_with_attempt(Epoch(101), 1);
        assert_eq!(d.added().copied().collect::<Vec<_>>(), [new]);
        assert_eq!(
            d.removed().copied().collect::<Vec<_>>(),
            [s.route(Epoch(101))]
        );
        assert_eq!(
            ix.lookup_local(*new.local.ip(), new.local.port()),
            Some((id(0), Epoch(101)))
        );
    }

    #[test]
    fn window_saturates_at_epoch_zero() {
        let mut ix = RouteIndex::new(SEED);
        let s = stream(2);
        add(&mut ix, id(0), &s);
        let d = rotate(&mut ix, id(0), &s, 0);
        assert_eq!(d.added().count(), 2, "epochs 0 and 1; there is no -1");
        let d = ix
            .set_window(id(0), Epoch(u64::MAX), |_| 0, |e, _| fake(e, 1, 2000))
            .unwrap();
        assert_eq!((d.added().count(), d.removed().count()), (2, 2));
    }

    #[test]
    fn removal_forgets_routes_and_inner_pair() {
        let mut ix = RouteIndex::new(SEED);
        let s = stream(3);
        add(&mut ix, id(0), &s);
        rotate(&mut ix, id(0), &s, 100);
        let d = ix.remove_peer(id(0)).unwrap();
        assert_eq!(d.removed().count(), 3);
        assert!(ix.is_empty());
        for e in 99..=101 {
            let r = s.route(Epoch(e));
            assert_eq!(ix.lookup_local(*r.local.ip(), r.local.port()), None);
        }
        assert_eq!(ix.lookup_inner(s.local_true(), s.remote_true()), None);
        assert_eq!(
            ix.remove_peer(id(0)),
            Err(IndexError::UnknownPeer { peer: id(0) })
        );
    }

    #[test]
    fn stale_ids_are_refused_and_never_reach_the_new_peer() {
        let mut ix = RouteIndex::new(SEED);
        let (old, new) = (id(0), PeerId::from_parts(0, 1));
        let (s_old, s_new) = (stream(4), stream(5));
        add(&mut ix, old, &s_old);
        rotate(&mut ix, old, &s_old, 100);
        ix.remove_peer(old).unwrap();
        add(&mut ix, new, &s_new);
        rotate(&mut ix, new, &s_new, 100);
        let err = IndexError::UnknownPeer { peer: old };
        assert_eq!(
            ix.set_window(
                old,
                Epoch(101),
                |_| 0,
                |e, k| s_old.route_with_attempt(e, k)
            ),
            Err(err)
        );
        assert_eq!(ix.remove_peer(old), Err(err));
        assert_eq!(ix.send_route(old), None);
        assert_eq!(ix.window(old).count(), 0);
        assert_eq!(ix.send_route(new), Some(&s_new.route(Epoch(100))));
        assert_eq!(
            ix.add_peer(old, a("2001:db8::1"), a("2001:db8::2")),
            Err(IndexError::SlotInUse {
                peer: old,
                held_by: new
            })
        );
    }

    #[test]
    fn a_second_stream_with_the_same_inner_pair_is_refused() {
        let mut ix = RouteIndex::new(SEED);
        let s = stream(6);
        add(&mut ix, id(0), &s);
        assert_eq!(
            ix.add_peer(id(1), s.local_true(), s.remote_true()),
            Err(IndexError::InnerTaken {
                local_true: s.local_true(),
                remote_true: s.remote_true(),
                held_by: id(0)
            })
        );
        assert_eq!(ix.len(), 1);
    }

    #[test]
    fn a_secondary_peer_shares_the_inner_pair_without_taking_it() {
        let mut ix = RouteIndex::new(SEED);
        let s = stream(6);
        // A second route set of the same stream: same true addresses, other key.
        let set = stream(6).with_route_key(&SessionKey::from_bytes(&[9; 32]).unwrap());
        add(&mut ix, id(0), &s);
        ix.add_secondary(id(1), set.local_true(), set.remote_true())
            .unwrap();
        rotate(&mut ix, id(0), &s, 40);
        rotate(&mut ix, id(1), &set, 40);
        let r = set.route_with_attempt(Epoch(40), 0);
        assert_eq!(
            ix.lookup_local(*r.local.ip(), r.local.port()),
            Some((id(1), Epoch(40)))
        );
        assert_eq!(
            ix.lookup_inner(s.local_true(), s.remote_true()),
            Some(id(0))
        );
        // Removing the secondary leaves the primary's pair; removing the primary frees it.
        ix.remove_peer(id(1)).unwrap();
        assert_eq!(ix.lookup_local(*r.local.ip(), r.local.port()), None);
        assert_eq!(
            ix.lookup_inner(s.local_true(), s.remote_true()),
            Some(id(0))
        );
        ix.remove_peer(id(0)).unwrap();
        assert_eq!(ix.lookup_inner(s.local_true(), s.remote_true()), None);
        assert!(ix.is_empty());
    }

    #[test]
    fn colliding_local_keys_route_to_nobody_until_one_leaves() {
        let mut ix = RouteIndex::new(SEED);
        ix.add_peer(id(0), a("2001:db8::1"), a("2001:db8::10"))
            .unwrap();
        ix.add_peer(id(1), a("2001:db8::1"), a("2001:db8::11"))
            .unwrap();
        // Peer 0's window uses local addresses ::100, ::101, ::102 (by epoch); peer 1's epoch 51
        // uses ::101 and port 2000 too, the key of peer 0's epoch 10.
        let d0 = ix
            .set_window(
                id(0),
                Epoch(10),
                |_| 0,
                |e, _| fake(e, 0x100 + (e.0 - 9) as u16, 2000),
            )
            .unwrap();
        assert_eq!(d0.contested().count(), 0);
        let at = |e: Epoch, k: u8| {
            if e == Epoch(51) && k == 0 {
                fake(e, 0x101, 2000)
            } else {
                // Epochs 49-51 (the window of 50): ::1ff-::201, clear of peer 0's.
                fake(e, 0x1ff + (e.0 - 49) as u16 + 16 * u16::from(k), 2000)
            }
        };
        let d1 = ix.set_window(id(1), Epoch(50), |_| 0, at).unwrap();
        assert_eq!(
            d1.contested().map(|r| r.epoch).collect::<Vec<_>>(),
            [Epoch(51)]
        );
        let key = a("2001:db8::101");
        assert_eq!(
            ix.lookup_local(key, 2000),
            None,
            "neither peer gets the packet"
        );
        assert!(ix.is_contested(key, 2000));
        assert_eq!(ix.lookup_local(key, 2001), None);
        // Other keys of both peers still route.
        assert_eq!(
            ix.lookup_local(a("2001:db8::100"), 2000),
            Some((id(0), Epoch(9)))
        );
        assert_eq!(
            ix.lookup_local(a("2001:db8::200"), 2000),
            Some((id(1), Epoch(50)))
        );
        // Peer 1 moves epoch 51 (§5.2): peer 0 gets its key back.
        let d1 = ix
            .set_window(id(1), Epoch(50), |e| u8::from(e == Epoch(51)), at)
            .unwrap();
        assert_eq!(d1.contested().count(), 0);
        assert_eq!(ix.lookup_local(key, 2000), Some((id(0), Epoch(10))));
        assert!(!ix.is_contested(key, 2000));
        assert_eq!(ix.contested_len(), 0);
        // Three claimants, then removals in any order.
        ix.add_peer(id(2), a("2001:db8::1"), a("2001:db8::12"))
            .unwrap();
        ix.add_peer(id(3), a("2001:db8::1"), a("2001:db8::13"))
            .unwrap();
        ix.set_window(
            id(2),
            Epoch(500),
            |_| 0,
            |e, _| fake(e, 0x101, (2000 + e.0 - 500) as u16),
        )
        .unwrap();
        ix.set_window(
            id(3),
            Epoch(700),
            |_| 0,
            |e, _| fake(e, 0x101, (2000 + e.0 - 700) as u16),
        )
        .unwrap();
        assert_eq!(ix.lookup_local(key, 2000), None);
        ix.remove_peer(id(0)).unwrap();
        assert_eq!(ix.lookup_local(key, 2000), None, "two claims left");
        ix.remove_peer(id(3)).unwrap();
        assert_eq!(ix.lookup_local(key, 2000), Some((id(2), Epoch(500))));
        assert_eq!(ix.lookup_local(key, 1999), Some((id(2), Epoch(499))));
    }

    #[test]
    fn two_epochs_of_one_peer_on_one_key_are_contested_too() {
        let mut ix = RouteIndex::new(SEED);
        ix.add_peer(id(0), a("2001:db8::1"), a("2001:db8::10"))
            .unwrap();
        let d = ix
            .set_window(id(0), Epoch(10), |_| 0, |e, _| fake(e, 0x100, 2000))
            .unwrap();
        assert_eq!(d.contested().count(), 3);
        assert_eq!(ix.lookup_local(a("2001:db8::100"), 2000), None);
        ix.set_window(id(0), Epoch(11), |_| 0, |e, _| fake(e, 0x100, 2000))
            .unwrap();
        assert_eq!(ix.lookup_local(a("2001:db8::100"), 2000), None);
        ix.remove_peer(id(0)).unwrap();
        assert_eq!(ix.contested_len(), 0);
    }
}
