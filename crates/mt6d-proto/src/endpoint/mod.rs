//! Many peers on one endpoint, up to a million: compact peer ids ([`PeerSlab`]), the
//! two indexes that route packets to peers ([`RouteIndex`]: local (hashed address, port) ->
//! (peer, epoch), inner (source, destination) -> peer), and one rotation deadline per peer
//! ([`Timers`]). [`PeerTable`] joins them to [`Stream`]s.
//!
//! A lookup is one keyed hash and one probe, a rotation touches one peer and changes its window
//! by a delta (one route derived, one key inserted, one removed), and a tick pops only the peers
//! whose epoch boundary has passed; measured to 1,000,000 peers (docs/ARCHITECTURE.md,
//! "Endpoint indexes"). This is the server role's index (seed 002); the gateway role's
//! daemon keeps an immutable, lock-free snapshot per rotation that it also changes by a delta.
//!
//! Sans-IO like the rest of the crate: `now` comes in, the hash key comes in as an
//! [`IndexSeed`], and what the kernel must change (addresses to bind or release, sockets to
//! open or close) goes out as [`WindowDelta`]s.

mod claims;
mod hasher;
mod index;
mod slab;
mod timers;

pub(crate) use claims::Claims;
pub use hasher::IndexSeed;
pub(crate) use hasher::SeededState;
pub use index::{IndexError, RouteIndex, WindowDelta, WINDOW};
pub use slab::{PeerId, PeerSlab};
pub use timers::Timers;

use std::net::Ipv6Addr;

use crate::{Epoch, Route, Stream, UnixTime};

/// Due peers [`PeerTable::handle_timeout`] advances together (see there). The slots a batch
/// reads (about 6 cache lines per peer, 6 KiB for 16) stay in the L1 cache until they are
/// changed.
pub const ROTATION_BATCH: usize = 16;

/// What one [`PeerTable::handle_timeout_at_most`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advanced {
    /// Peers advanced (their window changed).
    pub advanced: usize,
    /// A due peer is left: call again.
    pub more: bool,
}

/// A due peer of a batch: its new epoch, next deadline and pre-derived entering routes (with
/// the offsets they were derived at).
#[derive(Clone, Copy)]
struct Due {
    id: PeerId,
    epoch: Epoch,
    next: UnixTime,
    routes: [Option<(Route, u8)>; WINDOW],
}

/// Streams of many peers with their route indexes and epoch timers.
///
/// Call order (one owner, e.g. the daemon's main thread; the packet threads would read a
/// published copy or a concurrent variant, see docs/ARCHITECTURE.md):
/// 1. [`PeerTable::add`]`(stream, now, ..)` per peer: installs the accept window of `now` and
///    schedules the peer's next epoch boundary. Bind the returned delta's routes.
/// 2. Sleep until [`PeerTable::poll_timeout`]; then [`PeerTable::handle_timeout`]`(now, ..)`
///    advances exactly the peers whose boundary passed and hands each one's delta to the
///    caller (bind `added`, release `removed`, move the epochs of `contested`).
/// 3. When a peer's epoch moves (docs/PROTOCOL.md §5.2), [`PeerTable::refresh`] re-derives
///    that one route.
/// 4. Per packet: [`PeerTable::lookup_local`] / [`PeerTable::lookup_inner`], then
///    [`RouteIndex::route`] or [`RouteIndex::send_route`] through [`PeerTable::index`].
///
/// Every call that takes a [`PeerId`] refuses a stale one.
#[derive(Debug)]
pub struct PeerTable {
    streams: PeerSlab<Stream>,
    index: RouteIndex,
    timers: Timers,
}

impl PeerTable {
    /// An empty table whose indexes are keyed by `seed`, with room for `peers` peers.
    pub fn with_capacity(seed: IndexSeed, peers: usize) -> PeerTable {
        PeerTable {
            streams: PeerSlab::with_capacity(peers),
            index: RouteIndex::with_capacity(seed, peers),
            timers: Timers::with_capacity(peers),
        }
    }

