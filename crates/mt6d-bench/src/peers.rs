//! Bringing each scenario up on a built topology: plain forwarding (the baseline), the mt6d
//! daemon in one of its modes, wireguard-go, boringtun. Every scenario uses the same hosts,
//! addresses, links and traffic; only what carries the packets between the gateways changes.

use std::io::Write as _;
use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use mt6d_lab::topology::{
    gateway_config_text, in_ns, ConfigText, GatewaySettings, LabKeys, Public, Side, HOST_A, HOST_B,
};
use mt6d_os::{sysctl, unique_name, Netns};

use crate::procs::{find_tool, Guarded};
use crate::profile::{Mode, Scenario};
use crate::topo::{Net, EXT_IF, INT_IF};

/// WireGuard's overhead over IPv6 (40 IPv6 + 8 UDP + 32 WireGuard): wg-quick's MTU rule.
const WG_OVERHEAD: u32 = 80;
const WG_PORT: u16 = 51820;
/// VXLAN's overhead over IPv6 (40 IPv6 + 8 UDP + 8 VXLAN + 14 inner Ethernet).
const VXLAN_OVERHEAD: u32 = 70;
const VXLAN_IF: &str = "mt6dvx0";
/// The VXLAN devices' own addresses (the far host is routed via the other side's).
const VXLAN_ADDR: [&str; 2] = ["fd00:76::a", "fd00:76::b"];

/// The running gateways of one scenario; dropping it stops them.
#[derive(Debug)]
pub struct Running {
    /// Gateway A's and B's tunnel process (none for the baseline).
    pub gw_a: Option<Guarded>,
    pub gw_b: Option<Guarded>,
    /// Gateway A's control socket (mt6d only), to read its rotation schedule.
    pub control_a: Option<PathBuf>,
    /// The WireGuard UAPI sockets to remove afterwards.
    sockets: Vec<PathBuf>,
}

impl Running {
    /// The first process that died, if any.
    pub fn dead(&mut self) -> Option<String> {
        self.gw_a
            .as_mut()
            .and_then(Guarded::exited)
            .or_else(|| self.gw_b.as_mut().and_then(Guarded::exited))
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.gw_a.take();
        self.gw_b.take();
        for s in &self.sockets {
            let _ = std::fs::remove_file(s);
        }
    }
}

/// Why a scenario cannot run here (a peer not installed), before building anything.
pub fn unavailable(s: Scenario, mt6d: &Path) -> Option<String> {
    let need = |t: &str| {
        find_tool(t)
            .is_none()
            .then(|| format!("{t} not found (run scripts/install-bench-deps.sh)"))
    };
    match s {
        Scenario::None | Scenario::KernelVxlan => None,
        Scenario::Mt6d(_) => (!mt6d.is_file()).then(|| {
            format!(
                "{} not found (cargo build --release -p mt6d)",
                mt6d.display()
            )
        }),
        Scenario::WireguardGo => need("wireguard-go").or_else(|| need("wg")),
        Scenario::Boringtun => need("boringtun-cli").or_else(|| need("wg")),
    }
}

/// Starts `scenario` on `net`. `dir` holds configs, keys and logs. `mt6d_extra` is appended
/// to both mt6d gateways' configuration (after the peer: `[tcp]`, `[peer.host_id_out]`).
/// `workers`: the mt6d gateways' data-plane workers (None: the daemon's default).
pub fn start(
    net: &Net,
    scenario: Scenario,
    rotation_secs: f64,
    mt6d: &Path,
    dir: &Path,
    (mt6d_extra, workers): (&str, Option<usize>),
) -> Result<Running, String> {
    let mut run = Running {
        gw_a: None,
        gw_b: None,
        control_a: None,
        sockets: Vec::new(),
    };
    let sides = [
        (&net.gw_a, HOST_A, HOST_B, net.public_a, net.public_b, "a"),
        (&net.gw_b, HOST_B, HOST_A, net.public_b, net.public_a, "b"),
    ];
    match scenario {
        Scenario::None => {
            for (gw, local, remote, own, _, _) in sides {
                forwarding(gw, local, remote)?;
                in_ns(gw, |nl| {
                    let ext = nl.link_index(EXT_IF)?;
                    nl.add_route_via(remote, 128, ext, own.next_hop)
                })
                .map_err(|e| e.to_string())?;
            }
        }
        Scenario::KernelVxlan => start_vxlan(net, sides)?,
        Scenario::Mt6d(mode) => start_mt6d(
            &mut run,
            sides,
            mode,
            rotation_secs,
            mt6d,
            dir,
            (mt6d_extra, workers),
        )?,
        Scenario::WireguardGo | Scenario::Boringtun => {
            start_wireguard(&mut run, net, sides, scenario, dir)?;
        }
    }
    Ok(run)
}

/// One gateway's place in the lab: its namespace, its near and its far host, its own and the
/// far gateway's public address, and its letter.
type GatewaySide<'a> = (&'a Netns, Ipv6Addr, Ipv6Addr, Public, Public, &'static str);

