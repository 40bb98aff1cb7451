//! `Tun`: the layer-3 TUN device through which protected hosts' IPv6 packets enter and leave
//! the gateway, with virtio-net offload (IFF_VNET_HDR, TSO and USO) via tun-rs.
//!
//! With offload on, one `read` can return a 64 KiB TCP or UDP super-packet; [`Tun::recv_batch`]
//! splits it (GSO) into ordinary IPv6 packets, so the daemon always sees packets of at most the
//! device MTU. [`Tun::send_batch`] does the reverse: it coalesces (GRO) same-flow packets of a
//! batch before writing, so the kernel stack above handles fewer, larger packets. This is what
//! wireguard-go's `tun_linux.go` does, and tun-rs is a port of it.
//!
//! Buffers and headroom:
//! - receive: each output buffer needs `offset + mtu` bytes; the packet is written at
//!   `[offset..offset + sizes[i]]`, leaving `offset` bytes in front for the daemon's own
//!   encapsulation headers. Give [`IDEAL_BATCH_SIZE`] buffers: one super-packet of small
//!   segments can fill many.
//! - send: each buffer holds one IPv6 packet at `[offset..]` with `offset >= VIRTIO_NET_HDR_LEN`
//!   (the virtio header is written in front of it). Coalescing appends to the first packet of a
//!   flow, so give `Vec`s a capacity of `offset + 65535` to avoid reallocation.
//!
//! The device disappears when the `Tun` is dropped (it is not persistent). It lives in the
//! network namespace of the thread that created it. `Tun` is `Send + Sync`: one thread may
//! read while another writes through a shared reference.
//!
//! No protocol logic: packets are opaque IPv6 bytes here.

use std::os::fd::{AsRawFd, RawFd};

use crate::error::{OsError, Result};

pub use tun_rs::{ExpandBuffer, GROTable, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN};

/// Largest packet one read from the device can return (a GSO super-packet).
const MAX_READ: usize = VIRTIO_NET_HDR_LEN + 65535;

/// The device's transmit queue (`txqueuelen`, packets): where packets from the protected side
/// wait for the transmit thread to read them. The kernel's default for TUN, 500, is 20 ms at
/// 25,000 packets/s; a transmit thread that waited longer for a core (other work on a 2-core
/// machine) lost the excess, counted only as the device's `tx_dropped`. 10,000 is about half a
/// second at that rate; a queue that full also means half a second of added delay, so the
/// bound stays.
pub const TX_QUEUE_LEN: u32 = 10_000;

/// One packet for [`Tun::send_batch`], refilled without zeroing: the packet is the first
/// `len` bytes of a storage that keeps every byte it held initialized. A `Vec<u8>` truncated to
/// a short packet (a 72-byte ACK) and grown back to the MTU for the next one zero-fills the
/// difference each time: about 1.5 KB of memset per packet, 1.4 % of the gateways' CPU in a
/// TCP transfer (2026-11-27 profile). Bytes between the packet's end and what the next writer
/// fills may be those of an earlier packet: a writer fills what it claims, and only the first
/// `len` bytes are ever written to the device.
#[derive(Debug, Clone, Default)]
pub struct PacketBuf {
    storage: Vec<u8>,
    len: usize,
}

impl PacketBuf {
    /// An empty packet with room for `capacity` bytes (coalescing appends up to 64 KiB to
    /// the first packet of a flow: give `VIRTIO_NET_HDR_LEN + 65535`).
    pub fn with_capacity(capacity: usize) -> PacketBuf {
        PacketBuf {
            storage: Vec::with_capacity(capacity),
            len: 0,
        }
    }

    /// Makes the packet `len` bytes long, to be overwritten: bytes it held before stay as
    /// they were (zero the first time the storage reaches that length).
    pub fn prepare(&mut self, len: usize) {
        if self.storage.len() < len {
            self.storage.resize(len, 0);
        }
        self.len = len;
    }

    /// Shortens the packet to `len` bytes (no effect if it is shorter).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// The packet's length.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the packet is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl AsRef<[u8]> for PacketBuf {
    fn as_ref(&self) -> &[u8] {
        &self.storage[..self.len]
    }
}

impl AsMut<[u8]> for PacketBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.storage[..self.len]
    }
}

impl ExpandBuffer for PacketBuf {
    fn buf_capacity(&self) -> usize {
        self.storage.capacity()
    }

