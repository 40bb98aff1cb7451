//! When the per-rotation control messages leave (docs/PROTOCOL.md §5.6): each message gets its
//! own instant, drawn uniformly from the window its purpose allows, independently of every
//! other message and of the epoch before.
//!
//! A daemon that sends its per-rotation messages (link-layer announcements, priming neighbour
//! solicitations, duplicate address probes) as one burst in configuration order gives every
//! conversation the same place in every burst: an observer who numbers the messages of each
//! burst links each epoch to the next with certainty, whatever the tunnel hides (measured on the
//! segment: 1.00 for ten conversations, chance 0.10). One fixed offset from the boundary per
//! stream links the same way. Drawn instants make the order a fresh random permutation every
//! epoch and the offset a fresh uniform draw, so neither says anything about the stream.
//!
//! Sans-IO: the caller passes `now` and a source of random 64-bit words (the daemon's CSPRNG,
//! a seeded generator in tests) and sends what [`ControlPlan::take_due`] returns.

use std::time::Duration;

use crate::UnixTime;

/// Priming solicitations leave between these two leads before their epoch's boundary
/// (docs/PROTOCOL.md §5.6): the shorter one is the old fixed lead, which zero loss across a
/// router needs (the neighbour's entry must exist before the first packet, with clock skew,
/// a main-loop tick and processing time to spare); the longer one stays below R/2.
pub const PRIME_LEAD_MIN: Duration = Duration::from_millis(250);
/// See [`PRIME_LEAD_MIN`].
pub const PRIME_LEAD_MAX: Duration = Duration::from_millis(450);

/// The instants a message may leave at, both included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWindow {
    pub earliest: UnixTime,
    pub latest: UnixTime,
}

impl SendWindow {
    /// A window from `earliest` to `latest`; one that ends before it starts is the single
    /// instant `earliest`.
    pub fn new(earliest: UnixTime, latest: UnixTime) -> SendWindow {
        SendWindow {
            earliest,
            latest: latest.max(earliest),
        }
    }

    /// An instant drawn uniformly from the window (the modulo bias is below 2^-30 for any
    /// window shorter than a second, at nanosecond resolution).
    pub fn draw(&self, random: &mut impl FnMut() -> u64) -> UnixTime {
        let span = self.latest.as_nanos() - self.earliest.as_nanos();
        let offset = match span.checked_add(1) {
            Some(n) => random() % n,
            None => random(),
        };
        UnixTime::from_nanos(self.earliest.as_nanos() + offset)
    }

    /// The window no earlier than `now`: what is left of it, or `now` alone once it passed.
    pub fn not_before(self, now: UnixTime) -> SendWindow {
        SendWindow::new(self.earliest.max(now), self.latest)
    }
}

/// The window of the priming solicitation for an epoch starting at `boundary`:
/// [`PRIME_LEAD_MAX`] to [`PRIME_LEAD_MIN`] before it.
pub fn priming_window(boundary: UnixTime) -> SendWindow {
    let before = |d: Duration| {
        let d = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
        UnixTime::from_nanos(boundary.as_nanos().saturating_sub(d))
    };
    SendWindow::new(before(PRIME_LEAD_MAX), before(PRIME_LEAD_MIN))
}

/// The window of the link-layer address announcement on the send route of an epoch that
/// started at `start` and ends at `end`: its first three quarters. The announcement only keeps
/// a pin fresh (the peer pins every address of ours once it knows our MAC), so it need not be
/// early; the last quarter is left out so that the peer, whose clock may lag, still accepts the
/// route it travels on.
pub fn announcement_window(start: UnixTime, end: UnixTime) -> SendWindow {
    let span = end.as_nanos().saturating_sub(start.as_nanos());
    SendWindow::new(start, UnixTime::from_nanos(start.as_nanos() + span / 4 * 3))
}

/// Messages waiting for their drawn instants.
#[derive(Debug, Clone)]
pub struct ControlPlan<T> {
    /// (due, message), in no particular order.
    waiting: Vec<(UnixTime, T)>,
}

impl<T> Default for ControlPlan<T> {
    fn default() -> Self {
        ControlPlan {
            waiting: Vec::new(),
        }
    }
}

impl<T> ControlPlan<T> {
    /// Plans `message` at an instant drawn from `window`.
    pub fn schedule(&mut self, window: SendWindow, message: T, random: &mut impl FnMut() -> u64) {
        let due = window.draw(random);
        self.waiting.push((due, message));
    }

