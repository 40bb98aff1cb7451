//! One Fig. 2 cell: requests at a set rate from random clients, every round trip timed,
//! whatever carries them (the server role's tunnel or the netlink method's plain UDP).

use std::time::{Duration, Instant};

use mt6d_lab::clients::{ClientSet, ClientSpec};
use mt6d_lab::server_lab::ECHO_PORT;
use mt6d_os::{Epoll, EpollEvents};

use super::{Rng, ServerArgs, FACTOR, REQUEST};
use crate::json::{Value, ValueExt};
use crate::procs::{CpuSplit, ThreadCpu};

/// Clients the generator rotates at a time (about 2.5 us each at a million clients), and the
/// longest it rotates between two looks at its sends and answers. The loop comes round at
/// least every millisecond, so this keeps up with a million clients' 100,000 boundaries a
/// second at a 10 s rotation.
const GENERATOR_STEP: usize = 16;
const GENERATOR_BUDGET: Duration = Duration::from_micros(250);
/// A catch-up round that advanced at most this many clients (5 ms of boundaries at a million
/// clients and a 10 s interval) leaves the rest to the cell's own steps.
const CAUGHT_UP: usize = 500;

/// Whose CPU a cell measures: the threads of process `pid` (all of them, or only thread
/// `only`), split into main thread, the threads named `workers*` and the rest.
#[derive(Debug, Clone, Copy)]
pub(super) struct Meter {
    pub(super) pid: u32,
    pub(super) only: Option<u32>,
    pub(super) workers: &'static str,
}

impl Meter {
    /// The server role's process: its workers are `mt6d-s0`, `mt6d-s1`, ...
    pub(super) fn server(pid: u32) -> Meter {
        Meter {
            pid,
            only: None,
            workers: "mt6d-s",
        }
    }

    pub(super) fn sample(&self) -> Vec<ThreadCpu> {
        match self.only {
            Some(tid) => ThreadCpu::read(self.pid, tid).into_iter().collect(),
            None => ThreadCpu::all(self.pid),
        }
    }

    pub(super) fn split(&self, a: &[ThreadCpu], b: &[ThreadCpu]) -> CpuSplit {
        CpuSplit::between(self.pid, self.workers, a, b)
    }
}

/// What Fig. 2 drives: requests from random clients, answers back. The server role's load is
/// the many-client generator through the tunnel; the netlink method's is plain UDP to its
/// bound addresses.
pub(super) trait Load {
    /// The receiving socket, for an epoll.
    fn fd(&self) -> std::os::fd::RawFd;
    /// Housekeeping due now (the generator's rotation), all of it; how many clients it advanced.
    fn tick(&mut self) -> usize;
    /// Some of the housekeeping due now, a bounded amount: the generator rotates between
    /// sends and receives, so a long step would hold answers in its socket and show as
    /// response time.
    fn tick_some(&mut self) {
        self.tick();
    }
    /// Sends one request from each client of `who`, its payload written by `fill(k, buf)`.
    fn send(
        &mut self,
        who: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> Result<(), String>;
    /// Hands every answer waiting now to `on_reply`.
    fn recv(&mut self, on_reply: &mut dyn FnMut(&[u8])) -> Result<(), String>;
    /// (answers from a wrong source, datagrams rejected) so far.
    fn faults(&self) -> (u64, u64);
    /// A cell begins: forget what the last one asked.
    fn start_cell(&mut self) {}
    /// Whose CPU per request the cell reports: the server's, or the plain echo's.
    fn meter(&self) -> Option<Meter> {
        None
    }
}

/// The server role's load: the generator's clients through the tunnel.
pub(super) struct Tunnelled<'a> {
    pub(super) set: &'a mut ClientSet,
    pub(super) spec: &'a ClientSpec,
    /// The server process.
    pub(super) server: Meter,
}

