//! Thin safe wrappers over the few libc calls shared by the socket, netlink and namespace
//! modules: creating sockets, socket options, addresses, timeouts, poll.
//!
//! This is one of the modules allowed to hold `unsafe`; each block states why it is sound.
//! It knows nothing about mt6d: it returns plain `io::Error`s, and callers add the context.

use std::io;
use std::mem;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// Turns a libc `-1`-on-error return value into an `io::Result`.
pub(crate) fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

/// Same as [`cvt`] for `ssize_t` returns.
pub(crate) fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        // A non-negative ssize_t always fits in usize.
        Ok(ret as usize)
    }
}

/// The name interface `index` has now, if it exists (for error messages only).
pub(crate) fn if_name(index: u32) -> Option<String> {
    let mut buf = [0 as libc::c_char; libc::IF_NAMESIZE];
    // SAFETY: buf is IF_NAMESIZE bytes, as if_indextoname(3) requires; it writes a
    // NUL-terminated name there or returns NULL.
    let p = unsafe { libc::if_indextoname(index, buf.as_mut_ptr()) };
    if p.is_null() {
        return None;
    }
    // SAFETY: on success buf holds a NUL-terminated string within its IF_NAMESIZE bytes.
    let name = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
    Some(name.to_string_lossy().into_owned())
}

/// `socket(2)` with `SOCK_CLOEXEC`, owned.
pub(crate) fn socket(
    domain: libc::c_int,
    ty: libc::c_int,
    proto: libc::c_int,
) -> io::Result<OwnedFd> {
    // SAFETY: socket(2) takes no pointers; on success the returned descriptor is new and ours.
    let fd = cvt(unsafe { libc::socket(domain, ty | libc::SOCK_CLOEXEC, proto) })?;
    // SAFETY: `fd` was just returned by socket(2) and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// `setsockopt(2)` with a plain-old-data value.
pub(crate) fn setsockopt<T: Copy>(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
    value: &T,
) -> io::Result<()> {
    // SAFETY: the pointer and length describe `value`, a live `T` for the whole call; the
    // kernel only reads it.
    cvt(unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `getsockopt(2)` of an `int` option.
pub(crate) fn getsockopt_int(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<libc::c_int> {
    let mut value: libc::c_int = 0;
    let mut len = mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals sized as the kernel expects for an int option.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut libc::c_int).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// `getsockopt(2)` of a `u64` option (e.g. `SO_NETNS_COOKIE`).
pub(crate) fn getsockopt_u64(
    fd: BorrowedFd<'_>,
    level: libc::c_int,
    name: libc::c_int,
) -> io::Result<u64> {
    let mut value: u64 = 0;
    let mut len = mem::size_of::<u64>() as libc::socklen_t;
    // SAFETY: `value` and `len` are live locals sized as the kernel expects for a u64 option.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (&mut value as *mut u64).cast(),
            &mut len,
        )
    })?;
    Ok(value)
}

/// Sets `SO_RCVTIMEO`; `None` blocks forever.
pub(crate) fn set_read_timeout(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<()> {
    let tv = match timeout {
        // A zero timeval means "forever" to the kernel; round a zero duration up to 1 us.
        Some(d) => libc::timeval {
            tv_sec: d.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
            tv_usec: (d.subsec_micros().max(u32::from(d.is_zero()))) as libc::suseconds_t,
        },
        None => libc::timeval {
            tv_sec: 0,
            tv_usec: 0,
        },
    };
    setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
}

/// Sets or clears `O_NONBLOCK`.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> io::Result<()> {
    let mut on: libc::c_int = nonblocking.into();
    // SAFETY: FIONBIO reads one int through the pointer, which is a live local.
    cvt(unsafe { libc::ioctl(fd.as_raw_fd(), libc::FIONBIO, &mut on) }).map(drop)
}

/// A `sockaddr_in6` for `addr`.
pub(crate) fn sockaddr_in6(addr: &SocketAddrV6) -> libc::sockaddr_in6 {
    // SAFETY: sockaddr_in6 is plain old data for which all-zero is a valid value.
    let mut sa: libc::sockaddr_in6 = unsafe { mem::zeroed() };
    sa.sin6_family = libc::AF_INET6 as libc::sa_family_t;
    sa.sin6_port = addr.port().to_be();
    sa.sin6_flowinfo = addr.flowinfo().to_be();
    sa.sin6_addr.s6_addr = addr.ip().octets();
    sa.sin6_scope_id = addr.scope_id();
    sa
}

/// The `SocketAddrV6` in a `sockaddr_in6` filled by the kernel.
pub(crate) fn socket_addr_v6(sa: &libc::sockaddr_in6) -> SocketAddrV6 {
    SocketAddrV6::new(
        Ipv6Addr::from(sa.sin6_addr.s6_addr),
        u16::from_be(sa.sin6_port),
        u32::from_be(sa.sin6_flowinfo),
        sa.sin6_scope_id,
    )
}

/// `bind(2)` to an IPv6 socket address.
pub(crate) fn bind6(fd: BorrowedFd<'_>, addr: &SocketAddrV6) -> io::Result<()> {
    let sa = sockaddr_in6(addr);
    // SAFETY: the pointer and length describe the live local `sa`.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in6).cast(),
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `connect(2)` of an IPv6 socket.
pub(crate) fn connect6(fd: BorrowedFd<'_>, addr: &SocketAddrV6) -> io::Result<()> {
    let sa = sockaddr_in6(addr);
    // SAFETY: the pointer and length describe the live local `sa`.
    cvt(unsafe {
        libc::connect(
            fd.as_raw_fd(),
            (&sa as *const libc::sockaddr_in6).cast(),
            mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t,
        )
    })
    .map(drop)
}

/// `getsockname(2)` of an IPv6 socket.
pub(crate) fn local_addr6(fd: BorrowedFd<'_>) -> io::Result<SocketAddrV6> {
    // SAFETY: all-zero is a valid sockaddr_in6.
    let mut sa: libc::sockaddr_in6 = unsafe { mem::zeroed() };
    let mut len = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    // SAFETY: `sa` and `len` are live locals; the kernel writes at most `len` bytes.
    cvt(unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut sa as *mut libc::sockaddr_in6).cast(),
            &mut len,
        )
    })?;
    Ok(socket_addr_v6(&sa))
}

