//! What a relay node shows in `mt6d status` and its metrics: each link, route, end-to-end
//! peer and worker, and every counter of the node and of the daemon around it.

use super::*;
use crate::config::LinkConfig;

impl Worker<'_> {
    /// Every counter: the workers' sums, the node's, the neighbour responders'.
    pub(super) fn counter_map(&self, core: &Core, ndp: &[NdpResponder]) -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for w in &self.shared.counters {
            for (k, v) in w.lock().pairs() {
                *m.entry(k.to_string()).or_insert(0) += v;
            }
        }
        let n = core.node.counters();
        for (k, v) in [
            ("forwarded", n.forwarded),
            ("delivered", n.delivered),
            ("originated", n.originated),
            ("probes_answered", n.probes_answered),
            ("routing_received", n.routing_received),
            ("keepalives", n.keepalives),
        ] {
            m.insert(k.to_string(), v);
        }
        for (label, v) in n.drop_labels() {
            m.insert(format!("drop_{label}"), v);
        }
        // What the receive gate refused before the node saw it, under the node's labels.
        for w in &self.shared.counters {
            for (label, v) in &w.lock().gate_drops {
                *m.entry(format!("drop_{label}")).or_insert(0) += v;
            }
        }
        for r in ndp {
            let d = r.counters();
            for (k, v) in [
                ("ndp_answered", d.answered),
                ("ndp_defended", d.defended),
                ("ndp_not_current", d.not_current),
                ("ndp_malformed", d.malformed),
                ("ndp_send_errors", d.send_errors),
            ] {
                *m.entry(k.to_string()).or_insert(0) += v;
            }
        }
        m
    }

    /// Each data-plane worker's share and where it runs.
    pub(super) fn worker_status(&self) -> Vec<WorkerStatus> {
        let shared = self.shared;
        shared
            .counters
            .iter()
            .zip(shared.load.iter())
            .map(|(w, load)| {
                let w = w.lock();
                let load = load.status();
                WorkerStatus {
                    rx_datagrams: w.rx_datagrams,
                    tun_rx_packets: w.tun_rx_packets,
                    tx_datagrams: w.tx_datagrams,
                    wakeups: load.wakeups,
                    placement: load.placement,
                }
            })
            .collect()
    }

    pub(super) fn status(&self, started: Instant, ndp: &[NdpResponder]) -> RelayStatus {
        let cfg = self.shared.cfg;
        let core = self.shared.core.lock();
        let node = &core.node;
        let table = node.table();
        let links = core
            .links
            .iter()
            .map(|(&n, l)| link_status(node, n, l))
            .collect();
        let routes = table
            .routes()
            .map(|(d, r)| RouteStatus {
                destination: d.to_string(),
                next_hop: core.link_name(r.next_hop).to_string(),
                metric: r.metric.0,
            })
            .collect();
        let now = clock::now();
        let e2e = cfg
            .e2e
            .iter()
            .enumerate()
            .map(|(j, e)| E2eStatus {
                keys: keys_label(e.handshake.is_some(), node.e2e_keyed(e2e_id(j))),
                handshakes: node
                    .e2e_handshake(e2e_id(j))
                    .map_or(0, |h| h.stats().completed),
                last_handshake_secs: node
                    .e2e_handshake(e2e_id(j))
                    .and_then(|h| h.stats().last_completed)
                    .map(|t| now.as_nanos().saturating_sub(t.as_nanos()) / 1_000_000_000),
                name: e.name.clone(),
                destination: e.destination.to_string(),
                local_host: e.stream.local.true_addr.to_string(),
                remote_host: e.stream.remote.true_addr.to_string(),
                next_hop: table
                    .next_hop(&e.destination)
                    .map(|n| core.link_name(n).to_string()),
            })
            .collect();
        RelayStatus {
            role: "relay".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            pid: std::process::id(),
            uptime_secs: started.elapsed().as_secs(),
            config: cfg.path.display().to_string(),
            node_id: cfg.node_id.filter(|_| cfg.is_edge()).map(|n| n.to_string()),
            transit: cfg.transit,
            prefix: cfg.prefix().to_string(),
            tun: cfg.is_edge().then(|| cfg.tun_name.clone()),
            links,
            routes,
            e2e,
            workers: self.worker_status(),
            counters: self.counter_map(&core, ndp),
        }
    }
}

/// The counters that moved, as `name=value` pairs on one line.
pub(super) fn counter_line(counters: &BTreeMap<String, u64>) -> String {
    counters
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// What `mt6d status` says of a link's or end-to-end peer's keys.
pub(super) fn keys_label(handshake: bool, keyed: bool) -> String {
    match (handshake, keyed) {
        (false, _) => "pre-shared",
        (true, true) => "handshake",
        (true, false) => "none (handshake under way)",
    }
    .to_string()
}

/// One link's line of the status.
fn link_status(node: &RelayNode, n: Neighbour, l: &LinkConfig) -> LinkStatus {
    let m = node.monitor(n);
    let (lost, sent) = m.map_or((0, 0), |m| m.loss());
    let hs = node.link_handshake(n).map(|h| h.stats());
    let now = clock::now();
    LinkStatus {
        keys: keys_label(l.handshake.is_some(), node.link_keyed(n)),
        handshakes: hs.map_or(0, |h| h.completed),
        last_handshake_secs: hs
            .and_then(|h| h.last_completed)
            .map(|t| now.as_nanos().saturating_sub(t.as_nanos()) / 1_000_000_000),
        route_set: node.link_route_set(n).unwrap_or(0),
        name: l.name.clone(),
        address: l.address.to_string(),
        state: match m.map(|m| m.state()) {
            Some(LinkState::Up) => "up",
            Some(LinkState::Probation { .. }) => "probation",
            _ => "down",
        }
        .to_string(),
        cost: m.map_or(u16::MAX, |m| m.cost().0),
        rtt_ms: m.and_then(|m| m.srtt()).map(|d| d.as_secs_f64() * 1e3),
        probes_lost: lost,
        probes_sent: sent,
        route: node
            .link_schedule(n)
            .map(|s| format!("{} -> {}", s.send.local, s.send.remote))
            .unwrap_or_default(),
    }
}
