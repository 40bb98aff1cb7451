//! mt6d-os: everything mt6d asks of the Linux kernel.
//!
//! This crate owns the OS side of a Moving Target IPv6 Defense gateway:
//! - [`netlink`]: links, IPv6 addresses, routes, (proxy) neighbour entries, veth pairs, over a
//!   blocking rtnetlink socket, with idempotent adds and deletes;
//! - [`linkwatch`]: link events (`RTMGRP_LINK`): interfaces deleted, renamed, down, created;
//! - [`sysctl`]: `/proc/sys/net/ipv6/conf/IFACE/KEY` (forwarding, proxy_ndp, accept_dad, ...);
//! - [`nftables`]: loading and deleting one named nftables table through the `nft` program;
//! - [`netns`]: iproute2-compatible named network namespaces for the lab and the tests;
//! - [`tun`]: the TUN device with virtio-net offload (GSO split on read, GRO on write);
//! - [`udp`]: the tunnel's UDP sockets with per-packet source address (IPV6_PKTINFO),
//!   UDP GSO/GRO and `sendmmsg`/`recvmmsg` batches, plus [`Epoll`] and the ICMPv6 raw socket;
//! - [`raw_udp`]: UDP datagrams from any address and port of a local prefix through one raw
//!   socket (the server role's send path);
//! - [`capture`]: an AF_PACKET observer of one interface, for the lab's leak checks, and the
//!   daemon's filtered watch of neighbour discovery frames (duplicate address detection);
//! - [`error`]: [`OsError`], one variant per failing operation with its context;
//! - [`secrets`]: a non-dumpable process and key pages left out of core dumps.
//!
//! What it must not do: protocol logic. Which hashed addresses exist, which packets go where and
//! what they contain is decided by mt6d-proto and passed in by the daemon; this crate only
//! carries those decisions out and reports what the kernel said. It is synchronous (no async
//! runtime), Linux only, and the only crate of the workspace with `unsafe`, which is confined to
//! `sys`, `netns`, `udp` (mmsg, epoll, eventfd), `raw_udp`, `capture` and `secrets`, each block with a `SAFETY` note.

#![cfg(target_os = "linux")]

pub mod capture;
pub mod error;
pub mod icmp;
pub mod linkwatch;
pub mod netlink;
pub mod netns;
pub mod nftables;
pub mod raw_udp;
pub mod secrets;
pub mod service;
mod sys;
pub mod sysctl;
pub mod tun;
pub mod udp;

pub use error::{OsError, Result};
pub use icmp::{Icmp6Socket, IcmpRecvInfo};
pub use netlink::{AddrFlags, AddrInfo, LinkDrops, NeighInfo, Netlink};
pub use netns::{current_cookie, unique_name, Netns};
pub use raw_udp::{RawSendMsg, RawSendScratch, RawUdp6};
pub use sys::{
    effective_uid, peer_credentials, set_thread_affinity, set_thread_nice, thread_affinity,
    thread_nice, wait_readable, CpuSet, PeerCredentials,
};
pub use tun::{
    ExpandBuffer, GROTable, PacketBuf, Tun, TunRecvScratch, IDEAL_BATCH_SIZE, VIRTIO_NET_HDR_LEN,
};
pub use udp::{
    grow_socket_buffers, Epoll, EpollEvents, RecvBuf, RecvScratch, SendMsg, SendScratch,
    UdpSocket6, Waker, RECV_BUF_LEN,
};
