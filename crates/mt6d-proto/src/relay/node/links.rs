//! The node's relay links (§10.1, §9): one per neighbour, keyed by handshakes or a pre-shared
//! key, its route sets' accept routes per epoch, and what its handshakes do to its keys.

use std::net::SocketAddrV6;
use std::sync::Arc;

use super::{apply_link_events, encrypt_only, Event, NodeError, Pending, RelayNode};
use crate::handshake::{Handshake, ReceiveKeys};
use crate::link::{Keys, Link};
use crate::moves::is_notice;
use crate::relay::cost::LinkMonitor;
use crate::relay::table::Neighbour;
use crate::route_sets::RouteSet;
use crate::{Route, Schedule, Sealer, Stream, UnixTime};

/// One relay link: an encrypt-mode MT6D stream and its keys (handshakes or pre-shared), its
/// route sets' routes at the epoch, and its probes.
#[derive(Debug)]
pub(super) struct RelayLink {
    /// The handshake, key life and route sets (§9); with a pre-shared key, the link set only.
    pub(super) link: Link,
    /// Its receive keys and the sending key that seals everything sent on the link (None
    /// before the first handshake and after expiry).
    pub(super) keys: Keys,
    pub(super) monitor: LinkMonitor,
    /// The routes of the set data is sent on.
    pub(super) schedule: Schedule,
    /// The set data is sent on (its header keys protect what the node sends).
    pub(super) send_set: Arc<RouteSet>,
    /// Every bound set's accept routes (e-1, e, e+1), in the order [`Link::select`] gives them.
    pub(super) accept: Vec<Accept>,
    /// When any bound set's routes change next.
    pub(super) next_change: UnixTime,
    /// Moves on at every [`RelayLink::recompute`] (part of [`RelayNode::rx_version`]).
    pub(super) routes_version: u64,
}

/// One accept route of a link and the set it belongs to.
#[derive(Debug)]
pub(super) struct Accept {
    pub(super) set: Arc<RouteSet>,
    /// Whether data may arrive on the set ([`crate::route_sets::Bound::data`]).
    pub(super) data: bool,
    pub(super) route: Route,
}

impl RelayLink {
    pub(super) fn new(now: UnixTime, link: Link, keys: Keys) -> RelayLink {
        let send_set = link.sets().link().clone();
        let mut l = RelayLink {
            schedule: link.stream().schedule(now),
            link,
            keys,
            monitor: LinkMonitor::new(now),
            send_set,
            accept: Vec::with_capacity(12),
            next_change: now,
            routes_version: 0,
        };
        l.recompute(now);
        l
    }

    /// Rebuilds the send set, its schedule and the accept routes from the link's route sets.
    pub(super) fn recompute(&mut self, now: UnixTime) {
        self.routes_version += 1;
        let selection = self.link.select(now);
        self.schedule = Link::schedule_of(&selection.send, now);
        self.next_change = self.schedule.next_change;
        self.send_set = selection.send;
        self.accept.clear();
        for b in &selection.bound {
            let s = Link::schedule_of(&b.set, now);
            self.next_change = self.next_change.min(s.next_change);
            for route in s.accept {
                self.accept.push(Accept {
                    set: b.set.clone(),
                    data: b.data,
                    route,
                });
            }
        }
    }
}

impl RelayNode {
    /// Adds the relay link to a neighbour: `stream` between this node's address and the
    /// neighbour's (encrypt mode, pre-shared key), `sealer` its sealer (the caller persists the
    /// counter reservation, §4.3). Its probes start at once; its routes are announced as an
    /// [`Event::LinkSchedule`].
    pub fn add_link(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        stream: Stream,
        sealer: Sealer,
    ) -> Result<(), NodeError> {
        encrypt_only(&stream)?;
        let keys = Keys::pre_shared(Arc::new(sealer), ReceiveKeys::single(stream.opener()));
        let l = RelayLink::new(now, Link::pre_shared(stream), keys);
        self.insert_link(link, l)
    }

