//! `RawUdp6`: sends UDP datagrams from any address *and port* of a local prefix through one
//! socket: the server role's send path (docs/ARCHITECTURE.md "The server role").
//!
//! A UDP socket sends only from the port it is bound to, so a server that must answer from
//! every client's own hashed port would need a socket per port in use. This is one
//! `SOCK_RAW, IPPROTO_UDP` socket instead: it writes the 8-byte UDP header itself, the kernel
//! builds the IPv6 header and fills in the UDP checksum (`IPV6_CHECKSUM` at offset 6, RFC 3542
//! §3.1), the source address comes per message with `IPV6_PKTINFO` (`IPV6_FREEBIND`: it need
//! not be a configured address, e.g. one of an AnyIP prefix, [`crate::Netlink::add_local_prefix`]),
//! and it receives nothing: connected to `::1` it is skipped, before any copy, for every UDP
//! datagram of the namespace (a raw socket otherwise gets a copy of each), and a socket filter
//! that accepts nothing drops what comes from `::1` itself. Needs CAP_NET_RAW and `lo` up.
//!
//! No UDP GSO on a raw socket: one datagram per message, batched with `sendmmsg`.

use std::io;
use std::mem;
use std::net::SocketAddrV6;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};

use crate::error::{OsError, Result};
use crate::sys::{self, cvt, put_cmsg, CmsgBuf};
use crate::udp::zeroed_vec;

const IPV6_FREEBIND: libc::c_int = 78;
const CTRL_LEN: usize = sys::cmsg_space(20);
/// Offset of the checksum in the UDP header.
const UDP_CHECKSUM_AT: libc::c_int = 6;

/// One datagram to send from `src` (address and port) to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct RawSendMsg<'a> {
    pub src: SocketAddrV6,
    pub dst: SocketAddrV6,
    pub payload: &'a [u8],
}

impl RawSendMsg<'_> {
    /// Empties a vector of messages and hands back its allocation with a fresh lifetime, so a
    /// sending thread keeps one vector for every batch. `into_iter().map(..).collect()` over a
    /// same-layout type reuses the buffer in place (std's in-place collect): no allocation per
    /// batch; the vector is empty, so the closure never runs.
    pub fn recycle<'b>(mut v: Vec<RawSendMsg<'_>>) -> Vec<RawSendMsg<'b>> {
        v.clear();
        v.into_iter()
            .map(|m| RawSendMsg {
                src: m.src,
                dst: m.dst,
                payload: &[],
            })
            .collect()
    }
}

/// Reusable arrays for [`RawUdp6::send_batch`]; one per sending thread.
pub struct RawSendScratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<[libc::iovec; 2]>,
    names: Vec<libc::sockaddr_in6>,
    udp: Vec<[u8; 8]>,
    ctrl: Vec<CmsgBuf<CTRL_LEN>>,
}

// SAFETY: the pointers inside the arrays are rewritten by every send_batch call before use;
// between calls they are inert data.
unsafe impl Send for RawSendScratch {}

impl std::fmt::Debug for RawSendScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawSendScratch")
            .field("capacity", &self.hdrs.len())
            .finish()
    }
}

impl RawSendScratch {
    /// Scratch for batches of up to `batch` datagrams.
    pub fn new(batch: usize) -> RawSendScratch {
        let batch = batch.max(1);
        let (hdrs, iovs, names) = (zeroed_vec(batch), zeroed_vec(batch), zeroed_vec(batch));
        RawSendScratch {
            hdrs,
            iovs,
            names,
            udp: vec![[0; 8]; batch],
            ctrl: vec![CmsgBuf([0; CTRL_LEN]); batch],
        }
    }
}

/// The raw UDP sender. See the module docs.
#[derive(Debug)]
pub struct RawUdp6 {
    fd: OwnedFd,
}

