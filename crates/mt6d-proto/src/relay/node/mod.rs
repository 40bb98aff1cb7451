//! One relay network node, sans-IO (docs/PROTOCOL.md §10): the parts of this module put together
//! behind one input/output contract, for a relay, an edge gateway, or both.
//!
//! What it owns, per node: one [`RoutingTable`]; per neighbour a relay link (a [`Link`] over its
//! encrypt-mode MT6D [`Stream`]: handshake or pre-shared key, route sets; its [`Keys`] (the
//! receive keys and the [`Sealer`](crate::Sealer) it sends with), its [`LinkMonitor`](super::cost::LinkMonitor) and the routes of its
//! bound sets); for an edge gateway, per end-to-end peer its end-to-end stream (a [`Link`] too, its
//! receive keys, sealer and the virtual route of the epoch) and one [`TagIndex`] over all of their
//! sets.
//!
//! What it must not do: touch a socket or a clock, allocate per forwarded packet, or panic on
//! anything a peer sent. Every refusal is counted under its spec label ([`NodeCounters`]).
//!
//! # Scope of this step (docs/PROTOCOL.md §10.13) A **relay link** is keyed either by the Noise IK
//! handshakes of §9 ([`RelayNode::add_link_handshake`]: one [`Link`] per neighbour drives the
//! handshake, rekeying, key phases and route sets of §9.8; the node owns its receive keys and the
//! sending key it hands out) or by a pre-shared key ([`RelayNode::add_link`], a [`Sealer`](crate::Sealer) whose
//! counter reservation the caller persists, §4.3). Each **end-to-end stream** likewise: keyed by a
//! Noise IK handshake between the two edge gateways' identities carried through the relays
//! ([`RelayNode::add_e2e_handshake`]: its messages are relay payloads of kind `0x02` behind the
//! route tag of the set they travel on, §10.5; its route sets' virtual routes are all in the route
//! tag index), or pre-shared ([`RelayNode::add_e2e`]). A relay forwards kind `0x02` like data
//! within the end-to-end handshake rate limit (§10.5, [`HANDSHAKE_RATE`]). An end-to-end handshake
//! starts when a route to the other edge gateway exists, and again at once when the first route
//! appears. Route moves (§5.2) are answered on a link (notices), never started: a relay does not
//! watch its segment for collisions; virtual routes never move.
//!
//! # Decisions where the spec leaves the driver free
//! - **The node removes and applies header protection (§4.5)**, on both the link layer and the
//!   end-to-end layer: it holds every key, so the caller moves opaque UDP payloads only.
//! - **The caller names the link and the addresses a datagram arrived on**; the node matches them
//!   against the link's accept routes (e-1, e, e+1) it keeps per epoch
//!   ([`Event::LinkSchedule`] tells the caller what to bind and where to send from). A datagram
//!   on no accept route is `node_unknown_route`.
//! - **Data packets are written into the caller's buffer**, not queued: a forwarded frame is
//!   opened and sealed again where it arrived ([`Received::Forward`]), an inner packet for the
//!   protected side is restored where its e2e payload lay ([`Received::Deliver`]), and
//!   [`RelayNode::send_inner`] seals into the caller's buffer. Link-local frames (probes,
//!   replies, routing messages) are queued as headers and written at
//!   [`RelayNode::poll_transmit`].
//! - **The handshake rate limit (§10.5) is a token bucket per ingress link and destination**
//!   (20 frames of burst, one more every 50 ms), checked after the route lookup (§10.3 step 4),
//!   so only destinations the node routes to get a bucket, and at most [`HANDSHAKE_BUCKETS`] of
//!   them: a full table forgets the buckets that have refilled, and if every one is still in
//!   use, the one closest to full (the least forgiven by forgetting it). Per ingress link, so
//!   that a neighbour flooding handshakes for D spends its own share and never another link's.
//!
//! # Call order (as quinn-proto's `Connection`)
//! 1. [`RelayNode::new`] (or [`RelayNode::relay`], [`RelayNode::edge`]); [`RelayNode::add_link`]
//!    per neighbour, [`RelayNode::add_e2e`] per end-to-end peer (edge gateways).
//! 2. Per datagram received on a link: [`RelayNode::handle_datagram`], then act on its
//!    [`Received`] (send the buffer, deliver the inner packet, or nothing).
//!    A driver whose threads share the node behind a lock takes the same steps in passes:
//!    [`super::gate::RxGate::admit`] without the node (refuses junk and forgeries, opens the
//!    rest; [`RelayNode::begin_datagram`] for what it leaves to the node), then
//!    [`RelayNode::finish_datagram`] under it, [`SealJob::seal`] or [`DeliverJob::open`]
//!    without it, and [`RelayNode::finish_delivery`] under it for a delivery. It makes a new
//!    gate ([`RelayNode::rx_gate`]) whenever [`RelayNode::rx_version`] moves on, before it sends
//!    anything [`RelayNode::poll_transmit`] gives.
//! 3. Per inner packet from the protected side: [`RelayNode::send_inner`], send what it wrote.
//! 4. At [`RelayNode::poll_timeout`]: [`RelayNode::handle_timeout`] (with the caller's RNG).
//!    A node with handshake-keyed links needs [`RelayNode::set_entropy`] first: 32 fresh bytes
//!    per handshake message it makes.
//! 5. After each of 1-4: send every [`RelayNode::poll_transmit`] and apply every
//!    [`RelayNode::poll_event`] (bind a link's new routes, log route changes).
//! 6. A link gone from the configuration: [`RelayNode::remove_link`] (then 5, and a new gate);
//!    a changed one is removed and added again under a handle never used before.
//!
//! Buffers: every datagram buffer given to the node must hold
//! [`crate::tunnel::frame_payload_len`]`(frame_max)` bytes to take any frame of the network.

