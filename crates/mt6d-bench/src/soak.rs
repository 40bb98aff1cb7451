//! `mt6d bench --soak HOURS`: the long run 001 did with its prototype (a week, about 60,000
//! rotations), on the switched lab. Two gateways rotate every second and rekey every two
//! minutes while Host A keeps, for the whole run:
//!
//! * one long-lived TCP connection to Host B (paced at [`TCP_RATE`] bytes/s, every byte checked
//!   against a pattern at the receiver): a *session break* is a connection that fails;
//! * an RTP-like UDP stream, 50 packets/s of 172 bytes (a G.711 voice call: 160 bytes of payload
//!   every 20 ms plus a 12-byte header), with loss, reordering and the RFC 3550 §6.4.1
//!   interarrival jitter measured at Host B;
//! * a ping train at 5/s.
//!
//! Every sample interval it records both daemons' resident memory and open descriptors
//! (/proc/PID/status, /proc/PID/fd), their handshake and rotation counters, and the loss of each
//! stream in that window; optionally it restarts Gateway B (SIGTERM, start again) every N
//! minutes. It writes `samples.csv` and `report.md` into the output directory.
//!
//! So that a loss explains itself, the report places every lost RTP packet on the epoch clock
//! (ms after its epoch began and before the next, computed from Gateway A's config) and next to
//! the nearest handshake Gateway A completed, and lists every kernel drop counter (IPv6/UDP
//! discards and errors, interface drops) that rose in any namespace of the lab. Those counters
//! are also read every second: `kernel-timeline.csv` holds each rise with its Unix time, so a
//! drop is placed next to the gateways' logs.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddrV6, TcpListener, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{
    gateway_config_text, ConfigText, GatewaySettings, LabKeys, Side, Topology, HOST_A, HOST_B,
};
use mt6d_os::Netns;

use crate::procs::Guarded;

mod report;
use report::{losses_report, report};

/// Bytes per second of the long-lived TCP transfer: enough to notice a stall at once, little
/// enough that a 2-core machine spends its time on rotations, not on bulk data.
const TCP_RATE: u64 = 256 * 1024;
const TCP_PORT: u16 = 5101;
const RTP_PORT: u16 = 5104;
/// 12-byte RTP header + 160 bytes of G.711 payload.
const RTP_LEN: usize = 172;
const RTP_PERIOD: Duration = Duration::from_millis(20);
const PING_INTERVAL: Duration = Duration::from_millis(200);
/// Echoes per ping round (one minute at 5/s); rounds follow each other back to back.
const PING_ROUND: u64 = 300;
const ROTATION_SECS: f64 = 1.0;
const REKEY_SECS: f64 = 120.0;

/// Options of the soak.
#[derive(Debug, Clone)]
pub struct SoakArgs {
    pub hours: f64,
    pub sample_secs: u64,
    /// Restart Gateway B every this many minutes (none by default).
    pub restart_every_mins: Option<f64>,
    pub out: Option<PathBuf>,
}

/// Counters the traffic threads update and the sampler reads.
#[derive(Debug, Default)]
struct Meters {
    tcp_bytes: AtomicU64,
    tcp_breaks: AtomicU64,
    tcp_corrupt: AtomicU64,
    /// Longest time the TCP receiver waited for data, ms.
    tcp_longest_stall_ms: AtomicU64,
    rtp_sent: AtomicU64,
    rtp_received: AtomicU64,
    rtp_duplicates: AtomicU64,
    rtp_reordered: AtomicU64,
    /// RFC 3550 jitter estimate in microseconds (the running value, J).
    rtp_jitter_us: AtomicU64,
    rtp_max_jitter_us: AtomicU64,
    rtp_max_transit_us: AtomicU64,
    ping_sent: AtomicU64,
    ping_received: AtomicU64,
    /// RTP sequence numbers not received (yet), with their estimated send time (Unix µs):
    /// entered at a gap, removed if the packet arrives late. Touched only at gaps.
    rtp_missing: Mutex<BTreeMap<u64, u64>>,
}

