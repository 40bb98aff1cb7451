//! The server role end to end (seed 002): one `mt6d run` with a `[server]` file
//! serving 10,000 clients from two client namespaces, each client on hashed addresses and ports
//! of its own, through a router that routes the server's hashed /64 to it.
//!
//! ```text
//!  c1 (5,000 clients, 2001:db8:c1::/64 local) --\
//!                                               router -- server (2001:db8:5::/64 local, echo on
//!  c2 (5,000 clients, 2001:db8:c2::/64 local) --/          2001:db8:5:1::1 port 3540 via TUN)
//! ```
//!
//! Checked: every request of both namespaces answered (ten times its size, 002's echo) across
//! one-second rotations with jitter, 0 lost; requests from many clients leave from that many
//! hashed addresses; datagrams to random addresses of the server's /64, to a current address on
//! a wrong port, pings and TCP connections get no answer of any kind; a client added to the
//! peers file works after SIGHUP and a removed one gets no answer at once; the kernel's address
//! and UDP socket counts stay the same when clients are added; after SIGTERM its guards, table
//! and route stay (fail closed) until `mt6d down` removes them.
//!
//! Run: `cargo test --release -p mt6d --test server_netns -- --include-ignored --nocapture`.

mod common;

use std::collections::HashSet;
use std::net::{Ipv6Addr, SocketAddrV6, TcpStream, UdpSocket};
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mt6d::daemon::clock;
use mt6d_lab::clients::{echo_service, ClientSet, ClientSpec, Reply};
use mt6d_lab::daemon::DaemonProcess;
use mt6d_lab::server_lab::{ServerLab, ECHO_PORT, SERVER_TRUE};
use mt6d_lab::topology::resolved;
use mt6d_os::{unique_name, Netns};

const CLIENT_RX_PORT: u16 = 7420;
const PER_NAMESPACE: usize = 5_000;

fn spec(n: u16) -> ClientSpec {
    ServerLab::spec(n, Duration::from_secs(1), true)
}

