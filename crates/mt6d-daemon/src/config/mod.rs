//! The gateway's configuration file: the TOML schema, parsing with file and line numbers in every
//! error, and validation into the protocol crate's [`StreamConfig`]s.
//!
//! Everything is validated here, before the daemon touches the OS, so that a bad file never
//! half-applies (developers' brief; `mt6d check -c FILE` runs exactly this code). The schema is
//! documented with a full example in `docs/CONFIG.md` and `examples/gateway-a.toml`.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};

use mt6d_proto::handshake::HandshakeConfig;
use mt6d_proto::{AeadAlg, Stream, StreamConfig};

mod gateway;
mod peer;
mod raw;
mod relay;
pub mod schema;
mod server;
mod settings;
mod source;
mod tcp;

pub use relay::{
    prefix_of, E2eConfig, LinkConfig, RelayConfig, DEFAULT_RELAY_LISTEN_PORT, DEFAULT_RELAY_TUN,
    LINK_WIRE_OVERHEAD,
};
pub use server::{
    ClientConfig, ClientHandshake, ServerConfig, DEFAULT_LISTEN_PORT, DEFAULT_SERVER_TUN,
};
pub use settings::{
    StreamSettings, DEFAULT_INTERFACE_DOWN_EXIT, DEFAULT_JITTER, DEFAULT_MTU, DEFAULT_RELAY_JITTER,
    DEFAULT_ROTATION,
};
pub use tcp::{HostIdPolicy, Inject, InjectMode, Normalize, TcpConfig, NORMAL_WINDOW_SEGMENTS};

use gateway::GatewaySection;
use peer::{parse_peer, PeersSeen};
use raw::{RawConfig, Source};

/// A configuration error, with the place in the file a person has to look at.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{path}: cannot read: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    At {
        path: PathBuf,
        line: usize,
        column: usize,
        message: String,
    },
    #[error("{path}: {message}")]
    File { path: PathBuf, message: String },
}

/// The validated configuration of one gateway.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub gateway: GatewayConfig,
    pub peers: Vec<PeerConfig>,
}

/// A peer's identity option policies: `[0]` for segments from the protected side into the
/// tunnel (`host_id_out`), `[1]` for segments out of the tunnel (`host_id_in`).
pub type HostIdPolicies = [HostIdPolicy; 2];

/// Settings of the node itself (`[gateway]`, whichever its role).
#[derive(Debug, Clone, PartialEq)]
pub struct GatewayConfig {
    /// A gateway in front of protected hosts, or the protected host itself.
    pub role: Role,
    /// The interface facing the public network, where the hashed addresses live.
    pub external_interface: String,
    /// Name of the TUN device the daemon creates.
    pub tun_name: String,
    /// Unix socket `mt6d status` talks to.
    pub control_socket: PathBuf,
    /// Router on the external link through which the peers' hashed prefixes are reached (a
    /// routed deployment). Unset: the peers' hashed prefixes are on-link (000 §4.1 switched).
    pub external_next_hop: Option<Ipv6Addr>,
    /// Send Router Advertisements on the internal link carrying the tunnel MTU (docs/PROTOCOL.md
    /// §5.3). Off where another router already advertises on that link.
    pub router_advertisements: bool,
    /// `log_level`: error, warn, info (default), debug, trace or off. `mt6d run --log-level` and
    /// then `RUST_LOG` override it.
    pub log_level: Option<log::LevelFilter>,
    /// `interface_down_exit_secs`: how long an interface may be down or missing before the
    /// daemon exits non-zero for a supervisor to restart it (default 30).
    pub interface_down_exit: std::time::Duration,
    /// Give the external interface a random MAC and a random link-local address for the run,
    /// restored on exit (docs/PROTOCOL.md §5.4).
    pub randomize_link: bool,
    /// Where pre-shared auth/encrypt streams persist their send counter's high-water mark
    /// (docs/PROTOCOL.md §4.3). Must survive reboots and not be restored from old copies.
    pub state_dir: PathBuf,
    /// `metrics_listen`: address and port of the Prometheus endpoint (`GET /metrics`), e.g.
    /// `[::1]:9586`. Unset (the default): no endpoint.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// `workers`: how many data-plane threads (each with its own TUN queue and epoll, serving
    /// both directions). None: one per online CPU, at most [`MAX_WORKERS`].
    pub workers: Option<usize>,
    /// `[tcp]`: MSS clamping and the HOST_ID kinds (a change needs a restart, as `[gateway]`).
    pub tcp: TcpConfig,
}

/// The most data-plane workers (the kernel's limit on TUN queues is 256).
pub const MAX_WORKERS: usize = 64;

