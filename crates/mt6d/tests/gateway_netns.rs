//! End-to-end tests of the gateway in network namespaces (root; CI runs as root): the basics.
//! Ten rotations of ping and TCP without a true address on the wire, a clean shutdown, a
//! restart after a crash, two peers in one daemon, and a host-mode peer talking to a gateway.
//!
//! Each test builds its own lab (uniquely named namespaces, removed by the lab's guard on every
//! exit path), runs two real `mt6d run` daemons built from this workspace, and drives real
//! traffic: the kernel's TCP, our ICMPv6 pinger, and an attacker on the public link with a raw
//! packet socket. The gateway's other subjects have files of their own:
//! `gateway_attack_netns.rs` (malformed, replayed, forged and flooded packets),
//! `gateway_icmp_netns.rs` (path errors and the tunnel MTU), `gateway_loss_netns.rs` (no loss
//! over many rotations), `gateway_handshake_netns.rs` (key exchange) and
//! `gateway_collision_netns.rs` (address collisions).

use std::net::Ipv6Addr;
use std::time::Duration;

use mt6d_lab::observer::Observer;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{in_ns, Lab, Side, Topology, EXTERNAL_IF, HOST_A, HOST_B, INTERNAL_IF};
use mt6d_os::Netns;

mod common;
use common::*;

/// Ping and TCP across at least 10 rotations: no loss, SHA-256 intact, no true address on the
/// public link, at least one outer address pair per rotation.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn ping_and_tcp_survive_ten_rotations_without_leaking_true_addresses() {
    common::require_root();
    let running = start("encrypt", 1.0);
    let lab = &running.lab;
    let observer =
        Observer::start(&lab.gw_a, EXTERNAL_IF, vec![HOST_A, HOST_B], None).expect("observer");
    let before = status(&running, Side::A).peers[0].counters.rotations;

    let (tcp, pings, ()) = transfer_and_pings(lab, 5001, 11, 110, || ());
    assert_eq!(
        pings.received,
        pings.sent,
        "ping lost {} of {}",
        pings.lost(),
        pings.sent
    );
    let seen = observer.finish().expect("observer");
    let st = status(&running, Side::A);
    let rotations = st.peers[0].counters.rotations - before;

    assert!(tcp.sha256_match, "TCP data corrupted through the tunnel");
    assert!(
        rotations >= 10,
        "only {rotations} rotations during the test"
    );
    assert_eq!(seen.frames_with_true_address, 0, "{:?}", seen.first_leak);
    assert!(
        seen.outer_pairs.len() as u64 >= rotations,
        "{} outer pairs for {rotations} rotations",
        seen.outer_pairs.len()
    );
}

/// After SIGTERM the gateway namespace holds no hashed address, TUN device, route, proxy entry
/// or control socket of the daemon's, but the fail-closed guard for Host B and the route to
/// Host A on the internal interface, which the stop keeps (docs/ARCHITECTURE.md "Fail closed").
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn shutdown_removes_everything_the_daemon_created() {
    common::require_root();
    let mut running = start("encrypt", 1.0);
    let socket = running.lab.control_socket(Side::A);
    let hashed: Vec<String> = status(&running, Side::A).peers[0]
        .accept
        .iter()
        .map(|r| r.local.clone())
        .collect();
    running.daemons[0]
        .stop(Duration::from_secs(5))
        .expect("clean exit on SIGTERM");

    let gw_a = &running.lab.gw_a;
    let (addresses, tun_gone) = in_ns(gw_a, |nl| {
        let ext = nl.link_index(EXTERNAL_IF)?;
        let addrs = nl.list_addresses(ext)?;
        Ok((addrs, nl.link_index("mt6d0").is_err()))
    })
    .expect("inspect gateway A");
    let global: Vec<Ipv6Addr> = addresses
        .iter()
        .map(|a| a.addr)
        .filter(|a| a.segments()[0] & 0xffc0 != 0xfe80)
        .collect();
    assert!(
        global.is_empty(),
        "addresses left on {EXTERNAL_IF}: {global:?} (daemon had {hashed:?})"
    );
    assert!(tun_gone, "TUN device left behind");
    let all_routes = ip_in(gw_a, &["-6", "route", "show"]);
    let kept = [
        format!("prohibit {HOST_B} "),
        format!("{HOST_A} dev {INTERNAL_IF} "),
    ];
    for k in &kept {
        assert!(
            all_routes.lines().any(|l| l.starts_with(k)),
            "the stop did not keep {k:?}:\n{all_routes}"
        );
    }
    let routes: String = all_routes
        .lines()
        .filter(|l| !kept.iter().any(|k| l.starts_with(k)))
        .collect::<Vec<_>>()
        .join("\n");
    for host in [HOST_A, HOST_B] {
        assert!(
            !routes.contains(&host.to_string()),
            "route for {host} left behind:\n{routes}"
        );
    }
    assert!(
        !routes.contains("2001:db8:1::/64"),
        "hashed prefix route left behind:\n{routes}"
    );
    let proxies = ip_in(gw_a, &["-6", "neigh", "show", "proxy"]);
    assert!(
        proxies.trim().is_empty(),
        "proxy entries left behind: {proxies}"
    );
    assert!(!socket.exists(), "control socket left behind");
    let forwarding = gw_a
        .run(|| mt6d_os::sysctl::get_ipv6_conf(INTERNAL_IF, "proxy_ndp"))
        .expect("enter")
        .expect("read sysctl");
    assert_eq!(forwarding.trim(), "0", "proxy_ndp not restored");
}

