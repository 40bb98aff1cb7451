//! One relay network node, sans-IO (docs/PROTOCOL.md §10): the parts of this module put together
//! behind one input/output contract, for a relay, an edge gateway, or both.
//!
//! What it owns, per node: one [`RoutingTable`]; per neighbour a relay link (a [`Link`] over its
//! encrypt-mode MT6D [`Stream`]: handshake or pre-shared key, route sets; its [`ReceiveKeys`],
//! the [`Sealer`] it sends with, its [`LinkMonitor`] and the routes of its bound sets); for an
//! edge gateway, per end-to-end peer its end-to-end stream (a [`Link`] too, its receive keys,
//! sealer and the virtual route of the epoch) and one [`TagIndex`] over all of their sets.
//!
//! What it must not do: touch a socket or a clock, allocate per forwarded packet, or panic on
//! anything a peer sent. Every refusal is counted under its spec label ([`NodeCounters`]).
//!
//! # Scope of this step (docs/PROTOCOL.md §10.13)
//! A **relay link** is keyed either by the Noise IK handshakes of §9 ([`RelayNode::add_link_handshake`]:
//! one [`Link`] per neighbour drives the handshake, rekeying, key phases and route sets of §9.8;
//! the node owns its receive keys and the sending key it hands out) or by a pre-shared key
//! ([`RelayNode::add_link`], a [`Sealer`] whose counter reservation the caller persists, §4.3).
//! Each **end-to-end stream** likewise: keyed by a Noise IK handshake between the two edge
//! gateways' identities carried through the relays ([`RelayNode::add_e2e_handshake`]: its
//! messages are relay payloads of kind `0x02` behind the route tag of the set they travel on,
//! §10.5; its route sets' virtual routes are all in the route tag index), or pre-shared
//! ([`RelayNode::add_e2e`]). A relay forwards kind `0x02` like data within the end-to-end
//! handshake rate limit (§10.5, [`HANDSHAKE_RATE`]). An end-to-end handshake starts when a
//! route to the other edge gateway exists, and again at once when the first route appears.
//! Route moves (§5.2) are answered on a link (notices), never started: a relay does not watch
//! its segment for collisions; virtual routes never move.
//!
//! # Decisions where the spec leaves the driver free
//! - **The node removes and applies header protection (§4.5)**, on both the link layer and the
//!   end-to-end layer: it holds every key, so the caller moves opaque UDP payloads only.
//! - **The caller names the link and the addresses a datagram arrived on**; the node matches them
//!   against the link's accept routes (e-1, e, e+1) it keeps per epoch
//!   ([`Event::LinkSchedule`] tells the caller what to bind and where to send from). A datagram
//!   on no accept route is `node_unknown_route`.
//! - **Data packets are written into the caller's buffer**, not queued: a forwarded frame is
//!   opened and sealed again where it arrived ([`Received::Forward`]), an inner packet for the
//!   protected side is restored where its e2e payload lay ([`Received::Deliver`]), and
//!   [`RelayNode::send_inner`] seals into the caller's buffer. Link-local frames (probes,
//!   replies, routing messages) are queued as headers and written at
//!   [`RelayNode::poll_transmit`].
//! - **The handshake rate limit (§10.5) is a token bucket per ingress link and destination**
//!   (20 frames of burst, one more every 50 ms), checked after the route lookup (§10.3 step 4),
//!   so only destinations the node routes to get a bucket, and at most [`HANDSHAKE_BUCKETS`] of
//!   them: a full table forgets the buckets that have refilled, and if every one is still in
//!   use, the one closest to full (the least forgiven by forgetting it). Per ingress link, so
//!   that a neighbour flooding handshakes for D spends its own share and never another link's.
//!
//! # Call order (as quinn-proto's `Connection`)
//! 1. [`RelayNode::new`] (or [`RelayNode::relay`], [`RelayNode::edge`]); [`RelayNode::add_link`]
//!    per neighbour, [`RelayNode::add_e2e`] per end-to-end peer (edge gateways).
//! 2. Per datagram received on a link: [`RelayNode::handle_datagram`], then act on its
//!    [`Received`] (send the buffer, deliver the inner packet, or nothing).
//!    A driver whose threads share the node behind a lock takes the same steps in passes:
//!    [`super::gate::RxGate::admit`] without the node (refuses junk and forgeries, opens the
//!    rest; [`RelayNode::begin_datagram`] for what it leaves to the node), then
//!    [`RelayNode::finish_datagram`] under it, [`SealJob::seal`] or [`DeliverJob::open`]
//!    without it, and [`RelayNode::finish_delivery`] under it for a delivery. It makes a new
//!    gate ([`RelayNode::rx_gate`]) whenever [`RelayNode::rx_version`] moves on, before it sends
//!    anything [`RelayNode::poll_transmit`] gives.
//! 3. Per inner packet from the protected side: [`RelayNode::send_inner`], send what it wrote.
//! 4. At [`RelayNode::poll_timeout`]: [`RelayNode::handle_timeout`] (with the caller's RNG).
//!    A node with handshake-keyed links needs [`RelayNode::set_entropy`] first: 32 fresh bytes
//!    per handshake message it makes.
//! 5. After each of 1-4: send every [`RelayNode::poll_transmit`] and apply every
//!    [`RelayNode::poll_event`] (bind a link's new routes, log route changes).
//!
//! Buffers: every datagram buffer given to the node must hold
//! [`crate::tunnel::frame_payload_len`]`(frame_max)` bytes to take any frame of the network.

use std::collections::{BTreeMap, VecDeque};
use std::net::SocketAddrV6;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use super::cost::LinkMonitor;
use super::e2e::{e2e_relay_payload_len, seal_e2e, RouteTagKey, VirtualRoute, ROUTE_TAG_LEN};
use super::frame::{RelayFrame, HEADER_LEN, MIN_FRAME_MAX};
use super::probe::{Probe, ProbeRepr, ProbeType};
use super::routing::{MessageType, RoutingMessage, RoutingRepr};
use super::table::{Forward, Neighbour, RoutingTable};
use super::tags::TagIndex;
use super::{frame_len, Kind, Metric, NodeId, RelayError, RelayRepr, HOP_LIMIT};
use crate::endpoint::{IndexError, IndexSeed, PeerId};
use crate::handshake::{is_handshake, Handshake, ReceiveKeys};
use crate::link::{Event as LinkEvent, Link, TransmitKind};
use crate::moves::is_notice;
use crate::route_sets::RouteSet;
use crate::tunnel::{frame_payload_len, FRAME_HEADROOM, OPEN_HEADROOM, TAG_LEN};
use crate::{Mode, OpenError, Route, Schedule, SealError, Sealer, Stream, UnixTime};

/// Where a frame's relay payload starts in a link payload: counter, relay header.
const PAYLOAD_AT: usize = FRAME_HEADROOM + HEADER_LEN;
/// Where the e2e payload starts in a link payload: counter, relay header, route tag. That is 8
/// bytes short of the headroom [`Opener::open_in_place`] asks for (auth mode's AAD), so the e2e
/// payload is moved 8 bytes on before it is opened: the link tag and padding behind it leave
/// at least 16 bytes of room, and the inner packet is then restored in the receive buffer.
const E2E_AT: usize = PAYLOAD_AT + ROUTE_TAG_LEN;
const _: () = assert!(OPEN_HEADROOM >= E2E_AT && OPEN_HEADROOM - E2E_AT <= TAG_LEN);

