//! What the namespace end-to-end tests share: a lab with two running gateways, waiting for the
//! path, a TCP receiver, and reading a daemon's status. Each test binary under `tests/` that
//! needs a running lab declares `mod common;`.
#![allow(dead_code)] // each test binary uses its own part of this module

use std::net::Ipv6Addr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use mt6d::status::Status;
use mt6d_lab::daemon::DaemonProcess;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{GatewaySettings, Lab, LabKeys, Side, Topology, HOST_B};
use mt6d_lab::transfer;
use mt6d_os::Netns;

pub const MT6D: &str = env!("CARGO_BIN_EXE_mt6d");

/// The lab plus two running gateways. Fields drop in order: daemons first, then the lab, then
/// the turn.
pub struct Running {
    pub daemons: Vec<DaemonProcess>,
    pub lab: Lab,
    pub dir: PathBuf,
    pub _turn: std::sync::MutexGuard<'static, ()>,
}

/// Running labs take turns: the test harness runs tests on parallel threads, and two labs
/// pushing floods through four daemons on a 2-core machine at once starve each other's
/// packet threads (socket buffers overflow), which is not what a zero-loss test measures.
pub fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    // A test that panicked while holding it poisoned nothing but itself.
    TURN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Drop for Running {
    fn drop(&mut self) {
        for d in &mut self.daemons {
            let _ = d.stop(Duration::from_secs(5));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A train of `count` echoes from Host A to Host B, one every `interval`, each waited for up to
/// 2 s.
pub fn ping_train(lab: &Lab, count: u64, interval: Duration) -> mt6d_lab::ping::PingReport {
    lab.host_a
        .run(|| {
            ping(
                HOST_B,
                count,
                Pace::Train { interval },
                Duration::from_secs(2),
            )
        })
        .expect("enter A")
        .expect("ping")
}

/// The namespace tests need root. They are `#[ignore]`d, so a plain `cargo test` lists them as
/// ignored instead of passing them untested; `scripts/test.sh` (as root) runs them with
/// `--include-ignored`. Run without root, they fail here and say why.
pub fn require_root() {
    assert!(
        mt6d_lab::is_root(),
        "this test needs root (network namespaces, TUN devices, raw sockets): run it as root"
    );
}

/// Builds the lab and starts both gateways with `mode` and `rotation_secs`, with identity keys
/// and handshakes (a pre-shared key for `plain`, which cannot use handshakes).
pub fn start(mode: &str, rotation_secs: f64) -> Running {
    start_on(Topology::Switched, mode, rotation_secs, |_| {})
}

/// The switched lab with handshakes (or not) and a rekey interval.
pub fn start_keyed(mode: &str, rotation_secs: f64, handshake: bool, rekey: Option<f64>) -> Running {
    start_lab(
        Topology::Switched,
        mode,
        rotation_secs,
        (handshake, rekey),
        |_| {},
    )
}

/// Builds `topology`, lets `prepare` change it before the gateways read it, and starts both
/// gateways with `mode` and `rotation_secs` (handshakes unless `mode` is plain).
pub fn start_on(
    topology: Topology,
    mode: &str,
    rotation_secs: f64,
    prepare: impl FnOnce(&Lab),
) -> Running {
    start_lab(
        topology,
        mode,
        rotation_secs,
        (mode != "plain", None),
        prepare,
    )
}

pub fn start_lab(
    topology: Topology,
    mode: &str,
    rotation_secs: f64,
    (handshake, rekey): (bool, Option<f64>),
    prepare: impl FnOnce(&Lab),
) -> Running {
    let lab = Lab::build_topology(topology, "m6").expect("lab builds");
    prepare(&lab);
    start_gateways(lab, mode, rotation_secs, (handshake, rekey))
}

/// Starts the lab's two mt6d daemons (Gateway A, or Host A in a host-mode lab, and Gateway B).
pub fn start_gateways(
    lab: Lab,
    mode: &str,
    rotation_secs: f64,
    keying: (bool, Option<f64>),
) -> Running {
    start_gateways_with(lab, mode, rotation_secs, keying, |text| text)
}

/// [`start_gateways`], with `edit` applied to each gateway's configuration text before it is
/// written (a test that needs a setting the lab does not write).
pub fn start_gateways_with(
    lab: Lab,
    mode: &str,
    rotation_secs: f64,
    (handshake, rekey): (bool, Option<f64>),
    edit: impl Fn(String) -> String,
) -> Running {
    let dir = std::env::temp_dir().join(format!(
        "mt6d-e2e-{}-{}",
        std::process::id(),
        lab.gw_a.name()
    ));
    std::fs::create_dir_all(&dir).expect("test dir");
    let keys = LabKeys::generate(&dir, handshake, rekey).expect("keys");
    let settings = GatewaySettings {
        rotation_secs,
        mode,
        keys: &keys,
        workers: None,
    };
    let mut running = Running {
        daemons: Vec::new(),
        lab,
        dir,
        _turn: one_at_a_time(),
    };
    for (side, label) in [(Side::A, "A"), (Side::B, "B")] {
        let config = running.dir.join(format!("gw-{label}.toml"));
        let text = edit(running.lab.gateway_config(side, &settings));
        std::fs::write(&config, text).expect("config");
        let mut d = start_daemon(&running, side, label, &config);
        d.wait_ready(Duration::from_secs(10))
            .expect("gateway starts");
        running.daemons.push(d);
    }
    // The first packets wait for neighbour discovery on both links: set-up, not loss.
    wait_for_path(&running.lab, HOST_B, 1);
    running
}

/// Pings `dst` from Host A in rounds of `count` until one round is fully answered (at most
/// 10 s): the path is up, neighbour discovery included.
pub fn wait_for_path(lab: &Lab, dst: Ipv6Addr, count: u64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = lab
            .host_a
            .run(|| {
                ping(
                    dst,
                    count,
                    Pace::Flood {
                        wait: Duration::from_millis(500),
                    },
                    Duration::from_millis(300),
                )
            })
            .expect("enter host A")
            .expect("ping");
        if r.received == count {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "Host A never reached {dst} through the tunnel"
        );
    }
}

/// Host B listens on `port` and receives one TCP transfer (at most 10 s to connect) on a thread.
pub fn tcp_receiver(
    lab: &Lab,
    port: u16,
) -> std::thread::JoinHandle<std::io::Result<transfer::Received>> {
    let listener = lab
        .host_b
        .run(|| transfer::listen(HOST_B, port))
        .expect("enter B")
        .expect("listen");
    std::thread::spawn(move || transfer::serve_once(listener, Duration::from_secs(10)))
}

pub fn start_daemon(
    running: &Running,
    side: Side,
    label: &str,
    config: &std::path::Path,
) -> DaemonProcess {
    // The daemon under test is the binary cargo built for this test run.
    let log = running.dir.join(format!("gw-{label}.log"));
    let socket = running.lab.control_socket(side);
    let mut cmd = running
        .lab
        .gateway(side)
        .command(MT6D)
        .expect("command in namespace");
    cmd.arg("run").arg("-c").arg(config);
    DaemonProcess::spawn(label, cmd, &socket, &log).expect("spawn gateway")
}

pub fn status(running: &Running, side: Side) -> Status {
    let i = if side == Side::A { 0 } else { 1 };
    running.daemons[i].status().expect("status answers")
}

pub fn drops(st: &Status, reason: &str) -> u64 {
    st.peers[0].counters.drops.get(reason).copied().unwrap_or(0)
}

/// Reads kernel state with iproute2 (test-side inspection only; the daemon never runs `ip`).
pub fn ip_in(ns: &Netns, args: &[&str]) -> String {
    let out = ns
        .command("ip")
        .expect("command")
        .args(args)
        .output()
        .expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The relay lab's settings for the namespace tests: this build of `mt6d`, rotations every
/// `rotation_secs` with jitter, info logs.
pub fn relay_settings(rotation_secs: f64) -> mt6d_lab::relays::RelaySettings {
    mt6d_lab::relays::RelaySettings {
        rotation_secs,
        jitter: true,
        mt6d: PathBuf::from(MT6D),
        log_level: "info".into(),
        workers: None,
    }
}

/// Waits for `child` (its stdout and stderr piped) at most 20 s: (success, stdout + stderr).
/// Past the limit it is killed and the test fails, naming `what`.
pub fn output_within_20s(mut child: std::process::Child, what: &str) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("output");
            panic!(
                "{what} still running after 20 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// Command output as comparable lines: whitespace collapsed, address lifetimes (which count
/// down) cut off, empty lines dropped, sorted. For before-and-after pictures of a namespace.
pub fn sorted_lines(text: &str) -> Vec<String> {
    let mut v: Vec<String> = text
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .map(|l| l.split(" valid_lft").next().unwrap_or("").to_string())
        .filter(|l| !l.is_empty())
        .collect();
    v.sort();
    v
}

/// What arrived of one sequence-numbered UDP flow (its source port): datagrams, how many came
/// after a later one, repeats, the highest number seen.
#[derive(Debug, Default, Clone, Copy)]
pub struct FlowSeen {
    pub received: u32,
    pub out_of_order: u32,
    pub duplicates: u32,
    pub last: Option<u32>,
}

/// Receives sequence-numbered datagrams (a big-endian u32 first) on `rx` on a thread, until
/// `total` arrived or nothing came for `rx`'s read timeout: what arrived, per source port.
pub fn receive_sequenced(
    rx: std::net::UdpSocket,
    total: u32,
) -> std::thread::JoinHandle<std::collections::BTreeMap<u16, FlowSeen>> {
    std::thread::spawn(move || {
        let mut flows: std::collections::BTreeMap<u16, FlowSeen> = Default::default();
        let mut buf = [0u8; 2048];
        let mut got = 0;
        while got < total {
            let Ok((n, from)) = rx.recv_from(&mut buf) else {
                break;
            };
            let Some(seq) = buf[..n].get(..4) else {
                continue;
            };
            let seq = u32::from_be_bytes([seq[0], seq[1], seq[2], seq[3]]);
            let f = flows.entry(from.port()).or_default();
            match f.last {
                Some(last) if seq == last => f.duplicates += 1,
                Some(last) if seq < last => f.out_of_order += 1,
                _ => f.last = Some(seq),
            }
            f.received += 1;
            got += 1;
        }
        flows
    })
}

/// Sends `per_flow` rounds to `dst`, one every `every`: in each, a 300-byte datagram carrying
/// the round's number from every socket of `senders` (one flow each). Returns the seconds it
/// took.
pub fn send_sequenced(
    senders: &[std::net::UdpSocket],
    dst: std::net::SocketAddrV6,
    per_flow: u32,
    every: Duration,
) -> f64 {
    let started = Instant::now();
    let mut msg = [0u8; 300];
    for seq in 0..per_flow {
        let due = started + every * seq;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        msg[..4].copy_from_slice(&seq.to_be_bytes());
        for s in senders {
            s.send_to(&msg, dst).expect("send");
        }
    }
    started.elapsed().as_secs_f64()
}

/// Every one of `count` flows arrived whole: `per_flow` datagrams, none after a later one,
/// none twice.
pub fn assert_sequenced(
    flows: &std::collections::BTreeMap<u16, FlowSeen>,
    count: usize,
    per_flow: u32,
) {
    assert_eq!(flows.len(), count, "flows heard: {flows:?}");
    for (port, f) in flows {
        assert_eq!(
            f.received, per_flow,
            "flow from port {port} lost datagrams: {f:?}"
        );
        assert_eq!(f.out_of_order, 0, "flow from port {port} reordered: {f:?}");
        assert_eq!(f.duplicates, 0, "flow from port {port} duplicated: {f:?}");
    }
}

/// Runs a TCP transfer of `secs` from Host A to Host B (port `port`) and, at the same time, a
/// ping train of `pings` echoes every 100 ms; `during` runs on the test thread meanwhile.
pub fn transfer_and_pings<T: Send>(
    lab: &Lab,
    port: u16,
    secs: u64,
    pings: u64,
    during: impl FnOnce() -> T + Send,
) -> (transfer::TransferReport, mt6d_lab::ping::PingReport, T) {
    let listener = lab
        .host_b
        .run(|| transfer::listen(HOST_B, port))
        .expect("enter B")
        .expect("listen");
    let server =
        std::thread::spawn(move || transfer::serve_once(listener, Duration::from_secs(10)));
    let (tcp, p, t) = std::thread::scope(|s| {
        let pinger = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        pings,
                        Pace::Train {
                            interval: Duration::from_millis(100),
                        },
                        Duration::from_secs(2),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        let tcp = s.spawn(|| {
            lab.host_a
                .run(|| transfer::send_for(HOST_B, port, Duration::from_secs(secs), 7))
                .expect("enter A")
                .expect("transfer")
        });
        let t = during();
        (
            tcp.join().expect("tcp thread"),
            pinger.join().expect("pinger"),
            t,
        )
    });
    server.join().expect("server thread").expect("receiver");
    (tcp, p, t)
}

/// The handshake state of the daemon's first peer (which must use handshakes).
pub fn handshake_of(st: &Status) -> mt6d::status::HandshakeStatus {
    st.peers[0].handshake.clone().expect("peer uses handshakes")
}

/// Start-up (packets before the first handshake, both sides initiating at once, retries of
/// those still in flight) is not what the drop-counting tests measure: waits until both sides
/// hold keys and two retry intervals have passed for late start-up messages.
pub fn settle_handshakes(running: &Running) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while ![Side::A, Side::B]
        .iter()
        .all(|s| handshake_of(&status(running, *s)).has_keys)
    {
        assert!(Instant::now() < deadline, "no keys 5 s after start");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(mt6d_proto::handshake::RETRY_AFTER * 2);
}

/// Whether the Ethernet frame `f` carries IPv6 UDP with a tunnel payload. Frame layout:
/// Ethernet [0..14], IPv6 [14..54], UDP header [54..62], tunnel payload [62..].
pub fn is_udp6(f: &[u8]) -> bool {
    f.len() > 62 && f[12..14] == [0x86, 0xdd] && f[14 + 6] == 17
}
