//! One deadline per peer in an indexed binary min-heap: the next deadline is the root (O(1)), a
//! tick pops only the peers that are due (O(log n) each), and a peer's deadline can be moved or
//! cancelled in O(log n) through the position table. Nothing here reads a clock: deadlines and
//! `now` are [`UnixTime`]s from the caller.
//!
//! Why a heap and not a timing wheel: MT6D deadlines are epoch boundaries, spread by per-stream
//! jitter over half an interval and up to a year ahead; a heap needs no tick granularity or
//! overflow levels, and at a million peers a pop is about 20 levels of a contiguous array.

use super::PeerId;
use crate::UnixTime;

/// Where a slot's deadline sits in the heap.
#[derive(Clone, Copy, Debug)]
struct Position {
    /// The generation whose deadline this is.
    generation: u32,
    /// Index into `heap`, [`NONE`] if the slot has no deadline.
    at: u32,
}

const NONE: u32 = u32::MAX;

/// A heap entry, ordered by (deadline, slot): equal deadlines come out by slot, so the order is
/// a function of the deadlines alone.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Entry {
    at: UnixTime,
    peer: PeerId,
}

impl Entry {
    fn key(&self) -> (UnixTime, u32) {
        (self.at, self.peer.index())
    }
}

/// At most one deadline per peer. 16 bytes per scheduled peer in the heap plus 8 per slot.
///
/// Call order: [`Timers::schedule`] a peer (again to move its deadline), ask
/// [`Timers::next_deadline`] when to wake up, and at wake-up call [`Timers::pop_due`]`(now)` until
/// it returns `None`, handling and rescheduling each peer it returns. Removing a peer must
/// [`Timers::cancel`] it; a deadline left for a stale id is replaced when the slot's next peer is
/// scheduled, and is otherwise returned by `pop_due` like any other (the caller's slab then
/// refuses the stale id).
#[derive(Debug, Default)]
pub struct Timers {
    heap: Vec<Entry>,
    /// Indexed by slot.
    positions: Vec<Position>,
}

impl Timers {
    /// No deadline.
    pub fn new() -> Timers {
        Timers::default()
    }

    /// Room for `n` peers without reallocating.
    pub fn with_capacity(n: usize) -> Timers {
        Timers {
            heap: Vec::with_capacity(n),
            positions: Vec::with_capacity(n),
        }
    }

    /// Sets `peer`'s deadline to `at`, replacing the one it had (or one a previous holder of its
    /// slot left). O(log n). `peer` comes from the caller's [`super::PeerSlab`]: slots are dense,
    /// and the position table grows to the largest slot scheduled.
    pub fn schedule(&mut self, peer: PeerId, at: UnixTime) {
        let slot = peer.slot();
        if self.positions.len() <= slot {
            self.positions.resize(
                slot + 1,
                Position {
                    generation: 0,
                    at: NONE,
                },
            );
        }
        let pos = self.positions[slot];
        let entry = Entry { at, peer };
        if pos.at == NONE {
            self.positions[slot] = Position {
                generation: peer.generation(),
                at: self.heap.len() as u32,
            };
            self.heap.push(entry);
            self.sift_up(self.heap.len() - 1);
        } else {
            let i = pos.at as usize;
            let old = self.heap[i];
            self.heap[i] = entry;
            self.positions[slot].generation = peer.generation();
            if entry.key() < old.key() {
                self.sift_up(i);
            } else {
                self.sift_down(i);
            }
        }
    }

    /// Removes `peer`'s deadline; false if it had none (or `peer` is stale). O(log n).
    pub fn cancel(&mut self, peer: PeerId) -> bool {
        match self.positions.get(peer.slot()) {
            Some(p) if p.at != NONE && p.generation == peer.generation() => {
                self.remove_at(p.at as usize);
                true
            }
            _ => false,
        }
    }

    /// `peer`'s deadline, if it has one. O(1).
    pub fn deadline(&self, peer: PeerId) -> Option<UnixTime> {
        match self.positions.get(peer.slot()) {
            Some(p) if p.at != NONE && p.generation == peer.generation() => {
                Some(self.heap[p.at as usize].at)
            }
            _ => None,
        }
    }

    /// The earliest deadline: when the caller must call [`Timers::pop_due`] next. O(1).
    pub fn next_deadline(&self) -> Option<UnixTime> {
        self.heap.first().map(|e| e.at)
    }

    /// The earliest peer whose deadline is at or before `now`, with its deadline, removed from the
    /// heap; `None` when no peer is due. O(log n) per peer returned, O(1) when none is due.
    pub fn pop_due(&mut self, now: UnixTime) -> Option<(PeerId, UnixTime)> {
        let first = *self.heap.first()?;
        if first.at > now {
            return None;
        }
        self.remove_at(0);
        Some((first.peer, first.at))
    }

    /// Peers with a deadline.
    pub fn len(&self) -> usize {
        self.heap.len()
    }

    /// No deadline at all.
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    fn remove_at(&mut self, i: usize) {
        let removed = self.heap[i];
        self.positions[removed.peer.slot()].at = NONE;
        let last = self.heap.len() - 1;
        if i != last {
            self.heap.swap(i, last);
            self.heap.pop();
            self.positions[self.heap[i].peer.slot()].at = i as u32;
            // The entry moved in from the end may belong above or below i.
            if i > 0 && self.heap[i].key() < self.heap[(i - 1) / 2].key() {
                self.sift_up(i);
            } else {
                self.sift_down(i);
            }
        } else {
            self.heap.pop();
        }
    }