/// One row of samples.csv.
#[derive(Debug, Clone, Default)]
struct Sample {
    elapsed_s: u64,
    rss_kb: [u64; 2],
    fds: [u64; 2],
    rotations: [u64; 2],
    handshakes: [u64; 2],
    rekeys: [u64; 2],
    tcp_bytes: u64,
    tcp_breaks: u64,
    rtp_sent: u64,
    rtp_lost: u64,
    rtp_jitter_ms: f64,
    ping_sent: u64,
    ping_lost: u64,
    restarts: u64,
}

fn proc_field_kb(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

fn unix_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The byte the pattern has at stream offset `i`: a receiver that sees anything else saw
/// corruption (a prime period, so it never lines up with segment sizes).
fn pattern(i: u64) -> u8 {
    (i % 251) as u8
}

struct Gateway {
    side: Side,
    ns_name: String,
    config: PathBuf,
    socket: PathBuf,
    log: PathBuf,
    starts: u32,
    process: Option<Guarded>,
}

impl Gateway {
    fn start(&mut self, mt6d: &Path) -> Result<(), String> {
        let ns = Netns::open(&self.ns_name).map_err(|e| e.to_string())?;
        let mut cmd = ns.command(mt6d).map_err(|e| e.to_string())?;
        cmd.arg("run").arg("-c").arg(&self.config).env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        );
        // Each start gets its own log, so a restart keeps the earlier one.
        let label = format!("mt6d gateway {:?}", self.side);
        let log = if self.starts == 0 {
            self.log.clone()
        } else {
            self.log.with_extension(format!("{}.log", self.starts))
        };
        self.starts += 1;
        self.process = Some(Guarded::spawn(&label, cmd, Some(&log))?);
        let deadline = Instant::now() + Duration::from_secs(15);
        while mt6d::control::query_status(&self.socket).is_err() {
            if Instant::now() > deadline {
                return Err(format!(
                    "{label} did not answer on {}",
                    self.socket.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    fn pid(&self) -> Option<u32> {
        self.process.as_ref().and_then(Guarded::pid)
    }
}

/// Runs the soak; returns the output directory.
pub fn run(args: &SoakArgs) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mt6d = exe.with_file_name("mt6d");
    let (date, _) = crate::utc::utc_now();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("soak-results/{date}")));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = std::env::temp_dir().join(format!("mt6d-soak-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let result = soak(args, &mt6d, &out, &work);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| out)
}

fn soak(args: &SoakArgs, mt6d: &Path, out: &Path, work: &Path) -> Result<(), String> {
    let net = crate::topo::build(Topology::Switched)?;
    let mut gateways = gateways(&net, out, work)?;
    for g in &mut gateways {
        g.start(mt6d)?;
    }
    wait_for_path(&net.host_a)?;
    eprintln!(
        "soak: lab up, gateways {:?}/{:?}; running {:.2} h",
        gateways[0].pid(),
        gateways[1].pid(),
        args.hours
    );

    let meters = Meters::default();
    let stop = AtomicBool::new(false);
    let tcp_listener = net
        .host_b
        .run(|| TcpListener::bind(SocketAddrV6::new(HOST_B, TCP_PORT, 0, 0)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("listen on [{HOST_B}]:{TCP_PORT}: {e}"))?;
    let rtp_socket = net
        .host_b
        .run(|| UdpSocket::bind(SocketAddrV6::new(HOST_B, RTP_PORT, 0, 0)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("bind [{HOST_B}]:{RTP_PORT}: {e}"))?;
    let lost_pings: Mutex<Vec<f64>> = Mutex::new(Vec::new());
    // Where lost packets went: the kernel's drop counters of every namespace, before and after.
    let kernel_before = kernel_drops(&net);
    let stream = mt6d::config::Config::load(&gateways[0].config)
        .map_err(|e| e.to_string())?
        .peers
        .first()
        .ok_or("the soak config has no peer")?
        .build_stream()
        .map_err(|e| e.to_string())?;
    let started = Instant::now();
    let mut watch = Watch::new(&kernel_before, started);

    std::thread::scope(|s| {
        s.spawn(|| tcp_receiver(&tcp_listener, &meters, &stop));
        s.spawn(|| {
            if net.host_a.enter_current_thread().is_ok() {
                tcp_sender(&meters, &stop);
            }
        });
        s.spawn(|| rtp_receiver(&rtp_socket, &meters, &stop));
        s.spawn(|| {
            if net.host_a.enter_current_thread().is_ok() {
                rtp_sender(&meters, &stop);
            }
        });
        s.spawn(|| {
            if net.host_a.enter_current_thread().is_ok() {
                ping_train(&meters, &stop, &lost_pings);
            }
        });
        watch.run(args, mt6d, out, &net, &mut gateways, &meters);
        stop.store(true, Ordering::Relaxed);
    });
    // Traffic threads have joined: the final counters include the lingering replies.
    let last = sample(&gateways, &meters, started, watch.restarts);
    watch.samples.push(last);
    let mut lost = lost_pings
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    lost.sort_by(f64::total_cmp);
    let kernel = kernel_drops(&net)
        .into_iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(kernel_before.get(&k).copied().unwrap_or(0));
            (d > 0).then_some((k, d))
        })
        .collect();
    let losses = attribute_losses(&meters, &stream, &watch.handshake_times);
    let mut report = report(
        args,
        &watch.samples,
        &meters,
        &lost,
        watch.failure.as_deref(),
    );
    report.push_str(&losses_report(&losses, &kernel));
    std::fs::write(out.join("kernel-timeline.csv"), &watch.kernel_timeline)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    std::fs::write(out.join("report.md"), &report)
        .map_err(|e| format!("{}: {e}", out.display()))?;
    println!("{report}");
    drop(gateways);
    for g in [net.gw_a.name(), net.gw_b.name()] {
        let _ = std::fs::remove_file(format!("/run/mt6d-bench/{g}.sock"));
    }
    match watch.failure {
        Some(f) => Err(f),
        None => Ok(()),
    }
}

/// The two gateways' keys and configuration files (not started); their logs go to `out`.
fn gateways(net: &crate::topo::Net, out: &Path, work: &Path) -> Result<Vec<Gateway>, String> {
    let keys_dir = work.join("keys");
    std::fs::create_dir(&keys_dir).map_err(|e| e.to_string())?;
    let keys = LabKeys::generate(&keys_dir, true, Some(REKEY_SECS)).map_err(|e| e.to_string())?;
    std::fs::create_dir_all("/run/mt6d-bench").map_err(|e| format!("/run/mt6d-bench: {e}"))?;
    let mut gateways = Vec::new();
    for (side, gw, local, remote, own, far) in [
        (
            Side::A,
            &net.gw_a,
            HOST_A,
            HOST_B,
            &net.public_a,
            &net.public_b,
        ),
        (
            Side::B,
            &net.gw_b,
            HOST_B,
            HOST_A,
            &net.public_b,
            &net.public_a,
        ),
    ] {
        let socket = PathBuf::from(format!("/run/mt6d-bench/{}.sock", gw.name()));
        let config = work.join(format!("gateway-{side:?}.toml"));
        let text = gateway_config_text(&ConfigText {
            comment: "mt6d soak",
            socket: &socket,
            settings: &GatewaySettings {
                rotation_secs: ROTATION_SECS,
                mode: "encrypt",
                keys: &keys,
                workers: None,
            },
            side,
            local,
            remote,
            own,
            far,
            host_mode: false,
        });
        std::fs::write(&config, text).map_err(|e| format!("{}: {e}", config.display()))?;
        gateways.push(Gateway {
            side,
            ns_name: gw.name().to_string(),
            config,
            socket,
            log: out.join(format!("gateway-{side:?}.log")),
            starts: 0,
            process: None,
        });
    }
    Ok(gateways)
}

/// The soak's watching loop and what it keeps: the samples, the restarts of Gateway B, the
/// first failure, when Gateway A handshook, and the kernel's drop counters second by second.
struct Watch {
    /// When the traffic started.
    started: Instant,
    samples: Vec<Sample>,
    restarts: u64,
    failure: Option<String>,
    /// When Gateway A's handshake count went up (Unix µs, within one 200 ms poll).
    handshake_times: Vec<u64>,
    handshakes_seen: u64,
    /// Every second, each kernel counter that rose since the last second, so a drop can be
    /// placed in time next to the gateways' logs (unix seconds, elapsed seconds, counter,
    /// rise).
    kernel_last: BTreeMap<String, u64>,
    kernel_timeline: String,
    next_kernel: Duration,
    csv: String,
}

impl Watch {
    fn new(kernel_before: &BTreeMap<String, u64>, started: Instant) -> Watch {
        Watch {
            started,
            samples: Vec::new(),
            restarts: 0,
            failure: None,
            handshake_times: Vec::new(),
            handshakes_seen: 0,
            kernel_last: kernel_before.clone(),
            kernel_timeline: String::from("unix_s,elapsed_s,counter,increase\n"),
            next_kernel: Duration::from_secs(1),
            csv: String::from(
                "elapsed_s,rss_kb_a,rss_kb_b,fds_a,fds_b,rotations_a,rotations_b,handshakes_a,handshakes_b,rekeys_a,rekeys_b,tcp_bytes,tcp_breaks,rtp_sent,rtp_lost,rtp_jitter_ms,ping_sent,ping_lost,restarts\n",
            ),
        }
    }

    /// Every 200 ms until the soak's time is up or a gateway fails: handshakes, the kernel's
    /// counters, Gateway B's restarts and the samples (written to `out` as they come).
    fn run(
        &mut self,
        args: &SoakArgs,
        mt6d: &Path,
        out: &Path,
        net: &crate::topo::Net,
        gateways: &mut [Gateway],
        meters: &Meters,
    ) {
        let started = self.started;
        let total = Duration::from_secs_f64(args.hours * 3600.0);
        let mut next_sample = Duration::from_secs(args.sample_secs);
        let mut next_restart = args
            .restart_every_mins
            .map(|m| Duration::from_secs_f64(m * 60.0));
        while started.elapsed() < total {
            std::thread::sleep(Duration::from_millis(200));
            for g in gateways.iter_mut() {
                if let Some(p) = g.process.as_mut() {
                    if let Some(why) = p.exited() {
                        self.failure = Some(why);
                    }
                }
            }
            if self.failure.is_some() {
                break;
            }
            self.poll_handshakes(&gateways[0].socket);
            if started.elapsed() >= self.next_kernel {
                self.kernel_second(net, started);
            }
            if next_restart.is_some_and(|t| started.elapsed() >= t) {
                let g = &mut gateways[1];
                if let Some(mut p) = g.process.take() {
                    p.stop(Duration::from_secs(5));
                }
                if let Err(e) = g.start(mt6d) {
                    self.failure = Some(format!("restart of gateway B: {e}"));
                    break;
                }
                self.restarts += 1;
                next_restart = next_restart
                    .zip(args.restart_every_mins)
                    .map(|(t, m)| t + Duration::from_secs_f64(m * 60.0));
            }
            if started.elapsed() >= next_sample || started.elapsed() >= total {
                let smp = sample(gateways, meters, started, self.restarts);
                self.record(&smp, out);
                self.samples.push(smp);
                next_sample += Duration::from_secs(args.sample_secs);
            }
        }
    }

    /// Notes the time if Gateway A's handshake count went up.
    fn poll_handshakes(&mut self, socket: &Path) {
        if let Some(h) = mt6d::control::query_status(socket)
            .ok()
            .and_then(|st| st.peers.first().and_then(|p| p.handshake.clone()))
        {
            if h.handshakes > self.handshakes_seen {
                self.handshakes_seen = h.handshakes;
                self.handshake_times.push(unix_us());
            }
        }
    }

    /// The kernel counters that rose in the last second, onto the timeline.
    fn kernel_second(&mut self, net: &crate::topo::Net, started: Instant) {
        self.next_kernel += Duration::from_secs(1);
        let now = kernel_drops(net);
        let (unix_s, elapsed_s) = (unix_us() / 1_000_000, started.elapsed().as_secs());
        for (k, v) in &now {
            let rise = v.saturating_sub(self.kernel_last.get(k).copied().unwrap_or(0));
            if rise > 0 {
                let _ = writeln!(self.kernel_timeline, "{unix_s},{elapsed_s},{k},{rise}");
            }
        }
        self.kernel_last = now;
    }

    /// A sample onto `samples.csv` (and the timeline written beside it) and a progress line.
    fn record(&mut self, smp: &Sample, out: &Path) {
        let _ = writeln!(
            self.csv,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{:.3},{},{},{}",
            smp.elapsed_s,
            smp.rss_kb[0],
            smp.rss_kb[1],
            smp.fds[0],
            smp.fds[1],
            smp.rotations[0],
            smp.rotations[1],
            smp.handshakes[0],
            smp.handshakes[1],
            smp.rekeys[0],
            smp.rekeys[1],
            smp.tcp_bytes,
            smp.tcp_breaks,
            smp.rtp_sent,
            smp.rtp_lost,
            smp.rtp_jitter_ms,
            smp.ping_sent,
            smp.ping_lost,
            smp.restarts
        );
        let _ = std::fs::write(out.join("samples.csv"), &self.csv);
        let _ = std::fs::write(out.join("kernel-timeline.csv"), &self.kernel_timeline);
        eprintln!(
            "soak: {:>6} s  rss {}/{} kB  fds {}/{}  rotations {}  tcp breaks {}  rtp lost {}/{}  pings lost {}/{}",
            smp.elapsed_s,
            smp.rss_kb[0],
            smp.rss_kb[1],
            smp.fds[0],
            smp.fds[1],
            smp.rotations[0],
            smp.tcp_breaks,
            smp.rtp_lost,
            smp.rtp_sent,
            smp.ping_lost,
            smp.ping_sent
        );
    }
}

fn wait_for_path(host_a: &Netns) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = host_a
            .run(|| {
                ping(
                    HOST_B,
                    1,
                    Pace::Flood {
                        wait: Duration::from_millis(500),
                    },
                    Duration::from_millis(300),
                )
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if r.received == 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err("Host A never reached Host B through the tunnel".into());
        }
    }
}

fn sample(gateways: &[Gateway], m: &Meters, started: Instant, restarts: u64) -> Sample {
    let mut s = Sample {
        elapsed_s: started.elapsed().as_secs(),
        tcp_bytes: m.tcp_bytes.load(Ordering::Relaxed),
        tcp_breaks: m.tcp_breaks.load(Ordering::Relaxed),
        rtp_sent: m.rtp_sent.load(Ordering::Relaxed),
        rtp_jitter_ms: m.rtp_jitter_us.load(Ordering::Relaxed) as f64 / 1000.0,
        ping_sent: m.ping_sent.load(Ordering::Relaxed),
        restarts,
        ..Sample::default()
    };
    s.rtp_lost = s
        .rtp_sent
        .saturating_sub(m.rtp_received.load(Ordering::Relaxed));
    s.ping_lost = s
        .ping_sent
        .saturating_sub(m.ping_received.load(Ordering::Relaxed));
    for (i, g) in gateways.iter().enumerate() {
        if let Some(pid) = g.pid() {
            s.rss_kb[i] = proc_field_kb(pid, "VmRSS:");
            s.fds[i] = fd_count(pid);
        }
        if let Ok(st) = mt6d::control::query_status(&g.socket) {
            if let Some(p) = st.peers.first() {
                s.rotations[i] = p.counters.rotations;
                if let Some(h) = &p.handshake {
                    s.handshakes[i] = h.handshakes;
                    s.rekeys[i] = h.rekeys;
                }
            }
        }
    }
    s
}

fn tcp_receiver(listener: &TcpListener, m: &Meters, stop: &AtomicBool) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let mut buf = vec![0u8; 64 * 1024];
    while !stop.load(Ordering::Relaxed) {
        let mut conn = match listener.accept() {
            Ok((c, _)) => c,
            Err(_) => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = conn.set_nonblocking(false);
        let _ = conn.set_read_timeout(Some(Duration::from_millis(500)));
        let mut offset = 0u64;
        let mut last_data = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            match conn.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    let stall = last_data.elapsed().as_millis() as u64;
                    m.tcp_longest_stall_ms.fetch_max(stall, Ordering::Relaxed);
                    last_data = Instant::now();
                    if buf[..n]
                        .iter()
                        .enumerate()
                        .any(|(i, b)| *b != pattern(offset + i as u64))
                    {
                        m.tcp_corrupt.fetch_add(1, Ordering::Relaxed);
                    }
                    offset += n as u64;
                    m.tcp_bytes.fetch_add(n as u64, Ordering::Relaxed);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                    ) => {}
                Err(_) => break,
            }
        }
    }
}

