//! End-to-end tests of the gateway in network namespaces (root; CI runs as root): a transparent
//! wire. A router's ICMPv6 errors reach the sender with true addresses only (in gateway and in
//! host mode), TCP discovers a narrower path's MTU, and router advertisements tell the hosts
//! the tunnel MTU without leaking anything.

use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{
    in_ns, Lab, Side, Topology, EXTERNAL_IF, GATEWAY_A, HOST_A, HOST_B, INTERNAL_IF, ROUTER_IF_A,
    ROUTER_IF_B, TUNNEL_MTU,
};
use mt6d_lab::transfer;
use mt6d_os::capture::PacketCapture;
use mt6d_os::Netns;

mod common;
use common::*;

/// Whether `bytes` contain the first 64 bits of a hashed prefix of the routed lab
/// (2001:db8:a::/64, 2001:db8:b::/64): what the protected host must never see.
fn mentions_hashed_prefix(bytes: &[u8]) -> bool {
    let prefixes = [
        [0x20, 0x01, 0x0d, 0xb8, 0, 0x0a, 0, 0],
        [0x20, 0x01, 0x0d, 0xb8, 0, 0x0b, 0, 0],
    ];
    bytes
        .windows(8)
        .any(|w| prefixes.iter().any(|p| w == p.as_slice()))
}

/// An ICMPv6 error as Host A received it.
#[derive(Debug, Clone)]
struct HostError {
    src: Ipv6Addr,
    dst: Option<Ipv6Addr>,
    msg: Vec<u8>,
}

/// Runs in Host A's namespace: collects ICMPv6 errors (types 1-4) for `duration`.
fn collect_errors(duration: Duration) -> Vec<HostError> {
    let sock = mt6d_os::Icmp6Socket::open().expect("ICMPv6 socket");
    sock.set_filter_pass_only(&[1, 2, 3, 4]).expect("filter");
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 2048];
    let end = Instant::now() + duration;
    while Instant::now() < end {
        if let Ok(info) = sock.recv_from(&mut buf) {
            got.push(HostError {
                src: info.src,
                dst: info.dst,
                msg: buf[..info.len].to_vec(),
            });
        }
    }
    got
}

/// Runs in the router: captures one tunnel packet Gateway A sent (IPv6 from its hashed /64,
/// UDP) of at least `min_len` bytes on the router's link to A, and returns it from the IPv6
/// header on.
fn capture_outer_from_a(min_len: usize) -> Vec<u8> {
    let cap = PacketCapture::open(ROUTER_IF_A, 4096, Duration::from_millis(100)).expect("capture");
    let mut buf = vec![0u8; 4096];
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(f) = cap.recv(&mut buf).expect("capture") {
            let frame = &buf[..f.captured];
            if f.captured == f.wire_len
                && f.captured >= 14 + min_len
                && is_udp6(frame)
                && frame[22..30] == [0x20, 0x01, 0x0d, 0xb8, 0, 0x0a, 0, 0]
                && frame[22..38] != "2001:db8:a::2".parse::<Ipv6Addr>().expect("a").octets()
            {
                return frame[14..].to_vec();
            }
        }
    }
    panic!("no tunnel packet from gateway A seen on the router");
}

