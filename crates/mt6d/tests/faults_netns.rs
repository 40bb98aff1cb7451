//! Faults a gateway meets in ordinary operation, end to end in network namespaces (root):
//! a local process holding the hashed UDP port of a coming epoch, or of the current one at
//! start-up (docs/PROTOCOL.md §5.2, "Ports and addresses that cannot be bound").

mod common;

use std::net::{SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use common::{start, start_daemon, wait_for_path, Running};
use mt6d::daemon::clock::now;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{GatewaySettings, Lab, LabKeys, Side, Topology, HOST_B};
use mt6d_proto::{Epoch, Stream};

/// Gateway A's own stream, from its configuration and keys: the routes it will use.
fn stream_of(running: &Running, label: &str) -> Stream {
    let cfg =
        mt6d::config::Config::load(&running.dir.join(format!("gw-{label}.toml"))).expect("config");
    cfg.peers[0].build_stream().expect("stream")
}

/// A process in `lab`'s Gateway A namespace holding UDP `port` on every address.
fn hold_port(lab: &Lab, port: u16) -> UdpSocket {
    lab.gw_a
        .run(|| {
            UdpSocket::bind(SocketAddrV6::new(
                std::net::Ipv6Addr::UNSPECIFIED,
                port,
                0,
                0,
            ))
        })
        .expect("enter gateway A")
        .unwrap_or_else(|e| panic!("hold UDP port {port} in gateway A: {e}"))
}

fn port_of(route: &str) -> u16 {
    route
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .expect("route ends in :port")
}

/// The switched lab with both gateways' configurations written (handshakes), none started.
fn configured(rotation_secs: f64) -> Running {
    let lab = Lab::build_topology(Topology::Switched, "m6").expect("lab builds");
    let dir = std::env::temp_dir().join(format!(
        "mt6d-e2e-{}-{}",
        std::process::id(),
        lab.gw_a.name()
    ));
    std::fs::create_dir_all(&dir).expect("test dir");
    let keys = LabKeys::generate(&dir, true, None).expect("keys");
    let settings = GatewaySettings {
        rotation_secs,
        mode: "encrypt",
        keys: &keys,
        workers: None,
    };
    let running = Running {
        daemons: Vec::new(),
        lab,
        dir,
        _turn: common::one_at_a_time(),
    };
    for (side, label) in [(Side::A, "A"), (Side::B, "B")] {
        let config = running.dir.join(format!("gw-{label}.toml"));
        std::fs::write(&config, running.lab.gateway_config(side, &settings)).expect("config");
    }
    running
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_held_port_of_the_next_epoch_moves_both_gateways_and_loses_nothing() {
    common::require_root();
    const ROTATION_SECS: f64 = 2.0;
    // A pre-shared key: the test must know a coming epoch's port before the daemon binds it.
    // With identity keys, data travels on the session's route set (docs/PROTOCOL.md §9.8),
    // whose ports no one can compute from the config; moves are per set, by the same code.
    let running = common::start_keyed("encrypt", ROTATION_SECS, false, None);
    let lab = &running.lab;
    let stream = stream_of(&running, "A");
    let current = stream.epoch_at(now());
    // Epoch E is bound at the start of E - 1 = current + 2: at least one interval from now.
    let e = Epoch(current.0 + 3);
    let held_port = stream.route(e).local.port();
    let moved = stream.route_with_attempt(e, 1);
    assert_ne!(
        moved.local.port(),
        held_port,
        "offset 1 derives another port"
    );
    let _held = hold_port(lab, held_port);
    assert!(
        stream.epoch_at(now()).0 < e.0 - 1,
        "the port was taken after Gateway A bound it"
    );

    // A ping train from now until the end of epoch E + 1, across E's start.
    let end = stream.epoch_start(Epoch(e.0 + 2));
    let secs = end.as_millis().saturating_sub(now().as_millis()) as f64 / 1000.0;
    let count = (secs / 0.02) as u64;
    let (train, seen) = std::thread::scope(|s| {
        let train = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        count,
                        Pace::Train {
                            interval: Duration::from_millis(20),
                        },
                        Duration::from_secs(1),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        // While E is current, both gateways send on its moved route, mirrored.
        let mut seen = None;
        while now() < end {
            if stream.epoch_at(now()) == e {
                let a = common::status(&running, Side::A);
                let b = common::status(&running, Side::B);
                let (pa, pb) = (&a.peers[0], &b.peers[0]);
                if pa.epoch == e.0 && pb.epoch == e.0 {
                    seen = Some((pa.send.clone(), pb.send.clone(), a.clone()));
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        (train.join().expect("train"), seen)
    });

    let (send_a, send_b, status_a) = seen.expect("both gateways reported epoch E");
    assert_eq!(
        send_a.local,
        moved.local.to_string(),
        "A sends from the moved route"
    );
    assert_eq!(send_a.remote, moved.remote.to_string());
    assert_eq!(send_b.local, send_a.remote, "B agrees on the moved route");
    assert_eq!(send_b.remote, send_a.local);
    assert_ne!(port_of(&send_a.local), held_port);
    assert!(
        status_a.peers[0]
            .last_rx_ms_ago
            .is_some_and(|ms| ms < 1_000),
        "status shows packets arriving during the train: {:?}",
        status_a.peers[0].last_rx_ms_ago
    );
    assert!(
        status_a.peers[0].moves.moved_epochs.contains(&(e.0, 1)),
        "A moved epoch {} to offset 1: {:?}",
        e.0,
        status_a.peers[0].moves.moved_epochs
    );
    assert_eq!(
        train.lost(),
        0,
        "pings lost across the held port's epoch: {} of {} (lost at {:?})",
        train.lost(),
        train.sent,
        train.lost_at
    );
    let b = common::status(&running, Side::B);
    assert!(
        b.peers[0].moves.moved_by_peer >= 1,
        "B moved because A told it"
    );
    // The log names the port and why it could not be had.
    let log = std::fs::read_to_string(&running.daemons[0].log).expect("log A");
    assert!(
        log.contains(&format!("UDP port {held_port} of epoch {}", e.0))
            && log.contains("Address already in use"),
        "{log}"
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn start_up_with_the_current_epochs_port_held_does_not_abort() {
    common::require_root();
    const ROTATION_SECS: f64 = 5.0;
    let mut running = configured(ROTATION_SECS);
    let stream = stream_of(&running, "A");
    // Start early in an epoch, so that A comes up in the epoch whose port is held.
    while {
        let e = stream.epoch_at(now());
        let left = stream.epoch_start(Epoch(e.0 + 1)).as_millis() - now().as_millis();
        left < 3_500
    } {
        std::thread::sleep(Duration::from_millis(50));
    }
    // The current epoch's port and the next one's (bound at start-up too). The previous
    // epoch's route stays free: it is the one a notice about the current epoch travels on.
    let current = stream.epoch_at(now());
    let mut held = Vec::new();
    for e in [current.0, current.0 + 1] {
        let port = stream.route(Epoch(e)).local.port();
        if !held.iter().any(|(p, _): &(u16, UdpSocket)| *p == port) {
            held.push((port, hold_port(&running.lab, port)));
        }
    }
    let started = Instant::now();
    for (side, label) in [(Side::A, "A"), (Side::B, "B")] {
        let config = running.dir.join(format!("gw-{label}.toml"));
        let mut d = start_daemon(&running, side, label, &config);
        d.wait_ready(Duration::from_secs(10))
            .expect("gateway starts although its ports are held");
        running.daemons.push(d);
    }
    assert_eq!(
        stream.epoch_at(now()),
        current,
        "both gateways came up in the epoch whose port is held (took {:?})",
        started.elapsed()
    );
    wait_for_path(&running.lab, HOST_B, 1);
    let a = common::status(&running, Side::A);
    let p = &a.peers[0];
    assert!(
        held.iter().all(|(port, _)| port_of(&p.send.local) != *port),
        "A sends from a port no other process holds: {}",
        p.send.local
    );
    assert!(p.moves.collisions_detected >= 1, "{:?}", p.moves);
    // A train across the next rotation loses nothing.
    let train = running
        .lab
        .host_a
        .run(|| {
            ping(
                HOST_B,
                (ROTATION_SECS * 1.5 / 0.02) as u64,
                Pace::Train {
                    interval: Duration::from_millis(20),
                },
                Duration::from_secs(1),
            )
        })
        .expect("enter A")
        .expect("ping");
    assert_eq!(train.lost(), 0, "lost at {:?}", train.lost_at);
    drop(held);
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_wrong_public_key_is_explained_in_one_log_line_and_in_status() {
    common::require_root();
    let mut running = configured(2.0);
    // Gateway B is told a public key for A that A does not have.
    let config_b = running.dir.join("gw-B.toml");
    let text = std::fs::read_to_string(&config_b).expect("config B");
    let wrong =
        mt6d::keys::public_key_text(&mt6d::keys::new_private_key().expect("key").public_key());
    let mut replaced = 0;
    let text: String = text
        .lines()
        .map(|l| {
            if l.starts_with("public_key") {
                replaced += 1;
                format!("public_key = \"{wrong}\"")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(replaced, 1, "{text}");
    std::fs::write(&config_b, text).expect("config B");
    for (side, label) in [(Side::A, "A"), (Side::B, "B")] {
        let config = running.dir.join(format!("gw-{label}.toml"));
        let mut d = start_daemon(&running, side, label, &config);
        d.wait_ready(Duration::from_secs(10))
            .expect("gateway starts");
        running.daemons.push(d);
    }
    let explained = |label: usize| {
        std::fs::read_to_string(&running.daemons[label].log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("handshake down: no response for") && l.contains("public_key"))
            .count()
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while (explained(0) == 0 || explained(1) == 0) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(250));
    }
    // Both sides explain it, each exactly once.
    assert_eq!(explained(0), 1, "{}", running.daemons[0].log_tail(20));
    assert_eq!(explained(1), 1, "{}", running.daemons[1].log_tail(20));
    let log_a = std::fs::read_to_string(&running.daemons[0].log).expect("log A");
    let start = log_a
        .lines()
        .find(|l| l.contains("running: own public key"))
        .expect("start line");
    assert!(start.contains(env!("CARGO_PKG_VERSION")), "{start}");
    assert!(start.contains("peer(s): "), "{start}");
    for side in [Side::A, Side::B] {
        let st = common::status(&running, side);
        let p = &st.peers[0];
        let h = p.handshake.as_ref().expect("handshake peer");
        assert!(!h.has_keys, "no keys with a wrong public_key");
        assert!(h.initiations_sent > 0);
        assert_eq!(p.last_rx_ms_ago, None, "nothing ever arrived");
    }
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn external_interface_deleted_and_recreated_is_followed_and_traffic_resumes() {
    common::require_root();
    let mut running = configured(2.0);
    for label in ["A", "B"] {
        let path = running.dir.join(format!("gw-{label}.toml"));
        let text = std::fs::read_to_string(&path).expect("config");
        assert!(text.contains("[gateway]\n"), "{text}");
        let text = text.replacen(
            "[gateway]\n",
            "[gateway]\ninterface_down_exit_secs = 2\n",
            1,
        );
        std::fs::write(&path, text).expect("config");
    }
    let launch = |running: &mut Running| {
        for (side, label) in [(Side::A, "A"), (Side::B, "B")] {
            let config = running.dir.join(format!("gw-{label}.toml"));
            let mut d = start_daemon(running, side, label, &config);
            d.wait_ready(Duration::from_secs(10))
                .expect("gateway starts");
            running.daemons.push(d);
        }
    };
    launch(&mut running);
    wait_for_path(&running.lab, HOST_B, 1);
    let st = common::status(&running, Side::A);
    assert!(
        st.interfaces
            .iter()
            .any(|i| i.role == "external" && i.name == "ext0" && i.state == "up"),
        "{:?}",
        st.interfaces
    );

    // The public link goes away (the veth pair: both gateways lose their external interface).
    mt6d_lab::topology::ip(&running.lab.gw_a, &["link", "del", "ext0"]).expect("delete ext0");
    let deleted = Instant::now();
    let mut seen_missing = false;
    while deleted.elapsed() < Duration::from_millis(1_500) && !seen_missing {
        if let Ok(st) = running.daemons[0].status() {
            seen_missing = st
                .interfaces
                .iter()
                .any(|i| i.name == "ext0" && i.state == "missing");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen_missing, "status showed ext0 missing");
    // No zombie: both exit once the interface has been gone for interface_down_exit_secs.
    let deadline = Instant::now() + Duration::from_secs(10);
    while (running.daemons[0].is_running() || running.daemons[1].is_running())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(100));
    }
    for d in &mut running.daemons {
        assert!(
            !d.is_running(),
            "gateway {} still runs without its interface",
            d.label
        );
        let log = std::fs::read_to_string(&d.log).expect("log");
        assert_eq!(
            log.lines()
                .filter(|l| l.contains("external interface ext0") && l.contains("is gone"))
                .count(),
            1,
            "one line for the change, naming the interface and the kernel's answer:\n{log}"
        );
        assert!(log.contains("No such device"), "{log}");
        assert!(
            log.contains("exiting so that a supervisor restarts mt6d"),
            "{log}"
        );
    }
    let exited_after = deleted.elapsed();

    // The interface comes back under the same name; the supervisor (here, the test) restarts.
    let b_ns = running.lab.gw_b.name().to_string();
    let lab = &running.lab;
    mt6d_lab::topology::ip(
        &lab.gw_a,
        &[
            "link", "add", "ext0", "type", "veth", "peer", "name", "m6tmp0",
        ],
    )
    .expect("recreate ext0");
    mt6d_lab::topology::ip(&lab.gw_a, &["link", "set", "m6tmp0", "netns", &b_ns]).expect("move");
    mt6d_lab::topology::ip(&lab.gw_b, &["link", "set", "m6tmp0", "name", "ext0"]).expect("rename");
    mt6d_lab::topology::ip(&lab.gw_a, &["link", "set", "ext0", "up"]).expect("up A");
    mt6d_lab::topology::ip(&lab.gw_b, &["link", "set", "ext0", "up"]).expect("up B");
    let recreated = Instant::now();
    running.daemons.clear();
    launch(&mut running);
    wait_for_path(&running.lab, HOST_B, 1);
    let resumed = recreated.elapsed();
    eprintln!("gateways exited {exited_after:?} after the deletion; traffic resumed {resumed:?} after the interface came back");
    assert!(resumed < Duration::from_secs(10), "{resumed:?}");
    let train = running
        .lab
        .host_a
        .run(|| {
            ping(
                HOST_B,
                100,
                Pace::Train {
                    interval: Duration::from_millis(20),
                },
                Duration::from_secs(1),
            )
        })
        .expect("enter A")
        .expect("ping");
    assert_eq!(train.lost(), 0, "lost at {:?}", train.lost_at);
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn external_interface_down_for_a_second_is_used_again_in_place() {
    common::require_root();
    let running = start("encrypt", 2.0);
    let lab = &running.lab;
    mt6d_lab::topology::ip(&lab.gw_a, &["link", "set", "ext0", "down"]).expect("down");
    let deadline = Instant::now() + Duration::from_millis(1_500);
    let mut seen_down = false;
    while Instant::now() < deadline && !seen_down {
        seen_down = common::status(&running, Side::A)
            .interfaces
            .iter()
            .any(|i| i.name == "ext0" && i.state == "down");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(seen_down, "status showed ext0 down");
    std::thread::sleep(Duration::from_secs(1));
    mt6d_lab::topology::ip(&lab.gw_a, &["link", "set", "ext0", "up"]).expect("up");
    let up = Instant::now();
    // The same daemons carry traffic again (addresses and routes re-added in place).
    wait_for_path(lab, HOST_B, 1);
    let resumed = up.elapsed();
    eprintln!("traffic resumed {resumed:?} after ext0 came back up");
    assert!(resumed < Duration::from_secs(5), "{resumed:?}");
    let st = common::status(&running, Side::A);
    assert!(st
        .interfaces
        .iter()
        .any(|i| i.name == "ext0" && i.state == "up"));
    let log = std::fs::read_to_string(&running.daemons[0].log).expect("log");
    assert_eq!(
        log.lines()
            .filter(|l| l.contains("external interface ext0") && l.contains("is down"))
            .count(),
        1,
        "{log}"
    );
    assert!(log.contains("is up again after being down"), "{log}");
}