/// The peers file: `count` clients of each namespace, minus the names in `skip`, plus `extra`.
fn peers_file(path: &Path, count: usize, skip: &[&str], extra: &[(u16, usize)]) {
    use std::os::unix::fs::PermissionsExt;
    let mut text = String::from("# name public-key true-address [prefix=] [key=]\n");
    for n in [1u16, 2] {
        let s = spec(n);
        for i in 0..count {
            let name = format!("c{n}-{i}");
            if !skip.contains(&name.as_str()) {
                text.push_str(&s.peers_line(&name, i));
            }
        }
    }
    for &(n, i) in extra {
        text.push_str(&spec(n).peers_line(&format!("c{n}-{i}"), i));
    }
    std::fs::write(path, text).expect("peers file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
}

fn sh(ns: &Netns, cmd: &str) -> String {
    let out = ns
        .command("sh")
        .expect("sh")
        .args(["-c", cmd])
        .output()
        .expect("run");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Kernel state that must not grow with the clients: addresses and UDP sockets.
fn kernel_counts(ns: &Netns) -> (usize, usize) {
    (
        sh(ns, "ip -6 addr show | grep -c inet6")
            .trim()
            .parse()
            .unwrap_or(0),
        sh(ns, "ss -u -a -n | tail -n +2 | wc -l")
            .trim()
            .parse()
            .unwrap_or(0),
    )
}

fn wait_log(d: &DaemonProcess, needle: &str, count: usize, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let log = std::fs::read_to_string(&d.log).unwrap_or_default();
        if log.matches(needle).count() >= count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Writes `config` beside the peers file in `dir`, starts `mt6d run` with it in `server`, waits
/// for it to serve `clients`, and starts the echo service (stopped by setting the flag).
fn start(
    server: &Netns,
    dir: &Path,
    config: &str,
    clients: usize,
) -> (DaemonProcess, Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
    let path = dir.join("server.toml");
    std::fs::write(&path, config).expect("config");
    let mut cmd = server.command(common::MT6D).expect("command");
    cmd.arg("run").arg("-c").arg(&path);
    let daemon = DaemonProcess::spawn(
        "server",
        cmd,
        &dir.join("none.sock"),
        &dir.join("server.log"),
    )
    .expect("start server");
    wait_log(
        &daemon,
        &format!("serving {clients} clients"),
        1,
        Duration::from_secs(30),
    );
    let stop = Arc::new(AtomicBool::new(false));
    let echo = echo_service(server, SERVER_TRUE, ECHO_PORT, 10, stop.clone()).expect("echo");
    (daemon, stop, echo)
}

/// Sends one request from each client in `who` (in turn, `per_client` times, paced) and waits
/// for every answer; returns (sent, answers, distinct hashed source addresses used).
fn exchange(
    ns: &Netns,
    spec: &ClientSpec,
    who: Vec<usize>,
    per_client: usize,
    pace: Duration,
    table: &str,
) -> (u64, Vec<Reply>, usize, mt6d_lab::clients::ClientCounters) {
    ns.run(|| {
        let _t = ClientSet::install(spec, table, CLIENT_RX_PORT).expect("client namespace");
        let mut set = ClientSet::new(spec, PER_NAMESPACE + 10, CLIENT_RX_PORT, clock::now())
            .expect("clients");
        let mut replies = Vec::new();
        let mut sources = HashSet::new();
        let mut sent = 0u64;
        for round in 0..per_client {
            for &i in &who {
                set.step(clock::now());
                if let Some(r) = set.route(i) {
                    sources.insert(*r.local.ip());
                }
                let payload = format!("req {i} {round} ................................");
                set.send(spec, i, ECHO_PORT, payload.as_bytes())
                    .expect("send");
                sent += 1;
                set.recv(&mut replies).expect("recv");
                std::thread::sleep(pace);
            }
        }
        // Late answers.
        let deadline = Instant::now() + Duration::from_secs(2);
        while (replies.len() as u64) < sent && Instant::now() < deadline {
            set.step(clock::now());
            set.recv(&mut replies).expect("recv");
            std::thread::sleep(Duration::from_millis(5));
        }
        (sent, replies, sources.len(), set.counters)
    })
    .expect("enter client namespace")
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn ten_thousand_clients_on_their_own_addresses_and_nothing_else_answers() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = ServerLab::build("m6s").expect("lab");
    let (server, c1, c2) = (&lab.server, &lab.clients[0], &lab.clients[1]);
    let dir = std::env::temp_dir().join(unique_name("m6srv"));
    std::fs::create_dir_all(&dir).expect("dir");
    let peers = dir.join("clients");
    peers_file(&peers, PER_NAMESPACE, &[], &[]);
    let (mut daemon, stop, echo) = start(
        server,
        &dir,
        &ServerLab::server_config(1.0, 2, &dir.join("state")),
        10_000,
    );

    // 1. Both namespaces at once, 400 clients each, 3 requests each over about 4 rotations.
    let (s1, s2) = (spec(1), spec(2));
    let who: Vec<usize> = (0..400).map(|k| k * (PER_NAMESPACE / 400)).collect();
    // The observer on the server's public link watches for every true address in play.
    let mut watched: Vec<Ipv6Addr> = who
        .iter()
        .flat_map(|&i| [s1.true_addr(i), s2.true_addr(i)])
        .collect();
    watched.push(SERVER_TRUE);
    let observer =
        mt6d_lab::observer::Observer::start(&lab.router, "rs", watched, None).expect("observer");
    let (a, b) = std::thread::scope(|t| {
        let h1 = t.spawn(|| {
            exchange(
                c1,
                &s1,
                who.clone(),
                3,
                Duration::from_micros(1500),
                "m6s_c1",
            )
        });
        let h2 = t.spawn(|| {
            exchange(
                c2,
                &s2,
                who.clone(),
                3,
                Duration::from_micros(1500),
                "m6s_c2",
            )
        });
        (h1.join().expect("c1"), h2.join().expect("c2"))
    });
    if a.1.len() as u64 != a.0 || b.1.len() as u64 != b.0 {
        for (label, ns) in [("router", &lab.router), ("server", server), ("c1", c1)] {
            println!("--- {label}\n{}", sh(ns, "nstat -az | grep -v ' 0 ' | grep -iE 'ip6|udp6|Udp' ; ip -s -s link | sed 's/^/|/'; nstat -az | grep -iE 'drop|discard|err' | grep -v ' 0 '"));
        }
        println!(
            "{}",
            std::fs::read_to_string(&daemon.log).unwrap_or_default()
        );
    }
    for (label, (sent, replies, sources, counters)) in [("c1", &a), ("c2", &b)] {
        println!(
            "{label}: {sent} requests, {} answers, {sources} source addresses, {counters:?}",
            replies.len()
        );
        assert_eq!(
            replies.len() as u64,
            *sent,
            "{label}: every request answered"
        );
        assert_eq!(
            counters.wrong_route, 0,
            "{label}: no answer from a wrong source"
        );
        assert!(
            *sources >= 400,
            "{label}: each client on its own addresses ({sources})"
        );
        for r in replies {
            assert_eq!(r.payload.len() % 10, 0);
            let one = &r.payload[..r.payload.len() / 10];
            assert!(
                one.starts_with(format!("req {} ", r.client).as_bytes()),
                "{label}: answer to its own client"
            );
            assert_eq!(r.payload, one.repeat(10));
        }
    }

    let seen = observer.finish().expect("observer");
    println!(
        "public link: {} frames, {} UDP, {} outer address pairs, {} with a true address",
        seen.frames,
        seen.udp_frames,
        seen.outer_pairs.len(),
        seen.frames_with_true_address
    );
    assert_eq!(seen.frames_with_true_address, 0, "{:?}", seen.first_leak);
    assert!(
        seen.udp_frames >= 2 * 2 * 1200,
        "every request and answer crossed it"
    );
    assert!(
        seen.outer_pairs.len() >= 2 * 400,
        "each client on its own addresses"
    );

    // 2. Nothing else of the prefix answers: random addresses, a current address on a wrong
    // port, pings, TCP.
    let current = c1
        .run(|| {
            let set = ClientSet::new(&s1, 1, 0, clock::now()).expect("one client");
            set.route(0).expect("route").remote
        })
        .expect("enter");
    let silent = c1
        .run(|| {
            let mut answered = Vec::new();
            let mut targets: Vec<SocketAddrV6> = (1..=50u16)
                .map(|k| {
                    SocketAddrV6::new(
                        Ipv6Addr::new(0x2001, 0xdb8, 5, 0, k, 0xbeef, k, 0x1234),
                        1024 + k * 97,
                        0,
                        0,
                    )
                })
                .collect();
            targets.push(SocketAddrV6::new(
                *current.ip(),
                current.port() ^ 0x5a5a,
                0,
                0,
            ));
            targets.push(SocketAddrV6::new(*current.ip(), ECHO_PORT, 0, 0));
            for t in &targets {
                let s = UdpSocket::bind("[::]:0").expect("udp");
                s.connect(t).expect("connect");
                s.set_read_timeout(Some(Duration::from_millis(30)))
                    .expect("timeout");
                let _ = s.send(b"is anyone there?");
                let mut buf = [0u8; 64];
                // An ICMP error would show as ECONNREFUSED or EHOSTUNREACH here.
                std::thread::sleep(Duration::from_millis(20));
                match s.recv(&mut buf) {
                    Err(e)
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) => {}
                    other => answered.push(format!("udp {t}: {other:?}")),
                }
            }
            for addr in [
                *current.ip(),
                Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 1, 2, 3, 4),
            ] {
                let ping = mt6d_lab::ping::ping(
                    addr,
                    3,
                    mt6d_lab::ping::Pace::Train {
                        interval: Duration::from_millis(100),
                    },
                    Duration::from_millis(500),
                )
                .expect("ping");
                if ping.received > 0 {
                    answered.push(format!("ping {addr}: {} answers", ping.received));
                }
                match TcpStream::connect_timeout(
                    &std::net::SocketAddr::V6(SocketAddrV6::new(addr, 80, 0, 0)),
                    Duration::from_millis(500),
                ) {
                    Err(e) if e.kind() == std::io::ErrorKind::TimedOut => {}
                    other => answered.push(format!("tcp {addr}: {other:?}")),
                }
            }
            answered
        })
        .expect("enter");
    assert!(silent.is_empty(), "the prefix answered: {silent:?}");

    // 3. Live changes: add c1-5005, remove c1-0, SIGHUP; kernel counts unchanged.
    let before = kernel_counts(server);
    peers_file(&peers, PER_NAMESPACE, &["c1-0"], &[(1, PER_NAMESPACE + 5)]);
    let pid = daemon.pid().expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    wait_log(&daemon, "reloaded", 1, Duration::from_secs(10));
    let after = kernel_counts(server);
    assert_eq!(
        before, after,
        "addresses and UDP sockets in the server's kernel (ip -6 addr, ss -u)"
    );
    let (sent, replies, _, _) = exchange(
        c1,
        &s1,
        vec![PER_NAMESPACE + 5],
        3,
        Duration::from_millis(10),
        "m6s_c1",
    );
    assert_eq!(replies.len() as u64, sent, "the added client is served");
    let (sent, replies, _, _) = exchange(c1, &s1, vec![0], 3, Duration::from_millis(10), "m6s_c1");
    assert_eq!(sent, 3);
    assert!(
        replies.is_empty(),
        "the removed client got answers: {replies:?}"
    );

    // 4. Stop: the TUN device is gone; the guards, the table and the route stay (fail closed
    // until the next start) and `mt6d down` removes them.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answered = echo.join().expect("echo");
    assert!(answered >= 2 * 1200);
    daemon.stop(Duration::from_secs(10)).expect("clean stop");
    let log = std::fs::read_to_string(&daemon.log).unwrap_or_default();
    println!("{log}");
    assert!(!sh(server, "ip link").contains("mt6ds0"), "TUN device left");
    assert!(
        sh(server, "ip -6 route show").contains("prohibit 2001:db8:c1:1::/64"),
        "the stop took the guard routes away"
    );
    assert!(
        !sh(server, "nft list tables").trim().is_empty(),
        "the stop took the table away"
    );
    let down = server
        .command(common::MT6D)
        .expect("command")
        .arg("down")
        .arg("-c")
        .arg(dir.join("server.toml"))
        .output()
        .expect("mt6d down");
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(
        !sh(server, "ip -6 route show").contains("prohibit"),
        "guard route left by mt6d down"
    );
    assert!(
        sh(server, "nft list tables").trim().is_empty(),
        "nftables table left by mt6d down"
    );
    assert!(
        !sh(server, "ip -6 route show table local").contains("2001:db8:5::/64"),
        "AnyIP route left by mt6d down"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn on_a_shared_segment_the_daemon_resolves_current_addresses_only() {
    common::require_root();
    let _turn = common::one_at_a_time();
    // The router has the server's /64 on-link: every hashed address is resolved by a Neighbour
    // Solicitation, which only the daemon's responder answers.
    let lab = ServerLab::build_with("m6n", true).expect("lab");
    let (server, c1) = (&lab.server, &lab.clients[0]);
    let dir = std::env::temp_dir().join(unique_name("m6nd"));
    std::fs::create_dir_all(&dir).expect("dir");
    peers_file(&dir.join("clients"), 200, &[], &[]);
    let (mut daemon, stop, echo) = start(
        server,
        &dir,
        &ServerLab::server_config_with(1.0, 2, &dir.join("state"), true),
        400,
    );

    // 100 clients, twice each over two jittered one-second rotations: every server address
    // they use is resolved by the router through the responder, and every request is answered.
    let s1 = ServerLab::spec(1, Duration::from_secs(1), true);
    let (sent, replies, _, counters) = exchange(
        c1,
        &s1,
        (0..100).collect(),
        2,
        Duration::from_millis(10),
        "m6n_c1",
    );
    assert_eq!(replies.len() as u64, sent, "{counters:?}");

    // A current address resolves to the server's link-layer address; one that is no client's
    // does not resolve at all (the router's three solicitations go unanswered).
    let server_mac = server
        .run(|| {
            let mut nl = mt6d_os::Netlink::open().expect("netlink");
            let i = nl.link_index("s0").expect("s0");
            nl.link_mac(i).expect("mac").expect("a MAC")
        })
        .expect("enter server");
    let current = c1
        .run(|| {
            let set = ClientSet::new(&s1, 1, 0, clock::now()).expect("one client");
            set.route(0).expect("route").remote
        })
        .expect("enter");
    assert_eq!(
        resolved(&lab.router, "rs", *current.ip(), Duration::from_secs(3)).expect("router"),
        Some(server_mac)
    );
    let nobody = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0xdead, 0xbeef, 0x1234, 0x5678);
    assert_eq!(
        resolved(&lab.router, "rs", nobody, Duration::from_millis(3500)).expect("router"),
        None,
        "an address that is no client's was resolved"
    );

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    daemon.stop(Duration::from_secs(10)).expect("clean stop");
    let log = std::fs::read_to_string(&daemon.log).unwrap_or_default();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("counters:"))
        .unwrap_or("");
    println!("{line}");
    let count = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(count("ns_answered") >= 100, "{line}");
    assert!(count("ns_not_current") >= 1, "{line}");

    // Priming (external_next_hop, docs/PROTOCOL.md §5.1): the router learns each client's
    // server address before the epoch starts, so an idle client's current address is in the
    // router's neighbour table, with the server's MAC, though nothing was ever sent to it.
    // 50 clients: a router's neighbour table holds one entry per primed address for a while,
    // and Linux's is small by default (gc_thresh3 = 1,024 entries, shared by every namespace),
    // which 400 clients at one-second rotations overflow within seconds (docs/CONFIG.md).
    peers_file(&dir.join("clients"), 25, &[], &[]);
    let socket = dir.join("server.sock");
    let (mut daemon, stop, echo) = start(
        server,
        &dir,
        &format!(
            "{}external_next_hop = \"2001:db8:f5::1\"\ncontrol_socket = \"{}\"\n",
            ServerLab::server_config_with(1.0, 2, &dir.join("state"), true),
            socket.display()
        ),
        50,
    );
    std::thread::sleep(Duration::from_millis(2500));
    let idle = c1
        .run(|| {
            let set = ClientSet::new(&s1, 25, 0, clock::now()).expect("clients");
            set.route(20).expect("route").remote
        })
        .expect("enter");
    let neigh = sh(
        &lab.router,
        &format!("ip -6 neigh show dev rs to {}", idle.ip()),
    );
    println!("router's entry for idle client 20's current server address: {neigh}");
    let mac = server_mac
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":");
    let status = std::process::Command::new(common::MT6D)
        .args(["status", "--socket", &socket.display().to_string()])
        .output()
        .expect("status");
    let status = String::from_utf8_lossy(&status.stdout);
    println!("{status}");
    assert!(neigh.contains(&mac), "not primed: {neigh:?}");
    let primed = status
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix("ns_primed=")?.parse::<u64>().ok())
        .unwrap_or(0);
    // 50 clients: at start their current and next epochs, then one a second each.
    assert!(primed >= 100, "{status}");
    assert!(!status.contains("ns_prime_failures"), "{status}");

    // Killed without clean-up: the clients' true addresses stay off the external link (the
    // guard routes refuse them) and the prefix stays closed (table and AnyIP route remain);
    // `mt6d down` then removes all three.
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    daemon.kill_hard();
    let deadline = Instant::now() + Duration::from_secs(5);
    while sh(server, "ip link").contains("mt6ds0") {
        assert!(Instant::now() < deadline, "TUN device outlived the process");
        std::thread::sleep(Duration::from_millis(20));
    }
    let client = s1.true_addr(3);
    let routes = sh(server, "ip -6 route show");
    assert!(routes.contains("prohibit 2001:db8:c1:1::/64"), "{routes}");
    let sent = server
        .run(|| {
            let sock = UdpSocket::bind("[::]:0").expect("udp");
            sock.send_to(b"in clear?", SocketAddrV6::new(client, ECHO_PORT, 0, 0))
        })
        .expect("enter server");
    assert!(
        sent.is_err(),
        "a datagram to a client's true address was sent: {sent:?}"
    );
    assert!(
        !sh(server, "nft list tables").trim().is_empty(),
        "table gone after a kill"
    );
    let down = server
        .command(common::MT6D)
        .expect("command")
        .arg("down")
        .arg("-c")
        .arg(dir.join("server.toml"))
        .output()
        .expect("mt6d down");
    assert!(
        down.status.success(),
        "{}",
        String::from_utf8_lossy(&down.stderr)
    );
    assert!(
        sh(server, "nft list tables").trim().is_empty(),
        "table left by down"
    );
    assert!(
        !sh(server, "ip -6 route show table local").contains("2001:db8:5::/64"),
        "AnyIP route left by down"
    );
    assert!(
        !sh(server, "ip -6 route show").contains("prohibit"),
        "guard left by down"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A client that moves an epoch (docs/PROTOCOL.md §5.2: a port it cannot bind, an address taken
/// on its link) tells the server with a route move notice; the server follows and acknowledges,
/// and the epoch is not lost. Client 0 sends a request every 10 ms for about 5 s and, each time
/// a new epoch starts, moves the next one (once, and the last time twice); every request is
/// answered, the moved epochs carried requests both ways on their moved routes, and every move
/// was acknowledged.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_client_that_moves_an_epoch_loses_none_of_it() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = ServerLab::build("m6m").expect("lab");
    let (server, c1) = (&lab.server, &lab.clients[0]);
    let dir = std::env::temp_dir().join(unique_name("m6mv"));
    std::fs::create_dir_all(&dir).expect("dir");
    peers_file(&dir.join("clients"), 10, &[], &[]);
    let (mut daemon, stop, echo) = start(
        server,
        &dir,
        &ServerLab::server_config(1.0, 2, &dir.join("state")),
        20,
    );
    let s1 = spec(1);
    let (sent, on_moved, replies, counters, settled, moves) = c1
        .run(|| {
            let _t = ClientSet::install(&s1, "m6m_c1", CLIENT_RX_PORT).expect("client namespace");
            let mut set = ClientSet::new(&s1, 10, CLIENT_RX_PORT, clock::now()).expect("clients");
            let mut replies = Vec::new();
            let (mut sent, mut on_moved, mut moves) = (0u64, 0u64, 0u32);
            let mut last_epoch = None;
            let start = Instant::now();
            let mut round = 0u64;
            while start.elapsed() < Duration::from_secs(5) {
                let now = clock::now();
                set.step(now);
                let route = set.route(0).expect("route");
                if last_epoch != Some(route.epoch) {
                    // Not in the epoch the run starts in: it may be about to end.
                    let first = last_epoch.is_none();
                    last_epoch = Some(route.epoch);
                    // 100 ms into an epoch the next is bound (one interval early, §3): move it.
                    let times = match start.elapsed() {
                        _ if first => 0,
                        t if t > Duration::from_millis(3500) => 2,
                        _ => 1,
                    };
                    for _ in 0..times {
                        let next = mt6d_proto::Epoch(route.epoch.0 + 1);
                        let got = set.move_epoch(0, now, next).expect("move");
                        assert!(
                            matches!(got, mt6d_proto::moves::CollisionOutcome::Moved(_)),
                            "{got:?}"
                        );
                        moves += 1;
                    }
                }
                set.send_notices(now).expect("notices");
                on_moved += u64::from(set.offset(0, route.epoch) > 0);
                let payload = format!("req 0 {round} ................................");
                set.send(&s1, 0, ECHO_PORT, payload.as_bytes())
                    .expect("send");
                sent += 1;
                round += 1;
                set.recv(&mut replies).expect("recv");
                std::thread::sleep(Duration::from_millis(10));
            }
            // The last answers, and the ack of a move made just before the end (waiting only
            // for the answers let the assertion below race the server's ack).
            let deadline = Instant::now() + Duration::from_secs(2);
            while ((replies.len() as u64) < sent || !set.settled(0)) && Instant::now() < deadline {
                set.step(clock::now());
                set.send_notices(clock::now()).expect("notices");
                set.recv(&mut replies).expect("recv");
                std::thread::sleep(Duration::from_millis(5));
            }
            (sent, on_moved, replies, set.counters, set.settled(0), moves)
        })
        .expect("enter client namespace");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = echo.join();
    daemon.stop(Duration::from_secs(10)).expect("clean stop");
    let log = std::fs::read_to_string(&daemon.log).unwrap_or_default();
    let line = log
        .lines()
        .rev()
        .find(|l| l.contains("counters:"))
        .unwrap_or("");
    println!(
        "{sent} requests ({on_moved} on moved epochs), {} answers, {moves} moves, {counters:?}\n{line}",
        replies.len()
    );
    let count = |key: &str| {
        line.split_whitespace()
            .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('=')?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        on_moved >= 100,
        "the moved epochs carried requests: {on_moved}"
    );
    assert_eq!(replies.len() as u64, sent, "every request answered");
    assert_eq!(counters.wrong_route, 0);
    assert_eq!(counters.rejected, 0);
    assert!(settled, "every move acknowledged");
    // One ack per notice the server applied once it served the moved route: fewer than the
    // moves when two of one epoch came in a row.
    assert!(counters.acks >= 1, "{counters:?}");
    let moved = count("routes_moved");
    assert!((3..=u64::from(moves)).contains(&moved), "{line}");
    assert_eq!(count("notices_refused"), 0, "{line}");
    let _ = std::fs::remove_dir_all(&dir);
}
