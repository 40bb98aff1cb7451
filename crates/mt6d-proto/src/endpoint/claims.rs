//! Keys claimed by (peer, epoch) pairs: the rule both receive indexes follow, the endpoint's
//! local (hashed address, port) index ([`super::RouteIndex`]) and the relays' route tag index
//! ([`crate::relay::tags::TagIndex`]).
//!
//! A key claimed once is found; a key claimed by two or more pairs is **contested** and found by
//! none of them until only one claim is left (then that one is found again). Handing a contested
//! key to either claimant could give one peer's packets to the other. Both maps hash with the
//! caller's [`SeededState`]: they are probed with keys read from the network.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::Hash;

use super::hasher::SeededState;
use super::PeerId;
use crate::Epoch;

/// One claimant of a key.
pub(crate) type Claim = (PeerId, Epoch);

#[derive(Debug)]
pub(crate) struct Claims<K> {
    /// Keys claimed by exactly one pair.
    found: HashMap<K, Claim, SeededState>,
    /// Keys claimed by two or more: found by nobody until one claim remains.
    contested: HashMap<K, Vec<Claim>, SeededState>,
}

impl<K: Hash + Eq + Copy> Claims<K> {
    /// Empty, with room for `keys` found keys without rehashing.
    pub(crate) fn with_capacity(state: SeededState, keys: usize) -> Claims<K> {
        Claims {
            found: HashMap::with_capacity_and_hasher(keys, state),
            contested: HashMap::with_hasher(state),
        }
    }

    /// The one claimant of `key`; `None` for an unclaimed or contested key. O(1).
    pub(crate) fn get(&self, key: &K) -> Option<Claim> {
        self.found.get(key).copied()
    }

    /// Whether `key` is found (claimed exactly once). O(1).
    pub(crate) fn is_found(&self, key: &K) -> bool {
        self.found.contains_key(key)
    }

    /// Whether `key` is claimed more than once. O(1).
    pub(crate) fn is_contested(&self, key: &K) -> bool {
        self.contested.contains_key(key)
    }

    /// Keys claimed exactly once.
    pub(crate) fn found_len(&self) -> usize {
        self.found.len()
    }

    /// Keys claimed more than once.
    pub(crate) fn contested_len(&self) -> usize {
        self.contested.len()
    }

    /// Records that (peer, epoch) uses `key`; a second claim makes it contested.
    pub(crate) fn claim(&mut self, key: K, claim: Claim) {
        if let Some(claims) = self.contested.get_mut(&key) {
            claims.push(claim);
            return;
        }
        match self.found.entry(key) {
            Entry::Vacant(v) => {
                v.insert(claim);
            }
            Entry::Occupied(o) => {
                let first = o.remove();
                self.contested.insert(key, vec![first, claim]);
            }
        }
    }

    /// Drops (peer, epoch)'s claim on `key`; a key left with one claim is found again.
    pub(crate) fn unclaim(&mut self, key: K, claim: Claim) {
        if let Entry::Occupied(o) = self.found.entry(key) {
            if *o.get() == claim {
                o.remove();
            }
            return;
        }
        if let Entry::Occupied(mut o) = self.contested.entry(key) {
            o.get_mut().retain(|c| *c != claim);
            match o.get().as_slice() {
                [] => {
                    o.remove();
                }
                [only] => {
                    let only = *only;
                    o.remove();
                    self.found.insert(key, only);
                }
                _ => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::IndexSeed;

    #[test]
    fn a_second_claim_hides_the_key_until_one_is_left() {
        let mut c: Claims<u32> =
            Claims::with_capacity(SeededState::new(IndexSeed::from_bytes([3; 16])), 4);
        let a = (PeerId::from_parts(1, 0), Epoch(7));
        let b = (PeerId::from_parts(2, 0), Epoch(7));
        c.claim(9, a);
        assert_eq!(c.get(&9), Some(a));
        c.claim(9, b);
        assert_eq!((c.get(&9), c.is_contested(&9)), (None, true));
        c.unclaim(9, b);
        assert_eq!((c.get(&9), c.is_contested(&9)), (Some(a), false));
        // Dropping a claim the key does not hold changes nothing.
        c.unclaim(9, b);
        assert_eq!(c.get(&9), Some(a));
        c.unclaim(9, a);
        assert_eq!((c.found_len(), c.contested_len()), (0, 0));
    }
}
