//! A relay node's receive gate: a read-only copy of what a link payload's first steps need (every
//! link's accept routes, their route sets' header keys, the link keys that alone decide whether
//! a payload opens), so that a driver whose workers share the node behind a lock can refuse
//! junk and forgeries, and open the rest, before it takes that lock (docs/ARCHITECTURE.md
//! "Relays").
//!
//! What it owns: nothing that changes. [`RelayNode::rx_gate`] makes it, and it is current until
//! [`RelayNode::rx_version`] moves on (a link's routes recomputed, a key installed, confirmed,
//! retired or erased); the driver makes a new one then, under the node's lock and before it
//! sends anything the node queued (so before a peer can learn of a new key, and use it).
//!
//! What it must not do: touch the replay windows, or decide anything the node's state decides.
//! Per datagram, [`RxGate::admit`] takes steps 0-8 of §4.2 on the link layer, as
//! [`RelayNode::begin_datagram`] and [`OpenJob::open`] take them, except the replay check:
//! - a datagram on no accept route is [`Admit::NoRoute`] (junk to the /64, a scan);
//! - one whose header protection, length, counter space or tag fails is [`Admit::Refused`]
//!   with the label the node would count (a forgery on a live route: no key of the node is
//!   needed but a read-only copy, and nothing of the node changes for it);
//! - one that unmasks to a handshake message or route-move notice of the wrong type, reserved
//!   bytes or length is [`Admit::Refused`] too (`hs_bad_length`, `hs_unknown_type`,
//!   `notice_malformed`; on a link with a pre-shared key the node would have said
//!   `hs_not_keyed`);
//! - a keepalive whose tag fails is [`Admit::Refused`] too (`open_bad_tag`);
//! - one naming a key phase the link has no key for is [`Admit::NoKey`] (`open_no_key`): the
//!   node is told once per batch, not per datagram ([`RelayNode::note_empty_slot`]);
//! - a well-formed handshake message or notice, a keepalive that verified, or a payload whose key slot has
//!   other keys to try (a rekey race) is [`Admit::Node`], its
//!   bytes as they arrived: the node's own path handles it whole ([`RelayNode::begin_datagram`]);
//! - a frame that opened is [`Admit::Opened`]: the node takes it at
//!   [`RelayNode::finish_datagram`], which looks the route up again, checks that the key is
//!   still the one that opened it and takes the counter into the replay window. A replayed
//!   frame opens here and is refused there, as before.

use std::net::SocketAddrV6;
use std::sync::Arc;

use super::node::{OpenJob, RelayNode};
use super::table::Neighbour;
use crate::handshake::{is_handshake, FrameKeys, Message, SlotState};
use crate::moves::{is_notice, NoticeError, NOTICE_LEN};
use crate::route_sets::RouteSet;
use crate::Route;

/// What the gate made of one datagram.
#[derive(Debug)]
pub enum Admit {
    /// On no link's accept route: junk, a scan, an old epoch's straggler. Dropped.
    NoRoute,
    /// Refused on `link`'s route before any state of the node: the label the node counts it
    /// under (`open_bad_tag` for a forgery, `open_truncated`, `open_bad_counter`,
    /// `header_too_short`). Dropped.
    Refused(Neighbour, &'static str),
    /// For the node's own path, bytes untouched: [`RelayNode::begin_datagram`] on `link`.
    Node(Neighbour),
    /// A payload naming a key phase `link` holds no key for (counted `open_no_key` by the
    /// caller, dropped): it may be forged, or the peer rekeyed and this node lost its key. Tell
    /// the node once per batch ([`RelayNode::note_empty_slot`]), which asks for a handshake at
    /// most once per holdoff.
    NoKey(Neighbour),
    /// Header protection removed and the frame opened in place: [`RelayNode::finish_datagram`]
    /// with `Ok(())`.
    Opened(OpenJob),
}

/// One accept route of a link, its set's header keys and the index of the link's keys.
#[derive(Debug)]
struct GateRoute {
    route: Route,
    link: Neighbour,
    set: Arc<RouteSet>,
    keys: usize,
}

/// The node's receive gate (module doc).
#[derive(Debug, Default)]
pub struct RxGate {
    version: u64,
    routes: Vec<GateRoute>,
    keys: Vec<FrameKeys>,
}

impl RxGate {
    /// The gate of `node` as it is now.
    pub(super) fn new<'a>(
        version: u64,
        links: impl Iterator<Item = (Neighbour, FrameKeys, Vec<(Route, Arc<RouteSet>)>)> + 'a,
    ) -> RxGate {
        let mut gate = RxGate {
            version,
            ..RxGate::default()
        };
        for (link, keys, accepts) in links {
            let k = gate.keys.len();
            gate.keys.push(keys);
            for (route, set) in accepts {
                gate.routes.push(GateRoute {
                    route,
                    link,
                    set,
                    keys: k,
                });
            }
        }
        gate
    }

