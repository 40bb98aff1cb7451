//! A relay network node on a shared segment (docs/CONFIG.md "The relay role",
//! `neighbor_discovery`): its /64 is local as a whole and bound to no interface, so a neighbour
//! that has the /64 on-link (a router on a segment shared with the node) resolves each hashed
//! address by a Neighbour Solicitation, and the node answers for its links' current addresses
//! and for nothing else.
//!
//! On the lab's chain `h1 - eA == r1 == r2 == eB - h2` (every node a real `mt6d run`, 1 s
//! rotations), r1 and r2 route each other's /64 on-link instead of via the other's link-local
//! address. Checked: echoes from h1 to h2 across several rotations of the r1-r2 link all come
//! back (every new hashed address resolved in time, by the responder); both ends counted answers;
//! r1's neighbour table holds r2's current addresses with r2's link-layer address; an address
//! of r2's /64 that no link uses is never resolved (r1's kernel solicits it for a datagram and
//! its entry fails) and r2 counts the solicitations as not current.
//!
//! Run: `cargo test --release -p mt6d --test relay_ndp_netns -- --include-ignored
//! --test-threads=1 --nocapture`.

mod common;

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use mt6d_lab::ping::Pace;
use mt6d_lab::relays::{node_prefix, RelayLab, Shape};

fn counter(lab: &RelayLab, i: usize, name: &str) -> u64 {
    lab.status(i)
        .ok()
        .and_then(|s| s.counters.get(name).copied())
        .unwrap_or(0)
}

/// `ip -6 neigh show dev IF` in node `i`'s namespace, one entry per line.
fn neighbours(lab: &RelayLab, i: usize, interface: &str) -> Vec<String> {
    let out = lab.nodes[i]
        .ns
        .command("ip")
        .expect("command")
        .args(["-6", "neigh", "show", "dev", interface])
        .output()
        .expect("ip neigh");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn link_mac(lab: &RelayLab, i: usize, interface: &str) -> String {
    let out = lab.nodes[i]
        .ns
        .command("cat")
        .expect("command")
        .arg(format!("/sys/class/net/{interface}/address"))
        .output()
        .expect("read the MAC");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_node_answers_solicitations_for_its_current_addresses_only() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = RelayLab::up(Shape::Chain, "m6rn", common::relay_settings(1.0))
        .expect("relay lab comes up");
    let (h1, h2) = (
        lab.host_index(1).expect("h1"),
        lab.host_index(2).expect("h2"),
    );
    lab.wait_for_path(h1, h2, Duration::from_secs(10))
        .expect("first path");
    let (r1, r2) = (
        lab.node_index("r1").expect("r1"),
        lab.node_index("r2").expect("r2"),
    );
    lab.route_on_link(r1, r2).expect("r1 has r2's /64 on-link");
    lab.route_on_link(r2, r1).expect("r2 has r1's /64 on-link");

    // Echoes across at least four rotations of every link (1 s, jittered).
    let t = Instant::now();
    let report = lab
        .ping(
            h1,
            h2,
            500,
            Pace::Train {
                interval: Duration::from_millis(10),
            },
            Duration::from_millis(500),
        )
        .expect("ping");
    let answered = (
        counter(&lab, r1, "ndp_answered"),
        counter(&lab, r2, "ndp_answered"),
    );
    eprintln!(
        "on-link r1 <-> r2: {}/{} echoes answered in {:?}; solicitations answered by r1 {}, by r2 {}",
        report.received,
        report.sent,
        t.elapsed(),
        answered.0,
        answered.1
    );
    assert_eq!(
        report.received,
        report.sent,
        "echoes lost while r1 and r2 resolved each other's addresses\n{}",
        lab.log_tails(20)
    );
    assert!(
        answered.0 >= 4 && answered.1 >= 4,
        "each end answers a solicitation per rotation at least: {answered:?}"
    );

    // r1's table: r2's hashed addresses, resolved to r2's MAC on their link.
    let r1_if = "l-r2";
    let r2_mac = link_mac(&lab, r2, "l-r1");
    let prefix = node_prefix(lab.nodes[r2].n).octets();
    let resolved: Vec<String> = neighbours(&lab, r1, r1_if)
        .into_iter()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .and_then(|a| a.parse::<Ipv6Addr>().ok())
                .is_some_and(|a| a.octets()[..8] == prefix[..8])
        })
        .collect();
    assert!(
        resolved.iter().any(|l| l.contains(&r2_mac)),
        "r1 resolved no address of r2's /64 to r2's MAC {r2_mac}: {resolved:?}"
    );

    // An address of r2's /64 no link uses: never resolved.
    let mut unused = prefix;
    unused[8..].copy_from_slice(&[0x5e, 0xc0, 0x0d, 0x1e, 0x77, 0x01, 0x02, 0x03]);
    let unused = Ipv6Addr::from(unused);
    let before = counter(&lab, r2, "ndp_not_current");
    // A datagram to it from r1: r1's kernel solicits it (three times, a second apart).
    let sent = lab.nodes[r1]
        .ns
        .run(|| {
            let s = std::net::UdpSocket::bind("[::]:0")?;
            s.send_to(b"anyone?", (unused, 9))
        })
        .expect("in r1");
    assert!(sent.is_ok(), "send to {unused}: {sent:?}");
    std::thread::sleep(Duration::from_millis(3_500));
    let entry: Vec<String> = neighbours(&lab, r1, r1_if)
        .into_iter()
        .filter(|l| l.starts_with(&format!("{unused} ")))
        .collect();
    let not_current = counter(&lab, r2, "ndp_not_current") - before;
    eprintln!("unused {unused}: r1's entry {entry:?}; r2 counted {not_current} solicitations as not current");
    assert!(
        entry.iter().all(|l| !l.contains("lladdr")),
        "r1 resolved {unused}, which no link of r2 uses: {entry:?}"
    );
    assert!(
        not_current >= 1,
        "r2 did not count the solicitation for {unused}"
    );
}
