//! A clean stop fails closed too, end to end in network namespaces (root; CI runs as root).
//!
//! A sender on the protected side sends a datagram every 20 ms throughout, while the daemon is
//! stopped with SIGTERM (`systemctl stop`), left stopped, started again (`systemctl restart`),
//! then stopped and started from another copy of the binary (a package upgrade). A capture on
//! the public link counts every frame that carries a true address or the sender's payload: it
//! must count none. Between a stop and the next start only the fail-closed guards keep the
//! protected side's packets off the public link, so the stop must leave them in place (and the
//! next start adopt them); `mt6d down -c FILE` lifts them.
//!
//! Each role is set up the way it is most exposed: the gateway is a router (forwarding on
//! before mt6d starts, a default route to an upstream router on the public link), the host and
//! the server have a default route on their external link.
//!
//! Run: `cargo test --release -p mt6d --test clean_stop_netns -- --include-ignored --nocapture`.

use std::net::{Ipv6Addr, SocketAddrV6, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use mt6d_lab::daemon::DaemonProcess;
use mt6d_lab::server_lab::{ServerLab, SERVER_IF, SERVER_TRUE};
use mt6d_lab::topology::{Lab, Side, Topology, EXTERNAL_IF, HOST_A, HOST_B};
use mt6d_os::capture::PacketCapture;
use mt6d_os::{unique_name, Netns};

mod common;
use common::*;

/// What the protected side sends: recognisable in any frame that carries it in clear.
const PAYLOAD: &[u8] = b"mt6d-protected-payload-never-in-clear";

/// Counts frames on the public link that carry a true address or [`PAYLOAD`].
struct Watch {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<(u64, u64, Option<String>)>,
}

impl Watch {
    fn start(ns: &Netns, iface: &str, true_addrs: &[Ipv6Addr]) -> Watch {
        let cap = ns
            .run(|| PacketCapture::open(iface, 512, Duration::from_millis(50)))
            .expect("enter")
            .expect("capture on the public link");
        let mut needles: Vec<Vec<u8>> = true_addrs.iter().map(|a| a.octets().to_vec()).collect();
        needles.push(PAYLOAD.to_vec());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut buf = vec![0u8; 600];
            let (mut frames, mut clear, mut first) = (0u64, 0u64, None);
            while !flag.load(Ordering::Relaxed) {
                let Some(f) = cap.recv(&mut buf).expect("capture") else {
                    continue;
                };
                frames += 1;
                let b = &buf[..f.captured];
                if let Some(n) = needles
                    .iter()
                    .find(|n| b.windows(n.len()).any(|w| w == &n[..]))
                {
                    clear += 1;
                    if first.is_none() {
                        first = Some(format!(
                            "frame {frames} ({} bytes) carries {}",
                            f.wire_len,
                            if n.len() == 16 {
                                let o: [u8; 16] = n[..].try_into().expect("16 bytes");
                                Ipv6Addr::from(o).to_string()
                            } else {
                                "the payload".into()
                            }
                        ));
                    }
                }
            }
            (frames, clear, first)
        });
        Watch { stop, thread }
    }

    /// (frames seen, frames in clear, the first one described).
    fn finish(self) -> (u64, u64, Option<String>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("capture thread")
    }
}

/// Sends [`PAYLOAD`] to `dst` every 20 ms from a socket of `ns` until stopped; counts sends the
/// kernel took and sends it refused (the guard answers EACCES on the sending host itself).
struct Sender {
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    thread: JoinHandle<u64>,
}

