//! What `mt6d status` shows for a server (docs/CONFIG.md "The server role").

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// What `mt6d status` shows for a server (`role` tells it from a gateway's status).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Always `server`.
    pub role: String,
    pub version: String,
    pub pid: u32,
    pub uptime_secs: u64,
    pub config: String,
    pub prefix: String,
    pub tun: String,
    pub clients: u64,
    /// Handshake clients with live keys.
    pub sessions: u64,
    /// Their route sets indexed besides their link sets.
    pub session_route_sets: u64,
    /// The workers' counters (docs/CONFIG.md lists them).
    pub counters: BTreeMap<String, u64>,
    /// What each data-plane worker moved since start, by worker index (absent from older
    /// daemons).
    #[serde(default)]
    pub workers: Vec<super::WorkerStatus>,
}

/// `mt6d status` of a server, for people.
pub fn render(s: &ServerStatus) -> String {
    let mut out = format!(
        "mt6d {} server (pid {}), up {} s, {}\n  prefix {}/64, TUN {}\n  clients {}, live sessions {} ({} session route sets)\n  counters:",
        s.version, s.pid, s.uptime_secs, s.config, s.prefix, s.tun, s.clients, s.sessions, s.session_route_sets
    );
    out.push_str(&crate::status::nonzero_counters(&s.counters));
    out.push('\n');
    if let Some(line) = super::text::workers_line(&s.workers) {
        out.push_str("  ");
        out.push_str(&line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_renders_what_a_person_needs() {
        let s = ServerStatus {
            role: "server".into(),
            version: "1".into(),
            pid: 7,
            uptime_secs: 3,
            config: "/etc/mt6d/server.toml".into(),
            prefix: "2001:db8:5::".into(),
            tun: "mt6ds0".into(),
            clients: 10,
            sessions: 2,
            session_route_sets: 2,
            counters: [
                ("rx_packets".to_string(), 5),
                ("rx_rejected".to_string(), 0),
            ]
            .into_iter()
            .collect(),
            workers: vec![crate::status::WorkerStatus {
                sealed: 4,
                opened: 5,
                wakeups: 6,
                placement: crate::status::Placement::Light { cpu: 0 },
            }],
        };
        let r = render(&s);
        assert!(r.contains("clients 10, live sessions 2"), "{r}");
        assert!(
            r.contains("data-plane workers 1: #0 sealed 4 opened 5 (light, on CPU 0)"),
            "{r}"
        );
        assert!(
            r.contains("rx_packets=5") && !r.contains("rx_rejected"),
            "{r}"
        );
    }
}
