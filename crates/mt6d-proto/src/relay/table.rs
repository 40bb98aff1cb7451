//! A node's routes to edge gateways (docs/PROTOCOL.md §10.8): distance vector with Babel's
//! feasibility condition (RFC 8966 §2.4, §3.5), seqno requests (§3.8), and link costs from
//! [`super::cost::LinkMonitor`].
//!
//! Why distance vector (docs/RELAYS.md): a node learns only its neighbours' distances, never the
//! graph (with link state every relay would hold the whole topology), and the feasibility
//! condition keeps every forwarding graph loop-free at every instant, not only after convergence.
//!
//! # Rules, in one place
//! - Destinations are edge gateways' [`NodeId`]s. An edge gateway originates its own id at metric
//!   0 with its own seqno; a relay originates nothing; a node that is not transit advertises only
//!   its own id and forwards nothing for others.
//! - A neighbour's advertised `(s, m)` is *feasible* iff `m` is infinite, or there is no
//!   feasibility distance (FD) yet, or `s` is newer than `FD.s`, or `s = FD.s` and `m < FD.m`.
//!   The FD follows every route selected or advertised (a newer seqno replaces it, the same
//!   seqno lowers its metric). So along selected next hops the FDs strictly decrease: no loop.
//! - Selection: the cheapest feasible route over a live link, keeping the current one unless
//!   another is more than 1/8 cheaper. An unfeasible update on the selected route is ignored and
//!   asks the origin for a newer seqno.
//! - Lost (no feasible route) with an FD: a seqno request for `FD.s + 1` to every live
//!   neighbour, resent every 200 ms up to 5 times; a node forwards others' requests along its
//!   selected route, the origin jumps to the requested seqno.
//! - Updates: every 5 s in full; in full to a neighbour whose link comes up; triggered at once
//!   when a route's next hop or seqno changes, a route is lost, or its metric moves by 1/8.
//!
//! # Contract
//! Inputs: [`RoutingTable::handle_link_cost`] (from the link's monitor),
//! [`RoutingTable::handle_update`] and [`RoutingTable::handle_request`] (a routing message from
//! a neighbour's link, parsed by [`super::routing::RoutingMessage`]),
//! [`RoutingTable::handle_timeout`] at [`RoutingTable::poll_timeout`]. After each, send every
//! [`RoutingTable::poll_transmit`] on the named neighbour's link. The data path asks
//! [`RoutingTable::forward`] per frame. Neighbours are the driver's handles ([`Neighbour`]), one
//! per link.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::Duration;

use super::frame::RelayRepr;
use super::routing::{RequestEntry, RoutingRepr, UpdateEntry, MAX_ENTRIES};
use super::{Metric, NodeId, Seqno, HOP_LIMIT};
use crate::UnixTime;

/// Full updates to every neighbour this often (003 §IV: its routers' 5-second cycle).
pub const UPDATE_INTERVAL: Duration = Duration::from_secs(5);
/// A route not refreshed for 3.5 update intervals expires (RFC 8966 Appendix B).
pub const ROUTE_EXPIRY: Duration = Duration::from_millis(17_500);
/// Seqno requests are resent this often while the destination stays lost.
pub const REQUEST_RESEND: Duration = Duration::from_millis(200);
/// Seqno requests sent per episode (the first and 4 resends: 1 s).
pub const REQUEST_TRIES: u8 = 5;
/// A node forwards one request per destination and seqno within this time (the requester's
/// resends, 200 ms apart, still pass).
pub const REQUEST_DEDUP: Duration = Duration::from_millis(150);
/// A destination with no route is forgotten, its FD with it, this long after it last had one
/// (RFC 8966 Appendix B, source garbage collection).
pub const SOURCE_GC: Duration = Duration::from_secs(180);

/// The driver's name for one link to one neighbour.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Neighbour(pub u32);

/// A routing message to send on `to`'s link (as a kind-`0x03` frame, padded, §10.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RoutingTransmit {
    /// The link.
    pub to: Neighbour,
    /// The message.
    pub message: RoutingRepr,
}

/// The route in use to one destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SelectedRoute {
    /// Where frames for the destination go.
    pub next_hop: Neighbour,
    /// The route's metric from here (neighbour's metric plus the link's cost).
    pub metric: Metric,
    /// The origin's seqno the route carries.
    pub seqno: Seqno,
}

/// What to do with a data or end-to-end handshake frame (§10.3 "Forwarding").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forward {
    /// It is for this edge gateway: hand the relay payload to the end-to-end layer.
    Deliver,
    /// Send it on `to`'s link with this hop limit.
    Send {
        /// The next hop.
        to: Neighbour,
        /// The hop limit to write into the frame.
        hops: u8,
    },
    /// Drop it (and count `reason()`).
    Drop(ForwardDrop),
}

/// Why a frame is not forwarded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ForwardDrop {
    /// A routing or probe frame: never forwarded.
    LinkLocal,
    /// This node is not transit and the frame is not for it.
    NotTransit,
    /// The hop limit ran out.
    HopLimit,
    /// No route to the destination.
    NoRoute,
}

impl ForwardDrop {
    /// A stable label for drop counters (docs/PROTOCOL.md §10.3).
    pub fn reason(self) -> &'static str {
        match self {
            ForwardDrop::LinkLocal => "relay_link_local",
            ForwardDrop::NotTransit => "relay_not_transit",
            ForwardDrop::HopLimit => "relay_hop_limit",
            ForwardDrop::NoRoute => "relay_no_route",
        }
    }
}

