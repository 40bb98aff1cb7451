//! The kernel state a gateway needs besides its hashed addresses, applied through mt6d-os and
//! written to the instance record ([`super::state`]) before each change is made, so that a
//! failure half way rolls back what was done, a clean exit removes everything but the
//! fail-closed guards and the routes to the protected hosts (which the next start adopts and
//! `mt6d down` lifts), and after a crash
//! `mt6d down` or the next start removes exactly what this instance owned.
//!
//! What is set up, in this order (000 §3.2.2 binds the remote host's true address to the
//! internal interface; we answer neighbour discovery for it with a proxy entry instead, and
//! route it into the TUN device, so the kernel forwards the protected host's packets to us):
//! - first, per peer, the fail-closed guard: `prohibit REMOTE/128` with the worst metric, which
//!   decides once the TUN route below is gone (the process died or stopped) and keeps the
//!   protected host's packets off the external interface (docs/ARCHITECTURE.md "Fail closed");
//!   a stop leaves it, so that nothing the gateway does without mt6d (a default route, with
//!   forwarding on) can carry them in clear before the next start;
//! - the TUN device, MTU = external MTU minus the largest tunnel overhead of any peer;
//! - `net.ipv6.conf.all.forwarding = 1` and `all.proxy_ndp = 1` (the protected hosts'
//!   unicast neighbour probes of a proxied address arrive on the forwarding path), and
//!   `proxy_ndp = 1`, `proxy_delay = 0` and `use_oif_addrs_only = 1` on the internal interface;
//! - per peer: proxy NDP entry for the remote true address on the internal interface, a /128
//!   route for it into the TUN device, a /128 route for the local true address on the internal
//!   interface, and a /64 route for the remote hashed prefix on the external interface (on-link,
//!   or through `external_next_hop` in a routed deployment).
//!
//! Host mode (001 §4, the "integrated" configuration: the true address on a virtual NIC of the
//! protected host itself) needs less: the local true address goes on the TUN device as a /128
//! (nodad), and per peer the /128 route for the remote true address into the TUN device and the
//! hashed /64 route as above. Applications then send to the peer's true address from their own,
//! and packets opened by the receiving worker are written into the TUN device and delivered locally.
//! Nothing is forwarded, so forwarding and proxy NDP are not touched; the true address is never
//! on the external interface (the kernel answers neighbour solicitations only for addresses of
//! the receiving interface), so the public link never learns it.
//!
//! A SIGHUP reload (`reload.rs`) adds or removes one peer's share of the per-peer part
//! ([`System::add_peers`], [`System::remove_peers`]) in the same order: guards first when
//! adding, last when removing; what peers share (a guard, a prefix route) stays while one of
//! them needs it, and every removal is taken off the instance record once it is done.

use mt6d_os::sysctl::{self, Sysctl};
use mt6d_os::{AddrFlags, Netlink, Tun};

use crate::config::{Config, GatewayConfig, PeerConfig, Role};

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

/// The applied state. Dropping it without [`System::teardown`] still reverts (best effort),
/// the guards excepted.
#[derive(Debug)]
pub struct System {
    pub netlink: Netlink,
    /// The TUN device's queues, one per data-plane worker (empty before set-up and after
    /// tear-down).
    pub tun: Vec<Tun>,
    /// Where the protected host's stack is reached: the internal interface, or in host mode the
    /// TUN device itself (translated ICMPv6 errors are sent there, from the true address).
    pub internal_index: u32,
    pub external_index: u32,
    /// The largest tunnel overhead of any peer at start: the TUN MTU leaves room for it, so a
    /// peer a reload adds may not need more.
    pub max_overhead: usize,
    /// The TUN device's index (the device itself is handed to the packet threads).
    tun_index: u32,
    pub tun_mtu: u32,
    /// The body of mt6d's nftables table as loaded (a reload replaces it when the hashed
    /// prefixes change).
    quiet_body: String,
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
            tun: Vec::new(),
            internal_index,
            external_index,
            max_overhead,
            tun_index: 0,
            tun_mtu,
            quiet_body: String::new(),
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
        let all: Vec<&PeerConfig> = cfg.peers.iter().collect();
        for peer in &cfg.peers {
            for change in self.peer_changes(g, peer, true) {
                self.make(&peer.name, change)?;
            }
        }

