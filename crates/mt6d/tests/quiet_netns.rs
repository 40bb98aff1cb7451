//! Nothing the gateways' kernels say on the public link ties epochs together (docs/PROTOCOL.md
//! §5.1 and §5.4): captured on both gateways' external interfaces across more than ten
//! rotations, with pings through the tunnel and late packets for hashed addresses just removed.
//! Needs root; skipped otherwise.

mod common;

use std::collections::{BTreeSet, HashMap};
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{start_gateways_with, status, Running};
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{Lab, Side, Topology, EXTERNAL_IF, HOST_B, ROUTER_IF_A};
use mt6d_os::capture::PacketCapture;
use mt6d_os::nftables::NftTable;
use mt6d_os::{sysctl, AddrInfo, Netlink, Netns};

const ROTATIONS: u64 = 12;
/// The announcement lead of docs/PROTOCOL.md §5.1, plus the main loop's tick, the ping
/// train's 100 ms spacing and scheduling slack on a loaded 2-core machine.
const EARLIEST_BEFORE_USE: Duration = Duration::from_millis(250 + 20 + 100 + 230);

/// The lab with both gateways started with `randomize_link = true`.
fn start_quiet(lab: Lab) -> Running {
    start_gateways_with(lab, "encrypt", 1.0, (true, None), |text| {
        text.replace("[gateway]\n", "[gateway]\nrandomize_link = true\n")
    })
}

/// The link identity and settings of a gateway's external interface that the daemon changes.
#[derive(Debug, Clone, PartialEq, Eq)]
struct LinkState {
    mac: [u8; 6],
    link_locals: BTreeSet<Ipv6Addr>,
    accept_redirects: String,
    table: bool,
}

fn link_state(ns: &Netns) -> LinkState {
    ns.run(|| {
        let mut nl = Netlink::open().expect("netlink");
        let i = nl.link_index(EXTERNAL_IF).expect("ext0");
        let link_locals = nl
            .list_addresses(i)
            .expect("addresses")
            .iter()
            .map(|a: &AddrInfo| a.addr)
            .filter(|a| a.segments()[0] == 0xfe80)
            .collect();
        LinkState {
            mac: nl.link_mac(i).expect("mac").expect("ethernet"),
            link_locals,
            accept_redirects: sysctl::get_ipv6_conf(EXTERNAL_IF, "accept_redirects")
                .expect("sysctl"),
            table: NftTable::new("mt6d_mt6d0")
                .expect("name")
                .exists()
                .expect("nft runs"),
        }
    })
    .expect("enter namespace")
}

/// Every frame on one interface, with the time it was seen.
struct Capture {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<Vec<(Instant, Vec<u8>)>>,
}

impl Capture {
    fn start(ns: &Netns, iface: &'static str) -> Capture {
        let stop = Arc::new(AtomicBool::new(false));
        let name = ns.name().to_string();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                Netns::open(&name)
                    .and_then(|n| n.enter_current_thread())
                    .expect("enter namespace");
                let cap =
                    PacketCapture::open(iface, 256, Duration::from_millis(50)).expect("capture");
                ready_tx.send(()).expect("ready");
                let mut frames = Vec::new();
                let mut buf = [0u8; 256];
                while !stop.load(Ordering::Relaxed) {
                    if let Ok(Some(f)) = cap.recv(&mut buf) {
                        frames.push((Instant::now(), buf[..f.captured].to_vec()));
                    }
                }
                frames
            }
        });
        ready_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("capture starts");
        Capture { stop, thread }
    }

    fn finish(self) -> Vec<(Instant, Vec<u8>)> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("capture thread")
    }
}

/// An IPv6 packet in an Ethernet frame, hop-by-hop options (MLD's router alert) skipped.
struct Packet<'a> {
    src_mac: [u8; 6],
    src: Ipv6Addr,
    dst: Ipv6Addr,
    next: u8,
    payload: &'a [u8],
}

