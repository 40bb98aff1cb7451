//! One link's cost and liveness from probes (docs/PROTOCOL.md §10.6-§10.7; 003 §III.G).
//!
//! A [`LinkMonitor`] runs one end of a link's probe train and turns its replies into a cost:
//! ```text
//! srtt  = first sample, then srtt += (sample - srtt) / 8          (RFC 6298)
//! loss  = lost / known over the last 256 requests whose fate is known (25.6 s)
//! raw   = 10 + min(ceil(srtt / 1 ms), 1000) + floor(500 * loss)  (003: default + missing/sent * add-on)
//! Down (infinite) --first reply--> Up, or Probation (raw + 4096) for 10 s if it ever died
//! Up/Probation --no reply for 400 ms, and >= 4 requests since the last reply overdue--> Down
//! ```
//! The cost it publishes ([`LinkMonitor::poll_cost_change`]) follows `raw` only past 12.5 % or on
//! a state change, so RTT jitter does not move routes; the probation penalty keeps a link that just
//! came back as a last resort until it has been healthy for the hold time.
//!
//! Sans-IO: the caller sends a request for every sequence [`LinkMonitor::poll_probe`] returns,
//! answers the peer's requests itself (stateless), feeds replies to
//! [`LinkMonitor::handle_reply`], and calls [`LinkMonitor::handle_timeout`] at
//! [`LinkMonitor::poll_timeout`]. Randomness (the probe interval's jitter) comes in as an argument.

use std::collections::VecDeque;
use std::time::Duration;

use super::Metric;
use crate::UnixTime;

/// Mean interval between probe requests (§10.6).
pub const PROBE_INTERVAL: Duration = Duration::from_millis(50);
/// The interval is uniform in `PROBE_INTERVAL +- PROBE_JITTER`: 37.5..=62.5 ms.
pub const PROBE_JITTER: Duration = Duration::from_micros(12_500);
/// A request unanswered this long is lost; later replies are ignored.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(1);
/// No reply for this long declares the link dead (with [`DEAD_MIN_OVERDUE`] requests overdue):
/// about 7 requests at 50 ms, all unanswered. At 1 % loss each way a round trip fails 2 % of
/// the time, so a healthy link looks dead about once in 10^12 windows; with 100 ms probes and 3
/// requests (8e-6) the simulation of 003's topology saw it every few hours per link.
pub const DEAD_AFTER: Duration = Duration::from_millis(400);
/// Requests sent since the last reply that must be overdue (sent more than [`OVERDUE_RTTS`]
/// smoothed RTTs ago) before a silence is believed: no verdict on a link the caller stopped
/// probing, or whose RTT is longer than the silence.
pub const DEAD_MIN_OVERDUE: usize = 4;
/// A request is overdue this many smoothed RTTs after it left.
pub const OVERDUE_RTTS: u32 = 2;
/// How long a link that came back stays in probation.
pub const HOLD: Duration = Duration::from_secs(10);
/// Added to the cost in probation.
pub const PROBATION_PENALTY: u16 = 4096;
/// Cost of every hop, whatever its RTT (003's "default link cost").
pub const BASE_COST: u16 = 10;
/// RTT term cap, in milliseconds.
pub const MAX_RTT_COST: u16 = 1000;
/// Cost of 100 % loss (003's "add-on cost"): 1 % loss weighs as 5 ms of RTT.
pub const LOSS_COST: u16 = 500;
/// Requests whose fate the loss estimate remembers: 25.6 s of probes. At 1 % loss a 64-probe
/// window moved the cost by 8 per lost probe and made equal links differ by a whole hop's cost
/// (docs/RELAYS.md, "Link cost").
pub const LOSS_WINDOW: u32 = 256;
const LOSS_WORDS: usize = LOSS_WINDOW as usize / 64;

/// The fate of the last [`LOSS_WINDOW`] resolved requests, as a ring of bits (1 = lost).
#[derive(Debug, Clone, Default)]
struct LossWindow {
    bits: [u64; LOSS_WORDS],
    next: usize,
    known: u32,
    lost: u32,
}

