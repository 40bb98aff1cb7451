//! Rotation: at every epoch boundary, make the kernel hold exactly the hashed addresses and
//! sockets of the accept window, then publish the new [`RouteTable`].
//!
//! Order matters for zero loss (001 §4.1 lists DAD and strict switch-over as the first causes of
//! loss at rotation): addresses of the *next* epoch are already in the accept window, so they are
//! bound (with `nodad`, usable at once) one whole interval before the peer starts sending to
//! them; new sockets exist before the table that names them is published; old addresses are
//! removed only after the table that no longer names them is live. A newly bound address is
//! probed for a duplicate on the link ([`super::collision`]); a collision moves the epoch and
//! calls [`Rotator::step`] again, which binds the moved addresses the same way. The on-link
//! next hop learns a new address only shortly before its epoch starts
//! ([`crate::daemon::neighbor`], docs/PROTOCOL.md §5.1): the first packet to it is then not held up by
//! neighbour discovery (001 §4.2), and nothing names it on the wire any earlier.
//!
//! Every per-rotation message (priming solicitation, duplicate address probe, link-layer
//! announcement) leaves at its own instant, drawn from the window its purpose allows
//! (`mt6d_proto::control_plan`, docs/PROTOCOL.md §5.6): never as a burst in configuration
//! order, never at a fixed offset from the boundary.

use std::collections::{BTreeMap, HashSet};
use std::net::Ipv6Addr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use mt6d_os::{AddrFlags, Netlink, UdpSocket6};
use mt6d_proto::control_plan::{announcement_window, priming_window, ControlPlan, SendWindow};
use mt6d_proto::moves::CollisionOutcome;
use mt6d_proto::{Epoch, Route, UnixTime};
use rand::{RngCore, SeedableRng};

use super::collision::{Collision, CollisionWatch};
use super::error::GatewayError;
use super::path::PathState;
use super::peer::Peer;
use super::polls::Polls;
use super::routing::{carry_over, RouteTable};
use super::shared::Shared;
use crate::daemon::neighbor::NeighborPrimer;

/// How far back start-up looks for hashed addresses a crashed run may have left behind.
const STALE_WINDOW_SECS: u64 = 24 * 3600;

#[derive(Debug)]
pub struct Rotator {
    external_index: u32,
    /// The peer set every step publishes, and its generation (see `routing.rs`).
    peers: Vec<Arc<Peer>>,
    generation: u64,
    bound: HashSet<Ipv6Addr>,
    sockets: BTreeMap<u16, Arc<UdpSocket6>>,
    /// The worker whose epoll watches each socket (`Polls`).
    owners: BTreeMap<u16, usize>,
    /// The send epoch each peer was last seen in, in the order of `peers`.
    epochs: Vec<(Arc<Peer>, Option<Epoch>)>,
    next_change: UnixTime,
    primer: Option<(NeighborPrimer, Arc<PathState>)>,
    /// (our address, next hop) pairs whose announcement is sent or scheduled, of the published
    /// table's accept windows only.
    primed: HashSet<(Ipv6Addr, Ipv6Addr)>,
    /// Priming solicitations not yet due, each at its own drawn instant: (from our address, to
    /// the next hop).
    pending: ControlPlan<(Ipv6Addr, Ipv6Addr)>,
    /// Link-layer address announcements not yet due, by the send route they travel on, and the
    /// send routes already announced on (of the published table): one per route.
    announce: ControlPlan<Route>,
    announced: HashSet<Route>,
    /// Draws the instants of the control messages (docs/PROTOCOL.md §5.6): a CSPRNG seeded
    /// from the OS, so that no observer can predict them.
    rng: rand::rngs::StdRng,
    /// One segment: peer addresses announced to while no address of the peer had a MAC in our
    /// kernel ([`resolve_from_peer`]); given one as soon as another of the peer's addresses has it.
    unresolved: HashSet<Ipv6Addr>,
    /// The peers' hashed addresses of the accept window (one segment: our kernel's neighbour
    /// entries for them are removed when they leave it).
    remotes: HashSet<Ipv6Addr>,
    watch: Option<CollisionWatch>,
    /// Our external MAC when the peers are on our segment: announced to them, and their
    /// announced MACs pinned for their hashed addresses (docs/PROTOCOL.md §5.2).
    pin_with: Option<[u8; 6]>,
    pinned: BTreeMap<Ipv6Addr, [u8; 6]>,
    /// Ports and addresses that could not be bound and had no move left, by name: each is
    /// logged once until it can be bound again.
    unbindable: HashSet<String>,
    /// Within one step: what could not be bound and has no move left.
    skip: HashSet<Local>,
    /// Peers (indexes of the published table) whose routes changed since it was published.
    changed: Vec<usize>,
}

/// A local port or hashed address the accept window needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Local {
    Port(u16),
    Addr(Ipv6Addr),
}

/// Why [`Rotator::bind`] stopped.
enum Unbindable {
    /// This port or address cannot be had (another process holds the port, the kernel refuses
    /// the address): a move may cure it.
    Taken {
        what: String,
        local: Local,
        error: String,
    },
    /// Nothing a move can cure.
    Fatal(GatewayError),
}