        // Then, before any address is added: the kernel's reports and errors about hashed
        // addresses never leave (quiet.rs).
        self.quiet(cfg, &all)?;

        let workers = g.worker_count();
        let tun = Tun::create(
            &g.tun_name,
            u16::try_from(self.tun_mtu).unwrap_or(u16::MAX),
            workers,
        )
        .map_err(os(format!(
            "create TUN device {:?} with {workers} queue(s)",
            g.tun_name
        )))?;
        let tun_index = tun.first().map_or(0, Tun::index);
        self.tun_index = tun_index;
        self.tun = tun;

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
            // The protected hosts check the far host's address again with unicast
            // solicitations to it (neighbour unreachability detection). Its route points into
            // the TUN device, so they arrive on the forwarding path, where the kernel looks for
            // a proxy entry only if `all.proxy_ndp` is set; without it the probes are refused
            // ("beyond scope of source address") and after three the host's entry fails. The
            // proxy entries are per interface: this answers for no other interface.
            self.set_sysctl(&ipv6_conf("all", "proxy_ndp")?, "1")?;
            // The kernel delays proxied neighbour advertisements by up to 0.8 s (RFC 4861
            // §7.2.8, meant for anycast); the protected host's first packet would wait that long.
            let delay = Sysctl::ipv6_neigh(internal, "proxy_delay")
                .map_err(os(format!("{internal} proxy_delay")))?;
            self.set_sysctl(&delay, "0")?;
            // The kernel's own messages to the protected hosts (a proxied neighbour
            // advertisement, Time Exceeded, Packet Too Big) take their source from every
            // interface's addresses (RFC 6724), and a hashed address of the external interface
            // wins over the internal one's link-local address: the host would see it. Only the
            // internal interface's own addresses are candidates for what it sends
            // (docs/PROTOCOL.md §5).
            self.set_sysctl(&ipv6_conf(internal, "use_oif_addrs_only")?, "1")?;
        }

        for peer in &cfg.peers {
            for change in self.peer_changes(g, peer, false) {
                self.make(&peer.name, change)?;
            }
        }
        Ok(())
    }

    /// The kernel changes one peer needs, in the order they are made: with `guards`, its
    /// fail-closed guard only; without, the rest: the /128 route for the remote true address
    /// into the TUN device; in gateway mode the /128 route for the local true address on the
    /// internal interface and the proxy NDP entry for the remote one; the /64 route for the
    /// remote hashed prefix on the external interface. Peers that share an address or prefix
    /// share the change (the record holds it once).
    fn peer_changes(&self, g: &GatewayConfig, peer: &PeerConfig, guards: bool) -> Vec<Change> {
        let s = &peer.stream;
        let (local, remote) = (s.local.true_addr, s.remote.true_addr);
        if guards {
            return vec![Change::Guard {
                dst: remote,
                len: 128,
            }];
        }
        let mut out = vec![Change::Route {
            dst: remote,
            len: 128,
            oif: self.tun_index,
            via: None,
        }];
        if g.internal_interface().is_some() {
            out.push(Change::Route {
                dst: local,
                len: 128,
                oif: self.internal_index,
                via: None,
            });
            out.push(Change::ProxyNeighbor {
                index: self.internal_index,
                addr: remote,
            });
        }
        let prefix = s.remote.external_prefix.unwrap_or_else(|| slash64(remote));
        out.push(Change::Route {
            dst: prefix,
            len: 64,
            oif: self.external_index,
            via: g.external_next_hop,
        });
        out
    }

    /// Records `change` (write-ahead), then makes it; adds are idempotent.
    fn make(&mut self, peer: &str, change: Change) -> Result<(), GatewayError> {
        self.record(change.clone())?;
        let nl = &mut self.netlink;
        let (result, what) = match change {
            Change::Guard { dst, len } => (
                nl.add_guard_route(dst, len),
                format!("guard route for {dst}"),
            ),
            Change::Route {
                dst,
                len,
                oif,
                via: None,
            } => (nl.add_route(dst, len, oif), format!("route {dst}/{len}")),
            Change::Route {
                dst,
                len,
                oif,
                via: Some(gw),
            } => (
                nl.add_route_via(dst, len, oif, gw),
                format!("route {dst}/{len} via {gw}"),
            ),
            Change::ProxyNeighbor { index, addr } => (
                nl.add_proxy_neighbor(index, addr),
                format!("proxy NDP for {addr}"),
            ),
            other => {
                return Err(GatewayError::Setup(format!(
                    "peer {peer}: not a per-peer change: {other:?}"
                )))
            }
        };
        result.map_err(os(format!("peer {peer}: {what}")))
    }

    /// The per-peer changes of `peers` in the order they are made: every guard first, then the
    /// rest; each once.
    fn changes_of(&self, g: &GatewayConfig, peers: &[&PeerConfig]) -> Vec<(String, Change)> {
        let mut out: Vec<(String, Change)> = Vec::new();
        for guards in [true, false] {
            for p in peers {
                for c in self.peer_changes(g, p, guards) {
                    if !out.iter().any(|(_, o)| *o == c) {
                        out.push((p.name.clone(), c));
                    }
                }
            }
        }
        out
    }

    /// Refuses a reload's peers that a running daemon of this namespace already routes.
    pub fn admit_peers(&self, peers: &[&PeerConfig]) -> Result<(), GatewayError> {
        match self.instance.as_ref() {
            Some(i) => i.admit_peers(peers),
            None => Err(GatewayError::Setup(
                "instance record already released".into(),
            )),
        }
    }

    /// Records `peers` as this instance's (for the conflict checks of other starts).
    pub fn record_peers(&mut self, peers: &[&PeerConfig]) -> Result<(), GatewayError> {
        match self.instance.as_mut() {
            Some(i) => i.set_peers(peers),
            None => Err(GatewayError::Setup(
                "instance record already released".into(),
            )),
        }
    }

    /// A reload's additions: makes the kernel changes `added` needs that `applied` (the peers
    /// running now, removed ones included: they still carry traffic) do not share: guards
    /// first, then mt6d's nftables table for both sets' hashed prefixes, then routes and proxy
    /// entries. On error, undoes what it made (guards last) and returns the error: the running
    /// set is left exactly as it was.
    pub fn add_peers(
        &mut self,
        cfg: &Config,
        applied: &[&PeerConfig],
        added: &[&PeerConfig],
    ) -> Result<(), GatewayError> {
        let have = self.changes_of(&cfg.gateway, applied);
        let new: Vec<(String, Change)> = self
            .changes_of(&cfg.gateway, added)
            .into_iter()
            .filter(|(_, c)| !have.iter().any(|(_, h)| h == c))
            .collect();
        let both: Vec<&PeerConfig> = applied.iter().chain(added).copied().collect();
        let mut done = Vec::new();
        if let Err(e) = self.add_in_order(cfg, &both, new, &mut done) {
            self.undo_peer_changes(cfg, applied, done);
            return Err(e);
        }
        Ok(())
    }

    fn add_in_order(
        &mut self,
        cfg: &Config,
        both: &[&PeerConfig],
        new: Vec<(String, Change)>,
        done: &mut Vec<Change>,
    ) -> Result<(), GatewayError> {
        let (guards, rest): (Vec<_>, Vec<_>) = new
            .into_iter()
            .partition(|(_, c)| matches!(c, Change::Guard { .. }));
        for (name, c) in guards {
            // On record before it is made: a failed add is undone too (undoing what is not
            // there is success).
            done.push(c.clone());
            self.make(&name, c)?;
        }
        // Before any route: the kernel's reports about the new hashed prefixes never leave.
        self.requiet(cfg, both)?;
        for (name, c) in rest {
            done.push(c.clone());
            self.make(&name, c)?;
        }
        Ok(())
    }

    /// A reload's removals, after the table without `removed` is live: undoes the kernel
    /// changes only `removed` needed, that no peer of `cfg` (the set now running) shares (routes and proxy entries, then mt6d's nftables table for
    /// the remaining peers, then the guards last) and takes them off the record. Continues past
    /// failures, logging them; what could not be undone stays on record for the clean-up at
    /// exit or `mt6d down`.
    pub fn remove_peers(&mut self, cfg: &Config, removed: &[&PeerConfig]) {
        let remaining: Vec<&PeerConfig> = cfg.peers.iter().collect();
        let keep = self.changes_of(&cfg.gateway, &remaining);
        let gone: Vec<Change> = self
            .changes_of(&cfg.gateway, removed)
            .into_iter()
            .map(|(_, c)| c)
            .filter(|c| !keep.iter().any(|(_, k)| k == c))
            .collect();
        self.undo_peer_changes(cfg, &remaining, gone);
    }

    /// Undoes per-peer `changes` that `remaining` does not need: routes and proxy entries
    /// newest first, then mt6d's nftables table for `remaining`, then the guards.
    fn undo_peer_changes(&mut self, cfg: &Config, remaining: &[&PeerConfig], changes: Vec<Change>) {
        let (guards, rest): (Vec<Change>, Vec<Change>) = changes
            .into_iter()
            .partition(|c| matches!(c, Change::Guard { .. }));
        self.undo_all(rest);
        if let Err(e) = self.requiet(cfg, remaining) {
            log::error!("{e}");
        }
        self.undo_all(guards);
    }

    /// Undoes `changes` newest first, taking each off the record; logs what fails (it stays on
    /// record).
    fn undo_all(&mut self, changes: Vec<Change>) {
        for c in changes.into_iter().rev() {
            let result = match self.instance.as_mut() {
                Some(i) => i.undo(&mut self.netlink, &c),
                None => Err(GatewayError::Setup(
                    "instance record already released".into(),
                )),
            };
            if let Err(e) = result {
                log::error!("{e}; left on record for the clean-up at exit or `mt6d down`");
            }
        }
    }

    /// Loads mt6d's nftables table for the hashed prefixes of `peers`, unless it holds them
    /// already.
    fn requiet(&mut self, cfg: &Config, peers: &[&PeerConfig]) -> Result<(), GatewayError> {
        let g = &cfg.gateway;
        let ext = g.external_interface.as_str();
        let (local, remote) = quiet::hashed_prefixes(peers);
        let body = quiet::ruleset(ext, &local, &remote, g.is_host())?;
        if body == self.quiet_body {
            return Ok(());
        }
        quiet::table(cfg)?.load(&body).map_err(os(format!(
            "external_interface {ext}: mt6d's nftables table"
        )))?;
        self.quiet_body = body;
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
    fn quiet(&mut self, cfg: &Config, peers: &[&PeerConfig]) -> Result<(), GatewayError> {
        let g = &cfg.gateway;
        let ext = g.external_interface.as_str();
        let table = quiet::table(cfg)?;
        let (local, remote) = quiet::hashed_prefixes(peers);
        let body = quiet::ruleset(ext, &local, &remote, g.is_host())?;
        self.record(Change::Firewall {
            table: table.name().to_string(),
            external: ext.to_string(),
        })?;
        table.load(&body).map_err(os(format!(
            "external_interface {ext}: mt6d's nftables table"
        )))?;
        self.quiet_body = body;
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

    /// Reverts every change but the fail-closed guards and the routes to the protected hosts
    /// ([`super::state::kept_at_stop`]), newest first, and closes the TUN device; returns how
    /// many guards stay (on record, for the next start to adopt or `mt6d down` to lift). Continues past errors (logging them) so one stuck entry does not leave
    /// the rest behind.
    pub fn teardown(&mut self) -> usize {
        let mut kept = 0;
        if let Some(mut instance) = self.instance.take() {
            instance.clean_up(&mut self.netlink);
            kept = instance.guards();
        }
        self.tun.clear();
        kept
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
