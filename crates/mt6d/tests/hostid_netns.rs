//! End to end: TCP identity options (seed 004's HOST_ID forms, RFC 7974, TOA)
//! sent by Host A through a gateway pair, what Host B's link sees of them, injection in 004's
//! SYN mode and ACK mode (§3.2.2, with Host B a hand-made server that returns HOST_ID_ENABLED),
//! MSS clamping over the reduced-MTU tunneled topology, and SYN fingerprint normalisation read
//! by p0f on both links.
//!
//! Host A's kernel cannot put these options in a SYN, so the tests speak TCP from Host A by
//! hand: Ethernet frames through an AF_PACKET socket on Host A's link (its kernel's RSTs for the
//! unknown connection dropped by an nftables rule in Host A only), to a real listening socket
//! on Host B. A capture on Host B's link checks every SYN that arrives: options, checksum.
//!
//! Run as root: `cargo test --release -p mt6d --test hostid_netns -- --include-ignored`.

mod common;

use std::io::Read;
use std::net::{Ipv6Addr, TcpListener};
use std::time::{Duration, Instant};

use common::{require_root, start_gateways_with, status, Running};
use mt6d_lab::topology::{Lab, Side, Topology, HOST_A, HOST_B, HOST_IF};
use mt6d_os::capture::PacketCapture;
use mt6d_proto::scrub::{identity_value, HostIdForm, HostIdKinds, TcpOption, TcpOptions};
use mt6d_proto::wire::upper_layer_checksum;

const KINDS: HostIdKinds = HostIdKinds {
    wing: Some(200),
    boucadair: Some(201),
    enabled: Some(202),
};
const TCP_KINDS: &str = "\n[tcp]\nwing_kind = 200\nboucadair_kind = 201\nenabled_kind = 202\n";
/// Linux's SYN options (MSS 1440: Host A's 1500-byte link), before the identity option.
const LINUX_SYN: [u8; 20] = [
    2, 4, 0x05, 0xa0, 4, 2, 8, 10, 0, 0, 0x10, 0, 0, 0, 0, 0, 1, 3, 3, 7,
];
const PORT: u16 = 8080;

fn is_a(text: &str) -> bool {
    text.contains(&format!("local_host = \"{HOST_A}\""))
}

fn start(topology: Topology, a_extra: &'static str, b_extra: &'static str) -> Running {
    require_root();
    let lab = Lab::build_topology(topology, "m6h").expect("lab builds");
    start_gateways_with(lab, "encrypt", 2.0, (true, None), move |text| {
        format!("{text}{}", if is_a(&text) { a_extra } else { b_extra })
    })
}