/// In the routed lab: Host A pings Host B `pings` times (every 100 ms), and sends it 1400-byte
/// UDP datagrams as often, while it collects ICMPv6 errors for `listen_secs`; for each
/// `(type, code, data)` of `crafted` the router captures a fresh one of Gateway A's tunnel
/// packets and sends that error about it (a router drops a packet once, so it reports it once;
/// a Packet Too Big is about a packet larger than its MTU), then routes Gateway B's hashed /64
/// nowhere and lets three more pings draw its kernel's own Destination Unreachable. Returns the
/// first captured outer packet and what Host A received.
fn router_errors_during_pings(
    lab: &Lab,
    listen_secs: u64,
    pings: u64,
    crafted: &[(u8, u8, u32)],
) -> (Vec<u8>, Vec<HostError>) {
    let router = &lab.routers[0];
    let router_addr: Ipv6Addr = "2001:db8:a::1".parse().expect("addr");
    // Host B takes the datagrams in (a closed port would answer with errors of its own).
    let sink = lab
        .host_b
        .run(|| std::net::UdpSocket::bind((HOST_B, 9)))
        .expect("enter B")
        .expect("bind sink");
    std::thread::scope(|s| {
        s.spawn(|| {
            lab.host_a
                .run(|| {
                    let sock = std::net::UdpSocket::bind((HOST_A, 0)).expect("bind");
                    for _ in 0..pings {
                        let _ = sock.send_to(&[0x5a; 1400], (HOST_B, 9));
                        std::thread::sleep(Duration::from_millis(100));
                    }
                })
                .expect("enter A")
        });
        let listener = s.spawn(|| {
            lab.host_a
                .run(|| collect_errors(Duration::from_secs(listen_secs)))
                .expect("enter A")
        });
        let pinger = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        pings,
                        Pace::Train {
                            interval: Duration::from_millis(100),
                        },
                        Duration::from_millis(300),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        let outer = router
            .run(|| {
                let sock = mt6d_os::Icmp6Socket::open().expect("socket");
                sock.set_filter_pass_only(&[]).expect("filter");
                let mut first = None;
                for &(t, code, data) in crafted {
                    let min_len = if t == 2 { data as usize + 1 } else { 0 };
                    let outer = capture_outer_from_a(min_len);
                    let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&outer[8..24]).expect("16"));
                    let mut msg = vec![t, code, 0, 0];
                    msg.extend_from_slice(&data.to_be_bytes());
                    msg.extend_from_slice(&outer[..outer.len().min(1232)]);
                    sock.send_to(&msg, dst, Some(router_addr))
                        .expect("send error");
                    first.get_or_insert(outer);
                    std::thread::sleep(Duration::from_millis(200));
                }
                first.expect("at least one crafted error")
            })
            .expect("enter router");
        pinger.join().expect("pinger");
        // The router's own error: no route to Gateway B's hashed prefix any more.
        let unreachable = [
            "-6",
            "route",
            "add",
            "unreachable",
            "2001:db8:b::/64",
            "metric",
            "1",
        ];
        mt6d_lab::topology::ip(router, &unreachable).expect("unreachable route");
        let _ = lab.host_a.run(|| {
            ping(
                HOST_B,
                3,
                Pace::Train {
                    interval: Duration::from_millis(200),
                },
                Duration::from_millis(300),
            )
        });
        let errors = listener.join().expect("listener");
        drop(sink);
        (outer, errors)
    })
}

/// Each of the four ICMPv6 error types, sent by the router about one of Gateway A's tunnel
/// packets, reaches Host A translated: from Gateway A's own internal address, to Host A, quoting
/// Host A's packet with the true addresses, and nowhere a hashed address. A Destination
/// Unreachable that the router's kernel produces itself (a route to nowhere) arrives the same way.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn icmp_errors_from_a_router_reach_the_sender_with_true_addresses_only() {
    common::require_root();
    // A long rotation keeps the captured packet's route in the accept window.
    let running = start_on(Topology::Routed, "encrypt", 30.0, |_| {});
    let lab = &running.lab;
    // Type, code, data (MTU or pointer): Parameter Problem points at the inner Next Header
    // (outer IPv6 40 + UDP 8 + counter 8 + 6).
    let crafted: [(u8, u8, u32); 4] = [(1, 3, 0), (2, 0, 1400), (3, 0, 0), (4, 0, 62)];
    let (outer, errors) = router_errors_during_pings(lab, 12, 30, &crafted);
    assert!(outer.len() > 48);
    for e in &errors {
        assert_eq!(e.src, GATEWAY_A, "error not from the gateway: {e:?}");
        assert_eq!(e.dst, Some(HOST_A), "{e:?}");
        assert!(
            !mentions_hashed_prefix(&e.msg),
            "hashed address leaked: {e:?}"
        );
        let quote = &e.msg[8..];
        assert!(quote.len() >= 40, "{e:?}");
        assert_eq!(&quote[8..24], &HOST_A.octets(), "quoted source: {e:?}");
        assert_eq!(
            &quote[24..40],
            &HOST_B.octets(),
            "quoted destination: {e:?}"
        );
    }
    let of_type = |t: u8| errors.iter().filter(|e| e.msg[0] == t).count();
    // Crafted: one each; the router's own Destination Unreachable (code 0) on top.
    for t in [1u8, 2, 3, 4] {
        assert!(of_type(t) >= 1, "type {t} never reached Host A: {errors:?}");
    }
    assert!(
        errors.iter().any(|e| e.msg[0] == 1 && e.msg[1] == 0),
        "the router's own Destination Unreachable did not arrive: {errors:?}"
    );
    let ptb = errors
        .iter()
        .find(|e| e.msg[0] == 2)
        .expect("packet too big");
    let mtu = u32::from_be_bytes(ptb.msg[4..8].try_into().expect("4"));
    assert_eq!(mtu, 1400 - 40, "MTU reduced by the encrypt overhead");
    let pp = errors
        .iter()
        .find(|e| e.msg[0] == 4)
        .expect("parameter problem");
    let pointer = u32::from_be_bytes(pp.msg[4..8].try_into().expect("4"));
    assert_eq!(pointer, 6, "pointer mapped onto the inner header");
    let st = status(&running, Side::A);
    assert!(
        st.path.icmp_translated.values().sum::<u64>() >= 5,
        "{:?}",
        st.path
    );
    // The peer's path MTU follows; the TUN device keeps the link MTU (other peers' paths).
    assert_eq!(
        st.path.peer_mtu.values().copied().collect::<Vec<_>>(),
        vec![1400 - 40],
        "path MTU follows the path: {:?}",
        st.path
    );
    assert_eq!(st.path.tunnel_mtu, st.path.base_mtu, "{:?}", st.path);
}

