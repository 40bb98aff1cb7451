//! `UdpSocket6`: the tunnel's UDP sockets, batched with `sendmmsg`/`recvmmsg`, and [`Epoll`]
//! to wait on all of them (one socket per hopping port) at once.
//!
//! Why each socket option (set by [`UdpSocket6::bind`]):
//! - `IPV6_FREEBIND`: the source of every packet is the current hashed address, chosen per
//!   packet with an `IPV6_PKTINFO` control message; freebind lets the kernel accept a source
//!   that is being added, still tentative, or already retired by a rotation.
//! - `IPV6_RECVPKTINFO`: the hashed address a packet was sent *to* identifies the session and
//!   epoch, so every received datagram reports its destination address.
//! - `UDP_GRO` / `UDP_SEGMENT`: one syscall carries many equal-size datagrams (quinn-udp and
//!   wireguard-go do the same); [`RecvBuf::datagrams`] splits a coalesced buffer.
//! - `IPV6_MTU_DISCOVER = IPV6_PMTUDISC_DO`: never fragment; too-large sends fail with
//!   EMSGSIZE so the daemon learns the path MTU instead of silently fragmenting.
//! - `SO_RCVBUF`/`SO_SNDBUF` of 7 MiB, what wireguard-go asks for (`conn/controlfns_linux.go`),
//!   with the `FORCE` variants (CAP_NET_ADMIN) so `net.core.rmem_max` does not cap them: the
//!   receive queue must hold what arrives while the receive thread waits for a core.
//!   [`UdpSocket6::recv_buffer_size`] tells the size granted when the fallback was capped.
//! - With [`UdpSocket6::bind_transparent`] (the server role's receive path, docs/ARCHITECTURE.md
//!   "The server role"): `IPV6_TRANSPARENT`, so an nftables `tproxy` rule can hand the socket
//!   datagrams for any address and port of a prefix; `SO_REUSEPORT`, so that one socket per
//!   worker shares the port; and `IPV6_RECVORIGDSTADDR`, so each datagram reports the address
//!   *and port* it was sent to ([`RecvBuf::dst_port`]).
//! - `SO_RXQ_OVFL`: every datagram carries the socket's count of datagrams the kernel dropped
//!   because the receive queue was full; [`UdpSocket6::take_queue_drops`] reports them, so an
//!   overflow is a counted drop, not a silent loss (the only other trace is the namespace-wide
//!   `Udp6RcvbufErrors`).
//!
//! The hot path allocates nothing: [`SendScratch`] and [`RecvScratch`] hold the `mmsghdr`,
//! `iovec`, address and control arrays and are reused; the caller owns the payload buffers.
//! Scratches belong to one thread each; a socket may be shared (`&UdpSocket6` is `Sync`).
//!
//! No protocol logic: payloads are opaque bytes, addresses come from the daemon.

use std::io;
use std::mem;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

use crate::error::{OsError, Result};
use crate::sys::{self, cvt, put_cmsg, CmsgBuf, Cmsgs};

// Not all of these are exported by every libc target; values from linux/udp.h and linux/in6.h.
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;
const IPV6_FREEBIND: libc::c_int = 78;

/// Size of one receive buffer: the largest GRO-coalesced datagram train.
pub const RECV_BUF_LEN: usize = 65536;
/// Gives the socket `fd` (any kind, e.g. a lab service's `std::net::UdpSocket`) receive and send
/// buffers of [`SOCKET_BUFFER`], as the tunnel sockets have: a thread that waits for a core
/// then finds its datagrams queued instead of dropped (`Udp6RcvbufErrors`). `port` only names
/// the socket in the error.
pub fn grow_socket_buffers(fd: BorrowedFd<'_>, port: u16) -> Result<()> {
    set_buffers(fd).map_err(|(op, source)| OsError::Udp { port, op, source })
}

/// SO_RCVBUF and SO_SNDBUF of [`SOCKET_BUFFER`]; the FORCE variants need CAP_NET_ADMIN and
/// ignore rmem_max/wmem_max, so each falls back to the capped one.
fn set_buffers(f: BorrowedFd<'_>) -> std::result::Result<(), (&'static str, io::Error)> {
    let size = SOCKET_BUFFER as libc::c_int;
    if sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &size).is_err() {
        sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_RCVBUF, &size)
            .map_err(|e| ("set SO_RCVBUF", e))?;
    }
    if sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &size).is_err() {
        sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_SNDBUF, &size)
            .map_err(|e| ("set SO_SNDBUF", e))?;
    }
    Ok(())
}

/// Socket buffer size asked for (bytes): wireguard-go's `socketBufferSize` (7 MiB). The kernel
/// doubles it for its own bookkeeping (each queued datagram is charged its whole buffer, a few
/// KiB for a full-size one).
pub const SOCKET_BUFFER: usize = 7 << 20;

const SEND_CTRL_LEN: usize = sys::cmsg_space(20) + sys::cmsg_space(2);
// PKTINFO (40) + UDP_GRO (24) + SO_RXQ_OVFL (24) + ORIGDSTADDR (48), with room to spare.
const RECV_CTRL_LEN: usize = 192;

/// One datagram (or, with `segment_size`, a train of equal-size datagrams) to send.
#[derive(Debug, Clone, Copy)]
pub struct SendMsg<'a> {
    /// Source address, set per packet with IPV6_PKTINFO; `::` lets the kernel choose.
    pub src: Ipv6Addr,
    /// Destination address and port.
    pub dst: SocketAddrV6,
    /// The UDP payload (or payloads back to back).
    pub payload: &'a [u8],
    /// UDP GSO: `payload` is several datagrams of this size, the last possibly shorter. Keep
    /// the count at or below 64, and only set it while [`UdpSocket6::gso_supported`].
    pub segment_size: Option<u16>,
}