fn mac_of(ns: &mt6d_os::Netns, args: &[&str]) -> [u8; 6] {
    let out = common::ip_in(ns, args);
    let word = out
        .split_whitespace()
        .skip_while(|w| *w != "lladdr" && *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {out:?}"));
    let mut mac = [0u8; 6];
    for (m, h) in mac.iter_mut().zip(word.split(':')) {
        *m = u8::from_str_radix(h, 16).expect("hex");
    }
    mac
}

/// Host A's hand-made TCP: frames out of its link, frames of Host B's answers read back.
struct Client {
    cap: PacketCapture,
    head: [u8; 14],
}

fn client(lab: &Lab) -> Client {
    hand_tcp(&lab.host_a, HOST_B)
}

/// Hand-made TCP in `ns` towards `peer`: its kernel's RSTs dropped (it knows none of these
/// connections), a capture on its link that sends frames to `peer`'s neighbour entry.
fn hand_tcp(ns: &mt6d_os::Netns, peer: Ipv6Addr) -> Client {
    // The path is up (start pinged B), so both hosts have the proxy neighbour entry.
    let dst = mac_of(ns, &["-6", "neigh", "show", &peer.to_string()]);
    let src = mac_of(ns, &["link", "show", HOST_IF]);
    let nft = "table ip6 mt6d_test_norst {\n chain o {\n  type filter hook output priority 0;\n  tcp flags & rst == rst drop\n }\n}\n";
    let mut cmd = ns.command("nft").expect("nft");
    let ok = cmd
        .args(["-f", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().expect("stdin").write_all(nft.as_bytes())?;
            c.wait()
        });
    assert!(ok.expect("nft runs").success(), "nft rule");
    let cap = ns
        .run(|| PacketCapture::open(HOST_IF, 2048, Duration::from_millis(100)))
        .expect("enter the namespace")
        .expect("capture");
    let mut head = [0u8; 14];
    head[..6].copy_from_slice(&dst);
    head[6..12].copy_from_slice(&src);
    head[12..].copy_from_slice(&[0x86, 0xdd]);
    Client { cap, head }
}

/// An IPv6+TCP packet from Host A to Host B with a valid checksum.
fn segment(sport: u16, seq: u32, ack: u32, flags: u8, opts: &[u8], payload: &[u8]) -> Vec<u8> {
    tcp_packet(
        (HOST_A, sport),
        (HOST_B, PORT),
        (seq, ack),
        flags,
        opts,
        payload,
    )
}

/// An IPv6+TCP packet with a valid checksum: `opts` padded with zeros to a multiple of 4.
fn tcp_packet(
    (src, sport): (Ipv6Addr, u16),
    (dst, dport): (Ipv6Addr, u16),
    (seq, ack): (u32, u32),
    flags: u8,
    opts: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut o = opts.to_vec();
    o.resize(opts.len().div_ceil(4) * 4, 0);
    let seg_len = 20 + o.len() + payload.len();
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(seg_len as u16).to_be_bytes());
    p.extend_from_slice(&[6, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&sport.to_be_bytes());
    p.extend_from_slice(&dport.to_be_bytes());
    p.extend_from_slice(&seq.to_be_bytes());
    p.extend_from_slice(&ack.to_be_bytes());
    p.push((((20 + o.len()) / 4) as u8) << 4);
    p.push(flags);
    p.extend_from_slice(&[0xfa, 0xf0, 0, 0, 0, 0]);
    p.extend_from_slice(&o);
    p.extend_from_slice(payload);
    let c = upper_layer_checksum(src, dst, 6, &p[40..]);
    p[56..58].copy_from_slice(&c.to_be_bytes());
    p
}

impl Client {
    fn send(&self, packet: &[u8]) {
        let mut f = self.head.to_vec();
        f.extend_from_slice(packet);
        self.cap.send(&f).expect("send frame");
    }

    /// Waits for Host B's SYN-ACK to `sport`: (its sequence number, its options).
    fn syn_ack(&self, sport: u16, within: Duration) -> Option<(u32, Vec<u8>)> {
        let deadline = Instant::now() + within;
        let mut buf = [0u8; 2048];
        while Instant::now() < deadline {
            let Ok(Some(f)) = self.cap.recv(&mut buf) else {
                continue;
            };
            let p = &buf[14..f.captured];
            if let Some((src, tcp)) = tcp_of(p) {
                if src == HOST_B && port(tcp, 2) == sport && tcp[13] & 0x12 == 0x12 {
                    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
                    return Some((seq, tcp[20..usize::from(tcp[12] >> 4) * 4].to_vec()));
                }
            }
        }
        None
    }

    /// A whole connection: SYN with `opts`, then (if B answers) the ACK with a payload B's
    /// application must read. Returns whether B answered.
    fn connect(&self, sport: u16, opts: &[u8], within: Duration) -> bool {
        let isn = 0x1000_0000 + u32::from(sport);
        self.send(&segment(sport, isn, 0, 0x02, opts, &[]));
        let Some((their, _)) = self.syn_ack(sport, within) else {
            return false;
        };
        let payload = format!("hello from {sport}");
        self.send(&segment(
            sport,
            isn + 1,
            their + 1,
            0x18,
            &[],
            payload.as_bytes(),
        ));
        true
    }
}

fn port(tcp: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([tcp[at], tcp[at + 1]])
}

/// (source, TCP segment) of an IPv6 packet carrying TCP directly.
fn tcp_of(p: &[u8]) -> Option<(Ipv6Addr, &[u8])> {
    if p.len() < 60 || p[0] >> 4 != 6 || p[6] != 6 {
        return None;
    }
    let len = 40 + usize::from(u16::from_be_bytes([p[4], p[5]]));
    let src = Ipv6Addr::from(<[u8; 16]>::try_from(&p[8..24]).ok()?);
    Some((src, p.get(40..len)?))
}

/// What Host B's link saw of one SYN from Host A.
#[derive(Debug, Clone)]
struct SeenSyn {
    sport: u16,
    options: Vec<u8>,
    checksum_ok: bool,
}

/// Captures the SYNs from Host A arriving on Host B's link, on a thread, until `stop`.
fn watch_syns(
    lab: &Lab,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<SeenSyn>> {
    let cap = lab
        .host_b
        .run(|| PacketCapture::open(HOST_IF, 2048, Duration::from_millis(100)))
        .expect("enter B")
        .expect("capture on B");
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 2048];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(Some(f)) = cap.recv(&mut buf) else {
                continue;
            };
            let Some((src, tcp)) = tcp_of(&buf[14..f.captured]) else {
                continue;
            };
            if src != HOST_A || tcp[13] & 0x12 != 0x02 {
                continue;
            }
            seen.push(SeenSyn {
                sport: port(tcp, 0),
                options: tcp[20..usize::from(tcp[12] >> 4) * 4].to_vec(),
                checksum_ok: upper_layer_checksum(HOST_A, HOST_B, 6, tcp) == 0,
            });
        }
        seen
    })
}

