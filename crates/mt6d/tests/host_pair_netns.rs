//! Two host-mode peers, end to end in network namespaces (root; CI runs as root): 001's
//! integrated configuration on both ends. Each host runs `mt6d run` with `role = "host"`, its
//! true address on its own TUN device, and the peer is the other host's mt6d: no gateway
//! anywhere. The wire format is the one gateways use; this is the configuration's own test.

use std::time::Duration;

use mt6d_lab::observer::Observer;
use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{Lab, Side, Topology, EXTERNAL_IF, HOST_A, HOST_B};
use mt6d_lab::transfer;

mod common;
use common::*;

/// The drops that mean a lost or refused packet, per side.
fn drops_now(running: &Running) -> [Vec<u64>; 2] {
    const COUNTED: [&str; 6] = [
        "bad_tag",
        "replay",
        "no_key",
        "bad_length",
        "unknown_address",
        "handshake",
    ];
    [Side::A, Side::B].map(|side| {
        let st = status(running, side);
        COUNTED.iter().map(|r| drops(&st, r)).collect()
    })
}

/// A TCP transfer from Host A to Host B for `secs` seconds and a ping train of `pings` echoes
/// (one every 100 ms) at the same time.
fn traffic(
    running: &Running,
    port: u16,
    secs: u64,
    pings: u64,
) -> (transfer::TransferReport, mt6d_lab::ping::PingReport) {
    let lab = &running.lab;
    let server = tcp_receiver(lab, port);
    let (tcp, p) = std::thread::scope(|s| {
        let pinger = s.spawn(|| {
            lab.host_a
                .run(|| {
                    ping(
                        HOST_B,
                        pings,
                        Pace::Train {
                            interval: Duration::from_millis(100),
                        },
                        Duration::from_secs(2),
                    )
                })
                .expect("enter A")
                .expect("ping")
        });
        let tcp = lab
            .host_a
            .run(|| transfer::send_for(HOST_B, port, Duration::from_secs(secs), 17))
            .expect("enter A")
            .expect("transfer");
        (tcp, pinger.join().expect("pinger"))
    });
    server.join().expect("server thread").expect("receiver");
    (tcp, p)
}

/// Two host-mode peers on one segment, 1 s rotations and a rekey every 3 s: a ping train and a
/// TCP transfer lose nothing and keep the SHA-256; then Host B's mt6d is killed (SIGKILL) and
/// started again, the two handshake anew, and the same traffic loses nothing again. Neither
/// side counts a refused packet while traffic runs, and the public link never carries a true
/// address.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn two_host_mode_peers_lose_nothing_across_rotations_rekeys_and_a_restart() {
    common::require_root();
    let lab = Lab::build_host_pair(Topology::Switched, "m6").expect("host-pair lab builds");
    assert_eq!(
        lab.host_b.name(),
        lab.gw_b.name(),
        "one namespace for Host B"
    );
    let mut running = start_gateways(lab, "encrypt", 1.0, (true, Some(3.0)));
    for side in [Side::A, Side::B] {
        let st = status(&running, side);
        assert_eq!(st.role, "host", "{side:?}");
        assert_eq!(st.internal_interface, "", "{side:?}");
    }
    settle_handshakes(&running);
    let observer = Observer::start(&running.lab.host_a, EXTERNAL_IF, vec![HOST_A, HOST_B], None)
        .expect("observer");

    // Rotations and rekeys.
    let rotations_before = status(&running, Side::A).peers[0].counters.rotations;
    let handshakes_before =
        [Side::A, Side::B].map(|s| handshake_of(&status(&running, s)).handshakes);
    let drops_before = drops_now(&running);
    let (tcp, pings) = traffic(&running, 5101, 10, 100);
    assert!(tcp.sha256_match, "TCP data corrupted");
    assert_eq!(pings.received, pings.sent, "ping lost {}", pings.lost());
    let rotations = status(&running, Side::A).peers[0].counters.rotations - rotations_before;
    assert!(rotations >= 8, "only {rotations} rotations in 10 s");
    let rekeys: u64 = [Side::A, Side::B]
        .iter()
        .zip(handshakes_before)
        .map(|(s, before)| handshake_of(&status(&running, *s)).handshakes - before)
        .sum();
    assert!(rekeys >= 2, "only {rekeys} handshakes in 10 s at rekey 3 s");
    assert_eq!(
        drops_now(&running),
        drops_before,
        "packets refused during traffic; B's log:\n{}",
        running.daemons[1].log_tail(40)
    );

    // A restart of Host B's mt6d: it comes back, handshakes, and carries traffic again.
    let config = running.dir.join("gw-B.toml");
    running.daemons[1].kill_hard();
    let mut again = start_daemon(&running, Side::B, "B2", &config);
    again
        .wait_ready(Duration::from_secs(10))
        .expect("Host B's mt6d starts again");
    running.daemons[1] = again;
    wait_for_path(&running.lab, HOST_B, 1);
    settle_handshakes(&running);
    let drops_before = drops_now(&running);
    let (tcp, pings) = traffic(&running, 5102, 5, 50);
    assert!(tcp.sha256_match, "TCP data corrupted after the restart");
    assert_eq!(
        pings.received,
        pings.sent,
        "ping lost {} after the restart",
        pings.lost()
    );
    assert_eq!(
        drops_now(&running),
        drops_before,
        "packets refused after the restart; B's log:\n{}",
        running.daemons[1].log_tail(40)
    );
    let hb = handshake_of(&status(&running, Side::B));
    assert!(hb.has_keys && hb.handshakes >= 1, "restarted B: {hb:?}");

    let seen = observer.finish().expect("observer");
    assert_eq!(seen.frames_with_true_address, 0, "{:?}", seen.first_leak);
    assert!(
        seen.outer_pairs.len() as u64 >= rotations,
        "{} outer pairs for {rotations} rotations",
        seen.outer_pairs.len()
    );
}
