//! The server role's runs: start-up with n clients in its peers file, the idle cost of its
//! rotation, then Fig. 2's cells through the tunnel.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mt6d_lab::clients::{echo_service, ClientSet, ClientSpec};
use mt6d_lab::server_lab::{ServerLab, ECHO_PORT, SERVER_TRUE};

use super::cell::{cells_until_fail, Meter, Tunnelled};
use super::{
    last_counters, peers_file, server_down, wait_line, Rng, ServerArgs, FACTOR, GEN_PORT,
    IDLE_SECS, REQUEST,
};
use crate::json::{Value, ValueExt};
use crate::procs::{Guarded, ProcSample};

/// One server role run with `n` clients: start-up, idle cost, then Fig. 2's cells.
pub(super) fn server_run(
    lab: &ServerLab,
    mt6d: &Path,
    work: &Path,
    n: usize,
    args: &ServerArgs,
) -> Result<Value, String> {
    let spec = ServerLab::spec(1, Duration::from_secs_f64(args.rotation_secs), true);
    let dir = work.join(format!("n{n}"));
    let config = write_config(&dir, &spec, n, args.rotation_secs)?;
    let mut set = generator(lab, &spec, n)?;
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
    let first_answer = first_answer(&mut set, &spec, n, &mut rng, start)?;
    let pid = daemon.pid().ok_or("server exited")?;
    let (b, idle) = idle_cost(pid, &mut set, args.rotation_secs)?;
    eprintln!(
        "  ready {ready:.2} s, first answer {first_answer:.2} s, RSS {} MB, idle CPU {:.2} %",
        b.rss_kb / 1024,
        idle.get("cpu_percent")
            .and_then(Value::as_f64)
            .unwrap_or(0.0)
    );
    let cells = cells_until_fail(
        &mut Tunnelled {
            set: &mut set,
            spec: &spec,
            server: Meter::server(pid),
        },
        n,
        args,
        &mut rng,
        |rate| format!("  {rate}/s"),
    )?;
    let end = ProcSample::read(pid).ok_or("server gone")?;
    let idle_rss_kb = b.rss_kb;
    daemon.stop(Duration::from_secs(20));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    server_down(lab, mt6d, &config)?;
    let mut v = Value::obj();
    v.set("clients", n as u64)
        .set("rotation_secs", args.rotation_secs)
        .set("ready_secs", ready)
        .set("first_answer_secs", first_answer)
        .set("rss_kb", idle_rss_kb)
        .set(
            "rss_bytes_per_client",
            idle_rss_kb as f64 * 1024.0 / n as f64,
        )
        .set("rss_after_cells_kb", end.rss_kb)
        .set("idle_cpu", idle)
        .set("server_counters", last_counters(&log))
        .set("cells", Value::Array(cells));
    Ok(v)
}

/// The run's directory under `dir`: the peers file of `n` clients and the server's
/// configuration, whose path it returns.
fn write_config(
    dir: &Path,
    spec: &ClientSpec,
    n: usize,
    rotation_secs: f64,
) -> Result<PathBuf, String> {
    std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
    peers_file(&dir.join("clients"), spec, n)?;
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        ServerLab::server_config(rotation_secs, 2, &dir.join("state")),
    )
    .map_err(|e| e.to_string())?;
    Ok(config)
}

/// The generator's side, built before the server starts (its own build is not the server's
/// start-up): `n` clients in the client namespace.
fn generator(lab: &ServerLab, spec: &ClientSpec, n: usize) -> Result<ClientSet, String> {
    let client_ns = &lab.clients[0];
    client_ns
        .run(|| ClientSet::install(spec, "mt6d_bench_gen", GEN_PORT))
        .map_err(|e| e.to_string())??;
    let t = Instant::now();
    let set = client_ns
        .run(|| ClientSet::new(spec, n, GEN_PORT, mt6d::daemon::clock::now()))
        .map_err(|e| e.to_string())??;
    eprintln!(
        "  generator: {n} clients in {:.2} s",
        t.elapsed().as_secs_f64()
    );
    Ok(set)
}

/// Seconds from `start` to the first answer to a random client (asked again every 2 ms).
fn first_answer(
    set: &mut ClientSet,
    spec: &ClientSpec,
    n: usize,
    rng: &mut Rng,
    start: Instant,
) -> Result<f64, String> {
    // The generator's sockets live in the client namespace; this thread need not.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let i = rng.below(n);
        set.send(spec, i, ECHO_PORT, &[0u8; REQUEST])?;
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
}

/// Idle: what rotation costs (a window of one interval and a second, at least 11 s: every
/// client's boundary passes at least once). The
/// server's sample at the end and its CPU over the window, with its main thread's (which
/// rotates) per rotated client: the generator rotates the same clients on the same schedule,
/// so the boundaries it crosses in the window are the server's.
fn idle_cost(
    pid: u32,
    set: &mut ClientSet,
    rotation_secs: f64,
) -> Result<(ProcSample, Value), String> {
    set.step(mt6d::daemon::clock::now());
    let meter = Meter::server(pid);
    let threads = meter.sample();
    let a = ProcSample::read(pid).ok_or("server gone")?;
    let idle = Instant::now();
    let mut boundaries = 0u64;
    while idle.elapsed() < Duration::from_secs_f64((rotation_secs + 1.0).max(IDLE_SECS)) {
        std::thread::sleep(Duration::from_millis(20));
        boundaries += set.step(mt6d::daemon::clock::now()) as u64;
    }
    let b = ProcSample::read(pid).ok_or("server gone")?;
    let split = meter.split(&threads, &meter.sample());
    let mut window = crate::procs::window(&a, &b);
    window
        .set("client_boundaries", boundaries)
        .set("threads", split.json(boundaries, "rotated_client"));
    Ok((b, window))
}
