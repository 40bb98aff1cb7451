//! The one packet worker every role runs ([`serve`]): a thread waiting in one epoll over its
//! TUN queue and its sockets, serving whatever is ready in both directions, with the role
//! plugged in through [`Packets`] (what to do when the TUN queue or a socket is readable, and
//! between wake-ups). The loop around it is the same for every role: the wait bounded by the
//! role's earliest deadline, the per-worker load counters `mt6d status` shows ([`WorkerLoad`]),
//! the choice of CPUs by what the worker carries ([`placement`]), and the rule that a worker
//! never dies alone ([`stop_all_if_it_panics`]). Also shared: the batch sizes of UDP GSO sends
//! and writing opened packets to a TUN queue.
//!
//! ```text
//! loop until the role stops:
//!   epoll wait (at most the role's next deadline, at most POLL or the role's longest wait)
//!   TUN queue readable    -> Packets::outbound  (read a batch, seal, send)   -> load.sealed
//!   a socket readable     -> Packets::inbound   (receive a batch, open, write) -> load.opened
//!   every wake-up         -> Packets::after_wake (timers, counters, idle work)
//!   bytes carried         -> placement (light: the shared CPU; bulk: every CPU)
//! ```

pub mod load;
pub mod placement;
pub mod tun_batch;
pub mod window;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mt6d_os::{Epoll, EpollEvents, GROTable, OsError, PacketBuf, Tun, VIRTIO_NET_HDR_LEN};
use mt6d_proto::UnixTime;

pub use load::WorkerLoad;
use placement::{Move, Placement};
pub use tun_batch::TunBatch;

/// The token a worker's TUN queue is registered with in its epoll; a role registers its
/// sockets with any other token (the gateway uses their ports, < 2^16).
pub const TUN_TOKEN: u64 = u64::MAX;

/// The longest a worker waits before it looks at the stop flag again (and does its idle work).
pub const POLL: Duration = Duration::from_millis(100);

/// What one batch carried: packets and their bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Carried {
    pub packets: u64,
    pub bytes: u64,
}

impl Carried {
    pub const NOTHING: Carried = Carried {
        packets: 0,
        bytes: 0,
    };
}

/// The clock of one wake-up, read at most once (key expiry and placement need only coarse
/// time, and a wake-up that only sends needs none).
#[derive(Debug, Default)]
pub struct Wake {
    now: Option<UnixTime>,
}

impl Wake {
    /// The time of this wake-up (read from the clock at the first call).
    pub fn now(&mut self) -> UnixTime {
        *self.now.get_or_insert_with(super::clock::now)
    }
}

/// A role's packet work, run by [`serve`] on each of its workers.
pub trait Packets {
    /// The worker's TUN queue ([`TUN_TOKEN`]) is readable: read a batch, seal it, send it.
    /// Returns the packets sealed and their bytes on the wire.
    fn outbound(&mut self, wake: &mut Wake) -> Carried;
    /// The descriptor registered with `token` is readable: receive a batch, open it, deliver
    /// it. Returns the packets delivered and their bytes.
    fn inbound(&mut self, token: u64, wake: &mut Wake) -> Carried;
    /// After every wake-up, ready descriptors served or not (`idle`: the wait timed out):
    /// timers, counters, control requests. Default: nothing.
    fn after_wake(&mut self, _idle: bool, _wake: &mut Wake) {}
    /// The longest to wait now: the time to the role's earliest deadline. At most
    /// [`Packets::longest_wait`] is waited whatever it says. Default: [`POLL`].
    fn next_wait(&mut self) -> Duration {
        POLL
    }
    /// The cap on any wait: [`POLL`] for a worker that looks at the stop flag on its own; a
    /// worker whose epoll set holds a descriptor that every stop wakes (the relay's worker 0,
    /// which holds the main thread's `daemon::wakeup::MainWait`) may wait longer.
    fn longest_wait(&self) -> Duration {
        POLL
    }
    /// Whether the worker must stop (a stop signal, another worker failed).
    fn stopping(&self) -> bool;
}