    fn buf_resize(&mut self, new_len: usize, value: u8) {
        if new_len > self.len {
            let kept = new_len.min(self.storage.len());
            self.storage[self.len..kept].fill(value);
            if new_len > self.storage.len() {
                self.storage.resize(new_len, value);
            }
        }
        self.len = new_len;
    }

    fn buf_extend_from_slice(&mut self, src: &[u8]) {
        let end = self.len + src.len();
        if end <= self.storage.len() {
            self.storage[self.len..end].copy_from_slice(src);
        } else {
            self.storage.truncate(self.len);
            self.storage.extend_from_slice(src);
        }
        self.len = end;
    }
}

/// An offload-enabled TUN device.
pub struct Tun {
    dev: tun_rs::SyncDevice,
    name: String,
    index: u32,
}

impl std::fmt::Debug for Tun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tun")
            .field("name", &self.name)
            .field("index", &self.index)
            .finish()
    }
}

/// Reusable read buffer for [`Tun::recv_batch`]; one per reading thread.
pub struct TunRecvScratch {
    raw: Box<[u8]>,
}

impl std::fmt::Debug for TunRecvScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TunRecvScratch")
            .field("len", &self.raw.len())
            .finish()
    }
}

impl Default for TunRecvScratch {
    fn default() -> Self {
        Self::new()
    }
}

impl TunRecvScratch {
    /// A scratch buffer large enough for any super-packet.
    pub fn new() -> Self {
        TunRecvScratch {
            raw: vec![0; MAX_READ].into_boxed_slice(),
        }
    }
}

impl Tun {
    /// Creates TUN device `name` with offload on and a transmit queue of [`TX_QUEUE_LEN`], sets
    /// its MTU and brings it up. With `queues > 1` the device is multi-queue (IFF_MULTI_QUEUE)
    /// and the returned vector holds one `Tun` per queue, the first the one created: the kernel
    /// spreads the packets it sends into the device over the queues by flow hash (one flow, one
    /// queue), and a queue that writes a flow's packets is where that flow's packets in the other
    /// direction are read (the device's flow table follows the writer).
    pub fn create(name: &str, mtu: u16, queues: usize) -> Result<Vec<Tun>> {
        let ctx = |op| {
            move |source| OsError::Tun {
                name: name.to_owned(),
                op,
                source,
            }
        };
        let dev = tun_rs::DeviceBuilder::new()
            .name(name)
            .mtu(mtu)
            .offload(true)
            .multi_queue(queues > 1)
            .tx_queue_len(TX_QUEUE_LEN)
            .enable(true)
            .build_sync()
            .map_err(ctx("create with offload"))?;
        let name = dev.name().map_err(ctx("read name"))?;
        let index = dev.if_index().map_err(ctx("read index"))?;
        let mut all = Vec::with_capacity(queues.max(1));
        for _ in 1..queues {
            let queue = dev.try_clone().map_err(ctx("attach a queue"))?;
            all.push(Tun {
                dev: queue,
                name: name.clone(),
                index,
            });
        }
        all.insert(0, Tun { dev, name, index });
        Ok(all)
    }

    /// The device's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The device's interface index (in its namespace).
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The device's transmit queue length as the kernel has it (packets).
    pub fn tx_queue_len(&self) -> Result<u32> {
        self.dev.tx_queue_len().map_err(|source| OsError::Tun {
            name: self.name.clone(),
            op: "read txqueuelen",
            source,
        })
    }

    /// Whether the kernel accepted UDP segmentation offload (USO, Linux >= 6.2). Without it
    /// `send_batch` coalesces only TCP.
    pub fn udp_gso(&self) -> bool {
        self.dev.udp_gso()
    }

