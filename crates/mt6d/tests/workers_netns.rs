//! The worker data plane: with two workers on each gateway, many UDP flows
//! from Host A to Host B across rotations (1 s) and rekeys (every 2 s) arrive complete and each
//! in order, every worker of Gateway A seals a share of them, and the status says which
//! worker did what.
//!
//! Steering (docs/ARCHITECTURE.md "Workers"): Gateway A's TUN device spreads the flows over its
//! queues by flow hash, one flow on one queue; Gateway B receives the peer's datagrams on the
//! one worker that owns all of that peer's sockets, so an epoch switch cannot reorder a flow.
//!
//! Placement (docs/ARCHITECTURE.md "Workers", placement): a light worker runs on the lowest
//! CPU the daemon may use, a worker that carries bulk on all of them.
//!
//! Run: `cargo test --release -p mt6d --test workers_netns -- --include-ignored --nocapture`.

mod common;

use std::collections::BTreeMap;
use std::net::{SocketAddrV6, UdpSocket};
use std::time::Duration;

use mt6d_lab::topology::{Lab, Side, Topology, HOST_A, HOST_B};
use mt6d_lab::transfer;

/// Flows (source ports): with 16, the chance that a flow hash puts all on one of two queues is
/// 2^-15.
const FLOWS: usize = 16;
/// Datagrams per flow.
const PER_FLOW: u32 = 1_500;
const PORT: u16 = 5080;

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
    let receiver = common::receive_sequenced(rx, FLOWS as u32 * PER_FLOW);
    let drops_before = [
        drops(&common::status(&running, Side::A)),
        drops(&common::status(&running, Side::B)),
    ];
    // 4,000 datagrams a second for about 6 s: 6 rotations and 3 rekeys on the way.
    let dst = SocketAddrV6::new(HOST_B, PORT, 0, 0);
    let sent_secs = common::send_sequenced(&senders, dst, PER_FLOW, Duration::from_millis(4));
    let flows = receiver.join().expect("receiver");
    let a = common::status(&running, Side::A);
    let b = common::status(&running, Side::B);
    eprintln!(
        "{FLOWS} flows x {PER_FLOW} sent in {sent_secs:.1} s; A workers {:?}; B workers {:?}; flows {flows:?}",
        a.workers, b.workers
    );
    common::assert_sequenced(&flows, FLOWS, PER_FLOW);
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

