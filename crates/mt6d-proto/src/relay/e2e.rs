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
//! Sending ([`seal_e2e`], [`seal_e2e_keepalive`], [`write_e2e`] for a handshake message): the
//! e2e stream's sealer seals for the [`VirtualRoute`] of the epoch exactly as for a route on a
//! wire (its AAD is the virtual addresses and ports), the set's header key masks the result
//! (§4.5), and the tag goes in front. Receiving: [`super::tags::TagIndex`] finds the set and the
//! accept route from the tag, and the payload is then received as a datagram on that route
//! (header protection removed with the set's receive key, classified, opened).

use std::net::SocketAddrV6;

use super::{context, RelayError};
use crate::key::Subkey;
use crate::tunnel::{payload_len, HeaderKey, KEEPALIVE_LEN};
use crate::{Mode, Route, SealError, Sealer, SessionKey};

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

/// A virtual route as its sender uses it (§10.5): the route of the epoch (its addresses and
/// ports go into the AAD and handshake macs only) and the tag of its receiving end. Computed once
/// per epoch and set, not per packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VirtualRoute {
    /// The e2e stream's route of the epoch, as the sender sees it (local = its own virtual end).
    pub route: Route,
    /// The tag of `route.remote` under the set's tag key.
    pub tag: RouteTag,
}

impl VirtualRoute {
    /// The virtual route `route` of a set whose tag key is `key`.
    pub fn new(route: Route, key: &RouteTagKey) -> VirtualRoute {
        VirtualRoute {
            tag: key.tag_to(&route),
            route,
        }
    }
}

/// Bytes of the relay payload [`seal_e2e`] writes for an inner packet of `inner_len` bytes: the
/// route tag and an encrypt-mode tunnel payload (inner packet - 32 + 24).
pub const fn e2e_relay_payload_len(inner_len: usize) -> usize {
    ROUTE_TAG_LEN + payload_len(Mode::Encrypt, inner_len)
}

/// Seals `inner` (one IPv6 packet between the e2e stream's true addresses) for the virtual route
/// `via` with the e2e stream's `sealer` (encrypt mode only), masks its first 8 bytes with the
/// set's send header key `header` (§4.5), and writes the relay payload `routeTag || e2e payload`
/// into `out` (§10.5). Returns its length ([`e2e_relay_payload_len`]). `out` can be the payload
/// area of a frame in the link's send buffer (12 bytes after [`crate::tunnel::FRAME_HEADROOM`]),
/// so that [`super::RelayRepr::emit`] and [`Sealer::seal_frame_in_place`] finish the link payload
/// around it without a copy.
pub fn seal_e2e(
    sealer: &Sealer,
    header: &HeaderKey,
    via: &VirtualRoute,
    inner: &[u8],
    out: &mut [u8],
) -> Result<usize, SealError> {
    seal_tagged(
        sealer,
        header,
        via,
        e2e_relay_payload_len(inner.len()),
        out,
        |body| sealer.seal(&via.route, inner, body),
    )
}

/// [`seal_e2e`] for a keepalive (§9.5): `routeTag || counter || tag`, 32 bytes.
pub fn seal_e2e_keepalive(
    sealer: &Sealer,
    header: &HeaderKey,
    via: &VirtualRoute,
    out: &mut [u8],
) -> Result<usize, SealError> {
    seal_tagged(
        sealer,
        header,
        via,
        ROUTE_TAG_LEN + KEEPALIVE_LEN,
        out,
        |body| sealer.seal_keepalive(&via.route, body),
    )
}

/// What both e2e sealers share: encrypt mode only, `seal` writes the e2e payload behind the
/// route tag, header protection over it, then the tag in front. `need` names the whole length
/// in a too-small buffer's error.
fn seal_tagged(
    sealer: &Sealer,
    header: &HeaderKey,
    via: &VirtualRoute,
    need: usize,
    out: &mut [u8],
    seal: impl FnOnce(&mut [u8]) -> Result<usize, SealError>,
) -> Result<usize, SealError> {
    if sealer.mode() != Mode::Encrypt {
        return Err(SealError::NotEncrypt {
            mode: sealer.mode(),
        });
    }
    let have = out.len();
    let Some((tag, body)) = out.split_first_chunk_mut::<ROUTE_TAG_LEN>() else {
        return Err(SealError::BufferTooSmall { have, need });
    };
    let n = seal(body).map_err(|e| with_tag(e, have))?;
    protect(header, &mut body[..n]);
    *tag = via.tag.0;
    Ok(ROUTE_TAG_LEN + n)
}

