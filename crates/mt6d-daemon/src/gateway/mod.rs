//! `mt6d run`: the gateway daemon.
//!
//! Threads:
//! - **tx** and **rx** packet threads (`dataplane`), one per direction, so the two cores of a
//!   small gateway each carry one direction;
//! - the **icmp** thread ([`icmp`]): ICMPv6 errors from the path, translated for the protected
//!   host, and the tunnel MTU that follows the path MTU;
//! - the **main** thread does housekeeping: rotations on schedule (`rotation`), control-socket
//!   requests, the drop report, live changes (`reload`: SIGHUP, `mt6d reload` and `mt6d peer`
//!   add, remove or change peers while the others carry on), and the shutdown;
//! - with `metrics_listen`, the **metrics** thread ([`crate::metrics`]) answers Prometheus
//!   scrapes from a status snapshot the main thread publishes once a second.
//!
//! Start-up order: validate the whole config, claim the instance ([`state`]: refuse if a
//! running daemon would share anything, clean up after a dead one), bind the control socket,
//! apply the kernel state (`system`: fail-closed guards first), remove hashed addresses a
//! crashed earlier run may have left, install the first routes, start the packet threads.
//! Shutdown runs the same steps backwards and leaves the guards: a stop must not open what a
//! crash keeps closed (docs/ARCHITECTURE.md "Fail closed"); `mt6d down` lifts them.

mod collision;
pub mod counter_state;
pub mod counters;
mod dataplane;
mod delivery;
mod error;
mod housekeeping;
pub mod icmp;
mod kernel_drops;
mod link_timers;
mod links;
mod liveness;
mod path;
pub mod peer;
mod peer_link;
mod polls;
mod prefix;
mod quiet;
mod reload;
mod rotation;
mod router;
pub mod routing;
pub mod session;
mod shared;
pub mod state;
mod syn_queues;
mod system;
pub mod tcp_policy;

use std::fmt::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;

use crate::config::{Config, Keying, Role};
use crate::control::ControlServer;
use crate::daemon::neighbor::NeighborPrimer;
use crate::daemon::wakeup::MainWait;
use crate::daemon::worker::WorkerLoad;
use crate::daemon::{clock, signals};
use crate::status::{
    HandshakeStatus, KernelDrops, MoveStatus, PeerStatus, RouteSetStatus, RouteStatus, Status,
};
use collision::CollisionWatch;
use counters::{DirectionCounters, DropReason};
pub use error::GatewayError;
use icmp::IcmpTranslator;
use link_timers::Attention;
use liveness::Liveness;
use path::PathState;
use peer::{Peer, PeerKeys};
use polls::Polls;
use rotation::Rotator;
use router::RouterDiscovery;
use routing::RouteTable;
use shared::Shared;
use system::System;

/// Runs the daemon until a stop signal ([`signals`]).
/// `mt6d check` of a gateway's or host's file: the file and every key file, as `run` validates
/// them; what would run, for people.
pub fn check(path: &Path) -> Result<String, Box<dyn std::error::Error>> {
    let mut out = String::new();
    let cfg = Config::load(path)?;
    let g = &cfg.gateway;
    let _ = writeln!(out, "{}: OK", path.display());
    let role = match &g.role {
        Role::Gateway { internal_interface } => {
            format!("gateway: internal {internal_interface}")
        }
        Role::Host { local_host } => {
            format!("host: {local_host} on the TUN device")
        }
    };
    let _ = writeln!(
        out,
        "  {role}  external {}  tun {}  control socket {}",
        g.external_interface,
        g.tun_name,
        g.control_socket.display()
    );
    for p in &cfg.peers {
        let s = &p.stream;
        let keying = match &p.keying {
            Keying::Handshake(h) => format!(
                "handshake with {} (rekey every {:?})",
                crate::keys::public_key_text(&h.remote_public),
                h.rekey_after
            ),
            Keying::PreShared => "pre-shared session key".to_string(),
        };
        let _ = writeln!(
        out,
            "  peer {}: {} <-> {}  mode {}  aead {}  derivation {}  ports {:?}  rotation {:?}{}  keys: {keying}",
            p.name,
            s.local.true_addr,
            s.remote.true_addr,
            s.mode,
            s.aead,
            s.derivation,
            s.ports,
            s.rotation,
            if s.jitter { " (jittered)" } else { "" }
        );
    }
    Ok(out)
}