    /// Adds the relay link to a neighbour keyed by Noise IK handshakes (§10.1, §9): `stream`
    /// between this node's address and the neighbour's, encrypt mode, keyed by the handshake's
    /// link key ([`Handshake::link_key`]: its link set); `hs` the handshake with the neighbour's
    /// identity, its true addresses the two nodes' addresses. Nothing is sent on the link but
    /// handshake messages until one completes; the first initiation leaves at the next
    /// [`RelayNode::handle_timeout`].
    pub fn add_link_handshake(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        stream: Stream,
        hs: Handshake,
    ) -> Result<(), NodeError> {
        encrypt_only(&stream)?;
        let l = RelayLink::new(now, Link::with_handshake(stream, hs), Keys::new());
        self.insert_link(link, l)
    }

    pub(super) fn insert_link(&mut self, link: Neighbour, l: RelayLink) -> Result<(), NodeError> {
        if self.links.contains_key(&link) {
            return Err(NodeError::LinkExists(link));
        }
        self.membership = self.membership.wrapping_add(1);
        self.next_change = self.next_change.min(l.next_change);
        self.events.push_back(Event::LinkSchedule {
            link,
            schedule: l.schedule,
        });
        self.links.insert(link, l);
        Ok(())
    }

    /// Removes the link to a neighbour (its `[[relay.link]]` gone from the configuration, or
    /// changed: the caller adds the new one under a handle never used before). At once: its
    /// keys, routes and probes go, every destination routed through it is withdrawn (or
    /// takes another link, [`Event::RouteChanged`]), and whatever was queued for it (probes,
    /// routing and handshake messages) is dropped unsent; a datagram that still arrives on
    /// its routes is `node_unknown_link`. [`RelayNode::rx_version`] moves on, so a driver's
    /// receive gate forgets it too. The handle must not be given to another link: a frame
    /// the driver opened for it before the removal would be taken for the new one's.
    pub fn remove_link(&mut self, now: UnixTime, link: Neighbour) -> Result<(), NodeError> {
        if self.links.remove(&link).is_none() {
            return Err(NodeError::UnknownLink(link));
        }
        self.membership = self.membership.wrapping_add(1);
        self.pending.retain(|p| match p {
            Pending::Probe(n, _) | Pending::Routing(n, _) | Pending::Datagram(n, ..) => *n != link,
            Pending::E2e { .. } => true,
        });
        self.handshake_rate.forget(link);
        self.table.remove_neighbour(now, link);
        self.pump(now);
        Ok(())
    }

    /// A link's handshake (None for a pre-shared link): statistics, the time of its keys.
    pub fn link_handshake(&self, link: Neighbour) -> Option<&Handshake> {
        self.links.get(&link).and_then(|l| l.link.handshake())
    }

    /// The id of the route set a link sends on (0: the link set; a session set after a
    /// handshake, §9.8): for `mt6d status` and tests.
    pub fn link_route_set(&self, link: Neighbour) -> Option<u64> {
        self.links.get(&link).map(|l| l.send_set.id)
    }

    /// Whether a link holds a sending key (a pre-shared link always does).
    pub fn link_keyed(&self, link: Neighbour) -> bool {
        self.links
            .get(&link)
            .is_some_and(|l| l.keys.send().is_some())
    }

    /// A link's cost estimator.
    pub fn monitor(&self, link: Neighbour) -> Option<&LinkMonitor> {
        self.links.get(&link).map(|l| &l.monitor)
    }

    /// A link's routes as last refreshed.
    pub fn link_schedule(&self, link: Neighbour) -> Option<&Schedule> {
        self.links.get(&link).map(|l| &l.schedule)
    }

    /// The link whose accept routes (e-1, e, e+1 of every bound route set) hold the pair
    /// (`local`, `remote`) a datagram arrived on, for a driver that receives every link on one
    /// socket. A scan of three routes per link and set (one set in the steady state, up to four
    /// around a handshake): a node has a handful of neighbours.
    pub fn link_of(&self, local: SocketAddrV6, remote: SocketAddrV6) -> Option<Neighbour> {
        self.links.iter().find_map(|(&n, l)| {
            l.accept
                .iter()
                .any(|a| a.route.local == local && a.route.remote == remote)
                .then_some(n)
        })
    }