/// Moves every epoch of the accept window whose local route uses `local` to its next attempt
/// offset, as an address collision does (docs/PROTOCOL.md §5.2); true if one moved.
fn move_away(table: &RouteTable, local: Local, what: &str, error: &str, now: UnixTime) -> bool {
    let mut moved = false;
    for routes in &table.peers {
        let p = &routes.peer;
        for (set, route) in routes
            .sets
            .iter()
            .flat_map(|s| s.schedule.accept.iter().map(move |r| (s, r)))
        {
            let uses = match local {
                Local::Port(port) => route.local.port() == port,
                Local::Addr(addr) => *route.local.ip() == addr,
            };
            if !uses {
                continue;
            }
            let current = p.stream.epoch_at(now);
            let mut moves = set.set.lock_moves();
            if let CollisionOutcome::Moved(k) = moves.move_locally(now, current, route.epoch) {
                moved = true;
                // Once per move: at most MAX_OFFSET per epoch.
                log::warn!(
                    "peer {}: {what} of epoch {} cannot be bound ({error}); both gateways move that epoch to attempt offset {k}",
                    p.name,
                    route.epoch.0
                );
            }
        }
    }
    moved
}

/// One segment: gives our kernel a neighbour entry for each of the peer's addresses in
/// `unresolved` (the epoch about to start, announced now), with the MAC its entry for another of
/// the peer's addresses in the accept window holds, unless it has one. The announcement to it
/// then leaves unicast at once, without a multicast solicitation first: a switch that drops
/// multicast for groups nobody reported (MLD reports never leave, docs/PROTOCOL.md §5.4) would
/// drop that one. The peer's own announcement (its MAC in the link-layer option) corrects the
/// entry if the peer's MAC changed (a restart with `randomize_link`); the solicited
/// advertisement answering ours confirms it.
///
/// What no MAC could be found for stays in `unresolved`, and [`Rotator::prime_due`] calls this
/// again every tick: when no address of the peer had a MAC yet (the peer was not up when we
/// primed, at start-up or after its restart), our kernel's own solicitation went unanswered and
/// its next try comes only after the interface's retransmit time (1 s); packets to the address
/// would wait for it. An entry added over the unresolved one releases what waits in it at once.
/// Addresses that left the accept window, or resolved by themselves, are dropped from the set.
/// One neighbour table dump per call, and none while the set is empty.
fn resolve_from_peer(
    nl: &mut Netlink,
    index: u32,
    remotes: &HashSet<Ipv6Addr>,
    unresolved: &mut HashSet<Ipv6Addr>,
) {
    if unresolved.is_empty() {
        return;
    }
    let entries = match nl.list_neighbors(index) {
        Ok(e) => e,
        Err(e) => {
            log::debug!("neighbour table of the external interface: {e}");
            return;
        }
    };
    let usable = |addr: Ipv6Addr| {
        entries
            .iter()
            .find(|e| e.addr == addr)
            .and_then(mt6d_os::NeighInfo::usable_lladdr)
    };
    unresolved.retain(|&t| remotes.contains(&t) && usable(t).is_none());
    let Some(mac) = remotes
        .iter()
        .filter(|a| !unresolved.contains(a))
        .find_map(|&a| usable(a))
    else {
        return;
    };
    unresolved.retain(|&target| match nl.add_neighbor(index, target, mac, false) {
        Ok(()) => false,
        Err(e) => {
            log::debug!("neighbour entry for {target}: {e}");
            true
        }
    });
}

/// How soon the priming of an address already in use (the current epoch's, at start or after
/// a move) leaves: drawn within this many nanoseconds from now (two main-loop ticks), so that
/// even the start-up solicitations leave in a random order.
const AT_ONCE_NS: u64 = 40_000_000;

/// Within what window each route of the accept window is to be primed (docs/PROTOCOL.md §5.1,
/// §5.6): the current epoch's at once, the next epoch's in [`priming_window`] before its
/// boundary (never before `now`), the previous epoch's never.
fn announcements(
    schedule: &mt6d_proto::Schedule,
    now: UnixTime,
) -> impl Iterator<Item = (SendWindow, &mt6d_proto::Route)> {
    let current = schedule.send.epoch;
    let next = priming_window(schedule.next_change).not_before(now);
    let at_once = SendWindow::new(now, UnixTime::from_nanos(now.as_nanos() + AT_ONCE_NS));
    schedule
        .accept
        .iter()
        .filter(move |r| r.epoch >= current)
        .map(move |r| (if r.epoch > current { next } else { at_once }, r))
}

/// Brings the announcements to what the published table wants (`wanted`: when, from our
/// address, to the next hop): a pair not announced yet is scheduled; a pending one the table no
/// longer wants is dropped, and a pair it no longer wants is forgotten. Keyed by the pair, not
/// by our address alone: when the peer's address of an epoch moves (a collision on its side,
/// docs/PROTOCOL.md §5.2) and ours does not, the peer's new address is primed, and no
/// solicitation (nor, on one segment, neighbour entry) is made for the address it left.
fn plan_priming(
    primed: &mut HashSet<(Ipv6Addr, Ipv6Addr)>,
    pending: &mut ControlPlan<(Ipv6Addr, Ipv6Addr)>,
    wanted: impl Iterator<Item = (SendWindow, Ipv6Addr, Ipv6Addr)>,
    random: &mut impl FnMut() -> u64,
) {
    let mut keep = HashSet::new();
    for (window, from, target) in wanted {
        keep.insert((from, target));
        if primed.insert((from, target)) {
            pending.schedule(window, (from, target), random);
        }
    }
    primed.retain(|pair| keep.contains(pair));
    pending.retain(|pair| keep.contains(pair));
}

