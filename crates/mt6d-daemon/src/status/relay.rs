//! What `mt6d status` shows for a relay network node (docs/CONFIG.md "The relay role"): every
//! link's cost and current addresses, every route, every end-to-end peer and the counters.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A relay node's status (`role` tells it from a gateway's or a server's).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RelayStatus {
    /// Always `relay`.
    pub role: String,
    pub version: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub config: String,
    /// This node's id (hex), None for a pure relay without an identity key.
    pub node_id: Option<String>,
    /// Whether the node forwards for others.
    pub transit: bool,
    /// The node's hashed /64.
    pub prefix: String,
    /// The TUN device of an edge gateway.
    pub tun: Option<String>,
    /// Each data-plane thread's share (`workers`; empty from a node older than the field).
    #[serde(default)]
    pub workers: Vec<WorkerStatus>,
    pub links: Vec<LinkStatus>,
    pub routes: Vec<RouteStatus>,
    pub e2e: Vec<E2eStatus>,
    /// The node's counters and every drop by its label (docs/PROTOCOL.md §10.11), and the
    /// daemon's own (`rx_datagrams`, `tx_datagrams`, `tun_*`, ...).
    pub counters: BTreeMap<String, u64>,
}

/// What one data-plane worker moved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct WorkerStatus {
    /// Datagrams received on its transparent socket.
    pub rx_datagrams: u64,
    /// Inner packets read from its TUN queue (edge gateways).
    pub tun_rx_packets: u64,
    /// Datagrams it sent.
    pub tx_datagrams: u64,
    /// Times it woke with something ready (absent from older nodes).
    #[serde(default)]
    pub wakeups: u64,
    /// Which CPUs it runs on now (absent from older nodes: `unplaced`).
    #[serde(default)]
    pub placement: super::Placement,
}

/// One link.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LinkStatus {
    pub name: String,
    /// The neighbour's `[relay] address`.
    pub address: String,
    /// `down`, `up` or `probation`.
    pub state: String,
    /// The published cost (65535: dead).
    pub cost: u16,
    /// Smoothed round-trip time of the probes, milliseconds.
    pub rtt_ms: Option<f64>,
    /// Probes lost of those sent, over the monitor's window.
    pub probes_lost: u32,
    pub probes_sent: u32,
    /// The epoch's send route: `[local]:port -> [remote]:port`.
    pub route: String,
    /// `handshake` (Noise IK keys in use), `pre-shared`, or `none (handshake under way)`.
    pub keys: String,
    /// Handshakes completed on the link (0 for a pre-shared link).
    pub handshakes: u64,
    /// Seconds since the newest keys were made (None: none yet, or pre-shared).
    pub last_handshake_secs: Option<u64>,
    /// The route set the link sends on: 0 the link set, then each handshake's session set
    /// (docs/PROTOCOL.md §9.8).
    pub route_set: u64,
}

/// One destination of the routing table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RouteStatus {
    /// The edge gateway's node id (hex).
    pub destination: String,
    /// The link frames for it leave on.
    pub next_hop: String,
    pub metric: u16,
}

/// One end-to-end peer of an edge gateway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct E2eStatus {
    pub name: String,
    /// The other edge gateway's node id (hex).
    pub destination: String,
    pub local_host: String,
    pub remote_host: String,
    /// The link frames for it leave on now; None: no route.
    pub next_hop: Option<String>,
    /// `handshake` (keys of a handshake through the relays in use), `pre-shared`, or
    /// `none (handshake under way)`.
    pub keys: String,
    /// Handshakes completed with the other edge gateway.
    pub handshakes: u64,
    /// Seconds since the newest keys were made (None: none yet, or pre-shared).
    pub last_handshake_secs: Option<u64>,
}

/// `mt6d status` of a relay node, for people.
pub fn render(s: &RelayStatus) -> String {
    let role = match (&s.node_id, s.transit) {
        (Some(_), true) => "edge gateway and relay",
        (Some(_), false) => "edge gateway",
        (None, _) => "relay",
    };
    let mut out = format!(
        "mt6d {} {role} (pid {}), up {} s, {}\n  node id {}, prefix {}/64{}, {} worker{}\n",
        s.version,
        s.pid,
        s.uptime_secs,
        s.config,
        s.node_id.as_deref().unwrap_or("(none)"),
        s.prefix,
        s.tun
            .as_ref()
            .map(|t| format!(", TUN {t}"))
            .unwrap_or_default(),
        s.workers.len(),
        if s.workers.len() == 1 { "" } else { "s" }
    );
    out.push_str("  links:\n");
    for l in &s.links {
        let rtt = l
            .rtt_ms
            .map_or_else(|| "-".to_string(), |r| format!("{r:.2} ms"));
        out.push_str(&format!(
            "    {:<12} {:<9} cost {:<5} rtt {:<10} lost {}/{}  {}\n",
            l.name, l.state, l.cost, rtt, l.probes_lost, l.probes_sent, l.route
        ));
        let handshake = l
            .last_handshake_secs
            .map(|s| {
                format!(
                    ", {} handshakes, newest {s} s ago, route set {}",
                    l.handshakes, l.route_set
                )
            })
            .unwrap_or_default();
        out.push_str(&format!("                 keys {}{handshake}\n", l.keys));
    }
    out.push_str("  routes:\n");
    if s.routes.is_empty() {
        out.push_str("    (none)\n");
    }
    for r in &s.routes {
        out.push_str(&format!(
            "    {} via {} metric {}\n",
            r.destination, r.next_hop, r.metric
        ));
    }
    if !s.e2e.is_empty() {
        out.push_str("  end-to-end:\n");
        for e in &s.e2e {
            out.push_str(&format!(
                "    {:<12} {} -> {} at {} via {}, keys {}{}\n",
                e.name,
                e.local_host,
                e.remote_host,
                e.destination,
                e.next_hop.as_deref().unwrap_or("(no route)"),
                e.keys,
                e.last_handshake_secs
                    .map(|s| format!(" ({} handshakes, newest {s} s ago)", e.handshakes))
                    .unwrap_or_default()
            ));
        }
    }
    if !s.workers.is_empty() {
        out.push_str("  workers:");
        for (k, w) in s.workers.iter().enumerate() {
            out.push_str(&format!(
                " [{k}] rx {} tun {} tx {} ({})",
                w.rx_datagrams, w.tun_rx_packets, w.tx_datagrams, w.placement
            ));
        }
        out.push('\n');
    }
    out.push_str("  counters:");
    out.push_str(&crate::status::nonzero_counters(&s.counters));
    out.push('\n');
    out
}
