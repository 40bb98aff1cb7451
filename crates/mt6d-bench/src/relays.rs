//! The relay network's experiment, against 003's figures: `mt6d bench
//! --relays`.
//!
//! 1. **Throughput through one relay and through two**, encrypt mode, on the lab's mesh
//!    (`mt6d_lab::relays`, three meshed relays, two edge gateways behind each) with no loss:
//!    TCP from the host behind e1 to the one behind e2 (both behind r1) and to the one behind e3
//!    (behind r2), each for `secs` seconds, `runs` times. The relays' per-stage clocks
//!    (`stage_*_ns`, `rx_datagrams` in their status) before and after each run give the
//!    nanoseconds per datagram of 003's Fig. 16 stages, and their drop counters the loss the
//!    relays added.
//! 2. **The same paths forwarded by the kernel** (no crypto): every daemon stopped, each node on
//!    the path routes the far host's /64 via its neighbour's link-local address, the same
//!    transfers again. The no-crypto reference in the same run.
//! 3. **003's experiments** (`mt6d demo --topology relays --json`, 1 % loss on every link):
//!    six concurrent 10 MiB transfers, 100 MB through one and two relays, the same six with 20 %
//!    loss on one relay link, a cut in the middle of a transfer, captures on every link.
//!
//! Writes results.json, report.md and three figures (SVG and PNG) into the output directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mt6d::status::relay::RelayStatus;
use mt6d_lab::relays::{Flow, RelayLab, RelaySettings, Shape, Size};

use crate::json::{Value, ValueExt};

/// 003's figures: Mbit/s measured through its router with DES per hop, the
/// nanoseconds per 1,024-byte segment at the router with -O2 and 4 OpenMP threads, its
/// concurrent-transfer time (3 hosts x 2 files of 10 MiB) and the least its failover can take
/// (one probe cycle).
const PAPER_MBIT: f64 = 320.0;
const PAPER_NOCRYPTO_MBIT: f64 = 954.0;
const PAPER_NS: f64 = 20_871.0;
const PAPER_CONCURRENT_SECS: f64 = 4.0;
const PAPER_FAILOVER_SECS: f64 = 5.0;

/// What `mt6d bench --relays` measures.
#[derive(Debug, Clone)]
pub struct RelaysArgs {
    /// Seconds per transfer.
    pub secs: u64,
    /// Transfers per path and method.
    pub runs: usize,
    /// Whether to run 003's experiments (the demo) too.
    pub experiments: bool,
}

impl RelaysArgs {
    pub fn full() -> RelaysArgs {
        RelaysArgs {
            secs: 10,
            runs: 3,
            experiments: true,
        }
    }
    pub fn quick() -> RelaysArgs {
        RelaysArgs {
            secs: 4,
            runs: 1,
            experiments: true,
        }
    }
}

/// The two paths: (label, sending host number, receiving host number, relays on the path).
const PATHS: [(&str, u16, u16, &[&str]); 2] = [
    ("one relay", 1, 2, &["r1"]),
    ("two relays", 1, 3, &["r1", "r2"]),
];
/// The nodes each path crosses, in order.
const PATH_NODES: [&[&str]; 2] = [&["e1", "r1", "e2"], &["e1", "r1", "r2", "e3"]];

