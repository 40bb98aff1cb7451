//! Relay networks in network namespaces (seed 003; docs/CONFIG.md "The relay role"):
//! every node a namespace running `mt6d run -c FILE` with a `[relay]` table, every link a veth
//! pair, every protected host a namespace behind its edge gateway. `mt6d demo --topology
//! relays` ([`demo`]) and `tests/relay_netns.rs` are built from it.
//!
//! ```text
//! chain:  h1 - eA == r1 == r2 == eB - h2
//!
//! mesh:   h1 - e1 ==\          /== e3 - h3
//!         h2 - e2 == r1 ==== r2 == e4 - h4
//!                      \\  //
//!                        r3 == e5 - h5, e6 - h6
//! ```
//!
//! `==` is a relay link (an encrypt-mode MT6D stream, one veth pair), `-` a protected host's
//! own link to its edge gateway. Node `n` (in the order of [`Shape::plan`]) is
//! `2001:db8:ff:n::1`, its /64 its own; host `k` is `fd00:k::10` with its edge gateway at
//! `fd00:k::1` (the host's default route). A node makes its /64 local itself (AnyIP route and
//! tproxy); the lab routes each neighbour's /64 to it over the veth between them, via the
//! neighbour's link-local address, as an operator routes a neighbour's prefix to it, and no
//! /64 anywhere else: a node reaches only its neighbours. Edge gateways forward (their TUN
//! device on one side, the host's veth on the other).
//!
//! What the lab owns: the namespaces (deleted on drop, and with them every veth, nftables table
//! and route inside), the daemons it started (SIGTERM by pid, then SIGKILL), and a private
//! directory with every key (mode 0600), configuration file, log, control socket and capture
//! (removed on drop). Link loss is an nftables `numgen random` rule on the ingress hook of both
//! ends of a veth (this kernel has no netem), so every frame of either direction passes it
//! however the daemon sent it.

use std::net::Ipv6Addr;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use mt6d_os::{sysctl, unique_name, AddrFlags, Netns};

use super::daemon::DaemonProcess;
use super::ping::{ping, Pace, PingReport};
use super::topology::{dad_settled, in_ns, prepare_namespace, veth, LabError};
use super::transfer::{self, TransferReport};
use mt6d::control::AnyStatus;
use mt6d::status::relay::RelayStatus;

mod config;
pub mod demo;
mod faults;
mod wire;

pub use config::METRICS_LISTEN;
pub use faults::{parse_route, Reroute};
pub use wire::{LinkWire, WireWatch, DATA_FRAME_MIN};

/// The edge gateway's side of a host's link, and the host's.
pub const EDGE_HOST_IF: &str = "host0";
pub const HOST_IF: &str = "eth0";
/// Node `n`'s `[relay] address`; its /64 is `2001:db8:ff:n::/64`.
pub fn node_address(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, n, 0, 0, 0, 1)
}

/// Node `n`'s /64.
pub fn node_prefix(n: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0xff, n, 0, 0, 0, 0)
}

/// Host `k`'s true address.
pub fn host_address(k: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, k, 0, 0, 0, 0, 0, 0x10)
}

/// Host `k`'s edge gateway on the host's link (the host's default router).
pub fn edge_host_side(k: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, k, 0, 0, 0, 0, 0, 1)
}

/// Which relay network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// h1 - eA - r1 - r2 - eB - h2: one path, two relays.
    Chain,
    /// Three fully meshed relays, two edge gateways behind each, one host behind each edge.
    Mesh,
}

/// The nodes, links and end-to-end pairs of a [`Shape`].
#[derive(Debug, Clone)]
pub struct Plan {
    /// (name, the host behind it for an edge gateway); node `i` is number `i + 1`.
    pub nodes: Vec<(&'static str, Option<u16>)>,
    /// (node, node) by name.
    pub links: Vec<(&'static str, &'static str)>,
    /// (host, host) by number: the pairs with an `[[relay.e2e]]` at both edge gateways.
    pub pairs: Vec<(u16, u16)>,
}

impl Shape {
    pub fn name(self) -> &'static str {
        match self {
            Shape::Chain => "chain",
            Shape::Mesh => "mesh",
        }
    }

