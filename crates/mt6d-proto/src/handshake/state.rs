//! `snow`'s handshake state, kept in one place and overwritten when it is dropped.
//!
//! `snow` 0.10 holds the chaining key `ck`, the handshake hash `h` and a copy of the pre-shared
//! key inline in its `HandshakeState` and never clears them; its DH, cipher and hash objects are
//! ours to wrap ([`super::rng`]), these arrays are not. So the state lives in one heap allocation
//! that never moves (moving a `Pending` moves only the pointer, and no copy is left in a `Vec`'s
//! spare capacity), the pre-shared key enters only once it is there, and dropping it assigns a
//! blank state over it: a responder built from an all-zero key and pre-shared key, whose `ck`
//! and `h` are the protocol name's hash, public. Same type, so every byte of the secret arrays
//! is rewritten; [`std::hint::black_box`] keeps the write from being removed as dead.

use std::ops::{Deref, DerefMut};

use snow::params::NoiseParams;

use super::{rng, NOISE_PARAMS};

/// One handshake's Noise state: boxed, wiped on drop.
pub(super) struct NoiseState(Box<snow::HandshakeState>);

impl NoiseState {
    /// Takes a state built without a pre-shared key and adds `psk` in place.
    pub(super) fn new(state: snow::HandshakeState, psk: &[u8; 32]) -> Result<Self, snow::Error> {
        let mut boxed = NoiseState(Box::new(state));
        boxed.0.set_psk(2, psk)?;
        Ok(boxed)
    }

    fn wipe(&mut self) {
        match blank() {
            Some(blank) => *self.0 = blank,
            // Unreachable with the constant pattern; still clear what the API lets us clear.
            None => {
                let _ = self.0.set_psk(2, &[0u8; 32]);
            }
        }
        std::hint::black_box(&*self.0);
    }
}

/// A responder state from all-zero keys: nothing in it is secret.
fn blank() -> Option<snow::HandshakeState> {
    let params: NoiseParams = NOISE_PARAMS.parse().ok()?;
    snow::Builder::with_resolver(params, Box::new(rng::EntropyResolver::new([0u8; 32])))
        .local_private_key(&[0u8; 32])
        .ok()?
        .psk(2, &[0u8; 32])
        .ok()?
        .build_responder()
        .ok()
}

impl Deref for NoiseState {
    type Target = snow::HandshakeState;
    fn deref(&self) -> &snow::HandshakeState {
        &self.0
    }
}

impl DerefMut for NoiseState {
    fn deref_mut(&mut self) -> &mut snow::HandshakeState {
        &mut self.0
    }
}

impl Drop for NoiseState {
    fn drop(&mut self) {
        self.wipe();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair_with(psk_i: [u8; 32], psk_r: [u8; 32]) -> (NoiseState, NoiseState) {
        let params: NoiseParams = NOISE_PARAMS.parse().unwrap();
        let resolver = |b: u8| Box::new(rng::EntropyResolver::new([b; 32]));
        let (i_priv, r_priv) = ([1u8; 32], [2u8; 32]);
        let r_pub = x25519_dalek::PublicKey::from(&x25519_dalek::StaticSecret::from(r_priv));
        let i = snow::Builder::with_resolver(params.clone(), resolver(3))
            .local_private_key(&i_priv)
            .unwrap()
            .remote_public_key(r_pub.as_bytes())
            .unwrap()
            .build_initiator()
            .unwrap();
        let r = snow::Builder::with_resolver(params, resolver(4))
            .local_private_key(&r_priv)
            .unwrap()
            .build_responder()
            .unwrap();
        (
            NoiseState::new(i, &psk_i).unwrap(),
            NoiseState::new(r, &psk_r).unwrap(),
        )
    }

    fn pair() -> (NoiseState, NoiseState) {
        pair_with([9u8; 32], [9u8; 32])
    }

    /// Runs the exchange; Err if the initiator cannot read the response.
    fn exchange(i: &mut NoiseState, r: &mut NoiseState) -> Result<(), snow::Error> {
        let (mut m, mut p) = ([0u8; 256], [0u8; 256]);
        let n = i.write_message(&[], &mut m)?;
        r.read_message(&m[..n], &mut p)?;
        let n = r.write_message(&[], &mut m)?;
        i.read_message(&m[..n], &mut p)?;
        Ok(())
    }

    #[test]
    fn the_pre_shared_key_added_in_place_is_used() {
        let (mut i, mut r) = pair();
        exchange(&mut i, &mut r).unwrap();
        assert_eq!(i.get_handshake_hash(), r.get_handshake_hash());
        // IKpsk2 mixes the pre-shared key in at the end of the response: with different keys the
        // initiator refuses the response.
        let (mut i, mut r) = pair_with([9u8; 32], [8u8; 32]);
        assert!(exchange(&mut i, &mut r).is_err());
    }

    #[test]
    fn a_wiped_state_holds_only_the_public_initial_hash() {
        let (mut i, mut r) = pair();
        let initial = blank().unwrap().get_handshake_hash().to_vec();
        exchange(&mut i, &mut r).unwrap();
        let secret = i.get_handshake_hash().to_vec();
        assert_ne!(secret, initial);
        let at = std::ptr::addr_of!(*i.0);
        i.wipe();
        assert_eq!(at, std::ptr::addr_of!(*i.0), "wiped in place");
        assert_eq!(i.get_handshake_hash(), &initial[..]);
        assert!(
            !i.is_handshake_finished(),
            "a fresh state, not the finished one"
        );
    }
}
