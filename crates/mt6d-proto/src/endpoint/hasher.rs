//! The keyed hash of the endpoint's indexes: SipHash-1-3 (the function behind std's `HashMap`)
//! under a 128-bit key the caller supplies, since this crate has no randomness of its own.
//!
//! Why keyed: the (hashed address, port) index is probed with the destination of every datagram
//! that reaches the gateway, and an attacker chooses those. With a fixed public hash function an
//! attacker could precompute keys that fall into one probe sequence and make every lookup walk
//! it (HashDoS). Under a secret key the placement of keys is unpredictable to the sender.
//! SipHash-1-3 rather than a faster unkeyed or weakly seeded hash: it is what std uses for the
//! same threat, and at a million peers a lookup is dominated by its cache misses, not by the 18
//! or 32 bytes hashed. The function is the `siphasher` crate's (std's own is not public).

use std::hash::BuildHasher;

use siphasher::sip::SipHasher13;

/// The secret key of the endpoint's hash tables. Draw it from a CSPRNG once per process (the
/// daemon owns the randomness); two tables with one seed place keys identically, which is
/// harmless. Redacted in `Debug`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct IndexSeed([u8; 16]);

impl IndexSeed {
    /// A seed from 16 random bytes.
    pub const fn from_bytes(bytes: [u8; 16]) -> IndexSeed {
        IndexSeed(bytes)
    }
}

impl std::fmt::Debug for IndexSeed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("IndexSeed([redacted])")
    }
}

/// Builds [`SipHasher13`]s under one [`IndexSeed`]: the `S` of the endpoint's `HashMap`s.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SeededState {
    k0: u64,
    k1: u64,
}

impl SeededState {
    pub(crate) fn new(seed: IndexSeed) -> SeededState {
        let [a, b] = split(seed.0);
        SeededState {
            k0: u64::from_le_bytes(a),
            k1: u64::from_le_bytes(b),
        }
    }
}

fn split(b: [u8; 16]) -> [[u8; 8]; 2] {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&b[..8]);
    hi.copy_from_slice(&b[8..]);
    [lo, hi]
}

impl BuildHasher for SeededState {
    type Hasher = SipHasher13;
    fn build_hasher(&self) -> SipHasher13 {
        SipHasher13::new_with_keys(self.k0, self.k1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::Hasher;

    /// The 16 seed bytes become the two SipHash keys as the reference implementation reads its
    /// key (little-endian words), so a seed means the same function everywhere.
    #[test]
    fn the_seed_is_split_into_little_endian_keys() {
        let k: [u8; 16] = core::array::from_fn(|i| i as u8);
        let state = SeededState::new(IndexSeed::from_bytes(k));
        assert_eq!(state.k0, 0x0706_0504_0302_0100);
        assert_eq!(state.k1, 0x0f0e_0d0c_0b0a_0908);
        let mut ours = state.build_hasher();
        ours.write(b"mt6d");
        let mut reference = SipHasher13::new_with_key(&k);
        reference.write(b"mt6d");
        assert_eq!(ours.finish(), reference.finish());
    }

    #[test]
    fn seed_changes_the_hash() {
        let a = SeededState::new(IndexSeed::from_bytes([1; 16]));
        let b = SeededState::new(IndexSeed::from_bytes([2; 16]));
        assert_ne!(a.hash_one(42u64), b.hash_one(42u64));
        assert_eq!(a.hash_one(42u64), a.hash_one(42u64));
        assert_eq!(
            format!("{:?}", IndexSeed::from_bytes([7; 16])),
            "IndexSeed([redacted])"
        );
    }
}
