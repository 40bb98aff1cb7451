//! The optional Prometheus endpoint (`metrics_listen` in `[gateway]`, `[server]` or `[relay]`,
//! off by default).
//!
//! What it exposes is the `mt6d status` snapshot of any role ([`AnyStatus`]), rendered in the
//! Prometheus text format by the `prometheus-client` crate: the daemon's housekeeping loop
//! publishes a fresh status about once a second ([`Published`]), and a thread of its own
//! answers scrapes from the newest one.
//! So a slow or hostile client on the metrics address can hold up only that thread, never a
//! rotation or a packet, and scraping costs the packet threads nothing.
//!
//! Names follow the Prometheus conventions: the `mt6d_` prefix, base units in the name
//! (`_bytes`, `_seconds`), `_total` on counters (added by the encoder), one label per dimension
//! (`peer`, `reason`, `direction`). Only `GET /metrics` is answered; anything else gets a 404.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::status::relay::RelayStatus;
use crate::status::server::ServerStatus;
use crate::status::{AnyStatus, Status};

type Labels = Vec<(&'static str, String)>;

/// The newest status snapshot, shared between the housekeeping loop and the metrics thread.
pub type Published = ArcSwapOption<AnyStatus>;

/// Renders the status of a daemon of any role.
pub fn render_any(st: &AnyStatus) -> String {
    match st {
        AnyStatus::Gateway(g) => render(g),
        AnyStatus::Server(s) => render_server(s),
        AnyStatus::Relay(r) => render_relay(r),
    }
}

/// A page being built: its registry and the two kinds of family every role uses.
#[derive(Default)]
struct Page {
    registry: Registry,
}

impl Page {
    fn counter(&mut self, name: &str, help: &str) -> Family<Labels, Counter> {
        let f = Family::<Labels, Counter>::default();
        self.registry.register(name, help, f.clone());
        f
    }
    fn gauge(&mut self, name: &str, help: &str) -> Family<Labels, Gauge> {
        let f = Family::<Labels, Gauge>::default();
        self.registry.register(name, help, f.clone());
        f
    }
    fn float_gauge(&mut self, name: &str, help: &str) -> Family<Labels, Gauge<f64, AtomicU64>> {
        let f = Family::<Labels, Gauge<f64, AtomicU64>>::default();
        self.registry.register(name, help, f.clone());
        f
    }
    /// `mt6d_build_info` and `mt6d_uptime_seconds`, as every role has them.
    fn identity(&mut self, version: &str, role: &str, tun: &str, uptime_secs: u64) {
        self.gauge(
            "mt6d_build_info",
            "Always 1: the version and role of this daemon",
        )
        .get_or_create(&vec![
            ("version", version.to_string()),
            ("role", role.to_string()),
            ("tun", tun.to_string()),
        ])
        .set(1);
        self.gauge("mt6d_uptime_seconds", "Seconds since the daemon started")
            .get_or_create(&vec![])
            .set(clamp(uptime_secs));
    }
    /// A role's named counters as one family with the counter's name as the `event` label
    /// (their meanings: docs/CONFIG.md, per role).
    fn events(
        &mut self,
        name: &str,
        help: &str,
        counters: &std::collections::BTreeMap<String, u64>,
    ) {
        let f = self.counter(name, help);
        for (event, n) in counters {
            f.get_or_create(&vec![("event", event.clone())]).inc_by(*n);
        }
    }

    /// Every role's data-plane workers: what each carried, and where it runs.
    fn workers(&mut self, workers: &[crate::status::WorkerStatus]) {
        let worker = self.counter(
            "mt6d_worker_packets",
            "Inner packets each data-plane worker carried, by worker and direction (tx: read from its TUN queue and sealed, rx: opened and written to it)",
        );
        for (i, w) in workers.iter().enumerate() {
            for (direction, n) in [("tx", w.sealed), ("rx", w.opened)] {
                worker
                    .get_or_create(&vec![
                        ("worker", i.to_string()),
                        ("direction", direction.to_string()),
                    ])
                    .inc_by(n);
            }
        }
        self.placements(workers.iter().map(|w| w.placement));
    }

    /// Where each data-plane worker runs (every role).
    fn placements(&mut self, placements: impl Iterator<Item = crate::status::Placement>) {
        let placement = self.gauge(
            "mt6d_worker_placement",
            "Where each data-plane worker runs, one series per state, 1 for the current one (light: on the one CPU light workers share, bulk: on every CPU, unplaced: one CPU allowed or the kernel refused a move)",
        );
        for (i, at) in placements.enumerate() {
            use crate::status::Placement as At;
            for (state, now) in [
                ("light", matches!(at, At::Light { .. })),
                ("bulk", at == At::Bulk),
                ("unplaced", at == At::Unplaced),
            ] {
                placement
                    .get_or_create(&vec![
                        ("worker", i.to_string()),
                        ("placement", state.to_string()),
                    ])
                    .set(i64::from(now));
            }
        }
    }

    fn finish(self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        text_format(&out)
    }
}

/// Renders a server's status: its clients and live sessions, and every counter of its workers.
pub fn render_server(st: &ServerStatus) -> String {
    let mut page = Page::default();
    page.identity(&st.version, "server", &st.tun, st.uptime_secs);
    for (name, help, v) in [
        (
            "mt6d_server_clients",
            "Clients configured (peers file and live additions)",
            st.clients,
        ),
        (
            "mt6d_server_sessions",
            "Handshake clients with live keys",
            st.sessions,
        ),
        (
            "mt6d_server_session_route_sets",
            "Session route sets indexed besides the clients' link sets",
            st.session_route_sets,
        ),
    ] {
        page.gauge(name, help).get_or_create(&vec![]).set(clamp(v));
    }
    page.events(
        "mt6d_server_events",
        "The server's counters by name (docs/CONFIG.md, the server role: rx_packets, rx_rejected, handshakes_answered, tx_key_limit, ...)",
        &st.counters,
    );
    page.workers(&st.workers);
    page.finish()
}

/// Renders a relay node's status: each link's state, cost, round-trip time and probe loss, the
/// routes and end-to-end peers, each worker's share and every counter of the node.
pub fn render_relay(st: &RelayStatus) -> String {
    let mut page = Page::default();
    page.identity(
        &st.version,
        "relay",
        st.tun.as_deref().unwrap_or(""),
        st.uptime_secs,
    );
    let up = page.gauge(
        "mt6d_relay_link_up",
        "1 while the link is up, 0 while it is down or on probation, by link and state",
    );
    let cost = page.gauge(
        "mt6d_relay_link_cost",
        "The link's published cost (65535: dead)",
    );
    let rtt = page.float_gauge(
        "mt6d_relay_link_rtt_seconds",
        "Smoothed round-trip time of the link's probes",
    );
    let sent = page.gauge(
        "mt6d_relay_link_probes_sent",
        "Probes sent over the link monitor's window",
    );
    let lost = page.gauge(
        "mt6d_relay_link_probes_lost",
        "Probes lost of those sent, over the link monitor's window",
    );
    let handshakes = page.counter(
        "mt6d_relay_link_handshakes",
        "Handshakes completed on the link",
    );
    for l in &st.links {
        let link = vec![("link", l.name.clone())];
        up.get_or_create(&vec![("link", l.name.clone()), ("state", l.state.clone())])
            .set(i64::from(l.state == "up"));
        cost.get_or_create(&link).set(i64::from(l.cost));
        if let Some(ms) = l.rtt_ms {
            rtt.get_or_create(&link).set(ms / 1000.0);
        }
        sent.get_or_create(&link).set(i64::from(l.probes_sent));
        lost.get_or_create(&link).set(i64::from(l.probes_lost));
        handshakes.get_or_create(&link).inc_by(l.handshakes);
    }
    page.gauge("mt6d_relay_routes", "Destinations in the routing table")
        .get_or_create(&vec![])
        .set(clamp(st.routes.len() as u64));
    let e2e = page.gauge(
        "mt6d_relay_e2e_routed",
        "1 while the end-to-end peer has a route (a next hop), by peer",
    );
    let e2e_hs = page.counter(
        "mt6d_relay_e2e_handshakes",
        "Handshakes completed with the other edge gateway, by end-to-end peer",
    );
    for e in &st.e2e {
        let peer = vec![("peer", e.name.clone())];
        e2e.get_or_create(&peer)
            .set(i64::from(e.next_hop.is_some()));
        e2e_hs.get_or_create(&peer).inc_by(e.handshakes);
    }
    let worker = page.counter(
        "mt6d_relay_worker_datagrams",
        "Datagrams each data-plane worker received and sent, by worker and direction",
    );
    for (i, w) in st.workers.iter().enumerate() {
        for (direction, n) in [("rx", w.rx_datagrams), ("tx", w.tx_datagrams)] {
            worker
                .get_or_create(&vec![
                    ("worker", i.to_string()),
                    ("direction", direction.to_string()),
                ])
                .inc_by(n);
        }
    }
    page.placements(st.workers.iter().map(|w| w.placement));
    page.events(
        "mt6d_relay_events",
        "The node's counters and drops by name (docs/PROTOCOL.md §10.11, docs/CONFIG.md, the relay role)",
        &st.counters,
    );
    page.finish()
}

/// Renders `st` in the Prometheus text exposition format.
pub fn render(st: &Status) -> String {
    let mut page = Page::default();
    page.identity(&st.version, &st.role, &st.tun, st.uptime_secs);
    page.gauge(
        "mt6d_tunnel_mtu_bytes",
        "MTU of the TUN device: what the tunnel carries per inner packet",
    )
    .get_or_create(&vec![])
    .set(i64::from(st.path.tunnel_mtu));
    kernel_drops(&mut page, &st.kernel_drops);
    page.workers(&st.workers);
    peers(&mut page, &st.peers);
    tcp_policy(&mut page, &st.peers);
    page.finish()
}

/// The kernel's drops in the queues in front of the gateway's packet threads.
fn kernel_drops(page: &mut Page, k: &crate::status::KernelDrops) {
    let kernel = page.counter(
        "mt6d_kernel_drops",
        "Packets the kernel dropped in the queues in front of the data-plane workers, by queue (socket_queue: a tunnel socket's receive queue, tun_queue: the TUN transmit queue, tun_write: refused TUN writes)",
    );
    for (queue, n) in [
        ("socket_queue", k.socket_queue),
        ("tun_queue", k.tun_queue),
        ("tun_write", k.tun_write),
    ] {
        kernel
            .get_or_create(&vec![("queue", queue.to_string())])
            .inc_by(n);
    }
}

/// Each peer's traffic, drops, rotations, moves and handshakes.
fn peers(page: &mut Page, peers: &[crate::status::PeerStatus]) {
    let packets = page.counter(
        "mt6d_peer_packets",
        "Inner packets carried, by peer and direction (tx: sealed and sent, rx: opened and delivered)",
    );
    let bytes = page.counter(
        "mt6d_peer_bytes",
        "Inner bytes carried, by peer and direction",
    );
    let drops = page.counter(
        "mt6d_peer_drops",
        "Packets dropped, by peer and reason (both directions)",
    );
    let rotations = page.counter(
        "mt6d_peer_rotations",
        "Epoch changes (hashed address and port rotations)",
    );
    let moves = page.counter(
        "mt6d_peer_routes_moved",
        "Routes moved away from an address collision, ours or the peer's",
    );
    let collisions = page.counter(
        "mt6d_peer_collisions_detected",
        "Collisions on this gateway's hashed addresses that moved a route",
    );
    let handshakes = page.counter(
        "mt6d_peer_handshakes",
        "Handshakes completed (the first and every rekey)",
    );
    let rekeys = page.counter("mt6d_peer_rekeys", "Handshakes that replaced earlier keys");
    let failures = page.counter(
        "mt6d_peer_handshake_failures",
        "Handshake messages refused, by reason",
    );
    let key_age = page.gauge(
        "mt6d_peer_key_age_seconds",
        "Age of the current session keys (handshake peers with keys only)",
    );
    let has_keys = page.gauge(
        "mt6d_peer_has_keys",
        "1 while the peer has session keys (handshake peers), else 0",
    );
    let since_rx = page.gauge(
        "mt6d_peer_last_receive_age_seconds",
        "Seconds since a packet from the peer last opened (absent before the first)",
    );
    for p in peers {
        let peer = || vec![("peer", p.name.clone())];
        let with = |k: &'static str, v: &str| {
            let mut l = peer();
            l.push((k, v.to_string()));
            l
        };
        let c = &p.counters;
        packets
            .get_or_create(&with("direction", "tx"))
            .inc_by(c.tx_packets);
        packets
            .get_or_create(&with("direction", "rx"))
            .inc_by(c.rx_packets);
        bytes
            .get_or_create(&with("direction", "tx"))
            .inc_by(c.tx_bytes);
        bytes
            .get_or_create(&with("direction", "rx"))
            .inc_by(c.rx_bytes);
        for (reason, n) in &c.drops {
            drops.get_or_create(&with("reason", reason)).inc_by(*n);
        }
        rotations.get_or_create(&peer()).inc_by(c.rotations);
        moves.get_or_create(&peer()).inc_by(p.moves.routes_moved);
        collisions
            .get_or_create(&peer())
            .inc_by(p.moves.collisions_detected);
        if let Some(h) = &p.handshake {
            handshakes.get_or_create(&peer()).inc_by(h.handshakes);
            rekeys.get_or_create(&peer()).inc_by(h.rekeys);
            for (reason, n) in &h.failures {
                failures.get_or_create(&with("reason", reason)).inc_by(*n);
            }
            has_keys.get_or_create(&peer()).set(i64::from(h.has_keys));
            if let Some(ms) = h.key_age_ms {
                key_age.get_or_create(&peer()).set(clamp(ms / 1000));
            }
        }
        if let Some(ms) = p.last_rx_ms_ago {
            since_rx.get_or_create(&peer()).set(clamp(ms / 1000));
        }
    }
}

