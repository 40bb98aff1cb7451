//! `PacketCapture`: an AF_PACKET socket that sees every frame on one interface, as tcpdump does,
//! for the lab's observer on the public link (`mt6d demo --pcap`, the leak checks of the tests).
//!
//! Frames are cut to `snaplen` bytes inside the kernel by a one-instruction classic BPF filter, so
//! watching a multi-gigabit transfer costs a small copy per frame; the original length still comes
//! back through `PACKET_AUXDATA`. Bound to one interface, in the namespace of the thread that
//! opened it.

use std::io;
use std::mem;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use crate::error::{OsError, Result};

const ETH_P_ALL: u16 = 0x0003;

/// One captured frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// Bytes written into the caller's buffer (at most snaplen).
    pub captured: usize,
    /// Length of the frame on the wire.
    pub wire_len: usize,
}

/// A packet socket capturing one interface.
#[derive(Debug)]
pub struct PacketCapture {
    fd: OwnedFd,
    interface: String,
}

fn err<'a>(interface: &'a str, op: &'static str) -> impl FnOnce(io::Error) -> OsError + 'a {
    move |source| OsError::Link {
        op: format!("packet capture: {op}"),
        link: interface.to_string(),
        source,
    }
}

impl PacketCapture {
    /// Starts capturing on `interface` (in the calling thread's namespace), keeping the first
    /// `snaplen` bytes of each frame; `recv` waits at most `timeout`.
    pub fn open(interface: &str, snaplen: u32, timeout: Duration) -> Result<PacketCapture> {
        let cname = std::ffi::CString::new(interface).map_err(|_| {
            err(interface, "interface name")(io::Error::from(io::ErrorKind::InvalidInput))
        })?;
        // SAFETY: if_nametoindex reads a NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(err(interface, "look up index")(io::Error::last_os_error()));
        }
        // SAFETY: plain socket(2) call; the result is checked before it is wrapped.
        let raw = unsafe {
            libc::socket(
                libc::AF_PACKET,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                i32::from(ETH_P_ALL.to_be()),
            )
        };
        if raw < 0 {
            return Err(err(interface, "open AF_PACKET socket")(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        // Truncate in the kernel: "ret #snaplen".
        let mut program = [libc::sock_filter {
            code: 0x06,
            jt: 0,
            jf: 0,
            k: snaplen,
        }];
        let fprog = libc::sock_fprog {
            len: 1,
            filter: program.as_mut_ptr(),
        };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
            .map_err(err(interface, "attach filter"))?;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_AUXDATA, &1i32)
            .map_err(err(interface, "PACKET_AUXDATA"))?;
        let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(32i32 << 20));
        let tv = libc::timeval {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_usec: timeout.subsec_micros() as libc::suseconds_t,
        };
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
            .map_err(err(interface, "SO_RCVTIMEO"))?;

        // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = ETH_P_ALL.to_be();
        sll.sll_ifindex = index as i32;
        // SAFETY: `sll` is a valid sockaddr_ll and its size is passed.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sll as *const libc::sockaddr_ll).cast(),
                mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        if rc < 0 {
            return Err(err(interface, "bind")(io::Error::last_os_error()));
        }
        Ok(PacketCapture {
            fd,
            interface: interface.to_string(),
        })
    }

    /// Receives one frame into `buf`. `Ok(None)` when the timeout passed with nothing seen.
    pub fn recv(&self, buf: &mut [u8]) -> Result<Option<Frame>> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 16];
        // SAFETY: msghdr is plain data; zeroed is valid, and the pointers set below outlive the call.
        let mut msg: libc::msghdr = unsafe { mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = mem::size_of_val(&control);
        // SAFETY: `msg` points at live buffers of the sizes it states.
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            let e = io::Error::last_os_error();
            return match e.kind() {
                io::ErrorKind::WouldBlock
                | io::ErrorKind::TimedOut
                | io::ErrorKind::Interrupted => Ok(None),
                _ => Err(err(&self.interface, "receive")(e)),
            };
        }
        let captured = n as usize;
        let mut wire_len = captured;
        // SAFETY: CMSG_* walk the control buffer the kernel filled, bounded by msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_PACKET && (*c).cmsg_type == libc::PACKET_AUXDATA {
                    let aux: libc::tpacket_auxdata =
                        std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                    wire_len = aux.tp_len as usize;
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        Ok(Some(Frame { captured, wire_len }))
    }
}

impl PacketCapture {
    /// Transmits one whole Ethernet frame out of the interface (the lab's attacker on the public
    /// link uses this to replay and forge tunnel packets).
    pub fn send(&self, frame: &[u8]) -> Result<usize> {
        // SAFETY: the pointer and length describe `frame`, which outlives the call; the socket is
        // bound to one interface, so no address is needed.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
        if n < 0 {
            return Err(err(&self.interface, "send")(io::Error::last_os_error()));
        }
        Ok(n as usize)
    }
}

fn setsockopt<T>(fd: &OwnedFd, level: i32, name: i32, value: &T) -> io::Result<()> {
    // SAFETY: `value` is a live T and its exact size is passed.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback exists in every namespace; a UDP datagram to ::1 shows up truncated to snaplen
    /// with its full length reported.
    #[test]
    fn sees_a_loopback_datagram_truncated() {
        let cap = match PacketCapture::open("lo", 64, Duration::from_millis(200)) {
            Ok(c) => c,
            Err(e) if e.raw_os_error() == Some(libc::EPERM) => {
                return eprintln!("skipped: needs root")
            }
            Err(e) => panic!("{e}"),
        };
        let sock = std::net::UdpSocket::bind("[::1]:0").expect("bind");
        let port = sock.local_addr().expect("addr").port();
        sock.send_to(&[0x5a; 500], ("::1", port)).expect("send");
        let mut buf = [0u8; 256];
        let mut seen = false;
        for _ in 0..50 {
            if let Some(f) = cap.recv(&mut buf).expect("recv") {
                if f.wire_len >= 500 && f.captured == 64 {
                    seen = true;
                    break;
                }
            }
        }
        assert!(seen, "datagram not captured");
    }
}