/// Host B's application: accepts connections and collects what each sent, until `stop`.
fn server(
    lab: &Lab,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<String>> {
    let listener: TcpListener = lab
        .host_b
        .run(|| TcpListener::bind((HOST_B, PORT)))
        .expect("enter B")
        .expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    std::thread::spawn(move || {
        let mut got = Vec::new();
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).expect("blocking");
                    s.set_read_timeout(Some(Duration::from_secs(2)))
                        .expect("timeout");
                    let mut b = [0u8; 64];
                    let n = s.read(&mut b).unwrap_or(0);
                    got.push(String::from_utf8_lossy(&b[..n]).into_owned());
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        got
    })
}

fn has_identity(options: &[u8]) -> bool {
    TcpOptions::new(options, KINDS).any(|o| match o {
        Ok(o) => o.option.is_identity(),
        Err(_) => true,
    })
}

fn mss(options: &[u8]) -> Option<u16> {
    TcpOptions::new(options, KINDS).find_map(|o| match o {
        Ok(l) => match l.option {
            TcpOption::Mss(m) => Some(m),
            _ => None,
        },
        Err(_) => None,
    })
}

fn event(running: &Running, side: Side, dir: &str, name: &str) -> u64 {
    let st = status(running, side);
    st.peers[0]
        .tcp
        .iter()
        .find(|t| t.direction == dir)
        .and_then(|t| t.events.get(name).copied())
        .unwrap_or(0)
}

#[test]
#[ignore = "needs root: network namespaces"]
fn every_identity_form_is_stripped_matching_syns_dropped_and_malformed_ones_refused() {
    let a_extra: &'static str = Box::leak(
        format!(
            "{TCP_KINDS}[[peer.host_id_out.rule]]\noption = \"wing\"\nrange = [\"0x1000\", \"0x1fff\"]\naction = \"drop\"\n[[peer.host_id_out.rule]]\noption = \"toa\"\naction = \"log\"\n"
        )
        .into_boxed_str(),
    );
    let running = start(Topology::Switched, a_extra, TCP_KINDS);
    let lab = &running.lab;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syns = watch_syns(lab, stop.clone());
    let app = server(lab, stop.clone());
    let c = client(lab);
    let forms: [&[u8]; 13] = [
        &[200, 4, 0x30, 0x39],
        &[200, 6, 0xc0, 0, 2, 1],
        &[200, 10, 0x20, 1, 0x0d, 0xb8, 0, 0, 0, 1],
        &[201, 10, 0x00, 0x1f, 0x90, 0, 0, 0, 0, 0],
        &[201, 10, 0x31, 10, 0, 0, 1, 0, 0, 0],
        &[201, 10, 0x02, 0x1f, 0x90, 10, 0, 0, 1, 0],
        &[201, 10, 0x03, 0x20, 0x01, 0x0d, 0xb8, 0, 0, 1],
        &[202, 2],
        &[253, 6, 0x03, 0x48, 0xc6, 0x33],
        &[254, 7, 0x03, 0x48, 10, 0, 1],
        &[254, 8, 0x1f, 0x90, 0xc0, 0, 2, 1],
        // WING outside the drop rule's range, and TOA and WING together.
        &[200, 4, 0x23, 0x45],
        &[254, 8, 0x1f, 0x90, 0xc0, 0, 2, 1, 200, 4, 0x20, 0x00],
    ];
    for (i, form) in forms.iter().enumerate() {
        let mut opts = LINUX_SYN.to_vec();
        opts.extend_from_slice(form);
        let sport = 40_000 + i as u16;
        assert!(
            c.connect(sport, &opts, Duration::from_secs(3)),
            "no SYN-ACK for form {form:02x?}"
        );
    }
    // Matching the drop rule (WING 0x1000-0x1fff), and malformed: a WING of length 5, a
    // truncated option, an option of length 1.
    let refused: [&[u8]; 4] = [
        &[200, 4, 0x12, 0x34],
        &[200, 5, 0, 0, 0],
        &[8, 10, 0, 0],
        &[1, 1, 1, 30, 1],
    ];
    for (i, bad) in refused.iter().enumerate() {
        let mut opts = LINUX_SYN.to_vec();
        opts.extend_from_slice(bad);
        let sport = 41_000 + i as u16;
        assert!(
            !c.connect(sport, &opts, Duration::from_millis(800)),
            "SYN {bad:02x?} was answered"
        );
    }
    // The daemon is alive and still carries connections after all that.
    assert!(c.connect(42_000, &LINUX_SYN, Duration::from_secs(3)));
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let syns = syns.join().expect("capture thread");
    let got = app.join().expect("server thread");

    let mtu = status(&running, Side::A).path.tunnel_mtu;
    let clamp = mt6d_proto::scrub::mss_for_mtu(mtu as u16);
    for i in 0..forms.len() {
        let sport = 40_000 + i as u16;
        let s = syns
            .iter()
            .find(|s| s.sport == sport)
            .unwrap_or_else(|| panic!("SYN from port {sport} never reached B"));
        assert!(s.checksum_ok, "{s:?}");
        assert!(
            !has_identity(&s.options),
            "identity option reached B: {s:?}"
        );
        // Canonical layout (no NOP trail where the option was), MSS clamped to the tunnel.
        assert_eq!(s.options[4..], LINUX_SYN[4..], "{s:?}");
        assert_eq!(mss(&s.options), Some(clamp.min(1440)), "{s:?}");
        assert!(
            got.contains(&format!("hello from {sport}")),
            "connection from {sport} did not complete: {got:?}"
        );
    }
    for i in 0..refused.len() {
        let sport = 41_000 + i as u16;
        assert!(syns.iter().all(|s| s.sport != sport), "{sport} reached B");
    }
    assert!(got.contains(&"hello from 42000".to_string()));
    let out = |e| event(&running, Side::A, "out", e);
    assert_eq!(out("stripped"), forms.len() as u64);
    assert_eq!(out("options_removed"), forms.len() as u64 + 1);
    assert_eq!(out("dropped"), 1);
    assert_eq!(out("malformed"), 3);
    assert!(out("mss_clamped") >= forms.len() as u64);
    let st = status(&running, Side::A);
    let rules = &st.peers[0]
        .tcp
        .iter()
        .find(|t| t.direction == "out")
        .expect("status lists the out direction")
        .rules;
    assert_eq!(rules[0].rule, "wing 0x1000-0x1fff drop");
    assert_eq!(rules[0].hits, 1);
    // TOA alone and TOA with WING: the log rule matched both.
    assert_eq!(rules[1].hits, 2);
    let log = running.daemons[0].log_tail(200);
    assert!(log.contains("HOST_ID toa=0x1f90c0000201"), "{log}");
}

