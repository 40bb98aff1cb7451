//! End-to-end payloads for this edge gateway (§10.3 step 1, §10.5 "Receiving"): the route tag,
//! the set's header protection, the replay window, and the inner packet restored in place.

use std::ops::Range;

use super::{
    e2e_slot, After, DeliverJob, E2eId, Received, RelayNode, E2E_AT, E2E_SLOTS, PAYLOAD_AT,
};
use crate::endpoint::PeerId;
use crate::handshake::is_handshake;
use crate::moves::is_notice;
use crate::relay::{Kind, RelayError};
use crate::schedule::Route;
use crate::tunnel::OPEN_HEADROOM;
use crate::{OpenError, UnixTime};

impl RelayNode {
    /// §10.3 step 1 and §10.5 "Receiving": find the virtual route by its tag, remove the set's
    /// header protection and open the e2e payload as if it had arrived on that route. The inner
    /// packet is restored in place (see [`E2E_AT`]). The AEAD is left to a [`DeliverJob`]
    /// (without the node), but in a rekey race or for a keepalive, opened here.
    pub(super) fn deliver(
        &mut self,
        now: UnixTime,
        kind: Kind,
        buf: &mut [u8],
        payload_end: usize,
    ) -> After {
        let consumed = After::Done(Received::Consumed);
        let Some((set, route, from, k)) = self.tagged_route(&buf[PAYLOAD_AT..payload_end]) else {
            return consumed;
        };
        let Some(e) = self.e2e.get_mut(&from) else {
            self.counters.drop(RelayError::UnknownTag([0; 8]).reason());
            return consumed;
        };
        let Some(slot) = e.slots[k]
            .as_ref()
            .filter(|s| e2e_slot(from, k, s.set.id) == set)
        else {
            self.counters.drop(RelayError::UnknownTag([0; 8]).reason());
            return consumed;
        };
        let n = payload_end - E2E_AT;
        if buf.len() < OPEN_HEADROOM + n {
            // Cannot happen (const assertion above): a link payload ends 16 bytes after it.
            self.counters.drop("open_buffer_too_small");
            return consumed;
        }
        buf.copy_within(E2E_AT..payload_end, OPEN_HEADROOM);
        let body = &mut buf[OPEN_HEADROOM..OPEN_HEADROOM + n];
        if let Some(hk) = slot.set.stream.recv_header_key() {
            if let Err(err) = hk.unprotect(body) {
                self.counters.drop(err.reason());
                return consumed;
            }
        }
        // The kind is not trusted (§10.5): the payload's own first byte classifies it.
        if is_handshake(body) {
            let set = slot.set.clone();
            let entropy = &mut self.entropy;
            let r = e
                .link
                .handle_handshake(now, &set, &route, body, e.keys.recv_mut(), || {
                    entropy.draw()
                });
            if let Err(err) = r {
                self.counters.drop(err.reason());
            }
            self.drain_e2e(now, from);
            return consumed;
        }
        // Virtual routes never move (§10.5): a notice, or a data-kind claim on a frame the
        // sender marked as a handshake, is refused.
        if kind == Kind::E2eHandshake || is_notice(body) {
            self.counters.drop("node_e2e_handshake");
            return consumed;
        }
        let opened = match e.keys.recv_mut().packet_job(now, &route, buf, n) {
            Ok(Some((key_slot, job))) => {
                return After::Deliver(DeliverJob {
                    from,
                    slot: k,
                    set,
                    route,
                    key_slot,
                    job,
                })
            }
            Ok(None) => {
                let base = buf.as_ptr() as usize;
                e.keys
                    .recv_mut()
                    .open_in_place(now, &route, buf, n)
                    .map(|(o, inner)| (o, inner.as_ptr() as usize - base, inner.len()))
            }
            Err(err) => Err(err),
        };
        match opened {
            Ok((opened, start, len)) => {
                After::Done(self.delivered(now, from, k, route.epoch, opened, start..start + len))
            }
            Err(err) => {
                if err == OpenError::NoKey {
                    e.link.handle_empty_slot(now);
                    self.drain_e2e(now, from);
                }
                self.counters.drop(err.reason());
                consumed
            }
        }
    }