/// Plans one link-layer address announcement on each send route of `sends` (the route and
/// the end of its epoch) not announced on yet, at an instant drawn from the first three
/// quarters of what is left of its epoch (docs/PROTOCOL.md §5.6); `first` (nothing announced
/// yet: start-up) draws within [`AT_ONCE_NS`] instead, since a peer that just restarted needs
/// our MAC before it can pin anything. Routes no longer sent on are forgotten, and their
/// waiting announcements dropped: a route moved away from a collision is announced on the
/// route it moved to.
fn plan_announcements(
    announced: &mut HashSet<Route>,
    plan: &mut ControlPlan<Route>,
    sends: &[(Route, UnixTime)],
    now: UnixTime,
    random: &mut impl FnMut() -> u64,
) {
    let first = announced.is_empty();
    for &(route, end) in sends {
        if announced.insert(route) {
            let window = if first {
                SendWindow::new(now, UnixTime::from_nanos(now.as_nanos() + AT_ONCE_NS))
            } else {
                announcement_window(now, end)
            };
            plan.schedule(window, route, random);
        }
    }
    announced.retain(|r| sends.iter().any(|s| s.0 == *r));
    plan.retain(|r| announced.contains(r));
}

impl Rotator {
    pub fn new(external_index: u32, peers: Vec<Arc<Peer>>) -> Rotator {
        Rotator {
            external_index,
            peers,
            // Never 0, the generation of the empty table published before the first step.
            generation: 1,
            bound: HashSet::new(),
            sockets: BTreeMap::new(),
            owners: BTreeMap::new(),
            epochs: Vec::new(),
            next_change: UnixTime::from_nanos(0),
            primer: None,
            primed: HashSet::new(),
            pending: ControlPlan::default(),
            announce: ControlPlan::default(),
            announced: HashSet::new(),
            rng: rand::rngs::StdRng::from_os_rng(),
            unresolved: HashSet::new(),
            remotes: HashSet::new(),
            watch: None,
            pin_with: None,
            pinned: BTreeMap::new(),
            unbindable: HashSet::new(),
            skip: HashSet::new(),
            changed: Vec::new(),
        }
    }

    /// Probes every newly bound address for a duplicate on the link and watches for collisions.
    pub fn set_watch(&mut self, watch: CollisionWatch) {
        self.watch = Some(watch);
    }

    /// Sends the duplicate address probes that are due and returns the confirmed collisions on
    /// bound hashed addresses seen since the last call.
    pub fn poll_collisions(&mut self, now: UnixTime) -> Vec<Collision> {
        let bound = &self.bound;
        self.watch
            .as_mut()
            .map_or_else(Vec::new, |w| w.poll(now, |a| bound.contains(&a)))
    }

    /// The collision watch's next probe (a deadline of the main thread's wait).
    pub fn next_watch_due(&self) -> Option<UnixTime> {
        self.watch.as_ref().and_then(CollisionWatch::next_due)
    }

    /// The collision watch's capture, for the main thread's wait set (None: no watch).
    pub fn watch_fd(&self) -> Option<std::os::fd::RawFd> {
        self.watch.as_ref().map(CollisionWatch::capture_fd)
    }

    /// Logs what the collision watch saw since the last call (once per rotation).
    pub fn report_watch(&mut self) {
        if let Some(w) = &mut self.watch {
            super::collision::log_summary(&w.take_summary());
        }
    }

    /// (active, probes sent, malformed frames) of the collision watch.
    pub fn watch_status(&self) -> crate::status::CollisionWatchStatus {
        self.watch
            .as_ref()
            .map_or_else(Default::default, |w| crate::status::CollisionWatchStatus {
                active: true,
                probes: w.probes,
                malformed: w.malformed,
                claims: w.claims,
                confirmation_probes: w.confirmation_probes,
                confirmed: w.confirmed,
            })
    }

    /// On one segment: announce `mac` to the peers and pin theirs.
    pub fn set_pinning(&mut self, mac: [u8; 6]) {
        self.pin_with = Some(mac);
    }

    /// Makes every newly bound address known to the on-link next hop; counted in `path`.
    pub fn set_primer(&mut self, primer: NeighborPrimer, path: Arc<PathState>) {
        self.primer = Some((primer, path));
    }

    /// The peer set the next step publishes.
    pub fn peers(&self) -> &[Arc<Peer>] {
        &self.peers
    }

    /// Replaces the peer set; the next [`Rotator::step`] binds what the new set needs,
    /// publishes it as a new generation, and only then removes what only the old set used
    /// (hashed addresses, sockets, pinned and learned neighbour entries). Peers kept from the
    /// old set must be the same `Arc`s: their state is carried over by identity.
    pub fn set_peers(&mut self, peers: Vec<Arc<Peer>>) {
        self.peers = peers;
        self.generation += 1;
    }

    /// Makes the next [`Rotator::step`] derive peer `index`'s routes again (of the published
    /// table's generation): its route sets or moves changed outside an epoch boundary.
    pub fn routes_changed(&mut self, index: usize) {
        if !self.changed.contains(&index) {
            self.changed.push(index);
        }
    }

    /// When the next step is due.
    pub fn next_change(&self) -> UnixTime {
        self.next_change
    }