/// The gateway role, and host mode (`role = "host"`).
#[derive(Debug, Clone, Copy)]
pub struct Gateway;

impl crate::daemon::Role for Gateway {
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
    let (cfg, doc) = Config::load_document(config_path)?;
    // Capabilities, not uid 0: a dedicated user with CAP_NET_ADMIN and CAP_NET_RAW is enough.
    crate::daemon::privilege::check_all()?;
    // Handlers first: a signal during set-up then stops the daemon after set-up, through the
    // same clean-up, instead of killing it half way.
    let signals = signals::Signals::install()?;
    let mut netlink = mt6d_os::Netlink::open().map_err(|source| GatewayError::Os {
        what: "open rtnetlink".into(),
        source,
    })?;
    let instance = state::Instance::claim(&cfg, &mut netlink)?;
    let control = ControlServer::bind(&cfg.gateway.control_socket)?;
    // What the main thread sleeps on: the signals' self-pipe, the control socket, the other
    // threads' wake-ups (docs/ARCHITECTURE.md, "Main loops").
    let mut wait = MainWait::new(&signals)?;
    wait.watch_control(&control)?;
    run_gateway(&cfg, doc, &control, &signals, netlink, instance, wait)?;
    if let Some(sig) = signals.stopped_by() {
        log::info!("stopped by {sig}");
    }
    Ok(())
}

/// Keys must not reach a core dump or a same-user debugger: the process becomes non-dumpable
/// before any key is derived, and the pages of the configured keys are left out of dumps
/// (docs/ARCHITECTURE.md "Keys"; [`build_peer`] does that for each peer, at start and reload).
fn protect_secrets() -> Result<(), GatewayError> {
    mt6d_os::secrets::set_non_dumpable().map_err(|e| {
        GatewayError::Setup(format!(
            "mark the process non-dumpable (prctl PR_SET_DUMPABLE 0): {e}"
        ))
    })?;
    Ok(())
}

/// `mt6d down -c FILE`: what a daemon for this configuration left after it stopped (its
/// fail-closed guards) or died (guards, routes, proxy entries, addresses, sysctls) is removed or
/// restored; nothing is started.
pub fn down(config_path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let cfg = Config::load(config_path)?;
    // The same capabilities as `run` (no TUN device is opened): the daemon's own user can
    // clean up after it.
    crate::daemon::privilege::check_run()?;
    let report = state::down(&cfg)?;
    match &report.owner {
        Some((pid, config)) if report.stopped_cleanly => println!(
            "removed the fail-closed guards mt6d pid {pid} ({}) left at its stop: {} recorded change(s) undone, hashed addresses swept",
            config.display(),
            report.undone
        ),
        Some((pid, config)) => println!(
            "removed what mt6d pid {pid} ({}) left: {} recorded change(s) undone, hashed addresses swept",
            config.display(),
            report.undone
        ),
        None => println!(
            "no record of a dead mt6d for {} in this namespace; hashed addresses swept",
            config_path.display()
        ),
    }
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "could not undo (kept on record, run `mt6d down` again): {}",
            report.failed.join("; ")
        )
        .into())
    }
}

/// Neighbour discovery for the hashed addresses, on an external interface with a link-layer
/// address: the primer (solicitations before each epoch), the pinning of the peers' addresses
/// on one segment, and the watch for address collisions. Nothing on a point-to-point uplink.
fn prepare_neighbours(
    cfg: &Config,
    sys: &mut System,
    rotator: &mut Rotator,
    path: &Arc<PathState>,
) -> Result<(), GatewayError> {
    match sys.netlink.link_mac(sys.external_index) {
        Ok(Some(mac)) => {
            rotator.set_primer(
                NeighborPrimer::open(sys.external_index, mac, cfg.gateway.external_next_hop)?,
                path.clone(),
            );
            let link_local = sys
                .netlink
                .list_addresses(sys.external_index)
                .ok()
                .and_then(|l| {
                    l.into_iter()
                        .map(|a| a.addr)
                        .find(|a| a.segments()[0] & 0xffc0 == 0xfe80)
                });
            // One segment (no router between the gateways): pin the peers' addresses.
            if cfg.gateway.external_next_hop.is_none() {
                rotator.set_pinning(mac);
            }
            match CollisionWatch::open(&cfg.gateway.external_interface, mac, link_local) {
                Ok(w) => rotator.set_watch(w),
                Err(e) => log::warn!("{e}; address collisions on the link are not detected"),
            }
        }
        // Without a link-layer address (a point-to-point uplink) there is no neighbour
        // discovery to prepare.
        Ok(None) => {}
        Err(e) => log::warn!("external interface MAC: {e}; new addresses are not announced"),
    }
    Ok(())
}