/// The VXLAN hop in the middle is narrower (1450) than the gateways' links (1500), and the
/// hosts keep MTU 1500. The router's Packet Too Big for Gateway A's tunnel packets reaches
/// Host A translated, the tunnel MTU drops to the path MTU minus the overhead, and a TCP
/// transfer completes intact: no black hole.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn tcp_over_a_narrower_tunneled_path_discovers_the_path_mtu() {
    common::require_root();
    let running = start_on(Topology::Tunneled, "encrypt", 2.0, |lab| {
        // Undo "the gateways are told their uplink's MTU": only the path knows it now.
        for (n, i) in [
            (&lab.gw_a, EXTERNAL_IF),
            (&lab.gw_b, EXTERNAL_IF),
            (&lab.routers[0], ROUTER_IF_A),
            (&lab.routers[1], ROUTER_IF_B),
        ] {
            in_ns(n, |nl| {
                let idx = nl.link_index(i)?;
                nl.link_set_mtu(idx, 1500)
            })
            .expect("MTU 1500");
        }
    });
    let before = status(&running, Side::A);
    assert_eq!(before.path.tunnel_mtu, 1500 - 40, "{:?}", before.path);
    let lab = &running.lab;
    let server = tcp_receiver(lab, 5003);
    let tcp = lab
        .host_a
        .run(|| transfer::send_for(HOST_B, 5003, Duration::from_secs(5), 7))
        .expect("enter A")
        .expect("transfer through the narrower path");
    server.join().expect("server").expect("receiver");
    assert!(tcp.sha256_match, "data corrupted");
    assert!(
        tcp.bytes > 10_000_000,
        "only {} bytes: black hole?",
        tcp.bytes
    );
    let st = status(&running, Side::A);
    assert_eq!(
        st.path.peer_mtu.values().copied().collect::<Vec<_>>(),
        vec![TUNNEL_MTU - 40],
        "{:?}",
        st.path
    );
    assert!(
        st.path.icmp_translated["packet_too_big"] >= 1,
        "{:?}",
        st.path
    );
}

