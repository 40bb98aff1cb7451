//! The relay data plane on two workers per node (tracker issue 13 item 4, the worker plane of
//! issue 19): on the chain h1 - eA == r1 == r2 == eB - h2, every node with `workers = 2`,
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
use std::time::{Duration, Instant};

use mt6d::lab::relays::{self, RelayLab, Shape};
use mt6d::relay::status::RelayStatus;

/// Flows (source ports): with 16, the chance that the flow hash puts all on one of two TUN
/// queues is 2^-15.
const FLOWS: usize = 16;
/// Datagrams per flow, one every 4 ms: about 6 s, six rotations of every link.
const PER_FLOW: u32 = 1_500;
const PORT: u16 = 5090;

/// Per flow (source port): datagrams received, how many arrived after a later one, repeats.
#[derive(Debug, Default, Clone, Copy)]
struct FlowSeen {
    received: u32,
    out_of_order: u32,
    duplicates: u32,
    last: Option<u32>,
}

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
    let receiver = std::thread::spawn(move || {
        let mut flows: BTreeMap<u16, FlowSeen> = BTreeMap::new();
        let mut buf = [0u8; 2048];
        let total = FLOWS as u32 * PER_FLOW;
        let mut got = 0;
        // Ends when all arrived or nothing came for 700 ms.
        while got < total {
            let Ok((n, from)) = rx.recv_from(&mut buf) else {
                break;
            };
            let Some(seq) = buf[..n].get(..4) else {
                continue;
            };
            let seq = u32::from_be_bytes([seq[0], seq[1], seq[2], seq[3]]);
            let f = flows.entry(from.port()).or_default();
            match f.last {
                Some(last) if seq == last => f.duplicates += 1,
                Some(last) if seq < last => f.out_of_order += 1,
                _ => f.last = Some(seq),
            }
            f.received += 1;
            got += 1;
        }
        flows
    });
    let names = ["eA", "r1", "r2", "eB"];
    let index = |n: &str| lab.node_index(n).expect("node");
    let before: Vec<RelayStatus> = names
        .iter()
        .map(|n| lab.status(index(n)).expect("status"))
        .collect();
    let started = Instant::now();
    let dst = SocketAddrV6::new(dst_addr, PORT, 0, 0);
    let mut msg = [0u8; 300];
    for seq in 0..PER_FLOW {
        let due = started + Duration::from_micros(u64::from(seq) * 4_000);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        msg[..4].copy_from_slice(&seq.to_be_bytes());
        for s in &senders {
            s.send_to(&msg, dst).expect("send");
        }
    }
    let sent_secs = started.elapsed().as_secs_f64();
    let flows = receiver.join().expect("receiver");
    let after: Vec<RelayStatus> = names
        .iter()
        .map(|n| lab.status(index(n)).expect("status"))
        .collect();
    let share = |i: usize, f: fn(&mt6d::relay::status::WorkerStatus) -> u64| -> Vec<u64> {
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
    assert_eq!(flows.len(), FLOWS, "flows heard: {flows:?}");
    for (port, f) in &flows {
        assert_eq!(
            f.received, PER_FLOW,
            "flow from port {port} lost datagrams: {f:?}"
        );
        assert_eq!(f.out_of_order, 0, "flow from port {port} reordered: {f:?}");
        assert_eq!(f.duplicates, 0, "flow from port {port} duplicated: {f:?}");
    }
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
