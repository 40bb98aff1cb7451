//! One bench run: every (topology, scenario) pair in turn, each on freshly built namespaces,
//! with progress on stderr and the results written after every pair so a partial run is kept.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mt6d_lab::topology::HOST_B;

use crate::json::{Value, ValueExt};
use crate::peers::{self, Running};
use crate::procs::{self, ProcSample};
use crate::profile::{Mode, Profile, Scenario, Topology};
use crate::topo::Net;
use crate::traffic::{self, Pace};
use crate::Args;

/// Progress on stderr: which pair, which test, elapsed and (after the first pair) remaining.
struct Progress {
    start: Instant,
    total: usize,
    done: usize,
    label: String,
}

impl Progress {
    fn say(&self, what: &str) {
        let el = self.start.elapsed().as_secs();
        let rem = if self.done == 0 {
            "?".to_string()
        } else {
            let per = self.start.elapsed().as_secs_f64() / self.done as f64;
            fmt_secs((per * (self.total - self.done) as f64) as u64)
        };
        eprintln!(
            "[{}/{}] {:<26} {:<24} elapsed {} remaining ~{}",
            self.done + 1,
            self.total,
            self.label,
            what,
            fmt_secs(el),
            rem
        );
    }
}

fn fmt_secs(s: u64) -> String {
    format!("{}m{:02}s", s / 60, s % 60)
}