    /// Switches between blocking (default) and non-blocking reads and writes.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        self.dev
            .set_nonblocking(nonblocking)
            .map_err(|source| OsError::Tun {
                name: self.name.clone(),
                op: "set non-blocking",
                source,
            })
    }

    /// Reads one (possibly super-) packet and splits it into `out`: packet `i` is
    /// `out[i][offset..offset + sizes[i]]`. Returns how many packets were written. Blocks unless
    /// non-blocking; wait with [`crate::udp::Epoll`] or [`crate::wait_readable`] to time out.
    pub fn recv_batch<B: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        scratch: &mut TunRecvScratch,
        out: &mut [B],
        sizes: &mut [usize],
        offset: usize,
    ) -> Result<usize> {
        let n = self
            .dev
            .recv_multiple(&mut scratch.raw, out, sizes, offset)
            .map_err(|source| OsError::Tun {
                name: self.name.clone(),
                op: "read batch",
                source,
            })?;
        for (buf, &size) in out.iter_mut().zip(sizes.iter()).take(n) {
            if let Some(packet) = buf.as_mut().get_mut(offset..offset + size) {
                fix_zero_udp_checksum(packet);
            }
        }
        Ok(n)
    }

    /// Writes a batch of IPv6 packets, each at `bufs[i][offset..]` with `offset >=
    /// VIRTIO_NET_HDR_LEN`, coalescing same-flow TCP/UDP packets first (`gro` is reusable
    /// state, one per writing thread). Returns the bytes written. If some writes failed, the
    /// others were still made and the last error is returned.
    pub fn send_batch<B: ExpandBuffer>(
        &self,
        gro: &mut GROTable,
        bufs: &mut [B],
        offset: usize,
    ) -> Result<usize> {
        if offset < VIRTIO_NET_HDR_LEN {
            return Err(OsError::InvalidArgument(format!(
                "TUN send offset {offset} < VIRTIO_NET_HDR_LEN {VIRTIO_NET_HDR_LEN}"
            )));
        }
        self.dev
            .send_multiple(gro, bufs, offset)
            .map_err(|source| OsError::Tun {
                name: self.name.clone(),
                op: "write batch",
                source,
            })
    }
}

impl AsRawFd for Tun {
    fn as_raw_fd(&self) -> RawFd {
        self.dev.as_raw_fd()
    }
}

