//! An edge gateway's end-to-end streams (§10.5): per peer its handshake carried through the
//! relays, its route sets in the route tag index, and inner packets sealed for it.

use std::sync::Arc;

use super::{
    apply_link_events, encrypt_only, Event, InnerJob, NodeError, Pending, RelayNode, SealJob,
    Transmit,
};
use crate::endpoint::{IndexError, PeerId};
use crate::handshake::{Handshake, ReceiveKeys};
use crate::link::{Keys, Link, TransmitKind};
use crate::relay::e2e::{e2e_relay_payload_len, RouteTagKey, VirtualRoute, ROUTE_TAG_LEN};
use crate::relay::frame::HEADER_LEN;
use crate::relay::table::{Forward, RoutingTable};
use crate::relay::tags::TagIndex;
use crate::relay::{frame_len, Kind, NodeId, RelayRepr, HOP_LIMIT};
use crate::route_sets::RouteSet;
use crate::{Sealer, Stream, UnixTime};

/// The caller's name for one end-to-end peer of an edge gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct E2eId(pub u32);

/// One end-to-end stream of an edge gateway, carried over virtual routes (§10.5).
#[derive(Debug)]
pub(super) struct E2eStream {
    pub(super) destination: NodeId,
    /// The handshake through the relays, key life and route sets (§9, §10.5); with a
    /// pre-shared key, the link set only.
    pub(super) link: Link,
    /// Its receive keys and the sending key that seals data (None before the first handshake
    /// and after expiry).
    pub(super) keys: Keys,
    /// The set data is sent on and its virtual route of the epoch.
    pub(super) send_set: Arc<RouteSet>,
    pub(super) via: VirtualRoute,
    /// The bound sets, each in one slot of the route tag index ([`e2e_slot`]).
    pub(super) slots: [Option<E2eSlot>; E2E_SLOTS],
    pub(super) next_change: UnixTime,
}

/// One bound route set of an end-to-end stream in the route tag index.
#[derive(Debug)]
pub(super) struct E2eSlot {
    pub(super) set: Arc<RouteSet>,
    /// Whether data may arrive on it ([`crate::route_sets::Bound::data`]).
    pub(super) data: bool,
    pub(super) tag_key: RouteTagKey,
}

/// Route tag index slots per end-to-end stream: more than the sets a stream binds at once (the
/// link set, the current set, its parent, and the answered sets of an unfinished handshake,
/// at most [`crate::handshake::MAX_PENDING`]).
pub(super) const E2E_SLOTS: usize = 16;

/// The index id of slot `k` of end-to-end stream `id` holding the set numbered `set`.
pub(super) fn e2e_slot(id: E2eId, k: usize, set: u64) -> PeerId {
    let index = (id.0 as usize).saturating_mul(E2E_SLOTS).saturating_add(k);
    PeerId::from_parts(
        u32::try_from(index).unwrap_or(u32::MAX),
        // Set numbers only grow; a slot reused by a later set gets a new generation.
        set as u32,
    )
}

impl E2eStream {
    pub(super) fn new(now: UnixTime, destination: NodeId, link: Link, keys: Keys) -> E2eStream {
        let send_set = link.sets().link().clone();
        let epoch = link.stream().epoch_at(now);
        let via = VirtualRoute::new(
            send_set.stream.route(epoch),
            &RouteTagKey::derive(&send_set.stream.config().key),
        );
        E2eStream {
            destination,
            link,
            keys,
            send_set,
            via,
            slots: Default::default(),
            next_change: now,
        }
    }

    /// Makes the route tag index hold exactly the bound sets' accept windows of `now`'s epoch,
    /// and the send set and its virtual route current. Once per epoch and per change of sets.
    pub(super) fn sync(
        &mut self,
        id: E2eId,
        tags: &mut TagIndex,
        now: UnixTime,
    ) -> Result<(), IndexError> {
        let selection = self.link.select(now);
        let epoch = self.link.stream().epoch_at(now);
        // Sets no longer bound leave the index.
        for (k, slot) in self.slots.iter_mut().enumerate() {
            let keep = slot
                .as_ref()
                .is_some_and(|s| selection.bound.iter().any(|b| Arc::ptr_eq(&b.set, &s.set)));
            if !keep {
                if let Some(s) = slot.take() {
                    tags.remove_set(e2e_slot(id, k, s.set.id))?;
                }
            }
        }
        // Bound sets enter it (or update whether they take data), and every window moves on.
        for b in &selection.bound {
            let at = self
                .slots
                .iter()
                .position(|s| s.as_ref().is_some_and(|s| Arc::ptr_eq(&s.set, &b.set)));
            let k = match at {
                Some(k) => k,
                None => {
                    let Some(k) = self.slots.iter().position(Option::is_none) else {
                        continue;
                    };
                    let tag_key = RouteTagKey::derive(&b.set.stream.config().key);
                    tags.add_set(e2e_slot(id, k, b.set.id), tag_key.clone())?;
                    self.slots[k] = Some(E2eSlot {
                        set: b.set.clone(),
                        data: b.data,
                        tag_key,
                    });
                    k
                }
            };
            if let Some(slot) = &mut self.slots[k] {
                slot.data = b.data;
                let stream = &slot.set.stream;
                tags.set_window(e2e_slot(id, k, slot.set.id), epoch, |x| stream.route(x))?;
            }
        }
        self.send_set = selection.send;
        let key = self
            .slot_of(&self.send_set)
            .map(|s| s.tag_key.clone())
            .unwrap_or_else(|| RouteTagKey::derive(&self.send_set.stream.config().key));
        self.via = VirtualRoute::new(self.send_set.stream.route(epoch), &key);
        self.next_change = self.link.stream().epoch_start(epoch.next());
        Ok(())
    }

