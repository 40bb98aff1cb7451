//! The primitives `snow` runs the handshake with. Randomness without a global RNG: the caller passes
//! 32 bytes of entropy per handshake message (the daemon reads them from the OS, the simulator from
//! a seeded generator), expanded with BLAKE3's extendable output; `snow` draws only the ephemeral
//! private key from it. The DH, cipher and hash objects are `snow`'s own, wrapped so that the keys
//! they copy (static and ephemeral private keys, handshake cipher keys, hash state) are overwritten
//! when the handshake state is dropped: `snow` 0.10 itself never clears them.

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
        let dh = DefaultResolver.resolve_dh(choice)?;
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
}