use std::collections::{BTreeMap, VecDeque};

use super::e2e::ROUTE_TAG_LEN;
use super::frame::{HEADER_LEN, MIN_FRAME_MAX};
use super::probe::ProbeRepr;
use super::table::{Neighbour, RoutingTable};
use super::tags::TagIndex;
use super::NodeId;
use crate::endpoint::IndexSeed;
use crate::link::{Event as LinkEvent, Keys, Link};
use crate::tunnel::{FRAME_HEADROOM, OPEN_HEADROOM, TAG_LEN};
use crate::{Mode, Stream, UnixTime};

/// Where a frame's relay payload starts in a link payload: counter, relay header.
const PAYLOAD_AT: usize = FRAME_HEADROOM + HEADER_LEN;
/// Where the e2e payload starts in a link payload: counter, relay header, route tag. That is 8
/// bytes short of the headroom [`Opener::open_in_place`] asks for (auth mode's AAD), so the e2e
/// payload is moved 8 bytes on before it is opened: the link tag and padding behind it leave
/// at least 16 bytes of room, and the inner packet is then restored in the receive buffer.
const E2E_AT: usize = PAYLOAD_AT + ROUTE_TAG_LEN;
const _: () = assert!(OPEN_HEADROOM >= E2E_AT && OPEN_HEADROOM - E2E_AT <= TAG_LEN);

mod deliver;
mod end_to_end;
mod jobs;
mod limiter;
mod links;
mod receive;
mod report;
mod transmit;

pub use end_to_end::E2eId;
pub use jobs::{DeliverJob, Finish, InnerJob, OpenJob, Received, Resume, SealJob, Step, Transmit};
pub use limiter::{HANDSHAKE_BUCKETS, HANDSHAKE_RATE};
pub use report::{Event, NodeCounters, NodeError};

use end_to_end::{e2e_active, e2e_slot, E2eStream, E2E_SLOTS};
use jobs::After;
use limiter::HandshakeLimiter;
use links::RelayLink;
use transmit::Pending;

