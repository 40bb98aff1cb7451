//! Datagrams arriving on a link (§10.3): the accept route, header protection, the link keys,
//! then what the frame is for (probe, routing message, delivery, or the next link).

use std::net::SocketAddrV6;

use super::{
    After, Finish, OpenJob, Pending, Received, RelayLink, RelayNode, Resume, SealJob, Step,
    PAYLOAD_AT,
};
use crate::handshake::is_handshake;
use crate::moves::is_notice;
use crate::relay::frame::RelayFrame;
use crate::relay::probe::{Probe, ProbeRepr, ProbeType};
use crate::relay::routing::{MessageType, RoutingMessage};
use crate::relay::table::{Forward, Neighbour};
use crate::relay::{Kind, RelayRepr};
use crate::tunnel::{FRAME_HEADROOM, TAG_LEN};
use crate::{OpenError, UnixTime};

impl RelayNode {
    /// A datagram arrived on `link`, from `remote` to `local` (the addresses and ports it was
    /// sent between), with UDP payload `buf` (header protection still on: the node removes it).
    /// The buffer is worked on in place: see [`Received`] for what it holds afterwards.
    /// Malformed, forged or replayed datagrams are counted and [`Received::Consumed`].
    ///
    /// The same steps as [`RelayNode::begin_datagram`], [`OpenJob::open`],
    /// [`RelayNode::finish_datagram`] and [`SealJob::seal`] in a row (or
    /// [`RelayNode::resume_datagram`]), for a driver with one thread.
    pub fn handle_datagram(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        local: SocketAddrV6,
        remote: SocketAddrV6,
        buf: &mut [u8],
    ) -> Received {
        match self.begin_datagram(now, link, local, remote, buf) {
            Step::Done(r) => r,
            Step::Resume(rest) => self.resume_datagram(now, rest, buf),
            Step::Open(job) => {
                let opened = job.open(buf);
                match self.finish_datagram(now, &job, opened, buf) {
                    Finish::Done(r) => r,
                    Finish::Deliver(d) => {
                        let opened = d.open(buf);
                        self.finish_delivery(now, &d, opened)
                    }
                    Finish::Seal(seal) => match seal.seal(buf) {
                        Ok(t) => Received::Forward(t),
                        Err(e) => {
                            self.counters.drop(e.reason());
                            Received::Consumed
                        }
                    },
                }
            }
        }
    }

    /// The first step of [`RelayNode::handle_datagram`], for a driver whose threads share the
    /// node behind a lock (docs/ARCHITECTURE.md "Relays"): the link's route, header protection,
    /// handshake-class messages, and the link key's checks before the AEAD. What is left is an
    /// [`OpenJob`] to run without the node (the common case), or the rest of the work under it
    /// ([`Step::Resume`]: a keepalive, or keys in a rekey race).
    pub fn begin_datagram(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        local: SocketAddrV6,
        remote: SocketAddrV6,
        buf: &mut [u8],
    ) -> Step {
        self.refresh(now);
        let Some((l, at)) = self.accept_of(link, local, remote) else {
            return Step::Done(Received::Consumed);
        };
        let accept = &l.accept[at];
        let route = accept.route;
        // §4.2 step 0: the route set's header protection, keyed by the neighbour's role.
        if let Some(hk) = accept.set.stream.recv_header_key() {
            if let Err(e) = hk.unprotect(buf) {
                self.counters.drop(e.reason());
                return Step::Done(Received::Consumed);
            }
        }
        // Handshake-class messages go to the link (§9.3, §5.2); only data reaches the keys.
        if is_notice(buf) || is_handshake(buf) {
            self.link_message(now, link, at, buf);
            return Step::Done(Received::Consumed);
        }
        match l.keys.recv_mut().frame_job(now, &route, buf) {
            Ok(Some((slot, frame))) => Step::Open(OpenJob {
                link,
                route,
                slot,
                frame,
            }),
            Ok(None) => Step::Resume(Resume { link, route }),
            Err(e) => {
                self.open_failed(now, link, e);
                Step::Done(Received::Consumed)
            }
        }
    }

