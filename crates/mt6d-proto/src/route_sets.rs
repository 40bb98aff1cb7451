//! Route sets (docs/PROTOCOL.md §9.8): which keys a peer's hashed addresses, ports and header
//! protection come from at each epoch. Sans-IO like the rest of the crate: epochs and time come in.
//!
//! The **link set** comes from the link key (or the pre-shared key) and is always bound: cold
//! starts and recovery handshakes travel on it, and a peer that restarted can always reach us
//! there. Each completed handshake makes a **session set** from its route key, activated two
//! epochs after the epoch its initiation travelled on; the session's data moves to it from then
//! (or from the epoch after this side confirmed, if later), and until then travels on the set the
//! initiation came on (its **parent**). A thief of a static key computes the link set only.
//!
//! [`SetState`] is the per-peer state. The caller tells it what the handshake did
//! ([`SetState::answered`], [`SetState::completed`], [`SetState::confirmed`], [`SetState::reset`]),
//! reports packets that opened on a set ([`RouteSet::opened_on`], callable from another thread),
//! calls [`SetState::expire`] at least once per epoch, and asks [`SetState::select`] what to bind
//! and send on, [`SetState::initiation_set`] where an initiation goes and [`SetState::takes_data`]
//! whether data may arrive on a set. A response always goes back on the set its initiation
//! arrived on.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::handshake::{MacKey, PENDING_LIFETIME};
use crate::moves::{MoveStats, RouteMoves};
use crate::{Epoch, SessionKey, Stream, UnixTime};

/// Unanswered initiations on a session set after which the next ones travel on the link set
/// (recovery: a peer that lost its session still binds the link set).
pub const RECOVERY_AFTER: u32 = 3;

/// One route set of a peer: the stream's routes and keys under the set's key, and the route
/// moves agreed on its routes.
#[derive(Debug)]
pub struct RouteSet {
    /// Numbers the peer's sets in the order they were made (0: the link set); for logs and
    /// `mt6d status`.
    pub id: u64,
    /// Addresses, ports, header-protection keys and notice key of the set.
    pub stream: Stream,
    /// The MAC key of handshake messages on its routes; None for the link set, whose key the
    /// handshake holds itself.
    pub mac: Option<MacKey>,
    /// The first epoch data may travel on it (0 for the link set).
    pub activation: Epoch,
    /// Epochs moved away from address collisions on this set's routes (§5.2).
    pub moves: Mutex<RouteMoves>,
    /// The smallest route epoch at or after `activation` on which a packet from the peer opened:
    /// the peer has switched to this set (u64::MAX: none yet). Written by the rx thread.
    heard: AtomicU64,
    /// Packets opened on any set of the peer, shared by all its sets (liveness, §9.9).
    traffic: Arc<Heard>,
}

/// What the packet path opened from one peer, over all its route sets: two counters the link
/// samples for liveness (docs/PROTOCOL.md §9.9). Only a change is meaningful, never the value.
#[derive(Debug, Default)]
pub struct Heard {
    /// Every authenticated packet (data and keepalives).
    packets: AtomicU64,
    /// Packets with an inner packet (not keepalives).
    data: AtomicU64,
}

impl Heard {
    /// (authenticated packets, data packets) opened so far; compare with an earlier sample.
    pub fn sample(&self) -> (u64, u64) {
        (
            self.packets.load(Ordering::Relaxed),
            self.data.load(Ordering::Relaxed),
        )
    }

    /// A load and a store rather than a read-modify-write: no locked instruction per packet.
    /// Two workers racing may lose a count, which changes nothing here: the link only asks
    /// whether the value moved since its last sample.
    fn bump(counter: &AtomicU64) {
        counter.store(
            counter.load(Ordering::Relaxed).wrapping_add(1),
            Ordering::Relaxed,
        );
    }
}

impl RouteSet {
    fn new(
        id: u64,
        stream: Stream,
        mac: Option<MacKey>,
        activation: Epoch,
        traffic: Arc<Heard>,
    ) -> RouteSet {
        let moves = Mutex::new(RouteMoves::new(&stream));
        RouteSet {
            id,
            stream,
            mac,
            activation,
            moves,
            heard: AtomicU64::new(u64::MAX),
            traffic,
        }
    }

    /// The link set of `stream` (its configured or link key).
    pub fn link(stream: &Stream) -> RouteSet {
        RouteSet::new(
            0,
            stream.with_route_key(&stream.config().key),
            None,
            Epoch(0),
            Arc::new(Heard::default()),
        )
    }