impl Load for Tunnelled<'_> {
    fn fd(&self) -> std::os::fd::RawFd {
        self.set.socket_fd()
    }
    fn tick(&mut self) -> usize {
        self.set.step(mt6d::daemon::clock::now())
    }
    fn tick_some(&mut self) {
        let until = Instant::now() + GENERATOR_BUDGET;
        let now = mt6d::daemon::clock::now();
        while self.set.step_at_most(now, GENERATOR_STEP) && Instant::now() < until {}
    }
    fn send(
        &mut self,
        who: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> Result<(), String> {
        self.set
            .send_batch(self.spec, who, ECHO_PORT, fill)
            .map(|_| ())
    }
    fn recv(&mut self, on_reply: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        self.set.recv_with(|_, p| on_reply(p))
    }
    fn faults(&self) -> (u64, u64) {
        (self.set.counters.wrong_route, self.set.counters.rejected)
    }
    fn meter(&self) -> Option<Meter> {
        Some(self.server)
    }
}

/// Fig. 2's cells of one run, rate by rate, until one fails; each reported on a line that
/// starts with `label(rate)`.
pub(super) fn cells_until_fail(
    load: &mut dyn Load,
    n: usize,
    args: &ServerArgs,
    rng: &mut Rng,
    label: impl Fn(u64) -> String,
) -> Result<Vec<Value>, String> {
    let mut cells = Vec::new();
    for &rate in &args.rates {
        load.start_cell();
        let c = cell(load, n, rate, args.cell, rng)?;
        eprintln!(
            "{}: answered {:.1} %, mean {:.3} ms, p99 {:.3} ms, class {}",
            label(rate),
            c.get("answered_percent")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            c.get("mean_ms").and_then(Value::as_f64).unwrap_or(f64::NAN),
            c.get("p99_ms").and_then(Value::as_f64).unwrap_or(f64::NAN),
            c.get("class").and_then(Value::as_str).unwrap_or("?"),
        );
        let failed = c.get("class").and_then(Value::as_str) == Some("fail");
        cells.push(c);
        if failed {
            break;
        }
    }
    Ok(cells)
}

/// One cell's requests by sequence number: when each left, whether it was answered, and the
/// round trips of those answered, from the cell's `start`.
struct Timings {
    start: Instant,
    sent_at: Vec<u64>,
    answered: Vec<bool>,
    rtt_us: Vec<f32>,
}

impl Timings {
    fn new(count: usize) -> Timings {
        Timings {
            sent_at: vec![0u64; count],
            answered: vec![false; count],
            rtt_us: Vec::with_capacity(count),
            start: Instant::now(),
        }
    }

    /// An answer: the first of the right length to a request sent counts.
    fn on_reply(&mut self, payload: &[u8]) {
        let Some(s) = payload.get(..8) else { return };
        let s = u64::from_le_bytes(s.try_into().unwrap_or([0; 8])) as usize;
        if s < self.answered.len() && !self.answered[s] && payload.len() == REQUEST * FACTOR {
            self.answered[s] = true;
            let now = self.start.elapsed().as_nanos() as u64;
            self.rtt_us
                .push(now.saturating_sub(self.sent_at[s]) as f32 / 1e3);
        }
    }
}

