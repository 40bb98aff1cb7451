//! The server's CPU per request beside the kernel's own: the server role's cells against a
//! plain UDP echo (the netlink method's with one address bound: the same requests, the same 10x
//! answers, no tunnel and no TUN), rate by rate, in the same run; and the short probe that
//! `mt6d bench --quick` and `--full` add to their results.

use std::path::Path;
use std::time::Duration;

use mt6d_lab::server_lab::ServerLab;

use super::{items, ServerArgs};
use crate::json::{Value, ValueExt};

/// One row per server role cell that has a plain echo cell at the same rate: the server's µs
/// per request (all threads, workers, main thread), the echo's, and their ratio. The echo is
/// the netlink method's run with the fewest addresses (one in every profile).
pub(super) fn cpu_vs_kernel_echo(doc: &Value) -> Value {
    let f = |v: &Value, k: &[&str]| v.path(k).and_then(Value::as_f64);
    let u = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let echo = items(doc, "fig2_netlink").min_by_key(|r| u(r, "addresses"));
    let mut rows = Vec::new();
    for r in items(doc, "server_role") {
        for c in items(r, "cells") {
            let Some(server) = f(c, &["cpu", "us_per_request"]) else {
                continue;
            };
            let rate = u(c, "rate");
            let kernel = echo
                .into_iter()
                .flat_map(|e| items(e, "cells"))
                .find(|e| u(e, "rate") == rate)
                .and_then(|e| f(e, &["cpu", "us_per_request"]));
            let mut row = Value::obj();
            row.set("clients", u(r, "clients"))
                .set("rate", rate)
                .set("server_us_per_request", server)
                .set(
                    "server_workers_us_per_request",
                    f(c, &["cpu", "workers_us_per_request"]),
                )
                .set(
                    "server_main_us_per_request",
                    f(c, &["cpu", "main_us_per_request"]),
                )
                .set("kernel_echo_us_per_request", kernel)
                .set("ratio", kernel.filter(|k| *k > 0.0).map(|k| server / k));
            rows.push(row);
        }
    }
    Value::Array(rows)
}

/// The probe of `mt6d bench --quick` and `--full`: a server with 1,000 clients rotating every
/// second (its idle rotation, one cell at 10,000 requests/s) and the plain echo at the same rate, about 20 s.
/// An error is recorded in the result, not returned: the lab bench's rows stand without it.
pub fn probe(mt6d: &Path) -> Value {
    let args = ServerArgs {
        clients: vec![1_000],
        rates: vec![10_000],
        cell: 5_000,
        netlink_sizes: Vec::new(),
        netlink_limit: Duration::ZERO,
        handshakes: Vec::new(),
        netlink_fig2: vec![1],
        generator_threads: 1,
        // Short, as the soak's: 11 boundaries per client in the idle window, so the main
        // thread's fixed cost weighs a tenth of what it does at 10 s.
        rotation_secs: 1.0,
    };
    let mut doc = Value::obj();
    if let Err(e) = probe_into(&mut doc, mt6d, &args) {
        eprintln!("mt6d bench: server CPU probe: {e}");
        doc.set("error", e);
    }
    doc
}

fn probe_into(doc: &mut Value, mt6d: &Path, args: &ServerArgs) -> Result<(), String> {
    let work = std::env::temp_dir().join(format!("mt6d-server-cpu-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("{}: {e}", work.display()))?;
    let _work_guard = crate::workdir::RemoveDir(work.clone());
    let lab = ServerLab::build("mbs").map_err(|e| e.to_string())?;
    eprintln!("mt6d bench: server CPU probe, 1000 clients");
    let run = super::role::server_run(&lab, mt6d, &work, args.clients[0], args)?;
    doc.set("server_role", Value::Array(vec![run]));
    doc.set("fig2_netlink", super::netlink::fig2_netlink(&lab, args)?);
    let rows = cpu_vs_kernel_echo(doc);
    doc.set("cpu_vs_kernel_echo", rows);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_server_cells_with_the_one_address_echo_at_the_same_rate() {
        let doc = Value::parse(
            r#"{"server_role": [{"clients": 1000, "cells": [
                    {"rate": 10000, "cpu": {"us_per_request": 30.0, "workers_us_per_request": 27.0,
                                            "main_us_per_request": 3.0}},
                    {"rate": 30000, "cpu": {"us_per_request": 24.0}},
                    {"rate": 60000}]}],
                "fig2_netlink": [
                    {"addresses": 1000, "cells": [{"rate": 10000, "cpu": {"us_per_request": 99.0}}]},
                    {"addresses": 1, "cells": [{"rate": 10000, "cpu": {"us_per_request": 7.5}}]}]}"#,
        )
        .expect("parses");
        let rows = cpu_vs_kernel_echo(&doc);
        let rows = rows.as_array().expect("array");
        assert_eq!(rows.len(), 2, "{rows:?}");
        let f = |r: &Value, k: &str| r.get(k).and_then(Value::as_f64);
        assert_eq!(f(&rows[0], "kernel_echo_us_per_request"), Some(7.5));
        assert_eq!(f(&rows[0], "ratio"), Some(4.0));
        assert_eq!(f(&rows[0], "server_workers_us_per_request"), Some(27.0));
        // No echo cell at 30,000/s: the server's figure stands, no ratio.
        assert_eq!(f(&rows[1], "server_us_per_request"), Some(24.0));
        assert!(
            rows[1].get("ratio").is_some_and(Value::is_null),
            "{:?}",
            rows[1]
        );
    }
}