#[test]
#[ignore = "needs root: network namespaces"]
fn injected_options_are_well_formed_and_read_back_on_the_far_side() {
    let a_extra: &'static str = Box::leak(
        format!(
            "{TCP_KINDS}[peer.host_id_out.inject]\noption = \"boucadair\"\ndata = \"prefix\"\n"
        )
        .into_boxed_str(),
    );
    let b_extra: &'static str =
        Box::leak(format!("{TCP_KINDS}[peer.host_id_in]\naction = \"accept\"\n").into_boxed_str());
    let running = start(Topology::Switched, a_extra, b_extra);
    let lab = &running.lab;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syns = watch_syns(lab, stop.clone());
    // Host A's own kernel connects: the gateway alone adds the option.
    let rx = common::tcp_receiver(lab, PORT);
    let sent = lab
        .host_a
        .run(|| mt6d_lab::transfer::send_for(HOST_B, PORT, Duration::from_millis(300), 7))
        .expect("enter A")
        .expect("transfer completes");
    let received = rx.join().expect("receiver").expect("received");
    assert_eq!(received.bytes, sent.bytes);
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let syns = syns.join().expect("capture");
    let s = syns.first().expect("a SYN reached B");
    assert!(s.checksum_ok, "{s:?}");
    let ids: Vec<_> = TcpOptions::new(&s.options, KINDS)
        .map(|o| o.expect("well-formed block"))
        .filter_map(|o| identity_value(&o.option))
        .collect();
    // The first 56 bits of 2001:db8:1::a.
    assert_eq!(
        ids,
        vec![(HostIdForm::Boucadair, 0x0020_010d_b800_0100)],
        "{s:?}"
    );
    assert_eq!(
        event(&running, Side::A, "out", "injected"),
        syns.len() as u64
    );
    assert!(event(&running, Side::B, "in", "accepted") >= 1);
}

/// A segment from Host A as Host B's link showed it.
#[derive(Debug, Clone)]
struct SeenSegment {
    sport: u16,
    dport: u16,
    flags: u8,
    options: Vec<u8>,
    checksum_ok: bool,
}

