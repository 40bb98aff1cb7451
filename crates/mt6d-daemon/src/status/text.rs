//! `mt6d status` of a gateway, for people: what the daemon reports, one line per subject, and
//! per peer its epoch, keys, routes and counters.

use std::fmt::Write as _;

use super::{PeerStatus, Status, WorkerStatus};

/// Human-readable status, as `mt6d status` prints without `--json`.
pub fn render(status: &Status) -> String {
    let mut s = String::new();
    daemon(&mut s, status);
    for p in &status.peers {
        peer(&mut s, p);
    }
    s
}

/// The daemon's lines: its interfaces, queues, workers, path MTU and router advertisements.
fn daemon(s: &mut String, status: &Status) {
    let inside = if status.role == "host" {
        "host mode".to_string()
    } else {
        format!("internal {}", status.internal_interface)
    };
    let _ = writeln!(
        s,
        "mt6d {} pid {} up {}s  tun {}  {inside}  external {}",
        status.version, status.pid, status.uptime_secs, status.tun, status.external_interface
    );
    if !status.interfaces.is_empty() {
        let list: Vec<String> = status
            .interfaces
            .iter()
            .map(|i| {
                format!(
                    "{} {} (#{}) {} for {}s",
                    i.role, i.name, i.index, i.state, i.since_secs
                )
            })
            .collect();
        let _ = writeln!(s, "interfaces: {}", list.join(", "));
    }
    let k = &status.kernel_drops;
    let _ = writeln!(
        s,
        "kernel queue drops: socket receive queues {}, TUN transmit queue {}, refused TUN writes {}",
        k.socket_queue, k.tun_queue, k.tun_write
    );
    if let Some(line) = workers_line(&status.workers) {
        let _ = writeln!(s, "{line}");
    }
    let path = &status.path;
    let listed = |m: &std::collections::BTreeMap<String, u64>| {
        m.iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        s,
        "tunnel MTU {} (from the external MTU: {})  ICMPv6 translated [{}] dropped [{}]  neighbour solicitations {}",
        path.tunnel_mtu,
        path.base_mtu,
        listed(&path.icmp_translated),
        listed(&path.icmp_dropped),
        path.neighbor_solicitations
    );
    let narrower: Vec<String> = path
        .peer_mtu
        .iter()
        .filter(|(_, m)| **m < path.tunnel_mtu)
        .map(|(p, m)| format!("{p} {m}"))
        .collect();
    if !narrower.is_empty() {
        let _ = writeln!(s, "path MTU below the tunnel MTU: {}", narrower.join(", "));
    }
    let r = &path.router;
    if r.enabled {
        let upstream = match r.upstream_mtu {
            0 => "none heard".to_string(),
            m => m.to_string(),
        };
        let _ = writeln!(
            s,
            "router advertisements: MTU {} sent {} solicitations answered {}  upstream MTU {} ({} heard) dropped [{}]",
            r.advertised_mtu,
            r.advertisements_sent,
            r.solicitations_answered,
            upstream,
            r.upstream_advertisements,
            listed(&r.dropped)
        );
    } else {
        let _ = writeln!(
            s,
            "router advertisements: off (router_advertisements = false)"
        );
    }
}

/// The data-plane workers' line of `mt6d status` (every role): what each sealed and opened and
/// where it runs; `None` for a daemon that reported no workers.
pub fn workers_line(workers: &[WorkerStatus]) -> Option<String> {
    if workers.is_empty() {
        return None;
    }
    let list: Vec<String> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| {
            format!(
                "#{i} sealed {} opened {} ({})",
                w.sealed, w.opened, w.placement
            )
        })
        .collect();
    Some(format!(
        "data-plane workers {}: {}",
        workers.len(),
        list.join(", ")
    ))
}