/// End-to-end handshake frames (kind `0x02`) a node forwards per second, ingress link and
/// destination (§10.5, `relay_handshake_rate`), and the burst its token bucket allows.
pub const HANDSHAKE_RATE: u32 = 20;
/// The most (ingress link, destination) pairs a node keeps a handshake bucket for (24 bytes
/// each, allocated once). More than this receiving handshakes through one relay in the same
/// second is not a network this protocol sizes for; a flood of forged destinations is held to it.
pub const HANDSHAKE_BUCKETS: usize = 1024;
/// One token every 1 s / [`HANDSHAKE_RATE`].
const HANDSHAKE_INTERVAL: Duration = Duration::from_millis(1000 / HANDSHAKE_RATE as u64);
/// How far ahead of now a bucket's refill time may be for a frame to pass: burst - 1 tokens.
const HANDSHAKE_SLACK: Duration =
    Duration::from_millis((HANDSHAKE_RATE as u64 - 1) * (1000 / HANDSHAKE_RATE as u64));

/// The caller's name for one end-to-end peer of an edge gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct E2eId(pub u32);

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

/// What [`RelayNode::handle_datagram`] left in the caller's buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Received {
    /// Nothing to do with the buffer: the datagram was link-local (a probe, a reply, a routing
    /// message: answers are queued for [`RelayNode::poll_transmit`]), a keepalive, or dropped
    /// and counted.
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

/// What [`RelayNode::begin_datagram`] left to do.
#[derive(Debug)]
pub enum Step {
    /// Nothing more: the result.
    Done(Received),
    /// The AEAD: [`OpenJob::open`] on the buffer without the node, then
    /// [`RelayNode::finish_datagram`].
    Open(OpenJob),
    /// The rest under the node: [`RelayNode::resume_datagram`].
    Resume(Resume),
}

/// A link payload to open without the node ([`RelayNode::begin_datagram`]).
#[derive(Debug)]
pub struct OpenJob {
    pub(super) link: Neighbour,
    pub(super) route: Route,
    /// The receive key slot whose key made `frame`.
    pub(super) slot: usize,
    pub(super) frame: crate::FrameJob,
}

impl OpenJob {
    /// Verifies and decrypts the link payload in `buf` in place (the buffer
    /// [`RelayNode::begin_datagram`] saw); touches nothing of the node.
    pub fn open(&self, buf: &mut [u8]) -> Result<(), OpenError> {
        self.frame.open(buf)
    }
}

/// A link payload whose work goes on under the node ([`RelayNode::resume_datagram`]).
#[derive(Debug)]
pub struct Resume {
    link: Neighbour,
    route: Route,
}

/// What [`RelayNode::finish_datagram`] left to do.
#[derive(Debug)]
pub enum Finish {
    /// Nothing more: the result.
    Done(Received),
    /// A frame to seal for the next link without the node: [`SealJob::seal`].
    Seal(SealJob),
    /// An end-to-end payload for this edge gateway to open without the node
    /// ([`DeliverJob::open`]), then [`RelayNode::finish_delivery`].
    Deliver(DeliverJob),
}

/// An end-to-end payload for this edge gateway, to open without the node: its end-to-end
/// stream and route set (slot), the virtual route it arrived on, and the AEAD step
/// ([`crate::PacketJob`]). Made by [`RelayNode::finish_datagram`] after the route tag, the set's
/// header protection and the counter's replay check; the counter is taken into the replay
/// window by [`RelayNode::finish_delivery`] once the tag verified.
#[derive(Debug)]
pub struct DeliverJob {
    from: E2eId,
    /// The stream's slot the set is in, and the set's index id (checked again at the finish).
    slot: usize,
    set: PeerId,
    route: Route,
    /// The receive key slot whose key made `job`.
    key_slot: usize,
    job: crate::PacketJob,
}

impl DeliverJob {
    /// Verifies and decrypts the end-to-end payload and restores the inner packet in `buf` (the
    /// buffer [`RelayNode::finish_datagram`] saw); returns where the packet is. Touches nothing
    /// of the node.
    pub fn open(&self, buf: &mut [u8]) -> Result<Range<usize>, OpenError> {
        self.job.open(buf)
    }
}

/// A forwarded frame to seal for its next link, without the node: the link's sealer (its
/// counter is atomic), route of the epoch and send set (header protection).
#[derive(Debug)]
pub struct SealJob {
    link: Neighbour,
    route: Route,
    sealer: Arc<Sealer>,
    set: Arc<RouteSet>,
    flen: usize,
}

impl SealJob {
    /// Seals the frame (`buf[FRAME_HEADROOM..]`, `flen` bytes) for the next link in place and
    /// protects its header: send `buf[..len]` as the [`Transmit`] says.
    pub fn seal(&self, buf: &mut [u8]) -> Result<Transmit, SealError> {
        let wire = self
            .sealer
            .seal_frame_in_place(&self.route, buf, self.flen)?;
        protect(&self.set.stream, wire);
        Ok(Transmit {
            link: self.link,
            route: self.route,
            len: frame_payload_len(self.flen),
        })
    }
}

/// An inner packet to seal end to end and for the next link, without the node
/// ([`RelayNode::begin_inner`]): the end-to-end peer's sealer, send set and virtual route of the
/// epoch, the frame's header, and the next link's [`SealJob`].
#[derive(Debug)]
pub struct InnerJob {
    e2e: Arc<Sealer>,
    e2e_set: Arc<RouteSet>,
    via: VirtualRoute,
    /// The frame's header; its payload length is the end-to-end payload's.
    repr: RelayRepr,
    link: SealJob,
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
enum After {
    Done(Received),
    /// Open the end-to-end payload without the node ([`DeliverJob::open`]).
    Deliver(DeliverJob),
    /// Seal the frame (`flen` bytes) for link `to`.
    Forward {
        to: Neighbour,
        flen: usize,
    },
}

/// What the caller applies or may log.
// A schedule is 3 routes; events come a few per link and epoch, not per packet: no box.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A link's routes changed (added, or a new epoch): bind `schedule.accept`'s local
    /// addresses for it, and release the ones no longer there.
    LinkSchedule {
        /// The link.
        link: Neighbour,
        /// Its routes at the time.
        schedule: Schedule,
    },
    /// A link's published cost changed (§10.7; [`Metric::INFINITY`]: declared dead).
    LinkCost {
        /// The link.
        link: Neighbour,
        /// Its new cost.
        cost: Metric,
    },
    /// A handshake on a link completed and its keys are in use (§9.5).
    LinkKeyed {
        /// The link.
        link: Neighbour,
        /// This node sent the answered initiation.
        initiator: bool,
        /// The keys replace earlier ones.
        rekey: bool,
    },
    /// A handshake with an end-to-end peer completed through the relays and its keys are in use.
    E2eKeyed {
        /// The end-to-end peer.
        peer: E2eId,
        /// This node sent the answered initiation.
        initiator: bool,
        /// The keys replace earlier ones.
        rekey: bool,
    },
    /// No rekey succeeded with an end-to-end peer for three rekey intervals: its keys are
    /// erased and it carries nothing until a handshake completes.
    E2eKeysExpired {
        /// The end-to-end peer.
        peer: E2eId,
    },
    /// No rekey succeeded on a link for three rekey intervals: its keys are erased and it carries
    /// nothing until a handshake completes.
    LinkKeysExpired {
        /// The link.
        link: Neighbour,
    },
    /// The next hop towards an edge gateway changed (None: no route).
    RouteChanged {
        /// The edge gateway.
        destination: NodeId,
        /// The link frames for it now leave on.
        next_hop: Option<Neighbour>,
    },
}

