//! Routes (`RTM_*ROUTE`, `struct rtmsg`, linux/rtnetlink.h): unicast routes with a device and
//! optionally a gateway, their MTU metric, the fail-closed guard (`prohibit`), and the route
//! lookup that tells whether an address is local.

use std::net::Ipv6Addr;

use super::{is_errno, Message, Netlink, AF_INET6, NLM_F_CREATE, NLM_F_REPLACE, RT_SCOPE_UNIVERSE};
use crate::error::{OsError, Result};

const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;

const RTA_DST: u16 = 1;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;
const RTA_PRIORITY: u16 = 6;
const RTA_TABLE: u16 = 15;
/// Route metrics (nested `RTAX_*`), and in them the lock bitmap and the MTU (linux/rtnetlink.h).
const RTA_METRICS: u16 = 8;
const RTAX_LOCK: u16 = 1;
const RTAX_MTU: u16 = 2;
const RTN_UNICAST: u8 = 1;
const RTN_LOCAL: u8 = 2;
const RTN_PROHIBIT: u8 = 8;

/// The main routing table (`RT_TABLE_MAIN`).
pub const MAIN_TABLE: u32 = 254;
/// The local routing table (`RT_TABLE_LOCAL`), which the kernel consults first.
pub const LOCAL_TABLE: u32 = 255;
/// `RT_SCOPE_HOST`: a route to this host itself.
const RT_SCOPE_HOST: u8 = 254;

/// The metric of a guard route ([`Netlink::add_guard_route`]): the worst there is, so any route
/// to the same prefix with a real next hop wins while it exists.
pub const GUARD_METRIC: u32 = u32::MAX;

impl Netlink {
    /// Adds (or replaces) the route `dst/prefix_len dev oif` in the main table. Idempotent.
    pub fn add_route(&mut self, dst: Ipv6Addr, prefix_len: u8, oif: u32) -> Result<()> {
        self.add_route_in_table(dst, prefix_len, oif, MAIN_TABLE)
    }

    /// Deletes the route `dst/prefix_len dev oif` from the main table; a missing route is success.
    pub fn del_route(&mut self, dst: Ipv6Addr, prefix_len: u8, oif: u32) -> Result<()> {
        self.del_route_in_table(dst, prefix_len, oif, MAIN_TABLE)
    }

    /// Adds (or replaces) `dst/prefix_len via gateway dev oif` in the main table: a prefix
    /// reached through a router (a routed deployment's remote hashed prefix). Idempotent.
    pub fn add_route_via(
        &mut self,
        dst: Ipv6Addr,
        prefix_len: u8,
        oif: u32,
        gateway: Ipv6Addr,
    ) -> Result<()> {
        let msg = route_msg_via(
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_REPLACE,
            RouteKey {
                dst,
                prefix_len,
                oif,
                table: MAIN_TABLE,
                marker: self.marker,
            },
            Some(gateway),
        );
        self.apply(msg, &[libc::EEXIST])
            .map_err(|source| OsError::Route {
                op: "add",
                dst,
                prefix_len,
                oif,
                table: MAIN_TABLE,
                source,
            })
    }

    /// [`Netlink::add_route`] with a locked MTU metric (`ip route replace ... mtu lock MTU`), or
    /// without any metric for `None`. Linux applies an unlocked route MTU only to packets the
    /// host itself sends; the lock makes forwarded packets obey it too (and get a Packet Too Big
    /// from this host when larger). Replaces the route in place (idempotent) and never creates
    /// one: a route that is gone (removed at shutdown, or by the administrator) stays gone.
    pub fn set_route_mtu(
        &mut self,
        dst: Ipv6Addr,
        prefix_len: u8,
        oif: u32,
        mtu: Option<u32>,
    ) -> Result<()> {
        // Same key as add_route (marker included, default metric): the route is replaced, the
        // guard route of the same prefix (another metric) is not.
        let mut msg = route_msg(
            RTM_NEWROUTE,
            NLM_F_REPLACE,
            RouteKey {
                dst,
                prefix_len,
                oif,
                table: MAIN_TABLE,
                marker: self.marker,
            },
        );
        if let Some(mtu) = mtu {
            let at = msg.nest_begin(RTA_METRICS);
            msg.attr(RTAX_LOCK, &(1u32 << RTAX_MTU).to_ne_bytes());
            msg.attr(RTAX_MTU, &mtu.to_ne_bytes());
            msg.nest_end(at);
        }
        self.apply(msg, &[]).map_err(|source| OsError::Route {
            op: "set the MTU of",
            dst,
            prefix_len,
            oif,
            table: MAIN_TABLE,
            source,
        })
    }

