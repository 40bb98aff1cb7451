//! ICMPv6 echo, as the demo's protected host sends it: a paced train (like `ping -i`) and a flood
//! (like `ping -f`: the next request goes out as soon as the previous reply is back, or after
//! 10 ms). Our own implementation, so the demo needs no `ping` binary and reports exact RTTs.
//!
//! Must be called on a thread that is inside the sending host's network namespace.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mt6d_os::Icmp6Socket;

const ECHO_REQUEST: u8 = 128;
const ECHO_REPLY: u8 = 129;

/// What one run of pings measured.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct PingReport {
    pub sent: u64,
    pub received: u64,
    /// Round-trip times of the answered requests, in milliseconds.
    #[serde(skip)]
    pub rtts_ms: Vec<f64>,
    /// Unix time (s) at which each unanswered request was sent: lets the bench tell loss at a
    /// rotation from loss elsewhere (001 §4).
    #[serde(skip)]
    pub lost_at: Vec<f64>,
    /// How long the run took, linger included.
    pub secs: f64,
    /// The answered request with the longest round trip: lets a report say *when* a stall
    /// happened (e.g. where in the rotation epoch), not only that one did.
    #[serde(skip)]
    pub slowest: Option<Slowest>,
    /// Every answered request in the order the replies came back: where in the rotation epoch
    /// each slow one was sent, and a percentile over the run.
    #[serde(skip)]
    pub echoes: Vec<Slowest>,
}

/// One answered echo request: its sequence number, the Unix time (s) it was sent and its RTT.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Slowest {
    pub seq: u64,
    pub sent_unix: f64,
    pub rtt_ms: f64,
}

impl PingReport {
    pub fn lost(&self) -> u64 {
        self.sent - self.received
    }

    /// (min, median, max) in milliseconds; zeros when nothing came back.
    pub fn rtt_summary(&self) -> (f64, f64, f64) {
        if self.rtts_ms.is_empty() {
            return (0.0, 0.0, 0.0);
        }
        let mut v = self.rtts_ms.clone();
        v.sort_by(|a, b| a.total_cmp(b));
        (v[0], v[v.len() / 2], v[v.len() - 1])
    }
}

/// How to pace the requests.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// One request per interval.
    Train { interval: Duration },
    /// As fast as replies come back, never more than `wait` apart.
    Flood { wait: Duration },
    /// Requests at random moments, `mean` apart on average (exponential gaps: a Poisson
    /// process), from a seeded generator so that a run can be repeated. Sent on time (see
    /// [`Pace::Timer`]).
    Poisson { mean: Duration, seed: u64 },
    /// One request per interval, each sent on time to the microsecond, as an application's
    /// timer sends: the wait before a request ends in a sleep, not in the socket's receive
    /// timeout, which the kernel rounds to its tick (4 ms at 250 Hz) and which would move
    /// every train onto one grid. For traffic-analysis labs; replies that arrive in the last
    /// [`ON_TIME`] before a request are read after it.
    Timer { interval: Duration },
}

/// How long before a request [`Pace::Timer`] and [`Pace::Poisson`] stop reading replies and
/// sleep: more than one kernel tick.
pub const ON_TIME: Duration = Duration::from_millis(5);

