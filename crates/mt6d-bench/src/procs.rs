//! Child processes of the bench (gateways, peers, servers) and what 000 §4.3 measures of them:
//! CPU by Eq. 4.1 from /proc/PID/stat, private memory from /proc/PID/smaps_rollup, user vs
//! kernel time. Also the reaper that removes our namespaces if the bench itself dies.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::json::{Value, ValueExt};

/// A child that is stopped (SIGTERM, then SIGKILL) when dropped, on every exit path.
#[derive(Debug)]
pub struct Guarded {
    pub label: String,
    child: Option<Child>,
    pub log: Option<PathBuf>,
}

impl Guarded {
    /// Starts `cmd` with stdin closed and stdout+stderr into `log` (or discarded).
    pub fn spawn(label: &str, mut cmd: Command, log: Option<&Path>) -> Result<Guarded, String> {
        cmd.stdin(Stdio::null());
        match log {
            Some(p) => {
                let f = std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?;
                let f2 = f.try_clone().map_err(|e| format!("{}: {e}", p.display()))?;
                cmd.stdout(f).stderr(f2);
            }
            None => {
                cmd.stdout(Stdio::null()).stderr(Stdio::null());
            }
        }
        let child = cmd.spawn().map_err(|e| format!("start {label}: {e}"))?;
        Ok(Guarded {
            label: label.to_string(),
            child: Some(child),
            log: log.map(Path::to_path_buf),
        })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `Some(reason)` when the child has already exited.
    pub fn exited(&mut self) -> Option<String> {
        let c = self.child.as_mut()?;
        match c.try_wait() {
            Ok(Some(st)) => Some(format!(
                "{} exited ({st}): {}",
                self.label,
                self.log_tail(8)
            )),
            _ => None,
        }
    }

    pub fn log_tail(&self, lines: usize) -> String {
        let text = self
            .log
            .as_ref()
            .and_then(|p| std::fs::read_to_string(p).ok())
            .unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join(" | ")
    }

    /// SIGTERM, up to `grace` to exit, then SIGKILL. Idempotent.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Ok(None) = child.try_wait() {
            signal(child.id(), "TERM");
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
        }
        let _ = child.wait();
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(3));
    }
}

/// Sends a signal with kill(1): the bench has no libc dependency of its own.
pub fn signal(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Where install-bench-deps.sh puts wireguard-go and boringtun-cli.
pub const BENCH_BIN: &str = "/opt/mt6d-bench/bin";

/// Finds a program in BENCH_BIN, then in $PATH, /usr/sbin, ~/.cargo/bin, ~/go/bin.
pub fn find_tool(name: &str) -> Option<PathBuf> {
    let mut dirs = vec![PathBuf::from(BENCH_BIN)];
    if let Some(path) = std::env::var_os("PATH") {
        dirs.extend(std::env::split_paths(&path));
    }
    dirs.extend(
        [
            "/usr/sbin",
            "/usr/local/sbin",
            "/usr/local/bin",
            "/usr/bin",
            "/sbin",
        ]
        .map(PathBuf::from),
    );
    if let Some(home) = std::env::var_os("HOME") {
        let home = PathBuf::from(home);
        dirs.push(home.join(".cargo/bin"));
        dirs.push(home.join("go/bin"));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

/// First line of `prog ARGS` (stdout or stderr), for the machine record.
pub fn version_of(prog: &Path, args: &[&str]) -> String {
    match Command::new(prog).args(args).stdin(Stdio::null()).output() {
        Ok(o) => {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text)
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .to_string()
        }
        Err(e) => format!("unavailable: {e}"),
    }
}

/// CPU and memory of one process at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct ProcSample {
    /// Jiffies in user and kernel mode.
    pub utime: u64,
    pub stime: u64,
    /// Process start, jiffies after boot.
    pub start: u64,
    /// Seconds since boot when sampled.
    pub uptime: f64,
    /// Private_Clean + Private_Dirty, kB.
    pub private_kb: u64,
    pub rss_kb: u64,
}

/// USER_HZ; Linux reports /proc times in 1/100 s on every architecture we run on.
pub const HZ: f64 = 100.0;

impl ProcSample {
    pub fn read(pid: u32) -> Option<ProcSample> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // Fields after the command name, which may contain spaces: field 3 is the first.
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let num = |field: usize| f.get(field - 3).and_then(|s| s.parse::<u64>().ok());
        let uptime = std::fs::read_to_string("/proc/uptime")
            .ok()?
            .split_whitespace()
            .next()?
            .parse::<f64>()
            .ok()?;
        let mut s = ProcSample {
            utime: num(14)?,
            stime: num(15)?,
            start: num(22)?,
            uptime,
            ..Default::default()
        };
        if let Ok(smaps) = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
            for line in smaps.lines() {
                let mut it = line.split_whitespace();
                let (Some(k), Some(v)) = (it.next(), it.next()) else {
                    continue;
                };
                let v = v.parse::<u64>().unwrap_or(0);
                match k {
                    "Private_Clean:" | "Private_Dirty:" => s.private_kb += v,
                    "Rss:" => s.rss_kb = v,
                    _ => {}
                }
            }
        }
        Some(s)
    }

    /// 000 Eq. 4.1: average CPU % over the process's life, as `ps` computes it.
    pub fn lifetime_cpu_percent(&self) -> f64 {
        let life = self.uptime - self.start as f64 / HZ;
        if life <= 0.0 {
            return 0.0;
        }
        ((self.utime + self.stime) as f64 * 100.0 / HZ) / life
    }
}

