//! The kernel state a gateway needs besides its hashed addresses, applied through mt6d-os and
//! written to the instance record ([`super::state`]) before each change is made, so that a
//! failure half way rolls back what was done, a clean exit removes everything, and after a
//! crash `mt6d down` or the next start removes exactly what this instance owned.
//!
//! What is set up, in this order (000 §3.2.2 binds the remote host's true address to the
//! internal interface; we answer neighbour discovery for it with a proxy entry instead, and
//! route it into the TUN device, so the kernel forwards the protected host's packets to us):
//! - first, per peer, the fail-closed guard: `prohibit REMOTE/128` with the worst metric, which
//!   decides once the TUN route below is gone (the process died) and keeps the protected
//!   host's packets off the external interface (docs/ARCHITECTURE.md "Fail closed");
//! - the TUN device, MTU = external MTU minus the largest tunnel overhead of any peer;
//! - `net.ipv6.conf.all.forwarding = 1`, `proxy_ndp = 1` on the internal interface;
//! - per peer: proxy NDP entry for the remote true address on the internal interface, a /128
//!   route for it into the TUN device, a /128 route for the local true address on the internal
//!   interface, and a /64 route for the remote hashed prefix on the external interface (on-link,
//!   or through `external_next_hop` in a routed deployment).
//!
//! Host mode (001 §4, the "integrated" configuration: the true address on a virtual NIC of the
//! protected host itself) needs less: the local true address goes on the TUN device as a /128
//! (nodad), and per peer the /128 route for the remote true address into the TUN device and the
//! hashed /64 route as above. Applications then send to the peer's true address from their own,
//! and packets opened by the rx thread are written into the TUN device and delivered locally.
//! Nothing is forwarded, so forwarding and proxy NDP are not touched; the true address is never
//! on the external interface (the kernel answers neighbour solicitations only for addresses of
//! the receiving interface), so the public link never learns it.

use std::net::Ipv6Addr;

use mt6d_os::sysctl::{self, Sysctl};
use mt6d_os::{AddrFlags, Netlink, Tun};

use crate::config::{Config, Role};

use super::error::GatewayError;
use super::prefix::slash64;
use super::quiet;
use super::state::{Change, Instance, MARKER};

/// The true address on the TUN device is the host's own and unique by configuration; DAD on a
/// point-to-point device would only hold it tentative (unusable) for a second.
const NO_DAD: AddrFlags = AddrFlags {
    nodad: true,
    noprefixroute: true,
};

/// The applied state. Dropping it without [`System::teardown`] still reverts (best effort).
#[derive(Debug)]
pub struct System {
    pub netlink: Netlink,
    pub tun: Option<Tun>,
    /// Where the protected host's stack is reached: the internal interface, or in host mode the
    /// TUN device itself (translated ICMPv6 errors are sent there, from the true address).
    pub internal_index: u32,
    pub external_index: u32,
    pub tun_mtu: u32,
    /// The instance record: every change is written there before it is made.
    instance: Option<Instance>,
}

fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> GatewayError {
    let what = what.into();
    move |source| GatewayError::Os { what, source }
}

impl System {
    /// Applies everything, recording each change in `instance` first; on error, reverts what
    /// it had done before returning.
    pub fn apply(
        cfg: &Config,
        max_overhead: usize,
        mut netlink: Netlink,
        instance: Instance,
    ) -> Result<System, GatewayError> {
        let g = &cfg.gateway;
        netlink.set_marker(MARKER);
        // Host mode: the TUN device's index, known once it exists (see apply_inner).
        let internal_index = match g.internal_interface() {
            Some(name) => netlink.link_index(name).map_err(os(format!(
                "internal_interface {name:?} (from {})",
                cfg.path.display()
            )))?,
            None => 0,
        };
        let external_index = netlink
            .link_index(&g.external_interface)
            .map_err(os(format!(
                "external_interface {:?} (from {})",
                g.external_interface,
                cfg.path.display()
            )))?;
        let external_mtu = sysctl::get_ipv6_conf(&g.external_interface, "mtu")
            .map_err(os("read external MTU"))?
            .trim()
            .parse::<u32>()
            .unwrap_or(1500);
        let overhead = u32::try_from(max_overhead).unwrap_or(u32::MAX);
        let tun_mtu = external_mtu.saturating_sub(overhead);
        if tun_mtu < 1280 {
            return Err(GatewayError::Setup(format!(
                "external interface {} has MTU {external_mtu}; minus the tunnel overhead of {overhead} bytes that leaves {tun_mtu}, below IPv6's minimum of 1280",
                g.external_interface
            )));
        }
        let mut sys = System {
            netlink,
            tun: None,
            internal_index,
            external_index,
            tun_mtu,
            instance: Some(instance),
        };
        if let Err(e) = sys.apply_inner(cfg) {
            sys.teardown();
            return Err(e);
        }
        Ok(sys)
    }