fn parse(frame: &[u8]) -> Option<Packet<'_>> {
    if frame.get(12..14)? != [0x86, 0xdd] {
        return None;
    }
    let ip = frame.get(14..)?;
    let a16 = |b: &[u8]| Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap_or([0; 16]));
    let (mut next, mut at) = (*ip.get(6)?, 40);
    if next == 0 {
        next = *ip.get(40)?;
        at += (usize::from(*ip.get(41)?) + 1) * 8;
    }
    Some(Packet {
        src_mac: frame.get(6..12)?.try_into().ok()?,
        src: a16(ip.get(8..24)?),
        dst: a16(ip.get(24..40)?),
        next,
        payload: ip.get(at..)?,
    })
}

/// A hashed address and port.
type Endpoint = (Ipv6Addr, u16);

fn route_addr(s: &str) -> Endpoint {
    let sa: std::net::SocketAddrV6 = s.parse().expect("[addr]:port");
    (*sa.ip(), sa.port())
}

/// What the status polls learned: every hashed address of both gateways with its epoch, and
/// Gateway A's routes by epoch.
#[derive(Default)]
struct Epochs {
    of: HashMap<Ipv6Addr, u64>,
    a_routes: HashMap<u64, (Endpoint, Endpoint)>,
    a_epoch: u64,
}