impl GatewayConfig {
    /// The number of data-plane workers to start: `workers`, or one per online CPU.
    pub fn worker_count(&self) -> usize {
        worker_count(self.workers)
    }

    /// The keys whose values differ between `self` and `other`, in the order of the file:
    /// what a reload cannot apply to a running daemon (empty when the two are equal). Every
    /// field is taken apart here, so a new setting cannot be left out of the comparison.
    pub fn changed_keys(&self, other: &GatewayConfig) -> Vec<&'static str> {
        let GatewayConfig {
            role,
            external_interface,
            tun_name,
            control_socket,
            external_next_hop,
            router_advertisements,
            log_level,
            interface_down_exit,
            randomize_link,
            state_dir,
            metrics_listen,
            workers,
            tcp,
        } = self;
        let role_key = match (role, &other.role) {
            (a, b) if a == b => None,
            (Role::Gateway { .. }, Role::Gateway { .. }) => Some("internal_interface"),
            // The host's one address is every peer's `local_host`.
            (Role::Host { .. }, Role::Host { .. }) => Some("local_host"),
            _ => Some("role"),
        };
        let differs = [
            (role_key.is_some(), role_key.unwrap_or("role")),
            (
                *external_interface != other.external_interface,
                "external_interface",
            ),
            (*tun_name != other.tun_name, "tun_name"),
            (*control_socket != other.control_socket, "control_socket"),
            (
                *external_next_hop != other.external_next_hop,
                "external_next_hop",
            ),
            (
                *router_advertisements != other.router_advertisements,
                "router_advertisements",
            ),
            (*log_level != other.log_level, "log_level"),
            (
                *interface_down_exit != other.interface_down_exit,
                "interface_down_exit_secs",
            ),
            (*randomize_link != other.randomize_link, "randomize_link"),
            (*state_dir != other.state_dir, "state_dir"),
            (*metrics_listen != other.metrics_listen, "metrics_listen"),
            (*workers != other.workers, "workers"),
            (*tcp != other.tcp, "[tcp]"),
        ];
        differs
            .into_iter()
            .filter_map(|(changed, key)| changed.then_some(key))
            .collect()
    }
}

/// The data-plane threads a role starts: `workers` if set, else one per online CPU (at most
/// [`MAX_WORKERS`]).
pub fn worker_count(workers: Option<usize>) -> usize {
    workers.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map_or(1, std::num::NonZeroUsize::get)
            .min(MAX_WORKERS)
    })
}

/// Default `state_dir`.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/mt6d";
/// Default `tun_name` of a gateway (or host).
pub const DEFAULT_GATEWAY_TUN: &str = "mt6d0";

/// Where the protected host is (000 §3.2 gateway mode; 001 §4 "integrated" configuration).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Role {
    /// The protected hosts sit behind `internal_interface`; the daemon forwards for them.
    Gateway { internal_interface: String },
    /// mt6d runs on the protected host: its true address `local_host` lives on the TUN device
    /// (001's virtual NIC), applications send to the peers' true addresses, and nothing is
    /// forwarded. Every peer shares this one local true address.
    Host { local_host: Ipv6Addr },
}

impl GatewayConfig {
    /// The interface towards the protected hosts; `None` in host mode, where there is none.
    pub fn internal_interface(&self) -> Option<&str> {
        match &self.role {
            Role::Gateway { internal_interface } => Some(internal_interface),
            Role::Host { .. } => None,
        }
    }

    /// Whether mt6d runs on the protected host itself.
    pub fn is_host(&self) -> bool {
        matches!(self.role, Role::Host { .. })
    }
}

/// One protected stream: a local protected host, a remote one behind the peer gateway, and how
/// their traffic is carried.
#[derive(Debug, Clone)]
pub struct PeerConfig {
    pub name: String,
    /// With a handshake, `stream.key` is the link key both gateways derive from their identity
    /// keys (docs/PROTOCOL.md §9.1); with a pre-shared key, it is that key.
    pub stream: StreamConfig,
    /// How data keys are obtained.
    pub keying: Keying,
    /// What the gateway does with identity options, per direction.
    pub host_id: HostIdPolicies,
}

/// Where a peer's data keys come from.
#[derive(Debug, Clone)]
pub enum Keying {
    /// Identity keys and a Noise IK handshake (the default way; docs/PROTOCOL.md §9).
    Handshake(HandshakeConfig),
    /// A pre-shared session key used directly (thesis compatibility, and `plain` mode).
    PreShared,
}