    fn record(&mut self, change: Change) -> Result<(), GatewayError> {
        match self.instance.as_mut() {
            Some(i) => i.record_change(change),
            None => Err(GatewayError::Setup(
                "instance record already released".into(),
            )),
        }
    }

    fn apply_inner(&mut self, cfg: &Config) -> Result<(), GatewayError> {
        let g = &cfg.gateway;
        // Fail closed first (docs/ARCHITECTURE.md "Fail closed"): before any route or sysctl
        // could carry a protected host's packet, each remote true address gets a guard that
        // outlives this process and decides whenever the route into the TUN device is gone.
        let mut guarded = Vec::new();
        for peer in &cfg.peers {
            let remote = peer.stream.remote.true_addr;
            if !guarded.contains(&remote) {
                guarded.push(remote);
                self.record(Change::Guard {
                    dst: remote,
                    len: 128,
                })?;
                self.netlink
                    .add_guard_route(remote, 128)
                    .map_err(os(format!("peer {}: guard route for {remote}", peer.name)))?;
            }
        }

        // Then, before any address is added: the kernel's reports and errors about hashed
        // addresses never leave (quiet.rs).
        self.quiet(cfg)?;

        let tun = Tun::create(&g.tun_name, u16::try_from(self.tun_mtu).unwrap_or(u16::MAX))
            .map_err(os(format!("create TUN device {:?}", g.tun_name)))?;
        let tun_index = tun.index();
        self.tun = Some(tun);

        // Hashed addresses are added with nodad; the TUN device needs no link-local DAD either.
        self.set_sysctl(&ipv6_conf(&g.tun_name, "accept_dad")?, "0")?;
        let internal = match &g.role {
            Role::Gateway { internal_interface } => Some(internal_interface.as_str()),
            Role::Host { local_host } => {
                self.internal_index = tun_index;
                self.record(Change::Address {
                    index: tun_index,
                    addr: *local_host,
                    len: 128,
                })?;
                self.netlink
                    .add_address(tun_index, *local_host, 128, NO_DAD)
                    .map_err(os(format!(
                        "host mode: true address {local_host} on TUN {}",
                        g.tun_name
                    )))?;
                None
            }
        };
        if let Some(internal) = internal {
            self.set_sysctl(&ipv6_conf("all", "forwarding")?, "1")?;
            self.set_sysctl(&ipv6_conf(internal, "proxy_ndp")?, "1")?;
            // The kernel delays proxied neighbour advertisements by up to 0.8 s (RFC 4861
            // §7.2.8, meant for anycast); the protected host's first packet would wait that long.
            let delay = Sysctl::ipv6_neigh(internal, "proxy_delay")
                .map_err(os(format!("{internal} proxy_delay")))?;
            self.set_sysctl(&delay, "0")?;
        }

        let mut remote_prefixes = Vec::new();
        for peer in &cfg.peers {
            let s = &peer.stream;
            let (local, remote) = (s.local.true_addr, s.remote.true_addr);
            self.route(remote, 128, tun_index, None)?;
            if internal.is_some() {
                self.route(local, 128, self.internal_index, None)?;
                self.record(Change::ProxyNeighbor {
                    index: self.internal_index,
                    addr: remote,
                })?;
                self.netlink
                    .add_proxy_neighbor(self.internal_index, remote)
                    .map_err(os(format!("peer {}: proxy NDP for {remote}", peer.name)))?;
            }
            let prefix = s.remote.external_prefix.unwrap_or_else(|| slash64(remote));
            if !remote_prefixes.contains(&prefix) {
                remote_prefixes.push(prefix);
                self.route(prefix, 64, self.external_index, g.external_next_hop)?;
            }
        }
        Ok(())
    }

    /// Adds the peers' prefix routes on the external interface again (they are on record
    /// already) after the kernel flushed them because the interface went down; see
    /// `links.rs`. Adds are idempotent.
    pub fn reroute_external(&mut self, cfg: &Config) -> Result<(), GatewayError> {
        let mut done = Vec::new();
        for peer in &cfg.peers {
            let s = &peer.stream;
            let prefix = s
                .remote
                .external_prefix
                .unwrap_or_else(|| slash64(s.remote.true_addr));
            if done.contains(&prefix) {
                continue;
            }
            done.push(prefix);
            match cfg.gateway.external_next_hop {
                None => self.netlink.add_route(prefix, 64, self.external_index),
                Some(gw) => self
                    .netlink
                    .add_route_via(prefix, 64, self.external_index, gw),
            }
            .map_err(os(format!("route {prefix}/64 again")))?;
        }
        Ok(())
    }

