//! The server role's neighbour discovery: on a segment shared with its
//! router, a server whose hashed prefix is local as a whole (an AnyIP route, no address bound
//! on the link) is resolvable for its currently valid addresses and for nothing else.
//!
//! Two namespaces joined by a veth: the router (2001:db8:5::1/64 on-link) and the server (the
//! /64 local through `lo`, the responder on its end of the veth). The router sends a datagram
//! to a valid address and to an invalid one of the prefix: its kernel resolves both, the first
//! with the server's link-layer address, the second not at all. A duplicate address probe for
//! the valid address is defended with an advertisement to all nodes.
//!
//! Run: `cargo test --release -p mt6d --test server_ndp_netns -- --include-ignored --nocapture`.

mod common;

use std::net::Ipv6Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mt6d::server::ndp::{NdpCounters, NdpResponder};
use mt6d_lab::topology;
use mt6d_os::capture::PacketCapture;
use mt6d_os::{unique_name, AddrFlags, Netlink, Netns};
use mt6d_proto::wire::{dad_probe_frame, NeighborClaim, NeighborFrame};

const PREFIX: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, 0);
const ROUTER: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0, 0, 0, 1);
const VALID: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0x1c2d, 0x3e4f, 0x5a6b, 0x7c8d);
const INVALID: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 5, 0, 0x1c2d, 0x3e4f, 0x5a6b, 0x7c8e);
const ROUTER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x05, 0x01];
const SERVER_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x05, 0x02];

/// One veth pair (the lab's own), `a_name` in `a` and `b_name` in `b`, with the MACs given.
fn veth(a: &Netns, a_name: &str, a_mac: [u8; 6], b: &Netns, b_name: &str, b_mac: [u8; 6]) {
    topology::veth(a, a_name, b, b_name).expect("veth pair");
    for (ns, name, mac) in [(a, a_name, a_mac), (b, b_name, b_mac)] {
        topology::in_ns(ns, |nl| {
            let i = nl.link_index(name)?;
            nl.link_set_mac(i, mac)
        })
        .expect("mac");
    }
}

/// The router's neighbour entry for `addr` on r0 once resolved, waiting up to `limit`.
fn resolved(router: &Netns, addr: Ipv6Addr, limit: Duration) -> Option<[u8; 6]> {
    topology::resolved(router, "r0", addr, limit).expect("ask the router")
}

/// Sets the flag when dropped, on every exit path of the scope, a panic's included.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn only_currently_valid_addresses_of_a_local_prefix_are_resolvable() {
    common::require_root();
    let router = Netns::create(&unique_name("ndpr")).expect("router namespace");
    let server = Netns::create(&unique_name("ndps")).expect("server namespace");
    veth(&router, "r0", ROUTER_MAC, &server, "s0", SERVER_MAC);
    router
        .run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let r0 = nl.link_index("r0").expect("r0");
            let flags = AddrFlags {
                nodad: true,
                noprefixroute: false,
            };
            nl.add_address(r0, ROUTER, 64, flags)
                .expect("router address");
        })
        .expect("enter router");
    server
        .run(|| {
            let mut nl = Netlink::open().expect("netlink");
            let lo = nl.link_index("lo").expect("lo");
            nl.link_set_up(lo).expect("lo up");
            nl.add_local_prefix(PREFIX, 64, lo).expect("AnyIP route");
        })
        .expect("enter server");

    let stop = AtomicBool::new(false);
    let counters = std::thread::scope(|s| {
        // A failed assertion below must still end the responder's loop, or the scope would
        // wait for it forever instead of reporting the failure.
        let _stop_on_exit = StopOnDrop(&stop);
        let serving = s.spawn(|| {
            server
                .run(|| {
                    let mut ndp = NdpResponder::open("s0", SERVER_MAC).expect("responder");
                    while !stop.load(Ordering::Relaxed) {
                        if ndp.serve_ready(|a| a == VALID, 64).expect("serve") == 0 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    ndp.counters()
                })
                .expect("enter server")
        });
        // Let the responder open its socket before the first solicitation.
        std::thread::sleep(Duration::from_millis(200));

        assert_eq!(
            resolved(&router, VALID, Duration::from_secs(3)),
            Some(SERVER_MAC),
            "a valid address resolves to the server"
        );
        assert_eq!(
            resolved(&router, INVALID, Duration::from_secs(4)),
            None,
            "an address of the prefix that is not valid must not resolve (the kernel does not \
             answer for an AnyIP prefix, and the responder must not)"
        );

        // A duplicate address probe for the valid address: defended to all nodes.
        let defence = router
            .run(|| {
                let cap = PacketCapture::open_neighbor_discovery("r0").expect("capture");
                cap.send(&dad_probe_frame(VALID, ROUTER_MAC))
                    .expect("probe");
                let mut buf = [0u8; 512];
                let deadline = Instant::now() + Duration::from_secs(2);
                while Instant::now() < deadline {
                    if let Some(f) = cap.recv_nowait(&mut buf).expect("receive") {
                        if let Ok(na) = NeighborFrame::parse(&buf[..f.captured]) {
                            if na.claim == NeighborClaim::Advertisement && na.target == VALID {
                                return Some(na);
                            }
                        }
                    } else {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                None
            })
            .expect("enter router")
            .expect("the probe for a valid address is answered");
        assert_eq!(defence.dst, "ff02::1".parse::<Ipv6Addr>().expect("literal"));
        assert!(!defence.solicited);
        assert_eq!(defence.lladdr, Some(SERVER_MAC));

        stop.store(true, Ordering::Relaxed);
        serving.join().expect("responder thread")
    });
    println!("responder: {counters:?}");
    let NdpCounters {
        answered,
        defended,
        not_current,
        malformed,
        send_errors,
        ..
    } = counters;
    assert!(answered >= 1, "{counters:?}");
    assert_eq!(defended, 1, "{counters:?}");
    // The kernel's three multicast solicitations for the invalid address at least.
    assert!(not_current >= 3, "{counters:?}");
    assert_eq!((malformed, send_errors), (0, 0), "{counters:?}");
}