pub fn run(out: Option<PathBuf>, mt6d: &Path, args: &RelaysArgs) -> Result<PathBuf, String> {
    let (date, time) = crate::utc::utc_now();
    let out = out.unwrap_or_else(|| PathBuf::from(format!("bench-results/{date}-relays")));
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    let mut doc = Value::obj();
    doc.set("date", date.as_str())
        .set("time_utc", time.as_str())
        .set("machine", crate::machine::describe(mt6d))
        .set("transfer_secs", args.secs)
        .set("runs", args.runs as u64);
    let save = |doc: &Value| {
        std::fs::write(out.join("results.json"), doc.pretty()).map_err(|e| e.to_string())
    };
    eprintln!("mt6d bench --relays: building the mesh (9 nodes, 6 hosts)");
    let settings = RelaySettings {
        rotation_secs: 2.0,
        jitter: true,
        mt6d: mt6d.to_path_buf(),
        log_level: "info".into(),
        workers: None,
    };
    let mut lab = RelayLab::up(Shape::Mesh, "mbr", settings).map_err(|e| e.to_string())?;
    let workers = lab
        .status(0)
        .map(|st| st.workers.len())
        .map_err(|e| format!("status of {}: {e}", lab.nodes[0].name))?;
    doc.set("workers", workers as u64);
    let mut paths = Vec::new();
    for (p, &(label, ..)) in PATHS.iter().enumerate() {
        let runs = mt6d_runs(&lab, args, p, &format!("{workers} workers"), 6000)?;
        let mut v = Value::obj();
        v.set("path", label)
            .set("nodes", PATH_NODES[p].join(" - "))
            .set("mt6d", runs);
        paths.push(v);
        doc.set("throughput", Value::Array(paths.clone()));
        save(&doc)?;
    }
    // The same with one worker per node: what the workers bought, in the same run.
    if workers > 1 {
        eprintln!("mt6d bench --relays: restarting every node with workers = 1");
        lab.restart_with_workers(Some(1))
            .map_err(|e| e.to_string())?;
        for (p, _) in PATHS.iter().enumerate() {
            let runs = mt6d_runs(&lab, args, p, "1 worker", 6500)?;
            if let Some(v) = paths.get_mut(p) {
                v.set("mt6d_one_worker", runs);
            }
            doc.set("throughput", Value::Array(paths.clone()));
            save(&doc)?;
        }
    }
    // The kernel's forwarding over the same namespaces, links and paths: no daemon, no crypto.
    for i in 0..lab.nodes.len() {
        lab.stop_node(i).map_err(|e| e.to_string())?;
    }
    for (p, &(label, from, to, _)) in PATHS.iter().enumerate() {
        kernel_path(&lab, PATH_NODES[p], from, to)?;
        let (f, t) = (host(&lab, from)?, host(&lab, to)?);
        let mut runs = Vec::new();
        for r in 0..args.runs {
            eprintln!(
                "mt6d bench --relays: kernel forwarding, {label}, run {}",
                r + 1
            );
            let cpu = CpuWindow::start(&lab, &[]);
            let report = transfer(&lab, f, t, args.secs, 7000 + (p * 10 + r) as u16)?;
            let mut run = Value::obj();
            run.set("mbit_s", report.0)
                .set("sha256_match", report.1)
                .set("cpu", cpu.finish(&lab, report.0, 0));
            runs.push(run);
        }
        if let Some(v) = paths.get_mut(p) {
            v.set("kernel_forwarding", Value::Array(runs));
        }
    }
    doc.set("throughput", Value::Array(paths));
    save(&doc)?;
    drop(lab);
    if args.experiments {
        eprintln!("mt6d bench --relays: 003's experiments (mt6d demo --topology relays)");
        let demo = std::process::Command::new(mt6d)
            .args(["demo", "--topology", "relays", "--json"])
            .stderr(std::process::Stdio::inherit())
            .output()
            .map_err(|e| format!("run {} demo: {e}", mt6d.display()))?;
        let text = String::from_utf8_lossy(&demo.stdout);
        let v = Value::parse(&text).map_err(|e| format!("the demo's JSON: {e}"))?;
        doc.set("experiments", v);
        save(&doc)?;
    }
    std::fs::write(out.join("report.md"), markdown(&doc)).map_err(|e| e.to_string())?;
    figures(&doc, &out)?;
    eprintln!("mt6d bench --relays: {}", out.join("report.md").display());
    Ok(out)
}

