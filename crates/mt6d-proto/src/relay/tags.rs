//! The receiver's route tag index (docs/PROTOCOL.md §10.5): route tag -> (set, accept route),
//! for the accept window (epochs e-1, e, e+1) of every bound end-to-end set.
//!
//! Over relays an e2e payload arrives with no address of its own: the 8-byte tag of the
//! receiver's virtual (address, port) stands in for the (hashed address, port) a direct datagram
//! arrives on, and this index stands in for [`crate::endpoint::RouteIndex`]'s local index. It is
//! kept the same way: sets are named by the caller's [`PeerId`]s (one per route set, as
//! [`crate::endpoint::PeerTable::add_secondary`] names a session set), and a set's epoch change
//! ([`TagIndex::set_window`]) derives only the routes that enter its window and removes only
//! those that leave (one BLAKE3 for the route, one for its tag, one insert and one remove per
//! epoch), whatever the number of sets.
//!
//! Virtual routes have no attempt offsets: no address is bound, so none collides and no epoch
//! moves (§5.2 does not apply, §10.5); the caller derives each route at offset 0. Two routes
//! with one tag (probability 2^-64 per pair, keyed: nobody can aim for it) are **contested**,
//! found by neither until one leaves, as [`crate::endpoint::RouteIndex`] does for a local key.
//!
//! The table is probed with tags read from frames, which any relay on the path chooses, so it
//! is keyed by the caller's [`IndexSeed`] (SipHash-1-3, as the endpoint's indexes). No clock, no
//! randomness, no allocation per lookup or per epoch (the contested list allocates only on a
//! 2^-64 collision).

use std::hash::{Hash, Hasher};

use super::e2e::{E2ePayload, RouteTag, RouteTagKey};
use super::RelayError;
use crate::endpoint::{Claims, IndexError, IndexSeed, PeerId, SeededState, WINDOW};
use crate::{Epoch, Route};

/// A tag as a hash key: its 8 bytes, no length prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TagKey([u8; 8]);

impl Hash for TagKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(&self.0);
    }
}

#[derive(Debug, Clone, Copy)]
struct Installed {
    route: Route,
    tag: TagKey,
}

#[derive(Debug)]
struct SetTags {
    generation: u32,
    key: Option<RouteTagKey>,
    current: Epoch,
    window: [Option<Installed>; WINDOW],
}

/// Route tags of every bound end-to-end set's accept window (module docs).
///
/// Call order: [`TagIndex::add_set`] when a set of an end-to-end stream is bound (with its tag
/// key, [`RouteTagKey::derive`] of the set key), [`TagIndex::set_window`] at each of the set's
/// epoch changes (the caller's timers, as for [`crate::endpoint::PeerTable`]),
/// [`TagIndex::remove_set`] when it is released. Per received e2e payload:
/// [`TagIndex::find`], then the payload is received as a datagram on the route found (header
/// protection removed with that set's receive key, classified, opened: §4.2 from step 0).
#[derive(Debug)]
pub struct TagIndex {
    /// Tags and the (set, epoch) claiming each; a tag claimed twice is found by nobody.
    tags: Claims<TagKey>,
    /// By slot; `key` None for a free slot.
    sets: Vec<SetTags>,
    len: usize,
}

impl TagIndex {
    /// An empty index keyed by `seed` (draw it at random per process).
    pub fn new(seed: IndexSeed) -> TagIndex {
        TagIndex::with_capacity(seed, 0)
    }

    /// An empty index with room for `sets` sets' windows without rehashing.
    pub fn with_capacity(seed: IndexSeed, sets: usize) -> TagIndex {
        TagIndex {
            tags: Claims::with_capacity(SeededState::new(seed), sets.saturating_mul(WINDOW)),
            sets: Vec::with_capacity(sets),
            len: 0,
        }
    }

    /// Adds a set with an empty window and its tag key. O(1) amortised.
    pub fn add_set(&mut self, set: PeerId, key: RouteTagKey) -> Result<(), IndexError> {
        let slot = set.slot();
        if let Some(s) = self.sets.get(slot).filter(|s| s.key.is_some()) {
            return Err(IndexError::SlotInUse {
                peer: set,
                held_by: PeerId::from_parts(set.index(), s.generation),
            });
        }
        while self.sets.len() <= slot {
            self.sets.push(SetTags {
                generation: 0,
                key: None,
                current: Epoch(0),
                window: [None; WINDOW],
            });
        }
        self.sets[slot] = SetTags {
            generation: set.generation(),
            key: Some(key),
            current: Epoch(0),
            window: [None; WINDOW],
        };
        self.len += 1;
        Ok(())
    }

