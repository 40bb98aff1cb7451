//! What the bench runs: the topologies, scenarios and traffic tests of 000 Ch. 4 (Tables 4.1,
//! 4.2), and the sizes of each test in the `--quick` and full profiles (docs/BENCH.md).

use std::fmt;

pub use mt6d_lab::topology::Topology;

/// What carries the hosts' traffic between the gateways (000 Table 4.2, with today's peers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Scenario {
    /// Plain kernel IPv6 forwarding through both gateways: the baseline.
    None,
    /// Kernel UDP encapsulation between the gateways (a VXLAN device over their public
    /// addresses, routed like the WireGuard peers): what a tunnel that never leaves the kernel
    /// moves through the same namespaces, the measured estimate for an in-kernel (tc/XDP eBPF)
    /// plain mode.
    KernelVxlan,
    /// MT6D in one of its three modes.
    Mt6d(Mode),
    WireguardGo,
    Boringtun,
}

/// MT6D's carrying mode (docs/PROTOCOL.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Mode {
    Plain,
    Auth,
    Encrypt,
}

impl Mode {
    pub fn config_name(self) -> &'static str {
        match self {
            Mode::Plain => "plain",
            Mode::Auth => "auth",
            Mode::Encrypt => "encrypt",
        }
    }
}

impl Scenario {
    pub const ALL: [Scenario; 7] = [
        Scenario::None,
        Scenario::KernelVxlan,
        Scenario::Mt6d(Mode::Plain),
        Scenario::Mt6d(Mode::Auth),
        Scenario::Mt6d(Mode::Encrypt),
        Scenario::WireguardGo,
        Scenario::Boringtun,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Scenario::None => "none",
            Scenario::KernelVxlan => "kernel-vxlan",
            Scenario::Mt6d(Mode::Plain) => "mt6d-plain",
            Scenario::Mt6d(Mode::Auth) => "mt6d-auth",
            Scenario::Mt6d(Mode::Encrypt) => "mt6d-encrypt",
            Scenario::WireguardGo => "wireguard-go",
            Scenario::Boringtun => "boringtun",
        }
    }

    pub fn parse(s: &str) -> Option<Scenario> {
        Scenario::ALL.into_iter().find(|t| t.name() == s)
    }
}

impl fmt::Display for Scenario {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Sizes of every test. The names follow 000 Table 4.1; the counts and sizes are the profile's.
#[derive(Debug, Clone)]
pub struct Profile {
    pub name: &'static str,
    /// ping_std: count and interval (000: 1,000 at 1/s; the full profile: 1,000 at 10/s).
    pub ping_std_count: u64,
    pub ping_std_interval_ms: u64,
    /// The two floods (000: 10,000 and 50,000 echoes "as fast as they come back, or 100/s").
    pub floods: [(&'static str, u64); 2],
    /// HTTP downloads (000 wget_*): test name and bytes.
    pub downloads: Vec<(&'static str, u64)>,
    /// iperf3 UDP jitter: test name and bytes, sent at `udp_rate_mbit`.
    pub udp: Vec<(&'static str, u64)>,
    pub udp_rate_mbit: u64,
    /// iperf3 TCP maximum throughput: seconds per run, for 1 and 4 streams.
    pub tcp_secs: u64,
    /// MT6D's rotation interval for the main runs (000 §4: 10 s).
    pub rotation_secs: f64,
    /// The extra MT6D pass at a fast rotation (1 s): which floods it repeats.
    pub fast_rotation_secs: f64,
    pub fast_flood: (&'static str, u64),
    /// The TCP policy's cost (goal: at most 2 % lower throughput): rounds of iperf3 TCP through
    /// mt6d encrypt with the policy off and on, and the seconds of each.
    pub scrub_rounds: u32,
    pub scrub_secs: u64,
    /// Many small flows: HTTP requests of 1 kB, each on a connection of its own,
    /// and how many run at once.
    pub small_flows: (u64, u64),
    /// `--workers 1` against the default: rounds of TCP 1 and 4 streams and the
    /// small flows through mt6d encrypt, each state on freshly started gateways.
    pub workers_rounds: u32,
    /// `--workers`: the mt6d gateways' data-plane workers (None: the daemon's default, one per
    /// online CPU).
    pub workers: Option<usize>,
}

const KB: u64 = 1000;
const MB: u64 = 1000 * 1000;

impl Profile {
    /// Every scenario on every topology in under 5 minutes on 2 cores (CI).
    pub fn quick() -> Profile {
        Profile {
            name: "quick",
            ping_std_count: 10,
            ping_std_interval_ms: 200,
            floods: [("ping_flood_10k", 2_000), ("ping_flood_50k", 5_000)],
            downloads: vec![
                ("http_500k", 500 * KB),
                ("http_1M", MB),
                ("http_10M", 10 * MB),
            ],
            udp: vec![("iperf_udp_1M", MB)],
            udp_rate_mbit: 100,
            tcp_secs: 1,
            rotation_secs: 10.0,
            fast_rotation_secs: 1.0,
            fast_flood: ("ping_flood_1s_rotation", 10_000),
            scrub_rounds: 1,
            scrub_secs: 2,
            small_flows: (500, 16),
            workers_rounds: 1,
            workers: None,
        }
    }

    /// The thesis's tests (000 Table 4.1), with ping_std at 10/s instead of 1/s: 1,000 echoes
    /// per train (the size p50, p99 and the worst echo are judged by), 100 s each, about 45
    /// minutes of trains for the 18 pairs; `--ping-std 30` shortens them.
    pub fn full() -> Profile {
        Profile {
            name: "full",
            ping_std_count: 1000,
            ping_std_interval_ms: 100,
            floods: [("ping_flood_10k", 10_000), ("ping_flood_50k", 50_000)],
            downloads: vec![
                ("http_500k", 500 * KB),
                ("http_1M", MB),
                ("http_10M", 10 * MB),
                ("http_50M", 50 * MB),
                ("http_500M", 500 * MB),
            ],
            udp: vec![
                ("iperf_udp_1M", MB),
                ("iperf_udp_10M", 10 * MB),
                ("iperf_udp_100M", 100 * MB),
            ],
            udp_rate_mbit: 200,
            tcp_secs: 5,
            rotation_secs: 10.0,
            fast_rotation_secs: 1.0,
            fast_flood: ("ping_flood_1s_rotation", 50_000),
            scrub_rounds: 5,
            scrub_secs: 5,
            small_flows: (20_000, 32),
            workers_rounds: 3,
            workers: None,
        }
    }
}
