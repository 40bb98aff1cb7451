//! The relay role end to end (seed 003): `mt6d run` on every node of a relay network
//! built in network namespaces by `mt6d_lab::relays`, real hosts behind the edge gateways.
//!
//! ```text
//! chain:  h1 - eA == r1 == r2 == eB - h2            (one-second rotations with jitter)
//! mesh:   three meshed relays, two edge gateways behind each, a host behind each edge
//! ```
//!
//! Checked: echoes h1 -> h2 across twelve rotations and at least two rekeys of every link and
//! end-to-end pair (every one keyed by Noise IK handshakes, sending on a session route set),
//! none lost, both relays count forwarded frames, and every node stopped with SIGTERM and then
//! `mt6d down` leaves nothing behind; a TCP transfer across
//! rotations arrives intact (SHA-256 at both ends) while a capture on every link sees no true
//! address (hosts', edge gateways', nodes' configured addresses) and no 8-byte value in two
//! epochs of a link; random datagrams sent to a relay's current address and port on a link are
//! counted as drops and change nothing else; on the mesh a relay-relay link cut in the middle of
//! a transfer is routed around in under a second (the route and the first echo through the
//! detour) and the transfer completes intact.
//!
//! Run: `cargo test --release -p mt6d --test relay_netns -- --include-ignored --test-threads=1
//! --nocapture`.

mod common;

use std::time::{Duration, Instant};

use mt6d_lab::ping::Pace;
use mt6d_lab::relays::{self, Flow, RelayLab, RelaySettings, Shape, Size};

fn settings(rotation_secs: f64) -> RelaySettings {
    common::relay_settings(rotation_secs)
}

/// Builds `shape`, starts every node and waits for the first path (set-up, not loss).
fn up(shape: Shape, prefix: &str, rotation_secs: f64) -> RelayLab {
    let lab = RelayLab::up(shape, prefix, settings(rotation_secs)).expect("relay lab comes up");
    let (first, last) = (0, lab.hosts.len() - 1);
    lab.wait_for_path(first, last, Duration::from_secs(10))
        .expect("first path");
    lab
}

fn node(lab: &RelayLab, name: &str) -> usize {
    lab.node_index(name).expect("node")
}

fn host(lab: &RelayLab, k: u16) -> usize {
    lab.host_index(k).expect("host")
}

fn link(lab: &RelayLab, a: &str, b: &str) -> usize {
    lab.link_index(a, b).expect("link")
}

