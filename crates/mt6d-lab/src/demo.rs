//! `mt6d demo`: the whole system, working, with no configuration.
//!
//! Builds the lab of [`super::topology`], measures the path without MT6D (the baseline), then
//! starts two real gateway daemons with a fresh key and drives real traffic through them across
//! several rotations: a ping train, a ping flood and a TCP transfer whose SHA-256 is checked at
//! the other end. An observer on the public link checks that no frame carries a true address and
//! counts the distinct outer address pairs. Prints the hashed addresses of each epoch as they
//! rotate (like the worked example of 000 §3.3), then a summary; `--json` for machines.
//! Everything it created is removed on exit, also on Ctrl-C and on error.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use super::daemon::DaemonProcess;
use super::demo_args::Say;
pub use super::demo_args::{DemoArgs, DemoTopology};
use super::observer::{Observer, ObserverReport};
use super::ping::{ping, Pace, PingReport};
use super::topology::{
    GatewaySettings, Lab, LabKeys, Side, Topology, EXTERNAL_IF, GATEWAY_A, GATEWAY_B, HOST_A,
    HOST_B,
};
use super::transfer::{self, TransferReport};
use mt6d::status::{HandshakeStatus, Status};

const TCP_PORT: u16 = 5001;
/// Pace of the ping trains, with and without the tunnel.
const TRAIN_INTERVAL: Duration = Duration::from_millis(200);
/// Echoes in the baseline train (5 s at the pace above).
const TRAIN_BASELINE_COUNT: u64 = 25;
/// Echoes in the baseline flood.
const BASELINE_FLOOD_COUNT: u64 = 5_000;

type DemoResult<T> = Result<T, Box<dyn std::error::Error>>;

pub fn run(args: DemoArgs) -> DemoResult<()> {
    let DemoTopology::Gateways(topology) = args.topology else {
        return super::relays::demo::run(&args);
    };
    let (mode, handshake) = check_args(&args)?;
    if let Some(pcap) = &args.link_pcap {
        return link_pcap(&args, pcap);
    }
    if !super::is_root() {
        return Err("mt6d demo builds network namespaces and needs root: run it with sudo".into());
    }
    if args.link_report {
        return link_report(&args, topology);
    }
    let check = interruption()?;
    let say = Say { json: args.json };
    let phase = Duration::from_secs_f64(args.duration);
    let lab = build_lab(&args, topology, &say)?;
    let baseline = measure_baseline(&lab, &args, &say, phase)?;
    check()?;

    // Fresh keys, in a private directory, read by the gateways from 0600 files.
    let dir = std::env::temp_dir().join(format!("mt6d-demo-{}", std::process::id()));
    let _dir_guard = DirGuard(dir.clone());
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)?;
    let keys = LabKeys::generate(&dir, handshake, args.rekey)?;
    let gateways = Gateways {
        lab: &lab,
        dir: &dir,
        settings: GatewaySettings {
            rotation_secs: args.rotation,
            mode: &args.mode,
            keys: &keys,
            workers: None,
        },
    };
    announce_gateways(&args, &say, mode, handshake);
    let mut daemons = vec![gateways.start(Side::A, "A")?, gateways.start(Side::B, "B")?];
    warm_up(&lab)?;
    let observer = Observer::start(
        &lab.gw_a,
        EXTERNAL_IF,
        vec![HOST_A, HOST_B, GATEWAY_A, GATEWAY_B],
        args.pcap.clone(),
    )?;
    let monitor = RotationMonitor::start(daemons[0].socket.clone(), args.json);
    let result = through_the_tunnel(&args, &say, &gateways, &mut daemons, phase, &check);
    // Whatever the traffic did, the observer, the monitor and the daemons are stopped first.
    let epochs_seen = monitor.finish();
    let seen = observer.finish()?;
    let statuses: Vec<_> = daemons
        .iter()
        .map(|d| d.status())
        .collect::<Result<_, _>>()?;
    for d in &mut daemons {
        d.stop(Duration::from_secs(5))?;
    }
    let results = Results {
        args: &args,
        mode,
        handshake,
        lab: &lab,
        baseline,
        tunnel: result?,
        epochs_seen,
        seen,
        statuses,
    };
    results.report(&say, &daemons)
}

