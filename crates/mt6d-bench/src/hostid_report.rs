//! report.md of `mt6d bench --hostid` from its results.json, in seed 004's layout: the success
//! ratio per option and policy (004 §6.1.1), the connection delay and 004's "delay(option) <
//! delay(NO_OPTION)" share, and the cumulated and per-hundred success tables of 004 Fig. 10-12
//! and §6.1.4.

use std::fmt::Write as _;

use crate::json::Value;

/// Each server's delay in µs (`None`: no SYN-ACK) for one case.
fn delays(doc: &Value, policy: &str, path: &str, form: &str) -> Vec<Option<f64>> {
    let Some(Value::Array(cases)) = doc.get("cases") else {
        return Vec::new();
    };
    cases
        .iter()
        .find(|c| {
            c.get("policy").and_then(Value::as_str) == Some(policy)
                && c.get("path").and_then(Value::as_str) == Some(path)
                && c.get("form").and_then(Value::as_str) == Some(form)
        })
        .and_then(|c| match c.get("delay_us") {
            Some(Value::Array(d)) => Some(d.iter().map(Value::as_f64).collect()),
            _ => None,
        })
        .unwrap_or_default()
}

fn list(doc: &Value, key: &str, field: &str) -> Vec<(String, String)> {
    match doc.get(key) {
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                let s = |k: &str| v.get(k).and_then(Value::as_str).unwrap_or("").to_string();
                (s(field), s("label"))
            })
            .collect(),
        _ => Vec::new(),
    }
}

fn ratio(d: &[Option<f64>]) -> f64 {
    if d.is_empty() {
        return 0.0;
    }
    d.iter().filter(|x| x.is_some()).count() as f64 * 100.0 / d.len() as f64
}