    pub fn plan(self) -> Plan {
        match self {
            Shape::Chain => Plan {
                nodes: vec![("eA", Some(1)), ("r1", None), ("r2", None), ("eB", Some(2))],
                links: vec![("eA", "r1"), ("r1", "r2"), ("r2", "eB")],
                pairs: vec![(1, 2)],
            },
            Shape::Mesh => {
                let hosts = 1..=6u16;
                Plan {
                    nodes: vec![
                        ("r1", None),
                        ("r2", None),
                        ("r3", None),
                        ("e1", Some(1)),
                        ("e2", Some(2)),
                        ("e3", Some(3)),
                        ("e4", Some(4)),
                        ("e5", Some(5)),
                        ("e6", Some(6)),
                    ],
                    links: vec![
                        ("r1", "r2"),
                        ("r1", "r3"),
                        ("r2", "r3"),
                        ("e1", "r1"),
                        ("e2", "r1"),
                        ("e3", "r2"),
                        ("e4", "r2"),
                        ("e5", "r3"),
                        ("e6", "r3"),
                    ],
                    // Every host may talk to every other: the experiments pick among them.
                    pairs: hosts
                        .clone()
                        .flat_map(|a| hosts.clone().filter(move |b| *b > a).map(move |b| (a, b)))
                        .collect(),
                }
            }
        }
    }
}

/// What every node of the lab is told.
#[derive(Debug, Clone)]
pub struct RelaySettings {
    /// The links' (and the end-to-end streams') rotation interval.
    pub rotation_secs: f64,
    pub jitter: bool,
    /// The mt6d executable the nodes run (a test's build, or the running one).
    pub mt6d: PathBuf,
    pub log_level: String,
    /// Every node's `workers` (None: unset, one per online CPU).
    pub workers: Option<usize>,
}

/// One node: relay, edge gateway, or both.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    /// Its number: its address is [`node_address`]`(n)`.
    pub n: u16,
    pub address: Ipv6Addr,
    pub ns: Netns,
    /// The host behind an edge gateway (its number).
    pub host: Option<u16>,
    /// The node's identity key file and public key (every node: the links' handshakes).
    pub identity: Option<(PathBuf, String)>,
    pub config: PathBuf,
    pub socket: PathBuf,
    pub log: PathBuf,
}

/// One protected host.
#[derive(Debug)]
pub struct Host {
    pub name: String,
    pub k: u16,
    pub address: Ipv6Addr,
    pub ns: Netns,
    /// Its edge gateway (index into [`RelayLab::nodes`]).
    pub edge: usize,
}

/// One relay link: a veth pair `l-<b>` in `a`, `l-<a>` in `b`.
#[derive(Debug, Clone)]
pub struct Link {
    /// `a-b`.
    pub name: String,
    pub a: usize,
    pub b: usize,
    pub if_a: String,
    pub if_b: String,
}

/// A built relay network. Dropping it stops the daemons, then deletes the namespaces and the
/// private directory.
#[derive(Debug)]
pub struct RelayLab {
    pub shape: Shape,
    /// Per node, once started.
    daemons: Vec<Option<DaemonProcess>>,
    pub nodes: Vec<Node>,
    pub hosts: Vec<Host>,
    pub links: Vec<Link>,
    /// (host, host) by index into `hosts`.
    pub pairs: Vec<(usize, usize)>,
    pub settings: RelaySettings,
    /// Keys, configuration files, logs, sockets, captures.
    pub dir: PathBuf,
    /// Each link's loss in percent, as last set.
    loss: std::sync::Mutex<Vec<u8>>,
}

fn cmd_err(what: impl std::fmt::Display) -> LabError {
    LabError::Command(what.to_string())
}

fn os_err(what: String) -> impl FnOnce(mt6d_os::OsError) -> LabError {
    move |source| LabError::Os { what, source }
}

const NO_DAD: AddrFlags = AddrFlags {
    nodad: true,
    noprefixroute: false,
};

impl RelayLab {
    /// Builds `shape` and starts every node; returns once every edge gateway has a route to
    /// each of its end-to-end peers. Namespace names start with `prefix`.
    pub fn up(shape: Shape, prefix: &str, settings: RelaySettings) -> Result<RelayLab, LabError> {
        let mut lab = RelayLab::build(shape, prefix, settings)?;
        lab.start(Duration::from_secs(10))?;
        lab.wait_routes(Duration::from_secs(20))?;
        Ok(lab)
    }