pub fn run(args: &Args) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own executable: {e}"))?;
    let mt6d = exe.with_file_name("mt6d");
    let work = std::env::temp_dir().join(format!("mt6d-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let _work_guard = crate::workdir::RemoveDir(work.clone());
    let (date, time) = crate::utc::utc_now();
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-results/{date}-{}", args.profile.name)));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;

    let p = &args.profile;
    let www = work.join("www");
    let mut files = p.downloads.clone();
    files.push(traffic::SMALL_FLOW_FILE);
    traffic::make_files(&www, &files).map_err(|e| format!("test files: {e}"))?;

    let mut doc = Value::obj();
    doc.set("tool", "mt6d bench")
        .set("issue", "the evaluation of 000 Ch. 4-5")
        .set("date_utc", format!("{date} {time}"))
        .set("profile", profile_json(p))
        .set("machine", crate::machine::describe(&mt6d));
    let pairs: Vec<(Topology, Scenario)> = args
        .topologies
        .iter()
        .flat_map(|t| args.scenarios.iter().map(move |s| (*t, *s)))
        .collect();
    let mut progress = Progress {
        start: Instant::now(),
        total: pairs.len(),
        done: 0,
        label: String::new(),
    };
    let mut rows = Vec::new();
    for (topology, scenario) in pairs {
        progress.label = format!("{topology} / {scenario}");
        let dir = work.join(format!("{topology}-{scenario}"));
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut row = Value::obj();
        row.set("topology", topology.name())
            .set("scenario", scenario.name());
        let t0 = Instant::now();
        match peers::unavailable(scenario, &mt6d) {
            Some(reason) => {
                row.set("available", false)
                    .set("reason", format!("not available: {reason}"));
                progress.say(&format!("not available: {reason}"));
            }
            None => {
                row.set("available", true);
                if let Err(e) = run_pair(
                    &mut row, topology, scenario, p, &mt6d, &www, &dir, &progress,
                ) {
                    progress.say(&format!("FAILED: {e}"));
                    row.set("error", e);
                }
            }
        }
        row.set("wall_secs", t0.elapsed().as_secs_f64());
        rows.push(row);
        progress.done += 1;
        doc.set("duration_secs", progress.start.elapsed().as_secs_f64())
            .set("rows", Value::Array(rows.clone()));
        crate::report::write_all(&doc, &out, &server_sections(&doc))?;
        crate::plot::write_figures(&doc, &out)?;
    }
    // The server role's CPU per request beside the kernel's plain echo (about 20 s).
    doc.set("server_cpu", crate::server::probe(&mt6d))
        .set("duration_secs", progress.start.elapsed().as_secs_f64());
    crate::report::write_all(&doc, &out, &server_sections(&doc))?;
    eprintln!(
        "mt6d bench: done in {}; results in {}",
        fmt_secs(progress.start.elapsed().as_secs()),
        out.display()
    );
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn run_pair(
    row: &mut Value,
    topology: Topology,
    scenario: Scenario,
    p: &Profile,
    mt6d: &Path,
    www: &Path,
    dir: &Path,
    progress: &Progress,
) -> Result<(), String> {
    progress.say("build topology");
    let net = crate::topo::build(topology)?;
    let mut nginx = traffic::start_nginx(&net.host_b, www, dir)?;
    let mut iperf = traffic::start_iperf(&net.host_b, dir)?;
    let rotation = matches!(scenario, Scenario::Mt6d(_)).then_some(p.rotation_secs);
    if let Some(r) = rotation {
        row.set("rotation_secs", r);
    }
    row.set("path_mtu", u64::from(net.ext_mtu));
    progress.say("start gateways");
    let mut gw = peers::start(&net, scenario, p.rotation_secs, mt6d, dir, ("", p.workers))?;
    warm_up(&net)?;
    let mut tests = Tests {
        progress,
        tests: Value::obj(),
    };
    let sched = rotation.and_then(|r| schedule(&gw, r));
    tests.standard(&mut gw, &net, p, dir, sched);
    gateway_figures(row, &gw);
    drop(gw);

    // MT6D again at the fast rotation, for loss at rotations (001 §4; the target: no loss at 1 s).
    if matches!(scenario, Scenario::Mt6d(_)) {
        progress.say("restart at fast rotation");
        let mut gw = peers::start(
            &net,
            scenario,
            p.fast_rotation_secs,
            mt6d,
            dir,
            ("", p.workers),
        )?;
        warm_up(&net)?;
        tests.fast_rotation(&mut gw, &net, p, dir);
        row.set("fast_rotation_secs", p.fast_rotation_secs);
    }
    // What the TCP policy costs the daemon's throughput, off and on
    // in turn on the same namespaces (encrypt only: the mode deployments run).
    if scenario == Scenario::Mt6d(Mode::Encrypt) {
        row.set("scrub_cost", scrub_cost(&net, p, mt6d, dir, progress));
        row.set(
            "workers_scaling",
            workers_scaling(&net, p, mt6d, dir, progress),
        );
    }
    row.set("tests", tests.tests);
    if !net.routers.is_empty() {
        let discards = net.router_unresolved_discards();
        row.set("router_unresolved_discards", discards);
    }
    nginx.stop(Duration::from_secs(2));
    iperf.stop(Duration::from_secs(2));
    Ok(())
}

/// 000 §4.3: the gateway processes' own figures at the end of their run, and Gateway A's
/// drops and rotations (mt6d only).
fn gateway_figures(row: &mut Value, gw: &Running) {
    for (key, g) in [("gateway_a", &gw.gw_a), ("gateway_b", &gw.gw_b)] {
        if let Some(s) = g.as_ref().and_then(|g| g.pid()).and_then(ProcSample::read) {
            row.set(key, procs::host_metrics(&s));
        }
    }
    if let Some(sock) = &gw.control_a {
        if let Ok(st) = mt6d::control::query_status(sock) {
            if let Some(peer) = st.peers.first() {
                row.set(
                    "gateway_a_drops",
                    peer.counters.drops.clone().into_iter().collect::<Value>(),
                );
                row.set("gateway_a_rotations", peer.counters.rotations);
            }
        }
    }
}

/// A row's tests, measured one after the other.
struct Tests<'a> {
    progress: &'a Progress,
    tests: Value,
}

impl Tests<'_> {
    /// Runs test `name` (`f`), with Gateway A's CPU over it and whether a gateway died; an
    /// error is the test's result.
    fn measure(
        &mut self,
        name: &str,
        gw: &mut Running,
        f: &mut dyn FnMut() -> Result<Value, String>,
    ) {
        self.progress.say(name);
        let before = gw
            .gw_a
            .as_ref()
            .and_then(|g| g.pid())
            .and_then(ProcSample::read);
        let mut v = f().unwrap_or_else(|e| {
            let mut v = Value::obj();
            v.set("error", e);
            v
        });
        let pid = gw.gw_a.as_ref().and_then(|g| g.pid());
        if let (Some(a), Some(b)) = (before, pid.and_then(ProcSample::read)) {
            v.set("gateway_a_cpu", procs::window(&a, &b));
        }
        if let Some(dead) = gw.dead() {
            v.set("gateway_died", dead);
        }
        self.tests.set(name, v);
    }

    /// The profile's tests at the scenario's rotation: pings, floods, downloads, UDP, TCP and
    /// the many small flows.
    fn standard(
        &mut self,
        gw: &mut Running,
        net: &Net,
        p: &Profile,
        dir: &Path,
        sched: Option<(f64, f64)>,
    ) {
        let std_pace = Pace::Train(Duration::from_millis(p.ping_std_interval_ms));
        self.measure("ping_std", gw, &mut || {
            ping_test(net, p.ping_std_count, std_pace, sched)
        });
        for (name, count) in p.floods {
            self.measure(name, gw, &mut || ping_test(net, count, Pace::Flood, sched));
        }
        for (name, bytes) in &p.downloads {
            let scratch = traffic::scratch(dir, name);
            self.measure(name, gw, &mut || {
                traffic::download(&net.host_a, name, *bytes, &scratch)
            });
        }
        for (name, bytes) in &p.udp {
            let scratch = traffic::scratch(dir, name);
            self.measure(name, gw, &mut || {
                traffic::udp(&net.host_a, *bytes, p.udp_rate_mbit, &scratch)
            });
        }
        for streams in [1u32, 4] {
            let name = format!("iperf_tcp_{streams}");
            let scratch = traffic::scratch(dir, &name);
            self.measure(&name, gw, &mut || {
                traffic::tcp(&net.host_a, streams, p.tcp_secs, &scratch)
            });
        }
        let scratch = traffic::scratch(dir, "small_flows");
        self.measure("http_small_flows", gw, &mut || {
            traffic::small_flows(&net.host_a, p.small_flows.0, p.small_flows.1, &scratch)
        });
    }

    /// The tests of the fast rotation, on gateways started at it: ping_std, a flood, TCP.
    fn fast_rotation(&mut self, gw: &mut Running, net: &Net, p: &Profile, dir: &Path) {
        let std_pace = Pace::Train(Duration::from_millis(p.ping_std_interval_ms));
        let sched = schedule(gw, p.fast_rotation_secs);
        self.measure("ping_std_1s_rotation", gw, &mut || {
            ping_test(net, p.ping_std_count, std_pace, sched)
        });
        let (name, count) = p.fast_flood;
        self.measure(name, gw, &mut || ping_test(net, count, Pace::Flood, sched));
        let scratch = traffic::scratch(dir, "tcp_fast");
        self.measure("iperf_tcp_1_1s_rotation", gw, &mut || {
            traffic::tcp(&net.host_a, 1, p.tcp_secs, &scratch)
        });
    }
}

