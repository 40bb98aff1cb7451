//! A peer's protocol state (`mt6d_proto::link::Link`: handshake, key life, route sets, route
//! moves) as the daemon's threads share it: behind a mutex taken by the main thread when the
//! link's timeout is due or a route table is built, and by the receiving worker for handshake messages,
//! notices and a new key's first packet (never per data packet), with a flag that asks the main
//! thread for a new route table. The packet threads see the routes only through the published
//! table and the sending key only through `PeerKeys::send`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use mt6d_proto::handshake::Handshake;
use mt6d_proto::link::Link;
use mt6d_proto::Stream;

/// A peer's link behind its lock, and the flag that asks the main thread for a new table.
#[derive(Debug)]
pub struct PeerLink {
    state: Mutex<Link>,
    /// Set when the link's routes changed outside a rotation (a set bound or released, a route
    /// moved, the peer's link-layer address learned).
    pub changed: AtomicBool,
}

impl PeerLink {
    /// `stream`: the link stream (the link's own copy; the packet threads keep theirs). `hs`:
    /// None with a pre-shared key.
    pub fn new(stream: Stream, hs: Option<Handshake>) -> PeerLink {
        let link = match hs {
            Some(hs) => Link::with_handshake(stream, hs),
            None => Link::pre_shared(stream),
        };
        PeerLink {
            state: Mutex::new(link),
            changed: AtomicBool::new(false),
        }
    }

    /// The link. A poisoned lock (a panic while it was held) still holds consistent state:
    /// every update is a plain field assignment.
    pub fn lock(&self) -> MutexGuard<'_, Link> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Asks the main thread to build and publish a new table at its next tick.
    pub fn mark_changed(&self) {
        self.changed.store(true, Ordering::Relaxed);
    }
}
