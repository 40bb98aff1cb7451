//! The relay role (seed 003; docs/CONFIG.md "The relay role", docs/ARCHITECTURE.md
//! "Relays"): one node of a relay network, driving the protocol crate's sans-IO
//! [`mt6d_proto::relay::node::RelayNode`] with real sockets.
//!
//! * The node's hashed /64 is local as a whole (one AnyIP route) and one nftables rule hands
//!   every UDP datagram to it to one transparent socket, as the server role does
//!   ([`crate::daemon::anyip`]); the datagram's (source, destination) names its link
//!   ([`RelayNode::link_of`]). Whatever the node sends leaves through one raw UDP socket from
//!   exactly the link's hashed address and port of the epoch. Nothing per address or port is
//!   added to the kernel at rotation.
//! * An edge gateway has a TUN device: each end-to-end peer's remote host is routed into it
//!   (behind a `prohibit` guard route that keeps it unreachable after a crash), and inner packets
//!   delivered to this node are written to it.
//! * `workers` threads ([`dataplane`]; one per online CPU by default) each receive on their own
//!   transparent socket of the node's port (SO_REUSEPORT) and, at an edge, read and write their
//!   own queue of the TUN device. A relay node is one state machine (its routing table, every
//!   link's monitor, keys and replay window): the workers share it behind one lock, and make
//!   their system calls and the AEAD without it.

pub mod dataplane;
pub mod reload;

use std::fmt::Write as _;
use std::path::Path;
use std::time::Instant;

use mt6d_os::{RawUdp6, Tun, UdpSocket6};
use mt6d_proto::endpoint::IndexSeed;
use mt6d_proto::handshake::Handshake;
use mt6d_proto::relay::e2e::e2e_relay_payload_len;
use mt6d_proto::relay::frame::HEADER_LEN;
use mt6d_proto::relay::node::{E2eId, RelayNode};
use mt6d_proto::relay::table::Neighbour;
use mt6d_proto::Stream;

use crate::config::RelayConfig;
use crate::daemon::anyip::ndp::NdpResponder;
use crate::daemon::anyip::{os, PrefixSystem, SystemError, TunSpec};
use crate::daemon::clock;
use crate::daemon::signals::Signals;