/// Default rekey interval (thesis `regen_interval`; WireGuard rekeys every 120 s too).
pub const DEFAULT_REKEY_SECS: u64 = 120;
/// Default packet budget of one AES-256-GCM send key before a rekey: RFC 9001 §6.6's
/// confidentiality limit for AES-GCM (2^23 packets of up to 2^16 bytes keeps the attacker's
/// distinguishing advantage below 2^-57).
pub const AES_GCM_REKEY_PACKETS: u64 = 1 << 23;
/// Default packet budget of one ChaCha20-Poly1305 send key. RFC 9001 §6.6 puts its
/// confidentiality limit above the 2^62 packets a key can number, so no security limit applies;
/// 2^36 bounds how much traffic one key protects (forward secrecy granularity).
pub const CHACHA_REKEY_PACKETS: u64 = 1 << 36;

/// The packet budget limit (and default) of `alg`.
pub fn rekey_packets_limit(alg: AeadAlg) -> u64 {
    match alg {
        AeadAlg::Aes256Gcm => AES_GCM_REKEY_PACKETS,
        AeadAlg::ChaCha20Poly1305 => CHACHA_REKEY_PACKETS,
    }
}

impl PeerConfig {
    /// Builds the protocol state for this peer. Cannot fail for a config that [`Config::parse`]
    /// accepted, since parsing builds one stream to validate.
    pub fn build_stream(&self) -> Result<Stream, mt6d_proto::ProtoError> {
        Stream::new(self.stream.clone())
    }
}

impl Config {
    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Config::load_document(path).map(|(config, _)| config)
    }

    /// Reads and validates a configuration file, and returns with it the TOML document it was
    /// validated from: the daemon keeps that document to validate live changes against
    /// (`gateway::reload`), so that a peer added over the control socket goes through exactly
    /// the checks a peer written in the file does.
    pub fn load_document(path: &Path) -> Result<(Config, toml::Table), ConfigError> {
        let text = source::read(path)?;
        use std::os::unix::fs::PermissionsExt;
        let config = Config::parse(path, &text)?;
        let mode = std::fs::metadata(path)
            .map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?
            .permissions()
            .mode()
            & 0o777;
        refuse_readable_inline_secrets(path, &text, mode)?;
        // The text parsed as a configuration above, so it parses as a TOML table.
        let doc = text.parse::<toml::Table>().map_err(|e| ConfigError::File {
            path: path.to_path_buf(),
            message: e.message().to_string(),
        })?;
        Ok((config, doc))
    }

    /// Validates configuration text; `path` names the file in errors and anchors relative
    /// `key_file` paths.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let src = Source { path, text };
        let raw: RawConfig = src.parse_toml()?;
        let section = GatewaySection::parse(&src, &raw.gateway)?;
        let tcp = tcp::parse_tcp(&src, raw.tcp.as_ref())?;
        if raw.peers.is_empty() {
            return Err(ConfigError::File {
                path: path.to_path_buf(),
                message: "no [[peer]] section: a gateway needs at least one peer".into(),
            });
        }
        let mut seen = PeersSeen::default();
        let mut peers = Vec::with_capacity(raw.peers.len());
        for peer in &raw.peers {
            peers.push(parse_peer(
                &src,
                raw.gateway.get_ref(),
                &section,
                peer,
                &mut seen,
            )?);
            let p = peer.get_ref();
            let last = peers.len() - 1;
            peers[last].host_id = [
                tcp::parse_policy(&src, p.host_id_out.as_ref(), &tcp, true)?,
                tcp::parse_policy(&src, p.host_id_in.as_ref(), &tcp, false)?,
            ];
        }
        let mut gateway = section.finish(path, raw.gateway.get_ref(), seen.host_address)?;
        gateway.tcp = tcp;
        Ok(Config {
            path: path.to_path_buf(),
            gateway,
            peers,
        })
    }
}

/// A `log_level` value (config or `--log-level`): error, warn, info, debug, trace, off.
pub fn parse_log_level(s: &str) -> Option<log::LevelFilter> {
    match s {
        "error" | "warn" | "info" | "debug" | "trace" | "off" => s.parse().ok(),
        _ => None,
    }
}

/// Where the control socket lives when the file does not say: one per TUN name, so that two
/// daemons in one network namespace (or in several, sharing /run) do not collide.
pub fn default_control_socket(tun_name: &str) -> PathBuf {
    PathBuf::from(format!("/run/mt6d/{tun_name}.sock"))
}