    /// Adds a peer: its window at `now` (routes at the offsets `offset(epoch)`, 0 unless moved)
    /// and its next boundary as its deadline. Refused if another peer has the same inner pair.
    /// O(1) amortised plus the derivation of [`WINDOW`] routes.
    pub fn add(
        &mut self,
        stream: Stream,
        now: UnixTime,
        offset: impl Fn(Epoch) -> u8,
    ) -> Result<(PeerId, WindowDelta), IndexError> {
        self.insert(stream, now, offset, true)
    }

    /// Adds a further route set of a peer already in the table ([`RouteIndex::add_secondary`]):
    /// its routes are found by [`PeerTable::lookup_local`] and rotate like any peer's, but
    /// [`PeerTable::lookup_inner`] keeps returning the peer added with [`PeerTable::add`]. The
    /// caller maps the new id to its peer. Same costs as [`PeerTable::add`].
    pub fn add_secondary(
        &mut self,
        stream: Stream,
        now: UnixTime,
        offset: impl Fn(Epoch) -> u8,
    ) -> Result<(PeerId, WindowDelta), IndexError> {
        self.insert(stream, now, offset, false)
    }

    fn insert(
        &mut self,
        stream: Stream,
        now: UnixTime,
        offset: impl Fn(Epoch) -> u8,
        primary: bool,
    ) -> Result<(PeerId, WindowDelta), IndexError> {
        let (local, remote) = (stream.local_true(), stream.remote_true());
        let e = stream.epoch_at(now);
        let next = stream.epoch_start(e.next());
        let id = self.streams.insert(stream).ok_or(IndexError::Full)?;
        let added = if primary {
            self.index.add_peer(id, local, remote)
        } else {
            self.index.add_secondary(id, local, remote)
        };
        if let Err(err) = added {
            self.streams.remove(id);
            return Err(err);
        }
        let delta = self.advance(id, e, offset)?;
        self.timers.schedule(id, next);
        Ok((id, delta))
    }

    /// Removes a peer: its stream and the routes to release. `None` for a stale id.
    pub fn remove(&mut self, id: PeerId) -> Option<(Stream, WindowDelta)> {
        let stream = self.streams.remove(id)?;
        self.timers.cancel(id);
        let delta = self.index.remove_peer(id).ok()?;
        Some((stream, delta))
    }

    /// When [`PeerTable::handle_timeout`] must run next: the earliest epoch boundary of any
    /// peer. O(1).
    pub fn poll_timeout(&self) -> Option<UnixTime> {
        self.timers.next_deadline()
    }

    /// Advances every peer whose epoch boundary is at or before `now` to the epoch of `now`
    /// (routes at `offset(peer, epoch)`), schedules its next boundary and passes its delta to
    /// `on_delta`. Returns how many peers it advanced. Costs O(log n) plus one
    /// [`RouteIndex::set_window`] per due peer, O(1) when none is due; peers not due are not
    /// touched.
    ///
    /// Due peers are taken [`ROTATION_BATCH`] at a time: their streams and windows are read
    /// back to back, their entering routes derived, the index slots they will change read back
    /// to back, and only then is each peer's window changed, in the order the deadlines
    /// popped. With a million peers each of those reads is a cache miss, and reading a batch's
    /// together lets the misses overlap instead of following one another (docs/ARCHITECTURE.md,
    /// "Endpoint indexes", has the figures). The result is the same as advancing the peers one
    /// by one.
    pub fn handle_timeout(
        &mut self,
        now: UnixTime,
        offset: impl Fn(PeerId, Epoch) -> u8,
        on_delta: impl FnMut(PeerId, &WindowDelta),
    ) -> usize {
        self.handle_timeout_at_most(now, usize::MAX, offset, on_delta)
            .advanced
    }