/// `send(2)` of one buffer.
pub(crate) fn send(fd: BorrowedFd<'_>, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which the kernel only reads.
    cvt_size(unsafe { libc::send(fd.as_raw_fd(), buf.as_ptr().cast(), buf.len(), 0) })
}

/// `recv(2)` into one buffer.
/// Binds a netlink socket to the multicast `groups` (e.g. RTMGRP_LINK) of the calling thread's
/// network namespace.
pub(crate) fn bind_netlink_groups(fd: BorrowedFd<'_>, groups: u32) -> io::Result<()> {
    // SAFETY: sockaddr_nl is plain old data; all-zero is a valid value.
    let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
    sa.nl_groups = groups;
    // SAFETY: sa is a valid sockaddr_nl and the length passed is its size.
    cvt(unsafe {
        libc::bind(
            fd.as_raw_fd(),
            std::ptr::addr_of!(sa).cast::<libc::sockaddr>(),
            std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
        )
    })
    .map(drop)
}

pub(crate) fn recv(fd: BorrowedFd<'_>, buf: &mut [u8], flags: libc::c_int) -> io::Result<usize> {
    // SAFETY: the pointer and length describe `buf`, which is exclusively borrowed.
    cvt_size(unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), flags) })
}

/// Writes one native-endian u64 (eventfd).
pub(crate) fn write_u64(fd: BorrowedFd<'_>, v: u64) -> io::Result<()> {
    let b = v.to_ne_bytes();
    // SAFETY: the pointer and length describe the live local `b`.
    cvt_size(unsafe { libc::write(fd.as_raw_fd(), b.as_ptr().cast(), b.len()) }).map(drop)
}