/// `count` echoes from Host A to Host B at `pace`, placed against the rotation `sched`.
fn ping_test(
    net: &Net,
    count: u64,
    pace: Pace,
    sched: Option<(f64, f64)>,
) -> Result<Value, String> {
    let r = net
        .host_a
        .run(|| traffic::ping(HOST_B, count, pace, Duration::from_secs(1)))
        .map_err(|e| e.to_string())??;
    Ok(traffic::ping_json(&r, sched))
}

/// `[tcp]` for the off state: no identity policy and no MSS clamping, so the packet threads
/// skip TCP entirely (docs/CONFIG.md, `host_id`).
const SCRUB_OFF: &str = "\n[tcp]\nhost_id = false\nmss_clamp = false\n";
/// The on state: the default policy written out (strip both ways, MSS clamping on). iperf3's
/// segments carry timestamps, so each one takes the option walk, not only the header check.
const SCRUB_ON: &str =
    "\n[peer.host_id_out]\naction = \"strip\"\n[peer.host_id_in]\naction = \"strip\"\n";

/// iperf3 TCP, 1 stream, through mt6d encrypt with the TCP policy off and on, alternating
/// (off first in even rounds, on first in odd ones, so a drift of the shared machine weighs on
/// both), each state on freshly started gateways. The medians and their difference in %.
fn scrub_cost(net: &Net, p: &Profile, mt6d: &Path, dir: &Path, progress: &Progress) -> Value {
    let mut runs: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut v = Value::obj();
    v.set("streams", 1u64)
        .set("secs", p.scrub_secs)
        .set("rounds", u64::from(p.scrub_rounds))
        .set("off_config", SCRUB_OFF.trim())
        .set("on_config", SCRUB_ON.trim())
        .set("goal_pct", 2.0);
    for round in 0..p.scrub_rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for state in order {
            let (name, extra) = [("off", SCRUB_OFF), ("on", SCRUB_ON)][state];
            progress.say(&format!("scrub {name}, round {}", round + 1));
            let scratch = traffic::scratch(dir, &format!("scrub_{name}_{round}"));
            let r = fresh_encrypt(net, p, (mt6d, dir), (extra, p.workers), |_| {
                traffic::tcp(&net.host_a, 1, p.scrub_secs, &scratch)
            })
            .and_then(|t| {
                t.get("mbit_per_s")
                    .and_then(Value::as_f64)
                    .ok_or_else(|| "iperf3 gave no throughput".to_string())
            });
            match r {
                Ok(mbit) => runs[state].push(mbit),
                Err(e) => {
                    v.set("error", format!("scrub {name}, round {}: {e}", round + 1));
                    return v;
                }
            }
        }
    }
    // Each state's runs in the order they were measured (round 1 first); the median of each.
    let [off, on] = runs.map(|r| {
        let mut sorted = r.clone();
        sorted.sort_by(f64::total_cmp);
        let m = sorted[sorted.len() / 2];
        (r, m)
    });
    v.set(
        "off_mbit_per_s",
        Value::Array(off.0.iter().map(|&x| Value::from(x)).collect()),
    )
    .set(
        "on_mbit_per_s",
        Value::Array(on.0.iter().map(|&x| Value::from(x)).collect()),
    )
    .set("off_median", off.1)
    .set("on_median", on.1)
    .set("on_vs_off_pct", (on.1 / off.1 - 1.0) * 100.0);
    v
}

