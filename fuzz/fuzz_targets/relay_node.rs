//! A relay node fed arbitrary datagrams (docs/PROTOCOL.md §10.2-§10.9): `RelayNode` must never
//! panic, and whatever it hands back must lie inside the buffer it was given.
//!
//! The node under test is an edge gateway that is also transit, with two links (neighbours 1
//! and 2) and one end-to-end peer behind neighbour 2's side. Each input is one of:
//! - arbitrary bytes as a datagram on a link's current route (header protection is removed by
//!   the node, so this also exercises its own checks);
//! - a relay frame built from the input (kind, hops, destination, payload) and sealed by the
//!   link's other end, so that it passes the AEAD and reaches the node's frame handling: probes,
//!   routing messages, forwarding towards the other link, delivery to the end-to-end layer;
//! - such a sealed datagram with one byte of the input flipped into it;
//! - the same bytes on the wrong link, or on an address the link's route does not have.
//!
//! With the selector's top bit set, the first link and the end-to-end peer are keyed by
//! handshakes instead (no keys yet: every datagram reaches the handshake-class classification,
//! the link's handshake or notice handling, or the empty key slot).
//!
//! Between inputs the node's timer, transmissions and events are drained, as a driver would.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mt6d_proto::endpoint::IndexSeed;
use mt6d_proto::handshake::{Handshake, HandshakeConfig, PrivateKey, Psk};
use mt6d_proto::relay::frame::MIN_FRAME_MAX;
use mt6d_proto::relay::node::{E2eId, Received, RelayNode};
use mt6d_proto::relay::table::Neighbour;
use mt6d_proto::relay::{Kind, NodeId, RelayRepr};
use mt6d_proto::tunnel::frame_payload_len;
use mt6d_proto::{AeadAlg, Endpoint, Mode, Sealer, SessionKey, Stream, StreamConfig, UnixTime};

const OWN: NodeId = NodeId::from_bytes([7; 8]);
const FAR: NodeId = NodeId::from_bytes([9; 8]);

fn pair(a: &str, b: &str, key: u8) -> (Stream, Stream) {
    let mut c = StreamConfig::new(
        Endpoint::new(a.parse().unwrap()),
        Endpoint::new(b.parse().unwrap()),
        SessionKey::from_bytes(&[key; 32]).unwrap(),
    );
    c.mode = Mode::Encrypt;
    (
        Stream::new(c.clone()).unwrap(),
        Stream::new(c.mirrored()).unwrap(),
    )
}

/// A stream pair between `a` and `b` keyed by the link key of a handshake between two fixed
/// identities, and this side's handshake.
fn keyed_pair(a: &str, b: &str) -> (Stream, Stream, Handshake) {
    let hs = Handshake::new(HandshakeConfig {
        local_private: PrivateKey::from_bytes([0x11; 32]),
        remote_public: PrivateKey::from_bytes([0x22; 32]).public_key(),
        psk: Psk::none(),
        mode: Mode::Encrypt,
        aead: AeadAlg::Aes256Gcm,
        local_true: a.parse().unwrap(),
        remote_true: b.parse().unwrap(),
        rekey_after: std::time::Duration::from_secs(120),
        rekey_after_packets: u64::MAX,
    })
    .unwrap();
    let mut c = StreamConfig::new(
        Endpoint::new(a.parse().unwrap()),
        Endpoint::new(b.parse().unwrap()),
        hs.link_key().clone(),
    );
    c.mode = Mode::Encrypt;
    (
        Stream::new(c.clone()).unwrap(),
        Stream::new(c.mirrored()).unwrap(),
        hs,
    )
}

struct Setup {
    node: RelayNode,
    /// The other end of each link: its stream and sealer.
    far: Vec<(Stream, Sealer)>,
}

