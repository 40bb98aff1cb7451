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
const ETH_P_IPV6: u16 = 0x86dd;

// Classic BPF opcodes (linux/filter.h) for the in-kernel filters below.
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_LD_H_ABS: u16 = 0x28;
const BPF_LD_B_ABS: u16 = 0x30;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;
/// SKF_AD_OFF (-0x1000) + SKF_AD_PKTTYPE (4): loads the frame's packet type.
const SKF_AD_OFF_PKTTYPE: u32 = 0xffff_f004;

const fn bpf(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

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
        // Truncate in the kernel: "ret #snaplen".
        let program = [bpf(BPF_RET_K, 0, 0, snaplen)];
        Self::open_filtered(interface, ETH_P_ALL, &program, Some(timeout))
    }

    /// Receives only the Neighbour Solicitations and Advertisements that arrive on `interface`
    /// (IPv6 next header 58 directly after the fixed header, ICMPv6 type 135 or 136), not the
    /// frames this host sends or loops back, for the daemon's duplicate address watch
    /// (docs/PROTOCOL.md §5.2). Bound to EtherType IPv6, so the kernel hands it received IPv6
    /// frames only (no copy of transmitted ones), and the in-kernel filter below drops every
    /// other frame before any copy: the data path pays one short filter run per received IPv6
    /// frame. Receive with [`PacketCapture::recv_nowait`]; [`PacketCapture::send`] transmits
    /// the daemon's own probes.
    pub fn open_neighbor_discovery(interface: &str) -> Result<PacketCapture> {
        const DROP: u8 = 10;
        // `jt`/`jf` count instructions after the jump.
        let program = [
            // 0: A = packet type; outgoing (4) and looped-back (5) frames are ours.
            bpf(BPF_LD_W_ABS, 0, 0, SKF_AD_OFF_PKTTYPE),
            bpf(BPF_JGE_K, DROP - 2, 0, 4),
            // 2: EtherType IPv6.
            bpf(BPF_LD_H_ABS, 0, 0, 12),
            bpf(BPF_JEQ_K, 0, DROP - 4, 0x86dd),
            // 4: IPv6 next header ICMPv6.
            bpf(BPF_LD_B_ABS, 0, 0, 14 + 6),
            bpf(BPF_JEQ_K, 0, DROP - 6, 58),
            // 6: ICMPv6 type 135 or 136.
            bpf(BPF_LD_B_ABS, 0, 0, 14 + 40),
            bpf(BPF_JEQ_K, 1, 0, 135),
            bpf(BPF_JEQ_K, 0, DROP - 9, 136),
            // 9: keep (a solicitation or advertisement with options fits easily).
            bpf(BPF_RET_K, 0, 0, 256),
            // 10: drop.
            bpf(BPF_RET_K, 0, 0, 0),
        ];
        Self::open_filtered(interface, ETH_P_IPV6, &program, None)
    }

    fn open_filtered(
        interface: &str,
        protocol: u16,
        program: &[libc::sock_filter],
        timeout: Option<Duration>,
    ) -> Result<PacketCapture> {
        let cname = std::ffi::CString::new(interface).map_err(|_| {
            err(interface, "interface name")(io::Error::from(io::ErrorKind::InvalidInput))
        })?;
        // SAFETY: if_nametoindex reads a NUL-terminated string that outlives the call.
        let index = unsafe { libc::if_nametoindex(cname.as_ptr()) };
        if index == 0 {
            return Err(err(interface, "look up index")(io::Error::last_os_error()));
        }
        // Protocol 0: the socket receives nothing until bind(2) names the interface and the
        // protocol (packet(7)). Opened with the protocol itself it would queue matching frames
        // of *every* interface until the bind: a capture of the external link then reported a
        // host's echo request seen on the internal link as a clear packet on the public one.
        // SAFETY: plain socket(2) call; the result is checked before it is wrapped.
        let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
        if raw < 0 {
            return Err(err(interface, "open AF_PACKET socket")(
                io::Error::last_os_error(),
            ));
        }
        // SAFETY: `raw` is a fresh descriptor we own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };

        let mut program = program.to_vec();
        let fprog = libc::sock_fprog {
            len: program.len() as u16,
            filter: program.as_mut_ptr(),
        };
        // The kernel copies the program during the call.
        setsockopt(&fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &fprog)
            .map_err(err(interface, "attach filter"))?;
        setsockopt(&fd, libc::SOL_PACKET, libc::PACKET_AUXDATA, &1i32)
            .map_err(err(interface, "PACKET_AUXDATA"))?;
        if let Some(timeout) = timeout {
            let _ = setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &(32i32 << 20));
            let tv = libc::timeval {
                tv_sec: timeout.as_secs() as libc::time_t,
                tv_usec: timeout.subsec_micros() as libc::suseconds_t,
            };
            setsockopt(&fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, &tv)
                .map_err(err(interface, "SO_RCVTIMEO"))?;
        }

        // SAFETY: sockaddr_ll is plain data; all-zero is a valid starting value.
        let mut sll: libc::sockaddr_ll = unsafe { mem::zeroed() };
        sll.sll_family = libc::AF_PACKET as u16;
        sll.sll_protocol = protocol.to_be();
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
        self.recv_flags(buf, 0)
    }

    /// Receives one frame into `buf` if one is queued; `Ok(None)` at once otherwise.
    pub fn recv_nowait(&self, buf: &mut [u8]) -> Result<Option<Frame>> {
        self.recv_flags(buf, libc::MSG_DONTWAIT)
    }

    fn recv_flags(&self, buf: &mut [u8], flags: libc::c_int) -> Result<Option<Frame>> {
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
        let n = unsafe { libc::recvmsg(self.fd.as_raw_fd(), &mut msg, flags) };
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

/// For an epoll: the daemon waits for the socket to be readable, then drains it with
/// [`PacketCapture::recv_nowait`].
impl std::os::fd::AsFd for PacketCapture {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
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
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn sees_a_loopback_datagram_truncated() {
        let cap = PacketCapture::open("lo", 64, Duration::from_millis(200)).expect("capture on lo");
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

    /// The neighbour discovery watch on one end of a veth pair receives a solicitation and an
    /// advertisement sent from the other end, but neither a UDP frame nor what it sends itself.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn neighbor_discovery_watch_passes_only_received_ns_and_na() {
        use crate::netlink::Netlink;
        use crate::netns::{unique_name, Netns};
        let ns = Netns::create(&unique_name("ndw")).expect("netns");
        ns.run(|| {
            let mut nl = Netlink::open().expect("netlink");
            nl.create_veth("w0", "w1").expect("veth");
            for name in ["w0", "w1"] {
                let i = nl.link_index(name).expect("index");
                nl.link_set_up(i).expect("up");
            }
            let watch = PacketCapture::open_neighbor_discovery("w0").expect("watch");
            let sender = PacketCapture::open("w1", 256, Duration::from_millis(100)).expect("w1");
            // Ethernet (14) + IPv6 (40) + 24 bytes with next header and ICMPv6 type set; the
            // filter looks at nothing else (the daemon's parser checks the rest).
            let frame = |next_header: u8, icmp_type: u8| {
                let mut f = [0u8; 78];
                f[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
                f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 0x11]);
                f[12..14].copy_from_slice(&[0x86, 0xdd]);
                f[14] = 0x60;
                f[19] = 24;
                f[20] = next_header;
                f[21] = 255;
                f[54] = icmp_type;
                f
            };
            sender.send(&frame(17, 135)).expect("udp");
            sender.send(&frame(58, 128)).expect("echo");
            sender.send(&frame(58, 135)).expect("ns");
            sender.send(&frame(58, 136)).expect("na");
            watch.send(&frame(58, 136)).expect("own na");
            std::thread::sleep(Duration::from_millis(100));
            let mut buf = [0u8; 512];
            let mut seen = Vec::new();
            while let Some(f) = watch.recv_nowait(&mut buf).expect("recv") {
                // Only the test's frames (its source MAC): the kernel's own neighbour discovery
                // on the new veth pair (duplicate address detection of the link-local
                // addresses) is received too, and rightly passes the filter.
                if buf[6..12] == [2, 0, 0, 0, 0, 0x11] {
                    seen.push((buf[20], buf[54], f.captured));
                }
            }
            assert_eq!(seen, vec![(58, 135, 78), (58, 136, 78)]);
        })
        .expect("run");
    }
}
