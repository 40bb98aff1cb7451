//! The lab: the protected hosts, their gateways and what lies between the gateways, in network
//! namespaces built and torn down by the program itself. One builder for `mt6d demo`, the
//! end-to-end tests and `mt6d bench` (the three topologies of 000 §4.1, Fig. 4.2-4.4).
//!
//! ```text
//! switched:  Host A -- int0 GwA ext0 ============== ext0 GwB int0 -- Host B   one segment
//! routed:    Host A -- GwA ext0 -- pa0 R pb0 -- ext0 GwB -- Host B            2001:db8:a::/64 | :b::/64
//! tunneled:  Host A -- GwA ext0 -- pa0 M1 =vxlan= M2 pb0 -- ext0 GwB -- Host B
//!                                  2001:db8:c::/64 on VXLAN over 192.0.2.0/24, path MTU 1450
//! ```
//!
//! The two protected hosts share one /64 as in the thesis: Host A sends to Host B's true address
//! as if B were on its link, and Gateway A answers neighbour discovery for it. The public side
//! carries nothing but hashed addresses (and neighbour discovery). In the routed topologies the
//! gateways hash into their own external /64 (`local_prefix`) and reach the peer's through the
//! router (`external_next_hop`). Routers (R, M1, M2) queue at most one packet per unresolved
//! neighbour (`unres_qlen = 1`) like a hardware router, so the neighbour-discovery loss at
//! address rotation of 001 §4.2 shows up if the gateways do not prevent it.
//!
//! The *baseline* is the same path without MT6D: the gateways forward the hosts' packets with
//! plain kernel IPv6 forwarding, so "with and without the tunnel" are measured over the same
//! namespaces, veths and CPU.
//!
//! **Host mode** (001's integrated configuration, [`Lab::build_host_mode`]): Host A and Gateway
//! A are one namespace. It has no internal link; its `ext0` takes Gateway A's place on the
//! public side, and its mt6d runs with `role = "host"` and puts `HOST_A` on the TUN device.
//! Gateway B and Host B are as above. `gw_a` then names the same namespace as `host_a` (opened,
//! not owned: dropping the lab deletes it once). The baseline without MT6D is Host A as a plain
//! IPv6 host: `HOST_A` bound on its `ext0`, Host B reached on-link (switched, Gateway B
//! answering for it) or through the router, with Gateway B forwarding as before.
//!
//! **Two host-mode peers** ([`Lab::build_host_pair`]): Host B and Gateway B are one namespace
//! too (`gw_b` names `host_b`'s), so both ends run `role = "host"` and no gateway is left:
//! the hosts' mt6d talk to each other directly over the public side. Its baseline is two plain
//! IPv6 hosts, each with its true address on its `ext0`.

use std::net::Ipv6Addr;
use std::process::Stdio;

use mt6d_os::{sysctl, unique_name, AddrFlags, Netlink, Netns};

use super::config_file::{ConfigFile, GatewaySection, PeerSection};

/// The protected hosts' true addresses in the lab.
pub const HOST_A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xa);
pub const HOST_B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xb);
/// The gateways' own management addresses on their protected (internal) links.
pub const GATEWAY_A: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xa, 0, 0, 0, 0, 0, 1);
pub const GATEWAY_B: Ipv6Addr = Ipv6Addr::new(0xfd00, 0xb, 0, 0, 0, 0, 0, 1);

pub const INTERNAL_IF: &str = "int0";
pub const EXTERNAL_IF: &str = "ext0";
pub const HOST_IF: &str = "eth0";
/// The routers' interfaces towards Gateway A and Gateway B.
pub const ROUTER_IF_A: &str = "pa0";
pub const ROUTER_IF_B: &str = "pb0";
/// MTU of the VXLAN segment (1500-byte underlay minus 50 bytes of VXLAN over IPv4).
pub const TUNNEL_MTU: u32 = 1450;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    #[error("lab: {what}: {source}")]
    Os {
        what: String,
        #[source]
        source: mt6d_os::OsError,
    },
    #[error("lab: {0}")]
    Command(String),
}

fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> LabError {
    let what = what.into();
    move |source| LabError::Os { what, source }
}

/// The three topologies of 000 §4.1 (Fig. 4.2-4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Topology {
    /// Gateways on one segment.
    Switched,
    /// A router namespace between the gateways that queues one packet per unresolved neighbour.
    Routed,
    /// Routed, plus a smaller-MTU VXLAN segment (IPv4 underlay) standing in for the 6in4 tunnel.
    Tunneled,
}

impl Topology {
    pub const ALL: [Topology; 3] = [Topology::Switched, Topology::Routed, Topology::Tunneled];

    pub fn name(self) -> &'static str {
        match self {
            Topology::Switched => "switched",
            Topology::Routed => "routed",
            Topology::Tunneled => "tunneled",
        }
    }

    pub fn parse(s: &str) -> Option<Topology> {
        Topology::ALL.into_iter().find(|t| t.name() == s)
    }
}

impl std::fmt::Display for Topology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a gateway's public side is.
#[derive(Debug, Clone, Copy)]
pub struct Public {
    /// The gateway's own address on its external link (WireGuard endpoints use it). In the
    /// switched topology it is bound only by [`Lab::add_public_addresses`].
    pub addr: Ipv6Addr,
    /// The /64 its hashed addresses come from when it sits behind a router.
    pub prefix: Option<Ipv6Addr>,
    /// The router on its external link, if any.
    pub router: Option<Ipv6Addr>,
    /// Where plain forwarding sends the far host's packets.
    pub next_hop: Ipv6Addr,
}

/// Which gateway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

/// The namespaces of one topology. Dropping the lab deletes them, and with them every
/// interface inside.
#[derive(Debug)]
pub struct Lab {
    pub topology: Topology,
    pub host_a: Netns,
    pub gw_a: Netns,
    pub gw_b: Netns,
    pub host_b: Netns,
    /// R (routed), or M1 and M2 (tunneled); empty when switched.
    pub routers: Vec<Netns>,
    pub public_a: Public,
    pub public_b: Public,
    /// MTU of the gateways' external links (the path MTU they are told about).
    pub ext_mtu: u32,
    /// Host A runs mt6d itself (`gw_a` is `host_a`'s namespace): 001's integrated configuration.
    pub host_mode: bool,
    /// Host B runs mt6d itself too (`gw_b` is `host_b`'s namespace): two host-mode peers.
    pub host_mode_b: bool,
}

fn p6(s: &str) -> Ipv6Addr {
    // Only called on the literals of this file.
    s.parse().unwrap_or(Ipv6Addr::UNSPECIFIED)
}

const NO_DAD: AddrFlags = AddrFlags {
    nodad: true,
    noprefixroute: false,
};

impl Lab {
    /// Builds the switched topology with fresh, uniquely named namespaces (`m6..`).
    pub fn build() -> Result<Lab, LabError> {
        Lab::build_topology(Topology::Switched, "m6")
    }

    /// Builds `topology`; namespace names start with `prefix` (the bench's reaper finds its own
    /// by theirs) and end with [`unique_name`]'s process-unique tail.
    pub fn build_topology(topology: Topology, prefix: &str) -> Result<Lab, LabError> {
        Lab::build_variant(topology, prefix, false, false)
    }

    /// Builds `topology` with Host A in host mode: one namespace for Host A and its mt6d.
    pub fn build_host_mode(topology: Topology, prefix: &str) -> Result<Lab, LabError> {
        Lab::build_variant(topology, prefix, true, false)
    }

    /// Builds `topology` with both hosts in host mode: each host runs its own mt6d, and they
    /// are each other's peer.
    pub fn build_host_pair(topology: Topology, prefix: &str) -> Result<Lab, LabError> {
        Lab::build_variant(topology, prefix, true, true)
    }

