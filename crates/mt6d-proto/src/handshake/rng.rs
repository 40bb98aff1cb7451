//! The primitives `snow` runs the handshake with. Randomness without a global RNG: the caller passes
//! 32 bytes of entropy per handshake message (the daemon reads them from the OS, the simulator from
//! a seeded generator), expanded with BLAKE3's extendable output; `snow` draws only the ephemeral
//! private key from it. The cipher and hash objects are `snow`'s own, wrapped so that the keys
//! they copy (handshake cipher keys, hash state) are overwritten when the handshake state is
//! dropped: `snow` 0.10 itself never clears them. X25519 is AWS-LC's (`aws-lc-rs`, already the
//! data path's AES-GCM): the same function as `snow`'s default (curve25519-dalek's Montgomery
//! ladder, 70 % of a responder's time), 25 us against 38 us here (`cargo bench -p mt6d-proto
//! --bench proto -- handshake/x25519`), and a responder computes five of them per handshake.

use snow::params::{CipherChoice, DHChoice, HashChoice};
use snow::resolvers::{CryptoResolver, DefaultResolver};
use snow::types::{Cipher, Dh, Hash, Random};

/// A [`CryptoResolver`] that is `snow`'s default for the primitives and our entropy for the RNG.
pub(crate) struct EntropyResolver {
    entropy: [u8; 32],
}

impl EntropyResolver {
    pub(crate) fn new(entropy: [u8; 32]) -> Self {
        Self { entropy }
    }
}

impl Drop for EntropyResolver {
    fn drop(&mut self) {
        zeroize::Zeroize::zeroize(&mut self.entropy);
    }
}

struct XofRandom(blake3::OutputReader);

impl Random for XofRandom {
    fn try_fill_bytes(&mut self, dest: &mut [u8]) -> Result<(), snow::Error> {
        self.0.fill(dest);
        Ok(())
    }
}

impl CryptoResolver for EntropyResolver {
    fn resolve_rng(&self) -> Option<Box<dyn Random>> {
        let reader = blake3::Hasher::new_derive_key("mt6d-proto 2026-11-21 handshake rng")
            .update(&self.entropy)
            .finalize_xof();
        Some(Box::new(XofRandom(reader)))
    }
    fn resolve_dh(&self, choice: &DHChoice) -> Option<Box<dyn Dh>> {
        let dh: Box<dyn Dh> = match choice {
            DHChoice::Curve25519 => Box::new(AwsLcX25519::default()),
            other => DefaultResolver.resolve_dh(other)?,
        };
        Some(Box::new(WipedDh(dh)))
    }
    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        let h = DefaultResolver.resolve_hash(choice)?;
        Some(Box::new(WipedHash(h)))
    }
    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        let c = DefaultResolver.resolve_cipher(choice)?;
        Some(Box::new(WipedCipher(c)))
    }
}

/// X25519 (RFC 7748) by AWS-LC, as `snow`'s `Dh`. The private key is zeroized on drop. A
/// shared secret of all zeros (a low-order public key) is refused as `snow::Error::Dh`, where
/// `snow`'s default would carry on with it.
#[derive(Default)]
struct AwsLcX25519 {
    privkey: zeroize::Zeroizing<[u8; 32]>,
    pubkey: [u8; 32],
}

impl AwsLcX25519 {
    fn key(&self) -> Result<aws_lc_rs::agreement::PrivateKey, snow::Error> {
        aws_lc_rs::agreement::PrivateKey::from_private_key(
            &aws_lc_rs::agreement::X25519,
            &self.privkey[..],
        )
        .map_err(|_| snow::Error::Dh)
    }

    fn derive_pubkey(&mut self) {
        self.pubkey = self
            .key()
            .ok()
            .and_then(|k| k.compute_public_key().ok())
            .and_then(|p| <[u8; 32]>::try_from(p.as_ref()).ok())
            .unwrap_or([0; 32]);
    }
}

impl Dh for AwsLcX25519 {
    fn name(&self) -> &'static str {
        "25519"
    }
    fn pub_len(&self) -> usize {
        32
    }
    fn priv_len(&self) -> usize {
        32
    }
    fn set(&mut self, privkey: &[u8]) {
        let n = privkey.len().min(32);
        self.privkey.fill(0);
        self.privkey[..n].copy_from_slice(&privkey[..n]);
        self.derive_pubkey();
    }
    fn generate(&mut self, rng: &mut dyn Random) -> Result<(), snow::Error> {
        rng.try_fill_bytes(&mut self.privkey[..])?;
        self.derive_pubkey();
        Ok(())
    }
    fn pubkey(&self) -> &[u8] {
        &self.pubkey
    }
    fn privkey(&self) -> &[u8] {
        &self.privkey[..]
    }
    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        let (Some(peer), Some(out)) = (pubkey.get(..32), out.get_mut(..32)) else {
            return Err(snow::Error::Dh);
        };
        let key = self.key()?;
        aws_lc_rs::agreement::agree(
            &key,
            aws_lc_rs::agreement::UnparsedPublicKey::new(&aws_lc_rs::agreement::X25519, peer),
            snow::Error::Dh,
            |secret| {
                out.copy_from_slice(secret);
                Ok(())
            },
        )
    }
}

/// A DH object whose private key is overwritten with zeros when it is dropped (setting an all-zero
/// private key replaces `snow`'s copy in place).
struct WipedDh(Box<dyn Dh>);