    /// What the peer's packets opened on any of its sets so far (shared by all its sets).
    pub fn traffic(&self) -> &Arc<Heard> {
        &self.traffic
    }

    /// Whether this is the link set.
    pub fn is_link(&self) -> bool {
        self.mac.is_none()
    }

    /// The route moves. A poisoned lock still holds consistent state: every update is a plain
    /// field assignment.
    pub fn lock_moves(&self) -> std::sync::MutexGuard<'_, RouteMoves> {
        self.moves
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The rx thread opened a packet from the peer on this set's route of `epoch`, without
    /// saying whether it carried data: [`RouteSet::opened`] with `len` 0.
    pub fn opened_on(&self, epoch: Epoch) {
        self.opened(epoch, 0);
    }

    /// The rx thread opened a packet from the peer on this set's route of `epoch`, with `len`
    /// bytes of inner packet (0: a keepalive). A relaxed load and store of the peer's liveness
    /// counters ([`Heard`]), one relaxed load of `heard`, a store only for a new minimum.
    pub fn opened(&self, epoch: Epoch, len: usize) {
        Heard::bump(&self.traffic.packets);
        if len > 0 {
            Heard::bump(&self.traffic.data);
        }
        if epoch >= self.activation && epoch.0 < self.heard.load(Ordering::Relaxed) {
            self.heard.fetch_min(epoch.0, Ordering::Relaxed);
        }
    }

    fn heard(&self) -> Option<Epoch> {
        let e = self.heard.load(Ordering::Relaxed);
        (e != u64::MAX).then_some(Epoch(e))
    }
}

/// The newest confirmed session set.
#[derive(Debug)]
struct Current {
    set: Arc<RouteSet>,
    /// The epoch this side confirmed the handshake in.
    confirmed: Epoch,
    /// The set the handshake's initiation travelled on, while it is still bound; None once
    /// released.
    parent: Option<Arc<RouteSet>>,
}

impl Current {
    /// The first epoch this side sends on the set: its activation, or the epoch after
    /// confirmation if that is later (no packet goes to a set the peer cannot have yet).
    fn switch(&self) -> Epoch {
        self.set.activation.max(self.confirmed.next())
    }
}

/// A responder's answered, unconfirmed handshake: its set is bound at once (the initiator may
/// send on it from its activation), and becomes current when the peer confirms its keys.
#[derive(Debug)]
struct Unconfirmed {
    /// The id of the receive key the answer installed: the confirmation names it.
    key_id: u64,
    set: Arc<RouteSet>,
    parent: Arc<RouteSet>,
    answered_at: UnixTime,
}

/// One peer's route sets.
#[derive(Debug)]
pub struct SetState {
    link: Arc<RouteSet>,
    current: Option<Current>,
    unconfirmed: Vec<Unconfirmed>,
    next_id: u64,
    /// The move counters of sets no longer held, so that the peer's totals never go down.
    retired: MoveStats,
}

/// One bound set of a peer at an epoch, as the route table carries it.
#[derive(Debug, Clone)]
pub struct Bound {
    pub set: Arc<RouteSet>,
    /// Whether data may arrive on it. The link set takes only handshake-class messages once a
    /// session set is in force and the link set is no session's parent.
    pub data: bool,
}

/// The sets of a peer to bind at an epoch, the one to send on first.
#[derive(Debug)]
pub struct Selection {
    pub send: Arc<RouteSet>,
    pub bound: Vec<Bound>,
}

/// How a set changed, for the log.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// A parent set is no longer bound.
    Released { id: u64 },
}

impl SetState {
    pub fn new(link: Arc<RouteSet>) -> SetState {
        SetState {
            link,
            current: None,
            unconfirmed: Vec::new(),
            next_id: 1,
            retired: MoveStats::default(),
        }
    }

    /// Every set held, the link set first, each once.
    fn held(&self) -> Vec<Arc<RouteSet>> {
        let mut all = vec![self.link.clone()];
        let mut add = |s: &Arc<RouteSet>| {
            if !all.iter().any(|a| Arc::ptr_eq(a, s)) {
                all.push(s.clone());
            }
        };
        if let Some(c) = &self.current {
            add(&c.set);
            if let Some(p) = &c.parent {
                add(p);
            }
        }
        for u in &self.unconfirmed {
            add(&u.set);
            add(&u.parent);
        }
        all
    }