fn run_gateway(
    cfg: &Config,
    doc: toml::Table,
    control: &ControlServer,
    signals: &signals::Signals,
    netlink: mt6d_os::Netlink,
    instance: state::Instance,
    wait: MainWait,
) -> Result<(), GatewayError> {
    let started = Instant::now();
    protect_secrets()?;
    let now = clock::now();
    let mut peers = Vec::with_capacity(cfg.peers.len());
    let mut max_overhead = 0;
    for p in &cfg.peers {
        let (peer, overhead) = build_peer(cfg, p)?;
        max_overhead = max_overhead.max(overhead);
        peers.push(peer);
    }

    // Bound before any kernel state changes: a taken port stops the start with nothing to undo.
    let metrics = cfg
        .gateway
        .metrics_listen
        .map(crate::metrics::MetricsServer::bind)
        .transpose()
        .map_err(|e| GatewayError::Setup(e.to_string()))?;
    let mut sys = System::apply(cfg, max_overhead, netlink, instance)?;
    let polls = Polls::new(sys.tun.len())?;
    let shared = Shared {
        table: ArcSwap::from_pointee(RouteTable::default()),
        shutdown: AtomicBool::new(false),
        unmatched: DirectionCounters::default(),
        attention: Attention::new(wait.nudge()),
        socket_queue_drops: AtomicU64::new(0),
        tun_write_failures: AtomicU64::new(0),
        load: (0..polls.len()).map(|_| WorkerLoad::default()).collect(),
        syn_queues: Default::default(),
    };
    let path = Arc::new(PathState::new(sys.tun_mtu));
    let mut rotator = Rotator::new(sys.external_index, peers);
    prepare_neighbours(cfg, &mut sys, &mut rotator, &path)?;
    let icmp = IcmpTranslator::open(
        sys.tun.first().map_or(0, mt6d_os::Tun::index),
        sys.internal_index,
        &cfg.gateway.external_interface,
        max_overhead,
    )?;
    let router = if cfg.gateway.router_advertisements {
        Some(RouterDiscovery::open(
            sys.internal_index,
            sys.external_index,
        )?)
    } else {
        None
    };
    rotator.purge_stale(&mut sys.netlink, now);
    let first = rotator.step(&mut sys.netlink, &polls, &shared, now);
    let result = first.and_then(|()| {
        log::info!("{}", start_line(cfg, &sys, &shared));
        // The current epoch's addresses are bound: units ordered after this one may start.
        let ready = format!("carrying {} peer(s)", shared.table.load().peers.len());
        if let Err(e) = mt6d_os::service::ready(&ready) {
            log::warn!("{e}");
        }
        serve(
            reload::Live {
                cfg: cfg.clone(),
                doc,
            },
            control,
            signals,
            &mut sys,
            &polls,
            &shared,
            &mut rotator,
            (icmp, router, &path),
            started,
            metrics.as_ref(),
            wait,
        )
    });
    shared.shutdown.store(true, Ordering::Relaxed);
    // Every packet thread has ended: the pre-shared counters reserved and not used go back.
    for r in shared.table.load().peers.iter() {
        session::release_counters(&r.peer);
    }
    if let Err(e) = mt6d_os::service::stopping() {
        log::warn!("{e}");
    }
    rotator.remove_all(&mut sys.netlink, &polls);
    let guards = sys.teardown();
    log::info!(
        "mt6d stopped; addresses, routes, neighbour entries and the TUN device removed; {guards} fail-closed guard route(s) and the routes to the protected hosts kept until the next start or `mt6d down -c {}`",
        cfg.path.display()
    );
    result
}

