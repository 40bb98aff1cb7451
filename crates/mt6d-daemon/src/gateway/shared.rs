//! What the daemon's threads share: the published route table (which carries the peers) and the
//! shutdown flag.
//! Its own file because every thread's module names it (the packet threads, the collision
//! watch, the ICMPv6 and router threads, the rotation), and none of them should have to import
//! another thread's module for it.

use std::sync::atomic::{AtomicBool, AtomicU64};

use arc_swap::ArcSwap;

use super::counters::DirectionCounters;
use super::link_timers::Attention;
use super::routing::RouteTable;
use crate::daemon::worker::WorkerLoad;

/// What both packet threads share.
#[derive(Debug)]
pub struct Shared {
    /// The peers and their routes, one generation: every peer index is read against the table
    /// it came from.
    pub table: ArcSwap<RouteTable>,
    pub shutdown: AtomicBool,
    /// Packets that match no peer (unknown inner destination, unknown outer route).
    pub unmatched: DirectionCounters,
    /// Peers whose links the packet threads want the main thread to visit now.
    pub attention: Attention,
    /// Datagrams the kernel dropped from full tunnel socket receive queues (SO_RXQ_OVFL),
    /// added by the receive thread once per batch.
    pub socket_queue_drops: AtomicU64,
    /// TUN writes that failed (the receive thread counts each failed batch write once).
    pub tun_write_failures: AtomicU64,
    /// What each data-plane worker moved, indexed by worker.
    pub load: Box<[WorkerLoad]>,
    /// Which TUN queue each recent outgoing SYN was read from (its SYN-ACK is written there).
    pub syn_queues: super::syn_queues::SynQueues,
}
