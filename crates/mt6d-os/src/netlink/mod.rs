//! `Netlink`: a blocking rtnetlink (NETLINK_ROUTE) client for links, IPv6 addresses, routes
//! and neighbour entries.
//!
//! Messages are built by hand from the uapi layouts, one file per kind of object, each with the
//! constants and family header of its kernel header: `link.rs` (`linux/if_link.h`, `veth.h`),
//! `address.rs` (`if_addr.h`), `route.rs` (`rtnetlink.h`), `neighbor.rs` (`neighbour.h`). This
//! file holds the socket, the message builder and the two ways a request goes out: a query
//! (`transact`, replies handed to a closure) and a change (`apply`, nothing but the ACK).
//! Every request asks for an ACK and the kernel's errno is returned with the object it
//! concerned. Changes are idempotent, as in innernet's `shared/src/netlink.rs`: adds use
//! `NLM_F_CREATE | NLM_F_REPLACE` and treat `EEXIST` as done, deletes treat
//! `ENOENT`/`EADDRNOTAVAIL`/`ESRCH`/`ENODEV` as done, so a daemon restarted in the middle of an
//! address rotation converges instead of failing.
//!
//! The socket lives in the network namespace of the thread that called [`Netlink::open`], and
//! keeps acting on that namespace whichever thread uses it later.
//!
//! This module owns no policy: which addresses, routes and neighbours exist is decided by the
//! daemon from mt6d-proto's output.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use crate::error::{OsError, Result};
use crate::sys;

mod address;
mod link;
mod neighbor;
mod route;

pub use address::{AddrFlags, AddrInfo};
pub use link::LinkDrops;
pub use neighbor::NeighInfo;
pub use route::{GUARD_METRIC, LOCAL_TABLE, MAIN_TABLE};

// uapi constants of the netlink header itself (linux/netlink.h) and shared by every kind of
// message; each kind's own are in its file.
const NLMSG_HDR_LEN: usize = 16;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_ACK: u16 = 0x4;
const NLM_F_DUMP: u16 = 0x300;
const NLM_F_REPLACE: u16 = 0x100;
const NLM_F_EXCL: u16 = 0x200;
const NLM_F_CREATE: u16 = 0x400;
const NLA_TYPE_MASK: u16 = 0x3fff;
const AF_INET6: u8 = libc::AF_INET6 as u8;
/// The default marker of routes (`rtm_protocol`); addresses and neighbour entries carry none
/// unless another is set.
const RTPROT_STATIC: u8 = 4;
const RT_SCOPE_UNIVERSE: u8 = 0;

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

    /// Sends a request that changes something and waits for the kernel's ACK. An errno in
    /// `already` says the change was in effect before (an add of what exists, a delete of what
    /// is gone): the state is as asked, so that is success. `&[]` for a change that must be
    /// made as asked.
    fn apply(&mut self, msg: Message, already: &[i32]) -> io::Result<()> {
        match self.transact(msg, |_, _| ()) {
            Err(e) if is_errno(&e, already) => Ok(()),
            r => r,
        }
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
    use super::address::{ifaddrmsg, IFA_FLAGS, IFA_F_NODAD, RTM_NEWADDR};
    use super::link::{IFLA_IFNAME, RTM_GETLINK};
    use super::neighbor::NUD_PERMANENT;
    use super::*;
    use crate::netns::{unique_name, Netns};
    use std::net::Ipv6Addr;
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