/// Registers TUN queue i with worker i's epoll, non-blocking.
fn watch_queues(queues: &[mt6d_os::Tun], polls: &Polls) -> Result<(), GatewayError> {
    for (i, queue) in queues.iter().enumerate() {
        queue
            .set_nonblocking(true)
            .and_then(|()| {
                polls
                    .get(i)
                    .add(std::os::fd::AsRawFd::as_raw_fd(queue), polls::TUN_TOKEN)
            })
            .map_err(|source| GatewayError::Os {
                what: format!("watch queue {i} of the TUN device"),
                source,
            })?;
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn serve(
    live: reload::Live,
    control: &ControlServer,
    signals: &signals::Signals,
    sys: &mut System,
    polls: &Polls,
    shared: &Shared,
    rotator: &mut Rotator,
    (icmp, router, path): (IcmpTranslator, Option<RouterDiscovery>, &PathState),
    started: Instant,
    metrics: Option<&crate::metrics::MetricsServer>,
    wait: MainWait,
) -> Result<(), GatewayError> {
    let published = crate::metrics::Published::empty();
    let queues = std::mem::take(&mut sys.tun);
    let Some(tun_index) = queues.first().map(mt6d_os::Tun::index) else {
        return Err(GatewayError::Setup(
            "TUN device missing after set-up".into(),
        ));
    };
    let tun_mtu = sys.tun_mtu as usize;
    if let Err(e) = watch_queues(&queues, polls) {
        sys.tun = queues;
        return Err(e);
    }
    raise_priority();
    let result = std::thread::scope(|s| {
        let mut workers = Vec::with_capacity(queues.len());
        let queues = &queues[..];
        let spawn = |name: String, what: &str| Spawn {
            scope: s,
            name,
            what: what.to_string(),
            wait: &wait,
            shutdown: &shared.shutdown,
        };
        for i in 0..queues.len() {
            let epoll = polls.get(i);
            let worker =
                spawn(format!("mt6d-w{i}"), &format!("data-plane worker {i}")).run(move || {
                    crate::daemon::worker::stop_all_if_it_panics(&shared.shutdown, i, || {
                        dataplane::worker_loop(shared, i, queues, epoll, tun_mtu, path);
                    });
                })?;
            workers.push(worker);
        }
        let icmp =
            spawn("mt6d-icmp".into(), "ICMPv6 thread").run(move || icmp.run(shared, path))?;
        let router = router
            .map(|r| {
                spawn("mt6d-router".into(), "router discovery thread")
                    .run(move || r.run(shared, path, &path.router))
            })
            .transpose()?;
        if let Some(m) = metrics {
            let published = &published;
            std::thread::Builder::new()
                .name("mt6d-metrics".into())
                .spawn_scoped(s, move || m.run(published, &shared.shutdown))
                .map_err(|e| {
                    shared.shutdown.store(true, Ordering::Relaxed);
                    GatewayError::Setup(format!("start metrics thread: {e}"))
                })?;
            log::info!("metrics on http://{}/metrics", m.local_addr());
        }
        let threads = housekeeping::Threads {
            workers: &workers,
            icmp: &icmp,
            router: router.as_ref(),
        };
        let env = housekeeping::Env {
            control,
            signals,
            polls,
            shared,
            path,
            started,
            metrics,
            published: &published,
            tun_index,
        };
        let result = housekeeping::Housekeeping::new(live, env, sys, wait).run(rotator, &threads);
        shared.shutdown.store(true, Ordering::Relaxed);
        result
    });
    sys.tun = queues;
    result
}

/// One of the gateway's packet threads, to be started in `scope`.
struct Spawn<'scope, 'env, 'a> {
    scope: &'scope std::thread::Scope<'scope, 'env>,
    name: String,
    /// What it is, for the error if it cannot start.
    what: String,
    wait: &'a MainWait,
    shutdown: &'a std::sync::atomic::AtomicBool,
}

impl<'scope> Spawn<'scope, '_, '_> {
    /// Starts `f`: the thread wakes the main thread when it ends, however it ends (a panic
    /// included); a thread that cannot start stops the ones already started (the scope waits
    /// for them).
    fn run(
        self,
        f: impl FnOnce() + Send + 'scope,
    ) -> Result<std::thread::ScopedJoinHandle<'scope, ()>, GatewayError> {
        let ended = self.wait.nudge().on_drop();
        std::thread::Builder::new()
            .name(self.name)
            .spawn_scoped(self.scope, move || {
                let _ended = ended;
                f();
            })
            .map_err(|e| {
                self.shutdown.store(true, Ordering::Relaxed);
                GatewayError::Setup(format!("start {}: {e}", self.what))
            })
    }
}

