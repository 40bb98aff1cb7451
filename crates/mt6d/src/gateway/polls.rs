//! The data-plane workers' readiness sets: one epoll per worker, watching that worker's TUN
//! queue and the tunnel sockets it owns. The rotation registers a new socket with the worker
//! of the peer that needs the port and deletes it there when the port leaves the window.
//! Its own file because both the rotation (which owns the sockets) and the workers (which wait
//! in the epolls) name it, and neither should import the other for it.

use std::sync::atomic::AtomicU64;

use mt6d_os::Epoll;

use super::error::GatewayError;

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
    fn a_worker_index_past_the_end_wraps_instead_of_panicking() {
        let polls = Polls::new(2).expect("epoll");
        assert_eq!(polls.len(), 2);
        assert!(std::ptr::eq(polls.get(3), polls.get(1)));
        assert_eq!(Polls::new(0).expect("epoll").len(), 1);
    }
}