/// A gateway killed with SIGKILL leaves its hashed addresses behind; started again with the
/// same configuration it removes them, carries traffic again, and a clean stop leaves nothing.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn restart_after_a_crash_converges() {
    common::require_root();
    let mut running = start("encrypt", 1.0);
    running.daemons[0].kill_hard();
    let leftover = hashed_on_external(&running.lab.gw_a);
    assert!(
        !leftover.is_empty(),
        "a killed daemon should have left its addresses (test premise)"
    );
    // The TUN device went with the process; routes into it went with the device.
    let config = running.dir.join("gw-A.toml");
    let mut again = start_daemon(&running, Side::A, "A2", &config);
    again
        .wait_ready(Duration::from_secs(10))
        .expect("restarts over the leftovers");
    running.daemons[0] = again;
    // Within two rotations the leftovers are gone (purged at start, or rotated out).
    std::thread::sleep(Duration::from_millis(2500));
    let now_bound = hashed_on_external(&running.lab.gw_a);
    for addr in &leftover {
        assert!(
            !now_bound.contains(addr) || still_accepted(&running, addr),
            "stale {addr} still bound"
        );
    }
    let r = running
        .lab
        .host_a
        .run(|| {
            ping(
                HOST_B,
                20,
                Pace::Flood {
                    wait: Duration::from_millis(500),
                },
                Duration::from_millis(500),
            )
        })
        .expect("enter A")
        .expect("ping");
    assert_eq!(r.received, 20, "traffic after restart: {r:?}");
    running.daemons[0]
        .stop(Duration::from_secs(5))
        .expect("clean stop");
    assert!(
        hashed_on_external(&running.lab.gw_a).is_empty(),
        "addresses left after the clean stop"
    );
}

fn hashed_on_external(ns: &Netns) -> Vec<Ipv6Addr> {
    in_ns(ns, |nl| {
        let ext = nl.link_index(EXTERNAL_IF)?;
        nl.list_addresses(ext)
    })
    .expect("list addresses")
    .into_iter()
    .map(|a| a.addr)
    .filter(|a| a.segments()[0] & 0xffc0 != 0xfe80)
    .collect()
}

fn still_accepted(running: &Running, addr: &Ipv6Addr) -> bool {
    status(running, Side::A).peers[0]
        .accept
        .iter()
        .any(|r| r.local.contains(&addr.to_string()))
}

