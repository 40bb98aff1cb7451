//! The data-plane workers' readiness sets: one epoll per worker, watching that worker's TUN
//! queue and the tunnel sockets it owns. The rotation registers a new socket with the worker
//! of the peer that needs the port and deletes it there when the port leaves the window.
//! Its own file because both the rotation (which owns the sockets) and the workers (which wait
//! in the epolls) name it, and neither should import the other for it.

use std::sync::atomic::{AtomicU64, Ordering};

use mt6d_os::Epoll;

use super::error::GatewayError;
use crate::status::Placement;

/// The token a worker's TUN queue is registered with (tunnel sockets use their port, < 2^16).
pub const TUN_TOKEN: u64 = u64::MAX;

/// One epoll per worker.
#[derive(Debug)]
pub struct Polls {
    epolls: Vec<Epoll>,
}

impl Polls {
    /// `workers` empty readiness sets (at least one).
    pub fn new(workers: usize) -> Result<Polls, GatewayError> {
        let epolls = (0..workers.max(1))
            .map(|i| {
                Epoll::new().map_err(|source| GatewayError::Os {
                    what: format!("create epoll of data-plane worker {i}"),
                    source,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(Polls { epolls })
    }

    /// How many workers there are.
    pub fn len(&self) -> usize {
        self.epolls.len()
    }

    /// Worker `i`'s epoll (`i < len()`).
    pub fn get(&self, i: usize) -> &Epoll {
        &self.epolls[i % self.epolls.len()]
    }
}

/// What one worker moved, written only by that worker (its own cache line, once per batch):
/// `mt6d status` shows it per worker, and the tests check that every worker carries traffic.
#[derive(Debug, Default)]
#[repr(align(128))]
pub struct WorkerLoad {
    /// Packets read from this worker's TUN queue and sealed.
    pub sealed: AtomicU64,
    /// Packets opened from this worker's sockets and written to the TUN device.
    pub opened: AtomicU64,
    /// Wake-ups (epoll returns with something ready).
    pub wakeups: AtomicU64,
    /// Where it runs now ([`WorkerLoad::placed`]), written at each move (rare).
    placement: AtomicU64,
}

/// `placement`'s encoding: 0 not placed, 1 bulk, 2 + n light on CPU n.
const BULK: u64 = 1;
const LIGHT: u64 = 2;

impl WorkerLoad {
    /// Records where the worker runs now.
    pub fn placed(&self, at: Placement) {
        let v = match at {
            Placement::Unplaced => 0,
            Placement::Bulk => BULK,
            Placement::Light { cpu } => LIGHT + u64::from(cpu),
        };
        self.placement.store(v, Ordering::Relaxed);
    }

    /// Where the worker runs, as last recorded.
    pub fn placement(&self) -> Placement {
        match self.placement.load(Ordering::Relaxed) {
            0 => Placement::Unplaced,
            BULK => Placement::Bulk,
            n => Placement::Light {
                cpu: u32::try_from(n - LIGHT).unwrap_or(u32::MAX),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_worker_load_sits_on_its_own_cache_lines() {
        assert!(std::mem::align_of::<WorkerLoad>() >= 128);
        assert!(std::mem::size_of::<WorkerLoad>() >= 128);
    }

    #[test]
    fn a_worker_placement_reads_back_as_recorded() {
        let load = WorkerLoad::default();
        assert_eq!(load.placement(), Placement::Unplaced);
        for at in [
            Placement::Light { cpu: 0 },
            Placement::Bulk,
            Placement::Light { cpu: 1023 },
            Placement::Unplaced,
        ] {
            load.placed(at);
            assert_eq!(load.placement(), at);
        }
    }

    #[test]
    fn a_worker_index_past_the_end_wraps_instead_of_panicking() {
        let polls = Polls::new(2).expect("epoll");
        assert_eq!(polls.len(), 2);
        assert!(std::ptr::eq(polls.get(3), polls.get(1)));
        assert_eq!(Polls::new(0).expect("epoll").len(), 1);
    }
}