    fn build_variant(
        topology: Topology,
        prefix: &str,
        host_mode: bool,
        host_mode_b: bool,
    ) -> Result<Lab, LabError> {
        let ns = |role: &str| {
            let name = unique_name(&format!("{prefix}{role}"));
            Netns::create(&name).map_err(os(format!("create namespace {name}")))
        };
        let same =
            |n: &Netns| Netns::open(n.name()).map_err(os(format!("open namespace {}", n.name())));
        let host_a = ns("ha")?;
        let gw_a = if host_mode { same(&host_a)? } else { ns("ga")? };
        let host_b = ns("hb")?;
        let gw_b = if host_mode_b {
            same(&host_b)?
        } else {
            ns("gb")?
        };
        let mut lab = Lab {
            topology,
            host_a,
            gw_a,
            gw_b,
            host_b,
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
            host_mode,
            host_mode_b,
        };
        match topology {
            Topology::Switched => {}
            Topology::Routed => lab.routers.push(ns("r")?),
            Topology::Tunneled => {
                lab.routers.push(ns("m1")?);
                lab.routers.push(ns("m2")?);
            }
        }
        for n in lab.all() {
            prepare_namespace(n)?;
        }
        // In host mode Host A has no internal link: its mt6d binds HOST_A on the TUN device.
        if !host_mode {
            veth(&lab.gw_a, INTERNAL_IF, &lab.host_a, HOST_IF)?;
            addr(&lab.host_a, HOST_IF, HOST_A, 64)?;
            addr(&lab.gw_a, INTERNAL_IF, GATEWAY_A, 64)?;
        }
        if !host_mode_b {
            veth(&lab.gw_b, INTERNAL_IF, &lab.host_b, HOST_IF)?;
            addr(&lab.host_b, HOST_IF, HOST_B, 64)?;
            addr(&lab.gw_b, INTERNAL_IF, GATEWAY_B, 64)?;
        }
        match topology {
            Topology::Switched => veth(&lab.gw_a, EXTERNAL_IF, &lab.gw_b, EXTERNAL_IF)?,
            Topology::Routed | Topology::Tunneled => lab.build_routed()?,
        }
        Ok(lab)
    }