/// `args.runs` transfers on path `p` through the running daemons, each with the relays'
/// per-stage nanoseconds per datagram and the drops the relays and edges counted.
fn mt6d_runs(
    lab: &RelayLab,
    args: &RelaysArgs,
    p: usize,
    what: &str,
    port_base: u16,
) -> Result<Value, String> {
    let (label, from, to, relays) = PATHS[p];
    let (f, t) = (host(lab, from)?, host(lab, to)?);
    lab.wait_for_path(f, t, Duration::from_secs(10))?;
    let edges = [PATH_NODES[p][0], last(PATH_NODES[p])];
    let mut runs = Vec::new();
    for r in 0..args.runs {
        eprintln!("mt6d bench --relays: mt6d ({what}), {label}, run {}", r + 1);
        let before = statuses(lab, relays)?;
        let edges_before = statuses(lab, &edges)?;
        let cpu = CpuWindow::start(lab, PATH_NODES[p]);
        let report = transfer(lab, f, t, args.secs, port_base + (p * 10 + r) as u16)?;
        let after = statuses(lab, relays)?;
        let edges_after = statuses(lab, &edges)?;
        let datagrams = counter(&after[0].1, "rx_datagrams")
            .saturating_sub(counter(&before[0].1, "rx_datagrams"));
        let mut stages = Value::obj();
        for ((name, b), (_, a)) in before.iter().zip(&after) {
            stages.set(name, stage_ns(b, a));
        }
        let mut run = Value::obj();
        run.set("mbit_s", report.0)
            .set("sha256_match", report.1)
            .set("relay_stages_ns_per_datagram", stages)
            .set("relay_drops", drops(&before, &after))
            .set("edge_drops", drops(&edges_before, &edges_after))
            .set("cpu", cpu.finish(lab, report.0, datagrams));
        runs.push(run);
    }
    Ok(Value::Array(runs))
}

/// Where the machine's CPU went during one transfer: the whole machine's busy time (/proc/stat)
/// and each daemon's on the path (/proc/PID/stat), against the bytes and datagrams moved.
struct CpuWindow {
    machine: Option<(u64, u64)>,
    nodes: Vec<(String, Option<crate::procs::ProcSample>)>,
    started: std::time::Instant,
}

impl CpuWindow {
    fn start(lab: &RelayLab, nodes: &[&str]) -> CpuWindow {
        let sample = |n: &str| {
            lab.node_index(n)
                .ok()
                .and_then(|i| lab.pid(i))
                .and_then(crate::procs::ProcSample::read)
        };
        CpuWindow {
            machine: crate::procs::machine_jiffies(),
            nodes: nodes.iter().map(|n| (n.to_string(), sample(n))).collect(),
            started: std::time::Instant::now(),
        }
    }

    /// `mbit_s` the transfer's rate, `datagrams` what the path's first relay received meanwhile
    /// (both directions; 0: no daemon): busy cores, CPU seconds per GB moved, and per daemon
    /// (and for everything else together: the TCP endpoints, the kernel's forwarding and
    /// interrupts) CPU microseconds per datagram.
    fn finish(self, lab: &RelayLab, mbit_s: f64, datagrams: u64) -> Value {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let mut v = Value::obj();
        let Some(((b0, _), (b1, _))) = self.machine.zip(crate::procs::machine_jiffies()) else {
            return v;
        };
        let busy_s = b1.saturating_sub(b0) as f64 / crate::procs::HZ;
        let gb = mbit_s * secs / 8_000.0;
        v.set("busy_cores", round2(busy_s / secs));
        if gb > 0.0 {
            v.set("cpu_s_per_gb", round2(busy_s / gb));
        }
        if datagrams == 0 {
            return v;
        }
        let per = |cpu_s: f64| (cpu_s * 1e6 / datagrams as f64 * 100.0).round() / 100.0;
        let mut nodes = Value::obj();
        let mut daemons_s = 0.0;
        for (name, before) in &self.nodes {
            let after = lab
                .node_index(name)
                .ok()
                .and_then(|i| lab.pid(i))
                .and_then(crate::procs::ProcSample::read);
            if let Some((a, b)) = before.zip(after) {
                let cpu_s =
                    (b.utime + b.stime).saturating_sub(a.utime + a.stime) as f64 / crate::procs::HZ;
                daemons_s += cpu_s;
                nodes.set(name, per(cpu_s));
            }
        }
        nodes.set("everything else", per((busy_s - daemons_s).max(0.0)));
        nodes.set("all", per(busy_s));
        v.set("datagrams", datagrams)
            .set("cpu_us_per_datagram", nodes);
        v
    }
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

fn last<'a>(v: &[&'a str]) -> &'a str {
    v.last().copied().unwrap_or_default()
}

fn host(lab: &RelayLab, k: u16) -> Result<usize, String> {
    lab.host_index(k).map_err(|e| e.to_string())
}

