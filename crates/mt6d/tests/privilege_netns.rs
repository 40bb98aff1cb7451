//! Least privilege, end to end in network namespaces (root; CI runs as root):
//! `mt6d run` as an ordinary user holding exactly CAP_NET_ADMIN and CAP_NET_RAW carries
//! traffic, and without them refuses before touching anything.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use mt6d_lab::daemon::DaemonProcess;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{GatewaySettings, Lab, LabKeys, Side, Topology, HOST_B};

mod common;
use common::*;

/// The user the daemon runs as: `nobody`, which owns nothing on this machine.
const UID: u32 = 65534;

/// util-linux's setpriv: switch to `UID`, drop every group, and keep `caps` (e.g.
/// "+net_admin,+net_raw", or "-all") as inheritable and ambient, so they survive the exec.
///
/// With `tun_node`, first (as root, in a mount namespace of its own) that node is bound over
/// `/dev/net/tun`: udev makes the TUN device 0666 on the usual distributions, but a machine
/// (or container) may have it 0600, and the daemon's user needs to open it (docs/CONFIG.md).
/// The machine's own node is left as it is.
fn unprivileged(
    lab: &Lab,
    caps: &str,
    config: &Path,
    tun_node: Option<&Path>,
) -> std::process::Command {
    let mut cmd = match tun_node {
        Some(node) => {
            let mut c = lab.gw_a.command("unshare").expect("command in namespace");
            c.args(["--mount", "--propagation", "private", "--", "sh", "-c"])
                .arg("mount --bind \"$0\" /dev/net/tun && exec \"$@\"")
                .arg(node)
                .arg("setpriv");
            c
        }
        None => lab.gw_a.command("setpriv").expect("command in namespace"),
    };
    cmd.arg(format!("--reuid={UID}"))
        .arg(format!("--regid={UID}"))
        .arg("--clear-groups")
        .arg(format!("--inh-caps={caps}"))
        .arg(format!("--ambient-caps={caps}"))
        .arg("--")
        .arg(MT6D)
        .arg("run")
        .arg("-c")
        .arg(config);
    cmd
}

fn chown(path: &Path) {
    std::os::unix::fs::chown(path, Some(UID), Some(UID)).expect("chown to the daemon's user");
}

/// `Uid:` and `CapEff:` of the process whose command line names `config`.
fn uid_and_caps_of(config: &Path) -> Option<(String, String)> {
    let needle = config.to_string_lossy().into_owned();
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let dir = entry.path();
        let Ok(cmdline) = std::fs::read(dir.join("cmdline")) else {
            continue;
        };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if !cmdline.contains(&needle) || !cmdline.contains(" run ") {
            continue;
        }
        let status = std::fs::read_to_string(dir.join("status")).ok()?;
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
        };
        return Some((field("Uid:")?, field("CapEff:")?));
    }
    None
}