impl SendMsg<'_> {
    /// Empties a vector of messages and hands back its allocation with a fresh lifetime, so a
    /// sending thread keeps one vector for every batch. `into_iter().map(..).collect()` over a
    /// same-layout type reuses the buffer in place (std's in-place collect): no allocation per
    /// batch; the vector is empty, so the closure never runs.
    pub fn recycle<'b>(mut v: Vec<SendMsg<'_>>) -> Vec<SendMsg<'b>> {
        v.clear();
        v.into_iter()
            .map(|m| SendMsg {
                src: m.src,
                dst: m.dst,
                payload: &[],
                segment_size: m.segment_size,
            })
            .collect()
    }
}

/// Reusable arrays for [`UdpSocket6::send_batch`]; one per sending thread.
pub struct SendScratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_in6>,
    ctrl: Vec<CmsgBuf<SEND_CTRL_LEN>>,
}

// SAFETY: the raw pointers inside the mmsghdr/iovec arrays are only meaningful during one
// send_batch call, which rewrites all of them before use; between calls they are inert data.
unsafe impl Send for SendScratch {}

impl std::fmt::Debug for SendScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendScratch")
            .field("capacity", &self.hdrs.len())
            .finish()
    }
}

pub(crate) fn zeroed_vec<T>(n: usize) -> Vec<T> {
    (0..n)
        .map(|_| {
            // SAFETY: only instantiated with libc C structs (mmsghdr, iovec and arrays of them,
            // sockaddr_in6), for all of which all-zero bytes (null pointers, zero lengths) are
            // valid values.
            unsafe { mem::zeroed() }
        })
        .collect()
}

impl SendScratch {
    /// Scratch for batches of up to `batch` messages (e.g. [`crate::IDEAL_BATCH_SIZE`]).
    pub fn new(batch: usize) -> SendScratch {
        let batch = batch.max(1);
        SendScratch {
            hdrs: zeroed_vec(batch),
            iovs: zeroed_vec(batch),
            names: zeroed_vec(batch),
            ctrl: vec![CmsgBuf([0; SEND_CTRL_LEN]); batch],
        }
    }
}

/// One receive buffer and what the kernel said about the datagram(s) in it.
pub struct RecvBuf {
    data: Box<[u8]>,
    len: usize,
    src: SocketAddrV6,
    dst: Ipv6Addr,
    dst_port: u16,
    ifindex: u32,
    segment_size: Option<u16>,
    truncated: bool,
}

impl std::fmt::Debug for RecvBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvBuf")
            .field("len", &self.len)
            .field("src", &self.src)
            .field("dst", &self.dst)
            .field("segment_size", &self.segment_size)
            .finish()
    }
}

impl Default for RecvBuf {
    fn default() -> Self {
        Self::new()
    }
}

impl RecvBuf {
    /// A buffer of [`RECV_BUF_LEN`] bytes, enough for a GRO train.
    pub fn new() -> RecvBuf {
        RecvBuf {
            data: vec![0; RECV_BUF_LEN].into_boxed_slice(),
            len: 0,
            src: SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, 0, 0, 0),
            dst: Ipv6Addr::UNSPECIFIED,
            dst_port: 0,
            ifindex: 0,
            segment_size: None,
            truncated: false,
        }
    }

    /// The received bytes (all datagrams of a GRO train back to back).
    pub fn data(&self) -> &[u8] {
        &self.data[..self.len]
    }

    /// The received bytes, mutable (for in-place decryption).
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.data[..self.len]
    }

    /// Number of bytes received.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if nothing was received into this buffer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The sender.
    pub fn src(&self) -> SocketAddrV6 {
        self.src
    }

    /// The local address the datagram was sent to (IPV6_PKTINFO): the hashed address.
    pub fn dst(&self) -> Ipv6Addr {
        self.dst
    }

    /// The local port the datagram was sent to, on a socket of
    /// [`UdpSocket6::bind_transparent`] (IPV6_ORIGDSTADDR: what a `tproxy` rule redirected);
    /// 0 on an ordinary socket, whose own port it is.
    pub fn dst_port(&self) -> u16 {
        self.dst_port
    }

    /// The interface it arrived on (IPV6_PKTINFO).
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// UDP GRO: the buffer holds several datagrams of this size, the last possibly shorter.
    pub fn segment_size(&self) -> Option<u16> {
        self.segment_size
    }

    /// The datagram did not fit (MSG_TRUNC); drop it.
    pub fn truncated(&self) -> bool {
        self.truncated
    }

    /// The individual datagrams in this buffer.
    pub fn datagrams(&self) -> std::slice::Chunks<'_, u8> {
        let seg = self.segment_size.map_or(self.len, usize::from).max(1);
        self.data().chunks(seg)
    }

    /// The individual datagrams, mutable (header protection is removed in place).
    pub fn datagrams_mut(&mut self) -> std::slice::ChunksMut<'_, u8> {
        let seg = self.segment_size.map_or(self.len, usize::from).max(1);
        self.data_mut().chunks_mut(seg)
    }
}

/// Reusable arrays for [`UdpSocket6::recv_batch`]; one per receiving thread.
pub struct RecvScratch {
    hdrs: Vec<libc::mmsghdr>,
    iovs: Vec<libc::iovec>,
    names: Vec<libc::sockaddr_in6>,
    ctrl: Vec<CmsgBuf<RECV_CTRL_LEN>>,
}