impl RawUdp6 {
    /// Opens the socket with its options and its accept-nothing filter.
    pub fn open() -> Result<RawUdp6> {
        let ctx = |op| {
            move |source| OsError::Udp {
                port: 0,
                op,
                source,
            }
        };
        let fd = sys::socket(libc::AF_INET6, libc::SOCK_RAW, libc::IPPROTO_UDP)
            .map_err(ctx("raw socket"))?;
        let f = fd.as_fd();
        // Filter first: from here on nothing is queued to it.
        let mut accept_nothing = [libc::sock_filter {
            // BPF_RET | BPF_K: return the constant, 0 bytes of the packet.
            code: 0x06,
            jt: 0,
            jf: 0,
            k: 0,
        }];
        let prog = libc::sock_fprog {
            len: 1,
            filter: accept_nothing.as_mut_ptr(),
        };
        // The kernel copies the program during the call.
        sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &prog)
            .map_err(ctx("attach the accept-nothing filter"))?;
        // Connected to the loopback address, which never sends to it: the kernel then skips this
        // socket when it delivers a UDP datagram from anywhere else, before it copies the packet
        // (a raw socket's remote-address match), instead of copying every UDP datagram of the
        // namespace to it for the filter to drop. Every send names its destination, which
        // overrides the connected one. Needs the loopback interface up.
        sys::connect6(
            f,
            &SocketAddrV6::new(std::net::Ipv6Addr::LOCALHOST, 0, 0, 0),
        )
        .map_err(ctx("connect to ::1 (is lo up?)"))?;
        sys::setsockopt(f, libc::IPPROTO_IPV6, libc::IPV6_CHECKSUM, &UDP_CHECKSUM_AT)
            .map_err(ctx("set IPV6_CHECKSUM"))?;
        let on: libc::c_int = 1;
        sys::setsockopt(f, libc::IPPROTO_IPV6, IPV6_FREEBIND, &on)
            .map_err(ctx("set IPV6_FREEBIND"))?;
        sys::setsockopt(
            f,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            &libc::IPV6_PMTUDISC_DO,
        )
        .map_err(ctx("set IPV6_MTU_DISCOVER"))?;
        Ok(RawUdp6 { fd })
    }

    /// Sends up to `scratch`'s capacity of `msgs` with one `sendmmsg`; returns how many the
    /// kernel took (the rest must be retried; the next call reports the error of the first).
    pub fn send_batch(
        &self,
        scratch: &mut RawSendScratch,
        msgs: &[RawSendMsg<'_>],
    ) -> Result<usize> {
        let n = msgs.len().min(scratch.hdrs.len());
        if n == 0 {
            return Ok(0);
        }
        for (i, m) in msgs[..n].iter().enumerate() {
            let len = u16::try_from(8 + m.payload.len()).map_err(|_| OsError::Udp {
                port: m.src.port(),
                op: "raw send (datagram over 65,527 bytes)",
                source: io::Error::from_raw_os_error(libc::EMSGSIZE),
            })?;
            let udp = &mut scratch.udp[i];
            udp[..2].copy_from_slice(&m.src.port().to_be_bytes());
            udp[2..4].copy_from_slice(&m.dst.port().to_be_bytes());
            udp[4..6].copy_from_slice(&len.to_be_bytes());
            // The kernel computes the checksum (IPV6_CHECKSUM) over what it finds here too.
            udp[6..8].fill(0);
            // A raw socket's destination port must be 0 or its protocol.
            scratch.names[i] =
                sys::sockaddr_in6(&SocketAddrV6::new(*m.dst.ip(), 0, 0, m.dst.scope_id()));
            scratch.iovs[i] = [
                libc::iovec {
                    iov_base: udp.as_mut_ptr().cast(),
                    iov_len: 8,
                },
                libc::iovec {
                    iov_base: m.payload.as_ptr() as *mut libc::c_void,
                    iov_len: m.payload.len(),
                },
            ];
            let ctrl = &mut scratch.ctrl[i].0;
            let used = put_cmsg(
                ctrl,
                0,
                libc::IPPROTO_IPV6,
                libc::IPV6_PKTINFO,
                &sys::in6_pktinfo(*m.src.ip(), 0),
            );
            let h = &mut scratch.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut scratch.names[i] as *mut libc::sockaddr_in6).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            h.msg_hdr.msg_iov = scratch.iovs[i].as_mut_ptr();
            h.msg_hdr.msg_iovlen = 2;
            h.msg_hdr.msg_control = ctrl.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = used as _;
            h.msg_hdr.msg_flags = 0;
        }
        loop {
            // SAFETY: hdrs[..n] were all filled above; each points at names[i], iovs[i],
            // udp[i] and ctrl[i] in `scratch` and at msgs[i].payload, all of which outlive this
            // call and are not moved during it. The kernel only reads them.
            let r = unsafe {
                libc::sendmmsg(
                    self.fd.as_raw_fd(),
                    scratch.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    0,
                )
            };
            match cvt(r) {
                Ok(sent) => return Ok(sent as usize),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(OsError::Udp {
                        port: msgs[0].src.port(),
                        op: "raw sendmmsg",
                        source: e,
                    })
                }
            }
        }
    }
}

impl AsRawFd for RawUdp6 {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{AddrFlags, Netlink};
    use crate::netns::{unique_name, Netns};
    use crate::nftables::NftTable;
    use crate::udp::{RecvBuf, RecvScratch, SendMsg, SendScratch, UdpSocket6};
    use std::net::Ipv6Addr;
    use std::time::{Duration, Instant};

