//! `mt6d bench --server`: the server role's experiments, 002's two figures side by side.
//!
//! * **Fig. 1, time to make n addresses answerable.** The netlink-per-address method (002's,
//!   and the gateway role's): n /128s added to an interface with one `ip -batch` in a fresh
//!   namespace, timed, n growing until one step exceeds the limit (default 10 minutes). The
//!   server role: `mt6d run` with n clients in its peers file, timed from the start of the
//!   process to its "serving" line and to the first answer to a random client.
//! * **Fig. 2, response time over requests/s and clients.** A many-client generator
//!   ([`mt6d_lab::clients::ClientSet`], one process playing every client with its own keys
//!   and hashed addresses in the client namespace's /64) sends requests to the echo service
//!   behind the server (002's: port 3540, answers ten times the request) at a set rate, each
//!   from a random client, and measures every round trip, loss and answers from a wrong
//!   source. A cell fails below 90 % answered (002's rule). Classes as 002's: < 1 ms, < 5 ms,
//!   < 50 ms, < 100 ms by mean response time.
//! * Beside them: the daemon's memory per client, the CPU its rotation takes while idle (10 s
//!   interval), and its start-up time.
//! * **Handshakes.** A server with n clients that all handshake (no pre-shared key), started
//!   cold; a generator ([`mt6d_lab::handshake_clients::HandshakeClients`], on
//!   `--generator-threads` threads, each owning a share of the clients on its own hashed /64
//!   and sockets) plays every client's initiator, at most [`IN_FLIGHT`] at a time, until each
//!   is served: its handshake completed and the answer of the echo service behind the server
//!   to its first request opened under the new keys. Measured: the server's start (one X25519
//!   per client for its link set), the time until every client is served, the handshakes
//!   completed per second, and the server's and the generator's CPU.
//! * **Restart storm** (after each handshake run, once every client is served): the server is
//!   stopped and started again while every client keeps sending; each client starts its
//!   recovery handshake by the liveness rule (docs/PROTOCOL.md §9.9). Measured: from the new
//!   process's "serving" line to each client served again (p50, p99, max), and apart from it
//!   the liveness rule's own delay (to each client's first recovery initiation) and the queue
//!   (from it to served); the initiations and requests; the server's and the generator's CPU
//!   per handshake over the storm, the machine's busy cores, and the kernel's UDP drops.
//!
//! The generator and the server share the machine's cores, as the goal states.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mt6d_lab::clients::{echo_service, ClientSet, ClientSpec};
use mt6d_lab::handshake_clients::{self, HandshakeClients};
use mt6d_lab::server_lab::{ServerLab, ECHO_PORT, SERVER_TRUE};
use mt6d_os::{Epoll, EpollEvents, Netns};

use crate::json::{Value, ValueExt};
use crate::procs::{Guarded, ProcSample};

/// The generator's receiving port in the client namespace.
const GEN_PORT: u16 = 7421;
/// Request payload bytes (sequence number and padding); answers are ten times this.
const REQUEST: usize = 64;
/// The echo's answer factor (002).
const FACTOR: usize = 10;
/// Rotation interval of the server role runs (the goal's 10 s).
const ROTATION_SECS: f64 = 10.0;
/// Handshakes the generator keeps under way at once.
pub const IN_FLIGHT: usize = 256;
/// Longest a cold start may take before the run gives up.
const COLD_START_LIMIT: Duration = Duration::from_secs(600);
/// Longest a restart storm may take, from the stop, before the run reports what it has.
const STORM_LIMIT: Duration = Duration::from_secs(120);

/// What to run.
#[derive(Debug, Clone)]
pub struct ServerArgs {
    /// Client counts of the server role runs.
    pub clients: Vec<usize>,
    /// Request rates (per second) of Fig. 2.
    pub rates: Vec<u64>,
    /// Requests per cell.
    pub cell: usize,
    /// Address counts of the netlink method, tried in order until one takes longer than
    /// `netlink_limit`.
    pub netlink_sizes: Vec<usize>,
    pub netlink_limit: Duration,
    /// Client counts of the handshake runs (cold start, every client handshaking).
    pub handshakes: Vec<usize>,
    /// Address counts of the netlink method's Fig. 2.
    pub netlink_fig2: Vec<usize>,
    /// Threads of the handshake runs' generator.
    pub generator_threads: usize,
}

/// One per online CPU.
fn default_generator_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl ServerArgs {
    pub fn full() -> ServerArgs {
        ServerArgs {
            clients: vec![1, 1_000, 10_000, 100_000, 1_000_000],
            rates: vec![2_000, 10_000, 30_000, 60_000, 100_000, 150_000],
            cell: 20_000,
            netlink_sizes: vec![
                1, 100, 1_000, 5_000, 10_000, 20_000, 30_000, 40_000, 50_000, 60_000, 70_000,
            ],
            netlink_limit: Duration::from_secs(600),
            handshakes: vec![1_000, 10_000, 100_000],
            netlink_fig2: vec![1, 1_000, 10_000, 20_000],
            generator_threads: default_generator_threads(),
        }
    }

    pub fn quick() -> ServerArgs {
        ServerArgs {
            clients: vec![1, 1_000, 10_000],
            rates: vec![2_000, 10_000, 30_000],
            cell: 5_000,
            netlink_sizes: vec![1, 100, 1_000, 5_000],
            netlink_limit: Duration::from_secs(60),
            handshakes: vec![1_000],
            netlink_fig2: vec![1, 1_000],
            generator_threads: default_generator_threads(),
        }
    }
}

pub fn run(out: Option<PathBuf>, mt6d: &Path, args: &ServerArgs) -> Result<PathBuf, String> {
    let (date, time) = crate::run::utc_now();
    let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/{date}-server")));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = std::env::temp_dir().join(format!("mt6d-server-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let _work_guard = crate::run::RemoveDir(work.clone());
    let mut doc = Value::obj();
    doc.set("date", date.as_str())
        .set("time_utc", time.as_str())
        .set("machine", crate::machine::describe(mt6d))
        .set("cell_requests", args.cell as u64)
        .set("request_bytes", REQUEST as u64)
        .set("answer_factor", FACTOR as u64)
        .set("rotation_secs", ROTATION_SECS);

    let lab = ServerLab::build("mbs").map_err(|e| e.to_string())?;
    let mut runs = Vec::new();
    for &n in &args.clients {
        eprintln!("mt6d bench --server: server role, {n} clients");
        runs.push(server_run(&lab, mt6d, &work, n, args)?);
        std::fs::write(out.join("results.json"), {
            let mut d = doc.clone();
            d.set("server_role", Value::Array(runs.clone()));
            d.pretty()
        })
        .map_err(|e| e.to_string())?;
    }
    doc.set("server_role", Value::Array(runs));
    let mut hs_runs = Vec::new();
    for &n in &args.handshakes {
        eprintln!("mt6d bench --server: handshakes, {n} clients from cold");
        hs_runs.push(handshake_run(&lab, mt6d, &work, n, args.generator_threads)?);
        std::fs::write(out.join("results.json"), {
            let mut d = doc.clone();
            d.set("handshakes", Value::Array(hs_runs.clone()));
            d.pretty()
        })
        .map_err(|e| e.to_string())?;
    }
    doc.set("handshakes", Value::Array(hs_runs));
    if !args.netlink_fig2.is_empty() {
        eprintln!("mt6d bench --server: Fig. 2, netlink method");
        doc.set("fig2_netlink", fig2_netlink(&lab, args)?);
        std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())?;
    }
    drop(lab);
    if args.netlink_limit.is_zero() {
        std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())?;
        std::fs::write(out.join("report.md"), markdown(&doc)).map_err(|e| e.to_string())?;
        return Ok(out);
    }
    // Last: deleting a namespace with tens of thousands of addresses keeps the kernel busy for
    // a while after, which would disturb the server role's figures.
    eprintln!("mt6d bench --server: Fig. 1, netlink method");
    doc.set("fig1_netlink", fig1_netlink(args)?);
    std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())?;
    std::fs::write(out.join("report.md"), markdown(&doc)).map_err(|e| e.to_string())?;
    figures(&doc, &out)?;
    eprintln!("mt6d bench --server: {}", out.join("report.md").display());
    Ok(out)
}

