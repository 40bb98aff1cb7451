//! The data path's AEAD keys: which implementation a (mode, algorithm) uses, the one seal/open
//! interface the tunnel calls, and key schedules overwritten when they are dropped.
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
//!
//! **Auth mode with AES-256-GCM uses `aws-lc-rs` instead.** Its tag covers the whole packet as
//! AAD (docs/PROTOCOL.md §4.1), and ring 0.17 hashes AAD one 16-byte block per call into its
//! one-block GHASH (the aggregated multi-block GHASH and the stitched AES-GCM code serve only
//! the ciphertext), so an auth seal of 1,400 bytes took about 900 ns against about 300 ns for
//! an encrypt seal. AWS-LC hashes AAD with its multi-block GHASH: about 220 ns for the same
//! input. Same algorithm, same bytes on the wire (the tests below compare the two). Its key
//! schedule lives in memory AWS-LC allocated itself, and freeing it (`EVP_AEAD_CTX_free`, then
//! `OPENSSL_free`, which clears the allocation before it frees it) overwrites it, so it needs
//! no wipe of ours. Everything else stays on ring, which is as fast or faster there
//! (ChaCha20-Poly1305 hashes AAD and ciphertext alike).

use std::fmt;

use ring::aead::{self, LessSafeKey, UnboundKey};

use super::{nonce_bytes, TAG_LEN};
use crate::{AeadAlg, Mode};

/// The AEAD tag did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadTag;

/// One direction's AEAD key schedule, overwritten (or freed cleared) on drop.
pub(crate) struct AeadKey {
    alg: AeadAlg,
    schedule: Schedule,
}

enum Schedule {
    /// Boxed so it never moves: wiped in place on drop.
    Ring(Box<LessSafeKey>),
    /// AES-256-GCM for auth mode (module doc).
    AwsLc(aws_lc_rs::aead::LessSafeKey),
}

impl AeadKey {
    /// The key of `alg` under `key` for a stream in `mode` (auth and encrypt; the mode picks the
    /// implementation, never the bytes it produces).
    pub(crate) fn new(mode: Mode, alg: AeadAlg, key: &[u8; 32]) -> AeadKey {
        // The ChaCha20 variant of `ring`'s key enum is smaller than the AES one: the bytes it does
        // not use are copied from whatever the stack held where the schedule was built, which
        // can be another key. Building it on freshly zeroed stack keeps them zero.
        crate::secrets::scrub_stack();
        let schedule = match (mode, alg) {
            (Mode::Auth, AeadAlg::Aes256Gcm) => Schedule::AwsLc(aws_lc_schedule(key)),
            _ => Schedule::Ring(boxed_schedule(alg, key)),
        };
        AeadKey { alg, schedule }
    }

    /// Seals `in_out` in place under the nonce of `counter` (§4.1) and returns the tag.
    pub(crate) fn seal(&self, counter: u64, aad: &[u8], in_out: &mut [u8]) -> [u8; TAG_LEN] {
        let n = nonce_bytes(counter);
        let mut t = [0u8; TAG_LEN];
        // Both libraries fail only if the input exceeds the AEAD's per-nonce limit (2^36 bytes
        // for GCM); IPv6 packets are below 2^16 bytes.
        #[allow(clippy::expect_used)]
        match &self.schedule {
            Schedule::Ring(k) => t.copy_from_slice(
                k.seal_in_place_separate_tag(
                    aead::Nonce::assume_unique_for_key(n),
                    aead::Aad::from(aad),
                    in_out,
                )
                .expect("IPv6 packet within AEAD length limit")
                .as_ref(),
            ),
            Schedule::AwsLc(k) => t.copy_from_slice(
                k.seal_in_place_separate_tag(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(n),
                    aws_lc_rs::aead::Aad::from(aad),
                    in_out,
                )
                .expect("IPv6 packet within AEAD length limit")
                .as_ref(),
            ),
        }
        t
    }

    /// Verifies `tag` and decrypts `in_out` in place (nonce of `counter`, §4.1). On failure
    /// `in_out` may have been overwritten.
    pub(crate) fn open(
        &self,
        counter: u64,
        aad: &[u8],
        tag: &[u8; TAG_LEN],
        in_out: &mut [u8],
    ) -> Result<(), BadTag> {
        let n = nonce_bytes(counter);
        match &self.schedule {
            Schedule::Ring(k) => k
                .open_in_place_separate_tag(
                    aead::Nonce::assume_unique_for_key(n),
                    aead::Aad::from(aad),
                    aead::Tag::from(*tag),
                    in_out,
                    0..,
                )
                .map(|_| ())
                .map_err(|_| BadTag),
            Schedule::AwsLc(k) => k
                .open_in_place_separate_tag(
                    aws_lc_rs::aead::Nonce::assume_unique_for_key(n),
                    aws_lc_rs::aead::Aad::from(aad),
                    tag,
                    in_out,
                )
                .map(|_| ())
                .map_err(|_| BadTag),
        }
    }

