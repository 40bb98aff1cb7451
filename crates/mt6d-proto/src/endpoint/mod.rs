//! Many peers on one endpoint (tracker issue 11, item 2; groundwork: the daemon does not use it
//! yet): compact peer ids ([`PeerSlab`]), the two indexes that route packets to peers
//! ([`RouteIndex`]: local (hashed address, port) -> (peer, epoch), inner (source, destination)
//! -> peer), and one rotation deadline per peer ([`Timers`]).
//!
//! What it replaces, per packet and per rotation: a linear scan of the peers for the inner
//! pair, a `RouteTable` rebuilt for every peer at each rotation, and a 20 ms tick that visits
//! every peer. Here a lookup is one keyed hash and one probe, a rotation touches one peer and
//! changes its window by a delta (one route derived, one key inserted, one removed), and a tick
//! pops only the peers whose epoch boundary has passed.
//!
//! Sans-IO like the rest of the crate: `now` comes in, the hash key comes in as an
//! [`IndexSeed`], and what the kernel must change (addresses to bind or release, sockets to
//! open or close) goes out as [`WindowDelta`]s.

mod hasher;
mod index;
mod slab;
mod timers;

pub use hasher::IndexSeed;
pub use index::{IndexError, RouteIndex, WindowDelta, WINDOW};
pub use slab::{PeerId, PeerSlab};
pub use timers::Timers;