    /// [`Netlink::add_route`] in routing table `table`.
    pub fn add_route_in_table(
        &mut self,
        dst: Ipv6Addr,
        prefix_len: u8,
        oif: u32,
        table: u32,
    ) -> Result<()> {
        let msg = route_msg(
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_REPLACE,
            RouteKey {
                dst,
                prefix_len,
                oif,
                table,
                marker: self.marker,
            },
        );
        self.apply(msg, &[libc::EEXIST])
            .map_err(|source| OsError::Route {
                op: "add",
                dst,
                prefix_len,
                oif,
                table,
                source,
            })
    }

    /// [`Netlink::del_route`] in routing table `table`.
    pub fn del_route_in_table(
        &mut self,
        dst: Ipv6Addr,
        prefix_len: u8,
        oif: u32,
        table: u32,
    ) -> Result<()> {
        let msg = route_msg(
            RTM_DELROUTE,
            0,
            RouteKey {
                dst,
                prefix_len,
                oif,
                table,
                marker: self.marker,
            },
        );
        self.apply(msg, &[libc::ESRCH, libc::ENOENT, libc::ENODEV])
            .map_err(|source| OsError::Route {
                op: "delete",
                dst,
                prefix_len,
                oif,
                table,
                source,
            })
    }

    /// Makes every address of `dst/prefix_len` local (AnyIP: `ip -6 route replace local
    /// dst/prefix_len dev oif table local`): the kernel accepts datagrams to any of them and
    /// lets a socket send from any of them, with no address per host added (the server role,
    /// docs/ARCHITECTURE.md "The server role"). Idempotent; marked like every route of this
    /// socket.
    pub fn add_local_prefix(&mut self, dst: Ipv6Addr, prefix_len: u8, oif: u32) -> Result<()> {
        let msg = local_msg(
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_REPLACE,
            RouteKey {
                dst,
                prefix_len,
                oif,
                table: LOCAL_TABLE,
                marker: self.marker,
            },
        );
        self.apply(msg, &[libc::EEXIST])
            .map_err(|source| OsError::Route {
                op: "add local (AnyIP)",
                dst,
                prefix_len,
                oif,
                table: LOCAL_TABLE,
                source,
            })
    }

    /// Deletes the route of [`Netlink::add_local_prefix`]; a missing one is success.
    pub fn del_local_prefix(&mut self, dst: Ipv6Addr, prefix_len: u8, oif: u32) -> Result<()> {
        let msg = local_msg(
            RTM_DELROUTE,
            0,
            RouteKey {
                dst,
                prefix_len,
                oif,
                table: LOCAL_TABLE,
                marker: self.marker,
            },
        );
        self.apply(msg, &[libc::ESRCH, libc::ENOENT, libc::ENODEV])
            .map_err(|source| OsError::Route {
                op: "delete local (AnyIP)",
                dst,
                prefix_len,
                oif,
                table: LOCAL_TABLE,
                source,
            })
    }

    /// Adds a guard route `prohibit dst/prefix_len metric GUARD_METRIC` to the main table,
    /// marked like every route of this socket. It outlives the process that added it and
    /// loses to any other route for the same prefix (every metric is better), so it decides
    /// only when that route is gone: then the kernel drops the packet and answers the sender
    /// with "administratively prohibited" instead of falling back to a shorter prefix (a /64
    /// on-link on the external interface would otherwise solicit the destination there and send
    /// the packet in clear). Idempotent.
    pub fn add_guard_route(&mut self, dst: Ipv6Addr, prefix_len: u8) -> Result<()> {
        let msg = guard_msg(
            RTM_NEWROUTE,
            NLM_F_CREATE | NLM_F_REPLACE,
            dst,
            prefix_len,
            self.marker,
        );
        self.apply(msg, &[libc::EEXIST])
            .map_err(|source| OsError::Route {
                op: "add guard (prohibit)",
                dst,
                prefix_len,
                oif: 0,
                table: MAIN_TABLE,
                source,
            })
    }

    /// Deletes the guard route of [`Netlink::add_guard_route`] (only one with this socket's
    /// marker and [`GUARD_METRIC`]); a missing one is success.
    pub fn del_guard_route(&mut self, dst: Ipv6Addr, prefix_len: u8) -> Result<()> {
        let msg = guard_msg(RTM_DELROUTE, 0, dst, prefix_len, self.marker);
        self.apply(msg, &[libc::ESRCH, libc::ENOENT])
            .map_err(|source| OsError::Route {
                op: "delete guard (prohibit)",
                dst,
                prefix_len,
                oif: 0,
                table: MAIN_TABLE,
                source,
            })
    }