/// One TCP transfer of `secs` seconds: (Mbit/s, SHA-256 intact).
fn transfer(
    lab: &RelayLab,
    from: usize,
    to: usize,
    secs: u64,
    port: u16,
) -> Result<(f64, bool), String> {
    let r = lab.transfers(&[Flow {
        from,
        to,
        size: Size::For(Duration::from_secs(secs)),
        port,
        seed: u64::from(port),
    }])?;
    let r = r.first().ok_or("no transfer report")?;
    Ok((r.mbit_s, r.sha256_match))
}

fn statuses(lab: &RelayLab, names: &[&str]) -> Result<Vec<(String, RelayStatus)>, String> {
    names
        .iter()
        .map(|n| {
            let i = lab.node_index(n).map_err(|e| e.to_string())?;
            Ok((n.to_string(), lab.status(i)?))
        })
        .collect()
}

fn counter(s: &RelayStatus, k: &str) -> u64 {
    s.counters.get(k).copied().unwrap_or(0)
}

/// Nanoseconds per received datagram in each stage, between two statuses of one relay.
fn stage_ns(before: &RelayStatus, after: &RelayStatus) -> Value {
    let n = counter(after, "rx_datagrams").saturating_sub(counter(before, "rx_datagrams"));
    let mut v = Value::obj();
    v.set("datagrams", n);
    let mut total = 0.0;
    for stage in ["recv", "lock", "node", "send", "tun_write"] {
        let k = format!("stage_{stage}_ns");
        let ns = counter(after, &k).saturating_sub(counter(before, &k)) as f64 / n.max(1) as f64;
        total += ns;
        v.set(stage, (ns * 10.0).round() / 10.0);
    }
    v.set("total", (total * 10.0).round() / 10.0);
    v
}

/// Every drop counter that rose, per node (`drop_*`, `tun_no_route`, queue drops).
fn drops(before: &[(String, RelayStatus)], after: &[(String, RelayStatus)]) -> Value {
    let mut v = Value::obj();
    for ((name, b), (_, a)) in before.iter().zip(after) {
        for (k, &x) in &a.counters {
            let rose = x.saturating_sub(counter(b, k));
            let is_drop = k.starts_with("drop_")
                || k == "tun_no_route"
                || k == "socket_queue_drops"
                || k == "tx_send_failed"
                || k == "tx_seal_failed";
            if is_drop && rose > 0 {
                v.set(&format!("{name}.{k}"), rose);
            }
        }
    }
    v
}

/// Routes host `from`'s and host `to`'s /64 hop by hop along `nodes` (each via the next node's
/// link-local address on the link between them), with forwarding on.
fn kernel_path(lab: &RelayLab, nodes: &[&str], from: u16, to: u16) -> Result<(), String> {
    let idx: Vec<usize> = nodes
        .iter()
        .map(|n| lab.node_index(n).map_err(|e| e.to_string()))
        .collect::<Result<_, _>>()?;
    for &i in &idx {
        run_in(lab, i, "sysctl", &["-qw", "net.ipv6.conf.all.forwarding=1"])?;
    }
    for (hops, far) in [
        (idx.clone(), mt6d_lab::relays::host_address(to)),
        (
            idx.iter().rev().copied().collect(),
            mt6d_lab::relays::host_address(from),
        ),
    ] {
        let prefix = format!("{}/64", mt6d::config::prefix_of(far));
        for w in hops.windows(2) {
            let (x, y) = (w[0], w[1]);
            let (if_x, if_y) = lab
                .links
                .iter()
                .find_map(|l| {
                    if l.a == x && l.b == y {
                        Some((l.if_a.clone(), l.if_b.clone()))
                    } else if l.a == y && l.b == x {
                        Some((l.if_b.clone(), l.if_a.clone()))
                    } else {
                        None
                    }
                })
                .ok_or_else(|| format!("no link {} - {}", lab.nodes[x].name, lab.nodes[y].name))?;
            let ll = link_local(lab, y, &if_y)?;
            run_in(
                lab,
                x,
                "ip",
                &["-6", "route", "replace", &prefix, "via", &ll, "dev", &if_x],
            )?;
        }
    }
    Ok(())
}