/// Ctrl-C and SIGTERM set a flag that the returned check reads between phases: the demo then
/// stops with an error, and everything it built is removed on the way out.
fn interruption() -> DemoResult<impl Fn() -> DemoResult<()>> {
    let interrupted = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted.clone())?;
    }
    Ok(move || -> DemoResult<()> {
        if interrupted.load(Ordering::Relaxed) {
            Err("interrupted; cleaning up".into())
        } else {
            Ok(())
        }
    })
}

/// Checks the options that clap cannot: ranges, and which go together. Returns the tunnel
/// mode and whether the gateways use handshakes.
fn check_args(args: &DemoArgs) -> DemoResult<(mt6d_proto::Mode, bool)> {
    if !(1.0..=3600.0).contains(&args.rotation) {
        return Err(format!(
            "--rotation {} out of range (1 to 3600 seconds)",
            args.rotation
        )
        .into());
    }
    if !(1.0..=3600.0).contains(&args.duration) {
        return Err(format!(
            "--duration {} out of range (1 to 3600 seconds)",
            args.duration
        )
        .into());
    }
    let mode: mt6d_proto::Mode = args.mode.parse().map_err(|e| format!("--mode: {e}"))?;
    if let Some(r) = args.rekey {
        if !(1.0..=86_400.0).contains(&r) {
            return Err(format!("--rekey {r} out of range (1 to 86400 seconds)").into());
        }
    }
    let handshake = !args.psk && mode != mt6d_proto::Mode::Plain;
    if args.rekey.is_some() && !handshake {
        return Err("--rekey needs handshakes: drop --psk and use --mode encrypt or auth".into());
    }
    Ok((mode, handshake))
}

/// `mt6d demo --link-pcap FILE`: the linker over an earlier capture and its ground truth.
fn link_pcap(args: &DemoArgs, pcap: &Path) -> DemoResult<()> {
    let near = pcap.with_file_name(
        pcap.file_name()
            .and_then(|n| n.to_str())
            .map_or(String::new(), |n| n.replace("-far.pcap", ".pcap")),
    );
    let truth = super::unlinkability::truth_path(&near);
    let report = super::unlinkability::link_files(pcap, &truth, args.past_router)?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!("{}", report.table());
        println!("side-channel messages: {:?}", report.side_channel_messages);
    }
    Ok(())
}

fn build_lab(args: &DemoArgs, topology: Topology, say: &Say) -> DemoResult<Lab> {
    let between = match topology {
        Topology::Switched => "public link",
        Topology::Routed => "router",
        Topology::Tunneled => "router - VXLAN (MTU 1450) - router",
    };
    let lab = if args.host_mode {
        say.line(format!("mt6d demo: building the {topology} lab (Host A running mt6d in host mode - {between} - Gateway B - Host B) in network namespaces"));
        Lab::build_host_mode(topology, "m6")?
    } else {
        say.line(format!("mt6d demo: building the {topology} lab (Host A - Gateway A - {between} - Gateway B - Host B) in network namespaces"));
        Lab::build_topology(topology, "m6")?
    };
    let names: Vec<&str> = lab.all().map(|n| n.name()).collect();
    say.line(format!(
        "  namespaces {}; Host A {HOST_A}, Host B {HOST_B}",
        names.join(" ")
    ));
    Ok(lab)
}

/// The same path with plain forwarding and no MT6D.
struct Baseline {
    ping: PingReport,
    flood: PingReport,
    tcp: TransferReport,
}

