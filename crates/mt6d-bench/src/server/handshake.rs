//! Handshake runs: a server with n handshake clients started cold, a generator on several
//! threads bringing every client up, then the restart storm.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mt6d_lab::clients::{echo_service, ClientSet, ClientSpec};
use mt6d_lab::handshake_clients::{self, HandshakeClients};
use mt6d_lab::server_lab::{ServerLab, ECHO_PORT, SERVER_TRUE};

use super::restart::restart_storm;
use super::shards::{on_shards, total_counters, HandshakeServer, Shard, ShardRun, RETRY_SCAN};
use super::{last_counters, wait_line, COLD_START_LIMIT, GEN_PORT, IN_FLIGHT, ROTATION_SECS};
use crate::json::{Value, ValueExt};
use crate::procs::{Guarded, ProcSample};

/// The hashed /64 of generator thread `s` in the client namespace: 2001:db8:c1:1ss::/64 (the
/// lab routes only 2001:db8:c1::/64 there; the run adds these).
fn shard_prefix(s: usize) -> std::net::Ipv6Addr {
    std::net::Ipv6Addr::new(0x2001, 0xdb8, 0xc1, 0x100 + s as u16, 0, 0, 0, 0)
}

/// The receiving port of generator thread `s`.
fn shard_port(s: usize) -> u16 {
    GEN_PORT + 10 + s as u16
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

/// A server with `n` handshake clients started cold, and every client served: the generator
/// (`threads` threads, each with its share of the clients) initiates for all of them, at most
/// [`IN_FLIGHT`] under way in all, retrying on the handshake's own backoff, until each has
/// completed its handshake and had its first request answered by the echo service behind the
/// server (authenticated data from the server, under the new keys).
pub(super) fn handshake_run(
    lab: &ServerLab,
    mt6d: &Path,
    work: &Path,
    n: usize,
    threads: usize,
) -> Result<Value, String> {
    use mt6d::daemon::clock;
    let threads = threads.clamp(1, n.max(1));
    let shares = shares(n, threads);
    let dir = work.join(format!("hs{n}"));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    // The server's identity (a lab key, fixed: not a secret).
    let server_key = mt6d_proto::handshake::PrivateKey::generate([0x5e; 32]);
    let config = write_server_files(&dir, &server_key, &shares)?;
    let t = Instant::now();
    let mut shards = generator(lab, &shares, &server_key)?;
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
    let server = HandshakeServer {
        lab,
        mt6d,
        config: &config,
        dir: &dir,
        log: &log,
        n,
        threads,
        ready,
    };
    let result = handshake_phases(&server, &mut daemon, &mut shards);
    stop_echo.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    daemon.stop(Duration::from_secs(20));
    super::server_down(lab, mt6d, &config)?;
    result
}

/// Each generator thread's clients: its spec (its own hashed /64) and its range of the `n`.
fn shares(n: usize, threads: usize) -> Vec<(ClientSpec, std::ops::Range<usize>)> {
    let base = ServerLab::spec(1, Duration::from_secs_f64(ROTATION_SECS), true);
    (0..threads)
        .map(|s| {
            let mut spec = base.clone();
            spec.client_prefix = shard_prefix(s);
            (spec, n * s / threads..n * (s + 1) / threads)
        })
        .collect()
}

/// The server's key, peers file (every share's clients) and configuration in `dir`; the
/// configuration's path.
fn write_server_files(
    dir: &Path,
    server_key: &mt6d_proto::handshake::PrivateKey,
    shares: &[(ClientSpec, std::ops::Range<usize>)],
) -> Result<PathBuf, String> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    mt6d::keys::write_secret_file(
        &dir.join("server.key"),
        &mt6d::keys::encode(&server_key.to_bytes()[..]),
    )
    .map_err(|e| e.to_string())?;
    let path = dir.join("clients");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut w = std::io::BufWriter::new(f);
    for (spec, range) in shares {
        for i in range.clone() {
            w.write_all(handshake_clients::peers_line(spec, &format!("c{i}"), i).as_bytes())
                .map_err(|e| e.to_string())?;
        }
    }
    w.flush().map_err(|e| e.to_string())?;
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        format!(
            "{}private_key_file = \"server.key\"\n",
            ServerLab::server_config(ROTATION_SECS, 2, &dir.join("state"))
        ),
    )
    .map_err(|e| e.to_string())?;
    Ok(config)
}

/// The generator's threads' clients in the client namespace, each share's /64 routed there.
fn generator(
    lab: &ServerLab,
    shares: &[(ClientSpec, std::ops::Range<usize>)],
    server_key: &mt6d_proto::handshake::PrivateKey,
) -> Result<Vec<Shard>, String> {
    let client_ns = &lab.clients[0];
    let mut shards = Vec::with_capacity(shares.len());
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
                    mt6d::daemon::clock::now(),
                )
            })
            .map_err(|e| e.to_string())??;
        shards.push(Shard { set });
    }
    Ok(shards)
}

/// The steady rate of completions (sorted seconds): between the 10th and the 90th percentile.
fn steady_rate(up_at: &[f64]) -> f64 {
    let total = up_at.last().copied().unwrap_or(0.0);
    if up_at.len() >= 10 {
        let (lo, hi) = (up_at[up_at.len() / 10], up_at[up_at.len() * 9 / 10]);
        (up_at.len() * 8 / 10) as f64 / (hi - lo).max(1e-9)
    } else {
        up_at.len() as f64 / total.max(1e-9)
    }
}

/// The cold start and the restart storm of [`handshake_run`], with the server started.
fn handshake_phases(
    server: &HandshakeServer,
    daemon: &mut Guarded,
    shards: &mut [Shard],
) -> Result<Value, String> {
    let HandshakeServer {
        n, threads, ready, ..
    } = *server;
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
    let rate = steady_rate(&up_at);
    let cold = total_counters(shards);
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
        Some(restart_storm(daemon, shards, server)?)
    } else {
        None
    };
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
        .set("server_counters", last_counters(server.log));
    Ok(v)
}