fn run_in(lab: &RelayLab, node: usize, program: &str, args: &[&str]) -> Result<String, String> {
    let ns = &lab.nodes[node].ns;
    let out = ns
        .command(program)
        .map_err(|e| e.to_string())?
        .args(args)
        .output()
        .map_err(|e| format!("{program} in {}: {e}", ns.name()))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {} in {}: {}",
            args.join(" "),
            ns.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn link_local(lab: &RelayLab, node: usize, iface: &str) -> Result<String, String> {
    let text = run_in(
        lab,
        node,
        "ip",
        &["-6", "-o", "addr", "show", "dev", iface, "scope", "link"],
    )?;
    text.split_whitespace()
        .skip_while(|w| *w != "inet6")
        .nth(1)
        .and_then(|a| a.split('/').next())
        .map(str::to_string)
        .ok_or_else(|| format!("no link-local address on {iface}"))
}

fn f(v: &Value, keys: &[&str]) -> Option<f64> {
    v.path(keys).and_then(Value::as_f64)
}

fn median(mut xs: Vec<f64>) -> Option<f64> {
    if xs.is_empty() {
        return None;
    }
    xs.sort_by(f64::total_cmp);
    Some(xs[xs.len() / 2])
}

/// Path `p`'s runs of `method` (`mt6d`, `mt6d_one_worker` or `kernel_forwarding`).
fn runs<'d>(doc: &'d Value, p: usize, method: &str) -> Option<&'d Vec<Value>> {
    doc.path(&["throughput"])?
        .as_array()?
        .get(p)?
        .get(method)?
        .as_array()
}

/// The median over path `p`'s runs of `method` of the value at `keys` in each run.
fn median_of(doc: &Value, p: usize, method: &str, keys: &[&str]) -> Option<f64> {
    median(
        runs(doc, p, method)?
            .iter()
            .filter_map(|r| f(r, keys))
            .collect(),
    )
}

/// The median Mbit/s of path `p`'s runs of `method`.
fn mbit(doc: &Value, p: usize, method: &str) -> Option<f64> {
    median_of(doc, p, method, &["mbit_s"])
}

/// The median of a relay's stage over path `p`'s mt6d runs.
fn stage(doc: &Value, p: usize, relay: &str, stage: &str) -> Option<f64> {
    median_of(
        doc,
        p,
        "mt6d",
        &["relay_stages_ns_per_datagram", relay, stage],
    )
}

/// The median over path `p`'s runs of `method` of a value under the run's `cpu`.
fn cpu(doc: &Value, p: usize, method: &str, keys: &[&str]) -> Option<f64> {
    let mut path = vec!["cpu"];
    path.extend_from_slice(keys);
    median_of(doc, p, method, &path)
}

fn opt(x: Option<f64>, digits: usize) -> String {
    x.map_or_else(|| "-".to_string(), |x| format!("{x:.digits$}"))
}

pub fn markdown(doc: &Value) -> String {
    let mut m = String::new();
    let s = |v: Option<&Value>| v.and_then(Value::as_str).unwrap_or("?").to_string();
    m.push_str(&format!(
        "# Relays against 003\n\n{} {} UTC, `mt6d bench --relays`; {} s transfers, {} runs each (medians).\n\n",
        s(doc.get("date")),
        s(doc.get("time_utc")),
        doc.get("transfer_secs").and_then(Value::as_u64).unwrap_or(0),
        doc.get("runs").and_then(Value::as_u64).unwrap_or(0)
    ));
    let workers = doc.get("workers").and_then(Value::as_u64).unwrap_or(1);
    m.push_str(&format!("## Throughput, encrypt mode, no loss (fig1)\n\n| path | mt6d Mbit/s, {workers} workers per node | mt6d, 1 worker per node | kernel forwarding, no crypto | mt6d / kernel | mt6d / 003's 320 |\n|---|---|---|---|---|---|\n"));
    for (p, (label, ..)) in PATHS.iter().enumerate() {
        let (a, k) = (mbit(doc, p, "mt6d"), mbit(doc, p, "kernel_forwarding"));
        m.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} |\n",
            opt(a, 0),
            opt(mbit(doc, p, "mt6d_one_worker"), 0),
            opt(k, 0),
            a.zip(k)
                .map_or_else(|| "-".into(), |(a, k)| format!("{:.0} %", a / k * 100.0)),
            a.map_or_else(|| "-".into(), |a| format!("{:.1}x", a / PAPER_MBIT))
        ));
    }
    m.push_str(&format!(
        "\n003: {PAPER_MBIT} Mbit/s through its router with DES (about 5 % loss there), {PAPER_NOCRYPTO_MBIT} Mbit/s without crypto.\n\n## Per datagram at the relay (fig2), ns\n\n| path, relay | receive (recvmmsg) | wait for the node lock | open + route + seal | send (sendmmsg, GSO) | total |\n|---|---|---|---|---|---|\n"
    ));
    for (p, (label, _, _, relays)) in PATHS.iter().enumerate() {
        for r in *relays {
            m.push_str(&format!(
                "| {label}, {r} | {} | {} | {} | {} | {} |\n",
                opt(stage(doc, p, r, "recv"), 0),
                opt(stage(doc, p, r, "lock"), 0),
                opt(stage(doc, p, r, "node"), 0),
                opt(stage(doc, p, r, "send"), 0),
                opt(stage(doc, p, r, "total"), 0)
            ));
        }
    }
    m.push_str(&format!("\n003: {PAPER_NS} ns per 1,024-byte segment at the router (DES, -O2, 4 threads). The send stage includes the kernel's work for the next hop that runs in the sending thread (veth).\n\n"));
    cpu_table(&mut m, doc);
    loss_list(&mut m, doc);
    if let Some(e) = doc.get("experiments") {
        experiments(&mut m, e);
    }
    m
}

