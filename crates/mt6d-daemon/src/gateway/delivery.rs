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
//! queue while it carries bulk: more than [`BUSY_BYTES`] in a [`WINDOW`], back below
//! [`IDLE_BYTES`] (hysteresis, so a transfer does not flip between the two). A switch moves the
//! answers of the worker's flows to another queue once; answers already queued on the old
//! queue may then leave after newer ones, once per switch, as after a route change. Packets
//! toward the protected side are never reordered by it (one worker writes them in order).

use std::time::Duration;

use mt6d_proto::UnixTime;

/// How long a worker counts what it carried before deciding again.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Bulk: at least this many bytes in one window (320 Mbit/s): opened, for the queue choice;
/// sealed and opened, for [`super::placement`].
pub const BUSY_BYTES: u64 = 4_000_000;
/// Light again: fewer bytes than this in one window (40 Mbit/s).
pub const IDLE_BYTES: u64 = 500_000;

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

/// Light or busy, decided once per [`WINDOW`] from an amount counted over it, with
/// hysteresis: busy from `busy_at` per window, light again below `idle_below`. Starts light.
#[derive(Debug, Clone, Copy)]
pub struct LoadWindow {
    window_start: Option<UnixTime>,
    amount: u64,
    busy: bool,
    busy_at: u64,
    idle_below: u64,
}

impl LoadWindow {
    pub const fn new(busy_at: u64, idle_below: u64) -> LoadWindow {
        LoadWindow {
            window_start: None,
            amount: 0,
            busy: false,
            busy_at,
            idle_below,
        }
    }

    /// The decision of the last window that ended.
    pub fn busy(&self) -> bool {
        self.busy
    }

    /// Counts `amount` at `now`; at the end of a window, decides for the next one. Over more
    /// than one window (a pause), the amount counts as spread over all of them.
    pub fn add(&mut self, now: UnixTime, amount: u64) {
        let start = *self.window_start.get_or_insert(now);
        let elapsed = now.saturating_duration_since(start);
        if elapsed >= WINDOW {
            let windows = (elapsed.as_nanos() / WINDOW.as_nanos()).max(1) as u64;
            let per_window = self.amount / windows;
            if per_window >= self.busy_at {
                self.busy = true;
            } else if per_window < self.idle_below {
                self.busy = false;
            }
            self.window_start = Some(now);
            self.amount = 0;
        }
        self.amount = self.amount.saturating_add(amount);
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
