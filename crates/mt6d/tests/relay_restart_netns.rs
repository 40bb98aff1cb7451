//! The relay role across a relay's restart, and what a relay's memory holds,
//! on the lab's chain `h1 - eA == r1 == r2 == eB - h2` (`mt6d_lab::relays`), every node a real
//! `mt6d run`.
//!
//! Checked: a relay stopped and started again in the middle of a TCP transfer forwards again
//! within a second (it asks its neighbours for their tables) and the transfer completes with its SHA-256 intact;
//! after transfers both ways, neither relay's memory holds a host's address, in binary or as
//! text, while an edge gateway's does (the scan finds what is there) and each relay's holds its
//! neighbours' configured addresses (the scan reads the whole process).
//!
//! Run: `cargo test --release -p mt6d --test relay_restart_netns -- --include-ignored
//! --test-threads=1 --nocapture`.

mod common;

use std::io::{Read, Seek, SeekFrom};
use std::net::Ipv6Addr;
use std::time::{Duration, Instant};

use mt6d_lab::relays::{Flow, RelayLab, RelaySettings, Shape, Size};
use mt6d_lab::transfer;
use mt6d_os::Netns;

fn settings() -> RelaySettings {
    common::relay_settings(1.0)
}

fn up(prefix: &str) -> RelayLab {
    let lab = RelayLab::up(Shape::Chain, prefix, settings()).expect("relay lab comes up");
    lab.wait_for_path(0, lab.hosts.len() - 1, Duration::from_secs(10))
        .expect("first path");
    lab
}

fn forwarded(lab: &RelayLab, i: usize) -> Option<u64> {
    let st = lab.status(i).ok()?;
    st.counters.get("forwarded").copied()
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_relay_restarted_mid_transfer_carries_it_again_and_it_arrives_intact() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let mut lab = up("m6rr");
    let (h1, h2) = (
        lab.host_index(1).expect("h1"),
        lab.host_index(2).expect("h2"),
    );
    let r1 = lab.node_index("r1").expect("r1");
    // Handles of their own: the transfer runs while the lab is changed.
    let src = Netns::open(lab.hosts[h1].ns.name()).expect("h1 namespace");
    let dst_ns = Netns::open(lab.hosts[h2].ns.name()).expect("h2 namespace");
    let dst = lab.hosts[h2].address;
    let listener = dst_ns
        .run(|| transfer::listen(dst, 5301))
        .expect("in h2")
        .expect("listen");
    let (report, received, restart, recovered) = std::thread::scope(|s| {
        let rx = s.spawn(|| transfer::serve_once(listener, Duration::from_secs(10)));
        let tx = s.spawn(|| {
            src.run(|| transfer::send_paced(dst, 5301, 12 << 20, Duration::from_secs(6), 7))
                .expect("in h1")
        });
        std::thread::sleep(Duration::from_secs(2));
        assert!(
            forwarded(&lab, r1).unwrap_or(0) > 0,
            "r1 carried nothing before its restart"
        );
        let t = Instant::now();
        lab.stop_node(r1).expect("r1 stops cleanly");
        lab.start_node(r1).expect("r1 starts again");
        let mut restart = None;
        let mut recovered = None;
        while t.elapsed() < Duration::from_secs(10) && recovered.is_none() {
            match forwarded(&lab, r1) {
                Some(n) if n > 0 => recovered = Some(t.elapsed()),
                Some(_) if restart.is_none() => restart = Some(t.elapsed()),
                _ => {}
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let report = tx.join().expect("sender thread");
        let received = rx.join().expect("receiver thread");
        (report, received, restart, recovered)
    });
    let report = report.expect("the transfer completes");
    let received = received.expect("the receiver reads to the end");
    eprintln!(
        "r1 restarted mid-transfer: answering again after {:?}, forwarding again after {:?}; transfer {} bytes in {:.2} s, longest stall {:.0} ms, sha256 match {}",
        restart, recovered, report.bytes, report.seconds, report.longest_stall_ms, report.sha256_match
    );
    let recovered =
        recovered.unwrap_or_else(|| panic!("r1 never forwarded again\n{}", lab.log_tails(20)));
    // Its neighbours never saw it dead (the restart is faster than 400 ms): it learns its routes
    // by asking (the wildcard request, docs/PROTOCOL.md §10.8), not at their next periodic
    // update 0-5 s later.
    assert!(
        recovered < Duration::from_secs(1),
        "r1 forwarded again only {recovered:?} after its restart"
    );
    assert_eq!(received.bytes, 12 << 20);
    assert!(
        report.sha256_match,
        "transfer corrupted\n{}",
        lab.log_tails(20)
    );
}

/// Every readable mapping of process `pid`'s memory.
fn memory_of(pid: u32) -> Vec<Vec<u8>> {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let mut mem = std::fs::File::open(format!("/proc/{pid}/mem")).expect("mem (root)");
    let mut regions = Vec::new();
    for line in maps.lines() {
        let mut f = line.split_whitespace();
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) else {
            continue;
        };
        let mut buf = vec![0u8; usize::try_from(b - a).expect("size")];
        if mem.seek(SeekFrom::Start(a)).is_ok() && mem.read_exact(&mut buf).is_ok() {
            regions.push(buf);
        }
    }
    regions
}

fn holds(regions: &[Vec<u8>], needle: &[u8]) -> bool {
    regions
        .iter()
        .any(|r| r.windows(needle.len()).any(|w| w == needle))
}

/// The forms an address could be kept in: its 16 bytes, and its text.
fn forms(a: Ipv6Addr) -> [Vec<u8>; 2] {
    [a.octets().to_vec(), a.to_string().into_bytes()]
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn no_relay_holds_a_hosts_address_in_its_memory() {
    common::require_root();
    let _turn = common::one_at_a_time();
    let lab = up("m6rm");
    let (h1, h2) = (
        lab.host_index(1).expect("h1"),
        lab.host_index(2).expect("h2"),
    );
    let reports = lab
        .transfers(&[
            Flow {
                from: h1,
                to: h2,
                size: Size::Bytes(4 << 20),
                port: 5302,
                seed: 3,
            },
            Flow {
                from: h2,
                to: h1,
                size: Size::Bytes(4 << 20),
                port: 5303,
                seed: 4,
            },
        ])
        .expect("transfers both ways");
    assert!(reports.iter().all(|r| r.sha256_match));
    let hosts = [lab.hosts[h1].address, lab.hosts[h2].address];
    let ea = lab.node_index("eA").expect("eA");
    let edge = memory_of(lab.status(ea).expect("eA status").pid);
    assert!(
        holds(&edge, &hosts[1].octets()),
        "the scan does not find {} in edge gateway eA, whose configuration names it",
        hosts[1]
    );
    for name in ["r1", "r2"] {
        let i = lab.node_index(name).expect("relay");
        let st = lab.status(i).expect("status");
        assert!(st.counters.get("forwarded").copied().unwrap_or(0) > 1000);
        let regions = memory_of(st.pid);
        let size: usize = regions.iter().map(Vec::len).sum();
        for l in &st.links {
            let neighbour: Ipv6Addr = l.address.parse().expect("address");
            assert!(
                holds(&regions, &neighbour.octets()),
                "{name}: the scan of {size} bytes does not find its neighbour {neighbour}"
            );
        }
        for h in hosts {
            for needle in forms(h) {
                assert!(
                    !holds(&regions, &needle),
                    "{name} holds host address {h} in its memory"
                );
            }
        }
        eprintln!(
            "{name}: {size} bytes of memory scanned, no host address in it, its neighbours' addresses found"
        );
    }
}