fn median(d: &[Option<f64>]) -> Option<f64> {
    let mut v: Vec<f64> = d.iter().flatten().copied().collect();
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

fn mean(d: &[Option<f64>]) -> Option<f64> {
    let v: Vec<f64> = d.iter().flatten().copied().collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

/// 004 §6.1.2's figure: of the servers both answered, the share where the option's connection
/// was faster than the no-option one.
fn faster_share(opt: &[Option<f64>], none: &[Option<f64>]) -> Option<f64> {
    let pairs: Vec<(f64, f64)> = opt
        .iter()
        .zip(none)
        .filter_map(|(a, b)| Some(((*a)?, (*b)?)))
        .collect();
    (!pairs.is_empty())
        .then(|| pairs.iter().filter(|(a, b)| a < b).count() as f64 * 100.0 / pairs.len() as f64)
}

fn pct(x: f64) -> String {
    format!("{x:.2} %")
}

fn us(x: Option<f64>) -> String {
    x.map_or("–".into(), |v| format!("{v:.0}"))
}

pub fn markdown(doc: &Value) -> String {
    let mut s = String::new();
    let forms = list(doc, "forms", "form");
    let policies: Vec<String> = list(doc, "policies", "policy")
        .into_iter()
        .map(|p| p.0)
        .collect();
    let n = doc.get("servers").and_then(Value::as_u64).unwrap_or(0);
    intro(&mut s, doc, n);
    success_table(&mut s, doc, &forms, &policies);
    delay_table(&mut s, doc, &forms, &policies);
    cumulated_tables(&mut s, doc, &forms, &policies, n);
    per_hundred_tables(&mut s, doc, &forms, n);
    load_table(&mut s, doc);
    s
}

/// The title and what was run.
fn intro(s: &mut String, doc: &Value, n: u64) {
    let _ = writeln!(
        s,
        "# HOST_ID options through mt6d: seed 004's experiment in the lab\n"
    );
    let _ = writeln!(
        s,
        "Run of {} ({:.0} s). {n} servers on Host B (one listening port each, ranked by port), {} of them validating options (ranks {}); Host A sends each option in a SYN with Linux's options (mss, sackOK, ts, nop, ws) through mt6d encrypt (switched topology). Gateway A's `host_id_out` policy either passes the options (`pass`) or strips them (`strip`, the default; it drops malformed blocks). Path `open`: only the validating servers drop malformed SYNs; path `strict`: a router in front of every server also drops SYNs with unknown (200-202, 253, 254) or malformed options. Delay: SYN written to SYN-ACK read on Host A's link, in µs, {} SYNs in flight, every option sent to one window of servers before the next (so the machine's load drifts alike on all); no SYN-ACK within {} ms is a failure. How to reproduce: NOTES.md.\n",
        doc.get("date_utc").and_then(Value::as_str).unwrap_or("?"),
        doc.get("duration_secs").and_then(Value::as_f64).unwrap_or(0.0),
        match doc.get("validating_ranks") {
            Some(Value::Array(a)) => a.len(),
            _ => 0,
        },
        match doc.get("validating_ranks") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(Value::as_u64)
                .map(|r| r.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            _ => String::new(),
        },
        doc.get("window").and_then(Value::as_u64).unwrap_or(0),
        doc.get("timeout_ms").and_then(Value::as_u64).unwrap_or(0),
    );
}

/// Success ratio per option, policy and path (004 §6.1.1's figures, one line per option).
fn success_table(s: &mut String, doc: &Value, forms: &[(String, String)], policies: &[String]) {
    let _ = writeln!(
        s,
        "## Success ratio per option (004 §6.1.1, §6.1.4-6.1.5)\n"
    );
    let cols: Vec<(String, String)> = ["open", "strict"]
        .iter()
        .flat_map(|p| policies.iter().map(move |q| (p.to_string(), q.clone())))
        .collect();
    let _ = writeln!(
        s,
        "| Option | {} |",
        cols.iter()
            .map(|(p, q)| format!("{p} path, {q}"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let _ = writeln!(s, "|---|{}", "---:|".repeat(cols.len()));
    for (form, label) in forms {
        let cells: Vec<String> = cols
            .iter()
            .map(|(p, q)| pct(ratio(&delays(doc, q, p, form))))
            .collect();
        let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
    }
}

/// Delay (004 §6.1.2's comparison with NO_OPTION), open path.
fn delay_table(s: &mut String, doc: &Value, forms: &[(String, String)], policies: &[String]) {
    let _ = writeln!(
        s,
        "\n## Connection delay, open path (004 §6.1.2: delay(option) < delay(NO_OPTION))\n"
    );
    let _ = writeln!(
        s,
        "Median and mean over the servers that answered, µs; the last columns are 004's figure: of the servers that answered both, the share where the SYN with the option was answered sooner than the one without (about 50 % means no difference).\n"
    );
    let _ = write!(s, "| Option |");
    for q in policies {
        let _ = write!(s, " {q}: median | {q}: mean | {q}: < NO-OPTION |");
    }
    let _ = writeln!(s);
    let _ = writeln!(s, "|---|{}", "---:|".repeat(3 * policies.len()));
    for (form, label) in forms {
        let _ = write!(s, "| {label} |");
        for q in policies {
            let d = delays(doc, q, "open", form);
            let none = delays(doc, q, "open", "no_option");
            let share = if form == "no_option" {
                "–".to_string()
            } else {
                faster_share(&d, &none).map_or("–".into(), pct)
            };
            let _ = write!(s, " {} | {} | {share} |", us(median(&d)), us(mean(&d)));
        }
        let _ = writeln!(s);
    }
}

/// 004 Fig. 10 and §6.1.4: cumulated success ratio TopN, NO-OPTION against one option.
fn cumulated_tables(
    s: &mut String,
    doc: &Value,
    forms: &[(String, String)],
    policies: &[String],
    n: u64,
) {
    let tops: Vec<u64> = [10, 100]
        .into_iter()
        .chain((2..=10).map(|h| h * 100))
        .filter(|t| *t <= n)
        .collect();
    for (form, fig) in [
        ("wing_16", "004 Fig. 10"),
        ("boucadair_bad_padding", "004 §6.1.4"),
    ] {
        let label = forms
            .iter()
            .find(|f| f.0 == form)
            .map_or(form, |f| f.1.as_str());
        for q in policies {
            let none = delays(doc, q, "open", "no_option");
            let opt = delays(doc, q, "open", form);
            if none.is_empty() || opt.is_empty() {
                continue;
            }
            let _ = writeln!(
                s,
                "\n## Cumulated success ratio, {label}, open path, {q} (layout of {fig})\n"
            );
            let _ = writeln!(s, "| | NO-OPTION | {label} | Failure ratio |");
            let _ = writeln!(s, "|---|---:|---:|---:|");
            for t in &tops {
                let k = *t as usize;
                let (a, b) = (ratio(&none[..k]), ratio(&opt[..k]));
                let _ = writeln!(s, "| Top{t} | {} | {} | {} |", pct(a), pct(b), pct(a - b));
            }
        }
    }
}

/// 004 Fig. 11-12: per hundred ranks.
fn per_hundred_tables(s: &mut String, doc: &Value, forms: &[(String, String)], n: u64) {
    for (form, fig) in [
        ("wing_16", "004 Fig. 11"),
        ("boucadair_prefix", "004 Fig. 12"),
    ] {
        let label = forms
            .iter()
            .find(|f| f.0 == form)
            .map_or(form, |f| f.1.as_str());
        let bad = "boucadair_bad_padding";
        let none = delays(doc, "pass", "open", "no_option");
        let opt = delays(doc, "pass", "open", form);
        let malformed = delays(doc, "pass", "open", bad);
        if none.is_empty() || opt.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "\n## Success ratio per hundred ranks, open path, pass (layout of {fig})\n"
        );
        let _ = writeln!(
            s,
            "| Ranks | NO-OPTION | {label} | Failure ratio | bad padding | Failure ratio |"
        );
        let _ = writeln!(s, "|---|---:|---:|---:|---:|---:|");
        for lo in (0..n as usize).step_by(100) {
            let hi = (lo + 100).min(n as usize);
            let (a, b, c) = (
                ratio(&none[lo..hi]),
                ratio(&opt[lo..hi]),
                ratio(&malformed[lo..hi]),
            );
            let _ = writeln!(
                s,
                "| {}-{hi} | {} | {} | {} | {} | {} |",
                lo + 1,
                pct(a),
                pct(b),
                pct(a - b),
                pct(c),
                pct(a - c)
            );
        }
    }
}

/// 004 §7.3 (Fig. 16-18): per number of active users, one column per gateway configuration.
fn load_table(s: &mut String, doc: &Value) {
    let Some(Value::Array(loads)) = doc.get("load") else {
        return;
    };
    let configs: Vec<String> = list(doc, "load_configs", "config")
        .into_iter()
        .map(|c| c.0)
        .collect();
    let object = doc
        .get("load_object_bytes")
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let _ = writeln!(
        s,
        "\n## The gateway under load (layout of 004 §7.3, Fig. 16-18)\n\nN users on Host A, each connecting to Host B again and again and reading a {object}-byte object the server pushes, for the seconds given, through mt6d encrypt: `off` (`[tcp] host_id = false`, `mss_clamp = false`), `strip` (the default policy), and Gateway A injecting into every SYN as 004's CGN did (`inject_wing`: WING with the source port; `inject_boucadair`: BOUCADAIR with the prefix). Connect latency is `connect()`'s time, as curl's time_connect; a SYN the server's backlog dropped is retried by the kernel after 1 s, which is what moves the 95th percentile at 1,000 users.\n"
    );
    let mut users: Vec<u64> = loads
        .iter()
        .filter_map(|l| l.get("users").and_then(Value::as_u64))
        .collect();
    users.sort_unstable();
    users.dedup();
    for n in users {
        let row = |c: &str| {
            loads.iter().find(|l| {
                l.get("users").and_then(Value::as_u64) == Some(n)
                    && l.get("config").and_then(Value::as_str) == Some(c)
            })
        };
        let _ = writeln!(s, "\n### N = {n}\n");
        let _ = writeln!(s, "| | {} |", configs.join(" | "));
        let _ = writeln!(s, "|---|{}", "---:|".repeat(configs.len()));
        let metrics: [(&str, &[&str], usize); 9] = [
            ("Connections tried", &["attempts"], 0),
            ("Connections established", &["established"], 0),
            ("Objects received", &["completed"], 0),
            ("Success ratio %", &["success_pct"], 2),
            ("Connect latency, median ms", &["connect_ms_median"], 3),
            (
                "Connect latency, 95th percentile ms",
                &["connect_ms_p95"],
                3,
            ),
            ("Connections completed/s", &["completed_per_s"], 0),
            ("Throughput received, Mbit/s", &["mbit_per_s"], 2),
            (
                "Gateway A CPU, % of a core",
                &["gateway_a_cpu", "cpu_percent"],
                0,
            ),
        ];
        for (label, path, digits) in metrics {
            let cells: Vec<String> = configs
                .iter()
                .map(|c| match row(c) {
                    Some(l) if l.get("error").is_some() => "failed".to_string(),
                    Some(l) => l
                        .pointer(&format!("/{}", path.join("/")))
                        .and_then(Value::as_f64)
                        .map_or("–".into(), |x| format!("{x:.digits$}")),
                    None => "–".into(),
                })
                .collect();
            let _ = writeln!(s, "| {label} | {} |", cells.join(" | "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::json::ValueExt;

    /// The committed run's report renders again from its results.json, line for line.
    #[test]
    fn the_committed_run_renders_the_same() {
        let dir = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../docs/results/2026-11-25-hostid"
        );
        let text = std::fs::read_to_string(format!("{dir}/results.json")).expect("results.json");
        let doc = Value::parse(&text).expect("parses");
        let committed = std::fs::read_to_string(format!("{dir}/report.md")).expect("report.md");
        assert_eq!(markdown(&doc), committed);
        assert!(
            committed.contains("| HOST_ID_BOUCADAIR, bad padding (malformed) | 97.40 % | 0.00 % |")
        );
    }
}