    /// Removes a set and every tag of its window. O(WINDOW).
    pub fn remove_set(&mut self, set: PeerId) -> Result<(), IndexError> {
        let s = self.set_mut(set)?;
        s.key = None;
        let window = std::mem::replace(&mut s.window, [None; WINDOW]);
        self.len -= 1;
        for inst in window.into_iter().flatten() {
            self.tags.unclaim(inst.tag, (set, inst.route.epoch));
        }
        Ok(())
    }

    /// Makes `set`'s window the accept window of epoch `current` (e-1, e, e+1; fewer at the ends
    /// of the epoch range): tags of epochs that left it are removed, and each epoch missing is
    /// derived with `derive(epoch)` (the set's route of that epoch as the receiver sees it,
    /// normally `|e| stream.route_with_attempt(e, 0)`), tagged and inserted. Returns how many
    /// routes entered. Advancing one epoch costs one derivation, one tag, one insert and one
    /// remove; calling it again with the same epoch changes nothing.
    pub fn set_window(
        &mut self,
        set: PeerId,
        current: Epoch,
        mut derive: impl FnMut(Epoch) -> Route,
    ) -> Result<usize, IndexError> {
        let want = window_of(current);
        let s = self.set_mut(set)?;
        s.current = current;
        let mut leaving = [None; WINDOW];
        for (slot, out) in s.window.iter_mut().zip(&mut leaving) {
            if slot.is_some_and(|i| !want.contains(&Some(i.route.epoch))) {
                *out = slot.take();
            }
        }
        let mut entering = [None; WINDOW];
        if let Some(key) = &s.key {
            for (e, out) in want.iter().flatten().zip(&mut entering) {
                if s.window.iter().flatten().any(|i| i.route.epoch == *e) {
                    continue;
                }
                let route = derive(*e);
                debug_assert_eq!(route.epoch, *e, "derive must return the epoch's route");
                let inst = Installed {
                    route,
                    tag: TagKey(key.tag_from(&route).0),
                };
                if let Some(free) = s.window.iter_mut().find(|w| w.is_none()) {
                    *free = Some(inst);
                    *out = Some(inst);
                }
            }
        }
        for inst in leaving.into_iter().flatten() {
            self.tags.unclaim(inst.tag, (set, inst.route.epoch));
        }
        let mut n = 0;
        for inst in entering.into_iter().flatten() {
            self.tags.claim(inst.tag, (set, inst.route.epoch));
            n += 1;
        }
        Ok(n)
    }

    /// The set and accept route a tag names; `None` for a tag of no route (or a contested one).
    /// One keyed hash of 8 bytes and one probe, no allocation.
    pub fn lookup(&self, tag: RouteTag) -> Option<(PeerId, &Route)> {
        let (set, epoch) = self.tags.get(&TagKey(tag.0))?;
        Some((set, self.route(set, epoch)?))
    }

    /// [`TagIndex::lookup`] of a relay payload's tag, refused as `relay_unknown_tag` (§10.5).
    pub fn find<T: AsRef<[u8]>>(
        &self,
        payload: &E2ePayload<T>,
    ) -> Result<(PeerId, &Route), RelayError> {
        let tag = payload.tag();
        self.lookup(tag).ok_or(RelayError::UnknownTag(tag.0))
    }

    /// Whether `tag` is claimed by more than one route.
    pub fn is_contested(&self, tag: RouteTag) -> bool {
        self.tags.is_contested(&TagKey(tag.0))
    }

    /// The route of `epoch` in `set`'s window. O(WINDOW).
    pub fn route(&self, set: PeerId, epoch: Epoch) -> Option<&Route> {
        self.set(set)?
            .window
            .iter()
            .flatten()
            .map(|i| &i.route)
            .find(|r| r.epoch == epoch)
    }

    /// The epoch `set`'s window was last set to.
    pub fn current(&self, set: PeerId) -> Option<Epoch> {
        self.set(set).map(|s| s.current)
    }