    /// The namespaces, links, routes, keys and configuration files; no daemon yet.
    pub fn build(
        shape: Shape,
        prefix: &str,
        settings: RelaySettings,
    ) -> Result<RelayLab, LabError> {
        let plan = shape.plan();
        let dir = std::env::temp_dir().join(format!("mt6d-relays-{}", unique_name(prefix)));
        std::fs::DirBuilder::new()
            .mode(0o700)
            .recursive(true)
            .create(&dir)
            .map_err(|e| cmd_err(format!("{}: {e}", dir.display())))?;
        let mut lab = RelayLab {
            shape,
            daemons: Vec::new(),
            nodes: Vec::new(),
            hosts: Vec::new(),
            links: Vec::new(),
            pairs: Vec::new(),
            settings,
            dir,
            loss: std::sync::Mutex::new(Vec::new()),
        };
        let ns = |name: &str| {
            let full = unique_name(&format!("{prefix}{name}"));
            Netns::create(&full).map_err(os_err(format!("create namespace {full}")))
        };
        for (i, &(name, host)) in plan.nodes.iter().enumerate() {
            let n = u16::try_from(i + 1).map_err(cmd_err)?;
            lab.nodes.push(Node {
                name: name.to_string(),
                n,
                address: node_address(n),
                ns: ns(name)?,
                host,
                identity: None,
                config: lab.dir.join(format!("{name}.toml")),
                socket: lab.dir.join(format!("{name}.sock")),
                log: lab.dir.join(format!("{name}.log")),
            });
            lab.daemons.push(None);
        }
        for (edge, node) in lab.nodes.iter().enumerate() {
            if let Some(k) = node.host {
                lab.hosts.push(Host {
                    name: format!("h{k}"),
                    k,
                    address: host_address(k),
                    ns: ns(&format!("h{k}"))?,
                    edge,
                });
            }
        }
        for n in lab.namespaces() {
            prepare_namespace(n)?;
        }
        for &(a, b) in &plan.links {
            let (ia, ib) = (lab.node_index(a)?, lab.node_index(b)?);
            let link = Link {
                name: format!("{a}-{b}"),
                a: ia,
                b: ib,
                if_a: format!("l-{b}"),
                if_b: format!("l-{a}"),
            };
            veth(&lab.nodes[ia].ns, &link.if_a, &lab.nodes[ib].ns, &link.if_b)?;
            lab.links.push(link);
            lab.lock_loss().push(0);
        }
        lab.host_links()?;
        lab.neighbour_routes()?;
        for n in lab.namespaces() {
            dad_settled(n, Duration::from_secs(3))?;
        }
        for &(x, y) in &plan.pairs {
            let (a, b) = (lab.host_index(x)?, lab.host_index(y)?);
            lab.pairs.push((a, b));
        }
        lab.write_files()?;
        Ok(lab)
    }

    fn namespaces(&self) -> impl Iterator<Item = &Netns> {
        self.nodes
            .iter()
            .map(|n| &n.ns)
            .chain(self.hosts.iter().map(|h| &h.ns))
    }

    /// The node called `name`.
    pub fn node_index(&self, name: &str) -> Result<usize, LabError> {
        self.nodes
            .iter()
            .position(|n| n.name == name)
            .ok_or_else(|| cmd_err(format!("no node {name} in the {} lab", self.shape.name())))
    }

    /// Host number `k` (`hk`).
    pub fn host_index(&self, k: u16) -> Result<usize, LabError> {
        self.hosts
            .iter()
            .position(|h| h.k == k)
            .ok_or_else(|| cmd_err(format!("no host h{k} in the {} lab", self.shape.name())))
    }

    /// The link between nodes `a` and `b` (either order).
    pub fn link_index(&self, a: &str, b: &str) -> Result<usize, LabError> {
        let (ia, ib) = (self.node_index(a)?, self.node_index(b)?);
        self.links
            .iter()
            .position(|l| (l.a, l.b) == (ia, ib) || (l.a, l.b) == (ib, ia))
            .ok_or_else(|| cmd_err(format!("no link {a}-{b} in the {} lab", self.shape.name())))
    }

