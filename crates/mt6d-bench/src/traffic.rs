//! The traffic of 000 Table 4.1 with real tools, from Host A to Host B: our own ICMPv6 pinger
//! (train and `ping -f` flood, recording which echoes were lost and when), HTTP downloads from
//! nginx with curl, iperf3 UDP jitter and TCP throughput.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use mt6d_lab::ping::{Pace as LabPace, PingReport};
use mt6d_lab::topology::HOST_B;
use mt6d_os::Netns;

use crate::json::{Value, ValueExt};
use crate::procs::Guarded;

/// `ping -f`: the next echo goes when the last one is answered, or after 10 ms (000 §4.2.1:
/// "as fast as they come back, or 100 times per second, whichever is greater").
const FLOOD_GAP: Duration = Duration::from_millis(10);

/// How echoes are paced.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    Train(Duration),
    Flood,
}

/// Sends `count` 64-byte echo requests to `dst` with the lab's pinger (run inside Host A's
/// namespace); the bench and `mt6d demo` measure with the same code.
pub fn ping(dst: Ipv6Addr, count: u64, pace: Pace, linger: Duration) -> Result<PingReport, String> {
    let pace = match pace {
        Pace::Train(interval) => LabPace::Train { interval },
        Pace::Flood => LabPace::Flood { wait: FLOOD_GAP },
    };
    mt6d_lab::ping::ping(dst, count, pace, linger).map_err(|e| e.to_string())
}

/// An echo slower than this is a stall (the goal: mt6d's worst echo at most 10 ms).
pub const SLOW_MS: f64 = 10.0;
/// Slow echoes listed one by one in results.json; the count covers them all.
const SLOW_LISTED: usize = 20;

/// JSON with min/avg/max/p50/p99 latency, loss and, given MT6D's rotation schedule (a boundary
/// at unix time `b0`, period `p`), how many of the lost echoes were sent within 50 ms before
/// to 250 ms after a rotation (001 §4: loss at rotations), and every echo slower than
/// [`SLOW_MS`] with where in its epoch it was sent.
pub fn ping_json(r: &PingReport, schedule: Option<(f64, f64)>) -> Value {
    let mut v = Value::obj();
    let mut s = r.rtts_ms.clone();
    s.sort_by(f64::total_cmp);
    let pick = |q: f64| {
        s.get(((s.len() as f64 - 1.0) * q).round() as usize)
            .copied()
    };
    let avg = (!s.is_empty()).then(|| s.iter().sum::<f64>() / s.len() as f64);
    let lost = r.sent - r.received;
    v.set("sent", r.sent)
        .set("received", r.received)
        .set("lost", lost)
        .set(
            "loss_percent",
            if r.sent > 0 {
                lost as f64 * 100.0 / r.sent as f64
            } else {
                0.0
            },
        )
        .set("rtt_min_ms", s.first().copied())
        .set("rtt_avg_ms", avg)
        .set("rtt_max_ms", s.last().copied())
        .set("rtt_p50_ms", pick(0.5))
        .set("rtt_p99_ms", pick(0.99))
        .set("secs", r.secs);
    let slow: Vec<_> = r.echoes.iter().filter(|e| e.rtt_ms > SLOW_MS).collect();
    v.set("slow_echoes", slow.len());
    if !slow.is_empty() {
        // Each stall's sequence number, RTT and send time (and epoch phase): enough to find it
        // in a capture, and to tell a rotation stall (phase near 0) from one anywhere else.
        let listed: Vec<Value> = slow
            .iter()
            .take(SLOW_LISTED)
            .map(|e| {
                let mut o = Value::obj();
                o.set("seq", e.seq)
                    .set("rtt_ms", e.rtt_ms)
                    .set("sent_unix", e.sent_unix);
                if let Some((b0, p)) = schedule {
                    o.set("epoch_phase_s", (e.sent_unix - b0).rem_euclid(p));
                }
                o
            })
            .collect();
        v.set("slow_echo_list", Value::Array(listed));
    }
    if let Some(slow) = r.slowest {
        v.set("rtt_max_seq", slow.seq)
            .set("rtt_max_sent_unix", slow.sent_unix);
        if let Some((b0, p)) = schedule {
            // Where in its rotation epoch the slowest echo was sent: a stall tied to rotation
            // shows up near 0 (or p) in every run, an unrelated one anywhere.
            v.set("rtt_max_epoch_phase_s", (slow.sent_unix - b0).rem_euclid(p));
        }
    }
    if let Some((b0, p)) = schedule {
        let near = r
            .lost_at
            .iter()
            .filter(|t| {
                let phase = (**t - b0).rem_euclid(p);
                phase < 0.25 || phase > p - 0.05
            })
            .count();
        v.set("lost_at_rotation", near)
            .set("rotations_spanned", (r.secs / p).floor() as u64);
    }
    v
}

