//! What a role answering a whole hashed /64 adds to the system, and removes again: the server
//! role (`crate::server`) and the relay role (`crate::relay`). docs/ARCHITECTURE.md, "The server
//! role", says why: one AnyIP route and one nftables table instead of an address and a socket
//! per hashed address and port.
//!
//! In set-up order: `prohibit` guard routes for the protected side's destinations (from then on
//! a crash leaves them unreachable, never reachable in clear), the TUN device with its address
//! and routes, the nftables table, the AnyIP route.
//!
//! A stop, clean or not, and a failed set-up leave the guards, the table and the AnyIP route in
//! place ([`finish`]); only the TUN device goes, with the process. That is the state a crash
//! leaves, which is closed: the guards refuse the protected side's packets, and the table drops
//! whatever neighbours keep sending to the /64 (a table deleted at the stop let the kernel
//! answer with port unreachables, or forward them back, from an address of its choice: an edge
//! gateway's true address on its hosts' link). The next start replaces each in place; `mt6d
//! down` removes them ([`PrefixSystem::tear_down`], [`PrefixSystem::lift_guards`];
//! docs/ARCHITECTURE.md "Fail closed").

pub mod ndp;

use std::net::Ipv6Addr;

use mt6d_os::nftables::NftTable;
use mt6d_os::{AddrFlags, Netlink, Tun};

/// A system change that failed, with what was being done.
#[derive(Debug, thiserror::Error)]
#[error("{what}: {source}")]
pub struct SystemError {
    pub what: String,
    pub source: mt6d_os::OsError,
}

/// Wraps an OS error with what was being done.
pub fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> SystemError {
    let what = what.into();
    move |source| SystemError { what, source }
}

/// The TUN device a role carries its protected side's packets through.
#[derive(Debug, Clone)]
pub struct TunSpec<'a> {
    pub name: &'a str,
    pub mtu: u16,
    pub queues: usize,
    /// An address of the role's own on the device (the server's true address), if any.
    pub address: Option<Ipv6Addr>,
    /// Prefixes routed into the device.
    pub routes: &'a [(Ipv6Addr, u8)],
}

/// What a role added, removed in reverse order by [`PrefixSystem::tear_down`].
pub struct PrefixSystem {
    nl: Netlink,
    table: NftTable,
    lo: u32,
    prefix: Ipv6Addr,
    /// Whether the AnyIP route is ours to remove.
    pub prefix_added: bool,
    /// Whether the nftables table is ours to remove.
    pub table_loaded: bool,
    /// Guard routes added (`Netlink::add_guard_route`): they keep the protected side's packets
    /// for these prefixes off the external interface once the TUN routes are gone with a
    /// stopped or killed process. Removed only by `mt6d down` ([`PrefixSystem::lift_guards`]).
    pub guards: Vec<(Ipv6Addr, u8)>,
}

impl std::fmt::Debug for PrefixSystem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixSystem")
            .field("table", &self.table.spec())
            .field("prefix", &self.prefix)
            .field("prefix_added", &self.prefix_added)
            .field("table_loaded", &self.table_loaded)
            .field("guards", &self.guards)
            .finish_non_exhaustive()
    }
}

impl PrefixSystem {
    /// Nothing added yet; `table` names the role's nftables table, `prefix` its hashed /64.
    pub fn new(table: &str, prefix: Ipv6Addr) -> Result<PrefixSystem, SystemError> {
        let mut nl = Netlink::open().map_err(os("open rtnetlink"))?;
        let lo = nl.link_index("lo").map_err(os("find lo"))?;
        let table = NftTable::new(&table.replace(['-', '.'], "_"))
            .map_err(os("name the nftables table"))?;
        Ok(PrefixSystem {
            nl,
            table,
            lo,
            prefix,
            prefix_added: false,
            table_loaded: false,
            guards: Vec::new(),
        })
    }

    /// The nftables table as `nft` names it.
    pub fn table_spec(&self) -> String {
        self.table.spec()
    }

    /// Checks that `interface` exists before anything is added.
    pub fn check_interface(&mut self, interface: &str, role: &str) -> Result<u32, SystemError> {
        self.nl
            .link_index(interface)
            .map_err(os(format!("find {role} {interface}")))
    }

    /// The link-layer address of `interface` (None: it has none, a point-to-point device).
    pub fn link_mac(&mut self, interface: &str) -> Result<Option<[u8; 6]>, SystemError> {
        let i = self.check_interface(interface, "interface")?;
        self.nl
            .link_mac(i)
            .map_err(os(format!("read the link-layer address of {interface}")))
    }

    /// Adds a guard route per prefix: first, so that from here on a crash leaves them
    /// unreachable rather than reachable in clear. Replaces in place the guard a stopped
    /// predecessor left (`NLM_F_REPLACE`): there is no moment without it.
    pub fn add_guards(&mut self, routes: &[(Ipv6Addr, u8)]) -> Result<(), SystemError> {
        for &(p, len) in routes {
            self.nl
                .add_guard_route(p, len)
                .map_err(os(format!("add the guard route for {p}/{len}")))?;
            self.guards.push((p, len));
        }
        Ok(())
    }

