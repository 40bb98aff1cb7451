//! The kernel state a gateway needs besides its hashed addresses, applied through mt6d-os and
//! recorded in an undo journal, so that a failure half way rolls back what was done and a clean
//! exit removes everything (developers' brief: nothing half-applied, everything cleaned up).
//!
//! What is set up (000 §3.2.2 binds the remote host's true address to the internal interface;
//! we answer neighbour discovery for it with a proxy entry instead, and route it into the TUN
//! device, so the kernel forwards the protected host's packets to us):
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

use mt6d_os::nftables::NftTable;
use mt6d_os::{sysctl, AddrFlags, Netlink, Tun};

use crate::config::{Config, Role};

use super::{quiet, GatewayError};

/// The true address on the TUN device is the host's own and unique by configuration; DAD on a
/// point-to-point device would only hold it tentative (unusable) for a second.
const NO_DAD: AddrFlags = AddrFlags {
    nodad: true,
    noprefixroute: true,
};

/// An address put back on exit was in use before the daemon started: no second DAD, and its
/// prefix route as the kernel had made it.
const RESTORED: AddrFlags = AddrFlags {
    nodad: true,
    noprefixroute: false,
};

/// One change to revert on exit, newest last.
#[derive(Debug)]
enum Undo {
    Sysctl {
        iface: String,
        key: &'static str,
        old: String,
    },
    NeighSysctl {
        iface: String,
        key: &'static str,
        old: String,
    },
    Route {
        dst: Ipv6Addr,
        len: u8,
        oif: u32,
    },
    ProxyNeighbor {
        index: u32,
        addr: Ipv6Addr,
    },
    Address {
        index: u32,
        addr: Ipv6Addr,
        len: u8,
    },
    /// An address that was there before and is put back on exit (the original link-local).
    AddressBack {
        index: u32,
        addr: Ipv6Addr,
        len: u8,
    },
    LinkMac {
        index: u32,
        mac: [u8; 6],
    },
    /// The mt6d-owned nftables table (docs/PROTOCOL.md §5.4), deleted last.
    Firewall {
        table: NftTable,
        external: String,
    },
}

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
    undo: Vec<Undo>,
}

fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> GatewayError {
    let what = what.into();
    move |source| GatewayError::Os { what, source }
}

