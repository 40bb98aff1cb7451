//! Compact peer ids: a slot in a `Vec` plus the generation of that slot, so that a million peers
//! cost a `Vec` of a million slots and an id that outlived its peer is recognised, never taken
//! for the peer that reuses the slot.

/// A peer of an endpoint: 8 bytes, `Copy`. Valid until the peer is removed; after that every
/// call that takes it answers as for an unknown peer (the slot's generation moved on).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PeerId {
    index: u32,
    generation: u32,
}

impl PeerId {
    /// The slot: dense from 0, reused after a removal. Side tables of the caller (counters,
    /// keys) can be `Vec`s indexed by it, checked with [`PeerId::generation`].
    pub const fn index(self) -> u32 {
        self.index
    }
    /// How many peers held this slot before this one.
    pub const fn generation(self) -> u32 {
        self.generation
    }
    /// An id from its parts, for side tables that store them apart. Nothing is checked here:
    /// a made-up id is stale or unknown to every table, never another peer.
    pub const fn from_parts(index: u32, generation: u32) -> PeerId {
        PeerId { index, generation }
    }
    pub(crate) fn slot(self) -> usize {
        self.index as usize
    }
}

#[derive(Debug)]
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Values keyed by [`PeerId`], stored densely. Insert, get and remove are O(1) (insert amortised);
/// a removed slot is reused with the next generation, and a slot whose generation would wrap is
/// retired instead (after 2^32 peers in one slot), so a stale id can never alias a live one.
#[derive(Debug)]
pub struct PeerSlab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Default for PeerSlab<T> {
    fn default() -> Self {
        PeerSlab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }
}

impl<T> PeerSlab<T> {
    /// An empty slab.
    pub fn new() -> PeerSlab<T> {
        PeerSlab::default()
    }

    /// An empty slab with room for `n` peers without reallocating.
    pub fn with_capacity(n: usize) -> PeerSlab<T> {
        PeerSlab {
            slots: Vec::with_capacity(n),
            free: Vec::new(),
            len: 0,
        }
    }

    /// Stores `value` and returns its new id; `None` only when all 2^32 slots are in use.
    pub fn insert(&mut self, value: T) -> Option<PeerId> {
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.value = Some(value);
            self.len += 1;
            return Some(PeerId {
                index,
                generation: slot.generation,
            });
        }
        let index = u32::try_from(self.slots.len()).ok()?;
        self.slots.push(Slot {
            generation: 0,
            value: Some(value),
        });
        self.len += 1;
        Some(PeerId {
            index,
            generation: 0,
        })
    }

    /// Removes the peer; `None` if `id` is stale or unknown.
    pub fn remove(&mut self, id: PeerId) -> Option<T> {
        let slot = self.slots.get_mut(id.slot())?;
        if slot.generation != id.generation {
            return None;
        }
        let value = slot.value.take()?;
        self.len -= 1;
        if let Some(next) = slot.generation.checked_add(1) {
            slot.generation = next;
            self.free.push(id.index);
        }
        Some(value)
    }

    /// The value of a live id.
    pub fn get(&self, id: PeerId) -> Option<&T> {
        let slot = self.slots.get(id.slot())?;
        if slot.generation != id.generation {
            return None;
        }
        slot.value.as_ref()
    }

    /// The value of a live id, mutably.
    pub fn get_mut(&mut self, id: PeerId) -> Option<&mut T> {
        let slot = self.slots.get_mut(id.slot())?;
        if slot.generation != id.generation {
            return None;
        }
        slot.value.as_mut()
    }

    /// Whether `id` names a live peer.
    pub fn contains(&self, id: PeerId) -> bool {
        self.get(id).is_some()
    }

    /// Live peers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// No live peer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every live peer, by slot. O(slots).
    pub fn iter(&self) -> impl Iterator<Item = (PeerId, &T)> + '_ {
        self.slots.iter().enumerate().filter_map(|(i, s)| {
            let v = s.value.as_ref()?;
            Some((
                PeerId {
                    // The slab never holds more than u32::MAX + 1 slots (insert checks).
                    index: i as u32,
                    generation: s.generation,
                },
                v,
            ))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_get_remove() {
        let mut s = PeerSlab::new();
        let a = s.insert("a").unwrap();
        let b = s.insert("b").unwrap();
        assert_eq!((a.index(), b.index()), (0, 1));
        assert_eq!(s.get(a), Some(&"a"));
        assert_eq!(s.len(), 2);
        assert_eq!(s.remove(a), Some("a"));
        assert_eq!(s.remove(a), None);
        assert_eq!(s.len(), 1);
        assert_eq!(
            s.iter().map(|(id, v)| (id, *v)).collect::<Vec<_>>(),
            [(b, "b")]
        );
    }

    #[test]
    fn stale_id_never_reaches_the_slot_reused() {
        let mut s = PeerSlab::new();
        let a = s.insert(1).unwrap();
        s.remove(a);
        let c = s.insert(3).unwrap();
        assert_eq!(c.index(), a.index());
        assert_eq!(c.generation(), a.generation() + 1);
        assert_eq!(s.get(a), None);
        assert!(s.get_mut(a).is_none());
        assert_eq!(s.remove(a), None);
        assert!(!s.contains(a));
        assert_eq!(s.get(c), Some(&3));
        assert_eq!(s.get(PeerId::from_parts(9, 0)), None);
    }

    #[test]
    fn exhausted_generation_retires_the_slot() {
        let mut s = PeerSlab::new();
        let a = s.insert(1).unwrap();
        s.slots[0].generation = u32::MAX;
        let a = PeerId::from_parts(a.index(), u32::MAX);
        assert_eq!(s.remove(a), Some(1));
        let b = s.insert(2).unwrap();
        assert_eq!(b.index(), 1, "slot 0 is never handed out again");
        assert_eq!(s.get(a), None);
    }
}