    pub(super) fn slot_of(&self, set: &Arc<RouteSet>) -> Option<&E2eSlot> {
        self.slots
            .iter()
            .flatten()
            .find(|s| Arc::ptr_eq(&s.set, set))
    }
}

impl RelayNode {
    /// Adds an end-to-end peer: the edge gateway `destination`, and `stream` between the two
    /// protected hosts' true addresses (encrypt mode, pre-shared key) with its `sealer`. Its
    /// virtual routes enter the route tag index at once.
    pub fn add_e2e(
        &mut self,
        now: UnixTime,
        id: E2eId,
        destination: NodeId,
        stream: Stream,
        sealer: Sealer,
    ) -> Result<(), NodeError> {
        encrypt_only(&stream)?;
        let keys = Keys::pre_shared(Arc::new(sealer), ReceiveKeys::single(stream.opener()));
        let e = E2eStream::new(now, destination, Link::pre_shared(stream), keys);
        self.insert_e2e(now, id, e)
    }

    /// Adds an end-to-end peer keyed by Noise IK handshakes carried through the relays (§10.1,
    /// §10.5): the edge gateway `destination`, `stream` between the two protected hosts' true
    /// addresses (encrypt mode) keyed by the handshake's link key ([`Handshake::link_key`]), and
    /// `hs` with the other edge gateway's identity and the hosts' addresses as true addresses.
    /// Inner packets are refused (`node_no_key`) until a handshake completes; the first
    /// initiation leaves at the next [`RelayNode::handle_timeout`] with a route to `destination`.
    pub fn add_e2e_handshake(
        &mut self,
        now: UnixTime,
        id: E2eId,
        destination: NodeId,
        stream: Stream,
        hs: Handshake,
    ) -> Result<(), NodeError> {
        encrypt_only(&stream)?;
        let link = Link::with_handshake(stream, hs);
        let e = E2eStream::new(now, destination, link, Keys::new());
        self.insert_e2e(now, id, e)
    }

    pub(super) fn insert_e2e(
        &mut self,
        now: UnixTime,
        id: E2eId,
        mut e: E2eStream,
    ) -> Result<(), NodeError> {
        if self.own.is_none() {
            return Err(NodeError::NotAnEdge);
        }
        if self.own == Some(e.destination) {
            return Err(NodeError::OwnDestination(e.destination));
        }
        if self.e2e.contains_key(&id) {
            return Err(NodeError::PeerExists(id));
        }
        if let Err(err) = e.sync(id, &mut self.tags, now) {
            for (k, slot) in e.slots.iter().enumerate() {
                if let Some(s) = slot {
                    let _ = self.tags.remove_set(e2e_slot(id, k, s.set.id));
                }
            }
            return Err(err.into());
        }
        self.next_change = self.next_change.min(e.next_change);
        self.e2e.insert(id, e);
        Ok(())
    }

    /// An end-to-end peer's handshake (None for a pre-shared one).
    pub fn e2e_handshake(&self, id: E2eId) -> Option<&Handshake> {
        self.e2e.get(&id).and_then(|e| e.link.handshake())
    }

    /// Whether an end-to-end peer holds a sending key (a pre-shared one always does).
    pub fn e2e_keyed(&self, id: E2eId) -> bool {
        self.e2e.get(&id).is_some_and(|e| e.keys.send().is_some())
    }

    /// The id of the route set an end-to-end peer sends on (0: the link set, §9.8).
    pub fn e2e_route_set(&self, id: E2eId) -> Option<u64> {
        self.e2e.get(&id).map(|e| e.send_set.id)
    }

    /// Seals `inner` (an IPv6 packet between end-to-end peer `to`'s two hosts) for the epoch's
    /// virtual route, frames it for the peer's edge gateway and seals the frame for the next
    /// hop's link, into `out`. The caller sends `out[..len]` as the returned [`Transmit`] says.
    /// [`RelayNode::begin_inner`] and [`InnerJob::seal`] in a row.
    pub fn send_inner(
        &mut self,
        now: UnixTime,
        to: E2eId,
        inner: &[u8],
        out: &mut [u8],
    ) -> Result<Transmit, NodeError> {
        let job = self.begin_inner(now, to, inner.len())?;
        job.seal(inner, out)
    }