fn measure_baseline(
    lab: &Lab,
    args: &DemoArgs,
    say: &Say,
    phase: Duration,
) -> DemoResult<Baseline> {
    say.line(if args.host_mode {
        "baseline without MT6D: Host A as a plain IPv6 host, forwarded by Gateway B"
    } else {
        "baseline without MT6D: plain IPv6 forwarding through both gateways"
    });
    lab.baseline_up()?;
    warm_up(lab)?;
    // The same pace as the train through the tunnel, so the two medians compare like with like
    // (an idle CPU wakes up more slowly than a busy one).
    let ping_train = lab.host_a.run(|| {
        ping(
            HOST_B,
            TRAIN_BASELINE_COUNT,
            Pace::Train {
                interval: TRAIN_INTERVAL,
            },
            Duration::from_millis(500),
        )
    })??;
    let (bmin, bmed, bmax) = ping_train.rtt_summary();
    say.line(format!(
        "  ping {}/{} rtt min/median/max {bmin:.3}/{bmed:.3}/{bmax:.3} ms",
        ping_train.received, ping_train.sent
    ));
    // A short flood for the busy-path RTT (threads awake), to set against the tunnel's flood.
    let flood = lab.host_a.run(|| {
        ping(
            HOST_B,
            BASELINE_FLOOD_COUNT,
            Pace::Flood {
                wait: Duration::from_millis(10),
            },
            Duration::from_millis(500),
        )
    })??;
    let tcp = tcp_transfer(lab, phase.min(Duration::from_secs(5)), 1)?;
    say.line(format!(
        "  tcp {:.0} Mbit/s ({} bytes, sha256 match {})",
        tcp.mbit_s, tcp.bytes, tcp.sha256_match
    ));
    lab.baseline_down()?;
    Ok(Baseline {
        ping: ping_train,
        flood,
        tcp,
    })
}

fn announce_gateways(args: &DemoArgs, say: &Say, mode: mt6d_proto::Mode, handshake: bool) {
    say.line(format!(
        "starting {}: mode {mode}, rotation every {} s, {}",
        if args.host_mode {
            "mt6d on Host A (host mode) and Gateway B"
        } else {
            "the MT6D gateways"
        },
        args.rotation,
        if handshake {
            format!(
                "identity keys and Noise IK handshakes (rekey every {} s)",
                args.rekey
                    .unwrap_or(mt6d::config::DEFAULT_REKEY_SECS as f64)
            )
        } else {
            "one pre-shared session key".to_string()
        }
    ));
}

/// Starts the lab's daemons from config files in the demo's private directory.
struct Gateways<'a> {
    lab: &'a Lab,
    dir: &'a Path,
    settings: GatewaySettings<'a>,
}

impl Gateways<'_> {
    /// Starts the daemon of `side` and waits until it answers; its config file is written the
    /// first time, so a restarted gateway reads the same one.
    fn start(&self, side: Side, label: &str) -> DemoResult<DaemonProcess> {
        let config = self.dir.join(format!("gateway-{label}.toml"));
        if !config.exists() {
            std::fs::write(&config, self.lab.gateway_config(side, &self.settings))?;
        }
        let mut d = DaemonProcess::start(
            label,
            self.lab.gateway(side),
            &config,
            &self.lab.control_socket(side),
            &self.dir.join(format!("gateway-{label}.log")),
        )?;
        d.wait_ready(Duration::from_secs(10))?;
        Ok(d)
    }
}

/// What went through the tunnel.
struct Tunnel {
    train: PingReport,
    flood: PingReport,
    tcp: TransferReport,
    /// With --restart-gateway: how the restart of Gateway B went.
    restart: Option<serde_json::Value>,
}

