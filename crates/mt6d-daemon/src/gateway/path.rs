//! What the ICMPv6 thread, the router discovery thread and the rotation report about the public
//! path, read by `mt6d status`: the tunnel MTU and its sources, ICMPv6 errors translated and
//! dropped, router advertisements sent and heard. Its own file so that the `icmp` and `router`
//! threads, which both write it, do not import each other.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use crate::status::{PathStatus, RouterStatus};

/// The four translated types, in type order, with their labels in `mt6d status`.
pub(super) const ICMP_TYPES: [(u8, &str); 4] = [
    (1, "destination_unreachable"),
    (2, "packet_too_big"),
    (3, "time_exceeded"),
    (4, "parameter_problem"),
];

/// Drop labels: the reasons of [`IcmpError`](mt6d_proto::icmp::IcmpError), then the daemon's
/// own.
const ICMP_DROPS: [&str; 12] = [
    "icmp_malformed",
    "icmp_not_an_error",
    "icmp_bad_checksum",
    "icmp_not_our_route",
    "icmp_quote_too_short",
    "icmp_bad_tag",
    "icmp_not_allowed",
    "icmp_buffer_too_small",
    "icmp_bogus_mtu",
    "icmp_not_sent",
    "icmp_no_destination",
    "icmp_send_failed",
];

/// What the ICMPv6 thread and the rotator report, shared with the control socket.
#[derive(Debug)]
pub struct PathState {
    /// TUN MTU derived from the external MTU at start (the tx buffers are sized for it, so the
    /// tunnel MTU never goes above it).
    pub base_mtu: u32,
    /// The TUN device's MTU: the link MTU (Packet Too Big lowers per-peer routes, not this).
    pub tunnel_mtu: AtomicU32,
    /// The tunnel MTU without what Packet Too Big taught: what the whole internal link is told
    /// in Router Advertisements (the `router` module).
    pub link_mtu: AtomicU32,
    /// Per peer name, the MTU of its path now (written when it changes, read by `status`).
    pub(super) peer_mtu: Mutex<BTreeMap<String, u32>>,
    /// The MTU the external link's router advertises (0: none heard), from the `router` module.
    pub upstream_mtu: AtomicU32,
    /// What the router discovery thread did.
    pub router: RouterCounters,
    translated: [AtomicU64; ICMP_TYPES.len()],
    dropped: [AtomicU64; ICMP_DROPS.len()],
    pub solicitations: AtomicU64,
}

impl PathState {
    pub fn new(base_mtu: u32) -> PathState {
        PathState {
            base_mtu,
            tunnel_mtu: AtomicU32::new(base_mtu),
            link_mtu: AtomicU32::new(base_mtu),
            peer_mtu: Mutex::new(BTreeMap::new()),
            upstream_mtu: AtomicU32::new(0),
            router: Default::default(),
            translated: Default::default(),
            dropped: Default::default(),
            solicitations: AtomicU64::new(0),
        }
    }

    pub(super) fn drop(&self, label: &str) {
        // Every label passed in is one of ICMP_DROPS (IcmpError::reason's are listed there; the
        // unit test below checks it); an unknown one is counted under the first.
        let i = ICMP_DROPS.iter().position(|l| *l == label).unwrap_or(0);
        self.dropped[i].fetch_add(1, Relaxed);
    }

    pub(super) fn translated(&self, msg_type: u8) {
        if let Some(i) = ICMP_TYPES.iter().position(|(t, _)| *t == msg_type) {
            self.translated[i].fetch_add(1, Relaxed);
        }
    }

