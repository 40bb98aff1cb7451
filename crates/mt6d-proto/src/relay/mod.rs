//! Relays (seed 003; docs/PROTOCOL.md §10, rationale in docs/RELAYS.md): the sans-IO parts
//! of carrying edge-to-edge MT6D traffic through relay nodes, after 003 (per-link keys, header and
//! payload hidden on every link, routing by probed link cost with failover).
//!
//! What this module owns:
//! - the byte layouts a relay reads inside a link's AEAD: the relay header ([`frame`]), probes
//!   ([`probe`]) and routing messages ([`routing`]), each a checked zero-copy view plus a writer,
//!   and the size-class padding rule ([`frame::frame_len`]);
//! - the end-to-end route tag that names a virtual route without showing it, and the sealing of
//!   end-to-end payloads for virtual routes ([`e2e`]); the receiver's index from route tags to
//!   its sets' accept routes ([`tags::TagIndex`]);
//! - node ids ([`NodeId`]), metrics ([`Metric`]) and sequence numbers ([`Seqno`]);
//! - the link-cost estimator ([`cost::LinkMonitor`]: probe replies in, a cost with hysteresis
//!   out) and the distance-vector routing table ([`table::RoutingTable`]: Babel's feasibility
//!   condition, seqno requests, failover and switch-back).
//! - one node put together from all of these ([`node::RelayNode`]: relay links, routing,
//!   forwarding in the receive buffer, end-to-end streams of an edge gateway), with pre-shared
//!   link and end-to-end keys for now.
//!
//! What it must not do: touch a socket or a clock (time comes in as `now`, randomness as
//! arguments), or know about the daemon. The link layer's AEAD is the tunnel's: a relay link is
//! an ordinary encrypt-mode MT6D link whose plaintext is a frame (§10.2,
//! [`crate::Sealer::seal_frame`], [`crate::Opener::open_frame`]).
//!
//! Call order for a node when driving the parts by hand ([`node::RelayNode`] does this, and the
//! simulation `tests/relay_routing.rs` is such a driver):
//! 1. One [`cost::LinkMonitor`] per link and one [`table::RoutingTable`] per node.
//! 2. On every timer: per link, send a probe request for each [`cost::LinkMonitor::poll_probe`],
//!    then [`cost::LinkMonitor::handle_timeout`]; feed every
//!    [`cost::LinkMonitor::poll_cost_change`] to [`table::RoutingTable::handle_link_cost`]; then
//!    [`table::RoutingTable::handle_timeout`].
//! 3. Per received frame, [`frame::RelayFrame::new_checked`] first, then by kind: a probe request
//!    is answered at once, a reply goes to [`cost::LinkMonitor::handle_reply`]; routing messages to
//!    [`table::RoutingTable::handle_update`] / [`table::RoutingTable::handle_request`]; data and
//!    end-to-end handshakes to [`table::RoutingTable::forward`].
//! 4. After each input, send every [`table::RoutingTable::poll_transmit`]; sleep until the
//!    earliest `poll_timeout` of the table and the monitors.

pub mod cost;
pub mod e2e;
pub mod gate;
pub mod node;
pub mod probe;
pub mod routing;
pub mod table;
pub mod tags;

use crate::handshake::PublicKey;

pub use crate::wire::relay::frame;
pub(crate) use crate::wire::relay::{read_node_id, read_u16, read_u32};
pub use crate::wire::relay::{NodeId, RelayError, NODE_ID_LEN};
pub use frame::{frame_len, Kind, RelayFrame, RelayRepr};

/// BLAKE3 `derive_key` contexts of the relay layer (changing one is wire-incompatible).
pub(crate) mod context {
    /// Node id from an identity public key (docs/PROTOCOL.md §10.1).
    pub const NODE_ID: &str = "mt6d-proto 2026-12-02 relay node id";
    /// Route tag key from a set key (§10.5).
    pub const ROUTE_TAG: &str = "mt6d-proto 2026-12-02 relay route tag key";
}

/// Hop limit an edge gateway puts on a frame it originates, and on a seqno request (§10.3, §10.8).
pub const HOP_LIMIT: u8 = 16;

impl NodeId {
    /// The id of the node holding `key`; None for the reserved id (probability 2^-64: such a key
    /// cannot be used in a relay network).
    pub fn from_public_key(key: &PublicKey) -> Option<NodeId> {
        let d = blake3::derive_key(context::NODE_ID, key.as_bytes());
        let mut id = [0u8; NODE_ID_LEN];
        id.copy_from_slice(&d[..NODE_ID_LEN]);
        let id = NodeId::from_bytes(id);
        (!id.is_reserved()).then_some(id)
    }
}