fn setup(now: UnixTime, handshake: bool) -> Setup {
    let mut node = RelayNode::new(
        now,
        Some(OWN),
        true,
        MIN_FRAME_MAX,
        IndexSeed::from_bytes([3; 16]),
    )
    .unwrap();
    let mut far = Vec::new();
    for (i, (a, b)) in [
        ("2001:db8:a::1", "2001:db8:b::1"),
        ("2001:db8:a::1", "2001:db8:c::1"),
    ]
    .into_iter()
    .enumerate()
    {
        let theirs = if handshake && i == 0 {
            let (mine, theirs, hs) = keyed_pair(a, b);
            node.add_link_handshake(now, Neighbour(1), mine, hs)
                .unwrap();
            theirs
        } else {
            let (mine, theirs) = pair(a, b, 0x40 + i as u8);
            let sealer = mine.sealer(1, u64::MAX >> 2);
            node.add_link(now, Neighbour(i as u32 + 1), mine, sealer)
                .unwrap();
            theirs
        };
        let s = theirs.sealer(1, u64::MAX >> 2);
        far.push((theirs, s));
    }
    if handshake {
        let (e2e, _, hs) = keyed_pair("2001:db8:1::a", "2001:db8:2::b");
        node.add_e2e_handshake(now, E2eId(0), FAR, e2e, hs).unwrap();
    } else {
        let (e2e, _) = pair("2001:db8:1::a", "2001:db8:2::b", 0x55);
        let sealer = e2e.sealer(1, u64::MAX >> 2);
        node.add_e2e(now, E2eId(0), FAR, e2e, sealer).unwrap();
    }
    let mut entropy = 0u8;
    node.set_entropy(Box::new(move || {
        entropy = entropy.wrapping_add(1);
        Some([entropy; 32])
    }));
    Setup { node, far }
}

fn drain(node: &mut RelayNode, now: UnixTime, rng: &mut u32) {
    node.handle_timeout(now, || {
        *rng = rng.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        *rng
    });
    let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
    for _ in 0..64 {
        match node.poll_transmit(now, &mut out) {
            Some(t) => assert!(t.len <= out.len()),
            None => break,
        }
    }
    for _ in 0..64 {
        if node.poll_event().is_none() {
            break;
        }
    }
}

fn check(got: &Received, len: usize) {
    match got {
        Received::Consumed => {}
        Received::Forward(t) => assert!(t.len <= len),
        Received::Deliver { range, .. } => assert!(range.start <= range.end && range.end <= len),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&sel, data)) = data.split_first() else {
        return;
    };
    let now = UnixTime::from_millis(1_700_000_000_000 + u64::from(sel) * 37);
    let mut s = setup(UnixTime::from_millis(1_700_000_000_000), sel & 0x80 != 0);
    let mut rng = u32::from(sel);
    drain(&mut s.node, now, &mut rng);
    let link = usize::from(sel & 1);
    let (far_stream, far_sealer) = &s.far[link];
    let route = far_stream.schedule(now).send;
    // The node's view: arrived on its local address from the far end's.
    let (local, remote) = (route.remote, route.local);
    let mut buf: Vec<u8> = match (sel >> 1) % 4 {
        0 => data.to_vec(),
        _ => {
            let Some((head, payload)) = data.split_first_chunk::<10>() else {
                return;
            };
            let kind = match head[0] % 4 {
                0 => Kind::Data,
                1 => Kind::E2eHandshake,
                2 => Kind::Routing,
                _ => Kind::Probe,
            };
            let repr = RelayRepr {
                kind,
                hops: head[1],
                payload_len: payload.len().min(MIN_FRAME_MAX - 12) as u16,
                destination: NodeId::from_bytes(head[2..10].try_into().unwrap()),
            };
            let payload = &payload[..usize::from(repr.payload_len)];
            let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
            let Ok(n) = far_sealer.seal_frame(&route, &repr, payload, MIN_FRAME_MAX, &mut out)
            else {
                return;
            };
            out.truncate(n);
            if let Some(hk) = far_stream.send_header_key() {
                if hk.protect(&mut out).is_err() {
                    return;
                }
            }
            if (sel >> 1) % 4 == 2 && !out.is_empty() {
                let at = usize::from(head[1]) % out.len();
                out[at] ^= head[0] | 1;
            }
            out
        }
    };
    let len = buf.len();
    let original = buf.clone();
    let (on, from) = if (sel >> 1) % 4 == 3 {
        // The wrong link for this route.
        (Neighbour(2 - link as u32), remote)
    } else {
        (Neighbour(link as u32 + 1), remote)
    };
    let got = s.node.handle_datagram(now, on, local, from, &mut buf);
    check(&got, len);
    // The same datagram again: a replay, counted and dropped.
    let mut again = original;
    let got = s.node.handle_datagram(now, on, local, from, &mut again);
    check(&got, len);
    drain(&mut s.node, now, &mut rng);
});