/// Reads one native-endian u64 (eventfd).
pub(crate) fn read_u64(fd: BorrowedFd<'_>) -> io::Result<u64> {
    let mut b = [0u8; 8];
    // SAFETY: the pointer and length describe the live local `b`.
    cvt_size(unsafe { libc::read(fd.as_raw_fd(), b.as_mut_ptr().cast(), b.len()) })?;
    Ok(u64::from_ne_bytes(b))
}

/// The process at the other end of a connected unix socket, as the kernel recorded it when
/// that process connected (`SO_PEERCRED`, unix(7)): it cannot be forged by the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCredentials {
    pub pid: u32,
    pub uid: u32,
    pub gid: u32,
}

/// `SO_PEERCRED` of a connected unix socket.
pub fn peer_credentials(fd: BorrowedFd<'_>) -> io::Result<PeerCredentials> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` is a live ucred and `len` its size, as getsockopt(2) for SO_PEERCRED
    // requires; the kernel writes at most `len` bytes there.
    cvt(unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(PeerCredentials {
        pid: cred.pid.max(0) as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

/// The effective user id of this process (geteuid(2) cannot fail).
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid takes no arguments, touches no memory of ours and always succeeds.
    unsafe { libc::geteuid() }
}

/// Sets the calling thread's nice value (Linux keeps it per thread; threads it starts later
/// inherit it). A value below the current one needs CAP_SYS_NICE (or RLIMIT_NICE): EACCES or
/// EPERM without.
pub fn set_thread_nice(nice: i32) -> io::Result<()> {
    // SAFETY: gettid takes no arguments and always succeeds.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tid = libc::id_t::try_from(tid).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // SAFETY: setpriority takes plain integers; PRIO_PROCESS with a thread id names that thread.
    cvt(unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nice) }).map(drop)
}

/// The calling thread's nice value.
pub fn thread_nice() -> io::Result<i32> {
    // SAFETY: gettid takes no arguments and always succeeds.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    let tid = libc::id_t::try_from(tid).map_err(|_| io::Error::from(io::ErrorKind::InvalidData))?;
    // getpriority may return -1 as a value: errno tells an error apart (getpriority(2)).
    // SAFETY: errno is thread-local; writing it before the call is the documented protocol.
    unsafe { *libc::__errno_location() = 0 };
    // SAFETY: getpriority takes plain integers.
    let v = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    let err = io::Error::last_os_error();
    if v == -1 && err.raw_os_error() != Some(0) {
        return Err(err);
    }
    Ok(v)
}

/// A set of CPUs, as `sched_getaffinity(2)` and `sched_setaffinity(2)` take it.
#[derive(Clone, Copy)]
pub struct CpuSet(libc::cpu_set_t);

impl std::fmt::Debug for CpuSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_set().entries(self.cpus()).finish()
    }
}

impl CpuSet {
    /// The most CPUs a set can name (`CPU_SETSIZE`).
    pub const CAPACITY: usize = libc::CPU_SETSIZE as usize;

    /// The set of one CPU, or `None` if `cpu` is beyond [`CpuSet::CAPACITY`].
    pub fn single(cpu: usize) -> Option<CpuSet> {
        Self::of(&[cpu])
    }

