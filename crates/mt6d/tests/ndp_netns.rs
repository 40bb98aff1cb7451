//! Neighbour unreachability detection across the gateway's proxy (RFC 4861 §7.3): a protected
//! host that resolved the far host's true address through Gateway B's proxied advertisement
//! checks it again from time to time with unicast solicitations sent to that address. Those
//! reach Gateway B, whose route for the address points into the tunnel: unless the kernel
//! treats them as proxied neighbour discovery (`net.ipv6.conf.all.proxy_ndp`, which it consults
//! on the forwarding path), it tries to forward them, refuses because their source is
//! link-local, and answers the host with a "beyond scope of source address" error; after three
//! unanswered probes the host's entry fails and its next packet waits for a new resolution.
//!
//! Seen first in the soak (docs/results/2026-11-28-soak-2h): three refused packets at Gateway
//! B every 46-47 s, one a second.
//!
//! Run: `cargo test --release -p mt6d --test ndp_netns -- --include-ignored --nocapture`.

mod common;

use std::time::Duration;

use common::{require_root, start_on};
use mt6d_lab::topology::{Side, Topology, HOST_A};

/// Host B's neighbour timers, short so that the probes come within seconds: reachable for
/// 250-750 ms after a confirmation, then one second of delay before the first probe.
fn fast_nud(ns: &mt6d_os::Netns) {
    ns.run(|| {
        for (name, value) in [
            ("base_reachable_time_ms", "500"),
            ("delay_first_probe_time", "1"),
            ("retrans_time_ms", "500"),
        ] {
            let path = format!("/proc/sys/net/ipv6/neigh/eth0/{name}");
            std::fs::write(&path, value).unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    })
    .expect("enter Host B");
}

fn counter(ns: &mt6d_os::Netns, name: &str) -> u64 {
    mt6d_lab::kernel_counters::kernel_drops(ns, &[name])
        .expect("counters")
        .get(name)
        .copied()
        .unwrap_or(0)
}

#[test]
#[ignore = "needs root (network namespaces): run as root with --include-ignored, as scripts/test.sh does"]
fn the_protected_hosts_unicast_probes_of_a_proxied_address_are_answered() {
    require_root();
    let running = start_on(Topology::Switched, "encrypt", 1.0, |lab| {
        fast_nud(&lab.host_b)
    });
    let lab = &running.lab;
    common::wait_for_path(lab, mt6d_lab::topology::HOST_B, 10);
    let gw_b = lab.gateway(Side::B);
    let (refused_before, errors_before) = (
        counter(gw_b, "Ip6InAddrErrors"),
        counter(&lab.host_b, "Icmp6InDestUnreachs"),
    );
    // Host B sends to Host A for 8 s: its entry for Host A goes stale every second or so and
    // is probed with unicast solicitations to Host A's address, which Gateway B proxies.
    let report = lab
        .host_b
        .run(|| {
            mt6d_lab::ping::ping(
                HOST_A,
                40,
                mt6d_lab::ping::Pace::Train {
                    interval: Duration::from_millis(200),
                },
                Duration::from_secs(2),
            )
        })
        .expect("enter Host B")
        .expect("ping");
    let refused = counter(gw_b, "Ip6InAddrErrors") - refused_before;
    let errors = counter(&lab.host_b, "Icmp6InDestUnreachs") - errors_before;
    let neigh = common::ip_in(&lab.host_b, &["-6", "neigh", "show", &HOST_A.to_string()]);
    eprintln!(
        "{} of 40 echoes answered; Gateway B refused {refused} packets of Host B's, Host B got {errors} unreachable errors; Host B's entry: {neigh}",
        report.received
    );
    assert_eq!(report.received, 40, "every echo answered");
    assert_eq!(refused, 0, "Gateway B refused none of Host B's probes");
    assert_eq!(errors, 0, "Host B was sent no unreachable error");
    assert!(!neigh.contains("FAILED"), "{neigh}");
}