/// Runs `cmd` with a time limit; stdout goes through a file so a chatty child never blocks.
pub fn run_limited(mut cmd: Command, limit: Duration, scratch: &Path) -> Result<String, String> {
    let out = std::fs::File::create(scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
    let err = out.try_clone().map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .map_err(|e| e.to_string())?;
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Ok(Some(st)) = child.try_wait() {
            break Some(st);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = std::fs::read_to_string(scratch).unwrap_or_default();
    match status {
        Some(st) if st.success() => Ok(text),
        Some(st) => Err(format!(
            "exited with {st}: {}",
            text.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        )),
        None => Err(format!("no result within {limit:?}")),
    }
}

/// True once a TCP socket listens on `port` in the namespace this thread is in (thread-self:
/// /proc/net follows the main thread, which stays in our own namespace).
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/thread-self/net/tcp6", "/proc/thread-self/net/tcp"]
        .iter()
        .any(|f| {
            std::fs::read_to_string(f)
                .unwrap_or_default()
                .lines()
                .any(|l| {
                    l.split_whitespace()
                        .nth(1)
                        .is_some_and(|a| format!("{a} ").ends_with(&want))
                        && l.split_whitespace().nth(3) == Some("0A")
                })
        })
}

/// Waits until `port` listens in `ns`, or the server dies.
pub fn wait_listening(ns: &Netns, port: u16, server: &mut Guarded) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if ns.run(|| listening(port)).unwrap_or(false) {
            return Ok(());
        }
        if let Some(why) = server.exited() {
            return Err(why);
        }
        if Instant::now() > deadline {
            return Err(format!("{} did not listen on port {port}", server.label));
        }
        std::thread::sleep(Duration::from_millis(30));
    }
}

