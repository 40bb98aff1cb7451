//! `Icmp6Socket`: a raw ICMPv6 socket, for echo (ping) in the demo and for receiving the
//! ICMPv6 errors (Packet Too Big, Destination Unreachable) the path sends back.
//!
//! The kernel computes the ICMPv6 checksum of everything sent on such a socket (RFC 3542
//! section 3.1: IPV6_CHECKSUM is always on for ICMPv6 and cannot be changed), so callers send the
//! ICMPv6 message with a zero checksum field. Received messages start at the ICMPv6 header (no
//! IPv6 header). An ICMP6_FILTER limits which types are delivered (RFC 3542 section 3.2).
//!
//! No protocol logic: which messages to send and what they mean is the daemon's business.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::error::{OsError, Result};
use crate::sys::{self, put_cmsg, CmsgBuf, Cmsgs};

const ICMP6_FILTER: libc::c_int = 1;

/// A raw `AF_INET6`/`IPPROTO_ICMPV6` socket.
#[derive(Debug)]
pub struct Icmp6Socket {
    fd: OwnedFd,
}

/// Where a received ICMPv6 message came from and went to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IcmpRecvInfo {
    /// Bytes of ICMPv6 message.
    pub len: usize,
    /// Its source.
    pub src: Ipv6Addr,
    /// Its destination (IPV6_PKTINFO), if the kernel reported it.
    pub dst: Option<Ipv6Addr>,
    /// The interface it arrived on (IPV6_PKTINFO; 0 if not reported).
    pub ifindex: u32,
    /// The hop limit it arrived with (IPV6_HOPLIMIT), if reported. Neighbour discovery
    /// messages with anything but 255 came from off-link and must be ignored (RFC 4861 §6.1).
    pub hop_limit: Option<u8>,
}