/// Why a call was refused. Errors of the caller's configuration or of a send; nothing a peer sent
/// is an error (it is a counted drop).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NodeError {
    /// `frame_max` below the smallest the spec allows (§10.12).
    #[error("frame_max {frame_max} is below {min}")]
    FrameMax {
        /// The value given.
        frame_max: usize,
        /// The smallest allowed.
        min: usize,
    },
    /// Relay links and end-to-end streams must be encrypt mode (§10.1).
    #[error("relay links and end-to-end streams must be encrypt mode, not {mode}")]
    NotEncrypt {
        /// The stream's mode.
        mode: Mode,
    },
    /// A link with this handle exists.
    #[error("link {0:?} already exists")]
    LinkExists(Neighbour),
    /// No link with this handle.
    #[error("no link {0:?}")]
    UnknownLink(Neighbour),
    /// An end-to-end peer with this handle exists.
    #[error("end-to-end peer {0:?} already exists")]
    PeerExists(E2eId),
    /// No end-to-end peer with this handle.
    #[error("no end-to-end peer {0:?}")]
    UnknownPeer(E2eId),
    /// End-to-end streams belong to edge gateways; this node has no id of its own.
    #[error("a relay without an own id has no end-to-end streams")]
    NotAnEdge,
    /// The end-to-end destination is this node.
    #[error("end-to-end destination {0} is this node")]
    OwnDestination(NodeId),
    /// The route tag index refused the set.
    #[error("route tag index: {0}")]
    Index(#[from] IndexError),
    /// No route to the destination (counted as `relay_no_route`).
    #[error("no route to {0}")]
    NoRoute(NodeId),
    /// The inner packet does not fit a frame of `frame_max`.
    #[error("inner packet of {len} bytes, at most {max} fit a frame")]
    TooLong {
        /// The inner packet's length.
        len: usize,
        /// The longest that fits.
        max: usize,
    },
    /// The end-to-end peer holds no sending key yet (its handshake through the relays is under
    /// way) or any more (expired); counted as `node_no_key`.
    #[error("end-to-end peer {0:?} has no key yet")]
    NoE2eKey(E2eId),
    /// The link to the next hop holds no sending key yet (its handshake is under way) or any
    /// more (expired); counted as `node_no_key`.
    #[error("link {0:?} has no key yet")]
    NoKey(Neighbour),
    /// [`InnerJob::seal`] was given an inner packet of another length than
    /// [`RelayNode::begin_inner`] (a caller's mistake).
    #[error("inner packet of {len} bytes for a job made for {job} bytes")]
    JobLength {
        /// The inner packet's length.
        len: usize,
        /// The length the job was made for.
        job: usize,
    },
    /// The caller's buffer is too small.
    #[error("buffer of {have} bytes, need {need}")]
    BufferTooSmall {
        /// Bytes given.
        have: usize,
        /// Bytes needed.
        need: usize,
    },
    /// Sealing failed (counter reservation, malformed inner packet...).
    #[error("seal: {0}")]
    Seal(#[from] SealError),
}

/// What the node did, and every drop by its label. A label's first drop allocates its entry; no
/// later one does.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeCounters {
    /// Frames forwarded to another link (§10.3 step 5): handed to its sealer (a seal that then
    /// fails is also counted, by its reason or by the driver).
    pub forwarded: u64,
    /// Inner packets restored for the protected side.
    pub delivered: u64,
    /// Inner packets sealed and sent by this edge gateway.
    pub originated: u64,
    /// Probe requests answered.
    pub probes_answered: u64,
    /// Routing messages received and believed.
    pub routing_received: u64,
    /// Link and end-to-end keepalives received.
    pub keepalives: u64,
    drops: BTreeMap<&'static str, u64>,
}

impl NodeCounters {
    /// Drops counted under `label` (the spec's names: `open_replay`, `open_bad_tag`,
    /// `relay_bad_kind`, `relay_hop_limit`, `relay_no_route`, `relay_unknown_tag`, ...).
    pub fn drops(&self, label: &str) -> u64 {
        self.drops.get(label).copied().unwrap_or(0)
    }
    /// Every label with its count.
    pub fn drop_labels(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.drops.iter().map(|(k, v)| (*k, *v))
    }
    /// Drops of every label.
    pub fn dropped(&self) -> u64 {
        self.drops.values().sum()
    }
    fn drop(&mut self, label: &'static str) {
        *self.drops.entry(label).or_insert(0) += 1;
    }
}

/// One relay link: an encrypt-mode MT6D stream and its keys (handshakes or pre-shared), its
/// route sets' routes at the epoch, and its probes.
#[derive(Debug)]
struct RelayLink {
    /// The handshake, key life and route sets (§9); with a pre-shared key, the link set only.
    link: Link,
    recv: ReceiveKeys,
    /// Seals everything sent on the link; None before the first handshake and after expiry.
    send: Option<Arc<Sealer>>,
    monitor: LinkMonitor,
    /// The routes of the set data is sent on.
    schedule: Schedule,
    /// The set data is sent on (its header keys protect what the node sends).
    send_set: Arc<RouteSet>,
    /// Every bound set's accept routes (e-1, e, e+1), in the order [`Link::select`] gives them.
    accept: Vec<Accept>,
    /// When any bound set's routes change next.
    next_change: UnixTime,
    /// Moves on at every [`RelayLink::recompute`] (part of [`RelayNode::rx_version`]).
    routes_version: u64,
}

/// One accept route of a link and the set it belongs to.
#[derive(Debug)]
struct Accept {
    set: Arc<RouteSet>,
    /// Whether data may arrive on the set ([`crate::route_sets::Bound::data`]).
    data: bool,
    route: Route,
}

impl RelayLink {
    fn new(now: UnixTime, link: Link, recv: ReceiveKeys, send: Option<Arc<Sealer>>) -> RelayLink {
        let send_set = link.sets().link().clone();
        let mut l = RelayLink {
            schedule: link.stream().schedule(now),
            link,
            recv,
            send,
            monitor: LinkMonitor::new(now),
            send_set,
            accept: Vec::with_capacity(12),
            next_change: now,
            routes_version: 0,
        };
        l.recompute(now);
        l
    }

    /// Rebuilds the send set, its schedule and the accept routes from the link's route sets.
    fn recompute(&mut self, now: UnixTime) {
        self.routes_version += 1;
        let selection = self.link.select(now);
        self.schedule = Link::schedule_of(&selection.send, now);
        self.next_change = self.schedule.next_change;
        self.send_set = selection.send;
        self.accept.clear();
        for b in &selection.bound {
            let s = Link::schedule_of(&b.set, now);
            self.next_change = self.next_change.min(s.next_change);
            for route in s.accept {
                self.accept.push(Accept {
                    set: b.set.clone(),
                    data: b.data,
                    route,
                });
            }
        }
    }
}

/// The caller's source of 32 fresh random bytes per handshake message (None: none now).
pub type Entropy = Box<dyn FnMut() -> Option<[u8; 32]> + Send>;

struct EntropySource(Option<Entropy>);

impl EntropySource {
    fn draw(&mut self) -> Option<[u8; 32]> {
        self.0.as_mut().and_then(|f| f())
    }
}

impl std::fmt::Debug for EntropySource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "Entropy(set)"
        } else {
            "Entropy(none)"
        })
    }
}

/// One end-to-end stream of an edge gateway, carried over virtual routes (§10.5).
#[derive(Debug)]
struct E2eStream {
    destination: NodeId,
    /// The handshake through the relays, key life and route sets (§9, §10.5); with a
    /// pre-shared key, the link set only.
    link: Link,
    recv: ReceiveKeys,
    /// Seals data; None before the first handshake and after expiry.
    send: Option<Arc<Sealer>>,
    /// The set data is sent on and its virtual route of the epoch.
    send_set: Arc<RouteSet>,
    via: VirtualRoute,
    /// The bound sets, each in one slot of the route tag index ([`e2e_slot`]).
    slots: [Option<E2eSlot>; E2E_SLOTS],
    next_change: UnixTime,
}

/// One bound route set of an end-to-end stream in the route tag index.
#[derive(Debug)]
struct E2eSlot {
    set: Arc<RouteSet>,
    /// Whether data may arrive on it ([`crate::route_sets::Bound::data`]).
    data: bool,
    tag_key: RouteTagKey,
}