/// The exponential gaps of a Poisson process with this mean.
pub fn poisson_gaps(mean: Duration, seed: u64) -> impl Iterator<Item = Duration> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    std::iter::repeat_with(move || {
        let u: f64 = rng.random_range(f64::EPSILON..1.0);
        mean.mul_f64(-u.ln())
    })
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Sends `count` (at most 65,536: one sequence space) 64-byte echo requests to `dst` and waits
/// up to `linger` after the last for late replies.
pub fn ping(
    dst: Ipv6Addr,
    count: u64,
    pace: Pace,
    linger: Duration,
) -> std::io::Result<PingReport> {
    let io = |e: mt6d_os::OsError| std::io::Error::other(e.to_string());
    let sock = Icmp6Socket::open().map_err(|e| match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => io(e),
    })?;
    sock.set_filter_pass_only(&[ECHO_REPLY]).map_err(io)?;
    // The identifier tells our replies from those of another pinger in the same namespace.
    let ident = (std::process::id() as u16) ^ 0x6d6d;
    let n = usize::try_from(count).unwrap_or(usize::MAX).min(65_536);
    // Per sequence number: (monotonic send time, unix send time); taken when answered.
    let mut outstanding: Vec<Option<(Instant, f64)>> = vec![None; n];
    let mut report = PingReport::default();
    let mut buf = [0u8; 2048];
    let start = Instant::now();
    let mut gaps = match pace {
        Pace::Poisson { mean, seed } => Some(poisson_gaps(mean, seed)),
        _ => None,
    };
    let mut next_at = start;
    for seq in 0..n {
        let mut req = [0u8; 64];
        req[0] = ECHO_REQUEST;
        // The kernel fills in the ICMPv6 checksum on raw ICMPv6 sockets (RFC 3542 §3.1).
        req[4..6].copy_from_slice(&ident.to_be_bytes());
        req[6..8].copy_from_slice(&(seq as u16).to_be_bytes());
        let sent_at = Instant::now();
        outstanding[seq] = Some((sent_at, unix_now()));
        sock.send_to(&req, dst, None).map_err(io)?;
        report.sent += 1;
        let (deadline, stop_on) = match pace {
            Pace::Train { interval } | Pace::Timer { interval } => {
                (start + interval * (seq as u32 + 1), None)
            }
            // In flood mode, move on as soon as this request is answered.
            Pace::Flood { wait } => (sent_at + wait, Some(seq)),
            Pace::Poisson { .. } => {
                next_at += gaps.as_mut().and_then(Iterator::next).unwrap_or_default();
                (next_at, None)
            }
        };
        let on_time = matches!(pace, Pace::Timer { .. } | Pace::Poisson { .. });
        let read_until = if on_time {
            deadline.checked_sub(ON_TIME).unwrap_or(deadline)
        } else {
            deadline
        };
        receive_until(
            &sock,
            ident,
            read_until,
            stop_on,
            &mut outstanding,
            &mut report,
            &mut buf,
        );
        if on_time {
            // nanosleep is a high-resolution timer: the next request leaves on time.
            std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
        }
    }
    let deadline = Instant::now() + linger;
    while outstanding.iter().any(Option::is_some) && Instant::now() < deadline {
        receive_until(
            &sock,
            ident,
            deadline,
            None,
            &mut outstanding,
            &mut report,
            &mut buf,
        );
    }
    report.lost_at = outstanding.iter().flatten().map(|(_, t)| *t).collect();
    report.secs = start.elapsed().as_secs_f64();
    Ok(report)
}

fn receive_until(
    sock: &Icmp6Socket,
    ident: u16,
    deadline: Instant,
    stop_on: Option<usize>,
    outstanding: &mut [Option<(Instant, f64)>],
    report: &mut PingReport,
    buf: &mut [u8],
) {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return;
        }
        let _ = sock.set_read_timeout(Some((deadline - now).max(Duration::from_micros(50))));
        // A timeout and a real error both end this wait; the deadline bounds the loop.
        let Ok(info) = sock.recv_from(buf) else {
            return;
        };
        let m = &buf[..info.len.min(buf.len())];
        if m.len() < 8 || m[0] != ECHO_REPLY || u16::from_be_bytes([m[4], m[5]]) != ident {
            continue;
        }
        let seq = usize::from(u16::from_be_bytes([m[6], m[7]]));
        if let Some((sent_at, sent_unix)) = outstanding.get_mut(seq).and_then(Option::take) {
            let rtt_ms = sent_at.elapsed().as_secs_f64() * 1000.0;
            report.received += 1;
            report.rtts_ms.push(rtt_ms);
            report.echoes.push(Slowest {
                seq: seq as u64,
                sent_unix,
                rtt_ms,
            });
            if report.slowest.is_none_or(|s| rtt_ms > s.rtt_ms) {
                report.slowest = Some(Slowest {
                    seq: seq as u64,
                    sent_unix,
                    rtt_ms,
                });
            }
            if stop_on == Some(seq) {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_of_nothing_is_zero_and_of_values_is_ordered() {
        let mut r = PingReport::default();
        assert_eq!(r.rtt_summary(), (0.0, 0.0, 0.0));
        r.sent = 4;
        r.received = 3;
        r.rtts_ms = vec![0.3, 0.1, 0.2];
        r.lost_at = vec![1.0];
        assert_eq!(r.rtt_summary(), (0.1, 0.2, 0.3));
        assert_eq!(r.lost(), 1);
    }

    /// Loopback needs no namespace and no route: a real kernel answers our echo requests.
    #[test]
    #[ignore = "needs root (raw sockets): run as root with --include-ignored, as scripts/test.sh does"]
    fn loopback_answers_every_echo() {
        match ping(
            Ipv6Addr::LOCALHOST,
            20,
            Pace::Flood {
                wait: Duration::from_millis(100),
            },
            Duration::from_millis(200),
        ) {
            Ok(r) => {
                assert_eq!(r.sent, 20);
                assert_eq!(r.received, 20, "{r:?}");
                let slowest = r.slowest.expect("answered echoes have a slowest");
                assert_eq!(slowest.rtt_ms, r.rtt_summary().2);
                assert!(slowest.seq < 20 && slowest.sent_unix > 0.0, "{slowest:?}");
            }
            Err(e) => panic!("ping ::1: {e}"),
        }
    }
}