/// Counters of one table.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableStats {
    /// Update entries received from live links.
    pub update_entries: u64,
    /// Unfeasible updates on a selected route, ignored (each asks for a seqno).
    pub unfeasible_ignored: u64,
    /// Request entries received.
    pub request_entries: u64,
    /// Request entries sent for our own lost destinations.
    pub requests_sent: u64,
    /// Requests forwarded towards their origin.
    pub requests_forwarded: u64,
    /// Times this edge gateway's own seqno jumped to a requested one.
    pub seqno_jumps: u64,
    /// Times a destination's next hop changed (including to and from none).
    pub route_changes: u64,
}

#[derive(Debug, Clone, Copy)]
struct RouteEntry {
    via: Neighbour,
    seqno: Seqno,
    /// As the neighbour advertised it (without the link's cost).
    metric: Metric,
    expires: UnixTime,
}

#[derive(Debug, Clone, Copy)]
struct PendingRequest {
    seqno: Seqno,
    left: u8,
    next: UnixTime,
}

#[derive(Debug)]
struct Dest {
    routes: Vec<RouteEntry>,
    selected: Option<Neighbour>,
    fd: Option<(Seqno, Metric)>,
    /// What this node last advertised for the destination (transit nodes).
    advertised: Option<(Seqno, Metric, Option<Neighbour>)>,
    last_route: UnixTime,
    request: Option<PendingRequest>,
    forwarded: Option<(Seqno, UnixTime)>,
}

impl Dest {
    fn new(now: UnixTime) -> Dest {
        Dest {
            routes: Vec::new(),
            selected: None,
            fd: None,
            advertised: None,
            last_route: now,
            request: None,
            forwarded: None,
        }
    }

    fn is_feasible(&self, s: Seqno, m: Metric) -> bool {
        if !m.is_finite() {
            return true;
        }
        match self.fd {
            None => true,
            Some((fs, fm)) => s.is_newer_than(fs) || (s == fs && m < fm),
        }
    }

    fn update_fd(&mut self, s: Seqno, m: Metric) {
        if !m.is_finite() {
            return;
        }
        self.fd = match self.fd {
            None => Some((s, m)),
            Some((fs, _)) if s.is_newer_than(fs) => Some((s, m)),
            Some((fs, fm)) if s == fs => Some((fs, fm.min(m))),
            keep => keep,
        };
    }

    fn via(&self, r: &RouteEntry, links: &BTreeMap<Neighbour, Metric>) -> Metric {
        links
            .get(&r.via)
            .map_or(Metric::INFINITY, |c| r.metric.plus(*c))
    }

    fn current(&self, links: &BTreeMap<Neighbour, Metric>) -> Option<SelectedRoute> {
        let n = self.selected?;
        let r = self.routes.iter().find(|r| r.via == n)?;
        Some(SelectedRoute {
            next_hop: n,
            metric: self.via(r, links),
            seqno: r.seqno,
        })
    }

    /// Selects a route by the rules of §10.8; true if the next hop changed.
    fn reselect(&mut self, now: UnixTime, links: &BTreeMap<Neighbour, Metric>) -> bool {
        let candidates: Vec<SelectedRoute> = self
            .routes
            .iter()
            .filter(|r| self.is_feasible(r.seqno, r.metric))
            .map(|r| SelectedRoute {
                next_hop: r.via,
                metric: self.via(r, links),
                seqno: r.seqno,
            })
            .filter(|c| c.metric.is_finite())
            .collect();
        let current = self
            .selected
            .and_then(|n| candidates.iter().find(|c| c.next_hop == n).copied());
        let best = candidates
            .iter()
            .min_by_key(|c| (c.metric, c.next_hop))
            .copied();
        let chosen = match (current, best) {
            // 12.5 % hysteresis against flapping between near-equal paths.
            (Some(c), Some(b)) if b.metric.0 < c.metric.0 - c.metric.0 / 8 => Some(b),
            (Some(c), _) => Some(c),
            (None, b) => b,
        };
        let before = self.selected;
        self.selected = chosen.map(|c| c.next_hop);
        if chosen.is_some() || before.is_some() || !self.routes.is_empty() {
            // The garbage-collection clock starts when the last route is gone.
            self.last_route = now;
        }
        match chosen {
            Some(c) => {
                self.update_fd(c.seqno, c.metric);
                if self.request.is_some_and(|r| c.seqno.is_at_least(r.seqno)) {
                    self.request = None;
                }
            }
            None => {
                if self.request.is_none() {
                    self.want_newer_seqno(now);
                }
            }
        }
        before != self.selected
    }

    /// Starts (or restarts) seqno requests for `FD.s + 1`, unless one at least as new runs.
    fn want_newer_seqno(&mut self, now: UnixTime) {
        let Some((fs, _)) = self.fd else { return };
        let want = fs.next();
        if self.request.is_some_and(|r| r.seqno.is_at_least(want)) {
            return;
        }
        self.request = Some(PendingRequest {
            seqno: want,
            left: REQUEST_TRIES,
            next: now,
        });
    }

