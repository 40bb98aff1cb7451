//! The relay role fails closed (docs/CONFIG.md "The relay role", as
//! `failclosed_netns.rs` for the gateway role), end to end on the lab's chain
//! `h1 - eA == r1 == r2 == eB - h2` (`mt6d_lab::relays`), every node a real `mt6d run`.
//!
//! Checked: an edge gateway killed with SIGKILL while its host keeps sending (UDP datagrams that
//! carry both hosts' addresses, and echo requests) puts no frame with either host's true address
//! on its link, in a header or in a payload: its guard route outlives it and the kernel refuses
//! the host's packets (the host's sends fail with EACCES), although the node has a default
//! route out of that link, as an edge gateway with an uplink has. `mt6d down -c FILE` then
//! leaves the node's namespace as it was before the daemon first started (no guard, no AnyIP
//! route, no TUN device, no nftables table), a second `mt6d down` changes nothing, and with the
//! guard gone the same datagrams do leave in clear: the capture would have seen them. A relay
//! killed with SIGKILL puts no true address of the lab (hosts', edge gateways' on their hosts'
//! links, nodes' configured) on either of its links while the host sends, and `mt6d down`
//! removes its AnyIP route and its table. Neither dead node answers its neighbour's frames
//! (no ICMPv6 port unreachable: the table's last rule drops what no socket takes). An edge
//! gateway stopped cleanly (SIGTERM), started again and stopped again puts no true address on
//! its link either: a stop keeps the guard route, the next start adopts it in place.
//!
//! Run: `cargo test --release -p mt6d --test relay_failclosed_netns -- --include-ignored
//! --test-threads=1 --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mt6d_lab::ping::{Pace, PingReport};
use mt6d_lab::relays::{self, RelayLab, RelaySettings, Shape};
use mt6d_os::capture::PacketCapture;
use mt6d_os::Netns;

/// The edge gateways' TUN device and the nftables table named after it (the lab writes no
/// `tun_name`: the default of docs/CONFIG.md).
const TUN: &str = "mt6dr0";
const TABLE: &str = "mt6d_relay_mt6dr0";
/// Whole frames: a leak may sit anywhere in a payload, and the daemons send GSO trains, which
/// a capture sees as one frame of up to 64 KiB.
const SNAPLEN: u32 = 1 << 16;

fn settings() -> RelaySettings {
    common::relay_settings(1.0)
}

/// Runs `cmd ARGS` in `ns`: (success, stdout then stderr).
fn run_in(ns: &Netns, cmd: &str, args: &[&str]) -> (bool, String) {
    let out = ns
        .command(cmd)
        .expect("command")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} {args:?}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// What a node's namespace holds that its daemon could change: routes of every table, links,
/// IPv6 addresses and nftables tables.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    routes: Vec<String>,
    links: Vec<String>,
    addresses: Vec<String>,
    tables: Vec<String>,
}

fn snapshot(ns: &Netns) -> Snapshot {
    let (_, routes) = run_in(ns, "ip", &["-6", "route", "show", "table", "all"]);
    let (_, links) = run_in(ns, "ip", &["-o", "link", "show"]);
    let (_, addresses) = run_in(ns, "ip", &["-6", "-o", "addr", "show"]);
    let (_, tables) = run_in(ns, "nft", &["list", "tables"]);
    Snapshot {
        routes: common::sorted_lines(&routes),
        // "3: l-r1@if2: <...> ...": the name, without the peer's index.
        links: common::sorted_lines(&links)
            .iter()
            .filter_map(|l| l.split(": ").nth(1))
            .map(|n| n.split('@').next().unwrap_or(n).to_string())
            .collect(),
        addresses: common::sorted_lines(&addresses),
        tables: common::sorted_lines(&tables),
    }
}

/// The snapshot once two taken 200 ms apart agree (the kernel adds link-local routes a moment
/// after a link comes up: the "before" picture must not race them), at most 5 s.
fn settled_snapshot(ns: &Netns) -> Snapshot {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = snapshot(ns);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        let now = snapshot(ns);
        if now == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{} never settled: {now:?}",
            ns.name()
        );
        last = now;
    }
}

