//! The route-bound MAC on handshake messages (docs/PROTOCOL.md §9.3): its key, one per route
//! set (§9.8), and the stateless check a server makes before it keeps any state for a client.

use zeroize::Zeroizing;

use super::message::{Kind, Message, INITIATION_LEN, RESPONSE_LEN};

use super::message::{frame, NOISE_INITIATION_LEN, NOISE_RESPONSE_LEN};
use super::Handshake;
use crate::{Route, SessionKey};

/// The key of the route-bound MAC on handshake messages (docs/PROTOCOL.md §9.3), one per route
/// set (§9.8): a message travels on a route of one set and carries that set's MAC.
#[derive(Clone)]
pub struct MacKey(pub(super) Zeroizing<[u8; 32]>);

impl MacKey {
    /// The MAC key of the route set keyed by `key` (the link key, or a session's route key).
    pub fn derive(key: &SessionKey) -> MacKey {
        MacKey(Zeroizing::new(blake3::derive_key(
            super::identity::context::MAC,
            key.as_bytes(),
        )))
    }
}

impl std::fmt::Debug for MacKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MacKey([redacted])")
    }
}

/// Whether `bytes` (header protection removed) is a well-formed handshake message carrying a
/// valid MAC of the link set keyed by `link` for the route it `arrived_on` (§9.3): one BLAKE3,
/// no state. Lets a server with a million idle clients keep no handshake state for a client
/// until one of its messages proves to come from a holder of the link key.
pub fn verify_link_mac(link: &SessionKey, arrived_on: &Route, bytes: &[u8]) -> bool {
    let Ok(msg) = Message::new_checked(bytes) else {
        return false;
    };
    let key = MacKey::derive(link);
    msg.verify_mac(&key.0, &arrived_on.remote, &arrived_on.local)
        .is_ok()
}

impl Handshake {
    /// Frames arbitrary Noise bytes as a message of `kind` with `index` from `src` to `dst` with
    /// this pair's valid MAC: for fuzzing and tests, which must reach the Noise layer behind the
    /// MAC. The bytes are cut or zero-padded to the kind's Noise length.
    pub fn frame_with_mac(
        &self,
        kind: Kind,
        index: u32,
        noise: &[u8],
        src: &std::net::SocketAddrV6,
        dst: &std::net::SocketAddrV6,
    ) -> Vec<u8> {
        let (len, noise_len) = match kind {
            Kind::Initiation => (INITIATION_LEN, NOISE_INITIATION_LEN),
            Kind::Response => (RESPONSE_LEN, NOISE_RESPONSE_LEN),
        };
        let mut body = vec![0u8; noise_len];
        let n = noise.len().min(noise_len);
        body[..n].copy_from_slice(&noise[..n]);
        let mut out = vec![0u8; len];
        frame(kind, index, &body, &self.mac_key.0, src, dst, &mut out);
        out
    }
}