/// Two streams in one daemon, each with its own key and hashed addresses: Host A talks to two
/// protected addresses behind Gateway B, and both carry traffic.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn two_peers_in_one_daemon_each_with_its_own_key() {
    common::require_root();
    let host_c: Ipv6Addr = "2001:db8:1::c".parse().expect("addr");
    let lab = Lab::build().expect("lab");
    in_ns(&lab.host_b, |nl| {
        let i = nl.link_index("eth0")?;
        nl.add_address(
            i,
            host_c,
            64,
            mt6d_os::AddrFlags {
                nodad: true,
                noprefixroute: false,
            },
        )
    })
    .expect("second address on host B");
    let dir = std::env::temp_dir().join(format!("mt6d-e2e-2p-{}", lab.gw_a.name()));
    std::fs::create_dir_all(&dir).expect("dir");
    // Fresh keys each run: a pre-shared key's packet budget is counted over its life in the
    // machine's state directory, so a fixed key would carry this machine's history.
    for name in ["k1", "k2"] {
        let key = mt6d::keys::random32().expect("random key");
        mt6d::keys::write_secret_file(&dir.join(name), &mt6d::keys::encode(&key[..]))
            .expect("key file");
    }
    let mut running = Running {
        daemons: Vec::new(),
        lab,
        dir,
        _turn: one_at_a_time(),
    };
    for (side, label, local, remotes) in [
        (
            Side::A,
            "A",
            HOST_A.to_string(),
            [HOST_B.to_string(), host_c.to_string()],
        ),
        (
            Side::B,
            "B",
            String::new(),
            [HOST_A.to_string(), HOST_A.to_string()],
        ),
    ] {
        // The pre-shared counters stay in the test's directory, not the system's.
        let mut text = format!(
            "[gateway]\ninternal_interface = \"{INTERNAL_IF}\"\nexternal_interface = \"{EXTERNAL_IF}\"\ncontrol_socket = \"{}\"\nrotation_secs = 1\nstate_dir = \"{}\"\n",
            running.lab.control_socket(side).display(),
            running.dir.join(format!("state-{label}")).display()
        );
        for (i, remote) in remotes.iter().enumerate() {
            let (l, r) = if side == Side::A {
                (local.clone(), remote.clone())
            } else {
                ([HOST_B, host_c][i].to_string(), remote.clone())
            };
            // Two streams share Host A; on Gateway B they are two local hosts.
            text += &format!(
                "\n[[peer]]\nname = \"p{i}\"\nlocal_host = \"{l}\"\nremote_host = \"{r}\"\nkey_file = \"k{}\"\n",
                i + 1
            );
        }
        let config = running.dir.join(format!("gw-{label}.toml"));
        std::fs::write(&config, text).expect("config");
        let mut d = start_daemon(&running, side, label, &config);
        match d.wait_ready(Duration::from_secs(10)) {
            Ok(_) => running.daemons.push(d),
            Err(e) => panic!("{e}"),
        }
    }
    for dst in [HOST_B, host_c] {
        wait_for_path(&running.lab, dst, 5);
    }
    let st = status(&running, Side::A);
    assert_eq!(st.peers.len(), 2);
    assert!(
        st.peers.iter().all(|p| p.counters.rx_packets > 0),
        "both streams carried traffic: {:?}",
        st.peers
    );
    assert_ne!(
        st.peers[0].send.local, st.peers[1].send.local,
        "streams share a hashed address"
    );
}

