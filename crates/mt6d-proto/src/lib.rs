//! `mt6d-proto`: the sans-IO core of Moving Target IPv6 Defense (MT6D).
//!
//! This crate owns everything two MT6D gateways must agree on byte for byte: how hashed addresses and
//! ports are derived (thesis 000 §2.5.2 Eq. 2.1, §3.2.2 Eq. 3.1), when they rotate (the epoch schedule),
//! how an inner IPv6 packet is carried in a UDP payload (000 §2.6, §3.2.4; 001 §2: encrypted tunnel by
//! default) and how ICMPv6 errors about tunnel packets are turned back into errors about inner packets
//! (000 §2.6.3, §3.2.3). The normative description is `docs/PROTOCOL.md`.
//!
//! It must not touch the OS: no sockets, no clock, no global RNG. Time comes in as [`UnixTime`]
//! arguments, buffers belong to the caller, and nothing on the per-packet path allocates.
//!
//! Call order for a daemon:
//! 1. [`Stream::new`] once per configured peer (validates the config, derives subkeys).
//! 2. On every timer tick, [`Stream::schedule`]`(now)`: bind `accept` routes' local addresses, send on
//!    `send`, wake up again at `next_change`.
//! 3. One [`Sealer`] per stream (shared by sending threads): [`Sealer::seal_protected`] each inner
//!    packet (sealed, then header protection, docs/PROTOCOL.md §4.5, in one call).
//! 4. One [`Opener`] per stream (owned by the receiving thread): map the outer addresses/ports of a
//!    received datagram to one of `schedule.accept`, [`classify::receive`] (header protection
//!    off, then its class), then [`Opener::open`].
//! 5. Per stream one [`moves::RouteMoves`]: when another node on the link holds one of our hashed
//!    addresses, [`moves::RouteMoves::on_collision`] moves that epoch's route; notices agree the
//!    move with the peer, and [`Stream::schedule_moved`] replaces step 2's schedule.
//! 6. ICMPv6 errors from routers about tunnel packets: [`icmp::translate_path_error`].
//! 7. Many peers (groundwork, not yet used by the daemon): [`endpoint::PeerTable`] keeps the
//!    streams, the indexes from a packet to its peer and one epoch deadline per peer, and turns
//!    each rotation into a per-peer [`endpoint::WindowDelta`] instead of steps 2 and 4 per peer.
//!
//! With identity keys instead of a pre-shared session key, [`handshake::Handshake`] derives the
//! stream's key (the link key) and replaces steps 3-4's static keys with session keys from a
//! Noise IK handshake, kept per peer in a [`handshake::ReceiveKeys`] and a current [`Sealer`].
//!
//! [`link::Link`] puts one peer's rules together (handshake, key life, route sets, route moves)
//! behind one input/output contract (`handle_*`, `poll_transmit`, `poll_event`,
//! `poll_timeout`): a driver feeds it what arrives and does what it says, and seals and opens
//! data packets itself with the keys it hands out. Those keys go to one holder, a
//! [`link::KeyStore`] the link applies its key changes to ([`link::Keys`], or the gateway's
//! publication behind an atomic pointer); no driver applies them itself. The daemon's gateway
//! and server, the relay node and the simulators are such drivers.
#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))] // unit tests: a failed unwrap is a failed test

pub mod addressing;
pub mod classify;
pub mod cluster;
mod config;
pub mod control_plan;
pub mod endpoint;
mod error;
pub mod handshake;
pub mod icmp;
mod key;
pub mod link;
pub mod liveness;
pub mod moves;
pub mod peers_file;
pub mod relay;
pub mod route_sets;
pub mod router;
mod schedule;
pub mod scrub;
mod secrets;
mod stream;
#[cfg(test)]
mod testutil;
mod time;
pub mod tunnel;
pub mod wire;

pub use config::{AeadAlg, Derivation, Endpoint, Mode, PortPolicy, StreamConfig};
pub use error::ProtoError;
pub use key::SessionKey;
pub use schedule::{Epoch, EpochClock, Route, Schedule};
pub use stream::Stream;
pub use time::UnixTime;
pub use tunnel::{FrameJob, FrameKey, KeyPhase, OpenError, Opener, PacketJob, SealError, Sealer};