/// The caller's source of 32 fresh random bytes per handshake message (None: none now).
pub type Entropy = Box<dyn FnMut() -> Option<[u8; 32]> + Send>;

struct EntropySource(Option<Entropy>);

impl EntropySource {
    fn draw(&mut self) -> Option<[u8; 32]> {
        self.0.as_mut().and_then(|f| f())
    }
}

impl std::fmt::Debug for EntropySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Entropy(set)"
        } else {
            "Entropy(none)"
        })
    }
}

/// A relay network node (module docs).
#[derive(Debug)]
pub struct RelayNode {
    own: Option<NodeId>,
    frame_max: usize,
    table: RoutingTable,
    links: BTreeMap<Neighbour, RelayLink>,
    e2e: BTreeMap<E2eId, E2eStream>,
    tags: TagIndex,
    pending: VecDeque<Pending>,
    events: VecDeque<Event>,
    /// The next hop of every destination as last reported in an event.
    reported: BTreeMap<NodeId, Neighbour>,
    /// The earliest epoch change of any link or end-to-end stream.
    next_change: UnixTime,
    /// §10.5: forwarded end-to-end handshake frames per destination.
    handshake_rate: HandshakeLimiter,
    /// Routing messages are written here before they are sealed.
    scratch: Vec<u8>,
    /// Fresh randomness for handshake messages ([`RelayNode::set_entropy`]).
    entropy: EntropySource,
    counters: NodeCounters,
    /// Links added and removed so far (part of [`RelayNode::rx_version`]).
    membership: u64,
}

impl RelayNode {
    /// A pure relay: no hosts, forwards for others.
    pub fn relay(now: UnixTime, frame_max: usize) -> Result<RelayNode, NodeError> {
        Self::new(now, None, true, frame_max, IndexSeed::from_bytes([0; 16]))
    }

    /// An edge gateway that is not a relay, with node id `own`; `seed` keys its route tag index
    /// (draw it at random per process).
    pub fn edge(
        now: UnixTime,
        own: NodeId,
        frame_max: usize,
        seed: IndexSeed,
    ) -> Result<RelayNode, NodeError> {
        Self::new(now, Some(own), false, frame_max, seed)
    }

    /// Any combination (§10.1): `own` the node's id if it is an edge gateway, `transit` whether
    /// it forwards for others, `frame_max` the network's largest frame (§10.4, §10.12).
    pub fn new(
        now: UnixTime,
        own: Option<NodeId>,
        transit: bool,
        frame_max: usize,
        seed: IndexSeed,
    ) -> Result<RelayNode, NodeError> {
        if frame_max < MIN_FRAME_MAX {
            return Err(NodeError::FrameMax {
                frame_max,
                min: MIN_FRAME_MAX,
            });
        }
        let own = own.filter(|id| !id.is_reserved());
        Ok(RelayNode {
            own,
            frame_max,
            table: RoutingTable::new(now, own, transit),
            links: BTreeMap::new(),
            e2e: BTreeMap::new(),
            tags: TagIndex::new(seed),
            pending: VecDeque::new(),
            events: VecDeque::new(),
            reported: BTreeMap::new(),
            next_change: UnixTime::from_nanos(u64::MAX),
            handshake_rate: HandshakeLimiter::new(transit),
            scratch: Vec::with_capacity(frame_max),
            entropy: EntropySource(None),
            counters: NodeCounters::default(),
            membership: 0,
        })
    }

    /// Where the node draws 32 fresh random bytes for each handshake message it makes (a
    /// CSPRNG of the caller's). Without it, handshake-keyed links never key (every handshake
    /// counts `hs_no_entropy`).
    pub fn set_entropy(&mut self, entropy: Entropy) {
        self.entropy = EntropySource(Some(entropy));
    }

    /// This node's id (None for a pure relay).
    pub fn own(&self) -> Option<NodeId> {
        self.own
    }

    /// The network's largest frame.
    pub fn frame_max(&self) -> usize {
        self.frame_max
    }