/// The elements of the array `key` of `v` (none if it is missing or not an array).
fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> + 'a {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
}

/// `fig1.{svg,png}` (seconds to make n addresses answerable, both methods, log scale) and
/// `fig2.{svg,png}` (mean response per rate, one bar per client count; failed cells omitted).
pub fn figures(doc: &Value, out: &Path) -> Result<Vec<PathBuf>, String> {
    let runs: Vec<&Value> = items(doc, "server_role").collect();
    let netlink: Vec<&Value> = items(doc, "fig1_netlink").collect();
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let mut ns: Vec<u64> = runs.iter().map(|r| u(r, "clients")).collect();
    ns.extend(netlink.iter().map(|p| u(p, "addresses")));
    ns.sort_unstable();
    ns.dedup();
    let mut written = crate::plot::write_bars(
        out,
        "fig1",
        "Time to make n addresses answerable (002 Fig. 1)".into(),
        "addresses (clients)",
        "seconds (log)",
        ns.iter().map(u64::to_string).collect(),
        vec![
            (
                "netlink, one /128 each".into(),
                ns.iter()
                    .map(|n| {
                        netlink
                            .iter()
                            .find(|p| u(p, "addresses") == *n)
                            .and_then(|p| f(p, "secs"))
                    })
                    .collect(),
            ),
            (
                "server role, to first answer".into(),
                ns.iter()
                    .map(|n| {
                        runs.iter()
                            .find(|r| u(r, "clients") == *n)
                            .and_then(|r| f(r, "first_answer_secs"))
                    })
                    .collect(),
            ),
        ],
        true,
    )?;
    let mut rates: Vec<u64> = runs
        .iter()
        .flat_map(|r| items(r, "cells"))
        .map(|c| u(c, "rate"))
        .collect();
    rates.sort_unstable();
    rates.dedup();
    written.extend(crate::plot::write_bars(
        out,
        "fig2",
        "Mean response time, server role (002 Fig. 2; failed cells left out)".into(),
        "requests per second asked",
        "mean ms (log)",
        rates.iter().map(u64::to_string).collect(),
        runs.iter()
            .map(|r| {
                let cells: Vec<&Value> = items(r, "cells").collect();
                (
                    format!("{} clients", u(r, "clients")),
                    rates
                        .iter()
                        .map(|rate| {
                            cells
                                .iter()
                                .find(|c| {
                                    u(c, "rate") == *rate
                                        && c.get("class").and_then(Value::as_str) != Some("fail")
                                })
                                .and_then(|c| f(c, "mean_ms"))
                        })
                        .collect(),
                )
            })
            .collect(),
        true,
    )?);
    Ok(written)
}

/// n /128s on a veth interface of a fresh namespace (no dummy module on this kernel) with one `ip -batch`, per n.
fn fig1_netlink(args: &ServerArgs) -> Result<Value, String> {
    let mut points = Vec::new();
    for &n in &args.netlink_sizes {
        let ns = Netns::create(&mt6d_os::unique_name("mbsn")).map_err(|e| e.to_string())?;
        let run = |cmd: &str| -> Result<(), String> {
            let o = ns
                .command("sh")
                .map_err(|e| e.to_string())?
                .args(["-c", cmd])
                .output()
                .map_err(|e| e.to_string())?;
            if o.status.success() {
                Ok(())
            } else {
                Err(format!("{cmd}: {}", String::from_utf8_lossy(&o.stderr)))
            }
        };
        run("ip link add d0 type veth peer name d1 && ip link set d0 up && ip link set d1 up")?;
        let mut batch = String::with_capacity(n * 48);
        for i in 0..n {
            let a =
                std::net::Ipv6Addr::from((0x2001_0db8_0077_u128 << 80) | (i as u128 * 7919 + 1));
            batch.push_str(&format!("addr add {a}/128 dev d0 nodad\n"));
        }
        let file = std::env::temp_dir().join(format!("mt6d-fig1-{}", std::process::id()));
        std::fs::write(&file, batch).map_err(|e| e.to_string())?;
        let t = Instant::now();
        run(&format!("ip -batch {}", file.display()))?;
        let secs = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&file);
        eprintln!("  netlink: {n} addresses in {secs:.3} s");
        let mut p = Value::obj();
        p.set("addresses", n as u64)
            .set("secs", secs)
            .set("ms_per_address", secs * 1e3 / n as f64);
        points.push(p);
        // Removing the namespace frees the addresses (in the background; it takes a while).
        drop(ns);
        if t.elapsed() > args.netlink_limit {
            break;
        }
    }
    Ok(Value::Array(points))
}

fn peers_file(path: &Path, spec: &ClientSpec, n: usize) -> Result<(), String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    for i in 0..n {
        w.write_all(spec.peers_line(&format!("c{i}"), i).as_bytes())
            .map_err(|e| e.to_string())?;
    }
    w.flush().map_err(|e| e.to_string())
}

