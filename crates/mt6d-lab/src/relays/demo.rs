//! `mt6d demo --topology relays`: 003's experiments on the mesh relay lab, with 1 % random loss
//! on every link.
//!
//! (a) three hosts, one behind each relay, each send a 10 MiB file to a host behind each of the
//!     other two relays, all six at once: every SHA-256 checked, the total time;
//! (b) 100 MB through one relay (two hosts behind the same relay) and through two (behind
//!     different relays): Mbit/s;
//! (c) (a) again with 20 % loss on one relay-relay link;
//! (d) that link cut in the middle of a transfer across it: the time to route around it, and
//!     the transfer intact;
//! (e) a capture on every link during traffic, checked for true addresses and for 8-byte values
//!     seen in two epochs of a link.
//!
//! One line per experiment, then the relays' counters; `--json` prints one document on stdout
//! (progress on stderr). `--rotation` sets the links' rotation interval (default 2 s); the
//! gateway demo's other options do not apply and are refused.

use std::time::{Duration, Instant};

use serde_json::json;

use super::{Flow, LinkWire, RelayLab, RelaySettings, Reroute, Shape, Size};
use crate::demo_args::{DemoArgs, Say};
use crate::ping::Pace;
use crate::transfer::TransferReport;
use mt6d::status::relay::RelayStatus;

type DemoResult<T> = Result<T, Box<dyn std::error::Error>>;

/// Loss on every link throughout.
const BASE_LOSS: u8 = 1;
/// Loss on the one bad link of (c).
const BAD_LINK_LOSS: u8 = 20;
const FILE: u64 = 10 << 20;
const BIG: u64 = 100_000_000;

pub fn run(args: &DemoArgs) -> DemoResult<()> {
    refuse_gateway_options(args)?;
    if !crate::is_root() {
        return Err("mt6d demo builds network namespaces and needs root: run it with sudo".into());
    }
    let check = interruption()?;
    let say = Say { json: args.json };
    let lab = build(args, &say)?;
    let h = hosts(&lab)?;
    let [h1, h2, h3, h4, h5, h6] = h;
    lab.set_loss_everywhere(BASE_LOSS)?;
    say.line(format!(
        "every link now loses {BASE_LOSS} % of its frames each way (nftables numgen)\n"
    ));
    let bad = lab.link_index("r1", "r2")?;
    let spread = [(h1, h4), (h1, h6), (h3, h2), (h3, h6), (h5, h2), (h5, h4)];

    check()?;
    let a = concurrent(&lab, &spread, 5300)?;
    say.line(a.line(
        "(a)",
        "6 x 10 MiB at once, h1/h3/h5 -> a host behind each other relay",
    ));
    check()?;
    let (one, two) = through_relays(&lab, h, &say)?;
    check()?;
    let r1 = lab.node_index("r1")?;
    let c = bad_link(&lab, bad, r1, &spread, &say)?;
    check()?;
    let d = cut(&lab, h, bad, r1, &say)?;
    check()?;
    // Every link up, so that the capture sees data on all of them.
    let waited = lab.wait_links_up(Duration::from_secs(30))?;
    let e = capture(
        &lab,
        args.rotation,
        [(h2, h5), (h4, h1), (h6, h3)],
        (h1, h6),
    )?;
    e.say(&say, waited);
    let statuses = relay_counters(&lab, &say)?;
    let failures = failures(&a, &[&one, &two], &c, &d, &e);
    let document = json!({
        "topology": "relays",
        "rotation_secs": args.rotation,
        "base_loss_percent": BASE_LOSS,
        "concurrent": a.json(),
        "one_relay": one,
        "two_relays": two,
        "concurrent_bad_link": { "link": "r1-r2", "loss_percent": BAD_LINK_LOSS, "result": c.json() },
        "cut": d,
        "capture": e.wires,
        "nodes": statuses,
        "ok": failures.is_empty(),
        "failures": failures,
    });
    if args.json {
        println!("{}", serde_json::to_string_pretty(&document)?);
    }
    say.line(if failures.is_empty() {
        "result: OK".to_string()
    } else {
        format!("result: FAILED: {}", failures.join("; "))
    });
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("demo checks failed: {}", failures.join("; ")).into())
    }
}