/// What each peer's TCP identity policy and MSS clamping did.
fn tcp_policy(page: &mut Page, peers: &[crate::status::PeerStatus]) {
    let tcp_events = page.counter(
        "mt6d_peer_tcp_segments",
        "TCP segments by what the identity option policy and MSS clamping did, by peer, direction (out: into the tunnel) and event",
    );
    let rule_hits = page.counter(
        "mt6d_peer_host_id_rule_matches",
        "Matches of each host_id rule, by peer, direction and rule (as written)",
    );
    for p in peers {
        for t in &p.tcp {
            for (event, n) in &t.events {
                tcp_events
                    .get_or_create(&vec![
                        ("peer", p.name.clone()),
                        ("direction", t.direction.clone()),
                        ("event", event.clone()),
                    ])
                    .inc_by(*n);
            }
            for (i, r) in t.rules.iter().enumerate() {
                rule_hits
                    .get_or_create(&vec![
                        ("peer", p.name.clone()),
                        ("direction", t.direction.clone()),
                        ("rule", format!("{} {}", i + 1, r.rule)),
                    ])
                    .inc_by(r.hits);
            }
        }
    }
}

/// The encoder writes OpenMetrics, where a counter family `x` has samples `x_total` and ends
/// with `# EOF`. Prometheus' own text format (0.0.4), which every scraper and `promtool check
/// metrics` read, names the family as its samples: `# TYPE x_total counter`, and has no `# EOF`.
fn text_format(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find(|p| line.starts_with(p));
        match meta {
            Some(prefix) => {
                let rest = &line[prefix.len()..];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                } else {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

fn clamp(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[error("metrics_listen {addr}: {source}")]
pub struct MetricsError {
    addr: SocketAddr,
    #[source]
    source: std::io::Error,
}

/// The listening socket of the metrics endpoint.
#[derive(Debug)]
pub struct MetricsServer {
    listener: TcpListener,
    addr: SocketAddr,
}

impl MetricsServer {
    /// Binds `addr` (at start-up, so a taken port stops the daemon with a clear error).
    pub fn bind(addr: SocketAddr) -> Result<MetricsServer, MetricsError> {
        let err = |source| MetricsError { addr, source };
        let listener = TcpListener::bind(addr).map_err(err)?;
        listener.set_nonblocking(true).map_err(err)?;
        let addr = listener.local_addr().map_err(err)?;
        Ok(MetricsServer { listener, addr })
    }

    /// The bound address (the port chosen by the kernel when 0 was asked for).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Answers scrapes from `published` until `stop` is set. Runs on a thread of its own.
    pub fn run(&self, published: &Published, stop: &AtomicBool) {
        while !stop.load(Ordering::Relaxed) {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if let Err(e) = answer(stream, published) {
                        log::debug!("metrics client {peer}: {e}");
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_millis(50));
                }
                Err(e) => {
                    log::warn!("metrics {}: accept failed: {e}", self.addr);
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
    }
}

fn answer(stream: TcpStream, published: &Published) -> std::io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(2)))?;
    let mut line = String::new();
    BufReader::new(&stream).take(1024).read_line(&mut line)?;
    let mut words = line.split_whitespace();
    let (method, path) = (words.next(), words.next());
    let (status, content_type, body) = match (method, path, published.load_full()) {
        (Some("GET"), Some("/metrics"), Some(st)) => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            render_any(&st),
        ),
        (Some("GET"), Some("/metrics"), None) => (
            "503 Service Unavailable",
            "text/plain",
            "starting\n".to_string(),
        ),
        _ => (
            "404 Not Found",
            "text/plain",
            "only GET /metrics\n".to_string(),
        ),
    };
    let mut out = &stream;
    write!(
        out,
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use crate::status::{HandshakeStatus, PeerStatus};
    use std::sync::Arc;

    fn sample() -> Status {
        let mut peer = PeerStatus {
            name: "site-b".into(),
            last_rx_ms_ago: Some(2500),
            handshake: Some(HandshakeStatus {
                has_keys: true,
                key_age_ms: Some(61_000),
                handshakes: 3,
                rekeys: 2,
                failures: [("hs_replayed".to_string(), 1)].into_iter().collect(),
                ..Default::default()
            }),
            ..Default::default()
        };
        peer.counters.tx_packets = 10;
        peer.counters.tx_bytes = 14_000;
        peer.counters.rx_packets = 9;
        peer.counters.rotations = 42;
        peer.counters.drops.insert("open_replay".into(), 5);
        peer.tcp.push(crate::status::TcpPolicyStatus {
            direction: "out".into(),
            events: [("stripped".to_string(), 4)].into_iter().collect(),
            rules: vec![crate::status::RuleStatus {
                rule: "wing 0x1234 drop".into(),
                hits: 2,
            }],
        });
        Status {
            version: "0.1.0".into(),
            role: "gateway".into(),
            tun: "mt6d0".into(),
            uptime_secs: 90,
            peers: vec![peer],
            kernel_drops: crate::status::KernelDrops {
                socket_queue: 6,
                tun_queue: 0,
                tun_write: 1,
            },
            workers: vec![crate::status::WorkerStatus {
                sealed: 7,
                opened: 9,
                wakeups: 3,
                placement: crate::status::Placement::Bulk,
            }],
            ..Default::default()
        }
    }

    #[test]
    fn the_snapshot_is_rendered_with_conventional_names() {
        let text = render(&sample());
        for line in [
            "mt6d_peer_packets_total{peer=\"site-b\",direction=\"tx\"} 10",
            "mt6d_peer_bytes_total{peer=\"site-b\",direction=\"tx\"} 14000",
            "mt6d_peer_drops_total{peer=\"site-b\",reason=\"open_replay\"} 5",
            "mt6d_peer_rotations_total{peer=\"site-b\"} 42",
            "mt6d_kernel_drops_total{queue=\"socket_queue\"} 6",
            "mt6d_kernel_drops_total{queue=\"tun_queue\"} 0",
            "mt6d_kernel_drops_total{queue=\"tun_write\"} 1",
            "mt6d_worker_packets_total{worker=\"0\",direction=\"tx\"} 7",
            "mt6d_worker_packets_total{worker=\"0\",direction=\"rx\"} 9",
            "mt6d_worker_placement{worker=\"0\",placement=\"bulk\"} 1",
            "mt6d_worker_placement{worker=\"0\",placement=\"light\"} 0",
            "mt6d_peer_handshakes_total{peer=\"site-b\"} 3",
            "mt6d_peer_key_age_seconds{peer=\"site-b\"} 61",
            "mt6d_peer_last_receive_age_seconds{peer=\"site-b\"} 2",
            "mt6d_uptime_seconds 90",
            "mt6d_peer_tcp_segments_total{peer=\"site-b\",direction=\"out\",event=\"stripped\"} 4",
            "mt6d_peer_host_id_rule_matches_total{peer=\"site-b\",direction=\"out\",rule=\"1 wing 0x1234 drop\"} 2",
            "# TYPE mt6d_peer_packets_total counter",
            "# TYPE mt6d_uptime_seconds gauge",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        assert!(!text.contains("# EOF"));
    }

    #[test]
    fn only_get_metrics_is_answered_and_nothing_before_the_first_snapshot() {
        let server = MetricsServer::bind("[::1]:0".parse().unwrap()).unwrap();
        let addr = server.local_addr();
        let published = Published::empty();
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| server.run(&published, &stop));
            let get = |request: &str| {
                let mut c = TcpStream::connect(addr).unwrap();
                c.write_all(request.as_bytes()).unwrap();
                let mut reply = String::new();
                c.read_to_string(&mut reply).unwrap();
                reply
            };
            assert!(get("GET /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 503"));
            published.store(Some(Arc::new(AnyStatus::Gateway(Box::new(sample())))));
            let ok = get("GET /metrics HTTP/1.1\r\n\r\n");
            assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
            assert!(ok.contains("mt6d_peer_rotations_total{peer=\"site-b\"} 42"));
            assert!(get("GET / HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
            assert!(get("POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
            stop.store(true, Ordering::Relaxed);
        });
    }

    #[test]
    #[ignore = "needs promtool (Debian's prometheus package; scripts/install-deps.sh installs it)"]
    fn promtool_accepts_the_rendering() {
        mt6d_lab::promtool_check(&render(&sample())).unwrap();
        mt6d_lab::promtool_check(&render_server(&server_sample())).unwrap();
        mt6d_lab::promtool_check(&render_relay(&relay_sample())).unwrap();
    }

    fn server_sample() -> ServerStatus {
        ServerStatus {
            role: "server".into(),
            version: "0.1.0".into(),
            pid: 7,
            uptime_secs: 30,
            config: "/etc/mt6d/server.toml".into(),
            prefix: "2001:db8:5::".into(),
            tun: "mt6ds0".into(),
            clients: 10_000,
            sessions: 9_998,
            session_route_sets: 9_998,
            counters: [
                ("rx_packets".to_string(), 5),
                ("tx_key_limit".to_string(), 0),
            ]
            .into_iter()
            .collect(),
            workers: vec![crate::status::WorkerStatus {
                sealed: 3,
                opened: 4,
                wakeups: 5,
                placement: crate::status::Placement::Bulk,
            }],
        }
    }

    fn relay_sample() -> RelayStatus {
        use crate::status::relay::{E2eStatus, LinkStatus, WorkerStatus};
        RelayStatus {
            role: "relay".into(),
            version: "0.1.0".into(),
            uptime_secs: 12,
            node_id: Some("12b954673e1016c8".into()),
            prefix: "2001:db8:ff:1::".into(),
            tun: Some("mt6dr0".into()),
            workers: vec![WorkerStatus {
                rx_datagrams: 40,
                tun_rx_packets: 3,
                tx_datagrams: 41,
                wakeups: 30,
                placement: crate::status::Placement::Light { cpu: 0 },
            }],
            links: vec![LinkStatus {
                name: "relay".into(),
                state: "up".into(),
                cost: 12,
                rtt_ms: Some(1.5),
                probes_sent: 20,
                probes_lost: 1,
                handshakes: 2,
                ..Default::default()
            }],
            e2e: vec![E2eStatus {
                name: "a-to-b".into(),
                next_hop: Some("relay".into()),
                handshakes: 1,
                ..Default::default()
            }],
            counters: [("drop_bad_tag".to_string(), 4)].into_iter().collect(),
            ..Default::default()
        }
    }

    /// A server's and a relay's pages carry what an operator alerts on, with the role's
    /// counters under their names; every role's page comes out of `render_any`.
    #[test]
    fn every_role_has_a_page() {
        let s = render_any(&AnyStatus::Server(server_sample()));
        for want in [
            "mt6d_build_info{version=\"0.1.0\",role=\"server\",tun=\"mt6ds0\"} 1",
            "mt6d_server_clients 10000",
            "mt6d_server_sessions 9998",
            "mt6d_server_events_total{event=\"rx_packets\"} 5",
            "mt6d_server_events_total{event=\"tx_key_limit\"} 0",
            "mt6d_worker_packets_total{worker=\"0\",direction=\"rx\"} 4",
            "mt6d_worker_placement{worker=\"0\",placement=\"bulk\"} 1",
        ] {
            assert!(s.contains(want), "{want} missing from\n{s}");
        }
        let r = render_any(&AnyStatus::Relay(relay_sample()));
        for want in [
            "role=\"relay\"",
            "mt6d_relay_link_up{link=\"relay\",state=\"up\"} 1",
            "mt6d_relay_link_cost{link=\"relay\"} 12",
            "mt6d_relay_link_rtt_seconds{link=\"relay\"} 0.0015",
            "mt6d_relay_link_probes_lost{link=\"relay\"} 1",
            "mt6d_relay_e2e_routed{peer=\"a-to-b\"} 1",
            "mt6d_relay_worker_datagrams_total{worker=\"0\",direction=\"tx\"} 41",
            "mt6d_worker_placement{worker=\"0\",placement=\"light\"} 1",
            "mt6d_relay_events_total{event=\"drop_bad_tag\"} 4",
        ] {
            assert!(r.contains(want), "{want} missing from\n{r}");
        }
        let g = render_any(&AnyStatus::Gateway(Box::new(sample())));
        assert!(g.contains("role=\"gateway\""), "{g}");
    }

    /// The example dashboard queries only metrics the endpoint exposes.
    #[test]
    fn the_example_dashboard_names_only_exposed_metrics() {
        let dashboard = include_str!("../../../examples/grafana-mt6d.json");
        let _: serde_json::Value = serde_json::from_str(dashboard).unwrap();
        let exposed = render(&sample());
        let mut names = std::collections::BTreeSet::new();
        for (i, _) in dashboard.match_indices("mt6d_") {
            let name: String = dashboard[i..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect();
            names.insert(name);
        }
        names.remove("mt6d_");
        assert!(names.len() >= 8, "{names:?}");
        for name in names {
            assert!(
                exposed.contains(&format!("# TYPE {name} ")),
                "the dashboard queries {name}, which is not exposed"
            );
        }
    }
}