    /// The whole server-role mechanism in one namespace: a local (AnyIP) /64, a tproxy rule to
    /// one port, two transparent sockets on it, and answers from the exact address and port
    /// asked, through the raw sender. No address or socket per (address, port) served.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn any_address_and_port_of_a_local_prefix_is_answered_from_itself() {
        let ns = Netns::create(&unique_name("anyip")).expect("netns");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let lo = nl.link_index("lo").expect("lo");
            nl.link_set_up(lo).expect("lo up");
            let prefix: Ipv6Addr = "fd00:77::".parse().expect("literal");
            nl.add_local_prefix(prefix, 64, lo).expect("AnyIP route");
            // The client's own address, an ordinary one.
            let client_addr: Ipv6Addr = "fd00:78::1".parse().expect("literal");
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: false,
            };
            nl.add_address(lo, client_addr, 128, flags)
                .expect("address");
            crate::netlink::tests::wait_local(&mut nl, client_addr, true);
            let before = nl.list_addresses(lo).expect("addresses").len();
            let table = NftTable::new("mt6d_anyip_test").expect("name");
            table
                .load(
                    "chain pre {\n\
                     type filter hook prerouting priority -150; policy accept;\n\
                     ip6 daddr fd00:77::/64 meta l4proto udp tproxy ip6 to [::1]:4000\n\
                     }",
                )
                .expect("tproxy rule");
            let servers = [
                UdpSocket6::bind_transparent(Ipv6Addr::LOCALHOST, 4000)
                    .expect("transparent socket"),
                UdpSocket6::bind_transparent(Ipv6Addr::LOCALHOST, 4000)
                    .expect("second socket on the port"),
            ];
            for s in &servers {
                s.set_nonblocking(true).expect("non-blocking");
            }
            let client = UdpSocket6::bind(0).expect("client");
            client
                .set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            let raw = RawUdp6::open().expect("raw socket");
            let mut ss = SendScratch::new(1);
            let mut rs = RecvScratch::new(4);
            let mut bufs: Vec<RecvBuf> = (0..4).map(|_| RecvBuf::new()).collect();
            let mut raw_scratch = RawSendScratch::new(1);
            for (i, (iid, port)) in [(0x1234_u16, 4711_u16), (0xbeef, 61_000), (7, 1024)]
                .into_iter()
                .enumerate()
            {
                let asked = SocketAddrV6::new(
                    Ipv6Addr::new(0xfd00, 0x77, 0, 0, 0, 0, iid, iid),
                    port,
                    0,
                    0,
                );
                let msg = SendMsg {
                    src: client_addr,
                    dst: asked,
                    payload: &[i as u8; 20],
                    segment_size: None,
                };
                assert_eq!(client.send_batch(&mut ss, &[msg]).expect("send"), 1);
                // One of the two sockets gets it (the reuseport hash), with where it was sent.
                let deadline = Instant::now() + Duration::from_secs(2);
                let got = loop {
                    let hit = servers
                        .iter()
                        .find_map(|s| match s.recv_ready(&mut rs, &mut bufs) {
                            Ok(n) if n > 0 => {
                                Some((bufs[0].dst(), bufs[0].dst_port(), bufs[0].src()))
                            }
                            _ => None,
                        });
                    if let Some(h) = hit {
                        break h;
                    }
                    assert!(Instant::now() < deadline, "nothing arrived for {asked}");
                    std::thread::sleep(Duration::from_millis(5));
                };
                assert_eq!((got.0, got.1), (*asked.ip(), asked.port()), "{got:?}");
                assert_eq!(*got.2.ip(), client_addr);
                // The answer leaves from exactly the address and port that was asked.
                let answer = RawSendMsg {
                    src: asked,
                    dst: got.2,
                    payload: b"answer",
                };
                assert_eq!(
                    raw.send_batch(&mut raw_scratch, &[answer])
                        .expect("raw send"),
                    1
                );
                let n = client
                    .recv_batch(&mut rs, &mut bufs)
                    .expect("answer arrives");
                assert_eq!(n, 1);
                assert_eq!(bufs[0].src(), asked);
                assert_eq!(bufs[0].data(), b"answer");
            }
            // Bound to ::1, the sockets get what the rule hands them and nothing sent to the
            // host's own addresses (bound to [::]:4000, they got this one too).
            let direct = SendMsg {
                src: client_addr,
                dst: SocketAddrV6::new(client_addr, 4000, 0, 0),
                payload: b"direct",
                segment_size: None,
            };
            assert_eq!(client.send_batch(&mut ss, &[direct]).expect("send"), 1);
            std::thread::sleep(Duration::from_millis(200));
            for s in &servers {
                assert_eq!(
                    s.recv_ready(&mut rs, &mut bufs).unwrap_or(0),
                    0,
                    "a datagram to the host's own address reached the transparent socket"
                );
            }
            // Nothing per address was added for what was served.
            assert_eq!(nl.list_addresses(lo).expect("addresses").len(), before);
            table.delete().expect("delete table");
            nl.del_local_prefix(prefix, 64, lo)
                .expect("remove AnyIP route");
        })
        .expect("run");
    }
}
