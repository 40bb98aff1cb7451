//! The three topologies of 000 §4.1 in network namespaces, built fresh for every scenario so no
//! state leaks from one scenario into the next.
//!
//! ```text
//! switched:  HostA -- GwA ext0 ============ ext0 GwB -- HostB        2001:db8:ff::/64 public
//! routed:    HostA -- GwA ext0 -- R -- ext0 GwB -- HostB              2001:db8:a::/64 | :b::/64
//! tunneled:  HostA -- GwA ext0 -- M1 =vxlan= M2 -- ext0 GwB -- HostB  2001:db8:c::/64 on VXLAN,
//!                                     192.0.2.0/24 IPv4 underlay, path MTU 1450
//! ```
//!
//! The hosts share 2001:db8:1::/64 as in the lab (crates/mt6d/src/lab/topology.rs): each gateway
//! answers neighbour discovery for the far host, whatever carries the packets. Routers (R, M1,
//! M2) queue at most one packet per unresolved neighbour (unres_qlen = 1) like a hardware
//! router, so neighbour-discovery loss at address rotation (001 §4.2) shows up.

use std::net::Ipv6Addr;
use std::process::Stdio;

use mt6d::lab::topology::{in_ns, HOST_A, HOST_B};
use mt6d_os::{sysctl, unique_name, AddrFlags, Netlink, Netns};

use crate::profile::Topology;

pub const HOST_IF: &str = "eth0";
pub const INT_IF: &str = "int0";
pub const EXT_IF: &str = "ext0";
pub const GW_A_INT: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa, 0, 0, 0, 0, 0, 1);
pub const GW_B_INT: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xb, 0, 0, 0, 0, 0, 1);
/// MTU of the VXLAN segment (1500-byte underlay minus 50 bytes of VXLAN over IPv4).
pub const TUNNEL_MTU: u32 = 1450;

/// Where a gateway's public side is.
#[derive(Debug, Clone, Copy)]
pub struct Public {
    /// The gateway's own address on its external link (WireGuard endpoints use it).
    pub addr: Ipv6Addr,
    /// The /64 its hashed addresses come from when it sits behind a router.
    pub prefix: Option<Ipv6Addr>,
    /// The router on its external link, if any.
    pub router: Option<Ipv6Addr>,
    /// Where the baseline sends the far host's packets.
    pub next_hop: Ipv6Addr,
}

/// The namespaces of one topology. Dropping it kills nothing (the scenario's guards do that
/// first) and deletes every namespace, and with them every interface inside.
#[derive(Debug)]
pub struct Net {
    pub topology: Topology,
    pub host_a: Netns,
    pub gw_a: Netns,
    pub gw_b: Netns,
    pub host_b: Netns,
    pub routers: Vec<Netns>,
    pub public_a: Public,
    pub public_b: Public,
    /// MTU of the gateways' external links (the path MTU they are told about).
    pub ext_mtu: u32,
}

