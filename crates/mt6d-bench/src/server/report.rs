//! The server bench's report: its two figures and `report.md`.

use std::path::{Path, PathBuf};

use super::{items, FACTOR, IN_FLIGHT, REQUEST, ROTATION_SECS};
use crate::json::{Value, ValueExt};

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
    written.extend(cpu_figure(doc, out)?);
    Ok(written)
}

/// `fig3.{svg,png}`: CPU per request answered per rate, one bar per client count of the server
/// role and one for the kernel's plain echo (none drawn if no cell measured CPU).
fn cpu_figure(doc: &Value, out: &Path) -> Result<Vec<PathBuf>, String> {
    let rows: Vec<&Value> = items(doc, "cpu_vs_kernel_echo").collect();
    if rows.is_empty() {
        return Ok(Vec::new());
    }
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let f = |v: &Value, k: &str| v.get(k).and_then(Value::as_f64);
    let mut rates: Vec<u64> = rows.iter().map(|r| u(r, "rate")).collect();
    rates.sort_unstable();
    rates.dedup();
    let mut clients: Vec<u64> = rows.iter().map(|r| u(r, "clients")).collect();
    clients.sort_unstable();
    clients.dedup();
    let at = |n: Option<u64>, rate: u64, key: &str| {
        rows.iter()
            .find(|r| u(r, "rate") == rate && n.is_none_or(|n| u(r, "clients") == n))
            .and_then(|r| f(r, key))
    };
    let mut series: Vec<(String, Vec<Option<f64>>)> = clients
        .iter()
        .map(|&n| {
            (
                format!("server role, {n} clients"),
                rates
                    .iter()
                    .map(|&r| at(Some(n), r, "server_us_per_request"))
                    .collect(),
            )
        })
        .collect();
    series.push((
        "kernel: plain UDP echo".into(),
        rates
            .iter()
            .map(|&r| at(None, r, "kernel_echo_us_per_request"))
            .collect(),
    ));
    crate::plot::write_bars(
        out,
        "fig3",
        "CPU per request answered: server role against a plain UDP echo".into(),
        "requests per second asked",
        "µs of CPU per request",
        rates.iter().map(u64::to_string).collect(),
        series,
        false,
    )
}

/// `report.md`: every table of the run, from its results.
pub(super) fn markdown(doc: &Value) -> String {
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
        doc.get("rotation_secs")
            .and_then(Value::as_f64)
            .unwrap_or(ROTATION_SECS)
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
    role_table(&mut s, &runs);
    fig2_table(&mut s, &runs);
    netlink_fig2_table(&mut s, doc);
    cpu_table(&mut s, doc);
    handshake_tables(&mut s, doc);
    s
}

/// The server role's memory and idle CPU per client count.
fn role_table(s: &mut String, runs: &[&Value]) {
    s.push_str("\n## The server role per client count\n\n| clients | RSS idle (MB) | bytes per client | rotation (s) | idle CPU, % of a core | client boundaries in the idle window | main thread µs per rotated client |\n|---|---|---|---|---|---|---|\n");
    for r in runs {
        s.push_str(&format!(
            "| {} | {:.0} | {:.0} | {} | {:.2} | {} | {:.2} |\n",
            r.get("clients").and_then(Value::as_u64).unwrap_or(0),
            r.get("rss_kb").and_then(Value::as_u64).unwrap_or(0) as f64 / 1024.0,
            r.get("rss_bytes_per_client")
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            r.get("rotation_secs")
                .and_then(Value::as_f64)
                .unwrap_or(ROTATION_SECS),
            r.path(&["idle_cpu", "cpu_percent"])
                .and_then(Value::as_f64)
                .unwrap_or(0.0),
            r.path(&["idle_cpu", "client_boundaries"])
                .and_then(Value::as_u64)
                .unwrap_or(0),
            r.path(&["idle_cpu", "threads", "main_us_per_rotated_client"])
                .and_then(Value::as_f64)
                .unwrap_or(f64::NAN),
        ));
    }
}