impl Sender {
    fn start(ns: &Netns, dst: SocketAddrV6) -> Sender {
        let sock = ns
            .run(|| UdpSocket::bind("[::]:0"))
            .expect("enter")
            .expect("udp socket");
        let stop = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let (flag, count) = (stop.clone(), sent.clone());
        let thread = std::thread::spawn(move || {
            let mut refused = 0;
            while !flag.load(Ordering::Relaxed) {
                match sock.send_to(PAYLOAD, dst) {
                    Ok(_) => {
                        count.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(_) => refused += 1,
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            refused
        });
        Sender { stop, sent, thread }
    }

    /// (sends taken, sends refused).
    fn finish(self) -> (u64, u64) {
        self.stop.store(true, Ordering::Relaxed);
        let refused = self.thread.join().expect("sender thread");
        (self.sent.load(Ordering::Relaxed), refused)
    }
}

/// A copy of the binary under test, as a package upgrade puts a new one in place.
fn upgraded_binary(dir: &Path) -> PathBuf {
    let path = dir.join("mt6d-upgraded");
    std::fs::copy(MT6D, &path).expect("copy the binary");
    path
}

fn routes(ns: &Netns) -> String {
    ip_in(ns, &["-6", "route", "show"])
}

/// Starts `binary run -c config` in `ns` as daemon `label`, answering on `socket`.
fn spawn(ns: &Netns, binary: &Path, config: &Path, socket: &Path, log: &Path) -> DaemonProcess {
    let mut cmd = ns.command(binary).expect("command");
    cmd.arg("run").arg("-c").arg(config);
    DaemonProcess::spawn("A", cmd, socket, log).expect("spawn")
}

/// The gateway and host roles: stop, stay stopped, restart, upgrade, with `sender` sending on
/// the protected side and `watch` on the public link; the guard for Host B must be in place
/// whenever the daemon is stopped. Returns the watch's counts.
fn stop_restart_upgrade(running: &mut Running, sender_ns: &Netns) -> (u64, u64, Option<String>) {
    let config = running.dir.join("gw-A.toml");
    let socket = running.lab.control_socket(Side::A);
    let upgraded = upgraded_binary(&running.dir);
    let watch = Watch::start(&running.lab.gw_a, EXTERNAL_IF, &[HOST_A, HOST_B]);
    let sender = Sender::start(sender_ns, SocketAddrV6::new(HOST_B, 9, 0, 0));
    std::thread::sleep(Duration::from_millis(500));
    let mut stopped_guard = Vec::new();
    for (round, binary) in [(1, Path::new(MT6D)), (2, upgraded.as_path())] {
        running.daemons[0]
            .stop(Duration::from_secs(10))
            .expect("clean stop");
        // Stopped for a second, as a restart or an upgrade leaves the gateway for a moment.
        std::thread::sleep(Duration::from_secs(1));
        stopped_guard.push(routes(&running.lab.gw_a).contains(&format!("prohibit {HOST_B} ")));
        let log = running.dir.join(format!("gw-A-{round}.log"));
        running.daemons[0] = spawn(&running.lab.gw_a, binary, &config, &socket, &log);
        running.daemons[0]
            .wait_ready(Duration::from_secs(15))
            .expect("starts again");
        wait_for_path(&running.lab, HOST_B, 1);
        std::thread::sleep(Duration::from_millis(500));
    }
    let (sent, refused) = sender.finish();
    let seen = watch.finish();
    eprintln!(
        "stop, restart, upgrade: {sent} datagrams taken, {refused} refused by the sending host; public link: {} frames, {} in clear (first: {:?}); guard while stopped: {stopped_guard:?}",
        seen.0, seen.1, seen.2
    );
    assert!(sent + refused > 100, "the sender sent throughout");
    assert!(seen.0 > 0, "the capture saw the public link");
    assert!(
        stopped_guard.iter().all(|g| *g),
        "a clean stop took the guard for {HOST_B} away: {stopped_guard:?}"
    );
    seen
}

/// `mt6d down -c FILE` in `ns` lifts what a clean stop left (the guards): true on success.
fn down(ns: &Netns, config: &Path) -> (bool, String) {
    let child = ns
        .command(MT6D)
        .expect("command")
        .arg("down")
        .arg("-c")
        .arg(config)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn mt6d down");
    output_within_20s(child, "mt6d down")
}

/// The gateway as a router (forwarding on before mt6d started, a default route to the upstream
/// router on the public link, here Gateway B, which forwards anything it gets): SIGTERM, a
/// restart and an upgrade put no frame in clear; the guard stays while it is stopped, and
/// `mt6d down` lifts it and leaves nothing of mt6d.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn gateway_router_stop_restart_and_upgrade_put_nothing_in_clear() {
    require_root();
    let mut running = start_lab(
        Topology::Switched,
        "encrypt",
        1.0,
        (true, None),
        |lab: &Lab| {
            lab.add_public_addresses().expect("public addresses");
            lab.gw_a
                .run(|| mt6d_os::sysctl::set_ipv6_conf("all", "forwarding", "1"))
                .expect("enter")
                .expect("forwarding on: a router");
            let via = lab.public_b.addr.to_string();
            ip_in(
                &lab.gw_a,
                &[
                    "-6",
                    "route",
                    "add",
                    "default",
                    "via",
                    &via,
                    "dev",
                    EXTERNAL_IF,
                ],
            );
            assert!(
                routes(&lab.gw_a).contains("default via"),
                "premise: a default route upstream"
            );
        },
    );
    let host_a = running.lab.host_a.name().to_string();
    let host_a = Netns::open(&host_a).expect("host A");
    let (_, clear, first) = stop_restart_upgrade(&mut running, &host_a);
    assert_eq!(
        clear, 0,
        "a clean stop, restart or upgrade put frames in clear on the public link (first: {first:?})"
    );
    running.daemons[0]
        .stop(Duration::from_secs(10))
        .expect("clean stop");
    let config = running.dir.join("gw-A.toml");
    let (ok, out) = down(&running.lab.gw_a, &config);
    assert!(ok, "mt6d down: {out}");
    let left = routes(&running.lab.gw_a);
    assert!(
        !left.contains("prohibit") && !left.contains("proto 109"),
        "mt6d down left routes:\n{left}"
    );
}

/// Host mode with a default route on the external link: stop, restart and upgrade put no frame
/// in clear; while stopped, the application's sends to the peer are refused by its own kernel.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn host_mode_stop_restart_and_upgrade_put_nothing_in_clear() {
    require_root();
    let lab = Lab::build_host_mode(Topology::Switched, "m6").expect("host-mode lab builds");
    lab.add_public_addresses().expect("public addresses");
    let via = lab.public_b.addr.to_string();
    ip_in(
        &lab.gw_a,
        &[
            "-6",
            "route",
            "add",
            "default",
            "via",
            &via,
            "dev",
            EXTERNAL_IF,
        ],
    );
    let mut running = start_gateways(lab, "encrypt", 1.0, (true, None));
    let host_a = Netns::open(running.lab.host_a.name()).expect("host A");
    let (_, clear, first) = stop_restart_upgrade(&mut running, &host_a);
    assert_eq!(
        clear, 0,
        "a clean stop, restart or upgrade put frames in clear on the public link (first: {first:?})"
    );
}

/// The server: its own application (the protected side) sends to a client's true address every
/// 20 ms through a stop, a restart and an upgrade; nothing leaves in clear, and the guards for
/// the client routes are in place whenever it is stopped. `mt6d down` lifts them.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn server_stop_restart_and_upgrade_put_nothing_in_clear() {
    require_root();
    let _turn = one_at_a_time();
    let lab = ServerLab::build("m6c").expect("server lab");
    let dir = std::env::temp_dir().join(unique_name("mt6d-stop-server"));
    std::fs::create_dir_all(&dir).expect("dir");
    let spec = ServerLab::spec(1, Duration::from_secs(1), true);
    {
        use std::os::unix::fs::PermissionsExt;
        let mut text = String::new();
        for i in 0..10 {
            text.push_str(&spec.peers_line(&format!("c1-{i}"), i));
        }
        let peers = dir.join("clients");
        std::fs::write(&peers, text).expect("peers file");
        std::fs::set_permissions(&peers, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    }
    let config = dir.join("server.toml");
    std::fs::write(
        &config,
        ServerLab::server_config(1.0, 1, &dir.join("state")),
    )
    .expect("config");
    let upgraded = upgraded_binary(&dir);
    let client = spec.true_addr(3);
    let start = |binary: &Path, round: usize| {
        let log = dir.join(format!("server-{round}.log"));
        let d = spawn(&lab.server, binary, &config, &dir.join("none.sock"), &log);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("serving 10 clients")
        {
            assert!(
                Instant::now() < deadline,
                "server did not start:\n{}",
                d.log_tail(20)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    };
    let mut daemon = start(Path::new(MT6D), 0);
    let watch = Watch::start(&lab.server, SERVER_IF, &[client, SERVER_TRUE]);
    let sender = Sender::start(&lab.server, SocketAddrV6::new(client, 9, 0, 0));
    std::thread::sleep(Duration::from_millis(500));
    let guard = "prohibit 2001:db8:c1:1::/64";
    let mut stopped_guard = Vec::new();
    for (round, binary) in [(1, Path::new(MT6D)), (2, upgraded.as_path())] {
        daemon.stop(Duration::from_secs(10)).expect("clean stop");
        std::thread::sleep(Duration::from_secs(1));
        stopped_guard.push(routes(&lab.server).contains(guard));
        daemon = start(binary, round);
        std::thread::sleep(Duration::from_millis(500));
    }
    let (sent, refused) = sender.finish();
    let (frames, clear, first) = watch.finish();
    eprintln!(
        "server stop, restart, upgrade: {sent} datagrams taken, {refused} refused; public link: {frames} frames, {clear} in clear (first: {first:?}); guard while stopped: {stopped_guard:?}"
    );
    assert!(sent + refused > 100, "the sender sent throughout");
    assert!(
        stopped_guard.iter().all(|g| *g),
        "a clean stop took the guard away: {stopped_guard:?}"
    );
    assert_eq!(
        clear, 0,
        "a clean stop, restart or upgrade put frames in clear on the public link (first: {first:?})"
    );
    daemon.stop(Duration::from_secs(10)).expect("clean stop");
    let (ok, out) = down(&lab.server, &config);
    assert!(ok, "mt6d down: {out}");
    assert!(
        !routes(&lab.server).contains("prohibit"),
        "mt6d down left the guards"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
