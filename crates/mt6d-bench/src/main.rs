//! `mt6d-bench` (run as `mt6d bench`): the thesis evaluation of 000 Ch. 4-5 in network
//! namespaces. Builds the switched, routed and tunneled topologies (000 §4.1), runs each
//! scenario (no tunnel, MT6D plain/auth/encrypt, wireguard-go, boringtun) with the traffic of
//! 000 Table 4.1, measures the gateways as in 000 §4.3, and writes JSON, Markdown and SVG plots.
//! docs/BENCH.md documents the profiles and how to read the results.

mod json;
mod machine;
mod peers;
mod procs;
mod profile;
mod report;
mod run;
mod soak;
mod topo;
mod traffic;

use std::process::ExitCode;

use profile::{Profile, Scenario, Topology};

const USAGE: &str = "\
usage: mt6d bench [--quick] [--only SCENARIO[,..]] [--topology T[,..]] [--out DIR] [--ping-std N]
       mt6d bench --soak HOURS [--sample-secs S] [--restart-every MINUTES] [--out DIR]

  --quick          short tests, every scenario on every topology (< 5 minutes on 2 cores)
  --only LIST      scenarios: none, mt6d-plain, mt6d-auth, mt6d-encrypt, wireguard-go, boringtun
  --topology LIST  topologies: switched, routed, tunneled
  --out DIR        where results.json, report.md and the plots go (default bench-results/DATE)
  --ping-std N     echoes in ping_std (full profile: 1,000 at 1/s as in 000, about 5 hours in
                   all; --ping-std 30 makes a full run last about 25 minutes)
  --soak HOURS     the long run instead (switched lab, rotation 1 s, rekey 120 s): a long-lived
                   TCP transfer, a 50 packets/s RTP-like UDP stream, a ping train; reports
                   session breaks, loss, jitter, daemon memory and descriptors over time
  --sample-secs S  soak: seconds between samples (default 60)
  --restart-every MINUTES  soak: restart Gateway B this often (default never)

Needs root. Install the peers first: scripts/install-bench-deps.sh (docs/BENCH.md).";

/// The parsed command line.
#[derive(Debug)]
pub struct Args {
    pub profile: Profile,
    pub scenarios: Vec<Scenario>,
    pub topologies: Vec<Topology>,
    pub out: Option<std::path::PathBuf>,
    /// Overrides the profile's ping_std count (the full profile's 1,000 takes 1,000 s a pair).
    pub ping_std: Option<u64>,
    /// `--soak HOURS`: the long run of [`soak`] instead of the evaluation.
    pub soak: Option<soak::SoakArgs>,
}

fn parse_args(mut it: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        profile: Profile::full(),
        scenarios: Scenario::ALL.to_vec(),
        topologies: Topology::ALL.to_vec(),
        out: None,
        ping_std: None,
        soak: None,
    };
    let mut sample_secs = 60u64;
    let mut restart_every = None;
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--quick" => args.profile = Profile::quick(),
            "--full" => args.profile = Profile::full(),
            "--only" => {
                args.scenarios = list(&value("--only")?, Scenario::parse, "scenario")?;
            }
            "--topology" => {
                args.topologies = list(&value("--topology")?, Topology::parse, "topology")?;
            }
            "--out" => args.out = Some(value("--out")?.into()),
            "--ping-std" => {
                let v = value("--ping-std")?;
                args.ping_std =
                    Some(v.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| {
                        format!("--ping-std {v:?}: a count of echoes, at least 1")
                    })?);
            }
            "--soak" => {
                let v = value("--soak")?;
                let hours = v
                    .parse::<f64>()
                    .ok()
                    .filter(|h| *h > 0.0 && h.is_finite())
                    .ok_or_else(|| format!("--soak {v:?}: hours, more than 0"))?;
                args.soak = Some(soak::SoakArgs {
                    hours,
                    sample_secs: 60,
                    restart_every_mins: None,
                    out: None,
                });
            }
            "--sample-secs" => {
                let v = value("--sample-secs")?;
                sample_secs = v
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| format!("--sample-secs {v:?}: seconds, at least 1"))?;
            }
            "--restart-every" => {
                let v = value("--restart-every")?;
                restart_every = Some(
                    v.parse::<f64>()
                        .ok()
                        .filter(|m| *m > 0.0 && m.is_finite())
                        .ok_or_else(|| format!("--restart-every {v:?}: minutes, more than 0"))?,
                );
            }
            "-h" | "--help" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if let Some(n) = args.ping_std {
        args.profile.ping_std_count = n;
    }
    if let Some(soak) = args.soak.as_mut() {
        soak.sample_secs = sample_secs;
        soak.restart_every_mins = restart_every;
        soak.out.clone_from(&args.out);
    }
    Ok(args)
}

fn list<T: Ord>(s: &str, parse: fn(&str) -> Option<T>, what: &str) -> Result<Vec<T>, String> {
    let mut v = s
        .split(',')
        .filter(|x| !x.is_empty())
        .map(|x| parse(x.trim()).ok_or_else(|| format!("unknown {what} {x:?}")))
        .collect::<Result<Vec<T>, String>>()?;
    v.sort();
    v.dedup();
    if v.is_empty() {
        return Err(format!("empty {what} list"));
    }
    Ok(v)
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--reaper") {
        let pid = argv.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
        procs::reaper(pid, argv.get(3).map_or("none", String::as_str));
    }
    let args = match parse_args(std::env::args().skip(1)) {
        Ok(a) => a,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("mt6d bench: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if !mt6d::lab::is_root() {
        eprintln!("mt6d bench: needs root (network namespaces, raw sockets, TUN devices)");
        return ExitCode::from(2);
    }
    // Our namespaces are named mb<role><pid hex>x<n>: the reaper removes exactly those if we die.
    let tag = format!("{:x}x", std::process::id());
    let mut reaper = procs::start_reaper(&tag);
    let result = match &args.soak {
        Some(soak) => soak::run(soak),
        None => run::run(&args),
    };
    procs::reap(&tag);
    if let Some(r) = reaper.as_mut() {
        let _ = r.kill();
        let _ = r.wait();
    }
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("mt6d bench: error: {e}");
            ExitCode::FAILURE
        }
    }
}