use mt6d_proto::handshake::Handshake;

/// Builds one configured peer: its stream, its keys (a pre-shared key's persisted counter
/// reservation, or a handshake), and returns it with its tunnel overhead. The key pages are left
/// out of core dumps.
fn build_peer(
    cfg: &Config,
    p: &crate::config::PeerConfig,
) -> Result<(Arc<Peer>, usize), GatewayError> {
    let setup = |e: mt6d_proto::ProtoError| GatewayError::Setup(format!("peer {}: {e}", p.name));
    // Best effort: a failure only means a dump the process cannot produce anyway (it is
    // non-dumpable) would include these pages.
    let _ = mt6d_os::secrets::dont_dump(p.stream.key.as_bytes());
    let stream = p.build_stream().map_err(setup)?;
    let overhead = stream.overhead();
    let keys = match &p.keying {
        // Plain mode has no counter and no nonce: nothing to persist.
        Keying::PreShared if stream.mode() == mt6d_proto::Mode::Plain => {
            PeerKeys::pre_shared(stream.sealer(0, 0), None)
        }
        Keying::PreShared => {
            let (state, sealer) =
                counter_state::CounterState::open(&cfg.gateway.state_dir, &stream).map_err(
                    |e| GatewayError::Setup(format!("peer {}: send counter: {e}", p.name)),
                )?;
            if sealer.next_counter().is_some_and(|n| n >= state.limit()) {
                log::error!(
                    "peer {}: its pre-shared key has protected its limit of {} packets ({}, docs/PROTOCOL.md §4.3); nothing is sent to it until it has a new key",
                    p.name,
                    state.limit(),
                    stream.config().aead
                );
            }
            PeerKeys::pre_shared(sealer, Some(state))
        }
        Keying::Handshake(_) => PeerKeys::handshake(),
    };
    let hs = match &p.keying {
        Keying::Handshake(hs) => Some(Handshake::new(hs.clone()).map_err(setup)?),
        Keying::PreShared => None,
    };
    let link_stream = p.build_stream().map_err(setup)?;
    let mut peer = Peer::new(p.name.clone(), stream, link_stream, keys, hs);
    peer.tcp = tcp_policy::PeerTcp::new(&cfg.gateway.tcp, &p.host_id);
    let peer = Arc::new(peer);
    // The stream's derived subkeys and the peer's key state live inline in `Peer`.
    let _ = mt6d_os::secrets::dont_dump(&*peer);
    Ok((peer, overhead))
}

/// This gateway's identity public key (base64), if it uses handshakes.
fn own_public_key(cfg: &Config) -> Option<String> {
    cfg.peers.iter().find_map(|p| match &p.keying {
        Keying::Handshake(hs) => Some(crate::keys::public_key_text(&hs.local_private.public_key())),
        Keying::PreShared => None,
    })
}

/// The one line logged at start: what a person needs to tell this daemon from another and to
/// check it against its peer's configuration.
fn start_line(cfg: &Config, sys: &System, shared: &Shared) -> String {
    let role = match &cfg.gateway.role {
        Role::Gateway { internal_interface } => {
            format!("gateway, internal {internal_interface}")
        }
        Role::Host { local_host } => format!("host mode, {local_host} on the TUN device"),
    };
    let table = shared.table.load();
    let peers: Vec<String> = cfg
        .peers
        .iter()
        .zip(table.peers.iter().map(|r| &r.peer))
        .map(|(c, p)| {
            let keying = match &c.keying {
                Keying::Handshake(hs) => {
                    format!(
                        "public_key {}",
                        crate::keys::public_key_text(&hs.remote_public)
                    )
                }
                Keying::PreShared => "pre-shared key".to_string(),
            };
            format!(
                "{} ({} <-> {}, {}, {keying})",
                p.name,
                p.stream.local_true(),
                p.stream.remote_true(),
                p.stream.mode()
            )
        })
        .collect();
    format!(
        "mt6d {} running: own public key {}, {role}, external {}, TUN {} (MTU {}), control {}; {} peer(s): {}",
        env!("CARGO_PKG_VERSION"),
        own_public_key(cfg).unwrap_or_else(|| "none (pre-shared keys)".into()),
        cfg.gateway.external_interface,
        cfg.gateway.tun_name,
        sys.tun_mtu,
        cfg.gateway.control_socket.display(),
        cfg.peers.len(),
        peers.join("; ")
    )
}

