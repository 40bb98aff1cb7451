//! What one datagram or inner packet leaves to the caller: the outputs ([`Transmit`],
//! [`Received`]) and the steps a driver whose threads share the node behind a lock runs
//! without it ([`OpenJob`], [`DeliverJob`], [`SealJob`], [`InnerJob`]).

use std::ops::Range;
use std::sync::Arc;

use super::{E2eId, NodeError, PAYLOAD_AT};
use crate::endpoint::PeerId;
use crate::relay::e2e::{e2e_relay_payload_len, seal_e2e, VirtualRoute};
use crate::relay::table::Neighbour;
use crate::relay::RelayRepr;
use crate::route_sets::RouteSet;
use crate::tunnel::{frame_payload_len, FRAME_HEADROOM};
use crate::{OpenError, Route, SealError, Sealer};

/// A datagram to send: `len` bytes of the caller's buffer as the UDP payload, on `link`, from
/// `route.local` to `route.remote`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transmit {
    /// The link (neighbour) to send on.
    pub link: Neighbour,
    /// The link's route of the epoch: source and destination address and port.
    pub route: Route,
    /// Bytes of the UDP payload, from the start of the buffer.
    pub len: usize,
}

/// What [`RelayNode::handle_datagram`](super::RelayNode::handle_datagram) left in the caller's
/// buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Nothing to do with the buffer: the datagram was link-local (a probe, a reply, a routing
    /// message: answers are queued for
    /// [`RelayNode::poll_transmit`](super::RelayNode::poll_transmit)), a keepalive, or dropped and
    /// counted.
    Consumed,
    /// A frame for another node, sealed again for the next link in the same buffer: send
    /// `buf[..len]`.
    Forward(Transmit),
    /// An inner packet from end-to-end peer `from` for the protected side: `buf[range]`.
    Deliver {
        /// The end-to-end peer it came from.
        from: E2eId,
        /// Where the restored inner IPv6 packet is in the buffer.
        range: Range<usize>,
    },
}

/// What [`RelayNode::begin_datagram`](super::RelayNode::begin_datagram) left to do.
#[derive(Debug)]
pub enum Step {
    /// Nothing more: the result.
    Done(Received),
    /// The AEAD: [`OpenJob::open`] on the buffer without the node, then
    /// [`RelayNode::finish_datagram`](super::RelayNode::finish_datagram).
    Open(OpenJob),
    /// The rest under the node: [`RelayNode::resume_datagram`](super::RelayNode::resume_datagram).
    Resume(Resume),
}

/// A link payload to open without the node
/// ([`RelayNode::begin_datagram`](super::RelayNode::begin_datagram)).
#[derive(Debug)]
pub struct OpenJob {
    pub(in crate::relay) link: Neighbour,
    pub(in crate::relay) route: Route,
    /// The receive key slot whose key made `frame`.
    pub(in crate::relay) slot: usize,
    pub(in crate::relay) frame: crate::FrameJob,
}

impl OpenJob {
    /// Verifies and decrypts the link payload in `buf` in place (the buffer
    /// [`RelayNode::begin_datagram`](super::RelayNode::begin_datagram) saw); touches nothing of the
    /// node.
    pub fn open(&self, buf: &mut [u8]) -> Result<(), OpenError> {
        self.frame.open(buf)
    }
}

/// A link payload whose work goes on under the node
/// ([`RelayNode::resume_datagram`](super::RelayNode::resume_datagram)).
#[derive(Debug)]
pub struct Resume {
    pub(super) link: Neighbour,
    pub(super) route: Route,
}

/// What [`RelayNode::finish_datagram`](super::RelayNode::finish_datagram) left to do.
#[derive(Debug)]
pub enum Finish {
    /// Nothing more: the result.
    Done(Received),
    /// A frame to seal for the next link without the node: [`SealJob::seal`].
    Seal(SealJob),
    /// An end-to-end payload for this edge gateway to open without the node ([`DeliverJob::open`]),
    /// then [`RelayNode::finish_delivery`](super::RelayNode::finish_delivery).
    Deliver(DeliverJob),
}