    /// The rest of [`RelayNode::begin_datagram`]'s work under the node (the keys' full open with
    /// their fallbacks, then as [`RelayNode::finish_datagram`], sealing included).
    pub fn resume_datagram(&mut self, now: UnixTime, rest: Resume, buf: &mut [u8]) -> Received {
        let Some((l, at)) = self.accept_of(rest.link, rest.route.local, rest.route.remote) else {
            return Received::Consumed;
        };
        let opened = match l.keys.recv_mut().open_frame(now, &rest.route, buf) {
            Ok(o) => o,
            Err(e) => {
                self.open_failed(now, rest.link, e);
                return Received::Consumed;
            }
        };
        match self.after_open(now, rest.link, at, opened, buf) {
            After::Done(r) => r,
            After::Forward { to, flen } => self.forward(to, buf, flen),
            After::Deliver(job) => {
                let opened = job.open(buf);
                self.finish_delivery(now, &job, opened)
            }
        }
    }

    /// The step after [`OpenJob::open`] (whose result is `opened`): the replay window, the
    /// frame, and what it is for: a probe or routing message (handled), an inner packet for
    /// this edge gateway ([`Received::Deliver`], restored in place), or a frame for the next
    /// link, returned as a [`SealJob`] to run without the node.
    pub fn finish_datagram(
        &mut self,
        now: UnixTime,
        job: &OpenJob,
        opened: Result<(), OpenError>,
        buf: &mut [u8],
    ) -> Finish {
        if let Err(e) = opened {
            self.open_failed(now, job.link, e);
            return Finish::Done(Received::Consumed);
        }
        let Some((l, at)) = self.accept_of(job.link, job.route.local, job.route.remote) else {
            return Finish::Done(Received::Consumed);
        };
        let opened = match l
            .keys
            .recv_mut()
            .commit_frame(now, job.slot, &job.frame, buf)
        {
            Ok(Some(o)) => (o, true),
            Ok(None) => {
                self.counters.drop("node_key_replaced");
                return Finish::Done(Received::Consumed);
            }
            Err(e) => {
                self.open_failed(now, job.link, e);
                return Finish::Done(Received::Consumed);
            }
        };
        match self.after_open(now, job.link, at, opened, buf) {
            After::Done(r) => Finish::Done(r),
            After::Forward { to, flen } => self.seal_job(to, flen),
            After::Deliver(job) => Finish::Deliver(job),
        }
    }

    /// The link and the index of its accept route between `local` and `remote` (looked up again
    /// at each step of a datagram: the routes may have been rebuilt in between); a drop counted
    /// if there is none.
    pub(super) fn accept_of(
        &mut self,
        link: Neighbour,
        local: SocketAddrV6,
        remote: SocketAddrV6,
    ) -> Option<(&mut RelayLink, usize)> {
        let Some(l) = self.links.get_mut(&link) else {
            self.counters.drop("node_unknown_link");
            return None;
        };
        let Some(at) = l
            .accept
            .iter()
            .position(|a| a.route.local == local && a.route.remote == remote)
        else {
            self.counters.drop("node_unknown_route");
            return None;
        };
        Some((l, at))
    }

    /// Datagrams on `link` named a key phase it holds no key for, refused (and counted) before
    /// the node by its receive gate ([`crate::relay::gate::Admit::NoKey`]): the link asks for a
    /// handshake, at most once per holdoff, as for one such datagram here. Once per batch.
    pub fn note_empty_slot(&mut self, now: UnixTime, link: Neighbour) {
        if let Some(l) = self.links.get_mut(&link) {
            l.link.handle_empty_slot(now);
        }
        self.drain_link(now, link);
    }

    /// A link payload that did not open: counted by its reason; an empty key slot asks the link
    /// for a handshake.
    pub(super) fn open_failed(&mut self, now: UnixTime, link: Neighbour, e: OpenError) {
        if e == OpenError::NoKey {
            if let Some(l) = self.links.get_mut(&link) {
                l.link.handle_empty_slot(now);
            }
        }
        self.counters.drop(e.reason());
        self.drain_link(now, link);
    }