/// A small xorshift: the random client of each request (reproducible, not a secret).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// One server role run with `n` clients: start-up, idle cost, then Fig. 2's cells.
fn server_run(
    lab: &ServerLab,
    mt6d: &Path,
    work: &Path,
    n: usize,
    args: &ServerArgs,
) -> Result<Value, String> {
    let spec = ServerLab::spec(1, Duration::from_secs_f64(ROTATION_SECS), true);
    let dir = work.join(format!("n{n}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    peers_file(&dir.join("clients"), &spec, n)?;
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        ServerLab::server_config(ROTATION_SECS, 2, &dir.join("state")),
    )
    .map_err(|e| e.to_string())?;
    let client_ns = &lab.clients[0];
    client_ns
        .run(|| ClientSet::install(&spec, "mt6d_bench_gen", GEN_PORT))
        .map_err(|e| e.to_string())??;
    // The generator's side first (its own build is not the server's start-up).
    let t = Instant::now();
    let mut set = client_ns
        .run(|| ClientSet::new(&spec, n, GEN_PORT, mt6d::daemon::clock::now()))
        .map_err(|e| e.to_string())??;
    eprintln!(
        "  generator: {n} clients in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let mut cmd = lab.server.command(mt6d).map_err(|e| e.to_string())?;
    cmd.arg("run").arg("-c").arg(&config);
    let log = dir.join("server.log");
    let start = Instant::now();
    let mut daemon = Guarded::spawn("server", cmd, Some(&log))?;
    // The generator's windows are kept current while the server starts (a million clients'
    // boundaries pass during it; a backlog would stall the first request).
    let ready = wait_line(
        &log,
        "serving ",
        Duration::from_secs(300),
        &mut daemon,
        || {
            set.step(mt6d::daemon::clock::now());
        },
    )?;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = echo_service(&lab.server, SERVER_TRUE, ECHO_PORT, FACTOR, stop.clone())?;
    // The first answer to a random client.
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ n as u64);
    // The generator's sockets live in the client namespace; this thread need not.
    let first_answer = (|| -> Result<f64, String> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let i = rng.below(n);
            set.send(&spec, i, ECHO_PORT, &[0u8; REQUEST])?;
            std::thread::sleep(Duration::from_millis(2));
            let mut got = false;
            set.recv_with(|_, _| got = true)?;
            if got {
                return Ok(start.elapsed().as_secs_f64());
            }
            if Instant::now() > deadline {
                return Err("no answer within 30 s of the serving line".into());
            }
        }
    })()?;
    let pid = daemon.pid().ok_or("server exited")?;
    // Idle: what rotation costs (a 10 s interval, every client's boundary passes once).
    let a = ProcSample::read(pid).ok_or("server gone")?;
    let idle = Instant::now();
    while idle.elapsed() < Duration::from_secs_f64(ROTATION_SECS + 1.0) {
        std::thread::sleep(Duration::from_millis(20));
        set.step(mt6d::daemon::clock::now());
    }
    let b = ProcSample::read(pid).ok_or("server gone")?;
    let idle = crate::procs::window(&a, &b);
    eprintln!(
        "  ready {ready:.2} s, first answer {first_answer:.2} s, RSS {} MB, idle CPU {:.2} %",
        b.rss_kb / 1024,
        idle.get("cpu_percent")
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    );
    let mut cells = Vec::new();
    for &rate in &args.rates {
        let c = cell(
            &mut Tunnelled {
                set: &mut set,
                spec: &spec,
            },
            n,
            rate,
            args.cell,
            &mut rng,
        )?;
        eprintln!(
            "  {rate}/s: answered {:.1} %, mean {:.3} ms, p99 {:.3} ms, class {}",
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
    let end = ProcSample::read(pid).ok_or("server gone")?;
    let idle_rss_kb = b.rss_kb;
    daemon.stop(Duration::from_secs(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    let mut v = Value::obj();
    v.set("clients", n as u64)
        .set("ready_secs", ready)
        .set("first_answer_secs", first_answer)
        .set("rss_kb", idle_rss_kb)
        .set(
            "rss_bytes_per_client",
            idle_rss_kb as f64 * 1024.0 / n as f64,
        )
        .set("rss_after_cells_kb", end.rss_kb)
        .set("idle_cpu", idle)
        .set(
            "server_counters",
            server_log
                .lines()
                .rev()
                .find(|l| l.contains("counters:"))
                .unwrap_or("")
                .to_string(),
        )
        .set("cells", Value::Array(cells));
    Ok(v)
}

/// One generator thread's share of a handshake run's clients: its own hashed /64 (routed to
/// the client namespace), receiving port and sockets, so no thread waits for another.
struct Shard {
    set: HandshakeClients,
}

/// The hashed /64 of generator thread `s` in the client namespace: 2001:db8:c1:1ss::/64 (the
/// lab routes only 2001:db8:c1::/64 there; the run adds these).
fn shard_prefix(s: usize) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0x2001, 0xdb8, 0xc1, 0x100 + s as u16, 0, 0, 0, 0)
}

/// The receiving port of generator thread `s`.
fn shard_port(s: usize) -> u16 {
    GEN_PORT + 10 + s as u16
}

/// How often a generator thread looks through its clients under way for a retry that is due
/// (the handshake's backoff is 1 s or more, a request's 1 s): not on every turn of its loop,
/// where it would cost O(clients under way) each time.
const RETRY_SCAN: Duration = Duration::from_millis(10);

/// The `p` quantile (0-1) of sorted `v`, NaN for none.
fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

/// What one generator thread measured in one phase.
#[derive(Debug, Default)]
struct ShardRun {
    /// Seconds from the phase's origin to each client served, in order.
    served: Vec<f64>,
    /// Storm only: seconds from each served client's first recovery initiation to its service.
    waited: Vec<f64>,
    /// Storm only: seconds from the phase's origin to each client's first recovery initiation.
    first_initiation: Vec<f64>,
    /// CPU seconds the thread used in the phase.
    cpu_secs: f64,
    /// The longest turn of the thread's loop, in seconds: how long its clients went unattended.
    longest_turn: f64,
}

/// Cold start of one generator thread's clients: initiates for all of them, at most
/// `in_flight_max` under way, retrying on the handshake's own backoff and each unanswered
/// request every [`handshake_clients::REQUEST_RETRY`], until each is served. Times are from
/// `start`.
fn bring_up(
    set: &mut HandshakeClients,
    start: Instant,
    in_flight_max: usize,
    abort: &std::sync::atomic::AtomicBool,
) -> Result<ShardRun, String> {
    use mt6d::daemon::clock;
    use std::sync::atomic::Ordering;
    let cpu0 = crate::procs::thread_cpu_secs().unwrap_or(0.0);
    let n = set.len();
    let mut run = ShardRun {
        served: Vec::with_capacity(n),
        ..ShardRun::default()
    };
    let mut in_flight: Vec<usize> = Vec::with_capacity(in_flight_max);
    let mut next = 0;
    let mut scanned = Instant::now();
    while run.served.len() < n && start.elapsed() < COLD_START_LIMIT {
        if abort.load(Ordering::Relaxed) {
            return Err("stopped".into());
        }
        let now = clock::now();
        set.step(now);
        while in_flight.len() < in_flight_max && next < n {
            set.initiate(next, now)?;
            in_flight.push(next);
            next += 1;
        }
        let before = run.served.len();
        set.recv(now, |_| run.served.push(start.elapsed().as_secs_f64()))?;
        if run.served.len() != before {
            in_flight.retain(|&i| !set.is_up(i));
        }
        if scanned.elapsed() >= RETRY_SCAN {
            for &i in &in_flight {
                set.initiate(i, now)?;
            }
            set.retry_requests(now)?;
            scanned = Instant::now();
        }
        if run.served.len() == before {
            std::thread::sleep(Duration::from_micros(300));
        }
    }
    run.cpu_secs = crate::procs::thread_cpu_secs().unwrap_or(0.0) - cpu0;
    Ok(run)
}

/// One generator thread's clients through a server restart: from `stopped`, client `i` of
/// `fails_at` loses its session at its instant (seconds from `stopped`) and initiates its
/// recovery handshake, retrying on the handshake's backoff (into the void while the server is
/// down, as a real client does), until every one is served again. Times are from `stopped`.
fn recover(
    set: &mut HandshakeClients,
    stopped: Instant,
    fails_at: &[(f64, usize)],
    abort: &std::sync::atomic::AtomicBool,
) -> Result<ShardRun, String> {
    use mt6d::daemon::clock;
    use std::sync::atomic::Ordering;
    let cpu0 = crate::procs::thread_cpu_secs().unwrap_or(0.0);
    let n = set.len();
    let mut run = ShardRun {
        served: Vec::with_capacity(n),
        waited: Vec::with_capacity(n),
        first_initiation: Vec::with_capacity(n),
        ..ShardRun::default()
    };
    let mut first = vec![f64::NAN; n];
    let mut failing: Vec<usize> = Vec::with_capacity(n);
    let mut next_fail = 0;
    let mut scanned = Instant::now();
    let mut turn = Instant::now();
    while run.served.len() < n && stopped.elapsed() < STORM_LIMIT {
        if abort.load(Ordering::Relaxed) {
            return Err("stopped".into());
        }
        run.longest_turn = run.longest_turn.max(turn.elapsed().as_secs_f64());
        turn = Instant::now();
        let now = clock::now();
        set.step(now);
        let since = stopped.elapsed().as_secs_f64();
        while next_fail < fails_at.len() && fails_at[next_fail].0 <= since {
            let i = fails_at[next_fail].1;
            set.lose_session(i);
            set.initiate(i, clock::now())?;
            let t = stopped.elapsed().as_secs_f64();
            first[i] = t;
            run.first_initiation.push(t);
            failing.push(i);
            next_fail += 1;
        }
        let before = run.served.len();
        set.recv(now, |i| {
            let t = stopped.elapsed().as_secs_f64();
            run.served.push(t);
            run.waited.push(t - first[i]);
        })?;
        if scanned.elapsed() >= RETRY_SCAN {
            failing.retain(|&i| !set.is_up(i));
            for &i in &failing {
                set.initiate(i, now)?;
            }
            set.retry_requests(now)?;
            scanned = Instant::now();
        }
        if run.served.len() == before {
            std::thread::sleep(Duration::from_micros(300));
        }
    }
    run.cpu_secs = crate::procs::thread_cpu_secs().unwrap_or(0.0) - cpu0;
    Ok(run)
}

/// Runs `f` on every shard, one scoped thread each, while the calling thread runs `main`
/// (which may control the server); `abort` is set if `main` fails, so the shards give up.
fn on_shards<M>(
    shards: &mut [Shard],
    abort: &std::sync::atomic::AtomicBool,
    main: impl FnOnce() -> Result<M, String>,
    f: impl Fn(usize, &mut HandshakeClients) -> Result<ShardRun, String> + Sync,
) -> Result<(M, Vec<ShardRun>), String> {
    use std::sync::atomic::Ordering;
    std::thread::scope(|scope| {
        let f = &f;
        let handles: Vec<_> = shards
            .iter_mut()
            .enumerate()
            .map(|(k, sh)| scope.spawn(move || f(k, &mut sh.set)))
            .collect();
        let m = main();
        if m.is_err() {
            abort.store(true, Ordering::Relaxed);
        }
        let runs: Vec<Result<ShardRun, String>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect();
        let m = m?;
        Ok((m, runs.into_iter().collect::<Result<Vec<_>, _>>()?))
    })
}

/// A server with `n` handshake clients started cold, and every client served: the generator
/// (`threads` threads, each with its share of the clients) initiates for all of them, at most
/// [`IN_FLIGHT`] under way in all, retrying on the handshake's own backoff, until each has
/// completed its handshake and had its first request answered by the echo service behind the
/// server (authenticated data from the server, under the new keys).
fn handshake_run(
    lab: &ServerLab,
    mt6d: &Path,
    work: &Path,
    n: usize,
    threads: usize,
) -> Result<Value, String> {
    use mt6d::daemon::clock;
    let threads = threads.clamp(1, n.max(1));
    let base = ServerLab::spec(1, Duration::from_secs_f64(ROTATION_SECS), true);
    let shares: Vec<(ClientSpec, std::ops::Range<usize>)> = (0..threads)
        .map(|s| {
            let mut spec = base.clone();
            spec.client_prefix = shard_prefix(s);
            (spec, n * s / threads..n * (s + 1) / threads)
        })
        .collect();
    let dir = work.join(format!("hs{n}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // The server's identity (a lab key, fixed: not a secret).
    let server_key = mt6d_proto::handshake::PrivateKey::generate([0x5e; 32]);
    mt6d::keys::write_secret_file(
        &dir.join("server.key"),
        &mt6d::keys::encode(&server_key.to_bytes()[..]),
    )
    .map_err(|e| e.to_string())?;
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt;
        let path = dir.join("clients");
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mut w = std::io::BufWriter::new(f);
        for (spec, range) in &shares {
            for i in range.clone() {
                w.write_all(handshake_clients::peers_line(spec, &format!("c{i}"), i).as_bytes())
                    .map_err(|e| e.to_string())?;
            }
        }
        w.flush().map_err(|e| e.to_string())?;
    }
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "{}private_key_file = \"server.key\"\n",
            ServerLab::server_config(ROTATION_SECS, 2, &dir.join("state"))
        ),
    )
    .map_err(|e| e.to_string())?;
    let client_ns = &lab.clients[0];
    let t = Instant::now();
    let mut shards = Vec::with_capacity(threads);
    for (s, (spec, range)) in shares.iter().enumerate() {
        let prefix = format!("{}/64", spec.client_prefix);
        mt6d_lab::topology::ip(
            &lab.router,
            &["-6", "route", "replace", &prefix, "via", "2001:db8:f1::2"],
        )
        .map_err(|e| e.to_string())?;
        client_ns
            .run(|| ClientSet::install(spec, &format!("mt6d_bench_hs{s}"), shard_port(s)))
            .map_err(|e| e.to_string())??;
        let set = client_ns
            .run(|| {
                HandshakeClients::new(
                    spec,
                    server_key.public_key(),
                    range.clone(),
                    ECHO_PORT,
                    shard_port(s),
                    clock::now(),
                )
            })
            .map_err(|e| e.to_string())??;
        shards.push(Shard { set });
    }
    eprintln!(
        "  generator: {n} clients on {threads} threads in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    let mut cmd = lab.server.command(mt6d).map_err(|e| e.to_string())?;
    cmd.arg("run").arg("-c").arg(&config);
    let log = dir.join("server.log");
    let mut daemon = Guarded::spawn("server", cmd, Some(&log))?;
    let ready = wait_line(
        &log,
        "serving ",
        Duration::from_secs(300),
        &mut daemon,
        || {
            let now = clock::now();
            for sh in shards.iter_mut() {
                sh.set.step(now);
            }
        },
    )?;
    // 002's echo service behind the server, answering each request once: a client is served
    // when its answer comes back. Its socket stays bound across the restart (the address
    // comes back with the new process's TUN device).
    let stop_echo = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let echo = echo_service(&lab.server, SERVER_TRUE, ECHO_PORT, 1, stop_echo.clone())?;
    let result = handshake_phases(
        lab,
        mt6d,
        &config,
        &dir,
        &log,
        n,
        threads,
        ready,
        &mut daemon,
        &mut shards,
    );
    stop_echo.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    daemon.stop(Duration::from_secs(20));
    result
}

/// The cold start and the restart storm of [`handshake_run`], with the server started.
#[allow(clippy::too_many_arguments)]
fn handshake_phases(
    lab: &ServerLab,
    mt6d: &Path,
    config: &Path,
    dir: &Path,
    log: &Path,
    n: usize,
    threads: usize,
    ready: f64,
    daemon: &mut Guarded,
    shards: &mut [Shard],
) -> Result<Value, String> {
    let pid = daemon.pid().ok_or("server exited")?;
    let a = ProcSample::read(pid).ok_or("server gone")?;
    let abort = std::sync::atomic::AtomicBool::new(false);
    let start = Instant::now();
    let per_thread = (IN_FLIGHT / threads).max(1);
    let ((), runs) = on_shards(
        shards,
        &abort,
        || Ok(()),
        |_, set| bring_up(set, start, per_thread, &abort),
    )?;
    let b = ProcSample::read(pid).ok_or("server gone")?;
    let busy = crate::procs::window(&a, &b);
    let mut up_at: Vec<f64> = runs.iter().flat_map(|r| r.served.iter().copied()).collect();
    up_at.sort_by(f64::total_cmp);
    let gen_cpu: f64 = runs.iter().map(|r| r.cpu_secs).sum();
    let all_up = up_at.len() == n;
    let total = up_at.last().copied().unwrap_or(0.0);
    // The steady rate: between the 10th and the 90th percentile of completions.
    let rate = if up_at.len() >= 10 {
        let (lo, hi) = (up_at[up_at.len() / 10], up_at[up_at.len() * 9 / 10]);
        (up_at.len() * 8 / 10) as f64 / (hi - lo).max(1e-9)
    } else {
        up_at.len() as f64 / total.max(1e-9)
    };
    let counters = |shards: &[Shard]| {
        shards.iter().fold(
            mt6d_lab::handshake_clients::HandshakeCounters::default(),
            |mut t, sh| {
                let c = sh.set.counters;
                t.initiations += c.initiations;
                t.completed += c.completed;
                t.requests += c.requests;
                t.served += c.served;
                t.late += c.late;
                t.lost += c.lost;
                t.wrong_route += c.wrong_route;
                t.rejected += c.rejected;
                t
            },
        )
    };
    let cold = counters(shards);
    eprintln!(
        "  ready {ready:.2} s; {} of {n} served in {total:.2} s, {rate:.0} handshakes/s, {} initiations, {} requests, server CPU {:.0} %, generator {:.0} us per handshake on {threads} threads",
        up_at.len(),
        cold.initiations,
        cold.requests,
        busy.get("cpu_percent")
            .and_then(Value::as_f64)
            .unwrap_or(0.0),
        gen_cpu / up_at.len().max(1) as f64 * 1e6,
    );
    let restart = if all_up {
        eprintln!("mt6d bench --server: handshakes, {n} clients, the server restarted");
        Some(restart_storm(daemon, shards, lab, mt6d, config, dir, n)?)
    } else {
        None
    };
    let server_log = std::fs::read_to_string(log).unwrap_or_default();
    let mut v = Value::obj();
    if let Some(r) = restart {
        v.set("restart", r);
    }
    v.set("clients", n as u64)
        .set("generator_threads", threads as u64)
        .set("ready_secs", ready)
        .set("all_up", all_up)
        .set("up", up_at.len() as u64)
        .set("all_up_secs", total)
        .set("handshakes_per_sec", rate)
        .set("initiations", cold.initiations)
        .set("requests", cold.requests)
        .set("rejected", cold.rejected)
        .set("wrong_route", cold.wrong_route)
        .set("in_flight", IN_FLIGHT as u64)
        .set(
            "generator_us_per_handshake",
            gen_cpu / up_at.len().max(1) as f64 * 1e6,
        )
        .set("rss_before_kb", a.rss_kb)
        .set("rss_all_up_kb", b.rss_kb)
        .set(
            "rss_bytes_per_session",
            (b.rss_kb.saturating_sub(a.rss_kb)) as f64 * 1024.0 / n.max(1) as f64,
        )
        .set("server_busy", busy)
        .set(
            "server_counters",
            server_log
                .lines()
                .rev()
                .find(|l| l.contains("counters:"))
                .unwrap_or("")
                .to_string(),
        );
    Ok(v)
}

/// The server of a handshake run, every client served, is stopped (SIGTERM) and started again
/// while every client keeps sending data: each client notices its first unanswered packet
/// within a second (uniform), and then starts its recovery handshake by the liveness rule
/// (docs/PROTOCOL.md §9.9: `LIVENESS_AFTER` plus up to `LIVENESS_JITTER`, on its link set,
/// retries at most 2 s apart plus jitter). A client is served again when the echo's answer to
/// its first request under the new keys came back. Measured: from the new process's "serving"
/// line to each client served again (p50, p99, max); from each client's first recovery
/// initiation to its service (the part a faster server or generator can shorten); the server's
/// and the generator's CPU per handshake over the same storm; the machine's busy cores; the
/// kernel's UDP drops in both namespaces.
fn restart_storm(
    daemon: &mut Guarded,
    shards: &mut [Shard],
    lab: &ServerLab,
    mt6d: &Path,
    config: &Path,
    dir: &Path,
    n: usize,
) -> Result<Value, String> {
    use mt6d_proto::liveness::{LIVENESS_AFTER, LIVENESS_JITTER};
    let sum = |shards: &[Shard]| -> (u64, u64) {
        shards.iter().fold((0, 0), |(i, r), sh| {
            (
                i + sh.set.counters.initiations,
                r + sh.set.counters.requests,
            )
        })
    };
    let (initiations_before, requests_before) = sum(shards);
    let refused = |shards: &[Shard]| -> (u64, u64, u64, u64) {
        shards.iter().fold((0, 0, 0, 0), |(r, w, l, x), sh| {
            let c = &sh.set.counters;
            (r + c.rejected, w + c.wrong_route, l + c.late, x + c.lost)
        })
    };
    let refused_before = refused(shards);
    let drops = || -> Result<(Value, Value), String> {
        let names = ["RcvbufErrors", "InErrors", "SndbufErrors"];
        let read = |ns: &mt6d_os::Netns| -> Result<Value, String> {
            let mut v = Value::obj();
            for (k, c) in
                mt6d_lab::kernel_counters::kernel_drops(ns, &names).map_err(|e| e.to_string())?
            {
                if k.starts_with("Udp6") {
                    v.set(&k, c);
                }
            }
            Ok(v)
        };
        Ok((read(&lab.clients[0])?, read(&lab.server)?))
    };
    let drops_before = drops()?;
    // Each client's instant of failure, from the stop: its notice lag, then its deadline.
    let mut rng = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0x9e37_79b9, |d| d.as_nanos() as u64)
        | 1;
    let mut uniform = |max: f64| {
        // xorshift64: spread only, not a secret.
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng >> 11) as f64 / (1u64 << 53) as f64 * max
    };
    let fails: Vec<Vec<(f64, usize)>> = shards
        .iter()
        .map(|sh| {
            let mut f: Vec<(f64, usize)> = (0..sh.set.len())
                .map(|i| {
                    let t = uniform(1.0)
                        + LIVENESS_AFTER.as_secs_f64()
                        + uniform(LIVENESS_JITTER.as_secs_f64());
                    (t, i)
                })
                .collect();
            f.sort_by(|a, b| a.0.total_cmp(&b.0));
            f
        })
        .collect();
    let log = dir.join("server-restarted.log");
    let abort = std::sync::atomic::AtomicBool::new(false);
    let stopped = Instant::now();
    let ((down_secs, ready_at, back, pid, a, m_a), runs) = on_shards(
        shards,
        &abort,
        || {
            daemon.stop(Duration::from_secs(20));
            let down_secs = stopped.elapsed().as_secs_f64();
            let mut cmd = lab.server.command(mt6d).map_err(|e| e.to_string())?;
            cmd.arg("run").arg("-c").arg(config);
            *daemon = Guarded::spawn("server", cmd, Some(&log))?;
            // The generator threads tick on their own; this thread only watches the log.
            let ready_at = wait_line(&log, "serving ", Duration::from_secs(300), daemon, || {})?;
            let back = stopped.elapsed().as_secs_f64();
            let pid = daemon.pid().ok_or("server exited")?;
            let a = ProcSample::read(pid).ok_or("server gone")?;
            let m_a = crate::procs::machine_jiffies().unwrap_or((0, 0));
            Ok((down_secs, ready_at, back, pid, a, m_a))
        },
        |k, set| recover(set, stopped, &fails[k], &abort),
    )?;
    let b = ProcSample::read(pid).ok_or("server gone")?;
    let m_b = crate::procs::machine_jiffies().unwrap_or((0, 0));
    let drops_after = drops()?;
    let busy = crate::procs::window(&a, &b);
    // From the server's "serving" line. A client served before that cannot be.
    let mut up_at: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.served.iter().map(|t| t - back))
        .collect();
    up_at.sort_by(f64::total_cmp);
    let mut waited: Vec<f64> = runs.iter().flat_map(|r| r.waited.iter().copied()).collect();
    waited.sort_by(f64::total_cmp);
    let mut first_init: Vec<f64> = runs
        .iter()
        .flat_map(|r| r.first_initiation.iter().map(|t| t - back))
        .collect();
    first_init.sort_by(f64::total_cmp);
    let cpu = busy
        .get("cpu_percent")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let storm_secs = b.uptime - a.uptime;
    let served = up_at.len().max(1) as f64;
    let (initiations, requests) = {
        let (i, r) = sum(shards);
        (i - initiations_before, r - requests_before)
    };
    let (rejected, wrong_route, late, lost) = {
        let (r, w, l, x) = refused(shards);
        (
            r - refused_before.0,
            w - refused_before.1,
            l - refused_before.2,
            x - refused_before.3,
        )
    };
    // Per quarter second from the "serving" line: first recovery initiations and clients
    // served (where the time goes: the liveness rule's delay, then the queue).
    let timeline = |v: &[f64]| -> Value {
        let mut bins: Vec<u64> = Vec::new();
        for &t in v {
            let k = (t.max(0.0) * 4.0) as usize;
            if bins.len() <= k {
                bins.resize(k + 1, 0);
            }
            bins[k] += 1;
        }
        Value::Array(bins.into_iter().map(Value::from).collect())
    };
    // CPU per handshake answered and its first request served, server and generator, over
    // the same storm: the figures that travel to another machine or client count.
    let server_us = cpu / 100.0 * storm_secs / served * 1e6;
    let gen_cpu: f64 = runs.iter().map(|r| r.cpu_secs).sum();
    let gen_us = gen_cpu / served * 1e6;
    let longest_turn = runs.iter().map(|r| r.longest_turn).fold(0.0, f64::max);
    let machine_cores = {
        let (busy_j, all_j) = (m_b.0.saturating_sub(m_a.0), m_b.1.saturating_sub(m_a.1));
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        if all_j == 0 {
            f64::NAN
        } else {
            busy_j as f64 / all_j as f64 * cores as f64
        }
    };
    eprintln!(
        "  restart: stopped in {down_secs:.2} s, ready {ready_at:.2} s after start; {} of {n} served again, p50 {:.2} s, p99 {:.2} s, max {:.2} s after ready (first recovery initiation p50 {:.2} s, max {:.2} s; from it to served p50 {:.2} s, p99 {:.2} s, max {:.2} s); {initiations} initiations, {requests} requests ({late} answers after the first, {lost} sessions given up unanswered), {rejected} rejected, {wrong_route} to no route; over {storm_secs:.2} s server CPU {cpu:.0} % ({server_us:.0} us per handshake), generator {gen_us:.0} us per handshake on {} threads (longest turn {longest_turn:.3} s), machine {machine_cores:.2} cores busy",
        up_at.len(),
        quantile(&up_at, 0.5),
        quantile(&up_at, 0.99),
        quantile(&up_at, 1.0),
        quantile(&first_init, 0.5),
        quantile(&first_init, 1.0),
        quantile(&waited, 0.5),
        quantile(&waited, 0.99),
        quantile(&waited, 1.0),
        shards.len(),
    );
    let server_log = std::fs::read_to_string(&log).unwrap_or_default();
    let mut v = Value::obj();
    v.set("stop_secs", down_secs)
        .set("ready_secs", ready_at)
        .set("ready_after_stop_secs", back)
        .set("served_again", up_at.len() as u64)
        .set("p50_secs", quantile(&up_at, 0.5))
        .set("p99_secs", quantile(&up_at, 0.99))
        .set("max_secs", quantile(&up_at, 1.0))
        .set("first_initiation_p50_secs", quantile(&first_init, 0.5))
        .set("first_initiation_max_secs", quantile(&first_init, 1.0))
        .set("initiation_to_served_p50_secs", quantile(&waited, 0.5))
        .set("initiation_to_served_p99_secs", quantile(&waited, 0.99))
        .set("initiation_to_served_max_secs", quantile(&waited, 1.0))
        .set("initiations", initiations)
        .set("requests", requests)
        .set("late_answers", late)
        .set("sessions_given_up", lost)
        .set("rejected", rejected)
        .set("wrong_route", wrong_route)
        .set("timeline_bin_secs", 0.25)
        .set("timeline_first_initiations", timeline(&first_init))
        .set("timeline_served", timeline(&up_at))
        .set("storm_secs", storm_secs)
        .set("server_us_per_handshake", server_us)
        .set("generator_us_per_handshake", gen_us)
        .set("generator_threads", shards.len() as u64)
        .set("generator_longest_turn_secs", longest_turn)
        .set("machine_busy_cores", machine_cores)
        .set("server_busy", busy)
        .set("udp_drops_before_clients", drops_before.0)
        .set("udp_drops_before_server", drops_before.1)
        .set("udp_drops_after_clients", drops_after.0)
        .set("udp_drops_after_server", drops_after.1)
        .set(
            "server_counters",
            server_log
                .lines()
                .rev()
                .find(|l| l.contains("counters:"))
                .unwrap_or("")
                .to_string(),
        );
    Ok(v)
}