// SAFETY: as for SendScratch, the pointers are rewritten by every recv_batch call before use.
unsafe impl Send for RecvScratch {}

impl std::fmt::Debug for RecvScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecvScratch")
            .field("capacity", &self.hdrs.len())
            .finish()
    }
}

impl RecvScratch {
    /// Scratch for up to `batch` receive buffers per call.
    pub fn new(batch: usize) -> RecvScratch {
        let batch = batch.max(1);
        RecvScratch {
            hdrs: zeroed_vec(batch),
            iovs: zeroed_vec(batch),
            names: zeroed_vec(batch),
            ctrl: vec![CmsgBuf([0; RECV_CTRL_LEN]); batch],
        }
    }
}

/// A UDP socket on `[::]:port` for tunnel traffic. See the module docs for its options.
#[derive(Debug)]
pub struct UdpSocket6 {
    fd: OwnedFd,
    port: u16,
    gso_supported: AtomicBool,
    /// The kernel's count of receive-queue drops, as last reported by SO_RXQ_OVFL (it only
    /// rises), and how much of it [`UdpSocket6::take_queue_drops`] has handed out.
    queue_drops_seen: AtomicU32,
    queue_drops_taken: AtomicU32,
}

impl UdpSocket6 {
    /// Binds `[::]:port` (0: any free port) with the options listed in the module docs.
    pub fn bind(port: u16) -> Result<UdpSocket6> {
        Self::bind_with(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, port, 0, 0), false)
    }

    /// [`UdpSocket6::bind`] to one address and port only (`IPV6_FREEBIND`: the address need not
    /// be configured, e.g. one of an AnyIP prefix). A sending socket bound so receives nothing
    /// sent to the machine's other addresses: a scan of those ports finds every port closed,
    /// whatever this socket sends from.
    pub fn bind_to(addr: SocketAddrV6) -> Result<UdpSocket6> {
        Self::bind_with(addr, false)
    }

    /// [`UdpSocket6::bind`] for a `tproxy` rule's target, `[addr]:port`: `IPV6_TRANSPARENT`
    /// (needs CAP_NET_ADMIN), `SO_REUSEPORT` (several sockets, one per worker, share the
    /// address and port; the kernel spreads datagrams over them by a hash of their addresses
    /// and ports) and `IPV6_RECVORIGDSTADDR` ([`RecvBuf::dst_port`]).
    ///
    /// A rule `tproxy ip6 to [addr]:port` hands its datagrams to this socket whatever their
    /// destination; an ordinary datagram reaches it only if sent to `addr` itself. With
    /// `addr` `::1` that is nothing from outside the host: bound to `[::]:port` instead, every
    /// address of the host (its true address, a link-local one) answered on `port`.
    pub fn bind_transparent(addr: Ipv6Addr, port: u16) -> Result<UdpSocket6> {
        Self::bind_with(SocketAddrV6::new(addr, port, 0, 0), true)
    }

    fn bind_with(addr: SocketAddrV6, transparent: bool) -> Result<UdpSocket6> {
        let port = addr.port();
        let ctx = |op| move |source| OsError::Udp { port, op, source };
        let fd = sys::socket(libc::AF_INET6, libc::SOCK_DGRAM, libc::IPPROTO_UDP)
            .map_err(ctx("socket"))?;
        let on: libc::c_int = 1;
        let f = fd.as_fd();
        if transparent {
            sys::setsockopt(f, libc::IPPROTO_IPV6, libc::IPV6_TRANSPARENT, &on)
                .map_err(ctx("set IPV6_TRANSPARENT"))?;
            sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_REUSEPORT, &on)
                .map_err(ctx("set SO_REUSEPORT"))?;
            sys::setsockopt(f, libc::IPPROTO_IPV6, libc::IPV6_RECVORIGDSTADDR, &on)
                .map_err(ctx("set IPV6_RECVORIGDSTADDR"))?;
        }
        sys::setsockopt(f, libc::IPPROTO_IPV6, libc::IPV6_V6ONLY, &on)
            .map_err(ctx("set IPV6_V6ONLY"))?;
        sys::setsockopt(f, libc::IPPROTO_IPV6, IPV6_FREEBIND, &on)
            .map_err(ctx("set IPV6_FREEBIND"))?;
        sys::setsockopt(f, libc::IPPROTO_IPV6, libc::IPV6_RECVPKTINFO, &on)
            .map_err(ctx("set IPV6_RECVPKTINFO"))?;
        sys::setsockopt(
            f,
            libc::IPPROTO_IPV6,
            libc::IPV6_MTU_DISCOVER,
            &libc::IPV6_PMTUDISC_DO,
        )
        .map_err(ctx("set IPV6_MTU_DISCOVER"))?;
        sys::setsockopt(f, libc::SOL_UDP, UDP_GRO, &on).map_err(ctx("set UDP_GRO"))?;
        sys::setsockopt(f, libc::SOL_SOCKET, libc::SO_RXQ_OVFL, &on)
            .map_err(ctx("set SO_RXQ_OVFL"))?;
        set_buffers(f).map_err(|(op, e)| ctx(op)(e))?;
        sys::bind6(f, &addr).map_err(ctx("bind"))?;
        let port = sys::local_addr6(f).map_err(ctx("getsockname"))?.port();
        Ok(UdpSocket6 {
            fd,
            port,
            gso_supported: AtomicBool::new(true),
            queue_drops_seen: AtomicU32::new(0),
            queue_drops_taken: AtomicU32::new(0),
        })
    }

    /// The bound port.
    pub fn local_port(&self) -> u16 {
        self.port
    }

    /// The receive buffer size the kernel granted (bytes, as reported by SO_RCVBUF: twice
    /// what was asked for, [`SOCKET_BUFFER`], unless `net.core.rmem_max` capped it).
    pub fn recv_buffer_size(&self) -> Result<usize> {
        sys::getsockopt_int(self.fd.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUF)
            .map(|v| v.max(0) as usize)
            .map_err(|source| OsError::Udp {
                port: self.port,
                op: "get SO_RCVBUF",
                source,
            })
    }

    /// The send buffer size the kernel granted (bytes, as reported by SO_SNDBUF).
    pub fn send_buffer_size(&self) -> Result<usize> {
        sys::getsockopt_int(self.fd.as_fd(), libc::SOL_SOCKET, libc::SO_SNDBUF)
            .map(|v| v.max(0) as usize)
            .map_err(|source| OsError::Udp {
                port: self.port,
                op: "get SO_SNDBUF",
                source,
            })
    }

    /// Datagrams the kernel dropped because this socket's receive queue was full, reported
    /// (SO_RXQ_OVFL) since the last call. The kernel reports the count with the next datagram
    /// it queues, so a drop shows once the socket receives again. Two atomic operations: cheap
    /// enough to call after every [`UdpSocket6::recv_batch`].
    pub fn take_queue_drops(&self) -> u64 {
        let seen = self.queue_drops_seen.load(Ordering::Relaxed);
        let taken = self.queue_drops_taken.swap(seen, Ordering::Relaxed);
        u64::from(seen.wrapping_sub(taken))
    }

    /// Read timeout for [`UdpSocket6::recv_batch`]; on expiry it returns an error whose
    /// [`OsError::is_would_block`] is true. `None` blocks forever.
    pub fn set_read_timeout(&self, timeout: Option<Duration>) -> Result<()> {
        sys::set_read_timeout(self.fd.as_fd(), timeout).map_err(|source| OsError::Udp {
            port: self.port,
            op: "set SO_RCVTIMEO",
            source,
        })
    }

    /// Switches to non-blocking mode (for use behind [`Epoll`]).
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        sys::set_nonblocking(self.fd.as_fd(), nonblocking).map_err(|source| OsError::Udp {
            port: self.port,
            op: "set O_NONBLOCK",
            source,
        })
    }

    /// False once a GSO send failed with EIO (the egress device cannot checksum-offload, as
    /// quinn-udp observed); from then on send datagrams one per message.
    pub fn gso_supported(&self) -> bool {
        self.gso_supported.load(Ordering::Relaxed)
    }

    /// Sends up to `scratch`'s capacity of `msgs` with one `sendmmsg`; returns how many
    /// messages the kernel took. Fewer than given means the rest must be retried (the next
    /// call reports the error, if any, of the first unsent one). Errors: EAGAIN/ENOBUFS (queue
    /// full: drop or retry later), EMSGSIZE (larger than path MTU), EIO with a segment size
    /// (GSO unsupported: [`UdpSocket6::gso_supported`] turns false).
    pub fn send_batch(&self, scratch: &mut SendScratch, msgs: &[SendMsg<'_>]) -> Result<usize> {
        let n = msgs.len().min(scratch.hdrs.len());
        if n == 0 {
            return Ok(0);
        }
        for (i, m) in msgs[..n].iter().enumerate() {
            scratch.names[i] = sys::sockaddr_in6(&m.dst);
            scratch.iovs[i] = libc::iovec {
                iov_base: m.payload.as_ptr() as *mut libc::c_void,
                iov_len: m.payload.len(),
            };
            let ctrl = &mut scratch.ctrl[i].0;
            let mut used = 0;
            if !m.src.is_unspecified() {
                used = put_cmsg(
                    ctrl,
                    used,
                    libc::IPPROTO_IPV6,
                    libc::IPV6_PKTINFO,
                    &sys::in6_pktinfo(m.src, 0),
                );
            }
            if let Some(seg) = m.segment_size {
                used = put_cmsg(ctrl, used, libc::SOL_UDP, UDP_SEGMENT, &seg.to_ne_bytes());
            }
            let h = &mut scratch.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut scratch.names[i] as *mut libc::sockaddr_in6).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut scratch.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = if used == 0 {
                std::ptr::null_mut()
            } else {
                ctrl.as_mut_ptr().cast()
            };
            h.msg_hdr.msg_controllen = used as _;
            h.msg_hdr.msg_flags = 0;
        }
        loop {
            // SAFETY: hdrs[..n] were all filled above; each points at names[i], iovs[i] and
            // ctrl[i] in `scratch` and at msgs[i].payload, all of which outlive this call and
            // are not moved during it. The kernel only reads the payloads.
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
                    if e.raw_os_error() == Some(libc::EIO) && msgs[0].segment_size.is_some() {
                        self.gso_supported.store(false, Ordering::Relaxed);
                        return Err(OsError::Udp {
                            port: self.port,
                            op: "sendmmsg with UDP GSO",
                            source: e,
                        });
                    }
                    return Err(OsError::Udp {
                        port: self.port,
                        op: "sendmmsg",
                        source: e,
                    });
                }
            }
        }
    }

    /// Receives into `bufs` with one `recvmmsg` (returns once at least one datagram is there,
    /// MSG_WAITFORONE); returns how many buffers were filled. Blocks up to the read timeout.
    pub fn recv_batch(&self, scratch: &mut RecvScratch, bufs: &mut [RecvBuf]) -> Result<usize> {
        self.recv_mmsg(scratch, bufs, libc::MSG_WAITFORONE)
    }

    /// [`UdpSocket6::recv_batch`] that never blocks: what is queued now, or an error whose
    /// [`OsError::is_would_block`] is true. For a thread that waits on readiness (epoll) and
    /// serves many sockets: a readiness that finds nothing to read (any datagram the kernel
    /// discards at read time) must not park it in one socket while datagrams queue on others;
    /// in an old epoch's socket nothing would ever come to wake it.
    pub fn recv_ready(&self, scratch: &mut RecvScratch, bufs: &mut [RecvBuf]) -> Result<usize> {
        self.recv_mmsg(scratch, bufs, libc::MSG_DONTWAIT)
    }

    fn recv_mmsg(
        &self,
        scratch: &mut RecvScratch,
        bufs: &mut [RecvBuf],
        flags: libc::c_int,
    ) -> Result<usize> {
        let n = bufs.len().min(scratch.hdrs.len());
        if n == 0 {
            return Ok(0);
        }
        for (i, b) in bufs[..n].iter_mut().enumerate() {
            scratch.iovs[i] = libc::iovec {
                iov_base: b.data.as_mut_ptr().cast(),
                iov_len: b.data.len(),
            };
            let h = &mut scratch.hdrs[i];
            h.msg_len = 0;
            h.msg_hdr.msg_name = (&mut scratch.names[i] as *mut libc::sockaddr_in6).cast();
            h.msg_hdr.msg_namelen = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
            h.msg_hdr.msg_iov = &mut scratch.iovs[i];
            h.msg_hdr.msg_iovlen = 1;
            h.msg_hdr.msg_control = scratch.ctrl[i].0.as_mut_ptr().cast();
            h.msg_hdr.msg_controllen = RECV_CTRL_LEN as _;
            h.msg_hdr.msg_flags = 0;
        }
        let got = loop {
            // SAFETY: hdrs[..n] point at names[i], iovs[i], ctrl[i] (in `scratch`) and at
            // bufs[i].data, all exclusively borrowed for this call with their true lengths; the
            // kernel writes within those lengths only. A null timeout means none.
            let r = unsafe {
                libc::recvmmsg(
                    self.fd.as_raw_fd(),
                    scratch.hdrs.as_mut_ptr(),
                    n as libc::c_uint,
                    flags,
                    std::ptr::null_mut(),
                )
            };
            match cvt(r) {
                Ok(got) => break got as usize,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    return Err(OsError::Udp {
                        port: self.port,
                        op: "recvmmsg",
                        source: e,
                    })
                }
            }
        };
        let mut queue_drops = None;
        for (i, b) in bufs[..got].iter_mut().enumerate() {
            let h = &scratch.hdrs[i];
            b.len = (h.msg_len as usize).min(b.data.len());
            b.src = sys::socket_addr_v6(&scratch.names[i]);
            b.truncated = h.msg_hdr.msg_flags & libc::MSG_TRUNC != 0;
            b.dst = Ipv6Addr::UNSPECIFIED;
            b.dst_port = 0;
            b.ifindex = 0;
            b.segment_size = None;
            // msg_controllen is size_t on glibc but socklen_t on musl.
            #[allow(clippy::unnecessary_cast)]
            let clen = (h.msg_hdr.msg_controllen as usize).min(RECV_CTRL_LEN);
            if let Some(n) = b.read_cmsgs(&scratch.ctrl[i].0[..clen]) {
                queue_drops = Some(n);
            }
        }
        if let Some(n) = queue_drops {
            // The last datagram carries the newest count; a wrapped u32 is still newer.
            self.queue_drops_seen.store(n, Ordering::Relaxed);
        }
        Ok(got)
    }
}