/// Secrets written into the config itself (a peer's `key = "..."`) are refused when group or
/// others can read the file (`mode` & 0o077), as key files are ([`crate::keys::read_secret_file`]);
/// the error points at the first such key, file:line:column.
fn refuse_readable_inline_secrets(path: &Path, text: &str, mode: u32) -> Result<(), ConfigError> {
    if mode & 0o077 == 0 {
        return Ok(());
    }
    let src = Source { path, text };
    // The text already parsed once (Config::parse); a failure here cannot happen.
    let Ok(raw) = toml::from_str::<RawConfig>(text) else {
        return Ok(());
    };
    match raw.peers.iter().find_map(|p| p.get_ref().key.as_ref()) {
        Some(key) => Err(src.err(
            key,
            format!(
                "a secret key is written in a file group or others can read (mode {mode:03o}); \
                 run: chmod 600 {}, or move the key to a key_file with mode 0600",
                path.display()
            ),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mt6d_proto::{Mode, PortPolicy};
    use std::os::unix::fs::PermissionsExt;
    use std::time::Duration;

    const KEY: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

    fn example() -> String {
        format!(
            r#"
[gateway]
internal_interface = "eth1"
external_interface = "eth0"
rotation_secs = 1

[[peer]]
name = "site-b"
local_host = "2001:db8:1::a"
remote_host = "2001:db8:1::b"
key = "{KEY}"
"#
        )
    }

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("/etc/mt6d/gw.toml"), text)
    }

    #[test]
    fn minimal_config_parses_with_defaults() {
        let cfg = parse(&example()).expect("example parses");
        assert_eq!(cfg.gateway.tun_name, "mt6d0");
        assert_eq!(
            cfg.gateway.control_socket,
            PathBuf::from("/run/mt6d/mt6d0.sock")
        );
        assert_eq!(cfg.peers.len(), 1);
        let s = &cfg.peers[0].stream;
        assert_eq!(s.rotation, Duration::from_secs(1));
        assert_eq!(s.mode, Mode::Encrypt);
        assert_eq!(s.ports, PortPolicy::Hopping);
        assert!(cfg.peers[0].build_stream().is_ok());
    }

    #[test]
    fn peer_overrides_gateway_defaults() {
        let text = example().replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nmode = \"auth\"\naccept_clear_payload = true",
        ) + "mode = \"plain\"\nport = 4500\n";
        let cfg = parse(&text).expect("parses");
        assert_eq!(cfg.peers[0].stream.mode, Mode::Plain);
        assert_eq!(cfg.peers[0].stream.ports, PortPolicy::Fixed(4500));
    }

    /// The review found true addresses on the public link in plain mode, inside ICMPv6 error
    /// quotes and routing headers: plain and auth carry the inner payload in clear. Neither runs
    /// without the operator's acknowledgement; the error names the mode's line and the setting.
    #[test]
    fn clear_payload_modes_are_refused_without_the_acknowledgement() {
        for (gateway, peer, line) in [
            ("mode = \"plain\"\n", "", 6),
            ("mode = \"auth\"\n", "", 6),
            ("", "mode = \"plain\"\n", 12),
        ] {
            let text = example().replace(
                "rotation_secs = 1\n",
                &format!("rotation_secs = 1\n{gateway}"),
            ) + peer;
            let e = parse(&text).expect_err("refused").to_string();
            assert!(e.contains("accept_clear_payload = true"), "{e}");
            assert!(e.contains(&format!("gw.toml:{line}:")), "{e}");
            let acknowledged = text.replace(
                "rotation_secs = 1\n",
                "rotation_secs = 1\naccept_clear_payload = true\n",
            );
            parse(&acknowledged).expect("acknowledged");
        }
        // Encrypt needs nothing, and the setting must be a boolean.
        parse(&example()).expect("encrypt");
        let bad = example().replace(
            "rotation_secs = 1\n",
            "rotation_secs = 1\naccept_clear_payload = \"yes\"\n",
        );
        assert!(parse(&bad).is_err());
    }

    #[test]
    fn bad_address_names_file_line_and_column() {
        let text = example().replace("2001:db8:1::b", "2001:db8:1::zz");
        let err = parse(&text).expect_err("must fail").to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:10:15:"), "{err}");
        assert!(err.contains("not an IPv6 address"), "{err}");
    }

    #[test]
    fn metrics_listen_is_off_by_default_and_a_bad_one_names_its_place() {
        assert_eq!(
            parse(&example()).expect("parses").gateway.metrics_listen,
            None
        );
        let text = example().replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nmetrics_listen = \"[::1]:9586\"",
        );
        assert_eq!(
            parse(&text).expect("parses").gateway.metrics_listen,
            Some("[::1]:9586".parse().expect("address"))
        );
        let text = example().replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nmetrics_listen = \"::1\"",
        );
        let err = parse(&text).expect_err("fails").to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:"), "{err}");
        assert!(
            err.contains("metrics_listen \"::1\" is not an address and port"),
            "{err}"
        );
    }

    #[test]
    fn workers_default_to_the_cpus_and_a_bad_count_names_its_place() {
        let cfg = parse(&example()).expect("parses");
        assert_eq!(cfg.gateway.workers, None);
        assert!((1..=MAX_WORKERS).contains(&cfg.gateway.worker_count()));
        let with = |n: &str| {
            example().replace(
                "rotation_secs = 1",
                &format!("rotation_secs = 1\nworkers = {n}"),
            )
        };
        let cfg = parse(&with("3")).expect("parses");
        assert_eq!(cfg.gateway.workers, Some(3));
        assert_eq!(cfg.gateway.worker_count(), 3);
        for bad in ["0", "65", "-1"] {
            let err = parse(&with(bad)).expect_err("fails").to_string();
            assert!(err.starts_with("/etc/mt6d/gw.toml:"), "{err}");
            assert!(
                err.contains("workers: the number of data-plane threads, 1 to 64"),
                "{err}"
            );
        }
    }

    #[test]
    fn log_level_is_read_and_a_bad_one_names_its_place() {
        assert_eq!(parse(&example()).expect("parses").gateway.log_level, None);
        let text = example().replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nlog_level = \"debug\"",
        );
        assert_eq!(
            parse(&text).expect("parses").gateway.log_level,
            Some(log::LevelFilter::Debug)
        );
        let text = example().replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nlog_level = \"loud\"",
        );
        let err = parse(&text).expect_err("fails").to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:"), "{err}");
        assert!(err.contains("log_level \"loud\": one of error"), "{err}");
    }

    #[test]
    fn syntax_error_has_a_line() {
        let err = parse("[gateway]\ninternal_interface = \n")
            .expect_err("fails")
            .to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:2:"), "{err}");
    }

    #[test]
    fn unknown_key_is_rejected() {
        let text = example().replace("rotation_secs = 1", "rotation_secs = 1\nrotaton = 3");
        let err = parse(&text).expect_err("fails").to_string();
        assert!(err.contains("rotaton"), "{err}");
    }

    #[test]
    fn missing_key_and_duplicate_peer_are_reported() {
        let no_key = example().replace(&format!("key = \"{KEY}\""), "");
        assert!(parse(&no_key)
            .expect_err("fails")
            .to_string()
            .contains("no key"));
        let dup = example() + &example()[example().find("[[peer]]").expect("has peer")..];
        let err = parse(&dup).expect_err("fails").to_string();
        assert!(err.contains("duplicate peer name"), "{err}");
    }

    #[test]
    fn out_of_range_values_are_rejected() {
        for (from, to, what) in [
            ("rotation_secs = 1", "rotation_secs = 0.5", "rotation_secs"),
            (
                "rotation_secs = 1",
                "rotation_secs = 1\nport = 80",
                "port must be",
            ),
            (
                "rotation_secs = 1",
                "rotation_secs = 1\nmode = \"fast\"",
                "fast",
            ),
            ("\"eth0\"", "\"eth1\"", "must differ"),
            (
                "\"eth0\"",
                "\"an-interface-name-too-long\"",
                "not a valid interface name",
            ),
        ] {
            let err = parse(&example().replace(from, to))
                .expect_err(what)
                .to_string();
            assert!(err.contains(what), "{what}: {err}");
        }
    }

    #[test]
    fn randomize_link_is_off_unless_asked_for() {
        assert!(!parse(&example()).expect("example").gateway.randomize_link);
        let on = example().replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nrandomize_link = true",
        );
        assert!(parse(&on).expect("parses").gateway.randomize_link);
        let bad = example().replace("rotation_secs = 1", "rotation_secs = 1\nrandomize_link = 1");
        assert!(parse(&bad).is_err());
    }

    #[test]
    fn host_role_puts_the_one_true_address_on_the_host() {
        let host = example().replace("internal_interface = \"eth1\"", "role = \"host\"");
        let cfg = parse(&host).expect("host mode parses");
        assert_eq!(
            cfg.gateway.role,
            Role::Host {
                local_host: "2001:db8:1::a".parse().expect("addr")
            }
        );
        assert_eq!(cfg.gateway.internal_interface(), None);
        assert!(cfg.gateway.is_host());
        assert!(
            !cfg.gateway.router_advertisements,
            "no internal link to advertise on"
        );
        let ra = host.replace(
            "rotation_secs = 1",
            "rotation_secs = 1\nrouter_advertisements = true",
        );
        let err = parse(&ra).expect_err("RAs in host mode").to_string();
        assert!(
            err.contains("no internal link to send Router Advertisements"),
            "{err}"
        );
        // A second peer for another remote host shares the local address (with its own key:
        // one key for both would give both streams the same hashed address).
        let second = "\n[[peer]]\nname = \"c\"\nlocal_host = \"2001:db8:1::a\"\nremote_host = \"2001:db8:1::c\"\nkey = \"KEY\"\n"
            .replace("KEY", "EBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8=");
        assert_eq!(
            parse(&(host.clone() + &second))
                .expect("two peers")
                .peers
                .len(),
            2
        );
        let other = second.replace(
            "local_host = \"2001:db8:1::a\"",
            "local_host = \"2001:db8:1::d\"",
        );
        let err = parse(&(host.clone() + &other))
            .expect_err("two local addresses")
            .to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:15:14:"), "{err}");
        assert!(
            err.contains("every peer's local_host must be 2001:db8:1::a"),
            "{err}"
        );

        let with_internal =
            example().replace("rotation_secs = 1", "rotation_secs = 1\nrole = \"host\"");
        let err = parse(&with_internal)
            .expect_err("host with internal")
            .to_string();
        assert!(err.starts_with("/etc/mt6d/gw.toml:3:22:"), "{err}");
        assert!(err.contains("no internal interface"), "{err}");

        let neither = example().replace("internal_interface = \"eth1\"\n", "");
        let err = parse(&neither)
            .expect_err("no internal, no role")
            .to_string();
        assert!(err.contains("needs internal_interface"), "{err}");

        let bad = example().replace("rotation_secs = 1", "rotation_secs = 1\nrole = \"router\"");
        let err = parse(&bad).expect_err("bad role").to_string();
        assert!(
            err.contains("\"router\"") && err.starts_with("/etc/mt6d/gw.toml:6:"),
            "{err}"
        );
        let gateway =
            example().replace("rotation_secs = 1", "rotation_secs = 1\nrole = \"gateway\"");
        let cfg = parse(&gateway).expect("explicit gateway role");
        assert_eq!(cfg.gateway.internal_interface(), Some("eth1"));
    }

    #[test]
    fn prefixes_and_macs_parse() {
        let text = example()
            + "local_prefix = \"2001:db8:aaaa:1:ffff::/64\"\nremote_prefix = \"2001:db8:bbbb::/64\"\nlocal_mac = \"00:ab:cd:11:22:01\"\n";
        let cfg = parse(&text).expect("parses");
        let s = &cfg.peers[0].stream;
        assert_eq!(
            s.local.external_prefix,
            Some("2001:db8:aaaa:1::".parse().expect("addr"))
        );
        assert_eq!(s.local.mac, Some([0, 0xab, 0xcd, 0x11, 0x22, 0x01]));
        let bad = example() + "remote_prefix = \"2001:db8::/48\"\n";
        assert!(parse(&bad).expect_err("fails").to_string().contains("/48"));
    }

    #[test]
    fn world_readable_key_file_is_refused() {
        let dir = std::env::temp_dir().join(format!("mt6d-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let key = dir.join("b.key");
        std::fs::write(&key, KEY).expect("write key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let text = example().replace(&format!("key = \"{KEY}\""), "key_file = \"b.key\"");
        let path = dir.join("gw.toml");
        let err = Config::parse(&path, &text)
            .expect_err("0644 refused")
            .to_string();
        assert!(err.contains("chmod 600"), "{err}");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        assert!(Config::parse(&path, &text).is_ok());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn handshake_keys_are_checked_with_their_line() {
        let dir = std::env::temp_dir().join(format!("mt6d-hs-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let key = dir.join("gw.key");
        let _ = std::fs::remove_file(&key);
        std::fs::write(&key, KEY).expect("write key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let peer_pub = "20glfhI3l2p0rYz+3KACE0CP6JrGJR8bkwJF8kK1wxo=";
        let with_pub = example().replace(
            &format!("key = \"{KEY}\""),
            &format!("public_key = \"{peer_pub}\""),
        );
        let at = |text: &str| Config::parse(&dir.join("gw.toml"), text);
        let e = at(&with_pub).expect_err("no private key").to_string();
        assert!(
            e.contains("gw.toml:11:") && e.contains("private_key_file"),
            "{e}"
        );
        let ok = with_pub.replace(
            "rotation_secs = 1\n",
            "rotation_secs = 1\nprivate_key_file = \"gw.key\"\nrekey_secs = 2\n",
        );
        let cfg = at(&ok).expect("handshake config parses");
        assert!(
            matches!(&cfg.peers[0].keying, Keying::Handshake(h) if h.rekey_after == Duration::from_secs(2))
        );
        let plain = ok.replace(
            "rotation_secs = 1\n",
            "rotation_secs = 1\nmode = \"plain\"\naccept_clear_payload = true\n",
        );
        assert!(at(&plain)
            .expect_err("plain")
            .to_string()
            .contains("cannot use handshake keys"));
        let both = ok.replace("public_key", &format!("key = \"{KEY}\"\npublic_key"));
        assert!(at(&both)
            .expect_err("both")
            .to_string()
            .contains("not both"));
        let short = ok.replace(peer_pub, "AAAA");
        assert!(at(&short)
            .expect_err("short")
            .to_string()
            .contains("3 bytes"));
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Shared key files: two peers sharing a key file once shared a data key. Data keys now bind
    /// the stream; a key is refused only where its streams share a true address (their hashed
    /// addresses and ports for that address would be the same).
    #[test]
    fn a_pre_shared_key_shared_by_streams_with_a_common_address_is_refused() {
        let second = |local: &str, remote: &str| {
            format!("\n[[peer]]\nname = \"site-c\"\nlocal_host = \"{local}\"\nremote_host = \"{remote}\"\nkey = \"{KEY}\"\n")
        };
        let e = parse(&(example() + &second("2001:db8:1::a", "2001:db8:1::c")))
            .expect_err("same key, same local host")
            .to_string();
        assert!(
            e.contains("gw.toml:17:") && e.contains("site-b") && e.contains("2001:db8:1::a"),
            "{e}"
        );
        assert!(parse(&(example() + &second("2001:db8:2::a", "2001:db8:2::c"))).is_ok());
        let other_key = second("2001:db8:1::a", "2001:db8:1::c")
            .replace(KEY, "EBESExQVFhcYGRobHB0eHyAhIiMkJSYnKCkqKywtLi8=");
        assert!(parse(&(example() + &other_key)).is_ok());
        let cfg = parse(&example()).expect("must succeed");
        assert_eq!(cfg.gateway.state_dir, PathBuf::from("/var/lib/mt6d"));
        let cfg = parse(&example().replace(
            "rotation_secs = 1\n",
            "rotation_secs = 1\nstate_dir = \"state\"\n",
        ))
        .expect("must succeed");
        assert_eq!(cfg.gateway.state_dir, PathBuf::from("/etc/mt6d/state"));
    }

    /// The default packet budget stays within the AEAD's limit (RFC 9001 §6.6).
    #[test]
    fn rekey_packets_defaults_to_the_aead_limit() {
        let dir = std::env::temp_dir().join(format!("mt6d-rp-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let key = dir.join("gw.key");
        std::fs::write(&key, KEY).expect("write key");
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        let text = example()
            .replace(
                &format!("key = \"{KEY}\""),
                "public_key = \"20glfhI3l2p0rYz+3KACE0CP6JrGJR8bkwJF8kK1wxo=\"",
            )
            .replace(
                "rotation_secs = 1\n",
                "rotation_secs = 1\nprivate_key_file = \"gw.key\"\n",
            );
        let at = |text: &str| Config::parse(&dir.join("gw.toml"), text);
        let budget = |cfg: Config| match &cfg.peers[0].keying {
            Keying::Handshake(h) => h.rekey_after_packets,
            Keying::PreShared => unreachable!("handshake config"),
        };
        assert_eq!(budget(at(&text).expect("must succeed")), 1 << 23);
        let chacha = text.replace(
            "rotation_secs = 1\n",
            "rotation_secs = 1\naead = \"chacha20-poly1305\"\n",
        );
        assert_eq!(budget(at(&chacha).expect("must succeed")), 1 << 36);
        let big = text.replace(
            "rotation_secs = 1\n",
            "rotation_secs = 1\nrekey_packets = 16777216\n",
        );
        let e = at(&big).expect_err("beyond AES-GCM's limit").to_string();
        assert!(e.contains("RFC 9001"), "{e}");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// The examples shipped in examples/ stay valid.
    #[test]
    fn shipped_examples_parse() {
        let dir = std::env::temp_dir().join(format!("mt6d-examples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        // The examples name each other's public keys; these are the matching private keys.
        for (file, key) in [
            (
                "gateway-a.key",
                "oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaE=",
            ),
            (
                "gateway-b.key",
                "srKysrKysrKysrKysrKysrKysrKysrKysrKysrKysrI=",
            ),
            // Host A in host mode stands in for Gateway A, with its key.
            ("host-a.key", "oaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaGhoaE="),
        ] {
            let path = dir.join(file);
            std::fs::write(&path, key).expect("write key");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        }
        for (name, text) in [
            (
                "gateway-a.toml",
                include_str!("../../../../examples/gateway-a.toml"),
            ),
            (
                "gateway-b.toml",
                include_str!("../../../../examples/gateway-b.toml"),
            ),
            (
                "host-a.toml",
                include_str!("../../../../examples/host-a.toml"),
            ),
        ] {
            let cfg =
                Config::parse(&dir.join(name), text).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg.peers.len(), 1, "{name}");
            assert_eq!(cfg.gateway.is_host(), name.starts_with("host"), "{name}");
        }
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// Every role has a shipped example (examples/), and each loads as `mt6d check` loads it,
    /// with the key files its comments say to make: the server with its peers file, its
    /// host-mode client, a relay and an edge gateway, a gateway with a TCP identity policy. The
    /// examples name each other's public keys; these private keys match them. The relay
    /// checks that its interface exists, so `eth0` becomes `lo` here.
    #[test]
    fn every_role_has_an_example_that_loads() {
        use crate::config::{RelayConfig, ServerConfig};
        let dir = std::env::temp_dir().join(format!("mt6d-role-examples-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let private = |byte: u8| crate::keys::encode(&[byte; 32]).to_string();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
            path
        };
        for (file, byte) in [
            ("server.key", 0x5e),
            ("client-c1.key", 0xc1),
            ("relay.key", 0x71),
            ("edge-a.key", 0xea),
            ("gateway-a.key", 0xa1),
        ] {
            write(file, &private(byte));
        }
        let on_lo = |text: &str| text.replace("\"eth0\"", "\"lo\"");
        write(
            "server-clients",
            include_str!("../../../../examples/server-clients"),
        );
        let server = write(
            "server.toml",
            &on_lo(include_str!("../../../../examples/server.toml")),
        );
        let server = ServerConfig::load(&server).expect("server.toml");
        let clients = server.clients().expect("server-clients");
        assert_eq!(clients.len(), 2);
        assert!(clients.iter().all(|c| c.handshake.is_some()));
        let server_public = crate::keys::public_key_text(
            &server.private_key.as_ref().expect("identity").public_key(),
        );

        let client = write(
            "client-c1.toml",
            include_str!("../../../../examples/client-c1.toml"),
        );
        let client = Config::load(&client).expect("client-c1.toml");
        assert!(client.gateway.is_host());
        let Keying::Handshake(h) = &client.peers[0].keying else {
            panic!("client-c1 handshakes");
        };
        assert_eq!(
            crate::keys::public_key_text(&h.remote_public),
            server_public
        );
        assert_eq!(client.peers[0].stream.remote.true_addr, server.true_address);

        let relay = write(
            "relay.toml",
            &on_lo(include_str!("../../../../examples/relay.toml")),
        );
        let relay = RelayConfig::load(&relay).expect("relay.toml");
        assert!(!relay.is_edge() && relay.transit && relay.links.len() == 2);
        let edge = write(
            "edge-a.toml",
            &on_lo(include_str!("../../../../examples/edge-a.toml")),
        );
        let edge = RelayConfig::load(&edge).expect("edge-a.toml");
        assert!(edge.is_edge() && edge.e2e.len() == 1);
        assert_eq!(
            edge.links[0].address, relay.address,
            "edge-a's link is the relay"
        );

        let policy = write(
            "gateway-tcp-policy.toml",
            include_str!("../../../../examples/gateway-tcp-policy.toml"),
        );
        let policy = Config::load(&policy).expect("gateway-tcp-policy.toml");
        assert!(policy.gateway.tcp.normalize.is_some());
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    /// An inline `key = "..."` in a config others can read is refused as a 0644 key file is,
    /// pointing at the key; at 0600 it loads, and a 0644 config without inline secrets too.
    #[test]
    fn inline_secrets_in_a_readable_config_are_refused() {
        let dir = std::env::temp_dir().join(format!("mt6d-inline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("gw.toml");
        let text = example();
        std::fs::write(&path, &text).expect("write");
        for mode in [0o644, 0o640, 0o604] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let e = Config::load(&path)
                .expect_err("readable inline key")
                .to_string();
            let at = text.find("key = ").expect("key in example");
            let line = text[..at].matches('\n').count() + 1;
            let expect = format!("{}:{line}:7:", path.display());
            assert!(e.starts_with(&expect), "{e} (want {expect})");
            assert!(e.contains(&format!("chmod 600 {}", path.display())), "{e}");
            assert!(e.contains(&format!("mode {mode:03o}")), "{e}");
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        Config::load(&path).expect("0600 config with an inline key");
        let key_file = dir.join("peer.key");
        crate::keys::write_secret_file(&key_file, KEY).expect("key file");
        let text = text.replace(
            &format!("key = \"{KEY}\""),
            &format!("key_file = \"{}\"", key_file.display()),
        );
        std::fs::write(&path, &text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        Config::load(&path).expect("0644 config whose key is in a 0600 file");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