    /// The `path` part of `mt6d status`; `router_advertisements` from the config.
    pub fn status(&self, router_advertisements: bool) -> PathStatus {
        PathStatus {
            tunnel_mtu: self.tunnel_mtu.load(Relaxed),
            base_mtu: self.base_mtu,
            icmp_translated: ICMP_TYPES
                .iter()
                .zip(&self.translated)
                .map(|((_, l), n)| (l.to_string(), n.load(Relaxed)))
                .collect(),
            icmp_dropped: ICMP_DROPS
                .iter()
                .zip(&self.dropped)
                .map(|(l, n)| (l.to_string(), n.load(Relaxed)))
                .collect(),
            neighbor_solicitations: self.solicitations.load(Relaxed),
            router: self.router.status(router_advertisements, self),
            // A poisoned lock still holds a consistent map: every update is one insert.
            peer_mtu: self
                .peer_mtu
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone(),
        }
    }
}

/// Drop labels of received router discovery messages.
const ROUTER_DROPS: [&str; 5] = [
    "nd_malformed",
    "nd_hop_limit",
    "nd_bad_source",
    "nd_other_interface",
    "nd_not_default_router",
];

/// What the router discovery thread did, shared with the control socket.
#[derive(Debug, Default)]
pub struct RouterCounters {
    pub advertised_mtu: AtomicU32,
    pub advertisements_sent: AtomicU64,
    pub solicitations_answered: AtomicU64,
    pub upstream_advertisements: AtomicU64,
    dropped: [AtomicU64; ROUTER_DROPS.len()],
}

impl RouterCounters {
    pub(super) fn drop(&self, label: &str) {
        let i = ROUTER_DROPS.iter().position(|l| *l == label).unwrap_or(0);
        self.dropped[i].fetch_add(1, Relaxed);
    }

    /// The `router` part of `mt6d status`.
    pub fn status(&self, enabled: bool, path: &PathState) -> RouterStatus {
        RouterStatus {
            enabled,
            advertised_mtu: self.advertised_mtu.load(Relaxed),
            advertisements_sent: self.advertisements_sent.load(Relaxed),
            solicitations_answered: self.solicitations_answered.load(Relaxed),
            upstream_advertisements: self.upstream_advertisements.load(Relaxed),
            upstream_mtu: path.upstream_mtu.load(Relaxed),
            dropped: ROUTER_DROPS
                .iter()
                .zip(&self.dropped)
                .map(|(l, n)| (l.to_string(), n.load(Relaxed)))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mt6d_proto::icmp::IcmpError;

    /// Every reason the protocol crate reports has its own counter.
    #[test]
    fn every_icmp_error_reason_has_a_label() {
        let errors = [
            IcmpError::Malformed(mt6d_proto::wire::WireError::Malformed {
                what: "x",
                field: "y",
            }),
            IcmpError::NotAnError,
            IcmpError::BadChecksum,
            IcmpError::NotOurRoute,
            IcmpError::QuoteTooShort,
            IcmpError::BadTag,
            IcmpError::NotAllowed,
            IcmpError::BufferTooSmall { have: 0, need: 1 },
            IcmpError::BogusMtu {
                mtu: 65535,
                quoted: 1488,
            },
            IcmpError::NotSent,
        ];
        for e in errors {
            assert!(ICMP_DROPS.contains(&e.reason()), "{}", e.reason());
        }
        let p = PathState::new(1460);
        p.drop("icmp_bad_tag");
        p.translated(2);
        p.translated(200);
        let s = p.status(true);
        assert_eq!(s.icmp_dropped["icmp_bad_tag"], 1);
        assert_eq!(s.icmp_translated["packet_too_big"], 1);
        assert_eq!(s.icmp_translated.values().sum::<u64>(), 1);
        assert_eq!(s.tunnel_mtu, 1460);
    }

    #[test]
    fn every_drop_has_a_label_and_status_reports_them() {
        let c = RouterCounters::default();
        for l in ROUTER_DROPS {
            c.drop(l);
        }
        c.advertised_mtu.store(1436, Relaxed);
        let path = PathState::new(1436);
        path.upstream_mtu.store(1400, Relaxed);
        let s = c.status(true, &path);
        assert_eq!(s.dropped.len(), ROUTER_DROPS.len());
        assert!(s.dropped.values().all(|n| *n == 1));
        assert_eq!((s.advertised_mtu, s.upstream_mtu), (1436, 1400));
    }
}