fn tcp_sender(m: &Meters, stop: &AtomicBool) {
    let dst = SocketAddrV6::new(HOST_B, TCP_PORT, 0, 0);
    // 1/64 s of data per write.
    let chunk = (TCP_RATE / 64) as usize;
    let tick = Duration::from_secs(1) / 64;
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut conn) = TcpStream::connect_timeout(&dst.into(), Duration::from_secs(5)) else {
            m.tcp_breaks.fetch_add(1, Ordering::Relaxed);
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        let _ = conn.set_write_timeout(Some(Duration::from_secs(30)));
        let mut offset = 0u64;
        let mut buf = vec![0u8; chunk];
        let mut next = Instant::now();
        let broke = loop {
            if stop.load(Ordering::Relaxed) {
                break false;
            }
            for (i, b) in buf.iter_mut().enumerate() {
                *b = pattern(offset + i as u64);
            }
            if conn.write_all(&buf).is_err() {
                break true;
            }
            offset += chunk as u64;
            next += tick;
            if let Some(d) = next.checked_duration_since(Instant::now()) {
                std::thread::sleep(d);
            }
        };
        if broke {
            m.tcp_breaks.fetch_add(1, Ordering::Relaxed);
        }
    }
}

fn rtp_sender(m: &Meters, stop: &AtomicBool) {
    let Ok(sock) = UdpSocket::bind(SocketAddrV6::new(HOST_A, 0, 0, 0)) else {
        return;
    };
    let dst = SocketAddrV6::new(HOST_B, RTP_PORT, 0, 0);
    let mut pkt = [0u8; RTP_LEN];
    let mut seq = 0u64;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        // RTP-like header: version 2, payload type 0 (PCMU); our own 8-byte sequence and send
        // time replace the RTP sequence/timestamp/SSRC so loss and transit need no wrap logic.
        pkt[0] = 0x80;
        pkt[1] = 0;
        pkt[4..12].copy_from_slice(&seq.to_be_bytes());
        pkt[12..20].copy_from_slice(&unix_us().to_be_bytes());
        if sock.send_to(&pkt, dst).is_ok() {
            m.rtp_sent.fetch_add(1, Ordering::Relaxed);
        }
        seq += 1;
        next += RTP_PERIOD;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
}

