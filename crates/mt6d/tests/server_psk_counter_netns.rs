//! The server's send counters under pre-shared client keys (docs/PROTOCOL.md §4.3), end to end
//! in network namespaces (root; CI runs as root): no operator action may make the server seal a
//! counter it used before under an unchanged key. The client side keeps one replay window per
//! client for the whole test, as a real client does, so a repeated counter shows as an answer
//! that does not open (`rejected`) instead of an answer.
//!
//! Checked, for one client: answers open before, after the client is removed and added again
//! live (SIGHUP), after it is renamed, and after the server is restarted with another TUN
//! device name on the same state directory.
//!
//! Run: `cargo test --release -p mt6d --test server_psk_counter_netns -- --include-ignored --nocapture`.

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mt6d::daemon::clock;
use mt6d_lab::clients::{echo_service, ClientSet, ClientSpec, Reply};
use mt6d_lab::daemon::DaemonProcess;
use mt6d_lab::server_lab::{ServerLab, ECHO_PORT, SERVER_TRUE};
use mt6d_os::{unique_name, Netns};

const CLIENT_RX_PORT: u16 = 7421;
const CLIENTS: usize = 8;
/// The client whose counters are followed.
const WHO: usize = 3;

fn spec() -> ClientSpec {
    ServerLab::spec(1, Duration::from_secs(1), true)
}

/// The peers file: clients 0..CLIENTS of namespace 1, client [`WHO`] named `who` (or left out).
fn peers_file(path: &Path, who: Option<&str>) {
    use std::os::unix::fs::PermissionsExt;
    let s = spec();
    let mut text = String::new();
    for i in 0..CLIENTS {
        match (i, who) {
            (WHO, None) => {}
            (WHO, Some(name)) => text.push_str(&s.peers_line(name, i)),
            _ => text.push_str(&s.peers_line(&format!("c1-{i}"), i)),
        }
    }
    std::fs::write(path, text).expect("peers file");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
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

fn start(server: &Netns, dir: &Path, tun: &str, clients: usize) -> DaemonProcess {
    let path = dir.join("server.toml");
    let config = format!(
        "{}tun_name = \"{tun}\"\n",
        ServerLab::server_config(1.0, 2, &dir.join("state"))
    );
    std::fs::write(&path, config).expect("config");
    let mut cmd = server.command(common::MT6D).expect("command");
    cmd.arg("run").arg("-c").arg(&path);
    let daemon = DaemonProcess::spawn(
        "server",
        cmd,
        &dir.join("none.sock"),
        &dir.join(format!("server-{tun}.log")),
    )
    .expect("start server");
    wait_log(
        &daemon,
        &format!("serving {clients} clients"),
        1,
        Duration::from_secs(30),
    );
    daemon
}

fn reload(daemon: &DaemonProcess, times: usize) {
    let pid = daemon.pid().expect("running");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    wait_log(daemon, "reloaded", times, Duration::from_secs(10));
}

/// Client [`WHO`] sends `n` requests and waits for the answers; returns how many came.
fn requests(set: &mut ClientSet, spec: &ClientSpec, n: usize) -> usize {
    let mut replies: Vec<Reply> = Vec::new();
    for round in 0..n {
        set.step(clock::now());
        let payload = format!("req {WHO} {round} ................................");
        set.send(spec, WHO, ECHO_PORT, payload.as_bytes())
            .expect("send");
        std::thread::sleep(Duration::from_millis(20));
        set.recv(&mut replies).expect("recv");
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while replies.len() < n && Instant::now() < deadline {
        set.step(clock::now());
        set.recv(&mut replies).expect("recv");
        std::thread::sleep(Duration::from_millis(5));
    }
    replies.len()
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn no_operator_action_makes_the_server_seal_a_counter_again() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = ServerLab::build("m6k").expect("lab");
    let (server, c1) = (&lab.server, &lab.clients[0]);
    let dir = std::env::temp_dir().join(unique_name("m6kc"));
    std::fs::create_dir_all(&dir).expect("dir");
    let peers = dir.join("clients");
    peers_file(&peers, Some("who"));
    let mut daemon = start(server, &dir, "mt6ds0", CLIENTS);
    let stop = Arc::new(AtomicBool::new(false));
    let echo = echo_service(server, SERVER_TRUE, ECHO_PORT, 1, stop.clone()).expect("echo");
    let s = spec();
    const N: usize = 5;

    let (steps, counters) = c1
        .run(|| {
            let _t = ClientSet::install(&s, "m6k_c1", CLIENT_RX_PORT).expect("client namespace");
            // One set for the whole test: its replay windows remember every counter opened.
            let mut set =
                ClientSet::new(&s, CLIENTS, CLIENT_RX_PORT, clock::now()).expect("clients");
            let mut steps = Vec::new();
            steps.push(("first", requests(&mut set, &s, N)));
            // `mt6d peer remove` + `peer add` in file form: removed, reloaded, added back.
            peers_file(&peers, None);
            reload(&daemon, 1);
            peers_file(&peers, Some("who"));
            reload(&daemon, 2);
            steps.push(("removed and added again", requests(&mut set, &s, N)));
            // The same key under another name.
            peers_file(&peers, Some("renamed"));
            reload(&daemon, 3);
            steps.push(("renamed", requests(&mut set, &s, N)));
            // A restart with another TUN device name on the same state directory.
            daemon.stop(Duration::from_secs(10)).expect("clean stop");
            let again = start(server, &dir, "mt6ds7", CLIENTS);
            daemon = again;
            steps.push(("restarted as mt6ds7", requests(&mut set, &s, N)));
            (steps, set.counters)
        })
        .expect("enter client namespace");
    stop.store(true, Ordering::Relaxed);
    let _ = echo.join();
    daemon.stop(Duration::from_secs(10)).expect("clean stop");
    println!("{steps:?} {counters:?}");
    for (step, answered) in &steps {
        assert_eq!(
            *answered, N,
            "{step}: {answered} of {N} answers opened ({counters:?}); a refused answer is a counter the server sealed before"
        );
    }
    assert_eq!(counters.rejected, 0, "{counters:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
