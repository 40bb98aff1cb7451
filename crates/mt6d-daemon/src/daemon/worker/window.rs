//! Light or busy: what a worker carried, counted over windows of [`WINDOW`] with hysteresis.
//! The gateway's choice of delivery queue and every role's worker placement
//! ([`super::placement`]) decide by it.

use std::time::Duration;

use mt6d_proto::UnixTime;

/// How long a worker counts what it carried before deciding again.
pub const WINDOW: Duration = Duration::from_millis(100);
/// Bulk: at least this many bytes in one window (320 Mbit/s): opened, for the queue choice;
/// sealed and opened, for [`super::placement`].
pub const BUSY_BYTES: u64 = 4_000_000;
/// Light again: fewer bytes than this in one window (40 Mbit/s).
pub const IDLE_BYTES: u64 = 500_000;

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