impl System {
    /// Applies everything; on error, reverts what it had done before returning.
    pub fn apply(cfg: &Config, max_overhead: usize) -> Result<System, GatewayError> {
        let g = &cfg.gateway;
        let mut netlink = Netlink::open().map_err(os("open rtnetlink"))?;
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
            undo: Vec::new(),
        };
        if let Err(e) = sys.apply_inner(cfg) {
            sys.teardown();
            return Err(e);
        }
        Ok(sys)
    }

    fn apply_inner(&mut self, cfg: &Config) -> Result<(), GatewayError> {
        let g = &cfg.gateway;
        // First, before any address is added: the kernel's reports and errors about hashed
        // addresses never leave (quiet.rs).
        self.quiet(cfg)?;
        let tun = Tun::create(&g.tun_name, u16::try_from(self.tun_mtu).unwrap_or(u16::MAX))
            .map_err(os(format!("create TUN device {:?}", g.tun_name)))?;
        let tun_index = tun.index();
        self.tun = Some(tun);

        // Hashed addresses are added with nodad; the TUN device needs no link-local DAD either.
        self.set_sysctl(&g.tun_name, "accept_dad", "0")?;
        let internal = match &g.role {
            Role::Gateway { internal_interface } => Some(internal_interface.as_str()),
            Role::Host { local_host } => {
                self.internal_index = tun_index;
                self.netlink
                    .add_address(tun_index, *local_host, 128, NO_DAD)
                    .map_err(os(format!(
                        "host mode: true address {local_host} on TUN {}",
                        g.tun_name
                    )))?;
                self.undo.push(Undo::Address {
                    index: tun_index,
                    addr: *local_host,
                    len: 128,
                });
                None
            }
        };
        if let Some(internal) = internal {
            self.set_sysctl("all", "forwarding", "1")?;
            self.set_sysctl(internal, "proxy_ndp", "1")?;
            // The kernel delays proxied neighbour advertisements by up to 0.8 s (RFC 4861
            // §7.2.8, meant for anycast); the protected host's first packet would wait that long.
            let old = sysctl::get_ipv6_neigh(internal, "proxy_delay")
                .map_err(os(format!("read {internal} proxy_delay")))?;
            sysctl::set_ipv6_neigh(internal, "proxy_delay", "0")
                .map_err(os(format!("set {internal} proxy_delay")))?;
            self.undo.push(Undo::NeighSysctl {
                iface: internal.to_string(),
                key: "proxy_delay",
                old,
            });
        }

        let mut remote_prefixes = Vec::new();
        for peer in &cfg.peers {
            let s = &peer.stream;
            let (local, remote) = (s.local.true_addr, s.remote.true_addr);
            self.route(remote, 128, tun_index)?;
            if internal.is_some() {
                self.route(local, 128, self.internal_index)?;
                self.netlink
                    .add_proxy_neighbor(self.internal_index, remote)
                    .map_err(os(format!("peer {}: proxy NDP for {remote}", peer.name)))?;
                self.undo.push(Undo::ProxyNeighbor {
                    index: self.internal_index,
                    addr: remote,
                });
            }
            let prefix = s.remote.external_prefix.unwrap_or_else(|| slash64(remote));
            if !remote_prefixes.contains(&prefix) {
                remote_prefixes.push(prefix);
                match g.external_next_hop {
                    None => self.route(prefix, 64, self.external_index)?,
                    Some(via) => {
                        self.netlink
                            .add_route_via(prefix, 64, self.external_index, via)
                            .map_err(os(format!("route {prefix}/64 via {via}")))?;
                        self.undo.push(Undo::Route {
                            dst: prefix,
                            len: 64,
                            oif: self.external_index,
                        });
                    }
                }
            }
        }
        Ok(())
    }

    /// The mt6d-owned nftables table, the external interface's sysctls and, with
    /// `randomize_link`, its random MAC and link-local address (docs/PROTOCOL.md §5.4).
    fn quiet(&mut self, cfg: &Config) -> Result<(), GatewayError> {
        let g = &cfg.gateway;
        let ext = g.external_interface.as_str();
        let table = quiet::table(cfg)?;
        let (local, remote) = quiet::hashed_prefixes(cfg);
        let body = quiet::ruleset(ext, &local, &remote, g.is_host())?;
        table.load(&body).map_err(os(format!(
            "external_interface {ext}: mt6d's nftables table"
        )))?;
        self.undo.push(Undo::Firewall {
            table,
            external: ext.to_string(),
        });
        // A Redirect on the public link could move hashed traffic to another next hop; a host
        // (forwarding off) would obey it. Routers ignore them anyway.
        self.set_sysctl(ext, "accept_redirects", "0")?;
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
        self.netlink.link_set_mac(index, mac).map_err(os(format!(
            "randomize_link: external_interface {ext} (a driver that answers EBUSY cannot change its MAC while up)"
        )))?;
        self.undo.push(Undo::LinkMac {
            index,
            mac: original,
        });
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
        self.netlink
            .add_address(index, ll, 64, flags)
            .map_err(os(format!("randomize_link: {ll} on {ext}")))?;
        self.undo.push(Undo::Address {
            index,
            addr: ll,
            len: 64,
        });
        for a in old {
            self.netlink
                .del_address(index, a.addr, a.prefix_len)
                .map_err(os(format!("randomize_link: remove {} from {ext}", a.addr)))?;
            self.undo.push(Undo::AddressBack {
                index,
                addr: a.addr,
                len: a.prefix_len,
            });
        }
        log::info!(
            "external interface {ext}: random MAC {} and link-local {ll} for this run",
            mac.map(|b| format!("{b:02x}")).join(":")
        );
        Ok(())
    }

    /// Every sysctl the daemon changes goes through here: the old value is recorded first and
    /// written back on exit.
    fn set_sysctl(
        &mut self,
        iface: &str,
        key: &'static str,
        value: &str,
    ) -> Result<(), GatewayError> {
        let old =
            sysctl::get_ipv6_conf(iface, key).map_err(os(format!("read sysctl {iface}.{key}")))?;
        sysctl::set_ipv6_conf(iface, key, value)
            .map_err(os(format!("set sysctl {iface}.{key}")))?;
        self.undo.push(Undo::Sysctl {
            iface: iface.to_string(),
            key,
            old: old.trim().to_string(),
        });
        Ok(())
    }

    fn route(&mut self, dst: Ipv6Addr, len: u8, oif: u32) -> Result<(), GatewayError> {
        self.netlink
            .add_route(dst, len, oif)
            .map_err(os(format!("route {dst}/{len}")))?;
        self.undo.push(Undo::Route { dst, len, oif });
        Ok(())
    }

    /// Reverts every change, newest first, and closes the TUN device. Continues past errors
    /// (logging them) so one stuck entry does not leave the rest behind.
    pub fn teardown(&mut self) {
        while let Some(u) = self.undo.pop() {
            let result = match &u {
                Undo::Sysctl { iface, key, old } => sysctl::set_ipv6_conf(iface, key, old),
                Undo::NeighSysctl { iface, key, old } => sysctl::set_ipv6_neigh(iface, key, old),
                Undo::Route { dst, len, oif } => self.netlink.del_route(*dst, *len, *oif),
                Undo::ProxyNeighbor { index, addr } => {
                    self.netlink.del_proxy_neighbor(*index, *addr)
                }
                Undo::Address { index, addr, len } => self.netlink.del_address(*index, *addr, *len),
                Undo::AddressBack { index, addr, len } => {
                    self.netlink.add_address(*index, *addr, *len, RESTORED)
                }
                Undo::LinkMac { index, mac } => self.netlink.link_set_mac(*index, *mac),
                Undo::Firewall { table, external } => {
                    // The addresses just removed made the kernel send MLD reports leaving their
                    // groups, repeated once after up to the report interval (RFC 3810 §6.1);
                    // the table must still drop the repeat.
                    std::thread::sleep(quiet::mld_repeat_window(external));
                    table.delete()
                }
            };
            if let Err(e) = result {
                // The TUN device may already be gone, taking its routes with it: not an error.
                log::warn!("cleanup of {u:?}: {e}");
            }
        }
        self.tun = None;
    }
}

impl Drop for System {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// The /64 containing `addr`.
pub fn slash64(addr: Ipv6Addr) -> Ipv6Addr {
    let s = addr.segments();
    Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0)
}