    /// Sets any sysctl under /proc/sys/net to `value`, recording the value found before the
    /// first change first, so that clean-up (this process's, or `mt6d down` after a crash)
    /// restores it. Every sysctl the daemon changes goes through here.
    /// The mt6d-owned nftables table, the external interface's sysctls and, with
    /// `randomize_link`, its random MAC and link-local address (docs/PROTOCOL.md §5.4). Each
    /// change is on record before it is made, so a crash leaves it to `mt6d down` or the next
    /// start.
    fn quiet(&mut self, cfg: &Config) -> Result<(), GatewayError> {
        let g = &cfg.gateway;
        let ext = g.external_interface.as_str();
        let table = quiet::table(cfg)?;
        let (local, remote) = quiet::hashed_prefixes(cfg);
        let body = quiet::ruleset(ext, &local, &remote, g.is_host())?;
        self.record(Change::Firewall {
            table: table.name().to_string(),
            external: ext.to_string(),
        })?;
        table.load(&body).map_err(os(format!(
            "external_interface {ext}: mt6d's nftables table"
        )))?;
        // A Redirect on the public link could move hashed traffic to another next hop; a host
        // (forwarding off) would obey it. Routers ignore them anyway.
        self.set_sysctl(&ipv6_conf(ext, "accept_redirects")?, "0")?;
        if g.randomize_link {
            self.randomize_link(ext)?;
        }
        Ok(())
    }

    /// A random MAC (set while the link stays up: taking it down would flush its routes) and a
    /// random link-local address in place of the interface's own, both put back on exit.
    fn randomize_link(&mut self, ext: &str) -> Result<(), GatewayError> {
        let index = self.external_index;
        let original = self
            .netlink
            .link_mac(index)
            .map_err(os(format!("external_interface {ext}: read MAC")))?
            .ok_or_else(|| {
                GatewayError::Setup(format!(
                    "randomize_link: external_interface {ext} has no MAC address to replace"
                ))
            })?;
        let mac = quiet::random_mac()?;
        self.record(Change::LinkMac {
            index,
            mac: original,
        })?;
        self.netlink.link_set_mac(index, mac).map_err(os(format!(
            "randomize_link: external_interface {ext} (a driver that answers EBUSY cannot change its MAC while up)"
        )))?;
        let old: Vec<_> = self
            .netlink
            .list_addresses(index)
            .map_err(os(format!("external_interface {ext}: list addresses")))?
            .into_iter()
            .filter(|a| quiet::is_link_local(&a.addr))
            .collect();
        let ll = quiet::random_link_local()?;
        // 64 random bits collide with nothing; DAD would only hold it tentative for a second.
        let flags = AddrFlags {
            nodad: true,
            noprefixroute: false,
        };
        self.record(Change::Address {
            index,
            addr: ll,
            len: 64,
        })?;
        self.netlink
            .add_address(index, ll, 64, flags)
            .map_err(os(format!("randomize_link: {ll} on {ext}")))?;
        for a in old {
            self.record(Change::AddressBack {
                index,
                addr: a.addr,
                len: a.prefix_len,
            })?;
            self.netlink
                .del_address(index, a.addr, a.prefix_len)
                .map_err(os(format!("randomize_link: remove {} from {ext}", a.addr)))?;
        }
        log::info!(
            "external interface {ext}: random MAC {} and link-local {ll} for this run",
            mac.map(|b| format!("{b:02x}")).join(":")
        );
        Ok(())
    }

    pub fn set_sysctl(&mut self, name: &Sysctl, value: &str) -> Result<(), GatewayError> {
        match self.instance.as_mut() {
            Some(i) => i.set_sysctl(name, value),
            None => Err(GatewayError::Setup(
                "instance record already released".into(),
            )),
        }
    }

    fn route(
        &mut self,
        dst: Ipv6Addr,
        len: u8,
        oif: u32,
        via: Option<Ipv6Addr>,
    ) -> Result<(), GatewayError> {
        self.record(Change::Route { dst, len, oif, via })?;
        match via {
            None => self.netlink.add_route(dst, len, oif),
            Some(gw) => self.netlink.add_route_via(dst, len, oif, gw),
        }
        .map_err(os(match via {
            None => format!("route {dst}/{len}"),
            Some(gw) => format!("route {dst}/{len} via {gw}"),
        }))
    }

    /// Reverts every change, newest first (the guards last), and closes the TUN device.
    /// Continues past errors (logging them) so one stuck entry does not leave the rest behind;
    /// what could not be undone stays on record for `mt6d down`.
    pub fn teardown(&mut self) {
        if let Some(mut instance) = self.instance.take() {
            instance.clean_up(&mut self.netlink);
        }
        self.tun = None;
    }
}

fn ipv6_conf(iface: &str, key: &str) -> Result<Sysctl, GatewayError> {
    Sysctl::ipv6_conf(iface, key).map_err(os(format!("sysctl {iface}.{key}")))
}

impl Drop for System {
    fn drop(&mut self) {
        self.teardown();
    }
}
