//! The worker data plane (issue 19 item 2): with two workers on each gateway, many UDP flows
//! from Host A to Host B across rotations (1 s) and rekeys (every 2 s) arrive complete and each
//! in order, every worker of Gateway A seals a share of them, and the status says which
//! worker did what.
//!
//! Steering (docs/ARCHITECTURE.md "Workers"): Gateway A's TUN device spreads the flows over its
//! queues by flow hash, one flow on one queue; Gateway B receives the peer's datagrams on the
//! one worker that owns all of that peer's sockets, so an epoch switch cannot reorder a flow.
//!
//! Run: `cargo test --release -p mt6d --test workers_netns -- --include-ignored --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddrV6, UdpSocket};
use std::time::{Duration, Instant};

use mt6d::lab::topology::{Lab, Side, Topology, HOST_A, HOST_B};

/// Flows (source ports): with 16, the chance that a flow hash puts all on one of two queues is
/// 2^-15.
const FLOWS: usize = 16;
/// Datagrams per flow.
const PER_FLOW: u32 = 1_500;
const PORT: u16 = 5080;

/// Per flow (source port): datagrams received, and how many arrived after a later one.
#[derive(Debug, Default, Clone, Copy)]
struct FlowSeen {
    received: u32,
    out_of_order: u32,
    duplicates: u32,
    last: Option<u32>,
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn flows_spread_over_two_workers_and_none_is_lost_or_reordered_across_rotations_and_rekeys() {
    common::require_root();
    let lab = Lab::build_topology(Topology::Switched, "m6w").expect("lab builds");
    let running = common::start_gateways_with(lab, "encrypt", 1.0, (true, Some(2.0)), |text| {
        text.replacen("[gateway]\n", "[gateway]\nworkers = 2\n", 1)
    });
    let rx = running
        .lab
        .host_b
        .run(|| UdpSocket::bind(SocketAddrV6::new(HOST_B, PORT, 0, 0)))
        .expect("enter B")
        .expect("bind");
    rx.set_read_timeout(Some(Duration::from_millis(700)))
        .expect("timeout");
    let senders: Vec<UdpSocket> = (0..FLOWS)
        .map(|_| {
            running
                .lab
                .host_a
                .run(|| UdpSocket::bind(SocketAddrV6::new(HOST_A, 0, 0, 0)))
                .expect("enter A")
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
    let drops_before = [
        drops(&common::status(&running, Side::A)),
        drops(&common::status(&running, Side::B)),
    ];
    // 4,000 datagrams a second for about 6 s: 6 rotations and 3 rekeys on the way.
    let started = Instant::now();
    let dst = SocketAddrV6::new(HOST_B, PORT, 0, 0);
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
    let a = common::status(&running, Side::A);
    let b = common::status(&running, Side::B);
    eprintln!(
        "{FLOWS} flows x {PER_FLOW} sent in {sent_secs:.1} s; A workers {:?}; B workers {:?}; flows {flows:?}",
        a.workers, b.workers
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
    assert_eq!(a.workers.len(), 2, "{:?}", a.workers);
    assert!(
        a.workers.iter().all(|w| w.sealed > 0),
        "a worker of Gateway A sealed nothing: {:?}",
        a.workers
    );
    let sealed: u64 = a.workers.iter().map(|w| w.sealed).sum();
    assert!(
        sealed >= u64::from(PER_FLOW) * FLOWS as u64,
        "{sealed} sealed: {:?}",
        a.workers
    );
    // One peer: every datagram of it is opened by the one worker that owns its sockets.
    let opened: Vec<u64> = b.workers.iter().map(|w| w.opened).collect();
    assert_eq!(
        opened.iter().filter(|&&n| n > 0).count(),
        1,
        "the peer's datagrams were opened by more than one worker: {opened:?}"
    );
    assert!(opened.iter().sum::<u64>() >= u64::from(PER_FLOW) * FLOWS as u64);
    assert_eq!(
        [drops(&a), drops(&b)],
        drops_before,
        "the daemons dropped packets during the flows"
    );
}

/// Every drop counter of every peer of one daemon, by peer and reason.
fn drops(st: &mt6d::status::Status) -> BTreeMap<String, u64> {
    st.peers
        .iter()
        .flat_map(|p| {
            p.counters
                .drops
                .iter()
                .map(move |(reason, n)| (format!("{} {reason}", p.name), *n))
        })
        .collect()
}