/// Host mode delivers ICMPv6 errors from the path to the host's own stack: a Packet Too Big and
/// a Time Exceeded crafted by the router about one of Host A's tunnel packets, and the router's
/// own Destination Unreachable, arrive translated (from and to Host A's true address, quoting
/// Host A's packet to Host B, no hashed address), and the tunnel MTU follows the Packet Too Big.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn host_mode_delivers_path_errors_to_its_own_stack() {
    common::require_root();
    let lab = Lab::build_host_mode(Topology::Routed, "m6").expect("host-mode lab builds");
    // A long rotation keeps the captured packet's route in the accept window.
    let running = start_gateways(lab, "encrypt", 30.0, (true, None));
    let lab = &running.lab;
    let (_, errors) = router_errors_during_pings(lab, 8, 20, &[(2, 0, 1400), (3, 0, 0)]);
    // Host A's namespace also receives the router's original errors about the outer packets
    // (addressed to its hashed address); the translated ones are from its true address.
    let translated: Vec<&HostError> = errors.iter().filter(|e| e.src == HOST_A).collect();
    for e in &translated {
        assert_eq!(e.dst, Some(HOST_A), "{e:?}");
        assert!(
            !mentions_hashed_prefix(&e.msg),
            "hashed address in a translated error: {e:?}"
        );
        let quote = &e.msg[8..];
        assert!(quote.len() >= 40, "{e:?}");
        assert_eq!(&quote[8..24], &HOST_A.octets(), "quoted source: {e:?}");
        assert_eq!(
            &quote[24..40],
            &HOST_B.octets(),
            "quoted destination: {e:?}"
        );
    }
    for t in [1u8, 2, 3] {
        assert!(
            translated.iter().any(|e| e.msg[0] == t),
            "type {t} never reached Host A's stack: {errors:?}"
        );
    }
    let st = status(&running, Side::A);
    assert_eq!(
        st.path
            .icmp_dropped
            .get("icmp_send_failed")
            .copied()
            .unwrap_or(0),
        0,
        "{:?}",
        st.path
    );
    assert_eq!(
        st.path.peer_mtu.values().copied().collect::<Vec<_>>(),
        vec![1400 - 40],
        "path MTU follows the path: {:?}",
        st.path
    );
}

/// The IPv6 MTU Host A uses on its link (what Router Advertisements set).
fn host_a_link_mtu(lab: &Lab) -> u32 {
    lab.host_a
        .run(|| mt6d_os::sysctl::get_ipv6_conf(mt6d_lab::topology::HOST_IF, "mtu"))
        .expect("enter host A")
        .expect("read mtu")
        .trim()
        .parse()
        .expect("mtu is a number")
}