/// The ping train, the ping flood and the TCP transfer through the running gateways (Gateway
/// B killed and restarted half-way through the transfer with --restart-gateway).
fn through_the_tunnel(
    args: &DemoArgs,
    say: &Say,
    gateways: &Gateways,
    daemons: &mut [DaemonProcess],
    phase: Duration,
    check: &dyn Fn() -> DemoResult<()>,
) -> DemoResult<Tunnel> {
    let lab = gateways.lab;
    say.line(format!("ping train: {} s at 5 per second", args.duration));
    let count = (args.duration / TRAIN_INTERVAL.as_secs_f64()).ceil() as u64;
    let train = lab.host_a.run(|| {
        ping(
            HOST_B,
            count,
            Pace::Train {
                interval: TRAIN_INTERVAL,
            },
            Duration::from_secs(1),
        )
    })??;
    check()?;
    say.line(format!("ping flood: {} echo requests", args.flood));
    let flood = lab.host_a.run(|| {
        ping(
            HOST_B,
            args.flood,
            Pace::Flood {
                wait: Duration::from_millis(10),
            },
            Duration::from_secs(1),
        )
    })??;
    check()?;
    say.line(format!(
        "tcp transfer: {} s of random data, SHA-256 checked at Host B{}",
        args.duration,
        if args.restart_gateway {
            "; Gateway B is killed and restarted half-way"
        } else {
            ""
        }
    ));
    let (tcp, restart) = if args.restart_gateway {
        let (tcp, r) = std::thread::scope(|s| -> DemoResult<_> {
            let transfer = s.spawn(|| tcp_transfer(lab, phase, 2).map_err(|e| e.to_string()));
            std::thread::sleep(phase / 2);
            let killed = Instant::now();
            daemons[1].kill_hard();
            let started = gateways.start(Side::B, "B");
            let up_ms = killed.elapsed().as_secs_f64() * 1000.0;
            let tcp = transfer
                .join()
                .map_err(|_| "TCP transfer thread panicked")??;
            daemons[1] = started?;
            Ok((tcp, up_ms))
        })?;
        say.line(format!(
            "  Gateway B killed and running again after {r:.0} ms; longest TCP stall {:.0} ms",
            tcp.longest_stall_ms
        ));
        let restart = json!({ "gateway": "B", "signal": "SIGKILL", "restarted_after_ms": r, "longest_tcp_stall_ms": tcp.longest_stall_ms });
        (tcp, Some(restart))
    } else {
        (tcp_transfer(lab, phase, 2)?, None)
    };
    Ok(Tunnel {
        train,
        flood,
        tcp,
        restart,
    })
}

/// Everything the demo measured, for its checks and its summary.
struct Results<'a> {
    args: &'a DemoArgs,
    mode: mt6d_proto::Mode,
    handshake: bool,
    lab: &'a Lab,
    baseline: Baseline,
    tunnel: Tunnel,
    epochs_seen: u64,
    seen: ObserverReport,
    /// Gateway A's, then Gateway B's.
    statuses: Vec<Status>,
}