    /// What this node advertises for the destination now (None: nothing known).
    fn advertisement(
        &self,
        links: &BTreeMap<Neighbour, Metric>,
    ) -> Option<(Seqno, Metric, Option<Neighbour>)> {
        match self.current(links) {
            Some(c) => Some((c.seqno, c.metric, Some(c.next_hop))),
            None => self.fd.map(|(s, _)| (s, Metric::INFINITY, None)),
        }
    }

    /// Whether the advertisement moved enough for a triggered update.
    fn needs_trigger(&self, links: &BTreeMap<Neighbour, Metric>) -> bool {
        let Some((s, m, nh)) = self.advertisement(links) else {
            return false;
        };
        match self.advertised {
            None => m.is_finite(),
            Some((os, om, onh)) => {
                if m.is_finite() != om.is_finite() {
                    return true;
                }
                m.is_finite()
                    && (s != os || nh != onh || u32::from(m.0.abs_diff(om.0)) * 8 > u32::from(om.0))
            }
        }
    }
}

/// One node's routing state. See the module documentation.
#[derive(Debug)]
pub struct RoutingTable {
    own: Option<NodeId>,
    transit: bool,
    own_seqno: Seqno,
    /// Published cost of each neighbour's link ([`Metric::INFINITY`]: down).
    links: BTreeMap<Neighbour, Metric>,
    dests: BTreeMap<NodeId, Dest>,
    transmits: VecDeque<RoutingTransmit>,
    triggered: BTreeSet<NodeId>,
    own_triggered: bool,
    full_to: BTreeSet<Neighbour>,
    next_periodic: UnixTime,
    stats: TableStats,
}

impl RoutingTable {
    /// An edge gateway that is not a relay: originates `own`, forwards nothing for others.
    pub fn edge(now: UnixTime, own: NodeId) -> RoutingTable {
        Self::new(now, Some(own), false)
    }
    /// A relay with no hosts of its own.
    pub fn relay(now: UnixTime) -> RoutingTable {
        Self::new(now, None, true)
    }
    /// Any combination: `own` an edge gateway's id (None for a pure relay), `transit` whether it
    /// forwards for others. A reserved `own` is ignored (it cannot be a destination).
    pub fn new(now: UnixTime, own: Option<NodeId>, transit: bool) -> RoutingTable {
        RoutingTable {
            own: own.filter(|id| !id.is_reserved()),
            transit,
            own_seqno: Seqno(0),
            links: BTreeMap::new(),
            dests: BTreeMap::new(),
            transmits: VecDeque::new(),
            triggered: BTreeSet::new(),
            own_triggered: false,
            full_to: BTreeSet::new(),
            next_periodic: now.saturating_add(UPDATE_INTERVAL),
            stats: TableStats::default(),
        }
    }

