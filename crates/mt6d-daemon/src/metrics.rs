//! The optional Prometheus endpoint (`metrics_listen` in `[gateway]`, off by default).
//!
//! What it exposes is the `mt6d status` snapshot, rendered in the Prometheus text format by the
//! `prometheus-client` crate: the daemon's housekeeping loop publishes a fresh [`Status`] about
//! once a second ([`Published`]), and a thread of its own answers scrapes from the newest one.
//! So a slow or hostile client on the metrics address can hold up only that thread, never a
//! rotation or a packet, and scraping costs the packet threads nothing.
//!
//! Names follow the Prometheus conventions: the `mt6d_` prefix, base units in the name
//! (`_bytes`, `_seconds`), `_total` on counters (added by the encoder), one label per dimension
//! (`peer`, `reason`, `direction`). Only `GET /metrics` is answered; anything else gets a 404.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use arc_swap::ArcSwapOption;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::status::Status;

type Labels = Vec<(&'static str, String)>;

/// The newest status snapshot, shared between the housekeeping loop and the metrics thread.
pub type Published = ArcSwapOption<Status>;

/// Renders `st` in the Prometheus text exposition format.
pub fn render(st: &Status) -> String {
    let mut registry = Registry::default();
    let counter = |r: &mut Registry, name: &str, help: &str| {
        let f = Family::<Labels, Counter>::default();
        r.register(name, help, f.clone());
        f
    };
    let gauge = |r: &mut Registry, name: &str, help: &str| {
        let f = Family::<Labels, Gauge>::default();
        r.register(name, help, f.clone());
        f
    };
    let info = gauge(
        &mut registry,
        "mt6d_build_info",
        "Always 1: the version and role of this daemon",
    );
    info.get_or_create(&vec![
        ("version", st.version.clone()),
        ("role", st.role.clone()),
        ("tun", st.tun.clone()),
    ])
    .set(1);
    gauge(
        &mut registry,
        "mt6d_uptime_seconds",
        "Seconds since the daemon started",
    )
    .get_or_create(&vec![])
    .set(clamp(st.uptime_secs));
    gauge(
        &mut registry,
        "mt6d_tunnel_mtu_bytes",
        "MTU of the TUN device: what the tunnel carries per inner packet",
    )
    .get_or_create(&vec![])
    .set(i64::from(st.path.tunnel_mtu));
    let kernel = counter(
        &mut registry,
        "mt6d_kernel_drops",
        "Packets the kernel dropped in the queues in front of the data-plane workers, by queue (socket_queue: a tunnel socket's receive queue, tun_queue: the TUN transmit queue, tun_write: refused TUN writes)",
    );
    let k = &st.kernel_drops;
    for (queue, n) in [
        ("socket_queue", k.socket_queue),
        ("tun_queue", k.tun_queue),
        ("tun_write", k.tun_write),
    ] {
        kernel
            .get_or_create(&vec![("queue", queue.to_string())])
            .inc_by(n);
    }
    let worker = counter(
        &mut registry,
        "mt6d_worker_packets",
        "Inner packets each data-plane worker carried, by worker and direction (tx: read from its TUN queue and sealed, rx: opened and written to it)",
    );
    for (i, w) in st.workers.iter().enumerate() {
        for (direction, n) in [("tx", w.sealed), ("rx", w.opened)] {
            worker
                .get_or_create(&vec![
                    ("worker", i.to_string()),
                    ("direction", direction.to_string()),
                ])
                .inc_by(n);
        }
    }
    let placement = gauge(
        &mut registry,
        "mt6d_worker_placement",
        "Where each data-plane worker runs, one series per state, 1 for the current one (light: on the one CPU light workers share, bulk: on every CPU, unplaced: one CPU allowed or the kernel refused a move)",
    );
    for (i, w) in st.workers.iter().enumerate() {
        use crate::status::Placement as At;
        for (state, now) in [
            ("light", matches!(w.placement, At::Light { .. })),
            ("bulk", w.placement == At::Bulk),
            ("unplaced", w.placement == At::Unplaced),
        ] {
            placement
                .get_or_create(&vec![
                    ("worker", i.to_string()),
                    ("placement", state.to_string()),
                ])
                .set(i64::from(now));
        }
    }

    let packets = counter(
        &mut registry,
        "mt6d_peer_packets",
        "Inner packets carried, by peer and direction (tx: sealed and sent, rx: opened and delivered)",
    );
    let bytes = counter(
        &mut registry,
        "mt6d_peer_bytes",
        "Inner bytes carried, by peer and direction",
    );
    let drops = counter(
        &mut registry,
        "mt6d_peer_drops",
        "Packets dropped, by peer and reason (both directions)",
    );
    let rotations = counter(
        &mut registry,
        "mt6d_peer_rotations",
        "Epoch changes (hashed address and port rotations)",
    );
    let moves = counter(
        &mut registry,
        "mt6d_peer_routes_moved",
        "Routes moved away from an address collision, ours or the peer's",
    );
    let collisions = counter(
        &mut registry,
        "mt6d_peer_collisions_detected",
        "Collisions on this gateway's hashed addresses that moved a route",
    );
    let handshakes = counter(
        &mut registry,
        "mt6d_peer_handshakes",
        "Handshakes completed (the first and every rekey)",
    );
    let rekeys = counter(
        &mut registry,
        "mt6d_peer_rekeys",
        "Handshakes that replaced earlier keys",
    );
    let failures = counter(
        &mut registry,
        "mt6d_peer_handshake_failures",
        "Handshake messages refused, by reason",
    );
    let key_age = gauge(
        &mut registry,
        "mt6d_peer_key_age_seconds",
        "Age of the current session keys (handshake peers with keys only)",
    );
    let has_keys = gauge(
        &mut registry,
        "mt6d_peer_has_keys",
        "1 while the peer has session keys (handshake peers), else 0",
    );
    let since_rx = gauge(
        &mut registry,
        "mt6d_peer_last_receive_age_seconds",
        "Seconds since a packet from the peer last opened (absent before the first)",
    );
    let tcp_events = counter(
        &mut registry,
        "mt6d_peer_tcp_segments",
        "TCP segments by what the identity option policy and MSS clamping did, by peer, direction (out: into the tunnel) and event",
    );
    let rule_hits = counter(
        &mut registry,
        "mt6d_peer_host_id_rule_matches",
        "Matches of each host_id rule, by peer, direction and rule (as written)",
    );
    for p in &st.peers {
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
    for p in &st.peers {
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
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = encode(&mut out, &registry);
    text_format(&out)
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
            render(&st),
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
            published.store(Some(Arc::new(sample())));
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