    fn build_routed(&mut self) -> Result<(), LabError> {
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
            _ => return Err(LabError::Command("routed topology without router".into())),
        };
        veth(&self.gw_a, EXTERNAL_IF, left, ROUTER_IF_A)?;
        veth(&self.gw_b, EXTERNAL_IF, right, ROUTER_IF_B)?;
        addr(&self.gw_a, EXTERNAL_IF, ga, 64)?;
        addr(&self.gw_b, EXTERNAL_IF, gb, 64)?;
        addr(left, ROUTER_IF_A, ra, 64)?;
        addr(right, ROUTER_IF_B, rb, 64)?;
        // A gateway's only way out is its router (a gateway has a default route like any host).
        for (gw, via) in [(&self.gw_a, ra), (&self.gw_b, rb)] {
            route_via(gw, EXTERNAL_IF, Ipv6Addr::UNSPECIFIED, 0, via)?;
        }
        if self.topology == Topology::Tunneled {
            self.ext_mtu = TUNNEL_MTU;
            build_vxlan(left, right)?;
            let (m1, m2) = (p6("2001:db8:c::1"), p6("2001:db8:c::2"));
            route_via(left, "vx0", pb, 64, m2)?;
            route_via(left, "vx0", HOST_B, 128, m2)?;
            route_via(right, "vx0", pa, 64, m1)?;
            route_via(right, "vx0", HOST_A, 128, m1)?;
            // The gateways are told their uplink's MTU, as a 6in4 tunnel broker's router
            // advertisement would tell them; every scenario derives its inner MTU from it.
            for (n, i) in [
                (&self.gw_a, EXTERNAL_IF),
                (&self.gw_b, EXTERNAL_IF),
                (left, ROUTER_IF_A),
                (right, ROUTER_IF_B),
            ] {
                set_mtu(n, i, TUNNEL_MTU)?;
            }
        }
        // The router(s) forward the baseline's true addresses to the gateways too.
        route_via(left, ROUTER_IF_A, HOST_A, 128, ga)?;
        route_via(right, ROUTER_IF_B, HOST_B, 128, gb)?;
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
            .map_err(os("enter router"))?
            .map_err(|e| LabError::Command(format!("router neighbour queue: {e}")))?;
        }
        Ok(())
    }

    /// Every namespace, hosts and gateways first (each once: in host mode `gw_a` is `host_a`,
    /// and with two host-mode peers `gw_b` is `host_b`).
    pub fn all(&self) -> impl Iterator<Item = &Netns> {
        let gw_a = (!self.host_mode).then_some(&self.gw_a);
        let gw_b = (!self.host_mode_b).then_some(&self.gw_b);
        [Some(&self.host_a), gw_a, gw_b, Some(&self.host_b)]
            .into_iter()
            .flatten()
            .chain(self.routers.iter())
    }

    /// GRO on every veth of every namespace (`ethtool -K DEV gro on`; a veth's default is off),
    /// as `mt6d bench` runs every scenario: received frames then go through NAPI and GRO, the
    /// tunnel's UDP datagrams included. Best effort: a device without ethtool support keeps
    /// its default. The VXLAN device (`vx*`) is left alone.
    pub fn enable_gro(&self) {
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

    /// Binds the gateways' public addresses on their external links in the switched topology
    /// (the routed ones always have them). The bench's WireGuard peers use them as endpoints.
    pub fn add_public_addresses(&self) -> Result<(), LabError> {
        if self.topology == Topology::Switched {
            addr(&self.gw_a, EXTERNAL_IF, self.public_a.addr, 64)?;
            addr(&self.gw_b, EXTERNAL_IF, self.public_b.addr, 64)?;
        }
        Ok(())
    }

    pub fn gateway(&self, side: Side) -> &Netns {
        match side {
            Side::A => &self.gw_a,
            Side::B => &self.gw_b,
        }
    }

    /// The public side of a gateway.
    pub fn public(&self, side: Side) -> &Public {
        match side {
            Side::A => &self.public_a,
            Side::B => &self.public_b,
        }
    }

    /// Sum of `unresolved_discards` of every router (/proc/net/stat/ndisc_cache): packets a
    /// router dropped because a neighbour was not resolved yet (001 §4.2). 0 when switched.
    pub fn router_unresolved_discards(&self) -> u64 {
        self.routers
            .iter()
            .map(|r| r.run(unresolved_discards).unwrap_or(0))
            .sum()
    }

    /// Plain forwarding between the hosts through both gateways, no MT6D: the baseline.
    pub fn baseline_up(&self) -> Result<(), LabError> {
        self.baseline(true)
    }

    /// Removes the baseline forwarding state before the MT6D gateways start.
    pub fn baseline_down(&self) -> Result<(), LabError> {
        self.baseline(false)
    }

    fn baseline(&self, up: bool) -> Result<(), LabError> {
        let switched = self.topology == Topology::Switched;
        if self.host_mode {
            self.host_baseline(Side::A, up)?;
        }
        if self.host_mode_b {
            self.host_baseline(Side::B, up)?;
        }
        let gateways = [
            (!self.host_mode).then_some((&self.gw_a, HOST_A, HOST_B, &self.public_a)),
            (!self.host_mode_b).then_some((&self.gw_b, HOST_B, HOST_A, &self.public_b)),
        ];
        for (gw, local, remote, public) in gateways.into_iter().flatten() {
            in_ns(gw, |nl| {
                let int = nl.link_index(INTERNAL_IF)?;
                let ext = nl.link_index(EXTERNAL_IF)?;
                if up {
                    sysctl::set_ipv6_conf("all", "forwarding", "1")?;
                    sysctl::set_ipv6_conf(INTERNAL_IF, "proxy_ndp", "1")?;
                    nl.add_route(local, 128, int)?;
                    nl.add_proxy_neighbor(int, remote)?;
                    if switched {
                        // One segment: each gateway answers for its own host on it.
                        sysctl::set_ipv6_conf(EXTERNAL_IF, "proxy_ndp", "1")?;
                        nl.add_route(remote, 128, ext)?;
                        nl.add_proxy_neighbor(ext, local)?;
                    } else {
                        nl.add_route_via(remote, 128, ext, public.next_hop)?;
                    }
                } else {
                    if switched {
                        nl.del_proxy_neighbor(ext, local)?;
                        sysctl::set_ipv6_conf(EXTERNAL_IF, "proxy_ndp", "0")?;
                    }
                    nl.del_proxy_neighbor(int, remote)?;
                    nl.del_route(remote, 128, ext)?;
                    nl.del_route(local, 128, int)?;
                    sysctl::set_ipv6_conf(INTERNAL_IF, "proxy_ndp", "0")?;
                    sysctl::set_ipv6_conf("all", "forwarding", "0")?;
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    /// A host without MT6D in host mode: a plain IPv6 host with its true address on its public
    /// link.
    fn host_baseline(&self, side: Side, up: bool) -> Result<(), LabError> {
        let (host, local, remote) = match side {
            Side::A => (&self.host_a, HOST_A, HOST_B),
            Side::B => (&self.host_b, HOST_B, HOST_A),
        };
        let via = (self.topology != Topology::Switched).then_some(self.public(side).next_hop);
        in_ns(host, |nl| {
            let ext = nl.link_index(EXTERNAL_IF)?;
            if up {
                nl.add_address(ext, local, 128, NO_DAD)?;
                match via {
                    // One segment: the far gateway answers for its host on it (or the far
                    // host is there itself).
                    None => nl.add_route(remote, 128, ext),
                    Some(router) => nl.add_route_via(remote, 128, ext, router),
                }
            } else {
                nl.del_route(remote, 128, ext)?;
                nl.del_address(ext, local, 128)
            }
        })
    }

    /// The configuration file of one gateway of the lab.
    pub fn gateway_config(&self, side: Side, settings: &GatewaySettings<'_>) -> String {
        let (local, remote, own, far) = match side {
            Side::A => (HOST_A, HOST_B, &self.public_a, &self.public_b),
            Side::B => (HOST_B, HOST_A, &self.public_b, &self.public_a),
        };
        gateway_config_text(&ConfigText {
            comment: &format!(
                "Generated for the lab gateway {side:?} (namespace {}, {} topology).",
                self.gateway(side).name(),
                self.topology
            ),
            socket: &self.control_socket(side),
            settings,
            side,
            local,
            remote,
            own,
            far,
            host_mode: match side {
                Side::A => self.host_mode,
                Side::B => self.host_mode_b,
            },
        })
    }

    /// Where each lab gateway's control socket lives.
    pub fn control_socket(&self, side: Side) -> std::path::PathBuf {
        std::path::PathBuf::from(format!("/run/mt6d/{}.sock", self.gateway(side).name()))
    }
}

/// The knobs the demo, the tests and the bench pass to both lab gateways.
#[derive(Debug)]
pub struct GatewaySettings<'a> {
    pub rotation_secs: f64,
    pub mode: &'a str,
    pub keys: &'a LabKeys,
    /// `workers`: the data-plane threads (None: the daemon's default, one per online CPU).
    pub workers: Option<usize>,
}

/// The lab gateways' keys, written into a private directory with mode 0600.
#[derive(Debug, Clone)]
pub enum LabKeys {
    /// Each gateway has an identity key and knows the other's public key (the default).
    Handshake {
        private_a: std::path::PathBuf,
        private_b: std::path::PathBuf,
        public_a: String,
        public_b: String,
        rekey_secs: Option<f64>,
    },
    /// One pre-shared session key for both (thesis compatibility; `plain` needs it).
    PreShared { key_file: std::path::PathBuf },
}

impl LabKeys {
    /// New keys in `dir` (which must exist and be private).
    pub fn generate(
        dir: &std::path::Path,
        handshake: bool,
        rekey_secs: Option<f64>,
    ) -> Result<LabKeys, mt6d::keys::KeyError> {
        use mt6d::keys;
        if !handshake {
            let key_file = dir.join("session.key");
            keys::write_secret_file(&key_file, &keys::encode(keys::random32()?.as_slice()))?;
            return Ok(LabKeys::PreShared { key_file });
        }
        let make = |label: &str| -> Result<(std::path::PathBuf, String), keys::KeyError> {
            let private = keys::new_private_key()?;
            let path = dir.join(format!("gateway-{label}.key"));
            keys::write_secret_file(&path, &keys::encode(private.to_bytes().as_slice()))?;
            Ok((path, keys::public_key_text(&private.public_key())))
        };
        let (private_a, public_a) = make("a")?;
        let (private_b, public_b) = make("b")?;
        Ok(LabKeys::Handshake {
            private_a,
            private_b,
            public_a,
            public_b,
            rekey_secs,
        })
    }

    /// `side`'s keys: into `[gateway]` (its state directory or identity key) and its
    /// `[[peer]]` (the session key file or the other gateway's public key).
    fn fill(&self, side: Side, gateway: &mut GatewaySection, peer: &mut PeerSection) {
        match self {
            // Each lab gateway keeps its send counter state (docs/PROTOCOL.md §4.3) next to the
            // key, not in the system's /var/lib/mt6d.
            LabKeys::PreShared { key_file } => {
                let state = key_file.with_file_name(match side {
                    Side::A => "state-a",
                    Side::B => "state-b",
                });
                gateway.state_dir = Some(state.display().to_string());
                peer.key_file = Some(key_file.display().to_string());
            }
            LabKeys::Handshake {
                private_a,
                private_b,
                public_a,
                public_b,
                rekey_secs,
            } => {
                let (own, far) = match side {
                    Side::A => (private_a, public_b),
                    Side::B => (private_b, public_a),
                };
                // Handshake keys keep no counters, but a pre-shared peer a test adds later
                // (`mt6d peer add`, a reload) does: in the lab's directory, not the system's.
                let state = own.with_file_name(match side {
                    Side::A => "state-a",
                    Side::B => "state-b",
                });
                gateway.state_dir = Some(state.display().to_string());
                gateway.private_key_file = Some(own.display().to_string());
                gateway.rekey_secs = *rekey_secs;
                peer.public_key = Some(far.clone());
            }
        }
    }
}

/// Everything a lab gateway's configuration file says.
#[derive(Debug)]
pub struct ConfigText<'a> {
    pub comment: &'a str,
    pub socket: &'a std::path::Path,
    pub settings: &'a GatewaySettings<'a>,
    /// Which gateway (picks its identity key and the other's public key).
    pub side: Side,
    pub local: Ipv6Addr,
    pub remote: Ipv6Addr,
    pub own: &'a Public,
    pub far: &'a Public,
    /// `role = "host"`: no internal interface, the true address goes on the TUN device.
    pub host_mode: bool,
}

/// A gateway configuration for one peer (docs/CONFIG.md): behind a router, the hashed
/// addresses come from each side's external /64 and leave through the router.
pub fn gateway_config_text(c: &ConfigText<'_>) -> String {
    let s = c.settings;
    let mut gateway = GatewaySection {
        role: c.host_mode.then(|| "host".to_string()),
        internal_interface: (!c.host_mode).then(|| INTERNAL_IF.to_string()),
        external_interface: EXTERNAL_IF.to_string(),
        tun_name: "mt6d0".to_string(),
        control_socket: c.socket.display().to_string(),
        rotation_secs: s.rotation_secs,
        mode: s.mode.to_string(),
        accept_clear_payload: s.mode != "encrypt",
        external_next_hop: c.own.router,
        state_dir: None,
        private_key_file: None,
        rekey_secs: None,
        workers: s.workers,
        jitter: false,
    };
    let mut peer = PeerSection {
        name: "far".to_string(),
        local_host: c.local,
        remote_host: c.remote,
        key_file: None,
        public_key: None,
        local_prefix: None,
        remote_prefix: None,
    };
    s.keys.fill(c.side, &mut gateway, &mut peer);
    ConfigFile {
        gateway,
        peers: vec![peer.with_prefixes(c.own.prefix, c.far.prefix)],
    }
    .text(c.comment)
}

/// `unresolved_discards` of the calling thread's namespace, all CPUs added.
fn unresolved_discards() -> u64 {
    let text =
        std::fs::read_to_string("/proc/thread-self/net/stat/ndisc_cache").unwrap_or_default();
    let mut lines = text.lines();
    let Some(col) = lines.next().and_then(|h| {
        h.split_whitespace()
            .position(|c| c == "unresolved_discards")
    }) else {
        return 0;
    };
    lines
        .filter_map(|l| l.split_whitespace().nth(col))
        .filter_map(|v| u64::from_str_radix(v, 16).ok())
        .sum()
}

fn build_vxlan(m1: &Netns, m2: &Netns) -> Result<(), LabError> {
    veth(m1, "ul0", m2, "ul0")?;
    for (n, local, remote, v6) in [
        (m1, "192.0.2.1", "192.0.2.2", "2001:db8:c::1/64"),
        (m2, "192.0.2.2", "192.0.2.1", "2001:db8:c::2/64"),
    ] {
        // rtnetlink here has no IPv4 or VXLAN support; iproute2 builds the underlay.
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

/// `ip ARGS` inside a namespace.
pub fn ip(n: &Netns, args: &[&str]) -> Result<(), LabError> {
    let out = n
        .command("ip")
        .map_err(os("ip command"))?
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| LabError::Command(format!("ip {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(LabError::Command(format!(
            "ip {} in {}: {}",
            args.join(" "),
            n.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn addr(n: &Netns, iface: &str, a: Ipv6Addr, len: u8) -> Result<(), LabError> {
    in_ns(n, |nl| {
        let i = nl.link_index(iface)?;
        nl.add_address(i, a, len, NO_DAD)
    })
}

fn set_mtu(n: &Netns, iface: &str, mtu: u32) -> Result<(), LabError> {
    in_ns(n, |nl| {
        let i = nl.link_index(iface)?;
        nl.link_set_mtu(i, mtu)
    })
}

fn route_via(
    n: &Netns,
    iface: &str,
    dst: Ipv6Addr,
    len: u8,
    via: Ipv6Addr,
) -> Result<(), LabError> {
    in_ns(n, |nl| {
        let i = nl.link_index(iface)?;
        nl.add_route_via(dst, len, i, via)
    })
}

/// A veth pair between two namespaces, both ends up.
pub fn veth(a: &Netns, a_name: &str, b: &Netns, b_name: &str) -> Result<(), LabError> {
    // Created in `a` under a temporary peer name, moved to `b`, renamed there.
    let tmp = unique_name("m6v");
    let b_fd = b.fd();
    in_ns(a, |nl: &mut Netlink| {
        nl.create_veth(a_name, &tmp)?;
        let peer = nl.link_index(&tmp)?;
        nl.move_link_to_netns(peer, b_fd)?;
        let own = nl.link_index(a_name)?;
        nl.link_set_up(own)
    })?;
    in_ns(b, |nl| {
        let peer = nl.link_index(&tmp)?;
        nl.link_rename(peer, b_name)?;
        nl.link_set_up(peer)
    })
}

/// `n`'s neighbour entry for `addr` on `dev` once it has a link-layer address, asking the
/// kernel to resolve it with a datagram (to the discard port) every 50 ms, up to `limit`
/// (resolution retransmits every second, three times); `None` if it never resolves.
pub fn resolved(
    n: &Netns,
    dev: &str,
    addr: Ipv6Addr,
    limit: std::time::Duration,
) -> Result<Option<[u8; 6]>, LabError> {
    n.run(|| -> Result<Option<[u8; 6]>, mt6d_os::OsError> {
        let mut nl = Netlink::open()?;
        let index = nl.link_index(dev)?;
        let sock = std::net::UdpSocket::bind("[::]:0")
            .map_err(|e| mt6d_os::OsError::InvalidArgument(format!("UDP socket: {e}")))?;
        let deadline = std::time::Instant::now() + limit;
        loop {
            let _ = sock.send_to(b"x", std::net::SocketAddrV6::new(addr, 9, 0, 0));
            if let Some(mac) = nl.neighbor_lladdr(index, addr)? {
                return Ok(Some(mac));
            }
            if std::time::Instant::now() > deadline {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    })
    .map_err(os(format!("enter namespace {}", n.name())))?
    .map_err(os(format!("resolve {addr} on {dev} in {}", n.name())))
}

/// Waits until no address in namespace `n` is tentative (duplicate address detection of the
/// link-local addresses a new interface gets, about a second), up to `limit`. Until then the
/// kernel sends no Neighbour Solicitation for a forwarded packet (its source would be the
/// tentative link-local address): the first resolution of a router that just came up is
/// silently delayed by a retransmission interval, a second, which at one-second rotations is
/// an epoch. A network that has been up a while has no tentative address.
pub fn dad_settled(n: &Netns, limit: std::time::Duration) -> Result<(), LabError> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let out = n
            .command("ip")
            .map_err(|e| LabError::Command(format!("ip in {}: {e}", n.name())))?
            .args(["-6", "addr", "show", "tentative"])
            .output()
            .map_err(|e| LabError::Command(format!("ip -6 addr in {}: {e}", n.name())))?;
        if out.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(());
        }
        if std::time::Instant::now() > deadline {
            return Err(LabError::Command(format!(
                "addresses in {} still tentative after {limit:?}:\n{}",
                n.name(),
                String::from_utf8_lossy(&out.stdout)
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A lab namespace made ready: no duplicate address detection (addresses are unique by
/// construction, and waiting a second for DAD on every link-local would only slow everything
/// down, or leave a link-local tentative when a daemon starts), `lo` up.
pub fn prepare_namespace(n: &Netns) -> Result<(), LabError> {
    in_ns(n, |nl| {
        for iface in ["all", "default"] {
            sysctl::set_ipv6_conf(iface, "accept_dad", "0")?;
        }
        let lo = nl.link_index("lo")?;
        nl.link_set_up(lo)
    })
}

/// Runs `f` with a netlink socket inside namespace `n`.
pub fn in_ns<T: Send>(
    n: &Netns,
    f: impl FnOnce(&mut Netlink) -> Result<T, mt6d_os::OsError> + Send,
) -> Result<T, LabError> {
    n.run(|| {
        let mut nl = Netlink::open()?;
        f(&mut nl)
    })
    .map_err(os(format!("enter namespace {}", n.name())))?
    .map_err(os(format!("in namespace {}", n.name())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On every topology, with Host A behind a gateway or in host mode, the baseline path works
    /// and the lab leaves no namespace behind.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn baseline_forwards_and_lab_cleans_up() {
        assert!(super::super::is_root(), "needs root for network namespaces");
        for (topology, host_mode) in Topology::ALL
            .into_iter()
            .flat_map(|t| [(t, false), (t, true)])
        {
            let lab = if host_mode {
                Lab::build_host_mode(topology, "m6t").expect("host-mode lab builds")
            } else {
                Lab::build_topology(topology, "m6t").expect("lab builds")
            };
            let names: Vec<String> = lab.all().map(|n| n.name().to_string()).collect();
            assert_eq!(names.len(), 4 - usize::from(host_mode) + lab.routers.len());
            lab.baseline_up().expect("baseline up");
            let pings = |count| {
                lab.host_a
                    .run(|| {
                        super::super::ping::ping(
                            HOST_B,
                            count,
                            super::super::ping::Pace::Flood {
                                wait: std::time::Duration::from_millis(500),
                            },
                            std::time::Duration::from_millis(500),
                        )
                    })
                    .expect("enter host A")
                    .expect("ping runs")
            };
            // Path set-up: behind a router that queues one packet per unresolved neighbour,
            // the very first echoes may wait for or lose to neighbour discovery.
            let up = (0..10).any(|_| pings(1).received == 1);
            assert!(
                up,
                "{topology} (host mode {host_mode}): no echo answered in 10 tries"
            );
            let report = pings(5);
            assert_eq!(
                report.received, 5,
                "{topology} (host mode {host_mode}): {report:?}"
            );
            lab.baseline_down().expect("baseline down");
            drop(lab);
            for n in names {
                assert!(
                    !std::path::Path::new("/run/netns").join(&n).exists(),
                    "{n} left behind"
                );
            }
        }
    }
}
