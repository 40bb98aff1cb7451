//! The data path's AEAD key schedules, overwritten when they are dropped.
//!
//! `ring` (the fastest AEAD here: AES-256-GCM seals 1400 bytes in about a third of the time the
//! RustCrypto crates take on this CPU) never clears its key schedules, and this crate may not use
//! `unsafe` to clear memory it does not own. So each schedule lives in one heap allocation of its
//! own that never moves, and dropping it first assigns the schedule of the all-zero key of the
//! same algorithm over it: same type, same variant, so every byte of the old round keys (and of
//! the GHASH or Poly1305 key material) is replaced by values anyone can compute. The write is
//! kept from being removed as a dead store by [`std::hint::black_box`]. Both the schedule and its
//! replacement are built on stack that [`crate::secrets::scrub_stack`] has just zeroed, so the
//! bytes a ChaCha20 schedule leaves unused carry no stale stack contents into the heap; the
//! copies the build leaves on the stack are cleared after key installation.

use std::fmt;
use std::ops::Deref;

use ring::aead::{self, LessSafeKey, UnboundKey};

use crate::AeadAlg;

/// One direction's AEAD key schedule, boxed so it never moves, overwritten on drop.
pub(crate) struct AeadKey {
    alg: AeadAlg,
    schedule: Box<LessSafeKey>,
}

impl AeadKey {
    pub(crate) fn new(alg: AeadAlg, key: &[u8; 32]) -> AeadKey {
        // The ChaCha20 variant of `ring`'s key enum is smaller than the AES one: the bytes it does
        // not use are copied from whatever the stack held where the schedule was built, which
        // can be another key. Building it on freshly zeroed stack keeps them zero.
        crate::secrets::scrub_stack();
        AeadKey {
            alg,
            schedule: boxed_schedule(alg, key),
        }
    }

    /// Replaces the schedule in place by the all-zero key's (public) schedule, built on zeroed
    /// stack for the reason given in [`AeadKey::new`].
    fn wipe(&mut self) {
        crate::secrets::scrub_stack();
        overwrite(&mut self.schedule, self.alg);
        std::hint::black_box(&*self.schedule);
    }
}

#[inline(never)]
fn boxed_schedule(alg: AeadAlg, key: &[u8; 32]) -> Box<LessSafeKey> {
    Box::new(schedule(alg, key))
}

#[inline(never)]
fn overwrite(slot: &mut LessSafeKey, alg: AeadAlg) {
    *slot = schedule(alg, &[0u8; 32]);
}

fn schedule(alg: AeadAlg, key: &[u8; 32]) -> LessSafeKey {
    let algorithm = match alg {
        AeadAlg::Aes256Gcm => &aead::AES_256_GCM,
        AeadAlg::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
    };
    // Both algorithms take 32-byte keys, so this cannot fail.
    #[allow(clippy::expect_used)]
    let unbound = UnboundKey::new(algorithm, key).expect("32-byte key for a 256-bit AEAD");
    LessSafeKey::new(unbound)
}

impl Deref for AeadKey {
    type Target = LessSafeKey;
    fn deref(&self) -> &LessSafeKey {
        &self.schedule
    }
}

impl Drop for AeadKey {
    fn drop(&mut self) {
        self.wipe();
    }
}

impl fmt::Debug for AeadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "AeadKey({:?}, [redacted])", self.alg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::aead::{Aad, Nonce};

    fn seal(key: &LessSafeKey) -> Vec<u8> {
        let mut buf = b"sixteen byte msg".to_vec();
        let tag = key
            .seal_in_place_separate_tag(
                Nonce::assume_unique_for_key([7u8; 12]),
                Aad::from(b"aad"),
                &mut buf,
            )
            .unwrap();
        buf.extend_from_slice(tag.as_ref());
        buf
    }

    #[test]
    fn a_wiped_key_holds_the_all_zero_keys_schedule() {
        for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            let mut key = AeadKey::new(alg, &[0x5a; 32]);
            let at = std::ptr::addr_of!(*key.schedule);
            let before = seal(&key);
            assert_eq!(before, seal(&schedule(alg, &[0x5a; 32])), "{alg:?}");
            key.wipe();
            // Same allocation, now sealing exactly as the public all-zero key does.
            assert_eq!(at, std::ptr::addr_of!(*key.schedule));
            assert_eq!(seal(&key), seal(&schedule(alg, &[0u8; 32])), "{alg:?}");
            assert_ne!(seal(&key), before);
        }
    }

    #[test]
    fn debug_names_the_algorithm_only() {
        let key = AeadKey::new(AeadAlg::ChaCha20Poly1305, &[1u8; 32]);
        assert_eq!(format!("{key:?}"), "AeadKey(ChaCha20Poly1305, [redacted])");
    }
}