fn assert_same(before: &Snapshot, after: &Snapshot, when: &str) {
    let diff = |a: &[String], b: &[String]| -> (Vec<String>, Vec<String>) {
        (
            a.iter().filter(|x| !b.contains(x)).cloned().collect(),
            b.iter().filter(|x| !a.contains(x)).cloned().collect(),
        )
    };
    for (what, a, b) in [
        ("routes", &before.routes, &after.routes),
        ("links", &before.links, &after.links),
        ("addresses", &before.addresses, &after.addresses),
        ("nftables tables", &before.tables, &after.tables),
    ] {
        let (gone, new) = diff(a, b);
        assert!(
            gone.is_empty() && new.is_empty(),
            "{when}: {what} differ from before the first start: missing {gone:?}, added {new:?}"
        );
    }
}

/// Builds the chain, lets `prepare` change it, takes node `watched`'s picture before any daemon
/// runs, starts every node and waits until h1 reaches h2.
fn up(prefix: &str, watched: &str, prepare: impl FnOnce(&RelayLab)) -> (RelayLab, Snapshot) {
    let mut lab = RelayLab::build(Shape::Chain, prefix, settings()).expect("chain builds");
    prepare(&lab);
    let i = lab.node_index(watched).expect("node");
    let before = settled_snapshot(&lab.nodes[i].ns);
    lab.start(Duration::from_secs(10))
        .expect("every node starts");
    lab.wait_routes(Duration::from_secs(20))
        .expect("edge gateways route to each other");
    let (h1, h2) = hosts(&lab);
    lab.wait_for_path(h1, h2, Duration::from_secs(10))
        .expect("first path");
    (lab, before)
}

fn hosts(lab: &RelayLab) -> (usize, usize) {
    (
        lab.host_index(1).expect("h1"),
        lab.host_index(2).expect("h2"),
    )
}

/// Node `from`'s end of its link to node `to`.
fn interface_towards(lab: &RelayLab, from: &str, to: &str) -> String {
    let l = &lab.links[lab.link_index(from, to).expect("link")];
    if lab.nodes[l.a].name == from {
        l.if_a.clone()
    } else {
        l.if_b.clone()
    }
}

/// The kernel's link-local address of `iface` in `ns`.
fn link_local(ns: &Netns, iface: &str) -> Ipv6Addr {
    let (ok, out) = run_in(
        ns,
        "ip",
        &["-6", "-o", "addr", "show", "dev", iface, "scope", "link"],
    );
    assert!(ok, "{out}");
    out.split_whitespace()
        .find_map(|w| w.split('/').next()?.parse::<Ipv6Addr>().ok())
        .unwrap_or_else(|| panic!("{iface} in {} has no link-local address: {out}", ns.name()))
}

/// `mt6d down -c FILE` for node `i`, in its namespace, to completion (at most 20 s).
fn down(lab: &RelayLab, i: usize) -> (bool, String) {
    let node = &lab.nodes[i];
    let child = node
        .ns
        .command(&lab.settings.mt6d)
        .expect("command")
        .arg("down")
        .arg("-c")
        .arg(&node.config)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn mt6d down");
    common::output_within_20s(child, &format!("mt6d down -c {}", node.config.display()))
}

/// What a capture saw.
#[derive(Debug, Default)]
struct Seen {
    frames: u64,
    udp: u64,
    /// ICMPv6 messages by (type, code).
    icmp: BTreeMap<(u8, u8), u64>,
    /// Per watched address (by name): frames that carry its 16 bytes anywhere.
    with: BTreeMap<String, u64>,
    /// Per watched address: the first such frame, described.
    first: BTreeMap<String, String>,
}

impl Seen {
    fn carrying(&self, name: &str) -> u64 {
        self.with.get(name).copied().unwrap_or(0)
    }
}

/// A capture of one interface of a namespace, every frame scanned whole for the watched
/// addresses. Dropped without [`Capture::finish`] (a failed assertion), its thread stops within
/// 100 ms.
struct Capture {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Seen>>,
}