    /// Creates the TUN device (one queue per worker), its address and its routes. The device,
    /// address and routes go with the last queue's file descriptor.
    pub fn create_tun(&mut self, spec: &TunSpec<'_>) -> Result<Vec<Tun>, SystemError> {
        let tuns = Tun::create(spec.name, spec.mtu, spec.queues)
            .map_err(os(format!("create TUN device {}", spec.name)))?;
        let index = tuns[0].index();
        if let Some(a) = spec.address {
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: true,
            };
            self.nl
                .add_address(index, a, 128, flags)
                .map_err(os(format!("add the address {a} to {}", spec.name)))?;
        }
        for &(p, len) in spec.routes {
            self.nl
                .add_route(p, len, index)
                .map_err(os(format!("route {p}/{len} into {}", spec.name)))?;
        }
        Ok(tuns)
    }

    /// Loads the table with `rules` (replacing a predecessor's in one transaction), then makes
    /// the /64 local as a whole (AnyIP route on lo): the table first, so that nothing sent to
    /// the /64 is ever local without it.
    pub fn claim_prefix(&mut self, rules: &str) -> Result<(), SystemError> {
        self.nl.link_set_up(self.lo).map_err(os("bring lo up"))?;
        self.table_loaded = true;
        self.table
            .load(rules)
            .map_err(os(format!("load nftables table {}", self.table.spec())))?;
        // A route left by a stopped or crashed run is replaced, not an error.
        let _ = self.nl.del_local_prefix(self.prefix, 64, self.lo);
        self.prefix_added = true;
        self.nl
            .add_local_prefix(self.prefix, 64, self.lo)
            .map_err(os(format!(
                "make {}/64 local (AnyIP route on lo)",
                self.prefix
            )))?;
        Ok(())
    }

    /// Removes the AnyIP route, then the table (`mt6d down`, once the role is known not to
    /// run; the guards are [`PrefixSystem::lift_guards`]'s); returns what could not be removed.
    pub fn tear_down(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        if self.prefix_added {
            match self.nl.del_local_prefix(self.prefix, 64, self.lo) {
                Ok(()) => {}
                // Already gone: nothing left.
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => {}
                Err(e) => left.push(format!("AnyIP route {}/64: {e}", self.prefix)),
            }
            self.prefix_added = false;
        }
        if self.table_loaded {
            if let Err(e) = self.table.delete() {
                left.push(format!("nftables table {}: {e}", self.table.spec()));
            }
            self.table_loaded = false;
        }
        left
    }

    /// Removes the guard routes (`mt6d down`, once the role is known not to run); returns what
    /// could not be removed.
    pub fn lift_guards(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        for (p, len) in std::mem::take(&mut self.guards) {
            if let Err(e) = self.nl.del_guard_route(p, len) {
                left.push(format!("guard route {p}/{len}: {e}"));
            }
        }
        left
    }

    /// Whether a link named `name` exists in this namespace (a running role's TUN device).
    pub fn link_exists(&mut self, name: &str) -> bool {
        self.nl.link_index(name).is_ok()
    }
}

/// Ends a role's run (the workers have stopped): leaves what keeps it closed in place (the
/// guards, the table, the AnyIP route: see the module documentation) and says so, then reports
/// the run's own error, else the signal that stopped it (at info).
pub fn finish<E: Into<Box<dyn std::error::Error>>>(
    result: Result<(), E>,
    system: &mut PrefixSystem,
    signals: &crate::daemon::signals::Signals,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut kept: Vec<String> = system
        .guards
        .iter()
        .map(|(p, l)| format!("guard route {p}/{l}"))
        .collect();
    if system.table_loaded {
        kept.push(format!("nftables table {}", system.table_spec()));
    }
    if system.prefix_added {
        kept.push(format!("AnyIP route {}/64", system.prefix));
    }
    if !kept.is_empty() {
        log::info!(
            "kept until the next start or `mt6d down -c FILE` (fail closed): {}",
            kept.join(", ")
        );
    }
    result.map_err(Into::into)?;
    if let Some(sig) = signals.stopped_by() {
        log::info!("stopped by {sig}");
    }
    Ok(())
}

/// Where the tproxy rule hands the prefix's datagrams, and the role's transparent sockets are
/// bound: loopback, so that nothing sent to the host's own addresses (its true address, a
/// link-local one) on the port reaches them, only what the rule hands over.
pub const TPROXY_ADDR: Ipv6Addr = Ipv6Addr::LOCALHOST;

/// The table of a role answering `prefix`/64: UDP to the prefix goes to the role's transparent
/// sockets on `[::1]:port` (each datagram keeps its destination, which the sockets read); anything
/// else to the prefix is dropped before the kernel could answer it (echo replies, TCP resets,
/// unreachables).
///
/// `tproxy` ends its rule when no socket listens (the daemon was killed and its table is still
/// there): the last rule then drops the datagram. Without it the datagram was delivered to the
/// AnyIP route, found no socket, and the kernel answered with a port unreachable from an
/// address of its choice, an edge gateway's address on its hosts' link among them (found by
/// tests/relay_failclosed_netns.rs). With a socket, `accept` ends the chain before that rule.
pub fn ruleset(prefix: Ipv6Addr, port: u16) -> String {
    format!(
        "chain prerouting {{\n\
         \ttype filter hook prerouting priority mangle; policy accept;\n\
         \tip6 daddr {prefix}/64 meta l4proto != udp counter drop\n\
         \tip6 daddr {prefix}/64 meta l4proto udp tproxy ip6 to [{TPROXY_ADDR}]:{port} accept\n\
         \tip6 daddr {prefix}/64 counter drop\n\
         }}"
    )
}