/// The netlink method's load (002's server): plain UDP from the client namespace to a random
/// one of the server's bound addresses; an answer must come from the address asked.
struct Plain {
    socket: std::net::UdpSocket,
    addresses: Vec<std::net::Ipv6Addr>,
    /// The address each request went to, by sequence number.
    asked: Vec<Option<std::net::Ipv6Addr>>,
    wrong_source: u64,
    rejected: u64,
    buf: Vec<u8>,
}

impl Load for Plain {
    fn fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        self.socket.as_raw_fd()
    }
    fn tick(&mut self) -> usize {
        0
    }
    fn send(
        &mut self,
        who: &[usize],
        fill: &mut dyn FnMut(usize, &mut [u8]) -> usize,
    ) -> Result<(), String> {
        for (k, &i) in who.iter().enumerate() {
            let to = self.addresses[i % self.addresses.len()];
            let len = fill(k, &mut self.buf);
            let seq = u64::from_le_bytes(self.buf[..8].try_into().unwrap_or([0; 8])) as usize;
            if self.asked.len() <= seq {
                self.asked.resize(seq + 1, None);
            }
            self.asked[seq] = Some(to);
            // A full socket buffer loses the request, as a lost datagram would.
            let _ = self.socket.send_to(
                &self.buf[..len],
                std::net::SocketAddrV6::new(to, ECHO_PORT, 0, 0),
            );
        }
        Ok(())
    }
    fn recv(&mut self, on_reply: &mut dyn FnMut(&[u8])) -> Result<(), String> {
        let mut buf = [0u8; 2048];
        loop {
            match self.socket.recv_from(&mut buf) {
                Ok((len, from)) => {
                    let std::net::SocketAddr::V6(from) = from else {
                        self.rejected += 1;
                        continue;
                    };
                    let seq = buf
                        .get(..8)
                        .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as usize);
                    match seq.and_then(|s| self.asked.get(s).copied().flatten()) {
                        Some(a) if a == *from.ip() => on_reply(&buf[..len]),
                        Some(_) => self.wrong_source += 1,
                        None => self.rejected += 1,
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(e.to_string()),
            }
        }
    }
    fn faults(&self) -> (u64, u64) {
        (self.wrong_source, self.rejected)
    }
}