impl Capture {
    fn start(ns: &Netns, iface: &str, watched: &[(String, Ipv6Addr)]) -> Capture {
        let cap = ns
            .run(|| PacketCapture::open(iface, SNAPLEN, Duration::from_millis(100)))
            .expect("enter")
            .unwrap_or_else(|e| panic!("capture on {iface} in {}: {e}", ns.name()));
        let stop = Arc::new(AtomicBool::new(false));
        let watched = watched.to_vec();
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || scan(&cap, &stop, &watched)
        });
        Capture {
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Seen {
        self.stop.store(true, Ordering::Relaxed);
        self.thread
            .take()
            .expect("started")
            .join()
            .expect("capture thread")
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn scan(cap: &PacketCapture, stop: &AtomicBool, watched: &[(String, Ipv6Addr)]) -> Seen {
    let mut seen = Seen::default();
    let mut buf = vec![0u8; SNAPLEN as usize];
    loop {
        // Once told to stop, what is still queued is read too: the last datagrams were sent
        // just before.
        let stopping = stop.load(Ordering::Relaxed);
        let got = if stopping {
            cap.recv_nowait(&mut buf)
        } else {
            cap.recv(&mut buf)
        };
        let frame = match got.expect("capture") {
            Some(f) => f,
            None if stopping => return seen,
            None => continue,
        };
        let b = &buf[..frame.captured];
        seen.frames += 1;
        let ipv6 = b.len() >= 54 && b[12..14] == [0x86, 0xdd];
        if ipv6 && b[20] == 17 {
            seen.udp += 1;
        }
        if ipv6 && b[20] == 58 && b.len() >= 56 {
            *seen.icmp.entry((b[54], b[55])).or_default() += 1;
        }
        for (name, a) in watched {
            let needle = a.octets();
            if let Some(at) = b.windows(16).position(|w| w == needle) {
                *seen.with.entry(name.clone()).or_default() += 1;
                seen.first
                    .entry(name.clone())
                    .or_insert_with(|| describe(b, frame.wire_len, at));
            }
        }
    }
}

fn describe(b: &[u8], wire_len: usize, at: usize) -> String {
    if b.len() < 54 || b[12..14] != [0x86, 0xdd] {
        return format!(
            "non-IPv6 frame (ethertype {:02x}{:02x}), {wire_len} bytes, address at byte {at}",
            b.get(12).copied().unwrap_or(0),
            b.get(13).copied().unwrap_or(0)
        );
    }
    let addr = |r: std::ops::Range<usize>| {
        let mut o = [0u8; 16];
        o.copy_from_slice(&b[r]);
        Ipv6Addr::from(o)
    };
    let kind = match b[20] {
        17 => "UDP".to_string(),
        58 if b.len() >= 56 => format!("ICMPv6 type {} code {}", b[54], b[55]),
        n => format!("next header {n}"),
    };
    format!(
        "IPv6 {} -> {} {kind}, {wire_len} bytes, address at byte {at}",
        addr(22..38),
        addr(38..54)
    )
}

/// What a burst of datagrams met.
#[derive(Debug, Default)]
struct Burst {
    sent: u32,
    /// Sends that failed with EACCES: an ICMPv6 "administratively prohibited" (a `prohibit`
    /// route on the way) came back for an earlier datagram.
    refused: u32,
    other: Vec<String>,
}

/// `count` UDP datagrams from host `from` to host `to`'s port 9, one every `interval`, on a
/// connected socket. Each carries both hosts' addresses, so a payload that left in clear shows
/// them even where its header would not.
fn udp_burst(lab: &RelayLab, from: usize, to: usize, count: u32, interval: Duration) -> Burst {
    let (src, dst) = (lab.hosts[from].address, lab.hosts[to].address);
    let mut payload = b"mt6d fail-closed probe ".to_vec();
    payload.extend_from_slice(&src.octets());
    payload.extend_from_slice(&dst.octets());
    lab.hosts[from]
        .ns
        .run(|| {
            let mut burst = Burst::default();
            let sock = std::net::UdpSocket::bind((src, 0)).expect("bind");
            sock.connect((dst, 9)).expect("connect");
            for _ in 0..count {
                match sock.send(&payload) {
                    Ok(_) => burst.sent += 1,
                    Err(e) if e.raw_os_error() == Some(libc::EACCES) => burst.refused += 1,
                    Err(e) => burst.other.push(e.to_string()),
                }
                std::thread::sleep(interval);
            }
            burst
        })
        .expect("enter host")
}

/// Ten echo requests from `from` to `to`, 100 ms apart, each waited for up to 1 s.
fn echoes(lab: &RelayLab, from: usize, to: usize) -> PingReport {
    lab.ping(
        from,
        to,
        10,
        Pace::Train {
            interval: Duration::from_millis(100),
        },
        Duration::from_secs(1),
    )
    .expect("ping")
}

/// Every true address of the lab by name ([`RelayLab::true_addresses`]): the hosts' (`h1`,
/// `h2`), the edge gateways' on their hosts' links, the nodes' configured addresses.
fn true_addresses(lab: &RelayLab) -> Vec<(String, Ipv6Addr)> {
    let hosts = lab.hosts.iter().flat_map(|h| {
        let edge = &lab.nodes[h.edge].name;
        [
            (h.name.clone(), h.address),
            (
                format!("{edge} on {}'s link", h.name),
                relays::edge_host_side(h.k),
            ),
        ]
    });
    let nodes = lab
        .nodes
        .iter()
        .map(|n| (format!("{}'s address", n.name), n.address));
    let named: Vec<_> = hosts.chain(nodes).collect();
    let mut all = lab.true_addresses();
    all.sort();
    let mut ours: Vec<Ipv6Addr> = named.iter().map(|(_, a)| *a).collect();
    ours.sort();
    assert_eq!(
        all, ours,
        "the lab's true addresses changed: name the new ones"
    );
    named
}

/// Waits until `ns` has no link `name` (at most `limit`): how long it took.
fn wait_link_gone(ns: &Netns, name: &str, limit: Duration) -> Option<Duration> {
    let start = Instant::now();
    while start.elapsed() < limit {
        if !snapshot(ns).links.iter().any(|l| l == name) {
            return Some(start.elapsed());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    None
}

fn has_table(s: &Snapshot) -> bool {
    s.tables.iter().any(|t| t.contains(TABLE))
}

fn has_anyip(s: &Snapshot, prefix: &str) -> bool {
    s.routes
        .iter()
        .any(|r| r.starts_with(&format!("local {prefix} dev lo")))
}

fn has_guard(s: &Snapshot, host: Ipv6Addr) -> bool {
    s.routes
        .iter()
        .any(|r| r.starts_with(&format!("prohibit {host} ")))
}

/// An edge gateway killed with SIGKILL leaks nothing, its guard refuses its host's packets, and
/// `mt6d down` removes everything it left.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn an_edge_gateway_killed_with_sigkill_sends_nothing_in_clear_and_down_removes_what_it_left() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let t0 = Instant::now();
    // eA's uplink: a default route towards r1 on its external interface, as an edge gateway
    // with a way out has. Without a guard, h1's packets for h2 would take it, in clear.
    let (mut lab, before) = up("m6fe", "eA", |lab| {
        let (ea, r1) = (
            lab.node_index("eA").expect("eA"),
            lab.node_index("r1").expect("r1"),
        );
        let via = link_local(&lab.nodes[r1].ns, &interface_towards(lab, "r1", "eA"));
        let (ok, out) = run_in(
            &lab.nodes[ea].ns,
            "ip",
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &via.to_string(),
                "dev",
                &interface_towards(lab, "eA", "r1"),
            ],
        );
        assert!(ok, "eA's default route: {out}");
    });
    let (h1, h2) = hosts(&lab);
    let ea = lab.node_index("eA").expect("eA");
    let ns = Netns::open(lab.nodes[ea].ns.name()).expect("eA's namespace");
    // Its only link, the `external_interface` of its file.
    let external = interface_towards(&lab, "eA", "r1");
    let (h1_addr, h2_addr) = (lab.hosts[h1].address, lab.hosts[h2].address);
    let prefix = format!("{}/64", relays::node_prefix(lab.nodes[ea].n));
    let running = snapshot(&ns);
    assert!(
        has_guard(&running, h2_addr)
            && has_anyip(&running, &prefix)
            && has_table(&running)
            && running.links.iter().any(|l| l == TUN)
            && running
                .routes
                .iter()
                .any(|r| r.starts_with(&format!("{h2_addr} dev {TUN} "))),
        "premise: the running edge gateway has its guard, TUN route, AnyIP route and table: {running:?}"
    );
    let up_at = t0.elapsed();

    let watched = true_addresses(&lab);
    let capture = Capture::start(&ns, &external, &watched);
    let pid = lab.kill_node(ea).expect("eA was running");
    let tun_gone = wait_link_gone(&ns, TUN, Duration::from_secs(2));
    let killed = snapshot(&ns);
    let sending = Instant::now();
    let burst = udp_burst(&lab, h1, h2, 40, Duration::from_millis(25));
    let ping = echoes(&lab, h1, h2);
    let sent_for = sending.elapsed();
    let seen = capture.finish();
    let (get_ok, get) = run_in(
        &ns,
        "ip",
        &[
            "-6",
            "route",
            "get",
            &h2_addr.to_string(),
            "from",
            &h1_addr.to_string(),
            "iif",
            relays::EDGE_HOST_IF,
        ],
    );
    eprintln!(
        "eA (pid {pid}) killed with SIGKILL: TUN device gone after {tun_gone:?}; h1 sent for {sent_for:?}: {} datagrams sent, {} refused with EACCES, other errors {:?}; echoes {}/{} answered",
        burst.sent, burst.refused, burst.other, ping.received, ping.sent
    );
    eprintln!(
        "  {external} of eA: {} frames ({} UDP, ICMPv6 by (type, code) {:?}), carrying h1 {}, h2 {}; route get {h2_addr} from h1: {}",
        seen.frames,
        seen.udp,
        seen.icmp,
        seen.carrying("h1"),
        seen.carrying("h2"),
        get.trim()
    );
    assert!(
        seen.carrying("h1") + seen.carrying("h2") == 0,
        "after SIGKILL a host's true address left eA on {external}: {:?}",
        seen.first
    );
    // Nor any other true address of the lab. Before the table's last rule dropped what no
    // socket takes, eA's kernel answered r1's frames with ICMPv6 port unreachables from its one
    // global address, the one on h1's link (49-55 frames in 3 s).
    assert!(
        seen.with.is_empty(),
        "after SIGKILL a true address left eA on {external}: {:?}",
        seen.first
    );
    assert_eq!(
        seen.icmp.get(&(1, 4)).copied().unwrap_or(0),
        0,
        "the dead node's kernel answered with port unreachables on {external}: {:?}",
        seen.icmp
    );
    assert!(
        seen.frames > 0,
        "the capture saw nothing on {external} (r1 keeps sending to eA)"
    );
    assert!(
        has_guard(&killed, h2_addr),
        "the guard route for {h2_addr} did not outlive the process: {:?}",
        killed.routes
    );
    assert!(
        !get_ok && get.contains("Permission denied"),
        "the kernel does not refuse h1's packets for h2: {get}"
    );
    assert!(
        burst.refused > 0 && burst.other.is_empty(),
        "h1's datagrams were not refused by a prohibit route: {burst:?}"
    );
    assert_eq!(ping.received, 0, "echoes crossed a dead edge gateway");

    let (ok, out) = down(&lab, ea);
    eprintln!("  mt6d down: {}", out.trim());
    assert!(ok, "mt6d down failed: {out}");
    let after = snapshot(&ns);
    assert!(
        !has_guard(&after, h2_addr),
        "guard left: {:?}",
        after.routes
    );
    assert!(
        !has_anyip(&after, &prefix),
        "AnyIP route left: {:?}",
        after.routes
    );
    assert!(
        !after.links.iter().any(|l| l == TUN),
        "TUN device left: {:?}",
        after.links
    );
    assert!(
        !has_table(&after),
        "nftables table left: {:?}",
        after.tables
    );
    assert_same(&before, &after, "after mt6d down");
    // Idempotent: a second `down` finds nothing and changes nothing.
    let (ok, again) = down(&lab, ea);
    eprintln!("  second mt6d down: {}", again.trim());
    assert!(ok, "second mt6d down: {again}");
    assert_same(&before, &snapshot(&ns), "after a second mt6d down");

    // With the guard gone, the same datagrams leave in clear by the default route: the guard,
    // not a missing route, kept them in, and the capture sees such a leak.
    let capture = Capture::start(&ns, &external, &watched);
    let control = udp_burst(&lab, h1, h2, 10, Duration::from_millis(25));
    let seen = capture.finish();
    eprintln!(
        "  after down, without the guard: {} datagrams sent; {external}: {} frames carrying h2 (first: {:?}); test took {:?} (lab up in {up_at:?})",
        control.sent,
        seen.carrying("h2"),
        seen.first.get("h2"),
        t0.elapsed()
    );
    assert!(
        seen.carrying("h2") >= 5,
        "control: without the guard h1's datagrams should leave in clear and be seen: {seen:?}"
    );
}

/// A relay killed with SIGKILL shows no true address on either of its links while the host
/// sends, and `mt6d down` removes its AnyIP route and its table.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_relay_killed_with_sigkill_shows_no_true_address_and_down_removes_what_it_left() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let t0 = Instant::now();
    let (mut lab, before) = up("m6fr", "r1", |_| {});
    let (h1, h2) = hosts(&lab);
    let r1 = lab.node_index("r1").expect("r1");
    let ns = Netns::open(lab.nodes[r1].ns.name()).expect("r1's namespace");
    let prefix = format!("{}/64", relays::node_prefix(lab.nodes[r1].n));
    let interfaces: Vec<String> = lab
        .links
        .iter()
        .filter_map(|l| match (l.a == r1, l.b == r1) {
            (true, _) => Some(l.if_a.clone()),
            (_, true) => Some(l.if_b.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(interfaces.len(), 2, "r1 has two links: {interfaces:?}");
    let running = snapshot(&ns);
    assert!(
        has_anyip(&running, &prefix) && has_table(&running),
        "premise: the running relay has its AnyIP route and table: {running:?}"
    );
    assert!(
        !running.routes.iter().any(|r| r.starts_with("prohibit"))
            && !running.links.iter().any(|l| l == TUN),
        "a pure relay has no guard route and no TUN device: {running:?}"
    );
    let up_at = t0.elapsed();

    let watched = true_addresses(&lab);
    let captures: Vec<Capture> = interfaces
        .iter()
        .map(|i| Capture::start(&ns, i, &watched))
        .collect();
    let pid = lab.kill_node(r1).expect("r1 was running");
    let sending = Instant::now();
    let burst = udp_burst(&lab, h1, h2, 40, Duration::from_millis(25));
    let ping = echoes(&lab, h1, h2);
    let sent_for = sending.elapsed();
    let seen: Vec<Seen> = captures.into_iter().map(Capture::finish).collect();
    eprintln!(
        "r1 (pid {pid}) killed with SIGKILL; h1 sent for {sent_for:?}: {} datagrams sent, {} refused, other errors {:?}; echoes {}/{} answered",
        burst.sent, burst.refused, burst.other, ping.received, ping.sent
    );
    for (i, s) in interfaces.iter().zip(&seen) {
        eprintln!(
            "  {i} of r1: {} frames ({} UDP, ICMPv6 by (type, code) {:?}), carrying h1 {}, h2 {}",
            s.frames,
            s.udp,
            s.icmp,
            s.carrying("h1"),
            s.carrying("h2")
        );
    }
    for (i, s) in interfaces.iter().zip(&seen) {
        assert!(
            s.with.is_empty(),
            "after r1's SIGKILL a true address crossed {i}: {:?}",
            s.first
        );
        // A dead node is silent: port unreachables (even from a link-local address) would tell
        // an observer that the node behind that hashed address died.
        assert_eq!(
            s.icmp.get(&(1, 4)).copied().unwrap_or(0),
            0,
            "r1's kernel answered with port unreachables on {i}: {:?}",
            s.icmp
        );
    }
    // eA goes on sealing h1's packets for the dead relay until it finds the link down.
    let towards_ea = interfaces
        .iter()
        .position(|i| *i == interface_towards(&lab, "r1", "eA"))
        .expect("r1's link to eA");
    assert!(
        seen[towards_ea].udp > 0,
        "premise: eA's frames reached r1's link after the kill: {:?}",
        seen[towards_ea]
    );
    assert_eq!(ping.received, 0, "echoes crossed a dead relay");

    let (ok, out) = down(&lab, r1);
    eprintln!("  mt6d down: {}", out.trim());
    assert!(ok, "mt6d down failed: {out}");
    let after = snapshot(&ns);
    assert!(
        !has_anyip(&after, &prefix),
        "AnyIP route left: {:?}",
        after.routes
    );
    assert!(
        !has_table(&after),
        "nftables table left: {:?}",
        after.tables
    );
    assert_same(&before, &after, "after mt6d down");
    let (ok, again) = down(&lab, r1);
    eprintln!("  second mt6d down: {}", again.trim());
    assert!(ok, "second mt6d down: {again}");
    assert_same(&before, &snapshot(&ns), "after a second mt6d down");
    eprintln!("  test took {:?} (lab up in {up_at:?})", t0.elapsed());
}

/// An edge gateway stopped cleanly (SIGTERM) with a default route out of its link, as after a
/// crash, puts no frame with a host's true address on that link while h1 keeps sending: the
/// stop keeps its guard route. Started again, it carries h1's packets to h2 (the start adopts
/// the guard in place); stopped once more, the guard still refuses; `mt6d down` lifts it.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn an_edge_gateway_stopped_and_restarted_sends_nothing_in_clear() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let (mut lab, _) = up("m6fs", "eA", |lab| {
        let (ea, r1) = (
            lab.node_index("eA").expect("eA"),
            lab.node_index("r1").expect("r1"),
        );
        let via = link_local(&lab.nodes[r1].ns, &interface_towards(lab, "r1", "eA"));
        let (ok, out) = run_in(
            &lab.nodes[ea].ns,
            "ip",
            &[
                "-6",
                "route",
                "add",
                "default",
                "via",
                &via.to_string(),
                "dev",
                &interface_towards(lab, "eA", "r1"),
            ],
        );
        assert!(ok, "eA's default route: {out}");
    });
    let (h1, h2) = hosts(&lab);
    let ea = lab.node_index("eA").expect("eA");
    let ns = Netns::open(lab.nodes[ea].ns.name()).expect("eA's namespace");
    let external = interface_towards(&lab, "eA", "r1");
    let h2_addr = lab.hosts[h2].address;
    let watched = true_addresses(&lab);
    let capture = Capture::start(&ns, &external, &watched);
    let mut bursts = Vec::new();
    let mut guard_while_stopped = Vec::new();
    for round in 0..2 {
        lab.stop_node(ea).expect("eA stops cleanly");
        guard_while_stopped.push(has_guard(&snapshot(&ns), h2_addr));
        bursts.push(udp_burst(&lab, h1, h2, 40, Duration::from_millis(25)));
        if round == 0 {
            lab.start_node(ea).expect("eA starts again");
            lab.wait_routes(Duration::from_secs(20))
                .expect("edge gateways route to each other again");
            lab.wait_for_path(h1, h2, Duration::from_secs(10))
                .expect("the path after the restart");
            bursts.push(udp_burst(&lab, h1, h2, 20, Duration::from_millis(25)));
        }
    }
    let seen = capture.finish();
    eprintln!(
        "eA stopped, started, stopped: bursts {bursts:?}; guard while stopped {guard_while_stopped:?}; {external}: {} frames, carrying h1 {}, h2 {} (first: {:?})",
        seen.frames,
        seen.carrying("h1"),
        seen.carrying("h2"),
        seen.first
    );
    assert!(
        guard_while_stopped.iter().all(|g| *g),
        "a clean stop took the guard for {h2_addr} away: {guard_while_stopped:?}"
    );
    assert!(
        seen.with.is_empty(),
        "a stopped edge gateway let a true address onto {external}: {:?}",
        seen.first
    );
    assert!(seen.frames > 0, "the capture saw {external}");
    let (ok, out) = down(&lab, ea);
    assert!(ok, "mt6d down: {out}");
    assert!(
        !has_guard(&snapshot(&ns), h2_addr),
        "mt6d down left the guard"
    );
}