/// The nice value the daemon's threads ask for: ahead of ordinary work (nice 0), so a packet
/// thread is not kept waiting for a core while the queues in front of it overflow. With both
/// cores of the load lab busy at the daemon's own priority, the transmit thread waited over
/// half a second (19,029 drops from a 10,000-packet TUN queue at 20,000 packets/s); no queue
/// bounds that wait, a priority does. Kernel WireGuard does its work in softirq and kernel
/// workers, ahead of every process.
const THREAD_NICE: i32 = -10;

/// Raises the calling thread's priority to [`THREAD_NICE`] before the packet threads start, so
/// they (and this housekeeping thread, which moves the addresses on time) inherit it. Needs
/// CAP_SYS_NICE or a service manager's `Nice=`; without, the daemon runs at the priority it
/// was given and says so once.
fn raise_priority() {
    match mt6d_os::thread_nice() {
        Ok(n) if n <= THREAD_NICE => return,
        _ => {}
    }
    if let Err(e) = mt6d_os::set_thread_nice(THREAD_NICE) {
        log::info!(
            "packet threads keep their priority: nice {THREAD_NICE} needs CAP_SYS_NICE or the unit's Nice= ({e}); with every core busy the queues in front of them can overflow (kernel queue drops in mt6d status)"
        );
    }
}

/// Logs drops since the last report, at most once per rotation: per-packet events never reach
/// the log directly (../shared/STYLE.md §8: rate-limited).
#[derive(Debug, Default)]
struct DropReport {
    /// Drops per reason at the last report, by peer name ("(no peer)": unmatched packets).
    last: Vec<(String, Vec<u64>)>,
}

impl DropReport {
    /// `kernel`: the kernel's queue drops that rose since the last report, in the same line.
    fn report(&mut self, shared: &Shared, kernel: Vec<String>) {
        let table = shared.table.load();
        let mut now: Vec<(String, Vec<u64>)> = table
            .peers
            .iter()
            .map(|r| {
                let c = &r.peer.counters;
                let n = DropReason::ALL
                    .iter()
                    .map(|&d| c.tx.drops(d) + c.rx.drops(d))
                    .collect();
                (r.peer.name.clone(), n)
            })
            .collect();
        now.push((
            "(no peer)".into(),
            DropReason::ALL
                .iter()
                .map(|&d| shared.unmatched.drops(d))
                .collect(),
        ));
        let mut parts = Vec::new();
        for (name, counts) in &now {
            // A peer added since the last report has no baseline yet (a changed peer's new
            // counters start at zero: no baseline either).
            let Some((_, last)) = self
                .last
                .iter()
                .find(|(n, l)| n == name && l.len() == counts.len())
            else {
                continue;
            };
            for ((r, n), l) in DropReason::ALL.iter().zip(counts).zip(last) {
                let delta = n.saturating_sub(*l);
                if delta > 0 {
                    parts.push(format!("{name}: {delta} {}", r.label()));
                }
            }
        }
        parts.extend(kernel);
        if !parts.is_empty() {
            log::warn!("dropped since last rotation: {}", parts.join(", "));
        }
        self.last = now;
    }
}

fn handshake_status(p: &Peer, now: mt6d_proto::UnixTime) -> Option<HandshakeStatus> {
    let link = p.link.lock();
    let hs = link.handshake()?;
    let st = hs.stats();
    let send = p.keys.send.load();
    let ago =
        |t: Option<mt6d_proto::UnixTime>| t.map(|t| now.as_millis().saturating_sub(t.as_millis()));
    Some(HandshakeStatus {
        has_keys: send.is_some(),
        last_handshake_ms_ago: ago(st.last_completed),
        key_age_ms: send.as_ref().and(ago(hs.established_at())),
        send_key_id: send
            .as_ref()
            .and_then(|s| s.key_id())
            .map(|id| format!("{id:016x}")),
        handshakes: st.completed,
        rekeys: st.rekeys,
        initiations_sent: st.initiations_sent,
        responses_sent: st.responses_sent,
        failures: st
            .failures_by_reason()
            .map(|(r, n)| (r.to_string(), n))
            .collect(),
    })
}