fn internet_checksum(parts: &[&[u8]]) -> u16 {
    let mut sum = 0u32;
    for part in parts {
        for c in part.chunks(2) {
            sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
        }
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// An Ethernet frame carrying a UDP datagram `src` -> `dst` with a valid checksum.
fn udp_frame(
    (dst_mac, src_mac): ([u8; 6], [u8; 6]),
    (src, sport): (Ipv6Addr, u16),
    (dst, dport): (Ipv6Addr, u16),
    hop_limit: u8,
) -> Vec<u8> {
    let payload = [0x5au8; 64];
    let len = (8 + payload.len()) as u16;
    let mut udp = Vec::new();
    udp.extend_from_slice(&sport.to_be_bytes());
    udp.extend_from_slice(&dport.to_be_bytes());
    udp.extend_from_slice(&len.to_be_bytes());
    udp.extend_from_slice(&[0, 0]);
    udp.extend_from_slice(&payload);
    let pseudo = [
        &src.octets()[..],
        &dst.octets()[..],
        &u32::from(len).to_be_bytes()[..],
        &[0, 0, 0, 17][..],
    ]
    .concat();
    let sum = internet_checksum(&[&pseudo, &udp]);
    udp[6..8].copy_from_slice(&sum.to_be_bytes());
    let mut f = Vec::new();
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
    f.extend_from_slice(&len.to_be_bytes());
    f.extend_from_slice(&[17, hop_limit]);
    f.extend_from_slice(&src.octets());
    f.extend_from_slice(&dst.octets());
    f.extend_from_slice(&udp);
    f
}

fn mac_of(ns: &Netns, iface: &str) -> [u8; 6] {
    ns.run(|| {
        let mut nl = Netlink::open().expect("netlink");
        let i = nl.link_index(iface).expect("interface");
        nl.link_mac(i).expect("mac").expect("ethernet")
    })
    .expect("enter namespace")
}

/// Checks one topology; see the test below.
fn quiet(topology: Topology) {
    let lab = Lab::build_topology(topology, "m6q").expect("lab builds");
    let before = [link_state(&lab.gw_a), link_state(&lab.gw_b)];
    assert!(!before[0].table && !before[1].table);
    let mut running = start_quiet(lab);
    let lab = &running.lab;
    let during = [link_state(&lab.gw_a), link_state(&lab.gw_b)];
    for (b, d) in before.iter().zip(&during) {
        assert_ne!(b.mac, d.mac, "{topology}: MAC not randomized");
        assert_eq!(d.mac[0] & 3, 2, "{topology}: a local unicast MAC");
        assert!(
            b.link_locals.is_disjoint(&d.link_locals) && d.link_locals.len() == 1,
            "{topology}: link-local {:?} -> {:?}",
            b.link_locals,
            d.link_locals
        );
        assert_eq!(d.accept_redirects, "0");
        assert!(d.table, "{topology}: nftables table missing while running");
    }
    // Late packets come from the neighbour that delivers to Gateway A: the peer on one segment,
    // the router otherwise; forged with the sender's MAC, so no kernel of the lab adds its own
    // neighbour discovery for them.
    let (sender_ns, sender_if) = match topology {
        Topology::Switched => (&lab.gw_b, EXTERNAL_IF),
        _ => (&lab.routers[0], ROUTER_IF_A),
    };
    let macs = (mac_of(&lab.gw_a, EXTERNAL_IF), mac_of(sender_ns, sender_if));
    let hop_limit = if topology == Topology::Switched {
        64
    } else {
        63
    };
    let own_macs = [
        [before[0].mac, during[0].mac],
        [before[1].mac, during[1].mac],
    ];

    let captures = [
        Capture::start(&lab.gw_a, EXTERNAL_IF),
        Capture::start(&lab.gw_b, EXTERNAL_IF),
    ];
    let started = Instant::now();
    let mut epochs = Epochs::default();
    let mut late_sent = 0u64;
    let pings = std::thread::scope(|s| {
        let pinger = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        ROTATIONS * 10,
                        Pace::Train {
                            interval: Duration::from_millis(100),
                        },
                        Duration::from_secs(1),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        let sender = sender_ns
            .run(|| PacketCapture::open(sender_if, 256, Duration::from_millis(10)))
            .expect("enter sender")
            .expect("packet socket");
        let mut late_done = BTreeSet::new();
        while !pinger.is_finished() {
            for (side, st) in [
                (Side::A, status(&running, Side::A)),
                (Side::B, status(&running, Side::B)),
            ] {
                for r in &st.peers[0].accept {
                    let (l, r2) = (route_addr(&r.local), route_addr(&r.remote));
                    epochs.of.insert(l.0, r.epoch);
                    epochs.of.insert(r2.0, r.epoch);
                    if side == Side::A {
                        epochs.a_routes.insert(r.epoch, (l, r2));
                    }
                }
                if side == Side::A {
                    epochs.a_epoch = st.peers[0].epoch;
                }
            }
            // Once per epoch after the third: late packets for Gateway A's address of e-2 (just
            // removed; one with hop limit 1, which a forwarding kernel would answer with Time
            // Exceeded), and one for its bound address of e-1 on a port nobody listens on.
            let e = epochs.a_epoch;
            if started.elapsed() > Duration::from_secs(3) && late_done.insert(e) {
                if let (Some((old_local, old_remote)), Some((bound, peer))) =
                    (epochs.a_routes.get(&(e - 2)), epochs.a_routes.get(&(e - 1)))
                {
                    for (from, to, hl) in [
                        (*old_remote, *old_local, hop_limit),
                        (*old_remote, *old_local, 1),
                        (*peer, (bound.0, 9), hop_limit),
                    ] {
                        sender
                            .send(&udp_frame(macs, from, to, hl))
                            .expect("send late packet");
                        late_sent += 1;
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        pinger.join().expect("pinger")
    });
    // Shutdown is captured too: removing the last addresses makes the kernel leave their
    // solicited-node groups.
    for d in &mut running.daemons {
        d.stop(Duration::from_secs(10)).expect("daemon stops");
    }
    std::thread::sleep(Duration::from_millis(300));
    let frames: Vec<Vec<(Instant, Vec<u8>)>> = captures.into_iter().map(Capture::finish).collect();
    let after = [link_state(&running.lab.gw_a), link_state(&running.lab.gw_b)];

    eprintln!(
        "{topology}: {} frames on A, {} on B; {} hashed addresses over {} epochs; pings {}/{}; {late_sent} late packets",
        frames[0].len(),
        frames[1].len(),
        epochs.of.len(),
        epochs.a_routes.len(),
        pings.received,
        pings.sent
    );
    assert!(
        epochs.a_routes.len() as u64 >= ROTATIONS,
        "{topology}: too few epochs seen"
    );
    assert_eq!(
        pings.lost(),
        0,
        "{topology}: pings lost at {:?}",
        pings.lost_at
    );
    assert!(
        late_sent >= 3 * (ROTATIONS - 5),
        "{topology}: late packets not sent"
    );

    // 1. Nothing the gateways' kernels generate about hashed addresses, and no MLD report.
    let mut late_seen = 0;
    let mut chatter: BTreeSet<(&str, u8, Ipv6Addr, Ipv6Addr)> = BTreeSet::new();
    let mut counts: HashMap<u8, u64> = HashMap::new();
    for (i, side) in frames.iter().enumerate() {
        for (_, f) in side {
            let Some(p) = parse(f) else { continue };
            if p.next == 17 && p.src_mac == macs.1 && i == 0 && p.payload.get(8) == Some(&0x5a) {
                late_seen += 1;
            }
            if !own_macs[i].contains(&p.src_mac) || p.next != 58 {
                continue;
            }
            let ty = p.payload.first().copied().unwrap_or(0);
            // Errors 1-4, Redirect 137; MLD reports 131, 143 and done 132.
            if matches!(ty, 1..=4 | 137 | 131 | 132 | 143) {
                *counts.entry(ty).or_default() += 1;
                chatter.insert((["A", "B"][i], ty, p.src, p.dst));
            }
        }
    }
    assert!(
        counts.is_empty(),
        "{topology}: the gateways sent ICMPv6 (type: count) {counts:?}: {:?}",
        chatter.iter().take(6).collect::<Vec<_>>()
    );
    assert!(
        late_seen >= late_sent,
        "{topology}: only {late_seen} of {late_sent} late packets reached Gateway A"
    );

    // 2. No neighbour discovery message names hashed addresses of two epochs, and none names
    //    one long before it carries data.
    let mut first_seen: HashMap<Ipv6Addr, Instant> = HashMap::new();
    let mut first_data: HashMap<Ipv6Addr, Instant> = HashMap::new();
    let mut nd_hashed = 0;
    for side in &frames {
        for (t, f) in side {
            let Some(p) = parse(f) else { continue };
            let mut named = vec![p.src, p.dst];
            let nd = p.next == 58 && matches!(p.payload.first(), Some(135 | 136));
            if nd {
                if let Some(target) = p.payload.get(8..24) {
                    named.push(Ipv6Addr::from(
                        <[u8; 16]>::try_from(target).unwrap_or([0; 16]),
                    ));
                }
                let seen: BTreeSet<u64> = named
                    .iter()
                    .filter_map(|a| epochs.of.get(a))
                    .copied()
                    .collect();
                assert!(
                    seen.len() <= 1,
                    "{topology}: neighbour discovery {} -> {} names epochs {seen:?}",
                    p.src,
                    p.dst
                );
                nd_hashed += usize::from(!seen.is_empty());
                // Every address of the peer is known before its epoch (rotation.rs
                // `resolve_from_peer`), so no multicast solicitation resolves one: a switch that drops
                // multicast for unreported groups would drop it.
                let multicast_resolution = p.payload.first() == Some(&135)
                    && p.dst.segments()[0] == 0xff02
                    && epochs.of.contains_key(&p.src);
                assert!(
                    !multicast_resolution,
                    "{topology}: multicast solicitation from {} to {}",
                    p.src, p.dst
                );
                // Duplicate address probes (from ::) are the collision watch's: they go out when
                // an address is bound (docs/PROTOCOL.md §5.2), not timed here.
                if p.src.is_unspecified() {
                    continue;
                }
            }
            for a in named.iter().filter(|a| epochs.of.contains_key(a)) {
                first_seen.entry(*a).or_insert(*t);
                if p.next == 17 && p.src_mac != macs.1 {
                    first_data.entry(*a).or_insert(*t);
                }
            }
        }
    }
    assert!(
        nd_hashed as u64 >= ROTATIONS,
        "{topology}: only {nd_hashed} neighbour discovery messages about hashed addresses: no priming?"
    );
    let mut checked = 0;
    for (a, data) in &first_data {
        let seen = first_seen[a];
        // Addresses already in use when the capture started tell nothing.
        if seen.duration_since(started) < Duration::from_secs(2) {
            continue;
        }
        checked += 1;
        let early = data.saturating_duration_since(seen);
        assert!(
            early <= EARLIEST_BEFORE_USE,
            "{topology}: {a} named on the wire {early:?} before its first data packet"
        );
    }
    assert!(
        checked as u64 >= ROTATIONS,
        "{topology}: only {checked} addresses timed"
    );

    // 3. Everything restored.
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(b, a, "{topology}: external interface not restored");
    }
}

/// Both gateways run with `randomize_link = true`, one segment and across a router, 12
/// rotations of 1 s, Host A pinging Host B at 10/s and, once per epoch, late packets for the
/// hashed address Gateway A removed at the last boundary (one with hop limit 1) and for a bound
/// one on a closed port. On both external interfaces: no ICMPv6 error or Redirect from a
/// gateway, no MLD message, no neighbour discovery message naming two epochs or a hashed
/// address more than the announcement lead before it carries data; no ping lost. The MAC and
/// link-local differ while running; MAC, link-local, `accept_redirects` and the absence of the
/// nftables table are back after stop.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn public_link_hears_nothing_that_links_epochs_switched_and_routed() {
    common::require_root();
    if std::process::Command::new("nft")
        .arg("--version")
        .output()
        .is_err()
    {
        panic!("the nft program is missing: run scripts/install-deps.sh");
    }
    for topology in [Topology::Switched, Topology::Routed] {
        quiet(topology);
    }
}

/// Router Solicitations that Host A's own stack sends on its external interface (from a raw
/// socket here, as the kernel's own would, with the host's MAC) in host mode, while the daemon
/// runs and after it stopped.
fn host_solicitations(lab: &Lab) -> Vec<Vec<u8>> {
    let capture = Capture::start(&lab.host_a, EXTERNAL_IF);
    lab.host_a
        .run(|| {
            let socket = mt6d_os::Icmp6Socket::open().expect("raw ICMPv6 socket");
            socket.set_hop_limit(255).expect("hop limit");
            let mut nl = Netlink::open().expect("netlink");
            let ext = nl.link_index(EXTERNAL_IF).expect("ext0");
            let all_routers = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);
            for _ in 0..3 {
                // Refused (EPERM) when a firewall drops it: that is the point.
                let _ = socket.send_via(
                    &mt6d_proto::wire::router_solicitation(),
                    all_routers,
                    None,
                    ext,
                );
            }
        })
        .expect("enter host A");
    std::thread::sleep(Duration::from_millis(300));
    capture
        .finish()
        .into_iter()
        .map(|(_, f)| f)
        .filter(|f| parse(f).is_some_and(|p| p.next == 58 && p.payload.first() == Some(&133)))
        .collect()
}

/// Host mode: no Router Solicitation leaves the host's external interface while mt6d runs
/// (the host's kernel would keep sending them, from its MAC, with a backoff that never stops);
/// after stop the host solicits as before.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn host_mode_sends_no_router_solicitation() {
    common::require_root();
    let lab = Lab::build_host_mode(Topology::Switched, "m6q").expect("host-mode lab");
    let mut running = common::start_gateways(lab, "encrypt", 1.0, (true, None));
    let while_running = host_solicitations(&running.lab);
    assert!(
        while_running.is_empty(),
        "{} Router Solicitation(s) left Host A while mt6d ran",
        while_running.len()
    );
    for d in &mut running.daemons {
        d.stop(Duration::from_secs(10)).expect("daemon stops");
    }
    // The control: ours leave once mt6d stopped (and the kernel's own, on its backoff, may too).
    let after = host_solicitations(&running.lab);
    assert!(
        after.len() >= 3,
        "only {} solicitations after stop",
        after.len()
    );
}