/// CPU seconds (user and kernel) the calling thread has used so far, from
/// /proc/thread-self/stat (in 1/100 s).
pub fn thread_cpu_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").ok()?;
    // Fields after the command name, which may contain spaces: field 3 is the first.
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3).and_then(|s| s.parse::<u64>().ok());
    Some((num(14)? + num(15)?) as f64 / HZ)
}

/// The whole machine's CPU time from /proc/stat's `cpu` line, in jiffies: (busy, all). Busy is
/// user, nice, system, irq, softirq and steal; all adds idle and iowait.
pub fn machine_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    let at = |i: usize| f.get(i).copied().unwrap_or(0);
    let busy = at(0) + at(1) + at(2) + at(5) + at(6) + at(7);
    Some((busy, busy + at(3) + at(4)))
}

/// CPU use between two samples of the same process: % of one core, and the user share.
pub fn window(a: &ProcSample, b: &ProcSample) -> Value {
    let secs = (b.uptime - a.uptime).max(1e-3);
    let user = b.utime.saturating_sub(a.utime) as f64 / HZ;
    let sys = b.stime.saturating_sub(a.stime) as f64 / HZ;
    let mut v = Value::obj();
    v.set("cpu_percent", (user + sys) * 100.0 / secs)
        .set("user_percent", user * 100.0 / secs)
        .set("kernel_percent", sys * 100.0 / secs);
    v
}

/// The 000 §4.3 host metrics of one gateway process at the end of a scenario.
pub fn host_metrics(s: &ProcSample) -> Value {
    let total = (s.utime + s.stime).max(1) as f64;
    let mut v = Value::obj();
    v.set("cpu_percent_eq_4_1", s.lifetime_cpu_percent())
        .set("user_secs", s.utime as f64 / HZ)
        .set("kernel_secs", s.stime as f64 / HZ)
        .set("user_share_percent", s.utime as f64 * 100.0 / total)
        .set("private_memory_kb", s.private_kb)
        .set("rss_kb", s.rss_kb);
    v
}

/// Runs as `mt6d-bench --reaper PID TAG` in its own process group (so a Ctrl-C to the bench's
/// terminal does not reach it): when PID is gone, kills whatever still runs in the namespaces
/// whose names carry TAG and deletes them. The bench cleans up itself on every normal path;
/// this covers SIGINT, SIGKILL and panics that abort.
pub fn reaper(pid: u32, tag: &str) -> ! {
    while Path::new(&format!("/proc/{pid}")).exists() {
        std::thread::sleep(Duration::from_millis(200));
    }
    reap(tag);
    // The work directory (test files, keys, configs) that the bench's own guard did not remove.
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(format!("mt6d-bench-{pid}")));
    std::process::exit(0)
}

/// Kills processes inside, and deletes, every namespace whose name contains `tag`.
pub fn reap(tag: &str) {
    use std::os::unix::fs::MetadataExt as _;
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        if !(name.starts_with("mb") && name.contains(tag)) {
            continue;
        }
        if let Ok(meta) = std::fs::metadata(entry.path()) {
            let want = format!("net:[{}]", meta.ino());
            for p in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
                let Ok(pid) = p.file_name().to_string_lossy().parse::<u32>() else {
                    continue;
                };
                if std::fs::read_link(p.path().join("ns/net"))
                    .is_ok_and(|l| l.to_string_lossy() == want)
                {
                    signal(pid, "KILL");
                }
            }
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Starts the reaper for this process.
pub fn start_reaper(tag: &str) -> Option<Child> {
    use std::os::unix::process::CommandExt as _;
    let exe = std::env::current_exe().ok()?;
    Command::new(exe)
        .arg("--reaper")
        .arg(std::process::id().to_string())
        .arg(tag)
        .process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()
}