    /// What an opened link payload is for (§10.3 onwards): `opened` what the keys opened and
    /// whether it is a frame (not a keepalive); the frame is at `buf[FRAME_HEADROOM..]`.
    pub(super) fn after_open(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        at: usize,
        opened: (crate::handshake::Opened, bool),
        buf: &mut [u8],
    ) -> After {
        let Some(l) = self.links.get_mut(&link) else {
            return After::Done(Received::Consumed);
        };
        let accept = &l.accept[at];
        let route = accept.route;
        // The link set after the session's switch takes handshake-class messages only (§9.8).
        if !accept.data && !l.link.sets().takes_data(&accept.set) {
            self.counters.drop("node_set_closed");
            return After::Done(Received::Consumed);
        }
        accept.set.opened_on(route.epoch);
        let (opened, frame) = opened;
        if let Some(phase) = opened.confirmed {
            l.link.handle_confirmed(now, phase, opened.confirmed_key);
            self.drain_link(now, link);
        }
        if !frame {
            self.counters.keepalives += 1;
            return After::Done(Received::Consumed);
        }
        let end = buf.len() - TAG_LEN;
        let repr = match RelayFrame::new_checked(&buf[FRAME_HEADROOM..end]) {
            Ok(f) => RelayRepr::parse(&f),
            Err(e) => {
                // Checked by the open: cannot happen.
                self.counters.drop(OpenError::BadFrame(e).reason());
                return After::Done(Received::Consumed);
            }
        };
        // The frame is buf[FRAME_HEADROOM..len - TAG_LEN], checked; its payload follows the header.
        let frame_end = buf.len() - TAG_LEN;
        let payload = PAYLOAD_AT..PAYLOAD_AT + usize::from(repr.payload_len);
        match repr.kind {
            Kind::Probe => {
                self.handle_probe(now, link, &buf[payload]);
                After::Done(Received::Consumed)
            }
            Kind::Routing => {
                match RoutingMessage::new_checked(&buf[payload]) {
                    Ok(m) => {
                        self.counters.routing_received += 1;
                        match m.message_type() {
                            MessageType::Update => self.table.handle_update(now, link, m.updates()),
                            MessageType::Request => {
                                self.table.handle_request(now, link, m.requests())
                            }
                        }
                    }
                    Err(e) => self.counters.drop(e.reason()),
                }
                self.pump(now);
                After::Done(Received::Consumed)
            }
            Kind::Data | Kind::E2eHandshake => match self.table.forward(&repr, false) {
                Forward::Deliver => self.deliver(now, repr.kind, buf, payload.end),
                Forward::Send { to, hops } => {
                    // §10.5, after the route lookup: no bucket for a destination without a route;
                    // one per ingress link, so that one neighbour's flood starves no other's.
                    if repr.kind == Kind::E2eHandshake
                        && !self.handshake_rate.allow(now, link, repr.destination)
                    {
                        self.counters.drop("relay_handshake_rate");
                        return After::Done(Received::Consumed);
                    }
                    buf[FRAME_HEADROOM + 1] = hops;
                    After::Forward {
                        to,
                        flen: frame_end - FRAME_HEADROOM,
                    }
                }
                Forward::Drop(d) => {
                    self.counters.drop(d.reason());
                    After::Done(Received::Consumed)
                }
            },
        }
    }

    pub(super) fn handle_probe(&mut self, now: UnixTime, link: Neighbour, payload: &[u8]) {
        let probe = match Probe::new_checked(payload) {
            Ok(p) => ProbeRepr::parse(&p),
            Err(e) => return self.counters.drop(e.reason()),
        };
        match probe.probe_type {
            ProbeType::Request => {
                self.counters.probes_answered += 1;
                self.pending.push_back(Pending::Probe(link, probe.reply()));
            }
            ProbeType::Reply => {
                if let Some(l) = self.links.get_mut(&link) {
                    if !l.monitor.handle_reply(now, probe.sequence) {
                        self.counters.drop("relay_probe_unexpected");
                    }
                }
                self.pump(now);
            }
        }
    }

    /// §10.3 step 5: seal the frame (hop limit already lowered) for `to`'s link in the buffer it
    /// arrived in.
    /// Seals a frame of `flen` bytes in `buf` for link `to` (under the node: the one-thread path).
    pub(super) fn forward(&mut self, to: Neighbour, buf: &mut [u8], flen: usize) -> Received {
        match self.seal_job(to, flen) {
            Finish::Done(r) => r,
            Finish::Seal(job) => match job.seal(buf) {
                Ok(t) => Received::Forward(t),
                Err(e) => {
                    self.counters.drop(e.reason());
                    Received::Consumed
                }
            },
            // `seal_job` makes none.
            Finish::Deliver(_) => Received::Consumed,
        }
    }