/// Host B as a server that speaks 004's ACK mode (§3.2.2), by hand: every SYN from Host A gets
/// a SYN-ACK, which returns HOST_ID_ENABLED when the SYN carried it and went to `echo_port`
/// (a server supporting the option; any other port is a legacy server). Every segment from
/// Host A is kept in arrival order, until `stop`.
fn ack_mode_server(
    lab: &Lab,
    echo_port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<SeenSegment>> {
    let b = hand_tcp(&lab.host_b, HOST_A);
    std::thread::spawn(move || {
        let mut seen = Vec::new();
        let mut buf = [0u8; 2048];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(Some(f)) = b.cap.recv(&mut buf) else {
                continue;
            };
            let Some((src, tcp)) = tcp_of(&buf[14..f.captured]) else {
                continue;
            };
            if src != HOST_A {
                continue;
            }
            let s = SeenSegment {
                sport: port(tcp, 0),
                dport: port(tcp, 2),
                flags: tcp[13],
                options: tcp[20..usize::from(tcp[12] >> 4) * 4].to_vec(),
                checksum_ok: upper_layer_checksum(HOST_A, HOST_B, 6, tcp) == 0,
            };
            if s.flags & 0x12 == 0x02 {
                let enabled = TcpOptions::new(&s.options, KINDS)
                    .any(|o| matches!(o, Ok(o) if o.option == TcpOption::HostIdEnabled));
                // MSS 1360, and HOST_ID_ENABLED back if this server supports it.
                let mut opts = vec![2, 4, 0x05, 0x50];
                if enabled && s.dport == echo_port {
                    opts.extend_from_slice(&[1, 1, 202, 2]);
                }
                let their = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]);
                b.send(&tcp_packet(
                    (HOST_B, s.dport),
                    (HOST_A, s.sport),
                    (0x5000_0000, their.wrapping_add(1)),
                    0x12,
                    &opts,
                    &[],
                ));
            }
            seen.push(s);
        }
        seen
    })
}

fn identities(options: &[u8]) -> Vec<(HostIdForm, u64)> {
    TcpOptions::new(options, KINDS)
        .map(|o| o.expect("a well-formed option block"))
        .filter_map(|o| identity_value(&o.option))
        .collect()
}

/// The switched lab with Gateway A injecting HOST_ID_BOUCADAIR in ACK mode, and Gateway B
/// forwarding the options both ways (so the exchange is the server's own).
fn start_ack_mode() -> Running {
    let a_extra: &'static str = Box::leak(
        format!(
            "{TCP_KINDS}[peer.host_id_out.inject]\noption = \"boucadair\"\ndata = \"prefix\"\nmode = \"ack\"\n"
        )
        .into_boxed_str(),
    );
    let b_extra: &'static str = Box::leak(
        format!(
            "{TCP_KINDS}[peer.host_id_in]\naction = \"accept\"\n[peer.host_id_out]\naction = \"accept\"\n"
        )
        .into_boxed_str(),
    );
    start(Topology::Switched, a_extra, b_extra)
}

#[test]
#[ignore = "needs root: network namespaces"]
fn ack_mode_sends_enabled_in_the_syn_and_the_identity_in_the_first_ack_only() {
    let running = start_ack_mode();
    let lab = &running.lab;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (echo, legacy) = (PORT, PORT + 1);
    let srv = ack_mode_server(lab, echo, stop.clone());
    // Host A's own kernel connects, to a server that returns HOST_ID_ENABLED and to one that
    // does not, and sends data on each (segments after the first ACK).
    for dport in [echo, legacy] {
        lab.host_a
            .run(|| {
                use std::io::Write;
                let s = std::net::TcpStream::connect_timeout(
                    &(HOST_B, dport).into(),
                    Duration::from_secs(3),
                )?;
                write!(&s, "data to {dport}")?;
                std::thread::sleep(Duration::from_millis(300));
                Ok::<_, std::io::Error>(())
            })
            .expect("enter A")
            .expect("Host A's kernel connects through the gateways");
    }
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = srv.join().expect("server thread");
    for s in &seen {
        assert!(s.checksum_ok, "{s:?}");
    }
    let enabled = vec![(HostIdForm::Enabled, 0)];
    // The first 56 bits of 2001:db8:1::a.
    let host_id = vec![(HostIdForm::Boucadair, 0x0020_010d_b800_0100)];
    for dport in [echo, legacy] {
        let flow: Vec<&SeenSegment> = seen.iter().filter(|s| s.dport == dport).collect();
        let syns: Vec<_> = flow.iter().filter(|s| s.flags & 0x12 == 0x02).collect();
        assert!(!syns.is_empty(), "no SYN to {dport} reached B: {seen:?}");
        for s in &syns {
            assert_eq!(identities(&s.options), enabled, "SYN to {dport}: {s:?}");
        }
        let after: Vec<_> = flow.iter().filter(|s| s.flags & 0x02 == 0).collect();
        assert!(after.len() >= 2, "ACK and data to {dport}: {flow:?}");
        assert!(after.iter().all(|s| s.flags & 0x10 != 0), "{after:?}");
        let want = if dport == echo { &host_id } else { &vec![] };
        assert_eq!(&identities(&after[0].options), want, "first ACK: {after:?}");
        for s in &after[1..] {
            assert!(identities(&s.options).is_empty(), "later segment: {s:?}");
        }
    }
    let syns = seen.iter().filter(|s| s.flags & 0x12 == 0x02).count() as u64;
    // HOST_ID_ENABLED in every SYN, HOST_ID_BOUCADAIR in one ACK.
    assert_eq!(event(&running, Side::A, "out", "injected"), syns + 1);
    // The SYN-ACK's HOST_ID_ENABLED did not reach Host A (Gateway A's default strip).
    assert!(event(&running, Side::A, "in", "stripped") >= 1);
    // Every SYN and the ACK with HOST_ID_BOUCADAIR, passed by Gateway B's `accept`.
    assert!(event(&running, Side::B, "in", "accepted") > syns);
}

