//! Which CPUs a worker runs on: while what it carries is light, the one CPU every light worker
//! shares; while it carries bulk, every CPU the daemon may use (docs/ARCHITECTURE.md
//! "Workers", placement).
//!
//! A round trip through two gateways hands each packet from thread to thread: the sender's,
//! a worker of each gateway, the receiver's. When the kernel wakes a thread while the waker is
//! still running, it prefers an idle CPU to waiting a few microseconds for the waker to sleep.
//! On a virtual machine, an idle vCPU has halted, and waking it costs a round trip through the
//! hypervisor: traced on the 2-vCPU lab (`perf` scheduler events, 2026-11-27), an echo whose
//! wake-ups all stayed on one vCPU took 200-210 µs end to end, and one whose worker the kernel
//! moved to the halted vCPU 620-680 µs, about 250 µs of it from the wake-up to the worker
//! running. Light traffic needs no second CPU, so a light worker stays on one: the lowest CPU
//! the daemon may use, the same for every worker, so that a packet handed from one worker to
//! another (or to a protected host) finds its next thread on the CPU that is already awake.
//! Bulk needs every core: a worker that carries (seals and opens) more than [`BUSY_BYTES`] in a
//! window is free again until it falls below [`IDLE_BYTES`] (hysteresis; the thresholds of
//! [`super::window`]). Bytes, not packets: a ping flood of tens of thousands of small echoes
//! a second is latency-bound and is fastest on one CPU (in quick runs its round trip fell from
//! 0.04-0.09 to 0.02 ms while the worker stayed there), a TCP transfer is bound by throughput
//! and needs both.
//!
//! Moving costs one `sched_setaffinity` at each change between light and bulk, and a clock
//! read per wake-up to count windows; nothing per packet.

use mt6d_os::CpuSet;
use mt6d_proto::UnixTime;

use super::window::{LoadWindow, BUSY_BYTES, IDLE_BYTES};

/// Where one worker runs. Starts light.
#[derive(Debug)]
pub struct Placement {
    /// The CPUs the worker may use when free (its affinity when it started); `None` when
    /// placement is off (one CPU allowed, or the kernel refused).
    allowed: Option<CpuSet>,
    pinned: bool,
    load: LoadWindow,
}

/// What [`Placement::carried`] asks of the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Move {
    /// Restrict the worker to the light traffic's CPU.
    Home,
    /// Give the worker back every CPU it may use.
    Free,
}

impl Placement {
    /// Placement for a worker that may run on `allowed` (its affinity at start). With fewer
    /// than two CPUs there is nothing to choose: placement stays off.
    pub fn new(allowed: Option<CpuSet>) -> Placement {
        Placement {
            allowed: allowed.filter(|a| a.len() >= 2),
            pinned: false,
            load: LoadWindow::new(BUSY_BYTES, IDLE_BYTES),
        }
    }

    /// Whether the worker is placed at all.
    pub fn is_on(&self) -> bool {
        self.allowed.is_some()
    }

    /// Counts `bytes` carried (sealed or opened) at `now` and says where the worker must move,
    /// if anywhere. Before the first window ends the worker counts as light.
    pub fn carried(&mut self, now: UnixTime, bytes: u64) -> Option<Move> {
        self.allowed.as_ref()?;
        self.load.add(now, bytes);
        match (self.load.busy(), self.pinned) {
            (false, false) => Some(Move::Home),
            (true, true) => Some(Move::Free),
            _ => None,
        }
    }

    /// The CPU set for `to`: the lowest allowed CPU, or all of them.
    pub fn cpus(&self, to: Move) -> Option<CpuSet> {
        let allowed = self.allowed?;
        match to {
            Move::Home => allowed.cpus().next().and_then(CpuSet::single),
            Move::Free => Some(allowed),
        }
    }

    /// Records that the worker now runs as `to` asked.
    pub fn moved(&mut self, to: Move) {
        self.pinned = to == Move::Home;
    }

    /// Stops placing the worker (the kernel refused a move); it stays where it is.
    pub fn turn_off(&mut self) {
        self.allowed = None;
    }

    /// Where the worker runs, for `mt6d status`.
    pub fn status(&self) -> crate::status::Placement {
        use crate::status::Placement as At;
        match (self.allowed, self.pinned) {
            (None, _) => At::Unplaced,
            (Some(_), false) => At::Bulk,
            (Some(_), true) => match self.cpus(Move::Home).and_then(|c| c.cpus().next()) {
                Some(cpu) => At::Light {
                    cpu: u32::try_from(cpu).unwrap_or(u32::MAX),
                },
                None => At::Unplaced,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> UnixTime {
        UnixTime::from_nanos(1_700_000_000_000_000_000 + ms * 1_000_000)
    }

    fn step(p: &mut Placement, ms: u64, bytes: u64) -> Option<Move> {
        let m = p.carried(at(ms), bytes);
        if let Some(m) = m {
            p.moved(m);
        }
        m
    }

    fn on(cpus: &[usize]) -> Placement {
        Placement::new(CpuSet::of(cpus))
    }

    #[test]
    fn a_light_worker_goes_home_once_and_stays() {
        let mut p = on(&[2, 5, 7]);
        let home = p.cpus(Move::Home).expect("home");
        assert_eq!(
            home.cpus().collect::<Vec<_>>(),
            [2],
            "the lowest allowed CPU"
        );
        let free = p.cpus(Move::Free).expect("free");
        assert_eq!(free.cpus().collect::<Vec<_>>(), [2, 5, 7]);
        assert_eq!(step(&mut p, 0, 100), Some(Move::Home));
        // A ping train: 100 bytes every 100 ms, for a minute.
        for i in 1..600 {
            assert_eq!(step(&mut p, i * 100, 100), None, "at {i}");
        }
        // A flood: 50 echoes of 100 bytes a millisecond (5 MB/s), for a second.
        for ms in 60_000..61_000 {
            assert_eq!(step(&mut p, ms, 5_000), None, "flood at {ms} ms");
        }
    }

    #[test]
    fn bulk_frees_the_worker_and_light_brings_it_home_again() {
        let mut p = on(&[0, 1]);
        assert_eq!(step(&mut p, 0, 64_000), Some(Move::Home));
        let mut moves = Vec::new();
        // 64 kB a millisecond (512 Mbit/s) for 300 ms.
        for ms in 1..300 {
            moves.extend(step(&mut p, ms, 64_000));
        }
        assert_eq!(
            moves,
            [Move::Free],
            "freed once, at the end of the first window"
        );
        // Between the thresholds (2 MB per window): stays free.
        for ms in 300..1_300 {
            assert_eq!(step(&mut p, ms, 20_000), None, "hysteresis at {ms} ms");
        }
        // One echo after a pause: home again.
        assert_eq!(step(&mut p, 6_300, 100), Some(Move::Home));
    }

    #[test]
    fn one_cpu_or_a_refusal_turns_placement_off() {
        assert_eq!(step(&mut on(&[3]), 0, 1), None);
        assert_eq!(step(&mut Placement::new(None), 0, 1), None);
        let mut p = on(&[0, 1]);
        p.turn_off();
        assert_eq!(step(&mut p, 0, 1), None);
        for ms in 1..300 {
            assert_eq!(step(&mut p, ms, 64_000), None);
        }
    }
}
