//! Hiding that survives a stolen key (the promise: unlinkable on the wire; docs/PROTOCOL.md
//! §9.8). Two gateways with identity keys rekey every 3 s while Host A pings Host B across 16
//! rotations of 1 s. An observer captures the public link; a thief holds Gateway A's key file and
//! config, so it computes every route of the link set (each epoch, each attempt offset). Once the
//! first session's set is in force, no captured tunnel packet may use a link-set address: every
//! rekey chains on the session's routes. Controls: the routes Gateway A's status named carry the
//! captured packets (so the capture and the matching work), and no ping is lost across the
//! switches.
//!
//! Run: `cargo test --release -p mt6d --test session_routes_netns -- --include-ignored` (as root).

mod common;

use std::collections::HashSet;
use std::net::{Ipv6Addr, SocketAddrV6};
use std::time::{Duration, Instant};

use common::{start_keyed, status, Running};
use mt6d::config::Config;
use mt6d::status::Status;
use mt6d_lab::observer::Observer;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{Side, EXTERNAL_IF, GATEWAY_A, GATEWAY_B, HOST_A, HOST_B};
use mt6d_proto::Epoch;

const ROTATIONS: u64 = 16;

/// The id of the route set Gateway A sends on, and whether it is a session's.
fn sending(st: &Status) -> (u64, bool) {
    st.peers[0]
        .route_sets
        .iter()
        .find(|r| r.sending)
        .map_or((0, false), |r| (r.id, r.kind == "session"))
}

fn wait_for_session(running: &Running) -> Epoch {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let st = status(running, Side::A);
        let b = status(running, Side::B);
        if sending(&st).1 && sending(&b).1 {
            return Epoch(st.peers[0].epoch.max(b.peers[0].epoch));
        }
        assert!(
            Instant::now() < deadline,
            "no session route set in force 10 s after start: A {:?} B {:?}",
            st.peers[0].route_sets,
            b.peers[0].route_sets
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn a_thief_of_a_static_key_finds_no_data_phase_route_on_the_wire() {
    common::require_root();
    let running = start_keyed("encrypt", 1.0, true, Some(3.0));
    let first = wait_for_session(&running);
    // One more epoch: packets sent on the link set before the switch have left the wire.
    std::thread::sleep(Duration::from_millis(1200));
    let before = status(&running, Side::A);
    let observer = Observer::start(
        &running.lab.gw_a,
        EXTERNAL_IF,
        vec![HOST_A, HOST_B, GATEWAY_A, GATEWAY_B],
        None,
    )
    .expect("observer");
    // The ground truth: every route Gateway A's status names while the pings run.
    let mut named: HashSet<Ipv6Addr> = HashSet::new();
    let pings = std::thread::scope(|s| {
        let pinger = s.spawn(|| {
            running
                .lab
                .host_a
                .run(|| {
                    ping(
                        HOST_B,
                        ROTATIONS * 20,
                        Pace::Train {
                            interval: Duration::from_millis(50),
                        },
                        Duration::from_secs(1),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        while !pinger.is_finished() {
            let st = status(&running, Side::A);
            for r in st.peers[0].accept.iter().chain([&st.peers[0].send]) {
                for a in [&r.local, &r.remote] {
                    if let Ok(sa) = a.parse::<SocketAddrV6>() {
                        named.insert(*sa.ip());
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        pinger.join().expect("ping thread")
    });
    let report = observer.finish().expect("observer");
    let after = status(&running, Side::A);

    // The thief: Gateway A's key file and config give the link key, hence the link set.
    let cfg = Config::load(&running.dir.join("gw-A.toml")).expect("gateway A's config");
    let link = cfg.peers[0].build_stream().expect("link stream");
    let (from, to) = (first.0.saturating_sub(2), after.peers[0].epoch + 2);
    let mut thief: HashSet<Ipv6Addr> = HashSet::new();
    for e in from..=to {
        for k in 0..=mt6d_proto::moves::MAX_OFFSET {
            let r = link.route_with_attempt(Epoch(e), k);
            thief.insert(*r.local.ip());
            thief.insert(*r.remote.ip());
        }
    }

    assert_eq!(
        report.frames_with_true_address, 0,
        "{:?}",
        report.first_leak
    );
    assert_eq!(
        pings.received,
        pings.sent,
        "{} pings lost across session switches",
        pings.lost()
    );
    let handshakes = |st: &Status| st.peers[0].handshake.as_ref().map_or(0, |h| h.handshakes);
    let rekeys = handshakes(&after) - handshakes(&before);
    let (id_before, _) = sending(&before);
    let (id_after, session) = sending(&after);
    assert!(
        rekeys >= 3 && id_after >= id_before + 3 && session,
        "{rekeys} handshakes while capturing, sending on set {id_before} then {id_after}: {:?}",
        after.peers[0].route_sets
    );
    let total: u64 = report.udp_per_pair.values().sum();
    let on_named: u64 = report
        .udp_per_pair
        .iter()
        .filter(|((s, d), _)| named.contains(s) && named.contains(d))
        .map(|(_, n)| n)
        .sum();
    let on_link: Vec<_> = report
        .udp_per_pair
        .iter()
        .filter(|((s, d), _)| thief.contains(s) || thief.contains(d))
        .collect();
    eprintln!(
        "session routes: {total} tunnel packets captured over {} epochs, {on_named} on routes A's \
status named, {} on link-set routes (a thief's view); {rekeys} handshakes, sets {id_before} -> \
{id_after}; pings {}/{}",
        to - from,
        on_link.len(),
        pings.received,
        pings.sent
    );
    // Controls: the capture holds the pings (two packets each), on the routes the daemon used.
    assert!(
        total >= 2 * pings.sent,
        "only {total} tunnel packets captured for {} pings",
        pings.sent
    );
    assert!(
        on_named * 100 >= total * 99,
        "{on_named} of {total} captured packets on routes the status named"
    );
    assert!(
        on_link.is_empty(),
        "a thief of the static key finds data-phase traffic on link-set routes: {on_link:?}"
    );
}
