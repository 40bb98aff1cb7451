//! The data-plane workers' readiness sets: one epoll per worker, watching that worker's TUN
//! queue and the tunnel sockets it owns. The rotation registers a new socket with the worker
//! of the peer that needs the port and deletes it there when the port leaves the window.
//! Its own file because both the rotation (which owns the sockets) and the workers (which wait
//! in the epolls) name it, and neither should import the other for it.

use mt6d_os::Epoll;

use super::error::GatewayError;

pub use crate::daemon::worker::TUN_TOKEN;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_worker_index_past_the_end_wraps_instead_of_panicking() {
        let polls = Polls::new(2).expect("epoll");
        assert_eq!(polls.len(), 2);
        assert!(std::ptr::eq(polls.get(3), polls.get(1)));
        assert_eq!(Polls::new(0).expect("epoll").len(), 1);
    }
}