impl RecvBuf {
    /// Reads one received datagram's control messages into this buffer (destination address
    /// and port, interface, GRO segment size); returns the socket's drop count if the kernel
    /// reported one.
    fn read_cmsgs(&mut self, ctrl: &[u8]) -> Option<u32> {
        let mut queue_drops = None;
        for (level, ty, data) in Cmsgs(ctrl) {
            match (level, ty) {
                (libc::IPPROTO_IPV6, libc::IPV6_PKTINFO) => {
                    if let Some((dst, ifindex)) = sys::parse_in6_pktinfo(data) {
                        self.dst = dst;
                        self.ifindex = ifindex;
                    }
                }
                // A sockaddr_in6: the port (network order) at 2..4, the address at 8..24.
                (libc::IPPROTO_IPV6, libc::IPV6_ORIGDSTADDR) => {
                    if let (Some(port), Some(addr)) = (
                        data.get(2..4).and_then(|d| <[u8; 2]>::try_from(d).ok()),
                        data.get(8..24).and_then(|d| <[u8; 16]>::try_from(d).ok()),
                    ) {
                        self.dst_port = u16::from_be_bytes(port);
                        if self.dst.is_unspecified() {
                            self.dst = Ipv6Addr::from(addr);
                        }
                    }
                }
                (libc::SOL_UDP, UDP_GRO) => {
                    if let Some(v) = data.get(..4).and_then(|d| <[u8; 4]>::try_from(d).ok()) {
                        self.segment_size =
                            u16::try_from(i32::from_ne_bytes(v)).ok().filter(|&s| s > 0);
                    }
                }
                // Only present once the socket has dropped something: the kernel's running
                // count (sk_drops) when this datagram was queued.
                (libc::SOL_SOCKET, libc::SO_RXQ_OVFL) => {
                    if let Some(v) = data.get(..4).and_then(|d| <[u8; 4]>::try_from(d).ok()) {
                        queue_drops = Some(u32::from_ne_bytes(v));
                    }
                }
                _ => {}
            }
        }
        queue_drops
    }
}