impl LossWindow {
    fn record(&mut self, lost: bool) {
        let (word, bit) = (self.next / 64, self.next % 64);
        if self.known == LOSS_WINDOW {
            // The slot holds the oldest outcome, which leaves the window.
            self.lost -= u32::from(self.bits[word] >> bit & 1 == 1);
        } else {
            self.known += 1;
        }
        if lost {
            self.bits[word] |= 1 << bit;
        } else {
            self.bits[word] &= !(1 << bit);
        }
        self.lost += u32::from(lost);
        self.next = (self.next + 1) % (LOSS_WINDOW as usize);
    }
}

/// Where a link stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkState {
    /// No reply yet, or dead: infinite cost.
    Down,
    /// Answering; the published cost is the raw cost.
    Up,
    /// Answering again after a death; the penalty applies until `until`.
    Probation {
        /// When the hold time ends.
        until: UnixTime,
    },
}

/// Probe bookkeeping and cost estimate for one end of one link. See the module documentation.
#[derive(Debug)]
pub struct LinkMonitor {
    state: LinkState,
    ever_dead: bool,
    next_sequence: u32,
    next_probe: UnixTime,
    /// Requests not yet answered or lost, oldest first: (sequence, departure).
    outstanding: VecDeque<(u32, UnixTime)>,
    last_reply: Option<UnixTime>,
    srtt_us: Option<u64>,
    loss: LossWindow,
    published: Metric,
    /// The raw cost when `published` was last set (the hysteresis reference).
    published_raw: Option<u16>,
    pending_change: bool,
    stats: MonitorStats,
}

/// Counters of one monitor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MonitorStats {
    /// Requests sent.
    pub requests: u64,
    /// Replies that gave an RTT sample.
    pub replies: u64,
    /// Requests lost (unanswered for [`REPLY_TIMEOUT`]).
    pub lost: u64,
    /// Replies to no outstanding request (`relay_probe_unexpected`).
    pub unexpected: u64,
    /// Times the link was declared dead.
    pub deaths: u64,
}

impl LinkMonitor {
    /// A link that has not answered yet (`Down`); its first request is due at `now`.
    pub fn new(now: UnixTime) -> LinkMonitor {
        LinkMonitor {
            state: LinkState::Down,
            ever_dead: false,
            next_sequence: 0,
            next_probe: now,
            outstanding: VecDeque::with_capacity(16),
            last_reply: None,
            srtt_us: None,
            loss: LossWindow::default(),
            published: Metric::INFINITY,
            published_raw: None,
            pending_change: false,
            stats: MonitorStats::default(),
        }
    }

    /// The state.
    pub fn state(&self) -> LinkState {
        self.state
    }
    /// The published cost ([`Metric::INFINITY`] while `Down`).
    pub fn cost(&self) -> Metric {
        self.published
    }
    /// The smoothed RTT (None until a sample, and after a death).
    pub fn srtt(&self) -> Option<Duration> {
        self.srtt_us.map(Duration::from_micros)
    }
    /// (lost, known) over the loss window.
    pub fn loss(&self) -> (u32, u32) {
        (self.loss.lost, self.loss.known)
    }
    /// Counters.
    pub fn stats(&self) -> MonitorStats {
        self.stats
    }

    /// The raw cost of §10.7 (None without an RTT sample).
    pub fn raw_cost(&self) -> Option<u16> {
        let srtt = self.srtt_us?;
        let rtt_ms = u16::try_from(srtt.div_ceil(1000))
            .unwrap_or(u16::MAX)
            .min(MAX_RTT_COST);
        // lost <= known, so this is at most 500; nothing known yet: no loss term.
        let loss = (u32::from(LOSS_COST) * self.loss.lost)
            .checked_div(self.loss.known)
            .map_or(0, |l| u16::try_from(l).unwrap_or(LOSS_COST));
        Some(BASE_COST + rtt_ms + loss)
    }

