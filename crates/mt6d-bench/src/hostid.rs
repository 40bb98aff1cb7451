//! `mt6d bench --hostid`: seed 004's experiment (§5.2, §6.1, Fig. 10-12) rebuilt in the lab,
//! to answer: does a HOST_ID option in a SYN cost connections or time, and
//! what does the gateway's policy change?
//!
//! 004 sent SYNs with each option from a modified kernel to the Alexa top sites and compared
//! success ratio and connection time with a host that sent none. Here the population is local:
//! Host B runs [`SERVERS`] listening sockets (one port per "site", ranked by port), of which
//! 2.6 % validate options and drop a SYN whose option block is malformed (004 §6.1.5: 26 of
//! the top 1,000 dropped the badly padded HOST_ID_BOUCADAIR). A second path adds a strict
//! router in front of every server that drops SYNs with unknown or malformed options (004
//! §6.1.5's ISP box). Host A speaks TCP by hand (AF_PACKET: its kernel cannot put these options
//! in a SYN), through mt6d encrypt with Gateway A's `host_id_out` policy either passing the
//! options (`accept`, `malformed = "accept"`) or the default (`strip`, malformed dropped).
//!
//! Both middleboxes are nftables rules in Host B's namespace (prerouting, before the servers'
//! stack). The strict router matches the kinds of the options sent (`tcp option @K,0,8 K`);
//! nftables cannot match a malformed block as such, so both match the lab's malformed encoding
//! by its bytes (the two bytes after the declared option, see [`FORMS`]), which is what a
//! validating parser rejects in that SYN.
//!
//! Connection delay: from writing the SYN to reading the SYN-ACK on Host A's link, both in
//! user space, windows of [`WINDOW`] SYNs in flight, every form sent to one window of servers
//! before the next window. A SYN not answered within [`TIMEOUT`] is a failure (every drop here
//! is deterministic; a retransmission would meet the same rule).
//!
//! The load test (004 §7.3) runs Host A's own kernel: N users connecting to a server on Host B
//! again and again, through gateways that leave TCP alone, strip, or inject.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mt6d_lab::topology::{HOST_A, HOST_B, HOST_IF};
use mt6d_os::capture::PacketCapture;
use mt6d_proto::wire::upper_layer_checksum;

use crate::json::{Value, ValueExt};
use crate::profile::{Mode, Scenario, Topology};

/// The population: one listening port per site, ranked by port (004: the top 1,000 sites).
pub const SERVERS: u16 = 1000;
const BASE_PORT: u16 = 10_000;
/// Validating servers per 1,000 (004 §6.1.5: 2.6 %).
const VALIDATING: usize = 26;
const WINDOW: usize = 16;
const TIMEOUT: Duration = Duration::from_millis(100);

/// Linux's SYN options (MSS 1440, SACK permitted, timestamps, window scale 7) before the
/// option under test.
const LINUX_SYN: [u8; 20] = [
    2, 4, 0x05, 0xa0, 4, 2, 8, 10, 0, 0, 0x10, 0, 0, 0, 0, 0, 1, 3, 3, 7,
];
const KINDS: &str = "[tcp]\nwing_kind = 200\nboucadair_kind = 201\nenabled_kind = 202\n";

