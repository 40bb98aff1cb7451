//! Forged ICMPv6 errors and router advertisements on the public side (docs/PROTOCOL.md §5,
//! §5.3), end to end in network namespaces (root; CI runs as root).
//!
//! The router of the routed lab plays the forger: it sees Gateway A's tunnel packets (so it can
//! quote real ones, as anyone on the path can) and sends what it likes about them. What must
//! hold: an error is believed only about a packet Gateway A sent, once; a Packet Too Big only if
//! its MTU could be true; a Router Advertisement's MTU only from a default router, and only for
//! its lifetime. A genuine router's errors still work (the tests of gateway_icmp_netns.rs).

use std::net::{Ipv6Addr, UdpSocket};
use std::time::{Duration, Instant};

use mt6d_lab::topology::{Lab, Side, Topology, GATEWAY_A, HOST_A, HOST_B, HOST_IF, ROUTER_IF_A};
use mt6d_os::capture::PacketCapture;
use mt6d_proto::wire::router_advertisement;

mod common;
use common::*;

const ROUTER_ADDR: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0xa, 0, 0, 0, 0, 1);

/// Runs in the router: the next tunnel packet Gateway A sends (from its hashed /64, not its
/// own address) of at least `min_len` bytes, from the IPv6 header on.
fn capture_outer_from_a(min_len: usize) -> Vec<u8> {
    let cap = PacketCapture::open(ROUTER_IF_A, 4096, Duration::from_millis(100)).expect("capture");
    let mut buf = vec![0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    let gw: Ipv6Addr = "2001:db8:a::2".parse().expect("addr");
    while Instant::now() < deadline {
        if let Some(f) = cap.recv(&mut buf).expect("capture") {
            let frame = &buf[..f.captured];
            if f.captured == f.wire_len
                && f.captured >= 14 + min_len
                && frame.len() > 62
                && frame[12..14] == [0x86, 0xdd]
                && frame[20] == 17
                && frame[22..30] == [0x20, 0x01, 0x0d, 0xb8, 0, 0x0a, 0, 0]
                && frame[22..38] != gw.octets()
            {
                return frame[14..].to_vec();
            }
        }
    }
    panic!("no tunnel packet of {min_len}+ bytes from gateway A seen on the router");
}

/// Runs in the router: sends an ICMPv6 error of `t`, `code`, `data` quoting `outer` (cut to
/// 1232 bytes, as RFC 4443 §2.4(c) has it) to the quoted packet's source.
fn send_error(t: u8, code: u8, data: u32, outer: &[u8]) {
    let sock = mt6d_os::Icmp6Socket::open().expect("socket");
    sock.set_filter_pass_only(&[]).expect("filter");
    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&outer[8..24]).expect("16"));
    let mut msg = vec![t, code, 0, 0];
    msg.extend_from_slice(&data.to_be_bytes());
    msg.extend_from_slice(&outer[..outer.len().min(1232)]);
    sock.send_to(&msg, dst, Some(ROUTER_ADDR))
        .expect("send error");
}

/// Runs in Host A: the ICMPv6 errors (types 1-4) from Gateway A received for `duration`.
fn errors_from_gateway(duration: Duration) -> Vec<Vec<u8>> {
    let sock = mt6d_os::Icmp6Socket::open().expect("ICMPv6 socket");
    sock.set_filter_pass_only(&[1, 2, 3, 4]).expect("filter");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    let end = Instant::now() + duration;
    while Instant::now() < end {
        if let Ok(info) = sock.recv_from(&mut buf) {
            if info.src == GATEWAY_A {
                got.push(buf[..info.len].to_vec());
            }
        }
    }
    got
}

fn dropped(running: &Running, reason: &str) -> u64 {
    let st = status(running, Side::A);
    st.path.icmp_dropped.get(reason).copied().unwrap_or(0)
}

