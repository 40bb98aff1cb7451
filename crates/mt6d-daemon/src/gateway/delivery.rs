//! Which TUN queue a worker writes what it opened into: its own, or the next worker's
//! (docs/ARCHITECTURE.md "Workers", steering).
//!
//! The TUN device's flow table follows the writer: the packets of a flow coming back from the
//! protected side land on the queue its last packet was written into. Written into the worker's
//! *own* queue, a reply comes back to the thread that delivered the request; if the protected
//! host answers at once (an ICMPv6 echo, a reply produced inside the write), the worker finds
//! it on its queue as soon as it returns to its poll, with no thread woken: the lowest latency.
//! (The device records the writer after the write, so an answer made inside it follows the
//! flow's previous write: the same worker for a ping train; for a new TCP flow see
//! [`super::syn_queues`].)
//! Written into the *next* worker's queue, the two directions of a busy peer run on two threads:
//! in interleaved quick runs 15-38 % more plain TCP, but a round trip wakes one more thread per
//! gateway (ping 0.03-0.08 ms slower).
//!
//! So a worker delivers into its own queue while what it opens is light, and into the next
//! queue while it carries bulk: more than [`BUSY_BYTES`] in a [`WINDOW`](crate::daemon::worker::window::WINDOW), back below
//! [`IDLE_BYTES`] (hysteresis, so a transfer does not flip between the two). A switch moves the
//! answers of the worker's flows to another queue once; answers already queued on the old
//! queue may then leave after newer ones, once per switch, as after a route change. Packets
//! toward the protected side are never reordered by it (one worker writes them in order).

use mt6d_proto::UnixTime;

use crate::daemon::worker::window::{LoadWindow, BUSY_BYTES, IDLE_BYTES};

/// One worker's choice of delivery queue. Starts light (its own queue).
#[derive(Debug, Clone, Copy)]
pub struct Delivery(LoadWindow);

impl Default for Delivery {
    fn default() -> Delivery {
        Delivery::new()
    }
}

impl Delivery {
    pub const fn new() -> Delivery {
        Delivery(LoadWindow::new(BUSY_BYTES, IDLE_BYTES))
    }

    /// Whether to write into the next worker's queue now (else the worker's own).
    pub fn next_queue(&self) -> bool {
        self.0.busy()
    }

    /// Counts `bytes` delivered at `now`; at the end of a window, decides for the next one. A
    /// window with no delivery at all counts as light: an idle worker is back on its own queue
    /// after its first delivery following a pause of one window.
    pub fn delivered(&mut self, now: UnixTime, bytes: u64) {
        self.0.add(now, bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(ms: u64) -> UnixTime {
        UnixTime::from_nanos(1_700_000_000_000_000_000 + ms * 1_000_000)
    }

    #[test]
    fn light_traffic_stays_on_the_own_queue() {
        let mut d = Delivery::new();
        // A ping train: 100 bytes every 100 ms, for a minute.
        for i in 0..600 {
            d.delivered(at(i * 100), 100);
            assert!(!d.next_queue());
        }
    }

    #[test]
    fn bulk_moves_to_the_next_queue_after_one_window_and_stays_there() {
        let mut d = Delivery::new();
        // 64 kB every ms: 6.4 MB per window, 512 Mbit/s.
        for ms in 0..100 {
            d.delivered(at(ms), 64_000);
            assert!(!d.next_queue(), "undecided within the first window");
        }
        for ms in 100..2_000 {
            d.delivered(at(ms), 64_000);
            assert!(d.next_queue(), "bulk at {ms} ms");
        }
    }

    #[test]
    fn a_rate_between_the_thresholds_keeps_the_last_choice() {
        // 2 MB per window: neither busy nor idle.
        let mut busy = Delivery::new();
        for ms in 0..300 {
            busy.delivered(at(ms), 64_000);
        }
        assert!(busy.next_queue());
        for ms in 300..1_300 {
            busy.delivered(at(ms), 20_000);
            assert!(busy.next_queue(), "hysteresis keeps bulk at {ms} ms");
        }
        let mut light = Delivery::new();
        for ms in 0..1_300 {
            light.delivered(at(ms), 20_000);
            assert!(!light.next_queue(), "hysteresis keeps light at {ms} ms");
        }
    }

    #[test]
    fn after_a_pause_a_worker_delivers_light_again() {
        let mut d = Delivery::new();
        for ms in 0..300 {
            d.delivered(at(ms), 64_000);
        }
        assert!(d.next_queue());
        // Silence for 5 s, then one echo: the window that ends spans 50 windows of almost
        // nothing.
        d.delivered(at(5_300), 100);
        assert!(!d.next_queue());
    }
}