    /// [`PeerTable::handle_timeout`] for at most `max` due peers: a caller that holds a lock
    /// others wait on advances a million peers' boundaries in bounded steps and lets the
    /// waiters in between (the server role's main thread). [`Advanced::more`] says whether a
    /// due peer was left for the next call. Taking the peers in steps changes nothing else:
    /// they are popped in the same order either way.
    pub fn handle_timeout_at_most(
        &mut self,
        now: UnixTime,
        max: usize,
        offset: impl Fn(PeerId, Epoch) -> u8,
        mut on_delta: impl FnMut(PeerId, &WindowDelta),
    ) -> Advanced {
        let mut n = 0;
        let mut taken = 0usize;
        loop {
            if self.timers.next_deadline().is_none_or(|d| d > now) {
                return Advanced {
                    advanced: n,
                    more: false,
                };
            }
            if taken >= max {
                return Advanced {
                    advanced: n,
                    more: true,
                };
            }
            // The deadlines of a batch, then one read of each peer's stream and window, back
            // to back, before any derivation waits on them.
            let mut popped: [Option<(PeerId, UnixTime)>; ROTATION_BATCH] = [None; ROTATION_BATCH];
            for slot in popped.iter_mut().take(max - taken) {
                match self.timers.pop_due(now) {
                    Some(due) => *slot = Some(due),
                    None => break,
                }
            }
            if popped[0].is_none() {
                return Advanced {
                    advanced: n,
                    more: false,
                };
            }
            taken += popped.iter().flatten().count();
            let mut touched = 0u64;
            for (id, _) in popped.iter().flatten() {
                touched ^= self.streams.get(*id).map_or(0, |s| u64::from(s.touch()));
                touched ^= self.index.touch(*id);
            }
            std::hint::black_box(touched);
            let mut batch: [Option<Due>; ROTATION_BATCH] = [None; ROTATION_BATCH];
            let mut len = 0;
            for (id, at) in popped.into_iter().flatten() {
                let Some(stream) = self.streams.get(id) else {
                    continue; // a deadline a removed peer left: nothing to do
                };
                let e = epoch_after(stream, at, now);
                let mut routes = [None; WINDOW];
                let entering = self.index.entering(id, e, |e| offset(id, e));
                for (slot, (e, k)) in routes.iter_mut().zip(entering.into_iter().flatten()) {
                    *slot = Some((stream.route_with_attempt(e, k), k));
                }
                batch[len] = Some(Due {
                    id,
                    epoch: e,
                    next: stream.epoch_start(e.next()),
                    routes,
                });
                len += 1;
            }
            let mut present = 0;
            for d in batch.iter().flatten() {
                let routes = d.routes.iter().flatten().map(|(r, _)| r);
                present += self.index.warm(d.id, d.epoch, routes);
            }
            std::hint::black_box(present);
            for d in batch.iter().flatten() {
                let Some(stream) = self.streams.get(d.id) else {
                    continue;
                };
                let derive = |e: Epoch, k: u8| {
                    d.routes
                        .iter()
                        .flatten()
                        .find(|(r, o)| r.epoch == e && *o == k)
                        .map_or_else(|| stream.route_with_attempt(e, k), |(r, _)| *r)
                };
                if let Ok(delta) = self
                    .index
                    .set_window(d.id, d.epoch, |e| offset(d.id, e), derive)
                {
                    on_delta(d.id, &delta);
                    n += 1;
                }
                self.timers.schedule(d.id, d.next);
            }
        }
    }

    /// Re-derives the routes of `id`'s window whose offset changed (an epoch moved away from a
    /// collision or a held port, docs/PROTOCOL.md §5.2), at `now`.
    pub fn refresh(
        &mut self,
        id: PeerId,
        now: UnixTime,
        offset: impl Fn(Epoch) -> u8,
    ) -> Result<WindowDelta, IndexError> {
        let e = self
            .streams
            .get(id)
            .ok_or(IndexError::UnknownPeer { peer: id })?
            .epoch_at(now);
        self.advance(id, e, offset)
    }

    fn advance(
        &mut self,
        id: PeerId,
        e: Epoch,
        offset: impl Fn(Epoch) -> u8,
    ) -> Result<WindowDelta, IndexError> {
        let stream = self
            .streams
            .get(id)
            .ok_or(IndexError::UnknownPeer { peer: id })?;
        self.index
            .set_window(id, e, offset, |e, k| stream.route_with_attempt(e, k))
    }