/// A route or link cost (docs/PROTOCOL.md §10.7-§10.8): u16, [`Metric::INFINITY`] = unreachable.
/// About one unit per millisecond of RTT; every hop costs at least 10.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Metric(pub u16);

impl Metric {
    /// Unreachable (a retraction in an update, a dead link).
    pub const INFINITY: Metric = Metric(u16::MAX);
    /// Whether the destination is reachable at this cost.
    pub const fn is_finite(self) -> bool {
        self.0 != u16::MAX
    }
    /// `self + other`, infinite if either is or if the sum reaches `0xffff`.
    pub const fn plus(self, other: Metric) -> Metric {
        if !self.is_finite() || !other.is_finite() {
            return Metric::INFINITY;
        }
        match self.0.checked_add(other.0) {
            Some(s) => Metric(s),
            None => Metric::INFINITY,
        }
    }
}

/// A destination's sequence number (RFC 8966 §3.2.1): u16, compared modulo 2^16.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Seqno(pub u16);

impl Seqno {
    /// `self` is newer than `other`: `(self - other) mod 2^16` is in `1..=32767`.
    pub const fn is_newer_than(self, other: Seqno) -> bool {
        let d = self.0.wrapping_sub(other.0);
        d != 0 && d < 0x8000
    }
    /// `self` is `other` or newer.
    pub const fn is_at_least(self, other: Seqno) -> bool {
        self.0 == other.0 || self.is_newer_than(other)
    }
    /// The next seqno (wrapping).
    pub const fn next(self) -> Seqno {
        Seqno(self.0.wrapping_add(1))
    }
}

