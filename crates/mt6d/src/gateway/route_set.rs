//! A peer's route sets (`mt6d_proto::route_sets`, docs/PROTOCOL.md §9.8) as the daemon's threads
//! share them: behind a mutex taken by the rx thread for handshake messages and notices and by the
//! main thread when it builds a route table (never per data packet), with a flag that asks the
//! main thread for a new table. The packet threads see sets only through the published table.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use mt6d_proto::route_sets::{RouteSet, SetState};
use mt6d_proto::Stream;

/// A peer's sets behind their lock, and the flag that asks the main thread for a new table.
#[derive(Debug)]
pub struct PeerSets {
    state: Mutex<SetState>,
    /// Set when the sets changed outside a rotation (an answer, a completion, a confirmation).
    pub changed: AtomicBool,
}

impl PeerSets {
    pub fn new(stream: &Stream) -> PeerSets {
        PeerSets {
            state: Mutex::new(SetState::new(Arc::new(RouteSet::link(stream)))),
            changed: AtomicBool::new(false),
        }
    }

    /// The state. A poisoned lock still holds consistent state: every update is a plain field
    /// assignment.
    pub fn lock(&self) -> MutexGuard<'_, SetState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Marks the sets changed: the main thread builds and publishes a new table at its next tick.
    pub fn mark_changed(&self) {
        self.changed.store(true, Ordering::Relaxed);
    }
}