fn counter(lab: &RelayLab, at: usize, name: &str) -> u64 {
    let st = lab.status(at).expect("status");
    st.counters.get(name).copied().unwrap_or(0)
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn the_lab_routes_each_neighbours_prefix_to_it_and_leaves_nothing_behind() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = RelayLab::build(Shape::Mesh, "m6rb", settings(1.0)).expect("mesh builds");
    let names: Vec<String> = lab
        .nodes
        .iter()
        .map(|n| n.ns.name().to_string())
        .chain(lab.hosts.iter().map(|h| h.ns.name().to_string()))
        .collect();
    assert_eq!(names.len(), 15);
    for l in &lab.links {
        for (me, my_if, peer) in [(l.a, &l.if_a, l.b), (l.b, &l.if_b, l.a)] {
            let prefix = format!("{}/64", relays::node_prefix(lab.nodes[peer].n));
            let routes = common::ip_in(&lab.nodes[me].ns, &["-6", "route", "show", &prefix]);
            assert!(
                routes.contains("via fe80::") && routes.contains(my_if.as_str()),
                "{} has no route to {prefix} on {my_if}: {routes:?}",
                lab.nodes[me].name
            );
        }
    }
    for h in &lab.hosts {
        let routes = common::ip_in(&h.ns, &["-6", "route", "show", "default"]);
        assert!(
            routes.contains(&relays::edge_host_side(h.k).to_string()),
            "{routes}"
        );
    }
    for n in &lab.nodes {
        let text = std::fs::read_to_string(&n.config).expect("config");
        assert!(
            text.contains("[relay]") && text.contains("[[relay.link]]"),
            "{text}"
        );
        assert_eq!(n.host.is_some(), text.contains("[[relay.e2e]]"), "{text}");
    }
    let refused = lab.check_configs();
    assert!(refused.is_empty(), "mt6d check refused: {refused:#?}");
    let r1r2 = link(&lab, "r1", "r2");
    for percent in [5, 100, 0] {
        lab.set_loss(r1r2, percent).expect("loss rule loads");
        let l = &lab.links[r1r2];
        let rules = lab.nodes[l.a]
            .ns
            .command("nft")
            .expect("nft")
            .args(["list", "ruleset"])
            .output()
            .expect("nft list");
        let rules = String::from_utf8_lossy(&rules.stdout);
        assert_eq!(rules.contains(&l.if_a), percent > 0, "{rules}");
    }
    let dir = lab.dir.clone();
    drop(lab);
    for n in names {
        assert!(
            !std::path::Path::new("/run/netns").join(&n).exists(),
            "{n} left behind"
        );
    }
    assert!(!dir.exists(), "{} left behind", dir.display());
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn echoes_cross_two_relays_across_rotations_and_rekeys_without_loss() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let mut lab = up(Shape::Chain, "m6rp", 1.0);
    let (h1, h2) = (host(&lab, 1), host(&lab, 2));
    // 12 s at 50 per second: twelve one-second epochs of every link, with jitter, and at least
    // two rekeys of every link and end-to-end pair (the lab rekeys every 5 s).
    let r = lab
        .ping(
            h1,
            h2,
            600,
            Pace::Train {
                interval: Duration::from_millis(20),
            },
            Duration::from_secs(2),
        )
        .expect("ping");
    let (min, med, max) = r.rtt_summary();
    eprintln!(
        "chain ping: {}/{} answered, rtt min/median/max {min:.3}/{med:.3}/{max:.3} ms",
        r.received, r.sent
    );
    assert_eq!(
        r.lost(),
        0,
        "echoes lost, sent at {:?}\n{}",
        r.lost_at,
        lab.log_tails(20)
    );
    for relay in ["r1", "r2"] {
        let forwarded = counter(&lab, node(&lab, relay), "forwarded");
        assert!(
            forwarded >= 1200,
            "{relay} forwarded {forwarded} frames for 1200 packets"
        );
    }
    // Every link and end-to-end pair was keyed by a handshake and rekeyed at least twice
    // while the echoes ran.
    for name in ["eA", "r1", "r2", "eB"] {
        let st = lab.status(node(&lab, name)).expect("status");
        for l in &st.links {
            eprintln!(
                "{name} link {}: keys {}, {} handshakes, route set {}",
                l.name, l.keys, l.handshakes, l.route_set
            );
            assert!(
                l.keys == "handshake" && l.handshakes >= 3 && l.route_set > 0,
                "{name} link {}: keys {}, {} handshakes, route set {}",
                l.name,
                l.keys,
                l.handshakes,
                l.route_set
            );
        }
        for e in &st.e2e {
            eprintln!(
                "{name} end to end {}: keys {}, {} handshakes",
                e.name, e.keys, e.handshakes
            );
            assert!(
                e.keys == "handshake" && e.handshakes >= 3,
                "{name} end to end {}: keys {}, {} handshakes",
                e.name,
                e.keys,
                e.handshakes
            );
        }
    }
    // Every node's metrics page shows its links up and keyed, in a format promtool reads.
    for name in ["eA", "r1"] {
        let body = lab.metrics(node(&lab, name)).expect("metrics");
        let up = body
            .lines()
            .filter(|l| l.starts_with("mt6d_relay_link_up{") && l.ends_with(" 1"))
            .count();
        assert!(up >= 1, "{name}: no link up in\n{body}");
        assert!(
            body.contains("mt6d_relay_link_handshakes_total{"),
            "{name}: {body}"
        );
        mt6d_lab::promtool_check(&body).unwrap_or_else(|e| panic!("{name}: {e}\n{body}"));
    }
    // SIGTERM: every node exits cleanly; its TUN device goes with it, and its guard routes,
    // AnyIP route and nftables table stay (fail closed) until `mt6d down` removes them.
    for i in 0..lab.nodes.len() {
        lab.stop_node(i).expect("the node exits cleanly");
        let n = &lab.nodes[i];
        let down =
            n.ns.command(common::MT6D)
                .expect("command")
                .arg("down")
                .arg("-c")
                .arg(&n.config)
                .output()
                .expect("mt6d down");
        assert!(
            down.status.success(),
            "{}: mt6d down: {}",
            n.name,
            String::from_utf8_lossy(&down.stderr)
        );
        let prefix = format!("{}/64", relays::node_prefix(n.n));
        let local = common::ip_in(&n.ns, &["-6", "route", "show", "table", "local"]);
        assert!(
            !local.contains(&prefix),
            "{}: {prefix} left local:\n{local}",
            n.name
        );
        let main = common::ip_in(&n.ns, &["-6", "route", "show"]);
        assert!(
            !main.contains("prohibit") && !main.contains("mt6dr0"),
            "{}: routes left:\n{main}",
            n.name
        );
        let tables =
            n.ns.command("nft")
                .expect("nft")
                .args(["list", "tables"])
                .output()
                .expect("nft list tables");
        let tables = String::from_utf8_lossy(&tables.stdout);
        assert!(!tables.contains("mt6d_relay"), "{}: {tables}", n.name);
    }
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_transfer_across_rotations_is_intact_and_no_link_shows_anything_true_or_repeated() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = up(Shape::Chain, "m6rt", 1.0);
    let (h1, h2) = (host(&lab, 1), host(&lab, 2));
    let all: Vec<usize> = (0..lab.links.len()).collect();
    let watch = lab.watch(&all).expect("captures start");
    // Echoes across the capture's epochs, and a transfer that spans several of them.
    let pings = std::thread::scope(|s| {
        let p = s.spawn(|| {
            lab.ping(
                h1,
                h2,
                200,
                Pace::Train {
                    interval: Duration::from_millis(20),
                },
                Duration::from_secs(1),
            )
        });
        let t = lab.transfers(&[Flow {
            from: h1,
            to: h2,
            // 16 Mbit/s: four one-second epochs of every link, and captures of a size CI
            // handles (a flat-out transfer would fill the pcap files at 1.5 Gbit/s).
            size: Size::Paced(8 << 20, Duration::from_secs(4)),
            port: 5101,
            seed: 1,
        }]);
        (p.join().expect("ping thread"), t)
    });
    let wires = watch.finish().expect("captures");
    let (ping, transfers) = pings;
    let ping = ping.expect("ping");
    let t = &transfers.expect("transfer")[0];
    eprintln!(
        "chain transfer: {} bytes in {:.2} s ({:.0} Mbit/s), sha256 match {}, longest stall {:.0} ms; ping {}/{}",
        t.bytes, t.seconds, t.mbit_s, t.sha256_match, t.longest_stall_ms, ping.received, ping.sent
    );
    for w in &wires {
        eprintln!(
            "  {:<6} {} frames ({} UDP) in {} epochs, {} with a true address, {} repeated values",
            w.link,
            w.frames,
            w.udp_frames,
            w.epochs,
            w.frames_with_true_address,
            w.repeated.len()
        );
    }
    assert!(t.sha256_match, "transfer corrupted\n{}", lab.log_tails(20));
    assert_eq!(ping.lost(), 0, "echoes lost at {:?}", ping.lost_at);
    for w in &wires {
        assert_eq!(
            w.frames_with_true_address, 0,
            "{}: {:?}",
            w.link, w.first_leak
        );
        assert!(w.repeated.is_empty(), "{}: {:?}", w.link, w.repeated);
        assert!(
            w.epochs >= 3,
            "{}: only {} epochs captured",
            w.link,
            w.epochs
        );
        // The file crossed every link (a GSO train is one frame to the capture).
        assert!(
            w.data_frames_at.len() > 100,
            "{}: {} data frames of {} UDP frames",
            w.link,
            w.data_frames_at.len(),
            w.udp_frames
        );
    }
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn forged_datagrams_to_a_relays_current_address_are_counted_drops_and_nothing_breaks() {
    common::require_root();
    let _turn = common::one_at_a_time();
    // Two workers whatever the machine: the receive gate refuses forgeries before the node's
    // lock only when several workers share it (one worker takes it uncontended).
    let mut settings = settings(1.0);
    settings.workers = Some(2);
    let mut lab = RelayLab::up(Shape::Chain, "m6rf", settings).expect("relay lab comes up");
    let (first, last) = (0, lab.hosts.len() - 1);
    lab.wait_for_path(first, last, Duration::from_secs(10))
        .expect("first path");
    let (h1, h2) = (host(&lab, 1), host(&lab, 2));
    let (r1, r1r2) = (node(&lab, "r1"), link(&lab, "r1", "r2"));
    let before = lab.status(r1).expect("status");
    let (from, to) = lab.forge_datagrams(r1, r1r2, 5).expect("forge");
    // Dropped at once; the status shows it at its next poll of the node's counters.
    let deadline = Instant::now() + Duration::from_secs(2);
    let after = loop {
        let st = lab.status(r1).expect("status");
        if relays::dropped(&st) >= relays::dropped(&before) + 5 || Instant::now() > deadline {
            break st;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rose = relays::rose(&before, &after);
    eprintln!("5 datagrams of random bytes {from} -> {to}: counters rose {rose:?}");
    let drops: u64 = rose
        .iter()
        .filter(|(k, _)| relays::is_drop_label(k))
        .map(|(_, v)| v)
        .sum();
    assert!(
        drops >= 5,
        "5 forged datagrams to {to}, counted drops {rose:?}"
    );
    // Each refused by the receive gate, before the node's lock: none reached the node.
    let refused = rose
        .iter()
        .find(|(k, _)| k == "rx_refused")
        .map_or(0, |(_, v)| *v);
    assert!(
        refused >= 5,
        "5 forged datagrams to {to}, refused before the node's lock: {refused} ({rose:?})"
    );
    let r = lab
        .ping(
            h1,
            h2,
            100,
            Pace::Train {
                interval: Duration::from_millis(20),
            },
            Duration::from_secs(2),
        )
        .expect("ping");
    assert_eq!(
        r.lost(),
        0,
        "echoes lost after the forgeries at {:?}",
        r.lost_at
    );
    assert!(
        lab.exited().is_empty(),
        "daemons exited: {:?}",
        lab.exited()
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_cut_relay_link_is_routed_around_within_a_second_and_the_transfer_completes() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = up(Shape::Mesh, "m6rc", 2.0);
    // h1 is behind r1, h3 behind r2: the direct path is r1-r2, the detour r1-r3-r2.
    let (h1, h3) = (host(&lab, 1), host(&lab, 3));
    lab.wait_for_path(h1, h3, Duration::from_secs(10))
        .expect("h1 reaches h3");
    let flow = Flow {
        from: h1,
        to: h3,
        size: Size::For(Duration::from_secs(5)),
        port: 5201,
        seed: 2,
    };
    let (r1, r1r2, r1r3) = (
        node(&lab, "r1"),
        link(&lab, "r1", "r2"),
        link(&lab, "r1", "r3"),
    );
    let rr = lab
        .cut_during(flow, r1r2, r1, r1r3, Duration::from_millis(1500))
        .expect("cut during the transfer");
    eprintln!(
        "cut r1-r2: route at r1 {:?} -> {:?} after {} ms; first echo through the detour sent {} ms \
after the cut ({} lost); first data frame of the transfer on r1-r3 after {} ms; transfer {} bytes, \
{:.0} Mbit/s, sha256 match {}, longest stall {:.0} ms",
        rr.route_before,
        rr.route_after,
        shown(rr.route_change_ms),
        shown(rr.first_echo_after_cut_ms),
        rr.echoes_lost,
        shown(rr.first_detour_frame_ms),
        rr.transfer.bytes,
        rr.transfer.mbit_s,
        rr.transfer.sha256_match,
        rr.transfer.longest_stall_ms
    );
    assert_eq!(
        rr.route_before.as_deref(),
        Some("r2"),
        "the direct path first"
    );
    assert_eq!(rr.route_after.as_deref(), Some("r3"), "then the detour");
    assert!(
        rr.transfer.sha256_match,
        "transfer corrupted\n{}",
        lab.log_tails(20)
    );
    let route_ms = rr.route_change_ms.expect("r1 never changed its route");
    assert!(
        route_ms < 1000.0,
        "r1 changed its route {route_ms:.0} ms after the cut"
    );
    let echo_ms = rr
        .first_echo_after_cut_ms
        .expect("no echo answered after the cut");
    assert!(
        echo_ms < 1000.0,
        "first echo through the detour {echo_ms:.0} ms after the cut"
    );
    // TCP comes back when its backed-off retransmission timer fires: later, but it must.
    assert!(
        rr.first_detour_frame_ms.is_some(),
        "the transfer never took the detour"
    );
    assert_eq!(
        rr.detour_frames_before_cut, 0,
        "the flow used the detour before the cut"
    );
}

fn shown(ms: Option<f64>) -> String {
    ms.map_or_else(|| "never".into(), |m| format!("{m:.0}"))
}
