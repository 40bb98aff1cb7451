//! The status schema: what `mt6d status` (and `--json`, the demo, the tests and the bench) read
//! from a running daemon, one schema per role (a gateway's here, [`server`], [`relay`]). The
//! roles fill it in and the control socket (`control`) carries it; both import it from here, so
//! the control socket imports no role.
//!
//! Fields added later carry `#[serde(default)]`, so a newer `mt6d status` still reads an older
//! daemon's answer.

pub mod relay;
pub mod server;
pub mod text;

use serde::{Deserialize, Serialize};

/// What the daemon reports about itself.
/// The status of a daemon of any role: a gateway's [`Status`], a server's
/// [`server::ServerStatus`] (its `role` is `server`) or a relay node's
/// [`relay::RelayStatus`] (`relay`). What `mt6d status` reads and the metrics page renders.
#[derive(Debug, Clone)]
pub enum AnyStatus {
    Gateway(Box<Status>),
    Server(server::ServerStatus),
    Relay(relay::RelayStatus),
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Status {
    pub version: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub tun: String,
    /// `gateway` or `host` (absent from older daemons: gateway).
    #[serde(default = "gateway_role")]
    pub role: String,
    /// Empty in host mode, which has no internal interface.
    pub internal_interface: String,
    pub external_interface: String,
    pub peers: Vec<PeerStatus>,
    /// Path MTU, ICMPv6 errors and neighbour priming (absent from older daemons).
    #[serde(default)]
    pub path: PathStatus,
    /// Duplicate address probes and the neighbour discovery watch (absent from older daemons).
    #[serde(default)]
    pub collision_watch: CollisionWatchStatus,
    /// The interfaces the daemon uses and their state (absent from older daemons).
    #[serde(default)]
    pub interfaces: Vec<InterfaceStatus>,
    /// Packets the kernel dropped in the queues between it and the daemon's packet threads
    /// (absent from older daemons).
    #[serde(default)]
    pub kernel_drops: KernelDrops,
    /// What each data-plane worker moved since start, by worker index (absent from older
    /// daemons).
    #[serde(default)]
    pub workers: Vec<WorkerStatus>,
}

/// One data-plane worker's totals: its TUN queue and the sockets of the peers it receives for.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct WorkerStatus {
    /// Packets it read from its TUN queue and sealed into the tunnel.
    pub sealed: u64,
    /// Packets it opened from the tunnel and wrote to its TUN queue.
    pub opened: u64,
    /// Times it woke with something ready.
    pub wakeups: u64,
    /// Which CPUs it runs on now (absent from older daemons: `unplaced`).
    #[serde(default)]
    pub placement: Placement,
}

/// Where a data-plane worker runs (docs/ARCHITECTURE.md "Workers", placement): on the one CPU
/// that light workers share while it carries little, on every CPU the daemon may use while it
/// carries bulk.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Placement {
    /// Not placed: the daemon may use one CPU only, the kernel refused a move (logged), or the
    /// worker has carried nothing yet.
    #[default]
    Unplaced,
    /// Light: restricted to this CPU, the lowest the daemon may use.
    Light { cpu: u32 },
    /// Bulk: free to run on every CPU the daemon may use.
    Bulk,
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Unplaced => f.write_str("not placed"),
            Placement::Light { cpu } => write!(f, "light, on CPU {cpu}"),
            Placement::Bulk => f.write_str("bulk, on every CPU"),
        }
    }
}

/// Drops in the kernel's queues in front of the daemon's packet threads, since start. They
/// rise when a packet thread waits too long for a core; the daemon's own per-peer drop
/// counters never see these packets.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelDrops {
    /// Tunnel datagrams dropped because a tunnel socket's receive queue was full (SO_RXQ_OVFL;
    /// the namespace's `Udp6RcvbufErrors` counts the same drops for every socket).
    pub socket_queue: u64,
    /// Packets from the protected side dropped because the TUN device's transmit queue was
    /// full (the device's `tx_dropped`).
    pub tun_queue: u64,
    /// Inner packets written to the TUN device that the kernel refused: the device's
    /// `rx_dropped` plus failed writes (each failed write counted once).
    pub tun_write: u64,
}

impl KernelDrops {
    pub fn total(&self) -> u64 {
        self.socket_queue + self.tun_queue + self.tun_write
    }
}