    /// The set of `cpus`, or `None` if one is beyond [`CpuSet::CAPACITY`].
    pub fn of(cpus: &[usize]) -> Option<CpuSet> {
        // SAFETY: cpu_set_t is a plain bit array; all zeroes is the empty set.
        let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
        for &cpu in cpus {
            if cpu >= Self::CAPACITY {
                return None;
            }
            // SAFETY: `cpu` is below CPU_SETSIZE (checked above), so the bit is inside `set`.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        Some(CpuSet(set))
    }

    /// Whether `cpu` is in the set.
    pub fn contains(&self, cpu: usize) -> bool {
        // SAFETY: `cpu` is below CPU_SETSIZE, so the bit read is inside the set.
        cpu < Self::CAPACITY && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    /// The CPUs in the set, lowest first.
    pub fn cpus(&self) -> impl Iterator<Item = usize> + '_ {
        (0..Self::CAPACITY).filter(|&c| self.contains(c))
    }

    /// How many CPUs the set names.
    pub fn len(&self) -> usize {
        // SAFETY: counts the bits of a live, fully initialised set.
        let n = unsafe { libc::CPU_COUNT(&self.0) };
        usize::try_from(n).unwrap_or(0)
    }

    /// Whether the set names no CPU.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The CPUs the calling thread may run on.
pub fn thread_affinity() -> io::Result<CpuSet> {
    // SAFETY: cpu_set_t is a plain bit array; all zeroes is a valid value for the kernel to fill.
    let mut set: libc::cpu_set_t = unsafe { mem::zeroed() };
    // SAFETY: pid 0 names the calling thread; `set` is a live local of the size passed.
    cvt(unsafe { libc::sched_getaffinity(0, mem::size_of::<libc::cpu_set_t>(), &mut set) })?;
    Ok(CpuSet(set))
}

/// Restricts the calling thread to `cpus` (EINVAL if none of them is online and allowed by the
/// thread's cpuset). If the thread runs elsewhere now, the kernel moves it before returning.
pub fn set_thread_affinity(cpus: &CpuSet) -> io::Result<()> {
    // SAFETY: pid 0 names the calling thread; the kernel only reads `cpus`, sized as passed.
    cvt(unsafe { libc::sched_setaffinity(0, mem::size_of::<libc::cpu_set_t>(), &cpus.0) }).map(drop)
}

/// Waits until `fd` is readable or `timeout` passes; returns whether it is readable.
/// EINTR counts as "not readable yet".
pub fn wait_readable(fd: RawFd, timeout: Option<Duration>) -> io::Result<bool> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as libc::c_int);
    // SAFETY: one live pollfd, nfds = 1.
    match cvt(unsafe { libc::poll(&mut pfd, 1, ms) }) {
        Ok(n) => Ok(n > 0),
        Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(false),
        Err(e) => Err(e),
    }
}

/// Control messages (`cmsg(3)`) are built and parsed as bytes, which needs no `unsafe`: a
/// `cmsghdr` is `{ size_t len; int level; int type; }` followed by data, each message padded to
/// `size_t` alignment (`CMSG_ALIGN`).
pub(crate) const CMSG_HDR_LEN: usize = mem::size_of::<libc::cmsghdr>();

const fn cmsg_align(n: usize) -> usize {
    (n + mem::size_of::<usize>() - 1) & !(mem::size_of::<usize>() - 1)
}

/// `CMSG_SPACE(data_len)`.
pub(crate) const fn cmsg_space(data_len: usize) -> usize {
    cmsg_align(CMSG_HDR_LEN) + cmsg_align(data_len)
}

/// A control-message buffer aligned like a `cmsghdr`.
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub(crate) struct CmsgBuf<const N: usize>(pub(crate) [u8; N]);

/// Writes one control message at `buf[at..]`; returns the offset after it (its CMSG_SPACE).
/// Panics only if `buf` is too small, which the fixed buffer sizes of the callers rule out.
pub(crate) fn put_cmsg(
    buf: &mut [u8],
    at: usize,
    level: libc::c_int,
    ty: libc::c_int,
    data: &[u8],
) -> usize {
    let len = cmsg_align(CMSG_HDR_LEN) + data.len();
    let end = at + cmsg_space(data.len());
    buf[at..end].fill(0);
    buf[at..at + mem::size_of::<usize>()].copy_from_slice(&len.to_ne_bytes());
    let l = at + mem::size_of::<usize>();
    buf[l..l + 4].copy_from_slice(&level.to_ne_bytes());
    buf[l + 4..l + 8].copy_from_slice(&ty.to_ne_bytes());
    let d = at + cmsg_align(CMSG_HDR_LEN);
    buf[d..d + data.len()].copy_from_slice(data);
    end
}

/// Iterates `(level, type, data)` over the control messages the kernel wrote.
pub(crate) struct Cmsgs<'a>(pub(crate) &'a [u8]);