    /// Every link's accept routes (e-1, e, e+1 of every bound route set) with the link: what
    /// [`RelayNode::link_of`] scans, for a driver whose workers check datagrams against a copy
    /// before they take the node's lock. The set changes only with an [`Event::LinkSchedule`].
    pub fn accept_routes(&self) -> impl Iterator<Item = (Neighbour, Route)> + '_ {
        self.links
            .iter()
            .flat_map(|(&n, l)| l.accept.iter().map(move |a| (n, a.route)))
    }

    /// Whether `addr` is this node's address on an accept route of any link's bound sets
    /// (e-1, e, e+1): the addresses a neighbour on a shared segment may resolve now, and the
    /// only ones a Neighbour Solicitation is answered for. A scan, as [`RelayNode::link_of`].
    pub fn answers_for(&self, addr: std::net::Ipv6Addr) -> bool {
        self.links
            .values()
            .any(|l| l.accept.iter().any(|a| *a.route.local.ip() == addr))
    }

    /// The links, in handle order.
    pub fn links(&self) -> impl Iterator<Item = Neighbour> + '_ {
        self.links.keys().copied()
    }

    /// The sum of every link's routes and receive keys versions, plus the links added and
    /// removed in the high bits ([`RelayNode::rx_version`]): a removed link takes its own
    /// versions out of the sum, which the membership count moves on by far more than that
    /// (a link's versions move a few times per epoch: 2^40 of them is millennia).
    pub(in crate::relay) fn links_rx_versions(&self) -> u64 {
        self.links
            .values()
            .map(|l| l.routes_version.wrapping_add(l.keys.recv().version()))
            .fold(self.membership << 40, u64::wrapping_add)
    }

    /// Per link: its keys that alone open a payload, and its accept routes with their sets
    /// (what [`crate::relay::gate::RxGate`] copies).
    #[allow(clippy::type_complexity)]
    pub(in crate::relay) fn gate_links(
        &self,
    ) -> impl Iterator<
        Item = (
            Neighbour,
            crate::handshake::FrameKeys,
            Vec<(Route, Arc<RouteSet>)>,
        ),
    > + '_ {
        self.links.iter().map(|(&n, l)| {
            (
                n,
                l.keys.recv().frame_keys(),
                l.accept.iter().map(|a| (a.route, a.set.clone())).collect(),
            )
        })
    }

    /// A handshake message or route-move notice arrived on accept route `at` of `link` (header
    /// protection removed): the link handles it; a refusal is counted under its reason.
    pub(super) fn link_message(&mut self, now: UnixTime, link: Neighbour, at: usize, bytes: &[u8]) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        let set = l.accept[at].set.clone();
        let route = l.accept[at].route;
        if is_notice(bytes) {
            if let Err(e) = l.link.handle_notice(now, &set, &route, bytes) {
                self.counters.drop(e.reason());
            }
        } else {
            let entropy = &mut self.entropy;
            let r = l
                .link
                .handle_handshake(now, &set, &route, bytes, l.keys.recv_mut(), || {
                    entropy.draw()
                });
            if let Err(e) = r {
                self.counters.drop(e.reason());
            }
        }
        self.drain_link(now, link);
    }

    /// Applies what a link's handshake did: its datagrams to send, its new keys and routes.
    pub(super) fn drain_link(&mut self, now: UnixTime, link: Neighbour) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        let events = &mut self.events;
        let routes = apply_link_events(&mut l.link, &mut l.keys, |keys| {
            events.push_back(match keys {
                Some((initiator, rekey)) => Event::LinkKeyed {
                    link,
                    initiator,
                    rekey,
                },
                None => Event::LinkKeysExpired { link },
            });
        });
        if routes {
            l.recompute(now);
            self.next_change = self.next_change.min(l.next_change);
            self.events.push_back(Event::LinkSchedule {
                link,
                schedule: l.schedule,
            });
        }
        let epoch = l.link.stream().epoch_at(now);
        while let Some(t) = l.link.poll_transmit() {
            let route = Route {
                epoch,
                local: t.src,
                remote: t.dst,
            };
            self.pending
                .push_back(Pending::Datagram(link, route, t.bytes));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::IndexSeed;
    use crate::relay::frame::MIN_FRAME_MAX;
    use crate::relay::node::tests::{at, pair};
    use crate::relay::node::{E2eId, Received};
    use crate::relay::NodeId;
    use crate::testutil::addr;
    use crate::tunnel::frame_payload_len;
    use crate::{Endpoint, Mode, SessionKey};

    #[test]
    fn a_datagram_is_matched_to_the_link_whose_accept_routes_hold_its_addresses() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let mut c = a.config().clone();
        c.remote = Endpoint::new(addr("2001:db8:ff:3::1"));
        c.key = SessionKey::from_bytes(&[7; 32]).unwrap();
        let b = Stream::new(c).unwrap();
        let (sa, sb) = (a.sealer(1, u64::MAX), b.sealer(1, u64::MAX));
        r.add_link(at(0), Neighbour(1), a, sa).unwrap();
        r.add_link(at(0), Neighbour(2), b, sb).unwrap();
        for n in [Neighbour(1), Neighbour(2)] {
            for route in r.link_schedule(n).unwrap().accept {
                assert_eq!(r.link_of(route.local, route.remote), Some(n));
            }
        }
        let one = r.link_schedule(Neighbour(1)).unwrap().send;
        let two = r.link_schedule(Neighbour(2)).unwrap().send;
        assert_eq!(r.link_of(one.local, two.remote), None);
        assert_eq!(r.links().collect::<Vec<_>>(), [Neighbour(1), Neighbour(2)]);
    }

    #[test]
    fn configuration_errors_are_refused() {
        assert_eq!(
            RelayNode::relay(at(0), MIN_FRAME_MAX - 1).unwrap_err(),
            NodeError::FrameMax {
                frame_max: MIN_FRAME_MAX - 1,
                min: MIN_FRAME_MAX
            }
        );
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (auth, _) = pair(Mode::Auth);
        let sealer = auth.sealer(1, u64::MAX);
        assert_eq!(
            r.add_link(at(0), Neighbour(1), auth, sealer),
            Err(NodeError::NotEncrypt { mode: Mode::Auth })
        );
        let (a, b) = pair(Mode::Encrypt);
        let (sa, sb) = (a.sealer(1, u64::MAX), b.sealer(1, u64::MAX));
        r.add_link(at(0), Neighbour(1), a, sa).unwrap();
        assert_eq!(
            r.add_link(at(0), Neighbour(1), b, sb),
            Err(NodeError::LinkExists(Neighbour(1)))
        );
        let (e, _) = pair(Mode::Encrypt);
        let sealer = e.sealer(1, u64::MAX);
        let id = NodeId::from_bytes([1; 8]);
        assert_eq!(
            r.add_e2e(at(0), E2eId(0), id, e, sealer),
            Err(NodeError::NotAnEdge)
        );
        let mut edge =
            RelayNode::edge(at(0), id, MIN_FRAME_MAX, IndexSeed::from_bytes([1; 16])).unwrap();
        let (e, _) = pair(Mode::Encrypt);
        let sealer = e.sealer(1, u64::MAX);
        assert_eq!(
            edge.add_e2e(at(0), E2eId(0), id, e, sealer),
            Err(NodeError::OwnDestination(id))
        );
        let mut out = [0u8; 2048];
        assert_eq!(
            edge.send_inner(at(0), E2eId(3), &[0x60; 48], &mut out),
            Err(NodeError::UnknownPeer(E2eId(3)))
        );
    }

    #[test]
    fn the_first_link_event_is_its_schedule_and_probes_start_at_once() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let want = a.schedule(at(0));
        let sealer = a.sealer(1, u64::MAX);
        r.add_link(at(0), Neighbour(4), a, sealer).unwrap();
        assert_eq!(
            r.poll_event(),
            Some(Event::LinkSchedule {
                link: Neighbour(4),
                schedule: want
            })
        );
        assert!(r.poll_timeout() <= at(0));
        r.handle_timeout(at(0), || 7);
        let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
        let t = r.poll_transmit(at(0), &mut out).unwrap();
        // A probe: the smallest size class, sealed (§10.4, §10.6).
        assert_eq!(
            (t.link, t.route, t.len),
            (Neighbour(4), want.send, 128 + 24)
        );
        assert!(r.poll_transmit(at(0), &mut out).is_none());
    }

    /// The accept routes a driver copies are exactly what `link_of` answers for, and follow
    /// the link's epochs.
    #[test]
    fn accept_routes_are_what_link_of_answers_for() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let sealer = a.sealer(1, u64::MAX);
        let (stream, _) = pair(Mode::Encrypt);
        r.add_link(at(0), Neighbour(4), a, sealer).unwrap();
        for t in [at(0), at(25_000)] {
            r.handle_timeout(t, || 7);
            let routes: Vec<(Neighbour, Route)> = r.accept_routes().collect();
            let want = stream.schedule(t).accept;
            assert_eq!(routes.len(), want.len());
            for ((n, route), w) in routes.iter().zip(want) {
                assert_eq!((*n, *route), (Neighbour(4), w));
                assert_eq!(r.link_of(route.local, route.remote), Some(Neighbour(4)));
            }
        }
    }

    /// A removed link takes its routes, its queued messages and its place in the gate with
    /// it: what was routed through it is withdrawn, and a datagram on its routes is refused.
    #[test]
    fn a_removed_link_leaves_no_route_no_queued_message_and_no_accept_route() {
        use crate::relay::node::tests::{id, relay_routing, OUT};
        let d = id(5);
        let (mut r, _, _) = relay_routing(at(0), &[d]);
        assert_eq!(r.table().next_hop(&d), Some(OUT));
        r.handle_timeout(at(0), || 7);
        while r.poll_event().is_some() {}
        // Probes (and the table's messages) for both links are queued now.
        let before = r.rx_version();
        let out_routes = r.link_schedule(OUT).unwrap().accept;
        r.remove_link(at(1), OUT).unwrap();
        assert_ne!(r.rx_version(), before);
        assert_eq!(r.table().next_hop(&d), None);
        let mut events = Vec::new();
        while let Some(e) = r.poll_event() {
            events.push(e);
        }
        assert!(
            events.contains(&Event::RouteChanged {
                destination: d,
                next_hop: None
            }),
            "{events:?}"
        );
        let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
        while let Some(t) = r.poll_transmit(at(1), &mut out) {
            assert_ne!(t.link, OUT, "a message left on the removed link");
        }
        assert_eq!(r.links().collect::<Vec<_>>(), [Neighbour(1)]);
        // (The helper's two links share their routes: IN answers for them still.)
        for route in out_routes {
            assert_ne!(r.link_of(route.local, route.remote), Some(OUT));
            assert_ne!(r.rx_gate().link_of(route.local, route.remote), Some(OUT));
        }
        let mut buf = [0u8; 152];
        let got = r.handle_datagram(
            at(1),
            OUT,
            out_routes[0].local,
            out_routes[0].remote,
            &mut buf,
        );
        assert_eq!(got, Received::Consumed);
        assert_eq!(r.counters().drops("node_unknown_link"), 1);
        assert_eq!(r.remove_link(at(1), OUT), Err(NodeError::UnknownLink(OUT)));
        // A removal and an addition never bring the gate's version back to an old value.
        let (b, _) = pair(Mode::Encrypt);
        let sealer = b.sealer(1, u64::MAX);
        let v = r.rx_version();
        r.add_link(at(1), Neighbour(3), b, sealer).unwrap();
        r.remove_link(at(1), Neighbour(3)).unwrap();
        assert_ne!(r.rx_version(), v);
    }

    #[test]
    fn datagrams_on_unknown_links_or_routes_are_counted() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let s = a.schedule(at(0));
        let sealer = a.sealer(1, u64::MAX);
        r.add_link(at(0), Neighbour(4), a, sealer).unwrap();
        let mut buf = [0u8; 152];
        let got = r.handle_datagram(at(0), Neighbour(5), s.send.local, s.send.remote, &mut buf);
        assert_eq!(got, Received::Consumed);
        let got = r.handle_datagram(at(0), Neighbour(4), s.send.remote, s.send.local, &mut buf);
        assert_eq!(got, Received::Consumed);
        let got = r.handle_datagram(at(0), Neighbour(4), s.send.local, s.send.remote, &mut buf);
        assert_eq!(got, Received::Consumed);
        let c = r.counters();
        assert_eq!(c.drops("node_unknown_link"), 1);
        assert_eq!(c.drops("node_unknown_route"), 1);
        assert_eq!(c.dropped(), 3, "{:?}", c.drop_labels().collect::<Vec<_>>());
    }
}