    /// When [`LinkMonitor::handle_timeout`] or [`LinkMonitor::poll_probe`] has work next.
    pub fn poll_timeout(&self) -> UnixTime {
        let mut t = self.next_probe;
        if let Some(&(_, sent)) = self.outstanding.front() {
            t = t.min(sent.saturating_add(REPLY_TIMEOUT));
        }
        // Death needs overdue requests too; with fewer sent, the next request is the next
        // occasion.
        if let Some(d) = self.death_due() {
            t = t.min(d);
        }
        if let LinkState::Probation { until } = self.state {
            t = t.min(until);
        }
        t
    }

    /// The sequence of a request to send now, if one is due. `random` (any u32 from the caller's
    /// RNG) picks the interval to the next one, uniform in 37.5..=62.5 ms.
    pub fn poll_probe(&mut self, now: UnixTime, random: u32) -> Option<u32> {
        if now < self.next_probe {
            return None;
        }
        let seq = self.next_sequence;
        self.next_sequence = seq.wrapping_add(1);
        let spread = u64::try_from(2 * PROBE_JITTER.as_micros()).unwrap_or(0);
        let offset = u64::from(random) % (spread + 1);
        let interval = (PROBE_INTERVAL - PROBE_JITTER) + Duration::from_micros(offset);
        self.next_probe = now.saturating_add(interval);
        // More outstanding than a reply timeout's worth of requests means the caller probes
        // faster than 75 ms; count the oldest as lost rather than grow.
        if self.outstanding.len() >= 64 {
            self.outstanding.pop_front();
            self.record(true);
        }
        self.outstanding.push_back((seq, now));
        self.stats.requests += 1;
        self.check(now);
        Some(seq)
    }

    /// A reply with `sequence` arrived at `now`. False (and counted) if it answers no request
    /// sent in the last [`REPLY_TIMEOUT`] that is still unanswered.
    pub fn handle_reply(&mut self, now: UnixTime, sequence: u32) -> bool {
        self.expire(now);
        let Some(i) = self.outstanding.iter().position(|&(s, _)| s == sequence) else {
            self.stats.unexpected += 1;
            return false;
        };
        let Some((_, sent)) = self.outstanding.remove(i) else {
            return false;
        };
        if self.state == LinkState::Down {
            // Coming back: what was sent before this request went into the outage, and the
            // losses of the outage say nothing about the link now.
            self.outstanding.drain(..i);
            self.loss = LossWindow::default();
        }
        let sample =
            u64::try_from(now.saturating_duration_since(sent).as_micros()).unwrap_or(u64::MAX);
        self.srtt_us = Some(match self.srtt_us {
            None => sample,
            // RFC 6298: srtt = 7/8 srtt + 1/8 sample.
            Some(s) => (s.saturating_mul(7).saturating_add(sample)) / 8,
        });
        self.record(false);
        self.stats.replies += 1;
        self.last_reply = Some(now);
        if self.state == LinkState::Down {
            self.state = if self.ever_dead {
                LinkState::Probation {
                    until: now.saturating_add(HOLD),
                }
            } else {
                LinkState::Up
            };
            self.publish(true);
        } else {
            self.publish(false);
        }
        true
    }

    /// Resolves lost requests, declares death, ends probation.
    pub fn handle_timeout(&mut self, now: UnixTime) {
        self.expire(now);
        self.check(now);
    }

    /// The new published cost, once per change (feed it to
    /// [`super::table::RoutingTable::handle_link_cost`]).
    pub fn poll_cost_change(&mut self) -> Option<Metric> {
        std::mem::take(&mut self.pending_change).then_some(self.published)
    }

    fn expire(&mut self, now: UnixTime) {
        while let Some(&(_, sent)) = self.outstanding.front() {
            if now < sent.saturating_add(REPLY_TIMEOUT) {
                break;
            }
            self.outstanding.pop_front();
            self.stats.lost += 1;
            if self.state != LinkState::Down {
                self.record(true);
            }
        }
        if self.state != LinkState::Down {
            self.publish(false);
        }
    }