impl<'a> Iterator for Cmsgs<'a> {
    type Item = (libc::c_int, libc::c_int, &'a [u8]);

    fn next(&mut self) -> Option<Self::Item> {
        let b = self.0;
        let w = mem::size_of::<usize>();
        if b.len() < CMSG_HDR_LEN {
            return None;
        }
        let len = usize::from_ne_bytes(b[..w].try_into().ok()?);
        let level = libc::c_int::from_ne_bytes(b[w..w + 4].try_into().ok()?);
        let ty = libc::c_int::from_ne_bytes(b[w + 4..w + 8].try_into().ok()?);
        let start = cmsg_align(CMSG_HDR_LEN);
        if len < start || len > b.len() {
            self.0 = &[];
            return None;
        }
        self.0 = b.get(cmsg_align(len)..).unwrap_or(&[]);
        Some((level, ty, &b[start..len]))
    }
}

/// `struct in6_pktinfo { struct in6_addr ipi6_addr; int ipi6_ifindex; }` as bytes.
pub(crate) fn in6_pktinfo(addr: Ipv6Addr, ifindex: u32) -> [u8; 20] {
    let mut b = [0u8; 20];
    b[..16].copy_from_slice(&addr.octets());
    b[16..].copy_from_slice(&ifindex.to_ne_bytes());
    b
}

/// Parses an `in6_pktinfo` control message's data.
pub(crate) fn parse_in6_pktinfo(data: &[u8]) -> Option<(Ipv6Addr, u32)> {
    let addr: [u8; 16] = data.get(..16)?.try_into().ok()?;
    let ifindex = u32::from_ne_bytes(data.get(16..20)?.try_into().ok()?);
    Some((Ipv6Addr::from(addr), ifindex))
}

/// Receives one datagram with `recvmsg(2)`: returns (bytes, flags, source, control length).
pub(crate) fn recvmsg6(
    fd: BorrowedFd<'_>,
    buf: &mut [u8],
    control: &mut [u8],
) -> io::Result<(usize, libc::c_int, SocketAddrV6, usize)> {
    // SAFETY: all-zero is a valid sockaddr_in6 and msghdr.
    let mut name: libc::sockaddr_in6 = unsafe { mem::zeroed() };
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: as above.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    hdr.msg_name = (&mut name as *mut libc::sockaddr_in6).cast();
    hdr.msg_namelen = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    hdr.msg_control = control.as_mut_ptr().cast();
    hdr.msg_controllen = control.len() as _;
    // SAFETY: every pointer in `hdr` refers to a live, exclusively borrowed buffer whose length
    // is given next to it; the kernel writes within those lengths only.
    let n = cvt_size(unsafe { libc::recvmsg(fd.as_raw_fd(), &mut hdr, 0) })?;
    // msg_controllen is size_t on glibc but socklen_t on musl.
    #[allow(clippy::unnecessary_cast)]
    let clen = hdr.msg_controllen as usize;
    Ok((n, hdr.msg_flags, socket_addr_v6(&name), clen))
}

/// Sends one datagram with `sendmsg(2)` to `dst` with the given control messages.
pub(crate) fn sendmsg6(
    fd: BorrowedFd<'_>,
    buf: &[u8],
    dst: &SocketAddrV6,
    control: &[u8],
) -> io::Result<usize> {
    let name = sockaddr_in6(dst);
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // SAFETY: all-zero is a valid msghdr.
    let mut hdr: libc::msghdr = unsafe { mem::zeroed() };
    hdr.msg_name = (&name as *const libc::sockaddr_in6) as *mut libc::c_void;
    hdr.msg_namelen = mem::size_of::<libc::sockaddr_in6>() as libc::socklen_t;
    hdr.msg_iov = &mut iov;
    hdr.msg_iovlen = 1;
    if !control.is_empty() {
        hdr.msg_control = control.as_ptr() as *mut libc::c_void;
        hdr.msg_controllen = control.len() as _;
    }
    // SAFETY: every pointer in `hdr` refers to a live buffer of the stated length; sendmsg only
    // reads through them despite the `*mut` types.
    cvt_size(unsafe { libc::sendmsg(fd.as_raw_fd(), &hdr, 0) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn a_thread_pinned_to_one_cpu_runs_there_and_can_be_released() {
        std::thread::spawn(|| {
            let all = thread_affinity().expect("sched_getaffinity");
            assert!(!all.is_empty());
            for cpu in all.cpus() {
                let one = CpuSet::single(cpu).expect("a CPU below CPU_SETSIZE");
                assert_eq!(one.len(), 1);
                set_thread_affinity(&one).expect("sched_setaffinity");
                assert_eq!(
                    thread_affinity().expect("get").cpus().collect::<Vec<_>>(),
                    [cpu]
                );
                // SAFETY: sched_getcpu takes no arguments.
                let running = unsafe { libc::sched_getcpu() };
                assert_eq!(usize::try_from(running).ok(), Some(cpu));
            }
            set_thread_affinity(&all).expect("restore");
            assert_eq!(thread_affinity().expect("get").len(), all.len());
        })
        .join()
        .expect("thread");
        assert!(CpuSet::single(CpuSet::CAPACITY).is_none());
        let set = CpuSet::of(&[3, 1, 3]).expect("small numbers");
        assert_eq!(set.cpus().collect::<Vec<_>>(), [1, 3]);
        assert_eq!(set.len(), 2);
        assert!(CpuSet::of(&[]).expect("empty").is_empty());
    }

    #[test]
    fn sockaddr_round_trip() {
        let a = SocketAddrV6::new("2001:db8::7".parse().expect("literal"), 4242, 0, 3);
        assert_eq!(socket_addr_v6(&sockaddr_in6(&a)), a);
    }

    #[test]
    fn cmsg_round_trip() {
        let mut b = CmsgBuf([0u8; 64]);
        let a: Ipv6Addr = "2001:db8::5".parse().expect("literal");
        let at = put_cmsg(
            &mut b.0,
            0,
            libc::IPPROTO_IPV6,
            libc::IPV6_PKTINFO,
            &in6_pktinfo(a, 3),
        );
        assert_eq!(at, cmsg_space(20));
        let end = put_cmsg(&mut b.0, at, libc::SOL_UDP, 103, &1200u16.to_ne_bytes());
        let v: Vec<_> = Cmsgs(&b.0[..end]).collect();
        assert_eq!(v.len(), 2);
        assert_eq!(parse_in6_pktinfo(v[0].2), Some((a, 3)));
        assert_eq!(
            (v[1].0, v[1].1, v[1].2),
            (libc::SOL_UDP, 103, &1200u16.to_ne_bytes()[..])
        );
        // SAFETY: CMSG_SPACE/CMSG_LEN only compute sizes.
        unsafe {
            assert_eq!(cmsg_space(20), libc::CMSG_SPACE(20) as usize);
            assert_eq!(cmsg_space(2), libc::CMSG_SPACE(2) as usize);
        }
    }

    #[test]
    fn read_timeout_expires_as_would_block() {
        let s = socket(libc::AF_INET6, libc::SOCK_DGRAM, 0).expect("udp socket");
        bind6(s.as_fd(), &SocketAddrV6::new(Ipv6Addr::LOCALHOST, 0, 0, 0)).expect("bind");
        set_read_timeout(s.as_fd(), Some(Duration::from_millis(20))).expect("timeout");
        let mut b = [0u8; 16];
        let e = recv(s.as_fd(), &mut b, 0).expect_err("nothing was sent");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert!(!wait_readable(s.as_raw_fd(), Some(Duration::from_millis(1))).expect("poll"));
    }

    #[test]
    fn nice_is_per_thread_and_inherited_by_threads_started_later() {
        let main = thread_nice().expect("nice");
        std::thread::spawn(move || {
            // A higher nice value (lower priority) needs no privilege.
            let lower = (main + 1).min(19);
            set_thread_nice(lower).expect("lower the priority");
            assert_eq!(thread_nice().expect("nice"), lower);
            let child = std::thread::spawn(|| thread_nice().expect("nice"));
            assert_eq!(child.join().expect("child"), lower);
        })
        .join()
        .expect("thread");
        assert_eq!(
            thread_nice().expect("nice"),
            main,
            "the caller's thread kept its own"
        );
    }
}