    /// Every route of `set`'s window, in no particular order.
    pub fn window(&self, set: PeerId) -> impl Iterator<Item = &Route> + '_ {
        self.set(set)
            .into_iter()
            .flat_map(|s| s.window.iter().flatten().map(|i| &i.route))
    }

    /// Tags found by [`TagIndex::lookup`] (contested ones excluded).
    pub fn tags_len(&self) -> usize {
        self.tags.found_len()
    }

    /// Live sets.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No live set.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn set(&self, set: PeerId) -> Option<&SetTags> {
        self.sets
            .get(set.slot())
            .filter(|s| s.key.is_some() && s.generation == set.generation())
    }

    fn set_mut(&mut self, set: PeerId) -> Result<&mut SetTags, IndexError> {
        self.sets
            .get_mut(set.slot())
            .filter(|s| s.key.is_some() && s.generation == set.generation())
            .ok_or(IndexError::UnknownPeer { peer: set })
    }
}

/// The distinct epochs of the accept window of `e`, saturating at both ends of the range.
fn window_of(e: Epoch) -> [Option<Epoch>; WINDOW] {
    let prev = e.0.checked_sub(1).map(Epoch);
    let next = e.0.checked_add(1).map(Epoch);
    [prev, Some(e), next]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handshake::is_handshake;
    use crate::relay::e2e::{
        e2e_relay_payload_len, seal_e2e, seal_e2e_keepalive, VirtualRoute, ROUTE_TAG_LEN,
    };
    use crate::relay::frame::{DEFAULT_FRAME_MAX, HEADER_LEN};
    use crate::relay::{frame_len, Kind, NodeId, RelayRepr, HOP_LIMIT};
    use crate::testutil::{addr, udp};
    use crate::tunnel::{frame_payload_len, FRAME_HEADROOM};
    use crate::{Endpoint, Mode, SessionKey, Stream, StreamConfig};

    const SEED: IndexSeed = IndexSeed::from_bytes([4; 16]);

    /// An encrypt-mode stream pair (at `a`, at `b`) under key `k`.
    fn pair(a: &str, b: &str, k: u8) -> (Stream, Stream) {
        let mut c = StreamConfig::new(
            Endpoint::new(addr(a)),
            Endpoint::new(addr(b)),
            SessionKey::from_bytes(&[k; 32]).unwrap(),
        );
        c.mode = Mode::Encrypt;
        (
            Stream::new(c.clone()).unwrap(),
            Stream::new(c.mirrored()).unwrap(),
        )
    }

    fn tag_key(s: &Stream) -> RouteTagKey {
        RouteTagKey::derive(&s.config().key)
    }

    #[test]
    fn windows_follow_the_epoch_by_deltas() {
        let (a, b) = pair("2001:db8:a::1", "2001:db8:b::2", 7);
        let mut ix = TagIndex::new(SEED);
        let set = PeerId::from_parts(3, 1);
        ix.add_set(set, tag_key(&b)).unwrap();
        assert!(matches!(
            ix.add_set(set, tag_key(&b)),
            Err(IndexError::SlotInUse { .. })
        ));
        let sent = |e: u64| VirtualRoute::new(a.route(Epoch(e)), &tag_key(&a)).tag;
        assert_eq!(ix.set_window(set, Epoch(100), |e| b.route(e)), Ok(3));
        assert_eq!(ix.set_window(set, Epoch(100), |e| b.route(e)), Ok(0));
        for e in 101..110u64 {
            assert_eq!(ix.set_window(set, Epoch(e), |e| b.route(e)), Ok(1));
            assert_eq!(ix.current(set), Some(Epoch(e)));
            assert_eq!(ix.tags_len(), 3);
            for accepted in e - 1..=e + 1 {
                let (s, r) = ix.lookup(sent(accepted)).unwrap();
                assert_eq!((s, *r), (set, b.route(Epoch(accepted))));
            }
            for outside in [e - 2, e + 2] {
                assert_eq!(ix.lookup(sent(outside)), None, "epoch {outside} at {e}");
            }
            // The tag of the sender's own end is not the receiver's.
            let own = tag_key(&a).tag_from(&a.route(Epoch(e)));
            assert_eq!(ix.lookup(own), None);
        }
        // A jump: the whole window is replaced.
        assert_eq!(ix.set_window(set, Epoch(500), |e| b.route(e)), Ok(3));
        assert_eq!(ix.tags_len(), 3);
        // The ends of the epoch range.
        assert_eq!(ix.set_window(set, Epoch(0), |e| b.route(e)), Ok(2));
        assert_eq!(ix.window(set).count(), 2);
        let stale = PeerId::from_parts(3, 0);
        assert!(matches!(
            ix.set_window(stale, Epoch(1), |e| b.route(e)),
            Err(IndexError::UnknownPeer { .. })
        ));
        ix.remove_set(set).unwrap();
        assert_eq!((ix.tags_len(), ix.len(), ix.window(set).count()), (0, 0, 0));
        assert!(ix.is_empty());
        assert!(ix.remove_set(set).is_err());
        assert_eq!(ix.lookup(sent(1)), None);
    }

    #[test]
    fn an_unknown_tag_is_a_typed_refusal() {
        let (a, b) = pair("2001:db8:a::1", "2001:db8:b::2", 7);
        let mut ix = TagIndex::new(SEED);
        let set = PeerId::from_parts(0, 0);
        ix.add_set(set, tag_key(&b)).unwrap();
        ix.set_window(set, Epoch(9), |e| b.route(e)).unwrap();
        let mut buf = [0u8; 40];
        buf[..8].copy_from_slice(&VirtualRoute::new(a.route(Epoch(9)), &tag_key(&a)).tag.0);
        assert_eq!(
            ix.find(&E2ePayload::new_checked(&buf[..]).unwrap())
                .unwrap()
                .0,
            set
        );
        buf[0] ^= 1;
        let e = ix
            .find(&E2ePayload::new_checked(&buf[..]).unwrap())
            .unwrap_err();
        assert_eq!(e, RelayError::UnknownTag(buf[..8].try_into().unwrap()));
        assert_eq!(e.reason(), "relay_unknown_tag");
        // Another set's key gives other tags.
        let (_, other) = pair("2001:db8:a::1", "2001:db8:b::2", 8);
        let t = VirtualRoute::new(other.route(Epoch(9)), &tag_key(&other)).tag;
        assert_eq!(ix.lookup(t), None);
    }

    #[test]
    fn a_tag_claimed_twice_is_found_by_neither_until_one_leaves() {
        let (a, b) = pair("2001:db8:a::1", "2001:db8:b::2", 7);
        let mut ix = TagIndex::new(SEED);
        let (s1, s2) = (PeerId::from_parts(0, 0), PeerId::from_parts(1, 0));
        // One set configured twice: every tag collides.
        ix.add_set(s1, tag_key(&b)).unwrap();
        ix.add_set(s2, tag_key(&b)).unwrap();
        ix.set_window(s1, Epoch(50), |e| b.route(e)).unwrap();
        ix.set_window(s2, Epoch(50), |e| b.route(e)).unwrap();
        let t = VirtualRoute::new(a.route(Epoch(50)), &tag_key(&a)).tag;
        assert_eq!(ix.lookup(t), None);
        assert!(ix.is_contested(t));
        ix.remove_set(s1).unwrap();
        assert!(!ix.is_contested(t));
        assert_eq!(ix.lookup(t).map(|(s, _)| s), Some(s2));
    }

    /// §10.1-§10.5 end to end: host H_A behind edge A sends to host H_B behind edge B through
    /// relay R. A seals the inner packet for the e2e stream's virtual route straight into the
    /// frame's payload area and seals the frame in the same buffer for link A-R; R opens it,
    /// lowers the hop limit and reseals it for link R-B in place; B opens the link payload,
    /// finds the set and route by the tag and receives the e2e payload as a datagram on that
    /// route. No copy of the packet after the first, no allocation in the path.
    #[test]
    fn an_e2e_packet_crosses_a_relay_and_opens_as_on_its_virtual_route() {
        let (e2e_a, e2e_b) = pair("2001:db8:a::1", "2001:db8:b::2", 1);
        let (link_ar, link_ra) = pair("2001:db8:e::a", "2001:db8:e::f", 2);
        let (link_rb, link_br) = pair("2001:db8:e::f", "2001:db8:e::b", 3);
        let dest = NodeId::from_bytes([0xb0; 8]);
        let epoch = Epoch(7_000);
        // A's sending state for the epoch; B's index over its accept window.
        let via = VirtualRoute::new(e2e_a.route(epoch), &tag_key(&e2e_a));
        let e2e_sealer = e2e_a.sealer(1 << 26, u64::MAX);
        let mut tags = TagIndex::new(SEED);
        let set = PeerId::from_parts(0, 0);
        tags.add_set(set, tag_key(&e2e_b)).unwrap();
        tags.set_window(set, epoch.next(), |e| e2e_b.route(e))
            .unwrap();
        let mut e2e_opener = e2e_b.opener();
        let (ar, ra) = (link_ar.sealer(1 << 26, u64::MAX), link_ra.opener());
        let (rb, mut br) = (link_rb.sealer(1 << 26, u64::MAX), link_br.opener());
        let mut ra = ra;

        for body in [&b"hello"[..], &[0x77; 1300]] {
            let inner = udp(addr("2001:db8:a::1"), addr("2001:db8:b::2"), body);
            let len = e2e_relay_payload_len(inner.len());
            let flen = frame_len(len, DEFAULT_FRAME_MAX);
            let mut buf = vec![0u8; frame_payload_len(flen)];
            // Edge A: e2e payload into the frame, header and padding around it, link seal.
            let at = FRAME_HEADROOM + HEADER_LEN;
            let n = seal_e2e(
                &e2e_sealer,
                e2e_a.send_header_key().unwrap(),
                &via,
                &inner,
                &mut buf[at..],
            )
            .unwrap();
            assert_eq!(n, len);
            let repr = RelayRepr {
                kind: Kind::Data,
                hops: HOP_LIMIT,
                payload_len: u16::try_from(len).unwrap(),
                destination: dest,
            };
            repr.emit(&mut buf[FRAME_HEADROOM..FRAME_HEADROOM + flen])
                .unwrap();
            let link_ar_route = link_ar.route(epoch);
            let wire = ar
                .seal_frame_in_place(&link_ar_route, &mut buf, flen)
                .unwrap();
            link_ar.send_header_key().unwrap().protect(wire).unwrap();
            assert!(
                !buf.windows(body.len().min(16))
                    .any(|w| w == &body[..body.len().min(16)]),
                "nothing of the inner packet in clear"
            );

            // Relay R: open, read the header, forward on R-B in the same buffer.
            link_ra
                .recv_header_key()
                .unwrap()
                .unprotect(&mut buf)
                .unwrap();
            let mut f = ra
                .open_frame(&link_ra.route(epoch), &mut buf)
                .unwrap()
                .unwrap();
            assert_eq!(
                (f.kind(), f.destination(), f.hops()),
                (Kind::Data, dest, HOP_LIMIT)
            );
            f.set_hops(f.hops() - 1);
            let wire = rb
                .seal_frame_in_place(&link_rb.route(epoch), &mut buf, flen)
                .unwrap();
            link_rb.send_header_key().unwrap().protect(wire).unwrap();

            // Edge B: open the link, find the route by its tag, receive as on that route.
            link_br
                .recv_header_key()
                .unwrap()
                .unprotect(&mut buf)
                .unwrap();
            let f = br
                .open_frame(&link_br.route(epoch), &mut buf)
                .unwrap()
                .unwrap();
            assert_eq!((f.destination(), f.hops()), (dest, HOP_LIMIT - 1));
            let payload = E2ePayload::new_checked(f.into_payload_mut()).unwrap();
            let (found, route) = tags.find(&payload).unwrap();
            assert_eq!((found, *route), (set, e2e_b.route(epoch)));
            let route = *route;
            let e2e = payload.into_payload_mut();
            e2e_b.recv_header_key().unwrap().unprotect(e2e).unwrap();
            assert!(!is_handshake(e2e));
            let mut out = [0u8; 2048];
            let m = e2e_opener.open(&route, e2e, &mut out).unwrap();
            assert_eq!(&out[..m], &inner[..]);
        }

        // A keepalive over the same path, found and opened the same way; and its tag only
        // while its epoch is in the window.
        let mut ka = [0u8; ROUTE_TAG_LEN + 24];
        let n = seal_e2e_keepalive(&e2e_sealer, e2e_a.send_header_key().unwrap(), &via, &mut ka)
            .unwrap();
        assert_eq!(n, 32);
        let p = E2ePayload::new_checked(&mut ka[..]).unwrap();
        let route = *tags.find(&p).unwrap().1;
        let e2e = p.into_payload_mut();
        e2e_b.recv_header_key().unwrap().unprotect(e2e).unwrap();
        assert_eq!(e2e_opener.open(&route, e2e, &mut [0u8; 64]), Ok(0));
        tags.set_window(set, Epoch(epoch.0 + 2), |e| e2e_b.route(e))
            .unwrap();
        assert_eq!(
            tags.find(&E2ePayload::new_checked(&ka[..]).unwrap()),
            Err(RelayError::UnknownTag(via.tag.0))
        );
    }
}
