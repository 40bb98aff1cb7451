//! `mt6d-bench` (run as `mt6d bench`): the thesis evaluation of 000 Ch. 4-5 in network
//! namespaces. Builds the switched, routed and tunneled topologies (000 §4.1), runs each
//! scenario (no tunnel, MT6D plain/auth/encrypt, wireguard-go, boringtun) with the traffic of
//! 000 Table 4.1, measures the gateways as in 000 §4.3, and writes JSON, Markdown and the
//! figures (SVG and PNG).
//! docs/BENCH.md documents the profiles and how to read the results.

#![forbid(unsafe_code)]

mod hostid;
mod hostid_report;
mod json;
mod machine;
mod peers;
mod plot;
mod procs;
mod profile;
mod relays;
mod report;
mod run;
mod server;
mod soak;
mod topo;
mod traffic;
mod utc;
mod workdir;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use profile::{Profile, Scenario, Topology};

/// `mt6d bench`: the evaluation of 000 Ch. 4-5, or with --soak the long run.
#[derive(Debug, Parser)]
#[command(
    name = "mt6d bench",
    bin_name = "mt6d bench",
    version,
    about = "The thesis evaluation (000 Ch. 4-5) in network namespaces: every scenario on every \
             topology, or with --soak the long run",
    after_help = "Needs root. Install the peers first: scripts/install-bench-deps.sh \
                  (docs/BENCH.md)."
)]
struct Cli {
    /// Short tests, every scenario on every topology (< 5 minutes on 2 cores).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// The full profile (the default).
    #[arg(long)]
    full: bool,
    /// Scenarios: none, kernel-vxlan, mt6d-plain, mt6d-auth, mt6d-encrypt, wireguard-go, boringtun.
    #[arg(long, value_name = "SCENARIO[,..]", value_delimiter = ',', value_parser = scenario)]
    only: Vec<Scenario>,
    /// Topologies: switched, routed, tunneled.
    #[arg(long, value_name = "T[,..]", value_delimiter = ',', value_parser = topology)]
    topology: Vec<Topology>,
    /// Where results.json, report.md and the plots go (default bench-results/DATE; the soak:
    /// soak-results/DATE).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Echoes in ping_std (full profile: 1,000 at 10/s, 100 s per train, about 45 minutes of
    /// trains in a full run).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    ping_std: Option<u64>,
    /// Data-plane workers of the mt6d gateways (`workers` in their configuration; default:
    /// the daemon's own, one per online CPU). Recorded in results.json as mt6d_workers.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    workers: Option<u64>,
    /// The long run instead (switched lab, rotation 1 s, rekey 120 s): a long-lived TCP
    /// transfer, a 50 packets/s RTP-like UDP stream, a ping train; reports session breaks,
    /// loss, jitter, daemon memory and descriptors over time.
    #[arg(long, value_name = "HOURS", value_parser = positive)]
    soak: Option<f64>,
    /// Soak: seconds between samples.
    #[arg(long, value_name = "S", default_value_t = 60, requires = "soak",
          value_parser = clap::value_parser!(u64).range(1..))]
    sample_secs: u64,
    /// Soak: restart Gateway B this often (default never).
    #[arg(long, value_name = "MINUTES", requires = "soak", value_parser = positive)]
    restart_every: Option<f64>,
    /// Seed 004's HOST_ID experiment instead: every HOST_ID option in
    /// a SYN to 1,000 local servers through mt6d, policy pass and strip, open and strict path;
    /// success ratio and connection delay in 004's layout.
    #[arg(long, conflicts_with_all = ["quick", "full", "only", "topology", "ping_std", "soak"])]
    hostid: bool,
    /// The server role's experiment instead: 002's Fig. 1 (time to make n
    /// addresses answerable, netlink per address against the server role) and Fig. 2
    /// (response time over requests/s and clients, from a many-client generator), memory per
    /// client and rotation CPU. With --quick: up to 10,000 clients and 30,000 requests/s.
    #[arg(long, conflicts_with_all = ["full", "only", "topology", "ping_std", "soak", "hostid"])]
    server: bool,
    /// --server: client counts (default 1,1000,10000,100000,1000000; 0 skips them).
    #[arg(
        long,
        value_name = "N[,..]",
        value_delimiter = ',',
        requires = "server"
    )]
    clients: Vec<usize>,
    /// --server: request rates per second (default 2000,10000,30000,60000,100000,150000).
    #[arg(
        long,
        value_name = "R[,..]",
        value_delimiter = ',',
        requires = "server"
    )]
    rates: Vec<u64>,
    /// --server: requests per cell (default 20,000; 002 used 250,000).
    #[arg(long, value_name = "N", requires = "server")]
    cell: Option<usize>,
    /// --server: longest the netlink method may take for one n, in seconds (default 600).
    #[arg(long, value_name = "S", requires = "server")]
    netlink_limit: Option<u64>,
    /// --server: client counts of the handshake runs, every client handshaking from cold
    /// (default 1000,10000,100000; with --quick 1000; 0 skips them).
    #[arg(
        long,
        value_name = "N[,..]",
        value_delimiter = ',',
        requires = "server"
    )]
    handshakes: Vec<usize>,
    /// --server: threads of the handshake runs' client generator, each playing its share of
    /// the clients on its own hashed /64 and sockets (default: one per online CPU).
    #[arg(long, value_name = "N", requires = "server")]
    generator_threads: Option<usize>,
    /// --server: rotation interval of the server role runs in seconds (default 10, the
    /// goal's). A short one crosses more client boundaries in the idle window, for the main
    /// thread's CPU per rotated client.
    #[arg(long, value_name = "S", requires = "server", value_parser = positive)]
    rotation_secs: Option<f64>,
    /// --server: address counts of the netlink method's Fig. 2 (default 1,1000,10000,20000;
    /// with --quick 1,1000; 0 skips it).
    #[arg(
        long,
        value_name = "N[,..]",
        value_delimiter = ',',
        requires = "server"
    )]
    netlink_fig2: Vec<usize>,
    /// The relay network's experiment instead (003): TCP through one relay and
    /// through two against the kernel's forwarding over the same namespaces, the relays' cost
    /// per datagram by stage, and 003's experiments (`mt6d demo --topology relays`). With
    /// --quick: one 4 s transfer per path and method.
    #[arg(long, conflicts_with_all = ["full", "only", "topology", "ping_std", "soak", "hostid", "server"])]
    relays: bool,
    /// Measure nothing: redraw the figures (SVG and PNG) of a results.json that `mt6d bench`
    /// wrote, next to it. Needs no root.
    #[arg(long, value_name = "RESULTS_JSON", conflicts_with_all = ["quick", "full", "only",
          "topology", "out", "ping_std", "soak"])]
    plot: Option<PathBuf>,
}

