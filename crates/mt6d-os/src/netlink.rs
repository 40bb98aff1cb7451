//! `Netlink`: a blocking rtnetlink (NETLINK_ROUTE) client for links, IPv6 addresses, routes
//! and neighbour entries.
//!
//! Messages are built by hand from the uapi layouts (`linux/rtnetlink.h`, `if_link.h`,
//! `if_addr.h`, `neighbour.h`, `veth.h`); every request asks for an ACK and the kernel's errno
//! is returned with the object it concerned. Changes are idempotent, as in innernet's
//! `shared/src/netlink.rs`: adds use `NLM_F_CREATE | NLM_F_REPLACE` and treat `EEXIST` as done,
//! deletes treat `ENOENT`/`EADDRNOTAVAIL`/`ESRCH`/`ENODEV` as done, so a daemon restarted in the
//! middle of an address rotation converges instead of failing.
//!
//! The socket lives in the network namespace of the thread that called [`Netlink::open`], and
//! keeps acting on that namespace whichever thread uses it later.
//!
//! This module owns no policy: which addresses, routes and neighbours exist is decided by the
//! daemon from mt6d-proto's output.

use std::io;
use std::net::Ipv6Addr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use crate::error::{OsError, Result};
use crate::sys;

// uapi constants, spelled out so that the message layouts below can be checked against the
// kernel headers in one place.
const NLMSG_HDR_LEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;

const RTM_NEWLINK: u16 = 16;
const RTM_DELLINK: u16 = 17;
const RTM_GETLINK: u16 = 18;
const RTM_NEWADDR: u16 = 20;
const RTM_DELADDR: u16 = 21;
const RTM_GETADDR: u16 = 22;
const RTM_NEWROUTE: u16 = 24;
const RTM_DELROUTE: u16 = 25;
const RTM_GETROUTE: u16 = 26;
const RTM_NEWNEIGH: u16 = 28;
const RTM_DELNEIGH: u16 = 29;
const RTM_GETNEIGH: u16 = 30;

const IFLA_ADDRESS: u16 = 1;
const IFLA_IFNAME: u16 = 3;
const IFLA_MTU: u16 = 4;
const IFLA_LINKINFO: u16 = 18;
const IFLA_NET_NS_FD: u16 = 28;
const IFLA_INFO_KIND: u16 = 1;
const IFLA_INFO_DATA: u16 = 2;
const VETH_INFO_PEER: u16 = 1;

const IFA_ADDRESS: u16 = 1;
const IFA_LOCAL: u16 = 2;
const IFA_FLAGS: u16 = 8;
/// `IFA_PROTO` (Linux 6.1): who added the address; an older kernel ignores it.
const IFA_PROTO: u16 = 11;
const IFA_F_NODAD: u32 = 0x02;
const IFA_F_DADFAILED: u32 = 0x08;
const IFA_F_TENTATIVE: u32 = 0x40;
const IFA_F_NOPREFIXROUTE: u32 = 0x200;

const RTA_DST: u16 = 1;
const RTA_GATEWAY: u16 = 5;
const RTA_OIF: u16 = 4;
const RTA_PRIORITY: u16 = 6;
const RTA_TABLE: u16 = 15;
/// Route metrics (nested `RTAX_*`), and in them the lock bitmap and the MTU (linux/rtnetlink.h).
const RTA_METRICS: u16 = 8;
const RTAX_LOCK: u16 = 1;
const RTAX_MTU: u16 = 2;
const RTPROT_STATIC: u8 = 4;
const RT_SCOPE_UNIVERSE: u8 = 0;
const RTN_UNICAST: u8 = 1;
const RTN_LOCAL: u8 = 2;
const RTN_PROHIBIT: u8 = 8;

const NDA_DST: u16 = 1;
const NDA_LLADDR: u16 = 2;
/// `NDA_PROTOCOL` (linux/neighbour.h): who added the entry, like a route's protocol.
const NDA_PROTOCOL: u16 = 12;
const NUD_REACHABLE: u16 = 0x02;
const NUD_PERMANENT: u16 = 0x80;
const NTF_PROXY: u8 = 0x08;

const NLA_TYPE_MASK: u16 = 0x3fff;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// The main routing table (`RT_TABLE_MAIN`).
pub const MAIN_TABLE: u32 = 254;

/// The metric of a guard route ([`Netlink::add_guard_route`]): the worst there is, so any route
/// to the same prefix with a real next hop wins while it exists.
pub const GUARD_METRIC: u32 = u32::MAX;

/// Flags for [`Netlink::add_address`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AddrFlags {
    /// `IFA_F_NODAD`: usable at once, no duplicate address detection. Hashed addresses rotate
    /// every few seconds and cannot wait the ~1 s DAD takes.
    pub nodad: bool,
    /// `IFA_F_NOPREFIXROUTE`: do not add a route for the prefix.
    pub noprefixroute: bool,
}

/// One IPv6 address as listed by [`Netlink::list_addresses`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddrInfo {
    /// The address.
    pub addr: Ipv6Addr,
    /// Its prefix length.
    pub prefix_len: u8,
    /// DAD has not finished: the kernel will not yet use it as a source.
    pub tentative: bool,
    /// DAD found a duplicate.
    pub dadfailed: bool,
    /// `IFA_PROTO`: the marker of whoever added it (0 when unset or on kernels before 6.1).
    pub proto: u8,
}