/// One Fig. 2 cell: `count` requests at `rate` per second, each from a random client.
pub(super) fn cell(
    load: &mut dyn Load,
    n: usize,
    rate: u64,
    count: usize,
    rng: &mut Rng,
) -> Result<Value, String> {
    let epoll = Epoll::new().map_err(|e| e.to_string())?;
    epoll.add(load.fd(), 0).map_err(|e| e.to_string())?;
    let mut events = EpollEvents::with_capacity(4);
    let before = load.faults();
    let interval_ns = 1e9 / rate as f64;
    let mut seq = 0usize;
    let mut who = Vec::with_capacity(32);
    // The windows are brought up to date first: the set may have sat idle for an epoch or more
    // (at a million clients that is seconds of work). The cell's clock starts after it: started
    // before, the sender would find itself seconds behind and send that backlog at once.
    // Rotating takes long enough at a million clients that more boundaries pass meanwhile:
    // again until a round finds less than a few milliseconds' worth.
    while load.tick() > CAUGHT_UP {}
    // From the first request to the end of the linger: what answering them cost (the
    // server's rotation meanwhile included, as it would be under any load).
    let meter = load.meter();
    let cpu_before = meter.map(|m| m.sample());
    let mut t = Timings::new(count);
    while seq < count {
        let now_ns = t.start.elapsed().as_nanos() as f64;
        let due = ((now_ns / interval_ns) as usize + 1).min(count);
        if due > seq {
            let k = (due - seq).min(32);
            who.clear();
            for _ in 0..k {
                who.push(rng.below(n));
            }
            send_from(load, &who, seq, &mut t)?;
            seq += k;
        }
        load.recv(&mut |p| t.on_reply(p))?;
        load.tick_some();
        // Sleep until the next request is due or an answer arrives.
        let next_due = (seq as f64 * interval_ns - t.start.elapsed().as_nanos() as f64).max(0.0);
        if next_due > 50_000.0 {
            let _ = epoll.wait(
                &mut events,
                Some(Duration::from_nanos(next_due as u64).min(Duration::from_millis(1))),
            );
        }
    }
    let send_secs = t.start.elapsed().as_secs_f64();
    let linger = Instant::now();
    while linger.elapsed() < Duration::from_secs(1) && t.rtt_us.len() < count {
        load.recv(&mut |p| t.on_reply(p))?;
        let _ = epoll.wait(&mut events, Some(Duration::from_millis(5)));
    }
    let after = load.faults();
    let cpu = meter.zip(cpu_before).map(|(m, a)| m.split(&a, &m.sample()));
    let mut v = summary(
        t.rtt_us,
        count,
        rate,
        send_secs,
        (after.0 - before.0, after.1 - before.1),
    );
    if let Some(cpu) = cpu {
        // Per request answered: a request lost before the server cost it nothing.
        let answered = v.get("answered").and_then(Value::as_u64).unwrap_or(0);
        v.set("cpu", cpu.json(answered, "request"));
    }
    Ok(v)
}

/// Requests `base..base + who.len()`, one from each client of `who`, their times noted.
fn send_from(
    load: &mut dyn Load,
    who: &[usize],
    base: usize,
    t: &mut Timings,
) -> Result<(), String> {
    let at = t.start.elapsed().as_nanos() as u64;
    load.send(who, &mut |j, buf| {
        buf[..8].copy_from_slice(&((base + j) as u64).to_le_bytes());
        buf[8..REQUEST].fill(0x5a);
        REQUEST
    })?;
    for s in t.sent_at.iter_mut().skip(base).take(who.len()) {
        *s = at;
    }
    Ok(())
}

/// A cell's figures from its round trips (microseconds, any order) and its faults (answers
/// from a wrong source, datagrams rejected).
fn summary(
    mut rtt_us: Vec<f32>,
    count: usize,
    rate: u64,
    send_secs: f64,
    faults: (u64, u64),
) -> Value {
    let got = rtt_us.len();
    rtt_us.sort_by(f32::total_cmp);
    let pct = |q: f64| {
        rtt_us
            .get(((got as f64 - 1.0) * q).round() as usize)
            .map_or(f64::NAN, |v| f64::from(*v) / 1e3)
    };
    let mean = if got > 0 {
        rtt_us.iter().map(|v| f64::from(*v)).sum::<f64>() / got as f64 / 1e3
    } else {
        f64::NAN
    };
    let answered_share = got as f64 * 100.0 / count as f64;
    let mut v = Value::obj();
    v.set("rate", rate)
        .set("achieved_rate", count as f64 / send_secs)
        .set("requests", count as u64)
        .set("answered", got as u64)
        .set("answered_percent", answered_share)
        .set("mean_ms", mean)
        .set("p50_ms", pct(0.5))
        .set("p99_ms", pct(0.99))
        .set("max_ms", pct(1.0))
        .set("wrong_source", faults.0)
        .set("rejected", faults.1)
        .set("class", class(answered_share, mean));
    v
}

/// 002's classes by mean response time (ms); a cell below 90 % answered fails.
fn class(answered_percent: f64, mean_ms: f64) -> &'static str {
    if answered_percent < 90.0 {
        "fail"
    } else if mean_ms < 1.0 {
        "<1ms"
    } else if mean_ms < 5.0 {
        "<5ms"
    } else if mean_ms < 50.0 {
        "<50ms"
    } else if mean_ms < 100.0 {
        "<100ms"
    } else {
        ">=100ms"
    }
}