/// An end-to-end payload for this edge gateway, to open without the node: its end-to-end stream and
/// route set (slot), the virtual route it arrived on, and the AEAD step ([`crate::PacketJob`]).
/// Made by [`RelayNode::finish_datagram`](super::RelayNode::finish_datagram) after the route tag,
/// the set's header protection and the counter's replay check; the counter is taken into the replay
/// window by [`RelayNode::finish_delivery`](super::RelayNode::finish_delivery) once the tag
/// verified.
#[derive(Debug)]
pub struct DeliverJob {
    pub(super) from: E2eId,
    /// The stream's slot the set is in, and the set's index id (checked again at the finish).
    pub(super) slot: usize,
    pub(super) set: PeerId,
    pub(super) route: Route,
    /// The receive key slot whose key made `job`.
    pub(super) key_slot: usize,
    pub(super) job: crate::PacketJob,
}

impl DeliverJob {
    /// Verifies and decrypts the end-to-end payload and restores the inner packet in `buf` (the
    /// buffer [`RelayNode::finish_datagram`](super::RelayNode::finish_datagram) saw); returns where
    /// the packet is. Touches nothing of the node.
    pub fn open(&self, buf: &mut [u8]) -> Result<Range<usize>, OpenError> {
        self.job.open(buf)
    }
}

/// A forwarded frame to seal for its next link, without the node: the link's sealer (its
/// counter is atomic), route of the epoch and send set (header protection).
#[derive(Debug)]
pub struct SealJob {
    pub(super) link: Neighbour,
    pub(super) route: Route,
    pub(super) sealer: Arc<Sealer>,
    pub(super) set: Arc<RouteSet>,
    pub(super) flen: usize,
}

impl SealJob {
    /// Seals the frame (`buf[FRAME_HEADROOM..]`, `flen` bytes) for the next link in place and
    /// protects its header: send `buf[..len]` as the [`Transmit`] says.
    pub fn seal(&self, buf: &mut [u8]) -> Result<Transmit, SealError> {
        let header = self.set.stream.send_header_key();
        self.sealer
            .seal_frame_in_place_protected(&self.route, header, buf, self.flen)?;
        Ok(Transmit {
            link: self.link,
            route: self.route,
            len: frame_payload_len(self.flen),
        })
    }
}

/// An inner packet to seal end to end and for the next link, without the node
/// ([`RelayNode::begin_inner`](super::RelayNode::begin_inner)): the end-to-end peer's sealer, send
/// set and virtual route of the epoch, the frame's header, and the next link's [`SealJob`].
#[derive(Debug)]
pub struct InnerJob {
    pub(super) e2e: Arc<Sealer>,
    pub(super) e2e_set: Arc<RouteSet>,
    pub(super) via: VirtualRoute,
    /// The frame's header; its payload length is the end-to-end payload's.
    pub(super) repr: RelayRepr,
    pub(super) link: SealJob,
}

impl InnerJob {
    /// The bytes [`InnerJob::seal`] writes: the link payload.
    pub fn wire_len(&self) -> usize {
        frame_payload_len(self.link.flen)
    }

    /// Seals `inner` (of the length `begin_inner` was given) into `out`: end to end, framed,
    /// then for the next link. The caller sends `out[..len]` as the [`Transmit`] says.
    pub fn seal(&self, inner: &[u8], out: &mut [u8]) -> Result<Transmit, NodeError> {
        let need = frame_payload_len(self.link.flen);
        let have = out.len();
        let Some(buf) = out.get_mut(..need) else {
            return Err(NodeError::BufferTooSmall { have, need });
        };
        let stream = &self.e2e_set.stream;
        let Some(hk) = stream.send_header_key() else {
            return Err(NodeError::NotEncrypt {
                mode: stream.mode(),
            });
        };
        // The frame header says how long the payload is: an inner packet of another length
        // than `begin_inner` was told would not match it.
        let len = usize::from(self.repr.payload_len);
        if e2e_relay_payload_len(inner.len()) != len {
            return Err(NodeError::JobLength {
                len: inner.len(),
                job: len.saturating_sub(e2e_relay_payload_len(0)),
            });
        }
        let n = seal_e2e(&self.e2e, hk, &self.via, inner, &mut buf[PAYLOAD_AT..])?;
        debug_assert_eq!(n, len);
        self.repr
            .emit(&mut buf[FRAME_HEADROOM..FRAME_HEADROOM + self.link.flen])
            .map_err(SealError::BadFrame)?;
        Ok(self.link.seal(buf)?)
    }
}

/// What an opened link payload asks for.
pub(super) enum After {
    Done(Received),
    /// Open the end-to-end payload without the node ([`DeliverJob::open`]).
    Deliver(DeliverJob),
    /// Seal the frame (`flen` bytes) for link `to`.
    Forward {
        to: Neighbour,
        flen: usize,
    },
}