fn p6(s: &str) -> Ipv6Addr {
    // Only called on the literals of this file.
    s.parse().unwrap_or(Ipv6Addr::UNSPECIFIED)
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

const NO_DAD: AddrFlags = AddrFlags {
    nodad: true,
    noprefixroute: false,
};

impl Net {
    pub fn build(topology: Topology) -> Result<Net, String> {
        let ns = |p: &str| {
            let name = unique_name(p);
            Netns::create(&name).map_err(|e| format!("create namespace {name}: {e}"))
        };
        let mut net = Net {
            topology,
            host_a: ns("mbha")?,
            gw_a: ns("mbga")?,
            gw_b: ns("mbgb")?,
            host_b: ns("mbhb")?,
            routers: Vec::new(),
            public_a: Public {
                addr: p6("2001:db8:ff::a"),
                prefix: None,
                router: None,
                next_hop: p6("2001:db8:ff::b"),
            },
            public_b: Public {
                addr: p6("2001:db8:ff::b"),
                prefix: None,
                router: None,
                next_hop: p6("2001:db8:ff::a"),
            },
            ext_mtu: 1500,
        };
        match topology {
            Topology::Switched => {}
            Topology::Routed => net.routers.push(ns("mbr")?),
            Topology::Tunneled => {
                net.routers.push(ns("mbm1")?);
                net.routers.push(ns("mbm2")?);
            }
        }
        for n in net.all() {
            in_ns(n, |nl| {
                // No DAD: addresses are unique by construction, and DAD would delay every test.
                for iface in ["all", "default"] {
                    sysctl::set_ipv6_conf(iface, "accept_dad", "0")?;
                }
                let lo = nl.link_index("lo")?;
                nl.link_set_up(lo)
            })
            .map_err(err)?;
        }
        veth(&net.gw_a, INT_IF, &net.host_a, HOST_IF)?;
        veth(&net.gw_b, INT_IF, &net.host_b, HOST_IF)?;
        for (n, a) in [(&net.host_a, HOST_A), (&net.host_b, HOST_B)] {
            addr(n, HOST_IF, a, 64)?;
        }
        addr(&net.gw_a, INT_IF, GW_A_INT, 64)?;
        addr(&net.gw_b, INT_IF, GW_B_INT, 64)?;

        match topology {
            Topology::Switched => {
                veth(&net.gw_a, EXT_IF, &net.gw_b, EXT_IF)?;
                addr(&net.gw_a, EXT_IF, net.public_a.addr, 64)?;
                addr(&net.gw_b, EXT_IF, net.public_b.addr, 64)?;
            }
            Topology::Routed | Topology::Tunneled => net.build_routed()?,
        }
        net.enable_gro();
        Ok(net)
    }

    fn build_routed(&mut self) -> Result<(), String> {
        let (pa, pb) = (p6("2001:db8:a::"), p6("2001:db8:b::"));
        let (ra, rb) = (p6("2001:db8:a::1"), p6("2001:db8:b::1"));
        let (ga, gb) = (p6("2001:db8:a::2"), p6("2001:db8:b::2"));
        self.public_a = Public {
            addr: ga,
            prefix: Some(pa),
            router: Some(ra),
            next_hop: ra,
        };
        self.public_b = Public {
            addr: gb,
            prefix: Some(pb),
            router: Some(rb),
            next_hop: rb,
        };
        let (left, right) = match self.routers.as_slice() {
            [r] => (r, r),
            [m1, m2] => (m1, m2),
            _ => return Err("routed topology without router".into()),
        };
        veth(&self.gw_a, EXT_IF, left, "pa0")?;
        veth(&self.gw_b, EXT_IF, right, "pb0")?;
        addr(&self.gw_a, EXT_IF, ga, 64)?;
        addr(&self.gw_b, EXT_IF, gb, 64)?;
        addr(left, "pa0", ra, 64)?;
        addr(right, "pb0", rb, 64)?;
        // A gateway's only way out is its router (a gateway has a default route like any host).
        for (gw, via) in [(&self.gw_a, ra), (&self.gw_b, rb)] {
            in_ns(gw, |nl| {
                let ext = nl.link_index(EXT_IF)?;
                nl.add_route_via(Ipv6Addr::UNSPECIFIED, 0, ext, via)
            })
            .map_err(err)?;
        }
        if self.topology == Topology::Tunneled {
            self.ext_mtu = TUNNEL_MTU;
            self.build_vxlan(left, right)?;
            let (m1, m2) = (p6("2001:db8:c::1"), p6("2001:db8:c::2"));
            route_via(left, "vx0", pb, 64, m2)?;
            route_via(left, "vx0", HOST_B, 128, m2)?;
            route_via(right, "vx0", pa, 64, m1)?;
            route_via(right, "vx0", HOST_A, 128, m1)?;
            // The gateways are told their uplink's MTU, as a 6in4 tunnel broker's router
            // advertisement would tell them; every scenario derives its inner MTU from it.
            for gw in [&self.gw_a, &self.gw_b] {
                in_ns(gw, |nl| {
                    let ext = nl.link_index(EXT_IF)?;
                    nl.link_set_mtu(ext, TUNNEL_MTU)
                })
                .map_err(err)?;
            }
            for (r, i) in [(left, "pa0"), (right, "pb0")] {
                in_ns(r, |nl| {
                    let idx = nl.link_index(i)?;
                    nl.link_set_mtu(idx, TUNNEL_MTU)
                })
                .map_err(err)?;
            }
        }
        // The router(s) forward the baseline's true addresses to the gateways too.
        route_via(left, "pa0", HOST_A, 128, ga)?;
        route_via(right, "pb0", HOST_B, 128, gb)?;
        for r in &self.routers {
            r.run(|| -> std::io::Result<()> {
                sysctl::set_ipv6_conf("all", "forwarding", "1").map_err(std::io::Error::other)?;
                for entry in std::fs::read_dir("/proc/sys/net/ipv6/neigh")? {
                    let dir = entry?.path();
                    if dir.file_name().is_some_and(|n| n == "lo" || n == "default") {
                        continue;
                    }
                    // One queued packet per unresolved neighbour, like a hardware router
                    // (001 §4.2). unres_qlen also rewrites unres_qlen_bytes; the byte limit
                    // is then cut so that the queue never holds more than one packet.
                    std::fs::write(dir.join("unres_qlen"), "1")?;
                    std::fs::write(dir.join("unres_qlen_bytes"), "1")?;
                }
                Ok(())
            })
            .map_err(err)?
            .map_err(|e| format!("router neighbour queue: {e}"))?;
        }
        Ok(())
    }

    fn build_vxlan(&self, m1: &Netns, m2: &Netns) -> Result<(), String> {
        veth(m1, "ul0", m2, "ul0")?;
        for (n, local, remote, v6) in [
            (m1, "192.0.2.1", "192.0.2.2", "2001:db8:c::1/64"),
            (m2, "192.0.2.2", "192.0.2.1", "2001:db8:c::2/64"),
        ] {
            ip(n, &["addr", "add", &format!("{local}/24"), "dev", "ul0"])?;
            ip(
                n,
                &[
                    "link", "add", "vx0", "type", "vxlan", "id", "46", "local", local, "remote",
                    remote, "dstport", "4789", "dev", "ul0",
                ],
            )?;
            ip(
                n,
                &["link", "set", "vx0", "mtu", &TUNNEL_MTU.to_string(), "up"],
            )?;
            ip(n, &["-6", "addr", "add", v6, "dev", "vx0", "nodad"])?;
        }
        Ok(())
    }

    /// Every namespace, hosts and gateways first.
    pub fn all(&self) -> impl Iterator<Item = &Netns> {
        [&self.host_a, &self.gw_a, &self.gw_b, &self.host_b]
            .into_iter()
            .chain(self.routers.iter())
    }

    /// GRO on every veth, alike for every scenario (issue 4). Best effort: a veth without
    /// ethtool support keeps its default and the run records nothing worse.
    fn enable_gro(&self) {
        for n in self.all() {
            let names: Vec<String> = n
                .run(|| {
                    std::fs::read_dir("/sys/class/net")
                        .into_iter()
                        .flatten()
                        .flatten()
                        .map(|e| e.file_name().to_string_lossy().to_string())
                        .filter(|i| i != "lo" && !i.starts_with("vx"))
                        .collect()
                })
                .unwrap_or_default();
            for i in names {
                if let Ok(mut c) = n.command("ethtool") {
                    let _ = c
                        .args(["-K", &i, "gro", "on"])
                        .stdout(Stdio::null())
                        .stderr(Stdio::null())
                        .status();
                }
            }
        }
    }
}

/// `ip ARGS` inside a namespace.
pub fn ip(n: &Netns, args: &[&str]) -> Result<(), String> {
    let out = n
        .command("ip")
        .map_err(err)?
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} in {}: {}",
            args.join(" "),
            n.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn addr(n: &Netns, iface: &str, a: Ipv6Addr, len: u8) -> Result<(), String> {
    in_ns(n, |nl| {
        let i = nl.link_index(iface)?;
        nl.add_address(i, a, len, NO_DAD)
    })
    .map_err(err)
}

fn route_via(n: &Netns, iface: &str, dst: Ipv6Addr, len: u8, via: Ipv6Addr) -> Result<(), String> {
    in_ns(n, |nl| {
        let i = nl.link_index(iface)?;
        nl.add_route_via(dst, len, i, via)
    })
    .map_err(err)
}

/// A veth pair between two namespaces, both ends up (as the lab builds its links).
fn veth(a: &Netns, a_name: &str, b: &Netns, b_name: &str) -> Result<(), String> {
    let tmp = unique_name("mbv");
    let b_fd = b.fd();
    in_ns(a, |nl: &mut Netlink| {
        nl.create_veth(a_name, &tmp)?;
        let peer = nl.link_index(&tmp)?;
        nl.move_link_to_netns(peer, b_fd)?;
        let own = nl.link_index(a_name)?;
        nl.link_set_up(own)
    })
    .map_err(err)?;
    in_ns(b, |nl| {
        let peer = nl.link_index(&tmp)?;
        nl.link_rename(peer, b_name)?;
        nl.link_set_up(peer)
    })
    .map_err(err)
}