/// Runs worker `index` of a role: waits in `epoll` (which holds its TUN queue under
/// [`TUN_TOKEN`] and its sockets) and hands whatever is ready to `role`, both directions,
/// until `role` says stop. Records its wake-ups and what it carried in `load`, and moves the
/// thread where [`Placement`] says (`placed`: off when `None`). An epoll failure ends it with
/// the error (the role's caller stops the daemon).
pub fn serve(
    epoll: &Epoll,
    index: usize,
    load: &WorkerLoad,
    placed: Option<Placement>,
    role: &mut impl Packets,
) -> Result<(), OsError> {
    let mut events = EpollEvents::with_capacity(64);
    let mut placement = placed.filter(Placement::is_on);
    // A worker starts light, so it starts at home: whether it ever carries anything depends
    // on where the traffic lands.
    if let Some(p) = &mut placement {
        place(p, load, index, super::clock::now(), 0);
    }
    while !role.stopping() {
        let wait = role.next_wait().min(role.longest_wait());
        let ready = match epoll.wait(&mut events, Some(wait)) {
            Ok(n) => n,
            Err(e) if e.is_would_block() => continue,
            Err(e) => return Err(e),
        };
        let mut wake = Wake::default();
        let mut carried = 0;
        if ready > 0 {
            load.wakeups.fetch_add(1, Ordering::Relaxed);
            for token in events.tokens() {
                if token == TUN_TOKEN {
                    let c = role.outbound(&mut wake);
                    if c.packets > 0 {
                        load.sealed.fetch_add(c.packets, Ordering::Relaxed);
                    }
                    carried += c.bytes;
                } else {
                    let c = role.inbound(token, &mut wake);
                    if c.packets > 0 {
                        load.opened.fetch_add(c.packets, Ordering::Relaxed);
                    }
                    carried += c.bytes;
                }
            }
        }
        role.after_wake(ready == 0, &mut wake);
        // Idle: a freed worker whose traffic stopped goes home at the end of its window, not
        // only at its next packet.
        if let Some(p) = &mut placement {
            if carried > 0 || ready == 0 {
                place(p, load, index, wake.now(), carried);
            }
        }
    }
    Ok(())
}

/// Moves the worker where [`Placement`] says, after it carried `bytes` at `now`, and records
/// where it is in `load` for `mt6d status`. If the kernel refuses (the daemon's CPU set changed
/// under it), placement stops for this worker.
fn place(placement: &mut Placement, load: &WorkerLoad, index: usize, now: UnixTime, bytes: u64) {
    let Some(to) = placement.carried(now, bytes) else {
        return;
    };
    let result = match placement.cpus(to) {
        Some(cpus) => mt6d_os::set_thread_affinity(&cpus).map_err(|e| format!("{cpus:?}: {e}")),
        None => Err("no CPU to move to".to_owned()),
    };
    match result {
        Ok(()) => {
            placement.moved(to);
            load.placed(placement.status());
        }
        Err(e) => {
            log::warn!(
                "data-plane worker {index}: cannot move to the CPUs of {} traffic ({e}); \
                 it stays where the kernel puts it",
                if to == Move::Home { "light" } else { "bulk" }
            );
            placement.turn_off();
            load.placed(placement.status());
        }
    }
}

/// Most datagrams in one UDP GSO send (the kernel's UDP_MAX_SEGMENTS is 64 on older kernels).
pub const MAX_GSO_SEGMENTS: usize = 64;
/// Most bytes in one UDP GSO send (an IPv6 datagram's payload length is 16 bits).
pub const MAX_GSO_BYTES: usize = 65_000;

/// Writes opened packets (each after a virtio header's room) to a TUN queue. The kernel
/// refusing one inner packet (e.g. no route on the protected side) is not a reason to stop: the
/// batch writes the others and reports one error, so `failures` counts at least one refused
/// packet; the device's rx_dropped counts the rest it refused.
pub fn write_to_tun(
    tun: &Tun,
    gro: &mut GROTable,
    packets: &mut [PacketBuf],
    failures: &std::sync::atomic::AtomicU64,
) {
    if packets.is_empty() {
        return;
    }
    if let Err(e) = tun.send_batch(gro, packets, VIRTIO_NET_HDR_LEN) {
        failures.fetch_add(1, Ordering::Relaxed);
        log::debug!("{e}");
    }
}

/// Runs `work` (worker `index`'s loop). A panic in it is caught and logged, and the daemon is
/// told to stop (it then cleans up and exits non-zero for its supervisor): a worker never dies
/// alone and silently, leaving its TUN queue and its peers unserved.
pub fn stop_all_if_it_panics(shutdown: &AtomicBool, index: usize, work: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
        log::error!(
            "data-plane worker {index} panicked (the message is above); stopping the daemon"
        );
        shutdown.store(true, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_worker_stops_the_daemon_and_a_returning_one_does_not() {
        let shutdown = AtomicBool::new(false);
        stop_all_if_it_panics(&shutdown, 0, || {});
        assert!(!shutdown.load(Ordering::Relaxed));
        stop_all_if_it_panics(&shutdown, 1, || panic!("injected"));
        assert!(shutdown.load(Ordering::Relaxed));
    }
}
