//! Randomness for `snow` without a global RNG: the caller passes 32 bytes of entropy per handshake
//! message (the daemon reads them from the OS, the simulator from a seeded generator), expanded with
//! BLAKE3's extendable output. `snow` draws only the ephemeral private key from it.

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
        DefaultResolver.resolve_dh(choice)
    }
    fn resolve_hash(&self, choice: &HashChoice) -> Option<Box<dyn Hash>> {
        DefaultResolver.resolve_hash(choice)
    }
    fn resolve_cipher(&self, choice: &CipherChoice) -> Option<Box<dyn Cipher>> {
        DefaultResolver.resolve_cipher(choice)
    }
}
