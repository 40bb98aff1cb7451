//! ICMPv6 errors from the public path, delivered to the protected host as the errors it would
//! see without the tunnel, and the tunnel MTU that follows the path MTU (000 §2.6.2-2.6.3,
//! §3.2.3; docs/PROTOCOL.md §5).
//!
//! The `mt6d-icmp` thread owns a raw ICMPv6 socket that passes only Destination Unreachable,
//! Packet Too Big, Time Exceeded and Parameter Problem. For each one it:
//! 1. rebuilds the IPv6 header the socket strips (source, and destination from IPV6_PKTINFO);
//! 2. finds the stream and accepted route from the quoted outer (address, port) pair in the
//!    published [`RouteTable`] (errors about the previous epoch's
//!    packets are still in the accept window);
//! 3. translates it with [`mt6d_proto::icmp::translate_path_error_sealed`] (true addresses, the inner
//!    packet quoted, MTU minus the overhead) and sends it to the local protected host from the
//!    gateway's own address on the internal link, never from a hashed one (in host mode the
//!    "internal link" is the TUN device and the source the host's own true address: the error
//!    is looped back to the host's stack);
//! 4. for Packet Too Big, lowers that peer's path MTU ([`PathMtu`]: only a lower value
//!    counts, and it ages out after 10 minutes, RFC 8201 §4) and applies it as a locked MTU
//!    metric on the /128 route of the peer's remote true address into the TUN device: the
//!    gateway's kernel then answers every larger inner packet *to that host* with a Packet Too
//!    Big of its own (full quote, from the gateway) before it reaches the tunnel, while the TUN
//!    device keeps the link MTU and other peers' paths are not affected. The external
//!    interface's own MTU is re-read every second, so a link MTU change is followed too.
//!
//! Before any of that, the error must quote a packet a sealing worker recorded in the peer's
//! [`SentLog`](mt6d_proto::icmp::SentLog) and no error has been accepted for (docs/PROTOCOL.md
//! §5, "Which errors are believed"), and a Packet Too Big must report an MTU of at least 1280
//! and below the quoted packet's length.
//!
//! Malformed or foreign errors are counted by reason and dropped; nothing here panics on what
//! the network sent. This thread is not on the data path: errors are rare, so it may format a log
//! line when the MTU changes (bounded: the MTU only steps down between 1280 and the base).

use std::net::Ipv6Addr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mt6d_os::{sysctl, Icmp6Socket, Netlink};
use mt6d_proto::icmp::{quoted_route, translate_path_error_sealed, IcmpError, PathMtu, MIN_MTU};
use mt6d_proto::wire::{Ipv6Repr, IPV6_HEADER_LEN, NEXT_HEADER_ICMPV6};

use super::error::GatewayError;
use super::path::{PathState, ICMP_TYPES};
use super::peer::Peer;
use super::routing::{carry_over, RouteTable, RxRoute};
use super::shared::Shared;

/// How often the thread wakes without traffic (shutdown flag, expiry, external MTU).
const TICK: Duration = Duration::from_millis(100);
const EXTERNAL_MTU_POLL: Duration = Duration::from_secs(1);

/// The ICMPv6 thread's own resources.
#[derive(Debug)]
pub struct IcmpTranslator {
    socket: Icmp6Socket,
    netlink: Netlink,
    tun_index: u32,
    internal_index: u32,
    external_interface: String,
    /// Source of the errors we deliver: the gateway's own address on the internal link.
    source: Ipv6Addr,
    max_overhead: u32,
    /// Per peer, in the order of the table `generation` names: what Packet Too Big taught about
    /// its path.
    pmtu: Vec<(Arc<Peer>, PathMtu)>,
    /// The peer set `pmtu` is indexed for.
    generation: Option<u64>,
    /// Per remote true address: the MTU now on its /128 route (`None`: no metric, the TUN's).
    applied: Vec<(Ipv6Addr, Option<u32>)>,
    last_poll: Instant,
}

fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> GatewayError {
    let what = what.into();
    move |source| GatewayError::Os { what, source }
}