    fn place(&mut self, i: usize, e: Entry) {
        self.heap[i] = e;
        self.positions[e.peer.slot()].at = i as u32;
    }

    fn sift_up(&mut self, mut i: usize) {
        let e = self.heap[i];
        while i > 0 {
            let parent = (i - 1) / 2;
            if self.heap[parent].key() <= e.key() {
                break;
            }
            self.place(i, self.heap[parent]);
            i = parent;
        }
        self.place(i, e);
    }

    fn sift_down(&mut self, mut i: usize) {
        let e = self.heap[i];
        let n = self.heap.len();
        loop {
            let left = 2 * i + 1;
            if left >= n {
                break;
            }
            let right = left + 1;
            let child = if right < n && self.heap[right].key() < self.heap[left].key() {
                right
            } else {
                left
            };
            if e.key() <= self.heap[child].key() {
                break;
            }
            self.place(i, self.heap[child]);
            i = child;
        }
        self.place(i, e);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(i: u32) -> PeerId {
        PeerId::from_parts(i, 0)
    }
    fn t(ms: u64) -> UnixTime {
        UnixTime::from_millis(ms)
    }
    fn drain(timers: &mut Timers, now: UnixTime) -> Vec<(u32, u64)> {
        std::iter::from_fn(|| timers.pop_due(now))
            .map(|(p, at)| (p.index(), at.as_millis()))
            .collect()
    }

    #[test]
    fn pops_in_deadline_order_and_only_when_due() {
        let mut tm = Timers::new();
        for (i, ms) in [(0, 50), (1, 10), (2, 30), (3, 10), (4, 40)] {
            tm.schedule(id(i), t(ms));
        }
        assert_eq!(tm.next_deadline(), Some(t(10)));
        assert_eq!(tm.pop_due(t(9)), None);
        assert_eq!(drain(&mut tm, t(30)), [(1, 10), (3, 10), (2, 30)]);
        assert_eq!(tm.next_deadline(), Some(t(40)));
        assert_eq!(tm.len(), 2);
        assert_eq!(drain(&mut tm, t(1000)), [(4, 40), (0, 50)]);
        assert!(tm.is_empty());
        assert_eq!(tm.next_deadline(), None);
    }

    #[test]
    fn reschedule_moves_the_one_deadline() {
        let mut tm = Timers::new();
        tm.schedule(id(0), t(10));
        tm.schedule(id(1), t(20));
        tm.schedule(id(0), t(30));
        assert_eq!(tm.len(), 2);
        assert_eq!(tm.deadline(id(0)), Some(t(30)));
        assert_eq!(tm.next_deadline(), Some(t(20)));
        tm.schedule(id(0), t(5));
        assert_eq!(drain(&mut tm, t(100)), [(0, 5), (1, 20)]);
    }

    #[test]
    fn cancel_and_stale_ids() {
        let mut tm = Timers::new();
        tm.schedule(id(0), t(10));
        tm.schedule(id(1), t(20));
        tm.schedule(id(2), t(15));
        assert!(tm.cancel(id(0)));
        assert!(!tm.cancel(id(0)));
        let stale = PeerId::from_parts(2, 7);
        assert!(!tm.cancel(stale), "another generation's deadline stays");
        assert_eq!(tm.deadline(stale), None);
        // The slot's next peer replaces what a stale id left.
        tm.schedule(PeerId::from_parts(1, 1), t(12));
        assert_eq!(tm.len(), 2);
        assert_eq!(tm.deadline(id(1)), None);
        let popped: Vec<_> = std::iter::from_fn(|| tm.pop_due(t(100))).collect();
        assert_eq!(popped, [(PeerId::from_parts(1, 1), t(12)), (id(2), t(15))]);
    }

    #[test]
    fn heap_stays_ordered_through_random_operations() {
        // A deterministic mix of schedule, cancel and pop against a sorted model.
        let mut tm = Timers::new();
        let mut model: Vec<Option<u64>> = vec![None; 64];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut now = 0;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let slot = (x % 64) as u32;
            match (x >> 8) % 4 {
                0 | 1 => {
                    let at = now + (x >> 16) % 1000;
                    tm.schedule(id(slot), t(at));
                    model[slot as usize] = Some(at);
                }
                2 => assert_eq!(tm.cancel(id(slot)), model[slot as usize].take().is_some()),
                _ => {
                    now += (x >> 16) % 50;
                    while let Some((p, at)) = tm.pop_due(t(now)) {
                        let expect = model
                            .iter()
                            .enumerate()
                            .filter_map(|(i, m)| m.map(|at| (at, i as u32)))
                            .min()
                            .unwrap();
                        assert_eq!((at.as_millis(), p.index()), expect);
                        model[p.slot()] = None;
                    }
                    let next = model.iter().flatten().min().copied();
                    assert_eq!(tm.next_deadline().map(UnixTime::as_millis), next);
                    assert!(next.is_none_or(|n| n > now));
                }
            }
        }
    }
}