    /// The [`RelayNode::rx_version`] it was made at.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// The link whose accept routes hold (`local`, `remote`), as [`RelayNode::link_of`]
    /// answers it when the gate was made.
    pub fn link_of(&self, local: SocketAddrV6, remote: SocketAddrV6) -> Option<Neighbour> {
        self.route_of(local, remote).map(|r| r.link)
    }

    fn route_of(&self, local: SocketAddrV6, remote: SocketAddrV6) -> Option<&GateRoute> {
        self.routes
            .iter()
            .find(|r| r.route.local == local && r.route.remote == remote)
    }

    /// A datagram's first steps, from `remote` to `local` with UDP payload `buf` (module doc).
    /// `buf` is changed only for [`Admit::Opened`] (and is scratch after [`Admit::Refused`]).
    pub fn admit(&self, local: SocketAddrV6, remote: SocketAddrV6, buf: &mut [u8]) -> Admit {
        let Some(r) = self.route_of(local, remote) else {
            return Admit::NoRoute;
        };
        let hk = r.set.stream.recv_header_key();
        // §4.2 step 0. Its XOR is its own inverse: applied again, the bytes are as they arrived.
        if let Some(hk) = hk {
            if let Err(e) = hk.unprotect(buf) {
                return Admit::Refused(r.link, e.reason());
            }
        }
        let to_node = |buf: &mut [u8]| {
            if let Some(hk) = hk {
                // The length passed above: cannot fail.
                let _ = hk.protect(buf);
            }
            Admit::Node(r.link)
        };
        // Handshake-class messages are the node's, once their type, reserved bytes and exact
        // length hold (what the handshake and the notice check first): a forgery that unmasks
        // to a first byte of that class (half of them: any with the high bit) stops here.
        if is_handshake(buf) {
            return match Message::new_checked(buf) {
                Ok(_) => to_node(buf),
                Err(e) => Admit::Refused(r.link, e.reason()),
            };
        }
        if is_notice(buf) {
            return if buf.len() == NOTICE_LEN {
                to_node(buf)
            } else {
                Admit::Refused(r.link, NoticeError::Malformed.reason())
            };
        }
        let Some(keys) = self.keys.get(r.keys) else {
            return to_node(buf);
        };
        let (slot, key) = match keys.for_payload(buf) {
            Ok(k) => k,
            Err(SlotState::Empty) => return Admit::NoKey(r.link),
            Err(SlotState::Others) => return to_node(buf),
        };
        let frame = match key.frame_job(&r.route, buf) {
            Ok(Some(job)) => job,
            // A keepalive: the node's, once its tag verifies.
            Ok(None) => {
                return match key.verify_keepalive(&r.route, buf) {
                    Ok(()) => to_node(buf),
                    Err(e) => Admit::Refused(r.link, e.reason()),
                }
            }
            Err(e) => return Admit::Refused(r.link, e.reason()),
        };
        if let Err(e) = frame.open(buf) {
            return Admit::Refused(r.link, e.reason());
        }
        Admit::Opened(OpenJob {
            link: r.link,
            route: r.route,
            slot,
            frame,
        })
    }
}

impl RelayNode {
    /// A count that moves on whenever the node's [`RxGate`] would change: a link's accept routes
    /// recomputed, or its receive keys changed. One addition per link.
    pub fn rx_version(&self) -> u64 {
        self.links_rx_versions()
    }