impl IcmpTranslator {
    /// Opens the socket and picks the source address of translated errors: a global address of
    /// the internal interface if it has one, else its link-local one. Never a hashed address
    /// (they live on the external interface) and never a true address of a protected host
    /// (the gateway does not own those).
    pub fn open(
        tun_index: u32,
        internal_index: u32,
        external_interface: &str,
        max_overhead: usize,
    ) -> Result<IcmpTranslator, GatewayError> {
        let mut netlink = Netlink::open().map_err(os("open rtnetlink for the ICMPv6 thread"))?;
        // It replaces the daemon's own routes (a peer's path MTU): they keep the daemon's marker,
        // so the clean-up that deletes by marker still finds them.
        netlink.set_marker(super::state::MARKER);
        let addrs = netlink
            .list_addresses(internal_index)
            .map_err(os("list internal addresses"))?;
        let usable = || addrs.iter().filter(|a| !a.tentative && !a.dadfailed);
        let link_local = |a: &Ipv6Addr| a.segments()[0] & 0xffc0 == 0xfe80;
        let source = usable()
            .map(|a| a.addr)
            .find(|a| !link_local(a))
            .or_else(|| usable().map(|a| a.addr).find(link_local))
            .ok_or_else(|| {
                GatewayError::Setup(
                    "the internal interface has no IPv6 address to send ICMPv6 errors from".into(),
                )
            })?;
        let socket = Icmp6Socket::open().map_err(os("open ICMPv6 socket"))?;
        let types: Vec<u8> = ICMP_TYPES.iter().map(|(t, _)| *t).collect();
        socket
            .set_filter_pass_only(&types)
            .map_err(os("ICMPv6 filter"))?;
        socket
            .set_read_timeout(Some(TICK))
            .map_err(os("ICMPv6 socket timeout"))?;
        Ok(IcmpTranslator {
            socket,
            netlink,
            tun_index,
            internal_index,
            external_interface: external_interface.to_string(),
            source,
            max_overhead: u32::try_from(max_overhead).unwrap_or(u32::MAX),
            pmtu: Vec::new(),
            generation: None,
            applied: Vec::new(),
            last_poll: Instant::now(),
        })
    }

    /// Runs until `shared.shutdown`.
    pub fn run(mut self, shared: &Shared, path: &PathState) {
        log::info!(
            "ICMPv6 errors from the path are translated and sent from {}",
            self.source
        );
        // IPv6 header rebuilt in front, then the message as received. 1280 is the most an error
        // should be (RFC 4443 §2.4(c)); anything longer is cut and then fails its checksum.
        let mut packet = [0u8; IPV6_HEADER_LEN + 2048];
        let mut out = [0u8; MIN_MTU];
        while !shared.shutdown.load(Relaxed) {
            // A timeout (EAGAIN) or EINTR ends the wait: time for housekeeping.
            if let Ok(info) = self.socket.recv_from(&mut packet[IPV6_HEADER_LEN..]) {
                let len = info.len.min(packet.len() - IPV6_HEADER_LEN);
                // In host mode our translated errors go to this host's own stack, and this raw
                // socket sees them too: they are ours, not errors from the path.
                if info.src == self.source {
                    self.follow(shared, path);
                    continue;
                }
                match info.dst {
                    Some(dst) => {
                        let header = Ipv6Repr {
                            traffic_class: 0,
                            flow_label: 0,
                            payload_len: u16::try_from(len).unwrap_or(u16::MAX),
                            next_header: NEXT_HEADER_ICMPV6,
                            hop_limit: 255,
                            src_addr: info.src,
                            dst_addr: dst,
                        };
                        // 40 bytes are always there.
                        let _ = header.emit(&mut packet[..IPV6_HEADER_LEN]);
                        self.handle(shared, path, &packet[..IPV6_HEADER_LEN + len], &mut out);
                    }
                    None => path.drop("icmp_no_destination"),
                }
            }
            self.follow(shared, path);
        }
    }

    fn handle(&mut self, shared: &Shared, path: &PathState, packet: &[u8], out: &mut [u8]) {
        let drop = |e: IcmpError| path.drop(e.reason());
        let (local, remote) = match quoted_route(packet) {
            Ok(r) => r,
            Err(e) => return drop(e),
        };
        let table = shared.table.load();
        let Some(&RxRoute { peer, set, route }) = table.rx.get(&(*local.ip(), local.port())) else {
            return drop(IcmpError::NotOurRoute);
        };
        if route.remote != remote {
            return drop(IcmpError::NotOurRoute);
        }
        // The set's stream: same true addresses and mode, and the header key the quote was
        // masked with.
        let stream = &table.peers[peer].sets[set].set.stream;
        // The quote is one of our own packets: opened with the key that sealed it (the current
        // send key; a packet sealed just before a rekey fails and is dropped as bad_tag).
        let sealer = table.peer(peer).keys.send.load();
        let tr = match translate_path_error_sealed(
            stream,
            sealer.as_deref(),
            &route,
            &table.peer(peer).sent,
            packet,
            self.source,
            out,
        ) {
            Ok(tr) => tr,
            Err(e) => return drop(e),
        };
        let msg = &mut out[IPV6_HEADER_LEN..tr.len];
        // The kernel computes the checksum of raw ICMPv6 sockets (RFC 3542 §3.1).
        msg[2..4].copy_from_slice(&[0, 0]);
        let msg_type = msg[0];
        match self.socket.send_via(
            msg,
            stream.local_true(),
            Some(self.source),
            self.internal_index,
        ) {
            Ok(_) => path.translated(msg_type),
            Err(_) => path.drop("icmp_send_failed"),
        }
        if let Some(mtu) = tr.path_mtu {
            let overhead = u32::try_from(stream.overhead()).unwrap_or(u32::MAX);
            let inner = mtu.saturating_sub(overhead).max(MIN_MTU as u32);
            self.follow_peers(&table);
            if self.pmtu[peer]
                .1
                .on_packet_too_big(crate::daemon::clock::now(), inner)
            {
                self.apply(shared, path);
            }
        }
    }