/// A UDP-over-IPv6 checksum computed as 0 must be sent as 0xFFFF (RFC 8200 section 8.1): 0
/// means "no checksum", which IPv6 receivers drop (`Udp6InCsumErrors`). The offload path that
/// completes a checksum-offloaded packet read from the TUN device (tun-rs 2.8's
/// `gso_none_checksum`) writes the one's complement as it is, so about 1 UDP datagram in 65,536
/// left with 0 and was dropped by the far host. Only a UDP header directly after the IPv6
/// header is looked at (the position the kernel's offload puts the checksum for these
/// packets); a 0 there is never valid, so turning it into 0xFFFF cannot make a bad datagram
/// pass, and fixes the offload's.
fn fix_zero_udp_checksum(packet: &mut [u8]) {
    const UDP: u8 = 17;
    if packet.len() >= 48 && packet[0] >> 4 == 6 && packet[6] == UDP && packet[46..48] == [0, 0] {
        packet[46] = 0xff;
        packet[47] = 0xff;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::netlink::{AddrFlags, Netlink};
    use crate::netns::{unique_name, Netns};
    use crate::udp::{RecvBuf, RecvScratch, SendMsg, SendScratch, UdpSocket6};
    use std::net::{Ipv6Addr, SocketAddrV6};
    use std::time::{Duration, Instant};

    #[test]
    fn a_packet_buf_reuses_its_storage_and_keeps_the_buffer_contract() {
        let mut b = PacketBuf::with_capacity(64);
        assert!(b.is_empty());
        b.prepare(8);
        assert_eq!(b.as_ref(), [0; 8], "first use: zeroed");
        b.as_mut().copy_from_slice(&[1, 2, 3, 4, 5, 6, 7, 8]);
        b.truncate(3);
        assert_eq!(b.as_ref(), [1, 2, 3]);
        b.truncate(10);
        assert_eq!(b.len(), 3, "truncate never grows");
        // Prepared again: the old bytes are there to be overwritten, not zeroed.
        b.prepare(6);
        assert_eq!(b.as_ref(), [1, 2, 3, 4, 5, 6]);
        // buf_resize fills what it adds with the value, in kept and in new storage.
        b.truncate(2);
        b.buf_resize(10, 9);
        assert_eq!(b.as_ref(), [1, 2, 9, 9, 9, 9, 9, 9, 9, 9]);
        b.buf_resize(4, 0);
        assert_eq!(b.as_ref(), [1, 2, 9, 9]);
        // Appending overwrites kept storage, then grows it.
        b.buf_extend_from_slice(&[7, 7]);
        assert_eq!(b.as_ref(), [1, 2, 9, 9, 7, 7]);
        b.buf_extend_from_slice(&[5; 8]);
        assert_eq!(b.len(), 14);
        assert_eq!(&b.as_ref()[6..], [5; 8]);
        assert!(b.buf_capacity() >= 64);
    }

    const _: () = {
        const fn send_sync<T: Send + Sync>() {}
        send_sync::<Tun>();
    };

    /// One's-complement sum for the UDP checksum (RFC 8200 section 8.1 pseudo-header).
    fn udp6_checksum(src: Ipv6Addr, dst: Ipv6Addr, udp: &[u8]) -> u16 {
        let mut sum: u32 = 0;
        let mut add = |b: &[u8]| {
            for c in b.chunks(2) {
                sum += u32::from(u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]));
            }
        };
        add(&src.octets());
        add(&dst.octets());
        add(&(udp.len() as u32).to_be_bytes());
        add(&[0, 0, 0, 17]);
        add(udp);
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        match !(sum as u16) {
            0 => 0xffff,
            c => c,
        }
    }

    /// An IPv6/UDP packet with correct checksum.
    fn udp6_packet(src: SocketAddrV6, dst: SocketAddrV6, payload: &[u8]) -> Vec<u8> {
        let udp_len = 8 + payload.len();
        let mut p = vec![0u8; 40 + udp_len];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
        p[6] = 17;
        p[7] = 64;
        p[8..24].copy_from_slice(&src.ip().octets());
        p[24..40].copy_from_slice(&dst.ip().octets());
        p[40..42].copy_from_slice(&src.port().to_be_bytes());
        p[42..44].copy_from_slice(&dst.port().to_be_bytes());
        p[44..46].copy_from_slice(&(udp_len as u16).to_be_bytes());
        p[48..].copy_from_slice(payload);
        let c = udp6_checksum(*src.ip(), *dst.ip(), &p[40..]);
        p[46..48].copy_from_slice(&c.to_be_bytes());
        p
    }

    /// A full transmit queue drops what the kernel routes into the device, and the drops are
    /// readable as the device's `tx_dropped` (what the daemon reports as TUN queue drops).
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn a_full_transmit_queue_is_counted_as_tx_dropped() {
        let ns = Netns::create(&unique_name("tuq")).expect("netns");
        ns.run(|| {
            let tun = Tun::create(&unique_name("mt6dq"), 1400, 1)
                .expect("create tun")
                .remove(0);
            tun.dev.set_tx_queue_len(8).expect("shrink the queue");
            let mut nl = Netlink::open().expect("netlink");
            let local: Ipv6Addr = "fd00:6e::1".parse().expect("literal");
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: true,
            };
            nl.add_address(tun.index(), local, 64, flags)
                .expect("address");
            nl.add_route("fd00:6e::".parse().expect("literal"), 64, tun.index())
                .expect("route");
            crate::netlink::tests::wait_local(&mut nl, local, true);
            assert_eq!(nl.link_drops(tun.index()).expect("stats").tx_dropped, 0);
            let sock = UdpSocket6::bind(0).expect("bind");
            let mut ss = SendScratch::new(1);
            let msg = SendMsg {
                src: local,
                dst: SocketAddrV6::new("fd00:6e::2".parse().expect("literal"), 9, 0, 0),
                payload: &[0; 100],
                segment_size: None,
            };
            // Nobody reads the device: up to 8 packets wait in its queue (the kernel's own, e.g.
            // a multicast listener report, may take a place), the rest are dropped.
            for _ in 0..40 {
                assert_eq!(sock.send_batch(&mut ss, &[msg]).expect("send"), 1);
            }
            let drops = nl.link_drops(tun.index()).expect("stats");
            assert!((32..=40).contains(&drops.tx_dropped), "{drops:?}");
            assert_eq!(drops.rx_dropped, 0);
        })
        .expect("run");
    }

    /// A multi-queue device spreads flows over its queues and never splits one flow: the
    /// property the daemon's workers rely on to keep a flow's packets in order.
    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn a_multi_queue_device_keeps_each_flow_on_one_queue_and_uses_several() {
        let ns = Netns::create(&unique_name("tum")).expect("netns");
        ns.run(|| {
            let queues = Tun::create(&unique_name("mt6dm"), 1400, 4).expect("create tun");
            assert_eq!(queues.len(), 4);
            assert!(queues.iter().all(|q| q.index() == queues[0].index()));
            for q in &queues {
                q.set_nonblocking(true).expect("non-blocking");
            }
            let mut nl = Netlink::open().expect("netlink");
            let local: Ipv6Addr = "fd00:6f::1".parse().expect("literal");
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: true,
            };
            nl.add_address(queues[0].index(), local, 64, flags)
                .expect("address");
            nl.add_route("fd00:6f::".parse().expect("literal"), 64, queues[0].index())
                .expect("route");
            crate::netlink::tests::wait_local(&mut nl, local, true);
            // 16 flows (source ports), 4 packets each, interleaved.
            let socks: Vec<UdpSocket6> = (0..16)
                .map(|_| UdpSocket6::bind(0).expect("bind"))
                .collect();
            let mut ss = SendScratch::new(1);
            for _ in 0..4 {
                for s in &socks {
                    let msg = SendMsg {
                        src: local,
                        dst: SocketAddrV6::new("fd00:6f::2".parse().expect("literal"), 9, 0, 0),
                        payload: &[7; 64],
                        segment_size: None,
                    };
                    assert_eq!(s.send_batch(&mut ss, &[msg]).expect("send"), 1);
                }
            }
            let mut scratch = TunRecvScratch::new();
            let mut out = vec![vec![0u8; 1400]; IDEAL_BATCH_SIZE];
            let mut sizes = vec![0usize; IDEAL_BATCH_SIZE];
            // source port -> the queues it was read from
            let mut seen: std::collections::BTreeMap<u16, std::collections::BTreeSet<usize>> =
                Default::default();
            let mut per_queue = [0usize; 4];
            for (i, q) in queues.iter().enumerate() {
                loop {
                    match q.recv_batch(&mut scratch, &mut out, &mut sizes, 0) {
                        Ok(n) => {
                            for (b, &len) in out.iter().zip(&sizes).take(n) {
                                let p = &b[..len];
                                // UDP only (the kernel's own MLD reports may be queued too).
                                if p[6] == 17 {
                                    let sport = u16::from_be_bytes([p[40], p[41]]);
                                    seen.entry(sport).or_default().insert(i);
                                    per_queue[i] += 1;
                                }
                            }
                        }
                        Err(e) if e.is_would_block() => break,
                        Err(e) => panic!("{e}"),
                    }
                }
            }
            assert_eq!(seen.len(), 16, "{seen:?}");
            assert!(
                seen.values().all(|q| q.len() == 1),
                "a flow split: {seen:?}"
            );
            assert_eq!(per_queue.iter().sum::<usize>(), 64, "{per_queue:?}");
            assert!(
                per_queue.iter().filter(|&&n| n > 0).count() >= 2,
                "16 flows all on one queue: {per_queue:?}"
            );
        })
        .expect("run");
    }

    #[test]
    #[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
    fn packets_cross_between_tun_and_udp_socket_with_offload() {
        let ns = Netns::create(&unique_name("tun")).expect("netns");
        ns.run(|| {
            let tun = Tun::create(&unique_name("mt6dt"), 1400, 1)
                .expect("create tun")
                .remove(0);
            assert!(tun.udp_gso(), "kernel 6.18 supports USO");
            assert_eq!(tun.tx_queue_len().expect("txqueuelen"), TX_QUEUE_LEN);
            let mut nl = Netlink::open().expect("netlink");
            assert_eq!(nl.link_index(tun.name()).expect("index"), tun.index());
            let local: Ipv6Addr = "fd00:6d::1".parse().expect("literal");
            let remote: Ipv6Addr = "fd00:6d::2".parse().expect("literal");
            nl.add_address(
                tun.index(),
                local,
                64,
                AddrFlags {
                    nodad: true,
                    noprefixroute: true,
                },
            )
            .expect("address");
            nl.add_route(
                local & "ffff:ffff:ffff:ffff::".parse::<Ipv6Addr>().expect("mask"),
                64,
                tun.index(),
            )
            .expect("route");
            crate::netlink::tests::wait_local(&mut nl, local, true);

            let sock = UdpSocket6::bind(0).expect("bind");
            sock.set_read_timeout(Some(Duration::from_secs(5)))
                .expect("timeout");
            let port = sock.local_port();
            let remote_sa = SocketAddrV6::new(remote, 5555, 0, 0);
            let local_sa = SocketAddrV6::new(local, port, 0, 0);

            // TUN -> socket: two same-flow packets, coalesced by GRO into one write.
            let payloads: [&[u8]; 2] = [&[0xa1; 300], &[0xa2; 300]];
            let off = VIRTIO_NET_HDR_LEN + 16;
            let mut bufs: Vec<Vec<u8>> = payloads
                .iter()
                .map(|p| {
                    let mut b = Vec::with_capacity(off + 65535);
                    b.resize(off, 0);
                    b.extend_from_slice(&udp6_packet(remote_sa, local_sa, p));
                    b
                })
                .collect();
            let mut gro = GROTable::default();
            tun.send_batch(&mut gro, &mut bufs, off).expect("tun write");
            let mut got: Vec<Vec<u8>> = Vec::new();
            let mut rbufs = vec![RecvBuf::new(), RecvBuf::new()];
            let mut rs = RecvScratch::new(2);
            let deadline = Instant::now() + Duration::from_secs(5);
            while got.len() < 2 && Instant::now() < deadline {
                let n = sock.recv_batch(&mut rs, &mut rbufs).expect("recv");
                for b in &rbufs[..n] {
                    assert_eq!(b.src(), remote_sa);
                    assert_eq!(b.dst(), local);
                    got.extend(b.datagrams().map(<[u8]>::to_vec));
                }
            }
            assert_eq!(got, payloads.iter().map(|p| p.to_vec()).collect::<Vec<_>>());

            // socket -> TUN: a UDP GSO send of 3 segments arrives as a super-packet that
            // recv_batch splits back into 3 IPv6 packets.
            let data: Vec<u8> = (0..900u32).map(|i| i as u8).collect();
            let mut ss = SendScratch::new(4);
            let msg = SendMsg {
                src: local,
                dst: remote_sa,
                payload: &data,
                segment_size: Some(300),
            };
            assert_eq!(sock.send_batch(&mut ss, &[msg]).expect("send"), 1);
            let mut scratch = TunRecvScratch::new();
            let roff = 8;
            let mut out = vec![vec![0u8; roff + 1400]; IDEAL_BATCH_SIZE];
            let mut sizes = vec![0usize; IDEAL_BATCH_SIZE];
            let mut segs: Vec<Vec<u8>> = Vec::new();
            while segs.len() < 3 {
                assert!(
                    crate::wait_readable(tun.as_raw_fd(), Some(Duration::from_secs(5)))
                        .expect("poll")
                );
                let n = tun
                    .recv_batch(&mut scratch, &mut out, &mut sizes, roff)
                    .expect("tun read");
                for (b, &len) in out.iter().zip(&sizes).take(n) {
                    let p = &b[roff..roff + len];
                    // Skip stray router/neighbour solicitations the kernel may send.
                    if p[6] == 17 && p[24..40] == remote.octets() {
                        assert_eq!(&p[8..24], &local.octets());
                        segs.push(p[48..].to_vec());
                    }
                }
            }
            assert_eq!(
                segs,
                data.chunks(300).map(<[u8]>::to_vec).collect::<Vec<_>>()
            );
        })
        .expect("run in netns");
    }

    #[test]
    fn a_udp_checksum_of_zero_leaves_as_all_ones_and_nothing_else_changes() {
        let src: SocketAddrV6 = "[2001:db8:a::1]:5000".parse().expect("literal");
        let dst: SocketAddrV6 = "[2001:db8:b::2]:6000".parse().expect("literal");
        // Find a payload whose correct checksum is 0xFFFF (sum 0): sent as 0xFFFF, and a
        // completion that wrote 0 instead must become 0xFFFF.
        let payload = (0u32..200_000)
            .map(|i| i.to_be_bytes())
            .find(|p| udp6_packet(src, dst, p)[46..48] == [0xff, 0xff])
            .expect("a payload with checksum 0xffff");
        let good = udp6_packet(src, dst, &payload);
        assert_eq!(good[46..48], [0xff, 0xff]);
        let mut zeroed = good.clone();
        zeroed[46..48].fill(0);
        fix_zero_udp_checksum(&mut zeroed);
        assert_eq!(zeroed, good);
        // Any other checksum, and non-UDP or short packets, are left alone.
        let other = udp6_packet(src, dst, b"x");
        let mut same = other.clone();
        fix_zero_udp_checksum(&mut same);
        assert_eq!(same, other);
        let mut tcp = good.clone();
        tcp[6] = 6;
        tcp[46..48].fill(0);
        let before = tcp.clone();
        fix_zero_udp_checksum(&mut tcp);
        assert_eq!(tcp, before);
        let mut short = [0u8; 47];
        fix_zero_udp_checksum(&mut short);
        assert_eq!(short, [0u8; 47]);
    }
}
