//! What the node tells its caller besides datagrams: events to apply or log, refused calls,
//! and its counters (every drop under its spec label).

use std::collections::BTreeMap;

use super::E2eId;
use crate::endpoint::IndexError;
use crate::relay::table::Neighbour;
use crate::relay::{Metric, NodeId};
use crate::{Mode, Schedule, SealError};

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
    /// [`InnerJob::seal`](super::InnerJob::seal) was given an inner packet of another length than
    /// [`RelayNode::begin_inner`](super::RelayNode::begin_inner) (a caller's mistake).
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

    pub(super) fn drop(&mut self, label: &'static str) {
        *self.drops.entry(label).or_insert(0) += 1;
    }
}