    /// The messages due at `now`, earliest first (their drawn order, not the order they were
    /// planned in), removed from the plan.
    pub fn take_due(&mut self, now: UnixTime) -> Vec<T> {
        let mut due: Vec<(UnixTime, T)> = Vec::new();
        let mut i = 0;
        while i < self.waiting.len() {
            if self.waiting[i].0 <= now {
                due.push(self.waiting.swap_remove(i));
            } else {
                i += 1;
            }
        }
        due.sort_by_key(|d| d.0);
        due.into_iter().map(|d| d.1).collect()
    }

    /// Keeps only the waiting messages `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&T) -> bool) {
        self.waiting.retain(|(_, m)| keep(m));
    }

    /// The waiting messages and their instants.
    pub fn waiting(&self) -> impl Iterator<Item = (UnixTime, &T)> {
        self.waiting.iter().map(|(t, m)| (*t, m))
    }

    /// When the next message is due.
    pub fn next_due(&self) -> Option<UnixTime> {
        self.waiting.iter().map(|w| w.0).min()
    }

    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    pub fn clear(&mut self) {
        self.waiting.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngCore, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    fn ms(v: u64) -> UnixTime {
        UnixTime::from_millis(v)
    }

    #[test]
    fn draws_stay_in_their_window_and_cover_it() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut random = || rng.next_u64();
        let w = priming_window(ms(10_000));
        assert_eq!((w.earliest, w.latest), (ms(9_550), ms(9_750)));
        let (mut lo, mut hi) = (u64::MAX, 0);
        for _ in 0..10_000 {
            let t = w.draw(&mut random).as_nanos();
            assert!((ms(9_550).as_nanos()..=ms(9_750).as_nanos()).contains(&t));
            lo = lo.min(t);
            hi = hi.max(t);
        }
        // Uniform over 200 ms: the extremes come within 1 ms of the ends.
        assert!(lo < ms(9_551).as_nanos() && hi > ms(9_749).as_nanos());
        // Below R/2 for the shortest interval: never before the previous boundary.
        assert!(PRIME_LEAD_MAX < Duration::from_millis(500));
        // A window already past leaves at once; an empty one is its start.
        assert_eq!(w.not_before(ms(20_000)).draw(&mut random), ms(20_000));
        let a = announcement_window(ms(0), ms(1_000));
        assert_eq!((a.earliest, a.latest), (ms(0), ms(750)));
        assert_eq!(SendWindow::new(ms(5), ms(1)).draw(&mut random), ms(5));
    }

    #[test]
    fn messages_planned_in_one_order_leave_in_a_fresh_random_one() {
        const PEERS: usize = 8;
        const EPOCHS: usize = 2_000;
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut random = || rng.next_u64();
        let mut plan = ControlPlan::default();
        // How often peer p leaves in place k, and in the same place as the epoch before.
        let mut places = [[0u32; PEERS]; PEERS];
        let mut same_place = 0;
        let mut last: Option<Vec<usize>> = None;
        for e in 0..EPOCHS as u64 {
            let boundary = ms(1_000 * (e + 1));
            for p in 0..PEERS {
                plan.schedule(priming_window(boundary), p, &mut random);
            }
            assert!(plan.take_due(ms(1_000 * e + 549)).is_empty(), "none early");
            let order = plan.take_due(boundary);
            assert_eq!(order.len(), PEERS);
            for (k, &p) in order.iter().enumerate() {
                places[p][k] += 1;
            }
            if let Some(prev) = &last {
                same_place += (0..PEERS).filter(|&k| prev[k] == order[k]).count();
            }
            last = Some(order);
        }
        // Every place about 1/PEERS of the time (expected 250, sd ~15).
        for row in places {
            for n in row {
                assert!((180..=320).contains(&n), "{places:?}");
            }
        }
        // The same place as the epoch before: chance, 1/PEERS (expected ~2000, sd ~42).
        let frac = same_place as f64 / ((EPOCHS - 1) * PEERS) as f64;
        assert!((frac - 1.0 / PEERS as f64).abs() < 0.02, "{frac}");
        assert!(plan.is_empty());
    }

    #[test]
    fn retain_drops_and_next_due_is_the_earliest() {
        let mut n = 0u64;
        let mut counting = || {
            n += 1;
            n * 10_000_000
        };
        let mut plan = ControlPlan::default();
        let w = SendWindow::new(ms(0), ms(1_000));
        plan.schedule(w, "a", &mut counting);
        plan.schedule(w, "b", &mut counting);
        plan.schedule(w, "c", &mut counting);
        assert_eq!(plan.next_due(), Some(ms(10)));
        plan.retain(|m| *m != "a");
        assert_eq!(plan.next_due(), Some(ms(20)));
        assert_eq!(plan.take_due(ms(25)), vec!["b"]);
        assert_eq!(plan.waiting().count(), 1);
        plan.clear();
        assert_eq!(plan.next_due(), None);
    }
}