/// The first ACK of a connection is generated by Host A's kernel inside Gateway A's write of
/// the SYN-ACK, and its first data a moment later: the device sends them to different queues
/// unless the SYN-ACK went into the queue its SYN was read from (`gateway/syn_queues.rs`). Two
/// workers then race, and the data could leave first (the identity of ACK mode after it). Many
/// connections, each with data at once: every first ACK leads its flow with the identity.
#[test]
#[ignore = "needs root: network namespaces"]
fn ack_mode_identity_leads_each_of_many_connections() {
    const CONNECTIONS: usize = 48;
    let running = start_ack_mode();
    let lab = &running.lab;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let srv = ack_mode_server(lab, PORT, stop.clone());
    let streams = lab
        .host_a
        .run(|| {
            use std::io::Write;
            (0..CONNECTIONS)
                .map(|_| {
                    let s = std::net::TcpStream::connect_timeout(
                        &(HOST_B, PORT).into(),
                        Duration::from_secs(3),
                    )?;
                    write!(&s, "data")?;
                    Ok(s)
                })
                .collect::<std::io::Result<Vec<_>>>()
        })
        .expect("enter A")
        .expect("Host A's kernel connects through the gateways");
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let seen = srv.join().expect("server thread");
    drop(streams);
    let host_id = vec![(HostIdForm::Boucadair, 0x0020_010d_b800_0100)];
    let mut late = Vec::new();
    let ports: std::collections::BTreeSet<u16> = seen.iter().map(|s| s.sport).collect();
    assert_eq!(ports.len(), CONNECTIONS, "{seen:?}");
    for sport in ports {
        let after: Vec<&SeenSegment> = seen
            .iter()
            .filter(|s| s.sport == sport && s.flags & 0x02 == 0)
            .collect();
        assert!(
            after.len() >= 2,
            "ACK and data from port {sport}: {after:?}"
        );
        if identities(&after[0].options) != host_id {
            late.push((sport, after));
        }
    }
    assert!(
        late.is_empty(),
        "{} of {CONNECTIONS} connections: the first segment after the SYN is not the ACK with the identity: {late:?}",
        late.len()
    );
}

#[test]
#[ignore = "needs root: network namespaces"]
fn mss_is_clamped_to_the_tunnel_over_the_reduced_mtu_topology() {
    require_root();
    // Without the gateways' Router Advertisements the hosts keep their 1500-byte links and
    // offer MSS 1440: what a deployment with another router on the internal link looks like.
    let lab = Lab::build_topology(Topology::Tunneled, "m6h").expect("lab builds");
    let running = start_gateways_with(lab, "encrypt", 2.0, (true, None), |text| {
        text.replacen(
            "[gateway]\n",
            "[gateway]\nrouter_advertisements = false\n",
            1,
        )
    });
    let lab = &running.lab;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let syns = watch_syns(lab, stop.clone());
    let rx = common::tcp_receiver(lab, PORT);
    let sent = lab
        .host_a
        .run(|| mt6d_lab::transfer::send_for(HOST_B, PORT, Duration::from_secs(1), 3))
        .expect("enter A")
        .expect("transfer completes");
    let received = rx.join().expect("receiver").expect("received");
    assert_eq!(received.bytes, sent.bytes);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let syns = syns.join().expect("capture");
    let mtu = status(&running, Side::A).path.tunnel_mtu;
    // The VXLAN underlay's 1450 bytes less the tunnel's overhead.
    assert!(mtu < 1450, "the tunneled topology's tunnel MTU is {mtu}");
    let want = mt6d_proto::scrub::mss_for_mtu(mtu as u16);
    assert!(want < 1440);
    let s = syns.first().expect("a SYN reached B");
    assert!(s.checksum_ok);
    // Host A offered 1440 (its 1500-byte link); B sees what the tunnel carries.
    assert_eq!(mss(&s.options), Some(want), "{s:?}");
    assert!(event(&running, Side::A, "out", "mss_clamped") >= 1);
    // B's SYN-ACK was clamped by Gateway B on its way in.
    assert!(event(&running, Side::B, "out", "mss_clamped") >= 1);
}