    /// What sealing an inner packet of `inner_len` bytes for end-to-end peer `to` needs, for a
    /// driver that seals without the node ([`InnerJob::seal`]): the route lookup, the peer's and
    /// the next link's keys, the epoch's routes. Counts the packet as originated.
    pub fn begin_inner(
        &mut self,
        now: UnixTime,
        to: E2eId,
        inner_len: usize,
    ) -> Result<InnerJob, NodeError> {
        self.refresh(now);
        let e = self.e2e.get_mut(&to).ok_or(NodeError::UnknownPeer(to))?;
        let Some(e2e_sealer) = e.keys.send() else {
            e.link.handle_no_send_key();
            self.counters.drop("node_no_key");
            return Err(NodeError::NoE2eKey(to));
        };
        let len = e2e_relay_payload_len(inner_len);
        let max = self.frame_max - HEADER_LEN;
        if len > max {
            return Err(NodeError::TooLong {
                len: inner_len,
                max: inner_len.saturating_sub(len - max),
            });
        }
        let flen = frame_len(len, self.frame_max);
        let repr = RelayRepr {
            kind: Kind::Data,
            hops: HOP_LIMIT,
            // len <= frame_max - 12, and frame_max is at most a path MTU.
            payload_len: u16::try_from(len).unwrap_or(u16::MAX),
            destination: e.destination,
        };
        let next = match self.table.forward(&repr, true) {
            Forward::Send { to, .. } => to,
            Forward::Deliver | Forward::Drop(_) => {
                self.counters.drop("relay_no_route");
                return Err(NodeError::NoRoute(e.destination));
            }
        };
        let l = self
            .links
            .get_mut(&next)
            .ok_or(NodeError::UnknownLink(next))?;
        let Some(sealer) = l.keys.send() else {
            l.link.handle_no_send_key();
            self.counters.drop("node_no_key");
            return Err(NodeError::NoKey(next));
        };
        let stream = &e.send_set.stream;
        if stream.send_header_key().is_none() {
            return Err(NodeError::NotEncrypt {
                mode: stream.mode(),
            });
        }
        self.counters.originated += 1;
        Ok(InnerJob {
            e2e: e2e_sealer.clone(),
            e2e_set: e.send_set.clone(),
            via: e.via,
            repr,
            link: SealJob {
                link: next,
                route: l.schedule.send,
                sealer: sealer.clone(),
                set: l.send_set.clone(),
                flen,
            },
        })
    }

    /// Applies what an end-to-end stream's handshake did: its new keys and sets (the route tag
    /// index follows them), and its messages, queued as relay payloads (§10.5: the tag of the
    /// receiver's virtual end under the set's tag key, then the message as the link made it,
    /// header protection on).
    pub(super) fn drain_e2e(&mut self, now: UnixTime, id: E2eId) {
        let Some(e) = self.e2e.get_mut(&id) else {
            return;
        };
        let events = &mut self.events;
        let sets = apply_link_events(&mut e.link, &mut e.keys, |keys| {
            events.push_back(match keys {
                Some((initiator, rekey)) => Event::E2eKeyed {
                    peer: id,
                    initiator,
                    rekey,
                },
                None => Event::E2eKeysExpired { peer: id },
            });
        });
        if sets {
            if e.sync(id, &mut self.tags, now).is_err() {
                self.counters.drop("node_tag_index");
            }
            self.next_change = self.next_change.min(e.next_change);
        }
        while let Some(t) = e.link.poll_transmit() {
            let Some(slot) = e.slots.iter().flatten().find(|s| s.set.id == t.set) else {
                self.counters.drop("node_e2e_unbound_set");
                continue;
            };
            let kind = match t.kind {
                TransmitKind::Initiation | TransmitKind::Response => Kind::E2eHandshake,
                TransmitKind::Keepalive | TransmitKind::Notice => Kind::Data,
            };
            let mut payload = Vec::with_capacity(ROUTE_TAG_LEN + t.bytes.len());
            payload.extend_from_slice(&slot.tag_key.tag(&t.dst).0);
            payload.extend_from_slice(&t.bytes);
            self.pending.push_back(Pending::E2e {
                kind,
                destination: e.destination,
                payload,
            });
        }
    }
}

/// Whether an end-to-end stream's timers run: it holds keys (they expire, rekey), or a route to
/// its edge gateway exists (a handshake can arrive).
pub(super) fn e2e_active(table: &RoutingTable, e: &E2eStream) -> bool {
    e.keys.send().is_some() || table.next_hop(&e.destination).is_some()
}
