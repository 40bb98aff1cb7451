//! Several conversations between the same two gateways, captured on the public link and handed
//! to the [`linker`] with the ground truth: the measurement behind
//! docs/PRIVACY.md, run by `mt6d demo --link-report` and by `tests/linker_netns.rs`.
//!
//! Gateway A serves Host A; Gateway B serves Host B and further addresses on Host B's link
//! (Host C, D, ...). Each stream (a `[[peer]]` with its own pre-shared key, as customers of one
//! pair of gateways, with or without jitter; or every stream keyed by handshakes between the
//! two gateways' identity keys: [`Keying`]) carries traffic of its shape group ([`Shapes`]). With [`Shapes::Timer`]
//! (the test's) every stream carries the same mix at once: a ping train (5/s), a faster ping
//! train (100/s) and a paced TCP stream (1200 bytes every 20 ms). Identical mixes make each
//! stream the others' decoy: an observer who must tell which of the next epoch's `n` flows
//! continues a given one has a 1/n chance by guessing, and anything better the header and
//! control methods find is a leak of the tunnel, not of the traffic. With four or more streams
//! the daemon's own scheduling (the order and offset of its control messages in each rotation)
//! is scored against a tighter goal ([`control_margin`]). The traffic-analysis methods are
//! scored too, and reported (docs/PRIVACY.md): identical timer-driven mixes still differ in
//! phase, and different shapes in everything.
//!
//! The ground truth comes from Gateway A's status, polled every 200 ms: each poll lists the
//! routes of epochs e-1, e and e+1 of every peer (docs/PROTOCOL.md §3), so no epoch is missed.

use std::net::{Ipv6Addr, SocketAddrV6};
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config_file::{ConfigFile, GatewaySection, PeerSection};
use super::daemon::DaemonProcess;
use super::linker::{self, Label, LinkReport, Truth, Vantage};
use super::observer::Observer;
use super::ping::{ping, Pace};
use super::topology::{
    in_ns, Lab, Public, Side, Topology, EXTERNAL_IF, GATEWAY_A, GATEWAY_B, HOST_A, HOST_B, HOST_IF,
    INTERNAL_IF,
};
use super::transfer;

/// The second protected host behind Gateway B (on Host B's link).
pub const HOST_C: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xc);

/// How far above chance a method may score before it counts as linking. With two candidates
/// per link (chance 1/2) and about 50 links per capture, a method that only guesses exceeds
/// 0.75 with probability below 10^-3 (binomial: 38 or more of 50); methods whose scores tie are
/// credited exactly chance. A real leak scores near 1.
pub const MARGIN: f64 = 0.25;
/// The same for the joint assignment, which decides once per epoch (about 25 decisions):
/// guessing exceeds 0.85 (22 or more of 25) with probability below 10^-3.
pub const JOINT_MARGIN: f64 = 0.35;

/// Echo exchanges each conversation has before the capture starts, times its index.
const HISTORY: u64 = 37;

/// The goal for the methods that read the daemon's own scheduling (`Method::CONTROL`): chance
/// plus 0.05, or plus three standard deviations of guessing over `links` links (binomial, at
/// `chance`) when that is larger, so that a schedule that is truly random fails the test with
/// probability about 10^-3 whatever the capture's length, and one that keeps an order fails at
/// once (it recovers about 1).
pub fn control_margin(chance: f64, links: usize) -> f64 {
    let sd = (chance * (1.0 - chance) / links.max(1) as f64).sqrt();
    0.05f64.max(3.0 * sd)
}

/// The protected hosts behind Gateway B, one per conversation: Host B, Host C, then further
/// addresses on Host B's link.
pub fn far_hosts(n: usize) -> Vec<Ipv6Addr> {
    (0..n)
        .map(|i| match i {
            0 => HOST_B,
            1 => HOST_C,
            _ => Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0xc + i as u16 - 1),
        })
        .collect()
}