    /// Removes hashed addresses of our peers from the last day that are still on the external
    /// interface: what a daemon killed with SIGKILL (or a power cut) leaves. Together with the
    /// idempotent adds this makes a restart converge.
    pub fn purge_stale(&mut self, nl: &mut Netlink, now: UnixTime) {
        let peers = &self.peers;
        let present: HashSet<Ipv6Addr> = match nl.list_addresses(self.external_index) {
            Ok(list) => list
                .into_iter()
                .filter(|a| a.prefix_len == 128)
                .map(|a| a.addr)
                .collect(),
            Err(e) => {
                log::warn!("cannot list addresses for stale clean-up: {e}");
                return;
            }
        };
        if present.is_empty() {
            return;
        }
        let mut removed = 0;
        for p in peers {
            let rotation_ms = p.stream.config().rotation.as_millis().max(1) as u64;
            let current = p.stream.epoch_at(now).0;
            let back = STALE_WINDOW_SECS * 1000 / rotation_ms;
            for e in current.saturating_sub(back)..=current + 2 {
                // Moved routes (address collisions) exist only near the time of the crash; look
                // for them in the last few epochs only.
                let offsets = if e + 4 >= current {
                    mt6d_proto::moves::MAX_OFFSET
                } else {
                    0
                };
                for k in 0..=offsets {
                    let addr = *p.stream.route_with_attempt(Epoch(e), k).local.ip();
                    if present.contains(&addr)
                        && nl.del_address(self.external_index, addr, 128).is_ok()
                    {
                        removed += 1;
                    }
                }
            }
        }
        if removed > 0 {
            log::info!("removed {removed} hashed address(es) left by an earlier run");
        }
    }

    /// Brings addresses, sockets and the published table to the accept window at `now`.
    ///
    /// A hashed port another process holds, or a hashed address the kernel refuses, never stalls
    /// rotation (docs/PROTOCOL.md §5.2, "Ports and addresses that cannot be bound"): the epoch
    /// that needs it moves to its next attempt offset, exactly as after an address collision,
    /// so both gateways leave it (the peer learns it from the route move notice), and the table
    /// is computed again. What still cannot be bound (a fixed port, an epoch moved
    /// [`mt6d_proto::moves::MAX_OFFSET`] times) is logged once and left out: the table is
    /// published on time regardless. Only an error that no move can cure (the external
    /// interface is gone) is returned.
    pub fn step(
        &mut self,
        nl: &mut Netlink,
        polls: &Polls,
        shared: &Shared,
        now: UnixTime,
    ) -> Result<(), GatewayError> {
        let table = RouteTable::advance(
            &shared.table.load(),
            &self.peers,
            self.generation,
            now,
            &self.changed,
        );
        let (mut table, mut fresh) = self.bind_all(nl, polls, table, now)?;
        let needed_ports: HashSet<u16> = table.local_ports().collect();
        table.sockets = self
            .sockets
            .iter()
            .filter(|(p, _)| needed_ports.contains(p))
            .map(|(p, s)| (*p, s.clone()))
            .collect();
        let needed: HashSet<Ipv6Addr> = table.local_addresses().collect();
        // Bound in a round whose table then moved: removed below with the other stale ones.
        fresh.retain(|a| needed.contains(a));
        self.plan_control(&table, &fresh, now);
        self.next_change = table
            .peers
            .iter()
            .map(|p| p.next_change())
            .min()
            .unwrap_or(UnixTime::from_nanos(now.as_nanos() + 1_000_000_000));
        self.count_rotations(&table);
        let pins = self.pin_neighbours(nl, &table);
        shared.table.store(Arc::new(table));
        self.changed.clear();
        self.unpin_others(nl, &pins);
        self.remove_stale(nl, polls, shared, (&needed, &needed_ports));
        Ok(())
    }

    /// Binds what `table` needs, moving a route away from an address or port it cannot have
    /// (and recomputing the table) or giving up on it. Returns the table to publish and the
    /// addresses bound in this step.
    fn bind_all(
        &mut self,
        nl: &mut Netlink,
        polls: &Polls,
        mut table: RouteTable,
        now: UnixTime,
    ) -> Result<(RouteTable, Vec<Ipv6Addr>), GatewayError> {
        let mut fresh = Vec::new();
        // Each round either binds everything, moves one epoch of a route set's window (at most
        // MAX_OFFSET times for each of its 4 epochs) or gives up on one of its 6 local ports and
        // addresses; so this many rounds always suffice.
        let per_set = usize::from(mt6d_proto::moves::MAX_OFFSET) * 4 + 6;
        let sets: usize = table.peers.iter().map(|p| p.sets.len()).sum();
        let rounds = per_set * sets + 1;
        for _ in 0..rounds {
            match self.bind(nl, polls, &table, &mut fresh) {
                Ok(()) => break,
                Err(Unbindable::Fatal(e)) => return Err(e),
                Err(Unbindable::Taken { what, local, error }) => {
                    if move_away(&table, local, &what, &error, now) {
                        table = RouteTable::compute(&self.peers, self.generation, now);
                    } else {
                        if self.unbindable.insert(what.clone()) {
                            log::error!(
                                "{what}: {error}; no move left for it, its routes are not served"
                            );
                        }
                        self.skip.insert(local);
                    }
                }
            }
        }
        self.skip.clear();
        Ok((table, fresh))
    }

    /// The control messages of the new table, each at its own drawn instant: priming
    /// solicitations, link-layer announcements (one segment) and the collision watch's probes of
    /// the addresses bound in this step.
    fn plan_control(&mut self, table: &RouteTable, fresh: &[Ipv6Addr], now: UnixTime) {
        self.schedule_priming(table, now);
        if self.pin_with.is_some() {
            let sends: Vec<(Route, UnixTime)> = table
                .peers
                .iter()
                .map(|r| {
                    let s = &r.send_set().schedule;
                    (s.send, s.next_change)
                })
                .collect();
            let rng = &mut self.rng;
            plan_announcements(
                &mut self.announced,
                &mut self.announce,
                &sends,
                now,
                &mut || rng.next_u64(),
            );
        }
        if let Some(watch) = &mut self.watch {
            // Each new address is probed shortly before its epoch starts, not when bound, at
            // its own drawn instant (docs/PROTOCOL.md §5.2, "Probe timing"; §5.6).
            for routes in &table.peers {
                let peer = &routes.peer;
                let rotation_ms = peer.stream.config().rotation.as_millis() as u64;
                for route in routes.accept() {
                    let addr = *route.local.ip();
                    if fresh.contains(&addr) {
                        let start = peer.stream.epoch_start(route.epoch);
                        let window = super::collision::probe_window(start, rotation_ms);
                        watch.probe_at(
                            addr,
                            window.not_before(now).draw(&mut || self.rng.next_u64()),
                        );
                    }
                }
            }
        }
    }