/// The mesh lab, up, each node on a line.
fn build(args: &DemoArgs, say: &Say) -> DemoResult<RelayLab> {
    say.line(format!(
        "mt6d demo: a relay network in network namespaces: relays r1, r2, r3 fully meshed, \
edge gateways e1-e6 (two behind each relay), hosts h1-h6 (one behind each edge); \
links rotate every {} s with jitter; every link and end-to-end pair is keyed by Noise IK \
handshakes and rekeyed every {} s",
        args.rotation,
        super::config::lab_rekey_secs(args.rotation)
    ));
    let lab = RelayLab::up(
        Shape::Mesh,
        "m6d",
        RelaySettings {
            rotation_secs: args.rotation,
            jitter: true,
            mt6d: std::env::current_exe()?,
            log_level: "info".into(),
            workers: None,
        },
    )?;
    for n in &lab.nodes {
        let behind = n
            .host
            .map(|k| format!(", h{k} {} behind it", super::host_address(k)))
            .unwrap_or_default();
        say.line(format!(
            "  {:<3} {:<18} namespace {}{behind}",
            n.name,
            n.address.to_string(),
            n.ns.name()
        ));
    }
    Ok(lab)
}

/// Hosts h1 to h6, once the paths the experiments take carry echoes.
fn hosts(lab: &RelayLab) -> DemoResult<[usize; 6]> {
    let h = |k| lab.host_index(k);
    let (h1, h2, h3, h4, h5, h6) = (h(1)?, h(2)?, h(3)?, h(4)?, h(5)?, h(6)?);
    for (a, b) in [
        (h1, h2),
        (h1, h3),
        (h1, h4),
        (h1, h6),
        (h3, h2),
        (h3, h6),
        (h5, h2),
        (h5, h4),
    ] {
        lab.wait_for_path(a, b, Duration::from_secs(10))?;
    }
    Ok([h1, h2, h3, h4, h5, h6])
}

/// (b): 100 MB through one relay (h1 -> h2) and through two (h1 -> h3).
fn through_relays(
    lab: &RelayLab,
    [h1, h2, h3, ..]: [usize; 6],
    say: &Say,
) -> DemoResult<(TransferReport, TransferReport)> {
    let one = lab
        .transfers(&[flow(h1, h2, Size::Bytes(BIG), 5400)])?
        .remove(0);
    let two = lab
        .transfers(&[flow(h1, h3, Size::Bytes(BIG), 5401)])?
        .remove(0);
    say.line(format!(
        "(b) 100 MB through one relay (h1 -> h2 via r1): {:.0} Mbit/s, sha256 {}; through two \
(h1 -> h3 via r1, r2): {:.0} Mbit/s, sha256 {}",
        one.mbit_s,
        verdict(one.sha256_match),
        two.mbit_s,
        verdict(two.sha256_match)
    ));
    Ok((one, two))
}

/// (c): (a) again with the bad link `bad` (r1-r2) losing more, and how relay `r1` judged it
/// before it recovers.
fn bad_link(
    lab: &RelayLab,
    bad: usize,
    r1: usize,
    spread: &[(usize, usize)],
    say: &Say,
) -> DemoResult<Concurrent> {
    lab.set_loss(bad, BAD_LINK_LOSS)?;
    let c = concurrent(lab, spread, 5500);
    // How r1 judged the bad link, before it recovers.
    let judged = lab.status(r1).map(|st| {
        st.links
            .iter()
            .find(|l| l.name == "r2")
            .map(|l| {
                format!(
                    "; r1 sees r1-r2 {} (cost {}, {}/{} probes lost)",
                    l.state, l.cost, l.probes_lost, l.probes_sent
                )
            })
            .unwrap_or_default()
    });
    lab.set_loss(bad, BASE_LOSS)?;
    let c = c?;
    say.line(format!(
        "{}{}",
        c.line(
            "(c)",
            &format!("(a) again with {BAD_LINK_LOSS} % loss on r1-r2"),
        ),
        judged?
    ));
    Ok(c)
}

/// (d): the bad link `bad` cut 3 s into an 8 s transfer h1 -> h3 across it.
fn cut(
    lab: &RelayLab,
    [h1, _, h3, ..]: [usize; 6],
    bad: usize,
    r1: usize,
    say: &Say,
) -> DemoResult<Reroute> {
    let r1r3 = lab.link_index("r1", "r3")?;
    // The cut is measured from the direct path: r1-r2 is on probation for 10 s after (c).
    let d = lab.cut_during(
        flow(h1, h3, Size::For(Duration::from_secs(8)), 5600),
        bad,
        r1,
        r1r3,
        Duration::from_secs(3),
    )?;
    say.line(format!(
        "(d) r1-r2 cut 3 s into an 8 s transfer h1 -> h3: r1's route {} -> {} after {}, first echo \
through the detour sent {} after the cut, the transfer's first data frame on r1-r3 after {} \
(TCP's backed-off retransmission); transfer {:.0} Mbit/s, longest stall {:.0} ms, sha256 {}",
        d.route_before.as_deref().unwrap_or("none"),
        d.route_after.as_deref().unwrap_or("unchanged"),
        ms_text(d.route_change_ms),
        ms_text(d.first_echo_after_cut_ms),
        ms_text(d.first_detour_frame_ms),
        d.transfer.mbit_s,
        d.transfer.longest_stall_ms,
        verdict(d.transfer.sha256_match)
    ));
    if d.detour_frames_before_cut > 0 {
        say.line(format!(
            "    (the flow already sent {} data frames over r1-r3 in the second before the cut)",
            d.detour_frames_before_cut
        ));
    }
    Ok(d)
}

