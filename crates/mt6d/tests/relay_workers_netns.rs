//! The relay data plane on two workers per node (the gateway's worker plane, in every
//! node): on the chain h1 - eA == r1 == r2 == eB - h2, every node with `workers = 2`,
//! sixteen sequence-numbered UDP flows from h1 to h2 across one-second rotations and 5 s rekeys
//! of every link arrive complete, each in order and without duplicates; both of eA's workers
//! seal a share of them (its TUN device spreads the flows over its queues); both workers of
//! every relay receive a share of the datagrams (each link's epoch is a new (address, port)
//! pair, hashed afresh to one of the node's transparent sockets); no relay counts a drop.
//!
//! Run: `cargo test --release -p mt6d --test relay_workers_netns -- --include-ignored
//! --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddrV6, UdpSocket};
use std::time::Duration;

use mt6d::status::relay::RelayStatus;
use mt6d_lab::relays::{self, RelayLab, Shape};

/// Flows (source ports): with 16, the chance that the flow hash puts all on one of two TUN
/// queues is 2^-15.
const FLOWS: usize = 16;
/// Datagrams per flow, one every 4 ms: about 6 s, six rotations of every link.
const PER_FLOW: u32 = 1_500;
const PORT: u16 = 5090;

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn two_workers_per_node_share_the_flows_and_none_is_lost_or_reordered_across_rotations() {
    common::require_root();
    let mut settings = common::relay_settings(1.0);
    settings.workers = Some(2);
    let lab = RelayLab::up(Shape::Chain, "m6rw", settings).expect("relay lab comes up");
    let (h1, h2) = (0, lab.hosts.len() - 1);
    lab.wait_for_path(h1, h2, Duration::from_secs(10))
        .expect("first path");
    let dst_addr = relays::host_address(lab.hosts[h2].k);
    let src_addr = relays::host_address(lab.hosts[h1].k);
    let rx = lab.hosts[h2]
        .ns
        .run(|| UdpSocket::bind(SocketAddrV6::new(dst_addr, PORT, 0, 0)))
        .expect("enter h2")
        .expect("bind");
    rx.set_read_timeout(Some(Duration::from_millis(700)))
        .expect("timeout");
    let senders: Vec<UdpSocket> = (0..FLOWS)
        .map(|_| {
            lab.hosts[h1]
                .ns
                .run(|| UdpSocket::bind(SocketAddrV6::new(src_addr, 0, 0, 0)))
                .expect("enter h1")
                .expect("bind")
        })
        .collect();
    let receiver = common::receive_sequenced(rx, FLOWS as u32 * PER_FLOW);
    let names = ["eA", "r1", "r2", "eB"];
    let index = |n: &str| lab.node_index(n).expect("node");
    let before: Vec<RelayStatus> = names
        .iter()
        .map(|n| lab.status(index(n)).expect("status"))
        .collect();
    let dst = SocketAddrV6::new(dst_addr, PORT, 0, 0);
    let sent_secs = common::send_sequenced(&senders, dst, PER_FLOW, Duration::from_millis(4));
    let flows = receiver.join().expect("receiver");
    let after: Vec<RelayStatus> = names
        .iter()
        .map(|n| lab.status(index(n)).expect("status"))
        .collect();
    let share = |i: usize, f: fn(&mt6d::status::relay::WorkerStatus) -> u64| -> Vec<u64> {
        after[i]
            .workers
            .iter()
            .zip(&before[i].workers)
            .map(|(a, b)| f(a).saturating_sub(f(b)))
            .collect()
    };
    let ea_tun = share(0, |w| w.tun_rx_packets);
    let relay_rx: Vec<Vec<u64>> = [1, 2]
        .iter()
        .map(|&i| share(i, |w| w.rx_datagrams))
        .collect();
    eprintln!(
        "{FLOWS} flows x {PER_FLOW} sent in {sent_secs:.1} s; eA TUN packets per worker {ea_tun:?}; r1, r2 datagrams per worker {relay_rx:?}; flows {flows:?}"
    );
    common::assert_sequenced(&flows, FLOWS, PER_FLOW);
    for (i, st) in after.iter().enumerate() {
        assert_eq!(st.workers.len(), 2, "{}: {:?}", names[i], st.workers);
    }
    assert!(
        ea_tun.iter().all(|&n| n > 0),
        "a worker of eA sealed nothing: {ea_tun:?}"
    );
    assert!(ea_tun.iter().sum::<u64>() >= u64::from(PER_FLOW) * FLOWS as u64);
    for (k, rx) in relay_rx.iter().enumerate() {
        assert!(
            rx.iter().all(|&n| n > 0),
            "a worker of r{} received nothing: {rx:?}",
            k + 1
        );
    }
    for (i, name) in names.iter().enumerate() {
        let drops = |st: &RelayStatus| -> BTreeMap<String, u64> {
            st.counters
                .iter()
                .filter(|(k, _)| k.starts_with("drop_") || k.as_str() == "socket_queue_drops")
                .map(|(k, v)| (k.clone(), *v))
                .collect()
        };
        assert_eq!(
            drops(&after[i]),
            drops(&before[i]),
            "{name} dropped datagrams during the flows"
        );
    }
}