/// A relay start-up or run failure, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum RelayError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error(transparent)]
    Generation(#[from] crate::daemon::psk_counters::GenerationError),
    #[error(transparent)]
    Privilege(#[from] crate::daemon::privilege::PrivilegeError),
    #[error("{0}")]
    Setup(String),
    /// A data-plane worker ended with an error or a panic, which stopped the node.
    #[error("{0}")]
    Worker(String),
}

/// The sockets and device the data plane works with.
#[allow(missing_debug_implementations)] // file descriptors only
pub struct RelayIo {
    /// One transparent socket per worker, all on the node's port (SO_REUSEPORT).
    pub sockets: Vec<UdpSocket6>,
    pub raw: RawUdp6,
    /// An edge gateway's TUN device, one queue per worker (empty for a pure relay).
    pub tuns: Vec<Tun>,
    /// Answers Neighbour Solicitations for the links' current addresses, one per interface a
    /// link leaves on (`neighbor_discovery`; empty without it).
    pub ndp: Vec<NdpResponder>,
}

/// The largest inner packet an edge gateway carries in a frame of `frame_max` bytes: its TUN
/// device's MTU.
pub fn inner_mtu(frame_max: usize) -> usize {
    let overhead = e2e_relay_payload_len(1280) - 1280 + HEADER_LEN;
    frame_max.saturating_sub(overhead)
}

/// Builds the node from the configuration: every link and end-to-end peer with its handshake
/// (or a link's pre-shared key), pre-shared send counters from the run's
/// generation, fresh randomness for handshakes from the OS. Link `i` of the file is
/// `Neighbour(i)`, end-to-end peer `j` is `E2eId(j)`. A pure relay's identity keys its links
/// only: it is no routing destination.
pub fn build_node(
    cfg: &RelayConfig,
    counters: crate::daemon::psk_counters::CounterRange,
) -> Result<RelayNode, RelayError> {
    let now = clock::now();
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed)
        .map_err(|e| RelayError::Setup(format!("draw the route tag index seed: {e}")))?;
    let own = cfg.node_id.filter(|_| cfg.is_edge());
    let mut node = RelayNode::new(
        now,
        own,
        cfg.transit,
        cfg.frame_max,
        IndexSeed::from_bytes(seed),
    )
    .map_err(|e| RelayError::Setup(format!("{}: {e}", cfg.path.display())))?;
    node.set_entropy(Box::new(|| {
        let mut bytes = [0u8; 32];
        getrandom::fill(&mut bytes).ok().map(|()| bytes)
    }));
    for (i, l) in cfg.links.iter().enumerate() {
        let setup =
            |e: &dyn std::fmt::Display| RelayError::Setup(format!("link {:?}: {e}", l.name));
        let stream = Stream::new(l.stream.clone()).map_err(|e| setup(&e))?;
        match &l.handshake {
            Some(hs) => {
                let hs = Handshake::new(hs.clone()).map_err(|e| setup(&e))?;
                node.add_link_handshake(now, neighbour(i), stream, hs)
            }
            None => {
                let sealer = run_sealer(&stream, counters);
                node.add_link(now, neighbour(i), stream, sealer)
            }
        }
        .map_err(|e| setup(&e))?;
    }
    for (j, e) in cfg.e2e.iter().enumerate() {
        let setup = |err: &dyn std::fmt::Display| {
            RelayError::Setup(format!("end-to-end peer {:?}: {err}", e.name))
        };
        let stream = Stream::new(e.stream.clone()).map_err(|err| setup(&err))?;
        match &e.handshake {
            Some(hs) => {
                let hs = Handshake::new(hs.clone()).map_err(|err| setup(&err))?;
                node.add_e2e_handshake(now, e2e_id(j), e.destination, stream, hs)
            }
            None => {
                let sealer = run_sealer(&stream, counters);
                node.add_e2e(now, e2e_id(j), e.destination, stream, sealer)
            }
        }
        .map_err(|err| setup(&err))?;
    }
    Ok(node)
}

/// A pre-shared link's or end-to-end peer's sealer: this run's counters, at most the key's
/// packet limit of them (docs/PROTOCOL.md §4.3).
fn run_sealer(
    stream: &Stream,
    counters: crate::daemon::psk_counters::CounterRange,
) -> mt6d_proto::Sealer {
    let limit = crate::daemon::psk_counters::packet_limit(stream.config().aead);
    stream
        .sealer(counters.first, counters.end)
        .with_key_limit(counters.first.saturating_add(limit).min(counters.end))
}

/// Link `i` of the file.
pub fn neighbour(i: usize) -> Neighbour {
    Neighbour(u32::try_from(i).unwrap_or(u32::MAX))
}

/// End-to-end peer `j` of the file.
pub fn e2e_id(j: usize) -> E2eId {
    E2eId(u32::try_from(j).unwrap_or(u32::MAX))
}

/// Runs the node until SIGTERM or SIGINT; what keeps it closed (guard routes, table, AnyIP
/// route) stays until the next start or `mt6d down` (`crate::daemon::anyip::finish`).
/// `mt6d check` of a relay node's file: the file and every key file, as `run` validates them;
/// what would run, for people.
pub fn check(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::new();
    let cfg = RelayConfig::load(path)?;
    let _ = writeln!(out, "{}: OK", path.display());
    let role = match (cfg.is_edge(), cfg.transit) {
        (true, true) => "edge gateway and relay",
        (true, false) => "edge gateway",
        (false, _) => "relay",
    };
    let _ =
        writeln!(
        out,
        "  {role}: node id {}, prefix {}/64, external {}, frame_max {}, links rotate every {:?}{}",
        cfg.node_id
            .map_or_else(|| "(none)".to_string(), |n| n.to_string()),
        cfg.prefix(),
        cfg.external_interface,
        cfg.frame_max,
        cfg.stream.rotation,
        if cfg.stream.jitter { " with jitter" } else { "" }
    );
    for l in &cfg.links {
        let _ = writeln!(
            out,
            "  link {}: neighbour at {} (its /64 must be routed towards it)",
            l.name, l.address
        );
    }
    for e in &cfg.e2e {
        let _ = writeln!(
            out,
            "  end-to-end {}: {} -> {} behind {} (routed into {})",
            e.name,
            e.stream.local.true_addr,
            e.stream.remote.true_addr,
            e.destination,
            cfg.tun_name
        );
    }
    let _ = writeln!(out, "  control socket {}", cfg.control_socket.display());
    Ok(out)
}