    /// Counts each peer's epoch changes (its send route's epoch moved) and logs them at debug.
    fn count_rotations(&mut self, table: &RouteTable) {
        if self.epochs.len() != table.peers.len()
            || self
                .epochs
                .iter()
                .zip(&table.peers)
                .any(|((p, _), r)| !Arc::ptr_eq(p, &r.peer))
        {
            self.epochs = carry_over(std::mem::take(&mut self.epochs), table, |_| None);
        }
        for ((_, seen), routes) in self.epochs.iter_mut().zip(&table.peers) {
            let peer = &routes.peer;
            let e = routes.send().epoch;
            if *seen != Some(e) {
                if seen.is_some() {
                    peer.counters
                        .rotations
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                *seen = Some(e);
                let set = &routes.send_set().set;
                log::debug!(
                    "peer {}: epoch {} sending on {} set {} {} -> {}",
                    peer.name,
                    e.0,
                    if set.is_link() { "link" } else { "session" },
                    set.id,
                    routes.send().local,
                    routes.send().remote
                );
            }
        }
    }

    /// Pins the peers' hashed addresses of the window to their announced MACs before the table
    /// that sends to them is live; returns what is pinned now.
    fn pin_neighbours(
        &mut self,
        nl: &mut Netlink,
        table: &RouteTable,
    ) -> BTreeMap<Ipv6Addr, [u8; 6]> {
        // Pin the peers' hashed addresses of the window to their announced MACs before the
        // table that sends to them is live: a permanent entry ignores every advertisement
        // (RFC 4861 §7.2.5 updates apply to dynamic entries only; Linux: NUD_PERMANENT).
        let mut pins = BTreeMap::new();
        if self.pin_with.is_some() {
            for routes in &table.peers {
                if let Some(mac) = routes.peer.lladdr() {
                    for r in routes.accept() {
                        pins.insert(*r.remote.ip(), mac);
                    }
                }
            }
        }
        for (addr, mac) in &pins {
            if self.pinned.get(addr) != Some(mac) {
                match nl.add_neighbor(self.external_index, *addr, *mac, true) {
                    Ok(()) => {
                        self.pinned.insert(*addr, *mac);
                    }
                    Err(e) => log::warn!("pin neighbour {addr}: {e}"),
                }
            }
        }
        pins
    }

    /// Removes the pins of addresses no longer in any peer's window.
    fn unpin_others(&mut self, nl: &mut Netlink, pins: &BTreeMap<Ipv6Addr, [u8; 6]>) {
        let unpinned: Vec<Ipv6Addr> = self
            .pinned
            .keys()
            .filter(|a| !pins.contains_key(a))
            .copied()
            .collect();
        for addr in unpinned {
            if let Err(e) = nl.del_neighbor(self.external_index, addr) {
                log::warn!("unpin neighbour {addr}: {e}");
            }
            self.pinned.remove(&addr);
        }
    }

    /// Removes the hashed addresses and closes the sockets the new table no longer needs.
    fn remove_stale(
        &mut self,
        nl: &mut Netlink,
        polls: &Polls,
        shared: &Shared,
        (needed, needed_ports): (&HashSet<Ipv6Addr>, &HashSet<u16>),
    ) {
        // The old table may still be in a packet thread's hands for one batch; its sockets stay
        // open until that reference is dropped. Addresses go now: a late packet to them is one the
        // accept window already refused.
        let stale: Vec<Ipv6Addr> = self.bound.difference(needed).copied().collect();
        for addr in stale {
            if let Err(e) = nl.del_address(self.external_index, addr, 128) {
                log::warn!("remove hashed address {addr}: {e}");
            }
            // Its announcements went with the table that stopped naming it (`plan_priming`).
            self.bound.remove(&addr);
        }
        self.forget_peer_addresses(nl, &shared.table.load());
        let old_ports: Vec<u16> = self
            .sockets
            .keys()
            .filter(|p| !needed_ports.contains(p))
            .copied()
            .collect();
        for port in old_ports {
            if let Some(s) = self.sockets.remove(&port) {
                let owner = self.owners.remove(&port).unwrap_or(0);
                let _ = polls.get(owner).delete(s.as_raw_fd());
            }
        }
    }

    /// Opens the sockets and binds the addresses `table` needs that are not there yet. Stops at
    /// the first port or address that cannot be had, naming it.
    fn bind(
        &mut self,
        nl: &mut Netlink,
        polls: &Polls,
        table: &RouteTable,
        fresh: &mut Vec<Ipv6Addr>,
    ) -> Result<(), Unbindable> {
        for (port, peer) in port_users(table) {
            if self.sockets.contains_key(&port) || self.skip.contains(&Local::Port(port)) {
                continue;
            }
            let owner = worker_of(table, peer, polls.len());
            let socket = UdpSocket6::bind(port).map_err(|e| Unbindable::Taken {
                what: format!("UDP port {port}"),
                local: Local::Port(port),
                error: e.to_string(),
            })?;
            polls
                .get(owner)
                .add(socket.as_raw_fd(), u64::from(port))
                .map_err(|source| {
                    Unbindable::Fatal(GatewayError::Os {
                        what: format!("watch tunnel port {port}"),
                        source,
                    })
                })?;
            report_small_buffers(&socket);
            self.sockets.insert(port, Arc::new(socket));
            self.owners.insert(port, owner);
            self.unbindable.remove(&format!("UDP port {port}"));
        }
        for addr in table.local_addresses().collect::<Vec<_>>() {
            if self.bound.contains(&addr) || self.skip.contains(&Local::Addr(addr)) {
                continue;
            }
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: true,
            };
            if let Err(e) = nl.add_address(self.external_index, addr, 128, flags) {
                // The interface itself is gone or down: no other address would do better.
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENODEV | libc::ENXIO | libc::ENETDOWN)
                ) {
                    return Err(Unbindable::Fatal(GatewayError::Os {
                        what: format!("bind hashed address {addr}"),
                        source: e,
                    }));
                }
                return Err(Unbindable::Taken {
                    what: format!("hashed address {addr}"),
                    local: Local::Addr(addr),
                    error: e.to_string(),
                });
            }
            fresh.push(addr);
            self.bound.insert(addr);
        }
        Ok(())
    }

    /// Schedules the announcement of each local address of the accept window not yet announced:
    /// the current epoch's at once (it is in use), the next epoch's at an instant drawn from
    /// [`priming_window`] before its boundary; the previous epoch's never (nothing more will be sent to it that needs a new
    /// neighbour entry). The solicitation goes to the router, or on one segment to the peer's
    /// address *of the same epoch*, so no message names two epochs (docs/PROTOCOL.md §5.1).
    fn schedule_priming(&mut self, table: &RouteTable, now: UnixTime) {
        let Some((primer, _)) = &self.primer else {
            return;
        };
        // Only sets that carry data: the link set's idle routes, bound for handshakes alone, are
        // left to ordinary neighbour discovery (one message, one epoch).
        let wanted = table
            .peers
            .iter()
            .flat_map(|r| &r.sets)
            .filter(|s| s.data)
            .flat_map(|set| announcements(&set.schedule, now))
            .map(|(due, route)| (due, *route.local.ip(), primer.target(*route.remote.ip())));
        let rng = &mut self.rng;
        plan_priming(&mut self.primed, &mut self.pending, wanted, &mut || {
            rng.next_u64()
        });
    }

    /// Forgets which hashed addresses are bound, so that the next step binds them all again
    /// (adds are idempotent): after the external interface came back up, its addresses flushed.
    pub fn forget_addresses(&mut self) {
        self.bound.clear();
        self.primed.clear();
        self.pending.clear();
    }

    /// The earliest drawn instant of a priming solicitation or an announcement still to send.
    pub fn next_control_due(&self) -> Option<UnixTime> {
        match (self.pending.next_due(), self.announce.next_due()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Sends the link-layer address announcements that are due (on one segment), each on the
    /// send route it was planned for; called by the main loop every tick.
    pub fn announce_due(&mut self, table: &RouteTable, now: UnixTime) {
        let Some(mac) = self.pin_with else {
            return;
        };
        for route in self.announce.take_due(now) {
            super::collision::announce_link_on(table, &route, mac, now);
        }
    }

    /// Sends the priming solicitations that are due; called by the main loop at every turn
    /// (at most 20 ms apart, and at the earliest one's instant).
    pub fn prime_due(&mut self, nl: &mut Netlink, now: UnixTime) {
        let Some((primer, path)) = &self.primer else {
            return;
        };
        if self.pending.next_due().is_none_or(|t| t > now) {
            if primer.on_link() {
                resolve_from_peer(nl, self.external_index, &self.remotes, &mut self.unresolved);
            }
            return;
        }
        // In their drawn order, not the order they were planned in (docs/PROTOCOL.md §5.6).
        let due = self.pending.take_due(now);
        if primer.on_link() {
            // Entries first: the announcements below then leave unicast.
            self.unresolved.extend(due.iter().map(|p| p.1));
            resolve_from_peer(nl, self.external_index, &self.remotes, &mut self.unresolved);
        }
        for (from, target) in due {
            match primer.solicit(from, target) {
                Ok(()) => {
                    path.solicitations
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                // Once per rotation at most, on the main thread.
                Err(e) => log::debug!("neighbour solicitation from {from} for {target}: {e}"),
            }
        }
    }

    /// One segment: our kernel's neighbour entries for peer addresses that left the accept
    /// window are deleted, so that it never probes them later (a probe would name an old
    /// epoch's address long after its use).
    fn forget_peer_addresses(&mut self, nl: &mut Netlink, table: &RouteTable) {
        if !self.primer.as_ref().is_some_and(|(p, _)| p.on_link()) {
            return;
        }
        let now: HashSet<Ipv6Addr> = table
            .peers
            .iter()
            .flat_map(|r| r.accept().map(|a| *a.remote.ip()))
            .collect();
        for gone in self.remotes.difference(&now) {
            if let Err(e) = nl.del_neighbor(self.external_index, *gone) {
                log::debug!("forget neighbour {gone}: {e}");
            }
        }
        self.remotes = now;
    }

    /// Removes every hashed address and closes every socket (shutdown).
    pub fn remove_all(&mut self, nl: &mut Netlink, polls: &Polls) {
        for (addr, _) in std::mem::take(&mut self.pinned) {
            if let Err(e) = nl.del_neighbor(self.external_index, addr) {
                log::warn!("unpin neighbour {addr}: {e}");
            }
        }
        // The neighbour entries for the peer's addresses (ours or learned): gone with them.
        for addr in self.remotes.drain() {
            let _ = nl.del_neighbor(self.external_index, addr);
        }
        for addr in self.bound.drain() {
            if let Err(e) = nl.del_address(self.external_index, addr, 128) {
                log::warn!("remove hashed address {addr}: {e}");
            }
        }
        for (port, s) in std::mem::take(&mut self.sockets) {
            let owner = self.owners.remove(&port).unwrap_or(0);
            let _ = polls.get(owner).delete(s.as_raw_fd());
        }
    }
}

/// Every local port `table` needs, each with the index of the first peer that uses it (with
/// port hopping a port has one user but by coincidence; a fixed port is shared by all).
fn port_users(table: &RouteTable) -> Vec<(u16, usize)> {
    let mut users: BTreeMap<u16, usize> = BTreeMap::new();
    for (i, routes) in table.peers.iter().enumerate() {
        for r in routes.accept() {
            users.entry(r.local.port()).or_insert(i);
        }
    }
    users.into_iter().collect()
}

/// The worker that receives for peer `index` of `table`: fixed the first time the peer needs
/// a socket, on the worker that serves the fewest peers then, so that every epoch of a peer
/// arrives at one worker (its packets are never reordered by an epoch switch) and peers spread
/// over the workers.
fn worker_of(table: &RouteTable, index: usize, workers: usize) -> usize {
    let workers = workers.max(1);
    let peer = &table.peers[index].peer;
    *peer.worker.get_or_init(|| {
        least_served(
            table.peers.iter().map(|r| r.peer.worker.get().copied()),
            workers,
        )
    }) % workers
}

/// The worker (of `workers`) that the fewest of `assigned` name, the lowest index on a tie.
fn least_served(assigned: impl Iterator<Item = Option<usize>>, workers: usize) -> usize {
    let mut served = vec![0usize; workers.max(1)];
    for w in assigned.flatten() {
        if let Some(n) = served.get_mut(w) {
            *n += 1;
        }
    }
    served
        .iter()
        .enumerate()
        .min_by_key(|&(w, &n)| (n, w))
        .map_or(0, |(w, _)| w)
}

/// Says once per run when a tunnel socket got smaller buffers than asked for: without
/// CAP_NET_ADMIN the FORCE options fail and `net.core.rmem_max`/`wmem_max` cap the size, and a
/// receive queue that small overflows sooner while the receive thread waits for a core.
fn report_small_buffers(socket: &UdpSocket6) {
    static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    // The kernel reports twice the size asked for (its bookkeeping share).
    let wanted = 2 * mt6d_os::udp::SOCKET_BUFFER;
    let (Ok(rcv), Ok(snd)) = (socket.recv_buffer_size(), socket.send_buffer_size()) else {
        return;
    };
    if (rcv < wanted || snd < wanted) && !SAID.swap(true, std::sync::atomic::Ordering::Relaxed) {
        log::warn!(
            "tunnel sockets got {} KiB receive and {} KiB send buffers of the {} KiB asked for (capped by net.core.rmem_max / wmem_max); raise those sysctls to 7340032 or more",
            rcv / 1024,
            snd / 1024,
            wanted / 1024
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mt6d_proto::{Route, Schedule};
    use std::net::SocketAddrV6;

    fn route(e: u64) -> Route {
        let a = |x: u16| {
            SocketAddrV6::new(
                Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, x, e as u16),
                1024,
                0,
                0,
            )
        };
        Route {
            epoch: Epoch(e),
            local: a(1),
            remote: a(2),
        }
    }

    #[test]
    fn peers_go_to_the_least_served_worker_and_spread_evenly() {
        assert_eq!(least_served(std::iter::empty(), 2), 0);
        assert_eq!(least_served([Some(0)].into_iter(), 2), 1);
        assert_eq!(least_served([Some(0), Some(1)].into_iter(), 2), 0);
        // Peers not yet placed do not count; a stale index past the end is ignored.
        assert_eq!(least_served([None, Some(1), Some(7)].into_iter(), 2), 0);
        let mut placed: Vec<Option<usize>> = Vec::new();
        for _ in 0..10 {
            let w = least_served(placed.iter().copied(), 4);
            placed.push(Some(w));
        }
        let mut per = [0; 4];
        for w in placed.iter().flatten() {
            per[*w] += 1;
        }
        assert_eq!(per, [3, 3, 2, 2]);
        assert_eq!(least_served([Some(0)].into_iter(), 0), 0);
    }

    /// A window of one instant: tests of what is planned, not of when.
    fn at(t: UnixTime) -> SendWindow {
        SendWindow::new(t, t)
    }

    fn pending_of(plan: &ControlPlan<(Ipv6Addr, Ipv6Addr)>) -> Vec<(UnixTime, Ipv6Addr, Ipv6Addr)> {
        let mut v: Vec<_> = plan.waiting().map(|(t, p)| (t, p.0, p.1)).collect();
        v.sort();
        v
    }

    #[test]
    fn a_peer_address_that_moves_is_primed_again_and_the_one_it_left_is_not() {
        let t = |ms: u64| UnixTime::from_nanos(ms * 1_000_000);
        let a = |x: u16| Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, x);
        let mut random = || 0u64;
        let (mut primed, mut pending) = (HashSet::new(), ControlPlan::default());
        // Epoch 7 in use (sent at once), epoch 8 due before its boundary.
        let first = [(t(0), a(7), a(17)), (t(750), a(8), a(18))];
        let wanted = |w: &[(UnixTime, Ipv6Addr, Ipv6Addr)]| {
            w.iter().map(|&(d, f, g)| (at(d), f, g)).collect::<Vec<_>>()
        };
        plan_priming(
            &mut primed,
            &mut pending,
            wanted(&first).into_iter(),
            &mut random,
        );
        assert_eq!(pending_of(&pending), first.to_vec());
        // The same table again (a step for another peer): nothing scheduled twice.
        assert_eq!(pending.take_due(t(0)), vec![(a(7), a(17))]); // epoch 7's was sent
        plan_priming(
            &mut primed,
            &mut pending,
            wanted(&first).into_iter(),
            &mut random,
        );
        assert_eq!(pending_of(&pending), vec![first[1]]);
        // The peer moved its address of epoch 8 (ours stays): the new one is primed, the
        // pending solicitation to the one it left is dropped, epoch 7's is not sent again.
        let moved = [(t(0), a(7), a(17)), (t(750), a(8), a(28))];
        plan_priming(
            &mut primed,
            &mut pending,
            wanted(&moved).into_iter(),
            &mut random,
        );
        assert_eq!(pending_of(&pending), vec![moved[1]]);
        assert_eq!(primed, HashSet::from([(a(7), a(17)), (a(8), a(28))]));
        // Routed: every target is the router; a pair that left the window is forgotten.
        let routed = [(t(1_000), a(8), a(1)), (t(1_750), a(9), a(1))];
        plan_priming(
            &mut primed,
            &mut pending,
            wanted(&routed).into_iter(),
            &mut random,
        );
        assert_eq!(primed, HashSet::from([(a(8), a(1)), (a(9), a(1))]));
        assert_eq!(pending_of(&pending), routed.to_vec());
    }

    #[test]
    fn the_next_epoch_is_primed_in_its_window_before_its_boundary() {
        let boundary = UnixTime::from_nanos(10_000_000_000);
        let schedule = Schedule {
            send: route(7),
            accept: [route(6), route(7), route(8)],
            next_change: boundary,
        };
        let now = UnixTime::from_nanos(9_000_000_000);
        let got: Vec<(u64, u64, u64)> = announcements(&schedule, now)
            .map(|(w, r)| (r.epoch.0, w.earliest.as_nanos(), w.latest.as_nanos()))
            .collect();
        assert_eq!(
            got,
            vec![
                (7, now.as_nanos(), now.as_nanos() + AT_ONCE_NS),
                (
                    8,
                    10_000_000_000 - 450_000_000,
                    10_000_000_000 - 250_000_000
                )
            ],
            "current at once, next 450 to 250 ms early, previous never"
        );
        // A step inside the window (a route moved late): what is left of it.
        let late = UnixTime::from_nanos(9_700_000_000);
        let next = announcements(&schedule, late).nth(1).expect("next epoch").0;
        assert_eq!(next.earliest, late);
        assert_eq!(next.latest.as_nanos(), 9_750_000_000);
    }

    #[test]
    fn each_send_route_is_announced_once_at_its_own_drawn_instant() {
        use rand::{RngCore, SeedableRng};
        let t = |ms: u64| UnixTime::from_nanos(ms * 1_000_000);
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(3);
        let mut random = || rng.next_u64();
        let (mut announced, mut plan) = (HashSet::new(), ControlPlan::default());
        let peer_route = |p: u16, e: u64| {
            let mut r = route(e);
            r.local.set_port(2000 + p);
            r
        };
        // Start-up: four peers, all announced within AT_ONCE_NS.
        let sends: Vec<(Route, UnixTime)> = (0..4).map(|p| (peer_route(p, 7), t(1_000))).collect();
        plan_announcements(&mut announced, &mut plan, &sends, t(0), &mut random);
        assert_eq!(plan.take_due(t(40)).len(), 4);
        // A step for another reason in the same epoch: nothing again (no repeat on a route).
        plan_announcements(&mut announced, &mut plan, &sends, t(300), &mut random);
        assert!(plan.is_empty());
        // The next epochs: one each, within the first three quarters of the epoch, and in an
        // order that is not the configuration order every time.
        let mut orders = HashSet::new();
        for e in 8..40u64 {
            let start = t(1_000 * (e - 7));
            let sends: Vec<(Route, UnixTime)> = (0..4)
                .map(|p| (peer_route(p, e), t(1_000 * (e - 6))))
                .collect();
            plan_announcements(&mut announced, &mut plan, &sends, start, &mut random);
            assert_eq!(announced.len(), 4, "old routes forgotten");
            assert!(plan
                .take_due(UnixTime::from_nanos(start.as_nanos() - 1))
                .is_empty());
            let mut order = Vec::new();
            let mut last = start;
            for (due, _) in plan.waiting() {
                assert!(due >= start && due <= t(1_000 * (e - 7) + 750), "{due:?}");
                last = last.max(due);
            }
            for r in plan.take_due(last) {
                order.push(r.local.port());
            }
            assert_eq!(order.len(), 4);
            orders.insert(order);
        }
        assert!(orders.len() > 10, "{orders:?}");
        // A peer whose send route moved mid-epoch: the new route is announced, the old one's
        // waiting announcement dropped.
        let sends: Vec<(Route, UnixTime)> =
            (0..4).map(|p| (peer_route(p, 50), t(50_000))).collect();
        plan_announcements(&mut announced, &mut plan, &sends, t(49_000), &mut random);
        let mut moved = sends.clone();
        moved[2].0.remote.set_port(9);
        plan_announcements(&mut announced, &mut plan, &moved, t(49_100), &mut random);
        let waiting: HashSet<Route> = plan.waiting().map(|(_, r)| *r).collect();
        assert_eq!(waiting, moved.iter().map(|s| s.0).collect());
    }
}