/// Polls `f` every 100 ms for up to `secs` seconds until it returns true.
fn eventually(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

/// RA MTU (000 §3.2.3): Gateway A advertises the tunnel MTU on its internal link, so
/// Host A's link MTU is the external MTU minus the overhead without any Packet Too Big; a Router
/// Solicitation from Host A (with its MAC) is answered with that MTU; an MTU advertised by the
/// external link's router lowers the tunnel MTU and the advertised one. Nothing Gateway A sends
/// to the public link carries Host A's MAC or either true address.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn router_advertisements_tell_hosts_the_tunnel_mtu_and_leak_nothing() {
    use mt6d_proto::wire::{router_advertisement, router_solicitation, RouterMessage};
    common::require_root();
    let running = start_on(Topology::Routed, "encrypt", 1.0, |_| {});
    let lab = &running.lab;
    let host_mac = lab
        .host_a
        .run(|| {
            let mut nl = mt6d_os::Netlink::open()?;
            let i = nl.link_index(mt6d_lab::topology::HOST_IF)?;
            nl.link_mac(i)
        })
        .expect("enter host A")
        .expect("host MAC")
        .expect("Ethernet");
    // Every frame Gateway A puts on the public link, whole, from here on.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let capture = {
        let stop = stop.clone();
        let ns = lab.gw_a.name().to_string();
        std::thread::spawn(move || {
            Netns::open(&ns)
                .and_then(|n| n.enter_current_thread())
                .expect("enter gateway A");
            let cap = PacketCapture::open(EXTERNAL_IF, 2048, Duration::from_millis(100))
                .expect("capture");
            ready_tx.send(()).expect("ready");
            let mut frames = Vec::new();
            let mut buf = vec![0u8; 2048];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Some(f) = cap.recv(&mut buf).expect("capture") {
                    // Outgoing only: Gateway A's MAC as the source.
                    frames.push(buf[..f.captured].to_vec());
                }
            }
            frames
        })
    };
    ready_rx
        .recv_timeout(Duration::from_secs(5))
        .expect("capture ready");

    // 1. The advertisement sent at start-up set Host A's link MTU to the tunnel MTU.
    let st = status(&running, Side::A);
    let base = st.path.base_mtu;
    assert!(st.path.router.enabled);
    assert!(
        eventually(5, || host_a_link_mtu(lab) == base),
        "Host A's link MTU is {} (tunnel MTU {base}); gateway: {:?}",
        host_a_link_mtu(lab),
        status(&running, Side::A).path.router
    );

    // 2. A solicitation from Host A, with its MAC, is answered unicast with the same MTU, from
    // the gateway's link-local address and MAC.
    let (ra_src, ra) = lab
        .host_a
        .run(|| {
            let s = mt6d_os::Icmp6Socket::open().expect("socket");
            s.set_filter_pass_only(&[134]).expect("filter");
            s.set_hop_limit(255).expect("hop limit");
            s.set_read_timeout(Some(Duration::from_millis(200)))
                .expect("timeout");
            let mut nl = mt6d_os::Netlink::open().expect("netlink");
            let i = nl.link_index(mt6d_lab::topology::HOST_IF).expect("host if");
            let mut rs = router_solicitation().to_vec();
            rs.extend_from_slice(&[1, 1]);
            rs.extend_from_slice(&host_mac);
            s.send_via(&rs, Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2), None, i)
                .expect("send RS");
            let mut buf = [0u8; 256];
            let deadline = Instant::now() + Duration::from_secs(3);
            while Instant::now() < deadline {
                if let Ok(info) = s.recv_from(&mut buf) {
                    // The unicast answer, not a periodic multicast.
                    if info.dst.is_some_and(|d| !d.is_multicast()) {
                        assert_eq!(info.hop_limit, Some(255));
                        return (info.src, buf[..info.len].to_vec());
                    }
                }
            }
            panic!("no unicast router advertisement answered the solicitation");
        })
        .expect("enter host A");
    let ra = RouterMessage::new_checked(&ra[..]).expect("valid advertisement");
    assert_eq!(ra.mtu(), Some(base));
    assert_eq!(ra.router_lifetime(), 0, "not a default router");
    assert_eq!(ra_src.segments()[0], 0xfe80, "from a link-local address");
    let gw_mac = lab
        .gw_a
        .run(|| {
            let mut nl = mt6d_os::Netlink::open()?;
            let i = nl.link_index(INTERNAL_IF)?;
            nl.link_mac(i)
        })
        .expect("enter gateway A")
        .expect("gateway MAC");
    assert_eq!(ra.source_lladdr(), gw_mac);
    assert!(status(&running, Side::A).path.router.solicitations_answered >= 1);

    // 3. The router on Gateway A's external link advertises MTU 1400: the tunnel MTU and the MTU
    // Host A is told both drop by 100.
    lab.routers[0]
        .run(|| {
            let s = mt6d_os::Icmp6Socket::open().expect("socket");
            s.set_filter_pass_only(&[]).expect("filter");
            s.set_hop_limit(255).expect("hop limit");
            let mut nl = mt6d_os::Netlink::open().expect("netlink");
            let i = nl.link_index(ROUTER_IF_A).expect("router if");
            let mac = nl.link_mac(i).expect("mac").expect("Ethernet");
            // A default router (lifetime 1800 s): only those set the MTU.
            let mut ra = router_advertisement(mac, 1400);
            ra[6..8].copy_from_slice(&1800u16.to_be_bytes());
            s.send_via(&ra, Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1), None, i)
                .expect("send RA");
        })
        .expect("enter router");
    let lowered = base - 100;
    assert!(
        eventually(5, || host_a_link_mtu(lab) == lowered),
        "Host A's link MTU is {}, expected {lowered}; gateway: {:?}",
        host_a_link_mtu(lab),
        status(&running, Side::A).path
    );
    let st = status(&running, Side::A);
    assert_eq!(st.path.router.upstream_mtu, 1400);
    assert_eq!(st.path.tunnel_mtu, lowered);
    assert_eq!(st.path.router.advertised_mtu, lowered);
    assert_eq!(
        st.path.router.dropped.values().sum::<u64>(),
        0,
        "{:?}",
        st.path.router.dropped
    );
    // Traffic still flows at the lowered MTU.
    wait_for_path(lab, HOST_B, 5);

    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let frames = capture.join().expect("capture thread");
    assert!(
        !frames.is_empty(),
        "Gateway A sent nothing on the public link"
    );
    let needles: [&[u8]; 3] = [&host_mac, &HOST_A.octets(), &HOST_B.octets()];
    for f in &frames {
        for n in needles {
            assert!(
                !f.windows(n.len()).any(|w| w == n),
                "a frame on the public link carries {n:02x?}: {f:02x?}"
            );
        }
    }
}