    /// Every set held, the link set first; a set may come twice (a parent that is also
    /// current). Allocates nothing.
    pub fn bound_sets(&self) -> impl Iterator<Item = &Arc<RouteSet>> + '_ {
        let current = self
            .current
            .iter()
            .flat_map(|c| std::iter::once(&c.set).chain(c.parent.iter()));
        let answered = self.unconfirmed.iter().flat_map(|u| [&u.set, &u.parent]);
        std::iter::once(&self.link).chain(current).chain(answered)
    }

    /// Adds the move counters of the sets of `before` no longer held to the retired totals.
    fn retire(&mut self, before: Vec<Arc<RouteSet>>) {
        let now = self.held();
        for gone in before
            .iter()
            .filter(|b| !now.iter().any(|n| Arc::ptr_eq(n, b)))
        {
            add_stats(&mut self.retired, &gone.lock_moves().stats());
        }
    }

    /// The peer's move counters over all its sets, ever, and the epochs moved now (epoch,
    /// offset) on the sets held.
    pub fn move_stats(&self) -> (MoveStats, Vec<(Epoch, u8)>) {
        let mut total = self.retired;
        let mut moved = Vec::new();
        for set in self.held() {
            let m = set.lock_moves();
            add_stats(&mut total, &m.stats());
            moved.extend(m.moved());
        }
        (total, moved)
    }

    /// The link set.
    pub fn link(&self) -> &Arc<RouteSet> {
        &self.link
    }

    fn make(&mut self, base: &Stream, route: &SessionKey, initiation: Epoch) -> Arc<RouteSet> {
        let id = self.next_id;
        self.next_id += 1;
        Arc::new(RouteSet::new(
            id,
            base.with_route_key(route),
            Some(MacKey::derive(route)),
            Epoch(initiation.0.saturating_add(2)),
            self.link.traffic.clone(),
        ))
    }

    /// A responder answered an initiation that arrived on `parent`: bind the new set now.
    pub fn answered(
        &mut self,
        base: &Stream,
        key_id: u64,
        route: &SessionKey,
        initiation: Epoch,
        parent: Arc<RouteSet>,
        now: UnixTime,
    ) {
        let before = self.held();
        let set = self.make(base, route, initiation);
        self.unconfirmed.push(Unconfirmed {
            key_id,
            set,
            parent,
            answered_at: now,
        });
        if self.unconfirmed.len() > crate::handshake::MAX_PENDING {
            self.unconfirmed.remove(0);
        }
        self.retire(before);
    }

    /// The peer confirmed the answer whose receive key is `key_id` at `epoch`: its set is
    /// current. Returns its id, if one matched.
    pub fn confirmed(&mut self, key_id: Option<u64>, epoch: Epoch) -> Option<u64> {
        let at = self
            .unconfirmed
            .iter()
            .position(|u| Some(u.key_id) == key_id)?;
        let before = self.held();
        let u = self.unconfirmed.swap_remove(at);
        self.unconfirmed.clear();
        let id = u.set.id;
        self.current = Some(Current {
            set: u.set,
            confirmed: epoch,
            parent: Some(u.parent),
        });
        self.retire(before);
        Some(id)
    }

    /// Our initiation, sent on `parent`, was answered at `epoch`: the new set is current.
    pub fn completed(
        &mut self,
        base: &Stream,
        route: &SessionKey,
        initiation: Epoch,
        parent: Arc<RouteSet>,
        epoch: Epoch,
    ) -> Arc<RouteSet> {
        let before = self.held();
        let set = self.make(base, route, initiation);
        self.unconfirmed.clear();
        self.current = Some(Current {
            set: set.clone(),
            confirmed: epoch,
            parent: Some(parent),
        });
        self.retire(before);
        set
    }

    /// Keys expired with no rekey: back to the link set alone.
    pub fn reset(&mut self) {
        let before = self.held();
        self.current = None;
        self.unconfirmed.clear();
        self.retire(before);
    }

    /// The set to send on at `epoch`.
    pub fn send_set(&self, epoch: Epoch) -> &Arc<RouteSet> {
        match &self.current {
            None => &self.link,
            Some(c) if epoch >= c.switch() => &c.set,
            Some(c) => c.parent.as_ref().unwrap_or(&self.link),
        }
    }

    /// The set an initiation goes on at `epoch` after `attempts` unanswered ones: the set data is
    /// sent on (a rekey chains on the session's routes), or the link set for recovery after
    /// [`RECOVERY_AFTER`] attempts.
    pub fn initiation_set(&self, epoch: Epoch, attempts: u32) -> &Arc<RouteSet> {
        if attempts >= RECOVERY_AFTER {
            &self.link
        } else {
            self.send_set(epoch)
        }
    }

    /// The epoch from which this side sends on the current session set, if there is one.
    pub fn switch_epoch(&self) -> Option<(u64, Epoch)> {
        self.current.as_ref().map(|c| (c.set.id, c.switch()))
    }

    /// Whether [`SetState::expire`] has anything to do (an answer awaits confirmation or a
    /// parent is still bound); false in the steady state.
    pub fn housekeeping_pending(&self) -> bool {
        !self.unconfirmed.is_empty() || self.current.as_ref().is_some_and(|c| c.parent.is_some())
    }

    /// Housekeeping at `epoch`: forgets answers never confirmed within the initiation's
    /// lifetime, and releases the current set's parent once this side sends on the current set,
    /// the peer was heard on it, and the epoch after that began (nothing the peer sent on the
    /// parent can still be in the accept window).
    pub fn expire(&mut self, epoch: Epoch, now: UnixTime) -> Option<Change> {
        // Steady state (no answer pending, parent released): nothing to do, nothing allocated.
        if !self.housekeeping_pending() {
            return None;
        }
        let before = self.held();
        self.unconfirmed.retain(|u| {
            now.as_nanos().saturating_sub(u.answered_at.as_nanos())
                < PENDING_LIFETIME.as_nanos() as u64
        });
        let released = self.current.as_mut().and_then(|c| {
            let heard = c.set.heard()?;
            if c.parent.is_some() && epoch >= c.switch() && epoch > heard {
                c.parent.take().map(|p| Change::Released { id: p.id })
            } else {
                None
            }
        });
        self.retire(before);
        released
    }

    /// Whether data may arrive on `set` now (what [`SetState::select`] says of it).
    pub fn takes_data(&self, set: &Arc<RouteSet>) -> bool {
        if !set.is_link() {
            return true;
        }
        self.current.is_none()
            || self
                .current
                .as_ref()
                .and_then(|c| c.parent.as_ref())
                .is_some_and(|p| p.is_link())
            || self.unconfirmed.iter().any(|u| u.parent.is_link())
    }

    /// What to bind at `epoch`: the link set always, the current set, its parent while kept,
    /// and every answered set with its parent.
    pub fn select(&self, epoch: Epoch) -> Selection {
        let mut bound: Vec<Bound> = Vec::with_capacity(4);
        let mut add = |set: &Arc<RouteSet>| {
            if !bound.iter().any(|b| Arc::ptr_eq(&b.set, set)) {
                bound.push(Bound {
                    set: set.clone(),
                    data: !set.is_link(),
                });
            }
        };
        add(&self.link);
        let mut link_data = self.current.is_none();
        if let Some(c) = &self.current {
            add(&c.set);
            if let Some(p) = &c.parent {
                add(p);
                link_data |= p.is_link();
            }
        }
        for u in &self.unconfirmed {
            add(&u.set);
            add(&u.parent);
            link_data |= u.parent.is_link();
        }
        bound[0].data = link_data;
        debug_assert_eq!(link_data, self.takes_data(&self.link));
        Selection {
            send: self.send_set(epoch).clone(),
            bound,
        }
    }
}

