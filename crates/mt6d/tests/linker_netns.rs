//! An observer on the public link tries to link consecutive epochs (the promise: unlinkable on the
//! wire). Four conversations with the same traffic mix run between the same two gateways in
//! encrypt mode across 30 rotations of 1 s; the linker (`mt6d_lab::linker`) scores every
//! header field, the payload's first bytes as a counter, packet sizes, the neighbour
//! discovery, MLD and ICMPv6 side channels, and the daemon's own control messages (their order
//! within each rotation, their offset from the boundary, byte-identical repeats) against the
//! ground truth from Gateway A's status. No method may link better than chance plus a margin
//! (0.25 flow by flow, 0.35 in the joint assignment; for the control messages chance plus 0.05,
//! or three standard deviations of guessing if larger; docs/PRIVACY.md says why), and no tunnel
//! payload may repeat an earlier one's header bytes.
//!
//! The traffic-analysis methods (`Method::TRAFFIC`: bytes and packets per epoch, size
//! distribution, timing phase across the switch, gap at the switch, burstiness, first/last
//! packets) are scored and printed in the same tables but not asserted: today they link these
//! identical timer-driven conversations (docs/PRIVACY.md). Once the conversations of one
//! gateway pair share their routes, this test adds the assertion that every one of them, like
//! the control methods, stays within chance + 0.05 flow by flow and jointly (or three standard
//! deviations of guessing, `control_margin`, when that is larger).
//!
//! The two pre-shared runs (on the segment, past a router) are joined by one with identity keys
//! and handshakes on the segment.
//!
//! Run: `cargo test --release -p mt6d --test linker_netns -- --include-ignored --nocapture` (as root).
//! `MT6D_LINKER_DAEMON=/path/to/mt6d` runs the gateways from another build (the linker stays
//! this one), to measure a change against the build before it.

mod common;

use mt6d_lab::topology::Topology;
use mt6d_lab::unlinkability::{run, Keying, LinkRunArgs, Shapes, JOINT_MARGIN, MARGIN};

const ROTATIONS: u32 = 30;
const PEERS: usize = 4;

fn no_method_links_epochs(topology: Topology, keying: Keying) {
    common::require_root();
    let _turn = common::one_at_a_time();
    let result = run(&LinkRunArgs {
        topology,
        mode: "encrypt".into(),
        rotation_secs: 1.0,
        rotations: ROTATIONS,
        peers: PEERS,
        // Another build's daemon (e.g. an older one, to measure before a change) if named.
        mt6d: std::env::var_os("MT6D_LINKER_DAEMON").map_or(common::MT6D.into(), Into::into),
        pcap: std::env::var_os("MT6D_LINKER_PCAP")
            .map(|d| std::path::Path::new(&d).join(format!("linker-{}.pcap", topology.name()))),
        shapes: Shapes::Timer,
        keying,
        classifiers: Vec::new(),
    })
    .expect("the two conversations run");
    assert_eq!(
        result.frames_with_true_address, 0,
        "a true address on the public link"
    );
    assert!(
        result.epochs >= ROTATIONS as usize,
        "only {} epochs in the ground truth",
        result.epochs
    );
    eprintln!(
        "a method links if it recovers more than chance + {MARGIN} of the links flow by flow, \
or chance + {JOINT_MARGIN} jointly"
    );
    for r in &result.reports {
        eprintln!("{}", r.table());
        eprintln!("side-channel messages: {:?}\n", r.side_channel_messages);
        let links = r.results.first().map_or(0, |m| m.links);
        assert!(
            links >= PEERS * (ROTATIONS as usize - 5),
            "{}: only {links} consecutive-epoch links to score",
            r.vantage
        );
        assert_eq!(
            r.repeated_headers, 0,
            "{}: tunnel payloads repeat an earlier one's header bytes",
            r.vantage
        );
    }
    let linking = result.linking();
    assert!(linking.is_empty(), "{}", linking.join("\n"));
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn no_method_links_consecutive_epochs_on_the_segment() {
    no_method_links_epochs(Topology::Switched, Keying::PreShared);
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn no_method_links_consecutive_epochs_past_the_router() {
    no_method_links_epochs(Topology::Routed, Keying::PreShared);
}

/// The default keying: one identity key per gateway and a handshake per stream, every stream
/// sharing Host A. Before each stream's link key took its true addresses (docs/PROTOCOL.md
/// §9.1), Host A's end of the four streams had one hashed address and port, Gateway A could not
/// tell them apart, and three of the four never completed a handshake: the run failed at once.
#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn no_method_links_consecutive_epochs_with_identity_keys() {
    no_method_links_epochs(Topology::Switched, Keying::Identity);
}
