//! The relays' end-to-end handshake rate limit (§10.5): a token bucket per ingress link and
//! destination, in a table of bounded size.

use std::time::Duration;

use crate::relay::table::Neighbour;
use crate::relay::NodeId;
use crate::UnixTime;

/// End-to-end handshake frames (kind `0x02`) a node forwards per second, ingress link and
/// destination (§10.5, `relay_handshake_rate`), and the burst its token bucket allows.
pub const HANDSHAKE_RATE: u32 = 20;

/// The most (ingress link, destination) pairs a node keeps a handshake bucket for (24 bytes
/// each, allocated once). More than this receiving handshakes through one relay in the same
/// second is not a network this protocol sizes for; a flood of forged destinations is held to it.
pub const HANDSHAKE_BUCKETS: usize = 1024;

/// One token every 1 s / [`HANDSHAKE_RATE`].
pub(super) const HANDSHAKE_INTERVAL: Duration = Duration::from_millis(1000 / HANDSHAKE_RATE as u64);

/// How far ahead of now a bucket's refill time may be for a frame to pass: burst - 1 tokens.
pub(super) const HANDSHAKE_SLACK: Duration =
    Duration::from_millis((HANDSHAKE_RATE as u64 - 1) * (1000 / HANDSHAKE_RATE as u64));

/// The relays' end-to-end handshake rate limit (§10.5): a token bucket per destination, kept as
/// the time it is full again (GCRA, the "theoretical arrival time": each frame passed moves it
/// one interval on; a frame passes while it is at most [`HANDSHAKE_SLACK`] ahead of now).
/// Only buckets that are not full are state: a bucket whose time has passed is a fresh one.
#[derive(Debug)]
pub(super) struct HandshakeLimiter {
    /// ((ingress link, destination), when its bucket is full again), sorted by key, at most
    /// [`HANDSHAKE_BUCKETS`] (the capacity reserved up front: never reallocated).
    pub(super) buckets: Vec<((Neighbour, NodeId), UnixTime)>,
}

impl HandshakeLimiter {
    pub(super) fn new(transit: bool) -> HandshakeLimiter {
        // A node that is not transit forwards nothing (§10.3 step 2): no buckets.
        let capacity = if transit { HANDSHAKE_BUCKETS } else { 0 };
        HandshakeLimiter {
            buckets: Vec::with_capacity(capacity),
        }
    }

    /// Whether one more handshake frame that arrived on `ingress` for `destination` may be
    /// forwarded at `now` (and if so, takes its token).
    pub(super) fn allow(&mut self, now: UnixTime, ingress: Neighbour, destination: NodeId) -> bool {
        let key = (ingress, destination);
        let limit = now.saturating_add(HANDSHAKE_SLACK);
        let i = match self.buckets.binary_search_by_key(&key, |b| b.0) {
            Ok(i) => {
                let full_at = self.buckets[i].1.max(now);
                if full_at > limit {
                    return false;
                }
                self.buckets[i].1 = full_at.saturating_add(HANDSHAKE_INTERVAL);
                return true;
            }
            Err(i) if self.buckets.len() < HANDSHAKE_BUCKETS => i,
            Err(_) => {
                self.make_room(now);
                match self.buckets.binary_search_by_key(&key, |b| b.0) {
                    Ok(i) | Err(i) => i,
                }
            }
        };
        self.buckets
            .insert(i, (key, now.saturating_add(HANDSHAKE_INTERVAL)));
        true
    }

    /// Forgets the buckets of a removed ingress link.
    pub(super) fn forget(&mut self, ingress: Neighbour) {
        self.buckets.retain(|b| b.0 .0 != ingress);
    }