/// What a person or a test asks for.
#[derive(Debug, Clone)]
pub struct LinkRunArgs {
    pub topology: Topology,
    /// encrypt, auth or plain.
    pub mode: String,
    pub rotation_secs: f64,
    /// Rotations to capture (the traffic runs `rotations * rotation_secs`).
    pub rotations: u32,
    /// Concurrent conversations (peers), at least 2.
    pub peers: usize,
    /// The mt6d executable the gateways run.
    pub mt6d: PathBuf,
    /// Keep the captures here: Gateway A's link, and behind a router `<stem>-far.pcap` too.
    pub pcap: Option<PathBuf>,
    /// What the conversations carry.
    pub shapes: Shapes,
    /// Classifiers trained on an earlier run, one per vantage in the order of
    /// [`LinkRun::reports`]: each adds a "classifier" row to its report. Empty: no such row.
    pub classifiers: Vec<linker::Classifier>,
    /// How the streams are keyed.
    pub keying: Keying,
}

/// How the conversations' streams are keyed: the variants whose epochs an observer may link
/// differently (docs/PRIVACY.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Keying {
    /// A pre-shared session key per stream, no jitter: every stream switches at the same
    /// boundary.
    PreShared,
    /// The same with `jitter = true`: each stream switches at its own key-derived instant.
    PreSharedJitter,
    /// Identity keys: one X25519 key per gateway, a handshake per stream, and data on routes
    /// derived from each session's keys (docs/PROTOCOL.md §9.8).
    Identity,
}

impl Keying {
    pub const ALL: [Keying; 3] = [Keying::PreShared, Keying::PreSharedJitter, Keying::Identity];

    pub fn name(self) -> &'static str {
        match self {
            Keying::PreShared => "pre-shared",
            Keying::PreSharedJitter => "pre-shared-jitter",
            Keying::Identity => "identity",
        }
    }

    pub fn parse(s: &str) -> Option<Keying> {
        Keying::ALL.into_iter().find(|x| x.name() == s)
    }
}

impl std::fmt::Display for Keying {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What traffic the conversations carry: the three groups a traffic-analysis measurement
/// needs, from the easiest to link to the hardest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Shapes {
    /// Different shapes, cycled over the conversations: bulk TCP at about 1 MB/s, echo 5/s,
    /// echo 100/s, idle.
    Different,
    /// The same timer-driven mix in every conversation: echo 5/s, echo 100/s and TCP
    /// segments of 1200 bytes every 20 ms.
    Timer,
    /// The same mix at the same rates with random (exponential) gaps: Poisson processes.
    Poisson,
}

impl Shapes {
    pub const ALL: [Shapes; 3] = [Shapes::Different, Shapes::Timer, Shapes::Poisson];

    pub fn name(self) -> &'static str {
        match self {
            Shapes::Different => "different",
            Shapes::Timer => "timer",
            Shapes::Poisson => "poisson",
        }
    }

    pub fn parse(s: &str) -> Option<Shapes> {
        Shapes::ALL.into_iter().find(|x| x.name() == s)
    }
}

impl std::fmt::Display for Shapes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What the run measured.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LinkRun {
    /// [`MARGIN`] and [`JOINT_MARGIN`], for the JSON reader.
    pub margin: f64,
    pub joint_margin: f64,
    pub topology: String,
    pub mode: String,
    pub rotation_secs: f64,
    pub conversations: usize,
    pub shapes: Shapes,
    pub keying: Keying,
    /// Distinct epochs in the ground truth.
    pub epochs: usize,
    /// Frames on the captured links that carried a true address (must be 0).
    pub frames_with_true_address: u64,
    pub reports: Vec<LinkReport>,
    /// Labelled pairs of each vantage's capture, to train a classifier for a later run.
    #[serde(skip)]
    pub examples: Vec<Vec<linker::Example>>,
}