/// mt6d encrypt with one data-plane worker against the default (one per
/// online CPU, or `--workers`), alternating the order per round on freshly started gateways:
/// iperf3 TCP with 1 and 4 streams and the many small flows, each with Gateway A's CPU, so CPU
/// per gigabit comes out of the same run. On this machine the hosts, iperf3 and nginx share
/// the cores with both gateways; a larger machine is what shows scaling (docs/BENCH.md).
fn workers_scaling(net: &Net, p: &Profile, mt6d: &Path, dir: &Path, progress: &Progress) -> Value {
    let default = p.workers.unwrap_or_else(|| {
        std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
    });
    let states = [1usize, default];
    let mut v = Value::obj();
    v.set(
        "workers",
        Value::Array(states.iter().map(|&n| Value::from(n as u64)).collect()),
    )
    .set("rounds", u64::from(p.workers_rounds))
    .set("tcp_secs", p.tcp_secs)
    .set("small_flows", p.small_flows.0)
    .set("small_flows_concurrency", p.small_flows.1);
    let mut runs: [Vec<Value>; 2] = [Vec::new(), Vec::new()];
    for round in 0..p.workers_rounds {
        let order = if round % 2 == 0 { [0, 1] } else { [1, 0] };
        for state in order {
            let n = states[state];
            progress.say(&format!("workers {n}, round {}", round + 1));
            let r = fresh_encrypt(net, p, (mt6d, dir), ("", Some(n)), |gw| {
                let mut one = Value::obj();
                one.set("round", u64::from(round) + 1);
                for streams in [1u32, 4] {
                    let name = format!("iperf_tcp_{streams}");
                    let scratch = traffic::scratch(dir, &format!("workers_{n}_{name}_{round}"));
                    let t = with_cpu(gw, || {
                        traffic::tcp(&net.host_a, streams, p.tcp_secs, &scratch)
                    })?;
                    one.set(&name, t);
                }
                let scratch = traffic::scratch(dir, &format!("workers_{n}_flows_{round}"));
                let t = with_cpu(gw, || {
                    traffic::small_flows(&net.host_a, p.small_flows.0, p.small_flows.1, &scratch)
                })?;
                one.set("http_small_flows", t);
                Ok(one)
            });
            match r {
                Ok(one) => runs[state].push(one),
                Err(e) => {
                    v.set("error", format!("workers {n}, round {}: {e}", round + 1));
                    return v;
                }
            }
        }
    }
    for (state, key) in [(0, "one"), (1, "default")] {
        v.set(key, summarize_workers(&runs[state]));
    }
    v
}

/// `f` on mt6d encrypt gateways started afresh on `net` with `extra` configuration and
/// `workers`, after the warm-up; the gateways stop when `f` returns.
fn fresh_encrypt<T>(
    net: &Net,
    p: &Profile,
    (mt6d, dir): (&Path, &Path),
    (extra, workers): (&str, Option<usize>),
    f: impl FnOnce(&Running) -> Result<T, String>,
) -> Result<T, String> {
    let gw = peers::start(
        net,
        Scenario::Mt6d(Mode::Encrypt),
        p.rotation_secs,
        mt6d,
        dir,
        (extra, workers),
    )?;
    warm_up(net)?;
    f(&gw)
}

/// `f`'s result with Gateway A's CPU over it, and CPU per gigabit where it moved bits.
fn with_cpu(gw: &Running, f: impl FnOnce() -> Result<Value, String>) -> Result<Value, String> {
    let pid = gw.gw_a.as_ref().and_then(|g| g.pid());
    let before = pid.and_then(ProcSample::read);
    let mut v = f()?;
    if let (Some(a), Some(b)) = (before, pid.and_then(ProcSample::read)) {
        let cpu = procs::window(&a, &b);
        let pct = cpu.get("cpu_percent").and_then(Value::as_f64);
        let mbit = v.get("mbit_per_s").and_then(Value::as_f64);
        if let (Some(pct), Some(mbit)) = (pct, mbit.filter(|m| *m > 0.0)) {
            v.set("cpu_percent_per_gbit", pct / (mbit / 1000.0));
        }
        v.set("gateway_a_cpu", cpu);
    }
    Ok(v)
}