/// The options 004 §6 tested (its list, kinds 200-202 for its "TBD"), RFC 7974's and TOA,
/// and 004 §6.1.4's badly padded HOST_ID_BOUCADAIR: Length says 10 where the sender wrote 12
/// bytes (the padding went in front and was not counted), so the last two, 0x1f 0x90, read as
/// an option of kind 31 and length 144 that runs past the header.
pub const FORMS: [(&str, &str, &[u8]); 12] = [
    ("no_option", "NO-OPTION", &[]),
    ("wing_16", "HOST_ID_WING (16 bits)", &[200, 4, 0x30, 0x39]),
    (
        "wing_32",
        "HOST_ID_WING (32 bits)",
        &[200, 6, 0xc0, 0, 2, 1],
    ),
    (
        "wing_64",
        "HOST_ID_WING (64 bits)",
        &[200, 10, 0x20, 1, 0x0d, 0xb8, 0, 0, 0, 1],
    ),
    (
        "boucadair_port",
        "HOST_ID_BOUCADAIR (source port)",
        &[201, 10, 0x00, 0x1f, 0x90, 0, 0, 0, 0, 0],
    ),
    (
        "boucadair_ipv4",
        "HOST_ID_BOUCADAIR (IPv4 address)",
        &[201, 10, 0x31, 10, 0, 0, 1, 0, 0, 0],
    ),
    (
        "boucadair_port_ipv4",
        "HOST_ID_BOUCADAIR (source port: IPv4 address)",
        &[201, 10, 0x02, 0x1f, 0x90, 10, 0, 0, 1, 0],
    ),
    (
        "boucadair_prefix",
        "HOST_ID_BOUCADAIR (IPv6 prefix)",
        &[201, 10, 0x03, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 1],
    ),
    ("enabled", "HOST_ID_ENABLED", &[202, 2]),
    (
        "rfc7974",
        "RFC 7974 HOST_ID",
        &[253, 6, 0x03, 0x48, 0xc6, 0x33],
    ),
    ("toa", "TOA", &[254, 8, 0x1f, 0x90, 0xc0, 0, 2, 1]),
    (
        "boucadair_bad_padding",
        "HOST_ID_BOUCADAIR, bad padding (malformed)",
        &[201, 10, 0, 0, 0x00, 0, 0, 0, 0, 0, 0x1f, 0x90],
    ),
];

/// Gateway A's `host_id_out` (and both gateways' `host_id_in`, which passes everything, so the
/// policy under test is Gateway A's alone).
pub const POLICIES: [(&str, &str); 2] = [
    (
        "pass",
        "[peer.host_id_out]\naction = \"accept\"\nmalformed = \"accept\"\n",
    ),
    ("strip", "[peer.host_id_out]\naction = \"strip\"\n"),
];
const IN_PASSES: &str = "[peer.host_id_in]\naction = \"accept\"\nmalformed = \"accept\"\n";

pub const PATHS: [&str; 2] = ["open", "strict"];

/// 004 §7.3's CGN load test, scaled to the lab: active users, and how long each load runs.
pub const USERS: [usize; 3] = [10, 100, 1000];
const LOAD_SECS: u64 = 4;
/// What every user fetches per connection (a small web object), pushed by Host B's server.
const OBJECT: usize = 1024;
const LOAD_PORT: u16 = 8081;

/// The gateways' TCP settings in the load test: no TCP handling, the default strip, and
/// Gateway A injecting as 004 §7.3's CGN did (WING with the source port; BOUCADAIR with the
/// prefix).
pub const LOAD_CONFIGS: [(&str, &str); 4] = [
    ("off", "[tcp]\nhost_id = false\nmss_clamp = false\n"),
    ("strip", KINDS),
    (
        "inject_wing",
        "[tcp]\nwing_kind = 200\nboucadair_kind = 201\nenabled_kind = 202\n[peer.host_id_out.inject]\noption = \"wing\"\ndata = \"source_port\"\nbytes = 2\n",
    ),
    (
        "inject_boucadair",
        "[tcp]\nwing_kind = 200\nboucadair_kind = 201\nenabled_kind = 202\n[peer.host_id_out.inject]\noption = \"boucadair\"\ndata = \"prefix\"\n",
    ),
];

/// What one user saw.
#[derive(Debug, Default)]
struct UserTally {
    attempts: u64,
    established: u64,
    completed: u64,
    bytes: u64,
    connect_us: Vec<f64>,
}

