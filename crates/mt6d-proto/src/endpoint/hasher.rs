//! The keyed hash of the endpoint's indexes: SipHash-1-3 (the function behind std's `HashMap`)
//! under a 128-bit key the caller supplies, since this crate has no randomness of its own.
//!
//! Why keyed: the (hashed address, port) index is probed with the destination of every datagram
//! that reaches the gateway, and an attacker chooses those. With a fixed public hash function an
//! attacker could precompute keys that fall into one probe sequence and make every lookup walk
//! it (HashDoS). Under a secret key the placement of keys is unpredictable to the sender.
//! SipHash-1-3 rather than a faster unkeyed or weakly seeded hash: it is what std uses for the
//! same threat, it needs no dependency, and at a million peers a lookup is dominated by its cache
//! misses, not by the 18 or 32 bytes hashed.

use std::hash::{BuildHasher, Hasher};

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
        SipHasher::new(self.k0, self.k1)
    }
}

/// SipHash-1-3 (one compression round, three finalisation rounds).
pub(crate) type SipHasher13 = SipHasher<1, 3>;

/// SipHash-c-d (Aumasson and Bernstein, "SipHash: a fast short-input PRF", 2012), streaming:
/// bytes are buffered into 64-bit little-endian words.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SipHasher<const C: usize, const D: usize> {
    v: [u64; 4],
    tail: u64,
    ntail: u32,
    len: u64,
}

impl<const C: usize, const D: usize> SipHasher<C, D> {
    pub(crate) fn new(k0: u64, k1: u64) -> Self {
        SipHasher {
            v: [
                k0 ^ 0x736f_6d65_7073_6575,
                k1 ^ 0x646f_7261_6e64_6f6d,
                k0 ^ 0x6c79_6765_6e65_7261,
                k1 ^ 0x7465_6462_7974_6573,
            ],
            tail: 0,
            ntail: 0,
            len: 0,
        }
    }

    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }

    fn compress(&mut self, m: u64) {
        self.v[3] ^= m;
        for _ in 0..C {
            Self::round(&mut self.v);
        }
        self.v[0] ^= m;
    }
}

impl<const C: usize, const D: usize> Hasher for SipHasher<C, D> {
    fn write(&mut self, bytes: &[u8]) {
        let mut rest = bytes;
        // Fill a partial word first, then whole words, then keep the tail.
        while self.ntail != 0 && !rest.is_empty() {
            self.tail |= u64::from(rest[0]) << (8 * self.ntail);
            self.ntail += 1;
            rest = &rest[1..];
            if self.ntail == 8 {
                self.compress(self.tail);
                self.tail = 0;
                self.ntail = 0;
            }
        }
        let mut words = rest.chunks_exact(8);
        for w in &mut words {
            let mut b = [0u8; 8];
            b.copy_from_slice(w);
            self.compress(u64::from_le_bytes(b));
        }
        for (i, &b) in words.remainder().iter().enumerate() {
            self.tail |= u64::from(b) << (8 * i);
        }
        // remainder() is shorter than 8 bytes, and ntail was 0 whenever whole words were read.
        self.ntail += words.remainder().len() as u32;
        self.len = self.len.wrapping_add(bytes.len() as u64);
    }

    fn finish(&self) -> u64 {
        let mut s = *self;
        let b = (s.len & 0xff) << 56 | s.tail;
        s.v[3] ^= b;
        for _ in 0..C {
            Self::round(&mut s.v);
        }
        s.v[0] ^= b;
        s.v[2] ^= 0xff;
        for _ in 0..D {
            Self::round(&mut s.v);
        }
        s.v[0] ^ s.v[1] ^ s.v[2] ^ s.v[3]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_key() -> (u64, u64) {
        let k: [u8; 16] = core::array::from_fn(|i| i as u8);
        let [a, b] = split(k);
        (u64::from_le_bytes(a), u64::from_le_bytes(b))
    }

    /// The paper's Appendix A vector: key 00..0f, message 00..0e, SipHash-2-4.
    #[test]
    fn siphash24_paper_vector() {
        let (k0, k1) = reference_key();
        let msg: Vec<u8> = (0u8..15).collect();
        let mut h = SipHasher::<2, 4>::new(k0, k1);
        h.write(&msg);
        assert_eq!(h.finish(), 0xa129_ca61_49be_45e5);
    }

    /// The reference implementation's `vectors.h` (SipHash-2-4, 64-bit output) for the empty
    /// message and 8 bytes: covers the no-tail and exact-word cases.
    #[test]
    fn siphash24_reference_vectors() {
        let (k0, k1) = reference_key();
        let h = SipHasher::<2, 4>::new(k0, k1);
        assert_eq!(
            h.finish().to_le_bytes(),
            [0x31, 0x0e, 0x0e, 0xdd, 0x47, 0xdb, 0x6f, 0x72]
        );
        let mut h = SipHasher::<2, 4>::new(k0, k1);
        h.write(&[0, 1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(
            h.finish().to_le_bytes(),
            [0x62, 0x24, 0x93, 0x9a, 0x79, 0xf5, 0xf5, 0x93]
        );
    }

    #[test]
    fn streaming_equals_one_shot() {
        let msg: Vec<u8> = (0u8..40).collect();
        let mut one = SipHasher13::new(1, 2);
        one.write(&msg);
        for split_at in 0..msg.len() {
            for second in split_at..msg.len() {
                let mut h = SipHasher13::new(1, 2);
                h.write(&msg[..split_at]);
                h.write(&msg[split_at..second]);
                h.write(&msg[second..]);
                assert_eq!(h.finish(), one.finish(), "{split_at} {second}");
            }
        }
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