/// One peer's lines: epoch, keys, moves, routes, traffic, drops and TCP policy.
fn peer(s: &mut String, p: &PeerStatus) {
    let c = &p.counters;
    let _ = writeln!(
        s,
        "\npeer {} ({}): {} <-> {}",
        p.name, p.mode, p.local_host, p.remote_host
    );
    let _ = writeln!(
        s,
        "  epoch {}  next rotation in {:.1}s  rotations {}  last packet received {}",
        p.epoch,
        p.next_change_ms as f64 / 1000.0,
        c.rotations,
        p.last_rx_ms_ago.map_or("never".to_string(), |ms| format!(
            "{:.1}s ago",
            ms as f64 / 1000.0
        ))
    );
    keys(s, p);
    let m = &p.moves;
    if m.routes_moved > 0 || m.collisions_unresolved > 0 || m.notices_refused > 0 {
        let _ = writeln!(
            s,
            "  address collisions {} (unresolved {})  routes moved {} (by the peer {})  notices sent {} acks {} received {} refused {}",
            m.collisions_detected,
            m.collisions_unresolved,
            m.routes_moved,
            m.moved_by_peer,
            m.notices_sent,
            m.acks_sent,
            m.notices_received,
            m.notices_refused
        );
    }
    route_sets(s, p);
    for r in &p.accept {
        let _ = writeln!(
            s,
            "  accepting epoch {}: {} <- {}",
            r.epoch, r.local, r.remote
        );
    }
    let _ = writeln!(
        s,
        "  tx {} packets {} bytes   rx {} packets {} bytes",
        c.tx_packets, c.tx_bytes, c.rx_packets, c.rx_bytes
    );
    let drops: Vec<String> = c
        .drops
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(k, n)| format!("{k} {n}"))
        .collect();
    let _ = writeln!(
        s,
        "  drops {}",
        if drops.is_empty() {
            "none".to_string()
        } else {
            drops.join(", ")
        }
    );
    tcp_policy(s, p);
}

/// The peer's keys: pre-shared, or its handshake's state and failures.
fn keys(s: &mut String, p: &PeerStatus) {
    match &p.handshake {
        None => {
            let _ = writeln!(s, "  keys     {}", p.keying);
        }
        Some(h) => {
            let ago = |ms: Option<u64>| {
                ms.map_or("never".to_string(), |ms| {
                    format!("{:.1}s ago", ms as f64 / 1000.0)
                })
            };
            let _ = writeln!(
                s,
                "  handshake {}  last {}  key {}  handshakes {}  rekeys {}  initiations {}  responses {}",
                if h.has_keys { "up" } else { "DOWN (no keys)" },
                ago(h.last_handshake_ms_ago),
                h.send_key_id.as_deref().unwrap_or("-"),
                h.handshakes,
                h.rekeys,
                h.initiations_sent,
                h.responses_sent
            );
            if !h.failures.is_empty() {
                let f: Vec<String> = h.failures.iter().map(|(k, n)| format!("{k} {n}")).collect();
                let _ = writeln!(s, "  handshake failures {}", f.join(", "));
            }
        }
    }
}

/// Where the peer sends now and on which route set, with every set bound.
fn route_sets(s: &mut String, p: &PeerStatus) {
    let _ = writeln!(s, "  sending  {} -> {}", p.send.local, p.send.remote);
    if let Some(set) = p.route_sets.iter().find(|r| r.sending) {
        let bound: Vec<String> = p
            .route_sets
            .iter()
            .map(|r| {
                format!(
                    "{} {}{}",
                    r.kind,
                    r.id,
                    if r.data { "" } else { " (handshakes only)" }
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "  route set {} {} (bound: {})",
            set.kind,
            set.id,
            bound.join(", ")
        );
    }
}

/// What the peer's TCP policy did, by direction.
fn tcp_policy(s: &mut String, p: &PeerStatus) {
    for t in &p.tcp {
        let events: Vec<String> = t
            .events
            .iter()
            .filter(|(_, n)| **n > 0)
            .map(|(k, n)| format!("{k} {n}"))
            .collect();
        let rules: Vec<String> = t
            .rules
            .iter()
            .enumerate()
            .map(|(i, r)| format!("#{} {}: {}", i + 1, r.rule, r.hits))
            .collect();
        if events.is_empty() && rules.is_empty() {
            continue;
        }
        let _ = writeln!(
            s,
            "  tcp {:<3} {}{}{}",
            t.direction,
            if events.is_empty() {
                "nothing yet".to_string()
            } else {
                events.join(", ")
            },
            if rules.is_empty() { "" } else { "; rules " },
            rules.join(", ")
        );
    }
}