/// Every SYN from Host A (Ethernet frames, whole) seen on `ns`'s host link, until `stop`.
fn capture_syn_frames(
    ns: &mt6d_os::Netns,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Vec<Vec<u8>>> {
    let cap = ns
        .run(|| PacketCapture::open(HOST_IF, 2048, Duration::from_millis(100)))
        .expect("enter the namespace")
        .expect("capture");
    std::thread::spawn(move || {
        let mut frames = Vec::new();
        let mut buf = [0u8; 2048];
        while !stop.load(std::sync::atomic::Ordering::Relaxed) {
            let Ok(Some(f)) = cap.recv(&mut buf) else {
                continue;
            };
            let Some((src, tcp)) = tcp_of(&buf[14..f.captured]) else {
                continue;
            };
            if src == HOST_A && tcp[13] & 0x12 == 0x02 {
                frames.push(buf[..f.captured].to_vec());
            }
        }
        frames
    })
}

/// p0f's raw signature of every client SYN in `frames`, read back from a pcap file p0f reads
/// with `-r`: `6:64+1:0:1360:mss*10,7:mss,nop,nop,sok,nop,ws:flow:0` (ver, initial hop limit +
/// distance, IPv4 options, MSS, window and scale, option layout, quirks, payload class).
fn p0f_signatures(dir: &std::path::Path, name: &str, frames: &[Vec<u8>]) -> Vec<String> {
    let pcap = dir.join(format!("{name}.pcap"));
    let log = dir.join(format!("{name}.p0f"));
    // The classic pcap format: magic, version 2.4, zone, accuracy, snap length, Ethernet.
    let mut file = Vec::new();
    for word in [0xa1b2_c3d4u32, 0x0004_0002, 0, 0, 65_535, 1] {
        file.extend_from_slice(&word.to_le_bytes());
    }
    file[4..8].copy_from_slice(&[2, 0, 4, 0]);
    for (i, f) in frames.iter().enumerate() {
        for word in [1_000 + i as u32, 0, f.len() as u32, f.len() as u32] {
            file.extend_from_slice(&word.to_le_bytes());
        }
        file.extend_from_slice(f);
    }
    std::fs::write(&pcap, &file).expect("write pcap");
    let out = std::process::Command::new("p0f")
        .arg("-r")
        .arg(&pcap)
        .arg("-o")
        .arg(&log)
        .output()
        .expect("p0f runs (scripts/install-deps.sh installs it)");
    assert!(out.status.success(), "p0f: {out:?}");
    let text = std::fs::read_to_string(&log).expect("p0f log");
    text.lines()
        .filter(|l| l.contains("mod=syn|") && l.contains("subj=cli"))
        .filter_map(|l| l.split("raw_sig=").nth(1))
        .map(|s| s.split('|').next().unwrap_or(s).to_string())
        .collect()
}

/// The window scale of the first SYN from Host A's kernel that Host A's link shows.
fn linux_window_scale(c: &Client) -> u8 {
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut buf = [0u8; 2048];
    while Instant::now() < deadline {
        let Ok(Some(f)) = c.cap.recv(&mut buf) else {
            continue;
        };
        let Some((src, tcp)) = tcp_of(&buf[14..f.captured]) else {
            continue;
        };
        if src != HOST_A || tcp[13] & 0x12 != 0x02 {
            continue;
        }
        let scale =
            TcpOptions::new(&tcp[20..usize::from(tcp[12] >> 4) * 4], KINDS).find_map(|o| match o {
                Ok(l) => match l.option {
                    TcpOption::WindowScale(s) => Some(s),
                    _ => None,
                },
                Err(_) => None,
            });
        return scale.expect("Linux offers window scaling");
    }
    panic!("Host A's SYN not seen on its link");
}

fn sysctl(ns: &mt6d_os::Netns, settings: &[&str]) {
    for s in settings {
        let st = ns
            .command("sysctl")
            .expect("sysctl")
            .args(["-qw", s])
            .status()
            .expect("sysctl runs");
        assert!(st.success(), "sysctl -w {s}");
    }
}

#[test]
#[ignore = "needs root: network namespaces"]
fn normalised_syns_of_three_host_stacks_show_p0f_one_signature() {
    let a_extra: &'static str =
        Box::leak(format!("{TCP_KINDS}normalize = true\n").into_boxed_str());
    let running = start(Topology::Switched, a_extra, "");
    let lab = &running.lab;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen_a = capture_syn_frames(&lab.host_a, stop.clone());
    let seen_b = capture_syn_frames(&lab.host_b, stop.clone());
    let app = server(lab, stop.clone());
    let connect = |sport: u16| {
        lab.host_a
            .run(|| {
                use std::io::Write;
                let s = std::net::TcpStream::connect_timeout(
                    &(HOST_B, PORT).into(),
                    Duration::from_secs(3),
                )?;
                // One write, so one segment: the server reads each connection once, and
                // `write!` would send "hello from kernel " and the number apart.
                (&s).write_all(format!("hello from kernel {sport}").as_bytes())
            })
            .expect("enter A")
            .expect("Host A's kernel connects through the gateways");
    };
    // Host A's hand-made TCP (stack 3) reads Host A's link from here on.
    let c = client(lab);
    // Stack 1: Linux as it comes (timestamps, SACK, window scaling, hop limit 64, automatic
    // flow labels).
    connect(1);
    let linux_scale = linux_window_scale(&c);
    // Stack 2: the same kernel configured otherwise: no timestamps, hop limit 255, no flow
    // labels, a smaller receive buffer.
    sysctl(
        &lab.host_a,
        &[
            "net.ipv4.tcp_timestamps=0",
            "net.ipv6.auto_flowlabels=0",
            "net.ipv6.conf.all.hop_limit=255",
            &format!("net.ipv6.conf.{HOST_IF}.hop_limit=255"),
        ],
    );
    connect(2);
    // Stack 3: another system's SYN by hand: Windows' layout (mss,nop,ws,nop,nop,sok), MSS
    // 1440, window 64240, hop limit 128, no flow label, and a HOST_ID option the default policy
    // strips. Its window scale is the one Host A's Linux sent: the gateway does not rewrite
    // scale values (that needs per-flow state; docs/ARCHITECTURE.md), so a stack with another
    // one keeps its own.
    let mut syn = segment(
        43_000,
        0x2000_0000,
        0,
        0x02,
        &[
            2,
            4,
            0x05,
            0xa0,
            1,
            3,
            3,
            linux_scale,
            1,
            1,
            4,
            2,
            200,
            4,
            0x30,
            0x39,
        ],
        &[],
    );
    syn[54..56].copy_from_slice(&64_240u16.to_be_bytes());
    let c_sum = upper_layer_checksum(HOST_A, HOST_B, 6, &{
        let mut t = syn[40..].to_vec();
        t[16..18].fill(0);
        t
    });
    syn[56..58].copy_from_slice(&c_sum.to_be_bytes());
    syn[7] = 128;
    c.send(&syn);
    assert!(
        c.syn_ack(43_000, Duration::from_secs(3)).is_some(),
        "no SYN-ACK to the hand-built SYN"
    );
    std::thread::sleep(Duration::from_millis(300));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (seen_a, seen_b) = (
        seen_a.join().expect("capture A"),
        seen_b.join().expect("capture B"),
    );
    let got = app.join().expect("server");
    assert!(got.iter().any(|g| g == "hello from kernel 1"), "{got:?}");
    assert!(got.iter().any(|g| g == "hello from kernel 2"), "{got:?}");

    let before = p0f_signatures(&running.dir, "host-a", &seen_a);
    let after = p0f_signatures(&running.dir, "host-b", &seen_b);
    eprintln!("p0f on Host A's link: {before:#?}\np0f on Host B's link: {after:#?}");
    // Three stacks, three signatures where they leave Host A...
    let distinct = |v: &[String]| v.iter().collect::<std::collections::BTreeSet<_>>().len();
    assert!(before.len() >= 3, "{before:?}");
    assert_eq!(distinct(&before), 3, "{before:?}");
    // ...and one where they arrive: Linux without timestamps, hop limit 64 one hop away.
    assert!(after.len() >= 3, "{after:?}");
    assert_eq!(distinct(&after), 1, "{after:?}");
    let clamp = mt6d_proto::scrub::mss_for_mtu(status(&running, Side::A).path.tunnel_mtu as u16);
    let mss = clamp.min(1440);
    assert_eq!(
        after[0],
        format!("6:63+1:0:{mss}:mss*10,{linux_scale}:mss,nop,nop,sok,nop,ws:flow:0"),
    );
    let out = |e| event(&running, Side::A, "out", e);
    assert!(out("normalized") >= 3);
    // Stack 1's SYN (and a retransmit, if any).
    assert!(out("timestamps_removed") >= 1);
    assert_eq!(out("stripped"), 1);
}
