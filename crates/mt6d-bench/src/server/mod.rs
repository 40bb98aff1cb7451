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
//!   interval; its main thread's µs per rotated client), and its start-up time.
//! * **CPU per request** in every cell: the server process's CPU from the first request to
//!   the last answer (per thread from /proc/PID/task/*/schedstat: workers, main thread, the
//!   rest) over the requests answered; the same for the netlink method's plain echo, whose
//!   one-address run is the kernel's own cost of the work, and the ratio of the two
//!   (`cpu_vs_kernel_echo`).
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

mod cell;
mod cpu;
mod handshake;
mod netlink;
mod report;
mod restart;
mod role;
mod shards;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mt6d_lab::clients::ClientSpec;
use mt6d_lab::server_lab::ServerLab;

use crate::json::{Value, ValueExt};
use crate::procs::Guarded;

pub use cpu::probe;
pub use report::{figures, probe_markdown};

/// The generator's receiving port in the client namespace.
const GEN_PORT: u16 = 7421;
/// Request payload bytes (sequence number and padding); answers are ten times this.
const REQUEST: usize = 64;
/// The echo's answer factor (002).
const FACTOR: usize = 10;
/// Rotation interval of the server role runs by default (the goal's 10 s), and of the
/// handshake runs.
const ROTATION_SECS: f64 = 10.0;
/// The shortest idle window of a server role run: 11 boundaries per client at a 1 s rotation.
const IDLE_SECS: f64 = 11.0;
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
    /// Rotation interval of the server role runs, seconds.
    pub rotation_secs: f64,
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
            rotation_secs: ROTATION_SECS,
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
            rotation_secs: ROTATION_SECS,
        }
    }
}

pub fn run(out: Option<PathBuf>, mt6d: &Path, args: &ServerArgs) -> Result<PathBuf, String> {
    let (date, time) = crate::utc::utc_now();
    let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/{date}-server")));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let work = std::env::temp_dir().join(format!("mt6d-server-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let _work_guard = crate::workdir::RemoveDir(work.clone());
    let mut doc = Value::obj();
    doc.set("date", date.as_str())
        .set("time_utc", time.as_str())
        .set("machine", crate::machine::describe(mt6d))
        .set("cell_requests", args.cell as u64)
        .set("request_bytes", REQUEST as u64)
        .set("answer_factor", FACTOR as u64)
        .set("rotation_secs", args.rotation_secs);

    let lab = ServerLab::build("mbs").map_err(|e| e.to_string())?;
    let mut runs = Vec::new();
    for &n in &args.clients {
        eprintln!("mt6d bench --server: server role, {n} clients");
        runs.push(role::server_run(&lab, mt6d, &work, n, args)?);
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
        hs_runs.push(handshake::handshake_run(
            &lab,
            mt6d,
            &work,
            n,
            args.generator_threads,
        )?);
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
        doc.set("fig2_netlink", netlink::fig2_netlink(&lab, args)?);
        let rows = cpu::cpu_vs_kernel_echo(&doc);
        doc.set("cpu_vs_kernel_echo", rows);
        std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())?;
    }
    drop(lab);
    if args.netlink_limit.is_zero() {
        std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())?;
        std::fs::write(out.join("report.md"), report::markdown(&doc)).map_err(|e| e.to_string())?;
        return Ok(out);
    }
    // Last: deleting a namespace with tens of thousands of addresses keeps the kernel busy for
    // a while after, which would disturb the server role's figures.
    eprintln!("mt6d bench --server: Fig. 1, netlink method");
    doc.set("fig1_netlink", netlink::fig1_netlink(args)?);
    std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())?;
    std::fs::write(out.join("report.md"), report::markdown(&doc)).map_err(|e| e.to_string())?;
    figures(&doc, &out)?;
    eprintln!("mt6d bench --server: {}", out.join("report.md").display());
    Ok(out)
}

/// `mt6d down -c config` in the server namespace, after the server stopped: a stopped server
/// keeps its nftables table (which drops every datagram to its prefix no socket takes) until
/// then, and the netlink method's plain echo later in the run answers on that prefix.
fn server_down(lab: &ServerLab, mt6d: &Path, config: &Path) -> Result<(), String> {
    let o = lab
        .server
        .command(mt6d)
        .map_err(|e| e.to_string())?
        .arg("down")
        .arg("-c")
        .arg(config)
        .output()
        .map_err(|e| format!("{} down: {e}", mt6d.display()))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{} down -c {}: {}",
            mt6d.display(),
            config.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// The elements of the array `key` of `v` (none if it is missing or not an array).
fn items<'a>(v: &'a Value, key: &str) -> impl Iterator<Item = &'a Value> + 'a {
    v.get(key).and_then(Value::as_array).into_iter().flatten()
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

/// The `p` quantile (0-1) of sorted `v`, NaN for none.
fn quantile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v[((v.len() as f64 * p).ceil() as usize).clamp(1, v.len()) - 1]
}

/// The daemon's last counters line in `log` (empty if none).
fn last_counters(log: &Path) -> String {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .rev()
        .find(|l| l.contains("counters:"))
        .unwrap_or("")
        .to_string()
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