/// Fig. 2 of the server role, cell by cell.
fn fig2_table(s: &mut String, runs: &[&Value]) {
    s.push_str("\n## Fig. 2: response time (mean, p99 in ms; class by mean; fail below 90 % answered) and the server's CPU per request answered (µs: all threads; workers / main thread)\n\n| clients | requests/s asked | achieved | answered % | mean | p99 | max | wrong source | class | server µs/request | workers / main |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    for r in runs {
        for c in items(r, "cells") {
            let f = |k: &str| c.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
            let cpu = |k: &str| {
                c.path(&["cpu", k])
                    .and_then(Value::as_f64)
                    .unwrap_or(f64::NAN)
            };
            s.push_str(&format!(
                "| {} | {} | {:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {} | {:.1} | {:.1} / {:.1} |\n",
                r.get("clients").and_then(Value::as_u64).unwrap_or(0),
                c.get("rate").and_then(Value::as_u64).unwrap_or(0),
                f("achieved_rate"),
                f("answered_percent"),
                f("mean_ms"),
                f("p99_ms"),
                f("max_ms"),
                c.get("wrong_source").and_then(Value::as_u64).unwrap_or(0),
                c.get("class").and_then(Value::as_str).unwrap_or("?"),
                cpu("us_per_request"),
                cpu("workers_us_per_request"),
                cpu("main_us_per_request"),
            ));
        }
    }
}

/// The lab bench's section of its server CPU probe ([`super::probe`]): CPU per request against
/// the kernel's echo, and the rotation's per client.
pub fn probe_markdown(probe: &Value) -> String {
    let mut s = String::from("## Server role: CPU per request and per rotated client\n");
    if let Some(e) = probe.get("error").and_then(Value::as_str) {
        s.push_str(&format!("\nNot measured: {e}\n"));
        return s;
    }
    cpu_table(&mut s, probe);
    let runs: Vec<&Value> = items(probe, "server_role").collect();
    role_table(&mut s, &runs);
    s
}

/// The server's CPU per request against the plain echo's at the same rate, if both ran.
fn cpu_table(s: &mut String, doc: &Value) {
    let rows: Vec<&Value> = items(doc, "cpu_vs_kernel_echo").collect();
    if rows.is_empty() {
        return;
    }
    s.push_str("\n## CPU per request answered: the server role against the kernel's plain UDP echo\n\nThe server process (all threads; its workers; its main thread) from the first request of a cell to the last answer, over the requests answered, against the echo thread of the netlink method's one-address run (the same requests and 10x answers, no tunnel) at the same rate. CPU from /proc/PID/task/*/schedstat. The echo behind the server is not in the server's figure.\n\n| clients | requests/s | server µs/request | workers | main | kernel echo µs/request | server / echo |\n|---|---|---|---|---|---|---|\n");
    for r in rows {
        let f = |k: &str| r.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            r.get("clients").and_then(Value::as_u64).unwrap_or(0),
            r.get("rate").and_then(Value::as_u64).unwrap_or(0),
            f("server_us_per_request"),
            f("server_workers_us_per_request"),
            f("server_main_us_per_request"),
            f("kernel_echo_us_per_request"),
            f("ratio"),
        ));
    }
}

/// Fig. 2 of the netlink method, if it ran.
fn netlink_fig2_table(s: &mut String, doc: &Value) {
    let nl: Vec<&Value> = items(doc, "fig2_netlink").collect();
    if !nl.is_empty() {
        s.push_str("\n## Fig. 2, netlink method: n /128s bound, plain UDP echo (002's server; mean, p99 in ms; the echo thread's CPU per request answered)\n\n| addresses | bound in (s) | requests/s asked | achieved | answered % | mean | p99 | max | wrong source | class | echo µs/request |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
        for r in nl {
            for c in items(r, "cells") {
                let f = |k: &str| c.get(k).and_then(Value::as_f64).unwrap_or(f64::NAN);
                s.push_str(&format!(
                    "| {} | {:.2} | {} | {:.0} | {:.2} | {:.3} | {:.3} | {:.3} | {} | {} | {:.1} |\n",
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
                    c.path(&["cpu", "us_per_request"])
                        .and_then(Value::as_f64)
                        .unwrap_or(f64::NAN),
                ));
            }
        }
    }
}

/// The handshake runs from cold and their restart storms, if they ran.
fn handshake_tables(s: &mut String, doc: &Value) {
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
}