    /// What sealing a frame of `flen` bytes for link `to` needs: its sealer, its route of the
    /// epoch and its send set's header key. Counts the frame as forwarded.
    pub(super) fn seal_job(&mut self, to: Neighbour, flen: usize) -> Finish {
        let Some(l) = self.links.get_mut(&to) else {
            self.counters.drop("relay_no_route");
            return Finish::Done(Received::Consumed);
        };
        let Some(sealer) = l.keys.send() else {
            l.link.handle_no_send_key();
            self.counters.drop("node_no_key");
            return Finish::Done(Received::Consumed);
        };
        self.counters.forwarded += 1;
        Finish::Seal(SealJob {
            link: to,
            route: l.schedule.send,
            sealer: sealer.clone(),
            set: l.send_set.clone(),
            flen,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::relay::frame::MIN_FRAME_MAX;
    use crate::relay::node::tests::{at, id, relay_routing, IN, OUT};
    use crate::relay::HOP_LIMIT;
    use crate::tunnel::frame_payload_len;

    /// The passes a driver with several workers takes (`begin_datagram`, `OpenJob::open`
    /// without the node, `finish_datagram`, `SealJob::seal` without it) forward what
    /// `handle_datagram` forwards, byte for byte; one datagram begun twice before either is
    /// finished (a replay racing its original through another worker) is forwarded once and
    /// counted as a replay once; a forged one fails its open and is counted as a bad tag.
    #[test]
    fn the_passes_forward_as_one_call_and_a_racing_replay_once() {
        let d = id(1);
        let t0 = at(1_000);
        let (mut r, peer, s) = relay_routing(t0, &[d]);
        let (mut twin, _, _) = relay_routing(t0, &[d]);
        let route = peer.schedule(t0).send;
        let datagram = || {
            let repr = RelayRepr {
                kind: Kind::Data,
                hops: HOP_LIMIT,
                payload_len: 32,
                destination: d,
            };
            let mut buf = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
            let header = peer.send_header_key();
            let n = s
                .seal_frame_protected(&route, header, &repr, &[0x11; 32], MIN_FRAME_MAX, &mut buf)
                .unwrap();
            buf.truncate(n);
            buf
        };
        let (l, rm) = (route.remote, route.local);
        let original = datagram();
        let (mut one, mut two) = (original.clone(), original.clone());
        let begin =
            |r: &mut RelayNode, buf: &mut Vec<u8>| match r.begin_datagram(t0, IN, l, rm, buf) {
                Step::Open(job) => job,
                other => panic!("not an open job: {other:?}"),
            };
        let j1 = begin(&mut r, &mut one);
        let j2 = begin(&mut r, &mut two);
        let (o1, o2) = (j1.open(&mut one), j2.open(&mut two));
        assert_eq!((o1, o2), (Ok(()), Ok(())));
        let Finish::Seal(seal) = r.finish_datagram(t0, &j1, o1, &mut one) else {
            panic!("the original is not forwarded");
        };
        assert!(matches!(
            r.finish_datagram(t0, &j2, o2, &mut two),
            Finish::Done(Received::Consumed)
        ));
        assert_eq!(r.counters().drops("open_replay"), 1);
        let sent = seal.seal(&mut one).unwrap();
        assert_eq!(sent.link, OUT);
        // The same datagram through one call of a twin relay: the same frame on the link out
        // (the counter and its sealer start alike), byte for byte.
        let mut whole = original.clone();
        match twin.handle_datagram(t0, IN, l, rm, &mut whole) {
            Received::Forward(t) => assert_eq!(whole[..t.len], one[..sent.len]),
            other => panic!("not forwarded: {other:?}"),
        }
        // A forged datagram (one bit of its ciphertext) opens to nothing and is counted.
        let mut forged = datagram();
        forged[40] ^= 1;
        let job = begin(&mut r, &mut forged);
        let opened = job.open(&mut forged);
        assert_eq!(opened, Err(OpenError::BadTag));
        assert!(matches!(
            r.finish_datagram(t0, &job, opened, &mut forged),
            Finish::Done(Received::Consumed)
        ));
        assert_eq!(r.counters().drops("open_bad_tag"), 1);
        assert_eq!(r.counters().forwarded, 1);
    }
}