/// Workers per gateway in the placement test: more than the one that owns the peer's sockets
/// plus the one whose TUN queue the kernel's flow hash gives the pings, so that at least one
/// worker carries nothing at all whatever that hash (seeded at boot) does.
const WORKERS: usize = 3;

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn light_workers_share_the_lowest_cpu_and_bulk_frees_them() {
    common::require_root();
    let allowed: Vec<usize> = mt6d_os::thread_affinity()
        .expect("sched_getaffinity")
        .cpus()
        .collect();
    let lab = Lab::build_topology(Topology::Switched, "m6p").expect("lab builds");
    let running = common::start_gateways_with(lab, "encrypt", 1.0, (true, None), |text| {
        text.replacen(
            "[gateway]\n",
            &format!("[gateway]\nworkers = {WORKERS}\n"),
            1,
        )
    });
    let pids: Vec<u32> = running
        .daemons
        .iter()
        .map(|d| d.pid().expect("daemon pid"))
        .collect();
    // With one CPU there is nothing to choose: every worker keeps it.
    let home = if allowed.len() >= 2 {
        vec![allowed[0]]
    } else {
        allowed.clone()
    };

    // Before any traffic: a worker starts light, so it starts at home, whether or not the
    // kernel's flow hash (seeded at boot, so different on every machine) ever gives it a packet.
    for &pid in &pids {
        let workers = wait_for_workers(pid, Duration::from_secs(2), |w| {
            w.len() == WORKERS && w.iter().all(|(_, cpus)| cpus == &home)
        });
        for (name, cpus) in &workers {
            assert_eq!(
                cpus, &home,
                "at start: daemon {pid} {name} may run on {cpus:?}"
            );
        }
    }

    let light = common::ping_train(&running.lab, 20, Duration::from_millis(20));
    assert_eq!(light.received, 20, "{light:?}");
    for &pid in &pids {
        let workers = worker_cpus(pid);
        assert_eq!(workers.len(), WORKERS, "daemon {pid}: {workers:?}");
        for (name, cpus) in &workers {
            assert_eq!(
                cpus, &home,
                "light: daemon {pid} {name} may run on {cpus:?}"
            );
        }
    }

    // Bulk: a TCP transfer of 3 s; sample where the workers may run while it lasts.
    let rx = common::tcp_receiver(&running.lab, 5090);
    let sampler = {
        let pids = pids.clone();
        std::thread::spawn(move || {
            let mut seen: Vec<Vec<(String, Vec<usize>)>> = vec![Vec::new(); pids.len()];
            let until = std::time::Instant::now() + Duration::from_millis(2_500);
            while std::time::Instant::now() < until {
                std::thread::sleep(Duration::from_millis(50));
                for (i, &pid) in pids.iter().enumerate() {
                    seen[i].extend(worker_cpus(pid));
                }
            }
            seen
        })
    };
    let sent = running
        .lab
        .host_a
        .run(|| transfer::send_for(HOST_B, 5090, Duration::from_secs(3), 11))
        .expect("enter A")
        .expect("transfer");
    rx.join().expect("receiver").expect("received");
    assert!(sent.sha256_match, "data corrupted");
    let seen = sampler.join().expect("sampler");
    for (i, samples) in seen.iter().enumerate() {
        assert!(
            samples.iter().any(|(_, cpus)| cpus == &allowed),
            "bulk: no worker of daemon {} was ever free to use {allowed:?}: {samples:?}",
            pids[i]
        );
    }

    // Light again after a pause longer than a window.
    std::thread::sleep(Duration::from_millis(300));
    let light = common::ping_train(&running.lab, 20, Duration::from_millis(20));
    assert_eq!(light.received, 20, "{light:?}");
    for &pid in &pids {
        for (name, cpus) in worker_cpus(pid) {
            assert_eq!(
                cpus, home,
                "light again: daemon {pid} {name} may run on {cpus:?}"
            );
        }
    }
    // `mt6d status` says the same: every worker that carried traffic is light, on that CPU.
    if allowed.len() >= 2 {
        for side in [Side::A, Side::B] {
            let st = common::status(&running, side);
            let mut carried = 0;
            for (i, w) in st.workers.iter().enumerate() {
                if w.sealed + w.opened > 0 {
                    carried += 1;
                    assert_eq!(
                        w.placement,
                        mt6d::status::Placement::Light {
                            cpu: u32::try_from(home[0]).expect("cpu")
                        },
                        "{side:?} worker {i}: {:?}",
                        st.workers
                    );
                }
            }
            assert!(
                carried > 0,
                "{side:?}: no worker carried the pings: {:?}",
                st.workers
            );
        }
    }
}

/// The data-plane workers (threads named `mt6d-w<N>`) of process `pid` and the CPUs each may
/// run on (`Cpus_allowed_list` of /proc).
/// [`worker_cpus`] once `done` holds for it, or as it is after `limit`.
fn wait_for_workers(
    pid: u32,
    limit: Duration,
    done: impl Fn(&[(String, Vec<usize>)]) -> bool,
) -> Vec<(String, Vec<usize>)> {
    let until = std::time::Instant::now() + limit;
    loop {
        let workers = worker_cpus(pid);
        if done(&workers) || std::time::Instant::now() >= until {
            return workers;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn worker_cpus(pid: u32) -> Vec<(String, Vec<usize>)> {
    let mut out = Vec::new();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the daemon's threads");
    for task in tasks.flatten() {
        let dir = task.path();
        let Ok(name) = std::fs::read_to_string(dir.join("comm")) else {
            continue;
        };
        let name = name.trim().to_owned();
        if !name.starts_with("mt6d-w") {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(dir.join("status")) else {
            continue;
        };
        let list = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .expect("Cpus_allowed_list in /proc status")
            .trim();
        out.push((name, cpu_list(list)));
    }
    out.sort();
    out
}

/// "0-2,5" as [0, 1, 2, 5].
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.split(',') {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let lo: usize = lo.parse().expect("a CPU number");
        let hi: usize = hi.parse().expect("a CPU number");
        cpus.extend(lo..=hi);
    }
    cpus
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