/// Gateway A runs as `nobody` with CAP_NET_ADMIN and CAP_NET_RAW only (its config, key and
/// control socket directory owned by that user): the TUN device, addresses, routes, proxy
/// neighbour entry and sysctls are set up, pings cross the tunnel, and it cleans up on SIGTERM.
/// The same without the capabilities is refused, naming them, before anything is created.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn an_unprivileged_user_with_net_admin_and_net_raw_runs_a_gateway() {
    common::require_root();
    let lab = Lab::build_topology(Topology::Switched, "m6").expect("lab builds");
    let dir = std::env::temp_dir().join(format!(
        "mt6d-e2e-{}-{}",
        std::process::id(),
        lab.gw_a.name()
    ));
    std::fs::create_dir_all(&dir).expect("test dir");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let keys = LabKeys::generate(&dir, true, None).expect("keys");
    let settings = GatewaySettings {
        rotation_secs: 1.0,
        mode: "encrypt",
        keys: &keys,
        workers: None,
    };
    let mut running = Running {
        daemons: Vec::new(),
        lab,
        dir: dir.clone(),
        _turn: one_at_a_time(),
    };
    let lab = &running.lab;
    // Gateway A's files belong to the daemon's user; its control socket goes in a directory of
    // that user (as systemd's RuntimeDirectory= would make).
    let run_dir = dir.join("run-a");
    std::fs::create_dir_all(&run_dir).expect("run dir");
    chown(&run_dir);
    let LabKeys::Handshake { private_a, .. } = &keys else {
        unreachable!("handshake keys were asked for")
    };
    chown(private_a);
    let socket_a = run_dir.join("mt6d.sock");
    let config_a = dir.join("gw-A.toml");
    let text = lab.gateway_config(Side::A, &settings).replace(
        &lab.control_socket(Side::A).display().to_string(),
        &socket_a.display().to_string(),
    );
    std::fs::write(&config_a, text).expect("config");
    chown(&config_a);
    let config_b = dir.join("gw-B.toml");
    std::fs::write(&config_b, lab.gateway_config(Side::B, &settings)).expect("config");

    // The TUN device node, as udev usually has it, if this machine's is closed to the user.
    let tun_node = run_dir.join("tun");
    let closed = std::fs::metadata("/dev/net/tun")
        .map(|m| m.permissions().mode() & 0o006 != 0o006)
        .unwrap_or(true);
    let tun_node = closed.then(|| {
        let ok = std::process::Command::new("mknod")
            .arg(&tun_node)
            .args(["c", "10", "200"])
            .status()
            .expect("mknod")
            .success();
        assert!(ok, "mknod {}", tun_node.display());
        std::fs::set_permissions(&tun_node, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        tun_node.as_path()
    });

    // Without the capabilities: refused, nothing created.
    let out = unprivileged(lab, "-all", &config_a, tun_node)
        .output()
        .expect("run setpriv");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "ran without capabilities: {err}");
    assert!(
        err.contains("CAP_NET_ADMIN") && err.contains("CAP_NET_RAW"),
        "{err}"
    );
    let links = lab
        .gw_a
        .command("ip")
        .expect("ip")
        .args(["link", "show"])
        .output()
        .expect("ip link");
    assert!(
        !String::from_utf8_lossy(&links.stdout).contains("mt6d0"),
        "a TUN device was created before the refusal"
    );

    // With the capabilities but a TUN device node it cannot open: refused, saying so.
    if closed {
        let out = unprivileged(lab, "+net_admin,+net_raw", &config_a, None)
            .output()
            .expect("run setpriv");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "ran without access to /dev/net/tun: {err}"
        );
        assert!(
            err.contains("open /dev/net/tun: Permission denied"),
            "{err}"
        );
    }

    // With exactly CAP_NET_ADMIN and CAP_NET_RAW.
    // Its state records (docs/ARCHITECTURE.md) in a directory of that user too.
    let state_a = run_dir.join("state");
    std::fs::create_dir_all(&state_a).expect("state dir");
    chown(&state_a);
    let mut cmd = unprivileged(lab, "+net_admin,+net_raw", &config_a, tun_node);
    cmd.env("MT6D_STATE_DIR", &state_a);
    let mut a = DaemonProcess::spawn("A", cmd, &socket_a, &dir.join("gw-A.log")).expect("spawn A");
    a.wait_ready(Duration::from_secs(10))
        .expect("Gateway A starts without root");
    running.daemons.push(a);
    let mut b = start_daemon(&running, Side::B, "B", &config_b);
    b.wait_ready(Duration::from_secs(10))
        .expect("Gateway B starts");
    running.daemons.push(b);
    let (uid, caps) = uid_and_caps_of(&config_a).expect("gateway A's process");
    assert_eq!(uid, UID.to_string());
    assert_eq!(
        caps, "0000000000003000",
        "exactly CAP_NET_ADMIN and CAP_NET_RAW"
    );
    // The sysctls it needed were written (net_ctl_permissions grants CAP_NET_ADMIN the owner's
    // rights on /proc/sys/net).
    let forwarding = lab
        .gw_a
        .run(|| mt6d_os::sysctl::get_ipv6_conf("all", "forwarding"))
        .expect("enter A")
        .expect("read forwarding");
    assert_eq!(forwarding.trim(), "1");

    wait_for_path(lab, HOST_B, 1);
    let r = lab
        .host_a
        .run(|| {
            ping(
                HOST_B,
                20,
                Pace::Train {
                    interval: Duration::from_millis(100),
                },
                Duration::from_millis(500),
            )
        })
        .expect("enter host A")
        .expect("ping");
    assert_eq!(r.received, r.sent, "lost {} of {} pings", r.lost(), r.sent);
    let st = status(&running, Side::A);
    assert!(st.peers[0].counters.rx_packets >= 20, "{:?}", st.peers[0]);

    // A clean stop as that user removes what it made and restores the sysctl.
    running.daemons[0]
        .stop(Duration::from_secs(5))
        .expect("Gateway A stops cleanly");
    let forwarding = lab
        .gw_a
        .run(|| mt6d_os::sysctl::get_ipv6_conf("all", "forwarding"))
        .expect("enter A")
        .expect("read forwarding");
    assert_eq!(forwarding.trim(), "0", "forwarding restored");
    let links = lab
        .gw_a
        .command("ip")
        .expect("ip")
        .args(["link", "show"])
        .output()
        .expect("ip link");
    assert!(!String::from_utf8_lossy(&links.stdout).contains("mt6d0"));
}