/// One interface the daemon uses, followed by name through link events.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct InterfaceStatus {
    /// "external" or "internal".
    pub role: String,
    pub name: String,
    /// The index it had at start-up.
    pub index: u32,
    /// "up", "down" or "missing".
    pub state: String,
    /// Seconds since it entered that state (or since start-up).
    pub since_secs: u64,
}

/// The gateway's own duplicate address detection on the external link (docs/PROTOCOL.md §5.2).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CollisionWatchStatus {
    /// Whether the watch runs (it needs the external interface's link-layer address).
    pub active: bool,
    /// Duplicate address probes sent for newly bound hashed addresses.
    pub probes: u64,
    /// Solicitations and advertisements that failed the parser.
    pub malformed: u64,
    /// Advertisements and probes from other nodes naming one of our hashed addresses.
    #[serde(default)]
    pub claims: u64,
    /// Unicast probes sent to a claimant, and the claims they confirmed (collisions).
    #[serde(default)]
    pub confirmation_probes: u64,
    #[serde(default)]
    pub confirmed: u64,
}

/// A peer's route moves away from address collisions (docs/PROTOCOL.md §5.2).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct MoveStatus {
    /// Collisions on this gateway's hashed addresses that moved a route.
    pub collisions_detected: u64,
    /// Collisions left in place because the epoch had moved the maximum number of times.
    pub collisions_unresolved: u64,
    /// Routes moved: by this gateway's collisions plus by the peer's notices.
    pub routes_moved: u64,
    /// Of which on the peer's notice.
    pub moved_by_peer: u64,
    pub notices_sent: u64,
    pub acks_sent: u64,
    pub notices_received: u64,
    /// Malformed, forged or out-of-window notices.
    pub notices_refused: u64,
    /// Epochs of the window now moved, as (epoch, attempt offset).
    pub moved_epochs: Vec<(u64, u8)>,
}

/// A status's counters for people: ` k=v` for every non-zero one, or ` all 0`.
pub fn nonzero_counters(counters: &std::collections::BTreeMap<String, u64>) -> String {
    let mut out = String::new();
    for (k, v) in counters.iter().filter(|(_, v)| **v > 0) {
        out.push_str(&format!(" {k}={v}"));
    }
    if out.is_empty() {
        out.push_str(" all 0");
    }
    out
}

fn gateway_role() -> String {
    "gateway".into()
}

/// What the gateway knows and did about the public path (docs/PROTOCOL.md §5).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PathStatus {
    /// The TUN device's MTU now: the largest inner packet the tunnel carries.
    pub tunnel_mtu: u32,
    /// The TUN MTU from the external interface's MTU, before any Packet Too Big lowered it.
    pub base_mtu: u32,
    /// ICMPv6 errors from the path translated and delivered to the protected host, by type.
    pub icmp_translated: std::collections::BTreeMap<String, u64>,
    /// ICMPv6 errors not translated, by reason (`icmp_not_our_route`, `icmp_bad_tag`, ...).
    pub icmp_dropped: std::collections::BTreeMap<String, u64>,
    /// Neighbour solicitations sent from new hashed addresses to the on-link next hop.
    pub neighbor_solicitations: u64,
    /// Router discovery on the internal and external links (docs/PROTOCOL.md §5.3).
    #[serde(default)]
    pub router: RouterStatus,
    /// Per peer: the largest inner packet its path carries now (the tunnel MTU, or lower while
    /// a Packet Too Big about that peer's packets holds; docs/PROTOCOL.md §5 "Path MTU").
    #[serde(default)]
    pub peer_mtu: std::collections::BTreeMap<String, u32>,
}

/// Router Advertisements to the protected hosts and what the external link's router said.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RouterStatus {
    /// `router_advertisements` in the config.
    pub enabled: bool,
    /// The MTU the last advertisement carried (0: none sent yet).
    pub advertised_mtu: u32,
    pub advertisements_sent: u64,
    /// Router Solicitations from hosts answered unicast.
    pub solicitations_answered: u64,
    /// Router Advertisements heard on the external link.
    pub upstream_advertisements: u64,
    /// The MTU the external link's router advertises (0: none heard).
    pub upstream_mtu: u32,
    /// Router discovery messages dropped, by reason (`nd_malformed`, `nd_hop_limit`, ...).
    pub dropped: std::collections::BTreeMap<String, u64>,
}