fn rtp_receiver(sock: &UdpSocket, m: &Meters, stop: &AtomicBool) {
    let _ = sock.set_read_timeout(Some(Duration::from_millis(200)));
    let mut buf = [0u8; 2048];
    let mut highest: Option<u64> = None;
    // Sequence numbers seen recently, to tell a duplicate from a late packet.
    let mut seen = std::collections::VecDeque::<u64>::new();
    let mut last_transit: Option<i64> = None;
    let mut jitter = 0f64;
    // Packets still in flight when the sender stops arrive within a second.
    let mut until: Option<Instant> = None;
    loop {
        if stop.load(Ordering::Relaxed) && until.is_none() {
            until = Some(Instant::now() + Duration::from_secs(1));
        }
        if until.is_some_and(|u| Instant::now() > u) {
            break;
        }
        let Ok(n) = sock.recv(&mut buf) else {
            continue;
        };
        if n != RTP_LEN {
            continue;
        }
        let mut b8 = [0u8; 8];
        b8.copy_from_slice(&buf[4..12]);
        let seq = u64::from_be_bytes(b8);
        b8.copy_from_slice(&buf[12..20]);
        let sent = u64::from_be_bytes(b8);
        if seen.contains(&seq) {
            m.rtp_duplicates.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        seen.push_back(seq);
        if seen.len() > 512 {
            seen.pop_front();
        }
        m.rtp_received.fetch_add(1, Ordering::Relaxed);
        match highest {
            Some(h) if seq < h => {
                m.rtp_reordered.fetch_add(1, Ordering::Relaxed);
                lock(&m.rtp_missing).remove(&seq);
            }
            Some(h) if seq > h + 1 => {
                // The packets between were sent one period apart before this one.
                let mut missing = lock(&m.rtp_missing);
                for (k, q) in (h + 1..seq).rev().enumerate() {
                    let back = (k as u64 + 1) * RTP_PERIOD.as_micros() as u64;
                    missing.insert(q, sent.saturating_sub(back));
                }
            }
            _ => {}
        }
        highest = Some(highest.map_or(seq, |h| h.max(seq)));
        let transit = unix_us() as i64 - sent as i64;
        m.rtp_max_transit_us
            .fetch_max(transit.max(0) as u64, Ordering::Relaxed);
        // RFC 3550 §6.4.1: J += (|D(i-1,i)| - J) / 16.
        if let Some(prev) = last_transit {
            let d = (transit - prev).unsigned_abs() as f64;
            jitter += (d - jitter) / 16.0;
            m.rtp_jitter_us.store(jitter as u64, Ordering::Relaxed);
            m.rtp_max_jitter_us
                .fetch_max(jitter as u64, Ordering::Relaxed);
        }
        last_transit = Some(transit);
    }
}

fn ping_train(m: &Meters, stop: &AtomicBool, lost: &Mutex<Vec<f64>>) {
    while !stop.load(Ordering::Relaxed) {
        let Ok(r) = ping(
            HOST_B,
            PING_ROUND,
            Pace::Train {
                interval: PING_INTERVAL,
            },
            Duration::from_secs(1),
        ) else {
            std::thread::sleep(Duration::from_secs(1));
            continue;
        };
        m.ping_sent.fetch_add(r.sent, Ordering::Relaxed);
        m.ping_received.fetch_add(r.received, Ordering::Relaxed);
        lost.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend(r.lost_at.iter().copied());
    }
}

/// Every drop counter of the kernel in each lab namespace, by "namespace counter": IPv6 and
/// UDP discards and errors (`/proc/thread-self/net/snmp6`, read from a thread inside the
/// namespace) and each interface's receive/transmit drops and errors (`net/dev`).
fn kernel_drops(net: &crate::topo::Net) -> BTreeMap<String, u64> {
    use mt6d_lab::kernel_counters::DROP_NAMES;
    // The soak also counts unreachable errors: a route gap at a rotation shows there.
    let mut drops = DROP_NAMES.to_vec();
    drops.push("DestUnreachs");
    let mut all = BTreeMap::new();
    for ns in net.all() {
        let Ok(counters) = mt6d_lab::kernel_counters::kernel_drops(ns, &drops) else {
            continue;
        };
        for (k, v) in counters {
            all.insert(format!("{} {k}", ns.name()), v);
        }
    }
    all
}

/// One RTP packet that never arrived, placed on the epoch clock and next to the handshakes.
#[derive(Debug)]
struct Loss {
    seq: u64,
    sent_us: u64,
    /// Time since the start of the epoch it was sent in, and until the next epoch.
    after_start_ms: f64,
    before_next_ms: f64,
    /// Distance to the nearest handshake Gateway A completed (poll resolution 200 ms).
    from_handshake_ms: Option<f64>,
}

fn attribute_losses(m: &Meters, stream: &mt6d_proto::Stream, handshakes: &[u64]) -> Vec<Loss> {
    lock(&m.rtp_missing)
        .iter()
        .map(|(&seq, &sent_us)| {
            let t = mt6d_proto::UnixTime::from_nanos(sent_us * 1000);
            let e = stream.epoch_at(t);
            let ms = |a: u64, b: u64| (a as f64 - b as f64) / 1e6;
            Loss {
                seq,
                sent_us,
                after_start_ms: ms(t.as_nanos(), stream.epoch_start(e).as_nanos()),
                before_next_ms: ms(stream.epoch_start(e.next()).as_nanos(), t.as_nanos()),
                from_handshake_ms: handshakes
                    .iter()
                    .map(|&h| (h as f64 - sent_us as f64).abs() / 1000.0)
                    .min_by(f64::total_cmp),
            }
        })
        .collect()
}