    /// The virtual route, end-to-end peer and slot a tagged payload names (§10.5), or None with
    /// the drop counted (an unknown tag). The caller checks that the slot still holds the set.
    fn tagged_route(&mut self, tagged: &[u8]) -> Option<(PeerId, Route, E2eId, usize)> {
        let found = crate::relay::e2e::E2ePayload::new_checked(tagged)
            .and_then(|p| self.tags.find(&p).map(|(set, route)| (set, *route)));
        let (set, route) = match found {
            Ok(f) => f,
            Err(e) => {
                self.counters.drop(e.reason());
                return None;
            }
        };
        let index = set.index() as usize;
        let (from, k) = (
            E2eId(u32::try_from(index / E2E_SLOTS).unwrap_or(u32::MAX)),
            index % E2E_SLOTS,
        );
        Some((set, route, from, k))
    }

    /// The step after [`DeliverJob::open`] (whose result is `opened`), for a driver whose
    /// threads share the node behind a lock: the end-to-end replay window of the key that made
    /// the job (a replay, or a packet whose original another thread delivered meanwhile, is
    /// refused as `open_replay`), then what [`RelayNode::handle_datagram`] does with an opened
    /// inner packet: [`Received::Deliver`] with it restored in the caller's buffer, or a drop
    /// counted under its reason.
    pub fn finish_delivery(
        &mut self,
        now: UnixTime,
        job: &DeliverJob,
        opened: Result<Range<usize>, OpenError>,
    ) -> Received {
        // BadInner comes after the tag verified: the counter is taken, as in `open_in_place`.
        let (range, inner_ok) = match opened {
            Ok(r) => (r, Ok(())),
            Err(e @ OpenError::BadInner) => (0..0, Err(e)),
            Err(e) => {
                self.counters.drop(e.reason());
                return Received::Consumed;
            }
        };
        let Some(e) = self.e2e.get_mut(&job.from) else {
            self.counters.drop(RelayError::UnknownTag([0; 8]).reason());
            return Received::Consumed;
        };
        // The set left the stream's slot meanwhile (a handshake released it): as if its tag
        // had not been found.
        if e.slots[job.slot]
            .as_ref()
            .is_none_or(|s| e2e_slot(job.from, job.slot, s.set.id) != job.set)
        {
            self.counters.drop(RelayError::UnknownTag([0; 8]).reason());
            return Received::Consumed;
        }
        let opened = match e
            .keys
            .recv_mut()
            .commit_packet(now, job.key_slot, &job.job, range.len())
        {
            Ok(Some(o)) => o,
            Ok(None) => {
                self.counters.drop("node_key_replaced");
                return Received::Consumed;
            }
            Err(err) => {
                self.counters.drop(err.reason());
                return Received::Consumed;
            }
        };
        if let Err(err) = inner_ok {
            self.counters.drop(err.reason());
            return Received::Consumed;
        }
        self.delivered(now, job.from, job.slot, job.route.epoch, opened, range)
    }