impl Icmp6Socket {
    /// Opens the socket (needs CAP_NET_RAW) with IPV6_RECVPKTINFO and IPV6_RECVHOPLIMIT on.
    pub fn open() -> Result<Icmp6Socket> {
        let ctx = |op| move |source| OsError::Icmp { op, source };
        let fd = sys::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_ICMPV6)
            .map_err(ctx("socket"))?;
        sys::setsockopt(
            fd.as_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVPKTINFO,
            &1 as &libc::c_int,
        )
        .map_err(ctx("set IPV6_RECVPKTINFO"))?;
        sys::setsockopt(
            fd.as_fd(),
            libc::IPPROTO_IPV6,
            libc::IPV6_RECVHOPLIMIT,
            &1 as &libc::c_int,
        )
        .map_err(ctx("set IPV6_RECVHOPLIMIT"))?;
        Ok(Icmp6Socket { fd })
    }

    /// Delivers only ICMPv6 messages whose type is in `types` (ICMP6_FILTER).
    pub fn set_filter_pass_only(&self, types: &[u8]) -> Result<()> {
        // struct icmp6_filter { uint32_t data[8]; }: a set bit blocks that type.
        let mut filter = [u32::MAX; 8];
        for &t in types {
            filter[usize::from(t >> 5)] &= !(1u32 << (t & 31));
        }
        sys::setsockopt(self.fd.as_fd(), libc::IPPROTO_ICMPV6, ICMP6_FILTER, &filter).map_err(
            |source| OsError::Icmp {
                op: "set ICMP6_FILTER",
                source,
            },
        )
    }

    /// Read timeout for [`Icmp6Socket::recv_from`]; `None` blocks forever.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        sys::set_read_timeout(self.fd.as_fd(), timeout).map_err(|source| OsError::Icmp {
            op: "set SO_RCVTIMEO",
            source,
        })
    }

    /// Hop limit of everything this socket sends, unicast and multicast. Neighbour discovery
    /// messages must carry 255 (RFC 4861 §7.1: receivers drop others).
    pub fn set_hop_limit(&self, hops: u8) -> Result<()> {
        let hops = libc::c_int::from(hops);
        for (opt, op) in [
            (libc::IPV6_UNICAST_HOPS, "set IPV6_UNICAST_HOPS"),
            (libc::IPV6_MULTICAST_HOPS, "set IPV6_MULTICAST_HOPS"),
        ] {
            sys::setsockopt(self.fd.as_fd(), libc::IPPROTO_IPV6, opt, &hops)
                .map_err(|source| OsError::Icmp { op, source })?;
        }
        Ok(())
    }

    /// `IPV6_FREEBIND`: a message may leave from a source address that is local only through
    /// a local route (an AnyIP prefix, as the server role's), not bound to an interface;
    /// without it the kernel refuses such an `IPV6_PKTINFO` source (EINVAL).
    pub fn set_freebind(&self) -> Result<()> {
        const IPV6_FREEBIND: libc::c_int = 78;
        let on: libc::c_int = 1;
        sys::setsockopt(self.fd.as_fd(), libc::IPPROTO_IPV6, IPV6_FREEBIND, &on).map_err(|source| {
            OsError::Icmp {
                op: "set IPV6_FREEBIND",
                source,
            }
        })
    }

    /// Sends the ICMPv6 message `msg` (checksum field left zero) to `dst`, from `src` if given
    /// (IPV6_PKTINFO).
    pub fn send_to(&self, msg: &[u8], dst: Ipv6Addr, src: Option<Ipv6Addr>) -> Result<usize> {
        self.send_via(msg, dst, src, 0)
    }

    /// As [`Icmp6Socket::send_to`], out of interface `ifindex` (0: as routed). Link-local and
    /// multicast destinations need the interface.
    pub fn send_via(
        &self,
        msg: &[u8],
        dst: Ipv6Addr,
        src: Option<Ipv6Addr>,
        ifindex: u32,
    ) -> Result<usize> {
        let mut ctrl = CmsgBuf([0u8; sys::cmsg_space(20)]);
        let used = if src.is_some() || ifindex != 0 {
            put_cmsg(
                &mut ctrl.0,
                0,
                libc::IPPROTO_IPV6,
                libc::IPV6_PKTINFO,
                &sys::in6_pktinfo(src.unwrap_or(Ipv6Addr::UNSPECIFIED), ifindex),
            )
        } else {
            0
        };
        sys::sendmsg6(
            self.fd.as_fd(),
            msg,
            &SocketAddrV6::new(dst, 0, 0, ifindex),
            &ctrl.0[..used],
        )
        .map_err(|source| OsError::Icmp {
            op: "sendmsg",
            source,
        })
    }

    /// Receives one ICMPv6 message into `buf` (starting at the ICMPv6 header).
    pub fn recv_from(&self, buf: &mut [u8]) -> Result<IcmpRecvInfo> {
        let mut ctrl = CmsgBuf([0u8; 128]);
        let (len, _flags, src, clen) = loop {
            match sys::recvmsg6(self.fd.as_fd(), buf, &mut ctrl.0) {
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                r => {
                    break r.map_err(|source| OsError::Icmp {
                        op: "recvmsg",
                        source,
                    })?
                }
            }
        };
        let cmsgs = || Cmsgs(&ctrl.0[..clen.min(128)]);
        let pktinfo = cmsgs()
            .find(|(l, t, _)| *l == libc::IPPROTO_IPV6 && *t == libc::IPV6_PKTINFO)
            .and_then(|(_, _, d)| sys::parse_in6_pktinfo(d));
        let hop_limit = cmsgs()
            .find(|(l, t, _)| *l == libc::IPPROTO_IPV6 && *t == libc::IPV6_HOPLIMIT)
            .and_then(|(_, _, d)| Some(libc::c_int::from_ne_bytes(d.get(..4)?.try_into().ok()?)))
            .and_then(|h| u8::try_from(h).ok());
        Ok(IcmpRecvInfo {
            len,
            src: *src.ip(),
            dst: pktinfo.map(|(a, _)| a),
            ifindex: pktinfo.map_or(0, |(_, i)| i),
            hop_limit,
        })
    }
}

impl AsRawFd for Icmp6Socket {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::Netlink;
    use crate::netns::{unique_name, Netns};

    const ECHO_REQUEST: u8 = 128;
    const ECHO_REPLY: u8 = 129;

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn ping_loopback_with_filter() {
        let ns = Netns::create(&unique_name("icm")).expect("netns");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let lo = nl.link_index("lo").expect("lo");
            nl.link_set_up(lo).expect("lo up");
            let s = Icmp6Socket::open().expect("open");
            s.set_filter_pass_only(&[ECHO_REPLY]).expect("filter");
            s.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            // Echo request: type, code, checksum (kernel fills), id, seq, data.
            let req = [
                ECHO_REQUEST,
                0,
                0,
                0,
                0x12,
                0x34,
                0,
                1,
                b'm',
                b't',
                b'6',
                b'd',
            ];
            s.send_to(&req, Ipv6Addr::LOCALHOST, Some(Ipv6Addr::LOCALHOST))
                .expect("send");
            let mut buf = [0u8; 1500];
            // The filter drops our own echo request looped back; the first message is the reply.
            let info = s.recv_from(&mut buf).expect("reply");
            assert_eq!(buf[0], ECHO_REPLY);
            assert_eq!(&buf[4..info.len], &req[4..]);
            assert_eq!(info.src, Ipv6Addr::LOCALHOST);
            assert_eq!(info.dst, Some(Ipv6Addr::LOCALHOST));
            assert_eq!(info.ifindex, lo);
            assert_eq!(info.hop_limit, Some(64), "the default unicast hop limit");
        })
        .expect("run");
    }
}