/// The one peer's path MTU in Gateway A's status. The ICMP thread publishes it on its first
/// tick after start, so wait for it (at most 3 s) rather than race that tick.
fn peer_mtu(running: &Running) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(3);
    loop {
        let st = status(running, Side::A);
        if let Some(m) = st.path.peer_mtu.values().next() {
            return *m;
        }
        assert!(
            Instant::now() < deadline,
            "no peer MTU in status 3 s after start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The route Gateway A's kernel has for Host B (`ip -6 route show HOST_B/128`).
fn route_to_b(running: &Running) -> String {
    let out = running
        .lab
        .gw_a
        .command("ip")
        .expect("ip in A")
        .args(["-6", "route", "show", &format!("{HOST_B}/128")])
        .output()
        .expect("ip route");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Path MTU from ICMPv6: forged Packet Too Big and errors about packets never sent change
/// nothing; a plausible one about a real packet lowers only that peer's path MTU (a locked /128
/// route MTU, the TUN device keeping the link MTU), once: repeating it is refused.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn forged_packet_too_big_and_errors_about_unsent_packets_change_nothing() {
    common::require_root();
    // A long rotation keeps every captured packet's route in the accept window.
    let running = start_on(Topology::Routed, "encrypt", 30.0, |_| {});
    let lab = &running.lab;
    let router = &lab.routers[0];
    let base = status(&running, Side::A).path.base_mtu;
    assert_eq!(peer_mtu(&running), base);
    // The route's owner marker (`proto N`): kept when the MTU is set, so clean-up finds it.
    let proto = |r: &str| {
        r.split_whitespace()
            .skip_while(|w| *w != "proto")
            .nth(1)
            .map(str::to_string)
    };
    let marker = proto(&route_to_b(&running));
    assert!(marker.is_some(), "{}", route_to_b(&running));
    let sink = lab
        .host_b
        .run(|| UdpSocket::bind((HOST_B, 9)))
        .expect("enter B")
        .expect("bind sink");
    std::thread::scope(|s| {
        // Host A sends Host B a 1400-byte datagram every 50 ms (outer packets of 1488 bytes)
        // and a small one in between, for 8 s, and listens for errors from its gateway.
        let sender = s.spawn(|| {
            lab.host_a
                .run(|| {
                    let sock = UdpSocket::bind((HOST_A, 0)).expect("bind");
                    for _ in 0..160 {
                        let _ = sock.send_to(&[0x5a; 1400], (HOST_B, 9));
                        let _ = sock.send_to(b"small", (HOST_B, 9));
                        std::thread::sleep(Duration::from_millis(50));
                    }
                })
                .expect("enter A")
        });
        let listener = s.spawn(|| {
            lab.host_a
                .run(|| errors_from_gateway(Duration::from_secs(7)))
                .expect("enter A")
        });
        let big = router.run(|| capture_outer_from_a(1401)).expect("router");
        assert_eq!(big.len(), 1488);
        // 1. Impossible MTUs: more than the packet (65535 became 65495 before), exactly its
        // length, and below 1280.
        for mtu in [65535, 1488, 1000] {
            router.run(|| send_error(2, 0, mtu, &big)).expect("router");
        }
        // 2. A packet never sent: a real one with its counter changed (truncated quote, so no
        // tag can tell).
        let mut unsent = big.clone();
        unsent[48 + 7] ^= 0x55;
        router
            .run(|| send_error(2, 0, 1400, &unsent))
            .expect("router");
        // 3. A Destination Unreachable with a complete quote of a small packet, then the same
        // again: only the first is about a packet not yet reported.
        let small = router.run(|| capture_outer_from_a(0)).expect("router");
        let small = if small.len() > 1232 {
            router
                .run(|| loop {
                    let p = capture_outer_from_a(0);
                    if p.len() <= 1232 {
                        return p;
                    }
                })
                .expect("router")
        } else {
            small
        };
        for _ in 0..3 {
            router.run(|| send_error(1, 3, 0, &small)).expect("router");
        }
        std::thread::sleep(Duration::from_millis(500));
        assert_eq!(dropped(&running, "icmp_bogus_mtu"), 3);
        assert_eq!(dropped(&running, "icmp_not_sent"), 1 + 2);
        assert_eq!(
            peer_mtu(&running),
            base,
            "nothing forged lowered the path MTU"
        );
        assert!(
            !route_to_b(&running).contains("mtu"),
            "{}",
            route_to_b(&running)
        );

        // 4. A plausible one about the real packet (as a router on the path would send) lowers
        // this peer's path MTU; repeated, it changes nothing more.
        router.run(|| send_error(2, 0, 1400, &big)).expect("router");
        for _ in 0..3 {
            router.run(|| send_error(2, 0, 1400, &big)).expect("router");
        }
        std::thread::sleep(Duration::from_millis(1500));
        assert_eq!(dropped(&running, "icmp_not_sent"), 3 + 3);
        assert_eq!(peer_mtu(&running), 1400 - 40);
        let route = route_to_b(&running);
        assert!(route.contains("mtu lock 1360"), "{route}");
        assert_eq!(proto(&route), marker, "{route}");
        // Replaced, not added; the fail-closed guard of the same prefix (another metric)
        // untouched.
        assert_eq!(
            route.lines().filter(|l| l.contains("dev mt6d0")).count(),
            1,
            "{route}"
        );
        assert_eq!(
            route.lines().filter(|l| l.starts_with("prohibit")).count(),
            1,
            "{route}"
        );
        let st = status(&running, Side::A);
        assert_eq!(
            st.path.tunnel_mtu, base,
            "the TUN device keeps the link MTU"
        );
        assert_eq!(
            st.path.icmp_translated["packet_too_big"], 1,
            "{:?}",
            st.path
        );

        sender.join().expect("sender");
        let errors = listener.join().expect("listener");
        // What Host A got from its gateway: one Destination Unreachable (the first of the three),
        // the translated Packet Too Big (1360), and the gateway's own Packet Too Big for the
        // datagrams sent after the path MTU fell (also 1360, quoting Host A's packet in full).
        let of = |t: u8| errors.iter().filter(|e| e[0] == t).collect::<Vec<_>>();
        assert_eq!(of(1).len(), 1, "{errors:?}");
        assert!(!of(2).is_empty(), "{errors:?}");
        for e in of(2) {
            assert_eq!(u32::from_be_bytes(e[4..8].try_into().expect("4")), 1360);
        }
        assert!(
            of(2).iter().any(|e| e.len() >= 8 + 1232),
            "the gateway's kernel answers with full quotes: {:?}",
            of(2).iter().map(|e| e.len()).collect::<Vec<_>>()
        );
    });
    drop(sink);
}

/// Router Advertisement MTU: any link-local node could once set the tunnel MTU with a Router
/// Advertisement, and it stuck. One from a node that is not a default router (router lifetime
/// 0) sets nothing; a default router's MTU holds for its router lifetime, then lapses.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn router_advertisement_mtu_only_from_a_default_router_and_only_for_its_lifetime() {
    common::require_root();
    let running = start_on(Topology::Routed, "encrypt", 1.0, |_| {});
    let lab = &running.lab;
    let base = status(&running, Side::A).path.base_mtu;
    let send_ra = |lifetime: u16, mtu: u32| {
        lab.routers[0]
            .run(|| {
                let s = mt6d_os::Icmp6Socket::open().expect("socket");
                s.set_filter_pass_only(&[]).expect("filter");
                s.set_hop_limit(255).expect("hop limit");
                let mut nl = mt6d_os::Netlink::open().expect("netlink");
                let i = nl.link_index(ROUTER_IF_A).expect("router if");
                let mac = nl.link_mac(i).expect("mac").expect("Ethernet");
                let mut ra = router_advertisement(mac, mtu);
                ra[6..8].copy_from_slice(&lifetime.to_be_bytes());
                s.send_via(&ra, Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), None, i)
                    .expect("send RA");
            })
            .expect("enter router")
    };
    // Not a default router: counted, ignored.
    for _ in 0..3 {
        send_ra(0, 1300);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let st = status(&running, Side::A);
    assert_eq!(st.path.router.upstream_mtu, 0, "{:?}", st.path.router);
    assert_eq!(st.path.tunnel_mtu, base);
    assert_eq!(st.path.router.dropped["nd_not_default_router"], 3);
    // A default router for 3 s: the MTU drops, then comes back when the lifetime runs out.
    send_ra(3, 1400);
    let deadline = Instant::now() + Duration::from_secs(2);
    while status(&running, Side::A).path.tunnel_mtu != 1400 - 40 {
        assert!(Instant::now() < deadline, "default router's MTU not taken");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status(&running, Side::A).path.router.upstream_mtu, 1400);
    let deadline = Instant::now() + Duration::from_secs(6);
    while status(&running, Side::A).path.tunnel_mtu != base {
        assert!(
            Instant::now() < deadline,
            "the MTU stuck after the router's lifetime: {:?}",
            status(&running, Side::A).path
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(status(&running, Side::A).path.router.upstream_mtu, 0);
    wait_for_path(lab, HOST_B, 3);
}

/// The per-peer path MTU in kernel state: `Netlink::set_route_mtu` puts a locked MTU on a /128
/// route (what makes the kernel answer forwarded packets with Packet Too Big) and takes it off
/// again when the learned MTU ages out, keeping the route.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_route_mtu_is_set_locked_and_removed_in_place() {
    common::require_root();
    let ns = mt6d_os::Netns::create(&mt6d_os::unique_name("m6rt")).expect("netns");
    let show = || {
        let out = ns
            .command("ip")
            .expect("ip")
            .args(["-6", "route", "show", "2001:db8:1::b/128"])
            .output()
            .expect("ip route");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ns.run(|| {
        let mut nl = mt6d_os::Netlink::open().expect("netlink");
        nl.create_veth("m6v0", "m6v1").expect("veth");
        let i = nl.link_index("m6v0").expect("index");
        nl.link_set_up(i).expect("up");
        let dst: Ipv6Addr = "2001:db8:1::b".parse().expect("addr");
        nl.add_route(dst, 128, i).expect("route");
        nl.set_route_mtu(dst, 128, i, Some(1360)).expect("mtu");
        nl.set_route_mtu(dst, 128, i, Some(1360))
            .expect("idempotent");
        i
    })
    .expect("enter netns");
    let with = show();
    assert!(with.contains("mtu lock 1360"), "{with}");
    assert_eq!(with.lines().count(), 1, "replaced in place: {with}");
    ns.run(|| {
        let mut nl = mt6d_os::Netlink::open().expect("netlink");
        let i = nl.link_index("m6v0").expect("index");
        let dst: Ipv6Addr = "2001:db8:1::b".parse().expect("addr");
        nl.set_route_mtu(dst, 128, i, None).expect("no mtu")
    })
    .expect("enter netns");
    let without = show();
    assert!(without.contains("2001:db8:1::b dev m6v0"), "{without}");
    assert!(!without.contains("mtu"), "{without}");
    // A route that is gone is not brought back.
    let gone = ns
        .run(|| {
            let mut nl = mt6d_os::Netlink::open().expect("netlink");
            let i = nl.link_index("m6v0").expect("index");
            let dst: Ipv6Addr = "2001:db8:1::b".parse().expect("addr");
            nl.del_route(dst, 128, i).expect("delete");
            nl.set_route_mtu(dst, 128, i, Some(1360))
        })
        .expect("enter netns");
    assert!(gone.is_err(), "set_route_mtu created a route");
    assert_eq!(show(), "");
    ns.delete();
}

/// Runs in Host A: a traceroute to Host B with ICMPv6 echoes. For each hop limit from 1 to
/// `max`, who answered: the type (Time Exceeded 3, Destination Unreachable 1, Echo Reply 129)
/// and source of the first answer about that echo, or `None` after three tries of a second.
fn trace(max: u8) -> Vec<Option<(u8, Ipv6Addr)>> {
    let sock = mt6d_os::Icmp6Socket::open().expect("ICMPv6 socket");
    sock.set_filter_pass_only(&[1, 3, 129]).expect("filter");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let id = (std::process::id() as u16) ^ 0x6d36;
    let mut hops = Vec::new();
    let mut buf = [0u8; 2048];
    for hop in 1..=max {
        sock.set_hop_limit(hop).expect("hop limit");
        let mut answer = None;
        'tries: for attempt in 0..3u16 {
            let seq = u16::from(hop) * 16 + attempt;
            let mut msg = vec![128, 0, 0, 0];
            msg.extend_from_slice(&id.to_be_bytes());
            msg.extend_from_slice(&seq.to_be_bytes());
            msg.extend_from_slice(b"mt6d trace");
            sock.send_to(&msg, HOST_B, None).expect("send echo");
            let ours = |m: &[u8]| m.get(4..8) == Some(&msg[4..8]);
            let end = Instant::now() + Duration::from_secs(1);
            while Instant::now() < end {
                let Ok(info) = sock.recv_from(&mut buf) else {
                    continue;
                };
                let m = &buf[..info.len];
                let about_it = match m[0] {
                    129 => ours(m),
                    // The quote: our echo's IPv6 header, then the echo itself.
                    _ => m.get(8 + 40) == Some(&128) && m.get(48..).is_some_and(ours),
                };
                if about_it {
                    answer = Some((m[0], info.src));
                    break 'tries;
                }
            }
        }
        hops.push(answer);
    }
    hops
}

/// The review's third finding: a hop limit of 2 from Host A ran out in Gateway B, whose Time
/// Exceeded went into its tunnel and was dropped there (`no_peer`, a log line): a traceroute
/// through mt6d showed `* * *` where the baseline shows Gateway B. Now Gateway B carries its
/// own error back through the tunnel, readdressed from Host B (the only source the tunnel
/// carries, and the one that hides Gateway B), counted for the peer; Gateway A answers hop 1
/// from its own internal address. Every hop the baseline shows answers.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_traceroute_through_mt6d_answers_at_every_hop_the_baseline_does() {
    common::require_root();
    let mut baseline = Vec::new();
    let running = start_on(Topology::Switched, "encrypt", 2.0, |lab| {
        lab.baseline_up().expect("baseline up");
        wait_for_path(lab, HOST_B, 1);
        baseline = lab.host_a.run(|| trace(3)).expect("enter A");
        lab.baseline_down().expect("baseline down");
    });
    assert!(
        baseline.iter().all(Option::is_some),
        "the baseline answers at every hop: {baseline:?}"
    );
    assert_eq!(baseline[2], Some((129, HOST_B)), "{baseline:?}");
    let lab = &running.lab;
    let hops = lab.host_a.run(|| trace(3)).expect("enter A");
    assert_eq!(
        hops,
        vec![Some((3, GATEWAY_A)), Some((3, HOST_B)), Some((129, HOST_B))],
        "baseline {baseline:?}"
    );
    let b = status(&running, Side::B);
    assert!(
        b.peers[0].counters.own_errors >= 1,
        "{:?}",
        b.peers[0].counters
    );
}

/// The review's second finding: the Packet Too Big, Time Exceeded and neighbour advertisement
/// for Host B that Gateway A's kernel sends to Host A came from one of the gateway's hashed
/// addresses, against the rule that a protected host never sees a hashed address: the kernel's
/// source address selection (RFC 6724) takes candidates from every interface, and a hashed
/// address on the external one beats the internal interface's own when that has no global
/// address (scope, rule 2). Host A captures what it receives while it draws each of them, with
/// the internal interface as the lab builds it and with only its link-local address; every
/// message must come from the gateway's internal address, a link-local address or Host B.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn the_gateways_own_messages_reach_its_host_from_no_hashed_address() {
    common::require_root();
    for link_local_only in [false, true] {
        own_messages_from_no_hashed_address(link_local_only);
    }
}

