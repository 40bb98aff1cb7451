//! What `mt6d demo` is asked (its options) and how it talks to the person running it: shared by
//! the two-gateway demo and the relay network's.

use std::io::Write as _;
use std::path::PathBuf;

use super::topology::Topology;
use super::unlinkability::{Keying, Shapes};

/// Options of `mt6d demo`.
#[derive(clap::Args, Debug)]
pub struct DemoArgs {
    /// Seconds between address rotations (the configuration's `rotation_secs`; `--rotation`
    /// is accepted too).
    #[arg(
        long = "rotation-secs",
        alias = "rotation",
        value_name = "SECS",
        default_value_t = 2.0
    )]
    pub rotation: f64,
    /// Seconds for each timed phase (ping train, TCP transfer).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    pub duration: f64,
    /// What lies between the gateways: switched (one segment, default), routed (a router that
    /// queues one packet per unresolved neighbour) or tunneled (routed plus a VXLAN hop with a
    /// 1450-byte MTU). Or `relays`: a relay network of three meshed relays and six edge
    /// gateways, with 003's experiments (transfers under loss, a cut link, captures).
    #[arg(long, default_value = "switched", value_parser = parse_topology)]
    pub topology: DemoTopology,
    /// Tunnel mode: encrypt (default), auth or plain.
    #[arg(long, default_value = "encrypt")]
    pub mode: String,
    /// Echo requests in the ping flood.
    #[arg(long, value_name = "COUNT", default_value_t = 50_000)]
    pub flood: u64,
    /// Write what the observer on the public link saw to this pcap file (256 bytes per frame).
    #[arg(long, value_name = "FILE")]
    pub pcap: Option<PathBuf>,
    /// Print the results as one JSON document on stdout (progress goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Seconds between rekeys (new handshakes; the configuration's `rekey_secs`, `--rekey` is
    /// accepted too); default: the daemon's 120 s.
    #[arg(long = "rekey-secs", alias = "rekey", value_name = "SECS")]
    pub rekey: Option<f64>,
    /// Kill Gateway B (SIGKILL) in the middle of the TCP transfer and start it again: it
    /// re-handshakes by itself and the transfer must still complete with its SHA-256 intact.
    #[arg(long)]
    pub restart_gateway: bool,
    /// Use one pre-shared session key instead of identity keys and handshakes (the thesis's way;
    /// always the case with --mode plain).
    #[arg(long)]
    pub psk: bool,
    /// Host A runs mt6d itself (001's integrated configuration, `role = "host"`): Host A and
    /// Gateway A are one namespace, talking to Gateway B in gateway mode. The baseline is then
    /// Host A as a plain IPv6 host on the public side, Gateway B forwarding to Host B.
    #[arg(long)]
    pub host_mode: bool,
    /// Instead of the demo: run two conversations between the same two gateways (pre-shared
    /// keys unless --link-keys says otherwise, --duration / --rotation-secs epochs), capture the public link (and, routed, past the
    /// router) and print how well each linking method ties consecutive epochs together
    /// against chance (docs/PRIVACY.md). --pcap keeps the capture.
    #[arg(long)]
    pub link_report: bool,
    /// With --link-report: concurrent conversations (each a host pair behind the same two
    /// gateways); a comma-separated list runs each (e.g. 2,8,32).
    #[arg(long, value_name = "K", value_delimiter = ',', default_value = "4")]
    pub conversations: Vec<usize>,
    /// With --link-report: what the conversations carry: different (bulk TCP, echo 5/s, echo
    /// 100/s, idle, cycled), timer (the same timer-driven mix in each) or poisson (the same
    /// mix with random gaps); a comma-separated list runs each.
    #[arg(long, value_name = "SHAPES", value_delimiter = ',', default_value = "timer",
          value_parser = parse_shapes)]
    pub shapes: Vec<Shapes>,
    /// With --link-report: how the conversations' streams are keyed: pre-shared (a key per
    /// stream, every stream switching at the same boundary), pre-shared-jitter (the same with
    /// `jitter = true`: each stream switches at its own instant) or identity (one identity key
    /// per gateway, a handshake per stream, data on the sessions' routes).
    #[arg(long, value_name = "KEYS", default_value = "pre-shared", value_parser = parse_keying,
          requires = "link_report")]
    pub link_keys: Keying,
    /// With --link-report: train a k-NN classifier on a first run of each configuration and
    /// score it on a second, fresh one (doubles the time).
    #[arg(long, requires = "link_report")]
    pub classifier: bool,
    /// With --link-report: write the table (linker.md) and every figure (linker.json) here.
    #[arg(long, value_name = "DIR", requires = "link_report")]
    pub link_out: Option<PathBuf>,
    /// Instead of the demo: run the linker over a capture written earlier by --link-report
    /// --pcap FILE and the ground truth beside it (FILE's stem + `.truth.json`). Needs no root.
    #[arg(long, value_name = "FILE")]
    pub link_pcap: Option<PathBuf>,
    /// With --link-pcap: keep only packets from this /64 (the far capture of the routed
    /// topology, `<stem>-far.pcap`, seen past the router: 2001:db8:a::).
    #[arg(long, value_name = "PREFIX", requires = "link_pcap")]
    pub past_router: Option<std::net::Ipv6Addr>,
}

/// What `--topology` names: a lab of two gateways, or the relay network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DemoTopology {
    Gateways(Topology),
    Relays,
}

impl DemoTopology {
    pub fn name(self) -> &'static str {
        match self {
            DemoTopology::Gateways(t) => t.name(),
            DemoTopology::Relays => "relays",
        }
    }
}

impl std::fmt::Display for DemoTopology {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

fn parse_shapes(s: &str) -> Result<Shapes, String> {
    Shapes::parse(s).ok_or_else(|| format!("{s:?}: one of different, timer, poisson"))
}

fn parse_keying(s: &str) -> Result<Keying, String> {
    Keying::parse(s).ok_or_else(|| format!("{s:?}: one of pre-shared, pre-shared-jitter, identity"))
}

fn parse_topology(s: &str) -> Result<DemoTopology, String> {
    if s == DemoTopology::Relays.name() {
        return Ok(DemoTopology::Relays);
    }
    Topology::parse(s)
        .map(DemoTopology::Gateways)
        .ok_or_else(|| format!("{s:?}: one of switched, routed, tunneled, relays"))
}

/// Progress lines: to stdout normally, to stderr when stdout carries JSON.
#[derive(Debug)]
pub(crate) struct Say {
    pub(crate) json: bool,
}

impl Say {
    pub(crate) fn line(&self, text: impl AsRef<str>) {
        if self.json {
            eprintln!("{}", text.as_ref());
        } else {
            println!("{}", text.as_ref());
            let _ = std::io::stdout().flush();
        }
    }
}