/// Where the CPU goes, path by path.
fn cpu_table(m: &mut String, doc: &Value) {
    m.push_str("## Where the CPU goes (both cores shared by every node and both TCP endpoints)\n\n| path | busy cores, mt6d | busy cores, kernel | CPU s per GB, mt6d | CPU s per GB, kernel | CPU us per datagram at a relay: by daemon on the path, everything else, all |\n|---|---|---|---|---|---|\n");
    for (p, (label, ..)) in PATHS.iter().enumerate() {
        let per: Vec<String> = PATH_NODES[p]
            .iter()
            .copied()
            .chain(["everything else", "all"])
            .map(|n| {
                format!(
                    "{n} {}",
                    opt(cpu(doc, p, "mt6d", &["cpu_us_per_datagram", n]), 2)
                )
            })
            .collect();
        m.push_str(&format!(
            "| {label} | {} | {} | {} | {} | {} |\n",
            opt(cpu(doc, p, "mt6d", &["busy_cores"]), 2),
            opt(cpu(doc, p, "kernel_forwarding", &["busy_cores"]), 2),
            opt(cpu(doc, p, "mt6d", &["cpu_s_per_gb"]), 2),
            opt(cpu(doc, p, "kernel_forwarding", &["cpu_s_per_gb"]), 2),
            per.join(", ")
        ));
    }
    m.push_str("\nPer datagram: CPU time over the datagrams the path's first relay received in both directions (data and acknowledgements). Everything else is the machine's busy time less the daemons': the TCP endpoints, the kernel's veth and forwarding work, interrupts.\n\n");
}

/// The drops the relays counted, path by path.
fn loss_list(m: &mut String, doc: &Value) {
    m.push_str("## Loss added by the relays\n\n");
    for (p, (label, ..)) in PATHS.iter().enumerate() {
        let drops: Vec<String> = runs(doc, p, "mt6d")
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("relay_drops").and_then(Value::as_object))
            .flat_map(|o| o.iter().map(|(k, v)| format!("{k}={v}")))
            .collect();
        m.push_str(&format!(
            "- {label}: {}\n",
            if drops.is_empty() {
                "no drop counted at any relay".to_string()
            } else {
                drops.join(", ")
            }
        ));
    }
}