    /// Housekeeping between messages: age out learned path MTUs, follow the external MTU.
    fn follow(&mut self, shared: &Shared, path: &PathState) {
        if self.last_poll.elapsed() < EXTERNAL_MTU_POLL {
            return;
        }
        self.last_poll = Instant::now();
        self.apply(shared, path);
    }

    /// Sets the TUN MTU to the link MTU, the smallest of: the start value, the external MTU
    /// minus the overhead now, and the MTU the external link's router advertises minus the
    /// overhead; then each peer's route to its remote true address to the path MTU learned from
    /// Packet Too Big where that is lower (the smallest of the peers that share the address).
    fn apply(&mut self, shared: &Shared, path: &PathState) {
        let inner = |m: u32| m.saturating_sub(self.max_overhead).max(MIN_MTU as u32);
        let external = sysctl::get_ipv6_conf(&self.external_interface, "mtu")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map(inner);
        let upstream = Some(path.upstream_mtu.load(Relaxed))
            .filter(|m| *m != 0)
            .map(inner);
        let link = [Some(path.base_mtu), external, upstream]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(path.base_mtu);
        path.link_mtu.store(link, Relaxed);
        let current = path.tunnel_mtu.load(Relaxed);
        if link != current {
            match self.netlink.link_set_mtu(self.tun_index, link) {
                Ok(()) => {
                    path.tunnel_mtu.store(link, Relaxed);
                    log::info!(
                        "tunnel MTU {current} -> {link} (external link MTU minus the overhead)"
                    );
                }
                Err(e) => log::warn!("set tunnel MTU {link}: {e}"),
            }
        }
        self.apply_peer_routes(shared, path, link);
    }

    /// Re-indexes the learned path MTUs for `table`'s peer set after a reload; a removed
    /// peer's route is gone, and with it what was applied to it.
    fn follow_peers(&mut self, table: &RouteTable) {
        if self.generation == Some(table.generation) {
            return;
        }
        self.generation = Some(table.generation);
        self.pmtu = carry_over(std::mem::take(&mut self.pmtu), table, |_| {
            PathMtu::default()
        });
        self.applied.retain(|(a, _)| {
            table
                .peers
                .iter()
                .any(|r| r.peer.stream.remote_true() == *a)
        });
    }

    fn apply_peer_routes(&mut self, shared: &Shared, path: &PathState, link: u32) {
        let now = crate::daemon::clock::now();
        let table = shared.table.load();
        self.follow_peers(&table);
        // A peer a reload removed is no longer shown.
        path.peer_mtu
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .retain(|name, _| table.peers.iter().any(|r| r.peer.name == *name));
        let learned: Vec<Option<u32>> = self.pmtu.iter_mut().map(|(_, p)| p.get(now)).collect();
        for (i, routes) in table.peers.iter().enumerate() {
            let peer = &routes.peer;
            let remote = peer.stream.remote_true();
            // Peers that share the remote host share its route: the narrowest path wins.
            let want = table
                .peers
                .iter()
                .map(|r| &r.peer)
                .zip(&learned)
                .filter(|(p, _)| p.stream.remote_true() == remote)
                .filter_map(|(_, m)| *m)
                .min()
                .filter(|m| *m < link);
            let slot = match self.applied.iter().position(|(a, _)| *a == remote) {
                Some(j) => j,
                None => {
                    self.applied.push((remote, None));
                    self.applied.len() - 1
                }
            };
            if self.applied[slot].1 != want {
                match self
                    .netlink
                    .set_route_mtu(remote, 128, self.tun_index, want)
                {
                    Ok(()) => {
                        log::info!(
                            "path MTU to {remote} (peer {}): {}",
                            peer.name,
                            want.map_or(format!("{link}, the tunnel MTU"), |m| format!(
                                "{m} (Packet Too Big)"
                            ))
                        );
                        self.applied[slot].1 = want;
                    }
                    Err(e) => log::warn!("peer {}: {e}", peer.name),
                }
            }
            let mtu = learned[i].map_or(link, |m| m.min(link));
            let mut shown = path
                .peer_mtu
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if shown.get(&peer.name) != Some(&mtu) {
                shown.insert(peer.name.clone(), mtu);
            }
        }
    }
}