    fn check(&mut self, now: UnixTime) {
        match self.state {
            LinkState::Down => {}
            LinkState::Up | LinkState::Probation { .. } => {
                if self.death_due().is_some_and(|d| now >= d) {
                    self.die();
                } else if let LinkState::Probation { until } = self.state {
                    if now >= until {
                        self.state = LinkState::Up;
                        self.publish(true);
                    }
                }
            }
        }
    }

    /// When silence becomes death if no reply comes: 400 ms after the last reply, and not before
    /// the fourth request sent since then is overdue. None while fewer have been sent (or the
    /// link is down).
    fn death_due(&self) -> Option<UnixTime> {
        if self.state == LinkState::Down {
            return None;
        }
        let r = self.last_reply?;
        let grace = Duration::from_micros(self.srtt_us?).saturating_mul(OVERDUE_RTTS);
        let (_, fourth) = self
            .outstanding
            .iter()
            .filter(|(_, sent)| *sent >= r)
            .nth(DEAD_MIN_OVERDUE - 1)?;
        Some(
            r.saturating_add(DEAD_AFTER)
                .max(fourth.saturating_add(grace)),
        )
    }

    fn die(&mut self) {
        self.state = LinkState::Down;
        self.ever_dead = true;
        self.stats.deaths += 1;
        // A late reply to a request of the old life must not revive the link, and the old RTT
        // and loss say nothing about the link that comes back.
        self.outstanding.clear();
        self.srtt_us = None;
        self.loss = LossWindow::default();
        self.last_reply = None;
        self.publish(true);
    }

    fn record(&mut self, lost: bool) {
        self.loss.record(lost);
    }