    /// Each host on its own veth behind its edge gateway, the edge forwarding between it and
    /// the TUN device the daemon will create.
    fn host_links(&self) -> Result<(), LabError> {
        for h in &self.hosts {
            let edge = &self.nodes[h.edge];
            veth(&edge.ns, EDGE_HOST_IF, &h.ns, HOST_IF)?;
            let (host_addr, edge_addr) = (h.address, edge_host_side(h.k));
            in_ns(&h.ns, |nl| {
                let i = nl.link_index(HOST_IF)?;
                nl.add_address(i, host_addr, 64, NO_DAD)?;
                nl.add_route_via(Ipv6Addr::UNSPECIFIED, 0, i, edge_addr)
            })?;
            in_ns(&edge.ns, |nl| {
                sysctl::set_ipv6_conf("all", "forwarding", "1")?;
                let i = nl.link_index(EDGE_HOST_IF)?;
                nl.add_address(i, edge_addr, 64, NO_DAD)
            })?;
        }
        Ok(())
    }

    /// On the veth between X and Y, X routes Y's /64 via Y's link-local address there.
    fn neighbour_routes(&self) -> Result<(), LabError> {
        for l in &self.links {
            for (me, my_if, peer, peer_if) in
                [(l.a, &l.if_a, l.b, &l.if_b), (l.b, &l.if_b, l.a, &l.if_a)]
            {
                let via = link_local(&self.nodes[peer].ns, peer_if)?;
                let prefix = node_prefix(self.nodes[peer].n);
                let my_if = my_if.clone();
                in_ns(&self.nodes[me].ns, move |nl| {
                    let i = nl.link_index(&my_if)?;
                    nl.add_route_via(prefix, 64, i, via)
                })?;
            }
        }
        Ok(())
    }

    /// Makes node `at` reach node `towards`'s /64 on-link on their shared link instead of via
    /// its link-local address, as a router on a segment shared with the node would: `at`'s
    /// kernel then resolves each hashed address of `towards` by a Neighbour Solicitation,
    /// which `towards`'s responder must answer (docs/CONFIG.md, `neighbor_discovery`).
    pub fn route_on_link(&self, at: usize, towards: usize) -> Result<(), LabError> {
        let my_if = self
            .links
            .iter()
            .find_map(|l| match (l.a, l.b) {
                (a, b) if a == at && b == towards => Some(l.if_a.clone()),
                (a, b) if a == towards && b == at => Some(l.if_b.clone()),
                _ => None,
            })
            .ok_or_else(|| {
                cmd_err(format!(
                    "no link between {} and {}",
                    self.nodes[at].name, self.nodes[towards].name
                ))
            })?;
        let prefix = node_prefix(self.nodes[towards].n);
        in_ns(&self.nodes[at].ns, move |nl| {
            let i = nl.link_index(&my_if)?;
            nl.del_route(prefix, 64, i)?;
            nl.add_route(prefix, 64, i)
        })
    }

    /// Stops every node, rewrites every file with `workers` (None: one per online CPU), starts
    /// them again and waits for their routes: the same lab with another data-plane width.
    pub fn restart_with_workers(&mut self, workers: Option<usize>) -> Result<(), LabError> {
        for i in 0..self.nodes.len() {
            self.stop_node(i)?;
        }
        self.settings.workers = workers;
        for i in 0..self.nodes.len() {
            self.write_config(i)?;
        }
        self.start(Duration::from_secs(10))?;
        self.wait_routes(Duration::from_secs(20))?;
        Ok(())
    }

    /// Starts every node's daemon and waits until each answers `status`.
    pub fn start(&mut self, timeout: Duration) -> Result<(), LabError> {
        for i in 0..self.nodes.len() {
            self.start_node(i)?;
        }
        let deadline = Instant::now() + timeout;
        for i in 0..self.nodes.len() {
            self.wait_answering(i, deadline)?;
        }
        Ok(())
    }

    /// Starts node `i`'s daemon (again, after [`RelayLab::stop_node`]).
    pub fn start_node(&mut self, i: usize) -> Result<(), LabError> {
        let node = &self.nodes[i];
        let mut cmd = node
            .ns
            .command(&self.settings.mt6d)
            .map_err(os_err(format!("command in {}", node.ns.name())))?;
        cmd.arg("run").arg("-c").arg(&node.config);
        let d = DaemonProcess::spawn(&node.name, cmd, &node.socket, &node.log).map_err(cmd_err)?;
        self.daemons[i] = Some(d);
        Ok(())
    }

    /// Stops node `i`'s daemon (SIGTERM; Err if it did not exit cleanly).
    pub fn stop_node(&mut self, i: usize) -> Result<(), LabError> {
        match self.daemons[i].take() {
            Some(mut d) => d.stop(Duration::from_secs(5)).map_err(cmd_err),
            None => Ok(()),
        }
    }