/// One IPv6 neighbour entry as listed by [`Netlink::list_neighbors`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NeighInfo {
    pub addr: Ipv6Addr,
    /// The link-layer address, when the entry has one.
    pub lladdr: Option<[u8; 6]>,
    /// `ndm_state` (NUD_* bits).
    pub state: u16,
    /// `NDA_PROTOCOL`: the marker of whoever added it (0 when unset).
    pub proto: u8,
}

/// A blocking rtnetlink socket. Not shared between threads: give each thread its own.
#[derive(Debug)]
pub struct Netlink {
    fd: OwnedFd,
    seq: u32,
    rx: Vec<u8>,
    /// Ownership marker put on every route (`rtm_protocol`), address (`IFA_PROTO`) and
    /// neighbour entry (`NDA_PROTOCOL`) this socket adds, and required of every route it
    /// deletes; see [`Netlink::set_marker`].
    marker: u8,
}

/// Display of a link known only by index, for error context.
fn link_ref(index: u32) -> String {
    format!("#{index}")
}

fn is_errno(e: &io::Error, codes: &[i32]) -> bool {
    e.raw_os_error().is_some_and(|c| codes.contains(&c))
}

impl Netlink {
    /// Opens an rtnetlink socket in the calling thread's network namespace.
    pub fn open() -> Result<Netlink> {
        let fd = sys::socket(libc::AF_NETLINK, libc::SOCK_RAW, libc::NETLINK_ROUTE).map_err(
            |source| OsError::Netlink {
                op: "open socket",
                source,
            },
        )?;
        // Large dumps (many addresses during a rotation) must not overflow the receive queue.
        let _ = sys::setsockopt(fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF, &(1i32 << 20));
        Ok(Netlink {
            fd,
            seq: 0,
            rx: vec![0; 64 * 1024],
            marker: RTPROT_STATIC,
        })
    }

    /// Marks every route, address and neighbour entry this socket adds from now on with
    /// `marker` (a route protocol number, `ip route show proto N`; the address protocol, `ip
    /// addr` shows `proto N`; the neighbour protocol, `ip neigh show proto N`), and deletes
    /// only routes that carry it. A daemon uses its own number so that
    /// its objects are told apart from an operator's or another program's (RFC 3549 leaves
    /// numbers above `RTPROT_STATIC` to routing daemons). Default: `static` for routes, unset
    /// for addresses.
    pub fn set_marker(&mut self, marker: u8) {
        self.marker = marker;
    }

    /// The index of interface `name`.
    pub fn link_index(&mut self, name: &str) -> Result<u32> {
        let ctx = |source| OsError::Link {
            op: "look up index".into(),
            link: name.to_owned(),
            source,
        };
        let mut msg = Message::new(RTM_GETLINK, 0);
        msg.push(&ifinfomsg(0, 0, 0));
        msg.attr_str(IFLA_IFNAME, name).map_err(ctx)?;
        let mut index = None;
        self.transact(msg, |_, payload| {
            if let Some(h) = payload.get(4..8) {
                index = Some(u32::from_ne_bytes([h[0], h[1], h[2], h[3]]));
            }
        })
        .map_err(ctx)?;
        index.ok_or_else(|| ctx(io::Error::from_raw_os_error(libc::ENODEV)))
    }

    /// The name of interface `index`.
    pub fn link_name(&mut self, index: u32) -> Result<String> {
        let attrs = self.get_link(index, "look up name")?;
        attrs
            .iter()
            .find(|(t, _)| *t == IFLA_IFNAME)
            .map(|(_, v)| {
                String::from_utf8_lossy(v.split(|&b| b == 0).next().unwrap_or(&[])).into_owned()
            })
            .ok_or_else(|| OsError::Link {
                op: "look up name".into(),
                link: link_ref(index),
                source: io::Error::from(io::ErrorKind::InvalidData),
            })
    }

    /// The link-layer (MAC) address of interface `index`, if it has a 6-byte one (TUN has none).
    pub fn link_mac(&mut self, index: u32) -> Result<Option<[u8; 6]>> {
        let attrs = self.get_link(index, "look up MAC address")?;
        Ok(attrs
            .iter()
            .find(|(t, _)| *t == IFLA_ADDRESS)
            .and_then(|(_, v)| <[u8; 6]>::try_from(v.as_slice()).ok()))
    }

    /// Brings interface `index` up.
    pub fn link_set_up(&mut self, index: u32) -> Result<()> {
        self.link_set_flags(index, libc::IFF_UP as u32, libc::IFF_UP as u32, "set up")
    }

    /// Brings interface `index` down.
    pub fn link_set_down(&mut self, index: u32) -> Result<()> {
        self.link_set_flags(index, 0, libc::IFF_UP as u32, "set down")
    }