/// The parsed command line.
#[derive(Debug)]
pub struct Args {
    pub profile: Profile,
    pub scenarios: Vec<Scenario>,
    pub topologies: Vec<Topology>,
    pub out: Option<PathBuf>,
    /// `--soak HOURS`: the long run of [`soak`] instead of the evaluation.
    pub soak: Option<soak::SoakArgs>,
    /// `--hostid`: the experiment of [`hostid`] instead.
    pub hostid: bool,
    /// `--server`: the experiment of [`server`] instead.
    pub server: Option<server::ServerArgs>,
    /// `--relays`: the experiment of [`relays`] instead.
    pub relays: Option<relays::RelaysArgs>,
}

impl From<Cli> for Args {
    fn from(c: Cli) -> Args {
        let mut profile = if c.quick {
            Profile::quick()
        } else {
            Profile::full()
        };
        if let Some(n) = c.ping_std {
            profile.ping_std_count = n;
        }
        profile.workers = c.workers.and_then(|n| usize::try_from(n).ok());
        Args {
            profile,
            scenarios: chosen(c.only, &Scenario::ALL),
            topologies: chosen(c.topology, &Topology::ALL),
            soak: c.soak.map(|hours| soak::SoakArgs {
                hours,
                sample_secs: c.sample_secs,
                restart_every_mins: c.restart_every,
                out: c.out.clone(),
            }),
            out: c.out,
            hostid: c.hostid,
            relays: c.relays.then(|| {
                if c.quick {
                    relays::RelaysArgs::quick()
                } else {
                    relays::RelaysArgs::full()
                }
            }),
            server: c.server.then(|| {
                let mut a = if c.quick {
                    server::ServerArgs::quick()
                } else {
                    server::ServerArgs::full()
                };
                if !c.clients.is_empty() {
                    a.clients = c.clients.into_iter().filter(|&n| n > 0).collect();
                }
                if !c.rates.is_empty() {
                    a.rates = c.rates;
                }
                if let Some(n) = c.cell {
                    a.cell = n;
                }
                if let Some(s) = c.netlink_limit {
                    a.netlink_limit = std::time::Duration::from_secs(s);
                }
                if !c.netlink_fig2.is_empty() {
                    a.netlink_fig2 = c.netlink_fig2.into_iter().filter(|&n| n > 0).collect();
                }
                if !c.handshakes.is_empty() {
                    a.handshakes = c.handshakes.into_iter().filter(|&n| n > 0).collect();
                }
                if let Some(t) = c.generator_threads {
                    a.generator_threads = t.max(1);
                }
                if let Some(r) = c.rotation_secs {
                    a.rotation_secs = r;
                }
                a
            }),
        }
    }
}