/// 002's server: a UDP echo on `[::]:port` of `ns` answering `factor` times each request from
/// the address it was sent to (IPV6_PKTINFO), until `stop`.
fn addressed_echo(
    ns: &Netns,
    port: u16,
    factor: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let name = ns.name().to_string();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let h = std::thread::spawn(move || {
        let sock = Netns::open(&name)
            .and_then(|n| n.enter_current_thread())
            .and_then(|()| mt6d_os::UdpSocket6::bind(port));
        let sock = match sock {
            Ok(s) => s,
            Err(e) => {
                let _ = ready_tx.send(Err(e.to_string()));
                return;
            }
        };
        let _ = sock.set_read_timeout(Some(Duration::from_millis(50)));
        let _ = ready_tx.send(Ok(()));
        let mut scratch = mt6d_os::RecvScratch::new(32);
        let mut bufs: Vec<mt6d_os::udp::RecvBuf> =
            (0..32).map(|_| mt6d_os::udp::RecvBuf::new()).collect();
        let mut send = mt6d_os::SendScratch::new(1);
        let mut reply = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(got) = sock.recv_batch(&mut scratch, &mut bufs) else {
                continue;
            };
            for b in &bufs[..got] {
                for d in b.datagrams() {
                    reply.clear();
                    for _ in 0..factor {
                        reply.extend_from_slice(d);
                    }
                    let msg = [mt6d_os::SendMsg {
                        src: b.dst(),
                        dst: b.src(),
                        payload: &reply,
                        segment_size: None,
                    }];
                    let _ = sock.send_batch(&mut send, &msg);
                }
            }
        }
    });
    match ready_rx.recv_timeout(Duration::from_secs(5)) {
        Ok(Ok(())) => Ok(h),
        Ok(Err(e)) => Err(format!("echo on [::]:{port}: {e}")),
        Err(_) => Err(format!("echo on [::]:{port} did not start")),
    }
}