/// `users` threads on Host A, each connecting to Host B's object server and reading the object
/// until `secs` have passed. Host B's server: one thread that accepts, writes the object and
/// closes.
fn load(net: &crate::topo::Net, users: usize, secs: u64) -> Result<Value, String> {
    let listener = net
        .host_b
        .run(|| TcpListener::bind((HOST_B, LOAD_PORT)))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("Host B object server: {e}"))?;
    listener.set_nonblocking(true).map_err(|e| e.to_string())?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = object_server(listener, stop.clone());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let tallies = net
        .host_a
        .run(|| {
            // Threads inherit the namespace of the thread that creates them.
            let handles: Vec<_> = (0..users)
                .map(|_| {
                    std::thread::Builder::new()
                        .stack_size(128 * 1024)
                        .spawn(move || user(deadline))
                })
                .collect::<std::io::Result<Vec<_>>>()?;
            Ok::<_, std::io::Error>(
                handles
                    .into_iter()
                    .filter_map(|h| h.join().ok())
                    .collect::<Vec<_>>(),
            )
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{users} users on Host A: {e}"))?;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = server.join();
    let sum = |f: fn(&UserTally) -> u64| tallies.iter().map(f).sum::<u64>();
    let mut connect: Vec<f64> = tallies
        .iter()
        .flat_map(|t| t.connect_us.iter().copied())
        .collect();
    connect.sort_by(f64::total_cmp);
    let at = |q: f64| {
        connect
            .get(((connect.len() as f64 - 1.0) * q) as usize)
            .copied()
    };
    let (attempts, completed) = (sum(|t| t.attempts), sum(|t| t.completed));
    let mut v = Value::obj();
    v.set("users", users as u64)
        .set("secs", secs)
        .set("attempts", attempts)
        .set("established", sum(|t| t.established))
        .set("completed", completed)
        .set(
            "success_pct",
            completed as f64 * 100.0 / attempts.max(1) as f64,
        )
        .set("connect_ms_median", at(0.5).map(|x| x / 1000.0))
        .set("connect_ms_p95", at(0.95).map(|x| x / 1000.0))
        .set("completed_per_s", completed as f64 / secs as f64)
        .set(
            "mbit_per_s",
            sum(|t| t.bytes) as f64 * 8.0 / secs as f64 / 1e6,
        );
    Ok(v)
}

/// Host B's object server: accepts, writes the object and closes, until `stop`.
fn object_server(
    listener: TcpListener,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    use std::io::Write as _;
    std::thread::spawn(move || {
        let object = [0x5a_u8; OBJECT];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut c, _)) => {
                    let _ = c.set_nonblocking(false);
                    let _ = c.write_all(&object);
                }
                Err(_) => std::thread::sleep(Duration::from_micros(200)),
            }
        }
    })
}

/// One user on Host A (its thread in Host A's namespace): connects to Host B's object server
/// and reads the object, again and again until `deadline`.
fn user(deadline: Instant) -> UserTally {
    use std::io::Read as _;
    let mut t = UserTally::default();
    let mut buf = [0u8; 4096];
    while Instant::now() < deadline {
        t.attempts += 1;
        let t0 = Instant::now();
        let Ok(mut c) = std::net::TcpStream::connect_timeout(
            &(HOST_B, LOAD_PORT).into(),
            Duration::from_secs(3),
        ) else {
            continue;
        };
        t.established += 1;
        t.connect_us.push(t0.elapsed().as_secs_f64() * 1e6);
        let _ = c.set_read_timeout(Some(Duration::from_secs(3)));
        let mut got = 0;
        while let Ok(n) = c.read(&mut buf) {
            if n == 0 {
                break;
            }
            got += n;
        }
        t.bytes += got as u64;
        if got == OBJECT {
            t.completed += 1;
        }
    }
    t
}

/// The ranks (0-based) of the validating servers: every 1,000/26th, from a fixed offset, so
/// they are spread over the ranks as 004's were over the top 1,000.
pub fn validating() -> Vec<u16> {
    (0..VALIDATING)
        .map(|i| ((i * usize::from(SERVERS)) / VALIDATING + 17) as u16 % SERVERS)
        .collect()
}

