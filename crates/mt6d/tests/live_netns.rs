//! Live configuration over the control socket, end to end in network
//! namespaces (root; CI runs as root): `mt6d peer add` on both gateways opens a second
//! conversation (Host A with Host C behind Gateway B) that carries traffic, `mt6d peer remove`
//! closes it again, and the first conversation's ping train loses nothing throughout; invalid
//! changes are refused whole with an error that names the peer and the setting; `mt6d reload`
//! returns a daemon to its file (peer changes are runtime only); `mt6d status` with no socket
//! lists every running daemon; the control socket answers no other user even when its mode
//! would let one connect.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use mt6d_lab::ping::{ping, Pace, PingReport};
use mt6d_lab::topology::{Lab, Side, EXTERNAL_IF, HOST_A, HOST_B};
use mt6d_lab::unlinkability::HOST_C;

mod common;
use common::*;

/// `mt6d ARGS` from the test's own namespace (the control socket is a path: reachable from
/// anywhere); (success, standard output and error).
fn mt6d(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(MT6D)
        .args(args)
        .output()
        .expect("run mt6d");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn psk(dir: &Path) -> PathBuf {
    let path = dir.join("second.psk");
    let _ = std::fs::remove_file(&path);
    let (ok, out) = mt6d(&["genpsk", "-o", path.to_str().expect("utf-8")]);
    assert!(ok, "{out}");
    path
}

/// The quoted value of `key = "..."` in the lab's `[[peer]]`, if it has one.
fn peer_value(config: &Path, key: &str) -> Option<String> {
    let text = std::fs::read_to_string(config).expect("config");
    let block = &text[text.find("[[peer]]").expect("a [[peer]]")..];
    block.lines().find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim().trim_matches('"').to_string())
    })
}

fn train(lab: &Lab, dst: Ipv6Addr, count: u64, interval_ms: u64) -> PingReport {
    lab.host_a
        .run(|| {
            ping(
                dst,
                count,
                Pace::Train {
                    interval: Duration::from_millis(interval_ms),
                },
                Duration::from_secs(2),
            )
        })
        .expect("enter A")
        .expect("ping")
}

fn routes(lab: &Lab, side: Side) -> String {
    ip_in(lab.gateway(side), &["-6", "route", "show", "table", "all"])
}

/// Peers named in gateway `side`'s instance record (what other daemons' conflict checks see).
fn recorded_peers(running: &Running, side: Side) -> Vec<String> {
    let cookie = running
        .lab
        .gateway(side)
        .run(mt6d_os::current_cookie)
        .expect("enter")
        .expect("cookie");
    let path = Path::new("/run/mt6d").join(format!("{cookie:016x}-mt6d0.json"));
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("record")).expect("JSON");
    v["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .map(|p| p["name"].as_str().expect("name").to_string())
        .collect()
}