/// 003's experiments (fig3), from the demo's document `e`.
fn experiments(m: &mut String, e: &Value) {
    m.push_str("\n## 003's experiments, 1 % loss on every link (fig3)\n\n");
    let c = f(e, &["concurrent", "seconds"]);
    let cb = f(e, &["concurrent_bad_link", "result", "seconds"]);
    m.push_str(&format!(
        "- 3 hosts x 2 files of 10 MiB at once: {} s, files intact: {} of 6 (003: about {PAPER_CONCURRENT_SECS} s)\n- the same with 20 % loss on r1-r2: {} s, files intact: {} of 6\n",
        opt(c, 2),
        e.path(&["concurrent", "intact"]).map_or("?".into(), ToString::to_string),
        opt(cb, 2),
        e.path(&["concurrent_bad_link", "result", "intact"]).map_or("?".into(), ToString::to_string),
    ));
    for key in ["one_relay", "two_relays"] {
        m.push_str(&format!(
            "- 100 MB, {}: {} Mbit/s, intact: {}\n",
            key.replace('_', " "),
            opt(f(e, &[key, "mbit_s"]), 0),
            e.path(&[key, "sha256_match"])
                .map_or("?".into(), ToString::to_string)
        ));
    }
    if let Some(cut) = e.get("cut") {
        m.push_str(&format!(
            "- cut mid-transfer: route moved after {} ms, first echo on the detour {} ms after the cut, transfer intact: {} (003: at least one {PAPER_FAILOVER_SECS} s probe cycle)\n",
            opt(f(cut, &["route_change_ms"]), 0),
            opt(f(cut, &["first_echo_after_cut_ms"]), 0),
            cut.path(&["transfer", "sha256_match"]).map_or("?".into(), ToString::to_string)
        ));
    }
    if let Some(wires) = e.get("capture").and_then(Value::as_array) {
        let frames: u64 = wires
            .iter()
            .filter_map(|w| w.get("frames").and_then(Value::as_u64))
            .sum();
        let leaks: u64 = wires
            .iter()
            .filter_map(|w| w.get("frames_with_true_address").and_then(Value::as_u64))
            .sum();
        let repeated: usize = wires
            .iter()
            .filter_map(|w| w.get("repeated").and_then(Value::as_array))
            .map(Vec::len)
            .sum();
        m.push_str(&format!(
            "- captures on {} links: {frames} frames, {leaks} with a true address, {repeated} 8-byte values seen in two epochs of a link\n",
            wires.len()
        ));
    }
    m.push_str(&format!(
        "- demo checks: {}\n",
        e.get("ok").map_or("?".into(), ToString::to_string)
    ));
}

