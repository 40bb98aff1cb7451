//! The restart storm: the server of a handshake run stopped and started again while every
//! client keeps sending and recovers by the liveness rule.

use std::path::Path;
use std::time::{Duration, Instant};

use mt6d_lab::handshake_clients::{HandshakeClients, HandshakeCounters};
use mt6d_lab::server_lab::ServerLab;

use super::shards::{on_shards, total_counters, HandshakeServer, Shard, ShardRun, RETRY_SCAN};
use super::{last_counters, quantile, wait_line, STORM_LIMIT};
use crate::json::{Value, ValueExt};
use crate::procs::{Guarded, ProcSample};

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
pub(super) fn restart_storm(
    daemon: &mut Guarded,
    shards: &mut [Shard],
    server: &HandshakeServer,
) -> Result<Value, String> {
    let counters_before = total_counters(shards);
    let drops_before = udp_drops(server.lab)?;
    let fails = failure_instants(shards);
    let log = server.dir.join("server-restarted.log");
    let abort = std::sync::atomic::AtomicBool::new(false);
    let stopped = Instant::now();
    let (r, runs) = on_shards(
        shards,
        &abort,
        || restart(daemon, server, &log, stopped),
        |k, set| recover(set, stopped, &fails[k], &abort),
    )?;
    let b = ProcSample::read(r.pid).ok_or("server gone")?;
    let m_b = crate::procs::machine_jiffies().unwrap_or((0, 0));
    let drops_after = udp_drops(server.lab)?;
    let busy = crate::procs::window(&r.sample, &b);
    // From the server's "serving" line. A client served before that cannot be.
    let up_at = sorted(
        runs.iter()
            .flat_map(|x| x.served.iter().map(|t| t - r.back)),
    );
    let waited = sorted(runs.iter().flat_map(|x| x.waited.iter().copied()));
    let first_init = sorted(
        runs.iter()
            .flat_map(|x| x.first_initiation.iter().map(|t| t - r.back)),
    );
    let cpu = busy
        .get("cpu_percent")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    let storm_secs = b.uptime - r.sample.uptime;
    let served = up_at.len().max(1) as f64;
    // CPU per handshake answered and its first request served, server and generator, over
    // the same storm: the figures that travel to another machine or client count.
    let gen_cpu: f64 = runs.iter().map(|x| x.cpu_secs).sum();
    let storm = Storm {
        n: server.n,
        threads: shards.len(),
        counters: since(total_counters(shards), counters_before),
        server_us: cpu / 100.0 * storm_secs / served * 1e6,
        gen_us: gen_cpu / served * 1e6,
        longest_turn: runs.iter().map(|x| x.longest_turn).fold(0.0, f64::max),
        machine_cores: busy_cores(r.machine, m_b),
        restarted: r,
        up_at,
        waited,
        first_init,
        storm_secs,
        cpu,
    };
    storm.log_line();
    let mut v = storm.to_value();
    v.set("server_busy", busy)
        .set("udp_drops_before_clients", drops_before.0)
        .set("udp_drops_before_server", drops_before.1)
        .set("udp_drops_after_clients", drops_after.0)
        .set("udp_drops_after_server", drops_after.1)
        .set("server_counters", last_counters(&log));
    Ok(v)
}

/// The new process, as the restart left it.
struct Restarted {
    /// Seconds the old process took to stop.
    down_secs: f64,
    /// Seconds from the new process's start to its "serving" line.
    ready_at: f64,
    /// Seconds from the stop to the "serving" line.
    back: f64,
    pid: u32,
    /// The new process at its "serving" line.
    sample: ProcSample,
    /// The machine's (busy, all) jiffies then.
    machine: (u64, u64),
}

/// Stops the server and starts it again on the same configuration, its log in `log`, and
/// waits for its "serving" line (the generator threads tick on their own meanwhile).
fn restart(
    daemon: &mut Guarded,
    server: &HandshakeServer,
    log: &Path,
    stopped: Instant,
) -> Result<Restarted, String> {
    daemon.stop(Duration::from_secs(20));
    let down_secs = stopped.elapsed().as_secs_f64();
    let mut cmd = server
        .lab
        .server
        .command(server.mt6d)
        .map_err(|e| e.to_string())?;
    cmd.arg("run").arg("-c").arg(server.config);
    *daemon = Guarded::spawn("server", cmd, Some(log))?;
    // The generator threads tick on their own; this thread only watches the log.
    let ready_at = wait_line(log, "serving ", Duration::from_secs(300), daemon, || {})?;
    let back = stopped.elapsed().as_secs_f64();
    let pid = daemon.pid().ok_or("server exited")?;
    let sample = ProcSample::read(pid).ok_or("server gone")?;
    let machine = crate::procs::machine_jiffies().unwrap_or((0, 0));
    Ok(Restarted {
        down_secs,
        ready_at,
        back,
        pid,
        sample,
        machine,
    })
}

/// The kernel's UDP drop counters (Udp6 only) of the client and of the server namespace.
fn udp_drops(lab: &ServerLab) -> Result<(Value, Value), String> {
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
}

/// Each client's instant of failure, per shard in order of time, in seconds from the stop: its
/// notice lag (up to a second), then the liveness rule's deadline.
fn failure_instants(shards: &[Shard]) -> Vec<Vec<(f64, usize)>> {
    use mt6d_proto::liveness::{LIVENESS_AFTER, LIVENESS_JITTER};
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
    shards
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
        .collect()
}