/// Routes without the local-table entries of the hashed addresses, which rotate.
fn stable(routes: &str) -> Vec<&str> {
    routes
        .lines()
        .filter(|r| {
            !(r.starts_with("local 2001:db8:") && r.contains(&format!(" dev {EXTERNAL_IF} ")))
        })
        .collect()
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within 5 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn peer_added_and_removed_live_while_the_other_peer_loses_nothing() {
    common::require_root();
    let running = start("encrypt", 1.0);
    let lab = &running.lab;
    ip_in(
        &lab.host_b,
        &[
            "-6",
            "addr",
            "add",
            &format!("{HOST_C}/64"),
            "dev",
            "eth0",
            "nodad",
        ],
    );
    let key = psk(&running.dir);
    let key = key.to_str().expect("utf-8").to_string();
    let sockets: Vec<String> = [Side::A, Side::B]
        .iter()
        .map(|s| lab.control_socket(*s).display().to_string())
        .collect();
    // The second peer's hashed prefixes are the first one's (the lab may leave them to the
    // default, the /64 of each true address, which is the same /64 here).
    let prefixes: Vec<Vec<String>> = ["A", "B"]
        .iter()
        .map(|l| {
            let config = running.dir.join(format!("gw-{l}.toml"));
            let mut args = Vec::new();
            for key in ["local_prefix", "remote_prefix"] {
                if let Some(v) = peer_value(&config, key) {
                    args.push(format!("--{}", key.replace('_', "-")));
                    args.push(v);
                }
            }
            args
        })
        .collect();
    let add = |i: usize, name: &str, remote_host: &str| {
        let (local, remote) = if i == 0 {
            (HOST_A.to_string(), remote_host.to_string())
        } else {
            (HOST_C.to_string(), HOST_A.to_string())
        };
        let mut args = vec![
            "peer",
            "add",
            name,
            "-s",
            &sockets[i],
            "--local-host",
            &local,
            "--remote-host",
            &remote,
            "--key-file",
            &key,
        ];
        args.extend(prefixes[i].iter().map(String::as_str));
        mt6d(&args)
    };
    let routes_before = routes(lab, Side::A);
    let pids: Vec<u32> = [Side::A, Side::B]
        .iter()
        .map(|s| status(&running, *s).pid)
        .collect();

    let (pings, to_c) = std::thread::scope(|s| {
        let pinger = s.spawn(|| train(lab, HOST_B, 150, 100));
        std::thread::sleep(Duration::from_millis(500));

        // Invalid: refused whole, with the peer and the setting named, and nothing changes.
        let (ok, out) = add(0, "second", "2001:db8:1::zz");
        assert!(!ok, "an invalid address was accepted: {out}");
        assert!(
            out.contains("refused, nothing changed")
                && out.contains("peer \"second\": `remote_host = \"2001:db8:1::zz\"`")
                && out.contains("not an IPv6 address"),
            "{out}"
        );
        // The same conversation as the running peer: refused, naming the new peer.
        let (ok, out) = add(0, "second", &HOST_B.to_string());
        assert!(!ok && out.contains("peer \"second\""), "{out}");
        // A batch with one bad removal: the good removal in it is not made either.
        let (ok, out) = mt6d(&["peer", "remove", "far", "nosuch", "-s", &sockets[0]]);
        assert!(!ok && out.contains("no peer named \"nosuch\""), "{out}");
        assert_eq!(status(&running, Side::A).peers.len(), 1, "half applied");

        // Valid, on both gateways.
        for i in 0..2 {
            let (ok, out) = add(i, "second", &HOST_C.to_string());
            assert!(ok, "gateway {i}: {out}");
            assert!(
                out.contains("added second") && out.contains("runtime only"),
                "{out}"
            );
        }
        wait_for_path(lab, HOST_C, 3);
        let to_c = train(lab, HOST_C, 20, 50);
        assert_eq!(recorded_peers(&running, Side::A), ["far", "second"]);
        let a_routes = routes(lab, Side::A);
        assert!(
            a_routes.contains(&format!("{HOST_C} dev mt6d0 "))
                && a_routes.contains(&format!("prohibit {HOST_C} ")),
            "no route for Host C into the TUN device, or no guard:\n{a_routes}"
        );

        // A change to the new peer that the parser refuses leaves it running as it was.
        let (ok, out) = mt6d(&[
            "peer",
            "set",
            "second",
            "-s",
            &sockets[0],
            "--mode",
            "bogus",
        ]);
        assert!(
            !ok && out.contains("peer \"second\": `mode = \"bogus\"`"),
            "{out}"
        );

        // Every running daemon is listed without naming a socket (others may run too).
        let (ok, out) = mt6d(&["status"]);
        assert!(ok, "{out}");
        for (pid, socket) in pids.iter().zip(&sockets) {
            assert!(
                out.contains(&format!("== mt6d pid {pid}: "))
                    && out.contains(&format!("(control socket {socket})")),
                "pid {pid} not listed:\n{out}"
            );
        }
        let (ok, out) = mt6d(&["status", "--json"]);
        assert!(ok, "{out}");
        let listed: Vec<serde_json::Value> = serde_json::from_str(&out).expect("a JSON list");
        let ours = listed
            .iter()
            .find(|d| d["pid"] == pids[0])
            .expect("gateway A listed");
        assert_eq!(ours["status"]["peers"].as_array().map(Vec::len), Some(2));

        for socket in &sockets {
            let (ok, out) = mt6d(&["peer", "remove", "second", "-s", socket]);
            assert!(ok && out.contains("removed second"), "{out}");
        }
        (pinger.join().expect("pinger"), to_c)
    });
    eprintln!(
        "existing peer through add and remove: {} of {} answered; added peer: {} of {}",
        pings.received, pings.sent, to_c.received, to_c.sent
    );
    assert_eq!(pings.received, pings.sent, "the existing peer lost pings");
    assert_eq!(to_c.received, to_c.sent, "the added peer lost pings");
    assert_eq!(recorded_peers(&running, Side::A), ["far"]);
    let c = format!("{HOST_C} ");
    wait_until("Host C's route, guard and proxy entry gone", || {
        !routes(lab, Side::A).contains(&c)
            && !ip_in(lab.gateway(Side::A), &["-6", "neigh", "show", "proxy"]).contains(&c)
    });
    assert_eq!(
        stable(&routes(lab, Side::A)),
        stable(&routes_before),
        "routes after the removal"
    );
    for side in [Side::A, Side::B] {
        assert_eq!(status(&running, side).peers.len(), 1);
    }

    // Runtime only: a reload returns to the file, which has no peer "second".
    let (ok, out) = add(0, "second", &HOST_C.to_string());
    assert!(ok, "{out}");
    let (ok, out) = mt6d(&["reload", "-s", &sockets[0]]);
    assert!(ok && out.contains("removed second"), "{out}");
    let (ok, out) = mt6d(&["reload", "-s", &sockets[0]]);
    assert!(ok && out.contains("nothing changed"), "{out}");
    assert_eq!(status(&running, Side::A).peers.len(), 1);
}

/// Only root and the daemon's user may use the control socket: with its mode opened to
/// everyone, another user still gets a refusal (SO_PEERCRED), and changes nothing.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn control_socket_refuses_other_users_whatever_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    common::require_root();
    let running = start("encrypt", 1.0);
    let socket = running.lab.control_socket(Side::A);
    let mode = std::fs::metadata(&socket)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600, "created for its owner only");
    std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    // The daemon keeps its directory 0700, which alone keeps other users out; open it too, so
    // that what refuses them below is the daemon's own credential check.
    let dir = socket.parent().expect("socket directory").to_path_buf();
    let dir_mode = std::fs::metadata(&dir)
        .expect("directory")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode & 0o077, 0, "{}: mode {dir_mode:o}", dir.display());
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o711)).expect("chmod dir");
    for args in [
        vec!["status", "-s", socket.to_str().expect("utf-8")],
        vec![
            "peer",
            "remove",
            "far",
            "-s",
            socket.to_str().expect("utf-8"),
        ],
    ] {
        let out = std::process::Command::new(MT6D)
            .args(&args)
            .uid(65534)
            .gid(65534)
            .output()
            .expect("run as nobody");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} answered for uid 65534");
        assert!(
            text.contains("permission denied: uid 65534"),
            "{args:?}: {text}"
        );
    }
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(dir_mode)).expect("chmod dir");
    assert_eq!(status(&running, Side::A).peers.len(), 1);
}