/// Fig. 2 for the netlink method (002's server): `n` /128s of the server's prefix bound on a
/// veth interface of its own in the server's namespace with one `ip -batch` (the router routes the
/// prefix to the server, so nothing is resolved per address), the addressed echo on port
/// 3540, and plain UDP requests from the client namespace to a random bound address, cell by
/// cell as the server role's. No tunnel: this is 002's measurement of what per-address
/// binding costs the kernel, not MT6D's.
fn fig2_netlink(lab: &ServerLab, args: &ServerArgs) -> Result<Value, String> {
    let sh = |ns: &Netns, cmd: &str| -> Result<(), String> {
        let o = ns
            .command("sh")
            .map_err(|e| e.to_string())?
            .args(["-c", cmd])
            .output()
            .map_err(|e| e.to_string())?;
        if o.status.success() {
            Ok(())
        } else {
            Err(format!("{cmd}: {}", String::from_utf8_lossy(&o.stderr)))
        }
    };
    let mut runs = Vec::new();
    for &n in &args.netlink_fig2 {
        // A veth end of its own (this kernel has no dummy device): deleting it takes the
        // addresses with it.
        sh(
            &lab.server,
            "ip link add nl0 type veth peer name nl1 && ip link set nl0 up && ip link set nl1 up",
        )?;
        let addresses: Vec<std::net::Ipv6Addr> = (0..n)
            .map(|i| {
                std::net::Ipv6Addr::from((0x2001_0db8_0005_u128 << 80) | (i as u128 * 7919 + 1))
            })
            .collect();
        let file = std::env::temp_dir().join(format!("mt6d-fig2-{}", std::process::id()));
        let batch: String = addresses
            .iter()
            .map(|a| format!("addr add {a}/128 dev nl0 nodad\n"))
            .collect();
        std::fs::write(&file, batch).map_err(|e| e.to_string())?;
        let t = Instant::now();
        sh(&lab.server, &format!("ip -batch {}", file.display()))?;
        let bind_secs = t.elapsed().as_secs_f64();
        let _ = std::fs::remove_file(&file);
        eprintln!("  netlink method: {n} addresses bound in {bind_secs:.2} s");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let echo = addressed_echo(&lab.server, ECHO_PORT, FACTOR, stop.clone())?;
        let socket = lab.clients[0]
            .run(|| {
                let s = std::net::UdpSocket::bind("[::]:0")?;
                s.set_nonblocking(true)?;
                Ok::<_, std::io::Error>(s)
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        let mut load = Plain {
            socket,
            addresses,
            asked: Vec::with_capacity(args.cell),
            wrong_source: 0,
            rejected: 0,
            buf: vec![0u8; 2048],
        };
        let mut rng = Rng(0x2545_f491_4f6c_dd1d ^ n as u64);
        let mut cells = Vec::new();
        for &rate in &args.rates {
            load.asked.clear();
            let c = cell(&mut load, n, rate, args.cell, &mut rng)?;
            eprintln!(
                "  netlink {n} @ {rate}/s: answered {:.1} %, mean {:.3} ms, p99 {:.3} ms, class {}",
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
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = echo.join();
        // Removing the device removes its addresses (slowly, with tens of thousands).
        sh(&lab.server, "ip link del nl0")?;
        let mut v = Value::obj();
        v.set("addresses", n as u64)
            .set("bind_secs", bind_secs)
            .set("cells", Value::Array(cells));
        runs.push(v);
    }
    Ok(Value::Array(runs))
}

/// Waits for `needle` in the log; returns the seconds since the daemon was started.
fn wait_line(
    log: &Path,
    needle: &str,
    limit: Duration,
    d: &mut Guarded,
    mut tick: impl FnMut(),
) -> Result<f64, String> {
    let start = Instant::now();
    loop {
        tick();
        if std::fs::read_to_string(log).is_ok_and(|t| t.contains(needle)) {
            return Ok(start.elapsed().as_secs_f64());
        }
        if let Some(e) = d.exited() {
            return Err(format!("server exited: {e}\n{}", d.log_tail(20)));
        }
        if start.elapsed() > limit {
            return Err(format!(
                "no {needle:?} within {limit:?}\n{}",
                d.log_tail(20)
            ));
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Clients the generator rotates at a time (about 2.5 us each at a million clients), and the
/// longest it rotates between two looks at its sends and answers. The loop comes round at
/// least every millisecond, so this keeps up with a million clients' 100,000 boundaries a
/// second at a 10 s rotation.
const GENERATOR_STEP: usize = 16;
const GENERATOR_BUDGET: Duration = Duration::from_micros(250);
/// A catch-up round that advanced at most this many clients (5 ms of boundaries at a million
/// clients and a 10 s interval) leaves the rest to the cell's own steps.
const CAUGHT_UP: usize = 500;

/// One Fig. 2 cell: `count` requests at `rate` per second, each from a random client.
/// What Fig. 2 drives: requests from random clients, answers back. The server role's load is
/// the many-client generator through the tunnel; the netlink method's is plain UDP to its
/// bound addresses.
trait Load {
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
}

/// The server role's load: the generator's clients through the tunnel.
struct Tunnelled<'a> {
    set: &'a mut ClientSet,
    spec: &'a ClientSpec,
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
}

fn cell(
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
    let mut sent_at = vec![0u64; count];
    let mut rtt_us: Vec<f32> = Vec::with_capacity(count);
    let mut answered = vec![false; count];
    let interval_ns = 1e9 / rate as f64;
    let mut seq = 0usize;
    let mut who = Vec::with_capacity(32);
    // The windows are brought up to date first: the set may have sat idle for an epoch or more
    // (at a million clients that is seconds of work). The cell's clock starts after it: started
    // before, the sender would find itself seconds behind and send that backlog at once.
    // Rotating takes long enough at a million clients that more boundaries pass meanwhile:
    // again until a round finds less than a few milliseconds' worth.
    while load.tick() > CAUGHT_UP {}
    let start = Instant::now();
    let on_reply =
        |payload: &[u8], answered: &mut [bool], rtt_us: &mut Vec<f32>, sent_at: &[u64]| {
            let Some(s) = payload.get(..8) else { return };
            let s = u64::from_le_bytes(s.try_into().unwrap_or([0; 8])) as usize;
            if s < answered.len() && !answered[s] && payload.len() == REQUEST * FACTOR {
                answered[s] = true;
                let now = start.elapsed().as_nanos() as u64;
                rtt_us.push(now.saturating_sub(sent_at[s]) as f32 / 1e3);
            }
        };
    while seq < count {
        let now_ns = start.elapsed().as_nanos() as f64;
        let due = ((now_ns / interval_ns) as usize + 1).min(count);
        if due > seq {
            let k = (due - seq).min(32);
            who.clear();
            for _ in 0..k {
                who.push(rng.below(n));
            }
            let base = seq;
            let t = start.elapsed().as_nanos() as u64;
            load.send(&who, &mut |j, buf| {
                buf[..8].copy_from_slice(&((base + j) as u64).to_le_bytes());
                buf[8..REQUEST].fill(0x5a);
                REQUEST
            })?;
            for s in sent_at.iter_mut().skip(base).take(k) {
                *s = t;
            }
            seq += k;
        }
        load.recv(&mut |p| on_reply(p, &mut answered, &mut rtt_us, &sent_at))?;
        load.tick_some();
        // Sleep until the next request is due or an answer arrives.
        let next_due = (seq as f64 * interval_ns - start.elapsed().as_nanos() as f64).max(0.0);
        if next_due > 50_000.0 {
            let _ = epoll.wait(
                &mut events,
                Some(Duration::from_nanos(next_due as u64).min(Duration::from_millis(1))),
            );
        }
    }
    let send_secs = start.elapsed().as_secs_f64();
    let linger = Instant::now();
    while linger.elapsed() < Duration::from_secs(1) && rtt_us.len() < count {
        load.recv(&mut |p| on_reply(p, &mut answered, &mut rtt_us, &sent_at))?;
        let _ = epoll.wait(&mut events, Some(Duration::from_millis(5)));
    }
    let after = load.faults();
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
    let class = if answered_share < 90.0 {
        "fail"
    } else if mean < 1.0 {
        "<1ms"
    } else if mean < 5.0 {
        "<5ms"
    } else if mean < 50.0 {
        "<50ms"
    } else if mean < 100.0 {
        "<100ms"
    } else {
        ">=100ms"
    };
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
        .set("wrong_source", after.0 - before.0)
        .set("rejected", after.1 - before.1)
        .set("class", class);
    Ok(v)
}

fn markdown(doc: &Value) -> String {
    let mut s = String::from("# Server role against 002\n\n");
    s.push_str(&format!(
        "{} {} UTC; {} requests per cell of {} bytes, answers {}x; rotation {} s.\n\n",
        doc.get("date").and_then(Value::as_str).unwrap_or(""),
        doc.get("time_utc").and_then(Value::as_str).unwrap_or(""),
        doc.get("cell_requests")
            .and_then(Value::as_u64)
            .unwrap_or(0),
        REQUEST,
        FACTOR,
        ROTATION_SECS
    ));
    s.push_str("## Fig. 1: time to make n addresses answerable\n\n| method | n | seconds | ms per address |\n|---|---|---|---|\n");
    for p in items(doc, "fig1_netlink") {
        let n = p.get("addresses").and_then(Value::as_u64).unwrap_or(0);
        let secs = p.get("secs").and_then(Value::as_f64).unwrap_or(0.0);
        s.push_str(&format!(
            "| netlink, one /128 each (002, gateway role) | {n} | {secs:.3} | {:.3} |\n",
            secs * 1e3 / n.max(1) as f64
        ));
    }
    let runs: Vec<&Value> = items(doc, "server_role").collect();
    for r in &runs {
        let n = r.get("clients").and_then(Value::as_u64).unwrap_or(0);
        let secs = r
            .get("first_answer_secs")
            .and_then(Value::as_f64)
            .unwrap_or(0.0);
        s.push_str(&format!(
            "| server role, AnyIP (start to first answer; {:.2} s to the serving line) | {n} | {secs:.3} | {:.4} |\n",
            r.get("ready_secs").and_then(Value::as_f64).unwrap_or(0.0),
            secs * 1e3 / n.max(1) as f64
        ));
    }
    s.push_str("\n## The server role per client count\n\n| clients | RSS idle (MB) | bytes per client | idle CPU, % of a core (rotation every 10 s) |\n|---|---|---|---|\n");
    for r in &runs {
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {:.2} |\n",
            r.get("clients").and_then(Value::as_u64).unwrap_or(0),
            r.get("rss_kb").and_then(Value::as_u64).unwrap_or(0) as f64 / 1024.0,
            r.get("rss_bytes_per_client")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            r.path(&["idle_cpu", "cpu_percent"])
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
        ));
    }
    s.push_str("\n## Fig. 2: response time (mean, p99 in ms; class by mean; fail below 90 % answered)\n\n| clients | requests/s asked | achieved | answered % | mean | p99 | max | wrong source | class |\n|---|---|---|---|---|---|---|---|---|\n");
    for r in &runs {
        for c in items(r, "cells") {
            let f = |k: &str| c.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {} |\n",
                r.get("clients").and_then(Value::as_u64).unwrap_or(0),
                c.get("rate").and_then(Value::as_u64).unwrap_or(0),
                f("achieved_rate"),
                f("answered_percent"),
                f("mean_ms"),
                f("p99_ms"),
                f("max_ms"),
                c.get("wrong_source").and_then(Value::as_u64).unwrap_or(0),
                c.get("class").and_then(Value::as_str).unwrap_or("?"),
            ));
        }
    }
    let nl: Vec<&Value> = items(doc, "fig2_netlink").collect();
    if !nl.is_empty() {
        s.push_str("\n## Fig. 2, netlink method: n /128s bound, plain UDP echo (002's server; mean, p99 in ms)\n\n| addresses | bound in (s) | requests/s asked | achieved | answered % | mean | p99 | max | wrong source | class |\n|---|---|---|---|---|---|---|---|---|---|\n");
        for r in nl {
            for c in items(r, "cells") {
                let f = |k: &str| c.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
                s.push_str(&format!(
                    "| {} | {:.2} | {} | {:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {} |\n",
                    r.get("addresses").and_then(Value::as_u64).unwrap_or(0),
                    r.get("bind_secs")
                        .and_then(Value::as_f64)
                        .unwrap_or(f64::NAN),
                    c.get("rate").and_then(Value::as_u64).unwrap_or(0),
                    f("achieved_rate"),
                    f("answered_percent"),
                    f("mean_ms"),
                    f("p99_ms"),
                    f("max_ms"),
                    c.get("wrong_source").and_then(Value::as_u64).unwrap_or(0),
                    c.get("class").and_then(Value::as_str).unwrap_or("?"),
                ));
            }
        }
    }
    let hs: Vec<&Value> = items(doc, "handshakes").collect();
    if !hs.is_empty() {
        s.push_str(&format!("\n## Handshakes: every client from cold (at most {IN_FLIGHT} under way)\n\n| clients | server start to serving (s) | all up after (s) | handshakes/s | initiations | server CPU % | RSS per session (bytes) |\n|---|---|---|---|---|---|---|\n"));
        for r in hs {
            let f = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            s.push_str(&format!(
                "| {} | {:.2} | {} | {:.0} | {} | {:.0} | {:.0} |\n",
                r.get("clients").and_then(Value::as_u64).unwrap_or(0),
                f("ready_secs"),
                if r.get("all_up").and_then(Value::as_bool) == Some(true) {
                    format!("{:.2}", f("all_up_secs"))
                } else {
                    format!(
                        "not all: {} up",
                        r.get("up").and_then(Value::as_u64).unwrap_or(0)
                    )
                },
                f("handshakes_per_sec"),
                r.get("initiations").and_then(Value::as_u64).unwrap_or(0),
                r.path(&["server_busy", "cpu_percent"])
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN),
                f("rss_bytes_per_session"),
            ));
        }
        s.push_str("\n## Restart storm: the server stopped and started again, every client recovering by the liveness rule\n\nSeconds after the new process's \"serving\" line; \"first initiation\" is the liveness rule's own delay, \"queue\" the time from a client's first recovery initiation to the echo's answer under its new keys.\n\n| clients | served again | p50 | p99 | max | first initiation p50 / max | queue p50 / p99 / max | initiations | requests | server µs per handshake | generator µs per handshake (threads) | machine busy cores |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in items(doc, "handshakes") {
            let Some(x) = r.get("restart") else {
                continue;
            };
            let f = |k: &str| x.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            let u = |k: &str| x.get(k).and_then(Value::as_u64).unwrap_or(0);
            s.push_str(&format!(
                "| {} | {} | {:.2} | {:.2} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} / {:.2} | {} | {} | {:.0} | {:.0} ({}) | {:.2} |\n",
                r.get("clients").and_then(Value::as_u64).unwrap_or(0),
                u("served_again"),
                f("p50_secs"),
                f("p99_secs"),
                f("max_secs"),
                f("first_initiation_p50_secs"),
                f("first_initiation_max_secs"),
                f("initiation_to_served_p50_secs"),
                f("initiation_to_served_p99_secs"),
                f("initiation_to_served_max_secs"),
                u("initiations"),
                u("requests"),
                f("server_us_per_handshake"),
                f("generator_us_per_handshake"),
                u("generator_threads"),
                f("machine_busy_cores"),
            ));
        }
    }
    s
}