impl LinkRun {
    /// "vantage: method links x (chance c)" for every method above chance plus [`MARGIN`],
    /// and for every control method above chance plus [`control_margin`] flow by flow.
    ///
    /// The traffic-analysis methods ([`linker::Method::TRAFFIC`]) are left out: they link
    /// today's conversations (docs/PRIVACY.md) and are reported, not held to a margin. Once
    /// conversations of one gateway pair share their routes, they join the control methods'
    /// goal: each within chance + 0.05 flow by flow and jointly.
    pub fn linking(&self) -> Vec<String> {
        let control: Vec<&str> = linker::Method::CONTROL.iter().map(|m| m.name()).collect();
        let traffic: Vec<&str> = linker::Method::TRAFFIC.iter().map(|m| m.name()).collect();
        self.reports
            .iter()
            .flat_map(|r| {
                let traffic = traffic.clone();
                let general = r
                    .linking(MARGIN, JOINT_MARGIN)
                    .into_iter()
                    .filter(move |m| !traffic.contains(&m.method))
                    .map(move |m| {
                    format!(
                        "{}: {} links {:.2} of consecutive epochs, {:.2} jointly (chance {:.2}, \
margins {MARGIN} and {JOINT_MARGIN})",
                        r.vantage, m.method, m.recovered, m.matched, m.chance
                    )
                });
                let tight = r
                    .results
                    .iter()
                    .filter(|m| control.contains(&m.method) && m.links > 0)
                    .filter(|m| m.recovered > m.chance + control_margin(m.chance, m.links))
                    .filter(|m| m.recovered <= m.chance + MARGIN && m.matched <= m.chance + JOINT_MARGIN)
                    .map(move |m| {
                        format!(
                            "{}: {} links {:.2} of consecutive epochs (chance {:.2}, goal chance + {:.3})",
                            r.vantage,
                            m.method,
                            m.recovered,
                            m.chance,
                            control_margin(m.chance, m.links)
                        )
                    });
                general.chain(tight).collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Removes a private directory on every exit path.
struct DirGuard(PathBuf);

impl Drop for DirGuard {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Builds the lab, runs two conversations for `rotations` epochs while capturing, and links.
pub fn run(args: &LinkRunArgs) -> Result<LinkRun, String> {
    if args.peers < 2 {
        return Err(format!(
            "{} conversation(s): at least 2 are needed to link",
            args.peers
        ));
    }
    let lab = Lab::build_topology(args.topology, "m6l").map_err(|e| e.to_string())?;
    for host in far_hosts(args.peers).into_iter().skip(1) {
        in_ns(&lab.host_b, |nl| {
            let i = nl.link_index(HOST_IF)?;
            nl.add_address(
                i,
                host,
                64,
                mt6d_os::AddrFlags {
                    nodad: true,
                    noprefixroute: false,
                },
            )
        })
        .map_err(|e| format!("protected address {host} on Host B's link: {e}"))?;
    }
    let dir = std::env::temp_dir().join(format!("mt6d-link-{}", lab.gw_a.name()));
    let _guard = DirGuard(dir.clone());
    std::fs::DirBuilder::new()
        .mode(0o700)
        .recursive(true)
        .create(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?;
    let keys = Keys::generate(args, &dir)?;
    let mut daemons = Vec::new();
    for (side, label) in [(Side::A, "A"), (Side::B, "B")] {
        let config = dir.join(format!("gw-{label}.toml"));
        std::fs::write(
            &config,
            config_text(
                lab.public(side),
                lab.public(other(side)),
                side,
                args,
                &keys,
                &lab.control_socket(side),
                lab.topology.name(),
            ),
        )
        .map_err(|e| format!("{}: {e}", config.display()))?;
        let mut cmd = lab
            .gateway(side)
            .command(&args.mt6d)
            .map_err(|e| e.to_string())?;
        cmd.arg("run").arg("-c").arg(&config);
        let mut d = DaemonProcess::spawn(
            label,
            cmd,
            &lab.control_socket(side),
            &dir.join(format!("gw-{label}.log")),
        )?;
        d.wait_ready(Duration::from_secs(10))?;
        daemons.push(d);
    }
    let result = capture_and_link(&lab, args, &dir, &daemons).map_err(|e| {
        // The run's directory (and the logs in it) goes with the run: say what the gateways
        // said.
        let logs: Vec<String> = daemons
            .iter()
            .map(|d| format!("gateway {} log, last lines:\n{}", d.label, d.log_tail(15)))
            .collect();
        format!("{e}\n{}", logs.join("\n"))
    });
    for d in &mut daemons {
        d.stop(Duration::from_secs(5))?;
    }
    result
}

/// The run's key files, in its private directory.
struct Keys {
    dir: PathBuf,
    keying: Keying,
    /// Identity keys: each gateway's private key file and public key text (A, then B).
    identities: Vec<(PathBuf, String)>,
}

impl Keys {
    /// A pre-shared key per stream (`k0`, `k1`, ...), or an identity key per gateway.
    fn generate(args: &LinkRunArgs, dir: &Path) -> Result<Keys, String> {
        use mt6d::keys;
        let mut identities = Vec::new();
        if args.keying == Keying::Identity {
            for label in ["a", "b"] {
                let private = keys::new_private_key().map_err(|e| e.to_string())?;
                let path = dir.join(format!("gateway-{label}.key"));
                keys::write_secret_file(&path, &keys::encode(private.to_bytes().as_slice()))
                    .map_err(|e| e.to_string())?;
                identities.push((path, keys::public_key_text(&private.public_key())));
            }
        } else {
            for i in 0..args.peers {
                let key = keys::random32().map_err(|e| e.to_string())?;
                keys::write_secret_file(&dir.join(format!("k{i}")), &keys::encode(key.as_slice()))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(Keys {
            dir: dir.to_path_buf(),
            keying: args.keying,
            identities,
        })
    }

    fn identity(&self, side: Side) -> Option<&(PathBuf, String)> {
        self.identities.get(match side {
            Side::A => 0,
            Side::B => 1,
        })
    }
}

/// Both gateways' configuration: one `[[peer]]` per conversation, each with its own
/// pre-shared key or the other gateway's public key. Each gateway keeps its counter state in
/// the run's directory, which is removed after the run (never in the system's state
/// directory).
fn config_text(
    own: &Public,
    far: &Public,
    side: Side,
    args: &LinkRunArgs,
    keys: &Keys,
    socket: &Path,
    topology: &str,
) -> String {
    let state = keys.dir.join(match side {
        Side::A => "state-a",
        Side::B => "state-b",
    });
    let gateway = GatewaySection {
        role: None,
        internal_interface: Some(INTERNAL_IF.to_string()),
        external_interface: EXTERNAL_IF.to_string(),
        tun_name: "mt6d0".to_string(),
        control_socket: socket.display().to_string(),
        rotation_secs: args.rotation_secs,
        mode: args.mode.clone(),
        accept_clear_payload: args.mode != "encrypt",
        external_next_hop: own.router,
        state_dir: Some(state.display().to_string()),
        private_key_file: keys
            .identity(side)
            .map(|(path, _)| path.display().to_string()),
        rekey_secs: None,
        workers: None,
        jitter: keys.keying == Keying::PreSharedJitter,
    };
    let far_public = keys.identity(other(side)).map(|(_, public)| public.clone());
    let peers = far_hosts(args.peers)
        .into_iter()
        .enumerate()
        .map(|(i, far_host)| {
            let (local, remote) = match side {
                Side::A => (HOST_A, far_host),
                Side::B => (far_host, HOST_A),
            };
            PeerSection {
                name: format!("p{i}"),
                local_host: local,
                remote_host: remote,
                key_file: far_public
                    .is_none()
                    .then(|| keys.dir.join(format!("k{i}")).display().to_string()),
                public_key: far_public.clone(),
                local_prefix: None,
                remote_prefix: None,
            }
            .with_prefixes(own.prefix, far.prefix)
        })
        .collect();
    ConfigFile { gateway, peers }.text(&format!(
        "Generated for the linker's {} conversations (gateway {side:?}, {topology} topology).",
        args.peers
    ))
}

fn other(side: Side) -> Side {
    match side {
        Side::A => Side::B,
        Side::B => Side::A,
    }
}

fn capture_and_link(
    lab: &Lab,
    args: &LinkRunArgs,
    dir: &Path,
    daemons: &[DaemonProcess],
) -> Result<LinkRun, String> {
    let hosts = far_hosts(args.peers);
    for &dst in &hosts {
        wait_for(lab, dst)?;
    }
    // Conversations have histories: give conversation i 37 * i exchanges more before the
    // capture. Without this, the streams of one daemon start their counters at the same clock
    // reading and, carrying the same paced traffic, would run in lock step, which hides a
    // running counter behind a coincidence no real set of conversations shows.
    for (i, &dst) in hosts.iter().enumerate().skip(1) {
        lab.host_a
            .run(|| {
                ping(
                    dst,
                    HISTORY * i as u64,
                    Pace::Flood {
                        wait: Duration::from_millis(100),
                    },
                    Duration::from_millis(300),
                )
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("ping {dst}: {e}"))?;
    }
    let near = args
        .pcap
        .clone()
        .unwrap_or_else(|| dir.join("gateway-a-link.pcap"));
    let far = near.with_file_name(format!(
        "{}-far.pcap",
        near.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("capture")
    ));
    let mut watched = vec![HOST_A, GATEWAY_A, GATEWAY_B];
    watched.extend(&hosts);
    let routed = !lab.routers.is_empty();
    let mut observers = vec![Observer::start(
        &lab.gw_a,
        EXTERNAL_IF,
        watched.clone(),
        Some(near.clone()),
    )?];
    if routed {
        observers.push(Observer::start(
            &lab.gw_b,
            EXTERNAL_IF,
            watched,
            Some(far.clone()),
        )?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let poller = std::thread::spawn({
        let stop = stop.clone();
        let socket = daemons[0].socket.clone();
        let data_only = args.keying == Keying::Identity;
        move || poll_truth(&socket, &stop, data_only)
    });
    let duration = Duration::from_secs_f64(args.rotation_secs * f64::from(args.rotations));
    let traffic = conversations(lab, &hosts, args.shapes, duration);
    stop.store(true, Ordering::Relaxed);
    let truth = poller
        .join()
        .map_err(|_| "status poller panicked".to_string())?;
    let mut leaks = 0;
    for o in observers {
        leaks += o.finish()?.frames_with_true_address;
    }
    traffic?;
    let epochs = truth.epochs();
    if args.pcap.is_some() {
        // Beside the capture: the ground truth, so the linker can be run over it again.
        let path = truth_path(&near);
        let text = serde_json::to_string_pretty(&truth.to_routes()).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let t = lab.topology;
    let from_prefix = routed.then(|| lab.public_a.prefix.unwrap_or(Ipv6Addr::UNSPECIFIED));
    let (reports, examples) = link_captures(args, &truth, &near, &far, from_prefix)?;
    Ok(LinkRun {
        margin: MARGIN,
        joint_margin: JOINT_MARGIN,
        topology: t.name().to_string(),
        mode: args.mode.clone(),
        rotation_secs: args.rotation_secs,
        conversations: args.peers,
        shapes: args.shapes,
        keying: args.keying,
        epochs,
        frames_with_true_address: leaks,
        reports,
        examples,
    })
}

/// Links the captures of one run: on the segment, or (routed, `from_prefix` given) on Gateway
/// A's link and past the router. Returns the reports and each vantage's labelled pairs.
fn link_captures(
    args: &LinkRunArgs,
    truth: &Truth,
    near: &Path,
    far: &Path,
    from_prefix: Option<Ipv6Addr>,
) -> Result<(Vec<LinkReport>, Vec<Vec<linker::Example>>), String> {
    let (mut reports, mut examples) = (Vec::new(), Vec::new());
    let mut add = |path: &Path, vantage: Vantage, name: String| -> Result<(), String> {
        let frames = linker::read_pcap(path).map_err(|e| e.to_string())?;
        let capture = linker::Capture::new(&frames, vantage);
        let classifier = args.classifiers.get(reports.len());
        reports.push(linker::link_with(&capture, truth, &name, classifier));
        examples.push(linker::training_examples(
            &capture,
            truth,
            examples.len() as u64,
        ));
        Ok(())
    };
    let t = args.topology;
    if let Some(from_prefix) = from_prefix {
        add(
            near,
            Vantage::OnLink,
            format!("{t}, {}, on Gateway A's link", args.mode),
        )?;
        add(
            far,
            Vantage::PastRouter { from_prefix },
            format!("{t}, {}, past the router (A's packets at B)", args.mode),
        )?;
    } else {
        add(
            near,
            Vantage::OnLink,
            format!("{t}, {}, on the segment", args.mode),
        )?;
    }
    Ok((reports, examples))
}

/// Pings `dst` until one echo is answered (at most 10 s): neighbour discovery is set-up.
fn wait_for(lab: &Lab, dst: Ipv6Addr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let r = lab
            .host_a
            .run(|| {
                ping(
                    dst,
                    1,
                    Pace::Flood {
                        wait: Duration::from_millis(500),
                    },
                    Duration::from_millis(300),
                )
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| e.to_string())?;
        if r.received == 1 {
            return Ok(());
        }
    }
    Err(format!("Host A cannot reach {dst} through the tunnel"))
}

/// Every route of every peer that Gateway A's status names, until `stop`. With `data_only`
/// (identity keys), only each epoch's send route: the other bound routes of an epoch belong to
/// route sets that carry no data then (the link set's handshakes, an old or next session set,
/// docs/PROTOCOL.md §9.8); labelled, they would give a stream several flows in one epoch, which
/// the linker's one-successor scoring does not model. Unlabelled, their flows are left out of
/// the scoring.
fn poll_truth(socket: &Path, stop: &AtomicBool, data_only: bool) -> Truth {
    let mut truth = Truth::default();
    let endpoint = |s: &str| s.parse::<SocketAddrV6>().ok();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(st) = mt6d::control::query_status(socket) {
            for (stream, peer) in st.peers.iter().enumerate() {
                let accepted = if data_only { &[][..] } else { &peer.accept[..] };
                for route in accepted.iter().chain([&peer.send]) {
                    if let (Some(l), Some(r)) = (endpoint(&route.local), endpoint(&route.remote)) {
                        truth.add(
                            l,
                            r,
                            Label {
                                stream,
                                epoch: route.epoch,
                            },
                        );
                    }
                }
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    truth
}

/// Conversations start at random moments within this much of each other: the period of the
/// slowest timer of the mixes (echo 5/s), so that every timer's phase is drawn at random.
const START_SPREAD: Duration = Duration::from_millis(200);

/// One sender of a conversation's traffic.
#[derive(Debug, Clone, Copy)]
enum Source {
    Echo(Pace),
    /// TCP segments of `chunk` bytes, `gap` apart (exponential gaps if `poisson`).
    Tcp {
        chunk: usize,
        gap: Duration,
        poisson: bool,
    },
}

/// What conversation `i` carries in shape group `shapes`; `seed` makes random gaps differ from
/// one conversation and one run to the next.
fn sources(shapes: Shapes, i: usize, seed: u64) -> Vec<Source> {
    let ms = Duration::from_millis;
    let seed = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let echo = |interval: Duration, k: u64| match shapes {
        Shapes::Poisson => Source::Echo(Pace::Poisson {
            mean: interval,
            seed: seed ^ k,
        }),
        _ => Source::Echo(Pace::Timer { interval }),
    };
    let paced = Source::Tcp {
        chunk: 1200,
        gap: ms(20),
        poisson: shapes == Shapes::Poisson,
    };
    match (shapes, i % 4) {
        (Shapes::Timer | Shapes::Poisson, _) => vec![echo(ms(200), 1), echo(ms(10), 2), paced],
        (Shapes::Different, 0) => vec![Source::Tcp {
            chunk: 10_000,
            gap: ms(10),
            poisson: false,
        }],
        (Shapes::Different, 1) => vec![echo(ms(200), 1)],
        (Shapes::Different, 2) => vec![echo(ms(10), 2)],
        (Shapes::Different, _) => Vec::new(),
    }
}

/// Each conversation's traffic to its host of `hosts`, all at once, for `duration`. Each
/// conversation starts at its own random moment within the first [`START_SPREAD`], as
/// conversations that were not started by one program do: timers started together would share
/// their phase, a coincidence that hides what a phase method finds in real traffic.
fn conversations(
    lab: &Lab,
    hosts: &[Ipv6Addr],
    shapes: Shapes,
    duration: Duration,
) -> Result<(), String> {
    let seed: u64 = rand::random();
    std::thread::scope(|s| {
        let mut jobs = Vec::new();
        for (i, &dst) in hosts.iter().enumerate() {
            let start = START_SPREAD.mul_f64(rand::random::<f64>());
            for source in sources(shapes, i, seed) {
                match source {
                    Source::Echo(pace) => {
                        let interval = match pace {
                            Pace::Train { interval } | Pace::Timer { interval } => interval,
                            Pace::Poisson { mean, .. } => mean,
                            Pace::Flood { wait } => wait,
                        };
                        let count = (duration.as_secs_f64() / interval.as_secs_f64()) as u64;
                        jobs.push(s.spawn(move || -> Result<(), String> {
                            std::thread::sleep(start);
                            lab.host_a
                                .run(|| ping(dst, count, pace, Duration::from_secs(1)))
                                .map_err(|e| e.to_string())?
                                .map(|_| ())
                                .map_err(|e| format!("ping {dst}: {e}"))
                        }));
                    }
                    Source::Tcp {
                        chunk,
                        gap,
                        poisson,
                    } => {
                        let port = 7100 + i as u16;
                        let gaps = Gaps {
                            chunk,
                            mean: gap,
                            poisson: poisson.then_some(seed ^ (i as u64) << 8),
                            start,
                        };
                        jobs.push(tcp_job(s, lab, dst, port, gaps, duration)?);
                    }
                }
            }
        }
        jobs.into_iter()
            .map(|j| {
                j.join()
                    .map_err(|_| "traffic thread panicked".to_string())?
            })
            .collect::<Result<Vec<()>, String>>()
            .map(|_| ())
    })
}

/// A paced TCP stream to `[dst]:port` and its receiver on Host B's side; the job checks that
/// every byte sent arrived.
fn tcp_job<'s, 'l: 's>(
    s: &'s std::thread::Scope<'s, '_>,
    lab: &'l Lab,
    dst: Ipv6Addr,
    port: u16,
    gaps: Gaps,
    duration: Duration,
) -> Result<std::thread::ScopedJoinHandle<'s, Result<(), String>>, String> {
    let listener = lab
        .host_b
        .run(|| transfer::listen(dst, port))
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("listen on [{dst}]:{port}: {e}"))?;
    let receiver = s.spawn(move || transfer::serve_once(listener, Duration::from_secs(10)));
    Ok(s.spawn(move || -> Result<(), String> {
        std::thread::sleep(gaps.start);
        let sent = lab
            .host_a
            .run(|| paced_tcp(dst, port, gaps, duration))
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("TCP to [{dst}]:{port}: {e}"))?;
        let got = receiver
            .join()
            .map_err(|_| "TCP receiver panicked".to_string())?
            .map_err(|e| format!("TCP receiver [{dst}]:{port}: {e}"))?;
        if got.bytes == sent {
            Ok(())
        } else {
            Err(format!(
                "TCP to {dst}: sent {sent} bytes, {} arrived",
                got.bytes
            ))
        }
    }))
}

/// A paced stream's writes of `chunk` bytes, from `start` on, `mean` apart: fixed gaps, or
/// exponential ones from a seed.
#[derive(Debug, Clone, Copy)]
struct Gaps {
    chunk: usize,
    mean: Duration,
    poisson: Option<u64>,
    start: Duration,
}

/// A TCP stream of writes paced by `gaps`; returns the bytes sent.
fn paced_tcp(dst: Ipv6Addr, port: u16, gaps: Gaps, duration: Duration) -> std::io::Result<u64> {
    use std::io::{Read, Write};
    let addr = SocketAddrV6::new(dst, port, 0, 0);
    let mut stream = std::net::TcpStream::connect_timeout(&addr.into(), Duration::from_secs(5))?;
    stream.set_write_timeout(Some(Duration::from_secs(10)))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let data = vec![0x5au8; gaps.chunk];
    let mut random = gaps
        .poisson
        .map(|seed| super::ping::poisson_gaps(gaps.mean, seed));
    let start = Instant::now();
    let mut sent = 0u64;
    while start.elapsed() < duration {
        stream.write_all(&data)?;
        sent += data.len() as u64;
        let pause = random
            .as_mut()
            .and_then(Iterator::next)
            .unwrap_or(gaps.mean);
        std::thread::sleep(pause);
    }
    stream.shutdown(std::net::Shutdown::Write)?;
    let mut answer = [0u8; 40];
    stream.read_exact(&mut answer)?;
    Ok(sent)
}

/// Where the ground truth of a capture is kept: `<stem>.truth.json` beside it.
pub fn truth_path(pcap: &Path) -> PathBuf {
    pcap.with_file_name(format!(
        "{}.truth.json",
        pcap.file_stem()
            .and_then(|s| s.to_str())
            .unwrap_or("capture")
    ))
}

/// Runs the linker over a capture written earlier and its ground truth (`truth_path`);
/// `past_router` keeps only packets from that /64.
pub fn link_files(
    pcap: &Path,
    truth: &Path,
    past_router: Option<Ipv6Addr>,
) -> Result<LinkReport, String> {
    let text = std::fs::read_to_string(truth).map_err(|e| format!("{}: {e}", truth.display()))?;
    let routes: Vec<linker::TruthRoute> =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", truth.display()))?;
    let frames = linker::read_pcap(pcap).map_err(|e| e.to_string())?;
    let vantage = match past_router {
        Some(from_prefix) => Vantage::PastRouter { from_prefix },
        None => Vantage::OnLink,
    };
    Ok(linker::link(
        &linker::Capture::new(&frames, vantage),
        &Truth::from_routes(&routes),
        &pcap.display().to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use mt6d::config::{Config, Keying as DaemonKeying};
    use std::os::unix::fs::DirBuilderExt;

    /// The linker's gateways read what the lab meant for each keying: a pre-shared key per
    /// stream (jitter on or off) or the other gateway's public key, and always a state
    /// directory inside the run's own directory (which the run removes): the lab leaves no
    /// counter file in the system's state directory.
    #[test]
    fn linker_gateways_read_their_keying_and_keep_state_in_the_run() {
        let dir = std::env::temp_dir().join(format!("mt6d-linker-cfg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let _guard = DirGuard(dir.clone());
        let a = |s: &str| s.parse().expect("literal");
        let public = Public {
            addr: a("2001:db8:1::1"),
            prefix: None,
            router: None,
            next_hop: a("2001:db8:1::2"),
        };
        for keying in Keying::ALL {
            let run_dir = dir.join(keying.name());
            std::fs::DirBuilder::new()
                .mode(0o700)
                .recursive(true)
                .create(&run_dir)
                .expect("run dir");
            let args = LinkRunArgs {
                topology: Topology::Switched,
                mode: "encrypt".into(),
                rotation_secs: 1.0,
                rotations: 2,
                peers: 3,
                mt6d: PathBuf::from("mt6d"),
                pcap: None,
                shapes: Shapes::Timer,
                classifiers: Vec::new(),
                keying,
            };
            let keys = Keys::generate(&args, &run_dir).expect("keys");
            for side in [Side::A, Side::B] {
                let text = config_text(
                    &public,
                    &public,
                    side,
                    &args,
                    &keys,
                    &run_dir.join("ctl.sock"),
                    "switched",
                );
                let cfg = Config::parse(&run_dir.join("gw.toml"), &text)
                    .unwrap_or_else(|e| panic!("{keying}: {e}\n{text}"));
                assert!(
                    cfg.gateway.state_dir.starts_with(&run_dir),
                    "{keying}: state in {} ({text})",
                    cfg.gateway.state_dir.display()
                );
                assert_eq!(cfg.peers.len(), 3);
                for peer in &cfg.peers {
                    assert_eq!(
                        peer.stream.jitter,
                        keying == Keying::PreSharedJitter,
                        "{keying}"
                    );
                    match (&peer.keying, keying) {
                        (DaemonKeying::Handshake(_), Keying::Identity) => {}
                        (DaemonKeying::PreShared, Keying::PreShared | Keying::PreSharedJitter) => {}
                        (k, _) => panic!("{keying}: the daemon reads {k:?}"),
                    }
                }
            }
        }
    }
}