impl WipedDh {
    fn wipe(&mut self) {
        let zeros = [0u8; 56];
        let n = self.0.priv_len().min(zeros.len());
        self.0.set(&zeros[..n]);
    }
}

impl Drop for WipedDh {
    fn drop(&mut self) {
        self.wipe();
    }
}

impl Dh for WipedDh {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn pub_len(&self) -> usize {
        self.0.pub_len()
    }
    fn priv_len(&self) -> usize {
        self.0.priv_len()
    }
    fn set(&mut self, privkey: &[u8]) {
        self.0.set(privkey);
    }
    fn generate(&mut self, rng: &mut dyn Random) -> Result<(), snow::Error> {
        self.0.generate(rng)
    }
    fn pubkey(&self) -> &[u8] {
        self.0.pubkey()
    }
    fn privkey(&self) -> &[u8] {
        self.0.privkey()
    }
    fn dh(&self, pubkey: &[u8], out: &mut [u8]) -> Result<(), snow::Error> {
        self.0.dh(pubkey, out)
    }
    fn dh_len(&self) -> usize {
        self.0.dh_len()
    }
}

/// A cipher whose key is overwritten with zeros when it is dropped.
struct WipedCipher(Box<dyn Cipher>);

impl Drop for WipedCipher {
    fn drop(&mut self) {
        self.0.set(&[0u8; 32]);
    }
}

impl Cipher for WipedCipher {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn set(&mut self, key: &[u8; 32]) {
        self.0.set(key);
    }
    fn encrypt(&self, nonce: u64, authtext: &[u8], plaintext: &[u8], out: &mut [u8]) -> usize {
        self.0.encrypt(nonce, authtext, plaintext, out)
    }
    fn decrypt(
        &self,
        nonce: u64,
        authtext: &[u8],
        ciphertext: &[u8],
        out: &mut [u8],
    ) -> Result<usize, snow::Error> {
        self.0.decrypt(nonce, authtext, ciphertext, out)
    }
    fn rekey(&mut self) {
        self.0.rekey();
    }
}

/// A hash whose state (HMAC keys pass through it: the chaining key) is reset when dropped.
struct WipedHash(Box<dyn Hash>);

impl Drop for WipedHash {
    fn drop(&mut self) {
        self.0.reset();
    }
}

impl Hash for WipedHash {
    fn name(&self) -> &'static str {
        self.0.name()
    }
    fn block_len(&self) -> usize {
        self.0.block_len()
    }
    fn hash_len(&self) -> usize {
        self.0.hash_len()
    }
    fn reset(&mut self) {
        self.0.reset();
    }
    fn input(&mut self, data: &[u8]) {
        self.0.input(data);
    }
    fn result(&mut self, out: &mut [u8]) {
        self.0.result(out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dh_and_cipher_keys_are_overwritten() {
        let r = EntropyResolver::new([1; 32]);
        let mut dh = WipedDh(DefaultResolver.resolve_dh(&DHChoice::Curve25519).unwrap());
        dh.set(&[7; 32]);
        assert_eq!(dh.privkey(), &[7; 32]);
        dh.wipe();
        assert_eq!(dh.privkey(), &[0; 32]);
        // The resolver hands out wrapped objects.
        assert!(r.resolve_dh(&DHChoice::Curve25519).is_some());
        assert!(r.resolve_cipher(&CipherChoice::ChaChaPoly).is_some());
        assert!(r.resolve_hash(&HashChoice::Blake2s).is_some());
    }

    #[test]
    fn aws_lc_x25519_is_the_same_function_as_snows_default() {
        let mut seed = blake3::Hasher::new_derive_key("mt6d-proto test x25519").finalize_xof();
        for _ in 0..50 {
            let (mut a, mut b) = ([0u8; 32], [0u8; 32]);
            seed.fill(&mut a);
            seed.fill(&mut b);
            let mut ours = AwsLcX25519::default();
            let mut theirs = DefaultResolver.resolve_dh(&DHChoice::Curve25519).unwrap();
            ours.set(&a);
            theirs.set(&a);
            assert_eq!(ours.pubkey(), theirs.pubkey());
            let mut peer = DefaultResolver.resolve_dh(&DHChoice::Curve25519).unwrap();
            peer.set(&b);
            let (mut x, mut y) = ([0u8; 32], [0u8; 32]);
            ours.dh(peer.pubkey(), &mut x).unwrap();
            theirs.dh(peer.pubkey(), &mut y).unwrap();
            assert_eq!(x, y);
        }
        // RFC 7748 §6.1's Alice and Bob.
        let hex = |s: &str| -> [u8; 32] {
            let v: Vec<u8> = (0..32)
                .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
                .collect();
            v.try_into().unwrap()
        };
        let mut alice = AwsLcX25519::default();
        alice.set(&hex(
            "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a",
        ));
        assert_eq!(
            alice.pubkey(),
            &hex("8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a")
        );
        let mut shared = [0u8; 32];
        alice
            .dh(
                &hex("de9edb7d7b7dc1b4d35b61c2ece435373f8343c85b78674dadfc7e146f882b4f"),
                &mut shared,
            )
            .unwrap();
        assert_eq!(
            shared,
            hex("4a5d9d5ba4ce2de1728e3bf480350f25e07e21c947d19e3376f09b3c1e161742")
        );
        // A low-order point is refused, not turned into an all-zero secret.
        assert!(alice.dh(&[0u8; 32], &mut shared).is_err());
        assert!(alice.dh(&[0u8; 31], &mut shared).is_err());
    }
}