    /// This edge gateway's seqno.
    pub fn own_seqno(&self) -> Seqno {
        self.own_seqno
    }
    /// Counters.
    pub fn stats(&self) -> TableStats {
        self.stats
    }
    /// The route in use to `destination`.
    pub fn route(&self, destination: &NodeId) -> Option<SelectedRoute> {
        self.dests.get(destination)?.current(&self.links)
    }
    /// Where frames for `destination` go.
    pub fn next_hop(&self, destination: &NodeId) -> Option<Neighbour> {
        self.route(destination).map(|r| r.next_hop)
    }
    /// Every destination with a route in use.
    pub fn routes(&self) -> impl Iterator<Item = (NodeId, SelectedRoute)> + '_ {
        self.dests
            .iter()
            .filter_map(|(id, d)| d.current(&self.links).map(|r| (*id, r)))
    }
    /// The feasibility distance kept for `destination` (tests, status).
    pub fn feasibility_distance(&self, destination: &NodeId) -> Option<(Seqno, Metric)> {
        self.dests.get(destination)?.fd
    }

    /// The next routing message to send.
    pub fn poll_transmit(&mut self) -> Option<RoutingTransmit> {
        self.transmits.pop_front()
    }

    /// When [`RoutingTable::handle_timeout`] has work next.
    pub fn poll_timeout(&self) -> UnixTime {
        let mut t = self.next_periodic;
        for d in self.dests.values() {
            for r in &d.routes {
                t = t.min(r.expires);
            }
            if let Some(r) = d.request {
                t = t.min(r.next);
            }
            if d.routes.is_empty() && d.selected.is_none() {
                t = t.min(d.last_route.saturating_add(SOURCE_GC));
            }
        }
        t
    }

    /// What to do with a data or end-to-end handshake frame with header `header`, received from
    /// a link (`originated` false) or originated by this edge gateway (`originated` true: the hop
    /// limit is the sender's, not decremented).
    pub fn forward(&self, header: &RelayRepr, originated: bool) -> Forward {
        if !header.kind.is_forwarded() {
            return Forward::Drop(ForwardDrop::LinkLocal);
        }
        if self.own == Some(header.destination) {
            return Forward::Deliver;
        }
        let hops = if originated {
            header.hops
        } else {
            if !self.transit {
                return Forward::Drop(ForwardDrop::NotTransit);
            }
            if header.hops <= 1 {
                return Forward::Drop(ForwardDrop::HopLimit);
            }
            header.hops - 1
        };
        match self.next_hop(&header.destination) {
            Some(to) => Forward::Send { to, hops },
            None => Forward::Drop(ForwardDrop::NoRoute),
        }
    }

    /// The published cost of `neighbour`'s link changed (or the link is new:
    /// [`Metric::INFINITY`] means down). Routes through a link that goes down are removed at once;
    /// a link that comes up gets a full update.
    pub fn handle_link_cost(&mut self, now: UnixTime, neighbour: Neighbour, cost: Metric) {
        let old = self
            .links
            .insert(neighbour, cost)
            .unwrap_or(Metric::INFINITY);
        if !cost.is_finite() {
            for d in self.dests.values_mut() {
                d.routes.retain(|r| r.via != neighbour);
            }
        } else if !old.is_finite() {
            // §10.8: a full update to it, and a wildcard request for its full update (the other
            // end may see the link up all along: a restarted node learns its routes at once).
            self.full_to.insert(neighbour);
            self.transmits.push_back(RoutingTransmit {
                to: neighbour,
                message: RoutingRepr::Request(vec![RequestEntry::wildcard()]),
            });
        }
        if old != cost {
            let ids: Vec<NodeId> = self.dests.keys().copied().collect();
            for id in ids {
                self.reselect(now, id);
            }
        }
        self.flush(now);
    }

    /// Forgets a neighbour (its link removed from the configuration).
    pub fn remove_neighbour(&mut self, now: UnixTime, neighbour: Neighbour) {
        self.handle_link_cost(now, neighbour, Metric::INFINITY);
        self.links.remove(&neighbour);
        self.full_to.remove(&neighbour);
    }

    /// An update from `from`'s link. Kept even while this end still sees the link down: the
    /// other end's monitor may see it up first and send its full update before ours does (its
    /// routes become candidates when the link's cost becomes finite; none is ever used through
    /// a link that is down).
    pub fn handle_update(
        &mut self,
        now: UnixTime,
        from: Neighbour,
        entries: impl IntoIterator<Item = UpdateEntry>,
    ) {
        self.links.entry(from).or_insert(Metric::INFINITY);
        for e in entries {
            if self.own == Some(e.destination) || e.destination.is_reserved() {
                continue;
            }
            self.stats.update_entries += 1;
            let d = self
                .dests
                .entry(e.destination)
                .or_insert_with(|| Dest::new(now));
            if d.selected == Some(from) && e.metric.is_finite() && !d.is_feasible(e.seqno, e.metric)
            {
                // RFC 8966 §3.5.4: ignore it (the route keeps its values and expiry; traffic
                // keeps flowing on a next hop that still leads there) and ask for a new seqno.
                self.stats.unfeasible_ignored += 1;
                d.want_newer_seqno(now);
                continue;
            }
            if e.metric.is_finite() {
                let entry = RouteEntry {
                    via: from,
                    seqno: e.seqno,
                    metric: e.metric,
                    expires: now.saturating_add(ROUTE_EXPIRY),
                };
                match d.routes.iter_mut().find(|r| r.via == from) {
                    Some(r) => *r = entry,
                    None => d.routes.push(entry),
                }
            } else {
                d.routes.retain(|r| r.via != from);
            }
            self.reselect(now, e.destination);
        }
        self.flush(now);
    }

    /// A seqno request from `from`'s link.
    pub fn handle_request(
        &mut self,
        now: UnixTime,
        from: Neighbour,
        entries: impl IntoIterator<Item = RequestEntry>,
    ) {
        self.links.entry(from).or_insert(Metric::INFINITY);
        for r in entries {
            self.stats.request_entries += 1;
            if r.is_wildcard() {
                // §10.8: a full update to it, sent if this end sees the link up (else when it
                // does, as to every link that leaves `Down`).
                self.full_to.insert(from);
                continue;
            }
            if self.own == Some(r.destination) {
                // Decision (§10.8): jump to the requested seqno, so a restarted edge gateway is
                // believed again after one request.
                if r.seqno.is_newer_than(self.own_seqno) {
                    self.own_seqno = r.seqno;
                    self.stats.seqno_jumps += 1;
                }
                self.own_triggered = true;
                continue;
            }
            if !self.transit {
                continue;
            }
            let Some(d) = self.dests.get_mut(&r.destination) else {
                continue;
            };
            let Some(cur) = d.current(&self.links) else {
                continue;
            };
            if cur.seqno.is_at_least(r.seqno) {
                self.triggered.insert(r.destination);
                continue;
            }
            let recent = d.forwarded.is_some_and(|(s, at)| {
                s.is_at_least(r.seqno) && now < at.saturating_add(REQUEST_DEDUP)
            });
            if r.hops >= 2 && cur.next_hop != from && !recent {
                d.forwarded = Some((r.seqno, now));
                self.stats.requests_forwarded += 1;
                self.transmits.push_back(RoutingTransmit {
                    to: cur.next_hop,
                    message: RoutingRepr::Request(vec![RequestEntry {
                        destination: r.destination,
                        seqno: r.seqno,
                        hops: r.hops - 1,
                    }]),
                });
            }
        }
        self.flush(now);
    }

    /// Expires routes, sends periodic updates and due requests, forgets old destinations.
    pub fn handle_timeout(&mut self, now: UnixTime) {
        let expired: Vec<NodeId> = self
            .dests
            .iter_mut()
            .filter_map(|(id, d)| {
                let before = d.routes.len();
                d.routes.retain(|r| r.expires > now);
                (d.routes.len() != before).then_some(*id)
            })
            .collect();
        for id in expired {
            self.reselect(now, id);
        }
        if now >= self.next_periodic {
            self.next_periodic = now.saturating_add(UPDATE_INTERVAL);
            let live: Vec<Neighbour> = self.live_neighbours().collect();
            self.full_to.extend(live);
        }
        self.dests.retain(|_, d| {
            !(d.routes.is_empty()
                && d.selected.is_none()
                && now >= d.last_route.saturating_add(SOURCE_GC))
        });
        self.flush(now);
    }

    fn live_neighbours(&self) -> impl Iterator<Item = Neighbour> + '_ {
        self.links
            .iter()
            .filter(|(_, c)| c.is_finite())
            .map(|(n, _)| *n)
    }

    fn reselect(&mut self, now: UnixTime, id: NodeId) {
        let Some(d) = self.dests.get_mut(&id) else {
            return;
        };
        if d.reselect(now, &self.links) {
            self.stats.route_changes += 1;
        }
        if self.transit && d.needs_trigger(&self.links) {
            self.triggered.insert(id);
        }
    }

    /// The entry this node advertises for `id` now, recording it (FD and last advertised).
    fn advertise(&mut self, id: NodeId) -> Option<UpdateEntry> {
        let d = self.dests.get_mut(&id)?;
        let (seqno, metric, nh) = d.advertisement(&self.links)?;
        d.update_fd(seqno, metric);
        d.advertised = Some((seqno, metric, nh));
        Some(UpdateEntry {
            destination: id,
            seqno,
            metric,
        })
    }

    fn own_entry(&self) -> Option<UpdateEntry> {
        self.own.map(|id| UpdateEntry {
            destination: id,
            seqno: self.own_seqno,
            metric: Metric(0),
        })
    }

    fn full_update(&mut self) -> Vec<UpdateEntry> {
        let mut entries: Vec<UpdateEntry> = self.own_entry().into_iter().collect();
        if self.transit {
            let ids: Vec<NodeId> = self.dests.keys().copied().collect();
            entries.extend(ids.into_iter().filter_map(|id| self.advertise(id)));
        }
        entries
    }

    fn send_updates(&mut self, to: Neighbour, entries: &[UpdateEntry]) {
        for chunk in entries.chunks(MAX_ENTRIES) {
            self.transmits.push_back(RoutingTransmit {
                to,
                message: RoutingRepr::Update(chunk.to_vec()),
            });
        }
    }

    /// Sends what the last input made due: triggered updates, full updates, seqno requests.
    fn flush(&mut self, now: UnixTime) {
        let live: Vec<Neighbour> = self.live_neighbours().collect();
        let mut triggered = Vec::new();
        if std::mem::take(&mut self.own_triggered) {
            triggered.extend(self.own_entry());
        }
        let ids = std::mem::take(&mut self.triggered);
        if self.transit {
            triggered.extend(ids.into_iter().filter_map(|id| self.advertise(id)));
        }
        if !triggered.is_empty() {
            for &n in &live {
                self.send_updates(n, &triggered);
            }
        }
        let full_to = std::mem::take(&mut self.full_to);
        if !full_to.is_empty() {
            let full = self.full_update();
            if !full.is_empty() {
                for n in full_to.into_iter().filter(|n| live.contains(n)) {
                    self.send_updates(n, &full);
                }
            }
        }
        let mut due = Vec::new();
        for (id, d) in &mut self.dests {
            let Some(r) = d.request.as_mut() else {
                continue;
            };
            if now < r.next {
                continue;
            }
            due.push(RequestEntry {
                destination: *id,
                seqno: r.seqno,
                hops: HOP_LIMIT,
            });
            r.left = r.left.saturating_sub(1);
            r.next = now.saturating_add(REQUEST_RESEND);
            if r.left == 0 {
                d.request = None;
            }
        }
        if !due.is_empty() && !live.is_empty() {
            self.stats.requests_sent += u64::try_from(due.len()).unwrap_or(u64::MAX);
            for &n in &live {
                for chunk in due.chunks(MAX_ENTRIES) {
                    self.transmits.push_back(RoutingTransmit {
                        to: n,
                        message: RoutingRepr::Request(chunk.to_vec()),
                    });
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::frame::Kind;
    use super::*;

    const D: NodeId = NodeId::from_bytes([0xdd; 8]);
    const E: NodeId = NodeId::from_bytes([0xee; 8]);
    const N1: Neighbour = Neighbour(1);
    const N2: Neighbour = Neighbour(2);
    const N3: Neighbour = Neighbour(3);

    fn t(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_700_000_000_000 + ms)
    }
    fn upd(d: NodeId, s: u16, m: u16) -> UpdateEntry {
        UpdateEntry {
            destination: d,
            seqno: Seqno(s),
            metric: Metric(m),
        }
    }
    fn drain(t: &mut RoutingTable) -> Vec<RoutingTransmit> {
        std::iter::from_fn(|| t.poll_transmit()).collect()
    }
    fn updates_to(out: &[RoutingTransmit], n: Neighbour) -> Vec<UpdateEntry> {
        out.iter()
            .filter(|x| x.to == n)
            .filter_map(|x| match &x.message {
                RoutingRepr::Update(v) => Some(v.clone()),
                RoutingRepr::Request(_) => None,
            })
            .flatten()
            .collect()
    }
    fn requests_to(out: &[RoutingTransmit], n: Neighbour) -> Vec<RequestEntry> {
        out.iter()
            .filter(|x| x.to == n)
            .filter_map(|x| match &x.message {
                RoutingRepr::Request(v) => Some(v.clone()),
                RoutingRepr::Update(_) => None,
            })
            .flatten()
            .collect()
    }
    /// A relay with two live links of cost 10.
    fn relay_with_two_links() -> RoutingTable {
        let mut r = RoutingTable::relay(t(0));
        r.handle_link_cost(t(0), N1, Metric(10));
        r.handle_link_cost(t(0), N2, Metric(10));
        drain(&mut r);
        r
    }

    #[test]
    fn a_route_is_selected_advertised_and_sets_the_feasibility_distance() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        let sel = r.route(&D).unwrap();
        assert_eq!(
            sel,
            SelectedRoute {
                next_hop: N1,
                metric: Metric(20),
                seqno: Seqno(1)
            }
        );
        assert_eq!(r.feasibility_distance(&D), Some((Seqno(1), Metric(20))));
        let out = drain(&mut r);
        assert_eq!(updates_to(&out, N1), vec![upd(D, 1, 20)], "triggered");
        assert_eq!(updates_to(&out, N2), vec![upd(D, 1, 20)]);
    }

    #[test]
    fn an_equal_metric_detour_is_unfeasible_until_the_origin_issues_a_newer_seqno() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        // N2's route is as long as ours: feasible would allow a loop through us.
        r.handle_update(t(1), N2, [upd(D, 1, 20)]);
        assert_eq!(r.next_hop(&D), Some(N1));
        drain(&mut r);
        // N1's link dies: lost, retraction and a request for seqno 2 to the live neighbour.
        r.handle_link_cost(t(2), N1, Metric::INFINITY);
        assert_eq!(r.next_hop(&D), None);
        let out = drain(&mut r);
        assert_eq!(updates_to(&out, N2), vec![upd(D, 1, u16::MAX)]);
        let req = requests_to(&out, N2);
        assert_eq!(
            req,
            vec![RequestEntry {
                destination: D,
                seqno: Seqno(2),
                hops: HOP_LIMIT
            }]
        );
        assert!(requests_to(&out, N1).is_empty(), "not on a dead link");
        // Resent every 200 ms, 5 times in all.
        let mut sent = 1;
        for ms in (202..3000).step_by(1) {
            if r.poll_timeout() <= t(ms) {
                r.handle_timeout(t(ms));
                sent += requests_to(&drain(&mut r), N2).len();
            }
        }
        assert_eq!(sent, usize::from(REQUEST_TRIES));
        // The newer seqno arrives through N2: feasible, selected.
        r.handle_update(t(3000), N2, [upd(D, 2, 20)]);
        assert_eq!(r.next_hop(&D), Some(N2));
        assert_eq!(r.feasibility_distance(&D), Some((Seqno(2), Metric(30))));
    }

    #[test]
    fn a_shorter_detour_is_feasible_at_once() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        r.handle_update(t(1), N2, [upd(D, 1, 15)]);
        assert_eq!(r.next_hop(&D), Some(N1), "20 vs 25");
        drain(&mut r);
        r.handle_link_cost(t(2), N1, Metric::INFINITY);
        assert_eq!(r.next_hop(&D), Some(N2));
        let out = drain(&mut r);
        assert!(requests_to(&out, N2).is_empty());
        assert_eq!(updates_to(&out, N2), vec![upd(D, 1, 25)]);
    }

    #[test]
    fn an_unfeasible_update_on_the_selected_route_is_ignored_and_asks_for_a_seqno() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        drain(&mut r);
        r.handle_update(t(2), N1, [upd(D, 1, 25)]);
        let sel = r.route(&D).unwrap();
        assert_eq!((sel.next_hop, sel.metric), (N1, Metric(20)), "kept");
        assert_eq!(r.stats().unfeasible_ignored, 1);
        let out = drain(&mut r);
        assert_eq!(requests_to(&out, N1).len(), 1);
        assert_eq!(requests_to(&out, N1)[0].seqno, Seqno(2));
        // A smaller metric with the same seqno is feasible and taken.
        r.handle_update(t(3), N1, [upd(D, 1, 5)]);
        assert_eq!(r.route(&D).unwrap().metric, Metric(15));
        // A retraction is always accepted.
        r.handle_update(t(4), N1, [upd(D, 1, u16::MAX)]);
        assert_eq!(r.next_hop(&D), None);
    }

    #[test]
    fn the_current_route_stays_unless_another_is_more_than_an_eighth_cheaper() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 70)]); // 80 via N1
        r.handle_update(t(1), N2, [upd(D, 2, 62)]); // 72 via N2: 10 % cheaper
        assert_eq!(r.next_hop(&D), Some(N1));
        r.handle_update(t(2), N2, [upd(D, 2, 59)]); // 69: more than 1/8 cheaper
        assert_eq!(r.next_hop(&D), Some(N2));
        assert_eq!(r.stats().route_changes, 2);
    }

    #[test]
    fn link_cost_changes_move_routes() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        r.handle_update(t(1), N2, [upd(D, 1, 10)]);
        assert_eq!(r.next_hop(&D), Some(N1), "first come, equal metric");
        r.handle_link_cost(t(2), N1, Metric(10 + 4096));
        assert_eq!(r.next_hop(&D), Some(N2));
        drain(&mut r);
        r.handle_link_cost(t(3), N1, Metric(1));
        assert_eq!(r.next_hop(&D), Some(N1), "11 vs 20, and 10 < FD 20");
        // A route with an older seqno than the FD's is never feasible again.
        r.handle_update(t(4), N2, [upd(D, 2, 10)]);
        r.handle_link_cost(t(5), N1, Metric(1000));
        assert_eq!(r.next_hop(&D), Some(N2));
        r.handle_link_cost(t(6), N1, Metric(1));
        assert_eq!(
            r.next_hop(&D),
            Some(N2),
            "N1's seqno 1 is older than the FD's 2"
        );
    }

    #[test]
    fn seqno_requests_are_answered_forwarded_or_dropped() {
        // Origin: jumps to the requested seqno and advertises it.
        let mut e = RoutingTable::edge(t(0), D);
        e.handle_link_cost(t(0), N1, Metric(10));
        let out = drain(&mut e);
        assert_eq!(
            updates_to(&out, N1),
            vec![upd(D, 0, 0)],
            "full update on link up"
        );
        let req = |s: u16, hops: u8| RequestEntry {
            destination: D,
            seqno: Seqno(s),
            hops,
        };
        e.handle_request(t(1), N1, [req(9, 3)]);
        assert_eq!(e.own_seqno(), Seqno(9));
        assert_eq!(updates_to(&drain(&mut e), N1), vec![upd(D, 9, 0)]);
        e.handle_request(t(2), N1, [req(4, 3)]);
        assert_eq!(e.own_seqno(), Seqno(9), "never backwards");
        assert_eq!(e.stats().seqno_jumps, 1);

        // Relay: route via N1 with seqno 3.
        let mut r = relay_with_two_links();
        r.handle_link_cost(t(0), N3, Metric(10));
        r.handle_update(t(1), N1, [upd(D, 3, 10)]);
        drain(&mut r);
        // Satisfied by what it has: answers with an update to all.
        r.handle_request(t(2), N2, [req(3, 16)]);
        let out = drain(&mut r);
        assert_eq!(updates_to(&out, N2), vec![upd(D, 3, 20)]);
        assert!(requests_to(&out, N1).is_empty());
        // Newer than what it has: forwarded to the next hop, hops - 1, once per 150 ms.
        r.handle_request(t(3), N2, [req(4, 16)]);
        r.handle_request(t(4), N3, [req(4, 16)]);
        let out = drain(&mut r);
        assert_eq!(requests_to(&out, N1), vec![req(4, 15)]);
        r.handle_request(t(200), N2, [req(4, 16)]);
        assert_eq!(
            requests_to(&drain(&mut r), N1),
            vec![req(4, 15)],
            "a resend"
        );
        // Not back to the requester, not with hops 1.
        r.handle_request(t(400), N1, [req(4, 16)]);
        r.handle_request(t(600), N2, [req(4, 1)]);
        assert!(drain(&mut r).is_empty());
        assert_eq!(r.stats().requests_forwarded, 2);
        // Nothing for an unknown destination.
        r.handle_request(
            t(800),
            N2,
            [RequestEntry {
                destination: E,
                ..req(1, 16)
            }],
        );
        assert!(drain(&mut r).is_empty());
    }

    #[test]
    fn forwarding_decisions() {
        let hdr = |dest: NodeId, hops: u8| RelayRepr {
            kind: Kind::Data,
            hops,
            payload_len: 32,
            destination: dest,
        };
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N2, [upd(D, 1, 10)]);
        assert_eq!(
            r.forward(&hdr(D, 16), false),
            Forward::Send { to: N2, hops: 15 }
        );
        assert_eq!(
            r.forward(&hdr(D, 1), false),
            Forward::Drop(ForwardDrop::HopLimit)
        );
        assert_eq!(
            r.forward(&hdr(E, 16), false),
            Forward::Drop(ForwardDrop::NoRoute)
        );
        let probe = RelayRepr::link_local(Kind::Probe, 8);
        assert_eq!(
            r.forward(&probe, false),
            Forward::Drop(ForwardDrop::LinkLocal)
        );

        let mut e = RoutingTable::edge(t(0), E);
        e.handle_link_cost(t(0), N1, Metric(10));
        e.handle_update(t(1), N1, [upd(D, 1, 10)]);
        assert_eq!(e.forward(&hdr(E, 3), false), Forward::Deliver);
        assert_eq!(
            e.forward(&hdr(D, 16), false),
            Forward::Drop(ForwardDrop::NotTransit)
        );
        assert_eq!(
            e.forward(&hdr(D, 16), true),
            Forward::Send { to: N1, hops: 16 },
            "originated: not decremented"
        );
        for d in [
            ForwardDrop::LinkLocal,
            ForwardDrop::NotTransit,
            ForwardDrop::HopLimit,
            ForwardDrop::NoRoute,
        ] {
            assert!(d.reason().starts_with("relay_"));
        }
    }

    #[test]
    fn an_edge_advertises_only_itself_and_never_forwards_requests() {
        let mut e = RoutingTable::edge(t(0), E);
        e.handle_link_cost(t(0), N1, Metric(10));
        e.handle_link_cost(t(0), N2, Metric(10));
        e.handle_update(t(1), N1, [upd(D, 1, 10)]);
        let out = drain(&mut e);
        for n in [N1, N2] {
            assert!(updates_to(&out, n).iter().all(|u| u.destination == E));
        }
        e.handle_request(
            t(2),
            N2,
            [RequestEntry {
                destination: D,
                seqno: Seqno(5),
                hops: 16,
            }],
        );
        assert!(drain(&mut e).is_empty());
        e.handle_timeout(t(5000));
        let out = drain(&mut e);
        assert_eq!(updates_to(&out, N1), vec![upd(E, 0, 0)]);
        assert_eq!(updates_to(&out, N2), vec![upd(E, 0, 0)]);
    }

    #[test]
    fn periodic_full_updates_and_expiry() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        drain(&mut r);
        assert_eq!(r.poll_timeout(), t(5000), "periodic");
        r.handle_timeout(t(5000));
        let out = drain(&mut r);
        assert_eq!(updates_to(&out, N1), vec![upd(D, 1, 20)]);
        assert_eq!(updates_to(&out, N2), vec![upd(D, 1, 20)]);
        // Not refreshed: expires 17.5 s after the update, then a retraction.
        r.handle_timeout(t(17_500));
        assert!(r.next_hop(&D).is_some());
        r.handle_timeout(t(17_501));
        assert_eq!(r.next_hop(&D), None);
        let out = drain(&mut r);
        assert!(updates_to(&out, N2).contains(&upd(D, 1, u16::MAX)));
        // Forgotten, FD and all, 180 s after its last route.
        r.handle_timeout(t(17_501 + 170_000));
        assert!(r.feasibility_distance(&D).is_some());
        r.handle_timeout(t(17_501 + 180_000));
        assert_eq!(r.feasibility_distance(&D), None);
    }

    #[test]
    fn routes_over_a_dead_link_wait_for_it_and_a_returning_link_gets_a_full_update() {
        let mut r = relay_with_two_links();
        r.handle_update(t(1), N1, [upd(D, 1, 10)]);
        r.handle_link_cost(t(2), N2, Metric::INFINITY);
        // The other end saw the link up first and sent its table: kept, not used.
        r.handle_update(t(3), N2, [upd(E, 1, 10)]);
        assert_eq!(r.next_hop(&E), None);
        drain(&mut r);
        r.handle_link_cost(t(4), N2, Metric(4106));
        assert_eq!(r.next_hop(&E), Some(N2), "usable once the link is");
        let out = drain(&mut r);
        let full = updates_to(&out, N2);
        assert!(full.contains(&upd(D, 1, 20)) && full.contains(&upd(E, 1, 4116)));
        // A link that dies takes its routes with it.
        r.handle_link_cost(t(5), N2, Metric::INFINITY);
        r.handle_link_cost(t(6), N2, Metric(10));
        assert_eq!(r.next_hop(&E), None);
    }

    #[test]
    fn a_link_that_comes_up_asks_for_a_full_update_and_a_wildcard_request_gets_one() {
        // A restarted relay: its links come up, each asks the neighbour for its table.
        let mut fresh = RoutingTable::relay(t(0));
        fresh.handle_link_cost(t(0), N1, Metric(10));
        let out = drain(&mut fresh);
        assert_eq!(requests_to(&out, N1), [RequestEntry::wildcard()]);
        // Its neighbour saw the link up all along (the restart was faster than a death): it
        // answers the wildcard with its full table, not at its next periodic update.
        let mut old = relay_with_two_links();
        old.handle_update(t(1), N2, [upd(D, 3, 10)]);
        drain(&mut old);
        old.handle_request(t(2), N1, [RequestEntry::wildcard()]);
        let out = drain(&mut old);
        assert_eq!(updates_to(&out, N1), [upd(D, 3, 20)]);
        assert!(updates_to(&out, N2).is_empty(), "only the asker gets it");
        fresh.handle_update(t(2), N1, updates_to(&out, N1));
        assert_eq!(fresh.next_hop(&D), Some(N1));
        // A wildcard over a link this end sees down is answered when the link comes up.
        old.handle_link_cost(t(3), N1, Metric::INFINITY);
        drain(&mut old);
        old.handle_request(t(4), N1, [RequestEntry::wildcard()]);
        assert!(updates_to(&drain(&mut old), N1).is_empty());
    }

    #[test]
    fn large_tables_are_split_into_messages_of_at_most_96_entries() {
        let mut r = relay_with_two_links();
        let many: Vec<UpdateEntry> = (1..=200u16)
            .map(|i| {
                let mut id = [0u8; 8];
                id[6..].copy_from_slice(&i.to_be_bytes());
                upd(NodeId::from_bytes(id), 1, 10)
            })
            .collect();
        r.handle_update(t(1), N1, many);
        let out = drain(&mut r);
        let to_n2: Vec<usize> = out
            .iter()
            .filter(|x| x.to == N2)
            .map(|x| match &x.message {
                RoutingRepr::Update(v) => v.len(),
                RoutingRepr::Request(v) => v.len(),
            })
            .collect();
        assert_eq!(to_n2, vec![96, 96, 8]);
    }
}
