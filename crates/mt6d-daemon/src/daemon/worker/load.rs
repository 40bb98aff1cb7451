//! What one worker moved, for `mt6d status` and the metrics: every role's workers keep one.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::status::{Placement, WorkerStatus};

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

    /// The worker's totals as `mt6d status` shows them.
    pub fn status(&self) -> WorkerStatus {
        WorkerStatus {
            sealed: self.sealed.load(Ordering::Relaxed),
            opened: self.opened.load(Ordering::Relaxed),
            wakeups: self.wakeups.load(Ordering::Relaxed),
            placement: self.placement(),
        }
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
}
