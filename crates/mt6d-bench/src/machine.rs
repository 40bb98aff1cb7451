//! The machine a run happened on, recorded with every result ("the machine it ran on").

use std::path::Path;

use crate::json::{Value, ValueExt};
use crate::procs::{find_tool, version_of};

pub fn describe(mt6d: &Path) -> Value {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let model = cpuinfo
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .unwrap_or("?")
        .trim()
        .to_string();
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let mut v = Value::obj();
    v.set("hostname", read("/proc/sys/kernel/hostname").trim())
        .set("kernel", read("/proc/sys/kernel/osrelease").trim())
        .set("cpu_model", model)
        .set(
            "cpus",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
        )
        .set("memory_mb", mem_kb / 1024)
        .set(
            "os",
            read("/etc/os-release")
                .lines()
                .find(|l| l.starts_with("PRETTY_NAME="))
                .map(|l| l[12..].trim_matches('"').to_string()),
        );
    let mut tools = Value::obj();
    tools.set("mt6d", version_of(mt6d, &["--version"]));
    for (name, args) in [
        ("wireguard-go", &["--version"][..]),
        ("boringtun-cli", &["--version"][..]),
        ("wg", &["--version"][..]),
        ("iperf3", &["--version"][..]),
        ("nginx", &["-v"][..]),
        ("curl", &["--version"][..]),
    ] {
        let text = match find_tool(name) {
            Some(p) => version_of(&p, args),
            None => "not installed".into(),
        };
        tools.set(name, text);
    }
    v.set("tools", tools);
    v
}