    /// An end-to-end payload of stream `from` opened under the set in its slot `k` (its inner
    /// packet at `range` of the buffer, empty for a keepalive): the set's data check, its key
    /// confirmation, the count.
    pub(super) fn delivered(
        &mut self,
        now: UnixTime,
        from: E2eId,
        k: usize,
        epoch: crate::Epoch,
        opened: crate::handshake::Opened,
        range: Range<usize>,
    ) -> Received {
        let Some(e) = self.e2e.get_mut(&from) else {
            return Received::Consumed;
        };
        let Some(slot) = e.slots[k].as_ref() else {
            return Received::Consumed;
        };
        // The link set after the session's switch takes handshake-class messages only (§9.8).
        if !slot.data && !e.link.sets().takes_data(&slot.set) {
            self.counters.drop("node_set_closed");
            return Received::Consumed;
        }
        slot.set.opened_on(epoch);
        if let Some(phase) = opened.confirmed {
            e.link.handle_confirmed(now, phase, opened.confirmed_key);
            self.drain_e2e(now, from);
        }
        if range.is_empty() {
            self.counters.keepalives += 1;
            return Received::Consumed;
        }
        self.counters.delivered += 1;
        Received::Deliver { from, range }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::IndexSeed;
    use crate::relay::node::tests::{at, id, pair, IN};
    use crate::relay::node::{Finish, Step};
    use crate::relay::routing::UpdateEntry;
    use crate::relay::{Metric, Seqno};
    use crate::testutil::addr;
    use crate::tunnel::{frame_payload_len, FRAME_HEADROOM};
    use crate::{Endpoint, Mode, SessionKey, Stream, StreamConfig};

    /// Edge gateways A and B over one pre-shared link (IN at both ends), with an end-to-end
    /// stream between hosts fd00:1::10 (behind A) and fd00:2::10 (behind B); A routes to B.
    fn edges(now: UnixTime) -> (RelayNode, RelayNode) {
        let (ida, idb) = (id(10), id(11));
        let seed = IndexSeed::from_bytes([3; 16]);
        let frame_max = crate::relay::frame::DEFAULT_FRAME_MAX;
        let mut ea = RelayNode::edge(now, ida, frame_max, seed).unwrap();
        let mut eb = RelayNode::edge(now, idb, frame_max, seed).unwrap();
        let (la, lb) = pair(Mode::Encrypt);
        let (sa, sb) = (la.sealer(1, u64::MAX), lb.sealer(1, u64::MAX));
        ea.add_link(now, IN, la, sa).unwrap();
        eb.add_link(now, IN, lb, sb).unwrap();
        ea.table.handle_link_cost(now, IN, Metric(20));
        let entry = UpdateEntry {
            destination: idb,
            seqno: Seqno(1),
            metric: Metric(0),
        };
        ea.table.handle_update(now, IN, [entry]);
        let mut c = StreamConfig::new(
            Endpoint::new(addr("fd00:1::10")),
            Endpoint::new(addr("fd00:2::10")),
            SessionKey::from_bytes(&[5; 32]).unwrap(),
        );
        c.mode = Mode::Encrypt;
        let (ua, ub) = (
            Stream::new(c.clone()).unwrap(),
            Stream::new(c.mirrored()).unwrap(),
        );
        let (sa, sb) = (ua.sealer(1, u64::MAX), ub.sealer(1, u64::MAX));
        ea.add_e2e(now, E2eId(0), idb, ua, sa).unwrap();
        eb.add_e2e(now, E2eId(0), ida, ub, sb).unwrap();
        (ea, eb)
    }

    /// An inner packet from fd00:1::10 to fd00:2::10 with `len` bytes of payload.
    fn inner(len: usize) -> Vec<u8> {
        let mut p = vec![0x5au8; 40 + len];
        p[..8].copy_from_slice(&[0x60, 0, 0, 0, 0, 0, 59, 64]);
        p[4..6].copy_from_slice(&u16::try_from(len).unwrap().to_be_bytes());
        p[8..24].copy_from_slice(&addr("fd00:1::10").octets());
        p[24..40].copy_from_slice(&addr("fd00:2::10").octets());
        p
    }

    /// At an edge gateway, the passes (`begin_datagram`, `OpenJob::open`, `finish_datagram`,
    /// then the end-to-end open without the node, `DeliverJob::open`, and
    /// `finish_delivery`) deliver what `handle_datagram` delivers, byte for byte; one
    /// end-to-end payload opened twice before either is finished (a replay racing its original
    /// through another worker, in another link frame) is delivered once and counted as a replay
    /// once; an end-to-end payload whose tag fails is counted and never delivered.
    #[test]
    fn the_passes_deliver_as_one_call_and_a_racing_end_to_end_replay_once() {
        let t0 = at(1_000);
        let (mut a, mut b) = edges(t0);
        let (_, mut twin) = edges(t0);
        let packet = inner(200);
        let mut wire = vec![0u8; frame_payload_len(a.frame_max())];
        let sent = a.send_inner(t0, E2eId(0), &packet, &mut wire).unwrap();
        let original = wire[..sent.len].to_vec();
        let (l, rm) = (sent.route.remote, sent.route.local);
        // One call, on a twin of B.
        let mut whole = original.clone();
        let want = match twin.handle_datagram(t0, IN, l, rm, &mut whole) {
            Received::Deliver { from, range } => {
                assert_eq!(from, E2eId(0));
                whole[range].to_vec()
            }
            other => panic!("not delivered: {other:?}"),
        };
        assert_eq!(want, packet);
        // The passes on B, with the link layer opened and its frame copied before the finish:
        // the copy's end-to-end payload is what a second link frame would carry.
        let mut one = original.clone();
        let job = match b.begin_datagram(t0, IN, l, rm, &mut one) {
            Step::Open(job) => job,
            other => panic!("not an open job: {other:?}"),
        };
        job.open(&mut one).unwrap();
        let mut two = one.clone();
        let mut late = one.clone();
        let payload_end = PAYLOAD_AT
            + usize::from(u16::from_be_bytes([
                two[FRAME_HEADROOM + 2],
                two[FRAME_HEADROOM + 3],
            ]));
        let d1 = match b.finish_datagram(t0, &job, Ok(()), &mut one) {
            Finish::Deliver(d) => d,
            other => panic!("not a delivery: {other:?}"),
        };
        let After::Deliver(d2) = b.deliver(t0, Kind::Data, &mut two, payload_end) else {
            panic!("the copy is not a delivery");
        };
        let (o1, o2) = (d1.open(&mut one), d2.open(&mut two));
        assert!(o1.is_ok() && o2.is_ok());
        match b.finish_delivery(t0, &d1, o1) {
            Received::Deliver { from, range } => {
                assert_eq!(from, E2eId(0));
                assert_eq!(one[range], want[..]);
            }
            other => panic!("not delivered: {other:?}"),
        }
        assert_eq!(b.finish_delivery(t0, &d2, o2), Received::Consumed);
        assert_eq!(b.counters().drops("open_replay"), 1);
        assert_eq!(b.counters().delivered, 1);
        // Once the original is in the window, a copy is refused before any AEAD.
        assert!(matches!(
            b.deliver(t0, Kind::Data, &mut late, payload_end),
            After::Done(Received::Consumed)
        ));
        assert_eq!(b.counters().drops("open_replay"), 2);
        // A fresh packet whose end-to-end ciphertext was changed after the link seal.
        let sent = a.send_inner(t0, E2eId(0), &packet, &mut wire).unwrap();
        let mut forged = wire[..sent.len].to_vec();
        let job = match b.begin_datagram(t0, IN, l, rm, &mut forged) {
            Step::Open(job) => job,
            other => panic!("not an open job: {other:?}"),
        };
        job.open(&mut forged).unwrap();
        forged[payload_end - 20] ^= 1;
        let Finish::Deliver(d) = b.finish_datagram(t0, &job, Ok(()), &mut forged) else {
            panic!("not a delivery");
        };
        let opened = d.open(&mut forged);
        assert_eq!(opened, Err(OpenError::BadTag));
        assert_eq!(b.finish_delivery(t0, &d, opened), Received::Consumed);
        assert_eq!(b.counters().drops("open_bad_tag"), 1);
        assert_eq!(b.counters().delivered, 1);
    }
}
