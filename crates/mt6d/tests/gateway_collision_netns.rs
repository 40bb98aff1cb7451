//! End-to-end tests of the gateway in network namespaces (root; CI runs as root): address
//! collisions (docs/PROTOCOL.md §5.2) on the link and on a session route are survived.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use mt6d_lab::observer::Observer;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{Lab, Side, Topology, EXTERNAL_IF, HOST_A, HOST_B, ROUTER_IF_A};
use mt6d_os::Netns;

mod common;
use common::*;

/// Another host on Gateway A's link (a "squatter", a macvlan on the router's side of the link
/// in its own namespace) holds the hashed address Gateway A will use in a future epoch, before
/// Gateway A binds it (001 §4.1.1: the whole interval would be lost). Gateway A's probe finds
/// it, both gateways move that epoch to attempt offset 1 within the interval before it, and a
/// ping train and floods across the epoch lose nothing; no tunnel packet goes to the squatter.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn forced_collision_on_the_link_is_survived() {
    common::require_root();
    const ROTATION_SECS: f64 = 2.0;
    // A pre-shared key: the test must know a coming epoch's address before the daemon binds
    // it. With identity keys, data travels on the session's route set (docs/PROTOCOL.md §9.8),
    // whose addresses no one can compute from the config; moves are per set, by the same code.
    let running = common::start_lab(
        Topology::Routed,
        "encrypt",
        ROTATION_SECS,
        (false, None),
        |_| {},
    );
    let lab = &running.lab;
    // The gateway's own stream, from its own configuration and keys: the addresses it will use.
    let cfg = mt6d::config::Config::load(&running.dir.join("gw-A.toml")).expect("config A");
    let stream = cfg.peers[0].build_stream().expect("stream");
    let now = mt6d::daemon::clock::now;
    let current = stream.epoch_at(now());
    // Gateway A binds epoch E one interval early, at the start of E - 1 = current + 2: at
    // least one interval from now, time enough to place the squatter.
    let e = mt6d_proto::Epoch(current.0 + 3);
    let squatted = *stream.route(e).local.ip();
    let moved = stream.route_with_attempt(e, 1);
    assert_ne!(*moved.local.ip(), squatted);

    let _squatter = squat(lab, squatted);
    assert!(
        stream.epoch_at(now()).0 < e.0 - 1,
        "the squatter came after Gateway A bound the address"
    );

    let observer =
        Observer::start(&lab.gw_a, EXTERNAL_IF, vec![HOST_A, HOST_B], None).expect("observer");
    // Traffic from now until the end of epoch E + 1.
    let end = stream.epoch_start(mt6d_proto::Epoch(e.0 + 2));
    let secs = (end.as_millis().saturating_sub(now().as_millis())) as f64 / 1000.0;
    let train_count = (secs / 0.02) as u64;
    let (train, floods) = std::thread::scope(|s| {
        let train = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        train_count,
                        Pace::Train {
                            interval: Duration::from_millis(20),
                        },
                        Duration::from_secs(1),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        let mut floods = Vec::new();
        while now() < end {
            floods.push(
                lab.host_a
                    .run(|| {
                        ping(
                            HOST_B,
                            2_000,
                            Pace::Flood {
                                wait: Duration::from_millis(10),
                            },
                            Duration::from_secs(1),
                        )
                    })
                    .expect("enter A")
                    .expect("flood"),
            );
        }
        (train.join().expect("train"), floods)
    });
    let report = observer.finish().expect("observer report");
    let (sent, received) = floods
        .iter()
        .fold((0, 0), |(s, r), f| (s + f.sent, r + f.received));
    let (st_a, st_b) = (status(&running, Side::A), status(&running, Side::B));
    eprintln!(
        "collision at epoch {}: {squatted} -> {}; train {}/{} (lost at {:?}); flood {received}/{sent}; A moves {:?}; B moves {:?}",
        e.0,
        moved.local.ip(),
        train.received,
        train.sent,
        train.lost_at,
        st_a.peers[0].moves,
        st_b.peers[0].moves
    );
    assert!(
        st_a.peers[0].moves.collisions_detected >= 1,
        "Gateway A did not see the squatter: {:?}",
        st_a.collision_watch
    );
    assert!(st_a.peers[0].moves.routes_moved >= 1);
    assert!(
        st_b.peers[0].moves.moved_by_peer >= 1,
        "Gateway B did not move: {:?}",
        st_b.peers[0].moves
    );
    assert!(
        !report
            .outer_pairs
            .iter()
            .any(|(src, dst)| *src == squatted || *dst == squatted),
        "a tunnel packet used the squatter's address"
    );
    assert!(
        report
            .outer_pairs
            .iter()
            .any(|(src, dst)| src == moved.local.ip() && dst == moved.remote.ip()),
        "no tunnel packet on the moved route of epoch {}",
        e.0
    );
    assert_eq!(train.lost(), 0, "ping train lost {:?}", train.lost_at);
    assert_eq!(received, sent, "flood lost {}", sent - received);
}