/// 001's integrated configuration: Host A runs mt6d itself (`role = "host"`, its true address on
/// the TUN device) and talks to Gateway B in gateway mode, on one segment and across a router.
/// Ping and TCP across several 1 s rotations lose nothing and keep the SHA-256; the public link
/// never carries a true address; the host's forwarding and proxy NDP are left alone; and a clean
/// stop removes the address, TUN device, routes and hashed addresses.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn host_mode_peer_talks_to_a_gateway_mode_peer() {
    common::require_root();
    for topology in [Topology::Switched, Topology::Routed] {
        let lab = Lab::build_host_mode(topology, "m6").expect("host-mode lab builds");
        assert_eq!(
            lab.host_a.name(),
            lab.gw_a.name(),
            "one namespace for Host A"
        );
        let mut running = start_gateways(lab, "encrypt", 1.0, (true, None));
        let lab = &running.lab;
        let st = status(&running, Side::A);
        assert_eq!(st.role, "host", "{topology}");
        assert_eq!(st.internal_interface, "", "{topology}");
        let (on_tun, on_ext) = in_ns(&lab.host_a, |nl| {
            let tun = nl.link_index("mt6d0")?;
            let ext = nl.link_index(EXTERNAL_IF)?;
            Ok((nl.list_addresses(tun)?, nl.list_addresses(ext)?))
        })
        .expect("inspect host A");
        assert!(
            on_tun
                .iter()
                .any(|a| a.addr == HOST_A && a.prefix_len == 128),
            "{topology}: {HOST_A} not on the TUN device: {on_tun:?}"
        );
        assert!(
            on_ext.iter().all(|a| a.addr != HOST_A),
            "{topology}: true address on the external interface"
        );
        let forwarding = lab
            .host_a
            .run(|| mt6d_os::sysctl::get_ipv6_conf("all", "forwarding"))
            .expect("enter")
            .expect("read sysctl");
        assert_eq!(forwarding.trim(), "0", "{topology}: host mode forwards");

        let observer = Observer::start(&lab.host_a, EXTERNAL_IF, vec![HOST_A, HOST_B], None)
            .expect("observer");
        settle_handshakes(&running);
        let before = st.peers[0].counters.rotations;
        let drops_before =
            [Side::A, Side::B].map(|side| status(&running, side).peers[0].counters.drops.clone());
        let (tcp, pings, ()) = transfer_and_pings(lab, 5001, 6, 60, || ());
        assert_eq!(
            pings.received,
            pings.sent,
            "{topology}: ping lost {} of {}",
            pings.lost(),
            pings.sent
        );
        let seen = observer.finish().expect("observer");
        let st = status(&running, Side::A);
        let rotations = st.peers[0].counters.rotations - before;
        assert!(tcp.sha256_match, "{topology}: TCP data corrupted");
        assert!(rotations >= 5, "{topology}: only {rotations} rotations");
        assert_eq!(
            seen.frames_with_true_address, 0,
            "{topology}: {:?}",
            seen.first_leak
        );
        assert!(
            seen.outer_pairs.len() as u64 >= rotations,
            "{topology}: {} outer pairs for {rotations} rotations",
            seen.outer_pairs.len()
        );
        // Start-up behind a router may lose and retry handshake messages; once the path is up,
        // nothing is dropped on either side.
        for (side, before) in [(Side::A, &drops_before[0]), (Side::B, &drops_before[1])] {
            let after = &status(&running, side).peers[0].counters.drops;
            let added: Vec<_> = after
                .iter()
                .filter(|(r, n)| **n > before.get(*r).copied().unwrap_or(0))
                .collect();
            assert!(
                added.is_empty(),
                "{topology} {side:?}: drops during traffic {added:?}"
            );
        }

        running.daemons[0]
            .stop(Duration::from_secs(5))
            .expect("clean exit on SIGTERM");
        let host_a = &running.lab.host_a;
        assert!(
            in_ns(host_a, |nl| Ok(nl.link_index("mt6d0").is_err())).expect("inspect"),
            "{topology}: TUN device left behind"
        );
        let left: Vec<Ipv6Addr> = hashed_on_external(host_a)
            .into_iter()
            // The routed lab's own public address of Host A stays; it is not the daemon's.
            .filter(|a| *a != running.lab.public_a.addr)
            .collect();
        assert!(
            left.is_empty(),
            "{topology}: addresses left on {EXTERNAL_IF}: {left:?}"
        );
        // A clean stop keeps the fail-closed guard for the peer (only `mt6d down` lifts it).
        let all_routes = ip_in(host_a, &["-6", "route", "show"]);
        let guard = format!("prohibit {HOST_B} ");
        assert!(
            all_routes.lines().any(|l| l.starts_with(&guard)),
            "{topology}: the stop did not keep {guard:?}:\n{all_routes}"
        );
        let routes: String = all_routes
            .lines()
            .filter(|l| !l.starts_with(&guard))
            .collect::<Vec<_>>()
            .join("\n");
        for gone in [
            HOST_A.to_string(),
            HOST_B.to_string(),
            "2001:db8:1::/64".into(),
            "2001:db8:b::/64".into(),
        ] {
            assert!(
                !routes.contains(&gone),
                "{topology}: route {gone} left behind:\n{routes}"
            );
        }
        let local = ip_in(host_a, &["-6", "route", "show", "table", "local"]);
        assert!(
            !local.contains(&HOST_A.to_string()),
            "{topology}: {HOST_A} still local:\n{local}"
        );
    }
}
