//! End-to-end tests of the gateway in network namespaces (root; CI runs as root): key exchange
//! (docs/PROTOCOL.md §9). Gateways that share only public keys carry traffic, rekeys every two
//! seconds lose no ping, and a gateway killed mid-transfer handshakes again.

use std::time::{Duration, Instant};

use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{Side, HOST_B};
use mt6d_lab::transfer;

mod common;
use common::*;

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn gateways_that_share_only_public_keys_carry_traffic() {
    common::require_root();
    let running = start("encrypt", 1.0);
    for label in ["A", "B"] {
        let text =
            std::fs::read_to_string(running.dir.join(format!("gw-{label}.toml"))).expect("config");
        assert!(text.contains("public_key = "), "{text}");
        assert!(
            !text.contains("\nkey_file = ") && !text.contains("\nkey = "),
            "no shared secret in the configs: {text}"
        );
    }
    let r = running
        .lab
        .host_a
        .run(|| {
            ping(
                HOST_B,
                50,
                Pace::Flood {
                    wait: Duration::from_millis(500),
                },
                Duration::from_millis(500),
            )
        })
        .expect("enter A")
        .expect("ping");
    assert_eq!(r.received, 50, "{r:?}");
    for side in [Side::A, Side::B] {
        let st = status(&running, side);
        assert_eq!(st.peers[0].keying, "handshake");
        let h = handshake_of(&st);
        assert!(h.has_keys && h.handshakes >= 1, "{side:?}: {h:?}");
        assert!(h.send_key_id.is_some());
    }
    // Each side sends under its own key: the two directions never share one.
    assert_ne!(
        handshake_of(&status(&running, Side::A)).send_key_id,
        handshake_of(&status(&running, Side::B)).send_key_id
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn rekey_every_two_seconds_during_tcp_loses_no_ping() {
    common::require_root();
    let running = start_keyed("encrypt", 1.0, true, Some(2.0));
    settle_handshakes(&running);
    let counted = ["bad_tag", "replay", "no_key", "bad_length", "handshake"];
    let drops_now = |side| {
        let st = status(&running, side);
        counted.iter().map(|r| drops(&st, r)).collect::<Vec<_>>()
    };
    let (drops_a, drops_b) = (drops_now(Side::A), drops_now(Side::B));
    let before = handshake_of(&status(&running, Side::A)).handshakes
        + handshake_of(&status(&running, Side::B)).handshakes;
    let (tcp, pings, ()) = transfer_and_pings(&running.lab, 5003, 10, 100, || ());
    let after_a = handshake_of(&status(&running, Side::A));
    let after_b = handshake_of(&status(&running, Side::B));
    let rekeys = after_a.handshakes + after_b.handshakes - before;
    assert!(tcp.sha256_match, "TCP data corrupted across rekeys");
    assert_eq!(
        pings.received,
        pings.sent,
        "ping lost {} across rekeys",
        pings.lost()
    );
    assert!(
        rekeys >= 6,
        "only {rekeys} handshakes in 10 s at rekey 2 s: {after_a:?} {after_b:?}"
    );
    for (side, label, before) in [(Side::A, 0, drops_a), (Side::B, 1, drops_b)] {
        let now = drops_now(side);
        assert_eq!(
            now,
            before,
            "{side:?} dropped packets across rekeys ({counted:?}: {before:?} -> {now:?}); handshake {:?}\nlog:\n{}",
            handshake_of(&status(&running, side)),
            running.daemons[label].log_tail(60)
        );
    }
    eprintln!(
        "rekey test: {rekeys} handshakes, TCP {:.0} Mbit/s, ping {}/{}",
        tcp.mbit_s, pings.received, pings.sent
    );
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn gateway_b_killed_mid_transfer_rehandshakes_and_the_transfer_completes() {
    common::require_root();
    let mut running = start("encrypt", 1.0);
    let config = running.dir.join("gw-B.toml");
    let listener = running
        .lab
        .host_b
        .run(|| transfer::listen(HOST_B, 5004))
        .expect("enter B")
        .expect("listen");
    let server =
        std::thread::spawn(move || transfer::serve_once(listener, Duration::from_secs(10)));
    let (tcp, restarted_after) = {
        let r = &mut running;
        std::thread::scope(|s| {
            let lab = &r.lab;
            let tcp = s.spawn(|| {
                lab.host_a
                    .run(|| transfer::send_for(HOST_B, 5004, Duration::from_secs(8), 11))
                    .expect("enter A")
                    .expect("transfer")
            });
            std::thread::sleep(Duration::from_secs(3));
            let killed = Instant::now();
            r.daemons[1].kill_hard();
            let mut again = start_daemon(r, Side::B, "B2", &config);
            again
                .wait_ready(Duration::from_secs(10))
                .expect("B restarts");
            let up = killed.elapsed();
            r.daemons[1] = again;
            (tcp.join().expect("tcp thread"), up)
        })
    };
    server.join().expect("server").expect("receiver");
    assert!(tcp.sha256_match, "transfer corrupted by the restart");
    let hb = handshake_of(&status(&running, Side::B));
    assert!(hb.has_keys && hb.handshakes >= 1, "restarted B: {hb:?}");
    eprintln!(
        "restart test: B back after {:.0} ms, longest TCP stall {:.0} ms",
        restarted_after.as_secs_f64() * 1000.0,
        tcp.longest_stall_ms
    );
    // The goal is a gap under 2 s: TCP's own retransmission timer (200 ms, doubling) adds
    // to the daemon's start-up and the handshake round trip.
    assert!(
        tcp.longest_stall_ms < 2000.0,
        "TCP stalled {:.0} ms across the restart",
        tcp.longest_stall_ms
    );
}