    /// Sets the MTU of interface `index`.
    pub fn link_set_mtu(&mut self, index: u32, mtu: u32) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr(IFLA_MTU, &mtu.to_ne_bytes());
        self.transact(msg, |_, _| ())
            .map_err(|source| OsError::Link {
                op: format!("set mtu {mtu}"),
                link: link_ref(index),
                source,
            })
    }

    /// Sets the link-layer (MAC) address of interface `index`. Most drivers (veth among them)
    /// accept it while the link is up; the others answer EBUSY.
    pub fn link_set_mac(&mut self, index: u32, mac: [u8; 6]) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr(IFLA_ADDRESS, &mac);
        self.transact(msg, |_, _| ())
            .map_err(|source| OsError::Link {
                op: format!(
                    "set MAC address {}",
                    mac.map(|b| format!("{b:02x}")).join(":")
                ),
                link: link_ref(index),
                source,
            })
    }

    /// Renames interface `index` (the kernel requires it to be down).
    pub fn link_rename(&mut self, index: u32, new_name: &str) -> Result<()> {
        let ctx = |source| OsError::Link {
            op: format!("rename to {new_name}"),
            link: link_ref(index),
            source,
        };
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr_str(IFLA_IFNAME, new_name).map_err(ctx)?;
        self.transact(msg, |_, _| ()).map_err(ctx)
    }

    /// Creates a veth pair `name` <-> `peer_name` in this socket's namespace; both start down.
    /// Fails with EEXIST if `name` exists (a lab helper: delete and retry).
    pub fn create_veth(&mut self, name: &str, peer_name: &str) -> Result<()> {
        let ctx = |source| OsError::Link {
            op: format!("create veth with peer {peer_name}"),
            link: name.to_owned(),
            source,
        };
        let mut msg = Message::new(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL);
        msg.push(&ifinfomsg(0, 0, 0));
        msg.attr_str(IFLA_IFNAME, name).map_err(ctx)?;
        let linkinfo = msg.nest_begin(IFLA_LINKINFO);
        msg.attr(IFLA_INFO_KIND, b"veth");
        let data = msg.nest_begin(IFLA_INFO_DATA);
        let peer = msg.nest_begin(VETH_INFO_PEER);
        msg.push(&ifinfomsg(0, 0, 0));
        msg.attr_str(IFLA_IFNAME, peer_name).map_err(ctx)?;
        msg.nest_end(peer);
        msg.nest_end(data);
        msg.nest_end(linkinfo);
        self.transact(msg, |_, _| ()).map_err(ctx)
    }

    /// Moves interface `index` into the network namespace open at `netns_fd`
    /// (see [`crate::netns::Netns::fd`]). Its index may change there: look it up by name.
    pub fn move_link_to_netns(&mut self, index: u32, netns_fd: RawFd) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        msg.attr(IFLA_NET_NS_FD, &(netns_fd as u32).to_ne_bytes());
        self.transact(msg, |_, _| ())
            .map_err(|source| OsError::Link {
                op: "move to another network namespace".into(),
                link: link_ref(index),
                source,
            })
    }

    /// Deletes interface `index`; a link that is already gone is success.
    pub fn delete_link(&mut self, index: u32) -> Result<()> {
        let mut msg = Message::new(RTM_DELLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::ENODEV, libc::ENOENT]) => Err(OsError::Link {
                op: "delete".into(),
                link: link_ref(index),
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Adds (or updates the flags of) `addr/prefix_len` on interface `index`. Idempotent.
    pub fn add_address(
        &mut self,
        index: u32,
        addr: Ipv6Addr,
        prefix_len: u8,
        flags: AddrFlags,
    ) -> Result<()> {
        let ctx = |source| OsError::Address {
            op: "add",
            addr,
            prefix_len,
            index,
            source,
        };
        if prefix_len > 128 {
            return Err(ctx(io::Error::from_raw_os_error(libc::EINVAL)));
        }
        let mut ifa_flags = 0u32;
        if flags.nodad {
            ifa_flags |= IFA_F_NODAD;
        }
        if flags.noprefixroute {
            ifa_flags |= IFA_F_NOPREFIXROUTE;
        }
        let mut msg = Message::new(RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE);
        msg.push(&ifaddrmsg(index, prefix_len, ifa_flags as u8));
        msg.attr(IFA_LOCAL, &addr.octets());
        msg.attr(IFA_ADDRESS, &addr.octets());
        msg.attr(IFA_FLAGS, &ifa_flags.to_ne_bytes());
        if self.marker != RTPROT_STATIC {
            msg.attr(IFA_PROTO, &[self.marker]);
        }
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::EEXIST]) => Err(ctx(e)),
            _ => Ok(()),
        }
    }

    /// Deletes `addr/prefix_len` from interface `index`; an address that is not there is success.
    pub fn del_address(&mut self, index: u32, addr: Ipv6Addr, prefix_len: u8) -> Result<()> {
        let mut msg = Message::new(RTM_DELADDR, 0);
        msg.push(&ifaddrmsg(index, prefix_len, 0));
        msg.attr(IFA_LOCAL, &addr.octets());
        msg.attr(IFA_ADDRESS, &addr.octets());
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::ENOENT, libc::EADDRNOTAVAIL, libc::ENODEV]) => {
                Err(OsError::Address {
                    op: "delete",
                    addr,
                    prefix_len,
                    index,
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    /// The IPv6 addresses on interface `index`.
    pub fn list_addresses(&mut self, index: u32) -> Result<Vec<AddrInfo>> {
        let mut msg = Message::new(RTM_GETADDR, NLM_F_DUMP);
        msg.push(&ifaddrmsg(0, 0, 0));
        let mut out = Vec::new();
        self.transact(msg, |ty, payload| {
            if ty != RTM_NEWADDR || payload.len() < 8 || payload[0] != AF_INET6 {
                return;
            }
            let ifa_index = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
            if ifa_index != index {
                return;
            }
            let mut flags = u32::from(payload[2]);
            let mut addr = None;
            let mut proto = 0;
            for (t, v) in Attrs(&payload[8..]) {
                match t {
                    IFA_ADDRESS => addr = <[u8; 16]>::try_from(v).ok().map(Ipv6Addr::from),
                    // IFA_FLAGS carries all 32 bits; ifa_flags only the low 8.
                    IFA_FLAGS => {
                        if let Ok(b) = <[u8; 4]>::try_from(v) {
                            flags = u32::from_ne_bytes(b);
                        }
                    }
                    IFA_PROTO => proto = v.first().copied().unwrap_or(0),
                    _ => {}
                }
            }
            if let Some(addr) = addr {
                out.push(AddrInfo {
                    addr,
                    prefix_len: payload[1],
                    tentative: flags & IFA_F_TENTATIVE != 0,
                    dadfailed: flags & IFA_F_DADFAILED != 0,
                    proto,
                });
            }
        })
        .map_err(|source| OsError::Link {
            op: "list addresses".into(),
            link: link_ref(index),
            source,
        })?;
        Ok(out)
    }

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
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::EEXIST]) => Err(OsError::Route {
                op: "add",
                dst,
                prefix_len,
                oif,
                table: MAIN_TABLE,
                source: e,
            }),
            _ => Ok(()),
        }
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
        self.transact(msg, |_, _| ())
            .map(drop)
            .map_err(|source| OsError::Route {
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
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::EEXIST]) => Err(OsError::Route {
                op: "add",
                dst,
                prefix_len,
                oif,
                table,
                source: e,
            }),
            _ => Ok(()),
        }
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
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::ESRCH, libc::ENOENT, libc::ENODEV]) => {
                Err(OsError::Route {
                    op: "delete",
                    dst,
                    prefix_len,
                    oif,
                    table,
                    source: e,
                })
            }
            _ => Ok(()),
        }
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
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::EEXIST]) => Err(OsError::Route {
                op: "add guard (prohibit)",
                dst,
                prefix_len,
                oif: 0,
                table: MAIN_TABLE,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Deletes the guard route of [`Netlink::add_guard_route`] (only one with this socket's
    /// marker and [`GUARD_METRIC`]); a missing one is success.
    pub fn del_guard_route(&mut self, dst: Ipv6Addr, prefix_len: u8) -> Result<()> {
        let msg = guard_msg(RTM_DELROUTE, 0, dst, prefix_len, self.marker);
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::ESRCH, libc::ENOENT]) => Err(OsError::Route {
                op: "delete guard (prohibit)",
                dst,
                prefix_len,
                oif: 0,
                table: MAIN_TABLE,
                source: e,
            }),
            _ => Ok(()),
        }
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

    /// Adds a proxy-NDP entry: interface `index` answers neighbour solicitations for `addr`
    /// (needs `proxy_ndp=1` on it, see [`crate::sysctl`]). Idempotent.
    pub fn add_proxy_neighbor(&mut self, index: u32, addr: Ipv6Addr) -> Result<()> {
        let mut msg = Message::new(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE);
        msg.push(&ndmsg(index, NUD_PERMANENT, NTF_PROXY));
        msg.attr(NDA_DST, &addr.octets());
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::EEXIST]) => Err(OsError::Neighbor {
                op: "add proxy",
                addr,
                index,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Deletes a proxy-NDP entry; a missing one is success.
    pub fn del_proxy_neighbor(&mut self, index: u32, addr: Ipv6Addr) -> Result<()> {
        let mut msg = Message::new(RTM_DELNEIGH, 0);
        msg.push(&ndmsg(index, 0, NTF_PROXY));
        msg.attr(NDA_DST, &addr.octets());
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::ENOENT, libc::ESRCH, libc::ENODEV]) => {
                Err(OsError::Neighbor {
                    op: "delete proxy",
                    addr,
                    index,
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    /// Adds (or replaces) the neighbour entry `addr lladdr` on interface `index`, permanent or
    /// reachable (then subject to normal NUD ageing). Idempotent.
    pub fn add_neighbor(
        &mut self,
        index: u32,
        addr: Ipv6Addr,
        lladdr: [u8; 6],
        permanent: bool,
    ) -> Result<()> {
        let state = if permanent {
            NUD_PERMANENT
        } else {
            NUD_REACHABLE
        };
        let mut msg = Message::new(RTM_NEWNEIGH, NLM_F_CREATE | NLM_F_REPLACE);
        msg.push(&ndmsg(index, state, 0));
        msg.attr(NDA_DST, &addr.octets());
        msg.attr(NDA_LLADDR, &lladdr);
        if self.marker != RTPROT_STATIC {
            msg.attr(NDA_PROTOCOL, &[self.marker]);
        }
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::EEXIST]) => Err(OsError::Neighbor {
                op: "add",
                addr,
                index,
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// The link-layer address of the neighbour entry for `addr` on interface `index`, if there
    /// is one in a state that holds a usable address (reachable, stale, delay, probe,
    /// permanent); `None` for no entry, or one still resolving or failed.
    pub fn neighbor_lladdr(&mut self, index: u32, addr: Ipv6Addr) -> Result<Option<[u8; 6]>> {
        // NUD_REACHABLE | NUD_STALE | NUD_DELAY | NUD_PROBE | NUD_PERMANENT (linux/neighbour.h).
        const USABLE: u16 = 0x02 | 0x04 | 0x08 | 0x10 | 0x80;
        let mut msg = Message::new(RTM_GETNEIGH, 0);
        msg.push(&ndmsg(index, 0, 0));
        msg.attr(NDA_DST, &addr.octets());
        let mut found = None;
        let result = self.transact(msg, |ty, payload| {
            if ty != RTM_NEWNEIGH || payload.len() < 12 {
                return;
            }
            let state = u16::from_ne_bytes([payload[8], payload[9]]);
            if state & USABLE != 0 {
                found = Attrs(&payload[12..])
                    .find(|(t, _)| *t == NDA_LLADDR)
                    .and_then(|(_, v)| <[u8; 6]>::try_from(v).ok());
            }
        });
        match result {
            Err(e) if !is_errno(&e, &[libc::ENOENT]) => Err(OsError::Neighbor {
                op: "look up",
                addr,
                index,
                source: e,
            }),
            _ => Ok(found),
        }
    }

    /// Every IPv6 neighbour entry on interface `index` (not the proxy entries).
    pub fn list_neighbors(&mut self, index: u32) -> Result<Vec<NeighInfo>> {
        let mut msg = Message::new(RTM_GETNEIGH, NLM_F_DUMP);
        msg.push(&ndmsg(0, 0, 0));
        let mut out = Vec::new();
        self.transact(msg, |ty, payload| {
            if ty != RTM_NEWNEIGH || payload.len() < 12 || payload[0] != AF_INET6 {
                return;
            }
            let ifindex = u32::from_ne_bytes([payload[4], payload[5], payload[6], payload[7]]);
            if ifindex != index || payload[10] & NTF_PROXY != 0 {
                return;
            }
            let state = u16::from_ne_bytes([payload[8], payload[9]]);
            let (mut addr, mut lladdr, mut proto) = (None, None, 0);
            for (t, v) in Attrs(&payload[12..]) {
                match t {
                    NDA_DST => addr = <[u8; 16]>::try_from(v).ok().map(Ipv6Addr::from),
                    NDA_LLADDR => lladdr = <[u8; 6]>::try_from(v).ok(),
                    NDA_PROTOCOL => proto = v.first().copied().unwrap_or(0),
                    _ => {}
                }
            }
            if let Some(addr) = addr {
                out.push(NeighInfo {
                    addr,
                    lladdr,
                    state,
                    proto,
                });
            }
        })
        .map_err(|source| OsError::Link {
            op: "list neighbours".into(),
            link: link_ref(index),
            source,
        })?;
        Ok(out)
    }

    /// Deletes the neighbour entry for `addr` on interface `index`; a missing one is success.
    pub fn del_neighbor(&mut self, index: u32, addr: Ipv6Addr) -> Result<()> {
        let mut msg = Message::new(RTM_DELNEIGH, 0);
        msg.push(&ndmsg(index, 0, 0));
        msg.attr(NDA_DST, &addr.octets());
        match self.transact(msg, |_, _| ()) {
            Err(e) if !is_errno(&e, &[libc::ENOENT, libc::ESRCH, libc::ENODEV]) => {
                Err(OsError::Neighbor {
                    op: "delete",
                    addr,
                    index,
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    fn link_set_flags(&mut self, index: u32, flags: u32, change: u32, op: &str) -> Result<()> {
        let mut msg = Message::new(RTM_NEWLINK, 0);
        msg.push(&ifinfomsg(index, flags, change));
        self.transact(msg, |_, _| ())
            .map_err(|source| OsError::Link {
                op: op.into(),
                link: link_ref(index),
                source,
            })
    }

    /// RTM_GETLINK for `index`, returning its top-level attributes.
    fn get_link(&mut self, index: u32, op: &str) -> Result<Vec<(u16, Vec<u8>)>> {
        let mut msg = Message::new(RTM_GETLINK, 0);
        msg.push(&ifinfomsg(index, 0, 0));
        let mut attrs = Vec::new();
        self.transact(msg, |ty, payload| {
            if ty == RTM_NEWLINK && payload.len() >= 16 {
                attrs = Attrs(&payload[16..])
                    .map(|(t, v)| (t, v.to_vec()))
                    .collect();
            }
        })
        .map_err(|source| OsError::Link {
            op: op.into(),
            link: link_ref(index),
            source,
        })?;
        Ok(attrs)
    }

    /// Sends `msg` with NLM_F_REQUEST|NLM_F_ACK and hands every reply message of ours to `each`
    /// (type, payload after the nlmsghdr) until the kernel's ACK, error or end of dump.
    fn transact(&mut self, mut msg: Message, mut each: impl FnMut(u16, &[u8])) -> io::Result<()> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let req = msg.finish(seq);
        sys::send(self.fd.as_fd(), req)?;
        loop {
            let n = match sys::recv(self.fd.as_fd(), &mut self.rx, 0) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                r => r?,
            };
            let mut buf = &self.rx[..n];
            while buf.len() >= NLMSG_HDR_LEN {
                let len = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
                if len < NLMSG_HDR_LEN || len > buf.len() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "truncated netlink message",
                    ));
                }
                let ty = u16::from_ne_bytes([buf[4], buf[5]]);
                let msg_seq = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
                let payload = &buf[NLMSG_HDR_LEN..len];
                buf = buf.get(align4(len)..).unwrap_or(&[]);
                // Replies to an earlier request that failed half-way are not ours.
                if msg_seq != seq {
                    continue;
                }
                match ty {
                    NLMSG_ERROR | NLMSG_DONE => {
                        let code = payload
                            .get(..4)
                            .map_or(0, |b| i32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
                        return if code < 0 {
                            Err(io::Error::from_raw_os_error(-code))
                        } else {
                            Ok(())
                        };
                    }
                    _ => each(ty, payload),
                }
            }
        }
    }
}

impl AsRawFd for Netlink {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

const fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// An rtnetlink request being built: nlmsghdr, a fixed family header, then attributes.
struct Message {
    buf: Vec<u8>,
}

impl Message {
    fn new(ty: u16, flags: u16) -> Message {
        let mut buf = Vec::with_capacity(256);
        buf.extend_from_slice(&0u32.to_ne_bytes()); // length, set by finish
        buf.extend_from_slice(&ty.to_ne_bytes());
        buf.extend_from_slice(&(flags | NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
        buf.extend_from_slice(&0u32.to_ne_bytes()); // seq, set by finish
        buf.extend_from_slice(&0u32.to_ne_bytes()); // port id 0: the kernel fills it in
        Message { buf }
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
        self.buf.resize(align4(self.buf.len()), 0);
    }

    fn attr(&mut self, ty: u16, value: &[u8]) {
        let len = (4 + value.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.push(value);
    }

    /// A NUL-terminated string attribute; interface names must fit IFNAMSIZ.
    fn attr_str(&mut self, ty: u16, s: &str) -> io::Result<()> {
        if s.is_empty()
            || s.len() >= libc::IFNAMSIZ
            || s.contains(['\0', '/'])
            || s.contains(char::is_whitespace)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "invalid interface name",
            ));
        }
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.attr(ty, &v);
        Ok(())
    }

    fn nest_begin(&mut self, ty: u16) -> usize {
        let at = self.buf.len();
        self.attr(ty, &[]);
        at
    }

    fn nest_end(&mut self, at: usize) {
        let len = (self.buf.len() - at) as u16;
        self.buf[at..at + 2].copy_from_slice(&len.to_ne_bytes());
    }

    fn finish(&mut self, seq: u32) -> &[u8] {
        let len = self.buf.len() as u32;
        self.buf[0..4].copy_from_slice(&len.to_ne_bytes());
        self.buf[8..12].copy_from_slice(&seq.to_ne_bytes());
        &self.buf
    }
}

/// `struct ifinfomsg` (16 bytes): family, pad, type, index, flags, change.
fn ifinfomsg(index: u32, flags: u32, change: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0] = libc::AF_UNSPEC as u8;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..12].copy_from_slice(&flags.to_ne_bytes());
    h[12..16].copy_from_slice(&change.to_ne_bytes());
    h
}

/// `struct ifaddrmsg` (8 bytes): family, prefixlen, flags, scope, index.
fn ifaddrmsg(index: u32, prefix_len: u8, flags: u8) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[0] = AF_INET6;
    h[1] = prefix_len;
    h[2] = flags;
    h[3] = RT_SCOPE_UNIVERSE;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h
}

/// `struct ndmsg` (12 bytes): family, pad, pad, ifindex, state, flags, type.
fn ndmsg(index: u32, state: u16, flags: u8) -> [u8; 12] {
    let mut h = [0u8; 12];
    h[0] = AF_INET6;
    h[4..8].copy_from_slice(&index.to_ne_bytes());
    h[8..10].copy_from_slice(&state.to_ne_bytes());
    h[10] = flags;
    h
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
    h[6] = RT_SCOPE_UNIVERSE;
    h[7] = RTN_UNICAST;
    msg.push(&h);
    msg.attr(RTA_DST, &dst.octets());
    msg.attr(RTA_OIF, &oif.to_ne_bytes());
    if let Some(gw) = via {
        msg.attr(RTA_GATEWAY, &gw.octets());
    }
    msg.attr(RTA_TABLE, &table.to_ne_bytes());
    msg
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

/// Iterator over the rtattrs in a buffer; stops at the first malformed one.
struct Attrs<'a>(&'a [u8]);

impl<'a> Iterator for Attrs<'a> {
    type Item = (u16, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.0;
        if b.len() < 4 {
            return None;
        }
        let len = usize::from(u16::from_ne_bytes([b[0], b[1]]));
        let ty = u16::from_ne_bytes([b[2], b[3]]) & NLA_TYPE_MASK;
        if len < 4 || len > b.len() {
            self.0 = &[];
            return None;
        }
        self.0 = b.get(align4(len)..).unwrap_or(&[]);
        Some((ty, &b[4..len]))
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::netns::{unique_name, Netns};
    use std::time::{Duration, Instant};

    #[test]
    fn message_layout_matches_uapi() {
        let mut msg = Message::new(RTM_NEWADDR, NLM_F_CREATE);
        msg.push(&ifaddrmsg(7, 64, 0));
        msg.attr(IFA_FLAGS, &IFA_F_NODAD.to_ne_bytes());
        let b = msg.finish(9).to_vec();
        assert_eq!(b.len(), 16 + 8 + 8);
        assert_eq!(u32::from_ne_bytes([b[0], b[1], b[2], b[3]]), 32);
        assert_eq!(
            u16::from_ne_bytes([b[6], b[7]]),
            NLM_F_CREATE | NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(u32::from_ne_bytes([b[8], b[9], b[10], b[11]]), 9);
        assert_eq!(&b[16..18], &[AF_INET6, 64]);
        let attrs: Vec<_> = Attrs(&b[24..]).collect();
        assert_eq!(attrs, vec![(IFA_FLAGS, &IFA_F_NODAD.to_ne_bytes()[..])]);
    }

    #[test]
    fn attrs_stop_on_truncation() {
        // Claims 8 bytes but only 6 are there.
        let b = [8u8, 0, 1, 0, 0xaa, 0xbb];
        assert_eq!(Attrs(&b).count(), 0);
        assert!(Message::new(RTM_GETLINK, 0)
            .attr_str(IFLA_IFNAME, "this-name-is-too-long")
            .is_err());
    }

    /// Waits until `addr` is (or is no longer) delivered locally.
    pub(crate) fn wait_local(nl: &mut Netlink, addr: Ipv6Addr, want: bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while nl.is_local_address(addr).expect("route lookup") != want {
            assert!(
                Instant::now() < deadline,
                "{addr} local state never became {want}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A namespace with a veth pair `a` <-> `b`, both up, and a netlink socket inside.
    fn veth_lab() -> (Netns, Netlink, u32, u32) {
        let ns = Netns::create(&unique_name("nlt")).expect("create netns");
        let mut nl = ns
            .run(Netlink::open)
            .expect("enter netns")
            .expect("open netlink");
        nl.create_veth("va", "vb").expect("create veth");
        let a = nl.link_index("va").expect("index of va");
        let b = nl.link_index("vb").expect("index of vb");
        nl.link_set_up(a).expect("va up");
        nl.link_set_up(b).expect("vb up");
        (ns, nl, a, b)
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn links_addresses_routes_neighbours_are_idempotent() {
        let (_ns, mut nl, a, b) = veth_lab();
        assert_eq!(nl.link_name(a).expect("name"), "va");
        assert!(nl.link_mac(a).expect("mac").is_some());
        let mac = [0x02, 0x11, 0x22, 0x33, 0x44, 0x55];
        nl.link_set_mac(a, mac).expect("set MAC while up");
        assert_eq!(nl.link_mac(a).expect("mac"), Some(mac));
        nl.link_set_mtu(a, 1400).expect("mtu");
        assert!(nl.link_index("nonexistent0").is_err());

        let addr: Ipv6Addr = "2001:db8:1::1".parse().expect("literal");
        let nodad = AddrFlags {
            nodad: true,
            noprefixroute: false,
        };
        nl.add_address(a, addr, 64, nodad).expect("add once");
        nl.add_address(a, addr, 64, nodad).expect("add twice");
        wait_local(&mut nl, addr, true);
        let listed = nl.list_addresses(a).expect("list");
        let info = listed
            .iter()
            .find(|i| i.addr == addr)
            .expect("address listed");
        assert_eq!(info.prefix_len, 64);
        assert!(!info.tentative, "nodad address must be usable at once");
        assert!(!info.dadfailed);
        nl.del_address(a, addr, 64).expect("delete once");
        nl.del_address(a, addr, 64).expect("delete twice");
        wait_local(&mut nl, addr, false);
        assert!(nl
            .list_addresses(a)
            .expect("list")
            .iter()
            .all(|i| i.addr != addr));

        // Without nodad the address starts tentative (DAD runs for ~1 s).
        let dad: Ipv6Addr = "2001:db8:1::2".parse().expect("literal");
        nl.add_address(b, dad, 64, AddrFlags::default())
            .expect("add with dad");
        let info = nl
            .list_addresses(b)
            .expect("list")
            .into_iter()
            .find(|i| i.addr == dad);
        assert!(info.expect("listed").tentative);

        let dst: Ipv6Addr = "2001:db8:99::".parse().expect("literal");
        nl.add_route(dst, 48, a).expect("route add once");
        nl.add_route(dst, 48, a).expect("route add twice");
        nl.add_route_in_table(dst, 48, a, 1000)
            .expect("route in table 1000");
        nl.del_route(dst, 48, a).expect("route del once");
        nl.del_route(dst, 48, a).expect("route del twice");
        nl.del_route_in_table(dst, 48, a, 1000)
            .expect("route del table 1000");

        let proxied: Ipv6Addr = "2001:db8:1::99".parse().expect("literal");
        nl.add_proxy_neighbor(a, proxied).expect("proxy add once");
        nl.add_proxy_neighbor(a, proxied).expect("proxy add twice");
        nl.del_proxy_neighbor(a, proxied).expect("proxy del once");
        nl.del_proxy_neighbor(a, proxied).expect("proxy del twice");

        let mac = [0x02, 0, 0, 0, 0, 0x42];
        nl.add_neighbor(a, proxied, mac, true)
            .expect("neigh add once");
        nl.add_neighbor(a, proxied, mac, true)
            .expect("neigh add twice");
        assert_eq!(nl.neighbor_lladdr(a, proxied).expect("look up"), Some(mac));
        nl.add_neighbor(a, proxied, mac, false)
            .expect("neigh replace, reachable");
        assert_eq!(nl.neighbor_lladdr(a, proxied).expect("look up"), Some(mac));
        nl.del_neighbor(a, proxied).expect("neigh del once");
        assert_eq!(
            nl.neighbor_lladdr(a, proxied).expect("absent is no error"),
            None
        );
        nl.del_neighbor(a, proxied).expect("neigh del twice");

        // A marked socket's entries say whose they are; an unmarked one's say nothing.
        let owned: Ipv6Addr = "2001:db8:1::77".parse().expect("literal");
        let theirs: Ipv6Addr = "2001:db8:1::78".parse().expect("literal");
        nl.add_neighbor(a, theirs, mac, true).expect("unmarked add");
        nl.set_marker(200);
        nl.add_neighbor(a, owned, mac, true).expect("marked add");
        let list = nl.list_neighbors(a).expect("list neighbours");
        let find = |x: Ipv6Addr| list.iter().find(|n| n.addr == x).copied();
        let o = find(owned).expect("marked entry listed");
        assert_eq!(
            (o.proto, o.lladdr, o.state),
            (200, Some(mac), NUD_PERMANENT)
        );
        assert_eq!(find(theirs).expect("unmarked entry listed").proto, 0);
        assert!(nl
            .list_neighbors(b)
            .expect("list b")
            .iter()
            .all(|n| n.addr != owned));
        nl.del_neighbor(a, owned).expect("marked del");
        nl.del_neighbor(a, theirs).expect("unmarked del");
        nl.set_marker(RTPROT_STATIC);

        nl.link_set_down(b).expect("down");
        nl.link_rename(b, "vb2").expect("rename");
        assert_eq!(nl.link_index("vb2").expect("renamed"), b);
        nl.delete_link(a).expect("delete once");
        nl.delete_link(a).expect("delete twice");
        // Deleting one end of a veth removes its peer; wait on that state, do not sleep.
        let deadline = Instant::now() + Duration::from_secs(5);
        while nl.link_index("vb2").is_ok() {
            assert!(Instant::now() < deadline, "peer still exists");
            std::thread::yield_now();
        }
    }

    /// The fail-closed guard: a prohibit /128 under a device route decides only once that route
    /// is gone, beats the on-link /64, and is removed only by a socket with the same marker.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn guard_route_catches_traffic_once_the_device_route_is_gone() {
        let (ns, mut nl, a, b) = veth_lab();
        nl.set_marker(109);
        let dst: Ipv6Addr = "2001:db8:7::b".parse().expect("literal");
        let prefix: Ipv6Addr = "2001:db8:7::".parse().expect("literal");
        nl.add_route(prefix, 64, a).expect("on-link /64");
        nl.add_guard_route(dst, 128).expect("guard once");
        nl.add_guard_route(dst, 128).expect("guard twice");
        nl.add_route(dst, 128, b).expect("device /128");
        // With the device route present the lookup succeeds (not local, not refused).
        assert!(!nl.is_local_address(dst).expect("routed through vb"));
        nl.del_route(dst, 128, b).expect("device route gone");
        let refused = nl.is_local_address(dst).expect_err("guard decides now");
        assert_eq!(refused.raw_os_error(), Some(libc::EACCES), "{refused}");
        // Another marker (an operator's `static`) cannot delete our guard.
        let mut other = ns.run(Netlink::open).expect("enter").expect("open");
        other
            .del_guard_route(dst, 128)
            .expect("nothing of its own to delete");
        let still = nl.is_local_address(dst).expect_err("guard still there");
        assert_eq!(still.raw_os_error(), Some(libc::EACCES), "{still}");
        nl.del_guard_route(dst, 128).expect("delete once");
        nl.del_guard_route(dst, 128).expect("delete twice");
        assert!(!nl.is_local_address(dst).expect("back to the on-link /64"));
        nl.add_address(
            a,
            "2001:db8:7::1".parse().expect("literal"),
            128,
            AddrFlags::default(),
        )
        .expect("marked address");
        let listed = nl.list_addresses(a).expect("list");
        assert!(listed.iter().any(|i| i.proto == 109), "{listed:?}");
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn veth_end_moves_to_another_namespace() {
        let (_ns, mut nl, _a, b) = veth_lab();
        let other = Netns::create(&unique_name("nlo")).expect("second netns");
        nl.move_link_to_netns(b, other.fd()).expect("move vb");
        assert!(nl.link_index("vb").is_err());
        let mut nl2 = other.run(Netlink::open).expect("enter").expect("open");
        nl2.link_index("vb").expect("vb is in the other namespace");
    }
}