    /// The pid of node `i`'s daemon, if it runs.
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.daemons.get(i)?.as_ref()?.pid()
    }

    /// Kills node `i`'s daemon with SIGKILL, as a crash would end it, and waits for it to be
    /// gone: what it added to the kernel stays (`mt6d down -c FILE` removes it). Returns the
    /// pid it had, `None` if it was not running. Its log stays readable.
    pub fn kill_node(&mut self, i: usize) -> Option<u32> {
        let d = self.daemons[i].as_mut()?;
        let pid = d.pid();
        d.kill_hard();
        pid
    }

    fn wait_answering(&mut self, i: usize, deadline: Instant) -> Result<RelayStatus, LabError> {
        loop {
            let last = match relay_status(&self.nodes[i].socket) {
                Ok(st) => return Ok(st),
                Err(e) => e,
            };
            let Some(d) = self.daemons[i].as_mut() else {
                return Err(cmd_err(format!(
                    "node {} is not running",
                    self.nodes[i].name
                )));
            };
            if !d.is_running() || Instant::now() >= deadline {
                return Err(cmd_err(format!(
                    "node {} does not answer on {} ({last}); its log ends:\n{}",
                    self.nodes[i].name,
                    self.nodes[i].socket.display(),
                    d.log_tail(20)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every edge gateway has a next hop for every one of its end-to-end peers.
    pub fn wait_routes(&self, timeout: Duration) -> Result<Duration, LabError> {
        let start = Instant::now();
        loop {
            let mut missing = Vec::new();
            for (i, node) in self.nodes.iter().enumerate() {
                if node.host.is_none() {
                    continue;
                }
                match self.status(i) {
                    Ok(st) => missing.extend(
                        st.e2e
                            .iter()
                            .filter(|e| e.next_hop.is_none())
                            .map(|e| format!("{}: {}", node.name, e.name)),
                    ),
                    Err(e) => missing.push(e),
                }
            }
            if missing.is_empty() {
                return Ok(start.elapsed());
            }
            if start.elapsed() >= timeout {
                return Err(cmd_err(format!(
                    "after {timeout:?} still no route for {}\n{}",
                    missing.join(", "),
                    self.log_tails(10)
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Node `i`'s status.
    /// Node `i`'s metrics page (the body of `GET /metrics` on [`METRICS_LISTEN`]).
    pub fn metrics(&self, i: usize) -> Result<String, String> {
        let reply = self.nodes[i]
            .ns
            .run(|| {
                use std::io::{Read, Write};
                let mut c = std::net::TcpStream::connect(METRICS_LISTEN)?;
                c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")?;
                let mut reply = String::new();
                c.read_to_string(&mut reply)?;
                Ok::<_, std::io::Error>(reply)
            })
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("{}: metrics: {e}", self.nodes[i].name))?;
        match reply.split_once("\r\n\r\n") {
            Some((head, body)) if head.starts_with("HTTP/1.1 200 OK") => Ok(body.to_string()),
            _ => Err(format!("{}: metrics answered {reply}", self.nodes[i].name)),
        }
    }

    pub fn status(&self, i: usize) -> Result<RelayStatus, String> {
        relay_status(&self.nodes[i].socket)
            .map_err(|e| format!("status of {}: {e}", self.nodes[i].name))
    }

    /// The last `lines` of every node's log, for an error message.
    pub fn log_tails(&self, lines: usize) -> String {
        self.nodes
            .iter()
            .zip(&self.daemons)
            .filter_map(|(n, d)| {
                d.as_ref()
                    .map(|d| format!("--- {}:\n{}", n.name, d.log_tail(lines)))
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// The nodes whose daemon was started and is no longer running.
    pub fn exited(&mut self) -> Vec<String> {
        let mut gone = Vec::new();
        for (n, d) in self.nodes.iter().zip(self.daemons.iter_mut()) {
            if let Some(d) = d {
                if !d.is_running() {
                    gone.push(n.name.clone());
                }
            }
        }
        gone
    }

    /// Echo requests from host `from` to host `to` (indexes into `hosts`).
    pub fn ping(
        &self,
        from: usize,
        to: usize,
        count: u64,
        pace: Pace,
        linger: Duration,
    ) -> Result<PingReport, String> {
        let dst = self.hosts[to].address;
        self.hosts[from]
            .ns
            .run(|| ping(dst, count, pace, linger))
            .map_err(|e| e.to_string())?
            .map_err(|e| {
                format!(
                    "ping {} -> {}: {e}",
                    self.hosts[from].name, self.hosts[to].name
                )
            })
    }

    /// Single echoes until one is answered: the path is up, neighbour discovery included.
    pub fn wait_for_path(&self, from: usize, to: usize, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        loop {
            let r = self.ping(
                from,
                to,
                1,
                Pace::Flood {
                    wait: Duration::from_millis(300),
                },
                Duration::from_millis(200),
            )?;
            if r.received == 1 {
                return Ok(());
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} never reached {} within {limit:?}\n{}",
                    self.hosts[from].name,
                    self.hosts[to].name,
                    self.log_tails(10)
                ));
            }
        }
    }

    /// The TCP transfers of `flows`, all at once (one sender and one receiver thread each).
    pub fn transfers(&self, flows: &[Flow]) -> Result<Vec<TransferReport>, String> {
        let mut listeners = Vec::with_capacity(flows.len());
        for f in flows {
            let dst = self.hosts[f.to].address;
            let l = self.hosts[f.to]
                .ns
                .run(|| transfer::listen(dst, f.port))
                .map_err(|e| e.to_string())?
                .map_err(|e| format!("listen on [{dst}]:{}: {e}", f.port))?;
            listeners.push(l);
        }
        std::thread::scope(|s| {
            let receivers: Vec<_> = listeners
                .into_iter()
                .map(|l| s.spawn(move || transfer::serve_once(l, Duration::from_secs(10))))
                .collect();
            let senders: Vec<_> = flows
                .iter()
                .map(|f| {
                    let (host, dst) = (&self.hosts[f.from], self.hosts[f.to].address);
                    s.spawn(move || {
                        host.ns
                            .run(|| match f.size {
                                Size::Bytes(n) => transfer::send_bytes(dst, f.port, n, f.seed),
                                Size::For(d) => transfer::send_for(dst, f.port, d, f.seed),
                                Size::Paced(n, d) => {
                                    transfer::send_paced(dst, f.port, n, d, f.seed)
                                }
                            })
                            .map_err(|e| e.to_string())?
                            .map_err(|e| e.to_string())
                    })
                })
                .collect();
            let mut reports = Vec::with_capacity(flows.len());
            for ((f, snd), rcv) in flows.iter().zip(senders).zip(receivers) {
                let what = format!("{} -> {}", self.hosts[f.from].name, self.hosts[f.to].name);
                let sent = snd
                    .join()
                    .map_err(|_| format!("{what}: sender panicked"))?
                    .map_err(|e| format!("{what}: send: {e}"))?;
                rcv.join()
                    .map_err(|_| format!("{what}: receiver panicked"))?
                    .map_err(|e| format!("{what}: receive: {e}"))?;
                reports.push(sent);
            }
            Ok(reports)
        })
    }

    /// Every address an observer of a relay link must never see: the hosts', the edge
    /// gateways' on the hosts' links, and every node's configured `address`.
    pub fn true_addresses(&self) -> Vec<Ipv6Addr> {
        self.hosts
            .iter()
            .flat_map(|h| [h.address, edge_host_side(h.k)])
            .chain(self.nodes.iter().map(|n| n.address))
            .collect()
    }

    /// Whether every node sees every one of its links up (none down or on probation).
    pub fn links_up(&self) -> Result<bool, String> {
        for i in 0..self.nodes.len() {
            if self.status(i)?.links.iter().any(|l| l.state != "up") {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Waits until [`RelayLab::links_up`] (a link that lost frames stays on probation for 10 s
    /// after it recovers).
    pub fn wait_links_up(&self, limit: Duration) -> Result<Duration, String> {
        let start = Instant::now();
        while !self.links_up()? {
            if start.elapsed() >= limit {
                return Err(format!("links not all up after {limit:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(start.elapsed())
    }
}

impl Drop for RelayLab {
    fn drop(&mut self) {
        // Every daemon is told at once, then each is waited for: nine sequential stops would
        // cost nine shutdowns.
        for d in self.daemons.iter().flatten() {
            if let Some(pid) = d.pid() {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid as i32),
                    nix::sys::signal::Signal::SIGTERM,
                );
            }
        }
        for d in self.daemons.iter_mut().flatten() {
            let _ = d.stop(Duration::from_secs(5));
        }
        self.daemons.clear();
        // The namespaces go with `nodes` and `hosts`; the directory now.
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One TCP transfer from host `from` to host `to` (indexes into `hosts`), to `port`, of
/// random data seeded with `seed`.
#[derive(Debug, Clone, Copy)]
pub struct Flow {
    pub from: usize,
    pub to: usize,
    pub size: Size,
    pub port: u16,
    pub seed: u64,
}

/// How much a [`Flow`] sends.
#[derive(Debug, Clone, Copy)]
pub enum Size {
    /// A file of this many bytes.
    Bytes(u64),
    /// As much as it can for this long.
    For(Duration),
    /// A file of this many bytes spread evenly over this long.
    Paced(u64, Duration),
}

/// Asks the daemon at `socket` for its status, which must be a relay node's.
pub fn relay_status(socket: &Path) -> Result<RelayStatus, String> {
    match mt6d::control::query_any_status(socket).map_err(|e| e.to_string())? {
        AnyStatus::Relay(st) => Ok(st),
        _ => Err(format!("{}: not a relay node's status", socket.display())),
    }
}

/// Every drop and failure of a node: the node's drops by label (`drop_*`) and the daemon's
/// own (`rx_no_link`, `tun_no_route`, `socket_queue_drops`, ...).
pub fn dropped(st: &RelayStatus) -> u64 {
    st.counters
        .iter()
        .filter(|(k, _)| is_drop_label(k))
        .map(|(_, v)| v)
        .sum()
}

/// Whether a status counter counts drops or failures: anything but the activity counters and
/// the data plane's time per stage.
pub fn is_drop_label(name: &str) -> bool {
    const ACTIVITY: [&str; 10] = [
        "rx_datagrams",
        "tx_datagrams",
        "tun_rx_packets",
        "tun_tx_packets",
        "forwarded",
        "delivered",
        "originated",
        "probes_answered",
        "routing_received",
        "keepalives",
    ];
    // `rx_refused` is the sum of the receive gate's refusals, each also in its `drop_<reason>`.
    !name.starts_with("stage_") && name != "rx_refused" && !ACTIVITY.contains(&name)
}

/// The counters of `after` that rose since `before`, with how much.
pub fn rose(before: &RelayStatus, after: &RelayStatus) -> Vec<(String, u64)> {
    after
        .counters
        .iter()
        .filter_map(|(k, v)| {
            let was = before.counters.get(k).copied().unwrap_or(0);
            (*v > was).then(|| (k.clone(), v - was))
        })
        .collect()
}

/// The kernel's link-local address of `iface` in `ns`, once it has one (at most 5 s).
fn link_local(ns: &Netns, iface: &str) -> Result<Ipv6Addr, LabError> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let found = in_ns(ns, |nl| {
            let i = nl.link_index(iface)?;
            Ok(nl
                .list_addresses(i)?
                .into_iter()
                .find(|a| a.addr.segments()[0] & 0xffc0 == 0xfe80 && !a.tentative)
                .map(|a| a.addr))
        })?;
        if let Some(a) = found {
            return Ok(a);
        }
        if Instant::now() >= deadline {
            return Err(cmd_err(format!(
                "{iface} in {} got no link-local address",
                ns.name()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_name_every_link_end_and_pair() {
        for shape in [Shape::Chain, Shape::Mesh] {
            let p = shape.plan();
            let names: Vec<&str> = p.nodes.iter().map(|n| n.0).collect();
            assert!(p
                .links
                .iter()
                .all(|(a, b)| names.contains(a) && names.contains(b)));
            let hosts: Vec<u16> = p.nodes.iter().filter_map(|n| n.1).collect();
            assert!(p
                .pairs
                .iter()
                .all(|(a, b)| hosts.contains(a) && hosts.contains(b) && a < b));
        }
        assert_eq!(Shape::Mesh.plan().pairs.len(), 15);
        assert_eq!(
            node_address(3),
            "2001:db8:ff:3::1".parse::<Ipv6Addr>().expect("literal")
        );
        assert_eq!(
            host_address(4),
            "fd00:4::10".parse::<Ipv6Addr>().expect("literal")
        );
    }

    #[test]
    fn drop_labels_are_told_from_activity() {
        assert!(is_drop_label("drop_open_bad_tag") && is_drop_label("rx_no_link"));
        assert!(is_drop_label("socket_queue_drops") && is_drop_label("tun_no_route"));
        assert!(!is_drop_label("forwarded") && !is_drop_label("rx_datagrams"));
        assert!(!is_drop_label("stage_node_ns"));
    }
}