impl Results<'_> {
    /// Gateway A's rotations.
    fn rotations(&self) -> u64 {
        self.statuses[0]
            .peers
            .first()
            .map_or(0, |p| p.counters.rotations)
    }

    /// A handshake counter added over both gateways.
    fn handshake_sum(&self, f: fn(&HandshakeStatus) -> u64) -> u64 {
        self.statuses
            .iter()
            .filter_map(|st| st.peers.first()?.handshake.as_ref().map(f))
            .sum()
    }

    /// What the demo promises and did not keep.
    fn failures(&self) -> Vec<String> {
        let (train, flood, tcp, seen) = (
            &self.tunnel.train,
            &self.tunnel.flood,
            &self.tunnel.tcp,
            &self.seen,
        );
        let rotations = self.rotations();
        let mut failures = Vec::new();
        if train.lost() > 0 {
            failures.push(format!(
                "ping train lost {} of {}",
                train.lost(),
                train.sent
            ));
        }
        if flood.lost() > 0 {
            failures.push(format!(
                "ping flood lost {} of {}",
                flood.lost(),
                flood.sent
            ));
        }
        if !tcp.sha256_match {
            failures.push("TCP transfer: SHA-256 mismatch".into());
        }
        if self.handshake && self.handshake_sum(|h| h.handshakes) == 0 {
            failures.push("no handshake completed".into());
        }
        if seen.frames_with_true_address > 0 {
            failures.push(format!(
                "{} frames on the public link carried a true address; first: {}",
                seen.frames_with_true_address,
                seen.first_leak.clone().unwrap_or_default()
            ));
        }
        if (seen.outer_pairs.len() as u64) < rotations {
            failures.push(format!(
                "only {} outer address pairs for {rotations} rotations",
                seen.outer_pairs.len()
            ));
        }
        failures
    }

    /// Prints the summary (text, or JSON with --json) and fails if a check failed.
    fn report(&self, say: &Say, daemons: &[DaemonProcess]) -> DemoResult<()> {
        let failures = self.failures();
        if self.args.json {
            println!("{}", serde_json::to_string_pretty(&self.json(&failures))?);
        } else {
            self.print(say, daemons, &failures);
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(format!("demo checks failed: {}", failures.join("; ")).into())
        }
    }

    fn json(&self, failures: &[String]) -> serde_json::Value {
        let (args, lab, seen, statuses) = (self.args, self.lab, &self.seen, &self.statuses);
        let (train, flood, tcp) = (&self.tunnel.train, &self.tunnel.flood, &self.tunnel.tcp);
        let (bmin, bmed, bmax) = self.baseline.ping.rtt_summary();
        let (tmin, tmed, tmax) = train.rtt_summary();
        let (_, flood_med, _) = flood.rtt_summary();
        let (_, base_flood_med, _) = self.baseline.flood.rtt_summary();
        let base_tcp = &self.baseline.tcp;
        json!({
            "topology": args.topology.name(),
            "host_mode": args.host_mode,
            "router_unresolved_discards": lab.router_unresolved_discards(),
            "mode": self.mode.to_string(),
            "rotation_secs": args.rotation,
            "duration_secs": args.duration,
            "rotations": self.rotations(),
            "epochs_seen": self.epochs_seen,
            "ping": {
                "sent": train.sent, "received": train.received,
                "rtt_ms": { "min": tmin, "median": tmed, "max": tmax },
            },
            "flood": {
                "sent": flood.sent, "received": flood.received,
                "rtt_ms": { "median": flood_med },
                "baseline_rtt_ms": { "median": base_flood_med },
                "added_rtt_ms": flood_med - base_flood_med,
            },
            "tcp": { "bytes": tcp.bytes, "seconds": tcp.seconds, "sha256_match": tcp.sha256_match, "mbit_s": tcp.mbit_s, "longest_stall_ms": tcp.longest_stall_ms },
            "transfer": { "sha256_match": tcp.sha256_match, "bytes": tcp.bytes, "longest_stall_ms": tcp.longest_stall_ms },
            "keying": if self.handshake { "handshake" } else { "pre-shared" },
            "rekey_secs": args.rekey,
            "handshakes": self.handshake_sum(|h| h.handshakes),
            "rekeys": self.handshake_sum(|h| h.rekeys),
            "restart": self.tunnel.restart,
            "baseline": {
                "rtt_ms": { "min": bmin, "median": bmed, "max": bmax },
                "tcp": { "mbit_s": base_tcp.mbit_s, "bytes": base_tcp.bytes, "sha256_match": base_tcp.sha256_match },
            },
            "tunnel_added_rtt_ms": tmed - bmed,
            "true_addresses": {
                "host_a": HOST_A.to_string(), "host_b": HOST_B.to_string(),
                // Host mode has no Gateway A (and no address of its on an internal link).
                "gateway_a": (!args.host_mode).then(|| GATEWAY_A.to_string()),
                "gateway_b": GATEWAY_B.to_string(),
            },
            "outer_address_pairs": seen.outer_pairs.len(),
            "observer": {
                "frames": seen.frames, "udp_frames": seen.udp_frames,
                "frames_with_true_address": seen.frames_with_true_address,
                "pcap": args.pcap.as_ref().map(|p| p.display().to_string()),
            },
            "gateways": {
                "a": statuses[0].peers.first().map(|p| &p.counters),
                "b": statuses[1].peers.first().map(|p| &p.counters),
                "a_handshake": statuses[0].peers.first().and_then(|p| p.handshake.as_ref()),
                "b_handshake": statuses[1].peers.first().and_then(|p| p.handshake.as_ref()),
            },
            "ok": failures.is_empty(),
            "failures": failures,
        })
    }

    fn print(&self, say: &Say, daemons: &[DaemonProcess], failures: &[String]) {
        let (args, lab, seen, mode) = (self.args, self.lab, &self.seen, self.mode);
        let (train, flood, tcp) = (&self.tunnel.train, &self.tunnel.flood, &self.tunnel.tcp);
        let (_, bmed, _) = self.baseline.ping.rtt_summary();
        let (tmin, tmed, tmax) = train.rtt_summary();
        let (_, flood_med, _) = flood.rtt_summary();
        let (_, base_flood_med, _) = self.baseline.flood.rtt_summary();
        let added_ms = tmed - bmed;
        let rotations = self.rotations();
        say.line("");
        say.line(format!(
            "summary ({mode}, {} topology{}, rotation {} s): {rotations} rotations",
            args.topology,
            if args.host_mode { ", host mode" } else { "" },
            args.rotation
        ));
        if !lab.routers.is_empty() {
            say.line(format!(
                "  router      {} packets dropped waiting for neighbour discovery (001 §4.2)",
                lab.router_unresolved_discards()
            ));
        }
        say.line(format!(
            "  ping train  {}/{} received, rtt min/median/max {tmin:.3}/{tmed:.3}/{tmax:.3} ms (baseline median {bmed:.3} ms, added {added_ms:+.3} ms)",
            train.received, train.sent
        ));
        say.line(format!(
            "  ping flood  {}/{} received, rtt median {flood_med:.3} ms (baseline {base_flood_med:.3} ms, added {:+.3} ms)",
            flood.received,
            flood.sent,
            flood_med - base_flood_med
        ));
        say.line(format!(
            "  tcp         {:.0} Mbit/s through MT6D, {:.0} Mbit/s baseline; {} bytes, sha256 {}",
            tcp.mbit_s,
            self.baseline.tcp.mbit_s,
            tcp.bytes,
            if tcp.sha256_match {
                "matches"
            } else {
                "MISMATCH"
            }
        ));
        if self.handshake {
            let (handshakes, rekeys) = (
                self.handshake_sum(|h| h.handshakes),
                self.handshake_sum(|h| h.rekeys),
            );
            say.line(format!(
                "  handshakes  {handshakes} completed ({rekeys} rekeys) across both gateways"
            ));
        }
        say.line(format!(
            "  observer    {} frames on the public link, {} with a true address, {} distinct outer address pairs",
            seen.frames,
            seen.frames_with_true_address,
            seen.outer_pairs.len()
        ));
        if let Some(p) = &args.pcap {
            say.line(format!("  capture     {}", p.display()));
        }
        for (d, st) in daemons.iter().zip(&self.statuses) {
            if let Some(p) = st.peers.first() {
                let drops: u64 = p.counters.drops.values().sum();
                say.line(format!(
                    "  {:<7} {}   tx {} rx {} packets, {drops} dropped",
                    if st.role == "host" { "host" } else { "gateway" },
                    d.label,
                    p.counters.tx_packets,
                    p.counters.rx_packets
                ));
            }
        }
        say.line(if failures.is_empty() {
            "result: OK".to_string()
        } else {
            format!("result: FAILED: {}", failures.join("; "))
        });
    }
}

