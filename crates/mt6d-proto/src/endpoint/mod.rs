//! Many peers on one endpoint (tracker issue 11, item 2; groundwork: the daemon does not use it
//! yet): compact peer ids ([`PeerSlab`]) and one rotation deadline per peer ([`Timers`]).
//!
//! What it replaces: a 20 ms tick that visits every peer. Here a tick pops only the peers whose
//! epoch boundary has passed.
//!
//! Sans-IO like the rest of the crate: `now` comes in.

mod slab;
mod timers;

pub use slab::{PeerId, PeerSlab};
pub use timers::Timers;