/// Route tag index slots per end-to-end stream: more than the sets a stream binds at once (the
/// link set, the current set, its parent, and the answered sets of an unfinished handshake,
/// at most [`crate::handshake::MAX_PENDING`]).
const E2E_SLOTS: usize = 16;

/// The index id of slot `k` of end-to-end stream `id` holding the set numbered `set`.
fn e2e_slot(id: E2eId, k: usize, set: u64) -> PeerId {
    let index = (id.0 as usize).saturating_mul(E2E_SLOTS).saturating_add(k);
    PeerId::from_parts(
        u32::try_from(index).unwrap_or(u32::MAX),
        // Set numbers only grow; a slot reused by a later set gets a new generation.
        set as u32,
    )
}

impl E2eStream {
    fn new(
        now: UnixTime,
        destination: NodeId,
        link: Link,
        recv: ReceiveKeys,
        send: Option<Arc<Sealer>>,
    ) -> E2eStream {
        let send_set = link.sets().link().clone();
        let epoch = link.stream().epoch_at(now);
        let via = VirtualRoute::new(
            send_set.stream.route(epoch),
            &RouteTagKey::derive(&send_set.stream.config().key),
        );
        E2eStream {
            destination,
            link,
            recv,
            send,
            send_set,
            via,
            slots: Default::default(),
            next_change: now,
        }
    }

    /// Makes the route tag index hold exactly the bound sets' accept windows of `now`'s epoch,
    /// and the send set and its virtual route current. Once per epoch and per change of sets.
    fn sync(&mut self, id: E2eId, tags: &mut TagIndex, now: UnixTime) -> Result<(), IndexError> {
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

    fn slot_of(&self, set: &Arc<RouteSet>) -> Option<&E2eSlot> {
        self.slots
            .iter()
            .flatten()
            .find(|s| Arc::ptr_eq(&s.set, set))
    }
}

/// The relays' end-to-end handshake rate limit (§10.5): a token bucket per destination, kept as
/// the time it is full again (GCRA, the "theoretical arrival time": each frame passed moves it
/// one interval on; a frame passes while it is at most [`HANDSHAKE_SLACK`] ahead of now).
/// Only buckets that are not full are state: a bucket whose time has passed is a fresh one.
#[derive(Debug)]
struct HandshakeLimiter {
    /// ((ingress link, destination), when its bucket is full again), sorted by key, at most
    /// [`HANDSHAKE_BUCKETS`] (the capacity reserved up front: never reallocated).
    buckets: Vec<((Neighbour, NodeId), UnixTime)>,
}

impl HandshakeLimiter {
    fn new(transit: bool) -> HandshakeLimiter {
        // A node that is not transit forwards nothing (§10.3 step 2): no buckets.
        let capacity = if transit { HANDSHAKE_BUCKETS } else { 0 };
        HandshakeLimiter {
            buckets: Vec::with_capacity(capacity),
        }
    }

    /// Whether one more handshake frame that arrived on `ingress` for `destination` may be
    /// forwarded at `now` (and if so, takes its token).
    fn allow(&mut self, now: UnixTime, ingress: Neighbour, destination: NodeId) -> bool {
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

    /// Frees at least one entry of a full table: the buckets that have refilled (no state lost),
    /// else the one closest to full. Runs only while every slot is taken, so a flood pays at most
    /// one pass over [`HANDSHAKE_BUCKETS`] entries per new destination it names.
    fn make_room(&mut self, now: UnixTime) {
        self.buckets.retain(|b| b.1 > now);
        if self.buckets.len() >= HANDSHAKE_BUCKETS {
            let nearest_full = (0..self.buckets.len()).min_by_key(|&i| self.buckets[i].1);
            if let Some(i) = nearest_full {
                self.buckets.remove(i);
            }
        }
    }
}

/// A link-local frame waiting for [`RelayNode::poll_transmit`].
#[derive(Debug)]
enum Pending {
    Probe(Neighbour, ProbeRepr),
    Routing(Neighbour, RoutingRepr),
    /// A datagram the link made (handshake message, keepalive, notice), header protection on.
    Datagram(Neighbour, Route, Vec<u8>),
    /// A relay payload an end-to-end stream made (`routeTag || handshake message or
    /// keepalive`), of `kind`, for edge gateway `destination`: framed and sealed for the next
    /// hop when it is sent.
    E2e {
        kind: Kind,
        destination: NodeId,
        payload: Vec<u8>,
    },
}

/// A relay network node (module docs).
#[derive(Debug)]
pub struct RelayNode {
    own: Option<NodeId>,
    frame_max: usize,
    table: RoutingTable,
    links: BTreeMap<Neighbour, RelayLink>,
    e2e: BTreeMap<E2eId, E2eStream>,
    tags: TagIndex,
    pending: VecDeque<Pending>,
    events: VecDeque<Event>,
    /// The next hop of every destination as last reported in an event.
    reported: BTreeMap<NodeId, Neighbour>,
    /// The earliest epoch change of any link or end-to-end stream.
    next_change: UnixTime,
    /// §10.5: forwarded end-to-end handshake frames per destination.
    handshake_rate: HandshakeLimiter,
    /// Routing messages are written here before they are sealed.
    scratch: Vec<u8>,
    /// Fresh randomness for handshake messages ([`RelayNode::set_entropy`]).
    entropy: EntropySource,
    counters: NodeCounters,
}

impl RelayNode {
    /// A pure relay: no hosts, forwards for others.
    pub fn relay(now: UnixTime, frame_max: usize) -> Result<RelayNode, NodeError> {
        Self::new(now, None, true, frame_max, IndexSeed::from_bytes([0; 16]))
    }

    /// An edge gateway that is not a relay, with node id `own`; `seed` keys its route tag index
    /// (draw it at random per process).
    pub fn edge(
        now: UnixTime,
        own: NodeId,
        frame_max: usize,
        seed: IndexSeed,
    ) -> Result<RelayNode, NodeError> {
        Self::new(now, Some(own), false, frame_max, seed)
    }

    /// Any combination (§10.1): `own` the node's id if it is an edge gateway, `transit` whether
    /// it forwards for others, `frame_max` the network's largest frame (§10.4, §10.12).
    pub fn new(
        now: UnixTime,
        own: Option<NodeId>,
        transit: bool,
        frame_max: usize,
        seed: IndexSeed,
    ) -> Result<RelayNode, NodeError> {
        if frame_max < MIN_FRAME_MAX {
            return Err(NodeError::FrameMax {
                frame_max,
                min: MIN_FRAME_MAX,
            });
        }
        let own = own.filter(|id| !id.is_reserved());
        Ok(RelayNode {
            own,
            frame_max,
            table: RoutingTable::new(now, own, transit),
            links: BTreeMap::new(),
            e2e: BTreeMap::new(),
            tags: TagIndex::new(seed),
            pending: VecDeque::new(),
            events: VecDeque::new(),
            reported: BTreeMap::new(),
            next_change: UnixTime::from_nanos(u64::MAX),
            handshake_rate: HandshakeLimiter::new(transit),
            scratch: Vec::with_capacity(frame_max),
            entropy: EntropySource(None),
            counters: NodeCounters::default(),
        })
    }

    /// Where the node draws 32 fresh random bytes for each handshake message it makes (a
    /// CSPRNG of the caller's). Without it, handshake-keyed links never key (every handshake
    /// counts `hs_no_entropy`).
    pub fn set_entropy(&mut self, entropy: Entropy) {
        self.entropy = EntropySource(Some(entropy));
    }