fn nft_rules(path: &str) -> String {
    let ports: Vec<String> = validating()
        .iter()
        .map(|r| (BASE_PORT + r).to_string())
        .collect();
    // Bits 400-415 of the TCP header: the two bytes after the option under test in the
    // malformed form (20 header bytes, 20 of LINUX_SYN, 10 declared).
    let malformed = "@th,400,16 0x1f90";
    let mut r = format!(
        "table ip6 hostid_lab {{\n set validating {{ type inet_service; elements = {{ {} }} }}\n chain pre {{\n  type filter hook prerouting priority -300; policy accept;\n  tcp flags & (syn | ack) == syn tcp dport @validating {malformed} counter drop\n",
        ports.join(", ")
    );
    if path == "strict" {
        for k in [200, 201, 202, 253, 254] {
            r +=
                &format!("  tcp flags & (syn | ack) == syn tcp option @{k},0,8 {k} counter drop\n");
        }
        r += &format!("  tcp flags & (syn | ack) == syn {malformed} counter drop\n");
    }
    r + " }\n}\n"
}

fn nft(ns: &mt6d_os::Netns, text: &str) -> Result<(), String> {
    use std::io::Write as _;
    let mut c = ns
        .command("nft")
        .map_err(|e| e.to_string())?
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("nft: {e}"))?;
    c.stdin
        .take()
        .ok_or("nft stdin")?
        .write_all(text.as_bytes())
        .map_err(|e| format!("nft: {e}"))?;
    let out = c.wait_with_output().map_err(|e| format!("nft: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nft: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

fn mac_of(ns: &mt6d_os::Netns, args: &[&str]) -> Result<[u8; 6], String> {
    let out = ns
        .command("ip")
        .map_err(|e| e.to_string())?
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    let word = text
        .split_whitespace()
        .skip_while(|w| *w != "lladdr" && *w != "link/ether")
        .nth(1)
        .ok_or_else(|| format!("no MAC in {text:?}"))?;
    let mut mac = [0u8; 6];
    for (m, h) in mac.iter_mut().zip(word.split(':')) {
        *m = u8::from_str_radix(h, 16).map_err(|e| format!("MAC {word}: {e}"))?;
    }
    Ok(mac)
}

/// An Ethernet frame with an IPv6+TCP SYN from Host A to Host B, options padded with EOL.
fn syn_frame(head: &[u8; 14], sport: u16, dport: u16, isn: u32, opts: &[u8]) -> Vec<u8> {
    let mut o = opts.to_vec();
    o.resize(opts.len().div_ceil(4) * 4, 0);
    let seg = 20 + o.len();
    let mut p = head.to_vec();
    p.extend_from_slice(&[0x60, 0, 0, 0]);
    p.extend_from_slice(&(seg as u16).to_be_bytes());
    p.extend_from_slice(&[6, 64]);
    p.extend_from_slice(&HOST_A.octets());
    p.extend_from_slice(&HOST_B.octets());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&isn.to_be_bytes());
    p.extend_from_slice(&[
        0,
        0,
        0,
        0,
        ((seg / 4) as u8) << 4,
        0x02,
        0xfa,
        0xf0,
        0,
        0,
        0,
        0,
    ]);
    p.extend_from_slice(&o);
    let c = upper_layer_checksum(HOST_A, HOST_B, 6, &p[54..]);
    p[54 + 16..54 + 18].copy_from_slice(&c.to_be_bytes());
    p
}

/// Host A's hand-made client: a capture on its link, the frame head towards Host B.
struct Prober {
    cap: PacketCapture,
    head: [u8; 14],
    next_sport: u32,
}

impl Prober {
    /// Sends a SYN with `opts` to the [`WINDOW`] servers from rank `first`, and writes each
    /// one's delay to its SYN-ACK in microseconds into `delays` (left `None` without one).
    fn probe_window(
        &mut self,
        first: u16,
        opts: &[u8],
        delays: &mut [Option<f64>],
    ) -> Result<(), String> {
        let mut buf = [0u8; 2048];
        {
            let mut pending: HashMap<u16, (usize, Instant)> = HashMap::new();
            let mut last = Instant::now();
            for rank in first..(first + WINDOW as u16).min(SERVERS) {
                let sport = 1024 + (self.next_sport % 64_000) as u16;
                self.next_sport += 1;
                let frame = syn_frame(&self.head, sport, BASE_PORT + rank, 0x1000_0000, opts);
                last = Instant::now();
                self.cap.send(&frame).map_err(|e| e.to_string())?;
                pending.insert(sport, (usize::from(rank), last));
            }
            while !pending.is_empty() && last.elapsed() < TIMEOUT {
                let Ok(Some(f)) = self.cap.recv(&mut buf) else {
                    continue;
                };
                let now = Instant::now();
                let p = &buf[14..f.captured];
                if p.len() < 60 || p[6] != 6 || p[8..24] != HOST_B.octets() {
                    continue;
                }
                let tcp = &p[40..];
                if tcp[13] & 0x12 != 0x12 {
                    continue;
                }
                let dport = u16::from_be_bytes([tcp[2], tcp[3]]);
                if let Some((rank, sent)) = pending.remove(&dport) {
                    // Whole µs: the reading loop's own jitter is larger than a µs.
                    delays[rank] = Some((now.duration_since(sent).as_secs_f64() * 1e6).round());
                }
            }
        }
        Ok(())
    }

    /// Every form to every server: window by window, each form in turn within a window, so a
    /// drift of the shared machine's load weighs on every form alike. Delays per form.
    fn probe_forms(&mut self, forms: &[Vec<u8>]) -> Result<Vec<Vec<Option<f64>>>, String> {
        let mut delays = vec![vec![None; usize::from(SERVERS)]; forms.len()];
        for first in (0..SERVERS).step_by(WINDOW) {
            for (opts, d) in forms.iter().zip(delays.iter_mut()) {
                self.probe_window(first, opts, d)?;
            }
        }
        Ok(delays)
    }
}

/// Runs the experiment and writes results.json, report.md into `out` (default
/// bench-results/DATE-hostid).
pub fn run(out: Option<PathBuf>, mt6d: &Path) -> Result<PathBuf, String> {
    let (date, time) = crate::utc::utc_now();
    let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/{date}-hostid")));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = std::env::temp_dir().join(format!("mt6d-hostid-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let _work_guard = crate::workdir::RemoveDir(work.clone());
    let start = Instant::now();

    let net = crate::topo::build(Topology::Switched)?;
    let cases = probe_cases(&net, mt6d, &work)?;
    let loads = load_runs(&net, mt6d, &work)?;
    let mut doc = settings(&format!("{date} {time}"), mt6d);
    doc.set("duration_secs", start.elapsed().as_secs_f64())
        .set("cases", Value::Array(cases))
        .set("load", Value::Array(loads));
    std::fs::write(out.join("results.json"), doc.pretty())
        .map_err(|e| format!("{}: {e}", out.display()))?;
    std::fs::write(out.join("report.md"), crate::hostid_report::markdown(&doc))
        .map_err(|e| format!("{}: {e}", out.display()))?;
    eprintln!(
        "mt6d bench --hostid: done in {:.0} s; results in {}",
        start.elapsed().as_secs_f64(),
        out.display()
    );
    Ok(out)
}

/// 004 §6.1: every option form on every path under every policy, each probed against every
/// server; a case per (policy, path, form) with its delays.
fn probe_cases(net: &crate::topo::Net, mt6d: &Path, work: &Path) -> Result<Vec<Value>, String> {
    // The servers: kernel listeners (Linux's stack reads the options and ignores unknown or
    // malformed ones; the validating 2.6 % are the nftables rule).
    let listeners: Vec<TcpListener> = net
        .host_b
        .run(|| {
            (0..SERVERS)
                .map(|i| TcpListener::bind((HOST_B, BASE_PORT + i)))
                .collect::<std::io::Result<Vec<_>>>()
        })
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("{SERVERS} listeners on Host B: {e}"))?;

    let mut cases = Vec::new();
    for (policy, policy_text) in POLICIES {
        eprintln!("mt6d bench --hostid: policy {policy}: start gateways");
        let extra = format!("\n{KINDS}{policy_text}{IN_PASSES}");
        let gw = crate::peers::start(
            net,
            Scenario::Mt6d(Mode::Encrypt),
            10.0,
            mt6d,
            work,
            (&extra, None),
        )?;
        crate::run::warm_up(net)?;
        let mut prober = prober(net)?;
        // One sweep unmeasured: the servers' and gateways' first connections (neighbour and
        // route caches, the listeners' first SYNs) would otherwise all fall on NO-OPTION.
        prober.probe_forms(&[LINUX_SYN.to_vec()])?;
        let forms: Vec<Vec<u8>> = FORMS
            .iter()
            .map(|(_, _, bytes)| [&LINUX_SYN[..], bytes].concat())
            .collect();
        for path in PATHS {
            let _ = nft(&net.host_b, "delete table ip6 hostid_lab\n");
            nft(&net.host_b, &nft_rules(path))?;
            eprintln!("mt6d bench --hostid: policy {policy}, path {path}");
            let all = prober.probe_forms(&forms)?;
            for ((form, _, _), delays) in FORMS.iter().zip(all) {
                let mut c = Value::obj();
                c.set("policy", policy)
                    .set("path", path)
                    .set("form", *form)
                    .set(
                        "delay_us",
                        Value::Array(
                            delays
                                .iter()
                                .map(|d| d.map_or(Value::Null, Value::from))
                                .collect(),
                        ),
                    );
                cases.push(c);
            }
        }
        drop(gw);
    }
    drop(listeners);

    Ok(cases)
}