/// Random files for the downloads, made once per run (a fast xorshift stream: incompressible
/// for every peer alike; no peer compresses anyway).
pub fn make_files(www: &Path, sizes: &[(&str, u64)]) -> Result<(), String> {
    use std::io::Write as _;
    std::fs::create_dir_all(www).map_err(|e| format!("{}: {e}", www.display()))?;
    let seed = crate::peers::random_bytes(8)?;
    let mut x = u64::from_le_bytes(seed.try_into().unwrap_or([7; 8])) | 1;
    for (name, size) in sizes {
        let path = www.join(name);
        if path.metadata().is_ok_and(|m| m.len() == *size) {
            continue;
        }
        let mut f = std::io::BufWriter::new(
            std::fs::File::create(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        );
        let mut left = *size;
        let mut block = vec![0u8; 1 << 16];
        while left > 0 {
            for chunk in block.chunks_mut(8) {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
            }
            let n = usize::try_from(left.min(block.len() as u64)).unwrap_or(block.len());
            f.write_all(&block[..n]).map_err(|e| e.to_string())?;
            left -= n as u64;
        }
        f.flush().map_err(|e| e.to_string())?;
    }
    Ok(())
}

/// nginx serving `www` on Host B's true address, port 80.
pub fn start_nginx(host_b: &Netns, www: &Path, dir: &Path) -> Result<Guarded, String> {
    let nginx = crate::procs::find_tool("nginx")
        .ok_or("nginx not found (run scripts/install-bench-deps.sh)")?;
    let conf = dir.join("nginx.conf");
    let text = format!(
        "user root;\nworker_processes 1;\ndaemon off;\npid {pid};\nerror_log {err} warn;\n\
events {{ worker_connections 64; }}\n\
http {{\n  access_log off;\n  sendfile on;\n  tcp_nopush on;\n  default_type application/octet-stream;\n  \
client_body_temp_path {tmp};\n  \
server {{\n    listen [{HOST_B}]:80;\n    root {www};\n  }}\n}}\n",
        pid = dir.join("nginx.pid").display(),
        err = dir.join("nginx-error.log").display(),
        tmp = dir.join("nginx-tmp").display(),
        www = www.display(),
    );
    std::fs::write(&conf, text).map_err(|e| format!("{}: {e}", conf.display()))?;
    let mut cmd = host_b.command(nginx).map_err(|e| e.to_string())?;
    cmd.arg("-c").arg(&conf).arg("-p").arg(dir);
    let mut g = Guarded::spawn("nginx", cmd, Some(&dir.join("nginx.out")))?;
    wait_listening(host_b, 80, &mut g)?;
    Ok(g)
}

pub fn start_iperf(host_b: &Netns, dir: &Path) -> Result<Guarded, String> {
    let iperf = crate::procs::find_tool("iperf3")
        .ok_or("iperf3 not found (run scripts/install-bench-deps.sh)")?;
    let mut cmd = host_b.command(iperf).map_err(|e| e.to_string())?;
    cmd.args(["-s", "-B", &HOST_B.to_string(), "-p", "5201"]);
    let mut g = Guarded::spawn("iperf3 server", cmd, Some(&dir.join("iperf3-server.log")))?;
    wait_listening(host_b, 5201, &mut g)?;
    Ok(g)
}

/// One curl download from Host A (000 §4.2.2 used wget; curl reports the same average speed).
pub fn download(host_a: &Netns, name: &str, bytes: u64, scratch: &Path) -> Result<Value, String> {
    let mut cmd = host_a.command("curl").map_err(|e| e.to_string())?;
    cmd.args([
        "-g",
        "-s",
        "-S",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code} %{size_download} %{time_total}",
    ])
    .arg(format!("http://[{HOST_B}]/{name}"));
    // At least 8 MB/s, or fail: a stalled transfer must not stall the whole run.
    let limit = Duration::from_secs(20 + bytes / 8_000_000);
    let out = run_limited(cmd, limit, scratch)?;
    let f: Vec<&str> = out.split_whitespace().collect();
    let code = f.first().copied().unwrap_or("?");
    let size: u64 = f.get(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let secs: f64 = f.get(2).and_then(|s| s.parse().ok()).unwrap_or(0.0);
    if code != "200" || size != bytes || secs <= 0.0 {
        return Err(format!("curl: HTTP {code}, {size} of {bytes} bytes"));
    }
    let mut v = Value::obj();
    v.set("bytes", bytes)
        .set("secs", secs)
        .set("mbyte_per_s", bytes as f64 / secs / 1e6)
        .set("mbit_per_s", bytes as f64 * 8.0 / secs / 1e6);
    Ok(v)
}

/// Times an iperf3 client is started again when the server answers that it is busy.
const IPERF_BUSY_TRIES: u32 = 5;

/// Runs the iperf3 client that `command` makes, within `limit`, and returns its JSON report.
/// The server takes one test at a time and may still be closing the previous one (its streams'
/// last segments, the results exchange) when the next client connects: it then refuses with
/// "the server is busy running a test", a state of the server, not a result. Such a refusal is
/// tried again after a second, at most [`IPERF_BUSY_TRIES`] times in all; any other error is
/// returned at once.
fn iperf_json(
    command: impl Fn() -> Result<std::process::Command, String>,
    limit: Duration,
    scratch: &Path,
) -> Result<Value, String> {
    let mut tries = 0;
    loop {
        tries += 1;
        // A refusal exits non-zero with the error in the JSON on stdout: both paths see it.
        let error = match run_limited(command()?, limit, scratch) {
            Ok(out) => {
                let j = Value::parse(&out).map_err(|e| format!("iperf3 JSON: {e}"))?;
                match j.get("error").and_then(Value::as_str) {
                    Some(e) => format!("iperf3: {e}"),
                    None => return Ok(j),
                }
            }
            Err(e) => e,
        };
        if !(error.contains("server is busy") && tries < IPERF_BUSY_TRIES) {
            return Err(format!("{error} (attempt {tries})"));
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// iperf3 UDP from Host B to Host A (-R, as 000 §4.2.3): jitter and loss.
pub fn udp(host_a: &Netns, bytes: u64, rate_mbit: u64, scratch: &Path) -> Result<Value, String> {
    let secs = bytes as f64 * 8.0 / (rate_mbit as f64 * 1e6);
    let command = || -> Result<std::process::Command, String> {
        let mut cmd = host_a.command("iperf3").map_err(|e| e.to_string())?;
        // 1200-byte datagrams fit every scenario's inner MTU, so none is fragmented.
        cmd.args([
            "-c",
            &HOST_B.to_string(),
            "-p",
            "5201",
            "-J",
            "-u",
            "-R",
            "-l",
            "1200",
        ])
        .args(["-b", &format!("{rate_mbit}M"), "-n", &bytes.to_string()]);
        Ok(cmd)
    };
    let j = iperf_json(command, Duration::from_secs_f64(15.0 + secs * 2.0), scratch)?;
    let sum = j
        .path(&["end", "sum"])
        .ok_or("iperf3 JSON without end.sum")?;
    let num = |k: &str| sum.get(k).and_then(Value::as_f64);
    let mut v = Value::obj();
    v.set("bytes", bytes)
        .set("rate_mbit", rate_mbit)
        .set("jitter_ms", num("jitter_ms"))
        .set("lost_packets", num("lost_packets"))
        .set("packets", num("packets"))
        .set("loss_percent", num("lost_percent"));
    Ok(v)
}

/// iperf3 TCP from Host A to Host B: maximum throughput with `streams` parallel streams.
pub fn tcp(host_a: &Netns, streams: u32, secs: u64, scratch: &Path) -> Result<Value, String> {
    let command = || -> Result<std::process::Command, String> {
        let mut cmd = host_a.command("iperf3").map_err(|e| e.to_string())?;
        cmd.args([
            "-c",
            &HOST_B.to_string(),
            "-p",
            "5201",
            "-J",
            "-t",
            &secs.to_string(),
            "-P",
            &streams.to_string(),
        ]);
        Ok(cmd)
    };
    let j = iperf_json(command, Duration::from_secs(secs + 20), scratch)?;
    let bps = j
        .path(&["end", "sum_received", "bits_per_second"])
        .and_then(Value::as_f64)
        .ok_or("iperf3 JSON without end.sum_received")?;
    let mut v = Value::obj();
    v.set("streams", u64::from(streams))
        .set("secs", secs)
        .set("mbit_per_s", bps / 1e6)
        .set(
            "retransmits",
            j.path(&["end", "sum_sent", "retransmits"])
                .and_then(Value::as_f64),
        );
    Ok(v)
}

/// The file that every small flow fetches (made with the downloads).
pub const SMALL_FLOW_FILE: (&str, u64) = ("flow_1k", 1000);

/// Many small flows: ApacheBench from Host A fetches [`SMALL_FLOW_FILE`]
/// from Host B's nginx `requests` times, `concurrency` at once, each request on a TCP
/// connection of its own (no keep-alive), so every request is a new flow with its own source
/// port: the kernel spreads them over the TUN queues, hence over the workers. Flows per second,
/// failures, and the time to complete one (connect, request, 1 kB answer, close; ms, p50 and
/// p99 as ab reports them).
pub fn small_flows(
    host_a: &Netns,
    requests: u64,
    concurrency: u64,
    scratch: &Path,
) -> Result<Value, String> {
    let mut cmd = host_a.command("ab").map_err(|e| e.to_string())?;
    // -r: a reset connection is counted as failed instead of ending the run; -s: per-request
    // timeout (s). ab speaks HTTP/1.0 without -k: one connection per request.
    cmd.args(["-r", "-s", "10", "-q"])
        .args(["-n", &requests.to_string(), "-c", &concurrency.to_string()])
        .arg(format!("http://[{HOST_B}]/{}", SMALL_FLOW_FILE.0));
    // At least 100 flows/s, or fail: a stalled run must not stall the whole bench.
    let out = run_limited(cmd, Duration::from_secs(20 + requests / 100), scratch)?;
    parse_ab(&out, requests)
}

/// The figures of one ab run: flows/s, failed and non-2xx answers, and the time per flow.
fn parse_ab(out: &str, requests: u64) -> Result<Value, String> {
    let field = |key: &str| {
        out.lines()
            .find_map(|l| l.trim_start().strip_prefix(key))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|x| x.parse::<f64>().ok())
    };
    let percentile = |pct: &str| {
        out.lines().find_map(|l| {
            let mut f = l.split_whitespace();
            (f.next() == Some(pct))
                .then(|| f.next().and_then(|x| x.parse::<f64>().ok()))
                .flatten()
        })
    };
    let complete = field("Complete requests:").ok_or_else(|| {
        format!(
            "ab gave no result: {}",
            out.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        )
    })?;
    let per_sec = field("Requests per second:").ok_or("ab gave no requests per second")?;
    let failed = field("Failed requests:").unwrap_or(0.0);
    let non_2xx = field("Non-2xx responses:").unwrap_or(0.0);
    let mut v = Value::obj();
    v.set("requests", requests)
        .set("complete", complete)
        .set("failed", failed + non_2xx)
        .set("flows_per_s", per_sec)
        .set("flow_ms_p50", percentile("50%"))
        .set("flow_ms_p99", percentile("99%"))
        .set("flow_ms_max", percentile("100%"));
    Ok(v)
}

/// A scratch file for one tool run.
pub fn scratch(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.out"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of ApacheBench 2.3's report that the bench reads (a real run's, shortened).
    const AB: &str = "Concurrency Level:      32
Time taken for tests:   2.105 seconds
Complete requests:      2000
Failed requests:        3
   (Connect: 0, Receive: 0, Length: 3, Exceptions: 0)
Non-2xx responses:      1
Requests per second:    950.12 [#/sec] (mean)
Time per request:       33.680 [ms] (mean)

Percentage of the requests served within a certain time (ms)
  50%     31
  66%     33
  99%     58
 100%     75 (longest request)
";

    #[test]
    fn an_ab_report_gives_flows_per_second_failures_and_percentiles() {
        let v = parse_ab(AB, 2000).expect("a complete report");
        assert_eq!(v.get("complete").and_then(Value::as_f64), Some(2000.0));
        assert_eq!(v.get("failed").and_then(Value::as_f64), Some(4.0));
        assert_eq!(v.get("flows_per_s").and_then(Value::as_f64), Some(950.12));
        assert_eq!(v.get("flow_ms_p50").and_then(Value::as_f64), Some(31.0));
        assert_eq!(v.get("flow_ms_p99").and_then(Value::as_f64), Some(58.0));
        assert_eq!(v.get("flow_ms_max").and_then(Value::as_f64), Some(75.0));
    }

    #[test]
    fn an_ab_run_that_printed_no_report_is_an_error() {
        let e = parse_ab("apr_socket_connect(): Connection refused (111)\n", 10)
            .expect_err("no report");
        assert!(e.contains("Connection refused"), "{e}");
    }

    /// A client refused because the server is still busy with the previous test is started
    /// again and its report returned; any other error ends at once.
    #[test]
    fn a_busy_iperf3_server_is_tried_again_and_other_errors_are_not() {
        let dir = std::env::temp_dir().join(format!("mt6d-iperf-busy-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let marker = dir.join("refused-once");
        let scratch = dir.join("out");
        // Refuses the first time as iperf3 does (JSON error on stdout, exit 1), then reports.
        let script = format!(
            "if [ -e '{m}' ]; then echo '{{\"end\": {{}}}}'; else touch '{m}'; \
echo '{{\"error\": \"the server is busy running a test. try again later\"}}'; exit 1; fi",
            m = marker.display()
        );
        let command = || {
            let mut c = std::process::Command::new("sh");
            c.args(["-c", &script]);
            Ok(c)
        };
        let j = iperf_json(command, Duration::from_secs(10), &scratch).expect("second try");
        assert!(j.get("end").is_some());
        let other = || {
            let mut c = std::process::Command::new("sh");
            c.args([
                "-c",
                "echo '{\"error\": \"unable to connect to server\"}'; exit 1",
            ]);
            Ok(c)
        };
        let e = iperf_json(other, Duration::from_secs(10), &scratch).expect_err("refused");
        assert!(
            e.contains("unable to connect") && e.contains("attempt 1"),
            "{e}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