    /// The routing table.
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }

    /// Counters and drops.
    pub fn counters(&self) -> &NodeCounters {
        &self.counters
    }

    /// Probes due, lost requests, dead links, routing timers, epoch changes. `random` is the
    /// caller's RNG (it spaces the probes, §10.6).
    pub fn handle_timeout(&mut self, now: UnixTime, mut random: impl FnMut() -> u32) {
        self.refresh(now);
        let mut keyed = Vec::new();
        for (&link, l) in &mut self.links {
            while let Some(seq) = l.monitor.poll_probe(now, random()) {
                self.pending
                    .push_back(Pending::Probe(link, ProbeRepr::request(seq)));
            }
            l.monitor.handle_timeout(now);
            l.keys.recv_mut().expire(now);
            if l.link.poll_timeout().is_some_and(|t| t <= now) {
                let entropy = &mut self.entropy;
                l.link.handle_timeout(now, || entropy.draw());
                keyed.push(link);
            }
        }
        for link in keyed {
            self.drain_link(now, link);
        }
        let mut keyed = Vec::new();
        for (&id, e) in &mut self.e2e {
            e.keys.recv_mut().expire(now);
            // Without a route no initiation could arrive: the first route restarts it (`pump`).
            if !e2e_active(&self.table, e) {
                continue;
            }
            if e.link.poll_timeout().is_some_and(|t| t <= now) {
                let entropy = &mut self.entropy;
                e.link.handle_timeout(now, || entropy.draw());
                keyed.push(id);
            }
        }
        for id in keyed {
            self.drain_e2e(now, id);
        }
        if self.table.poll_timeout() <= now {
            self.table.handle_timeout(now);
        }
        self.pump(now);
    }

    /// When [`RelayNode::handle_timeout`] has work next.
    pub fn poll_timeout(&self) -> UnixTime {
        let mut t = self.table.poll_timeout().min(self.next_change);
        for l in self.links.values() {
            t = t.min(l.monitor.poll_timeout());
            if let Some(k) = l.link.poll_timeout() {
                t = t.min(k);
            }
        }
        for e in self.e2e.values().filter(|e| e2e_active(&self.table, e)) {
            if let Some(k) = e.link.poll_timeout() {
                t = t.min(k);
            }
        }
        t
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// Feeds link cost changes to the table, queues its routing messages, reports route changes.
    fn pump(&mut self, now: UnixTime) {
        for (&link, l) in &mut self.links {
            while let Some(cost) = l.monitor.poll_cost_change() {
                self.table.handle_link_cost(now, link, cost);
                self.events.push_back(Event::LinkCost { link, cost });
            }
        }
        while let Some(t) = self.table.poll_transmit() {
            self.pending.push_back(Pending::Routing(t.to, t.message));
        }
        let table = &self.table;
        let events = &mut self.events;
        self.reported.retain(|d, hop| {
            if table.next_hop(d) == Some(*hop) {
                return true;
            }
            if table.next_hop(d).is_none() {
                events.push_back(Event::RouteChanged {
                    destination: *d,
                    next_hop: None,
                });
            }
            false
        });
        for (d, r) in self.table.routes() {
            if !self.reported.contains_key(&d) {
                // A new path: an end-to-end handshake that found none starts again at once.
                for e in self.e2e.values_mut().filter(|e| e.destination == d) {
                    e.link.handle_path_up();
                }
            }
            if self.reported.get(&d) != Some(&r.next_hop) {
                self.reported.insert(d, r.next_hop);
                self.events.push_back(Event::RouteChanged {
                    destination: d,
                    next_hop: Some(r.next_hop),
                });
            }
        }
    }

    /// New epochs: the links' routes (announced) and the end-to-end streams' virtual routes and
    /// tag windows. One comparison when nothing is due.
    fn refresh(&mut self, now: UnixTime) {
        if now < self.next_change {
            return;
        }
        let mut next = UnixTime::from_nanos(u64::MAX);
        for (&link, l) in &mut self.links {
            if now >= l.next_change {
                l.recompute(now);
                self.events.push_back(Event::LinkSchedule {
                    link,
                    schedule: l.schedule,
                });
            }
            next = next.min(l.next_change);
        }
        for (&id, e) in &mut self.e2e {
            if now >= e.next_change {
                // The sets' slots were added with these ids: the index cannot refuse them.
                let synced = e.sync(id, &mut self.tags, now);
                debug_assert!(synced.is_ok());
            }
            next = next.min(e.next_change);
        }
        self.next_change = next;
    }
}