fn add_stats(total: &mut MoveStats, s: &MoveStats) {
    total.collisions += s.collisions;
    total.exhausted += s.exhausted;
    total.moved_by_peer += s.moved_by_peer;
    total.notices_sent += s.notices_sent;
    total.acks_sent += s.acks_sent;
    total.received += s.received;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Endpoint, StreamConfig};

    fn stream() -> Stream {
        Stream::new(StreamConfig::new(
            Endpoint::new("2001:db8:a::1".parse().unwrap()),
            Endpoint::new("2001:db8:b::2".parse().unwrap()),
            SessionKey::from_bytes(&[0x5a; 32]).unwrap(),
        ))
        .unwrap()
    }

    fn key(b: u8) -> SessionKey {
        SessionKey::from_bytes(&[b; 32]).unwrap()
    }

    const T: UnixTime = UnixTime::from_nanos(1_800_000_000_000_000_000);

    #[test]
    fn recovery_initiations_go_on_the_link_set() {
        let s = stream();
        let mut st = SetState::new(Arc::new(RouteSet::link(&s)));
        let link = st.link().clone();
        let s1 = st.completed(&s, &key(1), Epoch(1), link, Epoch(1));
        assert!(Arc::ptr_eq(st.initiation_set(Epoch(5), 0), &s1));
        assert!(Arc::ptr_eq(
            st.initiation_set(Epoch(5), RECOVERY_AFTER - 1),
            &s1
        ));
        assert!(st.initiation_set(Epoch(5), RECOVERY_AFTER).is_link());
    }

    #[test]
    fn cold_start_initiator_switches_at_activation_and_releases_the_link_after_hearing_the_peer() {
        let s = stream();
        let mut st = SetState::new(Arc::new(RouteSet::link(&s)));
        let sel = st.select(Epoch(10));
        assert!(sel.send.is_link());
        assert_eq!(sel.bound.len(), 1);
        assert!(sel.bound[0].data, "no session yet: data on the link set");
        let link = st.link().clone();
        let set = st.completed(&s, &key(1), Epoch(10), link, Epoch(10));
        assert_eq!(set.activation, Epoch(12));
        for e in [10, 11] {
            let sel = st.select(Epoch(e));
            assert!(sel.send.is_link(), "epoch {e}: before activation");
            assert_eq!(sel.bound.len(), 2);
            assert!(
                sel.bound.iter().all(|b| b.data),
                "the link set is the parent"
            );
        }
        assert!(Arc::ptr_eq(&st.select(Epoch(12)).send, &set));
        // Not heard on the new set: the parent stays.
        assert_eq!(st.expire(Epoch(14), T), None);
        set.opened_on(Epoch(11)); // before activation: not evidence
        assert_eq!(st.expire(Epoch(14), T), None);
        set.opened_on(Epoch(13));
        assert_eq!(st.expire(Epoch(13), T), None, "not past the epoch heard");
        assert_eq!(st.expire(Epoch(14), T), Some(Change::Released { id: 0 }));
        let sel = st.select(Epoch(14));
        assert_eq!(sel.bound.len(), 2);
        assert!(sel.bound[0].set.is_link() && !sel.bound[0].data);
        assert!(sel.bound[1].data);
    }

    #[test]
    fn a_late_confirmation_delays_the_switch_and_a_rekey_chains_on_the_session_set() {
        let s = stream();
        let mut st = SetState::new(Arc::new(RouteSet::link(&s)));
        let link = st.link().clone();
        st.answered(&s, 7, &key(1), Epoch(20), link, T);
        let sel = st.select(Epoch(20));
        assert_eq!(sel.bound.len(), 2, "the answered set is bound at once");
        assert!(sel.send.is_link());
        assert_eq!(st.confirmed(Some(8), Epoch(25)), None, "another key");
        assert_eq!(st.confirmed(Some(7), Epoch(25)), Some(1));
        assert!(
            st.select(Epoch(25)).send.is_link(),
            "switch after confirmation"
        );
        let s1 = st.select(Epoch(26)).send.clone();
        assert_eq!(s1.id, 1);
        // A rekey initiated by the peer on the session set.
        st.answered(&s, 9, &key(2), Epoch(40), s1.clone(), T);
        assert_eq!(st.confirmed(Some(9), Epoch(40)), Some(2));
        let sel = st.select(Epoch(41));
        assert!(Arc::ptr_eq(&sel.send, &s1), "the parent until activation");
        assert!(!sel.bound[0].data, "the link set is nobody's parent now");
        assert_eq!(sel.bound.len(), 3);
        assert_eq!(st.select(Epoch(42)).send.id, 2);
    }

    #[test]
    fn a_restarted_peer_reaches_us_on_the_link_set_and_unanswered_sets_expire() {
        let s = stream();
        let mut st = SetState::new(Arc::new(RouteSet::link(&s)));
        let link = st.link().clone();
        let s1 = st.completed(&s, &key(1), Epoch(1), link.clone(), Epoch(1));
        s1.opened_on(Epoch(3));
        assert!(st.expire(Epoch(4), T).is_some());
        assert!(!st.select(Epoch(4)).bound[0].data);
        // The peer restarted: its initiation arrives on the link set, which then takes data.
        st.answered(&s, 3, &key(2), Epoch(30), link, T);
        let sel = st.select(Epoch(30));
        assert!(
            sel.bound[0].data,
            "the restarted peer sends on the link set"
        );
        assert_eq!(sel.bound.len(), 3);
        let later = UnixTime::from_nanos(T.as_nanos() + PENDING_LIFETIME.as_nanos() as u64);
        st.expire(Epoch(33), later);
        assert_eq!(
            st.select(Epoch(33)).bound.len(),
            2,
            "never confirmed: dropped"
        );
        st.reset();
        assert!(st.select(Epoch(34)).send.is_link());
    }
}