/// The medians over the rounds of one worker count: Mbit/s and CPU per Gbit of both TCP
/// tests, flows/s and p99 of the small flows, and every round's figures as measured.
fn summarize_workers(runs: &[Value]) -> Value {
    let median = |path: &[&str]| -> Option<f64> {
        let mut xs: Vec<f64> = runs
            .iter()
            .filter_map(|r| r.path(path).and_then(Value::as_f64))
            .collect();
        xs.sort_by(f64::total_cmp);
        (!xs.is_empty()).then(|| xs[xs.len() / 2])
    };
    let mut v = Value::obj();
    v.set("tcp_1_mbit_per_s", median(&["iperf_tcp_1", "mbit_per_s"]))
        .set(
            "tcp_1_cpu_percent_per_gbit",
            median(&["iperf_tcp_1", "cpu_percent_per_gbit"]),
        )
        .set("tcp_4_mbit_per_s", median(&["iperf_tcp_4", "mbit_per_s"]))
        .set(
            "tcp_4_cpu_percent_per_gbit",
            median(&["iperf_tcp_4", "cpu_percent_per_gbit"]),
        )
        .set("flows_per_s", median(&["http_small_flows", "flows_per_s"]))
        .set("flow_ms_p99", median(&["http_small_flows", "flow_ms_p99"]))
        .set(
            "flows_cpu_percent",
            median(&["http_small_flows", "gateway_a_cpu", "cpu_percent"]),
        )
        .set("runs", Value::Array(runs.to_vec()));
    v
}

/// A few echoes before measuring: neighbour discovery and the WireGuard handshake happen here,
/// for every scenario alike, and a path that carries nothing fails the pair early.
pub fn warm_up(net: &Net) -> Result<(), String> {
    for _ in 0..20 {
        let r = net
            .host_a
            .run(|| {
                traffic::ping(
                    HOST_B,
                    3,
                    Pace::Train(Duration::from_millis(100)),
                    Duration::from_millis(300),
                )
            })
            .map_err(|e| e.to_string())??;
        if r.received == r.sent {
            return Ok(());
        }
    }
    Err(
        "Host A cannot reach Host B through this scenario (warm-up pings unanswered for 8 s)"
            .into(),
    )
}

/// MT6D's rotation schedule from gateway A's control socket: (a boundary in unix secs, period).
fn schedule(gw: &Running, period: f64) -> Option<(f64, f64)> {
    let st = mt6d::control::query_status(gw.control_a.as_ref()?).ok()?;
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .ok()?
        .as_secs_f64();
    Some((
        now + st.peers.first()?.next_change_ms as f64 / 1000.0,
        period,
    ))
}

fn profile_json(p: &Profile) -> Value {
    let mut v = Value::obj();
    let pairs = |xs: &[(&str, u64)]| {
        Value::Array(
            xs.iter()
                .map(|(n, b)| {
                    let mut o = Value::obj();
                    o.set("test", *n).set("bytes", *b);
                    o
                })
                .collect(),
        )
    };
    v.set("name", p.name)
        .set("ping_std_count", p.ping_std_count)
        .set("ping_std_interval_ms", p.ping_std_interval_ms)
        .set("floods", pairs(&p.floods))
        .set("downloads", pairs(&p.downloads))
        .set("udp", pairs(&p.udp))
        .set("udp_rate_mbit", p.udp_rate_mbit)
        .set("tcp_secs", p.tcp_secs)
        .set("rotation_secs", p.rotation_secs)
        .set("fast_rotation_secs", p.fast_rotation_secs)
        .set("fast_flood", pairs(&[p.fast_flood]))
        .set("scrub_rounds", u64::from(p.scrub_rounds))
        .set("scrub_secs", p.scrub_secs)
        .set("small_flows", p.small_flows.0)
        .set("small_flows_concurrency", p.small_flows.1)
        .set("workers_rounds", u64::from(p.workers_rounds))
        .set(
            "mt6d_workers",
            p.workers.unwrap_or_else(|| {
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
            }) as u64,
        )
        .set("mt6d_workers_default", p.workers.is_none());
    v
}

/// The server role's section of the report, if the run measured it (`server_cpu`).
fn server_sections(doc: &Value) -> Vec<String> {
    doc.get("server_cpu")
        .map(crate::server::probe_markdown)
        .into_iter()
        .collect()
}