    /// Adds the relay link to a neighbour: `stream` between this node's address and the
    /// neighbour's (encrypt mode, pre-shared key), `sealer` its sealer (the caller persists the
    /// counter reservation, §4.3). Its probes start at once; its routes are announced as an
    /// [`Event::LinkSchedule`].
    pub fn add_link(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        stream: Stream,
        sealer: Sealer,
    ) -> Result<(), NodeError> {
        encrypt_only(&stream)?;
        let recv = ReceiveKeys::single(stream.opener());
        let l = RelayLink::new(now, Link::pre_shared(stream), recv, Some(Arc::new(sealer)));
        self.insert_link(link, l)
    }

    /// Adds the relay link to a neighbour keyed by Noise IK handshakes (§10.1, §9): `stream`
    /// between this node's address and the neighbour's, encrypt mode, keyed by the handshake's
    /// link key ([`Handshake::link_key`]: its link set); `hs` the handshake with the neighbour's
    /// identity, its true addresses the two nodes' addresses. Nothing is sent on the link but
    /// handshake messages until one completes; the first initiation leaves at the next
    /// [`RelayNode::handle_timeout`].
    pub fn add_link_handshake(
        &mut self,
        now: UnixTime,
        link: Neighbour,
        stream: Stream,
        hs: Handshake,
    ) -> Result<(), NodeError> {
        encrypt_only(&stream)?;
        let l = RelayLink::new(
            now,
            Link::with_handshake(stream, hs),
            ReceiveKeys::new(),
            None,
        );
        self.insert_link(link, l)
    }

    fn insert_link(&mut self, link: Neighbour, l: RelayLink) -> Result<(), NodeError> {
        if self.links.contains_key(&link) {
            return Err(NodeError::LinkExists(link));
        }
        self.next_change = self.next_change.min(l.next_change);
        self.events.push_back(Event::LinkSchedule {
            link,
            schedule: l.schedule,
        });
        self.links.insert(link, l);
        Ok(())
    }

    /// A link's handshake (None for a pre-shared link): statistics, the time of its keys.
    pub fn link_handshake(&self, link: Neighbour) -> Option<&Handshake> {
        self.links.get(&link).and_then(|l| l.link.handshake())
    }

    /// The id of the route set a link sends on (0: the link set; a session set after a
    /// handshake, §9.8): for `mt6d status` and tests.
    pub fn link_route_set(&self, link: Neighbour) -> Option<u64> {
        self.links.get(&link).map(|l| l.send_set.id)
    }

    /// Whether a link holds a sending key (a pre-shared link always does).
    pub fn link_keyed(&self, link: Neighbour) -> bool {
        self.links.get(&link).is_some_and(|l| l.send.is_some())
    }

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
        let recv = ReceiveKeys::single(stream.opener());
        let e = E2eStream::new(
            now,
            destination,
            Link::pre_shared(stream),
            recv,
            Some(Arc::new(sealer)),
        );
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
        let e = E2eStream::new(now, destination, link, ReceiveKeys::new(), None);
        self.insert_e2e(now, id, e)
    }

    fn insert_e2e(&mut self, now: UnixTime, id: E2eId, mut e: E2eStream) -> Result<(), NodeError> {
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
        self.e2e.get(&id).is_some_and(|e| e.send.is_some())
    }

    /// The id of the route set an end-to-end peer sends on (0: the link set, §9.8).
    pub fn e2e_route_set(&self, id: E2eId) -> Option<u64> {
        self.e2e.get(&id).map(|e| e.send_set.id)
    }

    /// This node's id (None for a pure relay).
    pub fn own(&self) -> Option<NodeId> {
        self.own
    }
    /// The network's largest frame.
    pub fn frame_max(&self) -> usize {
        self.frame_max
    }
    /// The routing table.
    pub fn table(&self) -> &RoutingTable {
        &self.table
    }
    /// A link's cost estimator.
    pub fn monitor(&self, link: Neighbour) -> Option<&LinkMonitor> {
        self.links.get(&link).map(|l| &l.monitor)
    }
    /// A link's routes as last refreshed.
    pub fn link_schedule(&self, link: Neighbour) -> Option<&Schedule> {
        self.links.get(&link).map(|l| &l.schedule)
    }
    /// Counters and drops.
    pub fn counters(&self) -> &NodeCounters {
        &self.counters
    }

    /// The link whose accept routes (e-1, e, e+1 of every bound route set) hold the pair
    /// (`local`, `remote`) a datagram arrived on, for a driver that receives every link on one
    /// socket. A scan of three routes per link and set (one set in the steady state, up to four
    /// around a handshake): a node has a handful of neighbours.
    pub fn link_of(&self, local: SocketAddrV6, remote: SocketAddrV6) -> Option<Neighbour> {
        self.links.iter().find_map(|(&n, l)| {
            l.accept
                .iter()
                .any(|a| a.route.local == local && a.route.remote == remote)
                .then_some(n)
        })
    }
    /// Every link's accept routes (e-1, e, e+1 of every bound route set) with the link: what
    /// [`RelayNode::link_of`] scans, for a driver whose workers check datagrams against a copy
    /// before they take the node's lock. The set changes only with an [`Event::LinkSchedule`].
    pub fn accept_routes(&self) -> impl Iterator<Item = (Neighbour, Route)> + '_ {
        self.links
            .iter()
            .flat_map(|(&n, l)| l.accept.iter().map(move |a| (n, a.route)))
    }

    /// Whether `addr` is this node's address on an accept route of any link's bound sets
    /// (e-1, e, e+1): the addresses a neighbour on a shared segment may resolve now, and the
    /// only ones a Neighbour Solicitation is answered for. A scan, as [`RelayNode::link_of`].
    pub fn answers_for(&self, addr: std::net::Ipv6Addr) -> bool {
        self.links
            .values()
            .any(|l| l.accept.iter().any(|a| *a.route.local.ip() == addr))
    }