/// A prober on Host A's interface, its frames headed from Host A to Host B.
fn prober(net: &crate::topo::Net) -> Result<Prober, String> {
    let cap = net
        .host_a
        .run(|| PacketCapture::open(HOST_IF, 2048, Duration::from_millis(5)))
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let dst = mac_of(&net.host_a, &["-6", "neigh", "show", &HOST_B.to_string()])?;
    let src = mac_of(&net.host_a, &["link", "show", HOST_IF])?;
    let mut head = [0u8; 14];
    head[..6].copy_from_slice(&dst);
    head[6..12].copy_from_slice(&src);
    head[12..].copy_from_slice(&[0x86, 0xdd]);
    Ok(Prober {
        cap,
        head,
        next_sport: 0,
    })
}

/// 004 §7.3: the gateway under load, without and with HOST_ID handling: a run per
/// configuration and user count.
fn load_runs(net: &crate::topo::Net, mt6d: &Path, work: &Path) -> Result<Vec<Value>, String> {
    let mut loads = Vec::new();
    for (config, text) in LOAD_CONFIGS {
        eprintln!("mt6d bench --hostid: load, {config}: start gateways");
        let mut gw = crate::peers::start(
            net,
            Scenario::Mt6d(Mode::Encrypt),
            10.0,
            mt6d,
            work,
            (&format!("\n{text}"), None),
        )?;
        crate::run::warm_up(net)?;
        for users in USERS {
            eprintln!("mt6d bench --hostid: load, {config}, {users} users");
            let pid = gw.gw_a.as_ref().and_then(crate::procs::Guarded::pid);
            let before = pid.and_then(crate::procs::ProcSample::read);
            let mut v = load(net, users, LOAD_SECS).unwrap_or_else(|e| {
                let mut v = Value::obj();
                v.set("error", e);
                v
            });
            if let (Some(a), Some(b)) = (before, pid.and_then(crate::procs::ProcSample::read)) {
                v.set("gateway_a_cpu", crate::procs::window(&a, &b));
            }
            if let Some(dead) = gw.dead() {
                return Err(format!("load, {config}: {dead}"));
            }
            v.set("config", config);
            loads.push(v);
        }
        drop(gw);
    }
    Ok(loads)
}