    /// Recomputes the published cost: on a state change always, else only past 12.5 % of the
    /// reference raw cost.
    fn publish(&mut self, state_changed: bool) {
        let raw = self.raw_cost();
        let moved = match (raw, self.published_raw) {
            (Some(r), Some(p)) => u32::from(r.abs_diff(p)) * 8 > u32::from(p),
            (a, b) => a != b,
        };
        if !state_changed && !moved {
            return;
        }
        self.published_raw = raw;
        let cost = match (self.state, raw) {
            (LinkState::Down, _) | (_, None) => Metric::INFINITY,
            (LinkState::Up, Some(r)) => Metric(r),
            (LinkState::Probation { .. }, Some(r)) => Metric(r.saturating_add(PROBATION_PENALTY)),
        };
        if cost != self.published {
            self.published = cost;
            self.pending_change = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> UnixTime {
        UnixTime::from_millis(1_700_000_000_000 + ms)
    }

    /// Drives a monitor from `from` to `to` (ms) in 1 ms steps, answering every request after
    /// `rtt` ms unless `answer` says no; returns the published costs seen.
    fn run(
        m: &mut LinkMonitor,
        from: u64,
        to: u64,
        rtt: u64,
        answer: &mut dyn FnMut(u32) -> bool,
    ) -> Vec<(u64, Metric)> {
        let mut in_flight: Vec<(u64, u32)> = Vec::new();
        let mut seen = Vec::new();
        for ms in from..to {
            let now = t(ms);
            in_flight.retain(|&(at, seq)| {
                if at == ms {
                    m.handle_reply(now, seq);
                    false
                } else {
                    true
                }
            });
            while let Some(seq) = m.poll_probe(now, 12_500) {
                if answer(seq) {
                    in_flight.push((ms + rtt, seq));
                }
            }
            m.handle_timeout(now);
            if let Some(c) = m.poll_cost_change() {
                seen.push((ms, c));
            }
        }
        seen
    }

    #[test]
    fn probes_every_50_ms_with_jitter_from_the_caller() {
        let us = |us: u64| t(0).saturating_add(Duration::from_micros(us));
        let mut m = LinkMonitor::new(t(0));
        assert_eq!(m.poll_probe(t(0), 0), Some(0));
        assert_eq!(m.poll_timeout(), us(37_500), "random 0: 37.5 ms");
        assert_eq!(m.poll_probe(t(37), 0), None);
        assert_eq!(m.poll_probe(us(37_500), 25_000), Some(1));
        assert_eq!(
            m.poll_timeout(),
            us(37_500 + 62_500),
            "random 25000: 62.5 ms"
        );
        assert_eq!(m.poll_probe(t(100), 12_500), Some(2));
        assert_eq!(m.poll_timeout(), t(150), "random 12500: 50 ms");
        assert_eq!(m.stats().requests, 3);
    }

    #[test]
    fn first_reply_brings_the_link_up_with_base_plus_rtt() {
        let mut m = LinkMonitor::new(t(0));
        let seen = run(&mut m, 0, 2000, 10, &mut |_| true);
        assert_eq!(seen[0], (10, Metric(20)), "10 + 10 ms");
        assert_eq!(m.state(), LinkState::Up);
        assert_eq!(m.cost(), Metric(20));
        assert_eq!(m.srtt(), Some(Duration::from_millis(10)));
        assert_eq!(m.loss(), (0, 40));
        assert_eq!(seen.len(), 1, "a steady link publishes once");
    }

    #[test]
    fn hysteresis_ignores_small_rtt_changes_and_follows_large_ones() {
        let mut m = LinkMonitor::new(t(0));
        run(&mut m, 0, 1000, 40, &mut |_| true);
        assert_eq!(m.cost(), Metric(50));
        // 45 ms: raw converges to 55, within 1/8 of 50: nothing published.
        let seen = run(&mut m, 1000, 5000, 45, &mut |_| true);
        assert!(seen.is_empty(), "{seen:?}");
        assert_eq!(m.raw_cost(), Some(55));
        // 80 ms: published once raw passes 50 + 6.25.
        let seen = run(&mut m, 5000, 9000, 80, &mut |_| true);
        assert!(!seen.is_empty());
        assert!(seen[0].1 .0 > 56 && seen[0].1 .0 < 64, "{seen:?}");
    }

    #[test]
    fn loss_adds_500_times_the_lost_fraction() {
        let mut m = LinkMonitor::new(t(0));
        // Every fourth request unanswered: 25 % -> +125.
        run(&mut m, 0, 40_000, 10, &mut |seq| seq % 4 != 3);
        // The window holds the last 256 resolved requests; losses resolve 1 s after departure,
        // answers 10 ms after, so the share is a quarter give or take a few.
        let (lost, known) = m.loss();
        assert_eq!(known, 256);
        assert!((61..=67).contains(&lost), "{lost}");
        let loss = u16::try_from(500 * lost / 256).unwrap();
        assert_eq!(m.raw_cost(), Some(10 + 10 + loss));
        assert_eq!(m.state(), LinkState::Up, "isolated losses are no death");
    }

    #[test]
    fn silence_of_400_ms_is_death_and_the_link_returns_through_probation() {
        let mut m = LinkMonitor::new(t(0));
        run(&mut m, 0, 3000, 5, &mut |_| true);
        assert_eq!(m.cost(), Metric(15));
        // Cut at 3000: the last reply is for the request sent just before.
        let seen = run(&mut m, 3000, 6000, 5, &mut |_| false);
        assert_eq!(seen.len(), 1);
        let (died, cost) = seen[0];
        assert_eq!(cost, Metric::INFINITY);
        // Last reply at 2955 (request of 2950); 400 ms later 7 requests are overdue.
        assert_eq!(died, 3355);
        assert_eq!(m.state(), LinkState::Down);
        assert_eq!(m.srtt(), None);
        assert_eq!(m.stats().deaths, 1);
        // Back at 6000: probation (penalty) for 10 s, then the plain cost.
        let seen = run(&mut m, 6000, 17_000, 5, &mut |_| true);
        assert_eq!(seen[0].1, Metric(15 + PROBATION_PENALTY));
        assert_eq!(seen[0].0, 6005, "{seen:?}");
        assert_eq!(m.loss(), (0, 220), "the outage's losses are forgotten");
        let back = seen.iter().find(|(_, c)| *c == Metric(15)).unwrap();
        assert_eq!(back.0, seen[0].0 + 10_000, "hold time");
        assert_eq!(m.state(), LinkState::Up);
    }

    #[test]
    fn a_death_in_probation_restarts_the_hold() {
        let mut m = LinkMonitor::new(t(0));
        run(&mut m, 0, 1000, 5, &mut |_| true);
        run(&mut m, 1000, 2000, 5, &mut |_| false);
        run(&mut m, 2000, 5000, 5, &mut |_| true);
        assert!(matches!(m.state(), LinkState::Probation { .. }));
        run(&mut m, 5000, 6000, 5, &mut |_| false);
        assert_eq!(m.state(), LinkState::Down);
        let seen = run(&mut m, 6000, 20_000, 5, &mut |_| true);
        let up = seen.iter().find(|(_, c)| *c == Metric(15)).unwrap();
        assert!(up.0 >= 16_000, "{seen:?}");
        assert_eq!(m.stats().deaths, 2);
    }

    #[test]
    fn the_loss_window_forgets_its_oldest_outcome() {
        let mut w = LossWindow::default();
        w.record(true);
        for _ in 1..LOSS_WINDOW {
            w.record(false);
        }
        assert_eq!((w.lost, w.known), (1, LOSS_WINDOW));
        w.record(false);
        assert_eq!(
            (w.lost, w.known),
            (0, LOSS_WINDOW),
            "the loss left the window"
        );
        for _ in 0..LOSS_WINDOW * 3 {
            w.record(true);
        }
        assert_eq!(w.lost, LOSS_WINDOW);
    }

    #[test]
    fn late_and_unknown_replies_are_ignored() {
        let mut m = LinkMonitor::new(t(0));
        let s = m.poll_probe(t(0), 0).unwrap();
        assert!(!m.handle_reply(t(5), s + 1), "never sent");
        assert!(m.handle_reply(t(5), s));
        assert!(!m.handle_reply(t(6), s), "answered twice");
        let s2 = m.poll_probe(t(100), 0).unwrap();
        assert!(!m.handle_reply(t(1100), s2), "after the reply timeout");
        assert_eq!(m.stats().unexpected, 3);
        assert_eq!(m.stats().lost, 1);
    }

    #[test]
    fn a_late_reply_from_before_a_death_does_not_revive_the_link() {
        let mut m = LinkMonitor::new(t(0));
        run(&mut m, 0, 1000, 5, &mut |_| true);
        let old = m.poll_probe(t(1000), 0).unwrap();
        run(&mut m, 1001, 1600, 5, &mut |_| false);
        assert_eq!(m.state(), LinkState::Down);
        assert!(!m.handle_reply(t(1601), old));
        assert_eq!(m.state(), LinkState::Down);
    }

    #[test]
    fn silence_without_requests_is_not_death() {
        let mut m = LinkMonitor::new(t(0));
        let s = m.poll_probe(t(0), 0).unwrap();
        m.handle_reply(t(5), s);
        // The caller stops probing: no verdict without 4 overdue requests.
        m.handle_timeout(t(5000));
        assert_eq!(m.state(), LinkState::Up);
        assert_eq!(
            m.poll_timeout(),
            t(0).saturating_add(Duration::from_micros(37_500)),
            "no busy wait on a past deadline"
        );
    }

    #[test]
    fn a_long_rtt_waits_for_overdue_requests() {
        // 300 ms RTT: replies to pipelined requests arrive every 50 ms, the link is healthy.
        let mut m = LinkMonitor::new(t(0));
        run(&mut m, 0, 5000, 300, &mut |_| true);
        assert_eq!(m.state(), LinkState::Up);
        assert_eq!(m.stats().deaths, 0);
        // Cut at 5000 (replies in flight lost): 400 ms of silence are not yet evidence, since
        // requests sent after the last reply could not have been answered; death comes when the
        // fourth of them is two RTTs old (about 5150 + 600).
        let seen = run(&mut m, 5000, 7000, 300, &mut |_| false);
        assert_eq!(seen.len(), 1);
        assert!(matches!(seen[0].0, 5700..=5800), "{seen:?}");
    }
}