impl AsRawFd for UdpSocket6 {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl AsFd for UdpSocket6 {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Level-triggered readiness for many descriptors (the per-port sockets, the TUN, a
/// [`Waker`]): each registered with a caller-chosen `token`.
#[derive(Debug)]
pub struct Epoll {
    fd: OwnedFd,
}

/// The events one [`Epoll::wait`] returned; reusable.
pub struct EpollEvents {
    buf: Vec<libc::epoll_event>,
    len: usize,
}

impl std::fmt::Debug for EpollEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tokens()).finish()
    }
}

impl EpollEvents {
    /// Room for `n` events per wait.
    pub fn with_capacity(n: usize) -> EpollEvents {
        EpollEvents {
            buf: vec![libc::epoll_event { events: 0, u64: 0 }; n.max(1)],
            len: 0,
        }
    }

    /// Tokens of the descriptors that are readable (or in error: reading reports it).
    pub fn tokens(&self) -> impl Iterator<Item = u64> + '_ {
        self.buf[..self.len].iter().map(|e| e.u64)
    }
}

impl Epoll {
    /// A new epoll instance.
    pub fn new() -> Result<Epoll> {
        // SAFETY: epoll_create1 takes a flag; on success the descriptor is new and ours.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) }).map_err(|source| {
            OsError::Epoll {
                op: "create",
                source,
            }
        })?;
        // SAFETY: `fd` was just returned by epoll_create1 and is owned by nobody else.
        Ok(Epoll {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Watches `fd` for readability, reporting `token`.
    pub fn add(&self, fd: RawFd, token: u64) -> Result<()> {
        let mut ev = libc::epoll_event {
            events: libc::EPOLLIN as u32,
            u64: token,
        };
        // SAFETY: `ev` is a live local; the kernel copies it.
        cvt(unsafe { libc::epoll_ctl(self.fd.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut ev) })
            .map(drop)
            .map_err(|source| OsError::Epoll {
                op: "add descriptor",
                source,
            })
    }

    /// Stops watching `fd`; one that is not watched (or closed) is success.
    pub fn delete(&self, fd: RawFd) -> Result<()> {
        // SAFETY: EPOLL_CTL_DEL ignores the event pointer; null is allowed since Linux 2.6.9.
        match cvt(unsafe {
            libc::epoll_ctl(
                self.fd.as_raw_fd(),
                libc::EPOLL_CTL_DEL,
                fd,
                std::ptr::null_mut(),
            )
        }) {
            Err(e) if !matches!(e.raw_os_error(), Some(libc::ENOENT | libc::EBADF)) => {
                Err(OsError::Epoll {
                    op: "delete descriptor",
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    /// Waits for readiness up to `timeout` (`None`: forever), rounded up to the millisecond
    /// (a wait for a deadline never returns before it: rounding down would wake a loop early,
    /// to find nothing due and wait again). Returns the number of ready descriptors, 0 on
    /// timeout or signal.
    pub fn wait(&self, events: &mut EpollEvents, timeout: Option<Duration>) -> Result<usize> {
        let ms = timeout.map_or(-1, |d| {
            d.as_nanos().div_ceil(1_000_000).min(i32::MAX as u128) as libc::c_int
        });
        let cap = events.buf.len().min(i32::MAX as usize) as libc::c_int;
        // SAFETY: the pointer and capacity describe `events.buf`, exclusively borrowed.
        let r = unsafe { libc::epoll_wait(self.fd.as_raw_fd(), events.buf.as_mut_ptr(), cap, ms) };
        events.len = match cvt(r) {
            Ok(n) => n as usize,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => 0,
            Err(e) => {
                return Err(OsError::Epoll {
                    op: "wait",
                    source: e,
                })
            }
        };
        Ok(events.len)
    }
}

impl AsRawFd for Epoll {
    /// The epoll descriptor, readable while one of its descriptors is ready: an epoll set can
    /// be watched by another (epoll(7)).
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// An eventfd that makes an [`Epoll::wait`] return, so worker threads notice shutdown at once.
#[derive(Debug)]
pub struct Waker {
    fd: OwnedFd,
}

impl Waker {
    /// A new, unsignalled waker.
    pub fn new() -> Result<Waker> {
        // SAFETY: eventfd takes an initial value and flags; the descriptor is new and ours.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) }).map_err(
            |source| OsError::Epoll {
                op: "create eventfd",
                source,
            },
        )?;
        // SAFETY: `fd` was just returned by eventfd and is owned by nobody else.
        Ok(Waker {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Makes the waker readable (stays readable until [`Waker::reset`]).
    pub fn wake(&self) -> Result<()> {
        match sys::write_u64(self.fd.as_fd(), 1) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(OsError::Epoll {
                op: "signal eventfd",
                source: e,
            }),
            _ => Ok(()),
        }
    }

    /// Clears the signal.
    pub fn reset(&self) {
        let _ = sys::read_u64(self.fd.as_fd());
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{AddrFlags, Netlink};
    use crate::netns::{unique_name, Netns};
    use std::collections::BTreeSet;
    use std::time::Instant;

    #[test]
    fn epoll_and_waker() {
        let ep = Epoll::new().expect("epoll");
        let w = Waker::new().expect("waker");
        ep.add(w.as_raw_fd(), 7).expect("add");
        let mut ev = EpollEvents::with_capacity(4);
        assert_eq!(
            ep.wait(&mut ev, Some(Duration::from_millis(1)))
                .expect("wait"),
            0
        );
        w.wake().expect("wake");
        assert_eq!(
            ep.wait(&mut ev, Some(Duration::from_secs(5)))
                .expect("wait"),
            1
        );
        assert_eq!(ev.tokens().collect::<Vec<_>>(), vec![7]);
        w.reset();
        ep.delete(w.as_raw_fd()).expect("delete");
        ep.delete(w.as_raw_fd()).expect("delete twice");
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn a_socket_bound_to_one_address_receives_nothing_sent_to_another() {
        let ns = Netns::create(&unique_name("udb")).expect("netns");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let lo = nl.link_index("lo").expect("lo");
            nl.link_set_up(lo).expect("lo up");
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: false,
            };
            let other: Ipv6Addr = "fd00:99::2".parse().expect("addr");
            nl.add_address(lo, other, 128, flags).expect("address");
            // Not configured anywhere: IPV6_FREEBIND lets it bind.
            let hashed = SocketAddrV6::new("fd00:98::7".parse().expect("addr"), 0, 0, 0);
            let bound = UdpSocket6::bind_to(hashed).expect("bind_to");
            let port = bound.local_port();
            assert_ne!(port, 0);
            bound.set_nonblocking(true).expect("nonblocking");
            let probe = std::net::UdpSocket::bind("[::1]:0").expect("probe socket");
            probe
                .send_to(b"scan", SocketAddrV6::new(other, port, 0, 0))
                .expect("send");
            probe
                .send_to(b"scan", SocketAddrV6::new(Ipv6Addr::LOCALHOST, port, 0, 0))
                .expect("send");
            std::thread::sleep(Duration::from_millis(50));
            let mut scratch = RecvScratch::new(4);
            let mut bufs: Vec<RecvBuf> = (0..4).map(|_| RecvBuf::new()).collect();
            let got = bound.recv_ready(&mut scratch, &mut bufs);
            assert!(matches!(got, Err(ref e) if e.is_would_block()), "{got:?}");
        })
        .expect("in netns");
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn loopback_batch_and_timeout() {
        let ns = Netns::create(&unique_name("udl")).expect("netns");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let lo = nl.link_index("lo").expect("lo");
            nl.link_set_up(lo).expect("lo up");
            let a = UdpSocket6::bind(0).expect("bind a");
            let b = UdpSocket6::bind(0).expect("bind b");
            // As root the FORCE variants pass rmem_max/wmem_max; the kernel doubles the request.
            assert_eq!(b.recv_buffer_size().expect("rcvbuf"), 2 * SOCKET_BUFFER);
            assert_eq!(b.send_buffer_size().expect("sndbuf"), 2 * SOCKET_BUFFER);
            b.set_read_timeout(Some(Duration::from_millis(50)))
                .expect("timeout");
            let mut rs = RecvScratch::new(4);
            let mut bufs: Vec<RecvBuf> = (0..4).map(|_| RecvBuf::new()).collect();
            let e = b.recv_batch(&mut rs, &mut bufs).expect_err("empty socket");
            assert!(e.is_would_block(), "{e}");
            // Without waiting for the read timeout: the receive thread's read after epoll. A
            // long timeout, so that a loaded machine's scheduling delay cannot pass for a wait.
            b.set_read_timeout(Some(Duration::from_secs(3)))
                .expect("timeout");
            let started = std::time::Instant::now();
            let e = b.recv_ready(&mut rs, &mut bufs).expect_err("empty socket");
            assert!(e.is_would_block(), "{e}");
            assert!(
                started.elapsed() < Duration::from_millis(1500),
                "recv_ready waited for the read timeout"
            );
            b.set_read_timeout(Some(Duration::from_millis(50)))
                .expect("timeout");

            let dst = SocketAddrV6::new(Ipv6Addr::LOCALHOST, b.local_port(), 0, 0);
            let mut ss = SendScratch::new(4);
            let msgs = [
                SendMsg {
                    src: Ipv6Addr::UNSPECIFIED,
                    dst,
                    payload: b"x",
                    segment_size: None,
                },
                SendMsg {
                    src: Ipv6Addr::LOCALHOST,
                    dst,
                    payload: b"yy",
                    segment_size: None,
                },
            ];
            assert_eq!(a.send_batch(&mut ss, &msgs).expect("send"), 2);
            let mut seen = Vec::new();
            while seen.len() < 2 {
                let n = b.recv_batch(&mut rs, &mut bufs).expect("recv");
                for r in &bufs[..n] {
                    assert_eq!(r.src().port(), a.local_port());
                    assert_eq!(r.dst(), Ipv6Addr::LOCALHOST);
                    seen.push(r.data().to_vec());
                }
            }
            assert_eq!(seen, vec![b"x".to_vec(), b"yy".to_vec()]);
            assert_eq!(b.take_queue_drops(), 0);

            // Overflow a tiny receive queue: what the kernel drops is counted, and reported
            // with the first datagram queued after the drops.
            let tiny: libc::c_int = 4096;
            sys::setsockopt(b.as_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &tiny)
                .expect("shrink rcvbuf");
            let big = [7u8; 1200];
            let burst = SendMsg {
                src: Ipv6Addr::UNSPECIFIED,
                dst,
                payload: &big,
                segment_size: None,
            };
            for _ in 0..64 {
                assert_eq!(a.send_batch(&mut ss, &[burst]).expect("send"), 1);
            }
            let mut queued = 0;
            loop {
                match b.recv_batch(&mut rs, &mut bufs) {
                    Ok(n) => queued += n,
                    Err(e) if e.is_would_block() => break,
                    Err(e) => panic!("recv: {e}"),
                }
            }
            assert!(queued < 64, "a 4 KiB queue held {queued} datagrams");
            assert_eq!(a.send_batch(&mut ss, &msgs[..1]).expect("send"), 1);
            assert_eq!(b.recv_batch(&mut rs, &mut bufs).expect("recv"), 1);
            assert_eq!(b.take_queue_drops(), 64 - queued as u64);
            assert_eq!(b.take_queue_drops(), 0, "taken once");
        })
        .expect("run");
    }

    /// Two namespaces joined by a veth. A sends from two FREEBIND source addresses chosen per
    /// packet, plus a GSO train; B checks source, destination and GRO segmentation.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn veth_pktinfo_sources_and_gso_train() {
        let ns_a = Netns::create(&unique_name("uda")).expect("netns a");
        let ns_b = Netns::create(&unique_name("udb")).expect("netns b");
        let a1: Ipv6Addr = "2001:db8:6d::a1".parse().expect("literal");
        let a2: Ipv6Addr = "2001:db8:6d::a2".parse().expect("literal");
        let b1: Ipv6Addr = "2001:db8:6d::b1".parse().expect("literal");
        let nodad = AddrFlags {
            nodad: true,
            noprefixroute: false,
        };

        let (mut nl_a, ia) = ns_a
            .run(|| {
                let mut nl = Netlink::open().expect("netlink a");
                nl.create_veth("va", "vb").expect("veth");
                let vb = nl.link_index("vb").expect("vb");
                nl.move_link_to_netns(vb, ns_b.fd()).expect("move vb");
                let va = nl.link_index("va").expect("va");
                (nl, va)
            })
            .expect("run a");
        let (mut nl_b, ib) = ns_b
            .run(|| {
                let mut nl = Netlink::open().expect("netlink b");
                let vb = nl.link_index("vb").expect("vb in b");
                (nl, vb)
            })
            .expect("run b");
        for a in [a1, a2] {
            nl_a.add_address(ia, a, 64, nodad).expect("address a");
        }
        nl_b.add_address(ib, b1, 64, nodad).expect("address b");
        nl_a.link_set_up(ia).expect("va up");
        nl_b.link_set_up(ib).expect("vb up");
        crate::netlink::tests::wait_local(&mut nl_b, b1, true);
        // Static neighbours: no ND round trip, so the first packets are not queued or dropped.
        let mac_a = nl_a.link_mac(ia).expect("mac a").expect("veth has a MAC");
        let mac_b = nl_b.link_mac(ib).expect("mac b").expect("veth has a MAC");
        nl_a.add_neighbor(ia, b1, mac_b, true).expect("neigh b1");
        for a in [a1, a2] {
            nl_b.add_neighbor(ib, a, mac_a, true).expect("neigh a");
        }

        let sock_b = ns_b
            .run(|| UdpSocket6::bind(0))
            .expect("run")
            .expect("bind b");
        let sock_a = ns_a
            .run(|| UdpSocket6::bind(0))
            .expect("run")
            .expect("bind a");
        sock_b
            .set_read_timeout(Some(Duration::from_millis(200)))
            .expect("timeout");
        let dst = SocketAddrV6::new(b1, sock_b.local_port(), 0, 0);
        let train: Vec<u8> = (0..250u32).map(|i| (i % 251) as u8).collect();
        let msgs = [
            SendMsg {
                src: a1,
                dst,
                payload: b"from a1",
                segment_size: None,
            },
            SendMsg {
                src: a2,
                dst,
                payload: b"from a2",
                segment_size: None,
            },
            SendMsg {
                src: a1,
                dst,
                payload: &train,
                segment_size: Some(100),
            },
        ];
        let mut ss = SendScratch::new(8);
        let mut sent = 0;
        while sent < msgs.len() {
            sent += sock_a.send_batch(&mut ss, &msgs[sent..]).expect("send");
        }

        let mut expected: BTreeSet<(Ipv6Addr, Vec<u8>)> = BTreeSet::new();
        expected.insert((a1, b"from a1".to_vec()));
        expected.insert((a2, b"from a2".to_vec()));
        for c in train.chunks(100) {
            expected.insert((a1, c.to_vec()));
        }
        let mut got = BTreeSet::new();
        let mut saw_gro = false;
        let mut rs = RecvScratch::new(8);
        let mut bufs: Vec<RecvBuf> = (0..8).map(|_| RecvBuf::new()).collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while got.len() < expected.len() && Instant::now() < deadline {
            let n = match sock_b.recv_batch(&mut rs, &mut bufs) {
                Err(e) if e.is_would_block() => continue,
                r => r.expect("recv"),
            };
            for r in &bufs[..n] {
                assert_eq!(r.dst(), b1, "PKTINFO destination");
                assert_eq!(r.src().port(), sock_a.local_port());
                assert_eq!(r.ifindex(), ib);
                assert!(!r.truncated());
                if let Some(seg) = r.segment_size() {
                    saw_gro = true;
                    assert_eq!(seg, 100);
                    let d: Vec<_> = r.datagrams().collect();
                    assert!(d[..d.len() - 1].iter().all(|x| x.len() == 100));
                    assert!(d[d.len() - 1].len() <= 100);
                }
                for d in r.datagrams() {
                    got.insert((*r.src().ip(), d.to_vec()));
                }
            }
        }
        assert_eq!(got, expected);
        assert!(
            saw_gro,
            "the GSO train should arrive as one GRO buffer over veth"
        );
        assert!(sock_a.gso_supported());
    }
}