/// The results' header: what was run, with what settings.
fn settings(date_utc: &str, mt6d: &Path) -> Value {
    let mut doc = Value::obj();
    doc.set("tool", "mt6d bench --hostid")
        .set(
            "issue",
            "seed 004's experiment (§5.2, §6.1, Fig. 10-12) in the lab",
        )
        .set("date_utc", date_utc)
        .set("machine", crate::machine::describe(mt6d))
        .set("servers", u64::from(SERVERS))
        .set(
            "validating_ranks",
            Value::Array(
                validating()
                    .iter()
                    .map(|r| Value::from(u64::from(*r) + 1))
                    .collect(),
            ),
        )
        .set("window", WINDOW as u64)
        .set("timeout_ms", TIMEOUT.as_millis() as u64)
        .set(
            "forms",
            Value::Array(
                FORMS
                    .iter()
                    .map(|(n, l, b)| {
                        let mut v = Value::obj();
                        v.set("form", *n).set("label", *l).set(
                            "bytes",
                            b.iter().map(|x| format!("{x:02x}")).collect::<String>(),
                        );
                        v
                    })
                    .collect(),
            ),
        )
        .set(
            "policies",
            Value::Array(
                POLICIES
                    .iter()
                    .map(|(n, t)| {
                        let mut v = Value::obj();
                        v.set("policy", *n).set("gateway_a", t.trim());
                        v
                    })
                    .collect(),
            ),
        )
        .set("nft_open", nft_rules("open"))
        .set("nft_strict", nft_rules("strict"))
        .set(
            "load_configs",
            Value::Array(
                LOAD_CONFIGS
                    .iter()
                    .map(|(n, t)| {
                        let mut v = Value::obj();
                        v.set("config", *n).set("gateways", t.trim());
                        v
                    })
                    .collect(),
            ),
        )
        .set("load_object_bytes", OBJECT as u64);
    doc
}