/// One peer (stream) of the daemon.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PeerStatus {
    pub name: String,
    pub mode: String,
    pub local_host: String,
    pub remote_host: String,
    pub epoch: u64,
    /// Milliseconds until the send route changes.
    pub next_change_ms: u64,
    /// The route packets are sent on now.
    pub send: RouteStatus,
    /// The routes accepted now: previous, current and next epoch of every bound route set.
    pub accept: Vec<RouteStatus>,
    /// The bound route sets (docs/PROTOCOL.md §9.8), the link set first (absent from older
    /// daemons).
    #[serde(default)]
    pub route_sets: Vec<RouteSetStatus>,
    pub counters: CounterSnapshot,
    /// "handshake" (identity keys) or "pre-shared" (a static session key).
    #[serde(default)]
    pub keying: String,
    /// Handshake state; absent with a pre-shared key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handshake: Option<HandshakeStatus>,
    /// Route moves away from address collisions (absent from older daemons).
    #[serde(default)]
    pub moves: MoveStatus,
    /// Milliseconds since anything (data, keepalive, handshake message) last arrived from this
    /// peer; None if nothing ever did (absent from older daemons).
    #[serde(default)]
    pub last_rx_ms_ago: Option<u64>,
    /// TCP identity option policy and MSS clamping, per direction (`out`: protected side into
    /// the tunnel, `in`: out of it); absent from older daemons.
    #[serde(default)]
    pub tcp: Vec<TcpPolicyStatus>,
}

/// One direction of a peer's TCP policy: events by label (`inspected`, `stripped`,
/// `options_removed`, `accepted`, `dropped`, `malformed`, `malformed_accepted`, `logged`,
/// `log_suppressed`, `injected`, `inject_no_room`, `mss_clamped`, `normalized`, `timestamps_removed`) and matches per rule.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct TcpPolicyStatus {
    pub direction: String,
    pub events: std::collections::BTreeMap<String, u64>,
    pub rules: Vec<RuleStatus>,
}

/// One `[[peer.host_id_*.rule]]` and how often it matched.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RuleStatus {
    /// The rule as written: `wing 0x1000-0x1fff drop`.
    pub rule: String,
    pub hits: u64,
}

/// One bound route set of a peer.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RouteSetStatus {
    /// 0 for the link set; session sets count up from 1 per daemon run.
    pub id: u64,
    /// "link" (from the link or pre-shared key) or "session" (from a handshake's route key).
    pub kind: String,
    /// The first epoch data may travel on it (0 for the link set).
    pub activation_epoch: u64,
    /// Whether data is sent on it now.
    pub sending: bool,
    /// Whether data is accepted on it (else only handshake-class messages).
    pub data: bool,
}

/// What a peer's handshakes have done.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct HandshakeStatus {
    /// Whether this gateway holds a send key (a handshake has completed and keys have not expired).
    pub has_keys: bool,
    /// Milliseconds since the newest handshake completed (None: never).
    pub last_handshake_ms_ago: Option<u64>,
    /// Age of the send key in use, in milliseconds (None: no key).
    pub key_age_ms: Option<u64>,
    /// Fingerprint of the send key in use (hex; tells keys apart, reveals nothing).
    pub send_key_id: Option<String>,
    /// Handshakes completed, and how many of them replaced keys.
    pub handshakes: u64,
    pub rekeys: u64,
    pub initiations_sent: u64,
    pub responses_sent: u64,
    /// Rejected handshake messages by reason (`hs_bad_mac`, `hs_replayed`, ...).
    pub failures: std::collections::BTreeMap<String, u64>,
}

/// A pair of outer endpoints for one epoch.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct RouteStatus {
    pub epoch: u64,
    /// `[address]:port` of this gateway.
    pub local: String,
    /// `[address]:port` of the peer gateway.
    pub remote: String,
}

/// A snapshot for `mt6d status`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CounterSnapshot {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub rotations: u64,
    /// ICMPv6 errors the gateway's own stack sent about this peer's packets (its hop limit ran
    /// out here), carried to the peer from the local protected host (absent from older
    /// daemons).
    #[serde(default)]
    pub own_errors: u64,
    /// Drops by reason label, both directions added.
    pub drops: std::collections::BTreeMap<String, u64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_for_people_list_the_non_zero_ones_in_order_or_say_all_zero() {
        let mut c = std::collections::BTreeMap::new();
        c.insert("rx".to_string(), 0u64);
        assert_eq!(nonzero_counters(&c), " all 0");
        c.insert("tx".to_string(), 3);
        c.insert("drop_replay".to_string(), 1);
        assert_eq!(nonzero_counters(&c), " drop_replay=1 tx=3");
    }
}