    /// The node's receive gate as it is now (an allocation: make one when
    /// [`RelayNode::rx_version`] moved on, not per datagram).
    pub fn rx_gate(&self) -> RxGate {
        RxGate::new(self.rx_version(), self.gate_links())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::frame::MIN_FRAME_MAX;
    use crate::relay::node::tests::{at, id, relay_routing, IN, OUT};
    use crate::relay::node::{Finish, Received};
    use crate::relay::{Kind, RelayRepr, HOP_LIMIT};
    use crate::tunnel::frame_payload_len;
    use crate::{Sealer, Stream};

    /// A data frame for `d`, sealed by the neighbour on link IN, header protection on.
    fn frame(
        peer: &Stream,
        sealer: &Sealer,
        now: crate::UnixTime,
        d: super::super::NodeId,
    ) -> Vec<u8> {
        let route = peer.schedule(now).send;
        let repr = RelayRepr {
            kind: Kind::Data,
            hops: HOP_LIMIT,
            payload_len: 32,
            destination: d,
        };
        let mut buf = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
        let header = peer.send_header_key();
        let n = sealer
            .seal_frame_protected(&route, header, &repr, &[0x11; 32], MIN_FRAME_MAX, &mut buf)
            .unwrap();
        buf.truncate(n);
        buf
    }

    /// What the gate admits is finished by the node as `handle_datagram` would have done it,
    /// byte for byte; a replay opens at the gate and is refused by the node's replay window; a
    /// forgery on the live route, a truncated payload and a datagram on no route are refused at
    /// the gate, and the node neither counts nor sees them; a keepalive goes to the node's own
    /// path with its bytes as they arrived.
    #[test]
    fn forgeries_and_junk_stop_at_the_gate_and_replays_at_the_node() {
        let d = id(1);
        let t0 = at(1_000);
        let (mut r, peer, s) = relay_routing(t0, &[d]);
        let (mut twin, _, _) = relay_routing(t0, &[d]);
        let gate = r.rx_gate();
        assert_eq!(gate.version(), r.rx_version());
        let route = peer.schedule(t0).send;
        let (l, rm) = (route.remote, route.local);
        let original = frame(&peer, &s, t0, d);
        let mut one = original.clone();
        let job = match gate.admit(l, rm, &mut one) {
            Admit::Opened(job) => job,
            other => panic!("not opened: {other:?}"),
        };
        let Finish::Seal(seal) = r.finish_datagram(t0, &job, Ok(()), &mut one) else {
            panic!("not forwarded");
        };
        let sent = seal.seal(&mut one).unwrap();
        assert_eq!(sent.link, OUT);
        let mut whole = original.clone();
        match twin.handle_datagram(t0, IN, l, rm, &mut whole) {
            Received::Forward(t) => assert_eq!(whole[..t.len], one[..sent.len]),
            other => panic!("not forwarded: {other:?}"),
        }
        // The same datagram again: authentic, so the gate opens it; the window refuses it.
        let mut again = original.clone();
        let Admit::Opened(job) = gate.admit(l, rm, &mut again) else {
            panic!("a replay is not opened at the gate");
        };
        assert!(matches!(
            r.finish_datagram(t0, &job, Ok(()), &mut again),
            Finish::Done(Received::Consumed)
        ));
        assert_eq!(r.counters().drops("open_replay"), 1);
        let before = r.counters().dropped();
        // A forgery on the live route: one bit of a fresh frame's ciphertext.
        let mut forged = frame(&peer, &s, t0, d);
        forged[40] ^= 1;
        assert!(matches!(
            gate.admit(l, rm, &mut forged),
            Admit::Refused(IN, "open_bad_tag")
        ));
        // Random bytes of any length on the live route (what an observer who saw the route
        // can send): each refused, whatever its first byte unmasks to.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut junk = vec![0u8; 1500];
        for n in 0..2000 {
            for b in junk.iter_mut() {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
            let len = 24 + n % 1400;
            let got = gate.admit(l, rm, &mut junk[..len]);
            assert!(matches!(got, Admit::Refused(IN, _)), "{len} bytes: {got:?}");
        }
        // Truncated below a frame's minimum (or unmasked to a short handshake message), and too
        // short for header protection.
        let mut short = frame(&peer, &s, t0, d);
        let got = gate.admit(l, rm, &mut short[..30]);
        assert!(
            matches!(
                got,
                Admit::Refused(
                    IN,
                    "open_truncated" | "hs_unknown_type" | "hs_bad_length" | "notice_malformed"
                )
            ),
            "{got:?}"
        );
        assert!(matches!(
            gate.admit(l, rm, &mut short[..10]),
            Admit::Refused(IN, "header_too_short")
        ));
        // Junk on no route: the right addresses the wrong way round, and the next epoch's
        // ports on another address of the /64.
        let mut junk = frame(&peer, &s, t0, d);
        assert!(matches!(gate.admit(rm, l, &mut junk), Admit::NoRoute));
        let far = peer.schedule(at(1_000_000)).send;
        assert!(matches!(
            gate.admit(far.remote, far.local, &mut junk),
            Admit::NoRoute
        ));
        assert_eq!(
            r.counters().dropped(),
            before,
            "the node saw the gate's refusals"
        );
        assert_eq!(r.counters().forwarded, 1);
        // A keepalive (counter and tag only) is the node's: bytes untouched.
        let mut keepalive = vec![0u8; 24];
        s.seal_keepalive(&route, &mut keepalive).unwrap();
        peer.send_header_key()
            .unwrap()
            .protect(&mut keepalive)
            .unwrap();
        let arrived = keepalive.clone();
        assert!(matches!(gate.admit(l, rm, &mut keepalive), Admit::Node(IN)));
        assert_eq!(keepalive, arrived);
    }

    /// The gate's version follows the node's routes: at the next epoch the node's version moves
    /// on, and a new gate admits the new routes as `link_of` does.
    #[test]
    fn a_new_epoch_moves_the_version_on() {
        let t0 = at(1_000);
        let (mut r, peer, _) = relay_routing(t0, &[id(1)]);
        let gate = r.rx_gate();
        let later = at(1_000 + 3_600_000);
        r.handle_timeout(later, || 7);
        assert_ne!(r.rx_version(), gate.version());
        let now = r.rx_gate();
        let route = peer.schedule(later).send;
        assert_eq!(now.link_of(route.remote, route.local), Some(IN));
        assert_eq!(gate.link_of(route.remote, route.local), None);
        for (_, a) in r.accept_routes() {
            assert_eq!(now.link_of(a.local, a.remote), r.link_of(a.local, a.remote));
        }
    }
}