fn own_messages_from_no_hashed_address(link_local_only: bool) {
    let lab = Lab::build_topology(Topology::Switched, "m6").expect("lab builds");
    if link_local_only {
        ip_in(
            &lab.gw_a,
            &[
                "-6",
                "addr",
                "del",
                &format!("{GATEWAY_A}/64"),
                "dev",
                "int0",
            ],
        );
    }
    // Without the gateway's Router Advertisements Host A keeps its link MTU of 1500, so a
    // full-size packet draws the gateway's Packet Too Big.
    let running = start_gateways_with(lab, "encrypt", 1.0, (true, None), |text| {
        text.replace("[gateway]\n", "[gateway]\nrouter_advertisements = false\n")
    });
    let lab = &running.lab;
    let seen = std::sync::Mutex::new(Vec::<(u8, Ipv6Addr)>::new());
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let capture = s.spawn(|| {
            lab.host_a
                .run(|| {
                    let cap = PacketCapture::open(HOST_IF, 2048, Duration::from_millis(50))
                        .expect("capture");
                    let mut buf = vec![0u8; 2048];
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        if let Some(f) = cap.recv(&mut buf).expect("capture") {
                            let frame = &buf[..f.captured];
                            // IPv6, next header ICMPv6, to us (not what Host A sends).
                            if frame.len() > 54
                                && frame[12..14] == [0x86, 0xdd]
                                && frame[20] == 58
                                && frame[22..38] != HOST_A.octets()
                            {
                                let src = <[u8; 16]>::try_from(&frame[22..38]).expect("16");
                                seen.lock().expect("seen").push((frame[54], src.into()));
                            }
                        }
                    }
                })
                .expect("enter A")
        });
        std::thread::sleep(Duration::from_millis(200));
        // Several epochs, so that several hashed addresses have been bound.
        for _ in 0..4 {
            // A neighbour advertisement for Host B: forget it, then reach it again.
            ip_in(&lab.host_a, &["-6", "neigh", "flush", "dev", HOST_IF]);
            wait_for_path(lab, HOST_B, 1);
            // A Time Exceeded: hop limit 1.
            let hops = lab.host_a.run(|| trace(1)).expect("enter A");
            assert_eq!(hops.len(), 1);
            // A Packet Too Big: a 1500-byte packet does not fit the tunnel.
            lab.host_a
                .run(|| {
                    let sock = UdpSocket::bind((HOST_A, 0)).expect("bind");
                    let _ = sock.send_to(&[0x5a; 1452], (HOST_B, 9));
                })
                .expect("enter A");
            std::thread::sleep(Duration::from_millis(600));
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        capture.join().expect("capture");
    });
    let seen = seen.into_inner().expect("seen");
    eprintln!("link-local only {link_local_only}: {seen:?}");
    for t in [2, 3, 136] {
        assert!(
            seen.iter().any(|(u, _)| *u == t),
            "link-local only {link_local_only}: no type {t}: {seen:?}"
        );
    }
    let hashed: Vec<_> = seen
        .iter()
        .filter(|(_, a)| *a != GATEWAY_A && *a != HOST_B && a.segments()[0] & 0xffc0 != 0xfe80)
        .collect();
    assert!(
        hashed.is_empty(),
        "link-local only {link_local_only}: Host A received messages from other addresses \
         (hashed ones): {hashed:?} of {seen:?}"
    );
}