#[cfg(test)]
mod tests {
    use super::*;
    use mt6d_proto::scrub::{HostIdKinds, TcpOptions};

    const LAB_KINDS: HostIdKinds = HostIdKinds {
        wing: Some(200),
        boucadair: Some(201),
        enabled: Some(202),
    };

    /// Only the form meant to be malformed is, to the gateway's parser; and the bytes the
    /// nftables rules match (TCP header bits 400-415) are 0x1f90 in that form's SYN alone.
    #[test]
    fn one_form_is_malformed_and_the_middlebox_rule_matches_it_alone() {
        for (name, _, bytes) in FORMS {
            let mut opts = [&LINUX_SYN[..], bytes].concat();
            opts.resize(opts.len().div_ceil(4) * 4, 0);
            let malformed = TcpOptions::new(&opts, LAB_KINDS).any(|o| o.is_err());
            assert_eq!(malformed, name == "boucadair_bad_padding", "{name}");
            let frame = syn_frame(&[0; 14], 40_000, BASE_PORT, 1, &opts);
            let tcp = &frame[54..];
            assert_eq!(upper_layer_checksum(HOST_A, HOST_B, 6, tcp), 0, "{name}");
            let at_400 = tcp.get(50..52) == Some(&[0x1f, 0x90][..]);
            assert_eq!(at_400, name == "boucadair_bad_padding", "{name}");
        }
    }

    #[test]
    fn validating_servers_are_2_6_per_cent_spread_over_the_ranks() {
        let v = validating();
        assert_eq!(v.len(), 26);
        let mut sorted = v.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), 26);
        for hundred in 0..10 {
            let n = v.iter().filter(|r| **r / 100 == hundred).count();
            assert!((2..=3).contains(&n), "{n} in hundred {hundred}");
        }
    }
}