/// Drains a [`Link`]'s events, its key changes into the [`Keys`] its owner holds (a relay
/// link's or an end-to-end stream's), and reports the rest: `on_keys(Some((initiator,
/// rekey)))` when new keys are in use, `on_keys(None)` when they expired (already erased).
/// Returns whether the link's route sets changed.
fn apply_link_events(
    link: &mut Link,
    keys: &mut Keys,
    mut on_keys: impl FnMut(Option<(bool, bool)>),
) -> bool {
    let mut routes = false;
    while let Some(e) = link.poll_event(keys) {
        match e {
            LinkEvent::KeysErased => on_keys(None),
            LinkEvent::Established {
                initiator, rekey, ..
            } => on_keys(Some((initiator, rekey))),
            LinkEvent::RoutesChanged => routes = true,
            LinkEvent::SessionSet { .. } | LinkEvent::SetReleased { .. } => {}
        }
    }
    routes
}

fn encrypt_only(stream: &Stream) -> Result<(), NodeError> {
    match stream.mode() {
        Mode::Encrypt => Ok(()),
        mode => Err(NodeError::NotEncrypt { mode }),
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::relay::routing::UpdateEntry;
    use crate::relay::{Metric, Seqno};
    use crate::testutil::addr;
    use crate::{Endpoint, Sealer, SessionKey, StreamConfig};

    pub(in crate::relay) fn at(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_700_000_000_000 + ms)
    }

    pub(in crate::relay) fn pair(mode: Mode) -> (Stream, Stream) {
        let mut c = StreamConfig::new(
            Endpoint::new(addr("2001:db8:ff:1::1")),
            Endpoint::new(addr("2001:db8:ff:2::1")),
            SessionKey::from_bytes(&[9; 32]).unwrap(),
        );
        c.mode = mode;
        (
            Stream::new(c.clone()).unwrap(),
            Stream::new(c.mirrored()).unwrap(),
        )
    }

    pub(in crate::relay) const IN: Neighbour = Neighbour(1);
    pub(in crate::relay) const OUT: Neighbour = Neighbour(2);

    /// A relay with a link from a neighbour (whose stream and sealer are returned, to send it
    /// frames) and a link out, over which `dests` are routed.
    pub(in crate::relay) fn relay_routing(
        now: UnixTime,
        dests: &[NodeId],
    ) -> (RelayNode, Stream, Sealer) {
        let mut r = RelayNode::relay(now, MIN_FRAME_MAX).unwrap();
        let (a, peer) = pair(Mode::Encrypt);
        let sealer = a.sealer(1, u64::MAX);
        r.add_link(now, IN, a, sealer).unwrap();
        let (b, _) = pair(Mode::Encrypt);
        let sealer = b.sealer(1, u64::MAX);
        r.add_link(now, OUT, b, sealer).unwrap();
        r.table.handle_link_cost(now, OUT, Metric(20));
        let entries = dests.iter().map(|&destination| UpdateEntry {
            destination,
            seqno: Seqno(1),
            metric: Metric(0),
        });
        r.table.handle_update(now, OUT, entries);
        let peer_sealer = peer.sealer(1, u64::MAX);
        (r, peer, peer_sealer)
    }

    pub(in crate::relay) fn id(n: u64) -> NodeId {
        NodeId::from_bytes((n + 1).to_be_bytes())
    }
}