/// Writes `tag || payload` into `out`: the relay payload of an end-to-end handshake message
/// (kind `0x02`), framed for the virtual route and header-protected by the handshake's own
/// path ([`crate::link::Link::poll_transmit`]). Returns its length.
pub fn write_e2e(tag: RouteTag, payload: &[u8], out: &mut [u8]) -> Result<usize, RelayError> {
    let need = ROUTE_TAG_LEN + payload.len();
    let have = out.len();
    let Some(out) = out.get_mut(..need) else {
        return Err(RelayError::BufferTooSmall { have, need });
    };
    out[..ROUTE_TAG_LEN].copy_from_slice(&tag.0);
    out[ROUTE_TAG_LEN..].copy_from_slice(payload);
    Ok(need)
}

/// A sealer's buffer error counts the tag's bytes too.
fn with_tag(e: SealError, have: usize) -> SealError {
    match e {
        SealError::BufferTooSmall { need, .. } => SealError::BufferTooSmall {
            have,
            need: need + ROUTE_TAG_LEN,
        },
        e => e,
    }
}

fn protect(header: &HeaderKey, payload: &mut [u8]) {
    // An encrypt-mode payload is at least a keepalive, 24 bytes, the shortest one header
    // protection takes: this cannot fail.
    let masked = header.protect(payload);
    debug_assert!(masked.is_ok());
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

impl<'a> E2ePayload<&'a mut [u8]> {
    /// The e2e payload, writable for the buffer's lifetime: header protection is removed in
    /// place before it is classified and opened (§4.2 step 0).
    pub fn into_payload_mut(self) -> &'a mut [u8] {
        &mut self.buffer[ROUTE_TAG_LEN..]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{addr, udp};
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

    #[test]
    fn e2e_sealing_refuses_other_modes_and_short_buffers() {
        let mut c = crate::testutil::config(Mode::Encrypt, crate::AeadAlg::Aes256Gcm);
        c.local.true_addr = addr("2001:db8:a::1");
        c.remote.true_addr = addr("2001:db8:b::2");
        let a = crate::Stream::new(c).unwrap();
        let via = VirtualRoute::new(a.route(Epoch(3)), &RouteTagKey::derive(&a.config().key));
        let inner = udp(addr("2001:db8:a::1"), addr("2001:db8:b::2"), b"x");
        let sealer = a.sealer(1, u64::MAX);
        let hk = a.send_header_key().unwrap();
        let need = e2e_relay_payload_len(inner.len());
        for have in [0, 7, 8, need - 1] {
            assert_eq!(
                seal_e2e(&sealer, hk, &via, &inner, &mut vec![0u8; have]),
                Err(crate::SealError::BufferTooSmall { have, need })
            );
        }
        assert_eq!(
            seal_e2e_keepalive(&sealer, hk, &via, &mut [0u8; 31]),
            Err(crate::SealError::BufferTooSmall { have: 31, need: 32 })
        );
        let mut c = a.config().clone();
        c.mode = Mode::Auth;
        let auth = crate::Stream::new(c).unwrap();
        assert_eq!(
            seal_e2e(&auth.sealer(1, u64::MAX), hk, &via, &inner, &mut [0u8; 256]),
            Err(crate::SealError::NotEncrypt { mode: Mode::Auth })
        );
        let mut out = [0u8; 64];
        assert_eq!(write_e2e(via.tag, &[1; 40], &mut out), Ok(48));
        assert_eq!(&out[..8], &via.tag.0);
        assert!(write_e2e(via.tag, &[1; 60], &mut out).is_err());
    }
}