/// The relay role (a relay network node, an edge gateway, or both).
#[derive(Debug, Clone, Copy)]
pub struct Relay;

impl crate::daemon::Role for Relay {
    fn check(&self, config: &Path) -> Result<String, Box<dyn std::error::Error>> {
        check(config)
    }
    fn run(&self, config: &Path) -> Result<(), Box<dyn std::error::Error>> {
        run(config)
    }
    fn down(&self, config: &Path) -> Result<(), Box<dyn std::error::Error>> {
        down(config)
    }
}

pub fn run(config_path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = RelayConfig::load(config_path)?;
    crate::daemon::privilege::check_all()?;
    let signals = Signals::install()?;
    // What worker 0 sleeps on besides its socket (docs/ARCHITECTURE.md, "Main loops").
    let wait = crate::daemon::wakeup::MainWait::new(&signals)?;
    let mtu = inner_mtu(cfg.frame_max);
    if cfg.is_edge() && mtu < 1280 {
        return Err(format!(
            "{}: frame_max {} leaves inner packets {mtu} bytes, below IPv6's 1280: raise frame_max on every node",
            config_path.display(),
            cfg.frame_max
        )
        .into());
    }
    mt6d_os::secrets::set_non_dumpable()
        .map_err(|e| RelayError::Setup(format!("mark the process non-dumpable: {e}")))?;
    let counters = crate::daemon::psk_counters::reserve_run(&cfg.state_dir)?;
    let started = Instant::now();
    let node = build_node(&cfg, counters)?;
    let mut system = system(&cfg)?;
    let result = set_up(&mut system, &cfg, mtu)
        .and_then(|io| dataplane::serve(&cfg, node, io, &signals, started, wait));
    crate::daemon::anyip::finish(result, &mut system, &signals)
}

/// `mt6d down -c FILE` for a relay node: removes the guard routes (an edge gateway's), the
/// nftables table and the AnyIP route a stopped or dead node left. Refuses while the node runs (it
/// answers on its control socket).
pub fn down(config_path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = RelayConfig::load(config_path)?;
    crate::daemon::privilege::check_run()?;
    if crate::control::query_any_status(&cfg.control_socket).is_ok() {
        return Err(format!(
            "the relay node for {} is running (it answers on {}); stop it first (SIGTERM), then run `mt6d down` again",
            config_path.display(),
            cfg.control_socket.display()
        )
        .into());
    }
    let mut system = system(&cfg)?;
    system.prefix_added = true;
    system.table_loaded = true;
    system.guards = guard_routes(&cfg);
    let mut left = system.tear_down();
    left.extend(system.lift_guards());
    if left.is_empty() {
        println!(
            "nothing of the relay node for {} is left (removed where present: nftables table {}, AnyIP route {}/64{})",
            config_path.display(),
            system.table_spec(),
            cfg.prefix(),
            if cfg.is_edge() {
                ", guard routes for its end-to-end peers' remote hosts"
            } else {
                ""
            }
        );
        Ok(())
    } else {
        Err(left.join("; ").into())
    }
}

fn system(cfg: &RelayConfig) -> Result<PrefixSystem, RelayError> {
    Ok(PrefixSystem::new(
        &format!("mt6d_relay_{}", cfg.tun_name),
        cfg.prefix(),
    )?)
}