#[cfg(test)]
pub(crate) fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seqnos_compare_modulo_two_to_the_sixteen() {
        assert!(Seqno(1).is_newer_than(Seqno(0)));
        assert!(!Seqno(0).is_newer_than(Seqno(0)));
        assert!(Seqno(0).is_newer_than(Seqno(u16::MAX)));
        assert!(Seqno(0x7fff).is_newer_than(Seqno(0)));
        assert!(!Seqno(0x8000).is_newer_than(Seqno(0)));
        assert!(Seqno(0).is_newer_than(Seqno(0x8001)));
        assert!(Seqno(5).is_at_least(Seqno(5)));
        assert!(!Seqno(4).is_at_least(Seqno(5)));
        assert_eq!(Seqno(u16::MAX).next(), Seqno(0));
    }

    #[test]
    fn metrics_saturate_at_infinity() {
        assert_eq!(Metric(10).plus(Metric(15)), Metric(25));
        assert_eq!(Metric(0xfff0).plus(Metric(0x0f)), Metric::INFINITY);
        assert_eq!(Metric(0xfff0).plus(Metric(0x10)), Metric::INFINITY);
        assert_eq!(Metric::INFINITY.plus(Metric(0)), Metric::INFINITY);
        assert_eq!(Metric(0).plus(Metric::INFINITY), Metric::INFINITY);
        assert!(Metric(0xfffe).is_finite());
    }

    #[test]
    fn node_ids_differ_per_key_and_print_as_hex() {
        use crate::handshake::PrivateKey;
        let a = NodeId::from_public_key(&PrivateKey::from_bytes([1; 32]).public_key()).unwrap();
        let b = NodeId::from_public_key(&PrivateKey::from_bytes([2; 32]).public_key()).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.to_string().len(), 16);
        assert!(NodeId::RESERVED.is_reserved());
        assert!(!a.is_reserved());
    }

    /// The vectors of docs/PROTOCOL.md §10.10 (node ids and the route tag also checked with
    /// python3's `blake3` package; the layouts are bytes written out by hand in the text).
    #[test]
    fn protocol_vectors() {
        use super::e2e::RouteTagKey;
        use super::probe::ProbeRepr;
        use super::routing::{RequestEntry, RoutingRepr, UpdateEntry};
        use crate::{Endpoint, Epoch, SessionKey, Stream, StreamConfig};

        let key = |s: &str| -> PublicKey { PublicKey::from_bytes(hex(s).try_into().unwrap()) };
        let id0 = NodeId::from_public_key(&key(
            "79a631eede1bf9c98f12032cdeadd0e7a079398fc786b88cc846ec89af85a51a",
        ))
        .unwrap();
        let id1 = NodeId::from_public_key(&key(
            "675dd574ed7789310b3d2e7681f3790b466c773b1521fecf36577958371ea52f",
        ))
        .unwrap();
        assert_eq!(id0.to_string(), "a3c79f790a6883bc");
        assert_eq!(id1.to_string(), "b402d1338c60f4c8");

        // §8's pre-shared stream, role 0's route of epoch e, as a virtual route.
        let session = SessionKey::from_bytes(&(0u8..32).collect::<Vec<_>>()).unwrap();
        let stream = Stream::new(StreamConfig::new(
            Endpoint::new("2001:db8:a::1".parse().unwrap()),
            Endpoint::new("2001:db8:b::2".parse().unwrap()),
            session.clone(),
        ))
        .unwrap();
        let route = stream.route_with_attempt(Epoch(170_000_000), 0);
        assert_eq!(route.remote.port(), 22970);
        let tag = RouteTagKey::derive(&session).tag_to(&route);
        assert_eq!(tag.0.to_vec(), hex("7ad5648d71e9edf4"));

        let frame_max = frame::DEFAULT_FRAME_MAX;
        let mut buf = [0u8; 256];
        // §8's sealed payload (encrypt, aes256-gcm) carried to id1 behind its route tag.
        let sealed =
            hex("f9383c2bae04d97e0579d90f0586f65c41623dd498e91d6e956c9087334f32da563ae2d2");
        let mut payload = tag.0.to_vec();
        payload.extend(&sealed);
        let repr = RelayRepr {
            kind: Kind::Data,
            hops: HOP_LIMIT,
            payload_len: u16::try_from(payload.len()).unwrap(),
            destination: id1,
        };
        let n = repr.write_frame(&payload, frame_max, &mut buf).unwrap();
        let mut want = hex("0110002cb402d1338c60f4c8 7ad5648d71e9edf4
             f9383c2bae04d97e0579d90f0586f65c41623dd498e91d6e956c9087334f32da563ae2d2");
        want.resize(128, 0);
        assert_eq!(&buf[..n], &want[..]);
        let f = RelayFrame::new_checked(&buf[..n]).unwrap();
        assert_eq!(RelayRepr::parse(&f), repr);
        let e2e = e2e::E2ePayload::new_checked(f.payload()).unwrap();
        assert_eq!(e2e.tag(), tag);
        assert_eq!(e2e.payload(), &sealed[..]);

        // A probe request, sequence 1.
        let probe = ProbeRepr::request(1).to_bytes();
        let n = RelayRepr::link_local(Kind::Probe, 8)
            .write_frame(&probe, frame_max, &mut buf)
            .unwrap();
        let mut want = hex("040100080000000000000000 0100000000000001");
        want.resize(128, 0);
        assert_eq!(&buf[..n], &want[..]);

        // An update: id1 at seqno 7, metric 50; a seqno request for id1, seqno 8, 16 hops.
        for (msg, body) in [
            (
                RoutingRepr::Update(vec![UpdateEntry {
                    destination: id1,
                    seqno: Seqno(7),
                    metric: Metric(50),
                }]),
                "01010000b402d1338c60f4c800070032",
            ),
            (
                RoutingRepr::Request(vec![RequestEntry {
                    destination: id1,
                    seqno: Seqno(8),
                    hops: 16,
                }]),
                "02010000b402d1338c60f4c800081000",
            ),
        ] {
            let mut b = vec![0u8; msg.buffer_len()];
            msg.emit(&mut b).unwrap();
            assert_eq!(b, hex(body));
            let n = RelayRepr::link_local(Kind::Routing, 16)
                .write_frame(&b, frame_max, &mut buf)
                .unwrap();
            let mut want = hex("030100100000000000000000");
            want.extend(hex(body));
            want.resize(128, 0);
            assert_eq!(&buf[..n], &want[..]);
        }
    }

    #[test]
    fn every_error_has_a_relay_label() {
        for e in [
            RelayError::Truncated {
                what: "x",
                have: 0,
                need: 1,
            },
            RelayError::BadKind(9),
            RelayError::BadHops { kind: 1, hops: 0 },
            RelayError::BadLength { len: 1, min: 32 },
            RelayError::BadDestination { kind: 1 },
            RelayError::BadPadding,
            RelayError::BadProbe { field: "type" },
            RelayError::BadRouting { field: "count" },
            RelayError::TooLong { len: 9, max: 1 },
            RelayError::LengthMismatch {
                field: 1,
                payload: 2,
            },
            RelayError::BufferTooSmall { have: 0, need: 1 },
            RelayError::UnknownTag([1; 8]),
        ] {
            assert!(e.reason().starts_with("relay_"), "{e}");
            assert!(!e.to_string().is_empty());
        }
    }
}