    /// [`RouteIndex::lookup_local`].
    pub fn lookup_local(&self, addr: Ipv6Addr, port: u16) -> Option<(PeerId, Epoch)> {
        self.index.lookup_local(addr, port)
    }

    /// [`RouteIndex::lookup_inner`].
    pub fn lookup_inner(&self, src: Ipv6Addr, dst: Ipv6Addr) -> Option<PeerId> {
        self.index.lookup_inner(src, dst)
    }

    /// The route `id` sends on. O(WINDOW).
    pub fn send_route(&self, id: PeerId) -> Option<&Route> {
        self.index.send_route(id)
    }

    /// A peer's stream.
    pub fn stream(&self, id: PeerId) -> Option<&Stream> {
        self.streams.get(id)
    }

    /// Frees the header-protection key schedules of `id`'s stream, about 2 KB, for a peer that
    /// has gone idle ([`Stream::release_key_schedules`]; its next packet expands them again).
    /// False for a stale id.
    pub fn release_key_schedules(&mut self, id: PeerId) -> bool {
        self.streams
            .get_mut(id)
            .map(Stream::release_key_schedules)
            .is_some()
    }

    /// The route indexes.
    pub fn index(&self) -> &RouteIndex {
        &self.index
    }

    /// The epoch timers.
    pub fn timers(&self) -> &Timers {
        &self.timers
    }

    /// Live peers.
    pub fn len(&self) -> usize {
        self.streams.len()
    }

    /// No peer.
    pub fn is_empty(&self) -> bool {
        self.streams.is_empty()
    }
}