    /// Replaces a ring schedule in place by the all-zero key's (public) schedule, built on zeroed
    /// stack for the reason given in [`AeadKey::new`]. AWS-LC clears its own when it frees it.
    fn wipe(&mut self) {
        if let Schedule::Ring(k) = &mut self.schedule {
            crate::secrets::scrub_stack();
            overwrite(k, self.alg);
            std::hint::black_box(&**k);
        }
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

#[inline(never)]
fn aws_lc_schedule(key: &[u8; 32]) -> aws_lc_rs::aead::LessSafeKey {
    // A 32-byte key for AES-256-GCM: cannot fail.
    #[allow(clippy::expect_used)]
    let unbound = aws_lc_rs::aead::UnboundKey::new(&aws_lc_rs::aead::AES_256_GCM, key)
        .expect("32-byte key for AES-256-GCM");
    aws_lc_rs::aead::LessSafeKey::new(unbound)
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

    fn seal(key: &AeadKey) -> Vec<u8> {
        let mut buf = b"sixteen byte msg".to_vec();
        let tag = key.seal(7, b"aad", &mut buf);
        buf.extend_from_slice(&tag);
        buf
    }

    fn ring_schedule(key: &AeadKey) -> *const LessSafeKey {
        match &key.schedule {
            Schedule::Ring(k) => std::ptr::addr_of!(**k),
            Schedule::AwsLc(_) => panic!("not a ring schedule"),
        }
    }

    #[test]
    fn a_wiped_key_holds_the_all_zero_keys_schedule() {
        for alg in [AeadAlg::Aes256Gcm, AeadAlg::ChaCha20Poly1305] {
            let mut key = AeadKey::new(Mode::Encrypt, alg, &[0x5a; 32]);
            let at = ring_schedule(&key);
            let before = seal(&key);
            let zero = AeadKey::new(Mode::Encrypt, alg, &[0u8; 32]);
            assert_ne!(before, seal(&zero), "{alg:?}");
            key.wipe();
            // Same allocation, now sealing exactly as the public all-zero key does.
            assert_eq!(at, ring_schedule(&key));
            assert_eq!(seal(&key), seal(&zero), "{alg:?}");
        }
    }

    #[test]
    fn only_auth_mode_aes_gcm_uses_aws_lc() {
        for (mode, alg, aws) in [
            (Mode::Auth, AeadAlg::Aes256Gcm, true),
            (Mode::Auth, AeadAlg::ChaCha20Poly1305, false),
            (Mode::Encrypt, AeadAlg::Aes256Gcm, false),
            (Mode::Encrypt, AeadAlg::ChaCha20Poly1305, false),
        ] {
            let key = AeadKey::new(mode, alg, &[3; 32]);
            assert_eq!(
                matches!(key.schedule, Schedule::AwsLc(_)),
                aws,
                "{mode} {alg:?}"
            );
        }
    }

    /// The two libraries are interchangeable on the wire: byte-identical ciphertext and tag for
    /// every AAD and input length around the 16-byte block edges and up to a jumbo packet, each
    /// opens what the other sealed, and a changed AAD byte is refused by both.
    #[test]
    fn aws_lc_and_ring_aes_gcm_are_the_same_bytes() {
        let k: [u8; 32] = core::array::from_fn(|i| i as u8 ^ 0xa5);
        let ring_key = AeadKey::new(Mode::Encrypt, AeadAlg::Aes256Gcm, &k);
        let aws_key = AeadKey::new(Mode::Auth, AeadAlg::Aes256Gcm, &k);
        let data: Vec<u8> = (0..9100u32).map(|i| (i * 31 + 7) as u8).collect();
        for aad_len in [0, 1, 15, 16, 17, 44, 52, 100, 1424, 1436, 1444, 9044] {
            for in_len in [0, 1, 16, 100] {
                let counter = (aad_len * 1000 + in_len) as u64 | 1 << 62;
                let aad = &data[..aad_len];
                let mut a = data[..in_len].to_vec();
                let mut b = a.clone();
                let ta = ring_key.seal(counter, aad, &mut a);
                let tb = aws_key.seal(counter, aad, &mut b);
                assert_eq!((&a, ta), (&b, tb), "aad {aad_len} in {in_len}");
                for (opener, sealed) in [(&aws_key, &a), (&ring_key, &b)] {
                    let mut ct = sealed.clone();
                    assert_eq!(opener.open(counter, aad, &ta, &mut ct), Ok(()));
                    assert_eq!(ct, &data[..in_len]);
                    if aad_len > 0 {
                        let mut bad = aad.to_vec();
                        bad[aad_len / 2] ^= 0x10;
                        let mut ct = sealed.clone();
                        assert_eq!(opener.open(counter, &bad, &ta, &mut ct), Err(BadTag));
                    }
                    let mut ct = sealed.clone();
                    assert_eq!(opener.open(counter + 1, aad, &ta, &mut ct), Err(BadTag));
                }
            }
        }
    }

    #[test]
    fn debug_names_the_algorithm_only() {
        let key = AeadKey::new(Mode::Auth, AeadAlg::ChaCha20Poly1305, &[1u8; 32]);
        assert_eq!(format!("{key:?}"), "AeadKey(ChaCha20Poly1305, [redacted])");
        let key = AeadKey::new(Mode::Auth, AeadAlg::Aes256Gcm, &[1u8; 32]);
        assert_eq!(format!("{key:?}"), "AeadKey(Aes256Gcm, [redacted])");
    }
}