/// fig1 (throughput), fig2 (per-datagram relay cost by stage, log), fig3 (003's experiments).
pub fn figures(doc: &Value, out: &Path) -> Result<Vec<PathBuf>, String> {
    let labels: Vec<String> = PATHS.iter().map(|p| p.0.to_string()).collect();
    let mut written = crate::plot::write_bars(
        out,
        "fig1",
        "TCP through relays, encrypt mode, no loss".into(),
        "path",
        "Mbit/s",
        labels.clone(),
        vec![
            (
                "mt6d".into(),
                (0..PATHS.len()).map(|p| mbit(doc, p, "mt6d")).collect(),
            ),
            (
                "mt6d, 1 worker per node".into(),
                (0..PATHS.len())
                    .map(|p| mbit(doc, p, "mt6d_one_worker"))
                    .collect(),
            ),
            (
                "kernel forwarding (no crypto)".into(),
                (0..PATHS.len())
                    .map(|p| mbit(doc, p, "kernel_forwarding"))
                    .collect(),
            ),
            ("003, DES".into(), vec![Some(PAPER_MBIT), None]),
        ],
        false,
    )?;
    let stages = ["recv", "lock", "node", "send", "total"];
    let mut series = Vec::new();
    for (p, (label, _, _, relays)) in PATHS.iter().enumerate() {
        for r in *relays {
            series.push((
                format!("{r}, {label}"),
                stages.iter().map(|s| stage(doc, p, r, s)).collect(),
            ));
        }
    }
    series.push((
        "003 (DES, 4 threads)".into(),
        vec![None, None, None, None, Some(PAPER_NS)],
    ));
    written.extend(crate::plot::write_bars(
        out,
        "fig2",
        "Relay cost per datagram by stage (003 Fig. 16 stages)".into(),
        "stage",
        "ns per datagram (log)",
        vec![
            "receive".into(),
            "node lock".into(),
            "open + route + seal".into(),
            "send".into(),
            "total".into(),
        ],
        series,
        true,
    )?);
    if let Some(e) = doc.get("experiments") {
        written.extend(crate::plot::write_bars(
            out,
            "fig3",
            "003's experiments, 1 % loss per link".into(),
            "experiment",
            "seconds",
            vec![
                "3x2x10 MiB".into(),
                "3x2x10 MiB, 20 % on r1-r2".into(),
                "cut: route moved".into(),
            ],
            vec![
                (
                    "mt6d".into(),
                    vec![
                        f(e, &["concurrent", "seconds"]),
                        f(e, &["concurrent_bad_link", "result", "seconds"]),
                        f(e, &["cut", "route_change_ms"]).map(|ms| ms / 1000.0),
                    ],
                ),
                (
                    "003".into(),
                    vec![Some(PAPER_CONCURRENT_SECS), None, Some(PAPER_FAILOVER_SECS)],
                ),
            ],
            false,
        )?);
    }
    Ok(written)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    fn doc() -> Value {
        let run = |mbit: f64, node: f64| {
            Value::parse(&format!(
                r#"{{"mbit_s": {mbit}, "sha256_match": true,
                    "relay_stages_ns_per_datagram": {{
                        "r1": {{"recv": 200, "lock": 20, "node": {node}, "send": 400, "tun_write": 0, "total": 1300}},
                        "r2": {{"recv": 210, "lock": 30, "node": {node}, "send": 410, "tun_write": 0, "total": 1310}}}},
                    "relay_drops": {{}}, "edge_drops": {{}},
                    "cpu": {{"busy_cores": 1.98, "cpu_s_per_gb": 5.5, "datagrams": 100,
                        "cpu_us_per_datagram": {{"e1": 2.5, "r1": 1.5, "e2": 2.25,
                            "everything else": 1.4, "all": 7.65}}}}}}"#
            ))
            .unwrap()
        };
        let k = |mbit: f64| {
            Value::parse(&format!(r#"{{"mbit_s": {mbit}, "sha256_match": true}}"#)).unwrap()
        };
        let mut d = Value::obj();
        d.set("date", "2026-11-26")
            .set("time_utc", "00:00:00")
            .set("workers", 2u64);
        let mut one = Value::obj();
        one.set(
            "mt6d",
            Value::Array(vec![
                run(900.0, 700.0),
                run(1000.0, 650.0),
                run(3000.0, 690.0),
            ]),
        )
        .set("kernel_forwarding", Value::Array(vec![k(4000.0)]))
        .set(
            "mt6d_one_worker",
            Value::Array(vec![run(700.0, 600.0), run(750.0, 600.0)]),
        );
        let mut two = Value::obj();
        two.set("mt6d", Value::Array(vec![run(800.0, 700.0)]));
        d.set("throughput", Value::Array(vec![one, two]));
        d
    }

    #[test]
    fn the_report_takes_medians_and_compares_with_the_kernel_and_003() {
        let d = doc();
        assert_eq!(mbit(&d, 0, "mt6d"), Some(1000.0));
        assert_eq!(stage(&d, 0, "r1", "node"), Some(690.0));
        assert_eq!(mbit(&d, 1, "kernel_forwarding"), None);
        let m = markdown(&d);
        assert!(
            m.contains("| one relay | 1000 | 750 | 4000 | 25 % | 3.1x |"),
            "{m}"
        );
        assert!(m.contains("| two relays | 800 | - | - | - | 2.5x |"), "{m}");
        assert!(m.contains("2 workers per node"), "{m}");
        assert!(
            m.contains("| one relay | 1.98 | - | 5.50 | - | e1 2.50, r1 1.50, e2 2.25, everything else 1.40, all 7.65 |"),
            "{m}"
        );
        assert!(
            m.contains("| two relays, r2 | 210 | 30 | 700 | 410 | 1310 |"),
            "{m}"
        );
        assert!(
            m.contains("- one relay: no drop counted at any relay"),
            "{m}"
        );
    }

    #[test]
    fn the_figures_are_drawn_from_the_document() {
        let dir = std::env::temp_dir().join(format!("mt6d-relays-fig-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let written = figures(&doc(), &dir).unwrap();
        assert_eq!(
            written.len(),
            4,
            "fig1 and fig2, SVG and PNG (no experiments: no fig3)"
        );
        assert!(written
            .iter()
            .all(|p| std::fs::metadata(p).unwrap().len() > 1000));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