    /// Whether the kernel now delivers packets for `addr` locally (a route lookup answers
    /// `local`). The kernel installs an address's local route from a work queue, even with
    /// `nodad`, so for a moment after [`Netlink::add_address`] the address is listed but packets
    /// to it are not yet accepted; wait on this before relying on reception.
    pub fn is_local_address(&mut self, addr: Ipv6Addr) -> Result<bool> {
        let mut msg = Message::new(RTM_GETROUTE, 0);
        let mut h = [0u8; 12];
        h[0] = AF_INET6;
        h[1] = 128;
        msg.push(&h);
        msg.attr(RTA_DST, &addr.octets());
        let mut local = false;
        match self.transact(msg, |ty, payload| {
            if ty == RTM_NEWROUTE && payload.len() >= 12 {
                local = payload[7] == RTN_LOCAL;
            }
        }) {
            Ok(()) => Ok(local),
            Err(e) if is_errno(&e, &[libc::ENETUNREACH, libc::EHOSTUNREACH, libc::ENETDOWN]) => {
                Ok(false)
            }
            Err(e) => Err(OsError::Address {
                op: "look up route to",
                addr,
                prefix_len: 128,
                index: 0,
                source: e,
            }),
        }
    }
}

/// What names one unicast route: destination, output interface, table, and the marker
/// (`rtm_protocol`) it was added with. The kernel deletes only a route whose protocol matches a
/// non-zero one given, so a delete never takes a route another program added to the same prefix.
struct RouteKey {
    dst: Ipv6Addr,
    prefix_len: u8,
    oif: u32,
    table: u32,
    marker: u8,
}

/// RTM_NEWROUTE / RTM_DELROUTE with `struct rtmsg` (12 bytes) and RTA_DST/RTA_OIF/RTA_TABLE.
fn route_msg(ty: u16, flags: u16, key: RouteKey) -> Message {
    route_msg_via(ty, flags, key, None)
}

fn route_msg_via(ty: u16, flags: u16, key: RouteKey, via: Option<Ipv6Addr>) -> Message {
    typed_route_msg(ty, flags, key, via, (RT_SCOPE_UNIVERSE, RTN_UNICAST))
}

/// A route message of the given (scope, type): `struct rtmsg` and RTA_DST, RTA_OIF, the
/// optional RTA_GATEWAY and RTA_TABLE.
fn typed_route_msg(
    ty: u16,
    flags: u16,
    key: RouteKey,
    via: Option<Ipv6Addr>,
    (scope, rtype): (u8, u8),
) -> Message {
    let RouteKey {
        dst,
        prefix_len,
        oif,
        table,
        marker,
    } = key;
    let mut msg = Message::new(ty, flags);
    let mut h = [0u8; 12];
    h[0] = AF_INET6;
    h[1] = prefix_len;
    // rtm_table is 8 bits; RTA_TABLE carries the full 32-bit id.
    h[4] = if table < 256 { table as u8 } else { 0 };
    h[5] = marker;
    h[6] = scope;
    h[7] = rtype;
    msg.push(&h);
    msg.attr(RTA_DST, &dst.octets());
    msg.attr(RTA_OIF, &oif.to_ne_bytes());
    if let Some(gw) = via {
        msg.attr(RTA_GATEWAY, &gw.octets());
    }
    msg.attr(RTA_TABLE, &table.to_ne_bytes());
    msg
}

/// A `local` route (type RTN_LOCAL, scope host) in `key.table`.
fn local_msg(ty: u16, flags: u16, key: RouteKey) -> Message {
    typed_route_msg(ty, flags, key, None, (RT_SCOPE_HOST, RTN_LOCAL))
}

/// A `prohibit` route in the main table with the guard metric: no output interface (the kernel
/// hangs it on the loopback device), matched on delete by prefix, metric and marker.
fn guard_msg(ty: u16, flags: u16, dst: Ipv6Addr, prefix_len: u8, marker: u8) -> Message {
    let mut msg = Message::new(ty, flags);
    let mut h = [0u8; 12];
    h[0] = AF_INET6;
    h[1] = prefix_len;
    h[4] = MAIN_TABLE as u8;
    h[5] = marker;
    h[6] = RT_SCOPE_UNIVERSE;
    h[7] = RTN_PROHIBIT;
    msg.push(&h);
    msg.attr(RTA_DST, &dst.octets());
    msg.attr(RTA_PRIORITY, &GUARD_METRIC.to_ne_bytes());
    msg.attr(RTA_TABLE, &MAIN_TABLE.to_ne_bytes());
    msg
}
