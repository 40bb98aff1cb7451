//! End-to-end test of the pre-shared-key send counter (docs/PROTOCOL.md §4.3) in network
//! namespaces (root; CI runs as root): the counter no longer starts at the wall clock, and a
//! gateway killed and started again continues above every counter it reserved before, read from
//! its fsynced state file.

use std::time::{Duration, Instant};

use mt6d_lab::ping::{ping, Pace};
use mt6d_lab::topology::{Side, EXTERNAL_IF, HOST_B};
use mt6d_os::capture::PacketCapture;

mod common;
use common::*;

/// Counters reserved per state-file write for Gateway A's key (a 64th of its packet limit,
/// crates/mt6d-daemon/src/gateway/counter_state.rs).
fn block(running: &Running) -> u64 {
    let cfg = mt6d::config::Config::load(&running.dir.join("gw-A.toml")).expect("config");
    mt6d::gateway::counter_state::block(cfg.peers[0].stream.aead)
}

/// In Gateway A's namespace: the smallest counter field of the tunnel packets A sends while Host A
/// pings Host B (frames from A's external MAC, IPv6, UDP, payload of at least 32 bytes).
fn counters_sent_by_a(running: &Running) -> Vec<u64> {
    // The counter is under header protection on the wire (docs/PROTOCOL.md §4.5): the test, which
    // holds the configuration, unmasks it with Gateway A's send header key.
    let cfg = mt6d::config::Config::load(&running.dir.join("gw-A.toml")).expect("config");
    let stream = cfg.peers[0].build_stream().expect("stream");
    let hp = stream
        .send_header_key()
        .expect("encrypt mode has a header key");
    let mac: Vec<u8> = running
        .lab
        .gw_a
        .run(|| {
            let mut nl = mt6d_os::Netlink::open().expect("netlink");
            let i = nl.link_index(EXTERNAL_IF).expect("external interface");
            nl.link_mac(i).expect("MAC").expect("Ethernet").to_vec()
        })
        .expect("enter A");
    std::thread::scope(|s| {
        let capture = s.spawn(|| {
            running
                .lab
                .gw_a
                .run(|| {
                    let cap = PacketCapture::open(EXTERNAL_IF, 256, Duration::from_millis(100))
                        .expect("capture");
                    let mut buf = vec![0u8; 256];
                    let mut got = Vec::new();
                    let deadline = Instant::now() + Duration::from_secs(6);
                    while Instant::now() < deadline && got.len() < 20 {
                        if let Some(f) = cap.recv(&mut buf).expect("capture") {
                            let fr = &buf[..f.captured];
                            // Ethernet (14) | IPv6 (40, next header UDP) | UDP (8) | payload.
                            let udp_len = fr
                                .get(58..60)
                                .map_or(0, |l| usize::from(u16::from_be_bytes([l[0], l[1]])));
                            if f.captured == f.wire_len
                                && fr.len() >= 62 + 32
                                && fr[6..12] == mac[..]
                                && fr[12..14] == [0x86, 0xdd]
                                && fr[20] == 17
                                && udp_len >= 8 + 24
                                && 54 + udp_len <= fr.len()
                            {
                                let mut payload = fr[62..54 + udp_len].to_vec();
                                hp.unprotect(&mut payload).expect("long enough");
                                let mut c = [0u8; 8];
                                c.copy_from_slice(&payload[..8]);
                                let c = u64::from_be_bytes(c);
                                // The high bit marks the handshake class (notices, link-layer
                                // announcements): not a data counter.
                                if c < 1 << 63 {
                                    got.push(c);
                                }
                            }
                        }
                    }
                    got
                })
                .expect("enter A")
        });
        std::thread::sleep(Duration::from_millis(300));
        let r = running
            .lab
            .host_a
            .run(|| {
                ping(
                    HOST_B,
                    20,
                    Pace::Train {
                        interval: Duration::from_millis(100),
                    },
                    Duration::from_millis(500),
                )
            })
            .expect("enter host A")
            .expect("ping");
        assert_eq!(r.received, 20, "{r:?}");
        capture.join().expect("capture thread")
    })
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn pre_shared_counters_start_at_the_persisted_mark_not_the_clock() {
    common::require_root();
    // A pre-shared key (no handshake), the only keys with a persisted counter.
    let mut running = start_keyed("encrypt", 1.0, false, None);
    let block = block(&running);
    let first = counters_sent_by_a(&running);
    assert!(!first.is_empty(), "no tunnel packets from A captured");
    // A fresh state directory: the first run counts from 0, far below the clock in ns (~1.8e18),
    // which told an observer when the gateway started.
    assert!(first.iter().all(|c| *c < block), "{first:?}");

    running.daemons[0].kill_hard();
    let config = running.dir.join("gw-A.toml");
    let text = std::fs::read_to_string(&config).expect("config");
    assert!(
        text.contains("state_dir = "),
        "the lab keeps state out of /var/lib: {text}"
    );
    let mut again = start_daemon(&running, Side::A, "A2", &config);
    again
        .wait_ready(Duration::from_secs(10))
        .expect("restarts after the crash");
    running.daemons[0] = again;
    wait_for_path(&running.lab, HOST_B, 5);
    let second = counters_sent_by_a(&running);
    assert!(!second.is_empty(), "no tunnel packets from A after restart");
    // Everything the crashed run reserved (one block) is skipped, whatever the clock says.
    assert!(
        second.iter().all(|c| *c >= block && *c < 2 * block),
        "{second:?}"
    );
    let max_first = first.iter().max().copied().unwrap_or(0);
    assert!(second.iter().all(|c| *c > max_first));
}