/// The epoch of `stream` at `now`, given that `at <= now` is the start of one of its epochs
/// (every deadline [`PeerTable`] schedules is one). With jitter, [`Stream::epoch_at`] hashes to
/// find the boundary in `now`'s interval of R; when `at` lies in that interval it is that
/// boundary, and the hash is saved (one BLAKE3 of the two a jittered rotation computes).
fn epoch_after(stream: &Stream, at: UnixTime, now: UnixTime) -> Epoch {
    let r = stream.clock().rotation_ms();
    // A boundary that saturated the clock is not a boundary of its interval any more.
    if at <= now && at.as_nanos() < u64::MAX && at.as_millis() / r == now.as_millis() / r {
        Epoch(at.as_millis() / r)
    } else {
        stream.epoch_at(now)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{Endpoint, SessionKey, StreamConfig};

    fn stream(i: u32, jitter: bool) -> Stream {
        let mut key = [0x11u8; 32];
        key[..4].copy_from_slice(&i.to_be_bytes());
        let mut c = StreamConfig::new(
            Endpoint::new("2001:db8:a::1".parse().unwrap()),
            Endpoint::new(Ipv6Addr::from(
                (0x2001_0db8_000b_u128 << 80) | (u128::from(i) + 1),
            )),
            SessionKey::from_bytes(&key).unwrap(),
        );
        c.jitter = jitter;
        c.rotation = Duration::from_secs(10);
        Stream::new(c).unwrap()
    }

    #[test]
    fn a_tick_advances_only_due_peers_and_matches_the_schedule() {
        let mut t = PeerTable::with_capacity(IndexSeed::from_bytes([9; 16]), 4);
        let t0 = UnixTime::from_millis(1_700_000_000_000);
        let ids: Vec<PeerId> = (0..50)
            .map(|i| t.add(stream(i, true), t0, |_| 0).unwrap().0)
            .collect();
        let mut now = t0;
        for _ in 0..60 {
            now = now.saturating_add(Duration::from_millis(500));
            let due = ids
                .iter()
                .filter(|id| t.timers().deadline(**id).is_some_and(|d| d <= now))
                .count();
            let mut seen = 0;
            let n = t.handle_timeout(
                now,
                |_, _| 0,
                |_, d| {
                    seen += 1;
                    assert_eq!(d.added().count(), 1);
                    assert_eq!(d.removed().count(), 1);
                },
            );
            assert_eq!((n, seen), (due, due));
            assert!(t.poll_timeout().unwrap() > now);
            for id in &ids {
                let s = t.stream(*id).unwrap();
                let sch = s.schedule(now);
                assert_eq!(t.send_route(*id), Some(&sch.send));
                for r in sch.accept {
                    assert_eq!(
                        t.lookup_local(*r.local.ip(), r.local.port()),
                        Some((*id, r.epoch))
                    );
                }
                assert_eq!(t.lookup_inner(s.local_true(), s.remote_true()), Some(*id));
            }
        }
    }

    #[test]
    fn batched_rotation_equals_advancing_peers_one_by_one() {
        // More peers than a batch, jittered, with epochs that move (offsets that change for
        // routes already installed): every window must equal the one `set_window` gives each
        // peer alone.
        let seed = IndexSeed::from_bytes([5; 16]);
        let mut t = PeerTable::with_capacity(seed, 0);
        let mut reference = RouteIndex::new(seed);
        let offset = |id: PeerId, e: Epoch| u8::from((e.0 + u64::from(id.index())) % 5 == 0);
        let t0 = UnixTime::from_millis(1_700_000_000_000);
        let ids: Vec<PeerId> = (0..3 * ROTATION_BATCH as u32 + 5)
            .map(|i| {
                let (id, _) = t
                    .add(stream(i, true), t0, |e| offset(PeerId::from_parts(i, 0), e))
                    .unwrap();
                let s = t.stream(id).unwrap();
                reference
                    .add_peer(id, s.local_true(), s.remote_true())
                    .unwrap();
                reference
                    .set_window(
                        id,
                        s.epoch_at(t0),
                        |e| offset(id, e),
                        |e, k| s.route_with_attempt(e, k),
                    )
                    .unwrap();
                id
            })
            .collect();
        let mut now = t0;
        for step in 0..40 {
            now = now.saturating_add(Duration::from_millis(700));
            // From the second step on, epochs also move under the peers: offset + step parity.
            let off =
                |id: PeerId, e: Epoch| offset(id, e) ^ u8::from(step % 2 == 1 && e.0 % 2 == 0);
            let due: Vec<PeerId> = ids
                .iter()
                .copied()
                .filter(|id| t.timers().deadline(*id).is_some_and(|d| d <= now))
                .collect();
            assert_eq!(t.handle_timeout(now, off, |_, _| {}), due.len());
            for id in &due {
                let s = t.stream(*id).unwrap();
                reference
                    .set_window(
                        *id,
                        s.epoch_at(now),
                        |e| off(*id, e),
                        |e, k| s.route_with_attempt(e, k),
                    )
                    .unwrap();
            }
            for id in &ids {
                let sorted = |ix: &RouteIndex| {
                    let mut w: Vec<Route> = ix.window(*id).copied().collect();
                    w.sort_by_key(|r| r.epoch);
                    w
                };
                assert_eq!(
                    sorted(t.index()),
                    sorted(&reference),
                    "peer {id:?} step {step}"
                );
            }
        }
    }

    #[test]
    fn bounded_steps_equal_one_unbounded_call() {
        // The server advances a million boundaries a few dozen at a time, letting its workers
        // in between: the windows must end up as one call would leave them, and a step must
        // never take more than it was allowed.
        let seed = IndexSeed::from_bytes([6; 16]);
        let t0 = UnixTime::from_millis(1_700_000_000_000);
        let build = || {
            let mut t = PeerTable::with_capacity(seed, 0);
            let ids: Vec<PeerId> = (0..2 * ROTATION_BATCH as u32 + 7)
                .map(|i| t.add(stream(i, true), t0, |_| 0).unwrap().0)
                .collect();
            (t, ids)
        };
        let (mut whole, ids) = build();
        let (mut stepped, _) = build();
        let mut now = t0;
        for round in 0..30 {
            now = now.saturating_add(Duration::from_millis(900));
            let expected = whole.handle_timeout(now, |_, _| 0, |_, _| {});
            let max = 1 + round % 7;
            let mut total = 0;
            loop {
                let mut seen = 0;
                let step = stepped.handle_timeout_at_most(now, max, |_, _| 0, |_, _| seen += 1);
                assert!(step.advanced <= max && seen == step.advanced);
                total += step.advanced;
                if !step.more {
                    break;
                }
            }
            assert_eq!(total, expected, "round {round}");
            assert_eq!(stepped.poll_timeout(), whole.poll_timeout());
            for id in &ids {
                let window = |t: &PeerTable| {
                    let mut w: Vec<Route> = t.index().window(*id).copied().collect();
                    w.sort_by_key(|r| r.epoch);
                    w
                };
                assert_eq!(
                    window(&stepped),
                    window(&whole),
                    "peer {id:?} round {round}"
                );
            }
        }
        let idle = stepped.handle_timeout_at_most(now, 3, |_, _| 0, |_, _| {});
        assert_eq!(
            idle,
            Advanced {
                advanced: 0,
                more: false
            }
        );
    }

    #[test]
    fn the_popped_boundary_gives_the_epoch_of_now() {
        let s = stream(7, true);
        let t0 = UnixTime::from_millis(1_700_000_000_000);
        for step in 0..400u64 {
            let now = t0.saturating_add(Duration::from_millis(step * 97));
            let e = s.epoch_at(now);
            // On time, late within the interval, late by whole epochs, and the boundary itself.
            for back in [0, 1, 2, 5] {
                let at = s.epoch_start(Epoch(e.0 - back));
                assert_eq!(epoch_after(&s, at, now), e, "step {step} back {back}");
            }
            assert_eq!(epoch_after(&s, s.epoch_start(e), s.epoch_start(e)), e);
        }
        let end = UnixTime::from_nanos(u64::MAX);
        assert_eq!(epoch_after(&s, end, end), s.epoch_at(end));
    }

    #[test]
    fn removed_peers_leave_no_route_timer_or_id() {
        let mut t = PeerTable::with_capacity(IndexSeed::from_bytes([9; 16]), 0);
        let t0 = UnixTime::from_millis(1_700_000_000_000);
        let (a, _) = t.add(stream(1, false), t0, |_| 0).unwrap();
        let (b, _) = t.add(stream(2, false), t0, |_| 0).unwrap();
        let s = t.stream(a).unwrap().schedule(t0);
        let (_, delta) = t.remove(a).unwrap();
        assert_eq!(delta.removed().count(), 3);
        assert!(t.remove(a).is_none());
        assert_eq!(
            t.lookup_local(*s.send.local.ip(), s.send.local.port()),
            None
        );
        assert_eq!(t.timers().len(), 1);
        assert!(matches!(
            t.refresh(a, t0, |_| 0),
            Err(IndexError::UnknownPeer { .. })
        ));
        assert!(!t.release_key_schedules(a));
        assert!(t.release_key_schedules(b));
        // The same stream again is a new peer in the old slot; the old id stays dead.
        let (c, _) = t.add(stream(1, false), t0, |_| 0).unwrap();
        assert_eq!(c.index(), a.index());
        assert_ne!(c, a);
        assert!(t.stream(a).is_none());
        assert_eq!(t.len(), 2);
        // A stream with b's inner pair is refused and leaves nothing behind.
        assert!(matches!(
            t.add(stream(2, false), t0, |_| 0),
            Err(IndexError::InnerTaken { .. })
        ));
        assert_eq!((t.len(), t.index().len(), t.timers().len()), (2, 2, 2));
        // Moving b's next epoch re-derives that route alone.
        let next = t.stream(b).unwrap().epoch_at(t0).next();
        let moved = t.refresh(b, t0, |e| u8::from(e == next)).unwrap();
        let r = t.stream(b).unwrap().route_with_attempt(next, 1);
        assert_eq!(moved.added().copied().collect::<Vec<_>>(), [r]);
        assert_eq!(moved.removed().count(), 1);
        assert_eq!(
            t.lookup_local(*r.local.ip(), r.local.port()),
            Some((b, next))
        );
    }
}