    /// The links, in handle order.
    pub fn links(&self) -> impl Iterator<Item = Neighbour> + '_ {
        self.links.keys().copied()
    }

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
        match l.recv.frame_job(now, &route, buf) {
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
        let opened = match l.recv.open_frame(now, &rest.route, buf) {
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
        let opened = match l.recv.commit_frame(now, job.slot, &job.frame, buf) {
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
    fn accept_of(
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
    /// the node by its receive gate ([`super::gate::Admit::NoKey`]): the link asks for a
    /// handshake, at most once per holdoff, as for one such datagram here. Once per batch.
    pub fn note_empty_slot(&mut self, now: UnixTime, link: Neighbour) {
        if let Some(l) = self.links.get_mut(&link) {
            l.link.handle_empty_slot(now);
        }
        self.drain_link(now, link);
    }

    /// A link payload that did not open: counted by its reason; an empty key slot asks the link
    /// for a handshake.
    fn open_failed(&mut self, now: UnixTime, link: Neighbour, e: OpenError) {
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
    fn after_open(
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
        let Some(e2e_sealer) = &e.send else {
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
        let Some(sealer) = &l.send else {
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

    /// Probes due, lost requests, dead links, routing timers, epoch changes. `random` is the
    /// caller's RNG (it spaces the probes, §10.6).
    pub fn handle_timeout(&mut self, now: UnixTime, mut random: impl FnMut() -> u32) {
        self.refresh(now);
        let mut keyed = Vec::new();
        for (&link, l) in &mut self.links {
            while let Some(seq) = l.monitor.poll_probe(now, random()) {
                self.pending
                    .push_back(Pending::Probe(link, ProbeRepr::request(seq)));
            }
            l.monitor.handle_timeout(now);
            l.recv.expire(now);
            if l.link.poll_timeout().is_some_and(|t| t <= now) {
                let entropy = &mut self.entropy;
                l.link.handle_timeout(now, || entropy.draw());
                keyed.push(link);
            }
        }
        for link in keyed {
            self.drain_link(now, link);
        }
        let mut keyed = Vec::new();
        for (&id, e) in &mut self.e2e {
            e.recv.expire(now);
            // Without a route no initiation could arrive: the first route restarts it (`pump`).
            if !e2e_active(&self.table, e) {
                continue;
            }
            if e.link.poll_timeout().is_some_and(|t| t <= now) {
                let entropy = &mut self.entropy;
                e.link.handle_timeout(now, || entropy.draw());
                keyed.push(id);
            }
        }
        for id in keyed {
            self.drain_e2e(now, id);
        }
        if self.table.poll_timeout() <= now {
            self.table.handle_timeout(now);
        }
        self.pump(now);
    }

    /// When [`RelayNode::handle_timeout`] has work next.
    pub fn poll_timeout(&self) -> UnixTime {
        let mut t = self.table.poll_timeout().min(self.next_change);
        for l in self.links.values() {
            t = t.min(l.monitor.poll_timeout());
            if let Some(k) = l.link.poll_timeout() {
                t = t.min(k);
            }
        }
        for e in self.e2e.values().filter(|e| e2e_active(&self.table, e)) {
            if let Some(k) = e.link.poll_timeout() {
                t = t.min(k);
            }
        }
        t
    }

    /// The next link-local frame (probe, probe reply, routing message), sealed into `out` (at
    /// least [`crate::tunnel::frame_payload_len`]`(frame_max)` bytes).
    pub fn poll_transmit(&mut self, now: UnixTime, out: &mut [u8]) -> Option<Transmit> {
        self.refresh(now);
        while let Some(p) = self.pending.pop_front() {
            let (link, kind) = match &p {
                Pending::Probe(link, _) => (*link, Kind::Probe),
                Pending::Routing(link, _) => (*link, Kind::Routing),
                Pending::E2e {
                    kind,
                    destination,
                    payload,
                } => {
                    if let Some(t) = self.send_e2e(*kind, *destination, payload, out) {
                        return Some(t);
                    }
                    continue;
                }
                Pending::Datagram(link, route, bytes) => {
                    let Some(dst) = out.get_mut(..bytes.len()) else {
                        self.counters.drop("node_buffer_too_small");
                        continue;
                    };
                    dst.copy_from_slice(bytes);
                    return Some(Transmit {
                        link: *link,
                        route: *route,
                        len: bytes.len(),
                    });
                }
            };
            let body: &[u8] = match &p {
                Pending::Probe(_, probe) => {
                    self.scratch.clear();
                    self.scratch.extend_from_slice(&probe.to_bytes());
                    &self.scratch
                }
                Pending::Routing(_, m) => {
                    self.scratch.clear();
                    self.scratch.resize(m.buffer_len(), 0);
                    if let Err(e) = m.emit(&mut self.scratch) {
                        self.counters.drop(e.reason());
                        continue;
                    }
                    &self.scratch
                }
                Pending::Datagram(..) | Pending::E2e { .. } => continue,
            };
            let Some(l) = self.links.get_mut(&link) else {
                continue;
            };
            // No keys yet (or expired): the probe is lost, which is what the link is; the
            // routing message is resent in full once the link comes up (§10.8).
            let Some(sealer) = &l.send else {
                l.link.handle_no_send_key();
                continue;
            };
            let Ok(len) = u16::try_from(body.len()) else {
                continue;
            };
            let repr = RelayRepr::link_local(kind, len);
            let route = l.schedule.send;
            match sealer.seal_frame(&route, &repr, body, self.frame_max, out) {
                Ok(n) => {
                    protect(&l.send_set.stream, &mut out[..n]);
                    return Some(Transmit {
                        link,
                        route,
                        len: n,
                    });
                }
                Err(e) => self.counters.drop(e.reason()),
            }
        }
        None
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    fn handle_probe(&mut self, now: UnixTime, link: Neighbour, payload: &[u8]) {
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
    fn forward(&mut self, to: Neighbour, buf: &mut [u8], flen: usize) -> Received {
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
    fn seal_job(&mut self, to: Neighbour, flen: usize) -> Finish {
        let Some(l) = self.links.get_mut(&to) else {
            self.counters.drop("relay_no_route");
            return Finish::Done(Received::Consumed);
        };
        let Some(sealer) = &l.send else {
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

    /// §10.3 step 1 and §10.5 "Receiving": find the virtual route by its tag, remove the set's
    /// header protection and open the e2e payload as if it had arrived on that route. The inner
    /// packet is restored in place (see [`E2E_AT`]). The AEAD is left to a [`DeliverJob`]
    /// (without the node), but in a rekey race or for a keepalive, opened here.
    fn deliver(&mut self, now: UnixTime, kind: Kind, buf: &mut [u8], payload_end: usize) -> After {
        let consumed = After::Done(Received::Consumed);
        let tagged = &buf[PAYLOAD_AT..payload_end];
        let found = super::e2e::E2ePayload::new_checked(tagged)
            .and_then(|p| self.tags.find(&p).map(|(set, route)| (set, *route)));
        let (set, route) = match found {
            Ok(f) => f,
            Err(e) => {
                self.counters.drop(e.reason());
                return consumed;
            }
        };
        let index = set.index() as usize;
        let (from, k) = (
            E2eId(u32::try_from(index / E2E_SLOTS).unwrap_or(u32::MAX)),
            index % E2E_SLOTS,
        );
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
                .handle_handshake(now, &set, &route, body, &mut e.recv, || entropy.draw());
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
        let opened = match e.recv.packet_job(now, &route, buf, n) {
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
                e.recv
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
            .recv
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
    fn delivered(
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

    /// Feeds link cost changes to the table, queues its routing messages, reports route changes.
    fn pump(&mut self, now: UnixTime) {
        for (&link, l) in &mut self.links {
            while let Some(cost) = l.monitor.poll_cost_change() {
                self.table.handle_link_cost(now, link, cost);
                self.events.push_back(Event::LinkCost { link, cost });
            }
        }
        while let Some(t) = self.table.poll_transmit() {
            self.pending.push_back(Pending::Routing(t.to, t.message));
        }
        let table = &self.table;
        let events = &mut self.events;
        self.reported.retain(|d, hop| {
            if table.next_hop(d) == Some(*hop) {
                return true;
            }
            if table.next_hop(d).is_none() {
                events.push_back(Event::RouteChanged {
                    destination: *d,
                    next_hop: None,
                });
            }
            false
        });
        for (d, r) in self.table.routes() {
            if !self.reported.contains_key(&d) {
                // A new path: an end-to-end handshake that found none starts again at once.
                for e in self.e2e.values_mut().filter(|e| e.destination == d) {
                    e.link.handle_path_up();
                }
            }
            if self.reported.get(&d) != Some(&r.next_hop) {
                self.reported.insert(d, r.next_hop);
                self.events.push_back(Event::RouteChanged {
                    destination: d,
                    next_hop: Some(r.next_hop),
                });
            }
        }
    }

    /// New epochs: the links' routes (announced) and the end-to-end streams' virtual routes and
    /// tag windows. One comparison when nothing is due.
    fn refresh(&mut self, now: UnixTime) {
        if now < self.next_change {
            return;
        }
        let mut next = UnixTime::from_nanos(u64::MAX);
        for (&link, l) in &mut self.links {
            if now >= l.next_change {
                l.recompute(now);
                self.events.push_back(Event::LinkSchedule {
                    link,
                    schedule: l.schedule,
                });
            }
            next = next.min(l.next_change);
        }
        for (&id, e) in &mut self.e2e {
            if now >= e.next_change {
                // The sets' slots were added with these ids: the index cannot refuse them.
                let synced = e.sync(id, &mut self.tags, now);
                debug_assert!(synced.is_ok());
            }
            next = next.min(e.next_change);
        }
        self.next_change = next;
    }
}

impl RelayNode {
    /// The sum of every link's routes and receive keys versions ([`RelayNode::rx_version`]).
    pub(super) fn links_rx_versions(&self) -> u64 {
        self.links
            .values()
            .map(|l| l.routes_version.wrapping_add(l.recv.version()))
            .fold(0, u64::wrapping_add)
    }

    /// Per link: its keys that alone open a payload, and its accept routes with their sets
    /// (what [`super::gate::RxGate`] copies).
    #[allow(clippy::type_complexity)]
    pub(super) fn gate_links(
        &self,
    ) -> impl Iterator<
        Item = (
            Neighbour,
            crate::handshake::FrameKeys,
            Vec<(Route, Arc<RouteSet>)>,
        ),
    > + '_ {
        self.links.iter().map(|(&n, l)| {
            (
                n,
                l.recv.frame_keys(),
                l.accept.iter().map(|a| (a.route, a.set.clone())).collect(),
            )
        })
    }

    /// A handshake message or route-move notice arrived on accept route `at` of `link` (header
    /// protection removed): the link handles it; a refusal is counted under its reason.
    fn link_message(&mut self, now: UnixTime, link: Neighbour, at: usize, bytes: &[u8]) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        let set = l.accept[at].set.clone();
        let route = l.accept[at].route;
        if is_notice(bytes) {
            if let Err(e) = l.link.handle_notice(now, &set, &route, bytes) {
                self.counters.drop(e.reason());
            }
        } else {
            let entropy = &mut self.entropy;
            let r = l
                .link
                .handle_handshake(now, &set, &route, bytes, &mut l.recv, || entropy.draw());
            if let Err(e) = r {
                self.counters.drop(e.reason());
            }
        }
        self.drain_link(now, link);
    }

    /// Frames an end-to-end stream's relay payload for `destination` and seals it for the next
    /// hop into `out`; None (counted at this source) without a route or a key on that link.
    fn send_e2e(
        &mut self,
        kind: Kind,
        destination: NodeId,
        payload: &[u8],
        out: &mut [u8],
    ) -> Option<Transmit> {
        let repr = RelayRepr {
            kind,
            hops: HOP_LIMIT,
            payload_len: u16::try_from(payload.len()).ok()?,
            destination,
        };
        let Forward::Send { to, .. } = self.table.forward(&repr, true) else {
            self.counters.drop("relay_no_route");
            return None;
        };
        let l = self.links.get_mut(&to)?;
        let Some(sealer) = &l.send else {
            l.link.handle_no_send_key();
            self.counters.drop("node_no_key");
            return None;
        };
        let route = l.schedule.send;
        match sealer.seal_frame(&route, &repr, payload, self.frame_max, out) {
            Ok(n) => {
                protect(&l.send_set.stream, &mut out[..n]);
                Some(Transmit {
                    link: to,
                    route,
                    len: n,
                })
            }
            Err(e) => {
                self.counters.drop(e.reason());
                None
            }
        }
    }

    /// Applies what an end-to-end stream's handshake did: its new keys and sets (the route tag
    /// index follows them), and its messages, queued as relay payloads (§10.5: the tag of the
    /// receiver's virtual end under the set's tag key, then the message as the link made it,
    /// header protection on).
    fn drain_e2e(&mut self, now: UnixTime, id: E2eId) {
        let Some(e) = self.e2e.get_mut(&id) else {
            return;
        };
        let events = &mut self.events;
        let sets = apply_link_events(&mut e.link, &mut e.send, &mut e.recv, |keys| {
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

    /// Applies what a link's handshake did: its datagrams to send, its new keys and routes.
    fn drain_link(&mut self, now: UnixTime, link: Neighbour) {
        let Some(l) = self.links.get_mut(&link) else {
            return;
        };
        let events = &mut self.events;
        let routes = apply_link_events(&mut l.link, &mut l.send, &mut l.recv, |keys| {
            events.push_back(match keys {
                Some((initiator, rekey)) => Event::LinkKeyed {
                    link,
                    initiator,
                    rekey,
                },
                None => Event::LinkKeysExpired { link },
            });
        });
        if routes {
            l.recompute(now);
            self.next_change = self.next_change.min(l.next_change);
            self.events.push_back(Event::LinkSchedule {
                link,
                schedule: l.schedule,
            });
        }
        let epoch = l.link.stream().epoch_at(now);
        while let Some(t) = l.link.poll_transmit() {
            let route = Route {
                epoch,
                local: t.src,
                remote: t.dst,
            };
            self.pending
                .push_back(Pending::Datagram(link, route, t.bytes));
        }
    }
}

/// Applies a [`Link`]'s events to the keys its owner holds (a relay link's or an end-to-end
/// stream's sending key and receive keys) and reports the rest: `on_keys(Some((initiator,
/// rekey)))` when new keys are in use, `on_keys(None)` when they expired. Returns whether the
/// link's route sets changed.
fn apply_link_events(
    link: &mut Link,
    send: &mut Option<Arc<Sealer>>,
    recv: &mut ReceiveKeys,
    mut on_keys: impl FnMut(Option<(bool, bool)>),
) -> bool {
    let mut routes = false;
    while let Some(e) = link.poll_event() {
        match e {
            LinkEvent::SendKey(key) => *send = key,
            LinkEvent::KeysExpired => {
                recv.clear();
                on_keys(None);
            }
            LinkEvent::Established {
                initiator, rekey, ..
            } => on_keys(Some((initiator, rekey))),
            LinkEvent::RoutesChanged => routes = true,
            LinkEvent::SessionSet { .. } | LinkEvent::SetReleased { .. } => {}
        }
    }
    routes
}

/// Whether an end-to-end stream's timers run: it holds keys (they expire, rekey), or a route to
/// its edge gateway exists (a handshake can arrive).
fn e2e_active(table: &RoutingTable, e: &E2eStream) -> bool {
    e.send.is_some() || table.next_hop(&e.destination).is_some()
}

fn encrypt_only(stream: &Stream) -> Result<(), NodeError> {
    match stream.mode() {
        Mode::Encrypt => Ok(()),
        mode => Err(NodeError::NotEncrypt { mode }),
    }
}

/// §4.5 on a sealed link payload (at least 36 bytes, more than header protection needs).
pub(super) fn protect(stream: &Stream, payload: &mut [u8]) {
    if let Some(hk) = stream.send_header_key() {
        let masked = hk.protect(payload);
        debug_assert!(masked.is_ok());
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::relay::routing::UpdateEntry;
    use crate::relay::Seqno;
    use crate::testutil::addr;
    use crate::{Endpoint, SessionKey, StreamConfig};

    pub(in crate::relay) fn at(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_700_000_000_000 + ms)
    }

    pub(in crate::relay) fn pair(mode: Mode) -> (Stream, Stream) {
        let mut c = StreamConfig::new(
            Endpoint::new(addr("2001:db8:ff:1::1")),
            Endpoint::new(addr("2001:db8:ff:2::1")),
            SessionKey::from_bytes(&[9; 32]).unwrap(),
        );
        c.mode = mode;
        (
            Stream::new(c.clone()).unwrap(),
            Stream::new(c.mirrored()).unwrap(),
        )
    }

    #[test]
    fn a_datagram_is_matched_to_the_link_whose_accept_routes_hold_its_addresses() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let mut c = a.config().clone();
        c.remote = Endpoint::new(addr("2001:db8:ff:3::1"));
        c.key = SessionKey::from_bytes(&[7; 32]).unwrap();
        let b = Stream::new(c).unwrap();
        let (sa, sb) = (a.sealer(1, u64::MAX), b.sealer(1, u64::MAX));
        r.add_link(at(0), Neighbour(1), a, sa).unwrap();
        r.add_link(at(0), Neighbour(2), b, sb).unwrap();
        for n in [Neighbour(1), Neighbour(2)] {
            for route in r.link_schedule(n).unwrap().accept {
                assert_eq!(r.link_of(route.local, route.remote), Some(n));
            }
        }
        let one = r.link_schedule(Neighbour(1)).unwrap().send;
        let two = r.link_schedule(Neighbour(2)).unwrap().send;
        assert_eq!(r.link_of(one.local, two.remote), None);
        assert_eq!(r.links().collect::<Vec<_>>(), [Neighbour(1), Neighbour(2)]);
    }

    #[test]
    fn configuration_errors_are_refused() {
        assert_eq!(
            RelayNode::relay(at(0), MIN_FRAME_MAX - 1).unwrap_err(),
            NodeError::FrameMax {
                frame_max: MIN_FRAME_MAX - 1,
                min: MIN_FRAME_MAX
            }
        );
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (auth, _) = pair(Mode::Auth);
        let sealer = auth.sealer(1, u64::MAX);
        assert_eq!(
            r.add_link(at(0), Neighbour(1), auth, sealer),
            Err(NodeError::NotEncrypt { mode: Mode::Auth })
        );
        let (a, b) = pair(Mode::Encrypt);
        let (sa, sb) = (a.sealer(1, u64::MAX), b.sealer(1, u64::MAX));
        r.add_link(at(0), Neighbour(1), a, sa).unwrap();
        assert_eq!(
            r.add_link(at(0), Neighbour(1), b, sb),
            Err(NodeError::LinkExists(Neighbour(1)))
        );
        let (e, _) = pair(Mode::Encrypt);
        let sealer = e.sealer(1, u64::MAX);
        let id = NodeId::from_bytes([1; 8]);
        assert_eq!(
            r.add_e2e(at(0), E2eId(0), id, e, sealer),
            Err(NodeError::NotAnEdge)
        );
        let mut edge =
            RelayNode::edge(at(0), id, MIN_FRAME_MAX, IndexSeed::from_bytes([1; 16])).unwrap();
        let (e, _) = pair(Mode::Encrypt);
        let sealer = e.sealer(1, u64::MAX);
        assert_eq!(
            edge.add_e2e(at(0), E2eId(0), id, e, sealer),
            Err(NodeError::OwnDestination(id))
        );
        let mut out = [0u8; 2048];
        assert_eq!(
            edge.send_inner(at(0), E2eId(3), &[0x60; 48], &mut out),
            Err(NodeError::UnknownPeer(E2eId(3)))
        );
    }

    #[test]
    fn the_first_link_event_is_its_schedule_and_probes_start_at_once() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let want = a.schedule(at(0));
        let sealer = a.sealer(1, u64::MAX);
        r.add_link(at(0), Neighbour(4), a, sealer).unwrap();
        assert_eq!(
            r.poll_event(),
            Some(Event::LinkSchedule {
                link: Neighbour(4),
                schedule: want
            })
        );
        assert!(r.poll_timeout() <= at(0));
        r.handle_timeout(at(0), || 7);
        let mut out = vec![0u8; frame_payload_len(MIN_FRAME_MAX)];
        let t = r.poll_transmit(at(0), &mut out).unwrap();
        // A probe: the smallest size class, sealed (§10.4, §10.6).
        assert_eq!(
            (t.link, t.route, t.len),
            (Neighbour(4), want.send, 128 + 24)
        );
        assert!(r.poll_transmit(at(0), &mut out).is_none());
    }

    /// The accept routes a driver copies are exactly what `link_of` answers for, and follow
    /// the link's epochs.
    #[test]
    fn accept_routes_are_what_link_of_answers_for() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let sealer = a.sealer(1, u64::MAX);
        let (stream, _) = pair(Mode::Encrypt);
        r.add_link(at(0), Neighbour(4), a, sealer).unwrap();
        for t in [at(0), at(25_000)] {
            r.handle_timeout(t, || 7);
            let routes: Vec<(Neighbour, Route)> = r.accept_routes().collect();
            let want = stream.schedule(t).accept;
            assert_eq!(routes.len(), want.len());
            for ((n, route), w) in routes.iter().zip(want) {
                assert_eq!((*n, *route), (Neighbour(4), w));
                assert_eq!(r.link_of(route.local, route.remote), Some(Neighbour(4)));
            }
        }
    }

    #[test]
    fn datagrams_on_unknown_links_or_routes_are_counted() {
        let mut r = RelayNode::relay(at(0), MIN_FRAME_MAX).unwrap();
        let (a, _) = pair(Mode::Encrypt);
        let s = a.schedule(at(0));
        let sealer = a.sealer(1, u64::MAX);
        r.add_link(at(0), Neighbour(4), a, sealer).unwrap();
        let mut buf = [0u8; 152];
        let got = r.handle_datagram(at(0), Neighbour(5), s.send.local, s.send.remote, &mut buf);
        assert_eq!(got, Received::Consumed);
        let got = r.handle_datagram(at(0), Neighbour(4), s.send.remote, s.send.local, &mut buf);
        assert_eq!(got, Received::Consumed);
        let got = r.handle_datagram(at(0), Neighbour(4), s.send.local, s.send.remote, &mut buf);
        assert_eq!(got, Received::Consumed);
        let c = r.counters();
        assert_eq!(c.drops("node_unknown_link"), 1);
        assert_eq!(c.drops("node_unknown_route"), 1);
        assert_eq!(c.dropped(), 3, "{:?}", c.drop_labels().collect::<Vec<_>>());
    }

    pub(in crate::relay) const IN: Neighbour = Neighbour(1);
    pub(in crate::relay) const OUT: Neighbour = Neighbour(2);

    /// A relay with a link from a neighbour (whose stream and sealer are returned, to send it
    /// frames) and a link out, over which `dests` are routed.
    pub(in crate::relay) fn relay_routing(
        now: UnixTime,
        dests: &[NodeId],
    ) -> (RelayNode, Stream, Sealer) {
        let mut r = RelayNode::relay(now, MIN_FRAME_MAX).unwrap();
        let (a, peer) = pair(Mode::Encrypt);
        let sealer = a.sealer(1, u64::MAX);
        r.add_link(now, IN, a, sealer).unwrap();
        let (b, _) = pair(Mode::Encrypt);
        let sealer = b.sealer(1, u64::MAX);
        r.add_link(now, OUT, b, sealer).unwrap();
        r.table.handle_link_cost(now, OUT, Metric(20));
        let entries = dests.iter().map(|&destination| UpdateEntry {
            destination,
            seqno: Seqno(1),
            metric: Metric(0),
        });
        r.table.handle_update(now, OUT, entries);
        let peer_sealer = peer.sealer(1, u64::MAX);
        (r, peer, peer_sealer)
    }

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
        let n = sealer
            .seal_frame(&route, &repr, &[0x11; 32], MIN_FRAME_MAX, &mut buf)
            .unwrap();
        protect(peer, &mut buf[..n]);
        r.handle_datagram(now, IN, route.remote, route.local, &mut buf[..n])
    }

    pub(in crate::relay) fn id(n: u64) -> NodeId {
        NodeId::from_bytes((n + 1).to_be_bytes())
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
            let n = s
                .seal_frame(&route, &repr, &[0x11; 32], MIN_FRAME_MAX, &mut buf)
                .unwrap();
            protect(&peer, &mut buf[..n]);
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

    /// Edge gateways A and B over one pre-shared link (IN at both ends), with an end-to-end
    /// stream between hosts fd00:1::10 (behind A) and fd00:2::10 (behind B); A routes to B.
    fn edges(now: UnixTime) -> (RelayNode, RelayNode) {
        let (ida, idb) = (id(10), id(11));
        let seed = IndexSeed::from_bytes([3; 16]);
        let frame_max = super::super::frame::DEFAULT_FRAME_MAX;
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