/// The values named, sorted and once each; all of them when none is named.
fn chosen<T: Ord + Clone>(mut v: Vec<T>, all: &[T]) -> Vec<T> {
    v.sort();
    v.dedup();
    if v.is_empty() {
        all.to_vec()
    } else {
        v
    }
}

fn scenario(s: &str) -> Result<Scenario, String> {
    Scenario::parse(s.trim()).ok_or_else(|| format!("unknown scenario {s:?}"))
}

fn topology(s: &str) -> Result<Topology, String> {
    Topology::parse(s.trim()).ok_or_else(|| format!("unknown topology {s:?}"))
}

/// A finite number above 0 (hours, minutes).
fn positive(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|x| *x > 0.0 && x.is_finite())
        .ok_or_else(|| format!("{s:?}: a number above 0"))
}

fn main() -> ExitCode {
    let argv: Vec<String> = std::env::args().collect();
    if argv.get(1).map(String::as_str) == Some("--reaper") {
        let pid = argv.get(2).and_then(|p| p.parse().ok()).unwrap_or(0);
        procs::reaper(pid, argv.get(3).map_or("none", String::as_str));
    }
    let cli = Cli::parse();
    if let Some(results) = &cli.plot {
        // A server run's results.json has its own figures.
        let redraw = std::fs::read_to_string(results)
            .ok()
            .and_then(|t| <json::Value as json::ValueExt>::parse(&t).ok())
            .map_or_else(
                || plot::redraw(results),
                |d| {
                    let dir = results.parent().unwrap_or(std::path::Path::new("."));
                    if d.get("server_role").is_some() {
                        server::figures(&d, dir)
                    } else if d.get("throughput").is_some() {
                        relays::figures(&d, dir)
                    } else {
                        plot::redraw(results)
                    }
                },
            );
        return match redraw {
            Ok(written) => {
                for p in written {
                    println!("{}", p.display());
                }
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("mt6d bench: error: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let args = Args::from(cli);
    if !mt6d_lab::is_root() {
        eprintln!("mt6d bench: needs root (network namespaces, raw sockets, TUN devices)");
        return ExitCode::from(2);
    }
    // Our namespaces are named mb<role><pid hex>x<n>: the reaper removes exactly those if we die.
    let tag = format!("{:x}x", std::process::id());
    let mut reaper = procs::start_reaper(&tag);
    let result = match &args.soak {
        Some(soak) => soak::run(soak),
        None if args.server.is_some() => std::env::current_exe()
            .map_err(|e| format!("own executable: {e}"))
            .and_then(|exe| {
                let a = args
                    .server
                    .clone()
                    .unwrap_or_else(server::ServerArgs::quick);
                server::run(args.out.clone(), &exe.with_file_name("mt6d"), &a)
            }),
        None if args.relays.is_some() => std::env::current_exe()
            .map_err(|e| format!("own executable: {e}"))
            .and_then(|exe| {
                let a = args
                    .relays
                    .clone()
                    .unwrap_or_else(relays::RelaysArgs::quick);
                relays::run(args.out.clone(), &exe.with_file_name("mt6d"), &a)
            }),
        None if args.hostid => std::env::current_exe()
            .map_err(|e| format!("own executable: {e}"))
            .and_then(|exe| hostid::run(args.out.clone(), &exe.with_file_name("mt6d"))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use profile::Mode;

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Cli::try_parse_from(std::iter::once("mt6d-bench").chain(args.iter().copied()))
            .map(Args::from)
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn lists_are_sorted_once_each_and_default_to_all() {
        let a = parse(&[
            "--quick",
            "--only",
            "mt6d-encrypt,none,none",
            "--topology",
            "routed",
        ])
        .expect("valid");
        assert_eq!(
            a.scenarios,
            vec![Scenario::None, Scenario::Mt6d(Mode::Encrypt)]
        );
        assert_eq!(a.topologies, vec![Topology::Routed]);
        assert_eq!(a.profile.ping_std_count, Profile::quick().ping_std_count);
        let a = parse(&["--ping-std", "30"]).expect("valid");
        assert_eq!(a.scenarios, Scenario::ALL.to_vec());
        assert_eq!(a.topologies, Topology::ALL.to_vec());
        assert_eq!(a.profile.ping_std_count, 30);
        assert!(a.soak.is_none());
    }

    #[test]
    fn soak_options_need_the_soak_and_sane_values() {
        let a = parse(&[
            "--soak",
            "0.5",
            "--sample-secs",
            "30",
            "--restart-every",
            "10",
        ])
        .expect("valid");
        let s = a.soak.expect("soak");
        assert_eq!(
            (s.hours, s.sample_secs, s.restart_every_mins),
            (0.5, 30, Some(10.0))
        );
        for bad in [
            &["--soak", "0"][..],
            &["--soak", "inf"],
            &["--sample-secs", "30"],
            &["--soak", "1", "--sample-secs", "0"],
            &["--ping-std", "0"],
            &["--only", "mt6d-turbo"],
            &["--quick", "--full"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn hostid_takes_only_an_output_directory() {
        let a = parse(&["--hostid", "--out", "r"]).expect("valid");
        assert!(a.hostid && a.soak.is_none());
        assert_eq!(a.out, Some(PathBuf::from("r")));
        assert!(!parse(&["--quick"]).expect("valid").hostid);
        for other in [&["--quick"][..], &["--soak", "1"], &["--only", "none"]] {
            let argv: Vec<&str> = ["--hostid"]
                .into_iter()
                .chain(other.iter().copied())
                .collect();
            assert!(parse(&argv).is_err(), "--hostid with {other:?}");
        }
    }

    #[test]
    fn plot_redraws_alone() {
        let c = Cli::try_parse_from(["mt6d-bench", "--plot", "r/results.json"]).expect("valid");
        assert_eq!(c.plot, Some(PathBuf::from("r/results.json")));
        for other in [&["--quick"][..], &["--soak", "1"], &["--out", "x"]] {
            let argv = ["mt6d-bench", "--plot", "results.json"]
                .into_iter()
                .chain(other.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "--plot with {other:?}");
        }
    }
}