    /// Frees at least one entry of a full table: the buckets that have refilled (no state lost),
    /// else the one closest to full. Runs only while every slot is taken, so a flood pays at most
    /// one pass over [`HANDSHAKE_BUCKETS`] entries per new destination it names.
    pub(super) fn make_room(&mut self, now: UnixTime) {
        self.buckets.retain(|b| b.1 > now);
        if self.buckets.len() >= HANDSHAKE_BUCKETS {
            let nearest_full = (0..self.buckets.len()).min_by_key(|&i| self.buckets[i].1);
            if let Some(i) = nearest_full {
                self.buckets.remove(i);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::frame::MIN_FRAME_MAX;
    use crate::relay::node::tests::{at, id, relay_routing, IN, OUT};
    use crate::relay::node::{Received, RelayNode, Transmit};
    use crate::relay::{Kind, RelayRepr, HOP_LIMIT};
    use crate::tunnel::frame_payload_len;
    use crate::{Sealer, Stream};

    /// The neighbour sends the relay a frame of `kind` for `destination`; what the relay did.
    fn offer(
        r: &mut RelayNode,
        peer: &Stream,
        sealer: &Sealer,
        now: UnixTime,
        kind: Kind,
        destination: NodeId,
    ) -> Received {
        let route = peer.schedule(now).send;
        let repr = RelayRepr {
            kind,
            hops: HOP_LIMIT,
            payload_len: 32,
            destination,
        };
        let mut buf = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
        let header = peer.send_header_key();
        let n = sealer
            .seal_frame_protected(&route, header, &repr, &[0x11; 32], MIN_FRAME_MAX, &mut buf)
            .unwrap();
        r.handle_datagram(now, IN, route.remote, route.local, &mut buf[..n])
    }

    /// Of `count` frames offered, how many were forwarded on the link out.
    fn forwarded(
        r: &mut RelayNode,
        peer: &Stream,
        sealer: &Sealer,
        now: UnixTime,
        kind: Kind,
        destination: NodeId,
        count: usize,
    ) -> usize {
        (0..count)
            .filter(|_| {
                let got = offer(r, peer, sealer, now, kind, destination);
                matches!(got, Received::Forward(Transmit { link: OUT, .. }))
            })
            .count()
    }

    #[test]
    fn handshake_frames_are_limited_to_20_per_second_per_destination() {
        let (d1, d2) = (id(1), id(2));
        let t0 = at(1_000);
        let (mut r, peer, s) = relay_routing(t0, &[d1, d2]);
        let hs = Kind::E2eHandshake;
        assert_eq!(forwarded(&mut r, &peer, &s, t0, hs, d1, 20), 20);
        assert_eq!(r.counters().drops("relay_handshake_rate"), 0);
        // The 21st in the same second is dropped and counted.
        assert_eq!(forwarded(&mut r, &peer, &s, t0, hs, d1, 1), 0);
        assert_eq!(r.counters().drops("relay_handshake_rate"), 1);
        // Another destination has its own bucket; data is never limited.
        assert_eq!(forwarded(&mut r, &peer, &s, t0, hs, d2, 20), 20);
        assert_eq!(forwarded(&mut r, &peer, &s, t0, Kind::Data, d1, 200), 200);
        // One token back every 50 ms, a full bucket after a second.
        let t = at(1_049);
        assert_eq!(forwarded(&mut r, &peer, &s, t, hs, d1, 2), 0);
        let t = at(1_050);
        assert_eq!(forwarded(&mut r, &peer, &s, t, hs, d1, 2), 1);
        let t = at(2_100);
        assert_eq!(forwarded(&mut r, &peer, &s, t, hs, d1, 25), 20);
        let c = r.counters();
        assert_eq!(c.drops("relay_handshake_rate"), 1 + 2 + 1 + 5);
        assert_eq!(c.forwarded, 20 + 20 + 200 + 1 + 20);
        assert_eq!(c.dropped(), 9, "{:?}", c.drop_labels().collect::<Vec<_>>());
    }

    #[test]
    fn handshake_buckets_stay_bounded_under_a_flood_of_destinations() {
        let t0 = at(1_000);
        let routed = HANDSHAKE_BUCKETS as u64 + 500;
        let dests: Vec<NodeId> = (0..routed).map(id).collect();
        let (mut r, peer, s) = relay_routing(t0, &dests);
        let hs = Kind::E2eHandshake;
        // Forged destinations without a route are refused before the limiter: no state.
        for n in 0..5_000 {
            let got = offer(&mut r, &peer, &s, t0, hs, id(1_000_000 + n));
            assert_eq!(got, Received::Consumed);
        }
        assert_eq!(r.counters().drops("relay_no_route"), 5_000);
        assert!(r.handshake_rate.buckets.is_empty());

        // A destination that used its whole burst, then a handshake to every routed destination
        // in the same instant: the table never grows past its bound (nor reallocates), and the
        // busy bucket, the farthest from full, is not the one forgotten.
        let busy = dests[7];
        assert_eq!(forwarded(&mut r, &peer, &s, t0, hs, busy, 20), 20);
        for &d in &dests {
            forwarded(&mut r, &peer, &s, t0, hs, d, 1);
            assert!(r.handshake_rate.buckets.len() <= HANDSHAKE_BUCKETS);
        }
        assert_eq!(r.handshake_rate.buckets.len(), HANDSHAKE_BUCKETS);
        assert_eq!(r.handshake_rate.buckets.capacity(), HANDSHAKE_BUCKETS);
        let before = r.counters().drops("relay_handshake_rate");
        assert_eq!(forwarded(&mut r, &peer, &s, t0, hs, busy, 1), 0);
        assert_eq!(r.counters().drops("relay_handshake_rate"), before + 1);
        // A second later every bucket has refilled: the next new destination clears them.
        let t1 = at(2_001);
        assert_eq!(forwarded(&mut r, &peer, &s, t1, hs, id(1_000_000), 1), 0);
        assert_eq!(forwarded(&mut r, &peer, &s, t1, hs, dests[0], 1), 1);
        assert_eq!(r.handshake_rate.buckets.len(), 1);
        // A node that is not transit reserves nothing.
        assert_eq!(HandshakeLimiter::new(false).buckets.capacity(), 0);
    }
}
