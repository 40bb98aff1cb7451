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

/// One thread's CPU so far: nanoseconds on a CPU from /proc/PID/task/TID/schedstat (the
/// scheduler's own sum, exact to the nanosecond), and the user/kernel split in jiffies from its
/// stat. A Fig. 2 cell of 5,000 requests costs the server 0.1-0.15 s and the plain echo
/// 0.04-0.06 s, 4 to 15 of the stat file's 10 ms jiffies: per request from jiffies alone would
/// be off by up to a quarter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ThreadCpu {
    pub tid: u32,
    /// The thread's name (`comm`), e.g. `mt6d-s0` for a server worker.
    pub comm: String,
    pub cpu_ns: u64,
    pub utime: u64,
    pub stime: u64,
}

impl ThreadCpu {
    /// Thread `tid` of process `pid` (`None` once it is gone).
    pub fn read(pid: u32, tid: u32) -> Option<ThreadCpu> {
        let dir = format!("/proc/{pid}/task/{tid}");
        let stat = std::fs::read_to_string(format!("{dir}/stat")).ok()?;
        let (comm, utime, stime) = parse_stat_times(&stat)?;
        let cpu_ns = std::fs::read_to_string(format!("{dir}/schedstat"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(ThreadCpu {
            tid,
            comm,
            cpu_ns,
            utime,
            stime,
        })
    }

    /// Every thread of process `pid` now (empty once it is gone).
    pub fn all(pid: u32) -> Vec<ThreadCpu> {
        let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return Vec::new();
        };
        let mut v: Vec<ThreadCpu> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .filter_map(|tid| ThreadCpu::read(pid, tid))
            .collect();
        v.sort_by_key(|t| t.tid);
        v
    }

    /// The calling thread's id, from the /proc/thread-self link (`PID/task/TID`).
    pub fn own_tid() -> Option<u32> {
        std::fs::read_link("/proc/thread-self")
            .ok()?
            .file_name()?
            .to_str()?
            .parse()
            .ok()
    }
}

/// (comm, utime, stime) of a /proc stat line; the name may contain spaces and parentheses.
fn parse_stat_times(stat: &str) -> Option<(String, u64, u64)> {
    let open = stat.find('(')?;
    let close = stat.rfind(')')?;
    let comm = stat.get(open + 1..close)?.to_string();
    // Fields after the command name: field 3 is the first.
    let f: Vec<&str> = stat.get(close + 2..)?.split_whitespace().collect();
    let num = |field: usize| f.get(field - 3).and_then(|s| s.parse::<u64>().ok());
    Some((comm, num(14)?, num(15)?))
}

/// A process's CPU between two [`ThreadCpu::all`] samples, split by thread: the main thread
/// (its id is the process's), the threads whose name starts with `workers` (a role's data
/// plane: `mt6d-s` for the server), and the rest (metrics, neighbour discovery). A thread
/// that started between the samples counts from zero; one that ended is not counted.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct CpuSplit {
    pub main_ns: u64,
    pub workers_ns: u64,
    pub other_ns: u64,
    pub user_jiffies: u64,
    pub kernel_jiffies: u64,
}

impl CpuSplit {
    pub fn between(pid: u32, workers: &str, a: &[ThreadCpu], b: &[ThreadCpu]) -> CpuSplit {
        let mut s = CpuSplit::default();
        for t in b {
            let before = a.iter().find(|x| x.tid == t.tid);
            let d = |f: fn(&ThreadCpu) -> u64| f(t).saturating_sub(before.map_or(0, f));
            let ns = d(|x| x.cpu_ns);
            if t.tid == pid {
                s.main_ns += ns;
            } else if t.comm.starts_with(workers) {
                s.workers_ns += ns;
            } else {
                s.other_ns += ns;
            }
            s.user_jiffies += d(|x| x.utime);
            s.kernel_jiffies += d(|x| x.stime);
        }
        s
    }

    pub fn total_ns(&self) -> u64 {
        self.main_ns + self.workers_ns + self.other_ns
    }

