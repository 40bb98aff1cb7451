//! ICMPv6 echo, as the demo's protected host sends it: a paced train (like `ping -i`) and a flood
//! (like `ping -f`: the next request goes out as soon as the previous reply is back, or after
//! 10 ms). Our own implementation, so the demo needs no `ping` binary and reports exact RTTs.
//!
//! Must be called on a thread that is inside the sending host's network namespace.

use std::collections::HashMap;
use std::io::ErrorKind;
use std::io::Read as _;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

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
}

/// Sends `count` echo requests to `dst` and waits up to `linger` after the last for late replies.
pub fn ping(
    dst: Ipv6Addr,
    count: u64,
    pace: Pace,
    linger: Duration,
) -> std::io::Result<PingReport> {
    let sock = Socket::new(Domain::IPV6, Type::RAW, Some(Protocol::ICMPV6))?;
    let to = SockAddr::from(SocketAddrV6::new(dst, 0, 0, 0));
    // The identifier tells our replies from those of another pinger in the same namespace.
    let ident = (std::process::id() as u16) ^ 0x6d6d;
    let mut report = PingReport::default();
    let mut outstanding: HashMap<u16, Instant> = HashMap::new();
    let mut buf = [0u8; 2048];
    let mut seq: u16 = 0;
    let start = Instant::now();

    for i in 0..count {
        let mut req = [0u8; 64];
        req[0] = ECHO_REQUEST;
        // The kernel fills in the ICMPv6 checksum on raw ICMPv6 sockets (RFC 3542 §3.1).
        req[4..6].copy_from_slice(&ident.to_be_bytes());
        req[6..8].copy_from_slice(&seq.to_be_bytes());
        req[8..16].copy_from_slice(&i.to_be_bytes());
        let sent_at = Instant::now();
        sock.send_to(&req, &to)?;
        report.sent += 1;
        outstanding.insert(seq, sent_at);
        let deadline = match pace {
            Pace::Train { interval } => start + interval * (i as u32 + 1),
            Pace::Flood { wait } => sent_at + wait,
        };
        // In flood mode, move on as soon as this request is answered.
        let stop_on = match pace {
            Pace::Flood { .. } => Some(seq),
            Pace::Train { .. } => None,
        };
        receive_until(
            &sock,
            ident,
            deadline,
            stop_on,
            &mut outstanding,
            &mut report,
            &mut buf,
        )?;
        seq = seq.wrapping_add(1);
    }
    let deadline = Instant::now() + linger;
    while !outstanding.is_empty() && Instant::now() < deadline {
        receive_until(
            &sock,
            ident,
            deadline,
            None,
            &mut outstanding,
            &mut report,
            &mut buf,
        )?;
    }
    Ok(report)
}

fn receive_until(
    sock: &Socket,
    ident: u16,
    deadline: Instant,
    stop_on: Option<u16>,
    outstanding: &mut HashMap<u16, Instant>,
    report: &mut PingReport,
    buf: &mut [u8; 2048],
) -> std::io::Result<()> {
    loop {
        let now = Instant::now();
        if now >= deadline {
            return Ok(());
        }
        sock.set_read_timeout(Some((deadline - now).max(Duration::from_micros(50))))?;
        let n = match (&*sock).read(buf) {
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return Ok(())
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let bytes = &buf[..n];
        if bytes.len() < 8 || bytes[0] != ECHO_REPLY {
            continue;
        }
        if u16::from_be_bytes([bytes[4], bytes[5]]) != ident {
            continue;
        }
        let seq = u16::from_be_bytes([bytes[6], bytes[7]]);
        if let Some(sent_at) = outstanding.remove(&seq) {
            report.received += 1;
            report
                .rtts_ms
                .push(sent_at.elapsed().as_secs_f64() * 1000.0);
            if stop_on == Some(seq) {
                return Ok(());
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
        assert_eq!(r.rtt_summary(), (0.1, 0.2, 0.3));
        assert_eq!(r.lost(), 1);
    }

    /// Loopback needs no namespace and no route: a real kernel answers our echo requests.
    #[test]
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
            }
            // Raw sockets need CAP_NET_RAW; CI runs as root, a developer may not.
            Err(e) if e.kind() == ErrorKind::PermissionDenied => eprintln!("skipped: {e}"),
            Err(e) => panic!("ping ::1: {e}"),
        }
    }
}