/// `mt6d demo --link-report`: the linker's measurement (docs/PRIVACY.md) for every
/// (conversations, shapes) asked, printed as tables or one JSON document, and written to
/// `--link-out` if given. Fails (after writing) if a header or control method links
/// conversations of identical shapes.
fn link_report(args: &DemoArgs, topology: Topology) -> DemoResult<()> {
    if args.host_mode || args.psk || args.rekey.is_some() || args.restart_gateway {
        return Err(
            "--link-report runs its own gateway-mode conversations, keyed as \
--link-keys says: drop --host-mode, --psk, --rekey and --restart-gateway"
                .into(),
        );
    }
    let say = Say { json: args.json };
    let sweep = super::link_sweep::sweep(
        &super::link_sweep::SweepArgs {
            topology,
            mode: args.mode.clone(),
            rotation_secs: args.rotation,
            rotations: (args.duration / args.rotation).ceil().max(2.0) as u32,
            conversations: args.conversations.clone(),
            shapes: args.shapes.clone(),
            keying: args.link_keys,
            classifier: args.classifier,
            mt6d: std::env::current_exe()?,
            pcap: args.pcap.clone(),
        },
        |line| say.line(line),
    )?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&sweep)?);
    } else {
        for r in &sweep.runs {
            let run = &r.run;
            println!(
                "\n{} conversations ({}), {} mode, {} keys, {} topology, rotation {} s: {} epochs, {} frames with a true address, {:.0} s",
                run.conversations, run.shapes, run.mode, run.keying, run.topology, run.rotation_secs, run.epochs,
                run.frames_with_true_address, r.secs
            );
            for rep in &run.reports {
                println!("\n{}", rep.table());
                println!("side-channel messages: {:?}", rep.side_channel_messages);
            }
        }
        println!("\n{}", sweep.markdown());
    }
    if let Some(dir) = &args.link_out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for (name, text) in [
            ("linker.md", sweep.markdown()),
            ("linker.json", serde_json::to_string_pretty(&sweep)?),
        ] {
            let path = dir.join(name);
            std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
        }
    }
    // Conversations of different shapes are told apart by their sizes whatever the tunnel
    // does (payload length, sizes at the switch): only identical mixes test the header and
    // control methods.
    let linking: Vec<String> = sweep
        .runs
        .iter()
        .filter(|r| r.shapes != super::unlinkability::Shapes::Different)
        .flat_map(|r| r.run.linking())
        .collect();
    if linking.is_empty() {
        Ok(())
    } else {
        Err(format!("epochs linked:\n{}", linking.join("\n")).into())
    }
}