    /// The split as JSON: CPU seconds per group and, when `per` (requests, rotated clients)
    /// is above zero, microseconds per one of them (`us_per_UNIT`, `main_us_per_UNIT`, ...).
    pub fn json(&self, per: u64, unit: &str) -> Value {
        let us = |ns: u64| ns as f64 / 1e3 / per as f64;
        let mut v = Value::obj();
        v.set("cpu_secs", self.total_ns() as f64 / 1e9)
            .set("main_secs", self.main_ns as f64 / 1e9)
            .set("workers_secs", self.workers_ns as f64 / 1e9)
            .set("other_secs", self.other_ns as f64 / 1e9)
            .set("user_secs", self.user_jiffies as f64 / HZ)
            .set("kernel_secs", self.kernel_jiffies as f64 / HZ);
        if per > 0 {
            v.set(&format!("us_per_{unit}"), us(self.total_ns()))
                .set(&format!("main_us_per_{unit}"), us(self.main_ns))
                .set(&format!("workers_us_per_{unit}"), us(self.workers_ns))
                .set(&format!("other_us_per_{unit}"), us(self.other_ns));
        }
        v
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_times_survive_a_name_with_spaces_and_parentheses() {
        let line = "4242 (mt6d (s 0)) S 1 4242 4242 0 -1 4194560 10 0 0 0 123 45 0 0 20 0 3 0 99 0";
        assert_eq!(
            parse_stat_times(line),
            Some(("mt6d (s 0)".to_string(), 123, 45))
        );
        assert_eq!(parse_stat_times("4242 (cut"), None);
        assert_eq!(parse_stat_times("4242 (x) S 1 2"), None);
    }

    fn t(tid: u32, comm: &str, cpu_ns: u64, utime: u64) -> ThreadCpu {
        ThreadCpu {
            tid,
            comm: comm.into(),
            cpu_ns,
            utime,
            stime: 1,
        }
    }

    #[test]
    fn split_sorts_threads_into_main_workers_and_the_rest() {
        let a = [
            t(10, "mt6d", 1_000, 5),
            t(11, "mt6d-s0", 2_000, 5),
            t(13, "gone", 7, 0),
        ];
        let b = [
            t(10, "mt6d", 4_000, 6),
            t(11, "mt6d-s0", 9_000, 8),
            t(12, "mt6d-s1", 500, 1),
            t(14, "mt6d-metrics", 30, 0),
        ];
        let s = CpuSplit::between(10, "mt6d-s", &a, &b);
        assert_eq!(s.main_ns, 3_000);
        // A worker that started between the samples counts from zero.
        assert_eq!(s.workers_ns, 7_500);
        assert_eq!(s.other_ns, 30);
        assert_eq!(s.user_jiffies, 1 + 3 + 1);
        assert_eq!(s.kernel_jiffies, 1 + 1);
        let v = s.json(1_000, "request");
        let got = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        assert!((got("us_per_request") - 0.01053).abs() < 1e-12, "{v}");
        assert!(
            (got("workers_us_per_request") - 0.0075).abs() < 1e-12,
            "{v}"
        );
        assert!(s.json(0, "request").get("us_per_request").is_none());
    }

    #[test]
    fn reads_this_process_and_its_busy_thread() {
        let pid = std::process::id();
        let tid = ThreadCpu::own_tid().expect("thread-self");
        let a = ThreadCpu::read(pid, tid).expect("own thread");
        let spin = Instant::now();
        let mut x = 0u64;
        while spin.elapsed() < Duration::from_millis(30) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        let b = ThreadCpu::read(pid, tid).expect("own thread");
        // 30 ms of spinning is at least 1 ms on a CPU however busy the machine.
        assert!(b.cpu_ns >= a.cpu_ns + 1_000_000, "{a:?} {b:?}");
        let all = ThreadCpu::all(pid);
        assert!(all.iter().any(|x| x.tid == tid), "{all:?}");
        assert!(all.iter().any(|x| x.tid == pid), "{all:?}");
    }
}