/// The same collision on a session route set (docs/PROTOCOL.md §9.8), where data travels with
/// identity keys: nobody can compute those addresses from the config, so the squatter takes the
/// address Gateway A's status names for the next epoch of the set it sends on, right after it is
/// bound and before its duplicate-address probe (1 s before the epoch, §5.2).
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn forced_collision_on_a_session_route_is_survived() {
    common::require_root();
    const ROTATION_SECS: f64 = 2.0;
    let running = start_on(Topology::Routed, "encrypt", ROTATION_SECS, |_| {});
    let lab = &running.lab;
    // The next epoch's local address on the session set A sends on, read early in an epoch.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last_epoch = status(&running, Side::A).peers[0].epoch;
    let (e, squatted, ends_in) = loop {
        assert!(
            Instant::now() < deadline,
            "no session set in force to squat on"
        );
        let st = status(&running, Side::A);
        let p = &st.peers[0];
        let sending = p.route_sets.iter().position(|r| r.sending);
        let fresh_epoch = p.epoch != last_epoch;
        last_epoch = p.epoch;
        if let Some(i) = sending.filter(|&i| p.route_sets[i].kind == "session") {
            let next = p
                .accept
                .get(3 * i..3 * i + 3)
                .and_then(|w| w.iter().find(|r| r.epoch == p.epoch + 1));
            if let (true, Some(next)) = (fresh_epoch && p.next_change_ms > 1500, next) {
                let addr: std::net::SocketAddrV6 = next.local.parse().expect("route");
                break (p.epoch + 1, *addr.ip(), p.next_change_ms);
            }
        }
        std::thread::sleep(Duration::from_millis(30));
    };
    let _squatter = squat(lab, squatted);
    let observer =
        Observer::start(&lab.gw_a, EXTERNAL_IF, vec![HOST_A, HOST_B], None).expect("observer");
    // Traffic until the end of epoch E + 1, while watching what A sends on during E.
    let secs = ends_in as f64 / 1000.0 + 2.0 * ROTATION_SECS;
    let (train, sent_in_e) = std::thread::scope(|s| {
        let train = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        (secs / 0.02) as u64,
                        Pace::Train {
                            interval: Duration::from_millis(20),
                        },
                        Duration::from_secs(1),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        let mut sent_in_e = Vec::new();
        while !train.is_finished() {
            let st = status(&running, Side::A);
            if st.peers[0].epoch == e {
                sent_in_e.push(st.peers[0].send.local.clone());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (train.join().expect("train"), sent_in_e)
    });
    let report = observer.finish().expect("observer report");
    let (st_a, st_b) = (status(&running, Side::A), status(&running, Side::B));
    eprintln!(
        "session-set collision at epoch {e}: {squatted}; train {}/{} (lost at {:?}); A sent in E from {:?}; A moves {:?}; B moves {:?}",
        train.received,
        train.sent,
        train.lost_at,
        sent_in_e.first(),
        st_a.peers[0].moves,
        st_b.peers[0].moves
    );
    assert!(
        st_a.peers[0].moves.collisions_detected >= 1,
        "Gateway A did not see the squatter: {:?}",
        st_a.collision_watch
    );
    assert!(
        st_b.peers[0].moves.moved_by_peer >= 1,
        "Gateway B did not move: {:?}",
        st_b.peers[0].moves
    );
    assert!(!sent_in_e.is_empty(), "no status read during epoch {e}");
    assert!(
        sent_in_e.iter().all(|l| !l.contains(&squatted.to_string())),
        "A sent from the squatted address in epoch {e}: {sent_in_e:?}"
    );
    assert!(
        !report
            .outer_pairs
            .iter()
            .any(|(src, dst)| *src == squatted || *dst == squatted),
        "a tunnel packet used the squatter's address"
    );
    assert_eq!(train.lost(), 0, "ping train lost {:?}", train.lost_at);
}

/// A node on the router's link to Gateway A holding `addr` (no duplicate address detection): it
/// answers neighbour solicitations for it, as a host that took the address would. Dropped, the
/// namespace goes with it.
fn squat(lab: &Lab, addr: Ipv6Addr) -> Netns {
    let squatter = Netns::create(&mt6d_os::unique_name("m6sq")).expect("squatter namespace");
    let router = &lab.routers[0];
    ip_ok(
        router,
        &[
            "link",
            "add",
            "sq0",
            "link",
            ROUTER_IF_A,
            "type",
            "macvlan",
            "mode",
            "bridge",
        ],
    );
    ip_ok(router, &["link", "set", "sq0", "netns", squatter.name()]);
    ip_ok(&squatter, &["link", "set", "lo", "up"]);
    ip_ok(&squatter, &["link", "set", "sq0", "up"]);
    ip_ok(
        &squatter,
        &["addr", "add", &format!("{addr}/64"), "dev", "sq0", "nodad"],
    );
    squatter
}

fn ip_ok(ns: &Netns, args: &[&str]) {
    let out = ns
        .command("ip")
        .expect("command")
        .args(args)
        .output()
        .expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}