/// Waits until an echo gets through: the first packets of a path wait for neighbour discovery
/// on both links (proxy answers included), which is set-up time, not loss.
fn warm_up(lab: &Lab) -> DemoResult<()> {
    for _ in 0..10 {
        let r = lab.host_a.run(|| {
            ping(
                HOST_B,
                1,
                Pace::Flood {
                    wait: Duration::from_secs(1),
                },
                Duration::from_millis(200),
            )
        })??;
        if r.received == 1 {
            return Ok(());
        }
    }
    Err("Host A cannot reach Host B after 10 s of trying".into())
}

/// One TCP transfer from Host A to Host B for `duration`.
pub fn tcp_transfer(lab: &Lab, duration: Duration, seed: u64) -> DemoResult<TransferReport> {
    let listener = lab.host_b.run(|| transfer::listen(HOST_B, TCP_PORT))??;
    let server =
        std::thread::spawn(move || transfer::serve_once(listener, Duration::from_secs(10)));
    let sent = lab
        .host_a
        .run(|| transfer::send_for(HOST_B, TCP_PORT, duration, seed))?;
    let received = server.join().map_err(|_| "TCP receiver thread panicked")?;
    let report = sent?;
    received?;
    Ok(report)
}

/// Prints each new epoch of Gateway A as it starts, with both hashed endpoints.
struct RotationMonitor {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<u64>,
}

impl RotationMonitor {
    fn start(socket: PathBuf, to_stderr: bool) -> RotationMonitor {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let mut last = None;
                let mut seen = 0u64;
                let started = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(st) = mt6d::control::query_status(&socket) {
                        if let Some(p) = st.peers.first() {
                            if last != Some(p.send.epoch) {
                                last = Some(p.send.epoch);
                                seen += 1;
                                let line = format!(
                                    "  [{:6.1}s] epoch {}  A {}  ->  B {}",
                                    started.elapsed().as_secs_f64(),
                                    p.send.epoch,
                                    p.send.local,
                                    p.send.remote
                                );
                                if to_stderr {
                                    eprintln!("{line}");
                                } else {
                                    println!("{line}");
                                }
                            }
                        }
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                seen
            }
        });
        RotationMonitor { stop, thread }
    }

    fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap_or(0)
    }
}

/// Removes the demo's private directory (key, configs, logs) on every exit path.
struct DirGuard(PathBuf);

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