/// The counters counted between `before` and `after`.
fn since(after: HandshakeCounters, before: HandshakeCounters) -> HandshakeCounters {
    HandshakeCounters {
        initiations: after.initiations - before.initiations,
        completed: after.completed - before.completed,
        requests: after.requests - before.requests,
        served: after.served - before.served,
        lost: after.lost - before.lost,
        late: after.late - before.late,
        wrong_route: after.wrong_route - before.wrong_route,
        rejected: after.rejected - before.rejected,
    }
}

/// `v` sorted.
fn sorted(v: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut v: Vec<f64> = v.collect();
    v.sort_by(f64::total_cmp);
    v
}

/// The machine's busy cores between two (busy, all) jiffies readings; NaN if none passed.
fn busy_cores(a: (u64, u64), b: (u64, u64)) -> f64 {
    let (busy_j, all_j) = (b.0.saturating_sub(a.0), b.1.saturating_sub(a.1));
    let cores = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    if all_j == 0 {
        f64::NAN
    } else {
        busy_j as f64 / all_j as f64 * cores as f64
    }
}

/// Per quarter second from the "serving" line: first recovery initiations and clients
/// served (where the time goes: the liveness rule's delay, then the queue).
fn timeline(v: &[f64]) -> Value {
    let mut bins: Vec<u64> = Vec::new();
    for &t in v {
        let k = (t.max(0.0) * 4.0) as usize;
        if bins.len() <= k {
            bins.resize(k + 1, 0);
        }
        bins[k] += 1;
    }
    Value::Array(bins.into_iter().map(Value::from).collect())
}

/// What a restart storm measured.
struct Storm {
    n: usize,
    threads: usize,
    restarted: Restarted,
    /// Seconds from the "serving" line to each client served again, sorted.
    up_at: Vec<f64>,
    /// Seconds from each client's first recovery initiation to its service, sorted.
    waited: Vec<f64>,
    /// Seconds from the "serving" line to each client's first recovery initiation, sorted.
    first_init: Vec<f64>,
    /// What the clients counted over the storm.
    counters: HandshakeCounters,
    storm_secs: f64,
    /// The server's CPU, % of a core, over the storm.
    cpu: f64,
    server_us: f64,
    gen_us: f64,
    longest_turn: f64,
    machine_cores: f64,
}

impl Storm {
    fn log_line(&self) {
        let Storm {
            n,
            threads,
            restarted:
                Restarted {
                    down_secs,
                    ready_at,
                    ..
                },
            ref up_at,
            ref waited,
            ref first_init,
            counters:
                HandshakeCounters {
                    initiations,
                    requests,
                    late,
                    lost,
                    rejected,
                    wrong_route,
                    ..
                },
            storm_secs,
            cpu,
            server_us,
            gen_us,
            longest_turn,
            machine_cores,
        } = *self;
        eprintln!(
            "  restart: stopped in {down_secs:.2} s, ready {ready_at:.2} s after start; {} of {n} served again, p50 {:.2} s, p99 {:.2} s, max {:.2} s after ready (first recovery initiation p50 {:.2} s, max {:.2} s; from it to served p50 {:.2} s, p99 {:.2} s, max {:.2} s); {initiations} initiations, {requests} requests ({late} answers after the first, {lost} sessions given up unanswered), {rejected} rejected, {wrong_route} to no route; over {storm_secs:.2} s server CPU {cpu:.0} % ({server_us:.0} us per handshake), generator {gen_us:.0} us per handshake on {threads} threads (longest turn {longest_turn:.3} s), machine {machine_cores:.2} cores busy",
            up_at.len(),
            quantile(up_at, 0.5),
            quantile(up_at, 0.99),
            quantile(up_at, 1.0),
            quantile(first_init, 0.5),
            quantile(first_init, 1.0),
            quantile(waited, 0.5),
            quantile(waited, 0.99),
            quantile(waited, 1.0),
        );
    }

    /// The storm's figures, in the order of the results file (the server's busy window, the
    /// kernel's drops and its counters line follow).
    fn to_value(&self) -> Value {
        let (up_at, waited, first_init) = (&self.up_at, &self.waited, &self.first_init);
        let c = &self.counters;
        let mut v = Value::obj();
        v.set("stop_secs", self.restarted.down_secs)
            .set("ready_secs", self.restarted.ready_at)
            .set("ready_after_stop_secs", self.restarted.back)
            .set("served_again", up_at.len() as u64)
            .set("p50_secs", quantile(up_at, 0.5))
            .set("p99_secs", quantile(up_at, 0.99))
            .set("max_secs", quantile(up_at, 1.0))
            .set("first_initiation_p50_secs", quantile(first_init, 0.5))
            .set("first_initiation_max_secs", quantile(first_init, 1.0))
            .set("initiation_to_served_p50_secs", quantile(waited, 0.5))
            .set("initiation_to_served_p99_secs", quantile(waited, 0.99))
            .set("initiation_to_served_max_secs", quantile(waited, 1.0))
            .set("initiations", c.initiations)
            .set("requests", c.requests)
            .set("late_answers", c.late)
            .set("sessions_given_up", c.lost)
            .set("rejected", c.rejected)
            .set("wrong_route", c.wrong_route)
            .set("timeline_bin_secs", 0.25)
            .set("timeline_first_initiations", timeline(first_init))
            .set("timeline_served", timeline(up_at))
            .set("storm_secs", self.storm_secs)
            .set("server_us_per_handshake", self.server_us)
            .set("generator_us_per_handshake", self.gen_us)
            .set("generator_threads", self.threads as u64)
            .set("generator_longest_turn_secs", self.longest_turn)
            .set("machine_busy_cores", self.machine_cores);
        v
    }
}