/// The kernel's VXLAN between the gateways, the far host routed through it.
fn start_vxlan(net: &Net, sides: [GatewaySide; 2]) -> Result<(), String> {
    let mtu = (net.ext_mtu - VXLAN_OVERHEAD).to_string();
    for (i, (gw, local, remote, own, far, _)) in sides.into_iter().enumerate() {
        forwarding(gw, local, remote)?;
        let (own_addr, far_addr) = (own.addr.to_string(), far.addr.to_string());
        let me = format!("{}/64", VXLAN_ADDR[i]);
        let far_host = format!("{remote}/128");
        // iproute2, as the lab's own VXLAN hop: the netlink crate here has no VXLAN.
        for args in [
            &[
                "link", "add", VXLAN_IF, "type", "vxlan", "id", "76", "local", &own_addr, "remote",
                &far_addr, "dstport", "4789", "dev", EXT_IF,
            ][..],
            &["link", "set", VXLAN_IF, "mtu", &mtu, "up"],
            &["-6", "addr", "add", &me, "dev", VXLAN_IF, "nodad"],
            &[
                "-6",
                "route",
                "add",
                &far_host,
                "via",
                VXLAN_ADDR[1 - i],
                "dev",
                VXLAN_IF,
            ],
        ] {
            mt6d_lab::topology::ip(gw, args).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// Both mt6d gateways in `mode`, each answering on its control socket.
fn start_mt6d(
    run: &mut Running,
    sides: [GatewaySide; 2],
    mode: Mode,
    rotation_secs: f64,
    mt6d: &Path,
    dir: &Path,
    (mt6d_extra, workers): (&str, Option<usize>),
) -> Result<(), String> {
    // Handshakes, as deployed; plain has no tag, so it runs on a pre-shared key.
    // A scenario starts its gateways more than once (e.g. again for the 1 s rotation
    // tests): fresh keys in a fresh directory each time (key files are never overwritten).
    let key_dir = dir.join(unique_name("keys"));
    std::fs::create_dir(&key_dir).map_err(|e| format!("{}: {e}", key_dir.display()))?;
    let keys = LabKeys::generate(&key_dir, mode.config_name() != "plain", None)
        .map_err(|e| e.to_string())?;
    for (gw, local, remote, own, far, side) in sides {
        let socket = PathBuf::from(format!("/run/mt6d-bench/{}.sock", gw.name()));
        std::fs::create_dir_all("/run/mt6d-bench").map_err(|e| format!("/run/mt6d-bench: {e}"))?;
        let cfg = dir.join(format!("gateway-{side}.toml"));
        let text = gateway_config_text(&ConfigText {
            comment: &format!("mt6d bench, gateway {side}"),
            socket: &socket,
            settings: &GatewaySettings {
                rotation_secs,
                mode: mode.config_name(),
                keys: &keys,
                workers,
            },
            side: if side == "a" { Side::A } else { Side::B },
            local,
            remote,
            own: &own,
            far: &far,
            host_mode: false,
        });
        let text = format!("{text}{mt6d_extra}");
        std::fs::write(&cfg, text).map_err(|e| format!("{}: {e}", cfg.display()))?;
        let mut cmd = gw.command(mt6d).map_err(|e| e.to_string())?;
        cmd.arg("run").arg("-c").arg(&cfg).env("RUST_LOG", "warn");
        let mut child = Guarded::spawn(
            &format!("mt6d gateway {side}"),
            cmd,
            Some(&dir.join(format!("mt6d-{side}.log"))),
        )?;
        wait_for(Duration::from_secs(10), &mut child, || {
            mt6d::control::query_status(&socket).is_ok()
        })?;
        if side == "a" {
            run.control_a = Some(socket);
            run.gw_a = Some(child);
        } else {
            run.gw_b = Some(child);
        }
    }
    Ok(())
}

/// wireguard-go or boringtun on both gateways, configured with `wg`.
fn start_wireguard(
    run: &mut Running,
    net: &Net,
    sides: [GatewaySide; 2],
    scenario: Scenario,
    dir: &Path,
) -> Result<(), String> {
    let wg = find_tool("wg").ok_or("wg not found")?;
    let keys = [wg_keypair(&wg)?, wg_keypair(&wg)?];
    for (i, (gw, local, remote, own, far, side)) in sides.into_iter().enumerate() {
        forwarding(gw, local, remote)?;
        let ifname = unique_name("wg");
        let socket = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        run.sockets.push(socket.clone());
        let log = dir.join(format!("{}-{side}.log", scenario.name()));
        let cmd = wg_command(gw, scenario, &ifname)?;
        let mut child = Guarded::spawn(
            &format!("{} gateway {side}", scenario.name()),
            cmd,
            Some(&log),
        )?;
        wait_for(Duration::from_secs(10), &mut child, || socket.exists())?;
        let key_file = dir.join(format!("wg-{side}.key"));
        // A scenario may start its peers again: replace the previous run's key file.
        let _ = std::fs::remove_file(&key_file);
        mt6d::keys::write_secret_file(&key_file, &keys[i].0).map_err(|e| e.to_string())?;
        wg_set(
            gw,
            &wg,
            &ifname,
            &key_file,
            &keys[1 - i].1,
            remote,
            far.addr,
        )?;
        let mtu = net.ext_mtu - WG_OVERHEAD;
        in_ns(gw, |nl| {
            let i = nl.link_index(&ifname)?;
            nl.link_set_mtu(i, mtu)?;
            nl.link_set_up(i)?;
            nl.add_route(remote, 128, i)
        })
        .map_err(|e| e.to_string())?;
        let _ = own;
        if side == "a" {
            run.gw_a = Some(child);
        } else {
            run.gw_b = Some(child);
        }
    }
    Ok(())
}

/// The userspace WireGuard process of `scenario` for interface `ifname`, in `gw`.
fn wg_command(
    gw: &Netns,
    scenario: Scenario,
    ifname: &str,
) -> Result<std::process::Command, String> {
    Ok(if scenario == Scenario::WireguardGo {
        let mut c = gw
            .command(find_tool("wireguard-go").ok_or("wireguard-go not found")?)
            .map_err(|e| e.to_string())?;
        c.arg("-f")
            .arg(ifname)
            .env("WG_PROCESS_FOREGROUND", "1")
            .env("LOG_LEVEL", "error");
        c
    } else {
        let mut c = gw
            .command(find_tool("boringtun-cli").ok_or("boringtun-cli not found")?)
            .map_err(|e| e.to_string())?;
        c.args([
            "--foreground",
            "--disable-drop-privileges",
            "--verbosity",
            "error",
        ])
        .arg(ifname);
        c
    })
}

/// `wg set`: the private key, the listening port and the one peer (its public key, the far
/// host as its allowed address, its endpoint).
fn wg_set(
    gw: &Netns,
    wg: &Path,
    ifname: &str,
    key_file: &Path,
    peer_pub: &str,
    remote: Ipv6Addr,
    far: Ipv6Addr,
) -> Result<(), String> {
    let status = gw
        .command(wg)
        .map_err(|e| e.to_string())?
        .args(["set", ifname, "private-key"])
        .arg(key_file)
        .args([
            "listen-port",
            &WG_PORT.to_string(),
            "peer",
            peer_pub,
            "allowed-ips",
            &format!("{remote}/128"),
        ])
        .args(["endpoint", &format!("[{far}]:{WG_PORT}")])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("wg set: {e}"))?;
    if !status.status.success() {
        return Err(format!(
            "wg set {ifname}: {}",
            String::from_utf8_lossy(&status.stderr).trim()
        ));
    }
    Ok(())
}

/// What every non-MT6D scenario needs on a gateway (and what mt6d sets up for itself): IPv6
/// forwarding, proxy NDP for the far host on the internal link, a route to the near host.
fn forwarding(gw: &Netns, local: Ipv6Addr, remote: Ipv6Addr) -> Result<(), String> {
    in_ns(gw, |nl| {
        sysctl::set_ipv6_conf("all", "forwarding", "1")?;
        sysctl::set_ipv6_conf(INT_IF, "proxy_ndp", "1")?;
        let int = nl.link_index(INT_IF)?;
        nl.add_route(local, 128, int)?;
        nl.add_proxy_neighbor(int, remote)
    })
    .map_err(|e| e.to_string())
}

/// Polls `ready` until true, failing early if the child exits.
fn wait_for(
    timeout: Duration,
    child: &mut Guarded,
    mut ready: impl FnMut() -> bool,
) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if ready() {
            return Ok(());
        }
        if let Some(why) = child.exited() {
            return Err(why);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} not ready within {timeout:?}: {}",
                child.label,
                child.log_tail(8)
            ));
        }
        std::thread::sleep(Duration::from_millis(30));
    }
}

fn wg_keypair(wg: &Path) -> Result<(String, String), String> {
    let out = std::process::Command::new(wg)
        .arg("genkey")
        .output()
        .map_err(|e| format!("wg genkey: {e}"))?;
    let private = String::from_utf8_lossy(&out.stdout).trim().to_string();
    let mut child = std::process::Command::new(wg)
        .arg("pubkey")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| format!("wg pubkey: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(private.as_bytes());
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("wg pubkey: {e}"))?;
    let public = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if private.is_empty() || public.is_empty() {
        return Err("wg genkey/pubkey produced no key".into());
    }
    Ok((private, public))
}

/// A 0600 file with `text` (keys are never world-readable; mt6d refuses them otherwise).
pub fn random_bytes(n: usize) -> Result<Vec<u8>, String> {
    use std::io::Read as _;
    let mut buf = vec![0u8; n];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut buf))
        .map_err(|e| format!("/dev/urandom: {e}"))?;
    Ok(buf)
}
