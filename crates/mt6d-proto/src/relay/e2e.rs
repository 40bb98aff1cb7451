//! The end-to-end layer's prefix: the route tag (docs/PROTOCOL.md §10.5).
//!
//! ```text
//! relay payload (kinds 0x01, 0x02) = routeTag (8) || e2e payload (>= 24)
//! tagKey(set) = BLAKE3-derive_key("mt6d-proto 2026-12-02 relay route tag key", setKey)
//! routeTag    = BLAKE3-keyed(tagKey(set), remoteAddr(16) || remotePort(2))[0..8]
//! ```
//! The end-to-end stream of two edge gateways computes its routes as a direct stream would, but
//! its routes are *virtual*: their addresses and ports only enter the AAD (§4.1), the handshake
//! macs (§9.3) and this tag. A direct receiver finds its peer, set and epoch from the address and
//! port a packet arrived on; over relays the tag of the receiver's virtual (address, port) stands
//! in for them. It is keyed so that no one without the set key can match it to the virtual
//! address, and, like a hashed address, it changes every epoch.
//!
//! Not yet implemented: the receiver's table from tags to (stream, set, route) and the sealing
//! of e2e payloads for virtual routes (§10.13); this module gives both sides the same tag.

use std::net::SocketAddrV6;

use super::{context, RelayError};
use crate::key::Subkey;
use crate::{Route, SessionKey};

/// Bytes of a route tag.
pub const ROUTE_TAG_LEN: usize = 8;
/// The shortest e2e payload: a keepalive (counter 8, tag 16; §9.5).
pub const MIN_E2E_PAYLOAD: usize = 24;

/// The 8-byte name of one virtual route's receiving end for one epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RouteTag(pub [u8; ROUTE_TAG_LEN]);

/// The tag key of one route set (§9.8: the stream's link key, or a session's route key `K(X)`).
#[derive(Debug, Clone)]
pub struct RouteTagKey(Subkey);

impl RouteTagKey {
    /// Derives the tag key from the set's key.
    pub fn derive(set_key: &SessionKey) -> RouteTagKey {
        RouteTagKey(Subkey::derive(context::ROUTE_TAG, set_key))
    }
    /// The tag of the receiving end (`receiver`: its virtual address and port).
    pub fn tag(&self, receiver: &SocketAddrV6) -> RouteTag {
        let mut h = blake3::Hasher::new_keyed(self.0.as_bytes());
        h.update(&receiver.ip().octets());
        h.update(&receiver.port().to_be_bytes());
        let mut t = [0u8; ROUTE_TAG_LEN];
        t.copy_from_slice(&h.finalize().as_bytes()[..ROUTE_TAG_LEN]);
        RouteTag(t)
    }
    /// The tag a sender puts on a payload sealed for `route` (its remote end).
    pub fn tag_to(&self, route: &Route) -> RouteTag {
        self.tag(&route.remote)
    }
    /// The tag under which a receiver finds `route` of its accept window (its local end).
    pub fn tag_from(&self, route: &Route) -> RouteTag {
        self.tag(&route.local)
    }
}

/// A checked view of a forwarded frame's relay payload at its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct E2ePayload<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> E2ePayload<T> {
    /// Checks the length: a route tag and at least a keepalive.
    pub fn new_checked(buffer: T) -> Result<Self, RelayError> {
        let have = buffer.as_ref().len();
        let need = ROUTE_TAG_LEN + MIN_E2E_PAYLOAD;
        if have < need {
            return Err(RelayError::Truncated {
                what: "end-to-end payload",
                have,
                need,
            });
        }
        Ok(Self { buffer })
    }
    /// The route tag.
    pub fn tag(&self) -> RouteTag {
        let mut t = [0u8; ROUTE_TAG_LEN];
        t.copy_from_slice(&self.buffer.as_ref()[..ROUTE_TAG_LEN]);
        RouteTag(t)
    }
    /// The e2e payload (header-protected, §4.5): what §4.2 receives from step 0.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[ROUTE_TAG_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Epoch;

    fn key(b: u8) -> SessionKey {
        SessionKey::from_derived(&[b; 32])
    }
    fn sa(s: &str, port: u16) -> SocketAddrV6 {
        SocketAddrV6::new(s.parse().unwrap(), port, 0, 0)
    }

    #[test]
    fn sender_and_receiver_agree_and_the_tag_depends_on_everything() {
        let k = RouteTagKey::derive(&key(1));
        let a = sa("2001:db8:a::7", 4000);
        let b = sa("2001:db8:b::9", 5000);
        let sent = Route {
            epoch: Epoch(1),
            local: a,
            remote: b,
        };
        let received = Route {
            epoch: Epoch(1),
            local: b,
            remote: a,
        };
        assert_eq!(k.tag_to(&sent), k.tag_from(&received));
        assert_ne!(k.tag_to(&sent), k.tag_to(&received), "per direction");
        assert_ne!(k.tag(&b), k.tag(&sa("2001:db8:b::9", 5001)), "port");
        assert_ne!(k.tag(&b), k.tag(&sa("2001:db8:b::8", 5000)), "address");
        assert_ne!(
            k.tag(&b),
            RouteTagKey::derive(&key(2)).tag(&b),
            "another set's key"
        );
        assert!(!format!("{k:?}").contains("01"), "key redacted");
    }

    #[test]
    fn payload_view() {
        let mut buf = vec![7u8; 8];
        buf.extend([9u8; 24]);
        let p = E2ePayload::new_checked(&buf[..]).unwrap();
        assert_eq!(p.tag(), RouteTag([7; 8]));
        assert_eq!(p.payload(), &[9u8; 24][..]);
        for n in 0..32 {
            assert!(matches!(
                E2ePayload::new_checked(&buf[..n]),
                Err(RelayError::Truncated { .. })
            ));
        }
    }
}