/// Every node's status; a line per relay: its counters and its links.
fn relay_counters(lab: &RelayLab, say: &Say) -> DemoResult<Vec<RelayStatus>> {
    let statuses: Vec<_> = (0..lab.nodes.len())
        .map(|i| lab.status(i))
        .collect::<Result<_, _>>()?;
    say.line("\nrelays:");
    for (n, st) in lab.nodes.iter().zip(&statuses) {
        if n.host.is_some() {
            continue;
        }
        let links: Vec<String> = st
            .links
            .iter()
            .map(|l| {
                let rtt = l
                    .rtt_ms
                    .map_or_else(|| "-".into(), |r| format!("{r:.2} ms"));
                format!("{} {} cost {} rtt {rtt}", l.name, l.state, l.cost)
            })
            .collect();
        say.line(format!(
            "  {:<3} forwarded {:>8} frames, dropped {:>6}; {}",
            n.name,
            st.counters.get("forwarded").copied().unwrap_or(0),
            super::dropped(st),
            links.join(", ")
        ));
    }
    Ok(statuses)
}

/// The gateway demo's options that mean nothing on a relay network.
fn refuse_gateway_options(args: &DemoArgs) -> DemoResult<()> {
    if !(1.0..=3600.0).contains(&args.rotation) {
        return Err(format!(
            "--rotation {} out of range (1 to 3600 seconds)",
            args.rotation
        )
        .into());
    }
    let given: Vec<&str> = [
        (args.host_mode, "--host-mode"),
        (args.psk, "--psk"),
        (args.rekey.is_some(), "--rekey"),
        (args.restart_gateway, "--restart-gateway"),
        (args.link_report, "--link-report"),
        (args.link_pcap.is_some(), "--link-pcap"),
        (args.pcap.is_some(), "--pcap"),
        (args.mode != "encrypt", "--mode"),
    ]
    .into_iter()
    .filter_map(|(set, name)| set.then_some(name))
    .collect();
    if given.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "--topology relays runs its own experiments (encrypt-mode links and pairs keyed by handshakes): drop {}",
            given.join(", ")
        )
        .into())
    }
}

/// Ctrl-C and SIGTERM end the demo between experiments, and everything is removed.
fn interruption() -> DemoResult<impl Fn() -> DemoResult<()>> {
    let interrupted = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, interrupted.clone())?;
    }
    Ok(move || -> DemoResult<()> {
        if interrupted.load(std::sync::atomic::Ordering::Relaxed) {
            Err("interrupted; cleaning up".into())
        } else {
            Ok(())
        }
    })
}

fn flow(from: usize, to: usize, size: Size, port: u16) -> Flow {
    Flow {
        from,
        to,
        size,
        port,
        seed: u64::from(port),
    }
}

fn verdict(matched: bool) -> &'static str {
    if matched {
        "intact"
    } else {
        "MISMATCH"
    }
}

fn ms_text(ms: Option<f64>) -> String {
    ms.map_or_else(|| "never".to_string(), |m| format!("{m:.0} ms"))
}

/// Several files at once.
#[derive(Debug)]
struct Concurrent {
    seconds: f64,
    reports: Vec<TransferReport>,
}

fn concurrent(lab: &RelayLab, pairs: &[(usize, usize)], port: u16) -> DemoResult<Concurrent> {
    let flows: Vec<Flow> = pairs
        .iter()
        .zip(port..)
        .map(|(&(a, b), p)| flow(a, b, Size::Bytes(FILE), p))
        .collect();
    let start = Instant::now();
    let reports = lab.transfers(&flows)?;
    Ok(Concurrent {
        seconds: start.elapsed().as_secs_f64(),
        reports,
    })
}

impl Concurrent {
    fn intact(&self) -> usize {
        self.reports.iter().filter(|r| r.sha256_match).count()
    }

    fn line(&self, tag: &str, what: &str) -> String {
        let bytes: u64 = self.reports.iter().map(|r| r.bytes).sum();
        let slowest = self.reports.iter().map(|r| r.seconds).fold(0.0, f64::max);
        format!(
            "{tag} {what}: {}/{} intact, all done in {:.1} s ({:.0} Mbit/s together; slowest file {:.1} s)",
            self.intact(),
            self.reports.len(),
            self.seconds,
            bytes as f64 * 8.0 / self.seconds / 1e6,
            slowest
        )
    }

