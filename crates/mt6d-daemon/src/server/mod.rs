//! The server role (seed 002's one server; docs/ARCHITECTURE.md, "The server role"): one daemon for
//! many clients, each on hashed addresses of its own, with no per-client state in the kernel.
//!
//! * one AnyIP route makes the server's hashed /64 local as a whole;
//! * one nftables table (the daemon's own, replaced atomically) hands every UDP datagram to the
//!   /64 to the workers' transparent sockets on one port, and drops everything else sent to the
//!   /64, so no address of it answers a ping, a TCP probe or a datagram to a wrong port;
//! * the workers ([`dataplane`]) find each datagram's client by the (address, port) it was sent
//!   to, in the million-peer index ([`registry`]), and answer through raw sockets from exactly
//!   that address and port;
//! * the main thread advances each client's window at its own boundary (one deadline per client,
//!   spread by the clients' jitter), answers Neighbour Solicitations for current addresses only
//!   ([`ndp`]), and applies the peers file again on SIGHUP.
//!
//! This version serves clients with pre-shared session keys (`key=` in the peers file); it runs
//! no handshake yet.

pub mod control;
pub mod dataplane;
mod receive;
pub mod shared;
pub use crate::daemon::anyip::ndp;
pub mod registry;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, PoisonError};

use parking_lot::{RwLock, RwLockWriteGuard};
use std::time::{Duration, Instant};

use mt6d_os::{Netlink, RawUdp6, UdpSocket6};
use mt6d_proto::endpoint::{IndexSeed, PeerId};
use mt6d_proto::{Stream, UnixTime};

use crate::config::{ClientConfig, ServerConfig};
use crate::daemon::clock;
use crate::daemon::signals::Signals;
use crate::daemon::wakeup::{Deadlines, MainWait};
use ndp::NdpResponder;
use registry::{Registry, StepReport};
use shared::{ServerCounters, Shared, WorkerIo};