fn move_status(p: &Peer) -> MoveStatus {
    let (st, moved) = p.link.lock().sets().move_stats();
    MoveStatus {
        collisions_detected: st.collisions,
        collisions_unresolved: st.exhausted,
        routes_moved: st.collisions + st.moved_by_peer,
        moved_by_peer: st.moved_by_peer,
        notices_sent: st.notices_sent,
        acks_sent: st.acks_sent,
        notices_received: st.received,
        notices_refused: p.notices_refused.load(Ordering::Relaxed),
        moved_epochs: moved.into_iter().map(|(e, k)| (e.0, k)).collect(),
    }
}

/// The status `mt6d status` and the metrics show: [`status`] with the interfaces' state, the
/// time since each peer was last heard and the kernel's queue drops.
#[allow(clippy::too_many_arguments)]
fn full_status(
    cfg: &Config,
    shared: &Shared,
    path: &PathState,
    started: Instant,
    rotator: &Rotator,
    links: &links::InterfaceWatch,
    liveness: &Liveness,
    kernel: KernelDrops,
) -> Status {
    let mut st = status(cfg, shared, path, started, rotator);
    st.interfaces = links.status();
    st.kernel_drops = kernel;
    let now = clock::now();
    for p in &mut st.peers {
        p.last_rx_ms_ago = liveness.last_rx_ms_ago(&p.name, now);
    }
    st
}

fn status(
    cfg: &Config,
    shared: &Shared,
    path: &PathState,
    started: Instant,
    rotator: &Rotator,
) -> Status {
    let table = shared.table.load();
    let now = clock::now();
    let route = |r: &mt6d_proto::Route| RouteStatus {
        epoch: r.epoch.0,
        local: r.local.to_string(),
        remote: r.remote.to_string(),
    };
    let peers = table
        .peers
        .iter()
        .map(|routes| {
            let p = &routes.peer;
            let s = &routes.send_set().schedule;
            PeerStatus {
                name: p.name.clone(),
                mode: p.stream.mode().to_string(),
                local_host: p.stream.local_true().to_string(),
                remote_host: p.stream.remote_true().to_string(),
                epoch: s.send.epoch.0,
                next_change_ms: s.next_change.as_millis().saturating_sub(now.as_millis()),
                send: route(&s.send),
                accept: routes.accept().map(route).collect(),
                route_sets: routes
                    .sets
                    .iter()
                    .map(|b| RouteSetStatus {
                        id: b.set.id,
                        kind: if b.set.is_link() { "link" } else { "session" }.into(),
                        activation_epoch: b.set.activation.0,
                        sending: std::ptr::eq(b, routes.send_set()),
                        data: b.data,
                    })
                    .collect(),
                counters: p.counters.snapshot(),
                keying: if p.keys.handshake {
                    "handshake"
                } else {
                    "pre-shared"
                }
                .into(),
                handshake: handshake_status(p, now),
                moves: move_status(p),
                last_rx_ms_ago: None,
                tcp: p.tcp.status(),
            }
        })
        .collect();
    Status {
        version: env!("CARGO_PKG_VERSION").to_string(),
        pid: std::process::id(),
        uptime_secs: started.elapsed().as_secs(),
        tun: cfg.gateway.tun_name.clone(),
        role: if cfg.gateway.is_host() {
            "host"
        } else {
            "gateway"
        }
        .into(),
        internal_interface: cfg
            .gateway
            .internal_interface()
            .unwrap_or_default()
            .to_string(),
        external_interface: cfg.gateway.external_interface.clone(),
        peers,
        path: path.status(cfg.gateway.router_advertisements),
        collision_watch: rotator.watch_status(),
        interfaces: Vec::new(),
        kernel_drops: KernelDrops::default(),
        workers: shared.load.iter().map(WorkerLoad::status).collect(),
    }
}
