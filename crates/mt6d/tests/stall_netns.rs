//! A lead of the stall hunt (the goal: latency with no stalls): an independent peer that
//! sent no priming solicitation (docs/PROTOCOL.md §5.1) saw this daemon hold its outgoing packets
//! for up to 1 s at many rotations, its neighbour entry for the peer's new address reachable only
//! at the kernel's 1 s retransmit. Here Gateway B behaves like that peer: an nftables table in its
//! namespace, loaded before it starts, drops every unicast neighbour solicitation it sends (the
//! priming ones) and every 40-byte UDP datagram (its link-layer address announcements, so
//! Gateway A pins nothing and must resolve each new address of B by neighbour discovery). Host A
//! then pings Host B every 20 ms across 12 rotations of 1 s: nothing may be lost, and no echo may
//! wait anywhere near the 1 s retransmit.
//!
//!
//! The second test runs the bench's conditions (the stall hunt's second lead): GRO on every
//! veth, as `mt6d bench` has it, ping trains at 10/s across 60 rotations of 1 s on the switched
//! and the routed topology.
//!
//! Run: `cargo test --release -p mt6d --test stall_netns -- --include-ignored --nocapture`.

mod common;

use std::io::Write;
use std::process::Stdio;
use std::time::Duration;

use common::status;
use mt6d_lab::topology::{Side, Topology};

/// Bench conditions: echoes over this count as slow. A stall of the kind the bench once showed
/// (0.08-0.76 s, one per train) is far above it; what a loaded shared 2-core machine adds to an
/// echo now and then is mostly below it.
const SLOW_MS: f64 = 50.0;
/// ...and a few may be slow (scheduling on a busy machine), none held anywhere near a second.
const SLOW_ALLOWED: usize = 3;
const NEVER_MS: f64 = 300.0;

/// Far below the 1 s hold of the lead, far above what a loaded 2-core machine adds (the worst
/// echo seen in 3 runs with the other cores busy compiling was 91 ms).
const WORST_RTT_MS: f64 = 500.0;

const QUIET_PEER: &str = "table inet mt6d_test_quiet_peer {
    chain out {
        type filter hook output priority 0;
        icmpv6 type nd-neighbor-solicit ip6 daddr != ff02::/16 counter drop
        udp length 40 counter drop
    }
}
";

fn load(ns: &mt6d_os::Netns, script: &str) {
    let mut child = ns
        .command("nft")
        .expect("nft in namespace")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("nft runs");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(script.as_bytes())
        .expect("write ruleset");
    let out = child.wait_with_output().expect("nft finishes");
    assert!(
        out.status.success(),
        "nft: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_peer_that_primes_nothing_costs_no_stall_at_rotation() {
    common::require_root();
    let running = common::start_on(Topology::Switched, "encrypt", 1.0, |lab| {
        load(&lab.gw_b, QUIET_PEER);
    });
    let r = common::ping_train(&running.lab, 600, Duration::from_millis(20));
    let a = status(&running, Side::A);
    let rules = running
        .lab
        .gw_b
        .command("nft")
        .expect("nft")
        .args(["list", "table", "inet", "mt6d_test_quiet_peer"])
        .output()
        .expect("nft list");
    let rules = String::from_utf8_lossy(&rules.stdout);
    let (p50, _, max) = r.rtt_summary();
    eprintln!(
        "peer without priming: {}/{} echoes, p50 {p50:.3} ms, max {max:.1} ms ({:?}), {} rotations of A\n{rules}",
        r.received, r.sent, r.slowest, a.peers[0].counters.rotations
    );
    // The premise: B's priming solicitations and announcements were sent and dropped, and A
    // pinned nothing for B.
    let dropped: Vec<u64> = rules
        .lines()
        .filter_map(|l| l.split("packets ").nth(1))
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect();
    assert!(
        dropped.len() == 2 && dropped.iter().all(|&n| n > 5),
        "the quiet-peer rules did not engage: {dropped:?}\n{rules}"
    );
    assert!(
        !running.daemons[0].log_tail(400).contains("pinned"),
        "Gateway A pinned B's addresses: B's announcement got through"
    );
    assert_eq!(r.lost(), 0, "echoes lost at {:?}", r.lost_at);
    assert!(
        max < WORST_RTT_MS,
        "an echo waited {max:.0} ms ({:?})",
        r.slowest
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn bench_conditions_gro_on_no_echo_waits_at_rotation() {
    common::require_root();
    for (topology, mode) in [(Topology::Switched, "auth"), (Topology::Routed, "encrypt")] {
        let running = common::start_on(topology, mode, 1.0, |lab| lab.enable_gro());
        let r = common::ping_train(&running.lab, 600, Duration::from_millis(100));
        let a = status(&running, Side::A);
        let mut rtts = r.rtts_ms.clone();
        rtts.sort_by(f64::total_cmp);
        let p99 = rtts.get(rtts.len() * 99 / 100).copied().unwrap_or(0.0);
        let slow: Vec<_> = r.echoes.iter().filter(|e| e.rtt_ms > SLOW_MS).collect();
        eprintln!(
            "{} {mode}, GRO on: {}/{} echoes, p99 {p99:.2} ms, max {:.1} ms, {} over {SLOW_MS} ms {slow:?}, {} rotations of A",
            topology.name(),
            r.received,
            r.sent,
            r.rtt_summary().2,
            slow.len(),
            a.peers[0].counters.rotations
        );
        assert_eq!(
            r.lost(),
            0,
            "{}: echoes lost at {:?}",
            topology.name(),
            r.lost_at
        );
        assert!(
            slow.len() <= SLOW_ALLOWED && slow.iter().all(|e| e.rtt_ms < NEVER_MS),
            "{} {mode}: echoes waited: {slow:?}",
            topology.name()
        );
        assert!(
            a.peers[0].counters.rotations >= 50,
            "the train spanned too few rotations"
        );
    }
}