/// Shortest: clients' boundaries due within it are advanced together (a window holds the
/// epochs on both sides of the current one, so a client's boundary passed a few milliseconds
/// ago loses nothing), instead of one wake-up per client at a thousand clients' jittered
/// boundaries per second.
const MIN_WAIT: Duration = Duration::from_millis(10);
/// Clients whose boundary the main thread advances under one hold of the registry's write lock
/// (at about 2.3 us each at a million clients, some 150 us): the longest a worker waits for a
/// rotation step.
const STEP_CHUNK: usize = 64;
/// Solicitations handled per wake-up before the main thread looks at its deadlines again.
const NDP_BUDGET: usize = 256;
/// How often the counters are logged (at info) while anything moves.
const REPORT_EVERY: Duration = Duration::from_secs(60);
/// How often the metrics thread's snapshot is refreshed.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// A server start-up or run failure, with what was being done.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error("{what}: {source}")]
    Os {
        what: String,
        source: mt6d_os::OsError,
    },
    #[error(transparent)]
    Generation(#[from] crate::daemon::psk_counters::GenerationError),
    #[error(transparent)]
    Registry(#[from] registry::RegistryError),
    #[error(transparent)]
    Privilege(#[from] crate::daemon::privilege::PrivilegeError),
    #[error(transparent)]
    System(#[from] SystemError),
    #[error("{0}")]
    Setup(String),
}

fn os(what: impl Into<String>) -> impl FnOnce(mt6d_os::OsError) -> ServerError {
    let what = what.into();
    move |source| ServerError::Os { what, source }
}

use crate::daemon::anyip::{PrefixSystem, SystemError, TunSpec};

/// Runs the server until SIGTERM or SIGINT; what keeps it closed (guard routes, table, AnyIP
/// route) stays until the next start or `mt6d down` (`crate::daemon::anyip::finish`).
/// `mt6d check` of a server role file: the file and its peers file, as `run` validates them;
/// what would run, for people.
pub fn check(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::new();
    let cfg = ServerConfig::load(path)?;
    let clients = cfg.clients()?;
    let _ = writeln!(out, "{}: OK", path.display());
    let _ = writeln!(
        out,
        "  server: prefix {}/64  true address {} on {}  external {}  {} workers",
        cfg.prefix,
        cfg.true_address,
        cfg.tun_name,
        cfg.external_interface,
        cfg.worker_count()
    );
    let handshaking = clients.iter().filter(|c| c.handshake.is_some()).count();
    let _ = writeln!(
        out,
        "  {} clients from {} ({handshaking} with handshakes, {} with pre-shared session keys), rotation {:?}, mode {:?}",
        clients.len(),
        cfg.peers_file.display(),
        clients.len() - handshaking,
        cfg.stream.rotation,
        cfg.stream.mode
    );
    if let Some(k) = &cfg.private_key {
        let _ = writeln!(
            out,
            "  identity: public key {} (the clients' public_key), rekey {:?}",
            crate::keys::public_key_text(&k.public_key()),
            cfg.rekey_after
        );
    }
    let _ = writeln!(out, "  control socket {}", cfg.control_socket.display());
    Ok(out)
}

/// The server role (one server for many clients).
#[derive(Debug, Clone, Copy)]
pub struct Server;

impl crate::daemon::Role for Server {
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
    let cfg = ServerConfig::load(config_path)?;
    crate::daemon::privilege::check_all()?;
    let signals = Signals::install()?;
    // What the main thread sleeps on (docs/ARCHITECTURE.md, "Main loops").
    let wait = MainWait::new(&signals)?;
    // Everything is validated before the system is touched.
    let clients = cfg.clients()?;
    mt6d_os::secrets::set_non_dumpable()
        .map_err(|e| ServerError::Setup(format!("mark the process non-dumpable: {e}")))?;
    let counters = crate::daemon::psk_counters::reserve_run(&cfg.state_dir)?;
    let mut seed = [0u8; 16];
    getrandom::fill(&mut seed)
        .map_err(|e| ServerError::Setup(format!("draw the index seed from the OS: {e}")))?;
    let started = Instant::now();
    let mut registry = Registry::new(
        IndexSeed::from_bytes(seed),
        clients.len(),
        counters,
        cfg.neighbor_discovery,
    );
    registry.set_handshake_template(handshake_template(&cfg));
    if cfg.external_next_hop.is_some() {
        // Before the clients: their first windows are scheduled too.
        registry.enable_priming(cfg.stream.rotation, cfg.stream.jitter);
    }
    for (i, c) in clients.iter().enumerate() {
        // Each client joins at the time it is added, and the ones added earlier are advanced
        // as their boundaries pass: a million clients take seconds to add, and no backlog of
        // overdue windows may wait for the first step.
        let now = clock::now();
        if i % 65_536 == 0 {
            registry.step(now);
        }
        registry.add(c, now)?;
    }
    log::info!(
        "{} clients indexed in {:.2} s ({} with handshakes, {} with pre-shared keys)",
        registry.len(),
        started.elapsed().as_secs_f64(),
        clients.iter().filter(|c| c.handshake.is_some()).count(),
        clients.iter().filter(|c| c.handshake.is_none()).count(),
    );
    if cfg.neighbor_discovery {
        log::info!(
            "neighbour responder: {} hashed addresses valid now",
            registry.address_count()
        );
    }
    let shared = Arc::new(Shared {
        registry: RwLock::new(registry),
        counters: ServerCounters::default(),
        shutdown: std::sync::atomic::AtomicBool::new(false),
        resync: std::sync::Mutex::new(Vec::new()),
        wake: wait.nudge(),
        load: (0..cfg.worker_count())
            .map(|_| crate::daemon::worker::WorkerLoad::default())
            .collect(),
    });
    let mtu = tun_mtu(&cfg, &clients)?;
    let served = clients.len();
    // The registry holds what it needs of each client; the parsed file is not kept.
    drop(clients);
    // Bound before any kernel state changes: a taken port stops the start with nothing to undo.
    let metrics = cfg
        .metrics_listen
        .map(crate::metrics::MetricsServer::bind)
        .transpose()
        .map_err(|e| ServerError::Setup(e.to_string()))?;
    let mut system = system(&cfg)?;
    let result = set_up(&mut system, &cfg, mtu).and_then(|ios| {
        let run = Run {
            signals: &signals,
            wait,
            mtu,
            served,
            started,
            metrics,
        };
        serve(&cfg, &shared, ios, run)
    });
    shared.shutdown.store(true, Ordering::Relaxed);
    crate::daemon::anyip::finish(result, &mut system, &signals)
}

/// `mt6d down -c FILE` for a server: removes the guard routes, the nftables table and the
/// AnyIP route a stopped or dead server left (they keep its prefix closed and its answers to
/// clients off the external link until then). Refuses while the server runs (its TUN device
/// exists in this namespace): removing them under a live server would open the prefix.
pub fn down(config_path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = ServerConfig::load(config_path)?;
    crate::daemon::privilege::check_run()?;
    let mut system = system(&cfg)?;
    if system.link_exists(&cfg.tun_name) {
        return Err(format!(
            "{} exists: the server for {} is running; stop it first (SIGTERM), then run `mt6d down` again",
            cfg.tun_name,
            config_path.display()
        )
        .into());
    }
    system.prefix_added = true;
    system.table_loaded = true;
    system.guards = cfg.client_routes.clone();
    let mut left = system.tear_down();
    left.extend(system.lift_guards());
    if left.is_empty() {
        println!(
            "nothing of the server for {} is left (removed where present: nftables table {}, AnyIP route {}/64, guard routes for {})",
            config_path.display(),
            system.table_spec(),
            cfg.prefix,
            cfg.client_routes
                .iter()
                .map(|(p, l)| format!("{p}/{l}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(())
    } else {
        Err(left.join("; ").into())
    }
}

/// The TUN MTU: the external MTU minus what the tunnel adds.
fn tun_mtu(cfg: &ServerConfig, clients: &[ClientConfig]) -> Result<u16, ServerError> {
    let overhead = match clients.first() {
        Some(c) => Stream::new(c.stream.clone())
            .map_err(|e| ServerError::Setup(format!("client {:?}: {e}", c.name)))?
            .overhead(),
        // No client yet: the overhead of the mode (every client has the same).
        None => 80,
    };
    u16::try_from(usize::from(cfg.mtu).saturating_sub(overhead).max(1280))
        .map_err(|_| ServerError::Setup("MTU out of range".into()))
}

/// What the server adds to the system: guard routes for `client_routes`, the TUN device with the
/// true address and the client routes, the AnyIP route, the nftables table
/// ([`crate::daemon::anyip::PrefixSystem`]), then one transparent and one raw socket per worker.
fn system(cfg: &ServerConfig) -> Result<PrefixSystem, ServerError> {
    Ok(PrefixSystem::new(
        &format!("mt6d_server_{}", cfg.tun_name),
        cfg.prefix,
    )?)
}

fn set_up(
    system: &mut PrefixSystem,
    cfg: &ServerConfig,
    mtu: u16,
) -> Result<Vec<WorkerIo>, ServerError> {
    system.check_interface(&cfg.external_interface, "external interface")?;
    system.add_guards(&cfg.client_routes)?;
    let workers = cfg.worker_count();
    let tuns = system.create_tun(&TunSpec {
        name: &cfg.tun_name,
        mtu,
        queues: workers,
        address: Some(cfg.true_address),
        routes: &cfg.client_routes,
    })?;
    system.claim_prefix(&ruleset(cfg))?;
    let mut ios = Vec::with_capacity(workers);
    for tun in tuns {
        let socket =
            UdpSocket6::bind_transparent(crate::daemon::anyip::TPROXY_ADDR, cfg.listen_port)
                .map_err(os(format!(
                    "open a transparent socket on port {}",
                    cfg.listen_port
                )))?;
        let raw = RawUdp6::open().map_err(os("open a raw UDP socket"))?;
        ios.push(WorkerIo { socket, raw, tun });
    }
    Ok(ios)
}

/// The server's nftables table ([`crate::daemon::anyip::ruleset`] for its prefix and port).
pub fn ruleset(cfg: &ServerConfig) -> String {
    crate::daemon::anyip::ruleset(cfg.prefix, cfg.listen_port)
}

/// What a run of the server was started with, besides its configuration and state.
struct Run<'a> {
    signals: &'a Signals,
    wait: MainWait,
    mtu: u16,
    served: usize,
    started: Instant,
    metrics: Option<crate::metrics::MetricsServer>,
}

/// Starts one data-plane worker per I/O set; a worker that fails or panics stops the daemon.
fn spawn_workers(
    shared: &Arc<Shared>,
    ios: Vec<WorkerIo>,
    mtu: u16,
) -> Result<Vec<std::thread::JoinHandle<()>>, ServerError> {
    let mut handles = Vec::with_capacity(ios.len() + 1);
    for (i, io) in ios.into_iter().enumerate() {
        let s = Arc::clone(shared);
        let ended = shared.wake.on_drop();
        let h = std::thread::Builder::new()
            .name(format!("mt6d-s{i}"))
            .spawn(move || {
                // Wakes the main thread when the worker ends, however it ends.
                let _ended = ended;
                crate::daemon::worker::stop_all_if_it_panics(&s.shutdown, i, || {
                    if let Err(e) = dataplane::worker_loop(&s, &io, usize::from(mtu), i) {
                        log::error!("server worker {i}: {e}; stopping");
                        s.shutdown.store(true, Ordering::Relaxed);
                    }
                });
            })
            .map_err(|e| ServerError::Setup(format!("start worker {i}: {e}")))?;
        handles.push(h);
    }
    Ok(handles)
}

/// The neighbour responder and the primer of a server that does neighbour discovery (none
/// without): both answer and announce with the external interface's index and MAC.
fn neighbour_io(
    cfg: &ServerConfig,
) -> Result<
    (
        Option<NdpResponder>,
        Option<crate::daemon::neighbor::NeighborPrimer>,
    ),
    ServerError,
> {
    // The external interface's index and MAC, which the responder and the primer answer and
    // announce with (neighbour discovery only).
    let external = if cfg.neighbor_discovery {
        let mut nl = Netlink::open().map_err(os("open rtnetlink"))?;
        let ext = nl
            .link_index(&cfg.external_interface)
            .map_err(os(format!("find {}", cfg.external_interface)))?;
        let mac = nl
            .link_mac(ext)
            .map_err(os(format!("read the MAC of {}", cfg.external_interface)))?
            .ok_or_else(|| {
                ServerError::Setup(format!(
                    "{} has no link-layer address: set neighbor_discovery = false",
                    cfg.external_interface
                ))
            })?;
        Some((ext, mac))
    } else {
        None
    };
    let ndp = if let Some((_, mac)) = external {
        Some(
            NdpResponder::open(&cfg.external_interface, mac).map_err(os(format!(
                "open the neighbour responder on {}",
                cfg.external_interface
            )))?,
        )
    } else {
        None
    };
    let primer = match (cfg.external_next_hop, external) {
        (Some(hop), Some((ext, mac))) => {
            let p = crate::daemon::neighbor::NeighborPrimer::open(ext, mac, Some(hop))
                .map_err(|e| ServerError::Setup(format!("priming towards {hop}: {e}")))?;
            // The announcements leave from addresses of the AnyIP prefix, bound to nothing.
            p.allow_routed_sources()
                .map_err(os(format!("priming towards {hop}")))?;
            Some(p)
        }
        _ => None,
    };
    Ok((ndp, primer))
}

/// The registry's step at `now`: every client whose boundary passed moves on, in chunks that
/// let waiting workers in.
fn step_registry(shared: &Shared, now: mt6d_proto::UnixTime) {
    let mut step = StepReport::default();
    {
        let mut reg = shared.registry.write();
        while reg.step_at_most(now, STEP_CHUNK, &mut step) {
            // A worker waiting for its batch's read lock gets it now, not after the
            // whole step (a fair hand-over; without one this thread would take the
            // lock straight back).
            RwLockWriteGuard::bump(&mut reg);
        }
    }
    if step.contested > 0 {
        log::warn!(
            "{} routes of {} clients contested at this step (two claims on one hashed address and port); they are served again at their next epoch",
            step.contested,
            step.advanced
        );
    }
}

/// The metrics thread: serves the newest status `published` holds.
fn spawn_metrics(
    m: crate::metrics::MetricsServer,
    shared: &Arc<Shared>,
    published: &Arc<crate::metrics::Published>,
) -> Result<std::thread::JoinHandle<()>, ServerError> {
    let (s, p) = (Arc::clone(shared), Arc::clone(published));
    log::info!("metrics on http://{}/metrics", m.local_addr());
    let h = std::thread::Builder::new()
        .name("mt6d-metrics".into())
        .spawn(move || m.run(&p, &s.shutdown))
        .map_err(|e| ServerError::Setup(format!("start metrics thread: {e}")))?;
    Ok(h)
}

/// Adds to the main thread's wait set the control socket and the neighbour responder's
/// capture, if there is one (its timers bound the wait otherwise).
fn watch_main(
    wait: &mut MainWait,
    ctl: &crate::control::ControlServer,
    ndp: Option<&NdpResponder>,
) -> Result<(), ServerError> {
    let setup = |e: crate::daemon::SetupError| ServerError::Setup(e.to_string());
    wait.watch_control(ctl).map_err(setup)?;
    if let Some(r) = ndp {
        use std::os::fd::{AsFd, AsRawFd};
        wait.watch(r.capture().as_fd().as_raw_fd()).map_err(setup)?;
    }
    Ok(())
}

/// The start line, and the service manager told the server is ready.
fn announce_ready(cfg: &ServerConfig, served: usize, workers: usize, mtu: u16, started: Instant) {
    log::info!(
        "serving {} clients on {}/64 ({} workers, TUN {} MTU {}, ready {:.2} s after start)",
        served,
        cfg.prefix,
        workers,
        cfg.tun_name,
        mtu,
        started.elapsed().as_secs_f64()
    );
    let status = format!("serving {served} clients");
    if let Err(e) = mt6d_os::service::ready(&status) {
        log::warn!("tell the service manager we are ready: {e}");
    }
}

fn serve(
    cfg: &ServerConfig,
    shared: &Arc<Shared>,
    ios: Vec<WorkerIo>,
    run: Run,
) -> Result<(), ServerError> {
    let Run {
        signals,
        mut wait,
        mtu,
        served,
        started,
        metrics,
    } = run;
    let mut handles = spawn_workers(shared, ios, mtu)?;
    let (mut ndp, primer) = neighbour_io(cfg)?;
    // In the main thread's wait set: a request wakes it.
    let ctl = crate::control::ControlServer::bind(&cfg.control_socket).map_err(|e| {
        ServerError::Setup(format!(
            "control socket {}: {e}",
            cfg.control_socket.display()
        ))
    })?;
    watch_main(&mut wait, &ctl, ndp.as_ref())?;
    announce_ready(cfg, served, handles.len(), mtu, started);
    let mut last_report = Instant::now();
    let mut last_rx = 0;
    // The links' timeouts send liveness keepalives (docs/PROTOCOL.md §9.9) from this thread.
    let mut links = LinkTimers {
        raw: Some((
            RawUdp6::open().map_err(os("open the link timers' raw UDP socket"))?,
            mt6d_os::RawSendScratch::new(1),
        )),
        ..LinkTimers::default()
    };
    // The metrics thread serves the newest status, published below once a second.
    let published = Arc::new(crate::metrics::Published::empty());
    if let Some(m) = metrics {
        handles.push(spawn_metrics(m, shared, &published)?);
    }
    let mut published_at: Option<Instant> = None;
    let result = loop {
        if signals.stop_requested() || shared.shutdown.load(Ordering::Relaxed) {
            break Ok(());
        }
        if signals.take_reload() {
            reload(cfg, shared);
        }
        control::serve(&ctl, cfg, shared, started);
        if cfg.metrics_listen.is_some() && published_at.is_none_or(|t| t.elapsed() >= PUBLISH_EVERY)
        {
            let st = control::status(cfg, shared, started);
            published.store(Some(Arc::new(crate::status::AnyStatus::Server(st))));
            published_at = Some(Instant::now());
        }
        let now = clock::now();
        let due = {
            let reg = shared.registry.read();
            reg.poll_timeout()
        };
        if due.is_some_and(|d| d <= now) {
            step_registry(shared, now);
        }
        links.serve(shared, clock::now());
        if let Some(p) = &primer {
            prime(p, shared, cfg);
        }
        if let Some(r) = &mut ndp {
            answer_solicitations(r, shared, cfg);
        }
        if last_report.elapsed() >= REPORT_EVERY {
            report_counters(&mut last_rx, ndp.as_ref(), shared);
            last_report = Instant::now();
        }
        let next_prime = shared.registry.read().next_prime();
        // Every duty above with a time has its deadline here; signals, control requests,
        // solicitations, the workers' re-index queue and a worker's end wake the wait.
        let mut d = Deadlines::from(clock::now());
        d.at(due)
            .at(links.next())
            .at(next_prime)
            .instant(ctl.next_deadline())
            .instant(Some(last_report + REPORT_EVERY));
        if cfg.metrics_listen.is_some() {
            d.instant(published_at.map(|t| t + PUBLISH_EVERY));
        }
        if let Err(e) = wait.wait(d.wait().max(MIN_WAIT)) {
            break Err(os("wait")(e));
        }
    };
    shared.shutdown.store(true, Ordering::Relaxed);
    for h in handles {
        let _ = h.join();
    }
    log_counters(&shared.counters, ndp.as_ref(), shared);
    result
}

/// The solicitations that arrived, answered for the clients' current addresses.
fn answer_solicitations(r: &mut NdpResponder, shared: &Shared, cfg: &ServerConfig) {
    let reg = shared.registry.read();
    if let Err(e) = r.serve_ready(|a| reg.is_current_address(a), NDP_BUDGET) {
        log::warn!("neighbour responder on {}: {e}", cfg.external_interface);
    }
}

/// The counter line, if anything arrived since the last one (`last_rx`: the packets then).
fn report_counters(last_rx: &mut u64, ndp: Option<&NdpResponder>, shared: &Shared) {
    let rx = shared.counters.rx_packets.load(Ordering::Relaxed);
    if rx != *last_rx {
        log_counters(&shared.counters, ndp, shared);
        *last_rx = rx;
    }
}

fn log_counters(c: &ServerCounters, ndp: Option<&NdpResponder>, shared: &Shared) {
    let mut line: Vec<String> = c
        .snapshot()
        .into_iter()
        .filter(|(_, v)| *v > 0)
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let (sessions, sets) = shared.registry.read().session_counts();
    if sessions > 0 || sets > 0 {
        line.push(format!("sessions={sessions} session_route_sets={sets}"));
    }
    if let Some(r) = ndp {
        let n = r.counters();
        line.push(format!(
            "ns_answered={} ns_defended={} ns_not_current={}",
            n.answered, n.defended, n.not_current
        ));
    }
    log::info!("counters: {}", line.join(" "));
}

/// Announcements sent per wake-up at most, before the loop looks at its other work (at a
/// million clients and a 10 s interval, 100,000 are due per second).
const PRIME_BUDGET: usize = 4096;

/// Announces the server addresses due now to the router (docs/PROTOCOL.md §5.1): one unicast
/// solicitation from each, carrying the server's MAC, so the router has a neighbour entry
/// before the client's first packet to it.
fn prime(p: &crate::daemon::neighbor::NeighborPrimer, shared: &Shared, cfg: &ServerConfig) {
    let Some(hop) = cfg.external_next_hop else {
        return;
    };
    let due = shared
        .registry
        .write()
        .due_primes(clock::now(), PRIME_BUDGET);
    let (mut sent, mut failed) = (0u64, 0u64);
    for from in due {
        match p.solicit(from, hop) {
            Ok(()) => sent += 1,
            Err(e) => {
                if failed == 0 {
                    log::debug!("announce {from} to {hop}: {e}");
                }
                failed += 1;
            }
        }
    }
    registry::bump(&shared.counters.ns_primed, sent);
    registry::bump(&shared.counters.ns_prime_failures, failed);
}

/// The server's side of every handshake client's settings, completed per client by the
/// registry (None without an identity key: no client handshakes then).
fn handshake_template(cfg: &ServerConfig) -> Option<mt6d_proto::handshake::HandshakeConfig> {
    let own = cfg.private_key.as_ref()?.public_key();
    let placeholder = crate::config::ClientHandshake {
        public_key: own,
        psk: mt6d_proto::handshake::Psk::none(),
    };
    cfg.handshake_config(&placeholder, cfg.true_address)
}

/// The main thread's part of the handshake clients: re-indexing the route sets the workers
/// reported changed, and each live session's link timeout (key expiry, a parent set released,
/// an unconfirmed answer forgotten).
#[derive(Debug, Default)]
struct LinkTimers {
    /// (deadline, client) in deadline order; an entry whose deadline is no longer the client's
    /// (in `at`) is skipped when it pops.
    heap: std::collections::BinaryHeap<std::cmp::Reverse<(UnixTime, PeerId)>>,
    at: HashMap<PeerId, UnixTime>,
    /// Where a timeout's datagrams leave (a keepalive answering a client's data, §9.9); None
    /// in tests without a socket.
    raw: Option<(RawUdp6, mt6d_os::RawSendScratch)>,
}

impl LinkTimers {
    fn next(&self) -> Option<UnixTime> {
        self.heap.peek().map(|std::cmp::Reverse((t, _))| *t)
    }

    fn schedule(&mut self, id: PeerId, next: Option<UnixTime>) {
        match next {
            Some(t) => {
                if self.at.insert(id, t) != Some(t) {
                    self.heap.push(std::cmp::Reverse((t, id)));
                }
            }
            None => {
                self.at.remove(&id);
            }
        }
    }

    fn serve(&mut self, shared: &Shared, now: UnixTime) {
        let mut todo =
            std::mem::take(&mut *shared.resync.lock().unwrap_or_else(PoisonError::into_inner));
        while let Some(std::cmp::Reverse((t, id))) = self.heap.peek().copied() {
            if t > now {
                break;
            }
            self.heap.pop();
            if self.at.get(&id) != Some(&t) {
                continue;
            }
            self.at.remove(&id);
            let reg = shared.registry.read();
            if let Some(mut guard) = reg.client(id).and_then(registry::Client::session) {
                if let Some(session) = guard.as_mut() {
                    session.link.handle_timeout(now, || None);
                    let raw = self.raw.as_mut().map(|(r, s)| (&*r, s));
                    shared::drain(session, raw);
                }
            }
            todo.push(id);
        }
        if todo.is_empty() {
            return;
        }
        todo.sort_unstable();
        todo.dedup();
        let mut reg = shared.registry.write();
        for id in todo {
            let next = reg.sync_sets(id, now);
            self.schedule(id, next);
        }
    }
}

/// SIGHUP and `mt6d reload`: the peers file read and validated again as a whole; if it is
/// valid, clients no longer listed are removed (their addresses stop answering at once), new
/// ones added, changed ones replaced. An invalid file changes nothing.
fn reload(cfg: &ServerConfig, shared: &Shared) -> crate::control::ChangeAnswer {
    let mut answer = crate::control::ChangeAnswer::default();
    let clients = match cfg.clients() {
        Ok(c) => c,
        Err(e) => {
            log::error!("reload refused, nothing changed: {e}");
            answer.error = Some(format!("reload refused, nothing changed: {e}"));
            return answer;
        }
    };
    let wanted: HashMap<&str, &ClientConfig> =
        clients.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut reg = shared.registry.write();
    let (mut removed, mut added, mut failed) = (0, 0, 0);
    let gone: Vec<String> = reg
        .names()
        .filter(|name| wanted.get(name).is_none_or(|c| !reg.unchanged(c)))
        .map(str::to_owned)
        .collect();
    for name in gone {
        reg.remove(&name);
        removed += 1;
        answer.removed.push(name);
    }
    let now = clock::now();
    for c in &clients {
        if reg.id_of(&c.name).is_some() {
            continue;
        }
        match reg.add(c, now) {
            Ok(_) => {
                added += 1;
                answer.added.push(c.name.clone());
            }
            Err(e) => {
                log::error!("reload: {e}");
                failed += 1;
            }
        }
    }
    log::info!(
        "reloaded {}: {added} clients added, {removed} removed, {failed} refused; {} served",
        cfg.peers_file.display(),
        reg.len()
    );
    // A changed client is removed and added again: report it as changed.
    let again: Vec<String> = answer
        .removed
        .iter()
        .filter(|n| answer.added.contains(n))
        .cloned()
        .collect();
    answer.removed.retain(|n| !again.contains(n));
    answer.added.retain(|n| !again.contains(n));
    answer.changed = again;
    if failed > 0 {
        answer.error = Some(format!(
            "{failed} clients refused by the index (see the daemon's log); the rest applied"
        ));
    }
    answer
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test
mod tests {
    use super::*;

    #[test]
    fn the_ruleset_drops_all_but_udp_to_the_prefix_and_hands_udp_to_the_port() {
        let cfg = ServerConfig::parse(
            Path::new("s.toml"),
            "[server]\nexternal_interface = \"eth0\"\nprefix = \"2001:db8:5::/64\"\n\
             true_address = \"2001:db8:5:1::1\"\npeers_file = \"c\"\n\
             client_routes = [\"2001:db8:c0::/44\"]\nlisten_port = 9000\n",
        )
        .unwrap();
        let r = ruleset(&cfg);
        assert!(
            r.contains("ip6 daddr 2001:db8:5::/64 meta l4proto != udp counter drop"),
            "{r}"
        );
        assert!(r.contains("tproxy ip6 to [::1]:9000 accept"), "{r}");
        // A datagram no socket takes (the daemon killed, its table left) is dropped, not
        // answered by the kernel; the drop comes after the tproxy rule.
        let drop = r.find("ip6 daddr 2001:db8:5::/64 counter drop").unwrap();
        assert!(drop > r.find("tproxy").unwrap(), "{r}");
    }
}