/// The remote hosts of an edge gateway's end-to-end peers, one /128 each.
fn guard_routes(cfg: &RelayConfig) -> Vec<(std::net::Ipv6Addr, u8)> {
    let mut routes: Vec<_> = cfg
        .e2e
        .iter()
        .map(|e| (e.stream.remote.true_addr, 128))
        .collect();
    routes.sort();
    routes.dedup();
    routes
}

/// Guard routes and the TUN device (edge gateways), the AnyIP route and the nftables table, the
/// transparent and the raw socket.
fn set_up(system: &mut PrefixSystem, cfg: &RelayConfig, mtu: usize) -> Result<RelayIo, RelayError> {
    system.check_interface(&cfg.external_interface, "external interface")?;
    for l in &cfg.links {
        system.check_interface(&l.interface, &format!("interface of link {:?}", l.name))?;
    }
    let workers = cfg.worker_count();
    let tuns = if cfg.is_edge() {
        let routes = guard_routes(cfg);
        system.add_guards(&routes)?;
        let mtu = u16::try_from(mtu).map_err(|_| RelayError::Setup("MTU out of range".into()))?;
        system.create_tun(&TunSpec {
            name: &cfg.tun_name,
            mtu,
            queues: workers,
            address: None,
            routes: &routes,
        })?
    } else {
        Vec::new()
    };
    system.claim_prefix(&crate::daemon::anyip::ruleset(
        cfg.prefix(),
        cfg.listen_port,
    ))?;
    let sockets = (0..workers)
        .map(|k| {
            UdpSocket6::bind_transparent(crate::daemon::anyip::TPROXY_ADDR, cfg.listen_port)
                .map_err(os(format!(
                    "open transparent socket {} of {workers} on port {}",
                    k + 1,
                    cfg.listen_port
                )))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let raw = RawUdp6::open().map_err(os("open a raw UDP socket"))?;
    let mut ndp = Vec::new();
    if cfg.neighbor_discovery {
        for interface in cfg.link_interfaces() {
            let mac = system.link_mac(interface)?.ok_or_else(|| {
                RelayError::Setup(format!(
                    "{interface} has no link-layer address: set neighbor_discovery = false (and route each node's /64 to it)"
                ))
            })?;
            ndp.push(
                NdpResponder::open(interface, mac)
                    .map_err(os(format!("open the neighbour responder on {interface}")))?,
            );
        }
    }
    Ok(RelayIo {
        sockets,
        raw,
        tuns,
        ndp,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;
    use mt6d_proto::{AeadAlg, Endpoint, Epoch, SealError, SessionKey, StreamConfig};

    #[test]
    fn a_pre_shared_link_seals_within_its_run_and_its_key_limit() {
        let mut cfg = StreamConfig::new(
            Endpoint::new("2001:db8:a::1".parse().unwrap()),
            Endpoint::new("2001:db8:b::2".parse().unwrap()),
            SessionKey::from_bytes(&[9; 32]).unwrap(),
        );
        cfg.aead = AeadAlg::Aes256Gcm;
        let stream = Stream::new(cfg).unwrap();
        let run = crate::daemon::psk_counters::CounterRange {
            first: 3 << 40,
            end: 4 << 40,
        };
        let sealer = run_sealer(&stream, run);
        let route = stream.route(Epoch(1));
        let mut out = [0u8; 64];
        sealer.seal_keepalive(&route, &mut out).unwrap();
        assert_eq!(u64::from_be_bytes(out[..8].try_into().unwrap()), 3 << 40);
        // RFC 9001 §6.6: 2^23 packets under one AES-GCM key in this run, then refusals.
        for i in 1..1u64 << 23 {
            assert!(
                sealer.seal_keepalive(&route, &mut out).is_ok(),
                "packet {i}"
            );
        }
        assert_eq!(
            sealer.seal_keepalive(&route, &mut out),
            Err(SealError::KeyLimit)
        );
    }
}