    fn json(&self) -> serde_json::Value {
        json!({ "seconds": self.seconds, "intact": self.intact(), "transfers": self.reports })
    }
}

/// (e): every link captured while files and echoes cross the network for three epochs or more.
#[derive(Debug)]
struct Capture {
    wires: Vec<LinkWire>,
    transfers: Vec<TransferReport>,
    echoes: (u64, u64),
}

fn capture(
    lab: &RelayLab,
    rotation: f64,
    pairs: [(usize, usize); 3],
    pinged: (usize, usize),
) -> DemoResult<Capture> {
    let all: Vec<usize> = (0..lab.links.len()).collect();
    let watch = lab.watch(&all)?;
    let span = Duration::from_secs_f64(rotation * 3.0 + 1.0);
    let flows: Vec<Flow> = pairs
        .iter()
        .zip(5700..)
        .map(|(&(a, b), p)| flow(a, b, Size::For(span), p))
        .collect();
    let (echoes, transfers) = std::thread::scope(|s| {
        let p = s.spawn(|| {
            let count = (span.as_secs_f64() / 0.05) as u64;
            lab.ping(
                pinged.0,
                pinged.1,
                count,
                Pace::Train {
                    interval: Duration::from_millis(50),
                },
                Duration::from_secs(1),
            )
        });
        let t = lab.transfers(&flows);
        (p.join(), t)
    });
    let wires = watch.finish()?;
    let echoes = echoes.map_err(|_| "ping thread panicked")??;
    Ok(Capture {
        wires,
        transfers: transfers?,
        echoes: (echoes.received, echoes.sent),
    })
}

impl Capture {
    /// (e)'s line, then one per link.
    fn say(&self, say: &Say, waited: Duration) {
        say.line(self.line(waited));
        for w in &self.wires {
            say.line(format!(
                "      {:<6} {:>7} frames, {:>3} epochs, {} with a true address, {} repeated 8-byte values",
                w.link,
                w.frames,
                w.epochs,
                w.frames_with_true_address,
                w.repeated.len()
            ));
        }
    }

    fn line(&self, waited: Duration) -> String {
        let frames: u64 = self.wires.iter().map(|w| w.frames).sum();
        let leaks: u64 = self.wires.iter().map(|w| w.frames_with_true_address).sum();
        let repeats: usize = self.wires.iter().map(|w| w.repeated.len()).sum();
        let fewest = self.wires.iter().map(|w| w.epochs).min().unwrap_or(0);
        format!(
            "(e) capture on all {} links during 3 transfers and {}/{} echoes: {frames} frames, \
{leaks} with a true address, {repeats} 8-byte values repeated across epochs (at least {fewest} \
epochs per link); transfers {}/{} intact; started once every link was up ({:.1} s)",
            self.wires.len(),
            self.echoes.0,
            self.echoes.1,
            self.transfers.iter().filter(|t| t.sha256_match).count(),
            self.transfers.len(),
            waited.as_secs_f64()
        )
    }
}

fn failures(
    a: &Concurrent,
    big: &[&TransferReport],
    c: &Concurrent,
    d: &Reroute,
    e: &Capture,
) -> Vec<String> {
    let mut f = Vec::new();
    for (tag, x) in [("(a)", a), ("(c)", c)] {
        if x.intact() != x.reports.len() {
            f.push(format!(
                "{tag}: {} of {} files corrupted",
                x.reports.len() - x.intact(),
                x.reports.len()
            ));
        }
    }
    if big.iter().any(|r| !r.sha256_match) {
        f.push("(b): a 100 MB transfer was corrupted".into());
    }
    if !d.transfer.sha256_match {
        f.push("(d): the transfer across the cut was corrupted".into());
    }
    match d.first_echo_after_cut_ms.or(d.route_change_ms) {
        Some(ms) if ms < 1000.0 => {}
        Some(ms) => f.push(format!(
            "(d): {ms:.0} ms to route around the cut (limit 1 s)"
        )),
        None => f.push("(d): the cut was never routed around".into()),
    }
    for w in &e.wires {
        if w.frames_with_true_address > 0 {
            f.push(format!(
                "(e) {}: {} frames with a true address; first: {}",
                w.link,
                w.frames_with_true_address,
                w.first_leak.clone().unwrap_or_default()
            ));
        }
        if !w.repeated.is_empty() {
            f.push(format!("(e) {}: repeated values {:?}", w.link, w.repeated));
        }
    }
    if e.transfers.iter().any(|t| !t.sha256_match) {
        f.push("(e): a transfer was corrupted".into());
    }
    f
}
